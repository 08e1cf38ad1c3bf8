"""The context windows of OpenAI's and Anthropic's models, as their model pages give them.

Checked on 2026-12-01 (``WINDOWS_CHECKED``) against developers.openai.com/api/docs/models
and platform.claude.com/docs/en/models. A window is the total of input and output tokens.
A model name takes the window of the longest prefix listed for its provider, so dated
snapshots (``gpt-4o-2024-08-06``, ``claude-sonnet-4-5-20250929``) and aliases
(``chatgpt-4o-latest``) take their family's; a fine-tuned OpenAI model
(``ft:gpt-4o-mini:org::id``) takes its base model's. A name that matches no prefix has no
known window. Claude Sonnet 4 and 4.5 are listed at their standard 200K; with the
1M-context beta, pass ``context_window=1_000_000`` to the model.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = ["CONTEXT_WINDOWS", "WINDOWS_CHECKED", "known_context_window", "provider_of"]

WINDOWS_CHECKED: Final = "2026-12-01"
"""The day the figures below were compared with the providers' model pages."""

CONTEXT_WINDOWS: Final[Mapping[str, Mapping[str, int]]] = MappingProxyType(
    {
        "openai": MappingProxyType(
            {
                "gpt-3.5-turbo": 16_385,
                "gpt-4": 8_192,
                "gpt-4-32k": 32_768,
                "gpt-4-turbo": 128_000,
                "gpt-4-0125-preview": 128_000,
                "gpt-4-1106": 128_000,
                "gpt-4-vision-preview": 128_000,
                "gpt-4o": 128_000,
                "chatgpt-4o": 128_000,
                "gpt-4.1": 1_047_576,
                "o1": 200_000,
                "o1-mini": 128_000,
                "o1-preview": 128_000,
                "o3": 200_000,
                "o4-mini": 200_000,
                "gpt-5": 400_000,
                "gpt-5-chat": 128_000,
                "gpt-5.1-chat": 128_000,
                "gpt-5.2-chat": 128_000,
                "gpt-5.4": 1_050_000,
                "gpt-5.4-mini": 400_000,
                "gpt-5.4-nano": 400_000,
                "gpt-5.5": 1_050_000,
            }
        ),
        "anthropic": MappingProxyType(
            {
                "claude-instant": 100_000,
                "claude-2.0": 100_000,
                "claude-2.1": 200_000,
                "claude-3": 200_000,
                "claude-haiku-4": 200_000,
                "claude-sonnet-4": 200_000,
                "claude-sonnet-4-6": 1_000_000,
                "claude-opus-4": 200_000,
                "claude-opus-4-6": 1_000_000,
                "claude-opus-4-7": 1_000_000,
                "claude-opus-4-8": 1_000_000,
                "claude-haiku-5-5": 1_000_000,
                "claude-sonnet-5": 1_000_000,
                "claude-opus-5": 1_000_000,
                "claude-fable-5": 1_000_000,
                "claude-mythos-5": 1_000_000,
            }
        ),
    }
)
"""Per provider, model-name prefixes and their windows in tokens (input + output)."""


def known_context_window(provider: str, model: str) -> int | None:
    """The documented window of ``provider``'s ``model``; ``None`` when it is not listed.

    Args:
        provider: ``openai`` or ``anthropic`` (any other provider has no listed windows).
        model: The model's name, a dated snapshot or an ``ft:`` fine-tune of one.
    """
    prefixes = CONTEXT_WINDOWS.get(provider, {})
    name = model.strip().lower()
    if name.startswith("ft:"):
        name = name[3:].split(":", 1)[0]
    matches = [prefix for prefix in prefixes if name.startswith(prefix)]
    return prefixes[max(matches, key=len)] if matches else None


def provider_of(model: str) -> str | None:
    """The provider whose listed models ``model`` is named like (``gpt-4o-mini``:
    ``openai``), for a model string that names none; ``None`` for any other name."""
    known = [provider for provider in CONTEXT_WINDOWS if known_context_window(provider, model)]
    return known[0] if len(known) == 1 else None
