"""Journals as versions 1 and 2 wrote them: the fixtures of the tests that replay old journals.

The journal writes version 3 only (storage_node.journal.encode) and still reads all three; these
encoders are what an old node left on disk, kept here and not in the product.
"""
from __future__ import annotations

from storage_node.journal import HEADER, HEADER2, MAGIC, SEQ, Record, crc32c, payload


def encode_v2(record: Record, seq: int = 0) -> bytes:
    """The record's bytes as version 2 wrote them."""
    body = SEQ.pack(seq) + payload(record)
    return HEADER2.pack(MAGIC, len(body), crc32c(body)) + body


def encode_v1(record: Record) -> bytes:
    """The record's bytes as version 1 wrote them."""
    body = payload(record)
    return HEADER.pack(len(body), crc32c(body)) + body
