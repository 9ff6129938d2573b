"""The compute node reclaims, at its start, the region a kill -9 of an earlier node of its name left in
/dev/shm; its own region is 0600 and goes with it at stop."""
from __future__ import annotations

import pytest

import os
import signal
import stat
import subprocess
import sys

from compute_node.settings import ComputeSettings
from hostmem import region

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

OWNER = """
import sys, time
from compute_node.settings import ComputeSettings
from hostmem.region import Region
r = Region.create(ComputeSettings(node_name=sys.argv[1]).shm_name, 1 << 20, 0, 4)
print(r.name, flush=True)
time.sleep(120)
"""


def test_a_node_reclaims_the_region_a_killed_node_of_its_name_left(make_node):
    node_name = f"regiontest{os.getpid()}"
    crashed = subprocess.Popen([sys.executable, "-c", OWNER, node_name], stdout=subprocess.PIPE)
    stale = region.SHM_DIR / crashed.stdout.readline().decode().strip()
    crashed.send_signal(signal.SIGKILL)
    crashed.wait()
    assert stale.exists()
    old = os.umask(0o022)
    try:
        node = make_node(node_name=node_name)
    finally:
        os.umask(old)
    own = region.SHM_DIR / ComputeSettings(node_name=node_name).shm_name
    try:
        assert not stale.exists()
        assert stat.S_IMODE(os.stat(own).st_mode) == 0o600
    finally:
        stale.unlink(missing_ok=True)
    node.stop()
    assert not own.exists()
