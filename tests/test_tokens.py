"""Token estimators: their configuration is checked, and tool arguments are counted as JSON."""

from __future__ import annotations

import dataclasses
import gc
import json
import math
import random
from typing import Any

import pytest

from littleghost import ImagePart, Message, ReasoningPart, Role, TextPart, ToolCall
from littleghost.context import ByteEstimator, CharacterEstimator, TokenBudget, apply_compaction
from littleghost.context.index import RECENT_LOGS
from littleghost.context.tokens import estimate_messages, estimate_request, prompt_text
from littleghost.errors import ConfigurationError
from littleghost.models import OutputSchema

NUMBER = "a finite number > 0"
COUNT = "an int >= 0"


@pytest.mark.parametrize(
    ("estimator", "field", "value", "allowed"),
    [
        (CharacterEstimator, "chars_per_token", 0, NUMBER),
        (CharacterEstimator, "chars_per_token", -1.5, NUMBER),
        (CharacterEstimator, "chars_per_token", True, NUMBER),
        (CharacterEstimator, "chars_per_token", "4", NUMBER),
        (CharacterEstimator, "chars_per_token", None, NUMBER),
        (CharacterEstimator, "chars_per_token", math.nan, NUMBER),
        (CharacterEstimator, "chars_per_token", math.inf, NUMBER),
        (CharacterEstimator, "image_tokens", -1, COUNT),
        (CharacterEstimator, "image_tokens", True, COUNT),
        (CharacterEstimator, "image_tokens", 1.5, COUNT),
        (ByteEstimator, "bytes_per_token", 0.0, NUMBER),
        (ByteEstimator, "bytes_per_token", False, NUMBER),
        (ByteEstimator, "bytes_per_token", "3", NUMBER),
        (ByteEstimator, "message_overhead", -1, COUNT),
        (ByteEstimator, "message_overhead", True, COUNT),
        (ByteEstimator, "message_overhead", 6.0, COUNT),
        (ByteEstimator, "image_tokens", -765, COUNT),
        (ByteEstimator, "image_tokens", None, COUNT),
    ],
)
def test_a_wrong_setting_is_a_configuration_error_naming_the_field_and_range(
    estimator: type[Any], field: str, value: object, allowed: str
) -> None:
    """Zero, negative, non-finite, bool and non-number settings are rejected as such."""
    with pytest.raises(ConfigurationError) as raised:
        estimator(**{field: value})
    assert str(raised.value) == f"{estimator.__name__}.{field} must be {allowed}, not {value!r}"


def test_valid_settings_are_kept_and_used() -> None:
    """Ints where floats are expected, and zero counts, are valid settings."""
    characters = CharacterEstimator(chars_per_token=2, image_tokens=0)
    assert (characters.chars_per_token, characters.image_tokens) == (2, 0)
    assert characters.count_tokens("abcde") == 3
    by_bytes = ByteEstimator(bytes_per_token=1, message_overhead=0, image_tokens=0)
    assert by_bytes.count_tokens("ü") == 2
    assert estimate_messages([Message.user("ab")], by_bytes) == len(prompt_text(Message.user("ab")))


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ({"city": "Zürich", "days": 3}, '{"city":"Zürich","days":3}'),
        ({"tags": ["a", None], "nested": {"k": True}}, '{"tags":["a",null],"nested":{"k":true}}'),
        ({"city": "Oslo"}, '{"city":"Oslo"}'),
        ({}, "{}"),
    ],
)
def test_tool_arguments_are_counted_as_their_json(arguments: dict[str, Any], expected: str) -> None:
    """A call's read-only arguments reach the prompt text, and the estimate, as JSON."""
    message = Message.assistant(tool_calls=[ToolCall("c1", "weather", arguments)])
    text = prompt_text(message)
    assert f'"arguments":{expected}}}' in text
    for tokenizer in (CharacterEstimator(chars_per_token=1), ByteEstimator(bytes_per_token=1)):
        overhead = getattr(tokenizer, "message_overhead", 0)
        assert estimate_messages([message], tokenizer) == tokenizer.count_tokens(text) + overhead


DETAILS = json.dumps(
    [{"type": "reasoning.text", "text": "Let me think. " * 40, "signature": "s" * 3_000}]
)
"""OpenRouter's ``reasoning_details`` of Claude's signed thinking, as they are kept."""


@pytest.mark.parametrize(
    "tokenizer", [CharacterEstimator(), ByteEstimator(), CharacterEstimator(chars_per_token=3)]
)
@pytest.mark.parametrize(
    ("thought", "sent"),
    [
        (ReasoningPart("x" * 400, "s" * 4_000, "anthropic"), "x" * 400 + "s" * 4_000),
        (ReasoningPart("", "d" * 2_000, "anthropic", redacted=True), "d" * 2_000),
        (ReasoningPart("", "g" * 1_500, "google"), "g" * 1_500),
        (ReasoningPart("", DETAILS, "openrouter"), DETAILS),
        (ReasoningPart("pensée " * 50, "s" * 100, "anthropic"), "pensée " * 50 + "s" * 100),
        (ReasoningPart("x" * 400), ""),  # unsigned: not sent with an answer
        (ReasoningPart("x" * 400, "", "anthropic"), "x" * 400),  # lost: never sent
    ],
    ids=["signed", "redacted", "thought-signature", "openrouter", "beyond-ascii", "no", "lost"],
)
def test_reasoning_counts_as_what_goes_back_its_signature_too(
    tokenizer: Any, thought: ReasoningPart, sent: str
) -> None:
    """A signature goes back with its reasoning (a redacted block's data, a Gemini thought
    signature, OpenRouter's reasoning_details, which carry Claude's thinking again): each
    counts as text. They counted nothing: an OpenRouter conversation's thinking was left
    out of every estimate."""
    with_reasoning = Message(Role.ASSISTANT, [thought, TextPart("yes")])
    assert prompt_text(with_reasoning) == "assistant: " + sent + "yes"
    plain = Message.assistant(sent + "yes")
    assert estimate_messages([with_reasoning], tokenizer) == estimate_messages([plain], tokenizer)


@pytest.mark.parametrize("tokenizer", [CharacterEstimator(), ByteEstimator()])
def test_unsigned_reasoning_counts_only_beside_tool_calls(tokenizer: Any) -> None:
    """An OpenAI-compatible server's reasoning goes back on an answer with tool calls,
    never on one without (the end of its turn): an answer's counted nothing, so a
    reasoning model's conversation was compacted long before it filled the window."""
    thought = ReasoningPart("Hmm, " * 100, None, "openai")
    call = ToolCall("c1", "lookup", {"order_id": "42"})
    answer = Message(Role.ASSISTANT, [thought, TextPart("It shipped.")])
    assert estimate_messages([answer], tokenizer) == estimate_messages(
        [Message.assistant("It shipped.")], tokenizer
    )
    calling = Message(Role.ASSISTANT, [thought, call])
    assert estimate_messages([calling], tokenizer) == estimate_messages(
        [Message(Role.ASSISTANT, [TextPart(thought.text), call])], tokenizer
    )


@pytest.mark.parametrize(
    "tokenizer", [CharacterEstimator(), CharacterEstimator(image_tokens=10), ByteEstimator()]
)
def test_each_image_counts_its_tokenizers_image_tokens(tokenizer: Any) -> None:
    """An image adds ``image_tokens`` to the estimate, and nothing for its bytes."""
    images = [ImagePart(data=b"\x89PNG" * 1_000), ImagePart(url="https://example.com/a.png")]
    message = Message(Role.USER, [TextPart("look at these"), *images])
    plain = Message.user("look at these")
    expected = estimate_messages([plain], tokenizer) + 2 * tokenizer.image_tokens
    assert estimate_messages([message], tokenizer) == expected


class HashableCounter:
    """A user tokenizer, hashable by identity."""

    def count_tokens(self, text: str) -> int:
        return len(text)


@dataclasses.dataclass
class DataclassCounter:
    """A user tokenizer that is a dataclass, so unhashable."""

    per_char: int = 1

    def count_tokens(self, text: str) -> int:
        return self.per_char * len(text)


@dataclasses.dataclass(frozen=True, slots=True)
class SlottedCounter:
    """A user tokenizer that is hashable but cannot be weakly referenced."""

    per_char: int = 1

    def count_tokens(self, text: str) -> int:
        return self.per_char * len(text)


@pytest.mark.anyio
@pytest.mark.parametrize("kind", [HashableCounter, DataclassCounter, SlottedCounter])
async def test_tokenizers_made_per_call_are_not_kept_alive(kind: type[Any]) -> None:
    """A tokenizer made for one ``apply_compaction`` call (or one agent class) is freed
    once the engine's few recent logs (``RECENT_LOGS``) no longer hold it."""
    for n in range(30):
        log = [Message.user(f"question {n} " * 20), Message.assistant("answer " * 20)]
        await apply_compaction(log, TokenBudget(token_budget=50), tokenizer=kind())
    gc.collect()
    assert sum(type(o) is kind for o in gc.get_objects()) <= RECENT_LOGS + 1


def test_the_default_estimate_weighs_characters_beyond_ascii() -> None:
    """ASCII counts four characters a token; each UTF-8 byte of a character past its first
    weighs 1.5 characters more: a CJK character is a token, a Cyrillic letter 0.625."""
    estimator = CharacterEstimator()
    assert estimator.count_tokens("abcd" * 10) == 10
    assert estimator.count_tokens("東京" * 10) == 20
    assert estimator.count_tokens("дом" * 8) == 15
    assert estimator.count_tokens("🎉" * 4) == 6
    assert estimator.count_tokens("\ud800" * 4) == 4  # a lone surrogate counts, as 3 bytes
    assert CharacterEstimator(chars_per_token=2).count_tokens("東京") == 4


def test_a_message_is_estimated_as_its_prompt_text_whatever_its_script() -> None:
    """The default estimator counts a message's parts as it counts its prompt text
    (``count_tokens(prompt_text(message))``), for random mixes of scripts in every part."""
    rng = random.Random(20261203)
    alphabet = 'ab c{}":,1é€дあ東🎉\\\n'

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 40)))

    for chars_per_token in (1, 3.5, 4):
        estimator = CharacterEstimator(chars_per_token=chars_per_token)
        for _ in range(300):
            flat = {text(): text() for _ in range(rng.randrange(0, 3))}
            nested = {text(): [text(), rng.randrange(99), None]}
            call = ToolCall(text(), text(), rng.choice((flat, nested, text())))
            message = rng.choice(
                (
                    Message.user(text()),
                    Message(Role.ASSISTANT, [ReasoningPart(text()), TextPart(text())]),
                    Message(Role.ASSISTANT, [ReasoningPart(text()), TextPart(text()), call]),
                    Message(Role.ASSISTANT, [ReasoningPart(text(), text(), "x"), TextPart(text())]),
                    Message.assistant(text(), tool_calls=[call]),
                    Message.tool(text(), text()),
                )
            )
            expected = estimator.count_tokens(prompt_text(message))
            assert estimate_messages([message], estimator) == expected, message


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("stop", ["END"]),
        ("response_format", {"type": "json_object"}),
        ("tool_choice", {"type": "function", "function": {"name": "weather"}}),
    ],
)
def test_the_settings_that_reach_the_prompt_count_and_no_others(key: str, value: Any) -> None:
    messages = [Message.user("hi")]
    plain = estimate_request(messages, (), {})
    assert estimate_request(messages, (), {key: value}) > plain
    assert estimate_request(messages, (), {"temperature": 0.5, "seed": 7}) == plain


def test_an_output_schema_counts() -> None:
    messages = [Message.user("hi")]
    schema = OutputSchema("answer", {"type": "object", "properties": {"city": {"type": "string"}}})
    plain = estimate_request(messages, (), {})
    assert estimate_request(messages, (), {}, output_schema=schema) > plain


def test_the_byte_estimate_rounds_up() -> None:
    assert [ByteEstimator().count_tokens(text) for text in ("", "a", "abc", "abcd")] == [0, 1, 1, 2]
