"""Hook decorators, and the chain that runs them.

A hook returns ``None`` to continue, or a value of the same kind to replace what later
hooks and the call see. Raising ends the run. Hooks may be sync or async; a hook that
declares a ``context`` parameter also receives the ``RunContext``. The order they run in
(a class's hook plan) is made by :mod:`littleghost.capabilities`; ``bind_hooks`` binds it
to an agent.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

from attrs import frozen

from littleghost._validators import safe_repr
from littleghost.errors import ConfigurationError
from littleghost.tool_types import VARIADIC

if TYPE_CHECKING:
    from littleghost.run import RunContext

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
_ARGUMENTS = {
    "before_model": "request",
    "after_model": "response",
    "after_model_error": "request, error",
    "before_tool": "call",
    "after_tool": "result",
}
"""What each kind of hook is called with, positionally (``context=`` comes as a keyword)."""
_CALLED = {
    "before_model": (
        "with the ``ModelRequest`` of each turn's model call before it is sent",
        "return a ``ModelRequest`` to send in its place",
        "go on",
    ),
    "after_model": (
        "with the ``ModelResponse`` of each turn's model call",
        "return a ``ModelResponse`` to use in its place",
        "go on",
    ),
    "after_model_error": (
        "with the ``ModelRequest`` and the error when a turn's model call failed (after "
        "littleghost's own retries)",
        "return a ``ModelRequest`` to retry the call with (at most three times a call)",
        "let the error go on",
    ),
    "before_tool": (
        "with each ``ToolCall`` before it runs",
        "return a ``ToolCall`` to run in its place",
        "go on",
    ),
    "after_tool": (
        "with each ``ToolResult`` before the log keeps it",
        "return a ``ToolResult`` to keep in its place",
        "go on",
    ),
}
"""When each kind of hook is called, what it may return, and what ``None`` does."""
_MARK = "__littleghost_hook__"


def _decorator(kind: str) -> Callable[[F], F]:
    def mark(function: F | None = None) -> F:
        if function is None:
            raise ConfigurationError(
                f"@{kind} takes no arguments: write @{kind}, without parentheses"
            )
        target = (
            function.__func__ if isinstance(function, (staticmethod, classmethod)) else function
        )
        if not callable(target):
            raise ConfigurationError(
                f"@{kind} decorates a function or method, not {safe_repr(function)}"
            )
        earlier = getattr(target, _MARK, kind)
        if earlier != kind:
            raise ConfigurationError(
                f"@{kind}: {getattr(target, '__name__', target)!r} is already a {earlier} hook; "
                "a function is a hook of one kind"
            )
        try:
            setattr(target, _MARK, kind)
        except (AttributeError, TypeError):  # a bound method, a builtin: nothing to mark
            raise ConfigurationError(
                f"@{kind} decorates a function (a def, in a class body for a method), not "
                f"{type(target).__name__} {target!r:.60}: wrap it in one"
            ) from None
        return function

    mark.__name__ = mark.__qualname__ = kind
    called, replaced, otherwise = _CALLED[kind]
    mark.__doc__ = textwrap.fill(
        f"Mark a method as {'an' if kind[0] == 'a' else 'a'} ``{kind}`` hook, called "
        f"{called}: {replaced}, or ``None`` to {otherwise}. Raising ends the run. The hook may be "
        "sync or async, and gets the ``RunContext`` as ``context=`` when it declares a "
        "``context`` parameter.",
        width=88,
    )
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


def check_signature(
    what: str,
    function: Callable[..., Any],
    expected: str,
    positional: int,
    *,
    context: bool,
) -> None:
    """``ConfigurationError`` unless ``function`` takes ``positional`` positional arguments,
    and the keyword ``context`` when ``context``; ``what`` and ``expected`` (the arguments it
    gets) word the message; a generator function is refused too (what it returns is no
    result)."""
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        raise ConfigurationError(
            f"{what} is a generator function (it uses yield): it must return its result"
        )
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return  # nothing to read (a builtin): the call itself will tell
    try:
        signature.bind(*[None] * positional, **({"context": None} if context else {}))
    except TypeError as error:
        raise ConfigurationError(
            f"{what} must accept {expected}; its signature {signature} does not ({error})"
        ) from None


def check_method_signature(
    cls: type, name: str, what: str, arguments: str, *, context: bool = False
) -> None:
    """Check that ``cls``'s attribute ``name``, as an instance gets it, takes ``arguments``
    (a comma-separated list) and, when ``context``, the keyword ``context``.

    Only what can be read without running a ``__get__`` is checked: a function (``self``
    counted), a staticmethod or classmethod, or a callable object without ``__get__``
    (called as it is). What any other descriptor (a ``partialmethod``, an ``lru_cache``
    wrapper, a class-based decorator) gives is up to its ``__get__``; its call will tell."""
    static = inspect.getattr_static(cls, name)
    takes_self = inspect.isfunction(static)  # bound on access
    if not (
        takes_self
        or isinstance(static, (staticmethod, classmethod))
        or not hasattr(type(static), "__get__")
    ):
        return
    first = "self, " if takes_self else ""
    _check_arguments(what, getattr(cls, name), first + arguments, context=context)


def _check_arguments(
    what: str, function: Callable[..., Any], arguments: str, *, context: bool
) -> None:
    """``check_signature`` for ``arguments``, a comma-separated list of positional ones."""
    expected = f"({arguments})" + (" and the keyword context=" if context else "")
    check_signature(what, function, expected, len(arguments.split(", ")), context=context)


_CONTEXT_ADVICE = "a hook gets the RunContext only through a parameter named context"


def _meant_for_context(function: Callable[..., Any]) -> list[str]:
    """The parameters of ``function`` other than ``context`` that look meant for the
    ``RunContext`` (named ``ctx``, or annotated ``RunContext``, as a tool's may be)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name
        for p in parameters
        if p.name != "context"
        and p.kind not in VARIADIC
        and (p.name == "ctx" or "RunContext" in str(p.annotation))
    ]


@contextmanager
def _context_named(what: str, function: Callable[..., Any]) -> Iterator[None]:
    """Around the check of a hook's signature: a parameter that looks meant for the
    ``RunContext`` but is named otherwise (``_meant_for_context``) gets what the hook's
    kind is called with, or nothing (its default, or the error of its missing argument,
    which this adds the advice to): a hook gets it only through ``context``."""
    meant = _meant_for_context(function)
    try:
        yield
    except ConfigurationError as error:
        if not meant or "missing a required" not in str(error):
            raise
        raise ConfigurationError(f"{error}; {_CONTEXT_ADVICE}") from None
    if meant:
        raise ConfigurationError(
            f"{what} has a parameter {meant[0]!r} for the RunContext, which never gets it "
            f"(what the hook is called with, or its default): {_CONTEXT_ADVICE}"
        )


def check_hook(cls: type, name: str, kind: str) -> None:
    """Check at class definition that hook method ``name`` takes what a ``kind`` hook gets."""
    what = f"{cls.__name__}.{name}, a @{kind} hook,"
    with _context_named(what, getattr(cls, name)):
        context = wants_context(getattr(cls, name))
        check_method_signature(cls, name, what, _ARGUMENTS[kind], context=context)


def _check_instance_hook(agent: object, name: str, kind: str, function: Callable[..., Any]) -> None:
    """Check hook ``name`` set on ``agent`` itself (before ``super().__init__()``) as
    ``check_hook`` checks a class's."""
    what = f"{type(agent).__name__}.{name}, a @{kind} hook set on the instance,"
    with _context_named(what, function):
        _check_arguments(what, function, _ARGUMENTS[kind], context=wants_context(function))


def check_capability_hook(kind: str, function: Callable[..., Any]) -> None:
    """Check that a capability's ``kind`` hook takes ``(agent, ..., context=)``."""
    name = getattr(function, "__qualname__", repr(function))
    what = f"{name}, the {kind} hook of a capability,"
    with _context_named(what, function):
        _check_arguments(what, function, f"agent, {_ARGUMENTS[kind]}", context=True)


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
    """One hook, ready to call for an agent instance (``capability``: the name of the
    capability it is of, ``None`` for a hook method)."""

    name: str
    call: Callable[..., Any]
    takes_context: bool
    capability: str | None = None

    def told(self, kind: str) -> str:
        """What a run running it is doing, as its deadline's error tells it."""
        of = "" if self.capability is None else f" of capability {self.capability!r}"
        return f"running the {kind} hook {self.name!r}{of}"


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
            if entry.method in vars(agent):
                _check_instance_hook(agent, entry.method, entry.kind, method)
            bound[entry.kind].append(BoundHook(entry.method, method, wants_context(method)))
        else:
            assert entry.function is not None
            function = entry.function

            def call(*args: Any, _function: Callable[..., Any] = function, **kwargs: Any) -> Any:
                return _function(agent, *args, **kwargs)

            name = getattr(function, "__qualname__", entry.key[1])
            bound[entry.kind].append(BoundHook(name, call, True, entry.key[1]))
    return {kind: tuple(hooks) for kind, hooks in bound.items()}


async def run_chain(
    hooks: Iterable[BoundHook],
    payload: Any,
    *extra: Any,
    expected: type,
    context: RunContext,
    told: str | None = None,
) -> Any:
    """Run ``hooks`` in order on ``payload``; return the final (possibly replaced) payload.

    Each hook is hosted like a tool (``Grace.hosting``): runs it starts share the run's
    grace when the run is cancelled. With ``told`` (their kind), what the run is doing
    names the hook running, for the error of a deadline that cuts it."""
    for hook in hooks:
        if told is not None:
            context._doing = functools.partial(hook.told, told)
        with context.grace.hosting():
            result = (
                hook.call(payload, *extra, context=context)
                if hook.takes_context
                else hook.call(payload, *extra)
            )
            if inspect.isawaitable(result):
                result = await result
            if inspect.iscoroutine(result):  # an ``await`` left out of its return statement
                result = await result
        if result is None:
            continue
        if not isinstance(result, expected):
            named = hook.call.__qualname__ if inspect.ismethod(hook.call) else hook.name
            raise TypeError(
                f"hook {named} returned {type(result).__name__}; "
                f"return None to continue or a {expected.__name__} to replace it"
            )
        payload = result
    return payload
