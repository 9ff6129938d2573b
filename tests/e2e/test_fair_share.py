"""One key gets the whole server, an operator's quota still bites, and another user's turns are served
(issue 40), on the real services with the stock admission settings."""
from __future__ import annotations

import asyncio
import threading

import grpc
import openai
import pytest

from kvtb_proto import frontend_pb2, frontend_pb2_grpc
from tests.e2e.conftest import QUOTA, USERS, run_turn

pytestmark = pytest.mark.slow

GREEDY_STREAMS = 12  # past team-c's quota of 2 running + 4 waiting
CONCURRENT = 32      # one key, as AIPerf and batch clients send


def greedy_stream(frontend: str, i: int, outcomes: list, started: threading.Barrier) -> None:
    """One of the greedy user's turns: ("ok", None) or (status name, its retry-after trailer, details)."""
    with grpc.insecure_channel(frontend) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        started.wait()
        call = stub.Chat(frontend_pb2.ChatRequest(token=USERS["dave"], message=f"Count to ten, please ({i}).",
                                                  max_new_tokens=8), timeout=300)
        try:
            for _ in call:
                pass
            outcomes.append(("ok", None, ""))
        except grpc.RpcError as exc:
            trailers = dict(exc.trailing_metadata() or ())
            outcomes.append((exc.code().name, trailers.get("retry-after"), exc.details()))


def test_an_operators_quota_refuses_past_it_and_another_users_turns_are_served(triggered):
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
    codes = [code for code, _, _ in outcomes]
    assert len(outcomes) == GREEDY_STREAMS
    quota = QUOTA["team-c"]
    assert codes.count("ok") >= quota["user_max_concurrent_turns"], codes
    refused = [(code, retry, details) for code, retry, details in outcomes if code != "ok"]
    assert refused, "a user past the operator's quota must be refused"
    assert all(code == "RESOURCE_EXHAUSTED" and retry and int(retry) >= 1 and "over your quota" in details
               for code, retry, details in refused), refused


def test_one_key_alone_is_never_refused_by_an_idle_server(triggered):
    """The official openai client, 32 requests in flight on one key, no retries: every one served."""
    async def main() -> list:
        client = openai.AsyncOpenAI(base_url=f"http://{triggered.services['frontend']['http']}/v1",
                                    api_key=USERS["alice"], max_retries=0, timeout=300)
        try:
            return await asyncio.gather(*(client.chat.completions.create(
                model="SmolLM2-135M-Instruct", max_tokens=8, temperature=0,
                messages=[{"role": "user", "content": f"Say a number ({i})."}]) for i in range(CONCURRENT)),
                return_exceptions=True)
        finally:
            await client.close()
    results = asyncio.run(main())
    failed = [r for r in results if isinstance(r, Exception)]
    assert not failed, failed[:3]
    assert all(r.choices[0].message.content and r.usage.completion_tokens >= 1 for r in results)
