"""Capabilities: what class decorators add to an agent class, and the order hooks run in.

A capability is a value, ``Capability(name, hooks)``; each of its hooks is a
``CapabilityHook(kind, function)``, called as ``function(agent, payload, ...,
context=run_context)`` with what a hook method of that kind receives (see
:mod:`littleghost.hooks`). A class decorator adds one with ``add_capability(cls,
capability)``, and may store its configuration on the class as well (``manage_context``
sets ``context_management``)::

    def audited(cls):
        add_capability(cls, Capability("audited", [CapabilityHook("before_tool", log_call)]))
        return cls

A decorator that stores something on the class before that checks its target first with
``check_agent_subclass(cls, "@audited decorates")``: a subclass of ``Agent``, not ``Agent``
itself. ``cls.capabilities`` is the tuple of capabilities in effect for an agent class, in
the order their hooks run (``Agent.capabilities`` is ``()``).

Order: hooks collect along the reversed MRO (mixins included), parent first; for each
class, the hooks of the capabilities added to it, then its own hook methods in definition
order. So a capability's hooks run after the parent classes' hooks and before the
decorated class's own, which see what it did. A hook method overridden in a subclass
keeps its place.

Redeclaring: adding a capability whose name is already in effect replaces it for that
class and its subclasses only, and moves its hooks to that class's place; the parent
keeps its own.

Per-run data: a hook keeps what one run needs in ``context.state_for(owner, factory)``,
the object ``factory()`` made the first time ``owner`` asked in this run. It is keyed by
``owner``'s identity (a hook function, a class of its own, ...; a bound method by its
instance and function; a value such as a str, not an enum member, is refused), so
capabilities never share it by accident, and each run starts without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from attrs import field, frozen

from littleghost._validators import check, safe_repr
from littleghost.errors import ConfigurationError
from littleghost.hooks import HOOK_KINDS, PlanEntry, check_capability_hook, hook_kind

__all__ = [
    "Capability",
    "CapabilityHook",
    "add_capability",
    "check_agent_subclass",
    "hook_plan",
    "in_effect",
]


@frozen
class CapabilityHook:
    """One hook of a capability: ``function(agent, payload, ..., context=...)``, run as
    a hook of ``kind`` (``"before_model"``, ``"after_model"``, ``"after_model_error"``,
    ``"before_tool"`` or ``"after_tool"``)."""

    kind: str
    function: Callable[..., Any]

    def __attrs_post_init__(self) -> None:
        if self.kind not in HOOK_KINDS:
            raise ConfigurationError(
                f"hook kind must be one of {', '.join(HOOK_KINDS)}, not {safe_repr(self.kind)}"
            )
        if not callable(self.function):
            raise ConfigurationError(
                f"a {self.kind} hook must be callable, not {safe_repr(self.function)}"
            )
        check_capability_hook(self.kind, self.function)


def _hooks(value: Iterable[CapabilityHook]) -> tuple[CapabilityHook, ...]:
    if not isinstance(value, Iterable):
        raise ConfigurationError(
            f"Capability.hooks must be a sequence of hooks, not {safe_repr(value)}"
        )
    hooks = tuple(value)
    for hook in hooks:
        if not isinstance(hook, CapabilityHook):
            raise ConfigurationError(
                f"Capability.hooks must hold CapabilityHook values, not {safe_repr(hook)}"
            )
    return hooks


@frozen
class Capability:
    """What a class decorator adds to an agent class.

    Args:
        name: Its name; adding one of the same name on a subclass replaces it there.
        hooks: Its hooks, in running order.
    """

    name: str = field(
        validator=check(
            "Capability.name", lambda v: isinstance(v, str) and v != "", "a non-empty str"
        )
    )
    hooks: tuple[CapabilityHook, ...] = field(converter=_hooks)


_ADDED = "__littleghost_capabilities__"
"""The class attribute holding the capabilities added to a class itself, by name, in the
order they were first added. Per-class data lives in the class's own ``__dict__``: a hook
that refers to its class makes a cycle the GC collects (in a weak-keyed table, it would
keep the class alive)."""
_PLAN = "__littleghost_hook_plan__"
"""The class attribute caching a class's hook plan, made when first asked for."""


def check_agent_subclass(value: object, what: str) -> None:
    """``ConfigurationError`` unless ``value`` is a subclass of ``Agent``; ``what`` begins
    the message (``"@manage_context decorates"``). ``Agent`` itself is refused: what a
    class decorator gives it, every agent class would have."""
    if not (isinstance(value, type) and getattr(value, "__littleghost_agent__", False) is True):
        raise ConfigurationError(f"{what} an Agent subclass, not {safe_repr(value)}")
    if "__littleghost_agent__" in vars(value):
        raise ConfigurationError(
            f"{what} a subclass of Agent, not Agent itself: every agent class would have it"
        )


def add_capability(cls: type[Any], capability: Capability) -> None:
    """Add ``capability`` to the agent class ``cls`` (class decorators call this).

    A capability of the same name, added to ``cls`` or inherited, is replaced for ``cls``
    and its subclasses; its hooks take ``cls``'s place. ``cls.capabilities`` shows the
    result.

    Raises:
        ConfigurationError: ``cls`` is not a subclass of Agent (or is Agent itself), or
            ``capability`` is not a ``Capability``.
    """
    check_agent_subclass(cls, "a capability is added to")
    if not isinstance(capability, Capability):
        raise ConfigurationError(f"add_capability takes a Capability, not {safe_repr(capability)}")
    setattr(cls, _ADDED, {**vars(cls).get(_ADDED, {}), capability.name: capability})
    for klass in _with_subclasses(cls):
        if _PLAN in vars(klass):
            delattr(klass, _PLAN)
        klass.capabilities = in_effect(klass)


def _with_subclasses(cls: type[Any]) -> Iterator[type[Any]]:
    yield cls
    for subclass in cls.__subclasses__():
        yield from _with_subclasses(subclass)


def _declarations(cls: type) -> Iterator[tuple[type, Iterable[Capability]]]:
    """Each class of ``cls``'s MRO, mixins included, parent first, with the capabilities
    added to it."""
    for klass in reversed(cls.__mro__):
        yield klass, vars(klass).get(_ADDED, {}).values()


def in_effect(cls: type) -> tuple[Capability, ...]:
    """The capabilities in effect for the agent class ``cls``, in the order their hooks run."""
    found: dict[str, Capability] = {}
    for _, capabilities in _declarations(cls):
        for capability in capabilities:
            found.pop(capability.name, None)
            found[capability.name] = capability
    return tuple(found.values())


def hook_plan(cls: type) -> tuple[PlanEntry, ...]:
    """The hooks of the agent class ``cls`` in running order (see the module docstring)."""
    plan: tuple[PlanEntry, ...] | None = vars(cls).get(_PLAN)
    if plan is None:
        plan = _plan(cls)
        setattr(cls, _PLAN, plan)
    return plan


def _plan(cls: type) -> tuple[PlanEntry, ...]:
    entries: list[PlanEntry] = []
    for klass, capabilities in _declarations(cls):
        for capability in capabilities:
            key = ("capability", capability.name)
            entries = [entry for entry in entries if entry.key != key]
            entries.extend(
                PlanEntry(hook.kind, key, None, hook.function) for hook in capability.hooks
            )
        for name, value in vars(klass).items():
            kind = hook_kind(value)
            if kind is None:
                continue
            key = ("method", name)
            if any(entry.key == key for entry in entries):
                entries = [
                    PlanEntry(kind, key, name, None) if entry.key == key else entry
                    for entry in entries
                ]
            else:
                entries.append(PlanEntry(kind, key, name, None))
    return tuple(entries)
