"""The KV-cache requester's hashmap: (user, context) -> ordered chunk descriptors (pure).

A chunk is published only once its PUT is durable, so whatever the map holds can be fetched.
Each context has one owner: another user's lookup or publish is refused. A context being
restored is leased and must not be evicted while its GETs are in flight.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from fabric.chunk_format import token_ids_hash


class NotOwner(PermissionError):
    """The context belongs to another user."""


@dataclasses.dataclass
class Chunk:
    """Where one chunk of a context lives and what it covers."""

    chunk_index: int
    token_start: int
    token_end: int
    storage_node: str
    key: bytes
    length: int
    crc32c: int
    token_ids_hash: bytes
    generation: int = 0  # the version the PUT wrote; a GET refuses a chunk of another one
    last_use: float = 0.0


@dataclasses.dataclass
class Context:
    """A context's chunks by index, its owner, its last use and its leases.

    Invariant: bytes == the sum of its chunks' lengths; change chunks only through put() and
    pop(), which keep it (a PUT completion reads it: summing the chunks there made a context
    of n chunks cost O(n^2) to store)."""

    user_id: str
    context_id: str
    chunks: dict[int, Chunk] = dataclasses.field(default_factory=dict)
    last_use: float = 0.0
    leases: int = 0
    bytes: int = 0

    def put(self, chunk: Chunk) -> Chunk | None:
        """Add or replace the chunk at its index; the chunk it replaced."""
        old = self.chunks.get(chunk.chunk_index)
        self.chunks[chunk.chunk_index] = chunk
        self.bytes += chunk.length - (old.length if old is not None else 0)
        return old

    def pop(self, chunk_index: int) -> Chunk:
        """Remove and return the chunk at chunk_index (KeyError when absent)."""
        chunk = self.chunks.pop(chunk_index)
        self.bytes -= chunk.length
        return chunk

    def ordered(self) -> list[Chunk]:
        return [self.chunks[i] for i in sorted(self.chunks)]


class Requester:
    """The hashmap. Not thread-safe: the agent serialises calls with its lock."""

    def __init__(self):
        self._contexts: dict[str, Context] = {}  # by context id: one owner per context id

    def __len__(self) -> int:
        return len(self._contexts)

    def owner(self, context_id: str) -> str | None:
        ctx = self._contexts.get(context_id)
        return ctx.user_id if ctx else None

    def check_owner(self, user_id: str, context_id: str) -> None:
        """Raise NotOwner when the context exists and belongs to someone else."""
        owner = self.owner(context_id)
        if owner is not None and owner != user_id:
            raise NotOwner(f"context {context_id!r} belongs to another user")

    def get(self, user_id: str, context_id: str) -> Context | None:
        self.check_owner(user_id, context_id)
        return self._contexts.get(context_id)

    def contexts(self, user_id: str = "") -> list[Context]:
        return [c for c in self._contexts.values() if not user_id or c.user_id == user_id]

    def publish(self, user_id: str, context_id: str, chunk: Chunk, now: float) -> Chunk | None:
        """Add or replace a chunk after its durable PUT; return the chunk it replaced."""
        self.check_owner(user_id, context_id)
        ctx = self._contexts.setdefault(context_id, Context(user_id, context_id))
        chunk.last_use = now
        ctx.last_use = max(ctx.last_use, now)
        return ctx.put(chunk)

    def drop_chunk(self, user_id: str, context_id: str, chunk_index: int) -> Chunk | None:
        """Forget one chunk (a corrupt or lost one); a prefix match stops at the gap."""
        ctx = self._contexts.get(context_id)
        if ctx is None or ctx.user_id != user_id or chunk_index not in ctx.chunks:
            return None
        dropped = ctx.pop(chunk_index)
        if not ctx.chunks:
            del self._contexts[context_id]
        return dropped

    def remove(self, context_id: str) -> Context | None:
        return self._contexts.pop(context_id, None)

    def match_prefix(self, user_id: str, context_id: str, token_ids: Sequence[int],
                     now: float) -> list[Chunk]:
        """The leading chunks (0, 1, ...) whose token ids equal a prefix of token_ids."""
        ctx = self.get(user_id, context_id)
        if ctx is None:
            return []
        matched, expected_start = [], 0
        for chunk in ctx.ordered():
            if chunk.token_start != expected_start or chunk.token_end > len(token_ids):
                break
            if token_ids_hash(list(token_ids[chunk.token_start:chunk.token_end])) != chunk.token_ids_hash:
                break
            matched.append(chunk)
            expected_start = chunk.token_end
        if matched:
            ctx.last_use = now
            for chunk in matched:
                chunk.last_use = now
        return matched

    def lease(self, context_id: str, count: int = 1) -> None:
        ctx = self._contexts.get(context_id)
        if ctx is not None:
            ctx.leases += count

    def release(self, context_id: str, count: int = 1) -> None:
        ctx = self._contexts.get(context_id)
        if ctx is not None:
            ctx.leases = max(0, ctx.leases - count)

    def leased(self, context_id: str) -> bool:
        ctx = self._contexts.get(context_id)
        return bool(ctx and ctx.leases)

    def total_bytes(self) -> int:
        return sum(c.bytes for c in self._contexts.values())

    def rebuild(self, found: Iterable[tuple[str, str, Chunk]], now: float) -> int:
        """Load (user, context, chunk) found on the storage nodes; the longer chunk wins a tie."""
        loaded = 0
        for user_id, context_id, chunk in found:
            ctx = self._contexts.setdefault(context_id, Context(user_id, context_id, last_use=now))
            if ctx.user_id != user_id:
                continue  # a key collision across users cannot happen with a keyed hash
            old = ctx.chunks.get(chunk.chunk_index)
            if old is None or chunk.token_end > old.token_end:
                chunk.last_use = now
                ctx.put(chunk)
                loaded += old is None
        return loaded
