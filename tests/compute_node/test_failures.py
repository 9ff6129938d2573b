"""Fallback, never a wrong answer: corrupted chunks and a stopped or killed storage node give recomputed (or
partly restored) turns with the reply the KV's never leaving gives."""
from __future__ import annotations

import mmap
import threading
import time
import uuid

import pytest

from fabric import chunk_format as cf
from kvtb_proto import compute_pb2
from tests.compute_node.conftest import Chat, start_cluster, stop_cluster

pytestmark = [pytest.mark.service, pytest.mark.slow]

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


LONG = ["Write three sentences about bread: how it is made, how it is baked and how it is eaten.",
        "Now say the same about butter."]


def _block_value(cluster, context: str, index: int) -> tuple[int, cf.ValueLayout]:
    """(offset in the namespace file, layout) of the stored value of the context's block `index`."""
    path = cluster.data_dir / "fail-s0" / "ns1.data"
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        at = m.find(cf.MAGIC)
        while at >= 0:
            try:
                header, n = cf.decode_header(m[at:at + cf.MAX_HEADER_BYTES])
            except cf.ChunkFormatError:
                header = None
            if header is not None and (header.context_id, header.chunk_index) == (context, index):
                return at, cf.value_layout(header, n)
            at = m.find(cf.MAGIC, at + 1)
    raise AssertionError(f"block {index} of {context} is not in the namespace file")


def _follow_up(chat, first, messages) -> list[int]:
    return chat.encode(messages[0]) + list(first.output_token_ids) + chat.encode(messages[1], first)


def test_a_block_corrupted_on_disk_keeps_the_blocks_before_it_and_the_reply(failing):
    context = f"partial-{uuid.uuid4().hex[:8]}"
    reference = Chat(failing.agent_address, user="reference")  # another user: nothing shared with alice's KV
    expected = [text for text, _ in reference.conversation(LONG, f"ref-{context}", "resident", n=64)]
    chat = Chat(failing.agent_address)
    (text1, first), = chat.conversation(LONG[:1], context, n=64)
    assert first.chunks_offloaded >= 4
    at, layout = _block_value(failing, context, 2)
    with open(failing.data_dir / "fail-s0" / "ns1.data", "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        m[at + layout.length - 100] ^= 0xFF  # a byte of its last layer: the last layer group fails its MAC
        m.flush()
    ids = _follow_up(chat, first, LONG)
    text2, second = chat.turn(ids, context, n=64)
    assert second.kv_source == "partial" and second.blocks_restored == 2, (second.kv_source, second.fallback_reason)
    assert second.tokens_reused == 2 * 32 and "block 2" in second.fallback_reason
    assert [text1, text2] == expected
    reference.close()
    chat.close()


def test_a_storage_node_killed_mid_restore_falls_back_within_a_bounded_time(failing):
    context = f"killed-{uuid.uuid4().hex[:8]}"
    reference = Chat(failing.agent_address, user="reference")
    expected = [text for text, _ in reference.conversation(MESSAGES, f"ref-{context}", "resident")]
    chat = Chat(failing.agent_address)
    (text1, first), = chat.conversation(MESSAGES[:1], context)
    ids = _follow_up(chat, first, MESSAGES)
    storage = failing.storage
    addresses = dict(storage.addresses)
    storage.pause()  # the restore's GETs go unanswered...
    out = {}
    turn = threading.Thread(target=lambda: out.update(reply=chat.turn(ids, context)))
    start = time.monotonic()
    turn.start()
    deadline = start + 60
    while chat.stub.Stats(compute_pb2.ComputeStatsRequest()).num_requests_restoring == 0:
        assert time.monotonic() < deadline, "the follow-up never started restoring"
        time.sleep(0.01)
    storage.kill()  # ... and the node dies under them
    turn.join(60)
    elapsed = time.monotonic() - start
    text2, second = out["reply"]
    assert second.kv_source in ("recomputed", "partial") and second.fallback_reason, second
    assert elapsed < 20 and [text1, text2] == expected
    # the node comes back where it was (the next tests need it); the agent reconnects
    storage.env.update({"KVTB_STORAGE_ADMIN_ADDRESS": addresses["admin"],
                        "KVTB_STORAGE_FABRIC_ADDRESS": addresses["fabric"]})
    storage.start(timeout_s=120)
    time.sleep(2)
    reference.close()
    chat.close()


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
