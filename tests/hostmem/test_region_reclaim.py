"""A compute node's region that a kill -9 left in /dev/shm is reclaimed at the next start; a live owner's
region is never touched; the region is 0600 whatever the umask.

The owners are real processes that create the region by the compute node's name (ComputeSettings.shm_name).
"""
from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import pytest

from compute_node.settings import ComputeSettings
from hostmem import region
from hostmem.region import Region
from hostmem.region_reclaim import reclaim_abandoned

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

SIZE = 1 << 20
OWNER = f"""
import sys, time
from compute_node.settings import ComputeSettings
from hostmem.region import Region
r = Region.create(ComputeSettings(node_name=sys.argv[1]).shm_name, {SIZE}, 0, 4)
r.write(4096, b"x" * 65536)  # resident pages, as a pool has
print(r.name, flush=True)
time.sleep(120)
"""


@pytest.fixture
def node_name():
    """A node name of this test's own; whatever it leaves in /dev/shm is removed."""
    name = f"reclaimtest{os.getpid()}x{time.monotonic_ns()}"
    yield name
    for entry in os.listdir(region.SHM_DIR):
        if entry.startswith(f"kvtb-{name}-"):
            os.unlink(region.SHM_DIR / entry)


def start_owner(node_name: str, umask: int = 0o022) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-c", OWNER, node_name], stdout=subprocess.PIPE, umask=umask)
    name = proc.stdout.readline().decode().strip()
    assert name, "the owner did not create its region"
    return proc, name


def test_a_region_killed_with_its_owner_is_reclaimed_and_a_live_ones_is_not(node_name):
    prefix = ComputeSettings(node_name=node_name).shm_prefix
    live, live_name = start_owner(node_name)
    dead, dead_name = start_owner(node_name)
    try:
        dead.send_signal(signal.SIGKILL)
        dead.wait()
        assert (region.SHM_DIR / dead_name).exists()  # what the issue saw: nothing removes it
        assert reclaim_abandoned(prefix) == [dead_name]
        assert not (region.SHM_DIR / dead_name).exists()
        assert (region.SHM_DIR / live_name).exists()
        assert reclaim_abandoned(prefix) == []  # the live owner's, again
        attached = Region.attach(live_name, SIZE, 0, 4)  # still whole
        assert bytes(attached.view(4096, 4)) == b"xxxx"
        attached.close()
    finally:
        live.send_signal(signal.SIGKILL)
        live.wait()
    assert reclaim_abandoned(prefix) == [live_name]


def test_the_region_is_its_owners_only_under_umask_022(node_name):
    proc, name = start_owner(node_name, umask=0o022)
    try:
        assert stat.S_IMODE(os.stat(region.SHM_DIR / name).st_mode) == 0o600
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait()


def test_an_unlocked_region_of_a_live_maker_is_left_but_of_a_reused_pid_is_reclaimed(node_name):
    """Between its create and its lock a maker holds no lock: its pid (alive, started before the file)
    keeps it. A pid that a later process reuses (started after the file was made) does not."""
    prefix = ComputeSettings(node_name=node_name).shm_prefix
    maker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        time.sleep(0.2)
        path = region.SHM_DIR / f"{prefix}{maker.pid}"
        path.write_bytes(b"\0" * 4096)  # made now, while the maker lives, and not locked
        assert reclaim_abandoned(prefix) == []
        hour_ago = time.time() - 3600  # the maker started less than an hour ago: as if its pid was reused
        os.utime(path, (hour_ago, hour_ago))
        assert reclaim_abandoned(prefix) == [path.name]
        assert not path.exists()
    finally:
        maker.kill()
        maker.wait()


def test_a_region_with_this_processs_own_pid_is_reclaimed_however_fresh(node_name):
    """A restarted container's node often gets its dead predecessor's pid within a second: the name it
    is about to create is an abandoned region, whatever its time, unless this process holds it."""
    prefix = ComputeSettings(node_name=node_name).shm_prefix
    path = region.SHM_DIR / f"{prefix}{os.getpid()}"
    path.write_bytes(b"\0" * 4096)  # made just now, not locked
    assert reclaim_abandoned(prefix) == [path.name]
    held = Region.create(path.name, 4096, 0, 1)  # this process's own, locked: never reclaimed
    try:
        assert reclaim_abandoned(prefix) == []
        assert path.exists()
    finally:
        held.close()


def test_only_this_nodes_names_are_looked_at(node_name, tmp_path):
    prefix = ComputeSettings(node_name=node_name).shm_prefix
    others = [f"{prefix}1-2", f"{prefix}x", f"kvtb-{node_name}0-999999999", f"{prefix}"]
    for name in others:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / f"{prefix}999999999").symlink_to(tmp_path / others[0])
    assert reclaim_abandoned(prefix, tmp_path) == []
    assert sorted(os.listdir(tmp_path)) == sorted([*others, f"{prefix}999999999"])
    (tmp_path / f"{prefix}999999998").write_bytes(b"")  # a dead pid's: reclaimed
    assert reclaim_abandoned(prefix, tmp_path) == [f"{prefix}999999998"]
    with pytest.raises(ValueError):
        reclaim_abandoned("a/b", tmp_path)


def test_close_unlinks_and_releases_the_lock(node_name):
    name = ComputeSettings(node_name=node_name).shm_name
    r = Region.create(name, SIZE, 0, 4)
    assert reclaim_abandoned(ComputeSettings(node_name=node_name).shm_prefix) == []  # our own, locked
    r.close()
    assert not (region.SHM_DIR / name).exists()
    r.close()  # twice is harmless
