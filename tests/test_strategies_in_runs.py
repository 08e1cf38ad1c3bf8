"""manage_context(strategy=...): the threshold decides when, the strategy decides how."""

from __future__ import annotations

from typing import Any

import anyio
import attrs
import pytest

from littleghost import Agent, Message, ToolCall, before_model, manage_context, tool
from littleghost.context import (
    CompactionState,
    Pipeline,
    PromptBudget,
    Summarization,
    TokenBudget,
    ToolResultCompaction,
    Truncation,
    always,
    apply_compaction,
    build_view,
    never,
    tokens_exceed,
)
from littleghost.context.records import record_covers
from littleghost.errors import (
    ConfigurationError,
    ContextWindowOverflowError,
    InvalidRequestError,
)
from littleghost.events import CompactionFinished, ModelCallFinished
from littleghost.models import ModelRequest, ModelResponse, Usage, report_usage
from littleghost.testing import ScriptedModel, text_response

from .conftest import Spans
from .conversations import PerMessage

pytestmark = pytest.mark.anyio


def chat(pairs: int) -> list[Message]:
    return [m for i in range(pairs) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]


def managed(strategy: Any, **options: Any) -> type[Agent]:
    settings = {
        "context_window_tokens": 100,
        "compression_threshold": 0.5,
        "tokenizer": PerMessage(),
        "strategy": strategy,
        **options,
    }

    @manage_context(**settings)
    class Managed(Agent):
        instructions = "Be brief."

    return Managed


class TestStrategies:
    async def test_truncation_at_the_threshold_calls_no_model(self, spans: Spans) -> None:
        """Over the threshold the strategy drops the oldest groups; no summary call."""
        history = chat(40)
        model = ScriptedModel([text_response("done")])
        result = await managed(Truncation(minimum_preserved=10))(model=model).run(
            "go", history=history
        )
        assert [r.purpose for r in model.requests] == ["chat"]
        sent = model.requests[0].messages
        assert sent[0].text == "Be brief."
        assert len(sent) < 82 and sent[-1].text == "go"
        assert list(result.messages[:80]) == history
        records = [m for m in result.messages if m.metadata.get("littleghost.compaction.kind")]
        assert records and records[0].metadata["littleghost.compaction.kind"] == "exclusion"
        assert build_view(result.messages[:-1])[-1].text == "go"
        (event,) = spans.compactions()
        assert event["littleghost.compaction.outcome"] == "completed"
        assert spans.one("chat").attributes.get("gen_ai.conversation.compacted") is True

    async def test_below_the_threshold_nothing_happens(self) -> None:
        """The strategy's own trigger does not fire compaction below the threshold."""
        model = ScriptedModel([text_response("done")])
        result = await managed(Truncation(minimum_preserved=1, trigger=always))(model=model).run(
            "go", history=chat(5)
        )
        assert len(model.requests[0].messages) == 12
        assert not any(m.metadata for m in result.messages)

    async def test_tool_results_collapse(self) -> None:
        """ToolResultCompaction turns older tool exchanges into one short message."""
        history: list[Message] = []
        for index in range(15):
            call = ToolCall(f"c{index}", "weather", {"city": f"c{index}"})
            history += [
                Message.user(f"q{index}"),
                Message.assistant(tool_calls=[call]),
                Message.tool(call.id, f"sunny {index}"),
                Message.assistant(f"a{index}"),
            ]
        model = ScriptedModel([text_response("done")])
        await managed(ToolResultCompaction(keep_last_tool_call_groups=2))(model=model).run(
            "go", history=history
        )
        sent = model.requests[0].messages
        assert sum(1 for m in sent if m.tool_calls) == 2
        assert any(m.text.startswith("[Tool results: weather: sunny 0") for m in sent)

    async def test_summarization_uses_the_agents_model(self, spans: Spans) -> None:
        """A Summarization without a model summarizes with the agent's, traced and counted."""

        def summary(request: ModelRequest) -> ModelResponse:
            assert request.purpose == "context_compaction"
            return text_response("earlier talk", input_tokens=7, output_tokens=3)

        model = ScriptedModel([summary, text_response("done", input_tokens=5, output_tokens=1)])
        result = await managed(Summarization(minimum_preserved=4))(model=model).run(
            "go", history=chat(40)
        )
        assert result.usage == Usage(12, 4)
        assert any(m.is_summary for m in model.requests[1].messages)
        purposes = [c.attributes["littleghost.purpose"] for c in spans.named("chat")]
        assert purposes == ["context_compaction", "chat"]

    async def test_summarization_with_its_own_model_is_counted_too(self, spans: Spans) -> None:
        """A cheaper summarizer model is used instead, still traced and counted."""
        cheap = ScriptedModel(
            [text_response("earlier talk", input_tokens=9, output_tokens=2)], name="cheap"
        )
        model = ScriptedModel([text_response("done", input_tokens=5, output_tokens=1)])
        result = await managed(Summarization(model=cheap, minimum_preserved=4))(model=model).run(
            "go", history=chat(40)
        )
        assert len(cheap.requests) == 1 and len(model.requests) == 1
        assert result.usage == Usage(14, 3)
        assert [c.name for c in spans.named("chat")] == ["chat cheap", "chat scripted"]

    async def test_a_summary_call_the_strategy_cut_is_in_its_compactions_usage(self) -> None:
        """A strategy that cuts its own summary call (its own scope: a time limit) and goes
        on: the call's reported usage is in its ``CompactionFinished``, so the events still
        add up to ``result.usage``."""

        class Bounded:
            scope = anyio.CancelScope()

            async def compact(self, state: CompactionState, /) -> None:
                assert state.complete is not None
                with self.scope:
                    await state.complete(ModelRequest([Message.user("Summarize.")]))
                await Truncation(minimum_preserved=4).compact(state)

        strategy = Bounded()

        async def cut(request: ModelRequest) -> None:
            report_usage(Usage(50, 1))  # the prompt's tokens, as Anthropic's stream starts
            strategy.scope.cancel()
            await anyio.sleep(5)

        model = ScriptedModel([cut, text_response("done", input_tokens=5, output_tokens=1)])
        async with managed(strategy)(model=model).stream("go", history=chat(40)) as events:
            told = [
                e async for e in events if isinstance(e, (CompactionFinished, ModelCallFinished))
            ]
        assert [type(e).__name__ for e in told] == ["CompactionFinished", "ModelCallFinished"]
        assert told[0].usage == Usage(50, 1)
        assert events.result.usage == Usage(55, 2) == told[0].usage + told[1].usage

    async def test_overflow_recovery_uses_the_strategy(self) -> None:
        """An overflow is recovered once with the strategy, whatever the threshold."""
        model = ScriptedModel([ContextWindowOverflowError("too long"), text_response("done")])
        strategy = Truncation(minimum_preserved=4)
        result = await managed(strategy, compression_threshold=1.0)(model=model).run(
            "go", history=chat(20)
        )
        assert result.output == "done"
        assert len(model.requests[1].messages) < len(model.requests[0].messages)

    async def test_a_strategy_that_removes_nothing_is_a_failed_compaction(
        self, spans: Spans
    ) -> None:
        """Nothing to do: an error event, the request unchanged."""
        model = ScriptedModel([text_response("done")])
        await managed(Truncation(minimum_preserved=100))(model=model).run("go", history=chat(40))
        assert len(model.requests[0].messages) == 82
        (event,) = spans.compactions()
        assert event["littleghost.compaction.outcome"] == "error"

    async def test_a_strategy_that_saves_nothing_is_a_failed_compaction(self, spans: Spans) -> None:
        """A record as large as the message it stands for: nothing is appended, an error
        event, the request unchanged."""

        class Restate:
            async def compact(self, state: CompactionState) -> None:
                state.collapse(state.candidates(state.slots)[0], "q0, restated")

        model = ScriptedModel([text_response("done")])
        result = await managed(Restate())(model=model).run("go", history=chat(40))
        assert len(model.requests[0].messages) == 82
        assert not any(m.metadata.get("littleghost.compaction.kind") for m in result.messages)
        (event,) = spans.compactions()
        assert event["littleghost.compaction.outcome"] == "error"

    def test_strategy_with_summarize_false_is_rejected(self) -> None:
        """strategy= with summarize=False is a contradiction caught at class definition."""
        with pytest.raises(ConfigurationError, match="strategy"):
            manage_context(strategy=Truncation(), summarize=False, budget=PromptBudget())

    @pytest.mark.parametrize(
        "given",
        [
            {"summary_instructions": "Keep the order numbers."},
            {"summary_max_tokens": 100},
            {"quote_specifics": False},
            {"summary_ratio": 0.5},
            {"mask_tool_results": 2},
        ],
        ids=lambda given: next(iter(given)),
    )
    def test_default_summarizer_keywords_beside_a_strategy_are_rejected(
        self, given: dict[str, Any]
    ) -> None:
        """Keywords only the default summarizer reads would be ignored beside strategy=
        (the summary was sent with the strategy's own cap and prompt): refused, naming
        the keyword."""
        (name,) = given
        with pytest.raises(ConfigurationError, match=f"{name} shapes the default summarizer"):
            manage_context(strategy=Summarization(), **given)

    def test_a_summary_cap_beside_a_strategy_caps_the_budgets_summaries(self) -> None:
        """With a budget, summary_max_tokens also caps the summaries it shows: accepted."""

        @manage_context(strategy=Summarization(), summary_max_tokens=100, budget=PromptBudget())
        class Capped(Agent):
            pass

        assert Capped.context_management is not None
        assert Capped.context_management.summary_max_tokens == 100

    def test_a_non_strategy_is_rejected(self) -> None:
        """strategy= must be a strategy."""
        with pytest.raises(ConfigurationError, match="strategy"):
            manage_context(strategy="truncate")


def wordy(pairs: int) -> list[Message]:
    """Exchanges of about 50 estimated tokens each message, with no specifics to quote."""
    words = "tell me more about the weather over the hills and the rivers " * 3
    return [m for _ in range(pairs) for m in (Message.user(words), Message.assistant(words))]


class TestSummaryCap:
    @pytest.mark.parametrize(
        ("make", "cap"),
        [
            (lambda own: Summarization(), 500),  # a quarter of the agent's 2 000 tokens
            (lambda own: Pipeline(Summarization()), 500),
            (lambda own: Summarization(max_tokens=700), 700),  # given: kept
        ],
    )
    async def test_a_strategys_summary_is_capped_by_the_window(self, make: Any, cap: int) -> None:
        """Without max_tokens, a Summarization strategy's summary cap is a quarter of the
        window its request is fitted to, as the default summarizer's: a 1 024-token
        summary in a 2 000-token window left the conversation little room."""
        own = ScriptedModel([text_response("- they talked")], context_window=1_000)
        model = ScriptedModel([text_response("- they talked"), text_response("done")])

        @manage_context(context_window_tokens=2_000, strategy=make(own))
        class Managed(Agent):
            pass

        await Managed(model=model).run("go", history=wordy(20))
        (summary,) = [r for r in [*own.requests, *model.requests] if r.purpose != "chat"]
        assert summary.max_tokens == cap

    @pytest.mark.parametrize(("window", "pairs", "cap"), [(3_000, 18, 750), (None, 30, 1_024)])
    async def test_ad_hoc_its_own_models_window_caps_it(
        self, window: int | None, pairs: int, cap: int
    ) -> None:
        """Ad hoc, a quarter of its own model's advertised window (1 024 without one)."""
        model = ScriptedModel([text_response("- they talked")], context_window=window)
        await apply_compaction(wordy(pairs), Summarization(model=model))
        assert model.requests[0].max_tokens == cap

    async def test_notes_past_a_quarter_of_the_window_are_rewritten(self) -> None:
        """Earlier notes of about 600 tokens in a 2 000-token window reach the cap, so the
        next summary rewrites them shorter; under 1 024 they were appended to, and one
        summary grew past half the window."""
        from littleghost.context.summarize import summary_message

        older = wordy(4)
        notes = "\n".join(f"- the hills and the rivers, note {'i' * n}" for n in range(1, 50))
        log = [*older, summary_message(notes, [m.id for m in older]), *wordy(14)]
        model = ScriptedModel([text_response("- they talked"), text_response("done")])

        @manage_context(context_window_tokens=2_000, strategy=Summarization())
        class Managed(Agent):
            pass

        await Managed(model=model).run("go", history=log)
        summary, chat = model.requests
        assert "Current notes:" in summary.messages[-1].text  # a rewrite
        (kept,) = [m for m in chat.messages if m.is_summary]
        assert "note i\n" not in kept.text and len(kept.text) < 400


class TestFailedCompaction:
    async def test_a_compaction_error_says_why_without_content(
        self, spans: Spans, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A CompactionError's reason (figures and framework words) is on the event, the
        span event and the log line, for an operator to read."""
        model = ScriptedModel([text_response("done")])
        agent = managed(Truncation(minimum_preserved=1_000))(model=model)
        with caplog.at_level("INFO", "littleghost.context"):
            async with agent.stream("go", history=chat(40)) as events:
                (finished,) = [e async for e in events if isinstance(e, CompactionFinished)]
        assert finished.outcome == "error" and finished.error_type == "CompactionError"
        assert finished.error_message is not None
        assert finished.error_message.startswith("nothing to compact: the preserved messages")
        (event,) = spans.compactions()
        assert event["littleghost.compaction.error_message"] == finished.error_message
        assert finished.error_message in caplog.text

    @pytest.mark.parametrize(
        "strategy",
        [
            Truncation(trigger=tokens_exceed(1_000)),
            Truncation(trigger=never),
            Pipeline(ToolResultCompaction(trigger=never), Truncation(trigger=tokens_exceed(1_000))),
            TokenBudget(token_budget=1_000),
        ],
        ids=["tokens_exceed", "never", "Pipeline", "TokenBudget"],
    )
    async def test_a_strategy_whose_trigger_does_not_hold_says_so(self, strategy: Any) -> None:
        """At the threshold, a strategy whose trigger does not hold (one over the window,
        say), or a token budget not exceeded, leaves the request as it was: the reason says
        so, not that only the preserved messages are left."""
        model = ScriptedModel([text_response("done")])
        agent = managed(strategy, preserve_recent_messages=2)(model=model)
        async with agent.stream("go", history=chat(40)) as events:
            (finished,) = [e async for e in events if isinstance(e, CompactionFinished)]
        assert finished.outcome == "error" and finished.error_message is not None
        assert finished.error_message.startswith(
            "nothing to compact: the strategy does not start at about"
        )

    async def test_a_providers_error_text_is_never_the_reason(
        self, spans: Spans, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Another error's text may carry content (a provider's echoes the prompt): only
        its type is told."""
        secret = "echoed prompt: my card is 4111-1111"
        model = ScriptedModel([InvalidRequestError(secret), text_response("done")])
        agent = managed(Summarization(minimum_preserved=4))(model=model)
        with caplog.at_level("DEBUG"):
            async with agent.stream("go", history=chat(40)) as events:
                (finished,) = [e async for e in events if isinstance(e, CompactionFinished)]
        assert finished.error_type == "InvalidRequestError"
        assert finished.error_message is None
        (event,) = spans.compactions()
        assert "littleghost.compaction.error_message" not in event
        assert secret not in str(event) and "4111" not in caplog.text


class TestTools:
    async def test_a_tool_loop_with_a_strategy(self) -> None:
        """Every model call of a tool loop is checked; the run completes."""

        @manage_context(
            context_window_tokens=40,
            compression_threshold=0.5,
            tokenizer=PerMessage(),
            strategy=Truncation(minimum_preserved=4),
        )
        class Looping(Agent):
            @tool
            def ping(self) -> str:
                """Ping."""
                return "pong"

        from littleghost.testing import tool_call_response

        model = ScriptedModel(
            [*(tool_call_response("ping", {}) for _ in range(5)), text_response("done")]
        )
        result = await Looping(model=model).run("go", history=chat(8))
        assert result.output == "done"
        assert all(len(r.messages) <= 22 for r in model.requests)


class TestProtection:
    async def test_a_strategy_never_removes_the_current_question(self) -> None:
        """In a tool loop, a strategy's records never cover the turn's user request."""
        from littleghost.context import TokenBudget
        from littleghost.testing import tool_call_response

        @manage_context(
            context_window_tokens=30,
            compression_threshold=0.5,
            tokenizer=PerMessage(),
            strategy=TokenBudget(token_budget=4),
        )
        class Looping(Agent):
            @tool
            def ping(self) -> str:
                """Ping."""
                return "pong"

        model = ScriptedModel(
            [*(tool_call_response("ping", {}) for _ in range(8)), text_response("done")]
        )
        result = await Looping(model=model).run("THE QUESTION", history=chat(4))
        for request in model.requests:
            assert any(m.text == "THE QUESTION" for m in request.messages)
        question = next(m for m in result.messages if m.text == "THE QUESTION")
        from littleghost.context.records import record_covers

        assert all(question.id not in record_covers(m) for m in result.messages)


class TestRetry:
    async def test_an_overflow_retry_never_brings_back_what_a_compaction_left_out(self) -> None:
        """A hook adds a note where a threshold compaction cut the history: the retry of an
        overflow goes without the messages the exclusion hides (they came back, and the
        retry overflowed again)."""

        class Noting(Agent):
            @before_model
            def note(self, request: ModelRequest) -> ModelRequest:
                system, *rest = request.messages
                note = Message.developer("Note: be kind.")
                return attrs.evolve(request, messages=[system, note, *rest])

        @manage_context(
            context_window_tokens=600,
            compression_threshold=0.3,
            preserve_recent_messages=3,
            strategy=Truncation(minimum_preserved=0),
        )
        class Managed(Noting):
            instructions = "Be brief."

        sizes: list[int] = []

        def provider(request: ModelRequest) -> ModelResponse:
            """Its window takes the first request less a turn: over it, an overflow."""
            sizes.append(len(request.messages))
            if sizes[-1] >= sizes[0]:
                raise ContextWindowOverflowError("too long")
            return text_response("done")

        model = ScriptedModel([provider, provider])
        history = [
            message
            for index in range(6)
            for message in (
                Message.user(f"question {index} " + "word " * 15),
                Message.assistant(f"answer {index} " + "word " * 15),
            )
        ]
        result = await Managed(model=model).run("go", history=history)
        assert result.output == "done"
        hidden = {covered for m in result.messages for covered in record_covers(m)}
        first, retried = model.requests
        assert not hidden.intersection(m.id for m in retried.messages)
        assert len(retried.messages) < len(first.messages)
        assert all(len(record_covers(m)) == len(set(record_covers(m))) for m in result.messages)
        covered = [c for m in result.messages for c in record_covers(m)]
        assert len(covered) == len(set(covered))  # nothing left out twice


class Reckless:
    """Removes a group a run keeps (``back`` from the newest) with one of the state's steps."""

    def __init__(self, step: str, back: int) -> None:
        self.step, self.back = step, back

    async def compact(self, state: CompactionState, /) -> None:
        slot = state.slots - self.back
        state.exclude(1)  # an old group (after the instructions): allowed
        if self.step == "exclude":
            state.exclude(slot)
        elif self.step == "collapse":
            state.collapse(slot, "gone")
        elif self.step == "merge":
            state.merge([2, slot], "gone")
        else:
            state.summarize([2, slot], "gone")


@pytest.mark.parametrize("step", ["exclude", "collapse", "merge", "summarize"])
@pytest.mark.parametrize("back", [1, 2], ids=["the question", "the tail"])
async def test_a_custom_strategy_cannot_remove_what_a_run_keeps(
    spans: Spans, step: str, back: int
) -> None:
    """The current question (pinned) and the preserved tail (protected) are refused by
    every step of the state: the compaction fails, the request goes out unchanged."""
    model = ScriptedModel([text_response("done")])
    await managed(Reckless(step, back))(model=model).run("go", history=chat(40))
    sent = model.requests[0].messages
    assert len(sent) == 82 and sent[-1].text == "go"
    (event,) = spans.compactions()
    assert event["littleghost.compaction.outcome"] == "error"
    assert event["error.type"] == "ValueError"


class TestViewReuse:
    async def test_a_late_result_after_a_summary_stays_after_its_call(self) -> None:
        """Reusing last turn's view puts a late tool result right after its call."""
        from littleghost.context import TokenBudget, apply_compaction
        from littleghost.context.summarize import summary_message

        first, answer = Message.user("q0"), Message.assistant("a1")
        call = Message.assistant("", [ToolCall("c1", "lookup", {})])
        log = [first, answer, summary_message("they talked", [first.id, answer.id]), call]
        later = [*log, Message.tool("c1", "result")]
        strategy = TokenBudget(token_budget=10**6)
        await apply_compaction(log, strategy)
        reused = await apply_compaction(later, strategy)
        assert [m.role.value for m in reused] == ["user", "assistant", "tool"]
        assert list(reused) == list(build_view(later))
