"""What the agent keeps on storage, with real agent and storage node processes: admission (always,
or on_reuse: a block's name must be seen twice) and the capacity bound under one-shot traffic."""
from __future__ import annotations

import time

import pytest

from hostmem.kv_layout import KvLayout
from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, storage_admin_pb2, storage_admin_pb2_grpc
from tests.conftest import secure_channel
from tests.smartnic.conftest import compute_beside
from tests.smartnic.helpers import LAYOUT, agent_env

IDS = list(range(2000, 2060))  # three full blocks of 16 and a partial one of 12
# SmolLM2-135M's blocks (30 layers, 3 KV heads of 64, fp32, 32 tokens: 1.4 MiB each)
MODEL_LAYOUT = KvLayout(num_blocks=8, num_layers=30, num_kv_heads=3, block_tokens=32, head_dim=64, layer_groups=2)


def stats(pool) -> smartnic_pb2.StatsResponse:
    return pool.stub.Stats(smartnic_pb2.StatsRequest())


def follow_up(channel, ids, user: str = "alice") -> None:
    """A turn through the agent: the fake compute node's request says what step 5 found stored."""
    stub = compute_pb2_grpc.ComputeNodeStub(channel)
    list(stub.Generate(compute_pb2.TurnRequest(request_id="r", user_id=user, context_id="c", tenant="default",
                                               token_ids=ids, max_new_tokens=1), timeout=30))


@pytest.mark.parametrize("admission", ["always", "on_reuse"])
def test_admission_stores_every_block_or_only_those_seen_twice(start_service, storage, admission):
    agent = start_service("agent", "serve", "smartnic", env=agent_env(storage, admission=admission))
    with compute_beside(agent.addresses["grpc"]) as (pool, fake, channel):
        pool.offload(IDS, "alice", "c1")  # every PUT completes on its success part either way
        s = stats(pool)
        first = 0 if admission == "on_reuse" else 4
        assert (s.chunks, s.puts_skipped) == (first, 4 - first)
        follow_up(channel, IDS + [7])
        assert fake.requests[-1].stored_tokens == (0 if admission == "on_reuse" else len(IDS))
        pool.offload(IDS, "alice", "c2")  # the same prefix again (another context of hers): seen twice
        s = stats(pool)
        assert (s.chunks, s.puts_skipped) == (4, 4 - first)
        follow_up(channel, IDS + [7])
        assert fake.requests[-1].stored_tokens == len(IDS) and fake.outcomes[-1] == [(2, 0)] * 4
        pool.offload([1] * 16, "alice", "c3")  # a one-shot block
        assert stats(pool).puts_skipped == 4 - first + (admission == "on_reuse")


def storage_keys(node) -> tuple[int, int]:
    """(keys, used bytes) of the storage node's KV namespace."""
    with secure_channel(node.addresses["admin"], peer="storage") as channel:
        ns = storage_admin_pb2_grpc.StorageAdminStub(channel).Stats(storage_admin_pb2.StatsRequest()).namespaces
    return sum(n.key_count for n in ns), sum(n.used_bytes for n in ns)


@pytest.mark.parametrize("layout", [LAYOUT, pytest.param(MODEL_LAYOUT, marks=pytest.mark.slow)],
                         ids=["test-blocks", "model-blocks"])
def test_one_shot_traffic_keeps_storage_under_its_bound(start_service, storage, layout):
    block = layout.chunk_payload_bytes(layout.block_tokens)
    high, low = 15 * block, 11 * block  # the stream puts about 16 times this
    agent = start_service("agent", "serve", "smartnic", env=agent_env(
        storage, capacity_high_bytes=high, capacity_low_bytes=low, eviction_policy="both"))
    bt = layout.block_tokens
    with compute_beside(agent.addresses["grpc"], layout) as (pool, _, _):
        samples, request_bytes = [], 0
        for i in range(60):  # 60 one-shot requests of 4 blocks each (three full, one partial)
            ids = [10_000 + 1000 * i + t for t in range(4 * bt - bt // 4)]
            pool.offload(ids, f"user-{i % 7}", f"one-shot-{i}")
            s = stats(pool)
            request_bytes = request_bytes or s.bytes_put
            samples.append(s.bytes_stored)
        deadline = time.monotonic() + 5
        while stats(pool).bytes_stored > high and time.monotonic() < deadline:
            time.sleep(0.05)
        s = stats(pool)
        put_total = s.bytes_put
        # each sample right after a request's PUTs: at most that request above the bound (its
        # publishes woke the eviction pass); once it ran, under the high watermark
        assert max(samples) <= high + request_bytes, (max(samples), high, request_bytes)
        assert s.bytes_stored <= high and put_total > 10 * high
        assert s.evictions_by_reason["capacity"] > 0
        deadline = time.monotonic() + 5  # the evicted blocks are deleted on the storage node too
        while storage_keys(storage[0][1])[0] != s.chunks and time.monotonic() < deadline:
            time.sleep(0.05)
        keys, used = storage_keys(storage[0][1])
        assert keys == s.chunks
        print(f"\none-shot stream ({block / 1024:.0f} KiB blocks): {len(samples)} requests, "
              f"{put_total / 1024:.0f} KiB put, bound {high / 1024:.0f} KiB (low {low / 1024:.0f}): stored at most {max(samples) / 1024:.1f} KiB, "
              f"{s.bytes_stored / 1024:.1f} KiB at the end ({keys} keys, {used / 1024:.0f} KiB used on the node), "
              f"evictions {dict(s.evictions_by_reason)}; trigger-to-fire p50 {s.trigger_to_fire_p50_us:.0f} us, "
              f"p99 {s.trigger_to_fire_p99_us:.0f} us over {s.triggered_fired} standing PUTs")
