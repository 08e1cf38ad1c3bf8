"""Conversations and script steps shared by the context-management tests."""

from __future__ import annotations

from collections.abc import Callable

from littleghost import Message
from littleghost.models import ModelRequest, ModelResponse, StopReason
from littleghost.testing import text_response


class PerMessage:
    """One token per counted text: the estimate is the number of messages (+ extras)."""

    def count_tokens(self, text: str) -> int:
        return 1


def chat(pairs: int, prefix: str = "m") -> list[Message]:
    """``pairs`` user/assistant exchanges: ``{prefix} question {i}``, ``{prefix} answer {i}``."""
    return [
        message
        for index in range(pairs)
        for message in (
            Message.user(f"{prefix} question {index}"),
            Message.assistant(f"{prefix} answer {index}"),
        )
    ]


def summary_step(
    text: str = "They talked.", stop_reason: StopReason = StopReason.END_TURN, **usage: int
) -> Callable[[ModelRequest], ModelResponse]:
    """A script step that checks it is a summary call and answers ``text``."""

    def answer(request: ModelRequest) -> ModelResponse:
        assert request.purpose == "context_compaction"
        return text_response(text, stop_reason=stop_reason, **usage)

    return answer
