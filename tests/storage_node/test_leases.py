"""Read leases: a key another host read with lease_ms is not deleted until the lease ends (storage_node.leases)."""
import time

import pytest

from fabric import status as st
from kvtb.settings import SettingsError
from kvtb_proto import nvmeof_pb2 as pb
from storage_node.leases import Leases
from storage_node.settings import StorageSettings

from .conftest import GOOD_HOST, Harness, settings_for
from .test_commands import status, store

KV = pb.KEY_VALUE
OTHER = "nqn.2026-11.org.kvtestbed:other-host"


def test_a_lease_stands_against_other_hosts_only_and_extends_never_shortens():
    leases = Leases()
    leases.grant([b"k"], "a", until=10.0, now=0.0)
    assert leases.held_by_other(b"k", "b", 5.0) and not leases.held_by_other(b"k", "a", 5.0)
    leases.grant([b"k"], "a", until=3.0, now=1.0)  # shorter: ignored
    assert leases.held_by_other(b"k", "b", 9.0)
    assert not leases.held_by_other(b"k", "b", 10.0)
    leases.grant([b"j"], "b", until=20.0, now=2.0)
    assert leases.purge(11.0) == 1 and len(leases) == 1  # k's lease expired and is forgotten
    leases.drop(b"j")
    assert len(leases) == 0


def test_expired_leases_are_purged_as_new_ones_come():
    leases = Leases(purge_interval_s=1.0)
    leases.grant([bytes([i]) for i in range(100)], "a", until=1.0, now=0.0)
    leases.grant([b"new"], "a", until=10.0, now=2.0)  # a second later: the expired ones go
    assert len(leases) == 1


@pytest.fixture
def two_hosts(tmp_path):
    h = Harness(settings_for(tmp_path, allowed_hosts={GOOD_HOST: "*", OTHER: "*"}, max_lease_ms=400))
    h.connect(GOOD_HOST, b"s1")
    h.connect(OTHER, b"s2")
    yield h
    h.close()


def delete(h: Harness, key: bytes, session: bytes):
    return status(h.command(session=session, command_set=KV, opcode=pb.KV_DELETE, namespace_id=1, key=key)[0])


def ns(h: Harness):
    return h.subsystem.namespaces[1]


@pytest.mark.parametrize("read", ["retrieve", "ranges", "exist"])
def test_a_key_read_with_a_lease_is_not_deleted_by_another_host_until_it_ends(two_hosts, read):
    h = two_hosts
    assert status(store(h, b"k", b"v" * 100, session=b"s1")) == st.SUCCESS
    fields = {"retrieve": dict(opcode=pb.KV_RETRIEVE, key=b"k"), "exist": dict(opcode=pb.KV_EXIST, key=b"k"),
              "ranges": dict(opcode=pb.KV_RETRIEVE_RANGES, ranges=[pb.ValueRange(key=b"k", offset=0, length=8)])}[read]
    assert status(h.command(session=b"s1", command_set=KV, namespace_id=1, lease_ms=60_000, **fields)[0]) == st.SUCCESS
    assert delete(h, b"k", b"s2") == st.KEY_LEASED
    assert ns(h).exist(b"k")  # nothing deleted
    time.sleep(0.45)  # capped at the node's max_lease_ms (400 ms), not the 60 s asked for
    assert delete(h, b"k", b"s2") == st.SUCCESS
    assert not ns(h).exist(b"k") and len(ns(h).leases) == 0  # a deleted key loses its lease


def test_a_host_s_own_lease_does_not_stop_its_delete_and_a_read_without_lease_leases_nothing(two_hosts):
    h = two_hosts
    for key in (b"a", b"b"):
        store(h, key, session=b"s1")
    h.command(session=b"s1", command_set=KV, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"a", lease_ms=60_000)
    h.command(session=b"s1", command_set=KV, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"b")
    assert delete(h, b"b", b"s2") == st.SUCCESS
    assert delete(h, b"a", b"s1") == st.SUCCESS


def test_a_missing_key_is_not_leased_and_an_overwrite_keeps_the_lease(two_hosts):
    h = two_hosts
    rsp = h.command(session=b"s1", command_set=KV, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"x", lease_ms=60_000)[0]
    assert status(rsp) == st.KEY_DOES_NOT_EXIST and len(ns(h).leases) == 0
    store(h, b"k", b"1" * 64, session=b"s1")
    h.command(session=b"s1", command_set=KV, opcode=pb.KV_EXIST, namespace_id=1, key=b"k", lease_ms=60_000)
    assert status(store(h, b"k", b"2" * 64, session=b"s2")) == st.SUCCESS  # the same name: allowed
    assert delete(h, b"k", b"s2") == st.KEY_LEASED


def test_max_lease_ms_is_bounded(tmp_path):
    with pytest.raises(SettingsError, match="max_lease_ms"):
        StorageSettings(data_dir=str(tmp_path), max_lease_ms=3_600_001)
