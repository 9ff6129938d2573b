"""Read leases on keys: a host that read a key with CommandCapsule.lease_ms holds it until then (pure).

A KV_DELETE of a key that another host holds a lease on fails with "key leased" (fabric.status
KEY_LEASED) and deletes nothing, so one replica's eviction never deletes a block that another
replica found or is restoring; the storage node stays the authority on what it holds. A host's own
lease never stands in its own way (it knows what it reads: its eviction already spares a block
with a GET in flight, and it may delete what proved damaged). A later lease extends, never
shortens. Leases live in memory only (a restarted node has none) and are bounded by the index:
the namespace grants them only on keys it holds, forgets a deleted key's, and expired ones are
purged. An overwrite (KV_STORE of a leased key) is allowed and keeps the key's leases: a block's
key names its content, so the new value holds the same KV (the name's hash chain and the
deployment's salt fix it), and a reader that meets the new generation mid-read fails its MAC
check and does not use it. Not thread-safe: KvNamespace's lock guards it; the clock is passed in.
"""
from __future__ import annotations

from collections.abc import Iterable


class Leases:
    """key -> {host: expiry (monotonic seconds)}."""

    def __init__(self, purge_interval_s: float = 1.0):
        self._held: dict[bytes, dict[str, float]] = {}
        self.purge_interval_s = purge_interval_s
        self._next_purge = 0.0

    def __len__(self) -> int:
        return len(self._held)

    def grant(self, keys: Iterable[bytes], host: str, until: float, now: float) -> None:
        """Lease each key to host until `until` (extending, never shortening, its lease)."""
        for key in keys:
            hosts = self._held.setdefault(key, {})
            hosts[host] = max(hosts.get(host, 0.0), until)
        if now >= self._next_purge:
            self.purge(now)

    def held_by_other(self, key: bytes, host: str, now: float) -> bool:
        """Whether a host other than `host` holds an unexpired lease on key."""
        hosts = self._held.get(key)
        return bool(hosts) and any(h != host and until > now for h, until in hosts.items())

    def drop(self, key: bytes) -> None:
        """Forget key's leases (it was deleted)."""
        self._held.pop(key, None)

    def purge(self, now: float) -> int:
        """Forget expired leases; how many keys lost their last one."""
        self._next_purge = now + self.purge_interval_s
        gone = []
        for key, hosts in self._held.items():
            for host in [h for h, until in hosts.items() if until <= now]:
                del hosts[host]
            if not hosts:
                gone.append(key)
        for key in gone:
            del self._held[key]
        return len(gone)
