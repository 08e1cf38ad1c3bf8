"""Triggers: thresholds, combinations, validation, and how strategies use them (start on
the trigger, stop on the target, re-evaluated after each step)."""

from __future__ import annotations

import functools
from typing import Any

import pytest

from littleghost import Message, ToolCall
from littleghost.context import (
    Pipeline,
    SelectiveToolCallCompaction,
    SlidingWindow,
    Summarization,
    Truncation,
    TurnExcerpts,
    all_of,
    always,
    any_of,
    apply_compaction,
    group_messages,
    groups_exceed,
    has_tool_calls,
    messages_exceed,
    never,
    tokens_exceed,
    turns_exceed,
)
from littleghost.context.tokens import estimate_messages
from littleghost.context.triggers import Not
from littleghost.errors import ConfigurationError
from littleghost.messages import SUMMARY_COVERS_KEY, SUMMARY_KEY

pytestmark = pytest.mark.anyio


class Busy:
    """A trigger object."""

    def __call__(self, metrics: object) -> bool:
        return True


class Size:
    """A conversation's size, as a strategy's state reports it."""

    def __init__(
        self, tokens: int = 0, messages: int = 0, groups: int = 0, turns: int = 0, tools: int = 0
    ) -> None:
        self.tokens = tokens
        self.messages = messages
        self.groups = groups
        self.turns = turns
        self.tool_call_groups = tools


def conversation(turns: int) -> list[Message]:
    log = [Message.system("sys")]
    for turn in range(turns):
        log += [
            Message.user(f"weather {turn}?"),
            Message.assistant(tool_calls=[ToolCall(f"c{turn}", "get_weather", {"n": turn})]),
            Message.tool(f"c{turn}", f"sunny {turn}"),
            Message.assistant(f"sunny {turn}"),
        ]
    return log


def test_thresholds_hold_strictly_above_their_limit() -> None:
    assert tokens_exceed(10)(Size(tokens=11)) and not tokens_exceed(10)(Size(tokens=10))
    assert messages_exceed(3)(Size(messages=4)) and not messages_exceed(3)(Size(messages=3))
    assert turns_exceed(2)(Size(turns=3)) and not turns_exceed(2)(Size(turns=2))
    assert groups_exceed(5)(Size(groups=6)) and not groups_exceed(5)(Size(groups=5))
    assert has_tool_calls()(Size(tools=1)) and not has_tool_calls()(Size(tools=0))
    assert always(Size()) and not never(Size())


def test_combinations() -> None:
    both = all_of(has_tool_calls(), tokens_exceed(100))
    assert both(Size(tokens=101, tools=1))
    assert not both(Size(tokens=101)) and not both(Size(tokens=100, tools=1))
    either = any_of(turns_exceed(4), messages_exceed(10))
    assert either(Size(turns=5)) and either(Size(messages=11)) and not either(Size())
    assert all_of()(Size()) and not any_of()(Size())
    assert (tokens_exceed(1) & has_tool_calls())(Size(tokens=2, tools=1))
    assert (tokens_exceed(1) | has_tool_calls())(Size(tools=1))
    assert (~tokens_exceed(1))(Size(tokens=1)) and not (~tokens_exceed(1))(Size(tokens=2))
    assert all_of(lambda size: size.turns == 2)(Size(turns=2))  # any callable is a trigger


def test_a_default_target_is_the_plain_opposite_of_the_trigger() -> None:
    """Without a target a strategy stops when its trigger no longer holds: ``never`` and
    ``always`` swap, and a negated trigger's opposite is the trigger itself."""
    limit = tokens_exceed(10)
    assert Truncation(trigger=never).goal is always
    assert Truncation(trigger=always).goal is never
    assert Truncation(trigger=~limit).goal is limit
    assert Truncation(trigger=limit).goal == Not(limit)


@pytest.mark.parametrize(
    ("make", "value"),
    [
        (tokens_exceed, -1),
        (messages_exceed, 1.5),
        (turns_exceed, True),
        (groups_exceed, "3"),
    ],
)
def test_limits_must_be_counts(make: object, value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"must be an int >= 0"):
        make(value)  # type: ignore[operator]


def test_combinations_take_only_triggers() -> None:
    with pytest.raises(ConfigurationError, match="all_of takes triggers"):
        all_of("tokens")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"Truncation\.trigger"):
        Truncation(trigger=5)  # type: ignore[arg-type]


def no_metrics() -> bool:
    return True


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda t: Truncation(trigger=t), r"Truncation\.trigger"),
        (lambda t: Summarization(target=t), r"Summarization\.target"),
        (lambda t: SlidingWindow(keep_last_turns=1, target=t), r"SlidingWindow\.target"),
        (lambda t: TurnExcerpts(trigger=t), r"TurnExcerpts\.trigger"),
        (lambda t: Pipeline(trigger=t), r"Pipeline\.trigger"),
        (lambda t: all_of(t), "all_of"),
        (lambda t: any_of(always, t), "any_of"),
        (lambda t: tokens_exceed(1) & t, "all_of"),
        (lambda t: tokens_exceed(1) | t, "any_of"),
        (Not, "~trigger"),
    ],
)
@pytest.mark.parametrize("trigger", [no_metrics, lambda metrics, limit: True])
def test_a_trigger_that_cannot_take_the_metrics_is_refused(
    make: Any, name: str, trigger: Any
) -> None:
    """Refused where it is given, not with a TypeError at every compaction."""
    with pytest.raises(ConfigurationError, match=rf"{name}.*must accept \(metrics\)"):
        make(trigger)


async def async_trigger(metrics: Any) -> bool:
    return False


class AsyncTrigger:
    async def __call__(self, metrics: Any) -> bool:
        return False


@pytest.mark.parametrize(
    ("make", "name"),
    [
        (lambda t: SlidingWindow(keep_last_turns=1, trigger=t), r"SlidingWindow\.trigger"),
        (lambda t: Summarization(target=t), r"Summarization\.target"),
        (lambda t: any_of(always, t), "any_of"),
        (Not, "~trigger"),
    ],
)
@pytest.mark.parametrize(
    "trigger", [async_trigger, AsyncTrigger(), functools.partial(async_trigger)]
)
def test_an_async_trigger_is_refused(make: Any, name: str, trigger: Any) -> None:
    """Its coroutine is true whatever it would answer: the strategy would always fire."""
    with pytest.raises(ConfigurationError, match=rf"{name}.*, a trigger, is a coroutine function"):
        make(trigger)


@pytest.mark.parametrize(
    "trigger", [lambda metrics: True, lambda metrics, limit=3: True, lambda *metrics: True, Busy()]
)
def test_any_callable_taking_the_metrics_is_a_trigger(trigger: Any) -> None:
    assert all_of(Truncation(trigger=trigger).trigger).triggers == (trigger,)


async def test_a_trigger_that_does_not_hold_leaves_the_conversation_alone() -> None:
    log = conversation(10)  # 41 messages
    view = await apply_compaction(log, Truncation(trigger=messages_exceed(41), minimum_preserved=1))
    assert view == tuple(log)
    view = await apply_compaction(log, Truncation(trigger=messages_exceed(40), minimum_preserved=1))
    assert len(view) == 40  # one user group gone: the default target is "41 or fewer"


async def test_the_target_is_rechecked_after_each_step() -> None:
    log = conversation(10)
    sizes = [estimate_messages([message]) for message in log]
    total = sum(sizes)
    view = await apply_compaction(
        log,
        Truncation(
            trigger=tokens_exceed(total - 1), target=~tokens_exceed(total // 2), minimum_preserved=0
        ),
    )
    kept = estimate_messages(view)
    assert kept <= total // 2
    # One group fewer would already have been over the target: it stopped right there.
    dropped = [m for m in log if m not in view]
    last_group = next(g for g in group_messages(log) if dropped[-1] in g.messages)
    assert kept + last_group.tokens > total // 2


async def test_turns_count_user_groups_not_summaries() -> None:
    summary = Message.user("s", metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: []})
    log = [summary, *conversation(3)[1:]]
    view = await apply_compaction(log, Truncation(trigger=turns_exceed(3), minimum_preserved=0))
    assert view[0] is summary  # three turns: not over
    view = await apply_compaction(log, Truncation(trigger=turns_exceed(2), minimum_preserved=0))
    assert [m.text for m in view if m.role == "user"] == ["weather 1?", "weather 2?"]


async def test_has_tool_calls_gates_a_strategy() -> None:
    chat = [Message.user("hi"), Message.assistant("hello")]
    strategy = SelectiveToolCallCompaction(
        keep_last_tool_call_groups=0, trigger=all_of(has_tool_calls(), messages_exceed(1))
    )
    assert await apply_compaction(chat, strategy) == tuple(chat)
    view = await apply_compaction(conversation(2), strategy)
    assert not any(m.tool_calls or m.tool_results for m in view)
