"""The compute node's side of the agent's benchmarks, in a process of its own.

In a deployment the compute node is another process: it stores a trigger counter into the
shared counter page and polls the completion counter there, and neither costs the agent
anything. `kvtb bench smartnic` runs the agent in its own process, so a compute side polling
from a thread of that process would take the agent's GIL at every poll, and the transfers
would be timed slower than the agent moves them. So the benchmarks do both from a child
process, as the compute node would, and the clock runs there: from the store until the
completion counter reaches its total, waiting with `hostmem.counters.wait_counter`, as the compute node does.
"""
from __future__ import annotations

import multiprocessing
import time

from hostmem.counters import wait_counter
from hostmem.region import Region


class ComputeStandIn:
    """A child process that stores a region's trigger counters and times their completions.

        with ComputeStandIn(region, counter_offset) as compute:
            seconds = compute.fire(trigger=0, value=1, done=1, total=128)
    """

    def __init__(self, region: Region, counter_offset: int, start_timeout_s: float = 60.0):
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(target=_serve, name="kvtb-bench-compute", daemon=True,
                                 args=(child, region.name, region.size, counter_offset, region.counter_count))
        self._proc.start()
        child.close()
        try:
            self._call(("ready",), start_timeout_s)
        except BaseException:  # it never came up: leave no process behind
            self.close()
            raise

    def fire(self, trigger: int, value: int, done: int, total: int, timeout_s: float = 120.0) -> float:
        """Store `value` into counter `trigger`; the seconds until counter `done`'s success plus
        error reaches `total`. TimeoutError after timeout_s."""
        return self._call(("fire", trigger, value, done, total, timeout_s), timeout_s + 10.0)

    def _call(self, message: tuple, timeout_s: float):
        try:
            self._conn.send(message)
        except OSError as exc:
            raise self._exited() from exc
        if not self._conn.poll(timeout_s):
            raise TimeoutError(f"the compute stand-in did not answer {message[0]!r} within {timeout_s:g} s")
        try:
            kind, value = self._conn.recv()
        except (EOFError, OSError) as exc:  # its end of the pipe closed: it exited
            raise self._exited() from exc
        if kind == "timeout":
            raise TimeoutError(value)
        return value

    def _exited(self) -> RuntimeError:
        self._proc.join(timeout=5)  # its exit code, once it is reaped
        return RuntimeError(f"the compute stand-in exited (code {self._proc.exitcode}); "
                            "its traceback is on stderr")

    def close(self) -> None:
        try:
            self._conn.send(None)
        except (BrokenPipeError, OSError):
            pass
        self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join()
        self._conn.close()

    def __enter__(self) -> ComputeStandIn:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _serve(conn, name: str, size: int, counter_offset: int, counters: int) -> None:
    region = Region.attach(name, size, counter_offset, counters)
    try:
        while (message := conn.recv()) is not None:
            if message[0] == "ready":
                conn.send(("ok", None))
            else:
                conn.send(_fire(region, *message[1:]))
    except EOFError:  # the benchmark went away
        pass
    finally:
        region.close()


def _fire(region: Region, trigger: int, value: int, done: int, total: int, timeout_s: float) -> tuple:
    start = time.perf_counter()
    region.store_counter(trigger, value)
    if not wait_counter(lambda: region.counter_total(done), total, timeout_s):
        return "timeout", f"counter {done} stuck at {region.read_counter(done)}, wanted {total}"
    return "ok", time.perf_counter() - start

