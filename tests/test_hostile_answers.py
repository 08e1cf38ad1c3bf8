"""A hostile model (or a gateway that a prompt injection or a breach made one): answers
whose size or metadata it chooses. The work a run does stays in proportion to what the
answer holds, and what telemetry records of it without ``capture_content`` stays small.
"""

from __future__ import annotations

import pytest

from littleghost import Agent, Message, ToolCall, tool
from littleghost.errors import LimitExceededError
from littleghost.models import ModelResponse
from littleghost.testing import ScriptedModel


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
