"""What machine a benchmark ran on: CPU, cores, memory, Python and library versions, git commit."""
from __future__ import annotations

import datetime
import importlib.metadata
import logging
import os
import platform
import subprocess
from pathlib import Path

from hostmem import dma

logger = logging.getLogger(__name__)

REPO_DIR = Path(__file__).resolve().parents[2]


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU's model name from /proc/cpuinfo (or platform.processor())."""
    text = cpuinfo if cpuinfo is not None else _read("/proc/cpuinfo")
    for line in text.splitlines():
        if line.lower().startswith("model name") and ":" in line:
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def physical_cores(cpuinfo: str | None = None) -> int | None:
    """Distinct (physical id, core id) pairs in /proc/cpuinfo; None when unknown."""
    text = cpuinfo if cpuinfo is not None else _read("/proc/cpuinfo")
    cores, phys = set(), "0"
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "physical id":
            phys = value.strip()
        elif key.strip() == "core id":
            cores.add((phys, value.strip()))
    return len(cores) or None


def memory_bytes(meminfo: str | None = None) -> int | None:
    """MemTotal from /proc/meminfo in bytes; None when unknown."""
    text = meminfo if meminfo is not None else _read("/proc/meminfo")
    for line in text.splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    return None


def package_version(name: str) -> str | None:
    """Installed version of a distribution, without importing it (torch is slow to import)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def git_commit(repo_dir: Path = REPO_DIR) -> str | None:
    """HEAD's commit hash, with '-dirty' if tracked files changed; None outside a checkout."""
    try:
        head = _git(repo_dir, "rev-parse", "HEAD")
        dirty = _git(repo_dir, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("-dirty" if dirty else "")


def machine_info(repo_dir: Path = REPO_DIR) -> dict:
    """Everything a report says about where it ran."""
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "cores_logical": os.cpu_count(),
        "cores_physical": physical_cores(),
        "memory_bytes": memory_bytes(),
        "python": platform.python_version(),
        "torch": package_version("torch"),
        "numpy": package_version("numpy"),
        "pyzmq": package_version("pyzmq"),
        "dma_engine": dma.ENGINE,  # the data path's copy engine: "compiled" or "numpy"
        "git_commit": git_commit(repo_dir),
        "time_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def _git(repo_dir: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo_dir), *args], capture_output=True, text=True,
                         check=True, timeout=10)
    return out.stdout.strip()
