"""`kvtb trace` and `kvtb chat --trace-out` in process, before a real frontend with a fake agent."""
import json

from chat_client import cli, trace_cli
from tests.chat_frontend.test_http_api import TOKEN, client


def test_trace_of_a_context_over_http(frontend, tmp_path, capsys):
    raw = client(frontend["http"]).chat.completions.with_raw_response.create(
        model="fake", messages=[{"role": "user", "content": "hi"}])
    session = raw.headers["x-session-id"]
    out = tmp_path / "trace.json"
    assert trace_cli.main([session, "--frontend", frontend["grpc"], "--token", TOKEN, "-o", str(out)]) == 0
    trace = json.loads(out.read_text())
    turn = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert turn[0]["name"] == "turn 1" and turn[0]["args"]["context_id"] == session
    assert [e["args"]["step"] for e in turn[1:]] == [3]  # the fake agent reports no steps of its own
    assert trace_cli.main(["ctx-nope", "--frontend", frontend["grpc"], "--token", TOKEN,
                           "-o", str(out)]) == 1
    assert "NOT_FOUND" in capsys.readouterr().err


def test_chat_trace_out_writes_the_session(frontend, tmp_path, capsys):
    script, out = tmp_path / "chat.txt", tmp_path / "chat-trace.json"
    script.write_text("hi\n/new\nhello again\n")
    assert cli.main(["--frontend", frontend["grpc"], "--token", TOKEN, "--script", str(script),
                     "--trace-out", str(out)]) == 0
    spans = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X" and e["cat"] == "turn"]
    assert [e["tid"] for e in spans] == [1, 2]  # two contexts, numbered in session order
    assert spans[0]["args"]["context_id"] != spans[1]["args"]["context_id"]
    assert "2 turns" in capsys.readouterr().err


def test_trace_of_a_context_started_from_a_resent_history(frontend, tmp_path):
    raw = client(frontend["http"]).chat.completions.with_raw_response.create(
        model="fake", messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": " ok"},
                                {"role": "user", "content": "again"}])
    out = tmp_path / "trace.json"
    assert trace_cli.main([raw.headers["x-session-id"], "--frontend", frontend["grpc"], "--token", TOKEN,
                           "-o", str(out)]) == 0
    spans = [e for e in json.loads(out.read_text())["traceEvents"] if e["ph"] == "X" and e["cat"] == "turn"]
    assert [e["name"] for e in spans] == ["turn 2"]  # the resent turn 1 was not served here: no span
    assert spans[0]["ts"] >= 0 and spans[0]["dur"] < 60e6
