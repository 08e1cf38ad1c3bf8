"""Work a run must finish even while it stops — for at most a short grace.

A write to the session store that is in flight when the run is cancelled, and the
writes a stopped run makes to answer its open tool calls, are *cleanup*: cancelling them
half-way would leave the run's log and the store apart. ``Grace`` runs such work shielded
from cancellation, but only until its stop time: the first cancellation (or stop) of the
run fixes that time to ``grace`` seconds later (after the run's deadline at the latest),
and every cleanup of the run shares it. So a run ends no later than its deadline plus the
grace, and a caller's cancel scope is honoured within the grace.

The cancellation itself is never replaced: what cleanup raised while the run was being
cancelled is recorded (``failures``), logged without content, and the cancellation goes
on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable

import anyio
from attrs import define, field

__all__ = ["Grace"]

logger = logging.getLogger("littleghost.cleanup")


@define(eq=False)
class Grace:
    """The cleanup budget of one run.

    Args:
        seconds: How long cleanup may go on once the run stops.
        deadline: The run's absolute deadline, if any: cleanup never goes on past it
            plus ``seconds``.
    """

    seconds: float
    deadline: float | None = None
    failures: list[BaseException] = field(factory=list)
    """What cleanup could not do while the run stopped, oldest first."""
    uncertain: bool = False
    """True once a store write failed or was cut off: the store may hold what the log
    does not, so the run writes nothing more (the next run repairs from the store)."""
    _stop_by: float | None = None

    @property
    def stopping(self) -> bool:
        """True once the run has begun to stop."""
        return self._stop_by is not None

    def stop(self) -> float:
        """Mark the run as stopping (once); return the time cleanup must end by."""
        if self._stop_by is None:
            end = anyio.current_time() + self.seconds
            if self.deadline is not None:
                end = min(end, self.deadline + self.seconds)
            self._stop_by = end
        return self._stop_by

    def _limit(self) -> float:
        if self._stop_by is not None:
            return self._stop_by
        if self.deadline is not None:
            return self.deadline + self.seconds
        return math.inf

    async def protect(
        self,
        work: Callable[[], Awaitable[None]],
        what: str,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Await ``work()`` to its end even if the caller is cancelled meanwhile, but not
        past the run's stop time.

        Args:
            work: The cleanup (a store write, say).
            what: What it does, for the log (no content).
            then: Called as soon as ``work()`` has succeeded, cancelled caller or not
                (to put in the log what the store now has, say).

        Raises:
            Exception: What ``work()`` raised, when the caller was not cancelled.
            The caller's cancellation: when it was cancelled; ``work()``'s own failure
            is then recorded in ``failures`` and logged, never raised.
        """
        shield = anyio.CancelScope(shield=True, deadline=self._limit())
        finished = anyio.Event()
        outcome: list[bool] = []
        problem: list[Exception] = []

        async def run() -> None:
            with shield:
                try:
                    await work()
                except Exception as error:
                    problem.append(error)
                else:
                    outcome.append(True)
                    if then is not None:
                        then()
            finished.set()

        cancelled = False
        try:
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                try:
                    await finished.wait()
                except anyio.get_cancelled_exc_class():
                    cancelled = True
                    shield.deadline = min(shield.deadline, self.stop())
                    raise
        finally:
            if cancelled or shield.cancelled_caught:
                self._settle(what, outcome, problem, shield)
        if problem:
            raise problem[0]

    def _settle(
        self, what: str, outcome: list[bool], problem: list[Exception], shield: anyio.CancelScope
    ) -> None:
        """Record what a cleanup cut short by the run's stop left undone."""
        if problem:
            self.fail(what, problem[0])
        elif not outcome and shield.cancelled_caught:
            self.fail(what, TimeoutError(f"{what} did not finish within the cleanup grace"))

    def fail(self, what: str, error: BaseException) -> None:
        """Record and log a cleanup that could not be done while the run stopped."""
        self.failures.append(error)
        logger.warning(
            "cleanup: %s could not be done while the run stopped (%s)", what, type(error).__name__
        )
