import os
import sqlite3
import stat

import pytest

from chat_frontend.store import SessionStore, StoreConflict, TurnRow, pack_ids, unpack_ids


def row(n: int) -> TurnRow:
    return TurnRow(n, f"question {n} °C", f"answer {n}", (1, 2, n), (70000 + n, 2), b"\x01summary")


def test_ids_round_trip():
    ids = (0, 1, 49151, 2**32 - 1)
    assert unpack_ids(pack_ids(ids)) == ids


def test_turns_survive_reopening(tmp_path):
    path = str(tmp_path / "sub" / "db.sqlite3")
    store = SessionStore(path)
    store.add_turns("alice", "c1", [row(1)], [1, 2, 1, 70001, 2], 10.0, "be brief")
    store.add_turns("alice", "c1", [row(2)], [1, 2, 1, 70001, 2, 1, 2, 2, 70002, 2], 11.0)
    store.add_turns("bob", "c2", [row(1)], [5], 12.0)
    store.close()
    store = SessionStore(path)
    ctx = store.get_context("alice", "c1")
    assert (ctx.user_id, ctx.turns, ctx.token_ids) == ("alice", 2, (1, 2, 1, 70001, 2, 1, 2, 2, 70002, 2))
    assert (ctx.system_prompt, store.get_context("bob", "c2").system_prompt) == ("be brief", None)
    assert store.turns("alice", "c1") == [row(1), row(2)]
    assert store.list_contexts("alice") == ["c1"] and store.list_contexts("bob") == ["c2"]
    assert store.get_context("alice", "nope") is None
    assert store.get_context("bob", "c1") is None and store.turns("bob", "c1") == []  # alice's, not bob's
    assert store.counts() == {"contexts": 2, "turns": 3}


def test_two_users_may_use_one_id(tmp_path):
    store = SessionStore(str(tmp_path / "db"))
    store.add_turns("alice", "same", [row(1), row(2)], [1, 1], 1.0)  # a resent turn and the new one
    store.add_turns("bob", "same", [row(1)], [2], 2.0)
    assert store.get_context("alice", "same").token_ids == (1, 1) and store.get_context("bob", "same").token_ids == (2,)
    assert len(store.turns("alice", "same")) == 2 and len(store.turns("bob", "same")) == 1


@pytest.mark.parametrize("context, user, turn", [("c1", "alice", 3), ("c1", "bob", 2), ("c9", "alice", 2)])
def test_a_turn_must_follow_its_context(tmp_path, context, user, turn):
    store = SessionStore(str(tmp_path / "db"))
    store.add_turns("alice", "c1", [row(1)], [1], 1.0)
    with pytest.raises(StoreConflict):
        store.add_turns(user, context, [row(turn)], [1, 2], 2.0)
    assert store.get_context("alice", "c1").turns == 1 and len(store.turns("alice", "c1")) == 1


V1_SCHEMA = """
CREATE TABLE contexts (context_id TEXT PRIMARY KEY, user_id TEXT NOT NULL, created_unix_s REAL NOT NULL,
    updated_unix_s REAL NOT NULL, turns INTEGER NOT NULL, token_ids BLOB NOT NULL);
CREATE INDEX contexts_by_user ON contexts (user_id, created_unix_s);
CREATE TABLE turns (context_id TEXT NOT NULL REFERENCES contexts (context_id), turn INTEGER NOT NULL,
    user_message TEXT NOT NULL, reply TEXT NOT NULL, prompt_token_ids BLOB NOT NULL,
    reply_token_ids BLOB NOT NULL, summary BLOB NOT NULL, created_unix_s REAL NOT NULL,
    PRIMARY KEY (context_id, turn));
"""


def test_a_database_of_the_first_schema_is_migrated(tmp_path):
    path = str(tmp_path / "db")
    db = sqlite3.connect(path)
    db.executescript(V1_SCHEMA)
    db.execute("INSERT INTO contexts VALUES ('ctx-1', 'alice', 1.0, 2.0, 1, ?)", (pack_ids([1, 2, 3]),))
    db.execute("INSERT INTO turns VALUES ('ctx-1', 1, 'q', 'a', ?, ?, x'01', 2.0)", (pack_ids([1]), pack_ids([2])))
    db.commit()
    db.close()
    store = SessionStore(path)
    ctx = store.get_context("alice", "ctx-1")
    assert (ctx.turns, ctx.token_ids, ctx.system_prompt) == (1, (1, 2, 3), None)
    assert store.turns("alice", "ctx-1") == [TurnRow(1, "q", "a", (1,), (2,), b"\x01")]
    store.add_turns("alice", "ctx-1", [row(2)], [1, 2, 3, 4], 3.0)
    store.close()
    store = SessionStore(path)  # opened again: nothing left to migrate
    assert store.get_context("alice", "ctx-1").turns == 2 and store.list_contexts("alice") == ["ctx-1"]


def test_a_transcript_finds_the_users_latest_context_holding_it(tmp_path):
    store = SessionStore(str(tmp_path / "db"))
    store.add_turns("alice", "c1", [row(1)], [1, 70001], 1.0, "be brief")
    found, turns = store.find_transcript("alice", "be brief", [("question 1 °C", "answer 1")])
    assert (found.context_id, found.token_ids, turns) == ("c1", (1, 70001), [row(1)])
    store.add_turns("alice", "c2", [row(1), row(2)], [1, 70001, 2, 70002], 2.0, "be brief")  # resent + new
    assert store.find_transcript("alice", "be brief", [("question 1 °C", "answer 1")])[0].context_id == "c1"
    two = [("question 1 °C", "answer 1"), ("question 2 °C", "answer 2")]
    assert store.find_transcript("alice", "be brief", two)[0].context_id == "c2"
    store.add_turns("alice", "c1", [row(2)], [9], 3.0)  # c1 now holds the same two turns, later
    assert store.find_transcript("alice", "be brief", two)[0].context_id == "c1"
    assert store.find_transcript("alice", "be brief", [("question 1 °C", "answer 1")]) is None  # c1 moved on
    assert store.find_transcript("alice", None, two) is None            # another system message
    assert store.find_transcript("bob", "be brief", two) is None        # another user
    assert store.find_transcript("alice", "be brief", [("question 1 °C", "answer 2"), two[1]]) is None


def test_the_database_is_private_whatever_the_umask(tmp_path):
    """Transcripts are the user's words: the directory 0700 and the files 0600, an older run's too."""
    directory = tmp_path / "frontend"
    directory.mkdir(mode=0o755)
    os.chmod(directory, 0o755)
    path = directory / "frontend.sqlite3"
    path.write_bytes(b"")
    os.chmod(path, 0o644)
    old = os.umask(0o022)
    try:
        SessionStore(str(path))
    finally:
        os.umask(old)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for name in ("frontend.sqlite3", "frontend.sqlite3-wal", "frontend.sqlite3-shm"):
        if (directory / name).exists():
            assert stat.S_IMODE((directory / name).stat().st_mode) == 0o600, name
