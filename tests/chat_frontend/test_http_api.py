"""The OpenAI API of a real frontend process in front of a fake agent: the `openai` client,
errors in OpenAI's shape, /health and /metrics."""
import json
import urllib.error
import urllib.request

import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from kvtb.grpc_health import wait_serving

from . import fake_agent
from kvtb.launch import free_port

TOKEN = "t-alice"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture
def frontend(start_service, tmp_path):
    """A frontend and its fake agent; the frontend's announced addresses."""
    agent_address = f"127.0.0.1:{free_port()}"
    cfg = tmp_path / "kvtb.yaml"
    cfg.write_text(yaml.safe_dump({"frontend": {
        "listen_address": "127.0.0.1:0", "agent_address": agent_address, "data_dir": str(tmp_path / "fe"),
        "users": {"alice": TOKEN, "bob": "t-bob"}, "info_retry_s": 0.1, "storage_admin_addresses": []}}))
    proc = start_service("frontend", "serve", "frontend", "--config", str(cfg))
    addresses = proc.addresses
    assert get(addresses["http"], "/health")[0] == 503  # loading: no agent yet
    server, node, _ = fake_agent.serve(agent_address)
    assert wait_serving(addresses["grpc"], timeout_s=10)
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


def post(address: str, body: dict | bytes, token: str = TOKEN, session: str = "") -> tuple[int, dict, dict]:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {token}"}
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


BAD_REQUESTS = [  # body, token, session, HTTP status, error code
    ({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}, "nope", "", 401, "unauthenticated"),
    (b"{not json", TOKEN, "", 400, "invalid_argument"),
    ({"model": "fake", "messages": []}, TOKEN, "", 400, "invalid_argument"),
    ({"model": "fake", "messages": [{"role": "user", "content": ""}]}, TOKEN, "", 400, "invalid_argument"),
    ({"model": "fake", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                    {"role": "user", "content": "c"}]}, TOKEN, "", 400, "invalid_argument"),
    ({"model": "gpt-9", "messages": [{"role": "user", "content": "hi"}]}, TOKEN, "", 404, "not_found"),
    ({"model": "fake", "messages": [{"role": "user", "content": "hi"}]}, TOKEN, "ctx-none", 404, "not_found"),
    ({"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**6}, TOKEN, "",
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
    status, body, _ = post(frontend["http"], {"model": "fake", "messages": HI},
                        token="t-bob", session=session)
    assert status == 403 and body["error"]["type"] == "permission_error"
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
    assert 'kvtb:e2e_request_latency_seconds_count{"tenant": "alice"}' not in before
    client(frontend["http"]).chat.completions.create(model="fake", messages=HI)
    after = scrape()
    assert after['kvtb:e2e_request_latency_seconds_count{"tenant": "alice"}'] == 1
    assert after['kvtb:time_to_first_token_seconds_count{"tenant": "alice"}'] == 1
    assert after['kvtb:requests_total{"status": "ok", "tenant": "alice"}'] == 1
    assert after['kvtb:generation_tokens_total{"tenant": "alice"}'] == 2
    assert after["kvtb:num_requests_running{}"] == 0

