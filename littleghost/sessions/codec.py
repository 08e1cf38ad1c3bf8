"""Messages to JSON and back, exactly: every field, and metadata with its types.

A message becomes a JSON object ``{"id", "role", "content", "metadata"}``; its parts are
objects tagged by ``"type"`` (``text``, ``image`` with base64 ``data``, ``tool_call``,
``tool_result``, ``reasoning``). Metadata values (and tool-call arguments) must be
JSON-like: ``str``, ``int``, ``float`` (finite), ``bool``, ``None``, ``list``, ``tuple``
and ``dict`` with ``str`` keys, of exactly these types; they come back with the same
types. A tuple is written as ``{"$tuple": [...]}``; a dict with a key starting with ``$``
is wrapped as ``{"$dict": {...}}``, so no user dict is ever read back as a tag. Values
nest at most ``MAX_DEPTH`` levels deep.

Errors never quote stored content: an encoding error names the field that holds the
value (``message 'm1': metadata['key']``) and what is wrong with it; a decoding error
names the field or shape that is wrong.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from littleghost._validators import MAX_DEPTH, digits_limit
from littleghost.errors import CorruptSessionStoreError, UnstorableValueError, naming_session
from littleghost.messages import (
    SUMMARY_KEY,
    ImagePart,
    Message,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCall,
    ToolResult,
)

__all__ = [
    "MAX_DEPTH",
    "SUMMARY_FLAG",
    "SUMMARY_PATHS",
    "check_storable",
    "decode_message",
    "encode_message",
    "message_from_json",
    "message_to_json",
    "messages_to_json",
]

_TUPLE = "$tuple"
_DICT = "$dict"
_ALLOWED = "str, int, float, bool, None, list, tuple or dict with str keys"
_LONG_INT_BITS = 2000  # ~600 digits: under the smallest int-to-str limit Python allows (640)

SUMMARY_FLAG = f"{json.dumps(SUMMARY_KEY)}:true"
"""Text in the JSON of every stored summary (other messages may hold it too)."""
SUMMARY_PATHS = (("metadata", SUMMARY_KEY), ("metadata", _DICT, SUMMARY_KEY))
"""Where the JSON of a stored summary holds ``true``: in its metadata, or in the metadata
wrapped as ``$dict`` (then the only key)."""


def _encode_value(value: Any, where: str, seen: set[int], depth: int = 0) -> Any:
    kind = type(value)
    if value is None or kind in (str, bool):
        return value
    if kind is int:
        if value.bit_length() > _LONG_INT_BITS:
            try:
                str(value)
            except ValueError:
                raise UnstorableValueError(
                    f"{where} is an int with too many digits to store"
                ) from None
        return value
    if kind is float:
        if not math.isfinite(value):
            raise UnstorableValueError(
                f"{where} is a float that is not finite: JSON has no NaN or infinity"
            )
        return value
    if kind not in (list, tuple, dict):
        raise UnstorableValueError(
            f"{where} is a {kind.__name__}; stored values must be {_ALLOWED}"
        )
    if id(value) in seen:
        raise UnstorableValueError(f"{where} contains itself")
    if depth >= MAX_DEPTH:
        raise UnstorableValueError(
            f"{where} nests lists, tuples and dicts more than {MAX_DEPTH} levels deep"
        )
    seen.add(id(value))
    try:
        if kind is dict:
            encoded: dict[str, Any] = {}
            for key, item in value.items():
                if type(key) is not str:
                    raise UnstorableValueError(
                        f"{where} has a {type(key).__name__} key; dict keys must be str"
                    )
                encoded[key] = _encode_value(item, f"{where}[{key!r}]", seen, depth + 1)
            if any(key.startswith("$") for key in encoded):
                return {_DICT: encoded}
            return encoded
        items = [
            _encode_value(item, f"{where}[{index}]", seen, depth + 1)
            for index, item in enumerate(value)
        ]
        return {_TUPLE: items} if kind is tuple else items
    finally:
        seen.discard(id(value))


class _Corrupt(Exception):
    """A stored message has a wrong field or shape; the text says which, never its value."""


_NEWER = "written by a newer littleghost (upgrade littleghost to read it), or damaged"
"""Why a stored message holds a name this littleghost does not know (a part type, a role,
a ``$`` tag): no message says which littleghost wrote it."""


def _decode_value(value: Any, where: str, depth: int | None = 0) -> Any:
    """``value`` as ``_encode_value`` had it; nested at most ``MAX_DEPTH`` levels deep,
    unless ``depth`` is ``None`` (any depth Python reads without a ``RecursionError``)."""
    if not isinstance(value, (list, dict)):
        return value
    if depth is not None and depth >= MAX_DEPTH:
        raise _Corrupt(
            f"{where} is nested more than {MAX_DEPTH} levels deep (littleghost before "
            "2026-12-01 stored such values; this one reads no deeper)"
        )
    inner = None if depth is None else depth + 1
    if isinstance(value, list):
        return [_decode_value(item, where, inner) for item in value]
    if len(value) == 1 and _TUPLE in value and isinstance(value[_TUPLE], list):
        return tuple(_decode_value(item, where, inner) for item in value[_TUPLE])
    if len(value) == 1 and _DICT in value and isinstance(value[_DICT], dict):
        return {key: _decode_value(item, where, inner) for key, item in value[_DICT].items()}
    if any(key.startswith("$") for key in value):
        raise _Corrupt(
            f"{where} holds an object with a $ tag this littleghost does not know: {_NEWER}"
        )
    return {key: _decode_value(item, where, inner) for key, item in value.items()}


def _encode_part(part: Part, where: str) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    if isinstance(part, ImagePart):
        data = None if part.data is None else base64.b64encode(part.data).decode("ascii")
        return {"type": "image", "data": data, "url": part.url, "media_type": part.media_type}
    if isinstance(part, ToolCall):
        arguments = part.arguments
        if not isinstance(arguments, str):
            arguments = _encode_value(dict(arguments), f"{where}.arguments", set())
        return {"type": "tool_call", "id": part.id, "name": part.name, "arguments": arguments}
    if isinstance(part, ReasoningPart):
        return {
            "type": "reasoning",
            "text": part.text,
            "signature": part.signature,
            "provider": part.provider,
            "redacted": part.redacted,
        }
    return {
        "type": "tool_result",
        "call_id": part.call_id,
        "content": part.content,
        "is_error": part.is_error,
    }


def encode_message(message: Message) -> dict[str, Any]:
    """``message`` as a JSON-ready dict.

    Raises:
        UnstorableValueError: Its metadata or tool arguments hold a value that is not
            JSON-like (the error names where).
    """
    where = f"message {message.id!r}:"
    return {
        "id": message.id,
        "role": message.role.value,
        "content": [
            _encode_part(part, f"{where} content[{index}]")
            for index, part in enumerate(message.content)
        ],
        "metadata": _encode_value(dict(message.metadata), f"{where} metadata", set()),
    }


def check_storable(messages: Iterable[Message], *, session_id: str | None = None) -> None:
    """Check that a store could keep ``messages`` (for ``session_id``, which an error
    names), writing nothing.

    Raises:
        TypeError: ``messages`` is not a sequence of ``Message``.
        UnstorableValueError: A message holds a value that is not JSON-like (the error
            names where).
    """
    for _ in _encoded(messages, session_id):
        pass


_PART_FIELDS = {
    "text": ("text",),
    "image": ("data", "url", "media_type"),
    "tool_call": ("id", "name", "arguments"),
    "tool_result": ("call_id", "content", "is_error"),
    "reasoning": ("text", "signature", "provider", "redacted"),
}


def _decode_part(data: Any, where: str) -> Part:
    if not isinstance(data, Mapping):
        raise _Corrupt(f"{where} is not an object")
    kind = data.get("type")
    if not isinstance(kind, str):
        raise _Corrupt(f"{where} has no part type")
    fields = _PART_FIELDS.get(kind)
    if fields is None:
        raise _Corrupt(f"{where} has a part type this littleghost does not know: {_NEWER}")
    for name in fields:
        if name not in data:
            raise _Corrupt(f"{where} ({kind}) has no {name!r} field")
    try:
        if kind == "text":
            return TextPart(data["text"])
        if kind == "image":
            raw = data["data"]
            if raw is None:
                payload = None
            else:
                try:
                    payload = base64.b64decode(raw.encode("ascii"), validate=True)
                except (AttributeError, ValueError, binascii.Error):
                    raise _Corrupt(f"{where} (image) has 'data' that is not base64") from None
            return ImagePart(payload, data["url"], data["media_type"])
        if kind == "tool_call":
            arguments = data["arguments"]
            if not isinstance(arguments, str):  # deeper than MAX_DEPTH: ToolCall's text
                try:
                    arguments = _decode_value(arguments, f"{where} (tool_call) 'arguments'", None)
                except RecursionError:  # deeper than the decoder goes: JSON, as stored
                    pass
            return ToolCall(data["id"], data["name"], arguments)
        if kind == "reasoning":
            return ReasoningPart(
                data["text"], data["signature"], data["provider"], data["redacted"]
            )
        return ToolResult(data["call_id"], data["content"], data["is_error"])
    except (TypeError, ValueError):
        # the part's own checks: their text may quote the value, so it is not passed on
        raise _Corrupt(f"{where} ({kind}) has a field of the wrong type") from None


def decode_message(data: Mapping[str, Any]) -> Message:
    """The message ``encode_message`` made ``data`` from.

    Raises:
        CorruptSessionStoreError: ``data`` is not a stored message (the error names the
            field or shape that is wrong, never stored content).
    """
    try:
        return _decode_message(data)
    except _Corrupt as problem:
        raise CorruptSessionStoreError(f"a stored message cannot be read: {problem}") from None
    except RecursionError:
        raise CorruptSessionStoreError(
            "a stored message cannot be read: it is nested too deep"
        ) from None


def _decode_message(data: Any) -> Message:
    if not isinstance(data, Mapping):
        raise _Corrupt("it is not an object")
    for name in ("id", "role", "content", "metadata"):
        if name not in data:
            raise _Corrupt(f"it has no {name!r} field")
    if not isinstance(data["id"], str):
        raise _Corrupt("its 'id' is not a string")
    if not isinstance(data["role"], str):
        raise _Corrupt("its 'role' is not a string")
    try:
        role = Role(data["role"])
    except ValueError:
        raise _Corrupt(f"its 'role' is one this littleghost does not know: {_NEWER}") from None
    metadata = _decode_value(data["metadata"], "its 'metadata'")
    if not isinstance(metadata, dict):
        raise _Corrupt("its 'metadata' is not an object")
    content = data["content"]
    if not isinstance(content, list):
        raise _Corrupt("its 'content' is not a list")
    parts = tuple(_decode_part(part, f"content[{index}]") for index, part in enumerate(content))
    try:
        return Message(role, parts, data["id"], metadata)
    except (TypeError, ValueError):
        raise _Corrupt("it has a field of the wrong type") from None


def message_to_json(message: Message) -> str:
    """``message`` as compact, ASCII-only JSON text (see ``encode_message``)."""
    return _dumps(encode_message(message))


def _dumps(encoded: dict[str, Any]) -> str:
    return json.dumps(encoded, ensure_ascii=True, allow_nan=False, separators=(",", ":"))


def _encoded(
    messages: Iterable[Message], session_id: str | None = None
) -> Iterator[dict[str, Any]]:
    """Each of ``messages`` encoded, checking each is a ``Message`` (an error names
    ``session_id``, the session they are for)."""
    if isinstance(messages, (str, bytes, Message)) or not isinstance(messages, Iterable):
        raise TypeError(f"messages must be a sequence of Message, not {type(messages).__name__}")
    for position, message in enumerate(messages):
        if not isinstance(message, Message):
            raise TypeError(f"messages[{position}] must be a Message, not {type(message).__name__}")
        with naming_session(session_id):
            encoded = encode_message(message)
        yield encoded


def messages_to_json(messages: Iterable[Message], *, session_id: str | None = None) -> list[str]:
    """Each of ``messages`` (for ``session_id``, which an error names) as JSON text; all
    are checked before any is returned.

    Raises:
        TypeError: An item is not a ``Message``.
        UnstorableValueError: A message holds a value that is not JSON-like.
    """
    return [_dumps(encoded) for encoded in list(_encoded(messages, session_id))]


def message_from_json(text: str) -> Message:
    """The message ``message_to_json`` wrote as ``text``.

    Raises:
        CorruptSessionStoreError: ``text`` is not a stored message.
    """
    try:
        data = json.loads(text)
    except RecursionError:
        raise CorruptSessionStoreError(
            "a stored message cannot be read: it is nested too deep"
        ) from None
    except json.JSONDecodeError as error:  # where it broke, nothing of the text
        raise CorruptSessionStoreError(
            f"a stored message is not valid JSON (at character {error.pos})"
        ) from None
    except ValueError:  # valid JSON: an int past this process's digit limit
        raise CorruptSessionStoreError(
            f"a stored message holds an int of more than {digits_limit()} digits, more than "
            "this process reads: a process allowed more wrote it, and the same limit here "
            "(sys.set_int_max_str_digits, or PYTHONINTMAXSTRDIGITS) reads it"
        ) from None
    except TypeError:
        raise CorruptSessionStoreError("a stored message is not valid JSON") from None
    if not isinstance(data, dict):
        raise CorruptSessionStoreError("a stored message is not a JSON object")
    return decode_message(data)
