"""The tools people already use, on every real service: the `openai` client, /metrics, a trace, the logs."""
import json

import openai
import pytest

from tests.kvtb.metrics_scrape import scrape, value

from .conftest import USERS, kvtb

pytestmark = [pytest.mark.service, pytest.mark.slow]

STORE = {"opcode": "kv_store", "status": "success"}


def metrics_of(up) -> dict[str, dict]:
    return {name: scrape(addresses["metrics"]) for name, addresses in up.services.items()}


@pytest.fixture(scope="module")
def openai_chat(triggered):
    """Two turns of one session through the OpenAI API (streamed, then not), with the metrics around them."""
    before = metrics_of(triggered)
    api = openai.OpenAI(base_url=f"http://{triggered.services['frontend']['http']}/v1",
                        api_key=USERS["bob"], max_retries=0)
    model = api.models.list().data[0].id
    raw = api.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": "Name three colors of the rainbow."}],
        stream=True, stream_options={"include_usage": True}, max_tokens=24)
    session = raw.headers["x-session-id"]
    chunks = list(raw.parse())
    first = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    follow_up = api.chat.completions.create(
        model=model, extra_headers={"X-Session-Id": session}, max_tokens=24,
        messages=[{"role": "user", "content": "Name three colors of the rainbow."},
                  {"role": "assistant", "content": first}, {"role": "user", "content": "And one more?"}])
    return {"session": session, "chunks": chunks, "first": first, "follow_up": follow_up,
            "before": before, "after": metrics_of(triggered)}


def test_openai_client_streams_then_continues_with_restored_kv(openai_chat):
    chunks, follow_up = openai_chat["chunks"], openai_chat["follow_up"]
    assert chunks[0].choices[0].delta.role == "assistant" and openai_chat["first"].strip()
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 0
    assert follow_up.choices[0].message.content.strip()
    assert follow_up.choices[0].finish_reason in ("stop", "length")
    cached = follow_up.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < follow_up.usage.prompt_tokens  # the first turn's KV came back from storage


def test_every_service_metrics_move_after_the_chat(openai_chat):
    before, after = openai_chat["before"], openai_chat["after"]
    assert value(after["frontend"], "kvtb:requests_total", tenant="team-b", status="ok") == \
        value(before["frontend"], "kvtb:requests_total", tenant="team-b", status="ok") + 2
    assert value(after["frontend"], "kvtb:time_to_first_token_seconds_count", tenant="team-b") >= 2
    assert value(after["frontend"], "kvtb:prompt_tokens_cached_total", tenant="team-b") > 0
    for name, service in (("kvtb:kv_restore_bytes_total", "compute"),
                          ("kvtb:kv_offload_bytes_total", "compute"),
                          ("kvtb:triggered_ops_fired_total", "smartnic"),
                          ("kvtb:kv_lookup_hit_tokens_total", "smartnic"),
                          ("kvtb:trigger_to_fire_seconds_count", "smartnic")):
        assert value(after[service], name) > value(before[service], name), name
    assert value(after["compute"], "kvtb:turns_total", kv_source="restored") > 0
    stores = sum(value(after[n], "kvtb:storage_commands_total", **STORE) -
                 value(before[n], "kvtb:storage_commands_total", **STORE)
                 for n in after if n.startswith("storage"))
    assert stores > 0


def test_trace_of_the_session_has_every_service_in_step_order(triggered, openai_chat, tmp_path):
    out = tmp_path / "trace.json"
    result = kvtb("trace", openai_chat["session"], "--frontend", triggered.frontend, "--token", USERS["bob"],
                  "-o", str(out))
    assert result.returncode == 0, result.stderr
    events = json.loads(out.read_text())["traceEvents"]
    services = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert {"frontend", "smartnic", "compute"} <= services
    follow_up = [e for e in events if e["ph"] == "X" and e["tid"] == 2 and e["cat"].startswith("step")]
    starts_ms = [e["ts"] // 1000 for e in follow_up]
    assert starts_ms == sorted(starts_ms)
    steps = [e["args"]["step"] for e in follow_up]
    assert {5, 6, 7, 8, 3} <= set(steps) and steps.index(5) < steps.index(6) < steps.index(7) < steps.index(8)
    assert len({e["args"]["request_id"] for e in follow_up}) == 1


def test_one_turn_is_followed_through_the_logs(triggered, openai_chat):
    from chat_client.client import FrontendClient
    context = FrontendClient(triggered.frontend, USERS["bob"]).get_context(openai_chat["session"])
    request_id = context.turns[-1].summary.request_id
    logs = triggered.root / "var" / "logs"
    for service in ("frontend", "smartnic", "compute"):
        lines = [line for line in (logs / f"{service}.log").read_text().splitlines() if request_id in line]
        assert lines, f"{service} logged nothing for {request_id}"


def test_every_grpc_server_is_serving_and_reflects_its_services(triggered):
    from kvtb.grpc_health import SERVING, check
    from tests.kvtb.grpc_reflection import reflected_services
    expected = {"frontend": "kvtb.frontend.ChatFrontend", "smartnic": "kvtb.smartnic.SmartNic",
                "compute": "kvtb.compute.ComputeNode", "storage-0": "kvtb.storage.StorageAdmin"}
    for name, service in expected.items():
        address = triggered.services[name].get("grpc") or triggered.services[name]["admin"]
        assert check(address) == SERVING and check(address, service) == SERVING, name
        assert {service, "grpc.health.v1.Health"} <= reflected_services(address), name
