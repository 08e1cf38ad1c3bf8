"""Messages and their parts: the values a conversation log is made of."""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any

from attrs import field, frozen

__all__ = [
    "SUMMARY_COVERS_KEY",
    "SUMMARY_KEY",
    "ImagePart",
    "Message",
    "Part",
    "Role",
    "TextPart",
    "ToolCall",
    "ToolResult",
    "new_id",
]

SUMMARY_KEY = "littleghost.summary"
"""Metadata key marking a message as a compaction summary."""
SUMMARY_COVERS_KEY = "littleghost.summary.covers"
"""Metadata key holding the ids of the messages a summary stands for."""


class Role(str, enum.Enum):
    """Who a message is from."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"

    def __str__(self) -> str:
        return self.value

    @property
    def is_trusted(self) -> bool:
        """True for instructions (system and developer): kept as they are by compaction."""
        return self in (Role.SYSTEM, Role.DEVELOPER)


def new_id() -> str:
    """Return a new unique message id."""
    return uuid.uuid4().hex


def _str(name: str) -> Any:
    def check(instance: object, attribute: object, value: object) -> None:
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, not {type(value).__name__}")

    return check


def _bool(name: str) -> Any:
    def check(instance: object, attribute: object, value: object) -> None:
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False, not {value!r}")

    return check


def _optional(kind: type, name: str) -> Any:
    def check(instance: object, attribute: object, value: object) -> None:
        if value is not None and not isinstance(value, kind):
            raise TypeError(f"{name} must be {kind.__name__} or None, not {type(value).__name__}")

    return check


@frozen
class TextPart:
    """Plain text."""

    text: str = field(validator=_str("TextPart.text"))


@frozen
class ImagePart:
    """An image, as bytes or as a URL."""

    data: bytes | None = field(default=None, validator=_optional(bytes, "ImagePart.data"))
    url: str | None = field(default=None, validator=_optional(str, "ImagePart.url"))
    media_type: str | None = field(default=None, validator=_optional(str, "ImagePart.media_type"))

    def __attrs_post_init__(self) -> None:
        if (self.data is None) == (self.url is None):
            raise TypeError("ImagePart needs exactly one of data= or url=")


def _arguments(value: object) -> Mapping[str, Any] | str:
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"ToolCall.arguments must be a mapping or a str, not {type(value).__name__}")


@frozen
class ToolCall:
    """A request from the model to run a tool.

    ``arguments`` is a mapping, or the raw string when the provider sent arguments that
    are not valid JSON (the run loop answers such a call with an error result).
    """

    id: str = field(validator=_str("ToolCall.id"))
    name: str = field(validator=_str("ToolCall.name"))
    arguments: Mapping[str, Any] | str = field(factory=dict, converter=_arguments)


@frozen
class ToolResult:
    """What a tool returned, as text, for the call with ``call_id``."""

    call_id: str = field(validator=_str("ToolResult.call_id"))
    content: str = field(validator=_str("ToolResult.content"))
    is_error: bool = field(default=False, validator=_bool("ToolResult.is_error"))


Part = TextPart | ImagePart | ToolCall | ToolResult
_PART_TYPES = (TextPart, ImagePart, ToolCall, ToolResult)


def _role(value: object) -> Role:
    try:
        return Role(value)
    except ValueError:
        roles = ", ".join(role.value for role in Role)
        raise TypeError(f"Message.role must be one of {roles}, not {value!r}") from None


def _content(value: object) -> tuple[Part, ...]:
    if isinstance(value, str):
        return (TextPart(value),)
    if isinstance(value, _PART_TYPES):
        return (value,)
    if not isinstance(value, Iterable):
        raise TypeError(f"Message.content must be parts or a str, not {type(value).__name__}")
    parts = tuple(value)
    for part in parts:
        if not isinstance(part, _PART_TYPES):
            raise TypeError(
                "Message.content holds TextPart, ImagePart, ToolCall or ToolResult values, "
                f"not {type(part).__name__}"
            )
    return parts


def _metadata(value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"Message.metadata must be a mapping, not {type(value).__name__}")
    return dict(value)


@frozen
class Message:
    """One message of a conversation. Frozen: change it with ``attrs.evolve``.

    Args:
        role: Who it is from.
        content: Its parts, in order (a str becomes one ``TextPart``).
        id: A unique id, generated when not given.
        metadata: Free-form values; keys under ``littleghost.`` are reserved.
    """

    role: Role = field(converter=_role)
    content: tuple[Part, ...] = field(default=(), converter=_content)
    id: str = field(factory=new_id, validator=_str("Message.id"))
    metadata: Mapping[str, Any] = field(factory=dict, converter=_metadata)
    _cache: dict[object, Any] = field(init=False, factory=dict, eq=False, repr=False, hash=False)

    @classmethod
    def system(cls, text: str, **kwargs: Any) -> Message:
        """A system instruction."""
        return cls(Role.SYSTEM, (TextPart(text),), **kwargs)

    @classmethod
    def developer(cls, text: str, **kwargs: Any) -> Message:
        """A developer instruction."""
        return cls(Role.DEVELOPER, (TextPart(text),), **kwargs)

    @classmethod
    def user(cls, text: str, **kwargs: Any) -> Message:
        """A user message."""
        return cls(Role.USER, (TextPart(text),), **kwargs)

    @classmethod
    def assistant(
        cls, text: str = "", tool_calls: Iterable[ToolCall] = (), **kwargs: Any
    ) -> Message:
        """An assistant message: text, tool calls, or both."""
        parts: list[Part] = [TextPart(text)] if text else []
        parts.extend(tool_calls)
        return cls(Role.ASSISTANT, parts, **kwargs)

    @classmethod
    def tool(cls, call_id: str, text: str, is_error: bool = False, **kwargs: Any) -> Message:
        """The result of the tool call ``call_id``."""
        return cls(Role.TOOL, (ToolResult(call_id, text, is_error),), **kwargs)

    @cached_property
    def text(self) -> str:
        """The text parts, joined."""
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    @cached_property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The tool calls this message makes."""
        return tuple(part for part in self.content if isinstance(part, ToolCall))

    @cached_property
    def tool_results(self) -> tuple[ToolResult, ...]:
        """The tool results this message carries."""
        return tuple(part for part in self.content if isinstance(part, ToolResult))

    @property
    def is_summary(self) -> bool:
        """True for a compaction summary."""
        return self.metadata.get(SUMMARY_KEY) is True

    @property
    def is_trusted(self) -> bool:
        """True for system and developer messages."""
        return self.role.is_trusted
