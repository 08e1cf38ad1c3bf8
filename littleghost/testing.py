"""Test helpers: deterministic models (a script of responses, errors and callables), and
``check_retention``, which measures the facts a compaction keeps."""

from __future__ import annotations

import inspect
import itertools
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, cast

import anyio
import anyio.lowlevel
from attrs import field, frozen

from littleghost._validators import check, instance_of, is_number, safe_repr, tuple_of
from littleghost.errors import ProtocolError
from littleghost.messages import Message, ToolCall, new_id
from littleghost.models.base import (
    ModelRequest,
    ModelResponse,
    OutputSchema,
    StopReason,
    Usage,
    report_usage,
)
from littleghost.models.streaming import (
    ModelStreamEvent,
    ReasoningChunk,
    StreamDone,
    TextChunk,
    ToolCallChunk,
)
from littleghost.retention import Fact, FactCheck, RetentionReport, check_retention

__all__ = [
    "Fact",
    "FactCheck",
    "RetentionReport",
    "ScriptedModel",
    "Step",
    "Streamed",
    "check_retention",
    "streamed",
    "text_response",
    "tool_call_response",
    "tool_calls_response",
]


Chunk = str | Usage | BaseException
"""A piece of a ``streamed()`` step: text, a usage report, or the error that cuts it."""


def _chunks(value: object) -> tuple[Chunk, ...]:
    kinds: Any = (str, Usage, BaseException)  # isinstance takes the tuple
    chunks = cast(
        tuple[Chunk, ...], tuple_of(value, "Streamed.chunks", kinds, "str, Usage or exception")
    )
    if any(isinstance(chunk, BaseException) for chunk in chunks[:-1]):
        raise TypeError(
            "Streamed.chunks: an exception must be the last chunk (the stream ends with it)"
        )
    return chunks


@frozen
class Streamed:
    """A script step that streams ``chunks`` (``delay`` seconds before each text), then
    answers ``response`` (their text joined); ``streamed()`` makes one. ``respond()``
    returns it whole, after the same delays. A ``Usage`` among the chunks is the usage
    the provider reports when the stream reaches it, at once (``report_usage``:
    Anthropic's input tokens at its start): what a call cut after it is billed. An
    exception as the last chunk is raised when the stream reaches it, in place of the
    answer: a stream cut after its text (``respond()`` raises it too)."""

    chunks: tuple[Chunk, ...] = field(converter=_chunks)
    response: ModelResponse = field(
        validator=instance_of("Streamed.response", ModelResponse, "a ModelResponse")
    )
    delay: float = field(
        default=0.0,
        validator=check("streamed(delay=)", lambda v: is_number(v) and v >= 0, "a number >= 0"),
    )


Step = (
    Streamed
    | ModelResponse
    | BaseException
    | Callable[[ModelRequest], ModelResponse | Awaitable[ModelResponse]]
)
"""A response to return, an exception to raise, or a callable that answers the request."""
MAX_STEPS = 100_000
"""The most steps a ``ScriptedModel`` takes (so an endless iterator fails, not hangs)."""
Count = Callable[[ModelRequest], int | Awaitable[int | None] | None]
"""Plays a provider's prompt-token count (``ScriptedModel(count_prompt_tokens=...)``)."""


class ScriptedModel:
    """A model that plays a script, one step per call, and records every request.

    Each call is a checkpoint, as a real provider's I/O is: cancellation and the run's
    deadline apply to it.

    Args:
        steps: Responses, exceptions (raised) or callables ``(request) -> response``
            (sync or async), used in order; a callable that cannot take the request, or
            a builder such as ``text_response`` left uncalled, is a ``TypeError`` here.
        context_window: The window it advertises (``None``: unknown).
        name: Its model name.
        supports_output_schema: Whether it says it takes a request's ``output_schema``
            (so ``output_strategy="auto"`` asks it natively); False makes such runs use
            the final-result tool.
        output_schema_problem: Called with each ``OutputSchema`` a run would ask for
            natively; the reason it returns (``None``: no problem) makes
            ``output_strategy="auto"`` use the final-result tool for that schema, as a
            provider whose native mode cannot take it.
        count_prompt_tokens: Called (sync or async) with each request
            ``count_prompt_tokens`` is asked about (``@manage_context``'s overflow
            recovery); the figure it returns (``None``: the model cannot tell) plays a
            provider's token count.
    """

    provider = "scripted"

    def __init__(
        self,
        steps: Iterable[Step],
        *,
        context_window: int | None = None,
        name: str = "scripted",
        supports_output_schema: bool = True,
        output_schema_problem: Callable[[OutputSchema], str | None] | None = None,
        count_prompt_tokens: Count | None = None,
    ) -> None:
        if isinstance(steps, (str, bytes, Mapping)) or not isinstance(steps, Iterable):
            one = isinstance(steps, (ModelResponse, Streamed, BaseException)) or callable(steps)
            raise TypeError(
                f"ScriptedModel: steps must be a sequence of steps, not "
                f"{type(steps).__name__ if one else safe_repr(steps)}"
                + (" (put a single step in a list: [step])" if one else "")
            )
        self._steps = list(itertools.islice(steps, MAX_STEPS + 1))
        if len(self._steps) > MAX_STEPS:
            raise TypeError(
                f"ScriptedModel: steps must be a finite sequence of at most {MAX_STEPS} steps "
                "(an endless iterator never ends: give the steps a run takes, or a callable)"
            )
        for index, step in enumerate(self._steps):
            if isinstance(step, type) and issubclass(step, BaseException):
                raise TypeError(
                    f"ScriptedModel: step {index} is the exception class {step.__name__}; "
                    f"pass an instance, such as {step.__name__}('message')"
                )
            if not isinstance(step, (ModelResponse, BaseException, Streamed)) and not callable(
                step
            ):
                raise TypeError(
                    f"ScriptedModel: step {index} must be a ModelResponse, a streamed(...) "
                    f"step, an exception or a callable, not {type(step).__name__}"
                    f"{_wrap_hint(step)}"
                )
            problem = _callable_step_problem(step)
            if problem is not None:
                raise TypeError(f"ScriptedModel: step {index} is {problem}")
        if context_window is not None and (
            isinstance(context_window, bool) or not isinstance(context_window, int)
        ):
            raise TypeError(
                "ScriptedModel: context_window must be an int or None, "
                f"not {safe_repr(context_window)}"
            )
        if not isinstance(name, str):
            raise TypeError(f"ScriptedModel: name must be a str, not {safe_repr(name)}")
        if not isinstance(supports_output_schema, bool):
            raise TypeError(
                "ScriptedModel: supports_output_schema must be True or False, "
                f"not {safe_repr(supports_output_schema)}"
            )
        if output_schema_problem is not None and not callable(output_schema_problem):
            raise TypeError(
                "ScriptedModel: output_schema_problem must be a callable or None, "
                f"not {safe_repr(output_schema_problem)}"
            )
        if count_prompt_tokens is not None and not callable(count_prompt_tokens):
            raise TypeError(
                "ScriptedModel: count_prompt_tokens must be a callable or None, "
                f"not {safe_repr(count_prompt_tokens)}"
            )
        self._length = len(self._steps)
        self._context_window = context_window
        self._name = name
        self._schema_problem = output_schema_problem
        self._count = count_prompt_tokens
        self.supports_output_schema = supports_output_schema
        self.requests: list[ModelRequest] = []

    @property
    def name(self) -> str:
        """The model name."""
        return self._name

    @property
    def context_window(self) -> int | None:
        """The advertised window."""
        return self._context_window

    def output_schema_problem(self, schema: OutputSchema) -> str | None:
        """Why ``schema`` is not taken natively, as ``output_schema_problem=`` says."""
        return None if self._schema_problem is None else self._schema_problem(schema)

    async def count_prompt_tokens(self, request: ModelRequest) -> int | None:
        """The prompt tokens of ``request``, as ``count_prompt_tokens=`` says (``None``
        without it); a checkpoint, as a provider's count is."""
        await anyio.lowlevel.checkpoint()
        counted = None if self._count is None else self._count(request)
        return await counted if inspect.isawaitable(counted) else counted

    @property
    def remaining(self) -> int:
        """How many steps are left: nothing else tells of steps a run never took."""
        return len(self._steps)

    async def respond(self, request: ModelRequest) -> ModelResponse:
        """Play the next step for ``request``."""
        return await self._play(*await self._next(request), request)

    async def _next(self, request: ModelRequest) -> tuple[int, Any]:
        """Take the next step for ``request``, with its place in the script (a checkpoint
        first, as a provider's call)."""
        self.requests.append(request)
        await anyio.lowlevel.checkpoint()
        if not self._steps:
            raise ProtocolError(_out_of_steps(self._name, self._length, self.requests))
        return self._length - len(self._steps), self._steps.pop(0)

    async def _play(self, index: int, step: Any, request: ModelRequest) -> ModelResponse:
        """The answer ``step`` (the script's ``index``) gives to ``request``."""
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, ModelResponse):
            return step
        if isinstance(step, Streamed):
            for chunk in step.chunks:  # its time, its usage reports, its error
                await _reach(step, chunk)
            return step.response
        answer = step(request)
        if inspect.isawaitable(answer):
            answer = await answer
        if not isinstance(answer, ModelResponse):
            raise ProtocolError(
                f"ScriptedModel {self._name!r}: step {index}, a callable, returned "
                f"{type(answer).__name__}, not a ModelResponse{_answer_hint(answer)}"
            )
        return answer

    async def stream(self, request: ModelRequest) -> AsyncIterator[ModelStreamEvent]:
        """Play the next step as a stream: a ``streamed()`` step in its chunks (with its
        delay before each text, its exception raised where it stands), any other
        answer's reasoning, its text word by word, then a ``ToolCallChunk`` per tool
        call."""
        index, step = await self._next(request)  # taken once: no other call can take it
        if isinstance(step, Streamed):
            for chunk in step.chunks:
                text = await _reach(step, chunk)
                if text is not None:
                    yield TextChunk(text)
            response = step.response
        else:
            response = await self._play(index, step, request)
            for part in response.message.reasoning:
                await anyio.lowlevel.checkpoint()
                yield ReasoningChunk(part.text)
            for chunk in re.findall(r"\S+\s*|\s+", response.message.text):
                await anyio.lowlevel.checkpoint()
                yield TextChunk(chunk)
            for _ in response.message.tool_calls:
                await anyio.lowlevel.checkpoint()
                yield ToolCallChunk()
        yield StreamDone(response)


async def _reach(step: Streamed, chunk: Chunk) -> str | None:
    """Play ``chunk`` of ``step`` as its stream reaches it: a text after the step's delay
    (given back), a ``Usage`` reported, an exception raised."""
    if isinstance(chunk, BaseException):
        raise chunk
    if isinstance(chunk, Usage):
        report_usage(chunk)
        return None
    if step.delay:
        await anyio.sleep(step.delay)
    return chunk


def streamed(
    *chunks: Chunk,
    delay: float = 0.0,
    input_tokens: int = 0,
    output_tokens: int = 0,
    stop_reason: StopReason = StopReason.END_TURN,
) -> Streamed:
    """A step whose answer streams in ``chunks`` (a ``Usage`` among them reported as the
    stream reaches it, an exception last raised there: ``Streamed``); ``respond()``
    returns it whole."""
    response = text_response(
        "".join(chunk for chunk in chunks if isinstance(chunk, str)),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        stop_reason=stop_reason,
    )
    return Streamed(tuple(chunks), response, delay)


def text_response(
    text: str,
    *,
    input_tokens: int = 0,
    output_tokens: int = 0,
    stop_reason: StopReason = StopReason.END_TURN,
) -> ModelResponse:
    """A response that answers with ``text``."""
    return ModelResponse(Message.assistant(text), stop_reason, Usage(input_tokens, output_tokens))


def tool_call_response(
    name: str,
    arguments: Mapping[str, Any] | str,
    *,
    call_id: str | None = None,
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> ModelResponse:
    """A response that calls the tool ``name`` with ``arguments``."""
    call = ToolCall(call_id or _call_id(), name, arguments)
    return tool_calls_response(call, input_tokens=input_tokens, output_tokens=output_tokens)


def tool_calls_response(
    *calls: ToolCall | tuple[str, Mapping[str, Any] | str],
    text: str = "",
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> ModelResponse:
    """A response that makes ``calls`` at once (parallel tool calls), after ``text`` if
    any: each an argument of its own, a ``ToolCall`` (its id chosen) or a ``(name,
    arguments)`` pair.

    Raises:
        TypeError: A call of another kind, or ``text`` not a str.
        ValueError: No call.
    """
    if not calls:
        raise ValueError("tool_calls_response: give at least one call")
    if not isinstance(text, str):
        raise TypeError(f"tool_calls_response: text must be a str, not {type(text).__name__}")
    made = []
    for position, call in enumerate(calls):
        if isinstance(call, tuple) and len(call) == 2 and isinstance(call[0], str):
            call = ToolCall(_call_id(), *call)
        if not isinstance(call, ToolCall):
            one_list = len(calls) == 1 and isinstance(call, (list, tuple))
            spread = " (give each call as an argument of its own: *calls)" if one_list else ""
            raise TypeError(
                f"tool_calls_response: call {position} must be a ToolCall or a (name, "
                f"arguments) pair, not {type(call).__name__}{spread}"
            )
        made.append(call)
    return ModelResponse(
        Message.assistant(text, tool_calls=made),
        StopReason.TOOL_USE,
        Usage(input_tokens, output_tokens),
    )


def _out_of_steps(name: str, steps: int, requests: Sequence[ModelRequest]) -> str:
    """What a call past the script's end says: which call it is, what asked for it (its
    purpose and its last message's role, never content), what took the steps when a call
    other than the turn's did (a summary's), and what to add."""
    *earlier, request = requests
    last = request.messages[-1].role.value if request.messages else "no"
    asked = "" if request.purpose == "chat" else f"a {request.purpose} call, "
    taken = (
        f"; the calls before it: {', '.join(r.purpose for r in earlier)}"
        if any(r.purpose != "chat" for r in earlier)
        else ""
    )
    return (
        f"ScriptedModel {name!r} ran out of steps: call {len(requests)} came after the "
        f"script's {steps} step(s) ({asked}the request ends with a {last} message{taken}); "
        "add a step for it: each model call takes one, the call after tool results included"
    )


def _wrap_hint(value: object) -> str:
    """How ``value``, given for a response, makes one, when it can be told."""
    if isinstance(value, str):
        return " (wrap an answer's text in text_response(...))"
    if isinstance(value, Message):
        return " (wrap the message in ModelResponse(...))"
    if isinstance(value, ToolCall):
        return " (wrap the call in tool_calls_response(...))"
    return ""


def _answer_hint(answer: object) -> str:
    """What a callable step that returned ``answer`` meant to do, when it can be told."""
    if answer is None:
        return " (it returned nothing: return the response)"
    if isinstance(answer, BaseException):
        return " (raise the exception instead, or make it the step itself)"
    if isinstance(answer, Streamed):
        return " (a callable answers whole: make the streamed(...) step itself the step)"
    return _wrap_hint(answer)


def _callable_step_problem(step: object) -> str | None:
    """Why the callable ``step`` cannot answer a request: a response builder given
    uncalled, or a signature that takes no request; ``None`` for any other step."""
    if isinstance(step, (ModelResponse, BaseException, Streamed)):
        return None
    if any(step is builder for builder in _BUILDERS):
        name = cast(Callable[..., Any], step).__name__
        return f"the function {name} itself: call it for the response ({name}(...))"
    if step is Streamed:
        return "the class Streamed itself: make the step with streamed(...)"
    try:
        signature = inspect.signature(cast(Callable[..., Any], step))
    except (TypeError, ValueError):
        return None  # nothing to read (a builtin): the call itself will tell
    try:
        signature.bind(None)
    except TypeError as error:
        return f"a callable that cannot take the request: {signature} ({error})"
    return None


_BUILDERS = (text_response, tool_call_response, tool_calls_response, streamed)
"""The response builders, which a script calls: one given as a step is a slip."""


def _call_id() -> str:
    return f"call_{new_id()[:12]}"
