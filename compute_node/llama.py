"""Our own Llama forward over the paged KV pool: one call per engine step, decodes and prefill chunks mixed.

    pool: [num_blocks, num_layers, 2 (K|V), num_kv_heads, block_tokens, head_dim] fp32, bf16 or fp8 e4m3

One block is one contiguous extent holding every layer of `block_tokens` tokens (the unit the
SmartNIC stores and restores). The weights are the loaded transformers model's own tensors,
shared, never copied; projections and the MLP run over all new tokens of the step at once,
attention reads each sequence's KV through its block table.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import torch
import torch.nn.functional as F

from compute_node.paged_attention import POOL_DTYPES, as_pool_reads, kernel_built, plan_attention

logger = logging.getLogger(__name__)

# Rope types whose frequencies depend on the sequence length: transformers recomputes them per call.
DYNAMIC_ROPE = ("dynamic", "longrope")
# Vocabulary rows per matmul of the LM head for several sequences: one GEMM over the whole head
# (113 MiB for SmolLM2) ran ~10% slower at batch 32 here than slices that stay in cache longer.
LM_HEAD_ROWS = 4096


@dataclasses.dataclass
class StepInput:
    """What one engine step runs: S sequences, T new tokens in all."""

    input_ids: torch.Tensor     # [T] int64: the new tokens of all sequences, concatenated in sequence order
    positions: torch.Tensor     # [T] int64: each token's position in its sequence
    query_lens: torch.Tensor    # [S] int64: new tokens per sequence
    context_lens: torch.Tensor  # [S] int64: tokens in the sequence's KV after this step (cached + new)
    block_tables: torch.Tensor  # [S, max_blocks] int32: block ids, padded with -1


@dataclasses.dataclass
class LayerWeights:
    """One decoder layer's tensors (the transformers model's own)."""

    ln1: torch.Tensor
    q: torch.nn.Linear
    k: torch.nn.Linear
    v: torch.nn.Linear
    o: torch.nn.Linear
    ln2: torch.Tensor
    gate: torch.nn.Linear
    up: torch.nn.Linear
    down: torch.nn.Linear


def pool_shape(config, num_blocks: int, block_tokens: int) -> tuple[int, ...]:
    """[num_blocks, num_layers, 2, num_kv_heads, block_tokens, head_dim] for a transformers config."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return (num_blocks, config.num_hidden_layers, 2, config.num_key_value_heads, block_tokens, head_dim)


def linear(x: torch.Tensor, layer: torch.nn.Linear) -> torch.Tensor:
    return F.linear(x, layer.weight, layer.bias)


class Llama:
    """The forward of a loaded transformers LlamaForCausalLM, reading and writing KV in `pool`.

    Not thread-safe: one step at a time (it keeps a gather workspace between steps).
    """

    def __init__(self, model, pool: torch.Tensor, attention_kernel: bool = True):
        config = model.config
        if config.hidden_act != "silu":
            raise ValueError(f"hidden_act {config.hidden_act!r} is not SwiGLU")
        rope = model.model.rotary_emb
        if rope.rope_type in DYNAMIC_ROPE:
            raise ValueError(f"rope type {rope.rope_type!r} is not supported")
        self.num_layers = config.num_hidden_layers
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.eps = config.rms_norm_eps
        if pool.dim() != 6 or tuple(pool.shape[1:4]) != (self.num_layers, 2, self.num_kv_heads) \
                or pool.shape[5] != self.head_dim:
            raise ValueError(f"pool shape {tuple(pool.shape)} does not fit the model")
        if pool.dtype not in POOL_DTYPES:
            raise TypeError(f"the pool must be one of {POOL_DTYPES}, got {pool.dtype}")
        if not pool.is_contiguous():
            raise ValueError("the pool must be contiguous")
        self.pool = pool
        self.block_tokens = pool.shape[4]
        self.device = pool.device
        # decodes and short chunks attended by the compiled kernel, straight from the pool (paged_attention)
        self.kernel = (attention_kernel and kernel_built() and self.device.type == "cpu"
                       and pool.dtype == torch.float32)  # the kernel reads fp32 pools only
        # inv_freq and attention_scaling as transformers derived them from the config's rope parameters
        # (rope_theta and any static scaling), so positions rotate exactly as in the reference.
        self.inv_freq = rope.inv_freq                   # [head_dim / 2] fp32
        self.rope_scale = float(rope.attention_scaling)
        m = model.model
        self.embed = m.embed_tokens.weight              # [vocab, hidden]
        self.norm = m.norm.weight                       # [hidden]
        self.lm_head = self.embed if config.tie_word_embeddings else model.lm_head.weight  # [vocab, hidden]
        self.layers = [LayerWeights(d.input_layernorm.weight, d.self_attn.q_proj, d.self_attn.k_proj,
                                    d.self_attn.v_proj, d.self_attn.o_proj, d.post_attention_layernorm.weight,
                                    d.mlp.gate_proj, d.mlp.up_proj, d.mlp.down_proj) for d in m.layers]
        self.workspaces: dict[torch.dtype, torch.Tensor] = {}  # per type, each grows to the largest gather seen

    def rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        """x * rsqrt(mean(x^2) + eps) * weight, as transformers computes it."""
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin: [T, 1, head_dim] for the given positions."""
        freqs = positions[:, None].float() * self.inv_freq[None, :]  # [T, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.rope_scale)[:, None], (emb.sin() * self.rope_scale)[:, None]

    @staticmethod
    def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """Rotary embedding of x: [T, heads, head_dim]."""
        half = x.shape[-1] // 2
        return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin

    def gather_buffer(self, numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A flat buffer of numel elements of dtype, reused from step to step (no fresh pages per layer)."""
        buffer = self.workspaces.get(dtype)
        if buffer is None or buffer.numel() < numel:
            buffer = self.workspaces[dtype] = torch.empty(numel, dtype=dtype, device=self.device)
        return buffer[:numel]

    @torch.inference_mode()
    def forward(self, batch: StepInput, before_layer: Callable[[int], None] | None = None) -> torch.Tensor:
        """Write the new tokens' KV into the pool; return the logits of each sequence's last new token: [S, vocab].

        before_layer(layer), if given, runs before each layer reads or writes the pool (a layer-wise
        restore waits there for the layers still landing)."""
        plan = plan_attention(batch, self.pool.shape, self.device, self.kernel)
        T = batch.input_ids.shape[0]
        cos, sin = self.rotary(batch.positions)
        h = F.embedding(batch.input_ids, self.embed)    # [T, hidden]
        for layer, w in enumerate(self.layers):
            if before_layer is not None:
                before_layer(layer)
            x = self.rms_norm(h, w.ln1)
            q = self.rotate(linear(x, w.q).view(T, self.num_heads, self.head_dim), cos, sin)   # [T, Hq, D]
            k = self.rotate(linear(x, w.k).view(T, self.num_kv_heads, self.head_dim), cos, sin)  # [T, Hkv, D]
            v = linear(x, w.v).view(T, self.num_kv_heads, self.head_dim)                      # [T, Hkv, D]
            if self.pool.dtype != torch.float32:  # attended as the pool holds them, from this step on
                k, v = as_pool_reads(k, self.pool.dtype), as_pool_reads(v, self.pool.dtype)
            plan.write(self.pool, layer, k, v)
            h = h + linear(plan.attend(self, layer, q, k, v).view(T, -1), w.o)
            x = self.rms_norm(h, w.ln2)
            h = h + linear(F.silu(linear(x, w.gate)) * linear(x, w.up), w.down)
        last = self.rms_norm(h.index_select(0, plan.last_tokens), self.norm)  # [S, hidden]
        return self.logits(last)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """x: [S, hidden] -> [S, vocab]."""
        if x.shape[0] == 1:
            return F.linear(x, self.lm_head)
        out = torch.empty(self.lm_head.shape[0], x.shape[0], device=self.device)  # [vocab, S]
        for first in range(0, out.shape[0], LM_HEAD_ROWS):
            torch.mm(self.lm_head[first:first + LM_HEAD_ROWS], x.t(), out=out[first:first + LM_HEAD_ROWS])
        return out.t().contiguous()

