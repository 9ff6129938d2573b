"""The engine survives its own bug: a step that raises fails the turns it touched, frees what they held
(blocks under I/O only once the I/O ended) and the node serves the next turn. And a block whose PUT
outlived drain_timeout_s is never handed out while the NIC may still read it."""
from __future__ import annotations

import concurrent.futures
import threading
import time

import grpc
import numpy as np
import pytest

from tests.compute_node.conftest import run_turn

PROMPT_A = list(range(100, 130))
PROMPT_B = list(range(200, 222))


def fail_next_step(engine, before=lambda: None):
    """The model runner's next step raises (once), after before() returned; the calls it saw."""
    real, calls = engine.runner.step, []

    def step(runs, before_layer=None):
        calls.append([len(r.token_ids) for r in runs])
        if len(calls) == 1:
            before()
            raise RuntimeError("injected: a bug in the step")
        return real(runs, before_layer)
    engine.runner.step = step
    return calls


def wait_for(cond, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def test_a_step_that_raises_fails_its_turns_and_the_node_serves_the_next(make_node):
    node = make_node(max_num_seqs=1)  # B waits in the queue while A's step fails: B is not touched
    engine = node.engine
    free = engine.bm.num_free_blocks
    reference, _, _ = run_turn(node, PROMPT_B, "ref", "recompute", n=8)
    assert engine.bm.num_free_blocks == free
    submitted = threading.Event()
    calls = fail_next_step(engine, before=lambda: submitted.wait(10) and wait_for(lambda: engine._intake))
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a = pool.submit(run_turn, node, PROMPT_A, "a", "resident", 8)
        wait_for(lambda: calls)  # A's step is under way
        b = pool.submit(run_turn, node, PROMPT_B, "b", "resident", 8)
        submitted.set()
        with pytest.raises(grpc.RpcError) as err:
            a.result(timeout=60)
        tokens_b, rec_b, _ = b.result(timeout=60)
    assert err.value.code() == grpc.StatusCode.INTERNAL and "engine failed" in err.value.details()
    assert tokens_b == reference and rec_b.tokens_out == 8  # the turn the step did not touch is served
    tokens_c, rec_c, _ = run_turn(node, PROMPT_A, "c", "resident", n=8)  # and the next one
    assert rec_c.tokens_out == 8 and len(tokens_c) == 8
    snap = engine.snapshot()
    assert snap["steps_failed"] == 1 and snap["num_requests_running"] == snap["num_requests_waiting"] == 0
    assert engine.bm.num_free_blocks == free and engine.bm.num_pinned_blocks == 0
    assert not engine.states and not engine.scheduler.has_work()


def test_a_failed_step_keeps_the_blocks_its_restores_gets_may_write_until_they_landed(make_node):
    node = make_node(nic=True)
    engine = node.engine
    ids = list(range(300, 341))
    first, _, _ = run_turn(node, ids, "ctx", "triggered")
    time.sleep(0.05)
    follow = ids + first + [7, 8, 9]
    free = engine.bm.num_free_blocks
    wait_for(lambda: engine.bm.num_pinned_blocks == 0)
    node.nic.group_delay_s = 1.0  # group 0 lands, the sequence joins the batch, group 1 lands 1 s later
    fail_next_step(engine)
    with pytest.raises(grpc.RpcError) as err:
        run_turn(node, follow, "ctx", "triggered")
    assert err.value.code() == grpc.StatusCode.INTERNAL
    # the turn is gone, but the GETs of group 1 may still write its blocks: they stay out of use
    pinned = engine.bm.num_pinned_blocks
    assert pinned > 0 and engine.restores.late_pins and not engine.states
    assert engine.bm.num_allocatable_blocks == engine.bm.num_blocks - pinned
    wait_for(lambda: engine.bm.num_pinned_blocks == 0, timeout_s=5)  # landed: released
    assert not engine.restores.late_pins and engine.bm.num_free_blocks == free
    _, rec, _ = run_turn(node, follow, "ctx2", "resident", n=4)
    assert rec.tokens_out == 4 and not engine.scheduler.has_work()


def test_a_bug_in_one_restores_poll_fails_that_turn_alone(make_node):
    node = make_node(nic=True)
    engine = node.engine
    real = engine.restores._poll_one

    def poll(state, now):
        if state.turn.context_id == "bad":
            raise KeyError("injected: a bug in one restore's bookkeeping")
        return real(state, now)
    ids = list(range(400, 431))
    first, _, _ = run_turn(node, ids, "bad", "triggered")
    time.sleep(0.05)
    engine.restores._poll_one = poll
    with pytest.raises(grpc.RpcError) as err:
        run_turn(node, ids + first + [5], "bad", "triggered")
    assert err.value.code() == grpc.StatusCode.INTERNAL
    _, rec, _ = run_turn(node, list(range(500, 520)), "good", "triggered", n=6)
    assert rec.tokens_out == 6 and engine.snapshot()["steps_failed"] == 0
    wait_for(lambda: engine.bm.num_pinned_blocks == 0)


def test_a_block_whose_put_outlived_its_timeout_is_not_reused_while_the_nic_may_read_it(make_node):
    # 4 blocks. A's two blocks leave by PUTs the NIC reads only after 1 s each, past the 0.2 s drain
    # timeout: A's turn ends, but its blocks stay pinned. B needs 3 blocks: it waits for A's first PUT to
    # end instead of writing its KV into a block the NIC has yet to read.
    node = make_node(nic=True, pool_tokens=32, drain_timeout_s=0.2)
    engine, bt = node.engine, node.settings.block_tokens
    node.nic.put_delay_s = 1.0
    a = list(range(600, 610))
    tokens_a, rec_a, _ = run_turn(node, a, "a", "triggered", n=4)
    assert rec_a.chunks_offloaded == 2
    wait_for(lambda: engine.snapshot().get("puts_timed_out", 0) >= 1)
    assert engine.bm.num_quarantined_blocks >= 1 and engine.bm.num_pinned_blocks >= 1
    assert engine.bm.num_pinned_free_blocks == engine.bm.num_pinned_blocks - engine.bm.num_quarantined_blocks
    run_turn(node, list(range(700, 720)), "b", "resident", n=4)
    wait_for(lambda: len(node.nic.descriptors) >= 2, timeout_s=10)
    wait_for(lambda: engine.bm.num_pinned_blocks == 0 and not engine.offloads.stuck_puts)
    # what the NIC stored under A's names is A's tokens, not B's
    computed = a + tokens_a[:-1]
    for d in node.nic.descriptors[:2]:
        ids, _, count = node.nic.stored[d.hash]
        assert np.frombuffer(ids, dtype="<u4").tolist() == computed[d.chunk_index * bt:d.chunk_index * bt + count]
    assert engine.snapshot()["blocks_quarantined"] == 0 and node.nic.refused == 0


def test_a_cancelled_turn_leaves_through_the_same_cleanup_and_frees_its_blocks(make_node):
    from compute_node.sampling import SamplingParams
    from compute_node.turn import Turn
    node = make_node()
    engine = node.engine
    free = engine.bm.num_free_blocks
    turn = Turn("r-cancel", "u", "c", "default", list(range(100, 140)), 200, SamplingParams(), "resident",
                ignore_eos=True)
    engine.submit(turn)
    assert turn.events.get(timeout=30)[0] == "token"
    turn.cancel()
    wait_for(lambda: not engine.states)
    assert engine.bm.num_free_blocks == free and not engine.scheduler.has_work()
    _, rec, _ = run_turn(node, list(range(100, 140)), "after", n=4)
    assert rec.tokens_out == 4
