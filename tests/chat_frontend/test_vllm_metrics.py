"""vLLM's metric names from the compute node's Stats, the frontend's histograms and finish counts."""
import asyncio

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.parser import text_string_to_metric_families

from chat_frontend import vllm_metrics
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
