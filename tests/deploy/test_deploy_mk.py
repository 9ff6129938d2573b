"""`make up`'s own path, read by make alone (`make -n`: nothing is built, no Docker needed): it installs
what it runs before any build, refuses bad arguments before any build, and stops the services of
profiles it no longer names."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.service, pytest.mark.skipif(shutil.which("make") is None, reason="needs make")]


def dry_run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-n", "--no-print-directory", "-C", str(ROOT), "up", *args],
                          capture_output=True, text=True, timeout=60)


def test_on_a_clone_without_a_venv_up_installs_before_it_builds(tmp_path):
    venv = tmp_path / "venv"   # no such venv yet: as on a fresh clone
    done = dry_run(f"VENV={venv}", "REPLICAS=2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    made = next(i for i, line in enumerate(lines) if f"-m venv {venv}" in line)
    installed = next(i for i, line in enumerate(lines) if "pip install" in line and "-e" in line)
    built = next(i for i, line in enumerate(lines) if "docker build" in line)
    placed = next(i for i, line in enumerate(lines) if "deploy/placement.py shared --replicas 2" in line)
    assert made < installed < built < placed


@pytest.mark.parametrize("bad, says", [("REPLICAS=3", "REPLICAS=3: 1 or 2"), ("REPLICAS=", "REPLICAS=: 1 or 2"),
                                       ("PLACEMENT=bogus", "PLACEMENT=bogus: shared, nic")])
def test_a_bad_argument_is_refused_before_anything_runs(bad, says):
    done = dry_run(bad)
    assert done.returncode != 0 and says in done.stderr
    assert "docker" not in done.stdout and "pip" not in done.stdout


def test_one_replica_stops_the_second_pair_and_prometheus():
    one = dry_run("REPLICAS=1").stdout
    assert "rm -s -f compute1 smartnic1 prometheus" in one and "up -d --remove-orphans" in one
    two = dry_run("REPLICAS=2", "MONITORING=1").stdout
    assert " rm -s -f" not in two and "COMPOSE_PROFILES=replicas,monitoring" in two
