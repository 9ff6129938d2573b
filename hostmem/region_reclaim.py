"""Reclaim the shared-memory regions of owners that died (kill -9 leaves the name in /dev/shm).

A region's name ends in its creator's pid (`kvtb-<node>-<pid>`), and its creator holds an advisory
`flock` on it until it closes the region (hostmem.region). A region is abandoned when:

- its lock can be taken (no process holds it: the creator is gone), and
- the pid in its name is not the creator still making it (between its create and its lock): that pid
  is dead, or it is a later process that reuses the pid (it started after the region was made).

Only regular files of this user whose name is PREFIX followed by digits are looked at.
"""
from __future__ import annotations

import fcntl
import logging
import os
import stat
from pathlib import Path

from hostmem import region

logger = logging.getLogger(__name__)

# /proc's boot time has a resolution of 1 s: a process that started this close to the region's making
# is taken as its maker
START_SLACK_S = 2.0


def _boot_time() -> float:
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise OSError("no btime in /proc/stat")


def started_at(pid: int) -> float | None:
    """When process pid started (epoch seconds); None where /proc cannot tell."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(text[text.rindex(")") + 2:].split()[19])  # field 22, starttime
        return _boot_time() + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def maker_alive(pid: int, made_at: float) -> bool:
    """Whether pid may be the live process that made a file at `made_at` (epoch seconds). Never this
    process: it reclaims before it makes its own region, so a name with its pid is a dead process's
    (in a container a restarted node gets the same pid, often within a second)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    started = started_at(pid)
    return started is None or started <= made_at + START_SLACK_S


def _unlink_if_abandoned(path: Path, pid: int) -> bool:
    """Unlink path if its region is abandoned (see the module); whether it did."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # gone, another user's, a link
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its owner lives
        if maker_alive(pid, st.st_mtime):
            return False
        try:
            if os.stat(path, follow_symlinks=False).st_ino != st.st_ino:
                return False  # replaced meanwhile
            path.unlink()
        except FileNotFoundError:
            return False
        return True
    finally:
        os.close(fd)  # drops our lock


def reclaim_abandoned(prefix: str, directory: str | os.PathLike | None = None) -> list[str]:
    """Unlink every abandoned region named PREFIX<pid> in directory (region.SHM_DIR by default); their
    names."""
    if not prefix or "/" in prefix:
        raise ValueError(f"invalid region name prefix {prefix!r}")
    directory = Path(directory if directory is not None else region.SHM_DIR)
    reclaimed = []
    try:
        entries = sorted(os.listdir(directory))
    except OSError as exc:
        logger.warning("cannot list %s to reclaim abandoned regions: %s", directory, exc)
        return []
    for name in entries:
        tail = name[len(prefix):]
        if not name.startswith(prefix) or not (tail.isascii() and tail.isdigit()):
            continue
        if _unlink_if_abandoned(directory / name, int(tail)):
            reclaimed.append(name)
    return reclaimed
