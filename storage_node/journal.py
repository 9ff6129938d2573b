"""Append-only journal of the key index: checksummed, numbered records; replay skips damage.

Record layout (little endian), version 2 (what is written):
    [u32 MAGIC][u32 body length][u32 crc32c(body)][body]
    body:           [u64 sequence number][payload]
Version 1 (journals written before version 2; still read, never written):
    [u32 payload length][u32 crc32c(payload)][payload]
payload PUT:    [u8 type=1][u8 key len][key][u64 value length][u32 value crc32c]
                [u32 extent count][(u64 offset, u64 length) * count]
payload DELETE: [u8 type=2][u8 key len][key]

MAGIC read as a u32 is over MAX_RECORD_BYTES, so no version-1 record starts with it and a file
may hold version-1 records followed by version-2 ones. Sequence numbers count a file's records
from 0 (version-1 records count too), so a gap says how many records a damaged span held.

A bad record followed by a valid one is damage in the middle: the scan resynchronises on the
next record (found by its magic, with a sequence number not below the one expected), keeps it
and everything valid after it, and reports the span. A bad region that no valid record follows
is a torn tail (an append cut short by a crash): it is cut, as it always was.
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

MAGIC = b"kvJ2"
HEADER = struct.Struct("<II")     # version 1: length, crc32c
HEADER2 = struct.Struct("<4sII")  # version 2: magic, length, crc32c
SEQ = struct.Struct("<Q")
PUT, DELETE = 1, 2
_PUT_FIXED = struct.Struct("<QII")
_EXTENT = struct.Struct("<QQ")
MAX_RECORD_BYTES = 1 << 24


@dataclass(frozen=True)
class Record:
    """One journal entry: a PUT binds key to a value's extents; a DELETE unbinds it."""

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


@dataclass
class Scan:
    """What a journal's bytes hold: its valid records, where the torn tail starts, the damage."""

    records: list[Record] = field(default_factory=list)
    end: int = 0  # bytes up to the end of the last valid record
    damage: list[Damage] = field(default_factory=list)
    legacy_records: int = 0  # version-1 records
    next_seq: int = 0


def payload(record: Record) -> bytes:
    """The record's payload (type, key and, for a PUT, the value's length, crc32c and extents)."""
    body = bytes([record.kind, len(record.key)]) + record.key
    if record.kind == PUT:
        body += _PUT_FIXED.pack(record.value_length, record.crc32c, len(record.extents))
        body += b"".join(_EXTENT.pack(*e) for e in record.extents)
    return body


def encode(record: Record, seq: int = 0) -> bytes:
    """The record's bytes as version 2: magic, length, crc32c, sequence number, payload."""
    body = SEQ.pack(seq) + payload(record)
    return HEADER2.pack(MAGIC, len(body), crc32c(body)) + body


def encode_v1(record: Record) -> bytes:
    """The record's bytes as version 1 wrote them (for tests of old journals)."""
    body = payload(record)
    return HEADER.pack(len(body), crc32c(body)) + body


def decode(body: bytes) -> Record:
    """Parse a payload (already checked against its crc); ValueError unless it is exactly a record."""
    if len(body) < 3:
        raise ValueError("record too short")
    kind, key_len = body[0], body[1]
    key = bytes(body[2:2 + key_len])
    pos = 2 + key_len
    if key_len == 0 or len(key) != key_len:
        raise ValueError("bad key length")
    if kind == DELETE and pos == len(body):
        return Record(DELETE, key)
    if kind != PUT or len(body) < pos + _PUT_FIXED.size:
        raise ValueError(f"bad record of type {kind}")
    length, crc, count = _PUT_FIXED.unpack_from(body, pos)
    pos += _PUT_FIXED.size
    if len(body) != pos + count * _EXTENT.size:
        raise ValueError("extent count does not match the record's length")
    extents = tuple(Extent(*_EXTENT.unpack_from(body, pos + i * _EXTENT.size)) for i in range(count))
    return Record(PUT, key, length, crc, extents)


Parsed = tuple[Record, int, "int | None"]  # record, end offset, sequence number (None: version 1)


def parse_at(data: bytes, pos: int) -> Parsed | None:
    """The whole, valid record at pos, or None."""
    n = len(data)
    if data[pos:pos + 4] == MAGIC:
        if pos + HEADER2.size > n:
            return None
        _, length, crc = HEADER2.unpack_from(data, pos)
        start, end = pos + HEADER2.size, pos + HEADER2.size + length
        if length <= SEQ.size or length > MAX_RECORD_BYTES or end > n:
            return None
        body = data[start:end]
        seq = SEQ.unpack_from(body)[0]
        body = body[SEQ.size:]
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

    Version-2 records are found by their magic and must not number below expected_seq (a stray
    old record is no resync point). With legacy (no version-2 record seen yet), every offset is
    tried as a version-1 record too.
    """
    q = pos + 1
    while q < len(data):
        magic = data.find(MAGIC, q)
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


def scan(data: bytes) -> Scan:
    """Every valid record of data in order, the damage skipped in the middle, and the torn tail."""
    out, pos = Scan(), 0
    versioned = False  # a version-2 record was seen: no version-1 record can follow
    while pos < len(data):
        parsed = parse_at(data, pos)
        if parsed is not None and parsed[2] is not None and parsed[2] < out.next_seq:
            parsed = None  # a record repeated or out of order is damage too
        start = pos
        if parsed is None:
            found = resync(data, pos, out.next_seq, legacy=not versioned)
            if found is None:
                break
            pos, parsed = found
        record, end, seq = parsed
        if seq is None:  # version 1 carries none: a damaged span is taken to have held one record
            out.legacy_records += 1
            seq = out.next_seq + (pos > start)
        versioned = versioned or parsed[2] is not None
        if pos > start or seq > out.next_seq:  # bytes skipped, or whole records cut out
            out.damage.append(Damage(start, pos - start, seq - out.next_seq))
        out.records.append(record)
        out.next_seq, pos = seq + 1, end
    out.end = pos
    return out


class Journal:
    """One namespace's journal file.

    Invariant: after open() the file ends with a whole, valid record (a torn tail is cut, and a
    failed append is cut back); damage in the middle stays until the owner rewrites the file,
    a copy of it is kept beside it (`<path>.damaged`). Not thread-safe: one committer appends.
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
        """Open (create) the file, drop a torn tail, skip damage, and return every valid record in order."""
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        with open(self.path, "rb") as f:
            data = f.read()
        found = scan(data)
        self.damage, self.legacy_records = found.damage, found.legacy_records
        if found.damage:
            self._report_damage(found)
        self.torn_bytes = len(data) - found.end
        if self.torn_bytes:
            logger.warning("journal %s: discarding a torn tail of %d bytes at offset %d",
                           self.path, self.torn_bytes, found.end)
            os.ftruncate(self._fd, found.end)
            self._sync()
        self.size_bytes = found.end
        self._next_seq = found.next_seq
        return found.records

    def _report_damage(self, found: Scan) -> None:
        copy = self.path + ".damaged"
        shutil.copyfile(self.path, copy)
        spans = ", ".join(f"{d.nbytes} bytes at offset {d.offset} ({d.records} records)" for d in found.damage)
        kept = len(found.records)
        logger.error("journal %s: damage in the middle: %d records and %d bytes skipped (%s); "
                     "%d valid records kept, the later ones included; a copy is in %s",
                     self.path, self.skipped_records, self.skipped_bytes, spans, kept, copy)

    def append(self, records: Iterable[Record]) -> None:
        """Append records in one write and make them durable (one fsync for the batch)."""
        encoded = [encode(r, self._next_seq + i) for i, r in enumerate(records)]
        data = b"".join(encoded)
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
        self.records_written += len(encoded)
        self._next_seq += len(encoded)

    def _sync(self) -> None:
        if self.fsync_enabled:
            os.fdatasync(self._fd)
            self.fsyncs += 1

    def rewrite(self, records: Iterable[Record]) -> None:
        """Compaction: replace the file by records, atomically (write, fsync, rename, fsync dir)."""
        tmp = self.path + ".compact"
        with open(tmp, "wb") as f:
            f.writelines(encode(record, seq) for seq, record in enumerate(records))
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


def fsync_dir(path: str) -> None:
    """fsync a directory so that a rename or a new file in it is durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
