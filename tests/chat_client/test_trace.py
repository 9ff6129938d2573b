"""Chrome trace export of a context's turns (pure)."""
import json

from chat_client.trace import chrome_trace, write_trace
from kvtb import steps as steps_mod
from kvtb_proto import compute_pb2, frontend_pb2

MS = 1_000_000
T0 = 1_700_000_000_000 * MS // 1000


def summary(turn: int, start_ns: int) -> frontend_pb2.TurnSummary:
    steps = [(5, "smartnic", 0, 1, 0), (6, "smartnic", 1, 4, 4096), (7, "compute", 4, 5, 4096),
             (8, "compute", 5, 20, 512), (3, "frontend", 9, 21, 30), (4, "compute", 21, 22, 512)]
    return frontend_pb2.TurnSummary(
        turn=turn, context_id="ctx-1", request_id=f"req-{turn}", turn_start_unix_ns=start_ns, e2e_ms=22.0,
        kv_source="restored",
        steps=[compute_pb2.Step(step=n, name=f"step {n}", service=svc, bytes=b,
                                start_unix_ns=start_ns + a * MS, end_unix_ns=start_ns + z * MS)
               for n, svc, a, z, b in steps])


def test_steps_are_complete_events_per_service_and_turn(tmp_path):
    trace = chrome_trace([summary(2, T0 + 100 * MS), summary(1, T0)])
    events = trace["traceEvents"]
    names = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert names == {"frontend", "smartnic", "compute"}
    spans = [e for e in events if e["ph"] == "X"]
    assert [e["tid"] for e in spans] == [1] * 7 + [2] * 7
    steps = [e["args"]["step"] for e in spans if e["cat"].startswith("step") and e["tid"] == 2]
    assert steps == [5, 6, 7, 8, 3, 4]  # in order of start
    get = next(e for e in spans if e["cat"] == "step6" and e["tid"] == 2)
    assert get["ts"] == 101_000 and get["dur"] == 3_000 and get["args"]["bytes"] == 4096
    assert get["args"]["request_id"] == "req-2"
    assert {e["pid"] for e in spans if e["cat"] == "step8"} == {3}
    path = tmp_path / "t.json"
    assert write_trace([summary(1, T0)], str(path)) == len(json.loads(path.read_text())["traceEvents"])


def test_steps_of_the_same_millisecond_keep_step_order():
    s = frontend_pb2.TurnSummary(turn=1, turn_start_unix_ns=T0, steps=[
        compute_pb2.Step(step=7, service="compute", start_unix_ns=T0 + 4 * MS + 100, end_unix_ns=T0 + 6 * MS),
        compute_pb2.Step(step=6, service="smartnic", start_unix_ns=T0 + 4 * MS + 150,
                         end_unix_ns=T0 + 5 * MS)])
    spans = [e for e in chrome_trace([s])["traceEvents"] if e.get("cat", "").startswith("step")]
    assert [e["args"]["step"] for e in spans] == [6, 7]


def test_step_one_before_the_first_turn_moves_the_origin_not_below_zero():
    first = summary(1, T0)
    first.steps.insert(0, compute_pb2.Step(step=1, service="compute", start_unix_ns=T0 - 60_000 * MS,
                                           end_unix_ns=T0 - 59_990 * MS, bytes=1 << 20))
    trace = chrome_trace([summary(2, T0 + 100 * MS), first])
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert min(e["ts"] for e in spans) == 0  # Perfetto drops events before 0
    setup = next(e for e in spans if e["cat"] == "step1")
    assert setup["ts"] == 0 and setup["dur"] == 10_000 and setup["tid"] == 1
    assert setup["name"] == "1. " + steps_mod.name(1)
    turn1 = next(e for e in spans if e["cat"] == "turn" and e["tid"] == 1)
    assert turn1["ts"] == 60_000_000 and trace["otherData"]["start_unix_ns"] == T0 - 60_000 * MS


def test_the_turn_span_names_its_replica_and_where_its_kv_came_from():
    turn = summary(1, T0)
    turn.replica, turn.kv_origin, turn.retried_from = "replica-1", "storage_other", "replica-0"
    (span,) = [e for e in chrome_trace([turn])["traceEvents"] if e.get("cat") == "turn"]
    assert (span["args"]["replica"], span["args"]["kv_origin"], span["args"]["retried_from"]) == \
        ("replica-1", "storage_other", "replica-0")
