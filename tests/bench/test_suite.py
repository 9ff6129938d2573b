"""`kvtb bench all` without running a benchmark: command lines, headline table, report, README splice."""
from __future__ import annotations

from pathlib import Path

import pytest

from bench import suite
from bench.results import machine_info

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

RESULTS = {
    "ttft": {"ratios": {"recompute_vs_restore_2048": 31.24, "restore_vs_resident_2048": 1.21},
             "results": {"crossover": {"tokens": None, "where": "below_smallest", "smallest": 32}}},
    "datapath": {"ratios": {"put_vs_limit": 0.61, "get_vs_limit": 0.75}},
    "concurrency": {"ratios": {"tokens_per_s_8_vs_1": 1.5, "ttft_p50_8_vs_1": 4.0}},
    "eviction": {"settings": {"fractions": [1.0, 0.25], "policies": ["lru", "timer"]},
                 "results": {"runs": {"lru_0.25": {"hit_rate": 0.4}, "timer_0.25": {"hit_rate": 0.3}}}},
}


def test_every_step_runs_as_kvtb_bench_with_json_and_its_own_out():
    for step in suite.STEPS:
        for mode in ("full", "quick", "smoke"):
            argv = step.argv(mode, Path("/o"))
            assert argv[2:5] == ["kvtb.cli", "bench", step.name] and "--json" in argv
            assert argv[argv.index("--out") + 1] == f"/o/{step.name}"
        assert "--smoke" in step.argv("smoke", Path("/o"))
        assert "--keep-data" in step.argv("full", Path("/o"), keep_data=True)


def test_quick_and_smoke_exclude_each_other():
    with pytest.raises(SystemExit):
        suite.parse_args(["--quick", "--smoke"])


def test_headlines_show_what_ran_with_its_target():
    rows = suite.headline_rows(RESULTS)
    shown = {q: v for q, v, _, _ in rows}
    assert shown["Follow-up TTFT, recomputed / restored, 2,048-token context"] == "31.2x"
    assert shown["Context under which recomputing is as fast as restoring"] == \
        "below the smallest size measured (32 tokens)"  # not bracketed: never a crossover of its own
    assert shown["Output tokens/s, most sessions / one session (continuous batching)"] == "1.50 (8 sessions / 1)"
    assert "lru 0.40, timer 0.30 (capacity 0.25" in shown["Follow-up hit rate under limited storage, by "
                                                         "eviction policy"]
    assert not any("Agent" in q for q in shown)  # smartnic did not run: no row, no made-up value
    assert ("KV PUT through the whole path / raw limit, 16 MiB chunks", "0.61", "floor 0.5",
            "`kvtb bench datapath`") in rows
    lines = suite.headline_table(RESULTS).splitlines()
    assert lines[0].startswith("| question |") and len(lines) == 2 + len(rows)


def test_a_crossover_is_given_only_where_two_measured_sizes_bracket_it():
    def shown(cross):
        return suite._crossover({"results": {"crossover": cross}})
    assert shown({"tokens": 300.4, "where": "measured"}) == "300 tokens (between two sizes measured)"
    assert shown({"tokens": None, "where": "above_largest", "largest": 3584}) == \
        "above the largest size measured (3584 tokens)"
    assert shown({"tokens": None, "where": "not_measured"}) is None  # its row says not measured


def test_the_ttft_floor_is_ours_and_not_attributed_to_the_paper():
    targets = {h.question: h.target for h in suite.HEADLINES}
    ttft = targets["Follow-up TTFT, recomputed / restored, 2,048-token context"]
    assert "ours" in ttft and "no TTFT figure" in ttft and "the paper's 19-23x" not in ttft
    assert not any("(the paper: 19x)" in t for t in targets.values())


def test_splice_replaces_only_the_block_between_the_markers():
    text = f"intro\n{suite.START}\nold table\n{suite.END}\noutro\n"
    assert suite.splice(text, "new") == f"intro\n{suite.START}\nnew\n{suite.END}\noutro\n"
    with pytest.raises(ValueError, match="block to replace"):
        suite.splice("no markers here", "new")


def test_report_embeds_tables_plots_ratios_and_failures(tmp_path):
    chunk = {"chunk_bytes": 16 << 20, "put_bytes_per_s": 6e8, "get_bytes_per_s": 4e8,
             "put_limit_bytes_per_s": 1e9, "get_limit_bytes_per_s": 2e9, "put_vs_limit": 0.6,
             "get_vs_limit": 0.2,
             "storage_node_direct": {"put_bytes_per_s": 9e8, "get_bytes_per_s": 8e8},
             "rounds_bytes_per_s": {"put": [6e8], "get": [4e8]}}
    ok = {"name": "datapath", "argv": ["/usr/bin/python", "-m", "kvtb.cli"], "exit_code": 0, "seconds": 3.0,
          "result": {"settings": {"rounds": 1, "stack": {"big": 1}}, "ratios": {"put_vs_limit": 0.6},
                     "plots": [str(tmp_path / "datapath" / "datapath.png")], "results": {"chunks": [chunk]}}}
    bad = {"name": "ttft", "argv": ["python"], "exit_code": 1, "seconds": 1.0, "result": None,
           "error": "exit code 1: boom"}
    report = {"command": "kvtb bench all --quick", "mode": "quick", "seconds": 4.0, "machine": machine_info(),
              "steps": [ok, bad], "failed": suite.failed_parts([ok, bad])}
    assert report["failed"] == [{"part": "ttft", "error": "exit code 1: boom"}]
    text = suite.render(report, tmp_path)
    assert "![datapath](datapath/datapath.png)" in text and "`python -m kvtb.cli`" in text
    assert "put_vs_limit  0.6" in text and "16 MiB rounds, MB/s" in text  # the benchmark's own table
    assert "**Failed:**" in text and "- ttft: exit code 1: boom" in text
    assert ("| Follow-up TTFT, recomputed / restored, 2,048-token context | failed: exit code 1: boom |"
            in text)
    assert "| cores |" in text and '"stack"' not in text
    block = suite.readme_block(report, Path("out/report/README.md"))
    assert block.startswith("| question |") and "`kvtb bench all --quick`" in block


def test_a_failed_benchmark_or_part_shows_failed_with_its_error_in_the_headlines():
    results = {**RESULTS, "concurrency": {"ratios": {}, "failed": [
        {"part": "8 sessions", "error": "TimeoutError: the frontend did not answer"}]}}
    rows = {q: v for q, v, _, _ in suite.headline_rows(
        results, {"offload": "Traceback (most recent call last):\n  File x\nRuntimeError: no model"})}
    assert rows["Output tokens/s, most sessions / one session (continuous batching)"] == (
        "failed: 8 sessions: TimeoutError: the frontend did not answer")
    assert rows["Compute stall per offloaded block, CPU-centric / triggered (32-token blocks)"] == (
        "failed: RuntimeError: no model")
    assert rows["KV GET with the default security / none (fabric auth + KV MAC), 16 MiB chunks"] == (
        "failed: not measured in this run")  # datapath ran, but gave no such ratio
    assert not any("Agent" in q for q in rows)  # smartnic did not run: still no row


def test_failed_parts_of_a_benchmark_with_a_result_are_named_with_it():
    entries = [{"name": "concurrency", "error": "exit code 1: ...", "result": {"failed": [
        {"part": "8 sessions", "error": "TimeoutError: x"}]}}, {"name": "storage", "result": {"failed": []}}]
    assert suite.failed_parts(entries) == [{"part": "concurrency: 8 sessions", "error": "TimeoutError: x"}]
