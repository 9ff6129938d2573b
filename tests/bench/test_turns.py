"""context_prompt: a whole templated first message of at most the size asked for."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from bench.turns import FILLER, context_prompt

TEMPLATE = 30  # tokens the chat template adds around a message


class FakeStub:
    """EncodeChat as a template of TEMPLATE tokens around two tokens per word, ending on a marker."""

    def EncodeChat(self, request, timeout=None):  # noqa: N802 - the gRPC method's name
        words = request.messages[0].content.split()
        return SimpleNamespace(token_ids=[1] * (TEMPLATE - 1 + 2 * len(words)) + [99])


@pytest.mark.parametrize("size", [32, 64, 100, 300])
def test_the_prompt_fits_and_keeps_its_end(size):
    ids = context_prompt(FakeStub(), size)
    assert len(ids) <= size and ids[-1] == 99  # never cut inside the template's closing tokens
    assert len(ids) > size - 2 * len(FILLER.split())  # and not much shorter than asked


def test_a_size_under_the_template_gets_the_shortest_whole_message():
    assert len(context_prompt(FakeStub(), 10)) == TEMPLATE + 2
