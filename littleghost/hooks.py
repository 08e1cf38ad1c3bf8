"""Hook decorators, and the chain that runs them.

A hook returns ``None`` to continue, or a value of the same kind to replace what later
hooks and the call see. Raising ends the run. Hooks may be sync or async; a hook that
declares a ``context`` parameter also receives the ``RunContext``. The order they run in
(a class's hook plan) is made by :mod:`littleghost.capabilities`; ``bind_hooks`` binds it
to an agent.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from attrs import frozen

from littleghost.errors import ConfigurationError

__all__ = [
    "HOOK_KINDS",
    "BoundHook",
    "PlanEntry",
    "after_model",
    "after_model_error",
    "after_tool",
    "before_model",
    "before_tool",
]

F = TypeVar("F", bound=Callable[..., Any])

HOOK_KINDS = ("before_model", "after_model", "after_model_error", "before_tool", "after_tool")
_MARK = "__littleghost_hook__"


def _decorator(kind: str) -> Callable[[F], F]:
    def mark(function: F) -> F:
        target = (
            function.__func__ if isinstance(function, (staticmethod, classmethod)) else function
        )
        if not callable(target):
            raise ConfigurationError(f"@{kind} decorates a function or method, not {function!r}")
        earlier = getattr(target, _MARK, kind)
        if earlier != kind:
            raise ConfigurationError(
                f"@{kind}: {getattr(target, '__name__', target)!r} is already a {earlier} hook; "
                "a function is a hook of one kind"
            )
        setattr(target, _MARK, kind)
        return function

    mark.__name__ = kind
    mark.__doc__ = f"Mark a method as a ``{kind}`` hook."
    return mark


before_model = _decorator("before_model")
after_model = _decorator("after_model")
after_model_error = _decorator("after_model_error")
before_tool = _decorator("before_tool")
after_tool = _decorator("after_tool")


def hook_kind(value: object) -> str | None:
    """The kind a function was marked with, if any."""
    target = value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
    kind = getattr(target, _MARK, None)
    return kind if isinstance(kind, str) else None


def wants_context(function: Callable[..., Any]) -> bool:
    """True when ``function`` declares a parameter named ``context``."""
    try:
        parameters = inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False
    parameter = parameters.get("context")
    return parameter is not None and parameter.kind in (
        inspect.Parameter.KEYWORD_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )


@frozen
class PlanEntry:
    """A hook's place in a class's hook plan: a hook method by name, or a capability's
    function (``key`` says which, for replacing it in place)."""

    kind: str
    key: tuple[str, str]
    method: str | None
    function: Callable[..., Any] | None


@frozen
class BoundHook:
    """One hook, ready to call for an agent instance."""

    name: str
    call: Callable[..., Any]
    takes_context: bool


def bind_hooks(agent: object, plan: Iterable[PlanEntry]) -> dict[str, tuple[BoundHook, ...]]:
    """Bind a hook plan to ``agent``; an overriding attribute set to ``None`` disables a hook."""
    bound: dict[str, list[BoundHook]] = {kind: [] for kind in HOOK_KINDS}
    for entry in plan:
        if entry.method is not None:
            method = getattr(agent, entry.method)
            if method is None:
                continue
            if not callable(method):
                raise ConfigurationError(
                    f"hook {entry.method!r} of {type(agent).__name__} is not callable"
                )
            bound[entry.kind].append(BoundHook(entry.method, method, wants_context(method)))
        else:
            assert entry.function is not None
            function = entry.function

            def call(*args: Any, _function: Callable[..., Any] = function, **kwargs: Any) -> Any:
                return _function(agent, *args, **kwargs)

            bound[entry.kind].append(
                BoundHook(getattr(function, "__qualname__", entry.key[1]), call, True)
            )
    return {kind: tuple(hooks) for kind, hooks in bound.items()}


async def run_chain(
    hooks: Iterable[BoundHook],
    payload: Any,
    *extra: Any,
    expected: type,
    context: object,
) -> Any:
    """Run ``hooks`` in order on ``payload``; return the final (possibly replaced) payload."""
    for hook in hooks:
        result = (
            hook.call(payload, *extra, context=context)
            if hook.takes_context
            else hook.call(payload, *extra)
        )
        if inspect.isawaitable(result):
            result = await result
        if result is None:
            continue
        if not isinstance(result, expected):
            raise TypeError(
                f"hook {hook.name} returned {type(result).__name__}; "
                f"return None to continue or a {expected.__name__} to replace it"
            )
        payload = result
    return payload
