"""A GET's value placed as it arrives, whole or in data PDUs, or range by range layer group by layer group,
and checked by its MACs (or, with the KV MAC off, its crc32c) before it counts (pure: numpy only, no sockets).

Every test runs with both landings: the compiled one (hostmem/_lander.c: KV copied and MAC-fed in C) and
Python's (hostmem.dma's numpy engine)."""
from __future__ import annotations

import numpy as np
import pytest

from fabric import chunk_format as cf
from hostmem import dma, gather
from kvtb.crc32c import crc32c
from smartnic.datapath import ChunkRef, stored_block
from smartnic.landing import Landing

REF = ChunkRef("alice", "ctx", 3, 48, 64)
NAME = b"n" * 16
IDS = np.arange(48, 64, dtype=np.uint32).tobytes()
PARTS = 4
KV = np.random.default_rng(5).integers(0, 256, 6000, dtype=np.uint8).tobytes()  # 4 parts of 1500 bytes
# the region: token ids at 0, then KV as 12 rows of 500 bytes every 700 bytes
TARGETS = gather.runs_of([(0, len(IDS))] + [(1000 + i * 700, 500) for i in range(12)])
MAC_KEY, KEY, GENERATION = bytes(range(32)), b"k" * 16, 1_700_000_000_000_000_042
GROUPS = [(0, 1), (1, 3), (3, 4)]  # KV parts by layer group
ENGINES = ["numpy", pytest.param("compiled", marks=pytest.mark.skipif(
    dma.ENGINE != "compiled" or dma._lander is None, reason="hostmem._dma or hostmem._lander was not built"))]


@pytest.fixture(autouse=True, params=ENGINES)
def engine(request, monkeypatch):
    """The landing under test: hostmem.dma's engine decides whether KV lands in C or from Python."""
    monkeypatch.setattr(dma, "ENGINE", request.param)
    return request.param


def header(mac: bool = True, ref: ChunkRef = REF, generation: int = GENERATION) -> cf.ChunkHeader:
    return cf.ChunkHeader(*ref, len(KV), NAME, generation, cf.MAC_BYTES if mac else 0, "acme", b"p" * 16,
                          kv_parts=PARTS)


def value(mac: bool = True, ref: ChunkRef = REF, generation: int = GENERATION, key: bytes = KEY) -> bytes:
    """header | token ids | MACs | KV, as the agent's PUT writes it (no MACs with the KV MAC off)."""
    return b"".join(bytes(b) for b in cf.sealed(MAC_KEY if mac else None, key, header(mac, ref, generation),
                                                [IDS], [KV]))


def landing(mem: np.ndarray, stored: bytes, mac: bool = True, groups=None, length: int | None = None):
    """The GET of the chunk the requester knows (KEY, GENERATION, the length and crc32c of `stored`):
    (landing, reports)."""
    chunk = stored_block(header(), "s0", KEY, length or len(stored), crc32c(stored),
                         len(cf.encode_header(header())))
    reports = []
    a = Landing(chunk, mem, TARGETS, MAC_KEY if mac else None, groups,
                lambda g, err: reports.append((g, err and err.kind)), lambda err: reports.append(("end", err and err.kind)))
    return a, reports


def placed(mem: np.ndarray) -> bytes:
    rows = (mem[1000 + i * 700:1500 + i * 700].tobytes() for i in range(12))
    return mem[:len(IDS)].tobytes() + b"".join(rows)


def whole(stored: bytes, mac: bool = True, pieces=None, mem=None, written=None):
    """A whole-value GET of what was written (default: `stored`) fed `stored` (in pieces of the given
    size) and ended: (reports, region)."""
    mem = np.zeros(10_000, np.uint8) if mem is None else mem
    a, reports = landing(mem, written or stored, mac)
    step = pieces or len(stored)
    for offset in range(0, len(stored), step):
        a.take(0, offset, [stored[offset:offset + step]])
    a.end_range(0)
    return reports, mem


def test_the_value_layout_puts_the_head_first():
    stored = value()
    h, n = cf.decode_header(stored)
    L = cf.value_layout(h, n)
    assert (L.macs_offset, L.kv_offset, L.length) == (n + len(IDS), n + len(IDS) + 5 * 32, len(stored))
    assert stored[L.ids_offset:L.macs_offset] == IDS and stored[L.kv_offset:] == KV
    assert L.parts_range(1, 3) == (L.kv_offset + 1500, 3000) and L.part_of(L.kv_offset + 1499) == 0
    assert cf.check_value(MAC_KEY, KEY, stored)[0] == h
    for at in (10, n + 3, L.macs_offset + 40, len(stored) - 1):  # header, token ids, a MAC, the last KV byte
        flipped = bytearray(stored)
        flipped[at] ^= 1
        with pytest.raises(cf.ChunkFormatError):
            cf.check_value(MAC_KEY, KEY, bytes(flipped))


@pytest.mark.parametrize("mac", [True, False])
@pytest.mark.parametrize("pdu", [None, 4096, 200, 700, 333])
def test_a_value_in_pieces_lands_in_its_ranges_and_checks_out(pdu, mac, engine):
    stored = value(mac)
    mem, a_reports = np.zeros(10_000, np.uint8), None
    a, a_reports = landing(mem, stored, mac)
    step = pdu or len(stored)
    for offset in range(0, len(stored), step):
        piece = stored[offset:offset + step]
        a.take(0, offset, [piece[:7], piece[7:]])  # a piece may come as several frames
    a.end_range(0)
    assert a_reports == [(0, None), ("end", None)] and a.placed_bytes == len(IDS) + len(KV)
    assert (a.lander is not None) == (mac and engine == "compiled")  # the MACs checked in C, or from Python
    assert placed(mem) == IDS + KV
    assert not mem[len(IDS):1000].any()  # the MACs went nowhere near the region


def test_a_piece_out_of_order_ends_the_get_and_nothing_more_is_written():
    mem, stored = np.zeros(10_000, np.uint8), value()
    a, reports = landing(mem, stored)
    a.take(0, 0, [stored[:4096]])
    a.take(0, 5000, [stored[5000:]])
    a.take(0, 4096, [stored[4096:5000]])  # too late: the GET already failed
    a.end_range(0)
    assert reports == [(0, "length_mismatch"), ("end", "length_mismatch")]
    assert not mem[1000 + 11 * 700:].any()


@pytest.mark.parametrize("mac, kind", [(True, "mac_mismatch"), (False, "crc_mismatch")])
def test_a_short_value_or_a_flipped_byte_fails(mac, kind):
    stored = value(mac)
    mem = np.zeros(10_000, np.uint8)
    a, reports = landing(mem, stored, mac)
    a.take(0, 0, [stored[:-1]])
    a.end_range(0)
    assert reports[0] == (0, "length_mismatch")
    _, n = cf.decode_header(stored)
    for at in (-1, len(stored) // 2, n + 5) + ((n + len(IDS) + 40,) if mac else ()):  # KV, token ids, a MAC
        flipped = bytearray(stored)
        flipped[at] ^= 1
        assert whole(bytes(flipped), mac, written=stored)[0][0] == (0, kind)


def test_a_forged_moved_or_unauthenticated_chunk_fails_its_mac():
    forged = bytearray(value())
    forged[-len(KV):] = bytes(255 - b for b in KV)  # whoever lacks the key keeps the old MACs
    moved = value(key=b"m" * 16)  # a real chunk, MACed for another storage key
    for stored in (bytes(forged), moved):
        assert whole(stored)[0][0] == (0, "mac_mismatch")
    bare = value(mac=False)  # written with the KV MAC off: refused before any byte lands
    reports, mem = whole(bare)
    assert reports[0] == (0, "mac_mismatch") and not mem.any()


def test_an_older_generation_is_refused_before_any_byte_lands():
    reports, mem = whole(value(generation=GENERATION - 1))  # a real chunk of this key, MACed, replaced since
    assert reports[0] == (0, "stale_generation") and not mem.any()


def test_a_newer_generation_is_refused_as_stored_again_before_any_byte_lands():
    reports, mem = whole(value(generation=GENERATION + 1))  # another replica stored the same name since
    assert reports[0] == (0, "newer_generation") and not mem.any()


def test_a_header_naming_another_chunk_or_cut_short_is_refused_before_any_byte_lands():
    other = value(ref=ChunkRef("mallory", "ctx", 3, 48, 64))
    for first_piece, stored in ((other, other), (value()[:40], value())):
        mem = np.zeros(10_000, np.uint8)
        a, reports = landing(mem, stored)
        a.take(0, 0, [first_piece])
        assert reports[0] == (0, "bad_header") and not mem.any()


def ranges(a: Landing) -> list[tuple[int, int]]:
    return [a.range(g) for g in range(len(GROUPS))]


def test_layer_groups_land_range_by_range_and_each_is_reported_once_it_checks_out():
    stored = value()
    mem = np.zeros(10_000, np.uint8)
    a, reports = landing(mem, stored, groups=GROUPS)
    (o0, n0), (o1, n1), (o2, n2) = ranges(a)
    h, hn = cf.decode_header(stored)
    kv = cf.value_layout(h, hn).kv_offset
    assert (o0, o1, o2, n1, n2) == (0, kv + 1500, kv + 4500, 3000, 1500) and n0 == kv + 1500
    a.take(2, o2, [stored[o2:o2 + 700]])
    a.take(2, o2 + 700, [stored[o2 + 700:o2 + n2]])
    assert reports == []  # group 2 arrived, but its MAC can only be checked with the head
    a.take(0, 0, [stored[:n0]])
    assert reports == [(0, None), (2, None)]  # the head checked out: group 0, then group 2 waiting for it
    a.take(1, o1, [stored[o1:o1 + n1]])
    assert reports == [(0, None), (2, None), (1, None), ("end", None)]
    assert placed(mem) == IDS + KV


@pytest.mark.parametrize("where", ["head", "group 1", "missing"])
def test_a_group_that_fails_fails_the_block_and_every_group_not_reported_yet(where):
    stored = bytearray(value())
    mem = np.zeros(10_000, np.uint8)
    a, reports = landing(mem, bytes(stored), groups=GROUPS)
    (o0, n0), (o1, n1), (o2, n2) = ranges(a)
    if where == "head":
        stored[o0 + n0 - 1600] ^= 1  # a token id byte... or a MAC: either fails the head
    elif where == "group 1":
        stored[o1 + 10] ^= 1
    a.take(0, 0, [bytes(stored[:n0])])
    if where == "missing":
        a.end_range(1, None)  # the range command ended without sending group 1's bytes
    else:
        a.take(1, o1, [bytes(stored[o1:o1 + n1])])
    a.take(2, o2, [bytes(stored[o2:o2 + n2])])  # nothing more is written once the block failed
    groups = [g for g, _ in reports if g != "end"]
    assert sorted(groups) == [0, 1, 2] and reports[-1][0] == "end"
    kinds = dict(r for r in reports if r[0] != "end")
    if where == "head":
        assert set(kinds.values()) == {"mac_mismatch"}
    else:
        assert kinds[0] is None and kinds[1] == kinds[2] == ("mac_mismatch" if where == "group 1" else "length_mismatch")
        assert not mem[1000 + 9 * 700:].any()  # group 2's bytes (the last 3 rows) never landed


def test_a_record_that_cannot_describe_the_value_is_not_asked_for():
    stored = value()
    a, _ = landing(np.zeros(10_000, np.uint8), stored, groups=GROUPS, length=len(stored) + 1)
    assert not a.usable


def test_a_header_of_another_kv_dtype_is_refused_before_any_byte_lands():
    mem = np.zeros(10_000, np.uint8)
    chunk = stored_block(header(), "s0", KEY, len(value()), crc32c(value()), len(cf.encode_header(header())))
    reports = []
    a = Landing(chunk, mem, TARGETS, MAC_KEY, None, lambda g, err: reports.append((g, err and err.kind)),
                kv_dtype="bfloat16")  # the pool's; the value says float32
    a.take(0, 0, [value()])
    assert reports[0] == (0, "dtype_mismatch") and not mem.any()
    reports.clear()
    same = Landing(chunk, mem, TARGETS, MAC_KEY, None, lambda g, err: reports.append((g, err and err.kind)),
                   kv_dtype="float32")
    same.take(0, 0, [value()])
    same.end_range(0)
    assert reports == [(0, None)] and placed(mem) == IDS + KV
