"""What the default summary asks for and keeps: one instruction after the data, notes
anchored (new notes appended, full notes rewritten), a summary cut at its cap, repeated
lines dropped, and observation masking."""

from __future__ import annotations

import json
import random
import unicodedata

import attrs
import pytest

from littleghost import (
    Agent,
    Message,
    Role,
    RunContext,
    ToolCall,
    before_model,
    manage_context,
    tool,
)
from littleghost.context import (
    PromptBudget,
    SlidingWindow,
    Summarization,
    Truncation,
    apply_compaction,
    build_view,
    tokens_exceed,
)
from littleghost.context.strategies import SUMMARY_FLOOR_TOKENS
from littleghost.context.summarize import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    DEFAULT_UPDATE_INSTRUCTIONS,
    QUOTES_HEADING,
    SUMMARY_FRAMING,
    SUMMARY_PREFIX,
    render_transcript,
    summary_message,
)
from littleghost.errors import ConfigurationError
from littleghost.events import CompactionFinished
from littleghost.models import ModelRequest, StopReason
from littleghost.testing import Fact, ScriptedModel, check_retention, text_response

from .conversations import PerMessage, chat, compacted_twice, summary_step

pytestmark = pytest.mark.anyio


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
    async def test_the_data_then_one_instruction_asking_for_facts_copied_exactly(self) -> None:
        model = ScriptedModel([summary_step("- order A-1"), text_response("done")])
        await Small(model=model).run("go", history=chat(30))
        framing, data = model.requests[0].messages
        assert framing.text == SUMMARY_FRAMING
        assert data.text.startswith("Transcript:\n<<<\n")
        assert data.text.endswith("\n>>>\n\n" + DEFAULT_SUMMARY_INSTRUCTIONS)
        for asked in ("bulleted list", "copied exactly", "what the user wants", "still open"):
            assert asked in DEFAULT_SUMMARY_INSTRUCTIONS
        assert "?" not in DEFAULT_SUMMARY_INSTRUCTIONS + SUMMARY_FRAMING  # no closing question

    async def test_summary_instructions_replace_the_instruction_for_later_notes_too(
        self,
    ) -> None:
        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
            summary_instructions="List the cities.",
        )
        class Cities(Agent):
            pass

        model, _ = await compacted_twice(Cities, "Paris", "Oslo")
        for request in (model.requests[0], model.requests[2]):
            _framing, data = request.messages
            assert data.text.endswith(">>>\n\nList the cities.")
            assert DEFAULT_SUMMARY_INSTRUCTIONS not in data.text
        sent = [m.text for m in model.requests[3].messages if m.is_summary]
        assert sent == [SUMMARY_PREFIX + "Paris\nOslo"]


class TestAnchoredNotes:
    async def test_later_notes_cover_only_what_is_new_and_are_appended(self) -> None:
        notes = "- order A-1234\n- paid 89.90 EUR"
        model, two = await compacted_twice(Small, notes, "- Paid 89.90  EUR\n- new router B-9")
        _framing, data = model.requests[2].messages
        assert data.text.startswith("Transcript:\n<<<\n")
        assert data.text.endswith(DEFAULT_SUMMARY_INSTRUCTIONS)
        assert "A-1234" not in data.text and "m question 0" not in data.text
        assert "more question 0" in data.text
        merged = SUMMARY_PREFIX + notes + "\n- new router B-9"  # the repeated line dropped
        assert [m.text for m in model.requests[3].messages if m.is_summary] == [merged]
        first, second = [m for m in two.messages if m.is_summary]
        assert second.text == merged and first.text == SUMMARY_PREFIX + notes

    async def test_notes_that_reached_the_cap_are_rewritten_within_half_of_it(self) -> None:
        full = "\n".join(f"- fact {index}: value V-{index:04d}" for index in range(40))
        history = [summary_message(full, ["gone"]), *chat(8)]
        model = ScriptedModel([summary_step("- fact 0: value V-0000\n- open: none")])
        strategy = Summarization(model=model, max_tokens=200, quote_specifics=False)
        view = await apply_compaction(history, strategy)
        (request,) = model.requests
        data = request.messages[1].text
        assert data.startswith(f"Current notes:\n<<<\n{full}\n>>>\n\nConversation since:")
        assert data.endswith(DEFAULT_UPDATE_INSTRUCTIONS)
        assert request.settings["max_tokens"] == 100
        assert view[0].text == SUMMARY_PREFIX + "- fact 0: value V-0000\n- open: none"

    async def test_notes_under_the_cap_are_not_rewritten(self) -> None:
        history = [summary_message("- order A-1", ["gone"]), *chat(8)]
        model = ScriptedModel([summary_step("- city Oslo")])
        view = await apply_compaction(history, Summarization(model=model, max_tokens=200))
        data = model.requests[0].messages[1].text
        assert data.startswith("Transcript:\n<<<\n") and "A-1" not in data
        assert model.requests[0].settings["max_tokens"] == 64  # the floor, for 3 short turns
        assert view[0].text == SUMMARY_PREFIX + "- order A-1\n- city Oslo"


class TestTheOutputCap:
    async def test_the_cap_is_at_most_half_of_what_the_summary_replaces(self) -> None:
        async def cap(words: int, max_tokens: int = 4_096) -> int | None:
            text = " ".join(f"w{index:04d}" for index in range(words))
            model = ScriptedModel([summary_step("- a")])
            log = [Message.user(text), Message.assistant(text), *chat(2)]
            strategy = Summarization(model=model, minimum_preserved=2, max_tokens=max_tokens)
            await apply_compaction(log, strategy)
            return int(model.requests[0].settings["max_tokens"]) if model.requests else None

        assert await cap(1) is None  # less than the summary's own framing: no call
        assert await cap(10) == 64  # the floor
        assert await cap(2_000, max_tokens=100) == 100  # max_tokens when half is more
        one, two, three = await cap(400), await cap(800), await cap(1_200)
        assert 64 < one < two < three < 4_096
        assert abs((three - two) - (two - one)) <= 2  # in proportion to what is replaced

    async def test_a_complete_summary_is_kept_whole(self) -> None:
        model = ScriptedModel([summary_step("Goal: x\nFacts:\n- a"), text_response("done")])
        assert await outcomes(Small(model=model), "go", chat(30)) == ["complete"]

    @pytest.mark.parametrize(
        "kept",
        [
            "Goal: router\nFacts:\n- order A-1234",
            "## Facts\n- **Order:** A-1234",
            "**Facts**\nThe order is A-1234.",
        ],
    )
    async def test_a_cut_summary_keeps_its_complete_lines(self, kept: str) -> None:
        cut = summary_step(f"{kept}\n- paid 89.", StopReason.MAX_TOKENS)
        model = ScriptedModel([cut, text_response("done")])
        agent = Small(model=model)
        assert await outcomes(agent, "go", chat(30)) == ["cut_at_cap"]
        sent = [m.text for m in model.requests[1].messages if m.is_summary]
        assert sent == [SUMMARY_PREFIX + kept]

    @pytest.mark.parametrize(
        "headings",
        [
            "Goal:\nFacts:",
            "## Notes",
            "# Summary\n---\n### Facts",
            "**Summary**",
            "- __Facts__:",
            "## 1. Customer orders",
            "**1. Primary Request and Intent:**",
            "## Order 1234: lost by DHL, refunded",  # facts in a heading: asked again
        ],
    )
    async def test_a_cut_summary_with_only_headings_is_asked_for_once_more_shorter(
        self, headings: str
    ) -> None:
        model = ScriptedModel(
            [
                summary_step(f"{headings}\n- ord", StopReason.MAX_TOKENS),
                summary_step("Goal: router"),
                text_response("done"),
            ]
        )
        assert await outcomes(Small(model=model), "go", chat(30)) == ["retried_shorter"]
        first, second = model.requests[0], model.requests[1]
        assert second.messages[0].text == first.messages[0].text
        asked = first.messages[1].text + " Keep the notes short: at most about 12 words."
        assert second.messages[1].text == asked  # the same data and instruction, then this
        sent = [m.text for m in model.requests[2].messages if m.is_summary]
        assert sent == [SUMMARY_PREFIX + "Goal: router"]


PADDING = "Let me think about that for a moment. " * 40


def specifics_log() -> list[Message]:
    """A conversation whose first turns hold specifics, among small talk."""
    call = ToolCall("c1", "get_account", {"id": "C-40917"})
    return [
        Message.user("Hi there! My order is A-1234 and I paid 89.90 EUR. Thanks a lot."),
        Message.assistant(PADDING),
        Message.user("Lovely weather today, isn't it."),
        Message.assistant(PADDING),
        Message.assistant(tool_calls=[call]),
        Message.tool("c1", '{"tier": "Gold", "credit": 82.15, "address": {"city": "Porto"}}'),
        Message.assistant(PADDING),
        Message.user("Please ship it to Whitby instead."),
        Message.assistant(PADDING),
        Message.user("and now?"),
        Message.assistant("sure."),
    ]


class TestQuotedSpecifics:
    async def test_user_specifics_and_tool_fields_follow_the_notes_in_their_own_words(
        self,
    ) -> None:
        model = ScriptedModel([summary_step("- wants a refund")])
        view = await apply_compaction(
            specifics_log(), Summarization(model=model, minimum_preserved=2)
        )
        assert view[0].text == SUMMARY_PREFIX + "\n".join(
            [
                "- wants a refund",
                QUOTES_HEADING,
                "User: My order is A-1234 and I paid 89.90 EUR.",
                "get_account: tier=Gold; credit=82.15; address.city=Porto",
                "User: Please ship it to Whitby instead.",
            ]
        )
        assert QUOTES_HEADING not in model.requests[0].messages[1].text  # code writes them

    async def test_quotes_are_carried_forward_and_never_given_to_the_model(self) -> None:
        quoted = "User: My order is A-1234.\nget_account: tier=Gold"
        notes = "\n".join(f"- fact {index}: value V-{index:04d}" for index in range(40))
        earlier = summary_message(f"{notes}\n{QUOTES_HEADING}\n{quoted}", ["gone"])
        history = [earlier, *specifics_log()]
        model = ScriptedModel([summary_step("- fact 0: value V-0000")])
        view = await apply_compaction(
            history, Summarization(model=model, max_tokens=200, minimum_preserved=2)
        )
        data = model.requests[0].messages[1].text
        assert data.startswith(f"Current notes:\n<<<\n{notes}\n>>>")  # a rewrite, notes only
        assert "tier=Gold" not in data
        text = view[0].text
        assert text.startswith(f"{SUMMARY_PREFIX}- fact 0: value V-0000\n{QUOTES_HEADING}\n")
        assert text.endswith("User: Please ship it to Whitby instead.")
        assert f"{QUOTES_HEADING}\n{quoted}\nUser: My order is A-1234 and I paid" in text

    async def test_the_quotes_and_the_notes_cap_add_up_to_half_of_what_is_replaced(
        self,
    ) -> None:
        many = [Message.user(f"Order A-{index:04d} costs {index}.00 EUR.") for index in range(300)]
        model = ScriptedModel([summary_step("- orders")])
        strategy = Summarization(model=model, minimum_preserved=2, max_tokens=100)
        view = await apply_compaction([*many, *chat(2)], strategy)
        _notes, _, quotes = view[0].text.partition(f"\n{QUOTES_HEADING}\n")
        assert 0 < len(quotes) // 4 <= 100  # the quoted section within max_tokens
        assert quotes.startswith("User: Order A-0000 costs 0.00 EUR.")  # oldest first
        few = [*many[:12], Message.assistant(PADDING), *chat(2)]
        small = ScriptedModel([summary_step("- orders")])
        view = await apply_compaction(few, Summarization(model=small, minimum_preserved=4))
        replaced = sum(len(m.text) for m in few[:13]) // 4
        added = len(view[0].text.partition(f"\n{QUOTES_HEADING}\n")[2]) // 4
        assert added > 0
        assert added + small.requests[0].settings["max_tokens"] <= replaced // 2 + 12
        short = [*many[:4], *chat(2)]  # half of the replaced part is under the cap's 64
        least = ScriptedModel([summary_step("- orders")])
        view = await apply_compaction(short, Summarization(model=least, minimum_preserved=4))
        assert sum(len(m.text) for m in short[:4]) // 4 < 2 * SUMMARY_FLOOR_TOKENS
        assert QUOTES_HEADING not in view[0].text  # the notes alone: no room for quotes
        assert least.requests[0].settings["max_tokens"] == SUMMARY_FLOOR_TOKENS

    async def test_each_quote_is_one_line_kept_whole_when_it_resembles_another(self) -> None:
        """Two long results alike but for their id and their end, and a value with a line
        break: each quote is one line (a long one cut in its middle), so dropping a line
        said before never drops part of a quote."""

        def order(index: int, order_id: str, status: str) -> list[Message]:
            call = ToolCall(f"c{index}", "get_order", {"id": order_id})
            fields = {"id": order_id, "items": "desk lamp, chair, " * 15, "status": status}
            return [
                Message.user(f"Where is order {order_id}?"),
                Message.assistant(tool_calls=[call]),
                Message.tool(call.id, json.dumps(fields)),
                Message.assistant("Checked."),
            ]

        call = ToolCall("c3", "get_address", {})
        history = [
            *order(1, "A-1", "lost"),
            *order(2, "B-2", "lost"),
            Message.assistant(tool_calls=[call]),
            Message.tool("c3", json.dumps({"street": "1 Main St\nPorto", "city": "Porto"})),
            *chat(4, "ok " * 60),
        ]
        model = ScriptedModel([summary_step("- notes")])
        view = await apply_compaction(history, Summarization(model=model, minimum_preserved=2))
        quotes = view[0].text.partition(f"\n{QUOTES_HEADING}\n")[2].splitlines()
        assert [line.split(":")[0] for line in quotes[:5]] == [
            "User",
            "get_order",
            "User",
            "get_order",
            "get_address",
        ]
        first, second = quotes[1], quotes[3]
        assert first.startswith("get_order: id=A-1;") and second.startswith("get_order: id=B-2;")
        assert all(
            q.endswith("status=lost") and "characters truncated" in q for q in (first, second)
        )
        assert quotes[4] == "get_address: street=1 Main St Porto; city=Porto"

    async def test_results_are_named_after_the_call_they_answer_when_ids_repeat(self) -> None:
        """``call_0`` in two turns (as some local servers number calls), and two parallel
        calls sharing it: each result is named after its own call, in the transcript and in
        the quotes."""
        turn = [ToolCall("call_0", "lookup_order", {}), ToolCall("call_0", "track_parcel", {})]
        history = [
            Message.user("Weather?"),
            Message.assistant(tool_calls=[ToolCall("call_0", "get_weather", {})]),
            Message.tool("call_0", '{"temp_c": 18}'),
            Message.user("Orders?"),
            Message.assistant(tool_calls=turn),
            Message.tool("call_0", '{"status": "shipped"}'),
            Message.tool("call_0", '{"eta": "2026-12-03"}'),
            *chat(20, "long " * 40),
        ]

        @manage_context(context_window_tokens=2_000, compression_threshold=0.5)
        class Quoting(Agent):
            pass

        model = ScriptedModel([summary_step("- noted"), text_response("done")])
        await Quoting(model=model).run("go", history=history)
        lines = model.requests[0].messages[1].text.splitlines()
        assert [line for line in lines if line.startswith("Tool result")] == [
            'Tool result (get_weather): {"temp_c": 18}',
            'Tool result (lookup_order): {"status": "shipped"}',
            'Tool result (track_parcel): {"eta": "2026-12-03"}',
        ]
        (summary,) = [m.text for m in model.requests[1].messages if m.is_summary]
        quotes = summary.partition(f"\n{QUOTES_HEADING}\n")[2].splitlines()
        assert [line for line in quotes if not line.startswith("User: ")] == [
            "get_weather: temp_c=18",
            "lookup_order: status=shipped",
            "track_parcel: eta=2026-12-03",
        ]

    async def test_sentences_in_a_script_without_case_are_quoted_each_on_its_own(
        self,
    ) -> None:
        """Japanese has no capitals to tell a name by and ends sentences with 。 and no
        space: each sentence is quoted on its own line, those with a kanji or katakana
        word kept whatever they hold (a name, a city, a colour), hiragana alone left out."""
        text = "こんにちは。山崎真理子と申します。仙台市に送ってください！色はテラコッタです。"
        history = [Message.user(text), Message.assistant(PADDING), *chat(2)]
        model = ScriptedModel([summary_step("- notes")])
        view = await apply_compaction(history, Summarization(model=model, minimum_preserved=2))
        assert view[0].text.partition(f"\n{QUOTES_HEADING}\n")[2].splitlines()[:3] == [
            "User: 山崎真理子と申します。",
            "User: 仙台市に送ってください！",
            "User: 色はテラコッタです。",
        ]

    async def test_numbers_and_identifiers_take_the_quotes_room_before_names(self) -> None:
        """Sentences named only by a capital (or by a script without capitals) that fill
        the room ahead of a number left the number out, the specific a small model copies
        worst; now it is quoted first, and the quotes stay in the conversation's order."""
        weak = [Message.user(f"What is the weather like in Bergen on day {d}?") for d in "ABCDEF"]
        history = [
            *weak[:3],
            Message.user("会員番号は3318-4420です。"),
            *weak[3:],
            Message.user("My member number is 3318-4420."),
            Message.assistant(PADDING),
            *chat(2),
        ]
        model = ScriptedModel([summary_step("- notes")])
        strategy = Summarization(model=model, minimum_preserved=2, max_tokens=60)
        view = await apply_compaction(history, strategy)
        quotes = view[0].text.partition(f"\n{QUOTES_HEADING}\n")[2].splitlines()
        said = [f"User: {m.text}" for m in history]
        assert quotes == sorted(quotes, key=said.index)  # in the conversation's order
        assert {said[3], said[7]} <= set(quotes)  # both numbers
        assert said[0] in quotes and said[6] not in quotes  # some names left out for them

    async def test_quote_specifics_false_keeps_the_notes_alone(self) -> None:
        @manage_context(context_window_tokens=400, compression_threshold=0.5, quote_specifics=False)
        class Plain(Agent):
            pass

        model = ScriptedModel([summary_step("- order A-1234"), text_response("done")])
        history = [Message.user("My order is A-1234."), *chat(40, "Order B-1 ")]
        await Plain(model=model).run("go", history=history)
        sent = [m.text for m in model.requests[1].messages if m.is_summary]
        assert sent == [SUMMARY_PREFIX + "- order A-1234"]

    def test_quote_specifics_must_be_a_bool(self) -> None:
        with pytest.raises(ConfigurationError, match="quote_specifics must be True or False"):
            manage_context(quote_specifics="yes")
        with pytest.raises(ConfigurationError, match="quote_specifics must be True or False"):
            Summarization(quote_specifics=1)


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
        @manage_context(
            context_window_tokens=2_000,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            mask_tool_results=1,
        )
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

    async def test_the_tool_schemas_count_toward_what_masking_must_reach(self) -> None:
        """The messages alone are under the goal, the request with its schemas is over the
        threshold: masking must still mask (it used to mask nothing, and fail)."""

        def audit(self: Agent, order: str) -> str:
            return order

        audit.__doc__ = "Audit an order. " * 100  # about 400 tokens of schema

        @manage_context(
            context_window_tokens=2_000,
            compression_threshold=0.5,
            preserve_recent_messages=2,
            mask_tool_results=1,
        )
        class Audited(Orders):
            audit_order = tool(audit)

        model = ScriptedModel([text_response("done")])
        async with Audited(model=model).stream("And now?", history=tool_history(4, 600)) as events:
            finished = [e async for e in events if isinstance(e, CompactionFinished)]
        assert [e.outcome for e in finished] == ["completed"]
        sent = model.requests[0].messages
        assert any(m.text.startswith("[Tool results omitted") for m in sent)

    async def test_when_masking_is_not_enough_the_summary_sees_the_placeholders(self) -> None:
        @manage_context(context_window_tokens=2_000, compression_threshold=0.5, mask_tool_results=1)
        class Masked(Orders):
            pass

        history = [*tool_history(6, 600), *chat(20, "long " * 40)]
        model = ScriptedModel([summary_step("Goal: orders"), text_response("done")])
        await Masked(model=model).run("And now?", history=history)
        transcript = model.requests[0].messages[1].text
        assert '[Tool results omitted to save context: lookup({"order": "A-0"})' in transcript
        assert "x" * 100 not in transcript

    async def test_summarization_masks_first_and_summarizes_only_when_still_over(self) -> None:
        over = tokens_exceed(350)
        history = tool_history(4, 400)
        quiet = ScriptedModel([])
        masked = Summarization(model=quiet, mask_tool_results=2, trigger=over, minimum_preserved=2)
        view = await apply_compaction(history, masked)
        assert len([m for m in view if m.text.startswith("[Tool results omitted")]) == 2
        assert quiet.requests == []
        busy = ScriptedModel([summary_step("Goal: orders")])
        strategy = attrs.evolve(masked, model=busy, trigger=tokens_exceed(100))
        view = await apply_compaction(history, strategy)
        assert "[Tool results omitted" in busy.requests[0].messages[1].text
        assert any(m.is_summary for m in view)


@manage_context(strategy=Truncation(minimum_preserved=100))
class Clipping(Agent):
    max_tool_result_tokens = 20


@manage_context(
    strategy=Truncation(minimum_preserved=100),
    context_window_tokens=100_000,
    budget=PromptBudget(
        prompt_budget_tokens=400, response_reserve_tokens=50, safety_reserve_tokens=0
    ),
)
class Bounded(Agent):
    pass


@manage_context(
    context_window_tokens=100,
    compression_threshold=0.5,
    tokenizer=PerMessage(),
    strategy=SlidingWindow(keep_last_turns=25),
)
class Windowed(Agent):
    """Its question run compacts again: 25 turns and the question are over the threshold."""


LOOKUP = [
    Message.user("Fetch my account."),
    Message.assistant(tool_calls=[ToolCall("c1", "get_account", {})]),
    Message.tool("c1", "x" * 300 + " access code ZX-9931 " + "y" * 300),
    Message.assistant("Here it is."),
]
LONG_TURNS = [Message.user("My order is A-1234."), Message.assistant("Noted.")] + [
    Message.user(f"Follow-up {i}: " + "where is it now? " * 10) for i in range(12)
]


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
                summary_step("Goal: a refund\nFacts:\n- order A-1234"),
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

    @pytest.mark.parametrize(
        ("expected", "text", "found"),
        [
            ("45 seconds", "It is 45  Seconds.", True),
            ("45 seconds", "I only know of 145 seconds.", False),
            ("349.80", "The total was $349.80.", True),
            ("349.80", "The total was $349.85.", False),
            ("349.8", "The total was 349.80.", False),
            ("349.80", "The total was $1,349.80.", False),
            ("45", "It took 45,000 seconds.", False),
            ("1,000", "It was 1,000,000.", False),
            ("45", "Either 45, 50 or 60.", True),
            ("A-2", "Orders A-1,A-2.", True),
            ("A-1234", "order a-1234, shipped", True),
            ("A-1234", "order A-12345", False),
        ],
    )
    def test_a_fact_is_found_as_a_whole_word_or_number(
        self, expected: str, text: str, found: bool
    ) -> None:
        """Case and spacing aside, a value must stand whole: a lost ``45 seconds`` is not
        "kept" by a ``145 seconds`` left in view."""
        assert Fact("?", expected).found_in(text) is found

    @pytest.mark.parametrize(
        ("expected", "text", "found"),
        [
            ("KT-50917", "注文番号はKT-50917です。", True),
            ("山崎", "山崎様、ご連絡ありがとうございます。", True),
            ("仙台", "仙台市へお送りします。", True),
            ("5月3日", "集まるのは5月3日です。", True),
            ("5月3日", "集まるのは15月3日です。", False),
            ("3318-4420", "会員番号は3318-44201です。", False),
            ("28,600", "合計28,600円でした。", True),
            ("28,600", "合計128,600円でした。", False),
            ("上海", "我住在上海市。", True),
            ("서울", "서울에서 보내 주세요.", True),
            ("Oslo", "Osloの住所です。", True),
            ("Oslo", "Oslov", False),
        ],
    )
    def test_in_a_script_written_without_spaces_a_value_stands_between_its_characters(
        self, expected: str, text: str, found: bool
    ) -> None:
        """Japanese, Chinese or Korean text runs words (and particles) together: a value
        counts where it stands, as long as it continues no word or number of a spaced
        script."""
        assert Fact("?", expected).found_in(text) is found

    @pytest.mark.parametrize(
        ("expected", "text", "found"),
        [
            ("café", unicodedata.normalize("NFD", "au café ce soir"), True),
            (unicodedata.normalize("NFD", "naïve"), "a naïve plan", True),
            ("cafe", unicodedata.normalize("NFD", "au café ce soir"), False),
            ("1200", "合計１２００円です。", True),
            ("KT-50917", "注文番号はＫＴ－５０９１７です。", True),
            ("दिल", "यह दिली इच्छा है", False),
            ("दिल", "मेरा दिल है", True),
            ("ガス", "ｶﾞｽ料金", True),
        ],
    )
    def test_a_value_is_found_whatever_the_unicode_form_of_its_text(
        self, expected: str, text: str, found: bool
    ) -> None:
        """A decomposed ``é`` (macOS text, say) is the composed one and fullwidth digits
        (Japanese answers) are digits; a combining mark continues its word, as a Hindi vowel
        sign does (``दिल`` is not in ``दिली``; ``cafe`` is not in a decomposed ``café``)."""
        assert Fact("?", expected).found_in(text) is found

    def test_the_unicode_form_never_changes_what_is_found(self) -> None:
        """Randomized: a value and a text of accented, Devanagari and fullwidth pieces are
        found or not the same in every normalization form of either."""
        rng = random.Random(69)
        pieces = ["café", "naïve", "12", "120", "दिल", "दिली", "Ａ-１", "A-1", "Å", "ñ", " ", "."]
        forms = ("NFC", "NFD", "NFKC", "NFKD")
        for _ in range(300):
            text = "".join(rng.choice(pieces) for _ in range(rng.randrange(1, 8)))
            value = rng.choice([p for p in pieces if p.strip(" .")])
            found = {
                Fact("?", unicodedata.normalize(a, value)).found_in(unicodedata.normalize(b, text))
                for a in forms
                for b in forms
            }
            assert len(found) == 1, (value, text)

    async def test_a_strategy_s_own_summarizer_writes_the_summary(self) -> None:
        summarizer = ScriptedModel([summary_step("- order A-1234")])
        agent_model = ScriptedModel([text_response("It is A-1234.")])

        @manage_context(strategy=Summarization(model=summarizer, minimum_preserved=2))
        class OwnSummarizer(Agent):
            pass

        facts = [Fact("What is my order?", "A-1234")]
        report = await check_retention(OwnSummarizer(model=agent_model), self.conversation(), facts)
        assert report.summary == "- order A-1234"
        assert [r.purpose for r in summarizer.requests] == ["context_compaction"]
        assert [r.messages[-1].text for r in agent_model.requests] == ["What is my order?"]

    async def test_an_agent_with_an_output_type_is_asked_for_text(self) -> None:
        """The probe questions want free text, whatever the agent's output_type."""

        @attrs.frozen
        class Ticket:
            order_id: str

        class Typed(Small):
            output_type = Ticket

        model = ScriptedModel([summary_step("- order A-1234"), text_response("It is A-1234.")])
        facts = [Fact("What is my order?", "A-1234")]
        report = await check_retention(Typed(model=model), self.conversation(), facts)
        assert [c.answer for c in report.checks] == ["It is A-1234."]
        assert report.checks[0].answered
        assert all(r.output_schema is None and r.tools == () for r in model.requests)

    @pytest.mark.parametrize(
        ("agent", "conversation", "fact"),
        [
            (Clipping, LOOKUP, Fact("My access code?", "ZX-9931")),
            (Bounded, LONG_TURNS, Fact("My order?", "A-1234")),
            (Windowed, chat(30), Fact("The sixth answer?", "m answer 5")),
        ],
        ids=["max_tool_result_tokens", "PromptBudget", "compacted again"],
    )
    async def test_in_view_is_judged_on_the_request_that_asked(
        self, agent: type[Agent], conversation: list[Message], fact: Fact
    ) -> None:
        """Not on the log's view: the run clips tool results, bounds the view to the
        budget, and may compact again before it asks."""
        model = ScriptedModel([text_response("I do not know.")] * 2)
        report = await check_retention(agent(model=model), conversation, [fact])
        in_log_view = render_transcript(build_view((*conversation, *report.records)))
        assert fact.found_in(in_log_view) and not report.checks[0].in_view
        assert "LOST MISS" in str(report)

    async def test_a_hook_s_side_call_is_not_taken_for_the_question(self) -> None:
        """A ``before_model`` hook's side call (a guard that quotes a fact, say) comes
        first; ``in_view`` is judged on the request that asked the question."""

        class Guarded(Small):
            @before_model
            async def guard(self, request: ModelRequest, *, context: RunContext) -> None:
                await context.complete(ModelRequest([Message.user("Is A-1234 a safe order?")]))

        steps = [summary_step("- notes"), text_response("safe"), text_response("I do not know.")]
        model = ScriptedModel(steps)
        fact = Fact("What is my order?", "A-1234")  # never said: only the guard quotes it
        report = await check_retention(Guarded(model=model), chat(3), [fact])
        assert [(c.in_view, c.answered) for c in report.checks] == [(False, False)]

    async def test_a_side_call_holding_the_question_is_not_taken_for_it(self) -> None:
        """A guard that passes the question itself on to a side call: still the turn's
        own request is judged, which holds the fact."""

        class Moderated(Small):
            @before_model
            async def moderate(self, request: ModelRequest, *, context: RunContext) -> None:
                await context.complete(ModelRequest([request.messages[-1]], purpose="moderation"))

        steps = [summary_step("- order A-1234"), text_response("fine"), text_response("A-1234")]
        fact = Fact("What is my order?", "A-1234")
        report = await check_retention(Moderated(model=ScriptedModel(steps)), chat(3), [fact])
        assert [(c.in_view, c.answered) for c in report.checks] == [(True, True)]

    async def test_a_hook_that_rebuilds_the_question_is_checked(self) -> None:
        """A hook that redacts the user's messages (new ids): the request that asked is
        still found, and the question it was shown is not taken for the view."""

        class Redacting(Small):
            @before_model
            def redact(self, request: ModelRequest) -> ModelRequest:
                return attrs.evolve(
                    request,
                    messages=[
                        Message.user(m.text.replace("ana@example.com", "[email]"))
                        if m.role is Role.USER and "ana@" in m.text
                        else m
                        for m in request.messages
                    ],
                )

        steps = [summary_step("- order A-1234"), text_response("A-1234")]
        fact = Fact("What is my order? Mail me at ana@example.com", "A-1234")
        report = await check_retention(Redacting(model=ScriptedModel(steps)), chat(3), [fact])
        assert [(c.in_view, c.answered) for c in report.checks] == [(True, True)]

    async def test_settings_and_knobs_changed_since_definition_fail_before_the_summary(
        self,
    ) -> None:
        """As a run would: checked before any model call."""
        model = ScriptedModel([])
        cls = type("Drifting", (Small,), {"settings": {"seed": 1}})
        agent = cls(model=model)
        fact = Fact("What is my order?", "A-1234")
        cls.settings["temperature"] = float("nan")  # type: ignore[index]
        with pytest.raises(ConfigurationError, match=r"Drifting\.settings\['temperature'\]"):
            await check_retention(agent, self.conversation(), [fact])
        cls.settings.pop("temperature")  # type: ignore[attr-defined]
        cls.max_turns = 2  # type: ignore[attr-defined]
        with pytest.raises(ConfigurationError, match=r"Drifting\.max_turns was changed"):
            await check_retention(agent, self.conversation(), [fact])
        assert model.requests == []

    async def test_needs_manage_context_and_facts(self) -> None:
        with pytest.raises(ConfigurationError, match="has no @manage_context"):
            await check_retention(Agent(model=ScriptedModel([])), chat(3), [Fact("?", "x")])
        with pytest.raises(ConfigurationError, match="at least one Fact"):
            await check_retention(Small(model=ScriptedModel([])), chat(3), [])
        with pytest.raises(ConfigurationError, match=r"agent must be an Agent, not the class"):
            await check_retention(Small, chat(3), [Fact("?", "x")])  # type: ignore[arg-type]
        for expected in ("", 1234, None, ["A-1", 2]):
            with pytest.raises(ConfigurationError, match=r"Fact\.expected must be a non-empty"):
                Fact("?", expected)  # type: ignore[arg-type]
        assert sorted(Fact("?", {"A-1", "A1"}).expected) == ["A-1", "A1"]  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=r"Fact\.question must be a non-empty str"):
            Fact(3, "x")  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=r"gives its expected value 'a-1234' away"):
            Fact("Is my order A-1234 late?", ("late now", "a-1234"))  # an echo would count
        assert Fact("Is my order A-12345 late?", "A-1234").expected == ("A-1234",)

    async def test_facts_and_the_conversation_are_checked_before_the_summary_call(self) -> None:
        model = ScriptedModel([])
        fact = Fact("What is my order?", "A-1234")
        with pytest.raises(ConfigurationError, match="facts must be a list of Fact, not Fact"):
            await check_retention(Small(model=model), self.conversation(), fact)  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match=r"facts\[0\] must be a Fact, not 'code\?'"):
            await check_retention(Small(model=model), self.conversation(), ["code?"])  # type: ignore[list-item]
        conversation = self.conversation()
        conversation.append(conversation[0])
        with pytest.raises(ConfigurationError, match=r"conversation\[0\] and conversation\[24\]"):
            await check_retention(Small(model=model), conversation, [fact])
        assert model.requests == []


async def test_echoed_delimiters_and_repeated_lines_are_not_kept_in_the_summary() -> None:
    written = "<<<\n- Open: none\n<<<<<<\n- router A-1\n-  open:   NONE\n- Open: none\n<< >>\n>>>"
    model = ScriptedModel([summary_step(written), text_response("done")])
    result = await Small(model=model).run("go", history=chat(30))
    kept = SUMMARY_PREFIX + "- Open: none\n- router A-1"
    assert [m.text for m in result.messages if m.is_summary] == [kept]
