"""This machine's raw limits, measured now: memcpy, pwrite+fsync, page-cache pread, ZeroMQ tcp/ipc.

Each function runs for about `budget_s` seconds (at least one full iteration) and returns bytes
per second, so a benchmark can put its own throughput beside the machine's in the same run.
With `windows` > 1 the budget is cut into that many windows and the best window's rate is
returned: a benchmark that keeps the best of N rounds of its own compares it with the best of N
windows of the machine's, not with an average that includes the machine's stalls.

A benchmark with rounds of its own takes the limits as meters instead (`path_meters`): set up
once, each measures one window when asked, so the benchmark can measure a window of every limit
before each of its rounds. Limit and transfer then see the same moments of a shared machine,
whose speed drifts over seconds, rather than the limits one stretch and the transfers another.

`working_set_bytes`: the disk and ZeroMQ limits move `size_bytes` at a time through that many
distinct bytes (distinct buffers, distinct file offsets), cycling. A benchmark that moves 128 MiB
of distinct KV passes 128 MiB, so its limit streams from memory as it does; with the default
(one buffer of `size_bytes`) the same cache-resident bytes go over and over, and a rewrite of one
file range after fsync costs the disk less than new data: upper bounds that no data path
moving new bytes reaches.

ZeroMQ is measured in two shapes. `processes=2` (what `path_meters` calls zmq_tcp): the sender
in a child process with its own context, as between the agent and a storage node, which are two
processes. `processes=1`: both sockets in this process on one context, whose single I/O thread
moves the bytes out of one socket and into the other; the path never runs that way, so it is
reported for reference only.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from kvtb.bench import cpu_use

logger = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 1.0
_SEND_POLL_MS = 50
_IN_FLIGHT_BYTES = 64 << 20  # ZeroMQ queues at most this much per socket, so a pause drains fast
_QUIET_MS = 100              # a pause has drained once nothing arrived for this long
_START_TIMEOUT_MS = 60_000


def _timed_loop(step, seconds: float, tally: cpu_use.CpuTally | None = None,
                bytes_per_step: int = 0) -> float:
    """Run step() for about `seconds` (at least once); steps per second. With tally, the
    machine's busy CPU over the loop is added to it, with bytes_per_step per step."""
    iterations = 0
    window = cpu_use.Window() if tally is not None else None
    start = time.perf_counter()
    while True:
        step()
        iterations += 1
        elapsed_s = time.perf_counter() - start
        if elapsed_s >= seconds:
            if window is not None:
                tally.close(window, iterations * bytes_per_step)
            return iterations / elapsed_s


def _payload(size_bytes: int) -> np.ndarray:
    # Random bytes: nothing on the path (filesystem, page cache) can compress or dedupe them.
    return np.random.default_rng(0).integers(0, 256, size_bytes, dtype=np.uint8)


def _slots(size_bytes: int, working_set_bytes: int | None) -> int:
    """How many distinct size_bytes pieces the working set holds (at least one)."""
    return max(1, (working_set_bytes or size_bytes) // size_bytes)


class Meter:
    """A raw limit set up once; window(seconds) measures one window of it, in bytes/s.

    Subclasses provide _step (one transfer of size_bytes) or override window. close() frees
    what the setup took (files, sockets, a child process); meters are context managers.
    """

    size_bytes: int

    @functools.cached_property
    def cpu(self) -> cpu_use.CpuTally:
        """The machine's busy CPU over this meter's windows so far, and the bytes they moved."""
        return cpu_use.CpuTally()

    def window(self, seconds: float) -> float:
        return _timed_loop(self._step, seconds, self.cpu, self.size_bytes) * self.size_bytes

    def best(self, budget_s: float, windows: int = 1) -> float:
        """The best of `windows` windows sharing budget_s."""
        return max(self.window(budget_s / max(1, windows)) for _ in range(max(1, windows)))

    def _step(self) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Memcpy(Meter):
    """Copy size_bytes between two preallocated buffers (numpy copyto)."""

    def __init__(self, size_bytes: int = 64 << 20):
        self.size_bytes = size_bytes
        self._src = _payload(size_bytes)
        self._dst = np.empty_like(self._src)
        np.copyto(self._dst, self._src)  # fault both buffers in before timing

    def _step(self) -> None:
        np.copyto(self._dst, self._src)


class PwriteFsync(Meter):
    """os.pwrite of size_bytes then os.fsync, in a temp dir under directory; piece i of the
    working set goes to file offset i * size_bytes, cycling."""

    def __init__(self, size_bytes: int = 16 << 20, directory: str | Path | None = None,
                 working_set_bytes: int | None = None):
        self.size_bytes = size_bytes
        self._slots = _slots(size_bytes, working_set_bytes)
        self._data = memoryview(_payload(self._slots * size_bytes))
        self._turn = itertools.count()
        self._tmp = tempfile.TemporaryDirectory(prefix="kvtb-rawlimits-", dir=directory)
        self._fd = os.open(os.path.join(self._tmp.name, "pwrite.bin"), os.O_WRONLY | os.O_CREAT, 0o600)

    def _step(self) -> None:
        size = self.size_bytes
        base = next(self._turn) % self._slots * size
        buf, written = self._data[base:base + size], 0
        while written < size:
            written += os.pwrite(self._fd, buf[written:], base + written)
        os.fsync(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._tmp.cleanup()


class PreadCached(Meter):
    """os.preadv of size_bytes from a file already in the page cache; piece i of the working set
    is read from file offset i * size_bytes into its own place of a buffer as large as the
    working set, cycling."""

    def __init__(self, size_bytes: int = 16 << 20, directory: str | Path | None = None,
                 working_set_bytes: int | None = None):
        self.size_bytes = size_bytes
        self._slots = _slots(size_bytes, working_set_bytes)
        self._turn = itertools.count()
        self._tmp = tempfile.TemporaryDirectory(prefix="kvtb-rawlimits-", dir=directory)
        path = os.path.join(self._tmp.name, "pread.bin")
        Path(path).write_bytes(_payload(self._slots * size_bytes).tobytes())
        self._view = memoryview(np.zeros(self._slots * size_bytes, dtype=np.uint8))  # zeros: faulted in
        self._fd = os.open(path, os.O_RDONLY)
        for _ in range(self._slots):  # make sure the page cache holds the file
            self._step()

    def _step(self) -> None:
        size = self.size_bytes
        base, done = next(self._turn) % self._slots * size, 0
        while done < size:
            got = os.preadv(self._fd, [self._view[base + done:base + size]], base + done)
            if got == 0:
                raise OSError("short read")
            done += got

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._tmp.cleanup()


def _zmq_socket(ctx, kind: int, message_bytes: int):
    """A socket that lets go at once on close and queues about _IN_FLIGHT_BYTES at most."""
    import zmq

    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    hwm = max(2, _IN_FLIGHT_BYTES // message_bytes)
    sock.setsockopt(zmq.SNDHWM, hwm)
    sock.setsockopt(zmq.RCVHWM, hwm)
    return sock


def _push_while(push, message_bytes: int, working_set_bytes: int | None,
                sending: threading.Event, stopped: threading.Event) -> None:
    """Send [header, payload] with copy=False, payloads the working set's pieces in turn, while
    `sending` is set; sleep while it is not; return once `stopped` is set."""
    import zmq

    slots = _slots(message_bytes, working_set_bytes)
    data = memoryview(_payload(slots * message_bytes))
    payloads = [data[i * message_bytes:(i + 1) * message_bytes] for i in range(slots)]
    turn = itertools.count()
    while not stopped.is_set():
        if not sending.wait(_SEND_POLL_MS / 1000):
            continue
        if push.poll(_SEND_POLL_MS, zmq.POLLOUT):
            push.send_multipart([b"kvtb-raw", payloads[next(turn) % slots]], copy=False)


def _sender_main(argv: list[str]) -> None:
    """Child process (`python -m kvtb.bench.rawlimits ADDRESS MESSAGE_BYTES WORKING_SET_BYTES`):
    a PUSH socket connected to ADDRESS. It sends after a "g" line on stdin, pauses after an "s"
    line, and exits when stdin closes."""
    import zmq

    address, message_bytes, working_set_bytes = argv[0], int(argv[1]), int(argv[2]) or None
    sending, stopped = threading.Event(), threading.Event()

    def commands() -> None:
        for line in sys.stdin:
            (sending.set if line.strip() == "g" else sending.clear)()
        stopped.set()

    threading.Thread(target=commands, daemon=True).start()
    ctx = zmq.Context()
    push = _zmq_socket(ctx, zmq.PUSH, message_bytes)
    push.connect(address)
    try:
        _push_while(push, message_bytes, working_set_bytes, sending, stopped)
    finally:
        push.close()
        ctx.term()


class ZmqLoopback(Meter):
    """PUSH->PULL over loopback tcp or ipc, multipart [header, payload] with copy=False.

    The sender runs only during a window: a paused sender takes no CPU from what is measured
    between windows. processes=2 puts it in a child process (see the module's docstring).
    """

    def __init__(self, transport: str = "tcp", message_bytes: int = 1 << 20,
                 working_set_bytes: int | None = None, processes: int = 1):
        import zmq

        if transport not in ("tcp", "ipc"):
            raise ValueError(f"unknown transport {transport!r} (tcp or ipc)")
        if processes not in (1, 2):
            raise ValueError(f"processes must be 1 or 2, not {processes}")
        self.size_bytes = message_bytes
        self._ctx = zmq.Context()
        self._tmp = tempfile.TemporaryDirectory(prefix="kvtb-zmq-") if transport == "ipc" else None
        self._pull = _zmq_socket(self._ctx, zmq.PULL, message_bytes)
        if transport == "tcp":
            address = f"tcp://127.0.0.1:{self._pull.bind_to_random_port('tcp://127.0.0.1')}"
        else:
            address = f"ipc://{self._tmp.name}/raw.sock"
            self._pull.bind(address)
        self._child = self._push = self._thread = None
        self._sending, self._stopped = threading.Event(), threading.Event()
        if processes == 2:  # a fresh interpreter: no fork of a process with threads
            self._child = subprocess.Popen(
                [sys.executable, "-m", "kvtb.bench.rawlimits", address, str(message_bytes),
                 str(working_set_bytes or 0)], stdin=subprocess.PIPE, text=True)
        else:
            self._push = _zmq_socket(self._ctx, zmq.PUSH, message_bytes)
            self._push.connect(address)
            self._thread = threading.Thread(
                target=_push_while, name="zmq-raw-sender", daemon=True,
                args=(self._push, message_bytes, working_set_bytes, self._sending, self._stopped))
            self._thread.start()

    def _send(self, on: bool) -> None:
        if self._child is not None:
            self._child.stdin.write("g\n" if on else "s\n")
            self._child.stdin.flush()
        elif on:
            self._sending.set()
        else:
            self._sending.clear()

    def window(self, seconds: float) -> float:
        import zmq

        pull = self._pull
        self._send(True)
        try:
            if not pull.poll(_START_TIMEOUT_MS, zmq.POLLIN):
                raise RuntimeError("the raw ZeroMQ sender sent nothing within 60 s")
            pull.recv_multipart(copy=False)  # the first message: the sender is going, start the clock
            return _timed_loop(lambda: pull.recv_multipart(copy=False), seconds, self.cpu,
                               self.size_bytes) * self.size_bytes
        finally:
            self._send(False)
            while pull.poll(_QUIET_MS, zmq.POLLIN):  # drain what was sent before the pause
                pull.recv_multipart(copy=False)

    def close(self) -> None:
        if self._ctx is None:
            return
        self._stopped.set()
        if self._child is not None:
            with contextlib.suppress(OSError):
                self._child.stdin.close()  # the child's signal to exit
            try:
                self._child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._push.close()
        self._pull.close()
        self._ctx.term()
        self._ctx = None
        if self._tmp is not None:
            self._tmp.cleanup()


def memcpy_bytes_per_s(size_bytes: int = 64 << 20, budget_s: float = DEFAULT_BUDGET_S) -> float:
    """Copy size_bytes between two preallocated buffers (numpy copyto), bytes copied per second."""
    with Memcpy(size_bytes) as meter:
        return meter.best(budget_s)


def pwrite_fsync_bytes_per_s(size_bytes: int = 16 << 20, budget_s: float = DEFAULT_BUDGET_S,
                             directory: str | Path | None = None,
                             working_set_bytes: int | None = None, windows: int = 1) -> float:
    """os.pwrite of size_bytes then os.fsync, repeated (see PwriteFsync); bytes/s."""
    with PwriteFsync(size_bytes, directory, working_set_bytes) as meter:
        return meter.best(budget_s, windows)


def pread_cached_bytes_per_s(size_bytes: int = 16 << 20, budget_s: float = DEFAULT_BUDGET_S,
                             directory: str | Path | None = None,
                             working_set_bytes: int | None = None, windows: int = 1) -> float:
    """os.preadv of size_bytes from a file in the page cache (see PreadCached); bytes/s."""
    with PreadCached(size_bytes, directory, working_set_bytes) as meter:
        return meter.best(budget_s, windows)


def zmq_bytes_per_s(transport: str = "tcp", message_bytes: int = 1 << 20,
                    budget_s: float = DEFAULT_BUDGET_S, working_set_bytes: int | None = None,
                    windows: int = 1, processes: int = 1) -> float:
    """PUSH->PULL over loopback (see ZmqLoopback); bytes/s."""
    with ZmqLoopback(transport, message_bytes, working_set_bytes, processes) as meter:
        return meter.best(budget_s, windows)


def measure_all(size_bytes: int = 16 << 20, message_bytes: int = 1 << 20,
                budget_s: float = DEFAULT_BUDGET_S, directory: str | Path | None = None) -> dict[str, float]:
    """Every raw limit in bytes/s, keyed memcpy, pwrite_fsync, pread_cached, zmq_tcp, zmq_ipc."""
    limits = {
        "memcpy": memcpy_bytes_per_s(size_bytes, budget_s),
        "pwrite_fsync": pwrite_fsync_bytes_per_s(size_bytes, budget_s, directory),
        "pread_cached": pread_cached_bytes_per_s(size_bytes, budget_s, directory),
        "zmq_tcp": zmq_bytes_per_s("tcp", message_bytes, budget_s),
        "zmq_ipc": zmq_bytes_per_s("ipc", message_bytes, budget_s),
    }
    logger.info("raw limits (GB/s): %s", {k: round(v / 1e9, 2) for k, v in limits.items()})
    return limits


@contextlib.contextmanager
def path_meters(size_bytes: int, directory: str | Path | None,
                working_set_bytes: int | None = None) -> Iterator[dict[str, Meter]]:
    """Meters of the limits a KV value crosses at one size: zmq_tcp (between two processes, as the
    agent and a storage node are), pwrite_fsync and pread_cached; and zmq_tcp_one_process, for
    reference."""
    ws = working_set_bytes
    with contextlib.ExitStack() as stack:
        yield {"zmq_tcp": stack.enter_context(ZmqLoopback("tcp", size_bytes, ws, processes=2)),
               "zmq_tcp_one_process": stack.enter_context(ZmqLoopback("tcp", size_bytes, ws)),
               "pread_cached": stack.enter_context(PreadCached(size_bytes, directory, ws)),
               "pwrite_fsync": stack.enter_context(PwriteFsync(size_bytes, directory, ws))}


class Sampler:
    """Windows of every meter, taken on request (before each round of a benchmark); best() keeps
    each meter's best window, as the benchmark keeps its best round."""

    def __init__(self, meters: dict[str, Meter], window_s: float):
        self.meters, self.window_s = meters, window_s
        self.samples: dict[str, list[float]] = {name: [] for name in meters}

    def __call__(self) -> None:
        for name, meter in self.meters.items():
            self.samples[name].append(meter.window(self.window_s))

    def best(self) -> dict[str, float]:
        return {name: max(rates) for name, rates in self.samples.items() if rates}

    def cpu(self) -> dict[str, dict]:
        """Each meter's busy CPU per MiB and busy cores: medians over its windows, and in the
        window best() keeps (`cpu_use.CpuTally.figures`)."""
        figures = {}
        for name, meter in self.meters.items():
            rates = self.samples[name]
            figures[name] = meter.cpu.figures(best=rates.index(max(rates)) if rates else None)
        return figures


if __name__ == "__main__":
    _sender_main(sys.argv[1:])
