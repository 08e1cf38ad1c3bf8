"""Token estimates: the ``Tokenizer`` protocol, two estimators, and cached per-message counts.

A tokenizer is any object with ``count_tokens(text) -> int``. The default,
``CharacterEstimator``, counts four characters per token. ``ByteEstimator`` counts UTF-8
bytes ÷ 3, plus an overhead per message and a fixed allowance per image. A message's
estimate is cached on the message for each tokenizer, so estimating a growing
conversation costs time proportional to what was added.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from attrs import field, frozen, validators

from littleghost.messages import ImagePart, Message, TextPart, ToolCall, ToolResult

__all__ = [
    "ByteEstimator",
    "CharacterEstimator",
    "Tokenizer",
    "estimate_message",
    "estimate_messages",
    "estimate_request",
    "prompt_text",
]


@runtime_checkable
class Tokenizer(Protocol):
    """Counts the tokens of a text."""

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` is."""
        ...


@frozen(kw_only=True)
class CharacterEstimator:
    """Four characters per token (rounded up), the default estimate."""

    chars_per_token: float = field(
        default=4.0, validator=[validators.instance_of((int, float)), validators.gt(0)]
    )
    image_tokens: int = field(default=85, validator=[validators.instance_of(int), validators.ge(0)])

    def count_tokens(self, text: str) -> int:
        """Characters ÷ ``chars_per_token``, rounded up."""
        return math.ceil(len(text) / self.chars_per_token)


@frozen(kw_only=True)
class ByteEstimator:
    """UTF-8 bytes ÷ 3, plus ``message_overhead`` per message and ``image_tokens`` per image.

    Three bytes per token errs on the high side for English (about four) and fits
    code, JSON and non-Latin scripts better than a character count.
    """

    bytes_per_token: float = field(
        default=3.0, validator=[validators.instance_of((int, float)), validators.gt(0)]
    )
    message_overhead: int = field(
        default=4, validator=[validators.instance_of(int), validators.ge(0)]
    )
    image_tokens: int = field(
        default=765, validator=[validators.instance_of(int), validators.ge(0)]
    )

    def count_tokens(self, text: str) -> int:
        """UTF-8 bytes ÷ ``bytes_per_token``, rounded up."""
        return math.ceil(len(text.encode("utf-8")) / self.bytes_per_token)


DEFAULT_TOKENIZER = CharacterEstimator()


def _arguments_text(arguments: Mapping[str, Any] | str) -> str:
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments, ensure_ascii=False, separators=(",", ":"), default=str)


def prompt_text(message: Message) -> str:
    """The text of ``message`` that reaches a prompt: role, text, tool calls and results.

    Metadata and image bytes are not part of it (images are counted by allowance).
    """
    pieces = [message.role.value, ": "]
    for part in message.content:
        if isinstance(part, TextPart):
            pieces.append(part.text)
        elif isinstance(part, ToolCall):
            pieces.append(
                f'{{"id":"{part.id}","name":"{part.name}","arguments":{_arguments_text(part.arguments)}}}'
            )
        elif isinstance(part, ToolResult):
            pieces.append(
                f'{{"tool_call_id":"{part.call_id}","content":{json.dumps(part.content, ensure_ascii=False)}}}'
            )
    return "".join(pieces)


def _images(message: Message) -> int:
    return sum(1 for part in message.content if isinstance(part, ImagePart))


def estimate_message(message: Message, tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> int:
    """The estimated tokens of one message, cached on the message per tokenizer."""
    cache = message._cache
    key: tuple[str, object] = ("tokens", tokenizer)
    try:
        return int(cache[key])
    except KeyError:
        pass
    except TypeError:  # an unhashable tokenizer: key it by identity
        key = ("tokens", id(tokenizer))
        if key in cache:
            return int(cache[key])
    tokens = tokenizer.count_tokens(prompt_text(message))
    images = _images(message)
    if images:
        tokens += images * int(getattr(tokenizer, "image_tokens", 85))
    tokens += int(getattr(tokenizer, "message_overhead", 0))
    cache[key] = tokens
    return tokens


def estimate_messages(messages: Iterable[Message], tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> int:
    """The estimated tokens of ``messages``."""
    return sum(estimate_message(message, tokenizer) for message in messages)


def tools_text(tools: Iterable[Any]) -> str:
    """The tool schemas as the prompt carries them."""
    return json.dumps(
        [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools],
        ensure_ascii=False,
        separators=(",", ":"),
        default=str,
    )


_PROMPT_SETTINGS = ("stop", "response_format", "tool_choice")


def estimate_request(
    messages: Iterable[Message],
    tools: Iterable[Any],
    settings: Mapping[str, Any],
    tokenizer: Tokenizer = DEFAULT_TOKENIZER,
) -> int:
    """The estimated prompt tokens of a request: messages, tool schemas and the settings
    that reach the prompt (stop sequences, response format, tool choice)."""
    total = estimate_messages(messages, tokenizer)
    tool_list = tuple(tools)
    if tool_list:
        total += tokenizer.count_tokens(tools_text(tool_list))
    extra = {key: settings[key] for key in _PROMPT_SETTINGS if key in settings}
    if extra:
        total += tokenizer.count_tokens(json.dumps(extra, ensure_ascii=False, default=str))
    return total
