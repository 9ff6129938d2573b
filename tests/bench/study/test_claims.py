"""The verdict function: each verdict can come out, and only a band clear of the bound is judged."""
import math

import pytest

from bench.study import claims as cl
from bench.study.claims import Claim, Evidence, Test, evaluate, noise_band, verdict

ABOVE_19 = Test("above", 19.0, tolerance=1.0, unit="x")


def test_agrees_when_the_whole_band_is_past_the_bound():
    v, band, reason = verdict([21.0, 22.0, 21.5], ABOVE_19)
    assert v == "agrees" and band.n == 3 and band.low > 18.0 and "within" in reason


def test_disagrees_when_the_whole_band_is_short_of_the_bound():
    v, band, _ = verdict([2.1, 2.3, 2.2], ABOVE_19)
    assert v == "disagrees" and band.high < 18.0


def test_noisy_data_straddling_the_bound_is_inconclusive():
    v, band, reason = verdict([10.0, 30.0, 20.0], ABOVE_19)
    assert v == "inconclusive" and band.low < 18.0 < band.high and "straddles" in reason


def test_fewer_than_three_repeats_is_inconclusive_however_clear():
    assert verdict([100.0, 101.0], ABOVE_19)[0] == "inconclusive"
    assert verdict([100.0, 101.0, 100.5], ABOVE_19, repeats=5)[0] == "inconclusive"
    assert verdict([], ABOVE_19)[0] == "inconclusive"


def test_the_tolerance_counts_in_the_seeds_favour_and_no_further():
    assert verdict([18.5, 18.6, 18.55], ABOVE_19)[0] == "agrees"          # within 1 of 19
    assert verdict([17.5, 17.6, 17.55], ABOVE_19)[0] == "disagrees"       # past the tolerance
    assert verdict([18.5, 18.6, 18.55], Test("above", 19.0))[0] == "disagrees"


def test_below_and_between():
    falls = Test("below", 0.0)
    assert verdict([-0.01, -0.012, -0.011], falls)[0] == "agrees"
    assert verdict([0.01, 0.012, 0.011], falls)[0] == "disagrees"
    assert verdict([-0.01, 0.012, 0.0], falls)[0] == "inconclusive"
    band = Test("between", (19.0, 23.0))
    assert verdict([20.8, 21.0, 21.2], band)[0] == "agrees"
    assert verdict([30.0, 31.0, 29.0], band)[0] == "disagrees"
    assert verdict([1.0, 1.1, 0.9], band)[0] == "disagrees"
    assert verdict([22.0, 24.0, 23.0], band)[0] == "inconclusive"   # reaches past 23


def test_zero_timeouts_in_every_repeat_agree_and_any_systematic_share_disagrees():
    none_time_out = Test("below", 0.0, tolerance=0.01)
    assert verdict([0.0, 0.0, 0.0], none_time_out)[0] == "agrees"
    assert verdict([0.9, 0.95, 1.0], none_time_out)[0] == "disagrees"


def test_a_computed_quantity_needs_one_value_and_has_no_band():
    v, band, _ = verdict([11.4], Test("above", 10.0), noise="none")
    assert v == "agrees" and band.band == 0.0
    assert verdict([9.0], Test("above", 10.0), noise="none")[0] == "disagrees"


def test_noise_band_is_students_t_half_width():
    b = noise_band([1.0, 2.0, 3.0])
    assert b.mean == 2.0 and b.band == pytest.approx(4.303 * 1.0 / math.sqrt(3), rel=1e-3)
    assert noise_band([5.0]).band == math.inf
    assert noise_band([float("nan"), 1.0, 1.0, 1.0]).n == 3


def test_bad_tests_and_claims_are_refused():
    with pytest.raises(ValueError):
        Test("roughly", 1.0)
    with pytest.raises(ValueError):
        Test("between", (3.0, 1.0))
    with pytest.raises(ValueError):
        Test("above", 1.0, tolerance=-1)
    with pytest.raises(ValueError):
        Claim("k", "Fig. 1", "words", "m", ABOVE_19, lambda r: None, repeats=1)


def _claim(key, values, **kw):
    return Claim(key, "Fig. 5", "more than 20x faster", "speedup per repeat", ABOVE_19,
                 lambda r: Evidence(values, f"{values}") if values is not None else None, **kw)


def test_evaluate_gives_every_claim_a_verdict_and_its_band():
    table = [_claim("a", [21.0, 22.0, 21.5]), _claim("b", [2.0, 2.1, 2.2]), _claim("c", [1.0]),
             _claim("d", None), _claim("e", [25.0, 25.0, 25.0], profiles=("paper",)),
             _claim("f", [25.0, 25.0, 25.0], source="hypothesis")]
    records = {r["key"]: r for r in evaluate(table, {}, profile="")}
    assert [records[k]["verdict"] for k in "abcdef"] == [
        "agrees", "disagrees", "inconclusive", "not measured", "out of scope", "agrees"]
    assert records["a"]["band"]["n"] == 3 and records["a"]["values"] == [21.0, 22.0, 21.5]
    assert "paper" in records["e"]["why"] and records["f"]["source"] == "hypothesis"
    assert evaluate([table[4]], {}, profile="paper")[0]["verdict"] == "agrees"


def test_evidence_that_raises_is_not_measured_and_says_why():
    bad = Claim("x", "Fig. 1", "w", "m", ABOVE_19, lambda r: r["missing"])
    r = evaluate([bad], {})[0]
    assert r["verdict"] == "not measured" and "KeyError" in r["why"]


def test_duplicate_keys_are_refused():
    with pytest.raises(ValueError):
        evaluate([_claim("a", [1.0]), _claim("a", [2.0])], {})


def test_slope_and_spread():
    assert cl.slope([16, 32, 64], [0.03, 0.025, 0.02]) < 0
    assert cl.spread([1.0, 1.1, 0.9]) == pytest.approx(0.2)
    with pytest.raises(ValueError):
        cl.slope([1], [1])
