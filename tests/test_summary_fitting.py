"""Fitting a summary request to the room: on random logs, ``Summarization`` covers, sends
and clips exactly what a straightforward search does that renders the whole transcript
afresh for every candidate (the groups taken, newest given back one at a time; for each,
the output caps from the largest down and each cap's item clips from the longest down,
the first request that fits), or fails where that search finds none.

The engine renders the transcript once and joins a prefix of its lines per candidate,
bisects over how many groups to cover and measures each clip's request once: a first
compaction of 100 000 messages rendered it about 50 times (``benchmarks/compaction.py``).
"""

from __future__ import annotations

import math
import random

import pytest

from littleghost import Message, ToolCall
from littleghost.context import (
    ByteEstimator,
    CharacterEstimator,
    CompactionState,
    Summarization,
    Tokenizer,
    group_messages,
)
from littleghost.context.groups import SUMMARY
from littleghost.context.summarize import (
    SUMMARY_PREFIX,
    entry,
    quoted_specifics,
    split_quotes,
    summary_instruction,
    summary_request,
    summary_text,
    transcript_lines,
)
from littleghost.errors import CompactionError
from littleghost.messages import SUMMARY_COVERS_KEY, SUMMARY_KEY, ImagePart, Role, ToolResult
from littleghost.models import ModelRequest
from littleghost.testing import ScriptedModel, text_response
from littleghost.text import cut_middle

pytestmark = pytest.mark.anyio

SEED = 20261205
CASES = 200
WORDS = ["order", "refund", "the", "parcel", "Zürich", "日本", "ID-42", "at", "3.5 kg", "late"]
FLOOR = 64  # SUMMARY_FLOOR_TOKENS
CLIP_LEVELS = (2_000, 500, 200, 80)
TOKENIZERS: list[Tokenizer] = [
    CharacterEstimator(),
    ByteEstimator(),
    CharacterEstimator(chars_per_token=2.5),
]


def words(rng: random.Random, most: int) -> str:
    """Up to ``most`` random words, now and then over several lines."""
    chosen = rng.choices(WORDS, k=rng.randrange(most + 1))
    return " ".join(chosen).replace(" at ", " at\n" if rng.random() < 0.3 else " at ")


def random_log(rng: random.Random) -> list[Message]:
    """A system prompt (mostly), earlier summaries (sometimes), then turns of text, images,
    tool calls (ids reused across turns, now and then) and their results."""
    log = [Message.system("You are terse.")] if rng.random() < 0.8 else []
    for number in range(rng.choice([0, 0, 1, 2])):
        text = SUMMARY_PREFIX + words(rng, rng.choice([5, 400]))
        log.append(
            Message.user(text, metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: [str(number)]})
        )
    for number in range(rng.randrange(1, 11)):
        images = (ImagePart(url="https://example.com/a.png"),) * (rng.random() < 0.1)
        log.append(Message(Role.USER, (*Message.user(words(rng, 300)).content, *images)))
        for _ in range(rng.choice([0, 0, 1, 2])):
            ids = [
                f"c{rng.randrange(3) if rng.random() < 0.3 else f'{number}-{k}'}"
                for k in range(rng.randrange(1, 3))
            ]
            calls = [
                ToolCall(i, rng.choice(["lookup", "get_weather"]), {"q": words(rng, 20)})
                for i in ids
            ]
            log.append(Message.assistant(words(rng, 10), tool_calls=calls))
            results = tuple(ToolResult(i, words(rng, 600), rng.random() < 0.1) for i in ids)
            if rng.random() < 0.7:
                log.extend(Message(Role.TOOL, (result,)) for result in results)
            else:
                log.append(Message(Role.TOOL, results))
        log.append(Message.assistant(words(rng, 200)))
        if rng.random() < 0.05:  # a result no call asked for
            log.append(Message.tool(f"c{number}-9", words(rng, 20)))
    return log


def state_of(log: list[Message], tokenizer: Tokenizer, room: int, scale: float) -> CompactionState:
    groups = group_messages(log, tokenizer)
    state = CompactionState(
        [g.kind for g in groups], [g.messages for g in groups], tokenizer=tokenizer
    )
    state.room, state.scale = room, scale
    return state


def expected(
    state: CompactionState, strategy: Summarization
) -> tuple[list[int], ModelRequest] | None:
    """The groups covered and the request, by the straightforward search; ``None`` when
    there is nothing worth summarizing.

    Raises:
        CompactionError: No request fits, down to one group to summarize.
    """
    taken = state.candidates(state.newest(strategy.minimum_preserved))
    new = [slot for slot in taken if state.kind(slot) != SUMMARY]
    count_tokens = state.tokenizer.count_tokens
    if math.ceil(state.scale * sum(map(state.size, new))) <= count_tokens(SUMMARY_PREFIX):
        return None
    earlier = [split_quotes(summary_text(state.messages_of(s)[0])) for s in taken if s not in new]
    notes = "\n".join(part[0] for part in earlier)
    quotes = "\n".join(part[1] for part in earlier if part[1])
    full = math.ceil(state.scale * count_tokens(notes)) >= strategy.max_tokens
    rewrite = notes if earlier and full else None
    instruction = summary_instruction(strategy.prompt, rewrite=rewrite is not None)
    clips = [strategy.max_item_chars, *(c for c in CLIP_LEVELS if c < strategy.max_item_chars)]
    for count in range(len(taken), 0, -1):
        part = taken[:count]
        covered = [m for s in part if state.kind(s) != SUMMARY for m in state.messages_of(s)]
        lines = transcript_lines([covered])[0]  # rendered afresh for each candidate
        transcripts = ["\n".join(entry(cut_middle(line, clip)) for line in lines) for clip in clips]
        caps = [starting_cap(state, strategy, part, rewrite, quotes, covered)]
        while caps[-1] > FLOOR:
            caps.append(max(FLOOR, caps[-1] // 2))
        for cap in caps:
            for transcript in transcripts:
                request = summary_request(
                    transcript, instructions=instruction, settings={}, max_tokens=cap, notes=rewrite
                )
                if cap <= state.answer_room(request, instruction):
                    return part, request
        if sum(state.kind(s) != SUMMARY for s in part) <= 1:
            raise CompactionError("no summary request fits")
    raise AssertionError("unreachable: the loop ends at one group")


def starting_cap(
    state: CompactionState,
    strategy: Summarization,
    part: list[int],
    notes: str | None,
    quotes: str,
    covered: list[Message],
) -> int:
    """The summary's cap before fitting: half of what it replaces less the quotes it adds,
    at most ``max_tokens`` (half for a rewrite), at least the floor."""
    replaced = [s for s in part if notes is not None or state.kind(s) != SUMMARY]
    half = math.ceil(state.scale * sum(map(state.size, replaced))) // 2
    floor = min(FLOOR, strategy.max_tokens)
    if strategy.quote_specifics:
        count_tokens = state.tokenizer.count_tokens
        room = min(
            half - floor, strategy.max_tokens - math.ceil(state.scale * count_tokens(quotes))
        )
        for line in quoted_specifics(covered):
            cost = math.ceil(state.scale * (count_tokens(line) + 1))
            if cost <= room:
                room -= cost
                half -= cost
    limit = strategy.max_tokens if notes is None else strategy.max_tokens // 2
    return max(floor, min(limit, half))


@pytest.mark.parametrize("anyio_backend", ["trio"])  # the fitting is the same under either
async def test_a_summary_request_is_fitted_as_a_full_render_per_candidate_would() -> None:
    rng = random.Random(SEED)
    outcomes: dict[str, int] = {}
    for case in range(CASES):
        log = random_log(rng)
        tokenizer = rng.choice(TOKENIZERS)
        scale = rng.choice([1.0, rng.uniform(0.5, 2.0)])
        total = sum(group.tokens for group in group_messages(log, tokenizer))
        room = int(math.exp(rng.uniform(math.log(200), math.log(scale * total + 800))))
        strategy = Summarization(
            model=ScriptedModel([text_response("- noted")]),
            minimum_preserved=rng.randrange(4),
            max_tokens=rng.choice([8, 40, 64, 100, 1_024]),
            max_item_chars=rng.choice([64, 70, 81, 150, 600, 2_500, 4_000, 6_000]),
            quote_specifics=rng.random() < 0.5,
            prompt=rng.choice([None, "Summarize briefly."]),
        )
        reference = state_of(log, tokenizer, room, scale)
        taken = reference.candidates(reference.newest(strategy.minimum_preserved))
        state = state_of(log, tokenizer, room, scale)
        try:
            wanted = expected(reference, strategy)
        except CompactionError:
            with pytest.raises(CompactionError, match="no summary request fits"):
                await strategy.compact(state)
            outcomes["none fits"] = outcomes.get("none fits", 0) + 1
            continue
        await strategy.compact(state)
        assert isinstance(strategy.model, ScriptedModel)
        if wanted is None:
            assert strategy.model.requests == [] and state.records() == (), case
            continue
        covered, request = wanted
        (sent,) = strategy.model.requests
        assert sent.messages[-1].text == request.messages[-1].text, case
        assert sent.max_tokens == request.max_tokens, case
        kept = [m.id for s in range(state.slots) if s not in covered for m in state.messages_of(s)]
        view = state.view()
        assert [m.id for m in view if m.id in kept or not m.is_summary] == kept, case
        assert sum(m.id not in kept for m in view) == 1, case  # the new summary
        share = "all taken" if covered == taken else "some given back"
        outcomes[share] = outcomes.get(share, 0) + 1
    assert min(outcomes.values(), default=0) > 20 and len(outcomes) == 3, outcomes
