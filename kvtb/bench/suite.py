"""The benchmarks `kvtb bench all` runs, with their arguments per mode (full, --quick, --smoke)."""
from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

from kvtb.launch import kvtb_argv

logger = logging.getLogger(__name__)

MODES = ("full", "quick", "smoke")


@dataclasses.dataclass(frozen=True)
class Step:
    """One benchmark: the kvtb arguments per mode, and whether it takes --out."""

    name: str
    args: dict[str, tuple[str, ...]]
    takes_out: bool = True
    module: tuple[str, ...] = ()   # run as `python -m` instead of `kvtb`


STEPS = (
    Step("ttft", {"full": (), "quick": ("--sizes", "256", "1024", "2048", "--reps", "2"),
                  "smoke": ("--smoke",)}),
    Step("datapath", {"full": (), "quick": ("--sizes-kib", "64,1024,16384", "--total-mib", "64"),
                      "smoke": ("--smoke",)}),
    Step("concurrency", {"full": (), "quick": ("--levels", "1", "4", "8", "--turns", "2"),
                         "smoke": ("--smoke",)}),
    Step("eviction", {"full": (), "quick": ("--fractions", "0.5", "1.0", "--users", "6", "--visits", "15"),
                      "smoke": ("--smoke",)}),
    Step("offload", {"full": (), "quick": ("--decode-tokens", "64", "--repeats", "1"), "smoke": ("--smoke",)},
         module=("kvtb.bench.offload_sweep",)),
    Step("storage", {"full": (), "quick": ("--total-mib", "64", "--rounds", "1"),
                     "smoke": ("--sizes", "65536,1048576", "--total-mib", "4", "--rounds", "1")},
         takes_out=False),
    Step("smartnic", {"full": (), "quick": ("--total-mib", "64", "--rounds", "1", "--trigger-samples", "200"),
                      "smoke": ("--sizes-mib", "1", "--total-mib", "4", "--rounds", "1",
                                "--trigger-samples", "50", "--budget-s", "0.2")}),
)


def step_argv(step: Step, mode: str, out: Path) -> list[str]:
    """The command line of one benchmark with --json and its output directory."""
    head = [sys.executable, "-m", *step.module] if step.module else kvtb_argv("bench", step.name)
    tail = ["--out", str(out / step.name)] if step.takes_out else []
    return [*head, "--json", *tail, *step.args[mode]]


def simulate_argv(out: Path) -> list[str]:
    """`kvtb simulate --calibrate` on the datapath's transfers."""
    return kvtb_argv("simulate", "--json", "--out", str(out / "simulate"),
                     "--calibrate", str(out / "datapath" / "results.json"))


def run_command(name: str, argv: list[str], out: Path, timeout_s: float = 3600) -> dict:
    """Run one benchmark; {name, argv, exit_code, seconds, result (its JSON) or error}."""
    start = time.monotonic()
    logger.info("running %s: %s", name, " ".join(argv))
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"name": name, "argv": argv, "exit_code": None, "seconds": timeout_s,
                "error": f"timed out after {timeout_s:.0f} s"}
    entry = {"name": name, "argv": argv, "exit_code": done.returncode,
             "seconds": time.monotonic() - start, "stderr_tail": done.stderr[-2000:]}
    lines = done.stdout.strip().splitlines()
    try:
        entry["result"] = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        entry["result"] = None
    if entry["result"] is None or done.returncode != 0:
        entry["error"] = f"exit code {done.returncode}: {done.stderr[-1500:]}"
    if entry["result"] is not None and name == "storage":
        path = out / "storage" / "results.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(entry["result"], indent=2) + "\n")
    return entry
