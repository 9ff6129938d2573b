"""A smoke run of every benchmark: real services, tiny sizes; figures are printed, never asserted."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvtb.launch import kvtb_argv

pytestmark = pytest.mark.slow


def bench(*args: str, timeout: float = 300) -> tuple[dict, subprocess.CompletedProcess]:
    done = subprocess.run(kvtb_argv("bench", *args), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), done


@pytest.mark.parametrize("name", ["datapath", "concurrency", "eviction"])
def test_smoke(name, tmp_path):
    result, _ = bench(name, "--smoke", "--json", "--out", str(tmp_path))
    assert result["bench"] == name and result["ratios"] and result["machine"]["cores_logical"]
    assert (tmp_path / "results.json").exists()
    assert all(Path(p).exists() and p.endswith(".png") for p in result["plots"])
    print(name, result["ratios"])


def test_ttft_smoke_restores_from_storage(tmp_path):
    result, _ = bench("ttft", "--smoke", "--json", "--out", str(tmp_path), "--sizes", "96", "--reps", "1")
    row = result["results"]["sizes"]["96"]["policies"]
    assert row["triggered"]["kv_source"] == ["restored"] and row["resident"]["kv_source"] == ["resident"]
    assert set(result["ratios"]) == {"recompute_vs_restore_96", "restore_vs_resident_96"}


def test_offload_sweep_smoke(tmp_path):
    pytest.importorskip("compute_node.bench")
    done = subprocess.run([sys.executable, "-m", "kvtb.bench.offload_sweep", "--smoke", "--json", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "cpu_stall_vs_triggered_8" in json.loads(done.stdout.strip().splitlines()[-1])["ratios"]


def test_all_smoke_writes_a_report(tmp_path):
    done = subprocess.run(kvtb_argv("bench", "all", "--smoke", "--only", "datapath", "smartnic",
                                    "--out", str(tmp_path)), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "README.md").read_text()
    assert "![datapath](datapath/datapath.png)" in text and "Analytical model" in text
    assert json.loads((tmp_path / "all.json").read_text())["failed"] == []
