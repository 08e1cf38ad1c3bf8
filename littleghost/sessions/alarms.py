"""Alarms on the real clock for work in worker threads, all timed by one thread (a
``threading.Timer`` for each store call, a thread started and ended per call, made a
short PostgreSQL load a quarter slower)."""

from __future__ import annotations

import itertools
import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from littleghost import logs
from littleghost.sessions.forks import reset_in_child

__all__ = ["after"]

logger = logs.logger(__name__)

_Due = OrderedDict[int, tuple[float, Callable[[], None]]]


class _Alarms:
    """Actions due at times on the real clock, each called once in the alarms' thread
    unless cancelled first."""

    def __init__(self) -> None:
        self._forget_in_child()

    def _forget_in_child(self) -> None:
        """Also in a process ``fork()`` made: the parent's alarms are its calls', and its
        thread is not in the child."""
        self._changed = threading.Condition(threading.Lock())
        self._due: dict[float, _Due] = {}
        """By delay, each in the order set, so its first is its earliest; a delay with
        no alarm left goes (a store's delay is its timeouts': one per configuration)."""
        self._keys = itertools.count()
        self._watching = False

    def after(self, seconds: float, action: Callable[[], None]) -> Callable[[], None]:
        """Call ``action`` (which must not block) ``seconds`` from now; returns what
        cancels it."""
        key = next(self._keys)
        with self._changed:
            due = self._due.setdefault(seconds, OrderedDict())
            due[key] = (time.monotonic() + seconds, action)
            if not self._watching:
                self._watching = True
                threading.Thread(target=self._watch, name="littleghost-alarms", daemon=True).start()
            elif len(due) == 1:  # earlier, maybe, than the time the thread waits for
                self._changed.notify()

        def cancel() -> None:
            with self._changed:
                due.pop(key, None)
                self._drop_if_done(seconds, due)

        return cancel

    def _drop_if_done(self, seconds: float, due: _Due) -> None:
        """Forget the delay ``seconds`` once ``due``, its alarms, has none left."""
        if not due and self._due.get(seconds) is due:
            del self._due[seconds]

    def _watch(self) -> None:
        while True:
            with self._changed:
                fired = self._fired(time.monotonic())
                if not fired:
                    firsts = [next(iter(due.values()))[0] for due in self._due.values()]
                    self._changed.wait(min(firsts) - time.monotonic() if firsts else None)
                    continue
            for action in fired:
                try:
                    action()
                except Exception as error:  # the thread goes on for the other alarms
                    logger.warning("an alarm failed (%s)", type(error).__name__)

    def _fired(self, now: float) -> list[Callable[[], None]]:
        fired = []
        for seconds, due in list(self._due.items()):
            while due and next(iter(due.values()))[0] <= now:
                fired.append(due.popitem(last=False)[1][1])
            self._drop_if_done(seconds, due)
        return fired


_ALARMS = _Alarms()
reset_in_child(_Alarms._forget_in_child).add(_ALARMS)
after = _ALARMS.after
