"""Append-only journal of the key index: checksummed records, replay, torn tail discarded.

Record layout (little endian):
    [u32 payload length][u32 crc32c(payload)][payload]
    payload PUT:    [u8 type=1][u8 key len][key][u64 value length][u32 value crc32c]
                    [u32 extent count][(u64 offset, u64 length) * count]
    payload DELETE: [u8 type=2][u8 key len][key]
"""
from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterable
from dataclasses import dataclass

from kvtb.crc32c import crc32c
from storage_node.allocator import Extent

logger = logging.getLogger(__name__)

HEADER = struct.Struct("<II")
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


def encode(record: Record) -> bytes:
    """The record's bytes, framed with length and crc32c."""
    body = bytes([record.kind, len(record.key)]) + record.key
    if record.kind == PUT:
        body += _PUT_FIXED.pack(record.value_length, record.crc32c, len(record.extents))
        body += b"".join(_EXTENT.pack(*e) for e in record.extents)
    return HEADER.pack(len(body), crc32c(body)) + body


def decode(body: bytes) -> Record:
    """Parse a record payload (already checked against its crc)."""
    kind, key_len = body[0], body[1]
    key = bytes(body[2:2 + key_len])
    if kind == DELETE:
        return Record(DELETE, key)
    if kind != PUT:
        raise ValueError(f"unknown record type {kind}")
    pos = 2 + key_len
    length, crc, count = _PUT_FIXED.unpack_from(body, pos)
    pos += _PUT_FIXED.size
    extents = tuple(Extent(*_EXTENT.unpack_from(body, pos + i * _EXTENT.size)) for i in range(count))
    return Record(PUT, key, length, crc, extents)


def scan(data: bytes) -> tuple[list[Record], int]:
    """The valid records at the start of data and the byte length they span (the rest is torn)."""
    records, pos = [], 0
    while pos + HEADER.size <= len(data):
        length, crc = HEADER.unpack_from(data, pos)
        end = pos + HEADER.size + length
        if length == 0 or length > MAX_RECORD_BYTES or end > len(data):
            break
        body = data[pos + HEADER.size:end]
        if crc32c(body) != crc:
            break
        try:
            records.append(decode(body))
        except (ValueError, struct.error, IndexError):
            break
        pos = end
    return records, pos


class Journal:
    """One namespace's journal file.

    Invariant: the file holds only whole, valid records (a torn tail is cut at open, and a
    failed append is cut back). Not thread-safe: one committer appends.
    """

    def __init__(self, path: str | os.PathLike, fsync: bool = True):
        self.path = os.fspath(path)
        self.fsync_enabled = fsync
        self.records_written = 0
        self.size_bytes = 0
        self.fsyncs = 0
        self._fd = -1

    def open(self) -> list[Record]:
        """Open (create) the file, drop a torn tail, and return every valid record in order."""
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o644)
        with open(self.path, "rb") as f:
            data = f.read()
        records, good = scan(data)
        if good < len(data):
            logger.warning("journal %s: discarding a torn tail of %d bytes", self.path, len(data) - good)
            os.ftruncate(self._fd, good)
            self._sync()
        self.size_bytes = good
        return records

    def append(self, records: Iterable[Record]) -> None:
        """Append records in one write and make them durable (one fsync for the batch)."""
        encoded = [encode(r) for r in records]
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

    def _sync(self) -> None:
        if self.fsync_enabled:
            os.fdatasync(self._fd)
            self.fsyncs += 1

    def rewrite(self, records: Iterable[Record]) -> None:
        """Compaction: replace the file by records, atomically (write, fsync, rename, fsync dir)."""
        tmp = self.path + ".compact"
        with open(tmp, "wb") as f:
            f.writelines(encode(record) for record in records)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fsync_dir(os.path.dirname(self.path) or ".")
        os.close(self._fd)
        self.open()

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
