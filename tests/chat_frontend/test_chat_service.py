import asyncio

import pytest

from chat_frontend.admission import UserLimits
from chat_frontend.chat_service import ChatService
from chat_frontend.conversation import Whole
from chat_frontend.errors import ChatError
from chat_frontend.frontend_servicer import chat_request
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import SessionStore, TurnRow
from kvtb.settings import SettingsError
from kvtb_proto import compute_pb2, frontend_pb2

from .fakes import STOP, FakeEngine

USERS = {"alice": "ta", "bob": "tb"}


def make(tmp_path, engine=None, **settings):
    s = FrontendSettings(data_dir=str(tmp_path), users=USERS, **settings)
    return ChatService(s, SessionStore(s.db_path), engine or FakeEngine())


def run_turn(service, message, context_id="", token="ta", metadata=(), max_new_tokens=8, sampling=None,
             history=(), system=None):
    async def go():
        events = []
        request = frontend_pb2.ChatRequest(token=token, context_id=context_id, message=message,
                                           max_new_tokens=max_new_tokens, sampling=sampling)
        async for e in service.chat(request, metadata, history, system):
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
    turns = service.store.turns("alice", ctx)
    assert [t.user_message for t in turns] == ["one", "two"]
    assert frontend_pb2.TurnSummary.FromString(turns[1].summary).turn == 2


def test_refusals(tmp_path):
    service = make(tmp_path, FakeEngine(max_context_tokens=30))
    ctx = run_turn(service, "hello")[0].context_id
    err = refusal(service, "hello", token="nope")
    assert (err.code, err.message) == ("UNAUTHENTICATED", "unknown token")
    assert refusal(service, "hello", token="").code == "UNAUTHENTICATED"
    for bad in ("a b", "x" * 241, "ctx/../1", "-x", "é"):
        err = refusal(service, "hello", context_id=bad)
        assert (err.code, err.param) == ("INVALID_ARGUMENT", "context_id"), bad
    err = refusal(service, "x " * 40)  # a message is bounded in tokens, against the context
    assert err.code == "INVALID_ARGUMENT" and "maximum context length is 30 tokens" in err.message
    assert (err.param, err.openai_code) == ("messages", "context_length_exceeded")  # the prompt alone
    err = refusal(service, "a b c d", context_id=ctx, max_new_tokens=20)
    assert err.code == "INVALID_ARGUMENT" and err.param == "max_new_tokens" and err.message == (
        "This model's maximum context length is 30 tokens. However, you requested 33 tokens (13 in the "
        "messages, 20 in the completion). Please reduce the length of the messages or completion.")
    # nothing of the refused turns was kept
    assert service.store.get_context("alice", ctx).turns == 1 and service.store.counts()["contexts"] == 1


def test_a_chosen_id_starts_a_context_of_its_user_only(tmp_path):
    engine = FakeEngine()
    service = make(tmp_path, engine)
    chosen = "conv-7@client." + "x" * 226  # 240 characters: the longest id
    assert run_turn(service, "hello", context_id=chosen)[-1].summary.turn == 1
    assert run_turn(service, "more", context_id=chosen)[-1].summary.turn == 2
    events = run_turn(service, "hello", context_id=chosen, token="tb")  # bob, the same id: his own
    assert events[0].context_id == chosen and events[-1].summary.turn == 1
    assert list(engine.turns[2].token_ids) == list(engine.turns[0].token_ids)  # none of alice's turns
    assert (engine.turns[2].user_id, engine.turns[2].context_id) == ("bob", chosen)
    assert service.store.get_context("alice", chosen).turns == 2 and service.store.get_context("bob", chosen).turns == 1
    assert service.store.list_contexts("bob") == [chosen]
    with pytest.raises(ChatError) as err:
        service.context_of("bob", "ctx-missing")
    assert err.value.code == "NOT_FOUND"


def test_a_resent_history_is_the_whole_conversation(tmp_path):
    engine = FakeEngine()
    service = make(tmp_path, engine)
    history = (("user", "a cheesecake recipe"), ("assistant", " w0 w1 w2"))
    events = run_turn(service, "in °C", history=history)
    summary = events[-1].summary
    assert summary.turn == 2 and engine.encoded[0].continuation is False
    assert [(m.role, m.content) for m in engine.encoded[0].messages] == [*history, ("user", "in °C")]
    assert list(engine.turns[0].token_ids) == [1, 11, 20, 16, 4, 12, 12, 12, 4, 12, 12, 4]
    ctx = events[0].context_id
    turns = service.store.turns("alice", ctx)
    assert [(t.user_message, t.reply, t.summary == b"") for t in turns] == \
        [("a cheesecake recipe", " w0 w1 w2", True), ("in °C", " w0 w1 w2", False)]
    # the same history under that session: the transcript matches, the kept ids go on
    history += (("user", "in °C"), ("assistant", " w0 w1 w2"))
    run_turn(service, "thanks", context_id=ctx, history=history)
    assert engine.encoded[1].continuation is True
    assert list(engine.turns[1].token_ids) == [*engine.turns[0].token_ids, 50, 51, 52, STOP, 3, 16, 4]
    err = refusal(service, "thanks", context_id=ctx, history=(("user", "something else"), ("assistant", "w")))
    assert err.code == "INVALID_ARGUMENT" and "do not match" in err.message


def test_a_resent_conversation_served_here_goes_on_from_its_generated_ids(tmp_path):
    engine = FakeEngine()  # replies " w0 w1 w2" as ids 50 51 52; the text re-encodes as 12 12 12
    service = make(tmp_path, engine)
    first = run_turn(service, "a cheesecake recipe")[0].context_id
    history = (("user", "a cheesecake recipe"), ("assistant", " w0 w1 w2"))
    events = run_turn(service, "in °C", history=history)
    assert events[0].context_id != first and events[-1].summary.turn == 2  # a new context...
    kept = [1, 11, 20, 16, 4, 50, 51, 52, STOP]
    assert list(engine.turns[1].token_ids) == [*kept, 3, 12, 12, 4]  # ...going on from the generated ids
    assert engine.encoded[1].continuation is True
    turns = service.store.turns("alice", events[0].context_id)
    assert [(t.reply_token_ids, t.summary == b"") for t in turns] == [((50, 51, 52, STOP), True),
                                                                      ((50, 51, 52, STOP), False)]
    history += (("user", "in °C"), ("assistant", " w0 w1 w2"))
    run_turn(service, "thanks", history=history)  # the third turn finds the second's context
    assert list(engine.turns[2].token_ids) == [*engine.turns[1].token_ids, 50, 51, 52, STOP, 3, 16, 4]
    run_turn(service, "thanks", history=history, system="be brief")  # another system message: not that one
    assert list(engine.turns[3].token_ids)[:1] == [1] and 50 not in engine.turns[3].token_ids
    run_turn(service, "in °C", history=history[:2], token="tb")  # bob: alice's conversation is not his
    assert list(engine.turns[4].token_ids) == [1, 11, 20, 16, 4, 12, 12, 12, 4, 12, 12, 4]


def test_a_client_system_message_is_part_of_the_prompt(tmp_path):
    engine = FakeEngine()
    service = make(tmp_path, engine, system_prompt="be brief")
    ctx = run_turn(service, "hi", system="you are a pirate")[0].context_id
    assert [(m.role, m.content) for m in engine.encoded[0].messages] == [("system", "you are a pirate"), ("user", "hi")]
    run_turn(service, "hi")  # none sent: the configured one
    assert [(m.role, m.content) for m in engine.encoded[1].messages] == [("system", "be brief"), ("user", "hi")]
    run_turn(service, "again", context_id=ctx, system="you are a pirate")  # the same one: fine
    err = refusal(service, "again", context_id=ctx, system="you are a cat")
    assert err.code == "INVALID_ARGUMENT" and "system message differs" in err.message
    assert service.store.get_context("alice", ctx).system_prompt == "you are a pirate"


def test_only_the_tenants_shared_system_prompt_is_shared(tmp_path):
    engine = FakeEngine()
    users = {**USERS, "carol": "tc"}
    s = FrontendSettings(data_dir=str(tmp_path), users=users, tenants={"alice": "team-a", "bob": "team-a"},
                         shared_system_prompts={"team-a": "you help team a"}, system_prompt="you help team a")
    service = ChatService(s, SessionStore(s.db_path), engine)
    run_turn(service, "hi")                                  # alice, the default system prompt: shared
    run_turn(service, "hi", token="tb", system="you help team a")  # bob, sent by the client: shared
    run_turn(service, "hi", token="tb", system="you help me")      # another system message: not
    run_turn(service, "hi", token="tc", system="you help team a")  # carol, tenant default: never
    shared = [t.shared_prefix_tokens for t in engine.turns]
    assert shared == [6, 6, 0, 0]  # 1, four words, 4: the system message's ids alone
    assert list(engine.turns[0].token_ids[:6]) == [1, 13, 14, 14, 11, 4]
    assert [t.tenant for t in engine.turns] == ["team-a", "team-a", "team-a", "default"]
    with pytest.raises(SettingsError, match="no user belongs to"):
        FrontendSettings(users=USERS, shared_system_prompts={"team-z": "x"})


def test_max_new_tokens_is_what_the_context_leaves_unless_asked_or_lowered(tmp_path):
    engine = FakeEngine(max_context_tokens=8192)
    grpc_chat = make(tmp_path / "a", engine)
    run_turn(grpc_chat, "hello there", max_new_tokens=0)
    assert engine.turns.pop().max_new_tokens == 256  # the gRPC Chat API's own default (kvtb chat)
    service = make(tmp_path, engine, chat_max_new_tokens=0)  # the settings' default and cap: 0, not set
    ctx = run_turn(service, "hello there", max_new_tokens=0)[0].context_id
    assert engine.turns[0].max_new_tokens == 8192 - 4  # vLLM's: max_model_len - prompt
    run_turn(service, "and again", context_id=ctx, max_new_tokens=4096)
    assert engine.turns[1].max_new_tokens == 4096  # over the old cap of 1,024, inside the context
    lowered = make(tmp_path / "b", engine, max_new_tokens_default=256, max_new_tokens_cap=1024)
    run_turn(lowered, "hello there", max_new_tokens=0)
    run_turn(lowered, "hello there", max_new_tokens=4096)
    assert [t.max_new_tokens for t in engine.turns[2:]] == [256, 1024]  # the cap lowers, never refuses
    with pytest.raises(SettingsError, match="max_new_tokens_default <= max_new_tokens_cap"):
        FrontendSettings(users=USERS, max_new_tokens_default=2048, max_new_tokens_cap=1024)
    with pytest.raises(SettingsError, match="max_new_tokens_cap must be a whole number >= 0"):
        FrontendSettings(users=USERS, max_new_tokens_cap=-1)


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
    refusal(service, "hi", token="tb", max_new_tokens=5000)
    turns, tokens = service.tenants.snapshot()
    assert turns == {("team-a", "ok"): 1, ("default", "ok"): 1, ("default", "INVALID_ARGUMENT"): 1}
    assert {tenant for tenant, _ in tokens} == {"team-a", "default"}
    with pytest.raises(SettingsError, match="not in users"):
        FrontendSettings(users=USERS, tenants={"mallory": "team-m"})
    with pytest.raises(SettingsError, match="non-empty"):
        FrontendSettings(users=USERS, tenants={"alice": ""})


def test_user_quotas_are_off_by_default_and_come_from_the_settings_and_the_tenants_overrides():
    assert FrontendSettings(users=USERS).limits_of("alice") == UserLimits(None, None, None)
    settings = FrontendSettings(users=USERS, tenants={"alice": "gold"}, user_max_concurrent_turns=2,
                                user_max_waiting_turns=4,
                                tenant_limits={"gold": {"user_max_concurrent_turns": 6,
                                                        "user_max_queued_prompt_tokens": 99}})
    gold, plain = settings.limits_of("alice"), settings.limits_of("bob")
    assert (gold.max_concurrent_turns, gold.max_waiting_turns, gold.max_queued_prompt_tokens) == (6, 4, 99)
    assert (plain.max_concurrent_turns, plain.max_queued_prompt_tokens) == (2, None)  # 0: no quota
    for bad, match in [({"tenant_limits": {"gold": {"user_max_turns": 1}}}, "unknown limits"),
                       ({"tenant_limits": {"nobody": {}}}, "no user belongs to"),
                       ({"tenant_limits": {"gold": {"user_max_concurrent_turns": -1}}}, "must not be negative"),
                       ({"tenant_limits": {"gold": {"user_max_waiting_turns": "x"}}}, "whole number"),
                       ({"user_max_queued_prompt_tokens": -5}, "must not be negative"),
                       ({"operators": ("mallory",)}, "operators names users"),
                       ({"max_concurrent_turns": 0}, "must be positive")]:
        with pytest.raises(SettingsError, match=match):
            FrontendSettings(**{"users": USERS, "tenants": {"alice": "gold"}, **bad})


def test_store_refuses_turns_out_of_order_with_a_real_error(tmp_path):
    store = SessionStore(str(tmp_path / "s.sqlite3"))
    try:
        rows = [TurnRow(1, "a", "b", (1,), (2,), b""), TurnRow(3, "c", "d", (3,), (4,), b"")]
        with pytest.raises(ValueError, match="one after the other"):
            store.add_turns("alice", "ctx-1", rows, [1, 2], 0.0)
        with pytest.raises(ValueError, match="one after the other"):
            store.add_turns("alice", "ctx-1", [], [], 0.0)
    finally:
        store.close()


def test_an_unknown_status_code_is_a_real_error():
    with pytest.raises(ValueError, match="unknown status code"):
        ChatError("NOPE", "x")


def run_chat(service, request, **kwargs):
    async def go():
        return [e async for e in service.chat(request, **kwargs)]
    return asyncio.run(go())


def test_n_choices_share_the_prompt_with_consecutive_seeds_and_the_context_keeps_the_first(tmp_path):
    engine = FakeEngine(seeded=True)
    service = make(tmp_path, engine)
    request = frontend_pb2.ChatRequest(token="ta", message="hi there", n=3, max_new_tokens=8,
                                       sampling=compute_pb2.Sampling(temperature=1.0, seed=2**64 - 1))
    events = run_chat(service, request)
    assert [t.sampling.seed for t in engine.turns] == [2**64 - 1, 0, 1]
    assert len({tuple(t.token_ids) for t in engine.turns}) == 1 and len({t.request_id for t in engine.turns}) == 3
    texts = {i: "".join(e.text for e in events if e.WhichOneof("event") == "text" and e.choice == i)
             for i in range(3)}
    assert texts == {0: f" s{2**64 - 1}w0 s{2**64 - 1}w1 s{2**64 - 1}w2", 1: " s0w0 s0w1 s0w2",
                     2: " s1w0 s1w1 s1w2"}
    summaries = [e for e in events if e.WhichOneof("event") == "summary"]
    assert [(e.choice, e.summary.choice, e.summary.reply) for e in summaries] == \
        [(i, i, texts[i]) for i in range(3)]
    ctx = events[0].context_id
    stored = service.store.turns("alice", ctx)
    assert [(t.user_message, t.reply) for t in stored] == [("hi there", texts[0])]
    assert service.store.get_context("alice", ctx).token_ids[-4:] == (50, 51, 52, STOP)
    assert service.tenants.snapshot()[1][("default", "generation")] == 12  # every choice's tokens
    with pytest.raises(ChatError) as err:
        run_chat(service, frontend_pb2.ChatRequest(token="ta", message="hi", n=9))
    assert err.value.param == "n"


def test_n_choices_count_n_times_the_prompt_against_the_users_share(tmp_path):
    service = make(tmp_path, FakeEngine())
    estimated = []
    enter = service.admission._enter
    service.admission._enter = lambda user, ctx, tokens: estimated.append(tokens) or enter(user, ctx, tokens)
    run_chat(service, frontend_pb2.ChatRequest(token="ta", message="one two three", n=1))
    run_chat(service, frontend_pb2.ChatRequest(token="ta", message="one two three", n=4))
    assert estimated[1] == 4 * estimated[0]


def test_text_events_carry_their_tokens_and_logprobs_the_trailing_ones_last(tmp_path):
    service = make(tmp_path, FakeEngine())
    sampling = compute_pb2.Sampling(logprobs=True, top_logprobs=2)
    events = run_chat(service, frontend_pb2.ChatRequest(token="ta", message="hi", sampling=sampling))
    texts = [e for e in events if e.WhichOneof("event") == "text"]
    assert [(e.text, [t.id for t in e.tokens]) for e in texts] == \
        [(" w0", [50]), (" w1", [51]), (" w2", [52]), ("", [STOP])]
    assert texts[0].tokens[0].logprob == -0.25 and len(texts[0].tokens[0].top_logprobs) == 2
    events = run_chat(service, frontend_pb2.ChatRequest(token="ta", message="hi"))
    assert [e.text for e in events if e.WhichOneof("event") == "text"] == [" w0", " w1", " w2"]


def test_a_whole_conversation_is_one_turn_of_a_new_context(tmp_path):
    engine = FakeEngine()
    service = make(tmp_path, engine, system_prompt="be kind")
    whole = Whole((("assistant", "hello"), ("user", "a"), ("user", "b")))
    events = run_chat(service, frontend_pb2.ChatRequest(token="ta"), whole=whole, ignore_eos=True)
    encoded = engine.encoded[-1]
    assert [(m.role, m.content) for m in encoded.messages] == \
        [("system", "be kind"), ("assistant", "hello"), ("user", "a"), ("user", "b")]
    assert encoded.add_generation_prompt and not encoded.continuation and engine.turns[-1].ignore_eos
    ctx = events[0].context_id
    assert [(t.turn, t.user_message, t.reply) for t in service.store.turns("alice", ctx)] == [(1, "b", " w0 w1 w2")]
    # the context goes on as any other
    events = run_turn(service, "more", context_id=ctx)
    assert events[-1].summary.turn == 2 and engine.encoded[-1].continuation
    # but messages rendered whole cannot continue it
    with pytest.raises(ChatError) as err:
        run_chat(service, frontend_pb2.ChatRequest(token="ta", context_id=ctx), whole=whole)
    assert err.value.param == "messages" and "without a session" in err.value.message
    run_chat(service, frontend_pb2.ChatRequest(token="ta"),
             whole=Whole((("user", "a"), ("assistant", "The")), False, True))
    assert engine.encoded[-1].continue_final_message and not engine.encoded[-1].add_generation_prompt


def test_a_grpc_request_is_greedy_by_default_and_draws_a_seed_only_when_sampled():
    request = chat_request(frontend_pb2.ChatRequest(message="hi"), draw_seed=lambda: 5)
    assert (request.sampling.temperature, request.sampling.seed) == (0.0, 0)
    sampled = frontend_pb2.ChatRequest(message="hi", sampling=compute_pb2.Sampling(temperature=0.7))
    assert chat_request(sampled, draw_seed=lambda: 5).sampling.seed == 5
    seeded = frontend_pb2.ChatRequest(message="hi", sampling=compute_pb2.Sampling(temperature=0.7, seed=3))
    assert chat_request(seeded, draw_seed=lambda: 5).sampling.seed == 3
    with pytest.raises(ChatError, match="message is empty"):
        chat_request(frontend_pb2.ChatRequest(message=" "))


class OneChoiceFails(FakeEngine):
    """The second choice's stream fails after its first token; the others wait until cancelled."""

    def __init__(self):
        super().__init__()
        self.cancelled = 0

    async def generate(self, request, route=None):
        self.turns.append(request)
        yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=50, text=" w0"))
        if request.sampling.seed == 1:
            raise ChatError("UNAVAILABLE", "the compute node went away")
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled += 1
            raise


def test_one_failing_choice_ends_the_turn_and_stops_the_others(tmp_path):
    engine = OneChoiceFails()
    service = make(tmp_path, engine)
    request = frontend_pb2.ChatRequest(token="ta", message="hi", n=3, sampling=compute_pb2.Sampling(seed=0))
    with pytest.raises(ChatError) as err:
        run_chat(service, request)
    assert err.value.code == "UNAVAILABLE" and engine.cancelled == 2
    assert service.store.counts()["contexts"] == 0 and service.admission.active == 0


def test_n_choices_of_a_prompt_start_after_the_first_gave_its_first_event():
    """merged(n): the first choice of each prompt alone prefills it; the others start once it streamed."""
    from chat_frontend.chat_service import merged

    log: list[str] = []

    async def choice(name: str, events: int):
        log.append(f"start {name}")
        for i in range(events):
            await asyncio.sleep(0.01)
            log.append(f"{name}{i}")
            yield f"{name}{i}"

    async def run(streams, n):
        return [event async for event in merged(streams, n)]

    got = asyncio.run(run([choice("a", 2), choice("b", 2), choice("c", 1), choice("d", 1)], 2))
    assert sorted(got) == ["a0", "a1", "b0", "b1", "c0", "d0"]
    assert log.index("start b") > log.index("a0") and log.index("start d") > log.index("c0")
    assert log.index("start c") < log.index("a0")  # another prompt's first choice does not wait

