"""ScaleLLM's claims as data: one table (`CLAIMS`), each claim's evidence a pure function of the study's
results, judged by bench.study.report.judge.

`results` is the study's results with its settings beside them (`results["settings"]`): `levels` (by
concurrency, each level's pooled figures and its `repeats`, bench.study.scalellm_figures) and, when the
gateway comparison ran, `gateways` ({"level": c, "http": a level, "grpc": a level}).

The seed (scalellm-paper.txt) gives numbers only in Table 1 (TTFT and TBT by level, 1-64, streamed,
512-token replies, a 60 s timeout); Figs. 2, 6 and 7 are drawn without numbers in its text. A claim
quoting the seed uses its exact words; a claim that reads a shape off Table 1 or a figure is labelled
our hypothesis. Claims about a gateway falling behind a fast engine are valid under the H100 profile
only: on this machine's CPU the engine is some hundred times slower per token.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench.stats import ratio
from bench.study.claims import JUDGED, Claim, Evidence, Test
from bench.study.scalellm_figures import measured_levels, per_repeat, stat, throughput, ttft_of

SEED = "scalellm-paper.txt"
H100 = ("h100-nvme",)       # the profile nearest ScaleLLM's H100 GPUs
SEED_REPLY_TOKENS = 512     # Sec. 5: "set the maximum tokens generation length to 512"
SEED_TIMEOUT_S = 60.0       # Exp3: "we set the timeout of generating all the tokens to be 60 seconds"
TABLE1_TOP = 64             # Table 1's highest level
TIMEOUT_KEY = "table1-timeouts"

RELAY_WHY = ("the agent's turn relay is asynchronous (a relayed turn holds no worker thread; its 32 "
             "grpc_workers serve only the short blocking steps), so turns past the compute node's 32 batched "
             "sequences wait in its scheduler, counted as engine time, not in the agent as gateway time")


def _levels(results: Mapping[str, Any]) -> dict[int, dict]:
    return measured_levels(results.get("levels") or {})


def _top(levels: Mapping[int, dict], most: int | None = None) -> int | None:
    xs = [c for c in levels if most is None or c <= most]
    return max(xs) if xs else None


def _caveat(top: int, want: int) -> str:
    return "" if top == want else f"the seed's level {want} was not run: judged at {top}"


def _growth(of, top: int):
    """A repeat's figure at `top` over the same at 1 (None when either is missing)."""
    def fn(one: dict[int, dict]) -> float | None:
        a, b = of(one[1]), of(one[top])
        return None if a is None or b is None or not a else b / a
    return fn


def _ttft_p50(f: dict) -> float | None:
    t = ttft_of(f)
    return t["p50"] if t else None


def _tbt_p50(f: dict) -> float | None:
    return stat(f, "tbt_ms")


def _values_text(values: Sequence[float], fmt: str = "{:.2f}x") -> str:
    return ", ".join(fmt.format(v) for v in values) or "none"


# -- Table 1 ---------------------------------------------------------------------------------------------

def ttft_growth(results: Mapping[str, Any]) -> Evidence | None:
    levels = _levels(results)
    top = _top(levels, TABLE1_TOP)
    if 1 not in levels or top is None or top == 1:
        return None
    values = per_repeat(levels, _growth(_ttft_p50, top))
    pooled = [_ttft_p50(levels[1]), _ttft_p50(levels[top])]
    text = (f"TTFT p50 (timed-out requests included) at {top} over at 1, per repeat: {_values_text(values)}"
            + (f"; pooled {pooled[0]:.0f} -> {pooled[1]:.0f} ms" if None not in pooled else ""))
    return Evidence(values, text, _caveat(top, TABLE1_TOP))


def tbt_growth(results: Mapping[str, Any]) -> Evidence | None:
    levels = _levels(results)
    top = _top(levels, TABLE1_TOP)
    if 1 not in levels or top is None or top == 1:
        return None
    values = per_repeat(levels, _growth(_tbt_p50, top))
    pooled = [_tbt_p50(levels[1]), _tbt_p50(levels[top])]
    text = (f"TBT p50 at {top} over at 1, per repeat: {_values_text(values)}"
            + (f"; pooled {pooled[0]:.1f} -> {pooled[1]:.1f} ms" if None not in pooled else ""))
    return Evidence(values, text, _caveat(top, TABLE1_TOP))


def tbt_over_ttft(results: Mapping[str, Any]) -> Evidence | None:
    levels = _levels(results)
    top = _top(levels, TABLE1_TOP)
    if 1 not in levels or top is None or top == 1:
        return None
    tbt, ttft = _growth(_tbt_p50, top), _growth(_ttft_p50, top)

    def fn(one):
        a, b = tbt(one), ttft(one)
        return None if a is None or not b else a / b
    values = per_repeat(levels, fn)
    return Evidence(values, f"TBT's growth 1 -> {top} over TTFT's, per repeat: {_values_text(values, '{:.2f}')}",
                    _caveat(top, TABLE1_TOP))


def timeout_share(results: Mapping[str, Any]) -> Evidence | None:
    levels = _levels(results)
    upto = {c: f for c, f in levels.items() if c <= TABLE1_TOP}
    if not upto:
        return None

    def fn(one):
        shares = [f["timeout_share"] for c, f in one.items() if c <= TABLE1_TOP]
        return max(shares) if shares else None
    values = per_repeat(upto, fn)
    s = results.get("settings") or {}
    counts = ", ".join(f"{c}: {f['timeouts']}/{f['requests']}" for c, f in sorted(levels.items()))
    return Evidence(values, f"largest share timed out at any level up to {TABLE1_TOP}, per repeat: "
                            f"{_values_text(values, '{:.0%}')}; timeouts by level (all repeats) {counts}; "
                            f"replies of {s.get('max_tokens')} tokens, timeout {s.get('timeout_s')} s")


# -- Fig. 2 and Fig. 6: the gateway's share ------------------------------------------------------------

def _share_at(c: int):
    def fn(one):
        return one[c].get("gateway_share") if c in one else None
    return fn


def _share_text(levels: Mapping[int, dict], values: Sequence[float], c: int | str) -> str:
    pooled = ", ".join(f"{k}: {f['gateway_share']:.1%}" for k, f in sorted(levels.items())
                       if f.get("gateway_share") is not None)
    client = ", ".join(f"{k}: {f['client_gateway_share']:.1%}" for k, f in sorted(levels.items())
                       if f.get("client_gateway_share") is not None)
    return (f"gateway share (frontend e2e - engine, over frontend e2e) at {c}, per repeat: "
            f"{_values_text(values, '{:.1%}')}; pooled by level {pooled or 'none'}; seen from the client "
            f"(client e2e - engine): {client or 'none'}")


def engine_bound_low(results: Mapping[str, Any]) -> Evidence | None:
    levels = _levels(results)
    with_share = [c for c, f in levels.items() if f.get("gateway_share") is not None]
    if not with_share:
        return None
    c = 4 if 4 in with_share else min(with_share, key=lambda k: abs(k - 4))
    values = per_repeat(levels, _share_at(c))
    return Evidence(values, _share_text(levels, values, c), _caveat(c, 4))


def gateway_bound_256(results: Mapping[str, Any]) -> Evidence | None:
    levels = _levels(results)
    if 256 not in levels:
        return Evidence([], "level 256 was not run (full mode runs 1 .. 256)" if levels else "")
    values = per_repeat(levels, _share_at(256))
    return Evidence(values, _share_text(levels, values, 256))


def gateway_bound_high(results: Mapping[str, Any]) -> Evidence | None:
    levels = _levels(results)
    high = sorted(c for c in levels if c >= 64)
    if not high:
        return Evidence([], "no level of 64 or more was run" if levels else "")

    def fn(one):
        shares = [one[c].get("gateway_share") for c in high if c in one]
        return None if not shares or None in shares else min(shares)
    values = per_repeat(levels, fn)
    return Evidence(values, _share_text(levels, values, "/".join(map(str, high)) + " (the least of them)"))


def gateway_growth(results: Mapping[str, Any]) -> Evidence | None:
    levels = {c: f for c, f in _levels(results).items() if f.get("gateway_share") is not None}
    if len(levels) < 2:
        return None
    low, high = min(levels), max(levels)

    def fn(one):
        a, b = _share_at(low)(one), _share_at(high)(one)
        return None if a is None or b is None else b - a
    values = per_repeat(levels, fn)
    return Evidence(values, f"gateway share at {high} minus at {low}, per repeat: "
                            f"{_values_text(values, '{:+.1%}')}")


# -- Fig. 7: throughput ----------------------------------------------------------------------------------

def _tps(f: dict) -> float:
    return throughput(f)[0]


def throughput_growth(results: Mapping[str, Any]) -> Evidence | None:
    levels = _levels(results)
    if 1 not in levels or len(levels) < 2:
        return None
    top = max(levels)
    values = per_repeat(levels, _growth(_tps, top))
    kinds = {throughput(f)[1] for f in levels.values()}
    return Evidence(values, f"tokens/s at {top} over at 1, per repeat: {_values_text(values)}; pooled "
                            + ", ".join(f"{c}: {_tps(f):.1f}" for c, f in sorted(levels.items()))
                            + (" (tokens the compute node generated)" if kinds == {"generated"} else
                               " (completed requests' tokens where the node's counters did not answer)"))


def _per_doubling(a: float, b: float, ca: int, cb: int) -> float:
    import math
    return (b / a) ** (1.0 / math.log2(cb / ca))


def gains_shrink(results: Mapping[str, Any]) -> Evidence | None:
    levels = _levels(results)
    xs = sorted(levels)
    if len(xs) < 3:
        return Evidence([], f"{len(xs)} level(s) measured: a gain's change needs three") if xs else None

    def fn(one):
        cs = [c for c in xs if c in one]
        if len(cs) < 3:
            return None
        t = [_tps(one[c]) for c in cs]
        if min(t[:2] + t[-2:]) <= 0:
            return None
        return _per_doubling(t[-2], t[-1], cs[-2], cs[-1]) / _per_doubling(t[0], t[1], cs[0], cs[1])
    values = per_repeat(levels, fn)
    return Evidence(values, f"gain per doubling of concurrency into {xs[-1]} over that out of {xs[0]}, per "
                            f"repeat: {_values_text(values, '{:.2f}')}")


# -- the gateway comparison: the same load through gRPC and HTTP -------------------------------------------

def _pairs(results: Mapping[str, Any]) -> tuple[int, list[tuple[dict, dict]]] | None:
    g = results.get("gateways") or {}
    http, grpc_ = g.get("http"), g.get("grpc")
    if not http or not grpc_ or "failed" in http or "failed" in grpc_:
        return None
    return g["level"], list(zip(http.get("repeats") or [http], grpc_.get("repeats") or [grpc_]))


def gateway_swap(results: Mapping[str, Any]) -> Evidence | None:
    pairs = _pairs(results)
    if pairs is None:
        return None
    c, rs = pairs
    values = [h["gateway_share"] - g["gateway_share"] for h, g in rs
              if h.get("gateway_share") is not None and g.get("gateway_share") is not None]
    g = results["gateways"]
    ms = (f"; pooled gateway {g['http'].get('gateway_ms_mean') or 0:.0f} ms (HTTP) against "
          f"{g['grpc'].get('gateway_ms_mean') or 0:.0f} ms (gRPC), engine "
          f"{g['http'].get('engine_ms_mean') or 0:.0f} against {g['grpc'].get('engine_ms_mean') or 0:.0f} ms")
    return Evidence(values, f"at {c} concurrent, gateway share through HTTP minus through gRPC, per repeat: "
                            f"{_values_text(values, '{:+.1%}')}" + ms)


def gateway_swap_throughput(results: Mapping[str, Any]) -> Evidence | None:
    pairs = _pairs(results)
    if pairs is None:
        return None
    c, rs = pairs
    values = [ratio(_tps(g), _tps(h)) for h, g in rs if _tps(h) > 0]
    return Evidence(values, f"at {c} concurrent, tokens/s through gRPC over through HTTP, per repeat: "
                            f"{_values_text(values)}")


CLAIMS: list[Claim] = [
    Claim("table1-ttft-grows", "Table 1",
          "TTFT grows with concurrency from 1 to 64 concurrent requests",
          "TTFT p50 at the highest level up to 64 over TTFT p50 at 1, each repeat (timed-out requests "
          "counted at their first text, or at the timeout)",
          Test("above", 4.0, tolerance=2.0, unit="x"), ttft_growth, source="hypothesis",
          seed="vLLM 48.4 -> 285.4 ms (5.9x), ScaleLLM 25.0 -> 99.4 ms (4.0x)",
          why="our reading of Table 1's numbers (the text says only that ScaleLLM's TTFT and TBT are lower "
              "than vLLM's); requests past the compute node's 32 batched sequences wait in its queue"),
    Claim("table1-tbt-grows", "Table 1",
          "TBT grows with concurrency from 1 to 64 concurrent requests",
          "TBT p50 at the highest level up to 64 over TBT p50 at 1, each repeat",
          Test("above", 1.9, tolerance=0.4, unit="x"), tbt_growth, source="hypothesis",
          seed="vLLM 16.5 -> 70.8 ms (4.3x), ScaleLLM 8.5 -> 16.5 ms (1.9x)",
          why="our reading of Table 1's numbers; each decode step carries every running sequence, up to the "
              "compute node's 32"),
    Claim("table1-tbt-vs-ttft", "Table 1",
          "TBT grows by less than TTFT from 1 to 64 concurrent requests",
          "TBT's growth from 1 to the highest level up to 64 over TTFT's, each repeat",
          Test("below", 1.0), tbt_over_ttft, source="hypothesis",
          seed="vLLM 4.3x against 5.9x (0.73), ScaleLLM 1.9x against 4.0x (0.49)",
          why="our reading of both continuous-batching columns of Table 1 (not the seed's words); a queued "
              "request adds to TTFT only"),
    Claim(TIMEOUT_KEY, "Table 1",
          "With a continuous-batching engine (vLLM, ScaleLLM) fewer than 90% of requests time out at 60 s "
          "at every level up to 64",
          "the largest share of requests timed out (unfinished 60 s after being sent) at any level up to 64, "
          "each repeat",
          Test("below", 0.9), timeout_share, source="hypothesis",
          seed="vLLM and ScaleLLM have TTFT and TBT at every level 1-64; HuggingFace 'Timeout' (90% cannot "
               "complete in 60 s) from 8; 512-token replies",
          why="our reading of Table 1 (a level is marked Timeout when 90% of requests cannot complete in "
              "60 s); judged only at the seed's 512-token replies and 60 s timeout"),
    Claim("fig2-engine-bound-at-4", "Sec. 3.2, Fig. 2",
          "with 4 concurrent requests, engine latency is the primary bottleneck",
          "the gateway's share of the mean latency at 4 concurrent, each repeat",
          Test("below", 0.5), engine_bound_low, seed="Fig. 2a (drawn, no numbers in the text)",
          why="a reply takes the engine seconds here; the gateway's work per request does not grow with it"),
    Claim("fig2-gateway-bound-at-256", "Sec. 3.2, Fig. 2",
          "at 256 concurrent requests, the gateway latency becomes the predominant bottleneck",
          "the gateway's share of the mean latency at 256 concurrent, each repeat",
          Test("above", 0.5), gateway_bound_256, seed="Fig. 2b (drawn, no numbers in the text)", profiles=H100,
          why="a Python gateway falls behind only an engine as fast as ScaleLLM's H100s; " + RELAY_WHY),
    Claim("fig6-gateway-new-bottleneck", "Fig. 6",
          "at concurrency levels of 64/128/256, the baseline gateway latency increases when connected to the "
          "ScaleLLM Engine, compared to its connection with Baseline engine, making it the new bottleneck",
          "the least of the gateway's shares of the mean latency at the levels of 64 and more, each repeat "
          "(one engine here: judged on 'the new bottleneck')",
          Test("above", 0.5), gateway_bound_high, seed="Fig. 6 (drawn, no numbers in the text)", profiles=H100,
          why="the claim needs an engine fast enough to outrun a Python gateway (the H100 profile); " + RELAY_WHY),
    Claim("gateway-share-grows", "Sec. 3.2, Fig. 2",
          "The gateway's share of the latency grows with concurrency",
          "the gateway's share at the highest level minus at the lowest, each repeat",
          Test("above", 0.0), gateway_growth, source="hypothesis",
          seed="Fig. 2: engine-bound at 4, gateway-bound at 256",
          why="our reading of Fig. 2's two panels"),
    Claim("fig7-throughput-grows", "Fig. 7",
          "Output throughput grows with concurrency from 1 to the highest level",
          "tokens/s at the highest level over tokens/s at 1, each repeat (every token the compute node "
          "generated, ScaleLLM's N_t, when its counters answered)",
          Test("above", 1.0, unit="x"), throughput_growth, source="hypothesis",
          seed="Fig. 7, 1 to 256 (drawn, no numbers in the text)",
          why="our reading of Fig. 7's curves; continuous batching shares each forward among up to 32 sequences"),
    Claim("fig7-gains-shrink", "Fig. 7",
          "The throughput gained per doubling of concurrency shrinks as the engine fills",
          "the gain per doubling into the highest level over the gain per doubling out of the lowest, "
          "each repeat",
          Test("below", 1.0), gains_shrink, source="hypothesis",
          seed="Fig. 7 (drawn, no numbers in the text); the seed's reading: \u201cdemonstrating the "
               "cumulative impact of both engine and gateway optimizations on overall system performance\u201d",
          why="our reading, not the seed's: its text credits the engine and gateway optimisations, not the "
              "engine filling"),
    Claim("fig6-gateway-swap", "Fig. 6",
          "we observe a significant reduction in latency upon swapping the baseline gateways out with "
          "ScaleLLM Gateway",
          "the gateway's share of the mean latency through the HTTP API minus through gRPC, the same load "
          "(one level), each repeat pair",
          Test("above", 0.0), gateway_swap,
          seed="Sec. 4.2: FastAPI (Python) over HTTP/1.1 replaced by Axum (Rust) over gRPC",
          why="ScaleLLM swaps the language and the protocol; here one Python frontend serves both protocols, "
              "so only the protocol (HTTP/1.1 with SSE and JSON, or gRPC with protobuf) changes"),
    Claim("fig7-gateway-throughput", "Fig. 7",
          "the optimization of the Gateway contributes to further notable performance enhancements",
          "tokens/s through gRPC over through the HTTP API, the same load (one level), each repeat pair",
          Test("above", 1.0, unit="x"), gateway_swap_throughput,
          seed="Fig. 7 (drawn, no numbers in the text)",
          why="one Python frontend serves both protocols: only the protocol changes, not the language"),
]


def scope_replies(records: Sequence[dict], settings: Mapping[str, Any]) -> None:
    """The timeouts claim is the seed's only at its condition (512-token replies, a 60 s timeout): at
    another, a judged verdict becomes out of scope, its measurement still shown."""
    tokens, timeout = settings.get("max_tokens"), settings.get("timeout_s")
    if tokens == SEED_REPLY_TOKENS and timeout == SEED_TIMEOUT_S:
        return
    for r in records:
        if r["key"] == TIMEOUT_KEY and r["verdict"] in JUDGED + ("inconclusive",):
            r["why"] = (f"out of scope: replies of {tokens} tokens and a {timeout:g} s timeout, not the seed's "
                        f"{SEED_REPLY_TOKENS} and {SEED_TIMEOUT_S:g} s (full mode runs them; would have been "
                        f"{r['verdict']}); " + r["why"])
            r["verdict"] = "out of scope"


# The seed's Table 1 (ms): concurrency -> (TTFT, TBT), for the plots beside ours.
SEED_TABLE1 = {
    "vLLM": {1: (48.4, 16.5), 2: (51.9, 16.7), 4: (55.1, 21.1), 8: (70.2, 30.1), 16: (93.1, 38.3),
             32: (135.8, 50.1), 64: (285.4, 70.8)},
    "ScaleLLM": {1: (25.0, 8.5), 2: (25.3, 8.7), 4: (25.5, 10.4), 8: (25.9, 12.2), 16: (26.7, 13.4),
                 32: (29.8, 14.6), 64: (99.4, 16.5)},
}
