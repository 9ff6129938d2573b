"""vLLM's other endpoints on every real service (real model), driven by the official `openai` client:
/v1/completions (text and token-id prompts, n with a seed, stop, logprobs, streaming, echo, the KV
of a resent prompt found again), /tokenize and /detokenize, /v1/models/{id}, /version, and /metrics
under vLLM's names (an operator's token)."""
from __future__ import annotations

import json
import urllib.error
import urllib.request
import uuid

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from .conftest import USERS

pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
OPERATOR = "demo"
PROMPT = "The three primary colors are"


@pytest.fixture(scope="module")
def served(triggered):
    """Every service (`kvtb up`, shared by the e2e modules); its frontend's `demo` is an operator (/metrics)."""
    return triggered


def client(up, user: str = "alice") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{up.services['frontend']['http']}/v1", api_key=USERS[user],
                         max_retries=0)


def call(up, method: str, path: str, body: dict | None = None, user: str | None = "alice") -> tuple[int, bytes]:
    headers = {"Content-Type": "application/json"}
    if user:
        headers["Authorization"] = f"Bearer {USERS[user]}"
    request = urllib.request.Request(f"http://{up.services['frontend']['http']}{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def greedy(up, prompt, **kwargs):
    return client(up).completions.create(model=MODEL, prompt=prompt, max_tokens=16, temperature=0, **kwargs)


def test_text_and_token_id_prompts_complete_alike(served):
    done = greedy(served, PROMPT)
    text = done.choices[0].text
    assert done.object == "text_completion" and text.strip() and done.choices[0].finish_reason in ("stop", "length")
    status, body = call(served, "POST", "/tokenize", {"model": MODEL, "prompt": PROMPT})
    ids = json.loads(body)["tokens"]
    assert status == 200 and done.usage.prompt_tokens == len(ids)
    by_ids = greedy(served, ids)
    assert by_ids.choices[0].text == text  # the same tokens, greedily: the same completion
    echoed = greedy(served, PROMPT, echo=True)
    assert echoed.choices[0].text == PROMPT + text


def test_n_choices_with_a_seed_are_distinct_and_reproducible(served):
    def ask():
        done = client(served).completions.create(model=MODEL, prompt=["Once upon a time", "My favourite food is"],
                                                 n=2, seed=11, temperature=1.0, max_tokens=12)
        return [(c.index, c.text) for c in done.choices]
    first = ask()
    assert [i for i, _ in first] == [0, 1, 2, 3]
    assert first[0][1] != first[1][1] and first[2][1] != first[3][1]
    assert ask() == first


def test_a_stop_string_that_occurs_ends_the_text_before_it(served):
    text = greedy(served, PROMPT).choices[0].text
    words = text.split()
    assert len(words) >= 2, text
    stop = words[1]
    done = greedy(served, PROMPT, stop=[stop])
    assert done.choices[0].text == text[:text.index(stop)]
    assert done.choices[0].finish_reason == "stop"


def test_logprobs_in_the_completions_shape(served):
    done = greedy(served, PROMPT, logprobs=3)
    lp = done.choices[0].logprobs
    n = done.usage.completion_tokens
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert all(x <= 0 for x in lp.token_logprobs)
    for token, chosen, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert 3 <= len(top) <= 4 and top[token] == chosen
        assert chosen == pytest.approx(max(top.values()), abs=1e-4)  # greedy: the likeliest
    assert lp.text_offset[0] == 0 and lp.text_offset == sorted(lp.text_offset)


def test_streaming_gives_the_same_text_and_usage_last(served):
    text = greedy(served, PROMPT).choices[0].text
    chunks = list(client(served).completions.create(model=MODEL, prompt=PROMPT, max_tokens=16, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens > 0


def test_a_resent_long_prompt_finds_its_kv(served):
    prompt = f"Note {uuid.uuid4().hex}: " + " ".join(f"item {i} is a {['red', 'blue', 'green'][i % 3]} box;"
                                                     for i in range(40))
    first = greedy(served, prompt)
    second = greedy(served, prompt)
    assert first.usage.prompt_tokens > 128
    assert second.usage.prompt_tokens_details.cached_tokens >= 96  # the whole blocks of the prompt
    assert second.choices[0].text == first.choices[0].text


def test_tokenize_detokenize_round_trip(served):
    status, body = call(served, "POST", "/tokenize", {"prompt": PROMPT, "add_special_tokens": False,
                                                      "return_token_strs": True})
    tokens = json.loads(body)
    assert status == 200 and tokens["count"] == len(tokens["tokens"]) > 3 and tokens["max_model_len"] == 1024
    assert "".join(tokens["token_strs"]) == PROMPT
    status, body = call(served, "POST", "/detokenize", {"model": MODEL, "tokens": tokens["tokens"]})
    assert (status, json.loads(body)) == (200, {"prompt": PROMPT})
    status, body = call(served, "POST", "/tokenize", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 200 and json.loads(body)["count"] > tokens["count"] - 3  # the template's tokens too
    assert call(served, "POST", "/detokenize", {"tokens": [1]}, user=None)[0] == 401


def test_models_retrieve_and_version(served):
    assert client(served).models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError):
        client(served).models.retrieve("gpt-4")
    status, body = call(served, "GET", "/version", user=None)
    assert status == 200 and json.loads(body)["version"]


def test_metrics_under_vllm_names_for_an_operator(served):
    greedy(served, PROMPT)
    assert call(served, "GET", "/metrics", user="alice")[0] == 403
    status, body = call(served, "GET", "/metrics", user=OPERATOR)
    assert status == 200
    samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            samples[s.name] = samples.get(s.name, 0) + s.value
            assert "alice" not in s.labels.values()
    assert samples["vllm:request_success_total"] >= 1
    assert samples["vllm:prompt_tokens_total"] >= 5 and samples["vllm:generation_tokens_total"] >= 1
    assert samples["vllm:e2e_request_latency_seconds_count"] >= 1
    assert samples["vllm:time_to_first_token_seconds_count"] >= 1
    assert 0 <= samples["vllm:kv_cache_usage_perc"] <= 1
    assert samples["vllm:prefix_cache_queries_total"] >= samples["vllm:prefix_cache_hits_total"]
    assert samples["kvtb:requests_total"] >= 1  # the frontend's own, beside them
