"""Steps 6 and 7 at the agent: GETs of stored blocks into a compute node's pool, layer group by layer group.

A restore names pool blocks and the stored blocks' names; each is taken only when the index holds it
under the user's name (or, shared, its tenant's), with the token count asked for; it is leased for the
GET, so that no eviction deletes it meanwhile. As each layer group of a block lands and checks out (the
data path, or the fast path's process when it runs), the block's GET-done counter of that group is
bumped, the error part when it failed: the compute node never waits past a GET's deadline. A GET that
fails its checks drops the block (the agent's `got`). Thread-safe: the requester under the agent's lock.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Sequence

from hostmem.region import RegionError
from smartnic import discovery
from smartnic.datapath import DataError
from smartnic.fastpath.client import GONE
from smartnic.registrations import Registered
from smartnic.requester import StoredBlock

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RestoreBlock:
    """One block of a restore the compute node asked for (on its Generate stream)."""

    block: int          # the pool block it lands in
    hash: bytes
    token_count: int
    chunk_index: int
    shared: bool = False


@dataclasses.dataclass
class Restore:
    """GETs of stored blocks into pool blocks (steps 6 and 7), as one restore event asked."""

    region_id: int
    blocks: int
    bytes: int          # token ids + KV landing in the region (what the compute node counts as restored)
    started_ns: int
    done_ns: int = 0
    failed: int = 0
    other: int = 0      # blocks that landed whole and were discovered (another replica's agent stored them)
    _left: int = 0
    finished: threading.Event = dataclasses.field(default_factory=threading.Event)  # set with done_ns


class RestorePath:
    """GETs into pool blocks over the agent's index, data path and (when it runs) fast path."""

    def __init__(self, lock: threading.RLock, requester, datapath, stats, sync: Callable[[], None],
                 fastpath: Callable[[], object | None], got: Callable):
        self.lock, self.requester, self.datapath, self.stats = lock, requester, datapath, stats
        self.sync = sync          # take in the fast path's reports first (its PUTs may have published)
        self.fastpath = fastpath  # the fast path's process, once the agent started it (None: this process)
        self.got = got            # after a GET: count it, drop a block that proved bad

    def restore(self, reg: Registered, user_id: str, tenant: str, blocks: Sequence[RestoreBlock],
                layer_groups: int) -> Restore:
        """GET each stored block into its pool block, layer group by layer group (steps 6 and 7): each
        block's GET-done counter of a group is bumped once, as that group lands and checks out, the
        error part when it failed (a block not stored under this user's, or, shared, tenant's name)."""
        L = reg.layout
        if L is None:
            raise RegionError(f"region {reg.region_id} was registered without a kv_layout")
        if layer_groups != L.layer_groups:
            raise ValueError(f"the restore names {layer_groups} layer groups, the layout has {L.layer_groups}")
        for b in blocks:
            L._check_block(b.block)
        found: list[tuple[RestoreBlock, StoredBlock | None]] = []
        self.sync()
        with self.lock:
            for b in blocks:
                stored = self.requester.get(b.hash)
                if stored is not None and (stored.tenant != tenant or stored.token_count != b.token_count
                                           or stored.shared != b.shared
                                           or (not stored.shared and stored.user_id != user_id)):
                    stored = None  # not this user's block: as good as missing
                if stored is None:
                    logger.warning("restore of %s's block %d (%d tokens, %s): not stored", user_id, b.chunk_index,
                                   b.token_count, b.hash.hex()[:12])
                found.append((b, stored))
            self.requester.lease(s.hash for _, s in found if s is not None)
        restore = Restore(reg.region_id, len(blocks), sum(L.chunk_payload_bytes(b.token_count) for b, s in found if s),
                          time.time_ns(),
                          _left=len(blocks))
        if not blocks:
            restore.done_ns = restore.started_ns
            restore.finished.set()
        groups = [L.group_layers(g) for g in range(L.layer_groups)]  # KV parts are layers
        fetched = []
        for b, stored in found:
            error = (DataError("not_found", "no such block stored") if stored is None else
                     DataError("dtype_mismatch", f"block {b.chunk_index} holds {stored.kv_dtype} KV, the pool "
                                                 f"{L.kv_dtype}: not read (recomputed)")
                     if stored.kv_dtype != L.kv_dtype else None)
            if error is not None:
                for g in range(L.layer_groups):
                    self._group_landed(reg, b, g, error)
                self._block_ended(restore, stored, error)
            else:
                fetched.append((b, stored))
        if self.fastpath() is not None:  # the GETs land in the fast path's process (its counters bumped there)
            self._restore_in_fastpath(reg, restore, fetched, groups)
            return restore
        self.datapath.restore(reg.region, [(s, L.chunk_runs(b.block, b.token_count)) for b, s in fetched], groups,
                              lambda i, g, err: self._group_landed(reg, fetched[i][0], g, err),
                              lambda i, err: self._block_ended(restore, fetched[i][1], err), L.kv_dtype)
        return restore

    def _restore_in_fastpath(self, reg: Registered, restore: Restore, fetched: list, groups: list) -> None:
        """Hand the GETs to the fast path's process; each block's end comes back to _block_ended. A block the
        process could not end (it exited) has its every group's counter bumped here, as an error."""
        L = reg.layout

        def on_end(i: int, kind: str | None, message: str) -> None:
            block, stored = fetched[i]
            err = None if kind is None else DataError(kind, message)
            if kind == GONE:
                for group in range(L.layer_groups):
                    self._group_landed(reg, block, group, err)
            self._block_ended(restore, stored, err)
        # a send that fails (the process exited) ends each block as GONE through on_end, once
        self.fastpath().restore(reg.region_id, [(s, L.chunk_runs(b.block, b.token_count), b.block) for b, s in fetched],
                                groups, on_end)

    def _group_landed(self, reg: Registered, block: RestoreBlock, group: int, err: DataError | None) -> None:
        """Step 7 for one layer group of one block: its completion counter, success or error part."""
        reg.add(reg.layout.get_done(block.block, group), success=int(err is None), error=int(err is not None))

    def _block_ended(self, restore: Restore, stored: StoredBlock | None, err: DataError | None) -> None:
        """Every group of a block was reported: release its lease, count it, drop it if it proved bad."""
        if stored is not None:
            with self.lock:
                self.requester.release([stored.hash])
        if err is not None:
            self.stats.inc_kind("errors", err.kind)
        if stored is not None:
            self.got(stored, err, lambda kind, message: None)
        with self.lock:
            restore._left -= 1
            restore.failed += err is not None
            restore.other += err is None and stored is not None and stored.origin == discovery.DISCOVERED
            if restore._left == 0 and not restore.done_ns:
                restore.done_ns = time.time_ns()
                restore.finished.set()
