"""Who may do what: tokens, ownership of contexts, the agent's salted keys, and the limits."""
import grpc
import pytest

from chat_client.client import FrontendClient, RpcFailure
from kvtb_proto import compute_pb2, compute_pb2_grpc, frontend_pb2, frontend_pb2_grpc

from .conftest import USERS, run_turn
from tests.conftest import secure_channel

pytestmark = [pytest.mark.service, pytest.mark.slow]


@pytest.fixture(scope="module")
def alice_context(triggered):
    client = triggered.client("alice")
    _, summary = run_turn(client, "Name three colours.", max_new_tokens=8)
    client.close()
    return summary.context_id


def refusal(client: FrontendClient, message: str, context_id: str = "",
            max_new_tokens: int = 8) -> RpcFailure:
    with pytest.raises(RpcFailure) as err:
        run_turn(client, message, context_id, max_new_tokens)
    return err.value


def test_second_user_can_neither_read_nor_continue(triggered, alice_context):
    with grpc.insecure_channel(triggered.frontend) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.GetContext(frontend_pb2.ContextRequest(token=USERS["bob"], context_id=alice_context))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND  # an id names a context of its user only
        assert err.value.details() == f"unknown context {alice_context!r}"
        bobs = stub.ListContexts(frontend_pb2.ListContextsRequest(token=USERS["bob"])).context_ids
        assert alice_context not in bobs
        mine = stub.GetContext(frontend_pb2.ContextRequest(token=USERS["alice"], context_id=alice_context))
        assert mine.user_id == "alice" and mine.turns[0].user_message == "Name three colours."
        assert mine.turns[0].summary.turn == 1 and mine.tokens > 0
    bob = triggered.client("bob")
    _, summary = run_turn(bob, "What did I ask?", alice_context)  # the same id: bob's own context
    bob.close()
    assert summary.turn == 1 and summary.context_id == alice_context
    with grpc.insecure_channel(triggered.frontend) as channel:
        stub = frontend_pb2_grpc.ChatFrontendStub(channel)
        his = stub.GetContext(frontend_pb2.ContextRequest(token=USERS["bob"], context_id=alice_context))
        assert his.user_id == "bob" and [t.user_message for t in his.turns] == ["What did I ask?"]
        mine = stub.GetContext(frontend_pb2.ContextRequest(token=USERS["alice"], context_id=alice_context))
        assert len(mine.turns) == 1


def _agent_turn(stub, user: str, context: str, ids: list[int]) -> compute_pb2.TurnRecord:
    request = compute_pb2.TurnRequest(request_id=f"probe-{user}-{context}", user_id=user, context_id=context,
                                      token_ids=ids, max_new_tokens=1, ignore_eos=True)
    records = [e.record for e in stub.Generate(request, timeout=120) if e.HasField("record")]
    assert len(records) == 1
    return records[0]


def test_agent_never_restores_another_users_kv(triggered):
    """KV is named by its tokens salted per (tenant, user): bob sending alice's exact tokens, even
    under her context id, finds none of her stored blocks; alice herself gets them back."""
    ids = [1000 + i for i in range(100)]  # three full blocks of 32 tokens and a partial one
    with secure_channel(triggered.agent, peer="smartnic") as channel:  # as the frontend calls it
        stub = compute_pb2_grpc.ComputeNodeStub(channel)
        first = _agent_turn(stub, "alice", "kv-probe", ids)
        assert first.kv_source == "none" and first.bytes_offloaded > 0
        for _ in range(50):  # her blocks are stored once their PUTs complete, just after the turn
            again = _agent_turn(stub, "alice", "kv-probe-2", ids + [7])
            if again.bytes_restored > 0:
                break
        assert again.kv_source == "restored" and again.tokens_reused >= 96, again
        his = _agent_turn(stub, "bob", "kv-probe", ids + [7])  # her tokens, under her context id
        assert his.kv_source == "none" and his.tokens_reused == 0 and his.bytes_restored == 0, his


@pytest.mark.parametrize("user, token, message, context, max_new, code, details", [
    ("alice", "wrong-token", "hello", "", 8, "UNAUTHENTICATED", "unknown token"),
    ("alice", "", "hello", "", 8, "UNAUTHENTICATED", "no token"),
    ("alice", None, "   ", "", 8, "INVALID_ARGUMENT", "message is empty"),
    ("alice", None, "lorem ipsum " * 600, "", 8, "INVALID_ARGUMENT",  # limits are in tokens, not characters
     "This model's maximum context length is 1024 tokens. However, you requested"),
    ("alice", None, "hello", "ctx unknown", 8, "INVALID_ARGUMENT", "context_id must be ASCII letters"),
    ("alice", None, "hello", "", 2000, "INVALID_ARGUMENT",  # vLLM's words, as over HTTP
     "in the messages, 2000 in the completion). Please reduce the length of the messages or completion."),
    ("alice", None, "hello", "", 1020, "INVALID_ARGUMENT", "in the messages, 1020 in the completion)"),
])
def test_refusals_say_what_and_by_how_much(triggered, user, token, message, context, max_new, code, details):
    client = FrontendClient(triggered.frontend, USERS[user] if token is None else token)
    err = refusal(client, message, context, max_new)
    client.close()
    assert err.code == code and details in err.details, err
