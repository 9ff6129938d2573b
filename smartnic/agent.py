"""The SmartNIC agent: regions, triggered engine, requester, eviction and data path together.

Invariants: a chunk is in the requester only after its Store was acknowledged (durable); a
context with GETs in flight is leased and not evicted; a GET that fails drops its chunk
from the requester and bumps its completion counter's error part.
Thread-safety: `lock` guards the requester and the eviction policy; the engine, regions,
statistics and data path have their own locks.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Sequence

from fabric.auth import FabricSecurity
from kvtb.credentials import Credentials, resolve_dir
from smartnic.datapath import ChunkRef, Datapath, read_headers
from smartnic.watcher import DataWork, TriggerEngine
from smartnic.eviction import make_policy
from fabric.nodes import StorageNodes
from smartnic import match_action as ma
from hostmem.region import RegionError
from smartnic.registrations import Registrations, Registered
from smartnic.requester import Chunk, Requester
from smartnic.settings import SmartNicSettings
from smartnic.stats import Stats
from smartnic.triggered import Entry

logger = logging.getLogger(__name__)

# GET errors after which a chunk is deleted: damaged, forged, moved, or an older copy
CORRUPT = ("crc_mismatch", "bad_header", "length_mismatch", "mac_mismatch", "stale_generation")


@dataclasses.dataclass
class Restore:
    """GETs of a context's leading chunks into a slot (steps 6 and 7)."""

    region_id: int
    slot: int
    context_id: str
    chunks: int
    tokens_announced: int
    completion_counter: int
    threshold: int
    error_base: int
    bytes: int
    started_ns: int
    done_ns: int = 0
    failed: int = 0
    _left: int = 0


class Agent:
    """One agent process's state and logic; see the module docstring for invariants."""

    def __init__(self, settings: SmartNicSettings):
        self.settings = settings
        self.lock = threading.RLock()
        self.requester = Requester()
        self.policy = make_policy(settings.eviction_policy, settings.capacity_high_bytes,
                                  settings.capacity_low_bytes, settings.ttl_s)
        self.tables = {"ingress": ma.Table("ingress")}  # the pipeline matches every turn in "ingress"
        self.stats = Stats()
        self.regions = Registrations()
        fabric = FabricSecurity.for_host(settings.fabric_security, settings.credentials_dir, settings.host_nqn)
        mac_key = Credentials(resolve_dir(settings.credentials_dir), "smartnic").kv_mac_key() \
            if settings.kv_mac else None
        self.nodes = StorageNodes([(n.name, n.fabric_address) for n in settings.storage_nodes],
                                  settings.host_nqn, settings.queue_depth, settings.fabric_timeout_s,
                                  settings.reconnect_interval_s, on_up=self._rebuild_from, security=fabric)
        self.datapath = Datapath(self.nodes, settings.namespace_id, settings.salt, settings.get_timeout_s,
                                 settings.datapath_workers, settings.view_min_bytes,
                                 settings.get_pdu_bytes, mac_key)
        self.engine = TriggerEngine(self.regions, self.stats, self._handle_data, settings.queue_bound,
                                    settings.watcher_spin_us * 1e-6, settings.watcher_max_sleep_us * 1e-6)
        self._stop = threading.Event()
        self._evictor = threading.Thread(target=self._eviction_loop, name="eviction", daemon=True)

    def start(self) -> None:
        """Connect to the storage nodes (rebuilding the hashmap), start the watcher and eviction."""
        self.engine.start()
        self.nodes.start()
        self._evictor.start()

    def close(self) -> None:
        self._stop.set()
        self.engine.stop()
        self.nodes.close()  # fails what is pending; the data path still runs those completions
        self.datapath.close()
        self.regions.close()

    # -- rebuild
    def _rebuild_from(self, node: str, client) -> None:
        found = read_headers(client, self.settings.namespace_id, node)
        now = time.time()
        with self.lock:
            loaded = self.requester.rebuild(found, now)
            for ctx in self.requester.contexts():
                self.policy.touch(ctx.context_id, ctx.bytes, ctx.last_use)
        logger.info("rebuilt %d chunks of %d found on %s", loaded, len(found), node)

    # -- registration (step 1) and the registered regions
    def register(self, shm_name: str, size: int, access_key: str, counter_offset: int, counter_count: int,
                 layout_msg=None, owner: str = "", compute_address: str = "") -> Registered:
        """Map a compute node's region (fi_mr_reg); RegionError when it cannot be mapped."""
        return self.regions.register(shm_name, size, access_key, counter_offset, counter_count, layout_msg,
                                     owner, compute_address)

    def deregister(self, region_id: int, access_key: str) -> None:
        self.regions.get(region_id, access_key)
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
        for _, _, work, _ in works:
            if isinstance(work, DataWork):
                self.check_owner(work.ref.user_id, work.ref.context_id)
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

    # -- data operations fired by the engine
    def _handle_data(self, reg: Registered, entry: Entry, done) -> None:
        work: DataWork = entry.op
        if work.kind == "put":
            self.datapath.put(reg.region, work.ref, work.ranges, work.token_ids,
                              lambda chunk, err: self._put_done(work, chunk, err, done), work.runs)
            return
        chunk = work.chunk
        if chunk is None:
            with self.lock:
                ctx = self.requester.get(work.ref.user_id, work.ref.context_id)
                chunk = ctx.chunks.get(work.ref.chunk_index) if ctx else None
            if chunk is None:
                return self._get_done(work, None, 0, "not_found", "no such chunk in the requester", done)
        self.datapath.get(reg.region, work.ref, chunk, work.ranges, work.token_ids,
                          lambda nbytes, err: self._get_done(work, chunk, nbytes, err and err.kind,
                                                             str(err or ""), done), work.runs)

    def _put_done(self, work: DataWork, chunk: Chunk | None, err, done) -> None:
        if err is not None:
            return done(err.kind, str(err))
        now = time.time()
        try:
            with self.lock:  # never submit to the fabric while holding it: submit may block
                old = self.requester.publish(work.ref.user_id, work.ref.context_id, chunk, now)
                ctx = self.requester.get(work.ref.user_id, work.ref.context_id)
                self.policy.touch(work.ref.context_id, ctx.bytes, now)
        except PermissionError as exc:
            self.datapath.delete(chunk)
            return done("not_owner", str(exc))
        if old is not None and old.storage_node != chunk.storage_node:
            self.datapath.delete(old)
        self.stats.inc("bytes_put", chunk.length)
        self.stats.inc("chunks_put")
        done(None, "")

    def _get_done(self, work: DataWork, chunk: Chunk | None, nbytes: int, kind, message: str, done) -> None:
        restore: Restore | None = work.tag if isinstance(work.tag, Restore) else None
        if kind is not None and chunk is not None:
            with self.lock:
                dropped = self.requester.drop_chunk(work.ref.user_id, work.ref.context_id, chunk.chunk_index)
                if self.requester.owner(work.ref.context_id) is None:
                    self.policy.remove(work.ref.context_id)
            if dropped:
                self.stats.inc_kind("dropped_chunks", kind)
                if kind in CORRUPT:  # garbage on the node; a timed-out chunk may come back on reconnect
                    self.datapath.delete(dropped)
        if kind is None and chunk is not None:
            self.stats.inc("bytes_got", chunk.length)  # the value moved, as bytes_put counts it
        if restore is not None:
            with self.lock:
                self.requester.release(restore.context_id)
                restore._left -= 1
                restore.failed += kind is not None
                if restore._left == 0:
                    restore.done_ns = time.time_ns()
        done(kind, message)

    # -- match-action
    def table(self, name: str = "") -> ma.Table:
        """A table by name ("" is "ingress"), created on first use; call with `lock` held."""
        name = name or "ingress"
        if name not in self.tables:
            self.tables[name] = ma.Table(name)
        return self.tables[name]

    def match(self, packet: dict, now: float) -> ma.Decision:
        """Look a turn up in the ingress table (counting the hit)."""
        with self.lock:
            return self.table().lookup(packet, now)

    def write_table(self, updates: Sequence[tuple[str, str, ma.Entry]]) -> list[int]:
        """Apply (kind: insert|modify|delete, table, entry) updates, all or none; the entry ids."""
        with self.lock:
            for kind, name, entry in updates:  # check ids first so that a bad one changes nothing
                if kind != "insert" and entry.entry_id not in self.table(name).entries:
                    raise ma.TableError(f"table {name or 'ingress'!r} has no entry {entry.entry_id}")
            ops = {"insert": ma.Table.insert, "modify": ma.Table.modify,
                   "delete": lambda table, entry: table.delete(entry.entry_id)}
            return [ops[kind](self.table(name), entry) for kind, name, entry in updates]

    def read_table(self, name: str) -> tuple[str, list[ma.Entry], ma.Action, int]:
        """(name, entries, default action, default hits) of a table."""
        with self.lock:
            table = self.table(name)
            return table.name, list(table.entries.values()), table.default, table.default_hits

    def set_default_action(self, name: str, action: ma.Action) -> None:
        with self.lock:
            self.table(name).default = action

    # -- requester
    def lookup(self, user_id: str, context_id: str) -> list[Chunk]:
        with self.lock:
            ctx = self.requester.get(user_id, context_id)
            return ctx.ordered() if ctx else []

    def check_owner(self, user_id: str, context_id: str) -> None:
        with self.lock:
            self.requester.check_owner(user_id, context_id)

    def matching_chunks(self, user_id: str, context_id: str, token_ids: Sequence[int]) -> list[Chunk]:
        with self.lock:
            return self.requester.match_prefix(user_id, context_id, token_ids, time.time())

    def restore(self, reg: Registered, user_id: str, context_id: str, slot: int,
                token_ids: Sequence[int]) -> Restore:
        """Queue GETs (due at once) of the chunks covering a prefix of token_ids into `slot`."""
        if reg.layout is None:
            raise RegionError(f"region {reg.region_id} was registered without a kv_layout")
        layout = reg.layout
        counter = layout.restore_counter(slot)
        now = time.time()
        with self.lock:
            chunks = self.requester.match_prefix(user_id, context_id, token_ids, now)
            if chunks and chunks[-1].token_end > layout.max_tokens:
                chunks = [c for c in chunks if c.token_end <= layout.max_tokens]
            success, error = reg.region.read_counter(counter)
            restore = Restore(reg.region_id, slot, context_id, len(chunks),
                              chunks[-1].token_end if chunks else 0, counter, success + error + len(chunks),
                              error, sum(c.length for c in chunks), time.time_ns(), _left=len(chunks))
            if chunks:
                self.requester.lease(context_id, len(chunks))
                ctx = self.requester.get(user_id, context_id)
                self.policy.touch(context_id, ctx.bytes, now)
        self.stats.inc("hits" if chunks else "misses")
        self.stats.inc("lookup_requested_tokens", len(token_ids))
        self.stats.inc("lookup_hit_tokens", restore.tokens_announced)
        if not chunks:
            restore.done_ns = restore.started_ns
            return restore
        works = [(counter, 0, _restore_get(layout, slot, ChunkRef(user_id, context_id, c.chunk_index,
                                                                    c.token_start, c.token_end), c, restore),
                  counter) for c in chunks]
        try:
            self.engine.queue(reg, works)
        except Exception:
            with self.lock:
                self.requester.release(context_id, len(chunks))
            raise
        return restore

    def list_contexts(self, user_id: str = "") -> list[tuple[str, str]]:
        """(user, context) of the contexts with stored chunks ("" user: all)."""
        with self.lock:
            return [(c.user_id, c.context_id) for c in self.requester.contexts(user_id)]

    def drop_context(self, user_id: str, context_id: str, reason: str = "dropped") -> int:
        with self.lock:
            self.requester.check_owner(user_id, context_id)
            ctx = self.requester.remove(context_id)
            self.policy.remove(context_id)
        return self._delete(ctx, reason)

    def _delete(self, ctx, reason: str) -> int:
        if ctx is None:
            return 0
        for chunk in ctx.chunks.values():
            self.datapath.delete(chunk)
        self.stats.inc_kind("evictions", reason)
        logger.info("evicted context %s of %s (%s): %d chunks", ctx.context_id, ctx.user_id, reason,
                    len(ctx.chunks))
        return len(ctx.chunks)

    # -- eviction
    def evict(self, now: float) -> int:
        """Run the policy once; delete the victims' chunks and hashmap entries."""
        with self.lock:
            victims = self.policy.victims(now, self.requester.leased)
            removed = [(self.requester.remove(key), reason) for key, reason in victims]
        return sum(self._delete(ctx, reason) for ctx, reason in removed)

    def _eviction_loop(self) -> None:
        while not self._stop.wait(self.settings.eviction_interval_s):
            try:
                self.evict(time.time())
            except Exception:  # eviction must keep running
                logger.exception("eviction pass failed")

    # -- statistics
    def snapshot(self) -> dict:
        counts, by_kind = self.stats.snapshot()
        p50, p99 = self.stats.percentiles()
        with self.lock:
            contexts = self.requester.contexts()
            by_node: dict[str, int] = {}
            for ctx in contexts:
                for c in ctx.chunks.values():
                    by_node[c.storage_node] = by_node.get(c.storage_node, 0) + c.length
        return {**counts, "evictions_by_reason": by_kind.get("evictions", {}),
                "errors_by_kind": by_kind.get("errors", {}), "p50": p50, "p99": p99,
                "queue_depth": self.engine.depth, "contexts": len(contexts),
                "chunks": sum(len(c.chunks) for c in contexts), "bytes_by_storage_node": by_node,
                "bytes_stored": sum(by_node.values())}


def _restore_get(layout, slot: int, ref: ChunkRef, chunk: Chunk, restore: Restore) -> DataWork:
    """The GET of one chunk into a slot, its targets the runs the layout makes of it."""
    ids = layout.token_ids_range(slot, ref.token_start, ref.token_end)
    return DataWork("get", ref, (), ids, chunk, restore, layout.chunk_runs(slot, ref.token_start, ref.token_end))
