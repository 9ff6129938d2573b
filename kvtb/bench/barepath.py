"""The bare path: the work a KV PUT or GET cannot avoid, with no service around it.

A raw limit (`rawlimits`) measures one stage alone, with the whole machine to itself. A PUT
through the agent does all its stages at once, on the same cores: it gathers a chunk from
its strided ranges and checksums it, sends it over ZeroMQ tcp to another process, which
writes it, checksums it, starts its writeback and fdatasyncs each batch before it answers.
A GET has a process send a value from the page cache, and the receiver scatter it into
strided ranges while it checksums it. The bare path does exactly that work, with the agent's
own gather and scatter (`hostmem.dma`) and the storage node's own write
(`storage_node.namespace`), and with nothing else: no capsules, no engine,
no queue pairs, no journal, no threads of its own. It answers: how fast does a minimal
implementation of the path's work go on this machine, sharing its cores as the path does?
Against the raw limits it shows what the machine gives; against it, the path shows what the
services' own per-chunk work costs. It is not a ceiling: each side works on one thread, so a
path that overlaps stages (the storage node writes while it syncs) can pass it.

Both meters move `working_set_bytes` of distinct chunks per round (a benchmark passes its
own round's bytes), laid out as the agent benchmark lays them out (`chunk_layout`). A window
runs whole rounds, at least one, and its rate is the bytes of those rounds over the time from
the first send to the last acknowledgement.

The other process is a fresh interpreter (`python -m kvtb.bench.barepath put|get ...`); it
exits when its stdin closes.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from kvtb import crc32c as _crc
from kvtb.bench.chunk_layout import RANGES_PER_CHUNK, strided_ranges
from kvtb.bench.rawlimits import Meter, _payload, _slots, _timed_loop, _zmq_socket
from hostmem import dma, gather
from storage_node.allocator import Extent
from storage_node.namespace import write_extents

_SLOT = struct.Struct("<Q")
_REPLY_TIMEOUT_MS = 60_000


def _rows(chunk_bytes: int, chunks: int, ranges_per_chunk: int) -> list[list[gather.Run]]:
    """Each chunk's copy plan, in the transfer benchmarks' layout (ValueError if it cannot split)."""
    return [gather.runs_of(strided_ranges(0, i, chunks, chunk_bytes, ranges_per_chunk))
            for i in range(chunks)]


def _expect(sock, timeout_ms: int = _REPLY_TIMEOUT_MS) -> None:
    import zmq

    if not sock.poll(timeout_ms, zmq.POLLIN):
        raise RuntimeError("the bare path's other process did not answer within 60 s")


class _Peer:
    """The other process and the two sockets to it: `out` (PUSH, ours) and `back` (PULL, ours)."""

    def __init__(self, role: str, size_bytes: int, working_set_bytes: int, directory: str):
        import zmq

        self._ctx = zmq.Context()
        self._child = None
        try:
            self.out = _zmq_socket(self._ctx, zmq.PUSH, size_bytes)
            self.back = _zmq_socket(self._ctx, zmq.PULL, size_bytes)
            out = self.out.bind_to_random_port("tcp://127.0.0.1")
            back = self.back.bind_to_random_port("tcp://127.0.0.1")
            self._child = subprocess.Popen(
                [sys.executable, "-m", "kvtb.bench.barepath", role, f"tcp://127.0.0.1:{out}",
                 f"tcp://127.0.0.1:{back}", str(size_bytes), str(working_set_bytes), directory],
                stdin=subprocess.PIPE)
            self._await_ready()
        except BaseException:
            self.close()
            raise

    def _await_ready(self) -> None:
        """Until the child says it is set up (its file written, for a GET cached); RuntimeError if
        it exits first or says nothing within 60 s."""
        import zmq

        deadline = time.monotonic() + _REPLY_TIMEOUT_MS / 1000
        while not self.back.poll(100, zmq.POLLIN):
            if self._child.poll() is not None:
                raise RuntimeError(f"the bare path's process exited with {self._child.returncode}")
            if time.monotonic() > deadline:
                raise RuntimeError("the bare path's process was not ready within 60 s")
        self.back.recv()

    def close(self) -> None:
        if self._ctx is None:
            return
        if self._child is not None:
            with contextlib.suppress(OSError):
                self._child.stdin.close()
            try:
                self._child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._child.kill()
                self._child.wait()
            self._child = None
        self._ctx.destroy(linger=0)  # closes whichever sockets were made
        self._ctx = None


class _BareMeter(Meter):
    """What both bare meters share: the chunks' copy plans, the other process, whole rounds."""

    role = ""

    def __init__(self, size_bytes: int, working_set_bytes: int | None, ranges_per_chunk: int):
        self.size_bytes = size_bytes
        self.chunks = _slots(size_bytes, working_set_bytes)
        self._plans = _rows(size_bytes, self.chunks, ranges_per_chunk)

    def _start_peer(self, directory: str | Path | None) -> None:
        """The other process, working in a temp dir under directory (removed if it cannot start)."""
        self._tmp = tempfile.TemporaryDirectory(prefix="kvtb-bare-", dir=directory)
        try:
            self._peer = _Peer(self.role, self.size_bytes, self.chunks * self.size_bytes, self._tmp.name)
        except BaseException:
            self._tmp.cleanup()
            raise

    def _round(self) -> None:
        raise NotImplementedError

    def window(self, seconds: float) -> float:
        """Whole rounds for about `seconds` (at least one); bytes per second."""
        round_bytes = self.chunks * self.size_bytes
        return _timed_loop(self._round, seconds, self.cpu, round_bytes) * round_bytes

    def close(self) -> None:
        self._peer.close()
        self._tmp.cleanup()


class BarePut(_BareMeter):
    """Gather + crc32c here, ZeroMQ tcp, then pwrite + crc32c + writeback and one fdatasync per
    batch received in another process, which acknowledges each batch once it is durable."""

    role = "put"

    def __init__(self, size_bytes: int, directory: str | Path | None, working_set_bytes: int | None = None,
                 ranges_per_chunk: int = RANGES_PER_CHUNK):
        super().__init__(size_bytes, working_set_bytes, ranges_per_chunk)
        self._region = _payload(self.chunks * size_bytes)
        self._start_peer(directory)

    def _round(self) -> None:
        out, back = self._peer.out, self._peer.back
        for i, plan in enumerate(self._plans):
            payload, _ = dma.frames(self._region, plan)
            out.send_multipart([_SLOT.pack(i), *payload], copy=False)
        durable = 0
        while durable < self.chunks:
            _expect(back)
            durable += _SLOT.unpack(back.recv())[0]


class BareGet(_BareMeter):
    """Another process sends every chunk from its page-cached file's mapping over ZeroMQ tcp; here
    each is scattered into its strided rows and checksummed as it is copied, and the crc32c
    compared with the chunk's."""

    role = "get"

    def __init__(self, size_bytes: int, directory: str | Path | None, working_set_bytes: int | None = None,
                 ranges_per_chunk: int = RANGES_PER_CHUNK):
        super().__init__(size_bytes, working_set_bytes, ranges_per_chunk)
        payload = _payload(self.chunks * size_bytes)  # what the other process's file holds
        self._crcs = [_crc.crc32c(payload[i * size_bytes:(i + 1) * size_bytes]) for i in range(self.chunks)]
        self._region = np.zeros_like(payload)  # touched: no first-touch faults timed
        del payload
        self._start_peer(directory)

    def _round(self) -> None:
        out, back = self._peer.out, self._peer.back
        out.send(b"round")
        for _ in range(self.chunks):
            _expect(back)
            slot, value = back.recv_multipart(copy=False)
            i = _SLOT.unpack(slot.bytes)[0]
            _, crc = dma.scatter(value.buffer, self._region, self._plans[i])
            if crc != self._crcs[i]:
                raise RuntimeError(f"bare GET: chunk {i} arrived with another crc32c")


@contextlib.contextmanager
def meters(size_bytes: int, directory: str | Path | None, working_set_bytes: int | None = None,
           ranges_per_chunk: int = RANGES_PER_CHUNK) -> Iterator[dict[str, Meter]]:
    """The bare PUT and GET paths at one chunk size, as meters named bare_put and bare_get."""
    with contextlib.ExitStack() as stack:
        yield {"bare_put": stack.enter_context(BarePut(size_bytes, directory, working_set_bytes,
                                                       ranges_per_chunk)),
               "bare_get": stack.enter_context(BareGet(size_bytes, directory, working_set_bytes,
                                                       ranges_per_chunk))}


# -- the other process ---------------------------------------------------------------------------

def _watch_stdin(stop) -> None:
    def wait() -> None:
        sys.stdin.read()
        stop()

    threading.Thread(target=wait, daemon=True).start()


def _put_sink(pull, ack, size_bytes: int, working_set_bytes: int, directory: str) -> None:
    """Write each chunk at its slot as the storage node writes a value (its crc32c folded into the
    write, then its writeback started); fdatasync every batch that arrived together, then
    acknowledge the batch's count."""
    import zmq

    fd = os.open(os.path.join(directory, "put.bin"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        while True:
            if not pull.poll(200, zmq.POLLIN):
                continue
            batch = [pull.recv_multipart(copy=False)]
            while pull.poll(0, zmq.POLLIN):
                batch.append(pull.recv_multipart(copy=False))
            for slot, *payload in batch:
                extents = [Extent(_SLOT.unpack(slot.bytes)[0] * size_bytes, size_bytes)]
                # the crc the node checks, and its writeback as the node starts it
                write_extents(fd, [f.buffer for f in payload], extents, 0, writeback=True)
            os.fdatasync(fd)
            ack.send(_SLOT.pack(len(batch)))
    finally:
        os.close(fd)


def _get_source(pull, push, size_bytes: int, working_set_bytes: int, directory: str) -> None:
    """Write the chunks' file (so it is in the page cache), say ready, then for each request send
    every chunk from the file's mapping (no copy here)."""
    import zmq

    path = os.path.join(directory, "get.bin")
    Path(path).write_bytes(_payload(working_set_bytes).tobytes())
    fd = os.open(path, os.O_RDONLY)
    data = np.frombuffer(mmap.mmap(fd, working_set_bytes, prot=mmap.PROT_READ), np.uint8)
    push.send(b"ready")
    chunks = working_set_bytes // size_bytes
    while True:
        if not pull.poll(200, zmq.POLLIN):
            continue
        pull.recv()
        for i in range(chunks):
            push.send_multipart([_SLOT.pack(i), data[i * size_bytes:(i + 1) * size_bytes]], copy=False)


def _child_main(argv: list[str]) -> None:
    """`python -m kvtb.bench.barepath put|get IN_ADDRESS OUT_ADDRESS SIZE WORKING_SET DIRECTORY`."""
    import zmq

    role, in_address, out_address = argv[0], argv[1], argv[2]
    size_bytes, working_set_bytes, directory = int(argv[3]), int(argv[4]), argv[5]
    ctx = zmq.Context()
    pull = _zmq_socket(ctx, zmq.PULL, size_bytes)
    push = _zmq_socket(ctx, zmq.PUSH, size_bytes)
    pull.connect(in_address)
    push.connect(out_address)
    _watch_stdin(lambda: os._exit(0))  # the parent closed our stdin: it is done with us
    if role == "put":
        push.send(b"ready")
        _put_sink(pull, push, size_bytes, working_set_bytes, directory)
    else:
        _get_source(pull, push, size_bytes, working_set_bytes, directory)


if __name__ == "__main__":
    _child_main(sys.argv[1:])
