"""Model settings: checked where they are declared, before anything is sent or stored.

Settings reach the provider as request parameters (``max_tokens``, ``temperature``, ...).
The keys littleghost fills in itself are reserved, the settings every provider shares
must have the right type and range, and no value may hold NaN, an infinity or an int
with more digits than Python writes (a request's JSON cannot carry them); a wrong one is
a ``ConfigurationError`` naming it — at class definition for ``Agent.settings``, at the
call for ``run(settings=)``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from littleghost._validators import holds_unwritable, is_int, is_number, safe_repr
from littleghost.errors import ConfigurationError

__all__ = [
    "MAX_OUTPUT_TOKENS",
    "OUTPUT_CAP",
    "RESERVED_SETTINGS",
    "TYPED_SETTINGS",
    "ClassSettings",
    "check_settings",
    "is_output_cap",
]

RESERVED_SETTINGS = frozenset(
    {
        "messages",
        "model",
        "tools",
        "stream",
        "stream_options",
        "system",
        "functions",
        "function_call",
        "extra_headers",
        "extra_query",
        "extra_body",
        "timeout",
    }
)
"""Request parameters littleghost sets itself (instructions, tools, streaming, ...)."""


def _stop(value: object) -> bool:
    if isinstance(value, str):
        return True
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and all(isinstance(item, str) for item in value)
    )


MAX_OUTPUT_TOKENS = 2**31 - 1
"""The largest output cap littleghost sends (``max_tokens``, a summary's cap): a 32-bit
int, the most llama.cpp's server takes (a larger one wraps around there: 2**32 + 3 is
3); every provider's models stop far below it."""


OUTPUT_CAP = f"an int from 1 to {MAX_OUTPUT_TOKENS}"
"""What an output cap may be, as an error says it."""


def _ints(low: int, high: int) -> Callable[[Any], bool]:
    return lambda value: is_int(value) and low <= value <= high


is_output_cap = _ints(1, MAX_OUTPUT_TOKENS)
"""True for an output cap littleghost sends: an int from 1 to ``MAX_OUTPUT_TOKENS``."""
_TYPED: dict[str, tuple[Callable[[Any], bool], str]] = {
    # what one provider or another takes (OpenAI's seed is an int64, llama.cpp's a
    # uint64; top_k -1 and 0 turn it off on llama.cpp and vLLM, and Anthropic takes 0)
    "max_tokens": (is_output_cap, OUTPUT_CAP),
    "max_completion_tokens": (is_output_cap, OUTPUT_CAP),
    "temperature": (lambda v: is_number(v) and v >= 0, "a finite number >= 0"),
    "top_p": (lambda v: is_number(v) and 0 <= v <= 1, "a number in [0, 1]"),
    "top_k": (_ints(-1, MAX_OUTPUT_TOKENS), f"an int from -1 to {MAX_OUTPUT_TOKENS}"),
    "frequency_penalty": (is_number, "a finite number"),
    "presence_penalty": (is_number, "a finite number"),
    "seed": (_ints(-(2**63), 2**64 - 1), "a 64-bit int (from -2**63 to 2**64 - 1)"),
    "n": (_ints(1, MAX_OUTPUT_TOKENS), OUTPUT_CAP),
    "top_logprobs": (_ints(0, MAX_OUTPUT_TOKENS), f"an int from 0 to {MAX_OUTPUT_TOKENS}"),
    "logprobs": (lambda v: isinstance(v, bool), "True or False"),
    "parallel_tool_calls": (lambda v: isinstance(v, bool), "True or False"),
    "stop": (_stop, "a str or a list of str"),
}


TYPED_SETTINGS = frozenset(_TYPED)
"""The settings whose type and range littleghost checks."""


def _shown(value: object) -> str:
    if value is None or isinstance(value, (bool, int)):
        return safe_repr(value)
    if isinstance(value, float):
        return repr(value) if math.isfinite(value) else str(value)
    return type(value).__name__


def check_settings(owner: str, value: object) -> dict[str, Any]:
    """A copy of ``value`` if it is a valid settings mapping.

    Args:
        owner: Where the settings come from, for the message (``"Support.settings"``).
        value: The settings.

    Raises:
        ConfigurationError: Not a mapping with str keys, a reserved key, a shared
            setting of the wrong type or range, or a value holding NaN, an infinity or an
            int too long to write (the message names it).
    """
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ConfigurationError(f"{owner} must be a mapping with str keys, not {_shown(value)}")
    for key, item in value.items():
        if key in RESERVED_SETTINGS:
            raise ConfigurationError(
                f"{owner}: {key!r} is set by littleghost and cannot be a model setting"
            )
        rule = _TYPED.get(key)
        if rule is not None and not rule[0](item):
            raise ConfigurationError(f"{owner}[{key!r}] must be {rule[1]}, not {_shown(item)}")
        try:
            unwritable = holds_unwritable(item)
        except RecursionError:
            raise ConfigurationError(
                f"{owner}[{key!r}] is nested too deep (or holds itself) for a request's JSON"
            ) from None
        if unwritable:
            raise ConfigurationError(
                f"{owner}[{key!r}] holds NaN or an infinity, or an int too long to write, "
                "which a request's JSON cannot carry"
            )
    return dict(value)


class ClassSettings(dict[str, Any]):
    """The settings an agent class or a mixin declares, as the class holds them: changed
    in place through that class alone. Read through a subclass or an instance, they are a
    read-only view of them, so that no change made there reaches the class, its other
    subclasses or their instances (a subclass declares its own; an instance takes
    ``settings=``)."""

    def __get__(self, instance: object, owner: type | None = None) -> Mapping[str, Any]:
        through_owner = instance is None and vars(owner or object).get("settings") is self
        return self if through_owner else MappingProxyType(self)
