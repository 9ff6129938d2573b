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
import time
import uuid
from pathlib import Path

from bench.study import paper_rig
from bench.study.paper_causes_compute import KEY, MODES, NSID, SALT, TENANT, ComputeProcess, layout_for_size

# -- the rig ---------------------------------------------------------------------------------------------

def rig(directory: Path) -> contextlib.AbstractContextManager[paper_rig.Rig]:
    """The GET direction's rig (bench.study.paper_rig): storage node "causes" of 4 GiB, its own credentials."""
    return paper_rig.rig(directory, ComputeProcess, "causes", salt=SALT, namespace_size_bytes=4 << 30,
                         admin_timeout_s=120, own_credentials=True)


class _Clock:
    """Wall time and every process's CPU time over a span: the agent's is this process's."""

    def __init__(self, r: paper_rig.Rig):
        self.r = r
        self.t0, self.agent0, self.storage0 = time.perf_counter(), paper_rig.rusage_s(), r.storage.cpu_seconds()

    def read(self) -> dict:
        storage1 = self.r.storage.cpu_seconds()
        return {"e2e_s": time.perf_counter() - self.t0, "agent_cpu_s": paper_rig.rusage_s() - self.agent0,
                "storage_cpu_s": (storage1 - self.storage0) if None not in (storage1, self.storage0) else None}


def _triggered_get(r: paper_rig.Rig, reg, user: str, names: list[bytes], L) -> dict:
    """The agent's GET of every block into its pool block (what a follow-up's restore event asks); timed."""
    from smartnic.restore_path import RestoreBlock

    blocks = [RestoreBlock(b, name, L.block_tokens, b) for b, name in enumerate(names)]
    clock = _Clock(r)
    restore = r.agent.restore_blocks(reg, user, TENANT, blocks, L.layer_groups)
    if not restore.finished.wait(300):
        raise TimeoutError("the agent's GETs did not end within 300 s")
    out = clock.read()
    if restore.failed:
        raise RuntimeError(f"{restore.failed} of {len(blocks)} triggered GETs failed")
    return out | {"compute_cpu_s": None, "bytes": L.num_blocks * L.block_bytes}


def _round_trip(r: paper_rig.Rig, reg, region, mode: str, rep: int, L) -> list[dict]:
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
    paper_rig.wait_empty(r.admin, NSID)
    base = {"mode": mode, "rep": rep, "blocks": L.num_blocks}
    return [base | put | {"direction": "put"}, base | got | {"direction": "get"}]


def measure_size(r: paper_rig.Rig, size: int, repeats: int, progress, first: int = 0) -> list[dict]:
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
