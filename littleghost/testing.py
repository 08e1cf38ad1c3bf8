"""Deterministic models for tests: a script of responses, errors and callables."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any

from littleghost.errors import ProtocolError
from littleghost.messages import Message, ToolCall, new_id
from littleghost.models.base import ModelRequest, ModelResponse, StopReason, Usage

__all__ = ["ScriptedModel", "Step", "text_response", "tool_call_response"]

Step = (
    ModelResponse
    | BaseException
    | Callable[[ModelRequest], ModelResponse | Awaitable[ModelResponse]]
)
"""A response to return, an exception to raise, or a callable that answers the request."""


class ScriptedModel:
    """A model that plays a script, one step per call, and records every request.

    Args:
        steps: Responses, exceptions (raised) or callables ``(request) -> response``
            (sync or async), used in order.
        context_window: The window it advertises (``None``: unknown).
        name: Its model name.
    """

    provider = "scripted"

    def __init__(
        self,
        steps: Iterable[Step],
        *,
        context_window: int | None = None,
        name: str = "scripted",
    ) -> None:
        if isinstance(steps, (str, bytes, Mapping)) or not isinstance(steps, Iterable):
            raise TypeError(f"ScriptedModel: steps must be a sequence of steps, not {steps!r}")
        self._steps = list(steps)
        for index, step in enumerate(self._steps):
            if not isinstance(step, (ModelResponse, BaseException)) and not callable(step):
                raise TypeError(
                    f"ScriptedModel: step {index} must be a ModelResponse, an exception or a "
                    f"callable, not {type(step).__name__}"
                )
        if context_window is not None and (
            isinstance(context_window, bool) or not isinstance(context_window, int)
        ):
            raise TypeError(
                f"ScriptedModel: context_window must be an int or None, not {context_window!r}"
            )
        if not isinstance(name, str):
            raise TypeError(f"ScriptedModel: name must be a str, not {name!r}")
        self._context_window = context_window
        self._name = name
        self.requests: list[ModelRequest] = []

    @property
    def name(self) -> str:
        """The model name."""
        return self._name

    @property
    def context_window(self) -> int | None:
        """The advertised window."""
        return self._context_window

    @property
    def remaining(self) -> int:
        """How many steps are left."""
        return len(self._steps)

    async def respond(self, request: ModelRequest) -> ModelResponse:
        """Play the next step for ``request``."""
        self.requests.append(request)
        if not self._steps:
            raise ProtocolError(
                f"ScriptedModel {self._name!r} ran out of steps after {len(self.requests) - 1} calls"
            )
        step = self._steps.pop(0)
        if isinstance(step, BaseException):
            raise step
        if isinstance(step, ModelResponse):
            return step
        answer = step(request)
        if inspect.isawaitable(answer):
            answer = await answer
        if not isinstance(answer, ModelResponse):
            raise ProtocolError(
                f"ScriptedModel step returned {type(answer).__name__}, not a ModelResponse"
            )
        return answer


def text_response(
    text: str,
    *,
    input_tokens: int = 0,
    output_tokens: int = 0,
    stop_reason: StopReason = StopReason.END_TURN,
) -> ModelResponse:
    """A response that answers with ``text``."""
    return ModelResponse(Message.assistant(text), stop_reason, Usage(input_tokens, output_tokens))


def tool_call_response(
    name: str,
    arguments: Mapping[str, Any] | str,
    *,
    call_id: str | None = None,
    input_tokens: int = 0,
    output_tokens: int = 0,
) -> ModelResponse:
    """A response that calls the tool ``name`` with ``arguments``."""
    call = ToolCall(call_id or f"call_{new_id()[:12]}", name, arguments)
    return ModelResponse(
        Message.assistant(tool_calls=(call,)),
        StopReason.TOOL_USE,
        Usage(input_tokens, output_tokens),
    )
