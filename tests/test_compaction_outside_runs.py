"""``compact_log``, ``check_retention`` and ``sessions compact`` compact as the agent class
would: not at all with ``summarize=False``, the view shaped as a run's request is, and
nothing for a conversation with nothing to compact."""

from __future__ import annotations

import contextlib
import math
import random
import re
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind, StatusCode

from littleghost import (
    Agent,
    Message,
    ReasoningPart,
    Role,
    RunContext,
    TextPart,
    ToolCall,
    ToolResult,
    before_model,
    manage_context,
)
from littleghost.context import (
    PromptBudget,
    Summarization,
    TokenBudget,
    Truncation,
    apply_compaction,
    compact_session,
    compaction_records,
)
from littleghost.context.outside import compact_log
from littleghost.context.tokens import estimate_request
from littleghost.errors import (
    CompactionError,
    ConfigurationError,
    ContextWindowOverflowError,
    DeadlineExceededError,
    InvalidRequestError,
    ProviderUnavailableError,
    SessionStoreError,
)
from littleghost.messages import SUMMARY_COVERS_KEY, SUMMARY_KEY
from littleghost.models import Model, ModelRequest, ModelResponse
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import Fact, ScriptedModel, check_retention, text_response

from .conftest import Histograms, Spans
from .conversations import chat, summary_step
from .timing import LATE

pytestmark = pytest.mark.anyio


@manage_context(budget=PromptBudget(prompt_budget_tokens=16_000), summarize=False)
class NeverSummarizes(Agent):
    instructions = "Be brief."


def wordy(pairs: int) -> list[Message]:
    """``pairs`` exchanges of about 40 estimated tokens a message."""
    return [
        message
        for index in range(pairs)
        for message in (
            Message.user(f"question {index}: " + "please check the delivery again " * 5),
            Message.assistant(f"answer {index}: " + "it is still on its way to you " * 5),
        )
    ]


def sent(request: ModelRequest) -> str:
    return "\n".join(message.text for message in request.messages)


async def test_summarize_false_compacts_nothing_and_calls_no_model() -> None:
    model = ScriptedModel([text_response("K-000")])
    agent = NeverSummarizes(model=model)
    assert await compact_log(agent, chat(12)) == ()
    assert model.requests == []
    preparing = Preparing([])  # nor starts one (a local server)
    assert await compact_log(NeverSummarizes(model=preparing), chat(12)) == ()
    assert preparing.calls == []
    report = await check_retention(agent, chat(12), [Fact("The first answer?", "m answer 0")])
    assert (report.records, report.summary) == ((), None)
    assert [r.purpose for r in model.requests] == ["chat"]


@pytest.mark.parametrize("share", [0, 1, -1, 1.5, math.nan, "0.5", None])
async def test_compact_log_takes_a_share_in_0_to_1(share: Any) -> None:
    model = ScriptedModel([])
    with pytest.raises(
        ConfigurationError, match=r"compact_log: share must be a number in \(0, 1\)"
    ):
        await compact_log(NeverSummarizes(model=model), chat(12), share=share)
    assert model.requests == []


async def test_an_empty_conversation_gives_no_records() -> None:
    model = ScriptedModel([text_response("I do not know.")])

    @manage_context
    class Assistant(Agent):
        pass

    assert await compact_log(Assistant(model=model), []) == ()
    report = await check_retention(Assistant(model=model), [], [Fact("Code?", "K-1")])
    assert report.records == () and [r.purpose for r in model.requests] == ["chat"]


async def test_the_summary_covers_the_budget_bounded_view_a_run_would_compact() -> None:
    """A run bounds the view to the budget first, then compacts what is left: turns the
    budget drops are never summarized."""

    @manage_context(
        context_window_tokens=10_000,
        preserve_recent_messages=2,
        budget=PromptBudget(
            prompt_budget_tokens=400,
            response_reserve_tokens=50,
            safety_reserve_tokens=0,
            excerpt_tokens=0,
        ),
    )
    class Bounded(Agent):
        pass

    model = ScriptedModel([summary_step("- the delivery is late")])
    conversation = wordy(10)
    (record,) = await compact_log(Bounded(model=model), conversation)
    covered = set(record.metadata[SUMMARY_COVERS_KEY])
    assert covered and conversation[0].id not in covered
    (request,) = model.requests
    assert "question 0:" not in sent(request) and "question 7:" in sent(request)


async def test_a_last_turn_alone_over_the_budget_is_history_as_the_next_run_takes_it() -> None:
    """The log's last turn is no current turn: alone over the budget, it does not fail the
    compaction; the view is bounded as the next run's, that turn in it as history (its
    items capped), and what that view holds is compacted."""

    @manage_context(
        context_window_tokens=10_000,
        preserve_recent_messages=2,
        budget=PromptBudget(
            prompt_budget_tokens=1_500,
            response_reserve_tokens=50,
            safety_reserve_tokens=0,
            excerpt_tokens=0,
        ),
    )
    class Bounded(Agent):
        pass

    conversation = [*wordy(10), Message.user("a long one " * 1_200), Message.assistant("Noted.")]
    model = ScriptedModel([summary_step("- the delivery is late"), text_response("Done.")])
    (record,) = await compact_log(Bounded(model=model), conversation)
    covered = set(record.metadata[SUMMARY_COVERS_KEY])
    assert covered and conversation[-2].id not in covered
    assert "question 0:" not in sent(model.requests[0])  # the next run's view drops it
    result = await Bounded(model=model).run("And now?", history=[*conversation, record])
    assert result.output == "Done."


async def test_the_summary_sees_tool_results_clipped_as_a_run_clips_them() -> None:
    @manage_context(preserve_recent_messages=2)
    class Clipped(Agent):
        max_tool_result_tokens = 20

    model = ScriptedModel([summary_step("- a ticket was read")])
    conversation = [
        Message.user("Read ticket T-1."),
        Message.assistant(tool_calls=[ToolCall("c1", "get_ticket", {"id": "T-1"})]),
        Message.tool("c1", "x" * 300 + " code ZX-9931 " + "y" * 300),
        Message.assistant("Read."),
        *chat(4),
    ]
    (record,) = await compact_log(Clipped(model=model), conversation)
    assert conversation[2].id in record.metadata[SUMMARY_COVERS_KEY]
    (request,) = model.requests
    assert "ZX-9931" not in sent(request) and "x" * 20 in sent(request)


class Preparing(ScriptedModel):
    """A model with ``prepare()``, where it learns its window (as a local server's model
    does), recording its calls."""

    def __init__(self, steps: list[Any]) -> None:
        super().__init__(steps, context_window=None)
        self.calls: list[str] = []

    async def prepare(self) -> None:
        self.calls.append("prepare")
        self._context_window = 2_000

    async def respond(self, request: ModelRequest) -> ModelResponse:
        self.calls.append(f"respond {request.purpose}")
        return await super().respond(request)


@manage_context(preserve_recent_messages=4)
class Plain(Agent):
    instructions = "Be brief."


async def test_the_model_is_prepared_before_its_window_is_read(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Outside a run nothing else prepares the model: compacting does, first, and fits
    the summary call in the window the model learns there, not in the 200 000 tokens
    assumed of a model that tells none."""
    model = Preparing([summary_step("- they talked")])
    (record,) = await compact_log(Plain(model=model), wordy(80))
    assert record.is_summary
    assert model.calls[0] == "prepare" and model.calls[-1] == "respond context_compaction"
    (summary,) = model.requests
    assert estimate_request(summary.messages, (), {}) + (summary.max_tokens or 0) <= 2_000
    assert "advertises no context window" not in caplog.text


@pytest.mark.parametrize(
    ("strategy", "started"), [(Truncation(minimum_preserved=4), False), (None, True)]
)
async def test_the_model_starts_only_for_a_summary_when_the_window_is_declared(
    strategy: Truncation | None, started: bool
) -> None:
    """With ``context_window_override`` the window needs no started model: a strategy
    calling no model leaves it unstarted, a summary starts it before its call."""
    model = Preparing([summary_step("- they talked")])
    managed = manage_context(
        context_window_override=2_000, preserve_recent_messages=4, strategy=strategy
    )
    (record,) = await compact_log(managed(type("Windowed", (Agent,), {}))(model=model), wordy(20))
    assert record.is_summary is started
    assert model.calls == (["prepare", "respond context_compaction"] if started else [])


@pytest.mark.parametrize("max_retries", [1, 0])
async def test_a_transient_error_of_the_summary_call_is_retried_as_in_a_run(
    max_retries: int,
) -> None:
    """Outside a run too, a 503 is retried, as many times as the agent's ``max_retries``
    say (the SDKs' own retries are off); compacting a stored session as well."""
    busy = ProviderUnavailableError("busy", status=503)
    model = ScriptedModel([busy, summary_step("- they talked")])
    agent = Plain(model=model, max_retries=max_retries)
    if max_retries:
        (record,) = await compact_log(agent, wordy(20))
        assert record.is_summary
    else:
        with pytest.raises(ProviderUnavailableError):
            await compact_log(agent, wordy(20))
    assert len(model.requests) == 1 + max_retries
    store = InMemorySessionStore()
    await store.append("s", wordy(20))
    model = ScriptedModel([busy, summary_step("- they talked")])
    strategy = Summarization(model=model, minimum_preserved=4)
    (record,) = await compact_session(store, "s", strategy)
    assert record.is_summary and len(model.requests) == 2


class Counting:
    """A tokenizer counting the texts it is asked to measure."""

    def __init__(self) -> None:
        self.calls = 0

    def count_tokens(self, text: str) -> int:
        self.calls += 1
        return max(1, len(text) // 4)


async def test_a_log_many_windows_long_is_fitted_to_a_summary_call_in_near_linear_work() -> None:
    """The groups no summary request can take are given back by bisection, not one at a
    time: four times the log costs about four times the measuring, not sixteen (it took
    minutes and gigabytes for 10 000 messages), and the summary covers the same."""
    measured, covered = [], []
    for pairs in (100, 400):
        tokenizer = Counting()

        @manage_context(
            context_window_tokens=2_000, preserve_recent_messages=4, tokenizer=tokenizer
        )
        class Small(Agent):
            pass

        model = ScriptedModel([summary_step("- they talked")])
        (record,) = await compact_log(Small(model=model), wordy(pairs))
        measured.append(tokenizer.calls)
        covered.append(len(record.metadata[SUMMARY_COVERS_KEY]))
    assert covered[0] == covered[1] < 100
    assert measured[1] < 6 * measured[0]


async def test_messages_are_checked_before_any_model_call() -> None:
    model = ScriptedModel([])

    @manage_context
    class Assistant(Agent):
        pass

    ack = Message.assistant("Noted.")
    with pytest.raises(ConfigurationError, match="an id of its own"):
        await compact_log(Assistant(model=model), [Message.user("a"), ack, Message.user("b"), ack])
    with pytest.raises(TypeError, match="messages must be a sequence of Message"):
        await compact_log(Assistant(model=model), "hello")  # type: ignore[arg-type]
    assert model.requests == []


async def test_a_part_its_role_cannot_carry_is_found_in_a_log_grown_or_in_a_record() -> None:
    """The engine's index of a log given earlier is reused for the log one turn longer:
    a stray part among the added messages, or in a compaction record, is still refused,
    naming its position, as in a log given for the first time."""
    log = [Message.user("hi"), Message.assistant("hello")]
    budget = TokenBudget(token_budget=1_000)
    assert await apply_compaction(log, budget) == tuple(log)
    grown = [*log, Message.user("and"), Message(Role.USER, (ToolCall("c1", "count", {}),))]
    with pytest.raises(ConfigurationError, match=r"messages\[3\]: .*'user'.*not ToolCall"):
        await apply_compaction(grown, budget)
    with pytest.raises(ConfigurationError, match=r"messages\[3\]: .*'user'.*not ToolCall"):
        await apply_compaction([*grown, Message.assistant("and?")], budget)
    assert await apply_compaction([*grown[:3], Message.assistant("ok")], budget)
    summary = Message(
        Role.USER,
        (TextPart("- they said hi"), ReasoningPart("hidden")),
        metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: [log[0].id]},
    )
    with pytest.raises(ConfigurationError, match=r"messages\[2\]: .*not ReasoningPart"):
        await apply_compaction([*log, summary], budget)


@manage_context(context_window_tokens=4_000)
class Summarizing(Agent):
    capture_content = True


async def _compact_session(model: ScriptedModel) -> None:
    store = InMemorySessionStore()
    await store.append("s", chat(20))
    await compact_session(store, "s", Summarization(model=model))


async def _compact_log(model: ScriptedModel) -> None:
    await compact_log(Summarizing(model=model), chat(20))


async def _apply_compaction(model: ScriptedModel) -> None:
    await apply_compaction(chat(20), Summarization(model=model))


@pytest.mark.parametrize("compact", [_compact_session, _compact_log, _apply_compaction])
async def test_a_summary_call_outside_runs_is_traced_and_metered(
    compact: Any, spans: Spans, histograms: Histograms
) -> None:
    """A compaction's summary call outside a run (``compact_session``, ``compact_log``,
    ``apply_compaction``) is a ``chat`` span with its usage and in the token metric, as
    in a run, naming the session or agent compacted; its content is captured only for an
    agent that opts in."""
    model = ScriptedModel([text_response("- noted", input_tokens=900, output_tokens=90)])
    await compact(model)
    (span,) = spans.named("chat ")
    attributes = dict(span.attributes or {})
    assert attributes["littleghost.purpose"] == "context_compaction"
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (
        900,
        90,
    )
    assert ("gen_ai.input.messages" in attributes) == (compact is _compact_log)
    names = {"gen_ai.agent.name": "Summarizing"} if compact is _compact_log else {}
    if compact is _compact_session:
        names = {"gen_ai.conversation.id": "s"}
    assert {key: attributes.get(key) for key in names} == names
    tokens = histograms.read()["gen_ai.client.token.usage"]
    assert sorted(int(point.sum) for point in tokens) == [90, 900]
    assert [point.count for point in tokens] == [1, 1]


async def test_a_summarizers_own_model_window_fits_its_first_summary_call() -> None:
    """``compact_session`` with ``Summarization(model=...)`` whose model advertises a window
    far smaller than the session: the summary call is fitted to that window before it is
    sent, not sent whole to be refused and fitted from the overflow's figures."""
    refused: list[int] = []

    def answer(request: ModelRequest) -> ModelResponse:
        size = estimate_request(request.messages, (), {}) + (request.max_tokens or 0)
        if size > 512:
            refused.append(size)
            raise ContextWindowOverflowError(
                "prompt is too long", prompt_tokens=size, context_window=512
            )
        return text_response("- The user asked about orders.")

    store = InMemorySessionStore()
    await store.append("s", chat(40, prefix="order A-17 " + "detail " * 20))
    small = ScriptedModel([answer] * 2, context_window=512)
    records = await compact_session(store, "s", Summarization(model=small))
    assert [m.is_summary for m in records] == [True]
    assert refused == [] and len(small.requests) == 1


FIGURES = (
    "littleghost.compaction.estimated_tokens",
    "littleghost.compaction.estimated_tokens_after",
    "littleghost.compaction.removed_messages",
)


def _compaction_span(spans: Spans) -> tuple[ReadableSpan, dict[str, Any]]:
    span = spans.one("littleghost.context.compaction")
    return span, dict(span.attributes or {})


@pytest.mark.parametrize("compact", [_compact_session, _compact_log, _apply_compaction])
async def test_a_compaction_outside_runs_is_a_span_of_its_own_over_its_summary_calls(
    compact: Any, spans: Spans, caplog: pytest.LogCaptureFixture
) -> None:
    """``compact_session``, ``compact_log`` and ``apply_compaction`` are each a
    ``littleghost.context.compaction`` span (INTERNAL, reason ``requested``) with the
    figures a run's compaction event has, named as their summary calls' ``chat`` spans,
    which are its children; no content on it, whatever the agent captures; an INFO log
    line says the same."""
    model = ScriptedModel([summary_step("- SECRET-NOTE kept", input_tokens=900, output_tokens=9)])
    with caplog.at_level("INFO", logger="littleghost.context"):
        await compact(model)
    span, attributes = _compaction_span(spans)
    (chat_span,) = spans.named("chat ")
    assert span.kind is SpanKind.INTERNAL and span.status.status_code is StatusCode.UNSET
    assert chat_span.parent is not None and span.context is not None
    assert chat_span.parent.span_id == span.context.span_id
    assert span.parent is None
    names: dict[str, str] = {}
    if compact is _compact_log:
        names = {"gen_ai.agent.name": "Summarizing"}
    elif compact is _compact_session:
        names = {"gen_ai.conversation.id": "s"}
    assert {key: attributes.get(key) for key in names} == names
    assert {key: (chat_span.attributes or {}).get(key) for key in names} == names
    assert attributes["littleghost.compaction.reason"] == "requested"
    assert attributes["littleghost.compaction.outcome"] == "completed"
    assert attributes["littleghost.compaction.summary_outcome"] == "complete"
    if compact is _apply_compaction:  # its figures would take an estimate of every message
        assert not any(key in attributes for key in FIGURES)
    else:
        before = attributes["littleghost.compaction.estimated_tokens"]
        assert 0 < attributes["littleghost.compaction.estimated_tokens_after"] < before
        assert attributes["littleghost.compaction.removed_messages"] > 0
    window = attributes.get("littleghost.compaction.context_window_tokens")
    assert window == (4_000 if compact is _compact_log else None)  # the strategy has none
    assert "error.type" not in attributes
    assert not any("SECRET-NOTE" in text for text in spans.every_text([span]))
    (line,) = [r for r in caplog.records if r.name == "littleghost.context"]
    assert line.getMessage().startswith("context compaction completed")
    assert ("(reason=requested, tokens " in line.getMessage()) == (compact is not _apply_compaction)
    assert names.items() <= line.littleghost.items()  # type: ignore[attr-defined]


async def test_a_failed_compaction_outside_runs_is_an_error_span(spans: Spans) -> None:
    """A compaction outside runs that fails is ERROR with ``error.type`` and outcome
    ``error``; a ``CompactionError``'s figures are its ``error_message``, another error's
    text (which may carry content) is not told."""
    store = InMemorySessionStore()
    short = [m for i in range(7) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
    await store.append("s", short)
    wordy = ScriptedModel([text_response("- a long note about nothing " * 20)])
    with pytest.raises(CompactionError, match="would not make the view smaller"):
        await compact_session(store, "s", Summarization(model=wordy))
    span, attributes = _compaction_span(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert attributes["error.type"] == "CompactionError"
    assert attributes["littleghost.compaction.outcome"] == "error"
    assert attributes["littleghost.compaction.removed_messages"] == 0
    assert "littleghost.compaction.estimated_tokens_after" not in attributes
    assert "would not make the view smaller" in attributes["littleghost.compaction.error_message"]
    assert attributes["littleghost.compaction.estimated_tokens"] > 0

    spans.clear()
    failing = ScriptedModel([InvalidRequestError("bad request: SECRET-TEXT", provider="x")])
    with pytest.raises(InvalidRequestError):
        await compact_log(Summarizing(model=failing), chat(20))
    span, attributes = _compaction_span(spans)
    assert span.status.status_code is StatusCode.ERROR
    assert (attributes["error.type"], attributes["littleghost.compaction.outcome"]) == (
        "InvalidRequestError",
        "error",
    )
    assert "littleghost.compaction.error_message" not in attributes
    assert not any("SECRET-TEXT" in text for text in spans.every_text([span]))


async def test_a_cancelled_compaction_outside_runs_is_not_a_failure(spans: Spans) -> None:
    """The caller's cancellation ends the span UNSET, outcome ``cancelled``."""
    started = anyio.Event()

    async def hang(request: ModelRequest) -> ModelResponse:
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    async with anyio.create_task_group() as group:
        group.start_soon(_compact_session, ScriptedModel([hang]))
        await started.wait()
        group.cancel_scope.cancel()
    span, attributes = _compaction_span(spans)
    assert span.status.status_code is StatusCode.UNSET
    assert attributes["littleghost.compaction.outcome"] == "cancelled"
    assert "error.type" not in attributes
    assert not spans.still_open


class Hooked(Agent):
    """Compacts its history ad hoc before each call, with a summarizer of its own."""

    summarizer: Model

    @before_model
    async def note(self, request: ModelRequest, context: RunContext) -> None:
        await compaction_records(
            context.messages, Summarization(model=self.summarizer), tokenizer=None
        )


async def test_an_ad_hoc_compaction_in_a_run_is_a_span_of_the_run(spans: Spans) -> None:
    """``compaction_records`` called in a run is a compaction span under its
    ``invoke_agent``, named by the run's agent and session, over its summary call."""
    agent = Hooked(
        model=ScriptedModel([text_response("done")]), session_store=InMemorySessionStore()
    )
    agent.summarizer = ScriptedModel([summary_step("- noted")])
    await agent.run("go", history=chat(20), session_id="s-9")
    run = spans.one("invoke_agent")
    span, attributes = _compaction_span(spans)
    assert span.parent is not None and run.context is not None and span.context is not None
    assert span.parent.span_id == run.context.span_id
    summary = next(
        c for c in spans.named("chat ") if (c.attributes or {})["littleghost.purpose"] != "chat"
    )
    assert summary.parent is not None and summary.parent.span_id == span.context.span_id
    assert attributes["gen_ai.agent.name"] == "Hooked"
    assert attributes["gen_ai.conversation.id"] == "s-9"
    assert attributes["littleghost.compaction.outcome"] == "completed"


async def test_an_ad_hoc_compaction_the_run_s_deadline_cuts_is_an_error(spans: Spans) -> None:
    """``compaction_records`` in a run that its deadline cuts ends ERROR
    ``DeadlineExceededError``, outcome ``error``, and so does its summary call's span, as
    the run's own compaction and spans do: not ``cancelled``, which is the caller's."""

    async def hang(request: ModelRequest) -> ModelResponse:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    agent = Hooked(
        model=ScriptedModel([text_response("done")]), session_store=InMemorySessionStore()
    )
    agent.summarizer = ScriptedModel([hang])
    with pytest.raises(DeadlineExceededError):
        await agent.run("go", history=chat(20), session_id="s-9", timeout=0.2)
    span, attributes = _compaction_span(spans)
    (summary,) = spans.named("chat ")
    assert attributes["littleghost.compaction.outcome"] == "error"
    for cut in (span, summary):
        assert cut.status.status_code is StatusCode.ERROR
        assert (cut.attributes or {})["error.type"] == "DeadlineExceededError"


class TellingOnRelease(InMemorySessionStore):
    """A store that holds its sessions itself and, releasing one, awaits (telling a lock
    server, say) before it lets go, so a release cut short leaves the session held; with
    ``fails``, the release then fails."""

    def __init__(self, fails: bool = False) -> None:
        super().__init__()
        self.fails = fails
        self.held = anyio.Semaphore(1)

    @contextlib.asynccontextmanager
    async def lock(self, session_id: str) -> AsyncIterator[None]:
        await self.held.acquire()
        try:
            yield
        finally:
            await anyio.lowlevel.checkpoint()
            self.held.release()
            if self.fails:
                raise SessionStoreError("the lock server went away")


async def stalling(request: ModelRequest) -> ModelResponse:
    await anyio.sleep(10)
    raise AssertionError("not reached")


def summarizer() -> ScriptedModel:
    return ScriptedModel([summary_step()])


@pytest.mark.virtual_clock
async def test_a_cancelled_compact_session_releases_the_session_as_a_run_does() -> None:
    """``compact_session`` holds the session as a run does, and releases it as one does:
    shielded from the caller's cancellation for at most the cleanup grace (1 s), so a
    later compaction or run of the session is not left waiting for good."""
    store = TellingOnRelease()
    await store.append("s", chat(20))
    began = anyio.current_time()
    with anyio.move_on_after(0.1) as scope:
        await compact_session(store, "s", Summarization(model=ScriptedModel([stalling])))
    assert scope.cancelled_caught
    assert anyio.current_time() - began == pytest.approx(0.1)  # the release is quick
    with anyio.fail_after(LATE):
        records = await compact_session(store, "s", Summarization(model=summarizer()))
    assert len(records) == 1


@pytest.mark.parametrize("fails", [False, True], ids=["compacts", "fails"])
async def test_a_failing_release_never_replaces_compact_sessions_outcome(
    fails: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """What releasing the session raises is logged (``littleghost.cleanup``), as for a
    run: the records appended are returned, or the compaction's own error is raised."""
    store = TellingOnRelease(fails=True)
    await store.append("s", chat(20))
    model = ScriptedModel([InvalidRequestError("refused")]) if fails else summarizer()
    if fails:
        with pytest.raises(InvalidRequestError, match="refused"):
            await compact_session(store, "s", Summarization(model=model))
    else:
        records = await compact_session(store, "s", Summarization(model=model))
        assert (await store.load("s"))[-len(records) :] == records
    assert "releasing the session could not be done" in caplog.text


def faulty_log(chooser: random.Random) -> list[Message]:
    """A chat with a tool exchange, and a few results at random places: some answering
    no call at all (orphans, which a run of a session leaves out of the view), some put
    beside a result of another call (which a run refuses)."""
    call = Message(Role.ASSISTANT, (ToolCall("c1", "count", {}),))
    strays = [
        ToolResult(f"ghost-{chooser.randrange(100)}", "stray") for _ in range(chooser.randint(1, 3))
    ]
    beside = [stray for stray in strays if chooser.random() < 0.3]  # under c1: misplaced
    answer = Message(Role.TOOL, (ToolResult("c1", "1"), *beside))
    log = [*chat(8), call, answer, *chat(8, prefix="n")]
    for stray in strays:
        if stray not in beside:
            log.insert(chooser.randint(1, len(log)), Message(Role.TOOL, (stray,)))
    return log


def outcome(error: Exception | None) -> tuple[int, str] | None:
    """Where a refusal points (the position of the result) and what it says after it."""
    if error is None:
        return None
    assert isinstance(error, ConfigurationError), error
    found = re.fullmatch(r"(?:messages\[(\d+)\]|message (\d+) of session 's') (.*)", str(error))
    assert found is not None, error
    return int(found[1] or found[2]), found[3]


@pytest.mark.parametrize("seed", range(12))
async def test_every_compaction_of_a_stored_log_checks_it_as_a_run_of_its_session(
    seed: int,
) -> None:
    """``compact_session`` and ``compact_log`` take and refuse the stored logs a run of
    the session takes and refuses, with the same error: a tool message whose results
    answer no call is left out of the view (an append-only log could never be rid of
    it), a result put under a call it does not answer is a ``ConfigurationError``."""
    log = faulty_log(random.Random(seed))

    @manage_context(context_window_tokens=4_000)
    class Assistant(Agent):
        pass

    async def run() -> object:
        store = InMemorySessionStore()
        await store.append("s", log)
        agent = Assistant(model=ScriptedModel([text_response("ok")]), session_store=store)
        return await agent.run("hi", session_id="s")

    async def session() -> object:
        store = InMemorySessionStore()
        await store.append("s", log)
        return await compact_session(store, "s", Summarization(model=summarizer()))

    async def outside() -> object:
        return await compact_log(Assistant(model=summarizer()), log)

    outcomes = []
    for entry in (run, session, outside):
        try:
            await entry()
        except ConfigurationError as error:
            outcomes.append(outcome(error))
        else:
            outcomes.append(None)
    assert outcomes[1] == outcomes[2] == outcomes[0], seed


@pytest.mark.parametrize("session_id", ["s", "ticket-{42}", "a{b}", "{}", "}{", "{0!r:>{1}}"])
async def test_a_stored_log_s_refusal_names_a_session_whatever_its_id(session_id: str) -> None:
    """A run and ``compact_session`` refuse a stored log holding a misplaced result with
    the same ``ConfigurationError``, naming the session as it is, braces and all."""
    call = Message(Role.ASSISTANT, (ToolCall("c1", "count", {}),))
    beside = Message(Role.TOOL, (ToolResult("c1", "1"), ToolResult("ghost", "stray")))
    store = InMemorySessionStore()
    await store.append(session_id, [*chat(8), call, beside, *chat(8, prefix="n")])

    @manage_context(context_window_tokens=4_000)
    class Assistant(Agent):
        pass

    agent = Assistant(model=ScriptedModel([text_response("ok")]), session_store=store)
    expected = f"message 17 of session {session_id!r} holds a result for call 'ghost'"
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        await agent.run("hi", session_id=session_id)
    with pytest.raises(ConfigurationError, match=re.escape(expected)):
        await compact_session(store, session_id, Summarization(model=summarizer()))
