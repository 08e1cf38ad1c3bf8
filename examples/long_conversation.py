"""A conversation long enough to compact, printing each compaction as it happens.

Runs on the local llama.cpp model (extra ``local``, with a 1 024-token window so that a
few turns fill it) or, without it, on a scripted model. Each turn is streamed; the
compaction events show the estimated tokens before and after.
"""

from __future__ import annotations

import anyio

from littleghost import Agent, manage_context
from littleghost.events import CompactionFinished, CompactionStarted
from littleghost.models import Model
from littleghost.testing import ScriptedModel, text_response

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


def choose_model() -> tuple[Model, str]:
    try:
        from littleghost.models.local import LocalModel, default_model_path

        default_model_path()
        return LocalModel(n_ctx=1024), "the local llama.cpp server (SmolLM2-135M, 1 024-token window)"
    except Exception:
        answers = []
        for index in range(len(QUESTIONS)):
            answers.append(text_response("A summary of the trip so far."))
            answers.append(text_response(f"Answer {index}: " + "a detailed suggestion " * 40))
        return ScriptedModel(answers, context_window=1024), "a ScriptedModel with a 1 024-token window"


async def main() -> None:
    model, label = choose_model()
    print(f"Running TravelAgent on {label}.")
    history: tuple = ()
    async with TravelAgent(model=model) as agent:
        try:
            for question in QUESTIONS:
                print(f"\nuser: {question}")
                async with agent.stream(question, history=history, timeout=300) as events:
                    async for event in events:
                        if isinstance(event, CompactionStarted):
                            print(
                                f"  [compaction started: {event.reason}, ~{event.estimated_tokens} "
                                f"of {event.context_window_tokens} tokens]"
                            )
                        elif isinstance(event, CompactionFinished):
                            after = event.estimated_tokens_after
                            print(
                                f"  [compaction {event.outcome}: removed {event.removed_messages} "
                                f"messages, ~{after} tokens after"
                                + (f", error {event.error_type}" if event.error_type else "")
                                + "]"
                            )
                result = events.result
                print(f"assistant: {result.output.strip()}")
                history = result.messages
        finally:
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()
    summaries = sum(message.is_summary for message in history)
    print(f"\nThe log holds {len(history)} messages, {summaries} of them summaries; none was lost.")


if __name__ == "__main__":
    anyio.run(main)
