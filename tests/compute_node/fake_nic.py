"""An in-process stand-in for the agent's data plane over a node's pool, for the engine's tests.

It plays the NIC's part of the contract exactly as the region defines it (hostmem.kv_layout,
hostmem.descriptor): it watches every block's PUT trigger counter, reads the block's descriptor,
keeps the block's token ids and KV bytes under the descriptor's hash and bumps the PUT-done
counter; it answers a restore event by copying stored blocks back and bumping their GET-done
counters (the error part for what it does not have, or was told to fail). Told to, it lands a
restore layer group by layer group as the agent does (group 0 with the token ids, each later
group's layers `group_delay_s` after the one before, garbage in them until then), fails a block
from a given group on, or never lands some groups. The real agent is tested against the same
contract with real processes (tests/smartnic, tests/e2e).
"""
from __future__ import annotations

import threading
import time

import numpy as np

from hostmem import descriptor
from hostmem.block_hash import Salts, stored_prefix


class FakeNic:
    """Thread-safe: a watcher thread stores blocks; restores run on the caller's thread."""

    def __init__(self, pool, put_delay_s: float = 0.0):
        self.pool, self.layout = pool, pool.layout
        self.put_delay_s = put_delay_s
        self.stored: dict[bytes, tuple[bytes, bytes, int]] = {}  # hash -> (token ids, kv, token count)
        self.descriptors: list[descriptor.Descriptor] = []
        self.fail: set[bytes] = set()       # hashes whose GET ends with an error
        self.silent: set[bytes] = set()     # hashes whose GET never completes
        self.group_delay_s = 0.0            # > 0: land layer group by layer group, this long apart
        self.fail_from: dict[bytes, int] = {}   # hash -> the layer group its GET fails from (layer-wise)
        self.silent_groups: set[int] = set()    # layer groups that never land (layer-wise)
        self.refused = 0
        self._lock = threading.Lock()
        L = self.layout
        self._triggers = np.asarray([L.put_trigger(b) for b in range(L.num_blocks)], dtype=np.intp)
        self._fired = pool.counters[self._triggers, 0].copy()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    # -- PUTs
    def _watch(self) -> None:
        while not self._stop.is_set():
            now = self.pool.counters[self._triggers, 0]
            for block in np.flatnonzero(now != self._fired).tolist():
                self._fired[block] = now[block]
                self._put(block, int(now[block]))
            time.sleep(0.0002)

    def _put(self, block: int, generation: int) -> None:
        if self.put_delay_s:
            time.sleep(self.put_delay_s)
        L = self.layout
        offset, _ = L.descriptor_range(block)
        try:
            d = descriptor.decode(self.pool.region.view(offset, descriptor.DESCRIPTOR_BYTES), L.block_tokens)
            if d.generation != generation:
                raise descriptor.DescriptorError("stale descriptor")
        except descriptor.DescriptorError:
            self.refused += 1
            self.pool.region.add_counter(L.put_done(block), error=1)
            return
        ids_offset, ids_length = L.token_ids_range(block, d.token_count)
        kv_offset, kv_length = L.block_range(block)
        with self._lock:
            self.stored[d.hash] = (bytes(self.pool.region.view(ids_offset, ids_length)),
                                   bytes(self.pool.region.view(kv_offset, kv_length)), d.token_count)
            self.descriptors.append(d)
        self.pool.region.add_counter(L.put_done(block), success=1)

    # -- step 5 and GETs
    def lookup(self, token_ids, tenant: str = "default", user: str = "u", shared_tokens: int = 0) -> int:
        """The agent's step-5 answer: tokens of the prefix it has stored (one left to compute)."""
        bt = self.layout.block_tokens
        with self._lock:
            tokens, _ = stored_prefix(token_ids, Salts.of(tenant, user, shared_tokens, bt), bt,
                                      self.stored.__contains__, len(token_ids) - 1)
        return tokens

    def restore(self, event) -> None:
        """Serve a restore event: copy each stored block into its pool block, bump its counters."""
        if self.group_delay_s:
            threading.Thread(target=self._restore_by_group, args=(event,), daemon=True).start()
            return
        L = self.layout
        for b in event.blocks:
            if b.hash in self.silent:
                continue
            with self._lock:
                found = self.stored.get(b.hash)
            ok = found is not None and b.hash not in self.fail and found[2] == b.token_count
            if ok:
                ids, kv, count = found
                self.pool.region.write(L.token_ids_range(b.block, count)[0], ids)
                self.pool.region.write(L.block_range(b.block)[0], kv)
            for g in range(event.layer_groups):
                self.pool.region.add_counter(L.get_done(b.block, g), success=int(ok), error=int(not ok))

    def _restore_by_group(self, event) -> None:
        """Land the blocks layer group by layer group, garbage in each group's layers until it lands."""
        L, region = self.layout, self.pool.region
        with self._lock:
            found = [self.stored.get(b.hash) for b in event.blocks]
        for b in event.blocks:
            offset, length = L.block_range(b.block)
            region.write(offset, np.full(length // 4, 1e4, dtype=np.float32).tobytes())
        for g in range(event.layer_groups):
            if g:
                time.sleep(self.group_delay_s)
            if g in self.silent_groups:
                continue
            for b, hit in zip(event.blocks, found):
                ok = hit is not None and hit[2] == b.token_count and g < self.fail_from.get(b.hash, g + 1)
                if ok:
                    ids, kv, count = hit
                    if g == 0:
                        region.write(L.token_ids_range(b.block, count)[0], ids)
                    offset, length = L.group_range(b.block, g)
                    start = offset - L.block_range(b.block)[0]
                    region.write(offset, kv[start:start + length])
                region.add_counter(L.get_done(b.block, g), success=int(ok), error=int(not ok))
