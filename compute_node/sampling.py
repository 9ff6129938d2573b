"""Choosing the next token of every sampling sequence of a step at once, as vLLM's SamplingParams say.

`sample` takes the step's logits [n, vocab] and one `SequenceSampler` per row. When every row is
plain greedy (temperature 0, no penalty, bias, min_tokens still to reach, logprobs or grammar) it
is the argmax alone, as before. Otherwise, in tensor ops over the rows that need them and in
vLLM's order: logit_bias; repetition penalty over prompt and output tokens; presence and
frequency penalties over output token counts; min_tokens masks the stop tokens; the grammar's
mask; then greedy rows take the argmax and the others temperature, top_k, top_p, min_p and one
draw from their own seeded generator (so a seed gives the same reply whatever shares the batch).
Logprobs are vLLM's raw ones: log_softmax of the model's logits before any of that.

A temperature below MIN_TEMPERATURE samples as MIN_TEMPERATURE (as vLLM does): in fp32,
logits / 1e-300 is inf (the divisor itself rounds to 0) and softmax gives NaN, which
torch.multinomial refuses. At 0.01 sampling is already all but greedy, so the clamp changes
no reply a user could tell apart, and every temperature check_sampling accepts is safe.
"""
from __future__ import annotations

import dataclasses
import math

import torch

MIN_TEMPERATURE = 1e-2
MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 300
MAX_STOP_STRINGS = 16
MAX_STOP_STRING_CHARS = 256
MAX_STOP_TOKEN_IDS = 64
TOP_P_CANDIDATES = (256, 4096)  # top_p looks among this many likeliest tokens first (top_p_rows)


@dataclasses.dataclass(frozen=True)
class SamplingParams:
    """vLLM's SamplingParams as far as one turn needs them: every zero value is "off".

    temperature 0: greedy (top_k, top_p and min_p then do nothing); top_p 0 or 1, top_k 0 or -1,
    repetition_penalty 0 or 1: off. logit_bias: token id -> added to its logit. stop_token_ids and
    stop strings end the reply besides the model's end of turn; none of them before min_tokens.
    structured: a kvtb_proto StructuredOutput (compiled by the servicer into the turn's matcher).
    """

    temperature: float = 0.0
    top_p: float = 0.0
    seed: int = 0
    top_k: int = 0
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 0.0
    logit_bias: dict[int, float] = dataclasses.field(default_factory=dict)
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    min_tokens: int = 0
    logprobs: bool = False
    top_logprobs: int = 0
    structured: object = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty_on)

    @property
    def repetition_penalty_on(self) -> bool:
        return self.repetition_penalty not in (0.0, 1.0)


def _finite_in(value: float, low: float, high: float) -> bool:
    return math.isfinite(value) and low <= value <= high


def check_sampling(temperature: float, top_p: float) -> str | None:
    """Why these values are invalid (NaN and infinities are), or None."""
    if not temperature >= 0.0 or temperature > 100.0:
        return f"sampling.temperature must be in [0, 100], got {temperature}"
    if not 0.0 <= top_p <= 1.0:
        return f"sampling.top_p must be in [0, 1], got {top_p}"
    return None


def check_params(p: SamplingParams, vocab_size: int, max_new_tokens: int, ignore_eos: bool = False) -> str | None:
    """Why these parameters are invalid (as vLLM's SamplingParams refuses them), naming the field, or None."""
    if (why := check_sampling(p.temperature, p.top_p)) is not None:
        return why
    checks = [
        (p.top_k >= -1, f"sampling.top_k must be -1 (off) or at least 0, got {p.top_k}"),
        (_finite_in(p.min_p, 0.0, 1.0), f"sampling.min_p must be in [0, 1], got {p.min_p}"),
        (_finite_in(p.presence_penalty, -2.0, 2.0), f"sampling.presence_penalty must be in [-2, 2], got {p.presence_penalty}"),
        (_finite_in(p.frequency_penalty, -2.0, 2.0),
         f"sampling.frequency_penalty must be in [-2, 2], got {p.frequency_penalty}"),
        (_finite_in(p.repetition_penalty, 0.0, 2.0),
         f"sampling.repetition_penalty must be 0 (off) or in (0, 2], got {p.repetition_penalty}"),
        (len(p.logit_bias) <= MAX_LOGIT_BIAS,
         f"sampling.logit_bias has {len(p.logit_bias)} entries, more than {MAX_LOGIT_BIAS}"),
        (len(p.stop) <= MAX_STOP_STRINGS, f"sampling.stop has {len(p.stop)} strings, more than {MAX_STOP_STRINGS}"),
        (len(p.stop_token_ids) <= MAX_STOP_TOKEN_IDS,
         f"sampling.stop_token_ids has {len(p.stop_token_ids)} ids, more than {MAX_STOP_TOKEN_IDS}"),
        (p.min_tokens <= max_new_tokens,
         f"sampling.min_tokens ({p.min_tokens}) cannot exceed max_new_tokens ({max_new_tokens})"),
        (p.top_logprobs <= MAX_TOP_LOGPROBS, f"sampling.top_logprobs must be at most {MAX_TOP_LOGPROBS}, got {p.top_logprobs}"),
        (p.logprobs or not p.top_logprobs, "sampling.top_logprobs needs sampling.logprobs"),
        (not (ignore_eos and p.structured is not None), "ignore_eos cannot be used with sampling.structured: "
                                                        "the grammar's end is the end of turn"),
    ]
    for ok, why in checks:
        if not ok:
            return why
    for token, bias in p.logit_bias.items():
        if token >= vocab_size:
            return f"sampling.logit_bias has token id {token}, outside the vocabulary [0, {vocab_size})"
        if not _finite_in(bias, -100.0, 100.0):
            return f"sampling.logit_bias[{token}] must be in [-100, 100], got {bias}"
    for i, token in enumerate(p.stop_token_ids):
        if token >= vocab_size:
            return f"sampling.stop_token_ids[{i}] = {token} is outside the vocabulary [0, {vocab_size})"
    for i, text in enumerate(p.stop):
        if not 1 <= len(text) <= MAX_STOP_STRING_CHARS:
            return f"sampling.stop[{i}] must have 1 to {MAX_STOP_STRING_CHARS} characters, got {len(text)}"
    return None


@dataclasses.dataclass(frozen=True)
class TokenLogprobs:
    """A sampled token's raw log probability and the likeliest tokens at its position (id, logprob)."""

    logprob: float
    top: list[tuple[int, float]]


class GrowingIds:
    """Distinct token ids in the order first seen, in a tensor that grows by doubling (ids: a view, no copy)."""

    def __init__(self, vocab_size: int, ids=()):
        unique = torch.unique(torch.as_tensor(list(ids), dtype=torch.long))
        self.member = torch.zeros(vocab_size, dtype=torch.bool)  # [vocab]
        self.member[unique] = True
        self.buffer = torch.zeros(max(64, 2 * unique.numel()), dtype=torch.long)
        self.buffer[:unique.numel()] = unique
        self.size = unique.numel()

    def add(self, token_id: int) -> None:
        if self.member[token_id]:
            return
        if self.size == self.buffer.numel():
            self.buffer = torch.cat([self.buffer, torch.zeros_like(self.buffer)])
        self.member[token_id] = True
        self.buffer[self.size] = token_id
        self.size += 1

    @property
    def ids(self) -> torch.Tensor:
        return self.buffer[:self.size]


class SequenceSampler:
    """One sequence's sampling state: its parameters, generator, output token counts and grammar matcher.

    The counts (penalties) are kept incrementally by accept(), from the prompt's tokens on: never
    recounted over the sequence; the penalties touch only the distinct tokens seen. Engine thread only.
    """

    def __init__(self, params: SamplingParams, vocab_size: int, prompt_ids=(), stop_ids=(), matcher=None):
        with torch.inference_mode(False):  # taken in between two layers of a forward: tensors accept() may update
            self._init(params, vocab_size, prompt_ids, stop_ids, matcher)

    def _init(self, params: SamplingParams, vocab_size: int, prompt_ids, stop_ids, matcher) -> None:
        self.params, self.vocab_size, self.matcher = params, vocab_size, matcher
        self.stop_ids = sorted({*stop_ids, *params.stop_token_ids})  # masked until min_tokens
        self.num_output = 0
        self.generator = None if params.greedy else torch.Generator().manual_seed(params.seed)
        self.counts = None  # [vocab] int32: times each token was generated (presence, frequency)
        self.output = None  # the distinct generated tokens
        self.seen = None    # the distinct tokens of the prompt and the output (repetition)
        self.bias_ids = torch.tensor(list(params.logit_bias), dtype=torch.long)  # [b]
        self.bias_values = torch.tensor(list(params.logit_bias.values()), dtype=torch.float32)  # [b]
        if params.presence_penalty or params.frequency_penalty:
            self.counts = torch.zeros(vocab_size, dtype=torch.int32)
            self.output = GrowingIds(vocab_size)
        if params.repetition_penalty_on:
            self.seen = GrowingIds(vocab_size, prompt_ids)

    @property
    def masks_stops(self) -> bool:
        return self.num_output < self.params.min_tokens and bool(self.stop_ids)

    @property
    def plain(self) -> bool:
        """Greedy with nothing to change the logits and nothing to report: the argmax alone."""
        p = self.params
        return (p.greedy and not p.logit_bias and not p.has_penalties and not p.logprobs
                and self.matcher is None and not self.masks_stops)

    def accept(self, token_id: int) -> None:
        """The token was appended to the sequence."""
        self.num_output += 1
        if self.counts is not None:
            self.counts[token_id] += 1
            self.output.add(token_id)
        if self.seen is not None:
            self.seen.add(token_id)
        if self.matcher is not None:
            self.matcher.accept(token_id)


def greedy(logits: torch.Tensor) -> list[int]:
    """The likeliest token of each row of logits [n, vocab]: argmax's choice (the first of equal maxima),
    by max, which took 0.4 ms for 32 rows of SmolLM2's vocabulary here against 1 ms for argmax."""
    return logits.max(dim=-1).indices.tolist()


def sample(logits: torch.Tensor, samplers: list[SequenceSampler]) -> tuple[list[int], list[TokenLogprobs | None]]:
    """One token per row of logits [n, vocab] (rows aligned with samplers), and each row's logprobs
    (None unless its parameters ask). Does not accept the tokens: the caller does, for those it keeps."""
    n = len(samplers)
    if all(s.plain for s in samplers):
        return greedy(logits), [None] * n
    tokens: list[int] = [0] * n
    plain = [k for k, s in enumerate(samplers) if s.plain]
    if plain:
        for k, token in zip(plain, greedy(logits[plain])):
            tokens[k] = token
    work = [k for k, s in enumerate(samplers) if not s.plain]
    subset = [samplers[k] for k in work]
    x = logits[work].float()  # [m, vocab]: a copy (indexing by a list), processed in place
    process(x, subset)
    picked = pick(x, subset)
    for k, token in zip(work, picked):
        tokens[k] = token
    return tokens, logprobs_of(logits, samplers, tokens)


def process(x: torch.Tensor, samplers: list[SequenceSampler]) -> None:
    """The logits processors, in place on x [m, vocab]: bias, penalties, min_tokens, grammar."""
    apply_logit_bias(x, samplers)
    apply_repetition_penalty(x, samplers)
    apply_presence_frequency(x, samplers)
    apply_min_tokens(x, samplers)
    rows = [k for k, s in enumerate(samplers) if s.matcher is not None]
    if rows:
        from compute_node import grammar
        grammar.mask_logits(x, rows, [samplers[k].matcher for k in rows])


def apply_logit_bias(x: torch.Tensor, samplers: list[SequenceSampler]) -> None:
    rows = [k for k, s in enumerate(samplers) if s.params.logit_bias]
    if rows:
        r, t = _pairs(rows, [samplers[k].bias_ids for k in rows])
        x.index_put_((r, t), torch.cat([samplers[k].bias_values for k in rows]).to(x.dtype), accumulate=True)


def _pairs(rows: list[int], ids: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, token) indexes into x: rows[j] with each of ids[j]."""
    lengths = torch.tensor([t.numel() for t in ids])
    return torch.repeat_interleave(torch.tensor(rows), lengths), torch.cat(ids)


def apply_repetition_penalty(x: torch.Tensor, samplers: list[SequenceSampler]) -> None:
    """Logits of tokens in the prompt or the output: divided by the penalty when positive, times it when not."""
    rows = [k for k, s in enumerate(samplers) if s.seen is not None]
    if not rows:
        return
    r, t = _pairs(rows, [samplers[k].seen.ids for k in rows])
    penalty = torch.tensor([s.params.repetition_penalty for s in samplers], dtype=x.dtype)[r]
    values = x[r, t]
    x[r, t] = torch.where(values > 0, values / penalty, values * penalty)


def apply_presence_frequency(x: torch.Tensor, samplers: list[SequenceSampler]) -> None:
    """logit -= frequency * count + presence, for each token the output holds (count times)."""
    rows = [k for k, s in enumerate(samplers) if s.output is not None and s.output.size]
    if not rows:
        return
    r, t = _pairs(rows, [samplers[k].output.ids for k in rows])
    counts = torch.cat([samplers[k].counts[samplers[k].output.ids] for k in rows]).to(x.dtype)
    freq = torch.tensor([s.params.frequency_penalty for s in samplers], dtype=x.dtype)[r]
    pres = torch.tensor([s.params.presence_penalty for s in samplers], dtype=x.dtype)[r]
    x[r, t] -= freq * counts + pres


def apply_min_tokens(x: torch.Tensor, samplers: list[SequenceSampler]) -> None:
    """No end of turn or stop token before min_tokens."""
    rows, ids = [], []
    for k, s in enumerate(samplers):
        if s.masks_stops and not (s.matcher is not None and s.matcher.is_complete()):  # the grammar's end wins
            rows.extend([k] * len(s.stop_ids))
            ids.extend(s.stop_ids)
    if rows:
        x[torch.tensor(rows), torch.tensor(ids)] = -math.inf


def pick(x: torch.Tensor, samplers: list[SequenceSampler]) -> list[int]:
    """The processed logits' choice: argmax for greedy rows, one seeded draw for the others."""
    tokens = [0] * len(samplers)
    greedy_rows = [k for k, s in enumerate(samplers) if s.params.greedy]
    if greedy_rows:
        for k, token in zip(greedy_rows, greedy(x[greedy_rows])):
            tokens[k] = token
    rows = [k for k, s in enumerate(samplers) if not s.params.greedy]
    if rows:
        drawn = samplers_draw(x[rows], [samplers[k] for k in rows])
        for k, token in zip(rows, drawn):
            tokens[k] = token
    return tokens


def samplers_draw(x: torch.Tensor, samplers: list[SequenceSampler]) -> list[int]:
    """Temperature, top_k, top_p, min_p over x [r, vocab], then one draw per row from its generator."""
    temperature = torch.tensor([max(s.params.temperature, MIN_TEMPERATURE) for s in samplers], dtype=x.dtype)
    x = x / temperature[:, None]
    ks = [s.params.top_k for s in samplers]
    if any(0 < k < x.shape[-1] for k in ks):
        x = top_k_filter(x, [k if 0 < k < x.shape[-1] else x.shape[-1] for k in ks])
    probs = torch.softmax(x, dim=-1)  # [r, vocab]
    rows = [k for k, s in enumerate(samplers) if 0.0 < s.params.top_p < 1.0]
    if rows:
        probs[rows] = top_p_rows(probs[rows], [samplers[k].params.top_p for k in rows])
    min_p = torch.tensor([s.params.min_p for s in samplers], dtype=probs.dtype)[:, None]
    if bool((min_p > 0).any()):
        probs = torch.where(probs < min_p * probs.max(dim=-1, keepdim=True).values, 0.0, probs)
    return draw(probs, [s.generator for s in samplers])


def draw(probs: torch.Tensor, generators: list[torch.Generator]) -> list[int]:
    """One token per row of probs [r, vocab] (weights, not necessarily normalised), by the inverse of its
    cumulative distribution at one uniform number from the row's own generator: a row's draw depends on
    its seed and its probabilities alone, and costs one number, not one per token of the vocabulary."""
    u = torch.cat([torch.rand(1, dtype=torch.float64, generator=g) for g in generators])  # [r]
    cdf = probs.double().cumsum(dim=-1)  # [r, vocab]
    tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True)[:, 0].tolist()  # first cdf > u * mass
    vocab = probs.shape[-1]
    return [t if t < vocab else int((probs[k] > 0).nonzero().max()) for k, t in enumerate(tokens)]  # rounding


def top_k_filter(x: torch.Tensor, ks: list[int]) -> torch.Tensor:
    """Logits x [r, vocab] outside each row's ks[row] largest become -inf (ties with the k-th are kept)."""
    top = torch.topk(x, max(ks), dim=-1).values  # [r, kmax]
    kth = top.gather(1, torch.tensor(ks)[:, None] - 1)  # [r, 1]
    return x.masked_fill(x < kth, -math.inf)


def top_p_rows(probs: torch.Tensor, top_ps: list[float]) -> torch.Tensor:
    """Each row of probs [r, vocab] kept to its smallest set of likeliest tokens whose mass reaches its
    top_p (not renormalised). Looked for among the likeliest TOP_P_CANDIDATES[0], then [1], tokens:
    when their mass reaches top_p the kept set is among them (sorting all 49k probabilities took
    5 ms a row here); a row whose mass is spread wider is sorted whole."""
    kept = torch.zeros_like(probs)
    todo = list(range(probs.shape[0]))
    for size in TOP_P_CANDIDATES:
        if not todo or size >= probs.shape[-1]:
            break
        values, ids = torch.topk(probs[todo], size, dim=-1)  # [t, size], descending
        cum = torch.cumsum(values, dim=-1)
        p = torch.tensor([top_ps[row] for row in todo], dtype=probs.dtype)[:, None]
        enough = (cum[:, -1] >= p[:, 0]).tolist()
        done = [j for j, ok in enumerate(enough) if ok]
        if done:
            rows = [todo[j] for j in done]
            kept[rows] = torch.zeros_like(probs[rows]).scatter_(1, ids[done], values[done].masked_fill(
                (cum - values)[done] >= p[done], 0.0))
        todo = [row for row, ok in zip(todo, enough) if not ok]
    for row in todo:
        kept[row] = top_p_filter(probs[row], top_ps[row])
    return kept


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p; renormalise."""
    sorted_probs, order = torch.sort(probs, descending=True)  # [vocab]
    before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    sorted_probs[before >= top_p] = 0.0
    kept = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return kept / kept.sum()


def logprobs_of(logits: torch.Tensor, samplers: list[SequenceSampler], tokens: list[int]) -> list[TokenLogprobs | None]:
    """vLLM's raw logprobs (log_softmax of the model's logits) of each row's token and its likeliest ones."""
    out: list[TokenLogprobs | None] = [None] * len(samplers)
    rows = [k for k, s in enumerate(samplers) if s.params.logprobs]
    if not rows:
        return out
    lp = torch.log_softmax(logits[rows].float(), dim=-1)  # [r, vocab]
    chosen = lp.gather(1, torch.tensor([tokens[k] for k in rows])[:, None])[:, 0].tolist()
    most = max(samplers[k].params.top_logprobs for k in rows)
    values, ids = torch.topk(lp, most, dim=-1) if most else (None, None)
    for j, k in enumerate(rows):
        n = samplers[k].params.top_logprobs
        top = list(zip(ids[j, :n].tolist(), values[j, :n].tolist())) if n else []
        out[k] = TokenLogprobs(chosen[j], top)
    return out

