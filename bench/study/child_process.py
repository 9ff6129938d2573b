"""A spawned child process spoken to over a pipe: (kind, *args) in, ("ok"|"error", value) out.

The paper study's compute processes (bench.study.paper, bench.study.paper_causes_compute) run in such a
child, as the compute node is a process of its own. The child answers once when it is ready, then once
per message, and ends on None.
"""
from __future__ import annotations

import contextlib
import multiprocessing
from collections.abc import Callable
from typing import Any


class ChildProcess:
    """target(conn, *args) in a spawned process; call(message) sends and returns its answer."""

    def __init__(self, target: Callable[..., None], args: tuple, name: str, ready_timeout_s: float = 120.0):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=target, args=(child, *args), name=name, daemon=True)
        self._proc.start()
        child.close()
        try:
            self.answer("ready", ready_timeout_s)
        except BaseException:
            self.close()
            raise

    def call(self, message: tuple, timeout_s: float = 900.0) -> Any:
        self._conn.send(message)
        return self.answer(message[0], timeout_s)

    def answer(self, kind: str, timeout_s: float) -> Any:
        """The child's next answer (RuntimeError for its error or its exit, TimeoutError past timeout_s)."""
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"the compute process did not answer {kind!r} within {timeout_s:g} s")
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError) as exc:
            self._proc.join(timeout=5)
            raise RuntimeError(f"the compute process exited (code {self._proc.exitcode})") from exc
        if status == "error":
            raise RuntimeError(f"compute process: {value}")
        return value

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._conn.send(None)
        self._proc.join(timeout=10)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()
