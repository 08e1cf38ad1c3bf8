"""``Agent``: class-level declarations and their checks, the model it runs with, and
``run`` / ``run_sync`` / ``stream`` (the run loop is :mod:`littleghost.runner`)."""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import inspect
import math
import re
import sys
import typing
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType, TracebackType
from typing import (
    TYPE_CHECKING,
    Any,
    ClassVar,
    Generic,
    TypedDict,
    TypeGuard,
    TypeVar,
    cast,
    overload,
)

import anyio
import attrs

from littleghost import runner
from littleghost._validators import is_callable, is_number, safe_repr, wrong_value
from littleghost.blocking import run_blocking
from littleghost.capabilities import Capability, hook_plan, in_effect
from littleghost.cleanup import DEFAULT_GRACE, close_leaving, enter_block, leave_block, shared_stop
from littleghost.context.config import ContextManagement, check_result_cap, context_config
from littleghost.errors import ConfigurationError
from littleghost.hooks import (
    HOOK_KINDS,
    BoundHook,
    PlanEntry,
    bind_hooks,
    check_hook,
    check_method_signature,
    check_signature,
    hook_kind,
)
from littleghost.messages import Message
from littleghost.models.base import Model, ToolSpec, check_model, model_shortfall
from littleghost.models.registry import is_local_model, resolve, split_model_string
from littleghost.output import (
    OutputType,
    Strategy,
    check_strategy,
    check_tool_choice,
    check_tool_names,
    compile_output_type,
)
from littleghost.owned_models import OwnedModels, close_models
from littleghost.retry import MAX_RETRIES
from littleghost.run import RunContext, RunResult
from littleghost.runs_in_flight import RunsInFlight
from littleghost.sessions import InMemorySessionStore, SessionStore
from littleghost.sessions.base import check_store
from littleghost.settings import (
    TYPED_SETTINGS,
    ClassSettings,
    check_local_settings,
    check_settings,
)
from littleghost.stream import RunStream
from littleghost.tool_types import spellings
from littleghost.tools import (
    ToolDefinition,
    closed_over,
    define_tool,
    index_tools,
    looks_like_method,
    tool_options,
)

if sys.version_info >= (3, 11):
    from typing import Unpack
else:  # a runtime name, for what evaluates the signature (typing.get_type_hints)
    from typing_extensions import Unpack

__all__ = ["Agent", "AgentOptions"]

Instructions = str | Callable[[RunContext], Any] | None


def _positive_int(minimum: int) -> Callable[[str, object], int]:
    def check(name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigurationError(f"{name} must be an int >= {minimum}, not {safe_repr(value)}")
        return value

    return check


def _model(name: str, value: object) -> str | Model | None:
    if value is None:
        return value
    if not isinstance(value, type) and isinstance(value, Model):
        check_model(name, value)
        return value
    if isinstance(value, str):
        split_model_string(value)
        return value
    raise ConfigurationError(
        f"{name} must be a 'provider:model' string or a Model instance, "
        f"not {wrong_value(value, lambda v: type(v).__name__)}{model_shortfall(value)}"
    )


def _resolved(owner: str, value: object) -> Model:
    """``value``, what ``owner`` (a class's own ``resolve_model()``) returned, if it is a
    ``Model`` whose plain members are sound (``check_model``).

    Raises:
        ConfigurationError: It is no ``Model`` (a model string, ``None``, a coroutine of an
            ``async def``) or a ``Model`` holding a wrong ``name``, ``provider`` or window.
    """
    if inspect.iscoroutine(value):
        value.close()  # never awaited: no RuntimeWarning besides the error
        raise ConfigurationError(
            f"{owner} returned a coroutine, not a Model: resolve_model is called without "
            "await (a def, not an async def)"
        )
    if isinstance(value, type) or not isinstance(value, Model):
        made = " (littleghost.models.resolve() makes one of a model string)"
        hint = made if isinstance(value, str) else model_shortfall(value)
        raise ConfigurationError(
            f"{owner} must return a Model, not "
            f"{wrong_value(value, lambda v: 'None' if v is None else type(v).__name__)}{hint}"
        )
    check_model(owner, value)
    return value


def _instructions(name: str, value: object) -> Instructions:
    if value is None or isinstance(value, str) or is_callable(value):
        return value
    raise ConfigurationError(
        f"{name} must be a str or a callable that receives the run context, "
        f"not {wrong_value(value, lambda v: type(v).__name__)}"
    )


def _tools(name: str, value: object) -> tuple[Callable[..., Any], ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        one = f" (a list of one: [{value.__name__}])" if inspect.isfunction(value) else ""
        raise ConfigurationError(
            f"{name} must be a sequence of functions, not {type(value).__name__}{one}"
        )
    functions = tuple(value)
    for function in functions:
        if not callable(function):
            raise ConfigurationError(f"{name} must hold functions, not {safe_repr(function)}")
        kind = hook_kind(function)
        if kind is not None:
            raise ConfigurationError(
                f"{name}: {getattr(function, '__name__', function)!r} is a @{kind} hook, not "
                "a tool (the model would call it; the run never would): a hook is a method "
                "of the agent class, or a capability's hook"
            )
    return functions


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, not {safe_repr(value)}")
    return value


def _seconds(name: str, value: object) -> float:
    if not (is_number(value) and value > 0):
        raise ConfigurationError(f"{name} must be a number of seconds > 0, not {safe_repr(value)}")
    return float(value)


def _output_type(name: str, value: object) -> object:
    compile_output_type(value, name)
    return value


_KNOBS: dict[str, Callable[[str, object], Any]] = {
    "model": _model,
    "instructions": _instructions,
    "tools": _tools,
    "settings": check_settings,
    "max_turns": _positive_int(1),
    "max_tool_calls": _positive_int(1),
    "max_tool_result_tokens": _positive_int(1),
    "max_retries": _positive_int(0),
    "capture_content": _bool,
    "session_store": check_store,
    "cleanup_grace": _seconds,
    "output_type": _output_type,
    "output_strategy": check_strategy,
}


class AgentOptions(TypedDict, total=False):
    """The keywords of ``Agent(...)``: knobs for one instance, as ``Agent`` describes
    them (a type checker then catches a misspelled or mistyped one)."""

    model: str | Model | None
    instructions: str | Callable[..., Any] | None
    tools: Sequence[Callable[..., Any]]
    settings: Mapping[str, Any]
    max_turns: int
    max_tool_calls: int
    max_tool_result_tokens: int
    max_retries: int
    capture_content: bool
    session_store: SessionStore
    cleanup_grace: float
    output_type: Any
    output_strategy: Strategy


_DECORATED = {
    "capabilities": "class decorators add capabilities (littleghost.capabilities.add_capability)",
    "context_management": "decorate the class with @manage_context(...) instead",
}
"""Class attributes that class decorators set, never a class body."""

_OWN_STORES: weakref.WeakKeyDictionary[type, SessionStore] = weakref.WeakKeyDictionary()
"""The in-memory store made for each agent class that declares none and inherits none
but ``Agent``'s (sessions never leak between classes)."""


_NO_MIXINS = (Generic, object)
"""The classes of every agent class's MRO besides agent classes: no mixin of its."""


def _declaring(cls: type) -> list[type]:
    """``cls`` and the plain classes (mixins) of its MRO: the classes whose declarations the
    definition of ``cls`` checks (an agent class's were checked when it was defined)."""
    return [
        klass
        for klass in cls.__mro__
        if klass is cls or not (issubclass(klass, Agent) or klass in _NO_MIXINS)
    ]


def _owner(cls: type, name: str) -> type:
    """The class of ``cls``'s MRO whose own attribute ``name`` ``cls`` gets; the store made
    for a class that declared none is passed over, as if not there."""
    return next(
        klass
        for klass in cls.__mro__
        if name in vars(klass)
        and not (
            name == "session_store"
            and klass in _OWN_STORES
            and vars(klass)[name] is _OWN_STORES[klass]
        )
    )


_WORKED_OUT_ON_CLASSES = (
    "capabilities",
    "__littleghost_hook_plan__",
    "__littleghost_tool_index__",
    "__littleghost_declared__",
)
"""What ``Agent.__init_subclass__`` and ``add_capability`` work out and set on a class."""


def _forget_worked_out(cls: type) -> bool:
    """Whether ``cls`` was made from the namespace of an agent class already defined (as
    ``attrs.define`` and ``dataclass(slots=True)`` make a class anew); if so, take from it
    what was worked out for that class, to be worked out again for this one, the session
    store made for that class included, and attrs' ``__getstate__`` and ``__setstate__``,
    which keep its fields alone (``Agent``'s keep the slots too). What its body and
    decorators declared stays: its knobs (as checked), capabilities and
    ``context_management``."""
    own = vars(cls)
    declared = own.get("__littleghost_declared__")
    if declared is None:
        return False
    store = own.get("session_store", declared["session_store"])
    if store is not declared["session_store"]:  # the one made for that class
        delattr(cls, "session_store")
    for name in _WORKED_OUT_ON_CLASSES:
        if name in own:
            delattr(cls, name)
    for name in ("__getstate__", "__setstate__"):
        if getattr(own.get(name), "__module__", None) == "attr._make":
            delattr(cls, name)
    return True


def _slots(cls: type) -> frozenset[str]:
    """The names of the slots of ``cls``'s MRO, as an instance's attributes (mangled)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        declared = vars(klass).get("__slots__", ())
        for name in [declared] if isinstance(declared, str) else declared:
            if name in ("__dict__", "__weakref__"):
                continue
            private = name.startswith("__") and not name.endswith("__")
            names.add(f"_{klass.__name__.lstrip('_')}{name}" if private else name)
    return frozenset(names)


def _check_knobs(cls: type, declaring: Sequence[type]) -> None:
    """Check the knobs ``cls`` gets from ``declaring``; set its own on it, as checked.

    Raises:
        ConfigurationError: A knob is invalid, or a mixin's knob is hidden by ``Agent``'s
            default (the mixin comes after ``Agent`` in the MRO).
    """
    for knob, check in _KNOBS.items():
        owner = _owner(cls, knob)
        if owner not in declaring:
            hidden = next((klass for klass in declaring if knob in vars(klass)), None)
            if owner is Agent and hidden is not None:
                raise ConfigurationError(
                    f"{cls.__name__}: {hidden.__name__}.{knob} is hidden by the default of "
                    f"Agent, which comes first in the MRO: list {hidden.__name__} before the "
                    "agent class in the bases"
                )
            continue
        value = vars(owner)[knob]
        if knob == "instructions" and isinstance(value, staticmethod):
            value = value.__func__
        value = check(f"{owner.__name__}.{knob}", value)
        if knob == "instructions" and _called_as_it_is(value):
            setattr(cls, knob, staticmethod(value))  # a function, not a method of the agent
        elif knob == "settings":  # a mixin's too, in its place, made once
            if owner is cls or not isinstance(vars(owner)[knob], ClassSettings):
                setattr(owner, knob, ClassSettings(value))  # the checked copy, its own
        elif owner is cls:
            setattr(cls, knob, value)
        # a mixin's other knobs stay in their place in the MRO (and may change there)


def _check_resolve_model(cls: type) -> None:
    """A class's own ``resolve_model`` that is an ``async def`` fails at class definition:
    runs call it without ``await`` (what it returns, a coroutine, is no model)."""
    own = vars(cls).get("resolve_model")
    function = getattr(own, "__func__", own)  # a staticmethod's or classmethod's too
    if inspect.iscoroutinefunction(function):
        raise ConfigurationError(
            f"{cls.__name__}.resolve_model is an async def: runs call it without await; "
            "make it a plain def that returns the Model"
        )


_UNCOMPARED = (object, *spellings("Any"))
"""The parameters any output answers (``typing_extensions.Any`` is a class of its own on
Python 3.10)."""
_PROMOTED: dict[type, tuple[type, ...]] = {float: (int,), complex: (int, float)}
"""The classes type checkers take where another is declared (an ``int`` for a ``float``)."""


def _output_parameter(cls: type) -> tuple[type, object]:
    """The class declared ``Agent[X]`` nearest among ``cls``'s and its ``X`` (``Any``, of
    ``Agent``, if none); a generic base's type variable as a subclass gives it (``X`` is
    ``Ticket`` for ``class Sub(Base[Ticket])`` over ``class Base(Agent[T])``)."""
    given: dict[type, dict[object, object]] = {}  # each generic base's variables' values
    for klass in cls.__mro__:
        own = given.get(klass, {})
        for base in vars(klass).get("__orig_bases__", ()):
            origin = typing.get_origin(base)
            arguments = [_given(argument, own) for argument in typing.get_args(base)]
            if origin is Agent:
                return klass, arguments[0]
            if isinstance(origin, type):
                variables = getattr(origin, "__parameters__", ())
                given.setdefault(origin, dict(zip(variables, arguments, strict=False)))
    return Agent, Any


def _given(argument: object, own: Mapping[object, object]) -> object:
    """``argument``, or the value ``own`` gives it when it is a type variable there."""
    try:
        return own.get(argument, argument)
    except TypeError:  # unhashable (``Annotated`` metadata): no type variable
        return argument


def _is_class(value: object) -> TypeGuard[type]:
    return isinstance(value, type) and typing.get_origin(value) is None


def _check_output_parameter(cls: type, owner: str, output_type: object) -> None:
    """An agent of a class declared ``Agent[X]`` (``X`` a class) whose ``output_type``
    makes runs answer no ``X`` fails as it is made: type checkers take ``result.output``
    for an ``X``. A parameter that is no class (a type variable, ``list[X]``), or one
    ``issubclass`` cannot compare (a ``TypedDict``, a ``Protocol``), is not compared."""
    declarer, declared = _output_parameter(cls)
    answer = str if output_type is None else output_type
    if not (_is_class(declared) and _is_class(answer)) or declared in (*_UNCOMPARED, answer):
        return
    try:
        if issubclass(answer, (declared, *_PROMOTED.get(declared, ()))):
            return
    except TypeError:  # a class that takes no issubclass (a TypedDict, a Protocol)
        return
    expected, given = declared.__name__, answer.__name__
    runs = "None: its runs answer text (a str)" if output_type is None else given
    by = "" if declarer is cls else f" (by its base {declarer.__name__})"
    raise ConfigurationError(
        f"{cls.__name__} is declared Agent[{expected}]{by}, but {owner} is {runs}, not the "
        f"{expected} type checkers take result.output for; set output_type = {expected}, "
        f"or declare Agent[{given}]"
    )


def _check_local_settings(cls: type[Agent]) -> None:
    """``check_local_settings`` of the class's settings when its model (a model string, or
    a model) is littleghost's ``LocalModel``: a setting it would ignore fails at class
    definition, not as a run starts (a class's own ``resolve_model()`` picks the model
    its runs use: that one is checked as each starts)."""
    if cls.resolve_model is Agent.resolve_model and is_local_model(cls.model):
        check_local_settings(f"{_owner(cls, 'settings').__name__}.settings", cls.settings)


def _called_as_it_is(value: object) -> bool:
    """Whether a class's ``instructions`` is called with the context alone: a function
    without ``self``, or a ``functools.partial`` (which Python 3.13 warns of reading
    through an instance, and later versions bind as a method)."""
    if isinstance(value, functools.partial):
        return True
    return inspect.isfunction(value) and not looks_like_method(value)


def _declared(cls: type) -> dict[str, object]:
    """The knobs' values as ``cls`` gets them from its MRO, descriptors unbound."""
    return {knob: vars(_owner(cls, knob))[knob] for knob in _KNOBS}


_LIVE = frozenset({"model", "settings"})
"""The knobs read and checked as each run starts, which may change on the class."""


def _check_unchanged(cls: type[Agent], overridden: Iterable[str] = ()) -> None:
    """``ConfigurationError`` if a knob of ``cls`` was set on it (or a parent) after it was
    defined, which would skip the checks and the work done at definition. Not ``model`` or
    ``settings``, read and checked as each run starts (a test swaps in a ``ScriptedModel``),
    nor the knobs an instance ``overridden`` with constructor keywords; or if ``cls`` was
    never set up (a base's ``__init_subclass__`` did not call ``super()``'s), which would
    leave its declarations unchecked, its tools out and the base's sessions shared."""
    if "__littleghost_declared__" not in vars(cls):  # Agent.__init_subclass__ never ran
        hooks = [
            f"{klass.__name__}.__init_subclass__"
            for klass in cls.__mro__[1:]
            if "__init_subclass__" in vars(klass) and klass not in (Agent, *_NO_MIXINS)
        ]
        raise ConfigurationError(
            f"{cls.__name__} was not set up as an agent class: "
            f"{' or '.join(hooks) or 'an __init_subclass__ of its bases'} must call "
            "super().__init_subclass__(**kwargs), where agent classes are checked and set up"
        )
    skipped = _LIVE.union(overridden)
    for knob, value in _declared(cls).items():
        if knob not in skipped and value is not cls.__littleghost_declared__[knob]:
            owner = _owner(cls, knob)
            hooked = any(
                "__init_subclass__" in vars(klass)
                for klass in owner.__mro__[1:]
                if klass not in (Agent, *_NO_MIXINS)
            )
            raise ConfigurationError(
                f"{owner.__name__}.{knob} was changed after {cls.__name__} was defined; "
                "declarations are read and checked when the class is defined: declare "
                f"{knob} on a subclass, or pass {knob}= to the constructor"
                + (
                    " (an __init_subclass__ that sets it must do so before it calls "
                    "super().__init_subclass__())"
                    if hooked
                    else ""
                )
            )


def _check_context_management(agent: Agent, value: object) -> None:
    """``ConfigurationError`` unless ``value``, for ``agent.context_management``, is
    ``None`` (management off for it) or a configuration for a class that ``@manage_context``
    decorates (the one its hooks then read): anything else would leave the run half
    managed, its tool results kept whole for views that never come."""
    if value is None:
        return
    managed = any(capability.name == "manage_context" for capability in in_effect(type(agent)))
    if managed and isinstance(value, ContextManagement):
        return
    name = type(agent).__name__
    shown = "a ContextManagement" if isinstance(value, ContextManagement) else safe_repr(value)
    raise ConfigurationError(
        f"{name}.context_management cannot be {shown}: "
        + (
            "set None to turn @manage_context off for an agent, or a ContextManagement "
            f"(attrs.evolve({name}.context_management, ...))"
            if managed
            else f"decorate {name} with @manage_context(...) to manage its context"
        )
    )


def _check_member_names(classes: Iterable[type]) -> None:
    """``ConfigurationError`` if a ``@tool`` or hook method of ``classes`` is named like a
    member of ``Agent``, which it would replace, or a value (not a method or property of
    its own) takes the place of one of ``Agent``'s methods, properties or attributes."""
    for klass in classes:
        for attribute, value in vars(klass).items():
            if attribute not in _AGENT_MEMBERS:
                continue
            options = tool_options(value)
            if options is not None and callable(value):
                raise ConfigurationError(
                    f"{klass.__name__}.{attribute}: the @tool method {attribute!r} would "
                    f"replace Agent.{attribute}; give the method another name and keep the "
                    f"tool's name with @tool(name="
                    f"{options['name'] or getattr(value, '__name__', attribute)!r})"
                )
            kind = hook_kind(value)
            if kind is not None:
                raise ConfigurationError(
                    f"{klass.__name__}.{attribute}: the @{kind} hook {attribute!r} would "
                    f"replace Agent.{attribute}; give the method another name"
                )
            declarable = (
                attribute in _KNOBS
                or attribute in _DECORATED
                or _is_dunder(attribute)
                or (attribute == "name" and isinstance(value, str))  # telemetry's name for it
            )
            method = callable(value) and not isinstance(value, type)  # a class is a value
            if not (declarable or method or isinstance(value, _DESCRIPTORS)):
                meant = _MEANT.get(attribute)
                raise ConfigurationError(
                    f"{klass.__name__}.{attribute} would replace Agent.{attribute}, which "
                    "every agent needs: give the attribute another name"
                    + (f" ({meant})" if meant else "")
                )


_MEANT = {
    "hooks": "hooks are methods decorated with " + ", ".join(f"@{kind}" for kind in HOOK_KINDS),
    "output": "the answer's type is declared as output_type",
    "name": "the agent's name as telemetry reports it is a str: name = 'support'",
}
"""What a class body most likely meant by a value in the place of these Agent members."""


def _check_spelling(classes: Iterable[type]) -> None:
    """``ConfigurationError`` if a plain value of ``classes`` is named almost like a knob
    and would do for it (``instruction = "..."``), or by another name for one
    (``system_prompt``, ``_OTHER_NAMES``), or like a model setting it would do for
    (``temperature = 0``), which the class would otherwise ignore without a word.
    Constants (``MODEL``), ``None`` (a tool removed), values the knob would not take
    (``models = [...]``) and ``ClassVar`` ones (``top_k: ClassVar[int] = 5``) are the
    class's own."""
    for klass in classes:
        own_names = _class_vars(klass)
        for attribute, value in vars(klass).items():
            if attribute in _AGENT_MEMBERS or attribute.startswith("_") or attribute.isupper():
                continue
            if attribute in own_names:
                continue
            if value is None or isinstance(value, _DESCRIPTORS):
                continue
            # a method is the class's own; a type may be meant for output_type
            if callable(value) and not isinstance(value, type):
                continue
            misspelt = _misspelt(klass.__name__, attribute, value, _CLASS_OWN)
            if misspelt is not None:
                raise misspelt


def _misspelt(owner: str, attribute: str, value: object, own: str) -> ConfigurationError | None:
    """The error for ``value`` named ``attribute`` on ``owner`` if it is named almost like
    a knob it would do for, by another name for one, or like a model setting it would do
    for; ``own`` ends the ways to keep an attribute of one's own."""
    where = f"{owner}.{attribute} is not a knob of Agent"
    if attribute in _SETTING_NAMES and _would_do("settings", {attribute: value}):
        return ConfigurationError(
            f"{where}: a model setting goes in settings (settings = "
            f"{{{attribute!r}: {safe_repr(value)}}}; an attribute of your own needs "
            f"another name{own})"
        )
    near = difflib.get_close_matches(attribute, _KNOBS, n=1, cutoff=0.8)
    meant = _OTHER_NAMES.get(attribute) or (near[0] if near else None)
    if meant is not None and _would_do(meant, value):
        return ConfigurationError(
            f"{where}: did you mean {meant}? (an attribute of your own needs a name "
            f"less like a knob's{own})"
        )
    return None


def _check_hidden_marks(classes: Iterable[type]) -> None:
    """``ConfigurationError`` if a ``@tool`` or hook function of ``classes`` is wrapped in
    a ``property`` or ``cached_property``, which hides it: it would be neither a tool nor
    a hook, without a word."""
    for klass in classes:
        for attribute, value in vars(klass).items():
            if isinstance(value, property):
                wrapped: object = value.fget
            elif isinstance(value, functools.cached_property):
                wrapped = value.func
            else:
                continue
            kind = "tool" if tool_options(wrapped) is not None else hook_kind(wrapped)
            if kind is not None:
                what = "tool" if kind == "tool" else "hook"
                raise ConfigurationError(
                    f"{klass.__name__}.{attribute}: @{type(value).__name__} hides the "
                    f"@{kind} under it, which would be ignored: a {what} is a method (or "
                    "a staticmethod), not a property"
                )


def _check_unmarked_hooks(cls: type, classes: Iterable[type]) -> None:
    """``ConfigurationError`` if a function of ``classes`` that no decorator marks and that
    overrides no hook of ``cls`` looks meant for a hook or a tool, which nothing would
    ever call: a wrapper of a hook or ``@tool`` whose decorator dropped its mark, or a
    public function named like a hook kind, or almost (``def before_model(self,
    request)``, ``after_tools``)."""
    hooks = {entry.method for entry in hook_plan(cls)}
    for klass in classes:
        for attribute, value in vars(klass).items():
            if attribute in hooks or not inspect.isfunction(value):
                continue
            if hook_kind(value) is not None or tool_options(value) is not None:
                continue
            wrapped = None if value.__name__ == attribute else _wrapped_mark(value)
            if wrapped is not None:  # a decorator's wrapper (its def's own name) of one
                what, nobody = (
                    ("a @tool but is no tool", "the model would never be offered it")
                    if wrapped == "tool"
                    else (f"a @{wrapped} hook but is none", "nothing would call it")
                )
                raise ConfigurationError(
                    f"{klass.__name__}.{attribute} wraps {what}: its decorator dropped the "
                    f"mark (functools.wraps keeps it), and {nobody}"
                )
            if attribute.startswith("_"):
                continue  # a private helper (_before_model) is the class's own
            unmarked = _not_a_hook(klass.__name__, attribute)
            if unmarked is not None:
                raise unmarked


def _wrapped_mark(function: Callable[..., Any]) -> str | None:
    """``"tool"`` or the kind of a hook for a ``@tool`` or hook function that
    ``function`` closes over (the wrapper a decorator made of it), if any."""
    for held in closed_over(function):
        if inspect.isfunction(held) or isinstance(held, (staticmethod, classmethod)):
            kind = "tool" if tool_options(held) is not None else hook_kind(held)
            if kind is not None:
                return kind
    return None


def _not_a_hook(owner: str, name: str) -> ConfigurationError | None:
    """The error for a function named ``name`` on ``owner`` (no hook) when the name is a
    hook kind's, or almost: it looks meant for a hook, which nothing would call."""
    meant = difflib.get_close_matches(name, HOOK_KINDS, n=1, cutoff=0.9)
    if not meant:
        return None
    return ConfigurationError(
        f"{owner}.{name} is not a hook, and littleghost never calls it: a hook is a method "
        f"marked @{meant[0]} (of any name), of the class or a subclass; a method of your "
        "own that you call yourself takes a name no hook kind has"
    )


_OTHER_NAMES = {
    "system_prompt": "instructions",
    "system_message": "instructions",
    "system": "instructions",
}
"""Names other libraries give a knob, which a class attribute of the name would mean."""
_SETTING_NAMES = TYPED_SETTINGS - {"n", "stop", "logprobs", "top_k", "seed"}
"""The model settings a class attribute of the name means (but names a class may well use
for itself: ``n``, ``stop``, a retrieval's ``top_k``, its own random draws' ``seed``)."""


_OWN_ANNOTATION = "a ClassVar annotation (name: ClassVar[...] = value)"
"""The third way an error of ``_check_spelling`` gives to keep an attribute of one's own."""
_CLASS_OWN = f", a leading underscore, or {_OWN_ANNOTATION}"
"""The ways after another name to keep a class's attribute of its own."""


def _class_vars(klass: type) -> set[str]:
    """The names ``klass`` annotates as ``ClassVar``; none when its annotations cannot be
    read."""
    try:
        hints = inspect.get_annotations(klass)
    except Exception:  # an annotation that fails when evaluated (Python 3.14)
        return set()
    return {
        name
        for name, hint in hints.items()  # quoted (a string) or not (typing.ClassVar[int])
        if re.match(r"(\w+\.)*ClassVar\b", str(hint).strip(" '\"")) is not None
    }


def _plain_new(agent: object, name: str, value: object) -> bool:
    """Whether setting ``name`` to ``value`` on a made ``agent`` adds a plain value of a
    name neither a knob nor the agent's own yet (nor its class's), which the agent would
    ignore: ``_misspelt`` asks whether it was meant for a knob."""
    if name in _KNOBS or name.startswith("_") or name.isupper() or name in vars(agent):
        return False
    if value is None or (callable(value) and not isinstance(value, type)):
        return False
    return not hasattr(type(agent), name)


def _would_do(knob: str, value: object) -> bool:
    """True when ``value`` passes ``knob``'s check."""
    try:
        _KNOBS[knob](knob, value)
    except (ConfigurationError, TypeError):
        return False
    return True


_DESCRIPTORS = (property, functools.cached_property, staticmethod, classmethod)
"""What may take the place of one of ``Agent``'s members, besides a function."""


def _is_dunder(name: str) -> bool:
    return name.startswith("__") and name.endswith("__")


def _method_tools(cls: type) -> dict[str, ToolDefinition]:
    """The ``@tool`` methods of ``cls`` by attribute name, parents' first; an inherited
    tool overridden with ``None`` is removed.

    Raises:
        ConfigurationError: Something other than a tool or ``None`` overrides a tool, or a
            tool cannot be defined.
    """
    found: dict[str, ToolDefinition] = {}
    for klass in reversed(cls.__mro__):
        for attribute, value in vars(klass).items():
            if tool_options(value) is not None and callable(value):
                found[attribute] = _method_tool(klass, attribute, value)
            elif attribute in found:
                if value is not None:
                    raise ConfigurationError(
                        f"{klass.__name__}.{attribute} overrides the tool "
                        f"{found[attribute].name!r} but is not a tool: decorate it with @tool, "
                        f"or set {attribute} = None to remove the tool"
                    )
                del found[attribute]
    return found


def _method_tool(klass: type, attribute: str, value: Callable[..., Any]) -> ToolDefinition:
    """The definition of the ``@tool`` method ``klass.attribute``."""
    try:
        return define_tool(value, is_method=True, namespace=vars(klass))
    except NameError as error:
        raise ConfigurationError(
            f"{klass.__name__}.{attribute}: a tool annotation cannot be resolved ({error})"
        ) from None
    except ConfigurationError as error:
        raise ConfigurationError(f"{klass.__name__}.{attribute}: {error}") from None


def _function_tools(owner: str, functions: Iterable[Callable[..., Any]]) -> list[ToolDefinition]:
    definitions = []
    for function in functions:
        try:
            definitions.append(define_tool(function, is_method=False))
        except NameError as error:
            raise ConfigurationError(
                f"{owner}: a tool annotation cannot be resolved ({error})"
            ) from None
        except ConfigurationError as error:
            raise ConfigurationError(f"{owner}: {error}") from None
    return definitions


_F = TypeVar("_F", bound=Callable[..., Any])
_A = TypeVar("_A", bound="Agent")
_T = TypeVar("_T")
if TYPE_CHECKING:  # a default: a bare `Agent` is `Agent[Any]`, which no checker flags
    from typing_extensions import TypeVar as _DefaultedTypeVar

    _O = _DefaultedTypeVar("_O", default=Any)
else:  # typing_extensions is no dependency from Python 3.11
    _O = TypeVar("_O")


def _named_keywords(method: _F) -> _F:
    """``method``, raising a ``TypeError`` that names it, an unexpected keyword and the
    keywords it takes (Python's own names no alternatives)."""
    accepted = list(inspect.signature(method).parameters)[1:]  # after self

    def check(agent: object, options: Mapping[str, Any]) -> None:
        unknown = sorted(set(options) - set(accepted))
        if unknown:
            raise TypeError(
                f"{type(agent).__name__}.{method.__name__}() got an unexpected keyword "
                f"argument {unknown[0]!r}; it takes {', '.join(accepted)}"
            )

    if inspect.iscoroutinefunction(method):

        async def checked_async(self: object, *args: Any, **options: Any) -> Any:
            check(self, options)
            return await method(self, *args, **options)

        return cast(_F, functools.wraps(method)(checked_async))

    def checked(self: object, *args: Any, **options: Any) -> Any:
        check(self, options)
        return method(self, *args, **options)

    return cast(_F, functools.wraps(method)(checked))


class Agent(Generic[_O]):
    """An LLM agent declared as a class.

    Subclass it and declare, at class level: ``model`` (a ``"provider:model"`` string or
    a ``Model``), ``instructions`` (a str, or a callable that receives the
    ``RunContext``), tools (``@tool`` methods, and plain functions in ``tools``),
    ``settings``, the limits ``max_turns`` (100), ``max_tool_calls`` (1000) and
    ``max_tool_result_tokens`` (10 000), ``max_retries`` (3), ``capture_content``
    (False), ``session_store`` (where ``run(..., session_id=)`` keeps conversations;
    default an ``InMemorySessionStore`` of the class's own) and ``cleanup_grace`` (1 s:
    how long a stopping run may go on storing what it must), ``output_type`` (the type of
    ``result.output``; ``None``: the answer's text) and ``output_strategy`` (``"auto"``,
    ``"native"`` or ``"tool"``: how the model is asked for it, see
    :mod:`littleghost.output`). Constructor keywords of the same names override them for
    one instance. Declarations, a plain mixin's included, are read and checked when the
    class is defined; a knob set on the class later fails its next instance or run (but
    ``model`` and ``settings``, read and checked as each run starts).
    ``capabilities`` shows what class decorators added (see :mod:`littleghost.capabilities`).
    ``class Triage(Agent[Ticket])`` tells type checkers the type of ``result.output`` of
    runs without ``output_type=`` (a bare ``Agent`` is ``Agent[Any]``); at run time the
    parameter changes nothing: ``output_type`` is what a run asks for (an agent whose
    ``output_type`` answers no such class fails as it is made).
    """

    model: str | Model | None = None
    instructions: str | Callable[..., Any] | None = None
    """A str, or a callable of the ``RunContext``: typed loosely so that a method
    ``instructions(self, context)`` may declare it."""
    tools: Sequence[Callable[..., Any]] = ()
    settings: Mapping[str, Any] = MappingProxyType({})  # shared: declare your own
    max_turns: int = 100
    max_tool_calls: int = 1000
    max_tool_result_tokens: int = 10_000
    max_retries: int = MAX_RETRIES
    capture_content: bool = False
    session_store: SessionStore = InMemorySessionStore()
    cleanup_grace: float = DEFAULT_GRACE
    output_type: Any = None
    output_strategy: Strategy = "auto"
    context_management: Any = None
    """``@manage_context``'s configuration; ``None`` (management off) may be set on an
    agent, in its ``__init__`` too."""
    capabilities: ClassVar[tuple[Capability, ...]] = ()
    """The capabilities in effect for the class, in the order their hooks run."""
    __littleghost_agent__: ClassVar[bool] = True

    __littleghost_tool_index__: ClassVar[dict[str, tuple[ToolDefinition, str | None]]] = {}
    _tool_index: dict[str, tuple[ToolDefinition, str | None]]
    __littleghost_declared__: ClassVar[dict[str, object]]
    """The knobs' values when the class was defined (see ``_check_unchanged``)."""
    _bound_plan: tuple[PlanEntry, ...]
    """The hook plan ``_hooks`` was bound from."""
    _hooks: Mapping[str, tuple[BoundHook, ...]]
    _models: OwnedModels
    """The models made from model strings (this agent closes them)."""
    _runs: RunsInFlight
    """The runs under way (``aclose()`` waits for those that are stopping)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        rebuilt = _forget_worked_out(cls)
        declaring = _declaring(cls)
        _check_member_names(declaring)  # first: a tool or hook named like a knob fails as such
        _check_spelling(declaring)
        _check_hidden_marks(declaring)
        methods = _method_tools(cls)
        for klass in declaring:
            for name, how in _DECORATED.items():
                if name in vars(klass) and not (klass is cls and rebuilt):
                    raise ConfigurationError(f"{klass.__name__}.{name} is not declared: {how}")
        cls.capabilities = in_effect(cls)
        _check_knobs(cls, declaring)
        _check_resolve_model(cls)
        _check_local_settings(cls)
        if callable(cls.instructions):
            check_method_signature(cls, "instructions", f"{cls.__name__}.instructions", "context")
        store = vars(_owner(cls, "session_store"))["session_store"]
        if store is Agent.session_store:
            store = _OWN_STORES[cls] = InMemorySessionStore()
        if cls.session_store is not store:  # one made for a class before its owner's
            cls.session_store = store
        cls.__littleghost_tool_index__ = index_tools(
            cls.__name__, methods, _function_tools(cls.__name__, cls.tools)
        )
        output = compile_output_type(cls.output_type, f"{cls.__name__}.output_type")
        if output is not None:  # str is free text, as None is
            check_tool_names(cls.__name__, cls.__littleghost_tool_index__)
            runner.check_response_format(f"{cls.__name__}.settings", cls.settings, output)
            if cls.output_strategy == "tool":
                check_tool_choice(f"{cls.__name__}.settings", cls.settings)
        for entry in hook_plan(cls):
            if entry.method is not None:
                own = inspect.getattr_static(cls, entry.method, None)  # a mixin's too
                if isinstance(own, functools.partial):  # called as it is (3.13 warns, later binds)
                    setattr(cls, entry.method, staticmethod(own))
                value = getattr(cls, entry.method)
                if tool_options(value) is not None and hook_kind(value) is not None:
                    raise ConfigurationError(
                        f"{cls.__name__}.{entry.method} is both a @tool and a @{entry.kind} "
                        "hook: a method is one or the other"
                    )
                if tool_options(value) is not None:
                    raise ConfigurationError(
                        f"{cls.__name__}.{entry.method} overrides a {entry.kind} hook but is a "
                        "tool: give the tool method another name (set it to None to turn the "
                        "hook off)"
                    )
                if value is not None and not callable(value):
                    raise ConfigurationError(
                        f"{cls.__name__}.{entry.method} overrides a hook but is not callable "
                        "(set it to None to turn the hook off)"
                    )
                if value is not None:
                    check_hook(cls, entry.method, entry.kind)
        _check_unmarked_hooks(cls, declaring)
        cls.__littleghost_declared__ = _declared(cls)

    def __init__(self, **overrides: Unpack[AgentOptions]) -> None:
        cls = type(self)
        try:  # the first attribute the agent sets on itself, set again below
            self._tool_index = cls.__littleghost_tool_index__
        except (dataclasses.FrozenInstanceError, attrs.exceptions.FrozenInstanceError):
            raise ConfigurationError(
                f"{cls.__name__} is a frozen attrs class or dataclass, and an agent sets "
                "attributes of its own as it is made and run: drop frozen=True"
            ) from None
        # knobs a subclass's __init__ set before calling this one count as keywords
        given = {knob: value for knob, value in vars(self).items() if knob in _KNOBS}
        given.update(overrides)
        _check_unchanged(cls, given)
        unknown = sorted(set(overrides) - set(_KNOBS))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}() got an unexpected keyword argument {unknown[0]!r}; "
                f"it takes {', '.join(sorted(_KNOBS))}"
            )
        owners = {
            knob: f"{cls.__name__}(…, {knob}=)" if knob in overrides else f"{cls.__name__}.{knob}"
            for knob in given
        }
        for knob, value in given.items():
            setattr(self, knob, _KNOBS[knob](owners[knob], value))
        instructions = given.get("instructions")
        if callable(instructions):
            check_signature(owners["instructions"], instructions, "(context)", 1, context=False)
        if "tools" in given:
            owner = owners["tools"]
            self._tool_index = index_tools(
                owner, _method_tools(cls), _function_tools(owner, self.tools)
            )
        else:
            self._tool_index = cls.__littleghost_tool_index__
        _check_context_management(self, self.context_management)  # as set on the class since
        if (config := context_config(cls)) is not None:  # a subclass may declare its own window
            check_result_cap(cls, config.declared_window)
        own_pick = type(self).resolve_model is not Agent.resolve_model  # checked as runs start
        if {"model", "settings"} & given.keys() and not own_pick and is_local_model(self.model):
            check_local_settings(self._settings_owner, self.settings)  # as the class's were
        if self.output is not None:
            check_tool_names(type(self).__name__, self._tool_index)
            runner.check_response_format(
                f"{type(self).__name__}.settings", self.settings, self.output
            )
            if self.output_strategy == "tool":
                check_tool_choice(self._settings_owner, self.settings)
        _check_output_parameter(
            cls, owners.get("output_type", f"{cls.__name__}.output_type"), self.output_type
        )
        self._bound_plan = hook_plan(cls)
        self._hooks = MappingProxyType(bind_hooks(self, self._bound_plan))
        self._models = OwnedModels()
        self._runs = RunsInFlight()

    def __setattr__(self, name: str, value: Any) -> None:
        """A knob set on a made agent is checked as a constructor keyword is; ``tools``
        and ``output_type``, worked out as the agent is made, fail (pass them to it), and
        so does a hook's name (bound as the agent is made), a ``@tool`` method's (before
        too: its schema is the method's), the name of what the agent works out from its
        knobs (``output``, ``tool_specs``), ``name`` (telemetry's, from the class), and a
        function named like a hook kind (``agent.before_model = ...``), which is none."""
        if name in _WORKED_OUT and inspect.getattr_static(type(self), name) is _WORKED_OUT[name]:
            raise ConfigurationError(
                f"{type(self).__name__}.{name} would replace Agent.{name}, which every run "
                "reads: give the attribute another name"
            )
        if name == "name" and _names_the_class(inspect.getattr_static(type(self), name)):
            raise ConfigurationError(
                f"{type(self).__name__}.name is the agent's name as telemetry reports it (its "
                "class name, or a str the class declares: name = 'support'); it cannot be set "
                "on an agent: give the attribute another name"
            )
        made = "_models" in vars(self)
        hook = (made or callable(value)) and any(
            entry.method == name for entry in hook_plan(type(self))
        )
        if made and hook:
            raise ConfigurationError(
                f"{type(self).__name__}.{name} is a hook, bound as the agent is made: set it "
                "before super().__init__(), or override it in a subclass (None turns it off)"
            )
        if callable(value) and not hook and not name.startswith("_"):
            unmarked = _not_a_hook(type(self).__name__, name)
            if unmarked is not None:
                raise unmarked
        tools = self._tool_index if made else type(self).__littleghost_tool_index__
        if any(method == name for _, method in tools.values()):
            raise ConfigurationError(  # before the agent is made too: its schema is the method's
                f"{type(self).__name__}.{name} is a tool, bound as the agent is made: "
                "override it in a subclass, or pass tools= to the constructor"
            )
        if made and _plain_new(self, name, value):
            misspelt = _misspelt(type(self).__name__, name, value, " or a leading underscore")
            if misspelt is not None:
                raise misspelt
        if name == "context_management":
            _check_context_management(self, value)
        if name in _KNOBS and made:
            owner = f"{type(self).__name__}.{name}"
            if name in ("tools", "output_type"):
                raise ConfigurationError(
                    f"{owner} cannot change once the agent is made: pass {name}= to the "
                    f"constructor (super().__init__(..., {name}=...) in a subclass)"
                )
            value = _KNOBS[name](owner, value)
            if name == "instructions" and callable(value):
                check_signature(owner, value, "(context)", 1, context=False)
        super().__setattr__(name, value)

    def __getstate__(self) -> dict[str, Any]:
        """What a copy or a pickle of the agent keeps: its attributes, slots included (an
        attrs class's or a slotted dataclass's fields), but not its hooks, bound to it
        (their plan is its class's), nor the models it made from strings (the copy makes
        and closes its own) and its runs under way."""
        state = dict(vars(self))
        for made in ("_hooks", "_bound_plan", "_models", "_runs", "tool_specs", "output"):
            state.pop(made, None)
        for slot in _slots(type(self)):
            if hasattr(self, slot):
                state[slot] = getattr(self, slot)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        slots = _slots(type(self))
        for name, value in state.items():
            if name in slots:
                object.__setattr__(self, name, value)
            else:
                vars(self)[name] = value
        self._bound_plan = hook_plan(type(self))
        self._hooks = MappingProxyType(bind_hooks(self, self._bound_plan))
        self._models = OwnedModels()
        self._runs = RunsInFlight()

    def __deepcopy__(self, memo: dict[int, Any]) -> Agent:
        """A deep copy shares the model, session store, tools, instructions and hooks the
        agent was given, as copies share the class's: they are resources, or callables
        bound to some (a copied in-memory store would fork its conversations; a client or a
        lock cannot be copied, nor the client behind a tool that is its bound method)."""
        own = vars(self)
        tools = own.get("tools") or ()
        hooks = [entry.method for entry in hook_plan(type(self)) if entry.method is not None]
        shared = ("model", "session_store", "instructions", "_tool_index", *hooks)
        for value in [*(own[knob] for knob in shared if knob in own), *tools]:
            memo[id(value)] = value
        copied = memo[id(self)] = type(self).__new__(type(self))
        copied.__setstate__(copy.deepcopy(self.__getstate__(), memo))
        return copied

    if TYPE_CHECKING:  # a class may declare `name = "..."`, which a property would refuse
        name: ClassVar[str]
        """The agent's name, as telemetry reports it: its class name unless it declares one."""
    else:

        @property
        def name(self) -> str:
            """The agent's name (its class name), as telemetry reports it."""
            return type(self).__name__

    @functools.cached_property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """What the model is told about this agent's tools (the same values every turn)."""
        return tuple(definition.spec for definition, _ in self._tool_index.values())

    @property
    def tool_names(self) -> frozenset[str]:
        """The names of this agent's tools."""
        return frozenset(self._tool_index)

    @functools.cached_property
    def output(self) -> OutputType | None:
        """This agent's ``output_type``, compiled; ``None`` for free text."""
        return compile_output_type(self.output_type, f"{type(self).__name__}.output_type")

    @property
    def hooks(self) -> Mapping[str, tuple[BoundHook, ...]]:
        """This agent's hooks by kind (``"before_model"``, ...), bound to it, in running
        order; a capability added to its class since is bound when next asked for."""
        plan = hook_plan(type(self))
        if plan is not self._bound_plan:
            self._bound_plan, self._hooks = plan, MappingProxyType(bind_hooks(self, plan))
        return self._hooks

    def find_tool(self, name: str) -> tuple[ToolDefinition, Callable[..., Any]] | None:
        """The tool the model calls ``name``: its definition and the function to call (a
        ``@tool`` method bound to this agent), or ``None`` when the agent has none."""
        entry = self._tool_index.get(name)
        if entry is None:
            return None
        definition, attribute = entry
        return definition, definition.function if attribute is None else getattr(self, attribute)

    def run_settings(self) -> dict[str, Any]:
        """A copy of the model settings a run starts from (before ``run(settings=)``),
        checked as each run checks them: no knob of the class changed since its definition,
        and the settings themselves (they may have changed in place since). For a summary or
        preview made outside a run with the settings a run would send.

        Raises:
            ConfigurationError: A knob changed, a setting is invalid, or a subclass's
                ``__init__`` did not call ``Agent.__init__``.
        """
        if "_models" not in vars(self):
            cls = type(self)
            if dataclasses.is_dataclass(cls) or attrs.has(cls):  # an __init__ generated
                hook = "__post_init__" if dataclasses.is_dataclass(cls) else "__attrs_post_init__"
                raise ConfigurationError(
                    f"{cls.__name__}'s generated __init__ calls no Agent.__init__: call "
                    f"Agent.__init__(self) (with the constructor keywords it takes) from "
                    f"{hook}; the agent was not set up"
                )
            raise ConfigurationError(
                f"{cls.__name__}.__init__ must call super().__init__() (with the "
                "constructor keywords it takes): the agent was not set up"
            )
        _check_unchanged(type(self), vars(self))
        _check_context_management(self, self.context_management)
        return check_settings(self._settings_owner, self.settings)

    @property
    def _settings_owner(self) -> str:
        """Where this agent's settings come from, for messages: ``Support(…, settings=)``
        when the constructor gave them, else ``Support.settings``."""
        name = type(self).__name__
        return f"{name}(…, settings=)" if "settings" in vars(self) else f"{name}.settings"

    def _declared_model(self) -> str | Model:
        declared = _model(f"{type(self).__name__}.model", self.model)  # it may have changed
        if declared is None:
            raise ConfigurationError(
                f'{type(self).__name__} declares no model: set `model = "provider:name"`, '
                "pass model= to the constructor, or override resolve_model()"
            )
        return declared

    def _model_string(self) -> str | None:
        """The model string this agent's runs make their model from (``None``: it was
        given a ``Model``, or its class makes its model itself, overriding
        ``resolve_model``)."""
        if type(self).resolve_model is not Agent.resolve_model:
            return None
        declared = self._declared_model()
        return declared if isinstance(declared, str) else None

    def resolve_model(self) -> Model:
        """The model this agent runs with: its ``model`` when that is a ``Model``, else
        the one made from its model string (once per string, of the 8 strings used last;
        ``aclose()`` closes them).

        Raises:
            ConfigurationError: The agent declares no model, or a model string that no
                provider resolves.
        """
        declared = self._declared_model()
        if isinstance(declared, Model):
            return declared
        return self._models.get(declared)

    def _resolved_model(self) -> Model:
        """``resolve_model()``, what runs and compactions call: a class's own override
        returning no sound ``Model`` fails here, naming the class and the method."""
        model = self.resolve_model()
        if type(self).resolve_model is Agent.resolve_model:
            return model
        return _resolved(f"{type(self).__name__}.resolve_model()", model)

    async def __aenter__(self: _A) -> _A:
        enter_block()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """``aclose()``; when the block is leaving by an exception (a cancellation
        included), a close failure is logged and that exception goes on, and when runs in
        the block (in its task or tasks started in it) just stopped (its cancellation
        stopped them, or a deadline), closing ends by their stop time, so graces never
        add up."""
        close = functools.partial(self._close, leave_block(error, self.cleanup_grace))
        await close_leaving(close, "closing the agent's models", error)

    async def aclose(self) -> None:
        """Close the models this agent created from model strings (shielded from
        cancellation for at most ``cleanup_grace`` seconds; cancelled inside a run, a tool
        of it say, not past the time that run would stop by, so graces never add up).
        Runs of the agent in this event loop that are stopping (a server cancelled their
        requests) are waited for too, until they end or their cleanup grace is over, in
        the same time; runs going on are not. A model that runs of the agent still use is
        closed as the last of them ends, as its cleanup; runs started afterwards make a new
        one.

        Raises:
            CleanupError: A model failed to close, or closing took longer (unless the
                caller's cancellation came meanwhile: that goes on, the failure logged).
        """
        await close_leaving(self._close, "closing the agent's models", None)

    async def _close(self, by: float = math.inf) -> None:
        """``aclose()``, ending by ``by`` at the latest."""
        by = min(anyio.current_time() + self.cleanup_grace, shared_stop(), by)
        try:  # the models no run uses first: a stopping run's cleanup goes on meanwhile
            await close_models(self._models.give_up(), self.cleanup_grace, by=by)
        finally:
            await self._runs.stopping_ended(by)

    @overload
    def run_sync(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: type[_T],
    ) -> RunResult[_T]: ...

    @overload
    def run_sync(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: None = None,
    ) -> RunResult[_O]: ...

    @overload
    def run_sync(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: Any,
    ) -> RunResult[Any]: ...

    @_named_keywords
    def run_sync(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: Any = None,
    ) -> RunResult[Any]:
        """``run()`` for synchronous callers (not from inside an event loop: there, use
        ``await agent.run(...)``).

        Each call runs its own event loop and owns the model it makes from a model
        string, closed at its end, so calls from several threads on one agent do not
        share one, and nothing outlives the call; each call pays for making it (for
        ``"local"``, a llama.cpp server started and stopped). Repeated calls share a
        model given as an instance. Takes the keywords of ``run()``; that loop is
        asyncio's, so a ``deadline`` is a ``time.monotonic()`` time (``timeout`` is
        simpler).
        """
        plan = runner.plan_run(
            self,
            input,
            history=history,
            settings=settings,
            session_id=session_id,
            timeout=timeout,
            deadline=deadline,
            output_type=output_type,
            method="run_sync",
        )
        started = False

        def make() -> Model:
            """The run's own model, made from a model string (closing it is the run's
            cleanup, by its stop time), else ``resolve_model()``'s: in the run, whose span
            a model that cannot be made (none declared) fails, as in ``run()``."""
            declared = self._model_string()  # None: a Model given, or resolve_model overridden
            if declared is None:
                return self._resolved_model()
            return self._models.close_after_use(resolve(declared))

        async def run_and_close() -> RunResult[Any]:
            nonlocal started
            started = True
            return await runner.run(self, plan, make_model=make)

        try:
            return run_blocking(run_and_close)
        except RuntimeError as error:
            if started:
                raise
            raise RuntimeError(
                f"{type(self).__name__}.run_sync() cannot run inside a running event loop "
                f"({error}); use `await agent.run(...)` there"
            ) from None

    @overload
    async def run(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: type[_T],
    ) -> RunResult[_T]: ...

    @overload
    async def run(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: None = None,
    ) -> RunResult[_O]: ...

    @overload
    async def run(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: Any,
    ) -> RunResult[Any]: ...

    @_named_keywords
    async def run(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: Any = None,
    ) -> RunResult[Any]:
        """Run the agent on ``input`` and return the final answer.

        Args:
            input: The user's message.
            history: Earlier messages of the conversation, checked before any model
                call: a ``ConfigurationError`` names a message id used twice (or by the
                input), a tool message without a result, and a result that answers no
                open call of the assistant message its tool message answers (an orphan
                result, one before its call, a second answer, or one sharing a tool
                message with results for another assistant message's calls). A tool call
                without a result gets an appended error result saying the run was
                interrupted. With ``session_id``, they seed a new session; for a session
                that already has messages they are ignored (the stored log wins) and a
                ``UserWarning`` says so.
            settings: Model settings for this run, over the agent's.
            session_id: The conversation to continue from ``session_store``: the run holds
                the session until it ends (another run of it waits, within its own
                deadline), loads its log, and appends every new message as the store
                accepts it. Also telemetry's ``gen_ai.conversation.id``.
            timeout: Seconds the whole run may take.
            deadline: The absolute anyio time the run must end by.
            output_type: The type of ``result.output`` for this run, over the agent's
                (``str`` for free text); see :mod:`littleghost.output`.

        Raises:
            ConfigurationError: The history or the settings are invalid, or the model
                cannot be made (a model string no provider resolves, a missing SDK or
                API key); before any model call.
            ProviderError: The provider's error (see its subclasses): a rate limit or
                an unavailable provider (or an error the provider marked
                ``x-should-retry: true``) once ``max_retries`` are spent, at once any
                other (a ``ContextWindowOverflowError`` that ``@manage_context`` could
                not recover from has the ``CompactionError`` as its ``__cause__``).
            ProtocolError: The model's answer had the wrong shape.
            PromptBudgetError: What a ``PromptBudget`` must keep does not fit it.
            DeadlineExceededError: The deadline passed (a cleanup the stop could not
                finish within ``cleanup_grace`` is its ``__cause__``).
            LimitExceededError: ``max_turns`` or ``max_tool_calls`` was reached.
            OutputLimitError: The final answer stopped at the output limit.
            OutputValidationError: The final answer did not fit the output type, even
                after one repair turn (or on the last turn ``max_turns`` allows).
            SessionStoreError: The session store failed (see its subclasses).
        """
        plan = runner.plan_run(
            self,
            input,
            history=history,
            settings=settings,
            session_id=session_id,
            timeout=timeout,
            deadline=deadline,
            output_type=output_type,
        )
        return await runner.run(self, plan)

    @overload
    def stream(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: type[_T],
    ) -> RunStream[_T]: ...

    @overload
    def stream(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: None = None,
    ) -> RunStream[_O]: ...

    @overload
    def stream(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: Any,
    ) -> RunStream[Any]: ...

    @_named_keywords
    def stream(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
        output_type: Any = None,
    ) -> RunStream[Any]:
        """Run the agent while yielding events; use as ``async with agent.stream(...) as
        events: async for event in events: ...``.

        Takes the keywords of ``run()``; bad arguments fail here, and the run (and its
        ``timeout``) starts when the block is entered. See ``littleghost.events``.
        """
        plan = runner.plan_run(
            self,
            input,
            history=history,
            settings=settings,
            session_id=session_id,
            timeout=timeout,
            deadline=deadline,
            output_type=output_type,
            method="stream",
        )
        return RunStream(self, plan)


Agent.__littleghost_declared__ = _declared(Agent)

_AGENT_MEMBERS = frozenset(dir(Agent)) | frozenset(Agent.__annotations__)
"""The names a tool or hook method must not take: ``Agent``'s attributes, methods and
knobs, and the attributes its instances set."""

_WORKED_OUT = {
    name: value
    for name, value in vars(Agent).items()
    if isinstance(value, functools.cached_property)
}
"""What an agent works out from its knobs, which an attribute of its own must not replace."""
_AGENT_NAME = vars(Agent)["name"]
"""The property that names an agent after its class, unless the class declares a name."""


def _names_the_class(found: object) -> bool:
    """``found``, what an agent class holds as ``name``, is the agent's name as the class
    gives it (``Agent``'s, or a str the class or a base declares): no instance sets it."""
    return found is _AGENT_NAME or isinstance(found, str)
