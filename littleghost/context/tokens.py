"""Token estimates: the ``Tokenizer`` protocol, two estimators, and cached per-message counts.

A tokenizer is any object with ``count_tokens(text) -> int``. The default,
``CharacterEstimator``, counts four characters per token. ``ByteEstimator`` counts UTF-8
bytes ÷ 3, plus an overhead per message and a fixed allowance per image. A message's
estimate is cached on the message for each tokenizer, so estimating a growing
conversation costs time proportional to what was added.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from attrs import field, frozen

from littleghost._validators import check, count, is_number
from littleghost.messages import ImagePart, Message, TextPart, ToolCall, ToolResult

__all__ = [
    "ByteEstimator",
    "CharacterEstimator",
    "Tokenizer",
    "cache_key",
    "estimate_each",
    "estimate_message",
    "estimate_messages",
    "estimate_request",
    "estimator",
    "prompt_text",
]


@runtime_checkable
class Tokenizer(Protocol):
    """Counts the tokens of a text."""

    def count_tokens(self, text: str) -> int:
        """How many tokens ``text`` is."""
        ...


def _positive(value: object) -> bool:
    return is_number(value) and value > 0


@frozen(kw_only=True, cache_hash=True)
class CharacterEstimator:
    """Four characters per token (rounded up), the default estimate."""

    chars_per_token: float = field(
        default=4.0,
        validator=check("CharacterEstimator.chars_per_token", _positive, "a finite number > 0"),
    )
    image_tokens: int = field(default=85, validator=count("CharacterEstimator.image_tokens"))

    def count_tokens(self, text: str) -> int:
        """Characters ÷ ``chars_per_token``, rounded up."""
        return math.ceil(len(text) / self.chars_per_token)


@frozen(kw_only=True, cache_hash=True)
class ByteEstimator:
    """UTF-8 bytes ÷ 3, plus ``message_overhead`` per message and ``image_tokens`` per image.

    Measured against SmolLM2's reported input tokens (``benchmarks/estimates.py``): three
    bytes per token over-counts English prose (about 4.8 bytes per token) and code (3.4),
    and under-counts JSON (2.3), Polish (2.0) and Japanese (1.7); each message costs about
    six tokens of chat-template framing. For dense or non-Latin text, lower
    ``bytes_per_token`` or plug in an exact tokenizer. 765 tokens per image is OpenAI's
    cost of one high-detail 512×512 tile set; it was not measurable on a text-only model.
    """

    bytes_per_token: float = field(
        default=3.0,
        validator=check("ByteEstimator.bytes_per_token", _positive, "a finite number > 0"),
    )
    message_overhead: int = field(default=6, validator=count("ByteEstimator.message_overhead"))
    image_tokens: int = field(default=765, validator=count("ByteEstimator.image_tokens"))

    def count_tokens(self, text: str) -> int:
        """UTF-8 bytes ÷ ``bytes_per_token``, rounded up."""
        return math.ceil(len(text.encode("utf-8")) / self.bytes_per_token)


DEFAULT_TOKENIZER = CharacterEstimator()

_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)
_JSON: Callable[[Any], str] = _ENCODER.encode
"""Compact JSON, non-ASCII kept: one encoder built once (``json.dumps`` builds one per call)."""
_JSON_STR: Callable[[str], str] = json.encoder.encode_basestring


def _fast_json() -> Callable[[Any], str]:
    """``_JSON`` through the C encoder directly when this Python has it (about 2× faster)."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return _JSON
    try:
        chunks = make(None, str, _JSON_STR, None, ":", ",", False, False, True)
        sample: dict[str, Any] = {"a": [1, 2.5, None, True, "é\n"], "b": {"c": object()}}
        if "".join(chunks(sample, 0)) != _JSON(sample):
            return _JSON
    except Exception:
        return _JSON

    def encode(value: Any) -> str:
        return "".join(chunks(value, 0))

    return encode


_ARGUMENTS_JSON = _fast_json()


def _arguments_text(arguments: Mapping[str, Any] | str) -> str:
    if isinstance(arguments, str):
        return arguments
    return _ARGUMENTS_JSON(dict(arguments))  # the encoders take a dict, not any mapping


def _arguments_length(arguments: Mapping[str, Any] | str) -> int:
    """``len(_arguments_text(arguments))``, without encoding a flat str-to-str mapping."""
    if isinstance(arguments, str):
        return len(arguments)
    if not arguments:
        return 2
    length = 1 + 2 * len(arguments)  # braces, colons and commas
    for key, value in arguments.items():
        if type(key) is not str or type(value) is not str:
            return len(_ARGUMENTS_JSON(dict(arguments)))
        length += len(_JSON_STR(key)) + len(_JSON_STR(value))
    return length


def _prompt(message: Message) -> tuple[str, int]:
    """The prompt text of ``message`` and how many images it holds."""
    pieces = [message.role + ": "]
    images = 0
    for part in message.content:
        kind = type(part)
        if kind is TextPart:
            pieces.append(part.text)  # type: ignore[union-attr]
        elif kind is ToolCall:
            call: ToolCall = part  # type: ignore[assignment]
            pieces.append(
                f'{{"id":"{call.id}","name":"{call.name}","arguments":{_arguments_text(call.arguments)}}}'
            )
        elif kind is ToolResult:
            result: ToolResult = part  # type: ignore[assignment]
            pieces.append(
                f'{{"tool_call_id":"{result.call_id}","content":{_JSON_STR(result.content)}}}'
            )
        elif kind is ImagePart:
            images += 1
    return "".join(pieces), images


_CALL_CHARS = len('{"id":"","name":"","arguments":}')
_RESULT_CHARS = len('{"tool_call_id":"","content":}')


def prompt_text(message: Message) -> str:
    """The text of ``message`` that reaches a prompt: role, text, tool calls and results.

    Metadata and image bytes are not part of it (images are counted by allowance).
    """
    return _prompt(message)[0]


_KEYS: dict[object, str] = {}
_SERIAL = itertools.count()


def cache_key(tokenizer: Tokenizer) -> str:
    """The key under which ``tokenizer``'s counts are cached on messages.

    Equal tokenizers share a key; an unhashable one is keyed by identity.
    """
    try:
        key = _KEYS.get(tokenizer)
    except TypeError:
        return f"tokens@{id(tokenizer)}"
    if key is None:
        key = _KEYS.setdefault(tokenizer, f"tokens#{next(_SERIAL)}")
    return key


def counter(tokenizer: Tokenizer) -> Callable[[Message], int]:
    """Counts one message with ``tokenizer``, uncached: its prompt text, plus the
    tokenizer's ``image_tokens`` per image and ``message_overhead``."""
    count_tokens = tokenizer.count_tokens
    image_tokens = int(getattr(tokenizer, "image_tokens", 85))
    overhead = int(getattr(tokenizer, "message_overhead", 0))
    if type(tokenizer) is CharacterEstimator:  # a length is all it needs
        per_token = tokenizer.chars_per_token

        def count_characters(message: Message) -> int:
            length = len(message.role) + 2
            images = 0
            for part in message.content:
                kind = type(part)
                if kind is TextPart:
                    length += len(part.text)  # type: ignore[union-attr]
                elif kind is ToolCall:
                    call: ToolCall = part  # type: ignore[assignment]
                    length += (
                        _CALL_CHARS
                        + len(call.id)
                        + len(call.name)
                        + _arguments_length(call.arguments)
                    )
                elif kind is ToolResult:
                    result: ToolResult = part  # type: ignore[assignment]
                    length += _RESULT_CHARS + len(result.call_id) + len(_JSON_STR(result.content))
                elif kind is ImagePart:
                    images += 1
            return math.ceil(length / per_token) + images * image_tokens + overhead

        return count_characters

    def count(message: Message) -> int:
        text, images = _prompt(message)
        return count_tokens(text) + images * image_tokens + overhead

    return count


def estimator(tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> Callable[[Message], int]:
    """``estimate_message`` bound to ``tokenizer``, for estimating many messages."""
    key = cache_key(tokenizer)
    count = counter(tokenizer)

    def estimate(message: Message) -> int:
        cache = message._cache
        tokens: int | None = cache.get(key)
        if tokens is None:
            tokens = cache[key] = count(message)
        return tokens

    return estimate


def estimate_message(message: Message, tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> int:
    """The estimated tokens of one message, cached on the message per tokenizer."""
    key = cache_key(tokenizer)
    cache = message._cache
    tokens: int | None = cache.get(key)
    if tokens is None:
        tokens = cache[key] = counter(tokenizer)(message)
    return tokens


def estimate_each(
    messages: Iterable[Message], tokenizer: Tokenizer = DEFAULT_TOKENIZER
) -> list[int]:
    """The estimated tokens of each message, in order (cached like ``estimate_message``).

    Linear in the messages; a message estimated before costs one dictionary lookup.
    """
    key = cache_key(tokenizer)
    count: Callable[[Message], int] | None = None
    estimates: list[int] = []
    append = estimates.append
    for message in messages:
        cache = message._cache
        tokens = cache.get(key)
        if tokens is None:
            if count is None:
                count = counter(tokenizer)
            tokens = cache[key] = count(message)
        append(tokens)
    return estimates


def estimate_messages(messages: Iterable[Message], tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> int:
    """The estimated tokens of ``messages``."""
    return sum(estimate_each(messages, tokenizer))


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
