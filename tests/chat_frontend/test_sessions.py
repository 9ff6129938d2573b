"""Which session a request names, and which ids are accepted."""
import pytest

from chat_frontend.errors import ChatError
from chat_frontend.sessions import check_session_id, named_session, new_context_id


def test_ids_are_bounded_in_length_and_characters():
    for good in (new_context_id(), "a", "x" * 240, "9f1c2d3e-aaaa-4bbb-8ccc-0123456789ab", "alice@example.com",
                 "conv:7.turns+1=2_3"):
        assert check_session_id(good, "X-Session-Id") == good
    for bad in ("", "x" * 241, "a b", "a/b", "../etc", ".hidden", "-rf", "ctx\n1", "ctx-é", "ctx-\udcff", "a\x00"):
        with pytest.raises(ChatError) as err:
            check_session_id(bad, "X-Correlation-ID")
        assert (err.value.code, err.value.param) == ("INVALID_ARGUMENT", "X-Correlation-ID"), bad


def test_the_first_header_present_names_the_session_then_the_user_field():
    headers = {"X-Correlation-ID": "corr-1", "X-Session-Id": "sess-1"}
    assert named_session(headers, ["X-Correlation-ID"], "u") == "sess-1"
    assert named_session({"X-Correlation-ID": "corr-1"}, ["X-Correlation-ID"], "u") == "corr-1"
    assert named_session({"X-Correlation-ID": "corr-1"}, [], None) == ""  # a header not configured
    assert named_session({}, ["X-Correlation-ID"], "user-42") == "user-42"
    assert named_session({"X-Session-Id": "  "}, [], None) == ""
    with pytest.raises(ChatError) as err:
        named_session({}, [], "Alice Smith")
    assert err.value.param == "user"
