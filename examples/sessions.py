"""A support conversation kept in an SQLite file across runs, to inspect afterwards with
the ``littleghost`` command line.

    python examples/sessions.py [MODEL]

Each question is a run of its own (as each request of a web application would be), in
session ``customer-42`` of ``sessions.db`` in the current directory: the store keeps the
log between runs, and ``@manage_context`` summarizes the older turns once they fill a
1 024-token working window. MODEL is a model string; by default ``openai:gpt-4o-mini``
when ``OPENAI_API_KEY`` is set, ``anthropic:claude-sonnet-4-5`` when ``ANTHROPIC_API_KEY``
is, otherwise ``local`` (SmolLM2-135M on a llama.cpp server started here, extra
``local``). The session starts afresh each time the example runs. Then, from the
repository's root:

    littleghost sessions list --store sqlite:///sessions.db
    littleghost sessions show customer-42 --store sqlite:///sessions.db
    littleghost sessions view customer-42 --store sqlite:///sessions.db --agent examples.sessions:SupportDesk
    littleghost sessions compact customer-42 --store sqlite:///sessions.db --agent examples.sessions:SupportDesk --dry-run
    littleghost sessions export customer-42 --store sqlite:///sessions.db

When no model can run, the example says why and exits with 1.
"""

from __future__ import annotations

import os
import sys

import anyio

from littleghost import Agent, manage_context, tool
from littleghost.errors import LittleGhostError, OutputLimitError, UnknownSessionError
from littleghost.sessions import SQLiteSessionStore

SESSION = "customer-42"
STORE = SQLiteSessionStore("sessions.db")
ORDERS = {"42": "shipped on Monday, arriving Thursday", "7": "waiting for payment"}
QUESTIONS = [
    "Hi, I ordered a desk lamp, order 42. Where is it?",
    "Can it be left with my neighbour at number 12 if I am out?",
    "I also have order 7, a chair. What is happening with that one?",
    "What payment methods can I use for it?",
    "How long do you keep an order before sending it back?",
    "Can I change the delivery day for the lamp?",
    "Do you deliver on Saturdays?",
    "Remind me: what did I say about my neighbour?",
]


def default_model() -> str:
    if os.environ.get("OPENAI_API_KEY"):
        return "openai:gpt-4o-mini"
    if os.environ.get("ANTHROPIC_API_KEY"):
        return "anthropic:claude-sonnet-4-5"
    return "local"


@manage_context(
    context_window_override=1_024,
    compression_threshold=0.5,
    preserve_recent_messages=4,
    summary_max_tokens=160,
)
class SupportDesk(Agent):
    model = default_model()
    instructions = (
        "You help customers of ACME with their orders. Use lookup_order to find an order. "
        "Answer in one or two sentences."
    )
    settings = {"max_tokens": 120}
    session_store = STORE

    @tool
    async def lookup_order(self, order_id: str) -> str:
        """Find an order by its id.

        Args:
            order_id: The order number the customer gave.
        """
        return ORDERS.get(order_id.strip().lstrip("#"), "no such order")


async def main(model: str) -> None:
    print(f"Running SupportDesk on {model!r}, session {SESSION!r} in sessions.db.")
    # Greedy and seeded where the provider takes it (Anthropic's API has no such settings).
    settings = {} if model.startswith("anthropic") else {"temperature": 0, "seed": 7}
    try:
        await STORE.delete(SESSION)
    except UnknownSessionError:
        pass
    async with STORE, SupportDesk(model=model) as agent:
        for question in QUESTIONS:
            print(f"customer: {question}")
            try:
                result = await agent.run(
                    question, session_id=SESSION, settings=settings, timeout=300
                )
                answer = result.output.strip() or "[the model returned an empty answer]"
            except OutputLimitError as error:  # a small model may ramble to its cap
                text = error.response.message.text.strip() if error.response else ""
                answer = f"{text} [cut at max_tokens]"
            print(f"agent:    {answer}")
        log = await STORE.load(SESSION)
    summaries = sum(message.is_summary for message in log)
    print(f"The session holds {len(log)} messages, {summaries} of them summaries.")


if __name__ == "__main__":
    chosen = sys.argv[1] if len(sys.argv) > 1 else default_model()
    try:
        anyio.run(main, chosen)
    except LittleGhostError as error:
        sys.exit(f"sessions: cannot run on {chosen!r}: {type(error).__name__}: {error}")
