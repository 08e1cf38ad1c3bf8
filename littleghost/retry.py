"""The retry policy for transient provider errors.

Only ``RateLimitError`` and ``ProviderUnavailableError`` are retried (an allow-list, so
cancellation never is), unless the provider said otherwise: a ``ProviderError`` whose
``should_retry`` (its ``x-should-retry`` header) is set is retried when it is ``True``
and not when ``False``, whatever its type, but for a ``ContextWindowOverflowError`` (the
prompt must change first) and for one a call made inside the call raised first (a
sub-agent's, out of a model of your own that runs one: its run spent its own retries).
Retries use full-jitter exponential backoff; a ``retry_after`` the provider sent is a
floor for the wait, and one over ``MAX_RETRY_AFTER`` is not waited for: the error is
raised at once, saying so. A wait that would pass the run's deadline is not taken:
``DeadlineExceededError`` is raised at once with the provider error as its cause, also
when telling of the retry took the time (a stream's consumer held its event).
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception,
    stop_after_attempt,
    wait_random_exponential,
)
from tenacity.stop import stop_base

from littleghost.errors import (
    ContextWindowOverflowError,
    DeadlineExceededError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.models.base import relayed

__all__ = ["MAX_RETRIES", "RETRYABLE_ERRORS", "call_with_retries"]

T = TypeVar("T")

RETRYABLE_ERRORS = (RateLimitError, ProviderUnavailableError)
MAX_RETRIES = 3
"""Retries after a call's first attempt, unless an agent's ``max_retries`` says otherwise."""
MAX_RETRY_AFTER = 300.0
"""The longest ``retry_after`` waited for, in seconds."""

_backoff = wait_random_exponential(multiplier=0.5, max=30)
_TOLD = "_littleghost_attempts_told"
"""Set on an error whose message says it ended a retried call."""


def _retry_after(error: BaseException | None) -> float:
    """The wait ``error`` asks for, in seconds (0 for none)."""
    retry_after = getattr(error, "retry_after", None)
    return float(retry_after) if isinstance(retry_after, (int, float)) and retry_after > 0 else 0.0


def _wanted(error: BaseException) -> bool:
    """Whether ``error``'s kind is retried (however long a wait it asks for)."""
    if not isinstance(error, ProviderError) or isinstance(error, ContextWindowOverflowError):
        return False
    if relayed(error):  # a sub-agent's run retried it already: not again for each attempt
        return False
    told = error.should_retry
    return isinstance(error, RETRYABLE_ERRORS) if told is None else told


def _retryable(error: BaseException) -> bool:
    return _wanted(error) and _retry_after(error) <= MAX_RETRY_AFTER


def _tell(error: ProviderError, attempts: int) -> None:
    """Say in ``error``'s message how it ended a call of ``attempts`` attempts: after
    retries, and for one not retried for the wait it asks for (once, for an error raised
    again, a script's)."""
    too_long = _wanted(error) and not _retryable(error)
    if not (attempts > 1 or too_long) or not error.args or getattr(error, _TOLD, False):
        return
    setattr(error, _TOLD, True)
    if _retryable(error):
        told = f"given up after {attempts} attempts"
    else:
        told = "not retried" if attempts == 1 else f"on attempt {attempts}, not retried"
    if too_long:
        told += (
            f": it asks for a wait of {_retry_after(error):g} s, longer than the "
            f"{MAX_RETRY_AFTER:g} s littleghost waits"
        )
    error.args = (f"{error.args[0]} ({told})",)


def _wait(state: RetryCallState) -> float:
    error = state.outcome.exception() if state.outcome else None
    return max(_backoff(state), _retry_after(error))


class _StopAtDeadline(stop_base):
    """Stops when the next sleep would reach the run's deadline.

    Only the run's own deadline counts: a caller's cancel scope that expires earlier
    cancels the sleep natively, as any cancellation does.
    """

    def __init__(self, deadline: float | None) -> None:
        self.deadline = deadline
        self.hit = False
        self.why = ""  # the wait and the time left, once hit

    def __call__(self, state: RetryCallState) -> bool:
        return self.leaves_no_time(state.upcoming_sleep)

    def leaves_no_time(self, wait: float) -> bool:
        """True (and ``hit``) when a wait of ``wait`` seconds reaches the deadline."""
        if self.deadline is None or math.isinf(self.deadline):
            return False
        left = self.deadline - anyio.current_time()
        if wait >= left and not self.hit:
            self.hit = True
            self.why = f"a wait of {wait:.3g} s, with {max(left, 0):.3g} s left"
        return self.hit


async def call_with_retries(
    call: Callable[[], Awaitable[T]],
    *,
    max_retries: int,
    deadline: float | None = None,
    on_retry: Callable[[int, BaseException], Awaitable[None]] | None = None,
) -> T:
    """Await ``call()``, retrying transient provider errors up to ``max_retries`` times.

    Args:
        call: Makes one attempt.
        max_retries: Retries after the first attempt.
        deadline: The run's absolute anyio deadline, or ``None``.
        on_retry: Awaited with the attempt number and the error before each retry's wait.

    Raises:
        DeadlineExceededError: The wait before a retry would pass the deadline.
    """
    try:  # most calls succeed at once: the policy is set up only for one that did not
        return await call()
    except ProviderError as error:
        if not _retryable(error):
            if max_retries:  # with none, no error is told (``_retried`` tells none of one)
                _tell(error, 1)
            raise
        failed = error
    # out of the ``except``, so that later attempts' errors do not chain onto the first
    return await _retried(call, failed, max_retries, deadline, on_retry)


async def _retried(
    call: Callable[[], Awaitable[T]],
    failed: BaseException,
    max_retries: int,
    deadline: float | None,
    on_retry: Callable[[int, BaseException], Awaitable[None]] | None,
) -> T:
    """``call_with_retries`` after its first attempt failed with ``failed``: the policy
    is given that attempt as its first, so it numbers, waits and stops as for any."""
    deadline_stop = _StopAtDeadline(deadline)
    first: list[BaseException] = [failed]
    waiting_after: list[BaseException] = []  # the error the coming wait is after

    async def attempt() -> T:
        if first:
            raise first.pop()
        return await call()

    async def before_sleep(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        if error is not None:
            waiting_after[:] = [error]
            if on_retry is not None:
                await on_retry(state.attempt_number, error)

    async def sleep(seconds: float) -> None:
        # checked again: ``on_retry`` took time (a stream's consumer held its event)
        if deadline_stop.leaves_no_time(seconds) and waiting_after:
            raise waiting_after[0]
        await anyio.sleep(seconds)

    retrying = AsyncRetrying(
        retry=retry_if_exception(_retryable),
        wait=_wait,
        stop=stop_after_attempt(max_retries + 1) | deadline_stop,
        before_sleep=before_sleep,
        sleep=sleep,
        reraise=True,
    )
    try:
        return await retrying(attempt)
    except ProviderError as error:
        if deadline_stop.hit:
            raise DeadlineExceededError(
                f"the run's deadline leaves no time to retry after {type(error).__name__} "
                f"({deadline_stop.why}): {error}",
                deadline=deadline,
            ) from error
        _tell(error, retrying.statistics.get("attempt_number", 1))
        raise
