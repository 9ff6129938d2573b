"""kvtb.launch's pause: it returns once every thread of the process has stopped."""
import signal
import subprocess
import sys
import time

from kvtb import launch

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
