"""A fact-retention check: compact a conversation as an agent would, then ask about it.

``check_retention`` forces one compaction of a conversation with the agent's own
``@manage_context`` (its strategy, or the default summarizer with its instructions, cap
and masking), then asks each probe question with the compacted log as history and
reports, per fact, whether its expected value is still in what the model sees (the
request that asked, as the run shaped it) and whether the answer gives it. Teams use it
to test their summarizer instructions and strategies on their own conversations
(``littleghost.testing`` exports it).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from attrs import field, frozen

from littleghost import runner
from littleghost._validators import check, safe_repr, wrong_value
from littleghost.agent import Agent
from littleghost.context.outside import compact_log
from littleghost.context.summarize import render_transcript, summary_text
from littleghost.errors import ConfigurationError, ProtocolError
from littleghost.log_rules import check_history
from littleghost.messages import Message
from littleghost.models.base import Model, ModelRequest, ModelResponse
from littleghost.run import RunContext
from littleghost.text import RUN_TOGETHER

__all__ = ["Fact", "FactCheck", "RetentionReport", "check_retention"]


def _spellings(value: object) -> tuple[str, ...]:
    texts = (value,) if isinstance(value, str) else value
    spellings = (
        tuple(texts)
        if isinstance(texts, Iterable) and not isinstance(texts, (bytes, Mapping))
        else ()
    )
    if not spellings or not all(isinstance(s, str) and s.strip() for s in spellings):
        raise ConfigurationError(
            f"Fact.expected must be a non-empty str or a sequence of them, not {safe_repr(value)}"
        )
    return spellings


_WORD = rf"[^\W{RUN_TOGETHER}]"
_BEFORE = rf"(?<!{_WORD})(?<!\.)(?<!\d,(?=\d))"
_AFTER = rf"(?!{_WORD}|[.,]\d)"
"""What may not touch a value found: a letter, digit or ``_`` (but a letter of a script
that runs words together, as Japanese does), a point before it, nor a point or comma
between it and more digits (``45`` is not in ``1.45`` or ``45,000``)."""
_TOGETHER = re.compile(f"[{RUN_TOGETHER}]")


def _continues(text: str, index: int) -> bool:
    """Whether ``text[index]`` is a combining mark of a script that spaces its words: it
    continues the word it is in (a Hindi vowel sign), which ``re`` cannot tell."""
    if not 0 <= index < len(text):
        return False
    char = text[index]
    return unicodedata.category(char).startswith("M") and not _TOGETHER.match(char)


def _normal(text: str) -> str:
    """``text`` as values are compared: Unicode compatibility forms made one (a decomposed
    ``é`` is the composed one, ``１２００`` is ``1200``), case folded, spacing single."""
    folded = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", text).casefold())
    return " ".join(folded.split())


def _found(value: str, text: str) -> bool:
    """``value`` stands in ``text`` as a whole word or number (``_BEFORE``, ``_AFTER``,
    ``_continues``), as compared; every place it starts at is tried, overlapping too."""
    haystack, needle = _normal(text), _normal(value)
    places = re.finditer(f"(?=({_BEFORE}{re.escape(needle)}{_AFTER}))", haystack)
    return any(
        not (_continues(haystack, place.start(1) - 1) or _continues(haystack, place.end(1)))
        for place in places
    )


@frozen
class Fact:
    """A fact the conversation gave, and how to ask for it.

    Args:
        question: The probe question, asked after the compaction; it may not hold an
            expected value (an answer that repeats it would count as answered).
        expected: The value an answer must contain as a whole word or number (case,
            spacing and Unicode form ignored: ``45 seconds`` is not in ``145 seconds``,
            nor ``349.80`` in ``1,349.80``, a combining mark continues its word; in
            Japanese, Chinese or Korean text it may touch that script's letters:
            ``KT-50917`` is in ``KT-50917です``), or several accepted spellings.
    """

    question: str = field(
        validator=check(
            "Fact.question", lambda v: isinstance(v, str) and v.strip() != "", "a non-empty str"
        )
    )
    expected: tuple[str, ...] = field(converter=_spellings)

    def __attrs_post_init__(self) -> None:
        for spelling in self.expected:  # an answer that repeats the question would count
            if _found(spelling, self.question):
                raise ConfigurationError(
                    f"Fact: the question gives its expected value {safe_repr(spelling)} away; "
                    "an answer that repeats it would count as answered"
                )

    def found_in(self, text: str) -> bool:
        """True when ``text`` holds one of the expected spellings, not as part of a
        longer word or number."""
        return any(_found(spelling, text) for spelling in self.expected)


@frozen
class FactCheck:
    """What became of one fact.

    Attributes:
        fact: The fact.
        in_view: Its value is in the request that asked its question, the question
            aside: what the model saw, after the run clipped tool results, bounded the
            view to a ``PromptBudget`` or compacted again.
        answered: The answer to its question contains its value.
        answer: That answer.
    """

    fact: Fact
    in_view: bool
    answered: bool
    answer: str


@frozen
class RetentionReport:
    """The outcome of ``check_retention``.

    Attributes:
        checks: One per fact, in order.
        records: What the compaction appended (empty: nothing was compacted).
        summary: The summary it wrote, if any.
    """

    checks: tuple[FactCheck, ...]
    records: tuple[Message, ...]
    summary: str | None

    @property
    def kept(self) -> int:
        """How many facts are still in what the model sees."""
        return sum(check.in_view for check in self.checks)

    @property
    def answered(self) -> int:
        """How many probe questions the agent answered with the expected value."""
        return sum(check.answered for check in self.checks)

    def __str__(self) -> str:
        lines = [
            f"facts kept in view: {self.kept}/{len(self.checks)}; "
            f"answered: {self.answered}/{len(self.checks)}"
        ]
        for item in self.checks:
            marks = f"{'kept' if item.in_view else 'LOST'} {'ok' if item.answered else 'MISS'}"
            lines.append(f"  {marks:9} {item.fact.question} -> {item.fact.expected[0]}")
        return "\n".join(lines)


async def check_retention(
    agent: Agent, conversation: Sequence[Message], facts: Sequence[Fact]
) -> RetentionReport:
    """Compact ``conversation`` once with ``agent``'s context management (whatever its
    threshold), then ask each fact's question in a run with the compacted log as
    history (one run per question, each from the same log), for a free-text answer
    whatever the agent's ``output_type``.

    Raises:
        ConfigurationError: ``agent`` is not an agent, its class has no
            ``@manage_context``, ``facts`` is not a non-empty list of ``Fact``, or
            ``conversation`` holds what ``run(history=)`` refuses (a reused id, a
            misplaced result); before any model call.
        TypeError: ``conversation`` is not a sequence of ``Message``.
    """
    if not isinstance(agent, Agent):
        raise ConfigurationError(
            f"check_retention: agent must be an Agent, not {wrong_value(agent)}"
        )
    if isinstance(facts, (str, Fact)) or not isinstance(facts, Sequence):
        raise ConfigurationError(
            f"check_retention: facts must be a list of Fact, not {safe_repr(facts)}"
        )
    if not facts:
        raise ConfigurationError("check_retention needs at least one Fact")
    for position, fact in enumerate(facts):
        if not isinstance(fact, Fact):
            raise ConfigurationError(
                f"check_retention: facts[{position}] must be a Fact, not {safe_repr(fact)}"
            )
    conversation = check_history(conversation, "conversation")
    records = await compact_log(agent, conversation)
    log = (*conversation, *records)
    summaries = [summary_text(record) for record in records if record.is_summary]
    checks = []
    for fact in facts:
        answer, seen = await _ask(agent, fact.question, log)
        checks.append(FactCheck(fact, fact.found_in(seen), fact.found_in(answer), answer))
    return RetentionReport(tuple(checks), records, summaries[-1] if summaries else None)


class _Asking:
    """The agent's model, keeping the first request of the run's own turn it answers
    (the one that asked the question, as the run shaped it: not a summary or a hook's
    side call, whatever they hold); anything else is the model's own."""

    def __init__(self, model: Model) -> None:
        self.model = model
        self.context: RunContext | None = None
        """The run's context (``runner.run``'s ``observe``), which knows its turn's call."""
        self.asked: ModelRequest | None = None

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def provider(self) -> str:
        return self.model.provider

    @property
    def context_window(self) -> int | None:
        return self.model.context_window

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)  # prepare, stream, ...: the model's, if it has them

    async def respond(self, request: ModelRequest) -> ModelResponse:
        response = await self.model.respond(request)
        if self.asked is None and self.context is not None and self.context.last_sent is request:
            self.asked = request
        return response

    def observe(self, context: RunContext) -> None:
        self.context = context


async def _ask(agent: Agent, question: str, log: Sequence[Message]) -> tuple[str, str]:
    """The free-text answer to ``question`` from a run with ``log`` as history, and the
    transcript of the request that asked it, without the question (as the run logged it
    or a hook rebuilt it: what the user asked is not what the model was shown)."""
    plan = runner.plan_run(agent, question, history=log, output_type=str)
    async with agent._models.use(  # closed here if given up
        agent._resolved_model(), agent.cleanup_grace, declared=agent._model_string()
    ) as used:
        model = _Asking(used)
        result = await runner.run(agent, plan, make_model=lambda: model, observe=model.observe)
    if model.asked is None:  # a model of the agent's own that never answered a turn
        raise ProtocolError(f"check_retention: {agent.name}'s run answered without a model call")
    sent = [
        message
        for message in model.asked.messages
        if message.id != plan.message.id and message.text != question
    ]
    return result.output, render_transcript(sent)
