"""Runs keep their deadline, their cancellation and a whole log under faults.

Each reproduction of issue 12 as a regression test through the public API, under asyncio
and trio: the store first, then the log; bounded cleanup; cancellation that stays
cancellation; whose deadline it is; events after facts.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import attrs
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
    before_model,
    before_tool,
    tool,
)
from littleghost.errors import (
    DeadlineExceededError,
    SessionStoreError,
    UnstorableValueError,
)
from littleghost.events import ModelCallFinished, ToolCallFinished
from littleghost.models import ModelRequest, ModelResponse, StopReason, register_provider
from littleghost.sessions import InMemorySessionStore, SessionStore, SQLiteSessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

from .faults import stray_cancellation
from .timing import LATE

pytestmark = pytest.mark.anyio


class Unusual(BaseException):
    """A BaseException that is neither KeyboardInterrupt, SystemExit nor a cancellation."""


GRACE = 0.3
"""The cleanup grace of the agents here (short, so the tests are quick)."""


def valid(log: Sequence[Message]) -> None:
    """Every tool result follows its call; every call (repeated ids counted apart) is
    answered at most once."""
    open_calls: Counter[str] = Counter()
    ids = [message.id for message in log]
    assert len(ids) == len(set(ids)), "a message is stored twice"
    for message in log:
        open_calls.update(call.id for call in message.tool_calls)
        for result in message.tool_results:
            assert open_calls[result.call_id], f"result for {result.call_id} without an open call"
            open_calls[result.call_id] -= 1


class SlowStore:
    """A store whose appends (after the first ``fast`` of them) take ``delay`` seconds."""

    def __init__(self, delay: float, fast: int = 0, fail: bool = False) -> None:
        self.inner = InMemorySessionStore()
        self.delay = delay
        self.fast = fast
        self.fail = fail
        self.appends = 0

    async def load(self, session_id: str) -> tuple[Message, ...]:
        return await self.inner.load(session_id)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        self.appends += 1
        if self.appends > self.fast:
            await anyio.sleep(self.delay)
            if self.fail:
                raise SessionStoreError("the store is down")
        await self.inner.append(session_id, messages)

    async def list_sessions(self) -> tuple[str, ...]:
        return await self.inner.list_sessions()

    async def delete(self, session_id: str) -> None:
        await self.inner.delete(session_id)


class Waiter(Agent):
    instructions = "Wait."
    cleanup_grace = GRACE

    @tool
    async def wait(self, seconds: float) -> str:
        """Wait a while."""
        await anyio.sleep(seconds)
        return "waited"


def waiting_model() -> ScriptedModel:
    return ScriptedModel(
        [tool_call_response("wait", {"seconds": 10}, call_id="c1"), text_response("done")]
    )


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    if request.param == "memory":
        yield InMemorySessionStore()
    else:
        async with SQLiteSessionStore(tmp_path / "sessions.db", timeout=0.2) as sqlite_store:
            yield sqlite_store


class TestTheStoreFirst:
    async def test_a_locked_database_ends_the_run_and_stores_no_result_without_its_call(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "sessions.db"
        blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)

        class Locking(Waiter):
            @after_model
            def lock_the_database(self, response: ModelResponse) -> None:
                if response.message.tool_calls:
                    blocker.execute("BEGIN EXCLUSIVE")

        async with SQLiteSessionStore(path, timeout=0.2) as store:
            agent = Locking(model=waiting_model(), session_store=store)
            await store.append("s", [])  # the file and its tables exist before the lock
            with pytest.raises(SessionStoreError):
                await agent.run("Wait for me.", session_id="s", timeout=5)
            blocker.execute("ROLLBACK")
            blocker.close()
            stored = await store.load("s")
        valid(stored)
        assert [message.role for message in stored] == [Role.USER]

    @pytest.mark.parametrize("value", [{1, 2}, b"raw"], ids=["set", "bytes"])
    async def test_unstorable_tool_arguments_are_refused_before_anything_of_the_message_is_written(
        self, store: SessionStore, value: object
    ) -> None:
        model = ScriptedModel(  # the call is made as the model answers, in the run
            [lambda request: tool_call_response("wait", {"seconds": value}), text_response("x")]
        )
        with pytest.raises(TypeError, match=r"ToolCall\.arguments\['seconds'\] is of type"):
            await Waiter(model=model, session_store=store).run("Go.", session_id="s")
        stored = await store.load("s")
        assert [message.role for message in stored] == [Role.USER]

    async def test_an_after_model_hook_adding_unstorable_metadata_stores_nothing_of_that_message(
        self, store: SessionStore
    ) -> None:
        class Tagging(Waiter):
            @after_model
            def tag(self, response: ModelResponse) -> ModelResponse:
                message = attrs.evolve(response.message, metadata={"seen": object()})
                return attrs.evolve(response, message=message)

        model = ScriptedModel([tool_call_response("wait", {"seconds": 0}), text_response("x")])
        with pytest.raises(UnstorableValueError, match=r"metadata\['seen'\]"):
            await Tagging(model=model, session_store=store).run("Go.", session_id="s")
        stored = await store.load("s")
        valid(stored)
        assert [message.role for message in stored] == [Role.USER]

    async def test_a_failed_write_leaves_the_log_as_the_store_has_it(self) -> None:
        store = SlowStore(0, fast=1, fail=True)  # the user message lands; the answer fails
        agent = Waiter(model=ScriptedModel([text_response("hello")]), session_store=store)
        async with agent.stream("Hi.", session_id="s") as events:
            with pytest.raises(SessionStoreError):
                async for _ in events:
                    pass
        assert events.messages == await store.load("s")
        assert [message.text for message in events.messages] == ["Hi."]


class TestBoundedCleanup:
    @pytest.mark.virtual_clock
    async def test_a_slow_store_keeps_the_deadline_plus_the_grace(self) -> None:
        store = SlowStore(30.0, fast=2)  # user message and the call land; the rest is slow
        agent = Waiter(model=waiting_model(), session_store=store)
        began = anyio.current_time()
        with pytest.raises(DeadlineExceededError) as caught:
            await agent.run("Wait.", session_id="s", timeout=0.2)
        assert anyio.current_time() - began == pytest.approx(0.2 + GRACE)
        assert isinstance(caught.value.__cause__, TimeoutError)
        valid(await store.load("s"))

    @pytest.mark.virtual_clock
    async def test_a_callers_cancel_scope_is_honoured_within_the_grace(self) -> None:
        store = SlowStore(30.0, fast=2)
        agent = Waiter(model=waiting_model(), session_store=store)
        began = anyio.current_time()
        with anyio.move_on_after(0.2) as scope:
            await agent.run("Wait.", session_id="s")
        assert scope.cancelled_caught
        assert anyio.current_time() - began == pytest.approx(0.2 + GRACE)

    @pytest.mark.virtual_clock
    async def test_a_cleanup_that_could_not_finish_is_logged_without_content(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        store = SlowStore(30.0, fast=2)
        agent = Waiter(model=waiting_model(), session_store=store)
        with (
            caplog.at_level(logging.WARNING, "littleghost.cleanup"),
            pytest.raises(DeadlineExceededError),
        ):
            await agent.run("Secret words.", session_id="s", timeout=0.2)
        lines = [record.getMessage() for record in caplog.records]
        assert any("could not be done" in line for line in lines), lines
        assert not any("Secret" in line or "stopped before" in line for line in lines)

    async def test_a_stopped_run_answers_its_open_call_within_the_grace(
        self, store: SessionStore
    ) -> None:
        agent = Waiter(model=waiting_model(), session_store=store)
        with pytest.raises(DeadlineExceededError):  # time for the call to start, on a busy machine
            await agent.run("Wait.", session_id="s", timeout=1.0)
        stored = await store.load("s")
        valid(stored)
        [result] = [r for message in stored for r in message.tool_results]
        assert result.is_error and "stopped" in result.content

    @pytest.mark.virtual_clock
    @pytest.mark.parametrize("ids", [("a", "b"), ("x", "x")], ids=["distinct", "repeated"])
    async def test_finished_results_are_stored_when_the_run_stops_whatever_their_call_ids(
        self, ids: tuple[str, str]
    ) -> None:
        """The deadline passes while the first result is being stored, after the second
        call finished: both results are stored, also when the two calls share an id."""
        finished = anyio.Event()

        class SlowResults(InMemorySessionStore):
            stalled = False

            async def append(self, session_id: str, messages: Sequence[Message]) -> None:
                if any(message.tool_results for message in messages):
                    if not self.stalled:  # the first result's write outlasts the deadline
                        self.stalled = True
                        await finished.wait()
                        await anyio.sleep(0.5)
                    await anyio.sleep(0.15)
                await super().append(session_id, messages)

        class Pair(Agent):
            cleanup_grace = 1.0  # room for both writes on a busy machine

            @tool
            async def fast(self) -> str:
                """Answer at once."""
                return "fast"

            @tool
            async def slower(self) -> str:
                """Finish while the first result is being stored."""
                await anyio.sleep(0.05)
                finished.set()
                return "slower"

        calls = [ToolCall(ids[0], "fast", {}), ToolCall(ids[1], "slower", {})]
        model = ScriptedModel(
            [ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE)]
        )
        store = SlowResults()
        with pytest.raises(DeadlineExceededError):
            await Pair(model=model, session_store=store).run("Go.", session_id="s", timeout=0.5)
        stored = await store.load("s")
        valid(stored)
        assert [r.content for message in stored for r in message.tool_results] == [
            "fast",
            "slower",
        ]

    @pytest.mark.parametrize("ids", [("a", "b"), ("x", "x")], ids=["distinct", "repeated"])
    async def test_a_stopped_run_answers_each_open_call_once_whatever_their_call_ids(
        self, store: SessionStore, ids: tuple[str, str]
    ) -> None:
        calls = [
            ToolCall(ids[0], "wait", {"seconds": 0}),
            ToolCall(ids[1], "wait", {"seconds": 10}),
        ]
        model = ScriptedModel(
            [ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE)]
        )
        with pytest.raises(DeadlineExceededError):  # time for the calls to start, when busy
            await Waiter(model=model, session_store=store).run("Go.", session_id="s", timeout=1.0)
        stored = await store.load("s")
        valid(stored)
        [first, second] = [r for message in stored for r in message.tool_results]
        assert first.content == "waited"
        assert second.is_error and "stopped" in second.content

    async def test_a_locked_database_keeps_the_deadline(self, tmp_path: Path) -> None:
        path = tmp_path / "sessions.db"
        async with SQLiteSessionStore(path, timeout=30) as store:
            await store.append("s", [Message.user("earlier")])
            blocker = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
            blocker.execute("BEGIN EXCLUSIVE")
            try:
                agent = Waiter(model=waiting_model(), session_store=store)
                began = time.monotonic()
                with pytest.raises(DeadlineExceededError):
                    await agent.run("Wait.", session_id="s", timeout=1)
                assert time.monotonic() - began < 1 + GRACE + LATE
            finally:
                blocker.execute("ROLLBACK")
                blocker.close()
            valid(await store.load("s"))


class TestCancellationStaysCancellation:
    @pytest.mark.virtual_clock
    async def test_a_failing_cleanup_never_replaces_the_cancellation(self) -> None:
        store = SlowStore(0.05, fast=2, fail=True)  # the stop's writes fail
        agent = Waiter(model=waiting_model(), session_store=store)
        with anyio.move_on_after(0.2) as scope:
            await agent.run("Wait.", session_id="s")
        assert scope.cancelled_caught
        valid(await store.load("s"))

    @pytest.mark.virtual_clock
    async def test_a_write_in_flight_that_fails_after_the_cancel_keeps_the_cancellation(
        self,
    ) -> None:
        store = SlowStore(0.2, fail=True)  # the very first write is in flight, then fails
        agent = Waiter(model=ScriptedModel([text_response("x")]), session_store=store)
        with anyio.move_on_after(0.05) as scope:
            await agent.run("Hi.", session_id="s")
        assert scope.cancelled_caught
        assert await store.load("s") == ()

    async def test_a_tool_raising_a_cancellation_of_its_own_gets_an_error_result(self) -> None:
        class Odd(Agent):
            @tool
            async def odd(self) -> str:
                """Raise a cancellation exception nobody asked for."""
                raise asyncio.CancelledError()

        model = ScriptedModel([tool_call_response("odd", {}), text_response("ok")])
        result = await Odd(model=model).run("Go.")
        assert result.output == "ok"
        [answer] = [r for message in result.messages for r in message.tool_results]
        assert answer.is_error
        valid(result.messages)

    @pytest.mark.parametrize("hook", ["before_tool", "after_tool"])
    async def test_a_tool_hook_raising_a_cancellation_of_its_own_ends_the_run(
        self, hook: str
    ) -> None:
        """As a stray cancellation from the model does: run() raises it, and the call
        is answered in the log (the model is never asked again)."""

        mark = {"before_tool": before_tool, "after_tool": after_tool}[hook]

        class Leaky(Agent):
            @tool
            async def lookup(self) -> str:
                """Look something up."""
                return "found"

            @mark
            async def leak(self, payload: Any) -> None:
                raise await stray_cancellation()

        model = ScriptedModel([tool_call_response("lookup", {}, call_id="c1"), text_response("x")])
        store = InMemorySessionStore()
        with pytest.raises(anyio.get_cancelled_exc_class()):
            await Leaky(model=model, session_store=store).run("Go.", session_id="s")
        assert len(model.requests) == 1
        stored = await store.load("s")
        valid(stored)
        [answer] = [r for message in stored for r in message.tool_results]
        assert answer.call_id == "c1" and answer.is_error

    @pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
    async def test_keyboard_interrupt_and_system_exit_propagate_as_themselves(
        self, kind: type[BaseException]
    ) -> None:
        class Exiting(Agent):
            @tool
            async def stop(self) -> str:
                """Stop everything."""
                raise kind()

            @tool
            async def slow(self) -> str:
                """Take a while."""
                await anyio.sleep(10)
                return "slow"

        calls = [ToolCall("c1", "stop", {}), ToolCall("c2", "slow", {})]
        model = ScriptedModel(
            [ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE)]
        )
        store = InMemorySessionStore()
        with pytest.raises(kind) as caught:
            await Exiting(model=model, session_store=store).run("Go.", session_id="s")
        assert type(caught.value) is kind
        stored = await store.load("s")
        valid(stored)
        assert len([r for message in stored for r in message.tool_results]) == 2

    @pytest.mark.parametrize("kind", [GeneratorExit, Unusual])
    @pytest.mark.parametrize("hook", ["before_tool", "after_tool"])
    async def test_a_tool_hook_raising_another_base_exception_ends_the_run_with_it(
        self, hook: str, kind: type[BaseException]
    ) -> None:
        """As any other exception of a hook: itself, never in an exception group; the
        log stays whole."""
        mark = {"before_tool": before_tool, "after_tool": after_tool}[hook]

        class Odd(Agent):
            @tool
            def lookup(self) -> str:
                """Look something up."""
                return "found"

            @mark
            def odd(self, payload: Any) -> None:
                raise kind()

        model = ScriptedModel([tool_call_response("lookup", {}, call_id="c1"), text_response("x")])
        store = InMemorySessionStore()
        with pytest.raises(kind) as caught:
            await Odd(model=model, session_store=store).run("Go.", session_id="s")
        assert type(caught.value) is kind
        stored = await store.load("s")
        valid(stored)
        assert len([r for message in stored for r in message.tool_results]) == 1


def test_system_exit_inside_a_tools_own_task_group_propagates_as_itself() -> None:
    """Under trio (asyncio itself ends the event loop with it, whatever the run does)."""

    class FanOut(Agent):
        @tool
        async def fan_out(self) -> str:
            """Do two things at once, one of which ends the process."""

            async def leave() -> None:
                raise SystemExit(3)

            async with anyio.create_task_group() as group:
                group.start_soon(leave)
                group.start_soon(anyio.sleep, 10)
            return "never"

    async def main() -> None:
        model = ScriptedModel([tool_call_response("fan_out", {}), text_response("x")])
        await FanOut(model=model).run("Go.")

    with pytest.raises(SystemExit) as caught:
        anyio.run(main, backend="trio")
    assert type(caught.value) is SystemExit and caught.value.code == 3


class Nested(Agent):
    instructions = "Think slowly."


class Outer(Agent):
    @tool
    async def ask_the_expert(self, question: str) -> str:
        """Ask a slower agent, with a short timeout of its own."""

        async def slow(request: Any) -> ModelResponse:
            await anyio.sleep(10)
            return text_response("late")

        result = await Nested(model=ScriptedModel([slow])).run(question, timeout=0.05)
        return result.output

    @tool
    async def ask_two_experts(self, question: str) -> str:
        """Ask two slower agents at once."""
        async with anyio.create_task_group() as group:
            group.start_soon(self.ask_the_expert, question)
            group.start_soon(anyio.sleep, 10)
        return "never"

    @tool(timeout=0.1)
    async def hang(self) -> str:
        """Hang."""
        await anyio.sleep(10)
        return "never"

    @tool(timeout=0.1)
    def block(self) -> str:
        """Block a thread for a while (a sync tool cannot be stopped)."""
        time.sleep(0.5)
        return "late"


class TestWhoseDeadline:
    @pytest.mark.virtual_clock
    async def test_a_nested_runs_deadline_is_the_tools_error(self) -> None:
        model = ScriptedModel(
            [tool_call_response("ask_the_expert", {"question": "?"}), text_response("ok")]
        )
        result = await Outer(model=model).run("Go.", timeout=5)
        assert result.output == "ok"
        [answer] = [r for message in result.messages for r in message.tool_results]
        assert answer.is_error and "DeadlineExceededError" in answer.content

    @pytest.mark.virtual_clock
    async def test_a_failure_in_a_tools_task_group_is_told_as_itself(self) -> None:
        """The model (and the span) learn what failed, not "unhandled errors in a
        TaskGroup"; a nested run's deadline there is still the tool's error."""
        model = ScriptedModel(
            [tool_call_response("ask_two_experts", {"question": "?"}), text_response("ok")]
        )
        result = await Outer(model=model).run("Go.", timeout=5)
        assert result.output == "ok"
        [answer] = [r for message in result.messages for r in message.tool_results]
        assert answer.is_error
        assert answer.content.startswith("Tool 'ask_two_experts' failed: DeadlineExceededError:")

    @pytest.mark.virtual_clock
    async def test_a_tool_timeout_is_an_error_result_and_the_run_goes_on(self) -> None:
        model = ScriptedModel([tool_call_response("hang", {}), text_response("ok")])
        began = anyio.current_time()
        result = await Outer(model=model).run("Go.")
        assert anyio.current_time() - began == pytest.approx(0.1)
        [answer] = [r for message in result.messages for r in message.tool_results]
        assert answer.is_error and "did not finish within 0.1 s and was stopped" in answer.content

    async def test_a_sync_tool_past_its_timeout_is_answered_and_its_late_result_discarded(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        model = ScriptedModel([tool_call_response("block", {}), text_response("ok")])
        with caplog.at_level(logging.INFO, "littleghost.tools"):
            result = await Outer(model=model).run("Go.")
            [answer] = [r for message in result.messages for r in message.tool_results]
            assert answer.is_error and "cannot be stopped" in answer.content
            await anyio.sleep(0.8)  # the thread finishes meanwhile
        assert any("block" in record.getMessage() for record in caplog.records)

    @pytest.mark.virtual_clock
    async def test_the_runs_own_deadline_ends_the_run(self) -> None:
        model = ScriptedModel([tool_call_response("hang", {})])
        with pytest.raises(DeadlineExceededError):
            await Outer(model=model).run("Go.", timeout=0.05)


class TestEventsAfterFacts:
    async def test_leaving_on_model_call_finished_keeps_the_answer(self) -> None:
        store = InMemorySessionStore()
        agent = Waiter(model=ScriptedModel([text_response("the answer")]), session_store=store)
        async with agent.stream("Question?", session_id="s") as events:
            async for event in events:
                if isinstance(event, ModelCallFinished):
                    break
        assert [message.text for message in await store.load("s")] == ["Question?", "the answer"]
        assert events.messages[-1].text == "the answer"

    async def test_leaving_on_tool_call_finished_keeps_the_result(self) -> None:
        store = InMemorySessionStore()
        model = ScriptedModel([tool_call_response("wait", {"seconds": 0}), text_response("x")])
        agent = Waiter(model=model, session_store=store)
        async with agent.stream("Go.", session_id="s") as events:
            async for event in events:
                if isinstance(event, ToolCallFinished):
                    seen = event.result
                    break
        stored = await store.load("s")
        assert seen in [r for message in stored for r in message.tool_results]
        valid(stored)


class HangingRelease(InMemorySessionStore):
    """A store that holds its sessions itself and never finishes releasing one."""

    @asynccontextmanager
    async def lock(self, session_id: str) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await anyio.sleep(60)


class InterruptingStore(InMemorySessionStore):
    """A store whose ``fatal``-th append raises ``kind`` (Ctrl-C in a driver, say)."""

    def __init__(self, kind: type[BaseException], fatal: int) -> None:
        super().__init__()
        self.kind = kind
        self.fatal = fatal
        self.appends = 0

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        self.appends += 1
        if self.appends == self.fatal:
            raise self.kind()
        await super().append(session_id, messages)


class LeakingStore(InMemorySessionStore):
    """A store whose ``leak``-th append raises a cancellation nobody asked for."""

    def __init__(self, leak: int) -> None:
        super().__init__()
        self.leak = leak
        self.appends = 0

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        self.appends += 1
        if self.appends == self.leak:
            raise await stray_cancellation()
        await super().append(session_id, messages)


class FanningOutStore(InMemorySessionStore):
    """A store whose ``method`` raises ``kind`` from a task group of its own."""

    def __init__(self, method: str, kind: type[BaseException]) -> None:
        super().__init__()
        self.method = method
        self.kind = kind

    async def _fan_out(self) -> None:
        async def leave() -> None:
            raise self.kind()

        async with anyio.create_task_group() as group:
            group.start_soon(leave)
            group.start_soon(anyio.sleep, 10)

    async def load(self, session_id: str) -> tuple[Message, ...]:
        if self.method == "load":
            await self._fan_out()
        return await super().load(session_id)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        if self.method == "append":
            await self._fan_out()
        await super().append(session_id, messages)


NESTED_GRACE = 1.0
"""The grace of the agents below, whose tests run on a virtual clock (``virtual``): a run
stopped at 0.3 s whose cleanup takes all its grace ends at ``0.3 + NESTED_GRACE``
exactly, however loaded the machine; a second grace would end it a grace later."""


class Expert(Waiter):
    cleanup_grace = NESTED_GRACE


def asking(patience: float) -> type[Agent]:
    """An agent whose tool asks an expert with ``patience`` times its grace, whose store
    is slow (so its cleanup takes its whole grace)."""

    class Patient(Expert):
        cleanup_grace = patience * NESTED_GRACE

    class Asking(Agent):
        cleanup_grace = NESTED_GRACE

        @tool
        async def ask(self, question: str) -> str:
            """Ask an expert whose store is slow."""
            expert = Patient(model=waiting_model(), session_store=SlowStore(60.0, fast=2))
            return (await expert.run(question, session_id="inner")).output

    return Asking


async def consult() -> None:
    """Run an expert whose store is slow (so its cleanup takes its whole grace)."""
    expert = Expert(model=waiting_model(), session_store=SlowStore(60.0, fast=2))
    await expert.run("?", session_id="inner")


class Consulting(Agent):
    """Starts a nested run from the place its subclass names, not from a tool."""

    cleanup_grace = NESTED_GRACE

    @tool
    async def wait(self) -> str:
        """Wait for nothing."""
        return "waited"


class ConsultingModel(ScriptedModel):
    """A model that consults an expert (a nested run) before it answers."""

    async def respond(self, request: ModelRequest) -> ModelResponse:
        await consult()
        return await super().respond(request)


class ConsultsInInstructions(Consulting):
    async def instructions(self, context: RunContext) -> str:
        await consult()
        return "Consult."


class ConsultsBeforeModel(Consulting):
    @before_model
    async def consulting(self, request: ModelRequest) -> None:
        await consult()


class ConsultsAfterModel(Consulting):
    @after_model
    async def consulting(self, response: ModelResponse) -> None:
        await consult()


class ConsultsBeforeTool(Consulting):
    @before_tool
    async def consulting(self, call: ToolCall) -> None:
        await consult()


class ConsultsAfterTool(Consulting):
    @after_tool
    async def consulting(self, result: ToolResult) -> None:
        await consult()


class ConsultsInTool(Consulting):
    @tool
    async def wait(self) -> str:
        """Wait for an expert."""
        await consult()
        return "waited"


CONSULTING = {
    "tool": ConsultsInTool,
    "instructions": ConsultsInInstructions,
    "before_model": ConsultsBeforeModel,
    "after_model": ConsultsAfterModel,
    "before_tool": ConsultsBeforeTool,
    "after_tool": ConsultsAfterTool,
    "model": Consulting,
}


def delegating(helper: type[Agent], grace: float) -> type[Agent]:
    """An agent of ``grace`` whose tool ``delegate`` runs a ``helper`` made for the call,
    closed at the end of an ``async with`` block."""

    class Delegating(Agent):
        cleanup_grace = grace

        @tool
        async def delegate(self) -> str:
            """Hand the work to a helper."""
            async with helper() as made:
                return (await made.run("?")).output

    return Delegating


@pytest.mark.virtual_clock  # the times below are exact, and take no real time
class TestOneGraceForAll:
    @pytest.mark.parametrize("place", list(CONSULTING))
    async def test_nested_runs_from_hooks_instructions_and_models_share_the_outer_grace(
        self, place: str
    ) -> None:
        """Not only from tools: wherever the run calls user code that starts a nested run,
        a ``cancel()`` from outside stops both within one grace (each run's cleanup
        alone would take all of it)."""
        script = [tool_call_response("wait", {}), text_response("x")]
        model = (ConsultingModel if place == "model" else ScriptedModel)(script)
        agent = CONSULTING[place](model=model, session_store=HangingRelease())
        began = anyio.current_time()
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(agent.run, "Go.", session_id="outer"))
            await anyio.sleep(0.3)
            group.cancel_scope.cancel()
        assert anyio.current_time() - began == pytest.approx(0.3 + NESTED_GRACE)

    @pytest.mark.parametrize("patience", [1, 3])
    @pytest.mark.parametrize("how", ["deadline", "cancel"])
    async def test_nested_runs_cancelled_from_outside_share_the_outer_grace(
        self, how: str, patience: float
    ) -> None:
        """The outer run's grace is shared whatever the nested run's own: an expert with
        three times the grace stops within the outer one too (it took its own, and the
        outer run ended two graces late)."""
        model = ScriptedModel([tool_call_response("ask", {"question": "?"}), text_response("x")])
        agent = asking(patience)(model=model, session_store=SlowStore(60.0, fast=2))
        began = anyio.current_time()
        if how == "deadline":
            with anyio.move_on_after(0.3) as scope:
                await agent.run("Go.", session_id="outer")
            assert scope.cancelled_caught
        else:
            async with anyio.create_task_group() as group:
                group.start_soon(functools.partial(agent.run, "Go.", session_id="outer"))
                await anyio.sleep(0.3)
                assert len(model.requests) == 1  # the expert is at work
                group.cancel_scope.cancel()
        assert anyio.current_time() - began == pytest.approx(0.3 + NESTED_GRACE)

    async def test_closing_a_nested_agents_models_in_a_tool_keeps_to_the_outer_grace(
        self,
    ) -> None:
        """An agent closed at the end of an ``async with`` block in a tool, as the outer
        run is cancelled: closing its models shares the outer run's grace (it took the
        agent's own from then, and the outer run its whole grace after it)."""

        class SlowToClose(ScriptedModel):
            async def aclose(self) -> None:
                await anyio.sleep(60)

        waiting = tool_call_response("wait", {"seconds": 10}, call_id="c1")
        register_provider("slow-to-close", lambda name: SlowToClose([waiting]))

        class Helper(Waiter):
            model = "slow-to-close:helper"
            cleanup_grace = 3 * NESTED_GRACE

        model = ScriptedModel([tool_call_response("delegate", {}), text_response("x")])
        agent = delegating(Helper, NESTED_GRACE)(model=model, session_store=SlowStore(60.0, fast=2))
        began = anyio.current_time()
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(agent.run, "Go.", session_id="outer"))
            await anyio.sleep(0.3)
            group.cancel_scope.cancel()
        assert anyio.current_time() - began == pytest.approx(0.3 + NESTED_GRACE)

    async def test_closing_a_nested_agents_models_in_a_tool_that_goes_on_takes_its_own_grace(
        self,
    ) -> None:
        """Nothing is stopping: closing the helper's models takes the helper's grace, not
        the outer run's, and the tool's answer is the helper's."""

        class SlowishToClose(ScriptedModel):
            async def aclose(self) -> None:
                await anyio.sleep(0.3)

        register_provider("slowish-to-close", lambda n: SlowishToClose([text_response("ok")]))

        class Helper(Agent):
            model = "slowish-to-close:helper"
            cleanup_grace = 2.0

        model = ScriptedModel([tool_call_response("delegate", {}), text_response("x")])
        result = await delegating(Helper, 0.1)(model=model).run("Go.")
        (answer,) = [r for m in result.messages for r in m.tool_results]
        assert (answer.content, answer.is_error) == ("ok", False)

    async def test_a_tool_that_swallows_its_nested_runs_cancellation_keeps_one_grace(
        self,
    ) -> None:
        """The outer run cancelled from outside while its tool catches the nested run's
        cancellation and returns: the outer run still ends by the nested run's stop."""

        class Swallowing(Agent):
            cleanup_grace = NESTED_GRACE

            @tool
            async def ask(self) -> str:
                """Ask an expert whose store is slow; say so when it fails."""
                expert = Expert(model=waiting_model(), session_store=SlowStore(60.0, fast=2))
                try:
                    return (await expert.run("?", session_id="inner")).output
                except BaseException:  # a tool that should not, but does
                    return "the expert is unavailable"

        model = ScriptedModel([tool_call_response("ask", {}), text_response("x")])
        agent = Swallowing(model=model, session_store=SlowStore(60.0, fast=2))
        began = anyio.current_time()
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(agent.run, "Go.", session_id="outer"))
            await anyio.sleep(0.3)
            group.cancel_scope.cancel()
        assert anyio.current_time() - began == pytest.approx(0.3 + NESTED_GRACE)


class TestStoresThatHangOrRaise:
    @pytest.mark.virtual_clock
    async def test_a_hanging_release_takes_at_most_the_grace_and_is_logged(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        agent = Waiter(model=ScriptedModel([text_response("hi")]), session_store=HangingRelease())
        began = anyio.current_time()
        with caplog.at_level(logging.WARNING, "littleghost.cleanup"):
            result = await agent.run("Hi.", session_id="s")
        assert anyio.current_time() - began == pytest.approx(GRACE)
        assert result.output == "hi"
        assert any("releasing the session" in r.getMessage() for r in caplog.records)

    @pytest.mark.virtual_clock
    async def test_a_hanging_release_keeps_the_callers_cancel_scope(self) -> None:
        agent = Waiter(model=waiting_model(), session_store=HangingRelease())
        began = anyio.current_time()
        with anyio.move_on_after(0.2) as scope:
            await agent.run("Wait.", session_id="s")
        assert scope.cancelled_caught
        assert anyio.current_time() - began == pytest.approx(0.2 + GRACE)

    @pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
    @pytest.mark.parametrize("fatal", [1, 2, 3], ids=["user", "call", "result"])
    async def test_keyboard_interrupt_from_the_store_propagates_as_itself(
        self, kind: type[BaseException], fatal: int
    ) -> None:
        store = InterruptingStore(kind, fatal)
        model = ScriptedModel([tool_call_response("wait", {"seconds": 0}), text_response("x")])
        with pytest.raises(kind) as caught:
            await Waiter(model=model, session_store=store).run("Go.", session_id="s")
        assert type(caught.value) is kind
        valid(await store.load("s"))

    @pytest.mark.parametrize("leak", [1, 2, 3], ids=["user", "call", "result"])
    async def test_a_store_raising_a_stray_cancellation_fails_the_run(self, leak: int) -> None:
        store = LeakingStore(leak)
        model = ScriptedModel([tool_call_response("wait", {"seconds": 0}), text_response("x")])
        with pytest.raises(SessionStoreError) as caught:
            await Waiter(model=model, session_store=store).run("Go.", session_id="s")
        assert isinstance(caught.value.__cause__, anyio.get_cancelled_exc_class())
        assert len(await store.load("s")) == leak - 1
        again = ScriptedModel([text_response("again")])
        result = await Waiter(model=again, session_store=store).run("Go on.", session_id="s")
        valid(result.messages)


@pytest.mark.parametrize("kind", [KeyboardInterrupt, SystemExit])
@pytest.mark.parametrize("method", ["load", "append"])
def test_system_exit_inside_a_stores_own_task_group_propagates_as_itself(
    method: str, kind: type[BaseException]
) -> None:
    """Under trio (asyncio itself ends the event loop with it, whatever the run does)."""

    async def main() -> None:
        store = FanningOutStore(method, kind)
        await Waiter(model=ScriptedModel([text_response("x")]), session_store=store).run(
            "Go.", session_id="s"
        )

    with pytest.raises(kind) as caught:
        anyio.run(main, backend="trio")
    assert type(caught.value) is kind


async def thinking_past_the_grace(request: Any) -> ModelResponse:
    await anyio.sleep(GRACE + 0.2)
    return text_response("final answer")


class Delegating(Agent):
    """Stops a nested run with a deadline of its own, from inside its tool."""

    cleanup_grace = GRACE

    @tool(timeout=0.1)
    async def timed(self) -> str:
        """Ask an expert, for at most 0.1 s."""
        expert = Waiter(model=waiting_model(), session_store=SlowStore(0.001))
        return (await expert.run("?", session_id="inner")).output

    @tool
    async def moving_on(self) -> str:
        """Ask an expert, giving up after 0.1 s."""
        with anyio.move_on_after(0.1):
            return (await Waiter(model=waiting_model()).run("?")).output
        return "gave up"

    @tool
    async def racing(self) -> str:
        """Ask an expert, cancelling the question after 0.1 s."""
        async with anyio.create_task_group() as group:
            group.start_soon(Waiter(model=waiting_model()).run, "?")
            await anyio.sleep(0.1)
            group.cancel_scope.cancel()
        return "cancelled"


class Noting(Agent):
    """Writes a note to the session from a tool that stops the write after 0.1 s: by its
    timeout, or by a scope of its own."""

    cleanup_grace = GRACE

    @tool(timeout=0.1)
    async def timed_note(self, context: RunContext) -> str:
        """Note something, within 0.1 s."""
        await context.append(Message.user("a slow note"))
        return "noted"

    @tool
    async def moving_on_note(self, context: RunContext) -> str:
        """Note something, giving up waiting after 0.1 s."""
        with anyio.move_on_after(0.1):
            await context.append(Message.user("a slow note"))
        return "noted"


class SlowNotes(InMemorySessionStore):
    """Writes a note in 0.2 s (within the grace), everything else in a moment."""

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        slow = any(message.text == "a slow note" for message in messages)
        await anyio.sleep(0.2 if slow else 0.001)  # every write is a checkpoint
        await super().append(session_id, messages)


async def race_an_expert() -> None:
    """Start an expert's run and cancel it with cancel() after 0.1 s."""
    async with anyio.create_task_group() as group:
        group.start_soon(Waiter(model=waiting_model()).run, "?")
        await anyio.sleep(0.1)
        group.cancel_scope.cancel()


class RacingFirst(Agent):
    """Cancels an expert's run in a tool (that then times out) or in an after_tool hook,
    and goes on."""

    cleanup_grace = 1.0
    where = "tool"

    @tool(timeout=0.3)
    async def work(self) -> str:
        """Race an expert, then work until the timeout."""
        if self.where == "tool":
            await race_an_expert()
            await anyio.sleep(10)
        return "done"

    @after_tool
    async def race_after(self, result: ToolResult) -> None:
        if self.where == "hook":
            await race_an_expert()


class TestNestedRunsStoppedInsideATool:
    @pytest.mark.virtual_clock
    @pytest.mark.parametrize("where", ["tool", "hook"])
    async def test_a_cancel_inside_the_run_never_shortens_its_later_stop(self, where: str) -> None:
        """The outer run goes on after its own cancel() of an expert; cancelled from
        outside later, it still gets its whole grace: a slow write in flight is stored."""
        writing = anyio.Event()

        class Watched(SlowStore):
            async def append(self, session_id: str, messages: Sequence[Message]) -> None:
                if self.appends == 3:
                    writing.set()  # the second answer is being written
                await super().append(session_id, messages)

        store = Watched(0.5, fast=3)  # the second answer's write takes 0.5 s

        async def later(request: Any) -> ModelResponse:
            await anyio.sleep(0.5)
            return tool_call_response("work", {}, call_id="c2")

        model = ScriptedModel([tool_call_response("work", {}), later, text_response("x")])
        agent = RacingFirst(model=model, session_store=store)
        agent.where = where
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(agent.run, "Go.", session_id="s"))
            await writing.wait()
            group.cancel_scope.cancel()
        roles = [m.role for m in await store.load("s")]
        assert roles[:4] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]

    @pytest.mark.virtual_clock
    @pytest.mark.parametrize("name", ["timed", "moving_on", "racing"])
    async def test_the_outer_run_stores_every_later_message(self, name: str) -> None:
        store = SlowStore(0.001)  # every write is a checkpoint
        model = ScriptedModel([tool_call_response(name, {}), thinking_past_the_grace])
        result = await Delegating(model=model, session_store=store).run("Go.", session_id="s")
        assert result.output == "final answer"
        assert [m.role for m in result.messages] == ["user", "assistant", "tool", "assistant"]
        assert await store.load("s") == result.messages


class TestAToolsOwnStop:
    @pytest.mark.virtual_clock
    @pytest.mark.parametrize("name", ["timed_note", "moving_on_note"])
    async def test_a_write_a_tool_stops_finishes_and_the_run_goes_on(self, name: str) -> None:
        """A tool's timeout (or scope) passing while its ``append`` writes stops the
        tool, not the run: the write finishes within the grace, and the run stores what
        comes later, however long after."""
        store = SlowNotes()
        model = ScriptedModel([tool_call_response(name, {}), thinking_past_the_grace])
        result = await Noting(model=model, session_store=store).run("Go.", session_id="s")
        assert result.output == "final answer"
        roles = ["user", "assistant", "user", "tool", "assistant"]
        assert [m.role for m in result.messages] == roles
        assert await store.load("s") == result.messages


class Shop(Agent):
    """Charges a card per call; its policy hook refuses call ``c1``."""

    charged: list[int]

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.charged = []

    @tool
    async def charge(self, amount: int) -> str:
        """Charge the card."""
        self.charged.append(amount)
        return "charged"

    @before_tool
    def policy(self, call: ToolCall) -> None:
        if call.id == "c1":
            raise PermissionError("c1 refused by policy")


def charging(count: int) -> ScriptedModel:
    calls = tuple(ToolCall(f"c{n}", "charge", {"amount": n}) for n in range(1, count + 1))
    return ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("ok"),
        ]
    )


class TestAFailingCallStopsItsBatch:
    @pytest.mark.parametrize("entry", ["run", "stream"])
    async def test_no_later_call_runs_and_the_results_stay_in_call_order(
        self, entry: str, anyio_backend_name: str
    ) -> None:
        """Once one call of a batch has failed the run, no other call starts (in ``run()``
        as in ``stream()``), and every call is answered in call order, by what it did.

        asyncio starts the calls' tasks in call order, so ``c1`` fails before the others
        start; trio starts them in any order, so a later call may have run first."""
        store = InMemorySessionStore()
        agent = Shop(model=charging(3), session_store=store)
        with pytest.raises(PermissionError):
            if entry == "run":
                await agent.run("Buy.", session_id="s")
            else:
                async with agent.stream("Buy.", session_id="s") as events:
                    async for _ in events:
                        pass
        if anyio_backend_name == "asyncio":
            assert agent.charged == []
        log = await store.load("s")
        valid(log)
        results = [r for m in log for r in m.tool_results]
        assert [r.call_id for r in results] == ["c1", "c2", "c3"]
        ran = sorted(int(r.call_id[1:]) for r in results if r.content == "charged")
        assert ran == sorted(agent.charged)

    async def test_results_finished_before_a_stop_stay_in_call_order(self) -> None:
        """A later call that finished before an earlier one is stopped is stored after the
        earlier call's "stopped" answer, not before it."""
        calls = (
            ToolCall("c1", "wait", {"seconds": 10}),
            ToolCall("c2", "wait", {"seconds": 0}),
        )
        model = ScriptedModel(
            [ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE)]
        )
        store = InMemorySessionStore()
        later_finished = anyio.Event()

        class Watched(Waiter):
            @after_tool
            async def note(self, result: ToolResult) -> None:
                if result.call_id == "c2":
                    later_finished.set()

        run = Watched(model=model, session_store=store).run
        with anyio.fail_after(30):
            async with anyio.create_task_group() as group:
                group.start_soon(functools.partial(run, "Go.", session_id="s"))
                await later_finished.wait()
                group.cancel_scope.cancel()
        log = await store.load("s")
        valid(log)
        results = [r for m in log for r in m.tool_results]
        assert [r.call_id for r in results] == ["c1", "c2"]
        assert results[0].is_error and results[1].content == "waited"

    @pytest.mark.parametrize("how", ["raises", "cancelled"])
    async def test_a_call_stopped_in_its_after_tool_hook_is_stored_as_finished(
        self, how: str
    ) -> None:
        """The tool ran to the end: the log says so (its result withheld), never that the
        call did not finish, which would invite the model to charge the card again."""
        outer = anyio.CancelScope()

        class Audited(Shop):
            policy = None  # type: ignore[assignment]

            @after_tool
            async def audit(self, result: ToolResult) -> None:
                if how == "cancelled":
                    outer.cancel()
                    await anyio.sleep_forever()
                raise PermissionError("the audit store is down")

        store = InMemorySessionStore()
        agent = Audited(model=charging(1), session_store=store)
        with outer, pytest.raises(PermissionError):  # raised, or cancelled in the hook
            await agent.run("Buy.", session_id="s")
        assert outer.cancelled_caught == (how == "cancelled")
        assert agent.charged == [1]
        stored = await store.load("s")
        valid(stored)
        [result] = [r for m in stored for r in m.tool_results]
        assert result.is_error and result.content.startswith("This tool call finished")
        assert "after_tool hook" in result.content and "charged" not in result.content
