"""A streamed run that fails in a batch of parallel tool calls: every call whose
``ToolCallStarted`` went out and whose result is in the log has its ``ToolCallFinished``
before the stream's error, whatever ended the batch (a hook raising, a tool raising what
is no ``Exception``, a stray cancellation) and whatever order the calls finished in; past
the run's deadline only the error comes (the log holds the rest)."""

from __future__ import annotations

import random

import anyio
import pytest

from littleghost import Agent, RunContext, ToolResult, after_tool, tool
from littleghost.errors import DeadlineExceededError
from littleghost.events import (
    Event,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from littleghost.messages import Message
from littleghost.testing import ScriptedModel, text_response, tool_calls_response

from .faults import stray_cancellation

pytestmark = pytest.mark.anyio

KINDS = ("after_tool raises", "tool exits", "stray cancellation", "deadline")
HANG = 1_000.0
"""Seconds on the virtual clock: the failing call of a deadline's batch never ends."""


class Batch(Agent):
    """Runs ``work`` calls that take the seconds ``delays`` gives; the call numbered
    ``failing`` ends the run as ``kind`` says."""

    def __init__(self, delays: list[float], failing: int, kind: str, **given: object) -> None:
        super().__init__(**given)  # type: ignore[arg-type]
        self.delays, self.failing, self.kind = delays, failing, kind

    @tool
    async def work(self, number: int) -> str:
        """Do some work.

        Args:
            number: Which piece.
        """
        if number == self.failing and self.kind == "deadline":
            await anyio.sleep(HANG)
        await anyio.sleep(self.delays[number])
        if number == self.failing and self.kind == "tool exits":
            raise SystemExit(3)
        return f"done {number}"

    @after_tool
    async def check(self, result: ToolResult, context: RunContext) -> ToolResult:
        if result.content == f"done {self.failing}":
            if self.kind == "after_tool raises":
                raise RuntimeError("the check failed")
            if self.kind == "stray cancellation":
                raise await stray_cancellation()
        return result


def _raised(kind: str) -> type[BaseException] | tuple[type[BaseException], ...]:
    return {
        "after_tool raises": RuntimeError,
        "tool exits": SystemExit,
        "stray cancellation": anyio.get_cancelled_exc_class(),
        "deadline": DeadlineExceededError,
    }[kind]


def check_told(events: list[Event], log: tuple[Message, ...]) -> None:
    """Every started call whose result is in the log has its ``ToolCallFinished``, after
    its ``ToolCallStarted``, holding the logged result, once; each finished call was
    started."""
    logged = {result.call_id: result for message in log for result in message.tool_results}
    started = [i for i, event in enumerate(events) if isinstance(event, ToolCallStarted)]
    finished = {
        event.result.call_id: (i, event.result)
        for i, event in enumerate(events)
        if isinstance(event, ToolCallFinished)
    }
    for at in started:
        call = events[at]
        assert isinstance(call, ToolCallStarted)
        if call.call.id in logged:
            assert call.call.id in finished, (call.call.id, events)
            told_at, result = finished[call.call.id]
            assert told_at > at and result == logged[call.call.id]
    ends = [e.result.call_id for e in events if isinstance(e, ToolCallFinished)]
    assert len(ends) == len(set(ends)), events  # each told once
    starts = {e.call.id for e in events if isinstance(e, ToolCallStarted)}
    assert set(finished) <= starts and all(r == logged[i] for i, (_, r) in finished.items())


@pytest.mark.virtual_clock
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("seed", range(40))
async def test_a_failed_batch_tells_every_started_call_the_log_answers(
    kind: str, seed: int
) -> None:
    """c2 finishing before c1 while c3's ``after_tool`` raised: c2's result was stored as
    the batch ended, but its ``ToolCallFinished`` never went out (nor c1's "stopped")."""
    rng = random.Random(seed)
    count = rng.randint(2, 4)
    delays = [float(rng.choice([0, 1, 2, 3])) for _ in range(count)]
    failing = rng.randrange(count)
    calls = [("work", {"number": number}) for number in range(count)]
    model = ScriptedModel([tool_calls_response(*calls), text_response("all done")])
    agent = Batch(delays, failing, kind, model=model)
    timeout = max(delays) / 2 + 0.5 if kind == "deadline" else None
    dwell = [rng.choice([0.0, 0.0, 0.5, 1.5]) for _ in range(4 * count + 4)]
    received: list[Event] = []
    began = anyio.current_time()
    taken: list[float] = []  # when each event came, from the run's start
    with pytest.raises(_raised(kind)):
        async with agent.stream("go", timeout=timeout) as events:
            async for event in events:
                received.append(event)
                taken.append(anyio.current_time() - began)
                # a consumer that dwells on an event: a later call's failure cuts the
                # hand-over of another's ToolCallFinished
                await anyio.sleep(dwell[len(received) % len(dwell)])
    ended = anyio.current_time() - began
    if kind == "deadline":  # nothing but the error past it, at once
        assert timeout is not None
        assert all(at < timeout for at in taken), (taken, timeout)
        assert ended <= timeout + max(dwell), (ended, timeout)
    else:
        check_told(received, events.messages)
    results = [r for m in events.messages for r in m.tool_results]
    assert len(results) == count  # the log answers every call


@pytest.mark.virtual_clock
async def test_the_case_found() -> None:
    """c1 slow, c2 done (stored after c1), c3's ``after_tool`` raising: c1 is answered as
    stopped, c2 with its result and c3 as withheld, each told, in call order."""
    batch = tool_calls_response(*[("work", {"number": n}) for n in range(3)])
    model = ScriptedModel([batch, text_response("x")])
    agent = Batch([HANG, 0.0, 1.0], 2, "after_tool raises", model=model)
    received: list[Event] = []
    with pytest.raises(RuntimeError):
        async with agent.stream("go") as events:
            async for event in events:
                received.append(event)
    told = [e.result for e in received if isinstance(e, ToolCallFinished)]
    ids = [call.id for call in batch.message.tool_calls]
    assert [(r.call_id, r.is_error) for r in told] == list(
        zip(ids, [True, False, True], strict=True)
    )
    assert told[1].content == "done 1"
    check_told(received, events.messages)


@pytest.mark.virtual_clock
async def test_past_the_deadline_only_the_error_comes_the_log_holding_the_answer() -> None:
    """A consumer dwelling on the answer's delta past the deadline: the answer is in the
    log, its ``ModelCallFinished`` cut on its way; the error comes next, not that event
    (the consumer's dwell on it would push the error further past the deadline)."""
    received: list[Event] = []
    with pytest.raises(DeadlineExceededError, match="take its ModelCallFinished event"):
        async with Agent(model=ScriptedModel([text_response("hi")])).stream(
            "go", timeout=1.5
        ) as events:
            async for event in events:
                received.append(event)
                await anyio.sleep(2)
    assert events.messages[-1].text == "hi"
    assert [type(event) for event in received] == [TextDelta]
