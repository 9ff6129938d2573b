"""Fallback, never a wrong answer: corrupted chunks and a stopped storage node give recomputed turns."""
from __future__ import annotations

import mmap
import uuid

import pytest

from tests.compute_node.conftest import Chat, start_cluster, stop_cluster

pytestmark = pytest.mark.slow

MESSAGES = ["Write one sentence about bread.", "And one about butter."]


@pytest.fixture(scope="module")
def failing(tmp_path_factory):
    cluster = start_cluster(tmp_path_factory.mktemp("failing"), "fail")
    yield cluster
    stop_cluster(cluster)


def _corrupt(cluster, context: str) -> None:
    """Flip bytes inside the KV of the context's first stored chunk, in the namespace file."""
    path = cluster.data_dir / "fail-s0" / "ns1.data"
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        at = m.find(context.encode())
        assert at >= 0, "the chunk is not in the namespace file"
        for i in range(at + 4000, at + 4016):
            m[i] ^= 0xFF
        m.flush()


def test_a_corrupted_chunk_gives_a_recomputed_turn_with_the_same_reply(failing):
    chat = Chat(failing.agent_address)
    context = f"corrupt-{uuid.uuid4().hex[:8]}"
    reference = [text for text, _ in chat.conversation(MESSAGES, f"ref-{context}", "recompute")]
    (text1, first), = chat.conversation(MESSAGES[:1], context)
    _corrupt(failing, context)
    ids = list(first.output_token_ids)
    ids = chat.encode(MESSAGES[0]) + ids + chat.encode(MESSAGES[1], first)
    text2, second = chat.turn(ids, context)
    assert second.kv_source == "recomputed" and "error" in second.fallback_reason
    assert second.tokens_reused == 0 and second.tokens_prefilled == len(ids)
    assert [text1, text2] == reference


def test_a_storage_node_stopped_between_turns_gives_a_recomputed_turn(failing):
    chat = Chat(failing.agent_address)
    context = f"stopped-{uuid.uuid4().hex[:8]}"
    (text1, first), = chat.conversation(MESSAGES[:1], context)
    assert first.chunks_offloaded > 0
    failing.storage.stop()
    ids = chat.encode(MESSAGES[0]) + list(first.output_token_ids) + chat.encode(MESSAGES[1], first)
    text2, second = chat.turn(ids, context)
    assert second.kv_source == "recomputed" and second.fallback_reason
    assert second.tokens_out > 0 and text2
    # the node goes on serving
    text3, third = chat.turn(chat.encode("Hello!"), f"after-{context}")
    assert third.tokens_out > 0
