"""How a process ends with runs under way: in real processes, with a real SQLite file."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import anyio
import pytest

from littleghost import Agent, Message, tool
from littleghost.sessions import SQLiteSessionStore, message_from_json
from littleghost.testing import ScriptedModel, tool_call_response
from tests.stores import SlowWrites, working_until

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
    if sys.argv[3] == "with a server thread":  # no daemon: the exit waits for it first
        threading.Thread(target=threading.Event().wait, args=(0.2,)).start()
    """
)


@pytest.mark.parametrize("others", ["alone", "with a server thread"])
@pytest.mark.parametrize("how", ["run_sync", "trio"])
def test_a_run_in_a_daemon_thread_at_exit_answers_its_call_and_ends_its_span(
    tmp_path: Path, how: str, others: str
) -> None:
    """A daemon thread's run (a request thread of ``http.server``, Django or waitress)
    was stopped by the interpreter's exit wherever it was: its tool call stayed open and
    its ``invoke_agent`` span was never ended, so a ``BatchSpanProcessor`` flushing at
    exit lost it. It is stopped as by ``SystemExit`` as the interpreter exits (once a
    thread that is no daemon has ended, when one goes on after the main thread)."""
    database = tmp_path / "sessions.db"
    completed = subprocess.run(
        [sys.executable, "-c", DAEMON_THREAD_AT_EXIT, str(database), how, others],
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


SERVER_THREAD_GOES_ON = textwrap.dedent(
    """
    import threading

    import anyio

    from littleghost import Agent, tool
    from littleghost.testing import ScriptedModel, text_response, tool_call_response

    looking, ended = threading.Event(), threading.Event()


    class Support(Agent):
        model = ScriptedModel(
            [tool_call_response("look_up", {"order": "42"}), text_response("It has shipped.")]
        )

        @tool
        async def look_up(self, order: str) -> str:
            \"\"\"Look an order up, until after the main thread has returned.\"\"\"
            looking.set()
            while threading.main_thread().is_alive():
                await anyio.sleep(0.01)
            await anyio.sleep(0.1)
            return "shipped"


    def request() -> None:
        try:
            print(Support().run_sync("Where is order 42?").output, flush=True)
        except BaseException as error:
            print(type(error).__name__, error, flush=True)
        finally:
            ended.set()


    threading.Thread(target=request, daemon=True).start()  # a request of the server's
    looking.wait()
    threading.Thread(target=ended.wait, args=(30,)).start()  # the server goes on serving
    """
)


def test_a_run_in_a_daemon_thread_goes_on_while_a_thread_that_is_no_daemon_does() -> None:
    """The main thread returns while a thread that is no daemon (a server's) goes on:
    the interpreter waits for that thread, and its daemon request threads' runs go on
    meanwhile. They were stopped as the main thread returned, by a ``SystemExit``
    saying the interpreter exited."""
    completed = subprocess.run(
        [sys.executable, "-c", SERVER_THREAD_GOES_ON],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert (completed.returncode, completed.stdout, completed.stderr) == (
        0,
        "It has shipped.\n",
        "",
    )


LEFT_RUNNING = textwrap.dedent(
    """
    import asyncio
    import signal
    import sys
    import threading

    from littleghost import Agent, tool
    from littleghost.testing import ScriptedModel, tool_call_response


    class Support(Agent):
        model = ScriptedModel([tool_call_response("look_up", {"order": "42"})])

        @tool
        def look_up(self, order: str) -> str:
            \"\"\"Look an order up (a blocking client, whose call cannot be stopped).\"\"\"
            print("looking", flush=True)
            if sys.stdin.readline() == "take it here\\n":  # a Ctrl-C taken by this thread
                signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            return sys.stdin.readline()


    asyncio.run(Support().run("Where is order 42?"))
    """
)


@pytest.mark.parametrize("sent_to", ["the process", "the tool's thread"])
def test_the_exit_says_it_waits_for_a_sync_tool_a_stopped_run_left_running(
    sent_to: str,
) -> None:
    """Ctrl-C stops the run at once, but under asyncio the process then waits for the
    tool's thread, which no one can stop (trio's threads do not hold up an exit): it
    seemed to hang after the traceback. The exit says what it waits for, in one line.
    A Ctrl-C whose handler waits for the main thread as its event loop goes to sleep
    (one landing just before, as the tool's thread starts, or taken by another thread:
    the tool's here, as the race is not timed) stopped nothing until the call returned."""
    with subprocess.Popen(
        [sys.executable, "-c", LEFT_RUNNING],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a shell starts it
    ) as child:
        assert child.stdout is not None and child.stderr is not None and child.stdin is not None
        returns = threading.Timer(30, child.stdin.close)  # the tool's call, if nothing is said
        try:
            assert child.stdout.readline() == "looking\n"
            if sent_to == "the process":
                child.send_signal(signal.SIGINT)
            else:
                child.stdin.write("take it here\n")
                child.stdin.flush()
            returns.start()
            said = ""
            while line := child.stderr.readline():  # the traceback, then what the exit waits for
                said = line
                if said.startswith("the process waits"):
                    break
            returns.cancel()
            child.stdin.close()
            rest = child.stderr.read()
            child.wait(timeout=60)
        finally:
            returns.cancel()
            child.kill()  # not left behind when it hangs
    assert said == (
        "the process waits to exit until 1 sync tool call that stopped runs left running "
        "returns (a thread cannot be stopped): 'look_up'\n"
    )
    assert (child.returncode, rest) == (
        -signal.SIGINT,
        "tool 'look_up': a call the run stopped waiting for has returned; its late result "
        "was discarded\n",
    )


def shut_down_during(
    agent_class: type[Agent], in_tool: anyio.Event, store: SlowWrites, turns: int, last: float
) -> list[Message]:
    """What uvicorn with ``--timeout-graceful-shutdown`` and ``asyncio.run`` do, once
    ``agent_class``'s run of session ``s`` is in its one tool call (of its first tool,
    ``in_tool`` set): the server cancels its request task, closes the agent in its lifespan after
    ``turns`` turns of its own, takes ``last`` seconds more and returns, and
    ``asyncio.run`` cancels every task left, natively (no shield holds that). The
    session's stored log."""

    async def serve() -> None:
        agent = agent_class(session_store=store)
        name = agent.tool_specs[0].name
        agent.model = ScriptedModel([tool_call_response(name, {}, call_id="t1")])
        async with agent:  # the application's lifespan
            request = asyncio.create_task(agent.run("go", session_id="s"))
            await in_tool.wait()
            request.cancel()  # the graceful shutdown's timeout
            for _ in range(turns):
                await asyncio.sleep(0)
        await asyncio.sleep(last)  # the server's last steps; then every task left is cancelled

    asyncio.run(serve())
    stored = [message_from_json(text) for text in store.sessions["s"]]
    assert [message.role.value for message in stored] == ["user", "assistant", "tool"]
    assert stored[-1].tool_results[0].call_id == "t1"
    return stored


@pytest.mark.parametrize("turns", [1, 2, 3])  # the server's own turns (the lifespan's)
def test_a_server_shutdown_cancelling_twice_keeps_the_stopped_runs_last_writes(
    caplog: pytest.LogCaptureFixture, turns: int
) -> None:
    """The server's shutdown (``shut_down_during``) cancelled the stopped runs' cleanup
    too: the write answering the open call was cut off and the call left unanswered.
    ``aclose()`` waits for the runs that are stopping, so their writes are done before
    the event loop's end."""
    in_tool = anyio.Event()
    working = working_until(in_tool, anyio.Event())
    stored = shut_down_during(working, in_tool, SlowWrites(), turns, last=0.05)
    assert stored[-1].tool_results[0].is_error
    assert not [r for r in caplog.records if r.name == "littleghost.cleanup"]


def shielding_until(in_tool: anyio.Event) -> type[Agent]:
    """An agent whose ``pay`` tool sets ``in_tool``, then finishes what it does in a
    scope shielded from cancellation (a payment that must not be cut in half)."""

    class Paying(Agent):
        @tool
        async def pay(self) -> str:
            """Pay, shielded from cancellation."""
            in_tool.set()
            with anyio.CancelScope(shield=True):
                await anyio.sleep(0.1)
            return "paid"

    return Paying


@pytest.mark.parametrize("turns", [1, 2, 3])  # the server's own turns (the lifespan's)
def test_a_server_shutdown_while_a_tool_shields_its_work_keeps_its_result(
    caplog: pytest.LogCaptureFixture, turns: int
) -> None:
    """As above, the request cancelled while its tool runs in a scope shielded from
    cancellation: the run's task has taken up its cancellation (the task group of its
    tool calls cancelled them) but no task of it had seen it, so ``aclose()`` did not
    count the run as stopping and returned at once, and the end of the event loop cut
    the tool off: its result was lost and the call left open."""
    in_tool = anyio.Event()
    stored = shut_down_during(
        shielding_until(in_tool), in_tool, SlowWrites(seconds=0), turns, last=0.01
    )
    assert stored[-1].tool_results[0].content == "paid"
    assert not [r for r in caplog.records if r.name == "littleghost.cleanup"]
