from __future__ import annotations

import io
import json

from kvtb.bench import output
from kvtb.bench.machine import cpu_model, machine_info, memory_bytes, physical_cores
from kvtb.bench.progress import Progress

CPUINFO = """processor : 0
model name : Test CPU @ 1GHz
physical id : 0
core id : 0
processor : 1
model name : Test CPU @ 1GHz
physical id : 0
core id : 1
processor : 2
physical id : 0
core id : 1
"""


def test_write_and_emit_json(tmp_path):
    path = output.write_json(tmp_path / "out", "raw.json", {"x": 1.5, "bad": float("inf")})
    assert json.loads(path.read_text()) == {"x": 1.5, "bad": "inf"}
    buf = io.StringIO()
    output.emit_json({"ratios": {"a": 2.0}}, buf)
    assert buf.getvalue().count("\n") == 1 and json.loads(buf.getvalue())["ratios"]["a"] == 2.0


def test_format_table_aligns():
    text = output.format_table(["size", "time_s"], [["32 KiB", 0.5], ["5 TiB", 1234.5678]])
    lines = text.splitlines()
    assert lines[0].startswith("size") and set(lines[1]) <= {"-", " "}
    assert lines[2].endswith("0.5") and lines[3].endswith("1235")
    assert len(lines[2]) == len(lines[3])


def test_format_units():
    assert output.format_bytes(32768) == "32 KiB"
    assert output.format_bytes(5 * 2**40) == "5 TiB"
    assert output.format_seconds(3.3e-3) == "3.3 ms"
    assert output.format_seconds(1.7e-6) == "1.7 us"


def test_plot_lines_writes_png(tmp_path):
    path = output.plot_lines(tmp_path / "p.png", {"a": ([1, 10, 100], [1, 2, 3])}, title="t",
                             xlabel="x", ylabel="y", logx=True, hlines={"goal": 2.0})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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


def test_machine_info_parsing():
    assert cpu_model(CPUINFO) == "Test CPU @ 1GHz"
    assert physical_cores(CPUINFO) == 2
    assert memory_bytes("MemTotal:       1024 kB\n") == 1024 * 1024
    info = machine_info()
    assert info["cores_logical"] >= 1 and info["python"]
    assert info["dma_engine"] in ("compiled", "numpy")
