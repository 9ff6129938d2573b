"""Registered regions: a compute node's shared memory mapped by the agent (fi_mr_reg).

Every call about a region presents its access key. The agent is the one writer of the
counters it bumps (completions, counter ops); the lock makes its read-add-store atomic
against its own threads.
"""
from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading

from hostmem.kv_layout import KvLayout
from hostmem.layout_proto import layout_from_proto
from smartnic.standing import StandingPuts
from hostmem.region import Region, RegionError

logger = logging.getLogger(__name__)


class UnknownRegion(LookupError):
    """No region with that id is registered."""


class AccessDenied(PermissionError):
    """The access key does not match the region's."""


@dataclasses.dataclass
class Registered:
    """One registered region. Counter updates by the agent go through `lock`."""

    region_id: int
    region: Region
    access_key: str
    layout: KvLayout | None = None
    owner: str = ""
    compute_address: str = ""
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)
    errors: collections.deque = dataclasses.field(default_factory=lambda: collections.deque(maxlen=1024))
    closed: bool = False
    standing: StandingPuts | None = None  # step 1: one standing PUT per block of a pool with a layout

    def add(self, counter: int, success: int = 0, error: int = 0) -> tuple[int, int]:
        with self.lock:
            return self.region.add_counter(counter, success, error)

    def set(self, counter: int, success: int, error: int | None = None) -> tuple[int, int]:
        with self.lock:
            self.region.store_counter(counter, success, error)
            return self.region.read_counter(counter)


class Registrations:
    """The registered regions: region id -> Registered. Thread-safe."""

    def __init__(self):
        self._lock = threading.Lock()
        self._regions: dict[int, Registered] = {}
        self._ids = itertools.count(1)
        self.version = 0  # moves at every registration and deregistration (the watcher's cache key)

    def register(self, shm_name: str, size: int, access_key: str, counter_offset: int,
                 counter_count: int, layout_msg=None, owner: str = "",
                 compute_address: str = "", region_id: int | None = None) -> Registered:
        """Map the region; raise RegionError when it cannot be mapped or its layout is wrong. region_id:
        the id the agent's control plane gave it (the fast path's process maps it under the same id)."""
        if not access_key:
            raise RegionError("an access key is required")
        layout = layout_from_proto(layout_msg) if layout_msg is not None else None
        if layout is not None and (layout.region_bytes > size or layout.counter_offset != counter_offset
                                   or layout.counter_count != counter_count):
            raise RegionError(f"kv_layout needs {layout.region_bytes} bytes with counters at "
                              f"{layout.counter_offset}; got {size} bytes, counters at {counter_offset}")
        region = Region.attach(shm_name, size, counter_offset, counter_count)
        region.populate()  # mapped here now: a restore's landing never stops at a page fault
        # armed: step 1 (with the whole region: the compiled poller can check descriptors in it)
        standing = StandingPuts(layout, region.counters, region.array) if layout is not None else None
        with self._lock:
            if region_id is not None and region_id in self._regions:
                region.close()
                raise RegionError(f"region {region_id} is registered already")
            reg = Registered(next(self._ids) if region_id is None else region_id, region, access_key, layout, owner,
                             compute_address, standing=standing)
            self._regions[reg.region_id] = reg
            self.version += 1
        logger.info("registered region %d: %s (%d bytes, %d counters) of %r%s", reg.region_id, shm_name,
                    size, counter_count, owner,
                    f"; armed {len(standing)} standing triggered PUTs, one per block" if standing else "")
        return reg

    def get(self, region_id: int, access_key: str | None = None) -> Registered:
        """The region; with a key, check it (None: an internal caller)."""
        with self._lock:
            reg = self._regions.get(region_id)
        if reg is None:
            raise UnknownRegion(f"no registered region {region_id}")
        if access_key is not None and access_key != reg.access_key:
            raise AccessDenied(f"wrong access key for region {region_id}")
        return reg

    def deregister(self, region_id: int, access_key: str) -> Registered:
        reg = self.get(region_id, access_key)
        with self._lock:
            self._regions.pop(region_id, None)
            self.version += 1
        reg.closed = True
        if reg.standing is not None:
            reg.standing.close()  # its poller reads the region: stopped first
        reg.region.close()
        logger.info("deregistered region %d", region_id)
        return reg

    def all(self) -> list[Registered]:
        with self._lock:
            return list(self._regions.values())

    def for_compute(self, name_or_address: str = "") -> Registered | None:
        """The latest region with a compute address (matching an owner or address when given)."""
        for reg in reversed(self.all()):
            if reg.compute_address and (not name_or_address
                                        or name_or_address in (reg.owner, reg.compute_address)):
                return reg
        return None

    def close(self) -> None:
        for reg in self.all():
            reg.closed = True
            if reg.standing is not None:
                reg.standing.close()
            reg.region.close()
