"""Plumbing shared by the SDK-backed providers: lazy SDK imports, images, tool arguments,
the parameters an installed SDK accepts, server-sent events, and the mapping of the SDK's
and the HTTP library's errors to littleghost's."""

from __future__ import annotations

import base64
import enum
import importlib
import inspect
import json
import logging
import os
import re
import ssl
import sys
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import aclosing, contextmanager
from typing import Any
from urllib.parse import parse_qsl, unquote_to_bytes, urlsplit, urlunsplit

from littleghost import logs
from littleghost._validators import (
    TOKEN_COUNT,
    digits_limit,
    is_int,
    is_number,
    is_token_count,
    safe_repr,
)
from littleghost.cleanup import chain
from littleghost.errors import (
    ConfigurationError,
    InvalidRequestError,
    ProtocolError,
    ProviderError,
    ProviderUnavailableError,
)
from littleghost.messages import (
    ImagePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCall,
    empty_image,
)
from littleghost.models.answer_json import answer_json, keep_answer, keeping_answers, too_long
from littleghost.models.base import ModelResponse, Usage, report_usage
from littleghost.models.overflow import classify_error, should_retry, transport_error
from littleghost.models.streaming import (
    ModelStreamEvent,
    ReasoningChunk,
    StreamDone,
    TextChunk,
    ToolCallChunk,
)
from littleghost.models.windows import provider_of
from littleghost.text import json_text, json_type_name
from littleghost.tool_types import ToolArgumentError, parse_json

__all__ = [
    "ABSENT",
    "COUNT_REFUSALS",
    "WHOLE_ANSWER",
    "CountAsking",
    "RequestLogFilter",
    "SentEvents",
    "UrlLogFilter",
    "accepted_parameters",
    "answer_or_events",
    "answered_whole",
    "billed_so_far",
    "check_answer_whole",
    "check_api_key",
    "check_base_url",
    "check_context_window",
    "check_images",
    "check_model_name",
    "check_url_user",
    "client_at",
    "client_credentials",
    "error_mapper",
    "image_base64",
    "image_media_type",
    "import_sdk",
    "index_of",
    "listed",
    "lookup",
    "made_noting_heads",
    "not_json",
    "noting_heads",
    "parse_arguments",
    "past_the_end",
    "provider_errors",
    "reported",
    "reported_name",
    "reported_usage",
    "sent_arguments",
    "sent_events",
    "server_of",
    "shaped",
    "sse_events",
    "stream_cut_off",
    "streamed_answer",
    "text_of",
    "whole_arguments",
    "wrong_shape",
]


COUNT_REFUSALS = 3
"""Prompt counts a server turns down with a client error, in a row, before that way of
counting is not asked again."""
ABSENT = (404, 405, 501)
"""HTTP statuses that say a server has no such endpoint."""

logger = logs.logger("littleghost.models")


class CountAsking:
    """Asks a server for prompt counts one way (``where``, an endpoint), until it showed
    it has no such endpoint (HTTP 404, 405 or 501, or an answer without a count), or after
    ``COUNT_REFUSALS`` client errors in a row (each judges one request: an image the
    endpoint cannot fetch, a key without access)."""

    __slots__ = ("on", "owner", "refusals", "where")

    def __init__(self, owner: str, where: str) -> None:
        self.owner = owner
        self.where = where
        self.on = True
        self.refusals = 0

    async def ask(
        self,
        count: Callable[[], Awaitable[int | None]],
        mapped: Callable[[Exception], ProviderError | None],
    ) -> int | None:
        """``count()``'s figure; ``None`` when the server is no longer asked or has no such
        endpoint. Another failure raises, as ``mapped`` gives littleghost's error for it."""
        if not self.on:
            return None
        try:
            counted = await count()
        except Exception as error:
            provider_error = mapped(error)
            if provider_error is None:
                raise
            if provider_error.status in ABSENT:
                counted = None
            else:
                self._refused(provider_error.status)
                raise provider_error from error
        if counted is None:
            self.on = False
            logger.info("%s does not count prompt tokens through %s", self.owner, self.where)
            return None
        self.refusals = 0
        return counted

    def _refused(self, status: int | None) -> None:
        """One more count in a row turned down, if ``status`` is a client error."""
        if status is None or not 400 <= status < 500 or status in (408, 429):
            return
        self.refusals += 1
        if self.refusals >= COUNT_REFUSALS:
            self.on = False
            logger.warning(
                "%s turned down %d prompt counts through %s in a row (HTTP %d); it is not "
                "asked again",
                self.owner,
                self.refusals,
                self.where,
                status,
            )


def import_sdk(module: str, extra: str) -> Any:
    """Import a provider SDK, with its request logs redacted (``RequestLogFilter``), or
    say what to install.

    Raises:
        ConfigurationError: The SDK is not installed.
    """
    try:
        sdk = importlib.import_module(module)
    except ImportError:
        raise ConfigurationError(
            f"the {module!r} SDK is not installed: pip install 'littleghost[{extra}]'"
        ) from None
    sdk_logger = logging.getLogger(f"{module}._base_client")
    if not any(isinstance(known, RequestLogFilter) for known in sdk_logger.filters):
        sdk_logger.addFilter(RequestLogFilter(f"{module.upper()}_LOG"))
    for http_logger in map(logging.getLogger, (sdk_logger.name, *_HTTP_LOGGERS)):
        if not any(isinstance(known, UrlLogFilter) for known in http_logger.filters):
            http_logger.addFilter(UrlLogFilter())
    return sdk


_HTTP_LOGGERS = ("httpx", "httpx2")
"""The HTTP clients' loggers, which log every request's URL at INFO."""


class UrlLogFilter(logging.Filter):
    """Takes the user, password and query out of the URLs a record logs: a base URL may
    carry a proxy's credentials or a key (``https://user:secret@host/v1?key=...``). A
    traceback that names one (the ``HTTPStatusError`` the SDKs log at DEBUG for every
    error answer) is kept as text without them, in place of the exception."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(map(_without_credentials, record.args))
        if record.exc_info and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            kept = _URL.sub(lambda url: str(_without_credentials(url[0])), text)
            if kept != text:
                record.exc_info, record.exc_text = None, kept
        return True


_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")
"""A URL in an error's text (``... for url 'https://...'``)."""


def _without_credentials(value: object) -> object:
    """``value``; a URL with a user, password or query as one without them."""
    if not isinstance(value, str) and type(value).__name__ != "URL":
        return value
    try:
        parts = urlsplit(str(value))
    except ValueError:
        return value
    _, at, where = parts.netloc.rpartition("@")  # the host and port, as written
    if not parts.scheme or not where or not (at or parts.query):
        return value
    return f"{parts.scheme}://{where}{parts.path}{'?…' if parts.query else ''}"


class RequestLogFilter(logging.Filter):
    """Redacts the request bodies an SDK logs at DEBUG (``"Request options: {...}"``: the
    prompt, tool arguments and results, summaries) down to the method and URL, unless the
    SDK's own switch ``opt_in`` (``ANTHROPIC_LOG``, ``OPENAI_LOG``) is ``debug``."""

    _KEPT = frozenset({"method", "url"})

    def __init__(self, opt_in: str) -> None:
        super().__init__()
        self.opt_in = opt_in

    def filter(self, record: logging.LogRecord) -> bool:
        if (
            isinstance(record.msg, str)
            and record.msg.startswith("Request options")
            and os.environ.get(self.opt_in) != "debug"
        ):
            options = record.args if isinstance(record.args, Mapping) else {}
            kept = {key: value for key, value in options.items() if key in self._KEPT}
            record.msg = "Request options: %s (the rest redacted by littleghost; %s=debug logs it)"
            record.args = (kept, self.opt_in)
        return True


def check_base_url(owner: str, value: str | None, variable: str) -> str | None:
    """``value`` (a ``base_url=``, else the environment's ``variable``): ``None``, or an
    ``http://`` or ``https://`` URL with a host (and a port from 1 to 65535, if any). The
    message never shows it: it may hold a key or a password.

    Raises:
        ConfigurationError: Anything else (``localhost:8080/v1``, without its scheme).
    """
    if value is None:
        return None
    try:
        parts = urlsplit(value)
        ok = (
            parts.scheme.lower() in ("http", "https")
            and bool(parts.hostname)
            and parts.port != 0  # reading it refuses one out of range or not a number
        )
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ConfigurationError(
            f"{owner}: base_url (or {variable}) must be an http:// or https:// URL with a "
            "host (and a port from 1 to 65535, if any), as in http://localhost:8080/v1"
        )
    return value


def check_url_user(owner: str, base_url: str | None, variable: str, keyed: bool) -> None:
    """Refuse a user or password in ``base_url`` (``variable``'s, else) beside a key
    (``keyed``): the HTTP client sends them as Basic auth in the ``Authorization``
    header, in place of the key's. The message never shows them.

    Raises:
        ConfigurationError: A ``base_url`` with a user or password, and a key.
    """
    if keyed and base_url is not None and "@" in urlsplit(base_url).netloc:
        raise ConfigurationError(
            f"{owner}: base_url (or {variable}) holds a user or password, which the HTTP "
            "client would send as Basic auth in place of the API key: take them out of "
            "the URL (for a gateway that asks for both, pass client= with an HTTP client "
            "that authenticates to it)"
        )


def client_at(make: Callable[..., Any], base_url: str | None, **options: Any) -> Any:
    """``make(base_url=..., **options)`` (an SDK's client) at ``base_url`` without its
    query, which its HTTP client sends on every request instead (Azure's
    ``?api-version=...``, a gateway's), every value of a repeated key in the order given
    (the keys in the order they first come): left in the URL, the SDK would append each
    endpoint's path to it (``?api-version=1chat/completions``); its ``default_query``
    keeps one value a key."""
    parts = urlsplit(base_url) if base_url is not None else None
    if parts is None or not parts.query:
        return make(base_url=base_url, **options)
    client = make(base_url=urlunsplit(parts._replace(query="")), **options)
    client._client.params = parse_qsl(parts.query, keep_blank_values=True)
    return client


def check_api_key(owner: str, value: str | None, variable: str) -> str | None:
    """``value`` (an ``api_key=``, else the environment's ``variable``): ``None``, or a key
    an HTTP header carries as it is: printable ASCII, no whitespace at either end. The
    message never shows it.

    Raises:
        ConfigurationError: Anything else (a key read from a file with its line break):
            every call would fail as if the server could not be reached, and the HTTP
            library's error, which the SDK and ``httpcore`` log at DEBUG, quotes the key.
    """
    if value is None or not isinstance(value, str):  # an SDK's own kind of key: its business
        return value
    if not (value.isascii() and value.isprintable()) or value != value.strip():
        raise ConfigurationError(
            f"{owner}: api_key (or {variable}) must be printable ASCII without whitespace at "
            "either end (a key read from a file keeps its line break: strip it)"
        )
    return value


def check_model_name(owner: str, value: object) -> str:
    """A ``model`` argument: a non-empty str."""
    if not isinstance(value, str) or not value:
        raise ConfigurationError(f"{owner}: model must be a non-empty str, not {safe_repr(value)}")
    return value


def check_not_model_string(owner: str, model: str, provider: str) -> None:
    """Refuse, for ``provider``'s own API (a gateway may name its models so), a model
    string of ``provider``'s that names one of its documented models
    (``openai:gpt-4o-mini``, which the API would not know)."""
    prefix, _, name = model.partition(":")
    if prefix.lower() == provider and provider_of(name) == provider:
        raise ConfigurationError(
            f"{owner}: model is the model's name, not a model string: {owner}({name!r}) (the "
            f"string {model!r} is what an agent's model = ... takes)"
        )


def check_context_window(owner: str, value: object) -> int | None:
    """A ``context_window`` argument: ``None`` or a count of tokens (``is_token_count``)."""
    if value is None:
        return None
    if not is_token_count(value):
        raise ConfigurationError(
            f"{owner}: context_window must be {TOKEN_COUNT} or None, not {safe_repr(value)}"
        )
    return value


CONNECT_TIMEOUT = 5.0
"""The longest an attempt waits to connect, as the SDKs' default, or ``request_timeout``
when that is shorter."""


def check_request_timeout(owner: str, value: object) -> float | None:
    """A ``request_timeout`` argument: ``None`` or seconds > 0, finite."""
    if value is None:
        return None
    if not is_number(value) or value <= 0:
        raise ConfigurationError(
            f"{owner}: request_timeout must be seconds > 0 or None, not {safe_repr(value)}"
        )
    return float(value)


def attempt_timeout(sdk: Any, seconds: float | None) -> Any:
    """The SDK client's ``timeout`` for a ``request_timeout`` of ``seconds``: that many
    seconds of silence (to connect: at most ``CONNECT_TIMEOUT``), or, for ``None``, the
    SDK's ``NOT_GIVEN`` (the client's own: the SDKs' 600 s, 5 s to connect)."""
    if seconds is None:
        return sdk.NOT_GIVEN
    return sdk.Timeout(seconds, connect=min(seconds, CONNECT_TIMEOUT))


_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "image/png"),
    (b"\xff\xd8\xff", "image/jpeg"),
    (b"GIF87a", "image/gif"),
    (b"GIF89a", "image/gif"),
)


def image_media_type(part: ImagePart) -> str:
    """The part's media type; for bytes without one, read from the data's signature."""
    if part.media_type:
        return part.media_type
    data = part.data or b""
    for signature, media_type in _SIGNATURES:
        if data.startswith(signature):
            return media_type
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return "image/png"


def check_images(provider: str, messages: Iterable[Message]) -> None:
    """Refuse a request holding an image without bytes (``empty_image``), which the APIs
    refuse, before it is sent.

    Raises:
        InvalidRequestError: Such an image (the error the API's answer would be).
    """
    if any(empty_image(part) for message in messages for part in message.content):
        raise InvalidRequestError(
            f"{provider}: the request holds an ImagePart with no image (data=b'', or a "
            "data: URL with nothing after its comma), which the API refuses; nothing was sent",
            code="empty_image",
            provider=provider,
        )


def image_base64(part: ImagePart) -> str:
    """The part's bytes as base64 text."""
    return base64.b64encode(part.data or b"").decode("ascii")


def inline_image(part: ImagePart) -> tuple[str, str] | None:
    """An image given inline, by its bytes or a ``data:`` URL, as its media type and its
    data in base64; ``None`` for one at a URL to fetch."""
    url = part.url
    if url is None:
        return image_media_type(part), image_base64(part)
    if url[:5].lower() != "data:":
        return None
    header, _, payload = url[5:].partition(",")
    media_type = header.split(";")[0] or image_media_type(part)
    if header.lower().endswith(";base64"):
        return media_type, payload
    return media_type, base64.b64encode(unquote_to_bytes(payload)).decode("ascii")


def parse_arguments(raw: object) -> Mapping[str, Any] | str:
    """Tool-call arguments as a mapping (one an SDK parsed as it is: ``ToolCall`` keeps
    what JSON text cannot carry as its text); the raw text when it is not a JSON object,
    read strictly (``parse_json``: no ``NaN`` or infinity)."""
    if isinstance(raw, Mapping):
        return raw
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        return {}
    text = raw if isinstance(raw, str) else _written(raw)
    try:
        value = parse_json(text)
    except ToolArgumentError:
        return text
    return value if isinstance(value, dict) else text


def _written(value: object) -> str:
    """Arguments an SDK parsed that are no object (a list, a number) as the JSON text
    they came as; ``str()`` of what JSON cannot write."""
    try:
        return json_text(value)
    except (ValueError, RecursionError):
        return str(value)


def whole_arguments(raw: object) -> bool:
    """Whether tool-call arguments came whole: a mapping (an SDK parsed them), or text
    that reads as a JSON object, whatever its numbers (``NaN``, an integer too long to
    read), which text cut on its way never does."""
    if isinstance(raw, Mapping):
        return True
    if not isinstance(raw, str):
        return False
    try:
        value = json.loads(raw, parse_int=len, parse_float=len, parse_constant=len)
    except (ValueError, RecursionError):
        return False
    return isinstance(value, dict)


def sent_arguments(call: ToolCall) -> dict[str, Any]:
    """A logged call's arguments as a provider is sent them: the JSON object, or ``{}``
    for arguments kept as text (unreadable, cut at ``max_tokens``, or holding what JSON
    text cannot carry): llama.cpp and vLLM parse the calls of a request for its chat
    template and refuse the whole request over them, and Anthropic takes only an object."""
    return {} if isinstance(call.arguments, str) else dict(call.arguments)


def lookup(value: object, *path: str) -> object:
    """The value at ``path`` in an SDK object or a dict (``None`` when absent)."""
    for name in path:
        value = value.get(name) if isinstance(value, Mapping) else getattr(value, name, None)
    return value


def _kind(value: object) -> str:
    """The JSON type of ``value`` as an error names it (``json_type_name``), an SDK's
    model of an object being an object; ``None`` is "missing" (absent or ``null``)."""
    if value is None:
        return "missing"
    return "an object" if _is_object(value) else json_type_name(value)


def _is_object(value: object) -> bool:
    """True for a JSON object: a dict, or an SDK's (pydantic) model of one. pydantic is
    not imported here: an SDK's model exists only once its SDK has imported it."""
    if isinstance(value, Mapping):
        return True
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(value, pydantic.BaseModel)


def wrong_shape(provider: str, where: str, value: object, wanted: str) -> ProtocolError:
    """The error for a field of an answer that has the wrong JSON type: it names the
    field and its type, never its value."""
    return ProtocolError(f"{provider}: the answer's {where} is {_kind(value)}, not {wanted}")


def text_of(provider: str, value: object, where: str, *, required: bool = False) -> str:
    """A text field of an answer: ``""`` when absent or ``null`` (unless ``required``).

    Raises:
        ProtocolError: It is another type (an answer is never dropped for its shape), or
            ``required`` and absent.
    """
    if isinstance(value, str):
        return value
    if value is None and not required:
        return ""
    raise wrong_shape(provider, where, value, "a string")


def shaped(provider: str, value: object, where: str) -> Any:
    """An object of an answer (a dict, or an SDK's model of one): ``{}`` when absent.

    Raises:
        ProtocolError: It is another type.
    """
    if value is None:
        return {}
    if _is_object(value):
        return value
    raise wrong_shape(provider, where, value, "an object")


def listed(provider: str, value: object, where: str, *, required: bool = False) -> list[Any]:
    """An array of an answer: ``[]`` when absent (unless ``required``).

    Raises:
        ProtocolError: It is another type, or ``required`` and absent.
    """
    if isinstance(value, list):
        return value
    if value is None and not required:
        return []
    raise wrong_shape(provider, where, value, "an array")


def index_of(provider: str, value: object, where: str) -> int:
    """A streamed item's index: ``0`` when absent.

    Raises:
        ProtocolError: It is not an int >= 0.
    """
    if value is None:
        return 0
    if is_int(value) and value >= 0:
        return value
    raise wrong_shape(provider, where, value, "an int >= 0")


def reported(value: object, *path: str) -> int:
    """The count at ``path`` in an SDK object or a dict; ``0`` (not reported) when absent
    or not a count of tokens (``is_token_count``: a float, a string, a negative count, one
    past what 64 bits hold)."""
    value = lookup(value, *path)
    return value if is_token_count(value) else 0


def reported_name(value: object, *path: str) -> str | None:
    """The non-empty string at ``path`` in an SDK object or a dict (a response's id or
    model); ``None`` when absent or not a string, so an odd server cannot fail the call."""
    value = lookup(value, *path)
    return value if isinstance(value, str) and value else None


_DEFAULT_PORTS = {"https": 443, "http": 80}


def server_of(base_url: object) -> tuple[str | None, int | None]:
    """The host and port of a client's base URL, for ``server.address`` and
    ``server.port``: the scheme's port when the URL names none; never the credentials,
    path or query the URL may hold. ``(None, None)`` for a URL without a host."""
    try:
        parts = urlsplit(str(base_url))
        host = parts.hostname
        port = parts.port
    except ValueError:  # a port out of range or not a number
        return None, None
    if not host:
        return None, None
    return host, port if port is not None else _DEFAULT_PORTS.get(parts.scheme.lower())


def reported_usage(
    input_tokens: int,
    output_tokens: int,
    *,
    cache_read: int = 0,
    cache_write: int = 0,
    reasoning: int = 0,
) -> Usage:
    """A ``Usage`` from a provider's counts; a breakdown a server reports larger than its
    total is cut to the total, so a miscounting server cannot fail the call."""
    cache_read = min(cache_read, input_tokens)
    return Usage(
        input_tokens,
        output_tokens,
        cache_read,
        min(cache_write, input_tokens - cache_read),
        min(reasoning, output_tokens),
    )


def accepted_parameters(method: Callable[..., Any]) -> frozenset[str]:
    """The keyword parameters an SDK method accepts."""
    return frozenset(inspect.signature(method).parameters)


_Kinds = tuple[type[BaseException], ...]


def transport_errors() -> tuple[_Kinds, _Kinds, _Kinds, _Kinds]:
    """The HTTP libraries' request errors and, among them, their timeouts, their failures
    to connect and their timeouts of a wait for a connection of a client's pool.

    A stream that breaks after its headers raises these directly, not as SDK errors.
    """
    errors: list[type[BaseException]] = []
    timeouts: list[type[BaseException]] = []
    unconnected: list[type[BaseException]] = []
    pooled: list[type[BaseException]] = []
    for name in ("httpx2", "httpx"):
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        errors.append(module.RequestError)
        timeouts.append(module.TimeoutException)
        unconnected += (module.ConnectError, module.ProxyError, module.UnsupportedProtocol)
        pooled.append(module.PoolTimeout)
    return tuple(errors), tuple(timeouts), tuple(unconnected), tuple(pooled)


SHORTEST_HIDDEN = 8
"""The shortest key ``error_mapper`` hides: a shorter one (a keyless server's
placeholder) would hide words."""


def _hide_keys(message: str, keys: Iterable[str]) -> str:
    """``message`` with each of ``keys`` replaced by ``[redacted]``, and the start of one
    its shortening cut (the ``…`` it ends with, ``MAX_DETAIL_CHARS``) too, where a word
    starts."""
    for key in keys:
        message = message.replace(key, "[redacted]")
    if not message.endswith("…"):
        return message
    kept = message[:-1]
    for key in keys:
        for length in range(len(key) - 1, 0, -1):
            start = len(kept) - length
            if kept.endswith(key[:length]) and (start == 0 or not kept[start - 1].isalnum()):
                return f"{kept[:start]}[redacted]…"
    return message


_CREDENTIAL_NAMES = ("key", "token", "secret", "pass", "auth", "sig", "credential", "cookie")
"""Words in the name of a query parameter or header that carries a credential (``key``,
``api-key``, ``access_token``, ``Authorization``, Azure's ``sig``)."""


def client_credentials(client: Any) -> tuple[str, ...]:
    """The credentials an SDK's ``client`` sends: its ``api_key`` and ``auth_token``, its
    HTTP client's Basic auth (``auth=``), and the ``_url_and_named`` ones of its base
    URL, its ``default_query`` and ``default_headers``, and its HTTP client's (where
    ``client_at`` puts a ``base_url``'s query)."""
    http = getattr(client, "_client", None)
    basic = getattr(getattr(http, "auth", None), "_auth_header", None)  # httpx's BasicAuth
    found = [getattr(client, "api_key", None), getattr(client, "auth_token", None), basic]
    found += basic.split() if isinstance(basic, str) else []
    named = (
        getattr(client, "_custom_query", None),
        getattr(client, "_custom_headers", None),
        getattr(http, "params", None),
        getattr(http, "headers", None),
    )
    return _url_and_named(getattr(client, "base_url", None), named, found)


def _sent_credentials(error: BaseException) -> tuple[str, ...]:
    """The ``_url_and_named`` credentials of the requests the exceptions of ``error``'s
    chain name (what was sent: an HTTP client's own auth, an event hook's header too)."""
    found: list[str] = []
    for current in chain(error):
        try:
            request = getattr(current, "request", None)
        except RuntimeError:  # the HTTP library's error without a request
            continue
        url = getattr(request, "url", None)
        found += _url_and_named(url, (getattr(request, "headers", None),))
    return tuple(found)


def _url_and_named(
    url: object, named: Iterable[object], found: Iterable[object] = ()
) -> tuple[str, ...]:
    """``found``, then ``url``'s password (and the Basic auth an HTTP client makes of its
    user and password), and the values of ``url``'s query parameters and of the
    ``named`` (headers, parameters) whose name holds one of ``_CREDENTIAL_NAMES`` (each
    word of a value too: the token after ``Bearer``); each once."""
    found = list(found)
    password = getattr(url, "password", None)
    if password:
        user = f"{getattr(url, 'username', '')}:{password}".encode()
        found += [password, base64.b64encode(user).decode("ascii")]
    for pairs in (getattr(url, "params", None), *named):
        items = getattr(pairs, "multi_items", None) or getattr(pairs, "items", None)
        if not callable(items):  # None, or a client of another shape: nothing
            continue
        for name, value in items():
            if isinstance(value, str) and any(
                word in str(name).lower() for word in _CREDENTIAL_NAMES
            ):
                found += [value, *value.split()]
    return tuple(dict.fromkeys(key for key in found if isinstance(key, str)))


_CHAINED = ("littleghost.", "openai.", "anthropic.", "httpx", "httpcore")
"""The modules (prefixes: ``httpx2`` too) whose exceptions ``_hide_in_chain`` rewrites."""


def _hide_in_chain(error: BaseException, keys: list[str]) -> None:
    """Hide ``keys`` (``_hide_keys``), and the user, password and query of the URLs
    (``_without_credentials``), in the text of ``error`` and of every exception it was
    raised from or during (an SDK's ``message`` too): the HTTP library's names the
    request's URL, the SDK's quotes what the server sent. The chain is followed through
    littleghost's, the SDKs' and the HTTP libraries' exceptions alone (``_CHAINED``):
    past them are the caller's (one it was handling as it called), left as they are."""
    pending: list[BaseException | None] = [error]
    seen: set[int] = set()
    while pending:
        current = pending.pop()
        if current is None or id(current) in seen:
            continue
        if not f"{type(current).__module__}.".startswith(_CHAINED):
            continue
        seen.add(id(current))
        pending += [current.__cause__, current.__context__]
        current.args = tuple(
            _hidden_text(arg, keys) if isinstance(arg, str) else arg for arg in current.args
        )
        message = getattr(current, "message", None)
        if isinstance(message, str):
            try:
                current.message = _hidden_text(message, keys)  # type: ignore[attr-defined]
            except AttributeError:  # a read-only message: its args are what is shown
                pass


def _hidden_text(text: str, keys: list[str]) -> str:
    """``text`` with ``keys`` hidden and its URLs without user, password or query."""
    return _URL.sub(lambda url: str(_without_credentials(url[0])), _hide_keys(text, keys))


def error_mapper(
    sdk: Any,
    base: type[Exception],
    provider: str,
    keys: Callable[[], Iterable[object]] = tuple,
) -> Callable[[Exception], ProviderError | None]:
    """Maps what an SDK call raised to a ``ProviderError``.

    Args:
        sdk: The SDK module (``openai`` or ``anthropic``): its ``APIStatusError``,
            ``APITimeoutError``, ``APIConnectionError`` and ``APIError`` are classified.
        base: The SDK's base exception (``openai.OpenAIError``): any other of its
            subclasses becomes a plain ``ProviderError``.
        provider: The provider name the errors carry.
        keys: The credentials the client sends (``client_credentials``), read as an
            error comes (a key provider the SDK awaits sets them before each request): a
            server that quotes one back (in a 401, an error event) has it replaced by
            ``[redacted]`` in the message of the ``ProviderError`` given, of one raised
            as it is (a stream's error event), and of the exceptions each was raised
            from or during (``_hide_in_chain``: the SDK's, the HTTP library's), whose
            URLs also lose their user, password and query.

    Returns:
        A function that gives ``None`` for an exception that is neither the SDK's, nor a
        request error of the HTTP library, nor a body that is not JSON (a transient
        ``ProviderUnavailableError``) or holds an integer longer, or nests deeper, than
        Python reads (a ``ProviderError``, not retried): it is re-raised as it is.
    """

    classify = _classifier(sdk, base, provider)

    def map_error(error: Exception) -> ProviderError | None:
        given = (*keys(), *_sent_credentials(error))
        hidden = [key for key in given if isinstance(key, str) and len(key) >= SHORTEST_HIDDEN]
        _hide_in_chain(error, hidden)  # the cause of the error given, or re-raised as is
        if isinstance(error, ProviderError):  # raised by the adapter itself: goes on as is
            return None
        mapped = classify(error)
        if mapped is not None:
            _hide_in_chain(mapped, hidden)
        return mapped

    return map_error


_HEAD = "littleghost.head"
"""The request extension ``noting_heads`` keeps its answer's head in."""


async def _note_head(response: Any) -> None:
    """Keeps on its request the status and ``x-should-retry`` of ``response``'s head,
    when they speak for the whole answer: an error status, or an answer that is not an
    event stream (sent once generated). A stream's success head is sent before the answer
    is generated: it says nothing of what fails after, and clears what an earlier head of
    the request (a redirect's, which shares its extensions) said."""
    streamed = response.headers.get("content-type", "").startswith("text/event-stream")
    extensions = response.request.extensions
    if response.status_code >= 400 or not streamed:
        extensions[_HEAD] = (response.status_code, should_retry(response.headers))
    else:
        extensions.pop(_HEAD, None)


_TO_GET = (301, 302, 303)
"""The redirects after which an HTTP client sends a POST again as a GET."""
_KEEPING = (307, 308)
"""The redirects after which an HTTP client sends a POST again as it was."""


class _Redirected(Exception):
    """A POST's redirect not followed (``_refuse_redirect``): its status, and the host
    and port it leads to (``None`` when unreadable)."""

    def __init__(self, status: int, where: str | None) -> None:
        super().__init__(status, where)
        self.status = status
        self.where = where


async def _refuse_redirect(response: Any) -> None:
    """Raises ``_Redirected`` for a POST's redirect that would go wrong if followed: one
    the HTTP client follows with a GET without the body (a gateway's sign-in page,
    ``http://`` to ``https://`` with a 301), which no API answers (a page came back as
    garbled JSON or a stream cut off, asked for again and again); or one to another
    server (``_same_server``), which would be sent the prompt and the client's headers,
    a key in one of its own (``api-key``, a gateway's) too."""
    location = response.headers.get("location")
    status = response.status_code
    if status not in _TO_GET + _KEEPING or not location or response.request.method != "POST":
        return
    try:
        target = response.request.url.join(location)
    except Exception:  # a Location the HTTP library cannot read: no place to name
        raise _Redirected(status, None) from None
    if status in _TO_GET or not _same_server(response.request.url, target):
        raise _Redirected(status, _address(target))


def _same_server(url: Any, target: Any) -> bool:
    """Whether ``target`` (an HTTP library's URL) is on the server of ``url``: its scheme,
    host and port, or the same host over ``https://`` (on the schemes' own ports)."""
    if (target.scheme, target.host, target.port) == (url.scheme, url.host, url.port):
        return True
    return (url.scheme, target.scheme, url.host, url.port, target.port) == (
        "http",
        "https",
        target.host,
        None,
        None,
    )


def _address(url: object) -> str | None:
    """``host:port`` of ``url``; never credentials, path or query."""
    host, port = server_of(url)
    if host is None:
        return None
    shown = f"[{host}]" if ":" in host else host  # an IPv6 address
    return shown if port is None else f"{shown}:{port}"


def _redirected(provider: str, redirect: _Redirected) -> InvalidRequestError:
    """The error of a request ``_refuse_redirect`` stopped (not retried)."""
    where = f" to {redirect.where}" if redirect.where else ""
    why = (
        "which would send it to another server, the prompt and the client's headers with it"
        if redirect.status in _KEEPING
        else "which would send it again as a GET without its body (a gateway's sign-in "
        "page, or http:// to https://?)"
    )
    return InvalidRequestError(
        f"{provider}: the server redirected the request (HTTP {redirect.status}){where}, "
        f"{why}: set base_url to the API's own URL",
        status=redirect.status,
        code="redirected",
        provider=provider,
    )


_HOOKS = (_refuse_redirect, _note_head, keep_answer)
"""The response hooks ``noting_heads`` adds, in order."""


def noting_heads(client: Any) -> Any:
    """``client`` (an SDK's), its HTTP client keeping each answer's head on its request
    (``_note_head``) for the error of a body that then fails to arrive, and refusing a
    redirect that turns the POST into a GET or leads to another server
    (``_refuse_redirect``), and keeping the answer for ``answer_or_events``
    (``keep_answer``): hooks added to the HTTP client, once (a client given is shared
    with its copies); first, before the user's own hooks, which may read the body."""
    hooks = getattr(getattr(client, "_client", None), "event_hooks", None)
    if isinstance(hooks, dict):
        response = hooks.setdefault("response", [])
        for place, hook in enumerate(_HOOKS):
            if hook not in response:
                response.insert(place, hook)
    return client


def made_noting_heads(make: Callable[[], Any]) -> Callable[[], Any]:
    """``make``, its clients ``noting_heads``."""
    return lambda: noting_heads(make())


def _server_named(error: BaseException) -> str | None:
    """``host:port`` of the request of ``error`` (an SDK's or the HTTP library's), for an
    error that says where it could not connect; never credentials, path or query."""
    try:
        request = getattr(error, "request", None)
    except RuntimeError:  # the HTTP library's error without a request
        return None
    return _address(getattr(request, "url", None))


def _noted_head(error: BaseException) -> tuple[int, bool | None] | None:
    """The head ``noting_heads`` kept on the request of ``error`` (an SDK's or the HTTP
    library's), else ``None``."""
    try:
        request = getattr(error, "request", None)
    except RuntimeError:  # the HTTP library's error without a request
        return None
    head = getattr(request, "extensions", {}).get(_HEAD)
    return head if isinstance(head, tuple) else None


_PROXY_ANSWER = re.compile(r"(\d{3})\b ?(.{0,80})")
"""The status and reason a proxy answered a ``CONNECT`` with, as the HTTP library's
``ProxyError`` says them (``407 Proxy Authentication Required``)."""


def _refused_connection(
    provider: str, error: BaseException, proxy_errors: tuple[type[BaseException], ...]
) -> ProviderError | None:
    """The error of a connection that cannot be made as things stand, for ``error`` (an
    SDK's or the HTTP library's), else ``None``: a server certificate that is not trusted
    (a private CA, a self-signed one), not retried; a proxy that refused the tunnel to the
    server (``HTTPS_PROXY``), retried only when it answered with a 5xx. Neither shows more
    of a URL than the server's host and port: a proxy's URL may hold its password."""
    server = _server_named(error)
    at = f" at {server}" if server else ""
    for cause in chain(error):
        if isinstance(cause, ssl.SSLCertVerificationError):
            why = cause.verify_message or cause.reason or "not verified"
            return ProviderError(
                f"{provider}: the server's TLS certificate{at} is not trusted ({why}): "
                "trust its CA with SSL_CERT_FILE, or give the model a client that does",
                code="untrusted_certificate",
                provider=provider,
            )
        answer = _PROXY_ANSWER.match(str(cause)) if isinstance(cause, proxy_errors) else None
        if answer is not None:
            status = int(answer[1])
            said = f"HTTP {status} {answer[2]}".strip()
            if status >= 500:
                return ProviderUnavailableError(
                    f"{provider}: the proxy could not connect to the server{at} ({said})",
                    status=status,
                    code="proxy_error",
                    provider=provider,
                )
            hint = ": give HTTPS_PROXY its user and password" if status == 407 else ""
            return InvalidRequestError(
                f"{provider}: the proxy refused to connect to the server{at} ({said}){hint}",
                status=status,
                code="proxy_error",
                provider=provider,
            )
    return None


def _classifier(
    sdk: Any, base: type[Exception], provider: str
) -> Callable[[Exception], ProviderError | None]:
    """``error_mapper``'s mapping, before keys are hidden."""
    http_errors, timeouts, unconnected, pooled = transport_errors()
    proxy_errors = tuple(kind for kind in unconnected if kind.__name__ == "ProxyError")

    def lost(error: BaseException | None) -> bool:
        """Whether ``error``, the HTTP library's, came once a connection was made."""
        return isinstance(error, http_errors) and not isinstance(error, unconnected)

    def map_error(error: Exception) -> ProviderError | None:
        if isinstance(error, sdk.APIStatusError):
            return classify_error(
                provider=provider,
                status=error.status_code,
                body=error.body,
                headers=error.response.headers,
                message=error.message,
            )
        redirect = error if isinstance(error, _Redirected) else error.__cause__
        if isinstance(redirect, _Redirected):  # raised by a hook: the SDK's, as its cause
            return _redirected(provider, redirect)
        if isinstance(error, sdk.APITimeoutError):
            waited = isinstance(error.__cause__, pooled)  # the SDK's, from the library's
            return transport_error(provider, timeout=True, head=_noted_head(error), pooled=waited)
        if isinstance(error, (sdk.APIConnectionError, *http_errors)):
            refused = _refused_connection(provider, error, proxy_errors)
            if refused is not None:
                return refused
        if isinstance(error, sdk.APIConnectionError):  # the HTTP library's error its cause
            return transport_error(
                provider,
                timeout=False,
                lost=lost(error.__cause__),
                head=_noted_head(error),
                server=_server_named(error),
            )
        if isinstance(error, sdk.APIError):
            return classify_error(provider=provider, body=error.body, message=error.message)
        if isinstance(error, http_errors):
            return transport_error(
                provider,
                timeout=isinstance(error, timeouts),
                pooled=isinstance(error, pooled),
                lost=lost(error),
                head=_noted_head(error),
                server=_server_named(error),
            )
        if isinstance(error, (json.JSONDecodeError, UnicodeDecodeError)):  # JSON is UTF-8
            return not_json(provider)
        if isinstance(error, RecursionError):  # json.loads of a body nested past its limit
            return ProviderError(
                f"{provider}: the answer nests deeper than this process reads",
                code="nested_too_deep",
                provider=provider,
            )
        if too_long(error):
            return ProviderError(  # json.loads of the body: an int past the digit limit
                f"{provider}: the answer holds an integer of more than {digits_limit()} "
                "digits, more than this process reads (sys.set_int_max_str_digits)",
                code="integer_too_long",
                provider=provider,
            )
        if isinstance(error, base):
            return ProviderError(
                f"{provider}: the SDK failed ({type(error).__name__})", provider=provider
            )
        return None

    return map_error


@contextmanager
def provider_errors(mapped: Callable[[Exception], ProviderError | None]) -> Iterator[None]:
    """Raises what the block raises as the ``ProviderError`` ``mapped`` (an
    ``error_mapper``'s function) gives for it, from it; an exception it gives none for
    goes on as it is."""
    try:
        yield
    except Exception as error:
        provider_error = mapped(error)
        if provider_error is None:
            raise
        raise provider_error from error


@contextmanager
def billed_so_far(used: Callable[[], Usage]) -> Iterator[None]:
    """What ``used()`` says the call had reported when anything leaves the block (a
    stream's counts that came before it broke, was cut or closed: billed all the same),
    unless that is nothing: reported to the call (``report_usage``), a cancellation's
    too, and given to a ``ProviderError`` or ``ProtocolError`` (a bad event) without a
    ``usage``."""
    try:
        yield
    except BaseException as error:
        reported = used()
        if reported != Usage():
            report_usage(reported)
            if isinstance(error, (ProviderError, ProtocolError)) and error.usage is None:
                error.usage = reported
        raise


def not_json(provider: str) -> ProviderUnavailableError:
    """The exception for an answer whose body is not JSON: garbled, cut short, or a page
    (a proxy's HTML error page, sent with a 200, which the SDK hands back as text)."""
    return ProviderUnavailableError(
        f"{provider}: the answer's body is not valid JSON (garbled or cut short)",
        code="invalid_json",
        provider=provider,
    )


def _whole(data: str) -> bool:
    """True when an event's ``data`` is whole: ``[DONE]``, or JSON this process reads (not
    nested past its parser's depth)."""
    if data.strip() == "[DONE]":
        return True
    try:
        answer_json(data)
    except (ValueError, RecursionError):
        return False
    return True


def stream_cut_off(provider: str) -> ProviderUnavailableError:
    """The exception for a stream that ended before its last event: cut off on the way, or
    not a stream at all (a proxy that answered with one JSON body)."""
    return ProviderUnavailableError(
        f"{provider}: the stream ended before the answer was complete",
        code="incomplete_stream",
        provider=provider,
    )


def check_answer_whole(provider: str, reason: object, arguments: Iterable[object]) -> None:
    """Raise for an unstreamed answer that says it was cut: no finish ``reason``, and a
    tool call's ``arguments`` not a whole JSON object (a gateway that gathered a stream its
    upstream cut).

    Raises:
        ProviderUnavailableError: It was cut (``code`` ``incomplete_answer``; retried).
    """
    if not reason and not all(map(whole_arguments, arguments)):
        raise ProviderUnavailableError(
            f"{provider}: the answer came without its finish reason and with a tool call cut off",
            code="incomplete_answer",
            provider=provider,
        )


_LINE_END = re.compile(rb"\r\n|\r|\n")
"""What ends a line of server-sent events."""
_FIELDS = frozenset({"event", "data", "error"})
"""The fields of an event ``sse_events`` reads."""
_BYTE_ORDER_MARK = "\ufeff"
"""What a body of events may begin with, not part of its first line (as the format says)."""


class _Sent(enum.Enum):
    WHOLE_ANSWER = "a whole answer"


WHOLE_ANSWER = _Sent.WHOLE_ANSWER
"""What ``sse_events`` gives as the name of the one event it makes of a body of JSON sent
in place of events (a server or proxy that ignored ``stream``): no event a server sends
is named so."""


def answered_whole(response: ModelResponse) -> Iterator[ModelStreamEvent]:
    """The events of a stream whose answer came whole (``WHOLE_ANSWER``): a chunk per
    part of its message (its reasoning, text, each tool call), then its ``StreamDone``."""
    for part in response.message.content:
        if isinstance(part, ReasoningPart) and part.text:
            yield ReasoningChunk(part.text)
        elif isinstance(part, TextPart) and part.text:
            yield TextChunk(part.text)
        elif isinstance(part, ToolCall):
            yield ToolCallChunk()
    yield StreamDone(response)


_EVENT_LINE = re.compile(r"^(?:data|event|error):", re.MULTILINE)
"""A line of a field of an event, as a body of events has (an HTML page, none)."""


class SentEvents:
    """A body of events an answer not streamed came as (a server or proxy that streams
    whatever it is asked), to read as a stream's (``sse_events``): the HTTP response's
    part of it."""

    def __init__(self, body: str) -> None:
        self._body = body.encode()

    async def aiter_bytes(self) -> AsyncGenerator[bytes, None]:
        yield self._body

    async def aclose(self) -> None:
        """Nothing to close: the body was read."""


def sent_events(answer: object) -> SentEvents | None:
    """The events an answer not streamed came as, when the SDK gave it as text (a body
    that is not JSON) holding an event's field; else ``None``."""
    if isinstance(answer, str) and _EVENT_LINE.search(answer.lstrip(_BYTE_ORDER_MARK)):
        return SentEvents(answer)
    return None


async def answer_or_events(answer: Awaitable[Any]) -> Any:
    """What ``answer``, an SDK call not streamed, gives; the body's text when the SDK
    could not parse it as the JSON it was labelled and it holds events (``sent_events``:
    a server or proxy that streams whatever it is asked, and labels it JSON), as the SDK
    gives a body labelled otherwise that is not JSON; the body's JSON, read by
    ``answer_json``, when the SDK could not read an int in it of more digits than Python
    reads (a usage count's: no count)."""
    with keeping_answers() as kept:
        try:
            return await answer
        except json.JSONDecodeError as error:
            if sent_events(error.doc) is None:
                raise
            return error.doc
        except ValueError as error:
            if not (too_long(error) and kept):
                raise
            return answer_json(kept[-1].content)


async def streamed_answer(
    provider: str, events: AsyncGenerator[ModelStreamEvent, None]
) -> ModelResponse:
    """The response a provider's stream of ``events`` ends with (closed once it came).

    Raises:
        ProviderUnavailableError: It ended without one (``stream_cut_off``).
    """
    async with aclosing(events):
        async for event in events:
            if isinstance(event, StreamDone):
                return event.response
    raise stream_cut_off(provider)  # a provider's stream raises that itself first


_ANSWERS = frozenset({"choices", "content"})
"""The fields that hold a whole answer's message (a chat completion's, a Messages one's)."""


def _sent_answer(provider: str, body: bytes) -> str | None:
    """The JSON a body sent in place of events holds (a whole answer, from a server or
    proxy that does not stream), as text; ``None`` for a body that is no JSON. An object
    that reports an error and holds no answer (``choices``, ``content``) is raised as that
    error; one with an answer is read as it is not streamed, as the answer."""
    try:
        text = body.decode("utf-8-sig")  # a byte order mark is no part of JSON's text
        sent = answer_json(text)
    except ValueError:  # not UTF-8, not JSON (an integer too long, too: no error's)
        return None
    if isinstance(sent, dict) and sent.get("error") and not _ANSWERS.intersection(sent):
        raise classify_error(provider=provider, body=sent)
    return text


async def sse_events(
    response: Any, provider: str, *, whole: Callable[[], bool] = lambda: False
) -> AsyncGenerator[tuple[str | _Sent | None, str], None]:
    """The ``(event, data)`` pairs of a server-sent-events HTTP response body, its lines
    ended by CRLF, LF or CR alone and a byte order mark before the first ignored (as the
    format says); an ``error:`` line is an ``error`` event. An event that carries nothing
    is not given (``_carries``).

    A body that ends inside an event was cut off: ``stream_cut_off(provider)`` is raised,
    unless that last event is whole but for its blank line or line ending (its data is
    JSON, or ``[DONE]``; an ``error`` event's is any text): it is given, and the provider
    tells from it whether the answer ended; so it is when the connection is lost there,
    whose error is raised after it unless it ended the answer. Once ``whole()`` says the
    events given hold the whole answer (its finish reason came), the body's end is near
    and tells nothing more: a connection lost or gone silent then (the HTTP library's
    error), or an event cut off, ends the events as the body's end does, so a billed,
    complete answer is not asked for again. Reads ``response.aiter_bytes()`` and closes
    it, also when the caller stops early, so no reader is left for the garbage collector
    (which trio reports).

    A body of JSON in place of events (a server or proxy that ignored ``stream``) is
    given as one event named ``WHOLE_ANSWER``, its data the JSON, for the provider to
    read as an answer not streamed; or, when it reports an error (a gateway's, sent with
    a 200, as to a request not streamed), raised, classified.
    """
    buffer = bytearray()  # the line begun, only split again once a line ending came
    held = False  # the buffer ends with CR, whose LF may come in the next chunk
    event: str | None = None
    data: list[str] = []
    sent: bytearray | None = bytearray()  # the body, until a field of an event came
    first = True  # the body's first line: a byte order mark before it is not its text
    lost: BaseException | None = None  # the connection, lost once the events given were read
    async with aclosing(response.aiter_bytes()) as chunks:
        try:
            async for chunk in chunks:
                if sent is not None:
                    sent += chunk
                buffer += chunk
                if not (held or b"\n" in chunk or b"\r" in chunk):
                    continue
                held = buffer.endswith(b"\r")
                *lines, rest = _LINE_END.split(buffer[:-1] if held else buffer)
                buffer = bytearray(rest + b"\r" if held else rest)
                for raw in lines:
                    line = raw.decode("utf-8", "replace")
                    if first:
                        line, first = line.removeprefix(_BYTE_ORDER_MARK), False
                    if not line:
                        given = "\n".join(data)
                        if data and _carries(event, given, whole):
                            yield event, given
                        event, data = None, []
                        continue
                    name, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if name in _FIELDS:
                        sent = None  # events, not a body of JSON
                    if name == "event":
                        event = value
                    elif name == "data":
                        data.append(value)
                    elif name == "error":  # as older llama.cpp servers send errors
                        event = "error"
                        data.append(value)
        except transport_errors()[0] as error:
            if not whole():
                last, cut = _pending(buffer, data, event, first)
                if last is None or cut:
                    raise
                lost = error  # right after an event whole but for its blank line
            else:
                _log_kept(provider, error)
    answer = None if sent is None else _sent_answer(provider, bytes(sent))
    if answer is not None:
        yield WHOLE_ANSWER, answer
        return
    last, cut = _pending(buffer, data, event, first)
    if cut and not whole():
        raise stream_cut_off(provider)
    if last is not None:  # a last event without its blank line: whether the answer
        yield last  # ended, it tells
    if lost is not None:
        if not whole():
            raise lost
        _log_kept(provider, lost)


def _carries(event: str | None, data: str, whole: Callable[[], bool]) -> bool:
    """Whether an event is one to give: an error event; else one whose data is not blank
    (a proxy's keep-alive, ``data:`` alone), nor, once the answer is whole, not JSON or
    ``[DONE]`` (a proxy's ``data: keep-alive`` after it, or JSON nested deeper than this
    process reads: the answer is kept, billed)."""
    if event == "error":
        return True
    return bool(data.strip()) and (not whole() or _whole(data))  # parsed only past the end


@contextmanager
def past_the_end(provider: str, whole: bool) -> Iterator[None]:
    """Passes over a ``ProtocolError`` the block raises reading an event (one of the wrong
    shape: not an object, without its ``type``) when ``whole``: the answer came whole
    before it (a proxy's event after its end), and is kept, billed. An error the event
    reports (a ``ProviderError``) still fails the call."""
    try:
        yield
    except ProtocolError:
        if not whole:
            raise
        logger.info(
            "%s: an event of the wrong shape after the whole answer is passed over", provider
        )


def _pending(
    buffer: bytearray, data: list[str], event: str | None, first: bool
) -> tuple[tuple[str | None, str] | None, bool]:
    """What a body of events that ends with ``buffer`` unread (a partial line, or a whole
    one without its line ending) and ``data`` lines not given leaves: its last event,
    when whole but for its blank line or line ending (its data JSON or ``[DONE]``; an
    ``error`` event's any text), and whether anything was cut off."""
    data = list(data)
    cut = False
    if buffer.strip():
        line = buffer.rstrip(b"\r").decode("utf-8", "replace")
        name, _, value = (line.removeprefix(_BYTE_ORDER_MARK) if first else line).partition(":")
        value = value[1:] if value.startswith(" ") else value
        if name == "data" and _whole(value):
            data.append(value)
        else:
            cut = True
    last = "\n".join(data)
    if data and (event == "error" or _whole(last)):
        return (event, last), cut
    return None, cut or bool(data)  # cut between its data lines


def _log_kept(provider: str, error: BaseException) -> None:
    logger.info(
        "%s: the connection was lost (%s) after the answer was whole; it is kept",
        provider,
        type(error).__name__,
    )
