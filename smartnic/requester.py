"""The KV-cache requester: stored blocks by content, and each context's blocks in order (pure).

A block is named by its hash chain (hostmem.block_hash): its token ids, everything before it and
the salt of its owner (tenant and user, or the tenant alone for a prefix marked shared), so equal
prefixes of one owner are stored once and found whichever context stored them, and no owner can
name another's blocks. A block is published only once its PUT is durable, so whatever the index
holds can be fetched. A context (per user: the same context id of two users is two contexts)
lists its blocks in order, for the match-action path (step 5) and the operator's views. A block
being restored is leased and not evicted while its GET is in flight. A block's origin says how
the index learned of it: its own PUT ("own"), the storage nodes' contents at connect ("rebuilt"), or
the miss path (smartnic.discovery: "discovered", stored by another replica's agent).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from fabric import chunk_format as cf

ContextKey = tuple[str, str]  # (user id, context id)


@dataclasses.dataclass
class StoredBlock:
    """Where one stored block lives and what it holds."""

    hash: bytes
    parent: bytes
    tenant: str
    user_id: str            # whose context stored it
    shared: bool            # named under the tenant's salt alone (a prefix the operator marked shared)
    chunk_index: int
    token_count: int
    storage_node: str
    key: bytes
    length: int
    crc32c: int
    generation: int = 0     # the version the PUT wrote; a GET refuses another one
    header_bytes: int = 0   # its header's length: where its token ids, MACs and KV parts lie (range reads)
    last_use: float = 0.0
    leases: int = 0
    contexts: int = 0       # contexts that list it
    origin: str = "own"     # own (its PUT), rebuilt (found at connect) or discovered (the miss path)
    kv_dtype: str = "float32"  # its KV's element type, as its header says (hostmem.kv_dtype)


@dataclasses.dataclass
class Context:
    """A context's blocks in chunk order (hashes; a missing one ends what can be restored)."""

    user_id: str
    context_id: str
    tenant: str
    hashes: list[bytes] = dataclasses.field(default_factory=list)
    last_use: float = 0.0


class Requester:
    """The index. Not thread-safe: the agent serialises calls with its lock."""

    def __init__(self):
        self.blocks: dict[bytes, StoredBlock] = {}
        self._contexts: dict[ContextKey, Context] = {}

    def __len__(self) -> int:
        return len(self.blocks)

    def has(self, block_hash: bytes) -> bool:
        return block_hash in self.blocks

    def get(self, block_hash: bytes) -> StoredBlock | None:
        return self.blocks.get(block_hash)

    def context(self, user_id: str, context_id: str) -> Context | None:
        return self._contexts.get((user_id, context_id))

    def contexts(self, user_id: str = "") -> list[Context]:
        """Contexts with a stored first block (those whose first block is gone are forgotten here)."""
        for key in [k for k, c in self._contexts.items() if not c.hashes or c.hashes[0] not in self.blocks]:
            del self._contexts[key]
        return [c for c in self._contexts.values() if not user_id or c.user_id == user_id]

    def total_bytes(self) -> int:
        return sum(b.length for b in self.blocks.values())

    # -- publishing
    def publish(self, block: StoredBlock, context_id: str, user_id: str, now: float) -> StoredBlock | None:
        """Add (or replace) a block after its durable PUT and list it in the context; the block it replaced."""
        block.last_use = now
        old = self.blocks.get(block.hash)
        if old is not None:
            block.contexts, block.leases = old.contexts, old.leases
        self.blocks[block.hash] = block
        self._list(block, (user_id, context_id), now)
        return old if old is not None and old.key != block.key else None

    def _list(self, block: StoredBlock, key: ContextKey, now: float) -> None:
        ctx = self._contexts.get(key)
        if ctx is None:
            ctx = self._contexts[key] = Context(key[0], key[1], block.tenant)
        ctx.last_use = max(ctx.last_use, now)
        hashes, i = ctx.hashes, block.chunk_index
        if i < len(hashes) and hashes[i] == block.hash:
            return
        while len(hashes) < i:
            hashes.append(b"")  # a gap until the missing block is published (PUTs complete in any order)
        if i == len(hashes):
            hashes.append(block.hash)
        elif not hashes[i]:
            hashes[i] = block.hash  # fills its gap
        else:  # another block at this index: the conversation diverged here, what followed is not its
            self._unlist(hashes[i:])
            del hashes[i:]
            hashes.append(block.hash)
        block.contexts += 1

    def _unlist(self, hashes: Iterable[bytes]) -> None:
        for h in hashes:
            b = self.blocks.get(h)
            if b is not None:
                b.contexts = max(0, b.contexts - 1)

    # -- finding
    def touch(self, hashes: Iterable[bytes], now: float) -> None:
        for h in hashes:
            b = self.blocks.get(h)
            if b is not None:
                b.last_use = now

    def lease(self, hashes: Iterable[bytes]) -> None:
        for h in hashes:
            if h in self.blocks:
                self.blocks[h].leases += 1

    def release(self, hashes: Iterable[bytes]) -> None:
        for h in hashes:
            b = self.blocks.get(h)
            if b is not None:
                b.leases = max(0, b.leases - 1)

    def reinstate(self, block: StoredBlock) -> bool:
        """Put back a block removed for deletion that its node kept (another host leased it), unless the
        index has that name again; whether it did."""
        if block.hash in self.blocks:
            return False
        self.blocks[block.hash] = block
        return True

    def leased(self, block_hash: bytes) -> bool:
        b = self.blocks.get(block_hash)
        return bool(b and b.leases)

    # -- forgetting
    def remove(self, block_hash: bytes) -> StoredBlock | None:
        """Forget a block (evicted, lost or corrupt); contexts that list it end before it."""
        return self.blocks.pop(block_hash, None)

    def drop_context(self, user_id: str, context_id: str) -> list[StoredBlock]:
        """Forget a context; return its blocks that no other context lists (to delete)."""
        ctx = self._contexts.pop((user_id, context_id), None)
        if ctx is None:
            return []
        self._unlist(ctx.hashes)
        orphans = [self.blocks.pop(h) for h in ctx.hashes if h in self.blocks and not self.blocks[h].contexts]
        return orphans

    # -- after a restart
    def rebuild(self, found: Iterable[tuple[str, StoredBlock]], now: float) -> int:
        """Load (context id, block) found on the storage nodes; a newer generation wins."""
        loaded = 0
        for context_id, block in found:
            old = self.blocks.get(block.hash)
            if old is not None and old.generation >= block.generation:
                self._list(old, (block.user_id, context_id), now)
                continue
            self.publish(block, context_id, block.user_id, now)
            loaded += old is None
        return loaded


def stored_block(header: cf.ChunkHeader, node: str, key: bytes, length: int, crc32c: int,
                 header_bytes: int, origin: str = "own") -> StoredBlock:
    """The requester's record of a chunk with this header (header_bytes long) at (node, key)."""
    return StoredBlock(header.name, header.parent, header.tenant, header.user_id, header.shared, header.chunk_index,
                       header.num_tokens, node, key, length, crc32c, header.generation, header_bytes, origin=origin,
                       kv_dtype=header.kv_dtype)
