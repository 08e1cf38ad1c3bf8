"""A count of tokens (a context window, a prompt's size, a call's usage) is an int from 1
to 2**63-1 wherever littleghost takes one: a declared or advertised window past it is a
``ConfigurationError``, a ``Usage`` or ``ContextWindowOverflowError`` made with one a
``TypeError``, and a provider's figure past it is none. Past it, the estimates'
floating-point arithmetic failed with an ``OverflowError`` (10**400), and a server's
5 000-digit figure failed the error's classification with a ``ValueError``."""

from __future__ import annotations

from typing import Any

import pytest

from littleghost import Agent, manage_context
from littleghost.errors import ConfigurationError, ContextWindowOverflowError
from littleghost.models import Usage
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel
from littleghost.models.overflow import classify_error
from littleghost.testing import ScriptedModel, text_response

pytestmark = pytest.mark.anyio

LARGEST = 2**63 - 1
PAST = [pytest.param(2**63, id="2**63"), pytest.param(10**400, id="10**400")]
"""Counts past the largest: the first just past it, the second past a float's range."""

OPENAI_OVERFLOW = (
    "This model's maximum context length is {window} tokens. However, your messages "
    "resulted in {prompt} tokens. Please reduce the length of the messages."
)


@pytest.mark.parametrize("option", ["context_window_tokens", "context_window_override"])
@pytest.mark.parametrize("window", PAST)
def test_a_declared_window_past_the_largest_count_is_refused_at_class_definition(
    option: str, window: int
) -> None:
    with pytest.raises(ConfigurationError) as caught:

        @manage_context(**{option: window})  # type: ignore[misc]
        class Huge(Agent):
            model = ScriptedModel([])

    assert str(caught.value).startswith(
        f"manage_context: {option} must be an int from 1 to 2**63-1, not {str(window)[:9]}"
    )


async def test_the_largest_window_is_taken_and_a_run_answers() -> None:
    @manage_context(context_window_tokens=LARGEST)
    class Widest(Agent):
        model = ScriptedModel([text_response("ok", input_tokens=LARGEST)] * 2)

    agent = Widest()
    await agent.run("one", session_id="s")
    assert (await agent.run("two", session_id="s")).output == "ok"


@pytest.mark.parametrize("make", [OpenAIModel, AnthropicModel])
@pytest.mark.parametrize("window", PAST)
def test_a_models_context_window_past_the_largest_count_is_refused(make: Any, window: int) -> None:
    with pytest.raises(
        ConfigurationError, match=r"context_window must be an int from 1 to 2\*\*63-1"
    ):
        make("m", api_key="k", context_window=window)


@pytest.mark.parametrize("count", PAST)
def test_a_usage_count_past_the_largest_is_a_type_error(count: int) -> None:
    with pytest.raises(TypeError, match=r"Usage.input_tokens must be an int from 0 to 2\*\*63-1"):
        Usage(input_tokens=count)


def test_a_sum_of_usages_stops_at_the_largest_count() -> None:
    """Two calls a server reported at the largest count add up to it, not to a failure."""
    most = Usage(LARGEST, LARGEST, reasoning_tokens=LARGEST)
    assert most + most == most
    assert Usage(1, 2) + Usage(3, 4) == Usage(4, 6)


@pytest.mark.parametrize("name", ["prompt_tokens", "context_window"])
@pytest.mark.parametrize("figure", ["600", 1.5, -5, True, *PAST])
def test_an_overflow_errors_figure_that_is_no_count_is_a_type_error(
    name: str, figure: object
) -> None:
    """A custom model's figure that is no count failed later, deep in recovery
    (``TypeError`` adding a str, ``OverflowError`` dividing 10**400)."""
    with pytest.raises(TypeError) as caught:
        ContextWindowOverflowError("too long", provider="mine", **{name: figure})
    assert str(caught.value).startswith(
        f"ContextWindowOverflowError: {name} must be an int from 1 to 2**63-1, 0 or None, not "
    )


def test_an_overflow_errors_zero_is_no_figure() -> None:
    error = ContextWindowOverflowError("too long", prompt_tokens=0, context_window=LARGEST)
    assert (error.prompt_tokens, error.context_window) == (None, LARGEST)


@pytest.mark.parametrize("prompt", ["9" * 5000, str(10**400), str(2**63), ",", "1" + ",000" * 7])
def test_a_servers_written_figure_that_is_no_count_is_none(prompt: str) -> None:
    """Out of a message: too long for a count, past the largest, or no digits at all."""
    message = OPENAI_OVERFLOW.format(window="4,096", prompt=prompt)
    error = classify_error(provider="openai", status=400, body={"error": {"message": message}})
    assert isinstance(error, ContextWindowOverflowError)
    assert (error.prompt_tokens, error.context_window) == (None, 4096)


@pytest.mark.parametrize("figure", [*PAST, 0, -1, 1.5, "12", True])
def test_a_servers_body_figure_that_is_no_count_is_none(figure: object) -> None:
    body = {"error": {"message": "the request exceeds the available context size",
                      "type": "exceed_context_size_error",
                      "n_prompt_tokens": figure, "n_ctx": 512}}  # fmt: skip
    error = classify_error(provider="llama.cpp", status=400, body=body)
    assert isinstance(error, ContextWindowOverflowError)
    assert (error.prompt_tokens, error.context_window) == (None, 512)


async def test_a_run_whose_server_wrote_a_figure_past_any_count_recovers() -> None:
    """The provider's error, as its server wrote it, through the run's overflow
    recovery of a session's third turn: the figure is none, and the estimate recovers
    (the figure divided by the estimate was an ``OverflowError``)."""
    message = OPENAI_OVERFLOW.format(window=400, prompt="1" + "0" * 400)
    refused = classify_error(provider="openai", status=400, body={"error": {"message": message}})

    @manage_context(preserve_recent_messages=2)
    class Managed(Agent):
        model = ScriptedModel(
            [text_response("a " * 50)] * 2 + [refused] + [text_response("ok")] * 2,
            context_window=400,
        )

    agent = Managed()
    for turn in range(3):
        result = await agent.run(f"question {turn} " + "word " * 60, session_id="s")
    assert result.output == "ok"
