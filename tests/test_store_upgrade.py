"""Stores written by earlier littleghost versions (schema 1 all along), as they wrote them:
read, exported, deleted, continued where that can be done, else refused saying why."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from littleghost import Agent, Message
from littleghost.context import Summarization, compact_session
from littleghost.errors import CorruptSessionStoreError, SessionStoreError, UnstorableValueError
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


def nested(levels: int) -> dict[str, Any]:
    """A dict nesting ``levels`` dicts in all."""
    value: dict[str, Any] = {"order_id": "42"}
    for _ in range(levels - 1):
        value = {"k": value}
    return value


class TestDeepValues:
    """Versions before 2026-12-01 stored tool-call arguments and metadata nested deeper
    than ``MAX_DEPTH`` (100) levels; such a session could not be read at all."""

    @pytest.mark.parametrize("levels", [150, 900])
    async def test_deeper_arguments_are_read_as_their_text(
        self, tmp_path: Path, levels: int
    ) -> None:
        """Those versions stored arguments up to about 990 levels deep (Python 3.11's
        recursion limit); the decoder's own recursion stopped near 450 there."""
        arguments = nested(levels)
        call = {"type": "tool_call", "id": "c1", "name": "lookup", "arguments": arguments}
        result = {"type": "tool_result", "call_id": "c1", "content": "shipped", "is_error": False}
        first_store(
            tmp_path / "old.db",
            {
                "s": [
                    text("user", "Where is order 42?", "u1"),
                    {"id": "a1", "role": "assistant", "content": [call], "metadata": {}},
                    {"id": "t1", "role": "tool", "content": [result], "metadata": {}},
                    text("assistant", "Shipped.", "a2"),
                ]
            },
        )
        async with SQLiteSessionStore(tmp_path / "old.db") as store:
            log = await store.load("s")
            (stored,) = log[1].tool_calls
            # as a call made now holds arguments nested so deep: their whole text
            assert isinstance(stored.arguments, str)
            assert json.loads(stored.arguments) == arguments
            model = ScriptedModel([text_response("7 shipped too.")])
            result_ = await Support(model=model, session_store=store).run("And 7?", session_id="s")
            assert result_.output == "7 shipped too."
            assert [m.id for m in model.requests[0].messages[1:5]] == ["u1", "a1", "t1", "a2"]
            assert len(await store.load("s")) == 6

    async def test_deeper_metadata_is_refused_naming_the_cause(self, tmp_path: Path) -> None:
        message = text("user", "Where is order 42?", "u1")
        first_store(tmp_path / "old.db", {"s": [{**message, "metadata": {"trace": nested(150)}}]})
        async with SQLiteSessionStore(tmp_path / "old.db") as store:
            with pytest.raises(CorruptSessionStoreError) as caught:
                await store.load("s")
        assert str(caught.value).endswith(
            "message at position 0: a stored message cannot be read: its 'metadata' is "
            "nested more than 100 levels deep (littleghost before 2026-12-01 stored such "
            "values; this one reads no deeper)"
        )


class TestNewerTables:
    """Tables of a newer littleghost (or changed by hand) that kept schema_version 1."""

    async def test_a_constraint_the_writes_do_not_meet_is_named(self, tmp_path: Path) -> None:
        connection = sqlite3.connect(tmp_path / "newer.db", isolation_level=None)
        for statement in (
            *FIRST_TABLES[:2],
            "CREATE TABLE littleghost_messages (session_id TEXT NOT NULL, position INTEGER NOT"
            " NULL, body TEXT NOT NULL, stored_at REAL, digest BLOB NOT NULL,"
            " PRIMARY KEY (session_id, position)) WITHOUT ROWID",
            FIRST_TABLES[3],
        ):
            connection.execute(statement)
        connection.close()
        model = ScriptedModel([text_response("never asked")])
        async with SQLiteSessionStore(tmp_path / "newer.db") as store:
            with pytest.raises(SessionStoreError) as caught:
                await Support(model=model, session_store=store).run("Hi", session_id="s")
            assert await store.list_sessions() == ()
        # it said the session's length disagreed with its messages, some stored past it
        assert type(caught.value) is SessionStoreError
        assert str(caught.value).endswith(
            "session 's': its tables have a constraint this littleghost's writes do not meet "
            "(NOT NULL constraint failed: littleghost_messages.digest): tables of a newer "
            "littleghost that kept schema_version 1, or changed by hand; nothing was written"
        )
        assert model.requests == []

    async def test_a_message_stored_past_the_length_is_still_damage(self, tmp_path: Path) -> None:
        first_store(tmp_path / "old.db", {"s": [text("user", "Hi", "u1")]})
        connection = sqlite3.connect(tmp_path / "old.db", isolation_level=None)
        connection.execute(
            "INSERT INTO littleghost_messages VALUES ('s', 1, ?)",
            (json.dumps(text("assistant", "Hello", "a1")),),
        )
        connection.close()
        async with SQLiteSessionStore(tmp_path / "old.db") as store:
            with pytest.raises(CorruptSessionStoreError, match="some are stored past it"):
                await store.append("s", [Message.user("Again")])

    @pytest.mark.parametrize(
        ("field", "value", "named"),
        [
            ("role", "critic", "its 'role' is one"),
            (
                "metadata",
                {"trace": {"$set": [1, 2]}},
                "its 'metadata' holds an object with a $ tag",
            ),
        ],
    )
    async def test_a_name_not_known_may_be_a_newer_littleghost_s(
        self, tmp_path: Path, field: str, value: object, named: str
    ) -> None:
        """A role or a ``$`` tag this littleghost does not know (as a newer one might
        write) says so, as an unknown part type does; it said only that it was unknown."""
        first_store(tmp_path / "newer.db", {"s": [{**text("user", "Hi", "u1"), field: value}]})
        async with SQLiteSessionStore(tmp_path / "newer.db") as store:
            with pytest.raises(CorruptSessionStoreError) as caught:
                await store.load("s")
        assert str(caught.value).endswith(
            f"{named} this littleghost does not know: written by a newer littleghost "
            "(upgrade littleghost to read it), or damaged"
        )

    async def test_a_role_not_a_string_is_damage_alone(self, tmp_path: Path) -> None:
        """No littleghost writes a role that is not a string: it is not blamed on a newer
        one, as a role not known is."""
        first_store(tmp_path / "damaged.db", {"s": [{**text("user", "Hi", "u1"), "role": 5}]})
        async with SQLiteSessionStore(tmp_path / "damaged.db") as store:
            with pytest.raises(CorruptSessionStoreError) as caught:
                await store.load("s")
        assert str(caught.value).endswith(
            "message at position 0: a stored message cannot be read: its 'role' is not a string"
        )
