"""Strategies: what each keeps, collapses, excludes or summarizes; minimum counts; system
groups; pipeline order; the token budget and its fallback; groups never split."""

from __future__ import annotations

import functools
import gc
import math
import random
import weakref
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from littleghost import ImagePart, Message, Role, TextPart, ToolCall, manage_context
from littleghost.context import (
    ByteEstimator,
    CompactionState,
    CompactionStrategy,
    Pipeline,
    SelectiveToolCallCompaction,
    SlidingWindow,
    Summarization,
    TokenBudget,
    ToolResultCompaction,
    Trigger,
    Truncation,
    TurnExcerpts,
    any_of,
    apply_compaction,
    group_messages,
    has_tool_calls,
    messages_exceed,
    never,
    tokens_exceed,
    turns_exceed,
)
from littleghost.context.compaction import compaction_records
from littleghost.context.summarize import SUMMARY_PREFIX
from littleghost.context.tokens import estimate_messages
from littleghost.errors import (
    CompactionError,
    ConfigurationError,
    ContextWindowOverflowError,
    OutputLimitError,
)
from littleghost.models import ModelRequest, ModelResponse, StopReason
from littleghost.testing import ScriptedModel, text_response

pytestmark = pytest.mark.anyio


def turn(number: int, *, calls: int = 1) -> list[Message]:
    """A user question, parallel calls with their results, the answer."""
    ids = [f"t{number}c{k}" for k in range(calls)]
    return [
        Message.user(f"question {number}"),
        Message.assistant(tool_calls=[ToolCall(i, "get_weather", {"city": i}) for i in ids]),
        *(Message.tool(i, f"sunny, {number}°C") for i in ids),
        Message.assistant(f"answer {number}"),
    ]


def conversation(turns: int, *, calls: int = 1) -> list[Message]:
    log = [Message.system("You are terse.")]
    for number in range(turns):
        log += turn(number, calls=calls)
    return log


def texts(view: tuple[Message, ...]) -> list[str]:
    return [m.text for m in view]


def assert_whole(view: tuple[Message, ...]) -> None:
    """Every result follows its call's message; every call in the view is answered."""
    open_calls: set[str] = set()
    for message in view:
        if message.tool_calls:
            assert not open_calls
            open_calls = {call.id for call in message.tool_calls}
        elif message.tool_results:
            assert message.tool_results[0].call_id in open_calls
            open_calls.discard(message.tool_results[0].call_id)
        else:
            assert not open_calls


# --- Truncation -----------------------------------------------------------------------


async def test_truncation_keeps_system_and_the_newest_32_groups_by_default() -> None:
    log = conversation(20)  # 60 non-system groups
    view = await apply_compaction(log, Truncation())
    assert view[0] is log[0]
    assert len(group_messages(view)) == 1 + 32
    assert tuple(view[1:]) == tuple(log[-len(view) + 1 :])


async def test_truncation_stops_once_under_the_token_trigger() -> None:
    log = conversation(20)
    limit = estimate_messages(log) // 3
    view = await apply_compaction(
        log, Truncation(trigger=tokens_exceed(limit), minimum_preserved=0)
    )
    assert estimate_messages(view) <= limit
    assert estimate_messages(view) > limit - max(g.tokens for g in group_messages(log))
    assert_whole(view)


async def test_truncation_removes_nothing_when_its_target_holds_from_the_start() -> None:
    log = conversation(20)
    target = ~messages_exceed(len(log))
    view = await apply_compaction(log, Truncation(target=target, minimum_preserved=0))
    assert view == tuple(log)


async def test_the_exclusion_record_says_how_many_messages_it_leaves_out() -> None:
    log = conversation(20)
    (record,) = await compaction_records(log, Truncation(), tokenizer=None)
    left_out = len(log) - len(await apply_compaction(log, Truncation()))
    assert record.text == f"[{left_out} earlier messages are excluded from the context.]"


async def test_truncation_keeps_the_minimum_even_over_the_trigger() -> None:
    log = conversation(5)
    view = await apply_compaction(log, Truncation(trigger=tokens_exceed(1), minimum_preserved=4))
    assert view == (log[0], *log[-5:])  # answer 3, then turn 4 (its call and result one group)


# --- SlidingWindow -----------------------------------------------------------------------


async def test_sliding_window_by_turns_keeps_whole_turns() -> None:
    log = conversation(6, calls=2)
    view = await apply_compaction(log, SlidingWindow(keep_last_turns=2))
    assert view[0] is log[0]
    assert [m.text for m in view if m.role == "user"] == ["question 4", "question 5"]
    assert tuple(view[1:]) == tuple(log[-2 * 5 :])


async def test_sliding_window_by_turns_counts_leading_groups_as_a_turn() -> None:
    log = [Message.system("s"), Message.assistant("welcome"), *turn(0), *turn(1)]
    view = await apply_compaction(log, SlidingWindow(keep_last_turns=3))
    assert view == tuple(log)
    view = await apply_compaction(log, SlidingWindow(keep_last_turns=2))
    assert view == (log[0], *turn_of(log, 0), *turn_of(log, 1))
    view = await apply_compaction(log, SlidingWindow(keep_last_turns=1))
    assert view == (log[0], *turn_of(log, 1))


async def test_sliding_window_removes_nothing_when_its_target_holds_from_the_start() -> None:
    """The leading groups are a turn of their own: checked against the target as a user
    turn is, before they go."""
    log = [Message.system("s"), Message.assistant("welcome"), *turn(0), *turn(1)]
    window = SlidingWindow(keep_last_turns=1, target=~messages_exceed(len(log)))
    assert await apply_compaction(log, window) == tuple(log)


def turn_of(log: list[Message], number: int) -> list[Message]:
    start = next(i for i, m in enumerate(log) if m.text == f"question {number}")
    end = next(i for i, m in enumerate(log) if m.text == f"answer {number}")
    return log[start : end + 1]


async def test_sliding_window_by_groups() -> None:
    log = conversation(4)
    view = await apply_compaction(log, SlidingWindow(keep_last_groups=4))
    assert [g.kind for g in group_messages(view)] == [
        "system",
        "assistant_text",
        "user",
        "tool_call",
        "assistant_text",
    ]


async def test_sliding_window_with_a_trigger_stops_at_its_target() -> None:
    log = conversation(8)
    view = await apply_compaction(log, SlidingWindow(keep_last_turns=1, trigger=turns_exceed(4)))
    assert [m.text for m in view if m.role == "user"] == [f"question {n}" for n in range(4, 8)]


def test_sliding_window_takes_exactly_one_window() -> None:
    with pytest.raises(ConfigurationError, match="exactly one"):
        SlidingWindow()
    with pytest.raises(ConfigurationError, match="exactly one"):
        SlidingWindow(keep_last_turns=1, keep_last_groups=1)
    with pytest.raises(ConfigurationError, match=r"keep_last_turns must be an int >= 1"):
        SlidingWindow(keep_last_turns=0)


# --- ToolResultCompaction and SelectiveToolCallCompaction ------------------------------


async def test_tool_results_collapse_into_one_short_message() -> None:
    log = conversation(4, calls=2)
    view = await apply_compaction(log, ToolResultCompaction())
    assert texts(view)[:7] == [
        "You are terse.",
        "question 0",
        "[Tool results: get_weather: sunny, 0°C; get_weather: sunny, 0°C]",
        "answer 0",
        "question 1",
        "[Tool results: get_weather: sunny, 1°C; get_weather: sunny, 1°C]",
        "answer 1",
    ]
    collapsed = view[2]
    assert collapsed.role == "assistant" and not collapsed.tool_calls
    assert tuple(view[7:]) == tuple(log[-10:])  # the newest two tool-call groups stay whole
    assert_whole(view)


async def test_a_collapse_keeps_assistant_text_errors_and_unanswered_calls() -> None:
    ask = Message.assistant(
        "Looking it up.",
        tool_calls=[
            ToolCall("a", "search", {}),
            ToolCall("b", "fetch", {}),
            ToolCall("c", "x", {}),
        ],
    )
    log = [
        Message.user("go"),
        ask,
        Message.tool("a", "  found\n  it  "),
        Message.tool("b", "timeout", is_error=True),
        Message.user("again"),
        Message.assistant(tool_calls=[ToolCall("d", "search", {})]),
        Message.tool("d", "x" * 1000),
    ]
    view = await apply_compaction(
        log, ToolResultCompaction(keep_last_tool_call_groups=0, max_result_chars=40)
    )
    assert view[1].text == (
        "Looking it up.\n[Tool results: search: found it; fetch: error: timeout; x: no result]"
    )
    assert "truncated" in view[3].text and len(view[3].text) < 200


async def test_a_collapse_and_a_mask_are_one_line_whatever_they_cut() -> None:
    """A result cut to ``max_result_chars``, or a call cut to the mask's length, keeps its
    marker inline: no line break of any kind in a collapse's or a mask's line."""
    rng = random.Random(11)
    breaks = [" ", "  ", "\n", "\r\n", "\t", "\u2028", "\x0b"]
    for _ in range(60):
        words = [rng.choice(["data", "x" * rng.randint(1, 40), "42"]) for _ in range(400)]
        text = "".join(word + rng.choice(breaks) for word in words[: rng.randint(100, 400)])
        log = [
            Message.user("go"),
            Message.assistant(tool_calls=[ToolCall("a", "fetch", {"query": text[:300]})]),
            Message.tool("a", text),
            Message.user("again"),
            Message.assistant("done"),
        ]
        chars = rng.randint(16, 400)
        collapse = ToolResultCompaction(keep_last_tool_call_groups=0, max_result_chars=chars)
        masking = Summarization(
            model=ScriptedModel([]),
            mask_tool_results=0,
            trigger=tokens_exceed(100),
            minimum_preserved=1,
        )  # masking alone reaches the goal: no summary call
        for strategy, start in [(collapse, "[Tool results: "), (masking, "[Tool results omi")]:
            line = (await apply_compaction(log, strategy))[1].text
            assert line.startswith(start) and line.splitlines() == [line], line


def shared_id_log() -> list[Message]:
    """Three parallel calls sharing one id, two of them answered (in call order), then a
    later turn reusing the id."""
    calls = [ToolCall("c", "search", {}), ToolCall("c", "fetch", {}), ToolCall("c", "x", {})]
    return [
        Message.user("go"),
        Message.assistant(tool_calls=calls),
        Message.tool("c", "found it"),
        Message.tool("c", "timeout", is_error=True),
        Message.user("again"),
        Message.assistant(tool_calls=[ToolCall("c", "search", {})]),
        Message.tool("c", "done"),
    ]


async def test_calls_sharing_an_id_are_collapsed_and_masked_each_with_its_own_result() -> None:
    view = await apply_compaction(
        shared_id_log(), ToolResultCompaction(keep_last_tool_call_groups=1)
    )
    assert view[1].text == "[Tool results: search: found it; fetch: error: timeout; x: no result]"
    quiet = ScriptedModel([])  # masking alone reaches the goal: no summary call
    masking = Summarization(
        model=quiet, mask_tool_results=1, trigger=tokens_exceed(60), minimum_preserved=1
    )
    view = await apply_compaction(shared_id_log(), masking)
    assert view[1].text == (
        "[Tool results omitted to save context: search({}) (8 characters); "
        "fetch({}) (7 characters); x({}) (0 characters)]"
    )


async def test_tool_result_compaction_leaves_user_and_text_messages_alone() -> None:
    log = conversation(5)
    view = await apply_compaction(log, ToolResultCompaction(keep_last_tool_call_groups=1))
    expected = [m for m in log if not (m.tool_calls or m.tool_results) or m in log[-3:-1]]
    assert [m for m in view if not m.text.startswith("[Tool results")] == expected
    assert sum(m.text.startswith("[Tool results") for m in view) == 4


async def test_selective_tool_call_compaction_drops_older_tool_groups() -> None:
    log = conversation(5, calls=3)
    view = await apply_compaction(log, SelectiveToolCallCompaction())
    kept_calls = [m for m in view if m.tool_calls]
    assert [m.tool_calls[0].id for m in kept_calls] == ["t3c0", "t4c0"]
    assert [m.text for m in view if m.role == "user"] == [f"question {n}" for n in range(5)]
    assert_whole(view)


# --- Summarization ---------------------------------------------------------------------


async def test_summarization_keeps_the_newest_four_groups_and_writes_one_summary() -> None:
    model = ScriptedModel([text_response("They asked about the weather.")])
    log = conversation(4)
    view = await apply_compaction(log, Summarization(model=model))
    assert view[0] is log[0]
    assert view[1].is_summary and view[1].text == SUMMARY_PREFIX + "They asked about the weather."
    assert tuple(view[2:]) == tuple(log[-5:])  # 4 groups: the tool call is one
    (request,) = model.requests
    assert request.purpose == "context_compaction" and not request.tools
    transcript = request.messages[-1].text
    assert "question 0" in transcript and "question 2" in transcript
    assert "question 3" not in transcript
    covered = set(view[1].metadata["littleghost.summary.covers"])
    assert covered == {m.id for m in log[1:-5]}


async def test_a_summary_of_every_group_ends_the_view() -> None:
    """With nothing preserved, the summary has nothing to stand before: it comes last."""
    model = ScriptedModel([text_response("They asked about the weather.")])
    log = conversation(4)
    view = await apply_compaction(log, Summarization(model=model, minimum_preserved=0))
    assert view[0] is log[0] and len(view) == 2
    assert view[1].is_summary and "They asked about the weather." in view[1].text


class Words:
    """One token per word."""

    def count_tokens(self, text: str) -> int:
        return len(text.split())


async def test_notes_that_reached_the_cap_exactly_are_rewritten() -> None:
    model = ScriptedModel([text_response("one two three four"), text_response("rewritten")])
    strategy = Summarization(model=model, max_tokens=4, quote_specifics=False)
    log = conversation(4)
    first = await compaction_records(log, strategy, tokenizer=Words())
    later = [*log, *first, *turn(9), *turn(10)]
    (summary,) = await compaction_records(later, strategy, tokenizer=Words())
    assert first[0].text == SUMMARY_PREFIX + "one two three four"
    assert summary.text == SUMMARY_PREFIX + "rewritten"  # not added to the full notes


async def test_summarization_folds_the_previous_summary_in() -> None:
    model = ScriptedModel([text_response("first"), text_response("second")])
    log = conversation(4)
    first = await compaction_records(log, Summarization(model=model), tokenizer=None)
    log2 = [*log, *first, *turn(9)]
    second = await compaction_records(log2, Summarization(model=model), tokenizer=None)
    (summary,) = second
    covers = summary.metadata["littleghost.summary.covers"]
    assert first[0].id in covers and log[-2].id in covers  # the summary, turn 3's result
    assert log[-1].id not in covers  # with turn 9, the newest four groups
    assert "first" not in model.requests[1].messages[-1].text  # only what is new
    assert summary.text.endswith("first\nsecond")  # the earlier notes carried forward


async def test_summarization_uses_a_custom_prompt_and_the_given_complete() -> None:
    model = ScriptedModel([text_response("short")])
    records = await compaction_records(
        conversation(3),
        Summarization(prompt="Only the cities.", minimum_preserved=1),
        tokenizer=None,
        complete=model.respond,
        settings={"temperature": 0.1, "max_tokens": 9, "tool_choice": "auto"},
    )
    assert records[0].is_summary
    request = model.requests[0]
    assert request.messages[-1].text.endswith(">>>\n\nOnly the cities.")
    assert request.settings == {"temperature": 0.1, "max_tokens": 64}  # a short transcript


async def test_summarization_with_nothing_new_to_summarize_does_nothing() -> None:
    model = ScriptedModel([])
    log = conversation(1)
    assert await apply_compaction(log, Summarization(model=model)) == tuple(log)
    assert model.requests == []


async def test_a_failed_summary_raises() -> None:
    cut = text_response("half a sen", stop_reason=StopReason.MAX_TOKENS)
    with pytest.raises(OutputLimitError):
        await apply_compaction(conversation(4), Summarization(model=ScriptedModel([cut, cut])))
    with pytest.raises(ConfigurationError, match=r"Summarization\(model=\.\.\.\)"):
        await apply_compaction(conversation(4), Summarization())


async def test_a_summary_overflow_that_shows_no_higher_scale_is_raised() -> None:
    """An overflow reporting fewer tokens than estimated teaches nothing: it is raised,
    not retried; one reporting more is retried with the request refitted in its units."""
    overflow = ContextWindowOverflowError("too long", prompt_tokens=1)
    model = ScriptedModel([overflow, text_response("never")])
    with pytest.raises(ContextWindowOverflowError) as caught:
        await apply_compaction(conversation(4), Summarization(model=model))
    assert caught.value is overflow and len(model.requests) == 1
    overflow = ContextWindowOverflowError("too long", prompt_tokens=10**4, context_window=10**4)
    model = ScriptedModel([overflow, text_response("They asked about the weather.")])
    view = await apply_compaction(conversation(4), Summarization(model=model))
    assert view[1].is_summary and len(model.requests) == 2


def dense_provider(window: int, *, says_window: bool) -> Callable[[ModelRequest], ModelResponse]:
    """A provider that counts every token 1.7 times the estimate, framing and instruction
    included, and overflows with the prompt's size (and its window, ``says_window``)."""

    def respond(request: ModelRequest) -> ModelResponse:
        prompt = math.ceil(1.7 * estimate_messages(request.messages))
        if prompt + (request.max_tokens or 0) > window:
            said = window if says_window else None
            raise ContextWindowOverflowError("too long", prompt_tokens=prompt, context_window=said)
        return text_response("They asked about the weather.")

    return respond


@pytest.mark.parametrize("says_window", [True, False])
async def test_a_summary_call_that_overflows_is_refitted_in_the_tokens_it_reported(
    says_window: bool,
) -> None:
    """The request fitted again after the overflow is sized with the excess the overflow
    showed, and under the window it said (else under what overflowed), so it fits the
    window in the provider's tokens (the request that overflowed used to be sent again as
    it was); where not even one group's request can fit, no second call is made."""
    model = ScriptedModel([dense_provider(500, says_window=says_window)] * 2)
    view = await apply_compaction(conversation(6), Summarization(model=model, max_tokens=64))
    first, second = model.requests
    assert view[1].is_summary and len(second.messages[-1].text) < len(first.messages[-1].text)
    assert math.ceil(1.7 * estimate_messages(second.messages)) + 64 <= 500
    model = ScriptedModel([dense_provider(200, says_window=True)] * 2)
    with pytest.raises(CompactionError, match="no summary request fits"):
        await apply_compaction(conversation(6), Summarization(model=model, max_tokens=64))
    assert len(model.requests) == 1


async def test_summarization_masks_no_tool_result_it_keeps_verbatim() -> None:
    log = [*conversation(1), Message.user("and the others?")]
    for call in (ToolCall(f"c{i}", "get_weather", {"city": f"c{i}"}) for i in range(3)):
        log += [Message.assistant(tool_calls=[call]), Message.tool(call.id, "sunny " * 40)]
    log.append(Message.assistant("all sunny"))
    model = ScriptedModel([text_response("They asked about the weather.")])
    strategy = Summarization(model=model, minimum_preserved=4, mask_tool_results=1)
    view = await apply_compaction(log, strategy)
    assert view[1].is_summary and view[2:] == tuple(log[-7:])  # the newest 4 groups


# --- TurnExcerpts ----------------------------------------------------------------------


async def test_turn_excerpts_keep_the_newest_turn_by_default() -> None:
    log = conversation(4)  # each turn: a question, a tool-call group, an answer
    assert await apply_compaction(log, TurnExcerpts()) == (log[0], *log[-4:])
    assert await apply_compaction(log, TurnExcerpts(minimum_preserved=0)) == (log[0],)


async def test_turn_excerpts_keep_the_preserved_groups_with_their_whole_turn() -> None:
    log = conversation(4)
    view = await apply_compaction(log, TurnExcerpts(minimum_preserved=4))
    assert view == (log[0], *log[-8:])  # turn 3, and turn 2 for its answer
    stop = ~tokens_exceed(estimate_messages(log) - 1)  # after the first step
    view = await apply_compaction(log, TurnExcerpts(target=stop))
    assert texts(view)[:2] == [
        "You are terse.",
        "[Earlier turn, excerpted: Q: question 0 | A: answer 0 | 1 tool call]",
    ]
    assert view[2:] == tuple(log[5:])


async def test_a_turn_without_its_question_says_so() -> None:
    """A leading turn whose question an earlier compaction left out: ``Q: (none)``."""
    log = conversation(2)[:1] + conversation(2)[2:]  # turn 0 without its question
    stop = ~tokens_exceed(estimate_messages(log) - 1)  # after the first step
    view = await apply_compaction(log, TurnExcerpts(target=stop))
    assert texts(view)[1] == "[Earlier turn, excerpted: Q: (none) | A: answer 0 | 1 tool call]"


async def test_a_question_of_images_is_excerpted_by_them() -> None:
    """A question that is an image (or text and images) is the turn's question, each image
    marked ``[image]`` as a summary's transcript marks it, not ``Q: (none)``."""
    image = ImagePart(url="https://example.com/parcel.png")
    for question, shown in (
        (Message(Role.USER, (image,)), "[image]"),
        (
            Message(Role.USER, (TextPart("what is"), TextPart("this?"), image, image)),
            "what is this? [image] [image]",
        ),
    ):
        log = [Message.system("You are terse."), question, Message.assistant("a parcel"), *turn(1)]
        stop = ~tokens_exceed(estimate_messages(log) - 1)  # after the first step
        view = await apply_compaction(log, TurnExcerpts(target=stop))
        assert texts(view)[1] == f"[Earlier turn, excerpted: Q: {shown} | A: a parcel]"


async def test_a_turn_with_neither_question_nor_answer_is_excerpted_by_its_calls() -> None:
    call = ToolCall("early", "get_weather", {"city": "Oslo"})
    log = [
        Message.system("You are terse."),
        Message.assistant(tool_calls=[call]),
        Message.tool(call.id, "sunny"),
        *turn(1),
    ]
    stop = ~tokens_exceed(estimate_messages(log) - 1)  # after the first step
    view = await apply_compaction(log, TurnExcerpts(target=stop))
    assert texts(view)[:2] == [
        "You are terse.",
        "[Earlier turn, excerpted: Q: (none) | 1 tool call]",
    ]
    assert view[2:] == tuple(log[3:])


async def test_lines_of_an_earlier_run_are_kept_as_they_are() -> None:
    log = conversation(3)
    first = TurnExcerpts(target=~turns_exceed(1))
    log += await compaction_records(log, first, tokenizer=None)  # turns 0 and 1 as lines
    earlier = (await apply_compaction(log, TurnExcerpts(trigger=never)))[1:3]
    assert texts(earlier) == [
        "[Earlier turn, excerpted: Q: question 0 | A: answer 0 | 1 tool call]",
        "[Earlier turn, excerpted: Q: question 1 | A: answer 1 | 1 tool call]",
    ]
    log += turn(3)
    line = Message.assistant("[Earlier turn, excerpted: Q: question 2 | A: answer 2 | 1 tool call]")
    expected = (log[0], *earlier, line, *log[-4:])
    stop = ~tokens_exceed(estimate_messages(expected))
    view = await apply_compaction(log, TurnExcerpts(target=stop))
    assert texts(view) == texts(expected)  # neither merged again nor nested in the new one


async def test_a_collapse_that_quotes_a_line_is_not_taken_for_one() -> None:
    """An answer that starts as a line does (a model copying what it saw), its tool call
    collapsed: the collapse is of its turn, which becomes one line."""
    call = ToolCall("c", "get_weather", {"city": "Oslo"})
    quoting = "[Earlier turn, excerpted: Q: question 0 | A: answer 0] Checking again."
    log = [
        Message.system("You are terse."),
        Message.user("question 1"),
        Message.assistant(quoting, tool_calls=[call]),
        Message.tool(call.id, "sunny"),
        Message.assistant("answer 1"),
        *turn(2),
    ]
    log += await compaction_records(
        log, ToolResultCompaction(keep_last_tool_call_groups=1), tokenizer=None
    )
    view = await apply_compaction(log, TurnExcerpts(target=~turns_exceed(1)))
    assert texts(view)[:2] == [
        "You are terse.",
        "[Earlier turn, excerpted: Q: question 1 | A: answer 1]",
    ]
    assert view[2:] == tuple(log[5:9])  # turn 2


# --- Pipeline and TokenBudget ----------------------------------------------------------


async def test_pipeline_runs_in_order_each_on_the_result_of_the_last() -> None:
    log = conversation(4)
    collapse = ToolResultCompaction(keep_last_tool_call_groups=0)
    drop = SelectiveToolCallCompaction(keep_last_tool_call_groups=0)
    collapsed_first = await apply_compaction(log, Pipeline(collapse, drop))
    dropped_first = await apply_compaction(log, Pipeline(drop, collapse))
    assert sum(m.text.startswith("[Tool results") for m in collapsed_first) == 4
    assert not any(m.text.startswith("[Tool results") for m in dropped_first)
    assert not any(m.tool_calls for m in (*collapsed_first, *dropped_first))
    assert len(dropped_first) == len(collapsed_first) - 4


async def test_pipeline_children_check_their_own_triggers() -> None:
    log = conversation(6)
    pipeline = Pipeline(
        ToolResultCompaction(keep_last_tool_call_groups=0, trigger=tokens_exceed(10**6)),
        SelectiveToolCallCompaction(keep_last_tool_call_groups=1, trigger=has_tool_calls()),
    )
    view = await apply_compaction(log, pipeline)
    assert not any(m.text.startswith("[Tool results") for m in view)
    assert sum(bool(m.tool_calls) for m in view) == 1
    truncation = Truncation(minimum_preserved=1)  # the default keeps all 6 turns anyway
    assert len(await apply_compaction(log, Pipeline(truncation))) < len(log)
    assert await apply_compaction(log, Pipeline(truncation, trigger=never)) == tuple(log)


async def test_a_later_step_works_on_the_summary_an_earlier_one_made() -> None:
    """A ``SlidingWindow`` after a ``Summarization`` leaves the new summary out with the
    older turns (as the README warns); one whose trigger the summary brings under keeps it."""
    log = [m for i in range(8) for m in (Message.user(f"q{i} " * 40), Message.assistant("a"))]
    summarize = Summarization(model=ScriptedModel([text_response("- notes")] * 2))
    window = SlidingWindow(keep_last_turns=2)
    dropped = await apply_compaction(log, Pipeline(summarize, window))
    assert not any(m.is_summary for m in dropped) and len(dropped) == 4
    kept = await apply_compaction(
        log, Pipeline(summarize, SlidingWindow(keep_last_turns=2, trigger=turns_exceed(4)))
    )
    assert kept[0].is_summary and kept[1:] == tuple(log[-4:])


def test_pipeline_takes_strategies_positionally_or_by_keyword() -> None:
    assert Pipeline(Truncation()) == Pipeline(strategies=[Truncation()])
    with pytest.raises(ConfigurationError, match="positionally or strategies="):
        Pipeline(Truncation(), strategies=[Truncation()])
    with pytest.raises(ConfigurationError, match="Pipeline takes strategies"):
        Pipeline("truncate")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"Pipeline must be a sequence of strategies"):
        Pipeline(strategies=Truncation())
    with pytest.raises(ConfigurationError, match=r"Pipeline got unexpected keywords: target$"):
        Pipeline(Truncation(), target=never)


@pytest.mark.parametrize("strategies", [Truncation(), "truncate", None])
def test_token_budget_takes_a_sequence_of_strategies(strategies: Any) -> None:
    with pytest.raises(
        ConfigurationError, match=r"TokenBudget\.strategies must be a sequence of strategies, not"
    ):
        TokenBudget(token_budget=10, strategies=strategies)


async def test_token_budget_does_nothing_under_budget() -> None:
    log = conversation(3)
    model = ScriptedModel([])
    budget = TokenBudget(
        token_budget=estimate_messages(log), strategies=[Summarization(model=model)]
    )
    assert await apply_compaction(log, budget) == tuple(log)


async def test_token_budget_stops_as_soon_as_a_strategy_gets_under() -> None:
    log = conversation(10)
    collapsed = await apply_compaction(log, ToolResultCompaction())
    model = ScriptedModel([])  # would raise if the summary were asked for
    budget = TokenBudget(
        token_budget=estimate_messages(collapsed),
        strategies=[ToolResultCompaction(), Summarization(model=model)],
    )
    assert texts(await apply_compaction(log, budget)) == texts(collapsed)
    assert model.requests == []


async def test_token_budget_falls_back_to_dropping_the_oldest_groups() -> None:
    log = conversation(10)
    limit = estimate_messages(log) // 4
    view = await apply_compaction(
        log, TokenBudget(token_budget=limit, strategies=[ToolResultCompaction()])
    )
    assert estimate_messages(view) <= limit
    assert view[0] is log[0] and view[-1] is log[-1]
    assert_whole(view)
    tiny = await apply_compaction(log, TokenBudget(token_budget=1, minimum_preserved=2))
    assert tiny == (log[0], *log[-3:])  # over budget: the system group and the newest two stay


class CountingTokenizer:
    """Characters ÷ 4, counting the texts it is asked about."""

    def __init__(self) -> None:
        self.calls = 0

    def count_tokens(self, text: str) -> int:
        self.calls += 1
        return len(text) // 4


@pytest.mark.parametrize(
    "strategies",
    [
        [ToolResultCompaction()],
        [ToolResultCompaction(keep_last_tool_call_groups=0), ToolResultCompaction()],
        [Truncation()],
        [SelectiveToolCallCompaction()],
    ],
    ids=repr,
)
async def test_token_budget_works_only_on_the_groups_that_could_still_fit(
    strategies: list[CompactionStrategy],
) -> None:
    log = [Message.system("s")]
    for number in range(500):
        log += turn(number)
        log[-2] = Message.tool(f"t{number}c0", f"sunny, {number}°C. " * 40)
    tokenizer = CountingTokenizer()
    budget = TokenBudget(token_budget=250, strategies=strategies)
    view = await apply_compaction(log, budget, tokenizer=tokenizer)
    assert view[0] is log[0] and view[-1] is log[-1]
    assert tokenizer.calls < len(log) // 10  # not every message estimated, nor collapsed


def budget_state(groups: tuple[Any, ...], protected: int | None, pinned: set[int]) -> Any:
    state = CompactionState(
        [g.kind for g in groups],
        [g.messages for g in groups],
        tokenizer=ByteEstimator(),
        protected=protected,
    )
    state.pinned = frozenset(pinned)
    return state


class NaiveTokenBudget:
    """``TokenBudget`` as first written: every strategy on the whole view while it is
    over, then the oldest groups dropped."""

    def __init__(self, budget: TokenBudget) -> None:
        self.budget = budget

    async def compact(self, state: CompactionState, /) -> None:
        for strategy in self.budget.strategies:
            if state.tokens <= self.budget.token_budget:
                return
            await strategy.compact(state)
        state.keep_newest(state.newest(self.budget.minimum_preserved), self.budget.token_budget)


def shown(messages: tuple[Message, ...]) -> list[tuple[Any, ...]]:
    """What a view or records say, without the fresh ids of the records."""
    return [
        (m.role, m.text, m.tool_calls, m.tool_results, sorted(m.metadata.items())) for m in messages
    ]


def sized_log(rng: random.Random) -> list[Message]:
    """Turns with texts of random sizes, results mostly larger, some errors."""

    def words(*counts: int) -> str:
        return " word" * rng.choice(counts or (0, 5, 40, 40))

    log = [Message.system("s")]
    for number in range(rng.randint(1, 40)):
        log.append(Message.user(f"question {number}{words()}"))
        if rng.random() < 0.7:
            ids = [f"t{number}c{k}" for k in range(rng.randint(1, 3))]
            calls = [ToolCall(i, "get_weather", {"city": i}) for i in ids]
            log.append(Message.assistant(words().strip(), tool_calls=calls))
            log += [Message.tool(i, f"result{words(1, 40, 400)}", rng.random() < 0.2) for i in ids]
        if rng.random() < 0.8:
            log.append(Message.assistant(f"answer {number}{words()}"))
        if rng.random() < 0.1:
            log.append(Message.developer(f"note {number}"))
    return log


@pytest.mark.parametrize(
    ("anyio_backend", "seed"), [(("asyncio", "trio")[seed % 2], seed) for seed in range(30)]
)  # each seed under one event loop, the two in turn: the budgets work alike under either
async def test_token_budget_gives_what_the_whole_view_would(seed: int) -> None:
    """Budgets from the whole log to a tiny share of it, on a random log: the same view
    and records as when every strategy works on the whole view."""
    rng = random.Random(seed)
    log = sized_log(rng)
    groups = group_messages(log)
    total = estimate_messages(log)
    turns = sum(m.role == "user" for m in log)
    collapse = functools.partial(ToolResultCompaction, max_result_chars=rng.randint(16, 200))
    strategy_sets: list[list[CompactionStrategy]] = [
        [collapse(keep_last_tool_call_groups=rng.randint(0, 3))],
        [collapse(keep_last_tool_call_groups=0), ToolResultCompaction(max_result_chars=16)],
        [collapse(trigger=turns_exceed(rng.randint(0, turns)))],
        [collapse(target=~tokens_exceed(rng.randint(1, total)))],
        [collapse(), Truncation(minimum_preserved=rng.randint(0, 4))],
        [SelectiveToolCallCompaction(keep_last_tool_call_groups=rng.randint(0, 2))],
    ]
    for strategies in strategy_sets:
        for share in (1, 2, 3, 5, 8, 13, 21, 34):
            budget = TokenBudget(
                token_budget=max(1, total // share),
                strategies=strategies,
                minimum_preserved=rng.randint(0, 6),
            )
            protected = rng.choice([None, rng.randint(0, len(groups))])
            pinned = {rng.randrange(len(groups)) for _ in range(rng.randint(0, 2))}
            fast = budget_state(groups, protected, pinned)
            await budget.compact(fast)
            naive = budget_state(groups, protected, pinned)
            await NaiveTokenBudget(budget).compact(naive)
            assert shown(tuple(fast.view())) == shown(tuple(naive.view())), budget
            assert shown(fast.records()) == shown(naive.records())
            assert (fast.messages, fast.turns) == (naive.messages, naive.turns)


def whole_count(limit: int, *, over: bool = True) -> Trigger:
    """``tokens_exceed(limit)`` (``over=False``: its negation) as a plain trigger, which
    reads the whole count."""

    def holds(metrics: Any) -> bool:
        return bool(metrics.tokens > limit) is over

    return holds


def token_strategies(trigger: Trigger, target: Trigger, fits: Trigger) -> list[CompactionStrategy]:
    return [
        Truncation(trigger=trigger, target=target, minimum_preserved=1),
        Pipeline(
            Truncation(target=fits, minimum_preserved=1),
            ToolResultCompaction(trigger=trigger, keep_last_tool_call_groups=0),
            trigger=trigger,
        ),
        SlidingWindow(keep_last_groups=3, trigger=trigger, target=target),
        ToolResultCompaction(trigger=trigger, target=target, keep_last_tool_call_groups=0),
        SelectiveToolCallCompaction(trigger=trigger, target=target),
        TurnExcerpts(trigger=trigger, target=target),
        Pipeline(ToolResultCompaction(target=target), Truncation(target=target), trigger=trigger),
    ]


@pytest.mark.parametrize("seed", range(30))
async def test_token_triggers_decide_as_the_whole_count_would(seed: int) -> None:
    """``tokens_exceed`` as a trigger or in a target estimates from the newest group back
    only as far as it must, and remembers that walk across steps: on a random log, every
    strategy gives the same view as with triggers that read the whole count."""
    rng = random.Random(seed)
    log = sized_log(rng)
    total = estimate_messages(log)
    for _ in range(6):
        limit, goal, keep = rng.randint(1, total), rng.randint(1, total), rng.randint(1, len(log))
        fits, plain_fits = ~tokens_exceed(goal), whole_count(goal, over=False)
        fast = token_strategies(tokens_exceed(limit), fits | ~messages_exceed(keep), fits)
        slow = token_strategies(
            whole_count(limit), any_of(plain_fits, ~messages_exceed(keep)), plain_fits
        )
        for quick, plain in zip(fast, slow, strict=True):
            expected = shown(await apply_compaction(log, plain))
            assert shown(await apply_compaction(log, quick)) == expected, (quick, limit, goal)


@pytest.mark.parametrize(
    "target",
    [None, any_of(~tokens_exceed(200), ~messages_exceed(4))],
    ids=["default target", "any_of"],
)
async def test_a_token_trigger_estimates_only_the_newest_groups(target: Trigger | None) -> None:
    log = [Message.system("s")]
    for number in range(500):
        log += turn(number)
    tokenizer = CountingTokenizer()
    strategy = Truncation(trigger=tokens_exceed(250), target=target)
    view = await apply_compaction(log, strategy, tokenizer=tokenizer)
    assert view[0] is log[0] and view[-1] is log[-1] and len(view) < len(log) // 10
    assert tokenizer.calls < len(log) // 10


def test_configuration_is_validated_with_the_parameter_named() -> None:
    with pytest.raises(
        ConfigurationError, match=r"Truncation.minimum_preserved must be an int >= 0"
    ):
        Truncation(minimum_preserved=-1)
    with pytest.raises(ConfigurationError, match=r"TokenBudget.token_budget must be an int >= 1"):
        TokenBudget(token_budget=0)
    with pytest.raises(ConfigurationError, match=r"keep_last_tool_call_groups"):
        ToolResultCompaction(keep_last_tool_call_groups=-2)
    with pytest.raises(ConfigurationError, match=r"Summarization.prompt"):
        Summarization(prompt=" ")
    with pytest.raises(ConfigurationError, match=r"Summarization.model"):
        Summarization(model="gpt")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Truncation(32)  # type: ignore[arg-type,call-arg]


# --- Invariants over random conversations -----------------------------------------------


def random_log(rng: random.Random) -> list[Message]:
    log = [Message.system("s")]
    for number in range(rng.randint(3, 14)):
        log += turn(number, calls=rng.randint(0, 3)) if rng.random() < 0.7 else turn(number)[:1]
        if rng.random() < 0.2:
            log.append(Message.developer(f"note {number}"))
    return log


STRATEGIES: list[CompactionStrategy] = [
    Truncation(minimum_preserved=3),
    Truncation(trigger=tokens_exceed(120), minimum_preserved=1),
    SlidingWindow(keep_last_turns=2),
    SlidingWindow(keep_last_groups=3, minimum_preserved=5),
    ToolResultCompaction(keep_last_tool_call_groups=1),
    SelectiveToolCallCompaction(keep_last_tool_call_groups=1),
    Pipeline(ToolResultCompaction(), Truncation(minimum_preserved=4)),
    TokenBudget(token_budget=150, strategies=[ToolResultCompaction()], minimum_preserved=2),
]


@pytest.mark.parametrize("seed", range(15))
async def test_groups_are_never_split_and_system_and_minimums_hold(seed: int) -> None:
    rng = random.Random(seed)
    log = random_log(rng)
    trusted = [m for m in log if m.role in ("system", "developer")]
    for strategy in STRATEGIES:
        view = await apply_compaction(log, strategy)
        assert_whole(view)
        assert [m for m in view if m.role in ("system", "developer")] == trusted
        originals = [m for m in view if m in log]
        assert originals == sorted(originals, key=log.index)  # order kept
        preserved = getattr(strategy, "minimum_preserved", 0)
        newest = [g for g in group_messages(log) if g.kind != "system"][-preserved:]
        if preserved:
            for group in newest:
                assert all(message in view for message in group.messages)


async def test_a_custom_strategy_works_on_the_state() -> None:
    """Anything with ``async compact(state)`` is a strategy: here, drop every answer and
    collapse the first tool-call group, whatever their age."""

    class DropAnswers:
        async def compact(self, state: CompactionState, /) -> None:
            collapsed = False
            for slot in range(state.slots):
                if not state.included(slot):
                    continue
                if state.kind(slot) == "assistant_text":
                    state.exclude(slot)
                elif state.kind(slot) == "tool_call" and not collapsed:
                    state.collapse(slot, f"[{state.group(slot).count} messages collapsed]")
                    collapsed = True

    log = conversation(3)
    view = await apply_compaction(log, DropAnswers())
    assert texts(view) == [
        "You are terse.",
        "question 0",
        "[2 messages collapsed]",
        "question 1",
        "",
        "",
        "question 2",
        "",
        "",
    ]
    with pytest.raises(ValueError, match="system groups"):
        await apply_compaction(log, SystemDropper())


async def test_state_steps_keep_the_metrics_current() -> None:
    """``within`` reads the counted tokens; excluding a group twice counts it once;
    collapsing a group that is not included is refused, naming the slot."""
    seen: dict[str, Any] = {}

    class Stepping:
        async def compact(self, state: CompactionState, /) -> None:
            tokens, size = state.tokens, state.size(1)
            seen["within"] = (state.within(tokens), state.within(tokens - 1))
            state.exclude(1)
            state.exclude(1)
            seen["after"] = (state.groups, state.messages, state.tokens)
            seen["within after"] = (state.within(tokens - size), state.within(tokens - size - 1))
            with pytest.raises(ValueError, match=r"slot 1 is not included"):
                state.collapse(1, "gone")
            seen["groups"], seen["size"] = state.slots, size

    log = conversation(2)
    (record,) = await compaction_records(log, Stepping(), tokenizer=None)
    assert seen["within"] == (True, False)
    assert seen["within after"] == (True, False)
    groups = seen["groups"]
    assert seen["after"] == (groups - 1, len(log) - 1, estimate_messages(log) - seen["size"])
    assert record.metadata["littleghost.compaction.covers"] == [log[1].id]


async def test_restore_puts_back_only_an_excluded_group() -> None:
    """A group merged into a record stays in it: restoring it changes nothing."""

    class Merging:
        async def compact(self, state: CompactionState, /) -> None:
            state.merge([1, 2], "[two groups]")
            state.restore(2)

    log = conversation(2)
    view = await apply_compaction(log, Merging())
    assert view[1].text == "[two groups]"
    assert [view[0], *view[2:]] == [log[0], *log[4:]]  # the call and its result in the record


class SystemDropper:
    async def compact(self, state: CompactionState, /) -> None:
        state.exclude(0)


class Guarded:
    """Protects the newest group and pins the first question, then removes ``slot``."""

    def __init__(self, step: str, slot: int) -> None:
        self.step, self.slot = step, slot

    async def compact(self, state: CompactionState, /) -> None:
        state.protected, state.pinned = state.slots - 1, frozenset({1})
        slot = self.slot % state.slots
        if self.step == "exclude":
            state.exclude(slot)
        elif self.step == "collapse":
            state.collapse(slot, "gone")
        elif self.step == "merge":
            state.merge([slot], "gone")
        else:
            state.summarize([slot], "gone")


@pytest.mark.parametrize("step", ["exclude", "collapse", "merge", "summarize"])
@pytest.mark.parametrize(
    ("slot", "why"),
    [(0, "slot 0 holds a system group"), (1, "slot 1 is pinned"), (-1, "slot 6 is protected")],
)
async def test_no_step_removes_a_system_pinned_or_protected_group(
    step: str, slot: int, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        await apply_compaction(conversation(2), Guarded(step, slot))
    log = conversation(2)
    assert log[2] not in await apply_compaction(log, Guarded(step, 2))  # an old group


class SyncCompact:
    def compact(self, state: CompactionState, /) -> None:
        state.exclude(1)


class NoState:
    async def compact(self) -> None:
        pass


class TwoStates:
    async def compact(self, state: CompactionState, other: CompactionState) -> None:
        pass


BAD_STRATEGIES = [
    (SyncCompact(), r"SyncCompact\.compact must be a coroutine function"),
    (NoState(), r"NoState\.compact must accept \(state\)"),
    (TwoStates(), r"TwoStates\.compact must accept \(state\)"),
]
PLACES: list[Callable[[Any], object]] = [
    lambda strategy: manage_context(strategy=strategy),
    lambda strategy: Pipeline(strategy),
    lambda strategy: Pipeline(strategies=[Truncation(), strategy]),
    lambda strategy: TokenBudget(token_budget=10, strategies=[strategy]),
]


@pytest.mark.parametrize(("strategy", "problem"), BAD_STRATEGIES)
@pytest.mark.parametrize("place", PLACES)
def test_a_strategy_that_cannot_be_called_as_the_protocol_says_is_refused(
    strategy: object, problem: str, place: Callable[[object], object]
) -> None:
    """Where it is given, not with a TypeError at every compaction."""
    with pytest.raises(ConfigurationError, match=problem):
        place(strategy)


@pytest.mark.parametrize(("strategy", "problem"), BAD_STRATEGIES)
async def test_apply_compaction_refuses_a_strategy_it_cannot_call(
    strategy: Any, problem: str
) -> None:
    with pytest.raises(ConfigurationError, match=rf"strategy: {problem}"):
        await apply_compaction(conversation(2), strategy)


async def test_a_strategy_whose_compact_changed_since_it_passed_is_checked_again() -> None:
    """A passed check is remembered per ``compact`` function and its code: a class given
    another compact, or a compact given another body, is refused at the next call."""

    class Replaced:
        async def compact(self, state: CompactionState, /) -> None:
            state.exclude(1)

    class Rewritten:
        async def compact(self, state: CompactionState, /) -> None:
            state.exclude(1)

    replaced, rewritten = Replaced(), Rewritten()
    for strategy in (replaced, rewritten):
        assert len(await apply_compaction(conversation(2), strategy)) == 8  # a question out
    Replaced.compact = SyncCompact.compact  # type: ignore[assignment]
    with pytest.raises(ConfigurationError, match=r"Replaced\.compact must be a coroutine"):
        await apply_compaction(conversation(2), replaced)
    Rewritten.compact.__code__ = NoState.compact.__code__
    with pytest.raises(ConfigurationError, match=r"Rewritten\.compact must accept \(state\)"):
        await apply_compaction(conversation(2), rewritten)


async def test_checking_a_strategy_keeps_no_reference_to_it() -> None:
    class Passing:
        async def compact(self, state: CompactionState, /) -> None:
            state.exclude(1)

    await apply_compaction(conversation(2), Passing())
    compact = weakref.ref(Passing.compact)
    del Passing
    gc.collect()
    assert compact() is None


def traced(method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def wrapper(self: object, state: CompactionState) -> Any:
        return method(self, state)

    return wrapper


class Traced:
    """A strategy whose async compact is wrapped by a plain decorator."""

    @traced
    async def compact(self, state: CompactionState, /) -> None:
        state.exclude(1)


async def test_a_decorated_async_compact_is_a_strategy() -> None:
    log = conversation(2)
    assert await apply_compaction(log, Pipeline(Traced())) == (log[0], *log[2:])


class Busy:
    """A trigger object."""

    def __call__(self, metrics: object) -> bool:
        return True


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda: Pipeline(Truncation), "Pipeline takes strategies"),
        (lambda: TokenBudget(token_budget=10, strategies=[Truncation]), "TokenBudget"),
        (lambda: Summarization(model=ScriptedModel), "Summarization.model must be"),
        (lambda: Truncation(trigger=Busy), "Truncation.trigger must be"),
    ],
)
def test_a_class_where_an_instance_belongs_fails_naming_the_class(
    make: Callable[[], object], name: str
) -> None:
    """Strategy, model and trigger classes pass method checks but are refused."""
    with pytest.raises(ConfigurationError, match=rf"{name}.*not the class \w+ \(did you mean"):
        make()


async def test_apply_compaction_refuses_a_strategy_class() -> None:
    with pytest.raises(ConfigurationError, match=r"not the class Truncation \(did you mean"):
        await apply_compaction(turn(1), Truncation)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda log: apply_compaction(log, Truncation(), tokenizer=3),
            ConfigurationError,
            r"apply_compaction: tokenizer must be an object with count_tokens\(text\)",
        ),
        (
            lambda log: apply_compaction(log, Truncation(), tokenizer=ByteEstimator),
            ConfigurationError,
            r"tokenizer must be .* not the class ByteEstimator \(did you mean",
        ),
        (
            lambda log: compaction_records(log, Truncation(), tokenizer="chars"),  # type: ignore[arg-type]
            ConfigurationError,
            r"compaction_records: tokenizer must be",
        ),
        (
            lambda log: compaction_records(
                log, Truncation(), tokenizer=None, settings={"temperature": math.nan}
            ),
            ConfigurationError,
            r"compaction_records: settings\['temperature'\]",
        ),
        (
            lambda log: compaction_records(
                log, Truncation(), tokenizer=None, settings={"model": "x"}
            ),
            ConfigurationError,
            r"compaction_records: settings: 'model' is set by littleghost",
        ),
        (lambda log: apply_compaction("hello", Truncation()), TypeError, r"messages must be a"),
        (
            lambda log: apply_compaction([*log, {"role": "user"}], Truncation()),
            TypeError,
            rf"messages\[{len(turn(1))}\] must be a Message, not dict",
        ),
    ],
)
async def test_ad_hoc_arguments_are_checked_as_a_run_checks_them(
    call: Callable[[list[Message]], Awaitable[object]], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        await call(turn(1))


async def test_a_message_reused_in_the_conversation_is_refused() -> None:
    """Records name ids: a reused one would hide every copy, the newest too."""
    ack = Message.assistant("Noted.")
    log = [Message.user("Order 42."), ack, Message.user("Gift-wrap it."), ack]
    with pytest.raises(ConfigurationError, match=r"messages\[1\] and messages\[3\] have the same"):
        await compaction_records(log, Truncation(minimum_preserved=2), tokenizer=None)
    with pytest.raises(ConfigurationError, match="an id of its own"):
        await apply_compaction(log, Truncation(minimum_preserved=2))


async def test_a_misplaced_tool_result_is_refused() -> None:
    log = [Message.user("Go."), Message.tool("c9", "42"), Message.assistant("Done.")]
    with pytest.raises(ConfigurationError, match=r"messages\[1\] holds a result for call 'c9'"):
        await apply_compaction(log, Truncation())
