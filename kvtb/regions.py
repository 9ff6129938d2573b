"""The shared-memory regions a service made, removed by whoever started it once the service is dead.

A compute node's KV pool is a file in /dev/shm (or $KVTB_SHM_DIR), `kvtb-<node>-<pid>`; a node that
stops cleanly removes it, one killed with -9 cannot. The service names it in its ready line
(`"regions": [path, ...]`) and `kvtb up` knows the node name and pid it started, so `kvtb up` removes
it when the process is dead, before starting it again, and when it stops.

Only a regular file of this user directly in the shared-memory directory, named `kvtb-...-<pid>` with the
pid of the dead process, is ever removed: a path from a ready line is a claim, not an order. The ground
floor: this module imports no service (hostmem names its regions the same way).
"""
from __future__ import annotations

import logging
import os
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

logger = logging.getLogger(__name__)

PREFIX = "kvtb-"
DEFAULT_SHM_DIR = "/dev/shm"


def shm_dir(environ: Mapping[str, str] = os.environ) -> Path:
    """Where a process of this environment makes its regions (hostmem.region.SHM_DIR's rule)."""
    return Path(environ.get("KVTB_SHM_DIR") or DEFAULT_SHM_DIR)


def region_path(node_name: str, pid: int, environ: Mapping[str, str] = os.environ) -> Path:
    """The compute node `node_name`'s region when its process is `pid` (compute settings' shm_name)."""
    return shm_dir(environ) / f"{PREFIX}{node_name}-{pid}"


def removable(path: str | os.PathLike, pid: int, directory: str | os.PathLike) -> bool:
    """Whether path names a region of process pid in directory (by name only: see remove_dead)."""
    path = Path(path)
    name = path.name
    return (isinstance(pid, int) and pid > 0 and path.parent == Path(directory)
            and name.startswith(PREFIX) and name.endswith(f"-{pid}") and len(name) > len(PREFIX) + len(f"-{pid}"))


def remove_dead(paths: Iterable[str | os.PathLike], pid: int, directory: str | os.PathLike) -> list[str]:
    """Unlink each of paths that is a region of the dead process pid (removable, a regular file of this
    user, no link); the ones removed. The caller knows pid is dead (it reaped it)."""
    removed = []
    for path in dict.fromkeys(str(p) for p in paths):
        if not removable(path, pid, directory):
            logger.warning("not removing %s: not a region of process %d in %s", path, pid, directory)
            continue
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                logger.warning("not removing %s: not a regular file of this user", path)
                continue
            os.unlink(path)
        except FileNotFoundError:
            continue  # removed already (the node stopped cleanly, or a new one reclaimed it)
        except OSError as exc:
            logger.warning("cannot remove the region %s: %s", path, exc)
            continue
        removed.append(path)
    return removed
