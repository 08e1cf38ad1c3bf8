"""agent.stream(): typed events while the run goes on, one run loop with run()."""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from littleghost import (
    Agent,
    Message,
    ReasoningPart,
    Role,
    RunContext,
    TextPart,
    ToolCall,
    ToolResult,
    after_tool,
    before_model,
    before_tool,
    manage_context,
    tool,
)
from littleghost.errors import (
    ContextWindowOverflowError,
    DeadlineExceededError,
    ProtocolError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.events import (
    CompactionFinished,
    CompactionStarted,
    Event,
    ModelCallFinished,
    ModelCallRetried,
    ReasoningDelta,
    RunFinished,
    SideCallFinished,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from littleghost.models import ModelRequest, ModelResponse, StopReason, Usage, report_usage
from littleghost.models.streaming import StreamDone, TextChunk
from littleghost.sessions import InMemorySessionStore, SQLiteSessionStore
from littleghost.stream import RunStream, StreamStateError
from littleghost.testing import (
    ScriptedModel,
    streamed,
    text_response,
    tool_call_response,
    tool_calls_response,
)

from .conftest import Spans
from .conversations import PerMessage
from .faults import stray_cancellation

pytestmark = pytest.mark.anyio


@manage_context(
    context_window_tokens=100,
    compression_threshold=0.5,
    preserve_recent_messages=4,
    tokenizer=PerMessage(),
)
class Weather(Agent):
    instructions = "Report the weather."

    @tool
    async def weather(self, city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"


@attrs.frozen
class Ticket:
    order_id: str


def chat(pairs: int) -> list[Message]:
    return [m for i in range(pairs) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]


def summary(request: ModelRequest) -> ModelResponse:
    assert request.purpose == "context_compaction"
    return text_response("SUMMARY TEXT", input_tokens=40, output_tokens=4)


async def collect(agent: Agent, *args: Any, **kwargs: Any) -> tuple[list[Event], Any]:
    async with agent.stream(*args, **kwargs) as events:
        received = [event async for event in events]
    return received, events


async def until_failed(events: RunStream) -> None:
    """Wait, doing other work in the block, until the stream's run has failed."""
    with anyio.fail_after(5):
        while True:
            try:
                events.result  # noqa: B018
            except StreamStateError as error:
                if "failed" in str(error):
                    return
            await anyio.sleep(0.01)


def waiting_agent(started: anyio.Event) -> type[Agent]:
    """An agent class whose tool ``wait`` sets ``started`` and then waits 10 s."""

    class Slow(Agent):
        @tool
        async def wait(self) -> str:
            """Wait."""
            started.set()
            await anyio.sleep(10)
            return "never"

    return Slow


class TestEvents:
    async def test_order_with_a_compaction_and_a_tool_call(self) -> None:
        """Compaction, model call, tool call, streamed answer, run finished — in order."""
        model = ScriptedModel(
            [
                summary,
                tool_call_response("weather", {"city": "Oslo"}, input_tokens=30, output_tokens=5),
                streamed("It is ", "sunny ", "in Oslo.", input_tokens=50, output_tokens=6),
            ]
        )
        received, events = await collect(Weather(model=model), "Weather in Oslo?", history=chat(30))
        kinds = [type(event) for event in received]
        assert kinds == [
            CompactionStarted,
            CompactionFinished,
            ModelCallFinished,
            ToolCallStarted,
            ToolCallFinished,
            TextDelta,
            TextDelta,
            TextDelta,
            ModelCallFinished,
            RunFinished,
        ]
        started, finished = received[0], received[1]
        assert isinstance(started, CompactionStarted) and started.reason == "threshold"
        assert started.context_window_tokens == 100
        assert isinstance(finished, CompactionFinished) and finished.outcome == "completed"
        assert finished.removed_messages > 0 and finished.usage == Usage(40, 4)
        assert not finished.fallback and finished.tool_results_cut_to is None
        assert isinstance(received[3], ToolCallStarted) and received[3].call.name == "weather"
        assert (
            isinstance(received[4], ToolCallFinished)
            and received[4].result.content == "sunny in Oslo"
        )
        result = events.result
        assert isinstance(received[-1], RunFinished) and received[-1].result is result
        assert all(isinstance(event, Event) for event in received)  # a union of classes
        assert not isinstance(result, Event)
        assert "".join(e.text for e in received if isinstance(e, TextDelta)) == result.output
        usages = [
            e.usage for e in received if isinstance(e, (ModelCallFinished, CompactionFinished))
        ]
        assert sum(usages, Usage()) == result.usage == Usage(120, 15)

    async def test_the_summary_is_never_streamed(self) -> None:
        """A compaction's summary call shows as compaction events, not as text."""
        model = ScriptedModel([summary, text_response("fine")])
        received, _ = await collect(Weather(model=model), "go", history=chat(30))
        assert "SUMMARY" not in "".join(e.text for e in received if isinstance(e, TextDelta))

    async def test_a_model_without_streaming_gives_one_delta(self) -> None:
        """A model with only respond() delivers its answer as one TextDelta."""

        class Plain:
            name, provider, context_window = "plain", "test", None

            async def respond(self, request: ModelRequest) -> ModelResponse:
                return text_response("all at once")

        received, _ = await collect(Agent(model=Plain()), "go")
        assert [e for e in received if isinstance(e, TextDelta)] == [TextDelta("all at once")]

    async def test_scripted_text_streams_word_by_word(self) -> None:
        """ScriptedModel streams a plain text step in several deltas."""
        received, events = await collect(
            Agent(model=ScriptedModel([text_response("one two three")])), "go"
        )
        deltas = [e.text for e in received if isinstance(e, TextDelta)]
        assert deltas == ["one ", "two ", "three"]
        assert "".join(deltas) == events.result.output

    async def test_reasoning_streams_as_reasoning_deltas(self) -> None:
        """Reasoning comes as ReasoningDelta events before the text, never inside a
        TextDelta; a model without streaming gives one of each."""
        thought = ModelResponse(
            Message("assistant", [ReasoningPart("Think first.", None, "x"), TextPart("Hi.")])
        )
        received, events = await collect(Agent(model=ScriptedModel([thought])), "go")
        kinds = [e for e in received if isinstance(e, (ReasoningDelta, TextDelta))]
        assert kinds == [ReasoningDelta("Think first."), TextDelta("Hi.")]
        assert events.result.output == "Hi."

        class Plain:
            name, provider, context_window = "plain", "test", None

            async def respond(self, request: ModelRequest) -> ModelResponse:
                return thought

        received, _ = await collect(Agent(model=Plain()), "go")
        kinds = [e for e in received if isinstance(e, (ReasoningDelta, TextDelta))]
        assert kinds == [ReasoningDelta("Think first."), TextDelta("Hi.")]

    async def test_a_retried_call_is_announced(self) -> None:
        """A transient error makes a ModelCallRetried before the retry's text."""
        model = ScriptedModel([RateLimitError("slow down", retry_after=0.01), text_response("ok")])
        received, _ = await collect(Agent(model=model), "go")
        retried = [e for e in received if isinstance(e, ModelCallRetried)]
        assert retried == [ModelCallRetried(1, "RateLimitError")]
        assert received.index(retried[0]) < received.index(TextDelta("ok"))

    @pytest.mark.virtual_clock
    async def test_a_stream_cut_after_its_text_is_retried(self) -> None:
        """A ``streamed()`` step whose last chunk is an exception raises it after its
        text, as a stream that breaks does: the consumer sees that text, then
        ``ModelCallRetried`` billed the usage reported before the cut, then the retry's
        text; ``run()`` is billed it too."""
        cut = ProviderUnavailableError("stream cut")
        script = [
            streamed(Usage(12, 0), "It is ", "sun", cut),
            streamed("It is ", "sunny.", input_tokens=12, output_tokens=3),
        ]
        received, events = await collect(Agent(model=ScriptedModel(script)), "weather?")
        assert [e for e in received if isinstance(e, (TextDelta, ModelCallRetried))] == [
            TextDelta("It is "),
            TextDelta("sun"),
            ModelCallRetried(1, "ProviderUnavailableError", Usage(12, 0)),
            TextDelta("It is "),
            TextDelta("sunny."),
        ]
        assert (events.result.output, events.result.usage) == ("It is sunny.", Usage(24, 3))
        result = await Agent(model=ScriptedModel(script)).run("weather?")
        assert (result.output, result.usage) == ("It is sunny.", Usage(24, 3))

    async def test_a_turns_retries_are_numbered_together(self) -> None:
        """Transient errors and an overflow recovered by a compaction retry one turn's
        call: ``attempt`` counts them all, and starts again with the next turn."""
        model = ScriptedModel(
            [
                RateLimitError("slow down", retry_after=0.01),
                ContextWindowOverflowError("too long"),
                summary,
                RateLimitError("slow down", retry_after=0.01),
                tool_call_response("weather", {"city": "x"}),
                RateLimitError("slow down", retry_after=0.01),
                text_response("ok"),
            ]
        )
        received, _ = await collect(Weather(model=model), "go", history=chat(3))
        retried = [(e.attempt, e.error_type) for e in received if isinstance(e, ModelCallRetried)]
        assert retried == [
            (1, "RateLimitError"),
            (2, "context_length_exceeded"),
            (3, "RateLimitError"),
            (1, "RateLimitError"),
        ]

    async def test_after_model_hooks_may_change_the_output(self) -> None:
        """Deltas are what the model wrote; result.output is what hooks made of it."""
        from littleghost import after_model

        class Loud(Agent):
            @after_model
            def shout(self, response: ModelResponse) -> ModelResponse:
                import attrs

                return attrs.evolve(
                    response, message=Message.assistant(response.message.text.upper())
                )

        received, events = await collect(
            Loud(model=ScriptedModel([text_response("hi there")])), "go"
        )
        assert "".join(e.text for e in received if isinstance(e, TextDelta)) == "hi there"
        assert events.result.output == "HI THERE"

    @pytest.mark.parametrize("strategy", ["native", "tool"])
    async def test_a_typed_runs_deltas_are_the_json_its_output_was_read_from(
        self, strategy: str
    ) -> None:
        """The streaming page: a typed run's deltas join to the JSON text its output was
        read from, and to nothing through the ``final_result`` tool."""
        answer = (
            text_response('{"order_id": "42"}')
            if strategy == "native"
            else tool_call_response("final_result", {"order_id": "42"})
        )
        received, events = await collect(
            Agent(model=ScriptedModel([answer]), output_strategy=strategy),
            "go",
            output_type=Ticket,
        )
        deltas = "".join(e.text for e in received if isinstance(e, TextDelta))
        assert events.result.output == Ticket(order_id="42")
        assert deltas == ('{"order_id": "42"}' if strategy == "native" else "")


async def test_a_call_that_finished_first_is_reported_after_the_earlier_call() -> None:
    """Results are stored, and reported, in call order as soon as they and the calls before
    them are done: the second call, finished first, is reported once the first is."""
    second_done = anyio.Event()

    class Waiting(Agent):
        @tool
        async def first(self) -> str:
            """Finish after the second."""
            await second_done.wait()
            return "one"

        @tool
        async def second(self) -> str:
            """Finish at once."""
            second_done.set()
            return "two"

    both = tool_calls_response(ToolCall("c1", "first", {}), ToolCall("c2", "second", {}))
    model = ScriptedModel([both, text_response("done")])
    async with Waiting(model=model).stream("go") as events:
        finished = [e.result.call_id async for e in events if isinstance(e, ToolCallFinished)]
    assert finished == ["c1", "c2"]


class TestStates:
    async def test_bad_arguments_fail_at_the_call(self) -> None:
        """stream() checks its arguments before any run starts."""
        agent = Agent(model=ScriptedModel([]))
        with pytest.raises(TypeError, match="history"):
            agent.stream("go", history="not messages")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="timeout"):
            agent.stream("go", timeout=-1)

    def test_a_stream_made_outside_an_event_loop_runs_in_one(self) -> None:
        """stream() only plans the run, which starts as the block is entered: sync code (a
        sync endpoint's worker thread, say) may make it for an event loop to run."""
        events = Agent(model=ScriptedModel([text_response("hello")])).stream("go")

        async def consume() -> None:
            async with events:
                async for _ in events:
                    pass

        anyio.run(consume)
        assert events.result.output == "hello"

    async def test_a_stream_is_entered_once(self) -> None:
        """A stream is one run: entering it again is refused, and nothing runs again."""
        model = ScriptedModel([text_response("hello"), text_response("again")])
        stream = Agent(model=model).stream("go")
        async with stream as events:
            async for _ in events:
                pass
        with pytest.raises(StreamStateError, match="entered once"):
            async with stream:
                pass
        assert len(model.requests) == 1

    async def test_before_the_run_starts_its_messages_are_the_history(self) -> None:
        history = [Message.user("earlier"), Message.assistant("earlier answer")]
        stream = Agent(model=ScriptedModel([text_response("now")])).stream("go", history=history)
        assert stream.messages == tuple(history)
        async with stream as events:
            async for _ in events:
                pass
        assert [m.text for m in events.messages] == ["earlier", "earlier answer", "go", "now"]

    async def test_result_before_completion_raises(self) -> None:
        """events.result is there only once the run has completed."""
        agent = Agent(model=ScriptedModel([streamed("a", "b")]))
        stream = agent.stream("go")
        assert stream.messages == ()  # the history, before the run starts
        async with stream as events:
            with pytest.raises(StreamStateError, match="not completed"):
                events.result  # noqa: B018
            await events.__anext__()
            assert [m.text for m in events.messages] == ["go"]

    async def test_a_failed_run_raises_the_same_exception_as_run(self) -> None:
        """The run's own exception comes out of the async for, not an exception group."""
        agent = Agent(model=ScriptedModel([]))
        with pytest.raises(ProtocolError, match="ran out of steps"):
            async with agent.stream("go") as events:
                async for _ in events:
                    pass
        with pytest.raises(StreamStateError, match="failed"):
            events.result  # noqa: B018

    async def test_a_stray_cancellation_from_the_model_is_raised_as_run_raises_it(self) -> None:
        """A cancellation exception of the model's own (nobody cancelled the run) comes
        out of the async for, as run() raises it; the stream does not just end."""

        class Leaky:
            name, provider, context_window = "leaky", "test", None

            async def respond(self, request: ModelRequest) -> ModelResponse:
                raise await stray_cancellation()

        cancelled = anyio.get_cancelled_exc_class()
        with pytest.raises(cancelled):
            await Agent(model=Leaky()).run("go")
        received: list[Event] = []
        with pytest.raises(cancelled):
            async with Agent(model=Leaky()).stream("go") as events:
                async for event in events:
                    received.append(event)
        assert received == []
        with pytest.raises(StreamStateError, match="failed"):
            events.result  # noqa: B018

    async def test_a_run_that_raises_stop_async_iteration_does_not_end_the_loop_quietly(
        self,
    ) -> None:
        """``StopAsyncIteration`` from the run would end the ``async for`` as if the run
        had completed: it comes out as a ``RuntimeError`` caused by it."""

        async def no_hints() -> AsyncIterator[str]:
            return
            yield

        class Exhausted(Agent):
            @before_model
            async def next_hint(self, request: ModelRequest) -> None:
                await anext(no_hints())  # the hints ran out

        with pytest.raises(StopAsyncIteration):
            await Exhausted(model=ScriptedModel([text_response("hi")])).run("go")
        with pytest.raises(RuntimeError, match="StopAsyncIteration") as caught:
            async with Exhausted(model=ScriptedModel([text_response("hi")])).stream("go") as ev:
                async for _ in ev:
                    pass
        assert isinstance(caught.value.__cause__, StopAsyncIteration)

    async def test_the_log_is_the_sessions_once_entered(self, tmp_path: Path) -> None:
        """Entering waits until the run holds its session and has its log: a store whose
        load suspends showed an empty log."""
        async with SQLiteSessionStore(tmp_path / "s.db") as store:
            earlier = [Message.user("first question"), Message.assistant("first answer")]
            await store.append("s", earlier)
            agent = Agent(model=ScriptedModel([text_response("hi")]), session_store=store)
            async with agent.stream("go", session_id="s") as events:
                assert [m.text for m in events.messages][:2] == ["first question", "first answer"]
                async for _ in events:
                    pass

    @pytest.mark.parametrize("leave", [False, True])
    async def test_iterating_after_the_block_is_a_state_error(self, leave: bool) -> None:
        """After the block, iterating raises ``StreamStateError``, whether the consumer
        left early or the run failed while the block did other work (it ended quietly,
        or raised the error the block's end had dropped)."""
        model = ScriptedModel([streamed("a", "b")] if leave else [])
        async with Agent(model=model).stream("go") as events:
            if leave:
                await events.__anext__()
            else:
                await until_failed(events)
        with pytest.raises(StreamStateError, match="iterate inside"):
            await events.__anext__()


class TestStopping:
    async def test_leaving_early_stops_the_run_and_keeps_the_log_whole(
        self, spans: Spans, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A break after the first delta cancels the model call; spans end; log is usable."""
        finished = anyio.Event()

        Slow = waiting_agent(finished)

        calls = [ToolCall("w", "wait", {})]
        model = ScriptedModel(
            [
                ModelResponse(Message.assistant("Waiting…", tool_calls=calls), StopReason.TOOL_USE),
                text_response("x"),
            ]
        )
        async with Slow(model=model).stream("go") as events:
            async for event in events:
                if isinstance(event, ToolCallStarted):
                    await finished.wait()
                    break
        log = events.messages
        assert [m.role.value for m in log] == ["user", "assistant", "tool"]
        assert log[2].tool_results[0].call_id == "w" and log[2].tool_results[0].is_error
        assert "stopped" in log[2].tool_results[0].content
        assert spans.one("invoke_agent").status.status_code.name == "UNSET"
        assert {s.name.split()[0] for s in spans.all()} == {"invoke_agent", "chat", "execute_tool"}
        assert spans.still_open == set()
        assert not [r for r in caplog.records if r.levelname == "ERROR"]
        again = ScriptedModel([text_response("resumed")])
        result = await Slow(model=again).run("again", history=log)
        assert result.output == "resumed"

    @pytest.mark.parametrize("anyio_backend", ["asyncio"])
    async def test_a_block_left_from_another_task_stops_the_run_and_says_so(self) -> None:
        """A generator around the block, left suspended by the task iterating it (as a
        web framework's streaming response can leave it when a disconnect cancels its
        send) and closed by another task (the garbage collector's finalizer): a
        ``StreamStateError`` saying so, not a context variable's ``ValueError`` over
        anyio's error; the run is stopped and waited for, its tool call answered and its
        session free. (Under asyncio only: a trio task cannot end inside a nursery a
        generator opened.)"""
        started = anyio.Event()

        Slow = waiting_agent(started)

        store = InMemorySessionStore()
        model = ScriptedModel([tool_call_response("wait", {}, call_id="w"), text_response("on")])
        agent = Slow(model=model, session_store=store)

        async def tool_names() -> AsyncIterator[str]:
            async with agent.stream("go", session_id="s") as events:
                async for event in events:
                    if isinstance(event, ToolCallStarted):
                        yield event.call.name

        names = tool_names()

        async def first() -> str:
            return await anext(names)

        assert await asyncio.create_task(first()) == "wait"  # that task ends in the block
        await started.wait()
        with anyio.fail_after(5):
            with pytest.raises(StreamStateError, match="left from another task"):
                await names.aclose()
            log = await store.load("s")
            assert log[-1].tool_results[0].call_id == "w" and log[-1].tool_results[0].is_error
            assert (await agent.run("next", session_id="s")).output == "on"

    async def test_a_tool_that_finished_while_the_consumer_was_slow_keeps_its_result(self) -> None:
        """A finished tool's result is in the log even if the run stops before the
        consumer reads ToolCallFinished."""
        ran: list[str] = []

        class Fast(Agent):
            @tool
            async def fast(self) -> str:
                """Fast."""
                ran.append("fast")
                return "FAST RESULT"

        model = ScriptedModel([tool_call_response("fast", {}, call_id="a"), text_response("x")])
        async with Fast(model=model).stream("go") as events:
            async for event in events:
                if isinstance(event, ToolCallStarted):
                    await anyio.sleep(0.1)  # the tool finishes meanwhile
                    break
        assert ran == ["fast"]
        results = [r for m in events.messages for r in m.tool_results]
        assert [(r.call_id, r.content, r.is_error) for r in results] == [
            ("a", "FAST RESULT", False)
        ]

    async def test_aclose_stops_the_run_inside_the_block(self) -> None:
        """``await events.aclose()`` in the block stops the run at once, as leaving the
        block does, and returns once it has stopped: the tool call it was running is
        answered in the log and the store, the loop ends, and the session is free
        while the block is still open."""
        started = anyio.Event()

        Slow = waiting_agent(started)

        store = InMemorySessionStore()
        model = ScriptedModel([tool_call_response("wait", {}, call_id="w"), text_response("x")])
        with anyio.fail_after(5):
            async with Slow(model=model, session_store=store).stream(
                "go", session_id="s"
            ) as events:
                received = []
                async for event in events:
                    received.append(event)
                    if isinstance(event, ToolCallStarted):
                        await started.wait()
                        await events.aclose()
                        [answer] = events.messages[-1].tool_results
                        assert answer.call_id == "w" and answer.is_error
                        assert [m.id for m in await store.load("s")] == [
                            m.id for m in events.messages
                        ]
                        again = ScriptedModel([text_response("on")])
                        other = Agent(model=again, session_store=store)
                        assert (await other.run("next", session_id="s")).output == "on"
                assert isinstance(received[-1], ToolCallStarted)  # the loop ended there
                await events.aclose()  # once more: nothing to do
        await events.aclose()  # after the block: nothing to do

    @pytest.mark.virtual_clock
    async def test_aclose_from_another_task_as_the_block_is_left_waits_for_the_stop(
        self,
    ) -> None:
        """Another task's ``aclose()`` (a disconnect's handler, say), called while the
        block is being left and the stopped run still stores its open call's answer,
        returns once that is stored, as it does in the block: never with the call
        open."""
        started, storing = anyio.Event(), anyio.Event()

        class SlowToStore(InMemorySessionStore):
            async def append(self, session_id: str, messages: Sequence[Message]) -> None:
                if started.is_set():  # the stopped run's answer to its open call
                    storing.set()
                    await anyio.sleep(1)
                await super().append(session_id, messages)

        store = SlowToStore()
        model = ScriptedModel([tool_call_response("wait", {}, call_id="w"), text_response("x")])
        agent = waiting_agent(started)(model=model, session_store=store, cleanup_grace=5)
        closed: list[tuple[Message, ...]] = []
        async with anyio.create_task_group() as group, agent.stream("go", session_id="s") as events:

            async def close() -> None:
                await storing.wait()  # the block is being left
                await events.aclose()
                closed.append(events.messages)

            group.start_soon(close)
            async for event in events:
                if isinstance(event, ToolCallStarted):
                    await started.wait()
                    break
        [log] = closed
        assert [(r.call_id, r.is_error) for r in log[-1].tool_results] == [("w", True)]

    async def test_aclosing_an_unentered_stream_says_to_enter_it(self) -> None:
        """``contextlib.aclosing(agent.stream(...))`` without ``async with``: the
        ``StreamStateError`` saying so goes through (no ``AttributeError`` for a missing
        ``aclose`` in its place), and nothing runs."""
        model = ScriptedModel([text_response("hi")])
        with pytest.raises(StreamStateError, match="iterate inside"):
            async with contextlib.aclosing(Agent(model=model).stream("go")) as events:
                async for _ in events:
                    pass
        assert model.requests == []

    @pytest.mark.virtual_clock
    async def test_leaving_after_the_first_delta_cancels_the_model_call(self) -> None:
        """The rest of a slow stream is never produced."""
        model = ScriptedModel([streamed("first ", *["more "] * 20, delay=0.5)])
        start = anyio.current_time()
        async with Agent(model=model).stream("go") as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    break
        assert anyio.current_time() - start == pytest.approx(0.5)  # the whole stream: 10.5 s
        assert [m.role.value for m in events.messages] == ["user"]

    @pytest.mark.virtual_clock
    async def test_a_deadline_error_blames_a_slow_consumer_not_the_run(self) -> None:
        """A consumer that dwells on an event past the run's deadline stops the run as it
        hands the next one over: the ``DeadlineExceededError`` says the run was waiting
        for the consumer to take that event, not that a tool, a hook or the model, done
        long before, was slow."""

        def script() -> ScriptedModel:
            return ScriptedModel(
                [
                    summary,
                    tool_call_response("weather", {"city": "Oslo"}),
                    streamed("It is ", "sunny."),
                ]
            )

        received, _ = await collect(Weather(model=script()), "go", history=chat(30))
        kinds = [type(event).__name__ for event in received]
        told = []
        for at in range(len(kinds) - 2):  # RunFinished goes out once the run is over
            seen = 0
            with pytest.raises(DeadlineExceededError) as caught:
                async with Weather(model=script()).stream(
                    "go", history=chat(30), timeout=10
                ) as events:
                    async for _ in events:
                        seen += 1
                        if seen - 1 == at:
                            await anyio.sleep(20)
            told.append(str(caught.value).split(", ", 1)[1].split(" in turn")[0])
        assert told == [
            f"waiting for the stream's consumer to take its {kind} event" for kind in kinds[1:-1]
        ]

    @pytest.mark.parametrize(
        "kind",
        [KeyboardInterrupt, SystemExit, None],
        ids=["KeyboardInterrupt", "SystemExit", "stray cancellation"],
    )
    async def test_leaving_early_raises_what_the_run_raised_that_is_no_exception(
        self, kind: type[BaseException] | None, caplog: pytest.LogCaptureFixture
    ) -> None:
        """KeyboardInterrupt, SystemExit or a stray cancellation that ended the run after
        the consumer's break is raised as the block is left, as run() raises it. Over an
        exception of the block's own, KeyboardInterrupt and SystemExit still win (caused
        by it); a stray cancellation is logged and the block's exception goes on."""
        expected = kind or anyio.get_cancelled_exc_class()

        class Ending(Agent):
            @tool
            async def lookup(self) -> str:
                """Look something up."""
                return "found"

            @after_tool
            async def end(self, result: ToolResult) -> None:
                raise kind() if kind is not None else await stray_cancellation()

        def model() -> ScriptedModel:
            return ScriptedModel([tool_call_response("lookup", {}), text_response("x")])

        with pytest.raises(expected):
            await Ending(model=model()).run("go")
        with pytest.raises(expected):
            async with Ending(model=model()).stream("go") as events:
                async for event in events:
                    if isinstance(event, ToolCallStarted):
                        break
                await until_failed(events)
        [answer] = [r for m in events.messages for r in m.tool_results]
        assert answer.is_error
        with pytest.raises(expected if kind is not None else KeyError) as caught:
            async with Ending(model=model()).stream("go") as events:
                async for event in events:
                    if isinstance(event, ToolCallStarted):
                        break
                await until_failed(events)
                raise KeyError("consumer")
        if kind is not None:
            assert isinstance(caught.value.__cause__, KeyError)
        else:
            assert "the streamed run failed too (" in caplog.text
            assert f"({expected.__name__}) while KeyError" in caplog.text

    async def test_what_the_run_raised_is_raised_once(self) -> None:
        """A SystemExit the async for raised, and the consumer handled, is not raised
        again as the block is left."""

        class Exiting(Agent):
            @tool
            async def stop(self) -> str:
                """Stop everything."""
                raise SystemExit(3)

        model = ScriptedModel([tool_call_response("stop", {}), text_response("x")])
        async with Exiting(model=model).stream("go") as events:
            with pytest.raises(SystemExit):
                async for _ in events:
                    pass

    @pytest.mark.virtual_clock
    async def test_deadline_during_a_stream(self) -> None:
        """The run's deadline applies; DeadlineExceededError comes out of the loop."""
        model = ScriptedModel([streamed("a ", *["b "] * 20, delay=0.3)])  # 6.3 s
        start = anyio.current_time()
        received: list[Event] = []
        with pytest.raises(DeadlineExceededError):
            async with Agent(model=model).stream("go", timeout=0.45) as events:
                async for event in events:
                    received.append(event)
        assert anyio.current_time() - start == pytest.approx(0.45)
        assert received == [TextDelta("a ")]

    async def test_an_exception_in_the_consumer_propagates_and_the_log_is_whole(self) -> None:
        """The consumer's own exception stops the run and propagates as is."""
        model = ScriptedModel([tool_call_response("weather", {"city": "x"}), text_response("done")])
        with pytest.raises(KeyError, match="consumer"):
            async with Weather(model=model).stream("go") as events:
                async for event in events:
                    if isinstance(event, ToolCallFinished):
                        raise KeyError("consumer")
        log = events.messages
        assert log[1].tool_calls[0].id == log[2].tool_results[0].call_id

    async def test_cancelling_the_consumer(self) -> None:
        """An outer cancel scope stops consumer and run; nothing is left behind."""
        model = ScriptedModel([streamed("a ", "b", delay=5)])
        with anyio.move_on_after(0.2) as scope:
            async with Agent(model=model).stream("go") as events:
                async for _ in events:
                    pass
        assert scope.cancelled_caught
        assert [m.role.value for m in events.messages] == ["user"]


class TestRunUnchanged:
    async def test_run_and_stream_give_the_same_result(self) -> None:
        """One run loop: the same script gives the same output, usage and log shape."""

        def script() -> ScriptedModel:
            return ScriptedModel(
                [
                    tool_call_response("weather", {"city": "x"}, input_tokens=3, output_tokens=1),
                    text_response("done", input_tokens=5, output_tokens=2),
                ]
            )

        ran = await Weather(model=script()).run("go")
        _, events = await collect(Weather(model=script()), "go")
        assert (events.result.output, events.result.usage) == (ran.output, ran.usage)
        assert [m.role for m in events.result.messages] == [m.role for m in ran.messages]

    async def test_a_models_stream_may_be_any_async_iterator(self) -> None:
        """``stream()`` returns an async iterator, not necessarily a generator: one without
        ``aclose`` streams as a generator does."""

        class Chunks:
            def __init__(self) -> None:
                self.left: list[Any] = [
                    TextChunk("hello "),
                    TextChunk("world"),
                    StreamDone(text_response("hello world")),
                ]

            def __aiter__(self) -> Chunks:
                return self

            async def __anext__(self) -> Any:
                if not self.left:
                    raise StopAsyncIteration
                return self.left.pop(0)

        class Iterating(ScriptedModel):
            def stream(self, request: ModelRequest) -> Chunks:
                return Chunks()

        received, events = await collect(Agent(model=Iterating([])), "hi")
        deltas = [event.text for event in received if isinstance(event, TextDelta)]
        assert deltas == ["hello ", "world"] and events.result.output == "hello world"


async def test_tool_events_pair_by_the_logged_call_id_when_a_hook_replaces_the_call() -> None:
    """``ToolCallStarted`` shows the call as hooks left it, under the id the log holds."""

    class Trimming(Agent):
        @tool
        def echo(self, text: str) -> str:
            """Say it back."""
            return text

        @before_tool
        def trim(self, call: ToolCall) -> ToolCall:
            return ToolCall(f"hook-{call.id}", call.name, {"text": call.arguments["text"].strip()})

    model = ScriptedModel(
        [tool_call_response("echo", {"text": " hi "}, call_id="c1"), text_response("ok")]
    )
    async with Trimming(model=model).stream("Echo.") as events:
        seen = [
            e
            for e in [event async for event in events]
            if isinstance(e, (ToolCallStarted, ToolCallFinished))
        ]
    started, finished = seen
    assert isinstance(started, ToolCallStarted) and isinstance(finished, ToolCallFinished)
    assert started.call == ToolCall("c1", "echo", {"text": "hi"})
    assert finished.result.call_id == "c1" == events.messages[1].tool_calls[0].id


class TestToolTimeouts:
    @staticmethod
    def guarded(wait_after: float) -> type[Agent]:
        class Guarded(Agent):
            @tool(timeout=0.25)
            async def check(self, context: RunContext) -> str:
                """Check with a side call."""
                request = ModelRequest((Message.user("ok?"),), (), {}, purpose="guard")
                answer = await context.complete(request)
                await anyio.sleep(wait_after)
                return "checked: " + answer.message.text

        return Guarded

    @staticmethod
    def script() -> ScriptedModel:
        return ScriptedModel(
            [
                tool_call_response("check", {}, call_id="k"),
                text_response("yes", input_tokens=5, output_tokens=1),
                text_response("done", input_tokens=1, output_tokens=1),
            ]
        )

    async def test_waiting_for_a_slow_consumer_is_not_the_tools_time(self) -> None:
        """A side call's event waits for a slow consumer (busy with the event before it)
        without using up the tool's timeout: the tool's result is run()'s, and the events
        add up to the usage."""
        received: list[Event] = []
        async with self.guarded(0)(model=self.script()).stream("go") as events:
            async for event in events:
                received.append(event)
                if isinstance(event, ToolCallStarted):
                    await anyio.sleep(0.5)
        results = [r for m in events.messages for r in m.tool_results]
        assert [(r.content, r.is_error) for r in results] == [("checked: yes", False)]
        usages = [e.usage for e in received if isinstance(e, (ModelCallFinished, SideCallFinished))]
        assert sum(usages, Usage()) == events.result.usage == Usage(6, 2)

    async def test_the_tools_own_time_still_counts(self) -> None:
        """After the wait, the rest of the timeout applies to the tool's own work."""
        async with self.guarded(10)(model=self.script()).stream("go") as events:
            async for event in events:
                if isinstance(event, ToolCallStarted):
                    await anyio.sleep(0.5)
        (result,) = [r for m in events.messages for r in m.tool_results]
        assert result.is_error and "within 0.25 s" in result.content


ASK = ModelRequest((Message.user("ok?"),), purpose="check")


async def late_answer(request: ModelRequest) -> ModelResponse:
    """A side call's answer that comes after the caller's scope has run out."""
    with anyio.CancelScope(shield=True):
        await anyio.sleep(0.1)
    return text_response("yes", input_tokens=3, output_tokens=1)


class Checking(Agent):
    """Makes a side call in its tool, within its timeout, or in a ``before_model`` hook
    of its first turn, within the hook's own scope (``in_hook``)."""

    in_hook = False

    @tool(timeout=0.05)
    async def check(self, context: RunContext) -> str:
        """Check with a side call."""
        await context.complete(ASK)
        return "checked"

    @before_model
    async def guard(self, request: ModelRequest, context: RunContext) -> ModelRequest:
        if self.in_hook and context.turn == 0:
            with anyio.move_on_after(0.05):
                await context.complete(ASK)
        return request


@pytest.mark.parametrize("in_hook", [False, True])
async def test_a_side_calls_event_a_cancellation_cut_on_its_way_comes_next(in_hook: bool) -> None:
    """A cancellation inside the run (a tool's timeout, a hook's own scope) lands as a
    side call's ``SideCallFinished`` goes out, and the run goes on: the event comes
    before the run's next one, once, and the events add up to the usage. (It was lost.)"""
    steps: list[Any] = [late_answer] if in_hook else [tool_call_response("check", {}), late_answer]
    steps.append(streamed("all ", "done", input_tokens=5, output_tokens=2))
    agent = Checking(model=ScriptedModel(steps))
    agent.in_hook = in_hook
    async with agent.stream("go") as events:
        received = [event async for event in events]
    before = ["SideCallFinished"]
    if not in_hook:
        before = ["ModelCallFinished", "ToolCallStarted", *before, "ToolCallFinished"]
    answer = ["TextDelta", "TextDelta", "ModelCallFinished", "RunFinished"]
    assert [type(e).__name__ for e in received] == [*before, *answer]
    usages = [e.usage for e in received if isinstance(e, (ModelCallFinished, SideCallFinished))]
    assert sum(usages, Usage()) == events.result.usage == Usage(8, 3)


async def test_the_events_add_up_wherever_a_tools_timeout_lands() -> None:
    """Randomized: two parallel tools, each making two side calls within a timeout of
    20 ms, answered at random times (some past it), billed at once or with their answer,
    some shielded (answering past it: the cancellation lands as their events go out),
    read by a consumer that dawdles at random: every billed side call is told once, and
    the events add up to the usage."""
    rng = random.Random(69)
    billed = [0]  # the side calls billed in the current attempt

    async def answer(request: ModelRequest) -> ModelResponse:
        if request.purpose == "check":
            how, wait = rng.choice(["billed first", "answered", "shielded"]), rng.uniform(0, 0.03)
            if how == "billed first":
                report_usage(Usage(1, 1))
                billed[0] += 1
            with anyio.CancelScope(shield=how == "shielded"):
                await anyio.sleep(wait)
            billed[0] += how != "billed first"
            return text_response("ok", input_tokens=1, output_tokens=1)
        if request.messages[-1].role is Role.USER:
            return tool_calls_response(("check", {}), ("check", {}), output_tokens=1)
        return text_response("done", output_tokens=1)

    class Twice(Agent):
        @tool(timeout=0.02)
        async def check(self, context: RunContext) -> str:
            """Check twice with side calls."""
            for _ in range(2):
                await context.complete(ASK)
            return "checked"

    problems = []
    for attempt in range(25):
        billed[0] = 0
        async with Twice(model=ScriptedModel([answer] * 6)).stream("go") as events:
            received = []
            async for event in events:
                received.append(event)
                if rng.random() < 0.3:
                    await anyio.sleep(rng.uniform(0, 0.01))
        told = [e.usage for e in received if isinstance(e, (ModelCallFinished, SideCallFinished))]
        if sum(told, Usage()) != events.result.usage:
            problems.append(f"{attempt}: {sum(told, Usage())} told, {events.result.usage} used")
        sides = sum(isinstance(e, SideCallFinished) for e in received)
        if sides != billed[0]:
            problems.append(f"{attempt}: {sides} SideCallFinished for {billed[0]} billed calls")
    assert problems == []


async def test_a_model_stream_that_fails_to_close_does_not_replace_the_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's deadline cuts a streamed call while its consumer is slow to read: the
    model's stream is closed, and its failure to close is logged (its type only), never
    raised in place of the run's ``DeadlineExceededError``."""

    class FailingClose:
        name, provider, context_window = "failing-close", "custom", None

        async def respond(self, request: ModelRequest) -> ModelResponse:
            raise AssertionError("the run streams")

        async def stream(self, request: ModelRequest) -> AsyncIterator[Any]:
            try:
                yield TextChunk("Hel")
                yield TextChunk("lo")
                yield StreamDone(text_response("Hello"))
            finally:
                raise RuntimeError("the close failed")

    with pytest.raises(DeadlineExceededError):
        async with Agent(model=FailingClose()).stream("hi", timeout=0.2) as events:
            async for _ in events:
                await anyio.sleep(0.4)  # the run waits to hand over "lo" at its deadline
    assert "closing the stream of model 'failing-close' failed too (RuntimeError)" in caplog.text
