"""A block's descriptor: what the compute node writes into the region before it triggers the
block's standing PUT, and the agent reads when the PUT fires (pure).

    record (DESCRIPTOR_BYTES, little endian):
      magic "KVBD" | version u16 | flags u16 | generation u64 | chunk_index u32 | token_count u32 |
      hash [16] | parent [16] | tenant_len u16 | user_len u16 | context_len u16 | parent_len u16 |
      tenant | user | context (utf-8) | zero padding | crc32c u32 (of everything before it)

generation: the value the compute node then stores into the block's PUT trigger counter; the
agent stores the block only if the descriptor's generation is the counter's (a descriptor that
is stale, torn or malformed is refused and counted, never stored under a wrong key).
flags: SHARED, the block's salt is its tenant's alone (a prefix the operator marked shared).
"""
from __future__ import annotations

import dataclasses
import struct

from hostmem.kv_layout import DESCRIPTOR_BYTES
from kvtb import crc32c as _crc

MAGIC = b"KVBD"
VERSION = 1
SHARED = 1
_FIXED = struct.Struct("<4sHHQII16s16sHHHH")
_CRC = struct.Struct("<I")
MAX_TENANT_BYTES, MAX_USER_BYTES, MAX_CONTEXT_BYTES = 64, 128, 240
assert _FIXED.size + MAX_TENANT_BYTES + MAX_USER_BYTES + MAX_CONTEXT_BYTES + _CRC.size <= DESCRIPTOR_BYTES


class DescriptorError(ValueError):
    """A descriptor that cannot be trusted: malformed, torn, or naming what does not fit."""


@dataclasses.dataclass(frozen=True)
class Descriptor:
    """Whose block it is and what it holds."""

    generation: int
    chunk_index: int          # the block's index in its sequence: tokens [i * block_tokens, ...)
    token_count: int          # tokens in the block (block_tokens, or fewer for a turn's last block)
    hash: bytes               # hostmem.block_hash of the block's tokens under its salt
    parent: bytes             # the previous block's hash (b"" for block 0)
    tenant: str
    user: str
    context: str
    shared: bool = False

    def __post_init__(self):
        for name, limit in (("tenant", MAX_TENANT_BYTES), ("user", MAX_USER_BYTES),
                            ("context", MAX_CONTEXT_BYTES)):
            if len(getattr(self, name).encode()) > limit:
                raise DescriptorError(f"{name} is longer than {limit} bytes")
        if len(self.hash) != 16 or len(self.parent) not in (0, 16):
            raise DescriptorError("hash must be 16 bytes and parent 0 or 16")
        if not 0 < self.token_count or self.generation <= 0:
            raise DescriptorError("a descriptor needs tokens and a positive generation")


def encode(d: Descriptor) -> bytes:
    """The record of a descriptor (DESCRIPTOR_BYTES)."""
    tenant, user, context = d.tenant.encode(), d.user.encode(), d.context.encode()
    body = _FIXED.pack(MAGIC, VERSION, SHARED if d.shared else 0, d.generation, d.chunk_index, d.token_count,
                       d.hash, d.parent.ljust(16, b"\0"), len(tenant), len(user), len(context),
                       16 if d.parent else 0) + tenant + user + context
    body = body.ljust(DESCRIPTOR_BYTES - _CRC.size, b"\0")
    return body + _CRC.pack(_crc.crc32c(body))


def decode(record, block_tokens: int) -> Descriptor:
    """The descriptor in a record; DescriptorError when it is not one to trust."""
    data = memoryview(record).cast("B")
    if data.nbytes != DESCRIPTOR_BYTES:
        raise DescriptorError(f"a descriptor is {DESCRIPTOR_BYTES} bytes, got {data.nbytes}")
    body = data[:DESCRIPTOR_BYTES - _CRC.size]
    if _crc.crc32c(body) != _CRC.unpack_from(data, DESCRIPTOR_BYTES - _CRC.size)[0]:
        raise DescriptorError("descriptor crc32c mismatch (torn or not written)")
    (magic, version, flags, generation, index, count, hash_, parent, tlen, ulen, clen,
     parent_len) = _FIXED.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise DescriptorError(f"not a descriptor (magic {bytes(magic)!r}, version {version})")
    if not 0 < count <= block_tokens:
        raise DescriptorError(f"token count {count} outside (0, {block_tokens}]")
    if tlen > MAX_TENANT_BYTES or ulen > MAX_USER_BYTES or clen > MAX_CONTEXT_BYTES or parent_len not in (0, 16):
        raise DescriptorError("descriptor field lengths out of range")
    if (parent_len == 0) != (index == 0):
        raise DescriptorError("only block 0 has no parent")
    pos = _FIXED.size
    try:
        tenant = bytes(data[pos:pos + tlen]).decode()
        user = bytes(data[pos + tlen:pos + tlen + ulen]).decode()
        context = bytes(data[pos + tlen + ulen:pos + tlen + ulen + clen]).decode()
    except UnicodeDecodeError as exc:
        raise DescriptorError("descriptor ids are not utf-8") from exc
    return Descriptor(generation, index, count, bytes(hash_), bytes(parent[:parent_len]), tenant, user, context,
                      bool(flags & SHARED))
