"""The provider error classifier, on the providers' real error bodies and headers."""

from __future__ import annotations

import email.utils
import math
import random
import time

import pytest

from littleghost.errors import (
    ContextWindowOverflowError,
    InvalidRequestError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.models.overflow import (
    MAX_DETAIL_CHARS,
    classify_error,
    is_overflow_message,
    retry_after_seconds,
    transport_error,
)

from .timing import LATE

# (provider, status, body, prompt tokens, window) as the providers send them.
OVERFLOWS = [
    pytest.param(
        "openai",
        400,
        {
            "error": {
                "message": "This model's maximum context length is 128000 tokens. However, your "
                "messages resulted in 130521 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        130521,
        128000,
        id="openai-code",
    ),
    pytest.param(
        "openai",
        400,
        {
            "error": {
                "message": "Input tokens exceed the configured limit of 272000 tokens. Your "
                "messages resulted in 302011 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        302011,
        272000,
        id="openai-gpt-5",
    ),
    pytest.param(
        "openai",
        400,
        {
            "error": {
                "message": "This model's maximum context length is 16385 tokens. However, you "
                "requested 17000 tokens (15000 in the messages, 2000 in the completion). Please "
                "reduce the length of the messages or completion.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": None,
            }
        },
        15000,
        16385,
        id="openai-message",
    ),
    pytest.param(
        "openai",
        400,
        {
            "error": {
                "message": "Your input exceeds the context window of this model. Please adjust "
                "your input and try again.",
                "type": "invalid_request_error",
                "param": "input",
                "code": "context_length_exceeded",
            }
        },
        None,
        None,
        id="openai-responses",
    ),
    pytest.param(
        "anthropic",
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 208310 tokens > 200000 maximum",
            },
            "request_id": "req_011",
        },
        208310,
        200000,
        id="anthropic-prompt-too-long",
    ),
    pytest.param(
        "anthropic",
        400,
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "input length and `max_tokens` exceed context limit: 197434 + 8192 > "
                "200000, decrease input length or `max_tokens` and try again",
            },
        },
        197434,
        200000,
        id="anthropic-with-max-tokens",
    ),
    pytest.param(
        "bedrock",
        400,
        {"message": "Input is too long for requested model."},
        None,
        None,
        id="bedrock",
    ),
    pytest.param(
        "bedrock",
        400,
        {
            "message": "Too many input tokens. Max input tokens: 8192, request input token count: 9001"
        },
        9001,
        8192,
        id="bedrock-titan",
    ),
    pytest.param(
        "gemini",
        400,
        {
            "error": {
                "code": 400,
                "message": "The input token count (1234567) exceeds the maximum number of tokens "
                "allowed (1048576).",
                "status": "INVALID_ARGUMENT",
            }
        },
        1234567,
        1048576,
        id="gemini",
    ),
    pytest.param(
        "gemini",
        400,
        [
            {
                "error": {
                    "code": 400,
                    "message": "The input token count exceeds the maximum number of tokens allowed "
                    "1048576.",
                    "status": "INVALID_ARGUMENT",
                }
            }
        ],
        None,
        None,
        id="gemini-openai-compatible-list",
    ),
    pytest.param(
        "vllm",
        400,
        {
            "object": "error",
            "message": "This model's maximum context length is 4096 tokens. However, you requested "
            "5000 tokens (4500 in the messages, 500 in the completion). Please reduce the length "
            "of the messages or completion.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        },
        4500,
        4096,
        id="vllm",
    ),
    pytest.param(
        "vllm",
        400,
        {
            "error": {
                "message": "'max_tokens' or 'max_completion_tokens' is too large: 1000. This "
                "model's maximum context length is 2048 tokens and your request has 1500 input "
                "tokens (1000 > 2048 - 1500).",
                "type": "BadRequestError",
                "param": None,
                "code": 400,
            }
        },
        1500,
        2048,
        id="vllm-newer",
    ),
    pytest.param(
        "vllm",
        400,
        {
            "object": "error",
            "message": "The decoder prompt (length 5000) is longer than the maximum model length "
            "of 4096. Make sure that `max_model_len` is no smaller than the number of text tokens.",
            "type": "BadRequestError",
            "code": 400,
        },
        5000,
        4096,
        id="vllm-decoder-prompt",
    ),
    pytest.param(
        "vllm",
        400,
        {
            "error": {
                "message": "You passed 9000 input tokens and requested 512 output tokens. However, "
                "the model's context length is only 8192 tokens, resulting in a maximum input "
                "length of 7680 tokens. Please reduce the length of the input prompt.",
                "type": "BadRequestError",
                "param": "input_tokens",
                "code": 400,
            }
        },
        9000,
        8192,
        id="vllm-renderer-tokens",
    ),
    pytest.param(
        "vllm",
        400,
        {
            "error": {
                "message": "You passed 100000 input characters and requested 512 output tokens. "
                "However, the model's context length is only 8192 tokens, resulting in a maximum "
                "input length of 7680 tokens (at most 30720 characters). Please reduce the length "
                "of the input prompt.",
                "type": "BadRequestError",
                "param": "input_text",
                "code": 400,
            }
        },
        None,
        8192,
        id="vllm-renderer-characters",
    ),
    pytest.param(
        "vllm",
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, you "
                "requested 64 output tokens and your prompt contains at least 8129 input tokens, "
                "for a total of at least 8193 tokens. Please reduce the length of the input "
                "prompt or the number of requested output tokens.",
                "type": "BadRequestError",
                "param": "input_tokens",
                "code": 400,
            }
        },
        8129,
        8192,
        id="vllm-prompt-and-output",
    ),
    pytest.param(
        "tgi",
        422,
        {
            "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
            "Given: 4000 `inputs` tokens and 200 `max_new_tokens`",
            "error_type": "validation",
        },
        4000,
        4096,
        id="tgi-total",
    ),
    pytest.param(
        "tgi",
        422,
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 4096. "
        "Given: 5000 `inputs` tokens and 0 `max_new_tokens`",
        5000,
        4096,
        id="tgi-total-string-body",
    ),
    pytest.param(
        "tgi",
        422,
        {
            "error": "Input validation error: `inputs` must have less than 4095 tokens. "
            "Given: 5000",
            "error_type": "validation",
        },
        5000,
        4095,
        id="tgi-input",
    ),
    pytest.param(
        "tgi",
        None,
        {
            "error": {
                "message": "Input validation error: `inputs` must have less than 4095 tokens. "
                "Given: 5000",
                "http_status_code": 422,
            }
        },
        5000,
        4095,
        id="tgi-openai-error-event",
    ),
    pytest.param(
        "openrouter",
        400,
        {
            "error": {
                "message": "This endpoint's maximum context length is 8192 tokens. However, you "
                "requested about 9000 tokens (8000 of text input, 1000 in the output). Please "
                'reduce the length of either one, or use the "middle-out" transform to compress '
                "your prompt automatically.",
                "code": 400,
                "metadata": {"provider_name": None},
            }
        },
        8000,
        8192,
        id="openrouter",
    ),
    pytest.param(
        "openrouter",
        400,
        {
            "error": {
                "message": "This endpoint's maximum context length is 128000 tokens. However, "
                "you requested about 151000 tokens (120000 of text input, 30000 of tool input, "
                "1000 in the output). Please reduce the length of either one.",
                "code": 400,
            }
        },
        150000,
        128000,
        id="openrouter-tool-input",
    ),
    pytest.param(
        "openai",
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, you "
                "requested 8300 tokens (7000 in the messages, 1200 in the functions, and 100 "
                "in the completion). Please reduce the length of the messages, functions, or "
                "completion.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
        8200,
        8192,
        id="openai-functions",
    ),
    pytest.param(
        "together",
        400,
        {
            "error": {
                "message": "The input (9000 tokens) is longer than the model's context length "
                "(8192 tokens).",
                "type": "invalid_request_error",
            }
        },
        9000,
        8192,
        id="together",
    ),
    pytest.param(
        "sglang",
        400,
        {
            "object": "error",
            "message": "Requested token count exceeds the model's maximum context length of "
            "131072 tokens. You requested a total of 139000 tokens: 139000 tokens from the "
            "input messages and 0 tokens for the completion. Please reduce the number of "
            "tokens in the input messages or the completion to fit within the limit.",
            "type": "BadRequestError",
            "code": 400,
        },
        139000,
        131072,
        id="sglang",
    ),
    pytest.param(
        "mistral",
        400,
        {
            "object": "error",
            "message": "Prompt contains 40000 tokens and 0 draft tokens, too large for model with "
            "32768 maximum context length",
            "type": "invalid_request_error",
            "code": None,
        },
        40000,
        32768,
        id="mistral",
    ),
    pytest.param(
        "xai",
        400,
        {
            "code": "Client specified an invalid argument",
            "error": "This model's maximum prompt length is 131072 but the request contains "
            "140000 tokens.",
        },
        140000,
        131072,
        id="xai",
    ),
    pytest.param(
        "local",
        400,
        {
            "error": {
                "code": 400,
                "type": "exceed_context_size_error",
                "message": "request (530 tokens) exceeds the available context size (512 tokens), "
                "try increasing it",
                "n_prompt_tokens": 530,
                "n_ctx": 512,
            }
        },
        530,
        512,
        id="llama.cpp",
    ),
    pytest.param(
        "local",
        400,
        {"error": {"code": 400, "type": "exceed_context_size_error", "message": "too big"}},
        None,
        None,
        id="llama.cpp-code-only",
    ),
]


@pytest.mark.parametrize(("provider", "status", "body", "prompt", "window"), OVERFLOWS)
def test_known_overflow_forms_are_context_window_overflows(
    provider: str, status: int | None, body: object, prompt: int | None, window: int | None
) -> None:
    error = classify_error(provider=provider, status=status, body=body)
    assert isinstance(error, ContextWindowOverflowError)
    assert (error.prompt_tokens, error.context_window) == (prompt, window)
    assert (error.status, error.provider) == (status, provider)
    assert "context window" in str(error)


def test_the_sdk_message_is_used_when_the_body_has_none() -> None:
    error = classify_error(
        provider="openai",
        status=400,
        body="<html>Bad Request</html>",
        message="This model's maximum context length is 8192 tokens. However, your messages "
        "resulted in 9000 tokens.",
    )
    assert isinstance(error, ContextWindowOverflowError)
    assert (error.prompt_tokens, error.context_window) == (9000, 8192)


def test_an_overflow_code_wins_over_the_status() -> None:
    error = classify_error(
        provider="openai", status=413, body={"code": "context_length_exceeded", "message": "x"}
    )
    assert isinstance(error, ContextWindowOverflowError)
    assert error.code == "context_length_exceeded"


def test_rate_limit_with_retry_after_ms() -> None:
    body = {
        "error": {
            "message": "Rate limit reached for gpt-4o in organization org-abc on tokens per min "
            "(TPM): Limit 30000, Used 28000, Requested 4000. Please try again in 4.2s. Visit "
            "https://platform.openai.com/account/rate-limits to learn more.",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    error = classify_error(
        provider="openai", status=429, body=body, headers={"retry-after-ms": "1500"}
    )
    assert type(error) is RateLimitError
    assert error.retry_after == 1.5
    assert error.code == "rate_limit_exceeded"


@pytest.mark.parametrize(
    ("status", "repeated", "kind"),
    [
        (429, "request too large, limit 1 " * 600, RateLimitError),
        (400, "prompt contains 1 tokens " * 8_000, ContextWindowOverflowError),
    ],
    ids=["16 kB rate limit", "200 kB overflow"],
)
def test_a_long_error_message_is_classified_at_once(
    status: int, repeated: str, kind: type[ProviderError]
) -> None:
    """A message that repeats a phrase a pattern starts on (as one that quotes a request
    can): the patterns took time that grows faster than the text, in C, holding the event
    loop (here some 20 s each) where no deadline can stop them. They read the message's
    first ``SCANNED_CHARS``; its figures are read there."""
    message = "maximum context length is 4096 tokens. " + repeated
    started = time.perf_counter()
    error = classify_error(provider="p", status=status, body={"error": {"message": message}})
    assert time.perf_counter() - started < LATE
    assert type(error) is kind
    if isinstance(error, ContextWindowOverflowError):
        assert error.context_window == 4096


def test_a_rate_limit_that_mentions_tokens_is_not_an_overflow() -> None:
    body = {
        "type": "error",
        "error": {
            "type": "rate_limit_error",
            "message": "This request would exceed the rate limit for your organization of 40,000 "
            "input tokens per minute; the prompt is too long for the remaining budget.",
        },
    }
    error = classify_error(
        provider="anthropic", status=429, body=body, headers={"retry-after": "17"}
    )
    assert type(error) is RateLimitError
    assert error.retry_after == 17.0


@pytest.mark.parametrize(
    "text",
    [
        "Input validation error: `max_new_tokens` must be <= 2048. Given: 4000",
        "Input validation error: `temperature` must be strictly positive",
        "Input validation error: `stop` supports up to 4 stop sequences. Given: 6",
    ],
)
def test_other_tgi_validation_errors_are_not_overflows(text: str) -> None:
    """Only TGI's prompt-length checks are overflows; its other validation errors are
    rejected requests."""
    error = classify_error(
        provider="tgi", status=422, body={"error": text, "error_type": "validation"}
    )
    assert type(error) is InvalidRequestError
    assert error.code == "validation"


def test_a_throttling_message_about_tokens_is_not_an_overflow() -> None:
    error = classify_error(
        provider="bedrock",
        status=400,
        body={"message": "Too many tokens per minute, please wait before trying again."},
    )
    assert type(error) is InvalidRequestError
    assert not is_overflow_message("Rate limit: the input is too long for your tokens per minute")


def test_a_request_over_the_per_minute_limit_is_not_retried() -> None:
    body = {
        "error": {
            "message": "Request too large for gpt-4o in organization org-abc on tokens per min "
            "(TPM): Limit 30000, Requested 45000. The input or output tokens must be reduced in "
            "order to run successfully.",
            "type": "tokens",
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    error = classify_error(provider="openai", status=429, body=body, headers={"retry-after": "1"})
    assert type(error) is InvalidRequestError
    assert error.status == 429
    assert "waiting cannot help" in str(error)


def test_an_exhausted_quota_is_not_retried() -> None:
    body = {
        "error": {
            "message": "You exceeded your current quota, please check your plan and billing details.",
            "type": "insufficient_quota",
            "param": None,
            "code": "insufficient_quota",
        }
    }
    error = classify_error(provider="openai", status=429, body=body)
    assert type(error) is InvalidRequestError


def test_gemini_retry_delay_is_read_from_the_details() -> None:
    body = {
        "error": {
            "code": 429,
            "message": "Resource has been exhausted (e.g. check quota).",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "31s"},
            ],
        }
    }
    error = classify_error(provider="gemini", status=429, body=body)
    assert type(error) is RateLimitError
    assert error.retry_after == 31.0


RESETS = {"x-ratelimit-reset-requests": "1s", "x-ratelimit-reset-tokens": "6m0s"}


@pytest.mark.parametrize(
    ("headers", "message", "expected"),
    [
        ({"retry-after-ms": "250"}, "", 0.25),
        ({"Retry-After": "12"}, "", 12.0),
        ({"retry-after": "0.5"}, "", 0.5),
        ({"retry-after": "soon"}, "", None),
        ({"retry-after": "Wed, 01 Jan 99999999999 10:00:00 GMT"}, "", None),
        ({}, "Please try again in 20ms.", 0.02),
        ({}, "Please try again in 3s.", 3.0),
        ({}, "Please try again in 6m0s.", 360.0),
        ({}, "Please try again in 1h2m3.5s.", 3723.5),
        ({}, "Please try again in 2m.", 120.0),
        ({}, "Rate limit is exceeded. Please retry after 6 seconds.", 6.0),  # Azure
        ({}, "Try again later.", None),
        (None, "", None),
        # OpenAI's limit headers, once nothing above gives a time: the reset of the limit
        # used up (a tokens bucket's full refill is not waited for when requests ran out)
        ({**RESETS, "x-ratelimit-remaining-requests": "0"}, "", 1.0),
        ({**RESETS, "x-ratelimit-remaining-tokens": "0"}, "", 360.0),
        (
            {**RESETS, "x-ratelimit-remaining-requests": "0", "x-ratelimit-remaining-tokens": "0"},
            "",
            360.0,
        ),
        (RESETS, "", None),
        ({"X-RateLimit-Reset-Tokens": "20ms", "X-RateLimit-Remaining-Tokens": "0"}, "", 0.02),
        ({**RESETS, "x-ratelimit-remaining-tokens": "0"}, "Please try again in 3s.", 3.0),
        ({**RESETS, "x-ratelimit-remaining-tokens": "0", "retry-after": "2"}, "", 2.0),
        ({"x-ratelimit-reset-requests": "1 hour", "x-ratelimit-remaining-requests": "0"}, "", None),
    ],
)
def test_retry_after_forms(
    headers: dict[str, str] | None, message: str, expected: float | None
) -> None:
    assert retry_after_seconds(headers, message=message) == expected


def test_a_wait_past_what_a_float_holds_is_none_in_every_form() -> None:
    """A wait in the message, a ``retryDelay`` or a reset header is read as a float: a
    figure of hundreds of digits is none (as such a ``retry-after`` header is), not an
    infinite wait; one of fewer digits is read as it is."""
    digits = random.Random(3)
    for _ in range(200):
        figure = str(digits.randint(1, 9)) + "9" * digits.choice([0, 3, 100, 309, 400])
        forms = [
            ({}, None, f"Please try again in {figure}s."),
            ({}, None, f"Please try again in {figure}h{figure}m0s."),
            ({}, None, f"Rate limit is exceeded. Please retry after {figure} seconds."),
            ({}, {"error": {"details": [{"retryDelay": f"{figure}s"}]}}, ""),
            (
                {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": f"{figure}s"},
                None,
                "",
            ),
            ({"retry-after": figure}, None, ""),
        ]
        for headers, body, message in forms:
            error = classify_error(
                provider="openai", status=429, body=body, message=message, headers=headers
            )
            assert type(error) is RateLimitError
            wait = error.retry_after
            assert wait is None or math.isfinite(wait), (figure, headers, body, message)
            assert (wait is None) == (len(figure) > 300), (figure, headers, body, message)


def test_retry_after_as_an_http_date() -> None:
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    seconds = retry_after_seconds({"retry-after": when})
    assert seconds is not None
    assert 27 <= seconds <= 31


@pytest.mark.parametrize(
    ("status", "body", "kind"),
    [
        (
            500,
            {"error": {"message": "The server had an error", "type": "server_error"}},
            ProviderUnavailableError,
        ),
        (503, {"error": {"message": "Service Unavailable"}}, ProviderUnavailableError),
        (
            529,
            {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            ProviderUnavailableError,
        ),
        (408, {"message": "Request Timeout"}, ProviderUnavailableError),
        (
            401,
            {
                "error": {
                    "message": "Incorrect API key provided",
                    "type": "invalid_request_error",
                    "code": "invalid_api_key",
                }
            },
            InvalidRequestError,
        ),
        (
            404,
            {"error": {"message": "The model `gpt-9` does not exist", "code": "model_not_found"}},
            InvalidRequestError,
        ),
        (
            413,
            {
                "type": "error",
                "error": {
                    "type": "request_too_large",
                    "message": "Request exceeds the maximum allowed number of bytes.",
                },
            },
            InvalidRequestError,
        ),
        (422, {"detail": [{"msg": "field required"}]}, InvalidRequestError),
    ],
)
def test_status_classes(status: int, body: object, kind: type[ProviderError]) -> None:
    error = classify_error(provider="p", status=status, body=body)
    assert type(error) is kind
    assert error.status == status


def test_errors_in_a_stream_are_classified_by_their_type() -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    assert type(classify_error(provider="anthropic", status=200, body=overloaded)) is (
        ProviderUnavailableError
    )
    limited = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert type(classify_error(provider="anthropic", status=200, body=limited)) is RateLimitError
    invalid = {"error": {"type": "invalid_request_error", "message": "bad"}}
    assert type(classify_error(provider="openai", body=invalid)) is InvalidRequestError
    assert type(classify_error(provider="openai", body=None, message="boom")) is (
        ProviderUnavailableError
    )


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (
            {"error": {"message": "Invalid grammar", "type": "BadRequestError", "code": 400}},
            InvalidRequestError,
        ),
        ({"message": "slow down", "code": 429}, RateLimitError),
        ({"error": {"message": "upstream failed", "code": 502}}, ProviderUnavailableError),
        ({"error": "Input validation error: bad", "error_type": "validation"}, InvalidRequestError),
        ({"error": {"message": "not a status", "code": 12}}, ProviderUnavailableError),
    ],
)
def test_a_numeric_code_in_a_body_without_a_status_is_its_status(
    body: object, kind: type[ProviderError]
) -> None:
    error = classify_error(provider="vllm", body=body)
    assert type(error) is kind
    assert error.status is None


def test_the_provider_message_is_kept_short() -> None:
    error = classify_error(provider="p", status=400, body={"error": {"message": "x" * 5000}})
    assert len(str(error)) < MAX_DETAIL_CHARS + 100


def test_transport_errors_are_transient() -> None:
    timeout = transport_error("openai", timeout=True)
    refused = transport_error("openai", timeout=False)
    assert type(timeout) is ProviderUnavailableError
    assert type(refused) is ProviderUnavailableError
    assert "timed out" in str(timeout)
    assert timeout.provider == refused.provider == "openai"
