"""The poster's claims table fed hand-made results: each claim can come out agrees and disagrees, the
swap-against-recompute claims only under the poster's platform profile, one repeat is inconclusive, and
every quote is the poster's (pure)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.study import poster, poster_claims, poster_fig6, poster_points
from bench.study.claims import evaluate

PAPERS = Path("/work/shared/papers")
NOT_MEASURABLE = {"fig2_pinned"}  # no pinned memory anywhere here


def _series(per_second):
    """A throughput series in 0.25 s bins from one rate per second."""
    return [((4 * k + j) * 0.25, v) for k, v in enumerate(per_second) for j in range(4)]


def _rep(engine, evicted, samples=(), tput=(), ample=()):
    rep = {k: 0.0 for k in poster_points.MEANS}
    rep.update(engine_total_s=engine, evicted_tokens=evicted, extra_e2e_s=engine * 2, makespan_s=10 + engine,
               ample_makespan_s=10.0, preemption_count=4, counters={}, samples=list(samples),
               throughput=_series(tput), ample_throughput=_series(ample))
    return rep


def _row(strategy, engine, evicted=100, n=3, **fig6):
    reps = [_rep(engine + 0.01 * i, evicted + i, **fig6) for i in range(n)]
    return poster_points.point_row(reps, {"strategy": strategy, "actual_share": 0.12, "workload": "16x48+24"})


def _samples(per_preemption, per_admission, n=24, stop_at=None):
    """A batch's samples every 0.25 s: a preemption, then an admission, then a quiet interval, over and over
    (until stop_at samples; then nothing moves); usage moves by the given amounts per event."""
    out, u, w, p = [], 0.6, 12, 0
    for k in range(n):
        if stop_at is None or k < stop_at:
            if k % 3 == 1:
                p, w, u = p + 1, w + 1, u + per_preemption
            elif k % 3 == 2:
                w, u = w - 1, u + per_admission
        out.append((0.25 * k, u, 3, w, p))
    return out


# Fig. 6 patterns: usage falls at preemptions and rises at admissions; throughput rises with them, periodically
AGREE_SAMPLES = _samples(-0.3, 0.3)
DISAGREE_SAMPLES = _samples(0.3, -0.3, stop_at=8)
AGREE_6 = dict(samples=AGREE_SAMPLES, tput=[10, 30, 10, 30, 10, 30], ample=[10, 40, 40, 40, 40, 40])
DISAGREE_6 = dict(samples=DISAGREE_SAMPLES, tput=[10, 10, 10, 10, 30, 30], ample=[10, 40, 10, 40, 40, 40])


def results(agree: bool, n: int = 3) -> dict:
    """Figs 2-6 where every measurable claim holds (agree) or fails (not agree)."""
    six = AGREE_6 if agree else DISAGREE_6
    if agree:
        f2 = {"16": (2.0, 1.0), "64": (2.1, 0.5)}                 # recompute flat, swap falls
        f5 = {"0.12": (4.0, 2.0, 900), "0.3": (1.0, 0.5, 300), "0.7": (2.0, 1.0, 100)}  # falls; lowest at 30%
        f4 = {"36": (1.0, 0.5), "72": (3.0, 1.5)}                 # rises; swap below recompute when long
    else:
        f2 = {"16": (1.0, 0.5), "64": (3.0, 1.0)}                 # recompute moves, swap rises
        f5 = {"0.12": (1.0, 3.0, 900), "0.3": (4.0, 6.0, 300), "0.7": (2.0, 4.0, 100)}  # rises; lowest at 12%
        f4 = {"36": (3.0, 4.0), "72": (1.0, 2.0)}                 # falls; swap above recompute
    res = {"fig2": {x: {"recompute": _row("recompute", r, n=n), "swap-host": _row("swap-host", h, n=n)}
                    for x, (r, h) in f2.items()},
           "fig4": {x: {"recompute": _row("recompute", r, n=n), "swap-host": _row("swap-host", h, n=n)}
                    for x, (r, h) in f4.items()},
           "fig5": {x: {s: _row(s, v, ev, n=n, **(six if x == "0.12" else {}))
                        for s, v in (("recompute", r), ("swap-host", h))}
                    for x, (r, h, ev) in f5.items()}}
    res["fig6"] = poster.fig6(res)
    return res


def verdicts(res: dict, profile: str = "polaris-a100") -> dict[str, str]:
    return {r["key"]: r["verdict"] for r in evaluate(poster_claims.CLAIMS, res, profile)}


def test_every_measurable_claim_agrees_on_results_that_follow_the_poster():
    got = verdicts(results(agree=True))
    assert {k: v for k, v in got.items() if k not in NOT_MEASURABLE} == {
        k: "agrees" for k in got if k not in NOT_MEASURABLE}
    assert got["fig2_pinned"] == "not measured"


def test_every_measurable_claim_disagrees_on_results_that_contradict_it():
    got = verdicts(results(agree=False))
    assert {k: v for k, v in got.items() if k not in NOT_MEASURABLE} == {
        k: "disagrees" for k in got if k not in NOT_MEASURABLE}


def test_swap_against_recompute_is_out_of_scope_without_the_posters_platform_but_still_measured():
    records = {r["key"]: r for r in evaluate(poster_claims.CLAIMS, results(agree=True), "")}
    for key in ("fig3_swap_lower", "fig4_swap_better_long", "fig2_swap_falls"):
        assert records[key]["verdict"] == "out of scope" and records[key]["values"]
        assert "polaris-a100" in records[key]["why"]
    assert records["fig3_tokens_recompute"]["verdict"] == "agrees"  # not a hardware claim


def test_one_repeat_is_inconclusive_however_clear():
    got = verdicts(results(agree=True, n=1))
    assert {v for k, v in got.items() if k not in NOT_MEASURABLE} == {"inconclusive"}


def test_the_lowest_share_is_not_measured_without_shares_on_both_sides_of_30_to_50_percent():
    res = results(agree=True)
    del res["fig5"]["0.7"]
    assert verdicts(res)["fig5_lowest"] == "not measured"


def test_fig6_is_read_at_the_posters_12_percent_and_says_so_when_it_is_not():
    res = results(agree=True)
    assert poster.fig6_key(res["fig5"]) == "0.12"
    for row in res["fig6"].values():
        row["share"] = 0.5
    record = next(r for r in evaluate(poster_claims.CLAIMS, res, "") if r["key"] == "fig6_recompute_drop")
    assert "not the seed's 12%" in record["why"]


def test_every_quote_is_the_posters_own_words():
    text = re.sub(r"\s+", " ", (PAPERS / poster.SEED).read_text())
    for c in poster.CLAIMS:
        if c.source == "seed":
            assert re.sub(r"\s+", " ", c.words) in text, c.key
    assert "12%" in text and poster_claims.FIG6_SHARE == 0.12


# -- Fig. 6's pattern, one batch ------------------------------------------------------------------------------

def test_usage_per_preemption_and_per_admission_are_fitted_apart():
    got = poster_fig6.usage_per_event(AGREE_SAMPLES)
    assert got["per_preemption"] == pytest.approx(-0.3) and got["per_admission"] == pytest.approx(0.3)
    # a preemption and an admission in the same interval: the fit still tells them apart
    both = [(0.0, 0.5, 2, 5, 0), (0.25, 0.3, 2, 6, 1), (0.5, 0.2, 2, 6, 2), (0.75, 0.3, 2, 5, 2), (1.0, 0.3, 2, 5, 2),
            (1.25, 0.1, 2, 6, 3)]  # the second interval: one preemption and one admission
    fit = poster_fig6.usage_per_event(both)
    assert fit["per_preemption"] == pytest.approx(-0.2) and fit["per_admission"] == pytest.approx(0.1)
    # before the first preemption nothing counts; too few intervals or no spread: None
    assert poster_fig6.usage_per_event([(0, 0.5, 1, 1, 0), (0.25, 0.9, 2, 0, 0)]) is None
    assert poster_fig6.usage_per_event([(0.25 * k, 0.5, 1, 1, 1) for k in range(8)]) is None


def test_throughput_rises_are_counted_beyond_the_ample_batchs():
    tight, ample = [(0, 10.0), (1, 30.0), (2, 10.0), (3, 30.0)], [(0, 10.0), (1, 40.0), (2, 40.0)]
    assert poster_fig6.rises(tight) == [1, 3]
    assert poster_fig6.extra_rises(tight, ample) == 1
    assert poster_fig6.rises([(0, 0.0), (1, 0.0)]) == []
    with pytest.raises(ValueError):
        poster_fig6.rises(tight, rise_frac=0)


def test_a_rise_is_credited_to_admissions_only_when_waiting_fell_beside_it():
    series = [(0, 10.0), (1, 30.0), (2, 10.0), (3, 30.0)]
    falls_early = [(0.0, 0.5, 1, 3, 0), (0.5, 0.5, 2, 2, 0), (2.5, 0.5, 2, 2, 0), (3.5, 0.5, 2, 2, 0)]  # admits at 0.5
    assert poster_fig6.rises_with_admissions(series, falls_early, 1.0) == pytest.approx(0.5)
    assert poster_fig6.rises_with_admissions([(0, 1.0), (1, 1.0)], falls_early, 1.0) is None


# -- the points and the headline -------------------------------------------------------------------------------

def test_a_point_is_the_mean_of_its_repeats_and_keeps_them():
    batch = {"makespan_s": 12.0, "cpu_s": 6.0, "preempted_tokens": {"recompute": 50}, "preemptions": {"recompute": 2},
             "counters": {"preempt_recompute_tokens": 50, "prefix_cache_hits": 0}, "engine_total_s": 1.0,
             "engine_recompute_s": 1.0, "engine_swap_s": 0.0, "engine_blocking_s": 1.0, "tokens_per_s": 5.0}
    ample = {"makespan_s": 10.0, "cpu_s": 5.0, "preemptions": {}, "throughput": []}
    reps = [poster_points.repeat_row(batch, ample), poster_points.repeat_row({**batch, "makespan_s": 14.0}, ample)]
    assert reps[0]["extra_e2e_s"] == 2.0 and reps[0]["recomputed_tokens"] == 50 and reps[0]["reused_tokens"] == 0
    row = poster_points.point_row(reps, {"strategy": "recompute"})
    assert row["extra_e2e_s"] == pytest.approx(3.0) and row["n_repeats"] == 2 and len(row["repeats"]) == 2
    with pytest.raises(ValueError):
        poster_points.point_row([], {})


def test_headline_rows_name_the_end_to_end_contradiction():
    res = results(agree=True)
    host = res["fig5"]["0.12"]["swap-host"]
    host["extra_e2e_s"] = res["fig5"]["0.12"]["recompute"]["extra_e2e_s"] + 5.0  # end to end, swap is worse
    rows = poster.headline_rows({"results": res, "failed": []})
    assert all(set(r) - {"claim"} == {"question", "measured", "target"} for r in rows)
    assert {r["claim"] for r in rows if "claim" in r} <= {c.key for c in poster.CLAIMS}
    last = rows[-1]
    assert "End to end against engine only" in last["question"] and "disagree in sign" in last["question"]
    assert "end to end +5.00 s" in last["measured"] and "engine only -2.00 s" in last["measured"]
    failed = poster.headline_rows({"results": {}, "failed": [{"part": "fig5", "error": "boom"}]})
    assert "failed: boom" in failed[0]["measured"]


def test_the_ratios_come_from_the_smallest_share():
    study = {"results": results(agree=True), "ratios": {}}
    poster.add_ratios(study)
    assert study["ratios"]["recompute_vs_swap_host_engine_s_at_0.12"] == pytest.approx(4.01 / 2.01, rel=1e-3)


def test_a_sweep_of_one_point_is_not_measured_and_says_what_it_measured():
    res = results(agree=True)
    del res["fig2"]["64"]
    record = next(r for r in evaluate(poster_claims.CLAIMS, res, "") if r["key"] == "fig2_recompute_flat")
    assert record["verdict"] == "not measured" and "a trend needs two or more block sizes" in record["measured"]
