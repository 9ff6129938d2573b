import asyncio

import pytest

from chat_frontend.chat_service import ChatService
from chat_frontend.errors import ChatError
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import SessionStore
from kvtb_proto import compute_pb2, frontend_pb2

from .fakes import STOP, FakeEngine

USERS = {"alice": "ta", "bob": "tb"}


def make(tmp_path, engine=None, **settings):
    s = FrontendSettings(data_dir=str(tmp_path), users=USERS, **settings)
    return ChatService(s, SessionStore(s.db_path), engine or FakeEngine())


def run_turn(service, message, context_id="", token="ta", metadata=(), max_new_tokens=8, sampling=None):
    async def go():
        events = []
        request = frontend_pb2.ChatRequest(token=token, context_id=context_id, message=message,
                                           max_new_tokens=max_new_tokens, sampling=sampling)
        async for e in service.chat(request, metadata):
            events.append(e)
        return events
    return asyncio.run(go())


def refusal(*args, **kwargs) -> ChatError:
    with pytest.raises(ChatError) as err:
        run_turn(*args, **kwargs)
    return err.value


def test_conversation_token_ids_follow_the_flow(tmp_path):
    engine = FakeEngine()
    service = make(tmp_path, engine)
    events = run_turn(service, "a cheesecake recipe")
    ctx = events[0].context_id
    assert ctx.startswith("ctx-")
    assert [e.text for e in events[1:-1]] == [" w0", " w1", " w2"]
    summary = events[-1].summary
    assert (summary.turn, summary.reply, summary.kv_source) == (1, " w0 w1 w2", "none")
    assert engine.encoded[0].continuation is False and engine.encoded[0].add_generation_prompt
    first_ids = [1, 11, 20, 16, 4]
    assert list(engine.turns[0].token_ids) == first_ids
    assert (engine.turns[0].user_id, engine.turns[0].context_id, engine.turns[0].max_new_tokens) == \
        ("alice", ctx, 8)
    events = run_turn(service, "in °C", context_id=ctx, metadata=[("authorization", "Bearer ta")])
    assert events[-1].summary.turn == 2 and events[-1].summary.kv_source == "restored"
    assert engine.encoded[1].continuation is True
    # history + reply ids as generated (with its stop token) + the continuation
    assert list(engine.turns[1].token_ids) == [*first_ids, 50, 51, 52, STOP, 3, 12, 12, 4]


def test_a_cut_reply_is_closed_with_a_stop_token(tmp_path):
    engine = FakeEngine(stop=False)
    service = make(tmp_path, engine)
    ctx = run_turn(service, "hi")[0].context_id
    run_turn(service, "again", context_id=ctx)
    assert list(engine.turns[1].token_ids)[3:8] == [50, 51, 52, STOP, 3]


def test_transcript_survives_a_new_service(tmp_path):
    service = make(tmp_path)
    ctx = run_turn(service, "one")[0].context_id
    service.store.close()
    service = make(tmp_path)
    events = run_turn(service, "two", context_id=ctx)
    assert events[-1].summary.turn == 2
    turns = service.store.turns(ctx)
    assert [t.user_message for t in turns] == ["one", "two"]
    assert frontend_pb2.TurnSummary.FromString(turns[1].summary).turn == 2


def test_refusals(tmp_path):
    service = make(tmp_path, FakeEngine(max_context_tokens=30), message_max_chars=20)
    ctx = run_turn(service, "hello")[0].context_id
    err = refusal(service, "hello", token="nope")
    assert (err.code, err.message) == ("UNAUTHENTICATED", "unknown token")
    assert refusal(service, "hello", token="").code == "UNAUTHENTICATED"
    err = refusal(service, "hello", context_id=ctx, token="tb")
    assert err.code == "PERMISSION_DENIED" and "belongs to another user" in err.message
    err = refusal(service, "hello", context_id="ctx-missing")
    assert err.code == "NOT_FOUND" and "ctx-missing" in err.message
    assert refusal(service, " ").message == "message is empty"
    assert "over the limit of 20 by 5" in refusal(service, "x" * 25).message
    err = refusal(service, "a b c d", context_id=ctx, max_new_tokens=20)
    assert err.code == "INVALID_ARGUMENT" and "over the model's context of 30 tokens" in err.message
    # nothing of the refused turns was kept
    assert service.store.get_context(ctx).turns == 1 and service.store.counts()["contexts"] == 1


def test_default_reply_length_fits_the_context(tmp_path):
    engine = FakeEngine(max_context_tokens=40)
    service = make(tmp_path, engine, max_new_tokens_default=256)
    ctx = run_turn(service, "hello there", max_new_tokens=0)[0].context_id
    assert engine.turns[0].max_new_tokens == 40 - 4
    # 4 prompt + 4 reply ids so far, 4 new: 28 left
    run_turn(service, "and again", context_id=ctx, max_new_tokens=0)
    assert engine.turns[1].max_new_tokens == 40 - 8 - 4


def test_sampling_is_checked_before_the_agent(tmp_path):
    engine = FakeEngine()
    service = make(tmp_path, engine)
    nan, inf = float("nan"), float("inf")
    for sampling, param in ((compute_pb2.Sampling(temperature=nan), "temperature"),
                            (compute_pb2.Sampling(temperature=inf), "temperature"),
                            (compute_pb2.Sampling(temperature=-0.5), "temperature"),
                            (compute_pb2.Sampling(temperature=1.0, top_p=nan), "top_p"),
                            (compute_pb2.Sampling(top_p=1.5), "top_p")):
        err = refusal(service, "hi", sampling=sampling)
        assert err.code == "INVALID_ARGUMENT" and err.param == param, err
    assert engine.turns == []
    run_turn(service, "hi", sampling=compute_pb2.Sampling(temperature=1e-300, top_p=1.0, seed=2**64 - 1))
    assert engine.turns[0].sampling.seed == 2**64 - 1


def test_metrics_count_tenants_never_users(tmp_path):
    service = make(tmp_path, tenants={"alice": "team-a"})
    run_turn(service, "hi")
    run_turn(service, "hi", token="tb")
    refusal(service, "", token="tb")
    turns, tokens = service.tenants.snapshot()
    assert turns == {("team-a", "ok"): 1, ("default", "ok"): 1, ("default", "INVALID_ARGUMENT"): 1}
    assert {tenant for tenant, _ in tokens} == {"team-a", "default"}
    with pytest.raises(AssertionError, match="not in users"):
        FrontendSettings(users=USERS, tenants={"mallory": "team-m"})
    with pytest.raises(AssertionError, match="non-empty"):
        FrontendSettings(users=USERS, tenants={"alice": ""})
