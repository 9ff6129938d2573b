from kvtb import steps as steps_mod
from chat_frontend.record import RECORD_KEYS, STEP_KEYS, TurnClock, build_summary, summary_to_dict
from kvtb_proto import compute_pb2

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def engine_record() -> compute_pb2.TurnRecord:
    return compute_pb2.TurnRecord(
        request_id="r1", context_id="c1", kv_source="restored", ttft_ms=30.0, tbt_ms=12.5,
        engine_ms=400.0, tokens_prefilled=9, tokens_reused=64, tokens_out=20, bytes_restored=4096,
        bytes_offloaded=2048, steps=[
            compute_pb2.Step(step=8, name="inference on restored KV", start_unix_ns=T0 + 40 * MS,
                             end_unix_ns=T0 + 440 * MS, service="compute"),
            compute_pb2.Step(step=5, name="", start_unix_ns=T0 + 2 * MS, end_unix_ns=T0 + 3 * MS,
                             service="agent"),
            compute_pb2.Step(step=6, name="GETs", start_unix_ns=T0 + 3 * MS, end_unix_ns=T0 + 20 * MS,
                             bytes=4096, service="agent"),
        ])


def test_summary_times_relative_and_gateway_is_e2e_minus_engine():
    clock = TurnClock(start_ns=T0, first_text_ns=T0 + 50 * MS, end_ns=T0 + 500 * MS)
    summary = build_summary(2, "c1", "r1", "It is 180 °C.", engine_record(), clock)
    record = summary_to_dict(summary)
    assert tuple(record) == RECORD_KEYS
    assert record["turn"] == 2 and record["context_id"] == "c1" and record["reply"] == "It is 180 °C."
    assert record["kv_source"] == "restored" and record["fallback_reason"] is None
    assert (record["ttft_ms"], record["tbt_ms"], record["e2e_ms"]) == (50.0, 12.5, 500.0)
    assert record["gateway_ms"] == 100.0
    assert (record["tokens_prefilled"], record["tokens_reused"], record["tokens_out"]) == (9, 64, 20)
    assert (record["bytes_restored"], record["bytes_offloaded"]) == (4096, 2048)
    steps = record["steps"]
    assert all(tuple(s) == STEP_KEYS for s in steps)
    assert [s["step"] for s in steps] == [5, 6, 8, 3]
    assert steps[0] == {"step": 5, "name": steps_mod.name(5), "start_ms": 2.0, "end_ms": 3.0,
                        "bytes": 0}
    assert steps[3] == {"step": 3, "name": "stream response to user", "start_ms": 50.0,
                        "end_ms": 500.0, "bytes": len("It is 180 °C.".encode())}
    assert summary.engine_ms == 400.0 and summary.turn_start_unix_ns == T0


def test_fallback_and_no_text():
    rec = compute_pb2.TurnRecord(kv_source="recomputed", fallback_reason="crc mismatch", engine_ms=900.0)
    summary = build_summary(1, "c", "r", "", rec, TurnClock(start_ns=T0, end_ns=T0 + 800 * MS))
    record = summary_to_dict(summary)
    assert record["fallback_reason"] == "crc mismatch"
    assert record["ttft_ms"] == 800.0 and record["gateway_ms"] == 0.0  # never negative
