"""The view: what the model sees of an append-only conversation log.

The log is never rewritten. Compaction appends *records* that cover earlier message ids
(DESIGN §3), and one builder turns the log into the view in linear time:

- a **summary** (metadata ``littleghost.summary`` = True, ``littleghost.summary.covers``
  = ids) hides what it covers; the newest summary that is not itself covered is shown
  before the first visible non-trusted message;
- a **collapse** (``littleghost.compaction.kind`` = ``"collapse"``,
  ``littleghost.compaction.covers`` = ids) hides what it covers and is shown where the
  first of its covered messages was (at its own position when none of them is present,
  as when a view is built from a view);
- an **exclusion** (``littleghost.compaction.kind`` = ``"exclusion"``) hides what it
  covers and is never shown.

A record covered by a later record is hidden like any message; what it covered stays
hidden. Tool results are placed right after the assistant message that made the call,
matched by call id: a result answers the nearest earlier call with its id that is still
unanswered. A tool message belongs to the call its first result answers; its other
results answer calls of that same assistant message only. A result that answers no call
is left out.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from littleghost.messages import (
    SUMMARY_COVERS_KEY,
    SUMMARY_KEY,
    Message,
    Role,
    ToolCall,
    ToolResult,
)

__all__ = [
    "COLLAPSE",
    "COMPACTION_COVERS_KEY",
    "COMPACTION_KIND_KEY",
    "EXCLUSION",
    "INTERRUPTED_TEXT",
    "ViewIndex",
    "build_view",
    "covered_ids",
    "interrupted_results",
    "is_record",
    "orphan_results",
    "record_covers",
    "unanswered_calls",
]

INTERRUPTED_TEXT = "The run was interrupted before this tool call finished; it has no result."
COMPACTION_KIND_KEY = "littleghost.compaction.kind"
"""Metadata key marking a compaction record: ``"collapse"`` or ``"exclusion"``."""
COMPACTION_COVERS_KEY = "littleghost.compaction.covers"
"""Metadata key holding the ids of the messages a collapse or exclusion stands for."""
COLLAPSE = "collapse"
EXCLUSION = "exclusion"

_ASSISTANT = Role.ASSISTANT
_TOOL = Role.TOOL
_SYSTEM = Role.SYSTEM
_DEVELOPER = Role.DEVELOPER


def _ids(value: Any) -> list[str]:
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, str)]
    return []


def is_record(message: Message) -> bool:
    """True for a compaction record: a summary, a collapse or an exclusion."""
    metadata = message.metadata
    return bool(metadata) and (
        metadata.get(SUMMARY_KEY) is True
        or metadata.get(COMPACTION_KIND_KEY) in (COLLAPSE, EXCLUSION)
    )


def record_covers(message: Message) -> list[str]:
    """The ids a compaction record stands for (``[]`` for any other message)."""
    metadata = message.metadata
    if not metadata:
        return []
    if metadata.get(SUMMARY_KEY) is True:
        return _ids(metadata.get(SUMMARY_COVERS_KEY))
    if metadata.get(COMPACTION_KIND_KEY) in (COLLAPSE, EXCLUSION):
        return _ids(metadata.get(COMPACTION_COVERS_KEY))
    return []


class ViewIndex:
    """The view of a log as *heads* (visible messages other than paired tool results, in
    order) and the results shown right after each head (``results[i]`` for ``heads[i]``).

    Built in two linear passes (one to read records and pair results, one to lay out).
    ``extend`` reuses it for a longer log that only adds plain messages, as the next
    turn of a conversation does, at the cost of what was added.
    """

    __slots__ = (
        "anchors",
        "attached",
        "head_of",
        "heads",
        "hidden",
        "late",
        "open_calls",
        "orphans",
        "pending",
        "records",
        "results",
        "shadowed",
        "shown",
        "size",
        "summaries",
    )

    def __init__(self, *, records: bool = True) -> None:
        self.records = records
        self.size = 0
        self.hidden: set[str] = set()
        self.anchors: dict[str, Message] = {}
        self.summaries: list[Message] = []
        self.attached: dict[int, list[Message]] = {}
        self.orphans: list[int] = []
        # The newest unanswered call per id; older unanswered calls with the same id wait
        # in ``shadowed`` (a stack), so a result answers the nearest earlier one.
        self.open_calls: dict[str, int] = {}
        self.shadowed: dict[str, list[int]] = {}
        self.late: list[tuple[int, Message]] = []
        self.heads: list[Message] = []
        self.results: dict[int, list[Message]] = {}
        self.head_of: dict[int, int] = {}
        self.pending: Message | None = None
        self.shown: set[str] = set()

    @classmethod
    def build(cls, log: Sequence[Message], *, records: bool = True) -> ViewIndex:
        """The view of ``log``.

        With ``records=False`` compaction records are plain messages shown where they
        are, and a result that answers no call is kept as a head of its own (used to
        group a sequence without reading it as a log).
        """
        index = cls(records=records)
        index._scan(log, 0)
        for candidate in reversed(index.summaries):
            if candidate.id not in index.hidden:
                index.pending = candidate
                break
        index._lay_out(log, 0)
        return index

    def extend(self, log: Sequence[Message]) -> ViewIndex | None:
        """The view of ``log``, which starts with the log this index was built from.

        Returns ``None`` (build it afresh) when the added messages hold a record or a
        message an earlier record hides. This index is left as it is.
        """
        start = self.size
        tail = log[start:]
        if any(is_record(message) or message.id in self.hidden for message in tail):
            return None
        index = ViewIndex(records=self.records)
        index.hidden = self.hidden
        index.anchors = self.anchors
        index.summaries = self.summaries
        index.attached = dict(self.attached)
        index.orphans = list(self.orphans)
        index.open_calls = dict(self.open_calls)
        index.shadowed = {call_id: list(stack) for call_id, stack in self.shadowed.items()}
        index.heads = list(self.heads)
        index.results = dict(self.results)
        index.head_of = dict(self.head_of)
        index.pending = self.pending
        index.shown = self.shown
        index._scan(log, start)
        for owner, message in index.late:
            head = index.head_of.get(owner)
            if head is not None:
                index.results[head] = [*index.results.get(head, ()), message]
        index._lay_out(log, start)
        return index

    def _scan(self, log: Sequence[Message], start: int) -> None:
        """Read records and pair results in ``log[start:]``."""
        records = self.records
        hidden = self.hidden
        anchors = self.anchors
        attached = self.attached
        orphans = self.orphans
        open_calls = self.open_calls
        shadowed = self.shadowed
        late = self.late
        for position in range(start, len(log)):
            message = log[position]
            metadata = message.metadata
            if records and metadata:
                if metadata.get(SUMMARY_KEY) is True:
                    self.summaries.append(message)
                    hidden.update(_ids(metadata.get(SUMMARY_COVERS_KEY)))
                    continue
                kind = metadata.get(COMPACTION_KIND_KEY)
                if kind == COLLAPSE:
                    covers = _ids(metadata.get(COMPACTION_COVERS_KEY))
                    hidden.update(covers)
                    for covered in covers:
                        anchors.setdefault(covered, message)
                    continue
                if kind == EXCLUSION:
                    hidden.update(_ids(metadata.get(COMPACTION_COVERS_KEY)))
                    continue
            role = message.role
            if role is _ASSISTANT:
                for part in message.content:
                    if type(part) is ToolCall:
                        previous = open_calls.get(part.id)
                        if previous is not None:
                            shadowed.setdefault(part.id, []).append(previous)
                        open_calls[part.id] = position
            elif role is _TOOL:
                owner: int | None = None
                for part in message.content:
                    if type(part) is not ToolResult:
                        continue
                    call_id = part.call_id
                    found = open_calls.get(call_id)
                    if found is None or (owner is not None and found != owner):
                        continue
                    owner = found
                    stack = shadowed.get(call_id) if shadowed else None
                    if stack:
                        open_calls[call_id] = stack.pop()
                        if not stack:
                            del shadowed[call_id]
                    else:
                        del open_calls[call_id]
                if owner is None:
                    orphans.append(position)
                elif owner < start:
                    late.append((owner, message))
                else:
                    answers = attached.get(owner)
                    if answers is None:
                        attached[owner] = [message]
                    else:
                        answers.append(message)
        self.size = len(log)

    def _lay_out(self, log: Sequence[Message], start: int) -> None:
        """Lay out ``log[start:]`` after the heads laid out so far."""
        records = self.records
        hidden = self.hidden
        anchors = self.anchors
        attached = self.attached
        shown = self.shown
        heads = self.heads
        results = self.results
        head_of = self.head_of
        pending = self.pending
        orphans: Collection[int] = () if records else set(self.orphans)
        for position in range(start, len(log)):
            message = log[position]
            answers: list[Message] | None = None
            if hidden and message.id in hidden:
                record = anchors.get(message.id) if anchors else None
                if record is None or record.id in shown or record.id in hidden:
                    continue
                shown.add(record.id)
                message = record
            elif records and message.metadata and is_record(message):
                if message.metadata.get(COMPACTION_KIND_KEY) != COLLAPSE or message.id in shown:
                    continue
                shown.add(message.id)
            else:
                role = message.role
                if role is _TOOL and position not in orphans:
                    continue
                if role is _ASSISTANT:
                    answers = attached.get(position)
            if pending is not None:
                role = message.role
                if role is not _SYSTEM and role is not _DEVELOPER:
                    heads.append(pending)
                    pending = None
            if message.role is _ASSISTANT and not (records and is_record(message)):
                head_of[position] = len(heads)  # after any summary placed before it
            if answers is not None:
                if hidden:
                    answers = [result for result in answers if result.id not in hidden]
                results[len(heads)] = answers
            heads.append(message)
        self.pending = pending

    def messages(self) -> list[Message]:
        """The view, flat."""
        heads = self.heads if self.pending is None else [*self.heads, self.pending]
        if not self.results:
            return list(heads)
        flat: list[Message] = []
        append = flat.append
        results = self.results
        for index, head in enumerate(heads):
            append(head)
            attached = results.get(index)
            if attached is not None:
                flat.extend(attached)
        return flat


def build_view(log: Sequence[Message]) -> tuple[Message, ...]:
    """The messages the model sees of ``log``, in order."""
    return tuple(ViewIndex.build(log).messages())


def covered_ids(log: Iterable[Message]) -> set[str]:
    """The ids that compaction records in ``log`` stand for (summaries, collapses and
    exclusions, including records covered by later ones)."""
    covered: set[str] = set()
    for message in log:
        covered.update(record_covers(message))
    return covered


def unanswered_calls(log: Sequence[Message]) -> list[tuple[int, str]]:
    """``(position, call_id)`` of every tool call in ``log`` that has no result."""
    scan = ViewIndex(records=True)
    scan._scan(log, 0)
    missing = [(position, call_id) for call_id, position in scan.open_calls.items()]
    for call_id, stack in scan.shadowed.items():
        missing.extend((position, call_id) for position in stack)

    def order(item: tuple[int, str]) -> tuple[int, int]:
        position, call_id = item
        calls = [call.id for call in log[position].tool_calls]
        return position, calls.index(call_id)

    return sorted(missing, key=order)


def orphan_results(log: Sequence[Message]) -> list[int]:
    """Positions of tool messages whose call is not in ``log``."""
    scan = ViewIndex(records=True)
    scan._scan(log, 0)
    return scan.orphans


def interrupted_results(
    log: Sequence[Message], text: str = INTERRUPTED_TEXT
) -> tuple[Message, ...]:
    """Error results to append for every call in ``log`` left without one."""
    return tuple(Message.tool(call_id, text, is_error=True) for _, call_id in unanswered_calls(log))
