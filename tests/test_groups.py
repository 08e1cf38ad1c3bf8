"""Message groups: kinds, tool-call pairing by id (parallel, non-adjacent, duplicated),
sizes, and that grouping never loses a message or separates a call from its results."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from littleghost import Message, Role, TextPart, ToolCall, ToolResult
from littleghost.context import (
    ByteEstimator,
    CharacterEstimator,
    MessageGroup,
    build_view,
    group_messages,
)
from littleghost.context.groups import Layout, result_calls
from littleghost.context.records import (
    COLLAPSE,
    COMPACTION_COVERS_KEY,
    COMPACTION_KIND_KEY,
    EXCLUSION,
)
from littleghost.context.tokens import estimate_messages, prompt_text
from littleghost.errors import ConfigurationError
from littleghost.messages import SUMMARY_COVERS_KEY, SUMMARY_KEY


def call(call_id: str, name: str = "get_weather", **arguments: str) -> ToolCall:
    return ToolCall(call_id, name, arguments or {"city": "Oslo"})


def kinds(groups: tuple[MessageGroup, ...]) -> list[str]:
    return [group.kind for group in groups]


def test_each_kind_of_group() -> None:
    summary = Message.user("earlier", metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: ["x"]})
    messages = [
        Message.system("be brief"),
        Message.developer("use metric units"),
        summary,
        Message.user("weather?"),
        Message.assistant(tool_calls=[call("a")]),
        Message.tool("a", "sunny"),
        Message.assistant("It is sunny."),
    ]
    groups = group_messages(messages)
    assert kinds(groups) == ["system", "summary", "user", "tool_call", "assistant_text"]
    assert groups[0].messages == tuple(messages[:2])
    assert groups[3].messages == (messages[4], messages[5])


def test_parallel_calls_and_their_results_are_one_group() -> None:
    ask = Message.assistant("Checking both.", tool_calls=[call("a"), call("b", city="Rome")])
    first, second = Message.tool("b", "rain"), Message.tool("a", "sunny")
    groups = group_messages([Message.user("two cities?"), ask, first, second])
    assert kinds(groups) == ["user", "tool_call"]
    assert groups[1].messages == (ask, first, second)


def test_a_tool_message_pairs_by_its_results_alone() -> None:
    """Other parts of a tool message (a text part) take no part in the pairing."""
    ask = Message.assistant(tool_calls=[call("a")])
    result = Message(Role.TOOL, [TextPart("note"), ToolResult("a", "sunny")])
    groups = group_messages([Message.user("weather?"), ask, result])
    assert kinds(groups) == ["user", "tool_call"]
    assert groups[1].messages == (ask, result)


def test_a_result_joins_its_call_even_when_not_adjacent() -> None:
    ask = Message.assistant(tool_calls=[call("a")])
    interjection = Message.user("also, hurry")
    result = Message.tool("a", "sunny")
    groups = group_messages([ask, interjection, result, Message.assistant("Sunny.")])
    assert kinds(groups) == ["tool_call", "user", "assistant_text"]
    assert groups[0].messages == (ask, result)
    assert groups[1].messages == (interjection,)


def test_a_duplicated_id_pairs_each_result_with_the_nearest_open_call() -> None:
    first = Message.assistant(tool_calls=[call("dup")])
    second = Message.assistant(tool_calls=[call("dup")])
    answer_second, answer_first = Message.tool("dup", "2"), Message.tool("dup", "1")
    groups = group_messages([first, second, answer_second, answer_first])
    assert [group.messages for group in groups] == [(first, answer_first), (second, answer_second)]


def test_a_reused_id_after_an_answer_pairs_with_the_new_call() -> None:
    first, answer_first = Message.assistant(tool_calls=[call("x")]), Message.tool("x", "1")
    second, answer_second = Message.assistant(tool_calls=[call("x")]), Message.tool("x", "2")
    groups = group_messages([first, answer_first, second, answer_second])
    assert [group.messages for group in groups] == [(first, answer_first), (second, answer_second)]


def test_a_result_that_answers_no_call_is_a_group_of_its_own() -> None:
    stray = Message.tool("nobody", "lost")
    groups = group_messages([Message.user("hi"), stray])
    assert kinds(groups) == ["user", "tool_call"]
    assert groups[1].messages == (stray,)


def test_result_calls_pairs_only_the_results_that_answer_an_open_call() -> None:
    """A tool message's results that answer another assistant message's call, or a call
    already answered, pair with nothing; the others pair with their call, in call order."""
    first = Message.assistant(tool_calls=[call("a"), call("a")])
    second = Message.assistant(tool_calls=[call("b")])
    mixed = Message(
        Role.TOOL,
        [ToolResult("a", "1"), ToolResult("b", "2"), ToolResult("a", "3"), ToolResult("a", "4")],
    )
    log = [first, second, mixed]
    assert result_calls(log) == {(2, 0): (0, 0), (2, 2): (0, 1)}
    assert Layout.scanned(log, records=False).misplaced == [(2, "b"), (2, "a")]


def test_an_unanswered_call_is_a_tool_call_group() -> None:
    ask = Message.assistant(tool_calls=[call("a")])
    assert kinds(group_messages([ask])) == ["tool_call"]


def test_sizes_count_bytes_and_tokens() -> None:
    ask = Message.assistant(tool_calls=[call("a", city="Zürich")])
    result = Message.tool("a", "sonnig, 18°C")
    (group,) = group_messages([ask, result])
    assert group.count == 2
    assert group.bytes == sum(len(prompt_text(m).encode("utf-8")) for m in (ask, result))
    assert group.bytes > sum(len(prompt_text(m)) for m in (ask, result))  # ü and ° are 2 bytes
    assert group.tokens == estimate_messages([ask, result])
    (by_bytes,) = group_messages([ask, result], tokenizer=ByteEstimator())
    assert by_bytes.tokens == estimate_messages([ask, result], ByteEstimator())
    assert by_bytes.tokens != group.tokens


@pytest.mark.parametrize(
    "arguments",
    [{}, {"note": 'say "hi"\n', "city": "Zürich"}, {"n": 1, "tags": ["a", None]}, "not json {"],
)
def test_a_character_estimate_is_a_quarter_of_the_weighed_prompt_text(arguments: object) -> None:
    """Each é and ü (2 UTF-8 bytes) weighs 2.5 characters."""
    message = Message.assistant("héllo", tool_calls=[ToolCall("a", "f", arguments)])
    result = Message.tool("a", 'line\n"quoted" ü')
    for chars_per_token in (4, 2, 1):
        tokenizer = CharacterEstimator(chars_per_token=chars_per_token)
        for item in (message, result):
            text = prompt_text(item)
            weighed = len(text) + 1.5 * sum(character in "éü" for character in text)
            expected = math.ceil(weighed / chars_per_token)
            assert group_messages([item], tokenizer)[0].tokens == expected


def test_grouping_leaves_its_input_as_it_was() -> None:
    messages = [
        Message.user("q"),
        Message.assistant(tool_calls=[call("a")]),
        Message.tool("a", "r"),
    ]
    before = list(messages)
    group_messages(messages)
    assert messages == before and all(a is b for a, b in zip(messages, before, strict=True))


def random_conversation(rng: random.Random, turns: int) -> list[Message]:
    """Turns with parallel calls, late and out-of-order results, reused ids and strays."""
    messages: list[Message] = [Message.system("sys")]
    waiting: list[str] = []
    for turn in range(turns):
        messages.append(Message.user(f"question {turn}"))
        for step in range(rng.randint(0, 2)):
            ids = [f"c{rng.randint(0, 5)}" for _ in range(rng.randint(1, 3))]
            messages.append(Message.assistant(tool_calls=[call(i) for i in ids]))
            waiting.extend(ids)
            rng.shuffle(waiting)
            while waiting and rng.random() < 0.8:
                messages.append(Message.tool(waiting.pop(), f"result {turn}.{step}"))
        if rng.random() < 0.1:
            messages.append(Message.tool("stray", "nobody asked"))
        messages.append(Message.assistant(f"answer {turn}"))
    return messages


@pytest.mark.parametrize("seed", range(20))
def test_no_message_is_lost_and_no_result_leaves_its_call(seed: int) -> None:
    messages = random_conversation(random.Random(seed), 12)
    groups = group_messages(messages)
    flat = [message for group in groups for message in group.messages]
    assert sorted(map(id, flat)) == sorted(map(id, messages))
    for group in groups:
        if group.kind != "tool_call" or not group.messages[0].tool_calls:
            assert all(not message.tool_results for message in group.messages) or (group.count == 1)
            continue
        calls = [c.id for c in group.messages[0].tool_calls]
        for message in group.messages[1:]:
            assert message.tool_results[0].call_id in calls


def summary_of(covered: list[Message]) -> Message:
    return Message.user(
        "earlier", metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: [m.id for m in covered]}
    )


def random_log(rng: random.Random, size: int) -> list[Message]:
    """Plain messages, calls with reused ids, late results and compaction records."""
    log: list[Message] = []
    calls: list[str] = []
    for position in range(size):
        draw = rng.random()
        if draw < 0.2 or position < 2:
            log.append(Message.user(f"u{position}"))
        elif draw < 0.3:
            log.append(Message.assistant(f"a{position}"))
        elif draw < 0.5:
            asked = [call(f"c{rng.randint(0, 6)}") for _ in range(rng.randint(1, 3))]
            calls.extend(c.id for c in asked)
            log.append(Message.assistant(tool_calls=asked))
        elif draw < 0.7 and calls:
            log.append(Message.tool(rng.choice(calls), f"r{position}"))
        elif draw < 0.8:
            log.append(Message.system(f"s{position}"))
        else:
            covered = rng.sample(log, rng.randint(1, min(3, len(log))))
            kind = rng.choice(["summary", "summary", COLLAPSE, EXCLUSION])
            if kind == "summary":
                log.append(summary_of(covered))
            else:
                covers = [m.id for m in covered]
                metadata = {COMPACTION_KIND_KEY: kind, COMPACTION_COVERS_KEY: covers}
                log.append(Message.assistant("record", metadata=metadata))
    return log


def group_shape(layout: Layout) -> tuple[object, ...]:
    kinds, members = layout.slots()
    return kinds, [[m.id for m in group] for group in members]


def test_extending_groups_past_a_pending_summary_counts_it_once() -> None:
    question = Message.user("weather?")
    summary = summary_of([question])
    earlier = [question, summary]
    rules, follow_up = Message.system("be brief"), Message.user("and tomorrow?")
    for added, expected in (
        ([follow_up], ["summary", "user"]),
        ([rules], ["system", "summary"]),
        ([rules, follow_up], ["system", "summary", "user"]),
    ):
        log = [*earlier, *added]
        layout = Layout.build(earlier).extend(log)
        assert layout is not None
        assert layout.slots()[0] == expected
        assert len(layout.messages()) == len(log) - 1
        assert group_shape(layout) == group_shape(Layout.build(log))


@pytest.mark.parametrize("seed", range(300))
def test_extending_groups_equals_grouping_afresh(seed: int) -> None:
    rng = random.Random(seed)
    log = random_log(rng, rng.randint(1, 16))
    fresh = group_shape(Layout.build(log))
    for size in range(len(log) + 1):  # the last extension adds nothing
        layout = Layout.build(log[:size]).extend(log)
        if layout is None:  # the added messages hold a record: built afresh instead
            continue
        assert group_shape(layout) == fresh, size


@pytest.mark.parametrize(
    ("call", "error", "named"),
    [
        (lambda: group_messages(None), TypeError, "group_messages: messages must be"),
        (lambda: group_messages(["hi"]), TypeError, "group_messages: messages must hold"),
        (lambda: group_messages({"a": 1}), TypeError, "group_messages: messages must be"),
        (
            lambda: group_messages([], tokenizer=None),
            ConfigurationError,
            "group_messages: tokenizer must be",
        ),
        (lambda: build_view(None), TypeError, "build_view: log must be"),
        (lambda: build_view([Message.user("hi"), "hi"]), TypeError, "build_view: log must hold"),
    ],
)
def test_wrong_arguments_are_named(call: Any, error: type[Exception], named: str) -> None:
    """Not an AttributeError, KeyError or len() error from inside."""
    with pytest.raises(error, match=named):
        call()
