"""kvtb.metrics: families from stats snapshots, the /metrics server, its fallback port."""
import socket
import urllib.request

from kvtb import metrics
from kvtb.service_metrics import agent_families, compute_families, storage_families

from .metrics_scrape import scrape, value

# what Prometheus 2.42 sends when it scrapes (OpenMetrics first)
PROMETHEUS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
                     "text/plain;version=0.0.4;q=0.5,*/*;q=0.1")


def test_families_from_snapshots_parse_and_carry_labels():
    snapshots = {
        "agent": lambda: agent_families({"hits": 2, "misses": 1, "lookup_requested_tokens": 100,
                                         "lookup_hit_tokens": 64, "evictions_by_reason": {"lru": 3},
                                         "triggered_fired": 9, "bytes_by_storage_node": {"s0": 4096}}),
        "compute": lambda: compute_families({"num_requests_running": 3, "kv_source": {"restored": 2},
                                             "fallbacks": {"checksum": 1}, "bytes_restored": 10,
                                             "kv_cache_usage_perc": 0.25, "preemptions": {"swap": 4},
                                             "prefix_cache_queries": 100, "prefix_cache_hits": 40,
                                             "preempt_recompute_s": 1.5, "preempt_swap_wait_s": 0.25,
                                             "swap_host_bytes_out": 4096, "swap_host_fallbacks": 2}),
        "storage": lambda: storage_families({"commands": {("store", "success"): 5}, "bytes_written": 7},
                                            [(1, 8192, 3)]),
    }
    collectors = [metrics.add_collector(read) for read in snapshots.values()]
    try:
        address = metrics.start_metrics_server("127.0.0.1:0")
        got = scrape(address)
    finally:
        for c in collectors:
            metrics.REGISTRY.unregister(c)
    assert value(got, "kvtb:kv_lookup_hit_tokens_total") == 64
    assert value(got, "kvtb:kv_lookup_requested_tokens_total") == 100
    assert value(got, "kvtb:kv_lookups_total", result="miss") == 1
    assert value(got, "kvtb:kv_evictions_total", reason="lru") == 3
    assert value(got, "kvtb:triggered_ops_fired_total") == 9
    assert value(got, "kvtb:kv_stored_bytes", storage_node="s0") == 4096
    assert value(got, "kvtb:num_requests_running") == 3 and value(got, "kvtb:kv_cache_usage_perc") == 0.25
    assert value(got, "kvtb:num_preemptions_total", kind="swap") == 4
    assert value(got, "kvtb:preemption_seconds_total", kind="recompute") == 1.5
    assert value(got, "kvtb:preemption_seconds_total", kind="swap_wait") == 0.25
    assert value(got, "kvtb:swap_host_bytes_total", direction="out") == 4096
    assert value(got, "kvtb:swap_host_fallbacks_total") == 2
    assert value(got, "kvtb:prefix_cache_hits_total") == 40 and value(got, "kvtb:prefix_cache_queries_total") == 100
    assert value(got, "kvtb:turns_total", kv_source="restored") == 2
    assert value(got, "kvtb:fallbacks_total", reason="checksum") == 1
    assert value(got, "kvtb:kv_restore_bytes_total") == 10
    assert value(got, "kvtb:storage_commands_total", opcode="store", status="success") == 5
    assert value(got, "kvtb:storage_bytes_used", nsid="1") == 8192


def test_a_taken_port_falls_back_to_a_free_one():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        address = metrics.start_metrics_server(f"127.0.0.1:{port}")
    assert address.startswith("127.0.0.1:") and address != f"127.0.0.1:{port}"
    scrape(address)


def test_a_failing_collector_does_not_break_the_scrape():
    def broken():
        raise RuntimeError("boom")
    collector = metrics.add_collector(broken)
    try:
        metrics.histogram("trigger_to_fire_seconds").observe(0.0001)
        got = scrape(metrics.start_metrics_server("127.0.0.1:0"))
    finally:
        metrics.REGISTRY.unregister(collector)
    assert value(got, "kvtb:trigger_to_fire_seconds_count") >= 1


def test_an_endpoint_serves_its_own_families_after_the_processs():
    """`served` families show on that endpoint alone; the process's REGISTRY shows on every endpoint."""
    own = metrics.MetricsEndpoint("127.0.0.1:0", served=lambda: [metrics.gauge("endpoint_only", "doc", 7)])
    plain = metrics.MetricsEndpoint("127.0.0.1:0")
    try:
        metrics.histogram("trigger_to_fire_seconds").observe(0.0001)
        got, other = scrape(own.address), scrape(plain.address)
    finally:
        own.close()
        plain.close()
    assert value(got, "kvtb:endpoint_only") == 7 and ("kvtb:endpoint_only", ()) not in other
    assert value(got, "kvtb:trigger_to_fire_seconds_count") >= 1
    assert value(got, "kvtb:trigger_to_fire_seconds_count") == value(other, "kvtb:trigger_to_fire_seconds_count")


def test_prometheus_asking_for_openmetrics_gets_the_text_format_with_the_names_as_they_are():
    """prometheus_client's OpenMetrics output would turn `kvtb:` into `kvtb_` (client_python#1177)."""
    endpoint = metrics.MetricsEndpoint("127.0.0.1:0")
    try:
        metrics.histogram("trigger_to_fire_seconds").observe(0.0001)
        request = urllib.request.Request(f"http://{endpoint.address}/metrics", headers={"Accept": PROMETHEUS_ACCEPT})
        with urllib.request.urlopen(request, timeout=10) as response:
            kind, text = response.headers["Content-Type"], response.read().decode()
    finally:
        endpoint.close()
    assert kind.startswith("text/plain; version=0.0.4")
    assert "\nkvtb:trigger_to_fire_seconds_count " in text and "kvtb_trigger" not in text
