"""The ``@manage_context`` configuration (``ContextManagement``) and the window it works
against."""

from __future__ import annotations

import math
import numbers
import threading
from collections.abc import Callable
from decimal import Decimal
from typing import Any, TypedDict

from attrs import field, fields_dict, frozen

from littleghost import logs
from littleghost._validators import (
    TOKEN_COUNT,
    TOKENIZER,
    Validator,
    check,
    counts_tokens,
    int_at_least,
    is_int,
    is_number,
    is_token_count,
    optional,
    safe_repr,
    wrong_value,
)
from littleghost.context.budget import PromptBudget, env_tokens
from littleghost.context.strategies import (
    SUMMARY_FIT_MARGIN,
    CompactionStrategy,
    Summarization,
    check_strategy,
    least_summary_call,
    summarizations,
)
from littleghost.context.tokens import DEFAULT_TOKENIZER, Tokenizer
from littleghost.errors import ConfigurationError
from littleghost.models.base import Model
from littleghost.settings import OUTPUT_CAP, is_output_cap
from littleghost.text import well_formed_value

__all__ = [
    "ContextManagement",
    "ContextOptions",
    "check_result_cap",
    "context_config",
    "context_window",
    "reported_window",
]

logger = logs.logger("littleghost.context")

_WARNED_MODELS = 256
"""The most models each warning below is remembered for (a model string per tenant would
grow it for good): one forgotten is warned about again if it comes back."""
_Warned = dict[tuple[Any, ...], None]  # in the order warned, the oldest first
_assumed_windows: _Warned = {}  # (provider, model name) pairs warned about
_reported_windows: _Warned = {}  # and (…, a smaller window reported)
_belied_windows: _Warned = {}  # and those an overflow's size belied
_WARNED_LOCK = threading.Lock()
"""Held while one of them is looked up and changed: runs in threads warn at once (two
forgetting the oldest model at once made one of them fail with ``KeyError``)."""


def _check(ok: Callable[[Any], bool], allowed: str) -> Validator:
    """``check`` for the field validated, named ``manage_context: <field>``."""

    def validate(instance: object, attribute: Any, value: Any) -> None:
        check(f"manage_context: {attribute.name}", ok, allowed)(instance, attribute, value)

    return validate


_SWITCH = _check(lambda v: isinstance(v, bool), "True or False")
_WINDOW = _check(is_token_count, TOKEN_COUNT)
_OPTIONAL_CAP = optional(_check(is_output_cap, f"{OUTPUT_CAP} or None"))


@frozen(kw_only=True)
class ContextManagement:
    """The ``manage_context`` configuration of an agent class (``Agent.context_management``).

    Args:
        context_window_tokens: The window used when the model advertises none (> 0).
        context_window_override: The window used whatever the model advertises, or None.
        compression_threshold: Compact at this share of the window, in (0, 1].
        summary_ratio: The share of the conversation summarized, in [0.1, 0.8].
        preserve_recent_messages: Newest messages kept verbatim (>= 2); overflow recovery
            may summarize them, never the current turn.
        tokenizer: Counts tokens (``count_tokens(text)``); default ``CharacterEstimator()``.
        summary_instructions: Replaces the summarizer's instructions.
        summary_max_tokens: The cap of the summary and of what it quotes (under the window);
            default a quarter of the window, at most 4 096.
        quote_specifics: Keep the summarized specifics in their own words beside the notes.
        mask_tool_results: Before summarizing, mask tool results older than the newest this
            many tool-call groups (``None``, the default: never).
        budget: A ``PromptBudget``: every request's view is first bounded to it.
        summarize: False never compacts with a model (needs ``budget``).
        strategy: How to compact, in place of the default summarizer (the threshold still
            decides when; overflow recovery uses it too).
    """

    context_window_tokens: int = field(
        factory=lambda: env_tokens("LITTLEGHOST_CONTEXT_WINDOW_TOKENS", 200_000), validator=_WINDOW
    )
    context_window_override: int | None = field(default=None, validator=optional(_WINDOW))
    compression_threshold: float = field(
        default=0.85, validator=_check(lambda v: is_number(v) and 0 < v <= 1, "a number in (0, 1]")
    )
    summary_ratio: float = field(
        default=0.3,
        validator=_check(lambda v: is_number(v) and 0.1 <= v <= 0.8, "a number in [0.1, 0.8]"),
    )
    preserve_recent_messages: int = field(
        default=10, validator=_check(int_at_least(2), "an int >= 2")
    )
    tokenizer: Tokenizer = field(
        default=DEFAULT_TOKENIZER, validator=_check(counts_tokens, TOKENIZER)
    )
    summary_instructions: str | None = field(
        default=None,
        converter=well_formed_value,
        validator=optional(
            _check(lambda v: isinstance(v, str) and v.strip() != "", "a non-empty str or None")
        ),
    )
    summary_max_tokens: int | None = field(default=None, validator=_OPTIONAL_CAP)
    quote_specifics: bool = field(default=True, validator=_SWITCH)
    mask_tool_results: int | None = field(
        default=None, validator=optional(_check(int_at_least(0), "an int >= 0 or None"))
    )
    budget: PromptBudget | None = field(
        default=None,
        validator=optional(_check(lambda v: isinstance(v, PromptBudget), "a PromptBudget or None")),
    )
    summarize: bool = field(default=True, validator=_SWITCH)
    strategy: CompactionStrategy | None = field(
        default=None,
        validator=optional(lambda _, __, value: check_strategy("manage_context: strategy", value)),
    )

    def __attrs_post_init__(self) -> None:
        if self.strategy is not None and not self.summarize:
            raise ConfigurationError(
                "manage_context: strategy= decides how to compact; summarize=False turns "
                "compaction off, so the two cannot be combined"
            )
        if self.strategy is not None and (ignored := self._default_summarizer_only()):
            raise ConfigurationError(
                f"manage_context: {ignored} shapes the default summarizer, which strategy= "
                "replaces: give the strategy its own (Summarization(prompt=, max_tokens=, "
                "quote_specifics=), ToolResultCompaction, ...) and leave it out"
            )
        if self.budget is None and not self.summarize:
            raise ConfigurationError(
                "manage_context: summarize=False needs budget=PromptBudget(...) to keep requests in "
                "the window without a model"
            )
        budget = () if self.budget is None else (self.budget.tokenizer,)
        for tokenizer in (self.tokenizer, *budget):
            figure = tokenizer.count_tokens("manage_context")
            if isinstance(figure, bool) or not isinstance(figure, numbers.Real) or figure < 0:
                raise ConfigurationError(
                    f"manage_context: tokenizer {type(tokenizer).__name__}'s count_tokens "
                    f"returned {wrong_value(figure)}, not a number of tokens (>= 0)"
                )
        self.check_window(self.declared_window)
        self._check_summary_room(self.declared_window)

    @property
    def declared_window(self) -> int:
        """The window a class declares: checked against at class definition."""
        return self.context_window_override or self.context_window_tokens

    def _default_summarizer_only(self) -> str | None:
        """The first keyword given that only the default summarizer reads."""
        names = ["summary_ratio", "summary_instructions", "quote_specifics", "mask_tool_results"]
        if self.budget is None:  # else it caps the summaries the budget shows too
            names.append("summary_max_tokens")
        fields = fields_dict(ContextManagement)
        return next((name for name in names if getattr(self, name) != fields[name].default), None)

    def check_window(self, window: int) -> None:
        """``ConfigurationError`` when a summary's cap (``summary_max_tokens``, a
        ``Summarization``'s ``max_tokens``) is not under ``window``, or the budget's
        reserves leave no room in it."""
        caps = [("summary_max_tokens", self.summary_max_tokens)] + [
            ("Summarization.max_tokens", step.max_tokens)
            for step in (summarizations(self.strategy) if self.strategy else ())
        ]
        for name, cap in caps:
            if cap is not None and cap >= window:
                raise ConfigurationError(
                    f"manage_context: {name} ({cap}) must be under the {window}-token "
                    "context window"
                )
        if self.budget is not None:
            self.budget.check_window(window)

    def _check_summary_room(self, window: int) -> None:
        """``ConfigurationError`` when no summary call fits in the declared ``window`` (at
        the first call, a smaller window a model advertises leaves overflow recovery its
        fallback: the run goes on)."""
        if self.summarize:
            default = Summarization(
                prompt=self.summary_instructions, max_tokens=self.summary_cap(window)
            )
            least = least_summary_call(self.strategy or default, self.tokenizer, window)
            if least > (room := int(SUMMARY_FIT_MARGIN * window)):
                given = "override" if self.context_window_override else "tokens"
                said = "summary_instructions" if self.strategy is None else "Summarization.prompt"
                raise ConfigurationError(
                    f"manage_context: no summary call fits the {window}-token context window: "
                    f"its framing, instructions and least answer take about {least} tokens, "
                    f"over the {room} a summary request may fill; give a larger "
                    f"context_window_{given} or a shorter {said}"
                )

    def threshold(self, window: int) -> int:
        """The smallest estimate at which a compaction is due (0.55 × 200 000 is 110 000)."""
        return math.ceil(Decimal(repr(self.compression_threshold)) * window)

    def summary_cap(self, window: int) -> int:
        """The summary's output cap for ``window``."""
        return self.summary_max_tokens or max(1, min(window // 4, 4_096))


class ContextOptions(TypedDict, total=False):
    """The keywords of ``@manage_context(...)``, as ``ContextManagement`` describes them
    (a type checker then catches a misspelled or mistyped one)."""

    context_window_tokens: int
    context_window_override: int | None
    compression_threshold: float
    summary_ratio: float
    preserve_recent_messages: int
    tokenizer: Tokenizer
    summary_instructions: str | None
    summary_max_tokens: int | None
    quote_specifics: bool
    mask_tool_results: int | None
    budget: PromptBudget | None
    summarize: bool
    strategy: CompactionStrategy | None


def context_window(model: Model, config: ContextManagement) -> int:
    """The window compaction works against: the override, else the model's, else
    ``context_window_tokens`` (warned about once per model; a model's 0 is taken for
    unknown, as ``None``); a model's that is no count of tokens (``"big"``, -5, 1.5) is a
    ``ConfigurationError``."""
    if config.context_window_override is not None:
        return config.context_window_override
    advertised = model.context_window  # a property's own error is the user's to see
    if is_token_count(advertised):
        return advertised
    if advertised is not None and not (is_int(advertised) and advertised == 0):
        raise ConfigurationError(
            f"manage_context: model {getattr(model, 'name', '')!r} advertises a "
            f"context_window of {safe_repr(advertised)}: it must be {TOKEN_COUNT} (tokens), "
            "or None (or 0) when unknown"
        )
    assuming = config.context_window_tokens
    _warn_once(
        _assumed_windows, model, (), "advertises no context window; assuming %d tokens", assuming
    )
    return assuming


def reported_window(model: Model, window: int, reported: int | None) -> int:
    """The smaller of ``window`` and one an overflow error ``reported`` (warned about once)."""
    if not reported or reported >= window:  # none, or no smaller
        return window
    said = "reported a %d-token context window in an overflow error, under the %d tokens "
    said += "compacted for; the run compacts for %d from now on"
    _warn_once(_reported_windows, model, (reported,), said, reported, window, reported)
    return reported


def belied_window(model: Model, window: int, overflowed: int) -> int:
    """The window after an overflow within ``window`` at ``overflowed`` tokens (prompt and
    answer's room) that reported none: one token under it (warned about once per model,
    whatever the size: each overflow has its own)."""
    said = "overflowed at %d tokens (the prompt and its answer's room) without reporting "
    said += "its window, within the %d tokens compacted for; the run compacts for %d from now on"
    _warn_once(_belied_windows, model, (), said, overflowed, window, overflowed - 1)
    return overflowed - 1


def _warn_once(
    warned: _Warned, model: Model, key: tuple[int, ...], said: str, *figures: int
) -> None:
    """Warn that ``model`` ``said`` (with ``figures``), once per model and ``key`` of the
    ``_WARNED_MODELS`` warned about last."""
    provider, name = str(getattr(model, "provider", "")), str(getattr(model, "name", ""))
    seen = (provider, name, *key)
    with _WARNED_LOCK:
        if seen in warned:
            return
        warned[seen] = None
        if len(warned) > _WARNED_MODELS:
            del warned[next(iter(warned))]
    logger.warning(
        f"manage_context: model %r (provider %r) {said}. Set context_window= on the model, "
        "or context_window_override= or context_window_tokens= on manage_context",
        name,
        provider,
        *figures,
    )


def check_result_cap(agent: object, window: int) -> None:
    """``ConfigurationError`` when ``agent`` (a class or an agent) declares a
    ``max_tool_result_tokens`` (not ``Agent``'s default) not under ``window``: one tool
    result could fill it.
    """
    name = "max_tool_result_tokens"
    cls = agent if isinstance(agent, type) else type(agent)
    owner = next((klass for klass in cls.__mro__ if name in vars(klass)), None)
    own = not isinstance(agent, type) and name in getattr(agent, "__dict__", {})
    if not own and (owner is None or "__littleghost_agent__" in vars(owner)):
        return
    cap = getattr(agent, name)
    if cap >= window:
        raise ConfigurationError(
            f"{cls.__name__}: max_tool_result_tokens ({cap}) must be under the "
            f"{window}-token context window @manage_context manages: one tool result "
            "could fill it"
        )


def context_config(agent: object) -> ContextManagement | None:
    """The ``@manage_context`` configuration of ``agent``'s class, if it has one."""
    config = getattr(agent, "context_management", None)
    return config if isinstance(config, ContextManagement) else None
