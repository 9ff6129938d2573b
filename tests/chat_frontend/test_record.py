"""The frontend's TurnSummary: the engine's record, the frontend's clock and its own step 3."""
import pytest

from chat_frontend.record import KV_ORIGINS, TurnClock, build_summary, kv_origin
from kvtb import steps as steps_mod
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


def test_summary_times_and_gateway_is_e2e_minus_engine():
    clock = TurnClock(start_ns=T0, first_text_ns=T0 + 50 * MS, end_ns=T0 + 500 * MS)
    summary = build_summary(2, "c1", "r1", "It is 180 °C.", engine_record(), clock, "stop")
    assert (summary.turn, summary.context_id, summary.request_id) == (2, "c1", "r1")
    assert summary.reply == "It is 180 °C." and summary.finish_reason == "stop"
    assert summary.kv_source == "restored" and summary.fallback_reason == ""
    assert (summary.ttft_ms, summary.tbt_ms, summary.e2e_ms) == (50.0, 12.5, 500.0)
    assert summary.gateway_ms == 100.0 and summary.engine_ms == 400.0
    assert (summary.tokens_prefilled, summary.tokens_reused, summary.tokens_out) == (9, 64, 20)
    assert (summary.bytes_restored, summary.bytes_offloaded) == (4096, 2048)
    assert summary.turn_start_unix_ns == T0
    assert [s.step for s in summary.steps] == [5, 6, 8, 3]  # absolute, sorted by start


def test_the_frontend_adds_step_3_from_first_text_to_the_end():
    clock = TurnClock(start_ns=T0, first_text_ns=T0 + 50 * MS, end_ns=T0 + 500 * MS)
    stream = build_summary(2, "c1", "r1", "It is 180 °C.", engine_record(), clock).steps[-1]
    assert (stream.step, stream.name, stream.service) == (3, steps_mod.name(3), "frontend")
    assert (stream.start_unix_ns, stream.end_unix_ns) == (T0 + 50 * MS, T0 + 500 * MS)
    assert stream.bytes == len("It is 180 °C.".encode())


def test_step_one_of_the_node_start_comes_first():
    rec = engine_record()
    rec.steps.append(compute_pb2.Step(step=1, start_unix_ns=T0 - 9000 * MS, end_unix_ns=T0 - 8990 * MS,
                                      service="compute"))
    summary = build_summary(1, "c1", "r1", "hi", rec, TurnClock(start_ns=T0, end_ns=T0 + 500 * MS))
    assert [s.step for s in summary.steps] == [1, 5, 6, 8, 3]


def test_fallback_and_no_text():
    rec = compute_pb2.TurnRecord(kv_source="recomputed", fallback_reason="crc mismatch", engine_ms=900.0)
    summary = build_summary(1, "c", "r", "", rec, TurnClock(start_ns=T0, end_ns=T0 + 800 * MS))
    assert summary.fallback_reason == "crc mismatch"
    assert summary.ttft_ms == 800.0 and summary.gateway_ms == 0.0  # never negative


@pytest.mark.parametrize("fields, origin", [
    ({"kv_source": "resident", "tokens_cached": 64, "tokens_reused": 64}, "resident"),
    ({"kv_source": "none", "tokens_cached": 32, "tokens_reused": 32}, "pool"),
    ({"kv_source": "restored", "blocks_restored": 4, "tokens_reused": 64}, "storage_same"),
    ({"kv_source": "restored", "blocks_restored": 4, "blocks_restored_other": 1, "tokens_reused": 64},
     "storage_other"),
    ({"kv_source": "partial", "blocks_restored": 2, "blocks_failed": 2, "blocks_restored_other": 2}, "partial"),
    ({"kv_source": "recomputed", "fallback_reason": "crc mismatch"}, "recompute"),
    ({"kv_source": "none"}, "recompute"),
])
def test_kv_origin_says_where_the_prompts_kv_came_from(fields, origin):
    assert kv_origin(compute_pb2.TurnRecord(**fields)) == origin
    assert origin in KV_ORIGINS


def test_the_summary_names_the_replica_and_a_retry():
    rec = engine_record()
    rec.replica, rec.blocks_restored, rec.blocks_restored_other = "replica-1", 4, 4
    summary = build_summary(1, "c1", "r1", "hi", rec, TurnClock(start_ns=T0, end_ns=T0 + 500 * MS),
                            retried_from="replica-0")
    assert (summary.replica, summary.kv_origin, summary.retried_from) == ("replica-1", "storage_other", "replica-0")
