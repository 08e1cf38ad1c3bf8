"""A hostile model (or a gateway that a prompt injection or a breach made one): answers
whose size or metadata it chooses. The work a run does stays in proportion to what the
answer holds, and what telemetry records of it without ``capture_content`` stays small.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from littleghost import Agent, Message, ToolCall, tool
from littleghost.errors import LimitExceededError
from littleghost.models import Model, ModelResponse
from littleghost.models import answer_json as answer_json_module
from littleghost.models import anthropic as anthropic_module
from littleghost.telemetry import REPORTED_CHARS
from littleghost.testing import ScriptedModel, text_response
from tests.conftest import Histograms, Spans
from tests.sdk_bodies import (
    FakeServer,
    SDKClients,
    anthropic_sse,
    chunk,
    event_stream,
    finish,
    message_start,
    openai_sse,
    text_block,
    tool_use_block,
)


class CountedId(str):
    """A call id counting how often ids are compared (a scan for one among many)."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        CountedId.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


class Echo(Agent):
    @tool
    async def echo(self, x: int) -> str:
        """Echo x."""
        return str(x)


def _comparisons(calls: int, max_tool_calls: int) -> int:
    """How often call ids were compared in a run whose model answers with ``calls``
    calls at once, then with text."""
    CountedId.compared = 0
    answer = Message.assistant(
        tool_calls=[ToolCall(CountedId(f"call_{i}"), "echo", {"x": i}) for i in range(calls)]
    )
    model = ScriptedModel(
        [ModelResponse(answer, stop_reason="tool_use"), ModelResponse(Message.assistant("ok"))]
    )
    try:
        Echo(model=model, max_tool_calls=max_tool_calls).run_sync("go")
    except LimitExceededError:
        assert max_tool_calls < calls
    return CountedId.compared


@pytest.mark.parametrize("max_tool_calls", [10, 10_000], ids=["refused", "run"])
def test_the_calls_of_one_answer_are_paired_in_work_linear_in_their_number(
    max_tool_calls: int,
) -> None:
    """An answer of many calls, answered whole as over ``max_tool_calls`` or run, is not
    scanned once per call: four times the calls, at most about four times the work (an
    answer of 100 000 calls held the event loop for minutes)."""
    few, many = _comparisons(200, max_tool_calls), _comparisons(800, max_tool_calls)
    assert many <= 5 * max(few, 200)


CAPTURED = ("gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments")
"""Span attributes holding content (``capture_content``), whole by design."""


@pytest.mark.parametrize("capture_content", [False, True])
def test_ids_and_names_a_model_gives_are_bounded_in_telemetry(
    capture_content: bool, spans: Spans, histograms: Histograms
) -> None:
    """An answer's id and model, its calls' ids and an undeclared tool's name, of any
    length a hostile server sends, are cut to ``REPORTED_CHARS`` in spans (their names
    too) and metrics: a span of megabytes would make a collector refuse its whole batch,
    and each model name is a metric series kept for the process's life."""
    draw = random.Random(7)
    for _ in range(6):
        spans.clear()

        def text(tag: str) -> str:
            return tag + "".join(draw.choice("ab\n ☃") for _ in range(draw.randrange(2_000)))

        calls = [ToolCall(text("id"), "echo", {"x": 1}), ToolCall(text("id"), text("name"), {})]
        answer = ModelResponse(
            Message.assistant(tool_calls=calls),
            stop_reason="tool_use",
            response_id=text("rid"),
            response_model=text("model"),
        )
        model = ScriptedModel([answer, text_response("done")])
        Echo(model=model, capture_content=capture_content).run_sync("go")
        for span in spans.all():
            assert len(span.name) <= REPORTED_CHARS + len("execute_tool ")
            for name, value in dict(span.attributes or {}).items():
                if name not in CAPTURED:
                    assert len(str(value)) <= REPORTED_CHARS, name
        assert all(len(value) <= REPORTED_CHARS for value in histograms.every_text())


class CountedPiece(str):
    """A streamed piece counting the characters a concatenation onto it copies (and
    how many were made: a provider reading its events otherwise would count nothing)."""

    copied = made = 0

    def __radd__(self, other: str) -> str:
        CountedPiece.copied += len(other)
        return str.__add__(other, self)


class CountingJson:
    """The ``json`` module, but each str it reads a ``CountedPiece``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)

    @staticmethod
    def loads(data: str | bytes, **options: Any) -> Any:
        def counted(value: Any) -> Any:
            if isinstance(value, str):
                CountedPiece.made += 1
                return CountedPiece(value)
            if isinstance(value, list):
                return [counted(item) for item in value]
            return value

        return json.loads(data, object_hook=lambda o: {k: counted(v) for k, v in o.items()})


def _streamed_arguments(provider: str, pieces: list[str]) -> Any:
    if provider == "openai":
        first = {"id": "call_1", "type": "function", "function": {"name": "keep"}}
        events = [
            chunk({"tool_calls": [{"index": 0, **first}]}),
            *(chunk({"tool_calls": [{"index": 0, "function": {"arguments": p}}]}) for p in pieces),
            chunk({}, "tool_calls"),
        ]
        return event_stream(openai_sse(*events))
    blocks = tool_use_block(0, "toolu_1", "keep", *pieces)
    return event_stream(anthropic_sse(message_start(), *blocks, *finish("tool_use", 5)))


@pytest.mark.anyio
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_streamed_answer_is_joined_once_not_copied_piece_by_piece(
    provider: str, sdk_clients: SDKClients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Text and a call's arguments streamed in many small pieces are joined once read:
    adding each piece to the text so far copied it each time, work growing with the
    square of the answer (a hostile server's 4 MB of arguments in 16-byte pieces took
    54 s)."""
    monkeypatch.setattr(answer_json_module, "json", CountingJson())  # the events' reader
    arguments = json.dumps({"text": "y" * 20_000})
    pieces = [arguments[i : i + 16] for i in range(0, len(arguments), 16)]
    answers = [_streamed_arguments(provider, pieces)]
    if provider == "openai":
        answers.append(event_stream(openai_sse(chunk({"content": "fine"}, "stop"))))
        model: Model = sdk_clients.openai_model(FakeServer(*answers))
    else:
        answers.append(
            event_stream(
                anthropic_sse(message_start(), *text_block(0, "fine"), *finish("end_turn", 1))
            )
        )
        model = sdk_clients.anthropic_model(FakeServer(*answers))
    kept: list[int] = []

    class Keeper(Agent):
        @tool
        async def keep(self, text: str) -> str:
            """Keep text."""
            kept.append(len(text))
            return "kept"

    CountedPiece.copied = CountedPiece.made = 0
    async with Keeper(model=model).stream("go") as events:
        async for _ in events:
            pass
    assert kept == [20_000]
    assert CountedPiece.made >= len(pieces)
    assert CountedPiece.copied <= 4 * len(arguments)


@pytest.mark.anyio
async def test_events_after_an_answer_s_stop_do_not_join_its_text_again(
    sdk_clients: SDKClients, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each event after ``message_stop`` (a proxy's pings, before a stop reason) asks
    whether the answer came whole, which looks at calls' inputs only: joining the text
    each time made the work grow with the text times the events."""
    joined: list[int] = []
    real = anthropic_module._joined

    def counting(blocks: Any, pieces: Any) -> Any:
        result = real(blocks, pieces)
        joined.append(sum(len(str(block.get("text", ""))) for block in result.values()))
        return result

    monkeypatch.setattr(anthropic_module, "_joined", counting)
    text = "y" * 20_000
    pieces = [text[i : i + 16] for i in range(0, len(text), 16)]
    pings = [{"type": "ping"}] * 200
    body = anthropic_sse(message_start(), *text_block(0, *pieces), {"type": "message_stop"}, *pings)
    model = sdk_clients.anthropic_model(FakeServer(event_stream(body)))
    result = await Agent(model=model).run("go")
    assert result.output == text
    assert joined and sum(joined) <= 2 * len(text)
