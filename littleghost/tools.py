"""``@tool``: tool definitions from signatures and docstrings, the tools of a class, and
the arguments of a call bound to a tool's parameters.

The parameter types a tool may take are those of ``littleghost.tool_types``. A parameter
annotated ``RunContext``, whatever its name, receives the run's context and is not shown to
the model (an annotation that cannot be resolved, as when ``RunContext`` is imported under
``TYPE_CHECKING``, counts when its text is ``RunContext`` or ends with ``.RunContext``); a
parameter named ``context`` with another annotation is an ordinary argument.
"""

from __future__ import annotations

import builtins
import collections
import copy
import difflib
import inspect
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, overload

from attrs import frozen

from littleghost._validators import is_number, safe_repr
from littleghost.errors import ConfigurationError
from littleghost.hooks import hook_kind
from littleghost.messages import ToolCall
from littleghost.models.base import ToolSpec
from littleghost.tool_docs import parse_docstring
from littleghost.tool_types import (
    VARIADIC,
    ToolArgumentError,
    coerce,
    json_schema,
    left_out,
    parse_json,
    shown_default,
    unexpected,
)

__all__ = ["ToolArgumentError", "ToolDefinition", "index_tools", "tool"]


_MARK = "__littleghost_tool__"
_CONTEXT = object()
"""Stands for a ``RunContext`` annotation that cannot be resolved."""


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


F = TypeVar("F", bound=Callable[..., Any])


def _not_a_function(value: object) -> str:
    """What a tool error names in place of a function: a class as ``the class X`` (no
    instance of it is a tool either), anything else by its type and ``repr``."""
    if isinstance(value, type):
        return f"the class {value.__name__}"
    return f"{type(value).__name__} {value!r:.60}"


@overload
def tool(function: F) -> F: ...


@overload
def tool(
    function: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> Callable[[F], F]: ...


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
        kind = hook_kind(function)
        if kind is not None:  # before its parameters, which are the hook's, are read
            marked = _method_place(function) or f"@tool: {function.__name__!r}"
            raise ConfigurationError(
                f"{marked} is already a @{kind} hook: a method is a @tool or a hook, not both"
            )
        if not inspect.isfunction(inspect.unwrap(function)):  # functools.cache's too
            raise ConfigurationError(
                "@tool decorates a function (a def, in a class body for a method), not "
                f"{_not_a_function(target)}: wrap it in one (a "
                "bound method goes in tools= as it is)"
            )
        if name is not None and (not isinstance(name, str) or not _NAME.fullmatch(name)):
            raise ConfigurationError(
                f"@tool: name must match {_NAME.pattern}, not {safe_repr(name)}"
            )
        if description is not None and not (isinstance(description, str) and description.strip()):
            raise ConfigurationError(
                f"@tool: description must be a non-blank str or None, not {safe_repr(description)}"
            )
        if timeout is not None and not (is_number(timeout) and timeout > 0):
            raise ConfigurationError(
                "@tool: timeout must be a positive finite number of seconds or None, "
                f"not {safe_repr(timeout)}"
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
        except ConfigurationError as error:
            place = _method_place(function)
            if place is None:
                raise
            raise ConfigurationError(f"{place}: {error}") from None
        return target

    return mark(function) if function is not None else mark


def _method_place(function: Callable[..., Any]) -> str | None:
    """``Class.method`` for a function defined in a class body (its class is not made
    yet when ``@tool`` runs), else ``None``."""
    parts = str(getattr(function, "__qualname__", "")).split(".")
    if len(parts) < 2 or parts[-2] == "<locals>":
        return None
    return ".".join(parts[-2:])


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
_PARAMETER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""What a parameter's name must match: Anthropic's API refuses a request whose tool
has another property name at the top of its schema (OpenAI's takes it)."""


def define_tool(
    function: Callable[..., Any],
    *,
    is_method: bool,
    namespace: Mapping[str, Any] | None = None,
) -> ToolDefinition:
    """Build the definition of ``function`` as a tool.

    A ``staticmethod`` is defined as the plain function it wraps. ``namespace`` is the
    body of the class that declares a method (``_annotation_names``).

    Raises:
        ConfigurationError: A generator function, no docstring, a method whose first
            parameter is not a positional ``self``, a function taking ``self`` or ``cls``
            first (a method of a class, a classmethod), a parameter name a provider refuses
            (not ASCII, or longer than 64 characters), a missing or unsupported annotation,
            two ``RunContext`` parameters, ``RunContext`` inside another annotation
            (``RunContext | None``), ``*args`` / ``**kwargs`` or a positional-only parameter.
        NameError: An annotation (other than ``RunContext``) cannot be resolved yet (the
            message names the tool and the parameter).
    """
    static = False  # a staticmethod: no instance to name self
    if isinstance(function, staticmethod):
        function, is_method, static = function.__func__, False, True
    if not (inspect.ismethod(function) or inspect.isfunction(inspect.unwrap(function))):
        raise ConfigurationError(
            f"a tool is a function or a method, not {_not_a_function(function)}: "
            "wrap it in a def (its parameters, types and "
            "docstring are the tool's)"
        )
    options = tool_options(function) or {}
    tool_name = options.get("name") or getattr(function, "__name__", None)
    if tool_name == "<lambda>":
        raise ConfigurationError(
            "a lambda cannot be a tool (it has no name, no docstring and no annotations): "
            "write a def with a docstring and annotated parameters"
        )
    if not isinstance(tool_name, str) or not _NAME.fullmatch(tool_name):
        raise ConfigurationError(f"tool name {tool_name!r} must match {_NAME.pattern}")
    if inspect.isgeneratorfunction(function) or inspect.isasyncgenfunction(function):
        raise ConfigurationError(
            f"tool {tool_name!r} is a generator function (it uses yield), and a tool returns "
            "its whole result: collect the items and return them (a list, say)"
        )
    doc = inspect.getdoc(function) or ""
    summary, arg_docs = parse_docstring(doc)
    tool_description = options.get("description") or summary
    if not tool_description and doc.strip():
        raise ConfigurationError(
            f"tool {tool_name!r} has no description: its docstring holds only sections "
            "(Args:, say), and the model needs a description of the tool before them (or "
            "pass @tool(description=...))"
        )
    wrapped = None if doc else _wrapped_described(function)
    if not tool_description and wrapped is not None:
        raise ConfigurationError(
            f"tool {tool_name!r} wraps {wrapped!r} but has no docstring: its decorator "
            f"dropped the docstring, name and parameters of {wrapped!r} (functools.wraps "
            "keeps them)"
        )
    if not tool_description:
        stripped, instead = "", "@tool(description=...)"
        if sys.flags.optimize > 1:  # its Args: section went too
            stripped = " (-OO or PYTHONOPTIMIZE=2 strips them)"
            instead += ', and Annotated[T, "..."] for what its Args: said of a parameter'
        raise ConfigurationError(
            f"tool {tool_name!r} has no docstring{stripped}: the model needs a description "
            f"(or pass {instead})"
        )
    parameters = list(inspect.signature(function).parameters.values())
    unshown = None
    if is_method:
        _check_self(tool_name, parameters[0] if parameters else None)
        unshown, *parameters = parameters
    try:
        hints = _type_hints(function, None if unshown is None else unshown.name, namespace)
    except NameError as error:
        raise NameError(f"tool {tool_name!r}, {error}") from None
    properties: dict[str, Any] = {}
    required: list[str] = []
    signature: list[_Parameter] = []
    context_parameter: str | None = None
    for parameter in parameters:
        if parameter.kind in VARIADIC:
            raise ConfigurationError(
                f"tool {tool_name!r}: *args and **kwargs cannot be described to a model"
            )
        if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {parameter.name!r} is positional-only; "
                "tools are called with keyword arguments"
            )
        if parameter.name not in hints:
            if parameter.name == "cls" and parameter is parameters[0] and not is_method:
                raise ConfigurationError(
                    f"tool {tool_name!r} takes cls first, as a classmethod does: a tool is a "
                    "function, a method (self) or a staticmethod, never a classmethod"
                )
            if parameter.name == "self" and parameter is parameters[0] and not is_method:
                raise ConfigurationError(
                    f"tool {tool_name!r} takes self first, as a method does: in tools=[...] "
                    "give the method of an instance (client.method, not Class.method), or "
                    "declare it with @tool in the agent class"
                )
            named = ""  # in a class body, a method's instance by another name, maybe
            first = parameter is parameters[0] and not (is_method or static)
            if first and _method_place(function):  # a staticmethod under @tool: unknown
                named = "; if it is the method's instance, name it self"
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {parameter.name!r} needs a type annotation{named}"
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
        if not _PARAMETER_NAME.fullmatch(parameter.name):
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {parameter.name!r} must match "
                f"{_PARAMETER_NAME.pattern} (ASCII, at most 64 characters): Anthropic's API "
                "refuses every request of an agent with a tool that has another name"
            )
        # a str: one that could not be resolved (``_type_hints``), RunContext inside it
        if isinstance(annotation, str) or _holds_run_context(annotation):
            raise ConfigurationError(
                f"tool {tool_name!r}: parameter {parameter.name!r} has RunContext inside "
                f"{annotation!r}; a parameter receives the run's context when it is "
                "annotated RunContext alone (never None in a run)"
            )
        where = f"tool {tool_name!r}, parameter {parameter.name!r}"
        try:
            schema = dict(json_schema(annotation, where))
        except NameError as error:  # a record's field
            raise NameError(f"{where}: {error}") from None
        if parameter.name in arg_docs and "description" not in schema:
            schema["description"] = arg_docs[parameter.name]
        has_default = parameter.default is not inspect.Parameter.empty
        if has_default:
            schema.update(shown_default(parameter.default, annotation, where))
        else:
            required.append(parameter.name)
        properties[parameter.name] = schema
        signature.append(_Parameter(parameter.name, annotation, not has_default, parameter.default))
    _check_described(tool_name, arg_docs, [parameter.name for parameter in parameters], properties)
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


def _wrapped_described(function: Callable[..., Any]) -> str | None:
    """The name of a function with a docstring that ``function``, taking ``*args`` or
    ``**kwargs``, closes over (the wrapper a decorator made of it), if any."""
    try:
        taken = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    if not any(parameter.kind in VARIADIC for parameter in taken):
        return None
    for held in closed_over(function):
        if isinstance(held, staticmethod):
            held = held.__func__
        if inspect.isfunction(held) and inspect.getdoc(held):
            return str(held.__name__)
    return None


def closed_over(function: Callable[..., Any]) -> Iterator[object]:
    """What ``function`` closes over (a decorator's wrapper: the function it wraps), the
    cells filled by now."""
    for cell in getattr(function, "__closure__", None) or ():
        try:
            yield cell.cell_contents
        except ValueError:  # a cell not filled yet
            continue


def _check_described(
    tool_name: str,
    described: Mapping[str, str],
    parameters: Sequence[str],
    shown: Mapping[str, Mapping[str, Any]],
) -> None:
    """``ConfigurationError`` when the docstring describes a name that is no parameter,
    almost like one the model is shown without a description: a typo, which left the
    model without what the docstring says of it."""
    undescribed = {
        name.lower(): name for name, schema in shown.items() if "description" not in schema
    }
    for name in described:
        if name in parameters:
            continue
        near = difflib.get_close_matches(name.lower(), list(undescribed), n=1, cutoff=0.8)
        if near:
            meant = undescribed[near[0]]
            raise ConfigurationError(
                f"tool {tool_name!r}: its docstring describes {name!r}, which is no parameter "
                f"of it: did you mean {meant!r}? (the model would be told nothing of {meant!r})"
            )


_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)


def _check_self(tool_name: str, first: inspect.Parameter | None) -> None:
    """``ConfigurationError`` unless a tool method's first parameter is a positional ``self``."""
    if first is not None and first.name == "self" and first.kind in _POSITIONAL:
        return
    if first is None:
        got = "but it takes none"
    elif first.kind in _POSITIONAL:
        got = f"not {first.name!r}"  # an identifier
    else:
        got = f"not the {first.kind.description} {first.name!r}"
    raise ConfigurationError(
        f"tool {tool_name!r}: the first parameter of a tool method must be a positional self, "
        f"{got}; declare a tool that needs no instance with @staticmethod, or as a function "
        "in tools=[...]"
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


def _holds_run_context(annotation: Any) -> bool:
    """True when ``RunContext`` is inside ``annotation`` (``RunContext | None``)."""
    return any(
        _is_run_context(arg) or _holds_run_context(arg) for arg in typing.get_args(annotation)
    )


_RUN_CONTEXT_WORD = re.compile(r"\bRunContext\b")
"""``RunContext`` inside the text of an annotation (``RunContext | None``)."""


def _names_run_context(text: str) -> bool:
    """True for the text of a ``RunContext`` annotation: ``RunContext``, ``x.RunContext``."""
    text = text.strip().strip("'\"").strip()
    return text == "RunContext" or text.endswith(".RunContext")


def _type_hints(
    function: Callable[..., Any],
    unshown: str | None = None,
    namespace: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``_resolved_hints``, each ``Optional[Annotated[X, ...]]`` whose ``X`` takes ``None``
    already as that ``Annotated`` (Python 3.10 adds the ``Optional`` to a parameter that
    defaults to ``None``: the schema would nest a second null)."""
    resolved = _resolved_hints(function, unshown, namespace)
    return {name: _single_optional(hint) for name, hint in resolved.items()}


def _single_optional(hint: Any) -> Any:
    """``hint``, or the ``Annotated[X, ...]`` of ``Optional[Annotated[X, ...]]`` when
    ``X`` takes ``None`` already."""
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    others = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    if not union or len(others) != 1 or typing.get_origin(others[0]) is not typing.Annotated:
        return hint  # a union with one other arg than None is that arg's Optional
    inner = others[0]
    return inner if type(None) in typing.get_args(typing.get_args(inner)[0]) else hint


def _resolved_hints(
    function: Callable[..., Any],
    unshown: str | None = None,
    namespace: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Resolved parameter annotations, their names looked up as ``_annotation_names`` says.

    An annotation naming ``RunContext`` that cannot be resolved (imported only under
    ``TYPE_CHECKING``) becomes ``_CONTEXT``, and one holding it inside another stays its
    text (which ``define_tool`` refuses); the return annotation, and that of the
    ``unshown`` parameter (a method's ``self: Support``, its class not yet bound), may be
    unresolvable.

    Raises:
        NameError: Another parameter annotation cannot be resolved (the message names
            the parameter).
    """
    names = _annotation_names(function, namespace)
    try:
        return typing.get_type_hints(function, localns=names, include_extras=True)
    except NameError:
        pass
    annotations = dict(getattr(function, "__annotations__", {}))
    annotations.pop("return", None)
    annotations.pop(unshown, None)
    hints: dict[str, Any] = {}
    for name, annotation in annotations.items():
        probe = types.FunctionType(_probe.__code__, getattr(function, "__globals__", {}))
        probe.__annotations__ = {name: annotation}
        try:
            hints[name] = typing.get_type_hints(probe, localns=names, include_extras=True)[name]
        except NameError as error:
            if isinstance(annotation, str) and _names_run_context(annotation):
                hints[name] = _CONTEXT
            elif isinstance(annotation, str) and _RUN_CONTEXT_WORD.search(annotation):
                hints[name] = annotation  # RunContext inside another: ``define_tool`` says so
            else:
                raise NameError(f"parameter {name!r}: {error}") from None
    return hints


def _annotation_names(
    function: Callable[..., Any], namespace: Mapping[str, Any] | None
) -> Mapping[str, Any] | None:
    """Where the names in a tool's annotations are looked up (``None``: its module alone).

    ``from __future__ import annotations`` leaves out the body of the class that declares
    a method (``namespace``), which Python sees without it: a class declared there (a
    record, an enum) comes first, as it would; the body's other names (its methods, a
    tool named ``date`` say) only after the module's and the builtins."""
    if namespace is None:
        return None
    module = getattr(inspect.unwrap(function), "__globals__", {})
    body = dict(namespace)
    classes = {name: value for name, value in body.items() if isinstance(value, type)}
    return collections.ChainMap(classes, module, vars(builtins), body)


def _probe() -> None:  # pragma: no cover - only its code object is used
    pass


_MUTABLE_DEFAULTS = (list, dict, set)
"""Defaults copied for each call that leaves them out (as pydantic copies a field's)."""


def bind_arguments(definition: ToolDefinition, call: ToolCall) -> dict[str, Any]:
    """The Python keyword arguments for ``call`` (a fresh copy of each list, dict or set
    default it leaves out).

    Raises:
        ToolArgumentError: The arguments are not JSON, or do not fit the schema.
    """
    arguments = call.arguments
    if isinstance(arguments, str):
        try:
            arguments = parse_json(arguments) if arguments.strip() else {}
        except ToolArgumentError as error:
            raise ToolArgumentError(f"the arguments are {error}") from None
    if not isinstance(arguments, Mapping):
        raise ToolArgumentError("the arguments must be a JSON object")
    known = {parameter.name for parameter in definition.signature}
    unknown = sorted(set(arguments) - known)
    problems = unexpected(unknown, "unexpected argument")  # each problem told at once
    bound: dict[str, Any] = {}
    for parameter in definition.signature:
        given = arguments.get(parameter.name)
        if parameter.name in arguments and not left_out(
            given, parameter.annotation, required=parameter.required
        ):
            try:
                bound[parameter.name] = coerce(given, parameter.annotation, parameter.name)
            except ToolArgumentError as error:
                problems.extend(error.problems)
        elif parameter.required:
            problems.append(f"missing required argument {parameter.name!r}")
        elif isinstance(parameter.default, _MUTABLE_DEFAULTS):  # the next call's is as shown
            bound[parameter.name] = copy.deepcopy(parameter.default)
    if problems:
        raise ToolArgumentError(*problems)
    return bound
