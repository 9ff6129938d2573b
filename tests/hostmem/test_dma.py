"""The copy engine: both engines copy the same bytes and give the same crc32c; bad runs are refused."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from kvtb.crc32c import crc32c, extend
from hostmem import dma, gather
from hostmem.gather import Piece, Run

try:
    from hostmem import _dma
except ImportError:
    _dma = None

BUILT = _dma is not None and _dma.HARDWARE_CRC
ENGINES = ["numpy", pytest.param("compiled", marks=pytest.mark.skipif(
    not BUILT, reason="hostmem._dma was not built (no C compiler) or this CPU has no SSE4.2"))]
RNG = np.random.default_rng(11)
MEM = RNG.integers(0, 256, 2 << 20, dtype=np.uint8)


def concat(mem: np.ndarray, todo) -> bytes:
    return b"".join(mem[r.first + i * r.stride:r.first + i * r.stride + r.length].tobytes()
                    for r in todo for i in range(r.count))


def layouts():
    """Runs of every shape the data path makes: rows of a KV pool, a row cut at either end by a
    data PDU, lengths around the engine's 768-byte lanes and 16 KiB pieces, unaligned offsets."""
    yield [Run(0, 8192, 8192 * 4, 16)]
    yield [Run(5, 3, 3, 1), Run(4096, 1000, 1500, 7), Run(200_000, 1, 1, 1)]
    yield [Run(1, 767, 800, 3), Run(10_001, 768, 768, 2), Run(20_003, 769, 1000, 2)]
    yield [Run(64, (16 << 10) + 9, (32 << 10), 5)]
    yield [Run(333, 1 << 20, 1 << 20, 1)]
    for _ in range(10):  # random strided runs, one after another, never overlapping
        todo, pos = [], int(RNG.integers(0, 64))
        for _ in range(int(RNG.integers(1, 5))):
            length = int(RNG.integers(1, 20_000))
            stride = length + int(RNG.integers(0, 3000))
            count = int(RNG.integers(1, 8))
            todo.append(Run(pos, length, stride, count))
            pos += stride * count + int(RNG.integers(0, 100))
        yield todo


@pytest.mark.parametrize("engine", ENGINES)
def test_scatter_places_the_source_and_checksums_it(engine):
    for todo in layouts():
        source = RNG.integers(0, 256, sum(r.nbytes for r in todo), dtype=np.uint8).tobytes()
        mem = MEM.copy()
        nbytes, crc = dma.scatter(source, mem, todo, crc32c(b"head"), engine=engine)
        assert nbytes == len(source)
        assert crc == crc32c(b"head" + source)
        assert concat(mem, todo) == source
        written = np.zeros(mem.size, bool)
        for r in todo:
            for i in range(r.count):
                written[r.first + i * r.stride:r.first + i * r.stride + r.length] = True
        assert np.array_equal(mem[~written], MEM[~written]), "a byte outside the runs changed"


@pytest.mark.parametrize("engine", ENGINES)
def test_gather_joins_the_runs_and_checksums_them(engine):
    for todo in layouts():
        out, crc = dma.gather_piece(MEM, Piece(False, tuple(todo)), 7, engine=engine)
        assert out.tobytes() == concat(MEM, todo)
        assert crc == extend(7, out)


@pytest.mark.parametrize("engine", ENGINES)
def test_frames_match_the_numpy_plan(engine):
    todo = gather.runs_of([(7, 13)] + [(4096 + i * 9000, 8192) for i in range(5)] + [(100_000, 1 << 20)])
    bufs, crc = dma.frames(MEM, todo, 0, view_min_bytes=1 << 20, engine=engine)
    assert b"".join(bytes(memoryview(b)) for b in bufs) == concat(MEM, todo)
    assert crc == crc32c(concat(MEM, todo))
    assert np.shares_memory(bufs[-1], MEM) and not np.shares_memory(bufs[0], MEM)


@pytest.mark.parametrize("engine", ENGINES)
def test_a_mac_is_fed_every_byte_in_order_and_the_crc_may_be_left_out(engine, monkeypatch):
    monkeypatch.setattr(dma, "MAC_BLOCK_BYTES", 4096 + 7)  # blocks that cut rows anywhere
    for todo in layouts():
        data = concat(MEM, todo)
        mac = hashlib.blake2b()  # any hasher with update(); the data path passes keyed BLAKE3
        bufs, crc = dma.frames(MEM, todo, 0, view_min_bytes=1 << 20, engine=engine, mac=mac)
        assert b"".join(bytes(memoryview(b)) for b in bufs) == data and crc == crc32c(data)
        assert mac.digest() == hashlib.blake2b(data).digest()
        bufs, crc = dma.frames(MEM, todo, None, view_min_bytes=1 << 20, engine=engine, mac=hashlib.blake2b())
        assert crc is None and b"".join(bytes(memoryview(b)) for b in bufs) == data
        source = RNG.integers(0, 256, len(data), dtype=np.uint8).tobytes()
        mem, mac = MEM.copy(), hashlib.blake2b()
        assert dma.scatter(source, mem, todo, None, engine=engine, mac=mac) == (len(source), None)
        assert concat(mem, todo) == source and mac.digest() == hashlib.blake2b(source).digest()
        assert dma.scatter(source, mem, todo, 5, engine=engine, mac=hashlib.blake2b())[1] == extend(5, source)


@pytest.mark.parametrize("engine", ENGINES)
def test_bad_runs_are_refused_and_nothing_is_copied(engine):
    mem = np.zeros(1 << 16, np.uint8)
    cases = [
        ([Run(0, 100, 100, 2)], 100, "bytes"),                # source shorter than the runs
        ([Run(0, 100, 100, 2)], 300, "bytes"),                # and longer
        ([Run(mem.size - 50, 100, 100, 1)], 100, "past|span"),  # the last row leaves mem
        ([Run(0, 1000, 1000, 66)], 66_000, "past|span"),      # so does a later row of a run
    ]
    for todo, size, message in cases:
        with pytest.raises(ValueError, match=message):
            dma.scatter(bytes(range(256)) * (size // 256) + bytes(size % 256), mem, todo, engine=engine)
        assert not mem.any()


@pytest.mark.skipif(not BUILT, reason="hostmem._dma was not built")
def test_the_compiled_engine_refuses_malformed_runs_and_read_only_memory():
    mem = np.zeros(4096, np.uint8)
    for bad in [(0, 10, 5, 2), (-1, 10, 10, 1), (0, -1, 10, 1), (0, 10, 10, -1)]:
        with pytest.raises(ValueError, match="malformed"):
            _dma.scatter(b"x" * 20, mem, [bad])
    with pytest.raises(TypeError, match="run"):
        _dma.scatter(b"x" * 10, mem, [(0, 10, 10)])
    with pytest.raises((TypeError, BufferError)):
        _dma.scatter(b"x" * 10, b"\0" * 4096, [(0, 10, 10, 1)])
    assert _dma.scatter(b"", mem, []) == 0 and _dma.scatter(b"", mem, [(0, 0, 0, 5)], 9) == 9


def test_the_engine_is_chosen_from_the_environment():
    assert dma._choose("numpy") == "numpy"
    assert dma._choose(None) == ("compiled" if BUILT else "numpy")
    with pytest.raises(ValueError, match="KVTB_DMA"):
        dma._choose("gpu")
    if not BUILT:
        with pytest.raises(ValueError, match="not built"):
            dma._choose("compiled")
