from __future__ import annotations

import asyncio

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kvtb.grpc_health import NOT_SERVING, SERVING, add_health_and_reflection, check


def test_sync_server_moves_from_not_serving_to_serving():
    from concurrent import futures
    server = grpc.server(futures.ThreadPoolExecutor(2))
    health = add_health_and_reflection(server, ["kvtb.Test"])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert check(f"127.0.0.1:{port}") == NOT_SERVING
        health.set_serving()
        assert check(f"127.0.0.1:{port}") == SERVING
        assert check(f"127.0.0.1:{port}", "kvtb.Test") == SERVING
    finally:
        server.stop(None)


def test_aio_server_updates_are_applied():
    async def scenario():
        server = grpc.aio.server()
        health = add_health_and_reflection(server, ["kvtb.Test"], aio=True)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            await asyncio.sleep(0.05)
            before = (await stub.Check(health_pb2.HealthCheckRequest())).status
            health.set_serving()
            await asyncio.sleep(0.05)
            after = (await stub.Check(health_pb2.HealthCheckRequest(service="kvtb.Test"))).status
        await server.stop(None)
        return before, after

    assert asyncio.run(scenario()) == (NOT_SERVING, SERVING)


def test_unreachable_server_is_none():
    assert check("127.0.0.1:1", timeout_s=0.5) is None
