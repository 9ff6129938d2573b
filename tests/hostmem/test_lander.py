"""The compiled landing (hostmem/_lander.c) against Python's: the vendored BLAKE3 gives the blake3 package's
digests; a block's KV placed in any pieces lands the same bytes and the same MACs; a flipped byte or a
wrong MAC is caught at the same part; bad calls are refused with nothing written. Then whole restores of
many blocks, pieces cut at random, through smartnic.landing with each engine: the same region, the same
reports (pure: numpy and the extension, no sockets)."""
from __future__ import annotations

import numpy as np
import pytest

from fabric import chunk_format as cf
from hostmem import dma, gather
from kvtb.crc32c import crc32c
from smartnic.datapath import ChunkRef, stored_block
from smartnic.landing import Landing

pytestmark = pytest.mark.skipif(dma._lander is None, reason="hostmem._lander was not built (no C compiler)")

MAC_KEY, KEY, GENERATION = bytes(range(32)), b"k" * 16, 1_700_000_000_000_000_042
PARTS, PART_BYTES, IDS_BYTES = 6, 3_000, 64
# a block's targets: token ids at 0, then its KV as rows of 1,000 bytes every 1,500 bytes
TARGETS = gather.runs_of([(0, IDS_BYTES)] + [(4_096 + i * 1_500, 1_000) for i in range(PARTS * 3)])
MEM_BYTES = 4_096 + PARTS * 3 * 1_500


def kv(seed: int = 3) -> bytes:
    return np.random.default_rng(seed).integers(0, 256, PARTS * PART_BYTES, dtype=np.uint8).tobytes()


def lander():
    return dma.lander(TARGETS, IDS_BYTES, PART_BYTES, PARTS, MAC_KEY, cf.mac_prefix(KEY, GENERATION), "compiled")


def python_macs(data: bytes) -> bytes:
    """Every part's MAC as fabric.chunk_format makes them with the blake3 package, at 32 bytes each."""
    out = b""
    for part in range(PARTS):
        h = cf.chunk_mac(MAC_KEY, KEY, GENERATION, part)
        h.update(data[part * PART_BYTES:(part + 1) * PART_BYTES])
        out += h.digest(cf.MAC_BYTES)
    return out


def placed(mem: np.ndarray) -> bytes:
    return b"".join(mem[4_096 + i * 1_500:5_096 + i * 1_500].tobytes() for i in range(PARTS * 3))


def cuts(n: int, seed: int) -> list[int]:
    rng = np.random.default_rng(seed)
    return sorted({0, n, *rng.integers(1, n, 7).tolist()})


@pytest.mark.parametrize("size", [0, 1, 63, 64, 1_024, 1_025, 70_000, 1 << 20])
def test_the_vendored_blake3_gives_the_blake3_packages_keyed_digest(size):
    import blake3

    from hostmem import _lander
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    assert _lander.keyed_digest(MAC_KEY, data) == blake3.blake3(data, key=MAC_KEY).digest()


@pytest.mark.parametrize("seed", range(6))
def test_kv_placed_in_any_pieces_lands_the_same_bytes_and_macs(seed):
    data, mem = kv(seed), np.zeros(MEM_BYTES, np.uint8)
    a = lander()
    points = cuts(len(data), seed)
    for start, end in zip(points, points[1:]):
        a.place(data[start:end], mem, start)
    assert placed(mem) == data and not mem[:4_096].any()  # the token ids' bytes are not its to write
    assert a.check(0, PARTS, python_macs(data), 0) == -1
    assert a.check(2, 4, b"\0" * cf.MAC_BYTES + python_macs(data), cf.MAC_BYTES) == -1  # a base, a subset
    assert [a.fed(p) for p in range(PARTS)] == [PART_BYTES] * PARTS


@pytest.mark.parametrize("at", [0, PART_BYTES - 1, 2 * PART_BYTES + 17, PARTS * PART_BYTES - 1])
def test_a_flipped_byte_or_a_wrong_mac_is_caught_at_its_part(at):
    data = kv()
    flipped = bytearray(data)
    flipped[at] ^= 1
    a, mem = lander(), np.zeros(MEM_BYTES, np.uint8)
    a.place(bytes(flipped), mem, 0)
    assert a.check(0, PARTS, python_macs(data), 0) == at // PART_BYTES
    assert a.check(0, at // PART_BYTES, python_macs(data), 0) == -1  # the parts before it check out
    wrong = bytearray(python_macs(data))
    wrong[5 * cf.MAC_BYTES + 31] ^= 0x80  # the last part's MAC, its last bit
    b = lander()
    b.place(data, np.zeros(MEM_BYTES, np.uint8), 0)
    assert b.check(0, PARTS, bytes(wrong), 0) == 5
    other = dma.lander(TARGETS, IDS_BYTES, PART_BYTES, PARTS, MAC_KEY, cf.mac_prefix(b"m" * 16, GENERATION),
                       "compiled")  # the same bytes MACed for another storage key
    other.place(data, np.zeros(MEM_BYTES, np.uint8), 0)
    assert other.check(0, PARTS, python_macs(data), 0) == 0


def test_bad_calls_are_refused_with_nothing_written():
    data, mem = kv(), np.zeros(MEM_BYTES, np.uint8)
    a = lander()
    a.place(data[:100], mem, 0)
    with pytest.raises(ValueError, match="out of order"):
        a.place(data[200:300], mem, 200)  # a gap in part 0
    with pytest.raises(ValueError, match="out of order"):
        a.place(data[PART_BYTES + 5:PART_BYTES + 9], mem, PART_BYTES + 5)  # part 1 from its 6th byte
    with pytest.raises(ValueError, match="KV bytes"):
        a.place(b"x", mem, PARTS * PART_BYTES)  # past the KV
    with pytest.raises(ValueError, match="KV bytes"):
        a.place(b"x", mem, -1)
    with pytest.raises(ValueError, match="reach byte"):
        a.place(data[100:200], np.zeros(MEM_BYTES - 501, np.uint8), 100)  # short of the last row's end
    with pytest.raises(ValueError, match="received 100"):
        a.check(0, 1, python_macs(data), 0)  # part 0 has not all its bytes
    with pytest.raises(ValueError, match="lie past"):
        a.check(0, PARTS, python_macs(data)[:-1], 0)
    assert placed(mem)[:100] == data[:100] and not any(placed(mem)[100:])
    assert a.fed(0) == 100 and a.fed(1) == 0
    with pytest.raises(TypeError):
        a.place(data[100:200], bytes(MEM_BYTES), 100)  # a read-only region
    for bad in [dict(parts=0), dict(parts=PARTS + 1), dict(part_bytes=0), dict(key=b"short"),
                dict(prefix=b"p" * 257), dict(kv_base=IDS_BYTES + 1)]:
        args = dict(targets=TARGETS, kv_base=IDS_BYTES, part_bytes=PART_BYTES, parts=PARTS, key=MAC_KEY,
                    prefix=b"p")
        args.update(bad)
        with pytest.raises(ValueError):
            dma.lander(engine="compiled", **args)


def test_the_numpy_engine_has_no_compiled_lander():
    assert dma.lander(TARGETS, IDS_BYTES, PART_BYTES, PARTS, MAC_KEY, b"p", "numpy") is None


# -- whole landings, each engine, side by side

REF = ChunkRef("alice", "ctx", 3, 0, 16)
IDS = np.arange(16, dtype=np.uint32).tobytes()
GROUPS = [(0, 2), (2, 5), (5, 6)]


def header(kv_bytes: int) -> cf.ChunkHeader:
    return cf.ChunkHeader(*REF, kv_bytes, b"n" * 16, GENERATION, cf.MAC_BYTES, "acme", b"p" * 16, kv_parts=PARTS)


def land(engine: str, stored: bytes, true: bytes, data_len: int, seed: int):
    """A grouped restore that receives `stored` where the requester recorded `true`, through Landing with
    `engine`, each group's range in random pieces: (reports, the region, the landing)."""
    h = header(data_len)
    chunk = stored_block(h, "s0", KEY, len(true), crc32c(true), len(cf.encode_header(h)))
    mem, reports = np.zeros(MEM_BYTES, np.uint8), []
    a = Landing(chunk, mem, TARGETS, MAC_KEY, GROUPS, lambda g, err: reports.append((g, err and err.kind)),
                lambda err: reports.append(("end", err and err.kind)), engine=engine)
    for group in (1, 0, 2):  # a later group may come first: it waits for the head
        offset, length = a.range(group)
        points = cuts(length, seed + group)
        for start, end in zip(points, points[1:]):
            a.take(group, offset + start, [stored[offset + start:offset + end]])
        a.end_range(group)
    return reports, mem, a


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("mutant", [None, "kv", "mac", "ids"])
def test_c_and_python_landings_agree_on_bytes_reports_and_failures(seed, mutant):
    data = kv(seed)
    true = b"".join(bytes(b) for b in cf.sealed(MAC_KEY, KEY, header(len(data)), [IDS], [data]))
    stored = bytearray(true)
    layout = cf.value_layout(header(len(data)), len(cf.encode_header(header(len(data)))))
    if mutant == "kv":
        stored[layout.kv_offset + 3 * PART_BYTES + seed * 11] ^= 1 << seed  # part 3 (group 1)
    elif mutant == "mac":
        stored[layout.macs_offset + (1 + 5) * cf.MAC_BYTES + seed] ^= 1  # part 5's MAC (group 2)
    elif mutant == "ids":
        stored[layout.ids_offset + seed] ^= 1  # the head's MAC fails: every group
    c_reports, c_mem, c = land("compiled", bytes(stored), true, len(data), seed)
    py_reports, py_mem, py = land("numpy", bytes(stored), true, len(data), seed)
    assert c.lander is not None and py.lander is None
    assert c_reports == py_reports
    assert c_mem.tobytes() == py_mem.tobytes()
    expected = {None: [(1, None), (0, None), (2, None), ("end", None)],
                "kv": [(0, None), (1, "mac_mismatch"), (2, "mac_mismatch"), ("end", "mac_mismatch")],
                "mac": [(1, None), (0, None), (2, "mac_mismatch"), ("end", "mac_mismatch")],
                "ids": [(0, "mac_mismatch"), (1, "mac_mismatch"), (2, "mac_mismatch"), ("end", "mac_mismatch")]}
    assert sorted(c_reports[:-1], key=str) == sorted(expected[mutant][:-1], key=str) and c_reports[-1] == expected[mutant][-1]
    if mutant is None:
        assert placed(c_mem) == data and c_mem[:len(IDS)].tobytes() == IDS
