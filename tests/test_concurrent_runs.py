"""Concurrent runs of one agent instance: many sessions at once, on one model, one store,
one tool and one set of hooks, with checkpoints drawn from a seeded generator in the model,
the tools, the hooks and a stream's consumer. Each session's stored log and each run's
result must be what running that session alone gives: nothing a run learns (calibration,
summaries, a bounded view's figures, the engine's indexes) leaks into another's.

The runs overlap by force, not by luck: the first model call of each session's n-th run
waits until every session's n-th run has made its first call, so all sessions have a
model call in flight at once, five times over (from an empty log to logs that compacted);
every store allows it (each locks sessions one by one, none serialises runs of different
sessions), and the test counts the calls in flight to show it."""

from __future__ import annotations

import functools
import hashlib
import random
import threading
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from littleghost import (
    Agent,
    Message,
    ToolCall,
    ToolResult,
    after_tool,
    before_model,
    manage_context,
    tool,
)
from littleghost.context import PromptBudget
from littleghost.models import ModelRequest, ModelResponse, StopReason, Usage
from littleghost.sessions import InMemorySessionStore, SessionStore, SQLiteSessionStore

from .conversations import shape
from .stores import RUN_KINDS, open_store

pytestmark = pytest.mark.anyio

SESSIONS = 5
PROMPTS = 5
SHARED_HISTORY = (Message.user("Earlier question."), Message.assistant("Earlier answer. " * 12))
"""Seeds every session's first run: the same message objects in every run at once."""


class Checkpoints:
    """Yields to the event loop 0 to 3 times, as a seeded generator draws (threads share it)."""

    def __init__(self, seed: int) -> None:
        self._draw = random.Random(seed)
        self._lock = threading.Lock()

    async def __call__(self) -> None:
        with self._lock:
            count = self._draw.randrange(4)
        for _ in range(count):
            await anyio.lowlevel.checkpoint()


class Rendezvous:
    """Where the first model call of every session's n-th run waits for the others: one
    barrier of ``SESSIONS`` parties per run number (waited in a worker thread, so runs in
    one event loop and runs in threads of their own meet alike), and the most model calls
    that were ever in flight at once."""

    def __init__(self) -> None:
        self._barriers = [threading.Barrier(SESSIONS, timeout=20) for _ in range(PROMPTS)]
        self._lock = threading.Lock()
        self._in_flight = 0
        self.most_in_flight = 0

    def entered(self) -> None:
        with self._lock:
            self._in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self._in_flight)

    def left(self) -> None:
        with self._lock:
            self._in_flight -= 1

    async def meet(self, run_number: int) -> None:
        try:
            await anyio.to_thread.run_sync(self._barriers[run_number].wait)
        except threading.BrokenBarrierError:
            raise AssertionError(f"the sessions' run {run_number} never overlapped") from None


class Oracle:
    """A model whose answer is a function of the request alone: a lookup of the question's
    last word, then an answer naming what the tool said; a summary naming what it covers;
    input tokens about 1.5 times the characters ÷ 4 (so calibration has something to learn).
    With a ``rendezvous``, a run's first call (the lookup) meets the other sessions' there."""

    name = "oracle"
    provider = "test"
    context_window = 600

    def __init__(self, checkpoint: Checkpoints, rendezvous: Rendezvous | None = None) -> None:
        self._checkpoint = checkpoint
        self._rendezvous = rendezvous

    async def respond(self, request: ModelRequest) -> ModelResponse:
        if self._rendezvous is None:
            return await self._answer(request)
        self._rendezvous.entered()
        try:
            last = request.messages[-1]
            if request.purpose == "chat" and last.role.value == "user":
                await self._rendezvous.meet(int(last.text.split()[2]))
            return await self._answer(request)
        finally:
            self._rendezvous.left()

    async def _answer(self, request: ModelRequest) -> ModelResponse:
        await self._checkpoint()
        size = sum(len(repr(message.content)) for message in request.messages)
        usage = Usage(int(size * 1.5 / 4) + 10, 5)
        if request.purpose != "chat":
            texts = repr([message.text for message in request.messages]).encode()
            digest = hashlib.sha256(texts).hexdigest()[:12]
            return ModelResponse(
                Message.assistant(f"Summary {digest}."), StopReason.END_TURN, usage
            )
        last = request.messages[-1]
        if last.role.value == "user":
            word = last.text.split()[-1]
            call = ToolCall(f"call-{len(request.messages)}", "lookup", {"key": word})
            return ModelResponse(Message.assistant(tool_calls=[call]), StopReason.TOOL_USE, usage)
        said = [str(result.content)[:24] for m in request.messages for result in m.tool_results]
        answer = f"It is {said[-1]} ({len(request.messages)} messages seen)."
        return ModelResponse(Message.assistant(answer), StopReason.END_TURN, usage)


def racer(checkpoint: Checkpoints, *, budget: bool) -> type[Agent]:
    """An agent class that compacts within a few turns, with a tool and hooks that yield."""
    bounded = PromptBudget(
        prompt_budget_tokens=700, response_reserve_tokens=50, safety_reserve_tokens=50
    )

    @manage_context(
        compression_threshold=0.6, preserve_recent_messages=4, budget=bounded if budget else None
    )
    class Racer(Agent):
        instructions = "Answer from the lookups."

        @tool
        async def lookup(self, key: str) -> str:
            """Look a key up."""
            await checkpoint()
            return f"value of {key} " + "x" * 60

        @before_model
        async def yield_before_model(self, request: ModelRequest) -> None:
            await checkpoint()

        @after_tool
        async def yield_after_tool(self, result: ToolResult) -> None:
            await checkpoint()

    return Racer


async def converse(
    agent: Agent, session_id: str, checkpoint: Checkpoints, *, stream: bool
) -> list[Any]:
    """Run the session's prompts in turn (every other one streamed): each run's outcome."""
    outcomes = []
    for turn in range(PROMPTS):
        prompt = f"{session_id}: question {turn} about item{turn}"
        history = SHARED_HISTORY if turn == 0 else None
        if stream and turn % 2:
            async with agent.stream(prompt, session_id=session_id, history=history) as events:
                async for _ in events:
                    await checkpoint()
            result = events.result
        else:
            result = await agent.run(prompt, session_id=session_id, history=history)
        outcomes.append((result.output, result.usage, result.stop_reason, shape(result.messages)))
    return outcomes


async def alone(agent_class: type[Agent], checkpoint: Checkpoints, *, stream: bool) -> Any:
    """Each session run by itself, on a store, agent and model of its own."""
    outcomes, logs = {}, {}
    for number in range(SESSIONS):
        session_id = f"session-{number}"
        store = InMemorySessionStore()
        agent = agent_class(model=Oracle(checkpoint), session_store=store)
        outcomes[session_id] = await converse(agent, session_id, checkpoint, stream=stream)
        logs[session_id] = shape(await store.load(session_id))
    return outcomes, logs


def compactions(logs: dict[str, list[Any]]) -> int:
    return sum(
        1 for log in logs.values() for entry in log if "littleghost.summary.covers" in entry[4]
    )


@pytest.fixture(params=RUN_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    async with open_store(request.param, tmp_path, request) as opened:
        yield opened


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("budget", [False, True], ids=["summaries", "bounded"])
async def test_sessions_run_at_once_on_one_agent_are_each_as_if_run_alone(
    store: SessionStore, seed: int, budget: bool
) -> None:
    checkpoint = Checkpoints(seed)
    agent_class = racer(checkpoint, budget=budget)
    want, want_logs = await alone(agent_class, checkpoint, stream=True)
    assert compactions(want_logs) >= SESSIONS  # every session compacted at least once

    rendezvous = Rendezvous()
    agent = agent_class(model=Oracle(checkpoint, rendezvous), session_store=store)
    got: dict[str, Any] = {}

    async def one(session_id: str) -> None:
        got[session_id] = await converse(agent, session_id, checkpoint, stream=True)

    async with anyio.create_task_group() as group:
        for session_id in want:
            group.start_soon(one, session_id)
    assert rendezvous.most_in_flight == SESSIONS
    for session_id in want:
        assert shape(await store.load(session_id)) == want_logs[session_id], session_id
        assert got[session_id] == want[session_id], session_id


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_sessions_run_at_once_from_threads_are_each_as_if_run_alone(
    kind: str, tmp_path: Path
) -> None:
    checkpoint = Checkpoints(7)
    agent_class = racer(checkpoint, budget=False)
    want, want_logs = anyio.run(functools.partial(alone, agent_class, checkpoint, stream=False))
    store = InMemorySessionStore() if kind == "memory" else SQLiteSessionStore(tmp_path / "s.db")
    rendezvous = Rendezvous()
    agent = agent_class(model=Oracle(checkpoint, rendezvous), session_store=store)

    def one(session_id: str) -> list[Any]:
        outcomes = []
        for turn in range(PROMPTS):
            history = SHARED_HISTORY if turn == 0 else None
            prompt = f"{session_id}: question {turn} about item{turn}"
            result = agent.run_sync(prompt, session_id=session_id, history=history)
            outcomes.append(
                (result.output, result.usage, result.stop_reason, shape(result.messages))
            )
        return outcomes

    with ThreadPoolExecutor(max_workers=SESSIONS) as pool:
        got = dict(zip(want, pool.map(one, want), strict=True))
    assert rendezvous.most_in_flight == SESSIONS
    for session_id in want:
        assert got[session_id] == want[session_id], session_id
        assert shape(anyio.run(store.load, session_id)) == want_logs[session_id], session_id
    if isinstance(store, SQLiteSessionStore):
        anyio.run(store.aclose)
