"""This machine's raw limits, measured now: memcpy, pwrite+fsync, page-cache pread, ZeroMQ tcp/ipc.

Each function runs for about `budget_s` seconds (at least one full iteration) and returns bytes
per second, so a benchmark can put its own throughput beside the machine's in the same run.
With `windows` > 1 the budget is cut into that many windows and the best window's rate is
returned: a benchmark that keeps the best of N rounds of its own compares it with the best of N
windows of the machine's, not with an average that includes the machine's stalls.

`working_set_bytes`: the disk and ZeroMQ limits move `size_bytes` at a time through that many
distinct bytes (distinct buffers, distinct file offsets), cycling. A benchmark that moves 128 MiB
of distinct KV passes 128 MiB, so its limit streams from memory as it does; with the default
(one buffer of `size_bytes`) the same cache-resident bytes go over and over, and a rewrite of one
file range after fsync costs the disk less than new data: upper bounds that no data path
moving new bytes reaches.
"""
from __future__ import annotations

import itertools
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

logger = logging.getLogger(__name__)

DEFAULT_BUDGET_S = 1.0
_SEND_POLL_MS = 50


def _timed_loop(step, budget_s: float, windows: int = 1) -> float:
    """Run step() for budget_s cut into windows (each at least one step); the best window's steps/s."""
    best = 0.0
    for _ in range(max(1, windows)):
        iterations = 0
        start = time.perf_counter()
        while True:
            step()
            iterations += 1
            elapsed_s = time.perf_counter() - start
            if elapsed_s >= budget_s / max(1, windows):
                break
        best = max(best, iterations / elapsed_s)
    return best


def _payload(size_bytes: int) -> np.ndarray:
    # Random bytes: nothing on the path (filesystem, page cache) can compress or dedupe them.
    return np.random.default_rng(0).integers(0, 256, size_bytes, dtype=np.uint8)


def _slots(size_bytes: int, working_set_bytes: int | None) -> int:
    """How many distinct size_bytes pieces the working set holds (at least one)."""
    return max(1, (working_set_bytes or size_bytes) // size_bytes)


def memcpy_bytes_per_s(size_bytes: int = 64 << 20, budget_s: float = DEFAULT_BUDGET_S) -> float:
    """Copy size_bytes between two preallocated buffers (numpy copyto), bytes copied per second."""
    src = _payload(size_bytes)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault both buffers in before timing
    return _timed_loop(lambda: np.copyto(dst, src), budget_s) * size_bytes


def pwrite_fsync_bytes_per_s(size_bytes: int = 16 << 20, budget_s: float = DEFAULT_BUDGET_S,
                             directory: str | Path | None = None,
                             working_set_bytes: int | None = None, windows: int = 1) -> float:
    """os.pwrite of size_bytes then os.fsync, repeated, in a temp dir under directory; bytes/s.

    Piece i of the working set goes to file offset i * size_bytes, cycling.
    """
    slots = _slots(size_bytes, working_set_bytes)
    data = memoryview(_payload(slots * size_bytes))
    turn = itertools.count()
    with tempfile.TemporaryDirectory(prefix="kvtb-rawlimits-", dir=directory) as tmp:
        fd = os.open(os.path.join(tmp, "pwrite.bin"), os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            def step():
                base = next(turn) % slots * size_bytes
                buf, written = data[base:base + size_bytes], 0
                while written < size_bytes:
                    written += os.pwrite(fd, buf[written:], base + written)
                os.fsync(fd)

            rate = _timed_loop(step, budget_s, windows)
        finally:
            os.close(fd)
    return rate * size_bytes


def pread_cached_bytes_per_s(size_bytes: int = 16 << 20, budget_s: float = DEFAULT_BUDGET_S,
                             directory: str | Path | None = None,
                             working_set_bytes: int | None = None, windows: int = 1) -> float:
    """os.preadv of size_bytes from a file already in the page cache; bytes/s.

    Piece i of the working set is read from file offset i * size_bytes into its own place of a
    buffer as large as the working set, cycling.
    """
    slots = _slots(size_bytes, working_set_bytes)
    turn = itertools.count()
    with tempfile.TemporaryDirectory(prefix="kvtb-rawlimits-", dir=directory) as tmp:
        path = os.path.join(tmp, "pread.bin")
        Path(path).write_bytes(_payload(slots * size_bytes).tobytes())
        buf = np.zeros(slots * size_bytes, dtype=np.uint8)  # zeros: faulted in before timing
        view = memoryview(buf)
        fd = os.open(path, os.O_RDONLY)
        try:
            def step():
                base, done = next(turn) % slots * size_bytes, 0
                while done < size_bytes:
                    got = os.preadv(fd, [view[base + done:base + size_bytes]], base + done)
                    if got == 0:
                        raise OSError("short read")
                    done += got

            for _ in range(slots):  # make sure the page cache holds the file
                step()
            rate = _timed_loop(step, budget_s, windows)
        finally:
            os.close(fd)
    return rate * size_bytes


def zmq_bytes_per_s(transport: str = "tcp", message_bytes: int = 1 << 20,
                    budget_s: float = DEFAULT_BUDGET_S, working_set_bytes: int | None = None,
                    windows: int = 1) -> float:
    """PUSH->PULL over loopback tcp or ipc, multipart [header, payload] with copy=False; bytes/s.

    The payloads are the working set's pieces in turn.
    """
    import zmq

    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    push = ctx.socket(zmq.PUSH)
    for sock in (pull, push):
        sock.setsockopt(zmq.LINGER, 0)
    tmp = tempfile.TemporaryDirectory(prefix="kvtb-zmq-") if transport == "ipc" else None
    try:
        if transport == "tcp":
            port = pull.bind_to_random_port("tcp://127.0.0.1")
            push.connect(f"tcp://127.0.0.1:{port}")
        elif transport == "ipc":
            address = f"ipc://{tmp.name}/raw.sock"
            pull.bind(address)
            push.connect(address)
        else:
            raise ValueError(f"unknown transport {transport!r} (tcp or ipc)")
        stop = threading.Event()
        slots = _slots(message_bytes, working_set_bytes)
        data = memoryview(_payload(slots * message_bytes))
        payloads = [data[i * message_bytes:(i + 1) * message_bytes] for i in range(slots)]
        header = b"kvtb-raw"

        def send_until_stopped():
            for i in itertools.count():
                if stop.is_set():
                    return
                if push.poll(_SEND_POLL_MS, zmq.POLLOUT):
                    push.send_multipart([header, payloads[i % slots]], copy=False)

        sender = threading.Thread(target=send_until_stopped, name="zmq-raw-sender", daemon=True)
        sender.start()
        try:
            pull.recv_multipart(copy=False)  # first message: connection up, start the clock
            rate = _timed_loop(lambda: pull.recv_multipart(copy=False), budget_s, windows) * message_bytes
        finally:
            stop.set()
            sender.join(timeout=5)
        return rate
    finally:
        push.close()
        pull.close()
        ctx.term()
        if tmp is not None:
            tmp.cleanup()


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


def path_limits(size_bytes: int, budget_s: float, directory: str | Path | None,
                working_set_bytes: int | None = None, windows: int = 1) -> dict[str, float]:
    """The limits a KV value crosses (zmq_tcp, pwrite_fsync, pread_cached) at one size, in bytes/s."""
    ws = working_set_bytes
    return {"zmq_tcp": zmq_bytes_per_s("tcp", size_bytes, budget_s, ws, windows),
            "pread_cached": pread_cached_bytes_per_s(size_bytes, budget_s, directory, ws, windows),
            "pwrite_fsync": pwrite_fsync_bytes_per_s(size_bytes, budget_s, directory, ws, windows)}
