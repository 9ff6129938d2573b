"""Fair share on a real frontend process (real gRPC and HTTP; a fake agent whose greedy user's turns
wait for tickets): a user alone takes every place and the whole waiting room; another user's turn
pushes out the greedy user's newest waiting one and starts at the next free place (issue 40)."""
import asyncio
import threading
import time

import grpc

from kvtb_proto import frontend_pb2, frontend_pb2_grpc

from .test_http_api import TOKEN, post, start_frontend

GREEDY, MODEST = TOKEN, "t-bob"  # alice and bob
STREAMS, PLACES, ROOM = 130, 8, 16
SETTINGS = {"max_concurrent_turns": PLACES, "max_waiting_turns": ROOM, "queue_timeout_s": 30.0}


async def greedy_turn(stub, i: int) -> str:
    """'ok', or the refusal's status, its retry-after trailer and its message."""
    call = stub.Chat(frontend_pb2.ChatRequest(token=GREEDY, message=f"hog {i}", max_new_tokens=4))
    try:
        async for _ in call:
            pass
        return "ok"
    except grpc.aio.AioRpcError as exc:
        retry = dict(exc.trailing_metadata() or ()).get("retry-after", "")
        return f"{exc.code().name} retry-after={retry} {exc.details()}"


async def wait_for(predicate, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    return predicate()


def test_a_greedy_user_alone_fills_the_frontend_and_a_newcomer_starts_at_the_next_free_place(start_service,
                                                                                          tmp_path):
    addresses, node, server = start_frontend(start_service, tmp_path, **SETTINGS)
    node.held_users = {"alice"}  # the greedy user's turns hold their places until given a ticket
    node.tickets = threading.Semaphore(0)

    async def scenario():
        async with grpc.aio.insecure_channel(addresses["grpc"]) as channel:
            stub = frontend_pb2_grpc.ChatFrontendStub(channel)
            greedy = [asyncio.create_task(greedy_turn(stub, i)) for i in range(STREAMS)]
            for _ in range(PLACES):  # alone, it takes every place
                assert await asyncio.to_thread(node.started.acquire, timeout=10)
            assert await wait_for(lambda: sum(t.done() for t in greedy) >= STREAMS - PLACES - ROOM)
            refused = [t.result() for t in greedy if t.done()]
            assert len(refused) == STREAMS - PLACES - ROOM  # only a full waiting room refuses it
            assert all(r.startswith("RESOURCE_EXHAUSTED") and "busy" in r for r in refused), refused[:2]
            assert all(int(r.split()[1].split("=")[1]) >= 1 for r in refused)
            status, body, headers = await asyncio.to_thread(post, addresses["http"], {
                "model": "fake", "messages": [{"role": "user", "content": "one more"}]})
            assert status == 429 and body["error"]["type"] == "rate_limit_error"
            assert body["error"]["code"] == "resource_exhausted" and "busy" in body["error"]["message"]
            assert int(headers["Retry-After"]) >= 1

            async def modest_turn() -> list:
                return [e async for e in stub.Chat(frontend_pb2.ChatRequest(
                    token=MODEST, message="question", max_new_tokens=4), timeout=30)]
            modest = asyncio.create_task(modest_turn())
            # the full room takes the newcomer's turn: the greedy user's newest waiting one is pushed out
            assert await wait_for(lambda: sum(t.done() for t in greedy) == len(refused) + 1)
            pushed = [t.result() for t in greedy if t.done() and t.result() not in refused]
            assert len(pushed) == 1 and "gave its place to another user's" in pushed[0], pushed
            await asyncio.sleep(0.3)
            assert not modest.done()  # every place is held
            node.tickets.release()  # one greedy turn ends: the next place is the newcomer's
            events = await asyncio.wait_for(modest, 5)
            assert events[-1].summary.reply == " ok"
            assert node.requests[PLACES].user_id == "bob"  # the first turn to start after the greedy 8
            node.tickets.release(STREAMS)
            results = await asyncio.gather(*greedy)
        assert results.count("ok") == PLACES + ROOM - 1  # every turn it kept a place for was served
    try:
        asyncio.run(scenario())
    finally:
        node.gate.set()
        if node.tickets is not None:
            node.tickets.release(STREAMS)
        server.stop(0)
