"""A cached Llama's weights read straight from its safetensors file, in the shape our forward reads them.

The forward (llama.py) takes transformers' modules only as holders of tensors: the config, the rope's
inverse frequencies, and every layer's weights. Importing transformers' modeling code to build them, and
its config classes (which import its model-loading and torch.distributed), cost more than a second of each
compute node's start here, which every stack, restart and test paid (`python -m bench.model_load`).
This module builds the same holders from the files alone: the same tensors, bit for bit, and the config's
fields the forward, the pool and the engine read (tests/compute_node/test_weights.py compares both with
transformers' own load).

Only what it can read exactly: a single-file LlamaForCausalLM with the default rope whose config.json
names every field read, every tensor named and none left over. Anything else (`readable` says why) loads
through transformers, as before.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import torch

WEIGHTS_FILE = "model.safetensors"
LAYER_TENSORS = ("input_layernorm.weight", "post_attention_layernorm.weight",
                 "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                 "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                 "mlp.down_proj.weight")


PROJECTIONS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
               "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
# config.json's fields that are read (llama.Llama, kv_pool.layout_for, the engine): each must be in the file,
# so that no default of ours stands in for one of transformers' (head_dim may be null: hidden / heads)
CONFIG_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                 "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "tie_word_embeddings",
                 "rope_parameters", "max_position_embeddings")


class Config(SimpleNamespace):
    """config.json as attributes (transformers' LlamaConfig gives the same values for CONFIG_FIELDS)."""

    def to_dict(self) -> dict:
        return dict(vars(self))


@dataclasses.dataclass
class Linear:
    """A projection's tensors, as torch.nn.Linear holds them: weight [out, in], bias [out] or None."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None


@dataclasses.dataclass
class Rope:
    """What the forward reads of transformers' LlamaRotaryEmbedding."""

    inv_freq: torch.Tensor   # [head_dim / 2] fp32
    attention_scaling: float
    rope_type: str


class LlamaWeights:
    """A LlamaForCausalLM's tensors under the names transformers gives them (model.layers[i].self_attn.q_proj
    ...), with its config and generation config; no forward of its own (llama.Llama is the forward)."""

    def __init__(self, config, generation_config, tensors: dict[str, torch.Tensor]):
        self.config = config
        self.generation_config = generation_config
        self.device = torch.device("cpu")
        def take(name: str, default: object = KeyError) -> torch.Tensor | None:
            if default is KeyError and name not in tensors:
                raise ValueError(f"the weights have no {name}, which the config names")
            return tensors.pop(name, default)
        layers = []
        for i in range(config.num_hidden_layers):
            t = {name: take(f"model.layers.{i}.{name}") for name in LAYER_TENSORS}
            bias = {name: take(f"model.layers.{i}.{name}.bias", None)
                    for name in PROJECTIONS}

            def lin(name: str, t=t, bias=bias) -> Linear:
                return Linear(t[f"{name}.weight"], bias[name])
            layers.append(SimpleNamespace(
                input_layernorm=SimpleNamespace(weight=t["input_layernorm.weight"]),
                post_attention_layernorm=SimpleNamespace(weight=t["post_attention_layernorm.weight"]),
                self_attn=SimpleNamespace(q_proj=lin("self_attn.q_proj"), k_proj=lin("self_attn.k_proj"),
                                          v_proj=lin("self_attn.v_proj"), o_proj=lin("self_attn.o_proj")),
                mlp=SimpleNamespace(gate_proj=lin("mlp.gate_proj"), up_proj=lin("mlp.up_proj"),
                                    down_proj=lin("mlp.down_proj"))))
        embed = take("model.embed_tokens.weight")
        self.model = SimpleNamespace(embed_tokens=SimpleNamespace(weight=embed),
                                     norm=SimpleNamespace(weight=take("model.norm.weight")),
                                     layers=layers, rotary_emb=default_rope(config))
        head = take("lm_head.weight", None)
        if head is None and not config.tie_word_embeddings:
            raise ValueError("the weights have no lm_head.weight and the config does not tie it to the "
                             "embedding")
        self.lm_head = Linear(embed if config.tie_word_embeddings else head)
        if tensors:
            raise ValueError(f"tensors the config does not name: {sorted(tensors)[:5]}")

    def eval(self) -> LlamaWeights:
        return self


def default_rope(config) -> Rope:
    """The default rope's inverse frequencies, as transformers' LlamaRotaryEmbedding computes them."""
    base = config.rope_parameters["rope_theta"]
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim))
    return Rope(inv_freq, 1.0, "default")


def readable(cache_dir: Path) -> str:
    """"" when load() can read cache_dir exactly, else why not (then transformers loads it)."""
    try:
        config = json.loads((cache_dir / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return f"no readable config.json ({exc})"
    if config.get("architectures") != ["LlamaForCausalLM"] or config.get("model_type") != "llama":
        return f"not a LlamaForCausalLM ({config.get('architectures')})"
    missing = [f for f in CONFIG_FIELDS if f not in config]
    if missing:
        return f"config.json does not name {', '.join(missing)}"
    rope = config.get("rope_parameters") or {}
    if rope.get("rope_type", "default") != "default" or "rope_theta" not in rope:
        return f"rope {rope} is not the default rope"
    if config.get("dtype") not in ("float32", None):
        return f"weights of dtype {config.get('dtype')}, not float32"
    if not (cache_dir / WEIGHTS_FILE).exists():
        return f"no single {WEIGHTS_FILE}"
    return ""


def load(cache_dir: Path) -> LlamaWeights:
    """The weights of cache_dir (readable(cache_dir) must be "", or this raises)."""
    why = readable(cache_dir)
    if why:
        raise ValueError(f"{cache_dir}: {why}")
    from safetensors.torch import load_file
    from transformers import GenerationConfig
    config = Config(**json.loads((cache_dir / "config.json").read_text()))
    if config.head_dim is None:
        config.head_dim = config.hidden_size // config.num_attention_heads
    has_generation = (cache_dir / "generation_config.json").exists()
    generation = GenerationConfig.from_pretrained(cache_dir) if has_generation else None
    tensors = load_file(cache_dir / WEIGHTS_FILE)
    wrong = sorted(name for name, t in tensors.items() if t.dtype != torch.float32)
    if wrong:
        raise ValueError(f"{cache_dir}: tensors not float32: {wrong[:5]}")
    return LlamaWeights(config, generation, tensors)
