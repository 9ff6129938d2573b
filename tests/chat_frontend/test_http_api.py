"""The OpenAI API of a real frontend process in front of a fake agent: the `openai` client,
errors in OpenAI's shape, /health and /metrics; token limits and messages' fields in process."""
import asyncio
import http.client
import json
import random
import socket
import urllib.error
import urllib.request

import grpc
import openai
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from chat_frontend.agent_client import chat_error
from chat_frontend.chat_service import ChatService
from chat_frontend.http_api import OpenAiApi
from chat_frontend.settings import FrontendSettings
from chat_frontend.store import SessionStore
from kvtb.grpc_health import wait_serving
from kvtb.launch import free_port
from kvtb_proto import compute_pb2

from . import fake_agent
from .fakes import FakeEngine

TOKEN = "t-alice"
HI = [{"role": "user", "content": "hi"}]


SHARED_PROMPT = "You help team A."


def start_frontend(start_service, tmp_path, **settings) -> tuple[dict, fake_agent.FakeComputeNode, object]:
    """A frontend process (with `settings` added) and its fake agent: (addresses, fake node, its server)."""
    agent_address = f"127.0.0.1:{free_port()}"
    cfg = tmp_path / "kvtb.yaml"
    cfg.write_text(yaml.safe_dump({"frontend": {
        "listen_address": "127.0.0.1:0", "agent_address": agent_address, "data_dir": str(tmp_path / "fe"),
        "users": {"alice": TOKEN, "bob": "t-bob", "carol": "t-carol"},
        "tenants": {"alice": "team-a", "carol": "team-a"}, "info_retry_s": 0.1,
        "shared_system_prompts": {"team-a": SHARED_PROMPT}, "storage_admin_addresses": [], **settings}}))
    proc = start_service("frontend", "serve", "frontend", "--config", str(cfg))
    addresses = proc.addresses
    assert get(addresses["http"], "/health")[0] == 503  # loading: no agent yet
    server, node, _ = fake_agent.serve(agent_address)
    assert wait_serving(addresses["grpc"], timeout_s=10)
    return addresses, node, server


@pytest.fixture
def frontend(start_service, tmp_path):
    """A frontend and its fake agent; the frontend's announced addresses."""
    addresses, _, server = start_frontend(start_service, tmp_path)
    yield addresses
    server.stop(0)


def get(address: str, path: str, token: str = "") -> tuple[int, dict | str]:
    request = urllib.request.Request(f"http://{address}{path}",
                                     headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            status, body = response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        status, body = exc.code, exc.read().decode()
    try:
        return status, json.loads(body)
    except json.JSONDecodeError:
        return status, body


def post(address: str, body: dict | bytes, token: str = TOKEN, session: str = "",
         extra_headers: dict | None = None) -> tuple[int, dict, dict]:
    """(status, JSON body, headers); a body that is not JSON fails the test here."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}", **(extra_headers or {})}
    if session:
        headers["X-Session-Id"] = session
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(f"http://{address}/v1/chat/completions", data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read()), dict(exc.headers)


def client(address: str, token: str = TOKEN) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{address}/v1", api_key=token, max_retries=0)


def test_openai_client_streams_and_continues(frontend):
    api = client(frontend["http"])
    assert [m.id for m in api.models.list()] == ["fake"]
    assert get(frontend["http"], "/health") == (200, {"status": "ok", "model": "fake"})
    raw = api.chat.completions.with_raw_response.create(
        model="fake", messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True})
    session = raw.headers["x-session-id"]
    chunks = list(raw.parse())
    assert session.startswith("ctx-")
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == " ok"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 2
    # the whole history back, as a client keeps it: the stored transcript matches
    reply = api.chat.completions.create(
        model="fake", extra_headers={"X-Session-Id": session},
        messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": " ok"},
                  {"role": "user", "content": "again"}])
    assert reply.choices[0].message.content == " ok" and reply.choices[0].finish_reason == "stop"
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens == 0  # the fake agent reuses nothing


def test_openai_client_takes_n_choices_and_logprobs(frontend):
    api = client(frontend["http"])
    reply = api.chat.completions.create(model="fake", messages=HI, n=2, logprobs=True, top_logprobs=2, seed=1)
    assert [(c.index, c.message.content, c.finish_reason) for c in reply.choices] == [(0, " ok", "stop"),
                                                                                      (1, " ok", "stop")]
    content = reply.choices[1].logprobs.content
    assert [(t.token, t.logprob, t.bytes) for t in content] == [(" ok", -0.5, list(b" ok")),
                                                                ("<|im_end|>", -0.5, list(b"<|im_end|>"))]
    assert [t.token for t in content[0].top_logprobs] == ["t0", "t1"]
    assert reply.usage.completion_tokens == 4
    chunks = list(api.chat.completions.create(model="fake", messages=HI, n=2, stream=True, logprobs=True))
    for i in range(2):
        mine = [c.choices[0] for c in chunks if c.choices and c.choices[0].index == i]
        assert "".join(c.delta.content or "" for c in mine) == " ok" and mine[-1].finish_reason == "stop"
        assert [t.token for c in mine if c.logprobs for t in c.logprobs.content] == [" ok", "<|im_end|>"]
    with pytest.raises(openai.BadRequestError) as err:
        api.chat.completions.create(model="fake", messages=HI, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert "tool calling is not supported" in err.value.message and err.value.body["param"] == "tools"


BAD_REQUESTS = [  # body, token, session, HTTP status, error code
    ({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}, "nope", "", 401, "unauthenticated"),
    (b"{not json", TOKEN, "", 400, "invalid_argument"),
    ({"model": "fake", "messages": []}, TOKEN, "", 400, "invalid_argument"),
    ({"model": "fake", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "c"}],
      "continue_final_message": True}, TOKEN, "", 400, "invalid_argument"),
    ({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "store": True}, TOKEN, "", 400,
     "invalid_argument"),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, TOKEN, "", 404, "not_found"),
    ({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}, TOKEN, "ctx none", 400,
     "invalid_argument"),
    ({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, TOKEN, "",
     400, "context_length_exceeded"),
    ({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2**31}, TOKEN, "",
     400, "invalid_argument"),
]


def test_errors_have_the_openai_shape(frontend):
    for body, token, session, status, code in BAD_REQUESTS:
        got_status, got, _ = post(frontend["http"], body, token, session)
        assert got_status == status, got
        assert set(got["error"]) == {"message", "type", "param", "code"} and got["error"]["code"] == code


def test_sessions_belong_to_their_user(frontend):
    status, body, headers = post(frontend["http"], {"model": "fake", "messages": HI})
    assert status == 200 and body["object"] == "chat.completion"
    session = headers["X-Session-Id"]
    status, body, headers = post(frontend["http"], {"model": "fake", "messages": HI}, token="t-bob",
                                 session=session)
    assert status == 200 and headers["X-Session-Id"] == session  # bob's own context of that id
    with pytest.raises(openai.BadRequestError):  # a history that is not the transcript
        client(frontend["http"]).chat.completions.create(
            model="fake", extra_headers={"X-Session-Id": session},
            messages=[{"role": "user", "content": "something else"}, {"role": "assistant", "content": " ok"},
                      {"role": "user", "content": "next"}])


def test_metrics_move_after_a_turn(frontend):
    def scrape() -> dict[str, float]:
        status, text = get(frontend["metrics"], "/metrics")
        assert status == 200
        return {(s.name + json.dumps(s.labels, sort_keys=True)): s.value
                for family in text_string_to_metric_families(text) for s in family.samples}

    before = scrape()
    assert 'kvtb:e2e_request_latency_seconds_count{"tenant": "team-a"}' not in before
    client(frontend["http"]).chat.completions.create(model="fake", messages=HI)
    client(frontend["http"], "t-bob").chat.completions.create(model="fake", messages=HI)
    post(frontend["http"], {"model": "fake", "messages": HI, "max_tokens": 300})  # over the context
    after = scrape()
    assert after['kvtb:e2e_request_latency_seconds_count{"tenant": "team-a"}'] == 1
    assert after['kvtb:time_to_first_token_seconds_count{"tenant": "team-a"}'] == 1
    assert after['kvtb:requests_total{"status": "ok", "tenant": "team-a"}'] == 1
    assert after['kvtb:requests_total{"status": "INVALID_ARGUMENT", "tenant": "team-a"}'] == 1
    assert after['kvtb:generation_tokens_total{"tenant": "team-a"}'] == 2
    assert after['kvtb:requests_total{"status": "ok", "tenant": "default"}'] == 1  # bob: no tenant listed
    assert after["kvtb:num_requests_running{}"] == 0
    text = get(frontend["metrics"], "/metrics")[1]
    assert "alice" not in text and "bob" not in text  # no user name, as a label or anywhere


GOOD = {"model": "fake", "messages": HI}
NESTED = b'{"model": "fake", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
BAD_INPUTS = [  # (what, body, HTTP status, param or None): each is refused in OpenAI's shape
    *[(f"max_tokens {v!r}", {**GOOD, "max_tokens": v}, 400, "max_tokens")
      for v in (10**12, 2**32, 2**70, float("inf"), float("nan"), -1, 1.5, "10", True, 1025)],
    ("max_completion_tokens 2^32", {**GOOD, "max_completion_tokens": 2**32}, 400, "max_completion_tokens"),
    *[(f"seed {v!r}", {**GOOD, "seed": v}, 400, "seed") for v in (2**64, 2**63, -2**63 - 1, float("nan"), 0.5)],
    *[(f"temperature {v!r}", {**GOOD, "temperature": v}, 400, "temperature")
      for v in (float("nan"), float("inf"), -1, 101, "hot")],
    *[(f"top_p {v!r}", {**GOOD, "top_p": v}, 400, "top_p") for v in (float("nan"), -0.1, 1.5, [])],
    *[(f"n {v!r}", {**GOOD, "n": v}, 400, "n") for v in (9, 0, 2**70, float("nan"), True)],
    ("a lone surrogate in a message", {**GOOD, "messages": [{"role": "user", "content": "hi \ud800"}]}, 400,
     "messages[0].content"),
    ("a lone surrogate in a content part", {**GOOD, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "\udfff"}]}]}, 400, "messages[0].content[0].text"),
    ("a lone surrogate in the model", {**GOOD, "model": "\ud800"}, 400, "model"),
    ("a lone surrogate in a key", {**GOOD, "\ud800": 1}, 400, None),
    ("a role that is not a string", {**GOOD, "messages": [{"role": 5, "content": "hi"}]}, 400, "messages[0]"),
    ("a tool message", {**GOOD, "messages": [{"role": "tool", "content": "hi"}]}, 400, "messages[0].role"),
    ("tools", {**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "tools"),
    ("an unknown field", {**GOOD, "temprature": 0}, 400, "temprature"),
    ("max_tokens 0", {**GOOD, "max_tokens": 0}, 400, "max_tokens"),
    ("an image part", {**GOOD, "messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400,
     "messages[0].content"),
    ("a text part that is a number", {**GOOD, "messages": [{"role": "user", "content": [
        {"type": "text", "text": 5}]}]}, 400, "messages[0].content"),
    ("a name that is a number", {**GOOD, "messages": [{"role": "user", "content": "hi", "name": 5}]}, 400,
     "messages[0].name"),
    ("messages that are an object", {**GOOD, "messages": {"role": "user"}}, 400, "messages"),
    ("a message that is a string", {**GOOD, "messages": ["hi"]}, 400, "messages[0]"),
    ("17 stop sequences", {**GOOD, "stop": ["a"] * 17}, 400, "stop"),
    ("stop that is a number", {**GOOD, "stop": 5}, 400, "stop"),
    ("stream that is a string", {**GOOD, "stream": "yes"}, 400, "stream"),
    ("stream_options that is a list", {**GOOD, "stream": True, "stream_options": []}, 400, "stream_options"),
    ("include_usage that is a string", {**GOOD, "stream": True, "stream_options": {"include_usage": "yes"}},
     400, "stream_options.include_usage"),
    ("user that is an object", {**GOOD, "user": {}}, 400, "user"),
    ("a message past the model's context", {**GOOD, "messages": [{"role": "user", "content": "a " * 300}]},
     400, "messages"),
    ("an unknown field in a message", {**GOOD, "messages": [{"role": "user", "content": "hi", "weird": 1}]}, 400,
     "messages[0].weird"),
    ("an unknown field in a content part", {**GOOD, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "hi", "weird": 1}]}]}, 400, "messages[0].content[0].weird"),
    ("JSON nested 100,000 deep", NESTED, 400, None),
    ("an integer of 5,000 digits", b'{"model": "fake", "messages": [], "seed": ' + b"9" * 5000 + b"}", 400, None),
    ("bytes that are not UTF-8", b'{"model": "\xff\xfe"}', 400, None),
    ("an empty body", b"", 400, None),
    ("a body over 2 MiB", {**GOOD, "user": "u" * (2 << 20)}, 413, None),
]


def assert_openai_error(status: int, body: dict, expected_status: int) -> None:
    assert status == expected_status, body
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    assert body["error"]["message"] and body["error"]["type"] and body["error"]["code"], body


def test_bad_input_gets_an_openai_error_and_the_frontend_goes_on(frontend):
    address = frontend["http"]
    for what, body, expected, param in BAD_INPUTS:
        status, got, _ = post(address, body)
        assert_openai_error(status, got, expected)
        assert param is None or got["error"]["param"] == param, (what, got)
        assert post(address, GOOD)[0] == 200, f"no good turn after {what}"
    # a temperature so small that logits / temperature overflows is accepted (the node clamps it)
    status, got, _ = post(address, {**GOOD, "temperature": 1e-300, "seed": -1})
    assert status == 200 and got["choices"][0]["message"]["content"] == " ok"


def test_errors_before_any_route_have_the_openai_shape(frontend):
    host, port = frontend["http"].rsplit(":", 1)
    status, got, _ = post(frontend["http"], GOOD, extra_headers={"X-Big": "a" * 20_000})
    assert_openai_error(status, got, 400)
    assert "a" * 100 not in got["error"]["message"]  # the request's bytes are not echoed
    with socket.create_connection((host, int(port)), timeout=10) as sock:  # not HTTP at all
        sock.sendall(b"HELLO THERE\r\n\r\n")
        raw = sock.makefile("rb").read()
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.split(b" ")[1] == b"400" and b"application/json" in head, raw
    assert_openai_error(400, json.loads(payload), 400)
    for method, path, expected, headers in (
            ("GET", "/v1/chat/completions", 405, {}), ("GET", "/v1/nothing", 404, {}),
            ("DELETE", "/health", 405, {}),
            ("POST", "/v1/chat/completions", 400, {"Authorization": f"Bearer {TOKEN}",
                                                   "Content-Encoding": "gzip"})):  # a body that is not gzip
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        conn.request(method, path, body=json.dumps(GOOD) if method == "POST" else None, headers=headers)
        response = conn.getresponse()
        assert response.getheader("Content-Type").startswith("application/json")
        assert_openai_error(response.status, json.loads(response.read()), expected)
        conn.close()
    assert post(frontend["http"], GOOD)[0] == 200


def test_header_bytes_that_are_not_utf8_are_refused(frontend):
    status, got, _ = post(frontend["http"], GOOD, token="\xff\xfe")  # urllib sends latin-1: bytes ff fe
    assert_openai_error(status, got, 401)
    status, got, _ = post(frontend["http"], GOOD, session="ctx-\xff")
    assert_openai_error(status, got, 400)
    assert got["error"]["param"] == "X-Session-Id"
    assert post(frontend["http"], GOOD)[0] == 200


FUZZ_VALUES = [None, True, False, 0, 1, -1, 2**31, 2**32, 2**63, 2**64, 2**70, -2**70, 0.5, 1e-300, 1e300,
               float("nan"), float("inf"), float("-inf"), "", "x", "\ud800", "é" * 3, [], [1], ["a"] * 5,
               {}, {"a": 1}, [{"type": "text", "text": "hi"}], [{"type": "text", "text": "\udc00"}]]
FUZZ_FIELDS = ["model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
               "n", "stop", "stream", "stream_options", "user", "frequency_penalty", "logprobs"]
MESSAGE_FIELDS = ["role", "content", "name"]


def fuzzed(rng: random.Random) -> dict:
    """A good request with one to three fields (of the body or its message) set to odd values."""
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(rng.randint(1, 3)):
        value = rng.choice(FUZZ_VALUES)
        if rng.random() < 0.3 and isinstance(body["messages"], list) and body["messages"] \
                and isinstance(body["messages"][0], dict):
            body["messages"][0][rng.choice(MESSAGE_FIELDS)] = value
        else:
            body[rng.choice(FUZZ_FIELDS)] = value
    return body


def test_fuzzed_fields_never_give_a_500_or_a_body_that_is_not_json(frontend):
    rng = random.Random(20)
    statuses = []
    for _ in range(150):
        body = fuzzed(rng)
        status, got, _ = post(frontend["http"], body)  # fails here when the body is not JSON
        statuses.append(status)
        assert status in (200, 400, 404), (body, got)
        if status != 200:
            assert_openai_error(status, got, status)
    assert statuses.count(400) > 50 and statuses.count(200) > 2  # both kinds were tried (most fields now checked)
    assert post(frontend["http"], GOOD)[0] == 200


class ContextEngine(FakeEngine):
    """FakeEngine whose replies run to max_new_tokens (finish_reason length), their prompt prefilled."""

    async def generate(self, request: compute_pb2.TurnRequest, route=None):
        self.turns.append(request)
        for i in range(request.max_new_tokens):
            yield compute_pb2.TurnEvent(token=compute_pb2.TurnEvent.Token(id=50, text=" w"))
        yield compute_pb2.TurnEvent(record=compute_pb2.TurnRecord(
            request_id=request.request_id, tokens_prefilled=len(request.token_ids), engine_ms=1.0,
            tokens_out=request.max_new_tokens, output_token_ids=[50] * request.max_new_tokens,
            finish_reason="length"))


def in_process(engine, *bodies, **settings) -> list[tuple[int, dict]]:
    """(status, JSON) of each chat completion body, in order, from an API in this process over engine."""
    async def main():
        settings.setdefault("users", {"alice": TOKEN})
        service = ChatService(FrontendSettings(**settings), SessionStore(":memory:"), engine)
        async with TestClient(TestServer(OpenAiApi(service, lambda: True, lambda: "fake").app())) as client:
            out = []
            for body in bodies:
                r = await client.post("/v1/chat/completions", json={"model": "fake", **body},
                                      headers={"Authorization": f"Bearer {TOKEN}"})
                out.append((r.status, await r.json()))
            return out
    return asyncio.run(main())


SHORT = [{"role": "user", "content": "hi there"}]  # FakeEngine's ids: 1, two words, 4


def test_max_tokens_absent_or_4096_is_taken_up_to_what_the_context_leaves():
    engine = FakeEngine(max_context_tokens=8192)
    replies = in_process(engine, {"messages": SHORT}, {"messages": SHORT, "max_tokens": 4096},
                         {"messages": SHORT, "max_completion_tokens": 4096, "max_tokens": 10})
    assert [status for status, _ in replies] == [200, 200, 200], replies
    prompt = len(engine.turns[0].token_ids)
    assert [t.max_new_tokens for t in engine.turns] == [8192 - prompt, 4096, 4096]  # vLLM's; no cap of 1,024
    in_process(engine, {"messages": SHORT}, {"messages": SHORT, "max_tokens": 4096},
               max_new_tokens_default=256, max_new_tokens_cap=1024)
    assert [t.max_new_tokens for t in engine.turns[3:]] == [256, 1024]  # the settings lower it


def test_a_reply_to_the_contexts_end_says_length_and_counts_its_tokens():
    (status, body), = in_process(ContextEngine(max_context_tokens=40), {"messages": SHORT})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    usage = body["usage"]
    assert usage["total_tokens"] == 40 and usage["prompt_tokens"] + usage["completion_tokens"] == 40


def test_past_the_context_is_vllms_message_with_openais_code():
    engine = FakeEngine(max_context_tokens=8192)
    long = [{"role": "user", "content": "a " * 8200}]
    replies = in_process(engine, {"messages": SHORT, "max_tokens": 8192},
                         {"messages": SHORT, "max_completion_tokens": 8192},
                         {"messages": long}, {"messages": long, "max_tokens": 16},
                         {"messages": SHORT, "max_tokens": 8192, "stream": True})
    errors = [body["error"] for _, body in replies]
    assert [status for status, _ in replies] == [400] * 5
    assert {(e["code"], e["type"]) for e in errors} == {("context_length_exceeded", "invalid_request_error")}
    assert [e["param"] for e in errors] == ["max_tokens", "max_completion_tokens", "messages", "messages",
                                            "max_tokens"]
    prompt = len(SHORT[0]["content"].split()) + 2
    assert errors[0]["message"] == (
        f"This model's maximum context length is 8192 tokens. However, you requested {8192 + prompt} tokens "
        f"({prompt} in the messages, 8192 in the completion). Please reduce the length of the messages or "
        "completion.")
    assert errors[2]["message"] == (
        "This model's maximum context length is 8192 tokens. However, you requested 8202 tokens in the "
        "messages. Please reduce the length of the messages.")
    assert engine.turns == []


class _InvalidArgument(Exception):
    """The agent's INVALID_ARGUMENT as grpc.aio raises it (code, details, trailing metadata)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return str(self)

    def trailing_metadata(self) -> tuple:
        return ()


class RefusingEngine(FakeEngine):
    """Its compute node refuses every turn's prompt as past the context (a node of a smaller context)."""

    async def generate(self, request: compute_pb2.TurnRequest, route=None):
        raise chat_error(_InvalidArgument("This model's maximum context length is 100 tokens. However, you "
                                          "requested 120 tokens in the messages. Please reduce the length "
                                          "of the messages."), "127.0.0.1:1")
        yield  # an async generator


def test_a_compute_nodes_context_refusal_keeps_openais_code():
    (status, body), = in_process(RefusingEngine(), {"messages": SHORT})
    assert (status, body["error"]["code"], body["error"]["param"]) == \
        (400, "context_length_exceeded", "messages")
    assert body["error"]["message"].startswith("agent: This model's maximum context length is 100 tokens.")
