"""Stores written by earlier littleghost versions (schema 1 all along), as they wrote them:
read, exported, deleted, continued where that can be done, else refused saying why."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from littleghost import Agent
from littleghost.context import Summarization, compact_session
from littleghost.errors import UnstorableValueError
from littleghost.sessions import SQLiteSessionStore
from littleghost.testing import ScriptedModel, text_response

pytestmark = pytest.mark.anyio

FIRST_TABLES = (
    "CREATE TABLE littleghost_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE littleghost_sessions (id TEXT PRIMARY KEY, length INTEGER NOT NULL)",
    "CREATE TABLE littleghost_messages (session_id TEXT NOT NULL, position INTEGER NOT NULL,"
    " body TEXT NOT NULL, PRIMARY KEY (session_id, position)) WITHOUT ROWID",
    "INSERT INTO littleghost_meta VALUES ('format', 'littleghost.sessions'),"
    " ('schema_version', '1')",
)
"""The tables of the first stores (2026-11-30), before messages had times."""


def text(role: str, words: str, id: str) -> dict[str, Any]:
    """A text message as the codec of every version wrote it."""
    return {"id": id, "role": role, "content": [{"type": "text", "text": words}], "metadata": {}}


def first_store(path: Path, sessions: dict[str, list[dict[str, Any]]]) -> None:
    """A store as the first SQLiteSessionStore wrote it, holding ``sessions``."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        for statement in FIRST_TABLES:
            connection.execute(statement)
        for session_id, messages in sessions.items():
            connection.execute(
                "INSERT INTO littleghost_sessions VALUES (?, ?)", (session_id, len(messages))
            )
            connection.executemany(
                "INSERT INTO littleghost_messages VALUES (?, ?, ?)",
                [(session_id, at, json.dumps(body)) for at, body in enumerate(messages)],
            )
    finally:
        connection.close()


class Support(Agent):
    instructions = "Help."


class TestLongSessionIds:
    """Versions before 2026-12-01 stored sessions under ids longer than 256 characters;
    such a session was listed but could be neither read nor deleted."""

    async def test_a_session_stored_under_a_longer_id_is_read_and_deleted(
        self, tmp_path: Path
    ) -> None:
        long = "tenant-" + "x" * 300
        first_store(
            tmp_path / "old.db",
            {long: [text("user", "Where is order 42?", "u1"), text("assistant", "Shipped.", "a1")]},
        )
        async with SQLiteSessionStore(tmp_path / "old.db") as store:
            assert await store.list_sessions() == (long,)
            assert [m.text for m in await store.load(long)] == ["Where is order 42?", "Shipped."]
            page = await store.load_page(long, 1, 5)
            assert [entry.message.id for entry in page.messages] == ["a1"]
            assert page.length == 2
            async with store.lock(long):
                pass
            # continuing it would write to it: refused, saying why, before the model
            model = ScriptedModel([text_response("never asked")])
            with pytest.raises(UnstorableValueError, match="earlier littleghost") as caught:
                await Support(model=model, session_store=store).run("And 7?", session_id=long)
            assert "read, exported and deleted, not continued" in str(caught.value)
            summarizer = ScriptedModel([text_response("never asked")])
            with pytest.raises(UnstorableValueError, match="earlier littleghost"):
                await compact_session(store, long, Summarization(model=summarizer))
            assert model.requests == summarizer.requests == []
            assert len(await store.load(long)) == 2
            await store.delete(long)
            assert await store.list_sessions() == ()
