"""This machine's raw limits, measured beside a benchmark: ZeroMQ tcp loopback, pwrite+fsync, cached pread.

A meter measures one window when asked (`window(seconds)`, bytes/s); a benchmark takes a window of
every limit before each of its rounds (`Sampler`), so that limit and transfer see the same moments
of a shared machine, and keeps each one's best. A meter moves `size_bytes` at a time through
`working_set_bytes` of distinct bytes, cycling, so that it writes new data and streams from memory
as the path does (one cached buffer sent again and again flatters the machine). ZeroMQ is measured
between two processes, as the agent and a storage node are: the sender, a child process
(`python -m bench.rawlimits ADDRESS SIZE WORKING_SET`), sends only during a window.
"""
from __future__ import annotations

import contextlib
import itertools
import os
import select
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

_IN_FLIGHT_BYTES = 64 << 20  # ZeroMQ queues at most this much per socket, so a pause drains fast
_QUIET_MS = 100              # a pause has drained once nothing arrived for this long
_START_TIMEOUT_MS = 60_000


def payload(size_bytes: int) -> np.ndarray:
    """Random bytes ([size_bytes] uint8): nothing on the path can compress or dedupe them."""
    return np.random.default_rng(0).integers(0, 256, size_bytes, dtype=np.uint8)


def _slots(size_bytes: int, working_set_bytes: int | None) -> int:
    """How many distinct size_bytes pieces the working set holds (at least one)."""
    return max(1, (working_set_bytes or size_bytes) // size_bytes)


def steps_per_s(step: Callable[[], object], seconds: float, threads: int = 1) -> float:
    """Run step() on `threads` threads for about `seconds` (each at least once); steps per second."""
    counts = [0] * threads
    start = time.perf_counter()

    def work(i: int) -> None:
        while True:
            step()
            counts[i] += 1
            if time.perf_counter() - start >= seconds:
                return

    if threads == 1:
        work(0)
    else:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(work, range(threads)))
    return sum(counts) / (time.perf_counter() - start)


class Meter:
    """A raw limit set up once; window(seconds) measures it for that long, in bytes/s; close() frees it."""

    size_bytes: int
    threads: int = 1

    def window(self, seconds: float) -> float:
        return steps_per_s(self._step, seconds, self.threads) * self.size_bytes

    def _step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _FileMeter(Meter):
    """A file in a temp dir under `directory`; piece i of the working set at offset i * size_bytes."""

    def __init__(self, size_bytes: int, directory: str | Path | None, working_set_bytes: int | None,
                 threads: int):
        self.size_bytes, self.threads = size_bytes, threads
        self.slots = _slots(size_bytes, working_set_bytes)
        self._turn = itertools.count()  # next() is atomic: the threads take distinct pieces
        self._fd = -1
        self._tmp = tempfile.TemporaryDirectory(prefix="kvtb-rawlimits-", dir=directory)
        self.path = os.path.join(self._tmp.name, "data.bin")

    def _next_offset(self) -> int:
        return next(self._turn) % self.slots * self.size_bytes

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._tmp.cleanup()


class PwriteFsync(_FileMeter):
    """os.pwrite of size_bytes, then os.fsync."""

    def __init__(self, size_bytes: int, directory: str | Path | None = None,
                 working_set_bytes: int | None = None, threads: int = 1):
        super().__init__(size_bytes, directory, working_set_bytes, threads)
        self._data = memoryview(payload(self.slots * size_bytes))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT, 0o600)

    def _step(self) -> None:
        base, size = self._next_offset(), self.size_bytes
        buf, written = self._data[base:base + size], 0
        while written < size:
            written += os.pwrite(self._fd, buf[written:], base + written)
        os.fsync(self._fd)


class PreadCached(_FileMeter):
    """os.preadv of size_bytes from a file in the page cache into its own place of a buffer."""

    def __init__(self, size_bytes: int, directory: str | Path | None = None,
                 working_set_bytes: int | None = None, threads: int = 1):
        super().__init__(size_bytes, directory, working_set_bytes, threads)
        Path(self.path).write_bytes(payload(self.slots * size_bytes).tobytes())
        self._view = memoryview(np.zeros(self.slots * size_bytes, dtype=np.uint8))  # zeros: faulted in
        self._fd = os.open(self.path, os.O_RDONLY)
        for _ in range(self.slots):  # the page cache holds the file
            self._step()

    def _step(self) -> None:
        base, size, done = self._next_offset(), self.size_bytes, 0
        while done < size:
            got = os.preadv(self._fd, [self._view[base + done:base + size]], base + done)
            if got == 0:
                raise OSError("short read")
            done += got


def _zmq_socket(ctx, kind: int, message_bytes: int):
    """A socket that lets go at once on close and queues about _IN_FLIGHT_BYTES at most."""
    import zmq

    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    hwm = max(2, _IN_FLIGHT_BYTES // message_bytes)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    return sock


class ZmqLoopback(Meter):
    """PUSH -> PULL over loopback tcp, multipart [header, payload] with copy=False, from a child process."""

    def __init__(self, message_bytes: int, working_set_bytes: int | None = None):
        import zmq

        self.size_bytes = message_bytes
        self._ctx = zmq.Context()
        self._pull = _zmq_socket(self._ctx, zmq.PULL, message_bytes)
        address = f"tcp://127.0.0.1:{self._pull.bind_to_random_port('tcp://127.0.0.1')}"
        self._child = subprocess.Popen(  # a fresh interpreter: no fork of a process with threads
            [sys.executable, "-m", "bench.rawlimits", address, str(message_bytes),
             str(working_set_bytes or 0)], stdin=subprocess.PIPE, text=True)

    def _sending(self, on: bool) -> None:
        self._child.stdin.write("g\n" if on else "s\n")
        self._child.stdin.flush()

    def window(self, seconds: float) -> float:
        import zmq

        pull = self._pull
        self._sending(True)
        try:
            if not pull.poll(_START_TIMEOUT_MS, zmq.POLLIN):
                raise RuntimeError("the raw ZeroMQ sender sent nothing within 60 s")
            pull.recv_multipart(copy=False)  # the first message: the sender is going, start the clock
            return steps_per_s(lambda: pull.recv_multipart(copy=False), seconds) * self.size_bytes
        finally:
            self._sending(False)
            while pull.poll(_QUIET_MS, zmq.POLLIN):  # drain what was sent before the pause
                pull.recv_multipart(copy=False)

    def close(self) -> None:
        if self._ctx is None:
            return
        with contextlib.suppress(OSError):
            self._child.stdin.close()  # the child's signal to exit
        try:
            self._child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._child.kill()
            self._child.wait()
        self._pull.close()
        self._ctx.term()
        self._ctx = None


def _sender_main(address: str, message_bytes: int, working_set_bytes: int | None) -> None:
    """The child: a PUSH socket connected to address that sends from a "g" line on stdin until the
    next line comes, pauses otherwise, and exits when stdin closes."""
    import zmq

    ctx = zmq.Context()
    push = _zmq_socket(ctx, zmq.PUSH, message_bytes)
    push.connect(address)
    slots = _slots(message_bytes, working_set_bytes)
    data = memoryview(payload(slots * message_bytes))
    turn = itertools.count()
    try:
        for line in iter(sys.stdin.readline, ""):
            while line.strip() == "g" and not select.select([sys.stdin], [], [], 0)[0]:
                if push.poll(50, zmq.POLLOUT):
                    base = next(turn) % slots * message_bytes
                    push.send_multipart([b"kvtb-raw", data[base:base + message_bytes]], copy=False)
    finally:
        push.close()
        ctx.term()


@contextlib.contextmanager
def path_meters(size_bytes: int, directory: str | Path | None,
                working_set_bytes: int | None = None) -> Iterator[dict[str, Meter]]:
    """The limits a KV value crosses at one size, on one thread each: zmq_tcp, pwrite_fsync, pread_cached."""
    ws = working_set_bytes
    with contextlib.ExitStack() as stack:
        yield {"zmq_tcp": stack.enter_context(ZmqLoopback(size_bytes, ws)),
               "pwrite_fsync": stack.enter_context(PwriteFsync(size_bytes, directory, ws)),
               "pread_cached": stack.enter_context(PreadCached(size_bytes, directory, ws))}


def put_get_limits(rates: dict[str, float]) -> dict[str, float]:
    """A value crosses ZeroMQ and the file: PUT min(zmq_tcp, pwrite_fsync), GET min(zmq_tcp, pread_cached)."""
    return {"put": min(rates["zmq_tcp"], rates["pwrite_fsync"]),
            "get": min(rates["zmq_tcp"], rates["pread_cached"])}


class Sampler:
    """A window of every meter each time it is called (before each round of a benchmark); best()
    keeps each meter's best window, as the benchmark keeps its best round."""

    def __init__(self, meters: dict[str, Meter], window_s: float):
        self.meters, self.window_s = meters, window_s
        self.samples: dict[str, list[float]] = {name: [] for name in meters}

    def __call__(self) -> None:
        for name, meter in self.meters.items():
            self.samples[name].append(meter.window(self.window_s))

    def best(self) -> dict[str, float]:
        return {name: max(rates) for name, rates in self.samples.items() if rates}


if __name__ == "__main__":
    _sender_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) or None)
