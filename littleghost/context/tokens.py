"""Token estimates: the ``Tokenizer`` protocol, two estimators, and per-message counts."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from attrs import field, frozen

from littleghost._validators import check, count, is_number
from littleghost.messages import ImagePart, Message, ReasoningPart, TextPart, ToolCall, ToolResult
from littleghost.models.base import ModelRequest, OutputSchema
from littleghost.text import beyond_ascii, json_text, weighed_length

__all__ = [
    "ByteEstimator",
    "CharacterEstimator",
    "Estimates",
    "Tokenizer",
    "estimate_messages",
    "estimate_request",
    "prompt_text",
]


@runtime_checkable
class Tokenizer(Protocol):
    """Counts the tokens of a text: any object with ``count_tokens(text) -> int``."""

    def count_tokens(self, text: str) -> int: ...


def _positive(value: object) -> bool:
    return is_number(value) and value > 0


@frozen(kw_only=True, cache_hash=True)
class CharacterEstimator:
    """``chars_per_token`` (4) characters per token, rounded up, and ``image_tokens`` (85)
    per image: the default estimate; a character beyond ASCII weighs more
    (``weighed_length``)."""

    chars_per_token: float = field(
        default=4.0,
        validator=check("CharacterEstimator.chars_per_token", _positive, "a finite number > 0"),
    )
    image_tokens: int = field(default=85, validator=count("CharacterEstimator.image_tokens"))

    def count_tokens(self, text: str) -> int:
        """Weighed characters ÷ ``chars_per_token``, rounded up."""
        return math.ceil(weighed_length(text) / self.chars_per_token)


@frozen(kw_only=True, cache_hash=True)
class ByteEstimator:
    """UTF-8 bytes ÷ ``bytes_per_token`` (3), plus ``message_overhead`` (6) per message and
    ``image_tokens`` (765) per image (measured against SmolLM2; 765 is OpenAI's cost of a
    high-detail 512×512 image)."""

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

_COMPACT = (",", ":")  # JSON's separators in a prompt (``json_text``'s, less the spaces)
# one encoder built once for the hot paths (``json.dumps`` builds one per call)
_ENCODE: Callable[[Any], str] = json.JSONEncoder(
    ensure_ascii=False, separators=_COMPACT, default=str
).encode
_JSON_STR: Callable[[str], str] = json.encoder.encode_basestring
_CALL_CHARS = len('{"id":"","name":"","arguments":}')  # prompt_text's framing of a tool call
_RESULT_CHARS = len('{"tool_call_id":"","content":""}')  # and of a tool result


def _arguments_length(arguments: Mapping[str, Any] | str) -> float:
    """The weighed length of ``arguments`` in ``prompt_text``, a flat str mapping not encoded."""
    if isinstance(arguments, str):
        return weighed_length(arguments)
    if not arguments:
        return 2
    length: float = 1 + 2 * len(arguments)  # braces, colons and commas
    for key, value in arguments.items():
        if type(key) is not str or type(value) is not str:
            return weighed_length(_ENCODE(dict(arguments)))
        measure = len if key.isascii() and value.isascii() else weighed_length
        length += measure(_JSON_STR(key)) + measure(_JSON_STR(value))
    return length


def sent_reasoning(reasoning: ReasoningPart, message: Message) -> bool:
    """Whether ``reasoning`` of ``message`` goes back to a model, as far as the message
    tells: a signed block always; unsigned reasoning (an OpenAI-compatible server's
    ``reasoning_content``) beside tool calls only, as ``OpenAIModel`` sends it (an answer
    without calls is the end of its turn, whose reasoning no later request carries)."""
    return reasoning.signature is not None or bool(message.tool_calls)


def prompt_text(message: Message) -> str:
    """The text of ``message`` that reaches a prompt: role, text, reasoning (its signature
    too, sent back with it: Anthropic's, a redacted block's data, a Gemini thought
    signature, OpenRouter's ``reasoning_details``; unsigned reasoning only beside tool
    calls, ``sent_reasoning``), tool calls and results (not metadata, nor image bytes:
    images are counted by allowance)."""
    pieces = [message.role + ": "]
    for part in message.content:
        kind = type(part)
        if kind is TextPart:
            pieces.append(part.text)  # type: ignore[union-attr]
        elif kind is ReasoningPart:
            reasoning: ReasoningPart = part  # type: ignore[assignment]
            if sent_reasoning(reasoning, message):
                pieces.append(reasoning.text + (reasoning.signature or ""))
        elif kind is ToolCall:
            call: ToolCall = part  # type: ignore[assignment]
            arguments = call.arguments
            if not isinstance(arguments, str):
                arguments = _ENCODE(dict(arguments))  # the encoder takes a dict, not any mapping
            pieces.append(f'{{"id":"{call.id}","name":"{call.name}","arguments":{arguments}}}')
        elif kind is ToolResult:
            result: ToolResult = part  # type: ignore[assignment]
            pieces.append(f'{{"tool_call_id":"{result.call_id}","content":"{result.content}"}}')
    return "".join(pieces)


def _image_tokens(tokenizer: Tokenizer) -> int:
    """The estimated tokens of one image: ``tokenizer``'s ``image_tokens``, else 85."""
    return int(getattr(tokenizer, "image_tokens", 85))


def counter(tokenizer: Tokenizer) -> Callable[[Message], int]:
    """Counts one message's ``prompt_text`` with ``tokenizer``, plus its ``image_tokens`` per
    image and ``message_overhead`` (the default estimator needs only lengths: no JSON)."""
    count_tokens = tokenizer.count_tokens
    image_tokens = _image_tokens(tokenizer)
    overhead = int(getattr(tokenizer, "message_overhead", 0))
    if type(tokenizer) is CharacterEstimator:  # a length is all it needs
        per_token = tokenizer.chars_per_token

        def count_characters(message: Message) -> int:  # ``weighed_length``, inlined
            length: float = len(message.role) + 2
            images = 0
            for part in message.content:
                kind = type(part)
                if kind is TextPart:
                    text: str = part.text  # type: ignore[union-attr]
                    length += len(text) if text.isascii() else weighed_length(text)
                elif kind is ReasoningPart:
                    reasoning: ReasoningPart = part  # type: ignore[assignment]
                    if not sent_reasoning(reasoning, message):
                        continue
                    for sent in (reasoning.text, reasoning.signature or ""):
                        length += len(sent) if sent.isascii() else weighed_length(sent)
                elif kind is ToolResult:
                    result: ToolResult = part  # type: ignore[assignment]
                    length += _RESULT_CHARS + len(result.call_id) + len(result.content)
                    if not (result.call_id.isascii() and result.content.isascii()):
                        length += beyond_ascii(result.call_id) + beyond_ascii(result.content)
                elif kind is ToolCall:
                    call: ToolCall = part  # type: ignore[assignment]
                    length += _CALL_CHARS + len(call.id) + len(call.name)
                    length += _arguments_length(call.arguments)
                    if not (call.id.isascii() and call.name.isascii()):
                        length += beyond_ascii(call.id) + beyond_ascii(call.name)
                elif kind is ImagePart:
                    images += 1
            return math.ceil(length / per_token) + images * image_tokens + overhead

        return count_characters

    def count(message: Message) -> int:
        images = sum(type(part) is ImagePart for part in message.content)
        return count_tokens(prompt_text(message)) + images * image_tokens + overhead

    return count


class Estimates:
    """The token estimates of messages by ``tokenizer``, each message object counted once."""

    __slots__ = ("_count", "_image", "_known", "tokenizer")

    def __init__(self, tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> None:
        self.tokenizer = tokenizer
        self._count = counter(tokenizer)
        self._image = _image_tokens(tokenizer)
        self._known: dict[int, tuple[Message, int]] = {}

    def __call__(self, message: Message) -> int:
        """The estimated tokens of ``message``."""
        known = self._known.get(id(message))
        if known is not None and known[0] is message:
            return known[1]
        tokens = self._count(message)
        self._known[id(message)] = (message, tokens)
        return tokens

    def images(self, message: Message) -> int:
        """The estimated tokens of ``message``'s images (a fixed allowance each)."""
        return self._image * sum(type(part) is ImagePart for part in message.content)

    def total(self, messages: Iterable[Message]) -> int:
        """The estimated tokens of ``messages``."""
        return sum(map(self, messages))


def estimate_messages(messages: Iterable[Message], tokenizer: Tokenizer = DEFAULT_TOKENIZER) -> int:
    """The estimated tokens of ``messages``."""
    return sum(map(counter(tokenizer), messages))


def tools_text(tools: Iterable[Any]) -> str:
    """The tool schemas as the prompt carries them."""
    return json_text(
        [{"name": t.name, "description": t.description, "parameters": t.parameters} for t in tools],
        separators=_COMPACT,
    )


def estimate_request(
    messages: Iterable[Message],
    tools: Iterable[Any],
    settings: Mapping[str, Any],
    tokenizer: Tokenizer = DEFAULT_TOKENIZER,
    *,
    output_schema: OutputSchema | None = None,
) -> int:
    """The estimated prompt tokens of a request: messages, tool schemas, the output
    schema and the settings that reach the prompt (stop sequences, response format, tool
    choice)."""
    total = estimate_messages(messages, tokenizer)
    if tool_list := tuple(tools):
        total += tokenizer.count_tokens(tools_text(tool_list))
    if output_schema is not None:
        total += tokenizer.count_tokens(json_text(dict(output_schema.schema), separators=_COMPACT))
    extra = {
        key: settings[key] for key in ("stop", "response_format", "tool_choice") if key in settings
    }
    if extra:
        total += tokenizer.count_tokens(json_text(extra))
    return total


def schema_estimate(request: ModelRequest, tokenizer: Tokenizer) -> int:
    """The estimated tokens of the tool schemas, output schema and prompt settings."""
    return estimate_request(
        (), request.tools, request.settings, tokenizer, output_schema=request.output_schema
    )
