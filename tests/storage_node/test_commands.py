"""Each malformed input gets its NVMe status and the queue goes on serving (no sockets)."""
import pytest

from kvtb.crc32c import crc32c
from kvtb_proto import nvmeof_pb2 as pb
from fabric import status as st

from .conftest import GOOD_HOST, Harness, settings_for

KV, NVM = pb.KEY_VALUE, pb.NVM


def status(capsule) -> st.Status:
    return st.Status(capsule.status_code_type, capsule.status_code)


def store(h: Harness, key=b"k", value=b"v" * 100, **extra):
    return h.command([value], command_set=KV, opcode=pb.KV_STORE, namespace_id=1, key=key,
                     value_length=len(value), crc32c=crc32c(value), has_crc32c=True, **extra)[0]


def assert_still_serving(h: Harness):
    value = bytes(range(256)) * 17
    assert status(store(h, b"good", value)) == st.SUCCESS
    rsp, frames = h.command(command_set=KV, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"good")
    assert status(rsp) == st.SUCCESS and bytes(frames[0]) == value


MALFORMED = {
    "unparsable header": (lambda h: h.send(b"\xff\xff\xff garbage")[0], st.INVALID_FIELD),
    "empty message": (lambda h: h.processor.receive(b"s1", [])[0].capsule, st.INVALID_FIELD),
    "unknown opcode": (lambda h: h.command(command_set=KV, opcode=0x7F, namespace_id=1, key=b"k")[0],
                       st.INVALID_OPCODE),
    "unknown command set": (lambda h: h.command(command_set=9, opcode=1, namespace_id=1)[0],
                            st.INVALID_OPCODE),
    "block opcode on a key-value namespace": (
        lambda h: h.command(command_set=NVM, opcode=pb.NVM_READ, namespace_id=1, number_of_lbas=1)[0],
        st.INVALID_OPCODE),
    "namespace 0": (lambda h: h.command(command_set=KV, opcode=pb.KV_EXIST, namespace_id=0, key=b"k")[0],
                    st.INVALID_NAMESPACE),
    "unknown namespace": (
        lambda h: h.command(command_set=KV, opcode=pb.KV_EXIST, namespace_id=99, key=b"k")[0],
        st.INVALID_NAMESPACE),
    "key over 16 bytes": (lambda h: store(h, key=b"k" * 17), st.INVALID_KEY_SIZE),
    "empty key": (lambda h: h.command(command_set=KV, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"")[0],
                  st.INVALID_KEY_SIZE),
    "payload shorter than the header says": (
        lambda h: h.command([b"abc"], command_set=KV, opcode=pb.KV_STORE, namespace_id=1, key=b"k",
                            value_length=10)[0], st.INVALID_FIELD),
    "payload on a retrieve": (
        lambda h: h.command([b"abc"], command_set=KV, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"k")[0],
        st.INVALID_FIELD),
    "payload crc mismatch": (
        lambda h: h.command([b"abc"], command_set=KV, opcode=pb.KV_STORE, namespace_id=1, key=b"k",
                            value_length=3, crc32c=crc32c(b"abd"), has_crc32c=True)[0], st.GUARD_CHECK_ERROR),
    "both store conditions": (lambda h: store(h, store_only_if_absent=True, store_only_if_present=True),
                              st.INVALID_FIELD),
    "zero LBAs": (
        lambda h: h.command(command_set=NVM, opcode=pb.NVM_READ, namespace_id=2, number_of_lbas=0)[0],
        st.INVALID_FIELD),
    "LBA range past the namespace": (
        lambda h: h.command(command_set=NVM, opcode=pb.NVM_READ, namespace_id=2,
                            starting_lba=(256 << 20) // 4096 - 1, number_of_lbas=2)[0], st.LBA_OUT_OF_RANGE),
    "write payload not nlb * 4096": (
        lambda h: h.command([b"x" * 4095], command_set=NVM, opcode=pb.NVM_WRITE, namespace_id=2,
                            number_of_lbas=1)[0], st.INVALID_FIELD),
    "retrieve of a missing key": (
        lambda h: h.command(command_set=KV, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"missing")[0],
        st.KEY_DOES_NOT_EXIST),
    "unknown fabrics opcode": (lambda h: h.command(command_set=pb.FABRICS, opcode=0x55)[0],
                               st.INVALID_OPCODE),
    "data PDUs under 4096 bytes": (
        lambda h: h.command(command_set=KV, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"k",
                            data_pdu_bytes=100)[0], st.INVALID_FIELD),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_malformed_input_gets_its_status_and_the_queue_goes_on(harness, kind):
    harness.connect()
    send, expected = MALFORMED[kind]
    assert status(send(harness)) == expected
    assert_still_serving(harness)


def test_command_id_conflict_while_outstanding(harness):
    harness.connect()
    controller = harness.subsystem.controller_for(b"s1")
    controller.queue.submit(42)  # pretend command 42 is executing
    rsp = store(harness, command_id=42)
    assert status(rsp) == st.COMMAND_ID_CONFLICT and rsp.sq_id == controller.qid
    controller.queue.complete(42)
    assert status(store(harness, command_id=42)) == st.SUCCESS


def test_unconnected_or_refused_host_is_never_executed(tmp_path):
    h = Harness(settings_for(tmp_path, allowed_hosts={GOOD_HOST: [1]}))
    try:
        assert status(store(h)) == st.CONNECT_INVALID_HOST          # no Connect yet
        assert status(h.connect("nqn.2026-11.org.evil:host")) == st.CONNECT_INVALID_HOST
        assert status(store(h)) == st.CONNECT_INVALID_HOST
        assert h.subsystem.namespaces[1].key_count == 0
        assert status(h.connect()) == st.SUCCESS
        rsp = h.command(command_set=NVM, opcode=pb.NVM_READ, namespace_id=2, number_of_lbas=1)[0]
        assert status(rsp) == st.INVALID_NAMESPACE                  # not in this host's access list
        assert_still_serving(h)
    finally:
        h.close()


def test_store_conditions_exist_list_delete_flush(harness):
    harness.connect()
    assert status(store(harness, b"a", store_only_if_present=True)) == st.KEY_DOES_NOT_EXIST
    assert status(store(harness, b"a", store_only_if_absent=True)) == st.SUCCESS
    assert status(store(harness, b"a", store_only_if_absent=True)) == st.KEY_EXISTS
    assert status(store(harness, b"b")) == st.SUCCESS
    rsp = harness.command(command_set=KV, opcode=pb.KV_EXIST, namespace_id=1, key=b"a")[0]
    assert status(rsp) == st.SUCCESS and rsp.exists
    rsp = harness.command(command_set=KV, opcode=pb.KV_LIST, namespace_id=1, list_start_key=b"a")[0]
    assert list(rsp.keys) == [b"b"]
    delete = {"command_set": KV, "opcode": pb.KV_DELETE, "namespace_id": 1, "key": b"a"}
    assert status(harness.command(**delete)[0]) == st.SUCCESS
    assert status(harness.command(**delete)[0]) == st.KEY_DOES_NOT_EXIST
    assert status(harness.command(command_set=NVM, opcode=pb.NVM_FLUSH, namespace_id=1)[0]) == st.SUCCESS


def test_block_write_read_deallocate(harness):
    harness.connect()
    data = bytes(range(256)) * 32  # 2 LBAs
    rsp = harness.command([data[:5000], data[5000:]], command_set=NVM, opcode=pb.NVM_WRITE, namespace_id=2,
                          starting_lba=7, number_of_lbas=2)[0]
    assert status(rsp) == st.SUCCESS
    rsp, frames = harness.command(command_set=NVM, opcode=pb.NVM_READ, namespace_id=2, starting_lba=7,
                                  number_of_lbas=2)
    assert bytes(frames[0]) == data and rsp.crc32c == crc32c(data)
    harness.command(command_set=NVM, opcode=pb.NVM_DATASET_MANAGEMENT, namespace_id=2, starting_lba=7,
                    number_of_lbas=1)
    _, frames = harness.command(command_set=NVM, opcode=pb.NVM_READ, namespace_id=2, starting_lba=7,
                                number_of_lbas=2)
    assert bytes(frames[0]) == bytes(4096) + data[4096:]


class ManualExecutor:
    """Holds submitted work until the test runs it."""

    def __init__(self):
        self.jobs = []

    def submit(self, fn, *args):
        self.jobs.append((fn, args))

    def run_next(self):
        fn, args = self.jobs.pop(0)
        fn(*args)


def test_a_full_queue_holds_commands_back_and_starts_them_as_slots_free(tmp_path):
    h = Harness(settings_for(tmp_path, queue_depth=1))
    try:
        h.connect()
        h.processor.executor = manual = ManualExecutor()
        read = pb.CommandCapsule(command_set=NVM, opcode=pb.NVM_READ, namespace_id=2, number_of_lbas=64)
        for cid in (1, 2):
            read.command_id = cid
            assert h.processor.receive(b"s1", [memoryview(read.SerializeToString())]) == []
        queue = h.subsystem.controller_for(b"s1").queue
        assert len(manual.jobs) == 1 and queue.waiting == 1       # the second waits for a slot
        manual.run_next()
        replies = h.processor.complete(*h.done.get(timeout=5))
        assert [r.capsule.command_id for r in replies] == [1] and len(manual.jobs) == 1
        manual.run_next()
        replies = h.processor.complete(*h.done.get(timeout=5))
        assert [r.capsule.command_id for r in replies] == [2] and queue.outstanding == 0
        assert len(replies[0].frames[0]) == 64 * 4096
    finally:
        h.close()


def test_a_retrieve_asked_in_data_pdus_sends_them_in_order_then_the_response(harness):
    harness.connect()
    value = bytes(range(256)) * 100  # 25,600 bytes: PDUs of 8,192, 8,192, 8,192 and 1,024
    assert status(store(harness, b"big", value)) == st.SUCCESS
    capsule = pb.CommandCapsule(command_set=KV, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"big",
                                command_id=77, data_pdu_bytes=8192)
    replies = harness.replies(capsule.SerializeToString())
    assert [(r.capsule.command_id, r.capsule.data_pdu, r.capsule.data_offset) for r in replies] == \
        [(77, True, 0), (77, True, 8192), (77, True, 16384), (77, False, 24576)]
    assert b"".join(bytes(f) for r in replies for f in r.frames) == value
    last = replies[-1].capsule
    assert status(last) == st.SUCCESS and (last.value_length, last.crc32c) == (len(value), crc32c(value))
    # a value that fits in one PDU, and a failed retrieve, come as the response alone
    for key, fits in ((b"big", 1 << 20), (b"missing", 8192)):
        capsule.key, capsule.data_pdu_bytes = key, fits
        (reply,) = harness.replies(capsule.SerializeToString())
        assert not reply.capsule.data_pdu and reply.capsule.data_offset == 0
    assert_still_serving(harness)


def test_ranges_of_several_values_in_one_command_each_succeed_or_fail_on_their_own(harness):
    h = harness
    h.connect()
    values = {b"a": bytes(range(256)) * 40, b"b": bytes(range(255, -1, -1)) * 9000}  # copied, and mapped
    for key, value in values.items():
        assert status(store(h, key, value)) == st.SUCCESS
    ranges = [pb.ValueRange(key=b"a", offset=10, length=100), pb.ValueRange(key=b"nope", offset=0, length=5),
              pb.ValueRange(key=b"b", offset=5000, length=300_000), pb.ValueRange(key=b"a", offset=10_000, length=241),
              pb.ValueRange(key=b"b", offset=0, length=7)]
    rsp, frames = h.command(command_set=KV, opcode=pb.KV_RETRIEVE_RANGES, namespace_id=1, ranges=ranges,
                            skip_guard_check=True)
    assert status(rsp) == st.SUCCESS
    assert [st.Status(s >> 8, s & 0xFF) for s in rsp.range_status] == [
        st.SUCCESS, st.KEY_DOES_NOT_EXIST, st.SUCCESS, st.INVALID_FIELD, st.SUCCESS]
    assert "range 1" in rsp.message
    want = [values[r.key][r.offset:r.offset + r.length] for r in ranges if r.key != b"nope" and r.length != 241]
    assert [bytes(f) for f in frames] == want
    # in data PDUs: none spans two ranges, each at its offset in the ranges asked for, back to back
    h.next_cid += 1
    replies = h.replies(pb.CommandCapsule(command_id=h.next_cid, command_set=KV, opcode=pb.KV_RETRIEVE_RANGES,
                                          namespace_id=1, ranges=ranges, data_pdu_bytes=65536).SerializeToString())
    *pdus, last = replies
    assert all(p.capsule.data_pdu for p in pdus) and not last.capsule.data_pdu and not last.frames
    starts = [sum(r.length for r in ranges[:i]) for i in range(len(ranges))]
    got = {}
    for p in pdus:
        i = max(k for k, s in enumerate(starts) if s <= p.capsule.data_offset)
        assert p.capsule.data_offset + len(bytes(p.frames[0])) <= starts[i] + ranges[i].length
        got[i] = got.get(i, b"") + bytes(p.frames[0])
    assert [got[i] for i in sorted(got)] == want and sorted(got) == [0, 2, 4]
    assert last.capsule.data_offset == sum(r.length for r in ranges)
    assert_still_serving(h)


@pytest.mark.parametrize("ranges", [[], [pb.ValueRange(key=b"", offset=0, length=1)],
                                    [pb.ValueRange(key=b"k" * 17, offset=0, length=1)]])
def test_a_malformed_range_command_is_refused_whole(harness, ranges):
    harness.connect()
    rsp, _ = harness.command(command_set=KV, opcode=pb.KV_RETRIEVE_RANGES, namespace_id=1, ranges=ranges)
    assert status(rsp) in (st.INVALID_FIELD, st.INVALID_KEY_SIZE)
    assert_still_serving(harness)
