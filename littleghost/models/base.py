"""The model protocol and the values that cross it."""

from __future__ import annotations

import enum
import functools
import inspect
import re
from collections.abc import Awaitable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, cast, runtime_checkable

from attrs import astuple, define, field, frozen

from littleghost._validators import (
    MAX_TOKEN_COUNT,
    TOKEN_COUNT,
    instance_of,
    is_int,
    safe_repr,
    tuple_of,
    type_check,
)
from littleghost.errors import ConfigurationError
from littleghost.messages import Message, Role, stray_part
from littleghost.text import json_type, well_formed_value
from littleghost.tool_bounds import BOUND_KEYWORDS

__all__ = [
    "ANSWER_CAPS",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "OutputSchema",
    "StopReason",
    "ToolSpec",
    "Usage",
    "bill",
    "billed",
    "capped",
    "check_model",
    "model_problem",
    "model_shortfall",
    "prepare",
    "relayed",
    "report_usage",
    "reports",
]


ANSWER_CAPS = ("max_tokens", "max_completion_tokens")
"""The settings that cap an answer's tokens (OpenAI's newer name second)."""


class StopReason(str, enum.Enum):
    """Why the model stopped."""

    END_TURN = "end_turn"
    TOOL_USE = "tool_use"
    MAX_TOKENS = "max_tokens"
    STOP_SEQUENCE = "stop_sequence"
    CONTENT_FILTER = "content_filter"

    def __str__(self) -> str:
        return self.value


def _count(name: str) -> Any:
    return field(
        default=0,
        validator=type_check(
            f"Usage.{name}",
            lambda value: is_int(value) and 0 <= value <= MAX_TOKEN_COUNT,
            "an int from 0 to 2**63-1",
        ),
    )


@frozen
class Usage:
    """Tokens a model call (or a run, summed) consumed.

    ``input_tokens`` counts the whole prompt, cached tokens included (the GenAI
    convention): ``cache_read_tokens`` of them were read from the provider's prompt cache
    and ``cache_write_tokens`` written to it. ``output_tokens`` counts everything the
    model wrote, ``reasoning_tokens`` of them reasoning. A breakdown larger than its
    total, or a count past 2**63-1 (what 64 bits hold), is a ``TypeError``; a sum stops
    there.
    """

    input_tokens: int = _count("input_tokens")
    output_tokens: int = _count("output_tokens")
    cache_read_tokens: int = _count("cache_read_tokens")
    cache_write_tokens: int = _count("cache_write_tokens")
    reasoning_tokens: int = _count("reasoning_tokens")

    def __attrs_post_init__(self) -> None:
        if self.cache_read_tokens + self.cache_write_tokens > self.input_tokens:
            raise TypeError(
                "Usage: cache_read_tokens + cache_write_tokens "
                f"({self.cache_read_tokens} + {self.cache_write_tokens}) are part of "
                f"input_tokens ({self.input_tokens}) and cannot exceed it"
            )
        if self.reasoning_tokens > self.output_tokens:
            raise TypeError(
                f"Usage: reasoning_tokens ({self.reasoning_tokens}) are part of "
                f"output_tokens ({self.output_tokens}) and cannot exceed it"
            )

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        pairs = zip(astuple(self), astuple(other), strict=True)
        return Usage(*(min(a + b, MAX_TOKEN_COUNT) for a, b in pairs))

    def __sub__(self, other: Usage) -> Usage:
        """The usage between an earlier total ``other`` and this one."""
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(*(a - b for a, b in zip(astuple(self), astuple(other), strict=True)))

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens


@define(eq=False)
class _Reported:
    """The latest usage ``report_usage`` gave the call going on, and the call it is made
    in, if any (a sub-agent's, run by a model of its own)."""

    outer: _Reported | None
    usage: Usage = field(factory=Usage)

    def within(self, call: _Reported) -> bool:
        """Whether this call is ``call`` or one made in it."""
        at: _Reported | None = self
        while at is not None and at is not call:
            at = at.outer
        return at is call


_REPORTED: ContextVar[_Reported | None] = ContextVar("littleghost_reported_usage", default=None)


def report_usage(usage: Usage) -> None:
    """Tell the model call going on the usage its provider has reported so far: the
    call's whole usage until now, which replaces what was reported before (Anthropic
    reports the prompt's tokens as its stream starts, an OpenAI-compatible server the
    usage in its last chunk). A call that then ends without its answer (the run's
    deadline or a cancellation cuts it, the stream's consumer stops, it fails) is billed
    that: its ``chat`` span, the token metric and the run's usage count it. The built-in
    models report as the counts arrive; a custom model calls this likewise, in the call's
    task (or a task it starts, a thread ``anyio.to_thread`` runs for it: they share its
    context; a thread of its own does not). Outside a call a run or a compaction makes,
    nothing happens.

    Raises:
        TypeError: ``usage`` is not a ``Usage``.
    """
    if not isinstance(usage, Usage):
        raise TypeError(f"report_usage: usage must be a Usage, not {type(usage).__name__}")
    reported = _REPORTED.get()
    if reported is not None:
        reported.usage = usage


@contextmanager
def reports() -> Iterator[_Reported]:
    """Collect what ``report_usage`` is told in the block (one model call, in the task
    that makes it, and the tasks it starts): gives the call's record of it."""
    reported = _Reported(_REPORTED.get())
    token = _REPORTED.set(reported)
    try:
        yield reported
    finally:
        _REPORTED.reset(token)


_BILLED = "_littleghost_billed"
"""The attribute ``bill`` keeps a call's usage in, on the exception that ended it."""
_BILLED_IN = "_littleghost_billed_in"
"""The attribute ``bill`` keeps the call that billed the exception in."""
_RELAYED = "_littleghost_relayed"
"""The attribute ``bill`` keeps in whether a call made in the one that billed the exception
billed it first (``relayed``)."""


def bill(error: BaseException, call: _Reported) -> Usage:
    """What the ``call`` that ``error`` ended was billed: the error's own ``usage`` (a
    ``ProviderError``'s or ``ProtocolError``'s), else the usage its provider reported
    before it ended (``report_usage``), a cancellation's too; kept on ``error`` for
    ``billed``, replacing what an inner call kept there (the same cancellation passes
    through every call it stops). The ``usage`` of an error that a call made in this one
    billed (a sub-agent's, out of a model that runs one) is that call's, not this one's."""
    inner = getattr(error, _BILLED_IN, None)
    relayed = isinstance(inner, _Reported) and inner.within(call)
    usage = None if relayed else getattr(error, "usage", None)
    used = usage if isinstance(usage, Usage) and usage != Usage() else call.usage
    try:  # past the class's own ``__setattr__``: a frozen attrs exception refuses one
        object.__setattr__(error, _BILLED, used)
        object.__setattr__(error, _BILLED_IN, call)
        object.__setattr__(error, _RELAYED, relayed)
    except Exception:  # an exception that takes no attribute: never replace it by another
        pass
    return used


def relayed(error: BaseException) -> bool:
    """Whether the call ``error`` ended last got it from a call made in it (a sub-agent's,
    out of a model that runs one): its figures are that call's, not this one's."""
    return getattr(error, _RELAYED, False) is True


def billed(error: BaseException) -> Usage:
    """The usage a failed call was billed: what ``bill`` kept when the call ended with
    ``error`` (the usage its provider reported before it was cut, a cancellation's too),
    else the ``usage`` the error says it had (a ``ProviderError``'s or
    ``ProtocolError``'s: an answer stopped at the context window, or a stream that failed
    after it reported counts, is billed); none for any other error."""
    usage = getattr(error, _BILLED, None)
    if not isinstance(usage, Usage):
        usage = getattr(error, "usage", None)
    return usage if isinstance(usage, Usage) else Usage()


def _parameters(value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"ToolSpec.parameters must be a JSON schema dict, not {safe_repr(value)}")
    return dict(cast(Mapping[str, Any], well_formed_value(value)))


@frozen
class ToolSpec:
    """What the model is told about a tool: its ``name``, ``description`` and the JSON
    schema of its arguments (``parameters``)."""

    name: str = field()
    description: str = field(
        default="",
        converter=well_formed_value,
        validator=instance_of("ToolSpec.description", str, "a str"),
    )
    parameters: Mapping[str, Any] = field(
        factory=lambda: {"type": "object", "properties": {}}, converter=_parameters
    )

    @name.validator
    def _check_name(self, attribute: object, value: object) -> None:
        if not isinstance(value, str) or not value:
            raise TypeError(f"ToolSpec.name must be a non-empty str, not {safe_repr(value)}")


def _object_schema(value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping) or value.get("type") != "object":
        raise TypeError(
            "OutputSchema.schema must be a JSON schema dict with an object at its root, "
            f"not {safe_repr(value)}"
        )
    return dict(cast(Mapping[str, Any], well_formed_value(value)))


_SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


@frozen
class OutputSchema:
    """The JSON a request asks the model's final answer to be (native structured output).

    Args:
        name: A name for it, as providers want one (letters, digits, ``_`` and ``-``;
            at most 64).
        schema: A JSON schema with an object at its root.
    """

    name: str = field()
    schema: Mapping[str, Any] = field(converter=_object_schema)

    @name.validator
    def _check_name(self, attribute: object, value: object) -> None:
        if not isinstance(value, str) or not _SCHEMA_NAME.fullmatch(value):
            raise TypeError(
                f"OutputSchema.name must match {_SCHEMA_NAME.pattern}, not {safe_repr(value)}"
            )

    @functools.cached_property
    def closed_problem(self) -> str | None:
        """What in the schema is not a closed shape, as strict decoders want every value:
        an open object (``dict[str, X]``), a value of any type (``Any``) or a
        fixed-length tuple; ``None`` when there is none. Worked out once per schema."""
        return _closed_problem(self.schema)

    @functools.cached_property
    def unbounded_schema(self) -> Mapping[str, Any]:
        """The schema without its bounds (``minimum``, ``maxLength``, ``minItems``, ...)
        and defaults, which strict decoders refuse: the check of the answer applies the
        bounds, and a field left out gets its default. Built once."""
        return _unbounded(self.schema)

    @functools.cached_property
    def strict_schema(self) -> Mapping[str, Any] | None:
        """The schema as OpenAI's strict mode takes it: every object closed with every
        property required, an optional one nullable (``null`` stands for a field left
        out), every ``enum`` typed, no bounds nor defaults (``unbounded_schema``); ``None`` when the
        schema has a ``closed_problem``. Built once per schema, not on every request."""
        if self.closed_problem is not None:
            return None
        return _strict(self.unbounded_schema)


_NULL = {"type": "null"}
_TYPED = ("type", "enum", "anyOf", "const")
"""The keys that say what a value is; a schema without any of them takes any value."""


def _closed_problem(schema: object) -> str | None:
    if not isinstance(schema, Mapping) or not any(key in schema for key in _TYPED):
        return "a value of any type (Any)"
    if "prefixItems" in schema:
        return "a fixed-length tuple"
    if "anyOf" in schema:
        return next(filter(None, map(_closed_problem, schema["anyOf"])), None)
    if schema.get("type") == "object":
        properties = schema.get("properties")
        if not isinstance(properties, Mapping) or schema.get("additionalProperties") is not False:
            return "an open object (dict[str, X])"
        return next(filter(None, map(_closed_problem, properties.values())), None)
    if schema.get("type") == "array":
        return _closed_problem(schema.get("items"))
    return None


_UNSTRICT = BOUND_KEYWORDS | {"default"}
"""What strict decoders refuse: bounds, and a field's default (OpenAI's strict mode
answers 400 to ``default``)."""


def _unbounded(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` without ``_UNSTRICT``, in it and in every schema inside it."""
    found = {key: value for key, value in schema.items() if key not in _UNSTRICT}
    for key in ("items", "additionalProperties"):
        if isinstance(found.get(key), Mapping):
            found[key] = _unbounded(found[key])
    for key in ("anyOf", "prefixItems"):
        if key in found:
            found[key] = [_unbounded(option) for option in found[key]]
    if isinstance(found.get("properties"), Mapping):
        found["properties"] = {
            name: _unbounded(value) for name, value in found["properties"].items()
        }
    return found


def _strict(schema: Mapping[str, Any]) -> dict[str, Any]:
    """``schema`` (closed) with every property required, the optional ones nullable, and
    every ``enum`` typed (strict mode refuses a schema without a ``type``)."""
    if "enum" in schema and "type" not in schema:
        return _typed_enum(schema)
    if "anyOf" in schema:
        return {**schema, "anyOf": [_strict(option) for option in schema["anyOf"]]}
    if schema.get("type") == "object":
        required = set(schema.get("required", ()))
        properties = {
            name: _strict(value) if name in required else _nullable(_strict(value))
            for name, value in schema["properties"].items()
        }
        return {**schema, "properties": properties, "required": list(properties)}
    if schema.get("type") == "array":
        return {**schema, "items": _strict(schema["items"])}
    return dict(schema)


def _typed_enum(schema: Mapping[str, Any]) -> dict[str, Any]:
    """An ``enum`` with the JSON type of its values, or one typed ``enum`` per type in an
    ``anyOf`` when they have several (``Literal["a", 1, None]``)."""
    rest = {key: value for key, value in schema.items() if key != "enum"}
    by_type: dict[str, list[Any]] = {}
    for value in schema["enum"]:
        by_type.setdefault(json_type(value) or "string", []).append(value)
    typed = [
        {"type": "null"} if kind == "null" else {"type": kind, "enum": members}
        for kind, members in by_type.items()
    ]
    return {**rest, **typed[0]} if len(typed) == 1 else {**rest, "anyOf": typed}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if _takes_null(schema):
        return schema
    if "anyOf" in schema:
        return {**schema, "anyOf": [*schema["anyOf"], _NULL]}
    return {"anyOf": [schema, _NULL]}


def _takes_null(schema: Mapping[str, Any]) -> bool:
    return (
        schema.get("type") == "null"
        or None in schema.get("enum", ())
        or any(_takes_null(option) for option in schema.get("anyOf", ()))
    )


def _messages(value: object) -> tuple[Message, ...]:
    return tuple_of(value, "ModelRequest.messages", Message, "Message")


def _tools(value: object) -> tuple[ToolSpec, ...]:
    return tuple_of(value, "ModelRequest.tools", ToolSpec, "ToolSpec")


def _settings(value: object) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping) or not all(isinstance(key, str) for key in value):
        raise TypeError(
            f"ModelRequest.settings must be a mapping with str keys, not {type(value).__name__}"
        )
    return dict(value)


@frozen
class ModelRequest:
    """One call to a model.

    Args:
        messages: What the model sees, instructions first.
        tools: The tools it may call.
        settings: Provider settings (``max_tokens``, ``temperature``, ``seed``, ...).
        purpose: ``chat``, or ``context_compaction`` for a summary call.
        output_schema: The JSON the final answer must be, for a model that takes a
            schema (``supports_output_schema``); ``None`` for free text.
    """

    messages: tuple[Message, ...] = field(converter=_messages)
    tools: tuple[ToolSpec, ...] = field(default=(), converter=_tools)
    settings: Mapping[str, Any] = field(factory=dict, converter=_settings)
    purpose: str = field(
        default="chat", validator=instance_of("ModelRequest.purpose", str, "a str")
    )
    output_schema: OutputSchema | None = field(
        default=None,
        validator=instance_of(
            "ModelRequest.output_schema", (OutputSchema, type(None)), "an OutputSchema or None"
        ),
    )

    @property
    def max_tokens(self) -> int | None:
        """The output cap the request sets, if any: ``max_tokens``, else OpenAI's
        ``max_completion_tokens``."""
        for key in ANSWER_CAPS:
            value = self.settings.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        return None


def _response_message(value: object) -> Message:
    if not isinstance(value, Message):
        raise TypeError(f"ModelResponse.message must be a Message, not {type(value).__name__}")
    if value.role is not Role.ASSISTANT:
        raise TypeError(f"ModelResponse.message must be an assistant message, not {value.role}")
    problem = stray_part(value)
    if problem is not None:
        raise TypeError(f"ModelResponse.message: {problem}")
    return value


def _stop_reason(value: object) -> StopReason:
    try:
        return StopReason(value)
    except ValueError:
        raise TypeError(
            f"ModelResponse.stop_reason must be a StopReason, not {safe_repr(value)}"
        ) from None


def _usage(value: object) -> Usage:
    if not isinstance(value, Usage):
        raise TypeError(f"ModelResponse.usage must be a Usage, not {safe_repr(value)}")
    return value


def _reported_name(name: str) -> Any:
    return field(
        default=None,
        kw_only=True,
        validator=instance_of(f"ModelResponse.{name}", (str, type(None)), "a str or None"),
    )


@frozen
class ModelResponse:
    """What a model answered.

    Args:
        message: The assistant message.
        stop_reason: Why the model stopped.
        usage: The tokens the call consumed.
        response_id: The id the provider gave this answer (``chatcmpl-...``,
            ``msg_...``), when it sent one (keyword-only).
        response_model: The model the provider says answered, which may name a snapshot
            of the model asked for (keyword-only).

    ``response_id`` and ``response_model`` are metadata for telemetry
    (``gen_ai.response.id``, ``gen_ai.response.model``); the conversation log keeps only
    the message.
    """

    message: Message = field(converter=_response_message)
    stop_reason: StopReason = field(default=StopReason.END_TURN, converter=_stop_reason)
    usage: Usage = field(factory=Usage, converter=_usage)
    response_id: str | None = _reported_name("response_id")
    response_model: str | None = _reported_name("response_model")


@runtime_checkable
class Model(Protocol):
    """A chat model.

    Optionally a model also has ``async prepare()`` (awaited before a run's first call),
    ``default_max_tokens`` (the output cap it sends for a request that sets none, which a
    run then sets itself, so that ``@manage_context`` counts the answer's room the
    provider keeps),
    ``async aclose()``, ``stream(request)`` (see :mod:`littleghost.models.streaming`),
    ``supports_output_schema`` (True when it holds its answer to a request's
    ``output_schema``, the provider's native structured output) and
    ``output_schema_problem(schema)``, which names why its native structured output
    cannot take a given ``OutputSchema`` (``None`` when it can; without the method every
    schema is taken), so that ``output_strategy="auto"`` uses the final-result tool, and
    ``async count_prompt_tokens(request)``, the prompt tokens the provider counts for a
    request (``None`` when it cannot tell), by which ``@manage_context``'s overflow
    recovery checks the request it retries (through ``RunContext.count_prompt_tokens``,
    a ``count_tokens`` span). A model whose provider reports usage before the answer is
    whole tells it with ``report_usage``: a call cut then is billed that.

    A model that talks to a server over HTTP may also have ``server_address`` (the
    server's host name or IP address, ``str``) and ``server_port`` (``int``), read when
    each call starts for the chat span's ``server.address`` and ``server.port``. They
    come from the base URL only: never credentials, a path or a query string. A value of
    another type is left out of the span.
    """

    @property
    def name(self) -> str:
        """The model's name, as the provider knows it."""
        ...

    @property
    def provider(self) -> str:
        """The provider's name (``openai``, ``anthropic``, ``local``, ...)."""
        ...

    @property
    def context_window(self) -> int | None:
        """The window the provider advertises, in tokens; ``None`` when unknown."""
        ...

    async def respond(self, request: ModelRequest) -> ModelResponse:
        """Answer one request."""
        ...


MODEL_MEMBERS = ("name", "provider", "context_window", "respond")
"""What the ``Model`` protocol asks of a model."""


def model_shortfall(value: object) -> str:
    """What ``value``, an object that is not a ``Model``, lacks of one, worded for an
    error: ``""`` unless it has some of ``MODEL_MEMBERS`` (a model of the user's)."""
    missing = [member for member in MODEL_MEMBERS if not hasattr(value, member)]
    if isinstance(value, type) or len(missing) == len(MODEL_MEMBERS):
        return ""
    for member in missing:  # a property that raised AttributeError: its own error
        if _defined(value, member):
            try:
                getattr(value, member)
            except AttributeError as error:
                return f" (reading its {member} raised AttributeError: {error})"
    return (
        f" (a Model has name, provider, context_window (None when unknown) and async "
        f"respond(request); it has no {', '.join(missing)})"
    )


def _defined(value: object, member: str) -> bool:
    """``value`` defines ``member`` (a property, say), whatever reading it gives."""
    try:
        inspect.getattr_static(value, member)
    except AttributeError:
        return False
    return True


def check_model(owner: str, model: object) -> None:
    """Refuse the ``Model`` given as ``owner`` (``Summarization.model``) when
    ``model_problem`` finds a member it holds wrong, naming its class.

    Raises:
        ConfigurationError: ``name = None``, ``context_window = "8192"``, ...
    """
    problem = model_problem(model)
    if problem is not None:
        raise ConfigurationError(f"{owner}: {type(model).__name__}'s {problem}")


_UNHELD = object()
"""What ``_held`` gives for a member that is no plain value."""


def _held(model: object, member: str) -> object:
    """``model``'s ``member`` when it holds it as a plain value, not a property's (whose
    value may change: a local model learns its window as its server starts)."""
    try:
        held = inspect.getattr_static(model, member)
    except AttributeError:
        return _UNHELD
    return _UNHELD if hasattr(type(held), "__get__") else held


def model_problem(model: object) -> str | None:
    """What is wrong with the ``name``, ``provider`` or ``context_window`` a ``Model``
    holds as plain values, worded for an error (``name must be a non-empty str, not
    None``); ``None`` when nothing is. A window of 0 is unknown, as ``None``."""
    for member in ("name", "provider"):
        held = _held(model, member)
        if held is not _UNHELD and (not isinstance(held, str) or not held):
            return f"{member} must be a non-empty str, not {safe_repr(held)}"
    window = _held(model, "context_window")
    if window is _UNHELD or window is None or (is_int(window) and 0 <= window <= MAX_TOKEN_COUNT):
        return None
    return (
        f"context_window must be {TOKEN_COUNT} (tokens), or None (or 0) when unknown, "
        f"not {safe_repr(window)}"
    )


def capped(settings: Mapping[str, Any], model: object) -> Mapping[str, Any]:
    """``settings`` with ``max_tokens`` set to ``model``'s ``default_max_tokens`` when
    they set no output cap (``ANSWER_CAPS``) and the model has one."""
    default = getattr(model, "default_max_tokens", None)
    if not is_int(default) or default < 1 or any(settings.get(k) is not None for k in ANSWER_CAPS):
        return settings
    return {**settings, "max_tokens": default}


async def prepare(model: object) -> None:
    """Await ``model``'s optional ``prepare()`` (a local model starts its server there,
    and learns its window).

    Raises:
        ConfigurationError: It returned no awaitable (a plain ``def``).
    """
    prepare = getattr(model, "prepare", None)
    if prepare is not None:
        await model_awaitable(model, "prepare", prepare())


def model_awaitable(model: object, method: str, result: object) -> Awaitable[Any]:
    """``result``, what ``model.<method>(...)`` returned, which a run awaits.

    Raises:
        ConfigurationError: It is no awaitable (a plain ``def`` method).
    """
    if not inspect.isawaitable(result):
        raise ConfigurationError(
            f"model {getattr(model, 'name', None)!r}: {method}() returned "
            f"{type(result).__name__}, not an awaitable: a Model's {method} is async def "
            "(or returns an awaitable)"
        )
    return result
