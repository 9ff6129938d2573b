"""A smoke run of every benchmark: real services, tiny sizes; figures are printed, never asserted.

Each runs with its own TMPDIR, which must be empty afterwards: a run leaves nothing behind.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtb.bench import cpu_use
from kvtb.launch import kvtb_argv

pytestmark = pytest.mark.slow


def run_clean(argv: list[str], tmp_path: Path, timeout: float) -> subprocess.CompletedProcess:
    """Run argv with TMPDIR in tmp_path; assert it exits 0 and leaves no temporary file of ours."""
    tmpdir = tmp_path / "tmpdir"
    tmpdir.mkdir()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "TMPDIR": str(tmpdir)})
    assert done.returncode == 0, done.stderr[-3000:]
    left = [p.name for p in tmpdir.iterdir() if not p.name.startswith("torchinductor_")]  # torch's cache
    assert left == [], "the run left temporary files behind"
    return done


def bench(tmp_path: Path, *args: str, timeout: float = 300) -> tuple[dict, subprocess.CompletedProcess]:
    done = run_clean(kvtb_argv("bench", *args), tmp_path, timeout)
    return json.loads(done.stdout.strip().splitlines()[-1]), done


@pytest.mark.parametrize("name", ["datapath", "concurrency", "eviction"])
def test_smoke(name, tmp_path):
    result, _ = bench(tmp_path, name, "--smoke", "--json", "--out", str(tmp_path / "out"))
    assert result["bench"] == name and result["ratios"] and result["machine"]["cores_logical"]
    assert (tmp_path / "out" / "results.json").exists()
    assert all(Path(p).exists() and p.endswith(".png") for p in result["plots"])
    if name == "datapath" and cpu_use.busy_core_s() is not None:
        for t in result["results"]["chunks"]:  # the machine's CPU per MiB, of the path and beside it;
            # a smoke round is too short for /proc/stat's ticks to say how much, only that it was read
            assert all(t["cpu"][who]["best_window"]["us_per_mib"] is not None
                       for who in ("put", "get", "bare_put", "bare_get", "zmq_tcp", "pwrite_fsync"))
    print(name, result["ratios"])


def test_ttft_smoke_restores_from_storage(tmp_path):
    result, _ = bench(tmp_path, "ttft", "--smoke", "--json", "--out", str(tmp_path / "out"), "--sizes", "96",
                      "--reps", "1")
    row = result["results"]["sizes"]["96"]["policies"]
    assert row["triggered"]["kv_source"] == ["restored"] and row["resident"]["kv_source"] == ["resident"]
    assert set(result["ratios"]) == {"recompute_vs_restore_96", "restore_vs_resident_96"}


def test_offload_sweep_smoke(tmp_path):
    pytest.importorskip("compute_node.bench")
    done = run_clean([sys.executable, "-m", "kvtb.bench.offload_sweep", "--smoke", "--json", "--out",
                      str(tmp_path / "out")], tmp_path, timeout=600)
    assert "cpu_stall_vs_triggered_8" in json.loads(done.stdout.strip().splitlines()[-1])["ratios"]


def test_all_smoke_writes_a_report(tmp_path):
    out = tmp_path / "out"
    run_clean(kvtb_argv("bench", "all", "--smoke", "--only", "datapath", "smartnic", "--out", str(out)),
              tmp_path, timeout=300)
    text = (out / "README.md").read_text()
    assert "![datapath](datapath/datapath.png)" in text and "Analytical model" in text
    assert json.loads((out / "all.json").read_text())["failed"] == []
