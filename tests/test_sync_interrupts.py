"""Ctrl-C in ``run_sync()`` wherever the run is: the process stops at once with
``KeyboardInterrupt``, says nothing else, and the session's stored log is whole (each tool
call answered once, what was being written stored)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import anyio
import pytest

from littleghost.messages import Message
from littleghost.sessions import SQLiteSessionStore

STOPPED = """
import sqlite3
import sys
import threading
from pathlib import Path

import anyio
from littleghost import Agent, Message, before_model, manage_context, tool
from littleghost.sessions import SQLiteSessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

where, database, marks = sys.argv[1], sys.argv[2], Path(sys.argv[3])


def stopped_here(doing="running"):
    written = marks.with_suffix(".new")
    written.write_text(doing)
    written.replace(marks)  # whole


async def until_stopped(request=None):
    stopped_here("running" if request is None else request.purpose)
    await anyio.sleep_forever()


def locked_until_told():
    # another connection holds the database: the run's next write waits for it
    holder = sqlite3.connect(database, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN EXCLUSIVE")

    def release():
        sys.stdin.readline()  # the Ctrl-C came: the write goes on in the run's cleanup
        holder.rollback()
        holder.close()

    threading.Thread(target=release, daemon=True).start()
    threading.Timer(0.2, stopped_here, ["writing"]).start()  # the write has begun to wait


class Busy(Agent):
    session_store = SQLiteSessionStore(database)
    cleanup_grace = 60.0  # the write in flight is never cut short here
    model = ScriptedModel(
        [until_stopped] if where == "summary call"
        else [tool_call_response("look", {}), until_stopped, text_response("done")],
        context_window=1_000,
    )

    @tool
    async def look(self) -> str:
        \"\"\"Look.\"\"\"
        if where == "async tool":
            await until_stopped()
        if where == "session write":
            locked_until_told()
        return "found"

    @before_model
    async def check(self, request, *, context):
        if where == "hook" and context.turn == 1:
            await until_stopped()


if where == "summary call":  # the history fills the window: the run compacts first
    Busy = manage_context(preserve_recent_messages=2)(Busy)
history = [
    message
    for turn in range(30)
    for message in (Message.user(f"question {turn} " + "w " * 30), Message.assistant("a " * 30))
]
try:
    Busy().run_sync("go", session_id="s", history=history)
except KeyboardInterrupt:
    print("KeyboardInterrupt")
"""

PLACES = {
    "model call": "chat",
    "async tool": "running",
    "hook": "running",
    "session write": "writing",
    "summary call": "context_compaction",
}
"""Where the run is stopped, and what it is doing there."""


@pytest.mark.parametrize("where", PLACES)
def test_ctrl_c_leaves_the_stored_log_whole(tmp_path: Path, where: str) -> None:
    """Once stopped, the run answers its open call, finishes the write in flight (within
    its grace) and releases its session; nothing is half-written."""
    database, marks = tmp_path / "s.db", tmp_path / "stopped"
    with subprocess.Popen(
        [sys.executable, "-c", STOPPED, where, str(database), str(marks)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a shell starts it
    ) as child:
        assert child.stdin is not None
        try:
            while not marks.exists() and child.poll() is None:
                time.sleep(0.02)
            child.send_signal(signal.SIGINT)
            doing = marks.read_text()
            child.stdin.write("released\n")
            child.stdin.flush()
            out, err = child.communicate(timeout=60)
        finally:
            child.kill()  # not left behind when it hangs
    assert (child.returncode, out, err, doing) == (0, "KeyboardInterrupt\n", "", PLACES[where])
    log = anyio.run(_stored, database)
    assert len(log) >= 61  # the history and the question
    answered = [result.call_id for message in log for result in message.tool_results]
    assert sorted(answered) == sorted(call.id for message in log for call in message.tool_calls)
    if where in ("model call", "session write"):  # the tool had finished: its result is kept
        assert log[-1].tool_results[0].content == "found"
    if where == "summary call":
        assert not any(message.is_summary for message in log)


async def _stored(database: Path) -> tuple[Message, ...]:
    async with SQLiteSessionStore(database, read_only=True) as store:
        return await store.load("s")
