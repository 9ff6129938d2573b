from __future__ import annotations

import json

from bench import simulate


def test_json_output_and_files(tmp_path, capsys):
    assert simulate.main(["--json", "--out", str(tmp_path)]) == 0
    result = json.loads(capsys.readouterr().out)
    ratios = result["ratios"]
    assert {"speedup_32KiB", "speedup_512MiB", "speedup_5TiB", "speedup_min", "speedup_max"} <= set(ratios)
    assert ratios["speedup_min"] <= ratios["speedup_5TiB"] <= ratios["speedup_max"]
    assert len(result["rows"]) == 29 and "without_nvme" in result["readings"]
    for name in ("results.json", "fig5_small.png", "fig6_large.png", "fig7_speedup.png"):
        assert (tmp_path / name).stat().st_size > 0
    assert sorted(result["plots"]) == sorted(str(tmp_path / n) for n in ("fig5_small.png", "fig6_large.png",
                                                                          "fig7_speedup.png"))


def test_table_output(tmp_path, capsys):
    assert simulate.main(["--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "32 KiB" in out and "5 TiB" in out and "paper's 19x" in out


def test_calibrate(tmp_path, capsys):
    results = {"transfers": [
        {"mode": m, "direction": "put", "bytes": b, "seconds": s * b + 1e-4}
        for m, s in (("cpu", 1e-9), ("triggered", 2e-10)) for b in (1 << 16, 1 << 20, 1 << 24)]}
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    assert simulate.main(["--out", str(tmp_path / "o"), "--calibrate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fitted vs measured" in out and ("+0.0%" in out or "-0.0%" in out)
    assert (tmp_path / "o" / "calibration.png").exists()


def test_calibrate_bad_file(tmp_path, capsys):
    assert simulate.main(["--out", str(tmp_path), "--calibrate", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
