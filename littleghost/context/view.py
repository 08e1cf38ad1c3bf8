"""The view: what the model sees of an append-only conversation log.

The log is never rewritten. Compaction appends records (a summary, see DESIGN §3) that
cover earlier message ids; the view leaves covered messages out and shows the newest
summary before the first visible non-trusted message. Tool results are placed right
after the assistant message that made the call, matched by call id: a result answers
the nearest earlier call with its id that is still unanswered. A result that answers no
call is left out. Built in one pass, linear in the log.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from littleghost.messages import SUMMARY_COVERS_KEY, Message, Role

__all__ = ["build_view", "covered_ids", "orphan_results", "unanswered_calls"]

INTERRUPTED_TEXT = "The run was interrupted before this tool call finished; it has no result."


def covered_ids(log: Iterable[Message]) -> set[str]:
    """The ids that summaries in ``log`` stand for (summaries folded into later ones too)."""
    covered: set[str] = set()
    for message in log:
        if message.is_summary:
            covers = message.metadata.get(SUMMARY_COVERS_KEY, ())
            covered.update(item for item in covers if isinstance(item, str))
    return covered


def _pair_results(log: Sequence[Message]) -> tuple[dict[int, list[Message]], set[int]]:
    """Results grouped under the position of their call's message, and orphan positions."""
    attached: dict[int, list[Message]] = {}
    open_calls: dict[str, int] = {}
    orphans: set[int] = set()
    for position, message in enumerate(log):
        if message.role is Role.ASSISTANT:
            for call in message.tool_calls:
                open_calls[call.id] = position
        elif message.role is Role.TOOL:
            results = message.tool_results
            owner = open_calls.pop(results[0].call_id, None) if results else None
            if owner is None:
                orphans.add(position)
                continue
            for extra in results[1:]:
                open_calls.pop(extra.call_id, None)
            attached.setdefault(owner, []).append(message)
    return attached, orphans


def unanswered_calls(log: Sequence[Message]) -> list[tuple[int, str]]:
    """``(position, call_id)`` of every tool call in ``log`` that has no result."""
    answered: dict[int, set[str]] = {}
    attached, _ = _pair_results(log)
    for owner, results in attached.items():
        answered[owner] = {result.call_id for message in results for result in message.tool_results}
    missing: list[tuple[int, str]] = []
    for position, message in enumerate(log):
        if message.role is Role.ASSISTANT:
            done = answered.get(position, set())
            missing.extend(
                (position, call.id) for call in message.tool_calls if call.id not in done
            )
    return missing


def orphan_results(log: Sequence[Message]) -> list[int]:
    """Positions of tool messages whose call is not in ``log``."""
    return sorted(_pair_results(log)[1])


def interrupted_results(
    log: Sequence[Message], text: str = INTERRUPTED_TEXT
) -> tuple[Message, ...]:
    """Error results to append for every call in ``log`` left without one."""
    return tuple(Message.tool(call_id, text, is_error=True) for _, call_id in unanswered_calls(log))


def build_view(log: Sequence[Message]) -> tuple[Message, ...]:
    """The messages the model sees of ``log``, in order."""
    covered = covered_ids(log)
    attached, _ = _pair_results(log)
    summary: Message | None = None
    for message in reversed(log):
        if message.is_summary and message.id not in covered:
            summary = message
            break
    view: list[Message] = []
    for position, message in enumerate(log):
        if message.id in covered or message.role is Role.TOOL or message.is_summary:
            continue
        if summary is not None and not message.is_trusted:
            view.append(summary)
            summary = None
        view.append(message)
        if message.role is Role.ASSISTANT and message.tool_calls:
            view.extend(attached.get(position, ()))
    if summary is not None:
        view.append(summary)
    return tuple(view)
