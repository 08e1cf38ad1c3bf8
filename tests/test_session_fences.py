"""A run writes only to the log it loaded: a built-in store refuses an append of the
session's holder once the session changed under it (deleted, or written by a run that
took the session when the holder's lock was lost), and writes nothing.

Checked against each built-in store (in memory, SQLite, PostgreSQL).
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import anyio
import pytest

from littleghost import Agent, Message, Role, tool
from littleghost.errors import SessionStoreError
from littleghost.sessions import SessionStore, SQLiteSessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

from .stores import KINDS, open_store

pytestmark = pytest.mark.anyio


@pytest.fixture(params=KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    async with open_store(request.param, tmp_path, request) as opened:
        yield opened


def roles(messages: tuple[Message, ...]) -> list[Role]:
    return [message.role for message in messages]


async def run_meanwhile(
    store: SessionStore, meanwhile: Callable[[], Awaitable[object]]
) -> SessionStoreError | None:
    """Run a turn whose tool waits while ``meanwhile()`` runs in a task that does not hold
    the session (another worker, a retention job); what the run raised, if it did."""
    started, done = anyio.Event(), anyio.Event()

    class Looker(Agent):
        session_store = store

        @tool
        async def lookup(self, order_id: str) -> str:
            """Find an order."""
            started.set()
            await done.wait()
            return f"order {order_id}: shipped"

    async def elsewhere() -> None:
        await started.wait()
        await meanwhile()
        done.set()

    model = ScriptedModel(
        [tool_call_response("lookup", {"order_id": "42"}, call_id="call-1"), text_response("ok")]
    )
    async with anyio.create_task_group() as group:
        group.start_soon(elsewhere)  # started before the run: it does not hold the session
        try:
            await Looker(model=model).run("where is 42?", session_id="s")
        except SessionStoreError as error:
            return error
    return None


class TestDelete:
    async def test_a_session_deleted_during_its_run_stays_deleted(
        self, store: SessionStore
    ) -> None:
        failure = await run_meanwhile(store, lambda: store.delete("s"))
        assert isinstance(failure, SessionStoreError)
        assert "changed under the run" in str(failure)
        assert "no longer exists" in str(failure)
        assert await store.load("s") == ()
        assert "s" not in await store.list_sessions()

    async def test_a_session_deleted_and_written_anew_to_the_same_length_is_not_written(
        self, store: SessionStore
    ) -> None:
        """Deleted during the run, then written anew by another (a new conversation under
        the same id) to as many messages as the holder last saw: the holder's appends
        went on, so the new conversation got the old run's tool result (a result whose
        call it does not hold) and its answer. They are refused, nothing written."""

        async def anew() -> None:
            await store.delete("s")
            await store.append("s", [Message.user("a new conversation"), Message.assistant("hi")])

        failure = await run_meanwhile(store, anew)
        assert isinstance(failure, SessionStoreError)
        assert "holds 2 messages, but its last is not the one the run last saw" in str(failure)
        assert [m.text for m in await store.load("s")] == ["a new conversation", "hi"]


class TestAnotherWriter:
    async def test_a_write_by_another_run_stops_the_holder_and_the_log_stays_whole(
        self, store: SessionStore
    ) -> None:
        """Another worker that took the session (the holder's lock was lost) wrote to it:
        the holder's next append is refused, nothing of it is stored, and the next run
        answers the holder's call as interrupted."""
        failure = await run_meanwhile(
            store, lambda: store.append("s", [Message.user("another worker's question")])
        )
        assert isinstance(failure, SessionStoreError)
        assert "holds 3 messages, not the 2 the run last saw" in str(failure)
        stored = await store.load("s")
        assert roles(stored) == [Role.USER, Role.ASSISTANT, Role.USER]
        assert stored[2].text == "another worker's question"

        class Next(Agent):
            session_store = store

        result = await Next(model=ScriptedModel([text_response("again")])).run(
            "and now?", session_id="s"
        )
        assert await store.load("s") == result.messages
        repair = result.messages[3]
        assert repair.tool_results[0].call_id == "call-1"
        assert repair.tool_results[0].is_error

    async def test_a_holder_that_wrote_last_goes_on(self, store: SessionStore) -> None:
        """Its own appends move what the holder expects: a whole run is never refused."""
        failure = await run_meanwhile(store, anyio.lowlevel.checkpoint)
        assert failure is None
        assert roles(await store.load("s")) == [
            Role.USER,
            Role.ASSISTANT,
            Role.TOOL,
            Role.ASSISTANT,
        ]


async def test_a_holder_that_deletes_its_session_writes_it_anew_only_after_a_load(
    store: SessionStore,
) -> None:
    """A delete under the holder's feet (its own tool's, say) refuses the holder's next
    append, so no log starts with a result whose call is gone; trimming a conversation
    under the lock loads the emptied session before writing it anew."""
    await store.append("s", [Message.user("a"), Message.assistant("b")])
    async with store.lock("s"):  # type: ignore[attr-defined]
        log = await store.load("s")
        await store.delete("s")
        with pytest.raises(SessionStoreError, match="no longer exists"):
            await store.append("s", log[-1:])
        assert await store.load("s") == ()
        await store.append("s", log[-1:])
        await store.append("s", [Message.user("c")])
    assert [m.text for m in await store.load("s")] == ["b", "c"]


async def test_a_holders_concurrent_appends_are_not_taken_for_another_writer(
    store: SessionStore,
) -> None:
    """Appends of one holder (its child tasks) take their turns: each expects the length
    the one before it left, so none is refused as if the session changed under it."""
    async with store.lock("s"):  # type: ignore[attr-defined]
        await store.load("s")
        async with anyio.create_task_group() as group:
            for number in range(3):
                group.start_soon(store.append, "s", [Message.user(f"m{number}")])
        await store.append("s", [Message.user("last")])
    texts = [m.text for m in await store.load("s")]
    assert sorted(texts[:3]) == ["m0", "m1", "m2"]
    assert texts[3] == "last"


async def test_a_holders_read_is_not_older_than_its_write_in_flight(tmp_path: Path) -> None:
    """A read the holder starts while one of its appends waits for the database sees that
    append once made: a read's older snapshot would set back the length the holder's next
    append expects, and that append would be refused as if another writer had been."""
    path = tmp_path / "s.db"
    store, reader = SQLiteSessionStore(path), SQLiteSessionStore(path)  # a connection each
    await store.append("s", [Message.user("first")])
    blocker = sqlite3.connect(path, isolation_level=None)
    try:
        async with store.lock("s"):
            await store.load("s")
            blocker.execute("BEGIN IMMEDIATE")  # the holder's append waits for it
            async with anyio.create_task_group() as group:
                group.start_soon(store.append, "s", [Message.user("second")])
                await anyio.sleep(0.1)  # the append is waiting
                group.start_soon(release, blocker)  # in a moment
                seen = [m.text for m in await reader.load("s")]
            await store.append("s", [Message.user("third")])
    finally:
        blocker.close()
        await store.aclose()
        await reader.aclose()
    assert seen == ["first", "second"]


async def release(blocker: sqlite3.Connection) -> None:
    await anyio.sleep(0.1)
    blocker.commit()
