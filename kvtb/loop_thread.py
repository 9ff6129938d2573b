"""An asyncio service (grpc.aio, aiohttp) run as a node: its uvloop event loop in a thread of its own.

`start(serve)` runs `serve(started, stop)` on the loop and returns what `serve` put into `started`
(its addresses) once it listens, or raises why it could not start; `stop()` sets `stop` on the loop
and waits for `serve` to return. So a node whose work is asynchronous starts and stops like every
other (kvtb.node): the frontend, and the SmartNIC agent's gRPC server.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import uvloop

logger = logging.getLogger(__name__)

Serve = Callable[[concurrent.futures.Future, asyncio.Event], Awaitable[None]]


class LoopThread:
    """One event loop in one daemon thread. Not thread-safe: one owner starts and stops it; call()
    and run() may be used from any thread while it runs."""

    def __init__(self, name: str):
        self.name = name
        self.loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, serve: Serve) -> Any:
        """Run serve on the loop; return what it set `started` to (raise what it set or raised)."""
        started: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(serve, started), name=self.name, daemon=True)
        self._thread.start()
        return started.result()

    def _run(self, serve: Serve, started: concurrent.futures.Future) -> None:
        async def main() -> None:
            self.loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await serve(started, self._stop)
        try:
            uvloop.run(main())
        except BaseException as exc:
            if not started.done():
                started.set_exception(exc)
            else:
                logger.exception("the %s loop failed", self.name)

    def call(self, fn: Callable[..., Any], *args: Any) -> None:
        """fn(*args) on the loop, soon (from any thread)."""
        self.loop.call_soon_threadsafe(fn, *args)

    def run(self, coro: Awaitable[Any], timeout_s: float) -> Any:
        """Await coro on the loop and return its result (from another thread), within timeout_s."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Tell serve to stop and wait until the loop has closed everything (at most timeout_s)."""
        if self.loop is not None and self._stop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
