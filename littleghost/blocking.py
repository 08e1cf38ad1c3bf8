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
    cancellation from another and raises the bare ``CancelledError``. Nothing else
    cancels the main task from outside (a cancel scope inside catches its own), so a
    cancellation that reaches its top is the interrupt, raised as such on every Python.
    """

    async def main() -> T:
        try:
            return await work(*args)
        except anyio.get_cancelled_exc_class():
            raise KeyboardInterrupt from None

    return anyio.run(main)
