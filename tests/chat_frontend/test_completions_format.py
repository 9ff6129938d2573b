"""Completions requests parsed from their JSON and responses shaped as OpenAI's (and vLLM's)."""
import json

import pytest

from chat_frontend import completions_format as cf
from chat_frontend import openai_format as oa
from chat_frontend import request_fields as rf
from chat_frontend.errors import ChatError
from kvtb_proto import compute_pb2


def parse(**body):
    return cf.parse_request(json.dumps({"model": "m", **body}).encode(), max_n=4, draw_seed=lambda: 42)


def refused(**body) -> ChatError:
    with pytest.raises(ChatError) as info:
        parse(**body)
    assert info.value.code == "INVALID_ARGUMENT"
    return info.value


def test_defaults_are_openais_completions_defaults():
    req = parse(prompt="hello")
    assert req.prompts == ("hello",) and req.max_tokens == 16 and req.n == 1 and req.add_special_tokens
    assert not req.max_tokens_given and parse(prompt="a", max_tokens=16).max_tokens_given
    assert req.sampling.seed == 42 and not req.sampling.logprobs and req.logprobs is None
    assert req.given == frozenset() and not req.echo and not req.stream


@pytest.mark.parametrize("prompt, prompts", [
    ("a", ("a",)), (["a", "b"], ("a", "b")), ([1, 2], ((1, 2),)), ([[1], [2, 3]], ((1,), (2, 3)))])
def test_prompt_shapes(prompt, prompts):
    assert parse(prompt=prompt).prompts == prompts


@pytest.mark.parametrize("prompt", [None, "", [], [""], [[]], [1, "a"], [[1, -1]], [True], ["a"] * 33, {"a": 1},
                                    [[1], 2]])
def test_bad_prompts_are_refused(prompt):
    assert refused(prompt=prompt).param == "prompt"


def test_logprobs_is_a_count_of_top_tokens():
    req = parse(prompt="a", logprobs=0)
    assert req.logprobs == 0 and req.sampling.logprobs and req.sampling.top_logprobs == 0
    req = parse(prompt="a", logprobs=5)
    assert req.sampling.top_logprobs == 5
    assert refused(prompt="a", logprobs=6).param == "logprobs"


def test_echo_with_logprobs_is_refused_and_max_tokens_0_needs_echo():
    error = refused(prompt="a", echo=True, logprobs=1)
    assert error.param == "echo" and "prompt's logprobs" in error.message
    assert refused(prompt="a", max_tokens=0).param == "max_tokens"
    assert parse(prompt="a", echo=True, max_tokens=0).max_tokens == 0


def test_max_tokens_is_taken_large_and_checked_against_the_context_later():
    assert parse(prompt="a", max_tokens=4096).max_tokens == 4096  # no cap of 1,024 any more
    assert parse(prompt="a", max_tokens=2**31 - 1).max_tokens == 2**31 - 1
    assert refused(prompt="a", max_tokens=2**31).param == "max_tokens"  # not even a count protobuf takes


def test_fields_honoured_defaulted_or_refused():
    req = parse(prompt="a", n=2, best_of=2, stop="x", temperature=0.5, top_k=3, ignore_eos=True, suffix=None,
                stream=True, stream_options={"include_usage": True}, add_special_tokens=False,
                return_tokens_as_token_ids=True, request_id="r1", user="u")
    assert req.n == 2 and list(req.sampling.stop) == ["x"] and req.sampling.top_k == 3 and req.ignore_eos
    assert req.given == frozenset({"temperature", "top_k"}) and req.include_usage and not req.add_special_tokens
    assert req.token_ids_as_tokens and req.request_id == "r1"
    for field, value in [("suffix", "end"), ("best_of", 3), ("prompt_logprobs", 1), ("use_beam_search", True),
                         ("guided_regex", "a+"), ("prompt_embeds", "x"), ("messages", []), ("nonsense", 1)]:
        assert refused(prompt="a", **{field: value}).param == field


def test_sequences_are_bounded():
    assert refused(prompt=["a"] * 32, n=4).param == "n"
    assert parse(prompt=["a"] * 16, n=4).choices == 64


def test_every_chat_sampling_field_is_in_the_table():
    sampling_fields = {"frequency_penalty", "presence_penalty", "logit_bias", "seed", "stop", "temperature",
                       "top_p", "top_k", "min_p", "repetition_penalty", "stop_token_ids",
                       "include_stop_str_in_output", "ignore_eos", "min_tokens", "response_format", "guided_json"}
    assert all(cf.FIELDS[f].handling == rf.SUPPORTED for f in sampling_fields)


def token(token_id, text, logprob, piece=None, tops=()):
    return compute_pb2.TurnEvent.Token(id=token_id, text=text, logprob=logprob, piece=piece or text,
                                       top_logprobs=[compute_pb2.TopLogprob(id=i, logprob=lp, piece=p)
                                                     for i, p, lp in tops])


def test_logprobs_shape_offsets_and_the_sampled_token_among_the_top():
    tokens = [token(5, " Hi", -0.5, tops=[(5, " Hi", -0.5), (6, " Yo", -1.0)]),
              token(7, "", -2.0, piece="\ufffd", tops=[(8, "x", -0.125)]), token(9, "!", float("-inf"))]
    lp = cf.logprobs(tokens, text_offset=4)
    assert lp["tokens"] == [" Hi", "\ufffd", "!"]
    assert lp["token_logprobs"] == [-0.5, -2.0, oa.LOGPROB_FLOOR]
    assert lp["top_logprobs"] == [{" Hi": -0.5, " Yo": -1.0}, {"\ufffd": -2.0, "x": -0.125}, {"!": oa.LOGPROB_FLOOR}]
    assert lp["text_offset"] == [4, 7, 7]
    assert cf.logprobs(tokens[:1], 0, as_ids=True)["tokens"] == ["token_id:5"]


def test_stop_reason_is_the_request_stop_string_or_token():
    sampling = compute_pb2.Sampling(stop=["END"], stop_token_ids=[42])
    rec = compute_pb2.TurnRecord
    assert oa.stop_reason(rec(finish_reason="stop", stop_reason="END"), sampling) == "END"
    assert oa.stop_reason(rec(finish_reason="stop", stop_reason="42"), sampling) == 42
    assert oa.stop_reason(rec(finish_reason="stop", stop_reason="2"), sampling) is None  # the model's own end
    assert oa.stop_reason(rec(finish_reason="length"), sampling) is None


def test_usage_counts_each_prompt_once_and_every_choice():
    choices = [cf.Choice(i, "t", [], "stop", completion_tokens=3, prompt_tokens=10 + i // 2, cached_tokens=4)
               for i in range(4)]
    assert cf.usage(choices, n=2) == {"prompt_tokens": 21, "completion_tokens": 12, "total_tokens": 33,
                                      "prompt_tokens_details": {"cached_tokens": 8}}


def test_response_shape():
    req = parse(prompt="a", logprobs=0)
    body = cf.completion("cmpl-1", req, [cf.Choice(0, " b", [token(3, " b", -0.1)], "length", None, 1, 2)])
    assert body["object"] == "text_completion" and body["model"] == "m"
    choice = body["choices"][0]
    assert choice["text"] == " b" and choice["finish_reason"] == "length" and choice["stop_reason"] is None
    assert choice["logprobs"]["tokens"] == [" b"] and choice["prompt_logprobs"] is None
    with pytest.raises(ChatError) as info:
        cf.check_model("gpt-4", "m")
    assert info.value.code == "NOT_FOUND"
