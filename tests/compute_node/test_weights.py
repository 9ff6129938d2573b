"""A cached Llama read from its safetensors alone (compute_node/weights.py) holds transformers' own tensors,
bit for bit, and our forward over it gives the same logits; what it cannot read exactly goes to transformers."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from compute_node import model_loader, weights
from compute_node.llama import pool_shape
from compute_node.model_runner import ModelRunner, SeqRun

SHAPES = {
    "tied": dict(hidden_size=96, intermediate_size=192, num_hidden_layers=3, num_attention_heads=6,
                 num_key_value_heads=2, head_dim=16, rope_theta=50000.0, tie_word_embeddings=True),
    "untied-bias": dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                        num_key_value_heads=1, head_dim=32, tie_word_embeddings=False, attention_bias=True,
                        mlp_bias=True),
}


def saved(tmp_path, shape: str, **extra):
    """A random tiny Llama of `shape`, saved as the model cache saves one: (its directory, the model)."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=300, max_position_embeddings=128, **SHAPES[shape], **extra)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    return tmp_path, model


def tensors_of(model) -> dict[str, torch.Tensor]:
    """Every tensor our forward reads, by name."""
    m, out = model.model, {}
    out["embed"], out["norm"], out["lm_head"] = m.embed_tokens.weight, m.norm.weight, model.lm_head.weight
    out["inv_freq"] = m.rotary_emb.inv_freq
    for i, d in enumerate(m.layers):
        out[f"{i}.in_norm"] = d.input_layernorm.weight
        out[f"{i}.post_norm"] = d.post_attention_layernorm.weight
        for name, lin in (("q", d.self_attn.q_proj), ("k", d.self_attn.k_proj), ("v", d.self_attn.v_proj),
                          ("o", d.self_attn.o_proj), ("gate", d.mlp.gate_proj), ("up", d.mlp.up_proj),
                          ("down", d.mlp.down_proj)):
            out[f"{i}.{name}"], out[f"{i}.{name}.bias"] = lin.weight, lin.bias
    return out


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_tensors_are_transformers_own_bit_for_bit(tmp_path, shape):
    path, _ = saved(tmp_path, shape)
    assert weights.readable(path) == ""
    ours = weights.load(path)
    theirs = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    a, b = tensors_of(ours), tensors_of(theirs)
    assert a.keys() == b.keys()
    for name in a:
        if b[name] is None:
            assert a[name] is None, name
        else:
            assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name
    rope, their_rope = ours.model.rotary_emb, theirs.model.rotary_emb
    assert (rope.attention_scaling, rope.rope_type) == (their_rope.attention_scaling, their_rope.rope_type)
    for field in weights.CONFIG_FIELDS:
        assert getattr(ours.config, field) == getattr(theirs.config, field), field
    if shape == "tied":
        assert ours.lm_head.weight is ours.model.embed_tokens.weight


@torch.inference_mode()
def test_our_forward_over_them_gives_the_same_logits(tmp_path):
    path, model = saved(tmp_path, "tied")
    ours = weights.load(path)
    ids = list(range(5, 40))
    logits = []
    for m in (ours, model):
        pool = torch.zeros(pool_shape(m.config, 8, 8))
        logits.append(ModelRunner(m, pool, attention_kernel=False).step([SeqRun(ids, 0, [0, 1, 2, 3, 4])]))
    assert torch.equal(logits[0], logits[1])


def test_what_it_cannot_read_exactly_goes_to_transformers(tmp_path):
    path, _ = saved(tmp_path / "llama3", "tied", rope_parameters={
        "rope_type": "llama3", "rope_theta": 20000.0, "factor": 4.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 16})
    assert "default rope" in weights.readable(path)
    with pytest.raises(ValueError, match="default rope"):
        weights.load(path)
    assert "config.json" in weights.readable(tmp_path / "nothing")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text(json.dumps({"architectures": ["MistralForCausalLM"],
                                                   "model_type": "mistral"}))
    assert "not a LlamaForCausalLM" in weights.readable(other)


@pytest.mark.parametrize("damage", ["missing", "extra", "fp16"])
def test_a_file_that_does_not_match_its_config_is_refused(tmp_path, damage):
    path, _ = saved(tmp_path, "untied-bias")
    tensors = load_file(path / weights.WEIGHTS_FILE)
    if damage == "missing":
        del tensors["model.layers.1.mlp.up_proj.weight"]
    elif damage == "extra":
        tensors["model.layers.2.mlp.up_proj.weight"] = torch.zeros(2)
    else:
        tensors["model.norm.weight"] = tensors["model.norm.weight"].half()
    save_file(tensors, path / weights.WEIGHTS_FILE, metadata={"format": "pt"})
    message = {"missing": "no model.layers.1.mlp.up_proj.weight", "extra": "does not name",
               "fp16": "not float32"}[damage]
    with pytest.raises(ValueError, match=message):
        weights.load(path)


def test_load_model_reads_the_cache_without_transformers_modeling_code(tmp_path):
    """The node's loader takes the light path for a readable cache, transformers' for the rest."""
    path, _ = saved(tmp_path / "m", "tied")
    tokenizer_dir = tmp_path / "m"
    from compute_node.model_loader import load_tokenizer
    from compute_node.settings import ComputeSettings
    load_tokenizer(os.path.expanduser(ComputeSettings().model_cache_dir)).save_pretrained(tokenizer_dir)
    model, _ = model_loader.load_model(path)
    assert isinstance(model, weights.LlamaWeights)
    text = (path / "config.json").read_text()
    (path / "config.json").write_text(text.replace('"default"', '"linear", "factor": 2.0'))
    model, _ = model_loader.load_model(path)
    assert isinstance(model, LlamaForCausalLM)


def test_the_tokenizer_is_the_one_autotokenizer_gives():
    """The cache's tokenizer loaded as its own class (without the model's config) is AutoTokenizer's."""
    from transformers import AutoTokenizer

    from compute_node.settings import ComputeSettings
    path = Path(ComputeSettings().model_cache_dir).expanduser()
    ours, theirs = model_loader.load_tokenizer(path), AutoTokenizer.from_pretrained(path)
    assert type(ours) is type(theirs) and ours.init_kwargs == theirs.init_kwargs
    assert ours.backend_tokenizer.to_str() == theirs.backend_tokenizer.to_str()
    assert ours.chat_template == theirs.chat_template and ours.all_special_ids == theirs.all_special_ids
    assert len(ours) == len(theirs)
    messages = [{"role": "user", "content": "Bread, héllo, 你好 <|im_end|>"}]
    assert ours.apply_chat_template(messages, add_generation_prompt=True) == \
        theirs.apply_chat_template(messages, add_generation_prompt=True)


def test_make_test_fast_forbids_the_real_model_and_no_other(monkeypatch, tmp_path):
    from compute_node.settings import ComputeSettings
    monkeypatch.setenv(model_loader.FORBID_ENV, "1")
    for real in (ComputeSettings().model_cache_dir, tmp_path / "empty"):  # the cache, or the GGUF into it
        with pytest.raises(model_loader.RealModelForbidden, match="make test-fast"):
            model_loader.load_model(real)
    path, _ = saved(tmp_path / "tiny", "tied")
    load_tokenizer = model_loader.load_tokenizer(ComputeSettings().model_cache_dir)
    load_tokenizer.save_pretrained(path)
    assert isinstance(model_loader.load_model(path)[0], weights.LlamaWeights)


@pytest.mark.slow
def test_the_real_models_tensors_are_transformers_own():
    from compute_node.settings import ComputeSettings
    path = Path(ComputeSettings().model_cache_dir).expanduser()
    if not (path / "config.json").exists():
        pytest.skip("the real model is not cached yet")
    assert weights.readable(path) == ""
    a = tensors_of(weights.load(path))
    b = tensors_of(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())
    assert a.keys() == b.keys() and all(
        (a[n] is None and b[n] is None) or torch.equal(a[n], b[n]) for n in a)
