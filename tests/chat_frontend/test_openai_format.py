"""Parsing a chat-completions body: every number range-checked before protobuf, in OpenAI's terms."""
import json

import pytest

from chat_frontend import openai_format as oa
from chat_frontend.errors import ChatError

HI = [{"role": "user", "content": "hi"}]


def parse(**fields):
    return oa.parse_request(json.dumps({"model": "m", "messages": HI, **fields}).encode(), 1024)


def refused(**fields) -> ChatError:
    with pytest.raises(ChatError) as err:
        parse(**fields)
    assert err.value.code == "INVALID_ARGUMENT"
    return err.value


def test_seeds_are_int64_and_map_one_to_one_onto_the_protos_uint64():
    assert parse(seed=-1).sampling.seed == 2**64 - 1
    assert parse(seed=2**63 - 1).sampling.seed == 2**63 - 1
    assert parse(seed=-(2**63)).sampling.seed == 2**63
    assert refused(seed=2**63).param == "seed"


def test_numbers_at_their_bounds_pass_and_just_past_them_are_refused():
    req = parse(max_tokens=1024, temperature=100.0, top_p=1.0, n=1, seed=0)
    assert (req.max_new_tokens, req.sampling.temperature, req.sampling.top_p) == (1024, 100.0, 1.0)
    assert parse(max_completion_tokens=7, max_tokens=9).max_new_tokens == 7
    assert parse(max_tokens=5.0).max_new_tokens == 5  # 5.0 is an integer in JSON's sense
    for field, value in (("max_tokens", 1025), ("temperature", 100.0001), ("top_p", 1.0001),
                         ("max_tokens", -1), ("temperature", -1e-300), ("max_tokens", 1e300)):
        err = refused(**{field: value})
        assert err.param == field and field in err.message, err


def test_a_lone_surrogate_is_found_where_it_is():
    assert oa.lone_surrogate({"a": [{"b": "ok"}, {"c": "x\ud800"}]}) == "a[1].c"
    assert oa.lone_surrogate({"a": ["\U0001F600 fine"]}) is None  # a real pair is text
    assert oa.lone_surrogate({"k\udfff": 1}) == "k\\udfff"


def test_http_errors_have_openai_s_shape():
    body = oa.http_error_body(413, "too large")["error"]
    assert (body["message"], body["type"], body["param"]) == ("too large", "invalid_request_error", None)
    assert body["code"] in ("request_entity_too_large", "content_too_large")  # Python 3.13 renamed it
    assert oa.http_error_body(404, "x")["error"]["type"] == "not_found_error"


def messages(*pairs) -> list[dict]:
    return [{"role": role, "content": content} for role, content in pairs]


def test_messages_split_into_system_history_and_the_new_message():
    req = parse(messages=messages(("system", "be brief"), ("user", "a"), ("assistant", "b"), ("user", "c")),
                user="u-1")
    assert (req.system, req.history, req.message, req.user) == \
        ("be brief", (("user", "a"), ("assistant", "b")), "c", "u-1")
    assert parse().system is None and parse().history == ()
    assert parse(messages=messages(("developer", ""), ("user", "c"))).system == ""  # sent, and empty
    for bad, what in (((("user", "a"), ("system", "s"), ("user", "c")), "first message"),
                      ((("user", "a"), ("user", "c")), "alternate"),
                      ((("assistant", "a"), ("user", "c")), "alternate"),
                      ((("user", "a"), ("assistant", "b")), "last message"),
                      ((("system", "s"),), "last message"),
                      ((("tool", "t"), ("user", "c")), "unsupported role")):
        err = refused(messages=messages(*bad))
        assert what in err.message and err.param == "messages", (bad, err)
