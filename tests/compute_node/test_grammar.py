"""Constrained decoding with the real tokenizer: the text a grammar lets through parses and fits."""
from __future__ import annotations

import concurrent.futures
import json
import time

import pytest
import torch

from compute_node import grammar
from compute_node.grammar import (
    MAX_SCHEMA_BYTES,
    WHITESPACE_MAX_CHARS,
    GrammarCompiler,
    GrammarError,
    mask_logits,
)
from kvtb_proto.compute_pb2 import StructuredOutput

pytestmark = pytest.mark.service  # starts processes (tests/process_guard.py)

VOCAB = 49152  # SmolLM2-135M's logits width
EOS = 2

PERSON = {"type": "object",
          "properties": {"name": {"type": "string", "maxLength": 20},
                         "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "role": {"enum": ["admin", "user", "guest"]}},
          "required": ["name", "age", "role"], "additionalProperties": False}


@pytest.fixture(scope="module")
def compiler(tokenizer):
    compiler = GrammarCompiler(tokenizer, VOCAB)
    yield compiler
    compiler.close()


@pytest.fixture(scope="module")
def closer_bias(tokenizer):
    """+2 on the logits of tokens holding a quote, brace or bracket: random logits alone almost
    never end a JSON string (291 of 49,152 tokens hold one of them), so the replies would not finish."""
    texts = [tokenizer.decode([i]) for i in range(len(tokenizer))]
    return torch.tensor([2.0 if any(c in t for c in '"}]') else 0.0 for t in texts] + [0.0] * (VOCAB - len(texts)))


def random_decode(matcher, seed: int, bias: torch.Tensor, steps: int = 200) -> list[int]:
    """Greedy over random logits masked by the matcher, until it terminates or steps run out."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    while len(out) < steps and not matcher.is_terminated():
        logits = (torch.randn(VOCAB, generator=generator) + bias)[None]  # [1, vocab]
        mask_logits(logits, [0], [matcher])
        out.append(int(torch.argmax(logits[0])))
        matcher.accept(out[-1])
    return out


def json_object() -> StructuredOutput:
    return StructuredOutput(json_object=True)


def json_schema(schema) -> StructuredOutput:
    return StructuredOutput(json_schema=schema if isinstance(schema, str) else json.dumps(schema))


@pytest.mark.parametrize("seed", range(4))
def test_json_object_random_logits_give_an_object_ending_with_eos(compiler, tokenizer, closer_bias, seed):
    out = random_decode(compiler.matcher(json_object()), seed, closer_bias)
    assert out[-1] == EOS and EOS not in out[:-1], out
    value = json.loads(tokenizer.decode(out[:-1]))
    assert isinstance(value, dict)


def test_json_schema_random_logits_give_a_valid_object(compiler, tokenizer, closer_bias):
    for seed in range(4):
        out = random_decode(compiler.matcher(json_schema(PERSON)), seed, closer_bias)
        assert out[-1] == EOS
        value = json.loads(tokenizer.decode(out[:-1]))
        assert list(value) == ["name", "age", "role"]  # required, no others, in the schema's order
        assert isinstance(value["name"], str) and len(value["name"]) <= 20
        assert type(value["age"]) is int and 0 <= value["age"] <= 150
        assert value["role"] in ("admin", "user", "guest")


def test_eos_only_where_the_json_is_complete(compiler, tokenizer):
    matcher = compiler.matcher(json_object())
    for token in tokenizer.encode('{"a": [1, 2]'):
        matcher.accept(token)
        assert not matcher.eos_allowed() and not matcher.is_complete()
    logits = torch.zeros(1, VOCAB)
    mask_logits(logits, [0], [matcher])
    assert logits[0, EOS] == float("-inf")
    matcher.accept(tokenizer.encode("}")[0])
    assert matcher.eos_allowed() and matcher.is_complete() and not matcher.is_terminated()
    logits = torch.zeros(1, VOCAB)
    mask_logits(logits, [0], [matcher])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]  # nothing but the end
    matcher.accept(EOS)
    assert matcher.is_terminated()
    with pytest.raises(GrammarError, match="after the end"):
        matcher.accept(EOS)


def test_compact_and_indented_json_are_both_allowed_but_whitespace_is_bounded(compiler, tokenizer):
    for text in ['{"name":"Ann","age":3,"role":"user"}', '{\n  "name": "Ann",\n  "age": 3,\n  "role": "user"\n}']:
        matcher = compiler.matcher(json_schema(PERSON))
        for token in tokenizer.encode(text) + [EOS]:
            matcher.accept(token)
        assert matcher.is_terminated()
    matcher = compiler.matcher(json_object())
    with pytest.raises(GrammarError, match="breaks the structured output"):
        for token in tokenizer.encode("{" + " " * (WHITESPACE_MAX_CHARS + 1) + '"a": 1}'):
            matcher.accept(token)


def test_forbidden_token_is_refused(compiler, tokenizer):
    matcher = compiler.matcher(json_object())
    token = tokenizer.encode("hello")[0]
    with pytest.raises(GrammarError, match=f"token {token} breaks"):
        matcher.accept(token)
    assert matcher.error() and "non-verbose" not in matcher.error()
    with pytest.raises(GrammarError, match="outside the vocabulary"):
        compiler.matcher(json_object()).accept(VOCAB)
    logits = torch.zeros(1, VOCAB)  # a matcher in error lets only the end through
    mask_logits(logits, [0], [matcher])
    assert torch.isfinite(logits[0]).nonzero().flatten().tolist() == [EOS]


@pytest.mark.parametrize("text, message", [
    ('{"type": "object",', "not valid JSON"),
    ('[1, 2]', "must be a JSON object"),
    ('"object"', "must be a JSON object"),
    ('{"type": "objet"}', "Invalid type: objet"),
    ('{"type": "object", "propertyNames": {"pattern": "a"}}', "propertyNames"),
    ('{"type": "string", "format": "no-such-format"}', "no-such-format"),
    ('{"$ref": "#/$defs/missing"}', "missing"),
])
def test_bad_schema_is_refused_with_what_is_wrong(compiler, text, message):
    with pytest.raises(GrammarError, match=message):
        compiler.matcher(json_schema(text))


def test_oversized_schema_and_empty_spec_are_refused(compiler):
    big = json.dumps({"type": "object", "description": "x" * MAX_SCHEMA_BYTES})
    with pytest.raises(GrammarError, match=f"at most {MAX_SCHEMA_BYTES}"):
        compiler.matcher(json_schema(big))
    with pytest.raises(GrammarError, match="names no kind"):
        compiler.matcher(StructuredOutput())
    with pytest.raises(GrammarError, match="must be true"):
        compiler.matcher(StructuredOutput(json_object=False))


def test_a_schema_that_compiles_for_too_long_is_refused_in_bounded_time(tokenizer):
    # Each pattern's intersection with the others doubles llguidance's work: minutes at 40,
    # beyond its fuel limits (which bound lexing only).
    slow = {"type": "object", "properties": {"a": {"type": "string", "allOf": [
        {"pattern": "^.*a.{%d}$" % i} for i in range(1, 40)]}}, "required": ["a"]}
    compiler = GrammarCompiler(tokenizer, VOCAB, compile_timeout_s=1.0)
    try:
        compiler.matcher(json_schema({"type": "object"}))  # the screen's child started
        start = time.monotonic()
        with pytest.raises(GrammarError, match="took over 1 s"):
            compiler.matcher(json_schema(slow))
        assert time.monotonic() - start < 5.0
        start = time.monotonic()
        with pytest.raises(GrammarError, match="took over 1 s"):  # cached: refused at once
            compiler.matcher(json_schema(slow))
        assert time.monotonic() - start < 0.1
        compiler.matcher(json_schema(PERSON))  # a new child compiles the next schema
    finally:
        compiler.close()


def test_a_busy_compiler_refuses_without_caching_the_refusal(tokenizer, monkeypatch):
    monkeypatch.setattr(grammar, "COMPILE_QUEUE_TIMEOUT_S", 0.1)
    compiler = GrammarCompiler(tokenizer, VOCAB)
    try:
        with compiler._screen._lock:  # another thread's schema compiling
            with pytest.raises(GrammarError, match="busy"):
                compiler.matcher(json_schema(PERSON))
        compiler.matcher(json_schema(PERSON))
    finally:
        compiler.close()


def test_identical_schema_compiles_once_and_the_cache_is_bounded(tokenizer):
    compiler = GrammarCompiler(tokenizer, VOCAB, cache_entries=2)
    first, second = compiler.matcher(json_schema(PERSON)), compiler.matcher(json_schema(PERSON))
    assert compiler.compilations == 1
    first.accept(tokenizer.encode("{")[0])  # matchers from one cached grammar advance apart
    assert not second.eos_allowed() and second.error() == ""
    for bad in range(2):  # an uncompilable schema is cached too
        with pytest.raises(GrammarError):
            compiler.matcher(json_schema('{"type": "objet"}'))
    assert compiler.compilations == 2
    compiler.matcher(json_object())  # a third spec evicts the least recently used, PERSON
    compiler.matcher(json_schema(PERSON))
    assert compiler.compilations == 4
    compiler.close()


def test_threads_compile_at_once(tokenizer):
    """The servicer's threads compile while others do: each gets its own schema's matcher."""
    compiler = GrammarCompiler(tokenizer, VOCAB)
    schemas = [{"type": "object", "properties": {f"k{i}": {"const": i}}, "required": [f"k{i}"]} for i in range(6)]
    try:
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            matchers = list(pool.map(lambda schema: compiler.matcher(json_schema(schema)), schemas))
        for i, matcher in enumerate(matchers):
            for token in tokenizer.encode('{"k%d":%d}' % (i, i)) + [EOS]:
                matcher.accept(token)
            assert matcher.is_terminated()
        assert compiler.compilations == 6
    finally:
        compiler.close()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # numpy's path and torch's
def test_mask_batch_leaves_unconstrained_rows_untouched(compiler, tokenizer, dtype):
    a, b = compiler.matcher(json_object()), compiler.matcher(json_schema(PERSON))
    for token in tokenizer.encode('{"name'):
        b.accept(token)
    logits = torch.randn(3, VOCAB, generator=torch.Generator().manual_seed(0)).to(dtype)  # [3, vocab]
    before = logits.clone()
    mask_logits(logits, [2, 0], [a, b])
    assert torch.equal(logits[1], before[1])
    allowed_a = torch.isfinite(logits[2]).nonzero().flatten().tolist()
    assert allowed_a and all(tokenizer.decode([t]).startswith("{") for t in allowed_a)
    allowed_b = torch.isfinite(logits[0]).nonzero().flatten().tolist()
    assert tokenizer.encode('"')[0] in allowed_b and EOS not in allowed_b
    kept = torch.isfinite(logits)
    assert torch.equal(logits[kept], before[kept])  # allowed logits keep their values


def test_tokens_past_the_tokenizer_are_never_allowed(tokenizer):
    compiler = GrammarCompiler(tokenizer, len(tokenizer) + 64)  # a model padded past its tokenizer
    matcher = compiler.matcher(json_object())
    for token in tokenizer.encode('{"a": "'):
        matcher.accept(token)
    logits = torch.zeros(1, len(tokenizer) + 64)
    mask_logits(logits, [0], [matcher])
    assert torch.isfinite(logits[0, :len(tokenizer)]).any()
    assert torch.isinf(logits[0, len(tokenizer):]).all()
    with pytest.raises(ValueError, match="wide"):
        mask_logits(torch.zeros(1, VOCAB), [0], [matcher])
    with pytest.raises(ValueError, match="below the tokenizer"):
        GrammarCompiler(tokenizer, len(tokenizer) - 1)


@pytest.mark.slow
def test_real_model_reply_to_a_schema_validates():
    """SmolLM2 greedy, masked by the schema: the reply parses and every field fits."""
    from transformers import DynamicCache

    from compute_node.chat_template import ChatEncoder
    from compute_node.model_loader import load_model
    from compute_node.settings import ComputeSettings
    model, tokenizer = load_model(ComputeSettings().model_cache_dir, reference=True)
    compiler = GrammarCompiler(tokenizer, model.config.vocab_size)
    matcher = compiler.matcher(json_schema(PERSON))
    ids = ChatEncoder(tokenizer).encode([{"role": "user", "content":
                                          "Reply with a JSON object for a person: Alice, 30 years old, an admin."}])
    cache, out = DynamicCache(config=model.config), []
    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([ids]), cache=cache, use_cache=True).logits[:, -1]
        while len(out) < 80 and not matcher.is_terminated():
            logits = logits.clone()  # [1, vocab]
            mask_logits(logits, [0], [matcher])
            out.append(int(torch.argmax(logits[0])))
            matcher.accept(out[-1])
            logits = model(input_ids=torch.tensor([[out[-1]]]), cache=cache, use_cache=True).logits[:, -1]
    compiler.close()
    assert out[-1] == EOS, tokenizer.decode(out)
    value = json.loads(tokenizer.decode(out[:-1]))
    assert list(value) == ["name", "age", "role"] and value["role"] in ("admin", "user", "guest")
    assert isinstance(value["name"], str) and type(value["age"]) is int and 0 <= value["age"] <= 150
    assert value == {"name": "Alice", "age": 30, "role": "admin"}  # greedy: what the prompt says
