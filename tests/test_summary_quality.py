"""What the default summary asks for and keeps: one instruction in a fixed structure, an
update of the previous notes, a summary cut at its cap, and observation masking."""

from __future__ import annotations

from typing import Any

import pytest

from littleghost import Agent, Message, ToolCall, manage_context, tool
from littleghost.context import Summarization, apply_compaction, tokens_exceed
from littleghost.context.summarize import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    DEFAULT_UPDATE_INSTRUCTIONS,
    SUMMARY_PREFIX,
)
from littleghost.errors import ConfigurationError
from littleghost.events import CompactionFinished
from littleghost.models import ModelRequest, ModelResponse, StopReason
from littleghost.testing import Fact, ScriptedModel, check_retention, text_response

pytestmark = pytest.mark.anyio


class PerMessage:
    """One token per counted text."""

    def count_tokens(self, text: str) -> int:
        return 1


def chat(pairs: int, prefix: str = "m") -> list[Message]:
    return [
        message
        for index in range(pairs)
        for message in (
            Message.user(f"{prefix} question {index}"),
            Message.assistant(f"{prefix} answer {index}"),
        )
    ]


def summary(text: str, stop: StopReason = StopReason.END_TURN) -> Any:
    def answer(request: ModelRequest) -> ModelResponse:
        assert request.purpose == "context_compaction"
        return text_response(text, stop_reason=stop)

    return answer


@manage_context(
    context_window_tokens=100,
    compression_threshold=0.5,
    preserve_recent_messages=4,
    tokenizer=PerMessage(),
)
class Small(Agent):
    instructions = "Be brief."


async def outcomes(agent: Agent, text: str, history: list[Message]) -> list[str | None]:
    """The ``summary_outcome`` of each compaction of one streamed run."""
    found = []
    async with agent.stream(text, history=history) as events:
        async for event in events:
            if isinstance(event, CompactionFinished):
                found.append(event.summary_outcome)
    return found


class TestTheRequest:
    async def test_one_instruction_in_a_fixed_structure_and_only_data_after_it(self) -> None:
        model = ScriptedModel([summary("Goal: x"), text_response("done")])
        await Small(model=model).run("go", history=chat(30))
        instruction, data = model.requests[0].messages
        assert instruction.text == DEFAULT_SUMMARY_INSTRUCTIONS
        for heading in ("Goal:", "Facts:", "Decisions:", "Open:"):
            assert heading in instruction.text
        assert "copied exactly" in instruction.text
        assert data.text.startswith("Transcript:\n<<<\n") and data.text.endswith("\n>>>")

    async def test_summary_instructions_replace_the_instruction_for_updates_too(self) -> None:
        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
            summary_instructions="List the cities.",
        )
        class Cities(Agent):
            pass

        model = ScriptedModel(
            [summary("Paris"), text_response("one"), summary("Paris, Oslo"), text_response("two")]
        )
        agent = Cities(model=model)
        one = await agent.run("go", history=chat(30))
        await agent.run("again", history=[*one.messages, *chat(20, "more")])
        first, update = model.requests[0], model.requests[2]
        assert [m.text for m in first.messages[:1]] == ["List the cities."]
        assert [m.text for m in update.messages[:1]] == ["List the cities."]
        assert len(first.messages) == len(update.messages) == 2

    async def test_a_later_compaction_updates_the_notes_with_their_facts(self) -> None:
        notes = "Goal: replace a router\nFacts:\n- order A-1234\n- paid 89.90 EUR"
        model = ScriptedModel(
            [summary(notes), text_response("one"), summary(notes + "\n- new"), text_response("2")]
        )
        agent = Small(model=model)
        one = await agent.run("go", history=chat(30))
        await agent.run("again", history=[*one.messages, *chat(20, "more")])
        instruction, data = model.requests[2].messages
        assert instruction.text == DEFAULT_UPDATE_INSTRUCTIONS
        assert data.text.startswith(f"Current notes:\n<<<\n{notes}\n>>>\n\nConversation since:")
        since = data.text.split("Conversation since:")[1]
        assert "more question 0" in since and "m question 0" not in since
        assert SUMMARY_PREFIX not in data.text


class TestTheOutputCap:
    async def test_a_complete_summary_is_kept_whole(self) -> None:
        model = ScriptedModel([summary("Goal: x\nFacts:\n- a"), text_response("done")])
        assert await outcomes(Small(model=model), "go", chat(30)) == ["complete"]

    async def test_a_cut_summary_keeps_its_complete_lines(self) -> None:
        cut = summary("Goal: router\nFacts:\n- order A-1234\n- paid 89.", StopReason.MAX_TOKENS)
        model = ScriptedModel([cut, text_response("done")])
        agent = Small(model=model)
        assert await outcomes(agent, "go", chat(30)) == ["cut_at_cap"]
        sent = [m.text for m in model.requests[1].messages if m.is_summary]
        assert sent == [SUMMARY_PREFIX + "Goal: router\nFacts:\n- order A-1234"]

    async def test_a_cut_summary_with_only_headings_is_asked_for_once_more_shorter(self) -> None:
        model = ScriptedModel(
            [
                summary("Goal:\nFacts:\n- ord", StopReason.MAX_TOKENS),
                summary("Goal: router"),
                text_response("done"),
            ]
        )
        assert await outcomes(Small(model=model), "go", chat(30)) == ["retried_shorter"]
        first, second = model.requests[0], model.requests[1]
        assert second.messages[1].text == first.messages[1].text  # the same transcript
        assert second.messages[0].text.startswith(first.messages[0].text)
        assert "Keep the notes short: at most about 12 words." in second.messages[0].text
        sent = [m.text for m in model.requests[2].messages if m.is_summary]
        assert sent == [SUMMARY_PREFIX + "Goal: router"]


def tool_history(groups: int, result_chars: int) -> list[Message]:
    history: list[Message] = [Message.user("Check my orders.")]
    for index in range(groups):
        call = ToolCall(f"c{index}", "lookup", {"order": f"A-{index}"})
        history.append(Message.assistant(tool_calls=[call]))
        history.append(Message.tool(f"c{index}", f"order A-{index}: " + "x" * result_chars))
    history.append(Message.assistant("All found."))
    return history


class Orders(Agent):
    @tool
    def lookup(self, order: str) -> str:
        """Look an order up."""
        return order


class TestMasking:
    async def test_masking_alone_can_bring_the_request_under_the_threshold(self) -> None:
        @manage_context(context_window_tokens=2_000, compression_threshold=0.5, mask_tool_results=1)
        class Masked(Orders):
            pass

        history = tool_history(6, 600)
        model = ScriptedModel([text_response("done")])
        result = await Masked(model=model).run("And now?", history=history)
        assert [request.purpose for request in model.requests] == ["chat"]
        sent = model.requests[0].messages
        placeholders = [m.text for m in sent if m.text.startswith("[Tool results omitted")]
        assert placeholders[0] == (
            '[Tool results omitted to save context: lookup({"order": "A-0"}) (611 characters)]'
        )
        whole = [r.call_id for m in sent for r in m.tool_results]
        assert whole == [f"c{i}" for i in range(len(placeholders), 6)]  # oldest masked first
        assert 1 <= len(placeholders) <= 5  # only as many as the threshold needs
        assert list(result.messages[: len(history)]) == history  # the log keeps every result

    async def test_when_masking_is_not_enough_the_summary_sees_the_placeholders(self) -> None:
        @manage_context(context_window_tokens=2_000, compression_threshold=0.5, mask_tool_results=1)
        class Masked(Orders):
            pass

        history = [*tool_history(6, 600), *chat(20, "long " * 40)]
        model = ScriptedModel([summary("Goal: orders"), text_response("done")])
        await Masked(model=model).run("And now?", history=history)
        transcript = model.requests[0].messages[1].text
        assert '[Tool results omitted to save context: lookup({"order": "A-0"})' in transcript
        assert "x" * 100 not in transcript

    async def test_summarization_masks_first_and_summarizes_only_when_still_over(self) -> None:
        over = tokens_exceed(350)
        history = tool_history(4, 400)
        quiet = ScriptedModel([])
        view = await apply_compaction(
            history, Summarization(model=quiet, mask_tool_results=2, trigger=over)
        )
        assert len([m for m in view if m.text.startswith("[Tool results omitted")]) == 2
        assert quiet.requests == []
        busy = ScriptedModel([summary("Goal: orders")])
        view = await apply_compaction(
            history, Summarization(model=busy, mask_tool_results=2, trigger=tokens_exceed(100))
        )
        assert "[Tool results omitted" in busy.requests[0].messages[1].text
        assert any(m.is_summary for m in view)


class TestCheckRetention:
    def conversation(self) -> list[Message]:
        return [
            Message.user("My order is A-1234."),
            Message.assistant("Thanks."),
            Message.user("I live in Oslo."),
            Message.assistant("Noted."),
            *chat(10),
        ]

    async def test_reports_which_facts_the_compaction_kept_and_the_agent_gave(self) -> None:
        model = ScriptedModel(
            [
                summary("Goal: a refund\nFacts:\n- order A-1234"),
                text_response("Your order is a-1234."),
                text_response("I do not know where you live."),
            ]
        )
        facts = [Fact("What is my order?", "A-1234"), Fact("Where do I live?", ("Oslo", "oslo"))]
        report = await check_retention(Small(model=model), self.conversation(), facts)
        assert [(c.in_view, c.answered) for c in report.checks] == [(True, True), (False, False)]
        assert (report.kept, report.answered) == (1, 1)
        assert report.summary == "Goal: a refund\nFacts:\n- order A-1234"
        asked = [request for request in model.requests if request.purpose == "chat"]
        assert [r.messages[-1].text for r in asked] == [f.question for f in facts]
        for request in asked:  # each question sees the compacted log, not the other answers
            assert any(m.is_summary for m in request.messages)
            assert not any("Oslo" in m.text for m in request.messages)
        assert "LOST MISS Where do I live? -> Oslo" in str(report)

    async def test_needs_manage_context_and_facts(self) -> None:
        with pytest.raises(ConfigurationError, match="has no @manage_context"):
            await check_retention(Agent(model=ScriptedModel([])), chat(3), [Fact("?", "x")])
        with pytest.raises(ConfigurationError, match="at least one Fact"):
            await check_retention(Small(model=ScriptedModel([])), chat(3), [])
        with pytest.raises(ConfigurationError, match=r"Fact\.expected"):
            Fact("?", "")
