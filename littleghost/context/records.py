"""Compaction records: appended messages that stand for the earlier ids they cover.

A summary is shown before the first visible non-trusted message; a collapse where the
first it covers was; an exclusion is never shown. The log is never rewritten.
"""

from __future__ import annotations

from littleghost.messages import SUMMARY_COVERS_KEY, SUMMARY_KEY, Message

__all__ = [
    "COLLAPSE",
    "COMPACTION_COVERS_KEY",
    "COMPACTION_KIND_KEY",
    "EXCLUSION",
    "is_record",
    "record_covers",
]

COMPACTION_KIND_KEY = "littleghost.compaction.kind"
COMPACTION_COVERS_KEY = "littleghost.compaction.covers"
COLLAPSE = "collapse"
EXCLUSION = "exclusion"


def is_record(message: Message) -> bool:
    """True for a compaction record: a summary, a collapse or an exclusion."""
    metadata = message.metadata
    return bool(metadata) and (
        metadata.get(SUMMARY_KEY) is True
        or metadata.get(COMPACTION_KIND_KEY) in (COLLAPSE, EXCLUSION)
    )


def record_covers(message: Message) -> list[str]:
    """The ids (str) a compaction record stands for; ``[]`` for any other message."""
    if not is_record(message):
        return []
    key = SUMMARY_COVERS_KEY if message.is_summary else COMPACTION_COVERS_KEY
    covers = message.metadata.get(key)
    if not isinstance(covers, (list, tuple)):
        return []
    return [item for item in covers if isinstance(item, str)]
