"""Tool parameter types as JSON: the schema a model is shown, the coercion of the
arguments it sends back, and Python values turned into JSON.

Supported types: ``str``, ``int``, ``float``, ``bool``, ``None``, ``list`` / ``tuple`` /
``set`` / ``dict`` (with str keys) and their typed forms, named tuples (an array),
``Optional`` and unions, ``Literal``, ``Enum`` subclasses (with members, of JSON values),
records — attrs classes, dataclasses, ``TypedDict`` and pydantic (v2) models (not
recursive) — ``Any`` and ``Annotated[T, "description"]`` (and bounds:
:mod:`littleghost.tool_bounds`); and, as JSON strings, ``datetime`` (RFC 3339, with its
UTC offset: the value is aware), ``date``, ``time`` (a time of day, without an offset:
the value is naive), ``timedelta`` (an ISO 8601 duration), ``UUID`` and ``Decimal`` (a
string, since a JSON number may lose digits). A model's string is parsed here, the same
on every Python version, never by ``fromisoformat`` (Python 3.10's takes less than
3.11's).

pydantic is not a dependency: a model class is told by ``pydantic.main`` being imported
already (defining the class imported it), never by importing it. A model's fields are
described as a dataclass's are (a ``Field(description=...)`` as the field's
``description``), and a value is checked field by field, then built by the model's own
``model_validate``, so that its validators run.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import inspect
import json
import math
import re
import sys
import types
import typing
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, NamedTuple, TypeVar, Union, cast, get_args, get_origin

import attr
import attrs

from littleghost._validators import MAX_DEPTH, digits_limit, nests_deeper
from littleghost.errors import ConfigurationError
from littleghost.messages import ImagePart
from littleghost.text import brief, error_text, json_type_name, well_formed_value
from littleghost.tool_bounds import bounded_schema, field_bounds, model_metadata, read_metadata

__all__ = [
    "MAX_PROBLEMS",
    "VARIADIC",
    "ImageNotJson",
    "ToolArgumentError",
    "coerce",
    "json_schema",
    "left_out",
    "parse_json",
    "shown_default",
    "spellings",
    "to_json",
    "unexpected",
]

_NONE_TYPE = type(None)


class ToolArgumentError(ValueError):
    """Arguments from the model do not fit a tool's schema (told to the model, not raised):
    ``problems`` are what did not fit, each where it is; the message joins them."""

    def __init__(self, *problems: str) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def parse_json(text: str) -> Any:
    """JSON text from a model as a value, strictly: ``NaN`` and ``Infinity`` are not JSON,
    a number too large for a float (``1e400``) is refused, not read as infinity, and an
    integer longer than Python reads (``sys.set_int_max_str_digits``) is refused by its
    length. Its strs are well formed (``"\\ud83d"``, half an emoji, is U+FFFD).

    Raises:
        ToolArgumentError: The text is not valid JSON (``"not valid JSON: ..."`` says why),
            holds an integer too long to read (``"not readable: ..."``), or nests more
            than ``MAX_DEPTH`` levels deep (past what the parser goes too).
    """
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float)
    except ToolArgumentError:
        raise
    except json.JSONDecodeError as error:
        if text[max(error.pos - 1, 0) : error.pos + 1] == "0x":  # as json_text writes long ints
            raise ToolArgumentError("not valid JSON: a number in hexadecimal (0x...)") from None
        raise ToolArgumentError("not valid JSON") from None
    except ValueError:  # valid JSON: an integer past the digit limit (PyLong_FromString)
        raise ToolArgumentError(
            f"not readable: it holds an integer of more than {digits_limit()} digits, "
            "more than Python reads (sys.set_int_max_str_digits)"
        ) from None
    except RecursionError:  # nested deeper than the parser goes, and than MAX_DEPTH
        raise _too_deep() from None
    if nests_deeper(value):
        raise _too_deep()
    return well_formed_value(value)


def _too_deep() -> ToolArgumentError:
    return ToolArgumentError(f"nested more than {MAX_DEPTH} levels deep")


def _no_constant(name: str) -> float:
    raise ToolArgumentError(f"not valid JSON: {name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ToolArgumentError(
            f"not valid JSON: the number {brief(text)[1:-1]} is too large for a float"
        )
    return value


def json_schema(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON schema for a parameter annotation.

    Raises:
        ConfigurationError: The annotation cannot be described to a model (the message
            says where and why).
    """
    return _schema(annotation, where, ())


def shown_default(default: Any, annotation: Any, where: str) -> dict[str, Any]:
    """``{"default": ...}``, ``default`` as the JSON the model would send, to show beside
    ``annotation``'s schema; ``{}`` when JSON cannot carry it (an object, NaN, infinity).

    Raises:
        ConfigurationError: ``default``, as JSON, is not a value of ``annotation``: of
            another type, not a member of a ``Literal`` or an ``Enum``, outside a bound.
            ``None`` is taken for any type: null for an optional value counts as left out.
    """
    try:
        text = json.dumps(default, default=to_json, allow_nan=False)
    except (TypeError, ValueError, RecursionError):
        return {}
    shown = json.loads(text)
    if shown is not None:
        try:
            coerce(shown, annotation, "")
        except ToolArgumentError as error:
            raise ConfigurationError(
                f"{where}: the default {brief(default)} is not a value of its type "
                f"(default{error}), so leaving it out would give a value the model could "
                "not send"
            ) from None
    return {"default": shown}


def _is_json_scalar(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (str, int, bool))


def _schema(annotation: Any, where: str, outer: tuple[Any, ...]) -> dict[str, Any]:
    """``json_schema``, with ``outer`` the records and aliases being described around it."""
    if (base := _new_type_base(annotation)) is not None:
        return _schema(base, where, outer)
    if isinstance(annotation, _TYPE_ALIAS) or isinstance(get_origin(annotation), _TYPE_ALIAS):
        if annotation in outer:
            raise ConfigurationError(
                f"{where}: the alias {annotation.__name__} contains itself; recursive types "
                "cannot be described as JSON schema"
            )
        return _schema(_aliased(annotation), where, (*outer, annotation))
    if annotation is Any:
        return {}
    if isinstance(annotation, TypeVar):
        raise ConfigurationError(
            f"{where}: the type variable {annotation} has no type in its place; give the "
            "generic class its type arguments (Page[Item], not Page)"
        )
    if annotation is None or annotation is _NONE_TYPE:
        return {"type": "null"}
    if annotation is str:
        return {"type": "string"}
    if annotation is bool:
        return {"type": "boolean"}
    if annotation is int:
        return {"type": "integer"}
    if annotation is float:
        return {"type": "number"}
    text = _text_kind(annotation)
    if text is not None:
        return dict(text.schema)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        description, bounds = read_metadata(args[1:], where)
        schema = bounded_schema(dict(_schema(args[0], where, outer)), bounds, where)
        if description is not None:
            schema["description"] = description
        return schema
    if origin is Literal:
        values = list(args)
        if not values:
            raise ConfigurationError(f"{where}: an empty Literal allows no value")
        if not all(_is_json_scalar(value) for value in values):
            raise ConfigurationError(
                f"{where}: Literal values must be str, int, finite float, bool or None"
            )
        return {"enum": values}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(arg, where, outer) for arg in args]}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        if not values:
            raise ConfigurationError(
                f"{where}: the enum {annotation.__qualname__} has no members, so it allows no value"
            )
        if not all(_is_json_scalar(value) for value in values):
            raise ConfigurationError(
                f"{where}: the values of the enum {annotation.__qualname__} must be str, int, "
                "finite float, bool or None to be described as JSON"
            )
        return {"enum": values}
    if _is_root_model(annotation):
        if annotation in outer:
            raise ConfigurationError(
                f"{where}: {annotation.__qualname__} contains itself; recursive types cannot "
                "be described as JSON schema"
            )
        return _schema(_model_fields(annotation)[0].annotation, where, (*outer, annotation))
    fields = _record_fields(annotation)
    if fields is not None:
        record = _record_class(annotation)
        if annotation in outer:
            raise ConfigurationError(
                f"{where}: {record.__qualname__} contains itself; recursive types cannot "
                "be described as JSON schema"
            )
        _check_constructor(record, fields, where)
        inner = (*outer, annotation)
        properties = {}
        required = []
        for record_field in fields:
            if record_field.annotation is None:
                raise ConfigurationError(
                    f"{where}: field {record_field.name!r} of {record.__name__} has no type"
                )
            field_where = f"{where}, field {record_field.name!r}"
            properties[record_field.name] = _schema(record_field.annotation, field_where, inner)
            if record_field.default is not _NO_DEFAULT:
                properties[record_field.name].update(
                    shown_default(record_field.default, record_field.annotation, field_where)
                )
            if record_field.required:
                required.append(record_field.name)
        return {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }
    named = _named_items(annotation)
    if named is not None:
        if annotation in outer:
            raise ConfigurationError(
                f"{where}: {annotation.__qualname__} contains itself; recursive types cannot "
                "be described as JSON schema"
            )
        prefix = []
        for member in named:
            item_where = f"{where}, field {member.name!r}"
            schema = {
                "title": member.name,
                **_schema(member.annotation, item_where, (*outer, annotation)),
            }
            if member.default is not _NO_DEFAULT:
                schema.update(shown_default(member.default, member.annotation, item_where))
            prefix.append(schema)
        return {
            "type": "array",
            "prefixItems": prefix,
            "minItems": sum(member.required for member in named),
            "maxItems": len(named),
        }
    if annotation in (list, tuple, set, frozenset) or origin in (list, set, frozenset, Sequence):
        item = args[0] if args else Any
        return {"type": "array", "items": _schema(item, where, outer)}
    if annotation is tuple or origin is tuple:
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            return {"type": "array", "items": _schema(args[0] if args else Any, where, outer)}
        return {
            "type": "array",
            "prefixItems": [_schema(arg, where, outer) for arg in args],
            "minItems": len(args),
            "maxItems": len(args),
        }
    if annotation is dict or origin in (dict, Mapping):
        if args and args[0] is not str:
            raise ConfigurationError(f"{where}: dict keys must be str to be JSON, not {args[0]!r}")
        value = args[1] if args else Any
        return {"type": "object", "additionalProperties": _schema(value, where, outer)}
    raise ConfigurationError(
        f"{where}: the type {annotation!r} cannot be described as JSON schema (use str, int, "
        "float, bool, None, list, tuple, a NamedTuple, dict, Optional, Literal, an Enum, datetime, date, "
        "time, UUID, Decimal, an attrs class, a dataclass, a TypedDict, a pydantic model or a "
        "NewType of one)"
    )


_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
"""The kinds of ``*args`` and ``**kwargs``."""


def _check_constructor(record: type, fields: tuple[_Field, ...], where: str) -> None:
    """``ConfigurationError`` unless ``record`` can be built from what its schema
    describes: every field a keyword argument of its constructor, and every argument
    without a default a required field (a custom ``__init__`` may disagree); a pydantic
    model, built by ``model_validate``, takes each field by one name the schema can give."""
    if _is_typeddict(record):
        return
    if _is_model(record):
        _check_aliases(record, where)
        return
    try:
        parameters = inspect.signature(record).parameters.values()
    except (TypeError, ValueError):  # no signature to read: the call decides
        return
    by_name = {record_field.name: record_field for record_field in fields}
    keywords = {parameter.name for parameter in parameters if parameter.kind in _KEYWORD}
    for parameter in parameters:
        if parameter.default is not inspect.Parameter.empty or parameter.kind in VARIADIC:
            continue
        record_field = by_name.get(parameter.name)
        if parameter.kind not in _KEYWORD:
            raise ConfigurationError(
                f"{where}: {record.__qualname__}() takes {parameter.name!r} by position only; "
                "a value is built with keyword arguments"
            )
        if record_field is None:
            raise ConfigurationError(
                f"{where}: {record.__qualname__}() needs the argument {parameter.name!r}, "
                "which is not a field the schema describes, so no value could be built"
            )
        if not record_field.required:
            raise ConfigurationError(
                f"{where}: {record.__qualname__}() needs the argument {parameter.name!r}, "
                "which the schema leaves optional (its field has a default)"
            )
    unknown = sorted(by_name.keys() - keywords)
    if unknown and not any(
        parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters
    ):
        raise ConfigurationError(
            f"{where}: field {unknown[0]!r} of {record.__qualname__} is not a keyword argument "
            f"of {record.__qualname__}(), so no value could be built"
        )


def _check_aliases(model: Any, where: str) -> None:
    """``ConfigurationError`` if a field of the pydantic ``model`` is read by an
    ``AliasPath`` or ``AliasChoices``, not by one name a schema can give."""
    for name, info in model.model_fields.items():
        if not isinstance(info.validation_alias, (str, _NONE_TYPE)):
            raise ConfigurationError(
                f"{where}: field {name!r} of {model.__qualname__} is read through "
                f"{type(info.validation_alias).__name__}, which a schema cannot name; give "
                "it a plain alias"
            )


_NO_DEFAULT: Any = dataclasses.MISSING
"""A field's ``default`` when it has none, or one made by a factory (not made here)."""


class _Field(NamedTuple):
    """A field of a record type: its JSON name, its annotation (``None`` when it has
    none), whether a value must give it, and its default (``_NO_DEFAULT`` if none)."""

    name: str
    annotation: Any
    required: bool
    default: Any = _NO_DEFAULT


try:  # what Python 3.10 spells only there, and what later ones may spell there too
    import typing_extensions as _extensions
except ImportError:  # pragma: no cover - anyio and opentelemetry-api depend on it
    _extensions = None  # type: ignore[assignment]
_TYPINGS = (typing, _extensions) if _extensions is not None else (typing,)


def spellings(name: str) -> tuple[Any, ...]:
    """The objects named ``name`` in ``typing`` and ``typing_extensions``, as they have."""
    return tuple(
        {id(found): found for module in _TYPINGS if (found := getattr(module, name, None))}.values()
    )


_REQUIRED = spellings("Required")
_KEY_QUALIFIERS = (*_REQUIRED, *spellings("NotRequired"))
_READ_ONLY = spellings("ReadOnly")
"""``ReadOnly`` on a ``TypedDict`` key (Python 3.13): says nothing a JSON value can show."""
_TYPE_ALIAS = spellings("TypeAliasType")
"""The type of a ``type X = ...`` alias (Python 3.12)."""


_NEW_TYPES: tuple[type, ...] = tuple(
    kind for kind in spellings("NewType") if isinstance(kind, type)
)


def _new_type_base(annotation: Any) -> Any:
    """The type a ``NewType`` (``OrderId = NewType("OrderId", str)``) is made from, whose
    values it takes at run time; ``None`` for any other annotation."""
    return (
        getattr(annotation, "__supertype__", None) if isinstance(annotation, _NEW_TYPES) else None
    )


def _aliased(alias: Any) -> Any:
    """What a ``type`` alias stands for; a generic one's with its arguments
    (``Pair[int]`` of ``type Pair[T] = tuple[T, T]`` is ``tuple[int, int]``)."""
    origin = get_origin(alias)
    if origin is None:
        return alias.__value__
    return origin.__value__[get_args(alias)]


def _is_typeddict(annotation: Any) -> bool:
    return isinstance(annotation, type) and any(
        module.is_typeddict(annotation) for module in _TYPINGS
    )


def _is_model(annotation: Any) -> bool:
    """True for a pydantic (v2) model class. pydantic is not imported here: a model's
    class has imported it already, so without ``pydantic.main`` there is none."""
    main = sys.modules.get("pydantic.main")
    base = getattr(main, "BaseModel", None)
    return (
        base is not None
        and hasattr(base, "model_validate")  # not pydantic 1's
        # of the models' metaclass: Python 3.10 takes ``list[int]`` for a class
        and isinstance(annotation, type(base))
        and issubclass(annotation, base)
    )


def _is_root_model(annotation: Any) -> bool:
    """True for a pydantic ``RootModel``: a value of its one field's type, not an object."""
    return _is_model(annotation) and getattr(annotation, "__pydantic_root_model__", False)


def _model_fields(model: Any) -> tuple[_Field, ...]:
    """A pydantic model's fields, each by the name ``model_validate`` reads it by (its
    alias, if it has one), its description in ``Annotated``.

    Raises:
        NameError: A field's annotation cannot be resolved.
    """
    if not model.__pydantic_complete__:
        try:
            model.model_rebuild()
        except NameError as error:  # pydantic's, its message followed by a link
            raise NameError(getattr(error, "message", error)) from None
    found = []
    for name, info in model.model_fields.items():
        extras: list[Any] = [item for item in info.metadata if isinstance(item, str)]
        extras.extend(field_bounds(info.metadata))
        if info.description:
            extras.append(info.description)
        annotation = _left_to_model(info.annotation)
        hint = typing.Annotated[(annotation, *extras)] if extras else annotation
        alias = info.validation_alias
        required = info.is_required()
        default = _NO_DEFAULT if required or info.default_factory else info.default
        found.append(_Field(alias if isinstance(alias, str) else name, hint, required, default))
    return tuple(found)


def _left_to_model(hint: Any) -> Any:
    """``hint``, a pydantic model's (or dataclass's) field type, with what its own
    validation applies of each ``Annotated`` in it left to it (``model_metadata``), as
    it is of a model field's own metadata: a validator, a pattern, a discriminator."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is typing.Annotated:
        inner, kept = _left_to_model(args[0]), model_metadata(args[1:])
        return typing.Annotated[(inner, *kept)] if kept else inner
    if origin is None or origin is Literal or not args:
        return hint
    inner = tuple(_left_to_model(arg) for arg in args)
    if inner == args:
        return hint
    if origin in (Union, types.UnionType):
        return Union[inner]  # noqa: UP007 - the args of a union, as a tuple
    return origin[inner]


def _record_class(annotation: Any) -> Any:
    """The class of a record type: itself, or a generic one's given its type arguments
    (``Box`` of ``Box[int]``)."""
    origin = get_origin(annotation)
    return origin if isinstance(origin, type) and _type_parameters(origin) else annotation


def _type_parameters(record: type) -> tuple[Any, ...]:
    """The type variables a generic class is declared with (``()`` for any other)."""
    parameters = getattr(record, "__parameters__", ())
    return parameters if isinstance(parameters, tuple) else ()


def _bound(hint: Any, given: dict[Any, Any]) -> Any:
    """``hint`` with the type variables ``given`` replaced by their arguments."""
    if isinstance(hint, TypeVar):
        return given.get(hint, hint)
    parameters = () if get_origin(hint) is None else getattr(hint, "__parameters__", ())
    if not parameters:
        return hint
    return hint[tuple(given.get(parameter, parameter) for parameter in parameters)]


def _inherited(record: type, name: str) -> dict[Any, Any]:
    """The type arguments ``record``'s bases give the type variables of the class that
    declares its field ``name``, in ``record``'s own terms (``{Item: int}`` for a field
    ``value: Item`` of ``Box[Item]`` in ``class IntBox(Box[int])``); ``{}`` for a field
    of its own."""
    given: dict[Any, Any] = {}
    if not any("__orig_bases__" in vars(base) for base in record.__mro__):
        return given  # no generic class among its bases (most records: at once)
    declaring = record
    while _is_typeddict(declaring) or name not in inspect.get_annotations(declaring):
        for base in vars(declaring).get("__orig_bases__", declaring.__bases__):
            origin = get_origin(base) or base
            if isinstance(origin, type) and name in _annotated_names(origin):
                pairs = zip(_type_parameters(origin), get_args(base), strict=False)
                given = {parameter: _bound(arg, given) for parameter, arg in pairs}
                declaring = origin
                break
        else:
            return given
    return given


def _annotated_names(record: type) -> set[str]:
    """The names annotated on ``record`` and its bases (a ``TypedDict``'s own hold all)."""
    return {name for base in record.__mro__ for name in inspect.get_annotations(base)}


def _record_fields(annotation: Any) -> tuple[_Field, ...] | None:
    """The fields of an attrs class, a dataclass, a ``TypedDict`` or a pydantic model, a
    generic one's (``Box[int]``) with its type arguments in their place; ``None`` for any
    other type.

    Raises:
        NameError: A field's annotation cannot be resolved.
    """
    record = _record_class(annotation)
    if record is not annotation:
        if (fields := _record_fields(record)) is None:
            return None
        given = dict(zip(_type_parameters(record), get_args(annotation), strict=False))
        return tuple(field._replace(annotation=_bound(field.annotation, given)) for field in fields)
    if not isinstance(annotation, type):
        return None
    if _is_model(annotation):
        return _model_fields(annotation)
    if attrs.has(annotation):
        return tuple(
            _Field(
                attribute.alias,
                _bound(attribute.type, _inherited(annotation, attribute.name)),
                attribute.default is attrs.NOTHING,
                _attrs_default(attribute.default),
            )
            for attribute in attrs.fields(attrs.resolve_types(annotation))
            if attribute.init
        )
    if dataclasses.is_dataclass(annotation):
        return _dataclass_fields(annotation)
    if _is_typeddict(annotation):
        hints = typing.get_type_hints(annotation, include_extras=True)
        required = annotation.__required_keys__  # type: ignore[attr-defined]
        return tuple(
            _key(name, _bound(hint, _inherited(annotation, name)), name in required)
            for name, hint in hints.items()
        )
    return None


def _named_items(annotation: Any) -> tuple[_Field, ...] | None:
    """The fields of a named tuple class (``typing.NamedTuple``; a
    ``collections.namedtuple``'s of any type), in order; ``None`` for any other type.
    As JSON a named tuple is an array, as ``to_json`` writes it.

    Raises:
        NameError: A field's annotation cannot be resolved.
    """
    if not (isinstance(annotation, type) and issubclass(annotation, tuple)):
        return None
    names = getattr(annotation, "_fields", None)
    if not isinstance(names, tuple):
        return None
    hints = typing.get_type_hints(annotation, include_extras=True)
    defaults = annotation._field_defaults  # type: ignore[attr-defined]
    return tuple(
        _Field(name, hints.get(name, Any), name not in defaults, defaults.get(name, _NO_DEFAULT))
        for name in names
    )


def _attrs_default(default: Any) -> Any:
    """An attrs field's default, ``_NO_DEFAULT`` for none or an ``attrs.Factory``'s."""
    made = isinstance(default, attrs.Factory)  # type: ignore[arg-type]  # a class, typed as a function
    return _NO_DEFAULT if default is attrs.NOTHING or made else default


def _dataclass_fields(annotation: Any) -> tuple[_Field, ...]:
    """The arguments of a dataclass's ``__init__``: its init fields and its ``InitVar``
    fields (which ``dataclasses.fields`` leaves out), in order; a pydantic dataclass's
    with what its own validation applies left to it, as a pydantic model's."""
    hints = _dataclass_hints(annotation)
    fields = {field.name for field in dataclasses.fields(annotation)}
    validated = "__pydantic_validator__" in vars(annotation)  # a pydantic dataclass's own
    found = []
    for field in annotation.__dataclass_fields__.values():
        hint = _bound(hints.get(field.name), _inherited(annotation, field.name))
        if isinstance(hint, dataclasses.InitVar):
            hint = hint.type
        elif field.name not in fields:  # a ClassVar
            continue
        if field.init:
            required = (
                field.default is dataclasses.MISSING
                and field.default_factory is dataclasses.MISSING
            )
            hint = _left_to_model(hint) if validated else hint
            found.append(_Field(field.name, hint, required, field.default))
    return tuple(found)


def _dataclass_hints(annotation: type) -> dict[str, Any]:
    """A dataclass's resolved annotations, each where its class was defined, an
    ``InitVar``'s type within it (``typing.get_type_hints`` leaves a quoted name inside
    an ``InitVar``, and Python 3.10's refuses an ``InitVar`` written as a string).

    Raises:
        NameError: An annotation cannot be resolved.
    """
    hints = {}
    for base in reversed(annotation.__mro__):  # a subclass's annotation wins
        module = sys.modules.get(base.__module__)
        names = (dict(vars(module)) if module is not None else {}, dict(vars(base)))
        for name, hint in inspect.get_annotations(base).items():
            hints[name] = _resolved(hint, *names)
    return hints


def _resolved(hint: Any, globalns: dict[str, Any], localns: dict[str, Any]) -> Any:
    """One annotation resolved as ``typing.get_type_hints`` would, an ``InitVar`` too."""
    if isinstance(hint, str):
        hint = eval(hint, globalns, localns)
    if isinstance(hint, dataclasses.InitVar):
        return dataclasses.InitVar(_resolved(hint.type, globalns, localns))
    holder = type("Holder", (), {"__annotations__": {"hint": hint}})  # a ClassVar may be
    return typing.get_type_hints(holder, globalns, localns, include_extras=True)["hint"]


def _key(name: str, hint: Any, required: bool) -> _Field:
    """A ``TypedDict`` key; ``Required`` / ``NotRequired``, outside ``Annotated`` or in
    it, decide over the class's ``total`` (the class cannot read them from string
    annotations)."""
    origin = get_origin(hint)
    if origin in _KEY_QUALIFIERS:
        return _key(name, get_args(hint)[0], origin in _REQUIRED)
    if origin in _READ_ONLY:
        return _key(name, get_args(hint)[0], required)
    if origin is typing.Annotated:
        key = _key(name, hint.__origin__, required)
        return key._replace(annotation=typing.Annotated[(key.annotation, *hint.__metadata__)])
    return _Field(name, hint, required)


_CLOCK = "([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9]([.][0-9]+)?)?"
_DAY = "[0-9]{4}-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
_OFFSET = "([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])"


def _day(text: str) -> datetime.date:
    return datetime.date(int(text[:4]), int(text[5:7]), int(text[8:10]))


def _clock(text: str) -> datetime.time:
    """``HH:MM[:SS[.fraction]]`` as a naive time; digits past the microsecond are
    dropped, as Python 3.11's ``fromisoformat`` drops them."""
    seconds, _, fraction = text[6:].partition(".")
    micro = int(fraction[:6].ljust(6, "0"))
    return datetime.time(int(text[:2]), int(text[3:5]), int(seconds or 0), micro)


def _instant(text: str) -> datetime.datetime:
    """An RFC 3339 date-time as an aware datetime with the offset it gives."""
    if text[-1] in "Zz":
        zone, clock = datetime.timezone.utc, text[11:-1]
    else:
        sign = -1 if text[-6] == "-" else 1
        offset = datetime.timedelta(hours=int(text[-5:-3]), minutes=int(text[-2:]))
        zone, clock = datetime.timezone(sign * offset), text[11:-6]
    return datetime.datetime.combine(_day(text), _clock(clock), zone)


_DURATION = re.compile(
    r"(-?)P(?!$)(?:([0-9]+)W)?(?:([0-9]+)D)?"
    r"(?:T(?=[0-9])(?:([0-9]+)H)?(?:([0-9]+)M)?(?:([0-9]+(?:[.][0-9]+)?)S)?)?"
)


def _duration(text: str) -> datetime.timedelta:
    """An ISO 8601 duration of weeks, days, hours, minutes and seconds (``P1DT2H30M``)."""
    found = _DURATION.fullmatch(text)
    assert found is not None  # the pattern was matched
    sign, weeks, days, hours, minutes, seconds = found.groups()
    try:
        length = datetime.timedelta(
            weeks=int(weeks or 0),
            days=int(days or 0),
            hours=int(hours or 0),
            minutes=int(minutes or 0),
            seconds=float(seconds or 0),
        )
    except OverflowError:  # more than 999 999 999 days
        raise ValueError("out of range") from None
    return -length if sign else length


def duration_text(length: datetime.timedelta) -> str:
    """``length`` as the ISO 8601 duration ``_duration`` reads (``PT0S`` for none)."""
    sign, length = ("-", -length) if length < datetime.timedelta(0) else ("", length)
    hours, rest = divmod(length.seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    fraction = f".{length.microseconds:06d}".rstrip("0") if length.microseconds else ""
    clock = "".join(
        f"{amount}{unit}" for amount, unit in ((hours, "H"), (minutes, "M")) if amount
    ) + (f"{seconds}{fraction}S" if seconds or fraction else "")
    day = f"{length.days}D" if length.days else ""
    return f"{sign}P{day}T{clock}" if clock else f"{sign}P{day}" if day else "PT0S"


class _Text(NamedTuple):
    """A type that travels as a JSON string: its schema, the strings it takes (the
    schema's ``pattern``, or what its ``format`` means), what a misfit says is expected,
    how a string that fits is read, and whether a JSON integer is taken too."""

    schema: Mapping[str, Any]
    pattern: re.Pattern[str]
    expected: str
    read: Callable[[str], Any]
    integers: bool = False

    def value(self, value: Any, path: str) -> Any:
        """``value`` as this type's Python value.

        Raises:
            ToolArgumentError: It is not a string that fits (a number too, for
                ``Decimal``: a JSON number may have lost digits; an integer has not).
        """
        if isinstance(value, str) and self.pattern.fullmatch(value):
            try:
                return self.read(value)
            except ValueError:  # a day or an offset out of range: 2025-02-30
                pass
        elif self.integers and isinstance(value, int) and not isinstance(value, bool):
            return self.read(str(value))
        got = brief(value) if isinstance(value, str) else json_type_name(value)
        raise ToolArgumentError(f"{path}: expected {self.expected}, got {got}")


_DECIMAL = "^-?[0-9]+([.][0-9]+)?$"
_TIME = f"^{_CLOCK}$"
_UUID = "^[0-9A-Fa-f]{8}(-[0-9A-Fa-f]{4}){3}-[0-9A-Fa-f]{12}$"
_TEXTS: dict[type, _Text] = {
    datetime.datetime: _Text(
        {"type": "string", "format": "date-time"},
        re.compile(f"^{_DAY}[Tt ]{_CLOCK}{_OFFSET}$"),
        "a date and time with its UTC offset (RFC 3339: 2025-05-01T09:30:00+02:00, or Z for UTC)",
        _instant,
    ),
    datetime.date: _Text(
        {"type": "string", "format": "date"}, re.compile(f"^{_DAY}$"), "a date (2025-05-01)", _day
    ),
    datetime.time: _Text(
        {"type": "string", "pattern": _TIME},
        re.compile(_TIME),
        "a time of day without a UTC offset (09:30 or 09:30:15.5)",
        _clock,
    ),
    uuid.UUID: _Text(
        {"type": "string", "format": "uuid"},
        re.compile(_UUID),
        "a UUID (8-4-4-4-12 hex digits)",
        uuid.UUID,
    ),
    datetime.timedelta: _Text(
        {"type": "string", "format": "duration"},
        _DURATION,
        "a duration (ISO 8601 in weeks, days, hours, minutes and seconds: P1DT2H30M, PT45S)",
        _duration,
    ),
    decimal.Decimal: _Text(
        {"type": "string", "pattern": _DECIMAL},
        re.compile(_DECIMAL),
        'a decimal number as a string ("12.50")',
        decimal.Decimal,
        integers=True,
    ),
}
"""The types that travel as JSON strings. ``datetime`` is RFC 3339's date-time, whose
offset is required, so a value is aware and none is made up; ``time`` is a time of day
by a ``pattern``, not the ``time`` format, which is RFC 3339's full-time whose offset
strict decoders make the model write (and ``datetime.combine`` with a date would then
place it in that zone); ``Decimal`` is a string, since a JSON number is read as a
float and so may lose digits."""


def _text_kind(annotation: Any) -> _Text | None:
    """How ``annotation`` travels as a string, if it is one of ``_TEXTS`` (not a subclass)."""
    return _TEXTS.get(annotation) if isinstance(annotation, type) else None


def coerce(value: Any, annotation: Any, path: str) -> Any:
    """Check a JSON value against ``annotation`` and convert it to the Python value.

    ``null`` for an optional field of a record, whose type takes no ``null``, counts as
    the field left out.

    Raises:
        ToolArgumentError: The value does not fit, with ``path`` naming where.
    """
    if (base := _new_type_base(annotation)) is not None:
        return coerce(value, base, path)
    if isinstance(annotation, _TYPE_ALIAS) or isinstance(get_origin(annotation), _TYPE_ALIAS):
        return coerce(value, _aliased(annotation), path)
    if annotation is Any:
        return _own(value)
    if annotation is None or annotation is _NONE_TYPE:
        if value is not None:
            raise ToolArgumentError(f"{path}: expected null, got {json_type_name(value)}")
        return None
    if annotation is str:
        if not isinstance(value, str):
            raise ToolArgumentError(f"{path}: expected a string, got {json_type_name(value)}")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ToolArgumentError(f"{path}: expected a boolean, got {json_type_name(value)}")
        return value
    if annotation is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ToolArgumentError(f"{path}: expected an integer, got {json_type_name(value)}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ToolArgumentError(f"{path}: expected a number, got {json_type_name(value)}")
        try:
            number = float(value)
        except OverflowError:
            raise ToolArgumentError(f"{path}: the number is too large") from None
        if not math.isfinite(number):
            raise ToolArgumentError(f"{path}: expected a finite number, got {number!r}")
        return number
    text = _text_kind(annotation)
    if text is not None:
        return text.value(value, path)
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        converted = coerce(value, args[0], path)
        measured = converted if isinstance(converted, (set, frozenset)) else value  # distinct
        for bound in read_metadata(args[1:], path)[1]:
            problem = bound.problem(measured) if bound.applies(measured) else None
            if problem is not None:
                raise ToolArgumentError(f"{path}: {problem}")
        return converted
    if origin is Literal:
        for member in args:
            if _same_json(value, member):
                return member
        raise ToolArgumentError(f"{path}: expected one of {list(args)!r}, got {brief(value)}")
    if origin in (Union, types.UnionType):
        problems = []
        for arg in args:
            try:
                return coerce(value, arg, path)
            except ToolArgumentError as error:
                problems.append(str(error))
        raise ToolArgumentError(
            f"{path}: matches none of the allowed types ({'; '.join(problems)})"
        )
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        for member in annotation:  # 1.0 is not an int member 1, though it is Literal[1]
            if _same_json(value, member.value) and (
                isinstance(member.value, float) or not isinstance(value, float)
            ):
                return member
        allowed = [member.value for member in annotation]
        raise ToolArgumentError(f"{path}: expected one of {allowed!r}, got {brief(value)}")
    if _is_root_model(annotation):
        inner = coerce(value, _model_fields(annotation)[0].annotation, path)
        return _built(annotation.model_validate, inner, path)
    fields = _record_fields(annotation)
    if fields is not None:
        if not isinstance(value, dict):
            raise ToolArgumentError(f"{path}: expected an object, got {json_type_name(value)}")
        by_name = {record_field.name: record_field for record_field in fields}
        # every field's problems at once: one repair turn can then mend them all
        unknown = sorted(set(value) - set(by_name))
        problems = unexpected(unknown, f"{path}: unexpected field")
        kwargs = {}
        for name, record_field in by_name.items():
            if name in value and not left_out(
                value[name], record_field.annotation, required=record_field.required
            ):
                try:
                    kwargs[name] = coerce(value[name], record_field.annotation, f"{path}.{name}")
                except ToolArgumentError as error:
                    problems.extend(error.problems)
            elif record_field.required:
                problems.append(f"{path}: missing field {name!r}")
        if problems:
            raise ToolArgumentError(*problems)
        record = _record_class(annotation)
        if _is_typeddict(record):
            return kwargs
        if _is_model(record):
            return _built(record.model_validate, kwargs, path)
        return _built(lambda fields: record(**fields), kwargs, path)
    named = _named_items(annotation)
    if named is not None:
        if not isinstance(value, list):
            raise ToolArgumentError(f"{path}: expected an array, got {json_type_name(value)}")
        least = sum(member.required for member in named)
        if not least <= len(value) <= len(named):
            expected = f"{least} to {len(named)}" if least < len(named) else f"{least}"
            raise ToolArgumentError(f"{path}: expected {expected} items, got {len(value)}")
        parts = _each(
            (part, member.annotation, f"{path}[{i}]")
            for i, (part, member) in enumerate(zip(value, named, strict=False))
        )
        return _built(lambda parts: annotation(*parts), parts, path)
    if annotation in (list, set, frozenset) or origin in (list, set, frozenset, Sequence):
        if not isinstance(value, list):
            raise ToolArgumentError(f"{path}: expected an array, got {json_type_name(value)}")
        item = args[0] if args else Any
        items = _each((v, item, f"{path}[{i}]") for i, v in enumerate(value))
        container = (
            origin
            if origin in (set, frozenset)
            else annotation
            if annotation in (set, frozenset)
            else list
        )
        try:
            return container(items)
        except Exception as error:  # unhashable items, or a record's own __hash__ or __eq__
            raise ToolArgumentError(
                f"{path}: a set cannot hold these items ({error_text(error, with_type=False)})"
            ) from None
    if annotation is tuple or origin is tuple:
        if not isinstance(value, list):
            raise ToolArgumentError(f"{path}: expected an array, got {json_type_name(value)}")
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            item = args[0] if args else Any
            return tuple(_each((v, item, f"{path}[{i}]") for i, v in enumerate(value)))
        if len(value) != len(args):
            raise ToolArgumentError(f"{path}: expected {len(args)} items, got {len(value)}")
        return tuple(
            _each((v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=False)))
        )
    if annotation is dict or origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise ToolArgumentError(f"{path}: expected an object, got {json_type_name(value)}")
        item = args[1] if args else Any
        pairs = ((v, item, f"{path}.{brief(str(k))[1:-1]}") for k, v in value.items())
        return dict(zip(value, _each(pairs), strict=True))
    raise ToolArgumentError(f"{path}: unsupported type {annotation!r}")  # pragma: no cover


MAX_PROBLEMS = 20
"""The most problems of the items of one array or object checked before the rest are
left unchecked (a runaway answer of many thousand items would take long to check all)."""


def unexpected(names: Sequence[str], problem: str) -> list[str]:
    """``problem`` (``"unexpected argument"``) for each of ``names``, up to
    ``MAX_PROBLEMS``, then how many more there are."""
    told = [f"{problem} {brief(name)}" for name in names[:MAX_PROBLEMS]]
    if len(names) > MAX_PROBLEMS:
        told.append(f"{problem}: {len(names) - MAX_PROBLEMS} more")
    return told


def _each(items: Iterable[tuple[Any, Any, str]]) -> list[Any]:
    """Each ``(value, annotation, path)`` coerced, in order; every problem of them told
    at once (a ``ToolArgumentError`` with them all, up to ``MAX_PROBLEMS``), so one
    repair can mend them all."""
    values: list[Any] = []
    problems: list[str] = []
    for value, annotation, path in items:
        if len(problems) >= MAX_PROBLEMS:
            problems.append(f"{path} and on: not checked, after {len(problems)} problems")
            break
        try:
            values.append(coerce(value, annotation, path))
        except ToolArgumentError as error:
            problems.extend(error.problems)
    if problems:
        raise ToolArgumentError(*problems)
    return values


def _built(build: Callable[[Any], Any], value: Any, path: str) -> Any:
    """A record built of ``value`` by ``build`` (its class, or a pydantic model's
    ``model_validate``), whose validators and converters decide.

    A refusal is a ``ValueError`` (pydantic's ``ValidationError`` is one) or an
    ``AssertionError``, as pydantic's validators have it; any other exception is a bug
    in the class (a ``KeyError``, a ``TypeError``), raised as it is, traceback and all.

    Raises:
        ToolArgumentError: ``build`` refused it (``_refusal`` says why).
    """
    try:
        return build(value)
    except (ValueError, AssertionError) as error:
        raise ToolArgumentError(*_refusal(error, path)) from None


def _refusal(error: Exception, path: str) -> list[str]:
    """Why a record's class refused a value: each problem of a pydantic ``ValidationError``
    where it is and pydantic's message for it (without the input its own text shows),
    else the exception's message."""
    core = sys.modules.get("pydantic_core")
    if core is None or not isinstance(error, core.ValidationError):
        return [f"{path}: {error_text(error, with_type=False)}"]
    return [f"{path}{_location(problem['loc'])}: {problem['msg']}" for problem in error.errors()]


def _location(parts: tuple[int | str, ...]) -> str:
    """A pydantic error's ``loc`` as a path goes on: ``.items[0].name``."""
    return "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in parts)


def _own(value: Any) -> Any:
    """``value`` with arrays and objects of its own: what a tool or the caller does to
    them leaves the logged call as the model sent it."""
    if isinstance(value, dict):
        return {key: _own(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_own(item) for item in value]
    return value


def left_out(value: Any, annotation: Any, *, required: bool) -> bool:
    """True for ``null`` given to an optional field or parameter whose type takes no
    ``null``: strict decoding, which sends every field, says "left out" so (the default
    then applies)."""
    if value is not None or required:
        return False
    try:
        coerce(None, annotation, "")
    except ToolArgumentError:
        return True
    return False


def _same_json(value: Any, member: Any) -> bool:
    """True when the JSON ``value`` equals ``member`` and has its JSON type (a boolean is
    not the number 1)."""
    return json_type_name(value) == json_type_name(member) and value == member


class ImageNotJson(TypeError):
    """``to_json`` met an ``ImagePart``, alone or inside a value: as JSON text, its bytes
    would be garbage."""


def to_json(value: Any) -> Any:
    if _is_model(type(value)):  # no warning of a field's unexpected type: it quotes the value
        return value.model_dump(mode="json", by_alias=True, warnings=False)
    if attrs.has(type(value)) and not isinstance(value, ImagePart):
        # ``attrs.asdict``, with a dict that keeps every item (``attr``'s takes one)
        distinct = cast("type[dict[Any, Any]]", _distinct_keys)  # called as a class is
        return attr.asdict(
            value,
            dict_factory=distinct,
            retain_collection_types=True,
            value_serializer=_field_json,
        )
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # its fields as they are, each made JSON in turn (``asdict`` copies them deeply,
        # and falls over a field that cannot be copied: a lock, a connection)
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    return _to_json_value(value)


def _distinct_keys(items: Iterable[tuple[Any, Any]] = ()) -> dict[Any, Any]:
    """The dict ``attrs.asdict`` makes of ``items``: a dict field's items, keys made JSON
    as values are (a record's own starts empty, its fields set one by one).

    Raises:
        ValueError: two keys have one text once made JSON (a date and its ISO text): one
            item would be lost.
    """
    listed = list(items)
    made = dict(listed)
    if len(made) < len(listed):
        raise ValueError("two keys of a dict have one text")
    return made


def _field_json(record: Any, _field: Any, value: Any) -> Any:
    """A field of ``record`` as JSON. ``attrs.asdict`` takes an ``ImagePart`` in a list or
    dict field apart as a record of its own, so its fields come here."""
    if isinstance(record, ImagePart):
        raise ImageNotJson("an image is not JSON")
    return _to_json_value(value)


def _to_json_value(value: Any) -> Any:
    if isinstance(value, ImagePart):
        raise ImageNotJson("an image is not JSON")
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, (datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return duration_text(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, decimal.Decimal):  # "100", not "1E+2": what the schema's pattern takes
        return format(value, "f") if value.is_finite() else str(value)
    return value
