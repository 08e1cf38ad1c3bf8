"""Tracing: span names, nesting, GenAI attributes, failures, cancellation, content policy."""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import pkgutil
import random
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Literal

import anyio
import attrs
import pytest
from opentelemetry import trace
from opentelemetry.sdk.metrics.export import HistogramDataPoint
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

import littleghost
from littleghost import (
    Agent,
    ImagePart,
    Message,
    ReasoningPart,
    RunContext,
    TextPart,
    before_model,
    tool,
)
from littleghost.errors import (
    ConfigurationError,
    ContextWindowOverflowError,
    DeadlineExceededError,
    InvalidRequestError,
    LimitExceededError,
    OutputLimitError,
    ProtocolError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.events import TextDelta
from littleghost.models import ModelRequest, ModelResponse, StopReason, Usage, report_usage
from littleghost.models.streaming import StreamDone, TextChunk, ToolCallChunk
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import ScriptedModel, streamed, text_response, tool_call_response

if TYPE_CHECKING:
    from conftest import Histograms, Spans

pytestmark = pytest.mark.anyio

SECRET = "S3CR3T-MARKER"


class Support(Agent):
    instructions = f"Instructions mentioning {SECRET}."
    settings = {"max_tokens": 50, "temperature": 0.3}

    @tool
    async def lookup(self, order_id: str) -> str:
        """Find an order."""
        return f"order {order_id} contains {SECRET}"

    @tool
    async def stall(self) -> str:
        """Never finishes."""
        await anyio.sleep_forever()
        return ""

    @tool
    async def explode(self, reason: str) -> str:
        """Always fails."""
        raise RuntimeError(f"failed because {reason}")


@attrs.frozen
class Order:
    order_id: str


def two_turns() -> ScriptedModel:
    """A model that calls lookup, then answers."""
    return ScriptedModel(
        [
            tool_call_response(
                "lookup",
                {"order_id": f"42-{SECRET}"},
                call_id="c1",
                input_tokens=10,
                output_tokens=5,
            ),
            text_response(f"Your order has {SECRET}.", input_tokens=20, output_tokens=7),
        ]
    )


def attributes(span: ReadableSpan) -> dict[str, Any]:
    """A span's attributes as a plain dict."""
    return dict(span.attributes or {})


async def test_span_names_and_nesting(spans: Spans) -> None:
    """One invoke_agent span, with the chat and execute_tool spans as its children."""
    await Support(model=two_turns()).run("Where is my order?")
    root = spans.one("invoke_agent")
    assert root.name == "invoke_agent Support"
    chats = spans.named("chat ")
    assert [span.name for span in chats] == ["chat scripted", "chat scripted"]
    tool_span = spans.one("execute_tool")
    assert tool_span.name == "execute_tool lookup"
    assert root.parent is None
    assert root.context is not None
    for child in [*chats, tool_span]:
        assert child.parent is not None
        assert child.parent.span_id == root.context.span_id
        assert child.context is not None
        assert child.context.trace_id == root.context.trace_id


async def test_each_model_call_is_in_the_genai_client_metrics(histograms: Histograms) -> None:
    """gen_ai.client.operation.duration (seconds) and gen_ai.client.token.usage (input and
    output tokens) per model call, with the conventions' attributes and no content; a
    failed call has its error.type and no token usage."""
    result = await Support(model=two_turns()).run("Where is my order?")
    base = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "scripted",
    }
    recorded = histograms.read()
    (duration,) = recorded["gen_ai.client.operation.duration"]
    assert dict(duration.attributes or {}) == base
    assert duration.count == 2 and 0 <= duration.sum < 5
    tokens = {
        dict(point.attributes or {})["gen_ai.token.type"]: point
        for point in recorded["gen_ai.client.token.usage"]
    }
    assert tokens["input"].sum == result.usage.input_tokens == 30
    assert tokens["output"].sum == result.usage.output_tokens == 12
    assert tokens["input"].count == tokens["output"].count == 2
    assert dict(tokens["input"].attributes or {}) == {**base, "gen_ai.token.type": "input"}
    assert SECRET not in repr(duration) + repr(tokens)

    failing = ScriptedModel([ProviderUnavailableError("down", provider="scripted")])
    with pytest.raises(ProviderUnavailableError):
        await Support(model=failing, max_retries=0).run("Where is my order?")
    recorded = histograms.read()
    (failed,) = recorded["gen_ai.client.operation.duration"]
    assert dict(failed.attributes or {}) == {**base, "error.type": "ProviderUnavailableError"}
    assert recorded.get("gen_ai.client.token.usage", []) == []


async def test_a_call_cut_by_the_run_deadline_is_in_the_duration_metric(
    histograms: Histograms,
) -> None:
    """A call the run's deadline cuts timed out: it is in gen_ai.client.operation.duration
    with error.type DeadlineExceededError (the slowest calls are not left out); a call a
    caller's cancellation stops is there with error.type ``cancelled``, apart from the
    calls that answered."""

    async def slow(request: ModelRequest) -> ModelResponse:
        await anyio.sleep(5)
        return text_response("late")

    with pytest.raises(DeadlineExceededError):
        await Support(model=ScriptedModel([slow])).run("hello", timeout=0.4)
    (cut,) = histograms.read()["gen_ai.client.operation.duration"]
    assert dict(cut.attributes or {})["error.type"] == "DeadlineExceededError"
    # timed to the cut (the deadline counts from the run's start, the call a little later)
    assert cut.count == 1 and cut.sum >= 0.2

    with anyio.move_on_after(0.2):
        await Support(model=ScriptedModel([slow])).run("hello", timeout=30)
    (stopped,) = histograms.read()["gen_ai.client.operation.duration"]
    assert dict(stopped.attributes or {})["error.type"] == "cancelled"
    assert stopped.count == 1 and stopped.sum >= 0.1


@pytest.mark.parametrize(
    "how", ["the run's deadline", "the caller's cancel scope", "a stream left"]
)
async def test_usage_reported_before_a_call_was_cut_is_billed(
    how: str, spans: Spans, histograms: Histograms
) -> None:
    """A model call cut after its provider reported usage (``report_usage``: Anthropic's
    prompt tokens as its stream starts) was billed that, whatever cut it: its chat span,
    the invoke_agent span, the token metric and the deadline's ``run_usage`` count what
    was reported, and nothing more (no estimate); the duration metric has it with its
    error.type (``cancelled`` when it was cancelled, not timed out)."""
    reported = Usage(50, 1)

    async def slow(request: ModelRequest) -> ModelResponse:
        report_usage(reported)
        await anyio.sleep(5)
        raise AssertionError("the call was not cut")

    if how == "the run's deadline":
        with pytest.raises(DeadlineExceededError) as caught:
            await Support(model=ScriptedModel([slow])).run("hello", timeout=0.2)
        assert caught.value.run_usage == reported
    elif how == "the caller's cancel scope":
        with anyio.move_on_after(0.2):
            await Support(model=ScriptedModel([slow])).run("hello")
    else:  # the consumer leaves at the first piece of text
        model = ScriptedModel([streamed(reported, "Hel", "lo")])
        async with Support(model=model).stream("hello") as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    break
    counts = {"gen_ai.usage.input_tokens": 50, "gen_ai.usage.output_tokens": 1}
    for name in ("chat", "invoke_agent"):
        shown = attributes(spans.one(name))
        assert {key: shown.get(key) for key in counts} == counts
    assert attributes(spans.one("chat"))["gen_ai.response.finish_reasons"] == ("error",)
    recorded = histograms.read()
    tokens = {
        dict(point.attributes or {})["gen_ai.token.type"]: (point.count, point.sum)
        for point in recorded["gen_ai.client.token.usage"]
    }
    assert tokens == {"input": (1, 50), "output": (1, 1)}
    (timed,) = recorded["gen_ai.client.operation.duration"]
    cut = "DeadlineExceededError" if how == "the run's deadline" else "cancelled"
    assert dict(timed.attributes or {})["error.type"] == cut


def test_report_usage_takes_a_usage() -> None:
    with pytest.raises(TypeError, match=r"report_usage: usage must be a Usage, not dict"):
        report_usage({"input_tokens": 50})  # type: ignore[arg-type]
    report_usage(Usage(50))  # outside a model call: nothing to tell


async def test_token_usage_a_model_did_not_report_is_not_recorded(
    histograms: Histograms,
) -> None:
    """A call whose model reported no usage (a custom model, a server that streams without
    it) is in gen_ai.client.operation.duration but not in gen_ai.client.token.usage: the
    conventions record no usage that is not available, rather than 0 tokens."""
    unreported = ModelResponse(Message.assistant("Hi."))
    await Support(model=ScriptedModel([unreported])).run("hello")
    recorded = histograms.read()
    assert len(recorded["gen_ai.client.operation.duration"]) == 1
    assert recorded.get("gen_ai.client.token.usage", []) == []


async def test_usage_a_model_did_not_report_is_left_off_the_spans(spans: Spans) -> None:
    """A count the model did not report (0: ``Usage`` cannot tell it from none) is left off
    the chat and invoke_agent spans, as the token metric leaves it, rather than shown as
    a call that cost 0 tokens; a count it reported is there."""
    unreported = ModelResponse(Message.assistant("Hi."))
    output_only = ModelResponse(Message.assistant("Hi."), usage=Usage(0, 4))
    for response in (unreported, output_only):
        spans.clear()
        await Support(model=ScriptedModel([response])).run("hello")
        for name in ("chat", "invoke_agent"):
            shown = attributes(spans.one(name))
            assert "gen_ai.usage.input_tokens" not in shown
            assert shown.get("gen_ai.usage.output_tokens") == (
                None if response is unreported else 4
            )


async def test_a_sub_agents_call_cut_by_the_outer_runs_deadline_is_in_the_duration_metric(
    histograms: Histograms,
) -> None:
    """A sub-agent's call that the deadline of the run it serves cuts timed out too: it
    is in gen_ai.client.operation.duration with error.type DeadlineExceededError."""

    async def slow(request: ModelRequest) -> ModelResponse:
        await anyio.sleep(5)
        return text_response("late")

    class Outer(Agent):
        @tool
        async def ask(self) -> str:
            """Ask a sub-agent."""
            return (await Support(model=ScriptedModel([slow])).run("?")).output

    model = ScriptedModel([tool_call_response("ask", {}), text_response("done")])
    with pytest.raises(DeadlineExceededError):
        await Outer(model=model).run("hello", timeout=0.2)
    kinds = [
        dict(point.attributes or {}).get("error.type")
        for point in histograms.read()["gen_ai.client.operation.duration"]
    ]
    assert sorted(kinds, key=str) == ["DeadlineExceededError", None]


AGENT_METRICS = ("gen_ai.invoke_agent.duration", "gen_ai.execute_tool.duration")


def seconds(span: ReadableSpan) -> float:
    """A span's duration in seconds."""
    assert span.start_time is not None and span.end_time is not None
    return (span.end_time - span.start_time) / 1e9


def timed_like_spans(
    spans: Spans, recorded: dict[str, list[HistogramDataPoint]]
) -> list[dict[str, Any]]:
    """The attributes of each point of the agent duration metrics ``recorded``, after
    checking that each is one value with the client duration metric's buckets, and that
    the values of each operation, agent and tool are its spans' durations (within a
    millisecond)."""
    points = [point for name in AGENT_METRICS for point in recorded.get(name, [])]
    by_key: dict[str, tuple[list[float], list[float]]] = {}
    for point in points:
        shown = dict(point.attributes or {})
        assert point.count == 1
        assert tuple(point.explicit_bounds) == tuple(0.01 * 2**power for power in range(14))
        agent = shown["gen_ai.agent.name"]
        key = f"{shown['gen_ai.operation.name']} {shown.get('gen_ai.tool.name', agent)}/{agent}"
        by_key.setdefault(key, ([], []))[0].append(point.sum)
    for span in spans.all():
        if span.name.startswith(("invoke_agent", "execute_tool")):
            key = f"{span.name}/{attributes(span)['gen_ai.agent.name']}"
            by_key.setdefault(key, ([], []))[1].append(seconds(span))
    for key, (values, durations) in by_key.items():
        assert len(values) == len(durations), key
        for value, duration in zip(sorted(values), sorted(durations), strict=True):
            assert abs(value - duration) < 1e-3, (key, value, duration)
    return [dict(point.attributes or {}) for point in points]


async def test_each_run_and_tool_call_is_in_the_agent_duration_metrics(
    spans: Spans, histograms: Histograms
) -> None:
    """gen_ai.invoke_agent.duration (one value per run) and gen_ai.execute_tool.duration
    (one per tool call), each its span's duration, with the conventions' few attributes:
    no session id, call id, argument or result."""
    session_id = f"conv-{uuid.uuid4().hex}"
    await Support(model=two_turns()).run("Where is my order?", session_id=session_id)
    recorded = timed_like_spans(spans, histograms.read())
    assert recorded == [
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "Support",
            "gen_ai.provider.name": "scripted",
            "gen_ai.request.model": "scripted",
        },
        {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "lookup",
            "gen_ai.tool.type": "function",
            "gen_ai.agent.name": "Support",
        },
    ]
    assert SECRET not in repr(recorded) and session_id not in repr(recorded)


@pytest.mark.parametrize("capture_content", [False, True])
async def test_an_undeclared_tools_duration_metric_has_no_text_of_the_models(
    spans: Spans, histograms: Histograms, capture_content: bool
) -> None:
    """A call of a tool the agent does not declare is in gen_ai.execute_tool.duration as
    ``undeclared`` with error.type ``unknown_tool``, capture_content or not: a metric
    never carries the name the model made up (which the span has when capturing)."""
    model = ScriptedModel([tool_call_response(f"leak_{SECRET}", {}), text_response("ok")])
    await Support(model=model, capture_content=capture_content).run("hello")
    tool_span = spans.one("execute_tool")
    assert (SECRET in tool_span.name) is capture_content
    recorded = histograms.read()
    (point,) = recorded["gen_ai.execute_tool.duration"]
    assert dict(point.attributes or {}) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "undeclared",
        "gen_ai.tool.type": "function",
        "gen_ai.agent.name": "Support",
        "error.type": "unknown_tool",
    }
    assert point.count == 1 and abs(point.sum - seconds(tool_span)) < 1e-3


class Bounded(Support):
    @tool(timeout=0.2)
    async def wait(self) -> str:
        """Never finishes in time."""
        await anyio.sleep_forever()
        return ""


@pytest.mark.parametrize(
    ("how", "run_type", "tool_type"),
    [
        ("a failed run", "ProviderUnavailableError", None),
        ("a failing tool", None, "RuntimeError"),
        ("the run's deadline", "DeadlineExceededError", "DeadlineExceededError"),
        ("the caller's cancellation", "cancelled", "cancelled"),
        ("a tool's timeout", None, "timeout"),
    ],
)
async def test_an_ended_run_or_tool_call_is_in_the_agent_duration_metrics(
    spans: Spans,
    histograms: Histograms,
    how: str,
    run_type: str | None,
    tool_type: str | None,
) -> None:
    """A run or tool call that failed, or was cut, is in its duration metric once, timed
    to its end, with error.type as gen_ai.client.operation.duration has it: the span's,
    DeadlineExceededError for the run's deadline, ``cancelled`` for the caller's
    cancellation (the spans stay UNSET), ``timeout`` for a tool's own timeout."""
    if how == "a failed run":
        failing = ScriptedModel([ProviderUnavailableError("down", provider="scripted")])
        with pytest.raises(ProviderUnavailableError):
            await Bounded(model=failing, max_retries=0).run("hi")
    else:
        called = {
            "a failing tool": tool_call_response("explode", {"reason": SECRET}),
            "a tool's timeout": tool_call_response("wait", {}),
        }.get(how, tool_call_response("stall", {}))
        agent = Bounded(model=ScriptedModel([called, text_response("done")]))
        if how == "the run's deadline":
            with pytest.raises(DeadlineExceededError):
                await agent.run("hi", timeout=0.3)
        elif how == "the caller's cancellation":
            with anyio.move_on_after(0.3) as scope:
                await agent.run("hi")
            assert scope.cancelled_caught
            assert spans.one("invoke_agent").status.status_code is StatusCode.UNSET
        else:
            await agent.run("hi")
    recorded = timed_like_spans(spans, histograms.read())
    kinds = {point["gen_ai.operation.name"]: point.get("error.type") for point in recorded}
    expected = {"invoke_agent": run_type}
    if how != "a failed run":
        expected["execute_tool"] = tool_type
    assert kinds == expected
    assert SECRET not in repr(recorded)


async def test_a_streamed_run_is_in_the_agent_duration_metrics(
    spans: Spans, histograms: Histograms
) -> None:
    """A run of ``stream()`` is timed as one of ``run()``; one its consumer leaves is
    ``cancelled``, as its cut model call is in gen_ai.client.operation.duration."""
    async with Support(model=two_turns()).stream("Where is my order?") as events:
        async for _ in events:
            pass
    assert [point.get("error.type") for point in timed_like_spans(spans, histograms.read())] == [
        None,
        None,
    ]
    spans.clear()
    model = ScriptedModel([streamed("Hel", "lo")])
    async with Support(model=model).stream("hello") as events:
        async for event in events:
            if isinstance(event, TextDelta):
                break
    (left,) = timed_like_spans(spans, histograms.read())
    assert left["gen_ai.operation.name"] == "invoke_agent"
    assert left["error.type"] == "cancelled"


def test_a_run_sync_is_in_the_agent_duration_metrics(spans: Spans, histograms: Histograms) -> None:
    """``run_sync()`` alike: one value for the run, one for its tool call."""
    Support(model=two_turns()).run_sync("Where is my order?")
    recorded = timed_like_spans(spans, histograms.read())
    assert [point["gen_ai.operation.name"] for point in recorded] == [
        "invoke_agent",
        "execute_tool",
    ]


async def test_a_sub_agents_run_is_in_the_agent_duration_metrics(
    spans: Spans, histograms: Histograms
) -> None:
    """A sub-agent run from a tool is a run of its own in gen_ai.invoke_agent.duration;
    one its tool's timeout cut is ``cancelled`` there, as its model call is in
    gen_ai.client.operation.duration, and the tool ``timeout``."""

    class Outer(Agent):
        @tool
        async def ask(self) -> str:
            """Ask a sub-agent."""
            return (await Support(model=ScriptedModel([text_response("yes")])).run("?")).output

        @tool(timeout=0.2)
        async def ask_slowly(self) -> str:
            """Ask a sub-agent that does not answer in time."""
            return (await Support(model=ScriptedModel([hang])).run("?")).output

    script = [tool_call_response("ask", {}), tool_call_response("ask_slowly", {})]
    await Outer(model=ScriptedModel([*script, text_response("done")])).run("hello")
    read = histograms.read()
    calls = [
        (dict(point.attributes or {}).get("error.type"), point.count)
        for point in read["gen_ai.client.operation.duration"]
    ]
    assert sorted(calls, key=str) == [("cancelled", 1), (None, 4)]
    recorded = timed_like_spans(spans, read)
    ended = sorted(
        (
            point["gen_ai.operation.name"],
            point["gen_ai.agent.name"],
            point.get("gen_ai.tool.name", ""),
            point.get("error.type", ""),
        )
        for point in recorded
    )
    assert ended == [
        ("execute_tool", "Outer", "ask", ""),
        ("execute_tool", "Outer", "ask_slowly", "timeout"),
        ("invoke_agent", "Outer", "", ""),
        ("invoke_agent", "Support", "", ""),
        ("invoke_agent", "Support", "", "cancelled"),
    ]


async def test_invoke_agent_attributes(spans: Spans) -> None:
    """invoke_agent carries the operation, agent, provider, model, usage and finish reason."""
    session_id = f"conv-{uuid.uuid4().hex}"
    await Support(model=two_turns()).run("Where is my order?", session_id=session_id)
    assert attributes(spans.one("invoke_agent")) == {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "Support",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "scripted",
        "gen_ai.conversation.id": session_id,
        "gen_ai.request.max_tokens": 50,
        "gen_ai.request.temperature": 0.3,
        "gen_ai.usage.input_tokens": 30,
        "gen_ai.usage.output_tokens": 12,
        "gen_ai.response.finish_reasons": ("stop",),
    }


@pytest.mark.parametrize("strategy", ["native", "tool"])
async def test_invoke_agent_has_its_seed_and_output_type_from_its_start(
    spans: Spans, strategy: Literal["native", "tool"]
) -> None:
    """The conventions' conditionally required gen_ai.request.seed and gen_ai.output.type
    are on invoke_agent from its start when the run asks for a seed and a typed output,
    however the model is asked for it."""
    found = {"order_id": "42"}
    native = strategy == "native"
    step = text_response(json.dumps(found)) if native else tool_call_response("final_result", found)
    agent = Support(model=ScriptedModel([step]), output_strategy=strategy)
    await agent.run("Which order?", settings={"seed": 7}, output_type=Order)
    started = spans.at_start(spans.one("invoke_agent"))
    assert started["gen_ai.request.seed"] == 7
    assert started["gen_ai.output.type"] == "json"


@pytest.mark.parametrize("via", ["run", "stream"])
@pytest.mark.parametrize("text", ["", " \n ", "ok", " ok ", "0"])
@pytest.mark.parametrize("typed", [False, True], ids=["text", "typed"])
async def test_a_free_text_run_ending_with_no_text_is_marked_on_invoke_agent(
    spans: Spans, via: str, text: str, typed: bool
) -> None:
    """A free-text run whose final answer has no text (whitespace at most) returns it as
    it is, marked ``littleghost.output.empty`` on ``invoke_agent`` (a typed run gets a
    repair turn instead): never the text itself."""
    steps = [text_response(text)]
    if typed:
        steps.append(text_response(json.dumps({"order_id": "42"})))
    model = ScriptedModel(steps)
    options: dict[str, Any] = {"output_type": Order} if typed else {}
    if via == "run":
        result = await Support(model=model).run("Which order?", **options)
    else:
        async with Support(model=model).stream("Which order?", **options) as events:
            async for _ in events:
                pass
        result = events.result
    assert result.output == (Order("42") if typed else text)  # no text fits no Order: repaired
    assert len(model.requests) == (2 if typed else 1)
    attributes = dict(spans.one("invoke_agent").attributes or {})
    empty = not typed and not text.strip()
    assert attributes.get("littleghost.output.empty") is (True if empty else None)


@pytest.mark.parametrize("via", ["run", "stream"])
async def test_invoke_agent_has_its_provider_and_model_from_its_start(
    spans: Spans, via: str
) -> None:
    """A sampler sees the provider and model of invoke_agent, as of chat: the GenAI
    conventions ask for them when the span is created."""
    agent = Support(model=two_turns())
    if via == "run":
        await agent.run("Where is my order?")
    else:
        async with agent.stream("Where is my order?") as events:
            async for _ in events:
                pass
    for span in (spans.one("invoke_agent"), spans.named("chat ")[0]):
        assert {
            key: value
            for key, value in spans.at_start(span).items()
            if key in ("gen_ai.provider.name", "gen_ai.request.model")
        } == {"gen_ai.provider.name": "scripted", "gen_ai.request.model": "scripted"}


async def test_chat_attributes(spans: Spans) -> None:
    """Each chat span carries its request settings, usage and finish reason."""
    await Support(model=two_turns()).run("Where is my order?")
    first, second = spans.named("chat ")
    assert first.kind is SpanKind.CLIENT
    assert attributes(first) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "scripted",
        "gen_ai.request.max_tokens": 50,
        "gen_ai.request.temperature": 0.3,
        "littleghost.purpose": "chat",
        "gen_ai.usage.input_tokens": 10,
        "gen_ai.usage.output_tokens": 5,
        "gen_ai.response.finish_reasons": ("tool_call",),
    }
    assert attributes(second)["gen_ai.response.finish_reasons"] == ("stop",)
    assert attributes(second)["gen_ai.usage.output_tokens"] == 7


async def test_cache_and_reasoning_tokens_use_the_genai_names(spans: Spans) -> None:
    """Chat spans carry the cache-read, cache-write and reasoning parts of their usage;
    the invoke_agent span carries the run's sums."""
    model = ScriptedModel(
        [
            attrs.evolve(
                tool_call_response("lookup", {"order_id": "42"}),
                usage=Usage(100, 30, cache_read_tokens=80, reasoning_tokens=20),
            ),
            attrs.evolve(
                text_response("Here."),
                usage=Usage(150, 10, cache_read_tokens=90, cache_write_tokens=40),
            ),
        ]
    )
    await Support(model=model).run("Where is my order?")
    first, second = (attributes(span) for span in spans.named("chat "))
    assert {k: v for k, v in first.items() if k.startswith("gen_ai.usage.")} == {
        "gen_ai.usage.input_tokens": 100,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.usage.cache_read.input_tokens": 80,
        "gen_ai.usage.reasoning.output_tokens": 20,
    }
    assert second["gen_ai.usage.cache_write.input_tokens"] == 40
    assert "gen_ai.usage.reasoning.output_tokens" not in second
    run = attributes(spans.one("invoke_agent"))
    assert {k: v for k, v in run.items() if k.startswith("gen_ai.usage.")} == {
        "gen_ai.usage.input_tokens": 250,
        "gen_ai.usage.output_tokens": 40,
        "gen_ai.usage.cache_read.input_tokens": 170,
        "gen_ai.usage.cache_write.input_tokens": 40,
        "gen_ai.usage.reasoning.output_tokens": 20,
    }


@pytest.mark.parametrize(
    ("stop_reason", "expected"),
    [
        (StopReason.END_TURN, "stop"),
        (StopReason.STOP_SEQUENCE, "stop"),
        (StopReason.MAX_TOKENS, "length"),
        (StopReason.CONTENT_FILTER, "content_filter"),
    ],
)
async def test_finish_reasons_use_the_genai_names(
    spans: Spans, stop_reason: StopReason, expected: str
) -> None:
    """Finish reasons on spans and in output messages are the conventions' own values
    (as OpenAI's ``length``, not Anthropic's ``max_tokens``), whatever the provider."""
    answer = text_response("Hi.", stop_reason=stop_reason)
    agent = Support(model=ScriptedModel([answer]), capture_content=True)
    with contextlib.suppress(OutputLimitError):
        await agent.run("hello")
    chat = attributes(spans.one("chat"))
    assert chat["gen_ai.response.finish_reasons"] == (expected,)
    assert json.loads(chat["gen_ai.output.messages"])[0]["finish_reason"] == expected
    if stop_reason is not StopReason.MAX_TOKENS:  # that one fails the run
        assert attributes(spans.one("invoke_agent"))["gen_ai.response.finish_reasons"] == (
            expected,
        )


async def test_execute_tool_attributes(spans: Spans) -> None:
    """execute_tool carries the operation, tool name, call id, tool type, the tool's
    declared description (not content: recorded without capture_content) and the agent."""
    await Support(model=two_turns()).run("Where is my order?")
    span = spans.one("execute_tool")
    assert attributes(span) == {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "lookup",
        "gen_ai.tool.call.id": "c1",
        "gen_ai.tool.type": "function",
        "gen_ai.tool.description": "Find an order.",
        "gen_ai.agent.name": "Support",
    }
    assert span.status.status_code is StatusCode.UNSET


async def test_execute_tool_names_its_agent_and_conversation(spans: Spans) -> None:
    """execute_tool carries the conditionally required gen_ai.agent.name and, in a
    session, gen_ai.conversation.id, as the run's other spans do."""
    session_id = f"conv-{uuid.uuid4().hex}"
    await Support(model=two_turns()).run("Where is my order?", session_id=session_id)
    span = attributes(spans.one("execute_tool"))
    assert span["gen_ai.agent.name"] == "Support"
    assert span["gen_ai.conversation.id"] == session_id


async def test_a_failing_provider_call_is_an_error_span(spans: Spans) -> None:
    """A provider error sets error.type and ERROR status on the chat and invoke_agent spans."""
    model = ScriptedModel([InvalidRequestError(f"rejected {SECRET}", status=400)])
    with pytest.raises(InvalidRequestError):
        await Support(model=model).run("hi")
    for span in (spans.one("chat"), spans.one("invoke_agent")):
        assert attributes(span)["error.type"] == "InvalidRequestError"
        assert span.status.status_code is StatusCode.ERROR
    assert attributes(spans.one("chat"))["gen_ai.response.finish_reasons"] == ("error",)
    assert not [text for text in spans.every_text() if SECRET in text]


async def test_a_model_answering_no_response_fails_its_chat_span(spans: Spans) -> None:
    """A model that returns something else than a ModelResponse: ProtocolError, and its
    chat span says the call gave no answer."""

    class Chatty:
        provider = name = "chatty"
        context_window = None

        async def respond(self, request: ModelRequest) -> str:
            return "hello"

    with pytest.raises(ProtocolError, match="not a ModelResponse"):
        await Support(model=Chatty()).run("hi")  # type: ignore[arg-type]
    chat = attributes(spans.one("chat"))
    assert chat["gen_ai.response.finish_reasons"] == ("error",)
    assert chat["error.type"] == "ProtocolError"


async def test_an_overflow_has_its_own_error_type(spans: Spans) -> None:
    """A context overflow is reported as error.type context_length_exceeded."""
    model = ScriptedModel([ContextWindowOverflowError("too long", status=400)])
    with pytest.raises(ContextWindowOverflowError):
        await Support(model=model).run("hi")
    assert attributes(spans.one("chat"))["error.type"] == "context_length_exceeded"


async def test_each_retry_attempt_is_its_own_chat_span(spans: Spans) -> None:
    """A retried call shows a failed chat span, then a successful one."""
    model = ScriptedModel([RateLimitError("slow", retry_after=0.01), text_response("ok")])
    await Support(model=model).run("hi")
    failed, succeeded = spans.named("chat")
    assert attributes(failed)["error.type"] == "RateLimitError"
    assert attributes(failed)["gen_ai.response.finish_reasons"] == ("error",)
    assert failed.status.status_code is StatusCode.ERROR
    assert succeeded.status.status_code is StatusCode.UNSET
    assert spans.one("invoke_agent").status.status_code is StatusCode.UNSET


async def test_a_failing_tool_is_an_error_span(spans: Spans) -> None:
    """A raising tool marks its execute_tool span ERROR; the run goes on."""
    model = ScriptedModel([tool_call_response("explode", {"reason": "x"}), text_response("ok")])
    await Support(model=model).run("hi")
    span = spans.one("execute_tool")
    assert attributes(span)["error.type"] == "RuntimeError"
    assert span.status.status_code is StatusCode.ERROR
    assert spans.one("invoke_agent").status.status_code is StatusCode.UNSET


async def test_a_tool_ending_the_process_fails_its_spans(spans: Spans) -> None:
    """A tool raising SystemExit ends the run as itself; its span and the run's are ERROR."""

    class Exiting(Agent):
        @tool
        async def leave(self) -> str:
            """Ends the process."""
            raise SystemExit(3)

    with pytest.raises(SystemExit):
        await Exiting(model=ScriptedModel([tool_call_response("leave", {})])).run("hi")
    for name in ("execute_tool", "invoke_agent"):
        span = spans.one(name)
        assert attributes(span)["error.type"] == "SystemExit"
        assert span.status.status_code is StatusCode.ERROR


class Abort(BaseException):
    """An application's own way of ending a run: no ``Exception``, no cancellation."""


@pytest.mark.parametrize("where", ["model", "hook"])
async def test_a_base_exception_of_the_callers_own_fails_the_spans(
    spans: Spans, where: str
) -> None:
    """Any exception but a cancellation is a failure: ERROR with its ``error.type``."""

    class Aborting(Agent):
        @before_model
        def maybe_abort(self, request: ModelRequest) -> None:
            if where == "hook":
                raise Abort

    script = [Abort()] if where == "model" else [text_response("never")]
    with pytest.raises(Abort):
        await Aborting(model=ScriptedModel(script)).run("hi")
    failed = [span for span in spans.all() if span.status.status_code is StatusCode.ERROR]
    assert {attributes(span)["error.type"] for span in failed} == {"Abort"}
    assert {span.name.split()[0] for span in failed} == (
        {"chat", "invoke_agent"} if where == "model" else {"invoke_agent"}
    )


async def test_settings_out_of_an_int64_stay_off_the_span(spans: Spans) -> None:
    """OpenTelemetry exports 64-bit ints only: a larger seed is left off, not dropped
    later by the exporter with an error."""
    settings = {"seed": 2**64 - 1, "max_tokens": 50}  # a uint64, as llama.cpp takes
    await Agent(model=ScriptedModel([text_response("ok")])).run("hi", settings=settings)
    chat = attributes(spans.one("chat"))
    assert "gen_ai.request.seed" not in chat and chat["gen_ai.request.max_tokens"] == 50


async def test_a_runs_usage_past_an_int64_stops_there_on_its_span(spans: Spans) -> None:
    """Calls a server billed the most a count holds add up to that, which OpenTelemetry
    exports, on the run's span and in its result (a sum past an int64 was left off the
    span, and is no ``Usage``); each call's span has its own."""

    class Looping(Agent):
        @tool
        def again(self) -> str:
            """Go round."""
            return "again"

    most = 2**63 - 1
    model = ScriptedModel(
        [
            tool_call_response("again", {}, input_tokens=most, output_tokens=2),
            text_response("ok", input_tokens=most, output_tokens=3),
        ]
    )
    result = await Looping(model=model).run("hi")
    assert (result.usage.input_tokens, result.usage.output_tokens) == (most, 5)
    run = attributes(spans.one("invoke_agent"))
    assert (run["gen_ai.usage.input_tokens"], run["gen_ai.usage.output_tokens"]) == (most, 5)
    calls = [attributes(span) for span in spans.named("chat")]
    assert [call["gen_ai.usage.output_tokens"] for call in calls] == [2, 3]


class Unresolved(Agent):
    model = "no-such-provider:tiny"


async def test_a_model_that_cannot_be_resolved_fails_the_run_span(
    spans: Spans, histograms: Histograms
) -> None:
    """A model string no provider resolves (or a provider missing its key) is a failed
    run in the traces and gen_ai.invoke_agent.duration too, not a run without a span."""
    with pytest.raises(ConfigurationError, match="unknown provider 'no-such-provider'"):
        await Unresolved().run("hi")
    span = spans.one("invoke_agent Unresolved")
    assert attributes(span)["error.type"] == "ConfigurationError"
    assert attributes(span)["gen_ai.agent.name"] == "Unresolved"
    assert span.status.status_code is StatusCode.ERROR
    assert timed_like_spans(spans, histograms.read()) == [
        {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.name": "Unresolved",
            "error.type": "ConfigurationError",
        }
    ]


def test_run_sync_with_a_model_that_cannot_be_resolved_fails_the_run_span(spans: Spans) -> None:
    """``run_sync()``, which makes its own model, alike."""
    with pytest.raises(ConfigurationError, match="unknown provider 'no-such-provider'"):
        Unresolved().run_sync("hi")
    span = spans.one("invoke_agent Unresolved")
    assert attributes(span)["error.type"] == "ConfigurationError"
    assert attributes(span)["gen_ai.agent.name"] == "Unresolved"
    assert span.status.status_code is StatusCode.ERROR


async def hang(request: ModelRequest) -> ModelResponse:
    """A model step that never answers."""
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


async def test_a_cancelled_run_ends_its_spans_without_error(spans: Spans) -> None:
    """Spans of a run cancelled by its caller end, none with ERROR status."""
    with anyio.move_on_after(0.1):
        await Support(model=ScriptedModel([hang])).run("hi")
    assert {span.name for span in spans.all()} == {"invoke_agent Support", "chat scripted"}
    assert all(span.status.status_code is StatusCode.UNSET for span in spans.all())
    assert all(span.end_time is not None for span in spans.all())


async def test_a_run_cancelled_during_a_tool_ends_its_spans_without_error(spans: Spans) -> None:
    """A run cancelled while a tool runs ends the tool span too, without ERROR status."""
    with anyio.move_on_after(0.1):
        await Support(model=ScriptedModel([tool_call_response("stall", {})])).run("hi")
    assert sorted(span.name for span in spans.all()) == [
        "chat scripted",
        "execute_tool stall",
        "invoke_agent Support",
    ]
    assert all(span.status.status_code is StatusCode.UNSET for span in spans.all())


class SlowOnceStopping(InMemorySessionStore):
    """A store whose appends take ``stall`` seconds once ``stalling`` is set (a slow
    database, met by the run's cleanup)."""

    def __init__(self, stall: float) -> None:
        super().__init__()
        self.stall = stall
        self.stalling = False

    async def append(self, session_id: str, messages: Any, **options: Any) -> Any:
        if self.stalling:
            await anyio.sleep(self.stall)
        return await super().append(session_id, messages, **options)


class Waiting(Support):
    cleanup_grace = 2.0

    @tool
    async def wait(self, context: RunContext) -> str:
        """Waits long, while the store turns slow."""
        store = context.agent.session_store
        assert isinstance(store, SlowOnceStopping)
        store.stalling = True
        await anyio.sleep(30)
        return ""


class HelpedSlowly(Support):
    cleanup_grace = 2.0

    @tool
    async def consult(self, context: RunContext) -> str:
        """Asks a helper, whose run waits long in a store that turns slow."""
        store = context.agent.session_store
        assert isinstance(store, SlowOnceStopping)
        model = ScriptedModel([tool_call_response("wait", {}), text_response("done")])
        helper = Waiting(model=model, session_store=store)
        return (await helper.run("help", session_id=f"helper-{uuid.uuid4()}")).output


@pytest.mark.virtual_clock
@pytest.mark.parametrize("nested", [False, True], ids=["run", "sub-agent"])
async def test_a_run_its_caller_cancels_is_no_deadline_failure_when_its_cleanup_passes_it(
    spans: Spans, histograms: Histograms, nested: bool
) -> None:
    """A run its caller cancels before its deadline was cancelled, not cut by the
    deadline, however long its cleanup (storing the stopped tool calls' results in a slow
    store, within the grace) then takes, a sub-agent's run too (whose cleanup passes the
    deadline of the run it serves): its span ends UNSET, its duration metric says
    ``cancelled``, for any times of the cancellation, the deadline and the store."""
    rng = random.Random(20261207)
    for case in range(12):
        store = SlowOnceStopping(stall=rng.uniform(0.2, 1.5))
        cancel_at = rng.uniform(0.01, 0.5)
        timeout = cancel_at + rng.uniform(0.01, store.stall - 0.01)  # passed in cleanup
        first = tool_call_response("consult" if nested else "wait", {})
        model = ScriptedModel([first, text_response("done")])
        agent = (HelpedSlowly if nested else Waiting)(model=model, session_store=store)
        began = anyio.current_time()
        with anyio.move_on_after(cancel_at) as scope:
            await agent.run("hi", session_id=f"s{case}", timeout=timeout)
        assert scope.cancelled_caught
        assert anyio.current_time() - began > timeout  # the cleanup went past the deadline
    assert not spans.still_open
    runs = spans.named("invoke_agent")
    assert len(runs) == (24 if nested else 12)
    for span in runs if nested else spans.all():
        assert span.status.status_code is StatusCode.UNSET, span.name
        assert "error.type" not in attributes(span), span.name
    points = histograms.read()["gen_ai.invoke_agent.duration"]
    assert {dict(p.attributes or {})["error.type"] for p in points} == {"cancelled"}
    assert sum(p.count for p in points) == len(runs)


class Busy(Support):
    @tool
    async def busy(self) -> str:
        """Works on, deaf to cancellation a while (a shielded cleanup, a busy loop)."""
        with anyio.CancelScope(shield=True):
            await anyio.sleep(0.3)
        await anyio.sleep(30)
        return ""


@pytest.mark.virtual_clock
@pytest.mark.parametrize("mode", ["run", "stream"])
async def test_a_run_that_raises_its_callers_cancellation_is_no_deadline_failure(
    spans: Spans, histograms: Histograms, mode: str
) -> None:
    """A run that lets its caller's cancellation through (the caller's came first) was
    cancelled, even when it saw that cancellation only past its own deadline (a tool
    held it off): its span is UNSET and its duration metric says ``cancelled``, as the
    run told its caller, never ``DeadlineExceededError``, which the run would have
    raised had its deadline stopped it."""
    agent = Busy(model=ScriptedModel([tool_call_response("busy", {}), text_response("done")]))
    with anyio.move_on_after(0.1) as scope:
        if mode == "stream":
            async with agent.stream("hi", timeout=0.2) as events:
                async for _ in events:
                    pass
        else:
            await agent.run("hi", timeout=0.2)
    assert scope.cancelled_caught
    run = spans.one("invoke_agent")
    assert run.status.status_code is StatusCode.UNSET
    assert "error.type" not in attributes(run)
    (point,) = histograms.read()["gen_ai.invoke_agent.duration"]
    assert dict(point.attributes or {})["error.type"] == "cancelled"


@pytest.mark.parametrize("end", ["cancelled", "consumer left", "deadline", "failed", "unresolved"])
async def test_a_run_without_an_answer_has_the_finish_reason_error(spans: Spans, end: str) -> None:
    """A run that ends without an answer (cancelled, left by its stream's consumer, past
    its deadline, failed, or with a model that cannot be resolved) has the finish reason
    error on invoke_agent, as a cut chat span has: told from a run still going on or one
    that answered; only a failure is ERROR."""
    agent = Support(model=ScriptedModel([hang]))
    if end == "cancelled":
        with anyio.move_on_after(0.1):
            await agent.run("hi")
    elif end == "consumer left":
        async with Support(model=ScriptedModel([text_response("one two three")])).stream(
            "hi"
        ) as events:
            async for _ in events:
                break
    elif end == "deadline":
        with pytest.raises(DeadlineExceededError):
            await agent.run("hi", timeout=0.1)
    elif end == "failed":
        with pytest.raises(InvalidRequestError):
            await Support(model=ScriptedModel([InvalidRequestError("no", status=400)])).run("hi")
    else:
        with pytest.raises(ConfigurationError):
            await Unresolved().run("hi")
    root = spans.one("invoke_agent")
    assert attributes(root)["gen_ai.response.finish_reasons"] == ("error",)
    stopped = end in ("cancelled", "consumer left")
    assert root.status.status_code is (StatusCode.UNSET if stopped else StatusCode.ERROR)
    assert ("error.type" in attributes(root)) is not stopped


class Consulting(Agent):
    @tool
    async def ask(self) -> str:
        """Asks a sub-agent, whose tool stalls."""
        helper = Support(model=ScriptedModel([tool_call_response("stall", {})]))
        return (await helper.run("help")).output


DEADLINE_CUTS = {
    "chat": ([hang], {"chat scripted", "invoke_agent Support"}),
    "streamed chat": ([hang], {"chat scripted", "invoke_agent Support"}),
    "tool": (
        [tool_call_response("stall", {})],
        {"execute_tool stall", "invoke_agent Support"},
    ),
    "sub-agent": (
        [tool_call_response("ask", {})],
        {
            "execute_tool stall",
            "invoke_agent Support",
            "execute_tool ask",
            "invoke_agent Consulting",
        },
    ),
}


@pytest.mark.parametrize("where", list(DEADLINE_CUTS))
async def test_every_span_the_run_deadline_cuts_is_an_error_span(spans: Spans, where: str) -> None:
    """The run's deadline fails each span it cuts with DeadlineExceededError, down to the
    chat or tool that took the time (through a sub-agent's run and the tool that ran it),
    as the duration metric records a cut call; what had ended stays UNSET."""
    script, cut = DEADLINE_CUTS[where]
    agent = (Consulting if where == "sub-agent" else Support)(model=ScriptedModel(script))
    timeout = 0.5  # the stalling step is reached well before it, on a loaded machine too
    with pytest.raises(DeadlineExceededError):
        if where == "streamed chat":
            async with agent.stream("hi", timeout=timeout) as events:
                async for _ in events:
                    pass
        else:
            await agent.run("hi", timeout=timeout)
    assert not spans.still_open
    failed = {span.name for span in spans.all() if span.status.status_code is StatusCode.ERROR}
    assert failed == cut
    for span in spans.all():
        kind = "DeadlineExceededError" if span.name in cut else None
        assert attributes(span).get("error.type") == kind


class ConnectionClosed(Exception):
    """What some clients raise in place of a cancellation that cuts them."""


async def closed_when_cancelled() -> None:
    """Wait long; a cancellation becomes a client's own error ("connection closed")."""
    try:
        await anyio.sleep(30)
    except anyio.get_cancelled_exc_class():
        raise ConnectionClosed("connection closed") from None


class Closing(Agent):
    @tool
    async def query(self) -> str:
        """Waits on a database client that turns a cancellation into its own error."""
        await closed_when_cancelled()
        return "rows"

    @tool(timeout=0.2)
    async def bounded(self) -> str:
        """The same, with a timeout of its own."""
        await closed_when_cancelled()
        return "rows"


async def closing_call(request: ModelRequest) -> ModelResponse:
    """A model whose HTTP client turns a cancellation into its own error."""
    try:
        await anyio.sleep(30)
    except anyio.get_cancelled_exc_class():
        raise ProviderUnavailableError("connection closed", provider="scripted") from None
    raise AssertionError("unreachable")


@pytest.mark.virtual_clock
@pytest.mark.parametrize("where", ["chat", "tool"])
@pytest.mark.parametrize("end", ["cancelled", "deadline"])
async def test_a_cut_a_client_turned_into_its_own_error_is_no_failure_of_its_span(
    spans: Spans, histograms: Histograms, where: str, end: str
) -> None:
    """A model call or tool whose client turns the cancellation that cuts it into an
    error of its own ("connection closed") was cut, as the run says: by the caller's
    cancellation, UNSET (``cancelled`` in the duration metric); by the run's deadline,
    ERROR with DeadlineExceededError. Never the client's error, which would count every
    abandoned request as a provider or tool failure."""
    script = [closing_call] if where == "chat" else [tool_call_response("query", {})]
    agent = Closing(model=ScriptedModel(script))
    if end == "cancelled":
        with anyio.move_on_after(1) as scope:
            await agent.run("hi")
        assert scope.cancelled_caught
    else:
        with pytest.raises(DeadlineExceededError):
            await agent.run("hi", timeout=1)
    cut = spans.one("chat" if where == "chat" else "execute_tool")
    kind = None if end == "cancelled" else "DeadlineExceededError"
    assert attributes(cut).get("error.type") == kind
    assert cut.status.status_code is (StatusCode.UNSET if kind is None else StatusCode.ERROR)
    if where == "chat":
        (timed,) = histograms.read()["gen_ai.client.operation.duration"]
        assert dict(timed.attributes or {})["error.type"] == (kind or "cancelled")


@pytest.mark.virtual_clock
async def test_a_tool_timeout_its_client_turned_into_its_own_error_is_a_timeout(
    spans: Spans,
) -> None:
    """A tool's own timeout, turned by its client into "connection closed", is the
    tool's timeout, as when the cancellation goes through: ``error.type`` ``timeout``,
    and the model is told the tool did not finish in time."""
    model = ScriptedModel([tool_call_response("bounded", {}), text_response("Sorry.")])
    result = await Closing(model=model).run("hi")
    assert attributes(spans.one("execute_tool"))["error.type"] == "timeout"
    answered = result.messages[-2].tool_results[0]
    assert answered.is_error and "did not finish within 0.2 s" in answered.content


async def run_with_secrets(agent: Support) -> None:
    """A run whose instructions, input, history, tool arguments, results and answer hold SECRET."""
    model = ScriptedModel(
        [
            tool_call_response("lookup", {"order_id": SECRET}, call_id="c1"),
            tool_call_response("explode", {"reason": SECRET}, call_id="c2"),
            text_response(f"answer {SECRET}"),
        ]
    )
    history = [Message.user(f"earlier {SECRET}"), Message.assistant(f"reply {SECRET}")]
    await type(agent)(model=model, capture_content=agent.capture_content).run(
        f"question {SECRET}", history=history
    )


async def test_reasoning_reaches_spans_only_when_content_is_captured(spans: Spans) -> None:
    """Reasoning is content: absent from spans by default, in the output messages when
    capture_content is on."""
    thought = ModelResponse(
        Message("assistant", [ReasoningPart(f"thinking {SECRET}", "sig", "x"), TextPart("Hi.")])
    )
    await Support(model=ScriptedModel([thought])).run("hello")
    assert not [text for text in spans.every_text() if SECRET in text]
    await Support(model=ScriptedModel([thought]), capture_content=True).run("hello")
    output = json.loads(attributes(spans.named("chat")[-1])["gen_ai.output.messages"])
    assert output[0]["parts"][0] == {"type": "reasoning", "content": f"thinking {SECRET}"}
    assert output[0]["finish_reason"] == "stop"  # required of an output message


async def test_an_image_url_is_a_uri_part_in_captured_messages(spans: Spans) -> None:
    """An image given by URL is the conventions' ``uri`` part (modality and MIME type),
    which consumers of the GenAI message schema show as an image."""
    url = "https://example.com/cat.png"
    question = Message(
        "user", [TextPart("What is this?"), ImagePart(url=url, media_type="image/png")]
    )
    agent = Support(model=ScriptedModel([text_response("A cat.")]), capture_content=True)
    await agent.run(question)
    sent = json.loads(attributes(spans.one("chat"))["gen_ai.input.messages"])
    assert sent[-1]["parts"][1] == {
        "type": "uri",
        "modality": "image",
        "uri": url,
        "mime_type": "image/png",
    }


@pytest.mark.parametrize(
    "image",
    [
        ImagePart(data=b"\x89PNG-bytes", media_type="image/png"),
        ImagePart(url="data:image/png;base64,iVBORy1ieXRlcw=="),
    ],
    ids=["bytes", "data-url"],
)
async def test_an_inline_image_is_a_blob_part_in_captured_messages(
    spans: Spans, image: ImagePart
) -> None:
    """An image given inline (bytes or a ``data:`` URL) is the conventions' ``blob`` part
    (modality, MIME type, base64 content), not a part of littleghost's own type."""
    question = Message("user", [TextPart("What is this?"), image])
    agent = Support(model=ScriptedModel([text_response("A cat.")]), capture_content=True)
    await agent.run(question)
    sent = json.loads(attributes(spans.one("chat"))["gen_ai.input.messages"])
    assert sent[-1]["parts"][1] == {
        "type": "blob",
        "modality": "image",
        "mime_type": "image/png",
        "content": "iVBORy1ieXRlcw==",
    }


async def test_no_content_in_spans_by_default(spans: Spans) -> None:
    """By default no span name, attribute, event or status holds message or tool content."""
    await run_with_secrets(Support())
    texts = spans.every_text()
    assert len(spans.all()) == 6
    assert not [text for text in texts if SECRET in text]


async def test_content_is_captured_when_asked(spans: Spans) -> None:
    """capture_content=True records messages, tool arguments and results on the spans."""
    await run_with_secrets(Support(capture_content=True))
    chat = spans.named("chat")[0]
    assert SECRET in attributes(chat)["gen_ai.input.messages"]
    assert SECRET in spans.named("chat")[-1].attributes["gen_ai.output.messages"]  # type: ignore[index]
    lookup = spans.one("execute_tool lookup")
    assert SECRET in attributes(lookup)["gen_ai.tool.call.arguments"]
    assert SECRET in attributes(lookup)["gen_ai.tool.call.result"]
    assert json.loads(attributes(lookup)["gen_ai.tool.call.arguments"]) == {"order_id": SECRET}
    sent = json.loads(attributes(spans.named("chat")[1])["gen_ai.input.messages"])
    calls = [part for message in sent for part in message["parts"] if part["type"] == "tool_call"]
    assert calls[0]["arguments"] == {"order_id": SECRET}
    (raised,) = spans.one("execute_tool explode").events  # what the tool raised, and where
    assert raised.name == "exception"
    assert raised.attributes is not None
    assert raised.attributes["exception.type"] == "RuntimeError"
    assert raised.attributes["exception.message"] == f"failed because {SECRET}"
    assert 'in explode\n    raise RuntimeError(f"failed because {reason}")' in str(
        raised.attributes["exception.stacktrace"]
    )


class SyncSupport(Support):
    """``Support`` whose failing tool is a plain def, run in a worker thread."""

    @tool
    def explode(self, reason: str) -> str:
        """Always fails."""
        raise ValueError(f"failed because {reason}")


async def test_a_sync_tool_s_exception_event_is_as_the_sdk_records_it(spans: Spans) -> None:
    """The ``exception`` event of what a sync tool raised (made in its worker thread)
    holds what the SDK's ``record_exception`` writes for it: type, message, traceback."""
    await run_with_secrets(SyncSupport(capture_content=True))
    (raised,) = spans.one("execute_tool explode").events
    assert raised.attributes is not None
    recorded = dict(raised.attributes)
    error = ValueError(f"failed because {SECRET}")
    error.__traceback__ = None
    with trace.get_tracer("sdk").start_as_current_span("reference") as reference:
        reference.record_exception(error)
    expected = dict(spans.one("reference").events[0].attributes or {})
    expected.pop("exception.escaped", None)  # deprecated by the semantic conventions
    assert recorded.pop("exception.stacktrace").endswith(expected.pop("exception.stacktrace"))
    assert recorded == expected
    assert "in explode\n    raise ValueError" in str(raised.attributes["exception.stacktrace"])


class ScriptedAnthropic(ScriptedModel):
    """A scripted model that speaks for Anthropic, whose API takes system text apart."""

    provider = "anthropic"


@pytest.mark.parametrize("model_type", [ScriptedModel, ScriptedAnthropic])
async def test_captured_requests_hold_instructions_and_tool_definitions(
    spans: Spans, model_type: type[ScriptedModel]
) -> None:
    """A captured request's instructions are in gen_ai.system_instructions for a provider
    that takes them apart (Anthropic), a system message of gen_ai.input.messages for one
    that takes them in the conversation (OpenAI's chat API); its tools are in
    gen_ai.tool.definitions."""
    model = model_type([text_response("ok")])
    await Support(model=model, capture_content=True).run("hello")
    chat = attributes(spans.one("chat "))
    sent = json.loads(chat["gen_ai.input.messages"])
    system = {"type": "text", "content": Support.instructions}
    if model_type is ScriptedAnthropic:
        assert json.loads(chat["gen_ai.system_instructions"]) == [system]
        assert [message["role"] for message in sent] == ["user"]
    else:
        assert "gen_ai.system_instructions" not in chat
        assert sent[0] == {"role": "system", "parts": [system]}
    tools = {tool["name"]: tool for tool in json.loads(chat["gen_ai.tool.definitions"])}
    assert sorted(tools) == ["explode", "lookup", "stall"]
    assert tools["lookup"] == {
        "type": "function",
        "name": "lookup",
        "description": "Find an order.",
        "parameters": {
            "type": "object",
            "properties": {"order_id": {"type": "string"}},
            "required": ["order_id"],
            "additionalProperties": False,
        },
    }


async def test_an_undeclared_tools_span_has_no_description(spans: Spans) -> None:
    """A call of a tool the agent does not have records no gen_ai.tool.description."""
    model = ScriptedModel([tool_call_response("missing", {}), text_response("done")])
    await Support(model=model).run("hi")
    assert "gen_ai.tool.description" not in attributes(spans.one("execute_tool"))


class ServedModel(ScriptedModel):
    """A scripted model that says where its server is."""

    def __init__(self, address: object, port: object) -> None:
        super().__init__([text_response("ok")])
        self.server_address = address
        self.server_port = port


class Unstreamed:
    """A model without ``stream``: a streamed run calls ``respond``."""

    provider = "plain"
    name = "plain"
    context_window = None

    async def respond(self, request: ModelRequest) -> ModelResponse:
        return text_response("ok")


class Paced:
    """A streaming model whose first chunk comes ``wait`` seconds after the call, its
    end as long again: a text answer, or one tool call, ``announced`` by a
    ``ToolCallChunk`` or with nothing to show (a custom model need not yield one)."""

    provider = "paced"
    name = "paced"
    context_window = None

    def __init__(self, wait: float, *, text: bool = True, announced: bool = False) -> None:
        self.wait, self.text, self.announced = wait, text, announced

    def _answer(self) -> ModelResponse:
        return text_response("ok") if self.text else tool_call_response("lookup", {"order_id": "1"})

    async def respond(self, request: ModelRequest) -> ModelResponse:
        return self._answer()

    async def stream(self, request: ModelRequest) -> AsyncIterator[object]:
        await anyio.sleep(self.wait)
        if self.text:
            yield TextChunk("ok")
        elif self.announced:
            yield ToolCallChunk()
        await anyio.sleep(self.wait)
        yield StreamDone(self._answer())


def one_first_chunk(spans: Spans, histograms: Histograms, *, after: float) -> Any:
    """The one chat span's time to first chunk, at least ``after`` seconds and before the
    span's end, and the metric's one point, which records it."""
    span = spans.one("chat ")
    first = attributes(span)["gen_ai.response.time_to_first_chunk"]
    assert span.start_time is not None and span.end_time is not None
    assert after <= first < (span.end_time - span.start_time) / 1e9
    (point,) = histograms.read()["gen_ai.client.operation.time_to_first_chunk"]
    assert point.count == 1 and point.sum == pytest.approx(first)
    return point


async def test_a_streamed_answer_has_its_time_to_first_chunk(
    spans: Spans, histograms: Histograms
) -> None:
    """A streamed call's span and client metrics hold the seconds until its first text
    came (gen_ai.response.time_to_first_chunk, gen_ai.client.operation.time_to_first_chunk);
    an answer not streamed, or streamed with nothing to show before its end, has none."""
    async with Agent(model=Paced(0.05)).stream("hi") as events:
        async for _ in events:
            pass
    point = one_first_chunk(spans, histograms, after=0.05)
    assert dict(point.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "paced",
        "gen_ai.request.model": "paced",
    }

    await Agent(model=Paced(0.01)).run("hi")
    with pytest.raises(LimitExceededError):
        async with Support(model=Paced(0.01, text=False), max_turns=1).stream("hi") as events:
            async for _ in events:
                pass
    later = spans.named("chat ")[1:]
    assert len(later) == 2
    assert not [span for span in later if "gen_ai.response.time_to_first_chunk" in span.attributes]  # type: ignore[operator]
    assert "gen_ai.client.operation.time_to_first_chunk" not in histograms.read()


async def test_a_streamed_answer_of_tool_calls_alone_has_its_time_to_first_chunk(
    spans: Spans, histograms: Histograms
) -> None:
    """A tool call's start is a chunk too: an answer of tool calls alone (most turns of a
    tool-heavy agent) has its time to first chunk, not only answers with text."""
    with pytest.raises(LimitExceededError):
        model = Paced(0.05, text=False, announced=True)
        async with Support(model=model, max_turns=1).stream("hi") as events:
            async for _ in events:
                pass
    one_first_chunk(spans, histograms, after=0.05)


async def test_a_stream_cut_after_its_first_chunk_has_its_time_to_first_chunk(
    spans: Spans, histograms: Histograms
) -> None:
    """A stream its consumer leaves after the first text (a user pressing stop) had its
    first chunk all the same: its span and the metric hold the time, the metric's point
    with the ``error.type`` of the call's duration (the time is not the completed calls'
    alone)."""
    async with Agent(model=Paced(0.05)).stream("hi") as events:
        async for event in events:
            if isinstance(event, TextDelta):
                break
    point = one_first_chunk(spans, histograms, after=0.05)
    assert dict(point.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "paced",
        "gen_ai.request.model": "paced",
        "error.type": "cancelled",
    }


async def test_a_streamed_answer_has_its_time_per_output_chunk(histograms: Histograms) -> None:
    """Each chunk of a streamed answer after the first is in
    gen_ai.client.operation.time_per_output_chunk, the seconds since the one before, with
    the conventions' attributes; an answer of one chunk, or not streamed, records none."""
    model = ScriptedModel([streamed("one ", "two ", "three", delay=0.03)])
    async with Agent(model=model).stream("hi") as events:
        async for _ in events:
            pass
    (point,) = histograms.read()["gen_ai.client.operation.time_per_output_chunk"]
    assert point.count == 2 and 0.06 <= point.sum < 5
    assert dict(point.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "scripted",
        "gen_ai.request.model": "scripted",
    }

    async with Agent(model=Paced(0.01)).stream("hi") as events:
        async for _ in events:
            pass
    await Agent(model=ScriptedModel([streamed("one ", "two")])).run("hi")
    assert "gen_ai.client.operation.time_per_output_chunk" not in histograms.read()


class TestChatSpanRequestAndResponse:
    """The request and response attributes a chat span adds beyond the basics."""

    @pytest.mark.parametrize(
        ("address", "port", "expected"),
        [
            pytest.param(
                "llm.internal",
                8443,
                {"server.address": "llm.internal", "server.port": 8443},
                id="address and port",
            ),
            pytest.param("llm.internal", None, {"server.address": "llm.internal"}, id="no port"),
            pytest.param("llm.internal", True, {"server.address": "llm.internal"}, id="bool port"),
            pytest.param("llm.internal", 70000, {"server.address": "llm.internal"}, id="bad port"),
            pytest.param(None, 8443, {}, id="a port alone"),
            pytest.param(b"llm.internal", 8443, {}, id="bytes address"),
        ],
    )
    async def test_server_attributes_come_from_the_model(
        self, spans: Spans, address: object, port: object, expected: dict[str, Any]
    ) -> None:
        """server.address and server.port come from a model's optional attributes; a value
        of another type is left out."""
        await Agent(model=ServedModel(address, port)).run("hi")
        chat = attributes(spans.one("chat "))
        assert {key: value for key, value in chat.items() if key.startswith("server.")} == expected

    async def test_response_id_and_model(self, spans: Spans) -> None:
        """gen_ai.response.id and gen_ai.response.model come from the response."""
        response = attrs.evolve(
            text_response("ok"), response_id="resp-1", response_model="scripted-2026-01-01"
        )
        await Agent(model=ScriptedModel([response])).run("hi")
        chat = attributes(spans.one("chat "))
        assert chat["gen_ai.response.id"] == "resp-1"
        assert chat["gen_ai.response.model"] == "scripted-2026-01-01"

    def test_response_id_and_model_are_strings_or_none(self) -> None:
        """ModelResponse takes a str or None for its id and model, nothing else."""
        with pytest.raises(TypeError, match=r"ModelResponse.response_id must be a str or None"):
            attrs.evolve(text_response("ok"), response_id=42)
        with pytest.raises(TypeError, match=r"ModelResponse.response_model must be a str or None"):
            attrs.evolve(text_response("ok"), response_model=b"m")

    @pytest.mark.parametrize(
        ("settings", "expected"),
        [
            pytest.param({"stop": "END"}, ("END",), id="stop, a string"),
            pytest.param({"stop": ["END", "###"]}, ("END", "###"), id="stop, a list"),
            pytest.param({"stop_sequences": ["END"]}, ("END",), id="stop_sequences"),
            pytest.param({"stop": []}, None, id="empty"),
            pytest.param({"stop_sequences": ["END", 3]}, None, id="not all strings"),
        ],
    )
    async def test_stop_sequences(
        self, spans: Spans, settings: dict[str, Any], expected: tuple[str, ...] | None
    ) -> None:
        """gen_ai.request.stop_sequences holds the stop sequences the settings carry."""
        await Agent(model=ScriptedModel([text_response("ok")]), settings=settings).run("hi")
        assert attributes(spans.one("chat ")).get("gen_ai.request.stop_sequences") == expected

    async def test_top_k_and_penalties(self, spans: Spans) -> None:
        """gen_ai.request.top_k (conditionally required when the request has it) and the
        penalties hold the settings that carry them."""
        settings = {"top_k": 40, "frequency_penalty": 0.5, "presence_penalty": -0.25}
        await Agent(model=ScriptedModel([text_response("ok")]), settings=settings).run("hi")
        chat = attributes(spans.one("chat "))
        assert chat["gen_ai.request.top_k"] == 40
        assert chat["gen_ai.request.frequency_penalty"] == 0.5
        assert chat["gen_ai.request.presence_penalty"] == -0.25

    async def test_settings_keep_the_conventions_types(self, spans: Spans) -> None:
        """The settings the conventions type as doubles are floats on the chat and run
        spans even when given as ints (temperature=1), as a backend that types attributes
        takes them; max_tokens and seed stay ints."""
        settings = {
            "temperature": 1,
            "top_p": 1,
            "top_k": 40,
            "frequency_penalty": 0,
            "presence_penalty": -1,
            "max_tokens": 50,
            "seed": 7,
        }
        await Agent(model=ScriptedModel([text_response("ok")]), settings=settings).run("hi")
        for span in (spans.one("chat "), spans.one("invoke_agent")):
            found = {
                name.removeprefix("gen_ai.request."): (type(value), value)
                for name, value in attributes(span).items()
                if name.startswith("gen_ai.request.") and name != "gen_ai.request.model"
            }
            assert found == {
                "temperature": (float, 1.0),
                "top_p": (float, 1.0),
                "top_k": (float, 40.0),
                "frequency_penalty": (float, 0.0),
                "presence_penalty": (float, -1.0),
                "max_tokens": (int, 50),
                "seed": (int, 7),
            }

    async def test_stream_is_set_when_the_model_streams(self, spans: Spans) -> None:
        """gen_ai.request.stream is true on a streamed call; a run that is not streamed
        leaves it unset."""
        async with Agent(model=ScriptedModel([text_response("ok")])).stream("hi") as events:
            async for _ in events:
                pass
        await Agent(model=ScriptedModel([text_response("ok")])).run("hi")
        streamed, plain = (attributes(span) for span in spans.named("chat "))
        assert streamed["gen_ai.request.stream"] is True
        assert "gen_ai.request.stream" not in plain

    async def test_stream_is_unset_when_the_model_cannot_stream(self, spans: Spans) -> None:
        """A streamed run of a model without ``stream`` makes a plain call: no
        gen_ai.request.stream."""
        async with Agent(model=Unstreamed()).stream("hi") as events:
            async for _ in events:
                pass
        assert "gen_ai.request.stream" not in attributes(spans.one("chat "))


# --- log records ------------------------------------------------------------------------


def failing_count(request: ModelRequest) -> int:
    raise OSError("the count endpoint is down")


class Counting(Agent):
    """Asks its model for a prompt count before each call (the count fails: a warning)."""

    @before_model
    async def count(self, request: ModelRequest, *, context: RunContext) -> None:
        await context.count_prompt_tokens(request)


class Delegating(Counting):
    """Also runs a ``Counting`` agent of its own from a tool, in no session."""

    name = "outer"

    @tool
    async def ask_helper(self) -> str:
        """Ask the helper."""
        helper = Counting(
            model=ScriptedModel([text_response("helped")], count_prompt_tokens=failing_count)
        )
        return (await helper.run("help")).output


async def test_every_record_logged_in_a_run_names_its_agent_and_session(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A record any littleghost logger emits in a run has the run's agent and session in
    its ``littleghost`` attribute (beside the record's own), a nested run's its own; the
    attribute is empty outside runs (a ``%(littleghost)s`` format never fails)."""
    model = ScriptedModel(
        [tool_call_response("ask_helper", {}), text_response("done")],
        count_prompt_tokens=failing_count,
    )
    agent = Delegating(model=model)
    with caplog.at_level(logging.WARNING, logger="littleghost"):
        await agent.run("hi", session_id="s-1")
        logging.getLogger("littleghost.models").warning("outside any run")
    counts = [r for r in caplog.records if "counting the prompt tokens" in r.getMessage()]
    names = [
        (r.littleghost["gen_ai.agent.name"], r.littleghost.get("gen_ai.conversation.id"))  # type: ignore[attr-defined]
        for r in counts
    ]
    assert names == [("outer", "s-1"), ("Counting", None), ("outer", "s-1")]
    assert caplog.records[-1].littleghost == {}  # type: ignore[attr-defined]


async def test_every_littleghost_logger_names_the_run(caplog: pytest.LogCaptureFixture) -> None:
    """Every logger of littleghost's modules adds the run's names to what it logs in a run
    (one made with a plain ``logging.getLogger`` would not)."""
    for found in pkgutil.walk_packages(littleghost.__path__, "littleghost."):
        importlib.import_module(found.name)
    names = sorted(
        name
        for name, found in logging.Logger.manager.loggerDict.items()
        if name.startswith("littleghost.") and isinstance(found, logging.Logger)
    )
    assert {"littleghost.cleanup", "littleghost.context", "littleghost.tools"} <= set(names)

    class Probing(Agent):
        @before_model
        def probe(self, request: ModelRequest) -> None:
            for name in names:
                logging.getLogger(name).warning("probe")

    with caplog.at_level(logging.WARNING, logger="littleghost"):
        await Probing(model=ScriptedModel([text_response("ok")])).run("hi", session_id="s-2")
    probes = {r.name: r.littleghost for r in caplog.records if r.getMessage() == "probe"}  # type: ignore[attr-defined]
    expected = {"gen_ai.agent.name": "Probing", "gen_ai.conversation.id": "s-2"}
    assert probes == {name: expected for name in names}


@pytest.mark.parametrize(
    ("answer", "status", "error_type"),
    [
        (17, StatusCode.UNSET, None),
        (None, StatusCode.UNSET, None),
        (0, StatusCode.ERROR, "ProtocolError"),
        (-1, StatusCode.ERROR, "ProtocolError"),
        (True, StatusCode.ERROR, "ProtocolError"),
        ("17", StatusCode.ERROR, "ProtocolError"),
        (ValueError(f"count failed on {SECRET}"), StatusCode.ERROR, "ValueError"),
    ],
    ids=["figure", "cannot-tell", "zero", "negative", "bool", "str", "raises"],
)
async def test_a_prompt_count_is_an_error_span_unless_it_is_a_positive_int_or_none(
    spans: Spans,
    caplog: pytest.LogCaptureFixture,
    answer: object,
    status: StatusCode,
    error_type: str | None,
) -> None:
    """The telemetry page's *Token counts*: a count that fails, or answers anything but a
    positive int or None, is ERROR with ``error.type`` and logged by its type alone; None
    (the model cannot tell) ends UNSET without a figure; the run goes on either way."""

    def count(request: ModelRequest) -> object:
        if isinstance(answer, Exception):
            raise answer
        return answer

    class Counting(Agent):
        @tool
        async def probe(self, context: RunContext) -> str:
            """Count the prompt."""
            return str(await context.count_prompt_tokens(ModelRequest([Message.user("q")])))

    model = ScriptedModel(
        [tool_call_response("probe", {}), text_response("done")],
        name="counter",
        count_prompt_tokens=count,  # type: ignore[arg-type]
    )
    with caplog.at_level(logging.WARNING, logger="littleghost.models"):
        result = await Counting(model=model).run("q")
    assert result.output == "done"
    [span] = spans.named("count_tokens ")
    assert span.name == "count_tokens counter" and span.kind is SpanKind.CLIENT
    assert span.status.status_code is status
    assert (span.attributes or {}).get("error.type") == error_type
    figure = (span.attributes or {}).get("littleghost.counted_prompt_tokens")
    assert figure == (17 if answer == 17 else None)
    logged = [r.getMessage() for r in caplog.records if r.name == "littleghost.models"]
    assert len(logged) == (0 if error_type is None else 1)
    assert SECRET not in " ".join(logged)
