"""littleghost's loggers, whose records name the run they are emitted in.

Every record of a ``logger(name)`` has a ``littleghost`` attribute (a dict, for a JSON
formatter or ``%(littleghost)s``): the attributes a record gives there itself, and, while
a run (or ``compact_session``) goes on, the run's names (``gen_ai.agent.name``,
``gen_ai.conversation.id``). Names only, never content.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = ["current", "logger", "naming"]

_NAMES: ContextVar[Mapping[str, str] | None] = ContextVar("littleghost_log_names", default=None)


class _Names(logging.Filter):
    """A record's ``littleghost`` attribute, with the names of the run going on."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.littleghost = {**current(), **getattr(record, "littleghost", {})}
        return True


def current() -> Mapping[str, str]:
    """The names of the run going on (none outside runs)."""
    return _NAMES.get() or {}


def logger(name: str) -> logging.Logger:
    """The logger ``name``, its records naming the run they are emitted in."""
    found = logging.getLogger(name)
    if not any(isinstance(known, _Names) for known in found.filters):
        found.addFilter(_Names())
    return found


@contextmanager
def naming(names: Mapping[str, str]) -> Iterator[None]:
    """Records of littleghost's loggers carry ``names`` within (a nested run's its own)."""
    token = _NAMES.set(names)
    try:
        yield
    finally:
        _NAMES.reset(token)
