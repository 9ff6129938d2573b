"""vLLM's metric names from the compute node's Stats, the frontend's histograms and finish counts, on
the API port and the metrics port."""
import asyncio
import threading
import time

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from chat_frontend import vllm_metrics
from chat_frontend.metrics import TurnTimer
from kvtb import metrics
from kvtb_proto import compute_pb2

LABELS = {"model_name": "m", "engine": "0"}


def samples(families) -> dict:
    text = vllm_metrics.exposition(list(families)).decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples if s.name.startswith("vllm:")}


def key(name, **extra):
    return name, tuple(sorted({**LABELS, **extra}.items()))


def test_engine_families_from_stats():
    stats = compute_pb2.ComputeStatsResponse(
        num_requests_running=3, num_requests_waiting=1, num_requests_restoring=2, kv_cache_usage_perc=0.5,
        tokens_prefilled=100, tokens_reused=60, tokens_out=7, prefix_cache_queries=160, prefix_cache_hits=60,
        preemptions={"swap": 1, "recompute": 2})
    got = samples(vllm_metrics.engine_families("m", stats))
    assert got[key("vllm:num_requests_running")] == 3 and got[key("vllm:num_requests_waiting")] == 3
    assert got[key("vllm:kv_cache_usage_perc")] == 0.5 and got[key("vllm:prompt_tokens_total")] == 160
    assert got[key("vllm:generation_tokens_total")] == 7 and got[key("vllm:prefix_cache_hits_total")] == 60
    assert got[key("vllm:prefix_cache_queries_total")] == 160 and got[key("vllm:num_preemptions_total")] == 3


def test_success_by_reason_always_shows_vllms_reasons():
    got = samples([vllm_metrics.success_family("m", {"stop": 4})])
    assert got[key("vllm:request_success_total", finished_reason="stop")] == 4
    assert got[key("vllm:request_success_total", finished_reason="length")] == 0
    assert got[key("vllm:request_success_total", finished_reason="abort")] == 0


def test_a_tenant_histogram_summed_under_vllms_name():
    hist = Histogram("kvtb:x_seconds", "doc", ["tenant"], buckets=(0.1, 1.0), registry=CollectorRegistry())
    hist.labels("a").observe(0.05)
    hist.labels("b").observe(0.5)
    hist.labels("b").observe(5.0)
    (family,) = hist.collect()
    got = samples([vllm_metrics.merged_histogram("e2e_request_latency_seconds", family, "m")])
    assert got[key("vllm:e2e_request_latency_seconds_bucket", le="0.1")] == 1
    assert got[key("vllm:e2e_request_latency_seconds_bucket", le="1.0")] == 2
    assert got[key("vllm:e2e_request_latency_seconds_bucket", le="+Inf")] == 3
    assert got[key("vllm:e2e_request_latency_seconds_count")] == 3
    assert got[key("vllm:e2e_request_latency_seconds_sum")] == 5.55


def test_stats_cached_for_a_second_and_left_out_when_the_node_does_not_answer():
    calls = []

    async def fetch():
        calls.append(1)
        if len(calls) == 2:
            raise ConnectionError("down")
        return compute_pb2.ComputeStatsResponse(turns=len(calls))

    async def main():
        cache = vllm_metrics.StatsCache(fetch, ttl_s=1.0)
        first = await cache.get(now=10.0)
        again = await cache.get(now=10.5)
        failed = await cache.get(now=11.0)
        back = await cache.get(now=12.0)
        return first, again, failed, back
    first, again, failed, back = asyncio.run(main())
    assert first.turns == 1 and again is first and failed is None and back.turns == 3 and len(calls) == 3

    async def scrape():
        return await vllm_metrics.scrape("m", vllm_metrics.StatsCache(fetch), {})
    calls.clear()
    calls.append(1)  # the next fetch fails
    text = asyncio.run(scrape()).decode()
    assert "vllm:request_success_total" in text and "vllm:kv_cache_usage_perc" not in text


def histogram(name: str) -> dict:
    """{le: count} and _count, _sum of the vllm: histogram NAME (summed over tenants) as scraped now."""
    got = samples(vllm_metrics.latency_families("m"))
    out = {le: v for (n, labels), v in got.items() if n == f"vllm:{name}_bucket"
           for k, le in labels if k == "le"}
    out["count"], out["sum"] = got[key(f"vllm:{name}_count")], got[key(f"vllm:{name}_sum")]
    return out


def test_vllms_request_histograms_have_its_buckets():
    """vllm/v1/metrics/loggers.py: time per output token, request latencies (queue time), and 1-2-5
    token counts up to the model's context."""
    assert metrics.HISTOGRAMS["time_per_output_token_seconds"][2] == (
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
    assert metrics.HISTOGRAMS["request_queue_time_seconds"][2] == (
        0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0,
        960.0, 1920.0, 7680.0)
    tokens = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
    assert metrics.one_two_five(100) == (1, 2, 5, 10, 20, 50, 100)
    for name in ("request_prompt_tokens", "request_generation_tokens"):
        assert metrics.HISTOGRAMS[name][2] == tokens and metrics.HISTOGRAMS[name][1] == ("tenant",)
    assert set(vllm_metrics.HISTOGRAMS) >= {"time_per_output_token_seconds", "request_queue_time_seconds",
                                            "request_prompt_tokens", "request_generation_tokens"}


def test_each_choice_observed_once_and_summed_under_vllms_names():
    """Two choices of one turn: every token after a choice's first is a time per output token; each
    choice's prompt, generated tokens and wait (the turn's admission wait plus its queue time)."""
    names = ("time_per_output_token_seconds", "request_prompt_tokens", "request_generation_tokens",
             "request_queue_time_seconds")
    before = {name: histogram(name) for name in names}
    timer = TurnTimer("t-vllm", start_ns=0, waited_s=0.25)
    for choice, now_ms in [(0, 1000), (1, 1010), (0, 1050), (1, 1210), (0, 1350)]:
        timer.token(choice, now_ms * 1_000_000)
    timer.request_done(300, compute_pb2.TurnRecord(tokens_out=3, queue_ms=500.0))
    timer.request_done(300, compute_pb2.TurnRecord(tokens_out=2, queue_ms=10.0))
    after = {name: histogram(name) for name in names}

    def added(name, le=None):
        return after[name][le or "count"] - before[name].get(le or "count", 0)
    assert added("time_per_output_token_seconds") == 3  # 50, 200, 300 ms
    assert added("time_per_output_token_seconds", "0.05") == 1 and added("time_per_output_token_seconds", "0.2") == 2
    assert round(added("time_per_output_token_seconds", "sum"), 6) == 0.55
    assert added("request_prompt_tokens") == 2 and added("request_prompt_tokens", "200.0") == 0
    assert added("request_prompt_tokens", "500.0") == 2 and added("request_prompt_tokens", "sum") == 600
    assert added("request_generation_tokens", "2.0") == 1 and added("request_generation_tokens", "sum") == 5
    assert added("request_queue_time_seconds", "0.3") == 1  # 0.26 s
    assert added("request_queue_time_seconds", "0.8") == 2  # and 0.75 s
    assert round(added("request_queue_time_seconds", "sum"), 6) == 1.01


def test_the_metrics_port_reads_them_on_the_frontends_loop_and_gives_up_when_it_is_busy():
    """The metrics port's server thread asks the loop for the families; a loop that does not answer in
    time gives none (the kvtb: families are still served)."""
    async def fetch():
        return compute_pb2.ComputeStatsResponse(num_requests_running=2)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        read = vllm_metrics.reader(lambda: "", vllm_metrics.StatsCache(fetch), {"stop": 1}, loop, timeout_s=5.0)
        got = samples(read())
        assert got[("vllm:num_requests_running", (("engine", "0"), ("model_name", "unknown")))] == 2
        assert got[("vllm:request_success_total", (("engine", "0"), ("finished_reason", "stop"),
                                                   ("model_name", "unknown")))] == 1
        busy = vllm_metrics.reader(lambda: "m", vllm_metrics.StatsCache(fetch), {}, loop, timeout_s=0.05)
        loop.call_soon_threadsafe(time.sleep, 0.5)  # the loop blocked
        assert busy() == []
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
