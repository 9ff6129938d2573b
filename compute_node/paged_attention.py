"""Attention through block tables: where each new token's K/V goes in the pool, and what each query sees.

    pool            : [num_blocks, num_layers, 2 (K|V), num_kv_heads, block_tokens, head_dim] fp32, bf16
                      or fp8 e4m3 (attention reads it widened to fp32; the compiled kernel reads fp32 only)
    pool as rows    : [num_blocks * num_layers * 2 * num_kv_heads, block_tokens * head_dim]
                      (one row: one block's tokens of one layer, K or V, one KV head)
    gathered KV     : [2 (K|V), seqs, num_kv_heads, blocks * block_tokens, head_dim]

Decode tokens (one new token per sequence) are attended in batches of sequences whose gathered
KV fits in about GATHER_BYTES (it is then read from cache, not memory, by the attention): per
layer, one index_select of their blocks' rows into a reused buffer and one
scaled_dot_product_attention over them, a length mask hiding each sequence's keys past its length
(no mask when all lengths match: the keys are sliced). A prefill chunk attends alone: causally over its own new K/V when nothing precedes it,
else over its gathered blocks with an additive mask that is causal inside the chunk (prefill_mask). Padding entries (-1)
of a block table read block 0 behind the mask; pool memory only ever holds finite KV values.

With the compiled kernel (compute_node._attention, built by setup.py; a plan with kernel=True),
every decode token and every token of a chunk of at most KERNEL_MAX_CHUNK new tokens is instead
attended by the kernel, straight from the pool: each token over the first `position + 1` keys of
its sequence, through its block table, with no gather, no padding and no mask. Longer chunks (from
two tokens: a follow-up's new prompt, a long prompt's chunk) keep torch's attention, whose matrix
products take the chunk's tokens together where the kernel reads the context once per token.

Where a long prompt's prefill time goes (SmolLM2-135M, chunks of 512, one thread): attention over
the context is exact, so a token at position p costs 4 * layers * heads * head_dim * p FLOPs in it
(69k * p here) beside the 212 MFLOPs of the projections and the MLP; at p ~ 3,070 the two are equal.
A 512-token chunk after 3.5k cached tokens spent 62% of its time in scaled_dot_product_attention's
flash kernel (at ~75% of the matrix products' FLOP rate), 35% in the matrix products, 0.35% in
gathering its blocks. A 6k prompt's tokens thus cost ~1.8x a 512-token prompt's at best (bench.prefill).
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch
import torch.nn.functional as F

from compute_node.kv_pool import TORCH_DTYPES

try:  # built by setup.py as an optional extension; without it the torch path serves
    from compute_node import _attention
except ImportError:  # pragma: no cover - depends on the install
    _attention = None

logger = logging.getLogger(__name__)

# New tokens up to which a sequence's step is attended by the kernel: decodes only. The kernel reads a
# token's keys for it alone, so k new tokens read the context k times; torch gathers it once and its
# matrix products take the chunk together. `kvtb bench attention` (1 thread): at k = 2 torch is already
# 1.2x faster, at 16 to 64 3.6 to 5.4x, at contexts of 512 to 7,000 tokens; at k = 1 they are even.
KERNEL_MAX_CHUNK = 1
GATHER_BYTES = 4 << 20  # gathered K and V per attention call of the decode batch


@dataclasses.dataclass
class Gather:
    """Which pool rows one attention call reads, for layer 0 (a layer adds layer * 2 * num_kv_heads)."""

    rows: torch.Tensor  # [2, seqs, num_kv_heads, blocks] int64: row ids in the pool as rows
    length: int         # keys per sequence after slicing (the longest context)

    def read(self, llama, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """k, v: [seqs, num_kv_heads, length, head_dim] fp32, views of the workspace (a pool of bf16 or
        fp8 is gathered in its own type, then widened)."""
        pool_rows = llama.pool.view(-1, llama.block_tokens * llama.head_dim)
        _, seqs, heads, blocks = self.rows.shape
        numel = self.rows.numel() * pool_rows.shape[1]
        out = llama.gather_buffer(numel, pool_rows.dtype).view(-1, pool_rows.shape[1])
        torch.index_select(pool_rows, 0, (self.rows + layer * 2 * heads).view(-1), out=out)
        if out.dtype != torch.float32:
            out = llama.gather_buffer(numel).view_as(out).copy_(out)
        kv = out.view(2, seqs, heads, blocks * llama.block_tokens, llama.head_dim)
        return kv[0, :, :, :self.length], kv[1, :, :, :self.length]


def check_pool(pool: torch.Tensor) -> None:
    """The pool as the kernel reads it: a contiguous CPU fp32 tensor of 6 dimensions (TypeError, ValueError)."""
    if pool.dtype != torch.float32:
        raise TypeError(f"the pool must be float32 (got {pool.dtype})")
    if pool.dim() != 6 or pool.device.type != "cpu" or not pool.is_contiguous():
        raise ValueError(f"the pool must be a contiguous CPU tensor of 6 dimensions (got {tuple(pool.shape)} "
                         f"on {pool.device}, contiguous={pool.is_contiguous()})")


POOL_DTYPES = tuple(TORCH_DTYPES.values())  # the types a pool may hold (compute.kv_dtype)
FP8_MAX = 448.0  # float8_e4m3fn's largest finite value (it has no infinity)


def to_pool(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (fp32) as the pool holds it: unchanged for fp32, rounded to bf16, or clamped to +-448 and rounded
    to fp8 e4m3 (torch's cast saturates too; the clamp does not leave the range to a library's choice)."""
    if dtype == torch.float32:
        return x
    if dtype == torch.float8_e4m3fn:
        x = x.clamp(-FP8_MAX, FP8_MAX)
    return x.to(dtype)


def bits(x: torch.Tensor) -> torch.Tensor:
    """x as raw bytes where torch has no index_copy_ for its type (fp8), else x."""
    return x.view(torch.uint8) if x.dtype == torch.float8_e4m3fn else x


def as_pool_reads(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x (fp32) rounded through the pool's type and back: the K/V attention reads from the pool, so a
    chunk's own new K/V are seen exactly as later steps (and a restore) will see them."""
    return x if dtype == torch.float32 else to_pool(x, dtype).float()


def kernel_built() -> bool:
    """Whether the compiled attention kernel can be used."""
    return _attention is not None


@dataclasses.dataclass
class KernelTokens:
    """Tokens the compiled kernel attends straight from the pool, each over its sequence's first `lens` keys."""

    tokens: torch.Tensor | None  # [N] their indices among the step's tokens (None: every token, in order)
    tables: torch.Tensor         # [N, width] int32: each token's sequence's block table, padded with -1
    lens: torch.Tensor           # [N] int64: keys each token sees (its position + 1)

    def __post_init__(self):
        # the kernel reads them as raw int32 / int64 arrays: the wrong type would be read as other ids
        tables, lens = self.tables, self.lens
        if tables.dtype != torch.int32 or lens.dtype != torch.int64:
            raise TypeError(f"tables must be int32 and lens int64 (got {tables.dtype} and {lens.dtype})")
        if tables.device.type != "cpu" or lens.device.type != "cpu":
            raise ValueError("tables and lens must be on the CPU")
        if not (tables.is_contiguous() and lens.is_contiguous()):
            raise ValueError("tables and lens must be contiguous")
        if tables.dim() != 2 or lens.dim() != 1 or lens.shape != tables.shape[:1]:
            raise ValueError(f"tables must be [N, width] and lens [N] (got {tuple(tables.shape)} and "
                             f"{tuple(lens.shape)})")

    def attend(self, pool: torch.Tensor, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q: [N, Hq, D] -> [N, Hq, D]. The kernel checks every length and block id it reads against
        the tables and the pool (ValueError) before reading; the tensors' types and shapes are checked
        here (TypeError, ValueError): the kernel gets raw pointers."""
        check_pool(pool)
        num_blocks, num_layers, _, kv_heads, block_tokens, head_dim = pool.shape
        if not 0 <= layer < num_layers:
            raise ValueError(f"layer {layer} out of range [0, {num_layers})")
        if q.dtype != torch.float32:
            raise TypeError(f"q must be float32 (got {q.dtype})")
        if q.device.type != "cpu" or q.dim() != 3 or q.shape[0] != self.lens.shape[0] or q.shape[2] != head_dim:
            raise ValueError(f"q must be a CPU tensor [{self.lens.shape[0]}, heads, {head_dim}] "
                             f"(got {tuple(q.shape)} on {q.device})")
        q = q.contiguous()
        out = torch.empty_like(q)
        _attention.decode(pool.data_ptr(), num_blocks, num_layers, kv_heads, block_tokens, head_dim, layer,
                          q.data_ptr(), q.shape[1], out.data_ptr(), self.tables.data_ptr(), self.tables.shape[1],
                          self.lens.data_ptr(), q.shape[0], head_dim ** -0.5)
        return out


@dataclasses.dataclass
class Decode:
    """A run of decode sequences attended together (one new token each)."""

    first: int                  # their first and past-the-last index among the step's decode tokens
    end: int
    gather: Gather
    mask: torch.Tensor | None   # [seqs, 1, 1, length] bool, True where a key is visible (to every
                                # query of the sequence); None: all lengths match


@dataclasses.dataclass
class Prefill:
    """One sequence's chunk of more than one new token."""

    start: int                  # its first token in the step
    end: int
    gather: Gather | None       # None: nothing cached before the chunk, attend over its own K/V
    mask: torch.Tensor | None   # [new, context] fp32, 0 where a query sees a key, -inf where not


@dataclasses.dataclass
class AttentionPlan:
    """Everything a step's layers share: write rows, decode batches, prefill chunks, last tokens."""

    write_rows: torch.Tensor        # [2 (K|V), T * num_kv_heads] int64: rows of the pool as [-1, head_dim], layer 0
    layer_stride: int               # rows of that view per layer
    decode_tokens: torch.Tensor | None  # [Sd] token indices of the decode sequences (None: every token, in order)
    decodes: list[Decode]
    prefills: list[Prefill]
    last_tokens: torch.Tensor       # [S] index of each sequence's last new token
    kernel: KernelTokens | None = None  # the tokens the compiled kernel attends (then none of them is in
                                        # decodes or prefills)

    def write(self, pool: torch.Tensor, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v: [T, num_kv_heads, head_dim] into their blocks' rows of this layer (in the pool's type)."""
        rows = bits(pool).view(-1, pool.shape[-1])
        offset = layer * self.layer_stride
        rows.index_copy_(0, self.write_rows[0] + offset, bits(to_pool(k, pool.dtype)).reshape(-1, pool.shape[-1]))
        rows.index_copy_(0, self.write_rows[1] + offset, bits(to_pool(v, pool.dtype)).reshape(-1, pool.shape[-1]))

    def attend(self, llama, layer: int, q, k, v) -> torch.Tensor:
        """Attention output [T, Hq, D] for q [T, Hq, D] (k, v: this step's [T, Hkv, D], already in the pool)."""
        kernel = self.kernel
        if kernel is not None and kernel.tokens is None:
            return kernel.attend(llama.pool, layer, q)
        if kernel is None and self.decode_tokens is None and not self.prefills:
            return self._decode(llama, layer, q)
        out = torch.empty_like(q)
        if kernel is not None:
            out.index_copy_(0, kernel.tokens, kernel.attend(llama.pool, layer, q.index_select(0, kernel.tokens)))
        if self.decodes:
            out.index_copy_(0, self.decode_tokens, self._decode(llama, layer, q.index_select(0, self.decode_tokens)))
        for p in self.prefills:
            out[p.start:p.end] = self._prefill(llama, layer, p, q[p.start:p.end], k[p.start:p.end], v[p.start:p.end])
        return out

    def _decode(self, llama, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q: [Sd, Hq, D] -> [Sd, Hq, D].

        The query heads that share a KV head attend as that head's queries: q viewed as
        [seqs, Hkv, Hq / Hkv, D], one call over keys [seqs, Hkv, L, D]. Each KV head is then read
        once for its group (enable_gqa reads it once per query head: 1.8x slower at 32 sequences here).
        """
        out = None if len(self.decodes) == 1 else torch.empty_like(q)
        heads, dim = q.shape[1], q.shape[2]
        for d in self.decodes:
            keys, values = d.gather.read(llama, layer)  # [seqs, Hkv, L, D]
            seqs, kv_heads = keys.shape[0], keys.shape[1]
            grouped = q[d.first:d.end].reshape(seqs, kv_heads, heads // kv_heads, dim)
            # [seqs, Hkv, Hq / Hkv, D]
            o = F.scaled_dot_product_attention(grouped, keys, values, attn_mask=d.mask)
            if out is None:
                return o.reshape(seqs, heads, dim)
            out[d.first:d.end] = o.reshape(seqs, heads, dim)
        return out

    @staticmethod
    def _prefill(llama, layer: int, p: Prefill, q, k, v) -> torch.Tensor:
        q = q.transpose(0, 1).unsqueeze(0)              # [1, Hq, n, D]
        if p.gather is None:
            o = F.scaled_dot_product_attention(q, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
                                               is_causal=True, enable_gqa=True)
        else:
            keys, values = p.gather.read(llama, layer)  # [1, Hkv, context, D]
            o = F.scaled_dot_product_attention(q, keys, values, attn_mask=p.mask, enable_gqa=True)
        return o[0].transpose(0, 1)                     # [n, Hq, D]


def block_rows(block_ids: torch.Tensor, num_layers: int, num_kv_heads: int) -> torch.Tensor:
    """Rows of layer 0 in the pool as rows: [2, seqs, num_kv_heads, blocks] for block_ids [seqs, blocks]."""
    base = block_ids.clamp(min=0).long() * (num_layers * 2 * num_kv_heads)
    kind = torch.arange(2, device=block_ids.device).view(2, 1, 1, 1) * num_kv_heads
    head = torch.arange(num_kv_heads, device=block_ids.device).view(1, 1, -1, 1)
    return base[None, :, None, :] + kind + head


def plan_attention(batch, pool_shape, device, kernel: bool = False) -> AttentionPlan:
    """The plan of one step (StepInput `batch`) over a pool of `pool_shape`; kernel: the compiled kernel
    attends the decodes and the short chunks (kernel_built() must be true).

    The index arithmetic runs in numpy on the host: a few dozen integers, where each small torch
    operator would release the GIL (to the threads streaming the last step's tokens) and wait to
    get it back, and might wake torch's worker threads."""
    _, num_layers, _, num_kv_heads, block_tokens, _ = pool_shape
    query_lens = batch.query_lens.cpu().numpy()
    pos = batch.positions.cpu().numpy()
    tables = batch.block_tables.cpu().numpy()
    qlens, ctxs = query_lens.tolist(), batch.context_lens.tolist()
    ends = np.cumsum(query_lens)

    def tensor(a: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(a)).to(device)

    # where each new token's K/V goes: block table entry p // block_tokens, offset p % block_tokens
    seq_of_token = np.repeat(np.arange(len(qlens)), query_lens)
    blocks = tables[seq_of_token, pos // block_tokens].astype(np.int64)  # [T]
    row0 = blocks * (num_layers * 2 * num_kv_heads * block_tokens) + pos % block_tokens
    head = np.arange(num_kv_heads) * block_tokens
    kind = np.arange(2).reshape(2, 1, 1) * (num_kv_heads * block_tokens)
    write_rows = (row0[None, :, None] + head[None, None, :] + kind).reshape(2, -1)
    kernel_tokens = None
    if kernel:
        short = query_lens <= KERNEL_MAX_CHUNK
        tokens = None if short.all() else np.nonzero(short[seq_of_token])[0]
        picked = seq_of_token if tokens is None else seq_of_token[tokens]
        if picked.size:
            lens = pos + 1 if tokens is None else pos[tokens] + 1
            kernel_tokens = KernelTokens(None if tokens is None else tensor(tokens), tensor(tables[picked]),
                                         tensor(lens.astype(np.int64)))
        qlens = [0 if s else n for s, n in zip(short.tolist(), qlens)]  # what is left for the torch path
    decode_seqs = [s for s, n in enumerate(qlens) if n == 1]
    decode_tokens = None
    if decode_seqs and len(decode_seqs) < len(qlens):
        decode_tokens = tensor(ends[decode_seqs] - 1)
    decodes = plan_decodes(batch, decode_seqs, ctxs, pool_shape, device)
    prefills = []
    start = 0
    for s, (n, ctx) in enumerate(zip(query_lens.tolist(), ctxs)):
        if qlens[s] > 1:
            cached = ctx - n
            gather = mask = None
            if cached > 0:
                ids = batch.block_tables[s:s + 1, :-(-ctx // block_tokens)]
                gather = Gather(block_rows(ids, num_layers, num_kv_heads), ctx)
                mask = prefill_mask(cached, ctx, device)
            prefills.append(Prefill(start, start + n, gather, mask))
        start += n
    return AttentionPlan(tensor(write_rows), num_kv_heads * 2 * block_tokens, decode_tokens, decodes, prefills,
                         tensor(ends - 1), kernel_tokens)


def prefill_mask(cached: int, ctx: int, device) -> torch.Tensor:
    """[ctx - cached, ctx] fp32: 0 where a chunk's query sees a key (every cached key, and its own chunk's
    up to itself), -inf where not. Additive, built once per step: a bool mask is turned into this by
    scaled_dot_product_attention at every layer (a [chunk, context] pass each: 2% of a chunk's time at
    4k tokens of context)."""
    keys = torch.arange(ctx, device=device)
    hidden = keys[None, :] > torch.arange(cached, ctx, device=device)[:, None]
    return torch.zeros(ctx - cached, ctx, device=device).masked_fill_(hidden, float("-inf"))


def plan_decodes(batch, seqs: list[int], ctxs: list[int], pool_shape, device) -> list[Decode]:
    """The decode sequences `seqs` in runs whose gathered KV fits in about GATHER_BYTES."""
    _, num_layers, _, num_kv_heads, block_tokens, head_dim = pool_shape
    if not seqs:
        return []
    longest = -(-max(ctxs[s] for s in seqs) // block_tokens) * block_tokens
    per_run = max(1, GATHER_BYTES // (2 * num_kv_heads * longest * head_dim * 4))
    out = []
    for first in range(0, len(seqs), per_run):
        run = seqs[first:first + per_run]
        lens = [ctxs[s] for s in run]
        length = max(lens)
        ids = batch.block_tables[run, :-(-length // block_tokens)]
        mask = None
        if min(lens) != length:
            keys = torch.arange(length, device=device)
            mask = (keys[None, :] < torch.tensor(lens, device=device)[:, None]).view(len(run), 1, 1, length)
        out.append(Decode(first, first + len(run), Gather(block_rows(ids, num_layers, num_kv_heads), length), mask))
    return out
