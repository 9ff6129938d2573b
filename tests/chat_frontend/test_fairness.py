"""Fair share on a real frontend process (real gRPC and HTTP; a fake agent whose greedy user's turns
hang): one user holding 130 streams leaves every turn of another user served at once (issue 31)."""
import asyncio
import time

import grpc

from kvtb_proto import frontend_pb2, frontend_pb2_grpc

from .test_http_api import TOKEN, post, start_frontend

GREEDY, MODEST = TOKEN, "t-bob"  # alice and bob
STREAMS, MODEST_TURNS = 130, 6
SHARE = {"max_concurrent_turns": 8, "max_waiting_turns": 16, "user_max_concurrent_turns": 4,
         "user_max_waiting_turns": 4, "queue_timeout_s": 30.0}


async def greedy_turn(stub, i: int) -> str:
    """'ok', or the refusal's status and its retry-after trailer."""
    call = stub.Chat(frontend_pb2.ChatRequest(token=GREEDY, message=f"hog {i}", max_new_tokens=4))
    try:
        async for _ in call:
            pass
        return "ok"
    except grpc.aio.AioRpcError as exc:
        retry = dict(exc.trailing_metadata() or ()).get("retry-after", "")
        return f"{exc.code().name} retry-after={retry}"


async def modest_turns(stub) -> list[float]:
    """The modest user's turns, one after the other in one context; each one's seconds."""
    context, took = "", []
    for i in range(MODEST_TURNS):
        begin = time.monotonic()
        events = [e async for e in stub.Chat(frontend_pb2.ChatRequest(
            token=MODEST, message=f"question {i}", context_id=context, max_new_tokens=4), timeout=10)]
        assert events[-1].summary.reply == " ok"
        context = events[0].context_id
        took.append(time.monotonic() - begin)
    return took


def test_a_greedy_user_with_130_streams_leaves_another_users_turns_served(start_service, tmp_path):
    addresses, node, server = start_frontend(start_service, tmp_path, **SHARE)
    node.held_users = {"alice"}  # the greedy user's turns hang at the engine until the gate opens
    node.gate.clear()

    async def scenario():
        async with grpc.aio.insecure_channel(addresses["grpc"]) as channel:
            stub = frontend_pb2_grpc.ChatFrontendStub(channel)
            greedy = [asyncio.create_task(greedy_turn(stub, i)) for i in range(STREAMS)]
            for _ in range(4):  # its share reached the engine
                assert await asyncio.to_thread(node.started.acquire, timeout=10)
            deadline = time.monotonic() + 10
            while sum(t.done() for t in greedy) < STREAMS - 8 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            refused = [t.result() for t in greedy if t.done()]
            assert len(refused) == STREAMS - 8 and all(r.startswith("RESOURCE_EXHAUSTED") for r in refused)
            assert all(int(r.split("=")[1]) >= 1 for r in refused)
            took = await modest_turns(stub)  # every turn served, each at once
            assert max(took) < 2.0, took
            status, body, headers = await asyncio.to_thread(post, addresses["http"], {
                "model": "fake", "messages": [{"role": "user", "content": "one more"}]})
            assert status == 429 and body["error"]["type"] == "rate_limit_error"
            assert body["error"]["code"] == "resource_exhausted" and "your share" in body["error"]["message"]
            assert int(headers["Retry-After"]) >= 1
            node.gate.set()
            results = await asyncio.gather(*greedy)
        assert results.count("ok") == 8  # 4 running and 4 waiting: all served in the end
    try:
        asyncio.run(scenario())
    finally:
        node.gate.set()
        server.stop(0)
