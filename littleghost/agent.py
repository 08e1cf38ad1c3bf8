"""``Agent``: class-level declarations, ``run`` / ``run_sync``, and the turn loop."""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar

import anyio
import attrs

from littleghost import telemetry
from littleghost.context.view import interrupted_results, orphan_results
from littleghost.errors import (
    CleanupError,
    ConfigurationError,
    DeadlineExceededError,
    LimitExceededError,
    OutputLimitError,
)
from littleghost.events import ModelCallRetried, ToolCallFinished, ToolCallStarted
from littleghost.hooks import BoundHook, bind_hooks, hook_plan, run_chain
from littleghost.messages import Message, Role, ToolCall, ToolResult
from littleghost.models.base import Model, ModelRequest, ModelResponse, StopReason, ToolSpec
from littleghost.models.registry import resolve, split_model_string
from littleghost.run import EventSink, RunContext, RunResult
from littleghost.sessions import InMemorySessionStore, SessionStore
from littleghost.sessions.locks import hold_session
from littleghost.stream import RunPlan, RunStream
from littleghost.text import truncate_middle
from littleghost.tools import (
    ToolArgumentError,
    ToolDefinition,
    bind_arguments,
    define_tool,
    error_result,
    invoke,
    looks_like_method,
    tool_options,
)

__all__ = ["Agent"]

STOPPED_TEXT = "The run was stopped before this tool call finished; it has no result."
MAX_RECOVERIES = 3
"""How many replacement requests ``after_model_error`` hooks may hand back per model call."""

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


def _settings(name: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise ConfigurationError(f"{name} must be a mapping with str keys, not {value!r}")
    return dict(value)


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
    "settings": _settings,
    "max_turns": _positive_int(1),
    "max_tool_calls": _positive_int(1),
    "max_tool_result_tokens": _positive_int(1),
    "max_retries": _positive_int(0),
    "capture_content": _bool,
    "session_store": _session_store,
}


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


def _index_tools(
    owner: str, method_tools: Mapping[str, ToolDefinition], functions: Iterable[Callable[..., Any]]
) -> dict[str, tuple[ToolDefinition, str | None]]:
    index: dict[str, tuple[ToolDefinition, str | None]] = {}
    for attribute, definition in method_tools.items():
        index[definition.name] = (definition, attribute)
    for definition in _function_tools(owner, functions):
        if definition.name in index:
            raise ConfigurationError(f"{owner}: two tools are named {definition.name!r}")
        index[definition.name] = (definition, None)
    return index


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
    (False) and ``session_store`` (where ``run(..., session_id=)`` keeps conversations;
    default one process-wide ``InMemorySessionStore``). Constructor keywords of the same
    names override them for one instance.
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
    session_store: ClassVar[SessionStore] = InMemorySessionStore()
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
        cls.__littleghost_tool_index__ = _index_tools(cls.__name__, _method_tools(cls), cls.tools)
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
            self._tool_index = _index_tools(
                f"{cls.__name__}(…, tools=)", _method_tools(cls), self.tools
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

    def _model(self) -> Model:
        declared = self.model
        if isinstance(declared, Model):
            return declared
        if declared is None:
            raise ConfigurationError(
                f'{type(self).__name__} declares no model: set `model = "provider:name"` '
                "or pass model= to the constructor"
            )
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
        errors = []
        with anyio.CancelScope(shield=True):
            for model in owned:
                close = getattr(model, "aclose", None)
                if close is None:
                    continue
                try:
                    await close()
                except Exception as error:
                    errors.append(error)
        if errors:
            raise CleanupError(f"closing {len(errors)} model(s) failed") from errors[0]

    def run_sync(self, input: str | Message, **options: Any) -> RunResult:
        """``run()`` for synchronous callers (not from inside an event loop).

        Each call runs its own event loop; the models the agent made from model strings
        are closed at its end and made again by the next call.
        """

        async def run_and_close() -> RunResult:
            try:
                return await self.run(input, **options)
            finally:
                await self.aclose()  # clients made in this event loop die with it

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
                deadline), loads its log, and appends every new message as it enters
                the log. Also telemetry's ``gen_ai.conversation.id``.
            timeout: Seconds the whole run may take.
            deadline: The absolute anyio time the run must end by.

        Raises:
            DeadlineExceededError: The deadline passed.
            LimitExceededError: ``max_turns`` or ``max_tool_calls`` was reached.
            OutputLimitError: The final answer stopped at the output limit.
            SessionStoreError: The session store failed (see its subclasses).
        """
        plan = self._plan(input, history, settings, session_id, timeout, deadline)
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
        return RunStream(self, self._plan(input, history, settings, session_id, timeout, deadline))

    def _plan(
        self,
        input: object,
        history: object,
        settings: object,
        session_id: object,
        timeout: object,
        deadline: object,
    ) -> RunPlan:
        """Check ``run()``'s arguments, naming the one that is wrong."""
        if session_id is not None and (not isinstance(session_id, str) or not session_id):
            raise TypeError(f"session_id must be a non-empty str, not {session_id!r}")
        _deadline(timeout, deadline)
        return RunPlan(
            message=_user_message(input),
            seed=_history(history),
            settings={
                **self.settings,
                **(_settings("settings", settings) if settings is not None else {}),
            },
            session_id=session_id,
            timeout=timeout,  # type: ignore[arg-type]
            deadline=deadline,  # type: ignore[arg-type]
        )

    async def _run_plan(
        self,
        plan: RunPlan,
        *,
        sink: EventSink | None = None,
        observe: Callable[[RunContext], None] | None = None,
    ) -> RunResult:
        """The run loop shared by ``run()`` and ``stream()`` (which passes an event sink)."""
        message, seed, session_id = plan.message, list(plan.seed), plan.session_id
        end = _deadline(plan.timeout, plan.deadline)
        model = self._model()
        store = self.session_store
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
                        async with hold_session(store, session_id):
                            await self._open_session(context, log, seed)
                            result = await self._loop(context, message)
            finally:
                span.set_attribute(telemetry.USAGE_INPUT_TOKENS, context.usage.input_tokens)
                span.set_attribute(telemetry.USAGE_OUTPUT_TOKENS, context.usage.output_tokens)
            if result is None:
                assert scope.cancelled_caught
                raise DeadlineExceededError(f"{self.name} did not finish before its deadline")
            span.set_attribute(telemetry.RESPONSE_FINISH_REASONS, (result.stop_reason.value,))
            return result

    async def _open_session(
        self, context: RunContext, log: list[Message], seed: list[Message]
    ) -> None:
        """Fill the run's log from its session; a new session is seeded with ``seed``.

        System and developer messages of the seed are not stored (instructions come
        from the class each run), so they are left out of the run too.
        """
        assert context.session_id is not None
        stored = await self.session_store.load(context.session_id)
        if stored:
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
            # A stop (cancellation, deadline, error) can leave tool calls without results:
            # answer them in the log so it can be passed back as history.
            with anyio.CancelScope(shield=True):
                await context.append(*interrupted_results(context.messages, STOPPED_TEXT))
            raise

    async def _turns(self, context: RunContext) -> RunResult:
        prepare = getattr(context.model, "prepare", None)
        if prepare is not None:
            await prepare()
        tool_calls = 0
        for turn in range(self.max_turns):
            context.turn = turn
            request = await self._request(context)
            response = await self._call_model(request, context)
            response = await run_chain(
                self._hooks["after_model"], response, expected=ModelResponse, context=context
            )
            await context.append(response.message)
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
        """Run ``calls`` concurrently and append their results in call order.

        If the run stops meanwhile, the results already finished are appended all the
        same (shielded); the run loop answers the rest.
        """
        results: list[ToolResult | None] = [None] * len(calls)
        failures: list[BaseException] = []

        async def run_one(index: int, call: ToolCall) -> None:
            try:
                result = results[index] = await self._run_tool(call, context)
                await context.emit(ToolCallFinished(result))  # after it is kept: a stop
            except Exception as error:  # while the consumer reads cannot lose it
                failures.append(error)
                group.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as group:
                for index, call in enumerate(calls):
                    group.start_soon(run_one, index, call)
        finally:
            with anyio.CancelScope(shield=True):
                await context.append(
                    *(Message(Role.TOOL, (result,)) for result in results if result is not None)
                )
        if failures:
            raise failures[0]

    async def _run_tool(self, call: ToolCall, context: RunContext) -> ToolResult:
        original_id = call.id
        call = await run_chain(self._hooks["before_tool"], call, expected=ToolCall, context=context)
        await context.emit(ToolCallStarted(call))
        attributes = {
            telemetry.OPERATION_NAME: "execute_tool",
            telemetry.TOOL_NAME: call.name,
            telemetry.TOOL_CALL_ID: original_id,
            telemetry.TOOL_TYPE: "function",
        }
        with telemetry.open_span(f"execute_tool {call.name}", attributes=attributes) as span:
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
        if definition.takes_context:
            kwargs["context"] = context
        function = getattr(self, attribute) if attribute is not None else definition.function
        try:
            text = await invoke(function, kwargs)
        except (CleanupError, DeadlineExceededError):
            raise
        except Exception as error:
            telemetry.mark_failed(span, error)
            text = f"Tool {call.name!r} failed: {type(error).__name__}: {error}"
            return error_result(call, self._stored_result(text))
        return ToolResult(call.id, self._stored_result(text))

    def _stored_result(self, text: str) -> str:
        """Without context management the log holds the cut result; with it, the whole
        result (views cut what the model sees)."""
        if self.context_management is not None:
            return text
        return truncate_middle(text, self.max_tool_result_tokens)


def _user_message(value: object) -> Message:
    if isinstance(value, str):
        return Message.user(value)
    if isinstance(value, Message):
        if value.role is not Role.USER:
            raise TypeError(f"input must be a user message, not a {value.role} message")
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
