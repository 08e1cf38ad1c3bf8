"""A combination harness: features that each work alone, run together.

``DIMENSIONS`` lists what a user can combine: context management (off, the default
summaries, observation masking, a ``PromptBudget`` with and without summaries, a
``Pipeline``, ``TurnExcerpts``) with its threshold, preserved messages, quotes and
tokenizer, a budget's memories; typed results (a record or a wrapped list, asked for
natively or through ``final_result``, declared on the class or given to ``run()``);
instructions as text or a callable; limits just enough for the script; hooks (a
retrieved developer or user message, a scrubber, a rewrite of calls, results and
answers) on the class or a mixin; the conversation (``history=``, or a session in memory,
SQLite or a custom store, ``compact_session`` between runs); reasoning; a side call, a
sub-agent (run, ``run_sync()`` from a sync tool, ``stream()``, or on the outer run's
model) or an append from a tool; sync tools; tools as ``@tool`` methods or a client's
bound methods; knobs on the class or the constructor; cut tool results; an image; what
the provider reports (exact counts, none, or counts twice the estimate, refusing a
request over the window, with or without counting prompts); a model that streams or not;
a deadline; ``max_tokens``; the backend; ``capture_content``; where the window comes from.
``combinations()`` is a covering set of them (``tests/covering.py``): every allowed pair
of values of two dimensions in some combination, 54 combinations where the product has
about 2 * 10**11.

Each combination runs one scripted conversation three times, through ``run()``,
``stream()`` read whole, and ``run_sync()``: a stored history, then ``RUNS`` questions,
each a tool loop (parallel calls, one of them to a failing tool, then one more call)
ending in an answer (typed: a misfit, one repair turn, then the answer), long enough to
compact. The model is a ``ScriptedModel`` whose one step (``Director``) plays the
provider: it answers chat calls from the script, summary, side and sub-agent calls, and
counts tokens with the default estimate (twice it, as a "dense" provider that refuses a
request over the window: overflow recovery then compacts). ``problems(combo)`` lists what
broke of the invariants every combination must keep:

- the stored log is whole: every tool call answered exactly once, results after their
  call, no message lost or reordered (each run's log is the start of the next and of the
  stored log; compacted messages stay, only hidden from the view), records cover only
  messages before them, tool results whole under context management (else cut);
- every request sent pairs calls with results, holds the question and every logged
  message no record hides, shows none a record hides, keeps the output schema or the
  ``final_result`` tool, shows cut tool results when they are cut, and what a parent's
  scrubbing hook removed nowhere (a summary request neither, nor reasoning); with context
  management it fits the window by the engine's own estimate (of the whole request once
  the conversation's last two answers keep what a class's own hooks added to their calls;
  before, as ``@manage_context`` sized it, since what those hooks add after it is known
  only once sent, and counted once seen twice), unless a compaction
  attempted for it could not get it under (the preserved messages and the current turn
  are over: overflow recovery then decides, on the provider's word);
- the result is what the script asked for: the answer (typed: the type's value, after the
  repair turn), each run's new messages as the script made them, the runs' usage what
  the model billed;
- what ``sessions view`` shows before a run is what the run sends first, when it says the
  call does not compact first (and nothing only a run knows applies);
- the events of ``stream()`` match the run's log: one ``ToolCallStarted`` and
  ``ToolCallFinished`` per run tool call, in the log's order, with the logged result; one
  ``ModelCallFinished`` per answer, a ``ModelCallRetried`` per refused call, a
  ``SideCallFinished`` per side call; the text and reasoning deltas of each call join to
  what the log holds; the compactions reported are those traced; the usages add up to
  ``result.usage``; ``RunFinished`` holds the result;
- spans: none left open; every model and tool call is a span under its run (a side
  call's under its tool's, a sub-agent's run under the tool that ran it); the failing
  tool's ``execute_tool`` span ERROR with its error type, a refused call's ``chat`` span
  ERROR, nothing else; the chat spans' input tokens add up to their run's; a compacted
  request's span says so, and only that one; no content without ``capture_content``,
  the messages with it;
- ``run()``, ``stream()`` and ``run_sync()`` give the same log, results, requests, spans
  and compactions.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
from attrs import define, field, frozen
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

from littleghost import (
    Agent,
    ImagePart,
    Message,
    ReasoningPart,
    Role,
    RunContext,
    TextPart,
    ToolCall,
    ToolResult,
    after_model,
    after_tool,
    before_model,
    before_tool,
    manage_context,
    tool,
)
from littleghost.cli.view import view_document
from littleghost.cli.window import window_of
from littleghost.context import (
    ByteEstimator,
    Pipeline,
    PromptBudget,
    Summarization,
    ToolResultCompaction,
    TurnExcerpts,
)
from littleghost.context.calibration import estimate_tokens
from littleghost.context.compaction import compact_session
from littleghost.context.management import kept_hooked
from littleghost.context.records import is_record, record_covers
from littleghost.context.tokens import DEFAULT_TOKENIZER, estimate_request
from littleghost.context.view import build_view
from littleghost.errors import CompactionError, ContextWindowOverflowError
from littleghost.events import (
    CompactionFinished,
    CompactionStarted,
    Event,
    ModelCallFinished,
    ModelCallRetried,
    ReasoningDelta,
    RunFinished,
    SideCallFinished,
    TextDelta,
    ToolCallFinished,
    ToolCallStarted,
)
from littleghost.models import ModelRequest, ModelResponse, StopReason, Usage
from littleghost.run import RunResult
from littleghost.sessions import (
    InMemorySessionStore,
    SessionStore,
    SQLiteSessionStore,
    StoredMessage,
    encode_message,
)
from littleghost.telemetry import (
    COMPACTION_EVENT,
    COMPACTION_OUTCOME,
    COMPACTION_REASON,
    COMPACTION_REMOVED,
    CONVERSATION_COMPACTED,
    PURPOSE,
)
from littleghost.testing import ScriptedModel, text_response
from tests.conftest import Spans
from tests.conversations import shape
from tests.covering import covering
from tests.faults import log_problems, request_problems, summary_request_problems, view_problems
from tests.faults import unanswered as unanswered_calls
from tests.stores import PlainStore

DIMENSIONS: dict[str, tuple[Any, ...]] = {
    "context": ("off", "summaries", "masking", "budget", "budget_only", "pipeline", "excerpts"),
    "output": ("text", "native", "tool", "native_list", "tool_list"),
    "output_where": ("class", "run"),
    "instructions": ("text", "callable"),
    "limits": ("default", "tight"),
    "hooks": ("none", "inject", "inject_user", "rewrite", "redact"),
    "hook_place": ("class", "mixin"),
    "conversation": ("history", "memory", "sqlite", "plain"),
    "between": ("nothing", "compact_session"),
    "reasoning": (False, True),
    "extra": (
        "none",
        "side_call",
        "sub_agent",
        "sub_agent_sync",
        "sub_agent_stream",
        "sub_agent_shared",
        "append",
    ),
    "tools": ("async", "sync"),
    "tool_decl": ("method", "function"),
    "knobs": ("class", "constructor"),
    "result_cap": ("whole", "cut"),
    "image": (False, True),
    "provider": ("exact", "silent", "dense", "dense_counting"),
    "model": ("streaming", "whole"),
    "deadline": (None, 120.0),
    "max_tokens": (None, 64),
    "backend": ("asyncio", "trio"),
    "capture": (False, True),
    "window": ("override", "advertised"),
    "memories": (False, True),
    "threshold": (0.5, 0.7, 1.0),
    "preserve": (2, 6, 14),
    "quotes": (True, False),
    "tokenizer": ("characters", "bytes"),
}
"""Every configuration dimension the harness combines, with its values."""
BUDGETS = ("budget", "budget_only")
DENSE = ("dense", "dense_counting")
SECRET = "zq7x"
"""In every question, tool result and tool error: no span may hold it unless
``capture_content`` is on."""
REMOVED = "####"
"""What the ``redact`` hook puts in its place: as long, so that a hook of the class's own,
which runs after ``@manage_context`` has sized the request, does not make it longer."""
SEED = 20261205
WINDOW = 2_400
RUNS = 3
DENSITY = 2.0
"""The "dense" provider's tokens per token of the engine's estimate: the first request,
with the stored history, overflows; threshold compactions come before later ones do."""
SUMMARY = "- The user asked about parcels; lookups gave their states."
MODES = ("run", "stream", "run_sync")


def allowed(combo: Mapping[str, Any]) -> bool:
    """Whether a (partial) combination can be run: a provider that refuses over the window
    needs context management, memories a bounded view."""
    context = combo.get("context")
    if combo.get("provider") in DENSE and context == "off":
        return False
    if combo.get("between") == "compact_session" and combo.get("conversation") == "history":
        return False
    if combo.get("output_where") == "run" and combo.get("output") == "text":
        return False
    return not (combo.get("memories") and context is not None and context not in BUDGETS)


def combinations(seed: int = SEED) -> list[dict[str, Any]]:
    """The covering set the harness runs: every allowed pair of values of two dimensions."""
    return covering(DIMENSIONS, allowed, seed)


@frozen
class Ticket:
    """The typed answer."""

    order_id: str
    urgent: bool


def _question(run: int, image: bool) -> Message:
    text = f"Question {run} ({SECRET}): where are parcels k{run}a, k{run}b and k{run}c?"
    if image and run == 1:
        picture = ImagePart(url="https://example.com/parcel.png")
        return Message(Role.USER, (TextPart(text), picture))
    return Message.user(text)


def seed_history() -> list[Message]:
    """The conversation before the first question: small talk and one tool exchange."""
    messages = []
    for turn in range(16):
        messages.append(Message.user(f"Earlier question {turn} about order {700 + turn}? " * 3))
        messages.append(
            Message.assistant(f"Earlier answer {turn}: order {700 + turn} is fine. " * 4)
        )
    call = ToolCall("h-1", "lookup", {"key": "h1"})
    messages += [
        Message.user("And parcel h1?"),
        Message.assistant(tool_calls=(call,)),
        Message.tool("h-1", _lookup_text("h1")),
        Message.assistant("Parcel h1 is in the depot."),
    ]
    return messages


def _lookup_text(key: str) -> str:
    return json.dumps(
        {
            "key": key,
            "state": f"in transit {SECRET}",
            "depot": f"D-{len(key) * 7}",
            "scans": list(range(24)),
        }
    )


@frozen
class Step:
    """One answer of the script: its calls (name, arguments), its text."""

    calls: tuple[tuple[str, dict[str, Any]], ...] = ()
    text: str = ""


EXTRA_CALLS = {
    "none": (),
    "side_call": (("digest", {"topic": "parcels"}),),
    "sub_agent": (("delegate", {"task": "check the depot"}),),
    "sub_agent_sync": (("delegate", {"task": "check the depot"}),),
    "sub_agent_stream": (("delegate", {"task": "check the depot"}),),
    "sub_agent_shared": (("delegate", {"task": "check the depot"}),),
    "append": (),
}
NOTE = Step((("note", {"text": "customer is waiting"}),))
"""With ``extra="append"``, a step of its own (an append made while parallel calls run
lands among their results as the scheduler has it)."""
MISFIT = {"order_id": "A-1"}
LIST_MISFIT = {"result": "A-1"}


def plan(combo: Mapping[str, Any], run: int) -> list[Step]:
    """The chat answers of run ``run``."""
    first = (
        ("lookup", {"key": f"k{run}a"}),
        ("lookup", {"key": f"k{run}b"}),
        ("fail", {"item": f"i{run}"}),
        *EXTRA_CALLS[combo["extra"]],
    )
    steps = [Step(first), Step((("lookup", {"key": f"k{run}c"}),), "Checking one more.")]
    if combo["extra"] == "append":
        steps.insert(1, NOTE)
    output = combo["output"]
    if output == "text":
        return [*steps, Step(text=f"Run {run}: parcels k{run}a, k{run}b, k{run}c are in transit.")]
    if output.endswith("list"):
        misfit, fit = LIST_MISFIT, {"result": expected_output(combo, run)}
    else:
        misfit, fit = MISFIT, attrs.asdict(expected_output(combo, run))
    if output.startswith("native"):
        return [*steps, Step(text=json.dumps(misfit)), Step(text=json.dumps(fit))]
    return [*steps, Step((("final_result", misfit),)), Step((("final_result", fit),))]


def output_type(combo: Mapping[str, Any]) -> Any:
    """The combination's ``output_type`` (None for text)."""
    return {"text": None, "native": Ticket, "tool": Ticket}.get(combo["output"], list[str])


def expected_output(combo: Mapping[str, Any], run: int) -> Any:
    output = combo["output"]
    if output == "text":
        return f"Run {run}: parcels k{run}a, k{run}b, k{run}c are in transit."
    if output.endswith("list"):
        return [f"A-{run}", "urgent" if run % 2 == 0 else "calm"]
    return Ticket(f"A-{run}", run % 2 == 0)


@define
class Director:
    """The provider's side of the script (the one step of a ``ScriptedModel``, used for
    every call): chat calls get the run's next ``Step``, summary and side calls an answer
    of their own. Reports input tokens as ``provider`` says: the estimate ("exact"),
    none ("silent") or twice it ("dense", refusing a request over the window)."""

    combo: Mapping[str, Any]
    run: int = 0
    step: int = 0
    chats: list[ModelRequest] = field(factory=list)
    refused: list[tuple[int, int]] = field(factory=list)
    """(run, step) of each refused chat call."""
    refused_summaries: int = 0
    summaries: list[ModelRequest] = field(factory=list)
    sides: list[ModelRequest] = field(factory=list)
    helped: list[ModelRequest] = field(factory=list)
    """Calls of a sub-agent's run on this model."""
    billed: Usage = field(factory=Usage)
    """The usage of every answer given."""

    def begin(self, run: int) -> None:
        self.run, self.step = run, 0

    def count(self, request: ModelRequest) -> int:
        estimate = estimate_request(
            request.messages,
            request.tools,
            request.settings,
            DEFAULT_TOKENIZER,  # the provider's own: a tokenizer= of the agent's may differ
            output_schema=request.output_schema,
        )
        return math.ceil(estimate * (DENSITY if self.combo["provider"] in DENSE else 1.0))

    def usage(self, request: ModelRequest, output_tokens: int) -> Usage:
        used = (
            Usage(0, 0)
            if self.combo["provider"] == "silent"
            else Usage(self.count(request), output_tokens)
        )
        self.billed = self.billed + used
        return used

    def refuse(self, request: ModelRequest) -> None:
        size = self.count(request)
        if self.combo["provider"] in DENSE and size + max(request.max_tokens or 0, 1) > WINDOW:
            raise ContextWindowOverflowError(
                "prompt is too long", provider="scripted", prompt_tokens=size, context_window=WINDOW
            )

    def __call__(self, request: ModelRequest) -> ModelResponse:
        if request.purpose == "context_compaction":
            self.summaries.append(request)
            try:
                self.refuse(request)  # fitted again in the units of its error
            except ContextWindowOverflowError:
                self.refused_summaries += 1
                raise
            return ModelResponse(
                Message.assistant(SUMMARY), StopReason.END_TURN, self.usage(request, 12)
            )
        if request.messages and request.messages[0].text == Helper.instructions:
            self.helped.append(request)  # a sub-agent's run on this model (not billed here)
            task = request.messages[-1].text
            return ModelResponse(Message.assistant(f"Done: {task}."), StopReason.END_TURN)
        if request.purpose != "chat":
            self.sides.append(request)
            return ModelResponse(
                Message.assistant(f"digest of {request.messages[-1].text}"),
                StopReason.END_TURN,
                self.usage(request, 4),
            )
        self.chats.append(request)
        try:
            self.refuse(request)
        except ContextWindowOverflowError:
            self.refused.append((self.run, self.step))
            raise
        step = plan(self.combo, self.run)[self.step]
        number = self.step
        self.step += 1
        parts: list[Any] = []
        if self.combo["reasoning"]:
            parts.append(
                ReasoningPart(
                    f"Thinking about step {number} of run {self.run}.", provider="scripted"
                )
            )
        if step.text:
            parts.append(TextPart(step.text))
        calls = [
            ToolCall(f"r{self.run}s{number}c{i}", name, arguments)
            for i, (name, arguments) in enumerate(step.calls)
        ]
        parts += calls
        stop = StopReason.TOOL_USE if calls else StopReason.END_TURN
        return ModelResponse(Message(Role.ASSISTANT, parts), stop, self.usage(request, 9))


@define
class Sent:
    """What the recording hook saw of one chat request (at the time it was sent)."""

    request: ModelRequest
    problems: list[str]
    estimate: int | None
    """The engine's estimate of it (``None`` without context management)."""


class Helper(Agent):
    """The sub-agent a ``delegate`` call runs."""

    instructions = "You check depots."
    max_retries = 0


def _tools(combo: Mapping[str, Any]) -> dict[str, Callable[..., Any]]:
    """The tools of a combination's agent: functions of ``self`` (a method's or a
    client's, undecorated), by name."""
    if combo["tools"] == "sync":

        def lookup(self: Any, key: str) -> str:
            """Look a parcel up by its key."""
            return _lookup_text(key)

        def fail(self: Any, item: str) -> str:
            """Check the stock of an item."""
            raise ValueError(f"no stock for {item} ({SECRET})")

    else:

        async def lookup(self: Any, key: str) -> str:
            """Look a parcel up by its key."""
            await anyio.lowlevel.checkpoint()
            return _lookup_text(key)

        async def fail(self: Any, item: str) -> str:
            """Check the stock of an item."""
            await anyio.lowlevel.checkpoint()
            raise ValueError(f"no stock for {item} ({SECRET})")

    async def digest(self: Any, topic: str, context: RunContext) -> str:
        """Digest what is known of a topic."""
        request = ModelRequest((Message.user(f"Digest {topic}."),), purpose="digest")
        return (await context.complete(request)).message.text

    async def delegate(self: Any, task: str) -> str:
        """Hand a task to the depot helper."""
        return (await Helper(model=_helper_model(task)).run(task)).output

    def delegate_sync(self: Any, task: str) -> str:
        """Hand a task to the depot helper."""
        return Helper(model=_helper_model(task)).run_sync(task).output

    delegate_sync.__name__ = "delegate"

    async def delegate_stream(self: Any, task: str) -> str:
        """Hand a task to the depot helper."""
        async with Helper(model=_helper_model(task)).stream(task) as events:
            async for _ in events:
                pass
        return events.result.output

    delegate_stream.__name__ = "delegate"

    async def delegate_shared(self: Any, task: str, context: RunContext) -> str:
        """Hand a task to the depot helper."""
        return (await Helper(model=context.model).run(task)).output

    delegate_shared.__name__ = "delegate"

    async def note(self: Any, text: str, context: RunContext) -> str:
        """Note something for the rest of the conversation."""
        await context.append(Message.user(f"Note: {text}."))
        return "noted"

    extra = {
        "none": [],
        "side_call": [digest],
        "sub_agent": [delegate],
        "sub_agent_sync": [delegate_sync],
        "sub_agent_stream": [delegate_stream],
        "sub_agent_shared": [delegate_shared],
        "append": [note],
    }[combo["extra"]]
    return {function.__name__: function for function in (lookup, fail, *extra)}


def _helper_model(task: str) -> ScriptedModel:
    answer = text_response(f"Done: {task}.", input_tokens=5, output_tokens=3)
    return ScriptedModel([answer], name="helper")


INJECTED = "Retrieved: parcels leave the depot at noon."


def _hooks(combo: Mapping[str, Any]) -> dict[str, Any]:
    """The hooks of the combination (``hooks``)."""
    kind = combo["hooks"]
    members: dict[str, Any] = {}
    if kind == "inject":

        def retrieve(self: Any, request: ModelRequest) -> ModelRequest:
            note = Message.developer(INJECTED, id="retrieved")
            messages = (*request.messages[:1], note, *request.messages[1:])
            return attrs.evolve(request, messages=messages)

        members["retrieve"] = before_model(retrieve)
    elif kind == "inject_user":

        def remind(self: Any, request: ModelRequest) -> ModelRequest:
            note = Message.user(INJECTED, id="reminder")
            return attrs.evolve(request, messages=(*request.messages, note))

        members["remind"] = before_model(remind)
    elif kind == "rewrite":

        def lower_keys(self: Any, call: ToolCall) -> ToolCall:
            if "key" in call.arguments:
                return attrs.evolve(call, arguments={"key": str(call.arguments["key"]).lower()})
            return None  # type: ignore[return-value]

        def stamp(self: Any, result: ToolResult) -> ToolResult:
            return attrs.evolve(result, content=f"{result.content} [checked]")

        def audit(self: Any, response: ModelResponse) -> ModelResponse:
            message = attrs.evolve(response.message, metadata={"audited": True})
            return attrs.evolve(response, message=message)

        members.update(
            lower_keys=before_tool(lower_keys), stamp=after_tool(stamp), audit=after_model(audit)
        )
    elif kind == "redact":

        def scrub(self: Any, request: ModelRequest) -> ModelRequest:
            return attrs.evolve(request, messages=tuple(redacted(m) for m in request.messages))

        members["scrub"] = before_model(scrub)
    return members


def redacted(message: Message) -> Message:
    """``message`` without ``SECRET`` in its text and tool results (its id kept)."""
    parts = [
        TextPart(part.text.replace(SECRET, REMOVED))
        if isinstance(part, TextPart)
        else attrs.evolve(part, content=part.content.replace(SECRET, REMOVED))
        if isinstance(part, ToolResult)
        else part
        for part in message.content
    ]
    return attrs.evolve(message, content=tuple(parts))


MEMORIES = ["The customer prefers email.", "The customer lives in Lyon."]


def memories(context: RunContext) -> list[str]:
    """The budget's memories (``memories``): shown to the model, never logged."""
    return MEMORIES


def context_options(combo: Mapping[str, Any]) -> dict[str, Any] | None:
    """The ``@manage_context`` keywords of the combination, or None when it has none."""
    context = combo["context"]
    if context == "off":
        return None
    options: dict[str, Any] = {
        "compression_threshold": combo["threshold"],
        "preserve_recent_messages": combo["preserve"],
    }
    if combo["tokenizer"] == "bytes":
        options["tokenizer"] = ByteEstimator()
    if not combo["quotes"] and context in ("summaries", "masking", "budget"):
        options["quote_specifics"] = False
    if combo["window"] == "override":
        options["context_window_override"] = WINDOW
    if context == "masking":
        options["mask_tool_results"] = 1
    elif context in BUDGETS:
        options["budget"] = PromptBudget(
            prompt_budget_tokens=1_800,
            response_reserve_tokens=64,
            safety_reserve_tokens=128,
            memory=memories if combo["memories"] else None,
            memory_tokens=64,
        )
        options["summarize"] = context == "budget"
    elif context == "pipeline":
        options["strategy"] = Pipeline(
            ToolResultCompaction(keep_last_tool_call_groups=1),
            Summarization(minimum_preserved=4, quote_specifics=combo["quotes"]),
        )
    elif context == "excerpts":
        options["strategy"] = TurnExcerpts()
    return options


def make_agent(
    combo: Mapping[str, Any], sent: list[Sent], model: ScriptedModel, store: SessionStore | None
) -> Agent:
    """The combination's agent: its knobs declared on the class or given to the
    constructor (``knobs``), its tools ``@tool`` methods or a client's bound methods in
    ``tools`` (``tool_decl``), its hooks on the class or a mixin (``hook_place``). Its last
    ``before_model`` hook records each request in ``sent`` with what it found wrong then."""
    options = context_options(combo)
    hooks = _hooks(combo)
    mixin = type("Hooks", (), hooks if combo["hook_place"] == "mixin" else {})

    def record(self: Any, request: ModelRequest, *, context: RunContext) -> None:
        question = context.question.text if context.question is not None else ""
        problems: list[str] = []
        if combo["hooks"] == "redact":
            question = question.replace(SECRET, REMOVED)
            if SECRET in json.dumps(shape(request.messages)):
                problems.append("the model was shown what a before_model hook removed")
        problems += view_problems(request.messages, context, question)
        hidden = {covered for m in context.messages for covered in record_covers(m)}
        if shown := hidden.intersection(m.id for m in request.messages):
            problems.append(f"{len(shown)} message(s) a record covers shown")
        config = self.context_management
        estimate = None
        if config is not None:  # of the request as @manage_context saw it
            seen = request
            first = not kept_hooked(context.messages, WINDOW)  # as the run takes it
            if combo["hook_place"] == "class" and first:  # a hook of the class's own adds
                # after it: what it added is counted once the last two answers keep it
                injected = ("retrieved", "reminder")
                kept = tuple(m for m in request.messages if m.id not in injected)
                seen = attrs.evolve(request, messages=kept)
            estimate = estimate_tokens(seen, context, config.tokenizer)
            room = max(request.max_tokens or 0, 1) - (request.max_tokens or 0)
            if estimate + room > WINDOW and not compacted_for(request):
                problems.append(f"a request of {estimate} tokens (estimated) over the window")
        sent.append(Sent(request, problems, estimate))

    attempts: dict[int, int] = {}  # by run span: the compaction events seen so far

    def compacted_for(request: ModelRequest) -> bool:
        """Whether a compaction was attempted (not skipped) since the last request: one
        that could not get the request under the window (the preserved newest messages
        and the current turn are over it) leaves the rest to overflow recovery."""
        span = trace.get_current_span()
        events = [e for e in getattr(span, "events", ()) if e.name == COMPACTION_EVENT]
        key = span.get_span_context().span_id
        new, attempts[key] = events[attempts.get(key, 0) :], len(events)
        return any(e.attributes.get(COMPACTION_OUTCOME) != "skipped" for e in new)

    def instructions(context: RunContext) -> str:
        return f"You track parcels for ACME. Use the tools. This is turn {context.turn}."

    calls = [name for step in plan(combo, 0) for name, _ in step.calls if name != "final_result"]
    tools = _tools(combo)
    knobs: dict[str, Any] = {
        "instructions": "You track parcels for ACME. Use the tools.",
        "max_retries": 0,
        "capture_content": combo["capture"],
    }
    if combo["result_cap"] == "cut":  # else Agent's default, over the window, undeclared
        knobs["max_tool_result_tokens"] = 12
    members: dict[str, Any] = {}
    if combo["instructions"] == "callable":
        knobs["instructions"] = instructions
        members["instructions"] = lambda self, context: instructions(context)
    if combo["tool_decl"] == "method":
        members.update((name, tool(function)) for name, function in tools.items())
    else:
        client = type("Depot", (), tools)()
        knobs["tools"] = [getattr(client, name) for name in tools]
    if combo["limits"] == "tight":  # just enough for the script
        knobs.update(max_turns=len(plan(combo, 0)), max_tool_calls=len(calls))
    if combo["output"] != "text":
        knobs["output_strategy"] = combo["output"].removesuffix("_list")
        if combo["output_where"] == "class":
            knobs["output_type"] = output_type(combo)
    if combo["max_tokens"] is not None:
        knobs["settings"] = {"max_tokens": combo["max_tokens"]}
    given: dict[str, Any] = {"model": model}
    if store is not None:
        given["session_store"] = store
    if combo["knobs"] == "class":
        members = {**knobs, **members}
    else:
        given.update(knobs)
    members.update(hooks if combo["hook_place"] == "class" else {})
    members["zz_record"] = before_model(record)
    cls = type("Tracker", (mixin, Agent), members)
    managed = cls if options is None else manage_context(**options)(cls)
    return managed(**given)


@define
class Outcome:
    """One mode's conversation: the results, the stored log, what the model saw."""

    mode: str
    results: list[RunResult[Any]]
    log: tuple[Message, ...]
    director: Director
    sent: list[Sent]
    events: list[list[Event]]
    spans: tuple[ReadableSpan, ...]
    previews: dict[int, tuple[int, dict[str, Any]]] = field(factory=dict)
    """By run: the number of chat requests before it, and what ``sessions view`` showed
    of the session before it."""
    error: BaseException | None = None


def _store(combo: Mapping[str, Any], path: Path) -> SessionStore | None:
    if combo["conversation"] == "memory":
        return InMemorySessionStore()
    if combo["conversation"] == "plain":
        return PlainStore()
    if combo["conversation"] == "sqlite":
        return SQLiteSessionStore(path)
    return None


class Whole(ScriptedModel):
    """A ``ScriptedModel`` that does not stream: a streamed run gets each answer whole."""

    stream = None  # type: ignore[assignment]


def _model(combo: Mapping[str, Any], director: Director) -> ScriptedModel:
    advertised = WINDOW if combo["window"] == "advertised" else 100_000
    counting = director.count if combo["provider"] == "dense_counting" else None
    kind = ScriptedModel if combo["model"] == "streaming" else Whole
    return kind([director] * 200, context_window=advertised, count_prompt_tokens=counting)


def _options(combo: Mapping[str, Any], run: int, history: Sequence[Message]) -> dict[str, Any]:
    """The keywords of run ``run`` (``history`` the log so far)."""
    session = None if combo["conversation"] == "history" else "s-1"
    options: dict[str, Any] = {
        "history": history if session is None or run == 0 else None,
        "session_id": session,
        "timeout": combo["deadline"],
    }
    if combo["output_where"] == "run" and combo["output"] != "text":
        options["output_type"] = output_type(combo)
    return options


async def _one(
    agent: Agent, combo: Mapping[str, Any], run: int, history: Sequence[Message], stream: bool
) -> tuple[RunResult[Any], list[Event]]:
    options = _options(combo, run, history)
    question = _question(run, combo["image"])
    if not stream:
        return await agent.run(question, **options), []
    seen: list[Event] = []
    async with agent.stream(question, **options) as events:
        async for event in events:
            seen.append(event)
    return events.result, seen


async def _compact_between(store: SessionStore) -> None:
    """Collapse the session's older tool results between runs (when there are any)."""
    with contextlib.suppress(CompactionError):
        await compact_session(store, "s-1", ToolResultCompaction(keep_last_tool_call_groups=1))


def previewed(combo: Mapping[str, Any], run: int) -> bool:
    """Whether ``sessions view`` can show what run ``run`` sends first: a session with
    messages, instructions of text, no memories, no hook that changes the request, a
    question of text alone, no output type given to ``run()`` alone."""
    return (
        run > 0
        and combo["conversation"] != "history"
        and combo["output_where"] == "class"
        and combo["instructions"] == "text"
        and not combo["memories"]
        and combo["hooks"] in ("none", "rewrite")
        and not (combo["image"] and run == 1)
    )


def converse(combo: Mapping[str, Any], mode: str, directory: Path, spans: Spans) -> Outcome:
    """Run the combination's conversation through ``mode`` (from synchronous code)."""
    director = Director(combo)
    sent: list[Sent] = []
    store = _store(combo, directory / f"{mode}.db")
    agent = make_agent(combo, sent, _model(combo, director), store)
    results: list[RunResult[Any]] = []
    all_events: list[list[Event]] = []
    previews: dict[int, tuple[int, dict[str, Any]]] = {}
    before = len(spans.all())
    history: Sequence[Message] = seed_history()
    error: BaseException | None = None
    backend = combo["backend"] if mode != "run_sync" else "asyncio"
    try:
        for run in range(RUNS):
            director.begin(run)
            if run and combo["between"] == "compact_session":
                assert store is not None
                anyio.run(_compact_between, store, backend=backend)
            if previewed(combo, run):
                assert store is not None
                log = anyio.run(store.load, "s-1")
                document = view_document(
                    "s-1",
                    [StoredMessage(m, None) for m in log],
                    agent,
                    window_of(agent, None),
                    _question(run, combo["image"]).text,
                )
                previews[run] = (len(director.chats), document)
            if mode == "run_sync":
                options = _options(combo, run, history)
                result = agent.run_sync(_question(run, combo["image"]), **options)
                seen: list[Event] = []
            else:
                result, seen = anyio.run(
                    _one, agent, combo, run, history, mode == "stream", backend=backend
                )
            results.append(result)
            all_events.append(seen)
            history = result.messages
    except Exception as raised:  # reported as a problem
        error = raised
    log = tuple(history)
    if store is not None:
        log = anyio.run(store.load, "s-1") if results else ()
        if isinstance(store, SQLiteSessionStore):
            anyio.run(store.aclose)
    return Outcome(
        mode, results, log, director, sent, all_events, spans.all()[before:], previews, error
    )


def skeleton(messages: Sequence[Message]) -> list[tuple[Any, ...]]:
    """What the script decides of messages: roles, calls, whether results failed."""
    return [
        (
            m.role.value,
            tuple(c.name for c in m.tool_calls),
            tuple(r.is_error for r in m.tool_results),
            len(m.reasoning) + sum(isinstance(p, ImagePart) for p in m.content),
        )
        for m in messages
        if not is_record(m) and not m.is_summary
    ]


def expected_skeleton(combo: Mapping[str, Any], run: int) -> list[tuple[Any, ...]]:
    """The messages run ``run`` adds, as ``skeleton`` shows them."""
    out: list[tuple[Any, ...]] = [("user", (), (), int(combo["image"] and run == 1))]
    for step in plan(combo, run):
        names = tuple(name for name, _ in step.calls)
        out.append(("assistant", names, (), int(combo["reasoning"])))
        if "note" in names:
            out.append(("user", (), (), 0))  # appended by the call, before its result
        for name in names:
            misfit = step.calls[0][1] in (MISFIT, LIST_MISFIT)
            failed = name == "fail" or (name == "final_result" and misfit)
            out.append(("tool", (), (failed,), 0))
        if step.text in (json.dumps(MISFIT), json.dumps(LIST_MISFIT)):
            out.append(("user", (), (), 0))  # the repair message
    return out


def _log_problems(combo: Mapping[str, Any], outcome: Outcome) -> list[str]:
    problems = [f"log: {p}" for p in log_problems(outcome.log)]
    if unanswered_calls(outcome.log):
        problems.append(f"log: calls unanswered: {unanswered_calls(outcome.log)}")
    ids = [m.id for m in outcome.log]
    seeded = [m.id for m in seed_history()]
    previous: list[str] = []
    for run, result in enumerate(outcome.results):
        mine = [m.id for m in result.messages]
        if mine[: len(previous)] != previous:
            problems.append(f"run {run}: the log lost or reordered what the run before left")
        if ids[: len(mine)] != mine:
            problems.append(f"run {run}: its log is not the start of the stored log")
        new = result.messages[len(previous) if run else 0 :]
        if run == 0:
            kept = [m.id for m in result.messages[: len(seeded)]]
            if [m.text for m in result.messages[: len(seeded)]] != [m.text for m in seed_history()]:
                problems.append("run 0: the history is not the log's start")
            new = result.messages[len(kept) :]
        if skeleton(new) != expected_skeleton(combo, run):
            problems.append(
                f"run {run}: its messages are not the script's: {skeleton(new)} != "
                f"{expected_skeleton(combo, run)}"
            )
        if result.output != expected_output(combo, run):
            problems.append(f"run {run}: output {result.output!r}")
        previous = mine
    looked_up = [  # the results of the runs' lookups (not the history's)
        r.content
        for m in outcome.log
        for r in m.tool_results
        if r.content.startswith('{"key"') and not r.call_id.startswith("h-")
    ]
    whole = combo["context"] != "off" or combo["result_cap"] == "whole"
    suffix = " [checked]" if combo["hooks"] == "rewrite" else ""
    wholes = {_lookup_text(f"k{run}{c}") + suffix for run in range(RUNS) for c in "abc"}
    if whole and not wholes.issuperset(looked_up):
        problems.append("log: a tool result was cut (context management keeps them whole)")
    if not whole and any("truncated" not in text for text in looked_up):
        problems.append("log: a tool result over max_tool_result_tokens was kept whole")
    if any(memory in m.text for m in outcome.log for memory in MEMORIES):
        problems.append("log: it holds a memory (a view's own, never logged)")
    used = sum((r.usage for r in outcome.results), Usage())
    if used != outcome.director.billed:
        problems.append(
            f"usage: the runs add up to {used}, the model billed {outcome.director.billed}"
        )
    return problems


def _sent_problems(combo: Mapping[str, Any], outcome: Outcome) -> list[str]:
    problems = [f"request: {p}" for sent in outcome.sent for p in sent.problems]
    director = outcome.director
    if [id(s.request) for s in outcome.sent] != [id(r) for r in director.chats]:
        problems.append("the requests the hooks last saw are not those the model got")
    for request in director.summaries:
        problems += [f"summary request: {p}" for p in summary_request_problems(request)]
        text = json.dumps(shape(request.messages))
        if "Thinking about" in text:
            problems.append("summary request: it holds reasoning")
        if combo["hooks"] == "redact" and combo["hook_place"] == "mixin" and SECRET in text:
            problems.append("summary request: it holds what a parent's before_model hook removed")
    output = combo["output"]
    wholes = {_lookup_text(f"k{run}{c}") for run in range(RUNS) for c in "abc"}
    for request in director.chats:
        problems += [f"chat request: {p}" for p in request_problems(request.messages)]
        if output.startswith("native") and request.output_schema is None:
            problems.append("chat request: the output schema is missing")
        if output.startswith("tool") and (
            "final_result" not in {spec.name for spec in request.tools}
            or request.settings.get("tool_choice") != "required"
        ):
            problems.append("chat request: the final_result tool or its tool choice is missing")
        shown = {
            r.content.removesuffix(" [checked]") for m in request.messages for r in m.tool_results
        }
        if combo["result_cap"] == "cut" and shown & wholes:
            problems.append("chat request: a tool result over max_tool_result_tokens is whole")
    refused = [(r, s) for r, s in director.refused]
    if len(refused) != len(set(refused)):
        problems.append(f"a model call was refused twice: {refused}")
    return problems


def _preview_problems(outcome: Outcome) -> list[str]:
    """What ``sessions view`` showed before a run against what the run sent first (when
    it said the call would not compact first): the messages (the question's id aside)
    and the estimate."""
    problems = []
    for run, (before, document) in outcome.previews.items():
        if len(outcome.sent) <= before or document["compaction_due"]:
            continue  # the run failed before its first call (reported), or compacts first
        sent = outcome.sent[before]
        question = [_question(run, False).text]
        shown = [_unnamed(entry["message"], question) for entry in document["messages"]]
        if shown != [_unnamed(encode_message(m), question) for m in sent.request.messages]:
            problems.append(f"run {run}: sessions view showed another request than it sent")
        if sent.estimate is not None and document["estimated_tokens"] != sent.estimate:
            problems.append(
                f"run {run}: sessions view estimated {document['estimated_tokens']} tokens, "
                f"the run {sent.estimate}"
            )
    return problems


def _unnamed(message: dict[str, Any], texts: list[str]) -> dict[str, Any]:
    """An encoded ``message`` without its id when its texts are ``texts`` (the question,
    which ``sessions view`` makes anew)."""
    if [part.get("text") for part in message["content"]] == texts:
        return {**message, "id": "question"}
    return message


def _event_problems(outcome: Outcome) -> list[str]:
    problems: list[str] = []
    previous = len(seed_history())
    for run, (result, events) in enumerate(zip(outcome.results, outcome.events, strict=True)):
        new = result.messages[previous:]
        previous = len(result.messages)
        asked = [
            i for i, m in enumerate(new) if m.role is Role.USER and m.text.startswith("Question")
        ]
        new = new[asked[0] :] if asked else new  # records compact_session made before it aside
        where = f"run {run} events"
        ran = {c.id: c.name for m in new for c in m.tool_calls if c.name != "final_result"}
        logged = [r for m in new for r in m.tool_results if r.call_id in ran]
        started = [e.call.id for e in events if isinstance(e, ToolCallStarted)]
        finished = [e.result for e in events if isinstance(e, ToolCallFinished)]
        if sorted(started) != sorted(r.call_id for r in logged) or finished != logged:
            problems.append(f"{where}: tool events are not the log's tool results")
        answers = [m for m in new if m.role is Role.ASSISTANT and not is_record(m)]
        done = [e for e in events if isinstance(e, ModelCallFinished)]
        if len(done) != len(answers):
            problems.append(f"{where}: {len(done)} ModelCallFinished for {len(answers)} answers")
        calls: list[list[Event]] = [[]]
        for event in events:
            if isinstance(event, ModelCallRetried):
                calls[-1] = []
            elif isinstance(event, ModelCallFinished):
                calls.append([])
            else:
                calls[-1].append(event)
        for answer, streamed in zip(answers, calls, strict=False):
            text = "".join(e.text for e in streamed if isinstance(e, TextDelta))
            thought = "".join(e.text for e in streamed if isinstance(e, ReasoningDelta))
            if text != answer.text:
                problems.append(f"{where}: deltas {text!r} for the answer {answer.text!r}")
            if thought != "".join(p.text for p in answer.reasoning):
                problems.append(f"{where}: reasoning deltas {thought!r} for {answer.reasoning}")
        usage = Usage()
        for event in events:
            if isinstance(
                event, (ModelCallFinished, ModelCallRetried, SideCallFinished, CompactionFinished)
            ):
                usage = usage + event.usage
        if usage != result.usage:
            problems.append(f"{where}: usages add up to {usage}, not {result.usage}")
        last = events[-1] if events else None
        if not isinstance(last, RunFinished) or last.result is not result:
            problems.append(f"{where}: the last event is {type(last).__name__}, not RunFinished")
        records = [m for m in new if is_record(m)]
        completed = [
            e for e in events if isinstance(e, CompactionFinished) and e.outcome == "completed"
        ]
        if records and not completed:
            problems.append(f"{where}: {len(records)} records appended, no compaction reported")
        reported = [
            (e.reason, e.outcome, e.removed_messages)
            for e in events
            if isinstance(e, CompactionFinished)
        ]
        traced = [
            (a[COMPACTION_REASON], a[COMPACTION_OUTCOME], a.get(COMPACTION_REMOVED))
            for a in compaction_events(outcome, run)
            if a[COMPACTION_OUTCOME] != "skipped"
        ]
        started = sum(isinstance(e, CompactionStarted) for e in events)
        if reported != traced or started != len(reported):
            problems.append(f"{where}: compactions {reported} ({started} started), traced {traced}")
        retried = [e.error_type for e in events if isinstance(e, ModelCallRetried)]
        refused = [step for r, step in outcome.director.refused if r == run]
        if retried != ["context_length_exceeded"] * len(refused):
            problems.append(f"{where}: ModelCallRetried {retried} for {len(refused)} refusals")
        sides = [e.purpose for e in events if isinstance(e, SideCallFinished)]
        digests = sum(c.name == "digest" for m in new for c in m.tool_calls)
        if sides != ["digest"] * digests:
            problems.append(f"{where}: SideCallFinished {sides} for {digests} side calls")
    return problems


def compaction_events(outcome: Outcome, run: int) -> list[Mapping[str, Any]]:
    """The attributes of the compaction span events of run ``run`` of ``outcome``."""
    runs = [s for s in outcome.spans if s.name == "invoke_agent Tracker"]
    if run >= len(runs):
        return []
    return [dict(e.attributes or {}) for e in runs[run].events if e.name == COMPACTION_EVENT]


def run_of(span: ReadableSpan, by_id: Mapping[int, ReadableSpan]) -> ReadableSpan | None:
    """The ``invoke_agent`` span ``span`` belongs to: its nearest such ancestor."""
    parent = by_id.get(span.parent.span_id) if span.parent else None
    while parent is not None and not parent.name.startswith("invoke_agent"):
        parent = by_id.get(parent.parent.span_id) if parent.parent else None
    return parent


def _span_problems(combo: Mapping[str, Any], outcome: Outcome, spans_of: Spans) -> list[str]:
    problems: list[str] = []
    if spans_of.still_open:
        problems.append(f"spans: {len(spans_of.still_open)} left open")
    spans = outcome.spans
    by_id = {s.context.span_id: s for s in spans if s.context is not None}
    runs = [s for s in spans if s.name == "invoke_agent Tracker"]
    if len(runs) != len(outcome.results):
        problems.append(f"spans: {len(runs)} invoke_agent spans for {len(outcome.results)} runs")
    ours = [s for s in spans if (run := run_of(s, by_id)) and run.name == "invoke_agent Tracker"]
    chats = [s for s in ours if s.name.startswith("chat scripted")]
    director = outcome.director
    calls = len(director.chats) + len(director.summaries) + len(director.sides)
    if len(chats) != calls:
        problems.append(f"spans: {len(chats)} chat spans for {calls} model calls")
    tools = [s for s in ours if s.name.startswith("execute_tool")]
    ran = [
        c
        for r in outcome.results[-1:]
        for m in r.messages
        for c in m.tool_calls
        if c.name != "final_result" and not c.id.startswith("h-")
    ]
    if len(tools) != len(ran):
        problems.append(f"spans: {len(tools)} execute_tool spans for {len(ran)} tool calls")
    reported = [(s.attributes or {}).get("gen_ai.usage.input_tokens", 0) for s in runs]
    for span in runs:  # its model calls' spans (summary and side calls too) add up to it
        mine = [c for c in chats if run_of(c, by_id) is span]
        total = sum((c.attributes or {}).get("gen_ai.usage.input_tokens", 0) for c in mine)
        if total != (span.attributes or {}).get("gen_ai.usage.input_tokens", 0):
            problems.append(f"spans: chat spans add up to {total} input tokens, not the run's")
    for span in runs:  # a completed compaction marks the turn's next model call
        completed = [
            e.timestamp
            for e in span.events
            if e.name == COMPACTION_EVENT
            and (e.attributes or {}).get(COMPACTION_OUTCOME) == "completed"
        ]
        turns = sorted(
            (c.start_time or 0, bool((c.attributes or {}).get(CONVERSATION_COMPACTED)))
            for c in chats
            if run_of(c, by_id) is span and (c.attributes or {}).get(PURPOSE) == "chat"
        )
        previous = [(0, False), *turns[:-1]]
        for number, ((at, marked), (before, _)) in enumerate(zip(turns, previous, strict=True)):
            should = any(before < t < at for t in completed)
            if marked != should:
                problems.append(f"spans: model call {number} compacted={marked}, not {should}")
    if reported != [r.usage.input_tokens for r in outcome.results]:
        problems.append(f"spans: invoke_agent input tokens {reported}")
    if not combo["capture"] and any(SECRET in text for text in spans_of.every_text(spans)):
        problems.append("spans: content reached telemetry without capture_content")
    for span in chats:
        captured = "gen_ai.input.messages" in (span.attributes or {})
        if captured != combo["capture"]:
            problems.append(
                f"spans: a chat span {'without' if combo['capture'] else 'with'} content"
            )
    refused = 0
    for span in spans:  # the failing tool's ERROR, a refused call's, nothing else
        error = (span.attributes or {}).get("error.type")
        status = span.status.status_code
        if span.name == "execute_tool fail":
            expected = (StatusCode.ERROR, "ValueError")
        elif span in chats and status is StatusCode.ERROR:
            expected, refused = (StatusCode.ERROR, "context_length_exceeded"), refused + 1
        else:
            expected = (StatusCode.UNSET, None)
        if (status, error) != expected:
            problems.append(f"spans: {span.name} ended {status.name} ({error})")
        if span.name.startswith(("chat", "execute_tool")) and run_of(span, by_id) is None:
            problems.append(f"spans: {span.name} is not under its run's span")
        parent = by_id.get(span.parent.span_id) if span.parent else None
        if span.name == "invoke_agent Helper" and (
            parent is None or parent.name != "execute_tool delegate"
        ):
            problems.append("spans: a sub-agent's run is not under the tool that ran it")
    if refused != len(director.refused) + director.refused_summaries:
        problems.append(f"spans: {refused} chat spans ERROR for {len(director.refused)} refusals")
    return problems


def exercised(combo: Mapping[str, Any], outcome: Outcome) -> Counter[str]:
    """What of the features in play ``outcome`` showed at work (so that a covering set
    that exercises none of them fails)."""
    seen: Counter[str] = Counter()
    records = [m for m in outcome.log if is_record(m)]
    bounded = any(
        len(s.request.messages) < len(build_view(outcome.log[: len(s.request.messages)]))
        for s in outcome.sent
    )
    if records or (combo["context"] in BUDGETS and bounded):
        seen[f"compacted: {combo['context']}"] += 1
    if outcome.director.summaries:
        seen["summary call"] += 1
    if outcome.director.refused and outcome.error is None:
        seen[f"overflow recovered: {combo['provider']}"] += 1
    seen["previews compared"] += len(outcome.previews)
    shown = (m.text for r in outcome.director.chats for m in r.messages)
    seen["memories shown"] += any(MEMORIES[0] in text for text in shown)
    seen["side calls"] += len(outcome.director.sides)
    seen["sub-agent calls"] += len(outcome.director.helped)
    return seen


def problems(
    combo: Mapping[str, Any], directory: Path, spans: Spans, seen: Counter[str] | None = None
) -> list[str]:
    """What the combination broke of the invariants (module docstring), each mode's;
    what ``run()`` showed at work is added to ``seen``."""
    found: list[str] = []
    outcomes = []
    for mode in MODES:
        outcome = converse(combo, mode, directory, spans)
        mine: list[str] = []
        if outcome.error is not None:
            mine.append(f"raised {type(outcome.error).__name__}: {outcome.error}")
        mine += _log_problems(combo, outcome)
        mine += _sent_problems(combo, outcome)
        mine += _preview_problems(outcome)
        if mode == "stream":
            mine += _event_problems(outcome)
        mine += _span_problems(combo, outcome, spans)
        found += [f"{mode}: {p}" for p in mine]
        outcomes.append(outcome)
    first = outcomes[0]
    if seen is not None:
        seen.update(exercised(combo, first))
    for other in outcomes[1:]:
        if shape(other.log) != shape(first.log):
            found.append(f"{other.mode}: the log differs from run()'s")
        if [(r.output, r.usage, r.stop_reason) for r in other.results] != [
            (r.output, r.usage, r.stop_reason) for r in first.results
        ]:
            found.append(f"{other.mode}: the results differ from run()'s")
        if sorted(s.name for s in other.spans) != sorted(s.name for s in first.spans):
            found.append(f"{other.mode}: other spans than run()'s")
        if [compaction_events(other, run) for run in range(RUNS)] != [
            compaction_events(first, run) for run in range(RUNS)
        ]:
            found.append(f"{other.mode}: other compactions than run()'s")
        if [shape(r.messages, other.log) for r in other.director.chats] != [
            shape(r.messages, first.log) for r in first.director.chats
        ]:
            found.append(f"{other.mode}: the model was shown other requests than run()'s")
    return found
