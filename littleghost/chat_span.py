"""A model call in its ``chat`` span, recorded in the GenAI client metrics: one place for
the telemetry of every call, a run's and a compaction's outside runs alike."""

from __future__ import annotations

import time
import types
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from opentelemetry.trace import SpanKind

from littleghost import telemetry
from littleghost.errors import ProtocolError
from littleghost.messages import Message
from littleghost.models.base import Model, ModelRequest, ModelResponse, bill, reports

__all__ = ["traced_call"]

_WRAPPED = {
    Message: " (wrap the message: ModelResponse(message, stop_reason, usage))",
    str: " (wrap the text: ModelResponse(Message.assistant(text), stop_reason, usage))",
    types.CoroutineType: " (await it: ModelResponse is what the coroutine gives)",
}
"""What a model of your own returning an answer's message or text is told to return, and
one returning a coroutine it did not await, to await."""


def _no_gaps() -> Sequence[float]:
    return ()


async def traced_call(
    model: Model,
    request: ModelRequest,
    respond: Callable[[], Awaitable[ModelResponse]],
    *,
    attributes: Mapping[str, Any],
    capture_content: bool,
    streamed: bool = False,
    first_chunk: Callable[[], float | None] = telemetry.no_time,
    chunk_gaps: Callable[[], Sequence[float]] = _no_gaps,
    deadline: Callable[[], float | None] = telemetry.no_time,
) -> ModelResponse:
    """``respond()``, ``model``'s answer to ``request``, in a ``chat`` span with the GenAI
    attributes (``attributes`` added; ERROR when it fails, or the run's ``deadline()``
    cuts it: ``open_span``), its content when ``capture_content``, and in the metrics:
    its duration (a cut or failed one's with ``error.type``, by ``deadline()``:
    ``record_call``), its tokens, and the ``first_chunk()`` time and ``chunk_gaps()`` of
    a ``streamed`` one. A call that
    ends without its answer (failed, cancelled or cut off) has the tokens it was billed
    (``bill``: its error's usage, else what the model reported before, ``report_usage``)
    on its span and in the token metric, and kept on the error for ``billed``.

    Raises:
        ProtocolError: ``respond()`` returned no ``ModelResponse``.
    """
    spanned: dict[str, Any] = {
        telemetry.OPERATION_NAME: "chat",
        telemetry.PROVIDER_NAME: model.provider,
        telemetry.REQUEST_MODEL: model.name,
        telemetry.PURPOSE: request.purpose,
        **telemetry.setting_attributes(request.settings),
        **telemetry.server_attributes(model),
    }
    if streamed:
        spanned[telemetry.REQUEST_STREAM] = True
    if request.output_schema is not None:
        spanned[telemetry.OUTPUT_TYPE] = "json"
    spanned.update(attributes)
    with (
        telemetry.open_span(
            f"chat {model.name}", kind=SpanKind.CLIENT, attributes=spanned, deadline=deadline
        ) as span,
        reports() as reported,
    ):
        if capture_content and span.is_recording():
            span.set_attributes(telemetry.input_attributes(model.provider, request))
        started = time.perf_counter()

        def ended(**outcome: Any) -> None:
            """Record the call's ``outcome`` in the metrics with the chunks that came
            before it ended (a call cut after its first one too), and its time to first
            chunk on its span."""
            chunk_at = first_chunk()
            telemetry.record_call(
                spanned, started, first_chunk=chunk_at, chunk_gaps=chunk_gaps(), **outcome
            )
            if chunk_at is not None:
                span.set_attribute(telemetry.RESPONSE_FIRST_CHUNK, chunk_at - started)

        try:
            response = await respond()
            if not isinstance(response, ModelResponse):
                if isinstance(response, types.CoroutineType):
                    response.close()  # never to be awaited: no "never awaited" warning
                raise ProtocolError(
                    f"model {model.name!r} returned {type(response).__name__}, not a "
                    f"ModelResponse{_WRAPPED.get(type(response), '')}"
                )
        except BaseException as error:  # failed, cancelled or cut off: no answer
            span.set_attribute(telemetry.RESPONSE_FINISH_REASONS, telemetry.UNANSWERED)
            used = bill(error, reported)
            span.set_attributes(telemetry.usage_attributes(used))
            ended(error=error, deadline=deadline(), usage=used)
            raise
        ended(response=response)
        span.set_attributes(telemetry.response_attributes(response))
        if capture_content and span.is_recording():
            finish = telemetry.finish_reason(response.stop_reason)
            span.set_attribute(
                telemetry.OUTPUT_MESSAGES, telemetry.messages_json([response.message], finish)
            )
        return response
