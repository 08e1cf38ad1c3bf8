"""Triggers: predicates over the size of a conversation under compaction, re-evaluated
after each step ("Compaction strategies" in docs/context.md tells more). Every count is of what
is still included (kept or collapsed, not excluded), system messages included."""

from __future__ import annotations

import inspect
from typing import Any, Protocol

from attrs import field, frozen

from littleghost._validators import Validator, check, count, is_callable, wrong_value
from littleghost.errors import ConfigurationError
from littleghost.hooks import check_signature

__all__ = [
    "Metrics",
    "Not",
    "TokensExceed",
    "Trigger",
    "all_of",
    "always",
    "any_of",
    "groups_exceed",
    "has_tool_calls",
    "messages_exceed",
    "never",
    "tokens_exceed",
    "turns_exceed",
]


class Metrics(Protocol):
    """What a trigger reads: the included size of the conversation, kept current (estimated
    tokens; turns are user groups; groups as the log was read, so two system groups stay
    two when what stood between them is left out)."""

    @property
    def tokens(self) -> int: ...
    @property
    def messages(self) -> int: ...
    @property
    def groups(self) -> int: ...
    @property
    def turns(self) -> int: ...
    @property
    def tool_call_groups(self) -> int: ...


class Trigger(Protocol):
    """Whether compaction should start (a trigger) or may stop (a target)."""

    def __call__(self, metrics: Metrics, /) -> bool: ...


def check_trigger(name: str) -> Validator:
    """An attrs validator: the value is a trigger, a callable taking the metrics."""

    def validate(instance: object, attribute: object, value: Any) -> None:
        check(name, is_callable, "a trigger (a callable)")(instance, attribute, value)
        _takes_metrics(name, value)

    return validate


def _takes_metrics(name: str, trigger: Trigger) -> None:
    """``ConfigurationError`` unless ``trigger`` can be called with the metrics and answers
    at once (an ``async def``'s coroutine would be true, whatever it meant to answer)."""
    calls = (inspect.unwrap(trigger), type(trigger).__call__)
    if any(map(inspect.iscoroutinefunction, calls)):
        raise ConfigurationError(
            f"{name}, a trigger, is a coroutine function (async def): a trigger answers "
            "at once, with a bool; make it a plain def"
        )
    check_signature(f"{name}, a trigger,", trigger, "(metrics)", 1, context=False)


class _Combine:
    """Operators shared by the built-in triggers."""

    __slots__ = ()

    def __and__(self, other: Trigger) -> AllOf:
        return all_of(self, other)  # type: ignore[arg-type]

    def __or__(self, other: Trigger) -> AnyOf:
        return any_of(self, other)  # type: ignore[arg-type]

    def __invert__(self) -> Not:
        return Not(self)  # type: ignore[arg-type]


@frozen
class Always(_Combine):
    """Always holds."""

    def __call__(self, metrics: Metrics, /) -> bool:
        return True


@frozen
class Never(_Combine):
    """Never holds (disables a strategy, or makes it run to its limits as a target)."""

    def __call__(self, metrics: Metrics, /) -> bool:
        return False


@frozen
class TokensExceed(_Combine):
    """Holds when the estimated tokens exceed ``limit`` (``tokens_exceed(limit)``)."""

    limit: int = field(validator=count("tokens_exceed(limit)"))

    def __call__(self, metrics: Metrics, /) -> bool:
        within = getattr(metrics, "within", None)  # a strategy's state estimates only the newest
        return metrics.tokens > self.limit if within is None else not within(self.limit)


@frozen
class MessagesExceed(_Combine):
    """Holds when the messages exceed ``limit`` (``messages_exceed(limit)``)."""

    limit: int = field(validator=count("messages_exceed(limit)"))

    def __call__(self, metrics: Metrics, /) -> bool:
        return metrics.messages > self.limit


@frozen
class TurnsExceed(_Combine):
    """Holds when the user turns exceed ``limit`` (``turns_exceed(limit)``)."""

    limit: int = field(validator=count("turns_exceed(limit)"))

    def __call__(self, metrics: Metrics, /) -> bool:
        return metrics.turns > self.limit


@frozen
class GroupsExceed(_Combine):
    """Holds when the groups exceed ``limit`` (``groups_exceed(limit)``)."""

    limit: int = field(validator=count("groups_exceed(limit)"))

    def __call__(self, metrics: Metrics, /) -> bool:
        return metrics.groups > self.limit


@frozen
class HasToolCalls(_Combine):
    """Holds when a tool-call group is included (``has_tool_calls()``)."""

    def __call__(self, metrics: Metrics, /) -> bool:
        return metrics.tool_call_groups > 0


def _triggers(name: str, triggers: tuple[Any, ...]) -> tuple[Trigger, ...]:
    """``triggers``, given to ``name``, once each is checked to be a trigger."""
    for trigger in triggers:
        if not is_callable(trigger):
            raise ConfigurationError(
                f"{name} takes triggers (callables), not {wrong_value(trigger)}"
            )
        _takes_metrics(f"{name}'s {getattr(trigger, '__qualname__', repr(trigger))}", trigger)
    return triggers


@frozen
class AllOf(_Combine):
    """Every one of ``triggers`` holds (true when there are none)."""

    triggers: tuple[Trigger, ...]

    def __call__(self, metrics: Metrics, /) -> bool:
        return all(trigger(metrics) for trigger in self.triggers)


@frozen
class AnyOf(_Combine):
    """At least one of ``triggers`` holds (false when there are none)."""

    triggers: tuple[Trigger, ...]

    def __call__(self, metrics: Metrics, /) -> bool:
        return any(trigger(metrics) for trigger in self.triggers)


@frozen
class Not(_Combine):
    """``trigger`` does not hold: the default target of a strategy."""

    trigger: Trigger = field(validator=check_trigger("~trigger"))

    def __call__(self, metrics: Metrics, /) -> bool:
        return not self.trigger(metrics)


always = Always()  # the default trigger
never = Never()
tokens_exceed = TokensExceed
messages_exceed = MessagesExceed
turns_exceed = TurnsExceed
groups_exceed = GroupsExceed
has_tool_calls = HasToolCalls


def all_of(*triggers: Trigger) -> AllOf:
    """Holds when every one of ``triggers`` holds."""
    return AllOf(_triggers("all_of", triggers))


def any_of(*triggers: Trigger) -> AnyOf:
    """Holds when at least one of ``triggers`` holds."""
    return AnyOf(_triggers("any_of", triggers))


def negate(trigger: Trigger) -> Trigger:
    """The opposite of ``trigger`` (``always`` and ``never`` swap)."""
    if isinstance(trigger, Always):
        return never
    if isinstance(trigger, Never):
        return always
    if isinstance(trigger, Not):
        return trigger.trigger
    return Not(trigger)
