"""Bounds in ``Annotated`` metadata (``annotated_types``, pydantic's ``Field(ge=...)``):
shown in the schema a model is sent, applied to what it sends back (tool arguments and
typed answers alike), left out of what strict decoders are sent; metadata of theirs that
littleghost does not apply fails when the class is defined."""

from __future__ import annotations

import dataclasses
import enum
from typing import Annotated, Any, Literal, Optional, TypedDict

import annotated_types as at
import attrs
import pytest
from pydantic import AfterValidator, BaseModel, Field, StringConstraints, conint
from typing_extensions import Doc

from littleghost import Agent, tool
from littleghost.errors import ConfigurationError, OutputValidationError
from littleghost.messages import ToolResult
from littleghost.testing import ScriptedModel, text_response, tool_call_response

Count = Annotated[int, Field(ge=0, description="how many")]


@dataclasses.dataclass
class Line:
    sku: Annotated[str, at.MinLen(1), at.MaxLen(8)]
    quantity: Annotated[int, at.Interval(gt=0, le=99)]


class Basket(TypedDict):
    lines: Annotated[list[Line], at.MinLen(1)]
    weight: Annotated[float, at.MultipleOf(0.5)]


class Order(BaseModel):
    code: str = Field(max_length=4)
    items: Annotated[int, Field(gt=0)]
    note: Optional[Annotated[str, StringConstraints(max_length=5)]] = None  # noqa: UP045
    size: conint(ge=1, le=3) = 1  # type: ignore[valid-type]


def _results(agent: type[Agent], *arguments: dict[str, Any]) -> list[ToolResult]:
    """The tool results of one call of ``agent``'s tool ``order`` per ``arguments``."""
    model = ScriptedModel(
        [*(tool_call_response("order", each) for each in arguments), text_response("done")]
    )
    messages = agent(model=model).run_sync("go").messages
    return [
        part for message in messages for part in message.content if isinstance(part, ToolResult)
    ]


def test_bounds_are_in_the_schema_and_refuse_arguments_out_of_them() -> None:
    """Each bound is its JSON schema keyword, where a value of its kind is (inside a
    list, a record, an Optional); an argument out of bounds is an error result naming
    where and why, and the tool is not called."""
    called: list[tuple[int, Basket, Optional[int]]] = []  # noqa: UP045

    @tool
    def order(
        count: Count,
        basket: Basket,
        spare: Annotated[Optional[int], at.Lt(3)] = None,  # noqa: UP045
    ) -> str:
        """Place an order."""
        called.append((count, basket, spare))
        return "placed"

    class Shop(Agent):
        model = "openai:gpt-4o-mini"
        tools = [order]

    model = ScriptedModel([text_response("hi")])
    Shop(model=model).run_sync("hi")
    [spec] = model.requests[0].tools
    properties = spec.parameters["properties"]
    assert properties["count"] == {"type": "integer", "minimum": 0, "description": "how many"}
    assert properties["spare"]["anyOf"] == [
        {"type": "integer", "exclusiveMaximum": 3},
        {"type": "null"},
    ]
    basket = properties["basket"]["properties"]
    assert basket["lines"]["minItems"] == 1 and basket["weight"]["multipleOf"] == 0.5
    line = basket["lines"]["items"]["properties"]
    assert line["sku"] == {"type": "string", "minLength": 1, "maxLength": 8}
    assert line["quantity"] == {"type": "integer", "exclusiveMinimum": 0, "maximum": 99}

    good = {"sku": "AB", "quantity": 99}
    results = _results(
        Shop,
        {"count": -1, "basket": {"lines": [good], "weight": 1.5}},
        {"count": 1, "basket": {"lines": [], "weight": 1.5}},
        {"count": 1, "basket": {"lines": [{"sku": "", "quantity": 1}], "weight": 1}},
        {"count": 1, "basket": {"lines": [{"sku": "A", "quantity": 100}], "weight": 1}},
        {"count": 1, "basket": {"lines": [good], "weight": 1.25}},
        {"count": 1, "basket": {"lines": [good], "weight": 2}, "spare": 3},
        {"count": 0, "basket": {"lines": [good], "weight": 2.5}, "spare": None},
    )
    assert [result.content.partition(": ")[2] for result in results] == [
        "count: expected a number >= 0, got -1",
        "basket.lines: expected a length >= 1, got 0",
        "basket.lines[0].sku: expected a length >= 1, got 0",
        "basket.lines[0].quantity: expected a number <= 99, got 100",
        "basket.weight: expected a multiple of 0.5, got 1.25",
        "spare: expected a number < 3, got 3",
        "",
    ]
    assert [result.is_error for result in results] == [True] * 6 + [False]
    assert called == [(0, {"lines": [Line("AB", 99)], "weight": 2.5}, None)]


def test_a_pydantic_models_bounds_are_in_its_schema_and_checked_first() -> None:
    """A model's ``Field(max_length=...)`` and ``Annotated`` bounds are in its schema;
    a value out of them is refused by where and why, as pydantic would refuse it."""

    @tool
    def order(order: Order) -> str:
        """Place an order."""
        return order.code

    class Shop(Agent):
        model = "openai:gpt-4o-mini"
        tools = [order]

    model = ScriptedModel([text_response("hi")])
    Shop(model=model).run_sync("hi")
    schema = model.requests[0].tools[0].parameters["properties"]["order"]["properties"]
    assert schema["code"] == {"type": "string", "maxLength": 4}
    assert schema["items"] == {"type": "integer", "exclusiveMinimum": 0}
    assert schema["note"]["anyOf"][0] == {"type": "string", "maxLength": 5}
    assert schema["size"] == {"type": "integer", "minimum": 1, "maximum": 3, "default": 1}
    results = _results(
        Shop,
        {"order": {"code": "ABCDE", "items": 1}},
        {"order": {"code": "A", "items": 0}},
        {"order": {"code": "A", "items": 1, "note": "toolong"}},
        {"order": {"code": "A", "items": 1, "note": "ok"}},
    )
    assert [result.content.partition(": ")[2] for result in results] == [
        "order.code: expected a length <= 4, got 5",
        "order.items: expected a number > 0, got 0",
        "order.note: matches none of the allowed types (order.note: expected a length <= 5, "
        "got 7; order.note: expected null, got a string)",
        "",
    ]
    assert results[-1].content == "A"


def test_a_bound_a_pydantic_model_applies_itself_to_a_string_type_stays_its_own() -> None:
    """A bound on a field that travels as a string (a ``Decimal``) has no schema keyword;
    the model's own validation applies it."""
    import decimal

    class Price(BaseModel):
        amount: decimal.Decimal = Field(ge=0)

    class Pricer(Agent):
        model = "openai:gpt-4o-mini"
        output_type = Price

    output = Pricer(model=ScriptedModel([])).output
    assert output is not None
    assert output.schema.schema["properties"]["amount"] == {
        "type": "string",
        "pattern": "^-?[0-9]+([.][0-9]+)?$",
    }
    model = ScriptedModel([text_response('{"amount": "-1"}'), text_response('{"amount": "2"}')])
    result = Pricer(model=model).run_sync("price it")
    assert result.output == Price(amount=decimal.Decimal(2))
    assert "greater than or equal to 0" in result.messages[-2].text


def test_a_pydantic_bound_whose_limit_is_not_a_number_stays_the_models_own() -> None:
    """A pydantic model's bound of a date, or of a ``Decimal`` limit, has no JSON schema
    keyword: the class is defined, and the model's own validation applies the bound."""
    import datetime
    import decimal

    class Booking(BaseModel):
        day: datetime.date = Field(gt=datetime.date(2020, 1, 1))
        price: decimal.Decimal = Field(ge=decimal.Decimal("0.5"))

    class Booker(Agent):
        model = "openai:gpt-4o-mini"
        output_type = Booking

    output = Booker(model=ScriptedModel([])).output
    assert output is not None
    properties = output.schema.schema["properties"]
    assert not {"exclusiveMinimum", "minimum"} & {*properties["day"], *properties["price"]}
    model = ScriptedModel(
        [
            text_response('{"day": "2019-05-01", "price": "1"}'),
            text_response('{"day": "2024-05-01", "price": "1"}'),
        ]
    )
    result = Booker(model=model).run_sync("book it")
    assert result.output == Booking(day=datetime.date(2024, 5, 1), price=decimal.Decimal(1))
    assert "greater than 2020-01-01" in result.messages[-2].text


def test_an_answer_out_of_bounds_gets_the_repair_turn_and_then_raises() -> None:
    """A typed answer is checked against its bounds as tool arguments are: one repair
    turn telling why, then ``OutputValidationError`` with the raw reply."""

    class Score(BaseModel):
        value: Annotated[float, at.Ge(0), at.Le(1)]

    class Scorer(Agent):
        model = "openai:gpt-4o-mini"
        output_type = Score

    model = ScriptedModel([text_response('{"value": 1.5}'), text_response('{"value": 0.5}')])
    result = Scorer(model=model).run_sync("score it")
    assert result.output == Score(value=0.5)
    assert "answer.value: expected a number <= 1, got 1.5" in result.messages[-2].text
    model = ScriptedModel([text_response('{"value": -1}'), text_response('{"value": 2}')])
    with pytest.raises(OutputValidationError) as caught:
        Scorer(model=model).run_sync("score it")
    assert caught.value.raw == '{"value": 2}'
    assert caught.value.errors == ("answer.value: expected a number <= 1, got 2",)


def _keywords(schema: Any) -> set[str]:
    """The keywords of ``schema`` and of every schema inside it (not property names)."""
    if isinstance(schema, list):
        return set().union(*map(_keywords, schema))
    if not isinstance(schema, dict):
        return set()
    found = set(schema) | _keywords(list(schema.get("properties", {}).values()))
    return found | _keywords([value for key, value in schema.items() if key != "properties"])


def test_strict_decoders_are_sent_the_schema_without_its_bounds() -> None:
    """OpenAI's strict mode and Anthropic's structured outputs refuse bounds and
    defaults: their schemas leave them out (a property named like a bound stays), the
    tool's keeps them."""

    @dataclasses.dataclass
    class Reading:
        minimum: Annotated[float, at.Ge(0)]
        tags: Annotated[list[Annotated[str, at.MaxLen(3)]], at.MaxLen(2)]
        level: Optional[Annotated[int, at.Le(9)]] = None  # noqa: UP045
        unit: Annotated[str, at.MaxLen(2)] = "kW"

    class Meter(Agent):
        model = "openai:gpt-4o-mini"
        output_type = Reading

    output = Meter(model=ScriptedModel([])).output
    assert output is not None
    bounded = output.schema.schema["properties"]
    assert bounded["minimum"] == {"type": "number", "minimum": 0}
    assert bounded["tags"] == {
        "type": "array",
        "items": {"type": "string", "maxLength": 3},
        "maxItems": 2,
    }
    assert bounded["unit"] == {"type": "string", "maxLength": 2, "default": "kW"}
    assert bounded["level"]["default"] is None
    unbounded = output.schema.unbounded_schema["properties"]
    assert unbounded == {
        "minimum": {"type": "number"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "level": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "unit": {"type": "string"},
    }
    strict = output.schema.strict_schema
    assert strict is not None
    assert not {"maximum", "maxLength", "default"} & _keywords(strict)
    assert output.tool.parameters == output.schema.schema


def _tool(annotation: Any) -> Any:
    def order(value: Any) -> str:
        """Place an order."""
        return "placed"

    order.__annotations__["value"] = annotation
    return order


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (Annotated[int, AfterValidator(abs)], "the Annotated metadata AfterValidator"),
        # older pydantic (2.4) keeps some of a Field's metadata as its attributes
        (Annotated[int, Field(strict=True)], r"(metadata Strict|Field\(strict=\.\.\.\))"),
        (
            Annotated[str, Field(pattern="^a")],
            r"(_PydanticGeneralMetadata\(pattern='\^a'\)|Field\(pattern=\.\.\.\))",
        ),
        (Annotated[str, StringConstraints(to_upper=True)], "_?PydanticGeneralMetadata"),
        (Annotated[int, Field(alias="n")], r"Field\(alias=...\) in Annotated is not applied"),
        (Annotated[int, at.Predicate(bool)], "the Annotated metadata Predicate"),
        (Annotated[str, at.Ge(0)], r"the bound Ge\(0\) applies to an int or a float"),
        (Annotated[Optional[str], at.Gt(1)], r"the bound Gt\(1\) applies to"),  # noqa: UP045
        (Annotated[int, at.MaxLen(3)], r"MaxLen\(3\) applies to a str, list"),
        (Annotated[int, at.MultipleOf(0)], r"MultipleOf\(0\) needs a finite number > 0"),
        (Annotated[float, at.Ge(float("nan"))], r"Ge\(nan\) needs a finite number"),
    ],
)
def test_metadata_littleghost_does_not_apply_fails_at_class_definition(
    annotation: Any, message: str
) -> None:
    """A validator, a pattern, a bound of a type it cannot bound: each fails when the
    class is defined, naming the class, the tool, the parameter and the metadata (a
    ``@tool`` fails already where it is declared)."""
    with pytest.raises(
        ConfigurationError, match=rf"Shop: tool 'order', parameter 'value': .*{message}"
    ):

        class Shop(Agent):
            model = "openai:gpt-4o-mini"
            tools = [_tool(annotation)]

    with pytest.raises(ConfigurationError, match=rf"tool 'order', parameter 'value': .*{message}"):
        tool(_tool(annotation))


def test_metadata_of_other_libraries_is_passed_over_and_doc_is_a_description() -> None:
    """Metadata no bound library made is not littleghost's to read (PEP 593); PEP 727's
    ``Doc("...")`` describes, as a str does."""

    class Marker:
        pass

    def described(annotation: Any) -> Any:
        class Shop(Agent):
            model = "openai:gpt-4o-mini"
            tools = [_tool(annotation)]

        return Shop.__littleghost_tool_index__["order"][0].parameters["properties"]["value"]

    expected = {"type": "integer", "description": "a count"}
    assert described(Annotated[int, Marker(), "a count"]) == expected
    assert described(Annotated[int, Doc("a count"), Marker()]) == expected
    assert described(Annotated[int, at.doc("a count"), at.Ge(0)]) == {**expected, "minimum": 0}


@pytest.mark.parametrize(
    ("value", "limit", "fits"),
    [
        (0.3, 0.1, True),
        (0.35, 0.1, False),
        (7.5, 2.5, True),
        (10**400, 0.5, True),
        (10**400, 0.3, False),
        (1e300, 1e-300, True),
        (12, 4, True),
        (13, 4, False),
    ],
)
def test_a_multiple_is_checked_exactly_by_the_decimals_json_writes(
    value: float, limit: float, fits: bool
) -> None:
    """``MultipleOf`` reads numbers as the decimals JSON writes (``0.3`` is a multiple of
    ``0.1``), exactly: an integer too large for a float is checked too, never a crash."""

    class Shop(Agent):
        model = "openai:gpt-4o-mini"
        tools = [_tool(Annotated[type(value), at.MultipleOf(limit)])]

    [result] = _results(Shop, {"value": value})
    assert result.is_error is not fits
    if not fits:
        assert f"value: expected a multiple of {limit!r}, got" in result.content


def _with_default(annotation: Any, default: Any) -> Any:
    def order(value: Any = default) -> str:
        """Place an order."""
        return "placed"

    order.__annotations__["value"] = annotation
    return order


@pytest.mark.parametrize(
    ("annotation", "default", "problem"),
    [
        (Annotated[int, Field(ge=1)], 0, "expected a number >= 1, got 0"),
        (Annotated[float, at.Lt(1)], 1.0, "expected a number < 1, got 1.0"),
        (Annotated[str, at.MaxLen(2)], "abc", "expected a length <= 2, got 3"),
        (Annotated[list[int], at.MinLen(1)], (), "expected a length >= 1, got 0"),
        (list[Annotated[int, at.MultipleOf(2)]], [2, 3], r"default\[1\]: expected a multiple of"),
    ],
)
def test_a_default_outside_its_bound_fails_at_class_definition(
    annotation: Any, default: Any, problem: str
) -> None:
    """A parameter's default the bound refuses would reach the tool when the model leaves
    it out: the class fails, naming the class, tool, parameter, default and bound; the
    check of what the model sends stays."""
    with pytest.raises(
        ConfigurationError,
        match=rf"Shop: tool 'order', parameter 'value': the default .* is not a value of "
        rf"its type \(.*{problem}",
    ):

        class Shop(Agent):
            model = "openai:gpt-4o-mini"
            tools = [_with_default(annotation, default)]


def test_a_record_fields_default_outside_its_bound_fails_at_class_definition() -> None:
    """A dataclass, attrs or pydantic field's default is checked as a parameter's is,
    in a tool's parameter type and in an output type; a default made by a factory is not
    made to be checked."""

    @dataclasses.dataclass
    class Dated:
        count: Annotated[int, at.Ge(1)] = 0

    @attrs.define
    class Attrs:
        count: Annotated[int, at.Ge(1)] = 0

    class Model(BaseModel):
        count: Annotated[int, Field(ge=1)] = 0

    for record in (Dated, Attrs, Model):
        with pytest.raises(
            ConfigurationError,
            match=r"Shop: tool 'order', parameter 'value', field 'count': the default 0 is not "
            r"a value of its type \(default: expected a number >= 1, got 0\)",
        ):

            class Shop(Agent):
                model = "openai:gpt-4o-mini"
                tools = [_tool(record)]

        with pytest.raises(ConfigurationError, match=r"Report.output_type, field 'count': "):

            class Report(Agent):
                model = "openai:gpt-4o-mini"
                output_type = record

    @dataclasses.dataclass
    class Made:
        counts: Annotated[list[int], at.MinLen(1)] = dataclasses.field(default_factory=list)

    class Fine(Agent):
        model = "openai:gpt-4o-mini"
        output_type = Made

    assert Fine(model=ScriptedModel([])).output is not None


class Priority(enum.IntEnum):
    LOW = 1
    MID = 2
    HIGH = 3


def test_a_bound_on_a_literal_or_an_enum_keeps_the_members_it_takes() -> None:
    """A number's bound on an int ``Literal`` or ``Enum`` (a length's on a str one) is
    applied: the schema's ``enum`` holds the members it takes (which a strict decoder
    holds to as well), and a member outside it is refused."""

    @tool
    def order(
        level: Annotated[Priority, Field(gt=1)],
        size: Annotated[Optional[Literal[1, 2, 3, "any"]], at.Le(2)] = None,  # noqa: UP045
        code: Annotated[Literal["a", "bb"], at.MaxLen(1)] = "a",
    ) -> str:
        """Place an order."""
        return "placed"

    class Shop(Agent):
        model = "openai:gpt-4o-mini"
        tools = [order]

    properties = Shop.__littleghost_tool_index__["order"][0].parameters["properties"]
    assert properties["level"] == {"enum": [2, 3]}
    assert properties["size"] == {
        "anyOf": [{"enum": [1, 2, "any"]}, {"type": "null"}],
        "default": None,
    }
    assert properties["code"] == {"enum": ["a"], "default": "a"}
    results = _results(Shop, {"level": 1}, {"level": 2, "size": 3}, {"level": 3, "size": "any"})
    assert [result.is_error for result in results] == [True, True, False]
    assert "level: expected a number > 1, got 1" in str(results[0].content)


@pytest.mark.parametrize(
    ("annotation", "message"),
    [
        (Annotated[Literal[1, 2], at.Ge(5)], r"Ge\(5\) leaves none of the values"),
        (Annotated[Priority, at.Lt(1)], r"Lt\(1\) leaves none of the values"),
        (Annotated[Literal["a", "b"], at.Ge(0)], r"Ge\(0\) applies to an int or a float"),
    ],
)
def test_a_bound_no_member_of_a_literal_or_an_enum_takes_fails(
    annotation: Any, message: str
) -> None:
    """A bound that leaves no member, or bounds no member's kind, says so."""
    with pytest.raises(
        ConfigurationError, match=rf"Shop: tool 'order', parameter 'value': the bound {message}"
    ):

        class Shop(Agent):
            model = "openai:gpt-4o-mini"
            tools = [_tool(annotation)]


def test_a_length_bound_of_a_set_counts_its_distinct_items() -> None:
    """A set's length is that of the set the tool gets, not of the array the model sent:
    ``["a", "a"]`` is one tag, under ``MinLen(2)``; three repeats are one, within
    ``MaxLen(2)``."""
    called: list[frozenset[str]] = []

    @tool
    def order(
        tags: Annotated[set[str], at.MinLen(2)],
        codes: Annotated[frozenset[str], at.MaxLen(2)] = frozenset(),
    ) -> str:
        """Place an order."""
        called.append(frozenset(tags))
        return "placed"

    class Shop(Agent):
        model = "openai:gpt-4o-mini"
        tools = [order]

    refused, taken = _results(
        Shop, {"tags": ["a", "a"]}, {"tags": ["a", "b"], "codes": ["x", "x", "x"]}
    )
    assert refused.is_error
    assert "tags: expected a length >= 2 (distinct items), got 1" in refused.content
    assert not taken.is_error
    assert called == [frozenset({"a", "b"})]
