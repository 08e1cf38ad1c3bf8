"""The context window a server reports from ``GET /models``, read once per model.

``OpenAIModel`` and ``AnthropicModel`` ask a server other than their provider's own API
(llama.cpp, vLLM, a gateway) for its window when they are given none; a failure, a
silence past the timeout or an answer without a window only leaves it unknown, for good
but for a server that could not answer yet (``for_now``, for ``UNREADY_LIMIT`` seconds):
it is asked again.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping

import anyio

from littleghost._validators import is_token_count
from littleghost.errors import ProviderError
from littleghost.models._loops import LoopClients, Signal
from littleghost.models._sdk import ABSENT
from littleghost.sessions.forks import reset_in_child

__all__ = ["MODELS_TIMEOUT", "ServedWindow", "for_now", "reported_window"]

MODELS_TIMEOUT = 3.0
"""Seconds ``prepare()`` waits for another server's ``GET /models`` before doing without."""
UNREADY_LIMIT = 300.0
"""Seconds, from its first such failure, that a server which could not answer yet
(``for_now``) is asked again before each run; then its window is left unknown for good
(a gateway that always answers ``GET /models`` with a 5xx is not asked every run)."""
_UNREACHED = ("connection_error", "connection_lost")
"""The codes of a ``GET /models`` that did not reach the server, or lost it
(``transport_error``)."""


def reported_window(body: object, model: str) -> int | None:
    """The window a ``GET /models`` body reports for ``model``, if any.

    The entry whose ``id`` is ``model`` (or the only entry) is read: ``meta.n_ctx``
    (llama.cpp), ``max_model_len`` (vLLM), ``context_length`` (OpenRouter and others) or
    ``context_window`` (Groq); a figure that is not a count of tokens (``is_token_count``:
    past 2**63-1, say) is none.
    """
    data = body.get("data") if isinstance(body, Mapping) else None
    entries = [item for item in data if isinstance(item, Mapping)] if isinstance(data, list) else []
    entry = next((entry for entry in entries if entry.get("id") == model), None)
    if entry is None and len(entries) == 1:
        entry = entries[0]
    if entry is None:
        return None
    meta = entry.get("meta")
    figures = (
        meta.get("n_ctx") if isinstance(meta, Mapping) else None,
        entry.get("max_model_len"),
        entry.get("context_length"),
        entry.get("context_window"),
    )
    return next((figure for figure in figures if is_token_count(figure)), None)


def for_now(error: ProviderError | None) -> bool:
    """Whether a failed ``GET /models`` (``error``, as the model maps it) says only that
    the server cannot answer yet: a refused connection, a 5xx (llama.cpp's 503 while it
    loads its model), a 429. A timeout is not (asked again, a silent server would hold
    each run's start that long), nor a 4xx or a 501 (no such endpoint, a key without
    access) or a body that is no JSON."""
    if error is None or error.status is None:
        return error is not None and error.code in _UNREACHED
    absent = error.status in ABSENT  # a 501: no such endpoint
    return (error.status >= 500 and not absent) or error.status == 429


class ServedWindow:
    """The window one model's server reports (``window``, ``None`` until read or when it
    gives none), read once, or again after a failure ``for_now`` (for ``UNREADY_LIMIT``
    seconds at most).

    Args:
        provider: The model's provider, for the log.
        model: The model's name: the entry of the list to read, and for the log.
        ask: Whether to ask the server at all (not when the window is given, nor of
            the provider's own API).
        logger: Where a failed read is logged, at DEBUG.
    """

    def __init__(self, provider: str, model: str, *, ask: bool, logger: logging.Logger) -> None:
        self.window: int | None = None
        self._provider = provider
        self._model = model
        self._logger = logger
        self._read = not ask
        self._asked = 0  # the answers (or failures) the server gave so far
        self._unready_since: float | None = None  # its first failure for_now, monotonic
        self._probing: Signal | None = None
        self._lock = threading.Lock()
        _WINDOWS.add(self)

    def _forget_in_child(self) -> None:
        """In a process ``fork()`` made: a window another thread of the parent was
        reading is not read here (its waiters would wait for good); the child reads it."""
        self._lock = threading.Lock()
        self._probing = None

    async def read(
        self,
        clients: LoopClients,
        path: str,
        timeout: float,
        mapped: Callable[[Exception], ProviderError | None],
    ) -> None:
        """Read the window from ``GET path`` through the running event loop's client of
        ``clients``, unless it was read; concurrent callers, in any event loop or
        thread, wait for the one reading it and go on with what it read. ``timeout``: the
        longest wait, in seconds; ``mapped``: the model's ``ProviderError`` for what the
        SDK raised, read by ``for_now``.
        """
        while not self._read:
            with self._lock:
                probing = self._probing
                mine = probing is None
                if probing is None:
                    probing = self._probing = Signal()
                asked = self._asked
            if not mine:
                await probing.wait()
                if self._asked != asked:
                    return  # its answer stands for this call too
                continue  # its reader was stopped before an answer
            try:
                self.window, self._read = await self._ask(clients, path, timeout, mapped)
                self._asked += 1
                return
            finally:
                with self._lock:
                    self._probing = None
                probing.set()

    async def _ask(
        self,
        clients: LoopClients,
        path: str,
        timeout: float,
        mapped: Callable[[Exception], ProviderError | None],
    ) -> tuple[int | None, bool]:
        """The server's figure, ``None`` (logged) when it gives none in time; and whether
        that settles it (not after a failure ``for_now``)."""
        body: object = None
        client = await clients.get()
        with anyio.move_on_after(timeout) as scope:
            try:
                body = await client.get(path, cast_to=object)
            except Exception as error:  # cancellation is not an Exception: it propagates
                again = for_now(mapped(error)) and self._still_loading()
                self._logger.debug(
                    "%s: GET /models for %r failed (%s); its window is not read from the server%s",
                    self._provider,
                    self._model,
                    type(error).__name__,
                    ", asked again before the next run" if again else "",
                )
                return None, not again
        if scope.cancelled_caught:
            self._logger.debug(
                "%s: GET /models for %r got no answer within %g s; its window is not read "
                "from the server",
                self._provider,
                self._model,
                timeout,
            )
            return None, True
        window = reported_window(body, self._model)
        if window is None:
            self._logger.debug(
                "%s: GET /models reports no window for %r", self._provider, self._model
            )
        return window, True

    def _still_loading(self) -> bool:
        """Whether a server that could not answer yet is worth asking again: not once
        ``UNREADY_LIMIT`` seconds have passed since the first time it could not."""
        now = time.monotonic()
        if self._unready_since is None:
            self._unready_since = now
        return now - self._unready_since < UNREADY_LIMIT


_WINDOWS = reset_in_child(ServedWindow._forget_in_child)
