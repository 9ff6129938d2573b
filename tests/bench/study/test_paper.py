"""`kvtb study paper`: sizes and layouts, the transfer figures (speedup, stall ratio), the Fig. 2 Gantt
data from a hand-made record, claims and headline rows; and a --smoke run's JSON contract (slow: real
services, the tiny model)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.study import paper
from bench.study.paper import GIB, KIB, MIB
from kvtb.launch import kvtb_argv


# -- sizes ---------------------------------------------------------------------------------------------

def test_a_size_is_whole_tokens_in_blocks_of_at_most_1_mib():
    small = paper.layout_for_size(32 * KIB)
    assert (small.num_blocks, small.block_tokens, small.block_bytes) == (1, 1, 32 * KIB)
    assert small.kv_bytes_per_token == paper.TOKEN_KV_BYTES == 32 * KIB
    big = paper.layout_for_size(64 * MIB)
    assert (big.num_blocks, big.block_tokens, big.block_bytes) == (64, 32, MIB)
    assert big.num_layers == paper.NUM_LAYERS  # the chunk's MAC parts: one per layer, as the product stores
    with pytest.raises(ValueError):
        paper.layout_for_size(48 * KIB)  # a token and a half
    with pytest.raises(ValueError):
        paper.layout_for_size(33 * 32 * KIB)  # 33 tokens do not fill blocks of 32


def test_the_largest_size_is_the_ladder_step_under_every_bound():
    assert paper.largest_size(24 * GIB, 79 * GIB) == 2 * GIB                 # capped
    assert paper.largest_size(1 * GIB, 79 * GIB) == 128 * MIB                # MemAvailable / 8
    assert paper.largest_size(24 * GIB, 3 * GIB) == 128 * MIB                # free disk / 8
    assert paper.largest_size(None, None) == 2 * GIB
    assert paper.largest_size(1 * MIB, None) == 128 * KIB
    assert paper.largest_size(100 * KIB, None) == 32 * KIB                   # never below 32 KiB
    assert paper.ladder_to(2 * MIB) == [32 * KIB, 128 * KIB, 512 * KIB, 2 * MIB]


def test_options_of_each_mode():
    smoke = paper.parse_args(["--smoke"])
    assert smoke.sizes == list(paper.SMOKE_SIZES) and smoke.repeats == 2 and smoke.max_new_tokens == 8
    quick = paper.parse_args(["--quick"])
    assert quick.sizes[0] == 32 * KIB and quick.sizes[-1] <= paper.QUICK_MAX_BYTES and quick.repeats == 5
    chosen = paper.parse_args(["--sizes-kib", "32,1024", "64", "--repeats", "4"])
    assert chosen.sizes == [32 * KIB, 64 * KIB, MIB] and chosen.repeats == 4
    with pytest.raises(SystemExit):
        paper.parse_args(["--sizes-kib", "48"])


# -- the transfer figures ---------------------------------------------------------------------------

def sample(size, mode, rep, e2e, blocked, busy, agent=0.0):
    return {"bytes": size, "mode": mode, "rep": rep, "blocks": max(1, size // MIB),
            "block_bytes": min(size, MIB), "e2e_s": e2e, "blocked_s": blocked, "busy_s": busy,
            "agent_cpu_s": agent}


SAMPLES = [
    sample(32 * KIB, "cpu", 0, 0.004, 0.004, 0.001), sample(32 * KIB, "triggered", 0, 0.002, 0.0001, 0.00005),
    sample(32 * KIB, "cpu", 1, 0.006, 0.006, 0.001), sample(32 * KIB, "triggered", 1, 0.002, 0.0001, 0.00005),
    sample(32 * KIB, "cpu", 2, 0.005, 0.005, 0.001), sample(32 * KIB, "triggered", 2, 0.001, 0.0002, 0.00005),
    sample(8 * MIB, "cpu", 0, 0.100, 0.100, 0.02),
    sample(8 * MIB, "triggered", 0, 0.050, 0.001, 0.0005, 0.03),
    sample(64 * MIB, "cpu", 0, 0.9, 0.9, 0.2),    # no triggered sample at 64 MiB: not a row
]


def test_speedup_and_stall_ratio_are_cpu_over_triggered_medians():
    rows = paper.summarize(SAMPLES)
    assert [r["bytes"] for r in rows] == [32 * KIB, 8 * MIB]
    small, big = rows
    assert small["cpu_e2e_s"] == pytest.approx(0.005) and small["triggered_e2e_s"] == pytest.approx(0.002)
    assert small["speedup"] == pytest.approx(2.5)
    assert small["stall_ratio"] == pytest.approx(0.005 / 0.0001)
    assert small["busy_ratio"] == pytest.approx(20.0)
    assert small["paired_speedups"] == pytest.approx([2.0, 3.0, 5.0])
    assert small["triggered_blocked_share"] == pytest.approx(0.05)
    assert big["speedup"] == pytest.approx(2.0) and big["stall_ratio"] == pytest.approx(100.0)
    assert big["triggered_agent_cpu_s"] == pytest.approx(0.03)
    r = paper.transfer_ratios(rows, None)
    assert (r["speedup_min"], r["speedup_max"]) == (pytest.approx(2.0), pytest.approx(2.5))
    assert r["speedup_smallest"] == pytest.approx(2.5) and r["speedup_largest"] == pytest.approx(2.0)
    assert r["stall_ratio_min"] == pytest.approx(50.0) and r["stall_ratio_largest"] == pytest.approx(100.0)


def test_the_model_is_calibrated_on_the_samples_and_swept_to_5_tib():
    transfers = paper.calibration_transfers(SAMPLES)
    assert len(transfers) == len(SAMPLES) and {t["direction"] for t in transfers} == {"put"}
    model = paper.model_part(SAMPLES)
    assert model["calibrated_sweep"][-1]["bytes"] == 5 * paper.TIB
    assert [c["bytes"] for c in model["calibrated_at_measured"]] == [32 * KIB, 8 * MIB, 64 * MIB]
    r = paper.transfer_ratios(paper.summarize(SAMPLES), model)
    assert r["paper_model_speedup_max"] < paper.PAPER_MIN   # Tables II/III as we read them: about 1.1x
    assert r["calibrated_speedup_5TiB"] > 0 and r["calibrated_fit_max_abs_rel_error"] >= 0


# -- Fig. 2 --------------------------------------------------------------------------------------------

def step(n, start, end, nbytes=0):
    return {"step": n, "name": "", "start_ms": start, "end_ms": end, "bytes": nbytes}


FIRST = {"turn": 1, "kv_source": "none", "e2e_ms": 400.0, "ttft_ms": 100.0, "tokens_reused": 0,
         "bytes_restored": 0, "turn_start_unix_ns": 1_000_000_000_000,
         "steps": [step(1, -5000.0, -4990.0, 2 << 20), step(5, 1.0, 2.0), step(2, 10.0, 380.0, 4096),
                   step(3, 100.0, 390.0), step(4, 380.0, 385.0, 4096)]}
FOLLOW = {"turn": 2, "kv_source": "restored", "e2e_ms": 300.0, "ttft_ms": 80.0, "tokens_reused": 48,
          "bytes_restored": 4096, "turn_start_unix_ns": 1_000_000_000_000 + 1_000_000_000,  # 1 s later
          "steps": [step(5, 1.0, 2.0), step(6, 3.0, 10.0, 4096), step(7, 9.0, 30.0, 4096),
                    step(8, 30.0, 290.0), step(3, 80.0, 295.0), step(4, 290.0, 292.0)]}


def test_the_gantt_puts_both_turns_on_the_first_turns_clock():
    g = paper.gantt([FIRST, FOLLOW])
    assert g["steps_present"] == list(range(1, 9))
    assert [t["start_ms"] for t in g["turns"]] == [0.0, 1000.0]
    assert g["turns"][1]["end_ms"] == pytest.approx(1300.0) and g["span_ms"] == pytest.approx(1300.0)
    six = next(r for r in g["rows"] if r["step"] == 6)
    assert (six["turn"], six["start_ms"], six["end_ms"], six["bytes"]) == (2, 1003.0, 1010.0, 4096)
    assert six["name"] == "KV GET from storage"  # named from kvtb/steps.py when the record has no name
    one = g["rows"][0]
    assert one["step"] == 1 and one["before"]  # registration long before: clipped at the axis' left end
    assert g["left_ms"] == 0.0
    # by turn, then start: turn 2 reads 5, 6, 7, 8, 3, 4
    assert [r["step"] for r in g["rows"] if r["turn"] == 2] == [5, 6, 7, 8, 3, 4]
    # the follow-up's steps; the first turn's lookup (a miss) does not count
    f = paper.follow_up_figures(g)
    assert f == pytest.approx({"step5_ms": 1.0, "step6_ms": 7.0, "step7_ms": 21.0, "step8_ms": 260.0,
                               "inference_after_lookup_ms": 29.0})


def test_the_gantt_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    path = paper.plot_gantt(tmp_path / "fig2.png", paper.gantt([FIRST, FOLLOW]), "Fig. 2")
    assert path is not None and path.stat().st_size > 1000


def test_no_record_is_an_error():
    with pytest.raises(ValueError):
        paper.gantt([])


# -- claims and headline ------------------------------------------------------------------------------

def study(**extra):
    return {"study": "paper", "claims": [], "ratios": {}, "results": {}, "failed": [], **extra}


def test_every_figure_has_a_measured_claim():
    s = study()
    rows = paper.summarize(SAMPLES)
    model = paper.model_part(SAMPLES)
    s["ratios"] |= paper.transfer_ratios(rows, model)
    turn = {"records": [FIRST, FOLLOW], "gantt": paper.gantt([FIRST, FOLLOW])}
    paper.add_claims(s, rows, model, turn)
    figures = {c["figure"].split(" (")[0] for c in s["claims"]}
    assert {"Fig. 2", "Fig. 5", "Fig. 6", "Fig. 7", "Figs. 5-7"} <= figures
    assert all(c["measured"] and c["why"] for c in s["claims"])
    by = {c["figure"]: c for c in s["claims"]}
    assert by["Fig. 2"]["agrees"] is True and "restored" in by["Fig. 2"]["measured"]
    assert by["Fig. 5"]["agrees"] is False          # 2-2.5x is not 20x
    assert by["Fig. 5 (Sec. II-C)"]["agrees"] is True  # the compute process: 50-100x
    assert by["Fig. 7 (shape)"]["agrees"] is True    # 2.5x at 32 KiB against 2x at 8 MiB


def test_claims_with_only_sizes_beyond_fig5():
    s = study()
    rows = paper.summarize([sample(2 * GIB, "cpu", 0, 20.0, 20.0, 4.0),
                            sample(2 * GIB, "triggered", 0, 8.0, 0.1, 0.01)])
    s["ratios"] |= paper.transfer_ratios(rows, None)
    paper.add_claims(s, rows, None, None)
    fig5 = next(c for c in s["claims"] if c["figure"] == "Fig. 5")
    assert "2.5x" in fig5["measured"] and "2 GiB" in fig5["measured"]
    shape = next(c for c in s["claims"] if c["figure"] == "Fig. 7 (shape)")
    assert shape["agrees"] is None and "one size" in shape["measured"]


def test_claims_of_parts_that_failed_say_so():
    s = study(failed=[{"part": "transfers", "error": "RuntimeError: boom"}])
    paper.add_claims(s, [], None, None)
    assert len(s["claims"]) == 6 and all(c["agrees"] is None for c in s["claims"])
    assert any("boom" in c["measured"] for c in s["claims"])


def test_headline_rows():
    s = study()
    rows = paper.summarize(SAMPLES)
    s["results"]["transfers"] = {"rows": rows}
    s["ratios"] |= paper.transfer_ratios(rows, paper.model_part(SAMPLES))
    head = paper.headline_rows(s)
    assert len(head) == 3 and all(set(h) == {"question", "measured", "target"} for h in head)
    assert head[0]["measured"] == "2.00-2.50x" and "8 MiB" in head[0]["question"]
    assert head[1]["measured"] == "50-100x"
    assert all("19-23x" in h["target"] for h in head)
    failed = paper.headline_rows(study(failed=[{"part": "transfers", "error": "TimeoutError: slow"}]))
    assert failed and failed[0]["measured"] == "failed: TimeoutError: slow"
    # every size failed: the first size's error, not the summary's
    failed = paper.headline_rows(study(failed=[
        {"part": "transfer 32 KiB", "error": "OSError: disk"},
        {"part": "transfers", "error": "RuntimeError: no size was measured"}]))
    assert failed[0]["measured"] == "failed: OSError: disk"


# -- the whole study, smoke --------------------------------------------------------------------------------

@pytest.mark.slow
def test_smoke_run_keeps_the_json_contract(tmp_path):
    out = tmp_path / "out"
    done = subprocess.run(kvtb_argv("study", "paper", "--smoke", "--json", "--out", str(out)),
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    s = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"study", "machine", "settings", "results", "claims", "ratios", "plots", "failed"} <= set(s)
    assert s["study"] == "paper" and s["mode"] == "smoke" and s["failed"] == []
    assert s["settings"]["sizes_bytes"] == list(paper.SMOKE_SIZES)
    assert [r["bytes"] for r in s["results"]["transfers"]["rows"]] == list(paper.SMOKE_SIZES)
    assert s["claims"] and all(c["measured"] for c in s["claims"])
    assert {c["figure"].split(" (")[0] for c in s["claims"]} >= {"Fig. 2", "Fig. 5", "Fig. 6", "Fig. 7"}
    for key in ("speedup_min", "speedup_max", "stall_ratio_min", "calibrated_speedup_5TiB"):
        assert isinstance(s["ratios"][key], float)
    turn = s["results"]["turn"]
    assert turn["records"][-1]["kv_source"] == "restored"
    assert s["plots"] and all(Path(p).exists() for p in s["plots"])
    assert (out / "README.md").exists() and (out / "results.json").exists()
    assert paper.headline_rows(s)
