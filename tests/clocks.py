"""Virtual clocks for both anyio backends: time stands still while tasks compute and
jumps to the next timer whenever every task waits (trio's ``MockClock`` with an autojump
threshold of 0, and an asyncio event loop doing the same).

For tests whose claim is a time a run keeps (when its cleanup is cut, say): on such a
clock the times are exact, however loaded the machine, and waiting for them takes no
real time. Not for tests whose tasks wait for threads or processes: the clock jumps
meanwhile. An async test marked ``virtual_clock`` runs on one (``tests/conftest.py``).
"""

from __future__ import annotations

import asyncio
import selectors
from typing import Any

from trio.testing import MockClock


class _Jumping(selectors.DefaultSelector):
    """A selector whose wait for the loop's next timer, when nothing is ready, moves the
    loop's clock (``now``) to that timer instead."""

    def __init__(self) -> None:
        super().__init__()
        self.now = 0.0

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:  # no timer: wait for a thread or a file, in real time
            return super().select(None)
        self.now += timeout
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio event loop on a virtual clock that starts at 0."""

    def __init__(self) -> None:
        self._jumping = _Jumping()
        super().__init__(self._jumping)

    def time(self) -> float:
        return self._jumping.now

    async def shutdown_default_executor(self, timeout: float | None = None) -> None:
        """Wait for the default executor's threads without a timeout: ``asyncio.run``
        gives one (300 s, from Python 3.12), which this clock would pass at once, failing
        the test as its loop closes while a thread (a name lookup, say) still ends."""
        await super().shutdown_default_executor()


def virtual(backend: str) -> tuple[str, dict[str, Any]]:
    """``backend`` ("asyncio" or "trio") on a virtual clock of its own, as an
    ``anyio_backend`` fixture gives it."""
    if backend == "asyncio":
        return "asyncio", {"loop_factory": VirtualTimeLoop}
    return "trio", {"clock": MockClock(autojump_threshold=0)}
