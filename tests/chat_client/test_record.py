"""The record `kvtb chat --json` prints from a TurnSummary: keys in order, times from the turn's start."""
from chat_client.record import RECORD_KEYS, STEP_KEYS, summary_to_dict
from kvtb import steps as steps_mod
from kvtb_proto import compute_pb2, frontend_pb2

T0 = 1_700_000_000_000_000_000
MS = 1_000_000


def summary(**over) -> frontend_pb2.TurnSummary:
    steps = [compute_pb2.Step(step=5, name="", start_unix_ns=T0 + 2 * MS, end_unix_ns=T0 + 3 * MS,
                              service="agent"),
             compute_pb2.Step(step=6, name="GETs", start_unix_ns=T0 + 3 * MS, end_unix_ns=T0 + 20_500_000,
                              bytes=4096, service="agent")]
    fields = {"turn": 2, "context_id": "c1", "reply": "It is 180 °C.", "kv_source": "restored",
              "ttft_ms": 50.0, "tbt_ms": 12.5, "e2e_ms": 500.0, "gateway_ms": 100.0, "tokens_prefilled": 9,
              "tokens_reused": 64, "tokens_out": 20, "bytes_restored": 4096, "bytes_offloaded": 2048,
              "turn_start_unix_ns": T0, "request_id": "r1", "engine_ms": 400.0, "steps": steps}
    return frontend_pb2.TurnSummary(**{**fields, **over})


def test_record_keys_in_order_and_figures_copied():
    record = summary_to_dict(summary())
    assert tuple(record) == RECORD_KEYS
    assert (record["turn"], record["context_id"], record["reply"]) == (2, "c1", "It is 180 °C.")
    assert record["kv_source"] == "restored" and record["fallback_reason"] is None
    assert (record["ttft_ms"], record["tbt_ms"], record["e2e_ms"]) == (50.0, 12.5, 500.0)
    assert record["gateway_ms"] == 100.0
    assert (record["tokens_prefilled"], record["tokens_reused"], record["tokens_out"]) == (9, 64, 20)
    assert (record["bytes_restored"], record["bytes_offloaded"]) == (4096, 2048)


def test_steps_relative_to_the_turn_named_from_kvtb_steps_when_unnamed():
    steps = summary_to_dict(summary())["steps"]
    assert all(tuple(s) == STEP_KEYS for s in steps)
    assert steps == [{"step": 5, "name": steps_mod.name(5), "start_ms": 2.0, "end_ms": 3.0, "bytes": 0},
                     {"step": 6, "name": "GETs", "start_ms": 3.0, "end_ms": 20.5, "bytes": 4096}]


def test_step_one_before_the_turn_has_negative_times():
    setup = compute_pb2.Step(step=1, start_unix_ns=T0 - 9000 * MS, end_unix_ns=T0 - 8990 * MS, bytes=10)
    (step,) = summary_to_dict(summary(steps=[setup]))["steps"]
    assert step == {"step": 1, "name": steps_mod.name(1), "start_ms": -9000.0, "end_ms": -8990.0, "bytes": 10}


def test_fallback_reason_and_missing_source():
    record = summary_to_dict(summary(kv_source="", fallback_reason="crc mismatch"))
    assert record["kv_source"] == "none" and record["fallback_reason"] == "crc mismatch"


def test_the_record_names_the_replica_where_the_kv_came_from_and_a_retry():
    record = summary_to_dict(summary(replica="replica-1", kv_origin="storage_other", retried_from="replica-0"))
    assert (record["replica"], record["kv_origin"], record["retried_from"]) == \
        ("replica-1", "storage_other", "replica-0")
    assert summary_to_dict(summary())["retried_from"] is None
