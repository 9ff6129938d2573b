"""A block's descriptor record: round trip, the engine's fast writer, and every way a record can be
untrustworthy."""
import dataclasses
import struct
import time

import google_crc32c
import pytest

from hostmem import descriptor
from hostmem.descriptor import Descriptor, DescriptorError, Writer

D = Descriptor(generation=7, chunk_index=2, token_count=20, hash=b"h" * 16, parent=b"p" * 16,
               tenant="acme", user="alice", context="ctx-1", stamp_ns=123_456_789)
USED = 64 + len("acme") + len("alice") + len("ctx-1")  # head, owner lengths, ids: what the crc covers


def test_round_trip():
    record = descriptor.encode(D)
    assert len(record) == descriptor.DESCRIPTOR_BYTES
    assert descriptor.decode(record, 32) == D
    first = Descriptor(1, 0, 32, b"x" * 16, b"", "t", "u", "c", shared=True)
    assert descriptor.decode(descriptor.encode(first), 32) == first
    assert first.stamp_ns == 0  # not stamped


def test_the_writer_packs_the_same_record_into_a_region_whatever_was_there_before():
    buffer = memoryview(bytearray(b"\xff" * 3 * descriptor.DESCRIPTOR_BYTES))
    writer = Writer(buffer, max_owners=1)
    long_owner = Descriptor(9, 1, 4, b"a" * 16, b"b" * 16, "t" * 60, "u" * 120, "c" * 240, shared=True)
    for d in (long_owner, D):  # a shorter record over a longer one: the stale tail is never read
        writer.write(512, d.generation, d.chunk_index, d.token_count, d.hash, d.parent, d.tenant, d.user, d.context,
                     d.shared)
        before = time.monotonic_ns()
        writer.stamp(512)
        got = descriptor.decode(buffer[512:1024], 32)
        assert before <= got.stamp_ns <= time.monotonic_ns()  # stamped now, outside the crc
        assert dataclasses.replace(got, stamp_ns=d.stamp_ns) == d
        used = 64 + len(d.tenant) + len(d.user) + len(d.context)
        assert bytes(buffer[512:512 + used]) == descriptor.encode(d)[:used]
    assert bytes(buffer[:512]) == b"\xff" * 512 and bytes(buffer[1024:]) == b"\xff" * 512  # nothing else written
    assert len(writer._owners) == 1  # bounded


def test_a_torn_or_damaged_record_is_refused():
    record = bytearray(descriptor.encode(D))
    for position in (0, 4, 10, 20, 30, 40, 60, 70, USED - 1, len(record) - 1):  # not the stamp: it names nothing
        bad = bytearray(record)
        bad[position] ^= 0x40
        with pytest.raises(DescriptorError):
            descriptor.decode(bytes(bad), 32)
    with pytest.raises(DescriptorError):
        descriptor.decode(bytes(descriptor.DESCRIPTOR_BYTES), 32)  # never written
    restamped = bytearray(record)
    restamped[descriptor.STAMP_OFFSET] ^= 0x40  # the stamp times the store; it names nothing
    assert descriptor.decode(bytes(restamped), 32) == dataclasses.replace(D, stamp_ns=D.stamp_ns ^ 0x40)
    with pytest.raises(DescriptorError):
        descriptor.decode(record[:-1], 32)  # not a whole record
    torn = bytearray(record)
    torn[:USED // 2] = descriptor.encode(Descriptor(8, 2, 20, b"g" * 16, b"p" * 16, "acme", "alice", "ctx-1"))[:USED // 2]
    with pytest.raises(DescriptorError, match="crc32c"):  # half of a newer record over an older one
        descriptor.decode(bytes(torn), 32)


def _forged(**fields) -> bytes:
    """A record whose crc is right but whose fields are what a buggy or hostile writer chose."""
    values = dict(magic=b"KVBD", version=descriptor.VERSION, flags=0, generation=7, index=2, count=20,
                  parent_len=16, hash=b"h" * 16, parent=b"p" * 16, owner=(4, 5, 5), ids=b"acmealicectx-1")
    values.update(fields)
    body = struct.pack("<4sHHQIIH16s16s", values["magic"], values["version"], values["flags"], values["generation"],
                       values["index"], values["count"], values["parent_len"], values["hash"],
                       values["parent"]) + struct.pack("<HHH", *values["owner"]) + values["ids"]
    return body.ljust(descriptor.CRC_OFFSET, b"\0") + struct.pack("<I", google_crc32c.value(body))


def test_forged_fields_with_a_valid_crc_are_refused():
    assert descriptor.decode(_forged(), 32) == Descriptor(7, 2, 20, b"h" * 16, b"p" * 16, "acme", "alice", "ctx-1")
    cases = {"not a descriptor": dict(magic=b"KVBX"), "version": dict(version=1),
             "token count": dict(count=0), "out of range": dict(index=2**32 - 1),
             "generation 0": dict(generation=0), "only block 0": dict(index=0),
             "lengths": dict(parent_len=8), "utf-8": dict(ids=b"acm\xffalicectx-1")}
    for message, fields in cases.items():
        with pytest.raises(DescriptorError, match=message):
            descriptor.decode(_forged(**fields), 32)
    with pytest.raises(DescriptorError, match="lengths"):  # ids longer than a record may hold
        descriptor.decode(_forged(owner=(65, 5, 5), ids=b"a" * 75), 32)
    with pytest.raises(DescriptorError, match="token count"):
        descriptor.decode(_forged(count=33), 32)  # more tokens than a block holds


def test_a_record_that_does_not_fit_the_block_is_refused():
    with pytest.raises(DescriptorError, match="token count"):
        descriptor.decode(descriptor.encode(D), 16)  # more tokens than a block holds
    with pytest.raises(DescriptorError):
        Descriptor(1, 0, 4, b"h" * 16, b"", "t", "u" * 200, "c")
    with pytest.raises(DescriptorError):
        Descriptor(1, -1, 4, b"h" * 16, b"", "t", "u", "c")
    with pytest.raises(DescriptorError, match="parent"):
        descriptor.decode(descriptor.encode(Descriptor(1, 3, 4, b"h" * 16, b"", "t", "u", "c")), 32)
