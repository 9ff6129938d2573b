"""The NVM subsystem: its namespaces (persisted in a manifest), the access list, and host controllers."""
from __future__ import annotations

import itertools
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from fabric import status as st
from fabric.status import NvmeError
from kvtb.private import data_dir
from storage_node import manifest
from storage_node.commit import GroupCommitter
from storage_node.kv_namespace import KvNamespace
from storage_node.namespace import BlockNamespace, Namespace
from storage_node.queues import ParkBudget, QueuePair
from storage_node.settings import WILDCARD, StorageSettings

logger = logging.getLogger(__name__)

# Fabric sessions one host may hold: a host's queue pair takes one each (a FabricClient); past it
# the host's oldest goes ("invalid host" to it), so Connects without authentication
# (fabric_security off) cannot grow the table.
MAX_SESSIONS_PER_HOST = 256


@dataclass
class Controller:
    """A connected host: its queue pair, the namespaces it may reach, and its fabric sessions."""

    host_nqn: str
    queue: QueuePair
    allowed: Any  # "*" or a frozenset of namespace ids
    sessions: dict[bytes, None] = field(default_factory=dict)  # oldest first

    @property
    def qid(self) -> int:
        return self.queue.qid

    def may_reach(self, nsid: int) -> bool:
        return self.allowed == WILDCARD or nsid in self.allowed


class Subsystem:
    """Namespaces, committers and controllers of one storage node.

    A namespace that fails to open (damaged or unreadable files) is offline: listed in the
    manifest and in `offline` with the reason, answered "namespace not ready", never in the way
    of the others. Thread-safe: _lock guards the namespace and controller maps (the fabric
    thread and the admin service both use them). A controller's queue pair is used by the
    fabric thread only.
    """

    def __init__(self, settings: StorageSettings):
        self.settings = settings
        self.data_dir = os.path.abspath(settings.data_dir)
        self.namespaces: dict[int, Namespace] = {}
        self.committers: dict[int, GroupCommitter] = {}
        self.offline: dict[int, tuple[dict, str]] = {}  # nsid -> (manifest entry, why)
        self._controllers: dict[str, Controller] = {}
        self._sessions: dict[bytes, Controller] = {}
        self._qids = itertools.count(1)
        self.park_budget = ParkBudget()  # payload bytes parked commands hold, all queues together
        self._lock = threading.Lock()

    # -- namespaces ---------------------------------------------------------------------------

    def open(self) -> None:
        """Open the namespaces of the manifest (creating the configured ones on first start)."""
        data_dir(self.data_dir)  # 0700, also one an older run left 0755
        configured = [{"nsid": i + 1, "command_set": cs, "size_bytes": self.settings.namespace_size_bytes}
                      for i, cs in enumerate(self.settings.namespaces)]
        for entry in manifest.load(self.data_dir, configured, self.settings.namespace_size_bytes):
            try:
                self._open_namespace(entry["nsid"], entry["command_set"], entry["size_bytes"])
            except Exception as exc:  # one damaged namespace must not stop the node
                why = f"{type(exc).__name__}: {exc}"
                logger.exception("namespace %d is offline: it did not open", entry["nsid"])
                self.offline[entry["nsid"]] = (entry, why)
        self._save_manifest()

    def _open_namespace(self, nsid: int, command_set: str, size_bytes: int) -> Namespace:
        path = manifest.data_path(self.data_dir, nsid)
        if command_set == "key_value":
            ns: Namespace = KvNamespace(nsid, path, size_bytes, self.settings.fsync,
                                        self.settings.compact_min_records, self.settings.mapped_reads)
        elif command_set == "nvm":
            ns = BlockNamespace(nsid, path, size_bytes, self.settings.fsync)
        else:
            raise NvmeError(st.INVALID_FIELD, f"unknown command set {command_set!r}")
        try:
            ns.open()
        except BaseException:
            ns.close()
            raise
        self.namespaces[nsid] = ns
        if isinstance(ns, KvNamespace):
            self.committers[nsid] = GroupCommitter(ns).start()
        return ns

    def _save_manifest(self) -> None:
        entries = [{"nsid": ns.nsid, "command_set": ns.command_set, "size_bytes": ns.size_bytes}
                   for ns in self.namespaces.values()]
        entries += [entry for entry, _ in self.offline.values()]  # kept, so their files stay theirs
        manifest.save(self.data_dir, self.settings.subsystem_nqn, entries)

    def create_namespace(self, nsid: int = 0, command_set: str = "key_value",
                         size_bytes: int = 0) -> Namespace:
        """Create and open a namespace (nsid 0: the next free id); persisted in the manifest."""
        with self._lock:
            nsid = nsid or max([*self.namespaces, *self.offline], default=0) + 1
            if nsid in self.namespaces or nsid in self.offline:
                raise NvmeError(st.INVALID_FIELD, f"namespace {nsid} exists")
            ns = self._open_namespace(nsid, command_set or "key_value",
                                      size_bytes or self.settings.namespace_size_bytes)
            self._save_manifest()
        logger.info("created namespace %d (%s, %d bytes)", nsid, ns.command_set, ns.size_bytes)
        return ns

    def close(self) -> None:
        """Stop the committers (after their queued batches) and close every file."""
        for committer in self.committers.values():
            committer.stop()
        for ns in self.namespaces.values():
            ns.close()

    # -- hosts --------------------------------------------------------------------------------

    def check_allowed(self, host_nqn: str, subsystem_nqn: str = "") -> Any:
        """The namespaces host_nqn may reach; CONNECT_INVALID_HOST when it is not on the allow list."""
        if subsystem_nqn and subsystem_nqn != self.settings.subsystem_nqn:
            raise NvmeError(st.CONNECT_INVALID_PARAMETERS, f"unknown subsystem {subsystem_nqn!r}")
        allowed = self.settings.allowed_namespaces(host_nqn) if host_nqn else None
        if allowed is None:
            raise NvmeError(st.CONNECT_INVALID_HOST, f"host {host_nqn!r} is not allowed")
        return allowed

    def admit(self, host_nqn: str, subsystem_nqn: str = "") -> Controller:
        """The controller of host_nqn (created on first use); CONNECT_INVALID_HOST when not allowed."""
        allowed = self.check_allowed(host_nqn, subsystem_nqn)
        with self._lock:
            controller = self._controllers.get(host_nqn)
            if controller is None:
                nsids = allowed if allowed == WILDCARD else frozenset(allowed)
                queue = QueuePair(next(self._qids), self.settings.queue_depth, budget=self.park_budget)
                controller = Controller(host_nqn, queue, nsids)
                self._controllers[host_nqn] = controller
        return controller

    def connect(self, session: bytes, host_nqn: str, subsystem_nqn: str = "") -> Controller:
        """Bind a fabric session (a ZeroMQ routing id) to host_nqn's controller."""
        controller = self.admit(host_nqn, subsystem_nqn)
        with self._lock:
            old = self._sessions.get(session)
            if old is not None and old is not controller:
                old.sessions.pop(session, None)
            controller.sessions.pop(session, None)
            while len(controller.sessions) >= MAX_SESSIONS_PER_HOST:
                oldest = next(iter(controller.sessions))
                del controller.sessions[oldest]
                self._sessions.pop(oldest, None)
            controller.sessions[session] = None
            self._sessions[session] = controller
        logger.info("host %s connected (queue %d)", host_nqn, controller.qid)
        return controller

    def disconnect_session(self, session: bytes) -> None:
        """Unbind a session; the controller goes when its last session does."""
        with self._lock:
            controller = self._sessions.pop(session, None)
            if controller is None:
                return
            controller.sessions.pop(session, None)
            if not controller.sessions:
                self._controllers.pop(controller.host_nqn, None)
        logger.info("host %s disconnected", controller.host_nqn)

    def disconnect_host(self, host_nqn: str) -> bool:
        """Drop host_nqn's controller and sessions; later capsules from it get "invalid host"."""
        with self._lock:
            controller = self._controllers.pop(host_nqn, None)
            if controller is None:
                return False
            for session in controller.sessions:
                self._sessions.pop(session, None)
        return True

    def controller_for(self, session: bytes) -> Controller | None:
        """The controller a session is bound to, or None."""
        with self._lock:
            return self._sessions.get(session)

    def controllers(self) -> list[Controller]:
        with self._lock:
            return list(self._controllers.values())

    def namespace_for(self, controller: Controller, nsid: int) -> Namespace:
        """The namespace nsid if it exists and the controller may reach it, else INVALID_NAMESPACE."""
        ns = self.namespaces.get(nsid)
        if not controller.may_reach(nsid) or (ns is None and nsid not in self.offline):
            raise NvmeError(st.INVALID_NAMESPACE, f"namespace {nsid} is not attached to this host")
        if ns is None:
            raise NvmeError(st.NAMESPACE_NOT_READY, f"namespace {nsid} is offline: {self.offline[nsid][1]}")
        return ns
