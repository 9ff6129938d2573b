"""A real frontend process over a real gRPC channel: malformed requests are INVALID_ARGUMENT (never
UNKNOWN) and the frontend goes on serving; SystemStats shows hosts and files to an operator only."""
import json

import grpc
import pytest

from chat_client.client import FrontendClient
from kvtb_proto import frontend_pb2, frontend_pb2_grpc
from tests.conftest import TEST_HOST, fabric_client
from tests.smartnic.helpers import storage_env

from .test_http_api import TOKEN, start_frontend

SERVICE = "/kvtb.frontend.ChatFrontend/"


def raw_call(channel: grpc.Channel, method: str, data: bytes, metadata=()) -> grpc.RpcError | bytes:
    """Send the bytes as the method's request; the reply's bytes (the last, for Chat) or the error."""
    try:
        if method == "Chat":
            return list(channel.unary_stream(SERVICE + method)(data, metadata=metadata, timeout=10))[-1]
        return channel.unary_unary(SERVICE + method)(data, metadata=metadata, timeout=10)
    except grpc.RpcError as exc:
        return exc


def chat(**fields) -> bytes:
    return frontend_pb2.ChatRequest(token=TOKEN, **fields).SerializeToString()


MALFORMED = [
    # (method, request bytes, what the details say)
    ("Chat", chat(message="hi") + b"\x1a\x02\xff\xfe", "bad UTF-8"),           # message not UTF-8
    ("Chat", b"\x0a\x05t-a", "corrupt"),                                        # token cut short
    ("Chat", b"\xff\xff\xff\xff", "corrupt"),                                   # not protobuf at all
    ("Chat", chat(message=""), "message is empty"),
    ("Chat", chat(message="hi", context_id="a b"), "context_id must be"),
    ("Chat", chat(message="hi", context_id="x" * 300), "over the limit of 240"),
    ("Chat", chat(message="hi", max_new_tokens=1 << 31), "This model's maximum context length is 256 tokens. "
     "However, you requested 2147483664 tokens (16 in the messages, 2147483648 in the completion). Please "
     "reduce the length of the messages or completion."),                       # vLLM's words, as over HTTP
    ("Chat", chat(message="a " * 300), "However, you requested 316 tokens in the messages."),
    ("Chat", frontend_pb2.ChatRequest(token="t" * 5000, message="hi").SerializeToString(), "token is 5000"),
    ("Chat", chat(message="hi", sampling={"temperature": float("nan")}), "temperature"),
    ("Chat", chat(message="hi", n=9), "n is 9, over the limit of 8"),
    ("GetContext", frontend_pb2.ContextRequest(token=TOKEN).SerializeToString(), "context_id is empty"),
    ("GetContext", frontend_pb2.ContextRequest(token=TOKEN, context_id="../x").SerializeToString(),
     "context_id must be"),
    ("GetContext", b"\x0a\x02\xc3\x28", "bad UTF-8"),
    ("ListContexts", b"\x0a\x02\xe2\x82", "bad UTF-8"),
    ("SystemStats", b"\x0a", "corrupt"),
]


@pytest.fixture
def frontend(start_service, tmp_path):
    """A frontend process with a real storage node behind its SystemStats (carol is an operator)."""
    storage = start_service("storage-s0", "serve", "storage", env=storage_env(tmp_path, "s0"))
    addresses, _node, server = start_frontend(start_service, tmp_path, operators=["carol"],
                                             storage_admin_addresses=[storage.addresses["admin"]])
    yield addresses, storage
    server.stop(0)


def test_malformed_requests_are_invalid_argument_and_the_frontend_goes_on(frontend):
    addresses, _ = frontend
    with grpc.insecure_channel(addresses["grpc"]) as channel:
        for method, data, says in MALFORMED:
            got = raw_call(channel, method, data)
            assert isinstance(got, grpc.RpcError), (method, data)
            assert got.code() == grpc.StatusCode.INVALID_ARGUMENT, (method, data, got.code(), got.details())
            assert says in got.details(), (method, data, got.details())
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        events = list(stub.Chat(frontend_pb2.ChatRequest(token=TOKEN, message="hi"), timeout=10))
        assert events[-1].summary.reply == " ok"
        reply = stub.GetContext(frontend_pb2.ContextRequest(token=TOKEN, context_id=events[0].context_id))
        assert len(reply.turns) == 1


def stats(address: str, token: str = "") -> dict:
    with grpc.insecure_channel(address) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        metadata = (("authorization", f"Bearer {token}"),) if token else ()
        return json.loads(stub.SystemStats(frontend_pb2.SystemStatsRequest(), metadata=metadata, timeout=30).json)


def test_system_stats_detail_is_for_the_operator_only(frontend):
    addresses, storage = frontend
    with fabric_client(storage.addresses["fabric"], TEST_HOST, timeout_s=30) as client:
        client.store(1, b"k", [b"v" * 100])  # a host connected and a value stored
        detail = stats(addresses["grpc"], "t-carol")
        text = json.dumps(detail)
        assert TEST_HOST in text and "backing_file" in text and "detail" not in detail
        for token in ("", "t-bob"):  # no token (`kvtb stats`), a user's
            public = stats(addresses["grpc"], token)
            text = json.dumps(public)
            assert TEST_HOST not in text and "backing_file" not in text and "kvtestbed" not in text
            assert str(storage.addresses["fabric"]) not in text and "/s0" not in text
            assert "operator" in public["detail"]
            node = public["storage"][0]
            assert node["address"] == storage.addresses["admin"]
            assert sum(int(ns["key_count"]) for ns in node["namespaces"]) == 1
            assert int(node["bytes_written"]) >= 100 and public["frontend"]["turns_completed"] == 0
        # the CLI's client (`kvtb stats`) asks without a token and still gets its figures
        assert FrontendClient(addresses["grpc"], "").system_stats()["storage"][0]["namespaces"]
    with grpc.insecure_channel(addresses["grpc"]) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.SystemStats(frontend_pb2.SystemStatsRequest(), metadata=(("authorization", "Bearer nope"),))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED


def test_aggregates_keep_counts_and_drop_hosts_files_and_error_details():
    from chat_frontend.system_stats import aggregates
    figures = {"frontend": {"turns_completed": 3},
               "agent": {"address": "127.0.0.1:1", "hits": 2, "bytes_by_storage_node": {"s0": 10}},
               "compute": {"error": "UNAVAILABLE: connect to /run/kvtb/compute.sock failed"},
               "storage": [{"address": "127.0.0.1:2", "bytes_written": 5,
                            "queue_depth_by_host": {"nqn.2026-11.org.kvtestbed:smartnic-0": 1},
                            "offline_namespaces": {"2": "/data/s0/ns2.journal is damaged"},
                            "namespaces": [{"namespace_id": 1, "command_set": "key_value", "key_count": 4,
                                            "backing_file": "/data/s0/ns1.data"}]}]}
    public = aggregates(figures)
    assert public["frontend"] == {"turns_completed": 3} and public["compute"] == {"error": "UNAVAILABLE"}
    assert public["agent"] == {"address": "127.0.0.1:1", "hits": 2, "bytes_by_storage_node": {"s0": 10}}
    assert public["storage"] == [{"address": "127.0.0.1:2", "bytes_written": 5, "offline_namespaces": {"2": "offline"},
                                  "namespaces": [{"namespace_id": 1, "command_set": "key_value", "key_count": 4}]}]
    assert "nqn" not in json.dumps(public) and "/data" not in json.dumps(public)


def test_n_choices_over_grpc_carry_their_index_and_a_summary_each(frontend):
    addresses, _ = frontend
    with grpc.insecure_channel(addresses["grpc"]) as channel:
        call = channel.unary_stream(SERVICE + "Chat", response_deserializer=frontend_pb2.ChatEvent.FromString)
        events = list(call(chat(message="hi", n=2, sampling={"logprobs": True}), timeout=10))
    texts = [(e.choice, e.text, [t.id for t in e.tokens]) for e in events if e.WhichOneof("event") == "text"]
    assert sorted(texts) == [(0, "", [2]), (0, " ok", [11]), (1, "", [2]), (1, " ok", [11])]
    assert [(e.choice, e.summary.choice, e.summary.reply) for e in events if e.WhichOneof("event") == "summary"] \
        == [(0, 0, " ok"), (1, 1, " ok")]
