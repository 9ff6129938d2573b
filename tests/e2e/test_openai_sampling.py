"""What real clients send is honoured (issue 32): each sampling field of OpenAI's and vLLM's chat API
against every real service and the real model, through the official `openai` client.

Each test compares with a request that leaves the field out, so that it fails when the field is
ignored: a stop string cuts the greedy reply where it occurs, a penalty changes it, min_tokens
lengthens a reply that would end sooner, a seed reproduces a sampled reply that another seed does not.
"""
from __future__ import annotations

import json
import math
import time
import urllib.request
import uuid

import openai
import pytest

from .conftest import USERS

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"


@pytest.fixture(scope="module")
def client(triggered) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{triggered.services['frontend']['http']}/v1", api_key=USERS["carol"],
                         max_retries=0, timeout=300)


def ask(client: openai.OpenAI, text: str, **fields):
    """One completion of a fresh one-message conversation (a new id: no KV of an earlier test)."""
    fields.setdefault("max_tokens", 32)
    return client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] {text}"}], **fields)


def greedy(client: openai.OpenAI, text: str, **fields):
    return ask(client, text, temperature=0, **fields)


PROMPT = "Name three colours of the rainbow and say one thing about each."


def test_a_stop_string_that_occurs_ends_the_reply_before_it(client):
    tag = uuid.uuid4().hex[:8]
    full = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=40,
                                          messages=[{"role": "user", "content": f"[{tag}] {PROMPT}"}])
    text = full.choices[0].message.content
    words = text.split()
    assert len(words) > 6, text
    stop = words[len(words) // 2]
    cut = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=40, stop=[stop],
                                         messages=[{"role": "user", "content": f"[{tag}] {PROMPT}"}])
    choice = cut.choices[0]
    assert choice.finish_reason == "stop"
    assert choice.message.content == text[:text.index(stop)], (stop, text)
    assert stop not in choice.message.content


def test_a_streamed_stop_string_is_not_streamed(client):
    messages = [{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] {PROMPT}"}]
    full = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40)
    text = full.choices[0].message.content
    stop = text.split()[len(text.split()) // 2]
    stream = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40,
                                            stop=stop, stream=True)
    pieces, finish = [], None
    for chunk in stream:
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == text[:text.index(stop)]
    assert finish == "stop"


def test_n_choices_with_a_seed_are_distinct_and_reproducible(client):
    tag = uuid.uuid4().hex[:8]
    messages = [{"role": "user", "content": f"[{tag}] Write a short sentence about the sea."}]
    first = client.chat.completions.create(model=MODEL, messages=messages, n=3, seed=1234, temperature=1.0,
                                           max_tokens=24)
    texts = [c.message.content for c in sorted(first.choices, key=lambda c: c.index)]
    assert [c.index for c in sorted(first.choices, key=lambda c: c.index)] == [0, 1, 2]
    assert len(set(texts)) == 3, texts
    again = client.chat.completions.create(model=MODEL, messages=messages, n=3, seed=1234, temperature=1.0,
                                           max_tokens=24)
    assert [c.message.content for c in sorted(again.choices, key=lambda c: c.index)] == texts
    other = client.chat.completions.create(model=MODEL, messages=messages, n=3, seed=99, temperature=1.0,
                                           max_tokens=24)
    assert [c.message.content for c in sorted(other.choices, key=lambda c: c.index)] != texts


def test_without_temperature_or_seed_the_reply_is_sampled(client):
    tag = uuid.uuid4().hex[:8]
    messages = [{"role": "user", "content": f"[{tag}] Invent a name for a cat and describe it."}]
    replies = {client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24)
               .choices[0].message.content for _ in range(3)}
    assert len(replies) > 1, replies  # greedy would give one reply three times


def test_logprobs_are_log_probabilities_of_the_chosen_tokens(client):
    done = greedy(client, PROMPT, max_tokens=12, logprobs=True, top_logprobs=5)
    choice = done.choices[0]
    content = choice.logprobs.content
    assert len(content) == done.usage.completion_tokens
    assert "".join(t.token for t in content).startswith(choice.message.content[:1])
    for entry in content:
        assert entry.logprob <= 0.0
        tops = entry.top_logprobs
        assert len(tops) == 5
        assert [t.logprob for t in tops] == sorted((t.logprob for t in tops), reverse=True)
        assert sum(math.exp(t.logprob) for t in tops) <= 1.0 + 1e-4
        # greedy: the chosen token is the likeliest one
        assert tops[0].token == entry.token
        assert tops[0].logprob == pytest.approx(entry.logprob, abs=1e-4)


def test_a_json_schema_reply_validates(client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 24},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 150},
                                               "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]}},
              "required": ["name", "age", "city"], "additionalProperties": False}
    done = greedy(client, "Describe a person as JSON with their name, age and city.", max_tokens=100,
                  response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    reply = json.loads(done.choices[0].message.content)
    assert set(reply) == {"name", "age", "city"}
    assert isinstance(reply["name"], str) and isinstance(reply["age"], int) and not isinstance(reply["age"], bool)
    assert reply["city"] in ("Paris", "Rome", "Oslo")


def test_json_object_gives_a_json_object(client):
    # no id before the message: with one, the model nests {"key": "ok", "value": {...}} until max_tokens
    done = client.chat.completions.create(
        model=MODEL, temperature=0, max_tokens=200, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": "Reply with a JSON object whose key \"ok\" is true."}])
    reply = done.choices[0].message.content
    assert reply.lstrip().startswith("{")  # even a reply cut at max_tokens is an object's beginning
    assert done.choices[0].finish_reason == "stop", reply  # the grammar ended it
    assert isinstance(json.loads(reply), dict)


def test_a_schema_that_does_not_compile_is_refused(client):
    with pytest.raises(openai.BadRequestError):
        greedy(client, PROMPT, response_format={"type": "json_schema", "json_schema": {
            "name": "bad", "schema": {"type": "object", "properties": {"a": {"type": "no-such-type"}}}}})


def test_penalties_change_the_reply(client):
    # no id before it: a message whose greedy reply repeats itself (with some ids the model echoes the
    # message instead, which no penalty on the reply's own tokens changes)
    messages = [{"role": "user", "content": "List the days of the week, then list them again."}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40)
    penalised = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40,
                                               presence_penalty=2.0, frequency_penalty=2.0)
    assert plain.choices[0].message.content != penalised.choices[0].message.content
    repeated = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=40,
                                              extra_body={"repetition_penalty": 1.8})
    assert repeated.choices[0].message.content != plain.choices[0].message.content


def test_min_tokens_lengthens_a_short_reply_and_ignore_eos_fills_max_tokens(client):
    tag = uuid.uuid4().hex[:8]
    messages = [{"role": "user", "content": f"[{tag}] Answer with one word: is the sky blue?"}]
    short = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=60)
    assert short.usage.completion_tokens < 30, short.choices[0].message.content
    longer = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=60,
                                            extra_body={"min_tokens": 30})
    assert longer.usage.completion_tokens >= 30
    full = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=60,
                                          extra_body={"ignore_eos": True})
    assert full.usage.completion_tokens == 60
    assert full.choices[0].finish_reason == "length"


def tokenize(triggered, text: str) -> list[int]:
    """The server's /tokenize of a text alone (no chat template)."""
    request = urllib.request.Request(
        f"http://{triggered.services['frontend']['http']}/tokenize", method="POST",
        headers={"Authorization": f"Bearer {USERS['carol']}", "Content-Type": "application/json"},
        data=json.dumps({"model": MODEL, "prompt": text, "add_special_tokens": False}).encode())
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())["tokens"]


def test_logit_bias_and_stop_token_ids(client, triggered):
    apple = tokenize(triggered, " apple")
    assert len(apple) == 1, apple
    forced = greedy(client, PROMPT, max_tokens=8, logit_bias={str(apple[0]): 100})
    assert forced.choices[0].message.content.split() == ["apple"] * 8
    messages = [{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] {PROMPT}"}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=30,
                                           logprobs=True)
    ids = tokenize(triggered, plain.choices[0].message.content)
    stop_id = ids[5]
    cut = client.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=30,
                                         extra_body={"stop_token_ids": [stop_id]})
    assert cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens <= ids.index(stop_id) + 1  # its first occurrence, or sooner


@pytest.mark.parametrize("fields, param", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"extra_body": {"no_such_field": 1}}, "no_such_field"),
    ({"extra_body": {"best_of": 3}}, "best_of"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}, "tools"),
])
def test_what_is_not_honoured_is_refused_by_name(client, fields, param):
    with pytest.raises(openai.BadRequestError) as refused:
        greedy(client, PROMPT, **fields)
    assert param in str(refused.value)


def test_messages_as_clients_send_them(client):
    tag = uuid.uuid4().hex[:8]
    two_users = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12, messages=[
        {"role": "user", "content": f"[{tag}] Hello."}, {"role": "user", "content": "What is two plus two?"}])
    assert two_users.choices[0].message.content
    greeting_first = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=12, messages=[
        {"role": "assistant", "content": f"[{tag}] Hi! How can I help?"},
        {"role": "user", "content": "Tell me a colour."}])
    assert greeting_first.choices[0].message.content
    prefix = "The capital of France is"
    continued = client.chat.completions.create(model=MODEL, temperature=0, max_tokens=8, messages=[
        {"role": "user", "content": f"[{tag}] What is the capital of France?"},
        {"role": "assistant", "content": prefix}],
        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    reply = continued.choices[0].message.content
    assert "Paris" in reply, reply
    assert not reply.startswith(prefix)  # the continuation alone, as vLLM returns it


def prefix_cache_hits(triggered) -> float:
    """vllm:prefix_cache_hits_total on the API port (an operator's token): prompt tokens found in the pool."""
    request = urllib.request.Request(f"http://{triggered.services['frontend']['http']}/metrics",
                                     headers={"Authorization": f"Bearer {USERS['demo']}"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:prefix_cache_hits_total"))


def test_n_choices_prefill_their_prompt_once(client, triggered):
    story = " ".join(f"Day {i}: the baker made {i * 3} loaves and sold them all before noon." for i in range(8))
    before = prefix_cache_hits(triggered)
    done = ask(client, f"{story} How many loaves in all?", n=3, seed=5, temperature=1.0, max_tokens=4)
    assert len(done.choices) == 3
    time.sleep(1.5)  # the API caches the compute node's figures for 1 s
    full_blocks = done.usage.prompt_tokens // 32
    assert full_blocks >= 3
    # choices 2 and 3 found the prompt's full blocks that choice 1 prefilled
    assert prefix_cache_hits(triggered) - before >= 2 * full_blocks * 32
