"""A smoke run of every benchmark: real services, tiny sizes; figures are printed, never asserted.

Each runs with its own TMPDIR, which must be empty afterwards: a run leaves nothing behind.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from kvtb.launch import kvtb_argv

pytestmark = [pytest.mark.service, pytest.mark.slow]


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


def bench(tmp_path: Path, *args: str, timeout: float = 300) -> dict:
    done = run_clean(kvtb_argv("bench", *args, "--smoke", "--json", "--out", str(tmp_path / "out")), tmp_path,
                     timeout)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result == json.loads((tmp_path / "out" / "results.json").read_text())
    assert result["bench"] == args[0] and result["ratios"] and result["machine"]["cores"]
    assert all(Path(p).exists() and p.endswith(".png") for p in result.get("plots", []))
    print(args[0], result["ratios"])
    return result


@pytest.mark.parametrize("name", ["datapath", "smartnic", "concurrency", "eviction", "storage"])
def test_smoke(name, tmp_path):
    result = bench(tmp_path, name)
    if name in ("datapath", "smartnic"):
        transfers = result["results"]["chunks" if name == "datapath" else "transfers"]
        assert all(set(t["raw_limits_bytes_per_s"]) == {"zmq_tcp", "pwrite_fsync", "pread_cached"}
                   for t in transfers)


def test_ttft_smoke_restores_from_storage_in_both_placements(tmp_path):
    from kvtb.placement import current_cpus, formatted, plan
    result = bench(tmp_path, "ttft", "--sizes", "96", "--reps", "1")
    placements = ["shared", "nic"] if len(current_cpus()) >= 2 else ["shared"]
    assert result["settings"]["placements"] == placements
    assert [p["name"] for p in result["machine"]["placement"]] == placements
    for name in placements:
        entry = result["results"]["by_placement"][name]
        assert entry["placement"]["cpus"] == formatted(plan(name))  # 2 CPUs, nic: compute "0", the rest "1"
        size = entry["results"]["sizes"]["96"]
        row = size["policies"]
        assert row["triggered"]["kv_source"] == ["restored"] and row["resident"]["kv_source"] == ["resident"]
        assert size["context_tokens"] == 96 and size["whole_blocks"] and size["mismatches"] == []
        assert size["same_reuse"], (row["resident"]["tokens_reused"], row["triggered"]["tokens_reused"])
        assert {f"recompute_vs_restore_96@{name}", f"restore_vs_resident_96@{name}"} <= set(result["ratios"])
    assert result["results"]["sizes"] == result["results"]["by_placement"]["shared"]["results"]["sizes"]
    assert result["failed"] == []
    assert {"recompute_vs_restore_96", "restore_vs_resident_96"} <= set(result["ratios"])
    if "nic" in placements:
        nic = result["machine"]["placement"][1]
        assert nic["name"] == "nic" and nic["cpus"] == formatted(plan("nic"))
        if current_cpus() == (0, 1):
            assert nic["cpus"]["compute"] == "0" and nic["cpus"]["smartnic"] == "1"
        compared = {"restore_vs_resident_96@nic_vs_shared", "restored_ttft_ms_96@nic_vs_shared"}
        assert compared <= set(result["ratios"])


def test_ttft_smoke_under_a_profile_times_follow_ups_in_virtual_time(tmp_path):
    """Under polaris-a100 at D = 3: the services paced, the record's D and violations, kv_source still
    checked; a benchmark without --profile support refuses it (argparse's exit 2)."""
    result = bench(tmp_path, "ttft", "--sizes", "96", "--reps", "1", "--placements", "shared",
                   "--profile", "polaris-a100", "--dilation", "3", timeout=600)
    scale = result["scale"]
    assert scale["profile"] == "polaris-a100" and scale["dilation"] == 3.0 and scale["dilation_chosen"] == "given"
    kinds = scale["pacing"]["kinds"]
    assert kinds["gpu_step"]["ops"] > 0 and kinds["nic_get"]["ops"] > 0
    size = result["results"]["sizes"]["96"]
    assert size["mismatches"] == [] and size["policies"]["triggered"]["kv_source"] == ["restored"]
    assert result["settings"]["profile"] == "polaris-a100" and result["failed"] == []
    done = subprocess.run(kvtb_argv("bench", "fairness", "--smoke", "--profile", "paper"), capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and "--profile" in done.stderr


def test_offload_smoke(tmp_path):
    from kvtb.placement import current_cpus
    result = bench(tmp_path, "offload", timeout=600)
    assert "cpu_stall_vs_triggered_8" in result["ratios"]
    assert result["results"]["blocks"]["8"]["triggered"]["blocks_per_turn"] > 0
    placements = ["shared", "nic"] if len(current_cpus()) >= 2 else ["shared"]
    assert [p["name"] for p in result["machine"]["placement"]] == placements
    for name in placements:
        blocks = result["results"]["by_placement"][name]["results"]["blocks"]
        assert blocks["8"]["triggered"]["blocks_per_turn"] > 0
        assert f"cpu_stall_vs_triggered_8@{name}" in result["ratios"]
    if "nic" in placements:  # the compute stand-in pinned apart from the agent and the storage node
        cpus = result["machine"]["placement"][1]["cpus"]
        assert not set(cpus["compute"].split(",")) & set(cpus["smartnic"].split(","))
        assert "triggered_stall_us_8@nic_vs_shared" in result["ratios"]


def test_all_smoke_writes_a_report_and_the_readme_table(tmp_path):
    out, readme = tmp_path / "out", tmp_path / "README.md"
    readme.write_text("# x\n<!-- kvtb bench all: summary start -->\nold\n"
                      "<!-- kvtb bench all: summary end -->\n")
    run_clean(kvtb_argv("bench", "all", "--smoke", "--only", "datapath", "smartnic", "--out", str(out),
                        "--readme", str(readme)), tmp_path, timeout=300)
    text = (out / "README.md").read_text()
    assert "![datapath](datapath/datapath.png)" in text and "Analytical model" in text
    assert json.loads((out / "all.json").read_text())["failed"] == []
    table = readme.read_text()
    assert "old" not in table
    assert "| Agent PUT / raw limit" in table and "| Analytical model" in table
