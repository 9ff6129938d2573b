"""Parsing a chat-completions body: every field honoured or refused as the table says, every number
range-checked before protobuf, vLLM's defaults, message sequences, in OpenAI's terms."""
import json
import re
from pathlib import Path

import pytest

from chat_frontend import openai_format as oa
from chat_frontend import request_fields as rf
from chat_frontend import request_parsing as rp
from chat_frontend.conversation import Whole
from chat_frontend.errors import ChatError
from kvtb_proto import compute_pb2, frontend_pb2

HI = [{"role": "user", "content": "hi"}]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


def parse(**fields):
    return oa.parse_request(json.dumps({"model": "m", "messages": HI, **fields}).encode(), max_n=8,
                            draw_seed=lambda: 77)


def refused(**fields) -> ChatError:
    with pytest.raises(ChatError) as err:
        parse(**fields)
    assert err.value.code == "INVALID_ARGUMENT"
    return err.value


def test_seeds_are_int64_and_map_one_to_one_onto_the_protos_uint64():
    assert parse(seed=-1).sampling.seed == 2**64 - 1
    assert parse(seed=2**63 - 1).sampling.seed == 2**63 - 1
    assert parse(seed=-(2**63)).sampling.seed == 2**63
    assert parse(seed=0).sampling.seed == 0  # sent: kept, even 0
    assert parse().sampling.seed == 77        # absent: drawn
    assert refused(seed=2**63).param == "seed"


def test_without_a_seed_each_request_draws_its_own():
    body = json.dumps({"model": "m", "messages": HI}).encode()
    seeds = {oa.parse_request(body).sampling.seed for _ in range(4)}
    assert len(seeds) == 4


def test_numbers_at_their_bounds_pass_and_just_past_them_are_refused():
    req = parse(max_tokens=2**31 - 1, temperature=100.0, top_p=1.0, n=8, seed=0, top_k=-1, min_p=1.0,
                presence_penalty=-2, frequency_penalty=2, repetition_penalty=2.0, min_tokens=1024)
    assert (req.max_new_tokens, req.sampling.temperature, req.sampling.top_p, req.n) == \
        (2**31 - 1, 100.0, 1.0, 8)
    assert (req.sampling.top_k, req.sampling.min_p, req.sampling.presence_penalty,
            req.sampling.frequency_penalty, req.sampling.repetition_penalty, req.sampling.min_tokens) == \
        (-1, 1.0, -2.0, 2.0, 2.0, 1024)
    assert parse(max_completion_tokens=7, max_tokens=9).max_new_tokens == 7
    assert parse(max_tokens=5.0).max_new_tokens == 5  # 5.0 is an integer in JSON's sense
    for field, value in (("max_tokens", 2**31), ("temperature", 100.0001), ("top_p", 1.0001), ("top_p", 0),
                         ("max_tokens", -1), ("max_tokens", 0), ("max_completion_tokens", 0),
                         ("temperature", -1e-300), ("max_tokens", 1e300), ("n", 9), ("n", 0), ("top_k", -2),
                         ("min_p", 1.5), ("presence_penalty", 2.5), ("frequency_penalty", -3),
                         ("repetition_penalty", 0), ("repetition_penalty", 2.1), ("top_logprobs", 21)):
        err = refused(**{field: value, **({"logprobs": True} if field == "top_logprobs" else {})})
        assert err.param == field and field in err.message, err
    err = refused(max_tokens=4, min_tokens=5)
    assert err.param == "min_tokens"


def test_every_sampling_field_reaches_the_proto():
    s = parse(logit_bias={"5": -100, "7": 2.5}, stop=["a", "bc"], stop_token_ids=[9, 10],
              include_stop_str_in_output=True, logprobs=True, top_logprobs=3, ignore_eos=True).sampling
    assert dict(s.logit_bias) == {5: -100.0, 7: 2.5} and list(s.stop) == ["a", "bc"]
    assert list(s.stop_token_ids) == [9, 10] and s.include_stop_str_in_output and s.logprobs
    assert s.top_logprobs == 3 and parse(ignore_eos=True).ignore_eos
    assert list(parse(stop="x").sampling.stop) == ["x"]
    assert refused(top_logprobs=2).param == "top_logprobs"  # needs logprobs
    assert refused(logit_bias={"x": 1}).param == "logit_bias"
    assert refused(logit_bias={"1": 101}).param == "logit_bias"
    assert refused(stop=["a"] * 17).param == "stop"
    assert refused(stop=[""]).param == "stop"
    assert refused(stop_token_ids=[-1]).param == "stop_token_ids"


def test_defaults_are_vllms_and_the_models_generation_config_wins_over_them():
    req = parse()
    s = oa.apply_defaults(req.sampling, req.given, {})
    assert (s.temperature, s.top_p, s.top_k, s.min_p, s.repetition_penalty) == (1.0, 0.0, 0, 0.0, 0.0)
    s = oa.apply_defaults(req.sampling, req.given, {"temperature": 0.6, "top_p": 0.9, "top_k": 50.0})
    assert (s.temperature, round(s.top_p, 6), s.top_k) == (0.6, 0.9, 50)
    req = parse(temperature=0, top_k=5)
    s = oa.apply_defaults(req.sampling, req.given, {"temperature": 0.6, "top_k": 50.0})
    assert (s.temperature, s.top_k) == (0.0, 5)  # what the request says stays


def test_every_field_of_the_table_is_accepted_or_refused_as_it_says():
    for name, field in oa.FIELDS.items():
        if field.handling == rf.REFUSED:
            err = refused(**{name: "x"})
            assert err.param == name and name in err.message, name
    defaults_ok = {"store": False, "parallel_tool_calls": True, "skip_special_tokens": True,
                   "spaces_between_special_tokens": True, "tool_choice": "none", "response_format": {"type": "text"},
                   "modalities": ["text"], "service_tier": "auto", "metadata": {}, "use_beam_search": False,
                   "best_of": 1, "length_penalty": 1.0, "bad_words": [], "echo": False, "add_special_tokens": False,
                   "documents": [], "chat_template_kwargs": {}, "mm_processor_kwargs": {}, "priority": 0,
                   "tools": [], "functions": [], "function_call": "auto", "include_reasoning": False,
                   "request_id": "r-1", "return_tokens_as_token_ids": False}
    for name, value in defaults_ok.items():
        assert name in oa.FIELDS
        parse(**{name: value})
    not_default = {"store": True, "skip_special_tokens": False, "tool_choice": "required", "service_tier": "flex",
                   "metadata": {"a": "b"}, "use_beam_search": True, "best_of": 2, "echo": True, "priority": 1,
                   "bad_words": ["x"], "documents": [{"text": "t"}], "chat_template_kwargs": {"enable_thinking": 1},
                   "modalities": ["text", "audio"], "add_special_tokens": True, "length_penalty": 2,
                   "cache_salt": "s"}
    for name, value in not_default.items():
        err = refused(**{name: value})
        assert err.param == name and "not supported" in err.message, name
    for name in oa.FIELDS:  # null is the field left out
        parse(**{name: None}) if name not in ("model", "messages") else None


def test_an_unknown_field_is_named():
    err = refused(temprature=0.5)
    assert err.param == "temprature" and "unknown field" in err.message


def test_tools_are_refused_saying_why_unless_not_offered():
    for fields, param in (({"tools": [TOOL]}, "tools"), ({"tools": [TOOL], "tool_choice": "auto"}, "tools"),
                          ({"functions": [TOOL["function"]]}, "functions"),
                          ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice")):
        err = refused(**fields)
        assert err.param == param, fields
    assert "has no tool-call format; tool calling is not supported" in refused(tools=[TOOL]).message
    req = parse(tools=[TOOL], tool_choice="none")  # not offered: accepted, not rendered
    assert req.message == "hi" and req.whole is None
    for messages, param in (([{"role": "tool", "content": "1", "tool_call_id": "c"}], "messages[0].role"),
                            ([{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]},
                              {"role": "user", "content": "go"}], "messages[1].tool_calls")):
        err = refused(messages=messages)
        assert err.param == param and "tool calling is not supported" in err.message


def test_response_format_maps_onto_structured_output():
    assert parse(response_format={"type": "json_object"}).sampling.structured.json_object
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    s = parse(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema,
                                                                      "strict": True}}).sampling
    assert json.loads(s.structured.json_schema) == schema
    assert json.loads(parse(guided_json=schema).sampling.structured.json_schema) == schema
    assert not parse(response_format={"type": "text"}).sampling.HasField("structured")
    for bad in ({"type": "yaml"}, {"type": "json_schema"}, {"type": "json_schema", "json_schema": {"schema": {}}},
                {"type": "json_schema", "json_schema": {"name": "x", "schema": {"d": "x" * 70_000}}}):
        assert refused(response_format=bad).param == "response_format", bad


def messages(*pairs) -> list[dict]:
    return [{"role": role, "content": content} for role, content in pairs]


def test_alternating_messages_split_into_system_history_and_the_new_message():
    req = parse(messages=messages(("system", "be brief"), ("user", "a"), ("assistant", "b"), ("user", "c")),
                user="u-1")
    assert (req.system, req.history, req.message, req.user, req.whole) == \
        ("be brief", (("user", "a"), ("assistant", "b")), "c", "u-1", None)
    assert parse().system is None and parse().history == ()
    assert parse(messages=messages(("developer", ""), ("user", "c"))).system == ""  # sent, and empty
    assert parse(messages=messages(("user", ""))).message == ""  # empty content, as vLLM accepts


def test_other_sequences_are_rendered_whole_as_vllm_renders_them():
    for pairs in ((("user", "a"), ("system", "s"), ("user", "c")), (("user", "a"), ("user", "c")),
                  (("assistant", "hello"), ("user", "c")), (("user", "a"), ("assistant", "b")),
                  (("system", "s"),)):
        req = parse(messages=messages(*pairs))
        assert req.whole == Whole(tuple(pairs), True, False), pairs
    req = parse(messages=messages(("user", "a"), ("assistant", "The answer is")), add_generation_prompt=False,
                continue_final_message=True)
    assert req.whole == Whole((("user", "a"), ("assistant", "The answer is")), False, True)
    assert req.whole.user_message == "a"
    encoded = req.whole.encode("")
    assert encoded.continue_final_message and not encoded.add_generation_prompt
    assert [m.role for m in req.whole.encode("be kind").messages] == ["system", "user", "assistant"]
    assert parse(add_generation_prompt=False).whole == Whole((("user", "hi"),), False, False)
    err = refused(messages=messages(("user", "a"), ("assistant", "b")), continue_final_message=True)
    assert err.param == "continue_final_message" and "add_generation_prompt" in err.message
    err = refused(continue_final_message=True, add_generation_prompt=False)  # the last is the user's
    assert err.param == "continue_final_message"
    assert refused(messages=messages(("robot", "a"))).param == "messages[0].role"


def test_stream_options_need_stream_and_take_include_usage_only():
    assert parse(stream=True, stream_options={"include_usage": True}).include_usage
    assert refused(stream_options={"include_usage": True}).param == "stream_options"
    err = refused(stream=True, stream_options={"continuous_usage_stats": True})
    assert err.param == "stream_options.continuous_usage_stats"


def test_a_lone_surrogate_is_found_where_it_is():
    assert rp.lone_surrogate({"a": [{"b": "ok"}, {"c": "x\ud800"}]}) == "a[1].c"
    assert rp.lone_surrogate({"a": ["\U0001F600 fine"]}) is None  # a real pair is text
    assert rp.lone_surrogate({"k\udfff": 1}) == "k\\udfff"


def test_http_errors_have_openai_s_shape():
    body = oa.http_error_body(413, "too large")["error"]
    assert (body["message"], body["type"], body["param"]) == ("too large", "invalid_request_error", None)
    assert body["code"] in ("request_entity_too_large", "content_too_large")  # Python 3.13 renamed it
    assert oa.http_error_body(404, "x")["error"]["type"] == "not_found_error"


def test_a_compute_node_refusal_names_the_request_field():
    assert oa.param_of("agent: sampling.top_k must be -1 (off) or at least 0, got -5") == "top_k"
    assert oa.param_of("agent: sampling.structured: the schema does not compile") == "response_format"
    assert oa.param_of("agent: json_schema is 70000 bytes") == "response_format"
    assert oa.param_of("agent: something else") is None


def test_logprobs_in_openai_s_chat_shape():
    token = compute_pb2.TurnEvent.Token(id=5, text="é", piece="é", logprob=float("-inf"),
                                        top_logprobs=[compute_pb2.TopLogprob(id=6, logprob=-0.1, piece="a")])
    content = oa.logprobs([token])["content"]
    assert content == [{"token": "é", "logprob": -9999.0, "bytes": [195, 169],
                        "top_logprobs": [{"token": "a", "logprob": pytest.approx(-0.1), "bytes": [97]}]}]
    assert oa.logprobs([token], as_ids=True)["content"][0]["token"] == "token_id:5"


def test_stop_reason_is_the_requests_stop_string_or_token_only():
    sampling = compute_pb2.Sampling(stop=["END"], stop_token_ids=[9])
    def reason(finish, why):
        return oa.stop_reason(frontend_pb2.TurnSummary(finish_reason=finish, stop_reason=why), sampling)
    assert (reason("stop", "END"), reason("stop", "9"), reason("stop", "2"), reason("length", "")) == \
        ("END", 9, None, None)


def test_the_readme_table_lists_every_field_of_the_parser_as_it_handles_it():
    readme = (Path(__file__).parents[2] / "docs" / "openai-api.md").read_text()
    section = readme.split("## OpenAI API support", 1)[1].split("\n## ", 1)[0]
    chat = section.split("### Chat completions", 1)[1].split("\n### ", 1)[0]
    support = {"yes": rf.SUPPORTED, "default only": rf.DEFAULT_ONLY, "400": rf.REFUSED}
    listed = {}
    for row in chat.splitlines():
        cells = [c.strip() for c in row.split("|")[1:-1]]
        if len(cells) == 3 and cells[1] in support:
            listed.update({name: support[cells[1]] for name in re.findall(r"`([a-z_]+)`", cells[0])})
    assert set(listed) == set(oa.FIELDS), (sorted(set(listed) - set(oa.FIELDS)), sorted(set(oa.FIELDS) - set(listed)))
    assert {name: f.handling for name, f in oa.FIELDS.items()} == listed


def test_max_tokens_is_taken_large_and_checked_against_the_context_later():
    assert (parse().max_new_tokens, parse().max_tokens_param) == (0, "max_tokens")  # absent: the context's
    assert parse(max_tokens=4096).max_new_tokens == 4096  # no cap of 1,024 any more
    req = parse(max_completion_tokens=8000, max_tokens=5)
    assert (req.max_new_tokens, req.max_tokens_param) == (8000, "max_completion_tokens")
    assert parse(min_tokens=5000).sampling.min_tokens == 5000  # max_tokens absent: up to the context


def test_a_context_overflow_has_openai_s_code():
    err = oa.limits.context_exceeded(8192, 8000, 4096, "max_tokens")
    status, body = oa.error_body(err.code, err.message, err.param, err.openai_code)
    assert status == 400 and body["error"]["code"] == "context_length_exceeded"
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "max_tokens"
    assert oa.error_body("INVALID_ARGUMENT", "x")[1]["error"]["code"] == "invalid_argument"


def test_an_unknown_field_inside_a_message_is_named():
    err = refused(messages=[{"role": "user", "content": "hi", "weird": 1}])
    assert err.param == "messages[0].weird" and "unknown field 'weird'" in err.message
    assert "role, content, name" in err.message  # what a message may have
    err = refused(messages=[{"role": "system", "content": "s"}, {"role": "user", "content": [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b", "cache_control": {"type": "ephemeral"}}]}])
    assert err.param == "messages[1].content[1].cache_control" and "a text content part" in err.message
    err = refused(messages=[{"role": "assistant", "content": "a", "weird": None},
                            {"role": "user", "content": "b"}])
    assert err.param == "messages[0].weird"  # unknown even when null, as at the top level


def test_a_message_as_an_openai_client_resends_it_is_accepted():
    # openai's ChatCompletionMessage.model_dump() of a reply, then the next question
    reply = {"role": "assistant", "content": " ok", "refusal": None, "annotations": None, "audio": None,
             "function_call": None, "tool_calls": None, "reasoning_content": None}
    req = parse(messages=[{"role": "user", "content": "hi", "name": "ann"}, reply,
                          {"role": "user", "content": "again", "name": None}])
    assert req.history == (("user", "hi"), ("assistant", " ok")) and req.message == "again"
    parse(messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x", "tool_calls": [],
                                                        "refusal": "", "annotations": [], "reasoning": ""}])


def test_every_message_field_of_the_table_is_accepted_or_refused_as_it_says():
    not_default = {"tool_calls": [{"id": "c"}], "function_call": {"name": "f"}, "tool_call_id": "c",
                   "tools": [TOOL], "refusal": "no", "audio": {"id": "a"}, "annotations": [{"type": "url"}],
                   "reasoning": "hmm", "reasoning_content": "hmm"}
    assert set(not_default) == {k for k, f in oa.MESSAGE_FIELDS.items() if f.handling == rf.DEFAULT_ONLY}
    for name, value in not_default.items():
        assistant = {"role": "assistant", "content": "b", name: value}
        err = refused(messages=[{"role": "user", "content": "a"}, assistant,
                                {"role": "user", "content": "c"}])
        assert err.param == f"messages[1].{name}" and "not supported" in err.message, name
    assert "tool calling is not supported" in refused(
        messages=[{"role": "user", "content": "a", "tool_call_id": "c"}]).message
    for name in oa.MESSAGE_FIELDS:  # null is the field left out (a role is needed)
        if name != "role":
            parse(messages=[{"role": "user", "content": "hi", name: None}])
    assert {k for k, f in oa.MESSAGE_FIELDS.items() if f.handling == rf.REFUSED} == set()
    part = {"type": "text", "text": "a", "type2": 1}
    assert refused(messages=[{"role": "user", "content": [part]}]).param == "messages[0].content[0].type2"


def test_the_readme_lists_every_field_of_a_message_as_it_is_handled():
    readme = (Path(__file__).parents[2] / "docs" / "openai-api.md").read_text()
    section = readme.split("## OpenAI API support", 1)[1].split("\n## ", 1)[0]
    table = section.split("### Messages", 1)[1].split("\n### ", 1)[0]
    support = {"yes": rf.SUPPORTED, "default only": rf.DEFAULT_ONLY, "400": rf.REFUSED}
    listed, parts = {}, {}
    for row in table.splitlines():
        cells = [c.strip() for c in row.split("|")[1:-1]]
        if len(cells) == 3 and cells[1] in support:
            names = re.findall(r"`([a-z_.]+)`", cells[0])
            for name in names:
                into, key = (parts, name.split(".", 1)[1]) if name.startswith("content.") else (listed, name)
                into[key] = support[cells[1]]
    assert listed == {name: f.handling for name, f in oa.MESSAGE_FIELDS.items()}
    assert parts == {name: f.handling for name, f in oa.CONTENT_PART_FIELDS.items()}
