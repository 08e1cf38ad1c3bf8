"""Typed results: an ``output_type`` as a JSON schema, how a run asks for it, and the
check of the model's final answer against it.

The schema comes from the machinery of tool parameters (:mod:`littleghost.tool_types`),
so an output type may be anything a tool parameter may be: attrs classes, dataclasses,
``TypedDict``, pydantic models, ``list[...]``, ``Literal``, enums, primitives, and dates,
times, UUIDs and ``Decimal`` as JSON strings. A type whose schema is not an object of
named fields (a list, a ``Literal``, a ``dict``, a pydantic ``RootModel`` of one) is
wrapped as ``{"result": ...}``, since providers want an object at the root. ``None`` and
``str`` mean free text.

A run asks for the answer in one of two ways: ``native``, the provider's structured
output (``ModelRequest.output_schema``), or ``tool``, a final-result tool the model must
call (``tool_choice="required"`` unless the settings name a choice). ``auto`` takes
``native`` when the model says it ``supports_output_schema`` and, if it has an
``output_schema_problem(schema)`` method, that names no problem with the schema.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Literal

import attrs
from attrs import frozen

from littleghost._validators import safe_repr
from littleghost.errors import ConfigurationError
from littleghost.messages import Message, ToolCall
from littleghost.models.base import Model, ModelRequest, OutputSchema, ToolSpec
from littleghost.text import truncate_middle
from littleghost.tool_types import ToolArgumentError, coerce, json_schema, parse_json

__all__ = [
    "OUTPUT_TOOL",
    "STRATEGIES",
    "Answer",
    "OutputPlan",
    "OutputType",
    "Strategy",
    "check_strategy",
    "check_tool_choice",
    "check_tool_names",
    "compile_output_type",
    "plan_output",
]

OUTPUT_TOOL = "final_result"
"""The tool the ``tool`` strategy gives the model to hand in its final answer."""
WRAPPER = "result"
"""The one field a wrapped (non-object) output type's value travels in."""
Strategy = Literal["auto", "native", "tool"]
STRATEGIES: tuple[Strategy, ...] = ("auto", "native", "tool")

_NOT_NAME = re.compile(r"[^A-Za-z0-9_-]")


@frozen
class Answer:
    """The check of a final answer: its typed ``value``, or the ``errors`` that kept it
    from one; ``raw`` is the answer as the model gave it."""

    raw: str
    value: Any = None
    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        """True when the answer fits."""
        return not self.errors


@frozen
class OutputType:
    """An ``output_type`` compiled: its schema, and the check of an answer against it."""

    annotation: Any
    schema: OutputSchema
    wrapped: bool

    @functools.cached_property
    def tool(self) -> ToolSpec:
        """The final-result tool of the ``tool`` strategy (made once, not every turn)."""
        return ToolSpec(
            OUTPUT_TOOL,
            "Give your final answer. Call this once, when you are done, with the answer as "
            "its arguments.",
            self.schema.schema,
        )

    def check(self, reply: Mapping[str, Any] | str) -> Answer:
        """Check ``reply`` — JSON text, or tool-call arguments already parsed."""
        if isinstance(reply, str):
            raw = reply
            try:
                value = parse_json(reply)
            except ToolArgumentError as error:
                return Answer(raw, errors=(f"the answer is {error}",))
        else:
            value = dict(reply)
            raw = json.dumps(value, ensure_ascii=False, default=str)
        try:
            if not self.wrapped:
                return Answer(raw, coerce(value, self.annotation, "answer"))
            if not isinstance(value, dict) or set(value) != {WRAPPER}:
                raise ToolArgumentError(
                    f"answer: expected an object with the one field {WRAPPER!r}"
                )
            return Answer(raw, coerce(value[WRAPPER], self.annotation, WRAPPER))
        except ToolArgumentError as error:
            return Answer(raw, errors=error.problems)


def compile_output_type(annotation: object, where: str) -> OutputType | None:
    """Compile an ``output_type`` declaration; ``None`` for free text (``None``, ``str``).

    Raises:
        ConfigurationError: The type cannot be described as JSON schema, or its
            annotations cannot be resolved (the message says where).
    """
    if annotation is None or annotation is str:
        return None
    if isinstance(annotation, str):
        raise ConfigurationError(
            f"{where} must be a type, not the str {safe_repr(annotation)} (a type's name is "
            "not resolved: give the type itself, defined before it is used)"
        )
    try:
        schema = json_schema(annotation, where)
    except NameError as error:
        raise ConfigurationError(f"{where}: an annotation cannot be resolved ({error})") from None
    wrapped = not (schema.get("type") == "object" and "properties" in schema)
    if wrapped:
        schema = {
            "type": "object",
            "properties": {WRAPPER: schema},
            "required": [WRAPPER],
            "additionalProperties": False,
        }
    name = _NOT_NAME.sub("_", str(getattr(annotation, "__name__", "")))[:64] or "output"
    return OutputType(annotation, OutputSchema(name, schema), wrapped)


def check_strategy(where: str, value: object) -> Strategy:
    """An ``output_strategy`` declaration: ``auto``, ``native`` or ``tool``."""
    if value not in STRATEGIES:
        raise ConfigurationError(
            f"{where} must be one of {', '.join(map(repr, STRATEGIES))}, not {safe_repr(value)}"
        )
    return value


def check_tool_names(where: str, names: Collection[str]) -> None:
    """No tool of an agent with an output type may take the final-result tool's name."""
    if OUTPUT_TOOL in names:
        raise ConfigurationError(
            f"{where}: a tool is named {OUTPUT_TOOL!r}, the name of the tool that hands in "
            "the final answer of an output_type; rename it with @tool(name=...)"
        )


def check_tool_choice(where: str, settings: Mapping[str, Any]) -> None:
    """No ``tool_choice`` that leaves the model no call of the final-result tool (one
    forbidding tool calls, or forcing another tool), where the answer must come by it.

    Raises:
        ConfigurationError: It does (the message names the choice and what to do).
    """
    choice = settings.get("tool_choice")
    if isinstance(choice, Mapping):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, Mapping) else choice.get("name")
        kind = choice.get("type")
        blocked = kind == "none" or (kind in ("function", "tool") and name != OUTPUT_TOOL)
    else:
        blocked = choice == "none"
    if blocked:
        raise ConfigurationError(
            f"{where}: tool_choice={safe_repr(choice)} leaves the model no call of the "
            f"{OUTPUT_TOOL} tool, which hands in the answer of the output_type; leave "
            "tool_choice out (or use output_strategy='native' with a model that takes it)"
        )


@frozen
class OutputPlan:
    """How one run asks for its ``output`` and checks the answer: natively
    (``native``) or through the final-result tool."""

    output: OutputType
    native: bool

    def request(self, request: ModelRequest) -> ModelRequest:
        """``request`` asking for the output: with its schema, or with the final-result
        tool (and ``tool_choice="required"`` unless the settings name a choice)."""
        if self.native:
            return attrs.evolve(request, output_schema=self.output.schema)
        settings = dict(request.settings)
        settings.setdefault("tool_choice", "required")
        return attrs.evolve(request, tools=(*request.tools, self.output.tool), settings=settings)

    def final_answer(self, message: Message) -> tuple[ToolCall, Answer] | None:
        """The first final-result call of an answer that fits, else its first one, with
        what was checked (``tool`` strategy)."""
        if self.native:
            return None
        calls = [call for call in message.tool_calls if call.name == OUTPUT_TOOL]
        finals = [(call, self.output.check(call.arguments)) for call in calls]
        return next((final for final in finals if final[1].ok), finals[0] if finals else None)

    def final_results(
        self, calls: Sequence[ToolCall], final: ToolCall, answer: Answer
    ) -> list[Message]:
        """The results of an answer with a final-result call: the call's (what did not
        fit, if anything; each final-result call's own when none fits), and the other
        calls', which are not run."""
        if answer.ok:
            others = f"Not run: the final answer was given with {OUTPUT_TOOL} in the same turn."
        else:
            others = "Not run: the final answer given in the same turn did not fit its schema."
        results = []
        for call in calls:
            if call is final and answer.ok:
                results.append(Message.tool(call.id, "The final answer was received."))
            elif call.name == OUTPUT_TOOL and not answer.ok:
                errors = (answer if call is final else self.output.check(call.arguments)).errors
                text = (
                    f"The final answer does not fit its schema: {'; '.join(errors)}. "
                    f"Call {OUTPUT_TOOL} again with arguments that fit it."
                )
                results.append(Message.tool(call.id, text, is_error=True))
            else:
                results.append(Message.tool(call.id, others, is_error=True))
        return results

    def check_text(self, message: Message) -> Answer:
        """Check an answer without tool calls."""
        if self.native:
            return self.output.check(message.text)
        return Answer(
            message.text,
            errors=(f"the answer must be given by calling the {OUTPUT_TOOL} tool, not as text",),
        )

    def repair_message(self, answer: Answer, max_tokens: int) -> Message:
        """The user message that shows the model why its text answer did not fit (what
        it says of the problems cut in the middle to about ``max_tokens``)."""
        problems = truncate_middle("; ".join(answer.errors), max_tokens)
        if self.native:
            return Message.user(
                f"Your answer does not fit the required JSON schema: {problems}. Answer "
                "again with only JSON that fits it."
            )
        return Message.user(f"Give your final answer by calling the {OUTPUT_TOOL} tool.")


def plan_output(output: OutputType | None, strategy: Strategy, model: Model) -> OutputPlan | None:
    """How a run with ``model`` asks for ``output``: ``native`` when the strategy says so,
    or says ``auto`` and the model takes the schema natively (it
    ``supports_output_schema`` and its ``output_schema_problem(schema)``, if any, names
    no problem).

    Raises:
        ConfigurationError: The strategy is ``native`` and the model cannot take the
            schema (the message says why).
    """
    if output is None:
        return None
    problem = _native_problem(model, output.schema)
    if strategy == "native" and problem is not None:
        raise ConfigurationError(
            f"output_strategy='native': model {model.name!r} {problem}; use "
            "output_strategy='tool' (or 'auto')"
        )
    return OutputPlan(output, strategy == "native" or (strategy == "auto" and problem is None))


def _native_problem(model: Model, schema: OutputSchema) -> str | None:
    """Why ``model`` cannot take ``schema`` natively: it ``supports_output_schema`` not at
    all, or its ``output_schema_problem(schema)`` names a reason; ``None`` when it can."""
    if getattr(model, "supports_output_schema", False) is not True:
        return "takes no output schema"
    check = getattr(model, "output_schema_problem", None)
    problem = None if check is None else check(schema)
    return None if problem is None else f"cannot take this output schema natively: {problem}"
