"""kvtb.regions: only a dead process's own region in the shared-memory directory is ever removed."""
import os
from pathlib import Path

from kvtb import regions


def test_the_directory_and_name_follow_the_compute_nodes_rule():
    assert regions.shm_dir({}) == Path("/dev/shm")
    assert regions.shm_dir({"KVTB_SHM_DIR": "/mnt/kv"}) == Path("/mnt/kv")
    assert regions.region_path("compute0-1", 42, {}) == Path("/dev/shm/kvtb-compute0-1-42")


def test_removable_by_name_only_in_the_directory_with_the_pid():
    d = "/dev/shm"
    assert regions.removable("/dev/shm/kvtb-compute0-42", 42, d)
    assert not regions.removable("/dev/shm/kvtb-compute0-420", 42, d)   # another pid
    assert not regions.removable("/dev/shm/kvtb-compute0-142", 42, d)
    assert not regions.removable("/dev/shm/other-compute0-42", 42, d)   # not ours
    assert not regions.removable("/dev/shm/sub/kvtb-x-42", 42, d)       # not directly in it
    assert not regions.removable("/etc/kvtb-x-42", 42, d)
    assert not regions.removable("/dev/shm/../etc/kvtb-x-42", 42, d)
    assert not regions.removable("/dev/shm/kvtb--42", 42, d)            # no node name
    assert not regions.removable("/dev/shm/kvtb-x-0", 0, d)


def test_remove_dead_unlinks_files_only(tmp_path):
    region = tmp_path / "kvtb-n-7"
    region.write_bytes(b"kv")
    target = tmp_path / "precious"
    target.write_bytes(b"keep")
    link = tmp_path / "kvtb-m-7"
    link.symlink_to(target)
    folder = tmp_path / "kvtb-d-7"
    folder.mkdir()
    paths = [region, link, folder, tmp_path / "kvtb-gone-7", tmp_path / "kvtb-n-8"]
    assert regions.remove_dead(paths + [region], 7, tmp_path) == [str(region)]
    assert not region.exists() and link.is_symlink() and target.read_bytes() == b"keep" and folder.is_dir()


def test_a_pid_is_never_this_process_by_accident(tmp_path):
    # the caller says which pid died; a name with another pid stays, whatever the caller claims
    mine = tmp_path / f"kvtb-n-{os.getpid()}"
    mine.write_bytes(b"x")
    assert regions.remove_dead([mine], os.getpid() + 1, tmp_path) == [] and mine.exists()
