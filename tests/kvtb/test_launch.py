import pytest
"""kvtb.launch's pause (it returns once every thread of the process has stopped) and CPU time."""
import signal
import subprocess
import sys
import time

from kvtb import launch

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

THREADS = "import threading, time\nfor _ in range(4): threading.Thread(target=time.sleep, args=(60,), daemon=True).start()\ntime.sleep(60)"


def test_a_paused_process_has_every_thread_stopped_and_a_resumed_one_none():
    proc = subprocess.Popen([sys.executable, "-c", THREADS])
    try:
        time.sleep(0.3)
        assert not launch._stopped(proc.pid)
        service = launch.ServiceProcess("sleeper", [], "/dev/null")
        service.proc = proc
        service.pause()
        assert launch._stopped(proc.pid)  # at once, not eventually
        service.resume()
        deadline = time.monotonic() + 5
        while launch._stopped(proc.pid):
            assert time.monotonic() < deadline
            time.sleep(0.001)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert launch._stopped(proc.pid)  # gone: nothing left running


BUSY = "import time\nend = time.time() + 1.0\nwhile time.time() < end: pass"


def test_cpu_seconds_counts_a_busy_process_and_not_a_sleeping_one():
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.0)"])
    service, sleeper = (launch.ServiceProcess(name, [], "/dev/null") for name in ("busy", "idle"))
    assert service.cpu_seconds() is None  # not started
    service.proc, sleeper.proc = busy, idle
    time.sleep(0.8)
    try:
        assert service.cpu_seconds() > 0.4
        assert sleeper.cpu_seconds() < 0.2
    finally:
        busy.wait()
        idle.wait()


PARENT = """
import sys, time
from kvtb import credentials
from kvtb.launch import ServiceProcess, kvtb_argv
die = sys.argv[2] == "die"
credentials.init(sys.argv[1] + "/credentials")
proc = ServiceProcess("storage", kvtb_argv("serve", "storage"), sys.argv[1] + "/storage.log", env={
    "KVTB_STORAGE_NODE_NAME": "s0", "KVTB_STORAGE_DATA_DIR": sys.argv[1] + "/data",
    "KVTB_STORAGE_ADMIN_ADDRESS": "127.0.0.1:0", "KVTB_STORAGE_FABRIC_ADDRESS": "tcp://127.0.0.1:0",
    "KVTB_STORAGE_METRICS_ADDRESS": "127.0.0.1:0", "KVTB_CREDENTIALS_DIR": sys.argv[1] + "/credentials"},
    die_with_parent=die)
proc.start(timeout_s=60)
print(proc.proc.pid, flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as f:
            return "State:\tZ" not in f.read()
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.parametrize("die", [True, False])
def test_a_service_started_to_die_with_its_parent_ends_when_the_parent_is_killed(tmp_path, die):
    import os
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path), "die" if die else "stay"],
                              stdout=subprocess.PIPE, text=True)
    service = None
    try:
        service = int(parent.stdout.readline())
        assert alive(service)
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.monotonic() + (10 if die else 1)  # without: still there after a second
        while alive(service) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert alive(service) != die  # with die_with_parent it ends (SIGTERM); without, it is left running
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if service is not None and alive(service):
            os.kill(service, signal.SIGKILL)


def test_the_parent_variable_is_not_passed_on_to_a_service_that_did_not_ask():
    import os
    os.environ[launch.PARENT_ENV] = "1"
    try:
        assert launch.PARENT_ENV not in launch.ServiceProcess("x", [], "/dev/null").env
        assert launch.ServiceProcess("x", [], "/dev/null", die_with_parent=True).env[launch.PARENT_ENV] == str(os.getpid())
    finally:
        del os.environ[launch.PARENT_ENV]
