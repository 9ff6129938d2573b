"""/v1/completions in process over a fake engine (the chat API's fakes.FakeEngine, with raw-text
encoding, Decode and Stats added; the other endpoints' tests use it too)."""
import asyncio
import json

from aiohttp.test_utils import TestClient, TestServer

from chat_frontend.chat_service import ChatService
from chat_frontend.http_api import OpenAiApi
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import SessionStore
from kvtb_proto import compute_pb2

from .fakes import FakeEngine

AUTH = {"Authorization": "Bearer t-alice"}
OPERATOR = {"Authorization": "Bearer t-ops"}
BOS = 1


class TextEngine(FakeEngine):
    """FakeEngine that encodes raw text (one id per word, 10 + its length; BOS first when asked) and
    decodes ids back as words of that length ("xxx" for 13); its Stats say what it ran."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.decoded: list[list[int]] = []

    async def encode_chat(self, request: compute_pb2.EncodeChatRequest) -> list[int]:
        if not request.text:
            return await super().encode_chat(request)
        self.encoded.append(request)
        return [BOS] * request.add_special_tokens + [10 + len(w) for w in request.text.split()]

    async def decode(self, token_ids: list[int]) -> str:
        self.decoded.append(list(token_ids))
        return " ".join("x" * (i - 10) if i > 10 else "" for i in token_ids)

    async def compute_stats(self) -> compute_pb2.ComputeStatsResponse:
        return compute_pb2.ComputeStatsResponse(
            turns=len(self.turns), num_requests_running=1, num_requests_waiting=2, num_requests_restoring=1,
            kv_cache_usage_perc=0.25, tokens_prefilled=40, tokens_reused=8, tokens_out=len(self.turns) * 4,
            prefix_cache_queries=48, prefix_cache_hits=8)


def run(engine, scenario, **settings):
    async def main():
        settings.setdefault("users", {"alice": "t-alice", "ops": "t-ops"})
        settings.setdefault("operators", ("ops",))
        service = ChatService(FrontendSettings(**settings), SessionStore(":memory:"), engine)
        app = OpenAiApi(service, lambda: True, lambda: "fake").app()
        async with TestClient(TestServer(app)) as client:
            return await scenario(client)
    return asyncio.run(main())


def post(path, body, headers=AUTH):
    async def scenario(client):
        r = await client.post(path, headers=headers, json=body)
        return r.status, await r.json()
    return scenario


def completion(engine, headers=AUTH, **body):
    return run(engine, post("/v1/completions", {"model": "fake", **body}, headers))


def events(text: str) -> list:
    return [line[len("data: "):] for line in text.split("\n\n") if line.startswith("data: ")]


def test_a_string_prompt_is_raw_text_with_special_tokens_and_16_tokens_by_default():
    engine = TextEngine(stop=False, reply_words=3)
    status, body = completion(engine, prompt="once upon a time")
    assert status == 200, body
    assert engine.encoded[0].text == "once upon a time" and engine.encoded[0].add_special_tokens
    turn = engine.turns[0]
    assert list(turn.token_ids) == [BOS, 14, 14, 11, 14] and turn.max_new_tokens == 16
    assert turn.sampling.temperature == 1.0 and turn.sampling.seed  # vLLM's defaults: sampled, a seed drawn
    assert turn.user_id == "alice" and turn.context_id.startswith("ctx-")
    assert body["object"] == "text_completion" and body["id"].startswith("cmpl-")
    choice = body["choices"][0]
    assert choice["text"] == " w0 w1 w2" and choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert body["usage"]["prompt_tokens"] == 5 and body["usage"]["completion_tokens"] == 3


def test_prompts_as_token_ids_and_n_choices_index_prompt_major():
    engine = TextEngine(seeded=True)
    status, body = completion(engine, prompt=[[21, 22], [23]], n=2, seed=7, add_special_tokens=False)
    assert status == 200, body
    # each prompt's first choice at once, its second once the first streamed (its prompt prefilled once)
    assert [list(t.token_ids) for t in engine.turns] == [[21, 22], [23], [21, 22], [23]]
    assert [t.sampling.seed for t in engine.turns] == [7, 7, 8, 8]
    assert len({t.context_id for t in engine.turns}) == 1  # one request, one fresh context
    assert [c["index"] for c in body["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in body["choices"]] == [" s7w0 s7w1 s7w2", " s8w0 s8w1 s8w2"] * 2
    assert body["choices"][0]["finish_reason"] == "stop" and body["choices"][0]["stop_reason"] is None
    assert body["usage"]["prompt_tokens"] == 3 and body["usage"]["completion_tokens"] == 16
    status, body = completion(TextEngine(), prompt=[5, 6, 7])  # one prompt of ids
    assert status == 200 and len(body["choices"]) == 1


def test_sampling_fields_reach_the_engine():
    engine = TextEngine()
    status, body = completion(engine, prompt="hi", stop=["w2"], stop_token_ids=[9], temperature=0, top_k=5,
                              min_tokens=2, ignore_eos=True, include_stop_str_in_output=True, max_tokens=4)
    assert status == 200, body
    s = engine.turns[0].sampling
    assert list(s.stop) == ["w2"] and list(s.stop_token_ids) == [9] and s.temperature == 0 and s.top_k == 5
    assert s.min_tokens == 2 and s.include_stop_str_in_output and engine.turns[0].ignore_eos
    assert engine.turns[0].max_new_tokens == 4


def test_logprobs_in_the_completions_shape():
    status, body = completion(TextEngine(), prompt="hi", logprobs=2)
    assert status == 200, body
    lp = body["choices"][0]["logprobs"]
    assert lp["tokens"] == [" w0", " w1", " w2", "<|im_end|>"]
    assert lp["token_logprobs"] == [-0.25] * 4
    assert lp["text_offset"] == [0, 3, 6, 9]  # where each token's text begins in the choice's text
    assert lp["top_logprobs"][0] == {" w0": -0.25, "t0": -0.25, "t1": -1.25}  # the sampled one and the top 2


def test_echo_prepends_the_prompt_text_and_echo_alone_generates_nothing():
    engine = TextEngine(reply_words=1)
    status, body = completion(engine, prompt=["say", [13, 12]], echo=True)
    assert status == 200, body
    assert [c["text"] for c in body["choices"]] == ["say w0", "xxx xx w0"]
    status, body = completion(engine, prompt="say it", echo=True, max_tokens=0)
    assert status == 200 and body["choices"][0]["text"] == "say it" and len(engine.turns) == 2
    assert body["usage"]["completion_tokens"] == 0 and body["usage"]["prompt_tokens"] == 3


def test_refusals_name_the_field():
    cases = [({"prompt": "x", "logprobs": 1, "echo": True}, 400, "echo"),
             ({"prompt": "x", "suffix": "end"}, 400, "suffix"),
             ({"prompt": "x", "best_of": 3}, 400, "best_of"),
             ({"prompt": "x", "prompt_logprobs": 1}, 400, "prompt_logprobs"),
             ({"prompt": "x", "frobnicate": 1}, 400, "frobnicate"),
             ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens"),
             ({"prompt": "x", "logprobs": 6}, 400, "logprobs"),
             ({"prompt": ["x"] * 33}, 400, "prompt"),
             ({"prompt": []}, 400, "prompt"),
             ({"prompt": [[1], "x", 3]}, 400, "prompt"),
             ({"prompt": "x", "n": 9}, 400, "n"),
             ({"prompt": "x", "temperature": -1}, 400, "temperature"),
             ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options"),
             ({"prompt": "x", "model": "gpt-4"}, 404, "model")]
    for body, status, param in cases:
        got, answer = completion(TextEngine(), **body)
        assert (got, answer["error"]["param"]) == (status, param), (body, answer)


def test_401_before_anything_else_and_the_context_checked_in_tokens():
    status, body = run(TextEngine(), post("/v1/completions", {"frobnicate": 1}, {}))
    assert status == 401 and body["error"]["code"] == "unauthenticated"
    engine = TextEngine(max_context_tokens=20)
    status, body = completion(engine, prompt=" ".join(["word"] * 10), max_tokens=12)
    assert status == 400 and body["error"] == {
        "message": "This model's maximum context length is 20 tokens. However, you requested 23 tokens "
                   "(11 in the messages, 12 in the completion). Please reduce the length of the messages or "
                   "completion.",
        "type": "invalid_request_error", "param": "max_tokens", "code": "context_length_exceeded"}
    assert engine.turns == []


def test_max_tokens_up_to_the_context_and_the_overflow_in_vllms_words():
    engine = TextEngine(max_context_tokens=8192, stop=False)
    status, body = completion(engine, prompt="once upon a time")
    assert status == 200 and engine.turns[-1].max_new_tokens == 16  # vLLM's completions default
    status, body = completion(engine, prompt="once upon a time", max_tokens=4096)
    assert status == 200 and engine.turns[-1].max_new_tokens == 4096  # over the old cap of 1,024
    assert body["choices"][0]["finish_reason"] == "length"
    status, body = completion(engine, prompt="once upon a time", max_tokens=8188)  # 5 prompt tokens: 8193
    assert (status, body["error"]["code"], body["error"]["param"]) == \
        (400, "context_length_exceeded", "max_tokens")
    assert "However, you requested 8193 tokens (5 in the messages, 8188 in the completion)." in \
        body["error"]["message"]
    long = " ".join(["word"] * 8190)  # 8191 tokens with BOS: no room for the default 16
    status, body = completion(engine, prompt=["short", long])
    assert (status, body["error"]["code"], body["error"]["param"]) == \
        (400, "context_length_exceeded", "prompt")
    status, body = completion(engine, prompt=[1] * 8192, max_tokens=1)  # the prompt alone fills the context
    assert (status, body["error"]["param"]) == (400, "prompt")
    status, body = completion(engine, prompt=[1] * 8192, echo=True, max_tokens=0)  # echo alone: it fits
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    turns = len(engine.turns)
    request = {"model": "fake", "prompt": "a b", "max_tokens": 4096}
    status, body = run(engine, post("/v1/completions", request), max_new_tokens_cap=100)
    assert status == 200 and engine.turns[turns].max_new_tokens == 100  # the cap lowers, never refuses


def test_streaming_chunks_usage_and_done():
    async def scenario(client):
        r = await client.post("/v1/completions", headers=AUTH, json={
            "model": "fake", "prompt": ["a b", "c"], "n": 2, "stream": True, "echo": True,
            "stream_options": {"include_usage": True}})
        return r.status, await r.text()
    status, text = run(TextEngine(), scenario)
    data = events(text)
    assert status == 200 and data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    texts = {i: "".join(c["choices"][0]["text"] for c in chunks if c["choices"] and c["choices"][0]["index"] == i)
             for i in range(4)}
    assert texts == {0: "a b w0 w1 w2", 1: "a b w0 w1 w2", 2: "c w0 w1 w2", 3: "c w0 w1 w2"}
    finishes = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]]
    assert sorted(f for f in finishes if f) == ["stop"] * 4
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 16
    assert chunks[-1]["usage"]["prompt_tokens"] == 5  # [BOS a b] and [BOS c], each once


def test_a_refusal_of_the_compute_node_is_a_400_before_the_stream():
    class Refusing(TextEngine):
        async def generate(self, request, route=None):
            from chat_frontend.errors import ChatError
            raise ChatError("INVALID_ARGUMENT", "agent: sampling.stop_token_ids: 9 is outside the vocabulary")
            yield  # pragma: no cover

    status, body = completion(Refusing(), prompt="x", stream=True, stop_token_ids=[9])
    assert status == 400 and body["error"]["param"] == "stop_token_ids"
