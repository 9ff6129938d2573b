"""The batching engine in-process with a tiny model: batches, prefix reuse, offload and restore
through the region (a FakeNic plays the agent's data plane), preemption, failures."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import grpc
import numpy as np
import pytest

from hostmem.block_hash import Salts, hash_chain, salt_for
from tests.compute_node.conftest import run_turn

PROMPTS = [list(range(100 + 7 * i, 100 + 7 * i + 20 + 9 * i)) for i in range(6)]


def alone(make_node, prompts, **kw):
    """Each prompt's reply on a fresh node, one at a time."""
    node = make_node(**kw)
    return [run_turn(node, ids, f"solo-{i}", n=12)[0] for i, ids in enumerate(prompts)]


def together(node, prompts, policy="resident", n=12):
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(run_turn, node, ids, f"c{i}", policy, n) for i, ids in enumerate(prompts)]
        return [f.result() for f in futures]


def test_sequences_in_one_batch_get_the_replies_they_get_alone(make_node):
    solo = alone(make_node, PROMPTS)
    node = make_node()
    results = together(node, PROMPTS)
    assert [tokens for tokens, _, _ in results] == solo
    assert max(record.batch_size for _, record, _ in results) > 1  # they did share steps
    assert node.engine.snapshot()["num_requests_running"] == 0


def test_a_resident_follow_up_reuses_its_full_blocks_from_the_pool(make_node):
    node = make_node()
    ids = PROMPTS[5]
    first, rec1, _ = run_turn(node, ids, "ctx")
    follow = ids + first + [7, 8, 9]
    _, rec2, _ = run_turn(node, follow, "ctx")
    bt = node.settings.block_tokens
    assert rec1.kv_source == "none" and rec2.kv_source == "resident"
    assert rec2.tokens_cached == rec2.tokens_reused == (len(ids) + len(first) - 1) // bt * bt
    assert rec2.tokens_prefilled == len(follow) - rec2.tokens_reused


def test_recompute_reuses_nothing(make_node):
    node = make_node()
    ids = PROMPTS[4]
    first, _, _ = run_turn(node, ids, "ctx", "recompute")
    _, rec, _ = run_turn(node, ids + first + [7], "ctx", "recompute")
    assert rec.kv_source == "recomputed" and rec.tokens_reused == 0 and not rec.fallback_reason


def test_triggered_blocks_leave_by_descriptor_and_come_back_bit_identical(make_node):
    node = make_node(nic=True)
    ids = PROMPTS[5]
    first, rec1, _ = run_turn(node, ids, "ctx", "triggered")
    bt, computed = node.settings.block_tokens, len(ids) + len(first) - 1
    time.sleep(0.05)
    described = list(node.nic.descriptors)
    assert [d.chunk_index for d in described] == list(range(-(-computed // bt)))
    assert [d.token_count for d in described] == [bt] * (computed // bt) + ([computed % bt] if computed % bt else [])
    assert [d.hash for d in described[:computed // bt]] == hash_chain(ids + first, salt_for("default", "u"), bt)[:computed // bt]
    assert rec1.chunks_offloaded == len(described) and rec1.offload_stall_ms > 0
    assert 0 < rec1.offload_stall_cpu_ms <= rec1.offload_stall_ms * 1.05  # the thread's CPU, part of the wall
    assert {s.step for s in rec1.steps} == {2, 4}
    stored = dict(node.nic.stored)
    follow = ids + first + [7, 8, 9]
    _, rec2, restores = run_turn(node, follow, "ctx", "triggered")
    assert rec2.kv_source == "restored", rec2.fallback_reason
    assert rec2.tokens_reused == computed and rec2.blocks_restored == len(described) and not rec2.blocks_failed
    assert {s.step for s in rec2.steps} >= {7, 8}
    [event] = restores
    for block in event.blocks:  # the bytes that landed are the bytes that left
        ids_bytes, kv, count = stored[block.hash]
        L = node.pool.layout
        assert bytes(node.pool.region.view(*L.token_ids_range(block.block, count))) == ids_bytes
        assert bytes(node.pool.region.view(*L.block_range(block.block))) == kv


def test_a_shared_prefix_is_stored_once_named_by_the_tenant_and_restored_for_its_other_users(make_node):
    node = make_node(nic=True)
    ids, bt = PROMPTS[5], node.settings.block_tokens  # 65 tokens; the first 20 are the tenant's shared prefix
    alice, _, _ = run_turn(node, ids, "ctx-a", "triggered", user="alice", tenant="acme", shared_prefix_tokens=20)
    time.sleep(0.05)
    described = list(node.nic.descriptors)
    assert [d.shared for d in described] == [True, True] + [False] * (len(described) - 2)
    chain = hash_chain(ids, Salts.of("acme", "alice", 20, bt), bt)
    assert [d.hash for d in described[:len(chain)]] == chain
    assert chain[:2] == hash_chain(ids[:16], salt_for("acme", "", shared=True), bt)
    # bob, same tenant, same prompt: only the shared blocks are his to restore; the same reply
    bob, rec_b, restores = run_turn(node, ids, "ctx-b", "triggered", user="bob", tenant="acme",
                                    shared_prefix_tokens=20)
    [event] = restores
    assert [(b.chunk_index, b.shared) for b in event.blocks] == [(0, True), (1, True)]
    assert rec_b.kv_source == "restored" and rec_b.tokens_reused == 16 and bob == alice
    # without the prefix marked shared, or in another tenant: nothing of alice's
    for user, tenant, shared in (("bob", "acme", 0), ("carol", "other", 20)):
        _, rec, restores = run_turn(node, ids, f"ctx-{user}", "triggered", user=user, tenant=tenant,
                                    shared_prefix_tokens=shared)
        assert rec.tokens_reused == 0 and not restores


def test_a_restore_with_a_failed_block_keeps_the_blocks_before_it(make_node):
    node = make_node(nic=True)
    ids = PROMPTS[5]
    first, _, _ = run_turn(node, ids, "ctx", "triggered")
    time.sleep(0.05)
    bt = node.settings.block_tokens
    node.nic.fail.add(hash_chain(ids + first, salt_for("default", "u"), bt)[2])
    _, rec, _ = run_turn(node, ids + first + [7], "ctx", "triggered")
    assert rec.kv_source == "partial" and rec.blocks_restored == 2 and rec.blocks_failed >= 1
    assert rec.tokens_reused == 2 * bt and "block 2" in rec.fallback_reason


def test_a_restore_that_never_lands_is_recomputed_after_the_deadline(make_node):
    node = make_node(nic=True, restore_timeout_s=0.5)
    ids = PROMPTS[3]
    first, _, _ = run_turn(node, ids, "ctx", "triggered")
    time.sleep(0.05)
    node.nic.silent.update(node.nic.stored)
    start = time.monotonic()
    tokens, rec, _ = run_turn(node, ids + first + [7], "ctx", "triggered")
    assert rec.kv_source == "recomputed" and "timed out" in rec.fallback_reason
    assert len(tokens) == 16 and time.monotonic() - start < 10


@pytest.mark.parametrize("preemption", ["recompute", "swap"])
def test_a_pool_smaller_than_the_batch_preempts_and_every_reply_is_right(make_node, preemption):
    prompts = [list(range(300 + 11 * i, 300 + 11 * i + 40)) for i in range(6)]
    solo = alone(make_node, prompts, pool_tokens=512)
    node = make_node(nic=True, pool_tokens=16 * 8, preemption=preemption)  # 16 blocks; each needs 7
    results = together(node, prompts, policy="triggered", n=12)
    assert [tokens for tokens, _, _ in results] == solo
    snap = node.engine.snapshot()
    assert snap["preemptions"].get(preemption, 0) > 0, snap
    assert sum(record.preemptions for _, record, _ in results) == sum(snap["preemptions"].values())


def test_never_fits_and_a_full_queue_get_their_status(make_node):
    node = make_node(pool_tokens=64, queue_bound=2)  # 8 blocks of 8 tokens
    with pytest.raises(grpc.RpcError) as err:
        run_turn(node, list(range(100, 160)), "big", n=16)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "need 10 blocks" in err.value.details() and "the pool has 8" in err.value.details()
    assert run_turn(node, list(range(100, 110)), "ok", n=4)[1].tokens_out == 4  # still serving


def test_the_pool_is_the_region_and_its_blocks_are_contiguous(make_node):
    node = make_node()
    pool, L = node.pool, node.pool.layout
    assert pool.kv.shape == (L.num_blocks, L.num_layers, 2, L.num_kv_heads, L.block_tokens, L.head_dim)
    block = 3
    pool.kv[block].fill_(1.5)
    offset, length = L.block_range(block)
    assert length == L.block_bytes and np.all(np.frombuffer(pool.region.view(offset, length), np.float32) == 1.5)
    assert pool.kv[block].data_ptr() == pool.kv.data_ptr() + offset


def _built(node, ids):
    """A first turn under `triggered` whose blocks the FakeNic stored: (its reply, the follow-up's ids, the
    reference reply of the follow-up, recomputed, and the follow-up's block names)."""
    first, _, _ = run_turn(node, ids, "ctx", "triggered")
    time.sleep(0.05)
    follow = ids + first + [7, 8, 9]
    reference, _, _ = run_turn(node, follow, "ref", "recompute")
    names = hash_chain(follow, salt_for("default", "u"), node.settings.block_tokens)
    return follow, reference, names


def test_a_restore_joins_after_its_first_layer_group_and_the_forward_waits_for_the_next(make_node):
    node = make_node(nic=True)
    follow, reference, _ = _built(node, PROMPTS[5])
    node.nic.group_delay_s = 0.3  # group 1 lands 0.3 s after group 0 (garbage in its layers until then)
    before = node.engine.snapshot()
    tokens, rec, _ = run_turn(node, follow, "ctx", "triggered")
    after = node.engine.snapshot()
    assert rec.kv_source == "restored" and not rec.blocks_failed, rec.fallback_reason
    assert tokens == reference
    assert after["restore_layer_waits"] > before.get("restore_layer_waits", 0)
    assert after["restore_layer_wait_us"] - before.get("restore_layer_wait_us", 0) > 100_000  # it did wait
    assert after["restores_landing"] == 0 and node.engine.bm.num_pinned_blocks == 0


def test_a_layer_group_that_fails_keeps_the_blocks_before_its_block(make_node):
    node = make_node(nic=True)
    follow, reference, names = _built(node, PROMPTS[5])
    node.nic.group_delay_s = 0.1
    node.nic.fail_from[names[2]] = 1  # block 2 lands its first group, then fails
    tokens, rec, _ = run_turn(node, follow, "ctx", "triggered")
    bt = node.settings.block_tokens
    assert rec.kv_source == "partial" and rec.blocks_restored == 2 and rec.blocks_failed >= 1
    assert rec.tokens_reused == 2 * bt and "block 2" in rec.fallback_reason
    assert tokens == reference
    time.sleep(0.2)
    assert node.engine.bm.num_pinned_blocks == 0 and not node.engine.restores.late_pins


def test_a_group_later_than_the_forward_waits_sends_the_sequence_out_until_all_landed(make_node):
    node = make_node(nic=True, restore_layer_wait_s=0.1)
    follow, reference, _ = _built(node, PROMPTS[5])
    node.nic.group_delay_s = 0.5  # past the forward's wait: the others would not wait that long
    tokens, rec, _ = run_turn(node, follow, "ctx", "triggered")
    assert rec.kv_source == "restored" and not rec.blocks_failed, rec.fallback_reason  # it all landed, later
    assert tokens == reference


def test_a_group_that_never_lands_is_recomputed_after_the_deadline(make_node):
    node = make_node(nic=True, restore_timeout_s=1.0, restore_layer_wait_s=0.1)
    follow, reference, _ = _built(node, PROMPTS[3])
    node.nic.group_delay_s = 0.05
    node.nic.silent_groups.add(1)
    start = time.monotonic()
    tokens, rec, _ = run_turn(node, follow, "ctx", "triggered")
    assert rec.kv_source == "recomputed" and "timed out" in rec.fallback_reason
    assert tokens == reference and time.monotonic() - start < 10
    # the blocks its late GETs might still write stay out of use until given up on
    assert node.engine.restores.late_pins and node.engine.bm.num_pinned_blocks > 0


def test_turns_sharing_a_block_whose_put_is_in_flight_all_finish(make_node):
    # B starts while A still decodes and A's PUTs of their common blocks are in flight: B waits for
    # those PUTs instead of storing the same pool blocks again (which lost A's PUT and hung A).
    node = make_node(nic=True)
    node.nic.put_delay_s = 0.1
    common = list(range(500, 532))  # four blocks of 8 tokens
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a = pool.submit(run_turn, node, common + [601, 602, 603], "a", "triggered", 150)
        time.sleep(0.15)
        b = pool.submit(run_turn, node, common + [701, 702], "b", "triggered", 4)
        (_, rec_a, _), (_, rec_b, _) = a.result(timeout=60), b.result(timeout=60)
    assert rec_b.tokens_cached >= len(common), "B did not find A's blocks in the pool: the test tests nothing"
    assert rec_a.tokens_out == 150 and rec_b.tokens_out == 4
    assert node.nic.refused == 0  # no descriptor rewritten under a PUT in flight
    assert node.engine.snapshot()["num_requests_running"] == 0 and not node.engine.offloads.puts


def test_between_layers_a_follow_up_starts_its_restore_and_a_finished_turn_sends_its_record(make_node):
    # A long turn keeps the engine in slow forwards (each layer 30 ms). B, a follow-up with stored KV,
    # arrives meanwhile: its restore is asked for inside a forward, not after it, and B's record (its
    # tail's PUT ended while A's forward ran) leaves inside one too. B's reply is still right.
    # B is sent while a forward is held at a layer until B reaches the intake: sent at random, it could
    # land after a forward's last layer and be taken in between two forwards (a flake, 1 run in 4).
    node = make_node(nic=True)
    follow, reference, _ = _built(node, PROMPTS[5])
    engine = node.engine
    in_forward, seen = [False], {"restore": [], "record": []}
    step, start_restore, maybe_record = engine.runner.step, engine.restores.start, engine._maybe_record
    want_b, holding, held = threading.Event(), threading.Event(), threading.Event()
    b_in = []  # whether B was in the intake when the held forward went on

    def hold_until_b_is_in():
        holding.set()
        deadline = time.monotonic() + 30
        while not engine._intake and time.monotonic() < deadline:
            time.sleep(0.002)
        b_in.append(bool(engine._intake))
        held.set()

    def slow_step(batch, before_layer=None):
        def layer(i):
            time.sleep(0.03)
            if want_b.is_set() and not held.is_set():
                hold_until_b_is_in()
            before_layer(i)
        in_forward[0] = True
        try:
            return step(batch, layer)
        finally:
            in_forward[0] = False

    def note_restore(state, request):
        seen["restore"].append(in_forward[0])
        return start_restore(state, request)

    def note_record(state):
        recorded = state.recorded
        maybe_record(state)
        if state.turn.request_id == "r-ctx" and state.recorded and not recorded:
            seen["record"].append(in_forward[0])

    engine.runner.step, engine.restores.start, engine._maybe_record = slow_step, note_restore, note_record
    node.nic.put_delay_s = 0.02
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        a = pool.submit(run_turn, node, PROMPTS[0], "a", "resident", 60)
        time.sleep(0.5)
        want_b.set()
        assert holding.wait(30), "no forward of A's ran after B was wanted"
        tokens, rec, _ = run_turn(node, follow, "ctx", "triggered", 4)
        assert b_in == [True], "B did not reach the intake while a forward was held"
        assert not a.done(), "A ended before B: no forward ran beside B, the test tests nothing"
        a.result(timeout=60)
    assert rec.kv_source == "restored", rec.fallback_reason
    assert tokens == reference[:4]
    assert seen["restore"] == [True]
    assert seen["record"] == [True]
