"""Group commit: one thread per key-value namespace makes concurrent Stores and Deletes durable together."""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from fabric import status as st
from storage_node.kv_namespace import KvNamespace, Op
from fabric.status import Status

logger = logging.getLogger(__name__)

SLOW_COMMIT_S = 1.0  # a batch longer than this to commit is logged, with where its time went

Callback = Callable[[Status], None]


class GroupCommitter:
    """Commits whatever is queued as one batch: one data fdatasync and one journal fsync.

    Thread-safe: submit from any thread; callbacks run on the committer thread, in the order
    the ops were submitted. Invariant: an op's callback runs only after its batch is durable.
    It runs on no thread but its own: the fabric thread and the I/O workers never wait for an fsync.
    """

    def __init__(self, namespace: KvNamespace, max_batch: int = 512):
        self.namespace = namespace
        self.max_batch = max_batch
        self.batches = 0
        self.ops_committed = 0
        self.busy_since = 0.0  # monotonic start of the batch committing now (0: none)
        self.batch_size = 0
        self.slow_commits = 0
        self._queue: queue.SimpleQueue[tuple[Op, Callback] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"commit-ns{namespace.nsid}", daemon=True)

    def start(self) -> GroupCommitter:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Commit what is queued, then stop the thread."""
        self._queue.put(None)
        self._thread.join()

    def submit(self, op: Op, callback: Callback) -> None:
        """Queue op; callback(status) runs once it is durable and visible (or failed)."""
        self._queue.put((op, callback))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            stopping = False
            while len(batch) < self.max_batch:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stopping = True
                    break
                batch.append(nxt)
            self._commit(batch)
            if stopping:
                return

    def describe(self) -> str:
        """What the committer is doing now (for the stall log)."""
        busy = self.busy_since
        if busy:
            return (f"committer of namespace {self.namespace.nsid}: a batch of {self.batch_size} ops in "
                    f"{self.namespace.commit_phase or 'its checks'} for {time.monotonic() - busy:.1f} s, "
                    f"{self._queue.qsize()} ops queued behind it")
        return f"committer of namespace {self.namespace.nsid}: idle, {self._queue.qsize()} ops queued"

    def _commit(self, batch: list[tuple[Op, Callback]]) -> None:
        self.batch_size, self.busy_since = len(batch), time.monotonic()
        fsyncs = self.namespace.fsyncs, self.namespace.journal.fsyncs
        try:
            statuses = self.namespace.commit([op for op, _ in batch])
        except Exception:  # never leave a host waiting on an unanswered command
            logger.exception("namespace %d: group commit failed", self.namespace.nsid)
            statuses = [st.INTERNAL_ERROR] * len(batch)
        took, self.busy_since = time.monotonic() - self.busy_since, 0.0
        if took > SLOW_COMMIT_S:
            self.slow_commits += 1
            data_s, journal_s = self.namespace.last_commit_s
            logger.warning("namespace %d: a group commit of %d ops took %.1f s: %.1f s in %d fdatasync of the data "
                           "file, %.1f s in %d of the journal; %d ops queued behind it", self.namespace.nsid,
                           len(batch), took, data_s, self.namespace.fsyncs - fsyncs[0], journal_s,
                           self.namespace.journal.fsyncs - fsyncs[1], self._queue.qsize())
        self.batches += 1
        self.ops_committed += len(batch)
        for (_, callback), status in zip(batch, statuses):
            try:
                callback(status)
            except Exception:  # one failing callback must not starve the others
                logger.exception("commit callback failed")
