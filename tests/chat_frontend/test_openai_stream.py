"""The OpenAI API in process over a fake engine: finish reasons, usage, an error after streaming began."""
import asyncio
import json

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from chat_frontend.chat_service import ChatService
from chat_frontend.errors import ChatError
from chat_frontend.http_api import OpenAiApi
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import SessionStore
from kvtb_proto import compute_pb2

from .fakes import FakeEngine

AUTH = {"Authorization": "Bearer t-alice"}
SERVICE = web.AppKey("service", ChatService)
BODY = {"model": "fake", "messages": [{"role": "user", "content": "hello there"}]}


class FailingEngine(FakeEngine):
    async def generate(self, request):
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
    async def generate(self, request):
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
