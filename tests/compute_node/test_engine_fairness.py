"""The engine's fair share between users, in-process with the tiny model: a greedy user's queue does not
hold back another user's turn."""
from __future__ import annotations

import concurrent.futures
import time

from kvtb_proto import compute_pb2


def first_token_at(node, ids, user, context, n=12):
    """(time of the turn's first token, tokens out) through the node's gRPC service."""
    request = compute_pb2.TurnRequest(request_id=f"r-{context}", user_id=user, context_id=context, token_ids=ids,
                                      max_new_tokens=n, policy="resident", ignore_eos=True)
    first, out = None, 0
    for event in node.stub.Generate(request, timeout=120):
        if event.HasField("token"):
            first = first or time.monotonic()
            out += 1
    return first, out


def test_a_modest_users_turn_starts_before_the_greedy_users_queue_drains(make_node):
    node = make_node(max_num_seqs=2)
    greedy = [list(range(1000 + 40 * i, 1000 + 40 * i + 24)) for i in range(12)]
    with concurrent.futures.ThreadPoolExecutor(13) as pool:
        futures = [pool.submit(first_token_at, node, ids, "greedy", f"g{i}") for i, ids in enumerate(greedy)]
        deadline = time.monotonic() + 30
        while node.engine.snapshot()["num_requests_waiting"] < 8:  # most of greedy's turns are queued
            assert time.monotonic() < deadline
            time.sleep(0.002)
        modest = pool.submit(first_token_at, node, list(range(5000, 5024)), "modest", "m")
        m_first, m_out = modest.result(timeout=120)
        results = [f.result(timeout=120) for f in futures]
    assert m_out == 12 and all(out == 12 for _, out in results)
    before = sum(1 for first, _ in results if first < m_first)
    assert before <= 4, f"{before} of greedy's 12 turns started before modest's (FIFO: all 12)"
