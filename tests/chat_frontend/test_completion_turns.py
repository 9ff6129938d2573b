"""Completions' raw-token turns: the context checked in tokens, the user's fair share, the counts."""
import asyncio
import json

import pytest

from chat_frontend import completions_format as cf
from chat_frontend.chat_service import ChatService
from chat_frontend.completion_turns import CompletionTurns, Finished, Token, fit_tokens
from chat_frontend.errors import ChatError
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import SessionStore
from chat_frontend.vllm_metrics import FinishCounts

from .fakes import FakeEngine


def request(**body) -> cf.CompletionsRequest:
    return cf.parse_request(json.dumps({"model": "fake", "prompt": [[20, 21]], **body}).encode(), 4,
                            draw_seed=lambda: 3)


def overflow(req, prompt_tokens, context) -> ChatError:
    with pytest.raises(ChatError) as info:
        fit_tokens(req, prompt_tokens, context)
    assert (info.value.code, info.value.openai_code) == ("INVALID_ARGUMENT", "context_length_exceeded")
    return info.value


def test_fit_tokens_is_vllms_check_in_vllms_words():
    assert fit_tokens(request(max_tokens=6), 10, 16) == 6
    assert fit_tokens(request(max_tokens=4096), 10, 4096 + 10) == 4096
    assert fit_tokens(request(max_tokens=4096), 10, 8192, cap=1024) == 1024  # the cap lowers, never refuses
    err = overflow(request(max_tokens=8), 10, 16)
    assert err.param == "max_tokens" and err.message == (
        "This model's maximum context length is 16 tokens. However, you requested 18 tokens (10 in the "
        "messages, 8 in the completion). Please reduce the length of the messages or completion.")
    assert overflow(request(), 10, 20).param == "prompt"  # the default 16 was not asked: the prompt is too long
    assert fit_tokens(request(), 4, 20) == 16
    assert overflow(request(max_tokens=1), 20, 20).param == "prompt"  # a prompt must leave a token
    assert fit_tokens(request(echo=True, max_tokens=0), 20, 20) == 0  # echo alone: the prompt only
    assert overflow(request(echo=True, max_tokens=0), 21, 20).param == "prompt"


def run(engine, scenario, **settings):
    async def main():
        service = ChatService(FrontendSettings(users={"alice": "t-alice"}, tenants={"alice": "team-a"}, **settings),
                              SessionStore(":memory:"), engine)
        turns = CompletionTurns(service, FinishCounts())
        return await scenario(service, turns)
    return asyncio.run(main())


def test_a_request_runs_its_choices_and_counts_them_for_the_tenant():
    engine = FakeEngine(stop=False, reply_words=2)

    async def scenario(service, turns):
        events = [e async for e in turns.run("alice", request(n=2, prompt=[[20, 21], [22]]), [[20, 21], [22]], 0)]
        return events, service.tenants.snapshot(), turns.finishes.counts, service.turns_completed
    events, (by_status, tokens), finishes, completed = run(engine, scenario)
    assert sorted(e.index for e in events if isinstance(e, Finished)) == [0, 1, 2, 3]
    assert sum(isinstance(e, Token) for e in events) == 8
    # each prompt's first choice at once, its second once the first streamed (the prompt prefilled once)
    assert [t.request_id.split("-")[-1] for t in engine.turns[1:]] == ["2", "1", "3"]
    assert all(t.tenant == "team-a" and t.user_id == "alice" for t in engine.turns)
    assert by_status == {("team-a", "ok"): 1} and tokens[("team-a", "generation")] == 8
    assert finishes == {"length": 4} and completed == 1


def test_past_the_users_quota_it_is_refused_and_counted():
    engine = FakeEngine()
    gate = asyncio.Event()

    class Held(FakeEngine):
        async def generate(self, request, route=None):
            await gate.wait()
            async for event in engine.generate(request):
                yield event

    async def scenario(service, turns):
        first = turns.run("alice", request(), [[20, 21]], 0)
        started = asyncio.ensure_future(anext(first))
        await asyncio.sleep(0.05)  # the first holds the user's one place
        second = turns.run("alice", request(), [[20, 21]], 0)
        waiting = asyncio.ensure_future(anext(second))  # its one waiting turn
        await asyncio.sleep(0.05)
        with pytest.raises(ChatError) as info:
            await anext(turns.run("alice", request(), [[20, 21]], 0))
        gate.set()
        await started
        await first.aclose()
        await waiting
        await second.aclose()
        return info.value, service.tenants.snapshot()[0]
    refusal, by_status = run(Held(), scenario, user_max_concurrent_turns=1, user_max_waiting_turns=1)
    assert refusal.code == "RESOURCE_EXHAUSTED" and "over your quota" in refusal.message
    assert by_status[("team-a", "RESOURCE_EXHAUSTED")] == 1
