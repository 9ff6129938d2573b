"""The SmartNIC agent: regions, triggered operations, requester, eviction and data path together.

Its rooms: the standing PUTs' path (smartnic.put_path), the GETs of restores (smartnic.restore_path),
eviction (smartnic.evictor), the match-action tables (smartnic.match_tables) and the counter watcher
(smartnic.watcher); this class holds the index they share (the requester and the eviction policy,
under `lock`) and steps 1 and 5 (registration, lookup).

Invariants: a block is in the requester only after its Store was acknowledged (durable); a block
with a GET in flight is leased and not evicted; a GET that fails on a damaged, forged or stale
block drops it from the requester (and deletes it); every GET into a pool block bumps that block's
completion counters, the error part when it failed, so the compute node never waits past the
GET's deadline. A block's standing PUT stores it only under the key its descriptor's owner and
token ids name (a descriptor that is malformed, stale or names what the block does not hold is
refused and counted), and only when the admission setting keeps it (`on_reuse`: a name's first
sighting completes as skipped). A block marked shared (named under its tenant's salt alone) is
found by every user of that tenant, never by another tenant's.

Several replicas share the storage nodes, which are the authority on what they hold. A lookup's
full blocks missing in the index are asked of the nodes (`smartnic.discovery`: one round trip per
node, within discovery_timeout_s) and what names them goes into the index as "discovered". Reads
lease what they read on its node (read_lease_s), so another replica's eviction cannot delete a block
being found or restored: a delete the node refuses as "key leased" puts the block back in the index,
to be evicted later. A GET answered "key does not exist" (someone else deleted it) or finding a
newer generation (someone stored the name again) drops the block from the index and deletes nothing.
Thread-safety: `lock` guards the requester and the eviction policy; the watcher, registrations,
statistics and data path have their own locks.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

from fabric import chunk_format as cf
from hostmem.block_hash import Salts, stored_prefix
from hostmem.region import RegionError
from kvtb import placement
from scale import dilation
from smartnic import discovery
from smartnic.admission import Admission
from smartnic.data_plane import data_plane
from smartnic.datapath import ChunkRef, DataError, read_headers
from smartnic.eviction import make_policy
from smartnic.evictor import Evictor
from smartnic.fastpath.client import FastPath, FastPathError
from smartnic.match_tables import MatchTables
from smartnic.put_path import PutPath
from smartnic.registrations import Registered, Registrations
from smartnic.requester import Requester, StoredBlock
from smartnic.restore_path import Restore, RestoreBlock, RestorePath
from smartnic.settings import SmartNicSettings
from smartnic.stats import Stats
from smartnic.triggered import Entry
from smartnic.watcher import DataWork, engine_of

logger = logging.getLogger(__name__)

# GET errors after which a block is deleted: damaged, forged, moved, or an older copy
CORRUPT = ("crc_mismatch", "bad_header", "length_mismatch", "mac_mismatch", "stale_generation")
# ... and after which it is only dropped from the index: it may come back (a node reconnects), or the
# node holds what someone else decided (deleted it, or stored the name again)
LOST = ("timeout", "key_does_not_exist", "newer_generation")


class Agent:
    """One agent process's state and logic; see the module docstring for invariants."""

    def __init__(self, settings: SmartNicSettings):
        self.settings = settings
        self.lock = threading.RLock()
        self.requester = Requester()
        # the idle timer is in virtual seconds: under a hardware profile at D, a context idle ttl_s of
        # virtual time has been idle D x ttl_s of wall time (the eviction pass's interval likewise)
        self.dilation = dilation.current().dilation if dilation.current() is not None else 1.0
        self.policy = make_policy(settings.eviction_policy, settings.capacity_high_bytes,
                                  settings.capacity_low_bytes, settings.ttl_s * self.dilation)
        self.admission = Admission(settings.admission, settings.admission_max_names)
        self.proved_bad = discovery.ProvedBad()  # blocks whose GET failed their checks: not discovered again
        self.tables = MatchTables()  # the pipeline matches every turn in "ingress"
        self.stats = Stats()
        self.regions = Registrations()
        self.nodes, self.datapath = data_plane(settings, on_up=self._rebuild_from)
        # steps 1 and 2: standing PUTs fire on a thread of this process, or in the fast path's own process
        self.puts = PutPath(self.datapath, settings.salt, self.stats,
                            lambda name: self.admission.admit(name, self.requester.has), self._put_ended)
        self.fastpath: FastPath | None = None  # settings.fastpath == "process": started by start()
        thread = settings.fastpath == "thread"
        self.engine = engine_of(settings, self.regions, self.stats, self._handle_data,
                                fire_block=self.puts.fire if thread else None,
                                watcher_cpus=placement.parse_cpus(settings.fastpath_cpus) if thread else ())
        self.restores = RestorePath(self.lock, self.requester, self.datapath, self.stats, self.sync,
                                    lambda: self.fastpath, self._got)
        self.evictor = Evictor(settings.eviction_interval_s * self.dilation, self.lock, self.requester, self.policy,
                               self.datapath, self.stats)

    def start(self) -> None:
        """Connect to the storage nodes (rebuilding the hashmap), start the watcher and eviction."""
        own = set(placement.parse_cpus(self.settings.fastpath_cpus))
        if own and set(placement.current_cpus()) - own:  # the fast path's CPUs are its watcher's alone
            placement.pin("smartnic (control plane)", placement.format_cpus(set(placement.current_cpus()) - own))
        self.engine.start()
        self.nodes.start()
        if self.settings.fastpath == "process":
            self.fastpath = FastPath(self.settings, self.stats, self._put_reported, self._fired_elsewhere)
        self.evictor.start()

    def close(self) -> None:
        self.evictor.stop()
        self.engine.stop()
        if self.fastpath is not None:
            self.fastpath.close()
        self.puts.close()
        self.nodes.close()  # fails what is pending; the data path still runs those completions
        self.datapath.close()
        self.regions.close()

    # -- rebuild
    def _rebuild_from(self, node: str, client) -> None:
        found = read_headers(client, self.settings.namespace_id, node)
        now = time.time()
        with self.lock:
            loaded = self.requester.rebuild(found, now)
            for _, block in found:
                if self.requester.has(block.hash):
                    self.policy.touch(block.hash, self.requester.get(block.hash).length, now)
        logger.info("rebuilt %d blocks of %d found on %s", loaded, len(found), node)

    # -- registration (step 1) and the registered regions
    def register(self, shm_name: str, size: int, access_key: str, counter_offset: int, counter_count: int,
                 layout_msg=None, owner: str = "", compute_address: str = "") -> Registered:
        """Map a compute node's region (fi_mr_reg); RegionError when it cannot be mapped."""
        reg = self.regions.register(shm_name, size, access_key, counter_offset, counter_count, layout_msg,
                                    owner, compute_address)
        if self.fastpath is not None:
            try:
                self.fastpath.register(reg)  # armed there before the compute node hears it is registered
            except FastPathError as exc:
                self.regions.deregister(reg.region_id, access_key)
                raise RegionError(f"the fast path could not map the region: {exc}") from exc
        self.engine.wake()  # its standing PUTs are armed: the watcher polls them from now on
        return reg

    def deregister(self, region_id: int, access_key: str) -> None:
        reg = self.regions.get(region_id, access_key)
        if self.fastpath is not None and reg.layout is not None:
            self.fastpath.deregister(region_id)
        self.engine.flush(region_id)
        self.regions.deregister(region_id, access_key)

    def registration(self, region_id: int, access_key: str | None = None) -> Registered:
        """A registered region; with a key, checked (AccessDenied, UnknownRegion)."""
        return self.regions.get(region_id, access_key)

    def compute_target(self, name: str = "") -> tuple[str, Registered | None]:
        """(address, region) of the compute node named by a table action ("" for the registered one)."""
        reg = self.regions.for_compute(name)
        if reg is not None:
            return reg.compute_address, reg
        address = name if ":" in name else self.settings.compute_address
        return address, self.regions.for_compute(address) if address else None

    # -- triggered operations (the deferred work queue)
    def queue_triggered(self, reg: Registered, works) -> list[int]:
        """Queue (trigger, threshold, work, completion) entries of one region, all or none."""
        return self.engine.queue(reg, works)

    def cancel(self, reg: Registered, counter: int) -> int:
        return self.engine.cancel(reg.region_id, counter)

    def flush(self, reg: Registered) -> int:
        return self.engine.flush(reg.region_id)

    @staticmethod
    def read_errors(reg: Registered, limit: int) -> list:
        """Take up to `limit` of the region's failed operations, oldest first."""
        errors = []
        while reg.errors and len(errors) < limit:
            errors.append(reg.errors.popleft())
        return errors

    # -- step 1's standing PUTs: a block that filled (fired by its trigger counter; smartnic.put_path)
    def block_put(self, reg: Registered, block: int, generation: int, verdict: str | None = None) -> int | None:
        """Fire a block's standing PUT on this thread (PutPath.fire; the thread fast path's work)."""
        return self.puts.fire(reg, block, generation, verdict)

    def _put_ended(self, stored: StoredBlock | None, context_id: str, err: DataError | None) -> None:
        """A standing PUT ended: the block goes into the index (before its PUT-done counter moves)."""
        if err is None:
            self._publish(stored, context_id)
        else:
            self.stats.inc_kind("errors", err.kind)

    def _put_reported(self, stored: StoredBlock | None, context_id: str, kind: str | None, message: str) -> None:
        """The fast path's process reported a standing PUT's end."""
        self._put_ended(stored, context_id, None if kind is None else DataError(kind, message))

    def _fired_elsewhere(self, region_id: int, block: int, generation: int, store_ns: int, fire_ns: int) -> None:
        """The fast path's process fired a block's PUT: the engine's hooks hear it (benchmarks)."""
        hooks = self.engine.on_block_fire
        if hooks:
            try:
                reg = self.regions.get(region_id)
            except LookupError:
                return
            for hook in hooks:
                hook(reg, block, generation, store_ns, fire_ns)

    def sync(self) -> None:
        """Take in every report the fast path's process sent so far (before a lookup)."""
        if self.fastpath is not None:
            self.fastpath.drain()

    def _publish(self, stored: StoredBlock, context_id: str, put: bool = True) -> None:
        """Index a block (after its PUT was acknowledged, or found on its node: put=False)."""
        now = time.time()
        with self.lock:  # never submit to the fabric while holding it: submit may block
            if not put and self.requester.has(stored.hash):
                return  # its own PUT published it meanwhile: that record (its generation) stands
            old = self.requester.publish(stored, context_id, stored.user_id, now)
            self.policy.touch(stored.hash, stored.length, now)
            if self.policy.over_capacity:
                self.evictor.wake()
        if old is not None and old.storage_node != stored.storage_node:
            self.datapath.delete(old)
        if put:
            self.stats.inc("bytes_put", stored.length)
            self.stats.inc("chunks_put")

    # -- one-off data operations of plain regions (QueueTriggered; tests and benchmarks)
    def _handle_data(self, reg: Registered, entry: Entry, done) -> None:
        work: DataWork = entry.op
        ref = work.ref
        if work.kind == "put":
            try:
                ids = reg.region.view(*work.token_ids)
            except (RegionError, ValueError) as exc:
                return done("bounds", str(exc))
            key = cf.chunk_key(self.settings.salt, ref.user_id, ref.context_id, ref.chunk_index)
            # a plain chunk's name: its ids under its (salted) key, so equal ids of two chunks are two names
            header = cf.ChunkHeader(ref.user_id, ref.context_id, ref.chunk_index, ref.token_start, ref.token_end,
                                    0, cf.token_ids_hash(key + bytes(ids)))
            return self.datapath.put(reg.region, header, key, work.runs,
                                     lambda stored, err: self._plain_stored(ref, stored, err, done))
        with self.lock:
            ctx = self.requester.context(ref.user_id, ref.context_id)
            name = ctx.hashes[ref.chunk_index] if ctx and ref.chunk_index < len(ctx.hashes) else None
            stored = self.requester.get(name) if name else None
        if stored is None:
            return done("not_found", "no such chunk in the requester")
        self.datapath.get(reg.region, stored, work.runs,
                          lambda nbytes, err: self._got(stored, err, lambda kind, msg: done(kind, msg)))

    def _plain_stored(self, ref: ChunkRef, stored: StoredBlock | None, err: DataError | None, done) -> None:
        if err is not None:
            return done(err.kind, str(err))
        self._publish(stored, ref.context_id)
        done(None, "")

    def _got(self, stored: StoredBlock, err: DataError | None, then) -> None:
        """After a GET: count it, drop a block that proved damaged, forged or stale, then `then`."""
        if err is not None:
            with self.lock:
                dropped = self.requester.remove(stored.hash) if err.kind in CORRUPT + LOST else None
                self.policy.remove(stored.hash) if dropped is not None else None
                if err.kind in CORRUPT:
                    self.proved_bad.add(stored.hash, stored.generation)
            if dropped is not None:
                self.stats.inc_kind("dropped_chunks", err.kind)
                if err.kind in CORRUPT:  # garbage on the node; a timed-out block may come back on reconnect
                    self.datapath.delete(dropped)
            return then(err.kind, str(err))
        self.stats.inc("bytes_got", stored.length)  # the value moved, as bytes_put counts it
        then(None, "")

    # -- steps 5 to 7: lookups and restores
    def stored_tokens(self, user_id: str, tenant: str, token_ids: Sequence[int], shared_tokens: int = 0) -> int:
        """Tokens of the prefix of token_ids whose blocks are stored under the user's salt, or the
        tenant's for the full blocks of the first shared_tokens (the tenant's shared prefix) (step 5)."""
        self.sync()
        bt = self.block_tokens()
        if not bt:  # no pool registered: no block of it can be named
            self.stats.inc("misses")
            self.stats.inc("lookup_requested_tokens", len(token_ids))
            return 0
        salts = Salts.of(tenant, user_id, shared_tokens, bt)
        if self.settings.discovery:
            self.discover(user_id, tenant, token_ids, salts, bt)
        now = time.time()
        with self.lock:
            tokens, names = stored_prefix(token_ids, salts, bt, self.requester.has, len(token_ids) - 1)
            self.requester.touch(names, now)
            for name in names:
                self.policy.touch(name, self.requester.get(name).length, now)
        self.stats.inc("hits" if tokens else "misses")
        self.stats.inc("lookup_requested_tokens", len(token_ids))
        self.stats.inc("lookup_hit_tokens", tokens)
        return tokens

    def discover(self, user_id: str, tenant: str, token_ids: Sequence[int], salts: Salts, bt: int) -> int:
        """The miss path: ask the storage nodes for the full blocks of the prompt (up to its last token) that
        the index lacks, all of a node's at once, and publish those whose header names them; how many."""
        with self.lock:
            wanted = discovery.wanted(token_ids, salts, bt, len(token_ids) - 1, self.settings.salt, self.requester.has)
        asks = discovery.by_node(wanted, self.nodes.names, self.nodes.up())
        if not asks:
            return 0
        reg = self.regions.for_compute()
        size = discovery.head_bytes(tenant, reg.layout.chunk_payload_bytes(bt) if reg and reg.layout else None)
        answers, silent = self.datapath.read_heads({node: [w.key for w in ws] for node, ws in asks.items()}, size,
                                                   self.settings.discovery_timeout_s, self.settings.lease_ms)
        found = [found for node, ws in asks.items() for found in self._take(node, ws, answers[node], bt, tenant, user_id)]
        self.stats.inc("discovery_requests", len(asks))
        self.stats.inc("discovery_timeouts", len(silent))
        for block, context_id in found:
            self._publish(block, context_id, put=False)
        self.stats.inc("discovered_blocks", len(found))
        return len(found)

    def _take(self, node: str, wanted: list, answers: list, bt: int, tenant: str, user_id: str) -> list:
        """(block, context id) of the answers of one node whose header names the block wanted."""
        taken = []
        for want, head in zip(wanted, answers):
            if head is None:
                continue
            block, context_id, why = discovery.found_block(head, node, want, bt, tenant, user_id,
                                                           self.datapath.mac_key is not None)
            if block is None:
                logger.warning("block %s on %s not taken: %s", want.name.hex()[:12], node, why)
                self.stats.inc("discovery_mismatched")
            else:
                taken.append((block, context_id))
        with self.lock:
            return [(b, c) for b, c in taken if (b.hash, b.generation) not in self.proved_bad]

    def block_tokens(self) -> int:
        """The block size of the registered pool: the compute node's setting, told at registration (0 before
        a compute node registered: nothing can be looked up or restored then)."""
        reg = self.regions.for_compute()
        return reg.layout.block_tokens if reg is not None and reg.layout is not None else 0

    def restore_blocks(self, reg: Registered, user_id: str, tenant: str, blocks: Sequence[RestoreBlock],
                       layer_groups: int) -> Restore:
        """GET each stored block into its pool block (steps 6 and 7: smartnic.restore_path)."""
        return self.restores.restore(reg, user_id, tenant, blocks, layer_groups)

    # -- the operator's views of the requester
    def lookup(self, user_id: str, context_id: str) -> list[StoredBlock]:
        """A context's stored blocks in order (up to the first missing one)."""
        self.sync()
        with self.lock:
            ctx = self.requester.context(user_id, context_id)
            out = []
            for name in ctx.hashes if ctx else []:
                block = self.requester.get(name)
                if block is None:
                    break
                out.append(block)
            return out

    def list_contexts(self, user_id: str = "") -> list[tuple[str, str]]:
        """(user, context) of the contexts with stored blocks ("" user: all)."""
        with self.lock:
            return [(c.user_id, c.context_id) for c in self.requester.contexts(user_id)]

    def drop_context(self, user_id: str, context_id: str, reason: str = "dropped") -> int:
        """Forget a context and delete its blocks that no other context lists; how many."""
        with self.lock:
            orphans = self.requester.drop_context(user_id, context_id)
            for block in orphans:
                self.policy.remove(block.hash)
        return self.evictor.delete(orphans, reason)

    # -- statistics
    def snapshot(self) -> dict:
        self.sync()
        counts, by_kind = self.stats.snapshot()
        p50, p99 = self.stats.percentiles()
        with self.lock:
            blocks = list(self.requester.blocks.values())
            contexts = len(self.requester.contexts())
        by_node: dict[str, int] = {}
        for b in blocks:
            by_node[b.storage_node] = by_node.get(b.storage_node, 0) + b.length
        return {**counts, "evictions_by_reason": by_kind.get("evictions", {}),
                "errors_by_kind": by_kind.get("errors", {}), "p50": p50, "p99": p99,
                "queue_depth": self.engine.depth, "contexts": contexts, "chunks": len(blocks),
                "bytes_by_storage_node": by_node, "bytes_stored": sum(by_node.values()),
                "fastpath": self.settings.fastpath, "fastpath_pid": self.fastpath.pid if self.fastpath else 0,
                "watcher_busy_poll": self.settings.watcher_busy_poll}
