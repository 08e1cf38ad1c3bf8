"""The exceptions littleghost raises.

Every exception takes its message as the first positional argument; other fields are
keyword-only with defaults. The tree::

    LittleGhostError
    ├── ConfigurationError (also ValueError)   a declaration or argument is wrong
    ├── ProviderError                          a model provider answered with an error
    │   ├── RateLimitError                     429: retried after ``retry_after``
    │   ├── ProviderUnavailableError           5xx, timeout, connection: retried
    │   ├── ContextWindowOverflowError         the prompt is over the window: never retried
    │   └── InvalidRequestError                any other 4xx: not retried
    ├── OutputLimitError                       the answer stopped at ``max_tokens``
    ├── ProtocolError                          a reply or script broke the expected shape
    ├── DeadlineExceededError (also TimeoutError)
    ├── CleanupError                           resources did not shut down cleanly
    ├── LimitExceededError                     ``max_turns`` or ``max_tool_calls`` overrun
    ├── PromptBudgetError                      a request's mandatory part is over its budget
    ├── CompactionError                        a conversation could not be compacted
    ├── OutputValidationError                  the answer did not fit ``output_type``
    ├── StreamStateError (also RuntimeError)   a stream was used out of order
    └── SessionStoreError                      a session store failed
        ├── CorruptSessionStoreError           not a littleghost store, or damaged
        ├── SchemaVersionError                 written by a newer littleghost
        ├── UnknownSessionError (also KeyError)  no session with that id
        ├── SessionBusyError                   another run holds the session
        └── UnstorableValueError (also TypeError)  a value the store cannot keep

A provider's ``x-should-retry`` header (``ProviderError.should_retry``) overrides the
retried/not retried of the type, but for an overflow.

Cancellation is never wrapped: anyio's native cancellation exception propagates as is.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from littleghost.models import ModelResponse, Usage

__all__ = [
    "CleanupError",
    "CompactionError",
    "ConfigurationError",
    "ContextWindowOverflowError",
    "CorruptSessionStoreError",
    "DeadlineExceededError",
    "InvalidRequestError",
    "LimitExceededError",
    "LittleGhostError",
    "OutputLimitError",
    "OutputValidationError",
    "PromptBudgetError",
    "ProtocolError",
    "ProviderError",
    "ProviderUnavailableError",
    "RateLimitError",
    "SchemaVersionError",
    "SessionBusyError",
    "SessionStoreError",
    "StreamStateError",
    "UnknownSessionError",
    "UnstorableValueError",
]


class LittleGhostError(Exception):
    """The root of every error littleghost raises.

    Attributes:
        run_usage: What the run this error ended had used, as ``RunResult.usage`` would
            have said (for billing a failed run), once it leaves ``run()``, ``run_sync()``
            or a stream; ``None`` for an error no run raised.
    """

    run_usage: Usage | None = None


class ConfigurationError(LittleGhostError, ValueError):
    """A declaration, constructor argument or environment setting is invalid."""


class ProviderError(LittleGhostError):
    """A model provider answered with an error.

    The message holds the provider's own error message, whitespace collapsed and cut to
    ``MAX_DETAIL_CHARS`` (300) characters (:mod:`littleghost.models.overflow`); a server
    that quotes the request (vLLM's validation errors do) puts prompt text there.
    ``__cause__`` is the exception the SDK or the HTTP library raised, when one did; for an
    error answer its text is the whole response body, which a traceback
    (``logging.exception``) shows.

    Args:
        message: What went wrong, with the provider's message, shortened.
        status: The HTTP status, when there was one.
        code: The provider's error code or type, when it sent one.
        provider: The provider's name (``openai``, ``anthropic``, ...).
        retry_after: Seconds the provider asked to wait before retrying.
        usage: What the failed call used, when the provider reported it (an answer that
            stopped at the context window is billed): a run counts it.
        should_retry: The provider's own word on whether the request may be retried (its
            ``x-should-retry: true|false`` header), when it gave one: it decides over the
            error's type whether the call is retried (never for an overflow).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        provider: str | None = None,
        retry_after: float | None = None,
        usage: Usage | None = None,
        should_retry: bool | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.provider = provider
        self.retry_after = retry_after
        self.usage = usage
        self.should_retry = should_retry


class RateLimitError(ProviderError):
    """The provider is rate limiting; the call is retried after ``retry_after``, unless
    the provider said not to (``should_retry``)."""


class ProviderUnavailableError(ProviderError):
    """The provider is overloaded, down or unreachable; the call is retried, unless the
    provider said not to (``should_retry``)."""


class ContextWindowOverflowError(ProviderError):
    """The prompt does not fit the model's context window. Never retried as is.

    Args:
        prompt_tokens: The prompt size the provider reported, when it did.
        context_window: The window the provider reported, when it did.

    Raises:
        TypeError: A figure is not an int from 0 to 2**63-1 or None (0 is none reported).
    """

    def __init__(
        self,
        message: str,
        *,
        status: int | None = None,
        code: str | None = None,
        provider: str | None = None,
        retry_after: float | None = None,
        usage: Usage | None = None,
        should_retry: bool | None = None,
        prompt_tokens: int | None = None,
        context_window: int | None = None,
    ) -> None:
        super().__init__(
            message,
            status=status,
            code=code,
            provider=provider,
            retry_after=retry_after,
            usage=usage,
            should_retry=should_retry,
        )
        self.prompt_tokens = _figure("prompt_tokens", prompt_tokens)
        self.context_window = _figure("context_window", context_window)


def _figure(name: str, value: int | None) -> int | None:
    """A ``ContextWindowOverflowError``'s figure as given (``None`` for 0, none reported).

    Raises:
        TypeError: It is not ``None`` or an int from 0 to 2**63-1.
    """
    from littleghost._validators import (  # here: that module imports this one
        TOKEN_COUNT,
        is_int,
        is_token_count,
        safe_repr,
    )

    if value is None or (is_int(value) and value == 0):
        return None
    if not is_token_count(value):
        raise TypeError(
            f"ContextWindowOverflowError: {name} must be {TOKEN_COUNT}, 0 or None, "
            f"not {safe_repr(value)}"
        )
    return value


class InvalidRequestError(ProviderError):
    """The provider rejected the request (a 4xx other than rate limits and overflow);
    not retried, unless the provider said it may be (``should_retry``: a 409 lock
    timeout, say)."""


class OutputLimitError(LittleGhostError):
    """The model stopped at its output limit before completing its answer.

    Args:
        response: The cut-off ``ModelResponse``.
    """

    def __init__(self, message: str, *, response: ModelResponse | None = None) -> None:
        super().__init__(message)
        self.response = response


class ProtocolError(LittleGhostError):
    """A reply, a script or a history broke the shape littleghost expects.

    Args:
        message: What broke the shape, never the content.
        usage: What the call whose answer broke it had used, when the provider reported
            it before (a stream's counts that came before a bad event: billed all the
            same): a run counts it, as a ``ProviderError``'s.
    """

    def __init__(self, message: str, *, usage: Usage | None = None) -> None:
        super().__init__(message)
        self.usage = usage


class DeadlineExceededError(LittleGhostError, TimeoutError):
    """The run's deadline passed, or a wait would pass it.

    Args:
        deadline: That deadline (``anyio.current_time()`` units), when known.
    """

    def __init__(self, message: str, *, deadline: float | None = None) -> None:
        super().__init__(message)
        self.deadline = deadline


class CleanupError(LittleGhostError):
    """Resources did not shut down cleanly; always propagates."""


class LimitExceededError(LittleGhostError):
    """The run went past ``max_turns`` or ``max_tool_calls``, or was started inside
    32 runs nested in each other (an agent whose tool runs it again).

    Args:
        limit: The name of the limit (``max_turns``, ``max_tool_calls`` or
            ``nested_runs``).
        value: The limit's value.
    """

    def __init__(self, message: str, *, limit: str | None = None, value: int | None = None) -> None:
        super().__init__(message)
        self.limit = limit
        self.value = value


class PromptBudgetError(LittleGhostError):
    """The instructions, tools and current turn alone are over the prompt budget.

    Args:
        limit: The view's token limit.
        required: The estimated tokens of the mandatory part.
    """

    def __init__(
        self, message: str, *, limit: int | None = None, required: int | None = None
    ) -> None:
        super().__init__(message)
        self.limit = limit
        self.required = required


class SessionStoreError(LittleGhostError):
    """A session store could not do what was asked; nothing stored was changed, unless
    the message says a write may have been stored (its connection lost while committing).

    Args:
        session_id: The session concerned, when there is one.
    """

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


@contextmanager
def naming_session(session_id: str | None) -> Iterator[None]:
    """Make a ``SessionStoreError`` raised inside that names no session name
    ``session_id``, the session the work inside was for."""
    try:
        yield
    except SessionStoreError as error:
        if error.session_id is None:
            error.session_id = session_id
        raise


class CorruptSessionStoreError(SessionStoreError):
    """The store's file or tables are damaged or were not written by littleghost."""


class SchemaVersionError(SessionStoreError):
    """The store was written by a newer littleghost with a schema this one cannot read."""


class UnknownSessionError(SessionStoreError, KeyError):
    """No session has that id."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class SessionBusyError(SessionStoreError):
    """Another run holds the session and waiting for it was not possible."""


class UnstorableValueError(SessionStoreError, TypeError):
    """A message holds a value the store cannot keep (metadata must be JSON-like)."""


class CompactionError(LittleGhostError):
    """A conversation could not be compacted; the message says why (nothing old enough
    to compact, no summary request that fits, a result no smaller than the request).

    When overflow recovery fails, it is the ``__cause__`` of the provider's
    ``ContextWindowOverflowError``.
    """


class OutputValidationError(LittleGhostError):
    """The model's final answer did not fit the run's ``output_type``, even after the one
    repair turn that showed it what was wrong (or with no turn left for it, or at once
    when the provider filtered the answer or the model refused).

    Args:
        raw: The answer as the model gave it: its text, or the final-result tool's
            arguments as JSON.
        errors: What did not fit, as the model was told.
        response: The ``ModelResponse`` that carried the answer.
    """

    def __init__(
        self,
        message: str,
        *,
        raw: str = "",
        errors: tuple[str, ...] = (),
        response: ModelResponse | None = None,
    ) -> None:
        super().__init__(message)
        self.raw = raw
        self.errors = errors
        self.response = response


class StreamStateError(LittleGhostError, RuntimeError):
    """A stream was used out of order (its result read before the run completed, ...)."""


UNSWALLOWED = (DeadlineExceededError, CleanupError, SessionStoreError)
"""Errors an optional step that may fail quietly (a compaction, a prompt count) always lets
through, as it does cancellation (not an ``Exception``)."""
