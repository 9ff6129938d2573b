"""The OpenAI API in process over a fake engine: finish reasons, usage, an error after streaming began."""
import asyncio
import json

import aiohttp

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from chat_frontend.chat_service import ChatService
from chat_frontend.errors import ChatError
from chat_frontend.http_api import OpenAiApi, start
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import SessionStore
from kvtb_proto import compute_pb2

from .fakes import FakeEngine

AUTH = {"Authorization": "Bearer t-alice"}
SERVICE = web.AppKey("service", ChatService)
BODY = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}]}


class FailingEngine(FakeEngine):
    async def generate(self, request, route=None):
        yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=50, text=" w0"))
        raise ChatError("UNAVAILABLE", "the agent went away")


def run(engine, scenario):
    async def main():
        service = ChatService(FrontendSettings(users={"alice": "t-alice"}), SessionStore(":memory:"), engine)
        api = OpenAiApi(service, lambda: True, lambda: "fake")
        app = api.app()
        app[SERVICE] = service
        async with TestClient(TestServer(app)) as client:
            return await scenario(client)
    return asyncio.run(main())


def events(text: str) -> list:
    return [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]


def test_length_finish_and_usage_chunk():
    async def scenario(client):
        r = await client.post("/v1/chat/completions", headers=AUTH, json={
            **BODY, "stream": True, "stream_options": {"include_usage": True}, "max_tokens": 3})
        return r.status, r.headers["X-Session-Id"], await r.text()
    status, session, text = run(FakeEngine(stop=False), scenario)
    data = events(text)
    assert status == 200 and session.startswith("ctx-") and data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 3


def test_an_error_after_streaming_began_is_the_last_event():
    async def scenario(client):
        r = await client.post("/v1/chat/completions", headers=AUTH, json={**BODY, "stream": True})
        return r.status, await r.text()
    status, text = run(FailingEngine(), scenario)
    data = events(text)
    assert status == 200 and data[-1] == "[DONE]"
    error = json.loads(data[-2])["error"]
    assert error["code"] == "unavailable" and "went away" in error["message"]


def test_a_continued_session_sends_only_the_new_message():
    async def scenario(client):
        first = await client.post("/v1/chat/completions", headers=AUTH, json=BODY)
        session = first.headers["X-Session-Id"]
        second = await client.post("/v1/chat/completions", headers={**AUTH, "X-Session-Id": session},
                                   json={"model": "fake", "messages": [{"role": "user", "content": "more"}]})
        return session, second.headers["X-Session-Id"], await second.json()
    engine = FakeEngine()
    session, again, body = run(engine, scenario)
    assert again == session and body["choices"][0]["message"]["content"] == " w0 w1 w2"
    assert engine.turns[1].context_id == session and engine.encoded[1].continuation


class SlowEngine(FakeEngine):
    async def generate(self, request, route=None):
        self.turns.append(request)
        for i in range(1000):
            await asyncio.sleep(0.005)
            yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=50, text=f" w{i}"))


def test_a_client_that_goes_away_ends_the_turn():
    async def scenario(client):
        r = await client.post("/v1/chat/completions", headers=AUTH, json={**BODY, "stream": True})
        await r.content.readline()
        r.close()  # hang up mid-stream
        for _ in range(200):
            await asyncio.sleep(0.01)
            if client.app[SERVICE].admission.active == 0:
                return client.app[SERVICE].turns_failed
        return None
    assert run(SlowEngine(), scenario) == 1


class QueuedEngine(FakeEngine):
    """A turn that waits in the engine's queue (no token yet) until it is cancelled."""
    def __init__(self):
        super().__init__()
        self.cancelled = asyncio.Event()

    async def generate(self, request, route=None):
        self.turns.append(request)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=50, text=" late"))


def test_a_client_that_goes_away_while_its_turn_is_queued_ends_the_turn():
    """Served as the frontend serves it (http_api.start: aiohttp's TestServer always cancels handlers)."""
    engine = QueuedEngine()

    async def main():
        service = ChatService(FrontendSettings(users={"alice": "t-alice"}), SessionStore(":memory:"), engine)
        runner, address = await start(OpenAiApi(service, lambda: True, lambda: "fake"), "127.0.0.1:0")
        try:
            async with aiohttp.ClientSession() as session:
                post = asyncio.ensure_future(session.post(f"http://{address}/v1/chat/completions", headers=AUTH,
                                                          json={**BODY, "stream": True}))
                for _ in range(500):                   # the turn reached the engine
                    await asyncio.sleep(0.01)
                    if engine.turns:
                        break
                post.cancel()                          # hang up before the first token
                try:
                    await asyncio.wait_for(engine.cancelled.wait(), 5.0)
                except asyncio.TimeoutError:
                    return "the engine's call went on"
                for _ in range(200):
                    await asyncio.sleep(0.01)
                    if service.admission.active == 0:
                        return "ended"
                return "the admission slot stayed taken"
        finally:
            await runner.cleanup()
    assert asyncio.run(main()) == "ended"


def test_n_choices_and_logprobs_in_openai_s_shape():
    async def scenario(client):
        body = {**BODY, "n": 2, "seed": 7, "logprobs": True, "top_logprobs": 1, "stop_token_ids": [2]}
        r = await client.post("/v1/chat/completions", headers=AUTH, json=body)
        return r.status, await r.json()
    engine = FakeEngine(seeded=True)
    status, body = run(engine, scenario)
    assert status == 200 and [t.sampling.seed for t in engine.turns] == [7, 8]
    assert engine.turns[0].sampling.temperature == 1.0  # vLLM's default
    choices = body["choices"]
    assert [(c["index"], c["message"]["content"]) for c in choices] == [(0, " s7w0 s7w1 s7w2"), (1, " s8w0 s8w1 s8w2")]
    assert [c["stop_reason"] for c in choices] == [2, 2] and choices[0]["finish_reason"] == "stop"
    content = choices[1]["logprobs"]["content"]
    assert [c["token"] for c in content] == [" s8w0", " s8w1", " s8w2", "<|im_end|>"]
    assert content[0] == {"token": " s8w0", "logprob": -0.25, "bytes": list(b" s8w0"),
                          "top_logprobs": [{"token": "t0", "logprob": -0.25, "bytes": [116, 48]}]}
    assert body["usage"]["completion_tokens"] == 8  # both choices'


def test_n_choices_stream_with_their_index_and_logprobs_per_chunk():
    async def scenario(client):
        body = {**BODY, "n": 2, "stream": True, "logprobs": True, "stream_options": {"include_usage": True}}
        r = await client.post("/v1/chat/completions", headers=AUTH, json=body)
        return r.status, await r.text()
    status, text = run(FakeEngine(), scenario)
    chunks = [json.loads(d) for d in events(text)[:-1]]
    assert status == 200 and [c["choices"][0]["delta"] for c in chunks[:2]] == [{"role": "assistant", "content": ""}] * 2
    for i in range(2):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert "".join(c["delta"].get("content", "") for c in mine) == " w0 w1 w2"
        tokens = [t["token"] for c in mine if c["logprobs"] for t in c["logprobs"]["content"]]
        assert tokens == [" w0", " w1", " w2", "<|im_end|>"]
        assert mine[-1]["finish_reason"] == "stop" and mine[-1]["stop_reason"] is None  # the model's own end
    assert chunks[-1]["usage"]["completion_tokens"] == 8


class RefusingEngine(FakeEngine):
    async def generate(self, request, route=None):
        raise ChatError("INVALID_ARGUMENT", "agent: sampling.structured: the JSON schema does not compile")
        yield  # an async generator


def test_a_compute_node_refusal_is_a_400_naming_the_field_even_when_streamed():
    async def scenario(client):
        out = []
        for stream in (False, True):
            r = await client.post("/v1/chat/completions", headers=AUTH, json={
                **BODY, "stream": stream, "response_format": {"type": "json_object"}})
            out.append((r.status, await r.json()))
        return out
    for status, body in run(RefusingEngine(), scenario):
        assert status == 400 and body["error"]["param"] == "response_format"
        assert "does not compile" in body["error"]["message"]


def test_a_trailing_assistant_message_is_continued_or_closed():
    async def scenario(client):
        messages = [{"role": "user", "content": "count"}, {"role": "assistant", "content": "one two"}]
        for extra in ({"continue_final_message": True, "add_generation_prompt": False}, {}):
            r = await client.post("/v1/chat/completions", headers=AUTH, json={**BODY, "messages": messages, **extra})
            assert r.status == 200, await r.text()
    engine = FakeEngine()
    run(engine, scenario)
    assert [(e.continue_final_message, e.add_generation_prompt) for e in engine.encoded] == [(True, False), (False, True)]
