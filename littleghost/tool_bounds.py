"""Bounds in ``Annotated`` metadata: ``annotated_types``' ``Gt``, ``Ge``, ``Lt``, ``Le``,
``MultipleOf``, ``MinLen`` and ``MaxLen`` (as pydantic's ``Field(ge=..., max_length=...)``
makes them), as JSON schema keywords and as the check of a value.

As in JSON schema, a bound applies to the values of its kind: a number's to numbers, a
length to strings (their characters), arrays (their items; a set's distinct ones) and
objects (their keys); on a union it goes to the options of its kind; on a ``Literal`` or
an ``Enum`` it keeps the members it takes (so strict decoders, which refuse bounds, hold
it too). Neither library is imported here: a bound is told by its class's module, which
defining the annotation imported. Other metadata of theirs (a pydantic validator,
``Strict``, a ``pattern``) is refused when a type is described, rather than left
unapplied; metadata of any other library is not littleghost's to read, and is passed
over (PEP 593).
"""

from __future__ import annotations

import decimal
import fractions
import math
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from littleghost.errors import ConfigurationError
from littleghost.text import brief

__all__ = [
    "BOUND_KEYWORDS",
    "Bound",
    "FieldBound",
    "bounded_schema",
    "field_bounds",
    "model_metadata",
    "read_metadata",
]

_BOUNDS = {
    "Gt": ("gt", "exclusiveMinimum", ">"),
    "Ge": ("ge", "minimum", ">="),
    "Lt": ("lt", "exclusiveMaximum", "<"),
    "Le": ("le", "maximum", "<="),
    "MultipleOf": ("multiple_of", "multipleOf", "a multiple of"),
    "MinLen": ("min_length", "min", ">="),
    "MaxLen": ("max_length", "max", "<="),
}
"""Each bound class of ``annotated_types``: its attribute, its JSON schema keyword (for a
length, the prefix of ``minLength``, ``minItems`` or ``minProperties``) and its relation."""
_LENGTH_WORDS = {"string": "Length", "array": "Items", "object": "Properties"}
BOUND_KEYWORDS = frozenset(
    [keyword for name, (_, keyword, _) in _BOUNDS.items() if not name.endswith("Len")]
    + [_BOUNDS[name][1] + word for name in ("MinLen", "MaxLen") for word in _LENGTH_WORDS.values()]
)
"""The JSON schema keywords of the bounds (``minimum``, ``maxLength``, ``minItems``, ...)."""
_FIELD_INFO_KEYS = frozenset({"description", "title", "examples"})
"""What a pydantic ``Field()`` in ``Annotated`` may set besides bounds: said to the model
(``description``) or of no effect on a value."""


class Bound(NamedTuple):
    """One bound: its ``annotated_types`` class name and its limit; ``lenient`` for one of
    a pydantic model's field, left to pydantic where the field's schema has no value of
    its kind (a ``Decimal``'s string; one whose limit is not a number, a date's, is left
    to it whole)."""

    kind: str
    limit: Any
    lenient: bool = False

    @property
    def is_length(self) -> bool:
        return self.kind in ("MinLen", "MaxLen")

    def applies(self, value: Any) -> bool:
        """True when the JSON ``value`` (or the set made of an array) is of the kind this
        bound bounds."""
        if self.is_length:
            return isinstance(value, (str, list, dict, set, frozenset))
        return isinstance(value, (int, float)) and not isinstance(value, bool)

    def problem(self, value: Any) -> str | None:
        """What is wrong with the JSON ``value`` (of its kind), ``None`` if it fits."""
        _, _, relation = _BOUNDS[self.kind]
        measured = len(value) if self.is_length else value
        if self.kind == "MultipleOf":  # exact, by the decimals JSON writes (0.3 of 0.1)
            fits = (_exact(measured) / _exact(self.limit)).denominator == 1
        else:
            fits = {
                ">": measured > self.limit,
                ">=": measured >= self.limit,
                "<": measured < self.limit,
                "<=": measured <= self.limit,
            }[relation]
        if fits:
            return None
        if self.is_length:
            what = " (distinct items)" if isinstance(value, (set, frozenset)) else ""
            return f"expected a length {relation} {self.limit!r}{what}, got {measured}"
        what = "" if self.kind == "MultipleOf" else "a number "
        return f"expected {what}{relation} {self.limit!r}, got {brief(value)}"


def _exact(number: float) -> fractions.Fraction:
    """``number`` as the exact fraction its shortest decimal text says (``0.1`` is 1/10)."""
    return fractions.Fraction(decimal.Decimal(repr(number)))


class FieldBound(NamedTuple):
    """A bound of a pydantic model's field, as its ``Annotated`` metadata carries it."""

    item: Any


def _library(value: object) -> str | None:
    """``"annotated_types"`` or ``"pydantic"`` when ``value``'s class is theirs."""
    module = type(value).__module__.partition(".")[0]
    return module if module in ("annotated_types", "pydantic") else None


def _is_doc(value: object) -> bool:
    """True for PEP 727's ``Doc("...")`` (``typing_extensions``, ``annotated_types.doc``)."""
    kind = type(value)
    return (
        kind.__name__ in ("Doc", "DocInfo")
        and kind.__module__ in ("typing", "typing_extensions", "annotated_types")
        and isinstance(getattr(value, "documentation", None), str)
    )


def is_bound(item: object) -> bool:
    """True for one of the ``annotated_types`` bounds this module applies."""
    return _library(item) == "annotated_types" and type(item).__name__ in _BOUNDS


def field_bounds(metadata: Iterable[Any]) -> list[FieldBound]:
    """The bounds in a pydantic model field's ``metadata``, grouped ones (``Interval``,
    ``StringConstraints``, as ``conint`` and ``constr`` make them) taken apart; the rest
    is pydantic's to apply."""
    found = []
    for item in metadata:
        if _library(item) is not None and hasattr(item, "__iter__"):
            found.extend(field_bounds(item))
        elif is_bound(item):
            found.append(FieldBound(item))
    return found


def model_metadata(extras: Iterable[Any]) -> list[Any]:
    """What littleghost reads of an ``Annotated`` inside a pydantic model field's type
    (``list[Annotated[int, Field(ge=0), AfterValidator(f)]]``): its descriptions, and
    its bounds as a field's (``FieldBound``); the rest is the model's own validation's."""
    kept: list[Any] = []
    for extra in extras:
        if isinstance(extra, str) or _is_doc(extra):
            kept.append(extra)
        elif _library(extra) == "pydantic" and type(extra).__name__ == "FieldInfo":
            kept.extend(field_bounds(extra.metadata))
            if extra.description:
                kept.append(extra.description)
        else:
            kept.extend(field_bounds([extra]))
    return kept


def _bound(item: Any, lenient: bool = False) -> Bound:
    kind = type(item).__name__
    return Bound(kind, getattr(item, _BOUNDS[kind][0]), lenient)


def read_metadata(extras: Iterable[Any], where: str) -> tuple[str | None, list[Bound]]:
    """The description (the last str, ``Doc("...")`` or pydantic ``Field``'s
    ``description``) and the bounds of ``Annotated`` metadata.

    Raises:
        ConfigurationError: Metadata of ``annotated_types`` or pydantic that littleghost
            does not apply (the message names it and where).
    """
    description = None
    bounds: list[Bound] = []
    for extra in extras:
        if isinstance(extra, str):
            description = extra
            continue
        if _is_doc(extra):
            description = extra.documentation
            continue
        if isinstance(extra, FieldBound):
            bound = _bound(extra.item, lenient=True)
            if _limit_fits(bound):  # else (a date's, a Decimal's) only pydantic's to apply
                bounds.append(bound)
            continue
        if _library(extra) is None:
            continue
        if type(extra).__name__ == "FieldInfo":
            given = set(getattr(extra, "_attributes_set", {}))  # bounds too, before pydantic 2.6
            unknown = sorted(given - _FIELD_INFO_KEYS - {name for name, _, _ in _BOUNDS.values()})
            if unknown:
                raise ConfigurationError(
                    f"{where}: Field({unknown[0]}=...) in Annotated is not applied by "
                    "littleghost (a Field there gives a description and bounds such as ge= "
                    "or max_length=); give a parameter's default in its signature"
                )
            description = extra.description or description
            items = list(extra.metadata)
        elif hasattr(extra, "__iter__"):  # GroupedMetadata: Interval, Len, StringConstraints
            items = list(extra)
        else:
            items = [extra]
        for item in items:
            if not is_bound(item):
                raise ConfigurationError(
                    f"{where}: the Annotated metadata {item!r} is not applied by littleghost, "
                    "which applies a str description and the bounds Gt, Ge, Lt, Le, "
                    "MultipleOf, MinLen and MaxLen (pydantic's Field(gt=..., max_length=...)); "
                    "check the rest in the tool, or in a pydantic model, whose validation runs"
                )
            bounds.append(_bound(item))
    return description, bounds


def bounded_schema(schema: dict[str, Any], bounds: Sequence[Bound], where: str) -> dict[str, Any]:
    """``schema`` with the keywords of ``bounds``, each on the values of its kind (on a
    union, in each option of that kind; of an ``enum``, the members it takes).

    Raises:
        ConfigurationError: A bound that no value of ``schema`` is of the kind of (a length
            of a number, a minimum of a string), that leaves a ``Literal`` or an ``Enum``
            no member, or whose limit is not a count (a length) or a finite number
            (positive, for ``MultipleOf``).
    """
    for bound in bounds:
        if not _limit_fits(bound):
            needs = "a count (an int >= 0)" if bound.is_length else "a finite number"
            needs += " > 0" if bound.kind == "MultipleOf" else ""
            raise ConfigurationError(
                f"{where}: the bound {bound.kind}({bound.limit!r}) needs {needs} as its limit"
            )
        placed = _place(schema, bound)
        if placed is not None and _emptied(placed):
            raise ConfigurationError(
                f"{where}: the bound {bound.kind}({bound.limit!r}) leaves none of the values "
                "of its Literal or Enum, so it allows no value"
            )
        if placed is None:
            if bound.lenient:
                continue
            kinds = "a str, list, tuple, set or dict" if bound.is_length else "an int or a float"
            raise ConfigurationError(
                f"{where}: the bound {bound.kind}({bound.limit!r}) applies to {kinds}, "
                "and this type has no such value"
            )
        schema = placed
    return schema


def _place(schema: dict[str, Any], bound: Bound) -> dict[str, Any] | None:
    """``schema`` with ``bound``'s keyword where it applies (an ``enum`` with the members
    it takes); ``None`` where it nowhere does."""
    if "anyOf" in schema:
        options = [_place(dict(option), bound) for option in schema["anyOf"]]
        if all(option is None for option in options):
            return None
        placed = [new or old for new, old in zip(options, schema["anyOf"], strict=True)]
        return {**schema, "anyOf": placed}
    if "enum" in schema:  # a Literal's or an Enum's: the members the bound keeps
        if not any(bound.applies(member) for member in schema["enum"]):
            return None
        kept = [m for m in schema["enum"] if not bound.applies(m) or bound.problem(m) is None]
        return {**schema, "enum": kept}
    kind = schema.get("type")
    _, keyword, _ = _BOUNDS[bound.kind]
    if bound.is_length and kind in _LENGTH_WORDS:
        return {**schema, f"{keyword}{_LENGTH_WORDS[kind]}": bound.limit}
    if not bound.is_length and kind in ("integer", "number"):
        return {**schema, keyword: bound.limit}
    return None


def _emptied(schema: dict[str, Any]) -> bool:
    """True when ``schema`` (or an option of it) is an ``enum`` a bound left no member."""
    return schema.get("enum") == [] or any(map(_emptied, schema.get("anyOf", ())))


def _limit_fits(bound: Bound) -> bool:
    limit = bound.limit
    if isinstance(limit, bool) or not isinstance(limit, (int, float)):
        return False
    if bound.is_length:
        return isinstance(limit, int) and limit >= 0
    return math.isfinite(limit) and (bound.kind != "MultipleOf" or limit > 0)
