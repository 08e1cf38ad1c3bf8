"""Compaction records in the log: collapses, exclusions and summaries read by one view
builder; the records give the same view as ``apply_compaction``; the input and the
stored originals are never changed; reuse of the previous turn's work."""

from __future__ import annotations

import math
import random
from typing import Any

import attrs
import pytest

from littleghost import Agent, Message, Role, ToolCall
from littleghost.context import (
    CompactionState,
    CompactionStrategy,
    Pipeline,
    SelectiveToolCallCompaction,
    SlidingWindow,
    Summarization,
    TokenBudget,
    ToolResultCompaction,
    Truncation,
    TurnExcerpts,
    apply_compaction,
    build_view,
    compact_session,
    compaction_records,
    messages_exceed,
    tokens_exceed,
)
from littleghost.context.records import COMPACTION_COVERS_KEY, COMPACTION_KIND_KEY
from littleghost.context.view import interrupted_results, misplaced_results, unanswered_calls
from littleghost.errors import (
    CompactionError,
    ConfigurationError,
    InvalidRequestError,
    OutputLimitError,
    ProtocolError,
    UnknownSessionError,
)
from littleghost.messages import SUMMARY_COVERS_KEY, SUMMARY_KEY
from littleghost.models import ModelResponse, StopReason
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

pytestmark = pytest.mark.anyio


def turn(number: int, calls: int = 1) -> list[Message]:
    ids = [f"t{number}c{k}" for k in range(calls)]
    return [
        Message.user(f"question {number}"),
        Message.assistant(tool_calls=[ToolCall(i, "get_weather", {"city": i}) for i in ids]),
        *(Message.tool(i, f"sunny {number}") for i in ids),
        Message.assistant(f"answer {number}"),
    ]


def conversation(turns: int, calls: int = 1) -> list[Message]:
    log = [Message.system("sys")]
    for number in range(turns):
        log += turn(number, calls)
    return log


def collapse(text: str, covers: list[Message]) -> Message:
    return Message.assistant(
        text,
        metadata={COMPACTION_KIND_KEY: "collapse", COMPACTION_COVERS_KEY: [m.id for m in covers]},
    )


def exclusion(covers: list[Message]) -> Message:
    return Message.assistant(
        "excluded",
        metadata={COMPACTION_KIND_KEY: "exclusion", COMPACTION_COVERS_KEY: [m.id for m in covers]},
    )


def summary(text: str, covers: list[Message]) -> Message:
    return Message.user(
        text, metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: [m.id for m in covers]}
    )


# --- the view builder -----------------------------------------------------------------


def test_a_collapse_shows_where_its_first_covered_message_was() -> None:
    log = conversation(2)
    record = collapse("[Tool results: get_weather: sunny 0]", log[2:4])
    assert build_view([*log, record]) == (log[0], log[1], record, *log[4:])


def test_an_exclusion_hides_and_is_never_shown() -> None:
    log = conversation(2)
    assert build_view([*log, exclusion(log[1:5])]) == (log[0], *log[5:])


def test_a_record_whose_covers_is_not_a_list_hides_nothing() -> None:
    """Only a list (or tuple) of ids is read: a mapping's keys are not ids it covers."""
    log = conversation(2)
    for covers in (None, 7, {log[1].id: True}):
        metadata = {COMPACTION_KIND_KEY: "exclusion", COMPACTION_COVERS_KEY: covers}
        assert build_view([*log, Message.assistant("excluded", metadata=metadata)]) == tuple(log)
        metadata = {SUMMARY_KEY: True, SUMMARY_COVERS_KEY: covers}
        record = Message.user("earlier", metadata=metadata)
        assert build_view([*log, record]) == (log[0], record, *log[1:])


def test_a_summary_shows_before_the_first_visible_non_trusted_message() -> None:
    log = conversation(2)
    developer = Message.developer("metric units")
    log.insert(5, developer)
    record = summary("earlier", log[1:5])
    assert build_view([*log, record]) == (log[0], developer, record, *log[6:])


def test_every_summary_no_later_record_covers_is_shown_in_log_order() -> None:
    """A summary that a later one does not fold in stays in the view, before the later
    one: what it stands for is never lost."""
    log = conversation(3)
    first = summary("first", log[1:5])
    second = summary("second", log[5:9])
    assert build_view([*log, first, second]) == (log[0], first, second, *log[9:])
    assert build_view([*log, first, second, summary("both", [first, second])])[1].text == "both"


def test_a_record_covered_by_a_later_record_is_hidden_and_what_it_hid_stays_hidden() -> None:
    log = conversation(3)
    folded = collapse("[Tool results: get_weather: sunny 0]", log[2:4])
    log.append(folded)
    old = summary("first", log[1:2])
    log.append(old)
    newer = summary("second", [old, log[4], folded])  # folds the summary and the collapse
    view = build_view([*log, newer, exclusion(log[5:9])])
    assert view == (log[0], newer, *log[9:13])


def test_a_collapse_of_a_collapse_shows_where_the_first_hidden_message_was() -> None:
    log = conversation(3)
    first = collapse("[c0]", log[2:4])
    second = collapse("[c1]", log[6:8])
    both = collapse("[c0 and c1]", [first, second])
    assert build_view([*log, first, second, both]) == (*log[:2], both, log[4], log[5], *log[8:])


def test_records_that_cover_each_other_are_not_shown() -> None:
    """A foreign log whose collapses cover each other: the view ends, and shows neither."""
    log = conversation(1)
    metadata = {COMPACTION_KIND_KEY: "collapse"}
    first = Message.assistant("a", id="a", metadata={**metadata, COMPACTION_COVERS_KEY: ["b"]})
    second = Message.assistant(
        "b", id="b", metadata={**metadata, COMPACTION_COVERS_KEY: [log[1].id, "a"]}
    )
    assert build_view([*log, first, second]) == (log[0], *log[2:])


def test_a_record_that_hides_part_of_an_exchange_hides_all_of_it() -> None:
    """A foreign record covering a result but not its call: the call is never sent
    without its results (the view has no unanswered call)."""
    ask = Message.assistant(tool_calls=[ToolCall("a", "f", {}), ToolCall("b", "g", {})])
    results = [Message.tool("a", "A"), Message.tool("b", "B")]
    log = [Message.user("go"), ask, *results, Message.assistant("done")]
    dropped = exclusion(results[:1])
    assert build_view([*log, dropped]) == (log[0], log[-1])
    folded = collapse("[Tool results: g: B]", results[1:])
    assert build_view([*log, folded]) == (log[0], folded, log[-1])
    noted = summary("the results", results)
    assert build_view([*log, noted]) == (noted, log[0], log[-1])


def test_records_are_read_in_one_view_with_results_after_their_calls() -> None:
    ask = Message.assistant(tool_calls=[ToolCall("a", "f", {}), ToolCall("b", "g", {})])
    late = [Message.user("wait"), Message.tool("b", "B"), Message.tool("a", "A")]
    log = [Message.user("go"), ask, *late, Message.assistant("done")]
    assert build_view(log) == (log[0], ask, late[1], late[2], late[0], log[-1])
    record = collapse("[Tool results: g: B; f: A]", [ask, *late[1:]])
    assert build_view([*log, record]) == (log[0], record, late[0], log[-1])


def test_a_view_of_a_view_is_the_same_view() -> None:
    log = conversation(3)
    log += [collapse("[c]", log[2:4]), summary("s", log[5:6]), exclusion(log[9:13])]
    view = build_view(log)
    assert build_view(view) == view


def test_pairing_rules_for_duplicated_ids() -> None:
    first = Message.assistant(tool_calls=[ToolCall("x", "f", {})])
    second = Message.assistant(tool_calls=[ToolCall("x", "f", {})])
    log = [first, second, Message.tool("x", "2"), Message.tool("x", "1"), Message.tool("x", "3")]
    assert build_view(log) == (first, log[3], second, log[2])
    assert misplaced_results(log) == [(4, "x")]
    assert unanswered_calls(log[:3]) == [(0, "x")]


def test_unanswered_calls_are_in_log_order_when_ids_are_reused() -> None:
    """A reused id waits behind the newer call with it; the calls left open are still
    listed in the log's order (as the run repairs them), within a message in call order."""
    first = Message.assistant(tool_calls=[ToolCall("x", "f", {})])
    both = Message.assistant(tool_calls=[ToolCall("y", "f", {}), ToolCall("x", "f", {})])
    log = [first, both]
    assert unanswered_calls(log) == [(0, "x"), (1, "y"), (1, "x")]
    assert [r.tool_results[0].call_id for r in interrupted_results(log)] == ["x", "y", "x"]


# --- records and apply_compaction --------------------------------------------------------


def random_log(rng: random.Random) -> list[Message]:
    log = [Message.system("s")]
    for number in range(rng.randint(4, 16)):
        log += turn(number, rng.randint(0, 3))
        if rng.random() < 0.15:
            log.append(Message.developer(f"note {number}"))
    return log


def strategies(model: ScriptedModel) -> list[CompactionStrategy]:
    return [
        Truncation(minimum_preserved=5),
        SlidingWindow(keep_last_turns=2),
        ToolResultCompaction(keep_last_tool_call_groups=1),
        SelectiveToolCallCompaction(),
        Summarization(model=model, minimum_preserved=3),
        Pipeline(
            ToolResultCompaction(), Summarization(model=model), Truncation(minimum_preserved=2)
        ),
        Pipeline(Summarization(model=model), ToolResultCompaction(keep_last_tool_call_groups=0)),
        TokenBudget(
            token_budget=100, strategies=[ToolResultCompaction(), SlidingWindow(keep_last_groups=8)]
        ),
    ]


@pytest.mark.parametrize("seed", range(10))
async def test_records_in_the_log_give_the_view_apply_compaction_returns(seed: int) -> None:
    rng = random.Random(seed)
    log = random_log(rng)
    model = ScriptedModel([text_response("summary")] * 200)
    for strategy in strategies(model):
        records = await compaction_records(log, strategy, tokenizer=None, complete=None)
        assert records, strategy
        compacted = build_view([*log, *records])
        again = await apply_compaction([*log, *records], Truncation(minimum_preserved=10**6))
        assert again == compacted  # nothing more to do: the view is stable
        ad_hoc = await apply_compaction(log, strategy)
        assert [(m.role, m.text) for m in ad_hoc] == [(m.role, m.text) for m in compacted]
        # A second compaction on top of the first reads its records too.
        more = await compaction_records([*log, *records], strategy, tokenizer=None)
        twice = await apply_compaction(compacted, strategy)
        assert [m.text for m in build_view([*log, *records, *more])] == [m.text for m in twice]


@attrs.frozen
class RandomSteps:
    """A custom strategy: random excludes, collapses, merges and summaries of random
    slots, the same ones on every call with the same seed."""

    seed: int

    async def compact(self, state: CompactionState, /) -> None:
        rng = random.Random(self.seed)
        for step in range(rng.randint(1, 4)):
            slots = state.candidates(state.slots)
            if not slots:
                return
            picked = sorted(rng.sample(slots, rng.randint(1, min(3, len(slots)))))
            action = rng.choice(("exclude", "collapse", "merge", "summarize"))
            if action == "exclude":
                state.exclude(picked[0])
            elif action == "collapse":
                state.collapse(picked[0], f"collapsed {self.seed}.{step}")
            elif action == "merge":
                state.merge(picked, f"merged {self.seed}.{step}")
            else:
                state.summarize(picked, f"summarized {self.seed}.{step}")


def chained_strategy(rng: random.Random, model: ScriptedModel) -> CompactionStrategy:
    return rng.choice(
        [
            *strategies(model),
            TurnExcerpts(trigger=tokens_exceed(rng.randint(20, 200))),
            TurnExcerpts(minimum_preserved=rng.randint(0, 3)),
            RandomSteps(rng.randrange(10**6)),
            RandomSteps(rng.randrange(10**6)),
        ]
    )


def shown(view: tuple[Message, ...] | list[Message]) -> list[tuple[Role, str, str]]:
    """A view compared across compactions: a record by its text (each makes new ids)."""
    return [(m.role, m.text, m.text if m.metadata else m.id) for m in view]


@pytest.mark.parametrize("seed", range(60))
async def test_chained_compactions_give_the_view_their_records_give(seed: int) -> None:
    """Compacting a log that holds earlier records (summaries, collapses of collapses,
    excerpts of summaries), with system messages mid-log: the view a strategy returns is
    the view its records give in the log, and every earlier compaction's too."""
    rng = random.Random(seed)
    log = random_log(rng)
    model = ScriptedModel([text_response("summary")] * 400)
    for _ in range(rng.randint(2, 5)):
        strategy = chained_strategy(rng, model)
        returned = await apply_compaction(log, strategy)
        records = await compaction_records(log, strategy, tokenizer=None, complete=None)
        log += records
        assert shown(returned) == shown(build_view(log)), (seed, strategy)
        for number in range(rng.randint(0, 2)):
            log += turn(100 + number, rng.randint(0, 2))
            if rng.random() < 0.3:
                log.append(Message.system(f"mid {number}"))


async def test_record_kinds_and_what_they_cover() -> None:
    log = conversation(6)
    records = await compaction_records(
        log, Pipeline(ToolResultCompaction(), Truncation(minimum_preserved=12)), tokenizer=None
    )
    kinds = [r.metadata[COMPACTION_KIND_KEY] for r in records]
    assert kinds == ["collapse", "collapse", "exclusion"]
    collapses, dropped = records[:2], records[2]
    assert collapses[0].metadata[COMPACTION_COVERS_KEY] == [log[10].id, log[11].id]  # turn 2
    assert collapses[1].metadata[COMPACTION_COVERS_KEY] == [log[14].id, log[15].id]  # turn 3
    # Turns 0 and 1 were collapsed, then excluded: by their originals' ids, no collapse.
    assert dropped.metadata[COMPACTION_COVERS_KEY] == [m.id for m in log[1:9]]


async def test_nothing_to_do_gives_no_records() -> None:
    log = conversation(2)
    assert await compaction_records(log, Truncation(), tokenizer=None) == ()
    assert await apply_compaction(log, Truncation()) == tuple(log)


def public(attribute: attrs.Attribute[object], value: object) -> bool:
    return not attribute.name.startswith("_")  # estimates are cached on messages


async def test_apply_compaction_leaves_its_input_untouched() -> None:
    log = conversation(8, calls=2)
    snapshot = [attrs.asdict(m, filter=public) for m in log]
    originals = list(log)
    model = ScriptedModel([text_response("s")])
    view = await apply_compaction(
        log,
        Pipeline(
            ToolResultCompaction(), Summarization(model=model), Truncation(minimum_preserved=3)
        ),
    )
    assert len(view) < len(log)
    assert log == originals and all(a is b for a, b in zip(log, originals, strict=True))
    assert [attrs.asdict(m, filter=public) for m in log] == snapshot


async def test_a_strategy_must_be_a_strategy() -> None:
    from littleghost.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="compaction strategy"):
        await apply_compaction(conversation(1), "truncate")  # type: ignore[arg-type]


# --- the next turn reuses the work on the previous log -------------------------------


async def fresh(log: list[Message]) -> list[tuple[str, str]]:
    """The compaction of an equal log made of new message objects."""
    copies = [attrs.evolve(m) for m in log]
    view = await apply_compaction(
        copies, TokenBudget(token_budget=200, strategies=[ToolResultCompaction()])
    )
    return [(m.role, m.text) for m in view]


async def test_the_next_turn_gives_the_same_view_as_a_fresh_start() -> None:
    strategy = TokenBudget(token_budget=200, strategies=[ToolResultCompaction()])
    log = conversation(6, calls=2)
    await apply_compaction(log, strategy)
    first_view = [(m.role, m.text) for m in await apply_compaction(log, strategy)]
    assert first_view == [(m.role, m.text) for m in await apply_compaction(log, strategy)]
    assert first_view == await fresh(log)
    # The next turn: plain messages, one of them a late result for an earlier call.
    pending = Message.assistant(tool_calls=[ToolCall("late", "slow", {})])
    log += [Message.user("more"), pending, Message.user("still there?")]
    first = await apply_compaction(log, strategy)
    assert [(m.role, m.text) for m in first] == await fresh(log)
    log += [Message.tool("late", "finally"), Message.assistant("done")]
    second = await apply_compaction(log, strategy)
    assert [(m.role, m.text) for m in second] == await fresh(log)
    assert second[-4:-2] == (pending, log[-2])  # the late result follows its call
    # Records appended since: the view is built afresh and reads them.
    records = await compaction_records(log, Truncation(minimum_preserved=2), tokenizer=None)
    log += [*records, *turn(7)]
    third = await apply_compaction(log, strategy)
    assert [(m.role, m.text) for m in third] == await fresh(log)


# --- stored sessions ---------------------------------------------------------------------


async def test_compact_session_appends_records_and_keeps_the_originals() -> None:
    store = InMemorySessionStore()
    log = conversation(5)
    await store.append("s1", log)
    records = await compact_session(store, "s1", Truncation(minimum_preserved=2))
    stored = await store.load("s1")
    assert stored[: len(log)] == tuple(log) and stored[len(log) :] == records
    assert build_view(stored) == (log[0], *log[-3:])
    assert await compact_session(store, "s1", Truncation(minimum_preserved=2)) == ()


async def test_compact_session_of_a_session_the_store_does_not_have_says_so() -> None:
    """A misspelt id returned no records, as a session with nothing to compact does; the
    store is left as it was, and the session free for a run."""
    store = InMemorySessionStore()
    await store.append("customer-42", conversation(5))
    with pytest.raises(UnknownSessionError, match="no session 'customer-24'") as caught:
        await compact_session(store, "customer-24", Truncation(minimum_preserved=2))
    assert caught.value.session_id == "customer-24"
    assert await store.list_sessions() == ("customer-42",)
    async with store.lock("customer-24"):
        pass


async def test_compact_session_summarizes_with_the_strategys_model() -> None:
    store = InMemorySessionStore()
    await store.append("s2", conversation(5))
    model = ScriptedModel([text_response("the user asked about five cities")])
    (record,) = await compact_session(store, "s2", Summarization(model=model))
    view = build_view(await store.load("s2"))
    assert view[1] == record and record.is_summary and len(view) == 2 + 5


async def test_a_record_covering_an_unfinished_call_stands_for_its_later_result() -> None:
    """A session left with an open call and compacted between runs: the next run answers
    the call in the log, and that result stays out of the view with its call."""
    store = InMemorySessionStore()
    log = conversation(3)
    log.insert(2, Message.assistant(tool_calls=[ToolCall("open", "get_weather", {})]))
    await store.append("s3", log)
    records = await compact_session(store, "s3", ToolResultCompaction(keep_last_tool_call_groups=0))
    (record,) = [r for r in records if "get_weather: no result" in r.text]

    class Resumed(Agent):
        session_store = store

    model = ScriptedModel([text_response("ok")])
    result = await Resumed(model=model).run("next", session_id="s3")
    (repair,) = [
        m for m in result.messages if m.role is Role.TOOL and m.tool_results[0].call_id == "open"
    ]
    sent = model.requests[0].messages
    assert repair.tool_results[0].is_error and repair not in sent and record in sent
    assert not misplaced_results(sent) and not unanswered_calls(sent)
    assert sent == build_view(result.messages[:-1])


async def test_compact_session_appends_nothing_that_would_grow_the_view() -> None:
    """A summary longer than the short turns it covers is refused: once appended, a
    record could never be taken back."""
    store = InMemorySessionStore()
    chat = [m for i in range(7) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
    await store.append("s4", chat)
    wordy = ScriptedModel([text_response("- a long note about nothing " * 20)])
    with pytest.raises(CompactionError, match="would not make the view smaller"):
        await compact_session(store, "s4", Summarization(model=wordy))
    assert await store.load("s4") == tuple(chat)


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (text_response("   "), ProtocolError),
        (text_response("I can't help.", stop_reason=StopReason.CONTENT_FILTER), ProtocolError),
        (tool_call_response("lookup", {"q": "x"}), ProtocolError),
        (text_response("- a note cut", stop_reason=StopReason.MAX_TOKENS), OutputLimitError),
        (InvalidRequestError("refused", status=400), InvalidRequestError),
    ],
)
async def test_compact_session_raises_the_summary_calls_failure_and_appends_nothing(
    answer: ModelResponse | Exception, error: type[Exception]
) -> None:
    """A summary that came back empty, refused, as a tool call or cut at its cap, or a
    call that failed, is the error ``compact_session`` raises, and the stored log is as
    it was."""
    store = InMemorySessionStore()
    log = conversation(5)
    await store.append("s6", log)
    with pytest.raises(error):
        await compact_session(store, "s6", Summarization(model=ScriptedModel([answer] * 9)))
    assert await store.load("s6") == tuple(log)


@pytest.mark.parametrize("stop_reason", list(StopReason))
@pytest.mark.parametrize("calls", [0, 1, 2])
async def test_only_notes_are_taken_for_a_summary(stop_reason: StopReason, calls: int) -> None:
    """Whatever stop reason and tool calls an answer to a summary call comes with, a
    summary is appended only from notes: an answer that stopped as such (or at its cap,
    its complete lines) asking for no tool; a refusal, or a tool call, is a
    ``ProtocolError`` (the summary call offers no tools) and the log stays as it was."""
    store = InMemorySessionStore()
    log = conversation(5)
    await store.append("s7", log)
    notes = "- Ana asked about order A-12.\n- A refund of 20 EUR is open.\n- cut"
    tool_calls = [ToolCall(f"call-{index}", "lookup", {"q": "x"}) for index in range(calls)]
    answer = ModelResponse(Message.assistant(notes, tool_calls=tool_calls), stop_reason)
    strategy = Summarization(model=ScriptedModel([answer] * 2))
    notes_only = stop_reason not in (StopReason.CONTENT_FILTER, StopReason.TOOL_USE)
    if notes_only and not calls:
        (record,) = await compact_session(store, "s7", strategy)
        assert "refund of 20 EUR" in record.text
        assert ("- cut" in record.text) is (stop_reason is not StopReason.MAX_TOKENS)
    else:
        with pytest.raises(ProtocolError, match=r"filtered|tool call"):
            await compact_session(store, "s7", strategy)
        assert await store.load("s7") == tuple(log)


async def test_compact_session_appends_nothing_that_leaves_the_view_as_large() -> None:
    """A record as large as the message it stands for saves nothing: refused too."""

    class PerMessage:
        def count_tokens(self, text: str) -> int:
            return 1

    class Restate:
        async def compact(self, state: CompactionState) -> None:
            state.collapse(state.candidates(state.slots)[0], "q0, restated")

    store = InMemorySessionStore()
    chat = [m for i in range(7) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
    await store.append("s5", chat)
    with pytest.raises(CompactionError, match="would not make the view smaller"):
        await compact_session(store, "s5", Restate(), tokenizer=PerMessage())
    assert await store.load("s5") == tuple(chat)


@pytest.mark.parametrize(
    ("keywords", "match"),
    [
        ({"tokenizer": 3}, r"compact_session: tokenizer must be an object with count_tokens"),
        ({"settings": {"temperature": math.nan}}, r"compact_session: settings\['temperature'\]"),
        ({"settings": {"model": "x"}}, r"compact_session: settings: 'model' is set by"),
    ],
)
async def test_compact_session_checks_its_keywords_before_the_summary_call(
    keywords: dict[str, Any], match: str
) -> None:
    store = InMemorySessionStore()
    await store.append("s5", conversation(5))
    model = ScriptedModel([])
    with pytest.raises(ConfigurationError, match=match):
        await compact_session(store, "s5", Summarization(model=model), **keywords)
    assert model.requests == [] and len(await store.load("s5")) == len(conversation(5))


async def test_compact_session_needs_a_store_instance() -> None:
    with pytest.raises(ConfigurationError, match="compact_session: store must be a session store"):
        await compact_session(None, "s", Truncation())  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match=r"not the class InMemorySessionStore \(did"):
        await compact_session(InMemorySessionStore, "s", Truncation())  # type: ignore[arg-type]


async def test_sizes_stay_exact_when_the_next_turn_reuses_the_index() -> None:
    log = conversation(3)
    log.append(Message.assistant(tool_calls=[ToolCall("late", "slow", {})]))
    await apply_compaction(log, Truncation())
    log += [Message.user("hello?"), Message.tool("late", "done")]
    # 16 messages: over 15, one user group of one message goes; the count must be exact.
    view = await apply_compaction(log, Truncation(trigger=messages_exceed(15), minimum_preserved=0))
    assert view == tuple(log[:1] + log[2:-2] + log[-1:] + log[-2:-1])
