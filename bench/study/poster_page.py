"""The poster study's page: what it runs, the swap-to-storage note, every point's row, the profile's note."""
from __future__ import annotations


def intro_text(m, mode: str) -> str:
    w = m.fig5
    side = ", ".join(m.side_strategies)
    storage = ("" if m.storage_shares is None else
               f", swap-storage at {', '.join(f'{x:.0%}' for x in m.storage_shares)} only")
    return f"""The recompute-vs-swap poster (vLLM, Yarn-Llama-2-7B, A100 40 GB) asks what preemption costs when
the KV cache runs out: recompute the victim's KV later, or swap it to host memory and back. Here the
batching engine of the compute node (SmolLM2-135M on CPU, fp32 KV in a shared-memory pool standing in
for GPU memory) runs three strategies: `recompute`, `swap-host` (a host swap tier inside the compute
node: vLLM's CPU swap space, the poster's swap) and `swap-storage` (the paper's way: preemption `swap`
under policy `triggered`, triggered PUTs to the storage node and GETs back).

Scaled to this model and machine ({mode} mode, {m.repeats} repeats of every point): the poster's 32 requests
of 1,500 input + 1,024 output tokens become {w.requests} requests of {w.input_tokens} + {w.output_tokens} issued
at once (Figs 3, 5, 6; every strategy{storage}); Fig. 4's batch 16 becomes {m.fig4_batch} requests at lengths
{', '.join(f'{i}+{o}' for i, o in m.fig4_lengths)} (pool {m.fig4_share:.0%} of their need); Fig. 2's block sizes
are {', '.join(map(str, m.block_sizes))} tokens at {m.fig2_share:.0%} (Figs 2 and 4: {side}); KV memory available
is the pool as a share of what every request needs at its longest at once ({', '.join(f'{s:.0%}' for s in m.shares)});
Fig. 6 is read at the poster's 12% when the mode runs it (else the smallest share). Fig. 3 is drawn from
Fig. 5's runs (each repeat's evicted tokens, x, against its overhead, y).

**The prefix cache is off for this study** (the compute node's `prefix_cache = false`): with it on, a sequence
resumed after a recompute preemption found its own freed blocks still cached and recomputed only part of
what it lost (an earlier run recomputed 137 of 553 evicted tokens at block 16, 587 of 587 at 64), which made
recompute look cheaper at small blocks. Off, recompute recomputes everything evicted, as vLLM did at the
poster's time; the tokens found in the prefix cache are still counted apart (`reused` below; 0 when off).

Overhead is reported three ways, each on its own axis: the engine's own time in preemption work (forward time
on recomputed tokens; the host tier's copies; for swap-storage the swapped sequences' waits for their GETs),
which the claims are judged on; the extra end-to-end time (the batch's makespan against the same batch on a
pool that never runs out, same policy, repeat paired with repeat); and the extra CPU time of the serving
processes. A claim agrees or disagrees only when the 95% band of its repeats clears its bound
(bench.study.claims). Claims comparing swap with recompute speak for the poster's GPU and PCIe link: without
a hardware profile a swap here is a memcpy inside one process, so they are out of scope unless the run is
under `--profile polaris-a100`. The poster gives no numbers for its curves, so its series cannot be drawn;
its plots mark what it does give (the 30%/50% minimum and the <= 40% range of Fig. 5, the 12% of Fig. 6)."""


def storage_note(study: dict) -> str:
    f5 = study["results"].get("fig5", {})
    if not f5:
        return ""
    tight = min(f5, key=float)
    by = f5[tight] or {}
    st, host = by.get("swap-storage"), by.get("swap-host")
    if not st:
        return ""
    c = st["counters"]
    text = (f"## Swap to storage (the paper's way)\n\nAt {float(tight):.0%} (means of the repeats): swap-storage's "
            f"swap-outs took {c['preempt_swap_out_s'] * 1e3:.1f} ms of engine time in all, its swapped sequences "
            f"waited {c['preempt_swap_wait_s']:.2f} s in all for their GETs, extra e2e {st['extra_e2e_s']:+.2f} s. ")
    if host:
        text += (f"swap-host copied {host['counters']['swap_host_bytes_out'] / 2**20:.1f} MiB out in "
                 f"{host['counters']['preempt_swap_out_s'] * 1e3:.1f} ms and back in "
                 f"{host['counters']['preempt_swap_in_s'] * 1e3:.1f} ms. ")
    text += ("Under `triggered` every block is stored by a triggered PUT as it fills, so a swap-out only "
             "stores the victim's partial last block (and its full blocks stay pinned until their PUTs end); "
             "the cost is on the way back: GETs through the agent and the storage node, while the sequence "
             "waits outside the batch.")
    return text


def rows_table(study: dict) -> str:
    lines = ["## Points (means of the repeats)", "",
             "| figure | x | strategy | repeats | pool tokens | preemptions | evicted tokens | recomputed | reused "
             "| makespan s | ample s | extra e2e | extra CPU | engine s |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for fig in ("fig2", "fig4", "fig5"):
        for x, by in study["results"].get(fig, {}).items():
            for s, r in (by or {}).items():
                if r:
                    lines.append(f"| {fig} | {x} | {s} | {r['n_repeats']} | {r['pool_tokens']} | "
                                 f"{r['preemption_count']:.1f} | {r['evicted_tokens']:.0f} | "
                                 f"{r['recomputed_tokens']:.0f} | {r['reused_tokens']:.0f} | {r['makespan_s']:.2f} | "
                                 f"{r['ample_makespan_s']:.2f} | {r['extra_e2e_s']:+.2f} s ({r['extra_e2e_frac']:+.0%}) "
                                 f"| {r['extra_cpu_s']:+.2f} s ({r['extra_cpu_frac']:+.0%}) | {r['engine_total_s']:.2f} |")
                else:
                    lines.append(f"| {fig} | {x} | {s} | failed | | | | | | | | | | |")
    return "\n".join(lines)


def scaled_note(study: dict, profile) -> str:
    """What the scale model changes on this page."""
    rec = study.get("scale") or {}
    kinds = (rec.get("pacing") or {}).get("kinds", {})
    rows = "\n".join(f"| {k} | {v['ops']} | {v['violations']} | {v['worst_ratio']:.3g} |" for k, v in kinds.items())
    return (f"## Under the hardware profile `{profile.name}`\n\n{profile.description}\n\n"
            "Every engine step takes the roofline time of the virtual model's step on the profile's GPU, every "
            "swap-host copy the PCIe link's time for the virtual model's KV of the tokens moved, every "
            "triggered PUT and GET the NIC's, every store and retrieve the NVMe drive's, each dilated by D; "
            "the real SmolLM2 still computes every token. Makespans, engine seconds and throughput are virtual "
            "(wall / D); the extra CPU time is this machine's real CPU time and speaks for this machine only.\n\n"
            "| operation | paced | violations | worst real ÷ modeled |\n| --- | --- | --- | --- |\n" + rows)


def sittings_note(study: dict) -> str:
    """The sittings a run was taken in (`--resume`), when more than one: which points each ran, at which
    commit (empty for a run taken in one sitting)."""
    sittings = (study.get("settings") or {}).get("sittings") or []
    if len(sittings) < 2:
        return ""
    rows = "\n".join(f"| {i + 1} | {s.get('commit') or '?'} | {s.get('time_utc') or '?'} | {s.get('points', 0)} | "
                     f"`{s.get('command') or '?'}` |" for i, s in enumerate(sittings))
    return ("## Sittings\n\nThis run was taken in sittings (`--resume`, bench/study/poster_journal.py): each point "
            "and ample baseline ran whole, with all its repeats, in one sitting; a point's repeats are paired "
            "with its baseline's, which may have run in an earlier sitting. Under a profile every sitting ran at "
            "the first one's D, and the violations below are every sitting's.\n\n"
            "| sitting | commit | started (UTC) | points and baselines kept | command |\n| --- | --- | --- | --- | --- |\n"
            + rows)
