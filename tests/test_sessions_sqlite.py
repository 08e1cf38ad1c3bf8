"""SQLiteSessionStore: the file, its schema, damage and foreign files, kills, concurrency."""

from __future__ import annotations

import gc
import json
import math
import os
import random
import shutil
import sqlite3
import stat
import string
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from functools import partial
from pathlib import Path
from types import FrameType
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from littleghost import Agent, Message, Role, RunContext, tool
from littleghost.errors import (
    ConfigurationError,
    CorruptSessionStoreError,
    DeadlineExceededError,
    SchemaVersionError,
    SessionStoreError,
)
from littleghost.models import ModelRequest, ModelResponse
from littleghost.sessions import (
    SessionStats,
    SQLiteSessionStore,
    message_to_json,
)
from littleghost.testing import ScriptedModel, text_response, tool_call_response

from .ci import missing, mount_namespace
from .conftest import CHILD_PROCESS_ONLY
from .stores import collected_warnings, eventually
from .threads import blocking_agent, default_threads_taken
from .timing import LATE

pytestmark = pytest.mark.anyio


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every file in ``directory`` with its bytes."""
    return {path.name: path.read_bytes() for path in sorted(directory.iterdir())}


def raw(path: Path, *statements: str) -> list[tuple[object, ...]]:
    """Run ``statements`` on the file with plain sqlite3 (autocommit); the last one's rows."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        rows: list[tuple[object, ...]] = []
        for statement in statements:
            rows = connection.execute(statement).fetchall()
        return rows
    finally:
        connection.close()


def stored_through(directory: Path, through_link: bool) -> tuple[Path, Path]:
    """The database file in ``directory``, and the path a store opens it by: the file,
    or a symbolic link to it from another folder."""
    path = directory / "data" / "s.db"
    path.parent.mkdir()
    if not through_link:
        return path, path
    link = directory / "links" / "link.db"
    link.parent.mkdir()
    link.symlink_to(path)
    return path, link


async def every_operation_fails(store: SQLiteSessionStore, error: type[Exception]) -> None:
    with pytest.raises(error):
        await store.load("s")
    with pytest.raises(error):
        await store.append("s", [Message.user("x")])
    with pytest.raises(error):
        await store.list_sessions()
    with pytest.raises(error):
        await store.delete("s")


class TestFile:
    async def test_made_on_first_use_in_wal_mode_with_a_versioned_schema(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "sessions.db"
        async with SQLiteSessionStore(path) as store:
            assert store.path == str(path)
            assert not path.exists()
            assert await store.list_sessions() == ()
        assert raw(path, "PRAGMA journal_mode") == [("wal",)]
        assert raw(path, "SELECT key, value FROM littleghost_meta ORDER BY key") == [
            ("format", "littleghost.sessions"),
            ("schema_version", "1"),
        ]

    async def test_sessions_outlive_the_store(self, tmp_path: Path) -> None:
        messages = [Message.user("hi", metadata={"t": (1, 2)}), Message.assistant("hello")]
        async with SQLiteSessionStore(tmp_path / "s.db") as store:
            await store.append("s", messages)
        async with SQLiteSessionStore(str(tmp_path / "s.db")) as store:
            assert await store.load("s") == tuple(messages)
            assert (await store.load("s"))[0].metadata["t"] == (1, 2)

    async def test_a_relative_path_names_the_file_of_the_directory_it_was_made_in(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A change of directory after the store is made (a daemon, a tool) moves
        neither its database nor its lock file: the database went to the new directory
        and the lock stayed, so another process of that directory ran the same session
        at once."""
        made_in, moved_to = tmp_path / "made", tmp_path / "moved"
        made_in.mkdir()
        moved_to.mkdir()
        monkeypatch.chdir(made_in)
        store = SQLiteSessionStore("s.db")
        monkeypatch.chdir(moved_to)
        async with store, store.lock("s"):
            await store.append("s", [Message.user("hi")])
        assert sorted(
            p.name for p in made_in.iterdir() if not p.name.endswith(("-wal", "-shm"))
        ) == [
            "s.db",
            "s.db-lock",
        ]
        assert not list(moved_to.iterdir())
        assert store.path == "s.db"

    async def test_the_lock_file_is_made_with_the_database_file_s_permissions(
        self, tmp_path: Path
    ) -> None:
        """As SQLite's ``-wal`` and ``-shm`` files: a group-writable database shared by
        two services (a web user and a worker user) gets a group-writable lock file,
        whatever the umask of the process that makes it (the other service could not run)."""
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("s", [Message.user("hi")])
        path.chmod(0o660)
        umask = os.umask(0o077)
        try:
            async with SQLiteSessionStore(path) as store, store.lock("s"):
                pass
        finally:
            os.umask(umask)
        assert stat.S_IMODE(os.stat(f"{path}-lock").st_mode) == 0o660

    async def test_a_lock_file_that_is_a_symlink_to_nothing_is_made_or_named(
        self, tmp_path: Path
    ) -> None:
        """A symlink at ``<database>-lock`` whose target is missing: the target is made
        when its directory exists, else the error names the lock file (never a loop)."""
        path = tmp_path / "s.db"
        os.symlink(tmp_path / "target-lock", f"{path}-lock")
        with anyio.fail_after(5):
            async with SQLiteSessionStore(path) as store, store.lock("s"):
                pass
        elsewhere = tmp_path / "other.db"
        os.symlink(tmp_path / "missing" / "target-lock", f"{elsewhere}-lock")
        with anyio.fail_after(5), pytest.raises(SessionStoreError, match="session lock file"):
            async with SQLiteSessionStore(elsewhere) as store, store.lock("s"):
                pass

    async def test_a_store_can_be_used_again_after_closing(self, tmp_path: Path) -> None:
        store = SQLiteSessionStore(tmp_path / "s.db")
        await store.append("s", [Message.user("one")])
        await store.aclose()
        await store.append("s", [Message.user("two")])
        assert [message.text for message in await store.load("s")] == ["one", "two"]
        await store.aclose()

    @pytest.mark.parametrize("files", [("",), ("", "-wal", "-shm")])
    async def test_a_file_removed_or_replaced_while_open_is_not_written_in_vain(
        self, tmp_path: Path, files: tuple[str, ...]
    ) -> None:
        """Calls after the file was removed reach the file now at the path, as a new store's
        would: nothing is written where no later reader finds it."""
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("old", [Message.user("gone with the file")])
            for suffix in files:
                (tmp_path / f"s.db{suffix}").unlink()
            result = await Sleeper(
                model=ScriptedModel([text_response("a")]), session_store=store
            ).run("q", session_id="s")
            assert [message.text for message in result.messages] == ["q", "a"]
            async with SQLiteSessionStore(path) as other:
                assert await other.list_sessions() == ("s",)
                await other.append("t", [Message.user("by another store")])
            (tmp_path / "s.db").rename(tmp_path / "moved.db")
            async with SQLiteSessionStore(path) as other:
                await other.append("u", [Message.user("in the replacement")])
            assert await store.list_sessions() == ("u",)

    @pytest.mark.parametrize("through_link", [False, True], ids=["file", "link"])
    @CHILD_PROCESS_ONLY
    async def test_writes_after_the_wal_was_removed_outlive_the_process(
        self, tmp_path: Path, through_link: bool
    ) -> None:
        """The ``-wal`` removed under an open store: the messages it held, and later
        appends, reach the file at the path, so they outlive the process (they stayed in
        a log no path reached, lost as the process was killed). For a store opened
        through a symbolic link, the ``-wal`` beside the file it leads to, where SQLite
        makes it (the store looked beside the link, and found none)."""
        path, opened = stored_through(tmp_path, through_link)
        script = textwrap.dedent(
            f"""
            import os, anyio
            from littleghost import Message
            from littleghost.sessions import SQLiteSessionStore

            async def main():
                store = SQLiteSessionStore({str(opened)!r})
                await store.append("s", [Message.user("before")])
                os.remove({str(path) + "-wal"!r})
                await store.append("s", [Message.user("after")])
                os.kill(os.getpid(), 9)

            anyio.run(main)
            """
        )
        with anyio.fail_after(60):
            completed = await anyio.run_process([sys.executable, "-c", script], check=False)
        assert completed.returncode == -9, completed.stderr
        async with SQLiteSessionStore(path) as store:
            assert [message.text for message in await store.load("s")] == ["before", "after"]

    @pytest.mark.parametrize("through_link", [False, True], ids=["file", "link"])
    @CHILD_PROCESS_ONLY
    async def test_a_store_whose_shm_was_replaced_overwrites_no_other_process_s_writes(
        self, tmp_path: Path, through_link: bool
    ) -> None:
        """The ``-shm`` removed under an open store, another process writes through the
        one it makes: the store refuses every call (SQLite keeps the old index for the
        file in its process; its append wrote over the other process's messages). For a
        store opened through a symbolic link, the ``-shm`` beside the file it leads to."""
        path, opened = stored_through(tmp_path, through_link)
        other = textwrap.dedent(
            f"""
            import anyio
            from littleghost import Message
            from littleghost.sessions import SQLiteSessionStore

            async def main():
                async with SQLiteSessionStore({str(path)!r}) as store:
                    await store.append("t", [Message.user("by another process")])

            anyio.run(main)
            """
        )
        script = textwrap.dedent(
            f"""
            import os, subprocess, sys, anyio
            from littleghost import Message
            from littleghost.errors import SessionStoreError
            from littleghost.sessions import SQLiteSessionStore

            async def main():
                store = SQLiteSessionStore({str(opened)!r})
                await store.append("s", [Message.user("before")])
                os.remove({str(path) + "-shm"!r})
                subprocess.run([sys.executable, "-c", {other!r}], check=True)
                for call in (store.load("s"), store.append("u", [Message.user("after")])):
                    try:
                        await call
                    except SessionStoreError as error:
                        print(error, flush=True)
                os.kill(os.getpid(), 9)

            anyio.run(main)
            """
        )
        with anyio.fail_after(60):
            completed = await anyio.run_process([sys.executable, "-c", script], check=False)
        assert completed.returncode == -9, completed.stderr
        refusals = completed.stdout.decode().splitlines()
        assert len(refusals) == 2
        assert all("-shm file was removed or replaced" in line for line in refusals)
        async with SQLiteSessionStore(path) as store:
            assert await store.list_sessions() == ("s", "t")

    @CHILD_PROCESS_ONLY
    @pytest.mark.parametrize("called", [True, False], ids=["refused", "not called"])
    @pytest.mark.parametrize("ending", ["aclose", "exit"])
    async def test_closing_a_store_whose_shm_was_replaced_keeps_other_process_s_writes(
        self, tmp_path: Path, called: bool, ending: str
    ) -> None:
        """The ``-shm`` removed under an open store, another process writes through the
        one it makes: closing the store (``aclose()``, or the interpreter's exit), whether
        or not a call of it was refused since, leaves the other process's messages. SQLite
        wrote its log into the file through the index it kept, over the newer pages."""
        path = tmp_path / "s.db"
        other = textwrap.dedent(
            f"""
            import anyio
            from littleghost import Message
            from littleghost.sessions import SQLiteSessionStore

            async def main():
                async with SQLiteSessionStore({str(path)!r}) as store:
                    for index in range(20):
                        await store.append(f"t{{index}}", [Message.user("theirs " * 50)])

            anyio.run(main)
            """
        )
        script = textwrap.dedent(
            f"""
            import os, subprocess, sys, anyio
            from littleghost import Message
            from littleghost.errors import SessionStoreError
            from littleghost.sessions import SQLiteSessionStore

            async def main():
                store = SQLiteSessionStore({str(path)!r})
                for index in range(20):
                    await store.append("s", [Message.user("mine " * 50)])
                os.remove({str(path) + "-shm"!r})
                subprocess.run([sys.executable, "-c", {other!r}], check=True)
                if {called!r}:
                    try:
                        await store.load("s")
                    except SessionStoreError:
                        pass
                if {ending!r} == "aclose":
                    await store.aclose()

            anyio.run(main)
            """
        )
        with anyio.fail_after(60):
            completed = await anyio.run_process([sys.executable, "-c", script], check=False)
        assert completed.returncode == 0, completed.stderr
        async with SQLiteSessionStore(path) as store:
            sessions = await store.list_sessions()
            assert sessions == ("s", *(f"t{index}" for index in range(20)))
            assert len(await store.load("s")) == 20

    async def test_a_private_in_memory_database(self) -> None:
        async with SQLiteSessionStore(":memory:") as store:
            await store.append("s", [Message.user("x")])
            assert len(await store.load("s")) == 1

    @pytest.mark.parametrize(
        ("options", "named"),
        [
            ({"path": 5}, "path"),
            ({"path": "x\x00.db"}, "path"),
            ({"path": "x.db", "timeout": 0}, "timeout"),
            ({"path": "x.db", "timeout": float("inf")}, "timeout"),
        ],
    )
    def test_arguments_are_checked(self, options: dict[str, object], named: str) -> None:
        with pytest.raises(ConfigurationError, match=named):
            SQLiteSessionStore(**options)  # type: ignore[arg-type]

    @pytest.mark.parametrize("path", ["", " ", "\t \n"])
    def test_an_empty_or_blank_path_is_refused_as_the_store_is_made(
        self, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``SQLiteSessionStore(os.environ.get("DB", ""))``, the variable unset, made a
        private temporary database (SQLite's ``""``): every session was gone with the
        process; a blank path made a file named with spaces in the current directory."""
        monkeypatch.chdir(tmp_path)
        said = "empty" if not path else "blank"
        with pytest.raises(ConfigurationError, match=rf"^SQLiteSessionStore: path is {said}"):
            SQLiteSessionStore(path)
        with pytest.raises(ConfigurationError, match="unset or blank"):
            SQLiteSessionStore(path, read_only=True)
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize(
        ("url", "instead"),
        [
            ("sqlite:///sessions.db", "SQLiteSessionStore('sessions.db')"),
            ("sqlite:////var/lib/app.db", "SQLiteSessionStore('/var/lib/app.db')"),
            ("SQLite:sessions.db", "SQLiteSessionStore('sessions.db')"),
            ("sqlite://", "--store form)"),
            (
                "sqlite:///:memory:",
                "SQLiteSessionStore(':memory:'), a private in-memory database, gone with the "
                "store's connection",
            ),
            ("postgresql://app:s3cret@db/app", "goes to PostgresSessionStore)"),
            ("mysql://app:s3cret@db/app", "not a mysql:// URL"),
            ("jdbc:postgresql://app:s3cret@db/app", "not a jdbc:postgresql:// URL"),
        ],
    )
    def test_a_url_is_refused_as_the_store_is_made(
        self, url: str, instead: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The command line's ``sqlite:///path.db`` was a file of that name: the first
        write failed on a directory ``sqlite:`` (``sqlite:x.db`` made the file)."""
        monkeypatch.chdir(tmp_path)
        with pytest.raises(ConfigurationError, match=r"not (a|the) (\S+ )?URL") as caught:
            SQLiteSessionStore(Path(url) if url.startswith("SQLite:") else url)
        assert str(caught.value).endswith(instead) and "s3cret" not in str(caught.value)
        assert list(tmp_path.iterdir()) == []

    def test_any_url_is_refused_and_any_plain_path_taken(self) -> None:
        """Random schemes before ``://`` (never quoted: a password may follow), and
        ``sqlite:`` in any case, are refused; random names without a colon, and with one
        after a letter alone (a drive), are paths, unless blank."""
        draw = random.Random(7)
        letters = string.ascii_letters
        for _ in range(500):
            scheme = draw.choice(letters) + "".join(
                draw.choices(letters + string.digits + "+.-", k=draw.randint(1, 9))
            )
            rest = "".join(draw.choices(string.printable, k=12))
            with pytest.raises(ConfigurationError) as caught:
                SQLiteSessionStore(f"{scheme}://{rest}")
            assert rest not in str(caught.value) or not rest.strip()
            sqlite = "".join(draw.choice((c.lower(), c.upper())) for c in "sqlite")
            with pytest.raises(ConfigurationError, match=r"--store form\)"):
                SQLiteSessionStore(f"{sqlite}:{'/' * draw.randint(0, 4)}s.db")
            name = "".join(draw.choices(letters + string.digits + "._-/ ", k=draw.randint(1, 20)))
            if not name.strip():  # a blank path is refused: an unset variable, most likely
                with pytest.raises(ConfigurationError, match="path is blank"):
                    SQLiteSessionStore(name)
                name = f"x{name}"
            for path in (name, f"{draw.choice(letters)}:{name}", f"./{scheme}://{name}"):
                assert SQLiteSessionStore(path).path == path

    @pytest.mark.parametrize("path", ["c:s.db", "sqlite3.db", "./sqlite:s.db", "file:s.db"])
    async def test_a_path_that_only_looks_like_a_url_is_a_file(
        self, path: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.chdir(tmp_path)
        async with SQLiteSessionStore(path) as store:
            await store.append("s", [Message.user("x")])
        assert (tmp_path / path).is_file()

    async def test_a_missing_directory_is_a_store_error(self, tmp_path: Path) -> None:
        store = SQLiteSessionStore(tmp_path / "missing" / "s.db")
        with pytest.raises(SessionStoreError) as caught:
            await store.list_sessions()
        why = f"its directory {str(tmp_path / 'missing')!r} does not exist"
        assert f"SessionStoreError: {caught.value}" == written(tmp_path / "missing", "s.db", why)
        with pytest.raises(SessionStoreError) as caught:
            async with store.lock("s"):
                pass
        assert f"SessionStoreError: {caught.value}" == written(tmp_path / "missing", "s.db", why)

    def test_a_run_of_a_session_in_a_missing_directory_says_the_directory_is_missing(
        self, tmp_path: Path
    ) -> None:
        """A run's first store call is the session's lock: it names the store and why, as
        any other first call does, not the lock file SQLite's files would sit beside."""

        class Support(Agent):
            model = ScriptedModel([text_response("never asked")])
            session_store = SQLiteSessionStore(tmp_path / "missing" / "sessions.db")

        with pytest.raises(SessionStoreError) as caught:
            Support().run_sync("Hello", session_id="s-1")
        why = f"its directory {str(tmp_path / 'missing')!r} does not exist"
        expected = written(tmp_path / "missing", "sessions.db", why)
        assert f"SessionStoreError: {caught.value}" == expected
        assert not (tmp_path / "missing").exists()

    async def test_tables_made_before_stored_times_load_without_times(self, tmp_path: Path) -> None:
        path = tmp_path / "old.db"
        raw(
            path,
            "CREATE TABLE littleghost_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)",
            "CREATE TABLE littleghost_sessions (id TEXT PRIMARY KEY, length INTEGER NOT NULL)",
            "CREATE TABLE littleghost_messages (session_id TEXT NOT NULL, position INTEGER "
            "NOT NULL, body TEXT NOT NULL, PRIMARY KEY (session_id, position)) WITHOUT ROWID",
            "INSERT INTO littleghost_meta VALUES ('format', 'littleghost.sessions'), "
            "('schema_version', '1')",
        )
        async with SQLiteSessionStore(path) as store:
            await store.append("s", [Message.user("old"), Message.assistant("times")])
            stored = await store.load_stored("s")
            stats = await store.session_stats()
        assert [(entry.message.text, entry.stored_at) for entry in stored] == [
            ("old", None),
            ("times", None),
        ]
        assert stats == (SessionStats("s", 2, 0, None),)


async def test_the_messages_of_one_append_share_one_time(tmp_path: Path) -> None:
    """stored_at is the append's time, taken once, however long the insert takes."""
    async with SQLiteSessionStore(tmp_path / "s.db") as store:
        await store.append("s", [Message.user("x" * 2_000) for _ in range(5_000)])
        times = {entry.stored_at for entry in await store.load_stored("s")}
    assert len(times) == 1


CARD = "4111-1111-1111-1111"


def copies_of_the_card(directory: Path) -> dict[str, int]:
    """How many times ``CARD`` is in each file of ``directory`` (the database, its -wal)."""
    return {name: data.count(CARD.encode()) for name, data in snapshot(directory).items()}


class TestErasure:
    @pytest.fixture(params=["ON", "OFF"])
    def build_default(
        self, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """SQLite's own default for secure_delete is off (python.org's and many other
        builds); Debian's build turns it on."""
        connect = sqlite3.connect

        def connected(*args: object, **kwargs: object) -> sqlite3.Connection:
            connection = connect(*args, **kwargs)  # type: ignore[call-overload]
            connection.execute(f"PRAGMA secure_delete = {request.param}")
            return connection  # type: ignore[no-any-return]

        monkeypatch.setattr(sqlite3, "connect", connected)

    @pytest.mark.usefixtures("build_default")
    async def test_a_deleted_session_s_text_leaves_the_database_and_its_log(
        self, tmp_path: Path
    ) -> None:
        """Nothing of it stays in the file's free space or in the -wal, even while the
        store stays open (a server's store never closes)."""
        async with SQLiteSessionStore(tmp_path / "s.db") as store:
            await store.append("keep", [Message.user("unrelated " * 50)])
            await store.append("c", [Message.user(f"card {CARD}"), Message.assistant(CARD * 900)])
            await store.delete("c")
            assert not any(copies_of_the_card(tmp_path).values())
            await store.append("keep", [Message.user("later")])
        assert not any(copies_of_the_card(tmp_path).values())
        async with SQLiteSessionStore(tmp_path / "s.db") as store:
            assert await store.list_sessions() == ("keep",)

    async def test_a_delete_waits_for_a_reader_to_take_its_text_out_of_the_log(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("c", [Message.user(f"card {CARD}")])
            reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM littleghost_messages").fetchall()

            async def read_a_while() -> None:
                await anyio.sleep(0.3)
                reader.execute("COMMIT")

            try:
                async with anyio.create_task_group() as group:
                    group.start_soon(read_a_while)
                    await store.delete("c")
            finally:
                reader.close()
            assert not any(copies_of_the_card(tmp_path).values())

    async def test_a_reader_that_stays_holds_a_delete_up_a_second_at_most(
        self, tmp_path: Path
    ) -> None:
        """A read held open (a backup tool's, a shell's) leaves the text in the -wal until a
        later delete; the delete, done at once, does not hold up the store's other calls
        for the store's timeout meanwhile."""
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path, timeout=10) as store:
            await store.append("c", [Message.user(f"card {CARD}")])
            await store.append("keep", [Message.user("hi")])
            reader = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM littleghost_messages").fetchall()
            try:
                started = time.monotonic()
                async with anyio.create_task_group() as group:
                    group.start_soon(store.delete, "c")
                    await anyio.sleep(0.1)
                    assert [m.text for m in await store.load("keep")] == ["hi"]
                assert time.monotonic() - started < 1 + LATE
            finally:
                reader.close()
            assert await store.list_sessions() == ("keep",)


class TestReadOnly:
    async def test_reads_a_store_and_refuses_every_write(self, tmp_path: Path) -> None:
        path = tmp_path / "s.db"
        messages = [Message.user("hi"), Message.assistant("hello")]
        async with SQLiteSessionStore(path) as store:
            await store.append("a", messages)
            await store.append("b", [Message.user("other")])
        content = raw(
            path, "SELECT session_id, position, body, stored_at FROM littleghost_messages"
        )
        database = path.read_bytes()
        async with SQLiteSessionStore(path, read_only=True) as reader:
            assert repr(reader) == f"SQLiteSessionStore({str(path)!r}, read_only=True)"
            assert await reader.list_sessions() == ("a", "b")
            assert await reader.load("a") == tuple(messages)
            assert [entry.message for entry in await reader.load_stored("a")] == messages
            stats = await reader.session_stats()
            assert [(entry.id, entry.messages) for entry in stats] == [("a", 2), ("b", 1)]
            with pytest.raises(SessionStoreError, match="read-only"):
                await reader.append("a", [Message.user("more")])
            with pytest.raises(SessionStoreError, match="read-only"):
                await reader.delete("a")
            with pytest.raises(SessionStoreError, match="read-only"):
                reader.lock("a")
        assert path.read_bytes() == database
        assert (
            raw(path, "SELECT session_id, position, body, stored_at FROM littleghost_messages")
            == content
        )
        assert not (tmp_path / "s.db-lock").exists()

    @pytest.mark.parametrize("name", [b"caf\xc3\xa9 #1?%", b"caf\xe9"], ids=["UTF-8", "Latin-1"])
    async def test_reads_a_store_in_a_folder_of_any_name(self, tmp_path: Path, name: bytes) -> None:
        """A folder named in Latin-1 (not UTF-8, read as ``caf\\udce9``) failed every
        read-only open, so every ``littleghost sessions`` command, with a raw
        ``UnicodeEncodeError``; ``?``, ``#`` and ``%`` in a name are not URI syntax."""
        folder = tmp_path / os.fsdecode(name)
        try:
            folder.mkdir()
        except (OSError, UnicodeEncodeError):
            pytest.skip("the file system takes no such name")
        async with SQLiteSessionStore(folder / "s.db") as store:
            await store.append("a", [Message.user("hi")])
        async with SQLiteSessionStore(folder / "s.db", read_only=True) as reader:
            assert [m.text for m in await reader.load("a")] == ["hi"]

    async def test_never_makes_a_store(self, tmp_path: Path) -> None:
        with pytest.raises(SessionStoreError, match="no SQLite session store at"):
            await SQLiteSessionStore(tmp_path / "missing.db", read_only=True).list_sessions()
        assert snapshot(tmp_path) == {}
        (tmp_path / "empty.db").write_bytes(b"")
        with pytest.raises(CorruptSessionStoreError, match="empty database"):
            await SQLiteSessionStore(tmp_path / "empty.db", read_only=True).list_sessions()
        assert snapshot(tmp_path) == {"empty.db": b""}

    async def test_foreign_and_newer_files_are_refused_and_left_untouched(
        self, tmp_path: Path
    ) -> None:
        shop = tmp_path / "shop.db"
        raw(shop, "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        newer = tmp_path / "newer.db"
        async with SQLiteSessionStore(newer) as store:
            await store.append("s", [Message.user("kept")])
        raw(newer, "UPDATE littleghost_meta SET value = '2' WHERE key = 'schema_version'")
        before = {name: path.read_bytes() for name, path in (("shop", shop), ("newer", newer))}
        with pytest.raises(CorruptSessionStoreError, match="another application"):
            await SQLiteSessionStore(shop, read_only=True).load("s")
        with pytest.raises(SchemaVersionError, match="schema 2"):
            await SQLiteSessionStore(newer, read_only=True).load("s")
        assert {"shop": shop.read_bytes(), "newer": newer.read_bytes()} == before

    def test_read_only_needs_a_file(self) -> None:
        with pytest.raises(ConfigurationError, match="read_only needs a database file"):
            SQLiteSessionStore(":memory:", read_only=True)
        with pytest.raises(ConfigurationError, match="read_only must be True or False"):
            SQLiteSessionStore("s.db", read_only="yes")  # type: ignore[arg-type]


UNWRITABLE_CHILD = textwrap.dedent(
    """
    import json
    import os
    import subprocess
    import sys

    import anyio

    from littleghost import Agent, Message
    from littleghost.sessions import SQLiteSessionStore
    from littleghost.testing import ScriptedModel, text_response


    async def outcome(call):
        try:
            return await call()
        except Exception as error:
            return f"{type(error).__name__}: {error}"


    async def texts(path, read_only):
        async with SQLiteSessionStore(path, read_only=read_only) as store:
            return [message.text for message in await store.load("s")]


    async def run(path):
        model = ScriptedModel([text_response("never asked")])
        async with SQLiteSessionStore(path) as store:
            agent = Agent(model=model, session_store=store)
            answer = await outcome(lambda: agent.run("hi", session_id="s"))
        return [answer if isinstance(answer, str) else "answered", len(model.requests)]


    async def main(folder, mount):
        if mount == "mount":  # a read-only file system, with a store made before
            subprocess.run(["mount", "-t", "tmpfs", "tmpfs", folder], check=True)
            async with SQLiteSessionStore(f"{folder}/s.db") as store:
                await store.append("s", [Message.user("kept")])
            subprocess.run(["mount", "-o", "remount,ro", folder], check=True)
        with open(f"{folder}/s.db", "rb") as file:
            before = file.read()
        found = {"run": await run(f"{folder}/s.db")}
        for name in ("s.db", "new.db"):
            found[name] = await outcome(lambda: texts(f"{folder}/{name}", False))
            found[f"{name} read_only"] = await outcome(lambda: texts(f"{folder}/{name}", True))
        with open(f"{folder}/s.db", "rb") as file:
            found["unchanged"] = file.read() == before
        print(json.dumps(found))


    anyio.run(main, *sys.argv[1:])
    """
)


def unwritable_probe(prefix: list[str], folder: Path, *, mount: bool = False) -> dict[str, Any]:
    """What ``UNWRITABLE_CHILD`` found of the stores in ``folder`` (on a read-only tmpfs it
    mounts there first, if ``mount``), run after ``prefix`` (a command that runs the rest
    as its own)."""
    script = folder.parent / "child.py"
    script.write_text(UNWRITABLE_CHILD)
    done = subprocess.run(
        [*prefix, sys.executable, str(script), str(folder), "mount" if mount else "-"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def written(folder: Path, name: str, why: str, advice: str = "") -> str:
    return (
        f"SessionStoreError: SQLite session store {str(folder / name)!r} cannot be written: "
        f"{why}{advice}; nothing was read or changed"
    )


def unread(folder: Path, name: str, why: str) -> str:
    return (
        f"SessionStoreError: SQLite session store {str(folder / name)!r} cannot be read: "
        f"{why} (SQLite reads a WAL database through a -shm file it makes beside it); "
        "nothing was read"
    )


def permission_bits_apply() -> list[str]:
    """A command that runs the rest as its own with the permission bits applying to it:
    as root, without the capabilities that let root write whatever they say."""
    if os.geteuid() != 0:
        return []
    if shutil.which("setpriv") is None:
        missing("root ignores permission bits unless setpriv drops its capabilities")
    dropped = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={dropped}", f"--inh-caps={dropped}"]


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the probes run in a child
class TestUnwritable:
    """A store this process cannot write: a clear error at its first use, naming the
    path and what is wrong (not SQLite's "unable to open database file" or "attempt to
    write a readonly database"), before a run asks the model anything; the file is left
    as it was."""

    async def test_on_a_read_only_file_system(self, tmp_path: Path) -> None:
        """A read-only tmpfs, mounted in a mount namespace of the child's own (a user
        namespace's too, for a user other than root)."""
        prefix = mount_namespace("a read-only file system")
        folder = tmp_path / "mounted"
        folder.mkdir()
        found = unwritable_probe(prefix, folder, mount=True)
        answer, asked = found.pop("run")
        assert asked == 0
        assert str(folder / "s.db") in answer
        assert "read-only file system" in answer.lower()
        why = "it is on a read-only file system"
        assert found == {
            "s.db": written(folder, "s.db", why),
            "s.db read_only": unread(folder, "s.db", why),
            "new.db": written(folder, "new.db", why),
            "new.db read_only": "SessionStoreError: there is no SQLite session store at "
            f"{str(folder / 'new.db')!r}",
            "unchanged": True,
        }

    async def test_without_write_permission(self, tmp_path: Path) -> None:
        """On its directory (SQLite makes the -wal and -shm there) or on the file; root
        writes whatever the permission bits say, so as root the child runs without the
        capabilities that let it (``setpriv``)."""
        prefix = permission_bits_apply()
        closed, locked = tmp_path / "closed", tmp_path / "locked"
        for folder in (closed, locked):
            folder.mkdir()
            async with SQLiteSessionStore(folder / "s.db") as store:
                await store.append("s", [Message.user("kept")])
        (locked / "s.db").chmod(0o444)
        closed.chmod(0o555)
        try:
            in_closed = unwritable_probe(prefix, closed)
            in_locked = unwritable_probe(prefix, locked)
        finally:
            closed.chmod(0o755)
        why = (
            f"this process has no write permission on its directory {str(closed)!r}, where "
            "SQLite makes the -wal, -shm and -journal files beside it"
        )
        assert in_closed == {
            "run": [written(closed, "s.db", why), 0],
            "s.db": written(closed, "s.db", why),
            "s.db read_only": unread(closed, "s.db", why),
            "new.db": written(closed, "new.db", why),
            "new.db read_only": "SessionStoreError: there is no SQLite session store at "
            f"{str(closed / 'new.db')!r}",
            "unchanged": True,
        }
        assert sorted(path.name for path in closed.iterdir()) == ["s.db"]
        why = "this process has no write permission on the file"
        advice = "; open it with read_only=True to read it"
        assert in_locked == {
            "run": [written(locked, "s.db", why, advice), 0],
            "s.db": written(locked, "s.db", why, advice),
            "s.db read_only": ["kept"],
            "new.db": [],
            "new.db read_only": [],
            "unchanged": True,
        }

    async def test_through_links_in_a_directory_it_cannot_write(self, tmp_path: Path) -> None:
        """SQLite makes its files beside the file a symbolic link leads to: links in a
        directory this process cannot write, to files in one it can, are a store it
        writes (they were refused as a store in the links' directory)."""
        links, files = tmp_path / "links", tmp_path / "files"
        links.mkdir()
        files.mkdir()
        async with SQLiteSessionStore(files / "s.db") as store:
            await store.append("s", [Message.user("kept")])
        (links / "s.db").symlink_to(files / "s.db")
        (links / "new.db").symlink_to(files / "new.db")  # to none yet: SQLite makes it
        links.chmod(0o555)
        try:
            found = unwritable_probe(permission_bits_apply(), links)
        finally:
            links.chmod(0o755)
        assert found == {
            "run": ["answered", 1],
            "s.db": ["kept", "hi", "never asked"],
            "s.db read_only": ["kept", "hi", "never asked"],
            "new.db": [],
            "new.db read_only": [],
            "unchanged": False,  # the run's messages were written
        }
        assert sorted(path.name for path in links.iterdir()) == ["new.db", "s.db"]


async def test_a_platform_without_statvfs_writes_as_any_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Windows has no ``os.statvfs``: the check for a read-only file system, made before
    every write, says no (it raised ``AttributeError`` at a store's first use)."""
    monkeypatch.delattr(os, "statvfs")
    async with SQLiteSessionStore(tmp_path / "s.db") as store:
        result = await Sleeper(model=ScriptedModel([text_response("a")]), session_store=store).run(
            "q", session_id="s"
        )
        assert [message.text for message in await store.load("s")] == ["q", "a"]
    assert [message.text for message in result.messages] == ["q", "a"]


class TestBadFiles:
    async def test_a_file_that_is_not_a_database_is_corrupt_and_left_untouched(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "notes.db"
        path.write_bytes(b"these are my notes, not a database\n" * 200)
        before = snapshot(tmp_path)
        store = SQLiteSessionStore(path)
        await every_operation_fails(store, CorruptSessionStoreError)
        assert snapshot(tmp_path) == before

    async def test_a_damaged_header_is_corrupt(self, tmp_path: Path) -> None:
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("s", [Message.user("x")])
        raw(path, "PRAGMA wal_checkpoint(TRUNCATE)")
        data = bytearray(path.read_bytes())
        data[:16] = b"garbage garbage!"
        path.write_bytes(bytes(data))
        before = snapshot(tmp_path)
        async with SQLiteSessionStore(path) as store:
            await every_operation_fails(store, CorruptSessionStoreError)
        assert snapshot(tmp_path) == before

    async def test_another_application_s_database_is_foreign_and_left_untouched(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "shop.db"
        raw(
            path,
            "CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)",
            "INSERT INTO customers (name) VALUES ('Ada')",
        )
        before = snapshot(tmp_path)
        store = SQLiteSessionStore(path)
        with pytest.raises(CorruptSessionStoreError, match="another application"):
            await store.list_sessions()
        await every_operation_fails(store, CorruptSessionStoreError)
        assert snapshot(tmp_path) == before

    async def test_a_foreign_meta_table_is_corrupt(self, tmp_path: Path) -> None:
        path = tmp_path / "s.db"
        raw(path, "CREATE TABLE littleghost_meta (a TEXT, b TEXT)")
        before = snapshot(tmp_path)
        await every_operation_fails(SQLiteSessionStore(path), CorruptSessionStoreError)
        assert snapshot(tmp_path) == before

    @pytest.mark.parametrize(
        ("version", "shown"),
        [("0", "'0'"), ("1" * 5000, "'1111")],
        ids=["under-1", "too-long-to-read"],
    )
    async def test_a_schema_version_under_1_or_too_long_to_read_is_corrupt(
        self, tmp_path: Path, version: str, shown: str
    ) -> None:
        """A version under 1, or of more digits than Python reads as an int (Python's
        ``ValueError``, "Exceeds the limit", escaped the store): the message shows the
        start of it."""
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("s", [Message.user("kept")])
        raw(
            path,
            f"UPDATE littleghost_meta SET value = '{version}' WHERE key = 'schema_version'",
            "PRAGMA wal_checkpoint(TRUNCATE)",
        )
        with pytest.raises(
            CorruptSessionStoreError, match=f"unreadable schema_version {shown}"
        ) as error:
            await SQLiteSessionStore(path).load("s")
        assert len(str(error.value)) < 300

    async def test_a_newer_schema_is_refused_and_left_untouched(self, tmp_path: Path) -> None:
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("s", [Message.user("kept")])
        raw(
            path,
            "UPDATE littleghost_meta SET value = '2' WHERE key = 'schema_version'",
            "PRAGMA wal_checkpoint(TRUNCATE)",
        )
        before = snapshot(tmp_path)
        store = SQLiteSessionStore(path)
        with pytest.raises(SchemaVersionError, match="schema 2") as caught:
            await store.load("s")
        assert "Upgrade littleghost" in str(caught.value)
        await every_operation_fails(store, SchemaVersionError)
        assert snapshot(tmp_path) == before

    async def test_a_damaged_record_is_corrupt_and_other_sessions_still_load(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("good", [Message.user("fine")])
            await store.append("bad", [Message.user("soon damaged")])
            raw(
                path, "UPDATE littleghost_messages SET body = '{\"id\": 1' WHERE session_id = 'bad'"
            )
            with pytest.raises(CorruptSessionStoreError, match="not valid JSON"):
                await store.load("bad")
            assert [message.text for message in await store.load("good")] == ["fine"]

    @pytest.mark.parametrize("stored_at", ["'not a time'", "1e20", "-1e20"])
    async def test_a_damaged_time_is_corrupt(self, tmp_path: Path, stored_at: str) -> None:
        """A stored time that is no time fails as a damaged store, never a TypeError."""
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("bad", [Message.user("soon damaged")])
            raw(path, f"UPDATE littleghost_messages SET stored_at = {stored_at}")
            with pytest.raises(CorruptSessionStoreError, match="a stored time cannot be read"):
                await store.load_stored("bad")
            if stored_at != "-1e20":  # the newest time is the session's last activity
                with pytest.raises(CorruptSessionStoreError, match="stored time"):
                    await store.session_stats()
            assert [m.text for m in await store.load("bad")] == ["soon damaged"]


class Sleeper(Agent):
    instructions = "Wait when asked."

    @tool
    async def note(self, text: str) -> str:
        """Note ``text`` after a short, random pause."""
        await anyio.sleep(random.random() / 100)
        return f"noted {text}"


CHILD = textwrap.dedent(
    """
    import sys

    import anyio

    from littleghost import Agent, tool
    from littleghost.sessions import SQLiteSessionStore
    from littleghost.testing import ScriptedModel, text_response, tool_call_response


    class Worker(Agent):
        @tool
        async def wait(self) -> str:
            \"\"\"Wait a long time.\"\"\"
            print("tool running", flush=True)
            await anyio.sleep(60)
            return "done"


    async def main() -> None:
        model = ScriptedModel(
            [tool_call_response("wait", {}, call_id="call-1"), text_response("never")]
        )
        agent = Worker(model=model, session_store=SQLiteSessionStore(sys.argv[1]))
        await agent.run("start the long job", session_id="killed")


    anyio.run(main)
    """
)


class TestKilledProcess:
    async def test_a_killed_run_leaves_a_readable_log_that_the_next_run_repairs(
        self, tmp_path: Path
    ) -> None:
        script = tmp_path / "child.py"
        script.write_text(CHILD)
        path = tmp_path / "s.db"
        with anyio.fail_after(60):
            async with await anyio.open_process([sys.executable, str(script), str(path)]) as child:
                assert child.stdout is not None
                line = await child.stdout.receive()
                assert line.startswith(b"tool running")
                child.kill()
                assert await child.wait() == -9
        assert raw(path, "PRAGMA integrity_check") == [("ok",)]

        async with SQLiteSessionStore(path) as store:
            stored = await store.load("killed")
            assert [message.role.value for message in stored] == ["user", "assistant"]
            assert stored[0].text == "start the long job"
            assert stored[1].tool_calls[0].id == "call-1"

            model = ScriptedModel([text_response("the job was interrupted")])
            result = await Sleeper(model=model, session_store=store).run(
                "what happened?", session_id="killed"
            )
            repair = result.messages[2]
            assert repair.tool_results[0].call_id == "call-1"
            assert repair.tool_results[0].is_error
            assert "interrupted" in repair.tool_results[0].content
            assert repair in model.requests[0].messages
            assert await store.load("killed") == result.messages
            assert len(result.messages) == 5


class TestConcurrency:
    async def test_a_new_holder_waits_for_a_write_still_committing(self, tmp_path: Path) -> None:
        """A write whose caller stopped waiting (an earlier holder's, in another process)
        may still commit after its session was let go: the next holder waits for it
        before it loads, and its run goes on from what it wrote."""
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("s", [Message.user("before"), Message.assistant("ok")])
            connection = sqlite3.connect(path, isolation_level=None)
            try:
                connection.execute("BEGIN IMMEDIATE")
                connection.execute("UPDATE littleghost_sessions SET length = 3 WHERE id = 's'")
                connection.execute(
                    "INSERT INTO littleghost_messages (session_id, position, body)"
                    " VALUES ('s', 2, ?)",
                    (message_to_json(Message.assistant("written late")),),
                )
                model = ScriptedModel([text_response("done")])
                agent = Sleeper(model=model, session_store=store)
                async with anyio.create_task_group() as group:
                    group.start_soon(partial(agent.run, "hello", session_id="s"))
                    await anyio.sleep(0.3)
                    connection.execute("COMMIT")
            finally:
                connection.close()
            asked = [m.text for m in model.requests[0].messages if m.role is not Role.SYSTEM]
            assert asked == ["before", "ok", "written late", "hello"]
            assert await texts(store) == ["before", "ok", "written late", "hello", "done"]

    @pytest.mark.parametrize("connections", [1, 5])
    async def test_fifty_runs_on_fifty_sessions_keep_their_own_messages(
        self, tmp_path: Path, connections: int
    ) -> None:
        path = tmp_path / "s.db"
        stores = [SQLiteSessionStore(path) for _ in range(connections)]
        results = {}

        async def one(index: int) -> None:
            model = ScriptedModel(
                [
                    tool_call_response("note", {"text": f"s{index}"}),
                    text_response(f"done s{index}"),
                ]
            )
            agent = Sleeper(model=model, session_store=stores[index % connections])
            results[index] = await agent.run(f"hello s{index}", session_id=f"s{index}")

        async with anyio.create_task_group() as group:
            for index in range(50):
                group.start_soon(one, index)

        store = stores[0]
        assert sorted(await store.list_sessions()) == sorted(f"s{index}" for index in range(50))
        for index, result in results.items():
            stored = await store.load(f"s{index}")
            assert stored == result.messages
            assert [message.role.value for message in stored] == [
                "user",
                "assistant",
                "tool",
                "assistant",
            ]
            assert stored[0].text == f"hello s{index}"
            assert stored[1].tool_calls[0].arguments == {"text": f"s{index}"}
            assert stored[2].tool_results[0].content == f"noted s{index}"
            assert stored[3].text == f"done s{index}"
        for opened in stores:
            await opened.aclose()

    async def test_stores_of_one_file_share_the_session_lock(self, tmp_path: Path) -> None:
        first = SQLiteSessionStore(tmp_path / "s.db")
        second = SQLiteSessionStore(tmp_path / "." / "s.db")
        entered = anyio.Event()
        order: list[str] = []

        async def hold() -> None:
            async with first.lock("s"):
                entered.set()
                await anyio.sleep(0.05)
                order.append("first")

        async def wait() -> None:
            await entered.wait()
            async with second.lock("s"):
                order.append("second")

        async with first, second, anyio.create_task_group() as group:
            group.start_soon(hold)
            group.start_soon(wait)
        assert order == ["first", "second"]


RUNNER = textwrap.dedent(
    """
    import sys

    import anyio

    from littleghost import Agent
    from littleghost.sessions import SQLiteSessionStore
    from littleghost.testing import text_response

    path, tag, mode = sys.argv[1:]


    async def answer(request):
        if mode == "hold":
            print("holding", flush=True)
            await anyio.to_thread.run_sync(sys.stdin.readline)
        asked = ", ".join(m.text for m in request.messages if m.role.value == "user")
        return text_response(f"answer {tag} to {asked}")


    async def main():
        from littleghost.testing import ScriptedModel

        agent = Agent(model=ScriptedModel([answer]), session_store=SQLiteSessionStore(path))
        print("starting", flush=True)
        await agent.run(f"question {tag}", session_id="shared", timeout=30)


    anyio.run(main)
    """
)


class Runner:
    """A run of session ``shared`` in another process; ``hold`` waits inside the run
    (holding the session) until a line arrives on its stdin."""

    def __init__(self, process: Process) -> None:
        assert process.stdout is not None
        self.process = process
        self.output = BufferedByteReceiveStream(process.stdout)

    async def said(self, line: bytes) -> None:
        assert await self.output.receive_until(b"\n", 1000) == line

    async def release(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send(b"go\n")


@asynccontextmanager
async def runner(directory: Path, tag: str, mode: str) -> AsyncIterator[Runner]:
    script = directory / "runner.py"
    script.write_text(RUNNER)
    command = [sys.executable, str(script), str(directory / "s.db"), tag, mode]
    async with await anyio.open_process(command) as process:
        yield Runner(process)


LOOPER = textwrap.dedent(
    """
    import sys

    import anyio

    from littleghost import Agent
    from littleghost.sessions import SQLiteSessionStore
    from littleghost.testing import ScriptedModel, text_response

    path, runs = sys.argv[1], int(sys.argv[2])


    async def answer(request):
        await anyio.sleep(0.01)  # the run's work: longer than a waiter's first steps
        return text_response("looped")


    async def main():
        async with SQLiteSessionStore(path) as store:
            agent = Agent(model=ScriptedModel([answer] * runs), session_store=store)
            for run in range(runs):
                await agent.run(f"run {run}", session_id="shared", timeout=60)
                if run == 0:
                    print("looping", flush=True)


    anyio.run(main)
    """
)
"""Runs session ``shared`` back to back, each run taking the session as the last one let
it go (a worker draining a backlog)."""


async def stored_texts(path: Path) -> list[str]:
    async with SQLiteSessionStore(path) as store:
        return [message.text for message in await store.load("shared")]


def loop_runs(texts: list[str]) -> int:
    """How many of the ``LOOPER``'s runs ``texts`` hold."""
    return sum(text.startswith("run ") for text in texts)


class TestProcesses:
    @CHILD_PROCESS_ONLY
    async def test_runs_of_one_session_in_two_processes_take_turns(self, tmp_path: Path) -> None:
        with anyio.fail_after(60):
            async with runner(tmp_path, "A", "hold") as first:
                await first.said(b"starting")
                await first.said(b"holding")
                async with runner(tmp_path, "B", "go") as second:
                    await second.said(b"starting")
                    await anyio.sleep(0.3)
                    assert await stored_texts(tmp_path / "s.db") == ["question A"]
                    await first.release()
                    assert await first.process.wait() == 0
                    assert await second.process.wait() == 0
        assert await stored_texts(tmp_path / "s.db") == [
            "question A",
            "answer A to question A",
            "question B",
            "answer B to question A, question B",
        ]

    async def test_a_process_running_a_session_back_to_back_lets_another_s_run_in(
        self, tmp_path: Path
    ) -> None:
        """Each run of this process, started while the other one loops, goes in within a
        few of the loop's runs, not once the loop ends (before the gate: 26 to 112 of them
        for most; up to 10 leaves room for a loaded machine's slow start of a run)."""
        path, script = tmp_path / "s.db", tmp_path / "looper.py"
        script.write_text(LOOPER)
        runs, waits = 300, 5
        model = ScriptedModel([text_response("waited")] * waits)
        waited: list[int] = []
        command = [sys.executable, str(script), str(path), str(runs)]
        with anyio.fail_after(120):
            async with (
                SQLiteSessionStore(path) as store,
                await anyio.open_process(command) as looper,
            ):
                agent = Agent(model=model, session_store=store)
                assert looper.stdout is not None
                output = BufferedByteReceiveStream(looper.stdout)
                assert await output.receive_until(b"\n", 100) == b"looping"
                for wait in range(waits):
                    before = loop_runs(await stored_texts(path))
                    await agent.run(f"wait {wait}", session_id="shared", timeout=60)
                    texts = await stored_texts(path)
                    waited.append(loop_runs(texts[: texts.index(f"wait {wait}")]) - before)
                assert await looper.wait() == 0
        texts = await stored_texts(path)
        assert [text for text in texts if text.startswith("run ")] == [
            f"run {run}" for run in range(runs)
        ]
        assert len(texts) == 2 * (runs + waits)
        assert max(waited) <= 10, waited

    @CHILD_PROCESS_ONLY
    async def test_a_killed_holder_frees_the_session(self, tmp_path: Path) -> None:
        with anyio.fail_after(60):
            async with runner(tmp_path, "A", "hold") as first:
                await first.said(b"starting")
                await first.said(b"holding")
                async with runner(tmp_path, "B", "go") as second:
                    await second.said(b"starting")
                    await anyio.sleep(0.3)
                    assert await stored_texts(tmp_path / "s.db") == ["question A"]
                    first.process.kill()
                    assert await first.process.wait() == -9
                    assert await second.process.wait() == 0
        assert await stored_texts(tmp_path / "s.db") == [
            "question A",
            "question B",
            "answer B to question A, question B",
        ]

    @CHILD_PROCESS_ONLY
    async def test_a_killed_waiter_leaves_the_session_to_the_next(self, tmp_path: Path) -> None:
        """A process killed while it waits (at the session's gate) holds no one up."""
        with anyio.fail_after(60):
            async with runner(tmp_path, "A", "hold") as first:
                await first.said(b"starting")
                await first.said(b"holding")
                async with runner(tmp_path, "B", "go") as second:
                    await second.said(b"starting")
                    await anyio.sleep(0.3)
                    second.process.kill()
                    assert await second.process.wait() == -9
                async with runner(tmp_path, "C", "go") as third:
                    await third.said(b"starting")
                    await first.release()
                    assert await first.process.wait() == 0
                    assert await third.process.wait() == 0
        assert await stored_texts(tmp_path / "s.db") == [
            "question A",
            "answer A to question A",
            "question C",
            "answer C to question A, question C",
        ]

    async def test_a_lock_file_removed_while_open_still_keeps_processes_apart(
        self, tmp_path: Path
    ) -> None:
        """A process that keeps its lock file open (it holds another session) takes its
        next sessions on the file made in the removed one's place, as other processes do."""
        with anyio.fail_after(60):
            async with SQLiteSessionStore(tmp_path / "s.db") as store, store.lock("other"):
                (tmp_path / "s.db-lock").unlink()
                async with runner(tmp_path, "A", "hold") as first:
                    await first.said(b"starting")
                    await first.said(b"holding")
                    with anyio.move_on_after(0.3) as scope:
                        async with store.lock("shared"):
                            pytest.fail("the other process held the session")
                    assert scope.cancelled_caught
                    await first.release()
                    assert await first.process.wait() == 0

    async def test_waiting_for_another_process_is_cancellable_and_counts_against_the_deadline(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "s.db"
        model = ScriptedModel([text_response("never")])
        with anyio.fail_after(60):
            async with runner(tmp_path, "A", "hold") as first, SQLiteSessionStore(path) as store:
                await first.said(b"starting")
                await first.said(b"holding")
                started = anyio.current_time()
                with anyio.move_on_after(0.2) as scope:
                    async with store.lock("shared"):
                        pytest.fail("the other process held the session")
                assert scope.cancelled_caught
                with pytest.raises(DeadlineExceededError):
                    await Agent(model=model, session_store=store).run(
                        "waiting", session_id="shared", timeout=0.2
                    )
                assert anyio.current_time() - started < 0.4 + LATE
                await first.release()
                assert await first.process.wait() == 0
                with anyio.fail_after(5):
                    async with store.lock("shared"):
                        pass
        assert model.requests == []
        assert await stored_texts(path) == ["question A", "answer A to question A"]


FORKED = textwrap.dedent(
    """
    import os
    import subprocess
    import sys
    import threading

    import anyio

    from littleghost import Message
    from littleghost.sessions import SQLiteSessionStore

    path, mode = sys.argv[1:]
    store = SQLiteSessionStore(path, timeout=10)
    anyio.run(store.append, "s", [Message.user("parent")])
    if mode == "during a call":  # a call of the parent waits for a locked database
        LOCKER = (
            "import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); "
            "c.execute('BEGIN IMMEDIATE'); print('locked', flush=True); sys.stdin.readline()"
        )
        locker = subprocess.Popen(
            [sys.executable, "-c", LOCKER, path], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        assert locker.stdout.readline() == b"locked\\n"
        call = threading.Thread(target=anyio.run, args=(store.append, "s", [Message.user("call")]))
        call.start()
        threading.Event().wait(0.3)  # the call waits for the write lock, in the store's turn
        threading.Timer(0.5, locker.communicate, args=(b"go\\n",)).start()
    ready, go = os.pipe(), os.pipe()
    pid = os.fork()
    if pid == 0:
        async def child():
            await store.append("s", [Message.user("child 1")])
            os.write(ready[1], b"1")
            os.read(go[0], 1)
            await store.append("s", [Message.user("child 2")])

        try:
            anyio.run(child)
        except BaseException as error:
            print(f"child: {type(error).__name__}: {error}", flush=True)
            os._exit(1)
        os._exit(0)
    if mode == "during a call":
        call.join()
    os.read(ready[0], 1)
    anyio.run(store.aclose)


    async def look():  # another user of the file opens it and is done
        async with SQLiteSessionStore(path) as other:
            await other.list_sessions()


    anyio.run(look)
    os.write(go[1], b"1")
    assert os.waitpid(pid, 0)[1] == 0
    print([m.text for m in anyio.run(SQLiteSessionStore(path).load, "s")], flush=True)
    """
)


@CHILD_PROCESS_ONLY
class TestForkedProcesses:
    """A process that used a store forks (a ``multiprocessing`` worker, a web server's
    workers started after the application was loaded), and the child uses the store."""

    async def run(self, directory: Path, mode: str) -> str:
        script = directory / "forked.py"
        script.write_text(FORKED)
        with anyio.fail_after(30):
            done = await anyio.run_process(
                [sys.executable, str(script), str(directory / "s.db"), mode], check=False
            )
        assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
        return done.stdout.decode().strip()

    async def test_the_child_s_writes_are_kept_once_the_parent_closed_its_store(
        self, tmp_path: Path
    ) -> None:
        """SQLite forbids using a connection across ``fork()``: the child holds none of
        the file locks SQLite believes it holds, so a process that opened and closed the
        file meanwhile took itself for its last user and removed the -wal the child
        still wrote to."""
        assert await self.run(tmp_path, "after the parent closed") == str(
            ["parent", "child 1", "child 2"]
        )

    async def test_the_child_s_writes_are_kept_when_it_forked_during_a_call(
        self, tmp_path: Path
    ) -> None:
        """A call under way in another thread as the process forks: the fork waits for it.
        The child kept its connection, unused, and SQLite's lock state of the file, which
        every connection of it in a process shares, then held the child's new ones too:
        its writes were lost as above."""
        assert await self.run(tmp_path, "during a call") == str(
            ["parent", "call", "child 1", "child 2"]
        )


@contextmanager
def locked(path: Path, begin: str = "BEGIN IMMEDIATE") -> Iterator[None]:
    """Another connection holds the database's write lock while the context is open
    (its ``begin`` statement says which)."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute(begin)
        yield
        connection.execute("ROLLBACK")
    finally:
        connection.close()


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SQLiteSessionStore]:
    """A store with the default 30 s timeout, holding one message of session ``s``."""
    async with SQLiteSessionStore(tmp_path / "s.db", timeout=30) as opened:
        await opened.append("s", [Message.user("before")])
        yield opened


async def texts(store: SQLiteSessionStore) -> list[str]:
    return [message.text for message in await store.load("s")]


class TestDeadlines:
    async def test_a_locked_database_waits_only_until_the_caller_s_deadline(
        self, store: SQLiteSessionStore
    ) -> None:
        with locked(Path(store.path)):
            started = time.monotonic()
            with anyio.move_on_after(0.5) as scope:
                await store.append("s", [Message.user("secret words")])
            elapsed = time.monotonic() - started
            assert scope.cancelled_caught
            assert 0.4 < elapsed < 0.5 + LATE
            assert await texts(store) == ["before"]
        await store.append("s", [Message.user("after")])
        assert await texts(store) == ["before", "after"]

    async def test_a_run_past_its_deadline_on_a_locked_database_says_what_held_it(
        self, store: SQLiteSessionStore
    ) -> None:
        """No run of the session held it but another connection's write held the
        database: the error says so, not only that it waited to hold its session."""
        model = ScriptedModel([text_response("never")])
        with locked(Path(store.path)), pytest.raises(DeadlineExceededError) as caught:
            await Agent(model=model, session_store=store).run("hi", session_id="s", timeout=0.3)
        assert str(caught.value) == (
            "Agent did not finish before its deadline, still waiting to hold session 's': "
            "its store's database was busy with another connection's write"
        )
        assert model.requests == []
        assert await texts(store) == ["before"]

    async def test_a_run_past_its_deadline_storing_on_a_locked_database_says_so(
        self, store: SQLiteSessionStore
    ) -> None:
        """Another connection's write takes the database while the model answers: the
        run stopped storing the answer says what its write waited for; a write that did
        not wait says only what the run was doing."""
        with ExitStack() as held:

            def answer(request: ModelRequest) -> ModelResponse:
                held.enter_context(locked(Path(store.path)))
                return text_response("stored?")

            agent = Agent(model=ScriptedModel([answer]), session_store=store, cleanup_grace=0.1)
            with pytest.raises(DeadlineExceededError) as caught:
                await agent.run("hi", session_id="s", timeout=0.5)
        assert str(caught.value) == (
            "Agent did not finish before its deadline, storing messages in the session in "
            "turn 1 (of 100 at most): its store's database was busy with another "
            "connection's write"
        )
        assert await texts(store) == ["before", "hi"]

    async def test_a_run_past_its_deadline_loading_on_a_locked_database_says_so(
        self, tmp_path: Path
    ) -> None:
        """Another connection's write takes the database (a store file in rollback
        journal mode, where a write keeps readers out) once the run holds its session:
        the run stopped loading it says what its load waited for."""
        path = tmp_path / "rollback.db"
        async with SQLiteSessionStore(path) as made:
            await made.append("s", [Message.user("before")])
        raw_connection = sqlite3.connect(path, isolation_level=None)
        raw_connection.execute("PRAGMA journal_mode=DELETE")
        raw_connection.close()
        with ExitStack() as held:

            class TakenOnceHeld(SQLiteSessionStore):
                @asynccontextmanager
                async def lock(self, session_id: str) -> AsyncIterator[None]:
                    async with super().lock(session_id):
                        held.enter_context(locked(path, "BEGIN EXCLUSIVE"))
                        yield

            model = ScriptedModel([text_response("never")])
            async with TakenOnceHeld(path, timeout=30) as store:
                agent = Agent(model=model, session_store=store)
                with pytest.raises(DeadlineExceededError) as caught:
                    await agent.run("hi", session_id="s", timeout=0.5)
        assert str(caught.value) == (
            "Agent did not finish before its deadline, loading the session in turn 1 (of 100 "
            "at most): its store's database was busy with another connection's write"
        )
        assert model.requests == []

    async def test_a_tool_s_write_its_timeout_cut_leaves_no_note_on_a_later_deadline(
        self, store: SQLiteSessionStore
    ) -> None:
        """A tool's ``context.append`` waited for the database, busy with another
        connection's write, past the tool's own timeout; the write landed and the run went
        on: its deadline, passed later waiting for the model, says nothing of the
        database."""
        held = threading.Event()

        def hold_briefly() -> None:  # another connection's write, over by itself
            with locked(Path(store.path)):
                held.set()
                time.sleep(0.6)

        class Noting(Agent):
            @tool(timeout=0.2)
            async def note(self, context: RunContext) -> str:
                """Leave a note."""
                threading.Thread(target=hold_briefly, daemon=True).start()
                await anyio.to_thread.run_sync(held.wait)
                await context.append(Message.developer("note"))
                return "noted"

        async def hang(request: ModelRequest) -> ModelResponse:
            await anyio.sleep_forever()
            raise AssertionError("not reached")

        model = ScriptedModel([tool_call_response("note", {}), hang])
        with pytest.raises(DeadlineExceededError) as caught:
            await Noting(model=model, session_store=store).run("hi", session_id="s", timeout=2)
        assert str(caught.value) == (
            "Noting did not finish before its deadline, waiting for the model's answer in "
            "turn 2 (of 100 at most)"
        )
        assert "note" in await texts(store)

    async def test_closing_keeps_to_the_caller_s_deadline_while_a_call_waits(
        self, store: SQLiteSessionStore
    ) -> None:
        """``aclose()`` while another task's call waits for a locked database waited for
        that call, shielded: up to the store's timeout (30 s) past the closer's deadline.
        The closer stops waiting at its deadline; the call goes on, and closes the
        connection as it ends (the last one closed, SQLite removes the ``-wal``)."""
        path = Path(store.path)
        async with anyio.create_task_group() as group:
            with locked(path):
                group.start_soon(store.append, "s", [Message.user("after")])
                await anyio.sleep(0.2)
                started = time.monotonic()
                with anyio.move_on_after(0.3) as scope:
                    await store.aclose()
                assert scope.cancelled_caught
                assert time.monotonic() - started < 0.3 + LATE
        assert await eventually(lambda: not Path(f"{path}-wal").exists())
        assert await texts(store) == ["before", "after"]

    async def test_calls_near_their_deadlines_send_a_few_fixed_statements(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A statement waits for a lock a slice at most, shorter as its call's time runs
        out: set by a few fixed texts, and only when it changes, so that calls under many
        deadlines do not fill the connection's statement cache (128 statements) with
        one-off ones that push the store's own out."""
        sent: list[str] = []
        connect = sqlite3.connect

        def traced(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            connection = connect(*args, **kwargs)
            connection.set_trace_callback(sent.append)
            return connection

        monkeypatch.setattr(sqlite3, "connect", traced)
        async with SQLiteSessionStore(tmp_path / "s.db") as store:
            await store.append("s", [Message.user("hi")])
            for number in range(92):
                with anyio.move_on_after(0.055 + number % 46 / 1000):  # 5 to 50 ms to wait
                    await store.load("s")
            calm = len(sent)
            for _ in range(50):
                await store.load("s")
        pragmas = [text for text in sent if "busy_timeout" in text]
        assert len(set(pragmas)) <= 4
        assert len(set(sent)) < 32
        assert len(pragmas) < 92
        assert not any("busy_timeout" in text for text in sent[calm + 1 :])

    async def test_the_deadline_stays_a_deadline(self, store: SQLiteSessionStore) -> None:
        with locked(Path(store.path)):
            started = time.monotonic()
            with pytest.raises(TimeoutError) as caught:
                with anyio.fail_after(0.3):
                    await store.delete("s")
            assert time.monotonic() - started < 0.3 + LATE
        busy = caught.value.__context__
        while busy is not None and not isinstance(busy, SessionStoreError):
            busy = busy.__context__
        assert busy is not None
        assert "busy" in str(busy)
        assert "locked" in str(busy)
        assert "deadline" in str(busy)
        assert await texts(store) == ["before"]

    async def test_a_shielded_cleanup_scope_caps_the_wait_with_its_own_deadline(
        self, store: SQLiteSessionStore
    ) -> None:
        with locked(Path(store.path)):
            with anyio.CancelScope() as outer:
                outer.cancel()
                started = time.monotonic()
                with anyio.CancelScope(shield=True, deadline=anyio.current_time() + 0.3) as cleanup:
                    await store.append("s", [Message.user("cleanup")])
                assert cleanup.cancelled_caught
                assert time.monotonic() - started < 0.3 + LATE
        assert await texts(store) == ["before"]

    async def test_an_already_passed_deadline_fails_fast(self, store: SQLiteSessionStore) -> None:
        with locked(Path(store.path)):
            with anyio.CancelScope() as outer:
                outer.cancel()
                started = time.monotonic()
                with anyio.CancelScope(shield=True, deadline=anyio.current_time() - 1) as cleanup:
                    await store.append("s", [Message.user("too late")])
                assert cleanup.cancelled_caught
                assert time.monotonic() - started < LATE
        assert await texts(store) == ["before"]

    async def test_the_store_s_timeout_is_a_busy_error_without_content(
        self, tmp_path: Path
    ) -> None:
        async with SQLiteSessionStore(tmp_path / "s.db", timeout=0.2) as store:
            await store.append("s", [Message.user("before")])
            with (
                locked(tmp_path / "s.db"),
                anyio.fail_after(5),
                pytest.raises(SessionStoreError) as caught,
            ):
                await store.append("s", [Message.user("secret words")])
            message = str(caught.value)
            assert "busy" in message
            assert "locked" in message
            assert "secret" not in message
            assert await texts(store) == ["before"]

    async def test_a_call_waiting_behind_another_call_of_the_store_keeps_its_deadline(
        self, store: SQLiteSessionStore
    ) -> None:
        first_done = anyio.Event()

        async def first() -> None:
            with anyio.move_on_after(10):
                await store.append("s", [Message.user("first")])
            first_done.set()

        with locked(Path(store.path)):
            async with anyio.create_task_group() as group:
                group.start_soon(first)
                await anyio.sleep(0.1)  # the first call holds the store's connection
                started = time.monotonic()
                with anyio.move_on_after(0.3) as scope:
                    await store.load("s")
                assert scope.cancelled_caught
                assert time.monotonic() - started < 0.3 + LATE
                assert not first_done.is_set()
                group.cancel_scope.cancel()
        assert await texts(store) == ["before"]

    async def test_a_run_on_a_locked_database_ends_near_its_deadline(
        self, store: SQLiteSessionStore
    ) -> None:
        model = ScriptedModel([text_response("never stored")])
        with locked(Path(store.path)):
            started = time.monotonic()
            with pytest.raises(DeadlineExceededError):
                await Agent(model=model, session_store=store).run(
                    "hello", session_id="s", timeout=0.5
                )
            assert time.monotonic() - started < 0.5 + LATE
        assert await texts(store) == ["before"]


def store_threads() -> int:
    """Worker threads running a call of an SQLite store right now."""
    code = SQLiteSessionStore._run.__code__
    running = 0
    for top in sys._current_frames().values():
        frame: FrameType | None = top
        while frame is not None and frame.f_code is not code:
            frame = frame.f_back
        running += frame is not None
    return running


async def threads_end() -> bool:
    """Whether every worker thread of the SQLite stores ends soon (``LATE``)."""
    return await eventually(lambda: store_threads() == 0, within=LATE)


async def stopped(how: str, call: Callable[[], Awaitable[object]]) -> float:
    """Seconds ``call()`` takes when its caller stops waiting 0.3 s after it started:
    ``cancel``: its scope, without a deadline, is cancelled; ``late deadline``: it runs
    in a shielded scope without a deadline, given one then (as a run's cleanup is);
    ``deadline``: it runs in a shielded scope whose deadline is then. Checks that a
    worker thread of the call was seen while it waited (so ``threads_end`` can see one)."""
    started = time.monotonic()
    seen: list[int] = []
    if how == "deadline":
        scope = anyio.CancelScope(shield=True, deadline=anyio.current_time() + 0.3)
    else:
        scope = anyio.CancelScope(shield=how == "late deadline")

    async def stop() -> None:
        for _ in range(30):
            seen.append(store_threads())
            await anyio.sleep(0.01)
        if how == "cancel":
            scope.cancel()
        elif how == "late deadline":
            scope.deadline = anyio.current_time()

    async with anyio.create_task_group() as group:
        group.start_soon(stop)
        with scope:
            assert anyio.current_effective_deadline() == math.inf or how == "deadline"
            await call()
            pytest.fail("the call returned before its caller stopped waiting")
    assert scope.cancelled_caught
    assert max(seen) > 0
    return time.monotonic() - started


class TestStoppedCallers:
    @pytest.mark.parametrize("how", ["cancel", "late deadline", "deadline"])
    @pytest.mark.parametrize("holding", [False, True], ids=["append", "lock-and-append"])
    async def test_a_caller_that_stops_waiting_leaves_at_once_and_nothing_is_written(
        self, store: SQLiteSessionStore, how: str, holding: bool
    ) -> None:
        async def write() -> None:
            if holding:
                async with store.lock("s"):
                    await store.append("s", [Message.user("secret words")])
            else:
                await store.append("s", [Message.user("secret words")])

        with locked(Path(store.path)):
            assert await stopped(how, write) < 0.3 + LATE
            # The worker thread stops too, while the database is still locked.
            assert await threads_end()
            assert await texts(store) == ["before"]
        await anyio.sleep(0.1)
        assert await texts(store) == ["before"]
        with anyio.fail_after(LATE):
            async with store.lock("s"):
                await store.append("s", [Message.user("after")])
        assert await texts(store) == ["before", "after"]

    async def test_a_read_behind_a_stopped_call_is_not_held_up(
        self, store: SQLiteSessionStore
    ) -> None:
        with locked(Path(store.path)):
            await stopped("cancel", lambda: store.delete("s"))
            with anyio.fail_after(LATE):
                assert await texts(store) == ["before"]

    async def test_a_run_cancelled_on_a_locked_database_ends_within_its_grace(
        self, store: SQLiteSessionStore
    ) -> None:
        class Graceful(Agent):
            cleanup_grace = 0.2

        agent = Graceful(model=ScriptedModel([text_response("never")]), session_store=store)
        with locked(Path(store.path)):
            assert await stopped("cancel", lambda: agent.run("hi", session_id="s")) < 0.5 + LATE
            assert await threads_end()
        assert await texts(store) == ["before"]


class TestThreads:
    async def test_sync_tools_past_their_timeout_do_not_hold_up_the_store(
        self, store: SQLiteSessionStore
    ) -> None:
        release = threading.Event()
        try:
            started = time.monotonic()
            result = await blocking_agent(store, release).run("go", session_id="s", timeout=10)
            assert time.monotonic() - started < 0.1 + LATE
        finally:
            release.set()
        assert result.output == "done"
        assert await store.load("s") == result.messages

    async def test_calls_do_not_need_the_default_thread_limiter(
        self, store: SQLiteSessionStore
    ) -> None:
        async with default_threads_taken():
            with anyio.fail_after(LATE):
                await store.append("s", [Message.user("more")])
                assert await texts(store) == ["before", "more"]
                assert await store.list_sessions() == ("s",)
                await store.delete("s")
                await store.aclose()


class TestDamageIsLocated:
    async def test_a_damaged_message_names_the_store_session_and_position(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("s", [Message.user("fine"), Message.assistant("soon damaged")])
            raw(path, "UPDATE littleghost_messages SET body = 'nonsense' WHERE position = 1")
            with pytest.raises(CorruptSessionStoreError) as caught:
                await store.load("s")
        assert str(caught.value).startswith(
            f"SQLite session store {str(path)!r}, session 's', message at position 1: "
        )
        assert caught.value.session_id == "s"

    async def test_a_length_that_disagrees_with_the_messages_is_damage(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "s.db"
        async with SQLiteSessionStore(path) as store:
            await store.append("s", [Message.user("one"), Message.assistant("two")])
            raw(path, "UPDATE littleghost_sessions SET length = 1")
            with pytest.raises(CorruptSessionStoreError, match=r"session 's'.*length \(1\)"):
                await store.load("s")
            with pytest.raises(CorruptSessionStoreError, match=r"session 's'.*length \(1\)"):
                await store.append("s", [Message.user("three")])
            with pytest.raises(CorruptSessionStoreError, match=r"length \(1\).*position 1 on"):
                await store.load_page("s", 1, 5)  # a page of a log longer than its length
            assert len((await store.load_page("s", 0, 1)).messages) == 1  # within it
        assert raw(path, "SELECT count(*) FROM littleghost_messages") == [(2,)]


class TestPrivateDatabase:
    async def test_a_closed_private_database_is_not_silently_reopened_empty(self) -> None:
        async with SQLiteSessionStore(":memory:") as store:
            await store.append("s", [Message.user("kept only here")])
        with pytest.raises(SessionStoreError, match="was closed"):
            await store.load("s")
        with pytest.raises(SessionStoreError, match="was closed"):
            await store.list_sessions()

    async def test_a_closed_file_store_opens_again(self, tmp_path: Path) -> None:
        store = SQLiteSessionStore(tmp_path / "s.db")
        await store.append("s", [Message.user("kept")])
        await store.aclose()
        assert [message.text for message in await store.load("s")] == ["kept"]
        await store.aclose()


class TestUnclosed:
    """Python 3.13 reports an SQLite connection left unclosed (a ``ResourceWarning``, an
    error under ``-W error``): a store nobody closed closes its own."""

    async def test_a_store_collected_unclosed_closes_its_connection(self, tmp_path: Path) -> None:
        store = SQLiteSessionStore(tmp_path / "s.db")
        await store.append("s", [Message.user("hi")])
        held: list[object] = [store]
        del store
        assert await collected_warnings(held) == []
        # Its last connection closed (SQLite defers it while a worker thread still holds
        # the call's statement, a moment on a loaded machine).
        assert await eventually(lambda: not (tmp_path / "s.db-wal").exists())

    def test_a_class_store_left_open_at_exit_closes_its_connection(self, tmp_path: Path) -> None:
        """The README's store, an agent class's, never closed: nothing reported at exit."""
        script = textwrap.dedent(
            """
            from littleghost import Agent
            from littleghost.sessions import SQLiteSessionStore
            from littleghost.testing import ScriptedModel, text_response

            class Support(Agent):
                model = ScriptedModel([text_response("It shipped.")])
                session_store = SQLiteSessionStore("sessions.db")

            Support().run_sync("Where is order 42?", session_id="customer-42")
            """
        )
        completed = subprocess.run(
            [sys.executable, "-W", "error", "-c", script],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        assert (completed.returncode, completed.stderr) == (0, "")


class TestPerFileTables:
    async def test_the_lock_tables_of_a_file_go_when_no_store_uses_it(self, tmp_path: Path) -> None:
        """A bot with one database per tenant does not keep a table per file forever."""
        from littleghost.sessions import filelock, locks

        def tables() -> tuple[list[object], list[str]]:
            here = str(tmp_path.resolve())
            shared = [key for key in list(locks._SHARED) if key[-1].startswith(here)]
            return shared, [path for path in list(filelock._FILES) if path.startswith(here)]

        for tenant in range(20):
            async with (
                SQLiteSessionStore(tmp_path / f"tenant-{tenant}.db") as store,
                store.lock("s"),
            ):
                await store.append("s", [Message.user("hi")])
        assert tables() != ([], [])  # the last store is still in use
        del store
        gc.collect()
        assert tables() == ([], [])
