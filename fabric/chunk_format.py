"""The stored chunk: header + token ids + MACs + KV bytes (pure: no zmq, grpc or torch).

    value  = header | token_ids | macs | kv
    header = fixed (little endian, see _FIXED) | tenant | user id | context id (utf-8) | crc32c u32
      fixed: magic "KVTC", version u16 (4), header_len u16, chunk_index u32, token_start u32,
             token_end u32, tenant_len u16, user_len u16, context_len u16, kv_bytes u64,
             name [16], parent [16], generation u64 (the writer's version of this chunk),
             flags u8 (bit 0: SHARED; bits 1-3: the KV's dtype, hostmem.kv_dtype's code, 0 float32,
             7 unstated),
             mac_bytes u8 (one MAC: 32, or 0 when written with the KV MAC off),
             kv_parts u16 (the KV's equal parts, each with its own MAC: a block's layers)
    token_ids: [token_end - token_start] uint32 LE
    macs:      (1 + kv_parts) x mac_bytes, keyed BLAKE3 (the deployment's kv-mac.key) over
               MAC_CONTEXT | storage key [16] | generation u64 | part u32 | bytes:
               first the head's (part HEAD, over header | token_ids), then each KV part's
    kv:        a block of the pool: [layer, K|V, kv_head, block_tokens, head_dim] (the whole extent,
               one DMA; rows past token_end in a turn's partial last block are never read), in
               kv_parts parts of kv_bytes / kv_parts bytes (one per layer)

Everything a reader needs to check what it reads (header, token ids, every MAC) leads the value, so a
layer-wise restore reads it with the first layer group and then checks each group of layers on its
own as it lands (`ValueLayout` says where each part lies), before any of it is used.

A block (the agent's standing PUTs and GETs, the compute node's `cpu` policy) is named by its hash
chain (hostmem.block_hash): `name` is that hash, `parent` the previous block's, and its owner is
(tenant, user), or the tenant alone when SHARED; key = block_key(salt, name). A plain chunk (a
one-off PUT of ranges of a region without a layout: tests, benchmarks) has a hash of its key and
token ids as its name, one KV part, and key = chunk_key(salt, user, context, chunk index).

The header alone (at most MAX_HEADER_BYTES) says whose chunk it is and which tokens it
covers, so the agent rebuilds its hashmap from partial Retrieves. The MACs are made where the
chunk is written and checked before restored bytes are used: the storage nodes never hold their
key, so neither they nor anyone who writes their files can forge a chunk or a part of one, move
it to another key or another part, or pass off an older generation (the reader knows the
generation it wrote). The header's crc32c and the value's catch accidents early; only the MACs
stand against tampering. Chunks of versions 1 to 3 (no MAC, no block name, one MAC over the whole
value) are refused as untrusted: their KV is recomputed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import hmac
import struct
from collections.abc import Iterable, Sequence

import blake3

from hostmem import kv_dtype as kvd
from kvtb import crc32c as _crc

MAGIC = b"KVTC"
VERSION = 4
SHARED = 1
DTYPE_SHIFT, DTYPE_MASK = 1, 0b111  # flags bits 1-3: the KV's dtype code
UNSTATED = 0b111  # the code of KV of no stated type (a layout of raw bytes: kv_dtype "")
_FIXED = struct.Struct("<4sHHIIIHHHQ16s16sQBBH")
MAC_BYTES = 32
MAC_CONTEXT = b"kvtb chunk mac v4\0"
HEAD = 0xFFFF_FFFF  # the part number of the head's MAC (header and token ids)
MAX_PARTS = 0xFFFF
# Threads one MAC update may use (BLAKE3 is a tree and can split a large update). One: measured side by
# side in `kvtb bench datapath` rounds, two threads gave no faster GET (the data path already keeps both
# cores of this machine busy) and cost a quarter more CPU.
MAC_THREADS = 1
_CRC = struct.Struct("<I")
MAX_ID_BYTES = 1024
MAX_HEADER_BYTES = _FIXED.size + 3 * MAX_ID_BYTES + _CRC.size
MIN_HEADER_BYTES = _FIXED.size + _CRC.size  # a header with empty ids
TOKEN_ID_BYTES = 4


class ChunkFormatError(ValueError):
    """A value that is not a well-formed chunk."""


@dataclasses.dataclass(frozen=True)
class ChunkHeader:
    """What a stored chunk says about itself."""

    user_id: str
    context_id: str
    chunk_index: int
    token_start: int
    token_end: int
    kv_bytes: int
    token_ids_hash: bytes       # the chunk's name: a block's hash chain, a plain chunk's hash of its key and token ids
    generation: int = 0
    mac_bytes: int = MAC_BYTES  # one MAC's length: 0 for a chunk written with the KV MAC off
    tenant: str = ""
    parent: bytes = b""         # the previous block's name (b"" for block 0 and plain chunks)
    shared: bool = False        # named under the tenant's salt alone
    kv_parts: int = 1           # equal parts of the KV, each MACed on its own (a block: one per layer)
    kv_dtype: str = kvd.DEFAULT  # the KV's element type (hostmem.kv_dtype; "": unstated): a restore into
    #                              a pool of another is refused

    @property
    def name(self) -> bytes:
        return self.token_ids_hash

    @property
    def num_tokens(self) -> int:
        return self.token_end - self.token_start

    @property
    def token_ids_bytes(self) -> int:
        return self.num_tokens * TOKEN_ID_BYTES


@dataclasses.dataclass(frozen=True)
class ValueLayout:
    """Where a stored value keeps what: header | token ids | MACs | KV parts (byte offsets in the value)."""

    header_bytes: int
    token_ids_bytes: int
    mac_bytes: int      # one MAC (0: none)
    kv_parts: int
    kv_bytes: int

    @property
    def ids_offset(self) -> int:
        return self.header_bytes

    @property
    def macs_offset(self) -> int:
        return self.header_bytes + self.token_ids_bytes

    @property
    def macs_bytes(self) -> int:
        return (1 + self.kv_parts) * self.mac_bytes

    @property
    def kv_offset(self) -> int:
        return self.macs_offset + self.macs_bytes

    @property
    def part_bytes(self) -> int:
        return self.kv_bytes // self.kv_parts

    @property
    def length(self) -> int:
        return self.kv_offset + self.kv_bytes

    def parts_range(self, first: int, end: int) -> tuple[int, int]:
        """(offset, length) in the value of KV parts [first, end)."""
        if not 0 <= first <= end <= self.kv_parts:
            raise ValueError(f"parts [{first}, {end}) of {self.kv_parts}")
        return self.kv_offset + first * self.part_bytes, (end - first) * self.part_bytes

    def part_of(self, offset: int) -> int:
        """The KV part holding the value's byte at offset (past the head)."""
        return (offset - self.kv_offset) // self.part_bytes

    def mac(self, macs: bytes, part: int) -> bytes:
        """The MAC of a part (HEAD: the header's and token ids') from the value's MAC bytes."""
        i = 0 if part == HEAD else 1 + part
        return bytes(macs[i * self.mac_bytes:(i + 1) * self.mac_bytes])


def value_layout(header: ChunkHeader, header_bytes: int) -> ValueLayout:
    """The layout of the value a header starts (header_bytes: its encoded length)."""
    return ValueLayout(header_bytes, header.token_ids_bytes, header.mac_bytes, header.kv_parts, header.kv_bytes)


def chunk_key(salt: bytes | str, user_id: str, context_id: str, chunk_index: int) -> bytes:
    """16-byte storage key of a chunk; without the salt nobody can compute another's key."""
    salt = salt.encode() if isinstance(salt, str) else salt
    h = hashlib.blake2b(digest_size=16, key=salt[:64])
    for part in (user_id.encode(), context_id.encode()):
        h.update(struct.pack("<I", len(part)) + part)
    h.update(struct.pack("<I", chunk_index))
    return h.digest()


def block_key(salt: bytes | str, block_hash: bytes) -> bytes:
    """16-byte storage key of a block named by its hash chain (hostmem.block_hash): equal content
    under one salt is stored once; without the deployment's salt nobody can compute a key."""
    salt = salt.encode() if isinstance(salt, str) else salt
    return hashlib.blake2b(b"kvtb block\0" + block_hash, digest_size=16, key=salt[:64]).digest()


def token_ids_hash(token_ids) -> bytes:
    """blake2b-128 of token ids given as a buffer of uint32 LE or a sequence of ints."""
    if not isinstance(token_ids, (bytes, bytearray, memoryview)):
        token_ids = struct.pack(f"<{len(token_ids)}I", *token_ids)
    return hashlib.blake2b(token_ids, digest_size=16).digest()


def encode_header(header: ChunkHeader) -> bytes:
    """The header bytes, with their own crc32c at the end."""
    tenant, user, context = header.tenant.encode(), header.user_id.encode(), header.context_id.encode()
    if max(len(tenant), len(user), len(context)) > MAX_ID_BYTES:
        raise ChunkFormatError(f"tenant, user or context id longer than {MAX_ID_BYTES} bytes")
    if len(header.parent) not in (0, 16) or len(header.token_ids_hash) != 16:
        raise ChunkFormatError("a chunk's name is 16 bytes and its parent 0 or 16")
    if not 0 <= header.token_start <= header.token_end:
        raise ChunkFormatError(f"bad token range [{header.token_start}, {header.token_end})")
    if header.mac_bytes not in (0, MAC_BYTES):
        raise ChunkFormatError(f"a MAC of {header.mac_bytes} bytes (0 or {MAC_BYTES})")
    if not 1 <= header.kv_parts <= MAX_PARTS or header.kv_bytes % header.kv_parts:
        raise ChunkFormatError(f"{header.kv_bytes} KV bytes do not split into {header.kv_parts} equal parts")
    try:
        dtype = kvd.code(header.kv_dtype) if header.kv_dtype else UNSTATED
        flags = (SHARED if header.shared else 0) | dtype << DTYPE_SHIFT
    except kvd.KvDtypeError as exc:
        raise ChunkFormatError(str(exc)) from exc
    length = _FIXED.size + len(tenant) + len(user) + len(context) + _CRC.size
    body = _FIXED.pack(MAGIC, VERSION, length, header.chunk_index, header.token_start, header.token_end,
                       len(tenant), len(user), len(context), header.kv_bytes, header.token_ids_hash,
                       header.parent.ljust(16, b"\0"), header.generation, flags, header.mac_bytes,
                       header.kv_parts) + tenant + user + context
    return body + _CRC.pack(_crc.crc32c(body))


def decode_header(data) -> tuple[ChunkHeader, int]:
    """(header, its length in bytes) from the leading bytes of a value."""
    data = memoryview(data).cast("B")
    if data.nbytes >= 6 and bytes(data[:4]) == MAGIC and 1 <= data[4] | data[5] << 8 < VERSION:
        raise ChunkFormatError(f"a chunk of an older format version ({data[4] | data[5] << 8}: no MAC, no block "
                               f"name, or one MAC over the whole value): not trusted")
    if data.nbytes < _FIXED.size:
        raise ChunkFormatError(f"value of {data.nbytes} bytes is shorter than a chunk header")
    (magic, version, length, index, start, end, tenant_len, user_len, ctx_len, kv_bytes,
     name, parent, generation, flags, mac_bytes, kv_parts) = _FIXED.unpack_from(data)
    if magic != MAGIC or version != VERSION:
        raise ChunkFormatError(f"not a chunk (magic {bytes(magic)!r}, version {version})")
    if length != _FIXED.size + tenant_len + user_len + ctx_len + _CRC.size or data.nbytes < length:
        raise ChunkFormatError(f"header length {length} inconsistent or truncated")
    body = data[:length - _CRC.size]
    (crc,) = _CRC.unpack_from(data, length - _CRC.size)
    if _crc.crc32c(body) != crc:
        raise ChunkFormatError("header crc32c mismatch")
    pos = _FIXED.size
    try:
        tenant, user, context = (bytes(data[a:b]).decode() for a, b in (
            (pos, pos + tenant_len), (pos + tenant_len, pos + tenant_len + user_len),
            (pos + tenant_len + user_len, pos + tenant_len + user_len + ctx_len)))
    except UnicodeDecodeError as exc:
        raise ChunkFormatError("chunk header ids are not utf-8") from exc
    if end < start or mac_bytes not in (0, MAC_BYTES) or not kv_parts or kv_bytes % kv_parts:
        raise ChunkFormatError(f"bad token range [{start}, {end}), MAC length {mac_bytes} or {kv_parts} KV parts "
                               f"of {kv_bytes} bytes")
    parent = bytes(parent) if index and any(parent) else b""
    try:
        code = flags >> DTYPE_SHIFT & DTYPE_MASK
        dtype = "" if code == UNSTATED else kvd.name_of(code)
    except kvd.KvDtypeError as exc:
        raise ChunkFormatError(f"chunk header: {exc}") from exc
    return ChunkHeader(user, context, index, start, end, kv_bytes, bytes(name), generation, mac_bytes, tenant,
                       parent, bool(flags & SHARED), kv_parts, dtype), length


def value_length(header: ChunkHeader, header_bytes: int) -> int:
    return value_layout(header, header_bytes).length


def chunk_mac(mac_key: bytes, storage_key: bytes, generation: int, part: int = HEAD):
    """A keyed BLAKE3 hasher, started over the chunk's key, generation and part (HEAD, or a KV part's
    number): feed it that part's bytes in order, then take digest(MAC_BYTES). Releases the GIL."""
    h = blake3.blake3(key=mac_key, max_threads=MAC_THREADS)
    h.update(mac_prefix(storage_key, generation) + struct.pack("<I", part))
    return h


def mac_prefix(storage_key: bytes, generation: int) -> bytes:
    """What every MAC of a chunk starts with, before its part's number (4 bytes, little-endian)."""
    return MAC_CONTEXT + bytes(storage_key) + struct.pack("<Q", generation)


def mac_of(mac_key: bytes, storage_key: bytes, generation: int, buffers: Iterable, part: int = HEAD) -> bytes:
    """The MAC of one part given whole (buffers in order): HEAD's is over header and token ids."""
    h = chunk_mac(mac_key, storage_key, generation, part)
    for buf in buffers:
        h.update(buf)
    return h.digest(MAC_BYTES)


def macs_of(mac_key: bytes, storage_key: bytes, generation: int, head: Iterable,
            parts: Sequence[Iterable]) -> bytes:
    """A value's MAC bytes: the head's (header, token ids), then each KV part's (its buffers)."""
    return b"".join([mac_of(mac_key, storage_key, generation, head),
                     *(mac_of(mac_key, storage_key, generation, p, i) for i, p in enumerate(parts))])


def sealed(mac_key: bytes | None, storage_key: bytes, header: ChunkHeader, ids: Sequence,
           kv: Sequence) -> list:
    """A value's buffers in order (header, token ids, MACs, KV), from the token ids' and the KV's buffers
    (views, not copied): the MACs made here under mac_key (None: a value without MACs)."""
    encoded = encode_header(header)
    if not mac_key:
        return [encoded, *ids, *kv]
    part = header.kv_bytes // header.kv_parts
    parts = [cut(kv, p * part, part) for p in range(header.kv_parts)]
    return [encoded, *ids, macs_of(mac_key, storage_key, header.generation, [encoded, *ids], parts), *kv]


def check_value(mac_key: bytes | None, storage_key: bytes, value) -> tuple[ChunkHeader, ValueLayout]:
    """(header, layout) of a whole value once its length and every MAC check out (ChunkFormatError)."""
    value = memoryview(value).cast("B")
    header, header_bytes = decode_header(leading_bytes([value], MAX_HEADER_BYTES))
    layout = value_layout(header, header_bytes)
    if layout.length != value.nbytes:
        raise ChunkFormatError(f"a value of {value.nbytes} bytes, its header says {layout.length}")
    if mac_key:
        if not layout.mac_bytes:
            raise ChunkFormatError("a chunk without MACs: unauthenticated")
        macs = value[layout.macs_offset:layout.kv_offset]
        want = macs_of(mac_key, storage_key, header.generation, [value[:layout.macs_offset]],
                       [[value[o:o + layout.part_bytes]] for o in range(layout.kv_offset, layout.length,
                                                                       layout.part_bytes)])
        if not same_mac(want, macs):
            raise ChunkFormatError("MAC mismatch (forged, moved or damaged)")
    return header, layout


def same_mac(expected: bytes, got) -> bool:
    """Constant-time comparison of two MACs."""
    return hmac.compare_digest(bytes(expected), bytes(got))


def next_generation(last: int, now_ns: int) -> int:
    """A writer's next generation: its clock in ns, and always past the last one it gave."""
    return max(now_ns, last + 1)


def crc32c_of(buffers: Iterable) -> int:
    """crc32c over the concatenation of buffers, without concatenating them."""
    crc = 0
    for buf in buffers:
        crc = _crc.extend(crc, buf)
    return crc


def scatter(frames: Sequence, targets: Sequence[memoryview]) -> int:
    """Copy the byte stream split over `frames` into `targets` in order (one copy); return bytes."""
    copied, fi, fpos = 0, 0, 0
    sources = [memoryview(f).cast("B") for f in frames]
    for target in targets:
        tpos, need = 0, target.nbytes
        while tpos < need:
            if fi >= len(sources):
                raise ChunkFormatError(f"payload ends after {copied} bytes")
            src = sources[fi]
            n = min(need - tpos, src.nbytes - fpos)
            target[tpos:tpos + n] = src[fpos:fpos + n]
            tpos, fpos, copied = tpos + n, fpos + n, copied + n
            if fpos == src.nbytes:
                fi, fpos = fi + 1, 0
    return copied


def cut(frames: Sequence, start: int, nbytes: int) -> list[memoryview]:
    """Bytes [start, start + nbytes) of the frames' byte stream, as views (no copy)."""
    out = []
    for view in skip(frames, start):
        if nbytes <= 0:
            break
        out.append(view[:nbytes])
        nbytes -= min(nbytes, view.nbytes)
    return out


def skip(frames: Sequence, nbytes: int) -> list[memoryview]:
    """The frames' byte stream without its first nbytes, as views (no copy)."""
    out = []
    for frame in frames:
        view = memoryview(frame).cast("B")
        if nbytes >= view.nbytes:
            nbytes -= view.nbytes
            continue
        out.append(view[nbytes:])
        nbytes = 0
    return out


def leading_bytes(frames: Sequence, n: int) -> bytes:
    """The first n bytes of the frames' byte stream (a small copy, for headers)."""
    out = []
    for frame in frames:
        if n <= 0:
            break
        view = memoryview(frame).cast("B")[:n]
        out.append(bytes(view))
        n -= view.nbytes
    return b"".join(out)
