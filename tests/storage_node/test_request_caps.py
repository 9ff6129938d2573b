"""Every request is bounded (no sockets): ranges per range read (merged first), keys per List, bytes per
response and bytes read on the node, a capsule's size and frames, and a message before authentication;
over a cap the command is refused whole with "invalid field" and the node goes on serving."""
from __future__ import annotations

import time

import pytest

from fabric import status as st
from fabric.auth import FabricSecurity
from kvtb_proto import nvmeof_pb2 as pb
from storage_node import ranges as rg
from storage_node.commands import MAX_FRAMES, CommandProcessor
from storage_node.handlers import RequestLimits, _check_retrieve
from storage_node.stats import Stats

from .conftest import GOOD_HOST, Harness, settings_for
from .test_commands import KV, assert_still_serving, status, store


def ranges_cmd(h: Harness, ranges, **extra):
    return h.command(command_set=KV, opcode=pb.KV_RETRIEVE_RANGES, namespace_id=1,
                     ranges=[pb.ValueRange(key=k, offset=o, length=n) for k, o, n in ranges], **extra)


@pytest.fixture
def capped(tmp_path):
    h = Harness(settings_for(tmp_path, max_ranges=16, max_list_keys=1000, max_value_bytes=64 << 20,
                             max_response_bytes=64 << 20, max_read_bytes=64 << 20))
    h.connect()
    yield h
    h.close()


def test_ranges_merge_where_they_touch_or_overlap():
    assert rg.merged([(10, 5), (0, 10), (12, 10), (40, 1), (30, 0)]) == [(0, 22), (30, 30), (40, 41)]
    class R:
        def __init__(self, key, offset, length):
            self.key, self.offset, self.length = key, offset, length
    asked = [R(b"a", i, 1) for i in range(4096)] + [R(b"b", i * 2, 1) for i in range(10)]
    assert rg.merged_count(asked) == 1 + 10
    assert rg.covering(asked) == {b"a": (0, 4096), b"b": (0, 19)}


def test_ranges_over_the_cap_once_merged_are_refused_and_adjacent_ones_are_not(capped):
    value = bytes(range(256)) * 64  # 16 KiB
    assert status(store(capped, b"v", value)) == st.SUCCESS
    start = time.monotonic()
    rsp, frames = ranges_cmd(capped, [(b"v", i * 2, 1) for i in range(17)])  # 17 apart: over 16
    assert status(rsp) == st.INVALID_FIELD and "merged" in rsp.message and not frames
    rsp, frames = ranges_cmd(capped, [(b"v", i, 1) for i in range(64)])  # 64 adjacent: one once merged
    assert status(rsp) == st.SUCCESS and b"".join(bytes(f) for f in frames) == value[:64]
    rsp, _ = ranges_cmd(capped, [(b"v", i, 1) for i in range(16 * 4 + 1)])  # the list as sent: 4x at most
    assert status(rsp) == st.INVALID_FIELD
    assert time.monotonic() - start < 2
    assert_still_serving(capped)


def test_a_range_read_answers_and_reads_within_its_bytes(capped):
    big = bytes(range(256)) * (8 << 12)  # 8 MiB
    assert status(store(capped, b"big", big)) == st.SUCCESS
    rsp, _ = ranges_cmd(capped, [(b"big", 0, 8 << 20)] * 9, skip_guard_check=True)  # 72 MiB answered
    assert status(rsp) == st.INVALID_FIELD and "one response" in rsp.message
    # with the guard check each value is read whole: 9 keys of 8 MiB is 72 MiB read for 9 bytes answered
    for i in range(9):
        assert status(store(capped, b"big%d" % i, big)) == st.SUCCESS
    rsp, _ = ranges_cmd(capped, [(b"big%d" % i, 0, 1) for i in range(9)])
    assert status(rsp) == st.INVALID_FIELD and "read or check" in rsp.message
    rsp, frames = ranges_cmd(capped, [(b"big%d" % i, 0, 1) for i in range(7)])
    assert status(rsp) == st.SUCCESS and [bytes(f) for f in frames] == [b"\0"] * 7
    assert_still_serving(capped)


def test_a_list_over_the_cap_is_refused(capped):
    rsp, _ = capped.command(command_set=KV, opcode=pb.KV_LIST, namespace_id=1, max_keys=1001)
    assert status(rsp) == st.INVALID_FIELD
    rsp, _ = capped.command(command_set=KV, opcode=pb.KV_LIST, namespace_id=1, max_keys=1000)
    assert status(rsp) == st.SUCCESS


def test_a_retrieve_over_the_response_cap_is_refused(capped):
    assert status(store(capped, b"v", b"x" * 5000)) == st.SUCCESS
    ns = capped.subsystem.namespaces[1]
    small = RequestLimits(max_response_bytes=4096)
    with pytest.raises(Exception) as err:
        _check_retrieve(pb.CommandCapsule(key=b"v"), ns, 0, small)
    assert err.value.status == st.INVALID_FIELD
    _check_retrieve(pb.CommandCapsule(key=b"v", value_length=4096), ns, 0, small)  # a part of it is fine
    _check_retrieve(pb.CommandCapsule(key=b"v", value_offset=1000), ns, 0, small)


def test_a_capsule_too_large_or_of_too_many_frames_is_refused_before_it_is_read(capped):
    rsp = capped.processor.receive(b"s1", [memoryview(b"\x08" * (300 << 10))])[0].capsule
    assert status(rsp) == st.INVALID_FIELD and "at most" in rsp.message
    header = pb.CommandCapsule(command_id=7, command_set=KV, opcode=pb.KV_EXIST, namespace_id=1,
                               key=b"k").SerializeToString()
    rsp = capped.processor.receive(b"s1", [memoryview(header)] + [memoryview(b"x")] * (MAX_FRAMES + 1))[0].capsule
    assert status(rsp) == st.INVALID_FIELD
    assert_still_serving(capped)


def test_a_large_message_before_authentication_is_refused_unread(tmp_path):
    h = Harness(settings_for(tmp_path))
    try:
        h.processor = CommandProcessor(h.subsystem, h.executor, lambda c, r: h.done.put((c, r)), Stats(),
                                       FabricSecurity("auth", b"m" * 32))
        connect = pb.CommandCapsule(command_id=1, command_set=pb.FABRICS, opcode=pb.FABRICS_CONNECT,
                                    host_nqn=GOOD_HOST).SerializeToString()
        rsp = h.processor.receive(b"s1", [memoryview(connect), memoryview(b"\0" * 5000)], "10.0.0.5")[0].capsule
        assert status(rsp) == st.INVALID_FIELD and "before authentication" in rsp.message
        assert h.processor.sessions.half_open == 0
        rsp = h.processor.receive(b"s1", [memoryview(connect)], "10.0.0.5")[0].capsule
        assert status(rsp) == st.SUCCESS and rsp.authentication_required
        assert h.processor.sessions.half_open_of("10.0.0.5") == 1
        # over the peer's rate: dropped unanswered, and no state is kept for them
        replies = [h.processor.receive(b"s%d" % i, [memoryview(connect)], "10.0.0.5") for i in range(2000)]
        assert sum(1 for r in replies if not r) > 1000 and h.processor.sessions.limited > 1000
        counts = h.processor.stats.snapshot()["commands"]
        assert counts[("pre_auth_message", "rate limited")] == h.processor.sessions.limited
        assert counts[("handshake", "evicted")] == h.processor.sessions.evicted > 0
        assert h.processor.sessions.half_open_of("10.0.0.5") <= h.processor.sessions.limits.max_half_open_per_peer
        # another address is not held back
        rsp = h.processor.receive(b"other", [memoryview(connect)], "10.0.0.6")[0].capsule
        assert status(rsp) == st.SUCCESS
    finally:
        h.close()


def test_connects_without_authentication_keep_the_session_table_bounded(harness):
    from storage_node.subsystem import MAX_SESSIONS_PER_HOST
    for i in range(MAX_SESSIONS_PER_HOST * 4):
        assert status(harness.connect(session=b"s%d" % i)) == st.SUCCESS
    assert len(harness.subsystem._sessions) == MAX_SESSIONS_PER_HOST
    (controller,) = harness.subsystem.controllers()
    assert len(controller.sessions) == MAX_SESSIONS_PER_HOST
    newest = b"s%d" % (MAX_SESSIONS_PER_HOST * 4 - 1)
    rsp, _ = harness.command(session=newest, command_set=KV, opcode=pb.KV_EXIST, namespace_id=1, key=b"k")
    assert status(rsp) == st.KEY_DOES_NOT_EXIST
    rsp, _ = harness.command(session=b"s0", command_set=KV, opcode=pb.KV_EXIST, namespace_id=1, key=b"k")
    assert status(rsp) == st.CONNECT_INVALID_HOST
