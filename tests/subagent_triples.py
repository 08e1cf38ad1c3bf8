"""A harness of features met three at a time around a sub-agent: a parent agent whose
tool runs another agent (an agent used as a tool), as a team's workflow agent does.

``DIMENSIONS`` are what the two agents combine: how the parent runs (``run()``,
``stream()``, ``run_sync()``) and how its tool runs the sub-agent (``run()``,
``stream()``, ``run_sync()`` in a worker thread); ``@manage_context`` on the parent and
on the sub-agent (summaries, a bounded view); the sub-agent's typed output (native or
``final_result``), its session (none, in memory, a custom store), hooks on both agents;
a fault in the sub-agent (its summary call, its session write or its model call stalls,
its model rate-limits it for a short or a long wait, refuses a request as over the
window, answers a misfit first, or every call and write of both agents takes a random
time); and a stop (the parent's deadline, the caller's cancel scope, the parent's stream
consumer leaving while the sub-agent works, the sub-agent's own deadline, the tool's
``timeout``). ``cases()`` draws, seeded, a set of cases holding every allowed triple of
values of three dimensions; each runs on a virtual clock (``run_sync()`` on the real one,
with stops of 0.1 s).

Both agents keep sessions with a long stored history, so each compacts as it starts
(the sub-agent's summary call is where a stall or a stop lands). ``problems(case)``
lists what broke of the invariants:

- what escaped is what the stop documents: the parent's ``DeadlineExceededError`` (its
  own deadline, the provider error as cause when a retry wait that would pass it was
  refused), nothing but the caller's cancellation (caught by its scope, never replaced),
  or the parent's answer (the sub-agent's deadline, a tool's timeout and an overflow the
  sub-agent cannot recover from are the tool's error result);
- every log whole: the parent's and the sub-agent's stored logs valid (no id twice, no
  result before its call, records cover what is before them), every call answered once
  after a fault-free next run of each session, each run's messages the start of its
  stored log;
- the sub-agent's answer (typed: the type's value) is the tool's result;
- spans: none left open; the sub-agent's ``invoke_agent`` under the parent's
  ``execute_tool delegate``, each agent's ``chat`` spans under its own run; a
  compaction's span event on the run that compacted; each ``invoke_agent`` span's input
  tokens what its own model billed (the sub-agent's usage never in the parent's), and the
  parent's ``result.usage`` (or its ``DeadlineExceededError``'s ``run_usage``) too;
  the statuses the stop documents, a cut call's ``chat`` span's too;
- metrics: each model's input tokens counted once, each run's duration point with the
  error type (or ``cancelled``) its stop documents;
- the parent's ``stream()`` events are its own: one ``ModelCallFinished`` per parent
  answer, the compactions its run traced, no sub-agent retry, usages adding up to the
  result's;
- the hooks of each agent saw the requests of its own model alone.
"""

from __future__ import annotations

import functools
import itertools
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import anyio
import anyio.to_thread
import attrs
from attrs import define, field, frozen
from opentelemetry.sdk.trace import ReadableSpan

from littleghost import (
    Agent,
    Message,
    RunContext,
    ToolCall,
    after_model,
    after_tool,
    before_model,
    manage_context,
    tool,
)
from littleghost.context import PromptBudget
from littleghost.context.records import is_record
from littleghost.errors import ContextWindowOverflowError, DeadlineExceededError, RateLimitError
from littleghost.events import (
    CompactionFinished,
    Event,
    ModelCallFinished,
    ModelCallRetried,
    RunFinished,
    SideCallFinished,
    ToolCallStarted,
)
from littleghost.models import ModelRequest, ModelResponse, StopReason, Usage
from littleghost.sessions import InMemorySessionStore, SessionStore
from littleghost.telemetry import COMPACTION_EVENT, COMPACTION_OUTCOME, COMPACTION_REASON
from littleghost.testing import ScriptedModel
from tests.clocks import virtual
from tests.conftest import Histograms, Spans
from tests.faults import log_problems, request_problems, unanswered
from tests.stores import PlainStore

DIMENSIONS: dict[str, tuple[Any, ...]] = {
    "parent_mode": ("run", "stream", "run_sync"),
    "child_mode": ("run", "stream", "run_sync"),
    "parent_context": ("off", "summaries"),
    "child_context": ("off", "summaries", "budget"),
    "child_output": ("text", "native", "tool"),
    "child_session": ("none", "memory", "plain"),
    "hooks": ("none", "both"),
    "fault": (
        "none",
        "summary_stall",
        "write_stall",
        "model_stall",
        "retry",
        "retry_long",
        "overflow",
        "misfit",
        "slow",
    ),
    "stop": (
        "none",
        "parent_deadline",
        "caller_cancel",
        "consumer_leaves",
        "child_deadline",
        "tool_timeout",
    ),
}
"""What the harness combines, with its values."""
STALLS = ("summary_stall", "write_stall", "model_stall")
SEED = 20261207
WINDOW = 1_200
STALL = 1_000.0
"""A stall's seconds: far past every stop."""
GRACE = 0.1


def allowed(case: Mapping[str, Any]) -> bool:
    """Whether a (partial) case can run: a stall needs a stop, a summary stall a summarizing
    sub-agent, a write stall its session; ``run_sync()`` has no caller's scope and runs on
    the real clock (no long retry wait)."""
    fault, stop, mode = case.get("fault"), case.get("stop"), case.get("parent_mode")
    if fault in STALLS and stop == "none":
        return False
    if fault == "summary_stall" and case.get("child_context") not in (None, "summaries"):
        return False
    if fault == "write_stall" and case.get("child_session") == "none":
        return False
    if fault == "misfit" and case.get("child_output") == "text":
        return False
    if fault == "slow" and "run_sync" in (mode, case.get("child_mode")):
        return False  # real seconds
    if mode == "run_sync" and (stop == "caller_cancel" or fault == "retry_long"):
        return False
    if stop == "consumer_leaves" and mode not in (None, "stream"):
        return False
    if case.get("child_mode") == "run_sync":
        if fault in (*STALLS, "retry_long"):
            return False  # its own event loop, which the parent's stop does not reach
        if stop in ("parent_deadline", "caller_cancel", "tool_timeout") and mode != "run_sync":
            return False  # a virtual clock jumps while its thread works
    return not (fault == "retry_long" and stop == "none")


def _triples(case: Mapping[str, Any]) -> set[tuple[tuple[str, Any], ...]]:
    return {
        tuple((name, case[name]) for name in names)
        for names in itertools.combinations(sorted(case), 3)
    }


def wanted_triples() -> set[tuple[tuple[str, Any], ...]]:
    """Every triple of values of three dimensions that ``allowed`` admits."""
    wanted = set()
    for names in itertools.combinations(sorted(DIMENSIONS), 3):
        for values in itertools.product(*(DIMENSIONS[name] for name in names)):
            partial = dict(zip(names, values, strict=True))
            if allowed(partial):
                wanted.add(tuple(partial.items()))
    return wanted


def cases(seed: int = SEED, tries: int = 40) -> list[dict[str, Any]]:
    """Cases holding every allowed triple, drawn greedily: each the best of ``tries``
    random allowed cases that start from a triple not yet held."""
    rng = random.Random(seed)
    wanted = wanted_triples()
    chosen: list[dict[str, Any]] = []
    while wanted:
        start = dict(sorted(wanted)[rng.randrange(len(wanted))])
        best: tuple[int, dict[str, Any]] | None = None
        for _ in range(tries):
            case = dict(start)
            for name in rng.sample(sorted(DIMENSIONS), len(DIMENSIONS)):
                if name not in case:
                    options = [v for v in DIMENSIONS[name] if allowed({**case, name: v})]
                    case[name] = rng.choice(options)
            if not allowed(case):
                continue
            gain = len(_triples(case) & wanted)
            if best is None or gain > best[0]:
                best = (gain, case)
        assert best is not None
        chosen.append(best[1])
        wanted -= _triples(best[1])
    for number, case in enumerate(chosen):
        case["backend"] = ("asyncio", "trio")[number % 2]
        case["seed"] = rng.randrange(2**32)
    return chosen


@frozen
class Ticket:
    """The sub-agent's typed answer."""

    depot: str
    ok: bool


TICKET = Ticket("D-7", True)
SUMMARY = "- Earlier: the user asked about depots and orders."


def history(who: str, turns: int = 14) -> list[Message]:
    """A stored conversation long enough to compact at the window, with a tool exchange."""
    messages: list[Message] = []
    for turn in range(turns):
        messages.append(Message.user(f"{who} earlier question {turn} about order {turn}? " * 3))
        messages.append(Message.assistant(f"{who} earlier answer {turn}: all is fine. " * 3))
    call = ToolCall(f"{who}-h1", "lookup", {"key": "h1"})
    messages += [
        Message.user("And h1?"),
        Message.assistant(tool_calls=(call,)),
        Message.tool(call.id, "h1 is in the depot"),
        Message.assistant("h1 is in the depot."),
    ]
    return messages


def billed(request: ModelRequest) -> Usage:
    """What the scripted provider bills for a request: a figure of its size."""
    return Usage(10 * len(request.messages) + 7, 3)


@define
class Director:
    """Plays one agent's provider: summary calls, chat calls from a script, faults."""

    who: str
    script: Callable[[int, ModelRequest], ModelResponse]
    stall_summary: bool = False
    stall_chat: bool = False
    slow: random.Random | None = None
    """Draws the virtual seconds each call takes (``fault="slow"``)."""
    overflows: int = 0
    """How many chat calls to refuse as over the window first."""
    rate_limits: list[float] = field(factory=list)
    """The ``retry_after`` of each rate limit to raise before the first chat answer."""
    chats: list[ModelRequest] = field(factory=list)
    summaries: list[ModelRequest] = field(factory=list)
    usage: Usage = field(factory=Usage)
    """What it billed (answered calls only: a stalled or refused call reports nothing)."""
    requests: list[str] = field(factory=list)
    """Every request's problems as a provider would find them."""

    async def __call__(self, request: ModelRequest) -> ModelResponse:
        self.requests += request_problems(request.messages)
        if self.slow is not None:
            await anyio.sleep(self.slow.uniform(0.5, 3.0))
        if request.purpose == "context_compaction":
            self.summaries.append(request)
            if self.stall_summary:
                await anyio.sleep(STALL)
            used = billed(request)
            self.usage += used
            return ModelResponse(Message.assistant(SUMMARY), StopReason.END_TURN, used)
        if self.rate_limits:
            raise RateLimitError("slow down", retry_after=self.rate_limits.pop(0))
        if self.overflows:
            self.overflows -= 1
            size = billed(request).input_tokens * 10
            raise ContextWindowOverflowError(
                "prompt is too long", provider="scripted", prompt_tokens=size, context_window=WINDOW
            )
        if self.stall_chat:
            await anyio.sleep(STALL)
        self.chats.append(request)
        response = self.script(len(self.chats) - 1, request)
        used = billed(request)
        self.usage += used
        return attrs.evolve(response, usage=used)

    def model(self) -> ScriptedModel:
        return ScriptedModel([self] * 50, name=f"{self.who}-model", context_window=WINDOW)


PARENT_ANSWER = "The depot is checked."


def parent_script(step: int, request: ModelRequest) -> ModelResponse:
    """The parent: a delegate call beside a lookup, then its answer."""
    if step == 0:
        calls = (
            ToolCall("p-delegate", "delegate", {"task": "check depot D-7"}),
            ToolCall("p-lookup", "lookup", {"key": "k1"}),
        )
        return ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE)
    return ModelResponse(Message.assistant(PARENT_ANSWER), StopReason.END_TURN)


def child_script(output: str, misfit: bool) -> Callable[[int, ModelRequest], ModelResponse]:
    """The sub-agent: one answer of its output kind (after one that misfits)."""

    def answer(step: int, request: ModelRequest) -> ModelResponse:
        if misfit and step == 0:
            if output == "tool":
                call = ToolCall("c-misfit", "final_result", {"depot": "D-7"})
                return ModelResponse(Message.assistant(tool_calls=(call,)), StopReason.TOOL_USE)
            return ModelResponse(Message.assistant('{"depot": 7}'), StopReason.END_TURN)
        if output == "tool":
            call = ToolCall(f"c-final-{step}", "final_result", attrs.asdict(TICKET))
            return ModelResponse(Message.assistant(tool_calls=(call,)), StopReason.TOOL_USE)
        text = json.dumps(attrs.asdict(TICKET)) if output == "native" else "Depot D-7 is fine."
        return ModelResponse(Message.assistant(text), StopReason.END_TURN)

    return answer


class Stalling:
    """A store mixin: the ``stall_at``-th append (from 0) stalls; with ``slow``, every
    append takes a random while."""

    def __init__(self, stall_at: int | None = None, slow: random.Random | None = None) -> None:
        super().__init__()
        self.stall_at = stall_at
        self.slow = slow
        self.appends = 0

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        number = self.appends
        self.appends += 1
        if number == self.stall_at:
            await anyio.sleep(STALL)
        if self.slow is not None:
            await anyio.sleep(self.slow.uniform(0.1, 2.0))
        await super().append(session_id, messages)  # type: ignore[misc]


class StallingStore(Stalling, InMemorySessionStore):
    """An in-memory store that stalls."""


class StallingPlain(Stalling, PlainStore):
    """``PlainStore`` that stalls."""


@define
class World:
    """One case's agents, models, stores and what they saw."""

    case: Mapping[str, Any]
    rng: random.Random
    parent: Director
    child: Director
    parent_store: InMemorySessionStore
    child_store: SessionStore | None
    child_results: list[Any] = field(factory=list)
    child_errors: list[BaseException] = field(factory=list)
    hooked: dict[str, list[str]] = field(factory=lambda: {"parent": [], "child": []})
    stop_after: float = 30.0
    """Seconds (virtual, or real under ``run_sync()``) before the stop."""


def _context(kind: str) -> dict[str, Any] | None:
    if kind == "off":
        return None
    options: dict[str, Any] = {
        "context_window_override": WINDOW,
        "preserve_recent_messages": 4,
        "compression_threshold": 0.5,
    }
    if kind == "budget":
        options["budget"] = PromptBudget(
            prompt_budget_tokens=700, response_reserve_tokens=64, safety_reserve_tokens=64
        )
    return options


def _child_class(world: World) -> type[Agent]:
    case = world.case
    members: dict[str, Any] = {"instructions": "You check depots.", "cleanup_grace": GRACE}
    if case["child_output"] != "text":
        members["output_type"] = Ticket
        members["output_strategy"] = case["child_output"]
    if case["fault"] in ("retry", "retry_long"):
        members["max_retries"] = 2
    if case["hooks"] == "both":

        def seen(self: Any, request: ModelRequest, *, context: RunContext) -> None:
            world.hooked["child"].append(context.model.name)

        def mark(self: Any, response: ModelResponse) -> ModelResponse:
            message = attrs.evolve(response.message, metadata={"by": "child"})
            return attrs.evolve(response, message=message)

        members.update(seen=before_model(seen), mark=after_model(mark))
    cls = type("Child", (Agent,), members)
    options = _context(case["child_context"])
    return cls if options is None else manage_context(**options)(cls)


CHILD_SESSION = "child-1"
PARENT_SESSION = "parent-1"


async def _run_child(world: World, task: str) -> Any:
    case = world.case
    given: dict[str, Any] = {"model": world.child.model()}
    options: dict[str, Any] = {}
    if world.child_store is None:
        options["history"] = history("child")
    else:
        given["session_store"] = world.child_store
        options["session_id"] = CHILD_SESSION
    agent = _child_class(world)(**given)
    if case["stop"] == "child_deadline":
        options["timeout"] = world.stop_after
    try:
        if case["child_mode"] == "run_sync":
            result = await anyio.to_thread.run_sync(
                functools.partial(agent.run_sync, task, **options)
            )
        elif case["child_mode"] == "run":
            result = await agent.run(task, **options)
        else:
            async with agent.stream(task, **options) as events:
                async for _ in events:
                    pass
            result = events.result
    except BaseException as error:
        world.child_errors.append(error)
        raise
    world.child_results.append(result)
    return result.output


def _parent_class(world: World) -> type[Agent]:
    case = world.case
    timeout = world.stop_after if case["stop"] == "tool_timeout" else None

    async def delegate(self: Any, task: str) -> Any:
        """Hand a task to the depot checker."""
        return await _run_child(world, task)

    async def lookup(self: Any, key: str) -> str:
        """Look a parcel up."""
        await anyio.lowlevel.checkpoint()
        return f"{key} is in transit"

    members: dict[str, Any] = {
        "instructions": "You run the depot team.",
        "cleanup_grace": GRACE,
        "max_retries": 0,
        "delegate": tool(timeout=timeout)(delegate),
        "lookup": tool(lookup),
    }
    if case["hooks"] == "both":

        def seen(self: Any, request: ModelRequest, *, context: RunContext) -> None:
            world.hooked["parent"].append(context.model.name)

        def stamp(self: Any, result: Any) -> Any:
            return attrs.evolve(result, content=f"{result.content} [parent]")

        members.update(seen=before_model(seen), stamp=after_tool(stamp))
    cls = type("Parent", (Agent,), members)
    options = _context(case["parent_context"])
    return cls if options is None else manage_context(**options)(cls)


def make_world(case: Mapping[str, Any]) -> World:
    rng = random.Random(case["seed"])
    fault = case["fault"]
    child = Director(
        "child",
        child_script(case["child_output"], fault == "misfit"),
        stall_summary=fault == "summary_stall",
        stall_chat=fault == "model_stall",
    )
    if fault == "retry":
        child.rate_limits = [rng.choice((0.05, 0.2))]
    elif fault == "retry_long":
        child.rate_limits = [60.0]  # past every stop: the wait is refused or cut
    elif fault == "overflow":
        child.overflows = 1
    parent = Director("parent", parent_script)
    slow = random.Random(rng.random()) if fault == "slow" else None
    child.slow = parent.slow = slow
    # the question's write, a compaction record's or the answer's (a write past the run's
    # writes never stalls: the sub-agent then ends as if none did)
    writes = 3 if case["child_context"] == "summaries" else 2
    stall_at = rng.randrange(writes) if fault == "write_stall" else None
    child_store: SessionStore | None = None
    if case["child_session"] == "memory":
        child_store = StallingStore(stall_at, slow)
    elif case["child_session"] == "plain":
        child_store = StallingPlain(stall_at, slow)
    world = World(case, rng, parent, child, StallingStore(None, slow), child_store)
    if slow is not None:  # a stop anywhere in the runs
        world.stop_after = rng.uniform(0.5, 20.0)
    if case["parent_mode"] == "run_sync":  # real seconds: a stall's stop, past a retry's wait
        world.stop_after = 0.1 if fault in STALLS else 3.0
    return world


async def _seed(world: World) -> None:
    await world.parent_store.append(PARENT_SESSION, history("parent"))
    if world.child_store is not None:
        await world.child_store.append(CHILD_SESSION, history("child"))
        if isinstance(world.child_store, Stalling):
            world.child_store.appends = 0


@define
class Outcome:
    """What the parent's run gave."""

    result: Any = None
    error: BaseException | None = None
    cancelled: bool = False
    events: list[Event] = field(factory=list)


async def _parent_run(world: World, agent: Agent, outcome: Outcome) -> None:
    case = world.case
    options: dict[str, Any] = {"session_id": PARENT_SESSION}
    if case["stop"] == "parent_deadline":
        options["timeout"] = world.stop_after
    with anyio.CancelScope() as scope:
        if case["stop"] == "caller_cancel":
            scope.deadline = anyio.current_time() + world.stop_after
        try:
            if case["parent_mode"] == "stream":
                async with agent.stream("Check depot D-7.", **options) as events:
                    async for event in events:
                        outcome.events.append(event)
                        if case["stop"] == "consumer_leaves" and _delegating(event):
                            await anyio.sleep(world.stop_after)  # the sub-agent at work
                            outcome.cancelled = True
                            return
                outcome.result = events.result
            else:
                outcome.result = await agent.run("Check depot D-7.", **options)
        except Exception as error:
            outcome.error = error
    outcome.cancelled = scope.cancelled_caught


def _delegating(event: Event) -> bool:
    return isinstance(event, ToolCallStarted) and event.call.name == "delegate"


def _run(case: Mapping[str, Any], function: Callable[..., Any], *args: Any) -> Any:
    backend, options = virtual(case["backend"])
    return anyio.run(function, *args, backend=backend, backend_options=options)


def converse(case: Mapping[str, Any]) -> tuple[World, Outcome]:
    """Run the case's parent once (the sub-agent in its tool)."""
    world = make_world(case)
    _run(case, _seed, world)
    agent = _parent_class(world)(model=world.parent.model(), session_store=world.parent_store)
    outcome = Outcome()
    if case["parent_mode"] == "run_sync":
        options: dict[str, Any] = {"session_id": PARENT_SESSION}
        if case["stop"] == "parent_deadline":
            options["timeout"] = world.stop_after
        try:
            outcome.result = agent.run_sync("Check depot D-7.", **options)
        except Exception as error:
            outcome.error = error
    else:
        _run(case, _parent_run, world, agent, outcome)
    return world, outcome


def expected_ends(case: Mapping[str, Any]) -> set[str]:
    """How the parent's run may end: ``answer``, ``deadline`` or ``cancelled`` (a stop at
    a random time may come once the run is over)."""
    end = expected_end(case)
    late = case["fault"] == "slow" and case["stop"] != "consumer_leaves"
    return {end, "answer"} if late else {end}


def observed_end(outcome: Outcome) -> str:
    if isinstance(outcome.error, DeadlineExceededError):
        return "deadline"
    return "cancelled" if outcome.cancelled else "answer"


def expected_end(case: Mapping[str, Any]) -> str:
    """How the parent's run ends: ``answer``, ``deadline`` or ``cancelled``."""
    fault, stop = case["fault"], case["stop"]
    if stop == "consumer_leaves":
        return "cancelled"
    if fault == "slow" and stop in ("parent_deadline", "caller_cancel"):
        return {"parent_deadline": "deadline", "caller_cancel": "cancelled"}[stop]
    if fault not in (*STALLS, "retry_long") or stop in ("child_deadline", "tool_timeout"):
        return "answer"
    return {
        "parent_deadline": "deadline",
        "caller_cancel": "cancelled",
        "consumer_leaves": "cancelled",
    }[stop]


def _delegate_result(log: Sequence[Message]) -> Any:
    found = [r for m in log for r in m.tool_results if r.call_id == "p-delegate"]
    return found[0] if found else None


def _outcome_problems(case: Mapping[str, Any], world: World, outcome: Outcome) -> list[str]:
    problems: list[str] = []
    end = observed_end(outcome)
    if end not in expected_ends(case):
        end = expected_end(case)  # reported below
    error = outcome.error
    if end == "answer":
        if error is not None or outcome.cancelled:
            problems.append(f"raised {error!r} (cancelled: {outcome.cancelled}), not the answer")
        elif outcome.result.output != PARENT_ANSWER:
            problems.append(f"answered {outcome.result.output!r}")
    elif end == "deadline":
        if not isinstance(error, DeadlineExceededError):
            problems.append(f"raised {error!r} (cancelled: {outcome.cancelled}), not its deadline")
        elif error.run_usage != world.parent.usage:
            problems.append(f"run_usage {error.run_usage} for {world.parent.usage} billed")
        elif case["fault"] == "retry_long" and not isinstance(error.__cause__, RateLimitError):
            problems.append(f"the refused retry wait's cause is {error.__cause__!r}")
    elif error is not None or not outcome.cancelled:
        problems.append(f"the caller's cancellation became {error!r}")
    result = _delegate_result(_run(case, _load, world.parent_store, PARENT_SESSION))
    if end == "answer" and result is not None:
        stopped = case["fault"] in (*STALLS, "retry_long")
        stopped |= case["fault"] == "overflow" and case["child_context"] == "off"
        stopped |= case["fault"] == "slow" and not world.child_results
        if stopped != result.is_error:
            problems.append(f"the delegate call's result is {result.content!r}")
        if not stopped:
            wanted = TICKET if case["child_output"] != "text" else "Depot D-7 is fine."
            outputs = [r.output for r in world.child_results]
            if outputs != [wanted]:
                problems.append(f"the sub-agent answered {outputs}")
    return problems


async def _load(store: SessionStore, session_id: str) -> tuple[Message, ...]:
    return await store.load(session_id)


def _log_problems(case: Mapping[str, Any], world: World, outcome: Outcome) -> list[str]:
    problems = []
    parent_log = _run(case, _load, world.parent_store, PARENT_SESSION)
    problems += [f"parent log: {p}" for p in log_problems(parent_log)]
    if outcome.result is not None:
        mine = [m.id for m in outcome.result.messages]
        if [m.id for m in parent_log[: len(mine)]] != mine:
            problems.append("parent log: the run's messages are not the stored log's start")
    if world.child_store is not None:
        child_log = _run(case, _load, world.child_store, CHILD_SESSION)
        problems += [f"child log: {p}" for p in log_problems(child_log)]
        for result in world.child_results:
            mine = [m.id for m in result.messages]
            if [m.id for m in child_log[: len(mine)]] != mine:
                problems.append("child log: the run's messages are not the stored log's start")
    for result in world.child_results:
        problems += [f"child result: {p}" for p in log_problems(result.messages)]
        if unanswered(result.messages):
            problems.append(f"child result: calls unanswered {unanswered(result.messages)}")
    problems += [f"parent request: {p}" for p in world.parent.requests]
    problems += [f"child request: {p}" for p in world.child.requests]
    return problems


def _plain_answer(text: str, step: int, request: ModelRequest) -> ModelResponse:
    return ModelResponse(Message.assistant(text), StopReason.END_TURN)


def _next_runs_problems(case: Mapping[str, Any], world: World) -> list[str]:
    """A fault-free next run of each session answers every call left open."""
    problems = []
    for who, store, session in (
        ("parent", world.parent_store, PARENT_SESSION),
        ("child", world.child_store, CHILD_SESSION),
    ):
        if store is None:
            continue
        answer = (
            json.dumps(attrs.asdict(TICKET))
            if who == "child" and case["child_output"] != "text"
            else "Fine."
        )
        plain = Director(who, functools.partial(_plain_answer, answer))
        members: dict[str, Any] = {"max_retries": 0}
        if who == "child" and case["child_output"] != "text":
            members.update(output_type=Ticket, output_strategy="native")
        cls = type(f"Next{who}", (Agent,), members)
        options = _context(case[f"{who}_context"])
        cls = cls if options is None else manage_context(**options)(cls)
        agent = cls(model=plain.model(), session_store=store)

        async def again(agent: Agent = agent, session: str = session) -> Any:
            return await agent.run("And now?", session_id=session)

        try:
            _run(case, again)
        except Exception as error:
            problems.append(f"{who}'s next run raised {error!r}")
            continue
        log = _run(case, _load, store, session)
        if unanswered(log):
            problems.append(f"{who} log after a next run: calls unanswered {unanswered(log)}")
        problems += [f"{who} log after a next run: {p}" for p in log_problems(log)]
        problems += [f"{who}'s next run's request: {p}" for p in plain.requests]
    return problems


def run_of(span: ReadableSpan, by_id: Mapping[int, ReadableSpan]) -> ReadableSpan | None:
    """The ``invoke_agent`` span ``span`` belongs to: its nearest such ancestor."""
    parent = by_id.get(span.parent.span_id) if span.parent else None
    while parent is not None and not parent.name.startswith("invoke_agent"):
        parent = by_id.get(parent.parent.span_id) if parent.parent else None
    return parent


def _input_tokens(span: ReadableSpan) -> int:
    tokens = (span.attributes or {}).get("gen_ai.usage.input_tokens", 0)
    assert isinstance(tokens, int)
    return tokens


def _status(span: ReadableSpan) -> tuple[str, Any]:
    return span.status.status_code.name, (span.attributes or {}).get("error.type")


def _span_problems(
    case: Mapping[str, Any], world: World, outcome: Outcome, spans: Sequence[ReadableSpan]
) -> list[str]:
    problems: list[str] = []
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    parents = [s for s in spans if s.name == "invoke_agent Parent"]
    children = [s for s in spans if s.name == "invoke_agent Child"]
    if len(parents) != 1:
        return [f"spans: {len(parents)} parent runs"]
    parent = parents[0]
    delegates = [s for s in spans if s.name == "execute_tool delegate"]
    if len(children) > 1 or len(delegates) > 1:
        problems.append(f"spans: {len(children)} sub-agent runs, {len(delegates)} delegate calls")
    for child in children:
        above = by_id.get(child.parent.span_id) if child.parent else None
        if (
            above is None
            or above.name != "execute_tool delegate"
            or run_of(above, by_id) is not parent
        ):
            problems.append("spans: the sub-agent's run is not under the parent's delegate call")
    for who, director, runs in (
        ("parent", world.parent, [parent]),
        ("child", world.child, children),
    ):
        chats = [s for s in spans if s.name == f"chat {who}-model"]
        wrong = [s for s in chats if run_of(s, by_id) not in runs]
        if wrong:
            problems.append(f"spans: {len(wrong)} chat spans of the {who} under another run")
        for run in runs:
            tokens = (run.attributes or {}).get("gen_ai.usage.input_tokens", 0)
            mine = sum(_input_tokens(s) for s in chats)
            if tokens != director.usage.input_tokens or mine != tokens:
                problems.append(
                    f"spans: the {who}'s run says {tokens} input tokens, its chat spans "
                    f"{mine}, its model billed {director.usage.input_tokens}"
                )
            completed = [
                e
                for e in run.events
                if e.name == COMPACTION_EVENT
                and (e.attributes or {}).get(COMPACTION_OUTCOME) == "completed"
            ]
            attempted = [e for e in run.events if e.name == COMPACTION_EVENT]
            if who == "parent" and case["parent_context"] == "off" and attempted:
                problems.append("spans: a compaction on the parent's run, which has none")
            if who == "child" and case["child_context"] == "off" and attempted:
                problems.append("spans: a compaction on the sub-agent's run, which has none")
            results = [outcome.result] if who == "parent" else world.child_results
            for result in [r for r in results if r is not None]:
                records = [m for m in result.messages if is_record(m)]
                if bool(records) != bool(completed):  # a fallback appends two at once
                    problems.append(
                        f"spans: {len(completed)} compactions traced on the {who}'s run "
                        f"for {len(records)} records"
                    )
        stalled = [
            s for s in chats if (s.attributes or {}).get("gen_ai.usage.input_tokens") is None
        ]
        problems += _cut_problems(case, who, stalled)
    if outcome.result is not None and outcome.result.usage != world.parent.usage:
        problems.append(
            f"usage: the parent's result says {outcome.result.usage}, its model billed "
            f"{world.parent.usage}"
        )
    for result in world.child_results:
        if result.usage != world.child.usage:
            problems.append(
                f"usage: the sub-agent's result says {result.usage}, billed {world.child.usage}"
            )
    end = observed_end(outcome)
    cut = child_cut(world)
    expected_parent = {
        "answer": ("UNSET", None),
        "deadline": ("ERROR", "DeadlineExceededError"),
        "cancelled": ("UNSET", None),
    }[end]
    if _status(parent) != expected_parent:
        problems.append(f"spans: the parent's run ended {_status(parent)}")
    if end == "deadline" and cut:
        for span in (*children, *delegates):
            if _status(span) != ("ERROR", "DeadlineExceededError"):
                problems.append(f"spans: {span.name} ended {_status(span)}, cut by the deadline")
    if case["stop"] == "tool_timeout" and cut:
        for span in delegates:
            if _status(span) != ("ERROR", "timeout"):
                problems.append(f"spans: the timed-out delegate call ended {_status(span)}")
        for span in children:
            if _status(span) != ("UNSET", None):
                problems.append(
                    f"spans: the sub-agent its tool's timeout cut ended {_status(span)}"
                )
    if case["stop"] == "child_deadline" and cut:
        for span in (*children, *delegates):
            if _status(span) != ("ERROR", "DeadlineExceededError"):
                problems.append(f"spans: {span.name} ended {_status(span)}, its own deadline")
    return problems


def _cut_problems(case: Mapping[str, Any], who: str, cut: Sequence[ReadableSpan]) -> list[str]:
    """The ``chat`` spans of calls that never answered (a stall, a rate limit) end as the
    stop says: the deadline that cut them ERROR, a cancellation UNSET."""
    problems = []
    stop = case["stop"]
    for span in cut:
        status = _status(span)
        if status in (("ERROR", "RateLimitError"), ("ERROR", "context_length_exceeded")):
            continue
        reason = (span.attributes or {}).get("gen_ai.response.finish_reasons")
        deadline = stop == "parent_deadline" or (stop == "child_deadline" and who == "child")
        wanted = ("ERROR", "DeadlineExceededError") if deadline else ("UNSET", None)
        if status != wanted or reason != ("error",):
            problems.append(f"spans: a cut chat span of the {who} ended {status} ({reason})")
    return problems


def _event_problems(world: World, outcome: Outcome, spans: Sequence[ReadableSpan]) -> list[str]:
    problems: list[str] = []
    events = outcome.events
    answers = len(world.parent.chats)  # a stop may cut the last before the run has it
    finished = sum(isinstance(e, ModelCallFinished) for e in events)
    if finished != answers and outcome.result is not None:
        problems.append(f"events: {finished} ModelCallFinished for {answers} parent answers")
    if any(isinstance(e, ModelCallRetried) for e in events):
        problems.append("events: a ModelCallRetried in the parent's stream (it never retried)")
    reported = [(e.reason, e.outcome) for e in events if isinstance(e, CompactionFinished)]
    traced = [
        (a.get(COMPACTION_REASON), a.get(COMPACTION_OUTCOME))
        for span in spans
        if span.name == "invoke_agent Parent"
        for event in span.events
        if event.name == COMPACTION_EVENT
        for a in [dict(event.attributes or {})]
        if a.get(COMPACTION_OUTCOME) != "skipped"
    ]
    if reported != traced and outcome.result is not None:
        problems.append(f"events: compactions {reported}, the parent's run traced {traced}")
    if outcome.result is not None:
        usage = Usage()
        for event in events:
            if isinstance(
                event, (ModelCallFinished, ModelCallRetried, SideCallFinished, CompactionFinished)
            ):
                usage += event.usage
        if usage != outcome.result.usage:
            problems.append(f"events: usages add up to {usage}, not {outcome.result.usage}")
        if not events or not isinstance(events[-1], RunFinished):
            problems.append("events: the last is not RunFinished")
    return problems


def _hook_problems(case: Mapping[str, Any], world: World) -> list[str]:
    if case["hooks"] != "both":
        return []
    problems = []
    for who in ("parent", "child"):
        seen = world.hooked[who]
        if set(seen) - {f"{who}-model"}:
            problems.append(f"hooks: the {who}'s hooks saw requests to {set(seen)}")
    return problems


def child_cut(world: World) -> bool:
    """Whether a stop (a deadline, a cancellation) ended the sub-agent's run."""
    return any(
        isinstance(e, DeadlineExceededError) or not isinstance(e, Exception)
        for e in world.child_errors
    )


def _metric_problems(
    case: Mapping[str, Any], world: World, outcome: Outcome, points: Mapping[str, Sequence[Any]]
) -> list[str]:
    """The token metric counts each model's billing once; each run's duration point has
    the error type its span has (``cancelled`` for a cancellation)."""
    problems = []
    for who, director in (("parent", world.parent), ("child", world.child)):
        counted = sum(
            point.sum
            for point in points.get("gen_ai.client.token.usage", ())
            if (point.attributes or {}).get("gen_ai.request.model") == f"{who}-model"
            and (point.attributes or {}).get("gen_ai.token.type") == "input"
        )
        if counted != director.usage.input_tokens:
            problems.append(
                f"metrics: {counted} input tokens of the {who}'s model, it billed "
                f"{director.usage.input_tokens}"
            )
    runs = {
        (a.get("gen_ai.agent.name"), a.get("error.type"))
        for point in points.get("gen_ai.invoke_agent.duration", ())
        for a in [dict(point.attributes or {})]
    }
    end = observed_end(outcome)
    wanted_parent = {"answer": None, "deadline": "DeadlineExceededError", "cancelled": "cancelled"}
    if ("Parent", wanted_parent[end]) not in runs:
        problems.append(f"metrics: the parent's run recorded as {runs}")
    if child_cut(world) or (case["fault"] == "overflow" and world.child_errors):
        stop = case["stop"]
        error = world.child_errors[0]
        wanted = (
            "context_length_exceeded"
            if isinstance(error, ContextWindowOverflowError)
            else type(error).__name__
            if isinstance(error, Exception)
            else "DeadlineExceededError"
            if stop == "parent_deadline"
            else "cancelled"
        )
        if ("Child", wanted) not in runs:
            problems.append(f"metrics: the sub-agent's run recorded as {runs}, not {wanted}")
    return problems


def problems(
    case: Mapping[str, Any], spans: Spans, histograms: Histograms | None = None
) -> list[str]:
    """What the case broke of the invariants (module docstring)."""
    before = len(spans.all())
    if histograms is not None:
        histograms.read()
    world, outcome = converse(case)
    if histograms is not None:
        found_metrics = _metric_problems(case, world, outcome, histograms.read())
    else:
        found_metrics = []
    found = _outcome_problems(case, world, outcome)
    found += _log_problems(case, world, outcome)
    if spans.still_open:
        found.append(f"spans: {len(spans.still_open)} left open")
    found += _span_problems(case, world, outcome, spans.all()[before:])
    if case["parent_mode"] == "stream":
        found += _event_problems(world, outcome, spans.all()[before:])
    found += _hook_problems(case, world)
    found += found_metrics
    found += _next_runs_problems(case, world)
    return found
