"""Rendezvous (highest random weight) placement of chunks over storage nodes, pure.

Adding a node moves only the chunks that now rank it first; removing one moves only its own.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence


def _weight(key: bytes, node: str) -> int:
    digest = hashlib.blake2b(key + b"\0" + node.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def rank(key: bytes, nodes: Sequence[str]) -> list[str]:
    """Nodes in preference order for `key` (the first is its home)."""
    return sorted(nodes, key=lambda node: (_weight(key, node), node), reverse=True)


def place(key: bytes, nodes: Sequence[str], available: set[str] | None = None) -> str | None:
    """The highest-ranked node for `key` among `available` (all when None); None if none is."""
    for node in rank(key, nodes):
        if available is None or node in available:
            return node
    return None
