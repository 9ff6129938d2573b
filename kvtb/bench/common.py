"""What every `kvtb bench ...` command shares: its --json/--out options, result skeleton, progress bar."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from kvtb.bench.machine import machine_info
from kvtb.bench.progress import Progress

logger = logging.getLogger(__name__)


def add_common_args(parser: argparse.ArgumentParser, bench_name: str) -> argparse.ArgumentParser:
    """Add --json (one JSON object on stdout, no progress bar) and --out DIR (default out/<name>)."""
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--out", type=Path, default=Path("out") / bench_name,
                        help=f"output directory (default out/{bench_name})")
    return parser


def new_result(bench_name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The skeleton of a benchmark's JSON: bench, machine, settings, results and ratios to fill in."""
    return {"bench": bench_name, "machine": machine_info(), "settings": dict(settings),
            "results": {}, "ratios": {}}


def progress_for(args: argparse.Namespace, total: int, label: str) -> Progress:
    """A progress bar that stays silent with --json or when stderr is not a TTY."""
    return Progress(total, label, enabled=not getattr(args, "json", False))
