"""`kvtb bench all`'s command lines and Markdown report, without running a benchmark."""
from __future__ import annotations

from pathlib import Path

from kvtb.bench import report_md, suite
from kvtb.bench.machine import machine_info
from kvtb.bench.sessions import TOPICS, script


def test_every_step_has_every_mode_and_json():
    for step in suite.STEPS:
        assert set(step.args) == set(suite.MODES), step.name
        argv = suite.step_argv(step, "smoke", Path("/tmp/o"))
        assert "--json" in argv
        assert ("--out" in argv) == step.takes_out
    assert suite.simulate_argv(Path("/o"))[-2:] == ["--calibrate", "/o/datapath/results.json"]


def test_report_embeds_plots_ratios_and_failures(tmp_path):
    ok = {"name": "datapath", "argv": ["python", "bench"], "exit_code": 0, "seconds": 3.0,
          "result": {"settings": {"rounds": 1, "stack": {"big": 1}}, "ratios": {"put_vs_limit": 0.6},
                     "plots": [str(tmp_path / "datapath" / "datapath.png")], "results": {"chunks": []}}}
    bad = {"name": "ttft", "argv": ["python"], "exit_code": 1, "seconds": 1.0, "result": None,
           "error": "exit code 1: boom"}
    text = report_md.render({"command": "kvtb bench all --quick", "mode": "quick", "seconds": 4.0,
                             "machine": machine_info(), "steps": [ok, bad]}, tmp_path)
    assert "![datapath](datapath/datapath.png)" in text
    assert "| put_vs_limit | 0.6 |" in text
    assert "**Failed:** ttft" in text and "boom" in text
    assert "cores_logical" in text and '"stack"' not in text


def test_session_scripts_repeat_every_len_topics():
    assert script(0, 3) == script(len(TOPICS), 3)
    assert script(0, 3) != script(1, 3)
    assert len(script(2, 1)) == 1
