"""Runs under way in daemon threads as the interpreter exits.

The interpreter does not wait for a daemon thread (a request thread of ``http.server``,
Django's ``runserver`` or waitress): it stops it wherever it is, and a run there left its
tool calls unanswered and its spans never ended. As the interpreter begins to exit, before
it joins its other threads and runs the ``atexit`` callbacks (a tracer provider's flush
among them), such a run is stopped as if ``SystemExit`` were raised in it, and the exit
waits for it, its cleanup grace at most: it answers its open calls, its ``invoke_agent``
span ends ERROR, and ``SystemExit`` leaves the run (``run_sync()`` in that thread, which
ends quietly). A run in any other thread is left alone: the interpreter waits for it.
While other threads that are no daemons go on (a server's, after the main thread
returned), the interpreter waits for them first, and so the daemon threads' runs go on
too: they are stopped once those threads have been joined, as the ``atexit`` callbacks
begin (before those registered earlier).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from types import TracebackType

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__ = ["at_exit", "stopped_at_exit"]

_MARGIN = 0.5
"""Seconds the exit waits for stopped runs beyond their grace (their loops' own turns)."""


class _Run:
    """A run in a daemon thread: the scope it runs in, and a thread of its own that stops
    it as the interpreter exits."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.token = anyio.lowlevel.current_token()
        self.scope = anyio.CancelScope()
        self.exiting = False
        self.ended = threading.Event()
        self.told = threading.Event()
        """Set as the exit begins or the run ends, whichever comes first."""
        # Its stopper is started now: Python 3.12.0 and 3.12.1 start no thread at exit.
        threading.Thread(target=self.stop_when_told, daemon=True).start()

    def __enter__(self) -> None:
        self.scope.__enter__()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        """Leave the scope; a run the exit stopped raises ``SystemExit``."""
        caught = self.scope.__exit__(kind, error, traceback)
        if self.exiting and self.scope.cancelled_caught:
            raise SystemExit("the interpreter exited during the run") from None
        return bool(caught)

    def stop(self) -> None:
        """Stop the run for the exit (in its event loop)."""
        self.exiting = True
        self.scope.cancel()

    def stop_when_told(self) -> None:
        """In a thread of its own: ``stop()`` the run once the exit begins (its loop may
        be busy, so the exit does not wait on this call; a run ended has nothing to
        stop)."""
        self.told.wait()
        if self.ended.is_set():
            return
        try:
            anyio.from_thread.run_sync(self.stop, token=self.token)
        except Exception:  # the loop ended meanwhile, as its backend tells it
            return


_RUNS: set[_Run] = set()
_GUARD = threading.Lock()


def _stop_runs() -> None:
    """Stop the runs under way in daemon threads; wait until they end, each grace at most."""
    with _GUARD:
        runs = list(_RUNS)
    if not runs:
        return
    until = time.monotonic() + max(run.grace for run in runs) + _MARGIN
    for run in runs:
        run.told.set()
    for run in runs:
        run.ended.wait(max(until - time.monotonic(), 0.0))


def _stop_runs_as_the_exit_begins() -> None:
    """``_stop_runs()`` now, or, while threads that are no daemons go on, once the
    interpreter has joined them: an ``atexit`` callback registered now runs then, before
    those registered earlier (a tracer provider's flush)."""
    main = threading.main_thread()
    if any(t is not main and not t.daemon and t.is_alive() for t in threading.enumerate()):
        atexit.register(_stop_runs)
    else:
        _stop_runs()


def at_exit(callback: Callable[[], None]) -> None:
    """Call ``callback`` as the interpreter begins to exit, before it joins its threads
    (the ``atexit`` callbacks come after that; ``atexit`` where Python has no such hook).
    Callbacks are called in the reverse of the order they were given in."""
    getattr(threading, "_register_atexit", atexit.register)(callback)


at_exit(_stop_runs_as_the_exit_begins)
if hasattr(os, "register_at_fork"):  # a forked child has none of its parent's threads
    os.register_at_fork(after_in_child=_RUNS.clear)


@contextmanager
def stopped_at_exit(grace: float) -> Iterator[AbstractContextManager[None]]:
    """Around a run (and its span): in a daemon thread, the run is stopped as the
    interpreter exits, within ``grace`` seconds. Yields the context to run it in, inside
    its span (where it raises ``SystemExit``); the exit waits until this one ends."""
    if not threading.current_thread().daemon:
        yield nullcontext()
        return
    run = _Run(grace)
    with _GUARD:
        _RUNS.add(run)
    try:
        yield run
    finally:
        with _GUARD:
            _RUNS.discard(run)
        run.ended.set()
        run.told.set()
