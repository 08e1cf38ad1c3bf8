"""The one classifier of provider errors, shared by every provider.

A provider hands over what it got (HTTP status, JSON body, headers, message) and gets
back the littleghost exception to raise: structured codes first
(``context_length_exceeded``, ``exceed_context_size_error``), then the known message
forms of OpenAI, Anthropic, Bedrock, Gemini, vLLM, OpenRouter, Mistral, xAI, Hugging
Face TGI and llama.cpp → ``ContextWindowOverflowError``; 429 → ``RateLimitError`` with
``retry_after`` from the headers (unless waiting cannot help: a single request over the
per-minute limit, or an exhausted quota); 5xx and 408 → ``ProviderUnavailableError``;
any other 4xx → ``InvalidRequestError``. Without an HTTP error status (an error sent in
a stream), a numeric ``code`` in the body stands for it. A rate-limit message that
mentions tokens is never an overflow. An ``x-should-retry: true|false`` header is kept as
the error's ``should_retry``, which the retry policy obeys over the type.
"""

from __future__ import annotations

import email.utils
import math
import re
import time
from collections.abc import Iterator, Mapping
from typing import Any

from littleghost._validators import MAX_TOKEN_COUNT, is_token_count
from littleghost.errors import (
    ContextWindowOverflowError,
    InvalidRequestError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.models.base import ModelResponse, StopReason

__all__ = [
    "MAX_DETAIL_CHARS",
    "SCANNED_CHARS",
    "check_window_room",
    "classify_error",
    "is_overflow_message",
    "retry_after_seconds",
    "should_retry",
    "transport_error",
]

MAX_DETAIL_CHARS = 300
"""How much of a provider's own error message an exception message keeps."""
SCANNED_CHARS = 2_000
"""How much of a provider's error message is read for its kind, its figures and its
wait: the known forms are short, and the time the patterns take grows faster than the
text (a message that quotes a long request would hold the event loop for minutes)."""

_OVERFLOW_CODES = frozenset(
    {
        "context_length_exceeded",
        "exceed_context_size_error",
        "context_window_exceeded",
        "model_context_window_exceeded",
    }
)
_RATE_LIMIT_CODES = frozenset(
    {
        "rate_limit_exceeded",
        "rate_limit_error",
        "resource_exhausted",
        "throttlingexception",
        "too_many_requests",
    }
)
_UNAVAILABLE_CODES = frozenset(
    {
        "overloaded_error",
        "api_error",
        "server_error",
        "internal_server_error",
        "internal",
        "unavailable",
        "service_unavailable",
        "timeout_error",
        "serviceunavailableexception",
        "modelnotreadyexception",
    }
)
_QUOTA_CODES = frozenset({"insufficient_quota", "billing_error"})
_INVALID_CODES = frozenset(
    {
        "invalid_request_error",
        "invalid_argument",
        "validation",
        "authentication_error",  # Anthropic's error types, also sent in a stream's events
        "permission_error",
        "not_found_error",
        "request_too_large",
    }
)

_OVERFLOW_MESSAGES = re.compile(
    "|".join(
        (
            r"maximum context length",  # OpenAI, vLLM, OpenRouter, Groq, DeepSeek
            r"context[ _]length[ _]exceeded",
            r"exceeds? the context window",  # OpenAI (Responses), generic
            r"input tokens exceed the configured limit",  # OpenAI (gpt-5)
            r"prompt is too long",  # Anthropic, Bedrock (Claude)
            r"prompt too long",  # Ollama
            r"input length and `?max_tokens`? exceed context limit",  # Anthropic
            r"exceeds the maximum number of tokens",  # Gemini
            r"input is too long",  # Bedrock
            r"too many input tokens",  # Bedrock (Titan)
            r"exceeds? the available context size",  # llama.cpp
            r"input is too large to process",  # llama.cpp (older)
            r"longer than the maximum model length",  # vLLM
            r"context length is only \d+ tokens",  # vLLM (renderer length checks)
            r"`?inputs`? tokens \+ `?max_new_tokens`? must be <=",  # TGI (total tokens)
            r"`?inputs`? must have less than \d+ tokens",  # TGI (max input tokens)
            r"too large for model with \d+ maximum context length",  # Mistral
            r"maximum prompt length is \d+",  # xAI
            r"is longer than the model'?s context length",  # Together
        )
    ),
    re.IGNORECASE,
)
_RATE_LIMIT_MESSAGES = re.compile(
    r"rate.?limit|per min|per day|\bTPM\b|\bRPM\b|throttl|too many requests|quota",
    re.IGNORECASE,
)
_REQUEST_TOO_LARGE = re.compile(
    r"request too large.*?limit\s+([\d,]+).*?requested\s+([\d,]+)", re.I | re.S
)

_NO_MEDIA = re.compile(r"\b(image|audio) input is not supported\b", re.I)
"""llama.cpp's refusal of an image or audio its model cannot take (no ``mmproj``), sent
as a 500: no retry can help."""

_N = r"([\d,]+)"
# (pattern, group of the prompt size, group of the window); 0 when the message lacks it.
_SIZES: tuple[tuple[re.Pattern[str], int, int], ...] = tuple(
    (re.compile(pattern, re.IGNORECASE | re.DOTALL), prompt, window)
    for pattern, prompt, window in (
        (rf"request \({_N} tokens\) exceeds the available context size \({_N} tokens\)", 1, 2),
        (rf"prompt is too long: {_N} tokens > {_N}", 1, 2),
        (rf"exceed context limit: {_N} \+ {_N} > {_N}", 1, 3),
        (
            rf"input token count \(?{_N}\)? exceeds the maximum number of tokens allowed \(?{_N}",
            1,
            2,
        ),
        (rf"prompt \(length {_N}\) is longer than the maximum model length of {_N}", 1, 2),
        (
            rf"inputs`? tokens \+ `?max_new_tokens`? must be <= {_N}\. Given: {_N} `?inputs",
            2,
            1,
        ),
        (rf"inputs`? must have less than {_N} tokens\. Given: {_N}", 2, 1),
        (rf"you passed {_N} input tokens", 1, 0),
        (rf"prompt contains (?:at least )?{_N} input tokens", 1, 0),
        (rf"context length is only {_N} tokens", 0, 1),
        (rf"prompt contains {_N} tokens.*?too large for model with {_N} maximum", 1, 2),
        (rf"maximum prompt length is {_N} but the request contains {_N}", 2, 1),
        (rf"max input tokens: {_N}, request input token count: {_N}", 2, 1),
        (rf"input \({_N} tokens\) is longer than the model'?s context length \({_N}", 1, 2),
        (rf"{_N} tokens from the input messages", 1, 0),  # SGLang
        (rf"maximum context length of {_N} tokens", 0, 1),  # SGLang
        (rf"\({_N} in the messages", 1, 0),
        (rf"{_N} of text input", 1, 0),
        (rf"request has {_N} input tokens", 1, 0),
        (rf"messages resulted in {_N} tokens", 1, 0),
        (rf"requested (?:about )?{_N} tokens", 1, 0),
        (rf"maximum context length is {_N}", 0, 1),
        (rf"configured limit of {_N} tokens", 0, 1),
    )
)
_SUMMED = tuple(
    re.compile(pattern, re.IGNORECASE)
    for pattern in (
        rf"\({_N} in the messages, {_N} in the functions",  # OpenAI, with tool schemas
        rf"{_N} of text input, {_N} of tool input",  # OpenRouter
    )
)
"""Prompt sizes an error gives in parts: the prompt is their sum."""
_TIME = r"(\d+(?:\.\d+)?)\s*(ms|h|m|s)"
_TRY_AGAIN = re.compile(rf"try again in ((?:{_TIME})+)\b", re.IGNORECASE)
_SECONDS = {"ms": 0.001, "h": 3600.0, "m": 60.0, "s": 1.0}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)s$")
_RETRY_AFTER = re.compile(r"retry after (\d+(?:\.\d+)?) seconds?\b", re.IGNORECASE)  # Azure
_DURATIONS = re.compile(rf"(?:{_TIME})+", re.IGNORECASE)
_LIMITS = ("requests", "tokens")  # OpenAI's x-ratelimit-reset-* headers


def _mappings(body: object) -> Iterator[Mapping[str, Any]]:
    """The body and the error objects nested in it (``error``, ``details``, list items)."""
    if isinstance(body, list):
        for item in body[:4]:
            yield from _mappings(item)
        return
    if not isinstance(body, Mapping):
        return
    yield body
    for key in ("error", "details"):
        yield from _mappings(body.get(key))


def _codes(body: object) -> list[str]:
    """The body's error codes and types, the most specific (innermost) first."""
    codes: list[str] = []
    for mapping in reversed(list(_mappings(body))):
        for key in ("error_code", "code", "type", "__type", "status", "error_type"):
            value = mapping.get(key)
            if isinstance(value, str) and value and value != "error":
                code = value.rsplit("#", 1)[-1].lower()
                if code not in codes:
                    codes.append(code)
    return codes


def _body_message(body: object) -> str | None:
    for mapping in _mappings(body):
        for key in ("message", "error", "detail"):
            value = mapping.get(key)
            if isinstance(value, str) and value:
                return value
    return None


def _error_text(body: object, message: str | None) -> str:
    """The provider's message: the body's, else the SDK's; a body that is a string (TGI's
    ``error``, which the ``openai`` SDK hands over alone, or a page that is not JSON) is
    added to the SDK's message unless that already holds it."""
    found = _body_message(body)
    if found:
        return found
    sent = body.strip() if isinstance(body, str) else ""
    if not sent or (message and sent in message):
        return message or ""
    return f"{message}: {sent}" if message else sent


def _body_int(body: object, key: str) -> int | None:
    for mapping in _mappings(body):
        value = mapping.get(key)
        if is_token_count(value):
            return value
    return None


def _count(*texts: str) -> int | None:
    """What the numbers ``texts`` write (commas between their thousands) add up to, if a
    count of tokens (``is_token_count``): a server's 400-digit figure is none."""
    numbers = [text.replace(",", "") for text in texts]
    if not all(0 < len(number) <= len(str(MAX_TOKEN_COUNT)) for number in numbers):
        return None
    total = sum(map(int, numbers))
    return total if is_token_count(total) else None


def _sizes(message: str) -> tuple[int | None, int | None]:
    prompt: int | None = None
    window: int | None = None
    for parts in _SUMMED:
        found = parts.search(message)
        if found is not None:
            prompt = _count(*found.groups())
            break
    for pattern, prompt_group, window_group in _SIZES:
        found = pattern.search(message)
        if found is None:
            continue
        if prompt is None and prompt_group:
            prompt = _count(found.group(prompt_group))
        if window is None and window_group:
            window = _count(found.group(window_group))
        if prompt is not None and window is not None:
            break
    return prompt, window


def is_overflow_message(message: str) -> bool:
    """True when ``message`` is one of the known forms of a context-window overflow
    (and not a rate-limit message that happens to mention tokens)."""
    return bool(_OVERFLOW_MESSAGES.search(message)) and not _RATE_LIMIT_MESSAGES.search(message)


def _header(headers: Mapping[str, str] | None, name: str) -> str | None:
    if not headers:
        return None
    value = headers.get(name)
    if value is None:
        for key, candidate in headers.items():
            if key.lower() == name:
                return candidate
    return value


def retry_after_seconds(
    headers: Mapping[str, str] | None, *, body: object = None, message: str = ""
) -> float | None:
    """Seconds the provider asked to wait: ``retry-after-ms``, ``retry-after`` (seconds or
    an HTTP date), then a Gemini ``retryDelay`` or a "try again in 2s" (or ``20ms``,
    ``6m0s``, ``1h2m3s``) in the message, else OpenAI's ``x-ratelimit-reset-requests``
    or ``-tokens`` of a limit used up (its ``x-ratelimit-remaining-*`` at 0; the longer
    when both are). A header sent twice (which the HTTP library joins with commas, as some
    proxies send it) gives its longest wait. A wait past what a float holds (a figure of
    hundreds of digits) is none."""
    seconds = _asked_wait(headers, body, message)
    return seconds if seconds is None or math.isfinite(seconds) else None


def _asked_wait(headers: Mapping[str, str] | None, body: object, message: str) -> float | None:
    delays = (_delay(value) for value in _listed(headers, "retry-after-ms"))
    milliseconds = max((delay for delay in delays if delay is not None), default=None)
    if milliseconds is not None:
        return milliseconds / 1000
    seconds = max(_waits(_header(headers, "retry-after")), default=None)
    if seconds is not None:
        return seconds
    for mapping in _mappings(body):
        delay = mapping.get("retryDelay")
        if isinstance(delay, str) and (found := _DURATION.match(delay)):
            return float(found.group(1))
    found = _TRY_AGAIN.search(message)
    if found is not None:
        return _seconds(found.group(1))
    found = _RETRY_AFTER.search(message)
    if found is not None:
        return float(found.group(1))
    resets = [
        _seconds(reset)
        for kind in _LIMITS
        if "0" in _listed(headers, f"x-ratelimit-remaining-{kind}")  # the limit hit
        for reset in _listed(headers, f"x-ratelimit-reset-{kind}")
    ]
    return max((reset for reset in resets if reset is not None), default=None)


def _listed(headers: Mapping[str, str] | None, name: str) -> list[str]:
    """The values of a header, each of the lines it came in (which the HTTP library joins
    with commas) and of a list a proxy joined so."""
    value = _header(headers, name)
    return [] if value is None else [piece.strip() for piece in value.split(",")]


def _delay(text: str) -> float | None:
    """A number of a header (seconds, milliseconds) that is a wait: finite, >= 0."""
    try:
        number = float(text)
    except ValueError:
        return None
    return number if math.isfinite(number) and number >= 0 else None


def _waits(value: str | None) -> Iterator[float]:
    """The waits, in seconds, a ``retry-after`` value gives: each delay and HTTP date of
    it (a header sent twice, its lines joined with commas); a date's own comma joins its
    weekday to the rest (``Wed, 21 Oct 2015 07:28:00 GMT``). What is neither is passed
    over."""
    pieces = [] if value is None else value.split(",")
    at = 0
    while at < len(pieces):
        for taken in (2, 1) if pieces[at].strip().isalpha() else (1,):  # a date's weekday
            wait = _wait(",".join(pieces[at : at + taken]).strip())
            if wait is not None:
                yield wait
                at += taken
                break
        else:
            at += 1


def _wait(text: str) -> float | None:
    """The wait one ``retry-after`` value gives, in seconds: a delay, or the time until
    an HTTP date (0 for one past); ``None`` for anything else."""
    delay = _delay(text)
    if delay is not None:
        return delay
    try:
        when = email.utils.parsedate_to_datetime(text)
    except (TypeError, ValueError, OverflowError):  # OverflowError: a year past C's int
        return None
    return None if when.tzinfo is None else max(0.0, when.timestamp() - time.time())


def should_retry(headers: Mapping[str, str] | None) -> bool | None:
    """The provider's ``x-should-retry`` (``true`` or ``false``; sent twice, the same
    word twice), else ``None``."""
    said = {value.lower() for value in _listed(headers, "x-should-retry")}
    return {"true": True, "false": False}.get(said.pop()) if len(said) == 1 else None


def _seconds(duration: str | None) -> float | None:
    """Seconds in a duration such as ``20ms``, ``6m0s`` or ``1h2m3.5s``; else ``None``."""
    if not duration or not _DURATIONS.fullmatch(duration.strip()):
        return None
    return sum(
        float(amount) * _SECONDS[unit.lower()]
        for amount, unit in re.findall(_TIME, duration, re.IGNORECASE)
    )


def _detail(message: str | None) -> str:
    if not message:
        return ""
    message = " ".join(message.split())
    if len(message) > MAX_DETAIL_CHARS:
        message = message[: MAX_DETAIL_CHARS - 1] + "…"
    return f": {message}"


def _effective_status(status: int | None, codes: set[str], body: object) -> int | None:
    """The HTTP status, else one the body reports (a numeric ``code``, as vLLM, Gemini and
    OpenRouter send in a stream), else one its codes imply."""
    if status is not None and status >= 400:
        return status
    reported = _body_int(body, "code")
    if reported is not None and 400 <= reported < 600:
        return reported
    if codes & _RATE_LIMIT_CODES:
        return 429
    if codes & _UNAVAILABLE_CODES:
        return 503
    if codes & _QUOTA_CODES:
        return 402
    if codes & _INVALID_CODES:
        return 400
    return None


def classify_error(
    *,
    provider: str,
    status: int | None = None,
    body: object = None,
    headers: Mapping[str, str] | None = None,
    message: str | None = None,
) -> ProviderError:
    """The littleghost exception for a provider's error answer.

    Args:
        provider: The provider's name, for the exception's ``provider``.
        status: The HTTP status, when there was one (a mid-stream error event has none,
            or the stream's 200).
        body: The decoded JSON error body: the whole body, or its ``error`` value (an
            object, or a string as TGI sends, which the ``openai`` SDK hands over alone).
        headers: The response headers (for ``retry-after`` and ``x-should-retry``).
        message: The SDK's message, used when the body holds none.

    Returns:
        The exception to raise, with the provider's own message (shortened) in its text.
    """
    found = _codes(body)
    codes = set(found)
    text = _error_text(body, message)
    detail = _detail(text)
    text = text[:SCANNED_CHARS]
    overflow_codes = [code for code in found if code in _OVERFLOW_CODES]
    code = (overflow_codes + found)[0] if found else None
    effective = _effective_status(status, codes, body)
    told = should_retry(headers)
    http = f"HTTP {status}" if status is not None and status >= 400 else "an error"
    rate_limited = effective == 429 or bool(codes & _RATE_LIMIT_CODES)
    if codes & _OVERFLOW_CODES or (not rate_limited and is_overflow_message(text)):
        prompt, window = _sizes(text)
        return ContextWindowOverflowError(
            f"{provider}: the prompt does not fit the model's context window{detail}",
            status=status,
            code=code,
            provider=provider,
            should_retry=told,
            prompt_tokens=_body_int(body, "n_prompt_tokens") or prompt,
            context_window=_body_int(body, "n_ctx") or window,
        )
    if rate_limited:
        if _REQUEST_TOO_LARGE.search(text):
            return InvalidRequestError(
                f"{provider}: the request alone is over the per-minute token limit, so waiting "
                f"cannot help{detail}",
                status=status,
                code=code,
                provider=provider,
                should_retry=told,
            )
        if codes & _QUOTA_CODES:
            return InvalidRequestError(
                f"{provider}: the account's quota is exhausted{detail}",
                status=status,
                code=code,
                provider=provider,
                should_retry=told,
            )
        return RateLimitError(
            f"{provider}: rate limited ({http}){detail}",
            status=status,
            code=code,
            provider=provider,
            retry_after=retry_after_seconds(headers, body=body, message=text),
            should_retry=told,
        )
    media = _NO_MEDIA.search(text)
    if media is not None:
        return InvalidRequestError(
            f"{provider}: the model takes no {media[1].lower()} input{detail}",
            status=status,
            code=code,
            provider=provider,
            should_retry=told,
        )
    if effective is None or effective >= 500 or effective == 408:
        return ProviderUnavailableError(
            f"{provider}: the provider is unavailable ({http}){detail}",
            status=status,
            code=code,
            provider=provider,
            retry_after=retry_after_seconds(headers, body=body),
            should_retry=told,
        )
    if status == 407:  # a proxy's answer (HTTP_PROXY), not the provider's
        return InvalidRequestError(
            f"{provider}: the proxy asks for authentication (HTTP 407): give HTTP_PROXY its "
            f"user and password{detail}",
            status=status,
            code=code,
            provider=provider,
            should_retry=told,
        )
    return InvalidRequestError(
        f"{provider}: the request was rejected ({http}){detail}",
        status=status,
        code=code,
        provider=provider,
        retry_after=retry_after_seconds(headers, body=body) if told else None,
        should_retry=told,
    )


def check_window_room(
    provider: str, response: ModelResponse, cap: int | None, window: int | None
) -> ModelResponse:
    """``response``, unless it said it stopped at its output cap (``length``,
    ``max_tokens``) short of ``cap``, where its prompt and it filled the ``window``: a
    llama.cpp server stops there, and says so, when the prompt left the answer less room
    than its cap (other servers refuse such a request).

    Raises:
        ContextWindowOverflowError: It stopped there; with the prompt's size, the window
            and the answer's usage (billed).
    """
    usage = response.usage
    if (
        response.stop_reason is not StopReason.MAX_TOKENS
        or cap is None
        or window is None
        or usage.output_tokens >= cap
        or usage.input_tokens + usage.output_tokens < window
    ):
        return response
    raise ContextWindowOverflowError(
        f"{provider}: the answer stopped at the model's {window}-token context window, "
        f"{usage.output_tokens} of its {cap} tokens in",
        provider=provider,
        usage=usage,
        prompt_tokens=usage.input_tokens,
        context_window=window,
    )


def transport_error(
    provider: str,
    *,
    timeout: bool,
    lost: bool = False,
    head: tuple[int, bool | None] | None = None,
    server: str | None = None,
    pooled: bool = False,
) -> ProviderUnavailableError:
    """The exception for a request that got no whole answer: a timeout (one ``pooled``:
    spent waiting for a connection of the client's pool, the request never sent), a
    connection that could not be made (``connection_error``, naming the ``server``'s host
    and port when known, never more of its URL), or one ``lost`` once made, before the
    answer was whole (``connection_lost``: reset, or closed early).

    ``head`` is the status and ``x-should-retry`` of the answer's head, when one came
    that speaks for the answer (``noted_head``): an error status is kept as the error's
    ``status``, and the header as its ``should_retry``.
    """
    if timeout and pooled:
        message = (
            "the request timed out waiting for a connection of its HTTP client's pool "
            "(every one in use by other requests; it was never sent)"
        )
        code = "timeout"
    elif timeout:
        message, code = "the request timed out", "timeout"
    elif lost:
        message = "the connection to the provider was lost before the answer was complete"
        code = "connection_lost"
    else:
        message, code = "the request could not reach the provider", "connection_error"
        if server is not None:
            message = f"{message} at {server}"
    status, told = head if head is not None else (None, None)
    if status is not None and status >= 400:
        message = f"{message} (HTTP {status})"
    else:
        status = None
    return ProviderUnavailableError(
        f"{provider}: {message}", status=status, code=code, provider=provider, should_retry=told
    )
