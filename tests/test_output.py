"""Typed results: ``output_type`` through ScriptedModel, natively and with the final-result
tool; the repair turn and its failure; streaming; declarations that fail; and structured
runs that compact or recover from an overflow halfway."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Generic, Literal, TypedDict, TypeVar

import attrs
import pytest
import typing_extensions

from littleghost import Agent, Message, Role, ToolCall, manage_context, tool
from littleghost.errors import (
    ConfigurationError,
    ContextWindowOverflowError,
    OutputValidationError,
)
from littleghost.events import RunFinished, TextDelta
from littleghost.models import ModelRequest, ModelResponse, OutputSchema, StopReason
from littleghost.output import OUTPUT_TOOL
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import ScriptedModel, streamed, text_response, tool_call_response

from .conversations import chat, compacting, summary_step

pytestmark = pytest.mark.anyio


@attrs.frozen
class Invoice:
    number: str
    total: float
    paid: bool = False


@dataclasses.dataclass(frozen=True)
class Address:
    city: str
    zip_code: str


class Contact(TypedDict):
    name: str
    phone: str


@dataclasses.dataclass
class Node:
    children: list[Node]


Item = TypeVar("Item")
Other = TypeVar("Other")


@dataclasses.dataclass
class Page(Generic[Item]):
    items: list[Item]
    first: Item | None = None


@attrs.frozen
class Pair(Generic[Item, Other]):
    left: Item
    right: dict[str, Other]


class Priority(enum.Enum):
    LOW = "low"
    HIGH = "high"


class Nothing(enum.Enum):
    pass


@attrs.frozen
class Level:
    result: str = attrs.field(validator=attrs.validators.in_(["low", "high"]))  # echoes the value


OBJECT = {"type": "object", "additionalProperties": False}
ADDRESS = {
    **OBJECT,
    "properties": {"city": {"type": "string"}, "zip_code": {"type": "string"}},
    "required": ["city", "zip_code"],
}


def wrapped(schema: dict[str, Any]) -> dict[str, Any]:
    return {**OBJECT, "properties": {"result": schema}, "required": ["result"]}


# (output type, the JSON the model answers, the value it becomes, the request's schema)
KINDS: list[tuple[Any, Any, Any, dict[str, Any]]] = [
    (
        Invoice,
        {"number": "A-7", "total": 12.5},
        Invoice("A-7", 12.5),
        {
            **OBJECT,
            "properties": {
                "number": {"type": "string"},
                "total": {"type": "number"},
                "paid": {"type": "boolean", "default": False},
            },
            "required": ["number", "total"],
        },
    ),
    (
        Address,
        {"city": "Lyon", "zip_code": "69001"},
        Address("Lyon", "69001"),
        {
            **OBJECT,
            "properties": {"city": {"type": "string"}, "zip_code": {"type": "string"}},
            "required": ["city", "zip_code"],
        },
    ),
    (
        Contact,
        {"name": "Ada", "phone": "555"},
        {"name": "Ada", "phone": "555"},
        {
            **OBJECT,
            "properties": {"name": {"type": "string"}, "phone": {"type": "string"}},
            "required": ["name", "phone"],
        },
    ),
    (
        Page[Address],
        {"items": [{"city": "Lyon", "zip_code": "69001"}]},
        Page([Address("Lyon", "69001")]),
        {
            **OBJECT,
            "properties": {
                "items": {"type": "array", "items": ADDRESS},
                "first": {"anyOf": [ADDRESS, {"type": "null"}], "default": None},
            },
            "required": ["items"],
        },
    ),
    (
        Pair[int, Page[str]],
        {"left": 1, "right": {"p": {"items": ["q"]}}},
        Pair(1, {"p": Page(["q"])}),
        {
            **OBJECT,
            "properties": {
                "left": {"type": "integer"},
                "right": {
                    "type": "object",
                    "additionalProperties": {
                        **OBJECT,
                        "properties": {
                            "items": {"type": "array", "items": {"type": "string"}},
                            "first": {
                                "anyOf": [{"type": "string"}, {"type": "null"}],
                                "default": None,
                            },
                        },
                        "required": ["items"],
                    },
                },
            },
            "required": ["left", "right"],
        },
    ),
    (
        list[int],
        {"result": [3, 1, 2]},
        [3, 1, 2],
        wrapped({"type": "array", "items": {"type": "integer"}}),
    ),
    (
        Literal["yes", "no"],
        {"result": "no"},
        "no",
        wrapped({"enum": ["yes", "no"]}),
    ),
    (Priority, {"result": "high"}, Priority.HIGH, wrapped({"enum": ["low", "high"]})),
    (int, {"result": 42}, 42, wrapped({"type": "integer"})),
    (float, {"result": 2.5}, 2.5, wrapped({"type": "number"})),
    (bool, {"result": True}, True, wrapped({"type": "boolean"})),
]
KIND_IDS = [
    "attrs",
    "dataclass",
    "TypedDict",
    "generic dataclass",
    "generic attrs",
    "list",
    "Literal",
    "enum",
    "int",
    "float",
    "bool",
]


class Plain(Agent):
    instructions = "Answer."


class Typed(Agent):
    output_type = Invoice


class TestEveryKind:
    @pytest.mark.parametrize(("kind", "answer", "expected", "schema"), KINDS, ids=KIND_IDS)
    async def test_natively(self, kind: Any, answer: Any, expected: Any, schema: Any) -> None:
        """A model that takes a schema is sent it; its JSON answer becomes the typed value."""
        model = ScriptedModel([text_response(json.dumps(answer))])
        result = await Plain(model=model).run("go", output_type=kind)
        assert result.output == expected and type(result.output) is type(expected)
        [request] = model.requests
        assert request.output_schema is not None
        assert request.output_schema.schema == schema
        assert request.tools == () and "tool_choice" not in request.settings

    @pytest.mark.parametrize(("kind", "answer", "expected", "schema"), KINDS, ids=KIND_IDS)
    async def test_with_the_final_result_tool(
        self, kind: Any, answer: Any, expected: Any, schema: Any
    ) -> None:
        """A model that takes no schema gets a final-result tool it must call; the call's
        arguments become the typed value, and the call gets a result in the log."""
        model = ScriptedModel(
            [tool_call_response(OUTPUT_TOOL, answer, call_id="c1")],
            supports_output_schema=False,
        )
        result = await Plain(model=model).run("go", output_type=kind)
        assert result.output == expected and type(result.output) is type(expected)
        [request] = model.requests
        assert request.output_schema is None
        assert [spec.name for spec in request.tools] == [OUTPUT_TOOL]
        assert request.tools[0].parameters == schema
        assert request.settings["tool_choice"] == "required"
        assert result.messages[-1].tool_results[0].call_id == "c1"
        assert not result.messages[-1].tool_results[0].is_error


class TestDeclaring:
    async def test_the_class_declares_it_and_run_overrides_it(self) -> None:
        """``output_type`` on the class applies to every run; ``run(output_type=)`` wins
        for one run, and ``str`` asks for free text."""
        answer = json.dumps({"number": "A-1", "total": 3})
        model = ScriptedModel([text_response(answer), text_response('{"result": 7}')])
        agent = Typed(model=model)
        assert (await agent.run("go")).output == Invoice("A-1", 3.0)
        assert (await agent.run("go", output_type=int)).output == 7
        text = ScriptedModel([text_response("just text")])
        result = await Typed(model=text).run("go", output_type=str)
        assert result.output == "just text" and text.requests[0].output_schema is None

    @pytest.mark.parametrize("name", ["Invoice", "int", "str", "list[Invoice]"])
    async def test_a_type_s_name_in_place_of_the_type_fails_saying_so(self, name: str) -> None:
        """``output_type = "Invoice"`` (the class defined further down) said the type
        ``'Invoice'`` could not be described as JSON schema, listing the types it takes;
        ``"str"`` was not free text either."""
        told = (
            f"must be a type, not the str {name!r} (a type's name is not resolved: give the "
            "type itself, defined before it is used)"
        )
        with pytest.raises(ConfigurationError) as declared:
            type("Named", (Agent,), {"output_type": name})
        assert str(declared.value) == f"Named.output_type {told}"
        model = ScriptedModel([text_response("7")])
        with pytest.raises(ConfigurationError) as given:
            await Typed(model=model).run("go", output_type=name)
        assert str(given.value) == f"run(output_type=) {told}"
        assert model.requests == []

    async def test_the_strategy_can_be_chosen(self) -> None:
        """``output_strategy="tool"`` uses the final-result tool even with a model that takes
        schemas; ``"native"`` with a model that takes none fails before any call."""

        class ByTool(Typed):
            output_strategy = "tool"

        model = ScriptedModel([tool_call_response(OUTPUT_TOOL, {"number": "B", "total": 1})])
        assert (await ByTool(model=model).run("go")).output == Invoice("B", 1.0)
        assert model.requests[0].output_schema is None

        no_schema = ScriptedModel([], supports_output_schema=False)
        with pytest.raises(ConfigurationError, match="output_strategy='native'"):
            await Typed(model=no_schema, output_strategy="native").run("go")
        assert no_schema.requests == []

    async def test_auto_takes_the_tool_for_a_schema_the_model_cannot_take(self) -> None:
        """A model's ``output_schema_problem`` decides per schema: ``auto`` asks natively
        for a schema it takes and uses the final-result tool for one it names a problem
        with; ``native`` with such a schema fails before any call, naming the problem."""
        model = ScriptedModel(
            [
                text_response('{"number": "A", "total": 1}'),
                tool_call_response(OUTPUT_TOOL, {"result": {"a": 1}}),
            ],
            output_schema_problem=lambda schema: schema.closed_problem,
        )
        assert (await Typed(model=model).run("go")).output == Invoice("A", 1.0)
        counts = await Typed(model=model).run("go", output_type=dict[str, int])
        assert counts.output == {"a": 1}
        native, by_tool = model.requests
        assert native.output_schema is not None and native.tools == ()
        assert by_tool.output_schema is None and by_tool.tools[0].name == OUTPUT_TOOL
        strict = Typed(model=model, output_strategy="native")
        with pytest.raises(ConfigurationError, match="natively: an open object"):
            await strict.run("go", output_type=dict[str, int])
        assert len(model.requests) == 2

    async def test_a_tool_choice_in_the_settings_wins(self) -> None:
        """The final-result tool is required unless the settings name a tool choice."""
        model = ScriptedModel(
            [tool_call_response(OUTPUT_TOOL, {"result": 1})], supports_output_schema=False
        )
        await Plain(model=model).run("go", output_type=int, settings={"tool_choice": "auto"})
        assert model.requests[0].settings["tool_choice"] == "auto"

    @pytest.mark.parametrize(
        "choice",
        [
            "none",
            {"type": "none"},
            {"type": "function", "function": {"name": "lookup"}},
            {"type": "tool", "name": "lookup"},
        ],
    )
    async def test_a_tool_choice_that_leaves_no_final_result_call_fails_before_any_call(
        self, choice: Any
    ) -> None:
        """A choice forbidding tool calls, or forcing another tool, where the answer must
        come by the final-result tool: at definition with ``output_strategy="tool"``, at
        the run's start when ``auto`` falls back to it (a native run takes it)."""
        settings = {"tool_choice": choice}
        blocked = r"tool_choice=.* leaves the model no call of the final_result tool"
        with pytest.raises(ConfigurationError, match=rf"^ByTool\.settings: {blocked}"):
            type(
                "ByTool",
                (Agent,),
                {"output_type": Invoice, "output_strategy": "tool", "settings": settings},
            )
        with pytest.raises(ConfigurationError, match=rf"^Typed\(…, settings=\): {blocked}"):
            Typed(output_strategy="tool", settings=settings)
        model = ScriptedModel([], supports_output_schema=False)
        with pytest.raises(ConfigurationError, match=blocked):
            await Typed(model=model).run("go", settings=settings)
        with pytest.raises(ConfigurationError, match=blocked):
            await Plain(model=model, settings=settings).run("go", output_type=int)
        assert model.requests == []
        native = ScriptedModel([text_response('{"number": "A", "total": 1}')])
        assert (await Typed(model=native).run("go", settings=settings)).output.number == "A"
        forced = {"type": "function", "function": {"name": OUTPUT_TOOL}}
        by_tool = type("ByTool", (Agent,), {"output_type": int, "output_strategy": "tool"})
        by_tool(settings={"tool_choice": forced})

    @pytest.mark.parametrize(
        ("declare", "message"),
        [
            (lambda: type("Bad", (Agent,), {"output_type": object}), "Bad.output_type"),
            (lambda: type("Bad", (Agent,), {"output_type": set[bytes]}), "Bad.output_type"),
            (
                lambda: type("Bad", (Agent,), {"output_type": Nothing}),
                "Bad.output_type: the enum Nothing has no members",
            ),
            (
                lambda: type("Bad", (Agent,), {"output_type": Literal[()]}),
                "Bad.output_type: an empty Literal allows no value",
            ),
            (lambda: type("Bad", (Agent,), {"output_strategy": "json"}), "Bad.output_strategy"),
            (lambda: Plain(output_type=complex), r"Plain\(…, output_type=\)"),
            (lambda: Plain(output_strategy=None), r"Plain\(…, output_strategy=\)"),
        ],
    )
    def test_invalid_declarations_fail_when_made(
        self, declare: Callable[[], object], message: str
    ) -> None:
        """An output type that cannot be a JSON schema, or an unknown strategy, is a
        ConfigurationError when the class is defined (or the agent made), naming it."""
        with pytest.raises(ConfigurationError, match=message):
            declare()

    def test_a_recursive_or_unresolvable_type_fails_when_declared(self) -> None:
        """Recursive records and annotations that cannot be resolved fail at definition."""
        with pytest.raises(ConfigurationError, match="contains itself"):
            type("Tree", (Agent,), {"output_type": Node})

        @dataclasses.dataclass
        class Dangling:
            other: Missing  # type: ignore[name-defined]  # noqa: F821

        with pytest.raises(ConfigurationError, match="cannot be resolved"):
            type("Broken", (Agent,), {"output_type": Dangling})

    def test_a_tool_cannot_take_the_final_result_name(self) -> None:
        """A tool named like the final-result tool clashes with an output type."""
        with pytest.raises(ConfigurationError, match=OUTPUT_TOOL):

            class Clash(Agent):
                output_type = Invoice

                @tool(name=OUTPUT_TOOL)
                def finish(self) -> str:
                    """Finish."""
                    return "done"

    async def test_free_text_leaves_the_final_result_name_to_a_tool(self) -> None:
        """``str`` is free text, as ``None`` is: no final-result tool is offered, so a tool
        of that name is the agent's own, on the class and in the constructor alike."""

        class Finisher(Agent):
            output_type = str

            @tool(name=OUTPUT_TOOL)
            def finish(self) -> str:
                """Finish."""
                return "done"

        model = ScriptedModel([tool_call_response(OUTPUT_TOOL, {}), text_response("free")])
        result = await Finisher(model=model).run("go")
        assert result.output == "free"
        assert tool_result_texts(model.requests[1].messages) == [("done", False)]

        def final_result() -> str:
            """Finish."""
            return "done"

        untyped = type("Untyped", (Agent,), {"tools": [final_result]})
        assert untyped(output_type=str).output is None

    def test_a_response_format_beside_an_output_type_fails_at_definition(self) -> None:
        """Declared together on a class (or one by the constructor), they clash at once."""
        clash = r"Formatted\.settings: response_format cannot be set when an output_type"
        with pytest.raises(ConfigurationError, match=clash):

            class Formatted(Agent):
                output_type = Invoice
                settings = {"response_format": {"type": "text"}}

        formatted = type("Formatted", (Typed,), {})
        with pytest.raises(ConfigurationError, match=clash):
            formatted(settings={"response_format": {"type": "text"}})
        text = type("Formatted", (Agent,), {"settings": {"response_format": {"type": "text"}}})
        assert text(output_type=str).output is None

    async def test_bad_run_arguments_fail_before_any_call(self) -> None:
        """A bad ``run(output_type=)``, or a response format set beside an output type,
        fails before the model is called; the error names the method it was given to."""
        model = ScriptedModel([])
        with pytest.raises(ConfigurationError, match=r"^run\(output_type=\)"):
            await Plain(model=model).run("go", output_type=bytes)
        with pytest.raises(ConfigurationError, match=r"^stream\(output_type=\)"):
            Plain(model=model).stream("go", output_type=bytes)
        with pytest.raises(ConfigurationError, match=r"^run_sync\(output_type=\)"):
            Plain(model=model).run_sync("go", output_type=bytes)
        with pytest.raises(ConfigurationError, match="response_format"):
            await Typed(model=model).run("go", settings={"response_format": {"type": "text"}})
        assert model.requests == []


def answering(answers: list[Any], native: bool) -> ScriptedModel:
    """A model that gives ``answers`` in turn, natively or as the output tool's calls."""
    return ScriptedModel(
        [
            text_response(json.dumps(answer))
            if native
            else tool_call_response(OUTPUT_TOOL, answer, call_id=f"c{n}")
            for n, answer in enumerate(answers)
        ],
        supports_output_schema=native,
    )


def tool_result_texts(messages: tuple[Message, ...]) -> list[tuple[str, bool]]:
    return [
        (result.content, result.is_error) for message in messages for result in message.tool_results
    ]


class TestRepair:
    async def test_a_native_answer_that_does_not_fit_gets_one_repair_turn(self) -> None:
        """The model is shown what did not fit, as a user message after its answer, and
        answers again."""
        model = ScriptedModel(
            [text_response('{"number": "A-1"}'), text_response('{"number": "A-1", "total": 9}')]
        )
        result = await Typed(model=model).run("go")
        assert result.output == Invoice("A-1", 9.0)
        second = model.requests[1].messages
        assert second[-2].text == '{"number": "A-1"}'
        assert second[-1].role is Role.USER
        assert "missing field 'total'" in second[-1].text
        assert result.messages[-3:-1] == second[-2:]

    async def test_a_second_answer_that_does_not_fit_raises_with_the_raw_reply(self) -> None:
        """After the one repair turn, OutputValidationError carries the raw reply and the
        errors; the session keeps every message of the run."""
        store = InMemorySessionStore()
        model = ScriptedModel([text_response("not json"), text_response('{"total": "x"}')])
        with pytest.raises(OutputValidationError) as caught:
            await Typed(model=model, session_store=store).run("go", session_id="s")
        error = caught.value
        assert error.raw == '{"total": "x"}'
        assert error.errors == (
            "answer: missing field 'number'",
            "answer.total: expected a number, got a string",
        )
        assert error.response is not None and error.response.message.text == '{"total": "x"}'
        assert "not json" not in str(error) and '"x"' not in str(error)
        stored = await store.load("s")
        assert [m.role for m in stored] == [Role.USER, Role.ASSISTANT, Role.USER, Role.ASSISTANT]
        assert "not valid JSON" in stored[2].text
        assert len(model.requests) == 2

    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    async def test_every_problem_of_an_answer_is_told_in_its_one_repair_turn(
        self, native: bool
    ) -> None:
        """An answer is checked whole: the repair turn tells every problem (an unexpected
        field, a field of another type, a missing one; a nested record's and each item's
        too), not the first alone, so a model that mends what it is told fits at its one
        repair; a second misfit's ``errors`` name each problem."""

        @dataclasses.dataclass
        class Order:
            invoice: Invoice
            address: Address
            lines: list[int]

        wrong = {
            "invoice": {"number": 7, "total": 9},
            "address": {"city": "Lyon"},
            "lines": [1, "two", "three"],
            "note": "x",
        }
        problems = (
            "answer: unexpected field 'note'",
            "answer.invoice.number: expected a string, got a number",
            "answer.address: missing field 'zip_code'",
            "answer.lines[1]: expected an integer, got a string",
            "answer.lines[2]: expected an integer, got a string",
        )
        right = {
            "invoice": {"number": "7", "total": 9},
            "address": {"city": "Lyon", "zip_code": "69001"},
            "lines": [1, 2, 3],
        }
        model = answering([wrong, right], native)
        result = await Plain(model=model).run("go", output_type=Order)
        assert result.output == Order(Invoice("7", 9.0), Address("Lyon", "69001"), [1, 2, 3])
        told = model.requests[1].messages[-1]
        text = told.text if native else told.tool_results[0].content
        assert all(problem in text for problem in problems)
        with pytest.raises(OutputValidationError) as caught:
            await Plain(model=answering([wrong, wrong], native)).run("go", output_type=Order)
        assert caught.value.errors == problems

    async def test_the_problems_of_a_runaway_answer_stop_at_twenty(self) -> None:
        """Past 20 problems among an array's items the rest are left unchecked, and the
        last problem says so: a runaway answer is not checked item by item; past 20
        unexpected fields, how many more there are is told."""
        wrong = {"result": ["x"] * 100_000}
        with pytest.raises(OutputValidationError) as caught:
            await Plain(model=answering([wrong, wrong], True)).run("go", output_type=list[int])
        errors = caught.value.errors
        assert errors[:20] == tuple(
            f"result[{i}]: expected an integer, got a string" for i in range(20)
        )
        assert errors[20:] == ("result[20] and on: not checked, after 20 problems",)
        many = {f"k{i:03}": i for i in range(100)}
        with pytest.raises(OutputValidationError) as caught:
            await Plain(model=answering([many, many], True)).run("go", output_type=Address)
        errors = caught.value.errors
        assert errors[:20] == tuple(f"answer: unexpected field 'k{i:03}'" for i in range(20))
        assert errors[20:] == (
            "answer: unexpected field: 80 more",
            "answer: missing field 'city'",
            "answer: missing field 'zip_code'",
        )

    @pytest.mark.parametrize("strategy", ["native", "tool"])
    async def test_a_filtered_answer_ends_the_run_without_a_repair_turn(
        self, strategy: str
    ) -> None:
        """A refused or filtered answer ends the run, as without an output type: it does
        not fit, so ``OutputValidationError`` at once (it was asked again, as if the
        refusal were malformed JSON, and reported as such)."""
        refused = text_response("I can't help with that.", stop_reason=StopReason.CONTENT_FILTER)
        fitting = text_response('{"number": "A-1", "total": 9}')
        model = ScriptedModel([refused, fitting], supports_output_schema=strategy == "native")
        with pytest.raises(OutputValidationError, match="filtered") as caught:
            await Typed(model=model, output_strategy=strategy).run("go")
        assert len(model.requests) == 1
        assert caught.value.response is not None
        assert caught.value.response.stop_reason is StopReason.CONTENT_FILTER

    async def test_a_filtered_final_result_call_is_answered_and_ends_the_run(self) -> None:
        """A filtered answer's ``final_result`` call, fitting or not, is answered, not
        run; the error says so (it said the answer must be given by calling the tool,
        which the model had done)."""
        store = InMemorySessionStore()
        call = ToolCall("c1", OUTPUT_TOOL, {"result": {"number": "A-1", "total": 9}})
        filtered = ModelResponse(Message.assistant(tool_calls=(call,)), StopReason.CONTENT_FILTER)
        model = ScriptedModel([filtered, filtered])
        agent = Typed(model=model, output_strategy="tool", session_store=store)
        with pytest.raises(OutputValidationError, match="filtered") as caught:
            await agent.run("go", session_id="s")
        assert caught.value.errors == (
            f"its {OUTPUT_TOOL} call was not run: the provider filtered the answer (or the "
            "model refused it)",
        )
        assert len(model.requests) == 1
        stored = await store.load("s")
        assert [m.role for m in stored] == [Role.USER, Role.ASSISTANT, Role.TOOL]
        (answered,) = stored[-1].tool_results
        assert answered.call_id == "c1" and answered.is_error

    async def test_a_final_result_call_that_does_not_fit_is_answered_with_the_errors(
        self,
    ) -> None:
        """With the final-result tool, what did not fit is the call's error result; a
        second misfit raises, with the call answered in the log all the same."""
        store = InMemorySessionStore()
        model = ScriptedModel(
            [
                tool_call_response(OUTPUT_TOOL, {"result": "many"}, call_id="c1"),
                tool_call_response(OUTPUT_TOOL, '{"result": ', call_id="c2"),
            ],
            supports_output_schema=False,
        )
        with pytest.raises(OutputValidationError) as caught:
            await Plain(model=model, session_store=store).run("go", output_type=int, session_id="s")
        assert caught.value.raw == '{"result": '
        first, second = tool_result_texts(await store.load("s"))
        assert first[1] and "result: expected an integer" in first[0]
        assert second[1] and "not valid JSON" in second[0]

    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    async def test_a_misfit_on_the_last_turn_raises_with_the_raw_reply(self, native: bool) -> None:
        """With no turn left for the repair, OutputValidationError (not the turn limit)
        carries the raw reply; the log holds no repair request, and the final-result call
        is answered."""
        store = InMemorySessionStore()
        misfit = (
            text_response('{"result": "many"}')
            if native
            else tool_call_response(OUTPUT_TOOL, {"result": "many"}, call_id="c1")
        )
        model = ScriptedModel([misfit], supports_output_schema=native)
        agent = Plain(model=model, session_store=store, max_turns=1)
        with pytest.raises(OutputValidationError, match="max_turns=1") as caught:
            await agent.run("go", output_type=int, session_id="s")
        assert caught.value.raw == '{"result": "many"}'
        assert caught.value.errors == ("result: expected an integer, got a string",)
        stored = await store.load("s")
        roles = [Role.USER, Role.ASSISTANT] + ([] if native else [Role.TOOL])
        assert [m.role for m in stored] == roles
        if not native:
            assert stored[-1].tool_results[0].call_id == "c1"

    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    async def test_a_validator_error_that_cannot_be_shown_is_told_by_its_type(
        self, native: bool
    ) -> None:
        """A validator whose exception has no message it can show (its ``__str__`` fails,
        or the message is empty) is told by the exception's type; the run goes on to its
        repair turn, then raises OutputValidationError."""

        class APIError(ValueError):
            def __str__(self) -> str:
                raise AttributeError("status")

        @attrs.frozen
        class Checked:
            code: str

            def __attrs_post_init__(self) -> None:
                raise APIError() if self.code == "bad" else ValueError()

        answers = [{"code": "bad"}, {"code": "worse"}]
        model = answering(answers, native)
        with pytest.raises(OutputValidationError) as caught:
            await Plain(model=model).run("go", output_type=Checked)
        assert caught.value.errors == ("answer: ValueError",)
        told = model.requests[1].messages[-1]
        assert "answer: APIError (its message could not be shown)" in (
            told.text if native else told.tool_results[0].content
        )

    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    async def test_an_assertion_in_a_constructor_is_a_misfit(self, native: bool) -> None:
        """An ``AssertionError`` refuses the answer, as pydantic's validators take it: the
        model gets its repair turn."""

        @attrs.frozen
        class Positive:
            count: int

            def __attrs_post_init__(self) -> None:
                assert self.count > 0, "count must be positive"

        answers = [{"count": 0}, {"count": 2}]
        model = answering(answers, native)
        result = await Plain(model=model).run("go", output_type=Positive)
        assert result.output == Positive(2)
        told = model.requests[1].messages[-1]
        assert "answer: count must be positive" in (
            told.text if native else told.tool_results[0].content
        )

    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    @pytest.mark.parametrize("bug", [KeyError, TypeError, AttributeError])
    async def test_a_bug_in_the_output_types_code_raises_without_a_repair_turn(
        self, native: bool, bug: type[Exception]
    ) -> None:
        """An exception of the type's own code that is not a refusal (not a
        ``ValueError`` or an ``AssertionError``) is a bug, not the model's misfit: the run
        raises it as it is, with its traceback, and asks the model nothing more (a billed
        repair turn was made, and the bug reported as the model's answer). The answer,
        billed, stays in the log, and a final-result call is answered."""

        @attrs.frozen
        class Checked:
            code: str

            def __attrs_post_init__(self) -> None:
                raise bug("the lookup table is not loaded")

        store = InMemorySessionStore()
        answer = {"code": "A"}
        fitting = {"code": "B"}
        model = answering([answer, fitting], native)
        agent = Plain(model=model, session_store=store)
        with pytest.raises(bug, match="lookup table") as caught:
            await agent.run("go", output_type=Checked, session_id="s")
        assert caught.traceback[-1].name == "__attrs_post_init__"
        assert len(model.requests) == 1
        stored = await store.load("s")
        roles = [Role.USER, Role.ASSISTANT] + ([] if native else [Role.TOOL])
        assert [m.role for m in stored] == roles
        if not native:
            assert stored[-1].tool_results[0].call_id == "c0"

    async def test_a_text_answer_is_asked_to_call_the_final_result_tool(self) -> None:
        """With the final-result tool, a text answer is repaired by asking for the call."""
        model = ScriptedModel(
            [text_response("It is 4."), tool_call_response(OUTPUT_TOOL, {"result": 4})],
            supports_output_schema=False,
        )
        result = await Plain(model=model).run("go", output_type=int)
        assert result.output == 4
        assert model.requests[1].messages[-1].text == (
            f"Give your final answer by calling the {OUTPUT_TOOL} tool."
        )

    async def test_other_calls_beside_the_final_result_are_answered_not_run(self) -> None:
        """Calls made in the same turn as the final answer are not run; each gets a result."""
        ran: list[str] = []

        class WithTool(Plain):
            @tool
            def look(self) -> str:
                """Look."""
                ran.append("look")
                return "seen"

        response = ModelResponse(
            Message.assistant(
                tool_calls=[
                    ToolCall("c1", "look", {}),
                    ToolCall("c2", OUTPUT_TOOL, {"result": True}),
                ]
            ),
            StopReason.TOOL_USE,
        )
        model = ScriptedModel([response], supports_output_schema=False)
        result = await WithTool(model=model).run("go", output_type=bool)
        assert result.output is True and ran == []
        (look, final) = tool_result_texts(result.messages)
        assert look[1] and look[0].startswith("Not run")
        assert final == ("The final answer was received.", False)

    @pytest.mark.parametrize("max_turns", [1, 5])
    async def test_the_first_fitting_final_result_of_a_turn_is_the_answer(
        self, max_turns: int
    ) -> None:
        """Of several final-result calls in one turn, the first that fits is taken (one
        not fitting before it threw the answer away, or failed with no turn left)."""
        calls = [
            ToolCall("c1", OUTPUT_TOOL, {"result": "many"}),
            ToolCall("c2", OUTPUT_TOOL, {"result": 4}),
        ]
        response = ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE)
        model = ScriptedModel([response], supports_output_schema=False)
        result = await Plain(model=model, max_turns=max_turns).run("go", output_type=int)
        assert result.output == 4 and len(model.requests) == 1
        (first, second) = tool_result_texts(result.messages)
        assert first == (
            f"Not run: the final answer was given with {OUTPUT_TOOL} in the same turn.",
            True,
        )
        assert second == ("The final answer was received.", False)

    async def test_each_final_result_that_does_not_fit_is_told_its_own_errors(self) -> None:
        """When no final-result call of a turn fits, each is told what is wrong with its
        own arguments (the second was told only that the answer did not fit)."""
        calls = [
            ToolCall("c1", OUTPUT_TOOL, {"result": "many"}),
            ToolCall("c2", OUTPUT_TOOL, {"answer": 4}),
        ]
        response = ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE)
        fitting = tool_call_response(OUTPUT_TOOL, {"result": 4}, call_id="c3")
        model = ScriptedModel([response, fitting], supports_output_schema=False)
        result = await Plain(model=model).run("go", output_type=int)
        assert result.output == 4
        (first, second, _) = tool_result_texts(result.messages)
        assert first[1] and second[1]
        assert "does not fit its schema" in first[0] and "expected an integer" in first[0]
        assert "does not fit its schema" in second[0] and "result" in second[0]
        assert first[0] != second[0]

    async def test_calls_beside_a_final_result_that_does_not_fit_are_told_so(self) -> None:
        """When no final-result call of a turn fits, the turn's other calls are not run and
        their results say the answer did not fit (not that it was given)."""
        calls = [ToolCall("c1", "look", {}), ToolCall("c2", OUTPUT_TOOL, {"result": "many"})]
        response = ModelResponse(Message.assistant(tool_calls=calls), StopReason.TOOL_USE)
        fitting = tool_call_response(OUTPUT_TOOL, {"result": 4}, call_id="c3")
        model = ScriptedModel([response, fitting], supports_output_schema=False)

        class WithTool(Plain):
            @tool
            def look(self) -> str:
                """Look."""
                return "seen"

        result = await WithTool(model=model).run("go", output_type=int)
        assert result.output == 4
        look, final, _ = tool_result_texts(result.messages)
        assert look == (
            "Not run: the final answer given in the same turn did not fit its schema.",
            True,
        )
        assert final[1] and "does not fit its schema" in final[0]

    async def test_tools_run_before_the_typed_answer(self) -> None:
        """The agent's own tools run as usual until the final answer."""

        class Lookup(Typed):
            @tool
            def find(self, number: str) -> float:
                """Find an invoice's total."""
                return 12.0

        model = ScriptedModel(
            [
                tool_call_response("find", {"number": "A"}),
                text_response('{"number": "A", "total": 12.0, "paid": true}'),
            ]
        )
        result = await Lookup(model=model).run("go")
        assert result.output == Invoice("A", 12.0, paid=True)
        assert model.requests[1].output_schema == model.requests[0].output_schema

    @pytest.mark.parametrize(
        ("number", "problem"),
        [
            ("NaN", "NaN is not a JSON number"),
            ("Infinity", "Infinity is not a JSON number"),
            ("-Infinity", "-Infinity is not a JSON number"),
            ("1e400", "the number 1e400 is too large for a float"),
        ],
    )
    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    async def test_a_number_that_is_not_finite_is_repaired_then_raises(
        self, native: bool, number: str, problem: str
    ) -> None:
        """NaN and infinity are not JSON, and 1e400 is no float: each gets the repair turn,
        then OutputValidationError; the session stores the run, with the final-result
        call's arguments as their text."""
        reply = f'{{"result": {number}}}'
        step = (
            text_response(reply) if native else tool_call_response(OUTPUT_TOOL, reply, call_id="c")
        )
        store = InMemorySessionStore()
        model = ScriptedModel([step, step], supports_output_schema=native)
        agent = Plain(model=model, session_store=store)
        with pytest.raises(OutputValidationError) as caught:
            await agent.run("go", output_type=float, session_id="s")
        assert caught.value.raw == reply
        assert caught.value.errors == (f"the answer is not valid JSON: {problem}",)
        assert len(model.requests) == 2 and len(await store.load("s")) == 4 + (not native)

    @pytest.mark.parametrize("levels", [101, 100_000], ids=["deep", "past-python"])
    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    async def test_an_answer_nested_too_deep_is_repaired_then_raises_saying_so(
        self, native: bool, levels: int
    ) -> None:
        """JSON nested deeper than Python's parser goes (its RecursionError) was told as
        "not valid JSON": it is nested too deep, as one littleghost reads and refuses is
        told, with the same repair turn and OutputValidationError."""
        reply = '{"result": ' + "[" * levels + "]" * levels + "}"
        step = (
            text_response(reply) if native else tool_call_response(OUTPUT_TOOL, reply, call_id="c")
        )
        model = ScriptedModel([step, step], supports_output_schema=native)
        with pytest.raises(OutputValidationError) as caught:
            await Plain(model=model).run("go", output_type=list[Any])
        assert caught.value.errors == ("the answer is nested more than 100 levels deep",)
        assert len(model.requests) == 2

    async def test_final_result_arguments_holding_a_non_finite_float_are_kept_as_text(
        self,
    ) -> None:
        """A model that hands over parsed arguments holding infinity gets the repair turn,
        and the session stores the arguments as their JSON text."""
        step = tool_call_response(OUTPUT_TOOL, {"result": [1.0, float("inf")]}, call_id="c")
        store = InMemorySessionStore()
        model = ScriptedModel([step, step], supports_output_schema=False)
        with pytest.raises(OutputValidationError) as caught:
            await Plain(model=model, session_store=store).run(
                "go", output_type=list[float], session_id="s"
            )
        assert caught.value.errors == (
            "the answer is not valid JSON: Infinity is not a JSON number",
        )
        stored = await store.load("s")
        assert stored[1].tool_calls[0].arguments == '{"result": [1.0, Infinity]}'

    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    @pytest.mark.parametrize(
        "output_type", [Literal["low", "high"], Level], ids=["Literal", "validator"]
    )
    async def test_what_a_misfit_is_told_is_short_whatever_the_answer(
        self, native: bool, output_type: Any
    ) -> None:
        """A huge answer is not echoed whole in the repair message or the final-result
        call's error result: the value is abbreviated, and what a validator says is cut
        to max_tool_result_tokens."""
        huge = "z" * 100_000
        if native:
            misfit, good = text_response(json.dumps({"result": huge})), text_response("{}")
        else:
            misfit = tool_call_response(OUTPUT_TOOL, {"result": huge}, call_id="c1")
            good = tool_call_response(OUTPUT_TOOL, {}, call_id="c2")
        model = ScriptedModel([misfit, good], supports_output_schema=native)
        agent = Plain(model=model, max_tool_result_tokens=100)
        with pytest.raises(OutputValidationError):  # "{}" does not fit either
            await agent.run("go", output_type=output_type)
        told = model.requests[1].messages[-1]
        text = told.text if native else told.tool_results[0].content
        assert "result" in text and len(text) < 1_000

    async def test_an_unknown_tool_is_told_the_final_result_tool_is_there(self) -> None:
        """The tools an unknown tool's error lists are those the model was offered, the
        final-result tool too."""

        class Lookup(Plain):
            @tool
            def lookup(self, number: str) -> str:
                """Look an invoice up."""
                return "paid"

        model = ScriptedModel(
            [
                tool_call_response("final_answer", {"result": 4}, call_id="c1"),
                tool_call_response(OUTPUT_TOOL, {"result": 4}, call_id="c2"),
            ],
            supports_output_schema=False,
        )
        result = await Lookup(model=model).run("go", output_type=int)
        assert result.output == 4
        (unknown, _) = tool_result_texts(result.messages)
        assert unknown == (
            f"Unknown tool 'final_answer'. Available tools: {OUTPUT_TOOL}, lookup.",
            True,
        )


class TestStreaming:
    async def test_text_deltas_then_the_typed_value(self) -> None:
        """Streaming yields the answer's text as it comes and the typed value at the end."""
        model = ScriptedModel([streamed('{"number": ', '"S-1", ', '"total": 5}')])
        async with Typed(model=model).stream("go") as events:
            seen = [event async for event in events]
        deltas = "".join(e.text for e in seen if isinstance(e, TextDelta))
        assert deltas == '{"number": "S-1", "total": 5}'
        assert isinstance(seen[-1], RunFinished)
        assert seen[-1].result.output == Invoice("S-1", 5.0)
        assert events.result.output == Invoice("S-1", 5.0)


@compacting
class Compacting(Agent):
    output_type = Invoice

    @tool
    def ping(self) -> str:
        """Ping."""
        return "pong"


def asks_for_output(request: ModelRequest, native: bool) -> bool:
    """True when ``request`` asks for the Invoice output, as the strategy does."""
    if native:
        return request.output_schema is not None and request.output_schema.name == "Invoice"
    return [t.name for t in request.tools] == ["ping", OUTPUT_TOOL] and (
        request.settings.get("tool_choice") == "required"
    )


def answer_step(native: bool) -> ModelResponse:
    payload = {"number": "C-3", "total": 30}
    if native:
        return text_response(json.dumps(payload))
    return tool_call_response(OUTPUT_TOOL, payload)


class TestCompaction:
    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    async def test_a_compaction_halfway_keeps_the_output_request(self, native: bool) -> None:
        """A compacted request still asks for the output (schema, or final-result tool and
        tool choice); the summary request asks for none; the typed value comes back."""
        model = ScriptedModel(
            [tool_call_response("ping", {}, input_tokens=60), summary_step(), answer_step(native)],
            supports_output_schema=native,
        )
        result = await Compacting(model=model).run("go", history=chat(5))
        first, summary, compacted = model.requests
        assert [r.purpose for r in model.requests] == ["chat", "context_compaction", "chat"]
        assert any(m.is_summary for m in compacted.messages)
        assert asks_for_output(first, native) and asks_for_output(compacted, native)
        assert summary.output_schema is None and summary.tools == ()
        assert "tool_choice" not in summary.settings
        assert result.output == Invoice("C-3", 30.0)

    @pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
    async def test_an_overflow_recovery_halfway_keeps_the_output_request(
        self, native: bool
    ) -> None:
        """The request retried after an overflow still asks for the output."""

        class Roomy(Compacting):
            pass

        Roomy.context_management = attrs.evolve(
            Compacting.context_management, compression_threshold=1.0, context_window_tokens=1_000
        )
        model = ScriptedModel(
            [
                tool_call_response("ping", {}),
                ContextWindowOverflowError("prompt is too long", provider="x"),
                summary_step(),
                answer_step(native),
            ],
            supports_output_schema=native,
        )
        result = await Roomy(model=model).run("go", history=chat(10))
        purposes = [r.purpose for r in model.requests]
        assert purposes == ["chat", "chat", "context_compaction", "chat"]
        overflowed, retried = model.requests[1], model.requests[3]
        assert any(m.is_summary for m in retried.messages)
        assert asks_for_output(overflowed, native) and asks_for_output(retried, native)
        assert model.requests[2].output_schema is None and model.requests[2].tools == ()
        assert result.output == Invoice("C-3", 30.0)

    async def test_the_estimate_counts_the_output_schema(self) -> None:
        """A large output schema alone can bring a request to the threshold."""

        @manage_context(
            context_window_tokens=2_000, compression_threshold=0.5, preserve_recent_messages=2
        )
        class Windowed(Agent):
            pass

        choices = tuple(f"choice number {index} of a long list" for index in range(150))
        big = Literal[choices]  # type: ignore[valid-type]
        plain = ScriptedModel([text_response("done")])
        await Windowed(model=plain).run("go", history=chat(3))
        assert [r.purpose for r in plain.requests] == ["chat"]
        typed = ScriptedModel([summary_step(), text_response('{"result": "' + choices[0] + '"}')])
        result = await Windowed(model=typed).run("go", history=chat(3), output_type=big)
        assert [r.purpose for r in typed.requests] == ["context_compaction", "chat"]
        assert result.output == choices[0]


@attrs.frozen
class Shipment:
    carrier: str
    weight: float | None = 1.0
    tags: list[Invoice] = attrs.Factory(list)


def test_a_strict_schema_requires_every_field_and_makes_the_optional_ones_nullable() -> None:
    """Strict mode wants every property required: an optional one becomes nullable
    (a type that takes null already stays as it is), nested objects too."""
    output = Plain(output_type=Shipment).output
    assert output is not None and output.schema.closed_problem is None
    invoice = {
        **OBJECT,
        "properties": {
            "number": {"type": "string"},
            "total": {"type": "number"},
            "paid": {"anyOf": [{"type": "boolean"}, {"type": "null"}]},
        },
        "required": ["number", "total", "paid"],
    }
    assert output.schema.strict_schema == {
        **OBJECT,
        "properties": {
            "carrier": {"type": "string"},
            "weight": {"anyOf": [{"type": "number"}, {"type": "null"}]},
            "tags": {"anyOf": [{"type": "array", "items": invoice}, {"type": "null"}]},
        },
        "required": ["carrier", "weight", "tags"],
    }


@dataclasses.dataclass(frozen=True)
class Payment:
    paid_at: datetime.datetime
    amount: decimal.Decimal
    order: uuid.UUID
    due: datetime.date | None = None
    opens: list[datetime.time] = dataclasses.field(default_factory=list)


ORDER = "8f14e45f-ceea-467f-a9f3-3b2a3ee2c4f1"
PAID = {"paid_at": "2026-05-01T09:30:00Z", "amount": "19.99", "order": ORDER}
CLOCK = {"type": "string", "pattern": "^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9]([.][0-9]+)?)?$"}


def test_dates_uuids_and_decimals_keep_their_formats_in_the_strict_schema() -> None:
    """Strings with the formats OpenAI's strict mode supports (date-time, date, uuid),
    a Decimal and a time of day by a pattern; optional ones nullable, as any field."""
    output = Plain(output_type=Payment).output
    assert output is not None and output.schema.closed_problem is None
    assert output.schema.strict_schema == {
        **OBJECT,
        "properties": {
            "paid_at": {"type": "string", "format": "date-time"},
            "amount": {"type": "string", "pattern": "^-?[0-9]+([.][0-9]+)?$"},
            "order": {"type": "string", "format": "uuid"},
            "due": {"anyOf": [{"type": "string", "format": "date"}, {"type": "null"}]},
            "opens": {"anyOf": [{"type": "array", "items": CLOCK}, {"type": "null"}]},
        },
        "required": ["paid_at", "amount", "order", "due", "opens"],
    }


@pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
async def test_dates_uuids_and_decimals_in_an_answer_are_their_python_types(
    native: bool,
) -> None:
    answer = {**PAID, "due": None, "opens": ["09:30:15.5"]}
    reply = (
        text_response(json.dumps(answer))
        if native
        else tool_call_response(OUTPUT_TOOL, answer, call_id="c1")
    )
    model = ScriptedModel([reply], supports_output_schema=native)
    result = await Plain(model=model).run("go", output_type=Payment)
    assert result.output == Payment(
        datetime.datetime(2026, 5, 1, 9, 30, tzinfo=datetime.timezone.utc),
        decimal.Decimal("19.99"),
        uuid.UUID(ORDER),
        None,
        [datetime.time(9, 30, 15, 500000)],
    )


@pytest.mark.parametrize(
    ("kind", "answer", "expected", "schema"),
    [
        (
            datetime.date,
            "2026-05-01",
            datetime.date(2026, 5, 1),
            {"type": "string", "format": "date"},
        ),
        (
            list[uuid.UUID],
            [ORDER],
            [uuid.UUID(ORDER)],
            {"type": "array", "items": {"type": "string", "format": "uuid"}},
        ),
        (datetime.time, "23:59", datetime.time(23, 59), CLOCK),
        (
            datetime.timedelta,
            "PT1H30M",
            datetime.timedelta(minutes=90),
            {"type": "string", "format": "duration"},
        ),
    ],
)
async def test_a_date_uuid_or_time_output_type_is_wrapped(
    kind: Any, answer: Any, expected: Any, schema: dict[str, Any]
) -> None:
    """Not an object, so it travels in ``{"result": ...}``, as a list or an int does."""
    model = ScriptedModel([text_response(json.dumps({"result": answer}))])
    result = await Plain(model=model).run("go", output_type=kind)
    assert result.output == expected
    assert model.requests[0].output_schema is not None
    assert model.requests[0].output_schema.schema == wrapped(schema)


@pytest.mark.parametrize("native", [True, False], ids=["native", "tool"])
async def test_a_malformed_date_or_decimal_in_an_answer_gets_the_repair_turn(
    native: bool,
) -> None:
    """A naive date-time, a Decimal as a JSON number: told where and what was expected,
    and the model answers again."""
    bad = {**PAID, "paid_at": "2026-05-01T09:30:00", "amount": 19.99}
    replies = [json.dumps(bad), json.dumps(PAID)]
    model = ScriptedModel(
        [text_response(reply) for reply in replies]
        if native
        else [
            tool_call_response(OUTPUT_TOOL, json.loads(reply), call_id=f"c{i}")
            for i, reply in enumerate(replies)
        ],
        supports_output_schema=native,
    )
    result = await Plain(model=model).run("go", output_type=Payment)
    assert result.output.amount == decimal.Decimal("19.99")
    told = model.requests[1].messages[-1]
    text = told.text if native else told.tool_results[0].content
    assert "answer.paid_at: expected a date and time with its UTC offset" in text
    assert "got '2026-05-01T09:30:00'" in text


@attrs.frozen
class Labelled:
    label: Annotated[Literal["spam", "ham"], "the verdict"]
    priority: Priority
    rank: Literal["top", 1, 2.5, True, None] = None


def test_a_strict_schema_gives_every_enum_its_type() -> None:
    """Strict mode refuses a schema without a ``type`` ("schema must have a 'type' key"):
    an ``enum`` takes its values' JSON type, or one typed ``enum`` per type."""
    output = Plain(output_type=Labelled).output
    assert output is not None and output.schema.strict_schema is not None
    assert output.schema.strict_schema["properties"] == {
        "label": {"description": "the verdict", "type": "string", "enum": ["spam", "ham"]},
        "priority": {"type": "string", "enum": ["low", "high"]},
        "rank": {
            "anyOf": [
                {"type": "string", "enum": ["top"]},
                {"type": "integer", "enum": [1]},
                {"type": "number", "enum": [2.5]},
                {"type": "boolean", "enum": [True]},
                {"type": "null"},
            ]
        },
    }


@pytest.mark.parametrize(
    ("kind", "problem"),
    [
        (dict[str, int], "an open object"),
        (list[Any], "any type"),
        (tuple[int, str], "fixed-length tuple"),
        (Invoice | dict[str, Any], "an open object"),
    ],
)
def test_a_schema_strict_mode_cannot_express_has_no_strict_form(kind: Any, problem: str) -> None:
    """Open objects, Any values and fixed-length tuples are named as the problem."""
    output = Plain(output_type=kind).output
    assert output is not None
    assert problem in (output.schema.closed_problem or "")
    assert output.schema.strict_schema is None


@pytest.mark.parametrize("natively", [True, False], ids=["native", "final-result tool"])
async def test_half_an_emoji_in_an_answer_is_u_fffd(natively: bool) -> None:
    """A model's JSON may hold half an emoji (``\\ud83d``), read as a lone surrogate: the
    typed answer holds U+FFFD in its place, as text does (no UTF-8 can carry it)."""
    answer = '{"result": ["smile \\ud83d"]}'
    if natively:
        model = ScriptedModel([text_response(answer)])
    else:
        arguments = json.loads(answer)
        response = tool_call_response(OUTPUT_TOOL, arguments, call_id="c1")
        model = ScriptedModel([response], supports_output_schema=False)
    result = await Plain(model=model).run("go", output_type=list[str])
    assert result.output == ["smile \ufffd"]


async def test_null_for_an_optional_field_means_its_default() -> None:
    """A null for an optional field whose type takes no null is the field left out (strict
    decoding sends every field); where the type takes null, it is None."""
    answer = {"carrier": "DHL", "weight": None, "tags": [{"number": "A", "total": 1, "paid": None}]}
    model = ScriptedModel([text_response(json.dumps(answer))])
    result = await Plain(model=model).run("go", output_type=Shipment)
    assert result.output == Shipment("DHL", None, [Invoice("A", 1.0, paid=False)])
    bad = ScriptedModel([text_response('{"number": null, "total": 1}'), text_response("{}")])
    with pytest.raises(OutputValidationError) as caught:
        await Typed(model=bad).run("go")
    assert caught.value.response is not None
    assert "expected a string, got null" in bad.requests[1].messages[-1].text


@dataclasses.dataclass
class Loose:
    meta: dict[str, Any]
    items: list[Any]


async def test_changing_a_typed_answer_leaves_its_logged_call_and_session_as_sent() -> None:
    """The answer's arrays and objects are its own, not those of the logged
    ``final_result`` call the caller may pass back as history."""
    sent = {"meta": {"k": {"deep": 1}}, "items": [{"x": 1}]}
    store = InMemorySessionStore()
    model = ScriptedModel(
        [tool_call_response(OUTPUT_TOOL, json.loads(json.dumps(sent)))],
        supports_output_schema=False,
    )
    result = await Plain(model=model, session_store=store).run(
        "go", output_type=Loose, session_id="s"
    )
    result.output.meta["k"]["deep"] = "changed"
    result.output.items[0]["x"] = "changed"
    logged = [message for message in result.messages if message.tool_calls]
    stored = [message for message in await store.load("s") if message.tool_calls]
    assert logged[0].tool_calls[0].arguments == stored[0].tool_calls[0].arguments == sent


@pytest.mark.parametrize(
    ("kind", "answer", "expected"),
    [(Literal[1, True], "1", 1), (Literal[0, False], "0", 0), (Literal[1], "1.0", 1)],
)
async def test_a_literal_answer_is_the_member_of_its_json_type(
    kind: Any, answer: str, expected: int
) -> None:
    """``1`` is the member ``1`` of ``Literal[1, True]``, not ``True``; ``1.0`` is ``1``."""
    model = ScriptedModel([text_response(f'{{"result": {answer}}}')])
    result = await Plain(model=model).run("go", output_type=kind)
    assert result.output == expected and type(result.output) is int


def test_an_output_schema_has_an_object_at_its_root_and_a_name() -> None:
    closed = {**OBJECT, "properties": {"a": {"type": "string"}}, "required": ["a"]}
    with pytest.raises(TypeError, match=r"OutputSchema\.schema"):
        OutputSchema("x", {"type": "array"})
    with pytest.raises(TypeError, match=r"OutputSchema\.name"):
        OutputSchema("two words", closed)


@dataclasses.dataclass
class DataBase(Generic[Item, Other]):
    left: Item
    right: list[Other]


@dataclasses.dataclass
class DataSub(DataBase[int, str]):
    pass


@dataclasses.dataclass
class DataMiddle(DataBase[int, str]):
    pass


@dataclasses.dataclass
class DataBelow(DataMiddle):
    pass


@dataclasses.dataclass
class DataSwap(DataBase[Other, Item], Generic[Item, Other]):
    pass


@attrs.define
class AttrsBase(Generic[Item, Other]):
    left: Item
    right: list[Other]


@attrs.define
class AttrsSub(AttrsBase[int, str]):
    pass


@attrs.define
class AttrsMiddle(AttrsBase[int, str]):
    pass


@attrs.define
class AttrsBelow(AttrsMiddle):
    pass


@attrs.define
class AttrsSwap(AttrsBase[Other, Item], Generic[Item, Other]):
    pass


class DictBase(typing_extensions.TypedDict, Generic[Item, Other]):  # typing's: 3.11 on
    left: Item
    right: list[Other]


class DictSub(DictBase[int, str]):
    pass


class DictSwap(DictBase[Other, Item], Generic[Item, Other]):
    pass


@pytest.mark.parametrize(
    "output_type",
    [
        DataSub,
        DataBelow,
        DataSwap[str, int],
        AttrsSub,
        AttrsBelow,
        AttrsSwap[str, int],
        DictSub,
        DictSwap[str, int],
    ],
)
async def test_a_field_of_a_parametrized_base_has_the_type_its_subclass_gives(
    output_type: Any,
) -> None:
    """``class Sub(Base[int, str])`` (or one below it) describes and reads the base's
    fields with the types it gives them (they failed as type variables with no type); a
    generic subclass that passes its variables on in another order
    (``Swap(Base[Other, Item])``) has them where it put them (``Swap[str, int]`` was
    described and read as ``Base[str, int]``)."""
    model = ScriptedModel([text_response('{"left": 7, "right": ["a"]}')])
    output = (await Plain(model=model).run("go", output_type=output_type)).output
    request = model.requests[0]
    assert request.output_schema is not None
    fields = request.output_schema.schema["properties"]
    assert fields["left"] == {"type": "integer"}
    assert fields["right"] == {"type": "array", "items": {"type": "string"}}
    if isinstance(output, dict):  # a TypedDict's value
        assert output == {"left": 7, "right": ["a"]}
    else:
        assert output.left == 7 and type(output) is getattr(output_type, "__origin__", output_type)
