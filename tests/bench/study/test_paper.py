"""`kvtb study paper`: sizes and layouts, the transfer figures (speedup, stall ratio, CPU per GB, the
pipelined path), the Fig. 2 Gantt data from a hand-made record, the claims table judged on hand-made
samples (each claim can agree and disagree), the seed's words, headline rows; and a --smoke run's JSON
contract (slow: real services, the tiny model)."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench.study import paper, paper_claims, paper_figures, paper_turn
from bench.study.claims import VERDICTS, evaluate
from bench.study.paper import GIB, KIB, MIB
from kvtb.launch import kvtb_argv

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


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
    sample(32 * KIB, "cpu", -1, 9.0, 9.0, 9.0),   # a warm-up: in no figure
    sample(8 * MIB, "cpu", 0, 0.100, 0.100, 0.02),
    sample(8 * MIB, "triggered", 0, 0.050, 0.001, 0.0005, 0.03),
    sample(8 * MIB, "cpu-pipelined", 0, 0.040, 0.030, 0.02),
    sample(64 * MIB, "cpu", 0, 0.9, 0.9, 0.2),    # no triggered sample at 64 MiB: not a row
]


def test_speedup_and_stall_ratio_are_cpu_over_triggered_medians():
    rows = paper_figures.summarize(SAMPLES)
    assert [r["bytes"] for r in rows] == [32 * KIB, 8 * MIB]
    small, big = rows
    assert small["cpu_e2e_s"] == pytest.approx(0.005) and small["triggered_e2e_s"] == pytest.approx(0.002)
    assert small["speedup"] == pytest.approx(2.5)
    assert small["stall_ratio"] == pytest.approx(0.005 / 0.0001)
    assert small["busy_ratio"] == pytest.approx(20.0)
    assert small["paired_speedups"] == pytest.approx([2.0, 3.0, 5.0])
    assert small["triggered_blocked_share"] == pytest.approx(0.05)
    assert "pipelined_speedup" not in small          # no pipelined sample at 32 KiB
    assert big["speedup"] == pytest.approx(2.0) and big["stall_ratio"] == pytest.approx(100.0)
    assert big["pipelined_speedup"] == pytest.approx(0.8) and big["pipelining_gain"] == pytest.approx(2.5)
    # CPU per GB: the compute process's, and the host's with the agent
    assert big["cpu_compute_cpu_s_per_gb"] == pytest.approx(0.02 / (8 * MIB / 1e9))
    assert big["triggered_host_cpu_s_per_gb"] == pytest.approx(0.0305 / (8 * MIB / 1e9))
    r = paper_figures.transfer_ratios(rows, None)
    assert (r["speedup_min"], r["speedup_max"]) == (pytest.approx(2.0), pytest.approx(2.5))
    assert r["speedup_smallest"] == pytest.approx(2.5) and r["speedup_largest"] == pytest.approx(2.0)
    assert r["stall_ratio_min"] == pytest.approx(50.0) and r["stall_ratio_largest"] == pytest.approx(100.0)
    assert r["pipelined_over_triggered_largest"] == pytest.approx(0.8)
    assert r["compute_cpu_triggered_vs_cpu_largest"] == pytest.approx(0.025)
    assert r["host_cpu_triggered_vs_cpu_largest"] == pytest.approx(0.0305 / 0.02)


def test_the_model_is_calibrated_on_the_two_paths_samples_and_swept_to_5_tib():
    transfers = paper_figures.calibration_transfers(SAMPLES)
    assert {t["mode"] for t in transfers} == {"cpu", "triggered"}  # the model has two paths; no warm-up
    assert len(transfers) == len(SAMPLES) - 2 and {t["direction"] for t in transfers} == {"put"}
    model = paper_figures.model_part(SAMPLES)
    assert model["calibrated_sweep"][-1]["bytes"] == 5 * paper.TIB
    assert [c["bytes"] for c in model["calibrated_at_measured"]] == [32 * KIB, 8 * MIB, 64 * MIB]
    r = paper_figures.transfer_ratios(paper_figures.summarize(SAMPLES), model)
    assert r["paper_model_speedup_max"] < 19   # Tables II/III as we read them: about 1.1x
    assert r["calibrated_speedup_5TiB"] > 0 and r["calibrated_fit_max_abs_rel_error"] >= 0


def test_the_paths_take_every_position_in_turn():
    modes = list(paper_figures.MODES)
    orders = [paper.rotation(modes, k) for k in range(3)]
    assert [o[0] for o in orders] == modes and all(sorted(o) == sorted(modes) for o in orders)
    assert paper.rotation(["cpu", "triggered"], 1) == ["triggered", "cpu"]


def test_the_pipelined_path_keeps_the_agents_queue_depth_in_flight():
    from smartnic.settings import SmartNicSettings
    assert paper.triggered_in_flight() == SmartNicSettings(storage_nodes="n=127.0.0.1:1/127.0.0.1:2").queue_depth


class _Offload:
    def __init__(self, pool, store, in_flight=1):
        self.in_flight = in_flight

    def drain(self):
        pass


class _Old:
    def __init__(self, pool, store):
        pass


def test_the_pipelined_path_is_left_out_where_cpu_offload_takes_no_in_flight():
    assert paper._pipelined(_Offload, None, None, 128).in_flight == 128
    assert paper._pipelined(_Old, None, None, 128) is None    # compute_node.cpu_offload not built yet
    assert paper._pipelined(_Offload, None, None, 0) is None  # not asked for (the profiled study)


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
    g = paper_turn.gantt([FIRST, FOLLOW])
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
    f = paper_turn.follow_up_figures(g)
    assert f == pytest.approx({"step5_ms": 1.0, "step6_ms": 7.0, "step7_ms": 21.0, "step8_ms": 260.0,
                               "inference_after_lookup_ms": 29.0})


def test_the_gantt_is_drawn(tmp_path):
    pytest.importorskip("matplotlib")
    path = paper_turn.plot_gantt(tmp_path / "fig2.png", paper_turn.gantt([FIRST, FOLLOW]), "Fig. 2")
    assert path is not None and path.stat().st_size > 1000


def test_no_record_is_an_error():
    with pytest.raises(ValueError):
        paper_turn.gantt([])


# -- the claims table, judged on hand-made samples -------------------------------------------------------

SEED_PATH = Path(__file__).resolve().parents[3].parent / "shared" / "papers" / paper.SEED  # ../shared/papers


def test_every_seed_claim_quotes_the_paper_exactly():
    if not SEED_PATH.exists():
        pytest.skip("the seed's text is not beside the repository")
    text = " ".join(SEED_PATH.read_text().split())
    for c in paper_claims.CLAIMS:
        if c.source == "seed":
            assert " ".join(c.words.split()) in text, c.key
    assert {c.key for c in paper_claims.CLAIMS if c.source == "hypothesis"} == {"pipelining_alone"}


def transfers(speedup_small, speedup_large, busy_share, pipelined_over_triggered, jitter=(1.0, 1.04, 0.97),
              sizes=(32 * KIB, 8 * MIB, 64 * MIB), pipe_noise=(1.0, 1.0, 1.0)):
    """Three repetitions at each size: CPU-centric 1 s, triggered 1 / speedup (interpolated from the smallest
    size to the largest), the pipelined path pipelined_over_triggered x triggered; the triggered compute
    process's CPU busy_share x CPU-centric's; pipe_noise: the pipelined path's time per repetition, x."""
    samples = []
    for rep, j in enumerate(jitter):
        for i, size in enumerate(sizes):
            x = speedup_small + (speedup_large - speedup_small) * i / (len(sizes) - 1)
            t = j / x
            samples += [sample(size, "cpu", rep, j, j, 0.5, 0.01),
                        sample(size, "triggered", rep, t, t / 50, 0.5 * busy_share, 0.3),
                        sample(size, "cpu-pipelined", rep, t * pipelined_over_triggered * pipe_noise[rep], t, 0.5,
                               0.01)]
    return {"transfers": {"rows": paper_figures.summarize(samples), "samples": samples,
                          "modes": list(paper_figures.MODES), "in_flight": 128}}


def verdicts(results, profile=""):
    return {c["key"]: c["verdict"] for c in evaluate(paper_claims.CLAIMS, results, profile)}


def test_the_paper_hardware_claims_agree_or_disagree_under_its_profile_and_are_out_of_scope_without():
    like_paper = transfers(23.0, 21.0, 0.01, 1.5)
    got = verdicts(like_paper, "paper")
    assert all(got[k] == "agrees" for k in ("fig5_speedup", "fig6_speedup", "fig7_small", "fig7_large",
                                           "fig7_shape", "sec2c_compute_cpu", "offload_not_pipelining"))
    got = verdicts(transfers(2.0, 3.0, 0.8, 0.7), "paper")
    assert all(got[k] == "disagrees" for k in ("fig5_speedup", "fig6_speedup", "fig7_small", "fig7_large",
                                              "fig7_shape", "sec2c_compute_cpu", "offload_not_pipelining"))
    records = {c["key"]: c for c in evaluate(paper_claims.CLAIMS, like_paper, "")}
    for key in ("fig5_speedup", "fig6_speedup", "fig7_small", "fig7_large"):
        assert records[key]["verdict"] == "out of scope" and len(records[key]["values"]) == 3
        assert "x" in records[key]["measured"]  # still measured and shown
    assert records["fig7_shape"]["verdict"] == "agrees"  # the design's claims hold on any hardware


def test_noisy_repetitions_are_inconclusive_and_too_few_are_too():
    noisy = transfers(2.0, 2.0, 0.09, 1.05, pipe_noise=(0.7, 1.0, 1.5))  # 0.74x, 1.05x, 1.58x
    assert verdicts(noisy)["offload_not_pipelining"] == "inconclusive"
    one = transfers(23.0, 21.0, 0.01, 1.5, jitter=(1.0,))
    assert set(verdicts(one, "paper").values()) >= {"inconclusive"}
    assert verdicts(one, "paper")["fig5_speedup"] == "inconclusive"


def test_the_pipelining_hypothesis_agrees_and_disagrees():
    faster = transfers(3.0, 3.0, 0.5, 0.5)    # pipelined: half the triggered time, so 6x CPU-centric's speed
    assert verdicts(faster)["pipelining_alone"] == "agrees"
    slower = transfers(0.5, 0.5, 0.5, 4.0)    # pipelined: 2 s against CPU-centric's 1 s
    assert verdicts(slower)["pipelining_alone"] == "disagrees"


def test_sec2c_is_judged_on_cpu_time_not_on_time_blocked():
    results = transfers(2.0, 2.0, 0.5, 1.0)    # blocked 50x less, but half the CPU time: not freed
    records = {c["key"]: c for c in evaluate(paper_claims.CLAIMS, results, "")}
    assert records["sec2c_compute_cpu"]["verdict"] == "disagrees"
    assert "host's" in records["sec2c_compute_cpu"]["measured"]  # the host's total with the emulated NIC


def test_without_the_pipelined_path_its_claims_are_not_measured_and_say_why():
    results = transfers(2.0, 2.0, 0.01, 1.0)
    results["transfers"]["modes"] = ["cpu", "triggered"]
    records = {c["key"]: c for c in evaluate(paper_claims.CLAIMS, results, "")}
    for key in ("offload_not_pipelining", "pipelining_alone"):
        assert records[key]["verdict"] == "not measured" and "in_flight" in records[key]["measured"]


def test_the_model_and_fig2_are_judged_once():
    model = {"paper_sweep": [{"speedup": 1.1}, {"speedup": 1.0}], "calibrated_sweep": [],
             "fit_max_abs_rel_error": None}
    turn = {"records": [FIRST, FOLLOW], "gantt": paper_turn.gantt([FIRST, FOLLOW])}
    got = verdicts({"model": model, "turn": turn})
    assert got["model_19x"] == "disagrees" and got["fig2_steps"] == "agrees"
    model["paper_sweep"] = [{"speedup": 23.0}, {"speedup": 19.5}]
    missing = dict(FOLLOW, kv_source="recomputed")
    got = verdicts({"model": model, "turn": {"records": [FIRST, missing], "gantt": paper_turn.gantt([FIRST, missing])}})
    assert got["model_19x"] == "agrees" and got["fig2_steps"] == "disagrees"
    assert verdicts({})["fig5_speedup"] == "not measured"


def test_one_size_has_no_shape_nor_larger_sizes():
    results = transfers(3.0, 3.0, 0.5, 1.0, sizes=(2 * GIB, 4 * GIB))
    results["transfers"]["rows"] = results["transfers"]["rows"][:1]
    records = {c["key"]: c for c in evaluate(paper_claims.CLAIMS, results, "paper")}
    assert records["fig7_shape"]["verdict"] == "not measured" and "one size" in records["fig7_shape"]["measured"]
    assert records["fig7_large"]["verdict"] == "not measured"
    assert "2 GiB" in records["fig5_speedup"]["measured"]  # no size of Fig. 5's: the sizes measured


def test_the_study_judges_its_table_and_the_causes_table():
    keys = [c.key for c in paper.CLAIMS]
    assert len(keys) == len(set(keys)) and set(paper_claims.CLAIMS_BY_KEY) <= set(keys)
    assert paper.SEED == "triggered-ops-kv-cache-paper.txt"


def study(**extra):
    return {"study": "paper", "claims": [], "ratios": {}, "results": {}, "failed": [], **extra}


def test_headline_rows():
    s = study()
    rows = paper_figures.summarize(SAMPLES)
    s["results"]["transfers"] = {"rows": rows}
    s["ratios"] |= paper_figures.transfer_ratios(rows, paper_figures.model_part(SAMPLES))
    head = paper.headline_rows(s)
    assert len(head) == 4 and all(set(h) == {"question", "measured", "target", "claim"} for h in head)
    assert {h["claim"] for h in head} <= {c.key for c in paper.CLAIMS}   # each names a claim of the table
    assert head[0]["measured"] == "2.00-2.50x" and "8 MiB" in head[0]["question"]
    assert head[1]["measured"] == "0.80x" and "in flight" in head[1]["question"]
    assert head[2]["measured"].startswith("0.025 ") and "Sec. II-C" in head[2]["target"]   # two significant digits
    assert "19-23x" in head[0]["target"] and "19-23x" in head[3]["target"]
    failed = paper.headline_rows(study(failed=[{"part": "transfers", "error": "TimeoutError: slow"}]))
    assert failed and failed[0]["measured"] == "failed: TimeoutError: slow"
    # every size failed: the first size's error, not the summary's
    failed = paper.headline_rows(study(failed=[
        {"part": "transfer 32 KiB", "error": "OSError: disk"},
        {"part": "transfers", "error": "RuntimeError: no size was measured"}]))
    assert failed[0]["measured"] == "failed: OSError: disk"


def test_the_plots_put_one_quantity_on_each_axis(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.study import paper_plots
    rows = paper_figures.summarize(SAMPLES)
    paths = paper_plots.transfer_plots(tmp_path, rows, paper_figures.model_part(SAMPLES))
    assert [p.name for p in paths] == ["fig5_transfer_time.png", "fig6_large.png", "fig7_speedup.png"]
    assert all(p.stat().st_size > 1000 for p in paths)


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
    assert s["claims"] and all(c["measured"] and c["verdict"] in VERDICTS for c in s["claims"])
    assert {c["key"] for c in s["claims"]} >= set(paper_claims.CLAIMS_BY_KEY)
    by = {c["key"]: c for c in s["claims"]}
    assert by["fig5_speedup"]["verdict"] == "out of scope" and by["fig5_speedup"]["values"]
    assert by["fig2_steps"]["verdict"] == "agrees"
    samples = s["results"]["transfers"]["samples"]
    assert {x["mode"] for x in samples} >= {"cpu", "triggered"} and all("rep" in x for x in samples)
    for key in ("speedup_min", "speedup_max", "stall_ratio_min", "calibrated_speedup_5TiB"):
        assert isinstance(s["ratios"][key], float)
    turn = s["results"]["turn"]
    assert turn["records"][-1]["kv_source"] == "restored"
    assert s["plots"] and all(Path(p).exists() for p in s["plots"])
    assert (out / "README.md").exists() and (out / "results.json").exists()
    assert paper.headline_rows(s)
