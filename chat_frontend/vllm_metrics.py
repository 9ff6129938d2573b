"""vLLM's metric names (`vllm:`) beside the process's `kvtb:` ones, on two ports.

The API port's /metrics shows them to a token of `operators` or `metrics_readers` (`scrape`, for a
Prometheus outside the deployment); the frontend's metrics port (`metrics_address`, no token, kept
inside the deployment's network as vLLM's own /metrics is) shows the same families (`reader`).
Nothing is counted twice: the engine's figures are the compute nodes' Stats (through their agents,
added up over the replicas in the rotation: `replicas.Replicas.compute_stats`, cached `STATS_TTL_S`),
the latencies and per-request counts are the frontend's own `kvtb:` histograms summed over tenants
(chat and completions turns), and finished requests by reason are counted where they end
(`FinishCounts`, the ChatService's: chat choices and /v1/completions' choices). Labels are vLLM's
(`model_name`, `engine`): never a user's name. A figure whose source does not answer is left out
rather than shown as 0.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from kvtb import metrics
from kvtb_proto import compute_pb2

logger = logging.getLogger(__name__)

PREFIX = "vllm:"
STATS_TTL_S = 1.0
READ_TIMEOUT_S = 8.0  # the metrics port's read of them, on the frontend's loop (Prometheus waits 10 s)
ENGINE = "0"  # vLLM's engine label: one engine (the replicas' compute nodes, added up)
CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what generate_latest writes; the metrics port's too (kvtb.metrics)
# vLLM's histogram -> the frontend's kvtb: histogram with the same meaning
HISTOGRAMS = {
    "time_to_first_token_seconds": "time_to_first_token_seconds",
    "e2e_request_latency_seconds": "e2e_request_latency_seconds",
    "inter_token_latency_seconds": "inter_token_latency_seconds",
    "time_per_output_token_seconds": "time_per_output_token_seconds",
    "request_queue_time_seconds": "request_queue_time_seconds",
    "request_prompt_tokens": "request_prompt_tokens",
    "request_generation_tokens": "request_generation_tokens",
}


class FinishCounts:
    """Sequences (choices) finished by reason: stop, length, abort. One event loop."""

    def __init__(self):
        self.counts: collections.Counter[str] = collections.Counter()

    def finished(self, reason: str, choices: int = 1) -> None:
        self.counts[reason] += choices


class StatsCache:
    """The compute node's Stats, asked at most once per ttl_s; None while it does not answer."""

    def __init__(self, fetch: Callable[[], Awaitable[compute_pb2.ComputeStatsResponse]], ttl_s: float = STATS_TTL_S):
        self.fetch = fetch
        self.ttl_s = ttl_s
        self._value: compute_pb2.ComputeStatsResponse | None = None
        self._at = float("-inf")

    async def get(self, now: float | None = None) -> compute_pb2.ComputeStatsResponse | None:
        now = time.monotonic() if now is None else now
        if now - self._at >= self.ttl_s:
            self._at = now
            try:
                self._value = await self.fetch()
            except Exception as exc:  # noqa: BLE001 - a scrape shows what it can; the error is logged
                logger.info("compute node's stats for /metrics: %s", exc)
                self._value = None
        return self._value


def _labels(model: str) -> tuple[list[str], list[str]]:
    return ["model_name", "engine"], [model, ENGINE]


def _gauge(name: str, doc: str, model: str, value: float) -> GaugeMetricFamily:
    names, values = _labels(model)
    family = GaugeMetricFamily(PREFIX + name, doc, labels=names)
    family.add_metric(values, float(value))
    return family


def _counter(name: str, doc: str, model: str, value: float) -> CounterMetricFamily:
    names, values = _labels(model)
    family = CounterMetricFamily(PREFIX + name, doc, labels=names)
    family.add_metric(values, float(value))
    return family


def engine_families(model: str, stats: compute_pb2.ComputeStatsResponse) -> Iterable[Metric]:
    """The engine's figures under vLLM's names."""
    yield _gauge("num_requests_running", "Requests in the engine's running batch.", model,
                 stats.num_requests_running)
    yield _gauge("num_requests_waiting", "Requests waiting for the engine (for a place or for their "
                 "stored KV to land).", model, stats.num_requests_waiting + stats.num_requests_restoring)
    yield _gauge("kv_cache_usage_perc", "KV-cache usage (1 = 100%).", model, stats.kv_cache_usage_perc)
    yield _counter("prompt_tokens_total", "Prompt tokens processed (computed or reused).", model,
                   stats.tokens_prefilled + stats.tokens_reused)
    yield _counter("generation_tokens_total", "Tokens generated.", model, stats.tokens_out)
    yield _counter("prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.", model,
                   stats.prefix_cache_queries)
    yield _counter("prefix_cache_hits_total", "Prompt tokens found in the prefix cache.", model,
                   stats.prefix_cache_hits)
    yield _counter("num_preemptions_total", "Preemptions of running requests.", model,
                   sum(stats.preemptions.values()))


def success_family(model: str, reasons: Mapping[str, int]) -> CounterMetricFamily:
    names, values = _labels(model)
    family = CounterMetricFamily(PREFIX + "request_success_total", "Choices finished (chat and /v1/completions), by reason.",
                                 labels=[*names, "finished_reason"])
    for reason in sorted({"stop", "length", "abort", *reasons}):
        family.add_metric([*values, reason], float(reasons.get(reason, 0)))
    return family


def merged_histogram(name: str, source: Metric, model: str) -> HistogramMetricFamily:
    """A kvtb: histogram (labelled by tenant) summed over its labels, under vLLM's name and labels."""
    buckets: dict[float, float] = collections.defaultdict(float)
    total = 0.0
    for sample in source.samples:
        if sample.name.endswith("_bucket"):
            buckets[float(sample.labels["le"])] += sample.value
        elif sample.name.endswith("_sum"):
            total += sample.value
    family = HistogramMetricFamily(PREFIX + name, source.documentation, labels=_labels(model)[0])
    bounds = sorted(buckets) or [float("inf")]
    family.add_metric(_labels(model)[1], [(_le(b), buckets.get(b, 0.0)) for b in bounds], total)
    return family


def _le(bound: float) -> str:
    return "+Inf" if bound == float("inf") else repr(bound)


def latency_families(model: str) -> Iterable[Metric]:
    for name, source in HISTOGRAMS.items():
        for family in metrics.histogram(source).collect():
            yield merged_histogram(name, family, model)


class _Families(Collector):
    def __init__(self, families: list[Metric]):
        self.families = families

    def collect(self) -> Iterable[Metric]:
        return self.families


def exposition(families: list[Metric]) -> bytes:
    """The process's registry (its kvtb: metrics) and these families, as Prometheus text."""
    extra = CollectorRegistry(auto_describe=False)
    extra.register(_Families(families))
    return generate_latest(metrics.REGISTRY) + generate_latest(extra)


async def families(model: str, stats: StatsCache, reasons: Mapping[str, int]) -> list[Metric]:
    """Every vllm: family (the engine's only when its Stats answer)."""
    out: list[Metric] = [success_family(model, reasons), *latency_families(model)]
    figures = await stats.get()
    if figures is not None:
        out.extend(engine_families(model, figures))
    return out


async def scrape(model: str, stats: StatsCache, reasons: Mapping[str, int]) -> bytes:
    """The API port's /metrics body."""
    return exposition(await families(model, stats, reasons))


def reader(model: Callable[[], str], stats: StatsCache, reasons: Mapping[str, int],
           loop: asyncio.AbstractEventLoop, timeout_s: float = READ_TIMEOUT_S) -> Callable[[], list[Metric]]:
    """The vllm: families for the metrics port, whose server thread calls this: they are made on the
    frontend's loop (where the counts change and the Stats are asked); none if it does not answer in time."""
    def read() -> list[Metric]:
        future = asyncio.run_coroutine_threadsafe(families(model() or "unknown", stats, reasons), loop)
        try:
            return future.result(timeout_s)
        except concurrent.futures.TimeoutError:  # left to end on the loop (cancelled, it would never start)
            logger.info("vllm: metrics not read within %.1f s: the frontend's loop is busy", timeout_s)
            return []
    return read
