"""A first run through the public API."""

from __future__ import annotations

import pytest

from littleghost import Agent, tool
from littleghost.testing import ScriptedModel, text_response, tool_call_response

pytestmark = pytest.mark.anyio


class Adder(Agent):
    instructions = "Add numbers."

    @tool
    async def add(self, a: int, b: int) -> int:
        """Add two numbers."""
        return a + b


async def test_a_tool_round_trip() -> None:
    model = ScriptedModel([tool_call_response("add", {"a": 1, "b": 2}), text_response("3")])
    result = await Adder(model=model).run("1+2?")
    assert result.output == "3"
    assert result.messages[2].tool_results[0].content == "3"
