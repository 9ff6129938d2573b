"""Append-only journal of the key index: checksummed, numbered records; replay skips damage.

Record layout (little endian), version 3 (what is written):
    [u32 MAGIC3][u32 body length][u32 crc32c(body)][body]
    body:           [tag][rest of the payload][tag]
    tag:            [u64 sequence number][u8 type][u8 key len][key][u32 crc32c(the tag before it)]
payload LOST:   [u8 type=3][u8 key len][key] (version 3 only): records of key (of any key when it
                is empty) were lost to a torn tail here; written by open() in the tail's place
Version 2 (still read, never written): [u32 MAGIC][u32 body length][u32 crc32c(body)][body]
    body:           [u64 sequence number][payload]
Version 1 (still read, never written): [u32 payload length][u32 crc32c(payload)][payload]
payload PUT:    [u8 type=1][u8 key len][key][u64 value length][u32 value crc32c]
                [u32 extent count][(u64 offset, u64 length) * count]
payload DELETE: [u8 type=2][u8 key len][key]
The rest of the payload is what follows the key (nothing for a DELETE).

The magics read as a u32 are over MAX_RECORD_BYTES, so no version-1 record starts with one and a
file may hold records of every version in order. Sequence numbers count a file's records from 0
(version-1 records count too), so a gap says how many records a damaged span held.

A bad record followed by a valid one is damage in the middle: the scan resynchronises on the
next record (found by its magic, with a sequence number not below the one expected), keeps it
and everything valid after it, and reports the span. A bad region that no valid record follows
is a torn tail (an append cut short, or the journal cut).

What a damaged span held matters: a lost DELETE or PUT would leave an older value of its key in
the index. A version-3 record carries its key twice, each copy with its own checksum, so one
flipped byte leaves one copy readable; a torn record keeps its first copy when the cut falls
after it, and zeros before a record keep its head (frame and first copy) inside one 512-byte
sector, so a crash's tear never falls in it. The scan reports, for each damaged span and for
the torn tail, the keys its lost records held, or "unknown" when a lost record's key cannot be
read (see lost_keys and tail_keys). open() puts that in the records it returns as LOST markers,
for replay to drop those keys' older values, and writes the torn tail's over the tail.
"""
from __future__ import annotations

import logging
import os
import shutil
import struct
from collections.abc import Iterable
from dataclasses import dataclass, field

from kvtb.crc32c import crc32c
from storage_node.allocator import Extent

logger = logging.getLogger(__name__)

MAGIC = b"kvJ2"                   # version 2
MAGIC3 = b"kvJ3"                  # version 3
HEADER = struct.Struct("<II")     # version 1: length, crc32c
HEADER2 = struct.Struct("<4sII")  # versions 2 and 3: magic, length, crc32c
SEQ = struct.Struct("<Q")
CRC = struct.Struct("<I")
PUT, DELETE = 1, 2
LOST = 3  # records of key (b"": of any key) were lost to damage here
_PUT_FIXED = struct.Struct("<QII")
_EXTENT = struct.Struct("<QQ")
MAX_RECORD_BYTES = 1 << 24
MAX_KEY_BYTES = 16
MAX_SEARCH_BYTES = 1 << 20  # a damaged span longer than this is not searched for keys (unknown)
FILE_MODE = 0o600  # journals name users' keys: their owner's only
SECTOR = 512  # a record's head never crosses a multiple of this: a crash that tears the file there
              # (sector or page) leaves each record either whole up to its first tag or not there


@dataclass(frozen=True)
class Record:
    """One journal entry: a PUT binds key to a value's extents; a DELETE unbinds it; a LOST says
    that records of key (of any key when it is empty) were lost to damage there."""

    kind: int
    key: bytes
    value_length: int = 0
    crc32c: int = 0
    extents: tuple[Extent, ...] = ()


@dataclass(frozen=True)
class Damage:
    """A damaged span in the middle of a journal: its offset, its bytes and the records it took."""

    offset: int
    nbytes: int
    records: int  # from the sequence numbers around it (0: garbage inserted, nothing lost)


Keys = frozenset[bytes] | None  # the keys lost records held; None: unknown (any key)


@dataclass
class Scan:
    """What a journal's bytes hold: its valid records, where the torn tail starts, the damage.

    lost: (position, keys) for each damaged span that took records, position being how many
    valid records come before it, keys those the lost records held (None: unknown).
    tail_lost: the keys the torn tail's records held (empty: no tail, or nothing but zeros).
    """

    records: list[Record] = field(default_factory=list)
    end: int = 0  # bytes up to the end of the last valid record
    damage: list[Damage] = field(default_factory=list)
    legacy_records: int = 0  # records of versions 1 and 2
    next_seq: int = 0
    lost: list[tuple[int, Keys]] = field(default_factory=list)
    tail_lost: Keys = frozenset()

    def with_markers(self) -> list[Record]:
        """The records with LOST markers where records were lost (see markers)."""
        out, done = [], 0
        for position, keys in [*self.lost, (len(self.records), self.tail_lost)]:
            out += self.records[done:position] + markers(keys)
            done = position
        return out


def markers(keys: Keys) -> list[Record]:
    """LOST records for the keys lost records held: one per key, or one with key b"" when unknown."""
    return [Record(LOST, b"")] if keys is None else [Record(LOST, k) for k in sorted(keys)]


def payload(record: Record) -> bytes:
    """The record's payload (type, key and, for a PUT, the value's length, crc32c and extents)."""
    body = bytes([record.kind, len(record.key)]) + record.key
    if record.kind == PUT:
        body += _PUT_FIXED.pack(record.value_length, record.crc32c, len(record.extents))
        body += b"".join(_EXTENT.pack(*e) for e in record.extents)
    return body


def tag(record: Record, seq: int) -> bytes:
    """A version-3 record's checksummed copy of its sequence number, type and key."""
    head = SEQ.pack(seq) + bytes([record.kind, len(record.key)]) + record.key
    return head + CRC.pack(crc32c(head))


def encode(record: Record, seq: int = 0) -> bytes:
    """The record's bytes as version 3: magic, length, crc32c, then tag, rest of payload, tag."""
    if record.kind not in (PUT, DELETE, LOST) or len(record.key) > MAX_KEY_BYTES or (
            not record.key and record.kind != LOST):
        raise ValueError(f"not a record to write: type {record.kind}, key of {len(record.key)} bytes")
    copy = tag(record, seq)
    body = copy + payload(record)[2 + len(record.key):] + copy
    return HEADER2.pack(MAGIC3, len(body), crc32c(body)) + body


def encode_at(records: list[Record], first_seq: int, offset: int) -> bytes:
    """records numbered from first_seq, as written at offset: each one's head (its frame and first
    tag) is kept inside one SECTOR by zeros before it when it would cross a sector's end."""
    out = bytearray()
    for i, record in enumerate(records):
        encoded = encode(record, first_seq + i)
        pad = -(offset + len(out)) % SECTOR
        if pad < head_size(record):
            out += bytes(pad)
        out += encoded
    return bytes(out)


def head_size(record: Record) -> int:
    """The bytes of a version-3 record up to the end of its first tag (its key's first copy)."""
    return HEADER2.size + SEQ.size + 2 + len(record.key) + CRC.size


def padding_at(data: bytes, pos: int) -> int:
    """The length of the zeros encode_at put at pos before a record (0: none)."""
    pad = -pos % SECTOR
    if 0 < pad < HEADER2.size + SEQ.size + 2 + MAX_KEY_BYTES + CRC.size and not data[pos:pos + pad].strip(b"\0"):
        return pad if pos + pad <= len(data) else 0
    return 0


def decode(body: bytes) -> Record:
    """Parse a payload (already checked against its crc); ValueError unless it is exactly a record."""
    if len(body) < 2:
        raise ValueError("record too short")
    kind, key_len = body[0], body[1]
    key = bytes(body[2:2 + key_len])
    pos = 2 + key_len
    if len(key) != key_len or (key_len == 0 and kind != LOST):
        raise ValueError("bad key length")
    if kind in (DELETE, LOST) and pos == len(body):
        return Record(kind, key)
    if kind != PUT or len(body) < pos + _PUT_FIXED.size:
        raise ValueError(f"bad record of type {kind}")
    length, crc, count = _PUT_FIXED.unpack_from(body, pos)
    pos += _PUT_FIXED.size
    if len(body) != pos + count * _EXTENT.size:
        raise ValueError("extent count does not match the record's length")
    extents = tuple(Extent(*_EXTENT.unpack_from(body, pos + i * _EXTENT.size)) for i in range(count))
    return Record(PUT, key, length, crc, extents)


Parsed = tuple[Record, int, "int | None"]  # record, end offset, sequence number (None: version 1)


def tag_at(data: bytes, pos: int) -> tuple[int, int, bytes, int] | None:
    """(sequence number, type, key, end) of a tag at pos whose checksum holds, or None."""
    if pos < 0 or pos + SEQ.size + 2 > len(data):
        return None
    kind, key_len = data[pos + SEQ.size], data[pos + SEQ.size + 1]
    end = pos + SEQ.size + 2 + key_len
    if (kind not in (PUT, DELETE, LOST) or key_len > MAX_KEY_BYTES or (key_len == 0 and kind != LOST)
            or end + CRC.size > len(data)):
        return None
    if CRC.unpack_from(data, end)[0] != crc32c(data[pos:end]):
        return None
    return SEQ.unpack_from(data, pos)[0], kind, bytes(data[end - key_len:end]), end + CRC.size


def _parse_v3(body: bytes) -> tuple[bytes, int]:
    """(payload, sequence number) of a version-3 body whose crc32c holds; ValueError if malformed."""
    front = tag_at(body, 0)
    if front is None:
        raise ValueError("bad tag")
    seq, kind, key, size = front
    if len(body) < 2 * size or body[-size:] != body[:size]:
        raise ValueError("the two tags differ")
    return bytes([kind, len(key)]) + key + body[size:-size], seq


def parse_at(data: bytes, pos: int) -> Parsed | None:
    """The whole, valid record at pos, or None."""
    n = len(data)
    magic = data[pos:pos + 4]
    if magic in (MAGIC, MAGIC3):
        if pos + HEADER2.size > n:
            return None
        _, length, crc = HEADER2.unpack_from(data, pos)
        start, end = pos + HEADER2.size, pos + HEADER2.size + length
        if length <= SEQ.size or length > MAX_RECORD_BYTES or end > n:
            return None
        if crc32c(data[start:end]) != crc:
            return None
        try:
            if magic == MAGIC3:
                body, seq = _parse_v3(data[start:end])
            else:
                body, seq = data[start + SEQ.size:end], SEQ.unpack_from(data, start)[0]
            return decode(body), end, seq
        except (ValueError, struct.error):
            return None
    else:
        if pos + HEADER.size > n:
            return None
        length, crc = HEADER.unpack_from(data, pos)
        start, end = pos + HEADER.size, pos + HEADER.size + length
        if length == 0 or length > MAX_RECORD_BYTES or end > n:
            return None
        body, seq = data[start:end], None
    if crc32c(data[start:end]) != crc:
        return None
    try:
        return decode(body), end, seq
    except (ValueError, struct.error):
        return None


def resync(data: bytes, pos: int, expected_seq: int, legacy: bool) -> tuple[int, Parsed] | None:
    """The first valid record after the bad one at pos: its offset and parse, or None (torn tail).

    Version-2 and 3 records are found by their magic and must not number below expected_seq (a
    stray old record is no resync point). With legacy (no numbered record seen yet), every offset
    is tried as a version-1 record too.
    """
    q = pos + 1
    while q < len(data):
        magic = _find_magic(data, q)
        if legacy:
            for r in range(q, len(data) if magic < 0 else magic):
                parsed = parse_at(data, r)
                if parsed is not None:
                    return r, parsed
        if magic < 0:
            return None
        parsed = parse_at(data, magic)
        if parsed is not None and parsed[2] >= expected_seq:
            return magic, parsed
        q = magic + 1
    return None


def _find_magic(data: bytes, start: int) -> int:
    """The first offset from start holding a version-2 or version-3 magic, or -1."""
    found = [i for i in (data.find(MAGIC, start), data.find(MAGIC3, start)) if i >= 0]
    return min(found) if found else -1


def tags_in(data: bytes, start: int, end: int) -> list[tuple[int, bytes]] | None:
    """(sequence number, key) of every tag whose checksum holds in data[start:end]; None if the
    span is too long to search."""
    if end - start > MAX_SEARCH_BYTES:
        return None
    span = data[start:end]
    return [(t[0], t[2]) for p in range(len(span)) if (t := tag_at(span, p)) is not None]


def lost_keys(data: bytes, start: int, end: int, first_seq: int, next_seq: int) -> Keys:
    """The keys of records first_seq .. next_seq - 1, lost in data[start:end]: read from their tags,
    or None when a record's tag is found nowhere (version 1 and 2 records have none)."""
    if next_seq - first_seq > (end - start) // (HEADER2.size + 2 * (SEQ.size + 2 + CRC.size)):
        return None  # more records lost than the span's bytes could hold: some were cut out whole
    found = tags_in(data, start, end)
    if found is None:
        return None
    held = {(seq, key) for seq, key in found if first_seq <= seq < next_seq}
    if {seq for seq, _ in held} != set(range(first_seq, next_seq)):
        return None
    return frozenset(key for _, key in held)


def tail_keys(data: bytes, start: int, next_seq: int) -> Keys:
    """The keys of the records in the torn tail data[start:], or None when one cannot be read.

    The tail must be version-3 records back to back from start (zeros may pad before each),
    numbered from next_seq on: each whole one ending with a tag that holds, the last one perhaps
    cut short but then with its first tag. A tail of zeros holds no record (what a file system
    can leave after a crash).
    """
    keys, pos, seq = set(), start, next_seq
    while True:
        pos += padding_at(data, pos)
        if not data[pos:].strip(b"\0"):
            return frozenset(keys)
        front = tag_at(data, pos + HEADER2.size)
        front = front if front is not None and front[0] == seq else None
        ends = record_ends(data, pos, front)
        backs = [(end, back) for end in ends if end <= len(data)
                 and (back := _tag_ending_at(data, end)) is not None and back[0] == seq]
        if len(backs) == 1:  # a whole record: the next one starts at its end
            keys.update({backs[0][1][2]} | ({front[2]} if front else set()))
            pos, seq = backs[0][0], seq + 1
            continue
        if front is None or backs:
            return None
        keys.add(front[2])
        agreed = min(ends) if len(ends) == 1 and data[pos:pos + 4] == MAGIC3 else len(data)
        if agreed < len(data):  # its last tag is damaged, but its frame and first tag agree on its end
            pos, seq = agreed, seq + 1
            continue
        if any(end < len(data) for end in ends) or MAGIC3 in data[pos + 4:]:
            return None  # where this record ends, or whether another follows, is unknown
        return frozenset(keys)  # the last record, cut short


def record_ends(data: bytes, pos: int, front: tuple[int, int, bytes, int] | None) -> set[int]:
    """Where the version-3 record at pos may end: by its frame's length, and by its first tag's
    type (and a PUT's extent count); len(data) + 1 for a PUT cut before its count."""
    ends = set()
    if data[pos:pos + 4] == MAGIC3 and pos + HEADER2.size <= len(data):
        length = HEADER2.unpack_from(data, pos)[1]
        if length <= MAX_RECORD_BYTES:
            ends.add(pos + HEADER2.size + length)
    if front is not None:
        size = front[3] - pos - HEADER2.size  # the tag's
        if front[1] != PUT:
            ends.add(front[3] + size)
        elif front[3] + _PUT_FIXED.size <= len(data):
            count = _PUT_FIXED.unpack_from(data, front[3])[2]
            ends.add(front[3] + _PUT_FIXED.size + count * _EXTENT.size + size)
        else:
            ends.add(len(data) + 1)
    return ends


def _tag_ending_at(data: bytes, end: int) -> tuple[int, int, bytes, int] | None:
    """The tag that ends at end and holds, or None."""
    for key_len in range(MAX_KEY_BYTES + 1):
        found = tag_at(data, end - CRC.size - key_len - 2 - SEQ.size)
        if found is not None and found[3] == end:
            return found
    return None


def scan(data: bytes) -> Scan:
    """Every valid record of data in order, the damage skipped in the middle, and the torn tail."""
    out, pos = Scan(), 0
    versioned = False  # a version-2 record was seen: no version-1 record can follow
    while pos < len(data):
        parsed = parse_at(data, pos)
        pad = padding_at(data, pos) if parsed is None else 0
        if pad and (padded := parse_at(data, pos + pad)) is not None:
            pos, parsed = pos + pad, padded
        if parsed is not None and parsed[2] is not None and parsed[2] < out.next_seq:
            parsed = None  # a record repeated or out of order is damage too
        start = pos
        if parsed is None:
            found = resync(data, pos, out.next_seq, legacy=not versioned)
            if found is None:
                break
            pos, parsed = found
        record, end, seq = parsed
        if seq is None or data[pos:pos + 4] == MAGIC:
            out.legacy_records += 1
        if seq is None:  # version 1 carries none: a damaged span is taken to have held one record
            seq = out.next_seq + (pos > start)
        versioned = versioned or parsed[2] is not None
        if pos > start or seq > out.next_seq:  # bytes skipped, or whole records cut out
            out.damage.append(Damage(start, pos - start, seq - out.next_seq))
            if seq > out.next_seq:
                out.lost.append((len(out.records), lost_keys(data, start, pos, out.next_seq, seq)))
        out.records.append(record)
        out.next_seq, pos = seq + 1, end
    out.end = pos
    if pos < len(data):
        out.tail_lost = tail_keys(data, pos, out.next_seq)
    return out


class Journal:
    """One namespace's journal file.

    Invariant: after open() the file ends with a whole, valid record (a torn tail is replaced by
    LOST records of the keys it held, durably, and a failed append is cut back); damage in the
    middle stays until the owner rewrites the file, a copy of it is kept beside it
    (`<path>.damaged`). Not thread-safe: one committer appends.
    """

    def __init__(self, path: str | os.PathLike, fsync: bool = True):
        self.path = os.fspath(path)
        self.fsync_enabled = fsync
        self.records_written = 0
        self.size_bytes = 0
        self.fsyncs = 0
        self.damage: list[Damage] = []
        self.legacy_records = 0
        self.torn_bytes = 0
        self._next_seq = 0
        self._fd = -1

    @property
    def skipped_records(self) -> int:
        return sum(d.records for d in self.damage)

    @property
    def skipped_bytes(self) -> int:
        return sum(d.nbytes for d in self.damage)

    def open(self) -> list[Record]:
        """Open (create) the file, skip damage, replace a torn tail by LOST records, and return every
        valid record in order with LOST markers where damage took records (see Scan.with_markers)."""
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, FILE_MODE)
        with open(self.path, "rb") as f:
            data = f.read()
        found = scan(data)
        self.damage, self.legacy_records = found.damage, found.legacy_records
        if found.damage:
            self._report_damage(found)
        self.torn_bytes = len(data) - found.end
        tail = markers(found.tail_lost) if self.torn_bytes else []
        marks = encode_at(tail, found.next_seq, found.end)
        if self.torn_bytes:
            keys = "any key" if found.tail_lost is None else ", ".join(k.hex() for k in sorted(found.tail_lost))
            logger.warning("journal %s: a torn tail of %d bytes at offset %d replaced by %d LOST records "
                           "(keys whose older values replay drops: %s)",
                           self.path, self.torn_bytes, found.end, len(tail), keys or "none")
            self._replace_tail(found.end, marks)
        self.size_bytes = found.end + len(marks)
        self._next_seq = found.next_seq + len(tail)
        return found.with_markers()

    def _replace_tail(self, offset: int, marks: bytes) -> None:
        """Write marks over the bytes from offset on and cut the file after them, durably: what the
        torn tail took is known at every later open, not only at this one."""
        fd = os.open(self.path, os.O_WRONLY | os.O_CLOEXEC)  # the append fd would ignore the offset
        try:
            if marks:
                os.pwrite(fd, marks, offset)
            os.ftruncate(fd, offset + len(marks))
            if self.fsync_enabled:
                os.fdatasync(fd)
                self.fsyncs += 1
        finally:
            os.close(fd)

    def _report_damage(self, found: Scan) -> None:
        copy = self.path + ".damaged"
        copy_private(self.path, copy)
        spans = ", ".join(f"{d.nbytes} bytes at offset {d.offset} ({d.records} records)" for d in found.damage)
        kept = len(found.records)
        logger.error("journal %s: damage in the middle: %d records and %d bytes skipped (%s); "
                     "%d valid records kept, the later ones included; a copy is in %s",
                     self.path, self.skipped_records, self.skipped_bytes, spans, kept, copy)

    def append(self, records: Iterable[Record]) -> None:
        """Append records in one write and make them durable (one fsync for the batch)."""
        records = list(records)
        data = encode_at(records, self._next_seq, self.size_bytes)
        if not data:
            return
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"short journal write: {written} of {len(data)} bytes")
            self._sync()
        except OSError:
            os.ftruncate(self._fd, self.size_bytes)
            raise
        self.size_bytes += len(data)
        self.records_written += len(records)
        self._next_seq += len(records)

    def _sync(self) -> None:
        if self.fsync_enabled:
            os.fdatasync(self._fd)
            self.fsyncs += 1

    def rewrite(self, records: Iterable[Record]) -> None:
        """Compaction: replace the file by records, atomically (write, fsync, rename, fsync dir)."""
        tmp = self.path + ".compact"
        with open_private(tmp) as f:
            f.write(encode_at(list(records), 0, 0))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        damage = self.damage
        try:
            fsync_dir(os.path.dirname(self.path) or ".")
        finally:  # appends go to the new file, never to the replaced one
            os.close(self._fd)
            self.open()
            self.damage = damage  # what replay found stays reported; the new file has none

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_private(path: str, mode: str = "wb"):
    """A new (or emptied) file only its owner may read (FILE_MODE, whatever the umask), opened for writing."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    os.fchmod(fd, FILE_MODE)  # an older file keeps its mode through O_CREAT
    return os.fdopen(fd, mode)


def copy_private(src: str, dst: str) -> None:
    """Copy src to dst, readable by its owner only."""
    with open(src, "rb") as f, open_private(dst) as out:
        shutil.copyfileobj(f, out)


def fsync_dir(path: str) -> None:
    """fsync a directory so that a rename or a new file in it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
