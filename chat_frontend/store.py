"""Sessions and transcripts in SQLite, so that a frontend restart loses no conversation.

Contexts are keyed by (user, context id): an id names a context of its user only, so two users
may choose the same id and never meet. A context row holds the conversation's token ids as the
model saw them (prompt ids from the chat template, reply ids as generated, never re-tokenised);
a turn row holds one exchange as text and as token ids, with the turn's summary (serialized bytes;
this module does not parse them). A turn is written in one transaction with its context, after the
turn completed, together with the earlier turns a client resent when it started the context.

Each context is also indexed by its transcript (a hash chain over its system message and each
turn's user message and reply, as text): a client that resends a conversation this frontend served
finds the context holding its ids as the model generated them (`find_transcript`).
"""
from __future__ import annotations

import array
import dataclasses
import hashlib
import os
import sqlite3
import sys
import threading
from typing import Sequence

from kvtb.private import FILE_MODE, data_dir

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS contexts (
        user_id TEXT NOT NULL,
        context_id TEXT NOT NULL,       -- minted by the frontend or chosen by the client: unique per user
        created_unix_s REAL NOT NULL,
        updated_unix_s REAL NOT NULL,
        turns INTEGER NOT NULL,
        token_ids BLOB NOT NULL,        -- uint32 little endian
        system_prompt TEXT,             -- the system message it started with; NULL: none (the template's)
        transcript_hash BLOB,           -- transcript_hash() of its system message and turns; NULL: unknown
        PRIMARY KEY (user_id, context_id)
    )""",
    "CREATE INDEX IF NOT EXISTS contexts_by_user ON contexts (user_id, created_unix_s)",
    "CREATE INDEX IF NOT EXISTS contexts_by_transcript ON contexts (user_id, transcript_hash)",
    """CREATE TABLE IF NOT EXISTS turns (
        user_id TEXT NOT NULL,
        context_id TEXT NOT NULL,
        turn INTEGER NOT NULL,
        user_message TEXT NOT NULL,
        reply TEXT NOT NULL,
        prompt_token_ids BLOB NOT NULL, -- the ids this turn appended for the user's message
        reply_token_ids BLOB NOT NULL,  -- the reply's ids as generated
        summary BLOB NOT NULL,          -- empty: a turn the client resent, not served here
        created_unix_s REAL NOT NULL,
        PRIMARY KEY (user_id, context_id, turn),
        FOREIGN KEY (user_id, context_id) REFERENCES contexts (user_id, context_id)
    )""",
)
SCHEMA_VERSION = 2
# Version 1 keyed contexts by context_id alone (every id was minted here); its rows move over as is.
MIGRATE_V1 = (
    "DROP INDEX IF EXISTS contexts_by_user",
    "ALTER TABLE turns RENAME TO turns_v1",
    "ALTER TABLE contexts RENAME TO contexts_v1",
    *SCHEMA,
    ("INSERT INTO contexts (user_id, context_id, created_unix_s, updated_unix_s, turns, token_ids, "
     "system_prompt) SELECT user_id, context_id, created_unix_s, updated_unix_s, turns, token_ids, NULL "
     "FROM contexts_v1"),
    ("INSERT INTO turns (user_id, context_id, turn, user_message, reply, prompt_token_ids, "
     "reply_token_ids, summary, created_unix_s) SELECT c.user_id, t.context_id, t.turn, t.user_message, "
     "t.reply, t.prompt_token_ids, t.reply_token_ids, t.summary, t.created_unix_s "
     "FROM turns_v1 t JOIN contexts_v1 c ON c.context_id = t.context_id"),
    "DROP TABLE turns_v1",
    "DROP TABLE contexts_v1",
)


def _text_hash(*parts: bytes) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.digest()


def transcript_root(system_prompt: str | None) -> bytes:
    """The transcript hash of a conversation with no turns yet."""
    return _text_hash(b"none" if system_prompt is None else b"system", (system_prompt or "").encode())


def transcript_step(parent: bytes, user_message: str, reply: str) -> bytes:
    """The transcript hash after one more turn."""
    return _text_hash(parent, user_message.encode(), reply.encode())


def transcript_hash(system_prompt: str | None, pairs: Sequence[tuple[str, str]]) -> bytes:
    """blake2b-128 chain over the system message, then each turn's (user message, reply)."""
    digest = transcript_root(system_prompt)
    for user_message, reply in pairs:
        digest = transcript_step(digest, user_message, reply)
    return digest


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
    system_prompt: str | None = None  # None: it started with no system message (the template's)


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
            data_dir(os.path.dirname(os.path.abspath(path)))  # 0700
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._lock = threading.Lock()
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")  # an acknowledged turn survives a crash
            self._transaction(self._create_schema)
        if path != ":memory:":  # the transcripts: 0600, also a database an older run left 0644
            for name in (path, path + "-wal", path + "-shm"):
                if os.path.exists(name):
                    os.chmod(name, FILE_MODE)

    def _transaction(self, work, *args):
        cur = self._db.cursor()
        cur.execute("BEGIN IMMEDIATE")
        try:
            result = work(cur, *args)
            cur.execute("COMMIT")
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        return result

    @staticmethod
    def _create_schema(cur: sqlite3.Cursor) -> None:
        columns = [row[1] for row in cur.execute("PRAGMA table_info(turns)")]
        for statement in MIGRATE_V1 if columns and "user_id" not in columns else SCHEMA:
            cur.execute(statement)
        cur.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def get_context(self, user_id: str, context_id: str) -> Context | None:
        """The user's context, or None when the user has no such context."""
        with self._lock:
            row = self._db.execute(
                "SELECT context_id, user_id, created_unix_s, turns, token_ids, system_prompt FROM contexts "
                "WHERE user_id = ? AND context_id = ?", (user_id, context_id)).fetchone()
        if row is None:
            return None
        return Context(row[0], row[1], row[2], row[3], unpack_ids(row[4]), row[5])

    def find_transcript(self, user_id: str, system_prompt: str | None, pairs: Sequence[tuple[str, str]]
                        ) -> tuple[Context, list[TurnRow]] | None:
        """The user's latest context whose system message and turns are exactly these, with its turns."""
        digest = transcript_hash(system_prompt, pairs)
        with self._lock:  # one read: the context and its turns as of the same turn
            row = self._db.execute(
                "SELECT context_id, user_id, created_unix_s, turns, token_ids, system_prompt FROM contexts "
                "WHERE user_id = ? AND transcript_hash = ? ORDER BY updated_unix_s DESC LIMIT 1",
                (user_id, digest)).fetchone()
            turns = [] if row is None else self._turns(user_id, row[0])
        if row is None:
            return None
        if row[5] != system_prompt or [(t.user_message, t.reply) for t in turns] != list(pairs):
            return None  # not this transcript after all
        return Context(row[0], row[1], row[2], row[3], unpack_ids(row[4]), row[5]), turns

    def list_contexts(self, user_id: str) -> list[str]:
        """The user's context ids, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT context_id FROM contexts WHERE user_id = ? ORDER BY created_unix_s, "
                "context_id", (user_id,)).fetchall()
        return [r[0] for r in rows]

    def turns(self, user_id: str, context_id: str) -> list[TurnRow]:
        """The user's context's turns in order."""
        with self._lock:
            return self._turns(user_id, context_id)

    def _turns(self, user_id: str, context_id: str) -> list[TurnRow]:
        rows = self._db.execute(
            "SELECT turn, user_message, reply, prompt_token_ids, reply_token_ids, summary "
            "FROM turns WHERE user_id = ? AND context_id = ? ORDER BY turn", (user_id, context_id)).fetchall()
        return [TurnRow(r[0], r[1], r[2], unpack_ids(r[3]), unpack_ids(r[4]), bytes(r[5])) for r in rows]

    def counts(self) -> dict[str, int]:
        """How many contexts and turns are stored."""
        with self._lock:
            contexts = self._db.execute("SELECT COUNT(*) FROM contexts").fetchone()[0]
            turns = self._db.execute("SELECT COUNT(*) FROM turns").fetchone()[0]
        return {"contexts": contexts, "turns": turns}

    def add_turns(self, user_id: str, context_id: str, turns: Sequence[TurnRow], token_ids: Sequence[int],
                  now_unix_s: float, system_prompt: str | None = None) -> None:
        """Record completed turns (numbered on from the context's last; turn 1 starts it, with its
        system message) and the conversation's token ids after them, atomically."""
        if not turns or any(t.turn != turns[0].turn + i for i, t in enumerate(turns)):
            raise ValueError(f"turns to add must be numbered one after the other, got "
                             f"{[t.turn for t in turns]}")
        with self._lock:
            self._transaction(self._add_turns, user_id, context_id, turns, token_ids, now_unix_s,
                              system_prompt)

    @staticmethod
    def _add_turns(cur: sqlite3.Cursor, user_id: str, context_id: str, turns: Sequence[TurnRow],
                   token_ids: Sequence[int], now_unix_s: float, system_prompt: str | None) -> None:
        first = turns[0].turn
        row = cur.execute("SELECT turns, transcript_hash FROM contexts WHERE user_id = ? AND context_id = ?",
                          (user_id, context_id)).fetchone()
        if row is None and first == 1:
            digest = transcript_root(system_prompt)
            cur.execute("INSERT INTO contexts VALUES (?, ?, ?, ?, 0, ?, ?, ?)",
                        (user_id, context_id, now_unix_s, now_unix_s, b"", system_prompt, digest))
        elif row is None or row[0] != first - 1:
            raise StoreConflict(f"context {context_id} of {user_id} is not at turn {first - 1}")
        else:
            digest = row[1]
        cur.executemany("INSERT INTO turns VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                        [(user_id, context_id, t.turn, t.user_message, t.reply, pack_ids(t.prompt_token_ids),
                          pack_ids(t.reply_token_ids), t.summary, now_unix_s) for t in turns])
        for t in turns:
            digest = None if digest is None else transcript_step(digest, t.user_message, t.reply)
        cur.execute("UPDATE contexts SET turns = ?, token_ids = ?, updated_unix_s = ?, transcript_hash = ? "
                    "WHERE user_id = ? AND context_id = ?",
                    (turns[-1].turn, pack_ids(token_ids), now_unix_s, digest, user_id, context_id))
