"""The end of every benchmark: raw results into --out, then one JSON object or readable tables."""
from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtb.bench.output import emit_json, write_json

logger = logging.getLogger(__name__)


def add_run_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--smoke (tiny sizes, seconds), --keep-data (leave the services' files in --out)."""
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark runs")
    parser.add_argument("--keep-data", action="store_true",
                        help="keep the services' data and logs in OUT/services (default: a temp dir)")
    return parser


def services_dir(args: argparse.Namespace, label: str) -> Path:
    """Where a run's services keep data and logs: OUT/services/LABEL, or a fresh temp dir."""
    if getattr(args, "keep_data", False):
        path = Path(args.out) / "services" / label
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix=f"kvtb-bench-{label}-"))


def setup_logging(args: argparse.Namespace) -> None:
    """Warnings only on stderr (the progress bar owns the line); INFO with KVTB_BENCH_VERBOSE."""
    level = logging.INFO if os.environ.get("KVTB_BENCH_VERBOSE") else logging.WARNING
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")


def finish(args: argparse.Namespace, result: dict[str, Any], text: str) -> Path:
    """Write OUT/results.json; print the result as one JSON line (--json) or the text tables."""
    path = write_json(args.out, "results.json", result)
    if args.json:
        emit_json(result)
    else:
        print(text)
        print(f"\nraw results: {path}")
        for plot in result.get("plots", []):
            print(f"plot: {plot}")
    return path


def run_bench(argv: list[str], parse_args: Callable, run: Callable, table: Callable) -> int:
    """The body of a benchmark's main: parse, set up logging, run, write and print."""
    args = parse_args(argv)
    setup_logging(args)
    result = run(args)
    finish(args, result, table(result))
    return 0


def ratios_text(ratios: dict[str, float]) -> str:
    """One line per ratio, aligned."""
    width = max((len(k) for k in ratios), default=0)
    return "\n".join(f"{k.ljust(width)}  {v:.3g}" if isinstance(v, float) else f"{k.ljust(width)}  {v}"
                     for k, v in ratios.items())
