import pytest
"""A short run of `kvtb bench soak` (the soak itself is not a test): two hosts, one real node, its report."""
import json

from bench import storage_soak
from kvtb.cli import COMMANDS

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_a_short_soak_reports_both_hosts_and_the_nodes_stall_log(tmp_path):
    assert COMMANDS[("bench", "soak")] == "bench.storage_soak:main"
    assert storage_soak.main(["--json", "--out", str(tmp_path), "--seconds", "3", "--working-set-mib", "8",
                              "--sizes", "65536,262144", "--mib-per-s", "8", "--window", "8"]) == 0
    result = json.loads((tmp_path / "results.json").read_text())
    got = result["results"]["soak"]
    assert set(got["hosts"]) == {"agent0", "agent1"} and not result["failed"]
    assert all(h["ops"]["store"]["count"] > 0 for h in got["hosts"].values())
    assert got["node"]["longest_command_s"] is not None  # the node's own line at its stop
    assert set(result["floors"]) == {"longest_silence_s", "slowest_answered_s"}
    assert "longest silence" in storage_soak.table(result)
