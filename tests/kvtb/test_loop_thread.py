"""kvtb.loop_thread: an asyncio service started and stopped like any node."""
import asyncio

import pytest

from kvtb.loop_thread import LoopThread


def test_start_returns_what_serve_started_with_and_stop_ends_it():
    ended = []

    async def serve(started, stop):
        started.set_result({"grpc": "127.0.0.1:1"})
        await stop.wait()
        ended.append(True)
    loop = LoopThread("test-loop")
    assert loop.start(serve) == {"grpc": "127.0.0.1:1"}

    async def on_the_loop():
        return asyncio.get_running_loop() is loop.loop
    assert loop.run(on_the_loop(), timeout_s=5) is True
    loop.stop()
    assert ended == [True] and not loop._thread.is_alive()


def test_a_serve_that_fails_before_it_started_raises_from_start():
    async def serve(started, stop):
        raise OSError("the address is taken")
    with pytest.raises(OSError, match="taken"):
        LoopThread("test-loop").start(serve)
    LoopThread("never-started").stop()  # nothing to stop: no error
