"""The context window a command works against, found as a run finds it, where possible
without starting the model."""

from __future__ import annotations

from attrs import frozen

from littleghost._validators import is_int
from littleghost.agent import Agent
from littleghost.context.config import ContextManagement, context_config
from littleghost.models import Model
from littleghost.models.registry import split_model_string
from littleghost.models.windows import known_context_window

__all__ = ["Window", "run_model", "window_of"]


@frozen
class Window:
    """A context window in tokens, and where it comes from."""

    tokens: int
    source: str


def run_model(agent: Agent | None) -> str | Model | None:
    """The model a run of ``agent`` would use, as far as it is known without making one
    of a model string: its class's own ``resolve_model()``'s (checked, as a run checks
    it; made, not started), else its ``model`` (a model string, a ``Model`` or none)."""
    if agent is None:
        return None
    if type(agent).resolve_model is not Agent.resolve_model:
        return agent._resolved_model()
    return agent.model


def window_of(
    agent: Agent | None,
    given: int | None,
    model: str | Model | None = None,
    *,
    started: bool = False,
) -> Window:
    """``given`` (``--window``); else the class's ``context_window_override``; else what
    the model a run would use advertises (``model``, by default ``run_model(agent)``'s;
    a ``Model``'s ``context_window``, ``started`` or not, or the documented window of a
    model string); else ``context_window_tokens``."""
    config = context_config(agent) or ContextManagement()
    if given is not None:
        return Window(given, "--window")
    if config.context_window_override is not None:
        return Window(config.context_window_override, "context_window_override")
    declared = run_model(agent) if model is None else model
    if isinstance(declared, str):
        provider, name = split_model_string(declared)
        documented = known_context_window(provider, name or "")
        if documented is not None:
            return Window(documented, f"the documented window of {declared}")
    elif declared is not None:
        advertised = declared.context_window
        if is_int(advertised) and advertised > 0:
            return Window(advertised, f"advertised by the model {declared.name}")
    unknown = (
        "the model advertises none" if started else "no window is known without starting the model"
    )
    return Window(config.context_window_tokens, f"context_window_tokens: {unknown}")
