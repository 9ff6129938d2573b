"""The miss path's logic: which stored blocks to ask the storage nodes for, and which answers to take (pure).

Several replicas (agent and compute node pairs) share the storage nodes, and a block's key is a
function of the deployment's salt and its name (its hash chain under its owner's salt), and its
node a function of its key (rendezvous placement). So at a lookup (step 5) an agent can name every
full block of a prompt that its own index lacks, and ask the node each key places on for its
header, all of one node's keys at once (one round trip per node: Mooncake's and Dynamo's shared KV
stores answer "which of these do you hold" the same way). An answer is taken only when its header
names exactly the block asked for: its name, its parent, its place in the chain, a full block, and
its owner (this tenant, and this user unless the block is the tenant's shared prefix), so nothing
another user or tenant stored is ever listed; the MACs are checked later, when the block is
restored; a block that failed them is not taken again in the generation that failed (`ProvedBad`),
while its delete is on its way or when another host's lease keeps it. The agent
(`Agent.stored_tokens`) does the I/O and publishes what is taken.
"""
from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Sequence

from fabric import chunk_format as cf
from fabric.placement import place
from hostmem.block_hash import Salts, block_hash
from smartnic.requester import StoredBlock, stored_block

DISCOVERED = "discovered"  # StoredBlock.origin of a block another replica's agent stored


@dataclasses.dataclass(frozen=True)
class Wanted:
    """A full block of the prompt that the index lacks: what to ask for and what its header must say."""

    index: int
    name: bytes
    parent: bytes
    key: bytes
    shared: bool


class ProvedBad:
    """The (name, generation) of the last `limit` blocks whose GET proved them damaged, forged or stale:
    discovery does not take them again (a new generation, stored since, is another matter). Not
    thread-safe: the agent's lock guards it."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._seen: collections.OrderedDict[tuple[bytes, int], None] = collections.OrderedDict()

    def add(self, name: bytes, generation: int) -> None:
        self._seen[(name, generation)] = None
        self._seen.move_to_end((name, generation))
        while len(self._seen) > self.limit:
            self._seen.popitem(last=False)

    def __contains__(self, block: tuple[bytes, int]) -> bool:
        return block in self._seen


def wanted(token_ids: Sequence[int], salts: Salts, block_tokens: int, limit: int, salt: str | bytes,
           has: Callable[[bytes], bool]) -> list[Wanted]:
    """The full blocks of token_ids[:limit] (named as hostmem.block_hash.stored_prefix names them)
    that `has` says the index lacks, with their storage keys."""
    out, parent = [], b""
    for i in range(min(limit, len(token_ids)) // block_tokens):
        name = block_hash(parent, token_ids[i * block_tokens:(i + 1) * block_tokens], salts.salt(i))
        if not has(name):
            out.append(Wanted(i, name, parent, cf.block_key(salt, name), salts.is_shared(i)))
        parent = name
    return out


def by_node(blocks: Sequence[Wanted], nodes: Sequence[str], up: set[str]) -> dict[str, list[Wanted]]:
    """The wanted blocks grouped by the node their key places on among those up (none up: none asked)."""
    out: dict[str, list[Wanted]] = {}
    for w in blocks:
        node = place(w.key, nodes, up)
        if node is not None:
            out.setdefault(node, []).append(w)
    return out


def mismatch(header: cf.ChunkHeader, want: Wanted, block_tokens: int, tenant: str, user_id: str, mac: bool) -> str:
    """Why a header found under want's key does not name the block wanted ("" when it does)."""
    if (header.name, header.parent, header.chunk_index) != (want.name, want.parent, want.index):
        return "another block"
    if header.num_tokens != block_tokens or header.token_start != want.index * block_tokens:
        return f"tokens [{header.token_start}, {header.token_end}), not block {want.index}'s"
    if header.tenant != tenant or header.shared != want.shared or (not want.shared and header.user_id != user_id):
        return "another owner"
    if mac and header.mac_bytes != cf.MAC_BYTES:
        return "no MAC"
    return ""


def found_block(head, node: str, want: Wanted, block_tokens: int, tenant: str, user_id: str,
                mac: bool) -> tuple[StoredBlock | None, str, str]:
    """(block, its context id, "") from the leading bytes of the value under want's key, or (None, "", why
    not). Its length is what its header says (a GET checks the value against it); its crc32c is unknown
    (0): restores read ranges, which the MACs or the node's own guard check vouch for."""
    try:
        header, header_bytes = cf.decode_header(head)
    except cf.ChunkFormatError as exc:
        return None, "", f"bad header: {exc}"
    why = mismatch(header, want, block_tokens, tenant, user_id, mac)
    if why:
        return None, "", why
    block = stored_block(header, node, want.key, cf.value_length(header, header_bytes), 0, header_bytes,
                         origin=DISCOVERED)
    return block, header.context_id, ""


def head_bytes(tenant: str, payload_bytes: int | None) -> int:
    """How much of each value to read: a whole header, but no more than the shortest value a block of this
    tenant can be (payload_bytes: its token ids and KV; None: unknown), as a range must lie in its value."""
    if payload_bytes is None:
        return cf.MAX_HEADER_BYTES
    return min(cf.MAX_HEADER_BYTES, cf.MIN_HEADER_BYTES + len(tenant.encode()) + payload_bytes)
