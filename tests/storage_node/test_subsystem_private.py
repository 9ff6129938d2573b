"""The storage node's data directory and files are private whatever the umask (storage_node.subsystem)."""
from __future__ import annotations

import os
import stat

from storage_node.subsystem import Subsystem
from tests.storage_node.conftest import settings_for


def test_an_older_runs_wide_data_dir_is_narrowed_and_new_files_are_0600(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)
    old = os.umask(0o022)
    try:
        subsystem = Subsystem(settings_for(tmp_path))
        subsystem.open()
        subsystem.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(data.stat().st_mode) == 0o700
    files = [p for p in data.rglob("*") if p.is_file()]
    assert files, "the subsystem wrote no files"
    wide = {str(p.relative_to(data)): oct(stat.S_IMODE(p.stat().st_mode)) for p in files
            if stat.S_IMODE(p.stat().st_mode) != 0o600}
    assert not wide, f"files readable by others: {wide}"
