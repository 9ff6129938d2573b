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
    raw = cf.encode_header(header())
    decoded, length = cf.decode_header(raw + b"token ids and kv follow")
    assert decoded == header() and length == len(raw) <= cf.MAX_HEADER_BYTES


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
