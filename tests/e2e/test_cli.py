"""`kvtb chat` and `kvtb stats` as a user runs them: output checked field by field."""
import json
import subprocess

import pytest

from chat_client.record import RECORD_KEYS, STEP_KEYS
from kvtb.launch import kvtb_argv

from .conftest import MAX_NEW_TOKENS, PAPER_CHAT, USERS, kvtb, paper_messages

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_unreachable_frontend_is_one_clear_line():
    result = kvtb("chat", "--frontend", "127.0.0.1:1", "--script", str(PAPER_CHAT))
    assert result.returncode == 2
    assert "kvtb chat: cannot reach the frontend at 127.0.0.1:1" in result.stderr
    assert "Traceback" not in result.stderr
    result = kvtb("stats", "--frontend", "127.0.0.1:1")
    assert result.returncode == 2 and "kvtb stats: cannot reach the frontend" in result.stderr


@pytest.mark.slow
def test_refusal_exits_non_zero_with_status_and_message(triggered):
    result = kvtb("chat", "--frontend", triggered.frontend, "--token", "nope", "--script", str(PAPER_CHAT))
    assert result.returncode == 1
    assert result.stderr.strip() == "kvtb chat: the frontend refused: UNAUTHENTICATED: unknown token"


@pytest.mark.slow
def test_script_json_is_one_record_per_turn(paper_records):
    records = paper_records
    assert len(records) == len(paper_messages()) == 3
    for n, record in enumerate(records, 1):
        assert tuple(record) == RECORD_KEYS
        assert record["turn"] == n and record["context_id"] == records[0]["context_id"]
        assert isinstance(record["reply"], str) and record["reply"]
        assert record["kv_source"] == ("none" if n == 1 else "restored")
        assert record["fallback_reason"] is None
        for key in ("ttft_ms", "tbt_ms", "e2e_ms", "gateway_ms"):
            assert isinstance(record[key], float) and record[key] >= 0
        assert record["ttft_ms"] <= record["e2e_ms"] and record["gateway_ms"] < record["e2e_ms"]
        assert 0 < record["tokens_out"] <= MAX_NEW_TOKENS
        assert record["tokens_prefilled"] > 0 and record["bytes_offloaded"] > 0
        assert (record["tokens_reused"] > 0) == (record["bytes_restored"] > 0) == (n > 1)
        steps = {s["step"]: s for s in record["steps"]}
        assert all(tuple(s) == STEP_KEYS for s in record["steps"])
        assert set(steps) >= ({2, 3} if n == 1 else {3, 5, 6, 7, 8})
        stream = steps[3]
        assert stream["name"] == "stream response to user"
        assert stream["bytes"] == len(record["reply"].encode())
        assert 0 <= stream["start_ms"] <= stream["end_ms"] <= record["e2e_ms"] + 0.01
        if n > 1:
            assert steps[5]["start_ms"] <= steps[6]["start_ms"] <= steps[8]["start_ms"]
            assert steps[6]["bytes"] == record["bytes_restored"]


@pytest.mark.slow
def test_script_trace_and_stats(triggered):
    result = kvtb("chat", "--frontend", triggered.frontend, "--token", USERS["demo"],
                  "--script", str(PAPER_CHAT), "--trace", "--max-new-tokens", "8")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for message in paper_messages():
        assert f"you> {message}\nllm> " in out
    assert out.count("kv_source: restored") == 2 and "[turn 1 · kv_source: none" in out
    timeline_rows = [line for line in out.splitlines() if line.count("|") == 2 and " ms" in line]
    assert any(row.lstrip().startswith("6 ") and "█" in row for row in timeline_rows)
    assert any(row.lstrip().startswith("3 stream response to user") for row in timeline_rows)
    stats = kvtb("stats", "--frontend", triggered.frontend, "--json")
    assert stats.returncode == 0, stats.stderr
    figures = json.loads(stats.stdout)
    assert figures["frontend"]["turns_completed"] >= 3
    assert int(figures["agent"]["hits"]) >= 2 and len(figures["storage"]) == 2
    assert all("error" not in node for node in figures["storage"])
    assert int(figures["compute"]["turns"]) >= 3
    text = kvtb("stats", "--frontend", triggered.frontend).stdout
    assert "agent " in text and "hits " in text and text.count("storage 127.0.0.1:") == 2


@pytest.mark.slow
def test_repl_commands(triggered):
    lines = "Say yes.\nAnd again.\n/stats\n/new\nSay no.\n/bogus\n/quit\nnever sent\n"
    result = subprocess.run(kvtb_argv("chat", "--frontend", triggered.frontend, "--token", USERS["bob"],
                                      "--max-new-tokens", "4"),
                            input=lines, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    contexts = [line for line in out.splitlines() if line.startswith("(context ctx-")]
    assert len(contexts) == 2 and contexts[0] != contexts[1]
    assert "[turn 2 · kv_source: restored" in out
    assert "agent " in out and "hits " in out
    assert "(a new context starts with your next message)" in out
    assert "unknown command /bogus" in out
    assert out.count("llm> ") == 3
