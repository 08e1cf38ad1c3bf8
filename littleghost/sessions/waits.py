"""Who holds which session in this process, and who waits for which: a run about to wait
for a session whose holder waits (through nested runs and streams) for a session of
the waiting run's own chain would close a cycle, and raises ``SessionBusyError``.

A session is keyed by its lock's owner (a lock table, a store object) and its id. A
run's chain is the holds of its task (the runs it belongs to) and of the streams it is
reading: none of them ends before the run does. The graph is one for every thread and
event loop of the process; the search runs only when the session is held.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from attrs import frozen

from littleghost.errors import SessionBusyError
from littleghost.sessions.forks import reset_in_child

if TYPE_CHECKING:
    from littleghost.sessions.locks import Hold

__all__ = ["WAITS", "Wait", "WaitGraph"]

Key = tuple[int, str]
"""A lock's owner (``id`` of a lock table or a store) and a session id."""


@frozen(eq=False)
class Wait:
    """A run waiting to hold the session ``key`` names, with the holds of its chain."""

    key: Key
    held: tuple[Hold, ...]
    waited_on: tuple[list[Hold], ...]

    def chain(self) -> Iterator[Hold]:
        """The holds of the waiting run's chain (a stream's list as it is now)."""
        yield from self.held
        for holds in self.waited_on:
            yield from tuple(holds)


class WaitGraph:
    """The holders and the waiters of sessions in this process (a process ``fork()``
    made starts with none: the parent's threads are not in it)."""

    def __init__(self) -> None:
        self._forget_in_child()
        reset_in_child(WaitGraph._forget_in_child).add(self)

    def _forget_in_child(self) -> None:
        self._guard = threading.Lock()
        self._holders: dict[Key, list[Hold]] = {}
        self._waits: set[Wait] = set()

    def hold(self, key: Key, hold: Hold) -> None:
        """Note that ``hold`` holds the session ``key`` names (until ``release``)."""
        with self._guard:
            self._holders.setdefault(key, []).append(hold)

    def release(self, key: Key, hold: Hold) -> None:
        """Note that ``hold`` no longer holds the session ``key`` names."""
        with self._guard:
            holders = self._holders.get(key, [])  # (a fork since may have dropped it)
            if hold in holders:
                holders.remove(hold)
            if not holders:
                self._holders.pop(key, None)

    def wait(self, key: Key, held: tuple[Hold, ...], waited_on: tuple[list[Hold], ...]) -> Wait:
        """Note that a run whose chain holds ``held`` and the holds in ``waited_on`` may
        wait for the session ``key`` names (until ``stop_waiting``).

        Raises:
            SessionBusyError: The session's holder waits, in turn, for a session this
                chain holds: waiting would never end.
        """
        wait = Wait(key, held, waited_on)
        with self._guard:
            if key in self._holders:  # held: search (a free session closes no cycle)
                cycle = self._cycle(wait)
                if cycle is not None:
                    raise SessionBusyError(_cycle_message(cycle), session_id=key[1])
            self._waits.add(wait)
        return wait

    def stop_waiting(self, wait: Wait) -> None:
        """Note that the run of ``wait`` no longer waits (it holds the session or gave up)."""
        with self._guard:
            self._waits.discard(wait)

    def _cycle(self, wait: Wait) -> list[str] | None:
        """The ids of the sessions from the one ``wait`` is for, each held by a run that
        waits for the next, to one that ``wait``'s own chain holds; ``None`` when no
        such path is."""
        mine = set(wait.chain())
        paths: list[tuple[Key, list[str]]] = [(wait.key, [wait.key[1]])]
        seen = {wait.key}
        while paths:
            key, path = paths.pop()
            for holder in self._holders.get(key, ()):
                if holder in mine:
                    return path
                for other in self._waits:
                    if other.key not in seen and holder in other.chain():
                        seen.add(other.key)
                        paths.append((other.key, [*path, other.key[1]]))
        return None


def _cycle_message(cycle: list[str]) -> str:
    chain = "this run (or a run it belongs to, or a stream it is reading)"
    if len(cycle) == 1:
        return f"session {cycle[0]!r} is held by {chain}: waiting would never end"
    held_by = ", held by a run waiting for ".join(f"session {each!r}" for each in cycle[1:])
    return (
        f"session {cycle[0]!r} is held by a run waiting for {held_by}, which {chain} "
        "holds: waiting would close a cycle of runs waiting for each other and never end"
    )


WAITS = WaitGraph()
"""The one graph of this process."""
