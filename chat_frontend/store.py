"""Sessions and transcripts in SQLite, so that a frontend restart loses no conversation.

A context row holds the conversation's token ids as the model saw them (prompt ids from the
chat template, reply ids as generated, never re-tokenised); a turn row holds one exchange as
text and as token ids, with the turn's summary (serialized bytes; this module does not parse
them). A turn is written in one transaction with its context, after the turn completed.
"""
from __future__ import annotations

import array
import dataclasses
import os
import sqlite3
import sys
import threading
from typing import Sequence

SCHEMA = """
CREATE TABLE IF NOT EXISTS contexts (
    context_id TEXT PRIMARY KEY,
    user_id TEXT NOT NULL,
    created_unix_s REAL NOT NULL,
    updated_unix_s REAL NOT NULL,
    turns INTEGER NOT NULL,
    token_ids BLOB NOT NULL          -- uint32 little endian
);
CREATE INDEX IF NOT EXISTS contexts_by_user ON contexts (user_id, created_unix_s);
CREATE TABLE IF NOT EXISTS turns (
    context_id TEXT NOT NULL REFERENCES contexts (context_id),
    turn INTEGER NOT NULL,
    user_message TEXT NOT NULL,
    reply TEXT NOT NULL,
    prompt_token_ids BLOB NOT NULL,  -- the ids this turn appended for the user's message
    reply_token_ids BLOB NOT NULL,   -- the reply's ids as generated
    summary BLOB NOT NULL,
    created_unix_s REAL NOT NULL,
    PRIMARY KEY (context_id, turn)
);
"""


def pack_ids(ids: Sequence[int]) -> bytes:
    """uint32 little-endian bytes of token ids."""
    packed = array.array("I", ids)
    if sys.byteorder == "big":
        packed.byteswap()
    return packed.tobytes()


def unpack_ids(blob: bytes) -> tuple[int, ...]:
    """Token ids from pack_ids bytes."""
    packed = array.array("I")
    packed.frombytes(blob)
    if sys.byteorder == "big":
        packed.byteswap()
    return tuple(packed)


@dataclasses.dataclass(frozen=True)
class Context:
    context_id: str
    user_id: str
    created_unix_s: float
    turns: int
    token_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TurnRow:
    turn: int
    user_message: str
    reply: str
    prompt_token_ids: tuple[int, ...]
    reply_token_ids: tuple[int, ...]
    summary: bytes


class StoreConflict(RuntimeError):
    """A turn was written on top of a context that changed meanwhile."""


class SessionStore:
    """The frontend's SQLite database. Thread-safe: one connection behind a lock."""

    def __init__(self, path: str):
        if path != ":memory:":
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # an acknowledged turn survives a crash
            self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def get_context(self, context_id: str) -> Context | None:
        """The context, or None when there is no such context."""
        with self._lock:
            row = self._db.execute(
                "SELECT context_id, user_id, created_unix_s, turns, token_ids FROM contexts "
                "WHERE context_id = ?", (context_id,)).fetchone()
        if row is None:
            return None
        return Context(row[0], row[1], row[2], row[3], unpack_ids(row[4]))

    def list_contexts(self, user_id: str) -> list[str]:
        """The user's context ids, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT context_id FROM contexts WHERE user_id = ? ORDER BY created_unix_s, "
                "context_id", (user_id,)).fetchall()
        return [r[0] for r in rows]

    def turns(self, context_id: str) -> list[TurnRow]:
        """The context's turns in order."""
        with self._lock:
            rows = self._db.execute(
                "SELECT turn, user_message, reply, prompt_token_ids, reply_token_ids, summary "
                "FROM turns WHERE context_id = ? ORDER BY turn", (context_id,)).fetchall()
        return [TurnRow(r[0], r[1], r[2], unpack_ids(r[3]), unpack_ids(r[4]), bytes(r[5]))
                for r in rows]

    def counts(self) -> dict[str, int]:
        """How many contexts and turns are stored."""
        with self._lock:
            contexts = self._db.execute("SELECT COUNT(*) FROM contexts").fetchone()[0]
            turns = self._db.execute("SELECT COUNT(*) FROM turns").fetchone()[0]
        return {"contexts": contexts, "turns": turns}

    def add_turn(self, context_id: str, user_id: str, turn: TurnRow,
                 token_ids: Sequence[int], now_unix_s: float) -> None:
        """Record a completed turn and the conversation's token ids after it (atomically)."""
        with self._lock:
            cur = self._db.cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                row = cur.execute("SELECT user_id, turns FROM contexts WHERE context_id = ?",
                                  (context_id,)).fetchone()
                if row is None and turn.turn == 1:
                    cur.execute("INSERT INTO contexts VALUES (?, ?, ?, ?, 0, ?)",
                                (context_id, user_id, now_unix_s, now_unix_s, b""))
                elif row is None or row[0] != user_id or row[1] != turn.turn - 1:
                    raise StoreConflict(f"context {context_id} is not at turn {turn.turn - 1}")
                cur.execute("INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                            (context_id, turn.turn, turn.user_message, turn.reply,
                             pack_ids(turn.prompt_token_ids), pack_ids(turn.reply_token_ids),
                             turn.summary, now_unix_s))
                cur.execute("UPDATE contexts SET turns = ?, token_ids = ?, updated_unix_s = ? "
                            "WHERE context_id = ?",
                            (turn.turn, pack_ids(token_ids), now_unix_s, context_id))
                cur.execute("COMMIT")
            except BaseException:
                cur.execute("ROLLBACK")
                raise
