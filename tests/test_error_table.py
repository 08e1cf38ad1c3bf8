"""The table of docs/errors.md ("What to do when a run fails") against the errors a run
really raises: each row is reproduced through the public API, and the fragments it quotes
are in the real message (so the page and the messages cannot drift apart unseen). A row
added to the page needs a reproduction here, or a test named elsewhere that pins it."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from littleghost import Agent, manage_context, tool
from littleghost.errors import (
    ContextWindowOverflowError,
    RateLimitError,
)
from littleghost.messages import Message, ToolResult
from littleghost.models.openai import OpenAIModel
from littleghost.sessions import PostgresSessionStore, SQLiteSessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response
from tests.ci import mount_namespace
from tests.conftest import Spans
from tests.raw_http import refused_url
from tests.sdk_bodies import SDKClients, error_answer
from tests.stores import working_until

pytestmark = pytest.mark.anyio

PAGE = Path(__file__).resolve().parents[1] / "docs" / "errors.md"

Reproduce = Callable[[SDKClients, Path], Awaitable[BaseException]]


def table_rows() -> dict[str, str]:
    """The table's rows, by their first cell (what the operator sees)."""
    section = PAGE.read_text().split("## What to do when a run fails", 1)[1]
    rows = {}
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("| what you see"):
            seen, meaning = line[2:].rstrip(" |").split(" | ", 1)
            rows[seen] = meaning
    return rows


async def raised(run: Awaitable[Any]) -> BaseException:
    with pytest.raises(Exception) as caught:
        await run
    return caught.value


def openai_error(status: int, message: str, kind: str, code: str | None = None) -> Any:
    body = {"error": {"message": message, "type": kind, "code": code}}
    return lambda request: error_answer(status, body)


async def refused(clients: SDKClients, tmp: Path) -> BaseException:
    model = OpenAIModel("gpt-4o-mini", api_key="sk-test", base_url=f"{refused_url()}/v1")
    async with Agent(model=model) as agent:  # the default retries: 3
        return await raised(agent.run("hi"))


async def unavailable(clients: SDKClients, tmp: Path) -> BaseException:
    model = clients.openai_model(openai_error(503, "overloaded", "server_error"))
    return await raised(Agent(model=model, max_retries=1).run("hi"))


async def rate_limited_too_long(clients: SDKClients, tmp: Path) -> BaseException:
    body = {"error": {"message": "slow down", "type": "rate_limit", "code": None}}
    model = clients.openai_model(lambda request: error_answer(429, body, {"retry-after": "400"}))
    return await raised(Agent(model=model, max_retries=1).run("hi"))


async def quota(clients: SDKClients, tmp: Path) -> BaseException:
    answer = openai_error(429, "You exceeded your current quota", "insufficient_quota")
    return await raised(Agent(model=clients.openai_model(answer)).run("hi"))


async def per_minute(clients: SDKClients, tmp: Path) -> BaseException:
    too_large = (
        "Request too large for gpt-4o on tokens per min (TPM): Limit 30000, Requested 50000."
    )
    answer = openai_error(429, too_large, "tokens", "rate_limit_exceeded")
    return await raised(Agent(model=clients.openai_model(answer)).run("hi"))


async def bad_key(clients: SDKClients, tmp: Path) -> BaseException:
    answer = openai_error(401, "Incorrect API key", "invalid_request_error", "invalid_api_key")
    return await raised(Agent(model=clients.openai_model(answer)).run("hi"))


async def bad_anthropic_key(clients: SDKClients, tmp: Path) -> BaseException:
    body = {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}}
    model = clients.anthropic_model(lambda request: error_answer(401, body))
    return await raised(Agent(model=model).run("hi"))


async def no_such_model(clients: SDKClients, tmp: Path) -> BaseException:
    answer = openai_error(404, "no model gpt-9", "invalid_request_error", "model_not_found")
    return await raised(Agent(model=clients.openai_model(answer)).run("hi"))


async def no_such_path(clients: SDKClients, tmp: Path) -> BaseException:
    model = clients.openai_model(lambda request: httpx2.Response(404, text="Not Found"))
    return await raised(Agent(model=model).run("hi"))


async def proxy_wants_password(clients: SDKClients, tmp: Path) -> BaseException:
    model = clients.openai_model(lambda request: httpx2.Response(407, text="Proxy Auth"))
    return await raised(Agent(model=model).run("hi"))


async def no_api_key(clients: SDKClients, tmp: Path) -> BaseException:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("OPENAI_API_KEY", raising=False)
        return await raised(Agent(model="openai:gpt-4o-mini").run("hi"))


async def unknown_provider(clients: SDKClients, tmp: Path) -> BaseException:
    return await raised(Agent(model="nope:x").run("hi"))


async def no_model_file(clients: SDKClients, tmp: Path) -> BaseException:
    return await raised(Agent(model=f"local:{tmp / 'none.gguf'}").run("hi"))


@manage_context()
class Managed(Agent):
    instructions = "Answer briefly."


async def overflow(clients: SDKClients, tmp: Path) -> BaseException:
    too_long = ContextWindowOverflowError("too long", prompt_tokens=9000, context_window=8000)
    model = ScriptedModel([too_long], context_window=8000)
    return await raised(Managed(model=model).run("word " * 9000))


class Slow(Agent):
    @tool
    async def look_up(self) -> str:
        """Look it up."""
        await anyio.sleep(60)
        return "found"


async def slow_model(clients: SDKClients, tmp: Path) -> BaseException:
    async def answer(request: object) -> object:
        await anyio.sleep(60)
        return text_response("late")

    return await raised(Slow(model=ScriptedModel([answer])).run("hi", timeout=10))


async def no_time_to_retry(clients: SDKClients, tmp: Path) -> BaseException:
    model = ScriptedModel([RateLimitError("slow down", status=429, retry_after=30)])
    return await raised(Slow(model=model).run("hi", timeout=10))


async def slow_tool(clients: SDKClients, tmp: Path) -> BaseException:
    model = ScriptedModel([tool_call_response("look_up", {})])
    return await raised(Slow(model=model).run("hi", timeout=10))


async def session_held(clients: SDKClients, tmp: Path) -> BaseException:
    store = SQLiteSessionStore(tmp / "s.db")
    in_tool, release = anyio.Event(), anyio.Event()
    holder = working_until(in_tool, release)
    first = holder(model=ScriptedModel([tool_call_response("work", {})]), session_store=store)
    second = Agent(model=ScriptedModel([text_response("never")]), session_store=store)
    async with anyio.create_task_group() as group:
        group.start_soon(raised, first.run("hi", session_id="customer-42"))
        await in_tool.wait()
        error = await raised(second.run("hi", session_id="customer-42", timeout=5))
        group.cancel_scope.cancel()
    await store.aclose()
    return error


async def database_locked(clients: SDKClients, tmp: Path) -> BaseException:
    path = tmp / "s.db"
    async with SQLiteSessionStore(path) as store:
        await store.append("s", [])
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    try:
        store = SQLiteSessionStore(path, timeout=0.2)
        agent = Agent(model=ScriptedModel([text_response("x")]), session_store=store)
        return await raised(agent.run("hi", session_id="s"))
    finally:
        other.execute("ROLLBACK")
        other.close()
        await store.aclose()


async def postgres_refused(clients: SDKClients, tmp: Path) -> BaseException:
    port = refused_url().rsplit(":", 1)[1]
    async with PostgresSessionStore(f"postgresql://u:p@127.0.0.1:{port}/db") as store:
        agent = Agent(model=ScriptedModel([text_response("x")]), session_store=store)
        return await raised(agent.run("hi", session_id="s"))


async def stored_then_changed(tmp: Path, statement: str) -> BaseException:
    """The error of a run of session ``s`` of a store holding one message, after
    ``statement`` (SQL, its parameter the stored message) changed the store."""
    path = tmp / "s.db"
    async with SQLiteSessionStore(path) as store:
        await store.append("s", [Message.user("hi")])
    with sqlite3.connect(path) as db:
        (body,) = db.execute("SELECT body FROM littleghost_messages").fetchone()
        db.execute(statement, (body,) if "?" in statement else ())
    db.close()
    async with SQLiteSessionStore(path) as store:
        agent = Agent(model=ScriptedModel([text_response("x")]), session_store=store)
        return await raised(agent.run("hi", session_id="s"))


async def newer_schema(clients: SDKClients, tmp: Path) -> BaseException:
    bump = "UPDATE littleghost_meta SET value = '2' WHERE key = 'schema_version'"
    return await stored_then_changed(tmp, bump)


async def newer_part_type(clients: SDKClients, tmp: Path) -> BaseException:
    video = "UPDATE littleghost_messages SET body = replace(?, '\"text\"', '\"video\"')"
    return await stored_then_changed(tmp, video)


ROWS: dict[str, list[tuple[Reproduce, tuple[str, ...]]]] = {
    # first cell of the row: (a reproduction, the fragments its error's text holds), ...
    "`ProviderUnavailableError`, `could not reach the provider at HOST:PORT` (`code` "
    "`connection_error`)": [
        (
            refused,
            (
                "ProviderUnavailableError",
                "could not reach the provider at",
                "!127.0.0.1:",
                "code=connection_error",
                "(given up after 4 attempts)",
            ),
        ),
    ],
    "`ProviderUnavailableError`, `HTTP 5xx`": [
        (unavailable, ("ProviderUnavailableError", "!HTTP 503", "!(given up after 2 attempts)")),
    ],
    "`RateLimitError` (HTTP 429)": [
        (rate_limited_too_long, ("RateLimitError", "not retried: it asks for a wait of ")),
    ],
    "`InvalidRequestError`, `the account's quota is exhausted` or `the request alone is "
    "over the per-minute token limit`": [
        (quota, ("InvalidRequestError", "the account's quota is exhausted")),
        (
            per_minute,
            ("InvalidRequestError", "the request alone is over the per-minute token limit"),
        ),
    ],
    "`InvalidRequestError`, HTTP 401 or 403": [
        (bad_key, ("InvalidRequestError", "HTTP 401", "code=invalid_api_key")),
        (bad_anthropic_key, ("InvalidRequestError", "HTTP 401", "code=authentication_error")),
    ],
    "`InvalidRequestError`, HTTP 404": [
        (no_such_model, ("InvalidRequestError", "HTTP 404", "code=model_not_found")),
        (no_such_path, ("InvalidRequestError", "HTTP 404", "Not Found")),
    ],
    "`InvalidRequestError`, HTTP 407": [
        (proxy_wants_password, ("InvalidRequestError", "HTTP 407", "HTTP_PROXY")),
    ],
    "`ConfigurationError` at the first run (`no OpenAI API key`, `unknown provider`, `no "
    "model file`)": [
        (no_api_key, ("ConfigurationError", "no OpenAI API key")),
        (unknown_provider, ("ConfigurationError", "unknown provider")),
        (no_model_file, ("ConfigurationError", "no model file")),
    ],
    "`ContextWindowOverflowError`": [
        (
            overflow,
            (
                "ContextWindowOverflowError",
                "cause=CompactionError",
                "the current request alone",
                "does not fit",
            ),
        ),
    ],
    "`DeadlineExceededError`, `waiting for the model's answer`": [
        (slow_model, ("DeadlineExceededError", "waiting for the model's answer")),
    ],
    "`DeadlineExceededError`, `the run's deadline leaves no time to retry after ...`": [
        (
            no_time_to_retry,
            (
                "DeadlineExceededError",
                "the run's deadline leaves no time to retry after",
                "!after RateLimitError",
                "!cause=RateLimitError",
            ),
        ),
    ],
    "`DeadlineExceededError`, `running tool 'name'`": [
        (slow_tool, ("DeadlineExceededError", "running tool", "!running tool 'look_up'")),
    ],
    "`DeadlineExceededError`, `still waiting to hold session 'id'`": [
        (
            session_held,
            (
                "DeadlineExceededError",
                "still waiting to hold session",
                "!still waiting to hold session 'customer-42'",
            ),
        ),
    ],
    "`SessionStoreError`, `is busy: the database stayed locked by another connection`": [
        (
            database_locked,
            ("SessionStoreError", "is busy: the database stayed locked by another connection"),
        ),
    ],
    "`SessionStoreError`, `PostgreSQL session store failed: ... connection failed`": [
        (
            postgres_refused,
            (
                "SessionStoreError",
                "PostgreSQL session store failed: ",
                "connection failed",
                "!Connection refused",
            ),
        ),
    ],
    "`SchemaVersionError`": [
        (newer_schema, ("SchemaVersionError", "!Upgrade littleghost")),
    ],
    "`CorruptSessionStoreError`": [
        (
            newer_part_type,
            (
                "CorruptSessionStoreError",
                "!session 's', message at position 0",
                "has a part type this littleghost does not know: written by a newer littleghost",
            ),
        ),
    ],
}

PINNED_ELSEWHERE = {
    "`DeadlineExceededError`, `storing messages in the session`, `loading the session`": (
        "test_retries_and_deadlines, test_sessions_sqlite"
    ),
    "a tool's `execute_tool` span ERROR, the run going on": "test_telemetry",
    "`SessionStoreError`, `cannot be written: ...`": "test_sessions_sqlite (needs a mount)",
    "`SessionStoreError`, `changed under the run that holds it`": "test_session_fences",
}


DISK_FULL = "`SessionStoreError`, `database or disk is full`"
"""The row reproduced in a child of its own (a full file system, mounted there)."""


def test_every_row_of_the_table_is_reproduced_or_pinned_elsewhere() -> None:
    assert set(table_rows()) == {*ROWS, *PINNED_ELSEWHERE, DISK_FULL}


def described(error: BaseException) -> str:
    """What an operator sees of ``error``: its type, message, code and cause."""
    cause = error.__cause__
    return (
        f"{type(error).__name__}: {error} code={getattr(error, 'code', None)} "
        f"cause={type(cause).__name__ if cause else None}: {cause}"
    )


CASES = [
    pytest.param(seen, reproduce, fragments, id=reproduce.__name__)
    for seen, cases in ROWS.items()
    for reproduce, fragments in cases
]


@pytest.mark.virtual_clock
@pytest.mark.parametrize(("seen", "reproduce", "fragments"), CASES)
async def test_a_row_s_failure_says_what_the_row_quotes(
    seen: str,
    reproduce: Reproduce,
    fragments: tuple[str, ...],
    sdk_clients: SDKClients,
    tmp_path: Path,
    spans: Spans,
) -> None:
    """The failure of a row, reproduced, is of the row's type and holds the fragments the
    row quotes (and those its reproduction names); the run's span has its type."""
    error = await reproduce(sdk_clients, tmp_path)
    text = described(error)
    assert type(error).__name__ == fragments[0]  # the row's type, exactly
    row = f"{seen} | {table_rows()[seen]}"
    for fragment in fragments:
        assert fragment.lstrip("!") in text
        if not fragment.startswith("!"):  # "!": the real message's only, not the page's
            assert fragment.removeprefix("code=").removeprefix("cause=") in row
    expected = (
        "context_length_exceeded"
        if isinstance(error, ContextWindowOverflowError)
        else type(error).__name__
    )
    failed = [dict(span.attributes or {}).get("error.type") for span in spans.named("invoke_agent")]
    assert expected in failed


async def test_a_tool_the_deadline_cut_is_answered_in_the_log_by_its_run(
    tmp_path: Path,
) -> None:
    """The row of a tool cut by the deadline: the run answers the call in the stored log
    as it stops, saying it may have happened (on real time: the store works in threads)."""
    model = ScriptedModel([tool_call_response("look_up", {})])
    async with SQLiteSessionStore(tmp_path / "s.db") as store:
        agent = Slow(model=model, session_store=store)
        error = await raised(agent.run("hi", session_id="s", timeout=0.5))
        stored = await store.load("s")
    assert "running tool 'look_up'" in str(error)
    answer = stored[-1].content[0]
    assert isinstance(answer, ToolResult)
    assert answer.is_error
    assert "may have happened" in answer.content


FULL_DISK_CHILD = textwrap.dedent(
    """
    import json, subprocess, sys

    import anyio

    from littleghost import Agent
    from littleghost.sessions import SQLiteSessionStore
    from littleghost.testing import ScriptedModel, text_response


    async def texts(agent, store, question):
        try:
            result = await agent(store).run(question, session_id="s")
        except Exception as error:
            return f"{type(error).__name__}: {error}"
        return [message.text for message in result.messages]


    async def main(folder):
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=200k", "tmpfs", folder], check=True)
        def agent(store):
            return Agent(model=ScriptedModel([text_response("ok")]), session_store=store)
        found = {}
        async with SQLiteSessionStore(f"{folder}/s.db") as store:
            found["first"] = await texts(agent, store, "hi")
            filler = ["dd", "if=/dev/zero", f"of={folder}/filler", "bs=4k", "count=1000"]
            subprocess.run(filler, capture_output=True)  # fails once the disk is full
            found["full"] = await texts(agent, store, "x" * 100_000)
            found["stored"] = [message.text for message in await store.load("s")]
            subprocess.run(["rm", f"{folder}/filler"], check=True)
            found["room"] = await texts(agent, store, "again")
        print(json.dumps(found))


    anyio.run(main, sys.argv[1])
    """
)


def test_a_full_disk_says_so_and_the_next_run_goes_on_from_the_log(
    tmp_path: Path,
) -> None:
    """The row of a full disk: SQLite's words in the store's error; the message the run
    was storing is not in the log, and once there is room the next run goes on."""
    prefix = mount_namespace("a full file system")
    folder = tmp_path / "mounted"
    folder.mkdir()
    script = tmp_path / "child.py"
    script.write_text(FULL_DISK_CHILD)
    done = subprocess.run(
        [*prefix, sys.executable, str(script), str(folder)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["first"] == ["hi", "ok"]
    assert found["full"].startswith("SessionStoreError: SQLite session store ")
    assert found["full"].endswith("database or disk is full")
    assert found["stored"] == ["hi", "ok"]
    assert found["room"] == ["hi", "ok", "again", "ok"]
