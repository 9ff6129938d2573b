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
