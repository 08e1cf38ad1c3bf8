"""Ints longer than Python writes as decimal text (``sys.set_int_max_str_digits``, 4300
digits by default, from Python 3.11 and 3.10.7): in a tool's result, in a model's tool
arguments, in a history, in a stored session and in a wrong setting. Each is either kept
whole or refused with an error that says so; none crashes a run with Python's own
``ValueError`` from deep inside."""

from __future__ import annotations

import re
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs
import pytest
from click.testing import CliRunner

from littleghost import Agent, Message, ToolCall, ToolResult, before_tool, manage_context, tool
from littleghost.cli import main
from littleghost.context.tokens import estimate_messages
from littleghost.errors import CorruptSessionStoreError
from littleghost.sessions import InMemorySessionStore, message_from_json, message_to_json
from littleghost.testing import ScriptedModel, text_response, tool_call_response

from .stores import KINDS, BuiltinStore, PlainStore, open_store

if TYPE_CHECKING:
    from conftest import Spans

pytestmark = pytest.mark.anyio

LIMIT = sys.get_int_max_str_digits()
LONG = 7 * 10**LIMIT + 1
"""An int of ``LIMIT + 1`` digits: one more than Python writes."""
LONG_TEXT = "7" + "0" * (LIMIT - 1) + "1"
"""Its digits (written without converting it)."""
NOT_WRITTEN = f"more than {LIMIT} digits"


@contextmanager
def digits_allowed(limit: int) -> Iterator[None]:
    """Python's int-to-str limit set to ``limit`` (0: none) for the block."""
    previous = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(limit)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(previous)


@attrs.frozen
class Total:
    value: int


@pytest.fixture(params=KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BuiltinStore]:
    async with open_store(request.param, tmp_path, request) as opened:
        assert not isinstance(opened, PlainStore)
        yield opened


def only_result(messages: tuple[Message, ...]) -> ToolResult:
    (result,) = [result for message in messages for result in message.tool_results]
    return result


@pytest.mark.parametrize(
    ("returned", "what"),
    [
        (LONG, "an int"),
        (-LONG, "an int"),
        ({"totals": [1, LONG]}, "a result holding an int"),
        ({LONG: "key"}, "a result holding an int"),
        (Total(LONG), "a result holding an int"),
    ],
    ids=["int", "negative", "nested", "key", "record"],
)
async def test_a_result_holding_an_int_too_long_to_write_is_an_error_the_model_is_told(
    returned: object, what: str
) -> None:
    """The model is told what was wrong and where the limit is set, and the run goes on;
    the tool is not said to have raised Python's conversion error."""

    class Sums(Agent):
        @tool
        def total(self) -> object:
            """The total."""
            return returned

    model = ScriptedModel([tool_call_response("total", {}), text_response("done")])
    result = await Sums(model=model).run("sum it")
    told = only_result(result.messages)
    assert told.is_error and result.output == "done"
    assert told.content == (
        f"Tool 'total' failed: ValueError: it returned {what} of {NOT_WRITTEN}, more than "
        "Python writes as text (sys.set_int_max_str_digits sets the limit)"
    )


async def test_under_a_raised_limit_such_a_result_is_its_digits() -> None:
    class Sums(Agent):
        @tool
        def total(self) -> dict[str, int]:
            """The total."""
            return {"total": LONG}

    model = ScriptedModel([tool_call_response("total", {}), text_response("done")])
    with digits_allowed(0):
        result = await Sums(model=model).run("sum it")
    assert only_result(result.messages).content == f'{{"total": {LONG_TEXT}}}'


class Counter(Agent):
    @tool
    def count(self, n: int) -> str:
        """Count to n."""
        return "counted"


async def test_arguments_a_model_writes_with_an_int_too_long_to_read_are_told_so() -> None:
    """Valid JSON, refused for the integer's length (it was told "not valid JSON")."""
    text = f'{{"n": {LONG_TEXT}}}'
    model = ScriptedModel([tool_call_response("count", text), text_response("done")])
    result = await Counter(model=model).run("count")
    told = only_result(result.messages)
    assert told.is_error and told.content == (
        "Invalid arguments for tool 'count': the arguments are not readable: it holds an "
        f"integer of {NOT_WRITTEN}, more than Python reads (sys.set_int_max_str_digits)"
    )
    assert result.messages[1].tool_calls[0].arguments == text  # kept whole


async def test_arguments_given_as_a_mapping_with_such_an_int_are_kept_whole_as_text(
    spans: Spans,
) -> None:
    """A model that hands over parsed arguments (a custom one, a hook) holding an int too
    long to write: the call is answered with an error, and the log keeps the arguments as
    text, the int in hexadecimal (nothing lost), as a store can keep them and estimates
    and telemetry can read them. The run failed with Python's ``ValueError`` (from the
    estimates, from telemetry) or with the store refusing the model's answer."""

    @manage_context(context_window_tokens=100_000)
    class Managed(Counter):
        pass

    store = InMemorySessionStore()
    model = ScriptedModel(
        [tool_call_response("count", {"n": LONG}), text_response("done")], context_window=100_000
    )
    agent = Managed(model=model, session_store=store, capture_content=True)
    result = await agent.run("count", session_id="s")
    (call,) = result.messages[1].tool_calls
    assert isinstance(call.arguments, str)
    written = re.fullmatch(r'\{"n": (0x[0-9a-f]+)\}', call.arguments)
    assert written is not None and int(written[1], 16) == LONG
    told = only_result(result.messages)
    assert told.is_error and "not valid JSON: a number in hexadecimal" in told.content
    assert result.output == "done"
    assert await store.load("s") == result.messages
    assert spans.one("execute_tool").attributes["gen_ai.tool.call.arguments"] == call.arguments


async def test_a_hook_handing_such_an_int_is_answered_as_a_model_handing_it() -> None:
    """A ``before_tool`` hook's arguments holding such an int where a ``Literal`` goes:
    the call holds them as text, as a model's does, and is answered with what is wrong
    (a message echoing the value raised Python's ``ValueError``, ending the run)."""

    class Picker(Agent):
        @tool
        def pick(self, mode: Literal[1, 2]) -> str:
            """Pick a mode."""
            return "picked"

        @before_tool
        def widen(self, call: ToolCall) -> ToolCall:
            return attrs.evolve(call, arguments={"mode": LONG})

    model = ScriptedModel([tool_call_response("pick", {"mode": 1}), text_response("done")])
    result = await Picker(model=model).run("pick")
    told = only_result(result.messages)
    assert told.is_error and result.output == "done"
    assert told.content == (
        "Invalid arguments for tool 'pick': the arguments are not valid JSON: a number in "
        "hexadecimal (0x...)"
    )


async def test_a_history_holding_such_ints_runs_with_estimates_and_telemetry(
    spans: Spans,
) -> None:
    """A history handed to a run (no store checks it) reaches the estimates and, with
    ``capture_content``, the spans: the int is in hexadecimal there, whole."""

    @manage_context(context_window_tokens=100_000)
    class Managed(Agent):
        pass

    history = [
        Message.user("count", metadata={"n": LONG}),
        Message.assistant(tool_calls=[ToolCall("c1", "count", {"n": LONG})]),
        Message.tool("c1", "counted"),
        Message.assistant("counted"),
    ]
    model = ScriptedModel([text_response("done")], context_window=100_000)
    result = await Managed(model=model, capture_content=True).run("again", history=history)
    assert result.output == "done"
    assert estimate_messages(history) > len(hex(LONG)) / 4
    (chat,) = spans.named("chat")
    assert hex(LONG) in str(chat.attributes["gen_ai.input.messages"])


async def test_a_stored_int_too_long_to_read_here_is_an_error_naming_the_limit(
    store: BuiltinStore,
) -> None:
    """Written where Python allows more digits (PostgreSQL and SQLite keep what a process
    with a raised limit writes), read where it allows fewer: the error names the limit,
    not "not valid JSON"; with the same limit the message reads back whole."""
    message = Message.user("count", metadata={"n": LONG})
    with digits_allowed(0):
        await store.append("s", [message])
        assert await store.load("s") == (message,)
    with pytest.raises(CorruptSessionStoreError) as caught:
        await store.load("s")
    assert f"holds an int of {NOT_WRITTEN}, more than this process reads" in str(caught.value)
    assert "sys.set_int_max_str_digits, or PYTHONINTMAXSTRDIGITS" in str(caught.value)
    with digits_allowed(0):
        text = message_to_json(message)
    with pytest.raises(CorruptSessionStoreError, match=NOT_WRITTEN):
        message_from_json(text)


def test_the_command_line_names_the_limit_of_a_session_it_cannot_read(tmp_path: Path) -> None:
    import anyio

    url = f"sqlite:///{tmp_path / 's.db'}"

    async def write() -> None:
        from littleghost.sessions import SQLiteSessionStore

        async with SQLiteSessionStore(tmp_path / "s.db") as sqlite:
            await sqlite.append("s", [Message.user("count", metadata={"n": LONG})])

    with digits_allowed(0):
        anyio.run(write)
    shown = CliRunner().invoke(main, ["sessions", "show", "s", "--store", url])
    assert shown.exit_code == 1 and shown.stdout == ""
    assert f"holds an int of {NOT_WRITTEN}" in shown.stderr
    assert "Traceback" not in shown.stderr


@pytest.mark.parametrize("value", [LONG, [LONG], {"k": LONG}], ids=["int", "list", "dict"])
def test_a_setting_holding_such_an_int_is_refused_at_class_definition(value: Any) -> None:
    from littleghost.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"Declared.settings\['logit_bias'\]"):
        type("Declared", (Agent,), {"settings": {"logit_bias": value}})
