"""A conversation long enough to compact, printing each compaction as it happens.

Runs on the local llama.cpp model (extra ``local``) with a 1 024-token window, so that a
few turns fill it. Each turn is streamed; the compaction events show the estimated
tokens before and after. When the local model cannot run, the example says why and exits
with 1.
"""

from __future__ import annotations

import sys

import anyio

from littleghost import Agent, Message, manage_context
from littleghost.errors import LittleGhostError, OutputLimitError
from littleghost.events import CompactionFinished, CompactionStarted
from littleghost.models.local import LocalModel

QUESTIONS = [
    "I am planning a week in Lisbon in May. What neighbourhoods should I stay in?",
    "Which day trips by train are worth it from there?",
    "What should I eat at least once, and where?",
    "How do I get from the airport to Alfama with luggage?",
    "Is the Lisboa Card worth it for four museum visits?",
    "What should I pack for the weather in May?",
    "Remind me: which neighbourhood did you suggest first, and why?",
]


@manage_context(compression_threshold=0.6, preserve_recent_messages=4, summary_max_tokens=160)
class TravelAgent(Agent):
    instructions = "You are a concise travel assistant. Answer in at most three sentences."
    settings = {"temperature": 0, "seed": 7, "max_tokens": 120}


def report(event: object) -> None:
    """Print the compaction events of a streamed turn."""
    if isinstance(event, CompactionStarted):
        print(
            f"  [compaction started: {event.reason}, ~{event.estimated_tokens} "
            f"of {event.context_window_tokens} tokens]"
        )
    elif isinstance(event, CompactionFinished):
        outcome = f"compaction {event.outcome}: removed {event.removed_messages} messages"
        if event.estimated_tokens_after is not None:
            outcome += f", ~{event.estimated_tokens_after} tokens after"
        if event.error_type:
            outcome += f", error {event.error_type}"
        print(f"  [{outcome}]")


async def main() -> None:
    model = LocalModel(n_ctx=1024)
    print(f"Running TravelAgent on the local model {model.name} (1 024-token window).")
    history: tuple[Message, ...] = ()
    async with TravelAgent(model=model) as agent:
        try:
            for question in QUESTIONS:
                print(f"\nuser: {question}")
                events = agent.stream(question, history=history, timeout=300)
                try:
                    async with events:
                        async for event in events:
                            report(event)
                    answer = events.result.output.strip()
                    print(f"assistant: {answer or '[the model returned an empty answer]'}")
                except OutputLimitError as error:  # a small model may ramble to its cap
                    text = error.response.message.text.strip() if error.response else ""
                    print(f"assistant: {text} [cut at max_tokens]")
                history = events.messages
        finally:
            await model.aclose()
    summaries = sum(message.is_summary for message in history)
    print(f"\nThe log holds {len(history)} messages, {summaries} of them summaries; none was lost.")


if __name__ == "__main__":
    try:
        anyio.run(main)
    except LittleGhostError as error:
        sys.exit(f"long_conversation: cannot run: {type(error).__name__}: {error}")
