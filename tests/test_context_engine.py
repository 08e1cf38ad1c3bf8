"""The context engine under pressure: no thrash, calibration by the provider's counts,
errors that mean what they say, and declarations that cannot work refused early."""

from __future__ import annotations

import itertools
import re
from typing import Any

import attrs
import pytest

from littleghost import Agent, Message, RunContext, ToolCall, before_model, manage_context, tool
from littleghost.context import (
    Pipeline,
    PromptBudget,
    Summarization,
    TokenBudget,
    Truncation,
    compact_session,
)
from littleghost.context.calibration import COUNT_KEY, SCALE_KEY, estimate_tokens
from littleghost.context.management import AFTER_KEY, REGROWTH
from littleghost.context.records import is_record
from littleghost.context.tokens import DEFAULT_TOKENIZER, estimate_messages, estimate_request
from littleghost.errors import ConfigurationError, ContextWindowOverflowError
from littleghost.events import CompactionFinished
from littleghost.models import ModelRequest, ModelResponse
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response
from tests.conftest import Spans
from tests.stores import PlainStore

pytestmark = pytest.mark.anyio

LONG_INSTRUCTIONS = "Write notes. " + "Keep every number, name and date as given. " * 80
"""Summary instructions of about 900 tokens by the default estimate."""


def summarizing(answer: Any) -> Any:
    """A script step: summary calls get a one-line summary, chat calls ``answer``."""

    def respond(request: ModelRequest) -> ModelResponse:
        if request.purpose == "context_compaction":
            return text_response("Earlier: notes were taken.")
        return answer(request) if callable(answer) else answer

    return respond


class NoteTaking:
    """A chat call's script step: a ``note`` tool call for each of the first 24 calls,
    then "done"; ``chats`` counts the calls."""

    def __init__(self) -> None:
        self.chats = 0

    def __call__(self, request: ModelRequest) -> ModelResponse:
        self.chats += 1
        if self.chats <= 24:
            return tool_call_response("note", {"number": self.chats})
        return text_response("done")


def reading(parts: int, words: int) -> list[Message]:
    """A turn that reads ``parts`` parts with a ``read`` tool, ``words`` words each."""
    turn = [Message.user(f"Read the {parts} parts.")]
    for part in range(parts):
        call = ToolCall(f"c{part}", "read", {"part": part})
        turn += [
            Message.assistant(tool_calls=[call]),
            Message.tool(call.id, f"part {part}: " + "words " * words),
        ]
    return [*turn, Message.assistant("Read.")]


def test_a_message_holds_no_state_of_the_engine() -> None:
    """A message has no ``__dict__`` to attach a cache to, and its slots are its fields
    and the views derived from its content: nothing of the engine's."""
    assert [field.name for field in attrs.fields(Message)] == ["role", "content", "id", "metadata"]
    message = Message.user("hi")
    assert not hasattr(message, "__dict__")
    derived = {"text", "tool_calls", "tool_results", "reasoning", "__weakref__"}
    assert set(Message.__slots__) == {"role", "content", "id", "metadata", *derived}


@manage_context(context_window_tokens=1_000, compression_threshold=0.5, preserve_recent_messages=50)
class Patient(Agent):
    """Keeps 50 messages: nothing of a short session is old enough to compact."""


async def patient_session(session_id: str, *, turns: int) -> ScriptedModel:
    """``turns`` questions to ``Patient`` in a new session that opens with a long
    message, over the threshold: each run's compaction is due, with nothing to compact."""
    model = ScriptedModel([text_response("Noted.")] * turns)
    store = InMemorySessionStore()
    await store.append(session_id, [Message.user("Context: " + "detail " * 400)])
    for turn in range(turns):
        await Patient(model=model, session_store=store).run(f"Q{turn}?", session_id=session_id)
    return model


class TestNoThrash:
    async def test_a_tool_loop_over_the_threshold_waits_for_growth_between_summaries(
        self, spans: Spans
    ) -> None:
        """The preserved tail alone is over the threshold: after a compaction that leaves
        the request over it, the next summary waits until it has grown."""

        @manage_context(
            context_window_tokens=2_000, compression_threshold=0.5, preserve_recent_messages=40
        )
        class Looping(Agent):
            @tool
            def note(self, number: int) -> str:
                """Take a note."""
                return f"note {number}: " + "short remark " * 6

        notes = NoteTaking()
        model = ScriptedModel([summarizing(notes)] * 80)
        history = [Message.user("Start: " + "context " * 200), Message.assistant("Ready.")]
        await Looping(model=model).run("Take notes.", history=history)
        attempts = [
            e
            for e in spans.compactions()
            if e["littleghost.compaction.outcome"] in ("completed", "error")
        ]
        skipped = [
            e for e in spans.compactions() if e["littleghost.compaction.outcome"] == "skipped"
        ]
        assert attempts and skipped
        assert all("grown" in e["littleghost.compaction.skipped_because"] for e in skipped)
        growth = REGROWTH * 2_000
        checked = 0
        for earlier, later in itertools.pairwise(attempts):
            left = earlier.get(
                "littleghost.compaction.estimated_tokens_after",
                earlier["littleghost.compaction.estimated_tokens"],
            )
            if left + growth > 1_000:  # left near or over the threshold: growth came first
                assert later["littleghost.compaction.estimated_tokens"] >= left + growth
                checked += 1
        assert checked
        summaries = sum(r.purpose == "context_compaction" for r in model.requests)
        assert summaries <= len(attempts) < notes.chats

    async def test_a_summary_that_takes_all_its_room_does_not_make_the_next_turn_compact(
        self, spans: Spans
    ) -> None:
        """A summarizer that writes to its cap (as small models do) takes back half of
        what it replaces and leaves the request just under the threshold: the next turns
        wait until the request has grown by ``REGROWTH`` of the window, then compact once."""

        def answer(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                cap = request.settings["max_tokens"]
                notes = "\n".join(f"- fact {i} about the order" for i in range(cap))
                return text_response(notes[: notes.rfind("\n", 0, cap * 4)])
            return text_response("Here is the answer, in a sentence or two of plain words.")

        @manage_context(context_window_tokens=2_000, preserve_recent_messages=2)
        class Chatting(Agent):
            pass

        model = ScriptedModel([answer] * 40)
        agent = Chatting(model=model, session_store=InMemorySessionStore())
        history = [
            m
            for i in range(30)
            for m in (
                Message.user(f"Question {i}: " + "blah " * 20),
                Message.assistant(f"Answer {i}: " + "words " * 20),
            )
        ]
        await agent.run("And now?", session_id="s", history=history)
        for turn in range(8):
            await agent.run(f"One more question, number {turn}, about it.", session_id="s")
        threshold, growth = 0.85 * 2_000, REGROWTH * 2_000
        events = spans.compactions()
        completed = [e for e in events if e["littleghost.compaction.outcome"] == "completed"]
        first = completed[0]["littleghost.compaction.estimated_tokens_after"]
        assert threshold - growth < first < threshold  # just under: the summary took room
        assert events[1]["littleghost.compaction.outcome"] == "skipped"  # the next turn
        for earlier, later in itertools.pairwise(completed):
            left = earlier["littleghost.compaction.estimated_tokens_after"]
            if left + growth > threshold:
                assert later["littleghost.compaction.estimated_tokens"] >= left + growth
        summaries = sum(r.purpose == "context_compaction" for r in model.requests)
        assert summaries == len(completed) < 9

    async def test_at_a_low_threshold_the_wait_for_growth_is_a_fifth_of_it(
        self, spans: Spans
    ) -> None:
        """At a tenth of the window, 10 % of the window would let the request grow to twice
        the threshold before the next summary: a compaction that left it just under the
        threshold waits for a fifth of the threshold instead."""

        @manage_context(
            context_window_override=4_000,
            compression_threshold=0.1,
            preserve_recent_messages=2,
            quote_specifics=False,
        )
        class Chatting(Agent):
            pass

        model = ScriptedModel([summarizing(text_response("Noted, thank you for telling me."))] * 60)
        agent = Chatting(model=model, session_store=InMemorySessionStore())
        for _ in range(14):
            await agent.run(
                "It rained all day, and the wind was cold and grey. " * 2, session_id="s"
            )
        events = spans.compactions()
        completed = [e for e in events if e["littleghost.compaction.outcome"] == "completed"]
        assert len(completed) >= 2
        asked = [e["littleghost.compaction.estimated_tokens"] for e in events]
        assert max(asked) <= 1.2 * 400  # the threshold and a fifth of it, at most
        for earlier, later in itertools.pairwise(completed):
            left = earlier["littleghost.compaction.estimated_tokens_after"]
            if left + 80 > 400:
                assert later["littleghost.compaction.estimated_tokens"] >= left + 80

    async def test_no_summary_call_when_collapsing_tool_results_is_enough(
        self, spans: Spans
    ) -> None:
        """A proactive compaction whose collapse of older tool results brings the request
        under the threshold makes no summary call."""

        @manage_context(context_window_tokens=2_000)
        class Reading(Agent):
            pass

        history = reading(6, words=230)  # ~350 tokens a part
        model = ScriptedModel([text_response("done")])
        result = await Reading(model=model).run("What did they say?", history=history)
        assert result.output == "done"
        (request,) = model.requests
        assert request.purpose == "chat"
        assert any(m.text.startswith("[Tool results: read: part 0") for m in request.messages)
        assert estimate_messages(request.messages) < 1_700
        (event,) = spans.compactions()
        assert event["littleghost.compaction.outcome"] == "completed"
        assert "littleghost.compaction.summary_outcome" not in event

    async def test_when_the_summary_leaves_the_request_over_its_target_the_tail_collapses(
        self,
    ) -> None:
        """The summary took everything older than the preserved tail, and the tail's tool
        results still keep the request over 80 % of the threshold: its older results
        are collapsed too, oldest first (the newest two stay whole), so the next
        compaction is not due at the next call."""

        @manage_context(
            context_window_tokens=2_000, compression_threshold=0.5, preserve_recent_messages=10
        )
        class Reading(Agent):
            pass

        history = [
            m
            for i in range(8)
            for m in (Message.user(f"Question {i}: " + "detail " * 30), Message.assistant("Ok."))
        ]
        history += reading(5, words=100)  # ~150 tokens a part
        model = ScriptedModel([summarizing(text_response("done"))] * 2)
        await Reading(model=model).run("What did they say?", history=history)
        assert [r.purpose for r in model.requests] == ["context_compaction", "chat"]
        sent = model.requests[-1].messages
        assert any(m.text.startswith("[Tool results: read: part") for m in sent)
        assert sum(len(m.tool_results) for m in sent) == 2
        assert estimate_messages(sent) <= 800

    async def test_in_a_large_window_a_collapsed_result_keeps_400_characters_at_most(
        self,
    ) -> None:
        """The tail's results collapse to a 25th of the window in characters, 400 at
        most: in a 20 000-token window too, each collapsed line stays short."""

        @manage_context(
            context_window_tokens=20_000, compression_threshold=0.5, preserve_recent_messages=10
        )
        class Reading(Agent):
            pass

        history = [
            m
            for i in range(8)
            for m in (Message.user(f"Question {i}: " + "detail " * 300), Message.assistant("Ok."))
        ]
        history += reading(5, words=1_000)
        model = ScriptedModel([summarizing(text_response("done"))] * 2)
        await Reading(model=model).run("What did they say?", history=history)
        assert [r.purpose for r in model.requests] == ["context_compaction", "chat"]
        collapsed = [
            m.text for m in model.requests[-1].messages if m.text.startswith("[Tool results:")
        ]
        assert collapsed and all(len(text) < 500 for text in collapsed)

    async def test_a_tool_loop_with_large_results_makes_a_summary_call_every_other_call_at_most(
        self,
    ) -> None:
        """Results of about a seventh of the window each, in a long tool loop under the
        default settings: collapsing comes first, so at most every other chat call is
        preceded by a summary call."""

        @manage_context(context_window_tokens=2_000)
        class Looping(Agent):
            @tool
            def note(self, number: int) -> str:
                """Take a note."""
                return f"note {number}: " + "remark " * 160  # about 280 tokens

        notes = NoteTaking()
        model = ScriptedModel([summarizing(notes)] * 80)
        history = [
            m
            for i in range(12)
            for m in (
                Message.user(f"Question {i}: " + "detail " * 40),
                Message.assistant("fact " * 40),
            )
        ]
        await Looping(model=model).run("Take notes.", history=history)
        summaries = sum(r.purpose == "context_compaction" for r in model.requests)
        assert notes.chats == 25
        assert 0 < summaries <= (notes.chats + 1) // 2

    async def test_runs_of_one_conversation_remember_a_compaction_that_left_it_over(
        self, spans: Spans
    ) -> None:
        """Each turn a new run: the records say how big the last compaction left the
        request, so the next run does not summarize again before growth."""

        @manage_context(
            context_window_tokens=1_000, compression_threshold=0.5, preserve_recent_messages=16
        )
        class Chatty(Agent):
            pass

        model = ScriptedModel([summarizing(text_response("A long answer. " * 10))] * 60)
        log: tuple[Message, ...] = ()
        for turn in range(12):
            result = await Chatty(model=model).run(
                f"Question {turn}: " + "detail " * 20, history=log
            )
            log = result.messages
        chats = sum(r.purpose == "chat" for r in model.requests)
        summaries = sum(r.purpose == "context_compaction" for r in model.requests)
        assert chats == 12
        assert 1 <= summaries <= 6  # before: a summary call before every chat call
        assert any(e["littleghost.compaction.outcome"] == "skipped" for e in spans.compactions())

    async def test_the_next_run_remembers_a_compaction_that_failed(self, spans: Spans) -> None:
        """Nothing is old enough to compact: the run's attempt fails, and the next runs of
        the session wait for growth instead of failing again at every question."""

        model = await patient_session("s", turns=4)
        outcomes = [e["littleghost.compaction.outcome"] for e in spans.compactions()]
        assert outcomes == ["error", "skipped", "skipped", "skipped"]
        assert all(r.purpose == "chat" for r in model.requests)

    async def test_the_attempts_log_lines_name_the_run_and_why_one_was_skipped(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Among many sessions' runs, each attempt's log line says whose it is (the agent
        and session, also as the record's ``littleghost`` extra) and why it was skipped."""

        with caplog.at_level("INFO", logger="littleghost.context"):
            await patient_session("s-7", turns=2)
        failed, skipped = (r for r in caplog.records if r.levelname == "INFO")
        assert failed.getMessage().startswith(
            "context compaction error for Patient in session 's-7' (reason=threshold"
        )
        assert skipped.getMessage().startswith(
            "context compaction skipped for Patient in session 's-7' (reason=threshold"
        )
        assert "): the last compaction left the request near the threshold" in skipped.getMessage()
        names = {"gen_ai.agent.name": "Patient", "gen_ai.conversation.id": "s-7"}
        for record in (failed, skipped):
            assert names.items() <= record.littleghost.items()  # type: ignore[attr-defined]
        assert skipped.littleghost["littleghost.compaction.outcome"] == "skipped"  # type: ignore[attr-defined]

    async def test_a_recovery_after_a_failed_attempt_is_what_the_next_run_remembers(
        self,
    ) -> None:
        """The turn's attempt failed, then overflow recovery compacted: the size the next
        run waits from is the recovery's, not the failed attempt's."""

        overflow = ContextWindowOverflowError("prompt too long")
        model = ScriptedModel([overflow, text_response("- notes"), text_response("Noted.")])
        history = [
            m
            for i in range(6)
            for m in (Message.user(f"Q{i} " + "detail " * 80), Message.assistant("A"))
        ]
        result = await Patient(model=model).run("Q?", history=history)
        marked = [m for m in result.messages if AFTER_KEY in m.metadata]
        assert marked and all(is_record(m) for m in marked)


class TestCalibration:
    async def test_reported_input_tokens_rescale_the_estimate_of_new_messages(self) -> None:
        """A provider that counts three times the estimate makes the next request's new
        messages count about three times too."""
        measured: list[int] = []

        @manage_context(context_window_tokens=100_000)
        class Counted(Agent):
            @tool
            def look(self) -> str:
                """Look."""
                return "result text " * 20

            @before_model
            def measure(self, request: ModelRequest, *, context: RunContext) -> None:
                measured.append(estimate_tokens(request, context, DEFAULT_TOKENIZER))

        reported = 0

        def answer(request: ModelRequest) -> ModelResponse:
            nonlocal reported
            if not reported:
                reported = 3 * estimate_messages(request.messages) + 60
                return tool_call_response("look", {}, input_tokens=reported)
            return text_response("done")

        result = await Counted(model=ScriptedModel([answer, answer])).run("Look it up.")
        added = [m for m in result.messages if m.role.value in ("assistant", "tool")][:2]
        assert measured[1] - reported >= 2 * estimate_messages(added)  # scaled, not raw

    async def test_each_run_of_a_session_starts_from_the_calibration_the_last_one_learned(
        self, spans: Spans
    ) -> None:
        """One question per run, as a support bot runs: a provider that counts four times
        the estimate is compacted for before it overflows, not after."""

        @manage_context(
            context_window_tokens=1_000, compression_threshold=0.75, preserve_recent_messages=4
        )
        class Support(Agent):
            pass

        def answer(request: ModelRequest) -> ModelResponse:
            real = 4 * estimate_messages(request.messages)
            if real > 1_000:
                raise ContextWindowOverflowError(
                    "prompt too long", prompt_tokens=real, context_window=1_000
                )
            text = "Earlier: digits." if request.purpose == "context_compaction" else "Noted."
            return text_response(text, input_tokens=real)

        model = ScriptedModel([answer] * 40)
        store = InMemorySessionStore()
        for turn in range(16):
            digits = " ".join(str(turn * 1_000 + n) for n in range(12))
            await Support(model=model, session_store=store).run(f"Keep {digits}.", session_id="s")
        reasons = [e["littleghost.compaction.reason"] for e in spans.compactions()]
        assert "threshold" in reasons
        assert "overflow" not in reasons
        answers = [m for m in await store.load("s") if m.role.value == "assistant"]
        assert answers[-1].metadata[SCALE_KEY] == pytest.approx(4, rel=0.1)

    async def test_a_summary_calls_overflow_rescales_what_the_compaction_left(
        self, spans: Spans
    ) -> None:
        """The summary call overflows, reporting three times its estimate: the size the
        compaction left the request at is in those units too, never below the estimate
        of what is sent (it used to mix the old units with the new, and say 0), and so is
        the size the event says it started from."""

        @manage_context(context_window_tokens=2_000, preserve_recent_messages=2)
        class Scaled(Agent):
            pass

        overflowed = False

        def respond(request: ModelRequest) -> ModelResponse:
            nonlocal overflowed
            if request.purpose == "context_compaction" and not overflowed:
                overflowed = True
                prompt = estimate_messages(request.messages)
                raise ContextWindowOverflowError("too long", prompt_tokens=3 * prompt)
            return summarizing(text_response("done"))(request)

        model = ScriptedModel([respond] * 3)
        history = [Message.user(f"Question {i}: " + "words " * 60) for i in range(24)]
        async with Scaled(model=model).stream("go", history=history) as events:
            (finished,) = [e async for e in events if isinstance(e, CompactionFinished)]
        sent = model.requests[-1]
        assert finished.outcome == "completed"
        assert finished.estimated_tokens_after >= estimate_messages(sent.messages)
        (event,) = spans.compactions()
        before = event["littleghost.compaction.estimated_tokens"]
        assert before > event["littleghost.compaction.estimated_tokens_after"]

    async def test_a_sub_agents_overflow_out_of_a_routing_summary_model_teaches_nothing(
        self,
    ) -> None:
        """A summary call's overflow that a sub-agent raised, out of a model that runs it
        (a router), is the sub-agent's: its figures teach the compaction no scale (it
        learned one three times too large, kept in the log for later runs) and the
        summary is not sent again fitted to them; the compaction fails, the run goes on."""

        @manage_context(context_window_tokens=2_000, preserve_recent_messages=2)
        class Scaled(Agent):
            pass

        class Reader(Agent):
            max_retries = 0

        async def route(request: ModelRequest) -> ModelResponse:
            prompt = 3 * estimate_messages(request.messages)
            overflow = ContextWindowOverflowError("too long", prompt_tokens=prompt)
            inner = Reader(model=ScriptedModel([overflow]))
            return text_response((await inner.run("Read the document.")).output)

        model = ScriptedModel([route, summarizing(text_response("done"))] * 2)
        history = [Message.user(f"Question {i}: " + "words " * 60) for i in range(24)]
        async with Scaled(model=model).stream("go", history=history) as events:
            (finished,) = [e async for e in events if isinstance(e, CompactionFinished)]
        assert [r.purpose for r in model.requests] == ["context_compaction", "chat"]
        assert finished.outcome == "error"
        assert SCALE_KEY not in events.result.messages[-1].metadata

    async def test_an_overflow_without_figures_is_recovered_by_a_summary_that_fits(
        self, spans: Spans
    ) -> None:
        """The provider says only "too long": the request must at least halve, but the
        summary request is sized to the window, not to that half, so a summary is made
        where one fits (the fallback may then take the rest); the events report the
        window."""

        @manage_context(
            context_window_tokens=1_000, compression_threshold=1.0, preserve_recent_messages=4
        )
        class Lenient(Agent):
            max_retries = 0

        history = [
            m
            for i in range(10)
            for m in (Message.user(f"q{i} " * 20), Message.assistant(f"a{i} " * 20))
        ]
        model = ScriptedModel(
            [ContextWindowOverflowError("too long"), *[summarizing(text_response("ok"))] * 3]
        )
        result = await Lenient(model=model).run("go", history=history)
        assert result.output == "ok"
        assert [r.purpose for r in model.requests] == ["chat", "context_compaction", "chat"]
        assert (
            estimate_messages(model.requests[-1].messages)
            <= estimate_messages(model.requests[0].messages) // 2
        )
        events = spans.compactions()
        first = events[0]
        assert first["littleghost.compaction.summary_outcome"] == "complete"
        assert "littleghost.compaction.fallback" not in first
        assert all(e["littleghost.compaction.context_window_tokens"] == 1_000 for e in events)

    @pytest.mark.parametrize("summarize", [True, False])
    async def test_an_overflow_within_the_window_compacted_for_belies_it(
        self, summarize: bool, caplog: pytest.LogCaptureFixture, anyio_backend: str
    ) -> None:
        """The provider reports the prompt's size, not its window, and that size is within
        the window the run compacts for (the model advertises none): the run compacts for
        less than the figure from then on, with one warning, and recovery at least halves
        the request, so the run answers (the request used to come back over the window)."""

        @manage_context(summarize=summarize, budget=None if summarize else PromptBudget())
        class Assumed(Agent):
            pass

        def respond(request: ModelRequest) -> ModelResponse:
            prompt = estimate_messages(request.messages)
            if prompt + (request.max_tokens or 0) > 12_000:
                raise ContextWindowOverflowError("prompt too long", prompt_tokens=prompt)
            return summarizing(text_response("ok"))(request)

        history = [
            Message.user(f"question {i} " + "word " * 60)
            if i % 2 == 0
            else Message.assistant(f"answer {i} " + "text " * 60)
            for i in range(160)
        ]
        model = ScriptedModel([respond] * 3, name=f"belied-{summarize}-{anyio_backend}")
        result = await Assumed(model=model).run("What did I ask first?", history=history)
        first, *_, retried = model.requests
        assert result.output == "ok" and retried.purpose == "chat"
        assert estimate_messages(retried.messages) <= estimate_messages(first.messages) // 2
        (warning,) = [r.getMessage() for r in caplog.records if "overflowed at" in r.getMessage()]
        assert "within the 200000 tokens compacted for" in warning

    async def test_overflows_belying_the_window_at_other_sizes_warn_once_per_model(
        self, caplog: pytest.LogCaptureFixture, anyio_backend: str
    ) -> None:
        """Runs of a long-lived process whose overflows each belie the window at another
        size: one warning for the model, not one (and a remembered figure) per size."""

        @manage_context
        class Assumed(Agent):
            pass

        history = [
            m
            for i in range(10)
            for m in (Message.user(f"q{i} " * 40), Message.assistant("a " * 40))
        ]
        name = f"belied-sizes-{anyio_backend}"
        for prompt in (1_000, 1_100, 1_200, 1_300):
            overflow = ContextWindowOverflowError("prompt too long", prompt_tokens=prompt)
            model = ScriptedModel([overflow, *[summarizing(text_response("ok"))] * 3], name=name)
            assert (await Assumed(model=model).run("go", history=history)).output == "ok"
        warned = [r.getMessage() for r in caplog.records if "overflowed at" in r.getMessage()]
        assert len(warned) == 1 and "overflowed at 1" in warned[0]


def twice_as_dense(request: ModelRequest) -> int:
    """The prompt tokens of a provider that counts the leading instructions and the tool
    schemas as estimated, and the conversation at twice its estimate."""
    lead = next(i for i, m in enumerate(request.messages) if not m.role.is_trusted)
    fixed = estimate_request(request.messages[:lead], request.tools, request.settings)
    return fixed + 2 * estimate_messages(request.messages[lead:])


class TestCarriedOver:
    """What the engine figured for a request carries over to the next one of the run only
    as far as it starts with the same message objects: a message a hook replaced (same
    id, same count), one it inserted, new instructions or a compaction between requests
    leave nothing stale in the next request's figures."""

    @pytest.mark.parametrize(
        "change", ["none", "replaced", "inserted", "instructions", "compacted"]
    )
    async def test_each_count_is_learned_from_the_request_it_counted(self, change: str) -> None:
        """A provider twice as dense: every answer keeps the scale 2 and the estimate of the
        request it answered (``littleghost.context.prompt_count``), whatever changed."""

        def instructions(context: RunContext) -> str:
            if change == "instructions" and context.turn >= 3:
                return "Look things up, and say what you found " + "in full " * 40
            return "Look things up."

        window = 1_500 if change == "compacted" else 100_000

        @manage_context(context_window_tokens=window, preserve_recent_messages=4)
        class Looking(Agent):
            @tool
            def look(self, n: int) -> str:
                """Look item ``n`` up."""
                return f"item {n}: " + "in stock, " * 30

            @before_model
            def change_it(self, request: ModelRequest, context: RunContext) -> ModelRequest | None:
                if context.turn != 3:
                    return None
                messages = list(request.messages)
                if change == "replaced":  # the question, longer, under its own id
                    question = messages[1]
                    messages[1] = attrs.evolve(question, content=question.text + " now" * 60)
                elif change == "inserted":
                    messages.insert(2, Message.user("A note: " + "mind the stock " * 20))
                return attrs.evolve(request, messages=messages)

        def step(n: int) -> Any:
            def respond(request: ModelRequest) -> ModelResponse:
                if request.purpose == "context_compaction":
                    return text_response("- The user looks items up.")
                if n < 8:
                    return tool_call_response(
                        "look", {"n": n}, input_tokens=twice_as_dense(request)
                    )
                return text_response("All found.", input_tokens=twice_as_dense(request))

            return respond

        model = ScriptedModel([step(n) for n in range(8)] + [step(8)] * 4)
        result = await Looking(model=model, instructions=instructions).run("Find items 0 to 7.")
        assert result.output == "All found."
        assert any(m.is_summary for m in result.messages) is (change == "compacted")
        chats = [request for request in model.requests if request.purpose == "chat"]
        answers = [m for m in result.messages if COUNT_KEY in m.metadata]
        assert len(chats) == len(answers) == (8 if change == "compacted" else 9)  # a summary
        for request, answer in zip(chats, answers, strict=True):
            lead = next(i for i, m in enumerate(request.messages) if not m.role.is_trusted)
            kept = answer.metadata[COUNT_KEY]
            rest = estimate_request(request.messages[lead:], request.tools, request.settings)
            assert (kept["messages"], kept["estimate"]) == (len(request.messages), rest)
            assert kept["instructions"] == estimate_messages(request.messages[:lead])
            assert answer.metadata[SCALE_KEY] == 2.0

    @pytest.mark.parametrize("change", ["replaced", "inserted", "compacted", "lowered"])
    async def test_each_request_shows_its_own_results_clipped(self, change: str) -> None:
        """``max_tool_result_tokens`` cuts what each request shows of the results it holds,
        each in its place: one a hook replaced by a short one is shown whole, one it
        replaced by a long one cut, and cuts follow their results when a message is
        inserted before them or a compaction comes between requests; a limit lowered
        during the run cuts the earlier results too."""
        given: list[ModelRequest] = []  # what the hooks gave manage_context's, each turn

        class Rewriting(Agent):  # its hook runs before manage_context's
            @before_model
            def change_it(self, request: ModelRequest, context: RunContext) -> ModelRequest:
                messages = list(request.messages)
                results = [p for p, m in enumerate(messages) if m.tool_results]
                if context.turn >= 3 and change == "replaced":  # the 1st short, the 2nd long
                    for position, text in zip(results, ["short", "long " * 200], strict=False):
                        result = messages[position].tool_results[0]
                        messages[position] = Message.tool(
                            result.call_id, text, id=messages[position].id
                        )
                elif context.turn >= 3 and change == "inserted":  # after the question
                    messages.insert(1, Message.user("A note: " + "mind the stock " * 20))
                elif context.turn == 3 and change == "lowered":
                    self.max_tool_result_tokens = 10
                given.append(attrs.evolve(request, messages=messages))
                return given[-1]

        window = 400 if change == "compacted" else 100_000

        @manage_context(context_window_tokens=window, preserve_recent_messages=4)
        class Clipping(Rewriting):
            max_tool_result_tokens = 20

            @tool
            def look(self, n: int) -> str:
                """Look item ``n`` up."""
                # a short one (80 characters) is cut only at 10 tokens
                return f"item {n}: " + ("in stock, " * 30 if n % 2 else "none, " * 12)

        def step(n: int) -> Any:
            def respond(request: ModelRequest) -> ModelResponse:
                if request.purpose == "context_compaction":
                    return text_response("- The user looks items up.")
                if n < 8:
                    return tool_call_response("look", {"n": n}, call_id=f"c{n}")
                return text_response("All found.")

            return respond

        model = ScriptedModel([step(n) for n in range(8)] + [step(8)] * 4)
        result = await Clipping(model=model).run("Find items 0 to 7.")
        assert result.output == "All found."
        assert any(m.is_summary for m in result.messages) is (change == "compacted")
        sent = [request for request in model.requests if request.purpose == "chat"]
        assert len(sent) == len(given)
        for turn, (hooked, request) in enumerate(zip(given, sent, strict=True)):
            limit = 10 if change == "lowered" and turn >= 3 else 20
            if change != "compacted":  # each message in its place, results clipped
                assert [(m.id, m.role) for m in request.messages] == [
                    (m.id, m.role) for m in hooked.messages
                ]
            whole = {r.call_id: r.content for m in hooked.messages for r in m.tool_results}
            for position, message in enumerate(request.messages):
                for shown in message.tool_results:
                    calls = request.messages[position - 1].tool_calls
                    assert [call.id for call in calls] == [shown.call_id]  # after its call
                    if len(whole[shown.call_id]) <= limit * 4:
                        assert shown.content == whole[shown.call_id]
                    else:
                        assert "truncated" in shown.content
                        assert shown.content.startswith(whole[shown.call_id][:10])


class TestErrors:
    async def test_nothing_to_compact_is_a_compaction_error(self, spans: Spans) -> None:
        @manage_context(
            context_window_tokens=200, compression_threshold=0.1, preserve_recent_messages=50
        )
        class Tight(Agent):
            pass

        model = ScriptedModel([text_response("ok")])
        await Tight(model=model).run(
            "hello " * 30, history=[Message.user("hi"), Message.assistant("hey")]
        )
        (event,) = [
            e for e in spans.compactions() if e["littleghost.compaction.outcome"] == "error"
        ]
        assert event["error.type"] == "CompactionError"

    async def test_no_summary_is_asked_for_what_is_shorter_than_a_summary_s_framing(
        self, spans: Spans
    ) -> None:
        """Only a short greeting is old enough to summarize: a summary of it could not make
        the request smaller, so no summary call is paid for and thrown away."""

        @manage_context(
            context_window_tokens=1_000, compression_threshold=0.5, preserve_recent_messages=3
        )
        class Support(Agent):
            pass

        call = ToolCall("c1", "lookup_order", {"id": "1"})
        history = [
            Message.user("Hi."),
            Message.assistant(tool_calls=[call]),
            Message.tool(call.id, "scan HUB-0042 " * 200),
            Message.assistant("It is on its way."),
        ]
        model = ScriptedModel([summarizing(text_response("Tomorrow."))] * 2)
        await Support(model=model).run("When?", history=history)
        assert [r.purpose for r in model.requests] == ["chat"]
        (event,) = spans.compactions()
        assert event["error.type"] == "CompactionError"

    async def test_compact_session_works_on_a_store_without_a_lock(self) -> None:
        store = PlainStore()
        await store.append(
            "s", [m for i in range(6) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
        )
        records = await compact_session(store, "s", Truncation(minimum_preserved=2))
        assert records and len(await store.load("s")) == 13

    @pytest.mark.parametrize(
        ("options", "named"),
        [
            ({"summary_max_tokens": 1_000}, "summary_max_tokens (1000)"),
            ({"strategy": Summarization(max_tokens=1_000)}, "Summarization.max_tokens (1000)"),
            (
                {"strategy": Pipeline(Truncation(), Summarization(max_tokens=5_000))},
                "Summarization.max_tokens (5000)",
            ),
        ],
        ids=["summary_max_tokens", "Summarization", "Pipeline"],
    )
    def test_a_summary_cap_over_the_window_fails_at_class_definition(
        self, options: dict[str, Any], named: str
    ) -> None:
        """A summary cap not under the window is refused, whichever declares it (a
        ``Summarization``'s was taken and clamped at run time, unlike the keyword)."""
        with pytest.raises(ConfigurationError, match=rf"{re.escape(named)} must be under the"):

            @manage_context(context_window_tokens=1_000, **options)
            class Wrong(Agent):
                pass

    @pytest.mark.parametrize(
        "options",
        [{"summary_max_tokens": 3_000}, {"strategy": Summarization(max_tokens=3_000)}],
        ids=["summary_max_tokens", "Summarization"],
    )
    async def test_a_summary_cap_over_the_models_window_fails_at_the_first_call(
        self, options: dict[str, Any]
    ) -> None:
        @manage_context(**options)
        class Capped(Agent):
            pass

        store_free = Capped(model=ScriptedModel([text_response("x")], context_window=2_048))
        with pytest.raises(ConfigurationError, match="max_tokens \\(3000\\) must be under"):
            await store_free.run("hi")

    @pytest.mark.parametrize("cap", [1_000, 1_001, 50_000])
    @pytest.mark.parametrize("where", ["decorated", "base", "subclass", "window override"])
    def test_a_tool_result_cap_not_under_the_window_fails_at_class_definition(
        self, cap: int, where: str
    ) -> None:
        """A declared ``max_tool_result_tokens`` not under the declared window lets one
        tool result fill it: refused as a summary cap over it is, on the decorated class
        or a class it inherits the cap from, and on a subclass that declares it as the
        agent is made (it may declare a window of its own); one under it is taken, and
        so is ``Agent``'s default over a small window (never declared)."""
        window = {"context_window_tokens": 1_000}
        if where == "window override":
            window = {"context_window_override": 1_000, "context_window_tokens": 100_000}
        declared = {"max_tool_result_tokens": cap}
        base = type("Base", (Agent,), declared if where == "base" else {})
        expected = f"max_tool_result_tokens ({cap}) must be under the 1000-token context window"
        with pytest.raises(ConfigurationError, match=re.escape(expected)) as caught:
            made = manage_context(**window)(  # type: ignore[arg-type]
                type("Wide", (base,), declared if where in ("decorated", "window override") else {})
            )
            type("Sub", (made,), declared if where == "subclass" else {})()
        assert str(caught.value).startswith("Wide: " if where != "subclass" else "Sub: ")
        narrow = {"max_tool_result_tokens": 999}
        made = manage_context(**window)(type("Narrow", (Agent,), narrow))  # type: ignore[arg-type]
        type("NarrowSub", (made,), narrow)()
        manage_context(context_window_tokens=1_000)(type("Default", (Agent,), {}))()

    async def test_a_subclass_declaring_its_own_window_takes_a_cap_under_it(self) -> None:
        """A subclass of a decorated class may declare its own ``@manage_context``: its
        tool result cap is held to its window, not to the one it replaces."""

        @manage_context(context_window_tokens=8_000)
        class Narrow(Agent):
            pass

        @manage_context(context_window_tokens=200_000)
        class Wide(Narrow):
            max_tool_result_tokens = 20_000

        model = ScriptedModel([text_response("x")])
        assert (await Wide(model=model).run("hi")).output == "x"
        with pytest.raises(ConfigurationError, match=r"\(20000\) must be under the 8000-token"):
            type("Inherits", (Narrow,), {"max_tool_result_tokens": 20_000})()

    @pytest.mark.parametrize("given", ["class", "constructor", "set"])
    async def test_a_tool_result_cap_over_the_models_window_fails_at_the_first_call(
        self, given: str
    ) -> None:
        """With the window the model advertises (none declared), a declared
        ``max_tool_result_tokens`` not under it fails the first call, before it goes
        out, however declared: on the class, to the constructor, or set on the agent."""

        @manage_context
        class Capped(Agent):
            if given == "class":
                max_tool_result_tokens = 3_000

        model = ScriptedModel([text_response("x")], context_window=2_048)
        agent = Capped(
            model=model, **({"max_tool_result_tokens": 2_048} if given == "constructor" else {})
        )
        if given == "set":
            agent.max_tool_result_tokens = 5_000
        with pytest.raises(
            ConfigurationError, match=r"max_tool_result_tokens \(\d+\) must be under the 2048"
        ):
            await agent.run("hi")
        assert model.requests == []
        agent.max_tool_result_tokens = 2_047
        assert (await agent.run("hi")).output == "x"

    @pytest.mark.parametrize(
        "options",
        [
            {"summary_instructions": LONG_INSTRUCTIONS},
            {"strategy": Summarization(prompt=LONG_INSTRUCTIONS)},
            {"strategy": Pipeline(Truncation(), Summarization(prompt=LONG_INSTRUCTIONS))},
            {
                "strategy": TokenBudget(
                    token_budget=500, strategies=[Summarization(prompt=LONG_INSTRUCTIONS)]
                )
            },
        ],
        ids=["summary_instructions", "Summarization", "Pipeline", "TokenBudget"],
    )
    def test_summary_instructions_no_summary_call_can_fit_fail_at_class_definition(
        self, options: dict[str, Any]
    ) -> None:
        """Instructions that with the summary call's framing and its least answer take
        more than the room a summary request has would make every compaction fail; the
        error names the keywords to change."""
        field = "summary_instructions" if "strategy" not in options else "Summarization.prompt"
        with pytest.raises(ConfigurationError, match="no summary call fits the 1000-token") as e:

            @manage_context(context_window_tokens=1_000, **options)
            class Wordy(Agent):
                pass

        assert f"larger context_window_tokens or a shorter {field}" in str(e.value)
        with pytest.raises(ConfigurationError, match="larger context_window_override or"):

            @manage_context(context_window_override=1_000, **options)
            class Overridden(Agent):
                pass

    async def test_budget_reserves_over_the_models_window_fail_at_the_first_call(self) -> None:
        @manage_context(
            budget=PromptBudget(response_reserve_tokens=3_000, safety_reserve_tokens=500),
            summarize=False,
        )
        class Reserved(Agent):
            pass

        agent = Reserved(model=ScriptedModel([text_response("x")], context_window=2_048))
        with pytest.raises(ConfigurationError, match="leave no room"):
            await agent.run("hi")
