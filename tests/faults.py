"""A fault-injection harness for whole runs: many short runs with faults at random points.

Each run is drawn from a seeded random generator: a script of model turns (tool calls,
several at once, sometimes sharing one call id, and a final answer; sometimes every
answer reuses one message id, as a replaying model's would), tools that answer, fail, hang, time out, block a
thread, let a cancellation of their own escape or end the process, a session store (in
memory or SQLite) that fails, stalls, fails after writing or finds its database locked
by another connection, model calls that fail or stall, and a stop: a deadline, a
caller's cancel scope, or a cancellation at the k-th instrumented await (each store call, model call and tool start and end is one). Runs go
through ``run()`` or ``stream()`` (whose consumer may leave early).

A share of the runs (``CONTEXT_SHARE``) use an agent with ``@manage_context``
(``VARIANTS``: the default summarizer, a pipeline, turn excerpts, observation masking, a
bounded view with and without summaries) at a small window, with a stored history, so
that compaction happens within a few turns. Their summary calls fail, stall, come back
empty or cut at their cap, or overflow (with and without figures); their chat calls may
overflow (the retried call too); store faults hit compaction records; summary calls,
records' appends and the bounded view's memories are instrumented awaits, and a stop
may be aimed at one of them.

After each run the harness checks:

- the exception that escaped, if any, is a documented one (``DOCUMENTED``), never an
  exception group, and a caller's cancellation that came before any fault that ends a
  run is what ended it (never replaced);
- the run ended within its stop time (deadline or cancellation) plus the cleanup grace;
- the store first: the run's log is what the store holds, and less only when a write
  failed or was cut off with its outcome unknown;
- every request the model was shown is valid: each call answered once, right after it;
- the stored log is valid: unique ids, every tool result after its call, no call
  answered twice, every compaction record covering only messages stored before it; and
  after a fault-free run of the same session, every call is answered exactly once and
  the model was shown a valid request;
- with ``@manage_context``: every request shown holds the current question and (but
  for a bounded view, which leaves turns out by design) every logged message not covered
  by a record; a summary request carries no tools and no tool-call blocks; a turn
  recovers from overflow at most once (a second overflow ends the run, caused by the
  first; a failed recovery's overflow is caused by a ``CompactionError``; a recovery
  from an overflow without figures at least halves the request); a ``CompactionError``
  never escapes; the fault-free run of the session uses the same agent class.

Half the runs draw extras (``_plan_extras``, from a generator of their own, so a run
without them is the run it was before): sub-agents from tools (``sub_run``: faults, a stop
and a grace of their own, a ``cancel()`` from their tool or a racing sibling), hooks that
append to the log, rebuild or add to the request, rewrite answers and results, give calls
one id or raise, tools that append to the log or make side calls, an ``output_type``,
small ``max_turns``, ``max_tool_calls`` and ``max_tool_result_tokens``, stream consumers
that read slowly or raise, and runs of the same session beside it (faulty ones, a
fault-free one, ``compact_session``); on PostgreSQL the server ends the session lock's
connection or holds the session's row. Besides the checks
above (for every run of the session, and every sub-agent's): every result a
``ToolCallFinished`` reported is stored; ``events.messages`` after a consumer left early
answers every call (as the view shows them); a hook's exception is what the run raised,
every call answered; a typed run's output is a ``Ticket``, an ``OutputValidationError``
only after a misfit; a side call's wait for a slow consumer never stops its tool at its
timeout; a sibling's ``cancel()`` ends a racing sub-agent as a cancellation; a run beside
never fails but at its own deadline, and ends within it. (Each check skips what a store
fault, or a cleanup cut at the grace on a busy store, may leave undone.)

Half the runs draw further extras (``_plan_more``, from a third generator): the store's
``load`` fails or stalls; hooks of every kind (``after_model_error`` too) stall, and
``before_model``, ``after_model`` and ``after_model_error`` hooks raise; model errors are
retried (``max_retries`` 1 or 2, a rate limit's ``retry_after`` up to past any deadline);
the model's ``prepare()`` stalls; the deadline is given as ``deadline=``; a stream's
consumer calls ``events.aclose()`` in its loop; the model is made from a model string
(``chaos:<session>``), so the agent closes it, and its ``aclose()`` stalls or fails; the
agent is closed while the run goes on (``aclose()`` from a task beside it, or the run in
``async with agent:``); the summary model of a ``compact_session`` beside the run
stalls; the store's ``lock`` fails as it releases the session (a ``SessionStoreError``),
which never changes how the run ends. Besides the checks above: ``aclose()`` beside a
run returns within the grace, raising nothing but a ``CleanupError`` of a failed close;
``events.aclose()`` returns within the grace; a ``CleanupError`` escapes only when
closing the model failed, never in place of the caller's cancellation; the run (the
block of ``async with agent:`` included) ends within its stop time plus the one grace.

``campaign()`` runs a number of them concurrently and returns a ``Report``;
``threaded_campaign()`` runs faulty runs through ``run_sync()`` in worker threads (each an
event loop of its own; a deadline their only stop), checked alike.
"""

from __future__ import annotations

import gc
import json
import math
import random
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import attrs
from attrs import define, field

from littleghost import (
    Agent,
    Message,
    Role,
    RunContext,
    ToolCall,
    after_model,
    after_model_error,
    after_tool,
    before_model,
    before_tool,
    manage_context,
    tool,
)
from littleghost.context import (
    CompactionStrategy,
    Pipeline,
    PromptBudget,
    Summarization,
    ToolResultCompaction,
    TurnExcerpts,
)
from littleghost.context.compaction import compact_session
from littleghost.context.records import COMPACTION_KIND_KEY, EXCLUSION, is_record, record_covers
from littleghost.context.tokens import estimate_request
from littleghost.context.view import build_view
from littleghost.errors import (
    CleanupError,
    CompactionError,
    ContextWindowOverflowError,
    DeadlineExceededError,
    InvalidRequestError,
    LimitExceededError,
    OutputLimitError,
    OutputValidationError,
    PromptBudgetError,
    ProtocolError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitError,
    SessionStoreError,
    UnknownSessionError,
)
from littleghost.events import ToolCallFinished
from littleghost.models import ModelRequest, ModelResponse, StopReason, register_provider
from littleghost.sessions import InMemorySessionStore, SessionStore, SQLiteSessionStore
from littleghost.testing import text_response
from tests.stores import PlainStore, postgres_schema

SECRET = "zq7x"
"""In every text of the harness's conversations and faults (the instructions, the model's
words, history, tool results, summaries, what models, tools, hooks and stores raise):
``tests/test_no_leaks.py`` checks that no span, metric or log record of a campaign holds
it. Short, so that texts keep their length; never in a hex id."""
GRACE = 0.1
"""The cleanup grace of the harness's agents, in seconds."""
TOLERANCE = 0.4
"""What a run may take past its stop time plus the grace (scheduling of many concurrent
runs and worker threads on a busy machine), in seconds; an unbounded cleanup overshoots
by up to the longest stall, 1.5 s."""


def cpu_wait(thread: int | None = None) -> float | None:
    """Seconds a thread (a ``threading.get_native_id()``; this one by default) has spent
    ready to run but waiting for a CPU (Linux's ``schedstat``; ``None`` where it cannot be
    read): how long a busy machine, not the run, held it up. A run's end is judged net of
    what its event loop waited so after its stop came; a sleep (a second grace, say), a
    blocked event loop or a wait for the interpreter's lock is no wait for a CPU."""
    where = "thread-self" if thread is None else f"self/task/{thread}"
    try:
        with open(f"/proc/{where}/schedstat", "rb") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def waited_since(at_stop: float | None, now: float | None) -> float:
    """Seconds of CPU wait between two ``cpu_wait()`` readings of one thread (0 if either
    could not be read)."""
    return 0.0 if at_stop is None or now is None else max(0.0, now - at_stop)


THREAD_TOLERANCE = 1.0
"""``TOLERANCE`` for a run through ``run_sync()``: its event loop is one of several threads
sharing the interpreter's lock with the campaign's own (a full suite's run on two busy
cores ended such runs 0.4-0.85 s late that end 0.05 s late alone, a wait for that lock,
not for a CPU); still well under the 1.5 s of an unbounded cleanup."""

DOCUMENTED: tuple[type[BaseException], ...] = (
    DeadlineExceededError,
    SessionStoreError,
    ProviderError,
    ProtocolError,
    LimitExceededError,
    OutputLimitError,
)
"""What a run may raise (besides the caller's own cancellation and a tool's SystemExit)."""


async def stray_cancellation() -> BaseException:
    """A real cancellation exception of the running backend (asyncio or trio) from a
    cancel scope that has already ended: raising it cancels nothing of the caller's."""
    leaked: BaseException | None = None
    with anyio.CancelScope() as scope:
        scope.cancel()
        try:
            await anyio.sleep(1)
        except anyio.get_cancelled_exc_class() as cancellation:
            leaked = cancellation
    assert leaked is not None
    return leaked


TOOLS = ("quick", "fail", "hang", "timed", "blocking", "cancel_self", "nested", "exit")


@define(eq=False)
class Chaos:
    """The faults of one run, and the instrumented awaits they fire at."""

    rng: random.Random
    store_faults: dict[int, tuple[str, float]] = field(factory=dict)
    model_faults: dict[int, tuple[str, float]] = field(factory=dict)
    cancel_at_point: int | None = None
    cancel_at_labelled: tuple[str, int] | None = None
    """Cancel at the n-th instrumented await with this label (a summary call, say)."""
    labelled: Counter[str] = field(factory=Counter)
    cancelled_at_point: bool = False
    fail_cleanup: bool = False
    """Fail every store write made once the run's stop has come (its cleanup)."""
    scope: anyio.CancelScope | None = None
    context: RunContext | None = None
    """The run's context, once its first model call is due."""
    points: int = 0
    appends: int = 0
    calls: int = 0
    repeat_ids: bool = False
    """The calls of one turn share one id."""
    replay: bool = False
    """Every answer of the model has one message id."""
    shown: list[str] = field(factory=list)
    """What was wrong with the requests the model was shown."""
    fired: Counter[str] = field(factory=Counter)
    ending_fault_at: float | None = None
    """When the first fault that can end a run fired (an error, not a stall)."""
    cancelled_at: float | None = None
    waited_at_stop: float | None = None
    """``cpu_wait()`` when the run's stop came (a timed one as ``one_run`` saw it come)."""
    variant: str = "plain"
    """The agent class of the run (``VARIANTS``)."""
    summary_faults: dict[int, tuple[str, float]] = field(factory=dict)
    summaries: int = 0
    counting: bool = False
    """The model counts prompt tokens (``count_prompt_tokens``)."""
    count_faults: dict[int, tuple[str, float]] = field(factory=dict)
    counts: int = 0
    memory_stalls: dict[int, float] = field(factory=dict)
    memories: int = 0
    chat_calls: list[tuple[int, str]] = field(factory=list)
    """(turn, what happened) of each chat call that reached its faults, in order."""
    sizes: list[tuple[int, int, bool, bool]] = field(factory=list)
    """(turn, estimated tokens, whether it overflowed without figures, whether an overflow
    with figures had taught the run its scale) of each chat call."""
    calibrated: bool = False
    """An overflow with figures (of a chat or a summary call), or the model's count, taught
    the run its scale."""
    overflows: list[tuple[int, ContextWindowOverflowError]] = field(factory=list)
    """(turn, error) of each overflow the chat calls raised."""
    postgres: str | None = None
    """The connection string of the PostgreSQL store under the faults, if it is one."""
    inner: SessionStore | None = None
    """The store under the faults (for the sessions of sub-agents)."""
    session_id: str = ""
    extra: random.Random | None = None
    """Draws the extras (``_plan_extras``) and the sub-agents' runs, apart from ``rng``."""
    note_turn: int | None = None
    """A ``before_model`` hook appends a user message to the log at this turn."""
    inject: bool = False
    """A ``before_model`` hook adds a message to the request, not to the log."""
    redact: bool = False
    """A ``before_model`` hook rebuilds the request's tool messages under new ids."""
    edit_response: bool = False
    """An ``after_model`` hook rewrites the answer's text under a new message id."""
    rename_calls: bool = False
    """An ``after_model`` hook gives every call of an answer one id."""
    edit_result: bool = False
    """An ``after_tool`` hook rewrites each result."""
    output: str | None = None
    """With an ``output_type``: ``fits``, ``misfit once`` or ``misfit`` (the final answers)."""
    finals: int = 0
    hook_fault: tuple[str, str] | None = None
    """(a hook kind of ``HOOK_KINDS``, ``error`` or ``cancellation``): that hook raises at
    its first call."""
    hook_raised: BaseException | None = None
    reported: list[Any] = field(factory=list)
    """The results ``ToolCallFinished`` events reported."""
    left: tuple[Message, ...] | None = None
    """``events.messages`` after a stream's consumer left early."""
    attempted: set[str] = field(factory=set)
    """The ids of every message the run asked its store to append."""
    unseen: dict[str, int] = field(factory=dict)
    """Messages a ``before_model`` hook appended, by turn: not in that turn's requests."""
    racers: list[Chaos] = field(factory=list)
    """Faulty runs of the same session beside this one."""
    subs: list[Chaos] = field(factory=list)
    """The runs of sub-agents (``delegate``, ``race``)."""
    sub_violations: list[str] = field(factory=list)
    more: random.Random | None = None
    """Draws the further extras (``_plan_more``), apart from ``rng`` and ``extra``."""
    load_fault: tuple[str, float] | None = None
    """(``load stall`` or ``load error``, seconds): the store's first ``load``."""
    hook_stalls: dict[str, float] = field(factory=dict)
    """A hook of this kind stalls this long at its first call."""
    retry_after: float = 0.01
    """The ``retry_after`` of the model's rate limits."""
    prepare_stall: float | None = None
    """The model's ``prepare()`` stalls this long."""
    close_fault: tuple[str, float] | None = None
    """(``close stall`` or ``close error``, seconds): the model's ``aclose()``."""
    release_fault: str | None = None
    """``release error``: the store's ``lock`` fails as it releases the session (with a
    ``SessionStoreError``)."""
    loads: int = 0

    async def point(self, where: str = "") -> None:
        """An instrumented await: the caller's scope may be cancelled here."""
        index = self.points
        self.points += 1
        labelled = self.labelled[where]
        self.labelled[where] += 1
        if self.scope is not None and (
            index == self.cancel_at_point or (where, labelled) == self.cancel_at_labelled
        ):
            self.fired["cancel at an await"] += 1
            if where:
                self.fired[f"cancel at {where}"] += 1
            self.cancelled_at_point = True
            self.cancelled_at = time.monotonic()
            if self.waited_at_stop is None:
                self.waited_at_stop = cpu_wait()
            self.scope.cancel()
        await anyio.lowlevel.checkpoint()

    def stopping(self) -> bool:
        """True once the run knows it is stopping (its cleanup has begun)."""
        return self.context is not None and self.context.grace.stopping

    def ending(self, kind: str) -> None:
        self.fired[kind] += 1
        if self.ending_fault_at is None:
            self.ending_fault_at = time.monotonic()


class ChaosStore:
    """A session store that fails, stalls or fails after writing, as ``chaos`` says."""

    def __init__(self, inner: SessionStore, chaos: Chaos) -> None:
        self.inner = inner
        self.chaos = chaos

    async def load(self, session_id: str) -> tuple[Message, ...]:
        chaos = self.chaos
        await chaos.point()
        first = chaos.loads == 0
        chaos.loads += 1
        kind, seconds = chaos.load_fault if first and chaos.load_fault else ("", 0.0)
        if kind == "load stall":
            chaos.fired[kind] += 1
            await anyio.sleep(seconds)
        elif kind == "load error":
            chaos.ending(kind)
            raise SessionStoreError(f"injected {SECRET}: the store cannot read")
        return await self.inner.load(session_id)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        chaos = self.chaos
        index = chaos.appends
        chaos.appends += 1
        records = any(is_record(message) for message in messages)
        chaos.attempted.update(message.id for message in messages)
        await chaos.point("a compaction record's append" if records else "")
        kind, seconds = chaos.store_faults.get(index, ("", 0.0))
        if records:
            chaos.fired["compaction stored"] += 1
            if kind:
                chaos.fired[f"{kind} on a compaction record"] += 1
        if chaos.fail_cleanup and chaos.stopping():
            chaos.fired["store error while stopping"] += 1
            raise SessionStoreError(f"injected {SECRET}: the store is down while the run stops")
        if kind == "store stall":
            chaos.fired[kind] += 1
            await anyio.sleep(seconds)
        elif kind == "sqlite locked" and isinstance(self.inner, SQLiteSessionStore):
            if _lock_database(self.inner.path, seconds):
                chaos.fired[kind] += 1
        elif kind == "store error":
            chaos.ending(kind)
            raise SessionStoreError(f"injected {SECRET}: the store is down")
        elif kind == "postgres busy" and chaos.postgres is not None:
            if await anyio.to_thread.run_sync(_hold_row, chaos.postgres, session_id, seconds):
                chaos.fired[kind] += 1
        elif kind == "postgres lock ended" and chaos.postgres is not None:
            ended = await anyio.to_thread.run_sync(_end_lock, chaos.postgres, session_id)
            if ended:
                chaos.ending(kind)
        await self.inner.append(session_id, messages)
        if kind == "store error after writing":
            chaos.ending(kind)
            raise SessionStoreError(f"injected {SECRET}: the connection dropped after the commit")
        await chaos.point()

    async def list_sessions(self) -> tuple[str, ...]:
        return await self.inner.list_sessions()

    async def delete(self, session_id: str) -> None:
        await self.inner.delete(session_id)

    def lock(self, session_id: str) -> Any:
        hold = self.inner.lock(session_id)  # type: ignore[attr-defined]
        return hold if self.chaos.release_fault is None else self._failing_release(hold)

    @asynccontextmanager
    async def _failing_release(self, hold: Any) -> AsyncIterator[None]:
        """``hold``, which fails once it has released the session, as the run drew."""
        async with hold:
            yield
        self.chaos.fired[str(self.chaos.release_fault)] += 1
        raise SessionStoreError(f"injected {SECRET}: the lock's connection dropped")


class LocklessChaosStore:
    """``ChaosStore`` over a store without a ``lock`` (sessions are then held by the
    library's own locks, across threads too): the four methods of the protocol only."""

    def __init__(self, inner: SessionStore, chaos: Chaos) -> None:
        self.faulty = ChaosStore(inner, chaos)

    async def load(self, session_id: str) -> tuple[Message, ...]:
        return await self.faulty.load(session_id)

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        await self.faulty.append(session_id, messages)

    async def list_sessions(self) -> tuple[str, ...]:
        return await self.faulty.list_sessions()

    async def delete(self, session_id: str) -> None:
        await self.faulty.delete(session_id)


def _end_lock(conninfo: str, session_id: str) -> bool:
    """End the PostgreSQL backend that holds the session lock of ``session_id`` (as a
    server restart or an idle timeout would); False when none holds it."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as connection:
        rows = connection.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory'"
            " AND granted AND objsubid = 1 AND ((classid::bigint << 32) | objid::bigint)"
            " = hashtextextended(quote_ident(current_schema()) || '.' || %s, 0)",
            (session_id,),
        ).fetchall()
    return bool(rows)


def _hold_row(conninfo: str, session_id: str, seconds: float) -> bool:
    """Hold the PostgreSQL row of ``session_id`` from another connection for ``seconds``
    (its writes wait on the server); False when the session has no row yet."""
    import psycopg

    blocker = psycopg.connect(conninfo)
    row = blocker.execute(
        "SELECT 1 FROM littleghost_sessions WHERE id = %s FOR UPDATE", (session_id,)
    ).fetchone()
    if row is None:
        blocker.close()
        return False

    def release() -> None:
        blocker.rollback()
        blocker.close()

    timer = threading.Timer(seconds, release)
    timer.daemon = True
    timer.start()
    return True


def _lock_database(path: str, seconds: float) -> bool:
    """Hold an exclusive lock on the SQLite database at ``path`` from another connection
    for ``seconds`` (so the store's worker thread blocks on it); False when another
    holder has it already."""
    blocker = sqlite3.connect(path, timeout=0, isolation_level=None, check_same_thread=False)
    try:
        blocker.execute("BEGIN EXCLUSIVE")
    except sqlite3.OperationalError:
        blocker.close()
        return False

    def release() -> None:
        blocker.execute("ROLLBACK")
        blocker.close()

    timer = threading.Timer(seconds, release)
    timer.daemon = True
    timer.start()
    return True


SUMMARY_PURPOSE = "context_compaction"
"""The purpose of a summary call (``littleghost.context.summarize.summary_request``)."""
FILLER = " ".join(["note"] * 39 + [SECRET])
"""What the model says beside its calls in a run with context management (the
conversation grows toward a compaction)."""


class ChaosModel:
    """Plays ``turns`` (lists of tool names, the last one an answer), with faults; answers
    summary calls (with faults of their own) and checks every request it is shown."""

    provider = "chaos"
    name = "chaos"
    context_window = None
    supports_output_schema = True

    def __init__(self, turns: list[list[str]], chaos: Chaos) -> None:
        self.turns = turns
        self.chaos = chaos
        self.turn = 0
        self.question = "Go."
        self.context: RunContext | None = None

    async def respond(self, request: ModelRequest) -> ModelResponse:
        chaos = self.chaos
        if request.purpose == SUMMARY_PURPOSE:
            return await self._summary(request)
        if request.purpose == SIDE:
            chaos.fired["side call"] += 1
            await chaos.point("a side call")
            return text_response("fine")
        index = chaos.calls
        chaos.calls += 1
        await chaos.point()
        kind, seconds = chaos.model_faults.get(index, ("", 0.0))
        turn = self.context.turn if self.context is not None else -1
        unseen = {key for key, when in chaos.unseen.items() if when == turn}
        if chaos.redact and self.context is not None:  # shown rebuilt, under new ids
            unseen.update(m.id for m in self.context.messages if m.tool_results)
        chaos.shown.extend(view_problems(request.messages, self.context, self.question, unseen))
        if chaos.variant != "plain":
            size = estimate_request(request.messages, request.tools, request.settings)
            chaos.sizes.append((turn, size, kind == "model overflow", chaos.calibrated))
        if kind == "model stall":
            chaos.fired[kind] += 1
            await anyio.sleep(seconds)
        elif kind == "model unavailable":
            chaos.ending(kind)
            raise ProviderUnavailableError(f"injected {SECRET}", provider="chaos")
        elif kind == "model rate limit":
            chaos.ending(kind)
            raise RateLimitError(
                f"injected {SECRET}", provider="chaos", retry_after=chaos.retry_after
            )
        elif kind == "model invalid request":
            chaos.ending(kind)
            raise InvalidRequestError(f"injected {SECRET}", provider="chaos", status=400)
        elif kind.startswith("model overflow"):
            chaos.ending(kind)
            if any(earlier == turn for earlier, _ in chaos.overflows):
                chaos.fired["second overflow in a turn"] += 1
            figures = kind == "model overflow with figures"
            chaos.calibrated |= figures
            error = ContextWindowOverflowError(
                f"injected {SECRET}",
                provider="chaos",
                prompt_tokens=int(seconds) if figures else None,
                context_window=WINDOW if figures else None,
            )
            chaos.overflows.append((turn, error))
            chaos.chat_calls.append((turn, "overflow"))
            raise error
        chaos.chat_calls.append((turn, "answered"))
        names = self.turns[self.turn] if self.turn < len(self.turns) else []
        self.turn += 1
        ids = {"id": "replayed"} if chaos.replay else {}
        text = f"Step {self.turn}: {FILLER}" if chaos.variant != "plain" else ""
        if not names and chaos.output is not None:
            return self._final(request, ids)
        if not names:
            return ModelResponse(Message.assistant(text or "done", **ids), StopReason.END_TURN)
        calls = [
            ToolCall(f"call-{self.turn}" if chaos.repeat_ids else f"call-{self.turn}-{i}", name)
            for i, name in enumerate(names)
        ]
        message = Message.assistant(text, tool_calls=calls, **ids)
        return ModelResponse(message, StopReason.TOOL_USE)

    async def prepare(self) -> None:
        """Stall, as the run drew (a local model starting its server, say)."""
        if self.chaos.prepare_stall is not None:
            self.chaos.fired["prepare stall"] += 1
            await anyio.sleep(self.chaos.prepare_stall)

    async def aclose(self) -> None:
        """Stall or fail, as the run drew (only a model made from a model string is
        closed by the agent)."""
        chaos = self.chaos
        chaos.fired["model closed"] += 1
        kind, seconds = chaos.close_fault or ("", 0.0)
        if kind:
            chaos.fired[kind] += 1
        if kind == "close stall":
            await anyio.sleep(seconds)
        elif kind == "close error":
            raise OSError(f"injected {SECRET}: the client would not close")

    def _final(self, request: ModelRequest, ids: dict[str, str]) -> ModelResponse:
        """A typed answer (as ``final_result``'s arguments when the request offers it) that
        fits ``Ticket`` or not, as ``chaos.output`` says."""
        chaos = self.chaos
        chaos.finals += 1
        misfit = chaos.output == "misfit" or (chaos.output == "misfit once" and chaos.finals == 1)
        answer: dict[str, Any] = {"order_id": 42} if misfit else {"order_id": "42", "urgent": True}
        if any(spec.name == "final_result" for spec in request.tools):
            calls = [ToolCall(f"final-{chaos.finals}", "final_result", answer)]
            if chaos.repeat_ids:  # a misfit first, under the same id
                calls.insert(0, ToolCall(calls[0].id, "final_result", {"order_id": 42}))
            return ModelResponse(Message.assistant(tool_calls=calls, **ids), StopReason.TOOL_USE)
        text = json.dumps(answer)
        return ModelResponse(Message.assistant(text, **ids), StopReason.END_TURN)

    async def count_prompt_tokens(self, request: ModelRequest) -> int | None:
        """The request's estimate as the provider's count (``None`` when this run's model
        does not count), or a fault (an error, a stall, a figure over the window); a stop
        that lands in it is counted."""
        chaos = self.chaos
        if not chaos.counting:
            return None
        index = chaos.counts
        chaos.counts += 1
        chaos.fired["prompt count"] += 1
        try:
            await chaos.point("a prompt count")
            kind, seconds = chaos.count_faults.get(index, ("", 0.0))
            if kind:
                chaos.fired[kind] += 1
            if kind == "count stall":
                await anyio.sleep(seconds)
            elif kind == "count error":
                raise ProviderUnavailableError(f"injected count failure {SECRET}", provider="chaos")
            chaos.calibrated = True  # a figure, as an overflow's
            if kind == "count over the window":
                return 10 * WINDOW
            return estimate_request(request.messages, request.tools, request.settings)
        except anyio.get_cancelled_exc_class():
            chaos.fired["stopped in a prompt count"] += 1
            raise

    async def _summary(self, request: ModelRequest) -> ModelResponse:
        """A summary call: notes, or a fault (an error, a stall, an empty text, an
        overflow with or without figures); a stop that lands in it is counted."""
        chaos = self.chaos
        index = chaos.summaries
        chaos.summaries += 1
        chaos.fired["summary call"] += 1
        chaos.shown.extend(summary_request_problems(request))
        try:
            await chaos.point("a summary call")
            kind, seconds = chaos.summary_faults.get(index, ("", 0.0))
            if kind:
                chaos.fired[kind] += 1
            if kind == "summary stall":
                await anyio.sleep(seconds)
            elif kind == "summary error":
                raise ProviderUnavailableError(
                    f"injected summary failure {SECRET}", provider="chaos"
                )
            elif kind == "summary overflow":
                raise ContextWindowOverflowError(
                    f"injected summary overflow {SECRET}", provider="chaos"
                )
            elif kind == "summary overflow with figures":
                chaos.calibrated = True
                raise ContextWindowOverflowError(
                    f"injected summary overflow {SECRET}",
                    provider="chaos",
                    prompt_tokens=int(seconds),
                    context_window=WINDOW,
                )
            elif kind == "summary empty":
                return text_response("")
            elif kind == "summary at its cap":  # no complete line: asked again, shorter
                return text_response("- The user", stop_reason=StopReason.MAX_TOKENS)
            return text_response(
                f"- The user asked to go {SECRET}.\n- Tools ran.", output_tokens=12
            )
        except anyio.get_cancelled_exc_class():
            chaos.fired["stopped in a summary call"] += 1
            raise


class Inner(Agent):
    """The agent a tool runs, with a deadline of its own that always passes."""

    cleanup_grace = GRACE


class Slow:
    provider = "slow"
    name = "slow"
    context_window = None

    async def respond(self, request: ModelRequest) -> ModelResponse:
        await anyio.sleep(10)
        return text_response("late")


class ChaosAgent(Agent):
    instructions = f"Work {SECRET}."
    cleanup_grace = GRACE
    max_retries = 0
    max_turns = 6

    @before_model
    def watch(self, request: ModelRequest, context: RunContext) -> None:
        """Let the faults see whether the run is stopping, and the models the run's log."""
        if isinstance(context.model, ChaosModel):
            context.model.chaos.context = context
        if isinstance(context.model, (ChaosModel, Checking)):
            context.model.context = context

    @tool
    async def quick(self) -> str:
        """Answer at once."""
        return "quick"

    @tool
    async def fail(self) -> str:
        """Fail."""
        raise ValueError(f"injected tool failure {SECRET}")

    @tool
    async def hang(self) -> str:
        """Never finish."""
        await anyio.sleep(60)
        return "never"

    @tool(timeout=0.02)
    async def timed(self) -> str:
        """Take longer than its timeout."""
        await anyio.sleep(60)
        return "never"

    @tool(timeout=0.03)
    def blocking(self) -> str:
        """Block a worker thread ten times past its timeout."""
        time.sleep(0.3)
        return "late"

    @tool
    async def cancel_self(self) -> str:
        """Let a cancellation of its own escape its cancel scope."""
        raise await stray_cancellation()

    @tool
    async def nested(self) -> str:
        """Run an agent whose own deadline passes."""
        return (await Inner(model=Slow()).run("?", timeout=0.01)).output

    @tool
    async def exit(self) -> str:
        """End the process (the run must let SystemExit through as itself)."""
        raise SystemExit(3)

    @before_model
    async def edit_request(self, request: ModelRequest, context: RunContext) -> Any:
        """Append a user message to the log at the turn the run drew, or add one to the
        request alone."""
        chaos = _chaos(context)
        if chaos is None:
            return None
        await _hook_stall("before_model", chaos)
        await _hook_fault("before_model", context)
        if chaos.note_turn == context.turn:
            chaos.note_turn = None
            chaos.fired["hook appends a message"] += 1
            note = Message.user(f"A note at turn {context.turn}.")
            chaos.unseen[note.id] = context.turn  # the request was made before it
            await context.append(note)
        messages = request.messages
        if chaos.redact and any(m.tool_results for m in messages):
            chaos.fired["hook rebuilds results"] += 1
            messages = tuple(_redacted(m) if m.tool_results else m for m in messages)
        if chaos.inject:
            chaos.fired["hook adds to the request"] += 1
            messages = (*messages, Message.user("Be brief."))
        return None if messages is request.messages else attrs.evolve(request, messages=messages)

    @after_model
    async def edit_answer(self, response: ModelResponse, context: RunContext) -> Any:
        """Give the calls of an answer one id, or rewrite its text under a new id."""
        chaos = _chaos(context)
        if chaos is None:
            return None
        await _hook_stall("after_model", chaos)
        await _hook_fault("after_model", context)
        message = response.message
        if chaos.rename_calls and len(message.tool_calls) > 1:
            chaos.fired["hook gives calls one id"] += 1
            calls = [
                attrs.evolve(call, id=f"renamed-{context.turn}") for call in message.tool_calls
            ]
            message = Message.assistant(message.text, tool_calls=calls, id=message.id)
        if chaos.edit_response:  # a typed answer keeps its text, to fit as it did
            chaos.fired["hook rewrites an answer"] += 1
            text = message.text if chaos.output is not None else f"{message.text} (edited)"
            message = Message.assistant(text, tool_calls=message.tool_calls)
        return None if message is response.message else attrs.evolve(response, message=message)

    @before_tool
    async def fail_before_tool(self, call: ToolCall, context: RunContext) -> None:
        """Stall or raise, as the run drew."""
        chaos = _chaos(context)
        if chaos is not None:
            await _hook_stall("before_tool", chaos)
        await _hook_fault("before_tool", context)

    @after_tool
    async def edit_result(self, result: Any, context: RunContext) -> Any:
        """Stall or raise, as the run drew, or rewrite a tool's result."""
        chaos = _chaos(context)
        if chaos is not None:
            await _hook_stall("after_tool", chaos)
        await _hook_fault("after_tool", context)
        if chaos is None or not chaos.edit_result:
            return None
        chaos.fired["hook rewrites a result"] += 1
        return attrs.evolve(result, content=f"{result.content} (checked)")

    @after_model_error
    async def on_model_error(
        self, request: ModelRequest, error: Exception, context: RunContext
    ) -> None:
        """Stall or raise, as the run drew (the error goes on: ``None``)."""
        chaos = _chaos(context)
        if chaos is not None:
            await _hook_stall("after_model_error", chaos)
        await _hook_fault("after_model_error", context)


class HookFailure(Exception):
    """What a hook raises (``Chaos.hook_fault``): the run raises it as it is."""


async def _hook_fault(kind: str, context: RunContext) -> None:
    chaos = _chaos(context)
    if chaos is None or chaos.hook_fault is None or chaos.hook_fault[0] != kind:
        return
    what = chaos.hook_fault[1]
    chaos.hook_fault = None
    chaos.ending(f"{kind} hook raises {what}")
    error = HookFailure(f"{kind} {SECRET}") if what == "error" else await stray_cancellation()
    chaos.hook_raised = error
    raise error


async def _hook_stall(kind: str, chaos: Chaos) -> None:
    """Stall at the first call of a hook of this kind, as the run drew."""
    seconds = chaos.hook_stalls.pop(kind, None)
    if seconds is not None:
        chaos.fired[f"{kind} hook stall"] += 1
        await anyio.sleep(seconds)


def _redacted(message: Message) -> Message:
    """``message``'s results, rebuilt under a new id with their text replaced."""
    results = [attrs.evolve(r, content="(redacted)") for r in message.tool_results]
    return Message(Role.TOOL, results)


def _chaos(context: RunContext) -> Chaos | None:
    """The faults of a faulty run (``None`` in a fault-free one)."""
    model = context.model
    return model.chaos if isinstance(model, ChaosModel) else None


SIDE_TIMEOUT = 0.15
"""The ``side`` tool's timeout: its calls take no time, but a busy event loop (20 runs at a
time) delays a task by up to about 0.1 s; a slow consumer takes up to 0.1 s an event, so
the wait for its two events, were it counted, would often pass it."""


class Extras(ChaosAgent):
    """Tools drawn by ``_plan_extras``: sub-agents, side calls, an append to the log."""

    @tool
    async def delegate(self, context: RunContext) -> str:
        """Run a sub-agent with faults and a stop of its own."""
        chaos = _chaos(context)
        return "alone" if chaos is None else await sub_run(chaos)

    @tool
    async def race(self, context: RunContext) -> str:
        """Run two sub-agents; the first to end cancels the other."""
        chaos = _chaos(context)
        if chaos is None:
            return "alone"
        chaos.fired["sub-agents racing"] += 1
        ended: list[str] = []
        async with anyio.create_task_group() as group:

            async def one() -> None:
                try:
                    ended.append(await sub_run(chaos, group.cancel_scope))
                except Exception as error:
                    ended.append(f"failed: {type(error).__name__}")
                group.cancel_scope.cancel()

            group.start_soon(one)
            group.start_soon(one)
        return ended[0]

    @tool(timeout=SIDE_TIMEOUT)
    async def side(self, context: RunContext) -> str:
        """Make two side calls, well within the timeout (the time a slow consumer takes
        their ``SideCallFinished`` events is not counted)."""
        for _ in range(2):
            await context.complete(ModelRequest((Message.user("Check."),), purpose=SIDE))
        return "checked"

    @tool
    async def note(self, context: RunContext) -> str:
        """Append a user message to the log while the call is open."""
        chaos = _chaos(context)
        if chaos is not None:
            chaos.fired["tool appends a message"] += 1
        await context.append(Message.user("A note from a tool."))
        return "noted"


EXTRA_TOOLS = ("delegate", "race", "note", "side")
SIDE = "side check"
"""The purpose of the ``side`` tool's calls."""


def with_extras(kind: type[ChaosAgent]) -> type[ChaosAgent]:
    """``kind`` with the ``Extras`` tools."""
    if kind not in _WITH_EXTRAS:
        _WITH_EXTRAS[kind] = type(f"{kind.__name__}WithExtras", (Extras, kind), {})
    return _WITH_EXTRAS[kind]


_WITH_EXTRAS: dict[type[ChaosAgent], type[ChaosAgent]] = {}


async def sub_run(
    parent: Chaos, sibling: anyio.CancelScope | None = None, *, racing: bool = False
) -> str:
    """A sub-agent's run (from a tool) on a session of its own, with faults and a stop of its
    own (its deadline, or a ``cancel()`` inside the outer run, on a timer or at an await),
    checked as a run is; a sibling's ``cancel()`` (``race``) must end it as a cancellation.
    ``racing``: a faulty run of the parent's session beside it instead (``Chaos.racers``)."""
    rng = parent.extra
    assert rng is not None and parent.inner is not None
    if racing:
        session_id = parent.session_id
        sub = Chaos(rng, inner=parent.inner, session_id=session_id, postgres=parent.postgres)
        parent.racers.append(sub)
        await anyio.sleep(rng.uniform(0.0, 0.1))
    else:
        session_id = f"{parent.session_id}/sub-{len(parent.subs)}"
        sub = Chaos(rng, inner=parent.inner, session_id=session_id, extra=rng)
        parent.subs.append(sub)
    parent.fired["racing faulty run" if racing else "sub-agent"] += 1
    turns, stop = _plan(rng, sub)
    turns = [[name for name in names if name != "exit"] for names in turns]
    model = ChaosModel(turns, sub)
    grace = rng.choice((GRACE, 1.0))  # a longer grace of its own never adds up to the outer's
    store = ChaosStore(parent.inner, sub)
    agent = VARIANTS[sub.variant](model=model, session_store=store, cleanup_grace=grace)
    timeout = stop.get("timeout")
    began = time.monotonic()
    error: Exception | None = None
    with anyio.CancelScope() as local:
        sub.scope = local
        if "cancel_after" in stop:
            parent.fired["sub-agent cancelled by its tool"] += 1
            local.deadline = anyio.current_time() + stop["cancel_after"]
            sub.cancelled_at = began + stop["cancel_after"]
        try:
            await _drive(agent, session_id, timeout, stop["stream"], rng, sub)
        except Exception as caught:
            error = caught
    elapsed = time.monotonic() - began
    cancel_at = None if sub.cancelled_at is None else sub.cancelled_at - began
    if cancel_at is not None and cancel_at >= elapsed:
        cancel_at = None
    stop_at = min((t for t in (timeout, cancel_at) if t is not None), default=None)
    problems = _check_outcome(error, local.cancelled_caught, sub, cancel_at, timeout, began)
    problems.extend(_overflow_problems(error, sub))
    if stop_at is not None and elapsed > stop_at + grace + TOLERANCE:
        problems.append(f"ended {elapsed - stop_at:.3f} s after its stop time (grace {grace})")
    by_sibling = sibling is not None and sibling.cancel_called and sub.ending_fault_at is None
    if by_sibling and error is not None and (timeout is None or elapsed < timeout):
        problems.append(f"a sibling's cancel() was replaced by {error!r}")
    problems.extend(sub.shown)
    label = "racing run" if racing else "sub-agent"
    parent.sub_violations.extend(
        f"{label} {session_id} ({turns}, {stop}, {sub.fired}): {p}" for p in problems
    )
    parent.fired.update(f"{label}: {kind}" for kind in sub.fired)
    if error is not None and not racing:
        raise error
    return "cancelled" if local.cancelled_caught else "done"


WINDOW = 1_000
"""The window of the agents with context management: the instructions and tool schemas
take about a third of it, so a stored history and a few turns reach the threshold."""
_KEEP = {"context_window_override": WINDOW, "preserve_recent_messages": 2}


async def remember(context: RunContext) -> list[str]:
    """The bounded view's memories: an instrumented await that may stall."""
    model = context.model
    if not isinstance(model, ChaosModel):
        return ["The user likes short answers."]
    chaos = model.chaos
    index = chaos.memories
    chaos.memories += 1
    await chaos.point("the memories")
    seconds = chaos.memory_stalls.get(index)
    if seconds is not None:
        chaos.fired["memory stall"] += 1
        await anyio.sleep(seconds)
    return ["The user likes short answers."]


@manage_context(**_KEEP)
class SummarizingAgent(ChaosAgent):
    """The default summarizer."""


@manage_context(
    **_KEEP,
    strategy=Pipeline(
        ToolResultCompaction(keep_last_tool_call_groups=1),
        Summarization(minimum_preserved=2, max_tokens=128),
    ),
)
class PipelineAgent(ChaosAgent):
    """Collapsed tool results, then a summary."""


@manage_context(**_KEEP, strategy=TurnExcerpts())
class ExcerptingAgent(ChaosAgent):
    """Turn excerpts: no summary call but in overflow recovery's first try."""


@manage_context(**_KEEP, mask_tool_results=1)
class MaskingAgent(ChaosAgent):
    """Observation masking before the summary."""


@manage_context(
    context_window_override=2 * WINDOW,
    budget=PromptBudget(
        prompt_budget_tokens=WINDOW,
        response_reserve_tokens=200,
        safety_reserve_tokens=100,
        memory=remember,
        memory_tokens=50,
        excerpt_tokens=64,
        floor_tokens=32,
    ),
    summarize=False,
)
class BoundedAgent(ChaosAgent):
    """A bounded view, never a model call for context."""


@manage_context(
    context_window_override=2 * WINDOW,
    compression_threshold=0.4,
    preserve_recent_messages=2,
    budget=PromptBudget(
        prompt_budget_tokens=WINDOW + WINDOW // 5,
        response_reserve_tokens=200,
        safety_reserve_tokens=100,
        memory=remember,
        memory_tokens=50,
        floor_tokens=32,
    ),
)
class BoundedSummarizingAgent(ChaosAgent):
    """A bounded view, then a summary when the view is still over the threshold."""


VARIANTS: dict[str, type[ChaosAgent]] = {
    "plain": ChaosAgent,
    "summary": SummarizingAgent,
    "pipeline": PipelineAgent,
    "turn excerpts": ExcerptingAgent,
    "masking": MaskingAgent,
    "bounded view": BoundedAgent,
    "bounded view and summaries": BoundedSummarizingAgent,
}
"""The agent classes of the runs: ``plain`` has no context management."""
BOUNDED = {"bounded view", "bounded view and summaries"}
"""The variants whose view leaves turns out without a record, by design (and whose runs
may end in a ``PromptBudgetError`` when a long turn outgrows the budget)."""
CONTEXT_SHARE = 0.4
"""The share of the runs with context management."""


@define
class Outcome:
    """What one run did."""

    elapsed: float
    stop_at: float | None
    """Seconds after the start when the deadline or the caller's cancellation came."""
    error: BaseException | None
    cancelled: bool
    violations: list[str]


@define
class Report:
    """The figures of a campaign."""

    runs: int = 0
    by_outcome: Counter[str] = field(factory=Counter)
    faults: Counter[str] = field(factory=Counter)
    violations: list[str] = field(factory=list)
    worst_overshoot: float = 0.0
    """The most a run took past its stop time, in seconds (the grace included)."""

    def add(self, outcome: Outcome, chaos: Chaos) -> None:
        self.runs += 1
        self.faults.update(chaos.fired)
        self.violations.extend(outcome.violations)
        if outcome.cancelled:
            self.by_outcome["cancelled by the caller"] += 1
        elif outcome.error is None:
            self.by_outcome["completed"] += 1
        else:
            self.by_outcome[type(outcome.error).__name__] += 1
        if outcome.stop_at is not None:
            self.worst_overshoot = max(self.worst_overshoot, outcome.elapsed - outcome.stop_at)

    def merge(self, other: Report) -> None:
        """Count ``other``'s runs as this report's too."""
        self.runs += other.runs
        self.by_outcome.update(other.by_outcome)
        self.faults.update(other.faults)
        self.violations.extend(other.violations)
        self.worst_overshoot = max(self.worst_overshoot, other.worst_overshoot)


def _plan(rng: random.Random, chaos: Chaos) -> tuple[list[list[str]], dict[str, Any]]:
    """A script of turns, the faults, and the run's stop. Stalls are long (up to 1.5 s)
    when the run has a timed stop, which must cut them to its grace; short otherwise."""
    if rng.random() < CONTEXT_SHARE:
        chaos.variant = rng.choice([name for name in VARIANTS if name != "plain"])
    chaos.fired[f"variant {chaos.variant}"] += 1
    turns = [
        [rng.choice(TOOLS) for _ in range(rng.choice((1, 1, 2, 3)))]
        for _ in range(rng.randint(0, 3))
    ]
    turns = [[name for name in names if name != "exit" or rng.random() < 0.15] for names in turns]
    for names in turns:
        chaos.fired.update(f"tool {name}" for name in names)
    stop: dict[str, Any] = {}
    roll = rng.random()
    if roll < 0.3:
        stop["timeout"] = rng.uniform(0.0, 0.3)
    elif roll < 0.5:
        stop["cancel_after"] = rng.uniform(0.0, 0.3)
        chaos.fired["caller cancel scope"] += 1
    elif roll < 0.75:
        chaos.cancel_at_point = rng.randint(0, 14 if chaos.variant == "plain" else 24)
    if "cancel_after" not in stop and any("hang" in names for names in turns):
        stop.setdefault("timeout", rng.uniform(0.0, 0.3))  # a hanging tool waits for a stop
    if "timeout" in stop:
        chaos.fired["deadline"] += 1
    longest = 1.5 if stop else 0.2
    for index in range(10):
        roll = rng.random()
        if roll < 0.06:
            chaos.store_faults[index] = ("store error", 0.0)
        elif roll < 0.09:
            chaos.store_faults[index] = ("store error after writing", 0.0)
        elif roll < 0.2:
            chaos.store_faults[index] = ("store stall", rng.uniform(0.01, longest))
        elif roll < 0.23:
            chaos.store_faults[index] = ("sqlite locked", rng.uniform(0.01, longest))
    for index in range(8):
        roll = rng.random()
        if roll < 0.04:
            chaos.model_faults[index] = ("model unavailable", 0.0)
        elif roll < 0.06:
            chaos.model_faults[index] = ("model rate limit", 0.0)
        elif roll < 0.08:
            chaos.model_faults[index] = ("model invalid request", 0.0)
        elif roll < 0.18:
            chaos.model_faults[index] = ("model stall", rng.uniform(0.01, longest))
    if chaos.variant != "plain":
        _plan_context_faults(rng, chaos, longest)
    chaos.fail_cleanup = rng.random() < 0.3
    stop["stream"] = rng.choice(("run", "stream", "stream and leave"))
    chaos.repeat_ids = rng.random() < 0.2
    chaos.replay = rng.random() < 0.2
    if chaos.repeat_ids and any(len(names) > 1 for names in turns):
        chaos.fired["repeated call ids"] += 1
    if chaos.replay:
        chaos.fired["replayed message id"] += 1
    return turns, stop


def _plan_context_faults(rng: random.Random, chaos: Chaos, longest: float) -> None:
    """Overflowing chat calls (sometimes the retried call too), faulty summary calls and
    stalling memories, for a run with context management."""
    for index in range(8):
        if index in chaos.model_faults or rng.random() >= 0.14:
            continue
        kind = rng.choice(("model overflow", "model overflow with figures"))
        chaos.model_faults[index] = (kind, rng.choice((WINDOW // 2, WINDOW, 3 * WINDOW)))
        if rng.random() < 0.35:  # the retried call overflows too
            chaos.model_faults[index + 1] = ("model overflow", 0.0)
    for index in range(6):
        roll = rng.random()
        if roll < 0.1:
            chaos.summary_faults[index] = ("summary error", 0.0)
        elif roll < 0.2:
            chaos.summary_faults[index] = ("summary stall", rng.uniform(0.01, longest))
        elif roll < 0.27:
            chaos.summary_faults[index] = ("summary empty", 0.0)
        elif roll < 0.32:
            chaos.summary_faults[index] = ("summary overflow", 0.0)
        elif roll < 0.37:
            chaos.summary_faults[index] = ("summary overflow with figures", float(2 * WINDOW))
        elif roll < 0.42:
            chaos.summary_faults[index] = ("summary at its cap", 0.0)
    chaos.counting = rng.random() < 0.8  # counts come in recoveries only: rare
    for index in range(4):
        roll = rng.random()
        if roll < 0.12:
            chaos.count_faults[index] = ("count error", 0.0)
        elif roll < 0.24:
            chaos.count_faults[index] = ("count stall", rng.uniform(0.01, longest))
        elif roll < 0.36:
            chaos.count_faults[index] = ("count over the window", 0.0)
    for index in range(6):
        if rng.random() < 0.1:
            chaos.memory_stalls[index] = rng.uniform(0.01, longest)
    if chaos.cancel_at_point is None and rng.random() < 0.25:
        where = rng.choice(
            ("a summary call", "a compaction record's append", "the memories", "a prompt count")
        )
        chaos.cancel_at_labelled = (where, rng.randint(0, 1))


def history(rng: random.Random) -> list[Message]:
    """A stored conversation for a run with context management: a few turns, with tool
    calls, so that the run's first compaction comes soon."""
    log: list[Message] = []
    for turn in range(rng.randint(2, 7)):
        log.append(Message.user(f"Earlier question {turn}: order A-{turn}, {FILLER}"))
        if rng.random() < 0.5:
            call = ToolCall(f"old-{turn}", "quick")
            log.append(Message.assistant(tool_calls=[call]))
            log.append(Message.tool(call.id, f"quick {FILLER}"))
        log.append(Message.assistant(f"Earlier answer {turn}: {FILLER}"))
    return log


HOOK_FAULTS = ("error", "cancellation")
STRATEGIES = ("auto", "native", "tool")
"""The ``output_strategy`` of a run with an ``output_type``."""
EXTRA_SHARE = 0.5
"""The share of the runs that draw extras (``_plan_extras``), from a generator of their
own: a run without extras is the run it was before they came."""


@attrs.frozen
class Ticket:
    """The ``output_type`` of the runs that draw one."""

    order_id: str
    urgent: bool


@define
class Drawn:
    """What a run drew besides its faults: a stream consumer's ways, an ``output_type``,
    ``max_turns``, and a run or ``compact_session`` of the same session beside it."""

    consumer: str | None = None
    output_strategy: str = "auto"
    max_turns: int | None = None
    beside: str | None = None
    """``racing run`` or ``compaction``: started ``delay`` seconds after the run."""
    delay: float = 0.0
    limits: dict[str, int] = field(factory=dict)
    """``max_tool_calls`` and ``max_tool_result_tokens``, when drawn."""
    racers: int = 0
    """Faulty runs of the same session started beside the run (``sub_run``)."""
    beside_stop: float | None = None
    """The deadline of the racing run, or of a cancel scope around ``compact_session``."""
    tools: bool = False


def _plan_extras(chaos: Chaos, turns: list[list[str]], stop: dict[str, Any]) -> Drawn:
    """Draw the extras of a run (``EXTRA_SHARE`` of them) from ``chaos.extra``."""
    rng = chaos.extra
    assert rng is not None
    extras = Drawn()
    if rng.random() >= EXTRA_SHARE:
        return extras
    if stop["stream"] != "run" and rng.random() < 0.5:
        extras.consumer = rng.choice(("stream slowly", "stream and raise"))
        chaos.fired[f"consumer: {extras.consumer}"] += 1
    if rng.random() < 0.2:
        chaos.note_turn = rng.randint(0, 2)
    chaos.inject = rng.random() < 0.15
    chaos.redact = rng.random() < 0.15
    chaos.edit_response = rng.random() < 0.15
    chaos.rename_calls = rng.random() < 0.15
    chaos.edit_result = rng.random() < 0.15
    if rng.random() < 0.3:
        chaos.output = rng.choice(("fits", "misfit once", "misfit"))
        extras.output_strategy = rng.choice(STRATEGIES)
        chaos.fired[f"output {chaos.output}, {extras.output_strategy}"] += 1
    if rng.random() < 0.2:
        chaos.hook_fault = (rng.choice(("before_tool", "after_tool")), rng.choice(HOOK_FAULTS))
    if rng.random() < 0.15:
        extras.max_turns = rng.randint(1, 3)
        chaos.fired["max_turns"] += 1
    if rng.random() < 0.1:
        extras.limits["max_tool_calls"] = rng.randint(1, 3)
        chaos.fired["max_tool_calls"] += 1
    if rng.random() < 0.1:
        extras.limits["max_tool_result_tokens"] = rng.choice((1, 3))
        chaos.fired["max_tool_result_tokens"] += 1
    for name in EXTRA_TOOLS:
        if turns and rng.random() < 0.2:
            rng.choice(turns).append(name)
            extras.tools = True
            chaos.fired[f"tool {name}"] += 1
    if chaos.postgres is not None and rng.random() < 0.3:
        chaos.store_faults[rng.randint(0, 4)] = ("postgres lock ended", 0.0)
    if chaos.postgres is not None and rng.random() < 0.3:
        longest = 1.5 if stop.keys() - {"stream"} else 0.2
        chaos.store_faults[rng.randint(0, 4)] = ("postgres busy", rng.uniform(0.01, longest))
    roll = rng.random()
    if roll < 0.1:
        extras.racers = rng.randint(1, 2)
        chaos.fired[f"{extras.racers} racing faulty runs"] += 1
    elif roll < 0.3:
        extras.beside = "racing run" if roll < 0.2 else "compaction"
        extras.delay = rng.uniform(0.0, 0.2)
        chaos.fired[f"beside: {extras.beside}"] += 1
        if rng.random() < 0.5:
            extras.beside_stop = rng.uniform(0.0, 0.3)
            chaos.fired[f"beside: {extras.beside} with a deadline"] += 1
    return extras


MORE_SHARE = 0.5
"""The share of the runs that draw further extras (``_plan_more``), from a generator of
their own (``Chaos.more``): a run without them is the run it was before they came."""
HOOK_KINDS = ("before_model", "after_model", "before_tool", "after_tool", "after_model_error")


@define
class More:
    """What a run drew among the further extras: how it is given its deadline, its
    consumer's ``aclose()``, a model made from a model string that the agent closes, and
    who closes the agent while the run goes on."""

    absolute: bool = False
    """``deadline=`` (an anyio time) in place of ``timeout=``."""
    max_retries: int = 0
    owned: bool = False
    """The agent's model is a model string (``chaos:<session>``): the agent closes it."""
    closing: str | None = None
    """``aclose beside`` (a task closes the agent ``close_after`` seconds in) or ``async
    with`` (the run goes on in the block of ``async with agent:``)."""
    close_after: float = 0.0
    summary_stall: float | None = None
    """The summary model of a ``compact_session`` beside the run stalls this long."""


def _plan_more(chaos: Chaos, turns: list[list[str]], stop: dict[str, Any]) -> More:
    """Draw the further extras of a run (``MORE_SHARE`` of them) from ``chaos.more``:
    faults of the store's ``load``, hooks of every kind that stall or raise, retried model
    errors (a rate limit's ``retry_after`` beyond the deadline too), a model whose
    ``prepare()`` stalls, ``deadline=``, a stream consumer that calls ``events.aclose()``
    in its loop, a model made from a model string whose ``aclose()`` stalls or fails, the
    agent closed while the run goes on (``aclose()`` beside it, or ``async with agent:``),
    a summary model of a ``compact_session`` beside the run that stalls, and a store
    ``lock`` that fails as it releases the session."""
    rng = chaos.more
    assert rng is not None
    more = More()
    if rng.random() >= MORE_SHARE:
        return more
    longest = 1.5 if stop.keys() - {"stream"} else 0.2
    roll = rng.random()
    if roll < 0.08:
        chaos.load_fault = ("load error", 0.0)
    elif roll < 0.2:
        chaos.load_fault = ("load stall", rng.uniform(0.01, longest))
    for kind in HOOK_KINDS:
        if rng.random() < 0.12:
            chaos.hook_stalls[kind] = rng.uniform(0.01, longest)
    if chaos.hook_fault is None and rng.random() < 0.2:
        where = rng.choice(("before_model", "after_model", "after_model_error"))
        chaos.hook_fault = (where, rng.choice(HOOK_FAULTS))
    if rng.random() < 0.3:
        more.max_retries = rng.randint(1, 2)
        chaos.retry_after = rng.choice((0.01, 0.2, 5.0))
        chaos.fired[f"max_retries {more.max_retries}"] += 1
    if rng.random() < 0.08:
        chaos.prepare_stall = rng.uniform(0.01, longest)
    if "timeout" in stop and rng.random() < 0.3:
        more.absolute = True
        chaos.fired["deadline="] += 1
    if stop["stream"] != "run" and rng.random() < 0.25:
        stop["stream"] = "stream and aclose"
    if rng.random() < 0.3:
        more.owned = True
        chaos.fired["model from a model string"] += 1
        roll = rng.random()
        if roll < 0.15:
            chaos.close_fault = ("close error", 0.0)
        elif roll < 0.3:
            chaos.close_fault = ("close stall", rng.uniform(0.01, longest))
    if rng.random() < (0.7 if more.owned else 0.2):  # closing a model made from a string
        more.closing = rng.choice(("aclose beside", "async with"))
        more.close_after = rng.uniform(0.0, 0.3)
        chaos.fired[f"closing: {more.closing}"] += 1
    if rng.random() < 0.15:
        more.summary_stall = rng.uniform(0.01, longest)
    if rng.random() < 0.06:  # last: the draws above are as they were before it came
        chaos.release_fault = "release error"
    return more


_OWNED: dict[str, ChaosModel] = {}
"""The models ``chaos:<session>`` model strings resolve to, made by ``one_run``."""


def _owned(name: str | None) -> ChaosModel:
    assert name is not None
    return _OWNED.pop(name)


register_provider("chaos", _owned)


async def one_run(
    rng: random.Random,
    inner: SessionStore,
    session_id: str,
    tolerance: float = TOLERANCE,
    postgres: str | None = None,
) -> tuple[Outcome, Chaos]:
    """Run one faulty run, check it, then a fault-free run of its session, and check that
    (``postgres``: the connection string of ``inner``, a PostgreSQL store)."""
    chaos = Chaos(rng, inner=inner, session_id=session_id, postgres=postgres)
    chaos.extra = random.Random(f"{rng.getstate()[1][:4]}-extras")
    chaos.more = random.Random(f"{rng.getstate()[1][:4]}-more")
    turns, stop = _plan(rng, chaos)
    extras = _plan_extras(chaos, turns, stop)
    more = _plan_more(chaos, turns, stop)
    store = ChaosStore(inner, chaos)
    kind = VARIANTS[chaos.variant]
    if extras.tools:
        kind = with_extras(kind)
    earlier = history(rng) if chaos.variant != "plain" else []
    if not earlier and extras.beside == "compaction":
        earlier = history(chaos.extra)
    if earlier:
        await inner.append(session_id, earlier)
    options: dict[str, Any] = {}
    if chaos.output is not None:
        options.update(output_type=Ticket, output_strategy=extras.output_strategy)
    if extras.max_turns is not None:
        options["max_turns"] = extras.max_turns
    options.update(extras.limits)
    if more.max_retries:
        options["max_retries"] = more.max_retries
    model: ChaosModel | str = ChaosModel(turns, chaos)
    if more.owned:
        _OWNED[session_id], model = model, f"chaos:{session_id}"
    agent = kind(model=model, session_store=store, **options)
    violations: list[str] = []
    error: BaseException | None = None
    result: Any = None
    others: set[str] = set()
    began = time.monotonic()
    stop_at: float | None = None
    timeout = stop.get("timeout")
    if timeout is not None:
        stop_at = timeout
    mode = extras.consumer or stop["stream"]
    marking = anyio.CancelScope()
    planned = min((t for t in (timeout, stop.get("cancel_after")) if t is not None), default=None)
    async with anyio.create_task_group() as group:
        if planned is not None:
            group.start_soon(_mark_stop, chaos, began + planned, marking)
        if extras.beside is not None:
            beside = partial(_beside, stall=more.summary_stall)
            group.start_soon(beside, extras, inner, session_id, kind, others, violations)
        if more.closing == "aclose beside":
            group.start_soon(_close_beside, agent, more.close_after, chaos, violations)
        for _ in range(extras.racers):
            group.start_soon(partial(sub_run, chaos, racing=True))
        try:
            with anyio.CancelScope() as scope:
                chaos.scope = scope
                if "cancel_after" in stop:
                    scope.deadline = anyio.current_time() + stop["cancel_after"]
                    chaos.cancelled_at = began + stop["cancel_after"]
                try:
                    drive = partial(_drive, absolute=more.absolute)
                    if more.closing == "async with":
                        async with agent:
                            result = await drive(agent, session_id, timeout, mode, rng, chaos)
                    else:
                        result = await drive(agent, session_id, timeout, mode, rng, chaos)
                except (Exception, SystemExit) as caught:
                    error = caught
        except anyio.get_cancelled_exc_class() as stray:  # not the scope's own: it would catch it
            error = stray
            if stray is not chaos.hook_raised:
                violations.append("a cancellation escaped that nobody asked for")
        elapsed = time.monotonic() - began
        waited = waited_since(chaos.waited_at_stop, cpu_wait())
        marking.cancel()
    cancelled = scope.cancelled_caught
    if isinstance(error, CleanupError) and scope.cancel_called:  # a close failing after it
        violations.append("a CleanupError replaced the caller's cancellation")
    cancel_at = None if chaos.cancelled_at is None else chaos.cancelled_at - began
    if cancel_at is not None and cancel_at < elapsed:
        stop_at = cancel_at if stop_at is None else min(stop_at, cancel_at)
    else:
        cancel_at = None
    violations.extend(_check_outcome(error, cancelled, chaos, cancel_at, timeout, began))
    violations.extend(_overflow_problems(error, chaos))
    violations.extend(_output_problems(error, result, chaos))
    violations.extend(_stream_problems(chaos))
    if stop_at is not None and elapsed - waited > stop_at + GRACE + tolerance:
        violations.append(
            f"ended {elapsed - stop_at:.3f} s after its stop time (grace {GRACE} s; "
            f"{waited:.3f} s of it waiting for a CPU)"
        )
    if isinstance(error, SystemExit) and "exit" not in {n for names in turns for n in names}:
        violations.append("SystemExit from nowhere")
    violations.extend(f"the faulty run: {problem}" for problem in chaos.shown)
    violations.extend(chaos.sub_violations)
    stored = await inner.load(session_id)
    violations.extend(f"after the faulty run: {problem}" for problem in log_problems(stored))
    violations.extend(_reported_problems(chaos, stored, error))
    racing = [chaos, *chaos.racers]
    for run in racing:
        near = others.union(*(other.attempted for other in racing if other is not run))
        violations.extend(_store_first(run.context, stored, near))
    for sub in chaos.subs:
        kept = await inner.load(sub.session_id)
        violations.extend(f"{sub.session_id}: {problem}" for problem in log_problems(kept))
        violations.extend(f"{sub.session_id}: {p}" for p in _store_first(sub.context, kept, set()))
        repaired = await _repair(inner, sub.session_id, VARIANTS[sub.variant])
        violations.extend(f"{sub.session_id}: {problem}" for problem in repaired)
    violations.extend(await _repair(inner, session_id, kind))
    described = [f"{session_id} ({turns}, {stop}, {chaos.fired}): {v}" for v in violations]
    return Outcome(elapsed, stop_at, error, cancelled, described), chaos


async def _beside(
    extras: Drawn,
    inner: SessionStore,
    session_id: str,
    kind: type[ChaosAgent],
    others: set[str],
    problems: list[str],
    *,
    stall: float | None = None,
) -> None:
    """A fault-free run, or ``compact_session``, of the faulty run's session, started
    beside it: it waits for the session and never fails (but at its deadline, or with
    nothing to compact, or no session yet), ends within its deadline (and the run's grace), and what it asks
    its store to append is in ``others``."""
    await anyio.sleep(extras.delay)
    recorded = Chaos(random.Random(0))
    store = ChaosStore(inner, recorded)  # no faults: it records what is appended
    began = time.monotonic()
    stop = extras.beside_stop
    try:
        if extras.beside == "racing run":
            await _race(kind, store, session_id, stop, problems)
            return
        summarizer = Checking(stall=stall)
        strategy: CompactionStrategy = Summarization(model=summarizer, minimum_preserved=2)
        with anyio.move_on_after(stop if stop is not None else math.inf):
            try:
                await compact_session(store, session_id, strategy)
            except (CompactionError, UnknownSessionError):
                pass  # nothing to compact, or no session yet: the run had written nothing
            except Exception as error:
                problems.append(f"compact_session beside the run failed: {error!r}")
        late = time.monotonic() - began - (stop or math.inf)
        if late > TOLERANCE:
            problems.append(f"compact_session ended {late:.3f} s after its scope's deadline")
    finally:
        others.update(recorded.attempted)


async def _race(
    kind: type[ChaosAgent],
    store: SessionStore,
    session_id: str,
    stop: float | None,
    problems: list[str],
) -> None:
    model = Checking("Race.")
    began = time.monotonic()
    try:
        await kind(model=model, session_store=store).run(
            "Race.", session_id=session_id, timeout=stop or REPAIR_TIMEOUT
        )
    except Exception as error:
        late = time.monotonic() - began - (stop or math.inf) - GRACE
        if not isinstance(error, DeadlineExceededError) or stop is None:
            problems.append(f"the racing run failed: {error!r}")
        elif late > TOLERANCE:
            problems.append(f"the racing run ended {late:.3f} s past its deadline and grace")
    problems.extend(f"racing run: {problem}" for problem in model.problems)


class Left(Exception):
    """A stream consumer's own exception, raised in its loop."""


async def _drive(
    agent: Agent,
    session_id: str,
    timeout: float | None,
    mode: str,
    rng: random.Random,
    chaos: Chaos,
    *,
    absolute: bool = False,
) -> Any:
    """Run ``agent`` through ``run()`` or ``stream()`` (a consumer that reads everything,
    leaves with a ``break``, reads slowly, raises in its loop, or calls ``events.aclose()``
    in it: that exception, and no other, leaves the block); its result, if it completed.
    What the events reported, and ``events.messages`` after a consumer left, go to
    ``chaos``. ``absolute``: the timeout is given as ``deadline=``."""
    timing: dict[str, float | None] = {"timeout": timeout}
    if absolute and timeout is not None:
        timing = {"deadline": anyio.current_time() + timeout}
    if mode == "run":
        return await agent.run("Go.", session_id=session_id, **timing)
    leave_after = rng.randint(1, 6)
    stream = agent.stream("Go.", session_id=session_id, **timing)
    try:
        async with stream as events:
            seen = 0
            async for event in events:
                seen += 1
                if isinstance(event, ToolCallFinished):
                    chaos.reported.append(event.result)
                if mode == "stream slowly":
                    await anyio.sleep(rng.uniform(0.0, 0.1))
                elif mode == "stream and raise" and seen >= leave_after:
                    raise Left
                elif mode == "stream and leave" and seen >= leave_after:
                    break
                elif mode == "stream and aclose" and seen == leave_after:
                    await _aclose_stream(events, chaos)
    except Left:
        chaos.left = events.messages
        return None
    if mode in ("stream and leave", "stream and aclose") and seen >= leave_after:
        chaos.left = events.messages
    return events.result if mode in ("stream", "stream slowly") else None


async def _aclose_stream(events: Any, chaos: Chaos) -> None:
    """``events.aclose()`` in the consumer's loop: it stops the run and returns once the
    run has stopped, within the grace of the stop it makes (what it took past that is a
    problem of the run's)."""
    chaos.fired["consumer: events.aclose()"] += 1
    began = time.monotonic()
    await events.aclose()
    took = time.monotonic() - began
    if took > GRACE + TOLERANCE:
        chaos.shown.append(f"events.aclose() took {took:.3f} s (grace {GRACE} s)")


async def _mark_stop(chaos: Chaos, at: float, scope: anyio.CancelScope) -> None:
    """Note ``cpu_wait()`` when ``at`` (a ``time.monotonic()``: the run's timed stop) has
    come, if no earlier stop did; late rather than early, so the wait is never overstated."""
    with scope:
        await anyio.sleep(max(0.0, at - time.monotonic()))
        if chaos.waited_at_stop is None:
            chaos.waited_at_stop = cpu_wait()


async def _close_beside(agent: Agent, delay: float, chaos: Chaos, problems: list[str]) -> None:
    """``agent.aclose()`` from a task beside the run, ``delay`` seconds in: it returns (or
    raises ``CleanupError``, when closing its model fails) within the grace, and never
    disturbs the run going on."""
    await anyio.sleep(delay)
    began = time.monotonic()
    try:
        await agent.aclose()
    except CleanupError:
        if chaos.close_fault is None:
            problems.append("aclose() beside the run raised CleanupError with no close fault")
    except Exception as error:
        problems.append(f"aclose() beside the run raised {error!r}")
    took = time.monotonic() - began
    if took > GRACE + TOLERANCE:
        problems.append(f"aclose() beside the run took {took:.3f} s (grace {GRACE} s)")


def _stream_problems(chaos: Chaos) -> list[str]:
    """A consumer that left early finds every call of ``events.messages`` answered (it can
    pass them back as ``history=``), unless a store fault kept the run from storing the
    answers."""
    if chaos.left is None or not _cleanup_done(chaos):
        return []
    left = build_view(chaos.left)  # what a run given them as `history=` shows the model
    return [f"events.messages after leaving: {p}" for p in request_problems(left)]


def _reported_problems(
    chaos: Chaos, stored: Sequence[Message], error: BaseException | None
) -> list[str]:
    """Every result a ``ToolCallFinished`` reported is in the store; after a hook raised
    (and no store fault, of the run's or of a run racing it), every call is answered."""
    kept = {(r.call_id, r.content) for m in stored for r in m.tool_results}
    problems = [
        f"a reported result is not stored: {result.call_id}"
        for result in chaos.reported
        if (result.call_id, result.content) not in kept
    ]
    problems.extend(
        f"a side tool was stopped at its timeout: {result.content}"
        for result in chaos.reported
        if result.is_error and f"within {SIDE_TIMEOUT:g} s" in result.content
    )
    raised = error is not None and error is chaos.hook_raised
    cleaned = all(map(_cleanup_done, [chaos, *chaos.racers]))
    if raised and unanswered(stored) and cleaned:
        problems.append(f"a call is left open after a hook raised {error!r}")
    return problems


def _cleanup_done(chaos: Chaos) -> bool:
    """No store fault of the run's own, and its cleanup did all it had to (within the
    grace: on a store other runs keep busy it may not)."""
    store_faults = ("store", "sqlite", "postgres")
    if any(kind.startswith(store_faults) for kind in chaos.fired):
        return False
    grace = chaos.context.grace if chaos.context is not None else None
    return grace is None or not (grace.failures or grace.uncertain)


def _output_problems(error: BaseException | None, result: Any, chaos: Chaos) -> list[str]:
    """With an ``output_type``: a completed run's output is a ``Ticket``, never from
    misfit answers alone; an ``OutputValidationError`` only after a misfit."""
    if chaos.output is None:
        if isinstance(error, OutputValidationError):
            return [f"an OutputValidationError without an output type: {error}"]
        return []
    problems = []
    if result is not None and not isinstance(result.output, Ticket):
        problems.append(f"a typed run's output is {result.output!r}")
    if result is not None and chaos.output == "misfit":
        problems.append("a run whose answers never fit completed")
    if isinstance(error, OutputValidationError) and chaos.output == "fits":
        problems.append(f"an OutputValidationError when every answer fits: {error}")
    return problems


def _check_outcome(
    error: BaseException | None,
    cancelled: bool,
    chaos: Chaos,
    cancel_at: float | None,
    timeout: float | None,
    began: float,
) -> list[str]:
    """Only documented errors escape; in a run no fault ended, a failed cleanup write never
    escapes, and a cancellation at an await before the deadline is what ended the run
    (a cancellation by a timer may race the run's last step, fairly)."""
    problems = []
    documented = (*DOCUMENTED, *((PromptBudgetError,) if chaos.variant in BOUNDED else ()))
    documented += (OutputValidationError,) if chaos.output is not None else ()
    documented += (CleanupError,) if chaos.close_fault is not None else ()
    allowed = (*documented, SystemExit)
    if error is not None and not isinstance(error, allowed) and error is not chaos.hook_raised:
        problems.append(f"undocumented {type(error).__name__}: {error!r}")
    if chaos.ending_fault_at is not None:
        return problems  # a fault may end the run first; the race is fair either way
    if isinstance(error, SessionStoreError):
        problems.append("a failed cleanup write escaped in place of the run's stop")
    by_point = chaos.cancelled_at_point
    first = cancel_at is not None and (timeout is None or cancel_at < timeout)
    if by_point and first and not cancelled and not isinstance(error, SystemExit):
        replaced = type(error).__name__ if error is not None else "a result"
        problems.append(f"the caller's cancellation was replaced by {replaced}")
    return problems


def _overflow_problems(error: BaseException | None, chaos: Chaos) -> list[str]:
    """A turn recovers from overflow at most once: a second overflow ends the run, caused
    by the first; a first overflow escapes only when its recovery failed, caused by a
    ``CompactionError``; a recovery from an overflow without figures at least halves the
    request; a ``CompactionError`` never escapes."""
    problems = []
    if isinstance(error, CompactionError):
        problems.append(f"a CompactionError escaped: {error}")
    turns = Counter(turn for turn, _ in chaos.overflows)
    for turn, count in turns.items():
        calls = [what for when, what in chaos.chat_calls if when == turn]
        if count > 2 or (count == 2 and calls[-1] != "overflow"):
            problems.append(f"turn {turn} was recovered from overflow more than once: {calls}")
    pairs = zip(chaos.sizes, chaos.sizes[1:], strict=False)
    for (turn, size, blind, _), (then, retried, _, scaled) in pairs:
        if blind and not scaled and then == turn and retried > size // 2:  # in the same units
            problems.append(f"an overflow without figures was retried at {retried} of {size}")
    if not isinstance(error, ContextWindowOverflowError):
        return problems
    raised = [(turn, overflow) for turn, overflow in chaos.overflows if overflow is error]
    if not raised:
        return [*problems, f"an overflow no chat call raised escaped: {error!r}"]
    turn = raised[0][0]
    first = next(overflow for when, overflow in chaos.overflows if when == turn)
    cause = error.__cause__
    if first is error and not isinstance(cause, CompactionError):
        problems.append(f"a failed recovery's overflow is caused by {cause!r}")
    elif first is not error and cause is not first:
        problems.append(f"a second overflow in a turn is caused by {cause!r}, not the first")
    return problems


def _store_first(
    context: RunContext | None, stored: Sequence[Message], others: set[str]
) -> list[str]:
    """The run's log is what the store has: never more, and less only when a write
    failed or was cut off with its outcome unknown (then the store may hold that write)
    or another run or a compaction of the session (``others``) came after it."""
    if context is None:
        return []
    logged = [message.id for message in context.messages]
    kept = [message.id for message in stored]
    if kept[: len(logged)] != logged:
        return ["the run's log holds a message the store does not"]
    later = [message_id for message_id in kept[len(logged) :] if message_id not in others]
    if later and not context.grace.uncertain:
        return ["the store holds a message the run's log does not, with no write in doubt"]
    return []


def log_problems(log: Sequence[Message]) -> list[str]:
    """What is wrong with a stored log: duplicate ids, results before their call, calls
    answered twice (calls that share an id counted apart), a compaction record that
    covers nothing or a message not stored before it, a message two summaries cover."""
    problems = []
    ids = [message.id for message in log]
    if len(ids) != len(set(ids)):
        problems.append("a message is stored twice")
    made: set[str] = set()
    waiting: Counter[str] = Counter()
    before: set[str] = set()
    summarized: set[str] = set()
    for message in log:
        if is_record(message):
            covers = record_covers(message)
            if not covers or not before.issuperset(covers):
                problems.append(f"a compaction record covers {covers}, not messages before it")
            if message.is_summary and summarized.intersection(covers):
                problems.append("a message is summarized twice")
            summarized.update(covers if message.is_summary else ())
        before.add(message.id)
        made.update(call.id for call in message.tool_calls)
        waiting.update(call.id for call in message.tool_calls)
        for result in message.tool_results:
            if waiting[result.call_id]:
                waiting[result.call_id] -= 1
            elif result.call_id in made:
                problems.append(f"call {result.call_id} answered twice")
            else:
                problems.append(f"a result for {result.call_id} before its call")
    return problems


def request_problems(messages: Sequence[Message]) -> list[str]:
    """What a provider would reject in a request: a message id shown twice, a call not
    answered once by the tool messages right after it, a result anywhere else."""
    problems = []
    if len({message.id for message in messages}) != len(messages):
        problems.append("the model was shown two messages with one id")
    waiting: Counter[str] = Counter()
    for message in messages:
        answered = Counter(result.call_id for result in message.tool_results)
        if waiting and not answered:
            problems.append("the model was shown a call without its result")
        if answered - waiting:
            problems.append("the model was shown a result without its call")
        waiting -= answered
        waiting.update(call.id for call in message.tool_calls)
    if waiting:
        problems.append("the model was shown a call without its result")
    return problems


def view_problems(
    messages: Sequence[Message],
    context: RunContext | None,
    question: str,
    unseen: frozenset[str] | set[str] = frozenset(),
) -> list[str]:
    """``request_problems``, and with context management: the current ``question`` is
    shown; every message of the run's log that no record hides is shown (with a bounded
    view, which leaves older turns out by design, those of the current turn, but for a
    record of older turns only, or of such records, that an overflow's recovery logged in
    it); logged messages
    keep the order the view gives them (a message appended while calls were open after
    their results), and summaries come before them; a message a ``before_model`` hook
    appended (``unseen``) is not due in that turn."""
    problems = request_problems(messages)
    agent = context.agent if context is not None else None
    if context is None or getattr(agent, "context_management", None) is None:
        return problems
    if not any(m.role is Role.USER and m.text == question for m in messages):
        problems.append("the model was not shown the current question")
    log = context.messages
    hidden = {covered for message in log for covered in record_covers(message)}
    hidden.update(m.id for m in log if m.metadata.get(COMPACTION_KIND_KEY) == EXCLUSION)
    shown = {message.id for message in messages}
    due = log
    if agent.context_management.budget is not None:
        asked = [i for i, m in enumerate(log) if m.role is Role.USER and m.text == question]
        due = log[asked[-1] :] if asked else []
        older = {m.id for m in log[: asked[-1]]} if asked else set()
        for message in due:  # a record of older turns, perhaps through an earlier record
            if is_record(message) and older.issuperset(record_covers(message)):
                older.add(message.id)
        due = [m for m in due if m.id not in older]
    lost = [m.id for m in due if m.id not in hidden | unseen and m.id not in shown]
    if lost:
        problems.append(f"the model was not shown {len(lost)} logged message(s) no record hides")
    # a message appended while calls were open (a tool's) comes after their results
    position = {m.id: i for i, m in enumerate(build_view(log)) if not is_record(m)}
    order = [position[m.id] for m in messages if m.id in position]
    if order != sorted(order):
        problems.append("the model was shown logged messages out of their order")
    kinds = [m.is_summary for m in messages if m.id in position or m.is_summary]
    if True in kinds and False in kinds[: len(kinds) - kinds[::-1].index(True)]:
        problems.append("the model was shown a summary after a logged message")
    return problems


def summary_request_problems(request: ModelRequest) -> list[str]:
    """What a summary request must not carry: tools, tool-call blocks."""
    problems = []
    if request.tools:
        problems.append("a summary request offered tools")
    if any(m.tool_calls or m.tool_results for m in request.messages):
        problems.append("a summary request carried tool-call blocks")
    return problems


def unanswered(log: Sequence[Message]) -> list[str]:
    """Calls of ``log`` without a result."""
    pending: dict[str, int] = {}
    for message in log:
        for call in message.tool_calls:
            pending[call.id] = pending.get(call.id, 0) + 1
        for result in message.tool_results:
            if pending.get(result.call_id):
                pending[result.call_id] -= 1
    return [call_id for call_id, count in pending.items() if count]


class Checking:
    """A fault-free model that checks the request it is shown is one a provider accepts
    (and, with context management, holds the question and every message not compacted);
    it answers summary calls too."""

    provider = "checking"
    name = "checking"
    context_window = None

    def __init__(self, question: str = "And now?", *, stall: float | None = None) -> None:
        self.problems: list[str] = []
        self.question = question
        self.context: RunContext | None = None
        self.stall = stall
        """Each summary call stalls this long."""

    async def respond(self, request: ModelRequest) -> ModelResponse:
        if request.purpose == SUMMARY_PURPOSE:
            self.problems.extend(summary_request_problems(request))
            if self.stall is not None:
                await anyio.sleep(self.stall)
            return text_response("- The user asked to go.")
        self.problems.extend(view_problems(request.messages, self.context, self.question))
        return text_response("repaired")


REPAIR_TIMEOUT = 30
"""A safety net, not a figure checked: with 20 runs at a time sharing one SQLite store
(one thread of its own) on a busy machine, a repair run has been seen to wait 10 s."""


async def _repair(inner: SessionStore, session_id: str, kind: type[ChaosAgent]) -> list[str]:
    model = Checking()
    agent = kind(model=model, session_store=inner)
    try:
        await agent.run(model.question, session_id=session_id, timeout=REPAIR_TIMEOUT)
    except Exception as error:
        return [f"the repair run failed: {type(error).__name__}: {error}"]
    log = await inner.load(session_id)
    problems = [f"after the repair run: {problem}" for problem in log_problems(log)]
    if unanswered(log):
        problems.append("after the repair run: a call is unanswered")
    return problems + [f"repair run: {problem}" for problem in model.problems]


@asynccontextmanager
async def _store(
    kind: str, directory: Path, postgres: str | None = None
) -> AsyncIterator[SessionStore]:
    if kind == "memory":
        yield InMemorySessionStore()
    elif kind == "postgres":
        from littleghost.sessions import PostgresSessionStore

        assert postgres is not None
        async with PostgresSessionStore(postgres, max_connections=4) as store:
            yield store
    else:
        async with SQLiteSessionStore(directory / "faults.db", timeout=5) as store:
            yield store


async def campaign(
    seed: int,
    runs: int,
    *,
    directory: Path,
    concurrency: int = 20,
    store_kind: str = "mixed",
    tolerance: float = TOLERANCE,
    postgres: str | None = None,
) -> Report:
    """Run ``runs`` faulty runs (``concurrency`` at a time) and report on them.

    Args:
        seed: Seeds every random choice (each run has its own generator from it).
        runs: How many runs.
        directory: Where the SQLite store lives.
        concurrency: Runs at the same time (each on its own session).
        store_kind: ``memory``, ``sqlite``, ``postgres``, or ``mixed`` (every other run on
            each; every third with ``postgres``).
        tolerance: What a run may take past its stop time plus the grace.
        postgres: A PostgreSQL connection string, for the ``postgres`` store.
    """
    report = Report()
    limiter = anyio.Semaphore(concurrency)
    freeze_heap()
    await _runs(report, limiter, seed, runs, directory, store_kind, tolerance, postgres)
    return report


def freeze_heap() -> None:
    """Leave what the heap holds now out of every later garbage collection (Python's
    ``gc.freeze()``, after a collection): a full collection of a big heap (a test
    process's, say) stops every thread for a good part of a second, a pause a campaign
    would take for its runs'."""
    gc.collect()
    gc.freeze()


async def _runs(
    report: Report,
    limiter: anyio.Semaphore,
    seed: int,
    runs: int,
    directory: Path,
    store_kind: str,
    tolerance: float,
    postgres: str | None,
) -> None:
    kinds = ("memory", "sqlite", "postgres")[: 3 if postgres else 2]
    if store_kind != "mixed":
        kinds = (store_kind,)
    async with AsyncExitStack() as stack:
        if postgres is not None:  # a schema of the campaign's own
            postgres = await stack.enter_async_context(postgres_schema(postgres))
        stores = {
            kind: await stack.enter_async_context(_store(kind, directory, postgres))
            for kind in kinds
        }

        async def one(index: int) -> None:
            async with limiter:
                rng = random.Random(f"{seed}-{index}")
                kind = kinds[index % len(kinds)]
                inner = stores[kind]
                conninfo = postgres if kind == "postgres" else None
                outcome, chaos = await one_run(rng, inner, f"run-{index}", tolerance, conninfo)
                chaos.fired[f"{kind} store"] += 1
                report.add(outcome, chaos)

        async with anyio.create_task_group() as group:
            for index in range(runs):
                group.start_soon(one, index)


async def one_threaded_run(rng: random.Random, session_id: str) -> tuple[Outcome, Chaos]:
    """A faulty run through ``run_sync()`` in a worker thread (an event loop of its own),
    on a store of plain dicts (``PlainStore``: no lock, nothing bound to an event loop),
    stopped by its deadline alone (a caller's scope cannot reach into the thread), with
    the further extras but for closing the agent beside it; checked as ``one_run``
    checks a run, then repaired in this loop."""
    chaos = Chaos(rng, session_id=session_id)
    chaos.more = random.Random(f"{rng.getstate()[1][:4]}-more")
    turns, stop = _plan(rng, chaos)
    chaos.cancel_at_point = chaos.cancel_at_labelled = None
    if "cancel_after" in stop:
        stop["timeout"] = stop.pop("cancel_after")
    more = _plan_more(chaos, turns, stop)
    inner = PlainStore()
    kind = VARIANTS[chaos.variant]
    if chaos.variant != "plain":
        await inner.append(session_id, history(rng))
    options: dict[str, Any] = {"max_retries": more.max_retries} if more.max_retries else {}
    model: ChaosModel | str = ChaosModel(turns, chaos)
    if more.owned:  # run_sync() makes it, and closes it at its end
        _OWNED[session_id], model = model, f"chaos:{session_id}"
    agent = kind(model=model, session_store=LocklessChaosStore(inner, chaos), **options)
    timeout = stop.get("timeout")
    times: list[float] = []  # when run_sync() began and ended, in its own thread
    waits: dict[str, float | None] = {}  # cpu_wait() of that thread at its deadline and end

    def run() -> None:
        times.append(time.monotonic())
        thread = threading.get_native_id()
        marker = threading.Timer(timeout or 0.0, lambda: waits.setdefault("stop", cpu_wait(thread)))
        if timeout is not None:
            marker.start()
        try:
            agent.run_sync("Go.", session_id=session_id, timeout=timeout)
        finally:
            times.append(time.monotonic())
            marker.cancel()
            waits["end"] = cpu_wait()

    error: BaseException | None = None
    try:
        await anyio.to_thread.run_sync(run)
    except BaseException as caught:  # a hook's own cancellation (of the thread's loop) too
        if not isinstance(caught, (Exception, SystemExit)) and caught is not chaos.hook_raised:
            raise
        error = caught
    began, ended = times
    elapsed = ended - began
    violations = _check_outcome(error, False, chaos, None, timeout, began)
    violations.extend(_overflow_problems(error, chaos))
    waited = waited_since(waits.get("stop"), waits["end"])
    if timeout is not None and elapsed - waited > timeout + GRACE + THREAD_TOLERANCE:
        violations.append(
            f"ended {elapsed - timeout:.3f} s after its deadline (grace {GRACE} s; "
            f"{waited:.3f} s of it waiting for a CPU)"
        )
    violations.extend(f"the faulty run: {problem}" for problem in chaos.shown)
    stored = await inner.load(session_id)
    violations.extend(f"after the faulty run: {problem}" for problem in log_problems(stored))
    violations.extend(_store_first(chaos.context, stored, set()))
    violations.extend(await _repair(inner, session_id, kind))
    described = [f"{session_id} ({turns}, {stop}, {chaos.fired}): {v}" for v in violations]
    return Outcome(elapsed, timeout, error, False, described), chaos


async def threaded_campaign(seed: int, runs: int, *, concurrency: int = 4) -> Report:
    """Run ``runs`` faulty runs through ``run_sync()`` in worker threads (``concurrency``
    at a time) and report on them (``one_threaded_run``)."""
    report = Report()
    limiter = anyio.Semaphore(concurrency)

    async def one(index: int) -> None:
        async with limiter:
            rng = random.Random(f"{seed}-thread-{index}")
            outcome, chaos = await one_threaded_run(rng, f"thread-{index}")
            report.add(outcome, chaos)

    freeze_heap()
    async with anyio.create_task_group() as group:
        for index in range(runs):
            group.start_soon(one, index)
    return report


def figures(report: Report, backend: str, seconds: float) -> str:
    """The report as text: runs, outcomes, faults by kind, violations, worst overshoot."""
    lines = [
        f"{backend}: {report.runs} runs in {seconds:.1f} s; violations: {len(report.violations)}; "
        f"worst end past the stop time: {report.worst_overshoot * 1000:.0f} ms "
        f"(grace {GRACE * 1000:.0f} ms)",
        "  outcomes: " + ", ".join(f"{k} {v}" for k, v in report.by_outcome.most_common()),
        "  faults: " + ", ".join(f"{k} {v}" for k, v in sorted(report.faults.items())),
    ]
    lines.extend(f"  VIOLATION: {violation}" for violation in report.violations[:20])
    return "\n".join(lines)
