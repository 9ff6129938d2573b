"""The paper's "transfer and retrieval" both ways, and the host's CPU time for them: the causes study's rig.

One storage node process, the agent in this process (its standing PUTs and its GETs, as `kvtb study paper`
runs it) and a compute process of our own (a spawned child, as the compute node is one) over one pool
this process registers with the agent. For each KV size and each path a context is stored (PUT) and
retrieved into the pool (GET), each timed, with the CPU time every process spent meanwhile:

- CPU-centric (policy `cpu`): the compute process copies, seals and stores each block through its own
  fabric client, waiting for each acknowledgement (compute_node.cpu_offload.CpuOffload, in_flight=1), and
  retrieves each block itself, checking it before it lands (CpuStore.restore, as a follow-up's is).
- triggered: the compute process writes each block's descriptor and PUT trigger; the agent stores it. The
  GET is the agent's (Agent.restore_blocks: what a follow-up's restore event asks), timed here until
  every block landed and checked out.

The compute process's CPU time under triggered is its trigger writes only (the wait for the PUT-done
counters is not counted: the engine polls them between its steps, alongside other work); the agent's is
this process's; the storage node's, its process's. Every key is deleted between samples.
"""
from __future__ import annotations

import contextlib
import dataclasses
import resource
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.study.paper_causes_compute import KEY, MODES, NSID, SALT, TENANT, ComputeProcess, layout_for_size

# -- the rig ---------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Rig:
    agent: Any
    storage: Any      # the storage node's ServiceProcess
    admin: Any        # a fabric client of our own (the benchmarks' host)
    compute: ComputeProcess
    directory: Path


@contextlib.contextmanager
def rig(directory: Path) -> Iterator[Rig]:
    """A storage node process, the agent in this process and the compute process; all stopped at the end."""
    from bench.stack import BENCH_NQN, bench_client, start_storage, use_credentials
    from kvtb.heap import keep_large_buffers_in_the_heap
    from smartnic.agent import Agent
    from smartnic.settings import SmartNicSettings, StorageNodeRef

    use_credentials(directory)
    keep_large_buffers_in_the_heap()
    with contextlib.ExitStack() as stack:
        storage = start_storage(directory, "causes", namespace_size_bytes=4 << 30)
        stack.callback(storage.stop)
        node = StorageNodeRef("causes", storage.addresses["admin"], storage.addresses["fabric"])
        agent = Agent(SmartNicSettings(listen_address="127.0.0.1:0", storage_nodes=(node,), salt=SALT,
                                       eviction_policy="timer", fabric_security="auth", kv_mac=True))
        agent.start()
        stack.callback(agent.close)
        deadline = time.monotonic() + 60
        while not agent.nodes.up():
            if time.monotonic() > deadline:
                raise TimeoutError("the agent did not reach the storage node within 60 s")
            time.sleep(0.02)
        admin = bench_client(node.fabric_address, timeout_s=120)
        admin.connect()
        stack.callback(admin.close)
        compute = ComputeProcess(node.fabric_address, BENCH_NQN)
        stack.callback(compute.close)
        yield Rig(agent, storage, admin, compute, directory / "storage-causes")


def _rusage_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _wait_empty(admin, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while admin.list_keys(NSID, max_keys=1):
        if time.monotonic() > deadline:
            raise TimeoutError("stored keys were not deleted")
        time.sleep(0.005)


class _Clock:
    """Wall time and every process's CPU time over a span: the agent's is this process's."""

    def __init__(self, r: Rig):
        self.r = r
        self.t0, self.agent0, self.storage0 = time.perf_counter(), _rusage_s(), r.storage.cpu_seconds()

    def read(self) -> dict:
        storage1 = self.r.storage.cpu_seconds()
        return {"e2e_s": time.perf_counter() - self.t0, "agent_cpu_s": _rusage_s() - self.agent0,
                "storage_cpu_s": (storage1 - self.storage0) if None not in (storage1, self.storage0) else None}


def _triggered_get(r: Rig, reg, user: str, names: list[bytes], L) -> dict:
    """The agent's GET of every block into its pool block (what a follow-up's restore event asks); timed."""
    from smartnic.agent import RestoreBlock

    blocks = [RestoreBlock(b, name, L.block_tokens, b) for b, name in enumerate(names)]
    clock = _Clock(r)
    restore = r.agent.restore_blocks(reg, user, TENANT, blocks, L.layer_groups)
    if not restore.finished.wait(300):
        raise TimeoutError("the agent's GETs did not end within 300 s")
    out = clock.read()
    if restore.failed:
        raise RuntimeError(f"{restore.failed} of {len(blocks)} triggered GETs failed")
    return out | {"compute_cpu_s": None, "bytes": L.num_blocks * L.block_bytes}


def _round_trip(r: Rig, reg, region, mode: str, rep: int, L) -> list[dict]:
    """One PUT and one GET of a fresh context by `mode`, then every key deleted; their samples."""
    user, context = f"causes-{mode}-{uuid.uuid4().hex[:6]}", f"ctx-{uuid.uuid4().hex[:8]}"
    clock = _Clock(r)
    put = r.compute.call("put", mode, user, context)
    put |= clock.read() | {"e2e_s": put["e2e_s"]}  # the compute process's own clock for the PUT
    names = put.pop("names")
    if mode == "cpu":
        clock = _Clock(r)
        got = r.compute.call("get", names)
        got |= clock.read() | {"e2e_s": got["e2e_s"]}
        r.compute.call("forget")
    else:
        region.array[:L.num_blocks * L.block_bytes] = 0  # untimed: the bytes must land again
        got = _triggered_get(r, reg, user, names, L)
        r.agent.drop_context(user, context)
    _wait_empty(r.admin)
    base = {"mode": mode, "rep": rep, "blocks": L.num_blocks}
    return [base | put | {"direction": "put"}, base | got | {"direction": "get"}]


def measure_size(r: Rig, size: int, repeats: int, progress, first: int = 0) -> list[dict]:
    """A warm-up round trip of each path (kept out), then `repeats` of each, the order alternating."""
    import numpy as np

    from hostmem.layout_proto import layout_to_proto
    from hostmem.region import Region

    L = layout_for_size(size)
    region = Region.create(f"kvtb-causes-{uuid.uuid4().hex[:8]}", L.region_bytes, L.counter_offset,
                           L.counter_count)
    samples: list[dict] = []
    try:
        kv = L.num_blocks * L.block_bytes
        region.array[:kv] = np.resize(np.random.default_rng(7).integers(0, 256, min(kv, 16 << 20), np.uint8), kv)
        reg = r.agent.register(region.name, L.region_bytes, KEY, L.counter_offset, L.counter_count,
                               layout_to_proto(L), owner="bench")
        try:
            r.compute.call("attach", region.name, dataclasses.asdict(L))
            try:
                for mode in MODES:
                    _round_trip(r, reg, region, mode, -1, L)  # warm-up
                for rep in range(repeats):
                    order = MODES if (rep + first) % 2 == 0 else MODES[::-1]
                    for mode in order:
                        samples += _round_trip(r, reg, region, mode, rep, L)
                    progress.update(note=f"get/put {size >> 10} KiB")
            finally:
                r.compute.call("detach")
        finally:
            r.agent.deregister(reg.region_id, KEY)
    finally:
        region.close()
    return samples
