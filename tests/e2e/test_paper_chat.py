"""The paper's three-turn chat: the follow-ups restore their KV and answer as if it never left."""
import pytest

from .conftest import MAX_NEW_TOKENS, paper_messages, run_conversation, start_up, transcript

pytestmark = [pytest.mark.service, pytest.mark.slow]


def test_follow_ups_restore_their_kv(paper_records):
    first, *follow_ups = paper_records
    assert first["kv_source"] == "none" and first["tokens_reused"] == 0 and first["bytes_offloaded"] > 0
    assert {s["step"] for s in first["steps"]} >= {2, 3}
    for before, turn in zip(paper_records, follow_ups):
        assert turn["kv_source"] == "restored", turn["fallback_reason"]
        assert turn["context_id"] == first["context_id"] and turn["turn"] == before["turn"] + 1
        assert turn["bytes_restored"] > 0
        # only what the KV did not cover is prefilled: the new message and the last reply token
        assert turn["tokens_prefilled"] < 40 < turn["tokens_reused"]
        assert {s["step"] for s in turn["steps"]} >= {3, 5, 6, 7, 8}
        assert 0 < turn["tokens_out"] <= MAX_NEW_TOKENS


def test_stored_summaries_split_gateway_and_engine_time(triggered, paper_records):
    stored = transcript(triggered.frontend, "alice", paper_records[0]["context_id"])
    assert [t.user_message for t in stored.turns] == paper_messages()
    for turn, record in zip(stored.turns, paper_records):
        summary = turn.summary
        assert turn.reply == summary.reply == record["reply"]
        assert (summary.e2e_ms, summary.kv_source) == (record["e2e_ms"], record["kv_source"])
        assert 0 < summary.ttft_ms <= summary.e2e_ms and 0 < summary.engine_ms <= summary.e2e_ms
        assert summary.gateway_ms == pytest.approx(summary.e2e_ms - summary.engine_ms, abs=0.01)


@pytest.mark.parametrize("policy", ["resident", "recompute"])
def test_same_replies_under_the_baselines(paper_records, tmp_path_factory, policy):
    up = start_up(tmp_path_factory, policy)
    try:
        client = up.client("alice")
        baseline = run_conversation(client, paper_messages())
        client.close()
    finally:
        up.stop()
    assert [t.reply for t in baseline] == [r["reply"] for r in paper_records]
    expected = {"resident": "resident", "recompute": "recomputed"}[policy]
    assert [t.kv_source for t in baseline[1:]] == [expected, expected]
    if policy == "recompute":
        assert all(t.tokens_reused == 0 for t in baseline)
