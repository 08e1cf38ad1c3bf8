"""Runs under a virtual clock (trio's ``MockClock`` jumping whenever every task waits):
retry waits, deadlines and sessions of the default store take virtual time, not real."""

from __future__ import annotations

import time

import anyio
import pytest
from trio.testing import MockClock

from littleghost import Agent
from littleghost.errors import DeadlineExceededError, ProviderUnavailableError, RateLimitError
from littleghost.testing import ScriptedModel, text_response

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
