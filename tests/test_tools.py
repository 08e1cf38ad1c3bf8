"""Tools: JSON schemas, argument checking and coercion, error results, truncation, parallel
calls, the RunContext parameter, timeouts, sync calls left running, and declaration errors."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import functools
import inspect
import json
import logging
import math
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator, Sequence
from typing import (
    TYPE_CHECKING,
    Annotated,
    Any,
    ClassVar,
    Generic,
    Literal,
    NamedTuple,
    NewType,
    Optional,
    TypedDict,
    TypeVar,
    Union,
)

import annotated_types as at
import anyio
import attrs
import pytest
import typing_extensions
from attrs import frozen

from littleghost import (
    Agent,
    ImagePart,
    Message,
    RunContext,
    ToolCall,
    ToolResult,
    after_tool,
    tool,
)
from littleghost.errors import ConfigurationError
from littleghost.models import ModelResponse, StopReason
from littleghost.testing import ScriptedModel, text_response, tool_call_response
from littleghost.tool_calls import invoke
from littleghost.tool_types import ToolArgumentError, coerce, json_schema, to_json
from littleghost.tools import ToolDefinition, define_tool, index_tools

from . import _hidden_context
from .timing import LATE

if sys.version_info >= (3, 11):
    from typing import NotRequired, Required
else:  # pragma: no cover - Python 3.10
    from typing_extensions import NotRequired, Required

if TYPE_CHECKING:
    from conftest import Spans

pytestmark = pytest.mark.anyio


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


@frozen
class Point:
    x: int
    y: int = 0


CLOCK = "^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9]([.][0-9]+)?)?$"
"""The pattern of a ``time``: a time of day, without a UTC offset."""


def schema_of(function: Callable[..., Any]) -> dict[str, Any]:
    """The parameters schema of ``function`` declared as a plain-function tool."""
    agent_class = type("Holder", (Agent,), {"tools": [function]})
    (spec,) = agent_class().tool_specs
    return dict(spec.parameters)


def property_of(annotation: Any) -> dict[str, Any]:
    """The schema of one parameter annotated ``annotation``."""

    def probe(value: Any) -> str:
        """Probe a type."""
        return ""

    probe.__annotations__ = {"value": annotation, "return": str}
    return dict(schema_of(probe)["properties"]["value"])


@pytest.mark.parametrize(
    ("annotation", "expected"),
    [
        (str, {"type": "string"}),
        (int, {"type": "integer"}),
        (float, {"type": "number"}),
        (bool, {"type": "boolean"}),
        (None, {"type": "null"}),
        (list[int], {"type": "array", "items": {"type": "integer"}}),
        (list, {"type": "array", "items": {}}),
        (tuple[int, ...], {"type": "array", "items": {"type": "integer"}}),
        (
            tuple[int, str],
            {
                "type": "array",
                "prefixItems": [{"type": "integer"}, {"type": "string"}],
                "minItems": 2,
                "maxItems": 2,
            },
        ),
        (dict[str, float], {"type": "object", "additionalProperties": {"type": "number"}}),
        (Optional[int], {"anyOf": [{"type": "integer"}, {"type": "null"}]}),  # noqa: UP045
        (int | str, {"anyOf": [{"type": "integer"}, {"type": "string"}]}),
        (Union[str, bool], {"anyOf": [{"type": "string"}, {"type": "boolean"}]}),  # noqa: UP007
        (Literal["a", "b", 3], {"enum": ["a", "b", 3]}),
        (Color, {"enum": ["red", "green"]}),
        (Any, {}),
        (Annotated[str, "a city name"], {"type": "string", "description": "a city name"}),
        (datetime.datetime, {"type": "string", "format": "date-time"}),
        (datetime.date, {"type": "string", "format": "date"}),
        (datetime.time, {"type": "string", "pattern": CLOCK}),
        (uuid.UUID, {"type": "string", "format": "uuid"}),
        (decimal.Decimal, {"type": "string", "pattern": "^-?[0-9]+([.][0-9]+)?$"}),
        (
            Optional[list[datetime.date]],  # noqa: UP045
            {
                "anyOf": [
                    {"type": "array", "items": {"type": "string", "format": "date"}},
                    {"type": "null"},
                ]
            },
        ),
        (
            Point,
            {
                "type": "object",
                "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0}},
                "required": ["x"],
                "additionalProperties": False,
            },
        ),
        (
            list[Point | None],
            {
                "type": "array",
                "items": {
                    "anyOf": [
                        {
                            "type": "object",
                            "properties": {
                                "x": {"type": "integer"},
                                "y": {"type": "integer", "default": 0},
                            },
                            "required": ["x"],
                            "additionalProperties": False,
                        },
                        {"type": "null"},
                    ]
                },
            },
        ),
    ],
    ids=repr,
)
def test_schema_for_each_supported_type(annotation: Any, expected: dict[str, Any]) -> None:
    """Each supported annotation maps to its JSON schema."""
    assert property_of(annotation) == expected


def forecast(city: str, days: int = 3, unit: Literal["c", "f"] = "c") -> str:
    """Get the weather forecast.

    Looks it up in the almanac.

    Args:
        city: The city, spelled out
            in full.
        days: How many days ahead.

    Returns:
        The forecast.
    """
    return f"{city}:{days}:{unit}"


def test_schema_object_shape_and_docstring() -> None:
    """Required, defaults, no extras, and Args: descriptions (continued lines joined)."""
    schema = schema_of(forecast)
    assert schema == {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city, spelled out in full."},
            "days": {"type": "integer", "description": "How many days ahead.", "default": 3},
            "unit": {"enum": ["c", "f"], "default": "c"},
        },
        "required": ["city"],
        "additionalProperties": False,
    }


@frozen
class Span:
    low: float
    high: float = math.inf


class Stretcher(Agent):
    @tool
    def stretch(
        self,
        factor: float = math.inf,
        jitter: float = math.nan,
        steps: tuple[float, ...] = (1.0, -math.inf),
        span: Span = Span(0.0),
        times: int = 2,
    ) -> str:
        """Stretch something."""
        return f"{factor} {jitter} {steps} {span} {times}"


async def test_a_default_json_cannot_carry_is_left_out_of_the_schema() -> None:
    """NaN and infinity are not JSON: a default that is or holds one is left out of the
    schema, which stays strict JSON, and a call without the argument still gets it."""
    model = ScriptedModel([tool_call_response("stretch", {}), text_response("ok")])
    await Stretcher(model=model).run("go")
    [spec] = model.requests[0].tools
    properties = json.loads(json.dumps(spec.parameters, allow_nan=False))["properties"]
    assert [name for name, schema in properties.items() if "default" in schema] == ["times"]
    [result] = tool_results(model.requests[1].messages)
    assert result.content == "inf nan (1.0, -inf) Span(low=0.0, high=inf) 2"


def test_tool_description_is_the_docstring_before_its_sections() -> None:
    """The tool's description is the docstring text before Args:/Returns:."""
    (spec,) = type("Holder", (Agent,), {"tools": [forecast]})().tool_specs
    assert (spec.name, spec.description) == (
        "forecast",
        "Get the weather forecast.\n\nLooks it up in the almanac.",
    )


def test_args_entries_with_types_and_blank_first_lines() -> None:
    """``name (type): text`` entries and descriptions starting on the next line are read."""

    def book(room: str, nights: int) -> str:
        """Book a room.

        Args:
            room (str): The room's number.
            nights:
                How many nights.
        """
        return room

    properties = schema_of(book)["properties"]
    assert properties["room"]["description"] == "The room's number."
    assert properties["nights"]["description"] == "How many nights."


def test_text_after_an_args_section_is_no_parameter_s() -> None:
    """A line indented less than the entries ends ``Args:``: a note after the section is
    not read as the last parameter's text."""

    def book(room: str, nights: int) -> str:
        """Book a room.

        Args:
            room: The room's number,
                as on its door.
            nights: How many nights.

        Bookings are final once paid.
        """
        return room

    properties = schema_of(book)["properties"]
    assert properties["room"]["description"] == "The room's number, as on its door."
    assert properties["nights"]["description"] == "How many nights."


OrderId = NewType("OrderId", str)
Rank = typing_extensions.NewType("Rank", int)
Urgent = NewType("Urgent", OrderId)


async def test_a_new_type_is_described_and_bound_as_the_type_it_is_made_from() -> None:
    """``NewType`` parameters (of a type, of another ``NewType``, inside an ``Optional`` or
    a list, ``typing_extensions``' too) have their base's schema and take its values."""
    seen: list[Any] = []

    def find(order_id: OrderId, rank: Rank, urgent: list[Urgent], old: OrderId | None) -> str:
        """Find an order."""
        seen.append((order_id, rank, urgent, old))
        return "found"

    assert schema_of(find)["properties"] == {
        "order_id": {"type": "string"},
        "rank": {"type": "integer"},
        "urgent": {"type": "array", "items": {"type": "string"}},
        "old": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    }

    class Shop(Agent):
        tools = [find]

    arguments = {"order_id": "42", "rank": 2.0, "urgent": ["7"], "old": None}
    wrong = {**arguments, "rank": "high"}
    model = ScriptedModel(
        [
            tool_call_response("find", arguments),
            tool_call_response("find", wrong),
            text_response("ok"),
        ]
    )
    results = tool_results((await Shop(model=model).run("go")).messages)
    assert seen == [("42", 2, ["7"], None)]
    assert [result.is_error for result in results] == [False, True]
    assert "rank: expected an integer, got a string" in results[1].content


async def test_a_new_type_is_an_output_type_as_its_base_is() -> None:
    model = ScriptedModel([text_response('{"result": 3}')])
    result = await Agent(model=model, output_type=Rank).run("rank it")
    assert result.output == 3
    schema = model.requests[0].output_schema
    assert schema is not None and schema.schema["properties"] == {"result": {"type": "integer"}}


def _spec(function: Callable[..., Any]) -> Any:
    (spec,) = type("Holder", (Agent,), {"tools": [function]})().tool_specs
    return spec


def test_numpy_style_parameters_are_read_and_left_out_of_the_description() -> None:
    """A NumPy-style docstring: the description is the text before its first underlined
    heading, and each ``Parameters`` entry (``x, y : type`` too) describes its parameter."""

    def book(room: str, nights: int, adults: int, children: int = 0) -> str:
        """Book a room.

        Checks the calendar first.

        Parameters
        ----------
        room : str
            The room's number,
            as on its door.
        nights : int
            How many nights.
        adults, children : int
            Who stays.

        Returns
        -------
        str
            The booking's id.
        """
        return room

    spec = _spec(book)
    assert spec.description == "Book a room.\n\nChecks the calendar first."
    properties = spec.parameters["properties"]
    assert properties["room"]["description"] == "The room's number, as on its door."
    assert properties["nights"]["description"] == "How many nights."
    assert properties["adults"]["description"] == properties["children"]["description"]
    assert properties["children"]["description"] == "Who stays."


def test_sphinx_style_fields_are_read_and_left_out_of_the_description() -> None:
    """A Sphinx-style docstring: the description is the text before its first field, and
    each ``:param [type] name:`` field describes its parameter."""

    def book(room: str, nights: int) -> str:
        """Book a room.

        :param room: The room's number,
            as on its door.
        :type room: str
        :param int nights: How many nights.
        :returns: The booking's id.
        :raises ValueError: The room is taken.
        """
        return room

    spec = _spec(book)
    assert spec.description == "Book a room."
    properties = spec.parameters["properties"]
    assert properties["room"]["description"] == "The room's number, as on its door."
    assert properties["nights"]["description"] == "How many nights."


def test_annotated_description_wins_over_the_docstring() -> None:
    """An Annotated description is kept when the docstring also describes the parameter."""

    def find(name: Annotated[str, "from Annotated"]) -> str:
        """Find something.

        Args:
            name: from the docstring
        """
        return name

    assert schema_of(find)["properties"]["name"]["description"] == "from Annotated"


def test_a_docstring_describing_a_misspelt_parameter_fails_at_class_definition() -> None:
    """An ``Args:`` entry almost like a parameter the model is told nothing of is a typo:
    the class fails naming both (the model got no description of it, silently)."""
    with pytest.raises(ConfigurationError) as caught:

        class Orders(Agent):
            @tool
            async def lookup(self, order_id: str, context: RunContext) -> str:
                """Find an order.

                Args:
                    orderId: The order's id, as on the receipt.
                    context: The run.
                """
                return order_id

    assert str(caught.value) == (
        "Orders.lookup: tool 'lookup': its docstring describes 'orderId', which is no "
        "parameter of it: did you mean 'order_id'? (the model would be told nothing of "
        "'order_id')"
    )


def test_a_docstring_describing_other_names_is_left_alone() -> None:
    """An entry like no undescribed parameter (another thing the docstring speaks of), or
    like one described otherwise (Annotated), is no typo the class fails on."""

    def find(name: Annotated[str, "from Annotated"], limit: int = 5) -> str:
        """Find something.

        Args:
            names: what older versions took
            verbose: no longer taken
            limit: how many
        """
        return name

    properties = schema_of(find)["properties"]
    assert properties["name"]["description"] == "from Annotated"
    assert properties["limit"]["description"] == "how many"


class Methods(Agent):
    @tool
    async def with_context(self, query: str, context: RunContext) -> str:
        """Search, knowing the run."""
        return f"{query} on turn {context.turn}"

    @tool(name="renamed", description="Described by the decorator.")
    def original(self) -> str:
        return "renamed ran"


def test_context_parameter_is_not_shown_and_tool_options_apply() -> None:
    """A RunContext parameter is hidden from the schema; @tool(name=, description=) override."""
    specs = {spec.name: spec for spec in Methods().tool_specs}
    assert list(specs["with_context"].parameters["properties"]) == ["query"]
    assert specs["renamed"].description == "Described by the decorator."


async def test_method_tools_get_the_context_and_renamed_tools_run() -> None:
    """A tool declaring a RunContext parameter receives it; a renamed tool runs by its new name."""
    model = ScriptedModel(
        [
            ModelResponse(
                Message.assistant(
                    tool_calls=[
                        ToolCall("c1", "with_context", {"query": "q"}),
                        ToolCall("c2", "renamed", {}),
                    ]
                ),
                StopReason.TOOL_USE,
            ),
            text_response("done"),
        ]
    )
    await Methods(model=model).run("go")
    assert [r.content for r in tool_results(model.requests[1].messages)] == [
        "q on turn 0",
        "renamed ran",
    ]


received: list[Any] = []


def take(color: Color, point: Point, pair: tuple[int, str], ratio: float, tags: set[str]) -> str:
    """Take rich arguments."""
    received.extend([color, point, pair, ratio, tags])
    return "taken"


class Rich(Agent):
    tools = [take]


async def test_arguments_are_coerced_to_python_values() -> None:
    """Enum, attrs, tuple, float and set arguments reach the tool as Python values."""
    received.clear()
    arguments = {
        "color": "green",
        "point": {"x": 1},
        "pair": [2, "b"],
        "ratio": 2,
        "tags": ["a", "a"],
    }
    model = ScriptedModel([tool_call_response("take", arguments), text_response("ok")])
    await Rich(model=model).run("go")
    assert received == [Color.GREEN, Point(1, 0), (2, "b"), 2.0, {"a"}]
    assert isinstance(received[3], float)


class Filing(Agent):
    @tool
    async def file(self, record: dict[str, Any], notes: list[Any]) -> str:
        """File a record, marking what was given."""
        record["inner"]["filed"] = True
        notes.append("seen")
        return "filed"


async def test_what_a_tool_does_to_its_arguments_leaves_the_logged_call_as_sent() -> None:
    """The arrays and objects a tool is given are its own: the log, and the request that
    shows the call to the model again, keep what the model sent."""
    sent = {"record": {"inner": {"v": 1}}, "notes": [{"n": 1}]}
    model = ScriptedModel(
        [tool_call_response("file", json.loads(json.dumps(sent))), text_response("ok")]
    )
    result = await Filing(model=model).run("go")
    assert result.messages[1].tool_calls[0].arguments == sent
    assert model.requests[1].messages[1].tool_calls[0].arguments == sent


def page(query: str, limit: int = 10, owner: str | None = "me") -> str:
    """Page through results."""
    received.extend([query, limit, owner])
    return "paged"


async def test_null_for_an_optional_parameter_is_the_parameter_left_out() -> None:
    """As in a record field: a null for an optional parameter whose type takes no null
    gives its default (strict tool calling sends every parameter); where the type takes
    null it is None; a required parameter still refuses null."""

    class Pager(Agent):
        tools = [page]

    received.clear()
    model = ScriptedModel(
        [
            tool_call_response("page", {"query": "a", "limit": None, "owner": None}),
            tool_call_response("page", {"query": None}),
            text_response("ok"),
        ]
    )
    await Pager(model=model).run("go")
    assert received == ["a", 10, None]
    (refused,) = tool_results(model.requests[2].messages)[1:]
    assert refused.is_error and "expected a string, got null" in refused.content


def tag(name: str, tags: list[str] = [], by_kind: dict[str, list[str]] = {}) -> str:  # noqa: B006
    """Tag one item."""
    tags.append(name)
    by_kind.setdefault("seen", []).append(name)
    return f"{tags} {by_kind}"


async def test_a_mutable_default_is_a_fresh_copy_for_each_call() -> None:
    """A list, dict or set default (nested values too) is copied for each call that leaves
    it out, as pydantic copies a field's: what one call, or one user's run, adds to it is
    never seen by the next, which gets the default the schema shows."""

    class Tagger(Agent):
        tools = [tag]

    answers = []
    for _ in range(2):  # two runs: what the first left must not reach the second
        model = ScriptedModel(
            [
                tool_call_response("tag", {"name": "a"}),
                tool_call_response("tag", {"name": "b", "tags": None}),
                text_response("ok"),
            ]
        )
        await Tagger(model=model).run("go")
        answers += [result.content for result in tool_results(model.requests[2].messages)]
    assert answers == ["['a'] {'seen': ['a']}", "['b'] {'seen': ['b']}"] * 2
    assert tag.__defaults__ == ([], {})


@dataclasses.dataclass(frozen=True)
class Window:
    width: int
    height: int = 1


class Label(TypedDict, total=False):
    text: Required[str]
    size: int


def frame(window: Window, label: Label) -> str:
    """Frame a window with a label."""
    received.extend([window, label])
    return "framed"


async def test_dataclass_and_typeddict_parameters() -> None:
    """A dataclass parameter arrives as its instance and a TypedDict as a checked dict;
    their schemas say which fields are required."""

    class Framer(Agent):
        tools = [frame]

    received.clear()
    arguments = {"window": {"width": 3}, "label": {"text": "hi"}}
    model = ScriptedModel(
        [
            tool_call_response("frame", arguments),
            tool_call_response("frame", {"window": {"width": "3"}, "label": {}}),
            text_response("ok"),
        ]
    )
    await Framer(model=model).run("go")
    assert received == [Window(3, 1), {"text": "hi"}]
    [spec] = model.requests[0].tools
    window, label = spec.parameters["properties"]["window"], spec.parameters["properties"]["label"]
    assert (window["required"], label["required"]) == (["width"], ["text"])
    assert label["properties"]["size"] == {"type": "integer"}
    [wrong] = tool_results(model.requests[2].messages)[1:]
    assert wrong.is_error and "window.width: expected an integer" in wrong.content


class Note(TypedDict):
    text: Annotated[str, "the text"]
    tag: Annotated[NotRequired[str], "a tag"]
    mood: NotRequired[Annotated[str, "a mood"]]


class Draft(TypedDict, total=False):
    title: Annotated[Required[str], "the title"]
    body: Required[Annotated[str, "the body"]]
    footer: Annotated[str, "a footer"]


async def test_typeddict_qualifiers_inside_or_outside_annotated() -> None:
    """``Required`` / ``NotRequired`` count in either order with ``Annotated`` (PEP 655),
    and the description is kept, in a tool parameter and an output type alike."""

    def write(note: Note, draft: Draft) -> str:
        """Write a note and a draft."""
        received.extend([note, draft])
        return "written"

    class Writer(Agent):
        tools = [write]

    received.clear()
    arguments = {"note": {"text": "n"}, "draft": {"title": "t", "body": "b"}}
    model = ScriptedModel([tool_call_response("write", arguments), text_response("ok")])
    await Writer(model=model).run("go")
    assert received == [{"text": "n"}, {"title": "t", "body": "b"}]
    [spec] = model.requests[0].tools
    note, draft = spec.parameters["properties"]["note"], spec.parameters["properties"]["draft"]
    assert (note["required"], draft["required"]) == (["text"], ["title", "body"])
    assert note["properties"]["tag"] == {"type": "string", "description": "a tag"}
    assert draft["properties"]["title"] == {"type": "string", "description": "the title"}
    typed = type("Noted", (Agent,), {"output_type": Note})()
    assert typed.output is not None and typed.output.schema.schema == note


class ExtendedNote(typing_extensions.TypedDict, total=False):
    """A ``TypedDict`` and its key qualifiers from ``typing_extensions``: on Python 3.10,
    where ``typing`` has no ``Required``, the only spelling."""

    text: typing_extensions.Required[str]
    tag: typing_extensions.ReadOnly[str]
    stamp: typing_extensions.ReadOnly[typing_extensions.Required[int]]


Size = typing_extensions.TypeAliasType("Size", int)
Kind = TypeVar("Kind")
Pair = typing_extensions.TypeAliasType("Pair", tuple[Kind, Kind], type_params=(Kind,))
Sizes = typing_extensions.TypeAliasType("Sizes", list[Size])  # type: ignore[valid-type]


async def test_typing_extensions_spellings_and_type_aliases_are_described() -> None:
    """``typing_extensions``' ``TypedDict``, ``Required`` and ``ReadOnly`` (refused as
    types that "cannot be described", on 3.10 with no other spelling), and ``type``
    aliases (Python 3.12's ``type Size = int``), in a tool parameter and an output type."""
    received: list[Any] = []

    def measure(note: ExtendedNote, sizes: Sizes) -> str:  # type: ignore[valid-type]
        """Measure."""
        received.extend([note, sizes])
        return "measured"

    class Measurer(Agent):
        tools = [measure]

    arguments = {"note": {"text": "n", "stamp": 3}, "sizes": [1, 2]}
    model = ScriptedModel([tool_call_response("measure", arguments), text_response("ok")])
    await Measurer(model=model).run("go")
    assert received == [{"text": "n", "stamp": 3}, [1, 2]]
    [spec] = model.requests[0].tools
    note = spec.parameters["properties"]["note"]
    assert note["required"] == ["text", "stamp"]
    assert note["properties"]["tag"] == {"type": "string"}
    assert spec.parameters["properties"]["sizes"] == {"type": "array", "items": {"type": "integer"}}
    typed = type("Sized", (Agent,), {"output_type": Sizes})()
    assert typed.output is not None
    paired = type("Paired", (Agent,), {"output_type": Pair[int]})()  # a generic alias
    assert paired.output is not None
    assert paired.output.schema.schema["properties"]["result"]["prefixItems"] == [
        {"type": "integer"},
        {"type": "integer"},
    ]
    assert coerce([1, 2], Pair[int], "pair") == (1, 2)
    if sys.version_info >= (3, 12):  # a recursive alias needs the lazy ``type`` statement
        names: dict[str, Any] = {}
        exec("type Nested = list[Nested] | int", names)
        with pytest.raises(ConfigurationError, match="alias Nested contains itself"):
            type("Recursive", (Agent,), {"output_type": names["Nested"]})


def tool_results(messages: Sequence[Message]) -> list[ToolResult]:
    """Every tool result in ``messages``, in order."""
    return [result for message in messages for result in message.tool_results]


class Checked(Agent):
    max_tool_result_tokens = 100

    @tool
    async def add(self, a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool
    def explode(self) -> str:
        """Always fails."""
        raise RuntimeError("kaboom")

    @tool
    async def shout(self, size: int) -> str:
        """Return a long text."""
        return "A" * (size // 2) + "B" * (size - size // 2)

    @tool
    async def paint(self, color: Color, point: Point) -> str:
        """Paint a point."""
        return "painted"


async def single_result(arguments: dict[str, Any] | str, name: str = "add") -> ToolResult:
    """Run one call of ``name`` and return the result the model saw next."""
    model = ScriptedModel(
        [tool_call_response(name, arguments, call_id="c1"), text_response("done")]
    )
    result = await Checked(model=model).run("go")
    assert result.output == "done"
    (seen,) = tool_results(model.requests[1].messages)
    assert seen.call_id == "c1"
    return seen


async def test_a_good_call_returns_the_rendered_value() -> None:
    """A valid call's result is the tool's return value rendered as text."""
    seen = await single_result({"a": 2, "b": 3})
    assert (seen.content, seen.is_error) == ("5", False)


class Colour(str, enum.Enum):
    RED = "red"


async def test_a_str_enum_member_a_tool_returns_is_its_text() -> None:
    """A ``(str, Enum)`` member is a str: its text is the result, a plain ``str`` (it was
    kept as the member, which summaries and the Anthropic adapter showed as
    ``Colour.RED`` on Python 3.11+ and as ``red`` on 3.10 and once stored)."""

    def pick() -> Colour:
        """Pick a colour."""
        return Colour.RED

    class Picker(Agent):
        tools = [pick]

    model = ScriptedModel([tool_call_response("pick", {}), text_response("ok")])
    result = await Picker(model=model).run("go")
    (seen,) = tool_results(result.messages)
    assert type(seen.content) is str and f"{seen.content}" == "red"


@dataclasses.dataclass
class DueOrder:
    colour: Colour
    due: datetime.date


async def test_a_result_holding_dates_or_decimals_is_json_with_their_text() -> None:
    """A date (ISO 8601), a ``Decimal``, a ``UUID`` inside a result are their text: one
    such value turned the whole result into Python's repr (``datetime.date(2026, 1,
    31)``, ``Colour.RED`` inside a dataclass); one alone is its text, as a str is."""

    def orders() -> dict[str, Any]:
        """List the orders."""
        return {
            "orders": [DueOrder(Colour.RED, datetime.date(2026, 1, 31))],
            "total": decimal.Decimal("12.10"),
            "id": uuid.UUID(int=1),
            "at": datetime.datetime(2026, 1, 2, 9, 30),
        }

    def due() -> datetime.date:
        """When it is due."""
        return datetime.date(2026, 1, 31)

    class Shop(Agent):
        tools = [orders, due]

    calls = (ToolCall("c1", "orders", {}), ToolCall("c2", "due", {}))
    model = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("ok"),
        ]
    )
    listed, when = tool_results((await Shop(model=model).run("go")).messages)
    assert json.loads(listed.content) == {
        "orders": [{"colour": "red", "due": "2026-01-31"}],
        "total": "12.10",
        "id": "00000000-0000-0000-0000-000000000001",
        "at": "2026-01-02T09:30:00",
    }
    assert when.content == "2026-01-31"


async def test_a_result_keyed_by_dates_or_ids_is_json_with_their_text() -> None:
    """A key JSON cannot carry (a date, a ``UUID``, an enum member) is its text, as such a
    value is: one turned the whole result into Python's repr."""

    def sales() -> dict[str, Any]:
        """Sales per day, and owners by id."""
        return {
            "per_day": {datetime.date(2026, 1, 31): 5},
            "owners": {uuid.UUID(int=1): "ada"},
            "by_colour": {Colour.RED: 2},
        }

    class Shop(Agent):
        tools = [sales]

    model = ScriptedModel([tool_call_response("sales", {}, call_id="c1"), text_response("ok")])
    (result,) = tool_results((await Shop(model=model).run("go")).messages)
    assert json.loads(result.content) == {
        "per_day": {"2026-01-31": 5},
        "owners": {"00000000-0000-0000-0000-000000000001": "ada"},
        "by_colour": {"red": 2},
    }


class Unprintable:
    """A class of the user's own, with neither fields littleghost reads nor a ``__str__``."""

    def __init__(self, number: str) -> None:
        self.number = number


class Described(Unprintable):
    def __str__(self) -> str:
        return f"order {self.number}"


@frozen
class DailySums:
    """An attrs record of sums by day."""

    by_day: dict[Any, int]


async def test_a_result_whose_keys_share_a_text_loses_no_item() -> None:
    """Keys that JSON would write as one text (a date and its ISO text, an enum member
    and its value) lose no item, in a dict or an attrs record's: such a result is
    Python's text of it, every item in."""
    day = datetime.date(2026, 1, 31)
    returned = [
        {day: 5, "2026-01-31": 6},
        {"sums": {Color.RED: 2, "red": 3}},
        DailySums({day: 5, "2026-01-31": 6}),
        [DailySums({Color.RED: 2, "red": 3})],
    ]
    results = await fetched(returned)
    assert [(result.content, result.is_error) for result in results] == [
        (str(value), False) for value in returned
    ]


async def fetched(returned: list[Any]) -> list[ToolResult]:
    """The results of one batch of calls of a tool ``fetch``, the i-th returning
    ``returned[i]``."""

    def fetch(which: int) -> Any:
        """Fetch an order."""
        return returned[which]

    class Shop(Agent):
        tools = [fetch]

    calls = tuple(ToolCall(f"c{i}", "fetch", {"which": i}) for i in range(len(returned)))
    model = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("ok"),
        ]
    )
    return tool_results((await Shop(model=model).run("go")).messages)


def uncalled() -> str:
    return "never called"


async def test_a_result_whose_text_is_only_an_address_is_an_error_result() -> None:
    """An object whose text is Python's default (``<Unprintable object at 0x...>``), alone, in
    a list or as a key, and a function or method returned uncalled (``<bound method ... of
    <... at 0x...>>``), tell the model nothing: each is an error result naming its type
    (the model was given the address as if it were the answer); an object with a
    ``__str__`` of its own is its text."""
    returned: list[Any] = [
        Unprintable("42"),
        [Unprintable("42")],
        {Unprintable("42"): 1},
        uncalled,
        Unprintable("42").__init__,
        {"next": Unprintable("42").__init__},
        Described("42"),
    ]
    results = await fetched(returned)
    expected = [
        ("it returned", "Unprintable"),
        ("its result holds", "Unprintable"),
        ("its result holds", "Unprintable"),
        ("it returned", "function"),
        ("it returned", "method"),
        ("its result holds", "method"),
    ]
    for result, (what, kind) in zip(results[:-1], expected, strict=True):
        assert result.is_error
        told = f"{what} a value of type {kind}, whose text is only its type and address"
        assert told in result.content
    assert (results[-1].content, results[-1].is_error) == ("order 42", False)


class Misprinted(Unprintable):
    """An object whose ``__str__`` fails: its number is a str, not the float it formats."""

    def __str__(self) -> str:
        return f"order of {self.number:.2f} EUR"


@dataclasses.dataclass
class Box:
    content: Any


@dataclasses.dataclass
class Guarded:
    order: str
    lock: Any


async def test_a_dataclass_result_s_fields_are_made_json_as_they_are() -> None:
    """A dataclass result's fields are read as they are (never deep-copied): one that
    cannot be copied (a lock) is judged as any value is, an address being no result,
    not the whole result's Python text; bytes in any container are UTF-8 text."""
    results = await fetched(
        [
            Guarded("42", threading.Lock()),
            Guarded("42", bytearray(b"caf\xc3\xa9")),
            [memoryview(b"tea"), Box(Box("ok"))],
        ]
    )
    assert results[0].is_error
    assert "its result holds a value of type lock" in results[0].content
    assert [(result.content, result.is_error) for result in results[1:]] == [
        ('{"order": "42", "lock": "café"}', False),
        ('["tea", {"content": {"content": "ok"}}]', False),
    ]


async def test_a_result_holding_a_value_whose_text_fails_is_the_tools_failure() -> None:
    """A value whose ``str()`` raises fails the call with what it raised, alone or held
    in a list, a record or as a key, whatever it raised: the model is never given
    Python's text of the whole result, with that value's type and address in it."""
    returned: list[Any] = [
        Misprinted("42"),
        [Misprinted("42")],
        {"order": Misprinted("42")},
        {Misprinted("42"): 1},
        Box(Misprinted("42")),
        [CodedError()],
    ]
    results = await fetched(returned)
    failures = [("ValueError", "Unknown format code 'f' for object of type 'str'")] * 5
    failures.append(("TypeError", "__str__ returned non-string (type int)"))
    for result, (kind, message) in zip(results, failures, strict=True):
        assert (result.content, result.is_error) == (
            f"Tool 'fetch' failed: {kind}: {message}",
            True,
        )
        assert " at 0x" not in result.content


@dataclasses.dataclass
class Stay:
    arrive: datetime.date
    nights: int
    check_in: datetime.time | None = None


class Bookings(Agent):
    booked: list[Any]

    @tool
    def book(
        self,
        at: datetime.datetime,
        guest: uuid.UUID,
        deposit: decimal.Decimal,
        stay: Stay,
        holds: list[datetime.datetime] | None = None,
        until: datetime.date = datetime.date(2026, 1, 31),
        fee: decimal.Decimal = decimal.Decimal("1E+1"),
    ) -> dict[str, Any]:
        """Book a stay."""
        self.booked.append((at, guest, deposit, stay, holds, until, fee))
        return {"at": at, "guest": guest, "deposit": deposit * 2, "fee": fee}


GUEST = "8f14e45f-ceea-467f-a9f3-3b2a3ee2c4f1"


async def booked(arguments: dict[str, Any]) -> tuple[Bookings, ToolResult]:
    """A ``Bookings`` agent after the model called ``book`` with ``arguments``, and the
    call's result."""
    model = ScriptedModel([tool_call_response("book", arguments), text_response("done")])
    agent = Bookings(model=model)
    agent.booked = []
    (result,) = tool_results((await agent.run("go")).messages)
    return agent, result


async def test_dates_times_uuids_and_decimals_arrive_as_their_python_types() -> None:
    """A datetime is RFC 3339 with its offset ('Z' too, on Python 3.10 as on later ones:
    the value is aware, in the zone given); a date, a time of day (naive), a UUID and
    a Decimal (a string, or an integer) arrive as such, in records and lists too."""
    agent, result = await booked(
        {
            "at": "2026-05-01T09:30:00Z",
            "guest": GUEST.upper(),
            "deposit": "12.50",
            "stay": {"arrive": "2026-05-01", "nights": 2, "check_in": "15:00"},
            "holds": ["2026-04-30 18:00:00.1234567+02:00", "2026-04-30T08:00z"],
            "fee": 7,
        }
    )
    utc, paris = datetime.timezone.utc, datetime.timezone(datetime.timedelta(hours=2))
    assert agent.booked == [
        (
            datetime.datetime(2026, 5, 1, 9, 30, tzinfo=utc),
            uuid.UUID(GUEST),
            decimal.Decimal("12.50"),
            Stay(datetime.date(2026, 5, 1), 2, datetime.time(15, 0)),
            [
                datetime.datetime(2026, 4, 30, 18, 0, 0, 123456, tzinfo=paris),
                datetime.datetime(2026, 4, 30, 8, 0, tzinfo=utc),
            ],
            datetime.date(2026, 1, 31),
            decimal.Decimal("7"),
        )
    ]
    assert json.loads(result.content) == {
        "at": "2026-05-01T09:30:00+00:00",
        "guest": GUEST,
        "deposit": "25.00",
        "fee": "7",
    }


def test_a_default_date_or_decimal_is_shown_as_its_string() -> None:
    """A default the schema shows is the string the model would send: ISO 8601, and a
    Decimal in plain notation, as its pattern takes it."""
    (spec,) = Bookings(model=ScriptedModel([])).tool_specs
    properties = spec.parameters["properties"]
    assert properties["until"] == {"type": "string", "format": "date", "default": "2026-01-31"}
    assert properties["fee"]["default"] == "10"
    assert properties["stay"]["properties"]["check_in"] == {
        "anyOf": [{"type": "string", "pattern": CLOCK}, {"type": "null"}],
        "default": None,
    }
    assert spec.parameters["required"] == ["at", "guest", "deposit", "stay"]


ARRIVING = {"at": "2026-05-01T09:30:00Z", "guest": GUEST, "deposit": "1"}
STAY = {"arrive": "2026-05-01", "nights": 1}


@pytest.mark.parametrize(
    ("arguments", "told"),
    [
        (
            {**ARRIVING, "at": "2026-05-01T09:30:00", "stay": STAY},
            "at: expected a date and time with its UTC offset (RFC 3339: "
            "2025-05-01T09:30:00+02:00, or Z for UTC), got '2026-05-01T09:30:00'",
        ),
        ({**ARRIVING, "at": "20260501T093000Z", "stay": STAY}, "got '20260501T093000Z'"),
        ({**ARRIVING, "at": "2026-05-01T09:30:00+24:00", "stay": STAY}, "got '2026-05-01T09"),
        ({**ARRIVING, "at": 1770000000, "stay": STAY}, "at: expected a date and time"),
        (
            {**ARRIVING, "stay": {**STAY, "arrive": "2026-02-30"}},
            "stay.arrive: expected a date (2025-05-01), got '2026-02-30'",
        ),
        (
            {**ARRIVING, "stay": {**STAY, "check_in": "15:00Z"}},
            "stay.check_in: matches none of the allowed types (stay.check_in: expected a time "
            "of day without a UTC offset (09:30 or 09:30:15.5), got '15:00Z'; stay.check_in: "
            "expected null, got a string)",
        ),
        (
            {**ARRIVING, "guest": "{" + GUEST + "}", "stay": STAY},
            "guest: expected a UUID (8-4-4-4-12 hex digits), got '{8f14e45f",
        ),
        (
            {**ARRIVING, "deposit": 12.5, "stay": STAY},
            'deposit: expected a decimal number as a string ("12.50"), got a number',
        ),
        ({**ARRIVING, "deposit": "1e3", "stay": STAY}, "got '1e3'"),
        ({**ARRIVING, "deposit": "NaN", "stay": STAY}, "got 'NaN'"),
        ({**ARRIVING, "deposit": True, "stay": STAY}, "got a boolean"),
        ({**ARRIVING, "holds": ["2026-05-01"], "stay": STAY}, "holds[0]: expected a date and"),
    ],
)
async def test_a_malformed_date_uuid_or_decimal_is_an_error_result(
    arguments: dict[str, Any], told: str
) -> None:
    """What does not fit is told where and what was expected; the tool is not called."""
    agent, result = await booked(arguments)
    assert agent.booked == []
    assert result.is_error
    assert result.content.startswith("Invalid arguments for tool 'book': ")
    assert told in result.content


class Reminders(Agent):
    asked: list[Any]

    @tool
    def remind(
        self, after: datetime.timedelta, every: datetime.timedelta = datetime.timedelta(days=7)
    ) -> dict[str, Any]:
        """Set a reminder."""
        self.asked.append((after, every))
        return {"in": after, "then_every": every, "late_by": -datetime.timedelta(seconds=90)}


async def reminded(arguments: dict[str, Any]) -> tuple[list[Any], ToolResult]:
    model = ScriptedModel([tool_call_response("remind", arguments), text_response("done")])
    agent = Reminders(model=model)
    agent.asked = []
    (result,) = tool_results((await agent.run("go")).messages)
    return agent.asked, result


async def test_a_duration_travels_as_an_iso_8601_string() -> None:
    """A ``timedelta`` is described as a ``duration`` string, arrives from one (weeks,
    days, hours, minutes, seconds with a fraction, a sign) and goes back as one."""
    (spec,) = Reminders(model=ScriptedModel([])).tool_specs
    assert spec.parameters["properties"]["after"] == {"type": "string", "format": "duration"}
    assert spec.parameters["properties"]["every"]["default"] == "P7D"
    asked, result = await reminded({"after": "P1W2DT3H4M5.25S", "every": "-PT30M"})
    assert asked == [
        (
            datetime.timedelta(days=9, hours=3, minutes=4, seconds=5.25),
            -datetime.timedelta(minutes=30),
        )
    ]
    assert json.loads(result.content) == {
        "in": "P9DT3H4M5.25S",
        "then_every": "-PT30M",
        "late_by": "-PT1M30S",
    }


@pytest.mark.parametrize(
    "after", ["P1M", "P1Y", "PT1.5H", "P", "PT", "P1DT", "90", "P9999999999D", 90]
)
async def test_a_duration_that_does_not_fit_is_an_error_result(after: object) -> None:
    """Years and months (of no fixed length), fractions but of seconds, an empty duration,
    a bare number and one past ``timedelta``'s range are told to the model."""
    asked, result = await reminded({"after": after})
    assert asked == [] and result.is_error
    assert "after: expected a duration (ISO 8601 in weeks, days, hours" in result.content


async def test_a_long_malformed_date_is_abbreviated_in_the_error() -> None:
    _, result = await booked({**ARRIVING, "at": "2026-" + "9" * 5000, "stay": STAY})
    assert result.is_error and len(result.content) < 400


async def test_a_result_with_a_lone_surrogate_enters_the_log_as_utf8_can_carry_it() -> None:
    """A file name that is not UTF-8, as ``os.listdir`` reads it (``caf\\udce9``), in
    what a tool returns or raises: no UTF-8 can carry a lone surrogate, so the SDKs failed
    the next model call with ``UnicodeEncodeError``, and every later run of the session.
    It enters the log as U+FFFD; a pair written as two surrogates is joined."""

    def listing() -> list[str]:
        """List the files."""
        return ["caf\udce9.txt", "\ud83d\ude00.txt"]

    def opening() -> str:
        """Open the file."""
        raise FileNotFoundError("no file caf\udce9.txt")

    class Files(Agent):
        tools = [listing, opening]

    calls = (ToolCall("c1", "listing", {}), ToolCall("c2", "opening", {}))
    model = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("ok"),
        ]
    )
    result = await Files(model=model).run("go")
    assert [seen.content for seen in tool_results(result.messages)] == [
        '["caf\ufffd.txt", "\U0001f600.txt"]',
        "Tool 'opening' failed: FileNotFoundError: no file caf\ufffd.txt",
    ]


@pytest.mark.parametrize(
    ("arguments", "name", "fragment"),
    [
        ({"a": 1}, "nothing_like_it", "Unknown tool 'nothing_like_it'"),
        ('{"a": 1, "b":', "add", "not valid JSON"),
        ("[1, 2]", "add", "must be a JSON object"),
        ({"a": "one", "b": 2}, "add", "a: expected an integer, got a string"),
        ({"a": 1}, "add", "missing required argument 'b'"),
        ({"a": 1, "b": 2, "c": 3}, "add", "unexpected argument 'c'"),
        ({"a": True, "b": 2}, "add", "a: expected an integer, got a boolean"),
        ({"color": "blue", "point": {"x": 1}}, "paint", "color: expected one of ['red', 'green']"),
        ({"color": "red", "point": {"y": 1}}, "paint", "point: missing field 'x'"),
        ({"color": "red", "point": {"x": 1, "z": 2}}, "paint", "point: unexpected field 'z'"),
        ({}, "explode", "RuntimeError: kaboom"),
    ],
)
async def test_bad_calls_become_error_results(
    arguments: dict[str, Any] | str, name: str, fragment: str
) -> None:
    """Unknown tools, bad JSON, schema mismatches and raising tools become error results."""
    seen = await single_result(arguments, name)
    assert seen.is_error
    assert fragment in seen.content


async def test_every_problem_of_a_calls_arguments_is_told_at_once() -> None:
    """The model is told every argument that does not fit, a record's fields too, not
    the first problem alone, so one more call can mend them all."""
    seen = await single_result({"c": 3, "a": "one"}, "add")
    assert seen.is_error and seen.content == (
        "Invalid arguments for tool 'add': unexpected argument 'c'; a: expected an integer, "
        "got a string; missing required argument 'b'"
    )
    seen = await single_result({"a": 1, "b": 2, **{f"x{i:02}": i for i in range(30)}}, "add")
    assert seen.content.endswith("unexpected argument 'x19'; unexpected argument: 10 more")
    seen = await single_result({"color": "blue", "point": {"z": 2}}, "paint")
    assert seen.content.endswith(
        "color: expected one of ['red', 'green'], got 'blue'; point: unexpected field 'z'; "
        "point: missing field 'x'"
    )


async def test_unknown_tool_result_lists_the_available_tools() -> None:
    """The error for an unknown tool tells the model which tools exist."""
    seen = await single_result({}, "nope")
    assert "add, explode, paint, shout" in seen.content


class APIError(Exception):
    """An exception whose message needs attributes its raise site forgot to set."""

    def __str__(self) -> str:
        return f"{self.status}: {self.detail}"  # type: ignore[attr-defined]


class UnprintableRefusal(ValueError):
    """A refusal whose message needs attributes its raise site forgot to set."""

    def __str__(self) -> str:
        return f"{self.status}: {self.detail}"  # type: ignore[attr-defined]


class CodedError(Exception):
    def __str__(self) -> str:
        return 404  # type: ignore[return-value]


class Shade(enum.Enum):
    LIGHT = "light"
    DARK = "dark"

    @classmethod
    def _missing_(cls, value: object) -> Shade:
        raise LookupError(f"no shade {value!r}")


@frozen
class Interval:
    low: int
    high: int

    def __attrs_post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError("low is above high")


@frozen
class Parcel:
    weight: int

    def __attrs_post_init__(self) -> None:
        if self.weight < 0:
            raise UnprintableRefusal()
        if self.weight == 0:
            raise ValueError()


@dataclasses.dataclass(frozen=True)
class Badge:
    name: str

    def __hash__(self) -> int:
        raise APIError()


class Fussy(Agent):
    @tool
    async def ship(self, parcel: Parcel) -> str:
        """Ship a parcel."""
        return "shipped"

    @tool
    async def pin(self, badges: set[Badge]) -> str:
        """Pin badges."""
        return "pinned"

    @tool
    async def tag(self, tags: set, groups: frozenset[Any] = frozenset()) -> str:  # type: ignore[type-arg]
        """Tag things."""
        return ",".join(sorted(map(str, tags | groups)))

    @tool
    async def shade(self, shade: Shade) -> str:
        """Pick a shade."""
        return shade.value

    @tool
    async def measure(self, interval: Interval) -> str:
        """Measure an interval."""
        return str(interval.high - interval.low)

    @tool
    async def scale(self, factor: float) -> str:
        """Scale by a factor."""
        return str(factor)


async def fussy_result(arguments: dict[str, Any] | str, name: str) -> ToolResult:
    """Run one call of a ``Fussy`` tool; the run must finish normally."""
    model = ScriptedModel(
        [tool_call_response(name, arguments, call_id="c1"), text_response("done")]
    )
    result = await Fussy(model=model).run("go")
    assert result.output == "done"
    (seen,) = tool_results(model.requests[1].messages)
    return seen


@pytest.mark.parametrize(
    ("arguments", "name", "fragment"),
    [
        ({"tags": [[1], [2]]}, "tag", "tags: a set cannot hold these items"),
        ({"tags": [], "groups": [{"a": 1}]}, "tag", "groups: a set cannot hold these items"),
        ({"shade": "pale"}, "shade", "shade: expected one of ['light', 'dark'], got 'pale'"),
        ({"interval": {"low": 3, "high": 1}}, "measure", "interval: low is above high"),
        ({"factor": 10**400}, "scale", "factor: the number is too large"),
        ("[" * 100_000, "scale", "the arguments are nested more than 100 levels deep"),
        ('{"factor": NaN}', "scale", "the arguments are not valid JSON: NaN is not a JSON number"),
        ('{"factor": -Infinity}', "scale", "valid JSON: -Infinity is not a JSON number"),
        ('{"factor": 1e400}', "scale", "the number 1e400 is too large for a float"),
        ({"factor": float("inf")}, "scale", "valid JSON: Infinity is not a JSON number"),
        (
            {"parcel": {"weight": -1}},
            "ship",
            "parcel: UnprintableRefusal (its message could not be shown)",
        ),
        ({"parcel": {"weight": 0}}, "ship", "parcel: ValueError"),
        (
            {"badges": [{"name": "a"}]},
            "pin",
            "badges: a set cannot hold these items (APIError (its message could not be shown))",
        ),
    ],
    ids=[
        "set",
        "frozenset",
        "enum-missing",
        "attrs",
        "float",
        "deep-json",
        "nan",
        "minus-infinity",
        "1e400",
        "inf-mapping",
        "unprintable",
        "empty-message",
        "set-hash",
    ],
)
async def test_arguments_that_break_conversion_become_error_results(
    arguments: dict[str, Any] | str, name: str, fragment: str
) -> None:
    """Unhashable set items, an Enum that raises anything, an attrs constructor that
    refuses (told by its type when its message is empty or cannot be shown), a number
    too large for a float, JSON nested too deep and numbers JSON has not (NaN, infinity,
    whether sent as text or parsed) are answered, never raised."""
    seen = await fussy_result(arguments, name)
    assert seen.is_error
    assert f"Invalid arguments for tool {name!r}" in seen.content
    assert fragment in seen.content


def test_a_float_parameter_refuses_a_number_that_is_not_finite() -> None:
    """A non-finite float that reaches the check (from a hook, say) does not fit."""
    with pytest.raises(ToolArgumentError, match="factor: expected a finite number, got nan"):
        coerce(float("nan"), float, "factor")


async def test_fitting_arguments_still_convert() -> None:
    """The same tools run with arguments that fit."""
    assert (await fussy_result({"tags": ["b", "a", "b"], "groups": [1]}, "tag")).content == "1,a,b"
    assert (await fussy_result({"shade": "dark"}, "shade")).content == "dark"
    assert (await fussy_result({"interval": {"low": 1, "high": 4}}, "measure")).content == "3"
    assert (await fussy_result({"factor": 10**300}, "scale")).content == str(1e300)


async def typed_result(annotation: Any, value: Any) -> ToolResult:
    """Run one call of a tool taking ``annotation``; the result shows what it received."""

    def choose(choice: Any) -> str:
        """Choose."""
        return f"{choice!r} {type(choice).__name__}"

    choose.__annotations__["choice"] = annotation

    class Chooser(Agent):
        tools = [choose]

    model = ScriptedModel([tool_call_response("choose", {"choice": value}), text_response("done")])
    await Chooser(model=model).run("go")
    (seen,) = tool_results(model.requests[1].messages)
    return seen


@pytest.mark.parametrize(
    ("annotation", "value", "received"),
    [
        (Literal[1, True], 1, "1 int"),
        (Literal[1, True], True, "True bool"),
        (Literal[0, False], 0, "0 int"),
        (Literal[0, False], False, "False bool"),
        (Literal[1], 1.0, "1 int"),
        (Literal[1, "1"], "1", "'1' str"),
    ],
)
async def test_a_literal_takes_the_member_of_the_same_json_type_and_value(
    annotation: Any, value: Any, received: str
) -> None:
    """A boolean is not the number it equals, and the tool gets the Literal's own member."""
    assert (await typed_result(annotation, value)).content == received


@pytest.mark.parametrize(
    ("annotation", "value"),
    [(Literal[1], True), (Literal[True], 1), (Literal[0], False), (Literal["1"], 1)],
)
async def test_a_literal_refuses_an_equal_value_of_another_json_type(
    annotation: Any, value: Any
) -> None:
    seen = await typed_result(annotation, value)
    assert (
        seen.is_error and f"choice: expected one of {list(annotation.__args__)!r}" in seen.content
    )


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Ratio(enum.Enum):
    HALF = 0.5
    WHOLE = 1.0


@pytest.mark.parametrize(
    ("annotation", "value", "received"),
    [
        (Level, 2, "<Level.HIGH: 2> Level"),
        (Ratio, 1.0, "<Ratio.WHOLE: 1.0> Ratio"),
        (Ratio, 1, "<Ratio.WHOLE: 1.0> Ratio"),
    ],
)
async def test_an_enum_takes_the_value_of_a_member_with_its_json_type(
    annotation: Any, value: Any, received: str
) -> None:
    assert (await typed_result(annotation, value)).content == received


@pytest.mark.parametrize(
    ("annotation", "value"),
    [(Level, True), (Level, 1.0), (Level, "1"), (Level, [1]), (Ratio, True), (Ratio, 0)],
)
async def test_an_enum_refuses_an_equal_value_of_another_type(annotation: Any, value: Any) -> None:
    """A boolean is no int member, and a float is no int member it equals (an int may be
    a float member, as an int fits a float parameter)."""
    seen = await typed_result(annotation, value)
    allowed = [member.value for member in annotation]
    assert seen.is_error and f"choice: expected one of {allowed!r}, got {value!r}" in seen.content


async def test_a_long_result_is_cut_in_the_middle_with_a_marker() -> None:
    """A result over max_tool_result_tokens keeps its head and tail around a marker."""
    seen = await single_result({"size": 4000}, "shout")
    head, marker, tail = re.fullmatch(
        r"(A+)\n(\[… \d+ tokens truncated …\])\n(B+)", seen.content
    ).groups()  # type: ignore[union-attr]
    assert (len(head), len(tail)) == (200, 200)
    assert marker == "[… 900 tokens truncated …]"
    assert not seen.is_error


async def test_a_long_result_beyond_ascii_is_cut_to_its_estimated_tokens() -> None:
    """A character beyond ASCII weighs more in the default estimate (a CJK one a token), so
    a Japanese result is cut to about ``max_tool_result_tokens`` of it, and the marker
    counts what was cut the same way."""

    class Wide(Agent):
        max_tool_result_tokens = 100

        @tool
        def read(self) -> str:
            """Read a page."""
            return "東" * 2_000 + "京" * 2_000

    model = ScriptedModel([tool_call_response("read", {}, call_id="c1"), text_response("done")])
    await Wide(model=model).run("go")
    (seen,) = tool_results(model.requests[1].messages)
    head, marker, tail = re.fullmatch(
        r"(東+)\n(\[… \d+ tokens truncated …\])\n(京+)", seen.content
    ).groups()  # type: ignore[union-attr]
    assert (len(head), len(tail)) == (50, 50)
    assert marker == "[… 3900 tokens truncated …]"


@pytest.mark.parametrize(
    ("text", "ends"),
    [
        ("标题" * 1_000 + "x" * 100_000 + "结尾" * 1_000, ("标题" * 25, "结尾" * 25)),
        ("x" * 10_000 + "中文" * 20_000 + "y" * 10_000, ("x" * 200, "y" * 200)),
    ],
    ids=["CJK ends", "ASCII ends"],
)
async def test_a_result_mixing_scripts_keeps_max_tool_result_tokens_at_its_ends(
    text: str, ends: tuple[str, str]
) -> None:
    """Each end keeps half of ``max_tool_result_tokens`` by its own weight: sized at the
    whole text's mean, a result with a Chinese header and footer around an English log
    kept several times the limit, one the other way round a fraction of it."""

    class Mixed(Agent):
        max_tool_result_tokens = 100

        @tool
        def read(self) -> str:
            """Read a log."""
            return text

    model = ScriptedModel([tool_call_response("read", {}, call_id="c1"), text_response("done")])
    await Mixed(model=model).run("go")
    (seen,) = tool_results(model.requests[1].messages)
    cut = re.fullmatch(r"(.*)\n\[… \d+ tokens truncated …\]\n(.*)", seen.content)
    assert cut is not None and cut.groups() == ends


async def test_a_short_result_is_not_cut() -> None:
    """A result within max_tool_result_tokens is passed as it is."""
    seen = await single_result({"size": 400}, "shout")
    assert seen.content == "A" * 200 + "B" * 200


HUGE = "z" * 100_000
"""A value far longer than any message should echo (25 000 tokens)."""


@frozen
class Ticket:
    priority: str

    def __attrs_post_init__(self) -> None:
        if self.priority not in ("low", "high"):
            raise ValueError(f"no priority {self.priority}")  # echoes the whole value


class Echoes(Agent):
    """Default cap (10 000 tokens): what the library echoes must be short on its own."""

    @tool
    async def mode(self, mode: Literal["fast", "slow"], shade: Shade = Shade.DARK) -> str:
        """Set the mode."""
        return "ok"

    @tool
    async def count(self, counts: dict[str, int], point: Point | None = None) -> str:
        """Count things."""
        return "ok"

    @tool
    async def scale(self, factor: float) -> str:
        """Scale by a factor."""
        return "ok"


@pytest.mark.parametrize(
    ("name", "arguments", "fragment"),
    [
        ("mode", {"mode": HUGE}, "mode: expected one of ['fast', 'slow'], got 'zzz"),
        ("mode", {"mode": "fast", "shade": HUGE}, "shade: expected one of ['light', 'dark']"),
        ("mode", {"mode": "fast", HUGE: 1}, "unexpected argument 'zzz"),
        ("count", {"counts": {}, "point": {"x": 1, HUGE: 2}}, "point: unexpected field 'zzz"),
        ("count", {"counts": {HUGE: "x"}}, "counts.zzz"),
        ("scale", '{"factor": 1' + "0" * 100_000 + ".0}", "the number 1000"),
        (HUGE, {}, "Unknown tool 'zzz"),
    ],
    ids=["literal", "enum", "argument", "field", "key", "number", "tool"],
)
async def test_an_argument_error_shortens_the_value_it_echoes(
    name: str, arguments: dict[str, Any] | str, fragment: str
) -> None:
    """A model's long value (or key, or tool name) is echoed abbreviated, not whole."""
    model = ScriptedModel(
        [tool_call_response(name, arguments, call_id="c1"), text_response("done")]
    )
    await Echoes(model=model).run("go")
    (seen,) = tool_results(model.requests[1].messages)
    assert seen.is_error and fragment in seen.content
    assert len(seen.content) < 500 and "..." in seen.content


class CutEverywhere(Agent):
    max_tool_result_tokens = 25

    @tool
    async def file(self, ticket: Ticket) -> str:
        """File a ticket."""
        return "filed"

    @after_tool
    def expand(self, result: ToolResult) -> ToolResult | None:
        if result.content == "filed":
            return attrs.evolve(result, content=HUGE)
        return None


@pytest.mark.parametrize(
    ("arguments", "start"),
    [({"ticket": {"priority": "low"}}, "zzz"), ({"ticket": {"priority": HUGE}}, "Invalid")],
    ids=["after_tool-replacement", "validator-echo"],
)
async def test_every_result_is_cut_to_the_cap_as_it_enters_the_log(
    arguments: dict[str, Any], start: str
) -> None:
    """An after_tool hook's replacement and an error text the library writes are cut to
    max_tool_result_tokens, as a tool's own result is: in the log and in what the model
    is sent."""
    model = ScriptedModel(
        [tool_call_response("file", arguments, call_id="c1"), text_response("done")]
    )
    result = await CutEverywhere(model=model).run("go")
    (stored,) = tool_results(result.messages)
    assert tool_results(model.requests[1].messages) == [stored]
    assert stored.content.startswith(start) and "tokens truncated" in stored.content
    assert len(stored.content) < 200


async def test_after_tool_hooks_get_the_whole_result() -> None:
    """The cut is made as the result enters the log, after the hooks."""
    seen: list[int] = []

    class Measured(Checked):
        @after_tool
        def measure(self, result: ToolResult) -> None:
            seen.append(len(result.content))

    model = ScriptedModel(
        [tool_call_response("shout", {"size": 4000}, call_id="c1"), text_response("done")]
    )
    result = await Measured(model=model).run("go")
    assert seen == [4000]
    (stored,) = tool_results(result.messages)
    assert "tokens truncated" in stored.content


class Reports(Agent):
    @tool
    async def summary(self, table: str) -> str:
        """Summarize a table."""
        return f"{table}: 2 rows"


def rows(table: str) -> Iterator[str]:
    """Rows of a table."""
    yield f"{table}: row 1"


async def events(topic: str) -> AsyncIterator[str]:
    """Recent events of a topic."""
    yield f"{topic}: event 1"


def test_a_generator_method_tool_fails_at_decoration() -> None:
    """A tool returns its result: a generator (sync or async) fails naming the fix."""
    with pytest.raises(ConfigurationError, match="tool 'rows' is a generator function"):

        class Rows(Agent):
            @tool
            def rows(self, table: str) -> Iterator[str]:
                """Rows of a table."""
                yield table

    with pytest.raises(ConfigurationError, match=r"'events' is a generator .* \(a list, say\)"):

        class Events(Agent):
            @tool
            async def events(self, topic: str) -> AsyncIterator[str]:
                """Recent events of a topic."""
                yield topic


@pytest.mark.parametrize("function", [rows, events], ids=["generator", "async-generator"])
def test_a_generator_function_tool_fails_at_class_definition_or_construction(
    function: Callable[..., Any],
) -> None:
    where = f"tool {function.__name__!r} is a generator function"
    with pytest.raises(ConfigurationError, match=where):
        type("Bad", (Agent,), {"tools": [function]})
    with pytest.raises(ConfigurationError, match=where):
        Reports(tools=[function])


def listed(function: Callable[..., Any]) -> Callable[..., Any]:
    """A sync decorator that hands on what ``function`` returns."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize(
    ("function", "kind"), [(rows, "a generator"), (events, "an async generator")]
)
async def test_a_tool_that_returns_a_generator_gets_an_error_result(
    function: Callable[..., Any], kind: str
) -> None:
    """A generator behind a decorator is not the tool's result: the model is told so,
    not shown the generator's repr as a success."""
    name = function.__name__
    model = ScriptedModel(
        [
            tool_call_response(name, {"table": "t"} if name == "rows" else {"topic": "t"}),
            text_response("done"),
        ]
    )
    result = await Reports(model=model, tools=[listed(function)]).run("go")
    (seen,) = tool_results(result.messages)
    assert seen.is_error and f"it returned {kind}, whose items" in seen.content
    assert "object at 0x" not in seen.content


async def test_a_tool_that_returns_an_image_gets_an_error_result() -> None:
    """A result is text: an image's bytes reached the model as some 20 000 replacement
    characters, as a success, on every later call of the run."""

    def screenshot() -> ImagePart:
        """Take a screenshot."""
        return ImagePart(data=b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 64, media_type="image/png")

    def shots() -> dict[str, list[ImagePart]]:
        """Take screenshots."""
        return {"shots": [ImagePart(url="https://example.com/shot.png")]}

    class Screens(Agent):
        tools = [screenshot, shots]

    calls = (ToolCall("c1", "screenshot", {}), ToolCall("c2", "shots", {}))
    model = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("ok"),
        ]
    )
    seen = tool_results((await Screens(model=model).run("go")).messages)
    for name, result in zip(("screenshot", "shots"), seen, strict=True):
        assert result.is_error
        assert result.content == (
            f"Tool '{name}' failed: TypeError: it returned an image, which a tool result "
            "cannot carry (a result is text); return what the model needs to know of it"
        )


async def test_a_tool_that_returns_an_image_inside_a_record_gets_an_error_result() -> None:
    """An attrs record's fields were made JSON before an image among them was seen: its
    bytes still reached the model as replacement characters, as a success."""

    @frozen
    class Shot:
        title: str
        image: ImagePart

    def shot() -> Shot:
        """Take a screenshot with its title."""
        return Shot("home", ImagePart(data=b"\x89PNG\r\n\x1a\n" + bytes(range(256))))

    class Screens(Agent):
        tools = [shot]

    model = ScriptedModel([tool_call_response("shot", {}, call_id="c1"), text_response("ok")])
    (result,) = tool_results((await Screens(model=model).run("go")).messages)
    assert result.is_error
    assert "it returned an image" in result.content


async def test_a_tool_that_returns_images_in_a_records_list_gets_an_error_result() -> None:
    """``attrs.asdict`` takes an image in a record's list or dict apart as a record of
    its own: its bytes reached the model as replacement characters, as a success."""

    @frozen
    class Album:
        title: str
        pictures: list[ImagePart]

    def album() -> Album:
        """Show the holiday pictures."""
        return Album("trip", [ImagePart(data=b"\x89PNG\r\n\x1a\n" + bytes(range(256)))])

    class Screens(Agent):
        tools = [album]

    model = ScriptedModel([tool_call_response("album", {}, call_id="c1"), text_response("ok")])
    (result,) = tool_results((await Screens(model=model).run("go")).messages)
    assert result.is_error
    assert "it returned an image" in result.content


class Lazy(Agent):
    @tool
    async def unawaited(self) -> str:
        """Fetch the data (its await left out)."""
        return self.fetch()  # type: ignore[return-value]

    async def fetch(self) -> str:
        return "the data"

    @tool
    def mapped(self) -> list[int]:
        """Double some numbers (their list never made)."""
        return map(lambda n: 2 * n, [1, 2])  # type: ignore[return-value]


async def test_a_coroutine_an_async_tool_returns_is_awaited() -> None:
    """An ``await`` left out of a return statement: the model gets the result, as from
    a sync tool returning an awaitable, not a coroutine's repr."""
    model = ScriptedModel([tool_call_response("unawaited", {}), text_response("done")])
    (seen,) = tool_results((await Lazy(model=model).run("go")).messages)
    assert (seen.is_error, seen.content) == (False, "the data")


async def test_a_tool_that_returns_an_iterator_gets_an_error_result() -> None:
    """An iterator's items were never made, as a generator's: the model is told so."""
    model = ScriptedModel([tool_call_response("mapped", {}), text_response("done")])
    (seen,) = tool_results((await Lazy(model=model).run("go")).messages)
    assert seen.is_error and "it returned an iterator (map), whose items" in seen.content


class Catalog:
    """An object whose methods and parts would be tools."""

    def find(self, query: str) -> str:
        """Find an item."""
        return query

    def __call__(self, query: str) -> str:
        """Find an item."""
        return query


def find(query: str, limit: int) -> str:
    """Find an item."""
    return query


@pytest.mark.parametrize(
    ("target", "kind"),
    [
        (Catalog().find, "method"),
        (functools.partial(find, limit=3), "partial"),
        (Catalog(), "Catalog"),
    ],
)
def test_tool_takes_functions_only_and_says_how_to_wrap_anything_else(
    target: Any, kind: str
) -> None:
    """A bound method, a partial or a callable object is no function ``@tool`` can mark
    (nor, but for the bound method, one whose parameters and docstring are its own):
    ``ConfigurationError`` naming what it got, not an ``AttributeError`` or ``TypeError``."""
    with pytest.raises(ConfigurationError, match=f"@tool decorates a function .*, not {kind} "):
        tool(timeout=5)(target)
    if kind != "method":
        with pytest.raises(
            ConfigurationError, match=f"a tool is a function or a method, not {kind} "
        ):
            type("Listing", (Agent,), {"tools": [target]})
    else:
        assert type("Listing", (Agent,), {"tools": [target]})().tool_specs[0].name == "find"


def test_a_class_given_as_a_tool_is_not_told_to_become_an_instance() -> None:
    """A class (another agent, say) is no tool, and neither is an instance of it: the
    error names the class and says to wrap it in a def, with no ``X(...)?`` hint."""

    class Writer(Agent):
        model = ScriptedModel([])

    for make in (lambda: tool(Writer), lambda: type("Boss", (Agent,), {"tools": [Writer]})):
        with pytest.raises(ConfigurationError, match="not the class Writer: wrap it in") as caught:
            make()
        assert "did you mean" not in str(caught.value)


def test_a_lambda_given_as_a_tool_is_told_to_be_a_def() -> None:
    with pytest.raises(ConfigurationError, match=r"a lambda cannot be a tool .* write a def"):
        type("Listing", (Agent,), {"tools": [lambda order_id: order_id]})


@functools.cache
def square(n: int) -> str:
    """Square a number."""
    return str(n * n)


async def test_a_function_behind_a_wrapping_decorator_is_a_tool() -> None:
    """``functools.cache`` (any wrapper that keeps ``__wrapped__``) leaves a function a
    tool, in ``tools=`` and under ``@tool``."""
    for function in (square, tool(timeout=5)(square)):
        model = ScriptedModel([tool_call_response("square", {"n": 3}), text_response("done")])
        (seen,) = tool_results((await Agent(model=model, tools=[function]).run("go")).messages)
        assert (seen.is_error, seen.content) == (False, "9")


def unwrapped(function: Any) -> Any:
    """A decorator that forgets ``functools.wraps``: its wrapper has no ``@tool`` mark."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return wrapper


def _lookup() -> Callable[..., Any]:
    def lookup(self: Agent, order_id: str) -> str:
        """Look an order up."""
        return order_id

    return lookup


def _find() -> Callable[..., Any]:
    def find(order_id: str) -> str:
        """Find an order."""
        return order_id

    return find


@pytest.mark.parametrize(
    "marked",
    [
        lambda: tool(_lookup()),
        lambda: tool(timeout=5)(_lookup()),
        lambda: staticmethod(tool(_find())),
        lambda: tool(staticmethod(_find())),
    ],
)
@pytest.mark.parametrize("name", ["lookup", "_lookup"])
def test_a_tool_whose_decorator_dropped_its_mark_fails(marked: Any, name: str) -> None:
    """A decorator over a ``@tool`` that does not keep its mark made a method the model
    was never offered, without a word: the class says which mark it dropped."""
    with pytest.raises(
        ConfigurationError,
        match=rf"Bad\.{name} wraps a @tool but is no tool: its decorator dropped the mark "
        r"\(functools\.wraps keeps it\), and the model would never be offered it",
    ):
        type("Bad", (Agent,), {name: unwrapped(marked())})


def test_a_function_whose_decorator_dropped_its_docstring_says_so() -> None:
    """A wrapper without ``functools.wraps`` in ``tools=`` (or under ``@tool``) failed as
    ``tool 'wrapper' has no docstring``, though the function it wraps has one."""
    told = (
        r"tool 'wrapper' wraps 'find' but has no docstring: its decorator dropped the "
        r"docstring, name and parameters of 'find' \(functools\.wraps keeps them\)"
    )
    with pytest.raises(ConfigurationError, match=rf"^Agent\(…, tools=\): {told}"):
        Agent(tools=[unwrapped(_find())])
    with pytest.raises(ConfigurationError, match=rf"^{told}"):
        tool(unwrapped(_find()))

    def made(order_id: str) -> str:  # no docstring of its own, no wrapper
        return _find()(order_id)

    with pytest.raises(ConfigurationError, match=r"tool 'made' has no docstring: the model"):
        Agent(tools=[made])


def test_a_helper_calling_a_tool_of_its_closure_is_taken() -> None:
    """A method of the name it was defined with that calls a tool function is a helper."""

    @tool
    def find(order_id: str) -> str:
        """Find an order."""
        return order_id

    class Orders(Agent):
        tools = [find]

        def first(self) -> str:
            return find("1")

    assert Orders().first() == "1"
    assert [spec.name for spec in Orders().tool_specs] == ["find"]


class Concurrent(Agent):
    def __init__(self, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.fast_done = anyio.Event()
        self.finished: list[str] = []

    @tool
    async def slow(self) -> str:
        """Finishes only once the fast tool has finished."""
        await self.fast_done.wait()
        self.finished.append("slow")
        return "slow result"

    @tool
    async def fast(self) -> str:
        """Finishes at once."""
        self.finished.append("fast")
        self.fast_done.set()
        return "fast result"


async def test_parallel_calls_run_concurrently_and_results_keep_call_order() -> None:
    """Calls of one response run at once; results are appended in call order."""
    calls = [ToolCall("c1", "slow", {}), ToolCall("c2", "fast", {}), ToolCall("c3", "fast", {})]
    model = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("done"),
        ]
    )
    agent = Concurrent(model=model)
    with anyio.fail_after(5):
        result = await agent.run("go")
    assert agent.finished[-1] == "slow"
    results = tool_results(result.messages)
    assert [(r.call_id, r.content) for r in results] == [
        ("c1", "slow result"),
        ("c2", "fast result"),
        ("c3", "fast result"),
    ]
    assert [r.call_id for r in tool_results(model.requests[1].messages)] == ["c1", "c2", "c3"]


async def test_a_failing_call_does_not_stop_its_siblings() -> None:
    """One raising tool gives an error result; the other calls of the response still run."""
    calls = [ToolCall("c1", "explode", {}), ToolCall("c2", "add", {"a": 1, "b": 1})]
    model = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("done"),
        ]
    )
    result = await Checked(model=model).run("go")
    assert [(r.is_error, r.content[:6]) for r in tool_results(result.messages)] == [
        (True, "Tool '"),
        (False, "2"),
    ]


def lookup(order_id: str) -> dict[str, Any]:
    """Find an order."""
    return {"id": order_id, "items": ("a", "b"), "color": Color.RED}


class Plain(Agent):
    tools = [lookup]


async def test_plain_function_tools_run_and_results_render_as_json() -> None:
    """A plain function in ``tools`` runs (in a thread); a dict result renders as JSON."""
    model = ScriptedModel([tool_call_response("lookup", {"order_id": "42"}), text_response("ok")])
    result = await Plain(model=model).run("go")
    (seen,) = tool_results(result.messages)
    assert seen.content == '{"id": "42", "items": ["a", "b"], "color": "red"}'


def no_doc(x: int) -> int:
    return x


def only_args(x: int) -> int:
    """
    Args:
        x: A number.
    """
    return x


def only_params(x: int) -> int:
    """:param x: A number."""
    return x


def no_annotation(x) -> int:  # type: ignore[no-untyped-def]
    """Has an untyped parameter."""
    return 0


def bad_annotation(x: bytes) -> int:
    """Takes bytes."""
    return 0


def bad_keys(x: dict[int, str]) -> int:
    """Takes a dict with int keys."""
    return 0


def star_args(*values: int) -> int:
    """Takes any number of values."""
    return 0


def non_ascii(größe: int) -> int:
    """Takes a size named in German."""
    return größe


def long_name(number_of_items_the_customer_may_order_in_one_single_basket_at_most: int) -> int:
    """Takes a parameter with a name of 67 characters."""
    return 0


Entry = TypeVar("Entry")


@dataclasses.dataclass
class Batch(Generic[Entry]):
    entries: list[Entry]
    label: Entry | None = None


def bare_generic(x: Batch) -> int:  # type: ignore[type-arg]
    """Takes a generic class without its type arguments."""
    return 0


async def test_a_generic_record_given_its_type_arguments_is_a_tool_argument() -> None:
    """A generic dataclass or attrs class with its type arguments (``Batch[int]``) is
    described and built as its class with the arguments in place of its type variables
    (it was refused at class definition)."""
    seen = []

    def count(batch: Batch[int]) -> int:
        """Counts a batch."""
        seen.append(batch)
        return len(batch.entries)

    class Counter(Agent):
        tools = [count]

    model = ScriptedModel(
        [
            tool_call_response("count", {"batch": {"entries": [1, "2"]}}),
            tool_call_response("count", {"batch": {"entries": [1, 2], "label": 3}}),
            text_response("two"),
        ]
    )
    counter = Counter(model=model)
    [spec] = counter.tool_specs
    assert spec.parameters["properties"]["batch"]["properties"]["entries"] == {
        "type": "array",
        "items": {"type": "integer"},
    }
    result = await counter.run("count")
    assert "batch.entries[1]: expected an integer" in result.messages[2].tool_results[0].content
    assert seen == [Batch([1, 2], 3)]


@pytest.mark.parametrize(
    ("function", "fragment"),
    [
        (no_doc, "'no_doc' has no docstring"),
        (
            only_args,
            "'only_args' has no description: its docstring holds only sections (Args:, "
            "say), and the model needs a description of the tool before them",
        ),
        (only_params, "'only_params' has no description: its docstring holds only"),
        (
            bare_generic,
            "field 'entries': the type variable ~Entry has no type in its place; give the "
            "generic class its type arguments",
        ),
        (no_annotation, "parameter 'x' needs a type annotation"),
        (bad_annotation, "parameter 'x': the type <class 'bytes'> cannot be described"),
        (bad_keys, "parameter 'x': dict keys must be str"),
        (star_args, "*args and **kwargs"),
        (non_ascii, "parameter 'größe' must match [A-Za-z0-9_.-]{1,64}"),
        (long_name, "_at_most' must match [A-Za-z0-9_.-]{1,64}"),
    ],
    ids=lambda value: getattr(value, "__name__", "fragment"),
)
def test_bad_plain_function_tools_fail_at_class_definition(
    function: Callable[..., Any], fragment: str
) -> None:
    """A function tool the model cannot be told about fails when the class is defined
    (or when ``tools=`` is given to the constructor), naming the class and the tool."""
    named = rf"tool '{function.__name__}'.*"
    with pytest.raises(ConfigurationError, match=rf"^Bad: tool .*{re.escape(fragment)}") as made:
        type("Bad", (Agent,), {"tools": [function]})
    assert re.match(rf"Bad: {named}", str(made.value))
    with pytest.raises(
        ConfigurationError, match=rf"^Good\(…, tools=\): tool .*{re.escape(fragment)}"
    ):
        Good(tools=[function])


class Good(Agent):
    model = "openai:gpt-4o-mini"


def test_a_method_tool_whose_type_is_known_only_when_the_class_is_made_names_it() -> None:
    """A ``@tool`` method whose annotation resolves only by the end of the class body is
    checked when the class is defined, and what is wrong names the class and method."""
    namespace: dict[str, Any] = {"Agent": Agent, "tool": tool}
    program = """
class Shop(Agent):
    @tool
    def order(self, value: "Later") -> str:
        \"\"\"Place an order.\"\"\"
        return "placed"

    global Later
    Later = bytes
"""
    with pytest.raises(
        ConfigurationError,
        match=r"^Shop\.order: tool 'order', parameter 'value': the type <class 'bytes'> cannot",
    ):
        exec(program, namespace)


def test_a_docstring_python_strips_is_named_as_the_cause() -> None:
    """Under ``python -OO`` a tool's docstring is gone: the error says why."""
    program = """
from littleghost import Agent, tool

class Support(Agent):
    @tool
    async def lookup_order(self, order_id: str) -> str:
        \"\"\"Find an order by its id.\"\"\"
        return order_id
"""
    done = subprocess.run(
        [sys.executable, "-OO", "-c", program], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert "'lookup_order' has no docstring (-OO or PYTHONOPTIMIZE=2" in done.stderr
    # @tool(description=...) alone would leave the parameters undescribed, silently
    assert 'Annotated[T, "..."] for what its Args: said of a parameter' in done.stderr


def test_bad_method_tool_fails_at_class_definition() -> None:
    """A @tool method that cannot be declared fails while the class body runs, naming
    the class and method (by the method's qualified name: the class is not made yet)."""
    with pytest.raises(ConfigurationError, match=r"^Bad\.silent: tool 'silent' has no docstring"):

        class Bad(Agent):
            @tool
            async def silent(self, x: int) -> int:
                return x

    with pytest.raises(
        ConfigurationError, match=r"^Worse\.store: tool 'store', parameter 'blob', field 'data'"
    ):

        class Worse(Agent):
            @tool
            @staticmethod
            def store(blob: Blob) -> str:
                """Store a blob."""
                return ""

    with pytest.raises(ConfigurationError, match=r"^tool 'silent' has no docstring"):

        @tool
        def silent(x: int) -> int:  # not in a class: nothing more to name
            return x


@frozen
class Blob:
    data: bytes


def store(blob: Blob) -> str:
    """Store a blob."""
    return ""


def test_unsupported_attrs_field_fails_naming_it() -> None:
    """An attrs class with a field JSON cannot describe fails naming the field."""
    with pytest.raises(ConfigurationError, match="parameter 'blob', field 'data'"):
        type("Bad", (Agent,), {"tools": [store]})


@dataclasses.dataclass
class Order:
    order_id: str
    region: dataclasses.InitVar[str]
    channel: dataclasses.InitVar[str] = "web"

    def __post_init__(self, region: str, channel: str) -> None:
        self.order_id = f"{region}-{channel}-{self.order_id}"


def lookup(order: Order) -> str:
    """Look an order up."""
    return order.order_id


async def test_initvars_of_a_dataclass_are_in_its_schema() -> None:
    """An ``InitVar`` is an argument of the constructor, so the schema asks for it
    (required unless it has a default) and the value is built with it."""

    class Orders(Agent):
        tools = [lookup]

    model = ScriptedModel(
        [
            tool_call_response("lookup", {"order": {"order_id": "1", "region": "eu"}}),
            text_response("ok"),
        ]
    )
    await Orders(model=model).run("go")
    [spec] = model.requests[0].tools
    schema = spec.parameters["properties"]["order"]
    assert list(schema["properties"]) == ["order_id", "region", "channel"]
    assert schema["required"] == ["order_id", "region"]
    [result] = tool_results(model.requests[1].messages)
    assert (result.content, result.is_error) == ("eu-web-1", False)


@dataclasses.dataclass
class Zoned:
    """A parameter's class with a bug: a lookup of a zone it never loaded."""

    region: str

    def __post_init__(self) -> None:
        if self.region != "eu":
            raise ValueError("region must be 'eu'")
        self.zone = {}[self.region]


def zoned(where: Zoned) -> str:
    """Find the zone of a region."""
    return where.zone


async def test_a_bug_in_a_parameters_class_is_the_tools_failure_not_a_misfit() -> None:
    """A parameter's class that raises what is not a refusal (a ``ValueError`` or an
    ``AssertionError``) fails the call as a tool that raises does: the model is told
    the tool failed, by the exception, never that its arguments did not fit (as it
    was, which sent it rewriting arguments nothing was wrong with); a refusal is told
    as invalid arguments, as ever."""

    class Zones(Agent):
        tools = [zoned]

    model = ScriptedModel(
        [
            tool_call_response("zoned", {"where": {"region": "us"}}, call_id="c1"),
            tool_call_response("zoned", {"where": {"region": "eu"}}, call_id="c2"),
            text_response("ok"),
        ]
    )
    await Zones(model=model).run("go")
    refused = tool_results(model.requests[1].messages)[-1]
    assert refused.is_error and refused.content == (
        "Invalid arguments for tool 'zoned': where: region must be 'eu'"
    )
    failed = tool_results(model.requests[2].messages)[-1]
    assert failed.is_error and failed.content == "Tool 'zoned' failed: KeyError: 'eu'"


class Halt(BaseException):
    """A library's own ``BaseException`` (neither ``KeyboardInterrupt`` nor ``SystemExit``)."""


@dataclasses.dataclass
class Gated:
    """A parameter's class that raises ``BaseException``s of other kinds than ``Exception``."""

    gate: str

    def __post_init__(self) -> None:
        if self.gate == "halt":
            raise Halt("the gate halted")
        if self.gate == "exit":
            raise SystemExit(3)
        raise GeneratorExit


def gated(through: Gated) -> str:
    """Go through a gate."""
    return through.gate


@pytest.mark.parametrize(
    ("gate", "told"),
    [("halt", "Halt: the gate halted"), ("close", "GeneratorExit")],
)
async def test_a_base_exception_of_a_parameters_class_is_the_tools_failure(
    gate: str, told: str
) -> None:
    """What a parameter's class raises that is not an ``Exception`` fails the call as the
    tool raising it does, and the run goes on (it ended the run, raised out of it); only
    ``KeyboardInterrupt`` and ``SystemExit`` end the run, as themselves."""

    class Gates(Agent):
        tools = [gated]

    model = ScriptedModel(
        [tool_call_response("gated", {"through": {"gate": gate}}), text_response("ok")]
    )
    assert (await Gates(model=model).run("go")).output == "ok"
    [failed] = tool_results(model.requests[1].messages)
    assert (failed.content, failed.is_error) == (f"Tool 'gated' failed: {told}", True)
    model = ScriptedModel(
        [tool_call_response("gated", {"through": {"gate": "exit"}}), text_response("ok")]
    )
    with pytest.raises(SystemExit):
        await Gates(model=model).run("go")


@dataclasses.dataclass
class Routed:
    """An ``InitVar`` holding a quoted name, beside a ``ClassVar``."""

    kind: ClassVar[str] = "routed"
    route: str = ""
    via: dataclasses.InitVar[Optional["Order"]] = None  # noqa: UP037, UP045 - as written

    def __post_init__(self, via: Order | None) -> None:
        self.route = via.order_id if via is not None else "direct"


def test_an_initvar_holding_a_quoted_name_is_resolved() -> None:
    """``typing.get_type_hints`` leaves ``"Order"`` unresolved inside an ``InitVar`` (and
    on Python 3.10 refuses a string ``InitVar``): the schema described it as a
    ``ForwardRef``, which failed."""
    schema = json_schema(Routed, "routed")
    assert list(schema["properties"]) == ["route", "via"]
    assert schema["properties"]["via"]["anyOf"][0]["required"] == ["order_id", "region"]
    routed = coerce({"via": {"order_id": "2", "region": "us"}}, Routed, "routed")
    assert (routed.route, Routed.kind) == ("us-web-2", "routed")


@dataclasses.dataclass
class Stamped:  # its __init__ needs an argument no field describes
    text: str
    stamp: str = dataclasses.field(init=False)

    def __init__(self, text: str, zone: str) -> None:
        self.text, self.stamp = text, zone


@dataclasses.dataclass
class Counted:  # its __init__ needs the field the schema leaves optional
    count: int = 0

    def __init__(self, count: int) -> None:
        self.count = count


@frozen(init=False)
class Renamed:  # its __init__ does not take the field
    value: int

    def __init__(self, number: int = 0) -> None:
        self.__attrs_init__(number)  # type: ignore[attr-defined]


@frozen(init=False)
class Positional:  # its __init__ takes the field by position only
    value: int

    def __init__(self, value: int, /) -> None:
        self.__attrs_init__(value)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("record", "message"),
    [
        (Stamped, r"Stamped\(\) needs the argument 'zone', which is not a field"),
        (Counted, r"Counted\(\) needs the argument 'count', which the schema leaves optional"),
        (Renamed, r"field 'value' of Renamed is not a keyword argument of Renamed\(\)"),
        (Positional, r"Positional\(\) takes 'value' by position only"),
    ],
    ids=["extra argument", "optional field needed", "field not taken", "positional only"],
)
def test_a_record_its_schema_cannot_build_fails_naming_the_argument(
    record: type, message: str
) -> None:
    """A record whose constructor disagrees with its fields could never be built from
    what the model is shown: the class definition fails, for a tool parameter and an
    output type alike."""

    def keep(value: Any) -> str:
        """Keep a value."""
        return ""

    keep.__annotations__ = {"value": record, "return": str}
    with pytest.raises(ConfigurationError, match=f"tool 'keep', parameter 'value': {message}"):
        type("Keeper", (Agent,), {"tools": [keep]})
    with pytest.raises(ConfigurationError, match=f"Typed.output_type: {message}"):
        type("Typed", (Agent,), {"output_type": record})


def test_invalid_tool_name_fails() -> None:
    """@tool(name=) must be a name providers accept."""
    with pytest.raises(ConfigurationError, match="name must match"):
        tool(name="has spaces")(forecast)


@pytest.mark.parametrize("description", [123, "", "  \n", b"bytes"], ids=repr)
def test_a_bad_description_fails_at_decoration(description: Any) -> None:
    """@tool(description=) must be a non-blank str: anything else fails naming it."""

    def described() -> str:
        """Described."""
        return ""

    with pytest.raises(
        ConfigurationError,
        match=re.escape(f"@tool: description must be a non-blank str or None, not {description!r}"),
    ):
        tool(description=description)(described)


def test_redeclaring_a_tool_with_other_options_fails() -> None:
    """@tool with new options on a function that is already a tool raises, leaving it as it was."""

    @tool(name="first_name")
    def shared() -> str:
        """A shared tool."""
        return ""

    with pytest.raises(ConfigurationError, match="already a tool"):
        tool(name="second_name")(shared)
    (spec,) = type("Holder", (Agent,), {"tools": [shared]})().tool_specs
    assert spec.name == "first_name"


class Static(Agent):
    @staticmethod
    @tool
    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    @tool
    @staticmethod
    async def multiply(a: int, b: int) -> int:
        """Multiply two numbers."""
        return a * b


async def test_staticmethod_tools_keep_every_parameter_and_run() -> None:
    """@tool works on either side of @staticmethod: all parameters shown, the tool runs."""
    specs = {spec.name: spec for spec in Static().tool_specs}
    assert {name: spec.parameters["required"] for name, spec in specs.items()} == {
        "add": ["a", "b"],
        "multiply": ["a", "b"],
    }
    calls = [ToolCall("c1", "add", {"a": 2, "b": 3}), ToolCall("c2", "multiply", {"a": 2, "b": 3})]
    model = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("done"),
        ]
    )
    result = await Static(model=model).run("go")
    assert [(r.content, r.is_error) for r in tool_results(result.messages)] == [
        ("5", False),
        ("6", False),
    ]


def test_tool_on_a_classmethod_fails_clearly() -> None:
    """@tool on a classmethod, or under one, raises ConfigurationError saying what a tool
    is (under one, not that ``cls`` needs an annotation)."""
    with pytest.raises(ConfigurationError, match="staticmethod"):

        class Bad(Agent):
            @tool
            @classmethod
            def make(cls) -> str:
                """Make something."""
                return ""

    with pytest.raises(ConfigurationError, match=r"'make' takes cls first.*never a classmethod"):

        class Under(Agent):
            @classmethod
            @tool
            def make(cls, kind: str) -> str:
                """Make something."""
                return kind


class Orders:
    """A client of the user's own, whose methods the agent offers as tools."""

    def find(self, order_id: str) -> str:
        """Find an order."""
        return order_id


def test_a_method_taken_from_its_class_in_tools_fails_saying_to_give_an_instances() -> None:
    """A function that takes self first in ``tools=`` (a method taken from its class, not
    from an instance) fails saying so, not that ``self`` needs an annotation (which would
    make it an argument the model must send); the instance's method is a tool."""
    with pytest.raises(ConfigurationError) as raised:

        class Support(Agent):
            tools = [Orders.find]

    assert "tool 'find' takes self first, as a method does" in str(raised.value)
    assert "annotation" not in str(raised.value)

    class Bound(Agent):
        tools = [Orders().find]

    assert [spec.name for spec in Bound().tool_specs] == ["find"]


def forgot_self(order_id: str) -> str:
    """Find an order."""
    return order_id


def takes_nothing() -> str:
    """Find an order."""
    return ""


def keyword_self(*, self: Any, order_id: str) -> str:
    """Find an order."""
    return order_id


@pytest.mark.parametrize(
    ("method", "got"),
    [
        (forgot_self, "not 'order_id'"),
        (takes_nothing, "but it takes none"),
        (keyword_self, "not the keyword-only 'self'"),
    ],
    ids=lambda value: getattr(value, "__name__", "got"),
)
def test_a_tool_method_without_a_positional_self_fails(
    method: Callable[..., Any], got: str
) -> None:
    """A tool method whose first parameter is not self would lose that parameter: it fails,
    naming the parameter and the declarations that take no instance."""
    with pytest.raises(
        ConfigurationError,
        match=re.escape(
            f"tool {method.__name__!r}: the first parameter of a tool method must be a "
            f"positional self, {got}; declare a tool that needs no instance with "
            "@staticmethod, or as a function in tools=[...]"
        ),
    ):
        type("Bad", (Agent,), {"lookup": tool(method)})


def test_a_tool_method_whose_instance_has_another_name_is_told_to_name_it_self() -> None:
    """``this`` for ``self`` in a class body is read as an unannotated parameter as
    ``@tool`` runs (the class is not made yet): the error says to name a method's
    instance self; a function's first parameter is not told so."""
    with pytest.raises(ConfigurationError) as raised:

        class Holder(Agent):
            @tool
            def lookup(this, order_id: str) -> str:
                """Find an order."""
                return order_id

    assert str(raised.value) == (
        "Holder.lookup: tool 'lookup': parameter 'this' needs a type annotation; if it is "
        "the method's instance, name it self"
    )

    def lookup(this, order_id: str) -> str:
        """Find an order."""
        return order_id

    with pytest.raises(ConfigurationError) as raised:
        tool(lookup)
    assert str(raised.value) == "tool 'lookup': parameter 'this' needs a type annotation"


@pytest.mark.parametrize("tool_outside", [True, False], ids=["tool-static", "static-tool"])
def test_a_staticmethod_tool_s_unannotated_first_parameter_is_no_instance(
    tool_outside: bool,
) -> None:
    """A staticmethod's unannotated first parameter needs a type annotation, and is never
    said to be the instance: under ``@tool`` nothing is said of self, over it (where
    ``@tool`` cannot tell a staticmethod) only if it is one."""
    with pytest.raises(ConfigurationError) as raised:
        if tool_outside:

            class Holder(Agent):
                @tool
                @staticmethod
                def find(query) -> str:  # type: ignore[no-untyped-def]
                    """Find."""
                    return str(query)

        else:

            class Holder(Agent):  # type: ignore[no-redef]
                @staticmethod
                @tool
                def find(query) -> str:  # type: ignore[no-untyped-def]
                    """Find."""
                    return str(query)

    told = "Holder.find: tool 'find': parameter 'query' needs a type annotation"
    if tool_outside:
        assert str(raised.value) == told
    else:
        assert str(raised.value) == f"{told}; if it is the method's instance, name it self"


def test_a_positional_only_self_is_the_instance() -> None:
    """``self`` may be positional-only; the parameters after it are the tool's."""

    class Slashed(Agent):
        @tool
        def lookup(self, /, order_id: str) -> str:
            """Find an order."""
            return order_id

    (spec,) = Slashed().tool_specs
    assert spec.parameters["required"] == ["order_id"]


# --- the RunContext parameter: by annotation, whatever its name ------------------------


def context_as_text(context: str, limit: int = 3) -> str:
    """Search within a context.

    Args:
        context: The text to search in.
    """
    return context[:limit]


def context_by_other_name(question: str, run: RunContext) -> str:
    """Answer, knowing the run."""
    return f"{question} on turn {run.turn}"


def test_a_parameter_named_context_with_another_annotation_is_an_argument() -> None:
    """``context: str`` is shown to the model like any other parameter."""
    definition = define_tool(context_as_text, is_method=False)
    assert definition.context_parameter is None
    assert definition.parameters["properties"]["context"] == {
        "type": "string",
        "description": "The text to search in.",
    }
    assert definition.parameters["required"] == ["context"]
    assert schema_of(context_as_text) == definition.parameters


@pytest.mark.parametrize(
    ("function", "parameter"),
    [
        (context_by_other_name, "run"),
        (_hidden_context.by_name, "ctx"),
        (_hidden_context.by_dotted_name, "run"),
    ],
    ids=["resolved", "type-checking-only", "dotted-type-checking-only"],
)
def test_a_parameter_annotated_run_context_is_the_context_whatever_its_name(
    function: Callable[..., Any], parameter: str
) -> None:
    """A ``RunContext`` annotation, resolved or only text under TYPE_CHECKING, marks the
    parameter that receives the context; the model is not told about it."""
    definition = define_tool(function, is_method=False)
    assert definition.context_parameter == parameter
    assert list(definition.parameters["properties"]) == [
        name for name in ("question", "query") if name in definition.parameters["properties"]
    ]
    assert parameter not in definition.parameters["required"]
    assert [p.name for p in definition.signature] == list(definition.parameters["properties"])


def test_methods_name_their_context_parameter() -> None:
    """A method tool reports its RunContext parameter; a tool without one reports None."""
    assert define_tool(Methods.with_context, is_method=True).context_parameter == "context"
    assert define_tool(Methods.original, is_method=True).context_parameter is None


def test_an_unresolvable_annotation_other_than_run_context_is_reported() -> None:
    """Only ``RunContext`` may stay unresolved; another name fails the class definition,
    naming the tool and the parameter (among many tools, which one)."""
    with pytest.raises(NameError):
        define_tool(_hidden_context.with_unknown_type, is_method=False)
    unresolved = [
        (_hidden_context.with_unknown_type, "parameter 'extra'"),
        (_hidden_context.with_unresolved_record, "parameter 'record'"),
    ]
    for function, parameter in unresolved:
        with pytest.raises(ConfigurationError) as raised:
            type("Bad", (Agent,), {"tools": [_hidden_context.by_name, function]})
        assert str(raised.value) == (
            f"Bad: a tool annotation cannot be resolved (tool {function.__name__!r}, "
            f"{parameter}: name 'Unknown' is not defined)"
        )


async def test_self_annotated_with_the_class_being_defined_is_not_resolved() -> None:
    """``self`` is never shown to the model: its annotation, naming a class not yet bound
    (``from __future__ import annotations`` makes it a string), is left alone."""

    class SelfTyped(Agent):
        @tool
        async def lookup(self: SelfTyped, order_id: str) -> str:
            """Find an order."""
            return f"order {order_id}"

    model = ScriptedModel([tool_call_response("lookup", {"order_id": "42"}), text_response("ok")])
    result = await SelfTyped(model=model).run("where?")
    assert result.messages[2].tool_results[0].content == "order 42"


async def test_a_tool_method_annotation_may_name_a_type_of_its_class_body() -> None:
    """A method's annotation naming a class declared in its class body resolves as it does
    without ``from __future__ import annotations`` (which this module has, making it a
    string: the class definition failed, the name not found in the module; a name the
    module has, ``Ticket``, was its class), in a subclass too; the body's other names
    (a tool named ``uuid``) do not hide the module's."""

    class Desk(Agent):
        class Priority(enum.Enum):
            LOW = "low"
            HIGH = "high"

        @dataclasses.dataclass
        class Ticket:
            order_id: str
            note: str = ""

        @tool
        async def file(self, ticket: Ticket, priority: Priority) -> str:
            """File a ticket."""
            return f"{ticket.order_id} {priority.value}"

        @tool
        async def uuid(self, ticket_id: uuid.UUID) -> str:
            """Show a ticket's id."""
            return str(ticket_id)

    class Branch(Desk):
        pass

    spec, shown = Branch().tool_specs
    assert shown.parameters["properties"]["ticket_id"]["format"] == "uuid"
    assert spec.parameters["properties"]["priority"] == {"enum": ["low", "high"]}
    assert spec.parameters["properties"]["ticket"]["required"] == ["order_id"]
    model = ScriptedModel(
        [
            tool_call_response("file", {"ticket": {"order_id": "42"}, "priority": "high"}),
            text_response("ok"),
        ]
    )
    result = await Branch(model=model).run("file it")
    assert tool_results(result.messages)[0].content == "42 high"


def two_contexts(first: RunContext, query: str, second: RunContext) -> str:
    """Takes the context twice."""
    return query


def untyped_context(context) -> str:  # type: ignore[no-untyped-def]
    """Takes an untyped parameter named context."""
    return ""


def positional_only(query: str, /) -> str:
    """Takes a positional-only parameter."""
    return query


def optional_context(query: str, context: RunContext | None = None) -> str:
    """Takes the context or None."""
    return query


def annotated_context(query: str, context: Annotated[RunContext, "the run"]) -> str:
    """Takes the context with a description."""
    return query


@pytest.mark.parametrize(
    ("function", "fragment"),
    [
        (two_contexts, "parameters 'first' and 'second' are both annotated RunContext"),
        (untyped_context, "parameter 'context' needs a type annotation"),
        (positional_only, "parameter 'query' is positional-only"),
        (optional_context, "tool 'optional_context': parameter 'context' has RunContext inside"),
        (annotated_context, "tool 'annotated_context': parameter 'context' has RunContext inside"),
        (
            _hidden_context.maybe_in_a_run,
            "tool 'maybe_in_a_run': parameter 'ctx' has RunContext inside 'RunContext | None'",
        ),
    ],
    ids=[
        "two-contexts",
        "untyped-context",
        "positional-only",
        "optional",
        "annotated",
        "optional-for-type-checkers",
    ],
)
def test_context_and_parameter_declaration_errors(
    function: Callable[..., Any], fragment: str
) -> None:
    """Two RunContext parameters, an untyped ``context``, a positional-only parameter and
    RunContext inside another annotation (it failed with "name 'Agent' is not defined",
    or "name 'RunContext' is not defined" with ``RunContext`` imported for type checkers
    only, naming neither the tool nor the parameter) fail when the tool is declared and
    when the class is defined."""
    with pytest.raises(ConfigurationError, match=re.escape(fragment)):
        tool(function)
    with pytest.raises(ConfigurationError, match=re.escape(fragment)):
        type("Bad", (Agent,), {"tools": [function]})


class ContextTools(Agent):
    tools = [context_as_text, context_by_other_name, _hidden_context.by_name]


async def test_the_context_reaches_its_parameter_and_context_text_reaches_the_tool() -> None:
    """A RunContext parameter of any name receives the run's context; ``context: str``
    receives the model's argument."""
    calls = [
        ToolCall("c1", "context_as_text", {"context": "abcdef"}),
        ToolCall("c2", "context_by_other_name", {"question": "q"}),
        ToolCall("c3", "by_name", {"query": "r"}),
    ]
    model = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("done"),
        ]
    )
    result = await ContextTools(model=model).run("go")
    assert [(r.content, r.is_error) for r in tool_results(result.messages)] == [
        ("abc", False),
        ("q on turn 0", False),
        ("r on turn 0", False),
    ]


# --- per-tool timeout -------------------------------------------------------------------


def test_timeout_is_stored_on_the_definition() -> None:
    """``@tool(timeout=)`` is kept, as a float, on the definition; no timeout is None."""

    @tool(timeout=2)
    def bounded() -> str:
        """Bounded."""
        return ""

    assert define_tool(bounded, is_method=False).timeout == 2.0
    assert define_tool(forecast, is_method=False).timeout is None
    with pytest.raises(ConfigurationError, match="already a tool"):
        tool(timeout=3)(bounded)


@pytest.mark.parametrize(
    "timeout", [0, -1, math.nan, math.inf, True, "5"], ids=["0", "-1", "nan", "inf", "bool", "str"]
)
def test_a_bad_timeout_fails_naming_it(timeout: Any) -> None:
    """A timeout that is not a positive finite number is a ConfigurationError naming it."""

    def bounded() -> str:
        """Bounded."""
        return ""

    with pytest.raises(ConfigurationError, match="timeout must be a positive finite number"):
        tool(timeout=timeout)(bounded)


class Slow(Agent):
    def __init__(self, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.release = threading.Event()

    @tool(timeout=0.2)
    async def wait_async(self) -> str:
        """Waits forever."""
        await anyio.sleep(math.inf)
        return "never"

    @tool(timeout=0.2)
    def wait_sync(self) -> str:
        """Blocks until released."""
        self.release.wait(10)
        return "late result"

    @tool(timeout=5)
    async def quick(self) -> str:
        """Finishes well within its timeout."""
        return "quick result"


class Discards(logging.Handler):
    """Collects the log lines saying a late tool result was discarded."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if "discarded" in record.getMessage():
            self.records.append(record)
            self.seen.set()

    async def one_line(self) -> logging.LogRecord:
        """The one discard line, once it is written (and no second one follows)."""
        assert await anyio.to_thread.run_sync(self.seen.wait, 5)
        await anyio.sleep(0.05)
        [record] = self.records
        return record


@pytest.fixture
def discards() -> Iterator[Discards]:
    handler = Discards()
    logger = logging.getLogger("littleghost.tools")
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


async def test_a_tool_over_its_timeout_gets_an_error_result_and_the_run_goes_on(
    discards: Discards,
) -> None:
    """Async and sync tools past their timeout are answered with an error; the run goes
    on; the sync tool's thread runs on and its late result is discarded with one log line."""
    calls = [
        ToolCall("c1", "wait_async", {}),
        ToolCall("c2", "wait_sync", {}),
        ToolCall("c3", "quick", {}),
    ]
    model = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE),
            text_response("done"),
        ]
    )
    agent = Slow(model=model)
    with anyio.fail_after(5):
        result = await agent.run("go")
    assert result.output == "done"
    results = tool_results(result.messages)
    assert [(r.call_id, r.is_error) for r in results] == [("c1", True), ("c2", True), ("c3", False)]
    assert results[2].content == "quick result"
    assert not discards.records
    agent.release.set()
    assert "'wait_sync'" in (await discards.one_line()).getMessage()


class Blocking(Agent):
    @tool(timeout=0.05)
    async def fetch(self, secret: str) -> str:
        """Blocks the event loop (a blocking call in an async tool), past its timeout."""
        time.sleep(0.3)  # noqa: ASYNC251 - the mistake under test
        return f"late {secret}"


async def test_an_async_tool_that_blocks_past_its_timeout_is_answered_as_timed_out(
    discards: Discards,
) -> None:
    """An async tool that blocks the event loop cannot be stopped at its timeout: when it
    returns past it, its result is discarded as a sync tool's late result is, the call is
    answered with the timeout's error, and one warning says why, naming the tool alone."""
    model = ScriptedModel(
        [tool_call_response("fetch", {"secret": "s3cr3t-argument"}), text_response("done")]
    )
    result = await Blocking(model=model).run("go")
    assert result.output == "done"
    [answered] = tool_results(result.messages)
    assert answered.is_error and "did not finish within 0.05 s" in answered.content
    assert "s3cr3t" not in answered.content
    [record] = discards.records
    text = record.getMessage()
    assert (record.name, record.levelno) == ("littleghost.tools", logging.WARNING)
    assert "'fetch'" in text and "event loop was blocked" in text and "s3cr3t" not in text


# --- sync tools that cannot be stopped -------------------------------------------------


async def test_a_sync_tool_past_its_timeout_is_not_told_to_the_model_as_stopped(
    discards: Discards,
) -> None:
    """A sync tool's thread runs on past its timeout, so what it does (a file it writes)
    still happens: the model is told that it may, not that the call was stopped (it
    would do it again)."""
    release, finished = threading.Event(), threading.Event()
    written: list[str] = []

    class Writer(Agent):
        @tool(timeout=0.05)
        def write_file(self, path: str) -> str:
            """Write a file."""
            release.wait(30)
            written.append(path)
            finished.set()
            return f"wrote {path}"

    model = ScriptedModel(
        [tool_call_response("write_file", {"path": "notes.md"}), text_response("done")]
    )
    try:
        result = await Writer(model=model).run("go")
    finally:
        release.set()
    [answered] = tool_results(result.messages)
    assert answered.is_error and "did not finish within 0.05 s" in answered.content
    assert "was stopped" not in answered.content, answered.content
    assert "may still" in answered.content, answered.content
    await anyio.to_thread.run_sync(finished.wait, 30)
    assert written == ["notes.md"]  # what the model was told may happen did


@pytest.mark.parametrize("raises", [False, True], ids=["returns", "raises"])
async def test_an_abandoned_sync_call_logs_once_without_its_values(
    discards: Discards, raises: bool
) -> None:
    """When the caller stops waiting, the thread runs on; its late result (or exception)
    is discarded with one WARNING naming the tool, never its arguments or result."""
    release = threading.Event()

    def blocking(secret: str) -> str:
        release.wait(10)
        if raises:
            raise ValueError(f"failed with {secret}")
        return f"result {secret}"

    with anyio.move_on_after(0.1) as scope:
        await invoke(
            blocking, {"secret": "s3cr3t-argument"}, "blocking_tool", capture_content=False
        )
    assert scope.cancelled_caught
    await anyio.sleep(0.05)
    assert not discards.records
    release.set()
    record = await discards.one_line()
    text = record.getMessage()
    assert (record.name, record.levelno) == ("littleghost.tools", logging.WARNING)
    assert "'blocking_tool'" in text and "late result was discarded" in text
    assert ("raised ValueError" in text) == raises
    assert "s3cr3t" not in text
    assert record.exc_info is None


async def test_a_call_finishing_as_its_caller_stops_waiting_logs_exactly_once(
    discards: Discards,
) -> None:
    """Whichever side sees the other first, a result the caller never got is logged once."""
    with anyio.CancelScope() as scope:

        def cancel_then_return() -> str:
            anyio.from_thread.run_sync(scope.cancel)
            return "late"

        await invoke(cancel_then_return, {}, "racing_tool")
    assert scope.cancelled_caught
    assert "'racing_tool'" in (await discards.one_line()).getMessage()


@pytest.mark.parametrize("racing", [False, True], ids=["late", "as-it-stops-waiting"])
async def test_a_coroutine_an_abandoned_sync_call_returns_is_closed(
    discards: Discards, racing: bool
) -> None:
    """A sync tool handing back a coroutine (a sync decorator around an async function)
    that the caller no longer waits for: nobody awaits it, so it is closed, never left to
    the collector's "coroutine ... was never awaited" (a failure under ``-W error``)."""
    release = threading.Event()
    made: list[Coroutine[Any, Any, str]] = []

    async def lookup() -> str:
        return "shipped"

    def blocking() -> Coroutine[Any, Any, str]:
        if racing:
            anyio.from_thread.run_sync(scope.cancel)
        else:
            release.wait(10)
        made.append(lookup())
        return made[0]

    with anyio.CancelScope() as scope:
        scope.deadline = anyio.current_time() + 0.1
        await invoke(blocking, {}, "decorated_tool")
    assert scope.cancelled_caught
    release.set()
    await discards.one_line()
    assert inspect.getcoroutinestate(made[0]) == inspect.CORO_CLOSED


# --- what a tool raised or returned, as the model is told it ----------------------------


def logged(function: Callable[..., Any]) -> Callable[..., Any]:
    """A sync decorator, as logging and retry decorators are often written: it hands back
    what the function returns (a coroutine, for an async function)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return wrapper


def charge() -> str:
    """Charge the card."""
    raise APIError()


async def charge_async() -> str:
    """Charge the card."""
    raise CodedError()


def first_match() -> str:
    """The first match of an empty search."""
    return str(next(iter([])))


def closes() -> str:
    """Raise what closing a generator raises."""
    raise GeneratorExit


def silent() -> str:
    """Fail with no message."""
    raise ValueError()


@logged
async def lookup_order(order: str) -> str:
    """Look an order up."""
    await anyio.lowlevel.checkpoint()
    return f"order {order}: shipped"


@pytest.mark.parametrize(
    ("function", "content"),
    [
        (charge, "Tool 'charge' failed: APIError (its message could not be shown)"),
        (charge_async, "Tool 'charge_async' failed: CodedError (its message could not be shown)"),
        (first_match, "Tool 'first_match' failed: StopIteration"),
        (closes, "Tool 'closes' failed: GeneratorExit"),
        (silent, "Tool 'silent' failed: ValueError"),
        (lookup_order, "order 42: shipped"),
    ],
    ids=["unprintable", "non-str", "StopIteration", "GeneratorExit", "empty", "wrapped-async"],
)
@pytest.mark.parametrize("capture_content", [False, True])
async def test_what_a_tool_raises_or_returns_reaches_the_model_the_same_on_every_backend(
    discards: Discards,
    spans: Spans,
    function: Callable[..., Any],
    content: str,
    capture_content: bool,
) -> None:
    """A tool's own exception is told by its type (and message, when there is one it can
    show), never a crash or a backend's stand-in, content captured (in its span's
    ``exception`` event too) or not; a sync decorator's coroutine is awaited; a call the
    run waited for logs no discarded late result."""
    arguments = {"order": "42"} if function is lookup_order else {}
    model = ScriptedModel(
        [tool_call_response(function.__name__, arguments, call_id="c1"), text_response("done")]
    )
    holder = type("Holder", (Agent,), {"tools": [function]})
    agent = holder(model=model, capture_content=capture_content)
    result = await agent.run("go")
    assert result.output == "done"
    (seen,) = tool_results(result.messages)
    assert (seen.content, seen.is_error) == (content, function is not lookup_order)
    assert not discards.records  # a false one was logged as the run took the outcome
    events = spans.one(f"execute_tool {function.__name__}").events
    recorded = [str((event.attributes or {})["exception.message"]) for event in events]
    shown = "(its message could not be shown)" if "not be shown" in content else ""
    assert recorded == ([shown] if capture_content and seen.is_error else [])


class SlowText:
    """A result whose text waits, as a big table's or a lazy record's can, until the
    event loop is seen to go on (at most 5 s: then it says it held the loop)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.released = threading.Event()

    def __str__(self) -> str:
        self.entered.set()
        return "made" if self.released.wait(5) else "it held the event loop"


async def test_a_sync_tool_s_result_is_made_text_in_its_worker_thread() -> None:
    """A sync tool's whole work, the text of its result too (a slow ``__str__``), is done
    in its worker thread: the event loop, the run's deadline and the other calls go on
    meanwhile."""
    slow = SlowText()

    def table() -> SlowText:
        """Make a table."""
        return slow

    async def release() -> None:
        await anyio.to_thread.run_sync(slow.entered.wait, abandon_on_cancel=True)
        slow.released.set()

    model = ScriptedModel([tool_call_response("table", {}), text_response("done")])
    agent = type("Tables", (Agent,), {"tools": [table]})(model=model)
    async with anyio.create_task_group() as group:
        group.start_soon(release)
        result = await agent.run("go")
    assert [seen.content for seen in tool_results(result.messages)] == ["made"]


class SlowError(Exception):
    """An exception whose text waits as a ``SlowText``'s does (a lazy message's)."""

    def __init__(self) -> None:
        super().__init__()
        self.slow = SlowText()
        self.threads: list[threading.Thread] = []
        """The threads its text was made in, each time."""

    def __str__(self) -> str:
        self.threads.append(threading.current_thread())
        return str(self.slow)


@pytest.mark.parametrize("capture_content", [False, True])
async def test_a_sync_tool_s_exception_is_made_text_in_its_worker_thread(
    capture_content: bool,
) -> None:
    """What a sync tool raised is made text in its worker thread too (and its span
    event's message and traceback, when content is captured): the loop goes on, and
    never makes that text itself."""
    error = SlowError()

    def table() -> str:
        """Make a table."""
        raise error

    async def release() -> None:
        await anyio.to_thread.run_sync(error.slow.entered.wait, abandon_on_cancel=True)
        error.slow.released.set()

    model = ScriptedModel([tool_call_response("table", {}), text_response("done")])
    agent = type("Tables", (Agent,), {"tools": [table]})(
        model=model, capture_content=capture_content
    )
    async with anyio.create_task_group() as group:
        group.start_soon(release)
        result = await agent.run("go")
    assert [seen.content for seen in tool_results(result.messages)] == [
        "Tool 'table' failed: SlowError: made"
    ]
    assert error.threads
    assert threading.current_thread() not in error.threads


async def test_sync_calls_past_their_timeout_keep_no_default_thread_token() -> None:
    """Sync tools run in threads of their own: under trio an abandoned thread keeps its
    limiter token until it returns, yet anyio's default limiter stays free."""
    release = threading.Event()

    def blocking() -> str:
        release.wait(3)
        return "late"

    async def stop_waiting() -> None:
        with anyio.move_on_after(0.1):
            await invoke(blocking, {}, "blocking_tool")

    try:
        async with anyio.create_task_group() as group:
            for _ in range(40):
                group.start_soon(stop_waiting)
        assert anyio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
        with anyio.fail_after(LATE):
            assert await anyio.to_thread.run_sync(lambda: "free") == "free"
    finally:
        release.set()


async def test_at_most_64_sync_calls_run_at_once() -> None:
    """More sync calls than that wait for a turn."""
    release = threading.Event()
    guard = threading.Lock()
    running = most = 0

    def counted() -> str:
        nonlocal running, most
        with guard:
            running += 1
            most = max(most, running)
        release.wait(5)
        with guard:
            running -= 1
        return "ok"

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            for _ in range(70):
                group.start_soon(invoke, counted, {}, "counted")
            for _ in range(400):
                if running == 64:
                    break
                await anyio.sleep(0.01)
            await anyio.sleep(0.1)
            assert most == 64
            release.set()
    assert running == 0


# --- declaration errors: duplicate names, recursive types, enums that are not JSON ------


def named(name: str) -> ToolDefinition:
    """The definition of a plain tool called ``name``."""

    def function() -> str:
        """A tool."""
        return ""

    return define_tool(tool(name=name)(function), is_method=False)


def test_index_tools_refuses_two_tools_with_one_name_naming_both_places() -> None:
    """Two tools with one name fail, naming the name and where each is declared."""
    with pytest.raises(
        ConfigurationError, match=r"Owner: two tools are named 'x': method 'a' and method 'b'"
    ):
        index_tools("Owner", {"a": named("x"), "b": named("x")}, [])
    with pytest.raises(ConfigurationError, match=r"'x': method 'a' and tools\[1\] \(.*function\)"):
        index_tools("Owner", {"a": named("x")}, [named("y"), named("x")])
    with pytest.raises(ConfigurationError, match=r"'x': tools\[0\] .* and tools\[1\]"):
        index_tools("Owner", {}, [named("x"), named("x")])


def test_index_tools_keys_each_tool_by_name() -> None:
    """Method tools keep their attribute; function tools have none."""
    a, b = named("a"), named("b")
    assert index_tools("Owner", {"attr": a}, [b]) == {"a": (a, "attr"), "b": (b, None)}


@frozen
class Node:
    label: str
    children: list[Node]


@frozen
class Ping:
    pong: Pong | None


@frozen
class Pong:
    ping: Ping


@frozen
class Segment:
    start: Point
    end: Point


def take_node(node: Node) -> str:
    """Takes a tree."""
    return ""


def take_ping(ping: Ping) -> str:
    """Takes a ping."""
    return ""


def take_segment(segment: Segment) -> str:
    """Takes a segment."""
    return ""


@pytest.mark.parametrize(
    ("function", "fragment"),
    [
        (take_node, "parameter 'node', field 'children': Node contains itself"),
        (take_ping, "field 'pong', field 'ping': Ping contains itself"),
    ],
    ids=["self", "mutual"],
)
def test_recursive_attrs_types_fail_naming_the_class(
    function: Callable[..., Any], fragment: str
) -> None:
    """A self- or mutually-referencing attrs class is a ConfigurationError, not a RecursionError."""
    with pytest.raises(ConfigurationError, match=re.escape(fragment)) as caught:
        tool(function)
    assert "recursive types cannot be described" in str(caught.value)
    with pytest.raises(ConfigurationError, match=re.escape(fragment)):
        type("Bad", (Agent,), {"tools": [function]})


def test_an_attrs_class_used_twice_side_by_side_is_not_recursive() -> None:
    """The same class in two fields is described twice, not refused."""
    point = {
        "type": "object",
        "properties": {"x": {"type": "integer"}, "y": {"type": "integer", "default": 0}},
        "required": ["x"],
        "additionalProperties": False,
    }
    assert schema_of(take_segment)["properties"]["segment"]["properties"] == {
        "start": point,
        "end": point,
    }


class Opaque(enum.Enum):
    THING = object()


class Pairs(enum.Enum):
    ORIGIN = (0, 0)


class Sets(enum.Enum):
    LETTERS = frozenset({"a", "b"})


class Raw(enum.Enum):
    BYTES = b"raw"


class NotANumber(enum.Enum):
    NAN = math.nan


class Mixed(enum.Enum):
    TEXT = "text"
    NUMBER = 2
    REAL = 2.5
    FLAG = True
    NOTHING = None


@pytest.mark.parametrize("kind", [Opaque, Pairs, Sets, Raw, NotANumber], ids=lambda k: k.__name__)
def test_an_enum_whose_values_are_not_json_fails_naming_it(kind: type[enum.Enum]) -> None:
    """An Enum with a value JSON cannot hold fails naming the enum."""

    def probe(value: Any) -> str:
        """Probe an enum."""
        return ""

    probe.__annotations__ = {"value": kind, "return": str}
    with pytest.raises(
        ConfigurationError,
        match=rf"parameter 'value': the values of the enum {kind.__name__} must be",
    ):
        type("Bad", (Agent,), {"tools": [probe]})


class Empty(enum.Enum):
    pass


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (Empty, "the enum Empty has no members, so it allows no value"),
        (Literal[()], "an empty Literal allows no value"),
        (list[Empty | None], "the enum Empty has no members"),
    ],
    ids=["enum", "Literal", "nested"],
)
def test_an_enum_or_literal_without_values_fails_naming_it(annotation: Any, message: str) -> None:
    """A type no value fits (schema ``{"enum": []}``) fails when the class is defined."""

    def probe(value: Any) -> str:
        """Probe a type."""
        return ""

    probe.__annotations__ = {"value": annotation, "return": str}
    with pytest.raises(ConfigurationError, match=re.escape(f"parameter 'value': {message}")):
        type("Bad", (Agent,), {"tools": [probe]})


def test_an_enum_of_json_values_is_described() -> None:
    """Str, int, float, bool and None values are all fine."""
    assert property_of(Mixed) == {"enum": ["text", 2, 2.5, True, None]}


async def test_hung_sync_tools_past_their_timeout_never_starve_other_sync_tools() -> None:
    """A sync call the run stopped waiting for costs its own thread, not a turn: after
    more hung calls than there are turns, another agent's sync tool still runs, under
    asyncio and trio alike."""
    release = threading.Event()

    class Flaky(Agent):
        @tool(timeout=0.05)
        def hang(self) -> str:
            """Wait on a dead socket."""
            release.wait(10)
            return "late"

    class Healthy(Agent):
        @tool(timeout=2)
        def add(self, a: int, b: int) -> int:
            """Add two numbers."""
            return a + b

    hung = [ToolCall(f"c{n}", "hang", {}) for n in range(70)]
    flaky = ScriptedModel(
        [
            ModelResponse(Message.assistant(tool_calls=tuple(hung)), StopReason.TOOL_USE),
            text_response("gave up"),
        ]
    )
    try:
        await Flaky(model=flaky).run("Go.")
        model = ScriptedModel([tool_call_response("add", {"a": 1, "b": 2}), text_response("3")])
        result = await Healthy(model=model).run("Add.")
        assert result.messages[2].tool_results[0].content == "3"
    finally:
        release.set()


class Unit(enum.Enum):
    C = "c"
    F = "f"


@pytest.mark.parametrize(
    ("annotation", "default", "problem"),
    [
        (int, "x", "expected an integer, got a string"),
        (int, 1.5, "expected an integer, got a number"),
        (bool, 0, "expected a boolean, got a number"),
        (Literal["c", "f"], "k", r"expected one of \['c', 'f'\], got 'k'"),
        (Unit, "k", r"expected one of \['c', 'f'\], got 'k'"),
        (list[int], [1, "2"], r"default\[1\]: expected an integer"),
        (datetime.datetime, datetime.datetime(2026, 1, 1), "with its UTC offset"),
    ],
)
def test_a_default_of_another_type_fails_at_class_definition(
    annotation: Any, default: Any, problem: str
) -> None:
    """A default that is not a value of its parameter's type (not a member of its
    Literal or Enum, a naive datetime for an aware one) fails when the class is defined."""

    def probe(value: Any = default) -> str:
        """Probe a default."""
        return ""

    probe.__annotations__ = {"value": annotation, "return": str}
    with pytest.raises(
        ConfigurationError,
        match=rf"Holder: tool 'probe', parameter 'value': the default .* is not a value of its "
        rf"type \(.*{problem}",
    ):
        schema_of(probe)


def test_a_default_none_or_one_json_cannot_carry_is_taken_for_any_type() -> None:
    """``None`` for a type without null is the default when the argument is left out (as
    null is); a default JSON cannot carry is not shown, so not checked."""

    def probe(
        count: int = None,  # type: ignore[assignment]  # noqa: RUF013
        limit: float = math.inf,
        unit: Unit = Unit.F,
    ) -> str:
        """Probe defaults."""
        return ""

    properties = schema_of(probe)["properties"]
    # Python 3.10's get_type_hints reads ``int = None`` as ``Optional[int]``; 3.11's as ``int``
    integer = {"type": "integer"}
    if sys.version_info < (3, 11):
        integer = {"anyOf": [integer, {"type": "null"}]}
    assert properties["count"] == {**integer, "default": None}
    assert properties["limit"] == {"type": "number"}
    assert properties["unit"] == {"enum": ["c", "f"], "default": "f"}


@attrs.define
class Filters:
    unit: Unit = Unit.C
    top: Annotated[int, "how many"] = 3
    tags: list[str] = attrs.Factory(list)
    since: Optional[datetime.date] = datetime.date(2026, 1, 1)  # noqa: UP045


def test_a_record_fields_default_is_in_its_schema_as_the_json_the_model_would_send() -> None:
    """A record field's default is shown as a parameter's is (the JSON the model would
    send), so the model knows what leaving the field out means; a default made by a
    factory is not shown."""

    def search(filters: Filters) -> str:
        """Search."""
        return ""

    assert schema_of(search)["properties"]["filters"]["properties"] == {
        "unit": {"enum": ["c", "f"], "default": "c"},
        "top": {"type": "integer", "description": "how many", "default": 3},
        "tags": {"type": "array", "items": {"type": "string"}},
        "since": {
            "anyOf": [{"type": "string", "format": "date"}, {"type": "null"}],
            "default": "2026-01-01",
        },
    }


class Spot(NamedTuple):
    lat: Annotated[float, "degrees north"]
    lon: float
    on: datetime.date = datetime.date(2026, 1, 1)


def test_a_named_tuple_is_an_array_of_its_fields_as_a_tuple_is() -> None:
    """A ``NamedTuple`` is a fixed-length array, as ``tuple[float, float, date]`` is and
    as its value is written as JSON: each item titled by its field, a trailing field with
    a default optional; what the model sends is built into the class by position."""
    got: list[Spot] = []

    def visit(spot: Spot, others: list[Spot]) -> str:
        """Visit a spot."""
        got.extend([spot, *others])
        return "ok"

    class Guide(Agent):
        tools = [visit]

    (spec,) = Guide(model=ScriptedModel([])).tool_specs
    assert spec.parameters["properties"]["spot"] == {
        "type": "array",
        "prefixItems": [
            {"title": "lat", "type": "number", "description": "degrees north"},
            {"title": "lon", "type": "number"},
            {"title": "on", "type": "string", "format": "date", "default": "2026-01-01"},
        ],
        "minItems": 2,
        "maxItems": 3,
    }
    model = ScriptedModel(
        [
            tool_call_response("visit", {"spot": [48.8, 2.3], "others": [[1, 2, "2026-05-01"]]}),
            tool_call_response("visit", {"spot": [48.8], "others": []}),
            tool_call_response("visit", {"spot": {"lat": 1, "lon": 2}, "others": []}),
            text_response("done"),
        ]
    )
    messages = Guide(model=model).run_sync("go").messages
    assert got == [
        Spot(48.8, 2.3, datetime.date(2026, 1, 1)),
        Spot(1.0, 2.0, datetime.date(2026, 5, 1)),
    ]
    assert isinstance(got[0], Spot) and isinstance(got[0].lat, float)
    errors = [result for result in tool_results(messages) if result.is_error]
    assert "spot: expected 2 to 3 items, got 1" in str(errors[0].content)
    assert "spot: expected an array, got an object" in str(errors[1].content)
    assert json.loads(json.dumps(got[1], default=to_json)) == [1.0, 2.0, "2026-05-01"]


def test_a_named_tuple_is_an_output_type_and_its_defaults_are_checked() -> None:
    """As an output type a named tuple is its array; its field's default is checked as a
    record field's is."""

    class Where(Agent):
        output_type = Spot

    model = ScriptedModel([text_response('{"result": [48.8, 2.3]}')])
    assert Where(model=model).run_sync("where").output == Spot(48.8, 2.3)

    class Late(NamedTuple):
        hour: Annotated[int, at.Le(23)] = 24

    with pytest.raises(
        ConfigurationError, match=r"Wrong.output_type, field 'hour': the default 24"
    ):

        class Wrong(Agent):
            output_type = Late
