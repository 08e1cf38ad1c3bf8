"""The exception tree: its shape, its fields, and how each exception is built."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import littleghost
import littleghost.errors as errors_module
from littleghost import Agent, Message
from littleghost.errors import (
    CleanupError,
    ConfigurationError,
    ContextWindowOverflowError,
    DeadlineExceededError,
    InvalidRequestError,
    LimitExceededError,
    LittleGhostError,
    OutputLimitError,
    ProtocolError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.models import StopReason
from littleghost.testing import ScriptedModel, text_response

PUBLIC = (
    LittleGhostError,
    ConfigurationError,
    ProviderError,
    RateLimitError,
    ProviderUnavailableError,
    ContextWindowOverflowError,
    OutputLimitError,
    ProtocolError,
    DeadlineExceededError,
    CleanupError,
    LimitExceededError,
    InvalidRequestError,
)


@pytest.mark.parametrize("error", PUBLIC, ids=lambda error: error.__name__)
def test_every_error_is_a_littleghost_error(error: type[Exception]) -> None:
    """Every public exception derives from LittleGhostError."""
    assert issubclass(error, LittleGhostError)


@pytest.mark.parametrize(
    "error",
    [RateLimitError, ProviderUnavailableError, ContextWindowOverflowError, InvalidRequestError],
    ids=lambda error: error.__name__,
)
def test_provider_failures_are_provider_errors(error: type[Exception]) -> None:
    """Rate limits, outages, overflow and invalid requests are ProviderErrors."""
    assert issubclass(error, ProviderError)


@pytest.mark.parametrize("error", PUBLIC, ids=lambda error: error.__name__)
def test_every_error_takes_just_a_message(error: type[Exception]) -> None:
    """Each exception can be built from its message alone, which str() returns."""
    assert str(error("what happened")) == "what happened"


def test_configuration_error_is_a_value_error() -> None:
    """ConfigurationError can be caught as ValueError."""
    with pytest.raises(ValueError, match="bad knob"):
        raise ConfigurationError("bad knob")


def test_deadline_exceeded_is_a_timeout_error() -> None:
    """DeadlineExceededError can be caught as TimeoutError."""
    with pytest.raises(TimeoutError):
        raise DeadlineExceededError("too late")


def test_provider_error_carries_its_fields() -> None:
    """ProviderError keeps status, code, provider and retry_after."""
    error = RateLimitError(
        "slow down", status=429, code="rate_limit", provider="openai", retry_after=1.5
    )
    assert (str(error), error.status, error.code, error.provider, error.retry_after) == (
        "slow down",
        429,
        "rate_limit",
        "openai",
        1.5,
    )


def test_provider_error_fields_default_to_none() -> None:
    """A ProviderError built from a message alone has no status, code, provider or wait."""
    error = ProviderError("boom")
    assert (error.status, error.code, error.provider, error.retry_after) == (None, None, None, None)


def test_provider_error_fields_are_keyword_only() -> None:
    """Fields other than the message cannot be passed positionally."""
    with pytest.raises(TypeError):
        ProviderError("boom", 500)  # type: ignore[misc]


def test_overflow_error_carries_token_counts() -> None:
    """ContextWindowOverflowError keeps prompt_tokens and context_window."""
    error = ContextWindowOverflowError(
        "too long", provider="local", status=400, prompt_tokens=9000, context_window=8192
    )
    assert (error.provider, error.status, error.prompt_tokens, error.context_window) == (
        "local",
        400,
        9000,
        8192,
    )


def test_output_limit_error_carries_the_response() -> None:
    """OutputLimitError keeps the cut-off response."""
    response = text_response("half an ans", stop_reason=StopReason.MAX_TOKENS)
    assert OutputLimitError("cut", response=response).response is response


def test_limit_exceeded_error_names_the_limit() -> None:
    """LimitExceededError keeps which limit and its value."""
    error = LimitExceededError("too many turns", limit="max_turns", value=3)
    assert (error.limit, error.value) == ("max_turns", 3)


@pytest.mark.parametrize("error", PUBLIC, ids=lambda error: error.__name__)
def test_docstring_draws_every_error(error: type[Exception]) -> None:
    """The module docstring's tree names every public exception."""
    assert error.__name__ in (errors_module.__doc__ or "")


def test_every_littleghost_error_is_in_the_errors_module() -> None:
    """Every exception the library defines is importable from ``littleghost.errors`` and
    drawn in its tree (``StreamStateError`` lived in ``littleghost.stream`` only)."""
    for module in pkgutil.walk_packages(littleghost.__path__, "littleghost."):
        importlib.import_module(module.name)
    found: set[type[LittleGhostError]] = set()
    pending: list[type[LittleGhostError]] = [LittleGhostError]
    while pending:
        error = pending.pop()
        found.add(error)
        pending.extend(error.__subclasses__())
    for error in found:
        if error.__module__.startswith("littleghost."):
            assert getattr(errors_module, error.__name__, None) is error, error
            assert error.__name__ in errors_module.__all__
            assert error.__name__ in (errors_module.__doc__ or "")


class Answering(Agent):
    pass


def _runs(**arguments: Any) -> None:
    """A run of an agent that answers once, with ``arguments`` given to ``run_sync()``."""
    Answering(model=ScriptedModel([text_response("done")])).run_sync(**arguments)


SAME = Message.user("asked twice, one id")

WRONG_CALLS: list[tuple[str, Callable[[], object]]] = [
    ("misspelled keyword", lambda: Answering(max_turn=3)),
    ("input not a str", lambda: _runs(input=3)),
    ("negative timeout", lambda: _runs(input="q", timeout=-1)),
    ("empty session id", lambda: _runs(input="q", session_id="")),
    ("history of non-messages", lambda: _runs(input="q", history=[3])),
]
WRONG_DECLARATIONS: list[tuple[str, Callable[[], object]]] = [
    ("knob to the constructor", lambda: Answering(max_turns=0)),
    ("run settings", lambda: _runs(input="q", settings={"temperature": "hot"})),
    ("run output type", lambda: _runs(input="q", output_type=3)),
    ("refused history", lambda: _runs(input="q", history=[SAME, SAME])),
    ("wall-clock deadline", lambda: _runs(input="q", deadline=time.time() + 30)),
]


@pytest.mark.parametrize(("what", "call"), WRONG_CALLS, ids=[what for what, _ in WRONG_CALLS])
def test_a_wrong_argument_is_a_type_error(what: str, call: Callable[[], object]) -> None:
    """The errors page: a wrong argument to a call is Python's own TypeError, which
    ``except LittleGhostError`` does not catch."""
    with pytest.raises(TypeError) as raised:
        call()
    assert not isinstance(raised.value, LittleGhostError), what


@pytest.mark.parametrize(
    ("what", "call"), WRONG_DECLARATIONS, ids=[what for what, _ in WRONG_DECLARATIONS]
)
def test_a_wrong_declaration_given_at_the_call_is_a_configuration_error(
    what: str, call: Callable[[], object]
) -> None:
    """The errors page: a knob given to the constructor, ``run()``'s settings, output
    type and refused history, and a wall-clock deadline are ``ConfigurationError``s."""
    with pytest.raises(ConfigurationError):
        call()


def test_the_errors_page_lists_each_errors_fields() -> None:
    """The errors page's table names every keyword field of each exception, on the row
    of the class that adds it (or of a parent it says covers its subclasses)."""
    page = (Path(__file__).resolve().parent.parent / "docs" / "errors.md").read_text()
    rows = {
        row.split("|")[1].strip(): row.split("|")[2]
        for row in page.splitlines()
        if row.startswith("| `") and row.count("|") == 3
    }
    for name in errors_module.__all__:
        error = getattr(errors_module, name)
        parent = error.__mro__[1]
        fields = [
            parameter.name
            for parameter in inspect.signature(error.__init__).parameters.values()
            if parameter.kind is inspect.Parameter.KEYWORD_ONLY
        ]
        inherited = set(inspect.signature(parent.__init__).parameters)
        added = [field for field in fields if field not in inherited]
        if not added:
            continue
        row = rows.get(f"`{name}`") or rows[f"`{name}` and its subclasses"]
        for field in added:
            assert f"`{field}`" in row, (name, field)
    assert "`run_usage`" in page
