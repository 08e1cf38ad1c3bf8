"""pydantic models, an optional dependency, wherever records are taken: as an output type
(natively, with the final-result tool, streamed) and as a tool's parameters and result;
their own validators decide, and littleghost works without pydantic."""

from __future__ import annotations

import datetime
import decimal
import enum
import json
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

import pydantic.dataclasses
import pytest
from pydantic import (
    AfterValidator,
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    field_validator,
)

from littleghost import Agent, tool
from littleghost.errors import ConfigurationError, OutputValidationError
from littleghost.events import RunFinished
from littleghost.output import OUTPUT_TOOL
from littleghost.testing import ScriptedModel, streamed, text_response, tool_call_response

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


class Customer(BaseModel):
    name: str = Field(description="full name")
    email: Optional[str] = None  # noqa: UP045 - Optional, as pydantic code has it


class Ticket(BaseModel):
    """A support ticket."""

    title: str
    priority: int = Field(3, description="1 (low) to 5 (urgent)")
    customer: Customer
    tags: list[str] = []

    @field_validator("priority")
    @classmethod
    def _in_range(cls, value: int) -> int:
        if not 1 <= value <= 5:
            raise ValueError("priority must be 1 to 5")
        return value


CUSTOMER = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "description": "full name"},
        "email": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
    },
    "required": ["name"],
    "additionalProperties": False,
}
TICKET = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "priority": {"type": "integer", "description": "1 (low) to 5 (urgent)", "default": 3},
        "customer": CUSTOMER,
        "tags": {"type": "array", "items": {"type": "string"}, "default": []},
    },
    "required": ["title", "customer"],
    "additionalProperties": False,
}
ANSWER = {"title": "Lamp late", "priority": 4, "customer": {"name": "Ada"}, "tags": ["ship"]}
EXPECTED = Ticket(title="Lamp late", priority=4, customer=Customer(name="Ada"), tags=["ship"])


class Plain(Agent):
    instructions = "Answer."


class Triage(Agent):
    output_type = Ticket


def answering(answer: Any, *, native: bool, call_id: str = "c1") -> Any:
    """The model's reply giving ``answer``: as text (native) or a final-result call."""
    if native:
        return text_response(json.dumps(answer))
    return tool_call_response(OUTPUT_TOOL, answer, call_id=call_id)


class TestOutput:
    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    async def test_the_answer_is_an_instance_of_the_model(self, native: bool) -> None:
        """The schema describes the model's fields (nested models inline, a field with a
        default optional, ``Field(description=...)`` as the description); the answer
        becomes an instance of the model."""
        model = ScriptedModel([answering(ANSWER, native=native)], supports_output_schema=native)
        result = await Triage(model=model).run("go")
        assert type(result.output) is Ticket and result.output == EXPECTED
        [request] = model.requests
        if native:
            assert request.output_schema is not None
            assert request.output_schema.name == "Ticket"
            assert request.output_schema.schema == TICKET
        else:
            assert [spec.parameters for spec in request.tools] == [TICKET]

    async def test_run_output_type_takes_a_model(self) -> None:
        model = ScriptedModel([text_response(json.dumps({"name": "Bo", "email": "b@x.io"}))])
        result = await Plain(model=model).run("go", output_type=Customer)
        assert result.output == Customer(name="Bo", email="b@x.io")

    def test_the_strict_schema_requires_every_field(self) -> None:
        """OpenAI's strict form: every property required, the optional ones nullable."""
        output = Triage(model=ScriptedModel([])).output
        assert output is not None and output.schema.strict_schema is not None
        strict = output.schema.strict_schema
        assert strict["required"] == ["title", "priority", "customer", "tags"]
        assert strict["properties"]["customer"]["required"] == ["name", "email"]
        assert strict["properties"]["priority"] == {
            "anyOf": [{"type": "integer", "description": "1 (low) to 5 (urgent)"}, {"type": "null"}]
        }

    async def test_null_for_an_optional_field_means_its_default(self) -> None:
        """Strict decoding sends every field: a null where the type takes none is the
        field left out, at any depth; where it takes null, it is None."""
        answer = {"title": "t", "priority": None, "customer": {"name": "A", "email": None}}
        model = ScriptedModel([text_response(json.dumps({**answer, "tags": None}))])
        result = await Triage(model=model).run("go")
        assert result.output == Ticket(title="t", customer=Customer(name="A"))

    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    async def test_a_validator_that_refuses_gets_the_repair_turn(self, native: bool) -> None:
        """The model's own validators run: what they refuse is told to the model, where
        and why, without the value (pydantic's message shows it), and it answers again."""
        fixed = {**ANSWER, "priority": 9}
        model = ScriptedModel(
            [answering(fixed, native=native), answering(ANSWER, native=native, call_id="c2")],
            supports_output_schema=native,
        )
        assert (await Triage(model=model).run("go")).output == EXPECTED
        told = model.requests[1].messages[-1]
        text = told.text if native else told.tool_results[0].content
        assert "answer.priority: Value error, priority must be 1 to 5" in text
        assert "input" not in text and "9" not in text and "errors.pydantic.dev" not in text

    async def test_a_second_misfit_raises_naming_where_at_any_depth(self) -> None:
        class Order(BaseModel):
            tickets: list[Ticket]

        bad = {"tickets": [ANSWER, {**ANSWER, "priority": 0}]}
        model = ScriptedModel([text_response(json.dumps(bad)), text_response(json.dumps(bad))])
        with pytest.raises(OutputValidationError) as caught:
            await Plain(model=model).run("go", output_type=Order)
        assert caught.value.errors == (
            "answer.tickets[1].priority: Value error, priority must be 1 to 5",
        )

    async def test_a_pydantic_dataclass_refusal_is_told_as_a_models(self) -> None:
        """A pydantic dataclass is a dataclass, built by its constructor; what its
        validators refuse is told as a model's is, without the input."""

        @pydantic.dataclasses.dataclass
        class Count:
            n: int

            @field_validator("n")
            @classmethod
            def _positive(cls, value: int) -> int:
                if value < 0:
                    raise ValueError("n must be positive")
                return value

        model = ScriptedModel([text_response('{"n": -5}'), text_response('{"n": 5}')])
        result = await Plain(model=model).run("go", output_type=Count)
        assert result.output == Count(5)
        assert "answer.n: Value error, n must be positive. Answer" in (
            model.requests[1].messages[-1].text
        )

    async def test_a_pydantic_dataclass_applies_its_fields_metadata(self) -> None:
        """A pydantic dataclass validates its fields as a model does: a validator or a
        pattern in a field's ``Annotated`` (its own or inside its type) is left to it (it
        was a ``ConfigurationError``), its bounds read as a model's."""

        @pydantic.dataclasses.dataclass
        class Tagged:
            n: Annotated[int, AfterValidator(abs), Field(le=9)]
            tags: list[Annotated[str, Field(pattern="^[a-z]+$")]]

        misfit, fitting = '{"n": -3, "tags": ["A"]}', '{"n": -3, "tags": ["a"]}'
        model = ScriptedModel([text_response(misfit), text_response(fitting)])
        result = await Plain(model=model).run("go", output_type=Tagged)
        assert result.output == Tagged(3, ["a"])
        assert "answer.tags[0]: String should match" in model.requests[1].messages[-1].text
        assert model.requests[0].output_schema is not None
        schema = model.requests[0].output_schema.schema["properties"]
        assert schema["n"] == {"type": "integer", "maximum": 9}

    async def test_a_strict_model_takes_the_json_values(self) -> None:
        """A model in pydantic's strict mode gets the values the schema describes as
        their Python types (an enum member, a tuple, an instance of a nested model)."""

        class Size(enum.Enum):
            SMALL = "s"

        class Box(BaseModel):
            model_config = ConfigDict(strict=True)
            size: Size
            sides: tuple[int, int]
            weight: float

        class Parcel(BaseModel):
            model_config = ConfigDict(strict=True)
            box: Box

        answer = {"box": {"size": "s", "sides": [1, 2], "weight": 3}}
        model = ScriptedModel([text_response(json.dumps(answer))])
        result = await Plain(model=model).run("go", output_type=Parcel)
        assert result.output == Parcel(box=Box(size=Size.SMALL, sides=(1, 2), weight=3.0))

    async def test_what_pydantic_applies_inside_a_fields_type_is_left_to_it(self) -> None:
        """Metadata inside a field's type (of a list's or a dict's items: a union's
        discriminator, a validator, a pattern) is the model's own validation's, as the
        field's own metadata is: the class is taken (it was a ``ConfigurationError``),
        descriptions and bounds there are read, and what pydantic refuses gets the repair
        turn."""

        class Cat(BaseModel):
            kind: Literal["cat"]
            lives: int

        class Dog(BaseModel):
            kind: Literal["dog"]
            tricks: list[str]

        class Household(BaseModel):
            pets: list[Annotated[Cat | Dog, Field(discriminator="kind")]]
            ages: list[Annotated[int, AfterValidator(abs), Field(le=99)]]
            codes: dict[str, Annotated[str, Field(pattern="^[A-Z]+$", description="Caps.")]]

        pets = [{"kind": "dog", "tricks": ["sit"]}, {"kind": "cat", "lives": 9}]
        misfit = {"pets": pets, "ages": [-3], "codes": {"x": "abc"}}
        fitting = {"pets": pets, "ages": [-3], "codes": {"x": "ABC"}}
        model = ScriptedModel(
            [text_response(json.dumps(misfit)), text_response(json.dumps(fitting))]
        )
        result = await Plain(model=model).run("go", output_type=Household)
        assert result.output == Household(
            pets=[Dog(kind="dog", tricks=["sit"]), Cat(kind="cat", lives=9)],
            ages=[3],
            codes={"x": "ABC"},
        )
        assert "answer.codes.x: String should match pattern" in model.requests[1].messages[-1].text
        assert model.requests[0].output_schema is not None
        schema = model.requests[0].output_schema.schema["properties"]
        assert schema["ages"]["items"] == {"type": "integer", "maximum": 99}
        assert schema["codes"]["additionalProperties"] == {"type": "string", "description": "Caps."}

    async def test_a_root_model_is_its_root_type(self) -> None:
        class Scores(RootModel[list[int]]):
            pass

        model = ScriptedModel([text_response('{"result": [3, 1]}')])
        result = await Plain(model=model).run("go", output_type=Scores)
        assert result.output == Scores([3, 1])
        assert model.requests[0].output_schema is not None
        assert model.requests[0].output_schema.schema["properties"] == {
            "result": {"type": "array", "items": {"type": "integer"}}
        }

    async def test_an_alias_names_the_field(self) -> None:
        class Aliased(BaseModel):
            order_id: str = Field(alias="orderId")

        model = ScriptedModel([text_response('{"orderId": "42"}')])
        result = await Plain(model=model).run("go", output_type=Aliased)
        assert result.output.order_id == "42"
        assert model.requests[0].output_schema is not None
        assert model.requests[0].output_schema.schema["required"] == ["orderId"]

    def test_a_model_that_cannot_be_described_fails_when_declared(self) -> None:
        class Chosen(BaseModel):
            order_id: str = Field(validation_alias=AliasChoices("id", "orderId"))

        class Node(BaseModel):
            children: list[Node]

        class Later(BaseModel):
            part: Missing  # type: ignore[name-defined]  # noqa: F821

        with pytest.raises(ConfigurationError, match=r"'order_id' of .*Chosen is read through"):
            type("Bad", (Agent,), {"output_type": Chosen})
        with pytest.raises(ConfigurationError, match="Node contains itself"):
            type("Bad", (Agent,), {"output_type": Node})
        with pytest.raises(ConfigurationError) as caught:
            type("Bad", (Agent,), {"output_type": Later})
        assert str(caught.value) == (
            "Bad.output_type: an annotation cannot be resolved (name 'Missing' is not defined)"
        )

    async def test_a_streamed_answer_ends_with_the_instance(self) -> None:
        text = json.dumps(ANSWER)
        model = ScriptedModel([streamed(text[:10], text[10:])])
        async with Triage(model=model).stream("go") as events:
            seen = [event async for event in events]
        assert isinstance(seen[-1], RunFinished)
        assert seen[-1].result.output == EXPECTED
        assert type(events.result.output) is Ticket


class Desk(Agent):
    filed: list[Any]

    @tool
    def file(self, ticket: Ticket, cc: list[Customer] | None = None) -> Ticket:
        """File a ticket.

        Args:
            ticket: The ticket.
            cc: Who else to tell.
        """
        self.filed.append((ticket, cc))
        return ticket.model_copy(update={"title": ticket.title.upper()})


class TestTools:
    async def test_a_tool_receives_instances_and_returns_one(self) -> None:
        """A parameter typed with a model (alone, or in a list in an Optional) is described
        as the output type is, and the tool gets instances; a model it returns is its
        JSON."""
        model = ScriptedModel(
            [
                tool_call_response("file", {"ticket": ANSWER, "cc": [{"name": "Bo"}]}),
                text_response("filed"),
            ]
        )
        agent = Desk(model=model)
        agent.filed = []
        result = await agent.run("go")
        assert agent.filed == [(EXPECTED, [Customer(name="Bo")])]
        assert type(agent.filed[0][0]) is Ticket
        [spec] = model.requests[0].tools
        assert spec.parameters["properties"]["ticket"] == {**TICKET, "description": "The ticket."}
        assert spec.parameters["properties"]["cc"]["anyOf"][0]["items"] == CUSTOMER
        assert spec.parameters["required"] == ["ticket"]
        [answered] = result.messages[2].tool_results
        assert not answered.is_error
        customer = {"name": "Ada", "email": None}
        assert json.loads(answered.content) == {
            **ANSWER,
            "title": "LAMP LATE",
            "customer": customer,
        }

    async def test_arguments_a_validator_refuses_are_an_error_result(self) -> None:
        """The tool is not called; the model is told where and why, without the value."""
        bad = {"ticket": {**ANSWER, "priority": 77}}
        model = ScriptedModel([tool_call_response("file", bad), text_response("sorry")])
        agent = Desk(model=model)
        agent.filed = []
        result = await agent.run("go")
        assert agent.filed == []
        [answered] = result.messages[2].tool_results
        assert answered.is_error
        assert answered.content == (
            "Invalid arguments for tool 'file': ticket.priority: Value error, priority must be 1 to 5"
        )

    async def test_a_model_instance_as_a_default_is_shown_as_json(self) -> None:
        @tool
        def greet(who: Customer = Customer(name="you")) -> str:  # noqa: B008
            """Greet."""
            return f"hi {who.name}"

        model = ScriptedModel([tool_call_response("greet", {}), text_response("ok")])
        result = await Plain(model=model, tools=[greet]).run("go")
        schema = model.requests[0].tools[0].parameters["properties"]["who"]
        assert schema["default"] == {"name": "you", "email": None}
        assert result.messages[2].tool_results[0].content == "hi you"


class Booking(BaseModel):
    at: datetime.datetime = Field(description="when, with its offset")
    guest: uuid.UUID
    deposit: decimal.Decimal = Field(decimal.Decimal("0"), max_digits=6, decimal_places=2)
    nights: list[datetime.date] = []

    @field_validator("at")
    @classmethod
    def _in_business_hours(cls, value: datetime.datetime) -> datetime.datetime:
        if not 8 <= value.hour < 20:
            raise ValueError("we book from 8:00 to 20:00")
        return value


GUEST = "8f14e45f-ceea-467f-a9f3-3b2a3ee2c4f1"
BOOKING = {"at": "2026-05-01T09:30:00+02:00", "guest": GUEST, "deposit": "12.50"}


class TestDatesAndDecimals:
    def test_the_schema_describes_them_as_strings_with_their_formats(self) -> None:
        output = Plain(output_type=Booking).output
        assert output is not None
        assert output.schema.schema["properties"] == {
            "at": {"type": "string", "format": "date-time", "description": "when, with its offset"},
            "guest": {"type": "string", "format": "uuid"},
            "deposit": {"type": "string", "pattern": "^-?[0-9]+([.][0-9]+)?$", "default": "0"},
            "nights": {
                "type": "array",
                "items": {"type": "string", "format": "date"},
                "default": [],
            },
        }
        assert output.schema.schema["required"] == ["at", "guest"]
        assert output.schema.strict_schema is not None

    async def test_an_answer_is_built_from_the_parsed_values(self) -> None:
        """``model_validate`` gets the values parsed as for any record (its validators
        see an aware datetime) and builds the model."""
        answer = {**BOOKING, "nights": ["2026-05-01", "2026-05-02"]}
        model = ScriptedModel([text_response(json.dumps(answer))])
        result = await Plain(model=model).run("go", output_type=Booking)
        paris = datetime.timezone(datetime.timedelta(hours=2))
        assert result.output == Booking(
            at=datetime.datetime(2026, 5, 1, 9, 30, tzinfo=paris),
            guest=uuid.UUID(GUEST),
            deposit=decimal.Decimal("12.50"),
            nights=[datetime.date(2026, 5, 1), datetime.date(2026, 5, 2)],
        )

    @pytest.mark.parametrize(
        ("answer", "told"),
        [
            (
                {**BOOKING, "at": "2026-05-01T09:30"},
                "answer.at: expected a date and time with its UTC offset",
            ),
            ({**BOOKING, "at": "2026-05-01T22:30:00Z"}, "answer.at: Value error, we book from"),
            (
                {**BOOKING, "deposit": "12.505"},
                "answer.deposit: Decimal input should have no more than 2 decimal places",
            ),
            ({**BOOKING, "nights": ["May 1st"]}, "answer.nights[0]: expected a date (2025-05-01)"),
        ],
    )
    async def test_a_misfit_or_a_refusal_gets_the_repair_turn(
        self, answer: dict[str, Any], told: str
    ) -> None:
        model = ScriptedModel(
            [text_response(json.dumps(answer)), text_response(json.dumps(BOOKING))]
        )
        result = await Plain(model=model).run("go", output_type=Booking)
        assert result.output.deposit == decimal.Decimal("12.50")
        assert told in model.requests[1].messages[-1].text

    async def test_a_tool_gets_the_model_and_its_result_is_json(self) -> None:
        class Front(Agent):
            @tool
            def confirm(
                self, booking: Booking, on: datetime.date = datetime.date(2026, 1, 2)
            ) -> Booking:
                """Confirm a booking."""
                return booking.model_copy(update={"nights": [on]})

        model = ScriptedModel(
            [tool_call_response("confirm", {"booking": BOOKING}), text_response("ok")]
        )
        result = await Front(model=model).run("go")
        [spec] = model.requests[0].tools
        assert spec.parameters["properties"]["on"]["default"] == "2026-01-02"
        [answered] = result.messages[2].tool_results
        assert json.loads(answered.content) == {
            **BOOKING,
            "nights": ["2026-01-02"],
        }


def test_littleghost_works_without_pydantic() -> None:
    """pydantic is optional: littleghost imports nothing of it, and runs with records of
    its own kinds where pydantic cannot be imported."""
    code = """
        import dataclasses, sys
        from littleghost import Agent, tool
        from littleghost.errors import ConfigurationError
        from littleghost.testing import ScriptedModel, text_response, tool_call_response
        assert not any(name.startswith("pydantic") for name in sys.modules), "imported"
        sys.modules["pydantic"] = None  # import pydantic now fails

        @dataclasses.dataclass
        class Point:
            x: int

        class Plotter(Agent):
            output_type = Point

            @tool
            def moved(self, point: Point) -> Point:
                \"\"\"Move a point.\"\"\"
                return Point(point.x + 1)

        model = ScriptedModel(
            [tool_call_response("moved", {"point": {"x": 1}}), text_response('{"x": 2}')]
        )
        result = Plotter(model=model).run_sync("go")
        print(result.output, result.messages[2].tool_results[0].content)
        try:
            Plotter(output_type=complex)
        except ConfigurationError:
            print("refused")
    """
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ['Point(x=2) {"x": 2}', "refused"]
