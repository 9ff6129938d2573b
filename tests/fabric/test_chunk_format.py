from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from fabric import chunk_format as cf
from kvtb.crc32c import crc32c


def header(**kw):
    args = {"user_id": "alice", "context_id": "ctx-1", "chunk_index": 2, "token_start": 64, "token_end": 96,
            "kv_bytes": 1234, "token_ids_hash": cf.token_ids_hash(list(range(64, 96)))}
    args.update(kw)
    return cf.ChunkHeader(**args)


def test_header_round_trip_and_partial_read():
    for h in (header(), header(generation=2**63 + 5, mac_bytes=0), header(kv_bytes=1230, kv_parts=30)):
        raw = cf.encode_header(h)
        decoded, length = cf.decode_header(raw + b"token ids and kv follow")
        assert decoded == h and length == len(raw) <= cf.MAX_HEADER_BYTES
        assert cf.value_length(decoded, length) == length + 32 * 4 + h.kv_bytes + (1 + h.kv_parts) * h.mac_bytes
    for bad in ({"mac_bytes": 16}, {"kv_parts": 0}, {"kv_parts": 7}):  # 1234 bytes are not 7 equal parts
        with pytest.raises(cf.ChunkFormatError):
            cf.encode_header(header(**bad))


@pytest.mark.parametrize("version", [1, 2, 3])
def test_an_older_chunk_is_refused_as_untrusted(version):
    old = bytearray(cf.encode_header(header()))
    old[4:6] = version.to_bytes(2, "little")
    with pytest.raises(cf.ChunkFormatError, match="older format version"):
        cf.decode_header(old)


def test_a_block_header_names_its_owner_and_its_place_in_the_chain():
    h = cf.ChunkHeader("alice", "ctx-1", 3, 96, 110, 4096, b"n" * 16, 9, cf.MAC_BYTES, "acme", b"p" * 16, True)
    got, length = cf.decode_header(cf.encode_header(h))
    assert got == h and got.name == b"n" * 16 and length == len(cf.encode_header(h))
    first = cf.ChunkHeader("alice", "ctx-1", 0, 0, 32, 4096, b"n" * 16, 1, 0, "acme")
    assert cf.decode_header(cf.encode_header(first))[0].parent == b""


def test_the_mac_covers_key_generation_part_and_every_byte():
    key, storage_key = bytes(range(32)), cf.chunk_key("salt", "alice", "ctx-1", 0)
    parts = [cf.encode_header(header(generation=7)), b"ids" * 10, bytes(range(256)) * 40]
    mac = cf.mac_of(key, storage_key, 7, parts)
    incremental = cf.chunk_mac(key, storage_key, 7)
    for part in parts:
        incremental.update(part)
    assert len(mac) == cf.MAC_BYTES and cf.same_mac(mac, incremental.digest(cf.MAC_BYTES))
    flipped = bytearray(parts[2])
    flipped[5000] ^= 1
    others = {cf.mac_of(bytes(32), storage_key, 7, parts),                        # another key
              cf.mac_of(key, cf.chunk_key("salt", "alice", "ctx-2", 0), 7, parts),  # another place
              cf.mac_of(key, storage_key, 6, parts),                               # another generation
              cf.mac_of(key, storage_key, 7, parts, 0),                            # a KV part, not the head
              cf.mac_of(key, storage_key, 7, [*parts[:2], bytes(flipped)])}         # another byte
    assert mac not in others and len(others) == 5


def test_a_sealed_value_checks_out_and_any_part_moved_or_changed_does_not():
    key, storage_key = bytes(range(32)), b"k" * 16
    h = header(generation=7, kv_bytes=3 * 4096, kv_parts=3)
    ids, kv = np.arange(64, 96, dtype="<u4").tobytes(), np.random.default_rng(1).bytes(3 * 4096)
    value = b"".join(bytes(b) for b in cf.sealed(key, storage_key, h, [ids], [kv[:5000], kv[5000:]]))
    got, layout = cf.check_value(key, storage_key, value)
    assert got == h and value[layout.kv_offset:] == kv and value[layout.ids_offset:layout.macs_offset] == ids
    swapped = value[:layout.kv_offset] + kv[4096:8192] + kv[:4096] + kv[8192:]  # two layers swapped
    for bad in (swapped, value[:-1], value[:layout.macs_offset] + bytes(32) + value[layout.macs_offset + 32:]):
        with pytest.raises(cf.ChunkFormatError):
            cf.check_value(key, storage_key, bad)
    with pytest.raises(cf.ChunkFormatError):
        cf.check_value(key, b"m" * 16, value)  # moved to another key
    bare = b"".join(bytes(b) for b in cf.sealed(None, storage_key, dataclasses.replace(h, mac_bytes=0), [ids], [kv]))
    assert cf.check_value(None, storage_key, bare)[1].macs_bytes == 0
    with pytest.raises(cf.ChunkFormatError, match="unauthenticated"):
        cf.check_value(key, storage_key, bare)


def test_generations_follow_the_clock_and_never_repeat():
    assert cf.next_generation(0, 1000) == 1000
    assert cf.next_generation(1000, 1000) == 1001
    assert cf.next_generation(5000, 1000) == 5001  # a clock that stepped back


def test_corrupt_header_is_refused():
    raw = bytearray(cf.encode_header(header()))
    raw[10] ^= 1
    with pytest.raises(cf.ChunkFormatError):
        cf.decode_header(raw)
    with pytest.raises(cf.ChunkFormatError):
        cf.decode_header(b"KVTC")


def test_key_depends_on_salt_user_context_and_index():
    keys = {cf.chunk_key(s, u, c, i) for s in ("a", "b") for u in ("u1", "u2") for c in ("c1", "c2")
            for i in (0, 1)}
    assert len(keys) == 16 and all(len(k) == 16 for k in keys)
    assert cf.chunk_key("a", "u1c", "1", 0) != cf.chunk_key("a", "u1", "c1", 0)


def test_token_ids_hash_same_from_ints_and_buffer():
    ids = np.arange(10, 42, dtype="<u4")
    assert cf.token_ids_hash(ids.tobytes()) == cf.token_ids_hash(list(range(10, 42)))


def test_scatter_across_frame_boundaries_and_crc():
    data = bytes(range(256)) * 4
    frames = [data[:100], data[100:101], data[101:700], data[700:]]
    targets = [memoryview(bytearray(n)) for n in (50, 300, 0, 674)]
    assert cf.scatter(cf.skip(frames, 0), targets) == len(data)
    assert b"".join(bytes(t) for t in targets) == data
    tail = cf.skip(frames, 150)
    assert b"".join(bytes(t) for t in tail) == data[150:]
    assert cf.crc32c_of(frames) == cf.crc32c_of([data])
    with pytest.raises(cf.ChunkFormatError):
        cf.scatter([data[:10]], [memoryview(bytearray(11))])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e4m3fn", ""])
def test_the_header_records_the_kvs_dtype_and_an_unknown_code_is_refused(dtype):
    h = header(kv_dtype=dtype, shared=True)
    raw = bytearray(cf.encode_header(h))
    assert cf.decode_header(raw)[0] == h
    with pytest.raises(cf.ChunkFormatError, match="unknown KV dtype"):
        cf.encode_header(header(kv_dtype="float16"))
    flags = cf.MIN_HEADER_BYTES - 4 - 4  # before the crc32c: flags u8, mac_bytes u8, kv_parts u16 end the fixed part
    raw[flags] = (raw[flags] & 1) | 5 << cf.DTYPE_SHIFT  # a code no writer uses
    raw[-4:] = crc32c(bytes(raw[:-4])).to_bytes(4, "little")
    with pytest.raises(cf.ChunkFormatError, match="unknown KV dtype code 5"):
        cf.decode_header(raw)


def test_a_chunk_written_before_the_dtype_was_recorded_reads_as_float32():
    raw = cf.encode_header(header(kv_dtype="float32"))
    assert cf.decode_header(raw)[0].kv_dtype == "float32"  # code 0: the flags byte every v4 chunk had
