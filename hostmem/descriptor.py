"""A block's descriptor: what the compute node writes into the region before it triggers the
block's standing PUT, and the agent reads when the PUT fires (pure).

    record (DESCRIPTOR_BYTES, little endian):
      magic "KVBD" | version u16 | flags u16 | generation u64 | chunk_index u32 | token_count u32 |
      parent_len u16 | hash [16] | parent [16] | tenant_len u16 | user_len u16 | context_len u16 |
      tenant | user | context (utf-8) | (unused) |
      stamp_ns u64 at STAMP_OFFSET | crc32c u32 in the last 4 bytes, of the bytes from magic to the end of context

generation: the value the compute node then stores into the block's PUT trigger counter; the
agent stores the block only if the descriptor's generation is the counter's (a descriptor that
is stale, torn or malformed is refused and counted, never stored under a wrong key).
stamp_ns: CLOCK_MONOTONIC in ns, written right before the counter store (0: not stamped); the
agent's trigger-to-fire latency is measured from it. It says nothing about the block, so the crc
leaves it out and it is written last (`Writer.stamp`), a microsecond before the store.
flags: SHARED, the block's salt is its tenant's alone (a prefix the operator marked shared).

The compute node's hot path (`Writer.write`) packs a record straight into the region: the owner's
part (tenant, user, context) is encoded once per owner, the rest is one struct pack and a crc.
"""
from __future__ import annotations

import dataclasses
import struct
import time

import google_crc32c

from hostmem.kv_layout import DESCRIPTOR_BYTES
from kvtb import crc32c as _crc

try:  # one engine step's records written, stamped and triggered in one C call (hostmem/_trigger.c)
    from hostmem._trigger import store as store_batch
except ImportError:  # pragma: no cover - built where there is a C compiler
    store_batch = None

MAGIC = b"KVBD"
VERSION = 2
SHARED = 1
_HEAD = struct.Struct("<4sHHQIIH16s16s")
_OWNER = struct.Struct("<HHH")
_STAMP = struct.Struct("<Q")
_CRC = struct.Struct("<I")
CRC_OFFSET = DESCRIPTOR_BYTES - _CRC.size
STAMP_OFFSET = CRC_OFFSET - _STAMP.size
MAX_TENANT_BYTES, MAX_USER_BYTES, MAX_CONTEXT_BYTES = 64, 128, 240
MAX_TOKEN_END = 0xFFFFFFFF  # a stored chunk's header keeps token positions as u32
if _HEAD.size + _OWNER.size + MAX_TENANT_BYTES + MAX_USER_BYTES + MAX_CONTEXT_BYTES > STAMP_OFFSET:
    raise RuntimeError(f"hostmem.descriptor: the fields do not fit before the stamp at {STAMP_OFFSET}")


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
    stamp_ns: int = 0         # CLOCK_MONOTONIC when written, just before the counter store (0: none)

    def __post_init__(self):
        owner(self.tenant, self.user, self.context)  # DescriptorError when an id is too long
        if len(self.hash) != 16 or len(self.parent) not in (0, 16):
            raise DescriptorError("hash must be 16 bytes and parent 0 or 16")
        if not 0 < self.token_count or self.generation <= 0 or self.chunk_index < 0 or self.stamp_ns < 0:
            raise DescriptorError("a descriptor needs tokens, a positive generation and no negative field")


_HASH_OFFSET = struct.calcsize("<4sHHQIIH")  # where the record's hash starts


def peek(record) -> tuple[bytes, int]:
    """(hash, stamp ns) of a record, read in place and unchecked: for a record the compiled poller has
    checked already (its decode follows, off the fire's path)."""
    view = memoryview(record)
    if view.nbytes < DESCRIPTOR_BYTES:
        raise DescriptorError(f"a descriptor record is {DESCRIPTOR_BYTES} bytes, got {view.nbytes}")
    return bytes(view[_HASH_OFFSET:_HASH_OFFSET + 16]), _STAMP.unpack_from(view, STAMP_OFFSET)[0]


def owner(tenant: str, user: str, context: str) -> bytes:
    """The owner's part of a record (lengths and utf-8 ids); DescriptorError when an id is too long."""
    t, u, c = tenant.encode(), user.encode(), context.encode()
    if len(t) > MAX_TENANT_BYTES or len(u) > MAX_USER_BYTES or len(c) > MAX_CONTEXT_BYTES:
        raise DescriptorError(f"tenant, user or context longer than {MAX_TENANT_BYTES}, {MAX_USER_BYTES} "
                              f"or {MAX_CONTEXT_BYTES} bytes")
    return _OWNER.pack(len(t), len(u), len(c)) + t + u + c


def _body(generation: int, chunk_index: int, token_count: int, hash_: bytes, parent: bytes, owner_part: bytes,
          shared: bool) -> bytes:
    return _HEAD.pack(MAGIC, VERSION, SHARED if shared else 0, generation, chunk_index, token_count,
                      len(parent), hash_, parent.ljust(16, b"\0")) + owner_part


def encode(d: Descriptor) -> bytes:
    """The record of a descriptor (DESCRIPTOR_BYTES)."""
    body = _body(d.generation, d.chunk_index, d.token_count, d.hash, d.parent, owner(d.tenant, d.user, d.context),
                 d.shared)
    return body.ljust(STAMP_OFFSET, b"\0") + _STAMP.pack(d.stamp_ns) + _CRC.pack(google_crc32c.value(body))


class Writer:
    """Packs records straight into a region's buffer (the compute node's engine thread only).

    Owners' parts are kept (up to `max_owners`, then forgotten all at once), so a block costs one
    struct pack, one crc32c and two slice stores. Arguments are trusted: the engine made them.
    """

    def __init__(self, buffer, max_owners: int = 4096):
        self.buffer = buffer  # a writable memoryview of the region
        self.max_owners = max_owners
        self._owners: dict[tuple[str, str, str], bytes] = {}

    def write(self, offset: int, generation: int, chunk_index: int, token_count: int, hash_: bytes, parent: bytes,
              tenant: str, user: str, context: str, shared: bool = False) -> None:
        """The record at `offset` (a descriptor_range's start), unstamped: stamp() it right before the store."""
        part = self.owner(tenant, user, context)
        body = _body(generation, chunk_index, token_count, hash_, parent, part, shared)
        self.buffer[offset:offset + len(body)] = body
        self.buffer[offset + CRC_OFFSET:offset + DESCRIPTOR_BYTES] = _CRC.pack(google_crc32c.value(body))

    def owner(self, tenant: str, user: str, context: str) -> bytes:
        """The owner's part of a record (owner()), kept."""
        key = (tenant, user, context)
        part = self._owners.get(key)
        if part is None:
            if len(self._owners) >= self.max_owners:
                self._owners.clear()
            part = self._owners[key] = owner(tenant, user, context)
        return part

    def stamp(self, offset: int) -> None:
        """The record's stamp_ns: now (CLOCK_MONOTONIC). The last write before the counter store."""
        _STAMP.pack_into(self.buffer, offset + STAMP_OFFSET, time.monotonic_ns())


def decode(record, block_tokens: int) -> Descriptor:
    """The descriptor in a record; DescriptorError when it is not one to trust."""
    data = memoryview(record).cast("B")
    if data.nbytes != DESCRIPTOR_BYTES:
        raise DescriptorError(f"a descriptor is {DESCRIPTOR_BYTES} bytes, got {data.nbytes}")
    magic, version, flags, generation, index, count, parent_len, hash_, parent = _HEAD.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise DescriptorError(f"not a descriptor (magic {bytes(magic)!r}, version {version})")
    tlen, ulen, clen = _OWNER.unpack_from(data, _HEAD.size)
    if tlen > MAX_TENANT_BYTES or ulen > MAX_USER_BYTES or clen > MAX_CONTEXT_BYTES or parent_len not in (0, 16):
        raise DescriptorError("descriptor field lengths out of range")
    pos = _HEAD.size + _OWNER.size
    end = pos + tlen + ulen + clen
    if _crc.crc32c(data[:end]) != _CRC.unpack_from(data, CRC_OFFSET)[0]:
        raise DescriptorError("descriptor crc32c mismatch (torn or not written)")
    if not 0 < count <= block_tokens:
        raise DescriptorError(f"token count {count} outside (0, {block_tokens}]")
    if index * block_tokens + count > MAX_TOKEN_END:
        raise DescriptorError(f"chunk index {index} out of range (its tokens pass {MAX_TOKEN_END})")
    if generation == 0:
        raise DescriptorError("generation 0 is never stored")
    if (parent_len == 0) != (index == 0):
        raise DescriptorError("only block 0 has no parent")
    try:
        tenant = bytes(data[pos:pos + tlen]).decode()
        user = bytes(data[pos + tlen:pos + tlen + ulen]).decode()
        context = bytes(data[pos + tlen + ulen:end]).decode()
    except UnicodeDecodeError as exc:
        raise DescriptorError("descriptor ids are not utf-8") from exc
    return Descriptor(generation, index, count, bytes(hash_), bytes(parent[:parent_len]), tenant, user, context,
                      bool(flags & SHARED), _STAMP.unpack_from(data, STAMP_OFFSET)[0])
