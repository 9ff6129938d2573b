"""The key-value namespace: atomic replace, replay, integrity, capacity, pinned extents, group commit."""
import gc
import os
import threading

import pytest

from kvtb.crc32c import crc32c
from fabric import status as st
from storage_node.commit import GroupCommitter
from storage_node.kv_namespace import KvNamespace, PendingDelete
from fabric.status import NvmeError

MIB = 1 << 20


def put(ns: KvNamespace, key: bytes, value: bytes, **conditions) -> st.Status:
    pending = ns.reserve(key, len(value), **conditions)
    ns.write(pending, [value])
    return ns.commit([pending])[0]


def get(ns: KvNamespace, key: bytes, max_bytes: int = 0) -> bytes:
    return bytes(ns.retrieve(key, max_bytes)[0])


@pytest.fixture
def ns(tmp_path):
    namespace = KvNamespace(1, tmp_path / "ns1.data", 4 * MIB)
    namespace.open()
    yield namespace
    namespace.close()


def test_store_replace_delete_and_replay(tmp_path, ns):
    assert put(ns, b"a", b"first") == st.SUCCESS
    assert put(ns, b"b", os.urandom(100_000)) == st.SUCCESS
    assert put(ns, b"a", b"second value") == st.SUCCESS
    assert ns.commit([PendingDelete(b"b")]) == [st.SUCCESS]
    assert get(ns, b"a") == b"second value" and get(ns, b"a", 3) == b"sec"
    assert ns.used_bytes == 4096  # the replaced and deleted values' extents were freed
    ns.close()
    again = KvNamespace(1, tmp_path / "ns1.data", 4 * MIB)
    again.open()
    assert get(again, b"a") == b"second value" and not again.exist(b"b")
    assert again.used_bytes == 4096
    again.close()


def test_uncommitted_store_is_invisible_and_its_space_returns_on_replay(tmp_path, ns):
    pending = ns.reserve(b"x", MIB)
    ns.write(pending, [os.urandom(MIB)])
    assert not ns.exist(b"x")
    ns.close()
    again = KvNamespace(1, tmp_path / "ns1.data", 4 * MIB)
    again.open()
    assert not again.exist(b"x") and again.used_bytes == 0
    again.close()


def test_corrupt_bytes_answer_unrecovered_read_error(tmp_path, ns):
    put(ns, b"a", b"x" * 10_000)
    with open(tmp_path / "ns1.data", "r+b") as f:
        f.seek(5000)
        f.write(b"y")
    with pytest.raises(NvmeError) as err:
        ns.retrieve(b"a")
    assert err.value.status == st.UNRECOVERED_READ_ERROR and ns.integrity_errors == 1


@pytest.mark.parametrize("size", [10_000, 2 * MIB])  # read into a buffer, and sent from the mapping
def test_a_host_that_checks_the_guard_itself_gets_the_bytes_as_stored(tmp_path, ns, size):
    put(ns, b"a", b"x" * size)
    with open(tmp_path / "ns1.data", "r+b") as f:
        f.seek(size // 2)
        f.write(b"y")
    data, length, crc = ns.retrieve(b"a", check_guard=False)
    assert bytes(data) == b"x" * (size // 2) + b"y" + b"x" * (size - size // 2 - 1)
    assert crc == crc32c(b"x" * size) != crc32c(data)  # the host compares and sees the damage
    assert ns.maps(b"a") == (size >= MIB) and ns.integrity_errors == 0
    del data
    with pytest.raises(NvmeError):
        ns.retrieve(b"a")  # the default still checks


def test_full_namespace_answers_capacity_exceeded(ns):
    put(ns, b"a", bytes(3 * MIB))
    with pytest.raises(NvmeError) as err:
        ns.reserve(b"b", 2 * MIB)
    assert err.value.status == st.CAPACITY_EXCEEDED
    assert put(ns, b"b", bytes(MIB)) == st.SUCCESS


def test_extents_of_a_replaced_value_stay_allocated_while_a_reader_holds_them(ns):
    put(ns, b"a", b"1" * 8192)
    entry = ns._index[b"a"]
    entry.pins += 1                      # a Retrieve is reading it
    put(ns, b"a", b"2" * 8192)
    assert ns.used_bytes == 4 * 4096
    with ns._lock:
        entry.pins -= 1
        ns._release(entry)
    assert ns.used_bytes == 2 * 4096


def test_concurrent_stores_are_group_committed(ns):
    committer = GroupCommitter(ns).start()
    results, done = {}, threading.Event()

    def finished(i, status):
        results[i] = status
        if len(results) == 32:
            done.set()

    def store(i: int):
        value = bytes([i]) * 1000
        pending = ns.reserve(b"k%d" % i, len(value))
        ns.write(pending, [value])
        committer.submit(pending, lambda s: finished(i, s))

    for i in range(32):
        threading.Thread(target=store, args=(i,)).start()
    assert done.wait(timeout=10)
    committer.stop()
    assert all(s == st.SUCCESS for s in results.values()) and len(results) == 32
    assert committer.batches < 32 or ns.journal.fsyncs < 32
    assert all(get(ns, b"k%d" % i) == bytes([i]) * 1000 for i in range(32))


def test_a_large_value_is_served_from_the_mapping_and_stays_pinned_until_sent(tmp_path, ns):
    value = os.urandom(2 * MIB)
    put(ns, b"big", value)
    data, length, crc = ns.retrieve(b"big")
    assert ns.maps(b"big") and length == len(value) and bytes(data) == value and crc == crc32c(value)
    put(ns, b"big", bytes(2 * MIB))       # replaced while the old bytes are still being sent
    assert ns.used_bytes == 4 * MIB and bytes(data) == value
    del data                              # ZeroMQ let go of the last view
    gc.collect()
    assert ns.used_bytes == 2 * MIB
    with open(tmp_path / "ns1.data", "r+b") as f:  # the new value sits after the old one
        f.seek(2 * MIB + 77)
        f.write(b"\x01")
    with pytest.raises(NvmeError) as err:
        ns.retrieve(b"big")
    assert err.value.status == st.UNRECOVERED_READ_ERROR
    assert ns._index[b"big"].pins == 0


def test_a_range_read_gives_its_bytes_and_refuses_a_range_outside_the_value(ns):
    small, large = os.urandom(5000), os.urandom(MIB + 4096)  # a copied value and a mapped one
    assert put(ns, b"s", small) == put(ns, b"l", large) == st.SUCCESS
    for key, value in ((b"s", small), (b"l", large)):
        for check in (True, False):
            for offset, length in ((0, 10), (100, 900), (len(value) - 7, 7), (0, len(value))):
                got, total, crc = ns.retrieve_range(key, offset, length, check)
                assert bytes(got) == value[offset:offset + length] and total == len(value) and crc == crc32c(value)
            for offset, length in ((len(value) - 6, 7), (len(value) + 1, 1), (5, 0)):
                with pytest.raises(NvmeError) as err:
                    ns.retrieve_range(key, offset, length, check)
                assert err.value.status == st.INVALID_FIELD and "outside the value" in err.value.message
        assert bytes(ns.retrieve(key, 0, True, 4000)[0]) == value[4000:]  # Retrieve from an offset
        assert bytes(ns.retrieve(key, 50, False, 10)[0]) == value[10:60]
        with pytest.raises(NvmeError):
            ns.retrieve(key, 0, True, len(value) + 1)
    with pytest.raises(NvmeError) as err:
        ns.retrieve_range(b"missing", 0, 1)
    assert err.value.status == st.KEY_DOES_NOT_EXIST


def test_a_range_read_with_the_guard_check_checks_the_whole_value(tmp_path, ns):
    value = os.urandom(20_000)
    put(ns, b"v", value)
    entry = ns._index[b"v"]
    with open(ns.path, "r+b") as f:  # damage a byte far from the range asked for
        f.seek(entry.extents[0].offset + 15_000)
        f.write(bytes([value[15_000] ^ 1]))
    with pytest.raises(NvmeError) as err:
        ns.retrieve_range(b"v", 0, 100, check_guard=True)
    assert err.value.status == st.UNRECOVERED_READ_ERROR
    assert bytes(ns.retrieve_range(b"v", 0, 100, check_guard=False)[0]) == value[:100]
