"""The customer-support agent of the README, run end to end.

    python examples/customer_support.py [MODEL]

MODEL is a model string. By default: ``openai:gpt-4o-mini`` when ``OPENAI_API_KEY`` is
set, ``anthropic:claude-sonnet-4-5`` when ``ANTHROPIC_API_KEY`` is, otherwise ``local``:
SmolLM2-135M on a llama.cpp server started here (extra ``local``). SmolLM2-135M cannot call
tools through llama.cpp; ``local:/path/to/model.gguf`` runs any GGUF model, and one that
can call tools (see "Local models" in docs/models.md) looks the order up. Everything printed is
what the run did: each tool call with its result, or a line saying there was none. When
no model can run, the example says why and exits with 1.
"""

from __future__ import annotations

import json
import os
import sys

import anyio

from littleghost import Agent, Message, RunResult, manage_context, tool
from littleghost.errors import LittleGhostError, OutputLimitError

ORDERS = {"42": "shipped on Monday, arriving Thursday", "7": "waiting for payment"}


@manage_context(compression_threshold=0.75, preserve_recent_messages=12)
class CustomerSupportAgent(Agent):
    instructions = (
        "You help customers of ACME with their orders. Use lookup_order to find an order. "
        "Answer in one or two sentences."
    )
    settings = {"max_tokens": 200}

    @tool
    async def lookup_order(self, order_id: str) -> str:
        """Find an order by its id.

        Args:
            order_id: The order number the customer gave.
        """
        return ORDERS.get(order_id.strip().lstrip("#"), "no such order")


def default_model() -> str:
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4o-mini"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-sonnet-4-5"
    return "local"


def report(question: str, result: RunResult[str], before: int) -> int:
    """Print the turn: the question, every tool call with its result, the answer.

    Returns the number of tool calls the turn made.
    """
    print(f"customer: {question}")
    new = result.messages[before:]
    results = {r.call_id: r for message in new for r in message.tool_results}
    calls = [call for message in new for call in message.tool_calls]
    for call in calls:
        arguments = (
            json.dumps(call.arguments) if not isinstance(call.arguments, str) else call.arguments
        )
        answered = results.get(call.id)
        outcome = answered.content if answered is not None else "(no result)"
        print(f"  tool call: {call.name}({arguments}) -> {outcome}")
    if not calls:
        print("  (no tool calls)")
    answer = result.output.strip()
    print(f"agent:    {answer}" if answer else "agent:    [the model returned an empty answer]")
    return len(calls)


async def main(model: str) -> None:
    print(f"Running CustomerSupportAgent on {model!r}.")
    usage = None
    calls = 0
    history: tuple[Message, ...] = ()
    # Greedy and seeded where the provider takes it (Anthropic's API has no such settings).
    settings = {} if model.startswith("anthropic") else {"temperature": 0, "seed": 7}
    async with CustomerSupportAgent(model=model) as agent:
        for question in ("Where is order 42?", "Thanks!"):
            try:
                result = await agent.run(question, history=history, settings=settings, timeout=300)
            except OutputLimitError as error:
                text = error.response.message.text.strip() if error.response else ""
                print(f"customer: {question}\nagent:    {text} [cut at max_tokens]")
                return
            calls += report(question, result, len(history))
            history = result.messages
            usage = result.usage if usage is None else usage + result.usage
    if usage is not None:
        print(f"usage:    {usage.input_tokens} input tokens, {usage.output_tokens} output tokens")
    if calls == 0:
        print(
            "The model made no tool calls, so its answers do not come from the order data. "
            "Small local models (SmolLM2-135M, the default) cannot call tools through "
            "llama.cpp; docs/models.md, 'Local models', names some that can."
        )


if __name__ == "__main__":
    chosen = sys.argv[1] if len(sys.argv) > 1 else default_model()
    try:
        anyio.run(main, chosen)
    except LittleGhostError as error:
        sys.exit(f"customer_support: cannot run on {chosen!r}: {type(error).__name__}: {error}")
