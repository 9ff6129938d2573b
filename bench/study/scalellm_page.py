"""`kvtb study scalellm`'s page: its plots (one quantity per axis, the seed's Table 1 beside ours), the
table by level, the intro and the body (pure but for writing the plots)."""
from __future__ import annotations

from pathlib import Path

from bench.results import plot_lines
from bench.study.scalellm_claims import SEED_TABLE1
from bench.study.scalellm_figures import measured_levels, stat
from bench.study.scalellm_gateways import gateway_table
from bench.study.scalellm_replicas import placements_text, replica_table, replicas_text

PAPER = ("ScaleLLM measured Mixtral 8x7B on NVIDIA H100 GPUs (TensorRT-LLM, vLLM and HuggingFace "
         "engines behind a FastAPI or a Rust gateway, 512 tokens per reply)")


def _virtual(study: dict) -> str:
    return " (virtual time)" if study["settings"].get("profile") else ""


def draw(study: dict, out: Path) -> list[Path | None]:
    """Table 1's TTFT and TBT (ours beside the seed's vLLM and ScaleLLM columns), Fig. 6's gateway share
    and latency split, Fig. 7's throughput: each plot one quantity on its axis."""
    levels = measured_levels(study["results"].get("levels", {}))
    xs = sorted(levels)
    if not xs:
        return []
    v = _virtual(study)

    def series(key: str, which: str = "") -> tuple[list[int], list[float]]:
        pts = [(c, stat(levels[c], key, which) if which else levels[c].get(key)) for c in xs]
        pts = [(c, y) for c, y in pts if y is not None]
        return [c for c, _ in pts], [y for _, y in pts]

    def seed(column: int) -> dict[str, tuple[list[int], list[float]]]:
        return {f"seed: {name} (Table 1, H100)": (sorted(rows), [rows[c][column] for c in sorted(rows)])
                for name, rows in SEED_TABLE1.items()}

    ttft = plot_lines(out / "scalellm-table1-ttft.png",
                      {"here: TTFT p50, timed-out requests included": series("ttft_ms_incl_timeouts", "p50"),
                       **seed(0)},
                      title="Table 1: time to first token against concurrency", xlabel="concurrent requests",
                      ylabel=f"TTFT, ms{v}", logx=True, logy=True)
    tbt = plot_lines(out / "scalellm-table1-tbt.png",
                     {"here: TBT p50": series("tbt_ms", "p50"), **seed(1)},
                     title="Table 1: time between tokens against concurrency", xlabel="concurrent requests",
                     ylabel=f"TBT, ms{v}", logx=True, logy=True)
    share = plot_lines(out / "scalellm-fig6-gateway-share.png",
                       {"frontend e2e - engine, over frontend e2e": series("gateway_share"),
                        "client e2e - engine, over client e2e": series("client_gateway_share")},
                       title="Fig. 6: the gateway's share of the mean latency (the seed gives no numbers)",
                       xlabel="concurrent requests", ylabel="gateway share of latency (fraction)", logx=True,
                       hlines={"half: the bottleneck's side": 0.5})
    split = plot_lines(out / "scalellm-fig6-latency.png",
                       {"engine latency": series("engine_ms_mean"), "gateway latency": series("gateway_ms_mean")},
                       title="Fig. 6: mean latency per request, engine and gateway", xlabel="concurrent requests",
                       ylabel=f"latency, ms{v}", logx=True, logy=True)
    fig7 = plot_lines(out / "scalellm-fig7-throughput.png",
                      {"generated tokens/s (compute node)": series("generated_tokens_per_s"),
                       "tokens/s of completed requests": series("output_tokens_per_s")},
                      title="Fig. 7: throughput against concurrency (the seed gives no numbers)",
                      xlabel="concurrent requests", ylabel=f"output tokens/s{v}", logx=True)
    return [ttft, tbt, share, split, fig7]


def _ms(f: dict, key: str, which: str) -> str:
    v = stat(f, key, which) if which else f.get(key)
    return "-" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.1f}"


def _tps(f: dict) -> str:
    generated = f.get("generated_tokens_per_s")
    return f"{f['output_tokens_per_s']:.1f}" + ("" if generated is None else f" ({generated:.1f})")


def level_table(study: dict) -> str:
    """Table 1's shape, one row per level (every repeat pooled), with Fig. 6's and Fig. 7's figures."""
    head = ["concurrent", "repeats", "requests", "completed", "timeouts", "errors", "TTFT p50 ms", "TTFT p99 ms",
            "TTFT p99 incl. timeouts ms", "TBT p50 ms", "TBT p99 ms", "tokens/s (generated)", "engine ms",
            "gateway ms", "gateway share", "gateway from client ms"]
    rows = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c, f in sorted(study["results"].get("levels", {}).items(), key=lambda kv: int(kv[0])):
        if "failed" in f:
            error = " ".join(str(f["failed"]).replace("|", "/").split())
            rows.append(f"| {c} | failed: {error} |" + " |" * (len(head) - 2))
            continue
        share = f.get("gateway_share")
        cells = [c, len(f.get("repeats") or [f]), f["requests"], f["completed"], f["timeouts"], f["errors"],
                 _ms(f, "ttft_ms", "p50"), _ms(f, "ttft_ms", "p99"), _ms(f, "ttft_ms_incl_timeouts", "p99"),
                 _ms(f, "tbt_ms", "p50"), _ms(f, "tbt_ms", "p99"), _tps(f), _ms(f, "engine_ms_mean", ""),
                 _ms(f, "gateway_ms_mean", ""), "-" if share is None else f"{share:.1%}",
                 _ms(f, "client_gateway_ms_mean", "")]
        rows.append("| " + " | ".join(str(x) for x in cells) + " |")
    return "\n".join(rows)


def intro_of(study: dict) -> str:
    s = study["settings"]
    model = "a tiny random 2-layer Llama (--smoke: checks the study runs; its figures mean nothing)" \
        if s["smoke"] else "SmolLM2-135M"
    seed_condition = (s["max_tokens"] == 512 and s["timeout_s"] == 60.0)
    return (f"ScaleLLM's end-to-end serving figures (Table 1, Figs. 2, 6 and 7) on this testbed: {model} in the "
            f"compute node on the CPU ({study['machine'].get('cores')} cores, shared with the frontend, the "
            f"SmartNIC agent, the storage node and the clients), under the `{s['policy']}` KV policy. "
            f"Levels {', '.join(map(str, s['levels']))} concurrent clients, {s['repeats']} repeat(s) of every "
            f"level (each repeat a sweep of all levels, new users each time), each client sending "
            f"{s['requests_per_client']} requests back to back ({s['requests_per_client']} x c per level and "
            f"repeat; ScaleLLM sends 20 x c), streamed through the frontend's OpenAI HTTP API (`stream: true`, "
            f"`stream_options.include_usage`), greedy, max_tokens {s['max_tokens']} (ScaleLLM: 512); a request "
            f"unfinished {s['timeout_s']:g} s after it was sent is cancelled then and counted as a timeout"
            + ("" if seed_condition else " (not the seed's condition: the timeouts claim is out of scope)")
            + f". The compute node batches up to {s['max_num_seqs']} sequences: at a higher level the rest wait "
            f"in its queue. {PAPER}: compare shapes and ratios, not absolute numbers."
            + replicas_text(s, study["machine"].get("cores")))


def replicas_body(study: dict) -> list[str]:
    """With several replica counts: Fig. 8's table, then each count's Table 1 (the page's first table is
    the smallest count's)."""
    by = study["results"].get("by_replicas") or {}
    if not by:
        return []
    lines = ["## Fig. 8: replica counts side by side", "",
             replica_table(study) or "no replica count ran", "", placements_text(study), "",
             "Each count is a stack of its own, run through the same levels with new users; tokens/s are the "
             "tokens every compute node generated over the level's wall time (else the completed requests'), "
             "TTFT p50 counts the timed-out requests as Table 1's claims do, and each ratio is the larger "
             "count over the smaller at the same level; `served by` counts the completed requests by the "
             "replica their turn summary names (how the frontend's routing spread them).", ""]
    for n, entry in sorted(by.items(), key=lambda kv: int(kv[0]))[1:]:
        lines += [f"## Table 1, Fig. 6 and Fig. 7 by level, {n} replicas", "",
                  level_table({"results": {"levels": entry["levels"]}}), ""]
    return lines


def gateways_body(study: dict) -> list[str]:
    g = study["results"].get("gateways")
    if not g:
        return []
    return [f"## The gateway comparison: the same load through gRPC and HTTP, {g['level']} concurrent"
            + (f", replies of at most {g['max_tokens']} tokens" if g.get("max_tokens") else ""), "",
            gateway_table(g, bool(study["settings"].get("profile"))), "",
            "The same questions, clients and reply length through the frontend's gRPC Chat API and its OpenAI "
            "HTTP API, one after the other in each repeat (their order alternated by repeat); both protocols are "
            "served by the same Python frontend, so only the protocol differs (ScaleLLM swaps FastAPI over "
            "HTTP/1.1 for Rust over gRPC). The gateway share is the frontend's e2e minus the engine's time, over "
            "the frontend's e2e; `gateway from client` is the client's e2e minus the engine's.", ""]


def body_of(study: dict) -> str:
    counts = study["settings"].get("replicas") or [1]
    return "\n".join([
        *replicas_body(study),
        "## Table 1, Fig. 6 and Fig. 7 by level" + ("" if counts == [1] else
                                                    f", {counts[0]} replica{'s' if counts[0] > 1 else ''}"),
        "",
        level_table(study), "",
        "Every repeat's requests pooled; the claims judge each repeat apart (its values are in the results "
        "JSON under each level's `repeats`). TTFT, TBT and e2e are the client's clocks over the completed "
        "requests (timeouts and errors counted beside them); `TTFT p99 incl. timeouts` counts the timed-out "
        "requests too, at their first text or, if none came, at the timeout (a lower bound), and the claims "
        "use that TTFT; TBT is (e2e - TTFT) / (completion tokens - 1) per request; tokens/s are the completed "
        "requests' completion tokens over the level's wall time, and in brackets every token the compute node "
        "generated in that time, timed-out requests' included (ScaleLLM's throughput; Fig. 7 and the claims "
        "use it when the node's counters answered).", "",
        "Engine and gateway: the HTTP response carries only the usage chunk and the context id "
        "(X-Session-Id), so after each level the study reads each completed request's stored turn summary from "
        "the frontend (gRPC GetContext as its user). `engine ms` is the compute node's time for the turn, from "
        "its arrival there (its scheduler's queue included) to its last token; `gateway ms` is the frontend's "
        "e2e minus that (admission, authentication, the SmartNIC agent's relay, streaming back); `gateway from "
        "client` is the client's e2e minus engine time, ScaleLLM's gateway latency as the user sees it, "
        "including the HTTP client in this process on the same cores.", "",
        *gateways_body(study)])


def scaled_note(profile) -> str:
    """What a run under a hardware profile charges, and what it does not."""
    return (f"## Under the hardware profile `{profile.name}`\n\n{profile.description}\n\n"
            "Every engine step takes the roofline time of the virtual model's step on the profile's GPU (the real "
            "model still computes every token), every KV transfer the profile's links and drive. The frontend and "
            "the agent's control plane are software on both worlds: their CPU time is stretched by D, so that in "
            "virtual time they run at their real speed (`frontend_software`, `agent_software` in the pacing). "
            "TTFT, TBT, e2e, engine and gateway times, throughput and the timeout are virtual (wall / D), and the "
            "plots' axes say so. The HTTP clients run in this process unstretched: their own time is D times "
            "shorter in virtual time than it is here, so the client's share of `gateway from client` is "
            "understated.")
