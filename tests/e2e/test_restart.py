"""A frontend restart keeps the conversation, and the next turn still restores its KV."""
import pytest

from chat_client.client import FrontendClient
from kvtb.launch import ServiceProcess, kvtb_argv

from .conftest import USERS, run_turn

pytestmark = [pytest.mark.service, pytest.mark.slow]


def frontend(triggered, data_dir, log) -> ServiceProcess:
    proc = ServiceProcess("frontend", kvtb_argv("serve", "frontend", "--config", str(triggered.config),
                                                "--agent", triggered.agent, "--data-dir", str(data_dir)), log)
    proc.start(timeout_s=60)
    return proc


def test_restart_keeps_the_conversation(triggered, tmp_path):
    proc = frontend(triggered, tmp_path / "fe", tmp_path / "fe1.log")
    try:
        client = FrontendClient(proc.addresses["grpc"], USERS["alice"])
        _, first = run_turn(client, "My name is Ada. Say hello.", max_new_tokens=12)
        client.close()
    finally:
        assert proc.stop() == 0
    proc = frontend(triggered, tmp_path / "fe", tmp_path / "fe2.log")
    try:
        client = FrontendClient(proc.addresses["grpc"], USERS["alice"])
        _, second = run_turn(client, "What is my name?", first.context_id, max_new_tokens=12)
        client.close()
    finally:
        assert proc.stop() == 0
    assert second.turn == 2 and second.context_id == first.context_id
    assert second.kv_source == "restored", second.fallback_reason
    assert second.tokens_reused > 0 and second.bytes_restored > 0
