"""Model strings: ``"provider:model"`` resolved through a registry users can extend.

A provider name is any non-empty str without ``:``, in any case (``"OpenAI:gpt-4o"`` is
``"openai:gpt-4o"``)."""

from __future__ import annotations

import difflib
import importlib
import inspect
import sys
from collections.abc import Callable

from littleghost._validators import safe_repr
from littleghost.errors import ConfigurationError
from littleghost.hooks import check_signature
from littleghost.models.base import Model
from littleghost.models.windows import provider_of

__all__ = ["ModelFactory", "is_local_model", "register_provider", "resolve"]

ModelFactory = Callable[[str | None], Model]
"""Builds a model from the part of the string after ``provider:`` (``None`` when absent)."""

_BUILTIN = {
    "openai": "littleghost.models.openai:from_model_string",
    "anthropic": "littleghost.models.anthropic:from_model_string",
    "local": "littleghost.models.local:from_model_string",
}
_registry: dict[str, ModelFactory] = {}


def register_provider(name: str, factory: ModelFactory) -> None:
    """Make ``"name:model"`` strings resolve through ``factory``.

    Args:
        name: The provider prefix: a non-empty str without ``:`` (case does not matter);
            registering an existing name replaces it.
        factory: Called with the model part of the string (``None`` for a bare ``name``)
            when an agent first needs the model; it returns a new model, which that
            agent owns and closes.

    Raises:
        ConfigurationError: ``name`` cannot be a prefix, or ``factory`` cannot take the
            model part (or is an ``async def``).
    """
    if not isinstance(name, str) or not name or ":" in name:
        raise ConfigurationError(
            f"register_provider: name must be a non-empty str without ':', not {safe_repr(name)}"
        )
    if not callable(factory):
        raise ConfigurationError(f"register_provider: factory for {name!r} must be callable")
    what = f"register_provider: the factory for {name!r}"
    if inspect.iscoroutinefunction(factory) or inspect.iscoroutinefunction(
        type(factory).__call__  # an object's
    ):
        raise ConfigurationError(f"{what} is an async def: it must return the model itself")
    check_signature(
        what, factory, "the model part of a string (None for a bare name)", 1, context=False
    )
    _registry[name.lower()] = factory


def split_model_string(spec: str) -> tuple[str, str | None]:
    """Split ``"provider:model"`` into the provider, in lower case, and the model; a bare
    provider known now (``"local"``) has no model part. The provider of a string with a
    model part may be registered later: ``resolve`` looks it up.

    Raises:
        ConfigurationError: ``spec`` is not of that form, saying why.
    """
    provider, sep, model = spec.partition(":")
    problem = None
    if not provider or (sep and not model):
        problem = "a part is empty"
    elif spec != spec.strip() or provider != provider.strip() or model != model.strip():
        problem = "it has spaces around it or around a part"
    elif not sep and provider.lower() not in _registry.keys() | _BUILTIN.keys():
        owner = provider_of(spec)
        meant = spec.replace("/", ":", 1) if "/" in spec else owner and f"{owner}:{spec}"
        problem = "it names no provider" + (f" (did you mean {meant!r}?)" if meant else "")
    if problem is not None:
        raise ConfigurationError(
            f"model: {spec!r} is not of the form 'provider:model' (for example "
            f"'openai:gpt-4o-mini'): {problem}"
        )
    return provider.lower(), (model if sep else None)


def is_local_model(model: object) -> bool:
    """Whether ``model`` (a model string, or a model) is littleghost's ``LocalModel``: a
    ``"local"`` string while no factory of the user's is registered for it, an instance
    of the class; not a model of the user's that is also named ``local``."""
    if isinstance(model, str):
        return split_model_string(model)[0] == "local" and "local" not in _registry
    local = sys.modules.get("littleghost.models.local")  # imported by any LocalModel made
    return local is not None and isinstance(model, local.LocalModel)


def resolve(spec: str) -> Model:
    """Build the model a model string names.

    Raises:
        ConfigurationError: The provider is unknown, or its SDK or key is missing.
    """
    provider, model = split_model_string(spec)
    factory = _registry.get(provider)
    if factory is None and provider in _BUILTIN:
        module_name, _, attribute = _BUILTIN[provider].partition(":")
        factory = getattr(importlib.import_module(module_name), attribute)
    if factory is None:
        known = sorted(set(_registry) | set(_BUILTIN))
        near = difflib.get_close_matches(provider, known, n=1, cutoff=0.8)
        meant = f"did you mean {near[0]!r}? " if near else ""
        raise ConfigurationError(
            f"model: unknown provider {provider!r} in {spec!r} ({meant}known providers: "
            f"{', '.join(known)}; add one with littleghost.models.register_provider)"
        )
    resolved = factory(model)
    if isinstance(resolved, type) or not isinstance(resolved, Model):
        raise ConfigurationError(f"model: the factory for {provider!r} did not return a Model")
    return resolved
