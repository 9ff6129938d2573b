"""Run code under `python -O` (which drops every assert), for the tests that show a guard still holds."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_optimized(code: str, timeout_s: float = 120) -> str:
    """Run code (dedented) under python -O from the repo's root; its stdout. It must exit 0."""
    proc = subprocess.run([sys.executable, "-O", "-c", textwrap.dedent(code)], check=False, cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        raise AssertionError(f"python -O exited {proc.returncode}: {proc.stderr}")
    return proc.stdout
