"""Bad input, as a class: every declared knob and option of the public surface is fed the
same wrong values (None, bools for ints, negative, zero, NaN and infinite numbers, huge
ints, ints past a float's range and too long to write as text, empty and blank strs, a
str where a sequence goes, bytes, containers, a class where an instance goes, plain and
coroutine functions) and must refuse each one it cannot take where it is given — a
``TypeError`` or ``ConfigurationError`` naming the knob — and a failed class definition
must leave nothing behind. The settings every provider shares are such knobs, each with
what one provider or another takes of it."""

from __future__ import annotations

import gc
import math
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeGuard, cast

import pytest
from attrs import frozen

from littleghost import Agent, Message, manage_context, tool
from littleghost.context import (
    ByteEstimator,
    CharacterEstimator,
    PromptBudget,
    SlidingWindow,
    Summarization,
    TokenBudget,
    ToolResultCompaction,
    Truncation,
    TurnExcerpts,
    tokens_exceed,
)
from littleghost.errors import ConfigurationError
from littleghost.sessions import InMemorySessionStore, SQLiteSessionStore
from littleghost.testing import ScriptedModel, text_response

SECRET = "card 4111-1111-1111-1111"


class Thing:
    """A class given where an instance goes."""


async def coroutine_function(*args: object) -> None:
    return None


def plain_function(*args: object) -> None:
    return None


BAD: dict[str, object] = {
    "None": None,
    "True": True,
    "False": False,
    "zero": 0,
    "negative": -1,
    "huge": 10**40,
    "too long to write": 10**5000,  # more digits than Python writes (4300)
    "past a float": 10**400,  # no float holds it
    "fraction": 1.5,
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "empty str": "",
    "blank str": "   ",
    "str": SECRET,
    "bytes": SECRET.encode(),
    "list": [SECRET],
    "tuple": (SECRET,),
    "dict": {"k": SECRET},
    "object": object(),
    "class": Thing,
    "coroutine function": coroutine_function,
    "plain function": plain_function,
}


def is_int(value: object) -> TypeGuard[int]:
    """An int, not a bool (the test's own oracle, not the library's check)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: object) -> TypeGuard[float]:
    """An int a float can hold (not a bool), or a finite float."""
    if is_int(value):
        return abs(value) <= int(sys.float_info.max)
    return isinstance(value, float) and math.isfinite(value)


def count(minimum: int) -> Callable[[object], bool]:
    return lambda value: is_int(value) and value >= minimum


def seconds(value: object) -> bool:
    """A finite number > 0 (``is_number`` takes no NaN or infinity)."""
    return is_number(value) and value > 0


def switch(value: object) -> bool:
    return isinstance(value, bool)


def ints(low: int, high: int) -> Callable[[object], bool]:
    return lambda value: is_int(value) and low <= value <= high


OUTPUT_CAP = ints(1, 2**31 - 1)
"""An output cap a provider takes: llama.cpp's server reads a 32-bit int."""


def text(value: object) -> bool:
    return isinstance(value, str) and value.strip() != ""


def optional(fits: Callable[[object], bool]) -> Callable[[object], bool]:
    return lambda value: value is None or fits(value)


def anything(value: object) -> bool:
    return True


MODEL = ScriptedModel([text_response("ok")] * 10_000)


class Base(Agent):
    model = MODEL


def declared(knob: str) -> Callable[[object], object]:
    return lambda value: type("Declared", (Agent,), {"model": MODEL, knob: value})


def overridden(knob: str) -> Callable[[object], object]:
    return lambda value: Base(**cast(Any, {knob: value}))


def set_on_agent(knob: str) -> Callable[[object], object]:
    return lambda value: setattr(Base(), knob, value)


def ran(keyword: str) -> Callable[[object], object]:
    return lambda value: Base().run_sync("hi", **cast(Any, {keyword: value}))


def keyword(make: Callable[..., object], name: str, **given: object) -> Callable[[object], object]:
    return lambda value: make(**{**given, name: value})


def with_tool(name: str) -> Callable[[object], object]:
    def lookup(order: str) -> str:
        """Look an order up."""
        return order

    def declare(value: object) -> object:
        return tool(lookup, **cast(Any, {name: value}))

    return declare


@frozen
class Knob:
    """One place a value is given: ``build(value)`` gives it; ``fits`` says which values
    it takes; its error names it by ``named``."""

    named: str
    build: Callable[[object], object]
    fits: Callable[[object], bool]


AGENT_KNOBS: dict[str, Callable[[object], bool]] = {
    "max_turns": count(1),
    "max_tool_calls": count(1),
    "max_tool_result_tokens": count(1),
    "max_retries": count(0),
    "capture_content": switch,
    "cleanup_grace": seconds,
    "output_strategy": lambda value: value in ("auto", "native", "tool"),
    "session_store": lambda value: isinstance(value, InMemorySessionStore),
    "settings": lambda value: isinstance(value, dict),  # free keys: {"k": ...} is one
    "tools": lambda value: value == [] or value == (),
    "instructions": lambda value: (
        value is None or isinstance(value, str) or value in (plain_function, coroutine_function)
    ),
    "model": lambda value: value is None,
}

SETTINGS: dict[str, Callable[[object], bool]] = {
    "max_tokens": OUTPUT_CAP,
    "max_completion_tokens": OUTPUT_CAP,
    "temperature": lambda value: is_number(value) and value >= 0,
    "top_p": lambda value: is_number(value) and 0 <= value <= 1,
    "top_k": ints(-1, 2**31 - 1),  # -1 and 0 turn it off (llama.cpp, vLLM)
    "frequency_penalty": is_number,
    "presence_penalty": is_number,
    "seed": ints(-(2**63), 2**64 - 1),  # OpenAI's int64, llama.cpp's uint64
    "n": OUTPUT_CAP,
    "top_logprobs": ints(0, 2**31 - 1),
    "logprobs": switch,
    "parallel_tool_calls": switch,
    "stop": lambda value: (
        isinstance(value, str)
        or (isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value))
    ),
}
"""The settings every provider shares, and what one provider or another takes of each."""


def declared_setting(key: str) -> Callable[[object], object]:
    return lambda value: type("Declared", (Agent,), {"model": MODEL, "settings": {key: value}})


def ran_with_setting(key: str) -> Callable[[object], object]:
    return lambda value: Base().run_sync("hi", settings={key: value})


STORE_PATH = Path(tempfile.mkdtemp()) / "bad-input.db"


def knobs() -> Iterator[Knob]:
    for knob, fits in AGENT_KNOBS.items():
        yield Knob(knob, declared(knob), fits)
        yield Knob(knob, overridden(knob), fits)
        if knob != "tools":  # worked out as the agent is made
            yield Knob(knob, set_on_agent(knob), fits)
    yield Knob("history", ran("history"), lambda value: value is None or value in ([], ()))
    yield Knob("session_id", ran("session_id"), optional(lambda v: isinstance(v, str) and v != ""))
    yield Knob(  # 0 is "at once" and inf "none": not wrong
        "timeout",
        ran("timeout"),
        lambda value: value is None or value == math.inf or (is_number(value) and value >= 0),
    )
    yield Knob(  # a time past is "at once": not wrong
        "deadline",
        ran("deadline"),
        lambda value: value is None or value in (math.inf, -math.inf) or is_number(value),
    )
    yield Knob("settings", ran("settings"), lambda value: value is None or isinstance(value, dict))
    for key, fits in SETTINGS.items():
        yield Knob(f"settings[{key!r}]", declared_setting(key), fits)
        yield Knob(f"settings[{key!r}]", ran_with_setting(key), fits)
    options: dict[str, Callable[[object], bool]] = {
        "context_window_tokens": count(1),
        "context_window_override": optional(count(1)),
        "compression_threshold": lambda value: is_number(value) and 0 < value <= 1,
        "summary_ratio": lambda value: is_number(value) and 0.1 <= value <= 0.8,
        "preserve_recent_messages": count(2),
        "summary_instructions": optional(text),
        "summary_max_tokens": optional(OUTPUT_CAP),
        "quote_specifics": switch,
        "mask_tool_results": optional(count(0)),
        "budget": lambda value: value is None,
        "summarize": lambda value: value is True,
        "strategy": lambda value: value is None,
        "tokenizer": lambda value: False,
    }
    for option, fits in options.items():
        yield Knob(option, keyword(manage_context, option), fits)
    budget: dict[str, Callable[[object], bool]] = {
        "prompt_budget_tokens": count(1),
        "response_reserve_tokens": OUTPUT_CAP,
        "safety_reserve_tokens": count(0),
        "memory_tokens": count(0),
        "history_item_tokens": count(16),
        "excerpt_tokens": count(0),
        "excerpt_item_chars": count(20),
        "floor_tokens": count(16),
        "tool_result_share": lambda value: is_number(value) and 0 < value <= 1,
        "memory": lambda value: value is None or (callable(value) and not isinstance(value, type)),
        "tokenizer": lambda value: False,
    }
    for field, fits in budget.items():
        yield Knob(field, keyword(PromptBudget, field), fits)
    yield Knob("bytes_per_token", keyword(ByteEstimator, "bytes_per_token"), seconds)
    yield Knob("message_overhead", keyword(ByteEstimator, "message_overhead"), count(0))
    yield Knob("chars_per_token", keyword(CharacterEstimator, "chars_per_token"), seconds)
    yield Knob("image_tokens", keyword(CharacterEstimator, "image_tokens"), count(0))
    strategies: list[
        tuple[Callable[..., object], str, Callable[[object], bool], dict[str, Any]]
    ] = [
        (Truncation, "minimum_preserved", count(0), {}),
        (SlidingWindow, "keep_last_turns", count(1), {}),
        (SlidingWindow, "minimum_preserved", count(0), {"keep_last_turns": 2}),
        (Summarization, "max_tokens", optional(OUTPUT_CAP), {}),
        (Summarization, "max_item_chars", count(64), {}),
        (Summarization, "prompt", optional(text), {}),
        (Summarization, "quote_specifics", switch, {}),
        (Summarization, "mask_tool_results", optional(count(0)), {}),
        (ToolResultCompaction, "max_result_chars", count(16), {}),
        (ToolResultCompaction, "keep_last_tool_call_groups", count(0), {}),
        (TurnExcerpts, "excerpt_chars", count(16), {}),
        (TokenBudget, "token_budget", count(1), {"strategies": [Truncation()]}),
    ]
    for make, field, fits, given in strategies:
        yield Knob(field, keyword(make, field, **given), fits)
    yield Knob("limit", lambda value: tokens_exceed(value), count(0))  # type: ignore[arg-type]
    trigger = lambda value: callable(value) and not isinstance(value, type)  # noqa: E731
    yield Knob("trigger", keyword(Truncation, "trigger"), trigger)
    yield Knob("target", keyword(Truncation, "target"), optional(trigger))
    store = keyword(SQLiteSessionStore, "timeout", path=STORE_PATH)
    yield Knob("timeout", store, seconds)
    yield Knob("read_only", keyword(SQLiteSessionStore, "read_only", path=STORE_PATH), switch)
    yield Knob("timeout", with_tool("timeout"), optional(seconds))
    yield Knob("name", with_tool("name"), lambda value: value is None)
    yield Knob("description", with_tool("description"), optional(text))
    scripted = {
        "context_window": optional(is_int),
        "name": lambda value: isinstance(value, str),
        "supports_output_schema": switch,
        "count_prompt_tokens": optional(callable),
        "output_schema_problem": optional(callable),
    }
    for option, fits in scripted.items():
        yield Knob(option, keyword(ScriptedModel, option, steps=[text_response("ok")]), fits)


CASES = [
    pytest.param(knob, value, id=f"{knob.named}-{i}-{label}")
    for i, knob in enumerate(knobs())
    for label, value in BAD.items()
    if not knob.fits(value)
]


@pytest.mark.parametrize(("knob", "value"), CASES)
def test_a_value_a_knob_cannot_take_is_refused_where_it_is_given_naming_it(
    knob: Knob, value: object
) -> None:
    with pytest.raises((TypeError, ConfigurationError)) as caught:
        knob.build(value)
    assert knob.named in str(caught.value)


@pytest.mark.parametrize(
    "value",
    [pytest.param(value, id=label) for label, value in BAD.items() if not isinstance(value, str)],
)
def test_run_input_and_history_are_refused_by_type_never_by_content(value: Any) -> None:
    """What a run is given as its question or history is content: errors name types."""
    agent = Base()
    calls: list[Callable[[], object]] = [
        lambda: agent.run_sync(value),
        lambda: agent.run_sync("hi", history=[Message.user("ok"), value]),
    ]
    for call in calls:
        with pytest.raises((TypeError, ConfigurationError)) as caught:
            call()
        assert SECRET not in str(caught.value)


def test_a_failed_class_definition_leaves_nothing_behind() -> None:
    """No registry, parent or store keeps a class whose definition failed."""

    def subclasses(cls: type) -> Iterator[type]:
        subclass: type
        for subclass in cls.__subclasses__():
            yield subclass
            yield from subclasses(subclass)

    for knob, fits in AGENT_KNOBS.items():
        for value in BAD.values():
            if not fits(value):
                with pytest.raises((TypeError, ConfigurationError)):
                    declared(knob)(value)
    with pytest.raises(ConfigurationError):
        type("Declared", (Base,), {"instruction": "Be brief."})  # a knob misspelled
    gc.collect()
    assert [cls for cls in subclasses(Agent) if cls.__name__ == "Declared"] == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("max_tokens", 2**31 - 1),
        ("max_completion_tokens", 1),
        ("top_k", -1),
        ("top_k", 0),
        ("seed", -(2**63)),
        ("seed", 2**64 - 1),
        ("temperature", 2),
        ("top_p", 0),
        ("n", 1),
        ("top_logprobs", 0),
        ("frequency_penalty", -2.0),
        ("logprobs", True),
    ],
    ids=repr,
)
def test_a_setting_a_provider_takes_reaches_the_model(key: str, value: object) -> None:
    """The ranges are what one provider or another takes, edges included: top_k 0 (which
    Anthropic documents as its least, and turns top-k off on llama.cpp) was refused."""
    agent = type("Declared", (Agent,), {"model": MODEL, "settings": {key: value}})()
    agent.run_sync("hi")
    assert MODEL.requests[-1].settings[key] == value
    Base().run_sync("hi", settings={key: value})
    assert MODEL.requests[-1].settings[key] == value


def _refused_where_given(key: str) -> list[tuple[str, str]]:
    """The errors a setting ``key`` gets at class definition, at the constructor and at
    the call, each with where it was given."""
    failing: list[tuple[str, Callable[[], object]]] = [
        ("Declared.settings", lambda: type("Declared", (Agent,), {"settings": {key: 1}})),
        ("Base(…, settings=)", lambda: Base(settings={key: 1})),
        ("settings", lambda: Base().run_sync("hi", settings={key: 1})),
    ]
    errors = []
    for owner, call in failing:
        with pytest.raises(ConfigurationError) as caught:
            call()
        errors.append((owner, str(caught.value)))
    return errors


@pytest.mark.parametrize(
    ("key", "meant"),
    [
        ("max_token", "max_tokens"),
        ("maxTokens", "max_tokens"),
        ("temprature", "temperature"),
        ("Temperature", "temperature"),
        ("top-p", "top_p"),
        ("topp", "top_p"),
        ("presense_penalty", "presence_penalty"),
        ("seeds", "seed"),
        ("stop_sequence", "stop_sequences"),
        ("tool-choice", "tool_choice"),
        ("repeat-penalty", "repeat_penalty"),  # llama.cpp's
        ("min-p", "min_p"),
    ],
)
def test_a_setting_spelt_almost_like_a_known_one_fails_where_it_is_given(
    key: str, meant: str
) -> None:
    """A misspelt setting travelled to the provider as a key of its own, which llama.cpp
    and vLLM ignore: the answer was uncapped, or at the default temperature, silently.
    It fails at class definition, at the constructor and at the call, naming the setting
    meant and the way to send the key as it is; nothing is sent."""
    sent = len(MODEL.requests)
    said = f"{key!r} is not a setting littleghost knows: did you mean {meant!r}? (if your "
    passed = f"pass it in extra_body, sent as it is: {{'extra_body': {{{key!r}: ...}}}})"
    for owner, error in _refused_where_given(key):
        assert error.startswith(f"{owner}: {said}")
        assert error.endswith(passed)
    assert len(MODEL.requests) == sent


@pytest.mark.parametrize(
    ("key", "meant", "whose"),
    [
        ("temp", "temperature", "'temp' is llama.cpp's command-line name; littleghost's "),
        ("max_new_tokens", "max_tokens", "'max_new_tokens' is the name of Hugging Face's "),
        ("maxNewTokens", "max_tokens", "'maxNewTokens' is the name of Hugging Face's "),
        ("num_predict", "max_tokens", "'num_predict' is an option of Ollama's own API; "),
        ("max_length", "max_tokens", "'max_length' is the name of Hugging Face's "),
        ("max_output_tokens", "max_tokens", "'max_output_tokens' is the name of Gemini's "),
        ("min_token", "min_tokens", "vLLM's"),
        ("repetition_penalt", "repetition_penalty", "vLLM's"),
        ("n_keeps", "n_keep", "llama.cpp's"),
    ],
)
def test_another_library_s_name_or_a_provider_s_spelt_almost_fails_where_it_is_given(
    key: str, meant: str, whose: str
) -> None:
    """Another library's name for a setting (Hugging Face's max_new_tokens, Ollama's
    num_predict), which no provider littleghost sends to takes, and a name spelt almost
    like a provider's own parameter (vLLM's min_tokens) went to the provider as they were,
    and were ignored: an answer uncapped, or at the default temperature. They fail at
    class definition, at the constructor and at the call, naming the setting meant and
    whose name the key is; nothing is sent."""
    sent = len(MODEL.requests)
    said = f"{key!r} is not a setting littleghost knows: did you mean {meant!r} ({whose}"
    passed = f"pass it in extra_body, sent as it is: {{'extra_body': {{{key!r}: ...}}}})"
    for owner, error in _refused_where_given(key):
        assert error.startswith(f"{owner}: {said}")
        assert error.endswith(passed)
        if whose.endswith("; littleghost's "):
            assert f"; littleghost's providers take {meant!r})? (if your" in error
    assert len(MODEL.requests) == sent
    Base().run_sync("hi", settings={"extra_body": {key: 1}})  # the way to send it as it is
    assert dict(MODEL.requests[-1].settings) == {"extra_body": {key: 1}}


def test_a_provider_s_own_parameter_spelt_like_a_known_setting_reaches_the_model() -> None:
    """Parameters llama.cpp, vLLM, OpenAI, Anthropic and others document, however close to
    a setting littleghost knows (vLLM's min_tokens to max_tokens, Anthropic's speed to
    seed, OpenRouter's top_a to top_p), or another server's own name for a sampler, a word
    longer or shorter than one of theirs (KoboldCpp's typical, text-generation-webui's
    repetition_penalty_range), are sent as they are."""
    own = (
        "min_tokens repetition_penalty min_p typical_p repeat_penalty n_predict mirostat "
        "mirostat_tau top_n_sigma parse_tool_calls reasoning_format service_tier speed "
        "top_a dry_base n_keep logits_processors min_new_tokens rep_pen random_seed "
        "typical repetition_penalty_range"
    )
    settings = dict.fromkeys(own.split(), 1)
    type("Declared", (Agent,), {"model": MODEL, "settings": settings})().run_sync("hi")
    assert dict(MODEL.requests[-1].settings) == settings
    Base().run_sync("hi", settings=settings)
    assert dict(MODEL.requests[-1].settings) == settings


def test_extra_body_carries_a_parameter_the_spelling_check_would_refuse() -> None:
    """A provider's parameter the check takes for a near-miss goes in extra_body, whose
    keys are not checked; it must be a mapping with str keys, none littleghost's own."""
    settings = {"extra_body": {"temprature": 0.5}, "max_tokens": 5}
    Base().run_sync("hi", settings=settings)
    assert dict(MODEL.requests[-1].settings) == settings
    refused = {
        "messages": "settings['extra_body']: 'messages' is set by littleghost and cannot be "
        "a model setting",
        "no": "settings['extra_body'] must be a mapping with str keys, not str",
    }
    for inside, message in refused.items():
        body = {inside: []} if inside == "messages" else inside
        with pytest.raises(ConfigurationError) as caught:
            Base().run_sync("hi", settings={"extra_body": body})
        assert str(caught.value) == message


def test_an_output_cap_at_its_largest_is_taken_where_a_cap_is_declared() -> None:
    cap = 2**31 - 1
    manage_context(summary_max_tokens=cap, context_window_tokens=2**40)(
        type("Declared", (Agent,), {"model": MODEL})
    )
    assert Summarization(max_tokens=cap).max_tokens == cap
    assert PromptBudget(response_reserve_tokens=cap).response_reserve_tokens == cap


@pytest.mark.parametrize(
    ("provider", "name"),
    [("openai", "gpt-4o-mini"), ("OpenAI", "o3-mini"), ("anthropic", "claude-sonnet-4-5")],
)
def test_a_model_string_given_to_a_model_class_is_told_the_name_to_give(
    provider: str, name: str
) -> None:
    """``OpenAIModel("openai:gpt-4o-mini")`` was taken as the model's name: the API then
    refused every call (no such model), and no window was known for it."""
    from littleghost.models.anthropic import AnthropicModel
    from littleghost.models.openai import OpenAIModel

    made = {"openai": OpenAIModel, "anthropic": AnthropicModel}[provider.lower()]
    with pytest.raises(ConfigurationError) as caught:
        made(f"{provider}:{name}", api_key="sk-test")
    assert str(caught.value) == (
        f"{made.__name__}: model is the model's name, not a model string: "
        f"{made.__name__}({name!r}) (the string '{provider}:{name}' is what an agent's "
        "model = ... takes)"
    )
    assert made(name, api_key="sk-test").name == name
    for other in ("ft:gpt-4o-mini:acme::x1", "llama3:8b", f"{provider}:my-own-model"):
        assert made(other, api_key="sk-test").name == other  # names of other servers
    gateway = made(f"{provider}:{name}", api_key="sk-test", base_url="http://127.0.0.1:9/v1")
    assert gateway.name == f"{provider}:{name}"  # a gateway may name its models so
