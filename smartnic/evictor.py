"""The agent's eviction: the policy's passes over the stored blocks, and the deletes on the storage nodes.

A pass runs every eviction_interval_s (virtual seconds under a hardware profile: D x that of wall time)
on a thread of its own, and at once when a publish took the stored bytes past the high watermark
(`wake`). A leased block (a GET in flight) is never a victim. A delete its node refuses as "key
leased" (another replica is finding or restoring the block) puts the block back in the index and the
policy, to be evicted later (`kept_leased`).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from smartnic.requester import StoredBlock

logger = logging.getLogger(__name__)


class Evictor:
    """Eviction passes and deletes over the agent's requester and policy (both guarded by `lock`)."""

    def __init__(self, interval_s: float, lock: threading.RLock, requester, policy, datapath, stats):
        self.interval_s, self.lock, self.requester, self.policy = interval_s, lock, requester, policy
        self.datapath, self.stats = datapath, stats
        self._stop = threading.Event()
        self._now = threading.Event()  # a publish took the stored bytes past the high watermark
        self._thread = threading.Thread(target=self._loop, name="eviction", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._now.set()

    def wake(self) -> None:
        """Run a pass now (over capacity)."""
        self._now.set()

    def evict(self, now: float) -> int:
        """Run the policy once over the stored blocks; delete the victims."""
        with self.lock:
            victims = self.policy.victims(now, self.requester.leased)
            removed = [(self.requester.remove(name), reason) for name, reason in victims]
        by_reason: dict[str, list[StoredBlock]] = {}
        for block, reason in removed:
            if block is not None:
                by_reason.setdefault(reason, []).append(block)
        return sum(self.delete(blocks, reason) for reason, blocks in by_reason.items())

    def delete(self, blocks: Sequence[StoredBlock], reason: str) -> int:
        """Delete blocks already out of the index on their nodes (counted by reason); how many."""
        for block in blocks:
            self.datapath.delete(block, self.kept_leased)
        if blocks:
            self.stats.inc_kind("evictions", reason, len(blocks))
            logger.info("deleted %d blocks (%s)", len(blocks), reason)
        return len(blocks)

    def kept_leased(self, block: StoredBlock) -> None:
        """Its node refused the delete: another replica leased the block (finding or restoring it). Back in
        the index and the policy, so that it is evicted later (on the fabric client's thread: short)."""
        with self.lock:
            if self.requester.reinstate(block):
                self.policy.touch(block.hash, block.length, time.time())
        self.stats.inc("deletes_refused_leased")

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._now.wait(self.interval_s)
            self._now.clear()
            if self._stop.is_set():
                return
            try:
                self.evict(time.time())
            except Exception:  # eviction must keep running
                logger.exception("eviction pass failed")
