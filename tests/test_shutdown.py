"""How a process ends with runs under way: in real processes, with a real SQLite file."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import pytest

from littleghost.sessions import SQLiteSessionStore

DAEMON_THREAD_AT_EXIT = textwrap.dedent(
    """
    import functools
    import sys
    import threading

    import anyio
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import (
        BatchSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    from littleghost import Agent, tool
    from littleghost.sessions import SQLiteSessionStore
    from littleghost.testing import ScriptedModel, tool_call_response


    class Printed(SpanExporter):
        def export(self, spans):
            for span in spans:
                kind = span.attributes.get("error.type")
                print(span.name, span.status.status_code.name, kind, flush=True)
            return SpanExportResult.SUCCESS


    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Printed()))
    trace.set_tracer_provider(provider)
    looking = threading.Event()


    class Support(Agent):
        model = ScriptedModel([tool_call_response("look_up", {"order": "42"})])
        session_store = SQLiteSessionStore(sys.argv[1])

        @tool
        async def look_up(self, order: str) -> str:
            \"\"\"Look an order up.\"\"\"
            looking.set()
            await anyio.sleep_forever()


    def request() -> None:
        if sys.argv[2] == "run_sync":
            Support().run_sync("Where is order 42?", session_id="s")
        else:
            run = functools.partial(Support().run, "Where is order 42?", session_id="s")
            anyio.run(run, backend=sys.argv[2])


    threading.Thread(target=request, daemon=True).start()  # as a web server's request
    looking.wait()
    """
)


@pytest.mark.parametrize("how", ["run_sync", "trio"])
def test_a_run_in_a_daemon_thread_at_exit_answers_its_call_and_ends_its_span(
    tmp_path: Path, how: str
) -> None:
    """A daemon thread's run (a request thread of ``http.server``, Django or waitress)
    was stopped by the interpreter's exit wherever it was: its tool call stayed open and
    its ``invoke_agent`` span was never ended, so a ``BatchSpanProcessor`` flushing at
    exit lost it. It is stopped as by ``SystemExit`` as the interpreter exits."""
    database = tmp_path / "sessions.db"
    completed = subprocess.run(
        [sys.executable, "-c", DAEMON_THREAD_AT_EXIT, str(database), how],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert (completed.returncode, completed.stderr) == (0, "")
    assert "invoke_agent Support ERROR SystemExit" in completed.stdout.splitlines()

    async def stored() -> list[bool]:
        async with SQLiteSessionStore(database) as store:
            log = await store.load("s")
        return [result.is_error for message in log for result in message.tool_results]

    assert anyio.run(stored) == [True]  # the call is answered, as stopped
