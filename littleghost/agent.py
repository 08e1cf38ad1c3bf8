"""``Agent``: class-level declarations, ``run`` / ``run_sync``, and the turn loop."""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import warnings
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import anyio
import attrs

from littleghost import telemetry
from littleghost.cleanup import Grace
from littleghost.context.view import interrupted_results, orphan_results
from littleghost.errors import (
    CleanupError,
    ConfigurationError,
    DeadlineExceededError,
    LimitExceededError,
    OutputLimitError,
)
from littleghost.events import (
    ModelCallFinished,
    ModelCallRetried,
    ToolCallFinished,
    ToolCallStarted,
)
from littleghost.hooks import BoundHook, bind_hooks, hook_plan, run_chain
from littleghost.messages import Message, Role, ToolCall, ToolResult
from littleghost.models.base import Model, ModelRequest, ModelResponse, StopReason, ToolSpec
from littleghost.models.registry import resolve, split_model_string
from littleghost.run import EventSink, RunContext, RunResult
from littleghost.sessions import InMemorySessionStore, SessionStore
from littleghost.sessions.base import check_session_id
from littleghost.sessions.locks import hold_session
from littleghost.settings import check_settings
from littleghost.stream import RunPlan, RunStream
from littleghost.text import truncate_middle
from littleghost.tools import (
    ToolArgumentError,
    ToolDefinition,
    bind_arguments,
    define_tool,
    error_result,
    index_tools,
    invoke,
    looks_like_method,
    tool_options,
)

__all__ = ["Agent"]

STOPPED_TEXT = "The run was stopped before this tool call finished; it has no result."
MAX_RECOVERIES = 3
"""How many replacement requests ``after_model_error`` hooks may hand back per model call."""
UNDECLARED_TOOL = "undeclared"
"""The tool name telemetry shows for a call of a tool the agent does not declare (the
name is the model's text), unless ``capture_content`` is on."""

Instructions = str | Callable[[RunContext], Any] | None


def _positive_int(minimum: int) -> Callable[[str, object], int]:
    def check(name: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise ConfigurationError(f"{name} must be an int >= {minimum}, not {value!r}")
        return value

    return check


def _model(name: str, value: object) -> str | Model | None:
    if value is None or isinstance(value, Model):
        return value
    if isinstance(value, str):
        split_model_string(value)
        return value
    raise ConfigurationError(
        f"{name} must be a 'provider:model' string or a Model, not {type(value).__name__}"
    )


def _instructions(name: str, value: object) -> Instructions:
    if value is None or isinstance(value, str) or callable(value):
        return value
    raise ConfigurationError(
        f"{name} must be a str or a callable that receives the run context, not {type(value).__name__}"
    )


def _tools(name: str, value: object) -> tuple[Callable[..., Any], ...]:
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise ConfigurationError(
            f"{name} must be a sequence of functions, not {type(value).__name__}"
        )
    functions = tuple(value)
    for function in functions:
        if not callable(function):
            raise ConfigurationError(f"{name} must hold functions, not {function!r}")
    return functions


def _bool(name: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise ConfigurationError(f"{name} must be True or False, not {value!r}")
    return value


def _seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < math.inf:
        raise ConfigurationError(f"{name} must be a number of seconds > 0, not {value!r}")
    return float(value)


def _session_store(name: str, value: object) -> SessionStore:
    lock = getattr(value, "lock", None)
    if (
        isinstance(value, type)
        or not isinstance(value, SessionStore)
        or not (lock is None or callable(lock))
    ):
        raise ConfigurationError(
            f"{name} must be a session store instance (load, append, list_sessions, delete, "
            f"and optionally lock), such as SQLiteSessionStore(path), not {value!r}"
        )
    return value


_KNOBS: dict[str, Callable[[str, object], Any]] = {
    "model": _model,
    "instructions": _instructions,
    "tools": _tools,
    "settings": check_settings,
    "max_turns": _positive_int(1),
    "max_tool_calls": _positive_int(1),
    "max_tool_result_tokens": _positive_int(1),
    "max_retries": _positive_int(0),
    "capture_content": _bool,
    "session_store": _session_store,
    "cleanup_grace": _seconds,
}

_DEFAULT_STORES: weakref.WeakSet[InMemorySessionStore] = weakref.WeakSet()
"""The in-memory stores made for agent classes that declare none (one per class)."""


def _default_store() -> InMemorySessionStore:
    store = InMemorySessionStore()
    _DEFAULT_STORES.add(store)
    return store


def _method_tools(cls: type) -> dict[str, ToolDefinition]:
    found: dict[str, ToolDefinition] = {}
    for klass in reversed(cls.__mro__):
        for attribute, value in vars(klass).items():
            if tool_options(value) is not None and callable(value):
                try:
                    definition = define_tool(value, is_method=True)
                except NameError as error:
                    raise ConfigurationError(
                        f"{cls.__name__}.{attribute}: a tool annotation cannot be resolved ({error})"
                    ) from None
                found[attribute] = definition
    return found


def _function_tools(owner: str, functions: Iterable[Callable[..., Any]]) -> list[ToolDefinition]:
    definitions = []
    for function in functions:
        try:
            definitions.append(define_tool(function, is_method=False))
        except NameError as error:
            raise ConfigurationError(
                f"{owner}: a tool annotation cannot be resolved ({error})"
            ) from None
    return definitions


def _plan_of(cls: type[Agent]) -> tuple[Any, ...]:
    """The class's hook plan, made once (and again after a capability is declared)."""
    plan = cls.__dict__.get("__littleghost_hook_plan__")
    if plan is None:
        plan = hook_plan(cls, Agent)
        cls.__littleghost_hook_plan__ = plan
    return plan


def _instructions_message(text: str) -> Message:
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]
    return Message.system(text, id=f"instructions-{digest}")


class Agent:
    """An LLM agent declared as a class.

    Subclass it and declare, at class level: ``model`` (a ``"provider:model"`` string or
    a ``Model``), ``instructions`` (a str, or a callable that receives the
    ``RunContext``), tools (``@tool`` methods, and plain functions in ``tools``),
    ``settings``, the limits ``max_turns`` (100), ``max_tool_calls`` (1000) and
    ``max_tool_result_tokens`` (10 000), ``max_retries`` (3), ``capture_content``
    (False), ``session_store`` (where ``run(..., session_id=)`` keeps conversations;
    default an ``InMemorySessionStore`` of the class's own) and ``cleanup_grace`` (1 s:
    how long a stopping run may go on storing what it must). Constructor keywords of the
    same names override them for one instance.
    """

    model: ClassVar[str | Model | None] = None
    instructions: ClassVar[Instructions] = None
    tools: ClassVar[Sequence[Callable[..., Any]]] = ()
    settings: ClassVar[Mapping[str, Any]] = {}
    max_turns: ClassVar[int] = 100
    max_tool_calls: ClassVar[int] = 1000
    max_tool_result_tokens: ClassVar[int] = 10_000
    max_retries: ClassVar[int] = 3
    capture_content: ClassVar[bool] = False
    session_store: ClassVar[SessionStore] = _default_store()
    cleanup_grace: ClassVar[float] = 1.0
    context_management: ClassVar[Any] = None
    __littleghost_agent__: ClassVar[bool] = True

    __littleghost_tool_index__: ClassVar[dict[str, tuple[ToolDefinition, str | None]]] = {}
    __littleghost_hook_plan__: ClassVar[tuple[Any, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for knob, check in _KNOBS.items():
            if knob in cls.__dict__:
                value = cls.__dict__[knob]
                if knob == "instructions" and isinstance(value, staticmethod):
                    value = value.__func__
                value = check(f"{cls.__name__}.{knob}", value)
                if (
                    knob == "instructions"
                    and inspect.isfunction(value)
                    and not looks_like_method(value)
                ):
                    value = staticmethod(value)
                setattr(cls, knob, value)
        if "session_store" not in cls.__dict__ and cls.session_store in _DEFAULT_STORES:
            cls.session_store = _default_store()  # sessions never leak between classes
        cls.__littleghost_tool_index__ = index_tools(
            cls.__name__, _method_tools(cls), _function_tools(cls.__name__, cls.tools)
        )
        for entry in _plan_of(cls):
            if entry.method is not None:
                value = getattr(cls, entry.method)
                if value is not None and not callable(value):
                    raise ConfigurationError(
                        f"{cls.__name__}.{entry.method} overrides a hook but is not callable "
                        "(set it to None to turn the hook off)"
                    )

    def __init__(self, **overrides: Any) -> None:
        unknown = sorted(set(overrides) - set(_KNOBS))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}() got an unexpected keyword argument {unknown[0]!r}; "
                f"it takes {', '.join(sorted(_KNOBS))}"
            )
        for knob, value in overrides.items():
            setattr(self, knob, _KNOBS[knob](f"{type(self).__name__}(…, {knob}=)", value))
        cls = type(self)
        if "tools" in overrides:
            owner = f"{cls.__name__}(…, tools=)"
            self._tool_index = index_tools(
                owner, _method_tools(cls), _function_tools(owner, self.tools)
            )
        else:
            self._tool_index = cls.__littleghost_tool_index__
        self._hooks: dict[str, tuple[BoundHook, ...]] = bind_hooks(self, _plan_of(cls))
        self._resolved: Model | None = None
        self._resolved_from: str | None = None
        self._owned: list[Model] = []

    @property
    def name(self) -> str:
        """The agent's name (its class name), as telemetry reports it."""
        return type(self).__name__

    @functools.cached_property
    def tool_specs(self) -> tuple[ToolSpec, ...]:
        """What the model is told about this agent's tools (the same values every turn)."""
        return tuple(definition.spec for definition, _ in self._tool_index.values())

    def _declared_model(self) -> str | Model:
        declared = self.model
        if declared is None:
            raise ConfigurationError(
                f'{type(self).__name__} declares no model: set `model = "provider:name"` '
                "or pass model= to the constructor"
            )
        return declared

    def _model(self) -> Model:
        declared = self._declared_model()
        if isinstance(declared, Model):
            return declared
        if self._resolved is None or self._resolved_from != declared:
            self._resolved = resolve(declared)
            self._resolved_from = declared
            self._owned.append(self._resolved)
        return self._resolved

    async def __aenter__(self) -> Agent:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the models this agent created from model strings."""
        owned, self._owned, self._resolved = self._owned, [], None
        await _close_models(owned)

    def run_sync(self, input: str | Message, **options: Any) -> RunResult:
        """``run()`` for synchronous callers (not from inside an event loop).

        Each call runs its own event loop and owns the model it makes from a model
        string, closed at its end, so calls from several threads on one agent do not
        share one. Takes the keywords of ``run()``.
        """
        declared = self._declared_model()

        async def run_and_close() -> RunResult:
            plan = self._plan(input, **options)
            if isinstance(declared, Model):
                return await self._run_plan(plan)
            model = resolve(declared)
            try:
                result = await self._run_plan(plan, model=model)
            except BaseException:
                try:
                    await _close_models([model])
                except CleanupError:
                    pass  # the run's own error is the one to see
                raise
            await _close_models([model])
            return result

        return anyio.run(run_and_close)

    async def run(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> RunResult:
        """Run the agent on ``input`` and return the final answer.

        Args:
            input: The user's message.
            history: Earlier messages of the conversation. A tool call in it without a
                result gets an appended error result saying the run was interrupted; a
                result whose call is missing is a ``ConfigurationError``. With ``session_id``, they seed
                a new session; for a session that already has messages they are ignored
                (the stored log wins) and a ``UserWarning`` says so.
            settings: Model settings for this run, over the agent's.
            session_id: The conversation to continue from ``session_store``: the run holds
                the session until it ends (another run of it waits, within its own
                deadline), loads its log, and appends every new message as the store
                accepts it. Also telemetry's ``gen_ai.conversation.id``.
            timeout: Seconds the whole run may take.
            deadline: The absolute anyio time the run must end by.

        Raises:
            DeadlineExceededError: The deadline passed (a cleanup the stop could not
                finish within ``cleanup_grace`` is its ``__cause__``).
            LimitExceededError: ``max_turns`` or ``max_tool_calls`` was reached.
            OutputLimitError: The final answer stopped at the output limit.
            SessionStoreError: The session store failed (see its subclasses).
        """
        plan = self._plan(
            input,
            history=history,
            settings=settings,
            session_id=session_id,
            timeout=timeout,
            deadline=deadline,
        )
        return await self._run_plan(plan)

    def stream(
        self,
        input: str | Message,
        *,
        history: Sequence[Message] | None = None,
        settings: Mapping[str, Any] | None = None,
        session_id: str | None = None,
        timeout: float | None = None,
        deadline: float | None = None,
    ) -> RunStream:
        """Run the agent while yielding events; use as ``async with agent.stream(...) as
        events: async for event in events: ...``.

        Takes the keywords of ``run()``; bad arguments fail here, and the run (and its
        ``timeout``) starts when the block is entered. See ``littleghost.events``.
        """
        plan = self._plan(
            input,
            history=history,
            settings=settings,
            session_id=session_id,
            timeout=timeout,
            deadline=deadline,
        )
        return RunStream(self, plan)

    def _plan(
        self,
        input: object,
        *,
        history: object = None,
        settings: object = None,
        session_id: object = None,
        timeout: object = None,
        deadline: object = None,
    ) -> RunPlan:
        """Check ``run()``'s arguments, naming the one that is wrong."""
        if session_id is not None:
            check_session_id(session_id)
        _deadline(timeout, deadline)
        message = _user_message(input)
        seed = _history(history)
        _check_new(message, seed, "history")
        return RunPlan(
            message=message,
            seed=seed,
            settings={
                **self.settings,
                **(check_settings("settings", settings) if settings is not None else {}),
            },
            session_id=session_id,  # type: ignore[arg-type]
            timeout=timeout,  # type: ignore[arg-type]
            deadline=deadline,  # type: ignore[arg-type]
        )

    async def _run_plan(
        self,
        plan: RunPlan,
        *,
        sink: EventSink | None = None,
        observe: Callable[[RunContext], None] | None = None,
        model: Model | None = None,
    ) -> RunResult:
        """The run loop shared by ``run()`` and ``stream()`` (which passes an event sink)."""
        message, seed, session_id = plan.message, list(plan.seed), plan.session_id
        end = _deadline(plan.timeout, plan.deadline)
        model = self._model() if model is None else model
        store = self.session_store
        grace = Grace(self.cleanup_grace, None if math.isinf(end) else end)
        # With a session, the log starts empty and is filled from the store once the
        # session is held; the context keeps this very list.
        log = seed if session_id is None else []
        context = RunContext(
            self,
            model,
            plan.settings,
            None if math.isinf(end) else end,
            self.max_retries,
            self.capture_content,
            session_id,
            grace=grace,
            log=log,
            writer=None if session_id is None else functools.partial(store.append, session_id),
            sink=sink,
        )
        if observe is not None:
            observe(context)
        attributes = {
            telemetry.OPERATION_NAME: "invoke_agent",
            telemetry.AGENT_NAME: self.name,
            telemetry.PROVIDER_NAME: model.provider,
            telemetry.REQUEST_MODEL: model.name,
        }
        if session_id is not None:
            attributes[telemetry.CONVERSATION_ID] = session_id
        with telemetry.open_span(f"invoke_agent {self.name}", attributes=attributes) as span:
            result: RunResult | None = None
            try:
                with anyio.CancelScope(deadline=end) as scope:
                    if session_id is None:
                        result = await self._loop(context, message)
                    else:
                        async with _holding(store, session_id, grace):
                            await self._open_session(context, log, seed, message)
                            result = await self._loop(context, message)
            finally:
                span.set_attribute(telemetry.USAGE_INPUT_TOKENS, context.usage.input_tokens)
                span.set_attribute(telemetry.USAGE_OUTPUT_TOKENS, context.usage.output_tokens)
            if result is None:
                assert scope.cancelled_caught
                late = DeadlineExceededError(f"{self.name} did not finish before its deadline")
                if grace.failures:
                    raise late from grace.failures[0]
                raise late
            span.set_attribute(telemetry.RESPONSE_FINISH_REASONS, (result.stop_reason.value,))
            return result

    async def _open_session(
        self, context: RunContext, log: list[Message], seed: list[Message], message: Message
    ) -> None:
        """Fill the run's log from its session; a new session is seeded with ``seed``.

        System and developer messages of the seed are not stored (instructions come
        from the class each run), so they are left out of the run too.
        """
        assert context.session_id is not None
        stored = await self.session_store.load(context.session_id)
        if stored:
            _check_new(message, stored, f"session {context.session_id!r}")
            if seed:
                warnings.warn(
                    f"history= is ignored: session {context.session_id!r} already holds "
                    f"{len(stored)} messages, and the stored log wins",
                    UserWarning,
                    stacklevel=4,
                )
            log.extend(stored)
            return
        kept = [message for message in seed if not message.is_trusted]
        if len(kept) < len(seed):
            warnings.warn(
                "the system and developer messages of history= are left out of session "
                f"{context.session_id!r}: sessions do not store instructions, which come "
                "from the agent class each run",
                UserWarning,
                stacklevel=4,
            )
        await context.append(*kept)

    async def _loop(self, context: RunContext, message: Message) -> RunResult:
        repaired = interrupted_results(context.messages)
        await context.append(*repaired, message)
        try:
            return await self._turns(context)
        except BaseException:
            await _answer_open_calls(context)
            raise

    async def _turns(self, context: RunContext) -> RunResult:
        prepare = getattr(context.model, "prepare", None)
        if prepare is not None:
            await prepare()
        tool_calls = 0
        for turn in range(self.max_turns):
            context.turn = turn
            request = await self._request(context)
            answered = await self._call_model(request, context)
            response = await run_chain(
                self._hooks["after_model"], answered, expected=ModelResponse, context=context
            )
            await context.append(response.message)
            await context.emit(ModelCallFinished(answered.usage, response.stop_reason))
            calls = response.message.tool_calls
            if calls:
                if tool_calls + len(calls) > self.max_tool_calls:
                    await self._refuse(calls, context, "max_tool_calls", self.max_tool_calls)
                if turn == self.max_turns - 1:
                    await self._refuse(calls, context, "max_turns", self.max_turns)
                tool_calls += len(calls)
                await self._run_tools(calls, context)
                continue
            if response.stop_reason is StopReason.MAX_TOKENS:
                raise OutputLimitError(
                    "the model stopped at its output limit before completing its answer",
                    response=response,
                )
            return RunResult(
                response.message.text, context.messages, context.usage, response.stop_reason
            )
        raise LimitExceededError(
            f"{self.name} reached max_turns={self.max_turns}",
            limit="max_turns",
            value=self.max_turns,
        )

    async def _refuse(
        self, calls: Sequence[ToolCall], context: RunContext, limit: str, value: int
    ) -> None:
        """Answer ``calls`` without running them (the log stays whole), then stop the run."""
        text = f"Not run: the run reached {limit}={value}."
        await context.append(*(Message.tool(call.id, text, is_error=True) for call in calls))
        raise LimitExceededError(f"{self.name} reached {limit}={value}", limit=limit, value=value)

    async def _request(self, context: RunContext) -> ModelRequest:
        instructions: Any = getattr(self, "instructions", None)
        text: object = instructions
        if callable(instructions):
            text = instructions(context)
            if inspect.isawaitable(text):
                text = await text
        if text is not None and not isinstance(text, str):
            raise ConfigurationError(
                f"{self.name}.instructions returned {type(text).__name__}, not a str"
            )
        view = context.view()
        messages = (_instructions_message(text), *view) if text else view
        return ModelRequest(messages, self.tool_specs, context.settings)

    async def _call_model(self, request: ModelRequest, context: RunContext) -> ModelResponse:
        before = self._hooks["before_model"]
        request = await run_chain(before, request, expected=ModelRequest, context=context)
        recoveries = 0
        while True:
            try:
                return await context.complete(request)
            except (CleanupError, DeadlineExceededError):
                raise
            except Exception as error:
                if recoveries >= MAX_RECOVERIES:
                    raise
                replacement = await run_chain(
                    self._hooks["after_model_error"],
                    request,
                    error,
                    expected=ModelRequest,
                    context=context,
                )
                if replacement is request:
                    raise
                recoveries += 1
                if context.streaming:
                    await context.emit(ModelCallRetried(recoveries, telemetry.error_type(error)))
                request = await run_chain(
                    before, replacement, expected=ModelRequest, context=context
                )

    async def _run_tools(self, calls: Sequence[ToolCall], context: RunContext) -> None:
        """Run ``calls`` concurrently; store their results in call order.

        A result is stored as soon as it and every earlier call's result are done, and
        its ``ToolCallFinished`` event follows its storing. If the run stops meanwhile,
        the finished results not yet stored are stored all the same (within the
        cleanup grace); the run loop answers the rest.
        """
        results: list[ToolResult | None] = [None] * len(calls)
        stored = 0
        storing = anyio.Lock()
        failures: list[BaseException] = []

        async def store_ready() -> None:
            nonlocal stored
            async with storing:
                end = stored
                while end < len(results) and results[end] is not None:
                    end += 1
                ready = [result for result in results[stored:end] if result is not None]
                await context.append(*(Message(Role.TOOL, (result,)) for result in ready))
                stored = end
                for result in ready:
                    await context.emit(ToolCallFinished(result))

        async def run_one(index: int, call: ToolCall) -> None:
            try:
                results[index] = await self._run_tool(call, context)
                await store_ready()
            except (Exception, KeyboardInterrupt, SystemExit) as error:
                failures.append(error)  # re-raised as itself, not in an exception group
                group.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as group:
                for index, call in enumerate(calls):
                    group.start_soon(run_one, index, call)
        finally:
            answered = _answered(context.messages, calls)
            unstored = [r for r in results if r is not None and r.call_id not in answered]
            if unstored and not context.grace.uncertain:
                await _cleanup(
                    context,
                    "storing finished tool results",
                    context.append(*(Message(Role.TOOL, (result,)) for result in unstored)),
                )
        if failures:
            raise failures[0]

    async def _run_tool(self, call: ToolCall, context: RunContext) -> ToolResult:
        original_id = call.id
        call = await run_chain(self._hooks["before_tool"], call, expected=ToolCall, context=context)
        await context.emit(ToolCallStarted(call))
        name = (
            call.name if call.name in self._tool_index or self.capture_content else UNDECLARED_TOOL
        )
        attributes = {
            telemetry.OPERATION_NAME: "execute_tool",
            telemetry.TOOL_NAME: name,
            telemetry.TOOL_CALL_ID: original_id,
            telemetry.TOOL_TYPE: "function",
        }
        with telemetry.open_span(f"execute_tool {name}", attributes=attributes) as span:
            if self.capture_content and span.is_recording():
                span.set_attribute(
                    telemetry.TOOL_CALL_ARGUMENTS, telemetry.arguments_json(call.arguments)
                )
            result = await self._execute(call, context, span)
            if self.capture_content and span.is_recording():
                span.set_attribute(telemetry.TOOL_CALL_RESULT, result.content)
        replaced: ToolResult = await run_chain(
            self._hooks["after_tool"], result, expected=ToolResult, context=context
        )
        if replaced.call_id != original_id:
            replaced = attrs.evolve(replaced, call_id=original_id)
        return replaced

    async def _execute(self, call: ToolCall, context: RunContext, span: Any) -> ToolResult:
        entry = self._tool_index.get(call.name)
        if entry is None:
            available = ", ".join(sorted(self._tool_index)) or "none"
            telemetry.mark_failed(span, "unknown_tool")
            return error_result(call, f"Unknown tool {call.name!r}. Available tools: {available}.")
        definition, attribute = entry
        try:
            kwargs = bind_arguments(definition, call)
        except ToolArgumentError as problem:
            telemetry.mark_failed(span, "invalid_arguments")
            return error_result(call, f"Invalid arguments for tool {call.name!r}: {problem}")
        if definition.context_parameter is not None:
            kwargs[definition.context_parameter] = context
        function = getattr(self, attribute) if attribute is not None else definition.function
        limit = definition.timeout
        with anyio.CancelScope(
            deadline=math.inf if limit is None else anyio.current_time() + limit
        ) as timer:
            try:
                text = await invoke(function, kwargs, definition.name)
            except anyio.get_cancelled_exc_class():
                if anyio.current_effective_deadline() == -math.inf:
                    raise  # the run is stopping, or the tool's own timeout passed
                return self._failed(call, span, "cancelled", "it raised a cancellation exception")
            except (KeyboardInterrupt, SystemExit):
                raise
            except DeadlineExceededError as error:
                if context.deadline is not None and anyio.current_time() >= context.deadline:
                    raise  # the run's own deadline
                return self._failed(call, span, error, f"DeadlineExceededError: {error}")
            except BaseException as error:  # the tool's own failure, of any kind
                return self._failed(call, span, error, f"{type(error).__name__}: {error}")
            return ToolResult(call.id, self._stored_result(text))
        assert timer.cancelled_caught and limit is not None
        return self._failed(
            call, span, "timeout", f"it did not finish within {limit:g} s and was stopped"
        )

    def _failed(
        self, call: ToolCall, span: Any, error: BaseException | str, what: str
    ) -> ToolResult:
        telemetry.mark_failed(span, error)
        return error_result(call, self._stored_result(f"Tool {call.name!r} failed: {what}"))

    def _stored_result(self, text: str) -> str:
        """Without context management the log holds the cut result; with it, the whole
        result (views cut what the model sees)."""
        if self.context_management is not None:
            return text
        return truncate_middle(text, self.max_tool_result_tokens)


async def _close_models(models: Iterable[Model]) -> None:
    """Close ``models`` (shielded); ``CleanupError`` if any failed."""
    errors = []
    with anyio.CancelScope(shield=True):
        for model in models:
            close = getattr(model, "aclose", None)
            if close is None:
                continue
            try:
                await close()
            except Exception as error:
                errors.append(error)
    if errors:
        raise CleanupError(f"closing {len(errors)} model(s) failed") from errors[0]


async def _cleanup(context: RunContext, what: str, work: Awaitable[None]) -> None:
    """Await cleanup ``work`` for a run that stops: shielded until its grace ends; a
    failure is recorded and logged, never raised over what stopped the run."""
    with anyio.CancelScope(shield=True, deadline=context.grace.stop()):
        try:
            await work
        except Exception as failure:
            context.grace.fail(what, failure)


async def _answer_open_calls(context: RunContext) -> None:
    """Answer, in the log, the tool calls a stopping run leaves open (so the log can be
    passed back as history). Skipped when a write was cut off with its outcome unknown:
    the store may hold more than the log, and the next run repairs from the store."""
    if context.grace.uncertain:
        return
    open_calls = interrupted_results(context.messages, STOPPED_TEXT)
    if open_calls:
        await _cleanup(context, "answering the open tool calls", context.append(*open_calls))


@asynccontextmanager
async def _holding(store: SessionStore, session_id: str, grace: Grace) -> AsyncIterator[None]:
    """Hold the session for the run; releasing it never replaces what stopped the run."""
    hold = hold_session(store, session_id)
    await hold.__aenter__()
    try:
        yield
    except BaseException:
        with anyio.CancelScope(shield=True, deadline=grace.stop()):
            try:
                await hold.__aexit__(None, None, None)
            except Exception as failure:
                grace.fail("releasing the session", failure)
        raise
    await hold.__aexit__(None, None, None)


def _answered(log: Sequence[Message], calls: Sequence[ToolCall]) -> set[str]:
    """The ids of ``calls`` answered in ``log`` since the message that made them."""
    ids = {call.id for call in calls}
    found: set[str] = set()
    for message in reversed(log):
        found.update(result.call_id for result in message.tool_results if result.call_id in ids)
        if any(call.id in ids for call in message.tool_calls):
            break
    return found


def _check_new(message: Message, log: Sequence[Message], where: str) -> None:
    """The input must be a new message, not one of the conversation's."""
    if any(earlier.id == message.id for earlier in log):
        raise ConfigurationError(
            f"input: a message with id {message.id!r} is already in the {where}; pass a new message"
        )


def _user_message(value: object) -> Message:
    if isinstance(value, str):
        return Message.user(value)
    if isinstance(value, Message):
        if value.role is not Role.USER:
            raise TypeError(f"input must be a user message, not a {value.role} message")
        if value.tool_calls or value.tool_results:
            raise ConfigurationError(
                "input: a user message holds text and images, not tool calls or tool results"
            )
        return value
    raise TypeError(f"input must be a str or a user Message, not {type(value).__name__}")


def _history(value: object) -> list[Message]:
    if value is None:
        return []
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Iterable):
        raise TypeError(f"history must be a sequence of Message, not {type(value).__name__}")
    log = list(value)
    for position, message in enumerate(log):
        if not isinstance(message, Message):
            raise TypeError(f"history[{position}] must be a Message, not {type(message).__name__}")
    orphans = orphan_results(log)
    if orphans:
        position = orphans[0]
        call_id = log[position].tool_results[0].call_id if log[position].tool_results else "?"
        raise ConfigurationError(
            f"history[{position}] is a tool result for call {call_id!r}, which no earlier "
            "assistant message in the history makes"
        )
    return log


def _deadline(timeout: object, deadline: object) -> float:
    end = math.inf
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout >= 0:
            raise TypeError(f"timeout must be seconds >= 0, not {timeout!r}")
        end = anyio.current_time() + timeout
    if deadline is not None:
        if (
            isinstance(deadline, bool)
            or not isinstance(deadline, (int, float))
            or math.isnan(deadline)
        ):
            raise TypeError(f"deadline must be an anyio clock time (a float), not {deadline!r}")
        end = min(end, float(deadline))
    return end
