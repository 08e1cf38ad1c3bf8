"""Streaming from a model: the optional ``stream(request)`` method of the ``Model`` protocol.

A model that streams has ``stream(request)`` returning an async iterator (usually an
async generator) that yields ``TextChunk`` values as text arrives (``ReasoningChunk``
values as reasoning does, a ``ToolCallChunk`` as each tool call starts) and ends with
exactly one ``StreamDone`` holding the whole ``ModelResponse`` (usage included); the
first chunk's time is the call's time to first chunk in telemetry. Usage the provider
reports before the end is told with ``report_usage`` (:mod:`littleghost.models.base`), so
that a stream stopped before its ``StreamDone`` is billed it. The caller closes the
iterator when it has one (``aclose``, as an async generator has), at its end or when it
stops early; the model then cancels the provider's generation. Errors are raised as from
``respond``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol, runtime_checkable

from attrs import field, frozen

from littleghost._validators import instance_of
from littleghost.models.base import ModelRequest, ModelResponse

__all__ = [
    "ModelStreamEvent",
    "ReasoningChunk",
    "StreamDone",
    "StreamingModel",
    "TextChunk",
    "ToolCallChunk",
]


@frozen
class TextChunk:
    """A piece of the answer's text, as it arrived (a str, else a ``TypeError``)."""

    text: str = field(validator=instance_of("TextChunk.text", str, "a str"))


@frozen
class ReasoningChunk:
    """A piece of the model's reasoning (``text``, a str), as it arrived."""

    text: str = field(validator=instance_of("ReasoningChunk.text", str, "a str"))


@frozen
class ToolCallChunk:
    """A tool call started to arrive; the whole call is in ``StreamDone``'s response."""


@frozen
class StreamDone:
    """The end of a stream: the complete response (a ``ModelResponse``)."""

    response: ModelResponse = field(
        validator=instance_of("StreamDone.response", ModelResponse, "a ModelResponse")
    )


ModelStreamEvent = TextChunk | ReasoningChunk | ToolCallChunk | StreamDone


@runtime_checkable
class StreamingModel(Protocol):
    """A model that can stream its answer."""

    def stream(self, request: ModelRequest) -> AsyncIterator[ModelStreamEvent]:
        """Yield ``TextChunk`` values, then one ``StreamDone``."""
        ...
