"""Conversations and script steps shared by the context-management tests, and ``shape``,
which compares logs of separate runs (their ids aside)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from littleghost import Agent, Message, RunResult, manage_context
from littleghost.models import ModelRequest, ModelResponse, StopReason
from littleghost.testing import ScriptedModel, text_response


class PerMessage:
    """One token per counted text: the estimate is the number of messages (+ extras)."""

    def count_tokens(self, text: str) -> int:
        return 1


compacting = manage_context(
    context_window_tokens=100,
    compression_threshold=0.5,
    preserve_recent_messages=4,
    tokenizer=PerMessage(),
)
"""A ``@manage_context`` under which ``chat(30)`` is compacted at the first model call:
a 100-token window, half of it the threshold, one token per message."""


def badly_paired(messages: Sequence[Message]) -> bool:
    """Whether a result in ``messages`` answers no open call before it, or a call has no
    result after it (what providers refuse)."""
    open_ids: list[str] = []
    for message in messages:
        open_ids += [call.id for call in message.tool_calls]
        for result in message.tool_results:
            if result.call_id not in open_ids:
                return True
            open_ids.remove(result.call_id)
    return bool(open_ids)


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


async def compacted_twice(
    cls: type[Agent], first: str, second: str
) -> tuple[ScriptedModel, RunResult]:
    """Run ``cls`` on a long chat, then again with more of it, each run compacting first
    (summaries ``first`` then ``second``); the model and the second result."""
    model = ScriptedModel(
        [summary_step(first), text_response("one"), summary_step(second), text_response("two")]
    )
    agent = cls(model=model)
    one = await agent.run("go", history=chat(30))
    two = await agent.run("again", history=[*one.messages, *chat(20, "more")])
    return model, two


def shape(log: Sequence[Message], within: Sequence[Message] | None = None) -> list[Any]:
    """The log with message ids replaced by positions (ids are random; records cover ids):
    in ``within`` (a request's messages in their conversation's log, say), else in ``log``."""
    where = {message.id: position for position, message in enumerate(within or log)}

    def positions(value: Any) -> Any:
        if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
            return [where.get(v, v) for v in value]
        return value

    return [
        (
            message.role.value,
            message.text,
            [(call.name, dict(call.arguments)) for call in message.tool_calls],
            [(str(result.content), result.is_error) for result in message.tool_results],
            json.dumps(
                {key: positions(value) for key, value in message.metadata.items()},
                sort_keys=True,
                default=str,
            ),
        )
        for message in log
    ]
