"""A bounded prompt view: every request fits a hard budget, and no model call is spent on
context.

A workflow agent with a long tool-heavy history and saved memories runs under
``manage_context(budget=PromptBudget(...), summarize=False)``. The log keeps everything;
each request is a view built to fit the budget. The ``littleghost.prompt_budget`` and
``littleghost.context_budget`` log records show the figures (never content). Runs on the
local llama.cpp model (extra ``local``); when it cannot run, the example says why and
exits with 1.
"""

from __future__ import annotations

import logging
import sys

import anyio

from littleghost import Agent, Message, ToolCall, manage_context, tool
from littleghost.context import PromptBudget
from littleghost.errors import LittleGhostError
from littleghost.models.local import LocalModel

MEMORIES = [
    "The customer prefers email over phone.",
    "Orders ship from the Lyon warehouse.",
    "Refunds over 500 EUR need a manager's approval.",
]


async def memories(context: object) -> list[str]:
    """Saved memories, oldest first (a real app would read them from its store)."""
    return MEMORIES


@manage_context(
    budget=PromptBudget(
        prompt_budget_tokens=1_500,
        response_reserve_tokens=200,
        safety_reserve_tokens=200,
        memory=memories,
        memory_tokens=120,
    ),
    summarize=False,
)
class OrderDesk(Agent):
    instructions = "You answer questions about orders in one sentence."
    settings = {"temperature": 0, "seed": 7}

    @tool
    async def lookup_order(self, order_id: str) -> str:
        """Find an order by its id.

        Args:
            order_id: The order number.
        """
        return f"order {order_id}: shipped from Lyon, " + "tracking event; " * 40


def history(turns: int) -> list[Message]:
    """A long conversation with one tool call per turn."""
    messages: list[Message] = []
    for index in range(turns):
        call = ToolCall(f"call-{index}", "lookup_order", {"order_id": str(index)})
        messages += [
            Message.user(f"Where is order {index}?"),
            Message.assistant(tool_calls=[call]),
            Message.tool(call.id, f"order {index}: shipped from Lyon, " + "tracking event; " * 40),
            Message.assistant(f"Order {index} has shipped from Lyon."),
        ]
    return messages


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="  %(name)s: %(message)s")
    model = LocalModel(n_ctx=2048)
    print(f"Running OrderDesk on the local model {model.name} (2 048-token window).")
    log = history(200)
    print(f"The log holds {len(log)} messages before the run.")
    try:
        async with OrderDesk(model=model) as agent:
            result = await agent.run("And where is order 7?", history=log, timeout=120)
    finally:
        await model.aclose()
    answer = result.output.strip()
    print(f"assistant: {answer or '[the model returned an empty answer]'}")
    print(f"The log holds {len(result.messages)} messages after the run; none was dropped.")


if __name__ == "__main__":
    try:
        anyio.run(main)
    except LittleGhostError as error:
        sys.exit(f"bounded_view: cannot run: {type(error).__name__}: {error}")
