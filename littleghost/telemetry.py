"""Telemetry: the tracer and the GenAI client and agent metrics, GenAI attribute names,
littleghost event names, content policy.

Only ``opentelemetry-api`` is used. Spans and metrics follow the OpenTelemetry GenAI
conventions. No message content, tool argument, summary or credential reaches a span
unless the agent opts in with ``capture_content = True``, nor ever a metric.
"""

from __future__ import annotations

import json
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

import anyio
from opentelemetry import metrics, trace
from opentelemetry.metrics import Histogram
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from littleghost._validators import is_int
from littleghost._version import __version__
from littleghost.cleanup import cancellation_turned_into
from littleghost.errors import (
    ConfigurationError,
    ContextWindowOverflowError,
    DeadlineExceededError,
)
from littleghost.messages import ImagePart, Message, ReasoningPart, TextPart, ToolCall, ToolResult
from littleghost.models._sdk import inline_image
from littleghost.models.base import ModelRequest, ModelResponse, StopReason, Usage
from littleghost.text import cut_middle, json_text

__all__ = [
    "CANCELLED",
    "COMPACTION_EVENT",
    "COMPACTION_SPAN",
    "ended_type",
    "error_type",
    "failure_type",
    "finish_reason",
    "input_attributes",
    "messages_json",
    "open_span",
    "record_call",
    "reported",
    "tracer",
    "usage_attributes",
]

tracer = trace.get_tracer("littleghost", __version__)
_meter = metrics.get_meter("littleghost", __version__)
_SECONDS = [0.01 * 2**power for power in range(14)]
"""The conventions' advised bucket boundaries for durations (a call's, to its first
chunk, between chunks; a run's, a tool call's), 0.01 s to 81.92 s."""


def _seconds(name: str, description: str) -> Histogram:
    """A histogram of durations, in seconds, with the conventions' advised buckets."""
    return _meter.create_histogram(
        name, unit="s", description=description, explicit_bucket_boundaries_advisory=_SECONDS
    )


_CALL_DURATION = _seconds("gen_ai.client.operation.duration", "GenAI operation duration")
_FIRST_CHUNK = _seconds(
    "gen_ai.client.operation.time_to_first_chunk",
    "Time to receive the first chunk of a streamed answer",
)
_PER_CHUNK = _seconds(
    "gen_ai.client.operation.time_per_output_chunk",
    "Time per output chunk of a streamed answer, after the first one",
)
_AGENT_DURATION = _seconds("gen_ai.invoke_agent.duration", "GenAI agent invocation duration")
_TOOL_DURATION = _seconds("gen_ai.execute_tool.duration", "GenAI tool execution duration")
_TOKEN_USAGE = _meter.create_histogram(
    "gen_ai.client.token.usage",
    unit="{token}",
    description="Number of input and output tokens used",
    explicit_bucket_boundaries_advisory=[4**power for power in range(14)],
)

OPERATION_NAME = "gen_ai.operation.name"
PROVIDER_NAME = "gen_ai.provider.name"
REQUEST_MODEL = "gen_ai.request.model"
REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
REQUEST_TEMPERATURE = "gen_ai.request.temperature"
REQUEST_TOP_P = "gen_ai.request.top_p"
REQUEST_TOP_K = "gen_ai.request.top_k"
REQUEST_FREQUENCY_PENALTY = "gen_ai.request.frequency_penalty"
REQUEST_PRESENCE_PENALTY = "gen_ai.request.presence_penalty"
REQUEST_SEED = "gen_ai.request.seed"
REQUEST_STOP_SEQUENCES = "gen_ai.request.stop_sequences"
REQUEST_STREAM = "gen_ai.request.stream"
RESPONSE_FINISH_REASONS = "gen_ai.response.finish_reasons"
RESPONSE_ID = "gen_ai.response.id"
RESPONSE_MODEL = "gen_ai.response.model"
RESPONSE_FIRST_CHUNK = "gen_ai.response.time_to_first_chunk"
SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
USAGE_CACHE_READ_TOKENS = "gen_ai.usage.cache_read.input_tokens"
USAGE_CACHE_WRITE_TOKENS = "gen_ai.usage.cache_write.input_tokens"
USAGE_REASONING_TOKENS = "gen_ai.usage.reasoning.output_tokens"
AGENT_NAME = "gen_ai.agent.name"
CONVERSATION_ID = "gen_ai.conversation.id"
CONVERSATION_COMPACTED = "gen_ai.conversation.compacted"
TOOL_NAME = "gen_ai.tool.name"
TOOL_CALL_ID = "gen_ai.tool.call.id"
TOOL_TYPE = "gen_ai.tool.type"
TOOL_DESCRIPTION = "gen_ai.tool.description"
TOOL_DEFINITIONS = "gen_ai.tool.definitions"
TOOL_CALL_ARGUMENTS = "gen_ai.tool.call.arguments"
TOOL_CALL_RESULT = "gen_ai.tool.call.result"
INPUT_MESSAGES = "gen_ai.input.messages"
SYSTEM_INSTRUCTIONS = "gen_ai.system_instructions"
OUTPUT_MESSAGES = "gen_ai.output.messages"
OUTPUT_TYPE = "gen_ai.output.type"
OUTPUT_EMPTY = "littleghost.output.empty"
"""On ``invoke_agent``: a free-text run ended with an answer of no text (whitespace at
most), which is its output as it is."""
ERROR_TYPE = "error.type"
PURPOSE = "littleghost.purpose"
COUNTED_PROMPT_TOKENS = "littleghost.counted_prompt_tokens"
"""On a ``count_tokens`` span: the prompt tokens the model counted for the request it was
asked about (``count_prompt_tokens``), when it could tell."""

COMPACTION_EVENT = "littleghost.context.compaction"
COMPACTION_SPAN = COMPACTION_EVENT
"""The span of a compaction outside runs, named as a run's compaction event is (the
conventions name no operation for it); it carries that event's attributes."""
COMPACTION_REASON = "littleghost.compaction.reason"
COMPACTION_OUTCOME = "littleghost.compaction.outcome"
COMPACTION_REMOVED = "littleghost.compaction.removed_messages"
COMPACTION_ESTIMATED = "littleghost.compaction.estimated_tokens"
COMPACTION_ESTIMATED_AFTER = "littleghost.compaction.estimated_tokens_after"
COMPACTION_WINDOW = "littleghost.compaction.context_window_tokens"
COMPACTION_SKIPPED = "littleghost.compaction.skipped_because"
COMPACTION_FALLBACK = "littleghost.compaction.fallback"
COMPACTION_SUMMARY = "littleghost.compaction.summary_outcome"
COMPACTION_CUT_TO = "littleghost.compaction.tool_results_cut_to_tokens"
COMPACTION_ERROR = "littleghost.compaction.error_message"
COMPACTION_COUNTED = "littleghost.compaction.counted_prompt_tokens"
"""On the chat span of a call overflow recovery retried: the prompt tokens the model
counted for it (``count_prompt_tokens``)."""

PARTIAL_COUNT_EVENT = "littleghost.context.partial_count"
"""A span event of the run: a model reported fewer prompt tokens than a whole prompt has
(the server cut it, or counted only what it had not cached); ``@manage_context`` does not
learn from that count."""
REPORTED_PROMPT_TOKENS = "littleghost.context.reported_prompt_tokens"
LEAST_PROMPT_TOKENS = "littleghost.context.least_prompt_tokens"
"""The fewest prompt tokens the run takes a whole count of that request to have."""

_SETTING_ATTRIBUTES = {
    "max_tokens": REQUEST_MAX_TOKENS,
    "max_completion_tokens": REQUEST_MAX_TOKENS,
    "temperature": REQUEST_TEMPERATURE,
    "top_p": REQUEST_TOP_P,
    "top_k": REQUEST_TOP_K,
    "frequency_penalty": REQUEST_FREQUENCY_PENALTY,
    "presence_penalty": REQUEST_PRESENCE_PENALTY,
    "seed": REQUEST_SEED,
}


def error_type(error: BaseException) -> str:
    """A low-cardinality name for an error, for ``error.type``."""
    if isinstance(error, ContextWindowOverflowError):
        return "context_length_exceeded"
    return type(error).__qualname__


def exception_event(error: BaseException) -> dict[str, str]:
    """The attributes of the ``exception`` span event of ``error``, as the SDK's
    ``record_exception`` makes them (but for the deprecated ``exception.escaped``, and a
    ``str()`` that fails): made ahead where that ``str()`` should not run on the loop."""
    kind, module = type(error), type(error).__module__
    try:
        message = str(error)
    except Exception:
        message = "(its message could not be shown)"
    trace = traceback.format_exception(kind, error, error.__traceback__)
    return {
        "exception.type": f"{module}.{kind.__qualname__}"
        if module and module != "builtins"
        else kind.__qualname__,
        "exception.message": message,
        "exception.stacktrace": "".join(trace),
    }


def failure_type(error: BaseException, deadline: float | None = None) -> str | None:
    """``error.type`` of an operation ``error`` ended: ``None`` when it only stopped (a
    cancellation, a generator's close, or the error a client turned a cancellation that
    goes on into: "connection closed") before the run's ``deadline`` (in
    ``anyio.current_time()`` units), ``DeadlineExceededError`` when that deadline cut it:
    it timed out, as the run did."""
    if not _stops(error) and not cancellation_turned_into(error):
        return error_type(error)
    if deadline is None or anyio.current_time() < deadline:
        return None
    return DeadlineExceededError.__name__


CANCELLED = "cancelled"
"""``error.type`` of work a cancellation stopped (the caller's, a tool's timeout, a
consumer leaving ``agent.stream()``): a model call's in the duration metric and its
``SideCallFinished``, a run's or tool call's in its duration metric, a tool's that
raised one on its ``execute_tool`` span."""


def ended_type(error: BaseException, deadline: float | None = None) -> str:
    """``error.type`` of a model call ``error`` ended: ``failure_type``'s, or
    ``CANCELLED`` for one a cancellation stopped (its span stays UNSET: it did not fail,
    but it did not answer either)."""
    return failure_type(error, deadline) or CANCELLED


def no_time() -> float | None:
    """No time: the default of a callable that tells a time (a deadline, a chunk's)."""
    return None


_marks: ContextVar[tuple[Span, list[str]] | None] = ContextVar(
    "littleghost.telemetry.marks", default=None
)
"""The innermost timed span open here (``open_span``) and each ``error.type`` it was
marked with, for its duration metric."""


def mark_failed(span: Span, error: BaseException | str) -> None:
    """Set ERROR status and ``error.type`` (an exception's, or the given name) on ``span``
    (and on its duration metric, for a timed one); the status description holds no
    content."""
    kind = error if isinstance(error, str) else error_type(error)
    span.set_attribute(ERROR_TYPE, kind)
    span.set_status(Status(StatusCode.ERROR, kind))
    marks = _marks.get()
    if marks is not None and marks[0] is span:
        marks[1].append(kind)


_FINISH_REASONS = {
    StopReason.END_TURN: "stop",
    StopReason.STOP_SEQUENCE: "stop",
    StopReason.MAX_TOKENS: "length",
    StopReason.TOOL_USE: "tool_call",
    StopReason.CONTENT_FILTER: "content_filter",
}


UNANSWERED = ("error",)
"""``gen_ai.response.finish_reasons`` of a ``chat`` or ``invoke_agent`` span that ended
without an answer: failed, cancelled or cut off."""


def finish_reason(reason: StopReason) -> str:
    """Why a model stopped, in the GenAI conventions' words (their ``FinishReason``:
    ``stop``, ``length``, ``tool_call``, ``content_filter``), whatever the provider."""
    return _FINISH_REASONS[reason]


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
_FLOAT_MAX = int(sys.float_info.max)
_DOUBLES = frozenset(
    {
        REQUEST_TEMPERATURE,
        REQUEST_TOP_P,
        REQUEST_TOP_K,
        REQUEST_FREQUENCY_PENALTY,
        REQUEST_PRESENCE_PENALTY,
    }
)
"""The request attributes the conventions type as doubles: one of them is a float on
every span (``temperature=1`` too), as a backend that types attributes takes it."""


def setting_attributes(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The GenAI request attributes for the settings a request carries: the numbers (as
    floats where the conventions type them so), and the stop sequences of ``stop`` (a
    string or a list of them) or ``stop_sequences``."""
    attributes: dict[str, Any] = {}
    for key, name in _SETTING_ATTRIBUTES.items():
        value = settings.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if name in _DOUBLES:
            if isinstance(value, float) or -_FLOAT_MAX <= value <= _FLOAT_MAX:
                attributes[name] = float(value)
        elif isinstance(value, float) or _INT64_MIN <= value <= _INT64_MAX:
            attributes[name] = value  # an int OpenTelemetry cannot export is left out
    stop = settings.get("stop")
    if stop is None:
        stop = settings.get("stop_sequences")
    if isinstance(stop, str):
        stop = [stop]
    if isinstance(stop, (list, tuple)) and stop and all(isinstance(item, str) for item in stop):
        attributes[REQUEST_STOP_SEQUENCES] = tuple(stop)
    return attributes


_OWN_NAMESPACES = ("gen_ai.", "server.", "error.")
"""The conventions' names a call's span sets itself (and its metrics keep)."""
_ATTRIBUTE_KINDS = (str, bool, int, float)


def _kept_value(value: object) -> bool:
    """Whether a span keeps ``value`` (or ``None``, no figure): a str, bool, int or
    float, or a list or tuple of one of those kinds (``None`` among them too)."""
    if value is None or isinstance(value, _ATTRIBUTE_KINDS):
        return True
    if not isinstance(value, (list, tuple)):
        return False
    kinds = {type(item) for item in value if item is not None}
    return len(kinds) <= 1 and kinds <= set(_ATTRIBUTE_KINDS)  # as the SDK: by exact type


def check_annotations(owner: str, attributes: object) -> None:
    """``TypeError`` unless ``attributes`` maps str names to values a span keeps;
    ``ConfigurationError`` for a name of the conventions' that the span sets itself."""
    if not isinstance(attributes, Mapping):
        raise TypeError(
            f"{owner} takes a mapping of attribute names to figures "
            f"({{'retrieval.documents': 3}}), not {type(attributes).__name__}"
        )
    for name, value in attributes.items():
        if not isinstance(name, str):
            raise TypeError(f"{owner}: an attribute name must be a str, not {type(name).__name__}")
        if name.startswith(_OWN_NAMESPACES):
            raise ConfigurationError(
                f"{owner}: {name!r} is a name of the GenAI conventions, whose gen_ai., server. "
                "and error. attributes the call's span sets itself: name yours in a namespace "
                "of your own ('retrieval.documents')"
            )
        if not _kept_value(value):
            raise TypeError(
                f"{owner}: attribute {name!r} must be a str, bool, int or float, or a list of "
                f"one kind of them (what a span keeps), not {type(value).__name__}"
            )


def conversation_attributes(session_id: str | None) -> dict[str, str]:
    """``gen_ai.conversation.id``: the run's session, when it has one."""
    return {} if session_id is None else {CONVERSATION_ID: session_id}


def run_names(agent_name: str, session_id: str | None = None) -> dict[str, str]:
    """``gen_ai.agent.name`` and ``conversation_attributes``: what names a run (or a
    compaction) on its spans and log records."""
    return {AGENT_NAME: agent_name, **conversation_attributes(session_id)}


def server_attributes(model: object) -> dict[str, Any]:
    """``server.address`` and ``server.port`` from a model's optional ``server_address``
    (a non-empty ``str``) and ``server_port`` (an ``int`` from 1 to 65535, given only
    with an address); a value of another type is left out."""
    address = getattr(model, "server_address", None)
    if not isinstance(address, str) or not address:
        return {}
    attributes: dict[str, Any] = {SERVER_ADDRESS: address}
    port = getattr(model, "server_port", None)
    if is_int(port) and 0 < port < 65536:
        attributes[SERVER_PORT] = port
    return attributes


REPORTED_CHARS = 256
"""The most characters telemetry keeps of an id or a name a model or its provider gave
(an answer's id and model, a call's id, the name of a tool the agent does not declare):
ten times a real one's, whatever a hostile server sends."""


def reported(text: str) -> str:
    """``text``, an id or name a model gave, as telemetry records it: cut in the middle
    to ``REPORTED_CHARS``, ``cut_middle``'s marker included, when longer."""
    if len(text) <= REPORTED_CHARS:
        return text
    return cut_middle(text, REPORTED_CHARS - 48)  # the marker: 48 characters at most


def response_attributes(response: ModelResponse) -> dict[str, Any]:
    """The GenAI response attributes: finish reason, usage, and the response's id and
    model when the provider reported them (metadata, never content)."""
    attributes: dict[str, Any] = {
        **usage_attributes(response.usage),
        RESPONSE_FINISH_REASONS: (finish_reason(response.stop_reason),),
    }
    if response.response_id is not None:
        attributes[RESPONSE_ID] = reported(response.response_id)
    if response.response_model is not None:
        attributes[RESPONSE_MODEL] = reported(response.response_model)
    return attributes


def usage_attributes(usage: Usage) -> dict[str, int]:
    """The GenAI usage attributes: the input and output tokens, and the cache and
    reasoning parts of them, that the provider reported; a count of 0 is one it did not
    report (``Usage`` cannot tell them apart), left out as the token metric leaves it."""
    counts = {
        USAGE_INPUT_TOKENS: usage.input_tokens,
        USAGE_OUTPUT_TOKENS: usage.output_tokens,
        USAGE_CACHE_READ_TOKENS: usage.cache_read_tokens,
        USAGE_CACHE_WRITE_TOKENS: usage.cache_write_tokens,
        USAGE_REASONING_TOKENS: usage.reasoning_tokens,
    }
    return {name: count for name, count in counts.items() if count}


_DURATIONS = {
    "invoke_agent": (
        _AGENT_DURATION,
        frozenset({OPERATION_NAME, PROVIDER_NAME, AGENT_NAME, REQUEST_MODEL}),
    ),
    "execute_tool": (_TOOL_DURATION, frozenset({OPERATION_NAME, TOOL_NAME, TOOL_TYPE, AGENT_NAME})),
}
"""The operations whose spans are timed in a duration metric of the conventions' agent
metrics, with the attributes of their spans each keeps (never a session or call id)."""


@contextmanager
def open_span(
    name: str,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
    attributes: Mapping[str, Any] | None = None,
    deadline: Callable[[], float | None] = no_time,
    measured: Mapping[str, Any] | None = None,
) -> Iterator[Span]:
    """Open a current span that records a failure as ERROR (any exception, a
    ``BaseException`` of the caller's own too), a cancellation (or a generator's close)
    as UNSET, and one at or past the run's ``deadline()`` as ERROR with
    ``DeadlineExceededError`` (``failure_type``). An ``invoke_agent`` or ``execute_tool``
    span is timed in its duration metric as it ends, with the ``error.type`` it was
    marked with (``mark_failed``), or ``cancelled`` for one a cancellation stopped
    (``ended_type``, as a model call's), and its attributes (``measured`` over them)."""
    given = dict(attributes or {})
    timed = _DURATIONS.get(given.get(OPERATION_NAME, ""))
    begun = time.time_ns()  # the span's own start and end times time its metric
    with tracer.start_as_current_span(
        name,
        kind=kind,
        attributes=given,
        start_time=begun,
        record_exception=False,
        set_status_on_exception=False,
        end_on_exit=False,
    ) as span:
        marked: list[str] = []  # the error.type a timed span ends with (its last)
        mark = None if timed is None else _marks.set((span, marked))
        try:
            yield span
        except BaseException as error:
            failed = failure_type(error, deadline())
            if failed is not None:
                mark_failed(span, failed)
            else:
                marked.append(CANCELLED)
            raise
        finally:
            ended = time.time_ns()
            span.end(end_time=ended)
            if mark is not None:
                _marks.reset(mark)
            if timed is not None:
                seconds = (ended - begun) / 1e9
                _record_duration(timed, {**given, **(measured or {})}, marked, seconds)


def _record_duration(
    timed: tuple[Histogram, frozenset[str]],
    attributes: Mapping[str, Any],
    marked: Sequence[str],
    seconds: float,
) -> None:
    """Record an operation that took ``seconds`` in its duration metric, with the
    conventions' few of its span's ``attributes`` and the last ``error.type`` it was
    ``marked`` with."""
    histogram, names = timed
    kept = {name: value for name, value in attributes.items() if name in names}
    if marked:
        kept[ERROR_TYPE] = marked[-1]
    histogram.record(seconds, kept)


_METRIC_ATTRIBUTES = frozenset(
    {OPERATION_NAME, PROVIDER_NAME, REQUEST_MODEL, SERVER_ADDRESS, SERVER_PORT}
)
TOKEN_TYPE = "gen_ai.token.type"


def record_call(
    attributes: Mapping[str, Any],
    started: float,
    response: ModelResponse | None = None,
    error: BaseException | None = None,
    first_chunk: float | None = None,
    deadline: float | None = None,
    usage: Usage | None = None,
    chunk_gaps: Sequence[float] = (),
) -> None:
    """Record a model call that began at ``started`` (``time.perf_counter()``) in the GenAI
    client metrics: its duration, with ``error.type`` when it ended without its answer
    (``ended_type``: a failure's, ``DeadlineExceededError`` for one the run's ``deadline``,
    in ``anyio.current_time()`` units, cut, ``cancelled`` for one a cancellation stopped),
    the input and output tokens of its ``response`` (or the ``usage`` a call that ended
    without its answer was billed, a cancelled one's too, without ``error.type``, which
    the conventions do not give the token metric; a count of 0 is one the model did not
    report: the conventions record none then), and for a streamed answer the time its
    ``first_chunk`` of text, reasoning or a tool call came and the ``chunk_gaps``, the
    seconds each later chunk came after the one before. ``attributes`` are its span's;
    the metrics keep the conventions' few. Nothing is awaited: a cancellation goes on."""
    kind = None if error is None else ended_type(error, deadline)
    kept = {name: value for name, value in attributes.items() if name in _METRIC_ATTRIBUTES}
    if response is not None and response.response_model is not None:
        kept[RESPONSE_MODEL] = reported(response.response_model)
    # never changed once recorded: older SDKs keep the dict as the series' attributes
    timed = kept if kind is None else {**kept, ERROR_TYPE: kind}
    _CALL_DURATION.record(time.perf_counter() - started, timed)
    if first_chunk is not None:
        _FIRST_CHUNK.record(first_chunk - started, timed)
    for gap in chunk_gaps:
        _PER_CHUNK.record(gap, timed)
    used = usage if response is None else response.usage
    if used is not None:  # no error.type: the conventions do not give it the token metric
        counts = {"input": used.input_tokens, "output": used.output_tokens}
        for token_type, count in counts.items():
            if count:
                _TOKEN_USAGE.record(count, {**kept, TOKEN_TYPE: token_type})


def _stops(error: BaseException) -> bool:
    """True for a cancellation or a generator's close (a group of only those too): the
    work stopped, it did not fail."""
    group = getattr(error, "exceptions", None)  # a BaseExceptionGroup's
    if group is not None and not isinstance(error, Exception):
        return all(_stops(inner) for inner in group)
    return isinstance(error, (GeneratorExit, anyio.get_cancelled_exc_class()))


def _part_json(part: object) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "content": part.text}
    if isinstance(part, ToolCall):
        arguments = part.arguments if isinstance(part.arguments, str) else dict(part.arguments)
        return {"type": "tool_call", "id": part.id, "name": part.name, "arguments": arguments}
    if isinstance(part, ToolResult):
        return {"type": "tool_call_response", "id": part.call_id, "response": part.content}
    if isinstance(part, ImagePart):
        return _image_json(part)
    if isinstance(part, ReasoningPart):
        return {"type": "reasoning", "content": part.text}
    return {"type": "unknown"}


def _image_json(part: ImagePart) -> dict[str, Any]:
    """An image as the conventions' ``uri`` part, or their ``blob`` part (base64 content)
    for one given inline (its bytes or a ``data:`` URL)."""
    inline = inline_image(part)
    if inline is None:
        kind = {} if part.media_type is None else {"mime_type": part.media_type}
        return {"type": "uri", "modality": "image", "uri": part.url, **kind}
    media_type, content = inline
    return {"type": "blob", "modality": "image", "mime_type": media_type, "content": content}


def arguments_json(arguments: Mapping[str, Any] | str) -> str:
    """Tool-call arguments as one line of JSON (as given when a str: ``ToolCall`` keeps
    what JSON text cannot carry as its text)."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(dict(arguments), ensure_ascii=False)


_INSTRUCTIONS_APART = frozenset({"anthropic", "aws.bedrock", "gcp.gemini", "gcp.vertex_ai"})
"""Providers whose APIs take system text apart from the conversation: on their spans it
is ``gen_ai.system_instructions``; elsewhere it is a message in ``gen_ai.input.messages``."""


def input_attributes(provider: str, request: ModelRequest) -> dict[str, str]:
    """The content attributes of ``request`` for a model of ``provider``: its messages,
    its system text apart where the provider takes it apart, and its tools' definitions;
    only for agents that capture content."""
    messages: Sequence[Message] = request.messages
    attributes: dict[str, str] = {}
    if provider in _INSTRUCTIONS_APART:
        system = [part for m in messages if m.role.is_trusted for part in m.content]
        messages = [m for m in messages if not m.role.is_trusted]
        if system:
            attributes[SYSTEM_INSTRUCTIONS] = json_text([_part_json(part) for part in system])
    attributes[INPUT_MESSAGES] = messages_json(messages)
    if request.tools:
        attributes[TOOL_DEFINITIONS] = json_text(
            [
                {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": dict(tool.parameters),
                }
                for tool in request.tools
            ]
        )
    return attributes


def messages_json(messages: Sequence[Message], finish_reason: str | None = None) -> str:
    """Messages in the GenAI "parts" shape, as JSON, with the ``finish_reason`` an output
    message has; only for agents that capture content."""
    ended = {} if finish_reason is None else {"finish_reason": finish_reason}
    return json_text(
        [
            {"role": m.role.value, "parts": [_part_json(p) for p in m.content], **ended}
            for m in messages
        ]
    )
