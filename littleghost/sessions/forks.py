"""In-process session state a process ``fork()`` made starts without: what the parent's
threads held (session locks, file-lock records, pool slots) is not the child's, as those
threads are not in it."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable
from typing import TypeVar

__all__ = ["reset_in_child"]

T = TypeVar("T")


def reset_in_child(reset: Callable[[T], None]) -> weakref.WeakSet[T]:
    """A set to add objects to; in a process ``fork()`` makes, ``reset(each)`` is called
    for each of them (never on a system without ``fork``)."""
    objects: weakref.WeakSet[T] = weakref.WeakSet()

    def reset_all() -> None:
        for each in list(objects):
            reset(each)

    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=reset_all)
    return objects
