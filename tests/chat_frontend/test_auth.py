import pytest

from chat_frontend.auth import Authenticator, token_from
from chat_frontend.errors import ChatError


def test_request_field_wins_over_metadata():
    assert token_from("abc", [("authorization", "Bearer xyz")]) == "abc"


def test_bearer_metadata_any_case():
    assert token_from("", [("x-other", "1"), ("Authorization", "bearer  xyz ")]) == "xyz"
    assert token_from("", [("authorization", "Basic xyz")]) == ""
    assert token_from("", []) == ""


def test_known_unknown_and_missing_tokens():
    auth = Authenticator({"alice": "ta", "bob": "tb"})
    assert auth.user_for("tb") == "bob"
    with pytest.raises(ChatError) as err:
        auth.user_for("tc")
    assert err.value.code == "UNAUTHENTICATED" and "unknown token" in err.value.message
    with pytest.raises(ChatError) as err:
        auth.user_for("")
    assert err.value.code == "UNAUTHENTICATED" and "no token" in err.value.message
