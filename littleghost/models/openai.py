"""OpenAI-compatible chat completions through the official ``openai`` SDK.

Works against OpenAI and any server that speaks chat completions (vLLM, llama.cpp,
Ollama, ...). The SDK's own retries are off; errors are mapped by
:mod:`littleghost.models.overflow`.
"""

from __future__ import annotations

import functools
import json
import os
import re
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterator, Mapping
from contextlib import AsyncExitStack, aclosing
from typing import Any
from urllib.parse import urlsplit

import anyio

from littleghost import logs
from littleghost.errors import (
    ConfigurationError,
    ContextWindowOverflowError,
    ProtocolError,
    ProviderError,
    ProviderUnavailableError,
)
from littleghost.messages import ImagePart, Message, Part, ReasoningPart, Role, TextPart, ToolCall
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
    image_base64,
    image_media_type,
    import_sdk,
    index_of,
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
from littleghost.models.openai_count import count_request
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
from littleghost.settings import EXTRA_BODY, RESERVED_SETTINGS

__all__ = ["MODELS_TIMEOUT", "OpenAIModel", "from_model_string"]

logger = logs.logger(__name__)

_TOOL_SETTINGS = ("tool_choice", "parallel_tool_calls")
_GOOGLE = "google"
"""The provider of the thought signatures Gemini's OpenAI-compatible endpoint puts on
tool calls, kept as ``ReasoningPart("", signature, "google")`` before each call."""
_OPENROUTER = "openrouter"
"""The provider of the ``reasoning_details`` OpenRouter sends beside ``reasoning`` (Gemini's
thought signatures, Claude's signed thinking, ...), which it wants back unmodified: kept
as ``ReasoningPart("", JSON of the list, "openrouter")``."""
_STOP_REASONS = {
    "stop": StopReason.END_TURN,
    "length": StopReason.MAX_TOKENS,
    "tool_calls": StopReason.TOOL_USE,
    "function_call": StopReason.TOOL_USE,
    "content_filter": StopReason.CONTENT_FILTER,
}


_FAILED = frozenset({"error", "abort", "insufficient_system_resource"})
"""The ``finish_reason`` values of an answer the provider failed to finish: OpenRouter's
``error``, vLLM's ``abort``, DeepSeek's ``insufficient_system_resource``."""
_FULL_WINDOW = "model_length"
"""Mistral's ``finish_reason`` for an answer stopped where the model's context window was
full (Anthropic's ``model_context_window_exceeded``)."""

_NO_STRUCTURED_OUTPUTS = re.compile(r"(ft:)?(gpt-3\.5|gpt-4(-|$)|gpt-4o-2024-05-13)")
"""OpenAI's models without structured outputs (a ``json_schema`` response format, which
came with ``gpt-4o-2024-08-06``): GPT-3.5, GPT-4 and GPT-4 Turbo, the first GPT-4o
snapshot, and fine-tunes of them."""

_Counter = Callable[[Any, dict[str, Any]], Awaitable["int | None"]]
"""A way to count a request's prompt tokens: ``(client, chat body) -> count or None``
(the body with ``extra_body``'s keys beside the others, as the server reads it)."""


def _server_root(client: Any) -> str:
    """The client's base URL without its ``/v1``: where a server's own endpoints are."""
    return str(client.base_url).rstrip("/").removesuffix("/v1")


def _host(base_url: object) -> str:
    """The host of ``base_url``, in lower case (``""`` when it names none)."""
    return urlsplit(str(base_url)).hostname or ""


def _is_official(host: str) -> bool:
    """True for OpenAI's own API: ``api.openai.com`` or a data-residency region of it
    (``eu.api.openai.com``, ``us.api.openai.com``, ...)."""
    return host == "api.openai.com" or host.endswith(".api.openai.com")


_REASONING_HOSTS = frozenset({"api.groq.com", "api.cerebras.ai"})
"""Servers that send reasoning as ``reasoning`` and take it back only so: they refuse an
assistant message with ``reasoning_content`` ("property ... is unsupported")."""


_CALLS_NEED_REASONING = frozenset({"api.deepseek.com"})
"""Servers whose thinking mode refuses a request holding an answer with tool calls that
lacks ``reasoning_content`` ("must be passed back to the API"), in any later turn, even
one whose reasoning was empty or written by another provider: it is sent ``""``."""


def _reasoning_field(host: str) -> str:
    """The field an assistant message's reasoning goes back in to the server at ``host``:
    ``reasoning`` for those of ``_REASONING_HOSTS``, else ``reasoning_content`` (llama.cpp,
    vLLM, DeepSeek, Kimi)."""
    return "reasoning" if host in _REASONING_HOSTS else "reasoning_content"


def _ended_in_error(provider: str, reason: str, sent: object) -> ProviderError:
    """The exception for a choice that ended with a ``finish_reason`` of ``_FAILED``, as
    OpenRouter ends an answer its upstream provider failed to finish: the error the choice
    carries, classified; without one, a ``ProviderUnavailableError`` (the failure happened
    while generating, on the provider's side, so another attempt may well succeed)."""
    dump = getattr(sent, "model_dump", None)
    if callable(dump):
        sent = dump()
    if sent:
        return classify_error(provider=provider, body={"error": sent})
    return ProviderUnavailableError(
        f"{provider}: the model ended its answer with finish_reason {reason!r} and no error "
        "details (the provider failed while generating)",
        code="finish_reason_error",
        provider=provider,
    )


def _window_full(provider: str, usage: Any) -> ContextWindowOverflowError:
    """The exception for an answer that ended with ``_FULL_WINDOW``: the prompt left no
    room for it, as for Anthropic's ``model_context_window_exceeded``; it carries the
    answer's (billed) ``usage``, and its prompt's size as the usage reports it."""
    used = _usage(usage)
    return ContextWindowOverflowError(
        f"{provider}: the answer stopped at the model's context window",
        code=_FULL_WINDOW,
        provider=provider,
        usage=used,
        prompt_tokens=used.input_tokens,
    )


def stop_reason(
    finish_reason: str | None, has_tool_calls: bool, refused: bool = False
) -> StopReason:
    """The ``StopReason`` for a chat-completions ``finish_reason``; an answer that is a
    refusal (sent as ``refusal``, not ``content``) is ``CONTENT_FILTER``, as on Anthropic."""
    if refused:
        return StopReason.CONTENT_FILTER
    reason = _STOP_REASONS.get(finish_reason or "", StopReason.END_TURN)
    if has_tool_calls and reason is StopReason.END_TURN:
        return StopReason.TOOL_USE
    return reason


def _image(part: ImagePart) -> dict[str, Any]:
    url = part.url or f"data:{image_media_type(part)};base64,{image_base64(part)}"
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_call(call: ToolCall) -> dict[str, Any]:
    """A tool call as sent back, its arguments as ``sent_arguments`` has them."""
    arguments = json.dumps(sent_arguments(call), ensure_ascii=False)
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": arguments},
    }


def _thought_signature(provider: str, call: object, where: str) -> str | None:
    """Google's thought signature on a tool call, which Gemini's OpenAI-compatible
    endpoint sends and wants back with the call (it refuses the next request without)."""
    signature = lookup(call, "extra_content", _GOOGLE, "thought_signature")
    where = f"{where}.extra_content.{_GOOGLE}.thought_signature"
    return text_of(provider, signature, where) or None


def _sent_calls(message: Message, signed: bool) -> list[dict[str, Any]]:
    """The tool calls of ``message``, each with the Google thought signature that stands
    just before it, when ``signed``."""
    calls: list[dict[str, Any]] = []
    signature: str | None = None
    for part in message.content:
        if isinstance(part, ReasoningPart) and part.provider == _GOOGLE:
            signature = part.signature or None
        elif isinstance(part, ToolCall):
            entry = _tool_call(part)
            if signed and signature:
                entry["extra_content"] = {_GOOGLE: {"thought_signature": signature}}
            calls.append(entry)
            signature = None
    return calls


def _details(provider: str, message: object, where: str) -> list[Any]:
    """The ``reasoning_details`` list of a message or a delta (``[]`` when it has none)."""
    return listed(provider, lookup(message, "reasoning_details"), f"{where}.reasoning_details")


def _continues(piece: dict[str, Any], last: dict[str, Any]) -> bool:
    """Whether a streamed ``reasoning_details`` piece continues the ``last`` item: of its
    type and index, and no other field of both set apart (as the ids of two items that
    have no index)."""
    if (piece.get("type"), piece.get("index")) != (last.get("type"), last.get("index")):
        return False
    return all(
        key in ("text", "summary") or value in (None, "") or last.get(key) in (None, "", value)
        for key, value in piece.items()
    )


def _merged_details(details: list[Any], pieces: list[Any]) -> None:
    """Add streamed ``reasoning_details`` ``pieces`` to ``details``: a piece that continues
    the last item (``_continues``) has its text or summary appended and the fields it
    lacked filled (as a signature that comes last)."""
    for piece in pieces:
        last = details[-1] if details else None
        if not (isinstance(piece, dict) and isinstance(last, dict) and _continues(piece, last)):
            details.append(dict(piece) if isinstance(piece, dict) else piece)
            continue
        for key, value in piece.items():
            if key in ("text", "summary") and isinstance(value, str):
                last[key] = _str(last.get(key)) + value
            elif last.get(key) in (None, ""):
                last[key] = value


def _sent_details(message: Message) -> list[Any]:
    """The ``reasoning_details`` OpenRouter sent with ``message``, to send back."""
    return [
        item
        for part in message.reasoning
        if part.provider == _OPENROUTER and part.signature
        for item in _kept_details(part.signature)
    ]


def _kept_details(signature: str) -> list[Any]:
    """The list a kept ``reasoning_details`` part holds (``[]`` for one damaged)."""
    try:
        details = json.loads(signature)
    except ValueError:
        return []
    return details if isinstance(details, list) else []


def _message(
    message: Message,
    developer_role: str,
    reasoning_of: str | None,
    *,
    reasoning_field: str,
    signed: bool,
    calls_need_reasoning: bool,
) -> Iterator[dict[str, Any]]:
    """The chat-completions messages for ``message``; an assistant message carries the
    reasoning of provider ``reasoning_of`` in ``reasoning_field`` (``""`` on one with
    tool calls and none, with ``calls_need_reasoning``), and with ``signed`` its tool
    calls' Google thought signatures and, beside that reasoning, OpenRouter's
    ``reasoning_details``."""
    role = message.role
    if role is Role.TOOL:
        for result in message.tool_results:
            yield {"role": "tool", "tool_call_id": result.call_id, "content": result.content}
        return
    if role is Role.ASSISTANT:
        # content is required unless there are tool calls (the SDK's param type says so)
        text = message.text or (None if message.tool_calls else "")
        entry: dict[str, Any] = {"role": "assistant", "content": text}
        reasoning = "".join(
            part.text
            for part in message.reasoning
            if reasoning_of is not None and part.sendable_to(reasoning_of)
        )
        if reasoning or (calls_need_reasoning and message.tool_calls):
            entry[reasoning_field] = reasoning
        details = _sent_details(message) if signed and reasoning_of is not None else []
        if details:
            entry["reasoning_details"] = details
        if message.tool_calls:
            entry["tool_calls"] = _sent_calls(message, signed)
        yield entry
        return
    name = developer_role if role is Role.DEVELOPER else role.value
    parts = [part for part in message.content if isinstance(part, (TextPart, ImagePart))]
    if role is Role.USER and any(isinstance(part, ImagePart) for part in parts):
        content: Any = [
            {"type": "text", "text": part.text} if isinstance(part, TextPart) else _image(part)
            for part in parts
        ]
    else:
        content = message.text
    yield {"role": name, "content": content}


def _tool(spec: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": spec.name,
            "description": spec.description,
            "parameters": dict(spec.parameters),
        },
    }


def _usage(usage: Any) -> Usage:
    """Prompt tokens include the cached ones (read, and written: ``cache_write_tokens``,
    as OpenAI and OpenRouter report them); completion tokens the reasoning ones, but
    for a server whose total says they do not (xAI's: prompt, completion and reasoning
    tokens), where the reasoning tokens are added to them."""
    if usage is None:
        return Usage()
    prompt = reported(usage, "prompt_tokens")
    completion = reported(usage, "completion_tokens")
    reasoning = reported(usage, "completion_tokens_details", "reasoning_tokens")
    if reasoning and reported(usage, "total_tokens") == prompt + completion + reasoning:
        completion += reasoning
    return reported_usage(
        prompt,
        completion,
        cache_read=reported(usage, "prompt_tokens_details", "cached_tokens"),
        cache_write=reported(usage, "prompt_tokens_details", "cache_write_tokens"),
        reasoning=reasoning,
    )


def _reasoning(provider: str, message: object, where: str) -> str:
    """The reasoning text a server sent beside the answer (``reasoning_content``, as
    llama.cpp, vLLM and DeepSeek send it, or ``reasoning``), from a message or a delta
    at ``where``."""
    for name in ("reasoning_content", "reasoning"):
        value = text_of(provider, lookup(message, name), f"{where}.{name}")
        if value:
            return value
    return ""


def _pieces(provider: str, content: object, where: str) -> tuple[str, str]:
    """The answer's text and reasoning in ``content`` (at ``where``): a str, or a list of
    chunks (as Mistral sends them: ``text`` chunks, ``thinking`` chunks holding text
    chunks); chunks of other kinds are left out.

    Raises:
        ProtocolError: ``content``, a chunk or its text has another type.
    """
    if not isinstance(content, list):
        return text_of(provider, content, where), ""
    text: list[str] = []
    thought: list[str] = []
    for index, chunk in enumerate(content):
        at = f"{where}[{index}]"
        chunk = shaped(provider, chunk, at)
        kind = text_of(provider, lookup(chunk, "type"), f"{at}.type", required=True)
        if kind == "text":
            text.append(text_of(provider, lookup(chunk, "text"), f"{at}.text"))
        elif kind == "thinking":
            thought.append("".join(_pieces(provider, lookup(chunk, "thinking"), f"{at}.thinking")))
    return "".join(text), "".join(thought)


def _transcript(provider: str, message: object, where: str) -> str:
    """The transcript of an answer spoken as audio (``modalities`` with ``"audio"``), from
    a message or a delta: its text, as the API sends no ``content`` with it."""
    return text_of(provider, lookup(message, "audio", "transcript"), f"{where}.audio.transcript")


def _str(value: object) -> str:
    """``value`` if it is a str, else ``""`` (a chunk's field of another type)."""
    return value if isinstance(value, str) else ""


def _legacy_call(provider: str) -> ProtocolError:
    """The error for an answer holding a ``function_call`` (the API's form before tool
    calls), which littleghost never asks for and cannot answer."""
    return ProtocolError(
        f"{provider}: the server answered with a legacy function_call, not tool_calls; "
        "littleghost takes tool calls only"
    )


_FUNCTION = ("", "function")
"""The types of a tool call littleghost takes (no type: a function's); a call of
another (a custom tool's, which it never offers) is left out, streamed or not."""


def _tool_calls(provider: str, raw: object, where: str) -> list[tuple[ToolCall, str | None]]:
    """The tool calls of an answer (at ``where``), each with its Google thought signature,
    if any; a call without an id is ``call_N`` (N its place in the list), one of a type
    other than ``function`` is left out.

    Raises:
        ProtocolError: The list, a call, its function, id or name has another type.
    """
    calls = []
    for index, call in enumerate(listed(provider, raw, where)):
        at = f"{where}[{index}]"
        call = shaped(provider, call, at)
        if text_of(provider, lookup(call, "type"), f"{at}.type") not in _FUNCTION:
            continue  # a kind of call littleghost never offers (a custom tool's)
        function = shaped(provider, lookup(call, "function"), f"{at}.function")
        made = ToolCall(
            text_of(provider, lookup(call, "id"), f"{at}.id") or f"call_{index}",
            text_of(provider, lookup(function, "name"), f"{at}.function.name"),
            parse_arguments(lookup(function, "arguments")),
        )
        calls.append((made, _thought_signature(provider, call, at)))
    return calls


def _arguments(call: Mapping[str, Any]) -> str:
    """A streamed call's arguments: its pieces joined; or, when that is no JSON object
    but each piece repeats the one before and goes on (a server that sends the arguments
    so far, or whole, again with each piece), the last piece, if it is one. A stream in
    pieces whose join is an object is never read so, and one whose join is none held no
    arguments anyway."""
    joined = "".join(call["arguments"])
    last: str = call["last"]
    if call["repeats"] and last != joined and not whole_arguments(joined) and whole_arguments(last):
        return last
    return joined


def _next(call: Mapping[str, Any], name: str) -> bool:
    """Whether a streamed piece named ``name``, without an index or id, starts the call
    after ``call``: another name once ``call``'s arguments are a whole JSON object (a
    server that sends each call whole, neither placed nor named). A name sent again with
    each piece, or written in pieces (its arguments not begun), goes on with ``call``."""
    return (
        bool(name and call["name"]) and name != call["name"] and whole_arguments(_arguments(call))
    )


class OpenAIModel:
    """A chat model behind an OpenAI-compatible chat-completions endpoint.

    Args:
        model: The model's name, as the server knows it.
        client: An ``openai.AsyncOpenAI`` to use (its own retries are turned off), in
            one event loop only; by default one is made from ``base_url`` and ``api_key``
            for each event loop the model is used in.
        base_url: The server's URL (default: ``OPENAI_BASE_URL``, else OpenAI's).
        api_key: The key (default: ``OPENAI_API_KEY``; optional with a custom ``base_url``).
        context_window: The model's window in tokens; it wins over any other figure.
        request_timeout: The longest one attempt waits on a silent server, in seconds:
            to connect (at most 5 s), and for each next piece of the answer (a whole
            answer is one piece: its generation must fit); it then fails as a timeout
            (``ProviderUnavailableError``, retried). Default: the client's own (the
            SDK's: 600 s, 5 s to connect).

    Without ``context_window``, ``prepare()`` asks a server other than OpenAI's for its
    window once (``GET /models``, at most ``MODELS_TIMEOUT`` seconds; a failure only
    leaves it unknown, and a server that could not answer yet is asked again: see
    :func:`~littleghost.models.served_window.for_now`); otherwise the window documented
    for the model's name (:mod:`littleghost.models.windows`) applies.

    Settings go to the API as they are (``max_tokens`` becomes ``max_completion_tokens``
    on OpenAI's own API); one the installed SDK does not name travels in ``extra_body``,
    for a compatible server's own parameters (llama.cpp's ``top_k``, ...), and so do the
    keys of an ``extra_body`` setting, as they are. An answer
    spoken as audio (``modalities`` holding ``"audio"``) is read as its transcript.
    ``tool_choice`` and ``parallel_tool_calls`` are left out of a request without tools;
    a key littleghost sets itself (``messages``, ``stream``, ...) is a
    ``ConfigurationError``.

    Raises:
        ConfigurationError: The SDK is not installed, or no key is set for OpenAI.
    """

    provider = "openai"
    supports_output_schema = True
    """A request's ``output_schema`` becomes a JSON-schema ``response_format``, strict:
    every property required, an optional one nullable (``null`` is read as the field left
    out), without bounds such as ``maxLength`` (the check of the answer applies them). A
    schema strict mode cannot express (an open ``dict[str, X]`` object, an
    ``Any`` value, a fixed-length tuple) is sent with ``strict: false``. On OpenAI's own
    API, a model without structured outputs (GPT-3.5, GPT-4, GPT-4 Turbo, ...) makes
    ``output_strategy="auto"`` use the final-result tool."""

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
        self._sdk = import_sdk("openai", "openai")
        timeout = attempt_timeout(self._sdk, check_request_timeout(owner, request_timeout))
        if client is None:
            base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
            base_url = check_base_url(owner, base_url, "OPENAI_BASE_URL")
            api_key = api_key or os.environ.get("OPENAI_API_KEY") or None
            api_key = check_api_key(owner, api_key, "OPENAI_API_KEY")
            check_url_user(owner, base_url, "OPENAI_BASE_URL", keyed=api_key is not None)
            if api_key is None:
                if base_url is None:
                    raise ConfigurationError(
                        f"{owner}: no OpenAI API key: set OPENAI_API_KEY (or pass api_key=; "
                        "OPENAI_BASE_URL points it at another server)"
                    )
                api_key = "unused"
            make = made_noting_heads(
                functools.partial(type(self)._new_client, self._sdk, base_url, api_key, timeout)
            )
            client = make()
        else:
            client = noting_heads(client.with_options(max_retries=0, timeout=timeout))
            make = None
        self._clients = LoopClients(client, make, owner, self.provider, model)
        host = _host(client.base_url)
        self._official = _is_official(host)
        if self._official:
            check_not_model_string(owner, model, self.provider)
        self._reasoning_field = _reasoning_field(host)
        self._calls_need_reasoning = host in _CALLS_NEED_REASONING
        # The base URL's host and port, for the chat span's server.address and server.port.
        self.server_address, self.server_port = server_of(client.base_url)
        self._known_window = known_context_window(self.provider, model)
        self._served = ServedWindow(
            self.provider,
            model,
            ask=not self._official and self._context_window is None,
            logger=logger,
        )
        self._accepted = accepted_parameters(client.chat.completions.create)
        self._stream_usage = True
        owner = f"{self.provider}: the server of {model!r}"
        ways: list[tuple[_Counter, str]] = [(self._official_count, "/v1/responses/input_tokens")]
        if not self._official:  # a proxy in front of OpenAI's API answers the last way
            ways[:0] = [
                (self._llama_count, "/apply-template"),
                (self._vllm_count, "vLLM's /tokenize"),
            ]
        self._counters: tuple[tuple[_Counter, CountAsking], ...] = tuple(
            (counter, CountAsking(owner, where)) for counter, where in ways
        )
        """The ways the server may count prompt tokens, each with whether it is still asked."""
        self._error = error_mapper(
            self._sdk, self._sdk.OpenAIError, self.provider, keys=lambda: client_credentials(client)
        )

    @staticmethod
    def _new_client(sdk: Any, base_url: str | None, api_key: str, timeout: Any) -> Any:
        """A client of the server, made for each event loop the model is used in, with an
        attempt's ``timeout`` (``attempt_timeout``)."""
        return client_at(sdk.AsyncOpenAI, base_url, api_key=api_key, max_retries=0, timeout=timeout)

    @property
    def name(self) -> str:
        """The model's name."""
        return self._name

    @property
    def context_window(self) -> int | None:
        """The constructor's window, else the server's, else the documented one; or ``None``."""
        return self._context_window or self._served.window or self._known_window

    async def prepare(self) -> None:
        """Read the window another server reports, once; concurrent callers, in any
        event loop or thread, wait for it. ``ProviderError`` once the model was closed."""
        self._clients.check_open()
        await self._served.read(self._clients, "models", MODELS_TIMEOUT, self._error)

    async def aclose(self) -> None:
        """Close the model for good and the running event loop's HTTP client (a loop that
        ended closed its own): a call it cuts, and any later call or ``prepare()`` in any
        task or thread, raises a ``ProviderError`` (not retried). A model given
        ``client=`` closes nothing: it goes on as it was."""
        await self._clients.aclose()

    def _params(self, request: ModelRequest) -> dict[str, Any]:
        check_images(self.provider, request.messages)  # sent nowhere: refused
        developer_role = "developer" if self._official else "system"
        # Reasoning goes back within the current turn's tool loop (after the last user
        # message), where servers that think between tool calls expect it, and on every
        # message with tool calls: DeepSeek's and Kimi's thinking modes refuse one without.
        turn = max(
            (i for i, message in enumerate(request.messages) if message.role is Role.USER),
            default=-1,
        )
        params: dict[str, Any] = {
            "model": self._name,
            "messages": [  # each call under an id of its own: the API refuses repeats
                entry
                for position, message in enumerate(with_unique_call_ids(request.messages))
                for entry in _message(
                    message,
                    developer_role,
                    self.provider if position > turn or message.tool_calls else None,
                    reasoning_field=self._reasoning_field,
                    calls_need_reasoning=self._calls_need_reasoning,
                    signed=not self._official,
                )
            ],
        }
        if request.tools:
            params["tools"] = [_tool(spec) for spec in request.tools]
        extra: dict[str, Any] = dict(request.settings.get(EXTRA_BODY, {}))
        for key in (*request.settings, *extra):
            if key in RESERVED_SETTINGS:
                raise ConfigurationError(
                    f"settings: {key!r} is set by littleghost and cannot be a model setting"
                )
        for key, value in request.settings.items():
            if key == EXTRA_BODY:
                continue
            if key in _TOOL_SETTINGS and not request.tools:
                continue
            if key == "max_tokens" and self._official:
                key = "max_completion_tokens"
            (params if key in self._accepted else extra)[key] = value
        if request.output_schema is not None:
            for key, value in self._output_params(request.output_schema).items():
                (params if key in self._accepted else extra)[key] = value
        if extra:
            params["extra_body"] = extra
        return params

    async def count_prompt_tokens(self, request: ModelRequest) -> int | None:
        """The prompt tokens the server counts for ``request``. OpenAI's own API (and its
        regional hosts): the input-token count of the same request (``POST
        /v1/responses/input_tokens``). Another server: a llama.cpp server's chat template
        applied to the chat request (``POST /apply-template``, which reads what the
        template reads, such as ``chat_template_kwargs``) and tokenized as a completion's
        prompt is (``POST /tokenize``); else vLLM's count of the chat request (``POST
        /tokenize`` with the messages); else the input-token count (a proxy in front of
        OpenAI's API). ``None`` when the server has none of these (``CountAsking`` says
        when a way is given up); any other failure raises."""
        params = self._params(request)
        sent = {key: value for key, value in params.items() if key != "extra_body"}
        sent.update(params.get("extra_body", {}))  # the body as the server reads it

        for counter, asking in self._counters:

            async def count(counter: _Counter = counter) -> int | None:
                client = await self._clients.get()
                async with self._clients.sending():
                    return await counter(client, sent)

            with self._clients.stopped_by_close():
                counted = await asking.ask(count, self._error)
            if counted is not None:
                return counted
        return None

    @staticmethod
    async def _official_count(client: Any, params: dict[str, Any]) -> int | None:
        """OpenAI's input-token count of the request."""
        body = count_request(params)
        counted = await client.post("responses/input_tokens", body=body, cast_to=object)
        return reported(counted, "input_tokens") or None

    @staticmethod
    async def _llama_count(client: Any, params: dict[str, Any]) -> int | None:
        """A llama.cpp server's count of the request's prompt."""
        root = _server_root(client)
        applied = await client.post(f"{root}/apply-template", body=params, cast_to=object)
        prompt = lookup(applied, "prompt")
        if not isinstance(prompt, str):
            return None
        tokenized = await client.post(
            f"{root}/tokenize",
            body={"content": prompt, "add_special": True, "parse_special": True},
            cast_to=object,
        )
        tokens = lookup(tokenized, "tokens")
        return len(tokens) if isinstance(tokens, list) else None

    @staticmethod
    async def _vllm_count(client: Any, params: dict[str, Any]) -> int | None:
        """A vLLM server's count of the chat request's prompt (its chat template applied
        with the generation prompt, as a chat completion's)."""
        keys = ("model", "messages", "tools", "chat_template_kwargs")
        body = {key: params[key] for key in keys if key in params}
        counted = await client.post(f"{_server_root(client)}/tokenize", body=body, cast_to=object)
        return reported(counted, "count") or None

    def output_schema_problem(self, schema: OutputSchema) -> str | None:
        """Why the model cannot take ``schema`` natively, whatever it is: it is one of
        OpenAI's models without structured outputs, on OpenAI's own API (another server
        may serve any model under such a name)."""
        if self._official and _NO_STRUCTURED_OUTPUTS.match(self._name.strip().lower()):
            return "OpenAI's structured outputs are not available on this model"
        return None

    def _output_params(self, output: OutputSchema) -> dict[str, Any]:
        """The parameters that hold the answer to ``output``: a JSON-schema
        ``response_format``, strict unless the schema has a ``closed_problem``."""
        strict = output.strict_schema
        return {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": output.name,
                    "schema": dict(output.schema if strict is None else strict),
                    "strict": strict is not None,
                },
            }
        }

    async def respond(self, request: ModelRequest) -> ModelResponse:
        """Answer one request with one chat completion; one without a finish reason and
        with a tool call's arguments not a whole JSON object was cut on its way
        (``check_answer_whole``). An answer that came as a body of events (a server that
        streams whatever it is asked) is read as a stream's."""
        params = self._params(request)
        completion: Any = None
        # an answer of the wrong shape is billed all the same; an error it tells of
        # too: keys hidden
        with (
            billed_so_far(lambda: _usage(lookup(completion, "usage"))),
            self._clients.stopped_by_close(),
            provider_errors(self._error),
        ):
            client = await self._clients.get()
            async with self._clients.sending():
                completion = await answer_or_events(client.chat.completions.create(**params))
            events = sent_events(completion)
            if events is None:
                return self._read(completion, request)
        return await streamed_answer(self.provider, self._streamed(request, events))

    def _read(self, completion: Any, request: ModelRequest) -> ModelResponse:
        """The response a chat completion (the SDK's, or its JSON) answers ``request``
        with."""
        if isinstance(completion, str):
            raise not_json(self.provider)
        provider = self.provider
        shaped(provider, completion, "body")
        choices = listed(provider, lookup(completion, "choices"), "choices")
        if not choices:
            sent = lookup(completion, "error")  # a gateway's error, sent with a 200
            if sent:
                raise classify_error(provider=provider, body={"error": sent})
            raise ProtocolError(f"{provider}: the completion for {self._name!r} has no choices")
        choice = shaped(provider, choices[0], "choices[0]")
        reason = text_of(provider, lookup(choice, "finish_reason"), "choices[0].finish_reason")
        if reason in _FAILED:
            raise _ended_in_error(provider, reason, lookup(choice, "error"))
        if reason == _FULL_WINDOW:
            raise _window_full(provider, lookup(completion, "usage"))
        message = lookup(choice, "message")
        if message is None:
            raise ProtocolError(f"{provider}: a choice for {self._name!r} has no message")
        where = "choices[0].message"
        message = shaped(provider, message, where)
        calls = _tool_calls(provider, lookup(message, "tool_calls"), f"{where}.tool_calls")
        if not calls and lookup(message, "function_call"):
            raise _legacy_call(provider)
        check_answer_whole(provider, reason, (call.arguments for call, _ in calls))
        content, thought = _pieces(provider, lookup(message, "content"), f"{where}.content")
        content = content or _transcript(provider, message, where)
        refusal = (
            "" if content else text_of(provider, lookup(message, "refusal"), f"{where}.refusal")
        )
        response = ModelResponse(
            self._answer(
                _reasoning(provider, message, where) or thought,
                content or refusal,
                calls,
                _details(provider, message, where),
            ),
            stop_reason(reason or None, bool(calls), bool(refusal)),
            _usage(lookup(completion, "usage")),
            response_id=reported_name(completion, "id"),
            response_model=reported_name(completion, "model"),
        )
        return check_window_room(provider, response, request.max_tokens, self.context_window)

    def _answer(
        self,
        reasoning: str,
        text: str,
        calls: list[tuple[ToolCall, str | None]],
        details: list[Any],
    ) -> Message:
        """The assistant message: its reasoning (a server's ``reasoning_content``) and
        OpenRouter's ``reasoning_details``, text and tool calls, each after the Google
        thought signature it came with."""
        parts: list[Part] = [ReasoningPart(reasoning, None, self.provider)] if reasoning else []
        if details:
            parts.append(ReasoningPart("", json.dumps(details), _OPENROUTER))
        if text:
            parts.append(TextPart(text))
        for call, signature in calls:
            if signature:
                parts.append(ReasoningPart("", signature, _GOOGLE))
            parts.append(call)
        return Message(Role.ASSISTANT, parts)

    async def _open_stream(self, stack: AsyncExitStack, params: dict[str, Any]) -> Any:
        """Send the streaming request; without ``stream_options`` if the server rejects it."""
        create = (await self._clients.get()).chat.completions.with_streaming_response.create
        if self._stream_usage:
            try:
                return await stack.enter_async_context(
                    create(**params, stream=True, stream_options={"include_usage": True})
                )
            except self._sdk.APIStatusError as error:
                if error.status_code not in (400, 422) or "stream_options" not in (
                    f"{error.message} {error.body}"
                ):
                    raise
                # off for good only once the server takes the request without them (an
                # error that quotes the request names them too)
                opened = await stack.enter_async_context(create(**params, stream=True))
                self._stream_usage = False
                return opened
        return await stack.enter_async_context(create(**params, stream=True))

    def stream(self, request: ModelRequest) -> AsyncGenerator[ModelStreamEvent, None]:
        """Stream one chat completion (``_streamed``)."""
        return self._streamed(request, None)

    async def _streamed(
        self, request: ModelRequest, sent: SentEvents | None
    ) -> AsyncGenerator[ModelStreamEvent, None]:
        """Stream one chat completion, or read ``sent``, the events an answer not streamed
        came as: ``TextChunk`` values (the answer, or a refusal), ``ReasoningChunk`` and
        ``ToolCallChunk`` values as they come, then one ``StreamDone``.

        The answer is whole once its ``finish_reason`` came, or ``[DONE]`` without one
        after an answer of text or tool calls, every function call's arguments a whole JSON
        object (a proxy ends a stream its upstream cut with ``[DONE]``); a call of another
        type is left out (``_FUNCTION``). A stream that ends before
        was cut off, and one whose choice ends with a ``finish_reason`` of ``_FAILED``
        failed on the provider's side: both a ``ProviderUnavailableError``, unless the
        choice carries an error, which is classified. A connection lost or gone silent once
        the answer is whole keeps it (``sse_events``), with the usage that came (none, when
        the connection broke before a usage chunk), and so does a chunk of the wrong shape
        after it (``past_the_end``). Closing the iterator early closes the
        HTTP response, which stops the server's generation.
        """
        params = self._params(request)
        text: list[str] = []
        refused = legacy = False  # legacy: a function_call was sent (no tool call to run)
        reasoning: list[str] = []
        details: list[Any] = []  # OpenRouter's reasoning_details
        calls: list[dict[str, Any]] = []
        at: dict[object, dict[str, Any]] = {}  # the call being written, by index, else by id
        provider = self.provider
        key: object = 0  # (Gemini sends no index)
        finish_reason: str | None = None
        done = chosen = False  # chosen: a choice came
        usage: Any = None
        response_id: str | None = None
        response_model: str | None = None
        sent_whole: ModelResponse | None = None  # from a server that does not stream

        def ended() -> bool:
            """Whether the answer came whole (the docstring's rule)."""
            if finish_reason is not None:
                return True
            arguments = (_arguments(call) for call in calls if call["type"] in _FUNCTION)
            answered = bool(text or calls or legacy)
            return done and answered and all(map(whole_arguments, arguments))

        with (
            billed_so_far(lambda: _usage(usage)),
            self._clients.stopped_by_close(),
            provider_errors(self._error),
        ):
            async with AsyncExitStack() as stack:
                http: Any = sent
                if sent is None:
                    async with self._clients.sending():  # until the answer's head comes
                        http = (await self._open_stream(stack, params)).http_response
                try:
                    read = sse_events(http, provider, whole=ended)
                    async with aclosing(read) as events:
                        async for name, data in events:
                            if name is WHOLE_ANSWER:  # read as an answer not streamed
                                body = answer_json(data)
                                usage = lookup(body, "usage")
                                sent_whole = self._read(body, request)
                                break
                            if data.strip() == "[DONE]":
                                done = True
                                continue  # read the body to its end: nothing is left open
                            with past_the_end(provider, ended()):
                                chunk = self._chunk(name, data)
                                usage = chunk.get("usage") or usage
                                response_id = response_id or reported_name(chunk, "id")
                                response_model = response_model or reported_name(chunk, "model")
                                for choice in listed(provider, chunk.get("choices"), "choices"):
                                    choice = shaped(provider, choice, "choices[]")
                                    if index_of(provider, choice.get("index"), "choices[].index"):
                                        continue
                                    chosen = True
                                    delta = shaped(provider, choice.get("delta"), "choices[].delta")
                                    where = "choices[].delta"
                                    legacy = legacy or bool(delta.get("function_call"))
                                    answer, thought = _pieces(
                                        provider, delta.get("content"), f"{where}.content"
                                    )
                                    answer = answer or _transcript(provider, delta, where)
                                    piece = _reasoning(provider, delta, where) or thought
                                    if piece:
                                        reasoning.append(piece)
                                        yield ReasoningChunk(piece)
                                    _merged_details(details, _details(provider, delta, where))
                                    refusal = text_of(
                                        provider, delta.get("refusal"), f"{where}.refusal"
                                    )
                                    if not answer and refusal:
                                        answer, refused = refusal, True
                                    if answer:
                                        text.append(answer)
                                        yield TextChunk(answer)
                                    pieces = listed(
                                        provider, delta.get("tool_calls"), f"{where}.tool_calls"
                                    )
                                    for piece in pieces:
                                        place = f"{where}.tool_calls[]"
                                        piece = shaped(provider, piece, place)
                                        index = piece.get("index")
                                        if index is not None:
                                            index = index_of(provider, index, f"{place}.index")
                                        named = (
                                            text_of(provider, piece.get("id"), f"{place}.id")
                                            or None
                                        )
                                        kind = text_of(provider, piece.get("type"), f"{place}.type")
                                        function = shaped(
                                            provider, piece.get("function"), f"{place}.function"
                                        )
                                        name = text_of(
                                            provider, function.get("name"), f"{place}.function.name"
                                        )
                                        key = index if index is not None else named or key
                                        call = at.get(key)
                                        # another id at an index starts another call (Ollama
                                        # gives every parallel call index 0), and so does
                                        # another name after whole arguments, without either
                                        if (
                                            call is None
                                            or (named and call["id"] not in (None, named))
                                            or (index is None and not named and _next(call, name))
                                        ):
                                            call = {
                                                "index": index,
                                                "id": named,
                                                "type": kind,
                                                "name": "",
                                                "arguments": [],  # its pieces
                                                "last": "",
                                                "repeats": True,
                                                "signature": None,
                                            }
                                            calls.append(call)
                                            at[key] = call
                                            if kind in _FUNCTION:
                                                yield ToolCallChunk()
                                        call["id"] = call["id"] or named
                                        call["type"] = call["type"] or kind
                                        call["signature"] = (
                                            _thought_signature(provider, piece, place)
                                            or call["signature"]
                                        )
                                        if name != call["name"]:  # not the whole name sent again
                                            call["name"] += name  # (MiniMax on NVIDIA NIM does)
                                        given = function.get("arguments") or ""
                                        if not isinstance(given, str):  # sent whole, as an object
                                            given = json.dumps(given)
                                        if given:
                                            call["repeats"] = call["repeats"] and given.startswith(
                                                call["last"]
                                            )
                                            call["last"] = given
                                        call["arguments"].append(given)  # joined once read
                                    finish_reason = (
                                        text_of(
                                            provider,
                                            choice.get("finish_reason"),
                                            "choices[].finish_reason",
                                        )
                                        or finish_reason
                                    )
                                    if finish_reason in _FAILED:
                                        raise _ended_in_error(
                                            provider, finish_reason, choice.get("error")
                                        )
                finally:
                    with anyio.CancelScope(shield=True):
                        await http.aclose()
            if sent_whole is not None:
                for streamed in answered_whole(sent_whole):
                    yield streamed
                return
            if not ended() and (chosen or not done):  # [DONE] alone: no choices, below
                raise stream_cut_off(self.provider)
            if not chosen:  # as a completion without choices
                raise ProtocolError(f"{provider}: the completion for {self._name!r} has no choices")
            if finish_reason == _FULL_WINDOW:
                raise _window_full(self.provider, usage)
            if all(call["index"] is not None for call in calls):  # their places, as listed
                calls.sort(key=lambda call: call["index"])  # unstreamed (stable: Ollama's)
            tool_calls = [
                (
                    ToolCall(
                        call["id"] or f"call_{index}",
                        call["name"],
                        parse_arguments(_arguments(call)),
                    ),
                    call["signature"],
                )
                for index, call in enumerate(calls)
                if call["type"] in _FUNCTION
            ]
            if legacy and not tool_calls:
                raise _legacy_call(self.provider)
            response = ModelResponse(
                self._answer("".join(reasoning), "".join(text), tool_calls, details),
                stop_reason(finish_reason, bool(tool_calls), refused),
                _usage(usage),
                response_id=response_id,
                response_model=response_model,
            )
            window = self.context_window
            response = check_window_room(self.provider, response, request.max_tokens, window)
        yield StreamDone(response)

    def _chunk(self, event: str | None, data: str) -> dict[str, Any]:
        """One streamed chunk; an ``error`` event, or a chunk with an ``error`` (an object,
        or a string as TGI sends), is raised as the error it reports."""
        try:
            chunk = answer_json(data)
        except json.JSONDecodeError:  # an integer too long, or nesting too deep: mapped
            if event == "error":
                raise classify_error(provider=self.provider, message=data) from None
            raise ProtocolError(
                f"{self.provider}: the stream sent an event that is not JSON"
            ) from None
        if not isinstance(chunk, dict):
            raise ProtocolError(f"{self.provider}: the stream sent an event that is not an object")
        if event == "error" or chunk.get("error"):
            raise classify_error(provider=self.provider, body=chunk)
        return chunk


def from_model_string(model: str | None) -> OpenAIModel:
    """Build the model an ``"openai:NAME"`` string names (key from ``OPENAI_API_KEY``)."""
    if not model:
        raise ConfigurationError("model: 'openai' needs a model name, as in 'openai:gpt-4o-mini'")
    return OpenAIModel(model)
