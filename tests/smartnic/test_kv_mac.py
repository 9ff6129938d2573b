"""KV that cannot be forged, with real agent and storage processes: a chunk forged with the same crc32c,
a chunk moved to another context's key and an older copy replayed under its own key each end the restore
with an error (the compute node falls back), and the chunk is dropped."""
from __future__ import annotations

import numpy as np

from fabric import chunk_format as cf
from fabric.auth import AGENT_NQN
from kvtb.crc32c import crc32c
from kvtb_proto import smartnic_pb2
from tests.smartnic.helpers import KEY
from tests.smartnic.test_agent_failures import fabric, start
from tests.smartnic.test_agent_service import CTX, IDS, USER, offload, restore


def solve_gf2(vectors: list[int], want: int) -> list[int]:
    """Indexes of vectors whose XOR is want (Gaussian elimination over GF(2)); AssertionError if none."""
    basis: list[tuple[int, int]] = []  # (vector, mask of the indexes it combines), distinct top bits
    for i, v in enumerate(vectors):
        mask = 1 << i
        for bv, bm in basis:
            if v ^ bv < v:
                v, mask = v ^ bv, mask ^ bm
        if v:
            basis.append((v, mask))
            basis.sort(reverse=True)
    mask = 0
    for bv, bm in basis:
        if want ^ bv < want:
            want, mask = want ^ bv, mask ^ bm
    assert want == 0, "these bits cannot reach the crc32c"
    return [i for i in range(len(vectors)) if mask >> i & 1]


def forge_same_crc(value: bytes, kv: slice) -> bytes:
    """The finding's forgery: every K and V negated (fp32 sign bits), then low mantissa bits flipped until
    the value's crc32c is the original's again (crc32c is affine in the bits: a linear system)."""
    forged = bytearray(value)
    floats = np.frombuffer(memoryview(forged)[kv], dtype="<u4").copy()
    forged[kv] = (floats ^ np.uint32(0x8000_0000)).tobytes()
    base = crc32c(bytes(forged))
    bits = [kv.start * 8 + 32 * k for k in range(64)]  # the lowest mantissa bit of the first 64 floats

    def flipped(bit: int) -> int:
        trial = bytearray(forged)
        trial[bit // 8] ^= 1 << (bit % 8)
        return crc32c(bytes(trial)) ^ base

    for i in solve_gf2([flipped(b) for b in bits], base ^ crc32c(value)):
        forged[bits[i] // 8] ^= 1 << (bits[i] % 8)
    assert crc32c(bytes(forged)) == crc32c(value) and bytes(forged) != value
    return bytes(forged)


def restore_fails(pool, context: str, kind: str, chunk_index: int) -> None:
    """A restore of the context ends with one error of `kind` on that chunk, which is then dropped."""
    info = restore(pool, 1, IDS, context=context)
    success, error = pool.wait_counter(info.completion_counter, info.threshold)
    assert error - info.error_base == 1 and success + error == info.threshold  # the compute node falls back
    errors = pool.stub.ReadErrors(smartnic_pb2.ReadErrorsRequest(region_id=pool.region_id, access_key=KEY))
    assert [(e.kind, e.chunk.chunk_index) for e in errors.errors] == [(kind, chunk_index)]
    left = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=context)).chunks
    assert chunk_index not in [c.chunk_index for c in left]


def chunk_keys(pool, context: str) -> list[bytes]:
    return [c.key for c in pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=context)).chunks]


def test_a_chunk_forged_with_the_same_crc32c_falls_back(start_service, tmp_path):
    storage, _, pool = start(start_service, tmp_path)
    try:
        offload(pool)
        key = chunk_keys(pool, CTX)[0]
        # the strongest attacker short of the MAC key: the deployment's own agent's fabric key
        client = fabric(storage[0][1], AGENT_NQN)
        value = bytes(client.retrieve(1, key).payload())
        header, n = cf.decode_header(value)
        kv = slice(n + header.token_ids_bytes, len(value) - cf.MAC_BYTES)
        client.store(1, key, [forge_same_crc(value, kv)])  # the node takes it: its crc32c checks out
        client.close()
        restore_fails(pool, CTX, "mac_mismatch", 0)
        assert restore(pool, 1, IDS).tokens_announced == 0  # the prefix is gone: recompute
        assert pool.stub.Stats(smartnic_pb2.StatsRequest()).errors_by_kind["mac_mismatch"] == 1
    finally:
        pool.close()


def test_a_chunk_moved_to_another_contexts_key_falls_back(start_service, tmp_path):
    storage, _, pool = start(start_service, tmp_path)
    try:
        for context in ("c-a", "c-b", "c-c"):
            offload(pool, context=context)
        client = fabric(storage[0][1])
        source = bytes(client.retrieve(1, chunk_keys(pool, "c-a")[0]).payload())
        client.store(1, chunk_keys(pool, "c-b")[0], [source])  # moved as it is: its header names c-a
        restore_fails(pool, "c-b", "bad_header", 0)
        # moved with its header rewritten to name c-c, in c-c's own generation: only the MAC tells
        header, n = cf.decode_header(source)
        target_key = chunk_keys(pool, "c-c")[0]
        target_header, _ = cf.decode_header(client.retrieve(1, target_key, max_bytes=cf.MAX_HEADER_BYTES).payload())
        rewritten = cf.encode_header(cf.ChunkHeader(
            USER, "c-c", header.chunk_index, header.token_start, header.token_end, header.kv_bytes,
            header.token_ids_hash, target_header.generation, header.mac_bytes))
        client.store(1, target_key, [rewritten + source[n:]])
        client.close()
        restore_fails(pool, "c-c", "mac_mismatch", 0)
        info = restore(pool, 1, IDS, context="c-a")  # the original is untouched
        assert pool.wait_counter(info.completion_counter, info.threshold)[1] == info.error_base
    finally:
        pool.close()


def test_an_older_generation_replayed_under_its_key_falls_back(start_service, tmp_path):
    storage, _, pool = start(start_service, tmp_path)
    try:
        offload(pool)
        key = chunk_keys(pool, CTX)[0]
        client = fabric(storage[0][1])
        old = bytes(client.retrieve(1, key).payload())
        offload(pool)  # the same chunks stored again: a new generation of each
        assert cf.decode_header(client.retrieve(1, key).payload())[0].generation > cf.decode_header(old)[0].generation
        client.store(1, key, [old])  # the older copy, MAC and all, put back
        client.close()
        restore_fails(pool, CTX, "stale_generation", 0)
    finally:
        pool.close()
