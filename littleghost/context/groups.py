"""Atomic message groups: what compaction keeps, collapses or drops as a whole.

A group is one of:

- ``system``: one or more consecutive system or developer messages (always kept);
- ``user``: one user message;
- ``assistant_text``: one assistant message without tool calls (a collapse record is one);
- ``tool_call``: an assistant message with tool calls plus every result that answers
  them, matched by call id even when not adjacent, parallel calls included;
- ``summary``: a compaction summary.

Pairing rule (the one the view uses): a result answers the nearest earlier call with its
id that is still unanswered, so a duplicated id pairs each result with the latest open
call; a tool message belongs to the call its first result answers, and its other results
answer calls of that same assistant message only. A call and the results paired with it
are always in one group, so keeping or dropping groups never leaves an orphan. A tool
message that answers no call at all (an orphan already, which a view never holds) is a
``tool_call`` group of its own, so no message is lost.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from attrs import frozen

from littleghost.context.tokens import DEFAULT_TOKENIZER, Tokenizer, estimator, prompt_text
from littleghost.context.view import ViewIndex
from littleghost.messages import SUMMARY_KEY, Message, Role, ToolCall

__all__ = [
    "ASSISTANT_TEXT",
    "SUMMARY",
    "SYSTEM",
    "TOOL_CALL",
    "USER",
    "GroupIndex",
    "GroupKind",
    "MessageGroup",
    "group_messages",
]

GroupKind = Literal["system", "user", "assistant_text", "tool_call", "summary"]
SYSTEM: GroupKind = "system"
USER: GroupKind = "user"
ASSISTANT_TEXT: GroupKind = "assistant_text"
TOOL_CALL: GroupKind = "tool_call"
SUMMARY: GroupKind = "summary"

_SYSTEM = Role.SYSTEM
_DEVELOPER = Role.DEVELOPER
_USER = Role.USER
_ASSISTANT = Role.ASSISTANT


@frozen
class MessageGroup:
    """Messages that are kept or removed together.

    Args:
        kind: ``system``, ``user``, ``assistant_text``, ``tool_call`` or ``summary``.
        messages: The messages, the call before its results.
        tokens: Their estimated tokens.
    """

    kind: GroupKind
    messages: tuple[Message, ...]
    tokens: int

    @property
    def count(self) -> int:
        """How many messages the group holds."""
        return len(self.messages)

    @property
    def bytes(self) -> int:
        """The UTF-8 size of the group's prompt text."""
        return sum(len(prompt_text(message).encode("utf-8")) for message in self.messages)


class GroupIndex:
    """Groups as parallel lists (kind, messages, tokens), with the slot of each head of
    the ``ViewIndex`` they were made from: the compaction engine's input.

    A pending summary of that view (one with nothing after it yet) is the last group and
    has no head slot; ``pending`` says it is there.
    """

    __slots__ = (
        "kinds",
        "members",
        "message_count",
        "pending",
        "slot_of",
        "system_open",
        "tokens",
    )

    def __init__(self) -> None:
        self.kinds: list[GroupKind] = []
        self.members: list[list[Message]] = []
        self.tokens: list[int] = []
        self.slot_of: list[int] = []
        self.system_open = False
        self.message_count = 0
        self.pending = False

    @classmethod
    def build(cls, view: ViewIndex, tokenizer: Tokenizer) -> GroupIndex:
        """The groups of ``view``."""
        index = cls()
        index._add(view, 0, tokenizer)
        return index

    def extend(self, view: ViewIndex, tokenizer: Tokenizer) -> GroupIndex:
        """The groups of ``view``, an extension of the view this index was made from.

        This index is left as it is. Its pending summary group is dropped: ``view``
        either still holds the summary as pending or has placed it among the heads past
        this index's, and the grouping of those adds it back either way.
        """
        dropped = 1 if self.pending else 0
        end = len(self.kinds) - dropped
        index = GroupIndex()
        index.kinds = self.kinds[:end]
        index.members = self.members[:end]
        index.tokens = self.tokens[:end]
        index.slot_of = list(self.slot_of)
        index.system_open = self.system_open
        index.message_count = self.message_count - dropped
        for owner, _ in view.late:
            head = view.head_of.get(owner)
            if head is None or head >= len(self.slot_of):
                continue
            slot = index.slot_of[head]
            answers = view.results[head]
            index.message_count += 1
            index.members[slot] = [view.heads[head], *answers]
            index.kinds[slot] = TOOL_CALL
            index.tokens[slot] = sum(map(estimator(tokenizer), index.members[slot]))
        index._add(view, len(self.slot_of), tokenizer)
        return index

    def _add(self, view: ViewIndex, start: int, tokenizer: Tokenizer) -> None:
        """Group the heads of ``view`` from ``start`` on, then its pending summary."""
        heads = view.heads
        results = view.results
        estimate = estimator(tokenizer)
        kinds = self.kinds
        members = self.members
        tokens = self.tokens
        slot_of = self.slot_of
        system_open = self.system_open
        added = len(heads) - start
        for index in range(start, len(heads)):
            head = heads[index]
            count = estimate(head)
            role = head.role
            if role is _SYSTEM or role is _DEVELOPER:
                if system_open:
                    slot_of.append(len(kinds) - 1)
                    members[-1] = [*members[-1], head]
                    tokens[-1] += count
                    continue
                system_open = True
                kind: GroupKind = SYSTEM
                group = [head]
            else:
                system_open = False
                answers = results.get(index) if results else None
                if answers is not None:
                    for answer in answers:
                        count += estimate(answer)
                    added += len(answers)
                    kind = TOOL_CALL
                    group = [head, *answers]
                else:
                    group = [head]
                    if head.metadata and head.metadata.get(SUMMARY_KEY) is True:
                        kind = SUMMARY
                    elif role is _USER:
                        kind = USER
                    elif role is _ASSISTANT:
                        kind = ASSISTANT_TEXT
                        for part in head.content:
                            if type(part) is ToolCall:
                                kind = TOOL_CALL
                                break
                    else:  # a tool message that answers no call
                        kind = TOOL_CALL
            slot_of.append(len(kinds))
            kinds.append(kind)
            members.append(group)
            tokens.append(count)
        self.system_open = system_open
        self.message_count += added
        self.pending = view.pending is not None
        if view.pending is not None:  # a summary with nothing after it to stand before
            self.message_count += 1
            kinds.append(SUMMARY)
            members.append([view.pending])
            tokens.append(estimate(view.pending))

    def groups(self) -> tuple[MessageGroup, ...]:
        """The groups as values."""
        return tuple(
            MessageGroup(kind, tuple(messages), tokens)
            for kind, messages, tokens in zip(self.kinds, self.members, self.tokens, strict=True)
        )


def group_messages(
    messages: Sequence[Message], tokenizer: Tokenizer = DEFAULT_TOKENIZER
) -> tuple[MessageGroup, ...]:
    """Split ``messages`` into atomic groups, in order of each group's first message.

    Pure and linear in the number of messages; estimates are cached on the messages.
    Compaction records are read as plain messages here (a summary is a ``summary``
    group, a collapse an ``assistant_text`` group); to group what a model would see of
    a log, group ``build_view(log)``.
    """
    return GroupIndex.build(ViewIndex.build(messages, records=False), tokenizer).groups()
