"""Model state used from several event loops and threads (each ``run_sync`` call runs an
event loop of its own): an SDK client per event loop, and a signal any loop can wait for.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import AsyncGenerator, Callable
from typing import Any

import anyio
from anyio.lowlevel import RunVar

from littleghost import logs
from littleghost.errors import ConfigurationError

__all__ = ["LoopClients", "Signal"]

_POLL = 0.05
"""Seconds between looks at a ``Signal`` set in another event loop or thread."""

logger = logs.logger(__name__)

_Clients = weakref.WeakKeyDictionary["LoopClients", Any]


class _Held:
    """An event loop's clients, and the async generator that closes them as it ends."""

    def __init__(self) -> None:
        self.clients: _Clients = weakref.WeakKeyDictionary()
        self.closer: AsyncGenerator[None, None] | None = None


_HELD: RunVar[_Held] = RunVar("littleghost_sdk_clients")


class LoopClients:
    """A model's SDK client in the running event loop: an HTTP connection belongs to the
    loop that opened it, so each loop needs a client of its own.

    The first loop to ask takes ``client``; another gets one from ``make``. A loop keeps
    its clients weakly keyed, so one dropped with its model is dropped there too, and
    closes those made here as it ends (through an async generator that every anyio,
    asyncio or trio run finalizes), so none outlives its loop.

    Args:
        client: The client the model was built with.
        make: Makes another client as ``client`` was made; ``None`` when ``client`` is
            the user's (never closed here): it then serves one event loop only.
        owner: The model's class name, for errors.
    """

    def __init__(self, client: Any, make: Callable[[], Any] | None, owner: str) -> None:
        self._first: Any = client
        self._make = make
        self._owner = owner
        self._lock = threading.Lock()

    async def get(self) -> Any:
        """The running event loop's client.

        Raises:
            ConfigurationError: The user's client is wanted in a second event loop.
        """
        clients = await _loop_clients()
        client = clients.get(self)
        if client is None:
            client = clients[self] = self._new()
        return client

    def _new(self) -> Any:
        with self._lock:
            client, self._first = self._first, None
        if client is not None:
            return client
        if self._make is None:
            raise ConfigurationError(
                f"{self._owner}: the client given with client= belongs to the event loop that "
                "first used it and cannot serve another (each run_sync() call runs its own); "
                "pass base_url/api_key instead of client=, or use the model in one event loop"
            )
        return self._make()

    async def aclose(self) -> None:
        """Close the running event loop's client, unless it is the user's; the next call
        in this loop makes a new one."""
        if self._make is None:
            return
        held = _HELD.get(None)
        client = held.clients.pop(self, None) if held is not None else None
        if client is None:
            with self._lock:
                client, self._first = self._first, None
        if client is not None:
            with anyio.CancelScope(shield=True):
                await client.close()

    @property
    def owns(self) -> bool:
        """Whether the clients are made here (and closed here)."""
        return self._make is not None


async def _loop_clients() -> _Clients:
    """The running event loop's clients, by their ``LoopClients``."""
    held = _HELD.get(None)
    if held is None:
        held = _Held()
        _HELD.set(held)
        held.closer = _closed_at_loop_end(held)  # held: collected, it would close at once
        await held.closer.asend(None)
    return held.clients


async def _closed_at_loop_end(held: _Held) -> AsyncGenerator[None, None]:
    """Waits, suspended, for its event loop to end and finalize it; then closes the
    clients ``LoopClients`` made, and lets go of them all and of itself (it refers to
    the loop), so that nothing keeps the loop."""
    try:
        yield
    finally:
        owned = [client for holder, client in held.clients.items() if holder.owns]
        held.clients.clear()
        held.closer = None
        with anyio.CancelScope(shield=True):
            for client in owned:
                try:
                    await client.close()
                except Exception as error:  # the loop is ending: nobody is left to tell
                    logger.debug(  # its type only: its text may name the base URL's secrets
                        "closing an SDK client as its event loop ended failed (%s)",
                        type(error).__name__,
                    )


class Signal:
    """A one-time signal that tasks of any event loop or thread can wait for (an
    ``anyio.Event`` belongs to one loop)."""

    def __init__(self) -> None:
        self._set = threading.Event()

    def set(self) -> None:
        """Wake every waiter, now and later."""
        self._set.set()

    async def wait(self) -> None:
        """Wait until ``set()`` is called, without touching any event loop's primitives."""
        while not self._set.is_set():  # noqa: ASYNC110 - an anyio.Event cannot cross loops
            await anyio.sleep(_POLL)
