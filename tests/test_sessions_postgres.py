"""PostgresSessionStore against a real server: schema, workers, advisory locks, kills.

The server is the one ``LITTLEGHOST_TEST_POSTGRES_DSN`` names, else a throwaway one the
test session starts (fixture ``postgres_dsn``). Each test gets its own PostgreSQL schema.
Several store instances stand for several worker processes: they share nothing but the
database.
"""

from __future__ import annotations

import functools
import random
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from littleghost import Agent, Message, tool
from littleghost.errors import (
    ConfigurationError,
    CorruptSessionStoreError,
    DeadlineExceededError,
    SchemaVersionError,
    SessionStoreError,
)
from littleghost.sessions import PostgresSessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

from .stores import postgres_schema

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


async def sql(conninfo: str, statement: str) -> list[tuple[object, ...]]:
    return await anyio.to_thread.run_sync(query, conninfo, statement)


async def open_connections(conninfo: str) -> int:
    """Connections of the stores under test (the query's own excluded), once the server
    has seen closed ones go (a backend exits shortly after its client leaves)."""
    count = -1
    for _ in range(50):
        rows = await sql(
            conninfo,
            "SELECT count(*) FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND "
            "application_name = current_setting('application_name')",
        )
        count = int(rows[0][0])  # type: ignore[call-overload]
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


class TestSchema:
    async def test_tables_are_made_on_first_use_with_a_version(self, conninfo: str) -> None:
        async with PostgresSessionStore(conninfo) as store:
            assert await store.list_sessions() == ()
        rows = await sql(conninfo, "SELECT key, value FROM littleghost_meta ORDER BY key")
        assert rows == [("format", "littleghost.sessions"), ("schema_version", "1")]

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
        with pytest.raises(ConfigurationError, match="conninfo"):
            PostgresSessionStore(b"dbname=x")  # type: ignore[arg-type]


class TestWorkers:
    @pytest.mark.parametrize("workers", [1, 5])
    async def test_fifty_runs_on_fifty_sessions_keep_their_own_messages(
        self, conninfo: str, workers: int
    ) -> None:
        stores = [PostgresSessionStore(conninfo) for _ in range(workers)]
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

    async def test_runs_of_one_session_on_two_workers_serialize(self, conninfo: str) -> None:
        first, second = PostgresSessionStore(conninfo), PostgresSessionStore(conninfo)
        in_tool = anyio.Event()
        release = anyio.Event()

        class Slow(Agent):
            @tool
            async def work(self) -> str:
                """Work until released."""
                in_tool.set()
                await release.wait()
                return "worked"

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
        holder, waiter = PostgresSessionStore(conninfo), PostgresSessionStore(conninfo)
        model = ScriptedModel([text_response("never")])
        async with holder.lock("s"):
            started = anyio.current_time()
            with pytest.raises(DeadlineExceededError):
                await Noter(model=model, session_store=waiter).run(
                    "waiting", session_id="s", timeout=0.2
                )
            assert anyio.current_time() - started < 3
        assert model.requests == []
        assert await waiter.load("s") == ()
        with anyio.fail_after(5):
            async with waiter.lock("s"):
                pass
        await holder.aclose()
        await waiter.aclose()
        assert await open_connections(conninfo) == 0


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
