from __future__ import annotations

import numpy as np
import pytest

from fabric import chunk_format as cf


def header(**kw):
    args = {"user_id": "alice", "context_id": "ctx-1", "chunk_index": 2, "token_start": 64, "token_end": 96,
            "kv_bytes": 1234, "token_ids_hash": cf.token_ids_hash(list(range(64, 96)))}
    args.update(kw)
    return cf.ChunkHeader(**args)


def test_header_round_trip_and_partial_read():
    for h in (header(), header(generation=2**63 + 5, mac_bytes=0)):
        raw = cf.encode_header(h)
        decoded, length = cf.decode_header(raw + b"token ids and kv follow")
        assert decoded == h and length == len(raw) <= cf.MAX_HEADER_BYTES
        assert cf.value_length(decoded, length) == length + 32 * 4 + 1234 + h.mac_bytes
    with pytest.raises(cf.ChunkFormatError):
        cf.encode_header(header(mac_bytes=16))


def test_a_version_1_chunk_is_refused_as_unauthenticated():
    v1 = bytearray(cf.encode_header(header()))
    v1[4:6] = (1).to_bytes(2, "little")
    with pytest.raises(cf.ChunkFormatError, match="version 1 carries no MAC"):
        cf.decode_header(v1)


def test_the_mac_covers_key_generation_and_every_byte():
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
              cf.mac_of(key, storage_key, 7, [*parts[:2], bytes(flipped)])}         # another byte
    assert mac not in others and len(others) == 4


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
