"""A hostile model (or a gateway that a prompt injection or a breach made one): answers
whose size or metadata it chooses. The work a run does stays in proportion to what the
answer holds, and what telemetry records of it without ``capture_content`` stays small.
"""

from __future__ import annotations

import random

import pytest

from littleghost import Agent, Message, ToolCall, tool
from littleghost.errors import LimitExceededError
from littleghost.models import ModelResponse
from littleghost.telemetry import REPORTED_CHARS
from littleghost.testing import ScriptedModel, text_response
from tests.conftest import Histograms, Spans


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
