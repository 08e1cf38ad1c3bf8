"""Capabilities a team would ship, stacked at random: a retrieval that injects documents
and counts its embedding calls, a guard that rewrites answers, refuses a tool and mends
refused requests, and a trimming compaction of its own (records, events, annotations) —
with ``@manage_context`` above or below them (a bounded view too), on the class, a parent
or an Agent mixin, over sessions, streams, sub-agents, retries, deadlines and
cancellation. Each run keeps the protocol's promises: the log whole, what hooks add in
every request and never in the log, no call or result unpaired in a request, the
streamed usages adding up, the capability's own events bracketed and its annotation on
the turn's calls alone."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import pytest

from littleghost import Agent, Message, RunContext, Usage, manage_context, tool
from littleghost.capabilities import Capability, CapabilityHook, add_capability
from littleghost.context import PromptBudget, SlidingWindow, compaction_records
from littleghost.errors import (
    ContextWindowOverflowError,
    DeadlineExceededError,
    InvalidRequestError,
    PromptBudgetError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.events import (
    CompactionFinished,
    ModelCallFinished,
    ModelCallRetried,
    RunFinished,
    SideCallFinished,
)
from littleghost.messages import TextPart, ToolCall, ToolResult
from littleghost.models import ModelRequest, ModelResponse
from littleghost.sessions import InMemorySessionStore, SessionStore, SQLiteSessionStore
from littleghost.testing import (
    ScriptedModel,
    Step,
    streamed,
    text_response,
    tool_call_response,
    tool_calls_response,
)

from .conversations import badly_paired

if TYPE_CHECKING:
    from conftest import Spans

pytestmark = pytest.mark.anyio

MARKERS = ("Reference material", "Earlier notes", "After the question")
EMBEDDING = Usage(input_tokens=7)
DOCUMENT = "Refund policy clause {0}: refunds within 30 days of delivery. " * 30


@attrs.define
class Embeddings:
    """The embedding calls of a stream's runs (each counted in the run's usage)."""

    calls: int = 0


EMBEDDINGS = Embeddings()


def retrieve(agent: Agent, request: ModelRequest, *, context: RunContext) -> ModelRequest:
    """Inject retrieved documents: a system message, a user one before the question and
    one after it, under new ids; count the embedding call."""
    EMBEDDINGS.calls += 1
    context.add_usage(EMBEDDING)
    system = Message.system(f"{MARKERS[0]}:\n" + DOCUMENT.format(context.turn))
    before = Message.user(f"{MARKERS[1]}:\n" + DOCUMENT.format(100 + context.turn))
    after = Message.user(f"{MARKERS[2]}:\n" + DOCUMENT.format(200 + context.turn))
    messages = list(request.messages)
    ids = [message.id for message in messages]
    question = context.question
    if question is not None and question.id in ids:
        at = ids.index(question.id)
        messages[at : at + 1] = [before, messages[at], after]
    else:
        messages += [before, after]
    roles = [message.role.value for message in messages]
    first = next((i for i, role in enumerate(roles) if role not in ("system", "developer")), 0)
    messages.insert(first, system)
    return attrs.evolve(request, messages=tuple(messages))


def retrieval(cls: Any) -> Any:
    add_capability(cls, Capability("retrieval", [CapabilityHook("before_model", retrieve)]))
    return cls


def redact(agent: Agent, response: ModelResponse, *, context: RunContext) -> ModelResponse | None:
    """Rewrite an answer that tells a secret."""
    if "SECRET" not in response.message.text:
        return None
    parts = [
        attrs.evolve(part, text=part.text.replace("SECRET", "[redacted]"))
        if isinstance(part, TextPart)
        else part
        for part in response.message.content
    ]
    return attrs.evolve(response, message=attrs.evolve(response.message, content=parts))


def mend(
    agent: Agent, request: ModelRequest, error: Exception, *, context: RunContext
) -> ModelRequest | None:
    """Send a refused request again, colder, its long texts shortened (ids kept)."""
    if not isinstance(error, InvalidRequestError):
        return None
    messages = [
        attrs.evolve(m, content=[TextPart(m.text[:1_000])]) if len(m.text) > 1_000 else m
        for m in request.messages
    ]
    return attrs.evolve(request, messages=messages, settings={**request.settings, "temperature": 0})


def refuse(agent: Agent, call: ToolCall, *, context: RunContext) -> ToolCall | None:
    """Route a dangerous call to no tool: it is answered as unknown (``explain`` says why)."""
    return attrs.evolve(call, name="refused_by_guard") if call.name == "wipe" else None


def explain(agent: Agent, result: ToolResult, *, context: RunContext) -> ToolResult | None:
    """Say why a refused call did not run; keep secrets out of results."""
    if "refused_by_guard" in result.content:
        return attrs.evolve(result, content="Refused by policy.")
    if "SECRET" in result.content:
        return attrs.evolve(result, content=result.content.replace("SECRET", "[redacted]"))
    return None


def guarded(cls: Any) -> Any:
    hooks = [
        CapabilityHook("after_model", redact),
        CapabilityHook("after_model_error", mend),
        CapabilityHook("before_tool", refuse),
        CapabilityHook("after_tool", explain),
    ]
    add_capability(cls, Capability("guard", hooks))
    return cls


@attrs.frozen
class TrimStarted:
    """The trimming capability's own event: it is trimming a view of ``messages``."""

    messages: int


@attrs.frozen
class TrimFinished:
    """It left ``removed`` messages out of the request."""

    removed: int


async def trim(agent: Agent, request: ModelRequest, *, context: RunContext) -> ModelRequest | None:
    """Leave the turns before the current one out, by exclusion records in the log, when
    the view grows past 9 messages; tell it in events of its own and on the call's span."""
    view = context.view()
    assert len(context.log_index.log) == len(context.messages)
    await context.count_prompt_tokens(request)
    if context.last_exchange is not None:
        assert context.last_sent is not None
    if len(view) <= 9:
        return None
    records = await compaction_records(view, SlidingWindow(keep_last_turns=1), tokenizer=None)
    if not records:
        return None
    await context.emit(TrimStarted(len(view)))  # type: ignore[arg-type]
    await context.append(*records)
    shown = {message.id for message in context.view()}
    sent = {message.id for message in request.messages}
    kept: list[Message] = []
    placed = False
    for message in request.messages:
        if not context.has_message(message.id) or message.id in shown:
            kept.append(message)
        elif not placed:  # the records stand where what they cover stood
            kept += (record for record in context.view() if record.id not in sent)
            placed = True
    removed = len(request.messages) - len(kept)
    context.mark_compacted()
    context.annotate_next_call({"trim.removed_messages": removed})
    await context.emit(TrimFinished(removed))  # type: ignore[arg-type]
    return attrs.evolve(request, messages=tuple(kept))


def trimmed(cls: Any) -> Any:
    add_capability(cls, Capability("trim", [CapabilityHook("before_model", trim)]))
    return cls


def lookup(order: str) -> str:
    """Look up an order."""
    return f"Order {order} shipped; SECRET courier code. " * 40


def wipe() -> str:
    """Delete every order."""
    return "wiped"


class Helper(Agent):
    instructions = "Answer in one word."


Decorator = Callable[[Any], Any]


def drawn_class(rng: random.Random) -> tuple[type[Agent], list[str]]:
    """An agent class with drawn capabilities, stacked in a drawn order on the class, a
    parent or an Agent mixin; the names in running order, ``budget`` added for a bounded
    view."""
    decorators: list[Decorator] = [
        decorator for decorator in (retrieval, guarded, trimmed) if rng.random() < 0.6
    ]
    budget = False
    if rng.random() < 0.6:
        window = rng.choice([2_500, 3_000, 5_000, 20_000])
        if rng.random() < 0.3:
            budget = True
            limit = PromptBudget(
                prompt_budget_tokens=rng.choice([4_000, 6_000]),
                response_reserve_tokens=256,
                safety_reserve_tokens=128,
            )
            decorators.append(
                manage_context(context_window_override=8_000, budget=limit, summarize=False)
            )
        else:
            decorators.append(
                manage_context(context_window_override=window, preserve_recent_messages=2)
            )
    rng.shuffle(decorators)

    @tool
    async def ask_helper(self: Agent, question: str) -> str:
        """Ask a helper agent."""
        model = ScriptedModel([text_response("Yes.", input_tokens=3, output_tokens=1)])
        return (await Helper(model=model).run(question)).output

    body: dict[str, Any] = {"tools": [lookup, wipe], "ask_helper": ask_helper}
    split = rng.randint(0, len(decorators))
    how = rng.choice(["class", "parent", "mixin"])
    base: Any = type("Base", (Agent,), body)
    for decorator in decorators[:split] if how != "class" else ():
        base = decorator(base)
    bases = (base,) if how == "parent" else (base, Agent)
    cls: Any = type("Support", bases, {"instructions": "Be brief.", "max_retries": 2})
    for decorator in decorators[split:] if how != "class" else decorators:
        cls = decorator(cls)
    names = [capability.name for capability in cls.capabilities]
    return cls, names + ["budget"] * budget


def drawn_steps(rng: random.Random) -> list[Step]:
    """A run's script: tool calls (a refused one, a helper's), answers (one telling a
    secret), refusals the guard mends, transient errors, overflows, a streamed answer."""
    steps: list[Step] = []
    for _ in range(rng.randint(1, 10)):
        used = {"input_tokens": rng.randint(1, 50), "output_tokens": rng.randint(1, 9)}
        draw = rng.random()
        if draw < 0.35:
            steps.append(tool_call_response("lookup", {"order": str(rng.randint(1, 99))}, **used))
        elif draw < 0.42:
            steps.append(tool_calls_response(("lookup", {"order": "1"}), ("wipe", {}), **used))
        elif draw < 0.47:
            steps.append(tool_call_response("ask_helper", {"question": "ok?"}, **used))
        elif draw < 0.54:
            steps.append(InvalidRequestError("refused"))
        elif draw < 0.58:
            steps.append(RateLimitError("slow down", retry_after=1))
        elif draw < 0.62:
            billed = Usage(input_tokens=rng.randint(0, 40))
            steps.append(ContextWindowOverflowError("too long", usage=billed))
        elif draw < 0.65:
            steps.append(ProviderUnavailableError("down", usage=Usage(input_tokens=5)))
        elif draw < 0.68:
            steps.append(streamed("Part one, ", Usage(input_tokens=11), "part two.", **used))
        else:
            steps.append(text_response(rng.choice(["Done.", "The SECRET is out."]), **used))
    steps.append(text_response("Final.", input_tokens=1, output_tokens=1))
    steps += [text_response("- note", input_tokens=5, output_tokens=5)] * 3  # summaries
    return steps


def check_request(request: ModelRequest, names: list[str]) -> None:
    """What hooks add is in every chat request once (a bounded view may leave out a user
    message before the question it sizes), never in a summary call's; no call or result
    is unpaired, no id repeated."""
    held = [sum(marker in m.text for m in request.messages) for marker in MARKERS]
    if request.purpose != "chat":
        assert held == [0, 0, 0]
        return
    assert not badly_paired(request.messages)
    assert len({m.id for m in request.messages}) == len(request.messages)
    if "retrieval" in names:
        sized = "budget" in names and names.index("retrieval") < names.index("manage_context")
        assert held in ([1, 1, 1], [1, 0, 1]) if sized else held == [1, 1, 1]


async def drawn_runs(seed: int, store: SessionStore, spans: Spans, timed: bool) -> None:
    """Runs of one session of a drawn class; each run's promises checked (``timed``:
    retries wait, and runs may be cut by a deadline or cancelled)."""
    rng = random.Random(seed)
    cls, names = drawn_class(rng)
    for _ in range(rng.randint(1, 5)):
        steps = drawn_steps(rng)
        if not timed:
            steps = [step for step in steps if not isinstance(step, RateLimitError)]
        stop = rng.choice([None, None, "deadline", "cancel"]) if timed else None
        if stop is not None:

            async def hang(request: ModelRequest) -> ModelResponse:
                await anyio.sleep(1_000)
                raise AssertionError("never")

            steps.insert(rng.randint(0, len(steps) - 4), hang)
        model = ScriptedModel(steps)
        agent = cls(model=model, session_store=store)
        spans.clear()
        EMBEDDINGS.calls = 0
        events: list[object] = []
        result = None
        with anyio.move_on_after(500 if stop == "cancel" else None) as cancelled:
            timeout = 500 if stop == "deadline" else None
            try:
                if rng.random() < 0.6:
                    async with agent.stream(
                        "Where is my order?", session_id="s", timeout=timeout
                    ) as run:
                        async for event in run:
                            events.append(event)
                    result = run.result
                else:
                    result = await agent.run("Where is my order?", session_id="s", timeout=timeout)
            except DeadlineExceededError:
                assert stop == "deadline"
            except (
                InvalidRequestError,
                RateLimitError,
                ProviderUnavailableError,
                ContextWindowOverflowError,
                PromptBudgetError,
            ):
                pass
        assert not (cancelled.cancelled_caught and result is not None)
        log = await store.load("s")
        assert not badly_paired(log)
        assert len({message.id for message in log}) == len(log)
        assert not any(marker in message.text for message in log for marker in MARKERS)
        for request in model.requests:
            check_request(request, names)
        for span in spans.all():
            if "trim.removed_messages" in (span.attributes or {}):
                assert span.name.startswith("chat")
                assert (span.attributes or {}).get("littleghost.purpose") == "chat"
        if result is None:
            continue
        assert result.messages == tuple(log)
        if events:
            kinds = [type(event).__name__ for event in events]
            assert kinds.count("RunFinished") == 1 and isinstance(events[-1], RunFinished)
            trimming = 0
            for kind in kinds:
                trimming += {"TrimStarted": 1, "TrimFinished": -1}.get(kind, 0)
                assert trimming in (0, 1) and not (trimming and kind == "ModelCallFinished")
            reported = [
                event.usage
                for event in events
                if isinstance(
                    event,
                    (ModelCallFinished, ModelCallRetried, SideCallFinished, CompactionFinished),
                )
            ]
            embedded = [EMBEDDING] * EMBEDDINGS.calls
            assert sum(reported + embedded, Usage()) == result.usage


@pytest.mark.virtual_clock
@pytest.mark.parametrize("seed", range(60))
async def test_stacked_capabilities_keep_the_protocols_promises(seed: int, spans: Spans) -> None:
    """Drawn stacks and runs, retries waited for and runs cut or cancelled on a virtual
    clock, in memory."""
    await drawn_runs(seed, InMemorySessionStore(), spans, timed=True)


@pytest.mark.parametrize("seed", range(10))
async def test_stacked_capabilities_keep_them_over_sqlite(
    seed: int, spans: Spans, tmp_path: Path
) -> None:
    """Drawn stacks and runs (no timed step: the store works in threads) over SQLite."""
    async with SQLiteSessionStore(tmp_path / "sessions.db") as store:
        await drawn_runs(1_000 + seed, store, spans, timed=False)
