"""The agent's queue pairs to the storage nodes, reconnected in the background.

A node that cannot be reached at start, or that answers "invalid host" after a restart of
its own, is marked down and retried every `retry_s`; placement uses only the nodes up.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence

from fabric import status as st
from fabric.auth import FabricSecurity
from fabric.client import FabricClient, FabricError

logger = logging.getLogger(__name__)


class StorageNodes:
    """name -> FabricClient for the nodes that are up. Thread-safe."""

    def __init__(self, nodes: Sequence[tuple[str, str]], host_nqn: str, queue_depth: int = 128,
                 timeout_s: float = 5.0, retry_s: float = 1.0,
                 on_up: Callable[[str, FabricClient], None] | None = None,
                 security: FabricSecurity | None = None):
        self.names = [name for name, _ in nodes]
        self.security = security or FabricSecurity.off()
        self._addresses = dict(nodes)
        self.host_nqn, self.queue_depth = host_nqn, queue_depth
        self.timeout_s, self.retry_s = timeout_s, retry_s
        self.on_up = on_up
        self._lock = threading.Lock()
        self._clients: dict[str, FabricClient] = {}
        self._stop = threading.Event()
        self._kick = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()

    def start(self, connect_timeout_s: float = 1.0) -> None:
        """Try every node once now, in parallel (tolerating ones that are down), then retry in background."""
        tries = [threading.Thread(target=self._try, args=(name, connect_timeout_s), daemon=True)
                 for name in self.names]
        for t in tries:
            t.start()
        for t in tries:
            t.join()
        self._thread = threading.Thread(target=self._retry_loop, name="storage-reconnect", daemon=True)
        self._thread.start()

    def _try(self, name: str, timeout_s: float) -> bool:
        client = FabricClient(self._addresses[name], self.host_nqn, queue_depth=self.queue_depth,
                              timeout_s=min(timeout_s, self.timeout_s), security=self.security)
        try:
            client.connect()
        except (FabricError, TimeoutError) as exc:
            log = logger.debug if name in self._warned else logger.warning
            log("storage node %s (%s) not reachable: %s; retrying every %.1f s", name,
                self._addresses[name], exc, self.retry_s)
            self._warned.add(name)
            client.close()
            return False
        self._warned.discard(name)
        client.timeout_s = self.timeout_s
        with self._lock:
            old, self._clients[name] = self._clients.get(name), client
        if old is not None:
            old.close()
        logger.info("connected to storage node %s at %s", name, self._addresses[name])
        if self.on_up:
            try:
                self.on_up(name, client)
            except Exception:  # a failed rebuild must not stop the agent
                logger.exception("after connecting to %s", name)
        return True

    def _retry_loop(self) -> None:
        while not self._stop.is_set():
            self._kick.wait(self.retry_s)
            self._kick.clear()
            for name in self.names:
                if self._stop.is_set():
                    return
                if name not in self.up():
                    self._try(name, self.retry_s)

    def up(self) -> set[str]:
        with self._lock:
            return set(self._clients)

    def client(self, name: str) -> FabricClient | None:
        with self._lock:
            return self._clients.get(name)

    def report_failure(self, name: str, exc: BaseException) -> None:
        """A command failed: a node that timed out or forgot our connection is reconnected."""
        forgot = isinstance(exc, FabricError) and (exc.sct, exc.sc) == tuple(st.CONNECT_INVALID_HOST)
        if forgot or isinstance(exc, TimeoutError):
            with self._lock:
                client = self._clients.pop(name, None)
            if client is not None:
                logger.warning("storage node %s failed (%s); reconnecting", name, exc)
                threading.Thread(target=client.close, daemon=True).start()
                self._kick.set()

    def close(self) -> None:
        self._stop.set()
        self._kick.set()
        if self._thread:
            self._thread.join(timeout=5)
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            client.close()
