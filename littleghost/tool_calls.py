"""Calling a tool: sync tools in worker threads of their own, results as the text the
model sees."""

from __future__ import annotations

import functools
import inspect
import json
import os
import re
import threading
import types
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Mapping
from typing import Any

import anyio.to_thread
from anyio.lowlevel import RunVar
from attrs import frozen

from littleghost import logs, telemetry
from littleghost._validators import digits_limit, holds_unwritable
from littleghost.blocking import waking_for_signals
from littleghost.cleanup import leaves
from littleghost.exiting import at_exit
from littleghost.messages import ToolCall, ToolResult
from littleghost.text import error_text
from littleghost.tool_types import ImageNotJson, to_json

__all__ = ["Outcome", "error_result", "invoke", "raised_text", "render_result"]

logger = logs.logger("littleghost.tools")


def render_result(value: Any) -> str:
    """A tool's return value as the text the model sees.

    Raises:
        TypeError: ``value`` is an iterator, a generator say (its items were never made),
            or holds an ``ImagePart`` (a result is text).
        ValueError: ``value`` is or holds an int with more digits than Python writes
            (``sys.set_int_max_str_digits``).
    """
    if isinstance(value, str):
        return str.__str__(value)  # a str enum member's text, not its name (Python 3.11+)
    if isinstance(value, (Iterator, AsyncIterator)):
        if isinstance(value, (types.GeneratorType, types.AsyncGeneratorType)):
            kind = "an async generator" if isinstance(value, AsyncIterator) else "a generator"
        else:
            kind = f"an iterator ({type(value).__name__})"
        raise TypeError(
            f"it returned {kind}, whose items were never made; a tool returns its whole "
            "result (a list, say)"
        )
    try:
        if not isinstance(value, (dict, list, tuple, int, float, type(None))):
            value = _result_json(value)  # an object's fields, or a value's text as it is
            if isinstance(value, str):
                return value
        try:
            return json.dumps(value, ensure_ascii=False, default=_result_json)
        except AddressOnly:
            raise
        except TypeError:  # a key JSON cannot carry (a date, a UUID, an enum): its text
            return json.dumps(_keyed(value), ensure_ascii=False, default=_result_json)
    except ImageNotJson:
        raise TypeError(
            "it returned an image, which a tool result cannot carry (a result is text); "
            "return what the model needs to know of it"
        ) from None
    except TextFailed as failed:
        raise failed.error from None
    except AddressOnly as error:
        what = "it returned" if error.value is value else "its result holds"
        raise TypeError(
            f"{what} a value of type {type(error.value).__qualname__}, whose text is only "
            f"its type and address ({error}): return what the model needs to know of it "
            "(a str, a dict, a dataclass, an attrs or pydantic class, or an object with a "
            "__str__ of its own)"
        ) from None
    except (TypeError, ValueError, RecursionError):
        pass
    try:
        return _text(value)
    except ValueError:
        if not isinstance(value, int) and not holds_unwritable(value):
            raise
        raise ValueError(
            f"it returned {'an int' if isinstance(value, int) else 'a result holding an int'} "
            f"of more than {digits_limit()} digits, more than Python writes as text "
            "(sys.set_int_max_str_digits sets the limit)"
        ) from None


class AddressOnly(TypeError):
    """A ``value`` whose text is only its type and address (``<Order object at
    0x7f...>``, an object without a ``__str__`` of its own, a function or method):
    nothing the model could read."""

    def __init__(self, value: Any, text: str) -> None:
        super().__init__(text)
        self.value = value


class TextFailed(Exception):
    """The ``str()`` of a value in a result raised ``error``: the tool's failure, not a
    reason to fall back on Python's text of the whole result (``repr`` of that value,
    its type and address)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error


_ADDRESS_ONLY = re.compile(r"<.* at 0x[0-9a-fA-F]+>+", re.DOTALL)  # a bound method: >>


def _text(value: Any) -> str:
    """``str(value)``, unless that says only its type and address (``AddressOnly``)."""
    text = str(value)
    if _ADDRESS_ONLY.fullmatch(text):
        raise AddressOnly(value, text)
    return text


def _result_json(value: Any) -> Any:
    """What ``to_json`` makes of ``value`` (a date or time in ISO 8601, a ``Decimal`` or a
    ``UUID`` as its schema's string), else its ``str()`` (a path): one such value no
    longer turns the whole result into Python's repr. A ``str()`` that raises is
    ``TextFailed``."""
    converted = to_json(value)
    if converted is not value:
        return converted
    try:
        return _text(value)
    except AddressOnly:
        raise
    except Exception as error:
        raise TextFailed(error) from None


def _keyed(value: Any) -> Any:
    """``value`` as ``_result_json`` makes it, all through, each key JSON cannot carry
    made its text (``_result_json``'s when that is one, else its ``str()``).

    Raises:
        ValueError: two keys of a dict have one text (an enum member whose value is
            ``"1"`` and ``"1"``): one item would be lost.
    """
    if isinstance(value, dict):
        keyed = {_key(key): _keyed(item) for key, item in value.items()}
        if len(keyed) < len(value):
            raise ValueError("two keys of a dict have one text")
        return keyed
    if isinstance(value, (list, tuple)):
        return [_keyed(item) for item in value]
    if isinstance(value, (str, int, float, type(None))):
        return value
    return _keyed(_result_json(value))


def _key(key: Any) -> Any:
    if isinstance(key, (str, int, float, type(None))):
        return key
    converted = _result_json(key)
    return converted if isinstance(converted, (str, int, float, type(None))) else _text(key)


_TOOL_THREADS = 64
"""How many sync tool calls are waited for at once in each event loop; more calls wait
for a turn.

A call's turn ends when the run stops waiting for it (its timeout, a cancellation), not
when its thread returns: a thread that hangs costs that one thread, never the turns of
other calls, under asyncio and trio alike. Each call has a worker thread of its own
(not anyio's default limiter), so such threads never hold up the session store either.
"""

_TOOL_LIMITER: RunVar[anyio.CapacityLimiter] = RunVar("littleghost_tool_threads")


def _tool_threads() -> anyio.CapacityLimiter:
    """The limiter of sync tool threads of the running event loop."""
    limiter = _TOOL_LIMITER.get(None)
    if limiter is None:
        limiter = anyio.CapacityLimiter(_TOOL_THREADS)
        _TOOL_LIMITER.set(limiter)
    return limiter


@frozen
class Outcome:
    """What a tool call returned, or raised."""

    value: Any = None
    raised: BaseException | None = None
    rendered: str | None = None
    """The value's text, or what it raised as :func:`raised_text` tells it, made in a sync
    tool's worker thread (``None``: not made yet)."""
    recorded: Mapping[str, str] | None = None
    """The ``exception`` span event of what it raised, made there too when content is
    captured (its message and traceback are content)."""

    def text(self) -> str:
        """The returned value as the text the model sees, or raise what the tool raised.

        Raised here, in the caller's own frame: passed up through a coroutine, a
        ``StopIteration`` would turn into a ``RuntimeError``.
        """
        if self.raised is not None:
            raise self.raised
        return render_result(self.value) if self.rendered is None else self.rendered


async def invoke(
    function: Callable[..., Any],
    kwargs: dict[str, Any],
    name: str,
    *,
    capture_content: bool = False,
) -> Outcome:
    """Call a tool: what it returned, or what a sync tool raised (an async tool's
    exception is raised).

    A sync tool runs in a worker thread (at most ``_TOOL_THREADS`` at once) that cannot
    be stopped: when the caller stops waiting (cancellation, a timeout), the thread runs
    on, and whatever it finally returns or raises is discarded with one log line naming
    the tool ``name``. Its outcome comes back boxed, as the backends would not pass it
    whole (a ``StopIteration``, a ``GeneratorExit``, or a coroutine under trio); an
    awaitable it returns (a sync decorator around an async function, say) is awaited, as
    a coroutine an async tool returns is. The texts of a sync tool's value or exception
    are made in its thread too (``capture_content``: the exception's span event's).
    """
    if inspect.iscoroutinefunction(function):
        value = await function(**kwargs)
        if inspect.iscoroutine(value):  # an ``await`` left out of its return statement
            value = await value
        return Outcome(value)
    outcome = await _in_thread(functools.partial(function, **kwargs), name, capture_content)
    if inspect.isawaitable(outcome.value):
        return Outcome(await outcome.value)
    return outcome


_LEFT: set[_ThreadCall] = set()
"""Calls the runs stopped waiting for, still running in threads the interpreter's exit
waits for (not daemon threads: asyncio's, under anyio; trio's are)."""
_LEFT_GUARD = threading.Lock()


def _say_what_the_exit_waits_for() -> None:
    """As the interpreter exits: name the calls it waits for (it seems to hang else)."""
    with _LEFT_GUARD:
        names = sorted(call.name for call in _LEFT)
    if names:
        logger.warning(
            "the process waits to exit until %d sync tool call%s that stopped runs left "
            "running return%s (a thread cannot be stopped): %s",
            len(names),
            "" if len(names) == 1 else "s",
            "s" if len(names) == 1 else "",
            ", ".join(repr(name) for name in names),
        )


at_exit(_say_what_the_exit_waits_for)
if hasattr(os, "register_at_fork"):  # a forked child has none of its parent's threads
    os.register_at_fork(after_in_child=_LEFT.clear)


class _ThreadCall:
    """One sync tool call in a worker thread, and whether its caller stopped waiting."""

    def __init__(self, call: Callable[[], Any], name: str, capture_content: bool) -> None:
        self.call: Callable[[], Any] | None = call
        self.name = name
        self.capture_content = capture_content
        self.lock = threading.Lock()
        self.abandoned = False
        self.outcome: str | None = None  # "returned" or "raised ...", once finished
        self.coroutine: Coroutine[Any, Any, Any] | None = None
        """A coroutine the call returned, closed if nobody will await it."""
        self.holds_exit = False
        """Whether its thread is one the interpreter's exit waits for, once it runs."""

    def run(self) -> Outcome:
        """Run in the worker thread, which keeps nothing of the call once it is done (the
        tool's bound method would keep its agent alive while the thread winds down)."""
        call, self.call = self.call, None
        assert call is not None
        self.holds_exit = not threading.current_thread().daemon
        try:
            value = call()
            # its text too: a slow ``str()`` (a big table's) holds no event loop
            rendered = None if inspect.isawaitable(value) else render_result(value)
        except BaseException as error:
            told = raised_text(error)  # an exception's ``str()`` may be as slow
            recorded = telemetry.exception_event(error) if self.capture_content else None
            self.finish(f"raised {type(error).__name__}")
            return Outcome(raised=error, rendered=told, recorded=recorded)
        self.finish("returned", value)
        return Outcome(value, rendered=rendered)

    def finish(self, outcome: str, value: object = None) -> None:
        with self.lock:
            self.outcome = outcome
            self.coroutine = value if inspect.iscoroutine(value) else None
            late = self.abandoned
        if late:
            with _LEFT_GUARD:
                _LEFT.discard(self)
            self.discarded(outcome)

    def abandon(self) -> None:
        """The caller stopped waiting; log now if the call had already finished."""
        with self.lock:
            self.abandoned = True
            outcome = self.outcome
            if outcome is None and self.holds_exit:
                with _LEFT_GUARD:
                    _LEFT.add(self)
        if outcome is not None:
            self.discarded(outcome)

    def discarded(self, outcome: str) -> None:
        if self.coroutine is not None:  # else "never awaited", when it is collected
            self.coroutine.close()
        logger.warning(
            "tool %r: a call the run stopped waiting for has %s; its late result was discarded",
            self.name,
            outcome,
        )


async def _in_thread(call: Callable[[], Any], name: str, capture_content: bool) -> Outcome:
    thread_call = _ThreadCall(call, name, capture_content)
    async with _tool_threads():  # the turn ends when we stop waiting, whatever the thread does
        try:
            async with anyio.create_task_group() as waking:
                waking.start_soon(waking_for_signals)
                outcome: Outcome = await anyio.to_thread.run_sync(
                    thread_call.run, abandon_on_cancel=True, limiter=anyio.CapacityLimiter(1)
                )
                waking.cancel_scope.cancel()
        except BaseException:  # the thread never raises: we stopped waiting for it
            thread_call.abandon()
            raise
        return outcome


def raised_text(error: BaseException) -> str:
    """What a tool (or a parameter's class) raised, as the model is told it: each
    exception of a group."""
    failures = leaves(error)
    if len(failures) == 1:
        return error_text(failures[0])
    told = "; ".join(error_text(failure) for failure in failures)
    return f"{error_text(error)}: {told}"


def error_result(call: ToolCall, text: str) -> ToolResult:
    """An error result for ``call`` that the model sees."""
    return ToolResult(call.id, text, True)
