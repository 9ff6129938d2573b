"""The subsystem's manifest: written and copied aside readable by its owner only, whatever the umask."""
import os

from storage_node import manifest

ENTRIES = [{"nsid": 1, "command_set": "key_value", "size_bytes": 1 << 20}]


def test_the_manifest_and_its_damaged_copy_are_private_under_umask_022(tmp_path):
    old = os.umask(0o022)
    try:
        manifest.save(str(tmp_path), "nqn.test", ENTRIES)
        path = tmp_path / manifest.MANIFEST
        assert path.stat().st_mode & 0o777 == 0o600
        assert manifest.load(str(tmp_path), [], 1 << 20) == ENTRIES
        path.write_text('{"namespaces": [{"nsid": 1, "comm')  # cut short
        assert manifest.load(str(tmp_path), ENTRIES, 1 << 20) == ENTRIES  # nothing on disk: as configured
        damaged = tmp_path / (manifest.MANIFEST + ".damaged")
        assert damaged.read_text() == path.read_text() and damaged.stat().st_mode & 0o777 == 0o600
    finally:
        os.umask(old)
