"""The frontend's Prometheus metrics: request latencies by tenant, and its counters at scrape time.

A tenant is a group of users (settings `tenants`; "default" for a user not listed): label values
are tenant names, never user names, so a scrape does not list who uses the service. The replicas
behind the frontend: whether each is in the rotation, the turns each served, turns retried.
"""
from __future__ import annotations

import collections
import threading
from typing import Callable, Iterable

from kvtb import metrics
from kvtb_proto import compute_pb2, frontend_pb2

# the kvtb: histograms the frontend observes (kvtb.metrics.HISTOGRAMS), per turn or per request
HISTOGRAMS = ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
              "time_per_output_token_seconds", "request_queue_time_seconds", "request_prompt_tokens",
              "request_generation_tokens")


class Tenants:
    """Per-tenant turn counts (turns by status, tokens). Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self.turns: collections.Counter[tuple[str, str]] = collections.Counter()  # (tenant, status)
        self.tokens: collections.Counter[tuple[str, str]] = collections.Counter()  # (tenant, kind)

    def finished(self, tenant: str, summary: frontend_pb2.TurnSummary) -> None:
        with self._lock:
            self.turns[(tenant, "ok")] += 1
            self.tokens[(tenant, "prompt")] += summary.tokens_prefilled + summary.tokens_reused
            self.tokens[(tenant, "cached")] += summary.tokens_reused
            self.tokens[(tenant, "generation")] += summary.tokens_out

    def failed(self, tenant: str, code: str) -> None:
        with self._lock:
            self.turns[(tenant, code)] += 1

    def snapshot(self) -> tuple[dict, dict]:
        with self._lock:
            return dict(self.turns), dict(self.tokens)


class TurnTimer:
    """Observes one turn's TTFT, inter-token gaps and e2e latency (times in ns), and per request (each
    of its choices, as vLLM counts each of n sequences) the gaps between its tokens, its prompt and
    generated tokens and the time it waited (`waited_s`: the turn's admission wait, plus the compute
    node's queue time of the choice)."""

    def __init__(self, tenant: str, start_ns: int, waited_s: float = 0.0):
        self.tenant = tenant
        self.start_ns = start_ns
        self.waited_s = waited_s
        self.last_ns = 0
        self._token_ns: dict[int, int] = {}  # choice -> its last token's arrival

    def token(self, choice: int, now_ns: int) -> None:
        """A generated token of the choice arrived (text or not): vLLM's time per output token."""
        last = self._token_ns.get(choice)
        if last is not None:
            metrics.histogram("time_per_output_token_seconds").labels(self.tenant).observe(
                (now_ns - last) / 1e9)
        self._token_ns[choice] = now_ns

    def request_done(self, prompt_tokens: int, record: compute_pb2.TurnRecord) -> None:
        """One choice ended: its prompt's and generated tokens, and how long it waited before it ran."""
        metrics.histogram("request_prompt_tokens").labels(self.tenant).observe(prompt_tokens)
        metrics.histogram("request_generation_tokens").labels(self.tenant).observe(record.tokens_out)
        metrics.histogram("request_queue_time_seconds").labels(self.tenant).observe(
            self.waited_s + max(0.0, record.queue_ms) / 1e3)

    def text(self, now_ns: int) -> None:
        if self.last_ns:
            metrics.histogram("inter_token_latency_seconds").labels(self.tenant).observe(
                (now_ns - self.last_ns) / 1e9)
        else:
            metrics.histogram("time_to_first_token_seconds").labels(self.tenant).observe(
                (now_ns - self.start_ns) / 1e9)
        self.last_ns = now_ns

    def done(self, now_ns: int) -> None:
        metrics.histogram("e2e_request_latency_seconds").labels(self.tenant).observe(
            (now_ns - self.start_ns) / 1e9)


def replica_families(figures: dict) -> Iterable:
    """From replicas.Replicas.figures: {"up": {name: 0|1}, "turns": {name: n}, "retries": n}."""
    yield metrics.gauge("replica_up", "1 while the replica is in the rotation, else 0.", figures["up"],
                        ("replica",))
    yield metrics.counter("replica_turns_total", "Turns (choices) each replica served.", figures["turns"],
                          ("replica",))
    yield metrics.counter("replica_retries_total", "Turns retried on another replica after the first "
                          "failed before its first token.", figures["retries"])


def families(tenants: Tenants, figures: Callable[[], dict],
             replicas: Callable[[], dict] | None = None) -> Iterable:
    """The frontend's families: per-tenant counts and its own figures (turns running, waiting)."""
    turns, tokens = tenants.snapshot()
    yield metrics.counter("requests_total", "Chat turns by tenant and final status.", turns,
                          ("tenant", "status"))
    for kind, doc in (("prompt", "Prompt tokens of the tenant's turns (the whole context)."),
                      ("cached", "Prompt tokens whose KV was reused."),
                      ("generation", "Tokens generated for the tenant.")):
        name = "prompt_tokens_cached_total" if kind == "cached" else f"{kind}_tokens_total"
        yield metrics.counter(name, doc, {(t,): n for (t, k), n in tokens.items() if k == kind},
                              ("tenant",))
    f = figures()
    yield metrics.gauge("num_requests_running", "Turns forwarded to the agent now.", f["turns_active"])
    yield metrics.gauge("num_requests_waiting", "Turns waiting for admission.", f["turns_waiting"])
    yield metrics.counter("requests_rejected_busy_total", "Turns refused as busy (429).",
                          f["rejected_busy"])
    yield metrics.counter("requests_rejected_total", "Turns refused (429) by reason: waiting_room_full, "
                          "pushed_out (gave its waiting place to a user holding fewer), timeout, quota.",
                          f.get("rejected_by_reason", {}), ("reason",))
    yield metrics.gauge("contexts", "Contexts stored by the frontend.", f.get("contexts", 0))
    if replicas is not None:
        yield from replica_families(replicas())


def reader(tenants: Tenants, figures: Callable[[], dict], replicas: Callable[[], dict] | None = None):
    """The frontend's collector (read at every scrape); its histograms are created now, so they show
    before the first turn."""
    for name in HISTOGRAMS:
        metrics.histogram(name)
    return lambda: families(tenants, figures, replicas)
