"""Messages and their parts: the values a conversation log is made of."""

from __future__ import annotations

import enum
import types
import uuid
from collections.abc import Iterable, Mapping
from functools import cached_property
from typing import Any, cast

from attrs import field, frozen

from littleghost._validators import instance_of
from littleghost.text import joined_pairs, json_object, well_formed, well_formed_value

__all__ = [
    "CARRIED_PARTS",
    "SUMMARY_COVERS_KEY",
    "SUMMARY_KEY",
    "ImagePart",
    "Message",
    "Part",
    "ReasoningPart",
    "Role",
    "TextPart",
    "ToolCall",
    "ToolResult",
    "empty_image",
    "new_id",
    "stray_part",
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
        return self in _TRUSTED_ROLES


_TRUSTED_ROLES = (Role.SYSTEM, Role.DEVELOPER)
"""The instruction roles, once: ``Role.SYSTEM`` is a lookup on the enum class each time."""


def new_id() -> str:
    """Return a new unique message id."""
    return uuid.uuid4().hex


def _well_formed(value: object) -> object:
    """Text as ``well_formed`` makes it (the validator then refuses what is not a str)."""
    return well_formed(value) if isinstance(value, str) else value


def _joined(value: object) -> object:
    """Text as ``joined_pairs`` makes it (the validator then refuses what is not a str)."""
    return joined_pairs(value) if isinstance(value, str) else value


@frozen
class TextPart:
    """Plain text, well formed (``littleghost.text.well_formed``)."""

    text: str = field(converter=_well_formed, validator=instance_of("TextPart.text", str, "a str"))


@frozen
class ImagePart:
    """An image, as bytes or as a URL (exactly one of the two, else ``TypeError``).

    Args:
        data: The image's bytes.
        url: Where the image is (an ``https:`` URL the provider fetches, or a ``data:``
            URL).
        media_type: ``"image/png"``, ``"image/jpeg"``, ...; ``None``: read from the
            bytes' signature (PNG when it tells nothing).

    Its ``url`` and ``media_type`` are well formed, as a ``TextPart``'s text.
    """

    data: bytes | None = field(
        default=None, validator=instance_of("ImagePart.data", (bytes, type(None)), "bytes or None")
    )
    url: str | None = field(
        default=None,
        converter=_well_formed,
        validator=instance_of("ImagePart.url", (str, type(None)), "a str or None"),
    )
    media_type: str | None = field(
        default=None,
        converter=_well_formed,
        validator=instance_of("ImagePart.media_type", (str, type(None)), "a str or None"),
    )

    def __attrs_post_init__(self) -> None:
        if (self.data is None) == (self.url is None):
            raise TypeError("ImagePart needs exactly one of data= or url=")


def empty_image(part: object) -> bool:
    """Whether ``part`` is an image without bytes (``data=b""``, or a ``data:`` URL with
    nothing after its comma), which providers refuse. Such a part is made and stored as
    any other: refused only where it would be sent."""
    if not isinstance(part, ImagePart):
        return False
    if part.data is not None:
        return not part.data
    url = part.url or ""
    comma = url.find(",")  # not partition: a request's check would copy every image
    return url[:5].lower() == "data:" and comma in (-1, len(url) - 1)


_EMPTY: Mapping[str, Any] = types.MappingProxyType({})


def _read_only(value: Mapping[str, Any]) -> Mapping[str, Any]:
    """A read-only view of a private copy of ``value`` (nested values are shared)."""
    return types.MappingProxyType(dict(value)) if value else _EMPTY


def _shown_mapping(value: Mapping[str, Any] | str) -> str:
    """A stored mapping shown as the dict it was given as."""
    return repr(_plain(value))


def _plain(arguments: Mapping[str, Any] | str) -> dict[str, Any] | str:
    return arguments if isinstance(arguments, str) else dict(arguments)


def _arguments(value: object) -> Mapping[str, Any] | str:
    if isinstance(value, str):
        return well_formed(value)
    if isinstance(value, Mapping):
        arguments = json_object(value)
        return arguments if isinstance(arguments, str) else _read_only(arguments)
    raise TypeError(f"ToolCall.arguments must be a mapping or a str, not {type(value).__name__}")


@frozen(unsafe_hash=False)
class ToolCall:
    """A request from the model to run a tool, its text well formed (as ``TextPart``'s:
    its id, name and every str in its arguments).

    ``arguments`` is a read-only mapping (a copy of the one given; values nested in it are
    not copied, unless a str in them is made well formed or a mapping a dict), or a
    string: the raw text when the provider sent arguments that are not valid JSON, and
    the text (``json_text``) of a mapping given holding a number JSON text cannot carry
    (``NaN``, an infinity, an int too long to write) or nested more than ``MAX_DEPTH``
    levels deep. The run loop answers a call whose arguments are a string it cannot read
    with an error result; providers are sent ``{}`` for them. This is decided here, for
    every call however made (``text.json_object``). Calls compare by value but are not
    hashable: ``hash()`` raises ``TypeError``.

    Raises:
        TypeError: ``arguments`` is neither a mapping nor a str, or holds what JSON has
            no form for (a key that is not a str, a datetime, a set, bytes, an ``Enum``
            member that is not a str or int, itself): the message names where. A
            subclass of a JSON type is kept as that type (a str enum member as its value).
    """

    id: str = field(converter=_well_formed, validator=instance_of("ToolCall.id", str, "a str"))
    name: str = field(converter=_well_formed, validator=instance_of("ToolCall.name", str, "a str"))
    arguments: Mapping[str, Any] | str = field(
        factory=dict, converter=_arguments, repr=_shown_mapping
    )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and copy through the constructor (a read-only mapping cannot be pickled)."""
        return type(self), (self.id, self.name, _plain(self.arguments))


@frozen
class ToolResult:
    """What a tool returned, as text (well formed, as ``TextPart``'s, its ``call_id``
    too), for the call with ``call_id``.

    Args:
        call_id: The id of the ``ToolCall`` it answers.
        content: The result's text, as the model sees it.
        is_error: True for an error result (the tool raised, timed out, was unknown,
            got arguments that did not fit, or was not run).
    """

    call_id: str = field(
        converter=_well_formed, validator=instance_of("ToolResult.call_id", str, "a str")
    )
    content: str = field(
        converter=_well_formed, validator=instance_of("ToolResult.content", str, "a str")
    )
    is_error: bool = field(
        default=False, validator=instance_of("ToolResult.is_error", bool, "True or False")
    )


@frozen
class ReasoningPart:
    """The model's reasoning, kept in the log in its place among the parts of the answer
    it came with.

    Args:
        text: The reasoning as the provider showed it (``""`` for a redacted block), well
            formed (as ``TextPart``'s).
        signature: The provider's opaque signature, sent back verbatim (for a redacted
            block, its encrypted data); ``None`` when the provider signs nothing, ``""``
            when a signed block lost its signature (an interrupted stream), which is
            never sent back.
        provider: The provider that wrote it (``"anthropic"``, ``"openai"``, ...): only
            that provider is sent it back (``"google"``: a Gemini thought signature of the
            tool call after it, which ``OpenAIModel`` sends to any server but OpenAI's).
        redacted: True for a block whose text the provider withheld.
    """

    text: str = field(
        converter=_well_formed, validator=instance_of("ReasoningPart.text", str, "a str")
    )
    signature: str | None = field(
        default=None,
        converter=_well_formed,
        validator=instance_of("ReasoningPart.signature", (str, type(None)), "a str or None"),
    )
    provider: str | None = field(
        default=None,
        converter=_well_formed,
        validator=instance_of("ReasoningPart.provider", (str, type(None)), "a str or None"),
    )
    redacted: bool = field(
        default=False, validator=instance_of("ReasoningPart.redacted", bool, "True or False")
    )

    def sendable_to(self, provider: str) -> bool:
        """True when ``provider`` may be sent this block: it wrote it, and a signed block
        still has its signature."""
        return self.provider == provider and self.signature != ""


Part = TextPart | ImagePart | ToolCall | ToolResult | ReasoningPart
_PART_TYPES = (TextPart, ImagePart, ToolCall, ToolResult, ReasoningPart)
CARRIED_PARTS: dict[Role, tuple[type, ...]] = {
    Role.SYSTEM: (TextPart,),
    Role.DEVELOPER: (TextPart,),
    Role.USER: (TextPart, ImagePart),
    Role.ASSISTANT: (TextPart, ReasoningPart, ToolCall),
    Role.TOOL: (ToolResult,),
}
"""The parts a message of each role may hold: what providers take in such a message."""


def stray_part(message: Message) -> str | None:
    """Why ``message`` cannot be sent, if a part of it is one its role does not carry (a
    tool call in a user message, text in a tool message): providers would drop or refuse
    it."""
    carried = CARRIED_PARTS[message.role]
    for part in message.content:
        if not isinstance(part, carried):
            kinds = ", ".join(kind.__name__ for kind in carried)
            return (
                f"a message of role {message.role.value!r} carries only {kinds} parts, "
                f"not {type(part).__name__}"
            )
    return None


def _role(value: object) -> Role:
    try:
        return Role(value)
    except ValueError:
        roles = ", ".join(role.value for role in Role)
        shown = type(value).__name__  # not the value: text given in its place is content
        if isinstance(value, str) and value.strip().lower() in {role.value for role in Role}:
            shown = f"{value!r} (a role is written in lower case, without spaces)"
        raise TypeError(f"Message.role must be one of {roles}, not {shown}") from None


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
                "Message.content holds TextPart, ImagePart, ToolCall, ToolResult or "
                "ReasoningPart values, "
                f"not {type(part).__name__}"
            )
    return parts


def _metadata(value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"Message.metadata must be a mapping, not {type(value).__name__}")
    return _read_only(cast("Mapping[str, Any]", well_formed_value(value, joined_pairs)))


@frozen(unsafe_hash=False)
class Message:
    """One message of a conversation. Frozen: change it with ``attrs.evolve``.

    Messages compare by value but are not hashable (``hash()`` raises ``TypeError``): key
    them by ``id``. In its id and every str of its metadata (keys too), a pair written as
    two surrogates is joined (a lone one is kept), so that a message read back from a
    store, or from JSON, equals the one written.

    Args:
        role: Who it is from.
        content: Its parts, in order (a str becomes one ``TextPart``).
        id: A unique id, generated when not given.
        metadata: Free-form values; keys under ``littleghost.`` are reserved. Stored as a
            read-only copy; values nested in it are not copied (but for a list, tuple or
            mapping holding a pair written as two surrogates, copied with it joined).
    """

    role: Role = field(converter=_role)
    content: tuple[Part, ...] = field(default=(), converter=_content)
    id: str = field(
        factory=new_id, converter=_joined, validator=instance_of("Message.id", str, "a str")
    )
    metadata: Mapping[str, Any] = field(factory=dict, converter=_metadata, repr=_shown_mapping)

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickle and copy through the constructor (a read-only mapping cannot be pickled)."""
        return type(self), (self.role, self.content, self.id, dict(self.metadata))

    @classmethod
    def system(cls, text: str, **kwargs: Any) -> Message:
        """A system instruction."""
        return cls(Role.SYSTEM, (TextPart(text),), **kwargs)

    @classmethod
    def developer(cls, text: str, **kwargs: Any) -> Message:
        """A developer instruction."""
        return cls(Role.DEVELOPER, (TextPart(text),), **kwargs)

    @classmethod
    def user(cls, text: str, *images: ImagePart, **kwargs: Any) -> Message:
        """A user message: its text, then the images given, in order."""
        for image in images:
            if not isinstance(image, ImagePart):
                raise TypeError(
                    f"Message.user takes ImagePart values after its text, not {type(image).__name__}"
                )
        return cls(Role.USER, (TextPart(text), *images), **kwargs)

    @classmethod
    def assistant(
        cls, text: str = "", tool_calls: Iterable[ToolCall] = (), **kwargs: Any
    ) -> Message:
        """An assistant message: text, tool calls, or both (a ``text`` that is not a str
        is a ``TypeError``, as ``user``'s is: never an answer left empty)."""
        parts: list[Part] = [TextPart(text)] if text or not isinstance(text, str) else []
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
    def reasoning(self) -> tuple[ReasoningPart, ...]:
        """The reasoning parts of this message."""
        return tuple(part for part in self.content if isinstance(part, ReasoningPart))

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
