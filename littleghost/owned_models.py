"""The models an agent makes from model strings: one per string, shared by its runs, and
closed by ``aclose()`` once no run uses them; only the ``KEPT_MODELS`` strings used last
are kept (an agent whose model string changes per tenant keeps no client per tenant)."""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterable

import anyio

from littleghost import logs
from littleghost.cleanup import close_leaving
from littleghost.errors import CleanupError, DeadlineExceededError
from littleghost.models.base import Model
from littleghost.models.registry import resolve

__all__ = ["KEPT_MODELS", "OwnedModels", "close_models"]

KEPT_MODELS = 8
"""The most model strings an agent keeps a model of: the model of one used less lately is
given up (closed as its last use ends), and made anew if the string comes back."""

logger = logs.logger("littleghost.cleanup")

_LOCK = threading.Lock()
"""Held while an agent looks up, makes, uses or gives up a model (threads share agents)."""


def _unheld_in_child() -> None:
    """In a process ``fork()`` made: a thread of the parent may have held ``_LOCK`` (making
    a model, which takes the provider's factory's time), and it is not in the child to
    release it: every run there waited for it, for good."""
    global _LOCK
    _LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_unheld_in_child)


class OwnedModels:
    """An agent's models made from model strings, and the uses of each in flight."""

    def __init__(self) -> None:
        self._by_string: dict[str, Model] = {}
        self._uses: dict[int, int] = {}
        """Uses in flight, by ``id`` of the model."""
        self._closing: dict[int, Model] = {}
        """Models to close when their last use ends, by ``id``."""
        self._dropping: dict[int, Model] = {}
        """Models given up for strings used more lately, to close when their last use
        ends, by ``id``: no run asked for it, so a failure is logged, not raised."""
        self._retired: list[Model] = []
        """Models given up for strings used more lately that no use held: to close so."""
        self._strings: dict[int, tuple[weakref.ref[Model], str]] = {}
        """The string each live model made here was made from, by ``id`` (the reference
        tells the model from a later object under its ``id``)."""

    def get(self, declared: str) -> Model:
        """The model of ``declared``, made the first time (threads asking at once share
        it)."""
        with _LOCK:
            return self._current(declared)

    def _current(self, declared: str) -> Model:
        """The model of ``declared`` (``_LOCK`` held), now the string used last; the model
        of the string used least lately is given up when more than ``KEPT_MODELS`` are."""
        model = self._by_string.pop(declared, None)
        if model is None:
            model = resolve(declared)
            self._remember(model, declared)
        self._by_string[declared] = model  # in the order they were used, the last last
        while len(self._by_string) > KEPT_MODELS:
            oldest = self._by_string.pop(next(iter(self._by_string)))
            if self._uses.get(id(oldest)):
                self._dropping[id(oldest)] = oldest
            else:
                self._retired.append(oldest)
        return model

    def _remember(self, model: Model, declared: str) -> None:
        """Note that ``model`` was made from ``declared`` (``_LOCK`` held), forgetting the
        models gone since; one that takes no weak reference is not noted."""
        self._strings = {key: made for key, made in self._strings.items() if made[0]()}
        with contextlib.suppress(TypeError):
            self._strings[id(model)] = (weakref.ref(model), declared)

    def _made_from(self, model: Model) -> str | None:
        """The string ``model`` was made from here (``_LOCK`` held), else ``None``."""
        made = self._strings.get(id(model))
        return made[1] if made is not None and made[0]() is model else None

    def give_up(self) -> list[Model]:
        """Forget every model (the next use makes a new one); those no use holds are
        returned to be closed now, the others are closed as their last use ends."""
        with _LOCK:
            models, self._by_string = list(self._by_string.values()), {}
            self._closing.update(self._dropping)  # closed as aclose() closes the others
            self._dropping = {}
            for model in models:
                if self._uses.get(id(model)):
                    self._closing[id(model)] = model
            unused = [model for model in models if id(model) not in self._closing]
            retired, self._retired = self._retired, []
            return [*retired, *unused]

    def close_after_use(self, model: Model) -> Model:
        """Have ``model``, made for one use, closed as that use ends."""
        with _LOCK:
            self._closing[id(model)] = model
        return model

    @contextlib.asynccontextmanager
    async def use(
        self,
        model: Model,
        grace: float,
        *,
        by: Callable[[], float] = lambda: math.inf,
        declared: str | None = None,
    ) -> AsyncIterator[Model]:
        """Use ``model`` for the block, and yield it (``model`` made from ``declared``,
        or made here from a string without it, and given up since, by ``aclose()`` or
        the runs of other strings in another thread, the model of that string now in its
        place). When it is the last use of a model given up meanwhile, the
        model is closed as the block ends (``close_models`` with ``grace``, not past the
        time ``by()``), failing with ``CleanupError`` (unless the caller's
        cancellation came meanwhile: that goes on); leaving by an exception, that
        exception goes on (a deadline's with the failure as its cause). Models given up
        for strings used more lately are closed as their last use ends, or with it when
        no use holds them; a failure to close those is logged, not raised: no run asked
        for it."""
        with _LOCK:
            if declared is None:  # handed out earlier (a resolve_model() calling super()'s)
                declared = self._made_from(model)
            if declared is not None:
                model = self._current(declared)
            self._uses[id(model)] = self._uses.get(id(model), 0) + 1
        try:
            yield model
        except BaseException as error:
            closing, dropped = self._ended(model)
            try:
                if closing:
                    close = functools.partial(close_models, closing, grace, by=by())
                    failure = await close_leaving(close, "closing the run's model", error)
                    if failure and isinstance(error, DeadlineExceededError):
                        error.__cause__ = error.__cause__ or failure  # what cleanup could not do
            finally:
                await _close_dropped(dropped, grace, by())
            raise
        closing, dropped = self._ended(model)
        try:
            if closing:  # the caller's cancellation meanwhile goes on first
                close = functools.partial(close_models, closing, grace, by=by())
                await close_leaving(close, "closing the run's model", None)
        finally:
            await _close_dropped(dropped, grace, by())

    def _ended(self, model: Model) -> tuple[list[Model], list[Model]]:
        """End one use of ``model``; the models to close now: it when that was the last
        use of a model to close, and, apart, those given up for strings used more lately
        (it among them when that was its last use)."""
        with _LOCK:
            dropped, self._retired = self._retired, []
            left = self._uses.pop(id(model)) - 1
            if left:
                self._uses[id(model)] = left
                return [], dropped
            if self._closing.pop(id(model), None) is not None:
                return [model], dropped
            if self._dropping.pop(id(model), None) is not None:
                dropped.append(model)
            return [], dropped


async def _close_dropped(models: list[Model], grace: float, by: float) -> None:
    """Close ``models``, given up for model strings used more lately, as ``close_models``
    does; a failure is logged (its type only), not raised: the run closing them is of
    another string, or did not ask for it."""
    if not models:
        return
    try:
        await close_models(models, grace, by=by)
    except CleanupError as failure:
        cause = type(failure.__cause__).__name__
        logger.warning(
            "closing %d model(s) of model strings used less lately failed (%s)", len(models), cause
        )


async def close_models(models: Iterable[Model], grace: float, *, by: float = math.inf) -> None:
    """Close ``models``, shielded from cancellation for at most ``grace`` seconds and not
    past the time ``by``; ``CleanupError`` if any failed or the time ran out."""
    errors: list[BaseException] = []
    with anyio.CancelScope(shield=True, deadline=min(anyio.current_time() + grace, by)) as scope:
        for model in models:
            close = getattr(model, "aclose", None)
            if close is None:
                continue
            try:
                await close()
            except Exception as error:
                errors.append(error)
    if scope.cancelled_caught:
        errors.append(TimeoutError("closing models did not finish within the cleanup grace"))
    if errors:
        raise CleanupError(f"closing {len(errors)} model(s) failed") from errors[0]
