"""Runs of several sessions whose tools run each other's sessions: a run that would
close a cycle of runs waiting for each other raises ``SessionBusyError`` instead of
waiting forever; the others complete, and every log stays whole."""

from __future__ import annotations

import random
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from littleghost import Agent, RunResult, tool
from littleghost.errors import SessionBusyError
from littleghost.sessions import InMemorySessionStore, SessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

from .stores import RUN_KINDS, LockingStore, open_store

pytestmark = pytest.mark.anyio

WAIT = 10.0
"""Seconds a run (or a test) may take at most: on a deadlock it fails, never hangs."""


@pytest.fixture(params=RUN_KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[SessionStore]:
    async with open_store(request.param, tmp_path, request) as opened:
        yield opened


class Inner(Agent):
    instructions = "Answer."


class Visits:
    """Runs of sessions (one per session) whose ``visit`` tool runs another session once
    every run holds its own, through ``via[session]`` nested runs of sessions of their
    own first; what the nested runs returned, and which were refused."""

    def __init__(
        self,
        store: SessionStore,
        targets: dict[str, str | None],
        via: dict[str, int] | None = None,
    ) -> None:
        self.store = store
        self.targets = targets
        self.via = via or {}
        self.barrier = threading.Barrier(len(targets))
        self.inner: dict[str, list[RunResult[str]]] = {}
        self.passed: dict[str, RunResult[str]] = {}
        self.outer: dict[str, RunResult[str]] = {}
        self.refused: dict[str, str] = {}

    def agent(self, origin: str) -> Agent:
        """The agent of the run of ``origin``."""
        hops = [f"{origin}-via{n}" for n in range(self.via.get(origin, 0))]
        return self._visitor(origin, origin, [*hops, self.targets[origin] or ""])

    def _visitor(self, origin: str, session: str, hops: list[str]) -> Agent:
        """An agent for a run of ``session`` whose tool runs ``hops[0]`` (through the
        rest of ``hops``, a nested run each)."""
        visits = self

        class Visitor(Agent):
            @tool
            async def visit(self, session: str) -> str:
                """Run another agent's session (or none, for an empty name)."""
                return await visits._visit(origin, session, hops)

        model = ScriptedModel(
            [tool_call_response("visit", {"session": hops[0]}), text_response(f"done {session}")]
        )
        return Visitor(model=model, session_store=self.store)

    async def _visit(self, origin: str, session: str, hops: list[str]) -> str:
        """Run ``session`` for the tool of a run on the way from ``origin``."""
        if len(hops) == 1 + self.via.get(origin, 0):  # the run of origin itself
            await anyio.to_thread.run_sync(self.barrier.wait, WAIT)
        if not session:
            await anyio.sleep(0.2)  # held while the others wait for it
            return "stayed"
        try:
            if len(hops) > 1:
                agent = self._visitor(origin, session, hops[1:])
                result = await agent.run("via", session_id=session, timeout=WAIT)
                self.passed[session] = result
                return result.output
            model = ScriptedModel([text_response(f"inner {session}")])
            inner = Inner(model=model, session_store=self.store)
            result = await inner.run("inner", session_id=session, timeout=WAIT)
        except SessionBusyError as error:
            self.refused[origin] = str(error)
            raise
        self.inner.setdefault(session, []).append(result)
        return result.output

    async def run_all(self, how: str) -> None:
        async def run(session: str) -> None:
            agent = self.agent(session)
            if how == "tasks":
                result = await agent.run("go", session_id=session, timeout=WAIT)
            else:
                result = await anyio.to_thread.run_sync(
                    lambda: agent.run_sync("go", session_id=session, timeout=WAIT),
                    abandon_on_cancel=True,
                )
            self.outer[session] = result

        with anyio.fail_after(2 * WAIT):
            async with anyio.create_task_group() as group:
                for session in self.targets:
                    group.start_soon(run, session)

    async def check_logs(self) -> None:
        """Each log is its outer run's, then the nested runs of it that ran, whole; the
        log of each session passed through is its one run's."""
        for session, outer in self.outer.items():
            assert outer.output == f"done {session}"
            stored = await self.store.load(session)
            inner = self.inner.get(session, [])
            if inner:
                assert stored == max(inner, key=lambda result: len(result.messages)).messages
            assert stored[: len(outer.messages)] == outer.messages
            assert [m.text for m in stored[len(outer.messages) :]] == [
                "inner",
                f"inner {session}",
            ] * len(inner)
        for session, result in self.passed.items():
            assert result.output == f"done {session}"
            assert await self.store.load(session) == result.messages


def cycle_message(cycle: list[str]) -> str:
    waits = ", held by a run waiting for ".join(f"session {s!r}" for s in cycle[1:])
    return f"session {cycle[0]!r} is held by a run waiting for {waits}, which this run"


@pytest.mark.parametrize("how", ["tasks", "threads"])
@pytest.mark.parametrize("size", [2, 3])
async def test_the_run_that_closes_a_cycle_is_refused_and_the_others_complete(
    store: SessionStore, how: str, size: int
) -> None:
    await closes_one_cycle(store, how, size)


@pytest.mark.parametrize("size", [2, 3])
async def test_a_cycle_through_a_store_with_its_own_lock_is_refused(size: int) -> None:
    """A store's own ``lock`` (an anyio lock per session here: one event loop's tasks)."""
    await closes_one_cycle(LockingStore(), "tasks", size)


async def closes_one_cycle(store: SessionStore, how: str, size: int) -> None:
    """Runs of ``size`` sessions, each tool running the next one's session (the last the
    first's), in tasks or threads: exactly one is refused, naming the cycle."""
    sessions = [f"s{n}" for n in range(size)]
    nexts = dict(zip(sessions, sessions[1:] + sessions[:1], strict=True))
    visits = Visits(store, dict(nexts))
    await visits.run_all(how)
    assert len(visits.refused) == 1, visits.refused
    ((closer, content),) = visits.refused.items()
    (outcome,) = visits.outer[closer].messages[2].tool_results
    assert outcome.is_error and "SessionBusyError" in outcome.content
    cycle = [nexts[closer]]
    while cycle[-1] != closer:
        cycle.append(nexts[cycle[-1]])
    assert cycle_message(cycle) in content
    assert sorted(visits.inner) == sorted(set(sessions) - {nexts[closer]})
    await visits.check_logs()


def cycles_of(targets: dict[str, str | None]) -> list[set[str]]:
    """The cycles of a graph where each session leads to at most one (brute force)."""
    found: list[set[str]] = []
    for start in targets:
        walk: list[str] = []
        session: str | None = start
        while session is not None and session not in walk:
            walk.append(session)
            session = targets[session]
        if session is not None:
            cycle = set(walk[walk.index(session) :])
            if cycle not in found:
                found.append(cycle)
    return found


@pytest.mark.parametrize("seed", range(32))
async def test_refusals_match_the_cycles_of_random_visits(seed: int) -> None:
    """Random graphs of runs whose tools run another session (or none, holding theirs a
    while), directly or through nested runs of sessions of their own: one run per cycle
    is refused, none off a cycle (those wait behind holders that are not waiting for
    them), and every run completes."""
    rng = random.Random(seed)
    sessions = [f"s{n}" for n in range(rng.randint(2, 6))]
    targets: dict[str, str | None] = {
        session: rng.choice([None, *(other for other in sessions if other != session)])
        for session in sessions
    }
    via = {session: rng.choice([0, 0, 1, 2]) for session in sessions}
    visits = Visits(InMemorySessionStore(), targets, via)
    await visits.run_all(rng.choice(["tasks", "threads"]))
    cycles = cycles_of(targets)
    assert sorted(len(cycle & set(visits.refused)) for cycle in cycles) == [1] * len(cycles)
    assert set(visits.refused) <= set().union(*cycles)
    await visits.check_logs()


async def test_a_cycle_through_a_streams_block_is_refused(store: SessionStore) -> None:
    """The block of a stream of session ``a`` runs session ``b`` while a run of ``b``
    has a tool run ``a``: the stream's run waits for its block, so one of the two waits
    would never end: it is refused, and the other completes."""
    barrier = threading.Barrier(2)
    refused: list[str] = []
    inner: dict[str, RunResult[str]] = {}

    async def run_inner(session: str) -> str:
        agent = Inner(model=ScriptedModel([text_response(f"inner {session}")]), session_store=store)
        inner[session] = await agent.run("inner", session_id=session, timeout=WAIT)
        return inner[session].output

    class Crossing(Agent):
        @tool
        async def visit(self) -> str:
            """Run session a."""
            await anyio.to_thread.run_sync(barrier.wait, WAIT)
            return await run_inner("a")

    crossing = Crossing(
        model=ScriptedModel([tool_call_response("visit", {}), text_response("done b")]),
        session_store=store,
    )
    outer: dict[str, RunResult[str]] = {}

    async def run_b() -> None:
        outer["b"] = await crossing.run("go", session_id="b", timeout=WAIT)

    streamed = Inner(model=ScriptedModel([text_response("done a")]), session_store=store)
    with anyio.fail_after(2 * WAIT):
        async with anyio.create_task_group() as group:
            group.start_soon(run_b)
            async with streamed.stream("go", session_id="a") as events:
                async for _ in events:
                    if not refused and not inner:  # at the first event
                        await anyio.to_thread.run_sync(barrier.wait, WAIT)
                        try:
                            await run_inner("b")
                        except SessionBusyError as error:
                            refused.append(str(error))
            outer["a"] = events.result
    (outcome,) = outer["b"].messages[2].tool_results
    if outcome.is_error:
        assert not refused and "SessionBusyError" in outcome.content
        assert cycle_message(["a", "b"]) in outcome.content
        assert sorted(inner) == ["b"]
    else:
        assert refused and cycle_message(["b", "a"]) in refused[0]
        assert sorted(inner) == ["a"]
    for session in ("a", "b"):
        stored = await store.load(session)
        assert stored[: len(outer[session].messages)] == outer[session].messages
        if session in inner:
            assert stored == inner[session].messages
        else:
            assert stored == outer[session].messages
