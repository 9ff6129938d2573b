"""A GET's value placed as it arrives, whole or in data PDUs (pure: numpy only, no sockets)."""
from __future__ import annotations

import numpy as np
import pytest

from kvtb.crc32c import crc32c
from fabric import chunk_format as cf
from hostmem import gather
from smartnic.datapath import Arrival, ChunkRef, DataError
from smartnic.requester import Chunk

REF = ChunkRef("alice", "ctx", 3, 48, 64)
IDS = np.arange(48, 64, dtype=np.uint32).tobytes()
KV = np.random.default_rng(5).integers(0, 256, 6000, dtype=np.uint8).tobytes()
# the region: token ids at 0, then KV as 12 rows of 500 bytes every 700 bytes
TARGETS = gather.runs_of([(0, len(IDS))] + [(1000 + i * 700, 500) for i in range(12)])
HEADER = cf.encode_header(cf.ChunkHeader(*REF, len(KV), cf.token_ids_hash(IDS)))
VALUE = HEADER + IDS + KV


def chunk(value: bytes = VALUE) -> Chunk:
    return Chunk(REF.chunk_index, REF.token_start, REF.token_end, "s0", b"k" * 16, len(value),
                 crc32c(value), cf.token_ids_hash(IDS))


def placed(mem: np.ndarray) -> bytes:
    rows = (mem[1000 + i * 700:1500 + i * 700].tobytes() for i in range(12))
    return mem[:len(IDS)].tobytes() + b"".join(rows)


@pytest.mark.parametrize("pdu", [len(VALUE), 4096, len(HEADER) + 1, 700])
def test_a_value_in_pieces_lands_in_its_ranges_with_its_crc(pdu):
    mem = np.zeros(10_000, np.uint8)
    arrival = Arrival(REF, chunk(), mem, TARGETS)
    for offset in range(0, len(VALUE), pdu):
        piece = VALUE[offset:offset + pdu]
        arrival.take(offset, [piece[:7], piece[7:]])  # a piece may come as several frames
    assert arrival.end() == len(IDS) + len(KV)
    assert placed(mem) == IDS + KV


def test_a_piece_out_of_order_ends_the_get_and_nothing_more_is_written():
    mem = np.zeros(10_000, np.uint8)
    arrival = Arrival(REF, chunk(), mem, TARGETS)
    arrival.take(0, [VALUE[:4096]])
    arrival.take(5000, [VALUE[5000:]])
    arrival.take(4096, [VALUE[4096:5000]])  # too late: the GET already failed
    with pytest.raises(DataError) as err:
        arrival.end()
    assert err.value.kind == "length_mismatch"
    assert not mem[1000 + 11 * 700:].any()


def test_a_short_value_or_a_flipped_byte_fails_at_the_end():
    arrival = Arrival(REF, chunk(), np.zeros(10_000, np.uint8), TARGETS)
    arrival.take(0, [VALUE[:-1]])
    with pytest.raises(DataError, match="expected") as err:
        arrival.end()
    assert err.value.kind == "length_mismatch"
    flipped = bytearray(VALUE)
    flipped[-1] ^= 1
    arrival = Arrival(REF, chunk(), np.zeros(10_000, np.uint8), TARGETS)
    arrival.take(0, [bytes(flipped)])
    with pytest.raises(DataError) as err:
        arrival.end()
    assert err.value.kind == "crc_mismatch"


def test_a_header_naming_another_chunk_or_cut_short_is_refused_before_any_byte_lands():
    other = cf.encode_header(cf.ChunkHeader("mallory", "ctx", 3, 48, 64, len(KV), cf.token_ids_hash(IDS)))
    value = other + IDS + KV
    for first_piece in (value, VALUE[:len(HEADER) - 1]):
        mem = np.zeros(10_000, np.uint8)
        arrival = Arrival(REF, chunk(value if first_piece is value else VALUE), mem, TARGETS)
        arrival.take(0, [first_piece])
        with pytest.raises(DataError) as err:
            arrival.end()
        assert err.value.kind == "bad_header" and not mem.any()
