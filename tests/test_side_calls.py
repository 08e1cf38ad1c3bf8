"""Side calls (``context.complete`` from a hook or a tool) are never the turn's own call:
they stream nothing, take none of its annotations, leave ``last_exchange`` alone, and
their usage reaches the stream in ``SideCallFinished`` (or, with ``report=False``, in the
caller's own event, as ``@manage_context``'s summary call does)."""

from __future__ import annotations

import contextlib
import gc
import random
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import attrs
import pytest
from opentelemetry.sdk.metrics import Histogram

from littleghost import Agent, Message, RunContext, before_model, manage_context, tool
from littleghost.capabilities import Capability, CapabilityHook, add_capability
from littleghost.context import CompactionState, PromptBudget, Truncation
from littleghost.errors import (
    ConfigurationError,
    ContextWindowOverflowError,
    DeadlineExceededError,
    LimitExceededError,
    ProtocolError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.events import (
    CompactionFinished,
    CompactionStarted,
    Event,
    ModelCallFinished,
    ModelCallRetried,
    SideCallFinished,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from littleghost.models import ModelRequest, ModelResponse, StopReason, Usage, report_usage
from littleghost.run import RunResult
from littleghost.testing import ScriptedModel, streamed, text_response, tool_call_response

from .conftest import Histograms, Spans
from .conversations import PerMessage, chat, compacting, summary_step

pytestmark = pytest.mark.anyio

ANSWER = ("Order 42 ", "ships Monday.")


def guard(purpose: str) -> Capability:
    """A guardrail: annotates the turn's call, then checks the request with a side call."""

    async def check(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        context.annotate_next_call({"guard.checked": True})
        question = Message.user(f"Is this safe? {request.messages[-1].text}")
        verdict = await context.complete(ModelRequest([question], purpose=purpose))
        assert verdict.message.text == "SAFE"

    return Capability("guard", [CapabilityHook("before_model", check)])


def guarded(cls: type[Agent], purpose: str = "chat") -> None:
    add_capability(cls, guard(purpose))


class Digesting(Agent):
    """A tool summarizes a document with a side call; a hook notes the last exchange."""

    def __init__(self, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.anchors: list[StopReason | None] = []

    @tool
    async def digest(self, context: RunContext) -> str:
        """Digest the document."""
        response = await context.complete(ModelRequest([Message.user("Digest: ...")]))
        return response.message.text

    @before_model
    def note_anchor(self, request: ModelRequest, *, context: RunContext) -> None:
        exchange = context.last_exchange
        self.anchors.append(None if exchange is None else exchange[1].stop_reason)


async def go(
    agent: Agent, via: str, *args: Any, **kwargs: Any
) -> tuple[RunResult[Any], list[Event]]:
    """Run ``agent`` through ``run()`` (no events) or ``stream()``."""
    if via == "run":
        return await agent.run(*args, **kwargs), []
    async with agent.stream(*args, **kwargs) as events:
        received = [event async for event in events]
    return events.result, received


def reported(events: list[Event]) -> Usage:
    """The usage the stream's events report."""
    total = Usage()
    for event in events:
        if isinstance(
            event, (ModelCallFinished, ModelCallRetried, SideCallFinished, CompactionFinished)
        ):
            total = total + event.usage
    return total


def answer_text(events: list[Event]) -> str:
    return "".join(event.text for event in events if isinstance(event, TextDelta))


@pytest.mark.parametrize("purpose", ["chat", "guardrail"])
async def test_a_hooks_side_call_is_not_streamed_and_its_usage_is_reported(
    purpose: str, spans: Spans
) -> None:
    """A guardrail's side call (retried once) streams nothing, announces no retry, and
    its usage reaches the stream, so the events add up to result.usage."""
    model = ScriptedModel(
        [
            RateLimitError("slow down", retry_after=0.01),
            text_response("SAFE", input_tokens=11, output_tokens=1),
            streamed(*ANSWER, input_tokens=20, output_tokens=6),
        ]
    )

    class Guarded(Agent):
        pass

    guarded(Guarded, purpose)
    result, events = await go(Guarded(model=model), "stream", "Where is order 42?")
    assert answer_text(events) == result.output == "".join(ANSWER)
    assert not [event for event in events if isinstance(event, ModelCallRetried)]
    assert SideCallFinished(Usage(11, 1), purpose) in events
    assert reported(events) == result.usage == Usage(31, 7)
    side, turn = spans.named("chat")[-2:]
    assert "gen_ai.request.stream" not in (side.attributes or {})
    assert (turn.attributes or {}).get("gen_ai.request.stream") is True


@pytest.mark.parametrize("via", ["run", "stream"])
async def test_the_turns_annotations_and_compacted_mark_stay_on_its_call(
    via: str, spans: Spans
) -> None:
    """After a compaction, a guard's side call takes neither the hook's annotation nor
    gen_ai.conversation.compacted: both land on the turn's chat span."""

    @compacting
    class Compacting(Agent):
        pass

    guarded(Compacting)  # its hook runs after @manage_context's
    model = ScriptedModel(
        [
            summary_step(input_tokens=40, output_tokens=5),
            text_response("SAFE", input_tokens=7, output_tokens=1),
            text_response("done", input_tokens=9, output_tokens=2),
        ]
    )
    result, events = await go(Compacting(model=model), via, "go", history=chat(30))
    summary, side, turn = (span.attributes or {} for span in spans.named("chat"))
    assert [summary["littleghost.purpose"], side["littleghost.purpose"]] == [
        "context_compaction",
        "chat",
    ]
    assert "gen_ai.conversation.compacted" not in side
    assert "guard.checked" not in side
    assert turn.get("gen_ai.conversation.compacted") is True
    assert turn.get("guard.checked") is True
    if via == "stream":
        assert answer_text(events) == "done"
        assert reported(events) == result.usage == Usage(56, 8)


@pytest.mark.parametrize("via", ["run", "stream"])
async def test_a_tools_side_call_is_not_the_turns_call(via: str) -> None:
    """A tool's digest call is not streamed into the answer, is reported by its own
    event while the tool runs, and does not become the run's last exchange."""
    model = ScriptedModel(
        [
            tool_call_response("digest", {}, input_tokens=5, output_tokens=1),
            text_response("INTERNAL DIGEST", input_tokens=7, output_tokens=2),
            text_response("Here you go.", input_tokens=9, output_tokens=3),
        ]
    )
    agent = Digesting(model=model)
    result, events = await go(agent, via, "Digest it.")
    assert result.output == "Here you go."
    assert agent.anchors == [None, StopReason.TOOL_USE]  # the turn's answer, not the digest
    assert result.usage == Usage(21, 6)
    if via == "stream":
        assert answer_text(events) == "Here you go."
        kinds = [type(event) for event in events]
        started, side = kinds.index(ToolCallStarted), kinds.index(SideCallFinished)
        assert started < side < kinds.index(ToolCallFinished)
        assert events[side] == SideCallFinished(Usage(7, 2), "chat")
        assert reported(events) == result.usage


async def test_a_failed_side_call_billed_nothing_is_not_reported() -> None:
    """A side call whose error bills nothing has no usage to report: no event (the tool
    fails, and the run goes on)."""
    model = ScriptedModel(
        [
            tool_call_response("digest", {}, input_tokens=5, output_tokens=1),
            ValueError("the digest model is down"),
            text_response("Here you go.", input_tokens=9, output_tokens=3),
        ]
    )
    result, events = await go(Digesting(model=model), "stream", "Digest it.")
    assert result.output == "Here you go."
    assert not [event for event in events if isinstance(event, SideCallFinished)]
    assert reported(events) == result.usage == Usage(14, 4)


def own_summarizer() -> Capability:
    """A third party's compaction-like capability: before the turn's call, a summary call
    through ``context.complete(report=False)``, reported by compaction events of its own."""

    async def summarize(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        await context.emit(CompactionStarted("threshold", 60, 100))
        notes = ModelRequest(
            [Message.user("Summarize: ...")],
            settings={"max_tokens": 25, "seed": 1},
            purpose="context_compaction",
        )
        response = await context.complete(notes, report=False)
        context.mark_compacted()
        await context.emit(
            CompactionFinished("threshold", "completed", 0, 5, None, response.usage, None)
        )

    return Capability("own_summarizer", [CapabilityHook("before_model", summarize)])


@pytest.mark.parametrize("via", ["run", "stream"])
async def test_a_capability_makes_a_summary_call_as_manage_context_does(
    via: str, spans: Spans
) -> None:
    """``context.complete(report=False)`` gives a capability of one's own the summary call
    ``@manage_context`` makes: the same chat span, the usage in the run's total, no
    ``SideCallFinished`` beside the capability's own events, the turn's call marked."""

    @compacting
    class Compacting(Agent):
        settings = {"seed": 1}

    class Summarizing(Agent):
        settings = {"seed": 1}

    add_capability(Summarizing, own_summarizer())
    runs = []
    for cls in (Compacting, Summarizing):
        model = ScriptedModel(
            [
                summary_step(input_tokens=40, output_tokens=5),
                text_response("done", input_tokens=9, output_tokens=2),
            ]
        )
        result, events = await go(cls(model=model), via, "go", history=chat(30))
        summary, turn = spans.named("chat")[-2:]
        assert (turn.attributes or {}).get("gen_ai.conversation.compacted") is True
        runs.append((result, events, summary.attributes or {}))
    (builtin, builtin_events, builtin_summary), (own, own_events, own_summary) = runs
    assert own.usage == builtin.usage == Usage(49, 7)
    assert own_summary == builtin_summary
    assert own_summary["littleghost.purpose"] == "context_compaction"
    if via == "stream":
        assert [type(event) for event in own_events] == [type(e) for e in builtin_events]
        assert not [event for event in own_events if isinstance(event, SideCallFinished)]
        assert reported(own_events) == reported(builtin_events) == own.usage


async def test_a_memory_providers_side_call_during_recovery_is_reported_once() -> None:
    """A memory provider's side call while overflow recovery bounds the view again is its
    own ``SideCallFinished``, not part of the ``CompactionFinished`` usage: the events
    still add up to result.usage."""

    async def memories(context: RunContext) -> list[str]:
        answer = await context.complete(ModelRequest([Message.user("Remember?")]))
        return [answer.message.text]

    budget = PromptBudget(
        prompt_budget_tokens=4_000,
        response_reserve_tokens=256,
        safety_reserve_tokens=0,
        memory=memories,
    )

    @manage_context(context_window_tokens=8_000, budget=budget, summarize=False)
    class Bounded(Agent):
        max_retries = 0

    remembered = text_response("Likes tea.", input_tokens=10, output_tokens=3)
    overflow = ContextWindowOverflowError("too long", prompt_tokens=9_000, context_window=8_000)
    done = text_response("done", input_tokens=700, output_tokens=5)
    model = ScriptedModel([remembered, overflow, remembered, remembered, done])
    history = chat(20, "long " * 50)
    result, events = await go(Bounded(model=model), "stream", "go", history=history)
    (finished,) = [event for event in events if isinstance(event, CompactionFinished)]
    assert finished.outcome == "completed" and finished.usage == Usage()
    assert reported(events) == result.usage == Usage(730, 14)


def billed_overflow(usage: Usage) -> ContextWindowOverflowError:
    """An answer stopped at the context window, as a provider raises it with its usage."""
    return ContextWindowOverflowError("the answer stopped at the window", usage=usage)


@manage_context(
    context_window_tokens=8_000,
    budget=PromptBudget(
        prompt_budget_tokens=4_000, response_reserve_tokens=256, safety_reserve_tokens=0
    ),
    summarize=False,
)
class Recovering(Agent):
    """Recovers from an overflow by its bounded view alone, never retrying a call."""

    max_retries = 0


async def test_a_billed_answer_that_overflowed_is_counted_once_everywhere(
    spans: Spans, histograms: Histograms
) -> None:
    """The usage an answer stopped at the context window was billed for reaches the run's
    usage, its ``ModelCallRetried``, its chat span and the token metric, once each."""

    done = text_response("done", input_tokens=700, output_tokens=5)
    model = ScriptedModel([billed_overflow(Usage(7_990, 10, cache_read_tokens=100)), done])
    history = chat(20, "long " * 50)
    result, events = await go(Recovering(model=model), "stream", "go", history=history)
    assert result.usage == Usage(8_690, 15, cache_read_tokens=100)
    (retried,) = [event for event in events if isinstance(event, ModelCallRetried)]
    assert retried.usage == Usage(7_990, 10, cache_read_tokens=100)
    assert reported(events) == result.usage
    failed, answered = ((span.attributes or {}) for span in spans.named("chat"))
    assert failed["gen_ai.usage.input_tokens"] == 7_990
    assert failed["gen_ai.usage.output_tokens"] == 10
    assert failed["gen_ai.usage.cache_read.input_tokens"] == 100
    assert failed["error.type"] == "context_length_exceeded"
    assert answered["gen_ai.usage.input_tokens"] == 700
    tokens = histograms.read()["gen_ai.client.token.usage"]
    counted = {str(p.attributes["gen_ai.token.type"]): 0 for p in tokens}
    for point in tokens:
        counted[str(point.attributes["gen_ai.token.type"])] += int(point.sum)
    assert counted == {"input": 8_690, "output": 15}
    # one series per token type: the conventions give the token metric no error.type
    assert len(tokens) == 2
    assert all("error.type" not in (point.attributes or {}) for point in tokens)


async def test_the_attributes_of_a_billed_failed_call_are_not_changed_once_recorded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """OpenTelemetry SDKs 1.30 to 1.39 keep the attributes a point was recorded with as its
    series': the failed call's duration keeps its ``error.type`` when its billed tokens are
    recorded without it (a changed dict exported it bare, a second series like the
    answered call's)."""
    recorded: list[tuple[Any, dict[str, Any]]] = []
    record = Histogram.record

    def keeping(self: Histogram, amount: float, attributes: Any = None, **options: Any) -> None:
        recorded.append((attributes, dict(attributes or {})))  # the dict itself, as kept
        record(self, amount, attributes, **options)

    monkeypatch.setattr(Histogram, "record", keeping)
    done = text_response("done", input_tokens=700, output_tokens=5)
    model = ScriptedModel([billed_overflow(Usage(7_990, 10)), done])
    await Recovering(model=model).run("go", history=chat(20, "long " * 50))
    assert any(seen.get("error.type") == "context_length_exceeded" for _, seen in recorded)
    assert [dict(given or {}) for given, _ in recorded] == [seen for _, seen in recorded]


async def test_a_billed_summary_call_that_overflowed_is_its_compactions_usage() -> None:
    """A summary call stopped at the context window is billed: the failed compaction's
    event reports it, so the events still add up to result.usage."""

    @compacting
    class Compacting(Agent):
        pass

    model = ScriptedModel(
        [billed_overflow(Usage(90, 1)), text_response("done", input_tokens=9, output_tokens=2)]
    )
    result, events = await go(Compacting(model=model), "stream", "go", history=chat(30))
    (finished,) = [event for event in events if isinstance(event, CompactionFinished)]
    assert finished.outcome == "error" and finished.usage == Usage(90, 1)
    assert reported(events) == result.usage == Usage(99, 3)


async def test_a_billed_side_call_that_failed_is_reported() -> None:
    """A side call stopped at the context window failed but was billed: a
    ``SideCallFinished`` with its error type reports its usage, so the events still add
    up to result.usage."""

    class Checking(Agent):
        @before_model
        async def check(self, request: ModelRequest, *, context: RunContext) -> None:
            with contextlib.suppress(ContextWindowOverflowError):
                await context.complete(ModelRequest([Message.user("safe?")], purpose="guard"))

    model = ScriptedModel(
        [billed_overflow(Usage(90, 1)), text_response("done", input_tokens=9, output_tokens=2)]
    )
    result, events = await go(Checking(model=model), "stream", "go")
    (side,) = [event for event in events if isinstance(event, SideCallFinished)]
    assert side == SideCallFinished(Usage(90, 1), "guard", "context_length_exceeded")
    assert reported(events) == result.usage == Usage(99, 3)


@pytest.mark.parametrize("report", [None, 0, "no"])
async def test_complete_refuses_a_report_that_is_not_a_bool(report: object) -> None:
    """``context.complete(report=)`` names a value that is not a bool before any call."""

    async def ask(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        await context.complete(ModelRequest([Message.user("?")]), report=report)  # type: ignore[arg-type]

    class Asking(Agent):
        pass

    add_capability(Asking, Capability("ask", [CapabilityHook("before_model", ask)]))
    model = ScriptedModel([text_response("unused")])
    with pytest.raises(TypeError, match=r"complete\(report=\) must be a bool, not"):
        await Asking(model=model).run("go")
    assert model.requests == []


class Looping(Agent):
    max_turns = 2

    @tool
    def again(self) -> str:
        """Asked for ever."""
        return "again"


@pytest.mark.parametrize("via", ["run", "stream"])
async def test_a_failed_runs_error_carries_what_the_run_used(via: str) -> None:
    """A run ended by an error (its turn limit here) was billed for its calls: the error's
    ``run_usage`` says how much, as ``result.usage`` would have; an error no run raised
    has none."""
    model = ScriptedModel([tool_call_response("again", {}, input_tokens=100, output_tokens=10)] * 3)
    with pytest.raises(LimitExceededError) as caught:
        await go(Looping(model=model), via, "go")
    assert caught.value.run_usage == Usage(200, 20)
    assert LimitExceededError("not from a run").run_usage is None


async def test_a_failed_runs_usage_is_the_run_it_ends() -> None:
    """An error from a run inside a hook ends the outer run too: its ``run_usage`` is the
    outer run's, whose caller catches it."""

    class Outer(Agent):
        @before_model
        async def ask_inner(self, request: ModelRequest) -> None:
            inner = ScriptedModel([tool_call_response("again", {}, input_tokens=7)] * 3)
            await Looping(model=inner).run("go")

    with pytest.raises(LimitExceededError) as caught:
        await Outer(model=ScriptedModel([text_response("never")])).run("go")
    assert caught.value.run_usage == Usage()


class Routing(Agent):
    """Answers through a model of its own that asks a sub-agent (a router)."""

    max_retries = 0


def tokens_counted(histograms: Histograms) -> Usage:
    """The input and output tokens the token metric counted since the last read."""
    counted = {"input": 0, "output": 0}
    for point in histograms.read().get("gen_ai.client.token.usage", []):
        counted[str(point.attributes["gen_ai.token.type"])] += int(point.sum)
    return Usage(counted["input"], counted["output"])


@pytest.mark.parametrize("seed", range(12))
async def test_a_sub_agents_failed_call_is_billed_once(
    spans: Spans, histograms: Histograms, seed: int
) -> None:
    """A provider error billed in a sub-agent's call (its ``usage``), leaving the model of
    each run that asked a sub-agent (routers nested 1 to 4 deep), is billed to that call
    alone: each router's call is billed what its own provider reported, in its span, its
    run's ``run_usage`` and the token metric, which counts every call once (the same
    error object raised again in a later run is billed again there)."""
    chooser = random.Random(seed)
    depth = chooser.randint(1, 4)
    failure = ProviderError("bad request", status=400, should_retry=False)
    failure.usage = Usage(chooser.randint(1, 900), chooser.randint(1, 90))
    own = [Usage(chooser.randint(0, 50), chooser.randint(0, 5)) for _ in range(depth)]

    def router(level: int) -> Routing:
        if level == depth:
            return Routing(model=ScriptedModel([failure]))

        async def route(request: ModelRequest) -> ModelResponse:
            report_usage(own[level])  # what this call's provider reported before
            result = await router(level + 1).run("ask the next")
            return text_response(result.output)

        return Routing(model=ScriptedModel([route]))

    for _ in range(2):
        spans.clear()
        with pytest.raises(ProviderError) as caught:
            await router(0).run("go")
        assert caught.value is failure
        assert caught.value.run_usage == own[0]
        chats = [span.attributes or {} for span in spans.named("chat")]
        shown = sorted(
            (chat.get("gen_ai.usage.input_tokens", 0), chat.get("gen_ai.usage.output_tokens", 0))
            for chat in chats
        )
        billed_calls = [*own, failure.usage]
        assert shown == sorted((u.input_tokens, u.output_tokens) for u in billed_calls)
        assert tokens_counted(histograms) == sum(billed_calls, Usage())


@pytest.mark.parametrize("transient", [RateLimitError, ProviderUnavailableError])
async def test_a_sub_agents_spent_retries_are_not_retried_by_its_router(
    transient: type[ProviderError], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A transient error a sub-agent's run gave up on (its retries spent) leaves the
    router's model as it is: the outer run does not retry the router's call, which ran
    the whole sub-agent (and its retries) again for each attempt, 4 x 4 calls with the
    defaults. An error of the router's own provider is still retried."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)  # retries at once
    inner_calls: list[int] = []

    def failing(request: ModelRequest) -> None:
        inner_calls.append(1)
        raise transient("busy")

    class Inner(Agent):
        max_retries = 2

    async def route(request: ModelRequest) -> ModelResponse:
        result = await Inner(model=ScriptedModel([failing] * 20)).run("ask")
        return text_response(result.output)

    class Router(Agent):
        max_retries = 3

    model = ScriptedModel([route] * 20)
    with pytest.raises(transient) as caught:
        await Router(model=model).run("go")
    assert str(caught.value).startswith("busy")
    assert (len(inner_calls), len(model.requests)) == (3, 1)

    own = ScriptedModel([transient("own"), text_response("ok")])
    assert (await Router(model=own).run("go")).output == "ok"
    assert len(own.requests) == 2


async def test_a_side_call_a_tools_timeout_cut_is_in_the_runs_usage(spans: Spans) -> None:
    """A side call the tool's timeout cuts after its provider reported usage was billed
    that: the run goes on, and its usage and its invoke_agent span count it (and its
    ``SideCallFinished``: ``test_every_cut_model_call_is_timed_and_its_usage_reported``);
    its chat span carries it."""

    async def slow(request: ModelRequest) -> None:
        report_usage(Usage(50, 1))
        await anyio.sleep(5)

    class Checking(Agent):
        @tool(timeout=0.2)
        async def check(self, context: RunContext) -> str:
            """Check the order."""
            await context.complete(ModelRequest([Message.user("Is it safe?")]))
            return "checked"

    called = tool_call_response("check", {}, input_tokens=10, output_tokens=2)
    model = ScriptedModel([called, slow, text_response("Done.", input_tokens=20)])
    result = await Checking(model=model).run("go")
    assert result.output == "Done."
    assert result.usage == Usage(10 + 50 + 20, 2 + 1)
    invoked = dict(spans.one("invoke_agent").attributes or {})
    assert invoked["gen_ai.usage.input_tokens"] == 80
    _, cut, _ = [dict(span.attributes or {}) for span in spans.named("chat")]
    assert (cut["gen_ai.usage.input_tokens"], cut["gen_ai.usage.output_tokens"]) == (50, 1)


@pytest.mark.parametrize("report", [True, False])
async def test_a_billed_attempt_of_a_side_call_that_was_retried_is_reported(
    report: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A side call's attempt that failed after its provider reported usage (a stream
    broken midway) was billed, then retried: a ``SideCallFinished`` with its error type
    reports it, ``report=False`` too (its caller sees the last attempt alone), so the
    events still add up to result.usage."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)  # the retry at once

    class Checking(Agent):
        @tool
        async def check(self, context: RunContext) -> str:
            """Check the order."""
            request = ModelRequest([Message.user("Is it safe?")], purpose="guard")
            response = await context.complete(request, report=report)
            assert response.usage == Usage(20, 1)  # the last attempt's
            return "checked"

    broken = ProviderUnavailableError("the stream broke", provider="scripted", usage=Usage(50, 1))
    called = tool_call_response("check", {}, input_tokens=10, output_tokens=2)
    answered = text_response("SAFE", input_tokens=20, output_tokens=1)
    model = ScriptedModel([called, broken, answered, text_response("Done.", input_tokens=5)])
    result, events = await go(Checking(model=model), "stream", "go")
    sides = [event for event in events if isinstance(event, SideCallFinished)]
    retried = SideCallFinished(Usage(50, 1), "guard", "ProviderUnavailableError")
    assert sides == [retried, SideCallFinished(Usage(20, 1), "guard")][: 2 if report else 1]
    assert result.usage == Usage(10 + 50 + 20 + 5, 2 + 1 + 1)
    if report:
        assert reported(events) == result.usage


async def test_a_billed_attempt_of_a_summary_call_that_was_retried_is_reported(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A summary call's billed attempt that was retried is reported as a side call's is
    (its compaction's event has the last attempt's usage): the events add up."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)

    @compacting
    class Compacting(Agent):
        pass

    broken = ProviderUnavailableError("the stream broke", provider="scripted", usage=Usage(50, 1))
    model = ScriptedModel([broken, summary_step(), text_response("done", input_tokens=9)])
    result, events = await go(Compacting(model=model), "stream", "go", history=chat(30))
    (side,) = [event for event in events if isinstance(event, SideCallFinished)]
    assert side == SideCallFinished(Usage(50, 1), "context_compaction", "ProviderUnavailableError")
    assert reported(events) == result.usage


async def test_a_side_call_whose_error_refuses_attributes_is_in_the_runs_usage() -> None:
    """A custom model's error of a class that refuses attributes (a frozen attrs
    exception) after its provider reported usage: the run, which goes on, counts what
    the call's span shows."""

    @attrs.frozen(auto_exc=True)
    class Refused(Exception):
        reason: str = "refused"

    async def failing(request: ModelRequest) -> None:
        report_usage(Usage(50, 1))
        raise Refused()

    class Checking(Agent):
        @tool
        async def check(self, context: RunContext) -> str:
            """Check the order."""
            with contextlib.suppress(Refused):
                await context.complete(ModelRequest([Message.user("Is it safe?")]))
            return "checked"

    called = tool_call_response("check", {}, input_tokens=10, output_tokens=2)
    model = ScriptedModel([called, failing, text_response("Done.", input_tokens=20)])
    result = await Checking(model=model).run("go")
    assert result.usage == Usage(10 + 50 + 20, 2 + 1)


REPORTED = Usage(50, 1)
"""What a cut call's provider reported before the cut (as Anthropic's stream starts)."""

CUT_KINDS = {
    "the run's deadline": "DeadlineExceededError",
    "the caller's cancellation": "cancelled",
    "a stream left": "cancelled",
    "a tool's timeout": "cancelled",
    "a hook's own scope": "cancelled",
    "a strategy's own scope": "cancelled",
}
"""What can cut a model call, and the ``error.type`` the duration metric gives it."""


class Plain(Agent):
    pass


class Guarding(Agent):
    @tool(timeout=0.1)
    async def check(self, context: RunContext) -> str:
        """Check the order with a side call, within 0.1 s."""
        request = ModelRequest([Message.user("Is it safe?")], purpose="guard")
        await context.complete(request)
        return "checked"


def cutting(scope: anyio.CancelScope | None) -> Callable[[ModelRequest], Awaitable[None]]:
    """A script step that reports ``REPORTED``, cancels ``scope`` (else waits to be cut)."""

    async def cut(request: ModelRequest) -> None:
        report_usage(REPORTED)
        if scope is not None:
            scope.cancel()
        await anyio.sleep(5)
        raise AssertionError("the call was not cut")

    return cut


def cut_call_agent(how: str, scope: anyio.CancelScope) -> tuple[Agent, Usage]:
    """An agent one of whose model calls ``how`` cuts (``scope``: the cancel scope it
    cancels), and the usage of its other calls."""
    done = text_response("Done.", input_tokens=20, output_tokens=2)
    cut = cutting(None if how in ("the run's deadline", "a tool's timeout") else scope)
    if how == "a tool's timeout":
        called = tool_call_response("check", {}, input_tokens=10, output_tokens=1)
        return Guarding(model=ScriptedModel([called, cut, done])), Usage(30, 3)
    if how == "a hook's own scope":

        class Guarded(Agent):
            @before_model
            async def check(self, request: ModelRequest, *, context: RunContext) -> None:
                with scope:  # the guard gives up on its check: the run goes on
                    checking = ModelRequest([Message.user("Is it safe?")], purpose="guard")
                    await context.complete(checking)

        return Guarded(model=ScriptedModel([cut, done])), Usage(20, 2)
    if how == "a strategy's own scope":

        class Bounded:
            async def compact(self, state: CompactionState, /) -> None:
                assert state.complete is not None
                with scope:
                    await state.complete(ModelRequest([Message.user("Summarize.")]))
                await Truncation(minimum_preserved=4).compact(state)

        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.5,
            tokenizer=PerMessage(),
            strategy=Bounded(),
        )
        class Compacting(Agent):
            pass

        return Compacting(model=ScriptedModel([cut, done])), Usage(20, 2)
    if how == "a stream left":
        return Plain(model=ScriptedModel([streamed(REPORTED, "Hel", "lo")])), Usage()
    return Plain(model=ScriptedModel([cut])), Usage()


@pytest.mark.parametrize("how", list(CUT_KINDS))
async def test_every_cut_model_call_is_timed_and_its_usage_reported(
    how: str, histograms: Histograms
) -> None:
    """A model call cut after its provider reported usage, whatever cut it, is in
    gen_ai.client.operation.duration with its error.type (``DeadlineExceededError`` for
    the run's deadline, ``cancelled`` for a cancellation); where the run goes on, its
    events' usages add up to result.usage (a side call's ``SideCallFinished`` says it
    was cancelled, before the event that follows the cut)."""
    scope = anyio.CancelScope()
    agent, others = cut_call_agent(how, scope)
    events: list[Event] = []
    result: RunResult[Any] | None = None
    with contextlib.ExitStack() as stack:
        if how == "the caller's cancellation":
            stack.enter_context(scope)
        if how == "the run's deadline":
            stack.enter_context(pytest.raises(DeadlineExceededError))
        timeout = 0.2 if how == "the run's deadline" else None
        history = chat(30) if how == "a strategy's own scope" else None
        async with agent.stream("go", history=history, timeout=timeout) as stream:
            async for event in stream:
                events.append(event)
                if how == "a stream left" and isinstance(event, TextDelta):
                    break
            else:
                result = stream.result
    timed = histograms.read()["gen_ai.client.operation.duration"]
    cut = [
        (dict(point.attributes or {})["error.type"], point.count)
        for point in timed
        if "error.type" in dict(point.attributes or {})
    ]
    assert cut == [(CUT_KINDS[how], 1)]
    goes_on = how in ("a tool's timeout", "a hook's own scope", "a strategy's own scope")
    assert (result is not None) is goes_on
    if result is not None:
        assert result.usage == REPORTED + others
        assert reported(events) == result.usage
    if how in ("a tool's timeout", "a hook's own scope"):
        side = events.index(SideCallFinished(REPORTED, "guard", "cancelled"))
        follows = ToolCallFinished if how == "a tool's timeout" else TextDelta
        assert isinstance(events[side + 1], follows)


async def test_a_side_calls_retry_wait_a_tools_timeout_cut_is_reported_once() -> None:
    """A side call whose billed attempt failed and whose retry wait the tool's timeout
    cuts: the attempt's ``SideCallFinished`` came before the wait, no call was in flight
    at the cut (nothing more to report), and the events add up to result.usage."""

    class Checking(Agent):
        @tool(timeout=0.2)
        async def check(self, context: RunContext) -> str:
            """Check the order."""
            request = ModelRequest([Message.user("Is it safe?")], purpose="guard")
            await context.complete(request)
            return "checked"

    limited = RateLimitError("slow down", retry_after=5, usage=REPORTED)
    called = tool_call_response("check", {}, input_tokens=10, output_tokens=1)
    done = text_response("Done.", input_tokens=20, output_tokens=2)
    model = ScriptedModel([called, limited, done])
    result, events = await go(Checking(model=model), "stream", "go")
    assert result.usage == REPORTED + Usage(30, 3) == reported(events)
    sides = [event for event in events if isinstance(event, SideCallFinished)]
    assert sides == [SideCallFinished(REPORTED, "guard", "RateLimitError")]
    (finished,) = [event for event in events if isinstance(event, ToolCallFinished)]
    assert finished.result.is_error


@pytest.mark.parametrize("retried", [True, False])
async def test_a_side_call_whose_client_turned_its_cut_into_an_error_is_reported(
    retried: bool,
) -> None:
    """A side call the tool's timeout cuts, whose client turns the cancellation into an
    error of its own ("connection closed"), retryable or not: its ``SideCallFinished``
    (that error's type) is held, not awaited under the cancellation, where it was lost,
    and told before the tool's ``ToolCallFinished``; the events add up to
    result.usage."""
    closed: Exception = (
        ProviderUnavailableError("connection closed", provider="scripted")
        if retried
        else ProtocolError("connection closed")
    )

    async def closing(request: ModelRequest) -> None:
        report_usage(REPORTED)
        try:
            await anyio.sleep(5)
        except anyio.get_cancelled_exc_class():
            raise closed from None

    called = tool_call_response("check", {}, input_tokens=10, output_tokens=1)
    done = text_response("Done.", input_tokens=20, output_tokens=2)
    model = ScriptedModel([called, closing, done])
    result, events = await go(Guarding(model=model), "stream", "go")
    assert result.usage == REPORTED + Usage(30, 3) == reported(events)
    side = events.index(SideCallFinished(REPORTED, "guard", type(closed).__name__))
    assert isinstance(events[side + 1], ToolCallFinished)
    assert events[side + 1].result.is_error  # stopped at its timeout


@pytest.mark.parametrize("via", ["run", "stream"])
async def test_a_context_kept_past_its_run_makes_no_side_call(via: str) -> None:
    """A side call after the run ended would be billed and counted nowhere (the run's
    usage, span and stream are over): it is refused before the model is called, as an
    append is."""
    kept: list[RunContext] = []

    class Keeping(Agent):
        @before_model
        def keep(self, request: ModelRequest, context: RunContext) -> None:
            kept.append(context)

    model = ScriptedModel([text_response("Hi."), text_response("late", input_tokens=9)])
    if via == "run":
        await Keeping(model=model).run("Hello")
    else:
        async with Keeping(model=model).stream("Hello") as events:
            async for _ in events:
                pass
    with pytest.raises(ConfigurationError, match=r"context.complete\(\): the run .* has ended"):
        await kept[0].complete(ModelRequest([Message.user("late")]))
    assert model.remaining == 1  # the model was not called
    assert kept[0].usage == Usage()


@pytest.mark.parametrize("via", ["run", "stream"])
async def test_a_context_kept_past_its_run_takes_no_usage_or_annotation(via: str) -> None:
    """``add_usage`` on a context kept past its run (an embedding call's figures, say)
    changed ``context.usage`` alone, after the run had told its usage: the figures were
    lost without a word. It is refused, as are ``annotate_next_call`` and
    ``mark_compacted`` (no call comes to take them) and ``emit`` (the stream is over),
    as ``complete`` and ``append`` are; the run's result keeps what it told."""
    kept: list[RunContext] = []

    class Keeping(Agent):
        @before_model
        def keep(self, request: ModelRequest, context: RunContext) -> None:
            context.add_usage(Usage(3, 0))
            kept.append(context)

    model = ScriptedModel([text_response("Hi.", input_tokens=5)])
    if via == "run":
        result = await Keeping(model=model).run("Hello")
    else:
        async with Keeping(model=model).stream("Hello") as events:
            async for _ in events:
                pass
        result = events.result
    context = kept[0]
    ended = "the run of this context has ended"
    with pytest.raises(ConfigurationError, match=rf"context.add_usage\(\): {ended}"):
        context.add_usage(Usage(7, 1))
    with pytest.raises(ConfigurationError, match=rf"context.annotate_next_call\(\): {ended}"):
        context.annotate_next_call({"app.figure": 1})
    with pytest.raises(ConfigurationError, match=rf"context.mark_compacted\(\): {ended}"):
        context.mark_compacted()
    with pytest.raises(ConfigurationError, match=rf"context.emit\(\): {ended}"):
        await context.emit(SideCallFinished(Usage(7, 1), "embedding"))  # streamed: a bare
        # ClosedResourceError
    with pytest.raises(TypeError):  # bad input is told first, as during the run
        context.add_usage(7)  # type: ignore[arg-type]
    assert result.usage == context.usage == Usage(8, 0)


@pytest.mark.parametrize("via", ["run", "stream"])
async def test_a_side_call_that_outlives_its_run_answers_its_caller(via: str) -> None:
    """A side call started in a task of the caller's (outside the run's scope) that
    ends after the run is counted without an error: its caller gets its answer (its
    ``SideCallFinished`` reaches nobody: the stream is over), and the run's result keeps
    the usage it told."""
    kept: list[RunContext] = []
    answered: list[str] = []
    release = anyio.Event()

    class Keeping(Agent):
        @before_model
        def keep(self, request: ModelRequest, context: RunContext) -> None:
            kept.append(context)

    async def late(request: ModelRequest) -> ModelResponse:
        await release.wait()
        return text_response("late", input_tokens=9)

    checker = ScriptedModel([late])

    async def side_call(task_status: anyio.abc.TaskStatus[None]) -> None:
        task_status.started()
        asking = ModelRequest([Message.user("check")])
        response = await kept[0].complete(asking, model=checker)
        answered.append(response.message.text)

    class Starting(Keeping):
        @before_model
        async def start(self, request: ModelRequest, context: RunContext) -> None:
            if not checker.requests:  # once
                await group.start(side_call)

    model = ScriptedModel([text_response("Hi.", input_tokens=5)])
    async with anyio.create_task_group() as group:
        if via == "run":
            result = await Starting(model=model).run("Hello")
        else:
            async with Starting(model=model).stream("Hello") as events:
                async for _ in events:
                    pass
            result = events.result
        release.set()
    assert answered == ["late"]
    assert result.usage == Usage(5, 0)


@pytest.mark.parametrize(
    ("request_", "model", "said"),
    [
        ("Is this safe?", None, r"context.complete\(\) takes a ModelRequest.*not str"),
        ([Message.user("safe?")], None, r"context.complete\(\) takes a ModelRequest.*not list"),
        (
            ModelRequest([Message.user("safe?")]),
            "openai:gpt-4o-mini",
            r"context.complete\(model=\) takes a Model instance.*not 'openai:gpt-4o-mini'",
        ),
    ],
    ids=["text", "messages", "model string"],
)
async def test_a_side_call_of_the_wrong_kind_says_what_it_takes(
    request_: object, model: object, said: str
) -> None:
    """A request that is not a ``ModelRequest``, or a model string for ``model=``, is a
    ``TypeError`` naming what ``complete()`` takes, not an ``AttributeError`` from inside."""

    class Checking(Agent):
        @before_model
        async def check(self, request: ModelRequest, context: RunContext) -> None:
            await context.complete(request_, model=model)  # type: ignore[arg-type]

    with pytest.raises(TypeError, match=said):
        await Checking(model=ScriptedModel([text_response("never")])).run("hi")


async def test_each_model_a_side_call_is_given_is_prepared_once() -> None:
    """A model made for each side call (``model=Judge()`` inline) is prepared before its
    call, though it may take the place in memory of one the run prepared and dropped."""
    prepared: list[int] = []

    class Judge:
        provider = "judge"
        name = "judge"
        context_window = None

        def __init__(self) -> None:
            self.ready = False

        async def prepare(self) -> None:
            self.ready = True
            prepared.append(id(self))

        async def respond(self, request: ModelRequest) -> ModelResponse:
            assert self.ready, "called before prepare()"
            return text_response("SAFE")

    class Judged(Agent):
        @before_model
        async def check(self, request: ModelRequest, context: RunContext) -> None:
            judge = Judge()
            for _ in range(3):
                await context.complete(ModelRequest([Message.user("safe?")]), model=judge)
            for _ in range(50):
                await context.complete(ModelRequest([Message.user("safe?")]), model=Judge())
                gc.collect()  # the judge is gone: the next one may get its id

    result = await Judged(model=ScriptedModel([text_response("Hi.")])).run("Hello")
    assert result.output == "Hi."
    assert len(prepared) == 51
