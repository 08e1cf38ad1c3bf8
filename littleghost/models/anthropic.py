"""Anthropic Messages through the official ``anthropic`` SDK.

System and developer text goes in ``system``; tool calls and results become
``tool_use`` / ``tool_result`` blocks; consecutive messages of the same role are merged,
as the API requires. The SDK's own retries are off; errors are mapped by
:mod:`littleghost.models.overflow`.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import AsyncGenerator, Iterable, Mapping, Sequence
from contextlib import AsyncExitStack, aclosing
from typing import Any
from urllib.parse import urlsplit

import anyio
import attrs

from littleghost import logs
from littleghost._validators import MAX_TOKEN_COUNT
from littleghost.errors import ConfigurationError, ContextWindowOverflowError, ProtocolError
from littleghost.messages import (
    ImagePart,
    Message,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCall,
    ToolResult,
)
from littleghost.models._loops import LoopClients
from littleghost.models._sdk import (
    WHOLE_ANSWER,
    CountAsking,
    SentEvents,
    accepted_parameters,
    answer_or_events,
    answered_whole,
    attempt_timeout,
    billed_so_far,
    check_answer_whole,
    check_api_key,
    check_base_url,
    check_context_window,
    check_images,
    check_model_name,
    check_not_model_string,
    check_request_timeout,
    check_url_user,
    client_at,
    client_credentials,
    error_mapper,
    import_sdk,
    index_of,
    inline_image,
    listed,
    lookup,
    made_noting_heads,
    not_json,
    noting_heads,
    parse_arguments,
    past_the_end,
    provider_errors,
    reported,
    reported_name,
    reported_usage,
    sent_arguments,
    sent_events,
    server_of,
    shaped,
    sse_events,
    stream_cut_off,
    streamed_answer,
    text_of,
    whole_arguments,
)
from littleghost.models.answer_json import answer_json
from littleghost.models.base import (
    ModelRequest,
    ModelResponse,
    OutputSchema,
    StopReason,
    ToolSpec,
    Usage,
)
from littleghost.models.call_ids import with_unique_call_ids
from littleghost.models.overflow import check_window_room, classify_error
from littleghost.models.served_window import MODELS_TIMEOUT, ServedWindow
from littleghost.models.streaming import (
    ModelStreamEvent,
    ReasoningChunk,
    StreamDone,
    TextChunk,
    ToolCallChunk,
)
from littleghost.models.windows import known_context_window
from littleghost.output import OUTPUT_TOOL
from littleghost.settings import EXTRA_BODY, RESERVED_SETTINGS
from littleghost.telemetry import arguments_json

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "EMPTY_ERROR_TEXT",
    "MAX_OPTIONAL_PROPERTIES",
    "MAX_UNIONS",
    "MODELS_TIMEOUT",
    "OPENING_TURN",
    "AnthropicModel",
    "from_model_string",
    "schema_problem",
]

logger = logs.logger(__name__)

PROVIDER = "anthropic"
DEFAULT_MAX_TOKENS = 4096
"""The output cap sent when the request sets none (the API requires one)."""
LONGEST_UNSTREAMED = 8_192
"""The largest output cap ``respond`` asks for in one unstreamed call; a larger one is
streamed (the SDK refuses an unstreamed call that may take over ten minutes, and a long
silent connection may be dropped on the way)."""

_STOP_REASONS = {
    "end_turn": StopReason.END_TURN,
    "pause_turn": StopReason.END_TURN,
    "max_tokens": StopReason.MAX_TOKENS,
    "stop_sequence": StopReason.STOP_SEQUENCE,
    "tool_use": StopReason.TOOL_USE,
    "refusal": StopReason.CONTENT_FILTER,
}
EMPTY_ERROR_TEXT = "(the tool failed without a message)"
"""What an error result without content is sent as: the API refuses an empty one."""
_TOOL_CHOICES = {"auto": "auto", "required": "any", "any": "any", "none": "none"}
_THINKING = frozenset({"thinking", "redacted_thinking"})
"""The types of the blocks that hold a model's reasoning."""
_TRANSLATED = frozenset({"max_tokens", "stop", "user", "tool_choice", "parallel_tool_calls"})
"""Settings translated for the API (see ``AnthropicModel``), whatever the SDK takes."""


MAX_OPTIONAL_PROPERTIES = 24
"""The optional properties structured outputs take in a request's schemas."""
MAX_UNIONS = 16
"""The union-typed values (``anyOf``) structured outputs take in a request's schemas."""
_NO_STRUCTURED_OUTPUTS = re.compile(r"claude-(instant|2|3|sonnet-4-(0|2025)|opus-4-(0|2025))")
"""The models without structured outputs, which came with Claude Opus 4.1 and Sonnet 4.5:
Claude 3.x and older, Sonnet 4 and Opus 4 (``claude-sonnet-4-20250514``, ...)."""


def schema_problem(schema: OutputSchema) -> str | None:
    """Why structured outputs cannot take ``schema``: they want every object closed and
    every value typed (no ``dict[str, X]``, ``Any`` or fixed-length tuple), at most
    ``MAX_OPTIONAL_PROPERTIES`` optional properties and at most ``MAX_UNIONS`` unions."""
    problem = schema.closed_problem
    if problem is not None:
        return f"{PROVIDER} structured outputs want closed objects and typed values, not {problem}"
    nodes = list(_nodes(schema.schema))
    optional = sum(
        len(node["properties"].keys() - set(node.get("required", ())))
        for node in nodes
        if node.get("type") == "object"
    )
    if optional > MAX_OPTIONAL_PROPERTIES:
        return (
            f"{PROVIDER} structured outputs take at most {MAX_OPTIONAL_PROPERTIES} optional "
            f"properties (fields that may be left out), and this schema has {optional}"
        )
    unions = sum("anyOf" in node for node in nodes)
    if unions > MAX_UNIONS:
        return (
            f"{PROVIDER} structured outputs take at most {MAX_UNIONS} union-typed values "
            f"(unions and Optional), and this schema has {unions}"
        )
    return None


def _nodes(schema: Mapping[str, Any]) -> Iterable[Mapping[str, Any]]:
    """``schema`` (closed) and every schema inside it."""
    yield schema
    inner = [*schema.get("anyOf", ()), *schema.get("properties", {}).values()]
    if schema.get("type") == "array":
        inner.append(schema["items"])
    for value in inner:
        yield from _nodes(value)


def _image(part: ImagePart) -> dict[str, Any]:
    """An image block: its data in base64 when given inline (the API fetches only
    ``http(s)`` URLs: a ``data:`` URL goes as its data), else its URL."""
    inline = inline_image(part)
    if inline is None:
        return {"type": "image", "source": {"type": "url", "url": part.url}}
    media_type, data = inline
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _block(part: object, tools: bool) -> dict[str, Any] | None:
    if not tools and isinstance(part, (ToolCall, ToolResult)):
        return {"type": "text", "text": _as_text(part)}
    if isinstance(part, ReasoningPart):
        if part.provider != PROVIDER or not part.signature:
            return None  # another provider's, or unsigned: the API takes neither
        if part.redacted:
            return {"type": "redacted_thinking", "data": part.signature}
        return {"type": "thinking", "thinking": part.text, "signature": part.signature}
    if isinstance(part, TextPart):  # the API takes no text block of whitespace only
        return {"type": "text", "text": part.text} if part.text.strip() else None
    if isinstance(part, ImagePart):
        return _image(part)
    if isinstance(part, ToolCall):
        return {"type": "tool_use", "id": part.id, "name": part.name, "input": sent_arguments(part)}
    if isinstance(part, ToolResult):
        empty = part.is_error and not part.content.strip()  # the API takes no empty error
        return {
            "type": "tool_result",
            "tool_use_id": part.call_id,
            "content": EMPTY_ERROR_TEXT if empty else part.content,
            "is_error": part.is_error,
        }
    return None


def _as_text(part: ToolCall | ToolResult) -> str:
    """A tool call or result as text, for a request offering no tools (the API takes
    no ``tool_use`` or ``tool_result`` block without them)."""
    if isinstance(part, ToolCall):
        return f"[called {part.name}({arguments_json(part.arguments)}), call {part.id}]"
    outcome = "error" if part.is_error else "result"
    return f"[tool {outcome} for call {part.call_id}: {part.content}]"


def _merged(earlier: list[dict[str, Any]], later: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The blocks of one turn made of two messages; the thinking that leads ``later`` goes
    first when ``earlier`` (a collapse record, say) does not start with thinking: the API
    takes a turn holding thinking only when its first block is thinking."""
    lead = next((i for i, block in enumerate(later) if block["type"] not in _THINKING), 0)
    if earlier[0]["type"] in _THINKING:
        return [*earlier, *later]
    return [*later[:lead], *earlier, *later[lead:]]


_NOT_IN_ID = re.compile(r"[^A-Za-z0-9_-]")
"""A character the API refuses in a ``tool_use`` id."""


OPENING_TURN = "(The conversation continues.)"
"""The user turn sent before a conversation that starts with the assistant's."""


def convert_messages(
    messages: Sequence[Message], *, tools: bool = True
) -> tuple[str | None, list[dict[str, Any]]]:
    """The ``system`` text and the ``messages`` list for a conversation.

    System and developer text is joined into ``system``; tool results travel in user
    turns; consecutive turns of one role are merged (an assistant turn then starts with
    the thinking that leads its messages); empty or whitespace-only text is left out; a
    conversation that starts with the assistant (a greeting, or a history a
    compaction cut) gets ``OPENING_TURN`` before it, as the API takes only a user turn
    first. Thinking blocks go back verbatim with their signatures; reasoning from
    another provider, or that lost its signature, is left out, and so is an answer of
    thinking alone (cut at ``max_tokens``, or its text blank), as the API takes no
    assistant message that ends with thinking. Without ``tools`` (the
    request offers none), tool calls and results travel as text; with them, each call
    under an id of its own, of the characters the API takes (``with_unique_call_ids``).
    """
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for message in with_unique_call_ids(messages, _NOT_IN_ID) if tools else messages:
        if message.role.is_trusted:
            if message.text:
                system.append(message.text)
            continue
        role = "assistant" if message.role is Role.ASSISTANT else "user"
        blocks = [block for part in message.content if (block := _block(part, tools)) is not None]
        if all(block["type"] in _THINKING for block in blocks):
            continue
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"] = _merged(turns[-1]["content"], blocks)
        else:
            turns.append({"role": role, "content": blocks})
    if turns and turns[0]["role"] == "assistant":
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": OPENING_TURN}]})
    return ("\n\n".join(system) or None), turns


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "description": spec.description,
        "input_schema": dict(spec.parameters),
    }


def _tool_choice(value: object) -> object:
    if isinstance(value, str) and value in _TOOL_CHOICES:
        return {"type": _TOOL_CHOICES[value]}
    if isinstance(value, Mapping) and value.get("type") == "function":
        function = value.get("function")
        if isinstance(function, Mapping) and isinstance(function.get("name"), str):
            return {"type": "tool", "name": function["name"]}
    return value


def _unforced(
    choice: dict[str, Any], tools: Sequence[ToolSpec], settings: Mapping[str, Any]
) -> dict[str, Any]:
    """``choice``, made ``auto`` when it forces the final-result tool with thinking on:
    the API takes no forced tool use with extended thinking, and the tool's description
    ("Call this once, when you are done") and the repair turn ask for the call."""
    thinking = settings.get("thinking")
    forced = choice.get("type") == "any" or choice.get("name") == OUTPUT_TOOL
    if (
        not isinstance(thinking, Mapping)
        or thinking.get("type") == "disabled"
        or not forced
        or OUTPUT_TOOL not in {spec.name for spec in tools}
    ):
        return choice
    return {**{key: value for key, value in choice.items() if key != "name"}, "type": "auto"}


def stop_reason(reason: str | None, has_tool_calls: bool) -> StopReason:
    """The ``StopReason`` for an Anthropic ``stop_reason``."""
    mapped = _STOP_REASONS.get(reason or "", StopReason.END_TURN)
    if has_tool_calls and mapped is StopReason.END_TURN:
        return StopReason.TOOL_USE
    return mapped


def _usage(usage: Any) -> Usage:
    """The API's ``input_tokens`` leave out cache writes and reads; the prompt's size
    (``Usage.input_tokens``) is all three, a sum that stops at ``MAX_TOKEN_COUNT``."""
    if usage is None:
        return Usage()
    cache_write = reported(usage, "cache_creation_input_tokens")
    cache_read = reported(usage, "cache_read_input_tokens")
    return reported_usage(
        min(reported(usage, "input_tokens") + cache_write + cache_read, MAX_TOKEN_COUNT),
        reported(usage, "output_tokens"),
        cache_read=cache_read,
        cache_write=cache_write,
        reasoning=reported(usage, "output_tokens_details", "thinking_tokens"),
    )


def _part(block: Mapping[str, Any], where: str) -> Part | None:
    """The message part for one content block, at ``where`` in the answer (``None`` for a
    kind not kept).

    Raises:
        ProtocolError: A field the part is made of has another type than the API's.
    """
    kind = text_of(PROVIDER, block.get("type"), f"{where}.type", required=True)

    def text(name: str) -> str:
        return text_of(PROVIDER, block.get(name), f"{where}.{name}")

    if kind == "text":
        return TextPart(text("text"))
    if kind == "tool_use":
        raw = block.get("partial_json")
        arguments = parse_arguments(raw) if raw else parse_arguments(block.get("input"))
        return ToolCall(text("id"), text("name"), arguments)
    if kind == "thinking":
        return ReasoningPart(text("thinking"), text("signature"), PROVIDER)
    if kind == "redacted_thinking":
        return ReasoningPart("", text("data"), PROVIDER, redacted=True)
    return None


def _answer(
    blocks: Iterable[tuple[str, Mapping[str, Any]]], reason: object, usage: object, about: object
) -> ModelResponse:
    """The response for the content blocks of an answer (each with where it is in the
    answer), their parts in order (the text of adjacent text blocks joined, a tool call
    without an id named ``call_N``, N its place among the calls); its id and model are
    read from ``about`` (the message, or the stream's ``message_start`` message).

    Raises:
        ProtocolError: A block, or the stop reason, has another type than the API's.
        ContextWindowOverflowError: The answer stopped where the context window was full
            (``model_context_window_exceeded``): the prompt left no room for it, as the
            API's overflow error says for the models that send that instead (with the
            answer's usage: it is billed).
    """
    reason = text_of(PROVIDER, reason, "stop_reason") or None
    if reason == "model_context_window_exceeded":
        used = _usage(usage)
        raise ContextWindowOverflowError(
            f"{PROVIDER}: the answer stopped at the model's context window",
            code=reason,
            provider=PROVIDER,
            usage=used,
            prompt_tokens=used.input_tokens,
        )
    parts: list[Part] = []
    calls = 0
    for where, block in blocks:
        part = _part(block, where)
        if isinstance(part, ToolCall):
            if not part.id:  # named as OpenAIModel names one: by its place in the answer
                part = attrs.evolve(part, id=f"call_{calls}")
            calls += 1
        last = parts[-1] if parts else None
        if isinstance(part, TextPart) and isinstance(last, TextPart):
            parts[-1] = TextPart(last.text + part.text)
        elif part is not None and part != TextPart(""):
            parts.append(part)
    return ModelResponse(
        Message(Role.ASSISTANT, parts),
        stop_reason(reason, calls > 0),
        _usage(usage),
        response_id=reported_name(about, "id"),
        response_model=reported_name(about, "model"),
    )


def _streamed_response(
    blocks: Mapping[int, Mapping[str, Any]],
    reason: object,
    usage: Mapping[str, Any],
    started: Mapping[str, Any],
) -> ModelResponse:
    return _answer(
        ((f"content block {index}", block) for index, block in sorted(blocks.items())),
        reason,
        dict(usage),
        started,
    )


def _response(message: Any) -> ModelResponse:
    # the blocks' fields as they are, not through the SDK's serializer: it warns about a
    # field of an unexpected type (arguments it did not parse, say), quoting its content
    content = listed(PROVIDER, lookup(message, "content"), "content", required=True)
    blocks = (_fields(block, f"content[{index}]") for index, block in enumerate(content))
    return _answer(blocks, lookup(message, "stop_reason"), lookup(message, "usage"), message)


def _fields(block: object, where: str) -> tuple[str, Mapping[str, Any]]:
    """A content block's fields as a mapping, with ``where`` it is."""
    block = shaped(PROVIDER, block, where)
    return where, block if isinstance(block, Mapping) else vars(block)


_DELTAS = {
    "text_delta": ("text", "text"),
    "thinking_delta": ("thinking", "thinking"),
    "signature_delta": ("thinking", "signature"),
    "input_json_delta": ("tool_use", "partial_json"),
}
"""The kinds of streamed deltas kept: the kind of block each adds to, and its field."""
_KEPT = frozenset({"text", "tool_use", *_THINKING})
"""The kinds of blocks an answer keeps (``_part``); a delta to another is left out."""


def _started(event: Mapping[str, Any]) -> tuple[int, dict[str, Any]]:
    """The index and the block of a ``content_block_start`` event."""
    index = index_of(PROVIDER, event.get("index"), "content_block_start.index")
    where = "content_block_start.content_block"
    block = dict(shaped(PROVIDER, event.get("content_block"), where))
    text_of(PROVIDER, block.get("type"), f"{where}.type", required=True)
    return index, block


def _opening(index: int, block: Mapping[str, Any]) -> ModelStreamEvent | None:
    """The chunk a started block gives: a tool call's, or the text or thinking a server
    starts the block with."""
    kind = block.get("type")
    if kind == "tool_use":
        return ToolCallChunk()
    if kind not in ("text", "thinking"):
        return None
    piece = text_of(PROVIDER, block.get(kind), f"content block {index}.{kind}")
    if not piece:
        return None
    return TextChunk(piece) if kind == "text" else ReasoningChunk(piece)


Pieces = dict[tuple[int, str], list[str]]
"""The text streamed to each field of each block (its index and the field's name): the
text it started with, then each piece, joined once the answer is read (``_joined``), not
as each piece comes (which copies the text so far each time)."""


def _added(
    blocks: Mapping[int, dict[str, Any]], pieces: Pieces, event: Mapping[str, Any]
) -> tuple[str, str]:
    """Add a ``content_block_delta`` event to the ``pieces`` of the block it continues;
    the field it added to and the piece (``("", "")`` for a kind of delta not kept).

    Raises:
        ProtocolError: The delta is of the wrong shape, continues no block started, or
            continues a block kept of another kind (its text would be lost).
    """
    index = index_of(PROVIDER, event.get("index"), "content_block_delta.index")
    delta = shaped(PROVIDER, event.get("delta"), "content_block_delta.delta")
    kind = text_of(PROVIDER, delta.get("type"), "content_block_delta.delta.type")
    if kind not in _DELTAS:
        return "", ""
    block_kind, field = _DELTAS[kind]
    block = blocks.get(index)
    if block is not None and block.get("type") not in _KEPT:
        return "", ""  # a block not kept (a server tool's input, ...)
    if block is None or block.get("type") != block_kind:
        raise ProtocolError(
            f"{PROVIDER}: the stream sent {kind} for content block {index}, which "
            f"{'was not started' if block is None else 'is of another kind'}"
        )
    piece = text_of(PROVIDER, delta.get(field), f"content_block_delta.delta.{field}")
    kept = pieces.get((index, field))
    if kept is None:
        start = text_of(PROVIDER, block.get(field), f"content block {index}.{field}")
        kept = pieces[index, field] = [start]
    kept.append(piece)
    return field, piece


def _joined(blocks: Mapping[int, dict[str, Any]], pieces: Pieces) -> dict[int, dict[str, Any]]:
    """``blocks`` with the ``pieces`` streamed to their fields joined (those of other
    blocks left out)."""
    joined = {index: dict(block) for index, block in blocks.items()}
    for (index, field), kept in pieces.items():
        if index in joined:
            joined[index][field] = "".join(kept)
    return joined


def _whole_inputs(blocks: Mapping[int, dict[str, Any]], pieces: Pieces) -> bool:
    """Whether each streamed tool call's input came whole: its ``partial_json`` a JSON
    object, or none sent (the input it started with, if any). Joins only their pieces:
    asked at each event, joining the text too would copy it each time."""
    calls = {index: block for index, block in blocks.items() if block.get("type") == "tool_use"}
    for block in _joined(calls, pieces).values():
        raw = block.get("partial_json") or block.get("input")
        if raw is not None and not whole_arguments(raw):
            return False
    return True


def _counts(value: object) -> dict[str, Any]:
    """The counts of a streamed ``usage`` (``{}`` for one that is not an object: usage
    only describes an answer), without those sent as ``null``."""
    if not isinstance(value, Mapping):
        return {}
    return {key: count for key, count in value.items() if count is not None}


def _is_official(base_url: object) -> bool:
    """True for Anthropic's own API (``api.anthropic.com``), never asked for a window:
    the documented table serves its models."""
    host = urlsplit(str(base_url)).hostname or ""
    return host == "api.anthropic.com" or host.endswith(".api.anthropic.com")


class AnthropicModel:
    """A Claude model through the Anthropic Messages API.

    Args:
        model: The model's name (``claude-sonnet-4-6``, ...).
        client: An ``anthropic.AsyncAnthropic`` to use (its own retries are turned off),
            in one event loop only; by default one is made from ``base_url`` and
            ``api_key`` for each event loop the model is used in.
        base_url: The API's URL (default: ``ANTHROPIC_BASE_URL``, else Anthropic's).
        api_key: The key (default: ``ANTHROPIC_API_KEY``).
        context_window: The model's window in tokens; it wins over any other figure.
        request_timeout: The longest one attempt waits on a silent server, in seconds:
            to connect (at most 5 s), and for each next piece of the answer (a whole
            answer is one piece: its generation must fit); it then fails as a timeout
            (``ProviderUnavailableError``, retried). Default: the client's own (the
            SDK's: 600 s, 5 s to connect).

    Without ``context_window``, ``prepare()`` asks a server other than Anthropic's (a
    llama.cpp server, a gateway) for its window once (``GET /v1/models``, at most
    ``MODELS_TIMEOUT`` seconds; a failure only leaves it unknown, and a server that could
    not answer yet is asked again: see
    :func:`~littleghost.models.served_window.for_now`); otherwise the window documented
    for the model's name (:mod:`littleghost.models.windows`) applies.

    Settings are translated for the API: ``max_tokens`` is always sent (default
    ``DEFAULT_MAX_TOKENS``), ``stop`` becomes ``stop_sequences``, OpenAI-style
    ``tool_choice`` and ``parallel_tool_calls=False`` become Anthropic's (a choice that
    forces the final-result tool becomes ``auto`` when ``thinking`` is on, as the API
    forces no tool with extended thinking), ``user`` becomes ``metadata.user_id``; other
    settings go to the API as they are, and an ``extra_body`` setting's keys into the
    request's body beside them. A request's ``output_schema`` becomes the
    JSON-schema ``format`` of ``output_config`` (beside any ``output_config`` setting;
    without bounds such as ``minimum``, which the API refuses there and the check of the
    answer applies); a schema they cannot take (``schema_problem``: an open object, an
    ``Any`` value, a fixed-length tuple, over 24 optional properties or over 16 unions)
    makes ``output_strategy="auto"`` use the final-result tool instead, as does a model
    without structured outputs (Claude 3.x, Sonnet 4, Opus 4). A setting the installed
    SDK does not accept (``seed``, ...) is a ``ConfigurationError`` raised
    before the request is sent, naming it and the settings accepted.

    Raises:
        ConfigurationError: The SDK is not installed, or no key is set.
    """

    provider = PROVIDER
    supports_output_schema = True
    """A request's ``output_schema`` becomes ``output_config.format`` (structured outputs)."""

    def __init__(
        self,
        model: str,
        *,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        context_window: int | None = None,
        request_timeout: float | None = None,
    ) -> None:
        owner = type(self).__name__
        self._name = model = check_model_name(owner, model)
        self._context_window = check_context_window(owner, context_window)
        self._known_window = known_context_window(self.provider, model)
        self._sdk = import_sdk("anthropic", "anthropic")
        timeout = attempt_timeout(self._sdk, check_request_timeout(owner, request_timeout))
        if client is None:
            given_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
            check_base_url(owner, given_url, "ANTHROPIC_BASE_URL")
            check_url_user(owner, given_url, "ANTHROPIC_BASE_URL", keyed=True)
            api_key = api_key or os.environ.get("ANTHROPIC_API_KEY") or None
            api_key = check_api_key(owner, api_key, "ANTHROPIC_API_KEY")
            if api_key is None:
                raise ConfigurationError(
                    f"{owner}: no Anthropic API key: set ANTHROPIC_API_KEY (or pass api_key=)"
                )
            make = made_noting_heads(
                functools.partial(
                    client_at,
                    self._sdk.AsyncAnthropic,
                    given_url,
                    api_key=api_key,
                    max_retries=0,
                    timeout=timeout,
                )
            )
            client = make()
        else:
            client = noting_heads(client.with_options(max_retries=0, timeout=timeout))
            make = None
        self._clients = LoopClients(client, make, owner, self.provider, model)
        official = _is_official(client.base_url)
        if official:
            check_not_model_string(owner, model, self.provider)
        self._served = ServedWindow(
            self.provider,
            model,
            ask=not official and self._context_window is None,
            logger=logger,
        )
        self._accepted = accepted_parameters(client.messages.create)
        # The base URL's host and port, for the chat span's server.address and server.port.
        self.server_address, self.server_port = server_of(client.base_url)
        self._error = error_mapper(
            self._sdk,
            self._sdk.AnthropicError,
            self.provider,
            keys=lambda: client_credentials(client),
        )
        self._counting = CountAsking(
            f"{self.provider}: the server of {model!r}", "/v1/messages/count_tokens"
        )

    @property
    def name(self) -> str:
        """The model's name."""
        return self._name

    @property
    def context_window(self) -> int | None:
        """The constructor's window, else the server's, else the documented one; or ``None``."""
        return self._context_window or self._served.window or self._known_window

    async def prepare(self) -> None:
        """Read the window a server other than Anthropic's reports, once; concurrent
        callers, in any event loop or thread, wait for it. ``ProviderError`` once the model
        was closed."""
        self._clients.check_open()
        await self._served.read(self._clients, "/v1/models", MODELS_TIMEOUT, self._error)

    @property
    def default_max_tokens(self) -> int:
        """The ``max_tokens`` sent for a request that sets none (the API requires one)."""
        return DEFAULT_MAX_TOKENS

    def output_schema_problem(self, schema: OutputSchema) -> str | None:
        """Why structured outputs cannot take ``schema``: the model has none (Claude 3.x,
        Sonnet 4, Opus 4), or ``schema_problem`` names why."""
        if _NO_STRUCTURED_OUTPUTS.match(self._name.strip().lower()):
            return f"{PROVIDER} structured outputs are not available on this model"
        return schema_problem(schema)

    async def aclose(self) -> None:
        """Close the model for good and the running event loop's HTTP client (a loop that
        ended closed its own): a call it cuts, and any later call or ``prepare()`` in any
        task or thread, raises a ``ProviderError`` (not retried). A model given
        ``client=`` closes nothing: it goes on as it was."""
        await self._clients.aclose()

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        check_images(self.provider, request.messages)  # sent nowhere: refused
        system, messages = convert_messages(request.messages, tools=bool(request.tools))
        asked = request.messages[-1].role if request.messages else None
        if asked in (Role.USER, Role.TOOL) and (not messages or messages[-1]["role"] != "user"):
            raise ConfigurationError(
                f"{self.provider}: the request's last message has nothing the API takes "
                "(its text is empty or whitespace only)"
            )
        params: dict[str, Any] = {"model": self._name, "messages": messages}
        if system is not None:
            params["system"] = system
        if request.tools:
            params["tools"] = [_tool(spec) for spec in request.tools]
        settings = dict(request.settings)
        passed = dict(settings.get(EXTRA_BODY) or {})
        reserved = sorted((settings.keys() | passed.keys()) & RESERVED_SETTINGS)
        if reserved:
            raise ConfigurationError(
                f"settings: {reserved[0]!r} is set by littleghost and cannot be a model setting"
            )
        accepted = self._accepted
        unknown = sorted(key for key in settings if key not in accepted and key not in _TRANSLATED)
        if unknown:
            allowed = ", ".join(sorted((accepted - RESERVED_SETTINGS) | _TRANSLATED))
            raise ConfigurationError(
                f"settings: {self.provider} does not accept the setting {unknown[0]!r} "
                f"(with the installed SDK it accepts {allowed})"
            )
        params["max_tokens"] = settings.pop("max_tokens", None) or DEFAULT_MAX_TOKENS
        stop = settings.pop("stop", None)
        if stop:
            settings.setdefault("stop_sequences", [stop] if isinstance(stop, str) else list(stop))
        user = settings.pop("user", None)
        if isinstance(user, str) and user:
            settings.setdefault("metadata", {"user_id": user})
        choice: Any = _tool_choice(settings.pop("tool_choice", None))
        parallel = settings.pop("parallel_tool_calls", None)
        if request.tools and (choice is not None or parallel is False):
            choice = dict(choice) if isinstance(choice, Mapping) else {"type": "auto"}
            if parallel is False and choice.get("type") != "none":  # "none" takes no other key
                choice["disable_parallel_tool_use"] = True
            settings["tool_choice"] = _unforced(choice, request.tools, settings)
        if request.output_schema is not None:
            config = dict(settings.pop("output_config", None) or {})
            config["format"] = {
                "type": "json_schema",
                "schema": dict(request.output_schema.unbounded_schema),
            }
            if "output_config" in accepted:
                params["output_config"] = config
            else:
                params["extra_body"] = {**settings.pop("extra_body", {}), "output_config": config}
        params.update(settings)
        return params

    async def respond(self, request: ModelRequest) -> ModelResponse:
        """Answer one request with one Messages call, streamed (``stream``) when its output
        cap is over ``LONGEST_UNSTREAMED``; an answer without a stop reason and with a tool
        call's input not a whole JSON object was cut on its way (``check_answer_whole``)."""
        params = self._params(request)
        if params["max_tokens"] > LONGEST_UNSTREAMED:
            return await streamed_answer(self.provider, self.stream(request))
        message: Any = None
        # an answer of the wrong shape is billed all the same; an error it tells of
        # too: keys hidden
        with (
            billed_so_far(lambda: _usage(lookup(message, "usage"))),
            self._clients.stopped_by_close(),
            provider_errors(self._error),
        ):
            client = await self._clients.get()
            async with self._clients.sending():
                message = await answer_or_events(client.messages.create(**params))
            events = sent_events(message)
            if events is None:
                return self._read(message, params["max_tokens"])
        return await streamed_answer(self.provider, self._streamed(request, events))

    def _read(self, message: Any, cap: int) -> ModelResponse:
        """The response a Messages answer (the SDK's, or its JSON) gives, asked with an
        output cap of ``cap``."""
        if isinstance(message, str):
            raise not_json(self.provider)
        shaped(self.provider, message, "body")
        if lookup(message, "type") == "error":  # a gateway's error, sent with a 200
            raise classify_error(provider=self.provider, body={"error": lookup(message, "error")})
        response = _response(message)
        calls = response.message.tool_calls
        reason = lookup(message, "stop_reason")
        check_answer_whole(self.provider, reason, (call.arguments for call in calls))
        return check_window_room(self.provider, response, cap, self.context_window)

    async def count_prompt_tokens(self, request: ModelRequest) -> int | None:
        """The input tokens the API counts for ``request`` (``POST /v1/messages/count_tokens``:
        its messages, system prompt, tools and the settings that reach the prompt); ``None``
        from a server without that endpoint (``CountAsking`` says when it is given up)."""
        params = self._params(request)

        async def count() -> int | None:
            client = await self._clients.get()
            count = client.messages.count_tokens
            accepted = accepted_parameters(count)
            async with self._clients.sending():
                counted = await count(**{key: v for key, v in params.items() if key in accepted})
            return reported(counted, "input_tokens") or None

        with self._clients.stopped_by_close():
            return await self._counting.ask(count, self._error)

    def stream(self, request: ModelRequest) -> AsyncGenerator[ModelStreamEvent, None]:
        """Stream one Messages call (``_streamed``)."""
        return self._streamed(request, None)

    async def _streamed(
        self, request: ModelRequest, sent: SentEvents | None
    ) -> AsyncGenerator[ModelStreamEvent, None]:
        """Stream one Messages call, or read ``sent``, the events an answer not streamed
        came as: ``TextChunk``, ``ReasoningChunk`` and ``ToolCallChunk`` values as they
        come, then one ``StreamDone``.

        The answer is whole once the ``message_delta`` that gives the stop reason (and the
        usage) came, or ``message_stop`` without it after text or tool calls, every content
        block stopped and every call's input a whole JSON object (a proxy may end a stream
        its upstream cut with ``message_stop``); a gateway's ``[DONE]`` (as OpenAI's
        streams end) is read as ``message_stop``. A stream that ends before was cut off: a
        ``ProviderUnavailableError``. A connection lost or gone silent once the answer is
        whole keeps it (``sse_events``), and so does an event of the wrong shape after it
        (``past_the_end``). Closing the iterator early closes the HTTP response, which
        stops generation.
        """
        params = self._params(request)
        blocks: dict[int, dict[str, Any]] = {}
        pieces: Pieces = {}
        reason: object = None
        usage: dict[str, Any] = {}
        started: dict[str, Any] = {}
        stopped = False
        ended: set[int] = set()  # the blocks stopped
        sent_whole: ModelResponse | None = None  # from a server that does not stream

        def whole() -> bool:
            """Whether the answer came whole (the docstring's rule)."""
            if reason is not None:
                return True
            return (
                stopped
                and any(block.get("type") in ("text", "tool_use") for block in blocks.values())
                and ended.issuperset(blocks)
                and _whole_inputs(blocks, pieces)
            )

        with (
            billed_so_far(lambda: _usage(usage)),
            self._clients.stopped_by_close(),
            provider_errors(self._error),
        ):
            async with AsyncExitStack() as stack:
                http: Any = sent
                if sent is None:
                    create = (await self._clients.get()).messages.with_streaming_response.create
                    async with self._clients.sending():  # until the answer's head comes
                        opened = await stack.enter_async_context(create(**params, stream=True))
                    http = opened.http_response
                try:
                    read = sse_events(http, self.provider, whole=whole)
                    async with aclosing(read) as events:
                        async for name, data in events:
                            if name is WHOLE_ANSWER:  # read as an answer not streamed
                                body = answer_json(data)
                                usage.update(_counts(lookup(body, "usage")))
                                sent_whole = self._read(body, params["max_tokens"])
                                break
                            if data.strip() == "[DONE]":  # a gateway's end, as OpenAI's
                                stopped = True
                                continue
                            with past_the_end(self.provider, whole()):
                                event = self._event(name, data)
                                kind = event.get("type")
                                if kind == "message_start":
                                    started = dict(
                                        shaped(
                                            PROVIDER, event.get("message"), "message_start.message"
                                        )
                                    )
                                    usage.update(_counts(started.get("usage")))
                                elif kind == "content_block_start":
                                    index, block = _started(event)
                                    if index in blocks:
                                        raise ProtocolError(
                                            f"{PROVIDER}: the stream started content block {index} "
                                            "twice"
                                        )
                                    blocks[index] = block
                                    opening = _opening(index, block)
                                    if opening is not None:
                                        yield opening
                                elif kind == "content_block_delta":
                                    field, piece = _added(blocks, pieces, event)
                                    if piece and field == "text":
                                        yield TextChunk(piece)
                                    elif piece and field == "thinking":
                                        yield ReasoningChunk(piece)
                                elif kind == "content_block_stop":
                                    where = "content_block_stop.index"
                                    ended.add(index_of(PROVIDER, event.get("index"), where))
                                elif kind == "message_delta":
                                    delta = shaped(
                                        PROVIDER, event.get("delta"), "message_delta.delta"
                                    )
                                    reason = delta.get("stop_reason") or reason
                                    usage.update(_counts(event.get("usage")))
                                elif kind == "message_stop":
                                    stopped = True
                finally:
                    with anyio.CancelScope(shield=True):
                        await http.aclose()
            if sent_whole is not None:
                for streamed in answered_whole(sent_whole):
                    yield streamed
                return
            if not whole():
                raise stream_cut_off(self.provider)
            response = _streamed_response(_joined(blocks, pieces), reason, usage, started)
            cap, window = params["max_tokens"], self.context_window
            response = check_window_room(self.provider, response, cap, window)
        yield StreamDone(response)

    def _event(self, name: str | None, data: str) -> dict[str, Any]:
        """One streamed event; an error event (its ``type``, or its name, as a compatible
        server sends it: an ``error:`` line, its text or JSON of another shape) is raised
        as the error it reports."""
        try:
            event = answer_json(data)
        except json.JSONDecodeError:  # an integer too long, or nesting too deep: mapped
            if name == "error":
                raise classify_error(provider=self.provider, message=data) from None
            raise ProtocolError(
                f"{self.provider}: the stream sent an event that is not JSON"
            ) from None
        if not isinstance(event, dict):
            raise ProtocolError(f"{self.provider}: the stream sent an event that is not an object")
        if name == "error":
            raise classify_error(provider=self.provider, body=event)
        kind = text_of(self.provider, event.get("type"), "event's type", required=True)
        if kind == "error":
            raise classify_error(provider=self.provider, body=event)
        return event


def from_model_string(model: str | None) -> AnthropicModel:
    """Build the model an ``"anthropic:NAME"`` string names (key from ``ANTHROPIC_API_KEY``)."""
    if not model:
        raise ConfigurationError(
            "model: 'anthropic' needs a model name, as in 'anthropic:claude-sonnet-4-6'"
        )
    return AnthropicModel(model)
