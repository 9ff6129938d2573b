"""Where every benchmark's result goes: options, JSON, tables, plots, the machine, the progress bar."""
from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest

from bench import results
from bench.progress import Progress

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def test_common_args_and_result():
    args = results.add_common_args(argparse.ArgumentParser(), "datapath").parse_args(["--json", "--smoke"])
    assert args.json and args.smoke and not args.keep_data and args.out == Path("out/datapath")
    assert results.progress_for(args, 3, "x").enabled is False
    result = results.new_result("datapath", {"chunk_bytes": 1024})
    assert result["bench"] == "datapath" and result["ratios"] == {}
    assert result["settings"] == {"chunk_bytes": 1024}
    machine = result["machine"]
    assert machine["cores"] >= 1 and machine["python"] and machine["dma_engine"] in ("compiled", "numpy")
    assert isinstance(machine["attention_kernel"], bool)


def test_write_and_emit_json(tmp_path):
    path = results.write_json(tmp_path / "out", "raw.json", {"x": 1.5, "bad": float("inf")})
    assert json.loads(path.read_text()) == {"x": 1.5, "bad": "inf"}
    buf = io.StringIO()
    results.emit_json({"ratios": {"a": 2.0}}, buf)
    assert buf.getvalue().count("\n") == 1 and json.loads(buf.getvalue())["ratios"]["a"] == 2.0


def test_format_table_aligns():
    text = results.format_table(["size", "time_s"], [["32 KiB", 0.5], ["5 TiB", 1234.5678]])
    lines = text.splitlines()
    assert lines[0].startswith("size") and set(lines[1]) <= {"-", " "}
    assert lines[2].endswith("0.5") and lines[3].endswith("1235")
    assert len(lines[2]) == len(lines[3])


def test_format_units():
    assert results.format_bytes(32768) == "32 KiB"
    assert results.format_bytes(5 * 2**40) == "5 TiB"
    assert results.format_seconds(3.3e-3) == "3.3 ms"
    assert results.format_seconds(1.7e-6) == "1.7 us"


def test_floors_only_for_what_was_measured():
    got = results.floors({"a": 0.6, "b": 0.4}, {"a": 0.5, "b": 0.5, "c": 0.5})
    assert got == {"a": {"floor": 0.5, "value": 0.6, "met": True},
                   "b": {"floor": 0.5, "value": 0.4, "met": False}}


def test_plot_lines_writes_png(tmp_path):
    path = results.plot_lines(tmp_path / "p.png", {"a": ([1, 10, 100], [1, 2, 3])}, title="t",
                              xlabel="x", ylabel="y", logx=True, hlines={"goal": 2.0})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert results.plots(path, None) == [str(path)]


def test_without_matplotlib_a_plot_is_left_out_with_a_warning(tmp_path, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if the bench extra were not installed
    for name in [m for m in sys.modules if m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    drawn = results.plot_lines(tmp_path / "p.png", {"a": ([1], [1])}, title="t", xlabel="x", ylabel="y")
    assert drawn is None
    assert "pip install -e '.[bench]'" in caplog.text and not (tmp_path / "p.png").exists()


def test_a_temp_data_dir_goes_unless_the_run_failed(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(results.tempfile, "tempdir", None)
    args = argparse.Namespace(out=tmp_path / "out", keep_data=False)
    with results.data_dir(args, "x") as path:
        (path / "file").write_text("data")
    assert not path.exists()
    with pytest.raises(RuntimeError), results.data_dir(args, "y") as path:
        raise RuntimeError("boom")
    assert path.exists()  # kept, with its logs, to look at
    args.keep_data = True
    with results.data_dir(args, "z") as path:
        pass
    assert path == tmp_path / "out" / "services" / "z" and path.exists()


def test_progress_silent_when_not_tty():
    buf = io.StringIO()
    with Progress(3, "x", stream=buf) as bar:
        bar.update()
    assert buf.getvalue() == ""


def test_progress_draws_on_tty():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    buf = Tty()
    with Progress(2, "bench", stream=buf) as bar:
        bar.update(2)
    assert "bench [" in buf.getvalue() and "2/2" in buf.getvalue()
    assert Progress(2, stream=Tty(), enabled=False).enabled is False  # --json


@pytest.fixture
def no_recorded_placement(monkeypatch):
    monkeypatch.setattr(results, "_placement", None)


def test_machine_record_says_shared_until_a_stack_records_its_placement(no_recorded_placement, tmp_path):
    import os
    from kvtb.placement import format_cpus
    everything = format_cpus(os.sched_getaffinity(0))
    result = results.new_result("ttft", {})
    assert result["machine"]["placement"] == {
        "name": "shared", "torch_threads": None,
        "cpus": {s: everything for s in ("storage", "smartnic", "compute", "frontend")}}
    results.record_placement("nic", {"storage": (1,), "smartnic": "1", "compute": [0], "frontend": (1,)},
                             torch_threads=1)
    args = argparse.Namespace(out=tmp_path, json=False)
    results.finish(args, result, "table")  # the Stack started after new_result: finish says its placement
    written = json.loads((tmp_path / "results.json").read_text())["machine"]["placement"]
    assert written == {"name": "nic", "torch_threads": 1,
                       "cpus": {"storage": "1", "smartnic": "1", "compute": "0", "frontend": "1"}}
    assert results.machine_info()["placement"]["name"] == "nic"


def test_stack_passes_its_placement_to_the_deployment(tmp_path):
    from bench.stack import Stack, bench_config
    stack = Stack(tmp_path, bench_config(), placement="nic")
    assert stack.placement == "nic" and stack.deployment.placement == "nic"
    assert Stack(tmp_path, bench_config()).deployment.placement == "shared"


def test_stack_records_each_services_announced_cpus(tmp_path):
    from bench.stack import Stack, bench_config
    from kvtb.launch import ServiceProcess
    stack = Stack(tmp_path, bench_config(), placement="nic")
    for name, cpus in (("storage-0", "1"), ("smartnic", "1"), ("compute", "0"), ("frontend", "1")):
        proc = ServiceProcess(name, [], "/dev/null")
        proc.ready = {"cpus": cpus}
        stack.deployment.procs.append(proc)
    assert stack.service_cpus() == {"storage": "1", "smartnic": "1", "compute": "0", "frontend": "1"}
