"""`kvtb simulate`: the paper's analytical model (Figs. 5-7), and --calibrate against measurements.

Usage: kvtb simulate [--json] [--out DIR] [--calibrate RESULTS.json]

Prints size, CPU-centric time, triggered time and speedup over 32 KiB .. 5 TiB, the speedup under
each alternative reading of the paper's units, and writes results.json plus fig5_small.png,
fig6_large.png and fig7_speedup.png into --out. With --calibrate RESULTS.json it also fits the
model's fixed and per-byte cost of each path to the measured transfers in RESULTS.json (schema in
bench/calibration.py and docs/analytical-model.md) and prints fitted beside measured.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import sys
from pathlib import Path

from bench import analytical_model as am
from bench import calibration, results
from bench.analytical_model import GIB, KIB, MIB, TIB

logger = logging.getLogger(__name__)

FIG5_MAX_BYTES = 512 * MIB  # Fig. 5: the sizes one user's inference produces
RATIO_SIZES = {"32KiB": 32 * KIB, "512MiB": 512 * MIB, "1GiB": GIB, "5TiB": 5 * TIB}


def simulate(p: am.ModelParams = am.ModelParams(), sizes: list[int] | None = None) -> dict:
    """The model's sweep, ratios, alternative readings and the overhead the paper's numbers imply."""
    sizes = sizes or am.default_sizes()
    rows = am.sweep(sizes, p)
    speedups = [r["speedup"] for r in rows]
    ratios = {f"speedup_{name}": am.cpu_centric_s(size, p) / am.triggered_s(size, p)
              for name, size in RATIO_SIZES.items()}
    ratios.update(speedup_min=min(speedups), speedup_max=max(speedups),
                  paper_min_over_model_min=am.PAPER_SPEEDUP_MIN / min(speedups),
                  paper_max_over_model_max=am.PAPER_SPEEDUP_MAX / max(speedups))
    readings = {}
    for name, params in am.alternative_readings().items():
        low, high = am.speedup_range(params, sizes)
        readings[name] = {"speedup_min": low, "speedup_max": high,
                          "speedup_32KiB": am.sweep([32 * KIB], params)[0]["speedup"],
                          "speedup_5TiB": am.sweep([5 * TIB], params)[0]["speedup"]}
    needed = {
        "cpu_extra_s_at_32KiB_for_23x": am.cpu_overhead_needed_s(am.PAPER_SPEEDUP_MAX, 32 * KIB, p),
        "cpu_extra_s_per_512MiB_chunk_for_19x_at_5TiB":
            am.cpu_overhead_needed_s(am.PAPER_SPEEDUP_MIN, 5 * TIB, p) / (5 * TIB // p.chunk_bytes),
    }
    return {"params": dataclasses.asdict(p), "rows": rows, "ratios": ratios, "readings": readings,
            "paper": {"speedup_min": am.PAPER_SPEEDUP_MIN, "speedup_max": am.PAPER_SPEEDUP_MAX},
            "overhead_needed": needed}


def write_plots(rows: list[dict], out_dir: Path) -> list[Path | None]:
    """Figs. 5, 6 (time against size, small and large) and 7 (speedup) as PNG."""
    small = [r for r in rows if r["bytes"] <= FIG5_MAX_BYTES]
    large = [r for r in rows if r["bytes"] > FIG5_MAX_BYTES]
    paths = []
    for name, part, title in (("fig5_small.png", small, "Fig. 5: CPU-centric vs triggered (small)"),
                              ("fig6_large.png", large, "Fig. 6: CPU-centric vs triggered (large)")):
        xs = [r["bytes"] for r in part]
        series = {"CPU-centric": (xs, [r["cpu_s"] for r in part]),
                  "triggered": (xs, [r["triggered_s"] for r in part])}
        paths.append(results.plot_lines(out_dir / name, series, title=title, xlabel="KV cache size (bytes)",
                                       ylabel="transfer time (s)", logx=True, logy=True))
    xs = [r["bytes"] for r in rows]
    paths.append(results.plot_lines(
        out_dir / "fig7_speedup.png", {"model (Tables II/III)": (xs, [r["speedup"] for r in rows])},
        title="Fig. 7: speedup of triggered over CPU-centric", xlabel="KV cache size (bytes)",
        ylabel="speedup (x)", logx=True,
        hlines={"paper 19x": am.PAPER_SPEEDUP_MIN, "paper 23x": am.PAPER_SPEEDUP_MAX}))
    return paths


def write_calibration_plot(cal: dict, out_dir: Path) -> Path | None:
    """Measured medians and fitted lines per (mode, direction)."""
    series = {}
    for mode, direction in sorted({(r["mode"], r["direction"]) for r in cal["comparison"]}):
        part = [r for r in cal["comparison"] if (r["mode"], r["direction"]) == (mode, direction)]
        xs = [r["bytes"] for r in part]
        series[f"{mode} {direction} measured"] = (xs, [r["measured_s"] for r in part])
        series[f"{mode} {direction} fitted"] = (xs, [r["fitted_s"] for r in part])
    return results.plot_lines(out_dir / "calibration.png", series, title="Calibration: fitted vs measured",
                             xlabel="transfer size (bytes)", ylabel="seconds", logx=True, logy=True)


def _sweep_table(rows: list[dict]) -> str:
    return results.format_table(
        ["size", "CPU-centric", "triggered", "speedup"],
        [[results.format_bytes(r["bytes"]), results.format_seconds(r["cpu_s"]),
          results.format_seconds(r["triggered_s"]), f"{r['speedup']:.3f}"] for r in rows])


def _readings_table(readings: dict) -> str:
    return results.format_table(
        ["reading", "speedup min", "speedup max", "at 32 KiB", "at 5 TiB"],
        [[name] + [f"{r[k]:.3f}" for k in ("speedup_min", "speedup_max", "speedup_32KiB", "speedup_5TiB")]
         for name, r in readings.items()])


def _calibration_tables(cal: dict) -> str:
    fits = results.format_table(
        ["mode", "direction", "n", "fixed", "per byte (s)", "GB/s"],
        [[f["mode"], f["direction"], f["n"], results.format_seconds(f["fixed_s"]), f["per_byte_s"],
          round(f["bytes_per_s"] / 1e9, 3)] for f in cal["fits"]])
    comparison = results.format_table(
        ["mode", "direction", "size", "n", "measured", "fitted", "rel err", "paper model"],
        [[r["mode"], r["direction"], results.format_bytes(r["bytes"]), r["n"],
          results.format_seconds(r["measured_s"]), results.format_seconds(r["fitted_s"]),
          f"{100 * r['rel_error']:+.1f}%",
          results.format_seconds(r["paper_model_s"]) if r["paper_model_s"] is not None else "-"]
         for r in cal["comparison"]])
    text = f"fitted per-chunk costs:\n{fits}\n\nfitted vs measured (medians):\n{comparison}"
    if cal["measured_speedup"]:
        text += "\n\nmeasured put speedup (cpu / triggered): " + ", ".join(
            f"{results.format_bytes(r['bytes'])} {r['speedup']:.2f}x" for r in cal["measured_speedup"])
    if cal["fitted_speedup"]:
        speedups = [r["speedup"] for r in cal["fitted_speedup"]]
        text += (f"\nfitted model's put speedup over 32 KiB .. 5 TiB: {min(speedups):.2f}x .. "
                 f"{max(speedups):.2f}x (paper 19x .. 23x)")
    return text


def _summary(result: dict) -> str:
    r = result["ratios"]
    need = result["overhead_needed"]
    return (f"model speedup {r['speedup_min']:.3f}x .. {r['speedup_max']:.3f}x "
            f"(32 KiB {r['speedup_32KiB']:.3f}x, 512 MiB {r['speedup_512MiB']:.3f}x, "
            f"5 TiB {r['speedup_5TiB']:.3f}x) against the paper's 19x .. 23x: the paper's 19x is "
            f"{r['paper_min_over_model_min']:.1f} times the model's minimum, its 23x "
            f"{r['paper_max_over_model_max']:.1f} times the model's maximum.\n"
            f"To reach the paper's numbers the CPU-centric path would need "
            f"{results.format_seconds(need['cpu_extra_s_at_32KiB_for_23x'])} more at 32 KiB and "
            f"{results.format_seconds(need['cpu_extra_s_per_512MiB_chunk_for_19x_at_5TiB'])} more per "
            f"512 MiB "
            f"chunk at 5 TiB than Tables II/III give (see docs/analytical-model.md).")


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options of `kvtb simulate`."""
    parser = argparse.ArgumentParser(prog="kvtb simulate", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--out", type=Path, default=Path("out/simulate"), help="output directory")
    parser.add_argument("--calibrate", type=Path, metavar="RESULTS.json",
                        help="fit the model to measured transfers in this file")
    return parser.parse_args(argv)


def table(result: dict) -> str:
    """The sweep, the readings, the summary and, with --calibrate, the fit."""
    text = [_sweep_table(result["rows"]), "",
            "alternative readings (see docs/analytical-model.md):", _readings_table(result["readings"]), "",
            _summary(result)]
    if "calibration" in result:
        text += ["", _calibration_tables(result["calibration"])]
    return "\n".join(text)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `kvtb simulate`."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    result = {"bench": "simulate", **simulate()}
    if args.calibrate:
        try:
            result["calibration"] = cal = calibration.calibrate(json.loads(args.calibrate.read_text()),
                                                                am.default_sizes())
        except (OSError, ValueError) as exc:
            print(f"kvtb simulate: --calibrate {args.calibrate}: {exc}", file=sys.stderr)
            return 2
        if cal["fitted_speedup"]:
            speedups = [r["speedup"] for r in cal["fitted_speedup"]]
            result["ratios"].update(calibrated_speedup_min=min(speedups),
                                    calibrated_speedup_max=max(speedups))
    drawn = write_plots(result["rows"], args.out)
    if "calibration" in result:
        drawn.append(write_calibration_plot(result["calibration"], args.out))
    result["plots"] = results.plots(*drawn)
    results.finish(args, result, table(result))
    return 0
