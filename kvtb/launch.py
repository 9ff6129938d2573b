"""Start services as real processes and wait until they say they are ready.

A service announces readiness by printing one line on stdout:

    KVTB_READY {"service": "storage", "addresses": {"fabric": "tcp://127.0.0.1:5555", ...}}

(`announce_ready` below). Services bind to port 0 in tests, so the line is how a test,
`kvtb up` or a benchmark learns where each one listens. Everything else the process prints
goes to its log file.

Each service starts with umask 077 (kvtb.private) and its log is 0600: logs name users.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kvtb.private import PRIVATE_UMASK, open_private, private_dir

logger = logging.getLogger(__name__)

READY_PREFIX = "KVTB_READY "
# set by ServiceProcess(die_with_parent=True): the pid of the process that started the service, which
# `kvtb serve` asks the kernel to outlive by no more than a SIGTERM (die_with_parent_if_asked)
PARENT_ENV = "KVTB_DIE_WITH_PARENT"
_PR_SET_PDEATHSIG = 1


def parent_death_signal(sig: int) -> bool:
    """Linux: ask the kernel to send this process `sig` when the thread that started it ends; whether it could."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def die_with_parent_if_asked() -> None:
    """In a service started with die_with_parent: SIGTERM this process when the thread that started it ends
    (Linux's parent-death signal; so a benchmark or `kvtb up` killed with -9 leaves no service running), and
    exit now if that parent is gone already. The variable is taken out of the environment: a process this
    one starts has a parent of its own. Elsewhere than Linux: nothing."""
    parent = os.environ.pop(PARENT_ENV, "")
    if not parent or not parent_death_signal(signal.SIGTERM):
        return
    if str(os.getppid()) != parent:  # it died before the kernel was asked
        raise SystemExit(f"kvtb: the process that started this service ({parent}) is gone")


def _stopped(pid: int) -> bool:
    """Whether every thread of the process is stopped (True where /proc cannot tell)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True
    for tid in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] not in "Tt":
            return False
    return True


def cpu_seconds(pid: int) -> float | None:
    """CPU time a process has used so far (user + system, all its threads, s); None where /proc
    cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def announce_ready(service: str, addresses: dict[str, str], **extra: Any) -> None:
    """Print the ready line on stdout (the only line a service prints there)."""
    record = {"service": service, "addresses": addresses, "pid": os.getpid(), **extra}
    sys.stdout.write(READY_PREFIX + json.dumps(record) + "\n")
    sys.stdout.flush()


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (for a service that must keep a fixed address)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def kvtb_argv(*args: str) -> list[str]:
    """argv that runs `kvtb ARGS` with this interpreter (works without the console script)."""
    return [sys.executable, "-m", "kvtb.cli", *args]


class ServiceProcess:
    """One service running as a child process.

    Not thread-safe: one owner starts and stops it. The process is put in its own session so
    that SIGSTOP/SIGKILL hit only it. die_with_parent: a `kvtb serve` service gets SIGTERM when the
    thread that started it ends (start it from a thread that lives as long as it should: the main one).
    """

    def __init__(self, name: str, argv: list[str], log_path: str | os.PathLike,
                 env: dict[str, str] | None = None, cwd: str | os.PathLike | None = None,
                 die_with_parent: bool = False):
        self.name = name
        self.argv = argv
        self.log_path = Path(log_path)
        self.env = {**os.environ, **(env or {})}
        self.env.pop(PARENT_ENV, None)
        if die_with_parent:
            self.env[PARENT_ENV] = str(os.getpid())
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None
        self.ready: dict[str, Any] = {}
        self._ready_event = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def addresses(self) -> dict[str, str]:
        return self.ready.get("addresses", {})

    def start(self, timeout_s: float = 180.0) -> dict[str, Any]:
        """Start the process and block until its ready line (or raise with its log's tail)."""
        private_dir(self.log_path.parent, narrow=False)
        log = open_private(self.log_path, "ab")
        self._ready_event.clear()
        self.ready = {}
        self.proc = subprocess.Popen(
            self.argv, stdout=subprocess.PIPE, stderr=log, env=self.env, cwd=self.cwd,
            start_new_session=True, umask=PRIVATE_UMASK,
        )
        log.close()
        self._reader = threading.Thread(target=self._read_stdout, daemon=True,
                                        name=f"{self.name}-stdout")
        self._reader.start()
        deadline = time.monotonic() + timeout_s
        while not self._ready_event.wait(0.05):
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode} before it was "
                                   f"ready; log {self.log_path}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"{self.name} not ready after {timeout_s:.0f} s; "
                                   f"log {self.log_path}:\n{self.log_tail()}")
        return self.ready

    def _read_stdout(self) -> None:
        if self.proc is None or self.proc.stdout is None:
            raise RuntimeError(f"{self.name}: no process to read")
        with open_private(self.log_path, "ab") as log:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                if line.startswith(READY_PREFIX) and not self._ready_event.is_set():
                    self.ready = json.loads(line[len(READY_PREFIX):])
                    self._ready_event.set()
                log.write(raw)
                log.flush()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, sig)

    def cpu_seconds(self) -> float | None:
        """CPU time the process has used so far (s); None before start or where /proc cannot tell."""
        return None if self.proc is None else cpu_seconds(self.proc.pid)

    def pause(self, timeout_s: float = 5.0) -> None:
        """SIGSTOP, and wait until every thread of the process has stopped: a thread inside a system
        call (an fsync) stops only when it returns, and until then the process may still answer."""
        self.signal(signal.SIGSTOP)
        if self.proc is None:
            return
        deadline = time.monotonic() + timeout_s
        while not _stopped(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.001)

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.proc is None:
            return
        self.signal(signal.SIGKILL)  # first: a paused process must not run (and answer) before it dies
        self.signal(signal.SIGCONT)
        self.proc.wait()

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after timeout_s; return the exit code."""
        if self.proc is None:
            return None
        if self.alive():
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                logger.warning("%s did not stop within %.0f s; killing it", self.name, timeout_s)
                self.kill()
        return self.proc.returncode

    def __enter__(self) -> ServiceProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
