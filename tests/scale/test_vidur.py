"""The roofline GPU step (`scale.costs.gpu_step_s`) against Vidur's profiled Llama-2-7B operators.

Vidur (microsoft/vidur) profiled every operator of Llama-2-7B on A100 and H100 GPUs. Its rows are
per-layer times in ms at a given token count, and attention times by batch, context and chunk.
tests/scale/fixtures/ keeps the rows used here and says where they come from.

A Vidur-derived step time is the sum of:
- 32 x (the per-layer operators at the step's token count + the attention kernel), and
- the embedding once.

This is Vidur's `ExecutionTime.model_time` at tensor parallel 1, plus `emb`. It leaves out the LM
head, the reshapes, the CPU overheads and Vidur's batching-overhead constants (fixtures/README.md).

The shapes are the ones the studies run:
- decode batches of 1, 8 and 32 sequences at 1,024 and 2,048 tokens of context;
- prefill chunks of 512 tokens (with no context, and on top of 1,024 cached tokens), 1,536 and
  2,048 tokens.

Each modeled step must come within 20% of Vidur's.

Two facts of the data shape the comparisons:

- Vidur's A100 is an A100 **80GB**. Its README and `A100DeviceSKUConfig` (total_memory_gb 80)
  say so, and so do the rows: its paged decode attention reads the KV at up to 1.66 TB/s
  (32 x 1,024 tokens x 16 KiB per layer in 0.324 ms). That is more than the 1.555 TB/s peak of
  Polaris' A100-SXM4-40GB. The 80GB's HBM2e peaks at 1.935 TB/s (PCIe) or 2.039 TB/s (SXM); both
  run at 312 TFLOP/s. So the polaris-a100 profile is checked on Vidur's GPU: its efficiencies,
  launch and FLOP peak as they are, with the bandwidth peak replaced by the 80GB's (both readings).
  The prefill shapes are compute bound, and their FLOP peak is the same on both GPUs, so they
  are also checked with the profile as it is. Decode on the profile as it is must come out slower
  than Vidur's 80GB: the 40GB cannot beat it. That check guards against fitting the 40GB's
  bandwidth to the 80GB.
- Vidur's H100 attention rows could not be had (fixtures/README.md). For the H100, attention is
  the A100's measured attention times the H100/A100 ratio of the memory-bound operators that were
  measured on both: the decode GEMMs at one token, 0.156 / 0.266 = 0.586. Decode attention is
  memory bound as those GEMMs are (the ratio matches HBM3 3.35 vs HBM2e ~2.0 TB/s).
  FlashAttention-2's forward pass is ~1.6-1.8x faster on an H100 than on an A100 (its authors'
  benchmarks), i.e. x 0.56-0.63. Attention is 6-68% of an H100 step here (15-27% of a prefill
  step).
"""
from __future__ import annotations

import csv
import dataclasses
import functools
import math
from pathlib import Path

import pytest

from scale import costs
from scale import profile as pf

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LAYERS = 32          # Llama-2-7B
TOLERANCE = 0.20     # |model / Vidur - 1| at most this
MS = 1e-3

# Per-layer operators of mlp.csv (the attention kernel comes from attention.csv).
PER_LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj",
                 "post_attention_layernorm", "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
# The decode GEMMs: at one token they read the weights and do little else (memory bound).
DECODE_GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")

A100_80GB_PEAKS = {"A100-80GB-PCIe": 1.935e12, "A100-80GB-SXM": 2.039e12}  # NVIDIA A100 datasheet, HBM2e


@dataclasses.dataclass(frozen=True)
class Shape:
    name: str
    prefill: bool
    count: int    # decode: sequences in the batch; prefill: tokens in the chunk
    context: int  # tokens already in the KV cache (per sequence)

    def batch(self) -> list[tuple[int, int]]:
        """The step as scale.costs takes it: (context tokens cached, new tokens) per sequence."""
        return [(self.context, self.count)] if self.prefill else [(self.context, 1)] * self.count

    @property
    def num_tokens(self) -> int:
        return self.count  # a decode step has one new token per sequence

    @property
    def attention_key(self) -> tuple[bool, int, int, int]:
        """(is_prefill, batch_size, prefill_chunk_size, kv_cache_size) of its attention.csv row."""
        return (True, 1, self.count, self.context) if self.prefill else (False, self.count, 0, self.context)


SHAPES = [
    Shape("decode 1 x 1024", False, 1, 1024),
    Shape("decode 8 x 1024", False, 8, 1024),
    Shape("decode 32 x 1024", False, 32, 1024),
    Shape("decode 1 x 2048", False, 1, 2048),
    Shape("decode 8 x 2048", False, 8, 2048),
    Shape("decode 32 x 2048", False, 32, 2048),
    Shape("prefill 512", True, 512, 0),
    Shape("prefill 512 on 1024", True, 512, 1024),
    Shape("prefill 1536", True, 1536, 0),
    Shape("prefill 2048", True, 2048, 0),
]
DECODES = [s for s in SHAPES if not s.prefill]
PREFILLS = [s for s in SHAPES if s.prefill]


def _median(row: dict, op: str) -> float:
    return float(row[f"time_stats.{op}.median"])


@functools.cache
def linear_rows(gpu: str) -> dict[int, dict]:
    """mlp.csv rows at tensor parallel 1, by num_tokens."""
    with open(FIXTURES / f"vidur_{gpu}_llama2_7b_mlp.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["num_tensor_parallel_workers"] == "1"]
    return {int(r["num_tokens"]): r for r in rows}


@functools.cache
def attention_rows() -> dict[tuple[bool, int, int, int], dict]:
    with open(FIXTURES / "vidur_a100_llama2_7b_attention.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r["num_tensor_parallel_workers"] == "1"]
    return {(r["is_prefill"] == "True", int(r["batch_size"]), int(r["prefill_chunk_size"]),
             int(r["kv_cache_size"])): r for r in rows}


def a100_attention_ms(shape: Shape) -> float:
    row = attention_rows()[shape.attention_key]
    return _median(row, "attn_prefill" if shape.prefill else "attn_decode")


def h100_attention_scale() -> float:
    """H100 / A100 time of the memory-bound decode GEMMs at one token (both measured)."""
    h100, a100 = linear_rows("h100")[1], linear_rows("a100")[1]
    return sum(_median(h100, op) for op in DECODE_GEMMS) / sum(_median(a100, op) for op in DECODE_GEMMS)


def vidur_step_ms(gpu: str, shape: Shape) -> float:
    """32 x (per-layer operators + attention) + the embedding, in ms."""
    row = linear_rows(gpu)[shape.num_tokens]
    attention = a100_attention_ms(shape) * (1.0 if gpu == "a100" else h100_attention_scale())
    return LAYERS * (sum(_median(row, op) for op in PER_LAYER_OPS) + attention) + _median(row, "emb")


def with_gpu(profile: pf.Profile, **changes) -> pf.Profile:
    return dataclasses.replace(profile, gpu=dataclasses.replace(profile.gpu, **changes))


def model_ms(profile: pf.Profile, shape: Shape) -> float:
    return costs.gpu_step_s(profile, shape.batch()) / MS


def check_within(profile: pf.Profile, gpu: str, shape: Shape) -> None:
    vidur, model = vidur_step_ms(gpu, shape), model_ms(profile, shape)
    ratio = model / vidur
    assert abs(ratio - 1) <= TOLERANCE, (
        f"{profile.name} ({profile.gpu.name}, {profile.gpu.mem_bytes_per_s / 1e12:.3f} TB/s) {shape.name}: "
        f"model {model:.2f} ms vs Vidur {vidur:.2f} ms (ratio {ratio:.3f}, allowed 1 +- {TOLERANCE})")


# -- the fixture and its sums --------------------------------------------------------------------------

def test_the_fixture_has_a_row_for_every_shape():
    for shape in SHAPES:
        assert shape.attention_key in attention_rows(), shape
        for gpu in ("a100", "h100"):
            assert shape.num_tokens in linear_rows(gpu), (gpu, shape)
            row = linear_rows(gpu)[shape.num_tokens]
            # Llama-2-7B's geometry, one GPU
            assert (row["n_head"], row["n_embd"], row["n_expanded_embd"]) == ("32", "4096", "11008")


def test_vidur_step_sums_by_hand():
    # A100 decode, 1 sequence at 1,024 tokens, per layer (ms): layernorm 0.005 + QKV 0.065 + rope 0.005
    # + attn_decode 0.020 + O 0.025 + layernorm 0.005 + up 0.116 + act 0.007 + down 0.060 + add 0.002
    # = 0.310; x 32 = 9.920; + emb 0.003 = 9.923 ms.
    assert vidur_step_ms("a100", SHAPES[0]) == pytest.approx(9.923, abs=1e-9)
    # A100 prefill of 2,048 tokens, per layer: 0.053 + 0.979 + 0.076 + attn_prefill 0.781 + 0.301 + 0.055
    # + 1.694 + 0.135 + 0.851 + 0.028 = 4.953; x 32 = 158.496; + emb 0.119 = 158.615 ms.
    assert vidur_step_ms("a100", SHAPES[-1]) == pytest.approx(158.615, abs=1e-9)
    # H100/A100 decode GEMMs at 1 token: (0.038 + 0.016 + 0.064 + 0.038) / (0.065 + 0.025 + 0.116 + 0.060)
    # = 0.156 / 0.266 = 0.58647
    assert h100_attention_scale() == pytest.approx(0.156 / 0.266, abs=1e-12)


# -- the A100 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("peak", A100_80GB_PEAKS, ids=list(A100_80GB_PEAKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_polaris_a100_on_vidurs_a100_80gb(shape, peak):
    polaris = pf.load("polaris-a100")
    assert polaris.gpu.peak_flops == 312e12  # the 40GB and the 80GB: the same SMs and clocks
    check_within(with_gpu(polaris, mem_bytes_per_s=A100_80GB_PEAKS[peak], name=peak), "a100", shape)


@pytest.mark.parametrize("shape", PREFILLS, ids=lambda s: s.name)
def test_polaris_a100_as_is_on_compute_bound_prefill(shape):
    check_within(pf.load("polaris-a100"), "a100", shape)


@pytest.mark.parametrize("shape", DECODES, ids=lambda s: s.name)
def test_polaris_a100_as_is_decodes_slower_than_vidurs_80gb(shape):
    """A 40GB A100 (1.555 TB/s) cannot decode faster than Vidur's 80GB (1.9-2.0 TB/s)."""
    assert model_ms(pf.load("polaris-a100"), shape) > vidur_step_ms("a100", shape)


# -- the H100 -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
def test_h100_nvme_on_vidurs_h100(shape):
    # Vidur's H100 is an SXM part, like the profile's: its decode GEMMs read the weights at
    # 404.8 MB per layer / 0.156 ms = 2.59 TB/s, more than an H100 PCIe's 2.0 TB/s peak.
    check_within(pf.load("h100-nvme"), "h100", shape)


# -- the comparison discriminates ------------------------------------------------------------------------

def test_the_comparison_fails_a_wrong_profile():
    polaris = with_gpu(pf.load("polaris-a100"), mem_bytes_per_s=A100_80GB_PEAKS["A100-80GB-SXM"])
    slow_memory = with_gpu(polaris, mem_efficiency=0.5)
    slow_compute = with_gpu(polaris, flops_efficiency=0.4)
    for shape in DECODES:
        with pytest.raises(AssertionError, match="ratio"):
            check_within(slow_memory, "a100", shape)
    for shape in PREFILLS:
        with pytest.raises(AssertionError, match="ratio"):
            check_within(slow_compute, "a100", shape)


def comparison_table() -> list[tuple[str, str, float, float, float]]:
    """(GPU, shape, Vidur ms, model ms, ratio) for every shape: A100 rows under polaris-a100 on the
    80GB SXM's bandwidth, H100 rows under h100-nvme. `python -m tests.scale.test_vidur` prints it."""
    a100 = with_gpu(pf.load("polaris-a100"), mem_bytes_per_s=A100_80GB_PEAKS["A100-80GB-SXM"])
    h100 = pf.load("h100-nvme")
    out = []
    for gpu, prof in (("a100", a100), ("h100", h100)):
        for shape in SHAPES:
            v, m = vidur_step_ms(gpu, shape), model_ms(prof, shape)
            out.append((gpu, shape.name, v, m, m / v))
    return out


def test_the_table_is_finite():
    assert all(math.isfinite(r) and r > 0 for *_, r in comparison_table())


if __name__ == "__main__":
    for gpu, name, v, m, r in comparison_table():
        print(f"{gpu}  {name:22s} Vidur {v:8.2f} ms  model {m:8.2f} ms  ratio {r:.3f}")
