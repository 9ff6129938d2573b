"""A whole context restored through the agent by bulk GET, beside the ZeroMQ loopback limit (`kvtb bench smartnic`).

A pool laid out as the compute node lays out SmolLM2-135M's (30 layers, 3 KV heads of 64, fp32,
blocks of 32 tokens, 4 layer groups) is registered with an in-process agent; a context of
`tokens` tokens is stored block by block through the standing PUTs (descriptor, trigger store),
then restored into other blocks of the pool as the compute node asks for it (`restore_blocks`:
per storage node one range command per layer group, each block's group checked as it lands),
`rounds` times. A round's time is the agent's own, from the restore's start until the last
group's counter was bumped; before each round the ZeroMQ meter (`bench.rawlimits`: PUSH -> PULL
between two processes, messages of one block's layer group, as the restore's data PDUs are)
measures one window. The best round and the best window count; every round's rate is kept.
"""
from __future__ import annotations

import contextlib
import time
import uuid

import numpy as np

from bench.rawlimits import Sampler, ZmqLoopback
from compute_node.settings import ComputeSettings
from hostmem import descriptor
from hostmem.block_hash import hash_chain, salt_for
from hostmem.kv_layout import KvLayout
from hostmem.layout_proto import layout_to_proto
from hostmem.region import Region
from smartnic.agent import Agent
from smartnic.restore_path import RestoreBlock

BLOCK_TOKENS = ComputeSettings().block_tokens  # the compute node's
LAYER_GROUPS = 4   # compute_node.settings' default
USER, TENANT, KEY = "bench", "default", "bench"


def smollm2_layout(num_blocks: int) -> KvLayout:
    """The compute node's pool layout for SmolLM2-135M-Instruct (fp32)."""
    return KvLayout(num_blocks=num_blocks, num_layers=30, num_kv_heads=3, block_tokens=BLOCK_TOKENS, head_dim=64,
                    layer_groups=LAYER_GROUPS)


class ContextRestore:
    """A pool registered with `agent` holding one stored context of `tokens` tokens; round() restores it."""

    def __init__(self, agent: Agent, tokens: int):
        self.agent, self.blocks = agent, tokens // BLOCK_TOKENS
        self.layout = L = smollm2_layout(2 * self.blocks)  # blocks [0, n) are stored, [n, 2n) restored into
        self.region = Region.create(f"kvtb-bench-{uuid.uuid4().hex[:8]}", L.region_bytes, L.counter_offset,
                                    L.counter_count)
        rng = np.random.default_rng(2)
        kv_bytes = self.blocks * L.block_bytes
        self.region.array[:kv_bytes] = rng.integers(0, 256, kv_bytes, dtype=np.uint8)
        self.region.array[kv_bytes:2 * kv_bytes] = 0  # touched once, as a pool in use is
        self.ids = rng.integers(0, 49152, self.blocks * BLOCK_TOKENS).tolist()
        self.reg = agent.register(self.region.name, L.region_bytes, KEY, L.counter_offset, L.counter_count,
                                  layout_to_proto(L), owner="bench")
        self.names = hash_chain(self.ids, salt_for(TENANT, USER), BLOCK_TOKENS)
        self.seconds: list[float] = []
        self.bytes = 0
        try:
            self._store()
        except BaseException:
            self.close()
            raise

    def _store(self) -> None:
        """Every block through its standing PUT, as the engine stores a block that filled."""
        L, region = self.layout, self.region
        for i, name in enumerate(self.names):
            region.array[L.token_ids_offset + i * BLOCK_TOKENS * 4:][:BLOCK_TOKENS * 4] = np.asarray(
                self.ids[i * BLOCK_TOKENS:(i + 1) * BLOCK_TOKENS], "<u4").view(np.uint8)
            d = descriptor.Descriptor(1, i, BLOCK_TOKENS, name, self.names[i - 1] if i else b"", TENANT, USER, "ctx")
            region.write(L.descriptor_range(i)[0], descriptor.encode(d))
            region.store_counter(L.put_trigger(i), 1)
        deadline = time.monotonic() + 300
        while sum(region.counter_total(L.put_done(i)) for i in range(self.blocks)) < self.blocks:
            if time.monotonic() > deadline:
                raise TimeoutError("the context's blocks were not stored within 300 s")
            time.sleep(0.005)
        failed = sum(region.read_counter(L.put_done(i))[1] for i in range(self.blocks))
        if failed:
            raise RuntimeError(f"{failed} blocks failed to store")

    def round(self) -> None:
        """Restore the context into blocks [n, 2n); check every group landed and the bytes are the stored ones."""
        L, n = self.layout, self.blocks
        before = [self.region.read_counter(L.get_done(n + i, g)) for i in range(n) for g in range(L.layer_groups)]
        restore = self.agent.restore_blocks(self.reg, USER, TENANT, [
            RestoreBlock(n + i, name, BLOCK_TOKENS, i) for i, name in enumerate(self.names)], L.layer_groups)
        if not restore.finished.wait(120):
            raise TimeoutError("the restore did not end within 120 s")
        self.seconds.append((restore.done_ns - restore.started_ns) / 1e9)
        self.bytes = restore.bytes
        after = [self.region.read_counter(L.get_done(n + i, g)) for i in range(n) for g in range(L.layer_groups)]
        if not (restore.failed == 0 and all(a[0] == b[0] + 1 and a[1] == b[1] for a, b in zip(after, before))):
            raise RuntimeError(f"{restore.failed} blocks failed to restore")
        kv = n * L.block_bytes
        if not np.array_equal(self.region.array[kv:2 * kv], self.region.array[:kv]):
            raise RuntimeError("the restore gave other bytes")
        self.region.array[kv:2 * kv] = 0  # the next round must write them all again

    def result(self) -> dict:
        best = min(self.seconds)
        return {"tokens": self.blocks * BLOCK_TOKENS, "blocks": self.blocks, "layer_groups": self.layout.layer_groups,
                "bytes": self.bytes, "rounds": len(self.seconds), "seconds": self.seconds,
                "bytes_per_s": self.bytes / best, "rounds_bytes_per_s": [self.bytes / s for s in self.seconds]}

    def close(self) -> None:
        self.agent.deregister(self.reg.region_id, KEY)
        self.region.close()


def context_restore(agent: Agent, tokens: int, rounds: int, budget_s: float) -> dict:
    """`rounds` restores of a context of `tokens` tokens, a ZeroMQ window before each; the ratio of the best
    round to the best window (`vs_zmq`)."""
    with contextlib.ExitStack() as stack:
        run = ContextRestore(agent, tokens)
        stack.callback(run.close)
        message = run.layout.block_bytes // run.layout.layer_groups
        zmq = stack.enter_context(ZmqLoopback(message, run.blocks * run.layout.block_bytes))
        sampler = Sampler({"zmq_tcp": zmq}, budget_s / rounds)
        for _ in range(rounds):
            sampler()
            run.round()
        out = run.result()
    out["zmq_message_bytes"] = message
    out["zmq_tcp_bytes_per_s"] = sampler.best()["zmq_tcp"]
    out["zmq_tcp_windows_bytes_per_s"] = sampler.samples["zmq_tcp"]
    out["vs_zmq"] = out["bytes_per_s"] / out["zmq_tcp_bytes_per_s"]
    return out
