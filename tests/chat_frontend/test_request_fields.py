"""request_fields: the fields both endpoints share, and the one check that refuses by name."""
from __future__ import annotations

import pytest

from chat_frontend import completions_format as cf
from chat_frontend import openai_format as oa
from chat_frontend import request_fields as rf
from chat_frontend.errors import ChatError


def test_both_endpoints_handle_the_shared_fields_alike():
    for name, field in rf.SHARED.items():
        assert oa.FIELDS[name] is field and cf.FIELDS[name] is field, name


@pytest.mark.parametrize("body, param, words", [
    ({"no_such": 1}, "no_such", "unknown field 'no_such': not part of the test API"),
    ({"guided_regex": "a+"}, "guided_regex", "guided_regex is not supported: only JSON"),
    ({"use_beam_search": True}, "use_beam_search", "use_beam_search True is not supported; accepted: false"),
    ({"best_of": 2, "n": 1}, "best_of", "best_of 2 is not supported"),
])
def test_a_field_that_is_unknown_refused_or_not_its_default_is_named(body, param, words):
    with pytest.raises(ChatError) as refused:
        rf.check_fields(body, rf.SHARED, "test")
    assert refused.value.code == "INVALID_ARGUMENT" and refused.value.param == param
    assert words in refused.value.message


def test_supported_defaults_and_nulls_pass():
    rf.check_fields({"temperature": 0.5, "use_beam_search": False, "best_of": 2, "n": 2, "guided_regex": None,
                     "skip_special_tokens": True}, {**rf.SHARED, "n": rf.yes()}, "test")
    with pytest.raises(ChatError):  # True is not 1: a default's type counts
        rf.check_fields({"priority": False}, rf.SHARED, "test")
