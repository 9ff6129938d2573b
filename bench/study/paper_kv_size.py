"""The paper's Fig. 1 by arithmetic: accelerator memory of a model (16 bit) against its KV cache.

The paper fixes 512 tokens and a batch of 64 ("We have fixed the maximum token size for each model to 512
tokens and the batch size of inference to 64") and draws both for "popular models"; its text names none
but Llama-2-70B and LLaMa-2 (Sec. I), so the models here are Llama 2's three and the other popular open
models of its time, each with its published geometry. A token's KV is K and V for every layer and KV head:
2 x layers x kv_heads x head_dim x bytes (16-bit: 2). Pure.
"""
from __future__ import annotations

import dataclasses

TOKENS, BATCH, DTYPE_BYTES = 512, 64, 2


@dataclasses.dataclass(frozen=True)
class Geometry:
    """A model's published shape: parameters, layers, KV heads (grouped-query: fewer than heads), head dim."""
    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    source: str

    def kv_bytes_per_token(self, dtype_bytes: int = DTYPE_BYTES) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes  # K and V

    def model_bytes(self, dtype_bytes: int = DTYPE_BYTES) -> float:
        return self.params * dtype_bytes


MODELS = (
    Geometry("Llama-2-7B", 6.74e9, 32, 32, 128, "Touvron et al. 2023, Table 1; config.json"),
    Geometry("Llama-2-13B", 13.0e9, 40, 40, 128, "Touvron et al. 2023; config.json"),
    Geometry("Llama-2-70B", 69.0e9, 80, 8, 128, "Touvron et al. 2023 (GQA, 8 KV heads); config.json"),
    Geometry("Mistral-7B", 7.24e9, 32, 8, 128, "Jiang et al. 2023, Table 1"),
    Geometry("OPT-30B", 30.0e9, 48, 56, 128, "Zhang et al. 2022, Table 1 (hidden 7168)"),
    Geometry("OPT-66B", 66.0e9, 64, 72, 128, "Zhang et al. 2022, Table 1 (hidden 9216)"),
    Geometry("GPT-3-175B", 175.0e9, 96, 96, 128, "Brown et al. 2020, Table 2.1 (d_head 128)"),
)


def fig1_rows(models=MODELS, tokens: int = TOKENS, batch: int = BATCH) -> list[dict]:
    """Per model: its memory and its KV cache at `tokens` x `batch` (bytes), and KV / model."""
    rows = []
    for m in models:
        per_token = m.kv_bytes_per_token()
        kv = per_token * tokens * batch
        rows.append({"model": m.name, "params": m.params, "layers": m.layers, "kv_heads": m.kv_heads,
                     "head_dim": m.head_dim, "kv_bytes_per_token": per_token,
                     "kv_bytes_per_context": per_token * tokens, "kv_bytes": kv,
                     "model_bytes": m.model_bytes(), "kv_over_model": kv / m.model_bytes(), "source": m.source})
    return rows


def measure() -> dict:
    return {"tokens": TOKENS, "batch": BATCH, "dtype_bytes": DTYPE_BYTES, "rows": fig1_rows()}
