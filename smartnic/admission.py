"""Which blocks a standing PUT keeps on storage (pure).

`always` (the paper's behaviour): every block that fills is stored. `on_reuse` (Dynamo's disk
tier): a block is stored only once its name has been seen twice; the first sighting is only
remembered (in a bounded LRU set of names) and the PUT completes as skipped, so one-shot KV never
reaches storage and cannot crowd out conversations that come back.
"""
from __future__ import annotations

import collections
from collections.abc import Callable

from smartnic.settings import ADMISSIONS


class Admission:
    """Not thread-safe: the watcher thread that fires standing PUTs is its only caller."""

    def __init__(self, mode: str = "always", max_names: int = 1 << 20):
        if mode not in ADMISSIONS:
            raise ValueError(f"admission: one of {ADMISSIONS}, got {mode!r}")
        if max_names <= 0:
            raise ValueError(f"max_names must be positive, got {max_names}")
        self.mode, self.max_names = mode, max_names
        self._seen: collections.OrderedDict[bytes, None] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def admit(self, name: bytes, stored: Callable[[bytes], bool] = lambda name: False) -> bool:
        """Whether to store a block of this name now (`stored(name)`: a copy is on storage already,
        asked only under on_reuse)."""
        if self.mode == "always" or stored(name):
            return True
        if name in self._seen:
            del self._seen[name]  # its second sighting: stored from now on, the agent's index knows it
            return True
        self._seen[name] = None
        if len(self._seen) > self.max_names:
            self._seen.popitem(last=False)
        return False
