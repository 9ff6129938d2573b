"""The model runner: one forward per engine step over every scheduled sequence, KV in the paged pool.

Receives what to run (no scheduling here): per sequence, the token ids to run, the position of
the first and its block table. The pool is one tensor, a view into the registered region:

    pool: [num_blocks, num_layers, 2 (K|V), num_kv_heads, block_tokens, head_dim] fp32
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence

import numpy as np
import torch

from compute_node.llama import Llama, StepInput

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class SeqRun:
    """One sequence's part of a step."""

    token_ids: Sequence[int]    # the tokens to run (a prefill chunk, or the one token to decode)
    start: int                  # position of the first of them = tokens already in the sequence's KV
    block_table: Sequence[int]  # block ids, covering at least start + len(token_ids) tokens


def build_step(runs: Sequence[SeqRun], block_tokens: int, device="cpu") -> StepInput:
    """The StepInput of these runs, in their order."""
    if not runs:
        raise ValueError("a step runs at least one sequence")
    ids, positions, qlens, ctxs = [], [], [], []
    for r in runs:
        n = len(r.token_ids)
        if n == 0:
            raise ValueError("a sequence in a step runs at least one token")
        if len(r.block_table) * block_tokens < r.start + n:
            raise ValueError(f"block table of {len(r.block_table)} blocks cannot hold {r.start + n} tokens")
        ids.extend(r.token_ids)
        positions.extend(range(r.start, r.start + n))
        qlens.append(n)
        ctxs.append(r.start + n)
    # Built in numpy, then shared with torch: a torch operator per row would release the GIL each time
    # (to the threads streaming the last step's tokens) and wait to get it back.
    width = max(len(r.block_table) for r in runs)
    tables = np.full((len(runs), width), -1, dtype=np.int32)
    for s, r in enumerate(runs):
        tables[s, :len(r.block_table)] = r.block_table

    def tensor(values):
        return torch.from_numpy(np.asarray(values, dtype=np.int64)).to(device)

    return StepInput(tensor(ids), tensor(positions), tensor(qlens), tensor(ctxs), torch.from_numpy(tables).to(device))


class ModelRunner:
    """Owns the Llama over the transformers model's weights and the pool tensor.

    Not thread-safe: the engine thread calls step() once per step.
    """

    def __init__(self, model, pool: torch.Tensor, device="cpu", attention_kernel: bool = True):
        device = torch.device(device)
        if pool.device != device or model.device != device:
            raise ValueError(f"pool on {pool.device} and model on {model.device}; the runner's device is {device}")
        self.device = device
        self.pool = pool
        self.block_tokens = pool.shape[4]
        self.llama = Llama(model, pool, attention_kernel)

    def step(self, batch: StepInput | Sequence[SeqRun],
             before_layer: Callable[[int], None] | None = None) -> torch.Tensor:
        """Run one step; return the logits of each sequence's last new token: [S, vocab]. before_layer(layer)
        runs before each layer (restores still landing wait there)."""
        if not isinstance(batch, StepInput):
            batch = build_step(batch, self.block_tokens, self.device)
        return self.llama.forward(batch, before_layer)

    @staticmethod
    def greedy(logits: torch.Tensor) -> list[int]:
        """The most likely token of each row of logits [S, vocab]: argmax's choice (the first of equal
        maxima; NaN before any number), by max, which took 0.4 ms for 32 rows of SmolLM2's vocabulary here
        against 1 ms for argmax."""
        return logits.max(dim=-1).indices.tolist()
