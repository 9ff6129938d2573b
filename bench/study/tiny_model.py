"""The --smoke model: a randomly initialised 2-layer Llama with the real tokenizer, saved where the
compute node loads a cached model from (its `model_cache_dir`), so that every service runs as it
does with the real model, in seconds."""
from __future__ import annotations

import logging
import os
from pathlib import Path

logger = logging.getLogger(__name__)


def make_tiny_model(directory: str | Path, seed: int = 0) -> Path:
    """Save the tiny model and the real tokenizer in directory (once); return it."""
    directory = Path(directory)
    if (directory / "config.json").exists():
        return directory
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from compute_node.model_loader import load_tokenizer
    from compute_node.settings import ComputeSettings

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    tokenizer = load_tokenizer(ComputeSettings().model_cache_dir)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
                         eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id,
                         pad_token_id=tokenizer.eos_token_id)
    model = LlamaForCausalLM(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, safe_serialization=True)
    tokenizer.save_pretrained(directory)
    logger.info("tiny model saved in %s", directory)
    return directory
