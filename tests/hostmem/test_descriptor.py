"""A block's descriptor record: round trip, and every way a record can be untrustworthy."""
import pytest

from hostmem import descriptor
from hostmem.descriptor import Descriptor, DescriptorError

D = Descriptor(generation=7, chunk_index=2, token_count=20, hash=b"h" * 16, parent=b"p" * 16,
               tenant="acme", user="alice", context="ctx-1")


def test_round_trip():
    record = descriptor.encode(D)
    assert len(record) == descriptor.DESCRIPTOR_BYTES
    assert descriptor.decode(record, 32) == D
    first = Descriptor(1, 0, 32, b"x" * 16, b"", "t", "u", "c", shared=True)
    assert descriptor.decode(descriptor.encode(first), 32) == first


def test_a_torn_or_damaged_record_is_refused():
    record = bytearray(descriptor.encode(D))
    for position in (0, 10, 60, 100, len(record) - 1):
        bad = bytearray(record)
        bad[position] ^= 0x40
        with pytest.raises(DescriptorError):
            descriptor.decode(bytes(bad), 32)
    with pytest.raises(DescriptorError):
        descriptor.decode(bytes(descriptor.DESCRIPTOR_BYTES), 32)  # never written


def test_a_record_that_does_not_fit_the_block_is_refused():
    with pytest.raises(DescriptorError, match="token count"):
        descriptor.decode(descriptor.encode(D), 16)  # more tokens than a block holds
    with pytest.raises(DescriptorError):
        Descriptor(1, 0, 4, b"h" * 16, b"", "t", "u" * 200, "c")
    with pytest.raises(DescriptorError, match="parent"):
        descriptor.decode(descriptor.encode(Descriptor(1, 3, 4, b"h" * 16, b"", "t", "u", "c")), 32)
