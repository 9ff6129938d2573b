"""Damaged files: a data file cut short under a running node, a journal damaged in the middle, a bad manifest."""
import json
import os
import random

import numpy as np
import pytest

from kvtb_proto import nvmeof_pb2 as pb
from kvtb_proto import storage_admin_pb2 as apb
from kvtb_proto import storage_admin_pb2_grpc as apb_grpc
from storage_node import journal as jr
from tests.storage_node import journal_fixtures as old_journal
from fabric import status as st
from tests.conftest import fabric_client, secure_channel
from fabric.client import FabricClient, StorageStatusError
from storage_node.kv_namespace import KvNamespace, PendingDelete
from fabric.status import NvmeError

from .conftest import GOOD_HOST, Harness, settings_for

MIB = 1 << 20


def stats(node) -> apb.StatsResponse:
    return apb_grpc.StorageAdminStub(secure_channel(node.addresses["admin"], peer="storage")).Stats(apb.StatsRequest())


def value(seed: int, size: int) -> np.ndarray:
    """[size] uint8 of seeded random bytes."""
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def retrieve_status(client: FabricClient, key: bytes, skip_guard: bool = False) -> st.Status:
    capsule = pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE, namespace_id=1, key=key,
                                skip_guard_check=skip_guard)
    response = client._wait(client.submit(capsule)).response
    return st.Status(response.status_code_type, response.status_code)


def test_a_data_file_cut_short_under_a_running_node_fails_those_values_and_nothing_else(
        start_service, node_config, tmp_path):
    node = start_service("storage", "serve", "storage", "--config", node_config())
    data = tmp_path / "data" / "ns1.data"
    small, big, tail = value(1, 5000), value(2, 3 * MIB), value(3, 2 * MIB)
    with fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=30) as client:
        client.store(1, b"small", [small])   # offset 0: stays inside the file
        client.store(1, b"big", [big])       # 8 KiB .. 3 MiB + 8 KiB: cut in its middle
        client.store(1, b"tail", [tail])     # past the cut
        os.truncate(data, 1 * MIB)           # damage, as another process or a failing disk would
        for key in (b"big", b"tail"):        # 1 MiB and more: sent from the mapping
            for skip_guard in (False, True):
                assert retrieve_status(client, key, skip_guard) == st.UNRECOVERED_READ_ERROR
        assert node.proc.poll() is None, "the node died"
        assert bytes(client.retrieve(1, b"small").payload()) == small.tobytes()
        assert set(client.list_keys(1)) == {b"small", b"big", b"tail"}  # lost, not forgotten
        client.store(1, b"new-big", [big])  # new Stores land past the cut and read back
        client.store(1, b"new-small", [small])
        client.store(1, b"tail", [small])   # overwriting a lost value makes it good again
        assert bytes(client.retrieve(1, b"new-big").payload()) == big.tobytes()
        assert bytes(client.retrieve(1, b"new-small").payload()) == small.tobytes()
        assert bytes(client.retrieve(1, b"tail").payload()) == small.tobytes()
        os.truncate(data, 0)  # a Store after the cut finds it first, then writes
        client.store(1, b"after", [tail])
        assert bytes(client.retrieve(1, b"after").payload()) == tail.tobytes()
        assert retrieve_status(client, b"new-big", skip_guard=True) == st.UNRECOVERED_READ_ERROR
        namespace = next(n for n in stats(node).namespaces if n.namespace_id == 1)
        assert namespace.values_lost == 2 + 4  # big, tail; then small, new-big, new-small, tail
        assert node.proc.poll() is None
    assert os.path.getsize(data) == 4 << 30  # grown back: no page of the mapping is past the end


def test_a_flipped_byte_in_the_first_journal_record_loses_no_later_record_after_kill_9(
        start_service, node_config, tmp_path):
    config = node_config()
    node = start_service("storage", "serve", "storage", "--config", config)
    values = {b"k%02d" % i: value(i, 1000 + 97 * i) for i in range(39)}
    with fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=30) as client:
        for key, v in values.items():
            client.store(1, key, [v])
    node.kill()  # kill -9: no clean shutdown
    journal = tmp_path / "data" / "ns1.data.journal"
    damaged = bytearray(journal.read_bytes())
    damaged[20] ^= 0x10  # inside the first record's payload
    journal.write_bytes(bytes(damaged))

    node = start_service("storage-restarted", "serve", "storage", "--config", config)
    with fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=30) as client:
        assert sorted(client.list_keys(1)) == sorted(values)[1:]
        for key in sorted(values)[1:]:
            assert bytes(client.retrieve(1, key).payload()) == values[key].tobytes()
        with pytest.raises(StorageStatusError) as err:
            client.retrieve(1, b"k00")
        assert err.value.status == st.KEY_DOES_NOT_EXIST
    namespace = next(n for n in stats(node).namespaces if n.namespace_id == 1)
    assert namespace.journal_records_skipped == 1 and namespace.journal_bytes_skipped > 0
    assert (tmp_path / "data" / "ns1.data.journal.damaged").read_bytes() == bytes(damaged)
    log = (tmp_path / "logs" / "storage-restarted.log").read_text()
    assert "1 records and" in log and "38 valid records kept" in log


# -- namespace level: damage, then replay as after a kill -9 ------------------------------------

def open_namespace(path, size=32 * MIB) -> KvNamespace:
    ns = KvNamespace(1, path, size, fsync=False)
    ns.open()
    return ns


def store(ns: KvNamespace, key: bytes, data: bytes) -> None:
    pending = ns.reserve(key, len(data))
    ns.write(pending, [data])
    assert ns.commit([pending]) == [st.SUCCESS]


def delete(ns: KvNamespace, key: bytes) -> None:
    ns.commit([PendingDelete(key)])


def read(ns: KvNamespace, key: bytes) -> bytes | None:
    """The value's bytes, or None when the node answers an error (key absent, value lost)."""
    try:
        data, length, _ = ns.retrieve(key)
    except NvmeError as exc:
        assert exc.status in (st.KEY_DOES_NOT_EXIST, st.UNRECOVERED_READ_ERROR), exc
        return None
    out = bytes(data)
    del data
    assert len(out) == length
    return out


def test_a_lost_record_that_freed_extents_never_leaves_two_keys_on_them(tmp_path):
    path = tmp_path / "ns1.data"
    ns = open_namespace(path)
    store(ns, b"old", b"A" * 5000)
    delete(ns, b"old")             # its extents go back to the allocator ...
    store(ns, b"new", b"B" * 5000)  # ... and are given to this value
    ns.close()
    journal = path.parent / "ns1.data.journal"
    data = bytearray(journal.read_bytes())
    second = len(jr.encode(jr.Record(jr.PUT, b"old", 5000, 0, ((0, 8192),))))
    data[second + 15] ^= 1  # the Delete's record
    journal.write_bytes(bytes(data))
    ns = open_namespace(path)
    assert read(ns, b"new") == b"B" * 5000 and read(ns, b"old") is None
    assert ns.values_lost == 1 and ns.journal.skipped_records == 1
    store(ns, b"more", b"C" * 5000)  # the allocator holds "new"'s extents as used
    assert read(ns, b"new") == b"B" * 5000
    ns.close()


def test_an_old_journal_is_read_and_rewritten_in_the_new_format(tmp_path):
    path = tmp_path / "ns1.data"
    ns = open_namespace(path)
    for i in range(3):
        store(ns, b"k%d" % i, bytes([i]) * 7000)
    delete(ns, b"k1")
    ns.close()
    journal = path.parent / "ns1.data.journal"
    records = jr.scan(journal.read_bytes()).records
    journal.write_bytes(b"".join(old_journal.encode_v1(r) for r in records))  # as version 1 wrote it
    assert jr.scan(journal.read_bytes()).legacy_records == 4
    ns = open_namespace(path)
    assert not ns.journal.damage and ns.values_lost == 0
    assert [read(ns, b"k%d" % i) for i in range(3)] == [b"\0" * 7000, None, b"\2" * 7000]
    ns.close()
    assert journal.read_bytes().startswith(jr.MAGIC3)  # compacted to version 3 at open
    assert jr.scan(journal.read_bytes()).legacy_records == 0


def test_a_data_file_gone_while_stopped_loses_its_values_and_nothing_else(tmp_path):
    path = tmp_path / "ns1.data"
    ns = open_namespace(path)
    store(ns, b"a", b"a" * 5000)
    ns.close()
    os.remove(path)
    ns = open_namespace(path)
    assert read(ns, b"a") is None and ns.values_lost == 1 and ns.exist(b"a")
    store(ns, b"a", b"b" * 5000)
    assert read(ns, b"a") == b"b" * 5000
    ns.close()


RANDOM_TRIALS = 120


def test_random_damage_to_the_journal_never_serves_wrong_bytes(tmp_path):
    """Seeded flips, cuts and inserted garbage, each followed by a replay of a fresh namespace."""
    rng = random.Random(20)
    for trial in range(RANDOM_TRIALS):
        path = tmp_path / f"t{trial}" / "ns1.data"
        path.parent.mkdir()
        ns = open_namespace(path)
        versions: dict[bytes, set[bytes]] = {}
        for i in range(rng.randrange(5, 40)):
            key = b"k%d" % rng.randrange(12)
            if rng.random() < 0.15:
                delete(ns, key)
                continue
            data = rng.randbytes(rng.randrange(1, 20_000))
            versions.setdefault(key, set()).add(data)
            store(ns, key, data)
        ns.close()
        journal = path.parent / "ns1.data.journal"
        journal.write_bytes(damage(rng, journal.read_bytes()))
        ns = open_namespace(path)  # never raises
        for key, stored in versions.items():
            got = read(ns, key)
            assert got is None or got in stored, f"trial {trial}: {key!r} read back wrong"
        store(ns, b"after", b"x" * 3000)  # the namespace goes on
        assert read(ns, b"after") == b"x" * 3000
        ns.close()


def damage(rng: random.Random, data: bytes) -> bytes:
    """data with 1 to 4 random flips, cuts (of the tail or of a span) or insertions of garbage."""
    out = bytearray(data)
    for _ in range(rng.randrange(1, 5)):
        if not out:
            break
        kind, at = rng.randrange(4), rng.randrange(len(out))
        if kind == 0:
            out[at] ^= 1 << rng.randrange(8)
        elif kind == 1:
            del out[at:]
        elif kind == 2:
            del out[at:at + rng.randrange(1, 64)]
        else:
            out[at:at] = rng.randbytes(rng.randrange(1, 64))
    return bytes(out)


# -- subsystem level: a damaged manifest, a namespace that cannot open -----------------------------

def test_a_damaged_manifest_or_namespace_does_not_keep_the_node_from_starting(tmp_path):
    settings = settings_for(tmp_path)
    h = Harness(settings)
    h.connect()
    h.command(command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=1, key=b"k", value_length=5,
              payload=[b"hello"])
    h.close()
    manifest = tmp_path / "data" / "subsystem.json"
    manifest.write_text('{"subsystem_nqn": "x", "namespaces": [{"nsid": 1, "command_se')
    h = Harness(settings)
    try:
        assert {n: ns.command_set for n, ns in h.subsystem.namespaces.items()} == {1: "key_value", 2: "nvm"}
        h.connect()
        response, frames = h.command(command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"k")
        assert response.status_code == 0 and bytes(frames[0]) == b"hello"
    finally:
        h.close()
    assert (tmp_path / "data" / "subsystem.json.damaged").exists()
    assert [e["nsid"] for e in json.loads(manifest.read_text())["namespaces"]] == [1, 2]

    os.remove(tmp_path / "data" / "ns2.data")
    os.mkdir(tmp_path / "data" / "ns2.data")  # a namespace whose file cannot be opened
    h = Harness(settings)
    try:
        assert list(h.subsystem.namespaces) == [1] and "ns2.data" in h.subsystem.offline[2][1]
        h.connect()
        response, _ = h.command(command_set=pb.NVM, opcode=pb.NVM_READ, namespace_id=2, number_of_lbas=1)
        assert (response.status_code_type, response.status_code) == st.NAMESPACE_NOT_READY
        response, frames = h.command(command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE, namespace_id=1, key=b"k")
        assert bytes(frames[0]) == b"hello"
        with pytest.raises(NvmeError):
            h.subsystem.create_namespace(2)  # its files stay its own
    finally:
        h.close()
    assert [e["nsid"] for e in json.loads(manifest.read_text())["namespaces"]] == [1, 2]


def test_a_copy_read_that_finds_the_file_cut_short_answers_a_media_error(tmp_path):
    """A value under 1 MiB is read with preadv, which finds the file's end rather than a SIGBUS."""
    path = tmp_path / "ns1.data"
    ns = open_namespace(path)
    store(ns, b"v", b"z" * 100_000)
    store(ns, b"w", b"y" * 100_000)
    os.truncate(path, 4096)
    with pytest.raises(EOFError):
        ns._read_copy(ns._index[b"v"], 0, 100_000)
    assert read(ns, b"v") is None and ns.values_lost == 2  # both are past the cut
    assert os.path.getsize(path) == 32 * MIB
    assert read(ns, b"w") is None
    ns.close()
