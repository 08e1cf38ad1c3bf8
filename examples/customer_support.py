"""The customer-support agent of the README, run end to end.

With OPENAI_API_KEY set it talks to OpenAI, with ANTHROPIC_API_KEY to Anthropic;
otherwise it starts the local llama.cpp model (extra ``local``). Without any of these it
falls back to a scripted model and says so.
"""

from __future__ import annotations

import os

import anyio

from littleghost import Agent, manage_context, tool
from littleghost.models import Model
from littleghost.testing import ScriptedModel, text_response, tool_call_response

ORDERS = {"42": "shipped on Monday, arriving Thursday", "7": "waiting for payment"}


@manage_context(compression_threshold=0.75, preserve_recent_messages=12)
class CustomerSupportAgent(Agent):
    model = "openai:gpt-4o-mini"
    instructions = (
        "You help customers of ACME with their orders. Use lookup_order to find an order. "
        "Answer in one or two sentences."
    )
    settings = {"temperature": 0, "seed": 7, "max_tokens": 200}

    @tool
    async def lookup_order(self, order_id: str) -> str:
        """Find an order by its id.

        Args:
            order_id: The order number the customer gave.
        """
        return ORDERS.get(order_id.strip().lstrip("#"), "no such order")


def scripted() -> ScriptedModel:
    """A stand-in that plays the conversation, for machines with no provider at all."""
    return ScriptedModel(
        [
            tool_call_response("lookup_order", {"order_id": "42"}),
            text_response("Order 42 shipped on Monday and arrives on Thursday."),
            text_response("You're welcome! Anything else?"),
        ]
    )


async def choose_model() -> tuple[Model | str, str]:
    """The model to run on, and a line saying which it is."""
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4o-mini", "OpenAI gpt-4o-mini"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-sonnet-4-5", "Anthropic claude-sonnet-4-5"
    try:
        from littleghost.models.local import LocalModel

        local = LocalModel()
        await local.prepare()
    except Exception as error:
        reason = str(error).splitlines()[0]
        return scripted(), f"a ScriptedModel, because the local model cannot run here ({reason})"
    return local, "the local llama.cpp server with SmolLM2-135M-Instruct"


async def main() -> None:
    model, label = await choose_model()
    print(f"Running CustomerSupportAgent on {label}.")
    try:
        async with CustomerSupportAgent(model=model) as agent:
            first = await agent.run("Where is order 42?", timeout=120)
            print("customer: Where is order 42?")
            print(f"agent:    {first.output.strip()}")
            second = await agent.run("Thanks!", history=first.messages, timeout=120)
            print("customer: Thanks!")
            print(f"agent:    {second.output.strip()}")
            usage = first.usage + second.usage
            print(
                f"usage:    {usage.input_tokens} input tokens, {usage.output_tokens} output tokens"
            )
    finally:
        close = getattr(model, "aclose", None)
        if close is not None:
            await close()


if __name__ == "__main__":
    anyio.run(main)
