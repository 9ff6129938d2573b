"""Real clients get their KV back: the official `openai` client against every real service (real
model): stateless history, client system messages, client-named sessions, and whose prefixes
serve whom (a user's own only, a tenant's shared system prompt its users', never another tenant's).

Messages start with a fresh id, so that their first block (the default system prompt and the
message's first tokens) is no block an earlier test of the same user stored."""
from __future__ import annotations

import uuid

import openai
import pytest

from compute_node.chat_template import ChatEncoder
from compute_node.model_loader import load_tokenizer
from compute_node.settings import ComputeSettings

from .conftest import SHARED_PROMPT, USERS, transcript

pytestmark = pytest.mark.slow

MAX_TOKENS = 16
BLOCK = 32  # the compute node's block_tokens: a shared prefix is shared in whole blocks


@pytest.fixture(scope="module")
def encoder() -> ChatEncoder:
    """The model's chat template, as the compute node encodes with it."""
    return ChatEncoder(load_tokenizer(ComputeSettings().model_cache_dir))


def ask(up, user: str, messages: list[dict], session: str | None = None):
    """One non-streamed completion: (reply, cached tokens, prompt tokens, the session it answered with)."""
    client = openai.OpenAI(base_url=f"http://{up.services['frontend']['http']}/v1", api_key=USERS[user],
                           max_retries=0)
    raw = client.chat.completions.with_raw_response.create(
        model="SmolLM2-135M-Instruct", messages=messages, max_tokens=MAX_TOKENS, temperature=0,
        extra_headers={"X-Session-Id": session} if session else {})
    done = raw.parse()
    return (done.choices[0].message.content, done.usage.prompt_tokens_details.cached_tokens,
            done.usage.prompt_tokens, raw.headers["x-session-id"])


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def system(text: str) -> dict:
    return {"role": "system", "content": text}


def unique(text: str) -> str:
    return f"{uuid.uuid4().hex[:8]}: {text}"


def test_resent_history_without_a_session_restores_and_answers_as_the_session_does(triggered):
    questions = [unique("Name three fruits."), "Which of them is the sweetest?", "And the sourest?"]
    stateless, messages = [], []
    for q in questions:  # alice resends the whole history each time, with no header
        messages.append(user(q))
        reply, cached, prompt, _ = ask(triggered, "alice", messages)
        stateless.append((reply, cached, prompt))
        messages.append({"role": "assistant", "content": reply})
    assert stateless[0][1] == 0
    for reply, cached, prompt in stateless[1:]:
        assert 0 < cached < prompt  # the earlier turns' KV came back from storage
    # the same conversation on the X-Session-Id path, new messages only (demo: nothing of alice's is his)
    session, by_session = None, []
    for q in questions:
        reply, cached, _, session = ask(triggered, "demo", [user(q)], session)
        by_session.append((reply, cached > 0))
    assert by_session == [(reply, cached > 0) for reply, cached, _ in stateless]


def test_a_client_system_message_is_the_conversations(triggered, encoder):
    pirate, question = "You are a pirate. Answer like one.", unique("Where is the treasure?")
    reply, _, prompt, _ = ask(triggered, "alice", [system(pirate), user(question)])
    assert prompt == len(encoder.encode([system(pirate), user(question)])) and reply
    default = ask(triggered, "alice", [user(question)])[2]  # none sent: the template's own system prompt
    assert default == len(encoder.encode([user(question)])) != prompt


def test_a_client_chosen_session_is_its_users_alone(triggered):
    session, first = f"my-chat-{uuid.uuid4().hex[:8]}", unique("Tell me a fact about owls.")
    _, _, _, answered = ask(triggered, "alice", [user(first)], session)
    assert answered == session  # started on first sight, under the client's id
    _, cached, _, _ = ask(triggered, "alice", [user("And one about bats?")], session)
    assert cached > 0  # her context goes on with its KV
    # bob names the same session with alice's first message: a context of his own, nothing of hers
    _, cached, _, answered = ask(triggered, "bob", [user(first)], session)
    assert answered == session and cached == 0
    assert [t.user_message for t in transcript(triggered.frontend, "bob", session).turns] == [first]
    assert [t.user_message for t in transcript(triggered.frontend, "alice", session).turns] == \
        [first, "And one about bats?"]


def test_another_users_exact_history_is_cached_only_within_a_shared_prefix(triggered, encoder):
    shared_blocks = len(encoder.encode([system(SHARED_PROMPT)], add_generation_prompt=False)) // BLOCK
    assert shared_blocks >= 2
    # the default tenant marked nothing shared: demo resending alice's exact history gets none of her KV
    history = [system(SHARED_PROMPT), user(unique("When do you open?"))]
    reply = ask(triggered, "alice", history)[0]
    history += [{"role": "assistant", "content": reply}, user("And on Sundays?")]
    assert ask(triggered, "alice", history)[1] > 0  # hers: restored
    assert ask(triggered, "demo", history)[1] == 0
    # team-c marked the prompt shared: dave gets carol's KV of it, and only of it
    history = [system(SHARED_PROMPT), user(unique("Do you sell rye bread?"))]
    reply = ask(triggered, "carol", history)[0]
    history += [{"role": "assistant", "content": reply}, user("Is it vegan?")]
    _, cached, prompt, _ = ask(triggered, "dave", history)
    assert cached == shared_blocks * BLOCK < prompt  # the shared blocks, none of carol's own
    assert ask(triggered, "carol", history)[1] > cached  # carol: the shared blocks and her own


def test_one_tenant_never_reaches_another_tenants_shared_prefix(triggered):
    history = [system(SHARED_PROMPT), user(unique("Are there nuts in the brownies?"))]
    ask(triggered, "carol", history)
    assert ask(triggered, "dave", history)[1] > 0  # team-c's shared blocks
    # team-b marked the same prompt shared: its first turn with it finds none of team-c's blocks,
    # its next (another question) finds team-b's own
    assert ask(triggered, "bob", history)[1] == 0
    assert ask(triggered, "bob", [system(SHARED_PROMPT), user(unique("Any gluten-free cakes?"))])[1] > 0
