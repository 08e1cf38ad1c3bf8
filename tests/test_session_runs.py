"""``run(..., session_id=)``: sessions across runs, seeding, repair, serialization, compaction.

Every behaviour is checked against each built-in store and a custom store with only the
four protocol methods (``PlainStore``, no ``lock``).
"""

from __future__ import annotations

import contextlib
import functools
import gc
import inspect
import json
import random
import sys
import textwrap
import threading
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import pytest

from littleghost import (
    Agent,
    Message,
    Role,
    RunContext,
    ToolCall,
    ToolResult,
    before_model,
    manage_context,
    tool,
)
from littleghost.context import Truncation, compact_session
from littleghost.context.records import COMPACTION_COVERS_KEY
from littleghost.context.summarize import SUMMARY_PREFIX
from littleghost.errors import (
    ConfigurationError,
    DeadlineExceededError,
    ProviderUnavailableError,
    SessionBusyError,
    SessionStoreError,
    UnstorableValueError,
)
from littleghost.events import RunFinished, TextDelta, ToolCallStarted
from littleghost.messages import SUMMARY_COVERS_KEY
from littleghost.models import ModelRequest, ModelResponse
from littleghost.sessions import (
    InMemorySessionStore,
    SessionStore,
    SQLiteSessionStore,
    message_from_json,
)
from littleghost.sessions.locks import SessionLocks
from littleghost.testing import ScriptedModel, text_response, tool_call_response

from .conftest import CHILD_PROCESS_ONLY
from .faults import log_problems, request_problems, unanswered
from .stores import (
    RUN_KINDS,
    LockingStore,
    PlainStore,
    SlottedStore,
    blocking_until,
    eventually,
    open_store,
    waiting_runs,
    working_until,
)
from .timing import LATE

pytestmark = pytest.mark.anyio


@pytest.fixture(params=RUN_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    async with open_store(request.param, tmp_path, request) as opened:
        yield opened


def new_session() -> str:
    return f"session-{uuid.uuid4().hex}"


def texts(messages: tuple[Message, ...] | list[Message]) -> list[str]:
    return [message.text for message in messages if message.text]


class Helper(Agent):
    instructions = "Help."

    @tool
    async def lookup(self, order_id: str) -> str:
        """Find an order."""
        return f"order {order_id} shipped"


class TestContinuing:
    async def test_a_session_continues_across_runs(self, store: SessionStore) -> None:
        model = ScriptedModel(
            [
                tool_call_response("lookup", {"order_id": "42"}),
                text_response("It shipped."),
                text_response("You asked about order 42."),
            ]
        )
        agent = Helper(model=model, session_store=store)
        first = await agent.run("Where is order 42?", session_id="s")
        second = await agent.run("What did I ask?", session_id="s")

        assert second.messages[: len(first.messages)] == first.messages
        assert await store.load("s") == second.messages
        assert texts(model.requests[2].messages) == [
            "Help.",
            "Where is order 42?",
            "It shipped.",
            "What did I ask?",
        ]
        assert all(message.role is not Role.SYSTEM for message in await store.load("s"))
        assert await store.list_sessions() == ("s",)

    async def test_a_failed_run_keeps_what_it_appended(self, store: SessionStore) -> None:
        failing = ScriptedModel([ProviderUnavailableError("down")])
        with pytest.raises(ProviderUnavailableError):
            await Helper(model=failing, session_store=store, max_retries=0).run(
                "are you there?", session_id="s"
            )
        assert texts(await store.load("s")) == ["are you there?"]
        model = ScriptedModel([text_response("yes")])
        result = await Helper(model=model, session_store=store).run("hello?", session_id="s")
        assert texts(result.messages) == ["are you there?", "hello?", "yes"]

    async def test_runs_without_a_session_leave_the_store_alone(self, store: SessionStore) -> None:
        model = ScriptedModel([text_response("hi")])
        await Helper(model=model, session_store=store).run("hello", history=[Message.user("a")])
        assert await store.list_sessions() == ()


class TestHistory:
    async def test_history_seeds_a_new_session(self, store: SessionStore) -> None:
        history = [Message.user("I am Ada."), Message.assistant("Hello Ada.")]
        model = ScriptedModel([text_response("Ada.")])
        result = await Helper(model=model, session_store=store).run(
            "Who am I?", history=history, session_id="s"
        )
        assert result.messages[:2] == tuple(history)
        assert await store.load("s") == result.messages

    async def test_history_is_ignored_for_an_existing_session(self, store: SessionStore) -> None:
        await store.append("s", [Message.user("stored question"), Message.assistant("stored")])
        model = ScriptedModel([text_response("ok")])
        with pytest.warns(UserWarning, match="history= is ignored: the session already holds"):
            result = await Helper(model=model, session_store=store).run(
                "next", history=[Message.user("ignored")], session_id="s"
            )
        assert texts(result.messages) == ["stored question", "stored", "next", "ok"]
        assert "ignored" not in texts(model.requests[0].messages)

    async def test_a_history_warning_is_shown_once_per_line_whatever_the_session(
        self, store: SessionStore
    ) -> None:
        """As Python's warnings are: a stateless client passing history= on every run
        is told once, and the caller's warning registry does not grow with each run."""
        history = [Message.system("Be terse."), Message.user("hi")]
        model = ScriptedModel([text_response("ok")] * 5)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            for index in range(5):
                await Helper(model=model, session_store=store).run(
                    "next", history=history, session_id=f"s{index}"
                )
        assert len(caught) == 1 and "left out of the session" in str(caught[0].message)

    @pytest.mark.parametrize("entry", ["run", "stream", "run_sync"])
    async def test_history_warnings_name_the_callers_line(self, entry: str) -> None:
        """Whichever entry point, the warning points at the line that asked for the run
        (not into littleghost, anyio or asyncio)."""
        store = InMemorySessionStore()
        agent = Helper(model=ScriptedModel([text_response("ok")]), session_store=store)
        history = [Message.system("Be terse."), Message.user("hi"), Message.assistant("hello")]
        with pytest.warns(UserWarning, match="left out of the session") as caught:
            if entry == "run":
                line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
                await agent.run("next", history=history, session_id="s")
            elif entry == "stream":
                line = inspect.currentframe().f_lineno + 1  # type: ignore[union-attr]
                async with agent.stream("next", history=history, session_id="s") as events:
                    async for _ in events:
                        pass
            else:
                line = inspect.currentframe().f_lineno + 2  # type: ignore[union-attr]
                await anyio.to_thread.run_sync(
                    lambda: agent.run_sync("next", history=history, session_id="s")
                )
        assert [(w.filename, w.lineno) for w in caught] == [(__file__, line)]

    async def test_instructions_in_a_seed_are_not_stored(self, store: SessionStore) -> None:
        history = [Message.system("Be rude."), Message.developer("Shout."), Message.user("hi")]
        model = ScriptedModel([text_response("hello")])
        with pytest.warns(UserWarning, match="system and developer messages of history="):
            result = await Helper(model=model, session_store=store).run(
                "again", history=history, session_id="s"
            )
        assert texts(result.messages) == ["hi", "again", "hello"]
        assert await store.load("s") == result.messages
        assert texts(model.requests[0].messages) == ["Help.", "hi", "again"]


class TestRepair:
    async def test_a_call_left_without_its_result_gets_a_stored_error_result(
        self, store: SessionStore
    ) -> None:
        call = ToolCall("call-7", "lookup", {"order_id": "7"})
        await store.append("s", [Message.user("order 7?"), Message.assistant(tool_calls=(call,))])
        model = ScriptedModel([text_response("Sorry, that was interrupted.")])
        result = await Helper(model=model, session_store=store).run("well?", session_id="s")

        stored = await store.load("s")
        assert stored == result.messages
        repair = stored[2]
        assert repair.role is Role.TOOL
        assert repair.tool_results[0].call_id == "call-7"
        assert repair.tool_results[0].is_error
        assert "interrupted" in repair.tool_results[0].content
        assert stored[3].text == "well?"
        assert repair in model.requests[0].messages

    async def test_a_stored_result_under_another_call_is_rejected_and_nothing_written(
        self, store: SessionStore
    ) -> None:
        """A stored tool message whose results answer calls of two assistant messages
        (a seed accepted before history was checked) would make a request no provider
        accepts: the run fails before any model call, naming the session, position and id."""
        stored = (
            Message.user("orders 7 and 8?"),
            Message.assistant(tool_calls=[ToolCall("a", "lookup", {"order_id": "7"})]),
            Message(Role.TOOL, (ToolResult("a", "shipped"), ToolResult("b", "lost"))),
            Message.assistant(tool_calls=[ToolCall("b", "lookup", {"order_id": "8"})]),
        )
        await store.append("s", stored)
        model = ScriptedModel([text_response("never")])
        with pytest.raises(ConfigurationError, match=r"message 2 of session 's' .* call 'b'"):
            await Helper(model=model, session_store=store).run("well?", session_id="s")
        assert model.requests == []
        assert await store.load("s") == stored

    async def test_a_stored_result_without_its_call_is_left_out_of_the_view(
        self, store: SessionStore
    ) -> None:
        stored = (Message.user("hi"), Message.tool("ghost", "boo"), Message.assistant("hello"))
        await store.append("s", stored)
        model = ScriptedModel([text_response("ok")])
        result = await Helper(model=model, session_store=store).run("again", session_id="s")
        assert result.messages[:3] == stored
        assert texts(model.requests[0].messages) == ["Help.", "hi", "hello", "again"]

    async def test_a_stored_repeated_id_is_read_as_a_distinct_one(
        self, store: SessionStore, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Earlier versions stored a response a model handed back twice under one id: such
        a session goes on, the later copy read under an id of its own (the same at every
        load), so a record covering the first never hides the second."""
        stored = (Message.user("hi", id="same"), Message.assistant("hello", id="same"))
        await store.append("s", stored)
        for answer in ("ok", "again"):
            model = ScriptedModel([text_response(answer)])
            result = await Helper(model=model, session_store=store).run("more", session_id="s")
            assert texts(model.requests[0].messages)[1:3] == ["hi", "hello"]
            assert [m.id for m in result.messages[:2]] == ["same", "same~1"]
        assert (await store.load("s"))[:2] == stored
        assert "session 's' holds 1 message(s) whose id an earlier message has" in caplog.text

    async def test_a_distinct_id_never_repeats_a_stored_one(self, store: SessionStore) -> None:
        stored = tuple(
            Message.user(text, id=i) for text, i in (("x", "a"), ("y", "a"), ("z", "a~1"))
        )
        await store.append("s", stored)
        model = ScriptedModel([text_response("ok")])
        result = await Helper(model=model, session_store=store).run("more", session_id="s")
        ids = [m.id for m in result.messages]
        assert len(set(ids)) == len(ids) and ids[:3] == ["a", "a~1~", "a~1"]

    async def test_a_compaction_between_runs_reads_repeated_ids_as_runs_do(
        self, store: SessionStore
    ) -> None:
        """compact_session covers the copies a run sees: a record covering the second of
        two messages with one id hides it in the next run too."""
        stored = (
            Message.user("a"),
            Message.assistant("b", id="dup"),
            Message.user("c"),
            Message.assistant("d", id="dup"),
            Message.user("e"),
            Message.assistant("f"),
        )
        await store.append("s", stored)
        (record,) = await compact_session(store, "s", Truncation(minimum_preserved=2))
        assert record.metadata[COMPACTION_COVERS_KEY][-1] == "dup~3"
        model = ScriptedModel([text_response("ok")])
        await Helper(model=model, session_store=store).run("g", session_id="s")
        assert texts(model.requests[0].messages) == ["Help.", "e", "f", "g"]

    async def test_tool_arguments_holding_infinity_are_answered_and_stored_as_text(
        self, store: SessionStore
    ) -> None:
        """A call whose arguments hold a number JSON has not gets an error result; the
        session stores the arguments as their text, never the non-finite float."""

        class Scaler(Helper):
            @tool
            async def scale(self, factor: float) -> str:
                """Scale by a factor."""
                return str(factor)

        model = ScriptedModel(
            [
                tool_call_response("scale", '{"factor": Infinity}', call_id="c1"),
                tool_call_response("scale", {"factor": float("nan")}, call_id="c2"),
                text_response("done"),
            ]
        )
        result = await Scaler(model=model, session_store=store).run("go", session_id="s")
        assert result.output == "done"
        stored = await store.load("s")
        assert [m.tool_calls[0].arguments for m in stored if m.tool_calls] == [
            '{"factor": Infinity}',
            '{"factor": NaN}',
        ]
        results = [m.tool_results[0] for m in stored if m.tool_results]
        assert all(r.is_error and "is not a JSON number" in r.content for r in results)

    async def test_tool_arguments_nested_past_what_a_store_keeps_are_answered_as_text(
        self, store: SessionStore
    ) -> None:
        """Arguments nested 100 levels deep, as far as a store keeps, run the tool; one
        level more gets an error result, sent as text or parsed, and the run goes on."""

        class Nester(Helper):
            @tool
            async def nest(self, value: list[Any]) -> str:
                """Take a nested list."""
                return "taken"

        def nested(levels: int) -> dict[str, Any]:
            value: Any = []
            for _ in range(levels - 2):
                value = [value]
            return {"value": value}

        too_deep = json.dumps(nested(101))
        model = ScriptedModel(
            [
                tool_call_response("nest", nested(100), call_id="c1"),
                tool_call_response("nest", too_deep, call_id="c2"),
                tool_call_response("nest", nested(101), call_id="c3"),
                text_response("done"),
            ]
        )
        result = await Nester(model=model, session_store=store).run("go", session_id="s")
        assert result.output == "done"
        stored = await store.load("s")
        calls = [m.tool_calls[0].arguments for m in stored if m.tool_calls]
        assert calls == [nested(100), too_deep, too_deep]
        results = [m.tool_results[0] for m in stored if m.tool_results]
        assert results[0].content == "taken"
        assert all(
            r.is_error and "nested more than 100 levels deep" in r.content for r in results[1:]
        )


class TestStreaming:
    async def test_a_streamed_run_continues_the_session(self, store: SessionStore) -> None:
        await store.append("s", [Message.user("before"), Message.assistant("noted")])
        model = ScriptedModel([text_response("streamed")])
        async with Helper(model=model, session_store=store).stream("now", session_id="s") as events:
            async for _ in events:
                pass
        assert events.result.messages == await store.load("s")
        assert texts(events.result.messages) == ["before", "noted", "now", "streamed"]

    async def test_a_stream_left_early_keeps_its_messages_and_frees_the_session(
        self, store: SessionStore
    ) -> None:
        class Endless(Agent):
            @tool
            async def work(self) -> str:
                """Work forever."""
                await anyio.sleep_forever()
                return "never"

        model = ScriptedModel(
            [tool_call_response("work", {}, call_id="w1"), text_response("after the stop")]
        )
        agent = Endless(model=model, session_store=store)
        async with agent.stream("start", session_id="s") as events:
            async for event in events:
                if isinstance(event, ToolCallStarted):
                    break
        stored = await store.load("s")
        assert [message.role.value for message in stored] == ["user", "assistant", "tool"]
        assert stored[2].tool_results[0].call_id == "w1"
        assert stored[2].tool_results[0].is_error
        with anyio.fail_after(5):
            result = await agent.run("and now?", session_id="s")
        assert result.messages[:3] == stored
        assert model.requests[1].messages[:3] == stored


class TestConcurrentRuns:
    async def test_a_second_run_of_a_session_waits_for_the_first(self, store: SessionStore) -> None:
        in_tool = anyio.Event()
        release = anyio.Event()

        Slow = working_until(in_tool, release)

        first = ScriptedModel([tool_call_response("work", {}), text_response("first done")])
        second = ScriptedModel([text_response("second done")])

        async def release_later() -> None:
            await anyio.sleep(0.1)
            assert second.requests == []
            release.set()

        async with anyio.create_task_group() as group:
            group.start_soon(
                functools.partial(Slow(model=first, session_store=store).run, "one", session_id="s")
            )
            await in_tool.wait()
            group.start_soon(
                functools.partial(
                    Slow(model=second, session_store=store).run, "two", session_id="s"
                )
            )
            group.start_soon(release_later)

        stored = await store.load("s")
        assert [message.role.value for message in stored] == [
            "user",
            "assistant",
            "tool",
            "assistant",
            "user",
            "assistant",
        ]
        assert texts(stored) == ["one", "first done", "two", "second done"]
        assert second.requests[0].messages == stored[:5]

    async def test_runs_of_a_session_waiting_in_one_event_loop_take_it_in_arrival_order(
        self, store: SessionStore
    ) -> None:
        in_tool = anyio.Event()
        release = anyio.Event()
        Slow = working_until(in_tool, release)
        first = ScriptedModel([tool_call_response("work", {}), text_response("first done")])
        later = ScriptedModel([text_response(f"done {n}") for n in range(6)])

        async with anyio.create_task_group() as group:
            group.start_soon(
                functools.partial(Slow(model=first, session_store=store).run, "one", session_id="s")
            )
            await in_tool.wait()
            for n in range(6):
                run = Slow(model=later, session_store=store).run
                group.start_soon(functools.partial(run, f"waiter {n}", session_id="s"))
                assert await eventually(lambda: waiting_runs("s") == n + 1)  # noqa: B023 (in line)
            release.set()

        asked = [request.messages[-1].text for request in later.requests]
        assert asked == [f"waiter {n}" for n in range(6)]
        assert texts(await store.load("s"))[2::2] == asked

    async def test_run_sync_from_two_threads_serializes(self, store: SessionStore) -> None:
        in_tool = threading.Event()
        release = threading.Event()
        Blocking = blocking_until(in_tool, release)

        first = ScriptedModel([tool_call_response("work", {}), text_response("first done")])
        second = ScriptedModel([text_response("second done")])

        def run_first() -> None:
            Blocking(model=first, session_store=store).run_sync("one", session_id="s")

        def run_second() -> None:
            Blocking(model=second, session_store=store).run_sync("two", session_id="s")

        async with anyio.create_task_group() as group:
            group.start_soon(anyio.to_thread.run_sync, run_first)
            await anyio.to_thread.run_sync(in_tool.wait)
            group.start_soon(anyio.to_thread.run_sync, run_second)
            await anyio.sleep(0.1)
            assert second.requests == []
            release.set()
        assert texts(await store.load("s")) == ["one", "first done", "two", "second done"]

    @pytest.mark.parametrize(
        "in_threads",
        [frozenset(range(5)), frozenset({2, 4})],
        ids=["threads", "event-loop-and-threads"],  # the others wait in this event loop
    )
    async def test_waiting_runs_take_the_session_in_arrival_order(
        self, store: SessionStore, in_threads: frozenset[int]
    ) -> None:
        """Runs waiting in threads (``run_sync``) and in this event loop, arriving in
        turn, take the session in that order."""
        in_tool = threading.Event()
        release = threading.Event()
        Blocking = blocking_until(in_tool, release)

        first = ScriptedModel([tool_call_response("work", {}), text_response("first done")])
        later = ScriptedModel([text_response(f"done {n}") for n in range(5)])

        async with anyio.create_task_group() as group:
            holder = Blocking(model=first, session_store=store).run_sync
            group.start_soon(
                anyio.to_thread.run_sync, functools.partial(holder, "one", session_id="s")
            )
            await anyio.to_thread.run_sync(in_tool.wait)
            for n in range(5):
                agent = Blocking(model=later, session_store=store)
                if n in in_threads:
                    run = functools.partial(agent.run_sync, f"waiter {n}", session_id="s")
                    group.start_soon(anyio.to_thread.run_sync, run)
                else:
                    group.start_soon(functools.partial(agent.run, f"waiter {n}", session_id="s"))
                assert await eventually(lambda: waiting_runs("s") == n + 1)  # noqa: B023 (in line)
            release.set()

        asked = [request.messages[-1].text for request in later.requests]
        assert asked == [f"waiter {n}" for n in range(5)]
        assert texts(await store.load("s"))[2::2] == asked

    async def test_a_waiting_run_raises_at_its_deadline_and_stores_nothing(
        self, store: SessionStore
    ) -> None:
        in_tool = anyio.Event()
        release = anyio.Event()

        Holding = working_until(in_tool, release)

        first = ScriptedModel([tool_call_response("work", {}), text_response("first done")])
        model = ScriptedModel([text_response("never")])
        async with anyio.create_task_group() as group:
            group.start_soon(
                functools.partial(
                    Holding(model=first, session_store=store).run, "one", session_id="s"
                )
            )
            await in_tool.wait()
            started = anyio.current_time()
            with pytest.raises(DeadlineExceededError) as caught:
                await Helper(model=model, session_store=store).run(
                    "waiting", session_id="s", timeout=0.1
                )
            assert anyio.current_time() - started < 0.1 + LATE
            assert str(caught.value) == (
                "Helper did not finish before its deadline, still waiting to hold session 's'"
            )
            after = Helper(model=ScriptedModel([text_response("two done")]), session_store=store)
            group.start_soon(functools.partial(after.run, "two", session_id="s", timeout=5))
            await anyio.sleep(0.1)  # waiting behind where the run that gave up waited
            release.set()
        assert model.requests == []
        assert texts(await store.load("s")) == ["one", "first done", "two", "two done"]

    async def test_a_run_past_its_deadline_once_it_held_its_session_says_no_wait(
        self, store: SessionStore
    ) -> None:
        """Its deadline passes in its tool, well after it holds its session (also on a
        loaded machine)."""
        in_tool = anyio.Event()
        Holding = working_until(in_tool, anyio.Event())
        model = ScriptedModel([tool_call_response("work", {})])
        with pytest.raises(DeadlineExceededError) as caught:
            await Holding(model=model, session_store=store).run("one", session_id="s", timeout=LATE)
        assert in_tool.is_set()
        assert str(caught.value) == (
            "Slow did not finish before its deadline, running tool 'work' in turn 1 (of 100 at most)"
        )

    async def test_a_run_started_inside_a_run_of_its_session_fails_clearly(
        self, store: SessionStore
    ) -> None:
        class Recursive(Agent):
            @tool
            async def again(self) -> str:
                """Run this agent again on the same session."""
                inner = Recursive(model=ScriptedModel([]), session_store=store)
                result = await inner.run("inner", session_id="s")
                return result.output

        model = ScriptedModel([tool_call_response("again", {}), text_response("done")])
        result = await Recursive(model=model, session_store=store).run("outer", session_id="s")
        failure = result.messages[2].tool_results[0]
        assert failure.is_error
        assert "SessionBusyError" in failure.content
        assert (
            "a run of this session is already in progress in this task, or in a task it "
            "was started from (a tool runs in a task its run started); a run started from "
            "inside it would wait for itself (it is refused from any task started inside it)"
        ) in failure.content
        assert await store.load("s") == result.messages

    @pytest.mark.parametrize("where", ["block", "task of the block", "stream in the block"])
    async def test_a_run_of_a_streamed_session_says_why_it_is_refused(
        self, store: SessionStore, where: str
    ) -> None:
        """A run of the session of a stream, from its block, from a task started in the
        block (which the block may wait for) or from a stream opened in the block, is
        refused with a message true of each: where the session is in progress, and why
        waiting there would never end."""
        agent = Helper(model=ScriptedModel([text_response("done")]), session_store=store)
        again = Helper(model=ScriptedModel([]), session_store=store)

        async def run_again() -> None:
            with pytest.raises(SessionBusyError) as caught:
                if where == "stream in the block":
                    async with again.stream("inner", session_id="s") as inner:
                        async for _ in inner:
                            pass
                else:
                    await again.run("inner", session_id="s")
            assert str(caught.value) == (
                "a run of this session is in progress in a stream that this task, or a task "
                "it was started from, is reading (the block of agent.stream()); that run "
                "waits for the block to read its events, so a run of the session started "
                "from the block, or from a task the block waits for, would wait for itself "
                "(it is refused from any task started in the block)"
            )

        with anyio.fail_after(10):
            async with agent.stream("outer", session_id="s") as events:
                if where == "task of the block":
                    async with anyio.create_task_group() as group:
                        group.start_soon(run_again)
                else:
                    await run_again()
                async for _ in events:
                    pass
        assert texts(events.result.messages) == ["outer", "done"]

    async def test_entering_a_stream_waits_for_its_session_and_can_be_cancelled(
        self, store: SessionStore
    ) -> None:
        """While another run holds the session, entering the block waits (cancellably);
        once that run ends, a new stream's run goes on from its log."""
        in_tool, release = anyio.Event(), anyio.Event()

        Slow = working_until(in_tool, release)

        first = ScriptedModel([tool_call_response("work", {}), text_response("first done")])
        waiting = Helper(model=ScriptedModel([text_response("second")]), session_store=store)
        entered = False
        async with anyio.create_task_group() as group:
            group.start_soon(
                functools.partial(
                    Slow(model=first, session_store=store).run, "first", session_id="s"
                )
            )
            await in_tool.wait()
            with anyio.move_on_after(0.2) as scope:
                async with waiting.stream("never", session_id="s"):
                    entered = True
            release.set()
        assert scope.cancelled_caught and not entered
        async with waiting.stream("second", session_id="s") as events:
            async for _ in events:
                pass
        assert texts(events.result.messages) == ["first", "first done", "second", "second"]

    @pytest.mark.parametrize("when", ["on entering", "at a tool call"])
    @pytest.mark.parametrize("nested", ["run", "stream"])
    async def test_a_run_started_inside_a_stream_of_its_session_fails_clearly(
        self, store: SessionStore, nested: str, when: str
    ) -> None:
        """The block of ``stream()`` waits on its run, from the moment it is entered, so a
        run of the same session it starts would wait for itself: it raises
        ``SessionBusyError`` instead of hanging (or of running first)."""
        model = ScriptedModel(
            [tool_call_response("lookup", {"order_id": "42"}), text_response("done")]
        )
        agent = Helper(model=model, session_store=store)
        again = Helper(model=ScriptedModel([text_response("inner")]), session_store=store)

        async def refused() -> None:
            with pytest.raises(SessionBusyError, match="wait for itself"):
                if nested == "run":
                    await again.run("inner", session_id="s")
                else:
                    async with again.stream("inner", session_id="s") as inner:
                        async for _ in inner:
                            pass

        with anyio.fail_after(10):
            async with agent.stream("outer", session_id="s") as events:
                if when == "on entering":
                    await refused()
                async for event in events:
                    if when == "at a tool call" and isinstance(event, ToolCallStarted):
                        await refused()
        assert texts(events.result.messages)[0] == "outer"
        assert texts(events.result.messages)[-1] == "done"
        assert await store.load("s") == events.result.messages
        assert (await again.run("after", session_id="s")).output == "inner"

    async def test_a_stream_makes_busy_only_the_session_its_own_run_holds(
        self, store: SessionStore
    ) -> None:
        """Runs of other sessions, from the stream's tools (in parallel) or from its block
        (concurrently), take turns as they do under ``run()``: none is refused. Each
        second run starts while the first holds the session."""

        class Napping(Agent):
            @tool
            async def nap(self) -> str:
                """Hold the session a while."""
                await anyio.sleep(0.1)
                return "rested"

        def helper() -> Napping:
            script = [tool_call_response("nap", {}), text_response("a")] * 2
            return Napping(model=ScriptedModel(script), session_store=store)

        shared, others = helper(), helper()

        class Asking(Agent):
            @tool
            async def ask(self, question: str, after: float) -> str:
                """Ask the helper, on the one shared session, after a while."""
                await anyio.sleep(after)
                return (await shared.run(question, session_id="shared")).output

        calls = (
            ToolCall("c1", "ask", {"question": "x", "after": 0}),
            ToolCall("c2", "ask", {"question": "y", "after": 0.03}),
        )
        model = ScriptedModel(
            [ModelResponse(Message.assistant(tool_calls=calls)), text_response("done")]
        )
        outputs: list[str] = []

        async def other() -> None:
            outputs.append((await others.run("z", session_id="other")).output)

        with anyio.fail_after(10):
            async with Asking(model=model, session_store=store).stream(
                "Go.", session_id="s"
            ) as events:
                async for event in events:
                    if isinstance(event, RunFinished):
                        async with anyio.create_task_group() as group:
                            group.start_soon(other)
                            await anyio.sleep(0.03)
                            group.start_soon(other)
        results = [r for m in events.result.messages for r in m.tool_results]
        assert [(r.is_error, r.content) for r in results] == [(False, "a"), (False, "a")]
        assert outputs == ["a", "a"]

    async def test_a_stream_read_by_a_tool_of_a_stream_is_busy_for_the_outer_block(
        self, store: SessionStore
    ) -> None:
        """A tool that passes a nested stream's events on (``context.emit``) makes the
        outer block wait on the nested run too: a run of its session from the block
        raises ``SessionBusyError`` instead of waiting for itself forever."""
        helper = Helper(model=ScriptedModel([text_response("h")] * 2), session_store=store)

        class Delegating(Agent):
            @tool
            async def delegate(self, context: RunContext) -> str:
                """Ask the helper, passing its events on."""
                async with helper.stream("sub", session_id="T") as events:
                    async for event in events:
                        await context.emit(event)
                return events.result.output

        model = ScriptedModel([tool_call_response("delegate", {}), text_response("done")])
        refused: list[str] = []
        with anyio.fail_after(10):
            async with Delegating(model=model).stream("Go.") as events:
                async for event in events:
                    if isinstance(event, TextDelta) and event.text == "h" and not refused:
                        with pytest.raises(SessionBusyError) as caught:
                            await helper.run("again", session_id="T")
                        refused.append(str(caught.value))
        assert "wait for itself" in refused[0]
        assert events.result.output == "done"

    @pytest.mark.parametrize("seed", range(3))
    @pytest.mark.parametrize("managed", [False, True], ids=["plain", "compacting"])
    async def test_a_storm_of_runs_of_few_sessions_stopped_at_random_leaves_logs_whole(
        self, store: SessionStore, seed: int, managed: bool
    ) -> None:
        """Several runs of each of a few sessions at once (so most wait for theirs), half
        cancelled and many given deadlines at random points (waiting, in the model, in a
        tool, storing, compacting): no run is refused as busy, every request a provider
        would take, every stored log whole (no result without its call, nothing twice, no
        record over what it does not follow), each finished run's messages in it in one
        piece, and the next run of each session answers every call left open."""
        sessions, runs_each = 6, 5
        draw = random.Random(seed)
        problems: list[str] = []

        async def answer(request: ModelRequest) -> ModelResponse:
            await anyio.sleep(draw.uniform(0, 0.005))
            problems.extend(request_problems(request.messages))
            if not request.tools:  # a summary's call
                return text_response("## Summary\nQuestions were asked; work was done.")
            if request.messages[-1].tool_results or draw.random() < 0.3:
                return text_response("done " * draw.randrange(1, 40))
            return tool_call_response("work", {"pause": draw.uniform(0, 0.01)})

        class Worker(Agent):
            @tool
            async def work(self, pause: float) -> str:
                """Work a while.

                Args:
                    pause: Seconds.
                """
                await anyio.sleep(pause)
                return "worked"

        agent_class = Worker
        if managed:
            agent_class = manage_context(compression_threshold=0.5, preserve_recent_messages=2)(
                Worker
            )
        steps = [answer] * (sessions * runs_each * 40)
        agent = agent_class(model=ScriptedModel(steps, context_window=500), session_store=store)
        finished: dict[str, list[tuple[Message, ...]]] = {f"s{i}": [] for i in range(sessions)}

        async def one(session_id: str, question: str) -> None:
            with anyio.CancelScope() as scope:
                if draw.random() < 0.5:
                    scope.deadline = anyio.current_time() + draw.uniform(0, 0.2)
                timeout = draw.choice([0.03, 0.15, None])
                with contextlib.suppress(DeadlineExceededError):
                    result = await agent.run(question, session_id=session_id, timeout=timeout)
                    finished[session_id].append(result.messages[question_at(result, question) :])

        def question_at(result: Any, question: str) -> int:
            return [message.text for message in result.messages].index(question)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as group:
                for run in range(runs_each):
                    for session_id in finished:
                        group.start_soon(one, session_id, f"{session_id} question {run}")
        assert sum(map(len, finished.values())) > 0
        for session_id, runs in finished.items():
            log = await store.load(session_id)
            ids = [message.id for message in log]
            problems.extend(log_problems(log))
            for own in runs:  # what each finished run added, in one piece
                start = ids.index(own[0].id)
                if ids[start : start + len(own)] != [message.id for message in own]:
                    problems.append(f"a finished run of {session_id} is not whole in its log")
            later = await agent.run("and now?", session_id=session_id)
            assert later.messages[: len(log)] == log
            problems.extend(log_problems(later.messages))
            problems.extend(f"{call} never answered" for call in unanswered(later.messages))
        assert problems == []


FORKED_RUN = textwrap.dedent(
    """
    import multiprocessing
    import sys
    import threading

    import anyio

    from littleghost import Agent
    from littleghost.sessions import InMemorySessionStore, SQLiteSessionStore
    from littleghost.testing import ScriptedModel, text_response

    kind, path = sys.argv[1], sys.argv[2]


    class Bot(Agent):
        session_store = SQLiteSessionStore(path) if kind == "sqlite" else InMemorySessionStore()


    asked = threading.Event()


    async def slowly(request):
        asked.set()
        await anyio.sleep(0.5)
        return text_response("parent's answer")


    def child():
        model = ScriptedModel([text_response("child's answer")])
        result = Bot(model=model).run_sync("child", session_id="s", timeout=5)
        print([message.text for message in result.messages], flush=True)


    parent = threading.Thread(
        target=Bot(model=ScriptedModel([slowly])).run_sync,
        args=("parent",),
        kwargs={"session_id": "s"},
    )
    parent.start()
    asked.wait()
    worker = multiprocessing.get_context("fork").Process(target=child)
    worker.start()
    worker.join()
    parent.join()
    print("exit code", worker.exitcode)
    """
)


@pytest.mark.skipif(sys.platform == "win32", reason="fork() is POSIX")
@pytest.mark.parametrize("kind", ["memory", "sqlite"])
@CHILD_PROCESS_ONLY
async def test_a_process_forked_while_another_thread_runs_the_session_can_run_it(
    kind: str, tmp_path: Path
) -> None:
    """A worker forked (a process pool's) while a thread of the parent runs a session
    holds nothing of it: its own run of the session does not wait for the parent's
    threads, which are not in the child (it waited until its deadline). Across processes
    only the SQLite store holds the session: there the child waits for the parent's run."""
    script = tmp_path / "forked.py"
    script.write_text(FORKED_RUN)
    with anyio.fail_after(30):
        done = await anyio.run_process(
            [sys.executable, str(script), kind, str(tmp_path / "s.db")], check=False
        )
    said = done.stdout.decode().splitlines()
    assert said[-1] == "exit code 0", done.stderr.decode()
    seen = {
        "memory": "['parent', 'child', \"child's answer\"]",  # the parent's log, as forked
        "sqlite": "['parent', \"parent's answer\", 'child', \"child's answer\"]",
    }
    assert said[0] == seen[kind]


class Failing(LockingStore):
    """A custom store whose ``failing`` method raises a ``SessionStoreError`` naming no
    session, as a store's own errors (a lost connection) may."""

    def __init__(self, failing: str) -> None:
        super().__init__()
        self.failing = failing

    def _fail(self, method: str) -> None:
        if method == self.failing:
            raise SessionStoreError(f"{method}: the connection was lost")

    async def load(self, session_id: str) -> tuple[Message, ...]:
        self._fail("load")
        return await super().load(session_id)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        self._fail("append")
        await super().append(session_id, messages)

    @contextlib.asynccontextmanager
    async def lock(self, session_id: str) -> AsyncIterator[None]:
        self._fail("lock")
        async with super().lock(session_id):
            yield


class TestErrorsNameTheSession:
    """An error handler groups store errors by ``session_id``: a run's own store errors
    name its session; another store's, raised by a hook, are left as they are."""

    @pytest.mark.parametrize("failing", ["lock", "load", "append"])
    async def test_the_run_s_store_errors_name_its_session(self, failing: str) -> None:
        model = ScriptedModel([text_response("never")])
        agent = Helper(model=model, session_store=Failing(failing))
        with pytest.raises(SessionStoreError, match="the connection was lost") as caught:
            await agent.run("hi", session_id="ticket-42")
        assert caught.value.session_id == "ticket-42"

    async def test_another_store_s_error_from_a_hook_keeps_its_own(self) -> None:
        class Audited(Helper):
            @before_model
            async def audit(self, request: ModelRequest) -> ModelRequest:
                raise SessionStoreError("the audit store is closed")

        model = ScriptedModel([text_response("never")])
        with pytest.raises(SessionStoreError, match="audit store") as caught:
            await Audited(model=model, session_store=InMemorySessionStore()).run(
                "hi", session_id="ticket-42"
            )
        assert caught.value.session_id is None


class TestStoreKnob:
    def test_the_default_is_one_in_memory_store_per_agent_class(self) -> None:
        class Other(Agent):
            pass

        assert isinstance(Agent.session_store, InMemorySessionStore)
        assert isinstance(Other.session_store, InMemorySessionStore)
        assert Other.session_store is not Agent.session_store
        assert Other.session_store is not Helper.session_store
        assert Helper(model=ScriptedModel([])).session_store is Helper.session_store

    async def test_the_default_store_keeps_sessions(self) -> None:
        session_id = new_session()
        model = ScriptedModel([text_response("one"), text_response("two")])
        await Helper(model=model).run("first", session_id=session_id)
        await Helper(model=model).run("second", session_id=session_id)
        assert texts(await Helper.session_store.load(session_id)) == [
            "first",
            "one",
            "second",
            "two",
        ]

    async def test_a_class_store_and_an_instance_override(self, tmp_path: Path) -> None:
        class_store = SQLiteSessionStore(tmp_path / "class.db")
        own_store = InMemorySessionStore()

        class Stored(Agent):
            session_store = class_store

        model = ScriptedModel([text_response("a"), text_response("b")])
        await Stored(model=model).run("to the class store", session_id="s")
        await Stored(model=model, session_store=own_store).run("to my own", session_id="s")
        assert texts(await class_store.load("s")) == ["to the class store", "a"]
        assert texts(await own_store.load("s")) == ["to my own", "b"]
        assert Agent.session_store is not class_store
        await class_store.aclose()

    @pytest.mark.parametrize("value", [None, "sessions.db", InMemorySessionStore])
    def test_a_store_that_is_not_one_fails_at_class_definition(self, value: object) -> None:
        with pytest.raises(ConfigurationError, match=r"Broken\.session_store"):

            class Broken(Agent):
                session_store = value  # type: ignore[assignment]

        with pytest.raises(ConfigurationError, match="session_store="):
            Helper(session_store=value)

    async def test_a_store_without_lock_is_accepted_and_keeps_sessions(self) -> None:
        store = PlainStore()

        class Plain(Agent):
            session_store = store

        model = ScriptedModel([text_response("one"), text_response("two")])
        await Plain(model=model).run("first", session_id="s")
        await Helper(model=model, session_store=store).run("second", session_id="s")
        assert texts(await store.load("s")) == ["first", "one", "second", "two"]
        assert texts(model.requests[1].messages) == ["Help.", "first", "one", "second"]

    async def test_stores_without_lock_each_have_their_own_session_locks(self) -> None:
        in_tool = anyio.Event()
        release = anyio.Event()

        Holding = working_until(in_tool, release)

        first, second = PlainStore(), PlainStore()
        model = ScriptedModel([tool_call_response("work", {}), text_response("first done")])
        async with anyio.create_task_group() as group:
            group.start_soon(
                functools.partial(
                    Holding(model=model, session_store=first).run, "one", session_id="s"
                )
            )
            await in_tool.wait()
            with anyio.fail_after(5):
                await Helper(
                    model=ScriptedModel([text_response("other store")]), session_store=second
                ).run("two", session_id="s")
            release.set()
        assert texts(await first.load("s")) == ["one", "first done"]
        assert texts(await second.load("s")) == ["two", "other store"]

    async def test_a_store_that_cannot_be_weakly_referenced_serializes_and_is_let_go(
        self,
    ) -> None:
        """A store with ``__slots__`` and no ``lock``, made per request: its runs of one
        session take turns, and nothing of it stays once its runs end (a lock table
        stayed for each such store, for good)."""
        in_tool, release = anyio.Event(), anyio.Event()
        store = SlottedStore()
        model = ScriptedModel([tool_call_response("work", {}), text_response("first done")])
        second = Helper(model=ScriptedModel([text_response("second done")]), session_store=store)
        async with anyio.create_task_group() as group:
            group.start_soon(
                functools.partial(
                    working_until(in_tool, release)(model=model, session_store=store).run,
                    "one",
                    session_id="s",
                )
            )
            await in_tool.wait()
            group.start_soon(functools.partial(second.run, "two", session_id="s"))
            await anyio.sleep(0.1)
            assert texts(await store.load("s")) == ["one"]  # the second waits
            release.set()
        assert texts(await store.load("s")) == ["one", "first done", "two", "second done"]

        def tables() -> int:
            gc.collect()
            return sum(isinstance(found, SessionLocks) for found in gc.get_objects())

        before = tables()
        for _ in range(50):
            reply = ScriptedModel([text_response("ok")])
            await Helper(model=reply, session_store=SlottedStore()).run("hi", session_id="s")
        assert tables() <= before

    @pytest.mark.parametrize("method", ["load", "append"])
    async def test_a_store_method_that_returns_no_awaitable_fails_naming_it(
        self, method: str
    ) -> None:
        """A sync ``def`` method fails naming it (the run failed with "object tuple can't
        be used in 'await' expression")."""
        synchronous = type("Sync", (PlainStore,), {method: lambda self, *args: ()})
        model = ScriptedModel([text_response("never")])
        agent = Helper(model=model, session_store=synchronous())
        with pytest.raises(ConfigurationError, match=rf"session_store.{method}\(\) returned tuple"):
            await agent.run("hi", session_id="s")
        assert model.requests == []

    @pytest.mark.parametrize(
        ("loaded", "named"),
        [
            (lambda log: (message for message in log), "returned generator for session 's'"),
            (lambda log: [{"role": "user", "content": "hi"}], "a dict at position 0"),
            (lambda log: "hi", "returned str"),
        ],
    )
    async def test_a_load_that_returns_no_sequence_of_messages_fails_naming_it(
        self, loaded: Any, named: str
    ) -> None:
        """A custom store's load that hands back a generator, dicts or text fails naming
        what it returned, before the model is asked or anything is stored (the run failed
        with "object of type 'generator' has no len()" or "'dict' object has no attribute
        'id'"); compact_session reads the log through the same check."""
        inner = PlainStore()
        await inner.append("s", [Message.user("hi"), Message.assistant("hello")])

        async def load(self: object, session_id: str) -> Any:
            return loaded(await inner.load(session_id))

        Odd = type("Odd", (PlainStore,), {"load": load})
        model = ScriptedModel([text_response("never")])
        agent = Helper(model=model, session_store=Odd())
        with pytest.raises(ConfigurationError, match=rf"session_store.load\(\) .*{named}"):
            await agent.run("again", session_id="s")
        with pytest.raises(ConfigurationError, match=rf"session_store.load\(\) .*{named}"):
            await compact_session(Odd(), "s", Truncation())
        assert model.requests == []
        assert texts(await inner.load("s")) == ["hi", "hello"]

    async def test_store_methods_that_return_awaitables_are_stores(self) -> None:
        """A plain ``def`` that hands back another store's awaitable, and an ``async def``
        wrapping a sync function with ``functools.wraps``, are store methods."""
        inner = PlainStore()

        def sync_load(self: object, session_id: str) -> tuple[Message, ...]:
            return tuple(message_from_json(text) for text in inner.sessions.get(session_id, ()))

        @functools.wraps(sync_load)
        async def load(self: object, session_id: str) -> tuple[Message, ...]:
            return sync_load(self, session_id)

        def append(self: object, session_id: str, messages: Sequence[Message]) -> Any:
            return inner.append(session_id, messages)

        Delegating = type("Delegating", (PlainStore,), {"load": load, "append": append})
        model = ScriptedModel([text_response("one"), text_response("two")])
        agent = Helper(model=model, session_store=Delegating())
        await agent.run("first", session_id="s")
        await agent.run("second", session_id="s")
        assert texts(await inner.load("s")) == ["first", "one", "second", "two"]

    def test_a_lock_that_is_not_a_method_is_refused(self) -> None:
        store = PlainStore()
        store.lock = "exclusive"  # type: ignore[attr-defined]
        with pytest.raises(ConfigurationError, match="optionally lock"):
            Helper(session_store=store)

    async def test_an_unstorable_input_fails_before_anything_is_stored(
        self, store: SessionStore
    ) -> None:
        model = ScriptedModel([text_response("never")])
        message = Message.user("hi", metadata={"when": {1, 2}})
        with pytest.raises(UnstorableValueError, match="set") as caught:
            await Helper(model=model, session_store=store).run(message, session_id="s")
        assert caught.value.session_id == "s"
        assert await store.list_sessions() == ()
        assert model.requests == []


class One:
    """One token per counted text: estimates count messages."""

    def count_tokens(self, text: str) -> int:
        return 1


@manage_context(
    context_window_tokens=100,
    compression_threshold=0.5,
    preserve_recent_messages=4,
    tokenizer=One(),
)
class LongChat(Agent):
    instructions = "Be brief."


def chat(pairs: int) -> list[Message]:
    messages: list[Message] = []
    for index in range(pairs):
        messages += [Message.user(f"old q{index}"), Message.assistant(f"old a{index}")]
    return messages


class TestCompactionAcrossRuns:
    async def test_a_summary_from_one_run_is_reused_by_the_next(self, store: SessionStore) -> None:
        summaries = iter(["First summary.", "Second summary."])

        def answer(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                return text_response(next(summaries))
            return text_response(f"answer to {request.messages[-1].text}")

        model = ScriptedModel([answer] * 60)
        agent = LongChat(model=model, session_store=store)

        await agent.run("first", history=chat(30), session_id="s")
        assert [request.purpose for request in model.requests] == ["context_compaction", "chat"]
        (first_summary,) = [message for message in await store.load("s") if message.is_summary]
        covered = set(first_summary.metadata[SUMMARY_COVERS_KEY])
        assert first_summary.text == SUMMARY_PREFIX + "First summary."

        seen = len(model.requests)
        await agent.run("second", session_id="s")
        assert [request.purpose for request in model.requests[seen:]] == ["chat"]
        view = model.requests[-1].messages
        assert first_summary in view
        assert not covered & {message.id for message in view}

        for turn in range(3, 20):  # talk until the conversation needs a second summary
            seen = len(model.requests)
            await agent.run(f"turn {turn}", session_id="s")
            purposes = [request.purpose for request in model.requests[seen:]]
            if purposes != ["chat"]:
                break
        assert purposes == ["context_compaction", "chat"]
        transcript = model.requests[seen].messages[-1].text
        assert "First summary." not in transcript  # carried forward, not summarized again
        stored = await store.load("s")
        covered_texts = {message.text for message in stored if message.id in covered}
        said = [line.split(": ", 1)[-1] for line in transcript.splitlines()]
        first_kept = next(m for m in stored if not m.is_summary and m.id not in covered)
        assert first_kept.text in said
        assert not covered_texts & set(said)
        second_summary = [message for message in stored if message.is_summary][-1]
        second_covers = set(second_summary.metadata[SUMMARY_COVERS_KEY])
        assert first_summary.id in second_covers
        assert not covered & second_covers


class SyncLockStore(PlainStore):
    """A custom store whose ``lock`` is a sync context manager (a threading.Lock's)."""

    def __init__(self) -> None:
        super().__init__()
        self.mutex = threading.Lock()

    @contextlib.contextmanager
    def lock(self, session_id: str) -> Iterator[None]:
        with self.mutex:
            yield


class GeneratorLockStore(PlainStore):
    """A custom store whose ``lock`` is an async generator missing @asynccontextmanager."""

    async def lock(self, session_id: str) -> AsyncIterator[None]:
        yield


class LockReturningStore(PlainStore):
    """A custom store whose ``lock`` returns a sync lock."""

    def lock(self, session_id: str) -> threading.Lock:
        return threading.Lock()


class TestCustomLocks:
    @pytest.mark.parametrize(
        ("store", "kind"),
        [
            (SyncLockStore, "a generator function"),
            (GeneratorLockStore, "an async generator function without @asynccontextmanager"),
        ],
    )
    def test_a_lock_that_is_no_async_context_manager_fails_at_class_definition(
        self, store: type[PlainStore], kind: str
    ) -> None:
        with pytest.raises(ConfigurationError, match=rf"Synced\.session_store\.lock .* {kind}"):

            class Synced(Agent):
                session_store = store()

        class Locked(Agent):  # an @asynccontextmanager lock is one
            session_store = LockingStore()

        assert Locked(session_store=LockingStore()).session_store is not Locked.session_store

    @pytest.mark.parametrize("where", ["a tool", "a stream's block"])
    async def test_a_run_that_would_wait_for_the_stores_own_lock_it_holds_fails_clearly(
        self, where: str
    ) -> None:
        """A store's own lock cannot tell a run that would wait for itself: the run of the
        same session through the same store, from a tool of a run of it or from the block
        of a stream of it, raises ``SessionBusyError`` instead of waiting forever."""
        store = LockingStore()
        again = Helper(model=ScriptedModel([text_response("inner")]), session_store=store)

        class Asking(Agent):
            @tool
            async def ask(self) -> str:
                """Ask again."""
                return (await again.run("inner", session_id="s")).output

        with anyio.fail_after(10):
            if where == "a tool":
                model = ScriptedModel([tool_call_response("ask", {}), text_response("done")])
                result = await Asking(model=model, session_store=store).run("outer", session_id="s")
                failure = result.messages[2].tool_results[0]
                assert failure.is_error and "wait for itself" in failure.content
            else:
                agent = Helper(model=ScriptedModel([text_response("done")]), session_store=store)
                async with agent.stream("outer", session_id="s") as events:
                    with pytest.raises(SessionBusyError, match="wait for itself"):
                        await again.run("inner", session_id="s")
                    async for _ in events:
                        pass
                result = events.result
        assert texts(await store.load("s"))[0] == "outer"
        assert texts(result.messages)[-1] == "done"
        assert (await again.run("after", session_id="s")).output == "inner"

    async def test_a_lock_returning_no_async_context_manager_fails_before_anything_runs(
        self,
    ) -> None:
        store = LockReturningStore()
        model = ScriptedModel([text_response("never")])
        with pytest.raises(TypeError, match=r"session_store\.lock\('s'\) returned lock"):
            await Helper(model=model, session_store=store).run("hi", session_id="s")
        assert model.requests == []
        assert store.sessions == {}
