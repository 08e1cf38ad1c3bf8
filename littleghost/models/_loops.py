"""Model state used from several event loops and threads (each ``run_sync`` call runs an
event loop of its own): an SDK client per event loop, and a signal any loop can wait for.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any

import anyio
from anyio.lowlevel import RunVar

from littleghost import logs
from littleghost.errors import ConfigurationError, ProviderError, ProviderUnavailableError

if TYPE_CHECKING:
    from littleghost.models.base import Usage

__all__ = ["CLOSED", "LoopClients", "Signal"]

CLOSED = "model_closed"
"""The ``code`` of the ``ProviderError`` of a call the model's ``aclose()`` stopped, or
that came after it."""

_LOST = frozenset({"connection_lost", "connection_error", "incomplete_stream"})
"""The codes of the errors a call gets as its client closes under it: its connection
closed (the stream cut), or refused."""

_CLOSED_CLIENT = "client has been closed"
"""What the HTTP library (httpx) says, as a ``RuntimeError``, to a request sent through a
client once closed."""

_POLL = 0.05
"""Seconds between looks at a ``Signal`` set in another event loop or thread."""

logger = logs.logger(__name__)

_Clients = weakref.WeakKeyDictionary["LoopClients", Any]


class _Held:
    """An event loop's clients, and the async generator that closes them as it ends."""

    def __init__(self) -> None:
        self.clients: _Clients = weakref.WeakKeyDictionary()
        self.made: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        """The clients made here, by ``id``: one whose model was dropped unclosed, left to
        the garbage collector, is still closed as the loop ends (collected in another
        loop, its SDK would close it there, and fail)."""
        self.closer: AsyncGenerator[None, None] | None = None


_HELD: RunVar[_Held] = RunVar("littleghost_sdk_clients")


class LoopClients:
    """A model's SDK client in the running event loop: an HTTP connection belongs to the
    loop that opened it, so each loop needs a client of its own.

    The first loop to ask takes ``client``; another gets one from ``make``. A loop keeps
    its clients weakly keyed, so one dropped with its model is dropped there too, and
    closes those made here as it ends (through an async generator that every anyio,
    asyncio or trio run finalizes), so none outlives its loop. ``aclose()`` closes the
    model for good (unless the client is the user's).

    Args:
        client: The client the model was built with.
        make: Makes another client as ``client`` was made; ``None`` when ``client`` is
            the user's (never closed here): it then serves one event loop only.
        owner: The model's class name, for errors.
        provider: The model's provider, for errors.
        model: The model's name, for errors.
    """

    def __init__(
        self, client: Any, make: Callable[[], Any] | None, owner: str, provider: str, model: str
    ) -> None:
        self._first: Any = client
        self._make = make
        self._owner = owner
        self._provider = provider
        self._model = model
        self._lock = threading.Lock()
        self._closed = False
        self._sending: set[tuple[object, anyio.CancelScope]] = set()
        """The scopes of the requests being sent (``sending``), with their event loop's
        token."""

    def check_open(self) -> None:
        """Raise the ``ProviderError`` of a call after ``aclose()``, if it came."""
        if self._closed:
            raise ProviderError(
                f"{self._provider}: the {self._owner} of {self._model!r} was closed by "
                f"aclose(), and sends no request again; make a new {self._owner}",
                code=CLOSED,
                provider=self._provider,
            )

    @contextmanager
    def stopped_by_close(self) -> Iterator[None]:
        """Raises what the block raises (a ``ProviderError`` as the model maps it, or the
        HTTP library's closed client) as a ``ProviderError`` saying that ``aclose()``
        stopped the call (not retried) when it closed the running event loop's client
        meanwhile and the call lost its connection or client; an answer the server gave
        (an overflow, a 4xx), a timeout, a cancellation, any other error, and a call in
        a loop whose client ``aclose()`` left open (it was run in another) go on as they
        are."""
        try:
            yield
        except Exception as error:
            if not (self._closed and _lost_to_close(error) and self._cut_here()):
                raise
            usage = error.usage if isinstance(error, ProviderError) else None
            raise self._stopped(usage) from error

    def _stopped(self, usage: Usage | None = None) -> ProviderError:
        """The error of a call ``aclose()`` stopped (billed ``usage``, if known)."""
        return ProviderError(
            f"{self._provider}: the call to {self._model!r} was stopped by aclose() of "
            f"its {self._owner} (not retried)",
            code=CLOSED,
            provider=self._provider,
            usage=usage,
        )

    @asynccontextmanager
    async def sending(self) -> AsyncIterator[None]:
        """The block (a request sent, until its answer or its head comes) cancelled by
        ``aclose()`` in the same event loop, and then raising the ``ProviderError`` of a
        call it stopped (after the caller's own cancellation, if one came too): closing
        the client alone let a request whose connection was being made go out, the HTTP
        library's pool closed under it, to wait for its answer."""
        scope = anyio.CancelScope()
        sent = (anyio.lowlevel.current_token(), scope)
        with self._lock:
            self._sending.add(sent)
        try:
            with scope:
                yield
        finally:
            with self._lock:
                self._sending.discard(sent)
        if scope.cancelled_caught:
            await anyio.lowlevel.checkpoint_if_cancelled()
            raise self._stopped()

    def _cut_here(self) -> bool:
        """Whether the running event loop holds no client of the model (``aclose()``
        took it)."""
        held = _HELD.get(None)
        return held is None or self not in held.clients

    async def get(self) -> Any:
        """The running event loop's client.

        Raises:
            ConfigurationError: The user's client is wanted in a second event loop.
            ProviderError: The model was closed (``aclose()``).
        """
        self.check_open()
        held = await _loop_held()
        client = held.clients.get(self)
        if client is None:
            client = held.clients[self] = self._new()
            if self.owns:
                held.made[id(client)] = client
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
        """Close the model for good, and the running event loop's client, unless the
        client is the user's (then nothing is closed): the requests this loop is sending
        are cut (``sending``); a later call, in any event loop, raises ``ProviderError``."""
        if self._make is None:
            return
        self._closed = True
        loop = anyio.lowlevel.current_token()
        with self._lock:
            for sent_in, scope in self._sending:
                if sent_in == loop:
                    scope.cancel()
        held = _HELD.get(None)
        client = held.clients.pop(self, None) if held is not None else None
        if held is not None and client is not None:
            held.made.pop(id(client), None)
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


def _lost_to_close(error: Exception) -> bool:
    """Whether ``error`` is what a call gets as its client closes under it: the
    connection lost or refused (no answer with a status), or the HTTP library's refusal
    of a request through a closed client (not mapped: raised outside the SDK's call)."""
    if isinstance(error, ProviderUnavailableError):
        return error.status is None and error.code in _LOST
    return type(error) is RuntimeError and _CLOSED_CLIENT in str(error)


async def _loop_held() -> _Held:
    """The running event loop's clients."""
    held = _HELD.get(None)
    if held is None:
        held = _Held()
        _HELD.set(held)
        held.closer = _closed_at_loop_end(held)  # held: collected, it would close at once
        await held.closer.asend(None)
    return held


async def _closed_at_loop_end(held: _Held) -> AsyncGenerator[None, None]:
    """Waits, suspended, for its event loop to end and finalize it; then closes the
    clients ``LoopClients`` made, and lets go of them all and of itself (it refers to
    the loop), so that nothing keeps the loop."""
    try:
        yield
    finally:
        owned = {id(client): client for holder, client in held.clients.items() if holder.owns}
        owned.update(held.made)  # those of models dropped unclosed, not yet collected
        held.clients.clear()
        held.made.clear()
        held.closer = None
        with anyio.CancelScope(shield=True):
            for client in owned.values():
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
