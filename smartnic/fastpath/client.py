"""The agent's side of its fast path process: spawn it, hand it pools, read what it reports.

A reader thread takes the child's messages as they come (statistics into the agent's Stats, fire
times to the engine's hooks, stored blocks to the agent's index); `drain` reads, on the caller's
thread, every message that has already arrived, so that a lookup made after a PUT-done counter
moved finds that block (the child reports before it bumps the counter).
"""
from __future__ import annotations

import itertools
import logging
import multiprocessing.connection
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from smartnic.fastpath import protocol as p
from smartnic.registrations import Registered
from smartnic.requester import StoredBlock
from smartnic.settings import SmartNicSettings

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 60.0    # the child connects to the storage nodes before it says READY
REQUEST_TIMEOUT_S = 15.0  # a registration: the child maps the region and arms its poller
MAX_MESSAGE_BYTES = 64 << 20  # a report larger than this is a bug: the connection is dropped


GONE = "fastpath_gone"  # a restore's block ended because the child exited: its counters did not move


class FastPathError(RuntimeError):
    """The fast path process did not start, or did not answer."""


class FastPath:
    """One fast path process. Thread-safe."""

    def __init__(self, settings: SmartNicSettings, stats,
                 on_stored: Callable[[StoredBlock | None, str, str | None, str], None],
                 on_fired: Callable[[int, int, int, int, int], None]):
        self.stats, self.on_stored, self.on_fired = stats, on_stored, on_fired
        # restore id -> (on a block's end, the blocks not ended yet)
        self._restores: dict[int, tuple[Callable[[int, str | None, str], None], set[int]]] = {}
        # a block ends once: the reader and a failed send may both end it
        self._restores_lock = threading.Lock()
        self._restore_ids = itertools.count(1)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        self.conn = multiprocessing.connection.Connection(ours.detach())
        child_fd = theirs.detach()
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "smartnic.fastpath", str(child_fd)],
                                         pass_fds=(child_fd,), stdin=subprocess.DEVNULL)
        finally:
            os.close(child_fd)
        self._send_lock, self._rx_lock = threading.Lock(), threading.Lock()
        self._replies: dict[int, tuple[threading.Event, list]] = {}
        self._ids = itertools.count(1)
        self._closed = self._stopping = False
        self.pid, self.compiled, self.watcher_tid = self.proc.pid, False, 0
        try:
            self._send((p.SETTINGS, settings))
            if not self.conn.poll(START_TIMEOUT_S):
                raise FastPathError(f"the fast path process did not start within {START_TIMEOUT_S:.0f} s")
            message = self.conn.recv()
            if message[0] != p.READY:
                raise FastPathError(f"the fast path process said {message[0]!r} before it was ready")
            self.pid, self.compiled, self.watcher_tid = message[1], bool(message[2]), int(message[3])
        except (EOFError, OSError, FastPathError) as exc:
            self._kill()
            raise FastPathError(f"fast path process: {exc or 'it exited'}") from exc
        self._reader = threading.Thread(target=self._read_loop, name="fastpath-reader", daemon=True)
        self._reader.start()
        logger.info("standing PUTs fire in the fast path's own process (pid %d, %s poller)", self.pid,
                    "compiled" if self.compiled else "Python")

    def _send(self, message: tuple) -> None:
        with self._send_lock:
            self.conn.send(message)

    def _request(self, message: tuple) -> None:
        """Send (kind, id, ...) and wait for the child's reply; FastPathError on its error or silence."""
        request = next(self._ids)
        event, answer = threading.Event(), []
        self._replies[request] = (event, answer)
        try:
            self._send((message[0], request, *message[1:]))
            deadline = time.monotonic() + REQUEST_TIMEOUT_S
            while not event.wait(0.05):
                self.drain()  # the reader may be between polls: read the reply here
                if time.monotonic() > deadline or not self.alive():
                    raise FastPathError(f"the fast path process did not answer {message[0]}")
        finally:
            self._replies.pop(request, None)
        if answer[0] is not None:
            raise FastPathError(answer[0])

    def register(self, reg: Registered) -> bool:
        """Have the child map a pool (a region with a KV layout: it has standing PUTs); whether it did."""
        L = reg.layout
        if L is None:
            return False
        self._request((p.REGISTER, reg.region_id, reg.region.name, reg.region.size, L.counter_offset,
                       L.counter_count, L))
        return True

    def deregister(self, region_id: int) -> None:
        self._request((p.DEREGISTER, region_id))

    def restore(self, region_id: int, blocks: list, groups: list, on_end: Callable[[int, str | None, str], None]) -> None:
        """GET (StoredBlock, runs, pool block) each into the region in the child (its counters bumped there);
        on_end(i, error kind or None, message) once block i's every group was reported. It never raises: a
        send that fails because the child exited ends each block as GONE."""
        if not blocks:
            return
        restore = next(self._restore_ids)
        with self._restores_lock:
            self._restores[restore] = (on_end, set(range(len(blocks))))
        try:
            self._send((p.RESTORE, restore, region_id, blocks, groups))
        except OSError as exc:  # the child is gone; the reader may have seen it first and ended some blocks
            for i in range(len(blocks)):
                self._ended(restore, i, GONE, f"the fast path process is gone: {exc}")

    def _ended(self, restore: int, i: int, kind: str | None, message: str) -> None:
        """Block i of `restore` ended: on_end once, whoever reports it (a second report is dropped)."""
        with self._restores_lock:
            entry = self._restores.get(restore)
            if entry is None or i not in entry[1]:
                return
            entry[1].discard(i)
            if not entry[1]:
                self._restores.pop(restore, None)
        entry[0](i, kind, message)

    def _abandon_restores(self) -> None:
        """The child is gone: every block of a restore not ended ends as GONE (its counters did not move)."""
        with self._restores_lock:
            pending = [(restore, sorted(left)) for restore, (_, left) in self._restores.items()]
        for restore, left in pending:
            for i in left:
                self._ended(restore, i, GONE, "the fast path process exited during the restore")

    def alive(self) -> bool:
        return self.proc.poll() is None

    # -- reports
    def drain(self) -> int:
        """Handle every message that has arrived; how many."""
        n = 0
        with self._rx_lock:
            try:
                while not self._closed and self.conn.poll(0):
                    self._handle(self.conn.recv_bytes(MAX_MESSAGE_BYTES))
                    n += 1
            except (EOFError, OSError) as exc:
                if not self._closed and not self._stopping:
                    logger.error("the fast path process's connection ended: %s", exc)
                self._closed = True
                self._abandon_restores()
        return n

    def _read_loop(self) -> None:
        while not self._closed:
            try:
                ready = self.conn.poll(0.5)
            except (OSError, EOFError, ValueError):
                return
            if ready:
                self.drain()
            elif not self.alive() and not self._closed and not self._stopping:
                logger.error("the fast path process exited (code %s): standing PUTs no longer fire",
                             self.proc.returncode)
                self.drain()
                self._abandon_restores()
                return

    def _handle(self, raw: bytes) -> None:
        import pickle  # the peer is this agent's own child, over a socket pair only the two hold

        message = pickle.loads(raw)
        kind = message[0]
        if kind == p.STATS:
            p.apply(message[1], self.stats, self.on_fired)
        elif kind == p.STORED:
            _, context_id, stored, error_kind, error_message = message
            self.on_stored(stored, context_id, error_kind, error_message)
        elif kind == p.ENDED:
            self._ended(*message[1:])
        elif kind == p.REPLY:
            waiting = self._replies.get(message[1])
            if waiting is not None:
                waiting[1].append(message[2])
                waiting[0].set()
        else:
            logger.warning("the fast path process sent an unknown message %r", kind)

    # -- shutdown
    def close(self, timeout_s: float = 5.0) -> None:
        self._stopping = True  # the connection's end is expected from now on
        if self.alive():
            try:
                self._send((p.STOP,))
            except OSError:
                pass
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._kill()
        self.drain()  # the last reports
        self._closed = True
        self.conn.close()

    def _kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
