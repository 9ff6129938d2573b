from __future__ import annotations

import pytest

from bench import calibration as cal

SIZES = [64 << 10, 1 << 20, 16 << 20, 64 << 20]


def _results(noise=1.0):
    transfers = []
    for size in SIZES:
        cpu_s, triggered_s = (1e-4 + 1e-9 * size) * noise, 5e-5 + 2e-10 * size
        transfers.append({"mode": "cpu", "direction": "put", "bytes": size, "seconds": cpu_s})
        transfers.append({"mode": "triggered", "direction": "put", "bytes": size, "seconds": triggered_s})
        transfers.append({"mode": "resident", "direction": "put", "bytes": size, "seconds": 1e-6})
    return {"bench": "datapath", "results": {"transfers": transfers}, "ratios": {}}


def test_find_transfers_nested_and_skips_other_modes():
    transfers = cal.parse_transfers(_results())
    assert len(transfers) == 8 and {t.mode for t in transfers} == {"cpu", "triggered"}


def test_bad_entries_are_rejected():
    with pytest.raises(ValueError):
        cal.parse_transfers({"transfers": [{"mode": "cpu", "bytes": 1}]})
    with pytest.raises(ValueError):
        cal.parse_transfers({"transfers": [{"mode": "cpu", "direction": "put", "bytes": 0, "seconds": 1}]})
    with pytest.raises(ValueError):
        cal.parse_transfers({"nothing": []})


def test_fit_recovers_exact_linear_costs():
    fits = cal.fit_paths(cal.parse_transfers(_results()))
    cpu = fits[("cpu", "put")]
    assert cpu.fixed_s == pytest.approx(1e-4, rel=1e-6)
    assert cpu.per_byte_s == pytest.approx(1e-9, rel=1e-6)
    assert cpu.bytes_per_s == pytest.approx(1e9, rel=1e-6)
    assert fits[("triggered", "put")].per_byte_s == pytest.approx(2e-10, rel=1e-6)


def test_fit_single_size_goes_through_origin():
    fit = cal.fit_linear([1000, 1000], [2.0, 4.0])
    # weights 1/2 and 1/4: per_byte = sum(w^2 x y) / sum(w^2 x^2) = (500 + 250) / (250000 + 62500)
    assert fit.fixed_s == 0.0 and fit.per_byte_s == pytest.approx(750 / 312500)


def test_fit_never_negative():
    fit = cal.fit_linear([1, 2, 3], [1.0, 3.0, 5.0])  # exact line has intercept -1
    assert fit.fixed_s == 0.0 and fit.per_byte_s > 0


def test_compare_and_speedup():
    out = cal.calibrate(_results(), [1 << 30])
    rows = out["comparison"]
    assert len(rows) == 8 and all(abs(r["rel_error"]) < 1e-6 for r in rows)
    assert rows[0]["paper_model_s"] is not None
    (row,) = out["fitted_speedup"]
    # 1 GiB = two 512 MiB chunks: cpu 2 * (1e-4 + 1e-9 * 2**29), triggered 2 * (5e-5 + 2e-10 * 2**29)
    assert row["speedup"] == pytest.approx((1e-4 + 1e-9 * 2**29) / (5e-5 + 2e-10 * 2**29))


def test_measured_speedup_pairs_sizes():
    out = cal.calibrate(_results(), [1 << 20])
    first = out["measured_speedup"][0]
    assert first["bytes"] == 64 << 10
    assert first["speedup"] == pytest.approx((1e-4 + 1e-9 * 65536) / (5e-5 + 2e-10 * 65536))
