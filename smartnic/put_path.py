"""A standing PUT's own work, wherever the fast path runs: fire → descriptor check → PUT issued →
completion (steps 1 and 2).

`fire` runs on the watcher's thread when a block's trigger moved: it checks the block's descriptor
(its generation is the trigger's, its name is the block's token ids under its owner's salt, a
shared block is full), asks the admission policy, and hands the PUT to its own thread, so that the
watcher goes on firing while the chunk is gathered, MAC'd and sent. `stored(block, context, error)`
is told of every PUT's end *before* the block's PUT-done counter moves: a follow-up that finds the
counter moved finds the block in the requester. The agent's thread fast path (`fastpath: thread`)
and the fast path's own process (`smartnic.fastpath`) both run this.
"""
from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Callable

from fabric import chunk_format as cf
from hostmem import descriptor
from hostmem.block_hash import block_hash, salt_for
from hostmem.region import RegionError
from smartnic.datapath import Datapath, DataError
from smartnic.registrations import Registered
from smartnic.requester import StoredBlock

logger = logging.getLogger(__name__)

Stored = Callable[[StoredBlock | None, str, DataError | None], None]  # (block, context id, error)


class PutPath:
    """Thread-safe: `fire` from the watcher thread, completions from the fabric's I/O threads."""

    def __init__(self, datapath: Datapath, salt: str, stats, admit: Callable[[bytes], bool], stored: Stored,
                 flush: Callable[[], None] = lambda: None):
        self.datapath, self.salt, self.stats = datapath, salt, stats
        self.admit, self.stored = admit, stored
        self.flush = flush  # statistics reach whoever reads them before a counter moves (a process's own)
        self._thread = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="standing-put")

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)

    def fire(self, reg: Registered, block: int, generation: int, verdict: str | None = None,
             issue: Callable | None = None) -> int | None:
        """Check the block's descriptor and issue its PUT; the descriptor's stamp (0: none), or None when
        no PUT was issued: refused (PUT-done error part bumped, the refusal counted) or not admitted
        (success part bumped, `puts_skipped`). `verdict`: the compiled poller's check of the descriptor
        where it made one ("": passed; else why it refused), None where it did not (checked here). A
        descriptor the poller passed is decoded, and checked again, on the PUT thread, off the fire's path.
        issue(put, *args): where the PUT runs (default: handed to the PUT thread; the fire ring's consumer
        is a PUT thread itself and runs it there, after the fires it took)."""
        L = reg.layout
        try:
            if verdict:
                raise descriptor.DescriptorError(verdict)
            if verdict is None:
                d = self._check(reg, block, generation)
                name, stamp = d.hash, d.stamp_ns
            else:
                d = None
                name, stamp = descriptor.peek(reg.region.view(*L.descriptor_range(block)))
        except (descriptor.DescriptorError, RegionError, ValueError) as exc:
            self._refuse(reg, block, exc)
            return None
        if not self.admit(name):  # first sighting under on_reuse
            self.stats.inc("puts_skipped")
            self.flush()
            reg.add(L.put_done(block), success=1)  # done as far as the compute node goes: the block is free
            return None
        (issue or self._thread.submit)(self._put, reg, block, generation, d)
        return stamp

    @staticmethod
    def _check(reg: Registered, block: int, generation: int) -> descriptor.Descriptor:
        """The block's descriptor, decoded and checked (DescriptorError, RegionError, ValueError)."""
        L = reg.layout
        d = descriptor.decode(reg.region.view(*L.descriptor_range(block)), L.block_tokens)
        if d.generation != generation:
            raise descriptor.DescriptorError(f"descriptor generation {d.generation}, trigger {generation}")
        ids = reg.region.view(*L.token_ids_range(block, d.token_count))
        if d.shared and d.token_count != L.block_tokens:
            raise descriptor.DescriptorError("only a full block can be shared")
        if block_hash(d.parent, ids, salt_for(d.tenant, d.user, d.shared)) != d.hash:
            raise descriptor.DescriptorError("the descriptor's name is not the block's tokens under its owner")
        return d

    def _refuse(self, reg: Registered, block: int, exc: Exception) -> None:
        self.stats.inc_kind("errors", "descriptor_refused")
        logger.warning("block %d of region %d: descriptor refused: %s", block, reg.region_id, exc)
        self.flush()
        reg.add(reg.layout.put_done(block), error=1)

    def _put(self, reg: Registered, block: int, generation: int, d: descriptor.Descriptor | None) -> None:
        """On the PUT thread: the PUT of a block whose descriptor was accepted (d None: by the compiled
        poller; decoded and checked again here)."""
        L, done = reg.layout, reg.layout.put_done(block)
        if d is None:
            try:
                d = self._check(reg, block, generation)
            except (descriptor.DescriptorError, RegionError, ValueError) as exc:
                return self._refuse(reg, block, exc)

        def then(stored: StoredBlock | None, err: DataError | None) -> None:
            try:
                self.stored(stored, d.context, err)
            except Exception:  # noqa: BLE001 - the counter must move whatever the report did
                logger.exception("reporting the PUT of block %d failed", block)
            if not reg.closed:
                reg.add(done, success=int(err is None), error=int(err is not None))
        try:
            start = d.chunk_index * L.block_tokens
            header = cf.ChunkHeader(d.user, d.context, d.chunk_index, start, start + d.token_count, 0, d.hash,
                                    tenant=d.tenant, parent=d.parent, shared=d.shared, kv_dtype=L.kv_dtype)
            self.datapath.put(reg.region, header, cf.block_key(self.salt, d.hash),
                              L.chunk_runs(block, d.token_count), then,
                              kv_parts=L.num_layers)  # a MAC per layer: a restore checks each group as it lands
        except Exception as exc:  # a bug must end on the counter, not in a lost future
            logger.exception("the standing PUT of %s's block %d failed", d.user, d.chunk_index)
            then(None, DataError("internal", str(exc)))
