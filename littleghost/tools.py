"""``@tool``: JSON schemas from signatures and docstrings, argument checking, execution.

Supported parameter types: ``str``, ``int``, ``float``, ``bool``, ``None``, ``list`` /
``tuple`` / ``dict`` (with str keys) and their typed forms, ``Optional`` and unions,
``Literal``, ``Enum`` subclasses (with JSON values), attrs classes (not recursive), ``Any``
and ``Annotated[T, "description"]``. A parameter annotated ``RunContext``, whatever its
name, receives the run's context and is not shown to the model (an annotation that cannot
be resolved, as when ``RunContext`` is imported under ``TYPE_CHECKING``, counts when its
text is ``RunContext`` or ends with ``.RunContext``); a parameter named ``context`` with
another annotation is an ordinary argument.
"""

from __future__ import annotations

import enum
import functools
import inspect
import json
import logging
import math
import re
import threading
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, Union, get_args, get_origin

import anyio.to_thread
import attrs
from anyio.lowlevel import RunVar
from attrs import frozen

from littleghost._validators import is_number
from littleghost.errors import ConfigurationError
from littleghost.messages import ToolCall, ToolResult
from littleghost.models.base import ToolSpec

__all__ = ["ToolArgumentError", "ToolDefinition", "index_tools", "tool"]

logger = logging.getLogger(__name__)

_MARK = "__littleghost_tool__"
_NONE_TYPE = type(None)
_CONTEXT = object()
"""Stands for a ``RunContext`` annotation that cannot be resolved."""


class ToolArgumentError(ValueError):
    """Arguments from the model do not fit a tool's schema (told to the model, not raised)."""


@frozen
class _Parameter:
    name: str
    annotation: Any
    required: bool
    default: Any


@frozen
class ToolDefinition:
    """A tool: what the model is told, and how to call it.

    ``context_parameter`` is the parameter that receives the ``RunContext`` (``None``
    when the tool takes none); ``timeout`` is how long a call may run, in seconds
    (``None``: no limit of its own).
    """

    name: str
    description: str
    parameters: Mapping[str, Any]
    function: Callable[..., Any]
    is_method: bool
    context_parameter: str | None
    signature: tuple[_Parameter, ...]
    timeout: float | None = None

    @property
    def spec(self) -> ToolSpec:
        """The ``ToolSpec`` sent to the model."""
        return ToolSpec(self.name, self.description, self.parameters)


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> Any:
    """Declare a function or method as a tool.

    Use bare (``@tool``) or with ``name=`` / ``description=`` / ``timeout=``, on a
    function, a method or a ``staticmethod`` (either side of ``@staticmethod``). The
    description defaults to the docstring; parameter descriptions come from its
    ``Args:`` section. ``timeout`` (seconds, a positive finite number) bounds each call:
    when it passes, the call gets an error result and the run goes on.
    """

    def mark(target: Callable[..., Any]) -> Callable[..., Any]:
        if isinstance(target, classmethod):
            raise ConfigurationError("@tool decorates a function, a method or a staticmethod")
        function = target.__func__ if isinstance(target, staticmethod) else target
        if not callable(function):
            raise ConfigurationError(f"@tool decorates a function or method, not {target!r}")
        if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
            raise ConfigurationError(f"@tool: name must match {_NAME.pattern}, not {name!r}")
        if timeout is not None and not (is_number(timeout) and timeout > 0):
            raise ConfigurationError(
                "@tool: timeout must be a positive finite number of seconds or None, "
                f"not {timeout!r}"
            )
        options = {
            "name": name,
            "description": description,
            "timeout": None if timeout is None else float(timeout),
        }
        earlier = tool_options(function)
        if earlier is not None and earlier != options:
            raise ConfigurationError(
                f"@tool: {function.__name__!r} is already a tool with other options; "
                "wrap it in a new function to declare it again"
            )
        setattr(function, _MARK, options)
        try:  # fail early where possible; the class definition checks again
            define_tool(target, is_method=looks_like_method(function))
        except NameError:
            pass
        return target

    return mark(function) if function is not None else mark


def tool_options(value: object) -> dict[str, Any] | None:
    """The options ``@tool`` stored on a function, or ``None`` if it is not a tool."""
    if isinstance(value, staticmethod):
        value = value.__func__
    options = getattr(value, _MARK, None)
    return options if isinstance(options, dict) else None


def looks_like_method(function: Callable[..., Any]) -> bool:
    try:
        first = next(iter(inspect.signature(function).parameters), None)
    except (TypeError, ValueError):
        return False
    return first == "self"


_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


def define_tool(function: Callable[..., Any], *, is_method: bool) -> ToolDefinition:
    """Build the definition of ``function`` as a tool.

    A ``staticmethod`` is defined as the plain function it wraps.

    Raises:
        ConfigurationError: No docstring, a missing or unsupported annotation, two
            ``RunContext`` parameters, ``*args`` / ``**kwargs`` or a positional-only
            parameter.
        NameError: An annotation (other than ``RunContext``) cannot be resolved yet.
    """
    if isinstance(function, staticmethod):
        function, is_method = function.__func__, False
    options = tool_options(function) or {}
    tool_name = options.get("name") or getattr(function, "__name__", None)
    if not isinstance(tool_name, str) or not _NAME.fullmatch(tool_name):
        raise ConfigurationError(f"tool name {tool_name!r} must match {_NAME.pattern}")
    doc = inspect.getdoc(function) or ""
    summary, arg_docs = _parse_docstring(doc)
    tool_description = options.get("description") or summary
    if not tool_description:
        raise ConfigurationError(
            f"tool {tool_name!r} has no docstring: the model needs a description (or pass "
            "@tool(description=...))"
        )
    hints = _type_hints(function)
    parameters = list(inspect.signature(function).parameters.values())
    if is_method:
        parameters = parameters[1:]
    properties: dict[str, Any] = {}
    required: list[str] = []
    signature: list[_Parameter] = []
    context_parameter: str | None = None
    for parameter in parameters:
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ConfigurationError(
                f"tool {tool_name!r}: *args and **kwargs cannot be described to a model"
            )
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {parameter.name!r} is positional-only; "
                "tools are called with keyword arguments"
            )
        if parameter.name not in hints:
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {parameter.name!r} needs a type annotation"
            )
        annotation = hints[parameter.name]
        if _is_run_context(annotation):
            if context_parameter is not None:
                raise ConfigurationError(
                    f"tool {tool_name!r}: parameters {context_parameter!r} and "
                    f"{parameter.name!r} are both annotated RunContext; a tool takes at most one"
                )
            context_parameter = parameter.name
            continue
        where = f"tool {tool_name!r}, parameter {parameter.name!r}"
        schema = dict(json_schema(annotation, where))
        if parameter.name in arg_docs and "description" not in schema:
            schema["description"] = arg_docs[parameter.name]
        has_default = parameter.default is not inspect.Parameter.empty
        if has_default:
            try:
                schema["default"] = json.loads(json.dumps(parameter.default, default=_to_json))
            except (TypeError, ValueError):
                pass
        else:
            required.append(parameter.name)
        properties[parameter.name] = schema
        signature.append(_Parameter(parameter.name, annotation, not has_default, parameter.default))
    schema_object: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    return ToolDefinition(
        tool_name,
        tool_description,
        schema_object,
        function,
        is_method,
        context_parameter,
        tuple(signature),
        options.get("timeout"),
    )


def index_tools(
    owner: str,
    methods: Mapping[str, ToolDefinition],
    functions: Sequence[ToolDefinition],
) -> dict[str, tuple[ToolDefinition, str | None]]:
    """Index an agent's tools by name: ``{name: (definition, attribute or None)}``.

    Args:
        owner: Who declares them, for the message (``"Support"``).
        methods: The ``@tool`` methods by attribute name, parents' first.
        functions: The definitions of the plain functions in ``tools``, in order.

    Raises:
        ConfigurationError: Two tools have one name (the message names both places).
    """
    index: dict[str, tuple[ToolDefinition, str | None]] = {}
    places: dict[str, str] = {}
    entries: list[tuple[ToolDefinition, str | None, str]] = [
        (definition, attribute, f"method {attribute!r}")
        for attribute, definition in methods.items()
    ]
    entries.extend(
        (definition, None, f"tools[{position}] ({_qualname(definition.function)})")
        for position, definition in enumerate(functions)
    )
    for definition, attribute, place in entries:
        if definition.name in index:
            raise ConfigurationError(
                f"{owner}: two tools are named {definition.name!r}: {places[definition.name]} "
                f"and {place}; tool names must be unique (rename one with @tool(name=...))"
            )
        index[definition.name] = (definition, attribute)
        places[definition.name] = place
    return index


def _qualname(function: Callable[..., Any]) -> str:
    return str(getattr(function, "__qualname__", None) or type(function).__name__)


def _run_context_class() -> type:
    """``littleghost.run.RunContext``, imported when first needed (run.py may use tools)."""
    from littleghost.run import RunContext

    return RunContext


def _is_run_context(annotation: Any) -> bool:
    return annotation is _CONTEXT or annotation is _run_context_class()


def _names_run_context(text: str) -> bool:
    """True for the text of a ``RunContext`` annotation: ``RunContext``, ``x.RunContext``."""
    text = text.strip().strip("'\"").strip()
    return text == "RunContext" or text.endswith(".RunContext")


def _type_hints(function: Callable[..., Any]) -> dict[str, Any]:
    """Resolved parameter annotations.

    An annotation naming ``RunContext`` that cannot be resolved (imported only under
    ``TYPE_CHECKING``) becomes ``_CONTEXT``; the return annotation may be unresolvable.

    Raises:
        NameError: Another parameter annotation cannot be resolved.
    """
    try:
        return typing.get_type_hints(function, include_extras=True)
    except NameError:
        pass
    annotations = dict(getattr(function, "__annotations__", {}))
    annotations.pop("return", None)
    hints: dict[str, Any] = {}
    for name, annotation in annotations.items():
        probe = types.FunctionType(_probe.__code__, getattr(function, "__globals__", {}))
        probe.__annotations__ = {name: annotation}
        try:
            hints[name] = typing.get_type_hints(probe, include_extras=True)[name]
        except NameError:
            if isinstance(annotation, str) and _names_run_context(annotation):
                hints[name] = _CONTEXT
            else:
                raise
    return hints


def _probe() -> None:  # pragma: no cover - only its code object is used
    pass


def _parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (text before any section) and the ``Args:`` entries."""
    lines = doc.splitlines()
    sections = {
        "args:",
        "arguments:",
        "parameters:",
        "returns:",
        "return:",
        "raises:",
        "yields:",
        "examples:",
        "example:",
        "note:",
        "notes:",
    }
    summary_lines: list[str] = []
    index = 0
    while index < len(lines) and lines[index].strip().lower() not in sections:
        summary_lines.append(lines[index])
        index += 1
    args: dict[str, str] = {}
    current: str | None = None
    in_args = False
    base_indent = 0
    for line in lines[index:]:
        stripped = line.strip()
        if stripped.lower() in sections:
            in_args = stripped.lower() in {"args:", "arguments:", "parameters:"}
            current = None
            base_indent = -1
            continue
        if not in_args or not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        if base_indent < 0:
            base_indent = indent
        match = re.match(r"\*{0,2}(\w+)\s*(\([^)]*\))?\s*:\s*(.*)", stripped)
        if indent <= base_indent and match:
            current = match.group(1)
            args[current] = match.group(3).strip()
        elif current is not None:
            args[current] = f"{args[current]} {stripped}".strip()
    return "\n".join(summary_lines).strip(), args


def json_schema(annotation: Any, where: str) -> dict[str, Any]:
    """The JSON schema for a parameter annotation.

    Raises:
        ConfigurationError: The annotation cannot be described to a model (the message
            says where and why).
    """
    return _schema(annotation, where, ())


def _is_json_scalar(value: object) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    return value is None or isinstance(value, (str, int, bool))


def _schema(annotation: Any, where: str, outer: tuple[type, ...]) -> dict[str, Any]:
    """``json_schema``, with ``outer`` the attrs classes being described around it."""
    if annotation is Any:
        return {}
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
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        schema = dict(_schema(args[0], where, outer))
        for extra in args[1:]:
            if isinstance(extra, str):
                schema["description"] = extra
        return schema
    if origin is Literal:
        values = list(args)
        if not all(_is_json_scalar(value) for value in values):
            raise ConfigurationError(
                f"{where}: Literal values must be str, int, finite float, bool or None"
            )
        return {"enum": values}
    if origin in (Union, types.UnionType):
        return {"anyOf": [_schema(arg, where, outer) for arg in args]}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        values = [member.value for member in annotation]
        if not all(_is_json_scalar(value) for value in values):
            raise ConfigurationError(
                f"{where}: the values of the enum {annotation.__qualname__} must be str, int, "
                "finite float, bool or None to be described as JSON"
            )
        return {"enum": values}
    if isinstance(annotation, type) and attrs.has(annotation):
        if annotation in outer:
            raise ConfigurationError(
                f"{where}: {annotation.__qualname__} contains itself; recursive types cannot "
                "be described as JSON schema"
            )
        inner = (*outer, annotation)
        fields = attrs.fields(attrs.resolve_types(annotation))
        properties = {}
        required = []
        for attribute in fields:
            if not attribute.init:
                continue
            if attribute.type is None:
                raise ConfigurationError(
                    f"{where}: field {attribute.name!r} of {annotation.__name__} has no type"
                )
            properties[attribute.alias] = _schema(
                attribute.type, f"{where}, field {attribute.name!r}", inner
            )
            if attribute.default is attrs.NOTHING:
                required.append(attribute.alias)
        return {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
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
        "float, bool, None, list, tuple, dict, Optional, Literal, an Enum or an attrs class)"
    )


def coerce(value: Any, annotation: Any, path: str) -> Any:
    """Check a JSON value against ``annotation`` and convert it to the Python value.

    Raises:
        ToolArgumentError: The value does not fit, with ``path`` naming where.
    """
    if annotation is Any:
        return value
    if annotation is None or annotation is _NONE_TYPE:
        if value is not None:
            raise ToolArgumentError(f"{path}: expected null, got {_json_type(value)}")
        return None
    if annotation is str:
        if not isinstance(value, str):
            raise ToolArgumentError(f"{path}: expected a string, got {_json_type(value)}")
        return value
    if annotation is bool:
        if not isinstance(value, bool):
            raise ToolArgumentError(f"{path}: expected a boolean, got {_json_type(value)}")
        return value
    if annotation is int:
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise ToolArgumentError(f"{path}: expected an integer, got {_json_type(value)}")
        return value
    if annotation is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ToolArgumentError(f"{path}: expected a number, got {_json_type(value)}")
        try:
            return float(value)
        except OverflowError:
            raise ToolArgumentError(f"{path}: the number is too large") from None
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is typing.Annotated:
        return coerce(value, args[0], path)
    if origin is Literal:
        if value not in args or (
            isinstance(value, bool) != any(isinstance(a, bool) and a == value for a in args)
        ):
            raise ToolArgumentError(f"{path}: expected one of {list(args)!r}, got {value!r}")
        return value
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
        try:
            return annotation(value)
        except Exception:  # ValueError, TypeError (unhashable), or a custom _missing_'s
            allowed = [member.value for member in annotation]
            raise ToolArgumentError(f"{path}: expected one of {allowed!r}, got {value!r}") from None
    if isinstance(annotation, type) and attrs.has(annotation):
        if not isinstance(value, dict):
            raise ToolArgumentError(f"{path}: expected an object, got {_json_type(value)}")
        fields = {a.alias: a for a in attrs.fields(annotation) if a.init}
        unknown = sorted(set(value) - set(fields))
        if unknown:
            raise ToolArgumentError(f"{path}: unexpected field {unknown[0]!r}")
        kwargs = {}
        for alias, attribute in fields.items():
            if alias in value:
                kwargs[alias] = coerce(value[alias], attribute.type, f"{path}.{alias}")
            elif attribute.default is attrs.NOTHING:
                raise ToolArgumentError(f"{path}: missing field {alias!r}")
        try:
            return annotation(**kwargs)
        except Exception as error:  # the class's validators and converters decide
            raise ToolArgumentError(f"{path}: {error or type(error).__name__}") from None
    if annotation in (list, set, frozenset) or origin in (list, set, frozenset, Sequence):
        if not isinstance(value, list):
            raise ToolArgumentError(f"{path}: expected an array, got {_json_type(value)}")
        item = args[0] if args else Any
        items = [coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value)]
        container = (
            origin
            if origin in (set, frozenset)
            else annotation
            if annotation in (set, frozenset)
            else list
        )
        try:
            return container(items)
        except TypeError as error:
            raise ToolArgumentError(f"{path}: a set cannot hold these items ({error})") from None
    if annotation is tuple or origin is tuple:
        if not isinstance(value, list):
            raise ToolArgumentError(f"{path}: expected an array, got {_json_type(value)}")
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            item = args[0] if args else Any
            return tuple(coerce(v, item, f"{path}[{i}]") for i, v in enumerate(value))
        if len(value) != len(args):
            raise ToolArgumentError(f"{path}: expected {len(args)} items, got {len(value)}")
        return tuple(
            coerce(v, a, f"{path}[{i}]") for i, (v, a) in enumerate(zip(value, args, strict=False))
        )
    if annotation is dict or origin in (dict, Mapping):
        if not isinstance(value, dict):
            raise ToolArgumentError(f"{path}: expected an object, got {_json_type(value)}")
        item = args[1] if args else Any
        return {k: coerce(v, item, f"{path}.{k}") for k, v in value.items()}
    raise ToolArgumentError(f"{path}: unsupported type {annotation!r}")  # pragma: no cover


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def bind_arguments(definition: ToolDefinition, call: ToolCall) -> dict[str, Any]:
    """The Python keyword arguments for ``call``.

    Raises:
        ToolArgumentError: The arguments are not JSON, or do not fit the schema.
    """
    arguments = call.arguments
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except (ValueError, RecursionError):
            raise ToolArgumentError("the arguments are not valid JSON") from None
    if not isinstance(arguments, Mapping):
        raise ToolArgumentError("the arguments must be a JSON object")
    known = {parameter.name for parameter in definition.signature}
    unknown = sorted(set(arguments) - known)
    if unknown:
        raise ToolArgumentError(f"unexpected argument {unknown[0]!r}")
    bound: dict[str, Any] = {}
    for parameter in definition.signature:
        if parameter.name in arguments:
            bound[parameter.name] = coerce(
                arguments[parameter.name], parameter.annotation, parameter.name
            )
        elif parameter.required:
            raise ToolArgumentError(f"missing required argument {parameter.name!r}")
    return bound


def _to_json(value: Any) -> Any:
    if attrs.has(type(value)):
        return attrs.asdict(
            value, recurse=True, value_serializer=lambda _i, _a, v: _to_json_value(v)
        )
    return _to_json_value(value)


def _to_json_value(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, (set, frozenset, tuple)):
        return list(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


def render_result(value: Any) -> str:
    """A tool's return value as the text the model sees."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=_to_json)
    except (TypeError, ValueError):
        return str(value)


_TOOL_THREADS = 64
"""How many sync tool calls run at once in each event loop; more calls wait for a turn.

Sync tools have worker threads of their own (not anyio's default limiter), so threads
of calls that outlived their timeout never hold up the session store or other users of
the default limiter (under trio, an abandoned thread keeps its token until it returns).
"""

_TOOL_LIMITER: RunVar[anyio.CapacityLimiter] = RunVar("littleghost_tool_threads")


def _tool_threads() -> anyio.CapacityLimiter:
    """The limiter of sync tool threads of the running event loop."""
    limiter = _TOOL_LIMITER.get(None)
    if limiter is None:
        limiter = anyio.CapacityLimiter(_TOOL_THREADS)
        _TOOL_LIMITER.set(limiter)
    return limiter


async def invoke(function: Callable[..., Any], kwargs: dict[str, Any], name: str) -> str:
    """Call a tool and render what it returned.

    A sync tool runs in a worker thread (at most ``_TOOL_THREADS`` at once) that cannot
    be stopped: when the caller stops waiting (cancellation, a timeout), the thread runs
    on, and whatever it finally returns or raises is discarded with one log line naming
    the tool ``name``.
    """
    if inspect.iscoroutinefunction(function):
        value = await function(**kwargs)
    else:
        value = await _in_thread(functools.partial(function, **kwargs), name)
        if inspect.isawaitable(value):
            value = await value
    return render_result(value)


class _ThreadCall:
    """One sync tool call in a worker thread, and whether its caller stopped waiting."""

    def __init__(self, call: Callable[[], Any], name: str) -> None:
        self.call = call
        self.name = name
        self.lock = threading.Lock()
        self.abandoned = False
        self.outcome: str | None = None  # "returned" or "raised ...", once finished
        self.raised: BaseException | None = None

    def run(self) -> Any:
        """Run in the worker thread."""
        try:
            value = self.call()
        except BaseException as error:
            self.raised = error
            self.finish(f"raised {type(error).__name__}")
            raise
        self.finish("returned")
        return value

    def finish(self, outcome: str) -> None:
        with self.lock:
            self.outcome = outcome
            late = self.abandoned
        if late:
            self.discarded(outcome)

    def abandon(self) -> None:
        """The caller stopped waiting; log now if the call had already finished."""
        with self.lock:
            self.abandoned = True
            outcome = self.outcome
        if outcome is not None:
            self.discarded(outcome)

    def discarded(self, outcome: str) -> None:
        logger.warning(
            "tool %r: a call the run stopped waiting for has %s; its late result was discarded",
            self.name,
            outcome,
        )


async def _in_thread(call: Callable[[], Any], name: str) -> Any:
    thread_call = _ThreadCall(call, name)
    try:
        return await anyio.to_thread.run_sync(
            thread_call.run, abandon_on_cancel=True, limiter=_tool_threads()
        )
    except BaseException as error:
        if error is not thread_call.raised:  # not the tool's own exception: we stopped waiting
            thread_call.abandon()
        raise


def error_result(call: ToolCall, text: str) -> ToolResult:
    """An error result for ``call`` that the model sees."""
    return ToolResult(call.id, text, True)
