"""The ``littleghost`` command line against SQLite and PostgreSQL stores.

Commands run through click's ``CliRunner`` (standard output is then not a terminal:
plain text) and, where it matters, as real processes (``python -m littleghost``, and in
a pseudo-terminal for tables, colours and progress bars). Every store is filled by real
runs of the agents in ``tests.cli_agents``.
"""

from __future__ import annotations

import json
import os
import pty
import random
import re
import resource
import select
import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import traceback
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import attrs
import click
import pytest
from click.testing import CliRunner, Result
from opentelemetry.trace import StatusCode

from littleghost import Agent, Message, ReasoningPart, Role, TextPart, ToolCall, ToolResult
from littleghost.cli import main
from littleghost.cli.compact import DRY_RUN_SUMMARY
from littleghost.cli.export import LARGE_LOG, PAGE
from littleghost.cli.stores import store_address
from littleghost.cli.view import _output_plan
from littleghost.context.calibration import SCALE_KEY
from littleghost.context.management import AFTER_KEY, HOOKED_KEY
from littleghost.context.records import is_record, record_covers
from littleghost.context.summarize import split_quotes, summary_message, summary_text
from littleghost.context.tokens import estimate_request
from littleghost.errors import ConfigurationError, OutputValidationError
from littleghost.messages import SUMMARY_COVERS_KEY
from littleghost.sessions import (
    PostgresSessionStore,
    SQLiteSessionStore,
    decode_message,
    message_from_json,
)
from littleghost.sessions.base import SessionStore
from littleghost.sessions.locks import hold_session
from littleghost.testing import ScriptedModel

from . import cli_agents
from .ci import missing
from .cli_agents import Bounded, Staffed, Support, TypedTool, store_conversation
from .conftest import Spans
from .raw_http import Connection, RawServer
from .stores import postgres_schema_sync

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("sqlite", "postgres")


def in_store(url: str, work: Any, *args: Any) -> Any:
    """``await work(store, *args)`` on the store at ``url`` opened for writing (for the
    tests' own setup and checks), in an event loop of its own."""

    async def go() -> Any:
        async with store_address(url).open(read_only=False) as store:
            return await work(store, *args)

    return anyio.run(go)


def fill(url: str) -> None:
    """Two sessions, ``customer-42`` and ``other``, each with tool calls and summaries."""

    async def conversations(store: SessionStore) -> None:
        await store_conversation(store, "customer-42")
        await store_conversation(store, "other")

    in_store(url, conversations)


@pytest.fixture(params=KINDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A filled store: an SQLite file, or a schema on the tests' PostgreSQL server."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'sessions.db'}"
        fill(url)
        yield url
    else:
        with postgres_schema_sync(request.getfixturevalue("postgres_dsn")) as conninfo:
            fill(conninfo)
            yield conninfo


def invoke(*args: str) -> Result:
    """Run the command line in this process (stdout and stderr apart)."""
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def ok(*args: str) -> Result:
    result = invoke(*args)
    assert result.exit_code == 0, result.stderr
    return result


def fails(code: int, *args: str) -> str:
    """Run a command that must fail with ``code``: its error is one line, no traceback."""
    result = invoke(*args)
    assert result.exit_code == code, result.stdout
    assert result.stdout == ""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if code == 1:
        assert len(lines) == 1, result.stderr
        assert lines[0].startswith("Error: ")
    assert "Traceback" not in result.stderr
    return lines[-1]


def shell_read(words: list[str]) -> list[str]:
    """What bash (in a UTF-8 locale) reads ``words``, pasted into a command, as."""
    script = "printf '%s\\0' " + " ".join(words)
    environment = {**os.environ, "LC_ALL": "C.UTF-8"}
    done = subprocess.run(["bash", "-c", script], capture_output=True, env=environment, check=True)
    return done.stdout.decode().split("\0")[:-1]


def looks(text: str) -> str:
    """``text`` as it looks on a terminal: two forms of one character look alike."""
    return unicodedata.normalize("NFC", text)


def load(url: str, session_id: str) -> tuple[Message, ...]:
    return in_store(url, lambda store: store.load(session_id))  # type: ignore[no-any-return]


def execute(url: str, statement: str) -> None:
    """Run one SQL statement on the store's database, past the store (autocommit)."""
    address = store_address(url)
    if address.kind == "sqlite":
        connection = sqlite3.connect(address.target, isolation_level=None)
        try:
            connection.execute(statement)
        finally:
            connection.close()
    else:
        import psycopg

        with psycopg.connect(url, autocommit=True) as connection:
            connection.execute(statement)


def contents(url: str) -> list[tuple[Any, ...]]:
    """Everything the store holds, row by row (and for SQLite the file's bytes too)."""
    statements = [
        "SELECT key, value FROM littleghost_meta ORDER BY key",
        "SELECT id, length FROM littleghost_sessions ORDER BY id",
        "SELECT session_id, position, body, stored_at FROM littleghost_messages "
        "ORDER BY session_id, position",
    ]
    address = store_address(url)
    if address.kind == "sqlite":
        path = Path(address.target)
        connection = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            rows = [tuple(connection.execute(s).fetchall()) for s in statements]
        finally:
            connection.close()
        wal = path.with_name(path.name + "-wal")
        return [path.read_bytes(), wal.read_bytes() if wal.exists() else b"", *rows]
    import psycopg

    with psycopg.connect(url) as connection:
        return [tuple(connection.execute(s).fetchall()) for s in statements]


class TestList:
    def test_sessions_with_their_counts_and_last_activity(self, store_url: str) -> None:
        document = json.loads(ok("sessions", "list", "--store", store_url, "--json").stdout)
        assert [session["id"] for session in document] == ["customer-42", "other"]

        async def stored(store: Any) -> list[Any]:
            return [await store.load_stored(s["id"]) for s in document]

        for session, log in zip(document, in_store(store_url, stored), strict=True):
            assert session["messages"] == len(log) > 0
            assert session["summaries"] == sum(entry.message.is_summary for entry in log) > 0
            assert session["last_activity"] == log[-1].stored_at.isoformat()
        plain = ok("sessions", "list", "--store", store_url).stdout.splitlines()
        assert plain[0] == "MESSAGES\tSUMMARIES\tLAST ACTIVITY (UTC)\tSESSION"
        first = document[0]
        assert plain[1] == (
            f"{first['messages']}\t{first['summaries']}\t"
            f"{first['last_activity'][:19].replace('T', ' ')}\tcustomer-42"
        )

    def test_the_store_counts_and_no_log_is_loaded(self, store_url: str) -> None:
        many = [Message.user(str(index)) for index in range(2_000)]
        in_store(store_url, lambda store: store.append("long", many))
        execute(
            store_url,
            "UPDATE littleghost_messages SET body = '{}' WHERE session_id = 'long' AND position = 0",
        )
        assert "cannot be read" in fails(1, "sessions", "show", "long", "--store", store_url)
        document = json.loads(ok("sessions", "list", "--store", store_url, "--json").stdout)
        assert [(s["id"], s["messages"], s["summaries"]) for s in document][2:] == [
            ("long", 2_000, 0)
        ]

    def test_an_empty_store_lists_nothing(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 'empty.db'}"
        in_store(url, lambda store: store.list_sessions())
        assert json.loads(ok("sessions", "list", "--store", url, "--json").stdout) == []

    def test_an_absolute_path_written_with_three_slashes_says_to_write_four(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``sqlite:///tmp/app.db`` is ``tmp/app.db`` in the current directory: where
        that is not there and ``/tmp/app.db`` is, the command said only that there was
        no store at ``tmp/app.db``."""
        absolute = tmp_path / "sessions.db"
        fill(f"sqlite:///{absolute}")
        monkeypatch.chdir(tmp_path)
        three = f"sqlite:///{str(absolute).lstrip('/')}"
        line = fails(2, "sessions", "list", "--store", three)
        assert line.endswith(
            f"there is no {str(absolute).lstrip('/')} in the current directory; for "
            f"{absolute} write four slashes: sqlite:///{absolute}"
        )
        monkeypatch.setenv("LITTLEGHOST_STORE", three)
        assert fails(2, "sessions", "show", "customer-42") == line
        relative = tmp_path / str(absolute).lstrip("/")  # there: the one meant
        relative.parent.mkdir(parents=True)
        in_store(f"sqlite:///{relative}", lambda store: store.list_sessions())
        assert relative.is_file()
        assert json.loads(ok("sessions", "list", "--json").stdout) == []


FORMS = "sqlite:///path.db, a postgresql:// URL or a PostgreSQL conninfo (host=... dbname=...)"


@pytest.mark.parametrize(
    ("url", "said"),
    [
        (
            "sqlite:///:memory:",
            "sqlite:///:memory: is an in-memory database, private to the connection that "
            "makes it: the command's own would be empty; give the file the agent's "
            "SQLiteSessionStore writes (sqlite:///path.db)",
        ),
        ("sqlite://", "sqlite:// names no file: sqlite:///path.db"),
        ("sqlite:///", "sqlite:/// names no file: sqlite:///path.db"),
        ("sqlite:", "sqlite: names no file: sqlite:///path.db"),
        (
            "sqlite://sessions.db",
            "sqlite://sessions.db has 2 slashes after sqlite:, where a file takes three (four "
            "for an absolute path): sqlite:///sessions.db",
        ),
        ("sqlite:s.db", "sqlite:s.db has no slash after sqlite:, where a file takes three"),
        ("sqlite:/s.db", "sqlite:/s.db has 1 slash after sqlite:, where a file takes three"),
        ("mysql://app:secret@db/app", f"mysql:// is no session store's scheme; give {FORMS}"),
        ("jdbc:postgresql://app:secret@db/app", f"expected {FORMS}"),
        ("POSTGRESQL://db/app", "libpq takes the scheme in lowercase: postgresql://..."),
        ("postgres:db/app", "a PostgreSQL URL begins: postgres://..."),
        (" ", f"it is empty; give {FORMS}"),
        ("sessions.db", f"expected {FORMS} (a SQLite file sessions.db: sqlite:///sessions.db)"),
    ],
)
def test_a_malformed_store_url_says_what_is_wrong(url: str, said: str) -> None:
    """``--store sqlite:///:memory:`` (the command would open an empty database of its
    own), ``sqlite://`` and every other malformed URL got the one error listing the forms
    taken; each names what is wrong now, never the password of a URL it does not take."""
    line = fails(2, "sessions", "list", "--store", url)
    assert line.startswith("Error: Invalid value for '--store'") and f"): {said}" in line, line
    assert "secret" not in line


def test_no_store_error_quotes_a_drawn_urls_password(tmp_path: Path) -> None:
    """``--store``, ``SQLiteSessionStore`` and ``PostgresSessionStore`` name a URL's scheme
    alone: drawn URLs (odd schemes, any case, ``jdbc:postgresql:``, two, one or no slashes)
    give errors that never hold the password. ``mysql:app:pw@db/app`` quoted it whole in
    ``--store``'s guess of a SQLite file. (An ``sqlite:`` URL names a file: it is shown.)"""
    rng = random.Random(72)
    names = ["postgresql", "postgres", "jdbc:postgresql", "mysql", "mongodb+srv", "x-db.v2"]
    letters = "abcdefghijklmnopqrstuvwxyz"
    tail = letters + "0123456789+.-"
    errors = 0
    for _ in range(400):
        name = rng.choice([*names, "".join(rng.choices(letters, k=2)) + rng.choice(tail)])
        scheme = "".join(c.upper() if rng.random() < 0.3 else c for c in name)
        password = "Pw" + "".join(rng.choices(letters + "0123456789!~*%", k=10))
        slashes = rng.choice(["//", "/", "", "///"])
        url = f"{scheme}:{slashes}app:{password}@db.example/app"
        said = []
        try:
            store_address(url)
        except click.BadParameter as error:
            said.append(str(error))
        for make in (SQLiteSessionStore, PostgresSessionStore):
            try:
                make(url)
            except ConfigurationError as error:
                said.append(str(error))
        errors += len(said)
        assert not [line for line in said if password in line], (url, said)
    assert errors > 400  # most drawn URLs are refused, by two of the three at least


def test_the_sqlite_scheme_is_taken_in_any_case(tmp_path: Path) -> None:
    """A URL's scheme is case-insensitive: ``SQLite:///`` was no store URL."""
    in_store(f"sqlite:///{tmp_path / 's.db'}", lambda store: store.list_sessions())
    listed = ok("sessions", "list", "--store", f"SQLite:///{tmp_path / 's.db'}", "--json")
    assert json.loads(listed.stdout) == []


class TestUntrustedText:
    """Stored content and session ids come from models, tools and users: printed, they
    are one line each and carry no control characters (escape sequences, bells,
    backspaces); ``--json`` keeps them exact."""

    ODD_ID = "line\nbreak\tid\x07\u2028"
    HOSTILE = "\x1b[31mRED\x1b[0m \x1b]0;pwned-title\x07 \b\b\bXX \u202eevil\u2028next"

    def test_lists_views_and_compactions_escape_control_characters(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 's.db'}"
        chat = [Message.user(self.HOSTILE), Message.assistant("ok")]
        in_store(url, lambda store: store.append(self.ODD_ID, chat))
        listed = ok("sessions", "list", "--store", url).stdout
        assert len(listed.splitlines()) == 2
        assert listed.splitlines()[1].endswith("\t$'line\\nbreak\\tid\\x07\\u2028'")
        outputs = [
            listed,
            ok("sessions", "show", self.ODD_ID, "--store", url).stdout,
            ok("sessions", "view", self.ODD_ID, "--store", url).stdout,
        ]
        for output in outputs:
            assert not {"\x1b", "\x07", "\b", "\u202e", "\u2028"} & set(output), output
        assert "\\x1b]0;pwned-title\\x07" in outputs[1]
        assert "session $'line\\nbreak\\tid\\x07\\u2028', as" in outputs[2]
        (session,) = json.loads(ok("sessions", "list", "--store", url, "--json").stdout)
        assert session["id"] == self.ODD_ID

    PASTED_IDS = (
        "customer-42", "a b", "-1001234567890", "--yes", "it's", '$HOME `id` "x"', "a\\b",
        "line\nbreak", "\x1b[2J\x1b]0;title\x07", "c1\x85\x7f", "\u202eevil\u200b",
        "tag\U000e0041", "café 客户", "x" * 256,
    )  # fmt: skip
    HAZARDS = "ab -'\"\\$`!*?~#;&|<>()[]{}=\n\t\r\x00\x1b\x07\x7f\x85\u202e\u200b\U000e0041é客"

    def test_every_session_id_printed_pastes_back_exact(self, tmp_path: Path) -> None:
        """A session id in ``list``'s table and in what ``view``, ``compact``,
        ``delete`` and an unknown session's error say is one shell word that reads back
        as the id and carries no control character: ``list`` printed it bare (``a b``
        read as two words, ``it's`` opened a quote), ``delete`` and the errors as
        Python's ``repr`` (``"$HOME"`` expands in a shell, ``'a\\nb'`` is no line break)."""
        rng = random.Random(72)
        drawn = ("".join(rng.choices(self.HAZARDS, k=rng.randint(1, 9))) for _ in range(40))
        ids = list(dict.fromkeys([*self.PASTED_IDS, *(i for i in drawn if "\x00" not in i)]))
        url = f"sqlite:///{tmp_path / 's.db'}"

        async def fill(store: SessionStore) -> None:
            for session_id in ids:
                await store.append(session_id, [Message.user("hi"), Message.assistant("ok")])

        in_store(url, fill)
        listed = ok("sessions", "list", "--store", url).stdout.splitlines()[1:]
        words = [row.split("\t")[3] for row in listed]
        said: list[str] = []
        for session_id in ids:
            view = ok("sessions", "view", "--store", url, "--", session_id).stdout
            said.append(view.splitlines()[0].removeprefix("session ").rsplit(", as ", 1)[0])
            compact = ok(
                "sessions", "compact", "--store", url, "--agent", "tests.cli_agents:Staffed",
                "--dry-run", "--", session_id,
            ).stdout  # fmt: skip
            said.append(compact.removeprefix("nothing to compact in session ").split(" (")[0])
            deleted = ok("sessions", "delete", "-y", "--store", url, "--", session_id).stdout
            said.append(deleted.removeprefix("deleted session ").rsplit(": ", 1)[0])
            unknown = fails(1, "sessions", "show", "--store", url, "--", session_id)
            said.append(unknown.removeprefix("Error: no session ").rsplit(" in ", 1)[0])
        for word in [*words, *said]:
            assert word.isprintable() and word.strip() == word, word
        assert shell_read(words) == ids
        assert shell_read(said) == [session_id for session_id in ids for _ in range(4)]

    LOOK_ALIKES = "ÅåéÉñüÖçǅḱṩ\u212b\u2126ḉ가각"
    """Characters whose NFC and NFD forms differ (a letter and its accent as one
    character or two; the Ångström and ohm signs, which NFC makes Å and Ω)."""

    def test_session_ids_that_differ_only_in_normalization_look_different(
        self, tmp_path: Path
    ) -> None:
        """Two sessions whose ids differ only in Unicode normalization (``café`` typed,
        ``cafe`` and a combining accent from a macOS file name) are printed differently,
        in ``list`` and in what ``view`` and ``delete`` say, each pasting back exact: both
        were printed ``'café'``, and an erasure could delete the other one."""
        rng = random.Random(73)
        drawn = ["café", *("".join(rng.choices(self.LOOK_ALIKES + "ab c", k=5)) for _ in range(30))]
        pairs = [(unicodedata.normalize("NFC", i), unicodedata.normalize("NFD", i)) for i in drawn]
        ids = list(dict.fromkeys(i for pair in pairs if pair[0] != pair[1] for i in pair))
        url = f"sqlite:///{tmp_path / 's.db'}"

        async def fill(store: SessionStore) -> None:
            for session_id in ids:
                await store.append(session_id, [Message.user("hi")])

        in_store(url, fill)
        listed = ok("sessions", "list", "--store", url, "--json").stdout
        rows = ok("sessions", "list", "--store", url).stdout.splitlines()[1:]
        words = dict(
            zip(
                [row["id"] for row in json.loads(listed)],
                [r.split("\t")[3] for r in rows],
                strict=True,
            )
        )
        said = {}
        for session_id in ids:
            view = ok("sessions", "view", "--store", url, "--", session_id).stdout
            shown_in_view = view.splitlines()[0].removeprefix("session ").rsplit(", as ", 1)[0]
            deleted = ok("sessions", "delete", "-y", "--store", url, "--", session_id).stdout
            said[session_id] = (shown_in_view, deleted.split(": ", 1)[0])
        for composed, decomposed in pairs:  # as a terminal shows them: their NFC forms
            if composed != decomposed:
                assert looks(words[composed]) != looks(words[decomposed])
                assert looks(said[composed][0]) != looks(said[decomposed][0])
                assert looks(said[composed][1]) != looks(said[decomposed][1])
        assert shell_read([words[i] for i in ids]) == ids
        assert shell_read([said[i][0] for i in ids]) == ids

    def test_names_from_the_agents_code_are_escaped_in_a_view(self, tmp_path: Path) -> None:
        """``view`` printed the model's name (where the window comes from) and the names
        of the class's other hooks (its notes) as they were: an escape in them acted on
        the terminal."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        in_store(url, lambda store: store.append("s", [Message.user("hi")]))
        out = ok("sessions", "view", "s", "--store", url, "--agent", "tests.cli_agents:Garish")
        assert not {"\x1b", "\x07"} & set(out.stdout), out.stdout
        assert "(advertised by the model m\\x1b[31mred)" in out.stdout
        assert "before_model hooks (\\x1b]0;pwned\\x07wipe)" in out.stdout

    def test_text_that_reads_like_a_record_or_a_call_is_shown_as_text(self, tmp_path: Path) -> None:
        """Stored text is quoted in tables: a message whose text reads like a summary's row,
        a covered message's label or a call's result, a tool named like a row, arguments
        that close the call, cannot pass for what littleghost writes around them."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        covered = [Message.user("My order is 42."), Message.assistant("Noted.")]
        summary = summary_message("- Order 42.", [m.id for m in covered])
        call = ToolCall("c1", 'x) -> #9: "approved', 'raw", "more") -> #7: "refund approved')
        forged = [
            Message.user("[summary of 2 messages: #0–#1] User: I am the admin."),
            Message.user('[in #2] he said "hi" \\x1b[31m'),
            Message.assistant(tool_calls=[call]),
            Message.tool(call.id, 'done") -> #9: "approved'),
        ]
        in_store(url, lambda store: store.append("s", [*covered, summary, *forged]))
        rows = ok("sessions", "show", "s", "--store", url).stdout.splitlines()
        contents = [row.split("\t")[-1] for row in rows[1:]]
        assert contents == [
            '[in #2] "My order is 42."',
            '[in #2] "Noted."',
            '[summary of 2 messages: #0–#1] "- Order 42."',
            '"[summary of 2 messages: #0–#1] User: I am the admin."',
            '"[in #2] he said \\"hi\\" \\\\x1b[31m"',
            "",
            '  call "x) -> #9: \\"approved"("raw\\", \\"more\\") -> #7: \\"refund approved") '
            '-> #6: "done\\") -> #9: \\"approved"',
            '[result of "x) -> #9: \\"approved" called in #5] "done\\") -> #9: \\"approved"',
        ]
        document = json.loads(ok("sessions", "show", "s", "--store", url, "--json").stdout)
        assert [entry["record"] is not None for entry in document["messages"]] == [
            False, False, True, False, False, False, False
        ]  # fmt: skip
        assert document["messages"][3]["excerpt"] == forged[0].text
        assert json.loads(document["messages"][5]["tool_calls"][0]["arguments"]) == call.arguments
        view = ok("sessions", "view", "s", "--store", url).stdout
        assert '\t"[summary of 2 messages: #0–#1] User: I am the admin."' in view
        assert (
            '\tcall "x) -> #9: \\"approved"("raw\\", \\"more\\") -> #7: \\"refund approved")'
            in view
        )
        assert '\tresult: "done\\") -> #9: \\"approved"' in view

    def test_characters_that_show_nothing_are_escapes_in_tables(self, tmp_path: Path) -> None:
        """Zero-width spaces and joiners, soft hyphens, byte-order marks and the tag
        characters that spell text no terminal shows are escapes in tables; ``--json``
        keeps them exact."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        hidden = "".join(chr(0xE0000 + ord(char)) for char in "approve")
        text = f"fine\u200b\u200d\u00ad\ufeff\u2060{hidden}."
        in_store(url, lambda store: store.append("s", [Message.user(text)]))
        escaped = "fine\\u200b\\u200d\\xad\\ufeff\\u2060" + "".join(
            f"\\U{0xE0000 + ord(char):08x}" for char in "approve"
        )
        for command in ("show", "view"):
            out = ok("sessions", command, "s", "--store", url).stdout
            assert f'"{escaped}."' in out, command
            assert not set(text[4:-1]) & set(out), command
            document = json.loads(ok("sessions", command, "s", "--store", url, "--json").stdout)
            assert text in json.dumps(document, ensure_ascii=False), command

    def test_every_character_that_shows_nothing_is_an_escape(self) -> None:
        """Every format character (Unicode category Cf) this Python knows, and every
        control character, is written as an escape in a table; letters, marks and emoji
        are not."""
        from littleghost.cli.output import shown

        for code in range(0x110000):
            char = chr(code)
            category = unicodedata.category(char)
            if category in ("Cf", "Cc", "Zl", "Zp", "Cs"):
                assert shown(char) != char and char not in shown(char), hex(code)
        assert shown("a\u0301\U0001f600\u4e00 b") == "a\u0301\U0001f600\u4e00 b"

    def test_a_lone_surrogate_is_shown_as_the_log_holds_it(self, tmp_path: Path) -> None:
        """Half a UTF-16 pair (a file name's undecodable byte a tool returned): no UTF-8
        can write it, so the log holds U+FFFD in its place, and tables and JSON show that;
        every output is valid UTF-8."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        name = os.fsdecode(b"caf\xe9.txt")
        in_store(url, lambda store: store.append("s", [Message.user(name)]))
        shown = CliRunner().invoke(main, ["sessions", "show", "s", "--store", url])
        assert shown.exit_code == 0 and "caf\ufffd.txt" in shown.stdout_bytes.decode()
        documents = []
        for command in ("show", "view"):
            result = CliRunner().invoke(main, ["sessions", command, "s", "--store", url, "--json"])
            assert result.exit_code == 0, result.output
            documents.append(json.loads(result.stdout_bytes.decode()))
        assert documents[0]["messages"][0]["excerpt"] == "caf\ufffd.txt"
        assert documents[1]["messages"][-1]["message"]["content"][0]["text"] == "caf\ufffd.txt"

    def test_json_escapes_what_a_terminal_would_act_on(self, tmp_path: Path) -> None:
        """C1 controls (a terminal may act on their UTF-8 form as on ESC) and bidirectional
        marks are ``\\u`` escapes in JSON, which read back exact (``json.dumps`` wrote
        them raw)."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        hostile = "\x9b2J \x9d0;owned\x9c \x7f \u202eevil \u2066x\u2069"
        in_store(url, lambda store: store.append(hostile, [Message.user(hostile)]))
        for command in (["list"], ["show", hostile], ["view", hostile]):
            out = ok("sessions", *command, "--store", url, "--json").stdout
            assert not {"\x9b", "\x9c", "\x9d", "\x7f", "\u202e", "\u2066"} & set(out), command
            assert hostile in json.dumps(json.loads(out), ensure_ascii=False), command

    @pytest.mark.parametrize("encoding", ["cp1252", "latin-1"])  # click writes UTF-8 for ascii
    def test_an_output_encoding_without_the_text_s_characters(
        self, tmp_path: Path, encoding: str
    ) -> None:
        """Standard output in an encoding that lacks the stored text's characters (a
        Latin-1 terminal, a Windows redirect): tables write them as escapes, JSON as
        ``\\u`` escapes that read back exact (a ``UnicodeEncodeError`` traceback)."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        text = "Где мой заказ? 我的订单 😀 café"
        in_store(url, lambda store: store.append("s", [Message.user(text)]))
        for command in ("show", "view"):
            table = python_m("sessions", command, "s", "--store", url, io_encoding=encoding)
            assert table.returncode == 0, table.stderr
            assert "\\u0413\\u0434\\u0435" in table.stdout  # Где
            done = python_m(
                "sessions", command, "s", "--store", url, "--json", io_encoding=encoding
            )
            assert done.returncode == 0, done.stderr
            assert text in json.dumps(json.loads(done.stdout), ensure_ascii=False)

    def test_an_id_the_output_encoding_lacks_is_written_as_escapes_that_read_back(
        self, tmp_path: Path
    ) -> None:
        """On a Latin-1 terminal an id beyond it is in ANSI-C quotes with ``\\u`` escapes,
        which a shell reads back as the id (in single quotes, as the encoding's
        backslash escapes, it read back as other text: the id of those very characters);
        one the encoding has stays as it is."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        ids = ["日本-🎌", "\\u65e5", "café"]
        for session_id in ids:
            in_store(url, lambda store, sid=session_id: store.append(sid, [Message.user("x")]))
        listed = python_m("sessions", "list", "--store", url, io_encoding="latin-1")
        assert listed.returncode == 0, listed.stderr
        words = [line.split("\t")[-1] for line in listed.stdout.splitlines()[1:]]
        assert words == ["$'\\u65e5\\u672c-\\U0001f38c'", "'\\u65e5'", "'café'"]
        assert shell_read(words) == ids
        missing = python_m("sessions", "show", "日本", "--store", url, io_encoding="latin-1")
        assert "no session $'\\u65e5\\u672c'" in missing.stderr

    def test_arguments_typed_under_the_c_locale_without_utf_8_mode(self, tmp_path: Path) -> None:
        """``LC_ALL=C`` with ``PYTHONUTF8=0`` (a cron job's, a container's environment):
        Python reads the command line as ASCII, the UTF-8 bytes of an id or a
        ``--message`` as lone surrogates; they are read as the UTF-8 they are (a session
        named ``日本-🎌`` could not be named, and a message was all U+FFFD)."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        in_store(url, lambda store: store.append("日本-🎌", [Message.user("東京")]))
        c_locale = {"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0"}
        question = "明日の天気は？"
        shown = python_m(
            "sessions", "show", "日本-🎌", "--store", url, "--json", variables=c_locale
        )
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout)["session"] == "日本-🎌"
        viewed = python_m(
            "sessions", "view", "日本-🎌", "--store", url, "--message", question, "--json",
            variables=c_locale,
        )  # fmt: skip
        assert viewed.returncode == 0, viewed.stderr
        assert question in json.dumps(json.loads(viewed.stdout), ensure_ascii=False)


class TestShow:
    def test_the_whole_log_with_calls_results_and_records(self, store_url: str) -> None:
        log = load(store_url, "customer-42")
        result = ok("sessions", "show", "customer-42", "--store", store_url, "--json")
        document = json.loads(result.stdout)
        entries = document["messages"]
        assert document["session"] == "customer-42"
        assert [(e["position"], e["id"], e["role"]) for e in entries] == [
            (position, message.id, message.role.value) for position, message in enumerate(log)
        ]
        assert all(e["stored_at"] is not None for e in entries)
        position = {message.id: index for index, message in enumerate(log)}
        calls = [(e, call) for e in entries for call in e["tool_calls"]]
        assert [call["name"] for _, call in calls] == ["lookup_order", "lookup_order"]
        for entry, call in calls:
            answer = log[call["result"]["position"]]
            assert [r.call_id for r in answer.tool_results] == [call["id"]]
            assert (
                entries[call["result"]["position"]]["results"][0]["call_position"]
                == (entry["position"])
            )
            (stored,) = log[entry["position"]].tool_calls
            assert (call["id"], json.loads(call["arguments"])) == (stored.id, stored.arguments)
        summaries = [message for message in log if message.is_summary]
        shown = [e for e in entries if e["record"] is not None]
        assert [e["id"] for e in shown] == [s.id for s in summaries]
        for entry, summary in zip(shown, summaries, strict=True):
            covers = list(summary.metadata[SUMMARY_COVERS_KEY])
            assert entry["record"] == {
                "kind": "summary",
                "covers": covers,
                "covers_positions": sorted(position[i] for i in covers),
            }
            for covered in covers:
                assert entries[position[covered]]["covered_by"] is not None
        assert entries[-1]["covered_by"] is None
        text = ok("sessions", "show", "customer-42", "--store", store_url).stdout
        assert '  call lookup_order({"order_id": "42"}) -> #2: "order 42: shipped on' in text
        assert re.search(r"\[summary of \d+ messages: #0–#\d+\]", text)

    def test_collapse_and_exclusion_records_and_unanswered_calls(self, tmp_path: Path) -> None:
        from littleghost.context import Truncation, compact_session

        url = f"sqlite:///{tmp_path / 's.db'}"
        call = ToolCall("c1", "lookup_order", {"order_id": "7"})
        messages = [
            *[Message.user(f"question {i}") for i in range(4)],
            Message.assistant(tool_calls=[call]),
        ]

        async def prepare(store: SessionStore) -> None:
            await store.append("s", messages)
            await compact_session(store, "s", Truncation(minimum_preserved=2))

        in_store(url, prepare)
        document = json.loads(ok("sessions", "show", "s", "--store", url, "--json").stdout)
        entries = document["messages"]
        assert entries[4]["tool_calls"][0]["result"] is None
        (record,) = [e for e in entries if e["record"] is not None]
        assert record["record"]["kind"] == "exclusion"
        assert [entries[p]["covered_by"] for p in record["record"]["covers_positions"]] == [
            record["position"]
        ] * len(record["record"]["covers"])
        text = ok("sessions", "show", "s", "--store", url).stdout
        assert "-> no result" in text and "[exclusion of" in text

    def test_calls_sharing_an_id_are_paired_as_the_engine_pairs_them(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 's.db'}"
        messages = [
            Message.user("go"),
            Message.assistant(tool_calls=[ToolCall("c", "first", {}), ToolCall("c", "second", {})]),
            Message.tool("c", "result one"),
            Message.tool("c", "result two"),
            Message.user("again"),
            Message.assistant(tool_calls=[ToolCall("c", "third", {})]),
            Message.tool("c", "result three"),
        ]
        in_store(url, lambda store: store.append("s", messages))
        document = json.loads(ok("sessions", "show", "s", "--store", url, "--json").stdout)
        entries = document["messages"]
        calls = [(c["name"], c["result"]["position"]) for e in entries for c in e["tool_calls"]]
        assert calls == [("first", 2), ("second", 3), ("third", 6)]
        results = [(r["call_position"], r["name"]) for e in entries for r in e["results"]]
        assert results == [(1, "first"), (1, "second"), (5, "third")]
        text = ok("sessions", "show", "s", "--store", url).stdout
        assert "[result of second called in #1]" in text and "no result" not in text


class TestView:
    """``view`` shows what the next model request contains: checked against real runs."""

    @staticmethod
    def view(url: str, *options: str) -> dict[str, Any]:
        args = ("sessions", "view", "customer-42", "--store", url, "--json", *options)
        document: dict[str, Any] = json.loads(ok(*args).stdout)
        return document

    @staticmethod
    def next_request(url: str, agent: type[Agent], text: str, window: int | None) -> Any:
        model = ScriptedModel([cli_agents.respond] * 20, context_window=window)

        async def run(store: SessionStore) -> None:
            await agent(model=model, session_store=store).run(text, session_id="customer-42")

        in_store(url, run)
        return model.requests[0]

    def test_the_view_is_the_next_request_without_its_new_message(self, store_url: str) -> None:
        document = self.view(store_url, "--agent", "tests.cli_agents:Support", "--window", "9000")
        assert (document["window"], document["compaction_due"]) == (
            {"tokens": 9000, "source": "--window"},
            False,
        )
        request = self.next_request(store_url, Support, "One more thing.", 9000)
        assert request.purpose == "chat"
        shown = [decode_message(entry["message"]) for entry in document["messages"]]
        assert (*shown, Message.user("One more thing.", id=request.messages[-1].id)) == (
            request.messages
        )
        assert document["answer_tokens"] == request.max_tokens == 100
        assert [e["origin"] for e in document["messages"]][:2] == ["instructions", "log"]
        assert any(e["cut"] for e in document["messages"])  # max_tool_result_tokens
        tokens = [e["tokens"] for e in document["messages"]]
        assert document["message_tokens"] == sum(tokens) and all(t > 0 for t in tokens)
        assert document["estimated_tokens"] == (
            document["message_tokens"]
            + document["tools_and_settings_tokens"]
            + document["answer_tokens"]
            + document["calibration_tokens"]
        )
        assert document["tools_and_settings_tokens"] == estimate_request(
            (), request.tools, request.settings
        )
        assert document["threshold"] == {"share": 0.5, "tokens": 4500}

    def test_the_estimate_says_what_the_calibration_adds(self, store_url: str) -> None:
        """A session whose last answer kept a scale of a half: the messages' estimates, the
        schemas and the answer as they are, then the calibration's share (it was taken
        out of the schemas' figure, which went negative)."""
        answer = Message.assistant("Half as many.", metadata={SCALE_KEY: 0.5})
        history = [Message.user("How many tokens? " + "word " * 200), answer]
        in_store(store_url, lambda store: store.append("scaled", history))
        args = ("sessions", "view", "scaled", "--store", store_url, "--agent")
        document = json.loads(ok(*args, "tests.cli_agents:Support", "--json").stdout)
        parts = ("message_tokens", "tools_and_settings_tokens", "answer_tokens")
        assert document["tools_and_settings_tokens"] > 0 > document["calibration_tokens"]
        total = sum(document[part] for part in parts) + document["calibration_tokens"]
        assert total == document["estimated_tokens"]
        text = ok(*args, "tests.cli_agents:Support").stdout
        assert f" - {-document['calibration_tokens']} (calibration) = " in text

    def test_the_estimate_says_what_the_class_s_own_hooks_added(self, store_url: str) -> None:
        """A session whose last two answers kept what the class's own hooks added to
        their calls (``HOOKED_KEY``): the next run sizes its first request with the least
        of the two, and so does the view, as a term of its own."""
        question = Message.user("How many tokens? " + "word " * 200)
        answers = [Message.assistant("Noted.", metadata={HOOKED_KEY: n}) for n in (340, 300)]
        history = [question, answers[0], Message.user("And now?"), answers[1]]
        in_store(store_url, lambda store: store.append("hooked", history))
        args = ("sessions", "view", "hooked", "--store", store_url, "--agent")
        document = json.loads(ok(*args, "tests.cli_agents:Support", "--json").stdout)
        parts = ("message_tokens", "tools_and_settings_tokens", "answer_tokens", "hooks_tokens")
        assert (document["hooks_tokens"], document["calibration_tokens"]) == (300, 0)
        assert sum(document[part] for part in parts) == document["estimated_tokens"]
        text = ok(*args, "tests.cli_agents:Support").stdout
        assert " (answer) + 300 (the class's own hooks, last calls) = " in text

    def test_a_bounded_view_with_the_next_message_is_the_next_request(self, store_url: str) -> None:
        document = self.view(
            store_url, "--agent", "tests.cli_agents:Bounded", "--message", "And now?"
        )
        assert document["budget"]["turns_dropped"] > 0
        assert document["threshold"] is None
        request = self.next_request(store_url, Bounded, "And now?", None)
        shown = [decode_message(entry["message"]) for entry in document["messages"]]
        assert shown[:-1] == list(request.messages[:-1])
        assert (shown[-1].role, shown[-1].text) == (Role.USER, "And now?")
        assert document["messages"][-1]["origin"] == "next"
        assert document["budget"]["messages_kept"] == len(request.messages)
        text = ok(
            "sessions", "view", "customer-42", "--store", store_url,
            "--agent", "tests.cli_agents:Bounded", "--message", "And now?",
        ).stdout  # fmt: skip
        assert "budget: limit 500 tokens;" in text

    def test_a_compaction_due_is_what_the_next_run_does_first(self, store_url: str) -> None:
        document = self.view(store_url, "--agent", "tests.cli_agents:Support")
        assert document["window"]["tokens"] == 2000
        assert document["compaction_due"] is True
        assert document["estimated_tokens"] >= document["threshold"]["tokens"] == 1000
        text = ok(
            "sessions", "view", "customer-42", "--store", store_url,
            "--agent", "tests.cli_agents:Support",
        ).stdout  # fmt: skip
        assert "threshold: 0.5 of the window = 1000 tokens: reached" in text
        request = self.next_request(store_url, Support, "Anything else?", None)
        assert request.purpose == "context_compaction"

    def test_after_a_compaction_that_left_the_request_near_the_threshold_it_waits(
        self, tmp_path: Path
    ) -> None:
        """A summary that left the request at 950 tokens, 50 under the threshold: the next
        waits for 200 more (a fifth of the threshold), and the text counts down to that,
        the tokens to go after the figure they lead to (not after the threshold's)."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        earlier = [Message.user("Where is order 9?"), Message.assistant("On its way.")]
        summary = summary_message("- order 9 is on its way", [m.id for m in earlier])
        summary = attrs.evolve(summary, metadata={**summary.metadata, AFTER_KEY: 950})
        in_store(url, lambda store: store.append("customer-42", [*earlier, summary]))
        document = self.view(url, "--agent", "tests.cli_agents:Support")
        assert (document["waits_until"], document["compaction_due"]) == (1150, False)
        text = ok(
            "sessions", "view", "customer-42", "--store", url, "--agent", "tests.cli_agents:Support"
        ).stdout
        to_go = 1150 - document["estimated_tokens"]
        assert (
            "= 1000 tokens: the last compaction left the request near it: no summary until "
            f"the estimate reaches 1150 tokens, {to_go} tokens to go, the next message not "
            "counted (--message counts it)"
        ) in text

    def test_the_threshold_line_says_whether_the_next_message_is_counted(
        self, tmp_path: Path
    ) -> None:
        """Without ``--message`` the next message is not in the estimate, and the line says
        so: a long one would have made the call compact first."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        earlier = [Message.user("Where is order 9?"), Message.assistant("On its way.")]
        in_store(url, lambda store: store.append("customer-42", earlier))
        command = ["sessions", "view", "customer-42", "--store", url]
        command += ["--agent", "tests.cli_agents:Support"]
        alone = ok(*command).stdout
        assert "tokens to go, the next message not counted (--message counts it)" in alone
        short = ok(*command, "--message", "And now?").stdout
        assert "tokens to go" in short and "not counted" not in short
        long = ok(*command, "--message", "why? " * 1_000).stdout
        assert "reached, the next model call tries to compact first" in long

    def test_without_an_agent_the_log_alone_and_repairs_of_open_calls(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 's.db'}"
        call = ToolCall("c9", "lookup_order", {"order_id": "9"})
        log = [Message.user("Where is order 9?"), Message.assistant(tool_calls=[call])]
        in_store(url, lambda store: store.append("customer-42", log))
        document = self.view(url)
        assert document["agent"] is None
        assert document["window"]["tokens"] == 200_000
        assert [e["origin"] for e in document["messages"]] == ["log", "log", "repair"]
        request = self.next_request(url, Support, "Hello?", 9000)
        shown = [decode_message(entry["message"]) for entry in document["messages"]]
        assert shown[:2] == list(request.messages[1:3])
        assert (shown[2].role, shown[2].tool_results) == (
            request.messages[3].role,
            request.messages[3].tool_results,
        )

    def test_reasoning_is_shown_as_reasoning(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 's.db'}"
        thought = ReasoningPart("Order 9 is late.", "sig", "anthropic")
        hidden = ReasoningPart("", "enc", "anthropic", redacted=True)
        log = [
            Message.user("Where is order 9?"),
            Message(Role.ASSISTANT, [thought, hidden, TextPart("It is late.")]),
        ]
        in_store(url, lambda store: store.append("customer-42", log))
        for command in ("view", "show"):
            text = ok("sessions", command, "customer-42", "--store", url).stdout
            assert 'reasoning: "Order 9 is late."' in text and "[redacted reasoning]" in text
            assert "[image]" not in text

    def test_a_typed_agent_s_view_says_what_it_leaves_out(self, store_url: str) -> None:
        document = self.view(store_url, "--agent", "tests.cli_agents:Typed")
        assert any("output_type" in note for note in document["notes"])
        plain = self.view(store_url, "--agent", "tests.cli_agents:Support")
        assert not any("output_type" in note for note in plain["notes"])

    def test_a_view_says_the_class_s_own_hooks_are_left_out(self, store_url: str) -> None:
        document = self.view(store_url, "--agent", "tests.cli_agents:Hooked")
        assert any("before_model hooks (shorten)" in note for note in document["notes"])
        for quiet in ("Support", "Unhooked"):  # manage_context's own hooks are shown
            document = self.view(store_url, "--agent", f"tests.cli_agents:{quiet}")
            assert not any("hooks" in note for note in document["notes"])

    def test_a_view_over_the_budget_says_what_it_assumed(self, store_url: str) -> None:
        """The final-result tool assumed for a class without a model may be what does not
        fit: the error says it was assumed."""
        agent = ("--agent", "tests.cli_agents:TypedBounded")
        line = fails(
            1,
            "sessions",
            "view",
            "customer-42",
            "--store",
            store_url,
            *agent,
            "--message",
            "word " * 600,
        )
        assert "prompt budget" in line.lower() and "final_result tool" in line

    def test_a_typed_agent_s_view_has_its_final_result_tool(self, store_url: str) -> None:
        document = self.view(store_url, "--agent", "tests.cli_agents:TypedTool", "--window", "9000")
        assert not any("output_type" in note for note in document["notes"])
        model = ScriptedModel([cli_agents.respond] * 20, context_window=9000)

        async def run(store: SessionStore) -> None:
            agent = TypedTool(model=model, session_store=store)
            with pytest.raises(OutputValidationError):  # the script answers in text
                await agent.run("One more thing.", session_id="customer-42")

        in_store(store_url, run)
        request = model.requests[0]
        assert request.tools[-1].name == "final_result"
        shown = [decode_message(entry["message"]) for entry in document["messages"]]
        assert (*shown, Message.user("One more thing.", id=request.messages[-1].id)) == (
            request.messages
        )
        assert document["tools_and_settings_tokens"] == estimate_request(
            (), request.tools, request.settings, output_schema=request.output_schema
        )

    @pytest.mark.parametrize(
        ("model", "native"),
        [("anthropic:claude-sonnet-5", False), ("openai:gpt-4o-mini", True)],
    )
    def test_a_view_asks_for_an_open_schema_as_the_provider_takes_it(
        self, model: str, native: bool
    ) -> None:
        """An Anthropic model string with a schema structured outputs cannot take is
        viewed with the final-result tool, as its run asks; OpenAI takes it natively."""
        agent = Agent(model=model, output_type=dict[str, int])
        assert agent.output is not None
        plan, assumed = _output_plan(agent, agent.output, agent.model)
        assert (plan.native, assumed) == (native, False)

    def test_a_class_picking_its_model_is_viewed_and_compacted_with_it(
        self, tmp_path: Path
    ) -> None:
        """A class overriding ``resolve_model()`` runs with what it returns: ``view`` and
        ``compact --dry-run`` sized the window from its ``model`` string (another
        provider's documented window) and asked for its output as for that string."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        in_store(url, store_conversation, "customer-42")
        picked = {"tokens": 1_500, "source": "advertised by the model picked"}
        args = ("sessions", "view", "customer-42", "--store", url, "--json", "--agent")
        document = json.loads(ok(*args, "tests.cli_agents:Picking").stdout)
        assert (document["window"], document["threshold"]["tokens"]) == (picked, 750)
        typed = json.loads(ok(*args, "tests.cli_agents:TypedPicking").stdout)
        assert typed["window"] == picked and typed["notes"] == []
        cli_agents.PICKED.requests.clear()

        async def run(store: SessionStore) -> None:
            runner = cli_agents.TypedPicking(session_store=store)
            await runner.run("One more thing.", session_id="customer-42")

        with pytest.raises(OutputValidationError):  # its answers are no dict: asked all the same
            in_store(url, run)
        request = next(r for r in cli_agents.PICKED.requests if r.purpose == "chat")
        assert typed["tools_and_settings_tokens"] == estimate_request(
            (), request.tools, request.settings, output_schema=request.output_schema
        )
        compact = ("sessions", "compact", "customer-42", "--store", url, "--dry-run", "--agent")
        out = ok(*compact, "tests.cli_agents:Picking").stdout
        assert "(window 1500 tokens, advertised by the model picked)" in out, out


class TestCompact:
    def test_a_dry_run_writes_nothing_and_a_compaction_appends_what_it_showed(
        self, store_url: str
    ) -> None:
        before = contents(store_url)
        asked = len(Staffed.model.requests)  # type: ignore[union-attr]
        for command in (["list"], ["show", "other"], ["view", "other"], ["export", "other"]):
            ok("sessions", *command, "--store", store_url)
        dry = ok(
            "sessions", "compact", "other", "--store", store_url,
            "--agent", "tests.cli_agents:Staffed", "--dry-run",
        ).stdout  # fmt: skip
        assert contents(store_url) == before
        assert len(Staffed.model.requests) == asked  # type: ignore[union-attr]
        assert "dry run: nothing was written and no model was called" in dry
        would = re.findall(r"^  summary covering (\d+) messages: (.+)$", dry, re.MULTILINE)
        assert len(would) == 1

        log = load(store_url, "other")
        done = ok(
            "sessions", "compact", "other", "--store", store_url,
            "--agent", "tests.cli_agents:Staffed",
        ).stdout  # fmt: skip
        after = load(store_url, "other")
        (record,) = after[len(log) :]
        assert after[: len(log)] == log
        assert record.is_summary
        assert split_quotes(summary_text(record))[0] == cli_agents.SUMMARY
        assert DRY_RUN_SUMMARY not in record.text
        position = {message.id: index for index, message in enumerate(log)}
        covered = sorted(position[i] for i in record.metadata[SUMMARY_COVERS_KEY])
        assert would[0][0] == str(len(covered))
        assert "appended 1 record to session 'other'" in done
        assert f"  summary {record.id} covering {would[0][0]} messages: {would[0][1]}" in done
        assert [r.purpose for r in Staffed.model.requests[asked:]] == ["context_compaction"]  # type: ignore[union-attr]

    def test_nothing_to_compact_is_said_and_writes_nothing(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 's.db'}"
        in_store(url, lambda store: store.append("short", [Message.user("hi")]))
        before = contents(url)
        out = ok(
            "sessions", "compact", "short", "--store", url, "--agent", "tests.cli_agents:Staffed"
        ).stdout
        assert out.startswith("nothing to compact in session 'short'")
        assert contents(url)[2:] == before[2:]

    def test_a_session_under_a_longer_id_is_not_summarized_to_be_refused(
        self, tmp_path: Path
    ) -> None:
        """A session an earlier version stored under an id over 256 characters can be
        read, not written to: compacting it is refused before the model is asked (its
        summary was paid for, then the append refused)."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        fill(url)
        long = "tenant-" + "x" * 300
        execute(url, f"UPDATE littleghost_sessions SET id = '{long}' WHERE id = 'other'")
        execute(
            url, f"UPDATE littleghost_messages SET session_id = '{long}' WHERE session_id = 'other'"
        )
        before = contents(url)
        asked = len(Staffed.model.requests)  # type: ignore[union-attr]
        dry = ok(
            "sessions", "compact", long, "--store", url,
            "--agent", "tests.cli_agents:Staffed", "--dry-run",
        ).stdout  # fmt: skip
        assert "dry run: nothing was written and no model was called" in dry
        line = fails(
            1, "sessions", "compact", long, "--store", url, "--agent", "tests.cli_agents:Staffed"
        )
        assert "read, exported and deleted, not continued" in line
        assert len(Staffed.model.requests) == asked  # type: ignore[union-attr]
        assert contents(url) == before

    def test_a_run_holding_the_session_ends_first_and_the_wait_is_said(
        self, store_url: str
    ) -> None:
        log = load(store_url, "other")
        compact = ("sessions", "compact", "other", "--store", store_url)
        with held(store_url, "other"):
            process = started(*compact, "--agent", "tests.cli_agents:Staffed")
            try:
                waiting = read_until(process, b"(Ctrl-C stops)\n").decode()
                assert waiting.endswith(
                    "waiting for a run of session 'other' to end (Ctrl-C stops)\n"
                )
                assert process.poll() is None
                assert load(store_url, "other") == log
            except BaseException:
                process.kill()
                finished(process)
                raise
        code, out, err = finished(process)
        assert code == 0, err
        assert out.startswith("appended 1 record to session 'other'")
        assert load(store_url, "other")[: len(log)] == log

    def test_ctrl_c_while_waiting_exits_130_and_appends_nothing(self, store_url: str) -> None:
        before = contents(store_url)
        compact = ("sessions", "compact", "other", "--store", store_url)
        with held(store_url, "other"):
            process = started(*compact, "--agent", "tests.cli_agents:Staffed")
            try:
                read_until(process, b"(Ctrl-C stops)\n")
            finally:
                process.send_signal(signal.SIGINT)
                code, out, err = finished(process)
        assert (code, out) == (130, "")
        assert err.endswith("Interrupted\n")
        assert contents(store_url) == before

    def test_nothing_to_compact_in_a_given_window_makes_no_model(self, tmp_path: Path) -> None:
        """With ``--window``, a session with nothing to cover is said to be so without
        making the class's model (an API key not set here); with something to cover, or a
        bounded view whose sizes a calibration kept for the model may change, it is made."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        chat = [m for i in range(8) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
        in_store(url, lambda store: store.append("short", [Message.user("hi")]))
        in_store(url, lambda store: store.append("long", chat))
        before = contents(url)
        compact = ("sessions", "compact", "--store", url, "--window", "8000", "--agent")
        out = ok(*compact, "tests.cli_agents:Keyless", "short").stdout
        assert out.startswith("nothing to compact in session 'short' (window 8000 tokens")
        assert "no API key for keyless" in fails(1, *compact, "tests.cli_agents:Keyless", "long")
        line = fails(1, *compact, "tests.cli_agents:KeylessBounded", "short")
        assert "no API key for keyless" in line
        assert contents(url)[2:] == before[2:]

    def test_a_stored_log_is_checked_as_a_run_of_its_session_checks_it(
        self, tmp_path: Path
    ) -> None:
        """A tool message whose results answer no call is left out of the view, as a run
        of the session leaves it; a result under a call it does not answer is refused with
        a run's error, dry run or not, and nothing is written."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        chat = [m for i in range(8) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
        call = Message(Role.ASSISTANT, (ToolCall("c1", "count", {}),))
        beside = Message(Role.TOOL, (ToolResult("c1", "1"), ToolResult("ghost", "stray")))
        in_store(url, lambda store: store.append("orphan", [*chat, Message.tool("x", "?"), *chat]))
        in_store(url, lambda store: store.append("beside", [*chat, call, beside, *chat]))
        compact = ("sessions", "compact", "--store", url, "--agent", "tests.cli_agents:Staffed")
        assert "appended 1 record to session 'orphan'" in ok(*compact, "orphan").stdout
        before = contents(url)
        for dry in ((), ("--dry-run",)):
            line = fails(1, *compact, *dry, "beside")
            assert line.startswith(
                "Error: message 17 of session 'beside' holds a result for call 'ghost', which "
                "answers no open call"
            )
        assert contents(url)[2:] == before[2:]

    def test_a_class_that_never_summarizes_compacts_nothing(self, tmp_path: Path) -> None:
        """``summarize=False``: the class never compacts a log, so neither does the command,
        which needs no model for it (``Bounded`` declares none)."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        chat = [
            m
            for i in range(12)
            for m in (Message.user(f"My code {i} is K-{i}00."), Message.assistant(f"Noted {i}."))
        ]
        in_store(url, lambda store: store.append("long", chat))
        before = contents(url)
        for agent in ("BoundedStaffed", "Bounded"):
            for dry in ([], ["--dry-run"]):
                out = ok(
                    "sessions", "compact", "long", "--store", url,
                    "--agent", f"tests.cli_agents:{agent}", *dry,
                ).stdout  # fmt: skip
                assert out.startswith("nothing to compact in session 'long'")
        assert contents(url)[2:] == before[2:]
        assert cli_agents.BoundedStaffed.model.requests == []  # type: ignore[union-attr]

    def test_a_strategy_without_model_calls_compacts_without_starting_the_model(
        self, tmp_path: Path
    ) -> None:
        """The model is started to learn its window only: given ``--window``, a class
        whose strategy calls no model compacts where its model cannot start."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        chat = [m for i in range(8) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
        in_store(url, lambda store: store.append("long", chat))
        command = ("sessions", "compact", "long", "--store", url)
        agent = ("--agent", "tests.cli_agents:Truncating")
        assert "no server on this machine" in fails(1, *command, *agent)
        ok(*command, *agent, "--window", "2000")
        (record,) = in_store(url, lambda store: store.load("long"))[len(chat) :]
        assert is_record(record) and len(record_covers(record)) == 12

    def test_a_compaction_that_would_not_shrink_the_view_writes_nothing(
        self, tmp_path: Path
    ) -> None:
        """A summary longer than the short turns it covers is refused, as a run refuses it;
        a dry run says so too, as its placeholder summary alone would not shrink them."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        chat = [m for i in range(7) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
        in_store(url, lambda store: store.append("short", chat))
        before = contents(url)
        for dry in (["--dry-run"], []):
            line = fails(
                1, "sessions", "compact", "short", "--store", url,
                "--agent", "tests.cli_agents:Staffed", *dry,
            )  # fmt: skip
            assert "the compaction would not make the view smaller" in line
            assert "nothing was appended" in line
        assert contents(url)[2:] == before[2:]

    def test_a_compaction_is_a_span_over_its_summary_call(
        self, tmp_path: Path, spans: Spans
    ) -> None:
        """``sessions compact`` is a ``littleghost.context.compaction`` span naming the agent
        and session, with the window and figures, over its summary call's ``chat`` span;
        one that would not shrink the view is ERROR, ``CompactionError``, with its figures."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        wordy = [m for i in range(30) for m in (Message.user(f"question {i} " * 8),
                 Message.assistant(f"answer {i} " * 8))]  # fmt: skip
        short = [m for i in range(7) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
        in_store(url, lambda store: store.append("long", wordy))
        in_store(url, lambda store: store.append("short", short))
        command = ("sessions", "compact", "--store", url, "--agent", "tests.cli_agents:Staffed")
        ok(*command[:2], "long", *command[2:], "--window", "2000")
        span = spans.one("littleghost.context.compaction")
        attributes = dict(span.attributes or {})
        assert span.status.status_code is StatusCode.UNSET
        assert {
            key: attributes[key] for key in ("gen_ai.agent.name", "gen_ai.conversation.id")
        } == {
            "gen_ai.agent.name": "Staffed",
            "gen_ai.conversation.id": "long",
        }
        assert attributes["littleghost.compaction.outcome"] == "completed"
        assert attributes["littleghost.compaction.context_window_tokens"] == 2_000
        assert attributes["littleghost.compaction.removed_messages"] > 0
        (summary,) = spans.named("chat ")
        assert summary.parent is not None and span.context is not None
        assert summary.parent.span_id == span.context.span_id

        spans.clear()
        fails(1, *command[:2], "short", *command[2:], "--window", "2000")
        span = spans.one("littleghost.context.compaction")
        attributes = dict(span.attributes or {})
        assert span.status.status_code is StatusCode.ERROR
        assert attributes["error.type"] == "CompactionError"
        assert "nothing was appended" in attributes["littleghost.compaction.error_message"]

    def test_ctrl_c_exits_130_and_writes_nothing(self, store_url: str) -> None:
        before = contents(store_url)
        result = invoke(
            "sessions", "compact", "other", "--store", store_url,
            "--agent", "tests.cli_agents:Interrupted",
        )  # fmt: skip
        assert result.exit_code == 130
        assert result.stderr.strip() == "Interrupted"
        assert contents(store_url) == before

    def test_ctrl_c_as_the_model_closes_writes_nothing(self, store_url: str) -> None:
        """The model is closed before the records are appended: a Ctrl-C then writes
        nothing, as the exit code says (the summary was stored, yet 130 "Interrupted")."""
        before = contents(store_url)
        result = invoke(
            "sessions", "compact", "customer-42", "--store", store_url,
            "--agent", "tests.cli_agents:InterruptedWhileClosing",
        )  # fmt: skip
        assert result.exit_code == 130
        assert contents(store_url) == before

    @pytest.mark.parametrize(
        ("name", "background"),
        [("SIGINT", False), ("SIGTERM", False), ("SIGHUP", False), ("SIGTERM", True)],
        ids=["SIGINT", "SIGTERM", "SIGHUP", "SIGTERM ignoring Ctrl-C"],
    )
    def test_stop_signals_stop_as_ctrl_c_does(
        self, tmp_path: Path, name: str, background: bool
    ) -> None:
        """Ctrl-C, ``timeout``, a service manager or a closed terminal stops a command
        on every Python (3.10 included, where the event loop raises the interrupt as a
        bare cancellation), also one started ignoring Ctrl-C (a shell's background job):
        its model is closed (a local model's server stopped, not left running), nothing
        is written, and the exit code is 128 + the signal's number."""
        number = getattr(signal, name, None)
        if number is None:
            missing(f"this system has no {name}")

        def as_a_shell_starts_it() -> None:
            signal.signal(number, signal.SIG_DFL)
            if background:
                signal.signal(signal.SIGINT, signal.SIG_IGN)

        url = TestProcess.filled(tmp_path)
        before = contents(url)
        with subprocess.Popen(
            [sys.executable, "-m", "littleghost", "sessions", "compact", "customer-42",
             "--store", url, "--agent", "tests.cli_agents:StoppedWhileSummarizing"],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), cli_agents.MARKS: str(tmp_path)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=as_a_shell_starts_it,
        ) as process:  # fmt: skip
            while not (tmp_path / "summarizing").exists() and process.poll() is None:
                time.sleep(0.05)
            process.send_signal(number)
            try:
                out, err = process.communicate(timeout=60)
            finally:
                process.kill()  # not left behind when it hangs
        assert (process.returncode, out, err) == (128 + number, "", "Interrupted\n")
        assert (tmp_path / "closed").exists()
        assert contents(url) == before

    def test_a_model_failing_to_close_keeps_the_summary(self, store_url: str) -> None:
        """The summary is paid for: a model that fails to close (not a Ctrl-C) leaves it
        stored, and the error says so."""
        before = load(store_url, "customer-42")
        line = fails(
            1, "sessions", "compact", "customer-42", "--store", store_url,
            "--agent", "tests.cli_agents:FailedWhileClosing",
        )  # fmt: skip
        assert "the compaction was appended, but closing 1 model(s) failed" in line
        after = load(store_url, "customer-42")
        assert after[: len(before)] == before
        assert [is_record(message) for message in after[len(before) :]] == [True]

    def test_a_model_failing_to_close_with_nothing_to_compact_says_only_that(
        self, tmp_path: Path
    ) -> None:
        """Nothing was compacted: the error does not say a compaction was appended."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        in_store(url, lambda store: store.append("short", [Message.user("hi")]))
        before = contents(url)
        line = fails(
            1, "sessions", "compact", "short", "--store", url,
            "--agent", "tests.cli_agents:FailedWhileClosing",
        )  # fmt: skip
        assert "closing 1 model(s) failed" in line and "appended" not in line
        assert contents(url)[2:] == before[2:]


class TestExport:
    def test_json_lines_in_the_stored_form(self, store_url: str) -> None:
        out = ok("sessions", "export", "customer-42", "--store", store_url).stdout
        lines = out.splitlines()
        assert tuple(message_from_json(line) for line in lines) == load(store_url, "customer-42")
        assert all(json.loads(line)["id"] for line in lines)

    def test_a_log_of_many_pages_as_it_was_when_the_export_began(self, store_url: str) -> None:
        """The log is read a page at a time (``PAGE`` messages): every message, in order;
        what is appended once the export began is not written, and a session deleted as
        it is written is a failure saying how much was written, not a short export that
        exits 0."""
        length = 2 * PAGE + 5
        many = [Message.user(f"message {index} " + "padding " * 20) for index in range(length)]
        in_store(store_url, lambda store: store.append("long", many))
        out = ok("sessions", "export", "long", "--store", store_url).stdout
        assert tuple(message_from_json(line) for line in out.splitlines()) == tuple(many)

        async def append(store: Any) -> None:
            await store.append("long", [Message.user("new")])

        async def delete(store: Any) -> None:
            await store.delete("long")

        for meanwhile, work in (("append", append), ("delete", delete)):
            code, said, lines = export_long_while(store_url, work)
            if meanwhile == "append":
                assert (code, said) == (0, "")
                assert tuple(message_from_json(line) for line in lines) == tuple(many)
            else:
                assert code == 1 and len(lines) == PAGE
                assert said == (
                    "Error: session 'long' was deleted as it was being exported: "
                    f"{PAGE} of its {length + 1} messages were written\n"  # the one appended
                )

    def test_a_log_deleted_and_written_anew_as_it_is_exported_is_a_failure(
        self, store_url: str
    ) -> None:
        """Deleted once the first page was read, then written anew at least as long
        (another conversation under the same id): the export went on with the new log's
        later pages after the old one's first, and exited 0. It fails as for a delete."""
        length = 2 * PAGE + 5
        many = [Message.user(f"message {index} " + "padding " * 20) for index in range(length)]
        other = [Message.user(f"other {index} " + "padding " * 20) for index in range(length)]
        in_store(store_url, lambda store: store.append("long", many))

        async def anew(store: Any) -> None:
            await store.delete("long")
            await store.append("long", other)

        code, said, lines = export_long_while(store_url, anew)
        assert code == 1 and len(lines) == PAGE
        assert tuple(message_from_json(line) for line in lines) == tuple(many[:PAGE])
        assert said == (
            "Error: session 'long' was deleted as it was being exported: "
            f"{PAGE} of its {length} messages were written\n"
        )


def export_long_while(store_url: str, work: Any) -> tuple[int, str, list[str]]:
    """Export the session ``long``, doing ``work`` on the store (``in_store``) once its
    first line is out, while it waits on the full pipe in its first page: its exit code,
    what it said on stderr and the lines it wrote."""
    command = [sys.executable, "-m", "littleghost", "sessions", "export", "long"]
    with subprocess.Popen(
        [*command, "--store", store_url],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        first = process.stdout.readline()
        in_store(store_url, work)
        lines = [first, *process.stdout]
        said = process.stderr.read()
        return process.wait(timeout=120), said, lines


@contextmanager
def held(url: str, session_id: str) -> Iterator[None]:
    """Hold the session, as a run under way does, from another thread until the block ends."""
    taken, release = threading.Event(), threading.Event()

    async def hold() -> None:
        async with (
            store_address(url).open(read_only=False) as store,
            hold_session(store, session_id),
        ):
            taken.set()
            await anyio.to_thread.run_sync(release.wait)

    thread = threading.Thread(target=anyio.run, args=(hold,))
    thread.start()
    try:
        assert taken.wait(60)
        yield
    finally:
        release.set()
        thread.join(60)


SIGINT_ELSEWHERE = """
import runpy, signal, sys, threading
threading.Thread(target=threading.Event().wait, daemon=True).start()
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
sys.argv[0] = "littleghost"
runpy.run_module("littleghost", run_name="__main__", alter_sys=True)
"""
"""``python -c`` code running the command as ``-m littleghost`` does, a Ctrl-C taken by
another thread (an exporter's, say): it trips Python's handler, to be run by the main
thread at its next step, but interrupts no read of the main thread's (the same state as
a Ctrl-C that lands just before a read begins, which a loaded machine hits at times)."""


def started(
    *args: str, running: tuple[str, ...] = ("-m", "littleghost"), **options: Any
) -> subprocess.Popen[bytes]:
    """``python -m littleghost ...`` (or ``python RUNNING...``) started in a process of its
    own, its output piped, Ctrl-C (SIGINT) at its default, as a terminal's foreground job
    has it (a shell's background job, which a CI run may be, starts its children ignoring
    it)."""
    return subprocess.Popen(
        [sys.executable, *running, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": ""},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        **options,
    )


def read_until(process: subprocess.Popen[bytes], text: bytes) -> bytes:
    """What ``process`` wrote to standard error up to and including ``text`` (a failure
    when it writes nothing for a minute, not a hang)."""
    assert process.stderr is not None
    seen = b""
    while text not in seen:
        ready, _, _ = select.select([process.stderr], [], [], 60)
        assert ready, seen  # it wrote nothing more for a minute
        chunk = os.read(process.stderr.fileno(), 4096)
        assert chunk, seen  # it ended without writing it
        seen += chunk
    return seen


def finished(process: subprocess.Popen[bytes]) -> tuple[int, str, str]:
    try:
        out, err = process.communicate(timeout=60)
    finally:
        process.kill()  # not left behind when it hangs
    return process.returncode, out.decode(), err.decode()


class TestDelete:
    def test_yes_deletes_the_session_and_says_what_without_its_content(
        self, store_url: str
    ) -> None:
        canary = "card 4111 1111 1111 1111"
        in_store(store_url, lambda store: store.append("customer-42", [Message.user(canary)]))
        log = load(store_url, "customer-42")
        records = sum(map(is_record, log))
        assert records > 0
        other = load(store_url, "other")
        out = ok("sessions", "delete", "customer-42", "--store", store_url, "--yes").stdout
        lines = out.splitlines()
        assert lines[0] == (
            f"deleted session 'customer-42': {len(log)} messages, {records} compaction "
            f"record{'s' if records > 1 else ''} among them"
        )
        if store_address(store_url).kind == "sqlite":
            assert lines[1:] == [
                "the text is overwritten in the SQLite file, and its write-ahead log emptied"
            ]
            path = Path(store_address(store_url).target)
            files = [path, path.with_name(path.name + "-wal")]
            stored = b"".join(file.read_bytes() for file in files if file.exists())
            assert canary.encode() not in stored and other[0].text.encode() in stored
        else:
            assert "until VACUUM" in lines[1]
        assert canary not in out and all(m.text not in out for m in log if m.text)
        assert load(store_url, "customer-42") == ()
        assert load(store_url, "other") == other

    def test_json(self, store_url: str) -> None:
        log = load(store_url, "other")
        result = ok("sessions", "delete", "other", "--store", store_url, "-y", "--json")
        kind = store_address(store_url).kind
        assert json.loads(result.stdout) == {
            "session": "other",
            "messages": len(log),
            "records": sum(map(is_record, log)),
            "store": kind,
            "wal_emptied": True if kind == "sqlite" else None,
        }
        assert result.stderr == ""
        assert load(store_url, "other") == ()

    def test_a_session_whose_log_cannot_be_read_is_deleted_all_the_same(
        self, store_url: str
    ) -> None:
        """An erasure request for a damaged session: the command cannot count its
        messages, and says so, but deletes it; another session stays."""
        in_store(store_url, lambda store: store.append("broken", [Message.user("card 4111")]))
        execute(
            store_url,
            "UPDATE littleghost_messages SET body = '{}' WHERE session_id = 'broken'",
        )
        assert "cannot be read" in fails(1, "sessions", "show", "broken", "--store", store_url)
        other = load(store_url, "other")
        line = fails(1, "sessions", "delete", "broken", "--store", store_url)
        assert "delete session 'broken' (its stored log cannot be read)" in line
        result = ok("sessions", "delete", "broken", "--store", store_url, "--yes", "--json")
        assert json.loads(result.stdout)["messages"] is None
        assert load(store_url, "broken") == ()
        assert load(store_url, "other") == other

    def test_off_a_terminal_without_yes_nothing_is_deleted(self, store_url: str) -> None:
        before = contents(store_url)
        line = fails(1, "sessions", "delete", "other", "--store", store_url)
        assert line.startswith(
            "Error: not deleted: standard input is not a terminal to ask on; pass --yes to "
            f"delete session 'other' ({len(load(store_url, 'other'))} messages, "
        )
        assert contents(store_url) == before

    def asked(
        self, url: str, answer: bytes | None, running: tuple[str, ...] = ("-m", "littleghost")
    ) -> tuple[int, str, str]:
        """Run ``sessions delete other`` (by ``running``) with standard input on a terminal;
        once it asks, type ``answer`` (``None``: Ctrl-C)."""
        master, slave = pty.openpty()
        command = ("sessions", "delete", "other", "--store", url)
        with started(*command, running=running, stdin=slave) as process:
            os.close(slave)
            try:
                asked = read_until(process, b"? [y/N]: ")
                if answer is None:
                    process.send_signal(signal.SIGINT)
                else:
                    os.write(master, answer)
                code, out, err = finished(process)
            finally:
                os.close(master)
        return code, out, asked.decode() + err

    @pytest.mark.parametrize("answer", [b"y\n", b"YES\n"])
    def test_on_a_terminal_it_asks_first(self, tmp_path: Path, answer: bytes) -> None:
        url = TestProcess.filled(tmp_path)
        log = load(url, "other")
        code, out, err = self.asked(url, answer)
        assert re.fullmatch(
            rf"Delete session 'other' \({len(log)} messages, \d+ compaction records? among them, "
            r"last activity \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)\? \[y/N\]: ",
            err,
        )
        assert (code, out.splitlines()[0]) == (
            0,
            f"deleted session 'other': {len(log)} messages, 1 compaction record among them",
        )
        assert load(url, "other") == ()

    @pytest.mark.parametrize(
        "answer", [b"\n", b"n\n", b"no\n", b"\x04"], ids=["enter", "n", "no", "EOF"]
    )
    def test_anything_but_yes_deletes_nothing(self, tmp_path: Path, answer: bytes) -> None:
        url = TestProcess.filled(tmp_path)
        before = contents(url)
        code, out, err = self.asked(url, answer)
        assert (code, out) == (1, "")
        assert err.endswith("? [y/N]: Error: not deleted: the answer was not yes\n")
        assert contents(url) == before

    @pytest.mark.parametrize(
        "running",
        [("-m", "littleghost"), ("-c", SIGINT_ELSEWHERE)],
        ids=["main-thread", "another-thread"],
    )
    def test_ctrl_c_at_the_question_exits_130_and_deletes_nothing(
        self, tmp_path: Path, running: tuple[str, ...]
    ) -> None:
        url = TestProcess.filled(tmp_path)
        before = contents(url)
        code, out, err = self.asked(url, None, running)
        assert (code, out) == (130, "")
        assert err.endswith("? [y/N]: \nInterrupted\n")
        assert contents(url) == before

    def test_a_run_holding_the_session_ends_first(self, store_url: str) -> None:
        with held(store_url, "other"):
            process = started("sessions", "delete", "other", "--store", store_url, "--yes")
            try:
                waiting = read_until(process, b"\n").decode()
                assert waiting == "waiting for a run of session 'other' to end (Ctrl-C stops)\n"
                assert process.poll() is None
                assert load(store_url, "other") != ()
            except BaseException:
                process.kill()
                finished(process)
                raise
        code, out, err = finished(process)
        assert (code, err) == (0, "")
        assert out.startswith("deleted session 'other': ")
        assert load(store_url, "other") == ()

    def test_ctrl_c_while_waiting_exits_130_and_deletes_nothing(self, store_url: str) -> None:
        before = contents(store_url)
        with held(store_url, "other"):
            process = started("sessions", "delete", "other", "--store", store_url, "--yes")
            try:
                read_until(process, b"(Ctrl-C stops)\n")
            finally:
                process.send_signal(signal.SIGINT)
                code, out, err = finished(process)
        assert (code, out, err) == (130, "", "Interrupted\n")
        assert contents(store_url) == before

    def test_ctrl_c_once_the_delete_began_says_it_may_be_done(self, tmp_path: Path) -> None:
        """Stopped as the delete waits (a second at most) for another connection's read
        to end, to empty the write-ahead log, the command said only "Interrupted", as if
        nothing was deleted: the session was. A Ctrl-C that may have come after that
        second (a loaded machine) is tried again."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        fill(url)
        for _ in range(10):
            reader = sqlite3.connect(tmp_path / "s.db", isolation_level=None)
            reader.execute("BEGIN")
            reader.execute("SELECT count(*) FROM littleghost_messages").fetchone()
            try:
                process = started("sessions", "delete", "other", "--store", url, "--yes")
                present = time.monotonic()  # the delete's commit comes after this
                while True:
                    checked = time.monotonic()
                    if process.poll() is not None or "other" not in sessions_in(tmp_path / "s.db"):
                        break
                    present = checked
                    time.sleep(0.005)
                running = process.poll() is None
                process.send_signal(signal.SIGINT)
                in_time = running and time.monotonic() - present < 0.5  # of the wait's 1 s
                code, out, err = finished(process)
            finally:
                reader.execute("ROLLBACK")
                reader.close()
            if in_time:
                break
            in_store(url, lambda store: store_conversation(store, "other"))
        assert in_time
        assert (code, out) == (130, "")
        assert err == (
            "stopped as session 'other' was being deleted: it may be deleted already "
            "(sessions show tells)\nInterrupted\n"
        )
        assert load(url, "other") == ()


def sessions_in(path: Path) -> list[str]:
    """The sessions an SQLite store holds, read past the store."""
    connection = sqlite3.connect(path)
    try:
        return [row[0] for row in connection.execute("SELECT id FROM littleghost_sessions")]
    finally:
        connection.close()


class TestErrors:
    def test_a_command_s_option_before_the_command_says_where_it_goes(self, store_url: str) -> None:
        """``--store`` (or ``--agent``) written before ``sessions`` or its command, where the
        main help's "point --store at ..." invites it, is a wrong option whose error says
        it goes after the command's name; an option no command takes is click's error."""
        for args, path in [
            (["--store", store_url, "sessions", "list"], "main sessions list ... --store ..."),
            (["sessions", "--store", store_url, "list"], "main sessions list ... --store ..."),
            (["--agent", "m:C", "sessions", "view", "s"], "main sessions view ... --agent ..."),
        ]:
            line = fails(2, *args)
            option = path.split()[-2]
            assert line == (
                f"Error: No such option {option!r} before the command: it is an option of the "
                f"commands, written after the command's name ({path})"
            )
        clicks = click.NoSuchOption("--bogus").format_message()  # its wording per version
        assert fails(2, "--bogus", "sessions", "list") == f"Error: {clicks}"

    @pytest.mark.parametrize("session_id", ["-1001234567890", "-x", "-a-b"])
    def test_a_session_id_starting_with_a_dash_is_written_after_two(
        self, tmp_path: Path, session_id: str
    ) -> None:
        """A Telegram group's chat id (``-1001234567890``) written as ``ID`` was read as
        options: ``No such option '-1'``, no word of the id or of ``--``."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        in_store(url, lambda store: store.append(session_id, [Message.user("hi")]))
        more = {"compact": ["--agent", "tests.cli_agents:Support", "--dry-run"], "delete": ["-y"]}
        for command in ("show", "view", "export", "compact", "delete"):
            line = fails(2, "sessions", command, session_id, "--store", url, *more.get(command, []))
            assert "a session ID that starts with '-' is written last, after '--' (" in line
            assert line.endswith(f"main sessions {command} ... -- '{session_id}')")
            assert f"(in {session_id!r})" in line if len(session_id) > 2 else "(in" not in line
            ok("sessions", command, "--store", url, *more.get(command, []), "--", session_id)
        assert load(url, session_id) == ()  # the last command, delete, was asked no question
        line = fails(2, "sessions", "show", "s", "--store", url, "--jsn")
        assert "a session ID" not in line  # a long option is an option
        for command in ("show", "delete"):  # a short one given with the ID, mistyped
            line = fails(2, "sessions", command, "s", "-j", "--store", url)
            assert line == f"Error: {click.NoSuchOption('-j').format_message()}"

    @pytest.mark.parametrize("command", ["show", "view", "export", "compact", "delete"])
    def test_an_unknown_session(self, store_url: str, command: str) -> None:
        more = {"compact": ["--agent", "tests.cli_agents:Staffed"], "delete": ["--yes"]}
        line = fails(1, "sessions", command, "nope", "--store", store_url, *more.get(command, []))
        assert line.startswith("Error: no session 'nope' in ")

    def test_text_an_error_quotes_cannot_act_on_a_terminal(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An error line quotes text littleghost does not write (a provider's message, from
        its server; a store's path): what a terminal would act on in it is an escape, as
        in tables (a provider's message retitled the terminal, and on a terminal cleared
        it)."""
        hostile = "\x1b]0;owned\x07\x1b[2Jgone\u202e"
        escaped = "\\x1b]0;owned\\x07\\x1b[2Jgone\\u202e"

        def rejects(connection: Connection) -> None:
            connection.answer(400, {"error": {"message": hostile, "type": "invalid_request"}})

        server = RawServer(rejects)
        try:
            monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
            monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
            url = f"sqlite:///{tmp_path / 's.db'}"
            fill(url)
            failed = python_m(
                "sessions", "compact", "customer-42", "--store", url,
                "--agent", "tests.cli_agents:Remote", "--window", "2000",
            )  # fmt: skip
        finally:
            server.close()
        assert failed.returncode == 1, failed.stderr
        assert failed.stderr.endswith(f"(HTTP 400): {escaped}\n"), failed.stderr
        folder = tmp_path / hostile
        folder.mkdir()
        shutil.copy(tmp_path / "s.db", folder / "s.db")
        failed = python_m("sessions", "show", "nope", "--store", f"sqlite:///{folder}/s.db")
        assert failed.returncode == 1, failed.stderr
        assert failed.stderr == f"Error: no session 'nope' in {tmp_path}/{escaped}/s.db\n"

    def test_an_unreachable_database(self) -> None:
        url = "postgresql://nobody@127.0.0.1:1/none?connect_timeout=2"
        line = fails(1, "sessions", "list", "--store", url)
        assert "PostgreSQL session store failed: OperationalError" in line

    @pytest.mark.parametrize(
        "conninfo",
        [
            "postgresql://app:s3cr%zzet@127.0.0.1:1/none",  # a password with a bare %
            "postgresql://app:s3cret@[::1:1/none",  # libpq quotes the whole URL
            "host=127.0.0.1 port=1 password=s3cret user",  # and the word after a password
        ],
    )
    def test_a_malformed_connection_string_keeps_its_password(self, conninfo: str) -> None:
        """A connection string libpq cannot parse is a wrong ``--store`` (exit 2), as a
        wrong SQLite address is, for every command (it was exit 1, as the store was
        opened), and the error quotes none of it; nor does the store's, or an exception
        it was raised during (libpq's, which quotes it, was its suppressed context)."""
        for command in (["list"], ["show", "s"], ["delete", "s", "--yes"]):
            line = fails(2, "sessions", *command, "--store", conninfo)
            assert "Invalid value for '--store'" in line
            assert "is not a valid PostgreSQL URL or conninfo (" in line
            assert "s3cr" not in line and "app" not in line
        with pytest.raises(ConfigurationError) as caught:
            PostgresSessionStore(conninfo)
        error: BaseException | None = caught.value
        while error is not None:
            assert "s3cr" not in str(error), repr(error)
            error = error.__cause__ or error.__context__

    def test_a_password_holding_a_bare_at_stays_out_of_the_error(self) -> None:
        """libpq ends the password at its first ``@`` and takes the rest for the host,
        which it would look up: such a URL is a wrong ``--store`` (exit 2), and the
        store refuses it as it is made; neither error (nor a traceback) shows it."""
        url = "postgresql://app:s3cret@tail@127.0.0.1:1/x"
        line = fails(2, "sessions", "list", "--store", url)
        assert "Invalid value for '--store'" in line
        assert "s3cret" not in line and "tail" not in line and "write it as %40" in line

        with pytest.raises(ConfigurationError) as caught:
            PostgresSessionStore(url)
        shown = "".join(traceback.format_exception(caught.value))
        assert "tail" not in shown and "s3cret" not in shown and "write it as %40" in shown

    def test_files_that_are_not_littleghost_stores(self, tmp_path: Path) -> None:
        shop = tmp_path / "shop.db"
        connection = sqlite3.connect(shop)
        connection.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY)")
        connection.close()
        (tmp_path / "empty.db").write_bytes(b"")
        (tmp_path / "notes.db").write_text("my notes\n" * 200)
        (tmp_path / "folder").mkdir()
        before = {path.name: path.is_dir() or path.read_bytes() for path in tmp_path.iterdir()}
        for name, error in [
            ("shop.db", "is an SQLite database of another application"),
            ("empty.db", "is an empty database, not a littleghost session store"),
            ("notes.db", "is not a littleghost session store or is damaged"),
            ("missing.db", "there is no SQLite session store at"),
            ("folder", "is a directory, not an SQLite session store"),
        ]:
            assert error in fails(1, "sessions", "list", "--store", f"sqlite:///{tmp_path / name}")
        assert {p.name: p.is_dir() or p.read_bytes() for p in tmp_path.iterdir()} == before

    def test_a_named_pipe_or_a_device_is_not_a_store(self, tmp_path: Path) -> None:
        """A named pipe (FIFO) given for the file held the command forever, Ctrl-C and
        SIGTERM (``timeout``) too: SQLite's open waited for a writer, and closing the
        store waited for the open. It fails at once, as a device does (``/dev/null`` was
        "an empty database"), read-only or not, and nothing is made beside it."""
        pipe = tmp_path / "sessions.db"
        os.mkfifo(pipe)
        for args, path, kind in [
            (["list"], pipe, "a named pipe (FIFO)"),
            (["delete", "s", "--yes"], pipe, "a named pipe (FIFO)"),
            (["list"], Path(os.devnull), "a character device"),
        ]:
            failed = python_m("sessions", *args, "--store", f"sqlite:///{path}", timeout=30)
            assert failed.returncode == 1, failed.stderr
            assert failed.stderr == (
                f"Error: {str(path)!r} is {kind}, not an SQLite session store: name a file\n"
            )
        assert [p.name for p in tmp_path.iterdir()] == ["sessions.db"]

    def test_a_postgresql_database_without_a_store(self, postgres_dsn: str) -> None:
        with postgres_schema_sync(postgres_dsn) as conninfo:
            line = fails(1, "sessions", "list", "--store", conninfo)
            assert "holds no littleghost session store" in line
            import psycopg

            with psycopg.connect(conninfo) as connection:
                tables = connection.execute(
                    "SELECT count(*) FROM information_schema.tables "
                    "WHERE table_schema = current_schema()"
                ).fetchone()
            assert tables == (0,)

    def test_a_newer_schema(self, store_url: str) -> None:
        execute(store_url, "UPDATE littleghost_meta SET value = '2' WHERE key = 'schema_version'")
        line = fails(1, "sessions", "show", "customer-42", "--store", store_url)
        assert "written by a newer littleghost" in line

    def test_usage_errors(self) -> None:
        line = fails(2, "sessions", "list", "--store", "x.db")
        assert "Invalid value for '--store'" in line
        assert "(a SQLite file x.db: sqlite:///x.db)" in line
        line = fails(2, "sessions", "list", "--store", "sqlite:///")
        assert "Invalid value for '--store'" in line and "a SQLite file" not in line
        assert "Missing option '--store'" in fails(2, "sessions", "list")
        url = "sqlite:///x.db"
        for agent, error in [
            ("nothing", "is not module:Class"),
            ("no_such_module:Agent", "cannot import 'no_such_module'"),
            ("tests.cli_agents:Nobody", "has no 'Nobody'"),
            ("tests.cli_agents:ORDERS", "is not an Agent subclass"),
            # a file path, a common first guess: said so, with the name to give instead
            ("tests/cli_agents.py:Support", "takes the module's import name"),
            ("./tests/cli_agents.py:Support", "(for example tests.cli_agents:Support)"),
            ("tests.cli_agents.py:Support", "(for example tests.cli_agents:Support)"),
            (".cli_agents:Support", "is a file path or a relative name"),
        ]:
            line = fails(2, "sessions", "view", "s", "--store", url, "--agent", agent)
            assert "Invalid value for '--agent'" in line and error in line
        assert "Missing option '--agent'" in fails(2, "sessions", "compact", "s", "--store", url)
        for command in ("show", "view", "export", "delete"):
            line = fails(2, "sessions", command, "", "--store", url)
            assert (
                line == "Error: Invalid value for 'ID': session_id must be a non-empty str, not ''"
            )
        # an id longer than a session is written under names one an earlier version wrote
        line = fails(1, "sessions", "show", "x" * 300, "--store", url)
        assert "Invalid value for 'ID'" not in line

    def test_a_window_past_any_model_s_is_a_wrong_option(self, tmp_path: Path) -> None:
        """``--window`` of more tokens than a float holds was a traceback
        (``OverflowError``) from ``view`` and ``compact``: a wrong option, naming the
        largest window it takes, which works."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        fill(url)
        huge, largest = "1" + "0" * 400, str(2**63 - 1)
        for command in (["view"], ["compact", "--agent", "tests.cli_agents:Support", "--dry-run"]):
            line = fails(2, "sessions", command[0], "customer-42", "--store", url,
                         "--window", huge, *command[1:])  # fmt: skip
            assert "Invalid value for '--window'" in line and f"1<=x<={largest}" in line
            ok("sessions", command[0], "customer-42", "--store", url,
               "--window", largest, *command[1:])  # fmt: skip

    def test_an_agent_class_that_fails_is_named_in_one_line(self, store_url: str) -> None:
        """The user's own code failing, as the class is imported or made: one line,
        naming the exception's type (``'SUPPORT_DB_URL'`` alone said little)."""
        for agent, code, error in [
            ("NeedsConfiguration", 1, "NeedsConfiguration() failed: KeyError: 'SUPPORT_DB_URL'"),
            ("BadlyConfigured", 1, "BadlyConfigured() failed: ValueError: settings are invalid:"),
        ]:
            line = fails(
                code, "sessions", "view", "customer-42", "--store", store_url,
                "--agent", f"tests.cli_agents:{agent}",
            )  # fmt: skip
            assert line == f"Error: --agent: {error}"
        result = invoke(
            "sessions", "view", "customer-42", "--store", store_url,
            "--agent", "tests.cli_broken:Agent",
        )  # fmt: skip
        assert result.exit_code == 2
        assert result.stderr.rstrip().endswith(
            "importing 'tests.cli_broken' failed: ValueError: settings are invalid:"
        )

    def test_an_agent_module_or_class_that_exits_is_a_failure(self, tmp_path: Path) -> None:
        """``sys.exit()`` in the user's code, as the module is imported or the class made,
        is a failure named in one line, not the command's own exit: ``compact`` ended 0,
        silently, having compacted nothing."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        fill(url)
        before = load(url, "customer-42")
        result = invoke(
            "sessions", "compact", "customer-42", "--store", url, "--agent", "tests.cli_exits:A"
        )  # fmt: skip
        assert result.exit_code == 2, result.stderr
        assert result.stderr.rstrip().endswith("importing 'tests.cli_exits' failed: SystemExit: 0")
        line = fails(
            1, "sessions", "compact", "customer-42", "--store", url,
            "--agent", "tests.cli_agents:ExitsWhenMade",
        )  # fmt: skip
        assert line == "Error: --agent: ExitsWhenMade() failed: SystemExit: 0"
        line = fails(
            1, "sessions", "compact", "customer-42", "--store", url,
            "--agent", "tests.cli_agents:ExitsAsItSummarizes",
        )  # fmt: skip
        assert line == "Error: the agent's own code exited: SystemExit: 0"
        assert load(url, "customer-42") == before

    def test_a_store_url_with_an_undecodable_byte_is_a_usage_error(self) -> None:
        """A byte the shell passed that is not UTF-8 (a lone surrogate in the argument)
        cannot reach libpq: a wrong ``--store``, its password not shown (it was a
        traceback)."""
        for url in ("postgresql://app:s3cr\udce9t@127.0.0.1:1/x", "host=h password=s3cr\udce9t"):
            line = fails(2, "sessions", "list", "--store", url)
            assert "Invalid value for '--store'" in line and "UTF-8" in line, line
            assert "s3cr" not in line

    def test_compacting_with_a_class_without_manage_context(self, store_url: str) -> None:
        line = fails(
            1, "sessions", "compact", "customer-42", "--store", store_url,
            "--agent", "tests.cli_agents:Unmanaged",
        )  # fmt: skip
        assert line == "Error: Unmanaged has no @manage_context: nothing to compact with"

    def test_compacting_with_a_class_without_a_model_says_how_to_give_it_one(
        self, store_url: str
    ) -> None:
        """The command makes the class with no keywords, so the error names the ways a
        class itself gives its model (it once said only `pass model= to the
        constructor`, which the command line cannot do)."""
        line = fails(
            1, "sessions", "compact", "customer-42", "--store", store_url,
            "--agent", "tests.cli_agents:Support",
        )  # fmt: skip
        assert "Support declares no model" in line, line
        assert "resolve_model()" in line, line


def python_m(
    *args: str,
    io_encoding: str | None = None,
    variables: dict[str, str] | None = None,
    **options: Any,
) -> subprocess.CompletedProcess[str]:
    """``python -m littleghost ...`` in a process of its own, from the repository root
    (its standard streams in ``io_encoding``, when given; its environment with
    ``variables`` too; its output captured unless ``stdout=`` says where it goes)."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "", **(variables or {})}
    if io_encoding is not None:
        environment["PYTHONIOENCODING"] = options["encoding"] = io_encoding
    return subprocess.run(
        [sys.executable, "-m", "littleghost", *args],
        cwd=ROOT,
        env=environment,
        stdout=options.pop("stdout", subprocess.PIPE),
        stderr=subprocess.PIPE,
        text=True,
        timeout=options.pop("timeout", 120),
        **options,
    )


class TestProcess:
    def test_python_m_littleghost_and_the_console_script(self, store_url: str) -> None:
        listed = python_m("sessions", "list", "--store", store_url, "--json")
        assert listed.returncode == 0, listed.stderr
        assert [s["id"] for s in json.loads(listed.stdout)] == ["customer-42", "other"]
        missing = python_m("sessions", "show", "nope", "--store", store_url)
        assert missing.returncode == 1
        assert len(missing.stderr.strip().splitlines()) == 1
        assert missing.stderr.startswith("Error: no session 'nope'")
        declared = re.search(
            r'^\[project\.scripts\]\nlittleghost = "([\w.]+):(\w+)"$',
            (ROOT / "pyproject.toml").read_text(),
            re.MULTILINE,
        )
        assert declared is not None
        module, name = declared.groups()
        assert getattr(__import__(module, fromlist=[name]), name) is main

    def test_what_the_agent_module_prints_goes_to_standard_error(self, tmp_path: Path) -> None:
        """Standard output is the command's: what the ``--agent`` module's own code prints,
        as it is imported and as its class is made, goes to standard error, so ``--json``
        stays JSON."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        fill(url)
        result = python_m(
            "sessions", "view", "customer-42", "--store", url,
            "--agent", "tests.cli_chatty:Chatty", "--json",
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["agent"] == "tests.cli_chatty:Chatty"
        assert "importing the agents\n" in result.stderr and "Chatty made\n" in result.stderr

    def test_what_the_agent_code_a_command_calls_prints_goes_to_standard_error(
        self, tmp_path: Path
    ) -> None:
        """So does what the agent's code prints as the command calls into it later (its
        tokenizer, its model's window, start and answers), through ``print`` or
        straight to file descriptor 1: ``view --json`` stays JSON, and ``compact``'s
        report is its own."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        fill(url)
        agent = ("--agent", "tests.cli_chatty:Talkative")
        viewed = python_m("sessions", "view", "customer-42", "--store", url, *agent, "--json")
        assert viewed.returncode == 0, viewed.stderr
        assert json.loads(viewed.stdout)["agent"] == "tests.cli_chatty:Talkative"
        for said in ("print: counting", "fd 1: counting", "print: window", "fd 1: window"):
            assert said in viewed.stderr
        for command in (("--dry-run",), ()):
            done = python_m("sessions", "compact", "customer-42", "--store", url, *agent, *command)
            assert done.returncode == 0, done.stderr
            assert done.stdout.startswith(("would append 1 record", "appended 1 record"))
            assert "print:" not in done.stdout and "fd 1:" not in done.stdout
            assert "fd 1: counting" in done.stderr
        for said in ("starting", "answering"):
            assert f"print: {said}" in done.stderr and f"fd 1: {said}" in done.stderr

    def test_a_reader_gone_ends_the_command_quietly_with_141(self, tmp_path: Path) -> None:
        """``| head -1``: the command stops without a traceback and exits 141, as a process
        stopped by SIGPIPE (it exited 1, which says "failed, said in one line", saying
        nothing; with standard error closed too, 120), a short output's too (the failure
        of the last flush)."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        many = [Message.user(f"message {index} " + "padding " * 20) for index in range(2_000)]
        in_store(url, lambda store: store.append("s", many))
        environment = {**os.environ, "PYTHONPATH": str(ROOT)}
        for command, closes_stderr in [
            (("export", "s"), False),
            (("export", "s"), True),
            (("show", "s", "--json"), False),
        ]:
            with subprocess.Popen(
                [sys.executable, "-m", "littleghost", "sessions", *command, "--store", url],
                cwd=ROOT,
                env=environment,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                preexec_fn=(lambda: os.close(2)) if closes_stderr else None,
            ) as process:
                assert process.stdout is not None and process.stderr is not None
                assert process.stdout.readline()
                process.stdout.close()  # | head -1
                said = process.stderr.read()
                assert (process.wait(timeout=120), said) == (141, b""), command
        shell = f"{sys.executable} -m littleghost sessions list --store {url} | true"
        done = subprocess.run(
            ["bash", "-c", shell + "; exit ${PIPESTATUS[0]}"],
            cwd=ROOT,
            env=environment,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert (done.returncode, done.stderr) == (141, "")

    def test_help_reads_well(self) -> None:
        done = python_m("sessions", "--help")
        assert done.returncode == 0
        listed = dict(re.findall(r"^  (\w+) +(.+)$", done.stdout.split("Commands:")[1], re.M))
        assert sorted(listed) == ["compact", "delete", "export", "list", "show", "view"]
        assert all(text.endswith(".") and "..." not in text for text in listed.values())
        for command in listed:
            text = ok("sessions", command, "--help").stdout
            assert f"Usage: main sessions {command} [OPTIONS]" in text
            assert "--store URL" in text and "LITTLEGHOST_STORE" in text
        overview = " ".join(python_m("--help").stdout.split())
        assert (
            "read-only, except `sessions compact` without --dry-run and `sessions delete`"
            in overview
        )
        assert (  # the exit codes a script tells apart, as the README gives them
            "Exit status: 0 done; 1 failed, said in one line on standard error; 2 a wrong "
            "command, option or value; 130 stopped by Ctrl-C (143 by SIGTERM, 129 by SIGHUP); "
            "141 the reader of its output gone (| head)."
        ) in overview

    @pytest.mark.parametrize("command", [[], ["sessions"]])
    def test_a_group_without_its_command_shows_its_help(self, command: list[str]) -> None:
        """``littleghost`` or ``littleghost sessions`` alone: the help as ``--help`` lays
        it out, on standard error, with exit 2 (it was one line, its breaks as ``\\n``)."""
        done = python_m(*command)
        assert done.returncode == 2 and done.stdout == ""
        assert done.stderr.rstrip() == python_m(*command, "--help").stdout.rstrip()
        assert "\\n" not in done.stderr

    def terminal(self, *args: str, columns: int = 200) -> tuple[str, str]:
        """Run ``python -m littleghost`` with standard output and error each on a
        pseudo-terminal of its own, ``columns`` wide; what each showed."""
        out_master, out_slave = pty.openpty()
        err_master, err_slave = pty.openpty()
        environment = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(columns)}
        environment.pop("NO_COLOR", None)
        process = subprocess.Popen(
            [sys.executable, "-m", "littleghost", *args],
            cwd=ROOT,
            env=environment,
            stdout=out_slave,
            stderr=err_slave,
        )
        os.close(out_slave)
        os.close(err_slave)
        seen = {out_master: b"", err_master: b""}
        reading = set(seen)
        while reading:  # both at once: a full pseudo-terminal would stop the process
            for master in select.select(list(reading), [], [], 120)[0]:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the process closed its end
                    chunk = b""
                if chunk:
                    seen[master] += chunk
                else:
                    reading.discard(master)
                    os.close(master)
        assert process.wait(timeout=120) == 0
        return seen[out_master].decode(), seen[err_master].decode()

    def test_tables_colours_and_progress_only_on_a_terminal(self, store_url: str) -> None:
        out, _ = self.terminal("sessions", "list", "--store", store_url)
        assert "\x1b[1m" in out and "\t" not in out
        assert re.search(r"MESSAGES  SUMMARIES  LAST ACTIVITY \(UTC\)  SESSION", out)
        piped = ok("sessions", "list", "--store", store_url).stdout
        assert "\x1b[" not in piped and "\t" in piped
        _, progress = self.terminal(
            "sessions", "compact", "other", "--store", store_url,
            "--agent", "tests.cli_agents:Staffed", "--dry-run",
        )  # fmt: skip
        assert "compacting" in progress and "100%" in progress
        piped_compact = invoke(
            "sessions", "compact", "other", "--store", store_url,
            "--agent", "tests.cli_agents:Staffed", "--dry-run",
        )  # fmt: skip
        assert piped_compact.stderr == ""

    def test_wide_characters_take_two_columns_of_a_terminal(self, tmp_path: Path) -> None:
        """Chinese text and emoji take two columns each: a table's rows are cut to the
        terminal's width and its columns stay aligned (rows half as wide again wrapped)."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        chat = [
            Message.user("我的订单在哪里？请帮我查一下物流信息。" * 4),
            Message.assistant("😀 " * 60),
        ]
        in_store(url, lambda store: store.append("客户-42", chat))

        def width(text: str) -> int:
            return sum(2 if unicodedata.east_asian_width(char) in "WF" else 1 for char in text)

        for command in ("show", "view"):
            out, _ = self.terminal("sessions", command, "客户-42", "--store", url, columns=80)
            lines = re.sub(r"\x1b\[[0-9;]*m", "", out).splitlines()
            header = next(index for index, line in enumerate(lines) if "CONTENT" in line)
            table = lines[header : header + 3]
            assert all(79 <= width(row) <= 80 for row in table[1:]), table  # 79: 😀 not fitting
            marks = ("CONTENT", '"我', '"😀')
            starts = {width(row[: row.index(mark)]) for row, mark in zip(table, marks, strict=True)}
            assert len(starts) == 1, table

    def test_a_terminal_list_shows_each_session_id_whole(self, tmp_path: Path) -> None:
        """The last column, the session's id, was cut to the terminal's width with an
        ellipsis: copied, it named no session."""
        url = f"sqlite:///{tmp_path / 's.db'}"
        long_id = "tenant-7:" + "thread-" * 30
        in_store(url, lambda store: store.append(long_id, [Message.user("hi")]))
        out, _ = self.terminal("sessions", "list", "--store", url, columns=80)
        (row,) = re.sub(r"\x1b\[[0-9;]*m", "", out).splitlines()[1:]
        assert row.endswith(f"  {long_id}") and "…" not in row

    def test_a_progress_bar_exports_a_large_log_on_a_terminal(self, tmp_path: Path) -> None:
        url = f"sqlite:///{tmp_path / 's.db'}"
        many = [Message.user(f"message {index}") for index in range(LARGE_LOG)]
        in_store(url, lambda store: store.append("long", many))
        out, progress = self.terminal("sessions", "export", "long", "--store", url)
        assert len(out.splitlines()) == LARGE_LOG
        assert "exporting" in progress and "100%" in progress
        piped = invoke("sessions", "export", "long", "--store", url)
        assert (len(piped.stdout.splitlines()), piped.stderr) == (LARGE_LOG, "")
        _, small = self.terminal(
            "sessions", "export", "customer-42", "--store", self.filled(tmp_path)
        )
        assert small == ""

    @pytest.mark.parametrize(
        "command", [("list",), ("show", "customer-42"), ("export", "customer-42")]
    )
    def test_output_that_cannot_be_written_is_one_line(
        self, tmp_path: Path, command: tuple[str, ...]
    ) -> None:
        """Standard output on a full disk: one line, exit 1, no traceback."""
        if not os.path.exists("/dev/full"):
            missing("this system has no /dev/full")
        with open("/dev/full", "w") as full:
            done = python_m("sessions", *command, "--store", self.filled(tmp_path), stdout=full)
        assert done.returncode == 1
        assert done.stderr == "Error: OSError: [Errno 28] No space left on device\n"

    @pytest.mark.parametrize("command", ["show", "view"])
    def test_json_cut_short_by_a_filling_disk_is_an_error(
        self, tmp_path: Path, command: str
    ) -> None:
        """A disk filling up as a long ``--json`` document is written (here a file-size
        limit: the same short write, then an error) fails in one line, exit 1: the
        document cut short is not a success."""
        if not hasattr(signal, "SIGXFSZ"):
            missing("this system has no file-size limit")
        url = f"sqlite:///{tmp_path / 's.db'}"
        chat = [Message.user(f"q{index}") for index in range(2_000)]
        in_store(url, lambda store: store.append("long", chat))
        limit = int(os.path.getsize(tmp_path / "s.db") * 1.3)  # the store, not the document

        def limited() -> None:
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past it fails: EFBIG
            resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

        with open(tmp_path / "out.json", "w") as out:
            done = python_m(
                "sessions", command, "long", "--store", url, "--json",
                stdout=out, preexec_fn=limited,
            )  # fmt: skip
        assert os.path.getsize(tmp_path / "out.json") == limit
        assert done.returncode == 1
        assert done.stderr == "Error: OSError: [Errno 27] File too large\n"

    def closed(self, url: str, stream: int, *args: str) -> subprocess.CompletedProcess[str]:
        """``littleghost ARGS --store URL`` run with standard stream ``stream`` closed."""
        command = [sys.executable, "-m", "littleghost", *args, "--store", url]
        return subprocess.run(
            ["sh", "-c", f'"$@" {stream}>&-', "sh", *command],
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": ""},
            capture_output=True,
            text=True,
            timeout=120,
        )

    def test_a_closed_standard_error_is_no_error(self, tmp_path: Path) -> None:
        """A command run with standard error closed (``>&-``, as some job runners start
        it) does its work and writes its output as usual."""
        done = self.closed(self.filled(tmp_path), 2, "sessions", "list")
        assert (done.returncode, done.stderr) == (0, "")
        assert "customer-42" in done.stdout

    @pytest.mark.parametrize(
        "command",
        [
            ["list"],
            ["show", "customer-42"],
            ["show", "customer-42", "--json"],
            ["view", "customer-42"],
            ["export", "customer-42"],
            ["compact", "customer-42", "--agent", "tests.cli_agents:Staffed", "--dry-run"],
        ],
    )
    def test_a_command_whose_work_is_its_output_fails_with_standard_output_closed(
        self, tmp_path: Path, command: list[str]
    ) -> None:
        """A command whose only work is what it writes fails in one line when standard
        output is closed, as GNU tools do, instead of exiting 0 having written nothing."""
        done = self.closed(self.filled(tmp_path), 1, "sessions", *command)
        name = f"sessions {command[0]}" + (" --dry-run" if "--dry-run" in command else "")
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr == (
            f"Error: standard output is closed: {name} has nowhere to write what it reads\n"
        )

    def test_delete_and_compact_do_their_work_with_standard_output_closed(
        self, tmp_path: Path
    ) -> None:
        """Deleting and compacting are work of their own: done with standard output closed."""
        url = self.filled(tmp_path)
        before = load(url, "other")
        compacted = self.closed(
            url, 1, "sessions", "compact", "other", "--agent", "tests.cli_agents:Staffed"
        )
        assert (compacted.returncode, compacted.stderr) == (0, "")
        after = load(url, "other")
        assert after[: len(before)] == before and after[-1].is_summary
        deleted = self.closed(url, 1, "sessions", "delete", "customer-42", "--yes")
        assert (deleted.returncode, deleted.stderr) == (0, "")
        assert load(url, "customer-42") == ()

    @staticmethod
    def filled(directory: Path) -> str:
        url = f"sqlite:///{directory / 'filled.db'}"
        fill(url)
        return url


@pytest.mark.parametrize(
    "command",
    [("delete", "--yes"), ("compact", "--agent", "tests.cli_agents:Staffed")],
    ids=["delete", "compact"],
)
def test_a_wait_for_another_connections_write_says_so(
    tmp_path: Path, command: tuple[str, ...]
) -> None:
    """Held up by another connection's write (no run of the session), ``sessions delete``
    and ``sessions compact`` said they waited for a run of the session to end."""
    path = tmp_path / "s.db"
    url = f"sqlite:///{path}"
    fill(url)
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")
        process = started("sessions", command[0], "other", "--store", url, *command[1:])
        try:
            waiting = read_until(process, b"(Ctrl-C stops)\n").decode()
            assert waiting.endswith(
                "waiting for the database, busy with another connection's write, to hold "
                "session 'other' (Ctrl-C stops)\n"
            )
            assert process.poll() is None
        except BaseException:
            process.kill()
            finished(process)
            raise
        writer.execute("ROLLBACK")
    finally:
        writer.close()
    code, out, err = finished(process)
    assert code == 0, err
    assert out.startswith(("deleted session 'other': ", "appended 1 record to session 'other'"))
