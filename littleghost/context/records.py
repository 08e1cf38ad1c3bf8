"""Compaction records: appended messages that stand for earlier ones in what the model sees.

The log is never rewritten; a compaction appends a record that covers earlier ids:

- a **summary** (metadata ``littleghost.summary`` = True, ``littleghost.summary.covers`` =
  ids) hides what it covers and is shown before the first visible non-trusted message;
- a **collapse** (``littleghost.compaction.kind`` = ``"collapse"``,
  ``littleghost.compaction.covers`` = ids) hides what it covers and is shown where the
  first of them was;
- an **exclusion** (``littleghost.compaction.kind`` = ``"exclusion"``) hides what it
  covers and is never shown.
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
"""Metadata key marking a compaction record: ``"collapse"`` or ``"exclusion"``."""
COMPACTION_COVERS_KEY = "littleghost.compaction.covers"
"""Metadata key holding the ids of the messages a collapse or exclusion stands for."""
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
    """The ids a compaction record stands for (``[]`` for any other message); items of its
    ``covers`` that are not str are left out."""
    if not is_record(message):
        return []
    key = SUMMARY_COVERS_KEY if message.is_summary else COMPACTION_COVERS_KEY
    covers = message.metadata.get(key)
    if not isinstance(covers, (list, tuple)):
        return []
    return [item for item in covers if isinstance(item, str)]
