"""The agent as a node: serve(settings) -> start(), its health and reflection, who may call what, stop()."""
import pytest

from kvtb.grpc_health import NOT_SERVING, SERVING, check
from smartnic.node import serve
from smartnic.settings import SmartNicSettings
from tests.kvtb.grpc_reflection import HEALTH, reflected_services


def test_agent_serves_once_started_and_not_while_stopping():
    node = serve(SmartNicSettings(listen_address="127.0.0.1:0", metrics_address="127.0.0.1:0",
                                  storage_nodes=("s0=127.0.0.1:9=tcp://127.0.0.1:9",)))  # not running
    node.start()
    try:
        address = node.addresses["grpc"]
        assert set(node.addresses) == {"grpc", "metrics"}
        assert check(address) == SERVING and check(address, "kvtb.smartnic.SmartNic") == SERVING
        assert check(address, "kvtb.compute.ComputeNode") == SERVING
        assert {"kvtb.smartnic.SmartNic", "kvtb.smartnic.MatchAction", "kvtb.compute.ComputeNode",
                HEALTH} <= reflected_services(address)
        node.set_not_serving()  # what stop() does first
        assert check(address) == NOT_SERVING
    finally:
        node.stop()


def _calls(channel):
    """One call of each kind a stranger tried on the agent (issue 20's findings 3 and 4)."""
    from kvtb_proto import compute_pb2, compute_pb2_grpc, smartnic_pb2, smartnic_pb2_grpc
    nic, table = smartnic_pb2_grpc.SmartNicStub(channel), smartnic_pb2_grpc.MatchActionStub(channel)
    proxy = compute_pb2_grpc.ComputeNodeStub(channel)
    ctx = smartnic_pb2.ContextRef(user_id="alice", context_id="c1")
    return {
        "ListContexts": lambda: nic.ListContexts(smartnic_pb2.ListContextsRequest(user_id=""), timeout=5),
        "Lookup": lambda: nic.Lookup(ctx, timeout=5),
        "DropContext": lambda: nic.DropContext(ctx, timeout=5),
        "Generate": lambda: list(proxy.Generate(compute_pb2.TurnRequest(
            request_id="r", user_id="alice", context_id="c1", token_ids=[1, 2]), timeout=5)),
        "Decode": lambda: proxy.Decode(compute_pb2.DecodeRequest(token_ids=[1]), timeout=5),
        "Write": lambda: table.Write(smartnic_pb2.WriteRequest(updates=[smartnic_pb2.Update(
            entry=smartnic_pb2.TableEntry(action=smartnic_pb2.Action(type=smartnic_pb2.Action.DENY)))]), timeout=5),
        "SetDefaultAction": lambda: table.SetDefaultAction(smartnic_pb2.SetDefaultActionRequest(
            action=smartnic_pb2.Action(type=smartnic_pb2.Action.FORWARD)), timeout=5),
        "RegisterMemory": lambda: nic.RegisterMemory(smartnic_pb2.RegisterMemoryRequest(
            shm_name="x", size_bytes=4096, access_key="k"), timeout=5),
    }


def test_every_door_of_the_agent_checks_who_knocks(tmp_path):
    """No certificate or another deployment's: no connection. The wrong identity: PERMISSION_DENIED."""
    import grpc
    from kvtb import credentials
    from kvtb.rpc import Security, channel
    from tests.conftest import secure_channel
    node = serve(SmartNicSettings(listen_address="127.0.0.1:0", metrics_address="127.0.0.1:0",
                                  storage_nodes=("s0=127.0.0.1:9=tcp://127.0.0.1:9",)))
    node.start()
    address = node.addresses["grpc"]
    stranger = Security.of("operator", str(credentials.init(tmp_path / "elsewhere")))
    try:
        for ch in (channel(address, Security.off()), channel(address, stranger, peer="smartnic")):
            for name, call in _calls(ch).items():
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.UNAVAILABLE, name
            ch.close()
        # a compute node may register memory, but may not speak for users or touch the table
        refused = {"compute": ["ListContexts", "Lookup", "DropContext", "Generate", "Decode", "Write",
                               "SetDefaultAction"],
                   "frontend": ["ListContexts", "Lookup", "DropContext", "Write", "SetDefaultAction",
                                "RegisterMemory"],
                   "storage": ["Generate", "Write", "ListContexts"]}
        for identity, names in refused.items():
            with secure_channel(address, peer="smartnic", identity=identity) as ch:
                calls = _calls(ch)
                for name in names:
                    with pytest.raises(grpc.RpcError) as err:
                        calls[name]()
                    assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, (identity, name)
                    assert f"not by {identity}" in err.value.details()
        with secure_channel(address, peer="smartnic", identity="operator") as ch:
            assert _calls(ch)["ListContexts"]().contexts == []  # the operator may
    finally:
        node.stop()
