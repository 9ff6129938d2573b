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
    store.add_turn("c1", "alice", row(1), [1, 2, 1, 70001, 2], 10.0)
    store.add_turn("c1", "alice", row(2), [1, 2, 1, 70001, 2, 1, 2, 2, 70002, 2], 11.0)
    store.add_turn("c2", "bob", row(1), [5], 12.0)
    store.close()
    store = SessionStore(path)
    ctx = store.get_context("c1")
    assert (ctx.user_id, ctx.turns, ctx.token_ids) == ("alice", 2, (1, 2, 1, 70001, 2, 1, 2, 2, 70002, 2))
    assert store.turns("c1") == [row(1), row(2)]
    assert store.list_contexts("alice") == ["c1"] and store.list_contexts("bob") == ["c2"]
    assert store.get_context("nope") is None
    assert store.counts() == {"contexts": 2, "turns": 3}


@pytest.mark.parametrize("context, user, turn", [("c1", "alice", 3), ("c1", "bob", 2), ("c9", "alice", 2)])
def test_a_turn_must_follow_its_context(tmp_path, context, user, turn):
    store = SessionStore(str(tmp_path / "db"))
    store.add_turn("c1", "alice", row(1), [1], 1.0)
    with pytest.raises(StoreConflict):
        store.add_turn(context, user, row(turn), [1, 2], 2.0)
    assert store.get_context("c1").turns == 1 and len(store.turns("c1")) == 1
