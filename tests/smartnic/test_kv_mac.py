"""KV that cannot be forged, with real agent and storage processes: a block forged with the same crc32c,
a block moved under another block's key and an older copy replayed under its own key each end the
restore with an error (the compute node falls back), and the block is dropped."""
from __future__ import annotations

import dataclasses

import numpy as np

from fabric import chunk_format as cf
from kvtb.crc32c import crc32c
from kvtb.credentials import AGENT_NQN
from kvtb_proto import smartnic_pb2
from tests.smartnic.test_agent_failures import fabric
from tests.smartnic.test_agent_service import CTX, IDS, USER, turn


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


def restore_fails(compute, ids, kind: str, index: int, user: str = USER, context: str = CTX) -> None:
    """A restore of ids ends with an error of `kind` on block `index` (the compute node falls back), and
    the block is dropped from the requester."""
    pool, fake, channel = compute
    before = pool.stub.Stats(smartnic_pb2.StatsRequest()).errors_by_kind[kind]
    turn(channel, list(ids) + [7], user=user, context=context)
    landed = fake.outcomes[-1]
    assert landed[index][1] > 0 and all(e == 0 for _, e in landed[:index]), landed  # the blocks before it landed
    assert pool.stub.Stats(smartnic_pb2.StatsRequest()).errors_by_kind[kind] == before + 1
    left = pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=user, context_id=context)).chunks
    assert index not in [c.chunk_index for c in left]


def block_keys(pool, context: str = CTX) -> list[bytes]:
    return [c.key for c in pool.stub.Lookup(smartnic_pb2.ContextRef(user_id=USER, context_id=context)).chunks]


def test_a_block_forged_with_the_same_crc32c_falls_back(compute, storage):
    pool, fake, channel = compute
    pool.offload(IDS, USER, CTX)
    key = block_keys(pool)[0]
    # the strongest attacker short of the MAC key: the deployment's own agent's fabric key
    client = fabric(storage[0][1], AGENT_NQN)
    value = bytes(client.retrieve(1, key).payload())
    header, n = cf.decode_header(value)
    kv = slice(cf.value_layout(header, n).kv_offset, len(value))
    client.store(1, key, [forge_same_crc(value, kv)])  # the node takes it: its crc32c checks out
    client.close()
    restore_fails(compute, IDS, "mac_mismatch", 0)
    turn(channel, IDS + [7])
    assert fake.requests[-1].stored_tokens == 0  # the prefix is gone: recompute


def test_a_block_moved_to_another_blocks_key_falls_back(compute, storage):
    pool, fake, channel = compute
    pool.offload(IDS, USER, CTX)
    keys = block_keys(pool)
    client = fabric(storage[0][1])
    source = bytes(client.retrieve(1, keys[2]).payload())
    client.store(1, keys[1], [source])  # moved as it is: its header names block 2
    restore_fails(compute, IDS, "bad_header", 1)
    # block 2 moved onto block 0's key with its header rewritten to name block 0, in block 0's
    # generation: only the MAC tells
    header, n = cf.decode_header(source)
    target, _ = cf.decode_header(client.retrieve(1, keys[0], max_bytes=cf.MAX_HEADER_BYTES).payload())
    rewritten = cf.encode_header(dataclasses.replace(header, chunk_index=0, token_start=0, token_end=16,
                                                     token_ids_hash=target.name, parent=b"",
                                                     generation=target.generation))
    client.store(1, keys[0], [rewritten + source[n:]])
    client.close()
    restore_fails(compute, IDS, "mac_mismatch", 0)


def test_an_older_generation_replayed_under_its_key_falls_back(compute, storage):
    pool, fake, channel = compute
    pool.offload(IDS, USER, CTX)
    key = block_keys(pool)[0]
    client = fabric(storage[0][1])
    old = bytes(client.retrieve(1, key).payload())
    pool.offload(IDS, USER, CTX)  # the same blocks stored again: a new generation of each
    assert cf.decode_header(client.retrieve(1, key).payload())[0].generation > cf.decode_header(old)[0].generation
    client.store(1, key, [old])  # the older copy, MAC and all, put back
    client.close()
    restore_fails(compute, IDS, "stale_generation", 0)
