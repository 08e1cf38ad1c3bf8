"""Reading a provider's JSON (an answer's body, a stream's event): an int of more digits
than Python reads (``sys.set_int_max_str_digits``) in a usage object is a count that
cannot be read, as a string or a negative one is, not a failed answer; elsewhere it is
Python's ``ValueError``, which ``error_mapper`` makes a ``ProviderError``
(``integer_too_long``).

The SDKs parse a body not streamed themselves: ``keeping_answers`` keeps the HTTP
responses of its block (``keep_answer``, a response hook of the SDK's HTTP client), so
that a body the SDK could not read for such an int is read here instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

__all__ = ["answer_json", "keep_answer", "keeping_answers", "too_long"]


class _UnreadableInt:
    """What an int of more digits than Python reads is read as: no count (not an int)."""

    def __repr__(self) -> str:
        return "_UNREADABLE"


_UNREADABLE = _UnreadableInt()
"""The value an int too long to read has in what ``answer_json`` gives."""

_USAGE = "usage"
"""The key of the objects whose ints may be too long to read: usage counts."""


def too_long(error: BaseException) -> bool:
    """Whether ``error`` is Python's for an int of more digits than it reads."""
    return type(error) is ValueError and "integer string conversion" in str(error)


def answer_json(text: str | bytes) -> Any:
    """``text``, a provider's JSON, read; an int too long to read is ``_UNREADABLE``
    in a usage object (``_outside_usage``). Read as ``json.loads`` reads it, unless it holds
    such an int: then read again, each int by a callback (twice the time a stream's
    events take to read, were every event read so).

    Raises:
        ValueError: Python's, for such an int elsewhere; and ``json.loads``'s errors.
    """
    try:
        return json.loads(text)
    except ValueError as error:
        if not too_long(error):
            raise
    unread: list[ValueError] = []

    def read_int(digits: str) -> object:
        try:
            return int(digits)
        except ValueError as error:  # past the limit (the digits are JSON's)
            unread.append(error)
            return _UNREADABLE

    value = json.loads(text, parse_int=read_int)
    if unread and _outside_usage(value):
        raise unread[0]
    return value


def _outside_usage(value: object) -> bool:
    """Whether ``_UNREADABLE`` is in ``value`` but in a usage object: one under the key
    ``usage`` of ``value`` or of an object ``value`` holds (an event's ``message``), where
    the APIs send usage; a tool's input holding the key is no usage object."""
    left: list[tuple[object, int]] = [(value, 0)]
    while left:
        item, depth = left.pop()
        if item is _UNREADABLE:
            return True
        if isinstance(item, Mapping):
            for key, each in item.items():
                if key != _USAGE or depth > 1:
                    left.append((each, depth + 1))
        elif isinstance(item, list):
            left.extend((each, depth + 1) for each in item)
    return False


_KEPT: ContextVar[list[Any] | None] = ContextVar("littleghost_kept_answers", default=None)


@contextmanager
def keeping_answers() -> Iterator[list[Any]]:
    """A list holding the last HTTP response the block's requests got (``keep_answer``
    puts it there)."""
    kept: list[Any] = []
    token = _KEPT.set(kept)
    try:
        yield kept
    finally:
        _KEPT.reset(token)


async def keep_answer(response: Any) -> None:
    """A response hook: ``response`` kept for the ``keeping_answers`` block around."""
    kept = _KEPT.get()
    if kept is not None:
        kept[:] = [response]
