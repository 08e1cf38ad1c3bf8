"""A conversation long enough to compact, printing each compaction as it happens.

Runs on the local llama.cpp model (extra ``local``, with a 1 024-token window so that a
few turns fill it) or, without it, on a scripted model. Each turn is streamed; the
compaction events show the estimated tokens before and after.
"""

from __future__ import annotations

import anyio

from littleghost import Agent, manage_context
from littleghost.errors import OutputLimitError
from littleghost.events import CompactionFinished, CompactionStarted
from littleghost.models import Model, ModelRequest, ModelResponse
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


def scripted() -> ScriptedModel:
    """Answers long enough to fill a 1 024-token window in a few turns."""
    answers = iter(range(100))

    def answer(request: ModelRequest) -> ModelResponse:
        if request.purpose == "context_compaction":
            return text_response("The user is planning a week in Lisbon in May.")
        return text_response(f"Answer {next(answers)}: " + "a detailed suggestion " * 40)

    return ScriptedModel([answer] * 100, context_window=1024)


async def choose_model() -> tuple[Model, str]:
    try:
        from littleghost.models.local import LocalModel

        local = LocalModel(n_ctx=1024)
        await local.prepare()
    except Exception as error:
        reason = str(error).splitlines()[0]
        return scripted(), f"a ScriptedModel with a 1 024-token window ({reason})"
    return local, "the local llama.cpp server (SmolLM2-135M, 1 024-token window)"


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
    model, label = await choose_model()
    print(f"Running TravelAgent on {label}.")
    history: tuple = ()
    async with TravelAgent(model=model) as agent:
        try:
            for question in QUESTIONS:
                print(f"\nuser: {question}")
                events = agent.stream(question, history=history, timeout=300)
                try:
                    async with events:
                        async for event in events:
                            report(event)
                    print(f"assistant: {events.result.output.strip()}")
                except OutputLimitError as error:  # a small model may ramble to its cap
                    text = error.response.message.text.strip() if error.response else ""
                    print(f"assistant: {text} [cut at the output limit]")
                history = events.messages
        finally:
            close = getattr(model, "aclose", None)
            if close is not None:
                await close()
    summaries = sum(message.is_summary for message in history)
    print(f"\nThe log holds {len(history)} messages, {summaries} of them summaries; none was lost.")


if __name__ == "__main__":
    anyio.run(main)
