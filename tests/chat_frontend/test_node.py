"""`kvtb serve frontend` as a real process in front of a fake agent: health, statuses, the bound."""
import threading

import grpc
import pytest
import yaml

from chat_client.client import FrontendClient, RpcFailure
from kvtb.grpc_health import NOT_SERVING, check, wait_serving
from kvtb.launch import free_port
from kvtb_proto import frontend_pb2, frontend_pb2_grpc
from tests.kvtb.metrics_scrape import scrape, value

from . import fake_agent

TOKEN = "t-alice"




@pytest.fixture
def frontend_before_agent(start_service, tmp_path):
    """A frontend whose agent is not up yet: (process, agent address)."""
    agent_address = f"127.0.0.1:{free_port()}"
    cfg = tmp_path / "kvtb.yaml"
    cfg.write_text(yaml.safe_dump({"frontend": {
        "listen_address": "127.0.0.1:0", "agent_address": agent_address, "data_dir": str(tmp_path / "fe"),
        "users": {"alice": TOKEN}, "max_concurrent_turns": 1, "max_waiting_turns": 1,
        "info_retry_s": 0.1, "storage_admin_addresses": []}}))
    return start_service("frontend", "serve", "frontend", "--config", str(cfg)), agent_address


def turn(address: str, results: list, message: str = "hi") -> None:
    client = FrontendClient(address, TOKEN)
    try:
        results.append([e for e in client.chat(message, max_new_tokens=4)][-1].summary.reply)
    except RpcFailure as exc:
        results.append(exc)
    finally:
        client.close()


def test_serving_once_the_agent_answers_then_bounded(frontend_before_agent):
    proc, agent_address = frontend_before_agent
    address = proc.addresses["grpc"]
    assert check(address) == NOT_SERVING
    server, node, _ = fake_agent.serve(agent_address)
    try:
        assert wait_serving(address, timeout_s=10)
        results: list = []
        turn(address, results)
        assert results == [" ok"]
        node.gate.clear()
        threads = [threading.Thread(target=turn, args=(address, results)) for _ in range(2)]
        threads[0].start()
        # both turns reached the agent
        assert node.started.acquire(timeout=10) and node.started.acquire(timeout=10)
        threads[1].start()  # waits for the one running turn
        results.clear()
        threading.Event().wait(0.5)
        turn(address, results)  # past the bound: refused at once
        assert len(results) == 1 and isinstance(results[0], RpcFailure)
        assert results[0].code == "RESOURCE_EXHAUSTED"
        assert "1 turns running and 1 waiting" in results[0].details
        node.gate.set()
        for t in threads:
            t.join(10)
        assert results[1:] == [" ok", " ok"]
    finally:
        server.stop(0)
    assert proc.stop() == 0


def test_statuses_over_grpc(frontend_before_agent):
    proc, agent_address = frontend_before_agent
    server, node, _ = fake_agent.serve(agent_address)
    address = proc.addresses["grpc"]
    try:
        assert wait_serving(address, timeout_s=10)
        with grpc.insecure_channel(address) as channel:
            stub = frontend_pb2_grpc.ChatFrontendStub(channel)
            events = list(stub.Chat(frontend_pb2.ChatRequest(token=TOKEN, message="hi")))
            assert events[0].context_id.startswith("ctx-") and events[-1].summary.turn == 1
            for request, code in [(frontend_pb2.ChatRequest(token="bad", message="hi"), "UNAUTHENTICATED"),
                                  (frontend_pb2.ChatRequest(token=TOKEN, message=""), "INVALID_ARGUMENT"),
                                  (frontend_pb2.ChatRequest(token=TOKEN, message="hi", context_id="x y"),
                                   "INVALID_ARGUMENT")]:
                with pytest.raises(grpc.RpcError) as err:
                    list(stub.Chat(request))
                assert err.value.code().name == code
            stats = FrontendClient(address, "").system_stats()
            assert stats["frontend"]["turns_completed"] == 1 and stats["compute"]["turns"] == 1
            assert "UNIMPLEMENTED" in stats["agent"]["error"] and stats["storage"] == []
        # the metrics port: the kvtb: families and vLLM's, with no token (as vLLM serves its /metrics)
        metrics = scrape(proc.addresses["metrics"])
        assert value(metrics, "kvtb:requests_total", tenant="default", status="ok") == 1
        labels = {"model_name": "fake", "engine": "0"}
        assert value(metrics, "vllm:request_success_total", finished_reason="stop", **labels) == 1
        assert value(metrics, "vllm:request_prompt_tokens_count", **labels) == 1
        assert value(metrics, "vllm:request_queue_time_seconds_count", **labels) == 1
        assert ("vllm:num_requests_running", tuple(sorted(labels.items()))) in metrics  # the engine's Stats
        server.stop(0)
        with pytest.raises(RpcFailure) as err:
            FrontendClient(address, TOKEN).chat("hi").__next__()
        assert err.value.code == "UNAVAILABLE" and "the agent at" in err.value.details
    finally:
        server.stop(0)
