"""Async work run to its end from synchronous code, in an event loop of its own."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


def run_blocking(work: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``work(*args)`` run in a new event loop; Ctrl-C raises ``KeyboardInterrupt``.

    The loop's interrupt handler (the loop installs it in the main thread only, over
    Python's own) cancels the main task; on Python 3.11 and later the loop turns that into
    ``KeyboardInterrupt`` itself, on 3.10 it raises the bare cancellation. Nothing else
    cancels the main task from outside (a cancel scope inside catches its own), so on 3.10,
    where the loop has that handler, a cancellation that leaves it is taken for the
    interrupt; anywhere else one is the run's own (a model's or a hook's) and is raised as
    it is. It is told once the loop is closed: raised inside, while a ``KeyboardInterrupt``
    that came straight from a signal handler has the loop cancel what is left, it would
    cut that shutdown short, and the loop's worker threads would keep the process from
    exiting.
    """
    interruptible = (
        sys.version_info < (3, 11)
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    cancellation: list[type[BaseException]] = []

    async def main() -> T:
        cancellation.append(anyio.get_cancelled_exc_class())
        return await work(*args)

    try:
        return anyio.run(main)
    except BaseException as error:
        if interruptible and cancellation and isinstance(error, cancellation[0]):
            raise KeyboardInterrupt from None
        raise
