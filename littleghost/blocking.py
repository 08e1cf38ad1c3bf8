"""Async work run to its end from synchronous code, in an event loop of its own."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager, nullcontext
from types import FrameType
from typing import Any, TypeVar

import anyio

T = TypeVar("T")

WAKE = 0.25
"""Seconds between the event loop's wake-ups while nothing else may wake it.

Python runs a signal's handler (Ctrl-C's) in the main thread, at its next bytecode. A
signal that lands just as an asyncio loop there goes to sleep on no timer, or that another
thread takes (a sync tool's, an exporter's), was handled only when something woke the
loop: it stopped nothing until then. (Trio's loop wakes at every signal.)
"""


async def waking_for_signals() -> None:
    """Wake the event loop every ``WAKE`` seconds, so a signal's handler runs."""
    while True:  # noqa: ASYNC110 - the wake-ups are the point: it waits for nothing
        await anyio.sleep(WAKE)


def run_blocking(work: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``work(*args)`` run in a new event loop; Ctrl-C raises ``KeyboardInterrupt``.

    The loop wakes every ``WAKE`` seconds while the work lasts, so that the interrupt's
    handler runs however the signal landed.

    The loop's interrupt handler (the loop installs it in the main thread only, over
    Python's own) cancels the main task; on Python 3.11 and later the loop turns that into
    ``KeyboardInterrupt`` itself, on 3.10 it raises the bare cancellation. There, where the
    loop has that handler, a cancellation that leaves it after an interrupt came (its
    handler notes them) is taken for the interrupt; any other is the run's own (a model's
    or a hook's, which was taken for Ctrl-C) and is raised as it is. It is told once the
    loop is closed: raised inside, while a ``KeyboardInterrupt`` that came straight from a
    signal handler has the loop cancel what is left, it would cut that shutdown short, and
    the loop's worker threads would keep the process from exiting.
    """
    interruptible = (
        sys.version_info < (3, 11)
        and threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    )
    cancellation: list[type[BaseException]] = []
    interrupts: list[int] = []

    async def main() -> T:
        cancellation.append(anyio.get_cancelled_exc_class())
        done: list[T] = []
        failed: list[BaseException] = []
        with _noting(interrupts) if interruptible else nullcontext():
            async with anyio.create_task_group() as waking:
                waking.start_soon(waking_for_signals)
                try:
                    done.append(await work(*args))
                except BaseException as error:  # raised as it is, not in the group's
                    failed.append(error)
                waking.cancel_scope.cancel()
        if failed:
            raise failed.pop()
        return done.pop()

    try:
        return anyio.run(main)
    except BaseException as error:
        if interrupts and isinstance(error, cancellation[0]):
            raise KeyboardInterrupt from None
        raise


@contextmanager
def _noting(interrupts: list[int]) -> Iterator[None]:
    """For the block, the loop's interrupt handler (in the main thread) also notes each
    interrupt in ``interrupts``; the loop's own is back afterwards, for the loop to
    remove."""
    handler = signal.getsignal(signal.SIGINT)
    if not callable(handler):  # the loop installed none (a signal set to be ignored)
        yield
        return

    def noting(number: int, frame: FrameType | None) -> None:
        interrupts.append(number)
        handler(number, frame)

    signal.signal(signal.SIGINT, noting)
    try:
        yield
    finally:
        if signal.getsignal(signal.SIGINT) is noting:  # none of the work's own since
            signal.signal(signal.SIGINT, handler)
