"""Where every benchmark's result goes: its options, its JSON, its tables and plots, its output.

A result is one JSON object: `bench`, `machine` (where it ran), `settings`, `results`, `ratios`
(each comparing figures measured side by side in the same run), `failed` (each part, such as a
level or a size, that raised: {part, error}, never dropped silently), `plots` and, where a
benchmark sets one, `floors`. `finish` writes it to OUT/results.json and prints it as one JSON line
(--json) or as the benchmark's own tables with the failures under them. Plots need matplotlib, the
optional `bench` extra.

A benchmark stopped by SIGTERM (`timeout`, a supervisor) stops every service it started:
`run_bench` runs it under `stop_on_sigterm` (SIGTERM raises SystemExit, so every `with` block
that started services stops them), and `run_child` passes the termination on to a child process.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import gzip
import importlib.metadata
import importlib.util
import json
import logging
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

from bench.progress import Progress

logger = logging.getLogger(__name__)

REPO_DIR = Path(__file__).resolve().parents[1]


# -- options and the result's skeleton -------------------------------------------------------------

def add_common_args(parser: argparse.ArgumentParser, bench_name: str) -> argparse.ArgumentParser:
    """--json, --out DIR (default out/<name>), --smoke (tiny sizes) and --keep-data."""
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--out", type=Path, default=Path("out") / bench_name,
                        help=f"output directory (default out/{bench_name})")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: checks the benchmark runs")
    parser.add_argument("--keep-data", action="store_true",
                        help="keep the services' data and logs in OUT/services (default: a temp dir)")
    return parser


def new_result(bench_name: str, settings: dict[str, Any]) -> dict[str, Any]:
    """The skeleton of a benchmark's JSON: bench, machine, settings, results and ratios to fill in."""
    return {"bench": bench_name, "machine": machine_info(), "settings": dict(settings),
            "results": {}, "ratios": {}, "failed": []}


def fail(result: dict[str, Any], part: str, exc: BaseException) -> dict[str, str]:
    """Record that `part` (a level, a size, a workload) failed: {part, error} in result["failed"]."""
    entry = {"part": part, "error": f"{type(exc).__name__}: {exc}"}
    logger.error("%s: %s failed: %s", result.get("bench", "bench"), part, entry["error"])
    result.setdefault("failed", []).append(entry)
    return entry


def run_part(result: dict[str, Any], part: str, fn: Callable[[], Any]) -> Any:
    """fn(), or None after recording its failure in result["failed"] (an Exception only:
    KeyboardInterrupt and SystemExit, a SIGTERM under stop_on_sigterm, go on up)."""
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a failed part is reported with its error, never dropped
        fail(result, part, exc)
        return None


def failure_of(result: dict[str, Any], part: str) -> str | None:
    """The error recorded for `part`, or None."""
    return next((f["error"] for f in result.get("failed") or [] if f["part"] == part), None)


def failed_text(result: dict[str, Any]) -> str:
    """The failed parts, one line each ('' when none failed)."""
    return "\n".join(f"FAILED {f['part']}: {f['error']}" for f in result.get("failed") or [])


def floors(ratios: dict[str, float], wanted: dict[str, float],
           at_most: dict[str, float] | None = None) -> dict[str, dict]:
    """Each floor (a ratio at least this) or ceiling (`at_most`: at most this) whose ratio was
    measured: {ratio: {floor or ceiling, value, met}}."""
    out = {key: {"floor": floor, "value": ratios[key], "met": ratios[key] >= floor}
           for key, floor in wanted.items() if key in ratios}
    out.update({key: {"ceiling": ceiling, "value": ratios[key], "met": ratios[key] <= ceiling}
                for key, ceiling in (at_most or {}).items() if key in ratios})
    return out


def progress_for(args: argparse.Namespace, total: int, label: str) -> Progress:
    """A progress bar that stays silent with --json or when stderr is not a TTY."""
    return Progress(total, label, enabled=not getattr(args, "json", False))


def services_dir(args: argparse.Namespace, label: str) -> Path:
    """Where a run's services keep data and logs: OUT/services/LABEL (--keep-data), or a fresh temp dir."""
    if getattr(args, "keep_data", False):
        path = Path(args.out) / "services" / label
        path.mkdir(parents=True, exist_ok=True)
        return path
    return Path(tempfile.mkdtemp(prefix=f"kvtb-bench-{label}-"))


@contextlib.contextmanager
def data_dir(args: argparse.Namespace, label: str) -> Iterator[Path]:
    """services_dir for a run that starts its services itself: a temp dir is removed at the end,
    unless the run failed (its logs are kept to look at)."""
    path = services_dir(args, label)
    try:
        yield path
    except BaseException:
        logger.warning("the services' files are kept in %s", path)
        raise
    if not getattr(args, "keep_data", False):
        shutil.rmtree(path, ignore_errors=True)


# The placement the run's services ran in (kvtb.placement): set by bench.stack.Stack when it starts
# them; a run that starts none that way runs its services unpinned, as `shared` places them.
_placement: dict[str, Any] | None = None


def record_placement(name: str, cpus: dict[str, Any], torch_threads: int | None = None) -> None:
    """Say that this run's services run in placement `name`: service -> its CPUs (a CPU list or
    numbers), and the compute node's torch threads where known."""
    from kvtb.placement import format_cpus
    global _placement
    _placement = {"name": name,
                  "cpus": {service: c if isinstance(c, str) else format_cpus(c) for service, c in cpus.items()},
                  "torch_threads": torch_threads}


def recorded_placement() -> dict[str, Any] | None:
    """What record_placement said last (a copy), or None since forget_placement."""
    return None if _placement is None else {**_placement, "cpus": dict(_placement["cpus"])}


def forget_placement() -> None:
    """Before a run's next Stack (bench.placements: one per placement): nothing recorded yet."""
    global _placement
    _placement = None


def placement_info() -> dict[str, Any]:
    """The placement record: what record_placement said, else shared on this process's CPUs."""
    if _placement is not None:
        return {**_placement, "cpus": dict(_placement["cpus"])}
    from kvtb.placement import formatted, plan
    return {"name": "shared", "cpus": formatted(plan("shared")), "torch_threads": None}


def machine_info() -> dict[str, Any]:
    """Where a result was measured: CPU, cores, memory, versions, copy engine, commit, time, load,
    and the placement its services ran in."""
    from hostmem import dma

    return {"cpu_model": _proc_field("/proc/cpuinfo", "model name") or platform.processor(),
            "cores": os.cpu_count(), "memory_bytes": _memory_bytes(), "platform": platform.platform(),
            "python": platform.python_version(),
            **{name: _version(name) for name in ("torch", "numpy", "pyzmq")},
            "dma_engine": dma.ENGINE,  # the data path's copy engine: "compiled" or "numpy"
            # the compute node's decode attention: the compiled kernel when built (unless a setting
            # turns it off), else torch over gathered blocks; found without importing torch
            "attention_kernel": importlib.util.find_spec("compute_node._attention") is not None,
            "git_commit": _git_commit(),
            "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_average_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
            "placement": placement_info()}


def _proc_field(path: str, key: str) -> str | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    return next((line.split(":", 1)[1].strip() for line in text.splitlines()
                 if line.startswith(key) and ":" in line), None)


def _memory_bytes() -> int | None:
    total = _proc_field("/proc/meminfo", "MemTotal")  # "16384 kB"
    return int(total.split()[0]) * 1024 if total else None


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)  # without importing it (torch is slow to import)
    except importlib.metadata.PackageNotFoundError:
        return None


def _git_commit() -> str | None:
    """HEAD's commit, with '-dirty' if tracked files changed; None outside a checkout."""
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(REPO_DIR), *args], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()
    try:
        return git("rev-parse", "HEAD") + ("-dirty" if git("status", "--porcelain", "-uno") else "")
    except (OSError, subprocess.SubprocessError):
        return None


# -- JSON --------------------------------------------------------------------------------------------

def _jsonable(obj: Any) -> Any:
    """Make floats JSON-safe (inf and nan become strings) and numpy scalars plain."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalar
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    return obj


def dumps(obj: Any, indent: int | None = None) -> str:
    """JSON text of obj, with inf/nan as strings so every reader can parse it."""
    return json.dumps(_jsonable(obj), indent=indent)


def write_json(out_dir: str | Path, name: str, obj: Any) -> Path:
    """Write obj as indented JSON to out_dir/name (directories created); return the path. A name ending
    in .gz is gzipped compact JSON (a run's raw results, kept in git ten times smaller)."""
    path = Path(out_dir) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".gz":
        path.write_bytes(gzip.compress((dumps(obj) + "\n").encode(), mtime=0))
        logger.info("wrote %s", path)
        return path
    path.write_text(dumps(obj, indent=2) + "\n")
    logger.info("wrote %s", path)
    return path


def read_json(path: str | Path) -> Any:
    """The JSON at path, or at path.gz (write_json's compressed form) when path is missing; OSError when
    neither is there, ValueError when it is not JSON."""
    path = Path(path)
    if not path.exists() and path.with_name(path.name + ".gz").exists():
        path = path.with_name(path.name + ".gz")
    raw = path.read_bytes()
    return json.loads(gzip.decompress(raw) if path.suffix == ".gz" else raw)


def emit_json(obj: Any, stream: TextIO | None = None) -> None:
    """Print obj as one JSON object on one line (the `--json` output of every command)."""
    out = stream or sys.stdout
    out.write(dumps(obj) + "\n")
    out.flush()


# -- text ----------------------------------------------------------------------------------------------

def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain-text table: columns padded, numbers right-aligned, a dashed rule under the header."""
    cells = [[f"{v:.4g}" if isinstance(v, float) else str(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(row[i]) for row in cells)]) for i, h in enumerate(headers)]
    numeric = [bool(rows) and all(_is_number(row[i]) for row in rows) for i in range(len(headers))]

    def line(values: Sequence[str]) -> str:
        cells = (v.rjust(w) if num else v.ljust(w) for v, w, num in zip(values, widths, numeric))
        return "  ".join(cells).rstrip()

    return "\n".join([line(list(headers)), "  ".join("-" * w for w in widths), *map(line, cells)])


def _is_number(v: Any) -> bool:
    if isinstance(v, str):  # pre-formatted numbers such as "1.000" or "+3.2%" align right too
        try:
            float(v.rstrip("%x"))
        except ValueError:
            return False
        return True
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def format_bytes(num_bytes: float) -> str:
    """Binary units: 32768 -> '32 KiB', 5 * 2**40 -> '5 TiB'."""
    value = float(num_bytes)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024:
            return f"{value:.4g} {unit}"
        value /= 1024
    return f"{value:.4g} TiB"


def format_seconds(seconds: float) -> str:
    """Human time: 3.3e-3 -> '3.3 ms', 1.7e-6 -> '1.7 us', 3600.0 -> '3600 s'."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def ratios_text(ratios: dict[str, Any]) -> str:
    """One line per ratio, aligned."""
    width = max((len(k) for k in ratios), default=0)
    return "\n".join(f"{k.ljust(width)}  {v:.3g}" if isinstance(v, float) else f"{k.ljust(width)}  {v}"
                     for k, v in ratios.items())


# -- plots ---------------------------------------------------------------------------------------------

def plot_lines(path: str | Path, series: dict[str, tuple[Sequence[float], Sequence[float]]], *,
               title: str, xlabel: str, ylabel: str, logx: bool = False, logy: bool = False,
               hlines: dict[str, float] | None = None) -> Path | None:
    """Save a line plot (one line per series, optional labelled horizontal lines) as PNG.

    None, with a warning, when matplotlib (the `bench` extra) is not installed: the figures are
    in the JSON all the same.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        logger.warning("no plot %s: matplotlib is not installed (pip install -e '.[bench]')", Path(path).name)
        return None
    fig = Figure(figsize=(7, 4.5), dpi=120)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for label, (xs, ys) in series.items():
        ax.plot(list(xs), list(ys), marker="o", markersize=3, label=label)
    for label, y in (hlines or {}).items():
        ax.axhline(y, linestyle="--", linewidth=1, color="grey")
        ax.annotate(label, xy=(0.01, y), xycoords=("axes fraction", "data"), fontsize=8, color="grey")
    ax.set_xscale("log" if logx else "linear")
    ax.set_yscale("log" if logy else "linear")
    ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    logger.info("wrote %s", path)
    return path


def plots(*paths: Path | None) -> list[str]:
    """The plots that were drawn, as strings for the JSON."""
    return [str(p) for p in paths if p is not None]


# -- the end of every benchmark ---------------------------------------------------------------------

def setup_logging(args: argparse.Namespace) -> None:
    """Warnings only on stderr (the progress bar owns the line); INFO with KVTB_BENCH_VERBOSE."""
    level = logging.INFO if os.environ.get("KVTB_BENCH_VERBOSE") else logging.WARNING
    logging.basicConfig(level=level, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")


def finish(args: argparse.Namespace, result: dict[str, Any], text: str) -> Path:
    """Write OUT/results.json; print the result as one JSON line (--json) or the text tables, with
    the failed parts under them. The machine record's placement is the run's (its Stack started after
    new_result made the record); a list of them (bench.placements: one per placement) is kept."""
    if isinstance(result.get("machine"), dict) and not isinstance(result["machine"].get("placement"), list):
        result["machine"]["placement"] = placement_info()
    path = write_json(args.out, "results.json", result)
    if args.json:
        emit_json(result)
    else:
        print(text)
        if result.get("failed") and failed_text(result) not in text:  # unless the table shows them
            print(f"\n{failed_text(result)}")
        print(f"\nraw results: {path}")
        for plot in result.get("plots", []):
            print(f"plot: {plot}")
    return path


def run_bench(argv: list[str], parse_args: Callable, run: Callable, table: Callable) -> int:
    """The body of a benchmark's main: parse, set up logging, run (SIGTERM stops its services),
    write and print. Exit status 1 when a part failed (the result says which, with its error)."""
    args = parse_args(argv)
    setup_logging(args)
    with stop_on_sigterm():
        result = run(args)
    finish(args, result, table(result))
    return 1 if result.get("failed") else 0


# -- generated blocks in Markdown files --------------------------------------------------------------

def splice_between(text: str, block: str, start: str, end: str) -> str:
    """text with everything between the start and end markers replaced by block (ValueError without them)."""
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise ValueError(f"no {start!r} ... {end!r} block to replace")
    return pattern.sub(lambda _: f"{start}\n{block}\n{end}", text, count=1)


# -- stopping: SIGTERM stops the services, and children are told --------------------------------------

@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within it SIGTERM raises SystemExit(128 + 15) in the main thread, so that every `with` (and
    `finally`) that started services stops them: a benchmark killed by `timeout` leaves nothing
    running. (The services run in sessions of their own, so the signal reaches them only so.)
    Outside the main thread (where no handler can be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise SystemExit(128 + signum)
    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_child(argv: list[str], timeout_s: float,
              stop_timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    """Run argv to its end, its stdout and stderr captured (text), as subprocess.run does; but when
    it times out (subprocess.TimeoutExpired) or this process is stopped (SystemExit from SIGTERM,
    KeyboardInterrupt), the child gets SIGTERM, so that it stops its own services, and is waited
    for (SIGKILL after stop_timeout_s) before the exception goes on."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except BaseException:
        terminate(proc, stop_timeout_s)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def terminate(proc: subprocess.Popen, timeout_s: float) -> int | None:
    """SIGTERM to a child still running, then wait (SIGKILL after timeout_s); its exit code."""
    if proc.poll() is None:
        logger.warning("stopping child %d (%s)", proc.pid, " ".join(map(str, proc.args[:4])))
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    return proc.returncode
