"""Async work run to its end from synchronous code, in an event loop of its own."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

T = TypeVar("T")


def run_blocking(work: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``work(*args)`` run in a new event loop; Ctrl-C raises ``KeyboardInterrupt``.

    The loop's interrupt handler cancels the main task, and on Python 3.11 and later the
    loop turns that into ``KeyboardInterrupt``; on 3.10 it cannot tell the interrupt's
    cancellation from another and raises the bare cancellation. Nothing else cancels the
    main task from outside (a cancel scope inside catches its own), so a cancellation
    that leaves the loop is the interrupt, raised as such on every Python. It is told
    once the loop is closed: raised inside, while a ``KeyboardInterrupt`` that came
    straight from a signal handler has the loop cancel what is left, it would cut that
    shutdown short, and the loop's worker threads would keep the process from exiting.
    """
    cancellation: list[type[BaseException]] = []

    async def main() -> T:
        cancellation.append(anyio.get_cancelled_exc_class())
        return await work(*args)

    try:
        return anyio.run(main)
    except BaseException as error:
        if cancellation and isinstance(error, cancellation[0]):
            raise KeyboardInterrupt from None
        raise
