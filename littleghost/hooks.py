"""Hook decorators and the chain that runs them.

A hook returns ``None`` to continue, or a value of the same kind to replace what later
hooks and the call see. Raising ends the run. Hooks may be sync or async; a hook that
declares a ``context`` parameter also receives the ``RunContext``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from attrs import frozen

from littleghost.errors import ConfigurationError

__all__ = [
    "HOOK_KINDS",
    "CapabilityHook",
    "after_model",
    "after_model_error",
    "after_tool",
    "before_model",
    "before_tool",
]

F = TypeVar("F", bound=Callable[..., Any])

HOOK_KINDS = ("before_model", "after_model", "after_model_error", "before_tool", "after_tool")
_MARK = "__littleghost_hook__"
CAPABILITIES_ATTRIBUTE = "__littleghost_capabilities__"
PLAN_ATTRIBUTE = "__littleghost_hook_plan__"


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
class CapabilityHook:
    """A hook a class decorator registers: ``function(agent, payload, ..., context=...)``."""

    kind: str
    function: Callable[..., Any]

    def __attrs_post_init__(self) -> None:
        if self.kind not in HOOK_KINDS:
            raise ConfigurationError(
                f"hook kind must be one of {', '.join(HOOK_KINDS)}, not {self.kind!r}"
            )
        if not callable(self.function):
            raise ConfigurationError(f"a {self.kind} hook must be callable, not {self.function!r}")


def register_capability(cls: type, name: str, hooks: Iterable[CapabilityHook]) -> None:
    """Register a capability's hooks on ``cls`` only, replacing an earlier declaration of it."""
    own: dict[str, tuple[CapabilityHook, ...]] = dict(cls.__dict__.get(CAPABILITIES_ATTRIBUTE, {}))
    own[name] = tuple(hooks)
    setattr(cls, CAPABILITIES_ATTRIBUTE, own)
    if PLAN_ATTRIBUTE in cls.__dict__:  # planned before the decorator ran: plan again
        delattr(cls, PLAN_ATTRIBUTE)


@frozen
class _Entry:
    kind: str
    key: tuple[str, str]
    method: str | None
    function: Callable[..., Any] | None


def hook_plan(cls: type, root: type) -> tuple[_Entry, ...]:
    """The hooks of ``cls`` in running order.

    Along the class hierarchy, parent first: each class's capability hooks, then its own
    hook methods in definition order. A method overridden in a subclass keeps its
    parent's place; a capability declared again moves to the redeclaring class's place.
    """
    entries: list[_Entry] = []
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, root)):
            continue
        capabilities: Mapping[str, tuple[CapabilityHook, ...]] = klass.__dict__.get(
            CAPABILITIES_ATTRIBUTE, {}
        )
        for capability, hooks in capabilities.items():
            entries = [entry for entry in entries if entry.key != ("capability", capability)]
            entries.extend(
                _Entry(hook.kind, ("capability", capability), None, hook.function) for hook in hooks
            )
        for name, value in klass.__dict__.items():
            kind = hook_kind(value)
            if kind is None:
                continue
            key = ("method", name)
            if any(entry.key == key for entry in entries):
                entries = [
                    _Entry(kind, key, name, None) if entry.key == key else entry
                    for entry in entries
                ]
            else:
                entries.append(_Entry(kind, key, name, None))
    return tuple(entries)


@frozen
class BoundHook:
    """One hook, ready to call for an agent instance."""

    name: str
    call: Callable[..., Any]
    takes_context: bool


def bind_hooks(agent: object, plan: Iterable[_Entry]) -> dict[str, tuple[BoundHook, ...]]:
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
