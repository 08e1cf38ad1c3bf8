"""The run loop: ``run(agent, plan)`` runs an agent once.

``Agent.run``, ``Agent.run_sync`` and ``agent.stream()`` all come here (``stream()``
passes an event sink); ``plan_run`` checks ``run()``'s arguments into a ``RunPlan``.
One run opens a ``RunContext`` (the deadline as one anyio scope, the usage total, the
session, the ``invoke_agent`` span) and loads the log; then each turn builds the request
from the log's view, runs the ``before_model`` hooks, calls the model (``after_model_error``
hooks may hand back a replacement request), runs the ``after_model`` hooks, appends the
answer and runs its tool calls concurrently, until a final answer or a limit. A run that
stops answers the tool calls it leaves open, so the log stays valid.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import os
import re
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import anyio
import attrs
from attrs import define, field, frozen

from littleghost import logs, telemetry
from littleghost._validators import is_number, safe_repr
from littleghost.cleanup import (
    Grace,
    cancellation_turned_into,
    cancelled_here,
    enclosing_graces,
    fatal,
    go_on_if_turned,
    holding,
    leaves,
    note_stop,
    turned_into,
)
from littleghost.context.budget import view_only
from littleghost.context.view import interrupted_results
from littleghost.errors import (
    CleanupError,
    ConfigurationError,
    DeadlineExceededError,
    LimitExceededError,
    LittleGhostError,
    OutputLimitError,
    OutputValidationError,
    naming_session,
)
from littleghost.events import (
    ModelCallFinished,
    ToolCallFinished,
    ToolCallStarted,
)
from littleghost.exiting import stopped_at_exit
from littleghost.hooks import BoundHook, run_chain
from littleghost.log_rules import check_history, check_pairing, check_parts, check_stored
from littleghost.messages import (
    ImagePart,
    Message,
    Role,
    ToolCall,
    ToolResult,
    empty_image,
    new_id,
)
from littleghost.models.base import (
    Model,
    ModelRequest,
    ModelResponse,
    StopReason,
    capped,
    prepare,
)
from littleghost.models.registry import is_local_model
from littleghost.output import (
    OUTPUT_TOOL,
    Answer,
    OutputPlan,
    OutputType,
    check_tool_choice,
    check_tool_names,
    compile_output_type,
    plan_output,
)
from littleghost.run import EventSink, RunContext, RunResult
from littleghost.sessions.base import SessionStore, awaitable, check_session_id, distinct_ids
from littleghost.sessions.locks import hold_session
from littleghost.sessions.notices import WaitWatch, watching_waits
from littleghost.settings import check_local_settings, check_settings
from littleghost.text import brief, truncate_middle, well_formed
from littleghost.tool_calls import Outcome, error_result, invoke, raised_text
from littleghost.tools import ToolArgumentError, ToolDefinition, bind_arguments

if TYPE_CHECKING:
    from opentelemetry.trace import Span

    from littleghost.agent import Agent

__all__ = ["RunPlan", "check_response_format", "instructions_message", "plan_run", "run"]

STOPPED_TEXT = (
    "The run was stopped before this tool call finished; it has no result, and what it "
    "does may have happened or may still happen: check before calling it again."
)
WITHHELD_TEXT = (
    "This tool call finished, but the run stopped in an after_tool hook, so its result was "
    "withheld; whatever the call did is done."
)
MAX_NESTED_RUNS = 32
"""Runs nested in each other at most (an agent whose tool runs it again, without end)."""
_NESTING: ContextVar[tuple[_Going, ...]] = ContextVar("littleghost_nesting", default=())
"""The runs the current code runs in, still going (in their tools' threads and loops too;
a task a tool started outside its run carries them, its run over or not)."""

MAX_RECOVERIES = 3
"""How many replacement requests ``after_model_error`` hooks may hand back per model call."""
MAX_REPAIRS = 1
"""How many turns a run gives the model to fix a final answer that does not fit its
``output_type`` before ``OutputValidationError``."""
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
"""littleghost's own files: frames in them are not where a run was asked for."""
_tools_log = logs.logger("littleghost.tools")
"""Where a tool call that outlived its timeout is reported (names only, no content)."""
UNDECLARED_TOOL = "undeclared"
"""The tool name telemetry shows for a call of a tool the agent does not declare (the
name is the model's text), unless ``capture_content`` is on."""


@frozen(kw_only=True)
class RunPlan:
    """The checked arguments of one run."""

    message: Message
    seed: Sequence[Message]
    settings: Mapping[str, Any]
    session_id: str | None
    timeout: float | None
    deadline: float | None
    output: OutputType | None = None
    caller: CallSite
    """Where the run was asked for: the place its warnings name."""


@frozen
class CallSite:
    """Where user code called ``run()``, ``run_sync()`` or ``stream()``: the place the
    run's warnings name (the run itself may be in a task or an event loop of its own)."""

    filename: str
    lineno: int
    globals: dict[str, Any] = field(repr=False)

    def warn(self, text: str) -> None:
        """Warn ``text`` (a ``UserWarning``) as if from this place."""
        warnings.warn_explicit(
            text,
            UserWarning,
            self.filename,
            self.lineno,
            module=self.globals.get("__name__"),
            registry=self.globals.setdefault("__warningregistry__", {}),
            module_globals=self.globals,
        )


def _call_site() -> CallSite:
    """The innermost frame outside littleghost, where the run was asked for."""
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame = frame.f_back
    return CallSite(frame.f_code.co_filename, frame.f_lineno, frame.f_globals)


def plan_run(
    agent: Agent,
    input: object,
    *,
    history: object = None,
    settings: object = None,
    session_id: object = None,
    timeout: object = None,
    deadline: object = None,
    output_type: object = None,
    method: str = "run",
) -> RunPlan:
    """Check ``run()``'s arguments (those of ``method``: ``run``, ``run_sync`` or
    ``stream``), naming the one that is wrong, after the agent's declarations
    (``Agent.run_settings``)."""
    declared = agent.run_settings()
    if session_id is not None:  # as a plain str: a subclass's own == could match others
        session_id = check_session_id(session_id)
    _check_timing(timeout, deadline)
    message = _user_message(input)
    seed = _history(history)
    _check_new(message, seed, "history")
    output = agent.output
    if output_type is not None:
        output = compile_output_type(output_type, f"{method}(output_type=)")
        if output is not None:
            check_tool_names(f"{method}(output_type=)", agent.tool_names)
    given = {} if settings is None else check_settings("settings", settings)
    merged = {**declared, **given}
    where = "settings" if "response_format" in given else agent._settings_owner
    check_response_format(where, merged, output)
    return RunPlan(
        message=message,
        seed=seed,
        settings=merged,
        session_id=session_id,
        timeout=timeout,  # type: ignore[arg-type]
        deadline=deadline,  # type: ignore[arg-type]
        output=output,
        caller=_call_site(),
    )


def check_response_format(
    name: str, settings: Mapping[str, Any], output: OutputType | None
) -> None:
    """``ConfigurationError`` when ``settings`` (named ``name``) set ``response_format``
    while an output type applies: the output type decides the answer's format."""
    if output is not None and "response_format" in settings:
        raise ConfigurationError(
            f"{name}: response_format cannot be set when an output_type applies; the "
            "output type decides the format of the answer"
        )


async def run(
    agent: Agent,
    plan: RunPlan,
    *,
    make_model: Callable[[], Model] | None = None,
    sink: EventSink | None = None,
    observe: Callable[[RunContext], None] | None = None,
    held: Callable[[], None] | None = None,
) -> RunResult[Any]:
    """Run ``agent`` once, as ``plan`` says.

    Args:
        agent: The agent to run.
        plan: The run's checked arguments (``plan_run``).
        make_model: Makes the model to call (a failure to make it fails a run span
            too); by default ``agent.resolve_model()``, its result checked.
        sink: Receives the run's events (``stream()`` passes one).
        observe: Called with the ``RunContext`` once it is made.
        held: Called once the run holds its session and has its log from it (at its
            start without one).

    Raises:
        The errors ``Agent.run`` documents.
    """
    name = f"invoke_agent {agent.name}"
    names = telemetry.run_names(agent.name, plan.session_id)
    attributes = {
        telemetry.OPERATION_NAME: "invoke_agent",
        **names,
        **telemetry.setting_attributes(plan.settings),
    }
    if plan.output is not None:
        attributes[telemetry.OUTPUT_TYPE] = "json"
    with logs.naming(names):
        try:  # the provider and model are there when the span starts, for samplers
            model = (make_model or agent._resolved_model)()
            if is_local_model(model):
                check_local_settings("settings", plan.settings)
            attributes[telemetry.PROVIDER_NAME] = model.provider
            attributes[telemetry.REQUEST_MODEL] = model.name
            plan = attrs.evolve(plan, settings=capped(plan.settings, model))  # as it is sent
            attributes.update(telemetry.setting_attributes(plan.settings))
        except BaseException:
            with telemetry.open_span(name, attributes=attributes) as span:
                span.set_attribute(telemetry.RESPONSE_FINISH_REASONS, telemetry.UNANSWERED)
                raise  # a model that cannot be resolved fails a span too
        runs: list[RunContext] = []

        def deadline() -> float | None:  # a served run's: its own leaves as an error
            return runs[0].grace.enclosing_cut() if runs else None

        with (
            stopped_at_exit(agent.cleanup_grace) as stopping,
            telemetry.open_span(name, attributes=attributes, deadline=deadline) as span,
            stopping,
        ):

            def seen(context: RunContext) -> None:
                runs.append(context)
                if observe is not None:
                    observe(context)

            def stop() -> float:
                return runs[0].grace.stop() if runs else math.inf

            with agent._runs.track(lambda: runs[0].grace if runs else None):
                # a model the agent gave up meanwhile (aclose()) is closed as its cleanup
                declared = None if make_model else agent._model_string()
                async with agent._models.use(
                    model, agent.cleanup_grace, by=stop, declared=declared
                ) as model:
                    try:
                        with _nested(agent):
                            return await _run_in(span, agent, plan, model, sink, seen, held)
                    except BaseException as error:  # failed, cancelled or past its deadline
                        span.set_attribute(telemetry.RESPONSE_FINISH_REASONS, telemetry.UNANSWERED)
                        if not runs:
                            raise
                        note_stop(runs[0].grace)  # an `async with agent:` block's cleanup too
                        if isinstance(error, LittleGhostError):
                            # a nested run's error ends this run too: this run's usage
                            error.run_usage = runs[0].usage
                        raise


@contextmanager
def _nested(agent: Agent) -> Iterator[None]:
    """Count the run among the runs nested in each other, refusing it past
    ``MAX_NESTED_RUNS`` (before it holds a session or calls its model)."""
    going = tuple(run for run in _NESTING.get() if run.going)
    if len(going) >= MAX_NESTED_RUNS:
        raise LimitExceededError(
            f"{agent.name}: a run started inside {MAX_NESTED_RUNS} runs nested in each other "
            "(a tool that runs its agent again, without end?); runs nest "
            f"{MAX_NESTED_RUNS} deep at most",
            limit="nested_runs",
            value=MAX_NESTED_RUNS,
        )
    this = _Going()
    nesting = _NESTING.set((*going, this))
    try:
        yield
    finally:
        this.going = False
        _NESTING.reset(nesting)


@define
class _Going:
    """Whether a run is still going (a run started from a task its tool left behind
    once it is over is not nested in it)."""

    going: bool = True


async def _run_in(
    span: Span,
    agent: Agent,
    plan: RunPlan,
    model: Model,
    sink: EventSink | None,
    observe: Callable[[RunContext], None] | None,
    held: Callable[[], None] | None,
) -> RunResult[Any]:
    """The run of ``run``, inside its ``invoke_agent`` span."""
    message, seed, session_id = plan.message, list(plan.seed), plan.session_id
    end = _deadline(plan.timeout, plan.deadline)
    output = plan_output(plan.output, agent.output_strategy, model)
    if output is not None and not output.native:
        check_tool_choice(f"{agent.name} settings", plan.settings)
    store = agent.session_store
    caller = anyio.current_effective_deadline()
    stop = min(end, caller)  # the caller's deadline counts too
    outer = (g.run_deadline for g in enclosing_graces() if g.run_deadline is not None)
    bound = min([end, *(d for d in outer if d >= caller)])  # runs whose scope is around it
    grace = Grace(
        agent.cleanup_grace,
        None if math.isinf(stop) else stop,
        run_deadline=None if math.isinf(end) else end,
    )
    # With a session, the log starts empty and is filled from the store once the
    # session is held; the context keeps this very list.
    log = seed if session_id is None else []
    context = RunContext(
        agent,
        model,
        plan.settings,
        None if math.isinf(bound) else bound,  # a run it is nested in stops it too
        agent.max_retries,
        agent.capture_content,
        session_id,
        grace=grace,
        log=log,
        writer=None if session_id is None else functools.partial(_append, store, session_id),
        sink=sink,
    )
    if observe is not None:
        observe(context)
    result: RunResult[Any] | None = None
    scope = anyio.CancelScope(deadline=end)
    waiting = session_id is not None  # for its session, which another run may hold
    watch = WaitWatch()  # or for the store's database, busy with another connection
    try:
        with scope:
            async with grace.running():
                if session_id is None:
                    if held is not None:
                        held()
                    result = await _loop(agent, context, message, output)
                else:
                    with watching_waits(watch):
                        async with holding(hold_session(store, session_id), grace):
                            waiting = False
                            try:
                                await _open_session(agent, context, log, seed, plan)
                                if held is not None:
                                    held()
                                result = await _loop(agent, context, message, output)
                            finally:
                                context._ended = True  # before the session is released
    except BaseException as error:
        found = fatal(error)
        deadline = None if found is not None else _runs_deadline(error, context)
        if deadline is not None and deadline is not error:
            raise deadline from deadline.__cause__  # out of a hook's own task group
        if found is None and _deadline_turned_into(error, scope):
            raise _late(agent, context, waiting, watch) from error
        if found is None:
            await go_on_if_turned(error)  # the caller's cancellation goes on
        if found is None or found is error:
            raise
        raise found from None  # out of a store's (or a hook's) own task group
    finally:
        context._ended = True
        span.set_attributes(telemetry.usage_attributes(context.usage))
    if result is None:
        assert scope.cancelled_caught
        late = _late(agent, context, waiting, watch)
        if grace.failures:
            raise late from grace.failures[0]
        raise late
    span.set_attribute(
        telemetry.RESPONSE_FINISH_REASONS, (telemetry.finish_reason(result.stop_reason),)
    )
    if output is None and not result.output.strip():  # no repair turn: "" is a str's value
        span.set_attribute(telemetry.OUTPUT_EMPTY, True)
    return result


def _late(
    agent: Agent, context: RunContext, waiting: bool, watch: WaitWatch
) -> DeadlineExceededError:
    """The run's ``DeadlineExceededError``, saying what the run was doing when it came (a
    declared tool by name; still ``waiting`` to hold its session, say, and whether the
    store's database was what it or a store call (a load, a write) waited for), never
    content."""
    why = "its deadline"
    if waiting:  # another run holds it, or the store is slow to answer
        why += f", still waiting to hold session {context.session_id!r}"
    else:
        why += f", {context._doing()} in turn {context.turn + 1} (of {agent.max_turns} at most)"
    waited = watch if waiting else context._store_wait
    if waited is not None and waited.database_busy:
        why += ": its store's database was busy with another connection's write"
    return DeadlineExceededError(
        f"{agent.name} did not finish before {why}", deadline=context.grace.run_deadline
    )


async def _append(store: SessionStore, session_id: str, messages: Sequence[Message]) -> None:
    with naming_session(session_id):
        await awaitable(store.append(session_id, messages), "append")


def _deadline_turned_into(error: BaseException, scope: anyio.CancelScope) -> bool:
    """Whether ``error`` is what the cancellation at the run's deadline became in code
    that turned it into an error of its own (a store's or model's client saying
    "connection closed", in a task group of its own too): the run is past its deadline
    all the same."""
    return (
        isinstance(error, Exception)
        and not isinstance(error, DeadlineExceededError)
        and scope.cancel_called
        and anyio.current_time() >= scope.deadline
        and turned_into(error)
    )


async def _open_session(
    agent: Agent, context: RunContext, log: list[Message], seed: list[Message], plan: RunPlan
) -> None:
    """Fill the run's log from its session; a new session is seeded with ``seed``.

    System and developer messages of the seed are not stored (instructions come
    from the class each run), so they are left out of the run too. A stored log with a
    result the view would show under another call is rejected; a tool message that
    answers no call is left out of the view, as ever; a repeated id is read as a
    distinct one (``distinct_ids``).
    """
    assert context.session_id is not None
    where = f"session {context.session_id!r}"
    with naming_session(context.session_id), context._waiting_for_store("loading the session"):
        loaded = await awaitable(agent.session_store.load(context.session_id), "load")
    stored = distinct_ids(loaded, where)
    if stored:
        check_stored(stored, where)
        _check_new(plan.message, stored, where)
        if seed:
            plan.caller.warn(  # one text: shown once per line, as Python's warnings are
                "history= is ignored: the session already holds messages, and the stored log wins"
            )
        log.extend(stored)
        return
    kept = [message for message in seed if not message.is_trusted]
    if len(kept) < len(seed):
        plan.caller.warn(
            "the system and developer messages of history= are left out of the session: "
            "sessions do not store instructions, which come from the agent class each run"
        )
    await context.append(*kept)


async def _loop(
    agent: Agent, context: RunContext, message: Message, output: OutputPlan | None
) -> RunResult[Any]:
    repaired = interrupted_results(context.messages)
    await context.append(*repaired, message)
    context.question = message
    try:
        result = await _turns(agent, context, output)
        _check_answered(context, "as the run ends")
        return result
    except BaseException:
        await _answer_open_calls(context)
        raise


async def _turns(agent: Agent, context: RunContext, output: OutputPlan | None) -> RunResult[Any]:
    context._doing = lambda: "preparing the model (a local model starts its server)"
    await prepare(context.model)
    tool_calls = 0
    repairs = 0
    for turn in range(agent.max_turns):
        context.turn = turn
        context._doing = lambda: "making the turn's request (its instructions among it)"
        request = await _request(agent, context)
        if output is not None:
            request = output.request(request)
        answered = await _call_model(agent, request, context)
        context._doing = lambda: "running the after_model hooks"
        response = await run_chain(
            _hooks(agent, context, "after_model"),
            answered,
            expected=ModelResponse,
            context=context,
            told="after_model",
        )
        response = _fresh(response, context)
        await context.append(response.message)
        await context.emit(ModelCallFinished(answered.usage, response.stop_reason))
        calls = response.message.tool_calls
        unrun: tuple[ToolCall, ...] = ()  # a filtered answer's calls
        if response.stop_reason is StopReason.MAX_TOKENS:  # a tool call in it may be cut too
            await _not_run(
                context, calls, "the answer asking for it stopped at its output limit (max_tokens)"
            )
            raise OutputLimitError(_cut_short(context.last_sent), response=response)
        if calls and response.stop_reason is StopReason.CONTENT_FILTER:
            await _not_run(
                context,
                calls,
                "the provider filtered (or the model refused) the answer asking for it",
            )
            unrun, calls = calls, ()  # the run ends with the answer, as one without calls
        if output is not None and calls and (final := output.final_answer(response.message)):
            call, answer = final
            results = output.final_results(calls, call, answer)
            await context.append(*(_stored_message(agent, result) for result in results))
            if answer.ok:
                return RunResult(
                    answer.value, context.messages, context.usage, response.stop_reason
                )
            repairs = _repair_or_raise(agent, turn, repairs, answer, response)
            continue
        if calls:
            if tool_calls + len(calls) > agent.max_tool_calls:
                await _refuse(agent, calls, context, "max_tool_calls", agent.max_tool_calls)
            if turn == agent.max_turns - 1:
                await _refuse(agent, calls, context, "max_turns", agent.max_turns)
            tool_calls += len(calls)
            await _run_tools(agent, calls, context)
            continue
        if output is None:
            return RunResult(
                response.message.text, context.messages, context.usage, response.stop_reason
            )
        answer = output.check_text(response.message)
        if not output.native and any(call.name == OUTPUT_TOOL for call in unrun):
            why = f"its {OUTPUT_TOOL} call was not run: the provider filtered the answer"
            answer = attrs.evolve(answer, errors=(f"{why} (or the model refused it)",))
        if answer.ok:
            return RunResult(answer.value, context.messages, context.usage, response.stop_reason)
        repairs = _repair_or_raise(agent, turn, repairs, answer, response)
        await context.append(output.repair_message(answer, agent.max_tool_result_tokens))
    raise _limit_exceeded(agent, "max_turns", agent.max_turns)


def _repair_or_raise(
    agent: Agent, turn: int, repairs: int, answer: Answer, response: ModelResponse
) -> int:
    """Count a repair turn for an answer that does not fit; ``OutputValidationError``
    after the one repair turn, when ``max_turns`` leaves no turn for it, or for a filtered
    (or refused) answer, which ends the run."""
    filtered = response.stop_reason is StopReason.CONTENT_FILTER
    if not filtered and repairs < MAX_REPAIRS and turn < agent.max_turns - 1:
        return repairs + 1
    if filtered:
        why = "and was filtered by the provider (or refused by the model)"
    elif repairs >= MAX_REPAIRS:
        why = f"after {MAX_REPAIRS} repair turn"
    else:
        why = f"and max_turns={agent.max_turns} left no turn to repair it"
    raise OutputValidationError(
        f"the model's answer did not fit the output type {why} "
        f"({len(answer.errors)} problem(s); see .errors)",
        raw=answer.raw,
        errors=answer.errors,
        response=response,
    )


async def _not_run(context: RunContext, calls: Sequence[ToolCall], why: str) -> None:
    """Answer ``calls`` with an error result saying why they were not run."""
    text = f"Not run: {why}."
    await context.append(*(Message.tool(call.id, text, is_error=True) for call in calls))


async def _refuse(
    agent: Agent, calls: Sequence[ToolCall], context: RunContext, limit: str, value: int
) -> None:
    """Answer ``calls`` without running them (the log stays whole), then stop the run."""
    await _not_run(context, calls, f"the run reached {limit}={value}")
    raise _limit_exceeded(agent, limit, value)


def _cut_short(request: ModelRequest | None) -> str:
    """What an ``OutputLimitError`` of a run says: the cap the request sent, or that it
    sent none, and what to do."""
    cap = None if request is None else request.max_tokens
    if cap is None:
        return (
            "the model stopped at its output limit before completing its answer: no "
            "max_tokens was sent, so the provider's own limit stopped it (its default cap, "
            "or its context window filled: a small local model may write until it does); "
            "set max_tokens in the agent's settings (higher for a longer answer, lower to "
            "stop a rambling model sooner), or ask for a shorter answer (the error's "
            "response holds what it wrote)"
        )
    return (
        f"the model stopped at its output limit (max_tokens={cap}) before completing its "
        "answer: raise max_tokens in the agent's settings, or ask for a shorter answer "
        "(the error's response holds what it wrote)"
    )


def _limit_exceeded(agent: Agent, limit: str, value: int) -> LimitExceededError:
    """The error of a run stopped at ``limit``, saying what it means and what to do."""
    what = (
        f"the run had no answer after {value} model calls"
        if limit == "max_turns"
        else f"the model asked for more than {value} tool calls in the run"
    )
    return LimitExceededError(
        f"{agent.name} reached {limit}={value}: {what}; if the task needs more, raise "
        f"{limit} (a class attribute or constructor keyword)",
        limit=limit,
        value=value,
    )


async def _request(agent: Agent, context: RunContext) -> ModelRequest:
    instructions: Any = getattr(agent, "instructions", None)
    text: object = instructions
    if callable(instructions):
        with context.grace.hosting():  # runs it starts share the run's grace
            text = instructions(context)
            if inspect.isawaitable(text):
                text = await text
    if text is not None and not isinstance(text, str):
        raise ConfigurationError(
            f"{agent.name}.instructions returned {type(text).__name__}, not a str"
        )
    view = context.view()
    messages = (_instructions(context, text), *view) if text else view
    return ModelRequest(messages, agent.tool_specs, context.settings)


def instructions_message(text: str) -> Message:
    """The system message a request carries for the agent's instructions; the same text
    always gets the same id (of the text well formed, as the message holds it)."""
    text = well_formed(text)
    digest = hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]
    return Message.system(text, id=f"instructions-{digest}")


@define
class _Instructions:
    """The run's newest instructions message and the text it was made of."""

    text: str = ""
    message: Message | None = None


def _instructions(context: RunContext, text: str) -> Message:
    """``instructions_message(text)``, the same object while the run's instructions are
    the same text, so that what the context engine figured for it carries over from turn
    to turn."""
    made = context.state_for(_Instructions, _Instructions)
    if made.message is None or made.text != text:
        made.text, made.message = text, instructions_message(text)
    return made.message


async def _call_model(agent: Agent, given: ModelRequest, context: RunContext) -> ModelResponse:
    """Send ``given`` through the ``before_model`` hooks to the model (a request they
    left with a result or call unpaired is the call's error: ``check_pairing``); on an
    error, retry with the ``after_model_error`` hooks' replacement (at most
    ``MAX_RECOVERIES`` times), which passes through the ``before_model`` hooks again
    without the messages they added and with those they rebuilt as they were
    (``_unhooked``: what a hook injects is not doubled, what it rewrites not lost; a
    bounded view's memories and excerpts stay, for the view rebuilds them: its excerpts
    from the replacement's, its memories from their provider). ``given`` is what the
    hooks were last given. The retry is told (``ModelCallRetried``) as the replacement
    goes out, for the error of the call that went out before it: a request refused
    before it is sent (its pairing, its settings) is no call, nor is one never sent."""
    before = _hooks(agent, context, "before_model")
    hooks = "running the before_model hooks"
    context._doing = lambda: hooks
    built = given.messages  # the run's own view: results paired with their calls
    request = await run_chain(
        before, given, expected=ModelRequest, context=context, told="before_model"
    )
    recoveries = context._turn_retries = 0
    interrupted: Exception | None = None  # the error of the call that went out last
    while True:
        _check_answered(context)
        context._doing = lambda: "waiting for the model's answer"
        try:
            if request.messages is not built:  # as the hooks left it: checked as sent
                check_pairing(request.messages, "the turn's request (as its hooks left it)")
            return await context._call(request, turn=True, retrying=interrupted)
        except CleanupError:
            raise
        except Exception as error:
            if context.last_sent is request:  # it went out (``_call`` refused it not)
                interrupted = error
            if (
                recoveries >= MAX_RECOVERIES
                or cancellation_turned_into(error)
                or _runs_deadline(error, context) is not None
            ):
                raise  # a client's "connection closed" for the run's stop, or the run's
                # deadline (a nested run's own is the model's error): no error to recover
            context._doing = lambda: "running the after_model_error hooks"
            replacement = await run_chain(
                _hooks(agent, context, "after_model_error"),
                request,
                error,
                expected=ModelRequest,
                context=context,
                told="after_model_error",
            )
            if replacement is request:
                raise
            recoveries += 1
            given = _unhooked(given, request, replacement, context)
            context._doing = lambda: hooks
            request = await run_chain(
                before, given, expected=ModelRequest, context=context, told="before_model"
            )


def _check_answered(context: RunContext, when: str = "before the model call") -> None:
    """``ConfigurationError`` if a call appended to the log (by a hook or tool) still has
    no result ``when``: the model call would go out with it unanswered, which providers
    refuse, or the run would end with it so."""
    calls = [call for message in context._ledger.open for call in message.tool_calls]
    if calls:
        named = ", ".join(f"{call.id!r} (tool {call.name!r})" for call in calls)
        raise ConfigurationError(
            f"the log holds tool calls without a result {when}: {named}; a call appended "
            "with context.append() needs its result appended before the next model call "
            "(or the run's end)"
        )


def _unhooked(
    given: ModelRequest, sent: ModelRequest, replacement: ModelRequest, context: RunContext
) -> ModelRequest:
    """``replacement`` (made from ``sent``) without what the ``before_model`` hooks did to
    ``given`` to make ``sent``, for them to do it again: the messages they added left out
    (a copy the replacement changed too: they add it again), and those they rebuilt under
    a new id (as ``Message.user`` makes one) back as they were given, unless the
    replacement changed or dropped the rebuilt copy (one that stands for them alone: a
    note added beside a rebuilt question stands for it too, and which one was rebuilt is
    not known; and for messages of their own, not a view's, which the view makes anew: a
    message added where the view left its excerpts out stands for them). The run's
    question is never lost so: missing, it goes back after what comes before it in
    ``given``."""
    added = _added(given, sent, context)
    if not added:
        return replacement
    stood_for = _stood_for(given, sent, added, context.log_index.layout.hidden)
    sharing = Counter(map(id, stood_for.values()))  # a note beside a rebuilt question: 2
    as_sent = {message.id: message for message in sent.messages}
    shown = {message.id for message in replacement.messages}
    messages: list[Message] = []
    for message in replacement.messages:
        originals = stood_for.get(message.id, [])
        rebuilt = (  # it alone stands for them, and they are not a view's own, made anew
            sharing[id(originals)] == 1 and not all(map(view_only, originals))
        )
        if message.id not in added:
            messages.append(message)
        elif rebuilt and message is not as_sent[message.id]:
            messages.append(message)  # a rebuilt copy the replacement changed: kept as it is
        else:  # what they added or rebuilt beside it, changed or not, they do again
            messages += (m for m in originals if m.id not in shown)
        shown.update(m.id for m in originals)
    return attrs.evolve(replacement, messages=_with_question(messages, given, shown, context))


def _stood_for(
    given: ModelRequest, sent: ModelRequest, added: set[str], hidden: set[str]
) -> dict[str, list[Message]]:
    """The messages of ``given`` the hooks replaced to make ``sent``, by the ids of the
    added messages in their place. Between two messages both hold (or an end), where
    ``sent`` has added ones and ``given`` others: one for one when they match by role, a
    view's own messages aside; all for each, when ``sent`` has only added ones there (a
    note beside a rebuilt question); none otherwise (a summary or a bounded view's
    excerpts there: context management left them out). Messages a compaction record of
    the log hides (``hidden``) were left out, not replaced (an exclusion shows nothing in
    their place). Empty when ``sent`` holds ``given``'s messages in another order."""
    at = {message.id: position for position, message in enumerate(given.messages)}
    stood_for: dict[str, list[Message]] = {}
    gap: list[Message] = []  # ``sent``'s messages since the last one ``given`` holds
    start = 0  # where that gap began in ``given``
    for message in (*sent.messages, None):
        if message is not None and message.id not in at:
            gap.append(message)
            continue
        end = len(given.messages) if message is None else at[message.id]
        if end < start:
            return {}
        originals = [m for m in given.messages[start:end] if m.id not in hidden]
        new = [m for m in gap if not view_only(m)]
        if originals and new and all(m.id in added for m in new):
            if [m.role for m in new] == [m.role for m in originals]:
                stood_for.update((m.id, [o]) for m, o in zip(new, originals, strict=True))
            elif len(new) == len(gap):
                stood_for.update((m.id, originals) for m in new)  # one list, shared
        start, gap = end + 1, []
    return stood_for


def _with_question(
    messages: list[Message], given: ModelRequest, shown: set[str], context: RunContext
) -> tuple[Message, ...]:
    """``messages`` with the run's question, if ``given`` had it and it is not ``shown``
    (there, or a message standing for it): after the last message of ``messages`` that
    comes before it in ``given``."""
    question = context.question
    ids = [message.id for message in given.messages]
    if question is None or question.id not in ids or question.id in shown:
        return tuple(messages)
    asked = ids.index(question.id)
    before = set(ids[:asked])
    place = max((p + 1 for p, m in enumerate(messages) if m.id in before), default=0)
    return (*messages[:place], given.messages[asked], *messages[place:])


def _added(given: ModelRequest, sent: ModelRequest, context: RunContext) -> set[str]:
    """The ids of the messages the ``before_model`` hooks added to ``given`` to make
    ``sent``: in neither ``given`` nor the log (a summary a hook appended to the log stays),
    and not a bounded view's own (``view_only``)."""
    known = {message.id for message in given.messages}
    return {
        message.id
        for message in sent.messages
        if message.id not in known
        and not context.has_message(message.id)
        and not view_only(message)
    }


async def _run_tools(agent: Agent, calls: Sequence[ToolCall], context: RunContext) -> None:
    """Run ``calls`` concurrently; store their results in call order.

    A result is stored as soon as it and every earlier call's result are done, and
    its ``ToolCallFinished`` event follows its storing. If the run stops or a call
    fails meanwhile, no call starts any more, and the calls not stored yet are stored
    all the same (within the cleanup grace), in call order: the finished ones with
    their result (or, stopped in their ``after_tool`` hooks, as withheld), the others
    answered as stopped. Each call whose ``ToolCallStarted`` went out and whose answer
    the log then holds has its ``ToolCallFinished`` held for the consumer
    (``RunContext._hold``, never awaited) if it was not handed over yet.
    """
    answers: list[Message | None] = [None] * len(calls)
    finished = [False] * len(calls)
    late = [False] * len(calls)  # its tool returned past the run's deadline (held it)
    told = [False] * len(calls)  # its ToolCallStarted went out
    handed = [False] * len(calls)  # its ToolCallFinished went out (or was cut and kept)
    start = len(context.messages)
    stored = 0
    storing = anyio.Lock()
    failures: list[BaseException] = []

    async def store_ready() -> None:
        nonlocal stored
        async with storing:
            first = end = stored
            while end < len(answers) and answers[end] is not None:
                end += 1
            ready = [answer for answer in answers[first:end] if answer is not None]
            await context._append(tuple(ready), batch=True)
            stored = end
            for index, answer in enumerate(ready, first):
                handed[index] = True  # a cancellation cutting it keeps it (emit)
                await context.emit(ToolCallFinished(answer.tool_results[0]))

    async def run_one(index: int, call: ToolCall) -> None:
        def telling() -> None:
            told[index] = True

        try:
            await anyio.lowlevel.checkpoint_if_cancelled()  # not once another call failed
            result = await _run_tool(agent, call, calls, context, telling)
            finished[index] = True
            deadline = context.grace.run_deadline
            late[index] = deadline is not None and anyio.current_time() >= deadline
            result = await _after_tool(agent, result, context)
            answers[index] = Message(Role.TOOL, (result,))
            await store_ready()
        except anyio.get_cancelled_exc_class() as error:
            if cancelled_here():
                context.grace.cancel_seen = True  # seen before the run's task (aclose())
                raise  # the run is stopping, or another call failed
            failures.append(error)  # a stray one (from a hook, say): it ends the run
            group.cancel_scope.cancel()
        except BaseException as error:  # a hook's, say, of any kind
            failures.append(error)  # re-raised as itself, never in an exception group
            group.cancel_scope.cancel()

    def running() -> str:  # a name the model made up is not told: it is the model's text
        tools = [  # a tool that returned past the deadline (it shielded its work) held it
            f"tool {brief(call.name)}" if agent.find_tool(call.name) else "an undeclared tool"
            for call, done, past in zip(calls, finished, late, strict=True)
            if past or not done
        ]
        return f"running {', '.join(tools)}" if tools else "running the after_tool hooks"

    context._doing = running
    context._running = frozenset(call.id for call in calls)
    try:
        async with anyio.create_task_group() as group:
            context.grace.tool_calls = group.cancel_scope  # cancelled, the run is ending
            for index, call in enumerate(calls):
                group.start_soon(run_one, index, call)
    finally:
        context.grace.tool_calls = None
        context._running = frozenset()  # the batch's tools are done (none appends any more)
        # Each call's answer is told by its own message, not its call id (ids may repeat);
        # a write cut off by the stop may have put some in the log all the same. The calls
        # not stored yet follow the stored ones: finished ones with their result (or as
        # withheld), the others answered as stopped, in call order.
        answered = [
            answer or Message.tool(call.id, WITHHELD_TEXT if done else STOPPED_TEXT, is_error=True)
            for call, answer, done in zip(calls, answers, finished, strict=True)
        ]
        logged = {message.id for message in context.messages[start:]}
        unstored = [answer for answer in answered if answer.id not in logged]
        try:
            if unstored and not context.grace.uncertain:
                store = context._append(tuple(unstored), batch=True)
                await context.grace.finish("storing the batch's results", store)
        finally:  # a consumer mirroring the log from the events is told what is in it
            logged = {message.id for message in context.messages[start:]}
            context._hold(
                ToolCallFinished(answer.tool_results[0])
                for answer, said, sent in zip(answered, told, handed, strict=True)
                if said and not sent and answer.id in logged
            )
    if failures:
        raise failures[0]


async def _run_tool(
    agent: Agent,
    call: ToolCall,
    batch: Sequence[ToolCall],
    context: RunContext,
    telling: Callable[[], None],
) -> ToolResult:
    """Run ``call`` of the logged ``batch`` (its ``before_tool`` hooks first): the tool's
    result, whole. ``telling`` is called as its ``ToolCallStarted`` goes out."""
    original_id, asked = call.id, call.name
    before = _hooks(agent, context, "before_tool")
    call = await run_chain(before, call, expected=ToolCall, context=context)
    if call.id != original_id:  # a hook's new id: the event pairs with the logged call
        call = attrs.evolve(call, id=original_id)
    telling()
    await context.emit(ToolCallStarted(call))
    found = agent.find_tool(call.name)
    if (
        found is not None
        and call.name == asked
        and _hidden(agent, context, original_id, asked, batch)
    ):
        found = None  # the model called a tool the request did not offer: it does not run
    name = call.name if found is not None else UNDECLARED_TOOL
    if found is None and agent.capture_content:  # the model's text, in the span's name too
        name = telemetry.reported(call.name)
    attributes = {
        telemetry.OPERATION_NAME: "execute_tool",
        telemetry.TOOL_NAME: name,
        telemetry.TOOL_CALL_ID: telemetry.reported(original_id),
        telemetry.TOOL_TYPE: "function",
        **telemetry.run_names(agent.name, context.session_id),
    }
    if found is not None and found[0].description:
        attributes[telemetry.TOOL_DESCRIPTION] = found[0].description
    with telemetry.open_span(
        f"execute_tool {name}",
        attributes=attributes,
        deadline=context.grace.earliest_deadline,
        # a metric never has the model's text, capture_content or not
        measured=None if found is not None else {telemetry.TOOL_NAME: UNDECLARED_TOOL},
    ) as span:
        if agent.capture_content and span.is_recording():
            span.set_attribute(
                telemetry.TOOL_CALL_ARGUMENTS, telemetry.arguments_json(call.arguments)
            )
        result = await _execute(agent, call, found, context, span)
        if agent.capture_content and span.is_recording():
            span.set_attribute(telemetry.TOOL_CALL_RESULT, _stored_result(agent, result.content))
    return result


def _hidden(
    agent: Agent, context: RunContext, call_id: str, name: str, batch: Sequence[ToolCall]
) -> bool:
    """True when the model itself called ``name`` (not a hook's routing) and the turn's
    request did not offer it (a ``before_model`` hook took it out). A logged call is the
    model's by its id or, under an id an ``after_model`` hook gave it, by its name among
    the model's calls whose ids the logged ``batch`` no longer holds."""
    if context.last_exchange is None or name in _offered(agent, context):
        return False
    calls = context.last_exchange[1].message.tool_calls
    if any(call.id == call_id for call in calls):
        return any(call.id == call_id and call.name == name for call in calls)
    logged = {call.id for call in batch}
    return any(call.name == name and call.id not in logged for call in calls)


def _offered(agent: Agent, context: RunContext) -> set[str]:
    """The names of the tools the model was offered: those of the turn's request, as the
    hooks left it (the final-result tool too)."""
    offered = agent.tool_specs if context.last_exchange is None else context.last_exchange[0].tools
    return {spec.name for spec in offered}


async def _after_tool(agent: Agent, result: ToolResult, context: RunContext) -> ToolResult:
    """``result`` through the ``after_tool`` hooks, as the log keeps it (cut to
    ``max_tool_result_tokens``)."""
    replaced: ToolResult = await run_chain(
        _hooks(agent, context, "after_tool"), result, expected=ToolResult, context=context
    )
    return _stored(agent, attrs.evolve(replaced, call_id=result.call_id))


async def _execute(
    agent: Agent,
    call: ToolCall,
    found: tuple[ToolDefinition, Callable[..., Any]] | None,
    context: RunContext,
    span: Any,
) -> ToolResult:
    """Run the tool ``found`` for ``call`` (an error result when the agent has none)."""
    if found is None:
        available = ", ".join(sorted(_offered(agent, context))) or "none"
        telemetry.mark_failed(span, "unknown_tool")
        return error_result(call, f"Unknown tool {brief(call.name)}. Available tools: {available}.")
    definition, function = found
    try:
        kwargs = bind_arguments(definition, call)
    except ToolArgumentError as problem:
        telemetry.mark_failed(span, "invalid_arguments")
        return error_result(call, f"Invalid arguments for tool {call.name!r}: {problem}")
    except BaseException as error:  # a bug in a parameter's class: the tool's own failure
        ending = fatal(error)
        if ending is not None:
            raise ending from None
        return _raised(call, span, error, context)
    if definition.context_parameter is not None:
        kwargs[definition.context_parameter] = context
    limit = definition.timeout
    with (
        context.grace.hosting(),  # outermost: a tool's timeout is over when it looks
        anyio.CancelScope(
            deadline=math.inf if limit is None else anyio.current_time() + limit
        ) as timer,
    ):
        outcome = None
        try:
            with context._calling(definition.name, timer):
                captured = context.capture_content and span.is_recording()
                outcome = await invoke(function, kwargs, definition.name, capture_content=captured)
                text = outcome.text()
        except anyio.get_cancelled_exc_class():
            if cancelled_here():
                raise  # the run is stopping, or the tool's own timeout passed
            return _failed(call, span, telemetry.CANCELLED, "it raised a cancellation exception")
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as error:  # the tool's own failure, of any kind
            ending = fatal(error)
            if ending is not None:
                raise ending from None
            deadline = _runs_deadline(error, context)
            if deadline is error:
                raise
            if deadline is not None:
                raise deadline from deadline.__cause__  # out of the tool's own task group
            await go_on_if_turned(error)  # a client's "connection closed": stopped
            made = outcome if outcome is not None and outcome.raised is error else None
            return _raised(call, span, error, context, made)
        late = anyio.current_time() - timer.deadline
        if limit is None or late <= 0:
            return ToolResult(call.id, text)
        _tools_log.warning(
            "tool %r returned %.1f s past its %g s timeout, which could not stop it (the "
            "event loop was blocked: an async tool that makes a blocking call should be a "
            "plain def, run in a worker thread; or it shielded or swallowed its "
            "cancellation); its late result was discarded",
            call.name,
            late,
            limit,
        )
        what = f"it did not finish within {limit:g} s; its late result was discarded"
        return _failed(call, span, "timeout", what)
    assert timer.cancelled_caught and limit is not None
    if inspect.iscoroutinefunction(function):
        return _failed(
            call, span, "timeout", f"it did not finish within {limit:g} s and was stopped"
        )
    # a sync tool's thread runs on: what it does (a file it writes) may still happen
    what = (
        f"it did not finish within {limit:g} s; it runs on in a thread that cannot be "
        "stopped, so what it does may still happen, and its result will not be seen"
    )
    return _failed(call, span, "timeout", what)


def _runs_deadline(error: BaseException, context: RunContext) -> DeadlineExceededError | None:
    """The ``DeadlineExceededError`` of the run's own deadline, or of a run it serves (a
    side call's retry would pass it, say), that ``error`` is or holds (the exception group
    of a tool's own task group): it ends the run, where a nested run's own deadline is the
    tool's failure."""
    ends = context.grace.deadlines()
    if not ends:
        return None
    for failure in leaves(error):
        if isinstance(failure, DeadlineExceededError) and (
            failure.deadline in ends or anyio.current_time() >= min(ends)
        ):
            return failure
    return None


def _raised(
    call: ToolCall,
    span: Any,
    error: BaseException,
    context: RunContext,
    made: Outcome | None = None,
) -> ToolResult:
    """The failure of a call whose tool (or a parameter's class) raised ``error``: what
    it raised, each exception of a group (its texts as a sync tool's thread ``made``
    them)."""
    if context.capture_content and span.is_recording():  # its message, traceback: content
        recorded = None if made is None else made.recorded
        span.add_event(
            "exception", telemetry.exception_event(error) if recorded is None else recorded
        )
    told = raised_text(error) if made is None or made.rendered is None else made.rendered
    failures = leaves(error)
    return _failed(call, span, failures[0] if len(failures) == 1 else error, told)


def _failed(call: ToolCall, span: Any, error: BaseException | str, what: str) -> ToolResult:
    telemetry.mark_failed(span, error)
    return error_result(call, f"Tool {call.name!r} failed: {what}")


def _stored(agent: Agent, result: ToolResult) -> ToolResult:
    """``result`` as the log keeps it (``_stored_result``)."""
    content = _stored_result(agent, result.content)
    return result if content is result.content else attrs.evolve(result, content=content)


def _stored_message(agent: Agent, message: Message) -> Message:
    """A tool message the library wrote, its result as the log keeps it."""
    (result,) = message.tool_results
    return attrs.evolve(message, content=(_stored(agent, result),))


def _stored_result(agent: Agent, text: str) -> str:
    """Without context management the log holds the cut result; with it, the whole
    result (views cut what the model sees)."""
    if agent.context_management is not None:
        return text
    return truncate_middle(text, agent.max_tool_result_tokens)


async def _answer_open_calls(context: RunContext) -> None:
    """Answer, in the log, the tool calls a stopping run leaves open (so the log can be
    passed back as history). Skipped when a write was cut off with its outcome unknown:
    the store may hold more than the log, and the next run repairs from the store."""
    if context.grace.uncertain:
        return
    open_calls = interrupted_results(context.messages, STOPPED_TEXT)
    if open_calls:
        await context.grace.finish("answering the open tool calls", context.append(*open_calls))


def _hooks(agent: Agent, context: RunContext, kind: str) -> tuple[BoundHook, ...]:
    """The run's hooks of ``kind``: the agent's when the run first asked for them (a
    capability added during the run takes effect from the next run)."""
    return context.state_for(_hooks, lambda: agent.hooks)[kind]


def _fresh(response: ModelResponse, context: RunContext) -> ModelResponse:
    """``response`` with a new message id when the log holds its message's id already (a
    model or hook that hands back an earlier response): the log never holds one id twice."""
    message = response.message
    if context.has_message(message.id):
        return attrs.evolve(response, message=attrs.evolve(message, id=new_id()))
    return response


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
            article = "an" if value.role is Role.ASSISTANT else "a"
            raise TypeError(
                f"input must be a user message (a str, or Message.user(...)), not {article} "
                f"{value.role} message (earlier messages go in history=)"
            )
        check_parts((value,), lambda _: "input")
        if any(empty_image(part) for part in value.content):
            raise ConfigurationError(
                "input: an ImagePart holds no image (data=b'', or a data: URL with nothing "
                "after its comma), which providers refuse: give the image's bytes, or leave "
                "the part out"
            )
        if any(_schemeless(part) for part in value.content):
            raise ConfigurationError(
                "input: an ImagePart's url has no scheme (https://..., data:...): the image "
                "of a file goes in data=, as ImagePart(data=Path(file).read_bytes())"
            )
        return value
    raise TypeError(f"input must be a str or a user Message, not {type(value).__name__}")


_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]+:")
"""How a URL begins (``https:``, ``data:``; two characters or more: ``C:`` is a drive); a
file's path does not."""


def _schemeless(part: object) -> bool:
    """Whether ``part`` is an image whose url is no URL (``parcel.jpg``), which no
    provider can fetch."""
    return isinstance(part, ImagePart) and part.url is not None and not _SCHEME.match(part.url)


def _history(value: object) -> list[Message]:
    return [] if value is None else check_history(value, "history", keep=False)


WALL_CLOCK_SECONDS = 1e9
"""A deadline at least this far (31 years) past the clock's current time is
``time.time()``-based: anyio's clocks count from about the machine's boot, unless the loop
has a clock of its own (a test's frozen time, a custom trio clock)."""


def _check_timing(timeout: object, deadline: object) -> None:
    """Check ``timeout`` and ``deadline`` (no event loop needed)."""
    if timeout is not None and not (timeout == math.inf or (is_number(timeout) and timeout >= 0)):
        raise TypeError(f"timeout must be seconds >= 0, not {safe_repr(timeout)}")
    if deadline is not None and not (is_number(deadline) or deadline in (math.inf, -math.inf)):
        raise TypeError(
            f"deadline must be an anyio clock time (a float), not {safe_repr(deadline)}"
        )
    if deadline is not None and WALL_CLOCK_SECONDS <= deadline - _now() < math.inf:
        raise ConfigurationError(
            f"deadline {deadline!r} is a wall-clock time (time.time()), decades away on "
            "anyio's clock: give anyio.current_time() + seconds (time.monotonic() + seconds "
            "for run_sync(), whose loop is asyncio's), or timeout=seconds"
        )


def _now() -> float:
    """The current time on the running loop's clock; without a loop, on that of
    ``run_sync()``'s (asyncio's: ``time.monotonic()``)."""
    try:
        return anyio.current_time()
    except RuntimeError:  # no event loop in this thread
        return time.monotonic()


def _deadline(timeout: float | None, deadline: float | None) -> float:
    """The run's absolute deadline, from the checked ``timeout`` and ``deadline``."""
    end = math.inf if timeout is None else anyio.current_time() + timeout
    return end if deadline is None else min(end, float(deadline))
