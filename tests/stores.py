"""Session stores for tests: every kind, each on fresh storage.

PostgreSQL is found through ``LITTLEGHOST_TEST_POSTGRES_DSN`` (``.ci/postgres.sh`` starts a
server and prints it). Without it the PostgreSQL tests skip, except under CI (``CI`` set),
where they fail: CI must test the server-backed store.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import pytest

from littleghost.sessions import (
    InMemorySessionStore,
    PostgresSessionStore,
    SessionStore,
    SQLiteSessionStore,
)

DSN_VARIABLE = "LITTLEGHOST_TEST_POSTGRES_DSN"
KINDS = ("memory", "sqlite", "postgres")


def postgres_dsn() -> str:
    """The test server's DSN; skips the test when there is none (fails under CI)."""
    dsn = os.environ.get(DSN_VARIABLE, "")
    if not dsn:
        if os.environ.get("CI", "").lower() not in ("", "0", "false"):
            pytest.fail(f"{DSN_VARIABLE} is not set: CI must run the PostgreSQL tests")
        pytest.skip(f"no PostgreSQL: set {DSN_VARIABLE} (see .ci/postgres.sh)")
    return dsn


def _run_sql(dsn: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as connection:
        connection.execute(statement)


@asynccontextmanager
async def postgres_schema() -> AsyncIterator[str]:
    """A connection string whose tables live in a new schema, dropped afterwards."""
    from psycopg.conninfo import make_conninfo

    dsn = postgres_dsn()
    schema = f"lg_test_{uuid.uuid4().hex[:12]}"
    await anyio.to_thread.run_sync(_run_sql, dsn, f"CREATE SCHEMA {schema}")
    try:
        yield make_conninfo(dsn, options=f"-csearch_path={schema}")
    finally:
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(_run_sql, dsn, f"DROP SCHEMA {schema} CASCADE")


@asynccontextmanager
async def open_store(kind: str, directory: Path) -> AsyncIterator[SessionStore]:
    """A store of ``kind`` on fresh storage, closed afterwards."""
    if kind == "memory":
        yield InMemorySessionStore()
    elif kind == "sqlite":
        async with SQLiteSessionStore(directory / "sessions.db") as sqlite_store:
            yield sqlite_store
    else:
        async with postgres_schema() as conninfo, PostgresSessionStore(conninfo) as postgres:
            yield postgres
