"""Stop strings on streamed text: held back while they may start, matched across tokens, never streamed."""
from __future__ import annotations

from compute_node.stop_strings import StopStrings


def stream(stops, pieces, include=False, check_from=0):
    """(text sent, the stop matched) for pieces pushed one by one (checking from piece check_from on)."""
    s, sent = StopStrings(stops, include), []
    for i, piece in enumerate(pieces):
        text, matched = s.push(piece, i >= check_from)
        sent.append(text)
        if matched is not None:
            return sent, matched
    sent.append(s.flush())
    return sent, None


def test_a_stop_string_split_across_tokens_is_matched_and_not_streamed():
    sent, matched = stream(["END"], ["Hello E", "N", "D and more"])
    assert matched == "END" and sent == ["Hello ", "", ""]
    assert "".join(sent) == "Hello "


def test_include_stop_str_in_output_sends_through_the_stop_string_only():
    sent, matched = stream(["END"], ["Hello E", "ND and more"], include=True)
    assert matched == "END" and "".join(sent) == "Hello END"


def test_text_that_turns_out_not_to_be_a_stop_string_goes_out():
    sent, matched = stream(["END"], ["an E", "xample EN", "!"])
    assert matched is None and sent == ["an ", "Example ", "EN!", ""]


def test_held_text_goes_out_when_the_reply_ends():
    sent, matched = stream(["###"], ["one #", "#"])
    assert matched is None and sent == ["one ", "", "##"]


def test_the_earliest_stop_wins_and_only_its_prefix_is_held():
    sent, matched = stream(["world", "lo"], ["hello world"])
    assert matched == "lo" and sent == ["hel"]
    s = StopStrings(["abc", "xyz"])
    assert s.push("text ab") == ("text ", None) and s.held == "ab"


def test_nothing_matches_before_min_tokens_but_a_match_may_start_there():
    sent, matched = stream(["STOP"], ["STOP ST", "OP"], check_from=1)
    assert matched == "STOP" and "".join(sent) == "STOP "
