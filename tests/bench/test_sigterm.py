"""A benchmark stopped by SIGTERM stops every service it started, and passes the termination on to
a child process (bench.results.stop_on_sigterm, run_child)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvtb.launch import kvtb_argv

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)


def descendants(pid: int) -> dict[int, str]:
    """pid -> command line of every live process below pid (from /proc; zombies left out)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = {}, [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out[child] = cmdline(child)
            todo.append(child)
    return out


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def alive(pid: int, command: str) -> bool:
    """Still running the same command (not a zombie, not a reused pid)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and cmdline(pid) == command


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def terminate_when_serving(argv: list[str], tmp_path: Path, services: int, timeout_s: float) -> None:
    """Run a benchmark; once `services` of its descendants serve, SIGTERM it (as `timeout` does)
    and assert that it exits 143 and that none of the processes below it is alive afterwards."""
    bench = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env={**os.environ, "TMPDIR": str(tmp_path)})

    def serving() -> dict[int, str] | None:
        found = descendants(bench.pid)
        return found if sum("serve" in c for c in found.values()) >= services else None
    try:
        wait_for(serving, timeout_s, "the services to start")
        time.sleep(1.0)  # in the middle of its work
        started = descendants(bench.pid)  # the services, and any child between them and the benchmark
        bench.send_signal(signal.SIGTERM)
        code = bench.wait(60)
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
    left = {p: c for p, c in started.items() if alive(p, c)}
    for pid in left:  # leave nothing behind, whatever the outcome
        os.kill(pid, signal.SIGKILL)
    assert left == {}, f"still running after SIGTERM: {left}"
    assert code == 128 + signal.SIGTERM, bench.stderr.read()[-2000:]


@pytest.mark.slow
def test_sigterm_stops_the_services_a_benchmark_started(tmp_path):
    """`kvtb bench storage` (a real storage node process) killed while it runs."""
    argv = kvtb_argv("bench", "storage", "--json", "--out", str(tmp_path / "out"), "--rounds", "50")
    terminate_when_serving(argv, tmp_path, services=1, timeout_s=60)


@pytest.mark.slow
def test_sigterm_reaches_bench_offloads_child_and_its_services(tmp_path):
    """`kvtb bench offload` (a child process per block size, which starts a storage node and the
    agent) killed as `timeout` killed it: its child and their services all stop."""
    terminate_when_serving(kvtb_argv("bench", "offload", "--smoke", "--json", "--out", str(tmp_path / "out")),
                           tmp_path, services=2, timeout_s=300)


CHILD = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from bench.results import stop_on_sigterm
    with stop_on_sigterm():
        try:
            Path(sys.argv[1]).write_text("started")
            time.sleep(60)
        finally:
            Path(sys.argv[1]).write_text("stopped")  # as a `with` block stops its services
""")

PARENT = textwrap.dedent("""
    import sys
    from bench.results import run_child, stop_on_sigterm
    with stop_on_sigterm():
        run_child([sys.executable, "-c", sys.argv[1], sys.argv[2]], timeout_s=60)
""")


@pytest.mark.parametrize("how", ["sigterm", "timeout"])
def test_a_stopped_parent_or_a_timeout_passes_sigterm_on_to_its_child(tmp_path, how):
    marker = tmp_path / "child"
    if how == "timeout":
        from bench.results import run_child
        with pytest.raises(subprocess.TimeoutExpired):
            run_child([sys.executable, "-c", CHILD, str(marker)], timeout_s=3)
        assert marker.read_text() == "stopped"
        return
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD, str(marker)])
    try:
        wait_for(lambda: marker.exists() and marker.read_text() == "started", 30, "the child to start")
        parent.send_signal(signal.SIGTERM)
        assert parent.wait(30) == 128 + signal.SIGTERM
    finally:
        if parent.poll() is None:
            parent.kill()
    assert marker.read_text() == "stopped"  # the child was told, and stopped cleanly
