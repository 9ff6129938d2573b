"""Private by default (kvtb.private): what the services make is their user's only, whatever the umask.

Real processes: a storage node and the chat frontend started by `kvtb serve` under umask 022, then every
directory and file they made is checked; the same for a service started by kvtb.launch without the
`kvtb serve` entry point, and for what `kvtb up` narrows of an older run.
"""
from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from kvtb import credentials, private, up
from kvtb.launch import READY_PREFIX, ServiceProcess, kvtb_argv

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

CONFIG = {
    "storage": {"admin_address": "127.0.0.1:0", "fabric_address": "tcp://127.0.0.1:0",
                "metrics_address": "127.0.0.1:0", "namespace_size_bytes": 16 << 20},
    "frontend": {"listen_address": "127.0.0.1:0", "http_address": "127.0.0.1:0", "metrics_address": "127.0.0.1:0",
                 "agent_address": "127.0.0.1:1", "users": {"alice": "alice-token"}},
}


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def modes_under(root: Path) -> dict[str, int]:
    """Every directory and file under root (itself included) -> its mode."""
    found = {str(root): mode(root)}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            found[os.path.join(top, name)] = mode(Path(top, name))
    return found


def not_private(found: dict[str, int]) -> dict[str, str]:
    return {path: oct(m) for path, m in found.items()
            if m != (private.DIR_MODE if os.path.isdir(path) else private.FILE_MODE)}


@pytest.fixture
def deployment_dir(tmp_path):
    """A config and the deployment's credentials (made by the test, outside the data directory)."""
    (tmp_path / "kvtb.yaml").write_text(yaml.safe_dump(CONFIG))
    credentials.init(tmp_path / "credentials")
    return tmp_path


def wait_ready(proc: subprocess.Popen, timeout_s: float = 60.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline().decode()
        if line.startswith(READY_PREFIX):
            return line
        if not line and proc.poll() is not None:
            break
    raise AssertionError(f"not ready (exit {proc.poll()})")


def test_kvtb_serve_makes_private_files_under_umask_022(deployment_dir):
    data = deployment_dir / "var"
    env = {**os.environ, credentials.ENV_DIR: str(deployment_dir / "credentials"),
           "KVTB_STORAGE_DATA_DIR": str(data / "storage-0"), "KVTB_FRONTEND_DATA_DIR": str(data / "frontend")}
    config = str(deployment_dir / "kvtb.yaml")
    with contextlib.ExitStack() as logs:
        procs = [subprocess.Popen(kvtb_argv("serve", service, "--config", config), stdout=subprocess.PIPE,
                                  stderr=logs.enter_context(open(deployment_dir / f"{service}.err", "wb")),
                                  env=env, umask=0o022, start_new_session=True)
                 for service in ("storage", "frontend")]
        try:
            for proc in procs:
                wait_ready(proc)
            running = modes_under(data)  # the WAL and its index exist while the frontend runs
        finally:
            for proc in procs:
                proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait(30)
    assert not_private(running) == {}
    names = {Path(p).name for p in running}
    assert {"frontend.sqlite3", "frontend.sqlite3-wal", "storage-0"} <= names
    assert any(Path(p).parent.name == "storage-0" and os.path.isfile(p) for p in running)  # data, journal
    assert not_private(modes_under(data)) == {}  # and what they left at exit


def test_a_launched_service_and_its_log_are_private_without_kvtb_serve(deployment_dir):
    """kvtb.launch starts children with umask 077 even when they skip the `kvtb serve` entry point."""
    old = os.umask(0o022)
    try:
        service = ServiceProcess(
            "frontend", [sys.executable, "-m", "chat_frontend.main", "--config", str(deployment_dir / "kvtb.yaml")],
            deployment_dir / "logs" / "frontend.log",
            env={credentials.ENV_DIR: str(deployment_dir / "credentials"),
                 "KVTB_FRONTEND_DATA_DIR": str(deployment_dir / "var" / "frontend")})
        with service:
            found = modes_under(deployment_dir / "var")
    finally:
        os.umask(old)
    assert not_private(found) == {}
    assert "frontend.sqlite3-wal" in {Path(p).name for p in found}
    assert mode(deployment_dir / "logs") == 0o700
    assert mode(deployment_dir / "logs" / "frontend.log") == 0o600


def test_a_service_main_run_directly_is_private_too(deployment_dir):
    """`python -m chat_frontend.main` skips `kvtb serve`: kvtb.node.run makes it private before it starts."""
    data = deployment_dir / "var"
    env = {**os.environ, credentials.ENV_DIR: str(deployment_dir / "credentials"),
           "KVTB_FRONTEND_DATA_DIR": str(data / "frontend")}
    proc = subprocess.Popen([sys.executable, "-m", "chat_frontend.main", "--config", str(deployment_dir / "kvtb.yaml")],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, umask=0o022)
    try:
        wait_ready(proc)
        found = modes_under(data)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    assert "frontend.sqlite3-wal" in {Path(p).name for p in found}
    assert not_private(found) == {}


def test_a_log_left_readable_is_narrowed_when_opened_again(tmp_path):
    log = tmp_path / "old.log"
    log.write_text("alice asked ...\n")
    log.chmod(0o644)
    with private.open_private(log) as f:
        f.write(b"more\n")
    assert mode(log) == 0o600
    assert log.read_text() == "alice asked ...\nmore\n"


def test_private_dir_makes_or_narrows_and_refuses_a_shared_sticky_directory(tmp_path):
    old = os.umask(0o022)
    try:
        made = private.private_dir(tmp_path / "a" / "b")
    finally:
        os.umask(old)
    assert (mode(tmp_path / "a"), mode(made)) == (0o700, 0o700)
    wide = tmp_path / "wide"
    wide.mkdir(mode=0o755)
    wide.chmod(0o755)
    private.private_dir(wide, narrow=False)
    assert mode(wide) == 0o755
    private.private_dir(wide)
    assert mode(wide) == 0o700
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    with pytest.raises(ValueError, match="shared directory"):
        private.private_dir(sticky)
    assert mode(sticky) == 0o1777
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError):
        private.private_dir(tmp_path / "file")


def test_a_data_dir_is_narrowed_but_a_shared_sticky_one_is_left_as_it_is(tmp_path):
    wide = tmp_path / "data"
    wide.mkdir()
    wide.chmod(0o755)
    assert mode(private.data_dir(wide)) == 0o700
    sticky = tmp_path / "tmp"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert mode(private.data_dir(sticky)) == 0o1777


def test_kvtb_up_narrows_what_an_older_run_left(tmp_path):
    data = tmp_path / "var"
    for part in ("logs", "frontend", "storage-0", "elsewhere"):
        (data / part).mkdir(parents=True)
        (data / part).chmod(0o755)
        (data / part / "f").write_text("words")
        (data / part / "f").chmod(0o644)
    (data / "frontend" / "link").symlink_to(tmp_path / "outside")
    (tmp_path / "outside").write_text("")
    (tmp_path / "outside").chmod(0o644)
    data.chmod(0o755)
    up.Deployment(None, data, None, 1).make_private()
    assert mode(data) == 0o700
    for part in ("logs", "frontend", "storage-0"):
        assert (mode(data / part), mode(data / part / "f")) == (0o700, 0o600)
    assert mode(data / "elsewhere") == 0o755  # not kvtb up's: behind the 0700 data directory anyway
    assert mode(tmp_path / "outside") == 0o644  # a link is not followed


def test_make_private_sets_umask_077():
    old = private.make_private()
    try:
        assert os.umask(0o077) == 0o077
    finally:
        os.umask(old)


def test_a_log_on_dev_null_leaves_dev_null_alone():
    before = mode(Path("/dev/null"))
    with private.open_private("/dev/null") as f:
        f.write(b"x")
    assert mode(Path("/dev/null")) == before


def test_open_private_for_writing_makes_a_0600_file_and_narrows_and_truncates_one_left_readable(tmp_path):
    old = os.umask(0o022)
    path = tmp_path / "kvtb.yaml"
    try:
        with private.open_private(path, "w") as f:
            f.write("salt: longer\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "salt: longer\n"
        os.chmod(path, 0o644)
        with private.open_private(path, "w") as f:
            f.write("salt: y\n")
        assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_text() == "salt: y\n"
    finally:
        os.umask(old)

