"""The storage node as a real process on real sockets: access, bad capsules, integrity, admin, SIGTERM."""
import os
import signal

import grpc
import numpy as np
import pytest

from kvtb.crc32c import crc32c
from kvtb.grpc_health import SERVING, check
from kvtb_proto import nvmeof_pb2 as pb
from kvtb_proto import storage_admin_pb2 as apb
from kvtb_proto import storage_admin_pb2_grpc as apb_grpc
from fabric import status as st
from fabric.client import FabricError, StorageStatusError

from .conftest import GOOD_HOST
from tests.conftest import fabric_client, fabric_security, secure_channel
from tests.fabric.raw_host import RawHost

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def start_node(start_service, config: str):
    return start_service("storage", "serve", "storage", "--config", config)


def admin(node):
    return apb_grpc.StorageAdminStub(secure_channel(node.addresses["admin"], peer="storage"))


def test_serves_health_identify_and_exits_cleanly_on_sigterm(start_service, node_config):
    node = start_node(start_service, node_config())
    assert check(node.addresses["admin"], "kvtb.storage.StorageAdmin") == SERVING
    ident = admin(node).Identify(apb.IdentifyRequest())
    assert ident.fabric_address == node.addresses["fabric"] and ident.max_key_length == 16
    assert [n.command_set for n in ident.namespaces] == ["key_value", "nvm"]
    assert ident.max_value_length >= 64 << 20
    created = admin(node).CreateNamespace(apb.CreateNamespaceRequest(size_bytes=1 << 30)).namespace
    assert created.namespace_id == 3 and created.command_set == "key_value"
    with fabric_client(node.addresses["fabric"], GOOD_HOST) as client:
        client.store(3, b"k", [b"hello"])
        assert bytes(client.retrieve(3, b"k").payload()) == b"hello"
    stats = admin(node).Stats(apb.StatsRequest())
    assert stats.commands_completed >= 2 and stats.fsyncs >= 2 and stats.journal_records == 1
    node.signal(signal.SIGTERM)
    assert node.proc.wait(15) == 0


def test_unknown_host_is_refused_and_never_executed(start_service, node_config):
    node = start_node(start_service, node_config(allowed_hosts={GOOD_HOST: [1]}))
    evil = fabric_client(node.addresses["fabric"], "nqn.2026-11.org.evil:host")
    try:
        with pytest.raises(FabricError) as err:
            evil.connect()
        assert (err.value.sct, err.value.sc) == st.CONNECT_INVALID_HOST
        with pytest.raises(StorageStatusError) as err:
            evil.store(1, b"k", [b"sneaky"])
        assert err.value.status == st.CONNECT_INVALID_HOST
    finally:
        evil.close()
    with fabric_client(node.addresses["fabric"], GOOD_HOST) as good:
        assert good.list_keys(1) == []
        with pytest.raises(StorageStatusError) as err:
            good.flush(2)
        assert err.value.status == st.INVALID_NAMESPACE
    with pytest.raises(grpc.RpcError) as rpc_err:
        admin(node).Connect(apb.ConnectRequest(host_nqn="nqn.2026-11.org.evil:host"))
    assert rpc_err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert list(admin(node).Connect(apb.ConnectRequest(host_nqn=GOOD_HOST)).allowed_namespace_ids) == [1]


def raw_messages():
    """(name, multipart message after the routing id, expected status) for each malformed kind."""
    def cap(**fields) -> bytes:
        return pb.CommandCapsule(command_id=fields.pop("command_id", 900), **fields).SerializeToString()
    kv = {"command_set": pb.KEY_VALUE, "namespace_id": 1}
    last_lba = (4 << 30) // 4096 - 1
    return [
        ("unparsable header", [b"\x0a\xff\xff\xff"], st.INVALID_FIELD),
        ("empty header", [b""], st.INVALID_FIELD),
        ("payload length differs", [cap(opcode=pb.KV_STORE, key=b"k", value_length=9, **kv), b"abc"],
         st.INVALID_FIELD),
        ("key over 16 bytes", [cap(opcode=pb.KV_RETRIEVE, key=b"x" * 17, **kv)], st.INVALID_KEY_SIZE),
        ("zero LBAs", [cap(command_set=pb.NVM, opcode=pb.NVM_READ, namespace_id=2)], st.INVALID_FIELD),
        ("LBA out of range", [cap(command_set=pb.NVM, opcode=pb.NVM_READ, namespace_id=2,
                                  starting_lba=last_lba, number_of_lbas=2)], st.LBA_OUT_OF_RANGE),
        ("unknown opcode", [cap(opcode=0x33, key=b"k", **kv)], st.INVALID_OPCODE),
        ("unknown namespace", [cap(command_set=pb.KEY_VALUE, opcode=pb.KV_EXIST, namespace_id=77, key=b"k")],
         st.INVALID_NAMESPACE),
        ("crc mismatch", [cap(opcode=pb.KV_STORE, key=b"k", value_length=3, crc32c=1, has_crc32c=True, **kv),
                          b"abc"], st.GUARD_CHECK_ERROR),
    ]


def test_after_every_kind_of_malformed_capsule_the_node_serves_a_good_one(start_service, node_config):
    node = start_node(start_service, node_config())
    host = RawHost(node.addresses["fabric"], GOOD_HOST, fabric_security(GOOD_HOST).key)
    try:
        assert host.authenticate().status_code == 0
        for i, (name, message, expected) in enumerate(raw_messages()):
            host.send_raw(host.seal(message[0]), *message[1:])  # well sealed, badly formed
            rsp, _ = host.receive()
            assert (rsp.status_code_type, rsp.status_code) == expected, name
            value = os.urandom(1000 + i)
            rsp, _ = host.request(value, command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=1,
                                  command_id=i, key=b"good%d" % i, value_length=len(value),
                                  crc32c=crc32c(value), has_crc32c=True)
            assert rsp.status_code == 0 and rsp.command_id == i, f"after {name}: {rsp}"
            rsp, payload = host.request(command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE, namespace_id=1,
                                        command_id=i, key=b"good%d" % i)
            assert rsp.status_code == 0 and payload == [value], name
    finally:
        host.close()


def test_a_flipped_byte_in_the_namespace_file_answers_the_media_error(start_service, node_config, tmp_path):
    node = start_node(start_service, node_config())
    value = os.urandom(300_000)
    with fabric_client(node.addresses["fabric"], GOOD_HOST) as client:
        client.store(1, b"victim", [value])
        info = admin(node).Identify(apb.IdentifyRequest()).namespaces[0]
        with open(info.backing_file, "r+b") as f:  # the first value sits at offset 0
            f.seek(123_456)
            byte = f.read(1)
            f.seek(123_456)
            f.write(bytes([byte[0] ^ 0x01]))
        with pytest.raises(StorageStatusError) as err:
            client.retrieve(1, b"victim")
        assert err.value.status == st.UNRECOVERED_READ_ERROR
        assert client.retrieve  # the connection goes on
        client.store(1, b"other", [b"fine"])
        assert bytes(client.retrieve(1, b"other").payload()) == b"fine"
    assert admin(node).Stats(apb.StatsRequest()).integrity_errors == 1



@pytest.mark.slow
def test_a_value_over_64_mib_is_stored_and_read_back(start_service, node_config):
    node = start_node(start_service, node_config())
    size = (64 << 20) + 4097
    value = np.random.default_rng(1).integers(0, 256, size, dtype=np.uint8)  # [64 MiB + 4097] uint8
    with fabric_client(node.addresses["fabric"], GOOD_HOST, timeout_s=60) as client:
        half = value.nbytes // 2
        client.store(1, b"big", [value[:half], value[half:]])
        done = client.retrieve(1, b"big")
        assert done.response.value_length == value.nbytes
        assert done.payload() == memoryview(value)
        assert bytes(client.retrieve(1, b"big", max_bytes=10).payload()) == value[:10].tobytes()
        # in data PDUs of 4 MiB: kept for the completion without a handler, or handed over as they come
        capsule = pb.CommandCapsule(command_set=pb.KEY_VALUE, opcode=pb.KV_RETRIEVE, namespace_id=1,
                                    key=b"big", data_pdu_bytes=4 << 20)
        assert client.submit(capsule).result(60).payload() == memoryview(value)
        pieces = []
        done = client.submit(capsule, on_data=lambda offset, frames: pieces.append(
            (offset, b"".join(f.bytes for f in frames)))).result(60)
        assert [o for o, _ in pieces] == list(range(0, 64 << 20, 4 << 20))
        assert done.response.data_offset == 64 << 20 and bytes(done.payload()) == value[64 << 20:].tobytes()
        assert b"".join(p for _, p in pieces) == value[:64 << 20].tobytes()


def test_a_host_past_its_queue_depth_is_parked_then_refused_and_nothing_is_dropped(start_service, node_config):
    """Past depth (4) a host's commands are parked (4 more), then refused "command interrupted": every
    command is answered, none silently dropped, and the refused ones stored once sent again."""
    node = start_node(start_service, node_config(queue_depth=4))
    host = RawHost(node.addresses["fabric"], GOOD_HOST, fabric_security(GOOD_HOST).key, timeout_ms=20_000)
    value = os.urandom(200_000)

    def store(cid: int) -> None:
        host.send_raw(host.seal(host.header(command_set=pb.KEY_VALUE, opcode=pb.KV_STORE, namespace_id=1,
                                            command_id=cid, key=b"bp%d" % cid, value_length=len(value))), value)
    try:
        assert host.authenticate().sq_id > 0
        for cid in range(60):  # far past the depth of 4, without waiting for completions
            store(cid)
        answered = [host.receive()[0] for _ in range(60)]
        assert sorted(r.command_id for r in answered) == list(range(60))
        refused = sorted(r.command_id for r in answered if (r.status_code_type, r.status_code) == st.COMMAND_INTERRUPTED)
        assert all(r.status_code == 0 for r in answered if r.command_id not in refused)
        assert len(refused) <= 60 - 8 and "full" in next(r.message for r in answered if r.command_id in refused)
        for cid in refused:  # sent again one at a time, as a host within its depth does
            store(cid)
            again = host.receive()[0]
            assert again.command_id == cid and again.status_code == 0
    finally:
        host.close()
    with fabric_client(node.addresses["fabric"], GOOD_HOST) as client:
        assert all(bytes(client.retrieve(1, b"bp%d" % cid).payload()) == value for cid in range(60))


def test_storage_node_serves_once_started_and_not_while_stopping(tmp_path):
    from kvtb.grpc_health import NOT_SERVING
    from storage_node.node import serve
    from storage_node.settings import StorageSettings
    from tests.kvtb.grpc_reflection import HEALTH, reflected_services
    node = serve(StorageSettings(data_dir=str(tmp_path), admin_address="127.0.0.1:0",
                                 fabric_address="tcp://127.0.0.1:0", metrics_address="127.0.0.1:0",
                                 namespace_size_bytes=1 << 20))
    node.start()
    address = node.addresses["admin"]
    try:
        assert set(node.addresses) == {"admin", "fabric", "metrics"}
        assert check(address) == SERVING and check(address, "kvtb.storage.StorageAdmin") == SERVING
        assert {"kvtb.storage.StorageAdmin", HEALTH} <= reflected_services(address)
        node.health.set_not_serving()  # what stop() does first
        assert check(address) == NOT_SERVING
    finally:
        node.stop()


def test_admin_answers_only_the_operator_and_stats_to_the_frontend(tmp_path):
    from kvtb import credentials
    from kvtb.rpc import Security, channel
    from storage_node.node import serve
    from storage_node.settings import StorageSettings
    node = serve(StorageSettings(data_dir=str(tmp_path / "d"), admin_address="127.0.0.1:0",
                                 fabric_address="tcp://127.0.0.1:0", metrics_address="127.0.0.1:0",
                                 namespace_size_bytes=1 << 20))
    node.start()
    address = node.addresses["admin"]
    calls = {"Identify": lambda s: s.Identify(apb.IdentifyRequest(), timeout=5),
             "Disconnect": lambda s: s.Disconnect(apb.DisconnectRequest(host_nqn="nqn.x"), timeout=5),
             "CreateNamespace": lambda s: s.CreateNamespace(apb.CreateNamespaceRequest(), timeout=5),
             "Stats": lambda s: s.Stats(apb.StatsRequest(), timeout=5)}
    stranger = Security.of("operator", str(credentials.init(tmp_path / "elsewhere")))
    try:
        for ch in (channel(address, Security.off()), channel(address, stranger, peer="storage")):
            for name, call in calls.items():
                with pytest.raises(grpc.RpcError) as err:
                    call(apb_grpc.StorageAdminStub(ch))
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, name
            ch.close()
        for identity in ("frontend", "smartnic", "compute"):
            with secure_channel(address, peer="storage", identity=identity) as ch:
                stub = apb_grpc.StorageAdminStub(ch)
                for name in ("Identify", "Disconnect", "CreateNamespace"):
                    with pytest.raises(grpc.RpcError) as err:
                        calls[name](stub)
                    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, (identity, name)
        with secure_channel(address, peer="storage", identity="frontend") as ch:
            assert calls["Stats"](apb_grpc.StorageAdminStub(ch)).commands_completed == 0
        with secure_channel(address, peer="storage") as ch:  # the operator
            assert calls["Identify"](apb_grpc.StorageAdminStub(ch)).fabric_address
    finally:
        node.stop()
