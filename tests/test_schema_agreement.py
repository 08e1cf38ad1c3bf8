"""The schema a model is sent and the check of what it sends back agree: over random
types (nested records, named tuples, unions, optionals, containers, literals, enums,
bounds) and random JSON values near and far from them, a value fits the schema exactly
when the check takes it. The schemas are read by a small validator of the keywords
littleghost writes (any other keyword fails the test, so a new one must be taught here
first).

The one difference is documented: ``null`` for an optional field or parameter whose type
takes none means "left out" (strict decoders send every field), so the check takes what
the schema refuses there.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
import types
from typing import Annotated, Any, Literal, NamedTuple, Optional, TypedDict, Union

import annotated_types as at
import pytest

from littleghost.tool_types import ToolArgumentError, coerce, json_schema

_KNOWN = {
    "type",
    "enum",
    "anyOf",
    "properties",
    "required",
    "additionalProperties",
    "items",
    "prefixItems",
    "minItems",
    "maxItems",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minProperties",
    "maxProperties",
    "description",
    "default",
    "title",
}


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(value: Any, member: Any) -> bool:
    """JSON equality: numbers by value, never a boolean for a number."""
    if _is_number(value) and _is_number(member):
        return bool(value == member)
    return type(value) is type(member) and value == member


def _fits(schema: dict[str, Any], value: Any, lenient_null: bool = False) -> bool:
    """Whether ``value`` is valid against ``schema`` (JSON Schema 2020-12 semantics for
    the keywords littleghost writes); ``lenient_null`` takes ``null`` (a field left out)."""
    unknown = set(schema) - _KNOWN
    assert not unknown, f"a keyword this validator does not know: {unknown}"
    if lenient_null and value is None:
        return True
    if "anyOf" in schema and not any(_fits(option, value) for option in schema["anyOf"]):
        return False
    if "enum" in schema and not any(_same(value, member) for member in schema["enum"]):
        return False
    kind = schema.get("type")
    checks = {
        "null": value is None,
        "boolean": isinstance(value, bool),
        "string": isinstance(value, str),
        "integer": _is_number(value) and float(value).is_integer(),
        "number": _is_number(value),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
        None: True,
    }
    if not checks[kind]:
        return False
    if _is_number(value):
        if "minimum" in schema and not value >= schema["minimum"]:
            return False
        if "maximum" in schema and not value <= schema["maximum"]:
            return False
        if "exclusiveMinimum" in schema and not value > schema["exclusiveMinimum"]:
            return False
        if "exclusiveMaximum" in schema and not value < schema["exclusiveMaximum"]:
            return False
        if "multipleOf" in schema:
            ratio = value / schema["multipleOf"]
            if not math.isclose(ratio, round(ratio), rel_tol=1e-9, abs_tol=1e-9):
                return False
    lengths = (schema.get("minLength", 0), schema.get("maxLength", math.inf))
    if isinstance(value, str) and not lengths[0] <= len(value) <= lengths[1]:
        return False
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", math.inf):
            return False
        prefix = schema.get("prefixItems", [])
        if not all(
            _fits(item_schema, item) for item_schema, item in zip(prefix, value, strict=False)
        ):
            return False
        if "items" in schema and not all(
            _fits(schema["items"], item) for item in value[len(prefix) :]
        ):
            return False
    if isinstance(value, dict):
        count = len(value)
        if not schema.get("minProperties", 0) <= count <= schema.get("maxProperties", math.inf):
            return False
        properties = schema.get("properties", {})
        if any(name not in value for name in schema.get("required", ())):
            return False
        required = set(schema.get("required", ()))
        others = schema.get("additionalProperties", {})
        for name, item in value.items():
            if name in properties:
                if not _fits(properties[name], item, lenient_null=name not in required):
                    return False
            elif others is False or not _fits(others, item):
                return False
    return True


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Size(enum.Enum):
    SMALL = 1
    LARGE = 2


_SCALARS: list[Any] = [
    int,
    float,
    str,
    bool,
    type(None),
    Literal["a", "b"],
    Literal[1, "one", None],
    Color,
    Size,
    Annotated[int, at.Ge(0), at.Lt(10)],
    Annotated[float, at.Gt(-1.5), at.Le(2.5)],
    Annotated[int, at.MultipleOf(3)],
    Annotated[str, at.MinLen(1), at.MaxLen(3)],
]


def _annotation(rng: random.Random, depth: int) -> Any:
    """A random annotation, nested up to ``depth`` levels."""
    if depth == 0 or rng.random() < 0.35:
        return rng.choice(_SCALARS)
    inner = _annotation(rng, depth - 1)
    other = _annotation(rng, depth - 1)
    shape = rng.randrange(10)
    if shape == 0:
        return list[inner]  # type: ignore[valid-type]
    if shape == 1:
        return tuple[inner, other]  # type: ignore[valid-type]
    if shape == 2:
        return tuple[inner, ...]  # type: ignore[valid-type]
    if shape == 3:
        return dict[str, inner]  # type: ignore[valid-type]
    if shape == 4:
        return Optional[inner]  # noqa: UP045
    if shape == 5:
        return Union[inner, other]  # noqa: UP007
    if shape == 6:
        return Annotated[list[inner], at.MinLen(1), at.MaxLen(2)]  # type: ignore[valid-type]
    if shape == 7:
        return TypedDict(  # type: ignore[operator]
            f"Keys{rng.randrange(10**6)}", {"a": inner, "b": other}, total=rng.random() < 0.5
        )
    if shape == 8:  # a named tuple, its last field with a default
        annotations = {"a": inner, "b": other}
        return types.new_class(
            f"Pair{rng.randrange(10**6)}",
            (NamedTuple,),
            exec_body=lambda body: body.update(
                __module__=__name__, __annotations__=annotations, b=None
            ),
        )
    fields = [("a", inner), ("b", other, dataclasses.field(default=None))]
    return dataclasses.make_dataclass(f"Record{rng.randrange(10**6)}", fields)


def _value(rng: random.Random, schema: dict[str, Any], depth: int = 0) -> Any:
    """A JSON value near ``schema``: mostly one that fits, at times one off by a little
    (a bound, a missing or extra key, a wrong type) or anything at all."""
    roll = rng.random()
    if roll < 0.08 or depth > 6:
        return rng.choice([None, True, 0, -1, 1.5, 7, "", "abcd", "red", [], {}, [1], {"a": 1}])
    if "anyOf" in schema:
        return _value(rng, rng.choice(schema["anyOf"]), depth + 1)
    if "enum" in schema:
        return rng.choice([*schema["enum"], "other", 3])
    kind = schema.get("type")
    if kind in ("integer", "number"):
        low = schema.get("minimum", schema.get("exclusiveMinimum", -12))
        high = schema.get("maximum", schema.get("exclusiveMaximum", 12))
        if kind == "integer":
            number: Any = rng.randint(math.floor(low) - 1, math.ceil(high) + 1)
            return number * schema.get("multipleOf", 1) if rng.random() < 0.5 else number
        return rng.choice([low, high, rng.uniform(low - 1, high + 1)])
    if kind == "string":
        return "x" * rng.randint(0, schema.get("maxLength", 3) + 1)
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "null":
        return None
    if kind == "array":
        if "prefixItems" in schema:
            items = [_value(rng, item, depth + 1) for item in schema["prefixItems"]]
            roll = rng.random()
            if roll < 0.7:
                return items
            return items[: rng.randint(0, len(items) - 1)] if roll < 0.9 else [*items, 1]
        length = rng.randint(schema.get("minItems", 0), schema.get("maxItems", 3)) + (
            rng.random() < 0.1
        )
        return [_value(rng, schema["items"], depth + 1) for _ in range(length)]
    if kind == "object":
        properties = schema.get("properties")
        if properties is None:
            return {
                f"k{n}": _value(rng, schema["additionalProperties"], depth + 1) for n in range(2)
            }
        value = {
            name: _value(rng, item, depth + 1)
            for name, item in properties.items()
            if name in schema.get("required", ()) or rng.random() < 0.6
        }
        if rng.random() < 0.1 and value:
            value.pop(rng.choice(list(value)))
        if rng.random() < 0.05:
            value["extra"] = 1
        return value
    return None


def _taken(value: Any, annotation: Any) -> bool:
    try:
        coerce(value, annotation, "value")
    except ToolArgumentError:
        return False
    return True


@pytest.mark.parametrize("seed", range(8))
def test_a_value_fits_the_schema_exactly_when_the_check_takes_it(seed: int) -> None:
    rng = random.Random(seed)
    checked = fitting = 0
    for _ in range(150):
        annotation = _annotation(rng, 3)
        schema = json_schema(annotation, "value")
        for _ in range(12):
            value = _value(rng, schema)
            fits, taken = _fits(schema, value), _taken(value, annotation)
            assert fits == taken, (annotation, schema, value, fits, taken)
            checked += 1
            fitting += fits
    # both sides are exercised: values that fit and values that do not
    assert 0.2 < fitting / checked < 0.8, fitting / checked
