"""The hash chain that names a block's content, shared by the compute node's prefix cache and the
SmartNIC's stored-block index (pure).

A full block is named by blake2b-128 over its parent's name, a salt and its token ids, so equal
prefixes under one salt have equal names and different salts never do. The salt is the tenant's
and, unless the prefix is one the tenant's operator marked shared, the user's too (vLLM's
`cache_salt`): one user's prefixes never serve another, and never across tenants. A partial
block (fewer than block_tokens tokens, the end of a turn) is named the same way over the tokens
it has; its token count is part of what it covers, so it never collides with the full block.

A chain with a shared prefix (`Salts`): the full blocks lying wholly inside the prefix the operator
marked shared are named under the tenant's salt alone (any user of the tenant finds them), the
rest of the chain under the user's salt, continuing from the last shared block's name (so a user's
own blocks still never match another user's). A partial block is always the user's.
"""
from __future__ import annotations

import dataclasses
import hashlib
import struct
from collections.abc import Sequence

_LENGTHS = struct.Struct("<II")


def salt_for(tenant: str, user: str, shared: bool = False) -> bytes:
    """The salt of a user's blocks (or, shared, of every user of the tenant)."""
    return b"tenant\0" + tenant.encode() + (b"" if shared else b"\0user\0" + user.encode())


@dataclasses.dataclass(frozen=True)
class Salts:
    """The salt of each block of one sequence: `shared` for its first `shared_blocks` full blocks,
    `private` for the rest (and for every partial block)."""

    private: bytes
    shared: bytes = b""
    shared_blocks: int = 0

    def __post_init__(self):
        if self.shared_blocks < 0 or (self.shared_blocks and not self.shared):
            raise ValueError(f"shared_blocks {self.shared_blocks}: not negative, and shared blocks need a salt")

    @classmethod
    def of(cls, tenant: str, user: str, shared_tokens: int, block_tokens: int) -> Salts:
        """A user's salts when the first shared_tokens tokens are the tenant's shared prefix."""
        return cls(salt_for(tenant, user), salt_for(tenant, user, shared=True), shared_tokens // block_tokens)

    def is_shared(self, index: int, full: bool = True) -> bool:
        """Whether block `index` (full, or a partial one) is named under the tenant's salt alone."""
        return full and index < self.shared_blocks

    def salt(self, index: int, full: bool = True) -> bytes:
        return self.shared if self.is_shared(index, full) else self.private


def salts_of(salt: bytes | Salts) -> Salts:
    """Salts from a single salt (no shared prefix) or Salts."""
    return salt if isinstance(salt, Salts) else Salts(salt)


def block_hash(parent_hash: bytes, token_ids: Sequence[int], salt: bytes) -> bytes:
    """blake2b-128 of (len(parent) u32, len(salt) u32, parent, salt, token ids as uint32 LE)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(_LENGTHS.pack(len(parent_hash), len(salt)))
    h.update(parent_hash)
    h.update(salt)
    if isinstance(token_ids, (bytes, bytearray, memoryview)):
        h.update(token_ids)
    else:
        h.update(struct.pack(f"<{len(token_ids)}I", *token_ids))
    return h.digest()


def hash_chain(token_ids: Sequence[int], salt: bytes | Salts, block_tokens: int, parent: bytes = b"",
               start_block: int = 0) -> list[bytes]:
    """Hashes of the full blocks of token_ids from start_block on (parent: the hash before it)."""
    salts, hashes = salts_of(salt), []
    for i in range(start_block, len(token_ids) // block_tokens):
        parent = block_hash(parent, token_ids[i * block_tokens:(i + 1) * block_tokens], salts.salt(i))
        hashes.append(parent)
    return hashes


def stored_prefix(token_ids: Sequence[int], salt: bytes | Salts, block_tokens: int, has,
                  limit: int | None = None) -> tuple[int, list[bytes]]:
    """The longest prefix of token_ids (at most `limit` tokens) whose blocks `has(hash)` says are
    stored: its length in tokens, and the names of its blocks (the last may be a partial block)."""
    limit = len(token_ids) if limit is None else min(limit, len(token_ids))
    salts, names = salts_of(salt), []
    parent = b""
    for i in range(limit // block_tokens):
        name = block_hash(parent, token_ids[i * block_tokens:(i + 1) * block_tokens], salts.salt(i))
        if not has(name):
            break
        names.append(name)
        parent = name
    start = len(names) * block_tokens
    for m in range(min(block_tokens - 1, limit - start), 0, -1):  # a turn's partial last block
        name = block_hash(parent, token_ids[start:start + m], salts.private)
        if has(name):
            return start + m, [*names, name]
    return start, names
