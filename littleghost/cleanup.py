"""Work a run must finish even while it stops — for at most a short grace.

A write to the session store that is in flight when the run is cancelled, the writes a
stopped run makes to answer its open tool calls, and releasing its session are *cleanup*:
cancelling them half-way would leave the run's log and the store apart. ``Grace`` runs such
work shielded from cancellation, but only until its stop time: the first cancellation (or
stop) of the run fixes that time to ``grace`` seconds later (after the run's deadline, or
its caller's, at the latest), and every cleanup of the run shares it. A run started inside
another run's tool (an agent used as a tool; a hook, ``instructions`` or a model alike)
stops by the time the outer run would stop by, whatever its own grace; cancelled by a
``cancel()``, it leaves its stop time for that tool: if the outer run is being
cancelled as the tool ends (the cancellation came from outside it), the outer run ends by
that time as well, so graces never add up; if not (a ``cancel()`` inside the tool), the
outer run goes on untouched. A deadline inside the outer run (a tool's timeout, say) stops
the nested run only; a tool's own write (``context.append``) it cuts short finishes within
the grace, and the run goes on as if nothing stopped. A run therefore ends no later than
its deadline plus the grace, and a caller's cancel scope is honoured within the grace.

The cancellation itself is never replaced: what cleanup raised while the run was being
cancelled is recorded (``failures``), logged without content, and the cancellation goes
on. ``KeyboardInterrupt`` and ``SystemExit`` go through as themselves.
"""

from __future__ import annotations

import math
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from contextvars import ContextVar

import anyio
from attrs import define, field

from littleghost import logs
from littleghost.errors import SessionStoreError

__all__ = [
    "DEFAULT_GRACE",
    "Grace",
    "cancellation_turned_into",
    "cancelled_here",
    "close_leaving",
    "enclosing_graces",
    "enter_block",
    "fatal",
    "go_on_if_turned",
    "leave_block",
    "log_unraised",
    "note_stop",
    "run_deadline",
    "shared_stop",
    "turned_into",
]

logger = logs.logger("littleghost.cleanup")

DEFAULT_GRACE = 1.0
"""Seconds of cleanup grace where no agent says (``Agent.cleanup_grace``'s default)."""

_CURRENT: ContextVar[Grace | None] = ContextVar("littleghost_grace", default=None)
_HOSTED: ContextVar[list[float] | None] = ContextVar("littleghost_hosted_stops", default=None)
"""While a tool (hook, ...) runs: the stop times of the runs it started that a
``cancel()`` stopped."""
_HOST: ContextVar[Grace | None] = ContextVar("littleghost_host", default=None)
"""While a tool (hook, ...) runs: the grace of the run hosting it."""
_BLOCK: ContextVar[_Block | None] = ContextVar("littleghost_agent_block", default=None)
"""The innermost ``async with agent:`` block the caller is in (in its task, or a task
started in it)."""


@define(eq=False)
class Grace:
    """The cleanup budget of one run.

    Args:
        seconds: How long cleanup may go on once the run stops.
        deadline: The run's absolute deadline (or its caller's, if earlier), if any:
            cleanup never goes on past it plus ``seconds``.
    """

    seconds: float
    deadline: float | None = None
    failures: list[BaseException] = field(factory=list)
    """What cleanup could not do while the run stopped, oldest first."""
    uncertain: bool = False
    """True once a store write failed or was cut off: the store may hold what the log
    does not, so the run writes nothing more (the next run repairs from the store)."""
    parent: Grace | None = field(factory=lambda: _of_this_thread(_CURRENT.get()))
    """The grace of the run this run was started in (from a tool), if any."""
    _stop_by: float | None = None
    _stopped_at: float | None = None
    """When the run began to stop (``stop()``'s first call)."""
    _host_stops: list[float] | None = field(
        factory=lambda: _HOSTED.get() if _of_this_thread(_HOST.get()) else None
    )
    """Where this run, started from a tool and stopped by a ``cancel()``, leaves its stop
    time for the run of that tool (``hosting``)."""
    _nested_stop_by: float = math.inf
    """The earliest stop time of runs started by a tool of this run that a ``cancel()``
    from outside this run stopped."""
    cancel_seen: bool = field(default=False, kw_only=True)
    """True once a task of the run (a tool call's) has seen the run's tools cancelled: the
    run is ending, though its own task may not have taken up its cleanup yet."""
    tool_calls: anyio.CancelScope | None = field(default=None, kw_only=True)
    """The scope of the tool calls running now: once cancelled, the run is ending, though
    no task of it may have seen it yet (a tool in a shielded scope)."""
    run_deadline: float | None = field(default=None, kw_only=True)
    """The run's own deadline (``timeout``/``deadline``), if any."""
    _thread: int = field(factory=threading.get_ident, init=False, repr=False)
    """The thread of the run's event loop."""

    def deadlines(self) -> list[float]:
        """The own deadlines of this run and of the runs it was started in: any of them
        ends it."""
        runs = (self, *self._enclosing())
        return [grace.run_deadline for grace in runs if grace.run_deadline is not None]

    def earliest_deadline(self) -> float | None:
        """The earliest of ``deadlines()``, if any: past it, the run ends by a deadline;
        ``None`` once the run began to stop before it (its caller's cancellation, say): a
        deadline that passes while the run cleans up did not cut it."""
        return self._unless_stopped_before(min(self.deadlines(), default=None))

    def enclosing_cut(self) -> float | None:
        """``enclosing_deadline()`` on the terms of ``earliest_deadline()``: past it, a
        cancellation that leaves the run is that deadline's (the run's own deadline
        leaves it as its ``DeadlineExceededError``; any other cancellation is its
        caller's)."""
        return self._unless_stopped_before(self.enclosing_deadline())

    def _unless_stopped_before(self, deadline: float | None) -> float | None:
        """``deadline``, or ``None`` once the run began to stop before it."""
        if deadline is None or self._stopped_at is None or self._stopped_at >= deadline:
            return deadline
        return None

    def enclosing_deadline(self) -> float | None:
        """The earliest own deadline of the runs this run was started in, if any."""
        found = [g.run_deadline for g in self._enclosing() if g.run_deadline is not None]
        return min(found, default=None)

    def _enclosing(self) -> Iterator[Grace]:
        parent = self.parent
        while parent is not None:
            yield parent
            parent = parent.parent

    @property
    def stopping(self) -> bool:
        """True once the run has begun to stop."""
        return self._stop_by is not None

    @property
    def ending(self) -> bool:
        """True once the run has begun to stop, or its tool calls were cancelled (its own
        task may not have taken up its cleanup yet)."""
        calls = self.tool_calls
        return self.stopping or self.cancel_seen or (calls is not None and calls.cancel_called)

    def stop(self) -> float:
        """Mark the run as stopping (once); return the time cleanup must end by.

        Not past the stop time of the runs its tools started that the same cancellation
        stopped first (``hosting``), nor past the time the run it was started in would
        stop by if it stopped now (``bound``: its grace is shared, whatever this run's
        own). A run stopped by a ``cancel()`` leaves its stop time for that run's tool.
        """
        if self._stop_by is None:
            self._stopped_at = anyio.current_time()
            end = min(self._stopped_at + self.seconds, self._nested_stop_by)
            if self.deadline is not None:
                end = min(end, self.deadline + self.seconds)
            if self.parent is not None:
                end = min(end, self.parent.bound())
            if self._cancelled_by_cancel() and self._host_stops is not None:
                self._host_stops.append(end)
            self._stop_by = end
        return self._stop_by

    def bound(self) -> float:
        """The time this run would stop by if it began to stop now: its stop time once
        stopping, else its grace from now (and from its deadline), within the bound of
        the run it was started in."""
        if self._stop_by is not None:
            return self._stop_by
        end = anyio.current_time() + self.seconds
        if self.deadline is not None:
            end = min(end, self.deadline + self.seconds)
        return end if self.parent is None else min(end, self.parent.bound())

    @contextmanager
    def hosting(self) -> Iterator[None]:
        """Around user code this run calls (a tool, a hook, ``instructions``, a model):
        when it ends while this run is being cancelled, the runs it started and that the
        same ``cancel()`` stopped first set this run's stop time (graces never add up);
        when this run goes on, their stops were that code's own business."""
        stops: list[float] = []
        token, host = _HOSTED.set(stops), _HOST.set(self)
        try:
            yield
        finally:
            _HOST.reset(host)
            _HOSTED.reset(token)
            if stops and cancelled_here():
                self._nested_stop_by = min(self._nested_stop_by, *stops)

    def _cancelled_by_cancel(self) -> bool:
        """True when the run is being cancelled by a ``cancel()``, from inside the outer
        run's tool or from outside the outer run (anyio cannot tell which; ``hosting``
        tells, once the tool ends).

        Not when a deadline passed: every deadline over the run, the outer run's and a
        tool's timeout inside it alike, is in ``deadline``, so the run already stops by
        the outer run's stop time, and a tool's timeout stops the tool, not the outer run.
        """
        return cancelled_here() and (self.deadline is None or anyio.current_time() < self.deadline)

    def _limit(self) -> float:
        if self._stop_by is not None:
            return self._stop_by
        if self.deadline is not None:
            return self.deadline + self.seconds
        return math.inf

    def running(self) -> AbstractAsyncContextManager[None]:
        """Make this the current run's grace while the context is open (nested runs
        started inside it find it as their ``parent``)."""
        return _current(self)

    async def protect(
        self,
        work: Callable[[], Awaitable[None]],
        what: str,
        then: Callable[[], None] | None = None,
    ) -> None:
        """Await a store write ``work()`` to its end even if the caller is cancelled
        meanwhile, but not past the run's stop time.

        Args:
            work: The write.
            what: What it does, for the log (no content).
            then: Called as soon as ``work()`` has succeeded, cancelled caller or not
                (to put in the log what the store now has, say); never when it did not.

        Raises:
            Exception: What ``work()`` raised, when the caller was not cancelled.
            SessionStoreError: When the caller was not cancelled, ``work()`` raised a
                cancellation exception nobody asked for, or was cut off at the run's stop
                time: its outcome is unknown.
            KeyboardInterrupt, SystemExit: From ``work()``, as themselves (out of an
                exception group too).
            The caller's cancellation: when it was cancelled; ``work()``'s own failure
                is then recorded in ``failures`` and logged, never raised.
        """
        shield = anyio.CancelScope(shield=True, deadline=self._limit())
        finished = anyio.Event()
        done = False
        failure: list[BaseException] = []

        async def run() -> None:
            nonlocal done
            with shield:
                try:
                    await work()
                except BaseException as error:
                    if shield.cancel_called and isinstance(error, anyio.get_cancelled_exc_class()):
                        raise  # cut off at the stop time: the shield's own cancellation
                    failure.append(error)
                else:
                    done = True
                    if then is not None:
                        then()
            finished.set()

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(run)
                try:
                    await finished.wait()
                except anyio.get_cancelled_exc_class():
                    shield.deadline = min(shield.deadline, self._stop_for_write())
                    raise
        except anyio.get_cancelled_exc_class():
            _raise_fatal(failure)
            self._settle(what, done, failure)
            raise
        _raise_fatal(failure)
        if failure and isinstance(failure[0], Exception):
            raise failure[0]
        if failure:
            raise SessionStoreError(
                f"{what}: the store raised {type(failure[0]).__name__}, which nobody asked "
                "for; the outcome of the write is unknown"
            ) from failure[0]
        if not done:
            raise SessionStoreError(
                f"{what} was cut off at the run's stop time; the outcome of the write is unknown"
            )

    def _stop_for_write(self) -> float:
        """The time a write whose caller is being cancelled must end by: the run's stop
        time, unless the caller is code the run hosts (a tool's ``append``), which a
        scope of its own (the tool's timeout) may have cancelled while the run goes on;
        then the time the run would stop by, which becomes its stop time only if the run
        is stopping when that code ends (``hosting``)."""
        return self.stop() if _HOST.get() is not self else self._left_for_host()

    def _left_for_host(self) -> float:
        """The time this run would stop by if it began to stop now (``bound``), left for
        it as the hosted code's stop (``hosting``), so graces never add up."""
        end = self.bound()
        hosted = _HOSTED.get()
        if hosted is not None:
            hosted.append(end)
        return end

    def _settle(self, what: str, done: bool, failure: list[BaseException]) -> None:
        """Record what a write cut short by the run's stop left undone."""
        if failure:
            self.fail(what, failure[0])
        elif not done:
            self.fail(what, TimeoutError(f"{what} did not finish within the cleanup grace"))

    async def finish(self, what: str, work: Awaitable[object]) -> None:
        """Await ``work`` for a run that stops: shielded until its stop time; a failure
        (or running out of time) is recorded and logged, never raised over what stopped
        the run."""
        with anyio.CancelScope(shield=True, deadline=self.stop()) as scope:
            try:
                await work
            except Exception as failure:
                self.fail(what, failure)
        if scope.cancelled_caught:
            self.fail(what, TimeoutError(f"{what} did not finish within the cleanup grace"))

    def fail(self, what: str, error: BaseException) -> None:
        """Record and log a cleanup that could not be done while the run stopped."""
        self.failures.append(error)
        logger.warning(
            "cleanup: %s could not be done while the run stopped (%s)", what, type(error).__name__
        )


def shared_stop() -> float:
    """For cleanup that is no run's own (closing an agent's models) in code a run calls,
    a tool say, while a cancellation goes on: the time that run would stop by if it began
    to stop now (``Grace.bound``), left for the run too, as a nested run's stop
    (``hosting``), so graces never add up. ``math.inf`` outside runs or cancellations."""
    grace = _of_this_thread(_CURRENT.get())
    if grace is None or not cancelled_here():
        return math.inf
    return grace._left_for_host()


@define(eq=False)
class _Block:
    """An ``async with agent:`` block: the latest stop time of the runs that ended
    stopping in it (in its task, or tasks started in it, a stream's run too)."""

    parent: _Block | None
    stop: float = -math.inf


def enter_block() -> None:
    """Enter an ``async with agent:`` block (in the caller's task)."""
    _BLOCK.set(_Block(_BLOCK.get()))


def leave_block(leaving: BaseException | None, grace: float) -> float:
    """Leave the innermost block; the time its cleanup (closing the agent's models) must
    end by as ``leaving`` goes on: the stop time of the runs that ended stopping in it,
    if the last did so within ``grace`` seconds (stopped by what the block is leaving
    by: its cancellation, a run's deadline), so graces never add up; else ``math.inf``."""
    block = _BLOCK.get()
    if block is None:
        return math.inf
    _BLOCK.set(block.parent)
    if block.parent is not None:
        block.parent.stop = max(block.parent.stop, block.stop)
    if leaving is None or block.stop < anyio.current_time() - grace:
        return math.inf
    return block.stop


def note_stop(grace: Grace) -> None:
    """Note the stop time of a run that ends stopping in the ``async with agent:`` block
    it is in (``leave_block``)."""
    block = _BLOCK.get()
    if block is not None and grace.stopping:
        block.stop = max(block.stop, grace.stop())


def enclosing_graces() -> list[Grace]:
    """The graces of the run the caller is part of (a tool of it, say) and of the runs
    that run was started in, innermost first; none outside runs."""
    grace = _of_this_thread(_CURRENT.get())
    return [] if grace is None else [grace, *grace._enclosing()]


def run_deadline() -> float | None:
    """The earliest deadline of the run the caller is part of (a hook or tool of it) and
    of the runs it was started in, if any; none outside runs: past it, what the caller
    does is cut by a deadline (``telemetry.failure_type``)."""
    graces = enclosing_graces()
    return graces[0].earliest_deadline() if graces else None


def _of_this_thread(grace: Grace | None) -> Grace | None:
    """``grace`` unless its run is of another thread's event loop: a run a sync tool
    starts in an event loop of its own (``run_sync`` in the tool's worker thread) finds
    the tool's run in the context it was given, but that run's times are on another
    clock (trio's is offset at random) and it cannot stop the new run."""
    return grace if grace is not None and grace._thread == threading.get_ident() else None


def cancelled_here() -> bool:
    """True when the current task is being cancelled (a cancel scope around it was
    cancelled or its deadline passed), so a cancellation exception it sees is no stray."""
    return anyio.current_effective_deadline() == -math.inf


def cancellation_turned_into(error: BaseException) -> bool:
    """Whether ``error`` is what a cancellation of the current task, which goes on, became
    in code that turned it into an error of its own (a client's "connection closed")."""
    return isinstance(error, Exception) and cancelled_here() and turned_into(error)


async def go_on_if_turned(error: BaseException) -> None:
    """Raise the cancellation of the current task (``error`` its context) when ``error``
    is what that cancellation became in code that turned it into an error of its own (a
    client's "connection closed"); else return."""
    if cancellation_turned_into(error):
        await anyio.lowlevel.checkpoint()


def turned_into(error: BaseException) -> bool:
    """Whether ``error`` was raised while a cancellation went on, in code that turned it
    into an error of its own (in a task group of its own too)."""
    cancelled = anyio.get_cancelled_exc_class()
    return any(  # each exception of such code's task group, raised while cancelled
        isinstance(link, cancelled) for leaf in leaves(error) for link in chain(leaf)
    )


def chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or during, in turn (each once)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def leaves(error: BaseException) -> list[BaseException]:
    """The exceptions ``error`` holds, out of nested exception groups (itself if none)."""
    inner = getattr(error, "exceptions", None)  # a BaseExceptionGroup's
    if not isinstance(inner, tuple) or not inner:
        return [error]
    return [leaf for failure in inner for leaf in leaves(failure)]


def fatal(error: BaseException | None) -> BaseException | None:
    """``error`` if it is a ``KeyboardInterrupt`` or ``SystemExit``, else the first one
    inside it (an exception group, from a tool's or a store's own task group), which
    must go through as itself."""
    if error is None:
        return None
    ending = (KeyboardInterrupt, SystemExit)
    return next((leaf for leaf in leaves(error) if isinstance(leaf, ending)), None)


def _raise_fatal(failure: list[BaseException]) -> None:
    found = fatal(failure[0]) if failure else None
    if found is not None:
        raise found


@asynccontextmanager
async def _current(grace: Grace) -> AsyncIterator[None]:
    token = _CURRENT.set(grace)
    try:
        yield
    finally:
        _CURRENT.reset(token)


@asynccontextmanager
async def holding(hold: AbstractAsyncContextManager[None], grace: Grace) -> AsyncIterator[None]:
    """Hold a session (``hold``) for a run; releasing it takes at most the grace, and its
    failure is recorded and logged, never raised over the run's outcome."""
    await hold.__aenter__()
    try:
        yield
    finally:
        await grace.finish("releasing the session", hold.__aexit__(None, None, None))


def log_unraised(what: str, failure: BaseException, outcome: BaseException) -> None:
    """Log ``failure`` (of ``what``), which is not raised over ``outcome``: the exception
    already going on (a cancellation, the caller's own error) stays what is raised. Types
    only, no content."""
    cause = failure.__cause__
    kind = type(failure).__name__ + ("" if cause is None else f" from {type(cause).__name__}")
    logger.warning("%s failed too (%s) while %s went on", what, kind, type(outcome).__name__)


async def close_leaving(
    close: Callable[[], Awaitable[object]], what: str, leaving: BaseException | None
) -> Exception | None:
    """Await ``close()`` at the end of an ``async with`` block; when the block is leaving
    by ``leaving`` (an exception, a cancellation included), a failure to close is logged
    (``log_unraised``) and returned, and ``leaving`` goes on. Leaving normally, the
    failure is raised, unless the caller's cancellation came while ``close()`` ran
    (shielded): that cancellation goes on instead, the failure logged."""
    try:
        await close()
    except Exception as failure:
        if leaving is not None:
            log_unraised(what, failure, leaving)
            return failure
        raised = failure
    else:
        return None
    if cancelled_here():
        try:
            await anyio.lowlevel.checkpoint()  # the caller's cancellation
        except anyio.get_cancelled_exc_class() as cancellation:
            log_unraised(what, raised, cancellation)
            raise
    raise raised
