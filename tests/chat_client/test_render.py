from chat_client import render


def record(**over):
    base = {"turn": 2, "context_id": "c", "reply": "r", "kv_source": "restored", "fallback_reason": None,
            "ttft_ms": 50.0, "tbt_ms": 12.5, "e2e_ms": 100.0, "gateway_ms": 10.0, "tokens_prefilled": 9,
            "tokens_reused": 64, "tokens_out": 20, "bytes_restored": 1_500_000, "bytes_offloaded": 0,
            "steps": [
                {"step": 1, "name": "setup", "start_ms": -5000.0, "end_ms": -4000.0, "bytes": 0},
                {"step": 6, "name": "GETs to storage", "start_ms": 0.0, "end_ms": 25.0, "bytes": 1_500_000},
                {"step": 3, "name": "stream", "start_ms": 50.0, "end_ms": 100.0, "bytes": 10},
            ]}
    return {**base, **over}


def test_human_bytes():
    assert [render.human_bytes(n) for n in (12, 1500, 2_500_000)] == ["12 B", "1.5 KB", "2.5 MB"]


def test_summary_line():
    line = render.summary_line(record())
    assert "turn 2" in line and "kv_source: restored" in line and "restored 1.5 MB" in line
    assert "offloaded" not in line and "fallback" not in line
    assert "fallback: timeout" in render.summary_line(record(fallback_reason="timeout"))


def test_timeline_bars_scale_to_the_turn():
    lines = render.timeline(record(), width=20)
    assert lines[0].endswith("100 ms|")
    setup, gets, stream = lines[1:]
    assert "|◂                   |" in setup  # step 1: the compute node's start, long before
    assert "1000.0 ms, 5.0 s before the turn" in setup
    assert "|█████               |" in gets and "1.5 MB" in gets
    assert "|          ██████████|" in stream


def test_stats_lines_with_an_unreachable_part():
    stats = {"frontend": {"turns_completed": 3, "turns": 5, "contexts": 2},
             "agent": {"address": "a:1", "hits": 2, "misses": 1, "evictions_by_reason": {"lru": 1},
                       "bytes_by_storage_node": {"s0": 1000}},
             "compute": {"error": "UNAVAILABLE: down"},
             "storage": [{"address": "s:1", "namespaces": [{"used_bytes": 2000, "key_count": 3}]}]}
    text = "\n".join(render.stats_lines(stats))
    assert "frontend: 3 turns since start, 5 turns in 2 contexts stored" in text
    assert "hits 2, misses 1" in text and "evictions 1 {lru: 1}" in text and "bytes on s0: 1.0 KB" in text
    assert "compute: unreachable (UNAVAILABLE: down)" in text
    assert "storage s:1: 3 keys, 2.0 KB used" in text


def test_a_step_that_began_before_the_turn_runs_into_it():
    steps = [{"step": 1, "name": "setup", "start_ms": -10.0, "end_ms": 30.0, "bytes": 0}]
    (row,) = render.timeline(record(steps=steps), width=20)[1:]
    assert "|◂█████              |" in row and "-10.0 –     30.0 ms (began before the turn)" in row


def test_summary_line_names_the_replica_and_the_kv_origin():
    line = render.summary_line(record(replica="replica-1", kv_origin="storage_other", retried_from="replica-0"))
    assert "on replica-1 (kv storage_other), retried from replica-0" in line
    assert "on replica-0 (kv resident)" in render.summary_line(record(replica="replica-0", kv_origin="resident"))
    assert " on " not in render.summary_line(record())  # an older frontend: no replica


def test_stats_lines_per_replica():
    agent = {"address": "a:1", "hits": 2, "misses": 1}
    stats = {"frontend": {"turns_completed": 3}, "compute": {"turns": 5}, "storage": [],
             "replicas": {"replica-0": {"up": True, "address": "a:1", "agent": agent, "compute": {"turns": 4}},
                          "replica-1": {"up": False, "address": "b:1", "agent": {"address": "b:1",
                                                                                "error": "UNAVAILABLE"},
                                        "compute": {"error": "UNAVAILABLE"}}}}
    lines = render.stats_lines(stats)
    assert lines[1] == "replica-0 (a:1): in the rotation"
    assert lines[2].startswith("  agent a:1: hits 2, misses 1") and lines[3].startswith("  compute: 4 turns")
    assert lines[4:] == ["replica-1 (b:1): OUT of the rotation", "  agent b:1: unreachable (UNAVAILABLE)",
                         "  compute: unreachable (UNAVAILABLE)"]
