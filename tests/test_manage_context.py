"""@manage_context: proactive compaction, overflow recovery, failures and telemetry."""

from __future__ import annotations

import contextlib
import functools
import json
import math
import traceback
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import attrs
import pytest
from opentelemetry.trace import SpanKind, StatusCode

import littleghost.run
from littleghost import (
    Agent,
    Message,
    ReasoningPart,
    Role,
    ToolCall,
    after_model_error,
    before_model,
    manage_context,
    tool,
)
from littleghost.context import (
    ByteEstimator,
    CharacterEstimator,
    PromptBudget,
    Truncation,
    build_view,
)
from littleghost.context.calibration import SCALE_FOR_KEY, SCALE_KEY, scale_for
from littleghost.context.config import ContextManagement, ContextOptions
from littleghost.context.management import AFTER_KEY, RECOUNTS, remembered
from littleghost.context.outside import RequestPreview, preview_request
from littleghost.context.records import is_record, record_covers
from littleghost.context.summarize import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    SUMMARY_FRAMING,
    SUMMARY_PREFIX,
    summary_message,
)
from littleghost.context.tokens import estimate_messages, estimate_request
from littleghost.errors import (
    CleanupError,
    CompactionError,
    ConfigurationError,
    ContextWindowOverflowError,
    DeadlineExceededError,
    InvalidRequestError,
    ProtocolError,
    ProviderUnavailableError,
    RateLimitError,
    SessionStoreError,
)
from littleghost.events import CompactionFinished, CompactionStarted
from littleghost.messages import SUMMARY_COVERS_KEY, ImagePart, TextPart
from littleghost.models import Model, ModelRequest, ModelResponse, StopReason, Usage
from littleghost.run import RunContext, RunResult
from littleghost.runner import instructions_message
from littleghost.sessions.memory import InMemorySessionStore
from littleghost.testing import (
    Fact,
    ScriptedModel,
    check_retention,
    text_response,
    tool_call_response,
)

from .conftest import Spans
from .conversations import PerMessage, chat, compacted_twice, summary_step

pytestmark = pytest.mark.anyio


@manage_context(
    context_window_tokens=100,
    compression_threshold=0.5,
    preserve_recent_messages=4,
    tokenizer=PerMessage(),
)
class Small(Agent):
    instructions = "Be brief."


@manage_context(context_window_tokens=1_000, compression_threshold=1.0)
class Lenient(Agent):
    """A 1 000-token window, compacted only when the model says it overflowed."""

    max_retries = 0
    instructions = "Be brief."


@manage_context(context_window_tokens=1_000, compression_threshold=1.0)
class Uninstructed(Agent):
    """``Lenient`` without instructions."""

    max_retries = 0


class Pinging(Agent):
    """An agent with one tool, for tool loops."""

    @tool
    def ping(self) -> str:
        """Ping."""
        return "pong"


def pinging(
    times: int, summary: str = "summary", call: ModelResponse | None = None
) -> ScriptedModel:
    """A model that calls ``ping`` ``times`` times (answering with ``call`` when given),
    then says "done"; its summary calls answer ``summary``."""
    chats = 0

    def respond(request: ModelRequest) -> ModelResponse:
        nonlocal chats
        if request.purpose == "context_compaction":
            return text_response(summary)
        chats += 1
        if chats > times:
            return text_response("done")
        return call or tool_call_response("ping", {})

    return ScriptedModel([respond] * 40)


class TestDeclaration:
    async def test_context_management_set_to_none_turns_it_off(self) -> None:
        """``context_management = None`` on an agent, or on a subclass after its
        definition, turns the class's @manage_context off for it: no compaction before a
        call, no recovery after an overflow (the class itself still compacts)."""
        managed = ScriptedModel([text_response("summary"), text_response("ok")])
        await Small(model=managed).run("go", history=chat(30))
        assert [r.purpose for r in managed.requests] == ["context_compaction", "chat"]

        class Unmanaged(Small):
            pass

        Unmanaged.context_management = None
        instance = Small(model=ScriptedModel([]))
        instance.context_management = None
        for agent in (Unmanaged(model=ScriptedModel([])), instance):
            overflow = ContextWindowOverflowError("too long", prompt_tokens=500)
            model = ScriptedModel([text_response("ok"), overflow])
            agent.model = model
            result = await agent.run("go", history=chat(30))
            assert [r.purpose for r in model.requests] == ["chat"]
            assert len(model.requests[0].messages) == len(result.messages)  # + instructions
            with pytest.raises(ContextWindowOverflowError) as caught:
                await agent.run("again", history=result.messages)
            assert caught.value is overflow and caught.value.__cause__ is None
            assert [r.purpose for r in model.requests] == ["chat", "chat"]

    async def test_context_management_of_another_kind_is_refused(self) -> None:
        """An agent's ``context_management`` is ``None`` or the configuration of a class
        that ``@manage_context`` decorates: another value set on an agent fails as it is
        set, and one set on a class after its definition fails as an agent of it is made
        (it was made), and the run of one made before (and a fact check, which compacts with
        it) before any call, not half managing the run."""
        instance = Small(model=ScriptedModel([]))
        with pytest.raises(ConfigurationError, match=r"Small.context_management cannot be 5"):
            instance.context_management = 5
        instance.context_management = attrs.evolve(Small.context_management, summary_ratio=0.5)

        class Plain(Agent):
            pass

        with pytest.raises(ConfigurationError, match="decorate Plain with @manage_context"):
            Plain(model=ScriptedModel([])).context_management = ContextManagement()

        class Later(Small):
            pass

        for value, classes in (("off", (Plain, Later)), (ContextManagement(), (Plain,))):
            model = ScriptedModel([text_response("ok")])
            made = {cls: cls(model=model) for cls in classes}
            Plain.context_management = Later.context_management = value
            for cls, agent in made.items():
                with pytest.raises(ConfigurationError, match=rf"{cls.__name__}.context_man"):
                    cls(model=model)  # as it is made, once set on its class
                with pytest.raises(ConfigurationError, match=rf"{cls.__name__}.context_man"):
                    await agent.run("go")
                with pytest.raises(ConfigurationError, match=rf"{cls.__name__}.context_man"):
                    await check_retention(agent, chat(4), [Fact("q?", "a")])
                assert model.requests == []
            del Plain.context_management, Later.context_management
        assert (await Later(model=ScriptedModel([text_response("ok")])).run("go")).output == "ok"

    @pytest.mark.parametrize(
        "options",
        [
            {"summary_max_tokens": 5_000},
            {"context_window_override": 64},
            {"budget": PromptBudget(response_reserve_tokens=600, safety_reserve_tokens=500)},
            {"summarize": False},
            {"summary_instructions": "Summarize. " * 2_000},
            {"strategy": Truncation(), "summary_ratio": 0.5},
            {"compression_threshold": 0},
            {"preserve_recent_messages": 1},
        ],
    )
    def test_a_configuration_set_on_an_agent_is_checked_as_a_class_s(
        self, options: dict[str, Any]
    ) -> None:
        """What ``@manage_context`` refuses at class definition (a summary cap over the
        window, reserves that fill it, no summary call fitting, options that contradict)
        is refused as a configuration made for one agent is made, with the same error:
        the checks are the configuration's own, not the decorator's."""
        with pytest.raises(ConfigurationError) as declared:
            manage_context(context_window_tokens=1_000, **options)(type("Declared", (Agent,), {}))
        agent = Lenient(model=ScriptedModel([]))
        with pytest.raises(ConfigurationError) as set_on_agent:
            agent.context_management = attrs.evolve(agent.context_management, **options)
        assert str(set_on_agent.value) == str(declared.value)
        assert agent.context_management is Lenient.context_management

    def test_bare_and_with_keywords(self) -> None:
        """Bare use gives the defaults; keywords set the fields of a frozen config."""

        @manage_context
        class Bare(Agent):
            pass

        @manage_context(compression_threshold=0.75, preserve_recent_messages=12)
        class Tuned(Agent):
            pass

        assert Bare.context_management == ContextManagement()
        config = Bare.context_management
        assert (config.context_window_tokens, config.compression_threshold) == (200_000, 0.85)
        assert (config.summary_ratio, config.preserve_recent_messages) == (0.3, 10)
        assert Tuned.context_management.compression_threshold == 0.75
        assert Tuned.context_management.preserve_recent_messages == 12
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            Tuned.context_management.summary_ratio = 0.5  # type: ignore[misc]

    def test_off_until_declared(self) -> None:
        """``Agent.context_management`` is None until declared."""
        assert Agent.context_management is None

        class Plain(Agent):
            pass

        assert Plain.context_management is None

    @pytest.mark.parametrize(
        ("keyword", "value", "words"),
        [
            ("context_window_tokens", 0, "from 1 to 2**63-1"),
            ("context_window_tokens", 1.5, "int"),
            ("compression_threshold", 0, "(0, 1]"),
            ("compression_threshold", 1.01, "(0, 1]"),
            ("summary_ratio", 0.05, "[0.1, 0.8]"),
            ("summary_ratio", 0.9, "[0.1, 0.8]"),
            ("preserve_recent_messages", 1, ">= 2"),
            ("preserve_recent_messages", True, ">= 2"),
            ("tokenizer", object(), "count_tokens"),
            ("summary_max_tokens", 0, "from 1 to 2147483647"),
            ("summary_max_tokens", 2**31, "from 1 to 2147483647"),
            ("summary_instructions", "  ", "non-empty"),
        ],
    )
    def test_invalid_values_fail_at_class_definition(
        self, keyword: str, value: object, words: str
    ) -> None:
        """An invalid value raises ConfigurationError naming the parameter and its range."""
        with pytest.raises(ConfigurationError) as caught:

            @manage_context(**{keyword: value})
            class Broken(Agent):
                pass

        assert keyword in str(caught.value)
        assert words in str(caught.value)

    def test_only_agent_classes(self) -> None:
        """Decorating something else, an agent or ``Agent`` itself (whose management every
        agent class would inherit), is a ConfigurationError saying so."""
        with pytest.raises(ConfigurationError, match="Agent subclass"):
            manage_context(int)
        with pytest.raises(ConfigurationError, match=r"Agent subclass, not <.*Agent object"):
            manage_context(Agent())
        with pytest.raises(ConfigurationError, match="not Agent itself: every agent class"):
            manage_context(compression_threshold=0.5)(Agent)
        assert Agent.context_management is None and Agent.capabilities == ()

    async def test_redeclaring_on_a_subclass_replaces_it_there_only(self) -> None:
        """A subclass's declaration wins for it; the parent keeps its own; hooks run once."""

        @manage_context(context_window_tokens=100, tokenizer=PerMessage())
        class Parent(Agent):
            pass

        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Child(Parent):
            pass

        assert Parent.context_management.compression_threshold == 0.85
        assert Child.context_management.compression_threshold == 0.5
        model = ScriptedModel([summary_step(), text_response("done")])
        await Child(model=model).run("go", history=chat(30))
        assert [request.purpose for request in model.requests] == ["context_compaction", "chat"]
        # Hooks registered twice would compact twice for one overflow (or refuse the
        # retry); registered once, one overflow is one compaction and one retry.
        overflow = ScriptedModel(
            [ContextWindowOverflowError("too long"), summary_step(), text_response("done")]
        )
        await Child(model=overflow).run("go", history=chat(10))
        assert [r.purpose for r in overflow.requests] == ["chat", "context_compaction", "chat"]

    async def test_a_developer_note_a_hook_adds_is_not_one_of_the_preserved_messages(
        self,
    ) -> None:
        """``preserve_recent_messages`` counts the conversation: a parent's hook's note
        among the newest messages does not take the place of one of them."""

        class Reminded(Agent):
            instructions = "Be brief."

            @before_model
            def remind(self, request: ModelRequest) -> ModelRequest:
                *earlier, last = request.messages
                note = Message.developer("Answer in English.", id="note")
                return attrs.evolve(request, messages=(*earlier, note, last))

        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.1,
            preserve_recent_messages=4,
            summary_ratio=0.8,
            tokenizer=PerMessage(),
        )
        class Managed(Reminded):
            pass

        model = ScriptedModel([summary_step(), text_response("done")])
        await Managed(model=model).run("go", history=chat(6))
        assert [request.purpose for request in model.requests] == ["context_compaction", "chat"]
        sent = [message.text for message in model.requests[1].messages]
        assert sent[2:] == ["m answer 4", "m question 5", "m answer 5", "Answer in English.", "go"]

    async def test_own_hooks_see_the_compacted_request_and_parents_run_first(self) -> None:
        """Capability hooks run after the parent's hooks and before the class's own."""
        seen: list[tuple[str, int]] = []

        class Base(Agent):
            @before_model
            def parent_hook(self, request: ModelRequest) -> None:
                seen.append(("parent", len(request.messages)))

        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Managed(Base):
            @before_model
            def own_hook(self, request: ModelRequest) -> None:
                seen.append(("own", len(request.messages)))

        model = ScriptedModel([summary_step(), text_response("done")])
        await Managed(model=model).run("go", history=chat(30))
        assert seen[0] == ("parent", 61)
        assert seen[1][0] == "own" and seen[1][1] < 61
        assert seen[1][1] == len(model.requests[1].messages)

    @pytest.mark.parametrize("window", ["big", -5, 1.5, True, 2**63, 10**400])
    async def test_a_models_window_that_is_no_count_of_tokens_is_named(
        self, window: object
    ) -> None:
        """A model of your own advertising a ``context_window`` that is no count of
        tokens (0 is taken for unknown, as ``None``) fails the first call, naming the
        model and the value, before the model is asked: it was taken for no window at
        all, with a warning that said only that it advertised none; one past 2**63-1
        failed in the estimates' arithmetic (``OverflowError``)."""

        class Odd(ScriptedModel):
            @property
            def context_window(self) -> Any:
                return window

        model = Odd([text_response("never")], name="odd")
        with pytest.raises(ConfigurationError) as caught:
            await Small(model=model).run("go")
        assert str(caught.value) == (
            f"manage_context: model 'odd' advertises a context_window of {window!r}: it must "
            "be an int from 1 to 2**63-1 (tokens), or None (or 0) when unknown"
        )
        assert model.requests == []


class TestWhenItFires:
    async def test_fires_exactly_at_the_threshold(self) -> None:
        """Estimate == threshold × window compacts; one message less does not."""

        # PerMessage: one token per message; 49 pairs + the new user message = 99 + the
        # instructions = 100 tokens; threshold 0.5 × window 200 = 100.
        @manage_context(
            context_window_tokens=200,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class AtThreshold(Agent):
            instructions = "Be brief."

        at = ScriptedModel([summary_step(), text_response("done")])
        await AtThreshold(model=at).run("go", history=chat(49))
        assert [r.purpose for r in at.requests] == ["context_compaction", "chat"]

        below = ScriptedModel([text_response("done")])
        await AtThreshold(model=below).run("go", history=chat(49)[1:])
        assert [r.purpose for r in below.requests] == ["chat"]

    async def test_does_not_fire_below(self) -> None:
        """A short conversation is sent as is."""
        model = ScriptedModel([text_response("done")])
        result = await Small(model=model).run("go", history=chat(3))
        assert len(model.requests) == 1
        assert len(model.requests[0].messages) == 8
        assert not any(m.is_summary for m in result.messages)

    async def test_the_models_advertised_window_wins(self) -> None:
        """A model advertising a larger window keeps the conversation whole."""
        model = ScriptedModel([text_response("done")], context_window=10_000)
        await Small(model=model).run("go", history=chat(30))
        assert [r.purpose for r in model.requests] == ["chat"]

    async def test_a_non_positive_advertised_window_falls_back(self) -> None:
        """An advertised window of 0 is ignored in favour of the configured one."""
        model = ScriptedModel([summary_step(), text_response("done")], context_window=0)
        await Small(model=model).run("go", history=chat(30))
        assert [r.purpose for r in model.requests] == ["context_compaction", "chat"]

    async def test_max_tokens_counts_toward_the_estimate(self) -> None:
        """The room the answer needs (max_tokens) is part of the estimate."""
        model = ScriptedModel([summary_step(), text_response("done")])
        await Small(model=model).run("go", history=chat(10), settings={"max_tokens": 40})
        assert [r.purpose for r in model.requests] == ["context_compaction", "chat"]
        quiet = ScriptedModel([text_response("done")])
        await Small(model=quiet).run("go", history=chat(10))
        assert [r.purpose for r in quiet.requests] == ["chat"]

    async def test_reasoning_details_count_toward_the_estimate(self) -> None:
        """OpenRouter's reasoning_details go back with their answer (Claude's signed
        thinking, long): the estimate counts them, so a conversation they fill past the
        threshold is compacted; it was sent whole, estimated without them."""
        details = json.dumps([{"type": "reasoning.text", "text": "Hmm. " * 400, "signature": "s"}])
        thought = Message(
            Role.ASSISTANT, [ReasoningPart("", details, "openrouter"), TextPart("m answer 1")]
        )
        history = [*chat(1), Message.user("m question 1"), thought, *chat(3, prefix="n")]

        @manage_context(
            context_window_tokens=1_000, compression_threshold=0.5, preserve_recent_messages=4
        )
        class Thinking(Agent):
            pass

        model = ScriptedModel([summary_step(), text_response("done")])
        await Thinking(model=model).run("go", history=history)
        assert [r.purpose for r in model.requests] == ["context_compaction", "chat"]

    async def test_unsent_reasoning_does_not_count_toward_the_estimate(self) -> None:
        """An OpenAI-compatible server's reasoning of an answer without tool calls never
        goes back: a reasoning model's conversation, far under the window as sent, is
        not compacted for it (it was, then at every run after, its counts refused)."""
        thought = ReasoningPart("Hmm. " * 400, None, "openai")
        history = [
            message
            for index in range(3)
            for message in (
                Message.user(f"m question {index}"),
                Message(Role.ASSISTANT, [thought, TextPart(f"m answer {index}")]),
            )
        ]

        @manage_context(
            context_window_tokens=1_000, compression_threshold=0.5, preserve_recent_messages=4
        )
        class Thinking(Agent):
            pass

        model = ScriptedModel([text_response("done")])
        await Thinking(model=model).run("go", history=history)
        assert [r.purpose for r in model.requests] == ["chat"]

    async def test_tool_schemas_count_toward_the_estimate(self) -> None:
        """Tool schemas are estimated with the messages."""
        calls: list[str] = []

        class Recording:
            def count_tokens(self, text: str) -> int:
                calls.append(text)
                return 1

        @manage_context(tokenizer=Recording())
        class WithTool(Agent):
            @tool
            def lookup_order(self, order_id: str) -> str:
                """Find an order."""
                return "ok"

        await WithTool(model=ScriptedModel([text_response("done")])).run("go")
        assert any("lookup_order" in text and "order_id" in text for text in calls)

    async def test_the_estimate_anchors_on_reported_input_tokens(self) -> None:
        """After a provider reports input tokens, the next estimate starts from them."""

        @manage_context(
            context_window_tokens=1_000,
            compression_threshold=0.5,
            preserve_recent_messages=2,
            tokenizer=PerMessage(),
        )
        class Anchored(Agent):
            @tool
            def ping(self) -> str:
                """Ping."""
                return "pong"

        model = ScriptedModel(
            [
                tool_call_response("ping", {}, input_tokens=600),
                summary_step(),
                text_response("done"),
            ]
        )
        await Anchored(model=model).run("go", history=chat(5))

    async def test_estimating_a_turn_counts_only_new_messages(self) -> None:
        """Per-message estimates are cached: a later turn counts what was added."""
        counted: list[str] = []

        class Counting:
            def count_tokens(self, text: str) -> int:
                counted.append(text)
                return 1

        @manage_context(tokenizer=Counting())
        class Looping(Pinging):
            pass

        model = ScriptedModel(
            [tool_call_response("ping", {}), tool_call_response("ping", {}), text_response("done")]
        )
        await Looping(model=model).run("go", history=chat(200))
        message_texts = [
            t
            for t in counted
            if t.startswith(("user: ", "assistant: ", "tool: "))
            and not t.startswith("user: Transcript:")  # the window's check of a summary call
        ]
        # 401 messages on the first turn, then 2 new messages per turn.
        assert len(message_texts) == 401 + 2 + 2


class TestWhatIsSent:
    async def test_summary_request_is_a_transcript_in_one_user_message(self) -> None:
        """Instructions plus one user message with a role-tagged transcript (reasoning left
        out); no tools, no extended thinking and no prompt caching."""

        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Tooled(Agent):
            @tool
            def ping(self) -> str:
                """Ping."""
                return "pong"

        history = [
            Message.user("check the order"),
            Message(
                Role.ASSISTANT,
                [
                    ReasoningPart("private musing", "sig", "anthropic"),
                    ToolCall("c1", "lookup_order", {"order_id": "42"}),
                ],
            ),
            Message.tool("c1", "shipped"),
            Message.assistant("It shipped."),
            *chat(25),
        ]
        model = ScriptedModel([summary_step(), text_response("done")])
        thinking = {"type": "enabled", "budget_tokens": 8_000}
        settings = {
            "temperature": 0,
            "seed": 3,
            "thinking": thinking,
            "max_completion_tokens": 9,
            "cache_control": {"type": "ephemeral"},
        }
        await Tooled(model=model).run("go", history=history, settings=settings)
        summary_call = model.requests[0]
        assert summary_call.tools == ()
        assert [m.role for m in summary_call.messages] == [Role.SYSTEM, Role.USER]
        transcript = summary_call.messages[1].text
        assert "User: check the order" in transcript
        assert 'Assistant called lookup_order({"order_id": "42"})' in transcript
        assert "Tool result (lookup_order): shipped" in transcript
        assert "private musing" not in transcript and "sig" not in transcript
        assert transcript.startswith("Transcript:\n<<<\n")
        assert transcript.endswith("\n>>>\n\n" + DEFAULT_SUMMARY_INSTRUCTIONS)  # no question
        assert summary_call.messages[0].text == SUMMARY_FRAMING
        assert not any(m.tool_calls or m.tool_results for m in summary_call.messages)
        assert summary_call.settings["temperature"] == 0 and summary_call.settings["seed"] == 3
        assert summary_call.settings["max_tokens"] == 25  # a quarter of the 100-token window
        assert "thinking" not in summary_call.settings  # its budget would pass the cap
        assert "max_completion_tokens" not in summary_call.settings  # the answer's cap
        assert "cache_control" not in summary_call.settings  # a summary's prompt is read once
        assert model.requests[1].settings["thinking"] == thinking
        assert model.requests[1].settings["cache_control"] == {"type": "ephemeral"}

    @pytest.mark.parametrize(
        ("effort", "summarized"),
        [("xhigh", "low"), ("high", "low"), ("medium", "low"), ("low", "low"),
         ("minimal", "minimal"), ("none", "none"), (None, None)],
    )  # fmt: skip
    async def test_a_summary_call_reasons_at_low_effort_at_most(
        self, effort: str | None, summarized: str | None
    ) -> None:
        """A reasoning model's hidden reasoning counts against the summary's small cap:
        a ``reasoning_effort`` above ``low`` is lowered to it for the summary call alone;
        a lower one, or none, is sent as it is."""
        model = ScriptedModel([summary_step(), text_response("done")])
        settings = {} if effort is None else {"reasoning_effort": effort}
        await Small(model=model).run("go", history=chat(25), settings=settings)
        summary_call, chat_call = model.requests
        assert summary_call.purpose == "context_compaction"
        assert summary_call.settings.get("reasoning_effort") == summarized
        assert chat_call.settings.get("reasoning_effort") == effort

    async def test_summary_max_tokens_and_instructions_are_used(self) -> None:
        """summary_max_tokens caps the summary; summary_instructions replace the prompt."""

        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
            summary_max_tokens=7,
            summary_instructions="Sum it up.",
        )
        class Custom(Agent):
            pass

        model = ScriptedModel([summary_step(), text_response("done")])
        await Custom(model=model).run("go", history=chat(30))
        assert model.requests[0].settings["max_tokens"] == 7
        assert model.requests[0].messages[-1].text.endswith(">>>\n\nSum it up.")

    async def test_compacted_request_keeps_trusted_messages_and_recent_ones(self) -> None:
        """System/developer messages stay; the summary precedes the kept conversation."""
        history = [Message.developer("Always answer in French."), *chat(30)]
        model = ScriptedModel([summary_step("Earlier: greetings."), text_response("fini")])
        result = await Small(model=model).run("go", history=history)
        sent = model.requests[1].messages
        assert sent[0].role is Role.SYSTEM and sent[0].text == "Be brief."
        assert sent[1].role is Role.DEVELOPER and sent[1].text == "Always answer in French."
        assert sent[2].is_summary and sent[2].text == SUMMARY_PREFIX + "Earlier: greetings."
        kept = [m for m in sent if not m.is_trusted and not m.is_summary]
        assert len(kept) == 61 - 23  # 63 tokens, 23 summarized to land at 40
        assert kept == list(result.messages[len(history) - len(kept) + 1 : len(history) + 1])

    async def test_about_summary_ratio_of_the_conversation_is_summarized(self) -> None:
        """30 % of 50 conversation messages → 15 summarized."""
        model = ScriptedModel([summary_step(), text_response("done")])
        result = await Small(model=model).run("go", history=chat(25))
        summary = next(m for m in result.messages if m.is_summary)
        assert len(summary.metadata[SUMMARY_COVERS_KEY]) == 15

    async def test_more_is_summarized_when_the_ratio_would_leave_it_near_the_threshold(
        self,
    ) -> None:
        """Enough is summarized to land at 80 % of the threshold: 62 → 40 tokens."""
        model = ScriptedModel([summary_step(), text_response("done")])
        result = await Small(model=model).run("go", history=chat(30))
        summary = next(m for m in result.messages if m.is_summary)
        assert len(summary.metadata[SUMMARY_COVERS_KEY]) == 22

    async def test_the_tool_schemas_count_toward_where_the_summary_must_land(self) -> None:
        """With about 440 tokens of tool schemas, the summary takes enough of the
        conversation to leave the whole request at 80 % of the threshold (800 tokens),
        not only its messages (it used to leave about 980: due again next turn)."""

        def audit(self: Agent, order: str) -> str:
            return order

        audit.__doc__ = "Audit an order. " * 100

        @manage_context(
            context_window_tokens=2_000,
            compression_threshold=0.5,
            preserve_recent_messages=2,
            quote_specifics=False,
        )
        class Audited(Agent):
            audit_order = tool(audit)

        model = ScriptedModel([summary_step(), text_response("done")])
        result = await Audited(model=model).run("go", history=chat(12, "long " * 20))
        summary = next(m for m in result.messages if m.is_summary)
        assert summary.metadata[AFTER_KEY] <= 800

    async def test_a_summary_that_saves_nothing_is_a_failure(self, spans: Spans) -> None:
        """A compaction that would not make the request smaller is not kept."""
        long_summary = "word " * 400

        @manage_context(
            context_window_tokens=4_000,
            compression_threshold=0.005,
            preserve_recent_messages=2,
            summary_max_tokens=1_000,
        )
        class Wordy(Agent):
            pass

        model = ScriptedModel([summary_step(long_summary), text_response("done")])
        result = await Wordy(model=model).run("go", history=chat(3))
        assert not any(m.is_summary for m in result.messages)
        assert not any(m.is_summary for m in model.requests[-1].messages)
        (event,) = spans.compactions()
        assert event["littleghost.compaction.outcome"] == "error"

    async def test_the_current_request_is_never_summarized(self) -> None:
        """In a long tool loop the user's question stays whole in every request."""

        @manage_context(
            context_window_tokens=60,
            compression_threshold=0.5,
            preserve_recent_messages=2,
            tokenizer=PerMessage(),
        )
        class Looping(Pinging):
            pass

        model = pinging(10)
        result = await Looping(model=model).run("THE QUESTION", history=chat(20))
        assert sum(r.purpose == "context_compaction" for r in model.requests) >= 3
        for request in model.requests:
            if request.purpose == "chat":
                assert any(m.text == "THE QUESTION" for m in request.messages)
        for summary in (m for m in result.messages if m.is_summary):
            question = next(m for m in result.messages if m.text == "THE QUESTION")
            assert question.id not in summary.metadata[SUMMARY_COVERS_KEY]

    async def test_a_replayed_response_leaves_the_newest_messages_in_view(self) -> None:
        """A model handing back one response object each turn: every copy is logged under
        an id of its own, so a summary hides only what it covers."""

        @manage_context(
            context_window_tokens=40,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Looping(Pinging):
            pass

        same = tool_call_response("ping", {}, call_id="c")
        result = await Looping(model=pinging(12, call=same)).run("go")
        ids = [message.id for message in result.messages]
        assert len(set(ids)) == len(ids)
        assert any(message.is_summary for message in result.messages)
        plain = [message for message in result.messages if not message.is_summary]
        assert build_view(result.messages)[-5:] == tuple(plain[-5:])

    async def test_a_tool_call_is_never_separated_from_its_results(self) -> None:
        """Parallel calls at the boundary stay with all their results (non-adjacent too)."""

        @manage_context(
            context_window_tokens=50,
            compression_threshold=0.3,
            summary_ratio=0.7,
            preserve_recent_messages=2,
            tokenizer=PerMessage(),
        )
        class Parallel(Agent):
            pass

        calls = [ToolCall("a", "one", {}), ToolCall("b", "two", {})]
        history = [
            *chat(7),
            Message.assistant(tool_calls=calls),
            Message.tool("a", "A"),
            Message.user("interjection"),
            Message.tool("b", "B"),
            *chat(2, "late"),
        ]
        model = ScriptedModel([summary_step(), text_response("done")])
        result = await Parallel(model=model).run("go", history=history)
        # 70 % of 23 is 16, inside the tool exchange (14, 15, 17): it is taken whole, and
        # the interjection between its results (16) stays.
        covered = next(m for m in result.messages if m.is_summary).metadata[SUMMARY_COVERS_KEY]
        exchange = [history[14].id, history[15].id, history[17].id]
        assert covered == [m.id for m in history[:14]] + exchange
        sent = model.requests[1].messages
        assert not any(m.tool_calls or m.tool_results for m in sent)
        assert "interjection" in [m.text for m in sent]

    async def test_preserving_recent_messages_that_cannot_be_kept_is_a_failed_compaction(
        self, spans: Spans
    ) -> None:
        """When the newest messages are one long tool exchange, nothing is cut short."""

        @manage_context(
            context_window_tokens=20,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Tight(Agent):
            pass

        calls = [ToolCall(f"c{i}", "t", {}) for i in range(12)]
        history = [
            Message.assistant(tool_calls=calls),
            *(Message.tool(f"c{i}", "r") for i in range(12)),
        ]
        model = ScriptedModel([text_response("done")])
        await Tight(model=model).run("go", history=history)
        assert [r.purpose for r in model.requests] == ["chat"]
        assert len(model.requests[0].messages) == 14
        (event,) = spans.compactions()
        assert event["littleghost.compaction.outcome"] == "error"

    async def test_usage_includes_the_summary_call(self) -> None:
        """Usage sums the summary call and the main calls."""
        model = ScriptedModel(
            [
                summary_step(input_tokens=50, output_tokens=9),
                text_response("done", input_tokens=30, output_tokens=2),
            ]
        )
        result = await Small(model=model).run("go", history=chat(30))
        assert result.usage == Usage(80, 11)

    async def test_compacts_every_turn_of_the_tool_loop(self) -> None:
        """The threshold is checked before every model call of a tool loop."""

        @manage_context(
            context_window_tokens=40,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Looping(Pinging):
            pass

        model = ScriptedModel(
            [
                tool_call_response("ping", {}),
                tool_call_response("ping", {}),
                summary_step(),
                text_response("done"),
            ]
        )
        result = await Looping(model=model).run("go", history=chat(7))
        assert [r.purpose for r in model.requests] == ["chat", "chat", "context_compaction", "chat"]
        assert sum(m.is_summary for m in result.messages) == 1

    async def test_summary_request_fits_a_small_window(self) -> None:
        """Long items are clipped and fewer messages summarized rather than overflowing."""

        @manage_context(
            context_window_tokens=400, compression_threshold=0.5, preserve_recent_messages=2
        )
        class Little(Agent):
            pass

        history: list[Message] = [Message.user("q " + "word " * 3000), Message.assistant("noted")]
        for index in range(6):
            history.append(Message.user(f"q{index} " + "word " * 120))
            history.append(Message.assistant(f"a{index} " + "text " * 120))
        model = ScriptedModel([summary_step(), text_response("done")])
        await Little(model=model).run("go", history=history)
        summary_call = model.requests[0]
        size = (
            sum(len(m.text) for m in summary_call.messages) / 4
            + summary_call.settings["max_tokens"]
        )
        assert size <= 400
        assert "truncated" in summary_call.messages[1].text


class TestTheLog:
    async def test_the_log_keeps_whole_a_result_the_requests_show_cut(self) -> None:
        """Under context management ``max_tool_result_tokens`` cuts what each request shows
        of a tool result; the log keeps it whole."""

        @manage_context(context_window_tokens=4_000)
        class Reading(Agent):
            max_tool_result_tokens = 20

            @tool
            def read(self) -> str:
                """Read the file."""
                return "a line of the file " * 100

        model = ScriptedModel([tool_call_response("read", {}), text_response("done")])
        result = await Reading(model=model).run("Read it.")
        (logged,) = [r for m in result.messages for r in m.tool_results]
        (sent,) = [r for m in model.requests[1].messages for r in m.tool_results]
        assert logged.content == "a line of the file " * 100
        assert "truncated" in sent.content

    async def test_summary_is_appended_and_originals_stay(self) -> None:
        """The log keeps every original message; the summary is appended, marked."""
        history = chat(30)
        model = ScriptedModel([summary_step(), text_response("done")])
        result = await Small(model=model).run("go", history=history)
        assert list(result.messages[:60]) == history
        summaries = [m for m in result.messages if m.is_summary]
        assert len(summaries) == 1
        covers = summaries[0].metadata[SUMMARY_COVERS_KEY]
        assert covers == [m.id for m in history[:22]]
        assert result.messages[-1].text == "done"

    async def test_passing_messages_back_keeps_the_compaction(self) -> None:
        """result.messages as history: the next request shows the summary, not the originals."""

        @manage_context(
            context_window_tokens=200,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Roomy(Agent):
            pass

        first = ScriptedModel([summary_step(), text_response("done")])
        result = await Roomy(model=first).run("go", history=chat(50))
        second = ScriptedModel([text_response("again")])
        await Roomy(model=second).run("more", history=result.messages)
        sent = second.requests[0].messages
        assert sum(m.is_summary for m in sent) == 1
        covered = set(next(m for m in result.messages if m.is_summary).metadata[SUMMARY_COVERS_KEY])
        assert not covered & {m.id for m in sent}

    @pytest.mark.parametrize("earlier", [0, 3])
    async def test_a_compaction_inside_a_tool_loop_sends_the_view_its_records_give(
        self, earlier: int
    ) -> None:
        """The request sent after a compaction is the view of the log with its records,
        as the next turn and a reload see it: the summary stands before the question even
        when it covers tool work done after the question."""

        @manage_context(
            context_window_tokens=40,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Looping(Pinging):
            instructions = "Be brief."

        model = pinging(12, summary="- pinged")
        result = await Looping(model=model).run("go", history=chat(earlier))
        log = result.messages
        ends = [n + 1 for n, m in enumerate(log) if m.is_summary]
        for index, end in enumerate(ends):  # a compaction's records are appended together
            while end < len(log) and is_record(log[end]) and not log[end].is_summary:
                end += 1
            ends[index] = end
        after = [
            model.requests[n + 1]
            for n, r in enumerate(model.requests)
            if r.purpose == "context_compaction"
        ]
        assert ends and len(after) == len(ends)
        for end, request in zip(ends, after, strict=True):
            assert request.messages[1:] == build_view(result.messages[:end])
            assert request.messages[1].is_summary

    async def test_a_user_message_a_tool_appends_leaves_the_question_unsummarized(
        self,
    ) -> None:
        """A tool appends a user message after the run's question: the question is still
        the current request, kept whole in every request and never summarized (the note
        was taken for the current request, and the question summarized away)."""

        @manage_context(context_window_override=1_100, preserve_recent_messages=2)
        class Noting(Agent):
            @tool
            async def fetch(self, context: RunContext) -> str:
                """Fetch a document and attach a note."""
                await context.append(Message.user("Attached note."))
                return "result " * 300

        def step(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                return text_response("- notes")
            return text_response("done")

        question = "Summarize order 42: " + "detail " * 200
        model = ScriptedModel([tool_call_response("fetch", {}), *[step] * 3])
        result = await Noting(model=model).run(question, history=chat(6))
        asked = result.messages[12]
        chats = [r for r in model.requests if r.purpose == "chat"]
        assert asked.text == question and len(chats) == 2
        assert all(asked in r.messages for r in chats)
        assert not any(asked.id in m.metadata.get(SUMMARY_COVERS_KEY, ()) for m in result.messages)

    async def test_a_later_compaction_folds_the_previous_summary_in(self) -> None:
        """The second summary covers the first and carries its notes forward; no original
        is summarized twice."""
        model, two = await compacted_twice(Small, "first", "second")
        first, second = [m for m in two.messages if m.is_summary]
        assert first.id in second.metadata[SUMMARY_COVERS_KEY]
        assert not set(first.metadata[SUMMARY_COVERS_KEY]) & set(
            second.metadata[SUMMARY_COVERS_KEY]
        )
        update = model.requests[2].messages
        assert update[1].text.startswith("Transcript:\n<<<\n")
        assert "m question 0" not in update[1].text and "first" not in update[1].text
        sent = model.requests[3].messages
        assert [m.text for m in sent if m.is_summary] == [SUMMARY_PREFIX + "first\nsecond"]

    async def test_only_the_previous_summary_left_means_no_summary_call(self, spans: Spans) -> None:
        """When the kept tail alone is over the threshold, nothing is sent to summarize."""

        @manage_context(
            context_window_tokens=10,
            compression_threshold=0.5,
            preserve_recent_messages=7,
            tokenizer=PerMessage(),
        )
        class Busy(Agent):
            pass

        earlier = chat(2)
        summary = Message.user(
            SUMMARY_PREFIX + "old",
            metadata={"littleghost.summary": True, SUMMARY_COVERS_KEY: [m.id for m in earlier]},
        )
        model = ScriptedModel([text_response("done")])
        await Busy(model=model).run("go", history=[*earlier, *chat(3, "new"), summary])
        assert [r.purpose for r in model.requests] == ["chat"]
        (event,) = spans.compactions()
        assert event["littleghost.compaction.outcome"] == "error"


class TestFailures:
    @pytest.mark.parametrize(
        ("steps", "error_type"),
        [
            ([ProviderUnavailableError("down")], "ProviderUnavailableError"),
            ([text_response("half", stop_reason=StopReason.MAX_TOKENS)] * 2, "OutputLimitError"),
            ([text_response("   ")], "ProtocolError"),
            ([ContextWindowOverflowError("too long")], "context_length_exceeded"),
            # a refusal, or an answer asking for a tool (none is offered), is no summary
            (
                [text_response("I can't help.", stop_reason=StopReason.CONTENT_FILTER)],
                "ProtocolError",
            ),
            ([text_response("Let me look.", stop_reason=StopReason.TOOL_USE)], "ProtocolError"),
            ([tool_call_response("lookup", {"q": "x"})], "ProtocolError"),
        ],
    )
    async def test_a_failed_summary_leaves_the_request_unchanged(
        self, spans: Spans, steps: list[Any], error_type: str
    ) -> None:
        """The run goes on with the original request; an error event is recorded."""
        history = chat(30)

        class NoRetry(Small):
            max_retries = 0

        model = ScriptedModel([*steps, text_response("done")])
        result = await NoRetry(model=model).run("go", history=history)
        assert result.output == "done"
        sent = model.requests[-1].messages
        assert len(sent) == 62 and not any(m.is_summary for m in sent)
        assert list(result.messages[:60]) == history and not any(
            m.is_summary for m in result.messages
        )
        (event,) = spans.compactions()
        assert event["littleghost.compaction.outcome"] == "error"
        assert event["error.type"] == error_type
        assert event["littleghost.compaction.reason"] == "threshold"

    async def test_too_short_or_only_trusted_history_fails_cleanly(self, spans: Spans) -> None:
        """Nothing to compact: an error event, the request unchanged, never an empty request."""

        @manage_context(context_window_tokens=10, compression_threshold=0.1, tokenizer=PerMessage())
        class Eager(Agent):
            pass

        model = ScriptedModel([text_response("a"), text_response("b")])
        await Eager(model=model).run("go", history=[Message.developer("d1"), Message.system("s2")])
        await Eager(model=model).run("go", history=chat(2))
        assert [len(r.messages) for r in model.requests] == [3, 5]
        assert [e["littleghost.compaction.outcome"] for e in spans.compactions()] == [
            "error",
            "error",
        ]

    async def test_cancellation_during_the_summary_propagates(self) -> None:
        """Cancelling the caller's scope during the summary cancels the run."""
        started = anyio.Event()

        async def slow(request: ModelRequest) -> ModelResponse:
            started.set()
            await anyio.sleep(10)
            raise AssertionError("not reached")

        model = ScriptedModel([slow, text_response("done")])
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as group:
                group.start_soon(functools.partial(Small(model=model).run, "go", history=chat(30)))
                await started.wait()
                scope.cancel()
        assert scope.cancelled_caught
        assert len(model.requests) == 1

    @pytest.mark.virtual_clock
    async def test_deadline_during_the_summary_raises(self) -> None:
        """The run's deadline applies to the summary call."""

        async def slow(request: ModelRequest) -> ModelResponse:
            await anyio.sleep(10)
            raise AssertionError("not reached")

        model = ScriptedModel([slow, text_response("done")])
        start = anyio.current_time()
        with pytest.raises(DeadlineExceededError):
            await Small(model=model).run("go", history=chat(30), timeout=0.2)
        assert anyio.current_time() - start == pytest.approx(0.2)

    async def test_a_deadline_error_from_the_summary_propagates(self) -> None:
        """DeadlineExceededError raised by the summary call is never swallowed."""
        model = ScriptedModel([DeadlineExceededError("late"), text_response("done")])
        with pytest.raises(DeadlineExceededError, match="late"):
            await Small(model=model).run("go", history=chat(30))
        assert len(model.requests) == 1

    async def test_the_log_is_whole_after_a_stop_during_the_summary(self) -> None:
        """Cancelled or past its deadline mid-summary, the log keeps every message."""
        history = chat(30)

        async def slow(request: ModelRequest) -> ModelResponse:
            await anyio.sleep(10)
            raise AssertionError("not reached")

        model = ScriptedModel([slow])
        async with Small(model=model).stream("go", history=history, timeout=0.2) as events:
            with pytest.raises(DeadlineExceededError):
                async for _ in events:
                    pass
        assert list(events.messages[:60]) == history
        assert [m.text for m in events.messages[60:]] == ["go"]

    async def test_cleanup_error_propagates(self) -> None:
        """A CleanupError from the summary call is never swallowed."""
        model = ScriptedModel([CleanupError("stream not closed"), text_response("done")])
        with pytest.raises(CleanupError):
            await Small(model=model).run("go", history=chat(30))


@manage_context(
    context_window_tokens=1_000,
    compression_threshold=1.0,
    preserve_recent_messages=4,
    tokenizer=PerMessage(),
)
class RecoveringOnce(Agent):
    """Compacts only for an overflow; the estimate is the number of messages."""


class TestOverflow:
    @pytest.mark.parametrize("figures", [{}, {"prompt_tokens": 9_000, "context_window": 8_000}])
    async def test_a_sub_agents_overflow_out_of_a_router_is_not_the_runs_to_recover(
        self, figures: dict[str, int]
    ) -> None:
        """An overflow of a sub-agent's request, leaving a model that runs the sub-agent
        (a router), is not the run's request's: its figures are the sub-agent's (its window,
        its prompt). The run's own overflow recovery leaves it: no compaction of the run's
        conversation (no summary in its log, no window learned), and the run fails with
        it, as a model's error nothing mended."""
        overflow = ContextWindowOverflowError("too long", **figures)

        class Reader(Agent):
            max_retries = 0

        async def route(request: ModelRequest) -> ModelResponse:
            inner = Reader(model=ScriptedModel([overflow]))
            return text_response((await inner.run("Read the document.")).output)

        model = ScriptedModel([route, summary_step(), route], context_window=200_000)
        with pytest.raises(ContextWindowOverflowError) as caught:
            await Lenient(model=model).run("go", history=chat(20, "long " * 400))
        assert caught.value is overflow
        assert [r.purpose for r in model.requests] == ["chat"]

    async def test_a_request_over_the_window_itself_is_compacted_as_recovery_would(
        self,
    ) -> None:
        """A request the provider would refuse (over the window with its answer's room)
        because of its preserved newest messages is compacted before the call as overflow
        recovery would after it (the preserved messages summarized, the question kept):
        no call is sent to be refused."""

        @manage_context(context_window_tokens=1_000)  # 10 preserved messages
        class Keeping(Agent):
            max_retries = 0

        long_parts = [
            m
            for i in range(4)
            for m in (Message.user(f"part {i}: {'word ' * 600}"), Message.assistant("Noted."))
        ]
        history = [Message.user("Hello."), Message.assistant("Hi."), *long_parts]

        def answer(request: ModelRequest) -> ModelResponse:
            if estimate_messages(request.messages) + (request.max_tokens or 1) > 1_000:
                raise ContextWindowOverflowError("prompt is too long", context_window=1_000)
            if request.purpose == "context_compaction":
                return text_response("- The user sent four parts.")
            return text_response("done")

        model = ScriptedModel([answer] * 3)
        result = await Keeping(model=model).run("Sum them up.", history=history)
        assert result.output == "done"
        assert [r.purpose for r in model.requests] == ["context_compaction", "chat"]
        assert model.requests[-1].messages[-1].text == "Sum them up."

    @pytest.mark.parametrize(("density", "pairs", "summaries"), [(1.35, 20, 2), (0.4, 40, 1)])
    async def test_a_threshold_summary_left_over_the_window_goes_on_as_recovery_would(
        self, spans: Spans, density: float, pairs: int, summaries: int
    ) -> None:
        """One summary call cannot hold a history far over the window: when the model
        counts what it left over the window, the attempt goes on as overflow recovery would
        after the refused call (a second summary, then the steps without a model), and the
        call is not sent to be refused. When the estimate alone says over (the model counts
        it within), nothing more is left out."""

        def real(request: ModelRequest) -> int:
            return int(density * estimate_messages(request.messages))

        def answer(request: ModelRequest) -> ModelResponse:
            if real(request) + (request.max_tokens or 1) > 512:
                raise ContextWindowOverflowError("too long", prompt_tokens=real(request))
            if request.purpose == "context_compaction":
                return text_response("- The user asked about orders A-0 to A-19.")
            return text_response("done")

        @manage_context(preserve_recent_messages=4)
        class Support(Agent):
            max_retries = 0

        history = [
            m
            for i in range(pairs)
            for m in (
                Message.user(f"Where is order A-{i}? It was {i * 3} boxes of tea, blue label."),
                Message.assistant(f"Order A-{i} left the depot on day {i}, due within a week."),
            )
        ]
        model = ScriptedModel([answer] * 6, context_window=512, count_prompt_tokens=real)
        result = await Support(model=model).run("And A-19?", history=history)
        assert result.output == "done"
        assert [r.purpose for r in model.requests].count("chat") == 1  # none refused
        events = spans.compactions()
        assert {e["littleghost.compaction.reason"] for e in events} == {"threshold"}
        assert sum("littleghost.compaction.summary_outcome" in e for e in events) == summaries
        assert real(model.requests[-1]) + 1 <= 512

    async def test_a_threshold_attempt_failing_after_it_stored_a_summary_sends_the_log_view(
        self,
    ) -> None:
        """Before the call, a request over the window goes on as overflow recovery would
        (its first summary came back empty); that stores a summary, then fails (the model
        still counts the request over the window): the call goes out as the log now shows
        it, the summary in place of what it covers (it went as it was, the covered
        messages shown beside a summary the log holds)."""
        summaries = 0

        def answer(request: ModelRequest) -> ModelResponse:
            nonlocal summaries
            if request.purpose != "context_compaction":
                return text_response("done")
            summaries += 1
            return text_response("" if summaries == 1 else "They talked about orders.")

        @manage_context(context_window_override=1_000, preserve_recent_messages=2)
        class Orders(Agent):
            instructions = "Work."

        filler = "note " * 90
        history = [
            m
            for i in range(6)
            for m in (Message.user(f"Q{i} {filler}"), Message.assistant(f"A{i} {filler}"))
        ]
        model = ScriptedModel([answer] * 8, count_prompt_tokens=lambda request: 10_000)
        result = await Orders(model=model).run("Go.", history=history)
        assert result.output == "done" and summaries == 2
        (chat,) = [r for r in model.requests if r.purpose == "chat"]
        (summary,) = [m for m in result.messages if is_record(m)]
        shown = {m.id for m in chat.messages}
        assert summary.id in shown
        assert not shown & set(record_covers(summary))

    @pytest.mark.parametrize(("pairs", "summary"), [(0, "none"), (4, "empty"), (4, "cut")])
    async def test_a_request_over_the_window_without_a_summary_is_not_refused(
        self, spans: Spans, pairs: int, summary: str
    ) -> None:
        """A tool loop's turn whose result puts the request over the window, and no summary
        (nothing old enough to summarize, a summary that came back empty, or cut at its cap
        twice): the attempt goes on as overflow recovery would (the result cut), so no
        call is sent to be refused; and without asking again for a summary cut twice."""

        def real(request: ModelRequest) -> int:
            return int(1.5 * estimate_messages(request.messages))

        def answer(request: ModelRequest) -> ModelResponse:
            if real(request) + (request.max_tokens or 1) > 512:
                raise ContextWindowOverflowError("too long", prompt_tokens=real(request))
            if request.purpose == "context_compaction" and summary == "cut":
                return text_response("## Notes", stop_reason=StopReason.MAX_TOKENS)
            if request.purpose == "context_compaction":
                return text_response("")
            if not request.messages[-1].tool_results:
                return tool_call_response("readings", {"count": 1600}, input_tokens=real(request))
            return text_response("done", input_tokens=real(request))

        @manage_context(preserve_recent_messages=4)
        class Support(Agent):
            max_retries = 0

            @tool
            def readings(self, count: int) -> str:
                """Meter readings."""
                return " ".join(str(i % 10) for i in range(count))

        history = [
            m
            for i in range(pairs)
            for m in (Message.user(f"Is meter M-{i} read?"), Message.assistant("Not yet."))
        ]
        model = ScriptedModel([answer] * 8, context_window=512, count_prompt_tokens=real)
        result = await Support(model=model).run("My meter readings?", history=history)
        assert result.output == "done"
        purposes = [r.purpose for r in model.requests]
        assert purposes.count("chat") == 2  # none refused
        asked = {"none": 0, "empty": 2, "cut": 2}[summary]  # "cut": asked once more, shorter
        assert purposes.count("context_compaction") == asked  # one cut twice not asked again
        events = spans.compactions()
        assert {e["littleghost.compaction.reason"] for e in events} == {"threshold"}
        assert events[-1]["littleghost.compaction.outcome"] == "completed"
        assert "littleghost.compaction.tool_results_cut_to_tokens" in events[-1]

    @pytest.mark.parametrize(("reports", "refused"), [(True, 0), (False, 1)])
    async def test_without_a_count_a_calibrated_estimate_decides(
        self, reports: bool, refused: int
    ) -> None:
        """A model that cannot count: the threshold attempt goes on as recovery would only
        when a count the provider reported this run calibrated the estimate (the tool
        loop's first answer); uncalibrated, an estimate that may overcount leaves nothing
        more out, and the provider decides (the call is refused and recovered)."""

        def real(request: ModelRequest) -> int:
            return int(1.35 * estimate_messages(request.messages))

        def answer(request: ModelRequest) -> ModelResponse:
            if real(request) + (request.max_tokens or 1) > 512:
                raise ContextWindowOverflowError("too long", prompt_tokens=real(request))
            reported = real(request) if reports else 0
            if request.purpose == "context_compaction":
                return text_response("- The user asked about orders.", input_tokens=reported)
            if not request.messages[-1].tool_results:
                return tool_call_response("lookup", {"order": "A-9"}, input_tokens=reported)
            return text_response("done", input_tokens=reported)

        @manage_context(preserve_recent_messages=4)
        class Support(Agent):
            max_retries = 0

            @tool
            def lookup(self, order: str) -> str:
                """Look an order up."""
                return f"{order}: " + "shipped from the north depot on Monday, " * 60

        history = [
            m
            for i in range(6)
            for m in (Message.user(f"Where is order A-{i}?"), Message.assistant(f"A-{i} left."))
        ]
        model = ScriptedModel([answer] * 8, context_window=512)
        result = await Support(model=model).run("And A-9?", history=history)
        assert result.output == "done"
        chats = [r for r in model.requests if r.purpose == "chat"]
        assert len(chats) == 2 + refused
        assert real(chats[-1]) + 1 <= 512

    async def test_overflow_is_recovered_once(self, spans: Spans) -> None:
        """An overflow compacts (whatever the threshold) and retries the call once."""

        model = ScriptedModel(
            [
                ContextWindowOverflowError("prompt is too long", provider="x"),
                summary_step(),
                text_response("done"),
            ]
        )
        history = chat(10)
        result = await RecoveringOnce(model=model).run("go", history=history)
        assert any(m.is_summary for m in model.requests[2].messages)
        assert list(result.messages[:20]) == history
        (event,) = spans.compactions()
        assert event["littleghost.compaction.reason"] == "overflow"
        assert event["littleghost.compaction.outcome"] == "completed"

    async def test_an_earlier_hooks_replacement_is_not_measured_by_the_overflows_figure(
        self,
    ) -> None:
        """A parent's ``after_model_error`` hook that trims the request on an overflow runs
        first: the provider's figure is about the request that overflowed, so the run
        learns the same calibration as without the hook (it measured the trimmed request
        by it: 2.9 against 1.4, kept for the session's later runs)."""

        class Trimming(Agent):
            @after_model_error
            def trim(self, request: ModelRequest, error: Exception) -> ModelRequest | None:
                if not isinstance(error, ContextWindowOverflowError):
                    return None
                *earlier, question = request.messages
                return attrs.evolve(request, messages=(*earlier[len(earlier) // 2 :], question))

        @manage_context(context_window_tokens=8_000, compression_threshold=1.0)
        class Trimmed(Trimming):
            pass

        @manage_context(context_window_tokens=8_000, compression_threshold=1.0)
        class Plain(Agent):
            pass

        history = [
            message
            for index in range(20)
            for message in (
                Message.user(f"question {index} " + "lorem ipsum " * 50),
                Message.assistant(f"answer {index} " + "dolor sit " * 60),
            )
        ]
        scales = []
        for agent in (Plain, Trimmed):
            overflow = ContextWindowOverflowError("too long", prompt_tokens=9_000)
            model = ScriptedModel([overflow, summary_step(), text_response("done")])
            result = await agent(model=model).run("Where is order 42?", history=history)
            assert result.output == "done"
            scales.append(result.messages[-1].metadata[SCALE_KEY])
        assert scales[0] == pytest.approx(scales[1])

    async def test_recovery_summarizes_preserved_messages_rather_than_excerpt_them(
        self, spans: Spans
    ) -> None:
        """When all that is older than the current turn is preserved, recovery summarizes
        it, oldest first and only as far as needed, never the current turn; no turn is
        excerpted without a model."""

        @manage_context(
            context_window_tokens=1_000,
            compression_threshold=1.0,
            preserve_recent_messages=30,
            tokenizer=PerMessage(),
        )
        class Lenient(Agent):
            pass

        model = ScriptedModel(
            [ContextWindowOverflowError("too long"), summary_step(), text_response("done")]
        )
        history = chat(10)
        result = await Lenient(model=model).run("go", history=history)
        (summary,) = [m for m in result.messages if m.is_summary]
        covered = summary.metadata[SUMMARY_COVERS_KEY]
        assert covered == [m.id for m in history[: len(covered)]]  # the oldest
        assert 10 <= len(covered) < len(history)  # halved at least, not all of it
        assert model.requests[2].messages[-1].text == "go"
        assert not any(m.text.startswith("[Earlier turn, excerpted:") for m in result.messages)
        (event,) = spans.compactions()
        assert "littleghost.compaction.fallback" not in event

    async def test_proactive_compaction_runs_again_before_the_retry(self) -> None:
        """A replacement request from after_model_error is checked against the threshold."""

        class Recovering(Small):
            max_retries = 0

            @after_model_error
            def resend_longer(self, request: ModelRequest, error: Exception) -> ModelRequest | None:
                if not isinstance(error, InvalidRequestError):
                    return None
                return attrs.evolve(
                    request, messages=(*request.messages[:1], *chat(30), *request.messages[1:])
                )

        model = ScriptedModel([InvalidRequestError("bad"), summary_step(), text_response("done")])
        result = await Recovering(model=model).run("go", history=chat(5))
        assert any(m.is_summary for m in model.requests[2].messages)
        assert result.output == "done"

    async def test_a_second_overflow_propagates_with_the_first_as_cause(self) -> None:
        """No loop: the retried call overflowing again raises, caused by the first."""

        first = ContextWindowOverflowError("first")
        second = ContextWindowOverflowError("second")
        model = ScriptedModel([first, summary_step(), second, text_response("unused")])
        with pytest.raises(ContextWindowOverflowError) as caught:
            await RecoveringOnce(model=model).run("go", history=chat(10))
        assert caught.value is second
        assert caught.value.__cause__ is first
        assert len(model.requests) == 3

    async def test_a_second_overflow_keeps_its_own_sdk_error(self) -> None:
        """The second overflow's SDK exception (the answer's body and request id, which
        an SDK raises ``from None``) stays in the chain a traceback shows, beside the
        first overflow, its ``__cause__``, and the first's own."""

        class SDKError(Exception):
            pass

        def overflow(request_id: str) -> ContextWindowOverflowError:
            try:
                raise SDKError(f"request_id={request_id}") from None
            except SDKError as sdk:
                error = ContextWindowOverflowError("too long")
                error.__cause__ = sdk
                return error

        first, second = overflow("req_1"), overflow("req_2")
        model = ScriptedModel([first, summary_step(), second])
        with pytest.raises(ContextWindowOverflowError) as caught:
            await RecoveringOnce(model=model).run("go", history=chat(10))
        assert caught.value is second and caught.value.__cause__ is first
        shown = "".join(traceback.format_exception(caught.value))
        assert "SDKError: request_id=req_1" in shown
        assert "SDKError: request_id=req_2" in shown

    async def test_a_failed_recovery_raises_the_overflow_caused_by_a_compaction_error(
        self,
    ) -> None:
        """If recovery cannot compact, the overflow propagates, caused by a CompactionError
        (itself caused by the failed summary call that came first)."""

        @manage_context(
            context_window_tokens=100_000, compression_threshold=1.0, preserve_recent_messages=4
        )
        class Lenient(Agent):
            max_retries = 0

        overflow = ContextWindowOverflowError("too long")
        down = ProviderUnavailableError("down")
        model = ScriptedModel([overflow, down])
        with pytest.raises(ContextWindowOverflowError) as caught:
            # The provider says only "too long": recovery must at least halve the request,
            # which the question alone (about 2 500 of 2 700 tokens) does not allow.
            await Lenient(model=model).run("word " * 2_000, history=chat(10))
        assert caught.value is overflow
        assert isinstance(caught.value.__cause__, CompactionError)
        said = str(caught.value.__cause__)  # the half it aims under is not the window
        assert said.startswith("the current request alone (about ")
        assert "tokens recovery aims under (half the request that overflowed, as the" in said
        assert said.endswith("; the context window is 100000)")
        assert caught.value.__cause__.__cause__ is down

    @pytest.mark.parametrize("summarize", [True, False])
    async def test_a_failed_recovery_keeps_the_sdk_error_of_the_overflow(
        self, summarize: bool
    ) -> None:
        """The exception the provider's SDK raised (the overflow's cause, with the answer's
        body and request id) stays in the chain a traceback shows, after the CompactionError."""
        options: dict[str, Any] = {"summarize": False, "budget": PromptBudget()}

        @manage_context(context_window_tokens=100_000, **({} if summarize else options))
        class Lenient(Agent):
            max_retries = 0

        class SDKError(Exception):
            pass

        try:
            raise SDKError("request_id=req_123")
        except SDKError as sdk:
            overflow = ContextWindowOverflowError("too long")
            overflow.__cause__ = sdk
        model = ScriptedModel([overflow, ProviderUnavailableError("down")])
        with pytest.raises(ContextWindowOverflowError) as caught:
            await Lenient(model=model).run("word " * 2_000)
        assert caught.value is overflow
        assert isinstance(caught.value.__cause__, CompactionError)
        shown = "".join(traceback.format_exception(caught.value))
        assert "SDKError: request_id=req_123" in shown

    async def test_a_failed_recovery_keeps_the_sdk_error_past_a_summary_call_s_own(
        self,
    ) -> None:
        """An SDK raises its errors ``from None`` (the HTTP library's hidden): the overflow's
        SDK error still follows the failed summary call's in the chain a traceback shows."""

        @manage_context(context_window_tokens=100_000)
        class Lenient(Agent):
            max_retries = 0

        class SDKError(Exception):
            pass

        def sdk_error(request_id: str) -> SDKError:
            try:
                try:
                    raise OSError("the HTTP library's")
                except OSError:
                    raise SDKError(f"request_id={request_id}") from None
            except SDKError as raised:
                return raised

        overflow = ContextWindowOverflowError("too long")
        overflow.__cause__ = sdk_error("req_123")

        def summary_call(request: ModelRequest) -> ModelResponse:
            raise ProviderUnavailableError("down") from sdk_error("req_456")

        model = ScriptedModel([overflow, summary_call])
        with pytest.raises(ContextWindowOverflowError) as caught:
            await Lenient(model=model).run("word " * 2_000, history=chat(10))
        assert caught.value is overflow
        assert [r.purpose for r in model.requests] == ["chat", "context_compaction"]
        shown = "".join(traceback.format_exception(caught.value))
        assert "SDKError: request_id=req_456" in shown
        assert "SDKError: request_id=req_123" in shown

    async def test_a_failed_summary_call_in_recovery_falls_back_to_excerpts(
        self, spans: Spans
    ) -> None:
        """When the summary cannot be made, the oldest turns become one-line excerpts."""

        @manage_context(
            context_window_tokens=1_000,
            compression_threshold=1.0,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Lenient(Agent):
            max_retries = 0

        model = ScriptedModel(
            [
                ContextWindowOverflowError("too long"),
                ProviderUnavailableError("down"),
                text_response("ok"),
            ]
        )
        result = await Lenient(model=model).run("go", history=chat(10))
        assert result.output == "ok"
        sent = model.requests[-1].messages
        assert len(sent) < 22
        excerpts = [m for m in result.messages if m.text.startswith("[Earlier turn, excerpted:")]
        assert excerpts and all(
            m.metadata["littleghost.compaction.kind"] == "collapse" for m in excerpts
        )
        events = spans.compactions()
        assert [
            (e["littleghost.compaction.outcome"], e.get("littleghost.compaction.fallback"))
            for e in events
        ] == [
            ("error", None),
            ("completed", True),
        ]

    async def test_earlier_summaries_go_last_when_only_the_current_turn_fits(
        self, spans: Spans
    ) -> None:
        """A current turn that fits the window alone is answered even when the earlier
        summaries do not fit beside it: they are left out last, after every older turn
        (the log keeps them)."""

        def respond(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                return text_response("- noted")
            real = estimate_messages(request.messages)
            if real > 1_000:
                raise ContextWindowOverflowError("too long", prompt_tokens=real)
            return text_response("done")

        old = chat(3)
        earlier = summary_message("fact " * 500, [m.id for m in old])  # about 630 tokens
        history = [*old, earlier, *chat(2, "n")]
        model = ScriptedModel([respond] * 5)
        result = await Uninstructed(model=model).run("word " * 300, history=history)
        assert result.output == "done"
        assert earlier in result.messages  # the log keeps it
        sent = model.requests[-1].messages
        assert earlier.id not in {m.id for m in sent}
        assert sent[-1].text == "word " * 300
        fallback = [e for e in spans.compactions() if e.get("littleghost.compaction.fallback")]
        assert [e["littleghost.compaction.outcome"] for e in fallback] == ["completed"]

    async def test_a_current_request_denser_than_the_history_is_measured_on_its_own(
        self, spans: Spans
    ) -> None:
        """After an overflow, a history calibrated by an earlier run keeps its scale, and
        the current question, digits about 2.5 times denser, is sized from what the
        overflow reported beyond it: one recovery, and the retried call fits."""

        counting = Densities()
        model, sizes = ScriptedModel([counting] * 6), counting.sizes
        history = _prose(4)
        one = await Lenient(model=model).run("And the coast?", history=history)
        assert SCALE_KEY in one.messages[-1].metadata  # the history's calibration
        digits = " ".join(str(10_000 + 7 * i) for i in range(200))  # about 900 tokens
        two = await Lenient(model=model).run(digits, history=one.messages)
        assert two.output == "ok"
        assert sizes[1] > 1_000 >= sizes[2] and len(sizes) == 3  # one overflow, one retry
        recovery = [
            (e["littleghost.compaction.reason"], "littleghost.compaction.fallback" in e)
            for e in spans.compactions()
        ]  # a model that cannot count: a summary, then 20 % under the window without one
        assert recovery == [("overflow", False), ("overflow", True)]

    async def test_a_dense_question_after_an_uncalibrated_history_is_answered(self) -> None:
        """No earlier calibration: one overflow's figure cannot tell a dense question
        from a dense history, so the summary call's reported size says how dense the
        history is, and recovery leaves room for what that leaves to the question: the
        question (digits, 2.5 times as dense as the prose before it, nine tenths of the
        window), which fits alone, is answered after one recovery."""

        counting = Densities()
        model = ScriptedModel([counting] * 6)
        digits = " ".join(str(10_000 + 7 * i) for i in range(200))  # about 900 tokens
        result = await Lenient(model=model).run(digits, history=_prose(6))
        assert result.output == "ok"
        sizes = counting.sizes
        assert sizes[0] > 1_000 >= sizes[-1] and len(sizes) == 2  # one overflow, one retry

    async def test_an_overflow_about_as_dense_as_the_summarized_history_is_aimed_20_under(
        self, spans: Spans
    ) -> None:
        """No earlier calibration, and a question of digits a fifth of the window after a
        prose history: the overflow's scale is within DENSE_GAP of the one the summary
        call measured of the history (1.55 to 1.25), a gap the rule does not take for a
        denser question: no margin for one. But the model cannot count what recovery
        makes: the summary, under the window (about 830 tokens), is taken 20 % under it
        by the model-free steps, and the retried call keeps the summary and the question."""

        counting = Densities()
        model = ScriptedModel([counting] * 6)
        digits = " ".join(str(10_000 + 7 * i) for i in range(120))
        result = await Lenient(model=model).run(digits, history=_prose(8))
        assert result.output == "ok"
        sizes = counting.sizes
        assert sizes[0] > 1_000 >= sizes[-1] and len(sizes) == 2  # one overflow, one retry
        made = [
            (e["littleghost.compaction.reason"], e.get("littleghost.compaction.fallback"))
            for e in spans.compactions()
        ]
        assert made == [("overflow", None), ("overflow", True)]
        summary, fallback = spans.compactions()
        assert summary["littleghost.compaction.estimated_tokens_after"] > 0.8 * 1_000
        assert fallback["littleghost.compaction.estimated_tokens_after"] <= 0.8 * 1_000
        retried = model.requests[-1].messages
        assert any(message.is_summary for message in retried)
        assert retried[-1].text == digits

    async def test_a_request_the_model_counts_within_the_window_is_not_retried_unchanged(
        self,
    ) -> None:
        """A model whose count says the request that overflowed fits (the count and the
        overflow's figure disagree): recovery never sends that request again unchanged;
        nothing to compact, the provider's error reaches the caller."""
        overflow = ContextWindowOverflowError("too long", prompt_tokens=1_000, context_window=800)
        model = ScriptedModel(
            [overflow, text_response("never")], count_prompt_tokens=lambda request: 500
        )
        with pytest.raises(ContextWindowOverflowError) as caught:
            await Lenient(model=model).run("word " * 300)
        assert caught.value is overflow
        assert isinstance(caught.value.__cause__, CompactionError)
        assert [r.purpose for r in model.requests] == ["chat"]

    async def test_an_overflow_figure_under_the_models_count_is_overruled_by_the_count(
        self, spans: Spans
    ) -> None:
        """A provider whose overflow error reports half the prompt its count gives (a
        figure under the window), and a summary call that fails: scaled by the figure, the
        estimate finds nothing to compact; the model's count decides, so recovery compacts
        without a model until the count fits. One overflow, one retry, and it fits."""
        counting = Densities()

        def respond(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                raise ProviderUnavailableError("summarizer down")
            try:
                return counting(request)
            except ContextWindowOverflowError as error:
                half = (error.prompt_tokens or 0) // 2
                raise ContextWindowOverflowError("too long", prompt_tokens=half) from None

        model = ScriptedModel([respond] * 4, count_prompt_tokens=counting.count)
        result = await Lenient(model=model).run("And the coast?", history=_prose(9))
        assert result.output == "ok"
        sizes = counting.sizes
        assert sizes[0] > 1_000 >= sizes[-1] and len(sizes) == 2  # one overflow, one retry
        made = [
            (
                e.get("littleghost.compaction.fallback"),
                e.get("error.type"),
                e["littleghost.compaction.estimated_tokens"],
            )
            for e in spans.compactions()
        ]
        assert made == [
            (None, "ProviderUnavailableError", sizes[0] // 2),  # the summary, by the figure
            (True, "CompactionError", sizes[0] // 2),  # the figure: nothing to compact
            (True, None, sizes[0] + 1),  # aimed by the count, with the answer's room
        ]
        retried = spans.named("chat")[-1].attributes or {}
        assert retried["littleghost.compaction.counted_prompt_tokens"] == sizes[-1]
        assert model.requests[-1].messages[-1].text == "And the coast?"

    @pytest.mark.parametrize("alone", [300, 1_100])
    async def test_views_the_model_keeps_counting_over_the_window_end_at_the_turn_alone(
        self, alone: int
    ) -> None:
        """A model whose count does not follow what recovery leaves out: any history
        costs 1 100 tokens (the window is 1 000), and the history is many short turns, so
        views aimed by the count leave out little each time. Each view without a model is
        counted over; after at most ``RECOUNTS`` tighter ones, the last is the current
        request alone (counted once, first, for its density: no request is counted twice).
        When the model counts it within the window it is sent, and the run answers; else the
        provider's error reaches the caller, caused by a CompactionError that says so, and
        nothing is retried."""
        counted: list[ModelRequest] = []
        turns = [(Message.user(f"q {i}"), Message.assistant(f"a {i}")) for i in range(9)]
        history = [message for turn in turns for message in turn]

        def count(request: ModelRequest) -> int:
            counted.append(request)
            return alone if len(request.messages) == 2 else 1_100  # instructions and turn

        overflow = ContextWindowOverflowError("too long", prompt_tokens=1_100)
        model = ScriptedModel(
            [overflow, summary_step("- noted"), text_response("ok")], count_prompt_tokens=count
        )
        agent = Lenient(model=model)
        if alone < 1_000:
            result = await agent.run("And the coast?", history=history)
            assert result.output == "ok"
            assert [m.text for m in model.requests[-1].messages] == ["Be brief.", "And the coast?"]
        else:
            with pytest.raises(ContextWindowOverflowError) as caught:
                await agent.run("And the coast?", history=history)
            assert caught.value is overflow
            cause = caught.value.__cause__
            assert isinstance(cause, CompactionError)
            assert str(cause) == (
                "the model counts 1100 prompt tokens for the compacted request; with its "
                "answer's room that is over the 1000-token context window"
            )
            assert [r.purpose for r in model.requests] == ["chat", "context_compaction"]
        turn, *views = [len(request.messages) for request in counted]
        assert turn == 2  # the turn alone, for its density; then the request, each tighter view
        assert views == sorted(views, reverse=True) and len(set(views)) == len(views)
        assert 2 <= len(views) <= 1 + RECOUNTS  # the last, the turn alone, was counted first
        assert all(a != b for i, a in enumerate(counted) for b in counted[:i])

    async def test_a_recovery_under_the_window_but_over_its_margin_is_kept(self) -> None:
        """Uncalibrated, recovery aims 20 % under the window; when its compaction lands
        between that aim and the window and the fallback finds nothing more to do, the
        compacted request is sent: the margin never fails a run."""

        @manage_context(context_window_tokens=1_000, compression_threshold=1.0)
        class Looking(Agent):
            max_retries = 0

            @tool
            def look(self, i: int) -> str:
                """Look."""
                return f"item {i} " + "result " * 160

        counting, looks = Densities(), 0

        def respond(request: ModelRequest) -> ModelResponse:
            nonlocal looks
            answer = counting(request)  # overflows over 1 000
            if request.purpose == "chat" and looks < 3:
                looks += 1
                return tool_call_response("look", {"i": looks})  # no usage reported
            return answer

        result = await Looking(model=ScriptedModel([respond] * 12)).run("Look three times.")
        assert result.output == "ok"
        sizes = counting.sizes
        assert sizes[-2] > 1_000 >= sizes[-1]  # one overflow, and the retry fits

    async def test_a_dense_question_close_to_the_window_is_answered_by_the_models_count(
        self, spans: Spans
    ) -> None:
        """No earlier calibration, and a question too little denser than the history for
        the estimate to tell (digits, 977 of 1 000 tokens alone): the model counts the
        compacted request over the window, so recovery compacts further without a model
        before it retries. One overflow, one retry, and it fits."""

        counting = Densities()
        model = ScriptedModel([counting] * 6, count_prompt_tokens=counting.count)
        digits = " ".join(str(10_000 + 7 * i) for i in range(215))
        result = await Lenient(model=model).run(digits, history=_prose(6))
        assert result.output == "ok"
        sizes = counting.sizes
        assert sizes[0] > 1_000 >= sizes[-1] and len(sizes) == 2  # one overflow, one retry
        summary, *further = spans.compactions()  # the summary, then without a model
        assert "littleghost.compaction.fallback" not in summary
        assert further and all(e["littleghost.compaction.fallback"] for e in further)
        retried = spans.named("chat")[-1].attributes or {}
        assert retried["littleghost.compaction.counted_prompt_tokens"] == sizes[-1]

    @pytest.mark.parametrize("summary", ["fails", "is digits"])
    async def test_a_question_lighter_than_the_history_is_answered_by_the_models_count(
        self, summary: str
    ) -> None:
        """The reverse: a history of digits (three times the estimate) and a prose
        question that fits alone by the model's count (nine tenths of the window). The
        overflow's scale would size the question as dense as the history and give up;
        the model's count of the question alone sizes it, so the model-free steps leave
        room for it, whether the summary call fails (the threshold attempt then goes on
        as recovery would, before the call) or comes back as dense digits."""

        counting = Densities()

        def respond(request: ModelRequest) -> ModelResponse:
            if request.purpose != "context_compaction":
                return counting(request)
            if summary == "fails":
                raise ProviderUnavailableError("summarizer down")
            return text_response(" ".join(str(20_000 + i) for i in range(60)))

        digits = [" ".join(str(10_000 + 7 * i + turn) for i in range(30)) for turn in range(8)]
        history = [
            Message.user(digits[i]) if i % 2 == 0 else Message.assistant(digits[i])
            for i in range(8)
        ]
        question = "Please describe the coast and the hills in some detail. " * 54
        model = ScriptedModel([respond] * 6, count_prompt_tokens=counting.count)
        result = await Uninstructed(model=model).run(question, history=history)
        assert result.output == "ok"
        assert 1_000 >= counting.sizes[-1] >= 900  # the question, whole
        # no summary: the steps without a model before the call, none refused
        assert len(counting.sizes) == (1 if summary == "fails" else 2)

    async def test_an_overflow_without_a_figure_is_sized_by_the_models_count(
        self, spans: Spans
    ) -> None:
        """A provider's overflow error that says no size: the model's count of the
        request sizes it, so the recovery is sized to the whole window, not to half."""

        counting = Densities(prose=1.5)

        def respond(request: ModelRequest) -> ModelResponse:
            try:
                return counting(request)
            except ContextWindowOverflowError:
                raise ContextWindowOverflowError("too long") from None  # no figure

        model = ScriptedModel([respond] * 4, count_prompt_tokens=counting.count)
        result = await Uninstructed(model=model).run("And the coast?", history=_prose(9))
        assert result.output == "ok"
        overflow = spans.compactions()[0]
        assert overflow["littleghost.compaction.estimated_tokens"] == counting.sizes[0]
        assert overflow["littleghost.compaction.context_window_tokens"] == 1_000

    async def test_a_count_that_fails_leaves_recovery_to_the_estimate(
        self, caplog: pytest.LogCaptureFixture, spans: Spans
    ) -> None:
        """A count that raises is an ERROR count span with its error type, is logged (its
        error type only) and recovery goes on by the estimate, as for a model that cannot
        count."""

        def count(request: ModelRequest) -> int:
            raise ProviderUnavailableError("no count endpoint")

        counting = Densities()
        model = ScriptedModel([counting] * 6, count_prompt_tokens=count)
        with caplog.at_level("WARNING", logger="littleghost.models"):
            result = await Lenient(model=model).run(DIGITS, history=_prose(6))
        assert result.output == "ok"
        assert counting.sizes[0] > 1_000 >= counting.sizes[-1] and len(counting.sizes) == 2
        counts = spans.named("count_tokens")
        assert counts
        for span in counts:
            assert span.status.status_code is StatusCode.ERROR
            assert (span.attributes or {})["error.type"] == "ProviderUnavailableError"
            assert "littleghost.counted_prompt_tokens" not in (span.attributes or {})
            assert "no count endpoint" not in (span.status.description or "")
        warned = [r for r in caplog.records if "counting" in r.getMessage()]
        assert len(warned) == len(counts)
        assert all(r.name == "littleghost.models" for r in warned)
        assert all("ProviderUnavailableError" in r.getMessage() for r in warned)
        assert not any("no count endpoint" in r.getMessage() for r in caplog.records)

    async def test_a_plain_def_count_fails_the_run_as_a_plain_def_respond_does(
        self, caplog: pytest.LogCaptureFixture, spans: Spans
    ) -> None:
        """A model's ``count_prompt_tokens`` written as a plain ``def`` fails the run
        with a ``ConfigurationError`` naming the model, as a plain ``def`` respond does
        (it was logged as a failed count, a ``TypeError``, and swallowed); a count that
        raises a ``ConfigurationError`` of its own is still a failed count."""

        class PlainCount(ScriptedModel):
            def count_prompt_tokens(self, request: ModelRequest) -> int:  # type: ignore[override]
                return 500

        with pytest.raises(ConfigurationError) as caught:
            await Lenient(model=PlainCount([Densities()] * 6)).run(DIGITS, history=_prose(6))
        assert str(caught.value) == (
            "model 'scripted': count_prompt_tokens() returned int, not an awaitable: a "
            "Model's count_prompt_tokens is async def (or returns an awaitable)"
        )

        def refuse(request: ModelRequest) -> int:
            raise ConfigurationError("the count's own")

        counting = Densities()
        model = ScriptedModel([counting] * 6, count_prompt_tokens=refuse)
        with caplog.at_level("WARNING", logger="littleghost.models"):
            result = await Lenient(model=model).run(DIGITS, history=_prose(6))
        assert result.output == "ok"
        warned = [r.getMessage() for r in caplog.records if "counting" in r.getMessage()]
        assert warned
        assert all(w.endswith("failed (ConfigurationError)") for w in warned)

    @pytest.mark.parametrize("figure", ["12", 0, True, 2**63, 10**400])
    async def test_a_count_that_is_no_figure_is_an_error_span(
        self, caplog: pytest.LogCaptureFixture, spans: Spans, figure: object
    ) -> None:
        """A count that answers anything but an int from 1 to 2**63-1 or None is logged,
        an ERROR count span (a ProtocolError) and taken as no count: recovery goes on by
        the estimate (a count past 2**63-1 failed it with an ``OverflowError``)."""

        counting = Densities()
        model = ScriptedModel([counting] * 6, count_prompt_tokens=lambda request: figure)
        with caplog.at_level("WARNING", logger="littleghost.models"):
            result = await Lenient(model=model).run(DIGITS, history=_prose(6))
        assert result.output == "ok"
        counts = spans.named("count_tokens")
        assert counts
        for span in counts:
            assert span.status.status_code is StatusCode.ERROR
            assert (span.attributes or {})["error.type"] == "ProtocolError"
            assert "littleghost.counted_prompt_tokens" not in (span.attributes or {})
        warned = [r.getMessage() for r in caplog.records if "count_prompt_tokens" in r.getMessage()]
        assert warned == [
            f"count_prompt_tokens of model 'scripted' returned a value of type {type(figure).__name__}, "
            "not an int from 1 to 2**63-1"
        ] * len(counts)

    async def test_a_request_the_model_counts_over_the_window_is_never_retried(
        self, spans: Spans
    ) -> None:
        """When the model counts even the current request alone over the window, recovery
        fails with the provider's error (a CompactionError saying so as its cause) instead
        of a retry that would overflow again."""

        counting = Densities(prose=1.5)
        model = ScriptedModel([counting] * 6, count_prompt_tokens=lambda request: 5_000)
        with pytest.raises(ContextWindowOverflowError) as caught:
            await Uninstructed(model=model).run("And the coast?", history=_prose(9))
        assert isinstance(caught.value.__cause__, CompactionError)
        assert "current request alone (about " in str(caught.value.__cause__)
        assert len(counting.sizes) == 1  # the overflowing call only: no doomed retry
        assert all(e["littleghost.compaction.reason"] == "overflow" for e in spans.compactions())

    async def test_a_request_counted_at_the_whole_window_is_not_retried(self) -> None:
        """A request counted at exactly the window leaves its answer no room (llama.cpp
        refuses such a prompt even without max_tokens): it is never retried; the steps
        without a model, aimed by the count, give one that fits."""

        counting = Densities(prose=1.5)

        def count(request: ModelRequest) -> int:
            summarized = any(message.is_summary for message in request.messages)
            return 1_000 if summarized else counting.count(request)

        def respond(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                return text_response("- noted")
            counting.sizes.append(size := count(request))
            if size >= 1_000:  # as llama.cpp: no room to answer
                raise ContextWindowOverflowError("too long", prompt_tokens=size)
            return text_response("ok")

        model = ScriptedModel([respond] * 4, count_prompt_tokens=count)
        result = await Uninstructed(model=model).run("And the coast?", history=_prose(9))
        assert result.output == "ok"
        assert len(counting.sizes) == 2 and counting.sizes[1] < 1_000  # one retry, with room
        assert not any(message.is_summary for message in model.requests[-1].messages)

    async def test_a_calibration_the_overflow_belies_is_corrected(self) -> None:
        """When the history's remembered calibration is off by more than the current
        question can account for (its density bounded), the rest corrects the history's
        scale: the retried call fits."""

        counting = Densities(prose=1.5)
        model = ScriptedModel([counting] * 4)
        history = _prose(9)
        history[-1] = attrs.evolve(history[-1], metadata={SCALE_KEY: 1.0})  # another model's
        result = await Uninstructed(model=model).run("And the coast?", history=history)
        assert result.output == "ok"
        assert counting.sizes[0] > 1_000 >= counting.sizes[1] and len(counting.sizes) == 2

    async def test_a_tool_result_denser_than_the_history_is_measured_on_its_own(self) -> None:
        """The same in a tool loop: the run's previous call calibrated the history, and
        the dense tool result added since is sized from what the overflow reported beyond
        it; the retried call fits with the result whole."""

        @manage_context(context_window_tokens=1_000, compression_threshold=1.0)
        class Looking(Agent):
            max_retries = 0

            @tool
            def numbers(self) -> str:
                """Numbers."""
                return " ".join(str(10_000 + 7 * i) for i in range(180))  # about 810 tokens

        counting = Densities(prose=1.5)

        def respond(request: ModelRequest) -> ModelResponse:
            answer = counting(request)
            if request.purpose == "chat" and not any(m.tool_results for m in request.messages):
                return tool_call_response("numbers", {}, input_tokens=answer.usage.input_tokens)
            return answer

        model, sizes = ScriptedModel([respond] * 5), counting.sizes
        result = await Looking(model=model).run("List the numbers.", history=_prose(4))
        assert result.output == "ok"
        assert sizes[1] > 1_000 >= sizes[2] and len(sizes) == 3
        (sent,) = [r for m in model.requests[-1].messages for r in m.tool_results]
        assert sent.content == Looking().numbers()

    async def test_the_fallback_collapses_the_current_turns_older_tool_results(self) -> None:
        """A tool loop whose results alone are over the window: when no summary can be
        made, the turn's older results become one line each (the newest two stay whole)
        and the run answers."""

        @manage_context(context_window_tokens=1_000, compression_threshold=1.0)
        class Looking(Agent):
            max_retries = 0

            @tool
            def look(self) -> str:
                """Look."""
                return "result " * 150  # about 260 tokens

        calls = 0

        def respond(request: ModelRequest) -> ModelResponse:
            nonlocal calls
            if request.purpose == "context_compaction":
                raise ProviderUnavailableError("down")
            real = int(1.35 * estimate_messages(request.messages))  # it counts a third more
            if real > 1_000:
                raise ContextWindowOverflowError("too long", prompt_tokens=real)
            calls += 1
            return tool_call_response("look", {}) if calls <= 3 else text_response("done")

        model = ScriptedModel([respond] * 8)
        result = await Looking(model=model).run("Look three times.", history=chat(3))
        assert result.output == "done"
        sent = model.requests[-1].messages
        results = [m for m in sent if m.tool_results]
        assert len(results) == 2  # the newest two, whole
        assert any(m.text.startswith("[Tool results: look: result") for m in sent)
        assert sent[-1].tool_results  # the turn goes on where it was

    async def test_dense_tool_results_shrink_when_collapsed_at_a_small_window(self) -> None:
        """At a small window a collapsed result keeps a 25th of the window in characters,
        not 400: dense JSON results (a token for every 1.6 characters) really shrink, and
        a tool loop whose results fill the window recovers without a summary."""

        @manage_context(context_window_tokens=512, compression_threshold=1.0)
        class Looking(Agent):
            max_retries = 0

            @tool
            def lookup(self, n: int) -> str:
                """Look a record up."""
                rows = [{"sku": 4898 + i, "qty": 17 * i, "bin": f"B{n}{i}"} for i in range(4)]
                return json.dumps({"record": n, "rows": rows})  # about 180 characters

        calls = 0

        def respond(request: ModelRequest) -> ModelResponse:
            nonlocal calls
            if request.purpose == "context_compaction":
                raise ProviderUnavailableError("down")
            chars = sum(
                len(m.text) + sum(len(r.content) for r in m.tool_results) for m in request.messages
            )
            real = int(chars / 1.6) + 8 * len(request.messages)
            if real > 512:
                raise ContextWindowOverflowError("too long", prompt_tokens=real, context_window=512)
            calls += 1
            return (
                tool_call_response("lookup", {"n": calls}) if calls <= 6 else text_response("done")
            )

        model = ScriptedModel([respond] * 16)
        result = await Looking(model=model).run("Check the records.")
        assert result.output == "done"
        lines = [m.text for m in model.requests[-1].messages if m.text.startswith("[Tool results:")]
        assert lines and all(len(line) < 100 for line in lines)  # the result was 180

    @pytest.mark.parametrize(
        "later", ["a line of the file\n" * 250, "ファイルの一行です\n" * 80], ids=["en", "ja"]
    )
    async def test_tool_results_over_the_window_are_cut_for_the_rest_of_the_run(
        self, spans: Spans, later: str
    ) -> None:
        """A tool result larger than the window: recovery cuts the turn's results in the
        middle until the request takes about half the window; later results of the run
        are cut as short without another overflow (by the default estimate's tokens: a
        Japanese one of few characters but more tokens than the cut too), and the log
        keeps them whole."""

        @manage_context(context_window_tokens=1_000, compression_threshold=1.0)
        class Reading(Agent):
            max_retries = 0

            @tool
            def read(self, path: str) -> str:
                """Read a file."""
                if path == "file0.txt":
                    return f"{path}: a line of the file\n" * 250  # about 1 500 tokens
                return f"{path}: {later}"

        overflows = 0

        def respond(request: ModelRequest) -> ModelResponse:
            nonlocal overflows
            real = estimate_messages(request.messages)
            if real > 1_000:
                overflows += 1
                raise ContextWindowOverflowError("too long", prompt_tokens=real)
            reads = sum(len(m.tool_results) for m in request.messages)
            if reads < 2:
                return tool_call_response("read", {"path": f"file{reads}.txt"})
            return text_response("done")

        model = ScriptedModel([respond] * 6)
        async with Reading(model=model).stream("Read two files.", history=chat(2)) as events:
            finished = [e async for e in events if isinstance(e, CompactionFinished)]
        result = events.result
        assert result.output == "done"
        assert overflows == 1
        assert [(e.fallback, e.tool_results_cut_to is not None) for e in finished][-1] == (
            True,
            True,
        )
        sent = [r for m in model.requests[-1].messages for r in m.tool_results]
        assert len(sent) == 2 and all("tokens truncated" in r.content for r in sent)
        # the retried request, its results cut a quarter at a time: no further than needed
        assert 3 * 500 // 4 < estimate_messages(model.requests[2].messages) <= 500
        assert [r.content.startswith(f"file{i}.txt") for i, r in enumerate(sent)] == [True] * 2
        logged = [r for m in result.messages for r in m.tool_results]
        assert [len(r.content) for r in logged] == [
            len(Reading().read(f"file{i}.txt")) for i in range(2)
        ]
        (event,) = [
            e
            for e in spans.compactions()
            if "littleghost.compaction.tool_results_cut_to_tokens" in e
        ]
        assert event["littleghost.compaction.outcome"] == "completed"
        assert event["littleghost.compaction.fallback"] is True
        cut_to = event["littleghost.compaction.tool_results_cut_to_tokens"]
        assert 64 <= cut_to < 1_500
        marker = CharacterEstimator().count_tokens("\n[… 9999 tokens truncated …]\n")
        assert all(CharacterEstimator().count_tokens(r.content) <= cut_to + marker for r in sent)

    async def test_a_question_over_the_window_is_not_cut(self) -> None:
        """Only tool results are cut: a current request whose question alone is over the
        window still fails, saying so."""

        @manage_context(context_window_tokens=1_000, compression_threshold=1.0)
        class Reading(Agent):
            max_retries = 0

            @tool
            def read(self) -> str:
                """Read."""
                return "a line of the file\n" * 250

        def respond(request: ModelRequest) -> ModelResponse:
            real = estimate_messages(request.messages)
            if real > 1_000:
                raise ContextWindowOverflowError("too long", prompt_tokens=real)
            if not any(m.tool_results for m in request.messages):
                return tool_call_response("read", {})
            return text_response("done")

        model = ScriptedModel([respond] * 4)
        with pytest.raises(ContextWindowOverflowError) as caught:
            await Reading(model=model).run("word " * 760)
        assert isinstance(caught.value.__cause__, CompactionError)
        assert "current request alone (about " in str(caught.value.__cause__)
        assert "tool results cut to 64 tokens each" in str(caught.value.__cause__)

    async def test_overflow_is_never_retried_without_the_capability(self) -> None:
        """Without manage_context an overflow propagates after one call."""
        model = ScriptedModel([ContextWindowOverflowError("too long"), text_response("x")])

        class Bare(Agent):
            pass

        with pytest.raises(ContextWindowOverflowError):
            await Bare(model=model).run("go")
        assert len(model.requests) == 1


class Densities:
    """A model's script step whose prompt tokens are ``prose`` times the estimate for
    prose and 3 times for digits (instructions as estimated); a chat call overflows over
    1 000 of them, otherwise answers "ok", and a summary call answers "- noted", each
    reporting the count. ``sizes``: each chat call's count."""

    def __init__(self, prose: float = 1.2) -> None:
        self.prose = prose
        self.sizes: list[int] = []

    def __call__(self, request: ModelRequest) -> ModelResponse:
        real = self.count(request)
        if request.purpose == "context_compaction":
            return text_response("- noted", input_tokens=real)
        self.sizes.append(real)
        if real > 1_000:
            raise ContextWindowOverflowError("too long", prompt_tokens=real)
        return text_response("ok", input_tokens=real)

    def density(self, message: Message) -> float:
        text = message.text + "".join(r.content for r in message.tool_results)
        if message.role.is_trusted:
            return 1.0
        return 3.0 if sum(c.isdigit() for c in text) > len(text) / 2 else self.prose

    def count(self, request: ModelRequest) -> int:
        """The prompt tokens of ``request`` (as a model's ``count_prompt_tokens``)."""
        return sum(int(self.density(m) * estimate_messages([m])) for m in request.messages)


def _prose(pairs: int) -> list[Message]:
    return [
        message
        for _ in range(pairs)
        for message in (
            Message.user("Tell me about the weather in the hills. " * 4),
            Message.assistant("The hills are cloudy and the valleys are warm. " * 4),
        )
    ]


class TestTelemetry:
    async def test_event_attributes_and_compacted_flag(self, spans: Spans) -> None:
        """The compaction event carries its figures; the chat span is marked compacted."""
        model = ScriptedModel([summary_step("SECRET-SUMMARY"), text_response("done")])
        result = await Small(model=model).run("go", history=chat(30))
        (event,) = spans.compactions()
        assert event["littleghost.compaction.reason"] == "threshold"
        assert event["littleghost.compaction.outcome"] == "completed"
        (summary,) = [m for m in result.messages if m.is_summary]
        # the messages the summary stands for, not how much shorter the request got (21)
        assert len(summary.metadata[SUMMARY_COVERS_KEY]) == 22
        assert event["littleghost.compaction.removed_messages"] == 22
        assert event["littleghost.compaction.estimated_tokens"] == 62
        assert event["littleghost.compaction.estimated_tokens_after"] == 41
        assert event["littleghost.compaction.context_window_tokens"] == 100
        agent_span = spans.one("invoke_agent")
        chats = spans.named("chat")
        assert [c.attributes["littleghost.purpose"] for c in chats] == [
            "context_compaction",
            "chat",
        ]
        assert all(
            c.parent is not None and c.parent.span_id == agent_span.context.span_id for c in chats
        )
        assert chats[1].attributes.get("gen_ai.conversation.compacted") is True
        assert "gen_ai.conversation.compacted" not in chats[0].attributes
        for span in spans.all():
            values = [str(v) for v in (span.attributes or {}).values()]
            values += [str(v) for e in span.events for v in (e.attributes or {}).values()]
            assert not any("SECRET-SUMMARY" in v for v in values)

    @pytest.mark.parametrize(
        ("stop", "turned"),
        [
            ("cancel", False),
            ("deadline", False),
            ("no time to retry", False),
            ("cancel", True),
            ("deadline", True),
        ],
        ids=["cancel", "deadline", "no time to retry", "cancel turned", "deadline turned"],
    )
    async def test_a_compaction_cut_by_the_run_stopping_is_recorded(
        self, spans: Spans, stop: str, turned: bool
    ) -> None:
        """A summary call cut by a cancellation or the run's deadline (a retry the
        deadline leaves no time for included) still leaves its compaction event: outcome
        cancelled for the caller's cancellation, error with ``DeadlineExceededError`` for
        the deadline, as its chat span says; the cancellation goes on. Alike when the
        call's client ``turned`` the cancellation into an error of its own ("connection
        closed"): never an error of the client's type, as if the compaction had failed."""
        started = anyio.Event()

        async def hang(request: ModelRequest) -> ModelResponse:
            started.set()
            try:
                await anyio.sleep_forever()
            except anyio.get_cancelled_exc_class():
                if turned:
                    raise ProtocolError("connection closed") from None
                raise
            raise AssertionError("unreachable")

        agent = Small(model=ScriptedModel([hang]))
        if stop == "no time to retry":
            agent = Small(model=ScriptedModel([RateLimitError("slow down", retry_after=5)]))
            with pytest.raises(DeadlineExceededError):
                await agent.run("go", history=chat(30), timeout=1)
        elif stop == "deadline":
            with pytest.raises(DeadlineExceededError):
                await agent.run("go", history=chat(30), timeout=0.2)
        else:
            async with anyio.create_task_group() as group:

                async def run() -> None:
                    await agent.run("go", history=chat(30))

                group.start_soon(run)
                await started.wait()
                group.cancel_scope.cancel()
        (event,) = spans.compactions()
        failed = None if stop == "cancel" else "DeadlineExceededError"
        assert event["littleghost.compaction.outcome"] == (
            "cancelled" if failed is None else "error"
        )
        assert event["littleghost.compaction.reason"] == "threshold"
        assert event.get("error.type") == failed
        (summary,) = spans.named("chat")
        if stop != "no time to retry":  # that one failed first, with RateLimitError
            assert (summary.attributes or {}).get("error.type") == failed
        assert not spans.still_open

    @pytest.mark.parametrize("stop", ["deadline", "no time to retry"])
    async def test_a_deadline_cut_compaction_reads_alike_in_event_log_and_stream(
        self, spans: Spans, caplog: pytest.LogCaptureFixture, stop: str
    ) -> None:
        """The span event, the log line and (when the run can still emit one: a retry the
        deadline leaves no time for) ``CompactionFinished`` all say ``error`` with
        ``DeadlineExceededError``."""

        async def hang(request: ModelRequest) -> ModelResponse:
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

        step: Any = hang if stop == "deadline" else RateLimitError("slow down", retry_after=5)
        finished: list[CompactionFinished] = []
        agent = Small(model=ScriptedModel([step]))
        with (
            caplog.at_level("INFO", logger="littleghost.context"),
            pytest.raises(DeadlineExceededError),
        ):
            async with agent.stream("go", history=chat(30), timeout=0.3) as events:
                async for streamed in events:
                    if isinstance(streamed, CompactionFinished):
                        finished.append(streamed)
        (event,) = spans.compactions()
        assert (event["littleghost.compaction.outcome"], event["error.type"]) == (
            "error",
            "DeadlineExceededError",
        )
        (line,) = [r.getMessage() for r in caplog.records if r.name == "littleghost.context"]
        assert line.startswith("context compaction error for Small")
        assert "error=DeadlineExceededError" in line
        if stop == "no time to retry":
            assert [(e.outcome, e.error_type) for e in finished] == [
                ("error", "DeadlineExceededError")
            ]
        else:
            assert finished == []

    @pytest.mark.parametrize("reports", [True, False])
    async def test_compaction_finished_gives_its_before_in_the_units_of_its_after(
        self, spans: Spans, reports: bool
    ) -> None:
        """A summary call refused with its prompt's size (1.5 times the estimate) teaches
        the estimate a new scale during the attempt: ``CompactionFinished`` gives the size
        before in the new units, as the span event does, so that before and after
        compare; a summary call not refused leaves it ``CompactionStarted``'s."""
        refused = False

        def answer(request: ModelRequest) -> ModelResponse:
            nonlocal refused
            if request.purpose != "context_compaction":
                return text_response("done")
            if reports and not refused:
                refused = True
                size = 3 * estimate_messages(request.messages) // 2
                raise ContextWindowOverflowError("too long", prompt_tokens=size)
            return text_response("They talked.")

        @manage_context(preserve_recent_messages=2)
        class Talk(Agent):
            pass

        model = ScriptedModel([answer] * 4, context_window=4_000)
        history = chat(60, prefix="a longer message of the conversation " * 3)
        async with Talk(model=model).stream("go", history=history) as events:
            seen = [
                e async for e in events if isinstance(e, (CompactionStarted, CompactionFinished))
            ]
        started, finished = seen
        assert isinstance(started, CompactionStarted) and isinstance(finished, CompactionFinished)
        assert finished.outcome == "completed" and events.result.output == "done"
        (event,) = spans.compactions()
        assert finished.estimated_tokens_before == event["littleghost.compaction.estimated_tokens"]
        before, after = finished.estimated_tokens_before, finished.estimated_tokens_after
        assert before is not None and after is not None and after < before
        if reports:
            assert before > 1.4 * started.estimated_tokens  # in the units the summary taught
        else:
            assert before == started.estimated_tokens

    @pytest.mark.parametrize("older", [0, 3, 10])
    @pytest.mark.parametrize("asked", [600, 1_100, 1_800])
    @pytest.mark.parametrize("counts", [False, True], ids=["uncounted", "counted"])
    @pytest.mark.parametrize("refuses", [False, True], ids=["accepted", "refused"])
    @pytest.mark.parametrize("summary", [1, 400], ids=["short", "long"])
    async def test_one_record_and_event_per_attempt_each_with_its_reason(
        self,
        spans: Spans,
        caplog: pytest.LogCaptureFixture,
        older: int,
        asked: int,
        counts: bool,
        refuses: bool,
        summary: int,
    ) -> None:
        """A one-call turn that may not compact (a question alone over the threshold or
        the window, a summary longer than what it stands for, a model that counts it
        over, a provider that refuses it): each attempt is one log line and one span
        event, the same, and no phase tells the same outcome for the same reason twice
        (a recount of the current request alone, cut as far as it goes, was one more)."""

        def size(request: ModelRequest) -> int:
            return estimate_request(request.messages, request.tools, request.settings)

        def answer(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                return text_response("word " * summary)
            if refuses and size(request) > 1_000:
                raise ContextWindowOverflowError("too long")
            return text_response("done")

        @manage_context(context_window_tokens=1_000, preserve_recent_messages=4)
        class Asking(Agent):
            max_retries = 0

        model = ScriptedModel([answer] * 8, count_prompt_tokens=size if counts else None)
        with (
            caplog.at_level("INFO", logger="littleghost.context"),
            contextlib.suppress(ContextWindowOverflowError),
        ):
            await Asking(model=model).run("go " * asked, history=chat(older))
        events = spans.compactions()
        lines = [r for r in caplog.records if r.getMessage().startswith("context compaction")]
        assert [r.littleghost for r in lines] == [
            {**e, "gen_ai.agent.name": "Asking"} for e in events
        ]
        told = [
            (
                e["littleghost.compaction.reason"],
                e["littleghost.compaction.outcome"],
                e.get("littleghost.compaction.error_message"),
            )
            for e in events
        ]
        assert len(set(told)) == len(told), told

    async def test_no_compacted_flag_without_compaction(self, spans: Spans) -> None:
        """A request that was not compacted carries no compacted attribute."""
        await Small(model=ScriptedModel([text_response("done")])).run("go")
        assert "gen_ai.conversation.compacted" not in spans.one("chat").attributes


class Served(ScriptedModel):
    """A scripted model that says where its server is."""

    server_address = "llm.internal"
    server_port = 8443


class Uncounting:
    """A model without ``count_prompt_tokens`` that plays a script."""

    provider = "plain"
    name = "plain"
    context_window = None

    def __init__(self, steps: list[Any]) -> None:
        self.scripted = ScriptedModel(steps)

    async def respond(self, request: ModelRequest) -> ModelResponse:
        return await self.scripted.respond(request)


DIGITS = " ".join(str(10_000 + 7 * i) for i in range(200))
"""A question of digits, nine tenths of the window: the history must give way to it."""


class TestCountSpans:
    """Each prompt count is a ``count_tokens {model}`` CLIENT span of the run."""

    async def test_an_overflow_recovered_by_counts_has_a_count_span_for_each(
        self, spans: Spans
    ) -> None:
        """Each count overflow recovery makes is a child of the run's span with the
        model's provider, name and server, the session and the figure: never content,
        even for an agent that captures it."""

        class Capturing(Lenient):
            capture_content = True

        counting, counted = Densities(), list[ModelRequest]()

        def count(request: ModelRequest) -> int:
            counted.append(figure := counting.count(request))
            return figure

        model = Served([counting] * 6, count_prompt_tokens=count, name="counter")
        result = await Capturing(model=model).run(DIGITS, history=_prose(6), session_id="s-1")
        assert result.output == "ok"
        assert counting.sizes[0] > 1_000 >= counting.sizes[-1]  # recovered
        run = spans.one("invoke_agent")
        counts = spans.named("count_tokens")
        assert len(counted) >= 2 and [s.name for s in counts] == ["count_tokens counter"] * len(
            counted
        )
        for span, figure in zip(counts, counted, strict=True):
            assert span.kind is SpanKind.CLIENT
            assert span.parent is not None and span.parent.span_id == run.context.span_id
            assert span.status.status_code is StatusCode.UNSET
            assert dict(span.attributes or {}) == {
                "gen_ai.operation.name": "count_tokens",
                "gen_ai.provider.name": "scripted",
                "gen_ai.request.model": "counter",
                "server.address": "llm.internal",
                "server.port": 8443,
                "gen_ai.conversation.id": "s-1",
                "littleghost.counted_prompt_tokens": figure,
            }
            assert not span.events
        retried = spans.named("chat")[-1].attributes or {}
        assert retried["littleghost.compaction.counted_prompt_tokens"] == counted[-1]

    @pytest.mark.virtual_clock
    @pytest.mark.parametrize("turned", [False, True], ids=["cancellation", "client's error"])
    @pytest.mark.parametrize("stop", ["cancel", "deadline"])
    async def test_a_count_cut_by_the_run_stopping_has_no_figure(
        self, spans: Spans, caplog: pytest.LogCaptureFixture, stop: str, turned: bool
    ) -> None:
        """A slow count is cut by the run's deadline as a model call is (the run raises
        DeadlineExceededError at its deadline, never later) or by a cancellation; its span
        ends without a figure, ERROR with DeadlineExceededError when the deadline cut it,
        else UNSET without error.type. So does one whose client turns the cancellation
        into an error of its own ("connection closed"), which is no failed count either:
        nothing is logged."""
        started = anyio.Event()

        async def slow(request: ModelRequest) -> int:
            started.set()
            try:
                await anyio.sleep(30)
            except anyio.get_cancelled_exc_class():
                if turned:
                    raise OSError("connection closed") from None
                raise
            return 500

        agent = Lenient(model=ScriptedModel([Densities()] * 4, count_prompt_tokens=slow))
        begin = anyio.current_time()
        if stop == "deadline":
            with pytest.raises(DeadlineExceededError):
                await agent.run(DIGITS, history=_prose(6), timeout=0.3)
            assert anyio.current_time() - begin == pytest.approx(0.3)
        else:
            async with anyio.create_task_group() as group:

                async def run() -> None:
                    await agent.run(DIGITS, history=_prose(6))

                group.start_soon(run)
                await started.wait()
                group.cancel_scope.cancel()
            assert anyio.current_time() - begin == 0
        assert started.is_set()
        (span,) = spans.named("count_tokens")
        if stop == "deadline":
            assert span.status.status_code is StatusCode.ERROR
            assert (span.attributes or {})["error.type"] == "DeadlineExceededError"
        else:
            assert span.status.status_code is StatusCode.UNSET
            assert "error.type" not in (span.attributes or {})
        assert "littleghost.counted_prompt_tokens" not in (span.attributes or {})
        assert not spans.still_open
        assert not [r for r in caplog.records if "counting the prompt" in r.getMessage()]

    @pytest.mark.virtual_clock
    async def test_a_count_past_its_timeout_is_an_error_span_and_recovery_goes_on(
        self, spans: Spans, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A count that takes longer than ``COUNT_TIMEOUT`` (a hung count endpoint, with no
        run deadline to cut it) is given up: an ERROR span with ``TimeoutError``, and
        recovery goes on by the estimate and answers."""
        monkeypatch.setattr(littleghost.run, "COUNT_TIMEOUT", 0.2)

        async def hung(request: ModelRequest) -> int:
            await anyio.sleep(30)
            return 500

        counting = Densities()
        agent = Lenient(model=ScriptedModel([counting] * 6, count_prompt_tokens=hung))
        begin = anyio.current_time()
        result = await agent.run(DIGITS, history=_prose(6))
        assert result.output == "ok" and counting.sizes[-2] > 1_000 >= counting.sizes[-1]
        asked = spans.named("count_tokens")
        assert asked and anyio.current_time() - begin == pytest.approx(0.2 * len(asked))
        for span in asked:
            assert span.status.status_code is StatusCode.ERROR
            assert (span.attributes or {})["error.type"] == "TimeoutError"

    @pytest.mark.parametrize(
        "raised",
        [
            DeadlineExceededError("the model's own deadline"),
            CleanupError("a stream was not closed"),
            SessionStoreError("the store is gone"),
        ],
        ids=type,
    )
    async def test_a_count_never_swallows_what_a_run_must_not(
        self, spans: Spans, raised: Exception
    ) -> None:
        """A count that raises an error no optional step swallows ends the run with it,
        as a failed summary call would."""

        def count(request: ModelRequest) -> int:
            raise raised

        agent = Lenient(model=ScriptedModel([Densities()] * 4, count_prompt_tokens=count))
        with pytest.raises(type(raised)) as caught:
            await agent.run(DIGITS, history=_prose(6))
        assert caught.value is raised
        (span,) = spans.named("count_tokens")
        assert (span.attributes or {})["error.type"] == type(raised).__name__

    async def test_a_model_without_the_method_makes_no_count_span(self, spans: Spans) -> None:
        """A model whose count cannot tell (a ScriptedModel without
        ``count_prompt_tokens=``) makes count spans without a figure; a model without
        ``count_prompt_tokens`` makes none, and both recover from the overflow."""
        counting = Densities()
        one = await Lenient(model=ScriptedModel([counting] * 6)).run(DIGITS, history=_prose(6))
        asked = spans.named("count_tokens")
        assert asked and all(
            "littleghost.counted_prompt_tokens" not in (span.attributes or {}) for span in asked
        )
        plain = Uncounting([counting] * 6)
        two = await Lenient(model=plain).run(DIGITS, history=_prose(6))
        assert (one.output, two.output) == ("ok", "ok")
        assert counting.sizes[-2] > 1_000 >= counting.sizes[-1]  # the second run recovered
        assert spans.named("count_tokens") == asked
        assert spans.named("chat plain")


def noting(numbers: int) -> type[Agent]:
    """An agent whose tool returns ``numbers`` figures (digits a model may count heavier
    than estimated) and appends a user note after the run's question."""

    class Noting(Agent):
        max_retries = 0
        instructions = "Be brief."

        @tool
        async def figures(self, context: RunContext) -> str:
            """Fetch the figures and attach a note."""
            await context.append(Message.user("Attached note."))
            return " ".join(str(10_000 + 7 * k) for k in range(numbers))

    return Noting


class TestEstimateUnits:
    async def test_a_run_without_history_keeps_the_scale_of_its_whole_request(self) -> None:
        """A first run (no history) whose tool loop adds digits, then prose: each answered
        request is the current turn alone, and the conversation holds nothing else, so
        each count scales the whole conversation; the scale the last answer keeps for the
        next run is its whole request's, not that of what its turn added last."""
        counting, answered = Densities(prose=1.0), 0

        def respond(request: ModelRequest) -> ModelResponse:
            nonlocal answered
            answered += 1
            real = counting.count(request)
            if answered <= 2:
                return tool_call_response("look", {"i": answered}, input_tokens=real)
            return text_response("ok", input_tokens=real)

        @manage_context(context_window_tokens=100_000)
        class Looking(Agent):
            max_retries = 0

            @tool
            def look(self, i: int) -> str:
                """Look."""
                if i == 1:
                    return " ".join(str(10_000 + 7 * k) for k in range(500))
                return "The hills are green. " * 150

        model = ScriptedModel([respond] * 3)
        result = await Looking(model=model).run("Tell me about the hills and the coast.")
        kept = [m.metadata[SCALE_KEY] for m in result.messages if SCALE_KEY in m.metadata]
        last = model.requests[-1]
        whole = counting.count(last) / estimate_request(last.messages, last.tools, {})
        assert len(kept) == 2 and kept[-1] == pytest.approx(whole, rel=0.05)

    async def test_the_count_of_a_turn_a_tool_appended_a_user_message_to_is_the_turns(
        self,
    ) -> None:
        """A bounded view leaves out the conversation's one earlier exchange, too long
        for it; a tool fetches the order's figures (digits, which the model counts three
        times as heavy as estimated) and appends a user note after the run's question.
        Each answered request is the current turn alone, from the question, so its count
        teaches the turn's density, not the conversation's scale: the answers keep none,
        and the next run, its view under the threshold at the estimate, is not compacted
        (the turn was taken to start at the note and the count to scale the whole
        conversation: the answers kept the figures' density, about 2.75, and the next run
        summarized the earlier question away)."""

        Noting = manage_context(
            context_window_tokens=3_000,
            compression_threshold=0.5,
            preserve_recent_messages=2,
            budget=PromptBudget(
                prompt_budget_tokens=1_300,
                response_reserve_tokens=100,
                safety_reserve_tokens=50,
                excerpt_tokens=0,
            ),
        )(noting(100))

        chats: list[ModelRequest] = []

        def respond(request: ModelRequest) -> ModelResponse:
            results = [m for m in request.messages if m.tool_results]
            real = estimate_request(request.messages, request.tools, {})
            real += 2 * estimate_messages(results)  # the figures: three times the estimate
            if request.purpose == "context_compaction":
                return text_response("- noted", input_tokens=real)
            chats.append(request)
            if len(chats) == 1:
                return tool_call_response("figures", {}, input_tokens=real)
            return text_response("done", input_tokens=real)

        model = ScriptedModel([respond] * 4)
        agent = Noting(model=model)
        earlier = [
            Message.user("What did the audit find?"),
            Message.assistant("The audit found the books in order. " * 200),
        ]
        one = await agent.run("Summarize order 42: " + "detail " * 300, history=earlier)
        assert [len(r.messages) for r in chats] == [2, 5]  # the instructions and the turn
        assert chats[1].messages[-1].text == "Attached note."
        assert not [m for m in one.messages if SCALE_KEY in m.metadata]
        two = await agent.run("And its total?", history=one.messages)
        assert len(model.requests) == 3  # one more call: no summary call
        assert not [m for m in two.messages if m.is_summary]

    @pytest.mark.parametrize("model", ["counts", "cannot count"])
    async def test_overflow_recovery_takes_a_turn_a_tool_appended_a_user_message_to_whole(
        self, model: str, spans: Spans
    ) -> None:
        """A tool appends a user note after the question and returns figures the model
        counts at three times the estimate; the next request overflows. Recovery takes the
        turn from the question, note and all: a model that counts is asked for that turn's
        density, so the summary is fitted at what the model counts (with the note alone
        counted, the figures went into the history's scale and the retry was counted at 925
        tokens, estimated at 776); for one that cannot, the margin is the turn's, and the
        summary fits without a model-free step (the figures were taken for history, and a
        model-free step left the summary and the last exchange out)."""

        Noting = manage_context(context_window_tokens=1_000, compression_threshold=1.0)(noting(150))

        counting, counted = Densities(), list[ModelRequest]()

        def count(request: ModelRequest) -> int:
            counted.append(request)
            return counting.count(request)

        def respond(request: ModelRequest) -> ModelResponse:
            if request.purpose == "chat" and not any(m.tool_results for m in request.messages):
                return tool_call_response("figures", {})  # no usage reported
            return counting(request)  # overflows over 1 000

        counts = model == "counts"
        scripted = ScriptedModel([respond] * 4, count_prompt_tokens=count if counts else None)
        history = _prose(4)
        question = "Please describe the coast and the hills in some detail. " * 2
        result = await Noting(model=scripted).run(question, history=history)
        assert result.output == "ok"
        purposes = [r.purpose for r in scripted.requests]
        assert purposes == ["chat", "chat", "context_compaction", "chat"]
        overflowed, retried = scripted.requests[1].messages, scripted.requests[-1].messages
        turn = overflowed[-4:]  # the question, the call, the figures, the note
        assert turn[0].text == question and turn[-1].text == "Attached note."
        (summary,) = [m for m in result.messages if m.is_summary]
        kept = [] if counts else history[-2:]  # the last exchange
        assert [m.id for m in retried[1:]] == [m.id for m in [summary, *kept, *turn]]
        (made,) = spans.compactions()  # the summary: no model-free step
        assert "littleghost.compaction.fallback" not in made
        if counts:
            assert [m.id for m in counted[0].messages[1:]] == [m.id for m in turn]
            after = made["littleghost.compaction.estimated_tokens_after"]
            assert after == pytest.approx(counting.sizes[-1], abs=5)

    async def test_a_compaction_is_judged_in_the_units_it_was_triggered_in(
        self, spans: Spans
    ) -> None:
        """A provider denser than the estimate does not make every compaction 'useless'."""

        @manage_context(
            context_window_tokens=2_000, compression_threshold=0.5, preserve_recent_messages=4
        )
        class Dense(Agent):
            @tool
            def ping(self) -> str:
                """Ping."""
                return "pong " * 50

        chats = 0

        def respond(request: ModelRequest) -> ModelResponse:
            nonlocal chats
            if request.purpose == "context_compaction":
                return text_response("summary")
            chats += 1
            chars = sum(
                len(m.text) + sum(len(r.content) for r in m.tool_results) + 40
                for m in request.messages
            )
            reported = int(0.6 * chars / 4)
            if chats > 18:
                return text_response("done", input_tokens=reported)
            return tool_call_response("ping", {}, input_tokens=reported)

        model = ScriptedModel([respond] * 40)
        result = await Dense(model=model).run("go", history=chat(70))
        assert result.output == "done"
        outcomes = [e["littleghost.compaction.outcome"] for e in spans.compactions()]
        assert outcomes.count("completed") >= 3  # each the first at its size
        assert set(outcomes) <= {"completed", "skipped"}

    async def test_a_prompt_the_server_cut_silently_is_not_learned_from(
        self, spans: Spans, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A server whose window is smaller than the one littleghost compacts for may cut
        the prompt without an error and report the tokens it kept (Ollama does). A count
        under a quarter of the estimate is such a cut: it neither calibrates the run
        (which would make every later estimate four times too small, and stop compaction
        for good) nor sizes the next request of the tool loop; the run warns once, with
        figures only, and compacts by the estimate."""

        @manage_context(context_window_tokens=1_000, compression_threshold=0.75)
        class Cut(Agent):
            max_retries = 0

            @tool
            def fetch(self) -> str:
                """Fetch the record."""
                return "record field " * 60

        def respond(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                return text_response("- noted")
            if len(request.messages) < 4:  # the question, then the record
                return tool_call_response("fetch", {}, input_tokens=100)  # cut to 100
            return text_response("done", input_tokens=100)

        history = [Message.user("Tell me about the weather in the hills. " * 30)]
        history.append(Message.assistant("The hills are cloudy. " * 40))
        model = ScriptedModel([respond] * 6, name="cutting")
        with caplog.at_level("WARNING", logger="littleghost.context"):
            result = await Cut(model=model).run("Fetch it.", history=history)
        assert result.output == "done"
        assert SCALE_KEY not in result.messages[-1].metadata  # nothing learned to keep
        (compaction,) = spans.compactions()  # the record took the request over 750
        assert compaction["littleghost.compaction.reason"] == "threshold"
        (warning,) = [r for r in caplog.records if "cut the prompt" in r.getMessage()]
        assert "'cutting' reported 100 prompt tokens" in warning.getMessage()
        assert "hills" not in caplog.text and "record field" not in caplog.text
        reported = [
            (event.attributes or {}).get("littleghost.context.reported_prompt_tokens")
            for event in spans.one("invoke_agent").events
            if event.name == "littleghost.context.partial_count"
        ]
        assert reported == [100, 100]  # a span event for each, one warning

    @pytest.mark.parametrize(
        ("instructions", "reported"),
        [("", 5), ("Answer from the records. " * 100, 400)],
        ids=["under a quarter", "a quarter but no more than instructions and schemas"],
    )
    async def test_a_count_no_larger_than_instructions_and_schemas_sizes_nothing(
        self, instructions: str, reported: int, spans: Spans
    ) -> None:
        """A count at most the estimate of the instructions and tool schemas gives the
        conversation a scale of 0 (under a quarter): it is not learned from, and it does
        not size the next request of the tool loop either, without a warning (a template
        may render no schemas), so the record that takes that request over the threshold
        is compacted for."""

        @manage_context(context_window_tokens=2_000, compression_threshold=0.75)
        class Cut(Agent):
            max_retries = 0

            @tool
            def fetch(self) -> str:
                """Fetch the record."""
                return "record field " * 300

        def respond(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                return text_response("- noted")
            if len(request.messages) < 5:  # the question, then the record
                return tool_call_response("fetch", {}, input_tokens=reported)
            return text_response("done")  # no count

        history = [Message.user("Tell me about the weather in the hills. " * 30)]
        history.append(Message.assistant("The hills are cloudy. " * 40))
        model = ScriptedModel([respond] * 6, name="cutting")
        result = await Cut(model=model, instructions=instructions or None).run(
            "Fetch it.", history=history
        )
        assert result.output == "done"
        first = model.requests[0]
        said = [m for m in first.messages if m.role is Role.SYSTEM]  # the instructions
        assert reported <= estimate_request(said, first.tools, {})  # no more than those
        (compaction,) = spans.compactions()  # the record took the request over 1 500
        assert compaction["littleghost.compaction.reason"] == "threshold"
        assert SCALE_KEY not in result.messages[-1].metadata  # nothing learned to keep

    @staticmethod
    async def _fetch(
        window: int,
        name: str,
        reported: Callable[[ModelRequest, int], int],
        history: Sequence[Message] = (),
        instructions: Callable[[RunContext], str] | None = None,
    ) -> tuple[RunResult[str], list[int]]:
        """A run of twelve calls, eleven fetching a record, and the real size of each
        request; ``reported`` gives the count the server reports for a request and its
        real size (the estimate)."""

        @manage_context(context_window_tokens=window, compression_threshold=0.75)
        class Fetching(Agent):
            max_retries = 0

            @tool
            def fetch(self) -> str:
                """Fetch the next record."""
                return "record field " * 40

        def respond(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                return text_response("- noted")
            real = estimate_messages(request.messages)
            counted = reported(request, real)
            sizes.append(real)
            if len(sizes) < 12:
                return tool_call_response("fetch", {}, input_tokens=counted)
            return text_response("done", input_tokens=counted)

        sizes: list[int] = []
        model = ScriptedModel([respond] * 16, name=name)
        agent = Fetching(model=model, instructions=instructions)
        return await agent.run("Fetch the records.", history=history), sizes

    @pytest.mark.parametrize("case", ["plain", "dense", "instructions that change"])
    async def test_a_count_that_stops_growing_is_a_cut_and_compaction_goes_on(
        self, case: str, spans: Spans, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A server whose window is smaller than the one compacted for may cut every prompt
        over it to what fits and report that. The first cut count looks like a low scale;
        the next ones, for requests that only added to it, do not grow. One such count
        alone can be a chat template's doing (some render the tool schemas or earlier
        reasoning only near the end); two in a row are the server's: the run warns once,
        takes the scale back to what it was before the first cut count, at least 1.0,
        where later counts cannot lower it (kept in the answers, 1.0 too where a lower one
        was kept before), and compacts by the estimate (it never would by those counts).
        A server that keeps less (Ollama keeps half its window) is caught a call sooner:
        its first cut count is already lower than the last one. Instructions that change
        at every call do not hide it (the conversation after them is compared)."""
        density = 2 if case == "dense" else 1

        def cut(request: ModelRequest, estimate: int) -> int:
            return min(density * estimate, 800)  # over 800: cut to fit, silently

        def steps(context: RunContext) -> str:
            return f"Fetch records. Fetched so far: {sum(1 for m in context.messages if m.tool_results)}."

        dynamic = steps if case == "instructions that change" else None
        with caplog.at_level("WARNING", logger="littleghost.context"):
            result, sizes = await self._fetch(2_000, "cutting", cut, instructions=dynamic)
        assert result.output == "done"
        (warning,) = [r for r in caplog.records if "cut the prompt" in r.getMessage()]
        assert (
            "'cutting' reported 800 prompt tokens for a request that adds to one it reported "
            "800 for" in warning.getMessage()
        )
        assert "record field" not in caplog.text
        reasons = [c["littleghost.compaction.reason"] for c in spans.compactions()]
        assert reasons and set(reasons) == {"threshold"}
        assert density * max(sizes) > 1_200  # near the threshold, the count stuck at 800
        partial = [
            dict(event.attributes or {})
            for event in spans.one("invoke_agent").events
            if event.name == "littleghost.context.partial_count"
        ]
        record = estimate_messages([next(m for m in result.messages if m.tool_results)])
        assert partial[0] == {  # each such count, with figures only
            "littleghost.context.reported_prompt_tokens": 800,
            "littleghost.context.least_prompt_tokens": 800 + math.ceil(0.25 * record),
        }
        kept = [m.metadata[SCALE_KEY] for m in result.messages if SCALE_KEY in m.metadata]
        cut = next(i for i in range(1, len(kept)) if kept[i] < kept[i - 1])  # a cut count's
        back = kept.index(kept[-1], cut)  # taken back, and never lower again
        assert set(kept[back:]) == {kept[-1]}
        assert kept[-1] == max(*kept[:cut], 1.0)  # what whole counts taught (2: about 1.9)

    async def test_a_chat_whose_runs_are_one_call_each_is_compared_across_runs(
        self, spans: Spans, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A chat session's question is one model call: each run's count is compared with
        the one the conversation's last answer kept (``littleghost.context.prompt_count``,
        with whether it grew too little), so a server that cuts every prompt is caught in
        a chat too; a count that cannot be compared (a compaction came between) after
        one that grew too little does not lower the scale either."""

        @manage_context(context_window_tokens=2_000, compression_threshold=0.75)
        class Chatting(Agent):
            max_retries = 0

        def respond(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                compacted.append(turn)
                return text_response("- noted")
            real = estimate_messages(request.messages)  # over 800: cut to fit, silently
            return text_response("Answer: " + "some prose words " * 25, input_tokens=min(real, 800))

        compacted: list[int] = []
        starts: list[float] = []  # the scale each next run starts from
        agent = Chatting(model=ScriptedModel([respond] * 40, name="cutting"))
        with caplog.at_level("WARNING", logger="littleghost.context"):
            for turn in range(12):
                question = f"Question {turn}: " + "tell me more about it " * 25
                result = await agent.run(question, session_id="chat")
                starts.append(remembered(result.messages, None)[1])
        warned = [r.getMessage() for r in caplog.records if "cut the prompt" in r.getMessage()]
        assert warned and all("adds to one it reported 800 for" in w for w in warned)
        assert min(starts) < 0.9  # the first cut count looked like a scale
        assert compacted and all(start >= 1.0 for start in starts[compacted[0] :])
        assert {c["littleghost.compaction.reason"] for c in spans.compactions()} == {"threshold"}

    @pytest.mark.parametrize(
        "change",
        ["view drops turns", "view shortens turns", "tools", "instructions", "model"],
    )
    async def test_a_chat_whose_requests_change_between_runs_is_no_cut(
        self, change: str, spans: Spans, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Between a chat's runs, the part of the next request before the last answer may
        not be the request that answer's count was for: a ``PromptBudget`` view leaves
        out older turns or shortens long ones, another agent on the session offers fewer
        tools or shorter instructions, another model (with its own tokenizer) answers.
        Whole counts that shrank with the request are not taken for a cut."""
        room = 600 if change == "view drops turns" else 20_000
        budget = PromptBudget(
            prompt_budget_tokens=room, response_reserve_tokens=100, safety_reserve_tokens=50
        )
        bounded = {"budget": budget} if change.startswith("view") else {}

        @manage_context(context_window_tokens=32_000, **bounded)
        class Chatting(Agent):
            max_retries = 0
            session_store = InMemorySessionStore()  # shared with the subclasses

        described = "Say what is there, in as much detail as is known. " * 20

        class Glancing(Chatting):
            @tool(description=described)
            def look(self, where: str) -> str:
                return where

        class Looking(Glancing):
            @tool(description=described)
            def fetch(self, record: str) -> str:
                return record

        def server(density: float) -> Callable[[ModelRequest], ModelResponse]:
            def respond(request: ModelRequest) -> ModelResponse:
                real = estimate_request(request.messages, request.tools, {})  # whole
                answer = "Answer: " + "some prose words " * 10
                return text_response(answer, input_tokens=math.ceil(density * real))

            return respond

        document = "The report shows revenue grew in all regions while costs fell. " * 400
        with caplog.at_level("WARNING", logger="littleghost.context"):
            for turn in range(6):
                density = (1.3, 1.0, 0.8)[turn % 3] if change == "model" else 1.0
                model = ScriptedModel([server(density)], name=f"model-{density}")
                kind = (
                    (Looking, Glancing, Chatting)[min(turn, 2)] if change == "tools" else Chatting
                )
                words = "tell me more about it " * (10 + 8 * (turn % 3))
                if change == "view shortens turns":
                    words = document if turn < 3 else "What differs?"
                shorter = change == "instructions"
                instructions = "Answer with care. " * (400 // (turn + 1) if shorter else 10)
                agent = kind(model=model, instructions=instructions)
                result = await agent.run(f"Question {turn}: {words}", session_id="chat")
        assert len(result.messages) == 12  # one conversation
        assert not [r for r in caplog.records if "cut the prompt" in r.getMessage()]
        assert not [e for s in spans.all() for e in s.events if e.name.endswith("partial_count")]

    async def test_one_count_that_grew_too_little_does_not_hold_the_scale(self) -> None:
        """A count that grew too little is carried past a compaction only: in a chat whose
        bounded view drops a turn at every question (no count is compared with the last),
        one such count leaves later counts free to lower the scale."""
        budget = PromptBudget(
            prompt_budget_tokens=600, response_reserve_tokens=100, safety_reserve_tokens=50
        )

        @manage_context(context_window_tokens=4_000, budget=budget)
        class Bounded(Agent):
            max_retries = 0

        def respond(request: ModelRequest) -> ModelResponse:
            density = 1.6 if len(counts) < 2 else 1.0  # long code answers first
            real = math.ceil(density * estimate_messages(request.messages))
            counts.append(counts[-1] + 10 if len(counts) == 1 else real)  # one grew too little
            return text_response("Answer: " + "some prose words " * 10, input_tokens=counts[-1])

        counts: list[int] = []
        agent = Bounded(model=ScriptedModel([respond] * 8))
        for turn in range(8):
            question = f"Question {turn}: " + "tell me more about it " * (10 + 8 * (turn % 3))
            result = await agent.run(question, session_id="chat")
        kept = [m.metadata[SCALE_KEY] for m in result.messages if SCALE_KEY in m.metadata]
        assert kept[0] > 1.5 and kept[-1] < 1.1

    async def test_counts_that_grew_too_little_either_side_of_a_rewrite_are_no_cut(
        self, spans: Spans, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Two counts that grew too little are a cut only in a row: a whole count between
        them that cannot be compared (a hook rewrote an older message of the request) breaks
        the row, as one that can would; only a compaction carries it."""

        @manage_context(context_window_tokens=32_000)
        class Rewriting(Agent):
            max_retries = 0

            @tool
            def fetch(self) -> str:
                """Fetch the next record."""
                return "record field " * 40

            @before_model
            def restate(self, request: ModelRequest) -> ModelRequest:
                if len(request.messages) < 5:
                    return request
                question, *rest = request.messages
                restated = attrs.evolve(question, content=(TextPart("Fetch three records."),))
                return attrs.evolve(request, messages=(restated, *rest))

        def respond(request: ModelRequest) -> ModelResponse:
            whole = estimate_request(request.messages, request.tools, {})
            counts.append(counts[-1] + 10 if len(counts) in (1, 3) else whole)  # a template's
            if len(counts) == 4:
                return text_response("done", input_tokens=counts[-1])
            return tool_call_response("fetch", {}, input_tokens=counts[-1])

        counts: list[int] = []
        with caplog.at_level("WARNING", logger="littleghost.context"):
            result = await Rewriting(model=ScriptedModel([respond] * 4)).run("Fetch records.")
        assert result.output == "done"
        assert counts[2] > counts[1] + 10  # whole again, then too little once more
        assert not [r for r in caplog.records if "cut the prompt" in r.getMessage()]
        events = spans.one("invoke_agent").events
        assert not [e for e in events if e.name == "littleghost.context.partial_count"]

    @pytest.mark.parametrize("server", ["template", "reasoning", "images"])
    async def test_whole_counts_that_grow_less_than_the_estimate_are_no_cut(
        self, server: str, spans: Spans, caplog: pytest.LogCaptureFixture
    ) -> None:
        """Whole counts can grow by less than a quarter of the estimate of what a request
        added, for reasons of the server's own: a chat template that renders the
        instructions only while a user message is last drops them once (Ollama's for
        Mistral NeMo does that with the tool schemas); a server that leaves earlier
        reasoning out, or counts an image at less than the estimator's allowance, grows
        less at every call. Neither is taken for a cut."""
        estimator = ByteEstimator()  # 765 tokens an image

        @manage_context(context_window_tokens=32_000, tokenizer=estimator)
        class Looking(Agent):
            max_retries = 0
            instructions = "You look at the page and report what is on it. " * 40

            @tool
            async def look(self, context: RunContext) -> str:
                """Look at the page."""
                if server == "images":
                    image = ImagePart(url="https://example.com/page.png")
                    await context.append(Message(Role.USER, (TextPart("The page:"), image)))
                return "a page of text"

        def counted(message: Message) -> Message:
            gone = ImagePart if server == "images" else ReasoningPart
            parts = [part for part in message.content if not isinstance(part, gone)]
            return Message(message.role, parts, message.id)

        def respond(request: ModelRequest) -> ModelResponse:
            sent = [counted(m) for m in request.messages]
            if server == "template" and sent[-1].role is not Role.USER:
                sent = [m for m in sent if m.role is not Role.SYSTEM]
            real = estimate_messages(sent, estimator)
            real += 85 * sum(isinstance(p, ImagePart) for m in request.messages for p in m.content)
            answer = tool_call_response("look", {}, input_tokens=real)
            if len(sizes) == 5:
                answer = text_response("done", input_tokens=real)
            sizes.append(real)
            if server != "reasoning":
                return answer
            thought = ReasoningPart("Where do I look next? " * 60, None, "scripted")
            message = attrs.evolve(answer.message, content=(thought, *answer.message.content))
            return attrs.evolve(answer, message=message)

        sizes: list[int] = []
        with caplog.at_level("WARNING", logger="littleghost.context"):
            result = await Looking(model=ScriptedModel([respond] * 6)).run("What is on it?")
        assert result.output == "done"
        assert not [r for r in caplog.records if "cut the prompt" in r.getMessage()]
        events = spans.one("invoke_agent").events
        assert not [e for e in events if e.name == "littleghost.context.partial_count"]
        assert sizes == sorted(sizes) or server == "template"  # whole counts, as rendered

    async def test_a_count_of_only_what_was_not_cached_is_not_learned_from(
        self, spans: Spans, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A server that reports only the prompt tokens it did not have cached (some
        releases of Ollama did) reports each request of a tool loop at about the size of
        its newest result. Those counts teach nothing (the run warns once), so every
        compaction comes at the threshold, before the server refuses a prompt; learned
        from, they made the estimate too small and the server refused three."""
        cached: list[Message] = []

        def uncached(request: ModelRequest, real: int) -> int:
            if real > 1_000:
                raise ContextWindowOverflowError("too long", prompt_tokens=real)
            shared = 0
            while shared < min(len(cached), len(request.messages)) and (
                cached[shared] == request.messages[shared]
            ):
                shared += 1
            cached[:] = request.messages
            return real - estimate_messages(request.messages[:shared])  # the prefix left out

        with caplog.at_level("WARNING", logger="littleghost.context"):
            result, _ = await self._fetch(1_000, "caching", uncached, history=chat(45))
        assert result.output == "done"
        reasons = [c["littleghost.compaction.reason"] for c in spans.compactions()]
        assert reasons and set(reasons) == {"threshold"}
        (warning,) = [r for r in caplog.records if "cut the prompt" in r.getMessage()]
        assert "or counts only what it had not cached" in warning.getMessage()
        # the second count, under a quarter of the estimate, is reported at once
        assert "'caching' reported 161 prompt tokens for a request estimated at" in (
            warning.getMessage()
        )

    @pytest.mark.parametrize("shown", ["in the history", "by a tool"])
    async def test_the_calibration_scales_text_never_images(self, shown: str, spans: Spans) -> None:
        """An image costs the estimator's allowance (765 tokens for ``ByteEstimator``)
        whatever the provider's density on text (here 1.5 times the estimate). The scale
        is learned from the text, the count less the images' allowance: a provider that
        counts an image in the history at that allowance leaves the run 1.5 (it said
        1.28). And it is applied to the text: an image a tool shows, which the provider
        counts at 170, is sent whole (the estimate said 1.5 times 765 for it, over the
        window at 2 533, and compacted)."""
        estimator, page = ByteEstimator(), ImagePart(url="https://example.com/page.png")

        @manage_context(context_window_tokens=2_400, compression_threshold=1.0, tokenizer=estimator)
        class Looking(Agent):
            max_retries = 0

            @tool
            async def look(self, context: RunContext) -> str:
                """Look at the page."""
                await context.append(Message(Role.USER, (TextPart("The page:"), page)))
                return "a page of text"

        def respond(request: ModelRequest) -> ModelResponse:
            images = sum(isinstance(p, ImagePart) for m in request.messages for p in m.content)
            text = estimate_messages(request.messages, estimator) - 765 * images
            real = math.ceil(1.5 * text) + (765 if shown == "in the history" else 170) * images
            real += estimate_request((), request.tools, request.settings, estimator)
            if real > 2_400:
                raise ContextWindowOverflowError("too long", prompt_tokens=real)
            sizes.append(real)
            if len(sizes) == 1 and shown == "by a tool":
                return tool_call_response("look", {}, input_tokens=real)
            return text_response("done", input_tokens=real)

        history = _prose(6 if shown == "by a tool" else 7)
        if shown == "in the history":
            history[0] = Message(Role.USER, (*history[0].content, page))
        sizes: list[int] = []
        result = await Looking(model=ScriptedModel([respond] * 4)).run(
            "What is on it?", history=history
        )
        assert result.output == "done"
        assert not spans.compactions()
        if shown == "in the history":
            assert result.messages[-1].metadata[SCALE_KEY] == pytest.approx(1.5, abs=0.01)
        else:
            assert len(sizes) == 2  # sent whole, not compacted


def kept(scale: float, agent: type[Agent]) -> dict[str, Any]:
    """The metadata of an answer of ``agent``'s run on a ``ScriptedModel`` that learned
    ``scale``."""
    config = agent.context_management
    return {SCALE_KEY: scale, SCALE_FOR_KEY: scale_for(ScriptedModel([]), config.tokenizer)}


class TestPreview:
    """``preview_request``: the first request of a run, as the hook makes it, without a run."""

    @staticmethod
    def preview(
        agent: Agent, log: list[Message], window: int, model: Model | None = None
    ) -> RequestPreview:
        assert isinstance(agent.instructions, str)
        request = ModelRequest(
            (instructions_message(agent.instructions), *build_view(log)),
            agent.tool_specs,
            agent.settings,
        )
        return preview_request(
            request,
            log,
            agent.context_management,
            window,
            max_tool_result_tokens=agent.max_tool_result_tokens,
            model=model,
        )

    async def test_the_preview_is_what_the_first_call_sends_bounded_and_clipped(self) -> None:
        @manage_context(
            context_window_tokens=4_000,
            budget=PromptBudget(
                prompt_budget_tokens=400, response_reserve_tokens=100, safety_reserve_tokens=50
            ),
            summarize=False,
        )
        class Bounded(Agent):
            instructions = "You report the weather."
            max_tool_result_tokens = 20

            @tool
            def weather(self, city: str) -> str:
                """The weather in a city."""
                return "sunny"

        log: list[Message] = []
        for turn in range(12):
            call = ToolCall(f"c{turn}", "weather", {"city": f"city {turn}"})
            log += [
                Message.user(f"Weather in city {turn}?"),
                Message.assistant(tool_calls=[call]),
                Message.tool(call.id, f"report {turn}: " + "sunny and warm " * 30),
                Message.assistant(f"It is sunny in city {turn}."),
            ]
        model = ScriptedModel([text_response("Sunny.")])
        following = Message.user("And tomorrow?")
        await Bounded(model=model).run(following, history=log)
        preview = self.preview(Bounded(), [*log, following], 4_000)
        assert preview.request == model.requests[0]
        assert preview.budget is not None and preview.budget.turns_dropped > 0
        assert any(
            "truncated" in r.content for m in preview.request.messages for r in m.tool_results
        )
        assert len(preview.message_tokens) == len(preview.request.messages)
        assert (preview.threshold_tokens, preview.compaction_due) == (None, False)

    async def test_the_preview_counts_the_output_cap_the_model_sends_by_default(self) -> None:
        """A model with a default output cap (``AnthropicModel``'s) has it set in a run's
        requests: the preview of that model's run counts it as the run does, so the
        compaction it says is due is the one the run makes."""

        class Capped(ScriptedModel):
            default_max_tokens = 40

        log = [*chat(5), Message.user("go")]
        plain = self.preview(Small(), log, 100, ScriptedModel([]))
        preview = self.preview(Small(), log, 100, Capped([]))
        assert preview.request.max_tokens == 40
        assert preview.estimated_tokens == plain.estimated_tokens + 40
        assert (plain.compaction_due, preview.compaction_due) == (False, True)
        model = Capped([summary_step(), text_response("ok")])
        await Small(model=model).run(log[-1], history=log[:-1])
        assert model.requests[0].purpose == "context_compaction"

    @pytest.mark.parametrize(("pairs", "due"), [(5, False), (30, True)])
    async def test_due_as_the_next_run_finds_it(self, pairs: int, due: bool) -> None:
        log = [*chat(pairs), Message.user("go")]
        preview = self.preview(Small(), log, 100)
        assert preview.threshold_tokens == 50
        assert preview.compaction_due is due
        assert (preview.estimated_tokens >= 50) is due
        model = ScriptedModel(
            [summary_step(), text_response("ok")] if due else [text_response("ok")]
        )
        await Small(model=model).run(log[-1], history=log[:-1])
        assert model.requests[0].purpose == ("context_compaction" if due else "chat")

    async def test_after_a_compaction_left_it_over_the_threshold_it_waits(self) -> None:
        marked = Message.assistant("noted", metadata={AFTER_KEY: 55})
        log = [*chat(26), Message.user("more?"), marked, Message.user("go")]
        preview = self.preview(Small(), log, 100)
        assert 50 <= preview.estimated_tokens < 65
        assert (preview.waits_until, preview.compaction_due) == (65, False)
        model = ScriptedModel([text_response("ok")])
        await Small(model=model).run(log[-1], history=log[:-1])
        assert [request.purpose for request in model.requests] == ["chat"]

    async def test_it_compacts_once_the_request_has_grown_to_the_size_it_waited_for(
        self,
    ) -> None:
        """The wait ends at ``waits_until``: a request of exactly that size compacts."""
        log = [*chat(26), Message.user("more?"), Message.assistant("noted"), Message.user("go")]
        estimated = self.preview(Small(), log, 100).estimated_tokens
        log[-2] = attrs.evolve(log[-2], metadata={AFTER_KEY: estimated - 10})
        preview = self.preview(Small(), log, 100)
        assert (preview.waits_until, preview.compaction_due) == (estimated, True)
        model = ScriptedModel([summary_step(), text_response("ok")])
        await Small(model=model).run(log[-1], history=log[:-1])
        assert model.requests[0].purpose == "context_compaction"

    async def test_left_exactly_at_a_low_threshold_it_waits_for_a_tenth_of_the_window(
        self,
    ) -> None:
        """At the threshold, the wait is ``REGROWTH`` of the window, not the smaller room
        a compaction under a low threshold aims to leave."""

        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.3,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Low(Agent):
            instructions = "Be brief."

        marked = Message.assistant("noted", metadata={AFTER_KEY: 30})
        log = [*chat(17), Message.user("more?"), marked, Message.user("go")]
        preview = self.preview(Low(), log, 100)
        assert (preview.threshold_tokens, preview.estimated_tokens) == (30, 38)
        assert (preview.waits_until, preview.compaction_due) == (40, False)
        model = ScriptedModel([text_response("ok")])
        await Low(model=model).run(log[-1], history=log[:-1])
        assert [request.purpose for request in model.requests] == ["chat"]

    async def test_a_request_over_the_window_compacts_whatever_the_wait(self) -> None:
        """The wait after a compaction that left the request near the window (no thrash)
        ends at the window: a request over it would be refused, and overflow recovery
        would then compact it anyway, after a wasted call (a case the combination harness
        found: the wait the previous run's records kept ran past the window)."""
        marked = Message.assistant("noted", metadata={AFTER_KEY: 95})
        log = [*chat(48), Message.user("more?"), marked, Message.user("go")]
        preview = self.preview(Small(), log, 100)
        assert (preview.estimated_tokens, preview.waits_until) == (100, 105)
        assert preview.compaction_due
        model = ScriptedModel([summary_step(), text_response("ok")])
        await Small(model=model).run(log[-1], history=log[:-1])
        assert [request.purpose for request in model.requests] == ["context_compaction", "chat"]

    async def test_the_newest_compaction_s_size_is_the_one_the_next_run_waits_from(
        self,
    ) -> None:
        """Two compactions left their sizes in the log: the newest one's decides."""
        older = Message.assistant("noted", metadata={AFTER_KEY: 10})
        newer = Message.assistant("noted again", metadata={AFTER_KEY: 55})
        log = [*chat(25), Message.user("q"), older, Message.user("more?"), newer]
        log.append(Message.user("go"))
        preview = self.preview(Small(), log, 100)
        assert (preview.waits_until, preview.compaction_due) == (65, False)
        model = ScriptedModel([text_response("ok")])
        await Small(model=model).run(log[-1], history=log[:-1])
        assert [request.purpose for request in model.requests] == ["chat"]

    async def test_the_calibration_an_earlier_run_kept_counts_as_the_next_run_counts_it(
        self,
    ) -> None:
        log = [*chat(8), Message.user("go")]
        plain = self.preview(Small(), log, 100)
        assert not plain.compaction_due
        log[-2] = attrs.evolve(log[-2], metadata=kept(4.0, Small))  # the last run's answer
        preview = self.preview(Small(), log, 100)
        assert preview.estimated_tokens > 2 * plain.estimated_tokens
        assert preview.compaction_due
        model = ScriptedModel([summary_step(), text_response("ok")])
        await Small(model=model).run(log[-1], history=log[:-1])
        assert model.requests[0].purpose == "context_compaction"

    @pytest.mark.parametrize(
        "learned_for", ["openai:gpt-4o-mini by CharacterEstimator", "scripted:scripted by Exact"]
    )
    async def test_a_calibration_kept_for_another_model_or_estimate_is_not_resumed(
        self, learned_for: str
    ) -> None:
        """A session shared with a class on another model, or one that estimates
        otherwise, keeps scales that do not measure this run's tokens."""
        log = [*chat(8), Message.user("go")]
        log[-2] = attrs.evolve(log[-2], metadata={SCALE_KEY: 4.0, SCALE_FOR_KEY: learned_for})
        assert self.preview(Small(), log, 100).compaction_due  # for whatever model
        model = ScriptedModel([text_response("ok")])
        assert scale_for(model, CharacterEstimator()) == "scripted:scripted by CharacterEstimator"
        assert not self.preview(Small(), log, 100, model).compaction_due
        await Small(model=model).run(log[-1], history=log[:-1])
        assert [request.purpose for request in model.requests] == ["chat"]

    async def test_a_bounded_view_is_sized_by_the_calibration_an_earlier_run_kept(
        self,
    ) -> None:
        """A bounded view the kept scale puts over the window less the reserves is
        tightened, in the preview as in the run's first call."""

        @manage_context(
            context_window_tokens=2_000,
            budget=PromptBudget(
                prompt_budget_tokens=1_500, response_reserve_tokens=100, safety_reserve_tokens=50
            ),
            summarize=False,
        )
        class Bounded(Agent):
            instructions = "Answer."

        log = [*chat(60), Message.user("go")]
        plain = self.preview(Bounded(), log, 2_000)
        log[-2] = attrs.evolve(log[-2], metadata=kept(4.0, Bounded))  # the last run's answer
        preview = self.preview(Bounded(), log, 2_000)
        assert plain.estimated_tokens * 4 > 2_000  # at that scale, the plain view is over
        assert len(preview.request.messages) < len(plain.request.messages)
        assert preview.estimated_tokens - 100 <= 2_000 - 100 - 50  # its max_tokens: 100
        model = ScriptedModel([text_response("ok")])
        await Bounded(model=model).run(log[-1], history=log[:-1])
        assert model.requests[0] == preview.request


def test_two_manage_context_on_one_class_fail_and_a_subclass_may_declare_its_own() -> None:
    """Stacked, one would silently undo the other's options; on a subclass, its own
    declaration wins for it."""
    with pytest.raises(ConfigurationError, match="Twice is decorated with @manage_context twice"):

        @manage_context(compression_threshold=0.5)
        @manage_context(preserve_recent_messages=20)
        class Twice(Agent):
            pass

    @manage_context(compression_threshold=0.5)
    class Parent(Agent):
        pass

    @manage_context(compression_threshold=0.9)
    class Child(Parent):
        pass

    assert Child.context_management.compression_threshold == 0.9
    assert Parent.context_management.compression_threshold == 0.5
    with pytest.raises(ConfigurationError, match="twice"):
        manage_context(Child)


@pytest.mark.parametrize(
    ("keyword", "value"), [("strategy", Truncation), ("tokenizer", ByteEstimator)]
)
def test_a_class_where_an_instance_belongs_fails_naming_the_class(
    keyword: str, value: type
) -> None:
    """A strategy or tokenizer class has the protocol's method, but is not one."""
    name = value.__name__
    with pytest.raises(
        ConfigurationError,
        match=rf"manage_context: {keyword} must be .*, not the class {name} "
        rf"\(did you mean {name}\(\.\.\.\)\?\)",
    ):
        manage_context(**{keyword: value})
    assert manage_context(**{keyword: value()})


@pytest.mark.parametrize("value", [ContextManagement(compression_threshold=0.5), None])
def test_declaring_context_management_in_a_class_body_fails(value: object) -> None:
    """Only @manage_context turns context management on or changes it."""
    with pytest.raises(
        ConfigurationError, match=r"Bad\.context_management is not declared: .*@manage_context"
    ):
        type("Bad", (Agent,), {"context_management": value})


def test_a_subclass_inherits_what_manage_context_set() -> None:
    @manage_context(compression_threshold=0.5)
    class Managed(Agent):
        pass

    class Child(Managed):
        pass

    assert Child.context_management == ContextManagement(compression_threshold=0.5)
    assert [capability.name for capability in Child.capabilities] == ["manage_context"]


def test_an_unknown_manage_context_keyword_names_it_and_what_it_takes() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"manage_context got an unexpected keyword argument 'compresion_threshold'; "
        r"it takes budget, compression_threshold, ",
    ):
        manage_context(compresion_threshold=0.7)  # type: ignore[call-arg]


def test_context_options_name_every_manage_context_keyword() -> None:
    """``ContextOptions``, ``manage_context``'s keywords for a type checker, names exactly
    the fields of ``ContextManagement``, each with the type of its declaration."""
    fields = attrs.fields_dict(ContextManagement)
    assert sorted(ContextOptions.__optional_keys__) == sorted(fields)
    for name, field in fields.items():  # spelled alike (a TypedDict's are ForwardRefs)
        option = ContextOptions.__annotations__[name]
        assert getattr(option, "__forward_arg__", option) == field.type


REFERENCE = "Reference material: account 7731-2209, credit limit 5000 EUR."


def _inject(request: ModelRequest) -> ModelRequest:
    """A retrieval hook's work: its reference material, a user message of a fresh id, at
    the top of the conversation (it is never in the log)."""
    return attrs.evolve(request, messages=(Message.user(REFERENCE), *request.messages))


def _copies(request: ModelRequest) -> int:
    return sum(REFERENCE in message.text for message in request.messages)


class TestInjectedMaterial:
    """What a hook adds to a request is not the conversation: compaction keeps it as it is
    and never summarizes or covers it, and a retry does not add it twice."""

    @pytest.mark.parametrize("summary_fails", [False, True])
    @pytest.mark.parametrize("hook", ["reminder", "redaction"])
    async def test_what_a_hook_does_to_the_request_leaves_the_turn_to_the_overflow(
        self, summary_fails: bool, hook: str
    ) -> None:
        """A hook appends a reminder after the current turn's tool calls, or replaces the
        question with a redacted copy: an overflow's compaction still never takes the
        current turn (its calls were summarized, or left out without a model, because the
        turn was taken to start at the reminder, or nowhere)."""

        def changed(messages: list[Message]) -> list[Message]:
            if hook == "reminder":
                return [*messages, Message.developer("Be precise.")]
            asked = max(i for i, m in enumerate(messages) if m.role is Role.USER)
            messages[asked] = Message.user(messages[asked].text.replace("five", "[n]"))
            return messages

        class Hooked(Agent):
            @before_model
            def change(self, request: ModelRequest) -> ModelRequest:
                return attrs.evolve(request, messages=changed(list(request.messages)))

        @manage_context(
            context_window_tokens=4_000, compression_threshold=0.99, preserve_recent_messages=2
        )
        class Looping(Hooked):
            max_retries = 0

            @tool
            def fetch(self, n: int) -> str:
                """Fetch one thing."""
                return f"result {n} " + "data " * 300

        def answer(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                if summary_fails:
                    raise RuntimeError("summarizer down")
                return text_response("They talked.")
            calls = sum(r.purpose == "chat" for r in model.requests)
            if calls <= 5:
                return tool_call_response("fetch", {"n": calls}, call_id=f"c{calls}")
            if calls == 6:
                raise ContextWindowOverflowError("long", prompt_tokens=4_100, context_window=4_000)
            return text_response("done")

        model = ScriptedModel([answer] * 12, context_window=4_000)
        history = [Message.user("hi"), Message.assistant("hello")]
        result = await Looping(model=model).run("fetch five things", history=history)
        turn = {m.id for m in result.messages[2:]}
        covered = {
            i for m in result.messages if m.is_summary for i in m.metadata[SUMMARY_COVERS_KEY]
        }
        retried = model.requests[-1].messages
        assert result.output == "done" and not covered & turn
        assert "c1" in [call.id for m in retried for call in m.tool_calls] or any(
            "fetch: result 1" in m.text for m in retried
        )
        asked = [m.text for m in retried if m.role is Role.USER and "things" in m.text]
        assert asked == ["fetch five things" if hook == "reminder" else "fetch [n] things"]

    @pytest.mark.parametrize("where", ["parent", "own"])
    async def test_a_summary_call_sees_what_the_hooks_before_it_scrubbed(self, where: str) -> None:
        """A threshold compaction summarizes the request as the parent classes' hooks made
        it: a scrubber there keeps a card number from the summary call (and the summary);
        one in the decorated class runs after the compaction, as the README says."""

        def scrub(self: Agent, request: ModelRequest) -> ModelRequest:
            def clean(message: Message) -> Message:
                if "4111" not in message.text:
                    return message
                return attrs.evolve(
                    message, content=[TextPart(message.text.replace("4111", "####"))]
                )

            return attrs.evolve(request, messages=tuple(map(clean, request.messages)))

        class Scrubbing(Agent):
            if where == "parent":
                masked = before_model(scrub)

        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Summarized(Scrubbing):
            if where == "own":
                masked = before_model(scrub)

        history = chat(30)
        history[2] = Message.user("card 4111 was charged twice")
        model = ScriptedModel([summary_step(), text_response("done")])
        await Summarized(model=model).run("go", history=history)
        summary_request, chat_request = model.requests
        assert summary_request.purpose == "context_compaction"
        assert ("4111" in summary_request.messages[-1].text) is (where == "own")
        assert not any("4111" in m.text for m in chat_request.messages if not m.is_summary)

    async def test_proactive_compaction_keeps_material_injected_before_it(self) -> None:
        class Retrieving(Agent):
            @before_model
            def retrieve(self, request: ModelRequest) -> ModelRequest:
                return _inject(request)

        @manage_context(
            context_window_tokens=100,
            compression_threshold=0.5,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Injected(Retrieving):
            pass

        model = ScriptedModel([summary_step(), text_response("done")])
        result = await Injected(model=model).run("go", history=chat(30))
        summary_request, chat_request = model.requests
        assert summary_request.purpose == "context_compaction"
        assert _copies(summary_request) == 0
        assert _copies(chat_request) == 1
        assert any(m.is_summary for m in chat_request.messages)
        assert not any(REFERENCE in m.text for m in result.messages)
        logged = {m.id for m in result.messages}
        (summary,) = [m for m in result.messages if m.is_summary]
        assert set(summary.metadata[SUMMARY_COVERS_KEY]) <= logged

    @pytest.mark.parametrize("fix", ["overflow", "settings"])
    async def test_a_retry_carries_injected_material_once(self, fix: str) -> None:
        """The replacement from an ``after_model_error`` hook (overflow recovery, or a hook
        that drops a setting the provider refused) passes through the ``before_model``
        hooks again without what they added to the request it replaces."""

        @manage_context(
            context_window_tokens=1_000,
            compression_threshold=1.0,
            preserve_recent_messages=4,
            tokenizer=PerMessage(),
        )
        class Retrieving(Agent):
            max_retries = 0
            settings = {"temperature": 0.5}

            @before_model
            def retrieve(self, request: ModelRequest) -> ModelRequest:
                return _inject(request)

            @after_model_error
            def drop_temperature(
                self, request: ModelRequest, error: Exception
            ) -> ModelRequest | None:
                if not isinstance(error, InvalidRequestError):
                    return None
                settings = {k: v for k, v in request.settings.items() if k != "temperature"}
                return attrs.evolve(request, settings=settings)

        if fix == "overflow":
            steps: list[Any] = [ContextWindowOverflowError("too long"), summary_step()]
        else:
            steps = [InvalidRequestError("temperature is not supported")]
        model = ScriptedModel([*steps, text_response("done")])
        result = await Retrieving(model=model).run("go", history=chat(10))
        chats = [r for r in model.requests if r.purpose == "chat"]
        assert [_copies(r) for r in chats] == [1, 1]
        assert all(_copies(r) == 0 for r in model.requests if r.purpose != "chat")
        assert not any(REFERENCE in m.text for m in result.messages)
        assert result.output == "done"

    @pytest.mark.parametrize("loop", ["tools", "tools bounded", "chat"])
    async def test_what_the_class_s_own_hooks_add_is_sized_before_the_call(
        self, loop: str, spans: Spans
    ) -> None:
        """The decorated class's own ``before_model`` hooks run after ``@manage_context``'s
        (they see what it did), so it sizes each request with what they added to the
        previous call, the previous run's too (``HOOKED_KEY``). A hook that adds a long
        note to every call of a tool loop, or of a chat of one call a run, that grows
        toward the window: the request is compacted (or its view bounded) before the
        provider would refuse it. Sized without the note, the seventh call overflowed
        (with a budget, the fifth and two more)."""

        options: dict[str, Any] = {"compression_threshold": 0.9}
        if loop == "tools bounded":
            budget = PromptBudget(response_reserve_tokens=64, safety_reserve_tokens=0)
            options = {"summarize": False, "budget": budget, "tokenizer": budget.tokenizer}

        @manage_context(context_window_tokens=2_000, preserve_recent_messages=2, **options)
        class Noted(Agent):
            max_retries = 0

            @before_model
            def note(self, request: ModelRequest) -> ModelRequest:
                note = Message.developer("Answer from the fetched data alone. " * 50)
                return attrs.evolve(request, messages=(*request.messages, note))

            @tool
            def fetch(self, n: int) -> str:
                """Fetch one thing."""
                return f"result {n} " + "data " * 200

        tokenizer = Noted.context_management.tokenizer

        def answer(request: ModelRequest) -> ModelResponse:
            if request.purpose == "context_compaction":
                return text_response("- fetched things")
            real = estimate_request(request.messages, request.tools, request.settings, tokenizer)
            if real > 2_000:
                raise ContextWindowOverflowError("too long", prompt_tokens=real)
            sizes.append(real)
            if len(sizes) < 8 and loop != "chat":
                return tool_call_response("fetch", {"n": len(sizes)}, input_tokens=real)
            return text_response("data " * 200, input_tokens=real)

        sizes: list[int] = []
        agent = Noted(model=ScriptedModel([answer] * 20))
        if loop == "chat":
            history: list[Message] = []
            for n in range(8):
                history = (await agent.run(f"Fetch thing {n}.", history=history)).messages
        else:
            assert (await agent.run("Fetch eight things.")).messages[-1].text.startswith("data")
        assert len(sizes) == 8
        reasons = {c["littleghost.compaction.reason"] for c in spans.compactions()}
        assert "overflow" not in reasons and (loop == "tools bounded" or reasons == {"threshold"})

    async def test_what_a_hook_adds_to_a_run_s_first_call_alone_sizes_no_other(self) -> None:
        """A hook that adds retrieved material to a run's first call only: what it added
        there is not taken for what it adds to the second (the least of the last two
        calls' additions is), which was sized with it and compacted at about two thirds
        of the threshold; every request still fits the window."""

        @manage_context(context_window_tokens=3_000, compression_threshold=0.8)
        class Retrieving(Agent):
            max_retries = 0

            @before_model
            def retrieve(self, request: ModelRequest) -> ModelRequest:
                if request.messages[-1].role is not Role.USER:
                    return request  # the question was asked: the material was given
                note = Message.developer("Retrieved: " + "fact " * 900)
                return attrs.evolve(request, messages=(*request.messages, note))

            @tool
            def fetch(self, n: int) -> str:
                """Fetch one thing."""
                return f"result {n}"

        tokenizer = Retrieving.context_management.tokenizer
        sizes: list[int] = []

        def answer(request: ModelRequest) -> ModelResponse:
            real = estimate_request(request.messages, request.tools, request.settings, tokenizer)
            sizes.append(real)
            if len(sizes) < 4:
                return tool_call_response("fetch", {"n": len(sizes)}, input_tokens=real)
            return text_response("done", input_tokens=real)

        model = ScriptedModel([answer] * 8)
        await Retrieving(model=model).run("Fetch three things.", history=chat(140))
        assert [request.purpose for request in model.requests] == ["chat"] * 4
        assert max(sizes) <= 3_000 and sizes[0] > 2_400 > sizes[1]

    async def test_a_question_a_hook_sends_anew_fails_alone_as_any_does(self) -> None:
        """A hook that sends the question as a new message (the reference material and the
        question in one; the log holds the question alone): over the window alone, it fails
        as any question does, with the provider's error caused by a CompactionError saying
        so, and every count recovery asks for is of a request that ends with it."""

        @manage_context(context_window_tokens=1_000, compression_threshold=1.0)
        class Rewriting(Agent):
            max_retries = 0
            instructions = "Be brief."

            @before_model
            def rewrite(self, request: ModelRequest) -> ModelRequest:
                *earlier, question = request.messages
                asked = Message.user(f"{REFERENCE}\n\n{question.text}")
                return attrs.evolve(request, messages=(*earlier, asked))

        counting, counted = Densities(), list[ModelRequest]()

        def count(request: ModelRequest) -> int:
            counted.append(request)
            return counting.count(request)

        model = ScriptedModel([counting] * 4, count_prompt_tokens=count)
        with pytest.raises(ContextWindowOverflowError) as caught:
            await Rewriting(model=model).run(f"{DIGITS} {DIGITS}")
        assert isinstance(caught.value.__cause__, CompactionError)
        assert "current request alone (about " in str(caught.value.__cause__)
        assert len(counting.sizes) == 1  # the overflowing call only
        question = f"{REFERENCE}\n\n{DIGITS} {DIGITS}"  # each count is of it (before it gives up)
        assert counted and all(r.messages[-1].text == question for r in counted)


class _CappedModel(ScriptedModel):
    default_max_tokens = 4_096


class _HookCapped(Agent):
    """Its ``before_model`` hook runs before that of ``@manage_context`` on a subclass."""

    settings = {"max_tokens": 500}

    @before_model
    async def longer_answers(self, request: ModelRequest) -> ModelRequest:
        return attrs.evolve(request, settings={**request.settings, "max_tokens": 3_000})


@pytest.mark.parametrize(
    ("model", "settings", "base", "named"),
    [
        (_CappedModel, {}, Agent, "the model's default output cap"),
        (ScriptedModel, {"max_tokens": 3_000}, Agent, "the request's output cap"),
        (ScriptedModel, {"max_tokens": 500}, _HookCapped, "the output cap a before_model hook "),
    ],
    ids=["default cap", "settings", "hook"],
)
async def test_an_answer_cap_not_under_the_window_fails_naming_both(
    model: type[ScriptedModel], settings: dict[str, int], base: type[Agent], named: str
) -> None:
    """A request whose ``max_tokens`` alone fills the window (a model's default cap, the
    settings', or a ``before_model`` hook's that runs first) leaves no room for any
    prompt: the run fails with a ``ConfigurationError`` naming both and where the cap
    came from, before any call."""
    given = settings

    @manage_context(context_window_override=3_000)
    class Capped(base):  # type: ignore[valid-type,misc]
        settings = given

    scripted = model([text_response("ok")])
    history = [Message.user("hello"), Message.assistant("hi")]
    with pytest.raises(ConfigurationError, match=r"\(max_tokens \d+\) is not under the 3000") as e:
        await Capped(model=scripted).run("hi", history=history)
    assert named in str(e.value)
    fix = "have the hook set a smaller one (the run's settings give 500)"
    assert str(e.value).endswith(fix if base is _HookCapped else "in the agent's settings")
    assert scripted.requests == []
