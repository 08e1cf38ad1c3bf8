"""The retry policy, checked on random sequences of provider errors and answers: the
attempts, the waits, the deadline, and what usage, events and spans say of each one."""

from __future__ import annotations

import itertools
import random
from typing import Any

import anyio
import attrs
import pytest

from littleghost import Agent
from littleghost.errors import (
    ContextWindowOverflowError,
    DeadlineExceededError,
    InvalidRequestError,
    LittleGhostError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.events import ModelCallRetried
from littleghost.models import ModelRequest, ModelResponse, Usage
from littleghost.testing import ScriptedModel, text_response

from .conftest import Spans

pytestmark = pytest.mark.anyio


class Plain(Agent):
    instructions = "Answer."


@attrs.define
class Attempt:
    """A scripted attempt: what it gives (``outcome``) after ``took`` seconds, and when
    it was called (``at``, once it was)."""

    outcome: ProviderError | ModelResponse
    took: float
    at: float | None = None
    text: str = attrs.field(default=attrs.Factory(lambda self: str(self.outcome), takes_self=True))
    """The error's message as made, before the call that it ends says so."""

    async def __call__(self, request: ModelRequest) -> ModelResponse:
        self.at = anyio.current_time()
        await anyio.sleep(self.took)
        if isinstance(self.outcome, ProviderError):
            raise self.outcome
        return self.outcome


def random_attempt(rng: random.Random) -> Attempt:
    kind = rng.choice(["ok", "rate", "rate", "down", "down", "overflow", "invalid"])
    outcome: ProviderError | ModelResponse
    if kind == "ok":
        outcome = text_response("ok", input_tokens=3)
    elif kind == "rate":
        retry_after = rng.choice([None, 0.5, 3.0, 20.0, 400.0])
        outcome = RateLimitError("slow down", status=429, retry_after=retry_after)
    elif kind == "down":
        outcome = ProviderUnavailableError("down", status=503)
    elif kind == "overflow":
        outcome = ContextWindowOverflowError("too long", status=400)
    else:
        outcome = InvalidRequestError("locked", status=409)
    if isinstance(outcome, ProviderError):
        outcome.usage = rng.choice([None, Usage(5, 1)])
        if rng.random() < 0.3:
            outcome.should_retry = rng.choice([True, False])
    return Attempt(outcome, rng.choice([0.0, 0.0, 0.5, 4.0]))


def wanted(error: ProviderError | ModelResponse) -> bool:
    """Whether the docs say ``error``'s kind is retried (whatever the wait it asks for)."""
    if isinstance(error, ContextWindowOverflowError) or not isinstance(error, ProviderError):
        return False
    transient = isinstance(error, (RateLimitError, ProviderUnavailableError))
    return transient if error.should_retry is None else error.should_retry


def retried(error: ProviderError | ModelResponse) -> bool:
    """Whether the docs say ``error`` is retried (within the retries and deadline)."""
    return wanted(error) and (getattr(error, "retry_after", None) or 0) <= 300


def ending(error: ProviderError, text: str, attempts: int, max_retries: int) -> str:
    """The message the docs give ``error`` (made with ``text``) as it ends a call of
    ``attempts`` attempts: how it ended it, and why when the wait it asks was too long."""
    too_long = wanted(error) and not retried(error)
    if attempts == 1 and not (too_long and max_retries):
        return text
    if retried(error):
        told = f"given up after {attempts} attempts"
    else:
        told = "not retried" if attempts == 1 else f"on attempt {attempts}, not retried"
    if too_long:
        told += f": it asks for a wait of {error.retry_after:g} s, longer than the 300 s "
        told += "littleghost waits"
    return f"{text} ({told})"


@pytest.mark.virtual_clock
@pytest.mark.parametrize("seed", range(40))
async def test_retries_keep_to_the_policy(
    seed: int, spans: Spans, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each wait is the full-jitter backoff of its attempt, ``retry_after`` its floor;
    a call ends at its answer, an error not retried, its last retry, or at once with
    ``DeadlineExceededError`` when the wait would pass the deadline; each attempt is a
    span, counted once in usage, and each retry one ``ModelCallRetried``; the error that
    ends it says how (and why, for a wait too long or past the deadline)."""
    rng = random.Random(seed)
    drawn: list[tuple[float, float, float]] = []

    def uniform(low: float, high: float) -> float:
        drawn.append((low, high, rng.uniform(low, high)))
        return drawn[-1][2]

    monkeypatch.setattr(random, "uniform", uniform)
    attempts = [random_attempt(rng) for _ in range(rng.randint(1, 6))]
    attempts.append(Attempt(text_response("ok", input_tokens=3), 0.0))
    max_retries = rng.randint(0, 4)
    timeout = rng.choice([None, 1.0, 5.0, 30.0, 100.0])
    agent = Plain(model=ScriptedModel(attempts), max_retries=max_retries)
    start = anyio.current_time()
    deadline = None if timeout is None else start + timeout
    events: list[Any] = []
    outcome: Any
    try:
        async with agent.stream("hi", timeout=timeout) as stream:
            async for event in stream:
                events.append(event)
        outcome = stream.result
    except ProviderError as error:  # DeadlineExceededError is none
        outcome = error
    except DeadlineExceededError as error:
        outcome = error
    end = anyio.current_time()
    made = [attempt for attempt in attempts if attempt.at is not None]
    for number, (attempt, after) in enumerate(itertools.pairwise(made), start=1):
        assert retried(attempt.outcome) and number <= max_retries
        low, high, jitter = drawn[number - 1]
        assert (low, high) == (0, min(30, 0.5 * 2 ** (number - 1)))
        floor = getattr(attempt.outcome, "retry_after", None) or 0
        assert attempt.at is not None and after.at is not None
        waited = after.at - (attempt.at + attempt.took)
        assert waited == pytest.approx(max(floor, jitter))
    last = made[-1]
    assert last.at is not None
    if isinstance(outcome, DeadlineExceededError):
        assert deadline is not None
        if outcome.__cause__ is None:  # the deadline cut the last attempt
            assert end == pytest.approx(deadline) and last.at + last.took > deadline
        else:  # its wait would pass the deadline: at once
            assert outcome.__cause__ is last.outcome and retried(last.outcome)
            assert len(made) <= max_retries and end == pytest.approx(last.at + last.took)
            wait = max(last.outcome.retry_after or 0, drawn[len(made) - 1][2])
            assert wait >= deadline - end
            kind = type(last.outcome).__name__
            message = str(outcome)  # a one-line log of it tells the wait and the cause
            assert message.startswith(
                f"the run's deadline leaves no time to retry after {kind} (a wait of "
                f"{wait:.3g} s, with "
            )
            assert message.endswith(f" s left): {last.text}")
    elif isinstance(outcome, ProviderError):
        assert outcome is last.outcome
        assert not retried(outcome) or len(made) == max_retries + 1
        assert str(outcome) == ending(outcome, last.text, len(made), max_retries)
    else:
        assert not isinstance(last.outcome, ProviderError)
    if not isinstance(outcome, DeadlineExceededError) or outcome.__cause__ is not None:
        billed = [a.outcome.usage for a in made if isinstance(a.outcome, ProviderError)]
        answered = 0 if isinstance(outcome, LittleGhostError) else 3
        used = outcome.run_usage if isinstance(outcome, LittleGhostError) else outcome.usage
        assert used is not None
        assert used.input_tokens == answered + sum(u.input_tokens for u in billed if u is not None)
    told = [event.attempt for event in events if isinstance(event, ModelCallRetried)]
    assert told == list(range(1, len(made)))
    assert len(spans.named("chat")) == len(made)
