"""bench.model_load: both loads in fresh processes, a ratio of each, on a tiny cached Llama."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

pytestmark = pytest.mark.service  # starts processes


def test_it_times_both_loads_and_prints_their_ratios(tmp_path):
    from compute_node.model_loader import load_tokenizer
    from compute_node.settings import ComputeSettings
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path)
    load_tokenizer(os.path.expanduser(ComputeSettings().model_cache_dir)).save_pretrained(tmp_path)
    done = subprocess.run([sys.executable, "-m", "bench.model_load", "--reps", "1", "--cache", str(tmp_path),
                           "--json"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert [s["class"] for s in result["samples"]["tensors"]] == ["LlamaWeights"]
    assert [s["class"] for s in result["samples"]["transformers"]] == ["LlamaForCausalLM"]
    assert all(v > 0 for v in result["ratios"].values())
