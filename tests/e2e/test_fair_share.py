"""A greedy user is held to its share on the real services, and another user's turns are all served."""
from __future__ import annotations

import threading

import grpc

from kvtb_proto import frontend_pb2, frontend_pb2_grpc
from tests.e2e.conftest import USERS, run_turn

GREEDY_STREAMS = 12  # past the share's 2 running + 4 waiting


def greedy_stream(frontend: str, i: int, outcomes: list, started: threading.Barrier) -> None:
    """One of the greedy user's turns: ("ok", None) or (status name, its retry-after trailer)."""
    with grpc.insecure_channel(frontend) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        started.wait()
        call = stub.Chat(frontend_pb2.ChatRequest(token=USERS["dave"], message=f"Count to ten, please ({i}).",
                                                  max_new_tokens=8), timeout=300)
        try:
            for _ in call:
                pass
            outcomes.append(("ok", None))
        except grpc.RpcError as exc:
            trailers = dict(exc.trailing_metadata() or ())
            outcomes.append((exc.code().name, trailers.get("retry-after")))


def test_a_greedy_user_is_refused_past_its_share_and_another_users_turns_are_served(triggered):
    outcomes: list = []
    started = threading.Barrier(GREEDY_STREAMS + 1)
    threads = [threading.Thread(target=greedy_stream, args=(triggered.frontend, i, outcomes, started))
               for i in range(GREEDY_STREAMS)]
    for t in threads:
        t.start()
    started.wait()
    try:
        modest = triggered.client("bob")
        replies = [run_turn(modest, message, max_new_tokens=8)[0]
                   for message in ("Hello, who are you?", "Name a colour.")]
    finally:
        for t in threads:
            t.join(timeout=300)
    assert all(replies), "the modest user's turns must all be served, with a reply"
    codes = [code for code, _ in outcomes]
    assert len(outcomes) == GREEDY_STREAMS
    assert codes.count("ok") >= 2, codes
    refused = [(code, retry) for code, retry in outcomes if code != "ok"]
    assert refused, "a user past its share of turns must be refused"
    assert all(code == "RESOURCE_EXHAUSTED" and retry and int(retry) >= 1 for code, retry in refused), refused
