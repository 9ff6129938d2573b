"""A standing PUT's fire on a real region: the compiled poller's verdict is honoured, a descriptor it
passed is checked again on the PUT thread, and every refusal ends on the block's PUT-done counter.
The data path here records the PUTs it is handed (the real one is the agent process tests')."""
from __future__ import annotations

import threading
import uuid

import numpy as np
import pytest

from hostmem import descriptor
from hostmem.block_hash import block_hash, salt_for
from hostmem.kv_layout import KvLayout
from hostmem.layout_proto import layout_to_proto
from hostmem.region import Region
from smartnic.put_path import PutPath
from smartnic.registrations import Registrations
from smartnic.stats import Stats

L = KvLayout(num_blocks=4, num_layers=2, num_kv_heads=1, block_tokens=8, head_dim=4)


class RecordingDatapath:
    def __init__(self):
        self.headers, self.done = [], threading.Event()

    def put(self, region, header, key, runs, done, kv_parts=1):
        self.headers.append(header)
        self.done.set()
        done(None, None)


@pytest.fixture
def pool():
    region = Region.create(f"kvtb-test-{uuid.uuid4().hex[:8]}", L.region_bytes, L.counter_offset, L.counter_count)
    regions = Registrations()
    reg = regions.register(region.name, region.size, "k", L.counter_offset, L.counter_count, layout_to_proto(L))
    stats, data, ended = Stats(), RecordingDatapath(), []
    path = PutPath(data, "salt", stats, lambda name: True, lambda stored, context, err: ended.append(context))
    yield region, reg, path, data, stats, ended
    path.close()
    regions.close()
    region.close()


def describe(region: Region, block: int, generation: int, user: str = "alice") -> bytes:
    ids = np.arange(L.block_tokens, dtype="<u4") + 100 * block
    region.write(L.token_ids_range(block, L.block_tokens)[0], ids.tobytes())
    name = block_hash(b"", ids.tobytes(), salt_for("default", user))
    d = descriptor.Descriptor(generation, 0, L.block_tokens, name, b"", "default", user, f"ctx-{block}",
                              stamp_ns=123456789)
    region.write(L.descriptor_range(block)[0], descriptor.encode(d))
    return name


def test_peek_reads_the_name_and_stamp_in_place():
    d = descriptor.Descriptor(3, 0, 8, b"n" * 16, b"", "t", "u", "c", stamp_ns=42)
    assert descriptor.peek(descriptor.encode(d)) == (b"n" * 16, 42)
    with pytest.raises(descriptor.DescriptorError):
        descriptor.peek(b"short")


def test_a_descriptor_the_poller_passed_is_put_under_its_name(pool):
    region, reg, path, data, stats, ended = pool
    name = describe(region, 1, 1)
    assert path.fire(reg, 1, 1, verdict="") == 123456789  # the stamp, read in place
    assert data.done.wait(5) and data.headers[0].name == name and data.headers[0].context_id == "ctx-1"
    assert ended == ["ctx-1"] and region.read_counter(L.put_done(1)) == (1, 0)


def test_the_pollers_refusal_ends_on_the_counter_without_a_put(pool):
    region, reg, path, data, stats, _ = pool
    describe(region, 0, 1)
    assert path.fire(reg, 0, 1, verdict="the block hash does not match") is None
    assert region.read_counter(L.put_done(0)) == (0, 1) and not data.headers
    assert stats.snapshot()[1]["errors"]["descriptor_refused"] == 1


def test_a_descriptor_changed_after_the_pollers_check_is_refused_on_the_put_thread(pool):
    region, reg, path, data, stats, _ = pool
    describe(region, 2, 1)
    region.write(L.token_ids_range(2, 1)[0], np.array([9999], "<u4").tobytes())  # the ids no longer fit the name
    assert path.fire(reg, 2, 1, verdict="") is not None  # fired on the poller's word ...
    deadline_counter = L.put_done(2)
    for _ in range(500):
        if sum(region.read_counter(deadline_counter)):
            break
        threading.Event().wait(0.01)
    assert region.read_counter(deadline_counter) == (0, 1) and not data.headers  # ... and refused before the PUT


def test_without_a_verdict_the_descriptor_is_checked_at_the_fire(pool):
    region, reg, path, data, _, _ = pool
    describe(region, 3, 2)
    assert path.fire(reg, 3, 1) is None  # the trigger says generation 1, the descriptor 2: stale
    assert region.read_counter(L.put_done(3)) == (0, 1)
    assert path.fire(reg, 3, 2) == 123456789 and data.done.wait(5)
