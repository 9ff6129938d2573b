"""The agent's match-action tables (P4Runtime's Write and Read over smartnic.match_action), by name.

"ingress" matches every turn entering the agent (smartnic.ingress); other tables are made on first
use, as a P4 program's would be declared. Thread-safe: one lock over every table.
"""
from __future__ import annotations

import threading
from collections.abc import Sequence

from smartnic import match_action as ma

INGRESS = "ingress"


class MatchTables:
    """Tables by name ("" is "ingress"); writes are all or none."""

    def __init__(self):
        self._lock = threading.Lock()
        self._tables = {INGRESS: ma.Table(INGRESS)}

    def _table(self, name: str) -> ma.Table:
        """A table by name, created on first use; call with the lock held."""
        name = name or INGRESS
        if name not in self._tables:
            self._tables[name] = ma.Table(name)
        return self._tables[name]

    def match(self, packet: dict, now: float) -> ma.Decision:
        """Look a turn up in the ingress table (counting the hit)."""
        with self._lock:
            return self._table(INGRESS).lookup(packet, now)

    def write(self, updates: Sequence[tuple[str, str, ma.Entry]]) -> list[int]:
        """Apply (kind: insert|modify|delete, table, entry) updates, all or none; the entry ids."""
        with self._lock:
            for kind, name, entry in updates:  # check ids first so that a bad one changes nothing
                if kind != "insert" and entry.entry_id not in self._table(name).entries:
                    raise ma.TableError(f"table {name or INGRESS!r} has no entry {entry.entry_id}")
            ops = {"insert": ma.Table.insert, "modify": ma.Table.modify,
                   "delete": lambda table, entry: table.delete(entry.entry_id)}
            return [ops[kind](self._table(name), entry) for kind, name, entry in updates]

    def read(self, name: str) -> tuple[str, list[ma.Entry], ma.Action, int]:
        """(name, entries, default action, default hits) of a table."""
        with self._lock:
            table = self._table(name)
            return table.name, list(table.entries.values()), table.default, table.default_hits

    def set_default(self, name: str, action: ma.Action) -> None:
        with self._lock:
            self._table(name).default = action
