"""The paper's chat with the KV pool in bf16: the follow-ups restore their KV from storage and reply as
resident KV of the same dtype does (what is stored is what the pool held, bit for bit)."""
import pytest

from .conftest import assert_restored_as_resident, paper_messages, run_conversation, start_up

pytestmark = [pytest.mark.service, pytest.mark.slow]


def test_a_bf16_pool_restores_and_replies_as_resident_bf16(tmp_path_factory):
    replies = {}
    for policy in ("triggered", "resident"):
        up = start_up(tmp_path_factory, policy, compute={"kv_dtype": "bfloat16"})
        try:
            client = up.client("alice")
            replies[policy] = run_conversation(client, paper_messages())
            client.close()
        finally:
            up.stop()
    assert_restored_as_resident(replies)
