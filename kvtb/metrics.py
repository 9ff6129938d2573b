"""Prometheus metrics of every service: one registry per process, served on `/metrics`.

Names follow vLLM's and LMCache's with a `kvtb:` prefix. Counters a service already keeps
(its stats module) are read at scrape time by a collector (`add_collector`), never counted
twice; only latencies that no stats module keeps are observed here, as histograms created on
first use (`histogram(name)`), so each process shows only what it measures.
"""
from __future__ import annotations

import errno
import logging
import socket
import threading
from typing import Callable, Iterable, Mapping
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Histogram, ProcessCollector, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.registry import Collector

logger = logging.getLogger(__name__)

PREFIX = "kvtb:"
REGISTRY = CollectorRegistry()

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
                     1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)
TRIGGER_BUCKETS_S = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 1.0)
# vLLM's own buckets (vllm/v1/metrics/loggers.py) for the histograms that have vLLM's names and meanings:
# its time per output token, its request latencies (queue time), and its 1-2-5 token counts up to the
# model's context (max_model_len: SmolLM2's 8,192 tokens, the compute node's max_context_tokens).
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                  20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS_S = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                             120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
MAX_MODEL_LEN = 8192


def one_two_five(max_value: int) -> tuple[int, ...]:
    """vLLM's build_1_2_5_buckets: 1, 2, 5, 10, 20, 50, ... up to max_value."""
    out, scale = [], 1
    while True:
        for m in (1, 2, 5):
            if m * scale > max_value:
                return tuple(out)
            out.append(m * scale)
        scale *= 10


TOKEN_BUCKETS = one_two_five(MAX_MODEL_LEN)

# name -> (documentation, label names, buckets)
HISTOGRAMS: dict[str, tuple[str, tuple[str, ...], tuple[float, ...]]] = {
    "time_to_first_token_seconds": ("Time from the request to the first reply text, per turn.",
                                    ("tenant",), LATENCY_BUCKETS_S),
    "inter_token_latency_seconds": ("Time between two streamed pieces of reply text.",
                                    ("tenant",), LATENCY_BUCKETS_S),
    "e2e_request_latency_seconds": ("Time from the request to the turn's last event.",
                                    ("tenant",), LATENCY_BUCKETS_S),
    "trigger_to_fire_seconds": ("Time from a trigger counter reaching a threshold to the "
                                "triggered operation firing.", (), TRIGGER_BUCKETS_S),
    # per request (each of a turn's choices, as vLLM counts each sequence of n), with vLLM's meanings
    "time_per_output_token_seconds": ("Time between two generated tokens of a request (every token after "
                                      "its first), as the frontend receives them.", ("tenant",),
                                      TPOT_BUCKETS_S),
    "request_queue_time_seconds": ("Time a request waited before it ran: the frontend's admission wait "
                                   "plus the compute node's queue time.", ("tenant",),
                                   REQUEST_LATENCY_BUCKETS_S),
    "request_prompt_tokens": ("Prompt tokens of a request (its whole prompt, reused or computed).",
                              ("tenant",), TOKEN_BUCKETS),
    "request_generation_tokens": ("Tokens generated for a request.", ("tenant",), TOKEN_BUCKETS),
}

_histograms: dict[str, Histogram] = {}
_process_collector: list[ProcessCollector] = []
_lock = threading.Lock()

Read = Callable[[], Iterable[Metric]]


def histogram(name: str) -> Histogram:
    """The histogram `kvtb:NAME` of HISTOGRAMS, registered on first use."""
    with _lock:
        if name not in _histograms:
            doc, labels, buckets = HISTOGRAMS[name]
            _histograms[name] = Histogram(PREFIX + name, doc, labels, buckets=buckets, registry=REGISTRY)
        return _histograms[name]


class _ReadAtScrape(Collector):
    """Calls `read` at every scrape; a failing read is logged and yields nothing."""

    def __init__(self, read: Read):
        self.read = read

    def collect(self) -> Iterable[Metric]:
        try:
            return list(self.read())
        except Exception:  # a scrape must never take the service down
            logger.exception("metrics collector failed")
            return []


def add_collector(read: Read) -> Collector:
    """Register `read` (returning metric families) to run at every scrape."""
    collector = _ReadAtScrape(read)
    REGISTRY.register(collector)
    return collector


def counter(name: str, doc: str, value: float | Mapping[tuple[str, ...] | str, float],
            labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    """A counter family `kvtb:NAME`; with labels, value maps label values to counts."""
    family = CounterMetricFamily(PREFIX + name.removesuffix("_total"), doc, labels=labels or None)
    _fill(family, value, labels)
    return family


def gauge(name: str, doc: str, value: float | Mapping[tuple[str, ...] | str, float],
          labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    """A gauge family `kvtb:NAME`; with labels, value maps label values to values."""
    family = GaugeMetricFamily(PREFIX + name, doc, labels=labels or None)
    _fill(family, value, labels)
    return family


def _fill(family, value, labels: tuple[str, ...]) -> None:
    if not labels:
        family.add_metric([], float(value))
        return
    for key, v in sorted(dict(value).items()):
        family.add_metric(list(key) if isinstance(key, tuple) else [str(key)], float(v))


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host or "0.0.0.0", int(port)


def start_metrics_server(address: str) -> str:
    """Serve REGISTRY on http://ADDRESS/metrics (a daemon thread); return the bound host:port."""
    return _start_http(address)[0]


class _Registry(Collector):
    """Every family of REGISTRY, read at each scrape."""

    def collect(self) -> Iterable[Metric]:
        return REGISTRY.collect()


class MetricsEndpoint:
    """A node's metrics: its collector registered and `/metrics` served; close() undoes both.

    `read` joins the process's REGISTRY (every view of it shows its families); `served` adds families
    this endpoint alone shows after REGISTRY's (the frontend's `vllm:` ones, which its API port's
    /metrics shows too, computed there on its own).
    """

    def __init__(self, address: str, read: Read | None = None, served: Read | None = None):
        self._collector = add_collector(read) if read is not None else None
        registry = REGISTRY
        if served is not None:
            registry = CollectorRegistry(auto_describe=False)
            registry.register(_Registry())
            registry.register(_ReadAtScrape(served))
        self.address, self._server = _start_http(address, registry)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._collector is not None:
            REGISTRY.unregister(self._collector)
            self._collector = None


SHUTDOWN_POLL_S = 0.05


class _QuietHandler(WSGIRequestHandler):
    """Logs no request (a scrape every few seconds)."""

    def log_message(self, format: str, *args) -> None:
        pass


def _text_format(app):
    """`app` answering in Prometheus's text format (0.0.4) whatever the scraper accepts.

    prometheus_client's OpenMetrics output, which Prometheus asks for first, turns every colon of a
    sample's name into an underscore (prometheus/client_python#1177, in 0.26): every kvtb: and vllm:
    series would be renamed kvtb_ and vllm_. The text format keeps the names, as the API port's does.
    """
    def text_app(environ, start_response):
        return app({**environ, "HTTP_ACCEPT": "text/plain; version=0.0.4"}, start_response)
    return text_app


def _serve(host: str, port: int, registry: CollectorRegistry):
    """A WSGI server of `registry` (text format) on HOST:PORT in a daemon thread."""
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    server_class = type("MetricsServer", (ThreadingWSGIServer,), {"address_family": family})
    server = make_server(host, port, _text_format(make_wsgi_app(registry)), server_class,
                         handler_class=_QuietHandler)
    # the loop looks for a shutdown every SHUTDOWN_POLL_S: close() waits for that (the default 0.5 s was a
    # quarter second of every service's and every in-process test node's stop)
    threading.Thread(target=server.serve_forever, args=(SHUTDOWN_POLL_S,), name="metrics-http",
                     daemon=True).start()
    return server


def _start_http(address: str, registry: CollectorRegistry = REGISTRY):
    """(bound host:port, server) serving `registry` on http://ADDRESS/metrics.

    Port 0 picks a free port. When a fixed port is taken (a second service of the same kind on
    this machine) the server takes a free one and says so: metrics never stop a service.
    """
    host, port = _split(address)
    with _lock:
        if not _process_collector:  # process_cpu_seconds_total, process_resident_memory_bytes, ...
            _process_collector.append(ProcessCollector(registry=REGISTRY))
    try:
        server = _serve(host, port, registry)
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE or port == 0:
            raise
        logger.warning("metrics port %d is taken; serving metrics on a free port", port)
        server = _serve(host, 0, registry)
    bound = f"{host}:{server.server_port}"
    logger.info("metrics on http://%s/metrics", bound)
    return bound, server
