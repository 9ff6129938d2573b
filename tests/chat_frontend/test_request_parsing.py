"""request_parsing: reading a body's values, each refusal naming its field (every endpoint's parser uses it)."""
import pytest

from chat_frontend import request_parsing as rp
from chat_frontend.errors import ChatError


def refusal(call, *args, **kwargs) -> ChatError:
    with pytest.raises(ChatError) as caught:
        call(*args, **kwargs)
    assert caught.value.code == "INVALID_ARGUMENT"
    return caught.value


def test_load_takes_a_json_object_of_unicode_text_only():
    assert rp.load(b'{"a": [1, "\\ud83d\\ude00"]}') == {"a": [1, "\U0001F600"]}
    assert "not JSON" in refusal(rp.load, b"{").message
    assert "JSON object" in refusal(rp.load, b"").message  # no body: null, not an object
    assert "JSON object" in refusal(rp.load, b"[1]").message
    assert refusal(rp.load, b'{"m": ["\\ud800"]}').param == "m[0]"


def test_a_number_is_an_int_or_float_in_its_bounds_never_a_bool_or_nan():
    assert rp.number({"n": 2}, "n", int, 1, 1, 4) == 2 and rp.number({}, "n", int, 1, 1, 4) == 1
    assert rp.number({"t": 1}, "t", float, 0.0, 0.0, 2.0) == 1.0
    assert rp.number({"n": 2.0}, "n", int, 1, 1, 4) == 2  # an integral float is an int
    for value in (True, 2.5, 5, float("nan"), "2"):
        assert refusal(rp.number, {"n": value}, "n", int, 1, 1, 4).param == "n", value
    assert "NaN" in refusal(rp.number_value, float("nan"), "x", float, 0.0, 0.0, 1.0).message


def test_a_flag_is_true_or_false_and_names_where_it_sits():
    assert rp.flag({"s": True}, "s") and not rp.flag({}, "s") and rp.flag({}, "s", default=True)
    assert refusal(rp.flag, {"u": 1}, "u", "stream_options.u").param == "stream_options.u"


def test_a_request_id_is_short_printable_text():
    assert rp.request_id({}) == "" and rp.request_id({"request_id": "r-1"}) == "r-1"
    for bad in ("a\nb", "x" * (rp.MAX_REQUEST_ID_CHARS + 1), 7):
        assert refusal(rp.request_id, {"request_id": bad}).param == "request_id"


def test_shown_values_are_short_and_keys_printable():
    assert rp.shown(float("inf")) == "Infinity" and len(rp.shown("x" * 100)) == 40
    assert rp.printable("k\udfff") == "k\\udfff"
