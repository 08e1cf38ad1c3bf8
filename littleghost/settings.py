"""Model settings: checked where they are declared, before anything is sent or stored.

Settings reach the provider as request parameters (``max_tokens``, ``temperature``, ...).
The keys littleghost fills in itself are reserved, the settings every provider shares
must have the right type and range, a name spelt almost like one littleghost or a
provider knows (``max_token``, ``temprature``, ``top-p``, ``min_token``) or another
library's name for one (``max_new_tokens``, ``temp``) is refused, and no value may hold
NaN, an infinity or an int with more digits than Python writes (a request's JSON cannot
carry them); a wrong one is a ``ConfigurationError`` naming it — at class definition for
``Agent.settings``, at the call for ``run(settings=)``. A local model's server ignores
another provider's parameter: ``check_local_settings`` refuses it. Keys inside
``extra_body`` go into the request's body as they are, unchecked.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from littleghost._setting_names import (
    FOREIGN_SETTINGS,
    LLAMA_CPP_SETTINGS,
    OPENAI_SETTINGS,
    PROVIDER_SETTINGS,
    WHOSE,
)
from littleghost._validators import holds_unwritable, is_int, is_number, safe_repr
from littleghost.errors import ConfigurationError

__all__ = [
    "EXTRA_BODY",
    "MAX_OUTPUT_TOKENS",
    "OUTPUT_CAP",
    "RESERVED_SETTINGS",
    "TYPED_SETTINGS",
    "ClassSettings",
    "check_local_settings",
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

EXTRA_BODY = "extra_body"
"""The setting whose keys go into the request's body as they are (with an
OpenAI-compatible server, beside littleghost's; on Anthropic's API too), unchecked: the
way to send a provider's parameter that the near-miss check would take for a typo."""

_MEANT = TYPED_SETTINGS | {
    "tool_choice",
    "response_format",
    "reasoning_effort",
    "user",
    "thinking",
    "stop_sequences",
}
"""The settings littleghost checks or reads itself."""
_KNOWN = _MEANT | PROVIDER_SETTINGS
_NEAR = 0.85
"""How alike (``difflib``'s ratio) a name must be to one of ``_MEANT`` to be refused as
its near-miss: catches ``max_token``, ``temprature``, ``topp``; OpenRouter's ``top_a`` is
0.8 from ``top_p``."""
_NEAR_PROVIDER = 0.9
"""How alike a name must be to another of a provider's parameters (``PROVIDER_SETTINGS``)
to be refused as its near-miss: catches ``min_token`` (0.95 from vLLM's ``min_tokens``),
not other servers' own names for their samplers, longer or shorter by a word
(KoboldCpp's ``typical``, 0.875 from ``typical_p``; text-generation-webui's
``repetition_penalty_range``, 0.86 from ``repetition_penalty``)."""


def _snake_case(key: str) -> str:
    """``key`` in lower snake case: ``maxTokens``, ``top-p``, ``Temperature`` as meant."""
    return re.sub(r"[-\s]+", "_", re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", key)).lower()


def _near_miss(key: str) -> tuple[str, str] | None:
    """The setting ``key`` is spelt almost like, or is another library's name for, when it
    is not a name itself, with what to say of the two (``""`` when nothing)."""
    if key in _KNOWN:
        return None
    snake = _snake_case(key)
    if snake in FOREIGN_SETTINGS:
        meant, whose = FOREIGN_SETTINGS[snake]
        return meant, f" ({key!r} is {whose}; littleghost's providers take {meant!r})"
    if snake in _KNOWN:
        return snake, ""
    near = difflib.get_close_matches(snake, _MEANT, n=1, cutoff=_NEAR)
    if near:
        return near[0], ""
    near = difflib.get_close_matches(snake, PROVIDER_SETTINGS, n=1, cutoff=_NEAR_PROVIDER)
    return (near[0], f" ({WHOSE[near[0]]})" if near[0] in WHOSE else "") if near else None


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
        ConfigurationError: Not a mapping with str keys, a reserved key, a name spelt
            almost like a setting littleghost or a provider knows or another library's
            name for one (``FOREIGN_SETTINGS``), a shared setting of the wrong type
            or range, an ``extra_body`` that is not a mapping with str keys or holds a
            reserved key, or a value holding NaN, an infinity or an int too long to
            write (the message names it).
    """
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ConfigurationError(f"{owner} must be a mapping with str keys, not {_shown(value)}")
    for key, item in value.items():
        if key in RESERVED_SETTINGS:
            raise ConfigurationError(
                f"{owner}: {key!r} is set by littleghost and cannot be a model setting"
            )
        if key == EXTRA_BODY:
            _check_extra_body(owner, item)
        near = _near_miss(key)
        if near is not None:
            meant, said = near
            raise ConfigurationError(
                f"{owner}: {key!r} is not a setting littleghost knows: did you mean "
                f"{meant!r}{said}? (if your provider takes {key!r} itself, pass it in "
                f"{EXTRA_BODY}, sent as it is: {{{EXTRA_BODY!r}: {{{key!r}: ...}}}})"
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


_LOCAL = LLAMA_CPP_SETTINGS | OPENAI_SETTINGS | _MEANT - {"thinking", "stop_sequences"}
"""The settings the llama.cpp server of a local model takes: its own parameters and, on
its OpenAI-compatible chat completions, OpenAI's (which it may ignore, as servers
compatible with OpenAI's API do, so that the settings of one work with the other)."""
_LOCAL_MEANT = {
    "repetition_penalty": "repeat_penalty",
    "stop_sequences": "stop",
    "stop_token_ids": "stop",
    "guided_json": "json_schema",
    "guided_grammar": "grammar",
}
"""The llama.cpp server's parameter for what another provider's does."""


def check_local_settings(owner: str, settings: Mapping[str, Any]) -> None:
    """``ConfigurationError`` for a setting of ``settings`` (checked by
    ``check_settings``) that another provider takes and the llama.cpp server of
    littleghost's ``LocalModel`` does not (``_LOCAL``), which it would ignore without a
    word (vLLM's ``repetition_penalty``, Anthropic's ``stop_sequences``). A name
    littleghost knows of no provider is let through: it may be a parameter of a newer
    server."""
    for key in settings:
        if key in _LOCAL or key == EXTRA_BODY or key not in PROVIDER_SETTINGS:
            continue
        meant = _LOCAL_MEANT.get(key)
        said = f": did you mean {meant!r}?" if meant else ""
        raise ConfigurationError(
            f"{owner}: {key!r} is {WHOSE[key]} parameter, which the llama.cpp server of a "
            f"local model does not take, and would ignore{said} (to send it all the same, "
            f"pass it in {EXTRA_BODY}: {{{EXTRA_BODY!r}: {{{key!r}: ...}}}})"
        )


def _check_extra_body(owner: str, value: object) -> None:
    """``ConfigurationError`` unless ``value``, an ``extra_body`` setting, is a mapping
    with str keys and none of them a key littleghost sets itself."""
    where = f"{owner}[{EXTRA_BODY!r}]"
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ConfigurationError(f"{where} must be a mapping with str keys, not {_shown(value)}")
    reserved = sorted(value.keys() & RESERVED_SETTINGS)
    if reserved:
        raise ConfigurationError(
            f"{where}: {reserved[0]!r} is set by littleghost and cannot be a model setting"
        )


class ClassSettings(dict[str, Any]):
    """The settings an agent class or a mixin declares, as the class holds them: changed
    in place through that class alone. Read through a subclass or an instance, they are a
    read-only view of them, so that no change made there reaches the class, its other
    subclasses or their instances (a subclass declares its own; an instance takes
    ``settings=``)."""

    def __get__(self, instance: object, owner: type | None = None) -> Mapping[str, Any]:
        through_owner = instance is None and vars(owner or object).get("settings") is self
        return self if through_owner else MappingProxyType(self)
