"""An agent's runs under way, so that ``aclose()`` lets those that are stopping finish.

A server cancels its requests as it shuts down and closes the agent (its lifespan) at
once, before the stopped runs have stored their last messages; then the event loop's own
end cancels every task left, with no regard for a shield (``asyncio.run`` cancels the
cleanup's tasks too), and those writes are lost. ``aclose()`` therefore first waits for
the runs of its event loop that are stopping, not past their stop times. A run is
stopping once its cleanup has begun, once its tool calls are cancelled (seen by a task
of them or not: a tool may work in a shielded scope), or while a cancellation is pending
in its task or a task under it (it has been cancelled and has not reached its cleanup
yet) other than the closing task's own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence

import anyio
from anyio import TaskInfo
from attrs import define, field

from littleghost.cleanup import Grace, enclosing_graces

__all__ = ["RunsInFlight"]

_LOCK = threading.Lock()
"""Held while the set of runs changes or is read (threads share agents)."""


@define(eq=False)
class _Flight:
    grace: Callable[[], Grace | None]
    """The run's grace, once the run has made it."""
    task: int = field(factory=lambda: anyio.get_current_task().id)
    """The task the run runs in."""
    ended: anyio.Event = field(factory=anyio.Event)
    thread: int = field(factory=threading.get_ident)
    """The thread of the run's event loop: only there can its end be waited for."""


class RunsInFlight:
    """The runs of one agent under way, in every thread."""

    def __init__(self) -> None:
        self._flights: set[_Flight] = set()

    @contextlib.contextmanager
    def track(self, grace: Callable[[], Grace | None]) -> Iterator[None]:
        """Count a run as under way for the block (entered in the run's task);
        ``grace()`` gives its grace once made."""
        flight = _Flight(grace)
        with _LOCK:
            self._flights.add(flight)
        try:
            yield
        finally:
            with _LOCK:
                self._flights.discard(flight)
            flight.ended.set()

    async def stopping_ended(self, by: float) -> None:
        """Wait, shielded from cancellation, until the runs of this thread's event loop
        that are stopping have ended: each not past its stop time, all not past ``by``.
        Runs going on are not waited for, nor the runs the caller is part of (a tool
        closing its own agent)."""
        here, within = threading.get_ident(), enclosing_graces()
        with _LOCK:
            flights = [flight for flight in self._flights if flight.thread == here]
        if not flights:
            return
        cancelled = _under_cancellation(anyio.get_running_tasks(), anyio.get_current_task().id)
        for flight in flights:
            grace = flight.grace()
            if grace is None or grace in within:
                continue
            if grace.ending or flight.task in cancelled:
                with anyio.CancelScope(shield=True, deadline=min(grace.bound(), by)):
                    await flight.ended.wait()


def _under_cancellation(tasks: Sequence[TaskInfo], caller: int) -> set[int]:
    """The ids of the tasks that have a cancellation pending, and of the tasks those are
    under (their parents, theirs, ...), up to ``caller``: the caller's own cancellation
    (``aclose()`` leaving a cancelled ``async with agent:``) stops no run it is under."""
    parents = {task.id: task.parent_id for task in tasks}
    found: set[int] = set()
    for task in tasks:
        if not task.has_pending_cancellation():
            continue
        at: int | None = task.id
        while at is not None and at != caller and at not in found:
            found.add(at)
            at = parents.get(at)
    return found
