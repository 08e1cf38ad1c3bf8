"""Runs under a virtual clock (trio's ``MockClock`` jumping whenever every task waits):
retry waits, deadlines and sessions of the default store take virtual time, not real."""

from __future__ import annotations

import itertools
import random
import time

import anyio
import pytest
from trio.testing import MockClock

from littleghost import Agent
from littleghost.errors import DeadlineExceededError, ProviderUnavailableError, RateLimitError
from littleghost.models import ModelRequest, ModelResponse
from littleghost.testing import ScriptedModel, Step, text_response

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> tuple[str, dict[str, object]]:
    return "trio", {"clock": MockClock(autojump_threshold=0)}


class Support(Agent):
    pass


async def test_retry_waits_take_virtual_time() -> None:
    """Backoffs and a provider's retry_after are waited on the event loop's clock."""
    model = ScriptedModel(
        [
            RateLimitError("slow down", retry_after=20),
            ProviderUnavailableError("overloaded"),
            text_response("hello"),
        ]
    )
    begin, real = anyio.current_time(), time.perf_counter()
    result = await Support(model=model).run("hi", timeout=60)
    assert result.output == "hello"
    assert anyio.current_time() - begin >= 20
    assert time.perf_counter() - real < 10  # real seconds: far fewer than the 20 waited


async def test_a_retry_past_the_deadline_is_refused_at_once() -> None:
    model = ScriptedModel([RateLimitError("slow down", retry_after=20), text_response("late")])
    with pytest.raises(DeadlineExceededError):
        await Support(model=model).run("hi", timeout=10)
    assert anyio.current_time() < 10


async def test_session_runs_of_the_default_store_with_a_timeout() -> None:
    """The in-memory store loads a short session without a worker thread: the clock jumped
    over that thread's work to the run's deadline, before the model was asked."""
    agent = Support(model=ScriptedModel([text_response("one"), text_response("two")]))
    await agent.run("hi", session_id="s", timeout=30)
    second = await agent.run("again", session_id="s", timeout=30)
    assert second.output == "two" and len(second.messages) == 4
    assert anyio.current_time() < 30


def attempts_at(times: list[float], steps: list[Exception | ModelResponse]) -> list[Step]:
    """``steps``, each noting the (virtual) time it was called."""

    def timed(step: Exception | ModelResponse) -> Step:
        def play(request: ModelRequest) -> ModelResponse:
            times.append(anyio.current_time())
            if isinstance(step, Exception):
                raise step
            return step

        return play

    return [timed(step) for step in steps]


def gaps(times: list[float]) -> list[float]:
    return [later - earlier for earlier, later in itertools.pairwise(times)]


@pytest.mark.parametrize("jitter", ["widest", "none"])
async def test_each_retry_waits_the_backoff_of_its_attempt_number(
    jitter: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Full jitter: the wait after attempt n is drawn from [0, 0.5 s × 2^(n-1)], at most
    30 s; a retry_after is a floor. With the draw at its top, and at its bottom."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high if jitter == "widest" else low)
    errors: list[Exception | ModelResponse] = [ProviderUnavailableError("down")] * 7
    times: list[float] = []
    model = ScriptedModel(attempts_at(times, [*errors, text_response("up")]))
    result = await Support(model=model, max_retries=7).run("hi")
    assert result.output == "up"
    expected = [0.5, 1, 2, 4, 8, 16, 30] if jitter == "widest" else [0] * 7
    assert gaps(times) == pytest.approx(expected)

    floor = 3.0
    errors = [RateLimitError("slow down", retry_after=floor)] * 4
    times.clear()
    model = ScriptedModel(attempts_at(times, [*errors, text_response("up")]))
    assert (await Support(model=model, max_retries=4).run("hi")).output == "up"
    expected = [3, 3, 3, 4] if jitter == "widest" else [3] * 4
    assert gaps(times) == pytest.approx(expected)


async def test_a_call_makes_max_retries_plus_one_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    """The default three retries: the fourth transient error is raised as it is, its
    deadline further off than any wait."""
    monkeypatch.setattr(random, "uniform", lambda low, high: high)
    for failures, answered in ((3, True), (4, False)):
        errors: list[Exception | ModelResponse] = [
            ProviderUnavailableError(f"down {n}") for n in range(1, failures + 1)
        ]
        model = ScriptedModel([*errors, text_response("up")])
        if answered:
            assert (await Support(model=model).run("hi", timeout=60)).output == "up"
        else:
            with pytest.raises(ProviderUnavailableError, match="down 4"):
                await Support(model=model).run("hi", timeout=60)
        assert len(model.requests) == failures + (1 if answered else 0)


async def test_a_later_retrys_wait_past_the_deadline_fails_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second attempt's wait would pass the deadline: ``DeadlineExceededError`` then,
    from that attempt's error; with no retry left, that error is raised as it is."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    first = RateLimitError("slow down", retry_after=1)
    second = RateLimitError("slower", retry_after=20)
    for max_retries in (3, 1):
        times: list[float] = []
        model = ScriptedModel(attempts_at(times, [first, second, text_response("late")]))
        begin = anyio.current_time()
        expected = DeadlineExceededError if max_retries == 3 else RateLimitError
        with pytest.raises(expected) as caught:
            await Support(model=model, max_retries=max_retries).run("hi", timeout=10)
        assert (caught.value.__cause__ if max_retries == 3 else caught.value) is second
        assert gaps(times) == pytest.approx([1]) and times[0] - begin < 1
        assert anyio.current_time() - begin == pytest.approx(1)
