"""Messages to JSON and back, exactly: every field, and metadata with its types.

A message becomes a JSON object ``{"id", "role", "content", "metadata"}``; its parts are
objects tagged by ``"type"`` (``text``, ``image`` with base64 ``data``, ``tool_call``,
``tool_result``). Metadata values (and tool-call arguments) must be JSON-like: ``str``,
``int``, ``float`` (finite), ``bool``, ``None``, ``list``, ``tuple`` and ``dict`` with
``str`` keys, of exactly these types; they come back with the same types. A tuple is
written as ``{"$tuple": [...]}``; a dict with a key starting with ``$`` is wrapped as
``{"$dict": {...}}``, so no user dict is ever read back as a tag.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from littleghost.errors import CorruptSessionStoreError, UnstorableValueError
from littleghost.messages import ImagePart, Message, Part, TextPart, ToolCall, ToolResult

__all__ = [
    "decode_message",
    "encode_message",
    "message_from_json",
    "message_to_json",
    "messages_to_json",
]

_TUPLE = "$tuple"
_DICT = "$dict"
_ALLOWED = "str, int, float, bool, None, list, tuple or dict with str keys"


def _encode_value(value: Any, where: str, seen: set[int]) -> Any:
    kind = type(value)
    if value is None or kind in (str, bool, int):
        return value
    if kind is float:
        if not math.isfinite(value):
            raise UnstorableValueError(f"{where} is {value!r}: JSON has no NaN or infinity")
        return value
    if kind not in (list, tuple, dict):
        raise UnstorableValueError(
            f"{where} is a {kind.__name__}; stored values must be {_ALLOWED}"
        )
    if id(value) in seen:
        raise UnstorableValueError(f"{where} contains itself")
    seen.add(id(value))
    try:
        if kind is dict:
            encoded: dict[str, Any] = {}
            for key, item in value.items():
                if type(key) is not str:
                    raise UnstorableValueError(
                        f"{where} has a {type(key).__name__} key; dict keys must be str"
                    )
                encoded[key] = _encode_value(item, f"{where}[{key!r}]", seen)
            if any(key.startswith("$") for key in encoded):
                return {_DICT: encoded}
            return encoded
        items = [_encode_value(item, f"{where}[{index}]", seen) for index, item in enumerate(value)]
        return {_TUPLE: items} if kind is tuple else items
    finally:
        seen.discard(id(value))


def _decode_value(value: Any) -> Any:
    if isinstance(value, list):
        return [_decode_value(item) for item in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1 and _TUPLE in value and isinstance(value[_TUPLE], list):
        return tuple(_decode_value(item) for item in value[_TUPLE])
    if len(value) == 1 and _DICT in value and isinstance(value[_DICT], dict):
        return {key: _decode_value(item) for key, item in value[_DICT].items()}
    if any(key.startswith("$") for key in value):
        raise CorruptSessionStoreError(f"stored value has an unknown tag: {sorted(value)[0]!r}")
    return {key: _decode_value(item) for key, item in value.items()}


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
    where = f"message {message.id!r}"
    return {
        "id": message.id,
        "role": message.role.value,
        "content": [
            _encode_part(part, f"{where} content[{index}]")
            for index, part in enumerate(message.content)
        ],
        "metadata": _encode_value(dict(message.metadata), f"{where} metadata", set()),
    }


def _decode_part(data: Any) -> Part:
    kind = data["type"]
    if kind == "text":
        return TextPart(data["text"])
    if kind == "image":
        raw = data["data"]
        payload = None if raw is None else base64.b64decode(raw.encode("ascii"), validate=True)
        return ImagePart(payload, data["url"], data["media_type"])
    if kind == "tool_call":
        arguments = data["arguments"]
        if not isinstance(arguments, str):
            arguments = _decode_value(arguments)
        return ToolCall(data["id"], data["name"], arguments)
    if kind == "tool_result":
        return ToolResult(data["call_id"], data["content"], data["is_error"])
    raise ValueError(f"unknown part type {kind!r}")


def decode_message(data: Mapping[str, Any]) -> Message:
    """The message ``encode_message`` made ``data`` from.

    Raises:
        CorruptSessionStoreError: ``data`` is not a stored message.
    """
    try:
        metadata = _decode_value(data["metadata"])
        if not isinstance(metadata, dict):
            raise TypeError("metadata is not an object")
        content = data["content"]
        if not isinstance(content, list):
            raise TypeError("content is not a list")
        return Message(
            data["role"], tuple(_decode_part(part) for part in content), data["id"], metadata
        )
    except CorruptSessionStoreError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError, binascii.Error) as error:
        raise CorruptSessionStoreError(
            f"a stored message cannot be read ({type(error).__name__}: {error})"
        ) from None


def message_to_json(message: Message) -> str:
    """``message`` as compact, ASCII-only JSON text (see ``encode_message``)."""
    return json.dumps(
        encode_message(message), ensure_ascii=True, allow_nan=False, separators=(",", ":")
    )


def messages_to_json(messages: Iterable[Message]) -> list[str]:
    """Each of ``messages`` as JSON text; all are checked before any is returned.

    Raises:
        TypeError: An item is not a ``Message``.
        UnstorableValueError: A message holds a value that is not JSON-like.
    """
    if isinstance(messages, (str, bytes, Message)) or not isinstance(messages, Iterable):
        raise TypeError(f"messages must be a sequence of Message, not {type(messages).__name__}")
    encoded = []
    for position, message in enumerate(messages):
        if not isinstance(message, Message):
            raise TypeError(f"messages[{position}] must be a Message, not {type(message).__name__}")
        encoded.append(message_to_json(message))
    return encoded


def message_from_json(text: str) -> Message:
    """The message ``message_to_json`` wrote as ``text``.

    Raises:
        CorruptSessionStoreError: ``text`` is not a stored message.
    """
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as error:
        raise CorruptSessionStoreError(f"a stored message is not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise CorruptSessionStoreError("a stored message is not a JSON object")
    return decode_message(data)
