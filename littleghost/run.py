"""The state of one run (``RunContext``) and what a run returns (``RunResult``)."""

from __future__ import annotations

import enum
import math
import time
import types
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

import anyio
from attrs import define, field, frozen
from opentelemetry.trace import SpanKind

from littleghost import logs, telemetry
from littleghost._validators import TOKEN_COUNT, has_method, is_token_count, safe_repr
from littleghost.chat_span import traced_call
from littleghost.cleanup import Grace, cancelled_here, close_leaving, go_on_if_turned
from littleghost.context.groups import Layout
from littleghost.context.index import LogIndex
from littleghost.errors import UNSWALLOWED, ConfigurationError, ProtocolError, SessionStoreError
from littleghost.events import (
    Event,
    ModelCallRetried,
    ReasoningDelta,
    SideCallFinished,
    TextDelta,
)
from littleghost.log_rules import Ledger
from littleghost.messages import Message
from littleghost.models.base import (
    Model,
    ModelRequest,
    ModelResponse,
    StopReason,
    Usage,
    billed,
    check_model,
    model_awaitable,
    prepare,
)
from littleghost.models.registry import is_local_model
from littleghost.models.streaming import ReasoningChunk, StreamDone, TextChunk, ToolCallChunk
from littleghost.retry import call_with_retries
from littleghost.sessions.codec import check_storable
from littleghost.sessions.notices import WaitWatch, watching_waits
from littleghost.settings import check_local_settings, check_settings

if TYPE_CHECKING:
    from littleghost.agent import Agent

__all__ = ["COUNT_TIMEOUT", "RunContext", "RunResult"]

_CALLING: ContextVar[_ToolCall | None] = ContextVar("littleghost_tool_call", default=None)
"""While a tool runs (in its threads and the tasks it starts too): its call."""

LogWriter = Callable[[tuple[Message, ...]], Awaitable[None]]
EventSink = Callable[[Event], Awaitable[None]]
T = TypeVar("T")
OutputT = TypeVar("OutputT")
_VALUES = (str, bytes, int, float, complex, tuple, frozenset)
"""What ``state_for`` refuses as an owner: values compared by value, whose identity is
not what a caller means (each made anew is another object), but an enum's members."""

logger = logs.logger("littleghost.models")

COUNT_TIMEOUT = 10.0
"""Seconds a prompt count may take before the run goes on without it."""


def _instance(kind: type, name: str) -> Callable[[Any, Any, Any], None]:
    def check(instance: Any, attribute: Any, value: Any) -> None:
        if not isinstance(value, kind):
            raise TypeError(f"{name} must be a {kind.__name__}, not {type(value).__name__}")

    return check


def _messages(value: Any) -> tuple[Message, ...]:
    messages = tuple(value)
    if not all(isinstance(message, Message) for message in messages):
        raise TypeError("RunResult.messages must hold Message values")
    return messages


@frozen
class RunResult(Generic[OutputT]):
    """What a completed run returns.

    Args:
        output: The final assistant text; the typed value when an ``output_type``
            applies.
        messages: The whole conversation log after the run (history and new messages).
        usage: Tokens of every model call of the run, summary calls included.
        stop_reason: Why the final model call stopped.
    """

    output: OutputT
    messages: tuple[Message, ...] = field(converter=_messages)
    usage: Usage = field(validator=_instance(Usage, "RunResult.usage"))
    stop_reason: StopReason = field(converter=StopReason)


@define(eq=False)
class RunContext:
    """What hooks, tools and callable instructions may read during a run (the run makes
    it; a tool gets it through a parameter annotated ``RunContext``, a hook through a
    ``context`` parameter).

    Attributes:
        agent: The agent running.
        model: The model the run calls.
        settings: The run's model settings (the agent's, with ``run(settings=)`` over
            them, and the model's ``default_max_tokens`` as ``max_tokens`` when they set
            no output cap).
        deadline: The absolute anyio deadline, or ``None``: the run's own, or the earlier
            one of a run it was started in (from a tool), which stops it too.
        max_retries: Retries of a model call (the agent's ``max_retries``).
        capture_content: Whether spans record content (the agent's ``capture_content``).
        session_id: The session the run continues, or ``None``.
        usage: Tokens of the run's model calls so far, summary and side calls included.
        turn: The number of the turn going on: 0 for the run's first model call.
        state: A dict for your own per-run data (a capability keeps its own with
            ``state_for``).
        grace: Bounds the cleanup of a run that stops (see :mod:`littleghost.cleanup`).
        messages: The log so far (read-only).
        question: The run's input message, once logged (the current turn starts there,
            whatever user messages a tool or hook adds after it).
        last_exchange: The request and response of the turn's latest completed model
            call, or ``None``.
        last_sent: The request of the turn's latest model call, answered or not.
    """

    agent: Agent
    model: Model
    settings: Mapping[str, Any]
    deadline: float | None
    max_retries: int = field(repr=False)
    capture_content: bool = field(repr=False)
    session_id: str | None = None
    usage: Usage = field(factory=Usage)
    turn: int = 0
    state: dict[str, Any] = field(factory=dict, repr=False)
    grace: Grace = field(factory=lambda: Grace(0.0), repr=False)
    """The run's cleanup budget (the runner passes the agent's ``cleanup_grace``)."""
    _log: list[Message] = field(factory=list, repr=False, alias="log")
    _writer: LogWriter | None = field(default=None, repr=False, alias="writer")
    _sink: EventSink | None = field(default=None, repr=False, alias="sink")
    _call_attributes: dict[str, Any] = field(factory=dict, repr=False, init=False)
    _index: LogIndex = field(factory=lambda: LogIndex((), Layout()), repr=False, init=False)
    _owned: dict[object, tuple[object, object]] = field(factory=dict, repr=False, init=False)
    _prepared_models: dict[int, Model] = field(factory=dict, repr=False, init=False)
    """The other models the run prepared, by id (kept: their ids stay their own)."""
    _ledger: Ledger = field(factory=Ledger, repr=False, init=False)
    _writing: anyio.Lock = field(factory=anyio.Lock, repr=False, init=False)
    """Held by each write to the store: a run's appends happen one at a time, in order."""
    _running: frozenset[str] = field(default=frozenset(), repr=False, init=False)
    """The ids of the tool batch the runner is running: only it answers them."""
    _ended: bool = field(default=False, repr=False, init=False)
    """True once the run has ended: its context appends nothing more."""
    _held: list[Event] = field(factory=list, repr=False, init=False)
    """Events a cancellation kept from the consumer (a cut side call's, a failing tool
    batch's results stored as it ended): nothing can be awaited under it, so the run's
    next event brings them first, or, the run failing, the stream hands those of the log
    (``LOGGED_EVENTS``) over before its error."""
    _doing: Callable[[], str] = field(default=lambda: "starting", repr=False, init=False)
    """What the run is doing, for the error of a deadline that cuts it."""
    _store_wait: WaitWatch | None = field(default=None, repr=False, init=False)
    """What the store call the run waits for (a load, a write) waits for (its database,
    busy with another connection's write), for that error too."""
    _turn_retries: int = field(default=0, repr=False, init=False)
    """How many times the turn's model call was retried (``ModelCallRetried.attempt``)."""
    question: Message | None = field(default=None, repr=False, init=False)
    last_exchange: tuple[ModelRequest, ModelResponse] | None = field(
        default=None, repr=False, init=False
    )
    """The last request of a turn's own model call and its response, for usage-anchored
    estimates (side and summary calls never set it)."""
    last_sent: ModelRequest | None = field(default=None, repr=False, init=False)
    """The request of a turn's own latest model call, answered or not: what its error's
    figures are about, whatever ``after_model_error`` hooks made of it since."""

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation log so far."""
        return tuple(self._log)

    @property
    def log_index(self) -> LogIndex:
        """The context engine's index of the log (its view and per-message figures),
        grown to the log as it is now."""
        if len(self._index.log) != len(self._log):
            self._index = self._index.grown(self._log)
        return self._index

    def view(self) -> tuple[Message, ...]:
        """What the model sees of the log (see ``littleghost.context.view``), built
        incrementally: a turn that only added messages costs what it added."""
        return tuple(self.log_index.layout.messages())

    def state_for(self, owner: object, factory: Callable[[], T]) -> T:
        """The per-run object of ``owner``: what ``factory()`` made the first time
        ``owner`` asked in this run.

        Keyed by ``owner``'s identity (a capability's hook function, a class of its own,
        ...), so no name can clash; each run starts without it. A bound method
        (``self.before_model``, a new object at each access) is known by its instance and
        function. A ``factory`` that asks for ``owner``'s object itself gets the one it
        will return.

        Raises:
            TypeError: ``factory`` is not callable, or ``owner`` is a value compared by
                value (a str, a number, a tuple, ``None``; an enum member is an owner):
                one made anew at each ask would get a new object each time.
        """
        if not callable(factory):
            raise TypeError(
                "context.state_for(owner, factory): factory must be callable (dict, list, a "
                f"class), not {type(factory).__name__}"
            )
        if owner is None or (isinstance(owner, _VALUES) and not isinstance(owner, enum.Enum)):
            what = "None" if owner is None else f"a {type(owner).__name__}"
            raise TypeError(
                "context.state_for(owner, factory): the owner is known by its identity, "
                "not its value: pass an object of your own (the hook function, a class of "
                f"yours), not {what} (a value made anew is another object, with a new state)"
            )
        key: object = id(owner)
        if isinstance(owner, types.MethodType):
            key = (id(owner.__self__), id(owner.__func__))
        entry = self._owned.get(key)
        if entry is None:
            made = factory()  # which may have asked for it already: the first one stays
            entry = self._owned.setdefault(key, (owner, made))  # owner kept: its ids its own
        return cast(T, entry[1])

    def has_message(self, message_id: str) -> bool:
        """True when the log holds a message with the id ``message_id`` (for a note of a
        fixed id appended once, say)."""
        self._ledger.catch_up(self._log)
        return message_id in self._ledger.ids

    async def append(self, *messages: Message) -> None:
        """Append messages to the log — with a session, once its store has them.

        Nothing is written unless every message may enter the log: an id the log does
        not hold (nor another of them), a tool message with results that each answer a
        call the log leaves open (``run(history=)``'s checks), and with a session values
        the store can keep. Answer a call you append by a later append before the next
        model call (or the run's end): the run fails before a call, or as it ends, with
        one left open (``ConfigurationError``), answering it with an error result. The
        run's appends (its own, its hooks', its tools', at once or not) are written one
        at a time, in order. A write in flight when the run is cancelled may finish
        within the run's cleanup grace; whatever the store accepted enters the log, and
        nothing else does.

        Raises:
            ConfigurationError: A message repeats an id, is a tool message without a
                result, holds a part its role cannot carry (a tool call in a user
                message), or holds a result that answers no open call, or a call of the
                tool batch the run is running (its result is what its tool returns);
                nothing is appended.
            UnstorableValueError: A message holds a value the store cannot keep.
            SessionStoreError: The store failed, raised a cancellation nobody asked for,
                or the write was cut off at the run's stop time while the run was not
                cancelled; the messages are not in the log (the store may hold them: the
                run writes nothing more, and the next run of the session repairs what it
                finds).
        """
        await self._append(messages, batch=False)

    async def _append(self, messages: tuple[Message, ...], *, batch: bool) -> None:
        """``append``; the runner stores a tool batch's results with ``batch``."""
        if not messages:
            return
        for message in messages:
            if not isinstance(message, Message):
                raise TypeError(
                    f"context.append() takes Message values, not {type(message).__name__}"
                )
        self._check_running("context.append()", "a context kept past its run appends nothing")
        calling = _CALLING.get()
        if calling is not None and calling.context is self and calling.over:
            raise ConfigurationError(
                f"context.append(): the call of tool {calling.name!r} it comes from is over "
                "(returned, or stopped at its timeout): what it appends now is discarded, as "
                "a late result is"
            )
        writer = self._writer
        if writer is None:
            self._extend(messages, self._checked(messages, batch))
            return
        async with self._writing:
            if self.grace.uncertain:
                raise SessionStoreError(
                    "an earlier write to the session store failed or was cut off, so the "
                    "store may hold more than the run knows: the run writes nothing more",
                    session_id=self.session_id,
                )
            still_open = self._checked(messages, batch)
            check_storable(messages, session_id=self.session_id)

            async def write() -> None:
                try:
                    await writer(messages)
                except BaseException:
                    self.grace.uncertain = True  # it may have landed all the same
                    raise

            with self._waiting_for_store("storing messages in the session"):
                await self.grace.protect(
                    write,
                    f"storing {len(messages)} message(s)",
                    then=lambda: self._extend(messages, still_open),
                )

    @contextmanager
    def _waiting_for_store(self, doing: str) -> Iterator[None]:
        """Around a store call the run waits for (``doing`` it): what the run does and
        what the call waits for are what the error of a deadline that cuts it says. A
        call after the deadline is cleanup, not what it cut."""
        before = self._doing, self._store_wait
        with watching_waits() as watch:
            if not self._past_deadline():
                self._doing, self._store_wait = (lambda: doing), watch
            try:
                yield
            except BaseException:
                if not self._past_deadline():  # a tool's timeout cut it: the run goes on
                    self._doing, self._store_wait = before
                raise
        self._doing, self._store_wait = before  # a call the stop cut is what it did

    @contextmanager
    def _calling(self, name: str, timer: anyio.CancelScope) -> Iterator[None]:
        """Around one call of tool ``name`` (``timer``: its timeout's scope): once it is
        over, what it appends (from a thread left running at its timeout, a task it
        started) is refused."""
        call = _ToolCall(self, name, timer)
        token = _CALLING.set(call)
        try:
            yield
        finally:
            call.over = True
            _CALLING.reset(token)

    def _checked(self, messages: tuple[Message, ...], batch: bool) -> tuple[Message, ...]:
        """Check ``messages`` against the log (``Ledger.check``) and, unless the runner
        stores its ``batch``, against the calls it is running."""
        for position, message in enumerate(() if batch else messages):
            for result in message.tool_results:
                if result.call_id in self._running:
                    raise ConfigurationError(
                        f"context.append() message {position} answers call "
                        f"{result.call_id!r}, which the run is running: its result is what "
                        "its tool returns"
                    )
        self._ledger.catch_up(self._log)
        return self._ledger.check(messages, "context.append()")

    def _extend(self, messages: tuple[Message, ...], still_open: tuple[Message, ...]) -> None:
        """Put checked ``messages`` in the log."""
        self._log.extend(messages)
        self._ledger.add(messages, still_open)

    @property
    def streaming(self) -> bool:
        """True when a consumer receives this run's events."""
        return self._sink is not None

    async def emit(self, event: Event) -> None:
        """Hand an event to the stream's consumer, if there is one, after those a
        cancellation held back (``_held``). The time a tool's call waits for the consumer
        does not count against the tool's timeout.

        Raises:
            ConfigurationError: The run of this context has ended: its stream is over
                (it was a bare ``ClosedResourceError``).
        """
        self._check_running("context.emit()", "its stream is over: the event would reach nobody")
        if self._sink is None:
            return
        calling = _CALLING.get()
        if calling is not None and (calling.context is not self or calling.over):
            calling = None  # another run's call, or one that is over
        with nullcontext() if calling is None else calling.paused():
            try:
                while self._held:
                    await self._hand(self._held.pop(0))  # taken first: never sent twice
            except BaseException:
                self._held.append(event)  # cut before its turn: it goes after them
                raise
            await self._hand(event)

    async def _hand(self, event: Event) -> None:
        """Hand ``event`` to the consumer; the run's deadline passing meanwhile came as
        the run waited for the consumer to take it, as the deadline's error says."""
        assert self._sink is not None
        late = self._past_deadline()
        try:
            await self._sink(event)
        except BaseException:
            if not late and self._past_deadline():
                waited = (
                    f"waiting for the stream's consumer to take its {type(event).__name__} event"
                )
                self._doing = lambda: waited
            raise

    def _past_deadline(self) -> bool:
        """Whether the run's own deadline has passed: what the run does after it (its
        cleanup) is not what the deadline cut."""
        deadline = self.grace.run_deadline
        return deadline is not None and anyio.current_time() >= deadline

    def _hold(self, events: Iterable[Event]) -> None:
        """Hold ``events`` for the consumer (``_held``), if there is one, without waiting
        for it: the run is failing or stopping."""
        if self.streaming:
            self._held.extend(events)

    async def _side_call_ended(self, event: SideCallFinished, error: BaseException) -> None:
        """Emit a side call's ``event`` about ``error``; hold it for the run's next event
        (``_held``) when a cancellation cut the call, or cuts the task now (a client that
        turned it into an error of its own): nothing can be awaited under it, which would
        delay the cancellation, or lose the event. Once the run has ended (a side call
        that outlived it), the event reaches nobody."""
        if self._ended:
            return
        if isinstance(error, Exception) and not cancelled_here():
            await self.emit(event)
        elif self.streaming:
            self._held.append(event)

    async def _retried(self, error: BaseException) -> None:
        """Tell the consumer the turn's model call is retried after ``error`` (the
        turn's retries numbered together, transient errors and recoveries alike)."""
        self._turn_retries += 1
        await self.emit(
            ModelCallRetried(self._turn_retries, telemetry.error_type(error), billed(error))
        )

    def add_usage(self, usage: Usage) -> None:
        """Add a model call's usage (an embedding call's, say) to the run's total.

        Raises:
            TypeError: ``usage`` is not a ``Usage``.
            ConfigurationError: The run of this context has ended: its usage was told
                (``RunResult.usage``, the error's ``run_usage``, the ``invoke_agent``
                span), and what is added now would count nowhere.
        """
        if not isinstance(usage, Usage):
            raise TypeError(
                "context.add_usage() takes a Usage (Usage(input_tokens=..., "
                f"output_tokens=...)), not {type(usage).__name__}"
            )
        self._check_running(
            "context.add_usage()",
            "its usage was reported (RunResult.usage, the error's run_usage): what is added "
            "now would count nowhere; keep such figures yourself",
        )
        self._count(usage)

    def _count(self, usage: Usage) -> None:
        """Add ``usage`` to the run's total; a model call of the run that ends after it (a
        side call that outlived it) counts so without an error: its usage is on its
        ``chat`` span and in the token metric, and its caller gets its answer."""
        self.usage = self.usage + usage

    def _check_running(self, name: str, why: str) -> None:
        """``ConfigurationError`` naming ``name`` and saying ``why`` once the run of this
        context has ended (a context kept past its run, used by code of its own)."""
        if self._ended:
            raise ConfigurationError(f"{name}: the run of this context has ended; {why}")

    def mark_compacted(self) -> None:
        """Note that the next turn's model call's request was compacted.

        Raises:
            ConfigurationError: The run of this context has ended (no call comes).
        """
        self._check_running("context.mark_compacted()", "no model call of it comes")
        self._call_attributes[telemetry.CONVERSATION_COMPACTED] = True

    def annotate_next_call(self, attributes: Mapping[str, Any]) -> None:
        """Attributes for the span of the next turn's model call, never a side call's
        (figures, never content); one given ``None`` is left off (no figure).

        Raises:
            TypeError: ``attributes`` is not a mapping, or holds a name that is not a str
                or a value a span does not keep (one but a str, bool, int or float, or a
                list or tuple of one kind of them).
            ConfigurationError: A name of the GenAI conventions' ``gen_ai.``, ``server.``
                or ``error.`` attributes, the call's span's own figures; or the run of
                this context has ended (no call comes to take them).
        """
        telemetry.check_annotations("context.annotate_next_call()", attributes)
        self._check_running("context.annotate_next_call()", "no model call of it comes")
        for name, value in attributes.items():
            if value is None:
                self._call_attributes.pop(name, None)
            else:
                self._call_attributes[name] = value

    async def complete(
        self, request: ModelRequest, *, model: Model | None = None, report: bool = True
    ) -> ModelResponse:
        """Make a side call (a guardrail's check, a tool's digest, a summary): call the
        run's model (or ``model``) once, with retries for transient errors only.

        A side call is never the turn's own call, whatever its ``purpose``: nothing of it
        is streamed or reported as retried, and it takes none of the attributes meant for
        the turn's call. Each attempt is a ``chat`` span (a child of the run's span, or
        of the ``execute_tool`` span of the tool that makes it, with the model's
        ``server.address`` and ``server.port`` when it has them, and the response's id
        and model when the provider reported them); its usage is added to the run's total
        and reported by a ``SideCallFinished`` event (a failed call's too when its error
        says it was billed, and one a cancellation cut, a tool's timeout say, when its
        provider had reported usage: with ``error_type`` ``cancelled``, just before the
        run's next event, as nothing can be awaited under the cancellation) — unless
        ``report=False``, for a call whose usage an event of the caller's own reports
        (``@manage_context``'s summary call: ``CompactionFinished``). An attempt that was
        billed, then retried, is reported by a ``SideCallFinished`` (its ``error_type``)
        whatever ``report``: the caller sees the last attempt alone.

        Raises:
            TypeError: ``request`` is not a ``ModelRequest``, ``model`` not a ``Model``
                instance (a model string included) or ``report`` not a bool.
            ConfigurationError: The run of this context has ended (a context kept past
                its run makes no side call: nothing would count it), or ``model`` holds
                a member of the wrong type (``name = None``); the model is not called.
        """
        if not isinstance(request, ModelRequest):
            raise TypeError(
                "context.complete() takes a ModelRequest (ModelRequest([Message.user(...)])), "
                f"not {type(request).__name__}"
            )
        if model is not None and not has_method("respond")(model):
            raise TypeError(
                "context.complete(model=) takes a Model instance (OpenAIModel(...), "
                f"LocalModel(), ...), not {safe_repr(model)}"
            )
        if model is not None:
            check_model("context.complete(model=)", model)
        if not isinstance(report, bool):
            raise TypeError(
                f"context.complete(report=) must be a bool, not {type(report).__name__}"
            )
        self._check_running(
            "context.complete()",
            "a context kept past its run makes no side call (its usage would be counted nowhere)",
        )
        try:
            response = await self._call(request, model=model)
        except BaseException as error:
            used = billed(error)
            if report and used != Usage():  # billed all the same: the events still add up
                kind = (  # an error, a client's that a cancellation became too, by its type
                    telemetry.error_type(error)
                    if isinstance(error, Exception)
                    else telemetry.ended_type(error, self.grace.earliest_deadline())
                )
                await self._side_call_ended(SideCallFinished(used, request.purpose, kind), error)
            raise
        if report and not self._ended:  # else it outlived its run: the stream is over
            await self.emit(SideCallFinished(response.usage, request.purpose))
        return response

    async def count_prompt_tokens(self, request: ModelRequest) -> int | None:
        """The prompt tokens the run's model counts for ``request`` (its optional
        ``count_prompt_tokens``); ``None`` when it cannot tell or the count failed.

        ``None`` at once for a model without the method. Otherwise one attempt, never
        retried, in a ``count_tokens {model}`` span (a child of the current span, with the
        model's provider, name and server, and the figure as
        ``littleghost.counted_prompt_tokens``; never content), cut off by the run's
        deadline as a model call is, and after ``COUNT_TIMEOUT`` seconds (a
        ``TimeoutError``). A count that raises, or answers anything but an int from 1 to
        2**63-1 or ``None``, makes an ERROR span with ``error.type``, is logged (its error
        type only) on the ``littleghost.models`` logger and gives ``None``; the run's
        cancellation, and a ``DeadlineExceededError``, ``CleanupError`` or
        ``SessionStoreError`` the count raised, propagate, as does the
        ``ConfigurationError`` of a count that returns no awaitable (a plain ``def``).
        """
        model = self.model
        count = getattr(model, "count_prompt_tokens", None)
        if count is None:
            return None
        attributes: dict[str, Any] = {
            telemetry.OPERATION_NAME: "count_tokens",
            telemetry.PROVIDER_NAME: model.provider,
            telemetry.REQUEST_MODEL: model.name,
            **telemetry.server_attributes(model),
            **telemetry.conversation_attributes(self.session_id),
        }
        unawaitable: ConfigurationError | None = None
        try:  # outside the span, which records the failure before it is swallowed
            with telemetry.open_span(
                f"count_tokens {model.name}",
                kind=SpanKind.CLIENT,
                attributes=attributes,
                deadline=self.grace.earliest_deadline,
            ) as span:
                with anyio.fail_after(COUNT_TIMEOUT), self.grace.hosting():
                    pending = count(request)
                    try:
                        awaited = model_awaitable(model, "count_prompt_tokens", pending)
                    except ConfigurationError as error:
                        unawaitable = error  # a plain def: told as respond's, not swallowed
                        raise
                    counted = await awaited  # a run a custom model starts shares the grace
                if counted is None or is_token_count(counted):
                    if counted is not None:
                        span.set_attribute(telemetry.COUNTED_PROMPT_TOKENS, counted)
                    return counted
                telemetry.mark_failed(span, ProtocolError.__name__)
                logger.warning(
                    "count_prompt_tokens of model %r returned a value of type %s, not %s",
                    model.name,
                    type(counted).__name__,
                    TOKEN_COUNT,
                )
                return None
        except UNSWALLOWED:
            raise
        except Exception as error:  # cancellation is not an Exception: it propagates
            if error is unawaitable:
                raise
            await go_on_if_turned(error)  # a client's "connection closed": stopped
            logger.warning(
                "counting the prompt tokens of model %r failed (%s)",
                model.name,
                telemetry.error_type(error),
            )
            return None

    async def _call(
        self,
        request: ModelRequest,
        *,
        model: Model | None = None,
        turn: bool = False,
        retrying: Exception | None = None,
    ) -> ModelResponse:
        """A model call as ``complete(report=False)`` makes it, or the runner's ``turn``
        call, which streams (its span then has ``gen_ai.request.stream``), takes the
        attributes meant for it, reports its retries (that of ``retrying``, the error of
        the turn's call an ``after_model_error`` hook replaced, once the request passed
        its checks: it goes out) and sets ``last_sent`` then, ``last_exchange`` after."""
        model = self.model if model is None else model
        if request.settings != self.settings:  # a hook's or a side call's: checked as the run's
            owner = (
                "the turn's request settings (as its before_model hooks left them)"
                if turn
                else "context.complete(): the request's settings"
            )
            check_settings(owner, request.settings)
            if is_local_model(model):
                check_local_settings(owner, request.settings)
        if model is not self.model:
            await self._prepare(model)
        extra: dict[str, Any] = {}
        if turn:
            extra, self._call_attributes = self._call_attributes, {}
            self.last_sent = request
            if retrying is not None:
                await self._retried(retrying)
        streamed = turn and self.streaming

        async def attempt() -> ModelResponse:
            chunks = _ChunkTimes()

            async def respond() -> ModelResponse:
                with self.grace.hosting():  # runs a custom model starts share the grace
                    return await self._respond(model, request, chunks, streamed)

            try:
                response = await traced_call(
                    model,
                    request,
                    respond,
                    attributes={**extra, **telemetry.conversation_attributes(self.session_id)},
                    capture_content=self.capture_content,
                    streamed=streamed and getattr(model, "stream", None) is not None,
                    first_chunk=lambda: chunks.first,
                    chunk_gaps=lambda: chunks.gaps,
                    deadline=self.grace.earliest_deadline,  # a served run's deadline too
                )
            except BaseException as error:
                self._count(billed(error))
                raise
            self._count(response.usage)
            return response

        async def on_retry(number: int, error: BaseException) -> None:
            if turn:
                await self._retried(error)
            elif (used := billed(error)) != Usage():  # a side call's attempt, billed: its
                # caller sees the last attempt alone (``report=False`` too)
                ended = SideCallFinished(used, request.purpose, telemetry.error_type(error))
                await self._side_call_ended(ended, error)

        response = await call_with_retries(
            attempt,
            max_retries=self.max_retries,
            deadline=self._retry_deadline(),
            on_retry=on_retry,
        )
        if turn:
            self.last_exchange = (request, response)
        return response

    def _retry_deadline(self) -> float | None:
        """The run's deadline, which a retry's wait may not pass, or the earlier one of a
        run it was started in (from a tool) when no scope ends sooner; ``None`` where a
        scope inside the run ends sooner (a tool's timeout, a hook's own
        ``move_on_after``): that scope cuts the wait, and stops only what it bounds."""
        stop = self.grace.deadline  # the run's deadline, or its caller's if earlier
        current = anyio.current_effective_deadline()
        if stop is not None and current < stop:
            return None
        outer = self.grace.enclosing_deadline()
        if (
            outer is not None
            and current >= outer
            and (self.grace.run_deadline is None or outer < self.grace.run_deadline)
        ):
            return outer
        return self.grace.run_deadline

    async def _prepare(self, model: Model) -> None:
        """Await another model's ``prepare()`` once in this run (a summarizer's, say)."""
        if id(model) in self._prepared_models:
            return
        await prepare(model)
        self._prepared_models[id(model)] = model

    async def _respond(
        self, model: Model, request: ModelRequest, times: _ChunkTimes, streamed: bool
    ) -> ModelResponse:
        """``model``'s answer to ``request``, streamed when ``streamed`` and the model
        streams (its deltas emitted as they come, when its chunks came in ``times``)."""
        stream = getattr(model, "stream", None)
        if not streamed or stream is None:
            response: ModelResponse = await model_awaitable(
                model, "respond", model.respond(request)
            )
            if streamed and isinstance(response, ModelResponse):
                for part in response.message.reasoning:
                    if part.text:
                        await self.emit(ReasoningDelta(part.text))
                if response.message.text:
                    await self.emit(TextDelta(response.message.text))
            return response
        done: ModelResponse | None = None
        chunks = stream(request)
        if not hasattr(chunks, "__aiter__"):
            if isinstance(chunks, types.CoroutineType):
                chunks.close()  # an async def without yield: no "never awaited" warning
            raise ConfigurationError(
                f"model {model.name!r}: stream() returned {type(chunks).__name__}, not an async "
                "iterator: a Model's stream is an async generator (async def with yield)"
            )
        leaving: BaseException | None = None
        try:
            async for chunk in chunks:
                if done is not None:  # its chunks would be streamed, not answered
                    raise ProtocolError(
                        f"model {model.name!r}: stream() yielded {type(chunk).__name__} after "
                        "its StreamDone (a stream ends with exactly one StreamDone)",
                        usage=done.usage,
                    )
                if isinstance(chunk, TextChunk):
                    if chunk.text:
                        times.came()
                        await self.emit(TextDelta(chunk.text))
                elif isinstance(chunk, ReasoningChunk):
                    if chunk.text:
                        times.came()
                        await self.emit(ReasoningDelta(chunk.text))
                elif isinstance(chunk, ToolCallChunk):
                    times.came()
                elif isinstance(chunk, StreamDone):
                    done = chunk.response
                else:
                    raise ConfigurationError(
                        f"model {model.name!r}: stream() yielded {type(chunk).__name__}, not a "
                        "TextChunk, ReasoningChunk, ToolCallChunk or StreamDone"
                    )
        except BaseException as error:  # a cancellation, the consumer gone: it goes on
            leaving = error
            raise
        finally:
            close = getattr(chunks, "aclose", None)  # an async generator's; any iterator will do
            if close is not None:
                await close_leaving(close, f"closing the stream of model {model.name!r}", leaving)
        if done is None:
            raise ProtocolError(f"model {model.name!r} ended its stream without a response")
        return done


@define
class _ChunkTimes:
    """When a streamed answer's first chunk (of text, reasoning or a tool call) came
    (``time.perf_counter()``), and the seconds each later one came after the one before."""

    first: float | None = None
    gaps: list[float] = field(factory=list)
    _last: float | None = None

    def came(self) -> None:
        now = time.perf_counter()
        if self._last is None:
            self.first = now
        else:
            self.gaps.append(now - self._last)
        self._last = now


@define(eq=False)
class _ToolCall:
    """One call of a tool, whether it is over, and its timeout's scope (``timer``)."""

    context: RunContext
    name: str
    timer: anyio.CancelScope
    over: bool = False
    _waits: int = 0
    _left: float = 0.0
    """While ``_waits``: the seconds the timeout had left when the first wait began."""

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The timeout stands still while the context is open (waits may overlap)."""
        if not self._waits:
            self._left = self.timer.deadline - anyio.current_time()
            self.timer.deadline = math.inf
        self._waits += 1
        try:
            yield
        finally:
            self._waits -= 1
            if not self._waits:
                self.timer.deadline = anyio.current_time() + self._left
