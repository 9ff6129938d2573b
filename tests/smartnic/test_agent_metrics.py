"""/metrics of a real agent and storage node: counters move after standing PUTs and a restore."""
from tests.kvtb.metrics_scrape import scrape, value
from tests.smartnic.test_agent_service import CTX, IDS, USER, turn


def test_agent_and_storage_metrics_move(agent, compute, storage):
    pool, fake, channel = compute
    agent_metrics, storage_metrics = agent[0].addresses["metrics"], storage[0][1].addresses["metrics"]
    before, stored_before = scrape(agent_metrics), scrape(storage_metrics)
    pool.offload(IDS, USER, CTX)
    turn(channel, IDS + [7])
    assert fake.outcomes[-1] == [(2, 0)] * 4
    after, stored = scrape(agent_metrics), scrape(storage_metrics)
    for name in ("kvtb:triggered_ops_fired_total", "kvtb:fabric_put_bytes_total", "kvtb:fabric_get_bytes_total",
                 "kvtb:trigger_to_fire_seconds_count", "kvtb:kv_lookup_hit_tokens_total"):
        assert value(after, name) > value(before, name), name
    assert value(after, "kvtb:kv_lookup_hit_tokens_total") == len(IDS)
    assert value(after, "kvtb:kv_stored_chunks") == 4
    store = {"opcode": "kv_store", "status": "success"}
    assert value(stored, "kvtb:storage_commands_total", **store) >= \
        value(stored_before, "kvtb:storage_commands_total", **store) + 4
    assert value(stored, "kvtb:storage_bytes_used", nsid="1") > 0
