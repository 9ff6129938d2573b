"""A GET's value placed as it arrives, whole or in data PDUs, and checked by its MAC (or, with the KV MAC
off, its crc32c) before it counts (pure: numpy only, no sockets)."""
from __future__ import annotations

import numpy as np
import pytest

from kvtb.crc32c import crc32c
from fabric import chunk_format as cf
from hostmem import gather
from smartnic.datapath import Arrival, ChunkRef, DataError, stored_block

REF = ChunkRef("alice", "ctx", 3, 48, 64)
NAME = b"n" * 16
IDS = np.arange(48, 64, dtype=np.uint32).tobytes()
KV = np.random.default_rng(5).integers(0, 256, 6000, dtype=np.uint8).tobytes()
# the region: token ids at 0, then KV as 12 rows of 500 bytes every 700 bytes
TARGETS = gather.runs_of([(0, len(IDS))] + [(1000 + i * 700, 500) for i in range(12)])
MAC_KEY, KEY, GENERATION = bytes(range(32)), b"k" * 16, 1_700_000_000_000_000_042


def value(mac: bool = True, ref: ChunkRef = REF, generation: int = GENERATION, key: bytes = KEY) -> bytes:
    """header | token ids | KV | MAC, as the agent's PUT writes it (no MAC with the KV MAC off)."""
    header = cf.encode_header(cf.ChunkHeader(*ref, len(KV), NAME, generation, cf.MAC_BYTES if mac else 0,
                                             "acme", b"p" * 16))
    body = header + IDS + KV
    return body + (cf.mac_of(MAC_KEY, key, generation, [body]) if mac else b"")


def arrival(mem: np.ndarray, stored: bytes, mac: bool = True, length: int | None = None) -> Arrival:
    """The GET of the chunk the requester knows (KEY, GENERATION, the length it stored)."""
    header = cf.ChunkHeader(*REF, len(KV), NAME, GENERATION, cf.MAC_BYTES, "acme", b"p" * 16)
    chunk = stored_block(header, "s0", KEY, length or len(stored), crc32c(stored))
    return Arrival(chunk, mem, TARGETS, MAC_KEY if mac else None)


def placed(mem: np.ndarray) -> bytes:
    rows = (mem[1000 + i * 700:1500 + i * 700].tobytes() for i in range(12))
    return mem[:len(IDS)].tobytes() + b"".join(rows)


def fails(a: Arrival) -> str:
    with pytest.raises(DataError) as err:
        a.end()
    return err.value.kind


@pytest.mark.parametrize("mac", [True, False])
@pytest.mark.parametrize("pdu", [len(value()), 4096, 200, 700, len(value()) - 5])
def test_a_value_in_pieces_lands_in_its_ranges_and_checks_out(pdu, mac):
    mem, stored = np.zeros(10_000, np.uint8), value(mac)
    a = arrival(mem, stored, mac)
    for offset in range(0, len(stored), pdu):
        piece = stored[offset:offset + pdu]
        a.take(offset, [piece[:7], piece[7:]])  # a piece may come as several frames
    assert a.end() == len(IDS) + len(KV)
    assert placed(mem) == IDS + KV
    assert not mem[len(IDS):1000].any()  # the MAC trailer went nowhere near the region


def test_a_piece_out_of_order_ends_the_get_and_nothing_more_is_written():
    mem, stored = np.zeros(10_000, np.uint8), value()
    a = arrival(mem, stored)
    a.take(0, [stored[:4096]])
    a.take(5000, [stored[5000:]])
    a.take(4096, [stored[4096:5000]])  # too late: the GET already failed
    assert fails(a) == "length_mismatch"
    assert not mem[1000 + 11 * 700:].any()


@pytest.mark.parametrize("mac, kind", [(True, "mac_mismatch"), (False, "crc_mismatch")])
def test_a_short_value_or_a_flipped_byte_fails_at_the_end(mac, kind):
    stored = value(mac)
    a = arrival(np.zeros(10_000, np.uint8), stored, mac)
    a.take(0, [stored[:-1]])
    assert fails(a) == "length_mismatch"
    for at in (-1, -40, len(stored) // 2):  # in the MAC, the last KV byte, the middle
        flipped = bytearray(stored)
        flipped[at] ^= 1
        a = arrival(np.zeros(10_000, np.uint8), stored, mac)
        a.take(0, [bytes(flipped)])
        assert fails(a) == kind


def test_a_forged_moved_or_unauthenticated_chunk_fails_its_mac():
    forged = bytearray(value())
    body = len(forged) - cf.MAC_BYTES
    forged[body - len(KV):body] = bytes(255 - b for b in KV)  # whoever lacks the key keeps the old MAC
    moved = value(key=b"m" * 16)  # a real chunk, MACed for another storage key
    for stored in (bytes(forged), moved):
        a = arrival(np.zeros(10_000, np.uint8), stored)
        a.take(0, [stored])
        assert fails(a) == "mac_mismatch"
    bare = value(mac=False)  # written with the KV MAC off: refused before any byte lands
    mem = np.zeros(10_000, np.uint8)
    a = arrival(mem, bare, length=len(bare))
    a.take(0, [bare])
    assert fails(a) == "mac_mismatch" and not mem.any()


def test_an_older_generation_is_refused_before_any_byte_lands():
    old = value(generation=GENERATION - 1)  # a real chunk of this key, MACed, but replaced since
    mem = np.zeros(10_000, np.uint8)
    a = arrival(mem, old)
    a.take(0, [old])
    assert fails(a) == "stale_generation" and not mem.any()


def test_a_header_naming_another_chunk_or_cut_short_is_refused_before_any_byte_lands():
    other = value(ref=ChunkRef("mallory", "ctx", 3, 48, 64))
    for first_piece, stored in ((other, other), (value()[:40], value())):
        mem = np.zeros(10_000, np.uint8)
        a = arrival(mem, stored)
        a.take(0, [first_piece])
        assert fails(a) == "bad_header" and not mem.any()
