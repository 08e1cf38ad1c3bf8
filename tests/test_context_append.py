"""``context.append()`` from hooks and tools: a run's appends are written one at a time, in
order, with every store, however many hooks and tools append at once; and what the log
never holds (a repeated id, a result that answers no open call) is refused with a
``ConfigurationError`` before anything is written.
"""

from __future__ import annotations

import functools
import random
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
import anyio.from_thread
import pytest

from littleghost import (
    Agent,
    Message,
    Role,
    RunContext,
    ToolCall,
    ToolResult,
    after_model,
    after_tool,
    before_tool,
    tool,
)
from littleghost.context.view import misplaced_results, unanswered_calls
from littleghost.errors import ConfigurationError
from littleghost.models import ModelResponse, StopReason
from littleghost.sessions import InMemorySessionStore, SessionStore
from littleghost.testing import (
    ScriptedModel,
    text_response,
    tool_call_response,
    tool_calls_response,
)

from .stores import RUN_KINDS, PlainStore, open_store

pytestmark = pytest.mark.anyio


@pytest.fixture(params=RUN_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    async with open_store(request.param, tmp_path, request) as opened:
        yield opened


def batch(count: int) -> ModelResponse:
    calls = [ToolCall(f"c{number}", "work", {"n": number}) for number in range(count)]
    return ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE)


def texts(messages: Sequence[Message]) -> list[str]:
    """The text of each message with some, a tool message's its results'."""
    said = [
        message.text or "".join(r.content for r in message.tool_results) for message in messages
    ]
    return [text for text in said if text]


def assert_whole(messages: Sequence[Message]) -> None:
    assert misplaced_results(messages) == []
    assert unanswered_calls(messages) == []
    assert len({message.id for message in messages}) == len(messages)


class Meeting:
    """Lets tasks go on only once ``size`` of them arrived."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.arrived = 0
        self.everyone = anyio.Event()

    async def arrive(self) -> None:
        self.arrived += 1
        if self.arrived == self.size:
            self.everyone.set()
        await self.everyone.wait()


class Noting(Agent):
    """Notes from both tool hooks and from the tools themselves, all during one batch."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)
        self.meeting = Meeting(3)

    @tool
    async def work(self, n: int, context: RunContext) -> str:
        """Work, leaving a note."""
        await self.meeting.arrive()  # every tool appends at once
        await context.append(Message.developer(f"tool {n}"))
        return f"done {n}"

    @before_tool
    async def before(self, call: ToolCall, *, context: RunContext) -> None:
        await context.append(Message.developer(f"before {call.id}"))

    @after_tool
    async def after(self, result: ToolResult, *, context: RunContext) -> None:
        # c0 finishes first: its result is stored while the others' notes are written
        await context.append(Message.developer(f"after {result.call_id}"))


async def test_hooks_and_tools_appending_during_a_batch_leave_the_run_whole(
    store: SessionStore,
) -> None:
    agent = Noting(model=ScriptedModel([batch(3), text_response("done")]), session_store=store)
    result = await agent.run("go", session_id="s")
    assert result.output == "done"
    assert await store.load("s") == result.messages
    notes = {f"{kind} c{n}" for kind in ("before", "after") for n in range(3)}
    assert notes | {f"tool {n}" for n in range(3)} <= set(texts(result.messages))
    assert_whole(result.messages)


class OverlapStore(PlainStore):
    """A custom store whose appends take a moment, noting whether two ever overlap."""

    def __init__(self) -> None:
        super().__init__()
        self.writing = 0
        self.most = 0

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        self.writing += 1
        self.most = max(self.most, self.writing)
        try:
            await anyio.lowlevel.checkpoint()
            await super().append(session_id, messages)
        finally:
            self.writing -= 1


async def test_a_runs_appends_are_written_one_at_a_time_in_log_order() -> None:
    store = OverlapStore()
    agent = Noting(model=ScriptedModel([batch(3), text_response("done")]), session_store=store)
    result = await agent.run("go", session_id="s")
    assert store.most == 1
    assert await store.load("s") == result.messages


async def test_an_append_waiting_its_turn_when_the_run_is_cancelled_writes_nothing() -> None:
    """The write in flight finishes within the grace; the one waiting behind it is
    cancelled unwritten; the batch's calls are answered after both."""
    gate, slow_started, second_appending = anyio.Event(), anyio.Event(), anyio.Event()

    class GatedStore(PlainStore):
        async def append(self, session_id: str, messages: Sequence[Message]) -> None:
            if any(message.text == "slow" for message in messages):
                slow_started.set()
                await gate.wait()
            await super().append(session_id, messages)

    class Stopped(Agent):
        @tool
        async def work(self, n: int, context: RunContext) -> str:
            """Work, leaving a note."""
            if n == 1:
                await slow_started.wait()
                second_appending.set()
            await context.append(Message.developer("slow" if n == 0 else "second"))
            return f"done {n}"

    store = GatedStore()
    agent = Stopped(model=ScriptedModel([batch(2), text_response("done")]), session_store=store)
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(agent.run, "go", session_id="s"))
            await second_appending.wait()
            scope.cancel()
            gate.set()
    stored = await store.load("s")
    assert (
        texts(stored)
        == ["go", "slow"]
        + [
            "The run was stopped before this tool call finished; it has no result, and what "
            "it does may have happened or may still happen: check before calling it again."
        ]
        * 2
    )
    assert_whole(stored)


@pytest.fixture(params=["none", "memory", "sqlite"])
async def maybe_store(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[SessionStore | None]:
    if request.param == "none":
        yield None
        return
    async with open_store(request.param, tmp_path, request) as opened:
        yield opened


Appending = Callable[[RunContext], Sequence[Message]]


async def noting(
    store: SessionStore | None, *appends: Appending
) -> tuple[list[str], tuple[Message, ...]]:
    """Run a turn whose ``after_model`` hook makes ``appends`` in turn; what
    ``ConfigurationError`` said of each one refused, and the run's log."""
    said: list[str] = []

    class Noter(Agent):
        @after_model
        async def note(self, response: ModelResponse, *, context: RunContext) -> None:
            for messages in appends:
                try:
                    await context.append(*messages(context))
                except ConfigurationError as error:
                    said.append(str(error))

    model = ScriptedModel([text_response("ok")])
    agent = Noter(model=model) if store is None else Noter(model=model, session_store=store)
    result = await agent.run("hi", session_id=None if store is None else "s")
    if store is not None:
        assert await store.load("s") == result.messages
    assert_whole(result.messages)
    return said, result.messages


async def test_an_id_the_log_holds_is_refused_and_nothing_is_written(
    maybe_store: SessionStore | None,
) -> None:
    said, log = await noting(maybe_store, lambda context: [context.messages[0]])
    assert said == [
        f"context.append() message 0 has the id {log[0].id!r} of a message already in the "
        "log; each message of a conversation needs an id of its own"
    ]
    assert texts(log) == ["hi", "ok"]


async def test_two_appended_messages_with_one_id_are_refused(
    maybe_store: SessionStore | None,
) -> None:
    twins = [Message.developer("note", id="n"), Message.developer("again", id="n")]
    said, log = await noting(maybe_store, lambda context: twins)
    assert said == [
        "context.append() message 0 and context.append() message 1 have the same id 'n'; "
        "each message of a conversation needs an id of its own"
    ]
    assert texts(log) == ["hi", "ok"]


@pytest.mark.parametrize(
    "stray",
    [
        [Message.tool("nope", "stray")],  # answers no call
        [  # answers a call twice
            Message.assistant(tool_calls=[ToolCall("x", "lookup", {})]),
            Message.tool("x", "first"),
            Message.tool("x", "second"),
        ],
    ],
    ids=["orphan", "second answer"],
)
async def test_a_result_that_answers_no_open_call_is_refused_and_nothing_is_written(
    maybe_store: SessionStore | None, stray: list[Message]
) -> None:
    said, log = await noting(maybe_store, lambda context: stray)
    call_id = stray[-1].tool_results[0].call_id
    assert len(said) == 1
    assert said[0].startswith(
        f"context.append() message {len(stray) - 1} holds a result for call {call_id!r}, "
        "which answers no open call"
    )
    assert texts(log) == ["hi", "ok"]


async def test_a_tool_message_without_a_result_is_refused(
    maybe_store: SessionStore | None,
) -> None:
    said, _ = await noting(maybe_store, lambda context: [Message(Role.TOOL, "x")])
    assert said == ["context.append() message 0 is a tool message without a result"]


async def test_a_message_holding_a_part_its_role_cannot_carry_is_refused(
    maybe_store: SessionStore | None,
) -> None:
    """A tool call in a user message would be dropped or refused by the provider."""
    stray = Message(Role.USER, (ToolCall("x", "lookup", {}),))
    said, log = await noting(maybe_store, lambda context: [stray])
    assert said == [
        "context.append() message 0: a message of role 'user' carries only TextPart, "
        "ImagePart parts, not ToolCall"
    ]
    assert texts(log) == ["hi", "ok"]


async def test_a_call_may_be_answered_by_a_later_append(maybe_store: SessionStore | None) -> None:
    calls = [ToolCall("x", "lookup", {}), ToolCall("y", "lookup", {})]
    said, log = await noting(
        maybe_store,
        lambda context: [Message.assistant(tool_calls=calls), Message.tool("x", "found")],
        lambda context: [Message.tool("y", "found too")],
    )
    assert said == []
    assert texts(log) == ["hi", "found", "found too", "ok"]


async def test_a_call_left_without_a_result_fails_before_the_model_call(
    maybe_store: SessionStore | None,
) -> None:
    """A call a tool appends with no result would go out unanswered, which providers
    refuse (a 400 at the next call): a ``ConfigurationError`` naming it comes before the
    call instead; the call is answered in the log as the run fails, and kept whole."""

    class Planting(Agent):
        @tool
        async def plan(self, context: RunContext) -> str:
            """Plan."""
            await context.append(Message.assistant(tool_calls=[ToolCall("x", "lookup", {})]))
            return "planned"

    model = ScriptedModel([tool_call_response("plan", {}, call_id="p"), text_response("never")])
    agent = Planting(model=model, **({} if maybe_store is None else {"session_store": maybe_store}))
    with pytest.raises(
        ConfigurationError, match=r"without a result before the model call: 'x' \(tool 'lookup'\)"
    ):
        await agent.run("hi", session_id=None if maybe_store is None else "s")
    assert len(model.requests) == 1
    if maybe_store is not None:
        assert_whole(await maybe_store.load("s"))


async def test_a_call_left_without_a_result_as_the_run_ends_fails_the_run(
    maybe_store: SessionStore | None,
) -> None:
    """A call an ``after_model`` hook appends to the last answer's turn, with no model
    call after it to check, fails the run as it would before one: the run ends with a
    ``ConfigurationError`` naming it, the call answered in the log (and the session)."""

    class Planting(Agent):
        @after_model
        async def plan(self, response: ModelResponse, *, context: RunContext) -> None:
            await context.append(Message.assistant(tool_calls=[ToolCall("x", "lookup", {})]))

    agent = Planting(
        model=ScriptedModel([text_response("done")]),
        **({} if maybe_store is None else {"session_store": maybe_store}),
    )
    with pytest.raises(
        ConfigurationError, match=r"without a result as the run ends: 'x' \(tool 'lookup'\)"
    ):
        await agent.run("hi", session_id=None if maybe_store is None else "s")
    if maybe_store is not None:
        assert_whole(await maybe_store.load("s"))


async def planted_run(where: str, at: int, widths: Sequence[int], call_id: str) -> bool:
    """Run a script of tool batches ``widths`` wide, then an answer, whose ``where`` (a
    hook kind, or ``tool``) appends a call ``call_id`` with no result at turn ``at``;
    whether it did. The run fails naming the call if it did, and the session is whole."""
    planted: list[str] = []

    async def plant(kind: str, context: RunContext) -> None:
        if kind == where and context.turn == at and not planted:
            planted.append(kind)  # before the await: parallel calls plant once
            call = ToolCall(call_id, "lookup", {})
            await context.append(Message.assistant(tool_calls=[call]))

    class Planting(Agent):
        @tool
        async def work(self, context: RunContext) -> str:
            """Work."""
            await plant("tool", context)
            return "done"

        @after_model
        async def answered(self, response: ModelResponse, *, context: RunContext) -> None:
            await plant("after_model", context)

        @before_tool
        async def calling(self, call: ToolCall, *, context: RunContext) -> None:
            await plant("before_tool", context)

        @after_tool
        async def returned(self, result: ToolResult, *, context: RunContext) -> None:
            await plant("after_tool", context)

    script = [tool_calls_response(*[("work", {})] * width) for width in widths]
    store = InMemorySessionStore()
    agent = Planting(model=ScriptedModel([*script, text_response("over")]), session_store=store)
    try:
        await agent.run("hi", session_id="s")
    except ConfigurationError as error:
        assert planted and f"{call_id!r} (tool 'lookup')" in str(error), error
    else:
        assert not planted
    assert_whole(await store.load("s"))
    return bool(planted)


async def test_a_call_left_without_a_result_anywhere_never_ends_a_run_unanswered() -> None:
    """Randomized: a hook of any kind, or a tool, appends a call and never its result, at
    a random turn of a random script (parallel calls, the last turn included): the run
    fails with a ``ConfigurationError`` naming it, and the session holds it answered."""
    rng = random.Random(7)
    planted = 0
    for draw in range(60):
        widths = [rng.randrange(1, 4) for _ in range(rng.randrange(0, 3))]
        where = rng.choice(["after_model", "before_tool", "after_tool", "tool"])
        planted += await planted_run(where, rng.randrange(len(widths) + 1), widths, f"x{draw}")
    assert planted > 30


async def test_has_message_tells_the_log_s_ids() -> None:
    seen: list[bool] = []

    class Pinning(Agent):
        @after_model
        async def pin(self, response: ModelResponse, *, context: RunContext) -> None:
            for _ in range(2):
                if not context.has_message("policy"):
                    await context.append(Message.developer("policy", id="policy"))
                seen.append(context.has_message("policy"))

    agent = Pinning(model=ScriptedModel([text_response("ok")]))
    result = await agent.run("hi")
    assert seen == [True, True]
    assert [message.id for message in result.messages].count("policy") == 1


async def test_what_is_not_a_message_is_refused() -> None:
    class Careless(Agent):
        @after_model
        async def note(self, response: ModelResponse, *, context: RunContext) -> None:
            await context.append("a note")  # type: ignore[arg-type]

    with pytest.raises(TypeError, match=r"context.append\(\) takes Message values, not str"):
        await Careless(model=ScriptedModel([text_response("ok")])).run("hi")


async def test_a_tool_cannot_answer_a_call_of_the_batch_being_run() -> None:
    """A result for a call the run is running is the tool's return value: a tool that
    appends one for its own call fails, with the reason, and the run goes on whole."""

    class Progress(Agent):
        @tool
        async def work(self, n: int, context: RunContext) -> str:
            """Work on n."""
            await context.append(Message.tool("c0", "progress: 50%"))
            return "done"

    model = ScriptedModel([batch(1), text_response("ok")])
    result = await Progress(model=model).run("go")
    assert result.output == "ok"
    (answer,) = [m for m in result.messages if m.role is Role.TOOL]
    (outcome,) = answer.tool_results
    assert outcome.is_error
    assert "ConfigurationError" in outcome.content
    assert "answers call 'c0', which the run is running" in outcome.content
    assert_whole(result.messages)


class Keeping(Agent):
    """Keeps the context its tool is given past the tool's call."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.kept: list[RunContext] = []

    @tool
    async def keep(self, context: RunContext) -> str:
        """Keep the context."""
        self.kept.append(context)
        return "kept"


async def test_a_context_kept_past_its_run_appends_nothing(store: SessionStore) -> None:
    """Its run no longer holds the session: an append would land outside any run, or in
    another run's log, which it would then fail as a change under its hold."""
    agent = Keeping(
        model=ScriptedModel([tool_call_response("keep", {}), text_response("ok")] * 2),
        session_store=store,
    )
    ran = await agent.run("go", session_id="s")
    context = agent.kept[0]
    with pytest.raises(ConfigurationError, match="the run of this context has ended"):
        await context.append(Message.user("a stale note"))
    assert await store.load("s") == ran.messages

    async def stale() -> None:
        await anyio.sleep(0.01)  # while the next run holds the session
        with pytest.raises(ConfigurationError, match="the run of this context has ended"):
            await context.append(Message.user("a stale note"))

    async with anyio.create_task_group() as group:
        group.start_soon(stale)
        again = await agent.run("again", session_id="s")
    assert again.output == "ok" and await store.load("s") == again.messages


class Lingering(Agent):
    """A sync tool that goes on in its thread past its timeout, then appends a note."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.late: list[str] = []
        self.tried = threading.Event()

    @tool(timeout=0.05)
    def linger(self, context: RunContext) -> str:
        """Note something, too late."""
        time.sleep(0.2)
        try:
            anyio.from_thread.run(context.append, Message.user("a late note"))
            self.late.append("appended")
        except ConfigurationError as error:
            self.late.append(str(error))
        self.tried.set()
        return "too late"


async def test_a_tool_call_stopped_at_its_timeout_appends_nothing_later() -> None:
    """Its late result is discarded, and so is what it appends: the log and the store
    keep only what the run wrote, in order."""

    async def after_the_late_append(request: Any) -> ModelResponse:
        assert await anyio.to_thread.run_sync(agent.tried.wait, 5)
        return text_response("ok")

    script = [tool_call_response("linger", {}), after_the_late_append]
    agent = Lingering(model=ScriptedModel(script), session_store=InMemorySessionStore())
    result = await agent.run("go", session_id="s")
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]
    assert "the call of tool 'linger' it comes from is over" in agent.late[0]
    assert await agent.session_store.load("s") == result.messages
