"""The typed events a streaming run yields (values only)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, TypeVar, Union, get_args, get_origin

from attrs import field, frozen

from littleghost.messages import ToolCall, ToolResult
from littleghost.models.base import Usage

if TYPE_CHECKING:
    from littleghost.models.base import StopReason
    from littleghost.run import RunResult

OutputT = TypeVar("OutputT")

__all__ = [
    "CompactionFinished",
    "CompactionStarted",
    "Event",
    "EventOf",
    "ModelCallFinished",
    "ModelCallRetried",
    "ReasoningDelta",
    "RunFinished",
    "SideCallFinished",
    "TextDelta",
    "ToolCallFinished",
    "ToolCallStarted",
]


@frozen
class TextDelta:
    """A piece of the answer's text, as the model wrote it."""

    text: str


@frozen
class ReasoningDelta:
    """A piece of the model's reasoning, as it wrote it (never the answer's text)."""

    text: str


@frozen
class ToolCallStarted:
    """A tool call is about to run: the call as ``before_tool`` hooks left it, under the
    id the log holds (a hook's new id is not kept), so it pairs with its
    ``ToolCallFinished``."""

    call: ToolCall


@frozen
class ToolCallFinished:
    """A tool call finished; ``result.is_error`` tells whether it failed."""

    result: ToolResult


@frozen
class CompactionStarted:
    """Context management began compacting (``reason``: ``threshold`` or ``overflow``),
    the request estimated at ``estimated_tokens`` in a window of ``context_window_tokens``."""

    reason: str
    estimated_tokens: int
    context_window_tokens: int


@frozen
class CompactionFinished:
    """A compaction attempt ended (``outcome``: ``completed`` or ``error``), started for
    ``reason`` (as ``CompactionStarted``'s).

    ``removed_messages`` counts the messages of the request it left out (summarized,
    collapsed or dropped), not how much shorter the request got;
    ``estimated_tokens_after`` is the request's estimate after it (``None`` when not
    known) and ``estimated_tokens_before`` its estimate before, in the same units:
    ``CompactionStarted``'s figure, re-expressed when a summary call taught the estimate
    a new scale during the attempt (as the span event's); ``error_type`` is what failed
    (``None`` when it completed) and ``usage`` what its own model calls used (a
    summary's, one its strategy's own scope cut too).

    ``summary_outcome`` says how a summary it made came back: ``complete``,
    ``cut_at_cap`` (it reached its output cap; its complete lines were kept) or
    ``retried_shorter`` (asked once more, shorter); ``None`` when it made none.
    ``fallback`` is true for overflow recovery's compaction without a model, and
    ``tool_results_cut_to`` the tokens it cut the tool results to, if it did.
    ``error_message`` says why a ``CompactionError`` ended it (figures and framework words,
    no content); ``None`` for any other error, whose text may carry content.
    """

    reason: str
    outcome: str
    removed_messages: int
    estimated_tokens_after: int | None
    error_type: str | None
    usage: Usage
    summary_outcome: str | None = None
    fallback: bool = False
    tool_results_cut_to: int | None = None
    error_message: str | None = None
    estimated_tokens_before: int | None = None


@frozen
class ModelCallRetried:
    """A transient error, or one an ``after_model_error`` hook recovered from (an overflow
    ``@manage_context`` compacted for), interrupted the turn's model call; drop the text
    it streamed, it is retried (a recovery is told as its replacement goes out; a request
    refused before it is sent, for its pairing or settings, is no call, and none tells of
    it). ``error_type`` names the error (``RateLimitError``, ``context_length_exceeded``,
    ...); ``attempt`` numbers the turn's retries, both kinds together, from 1; ``usage``
    is what the interrupted call was billed, as its error said (an answer stopped at the
    context window), else zero."""

    attempt: int
    error_type: str
    usage: Usage = field(factory=Usage)


@frozen
class ModelCallFinished:
    """The turn's model call completed, with its ``usage`` and ``stop_reason`` (a side
    call ends with ``SideCallFinished``)."""

    usage: Usage
    stop_reason: StopReason


@frozen
class SideCallFinished:
    """A side call (``RunContext.complete``: a guardrail's check, a tool's digest)
    completed, or failed with ``error_type`` but was billed (an answer stopped at the
    context window; an attempt retried after its stream broke, whatever ``report``;
    ``cancelled``: a cancellation, a tool's timeout say, cut it after its provider
    reported usage, told just before the run's next event); it is never streamed, and
    ``usage`` is its own part of the run's usage. ``purpose`` is its request's
    (``ModelRequest.purpose``)."""

    usage: Usage
    purpose: str
    error_type: str | None = None


@frozen
class RunFinished(Generic[OutputT]):
    """The run completed; ``result`` is its ``RunResult`` (as ``events.result``), typed
    as the stream's."""

    result: RunResult[OutputT]


EventOf = Union[  # noqa: UP007 - a generic alias: its type variable is the output's
    TextDelta,
    ReasoningDelta,
    ToolCallStarted,
    ToolCallFinished,
    CompactionStarted,
    CompactionFinished,
    ModelCallRetried,
    ModelCallFinished,
    SideCallFinished,
    RunFinished[OutputT],
]
"""The events of a stream whose ``result.output`` is an ``OutputT``
(``agent.stream(..., output_type=T)`` yields ``EventOf[T]``)."""
if TYPE_CHECKING:
    Event = EventOf[Any]
else:  # a union of the classes, which isinstance() takes (not of a subscripted generic)
    Event = Union[tuple(get_origin(kind) or kind for kind in get_args(EventOf))]  # noqa: UP007
