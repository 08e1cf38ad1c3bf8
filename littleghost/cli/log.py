"""``sessions show``: a session's whole log, message by message, with tool calls paired
with their results (the engine's pairing) and compaction records with what they cover."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from littleghost.cli.output import SHORT_ID, Output, clock, excerpt, moment, quoted, shell_word
from littleghost.context.groups import result_calls
from littleghost.context.records import COMPACTION_KIND_KEY, is_record, record_covers
from littleghost.context.summarize import call_arguments, summary_text
from littleghost.messages import ImagePart, Message, ReasoningPart, TextPart, ToolResult
from littleghost.sessions import StoredMessage
from littleghost.sessions.base import distinct_ids

__all__ = [
    "EXCERPT_CHARS",
    "arguments_json",
    "describe_record",
    "log_document",
    "positions",
    "print_log",
    "reasoning_label",
    "tool_name",
]

EXCERPT_CHARS = 160
"""The longest excerpt of a message, tool arguments or a tool result."""


def log_document(
    session_id: str, log: Sequence[StoredMessage], *, quote: bool = False
) -> dict[str, Any]:
    """The log as ``{"session", "messages"}``: per message its ``position``, ``id``,
    ``role``, ``stored_at``, ``excerpt``, ``tool_calls`` (each with its ``result``),
    ``results`` (the calls a tool message answers), ``record`` (a compaction record's
    ``kind`` and what it ``covers``) and ``covered_by`` (the record hiding it). A
    repeated id is read as runs read it (``distinct_ids``). With ``quote``, as a table
    shows it: each text in the excerpts in double quotes (``quoted``)."""
    text = (lambda content: quoted(excerpt(content, EXCERPT_CHARS))) if quote else str
    messages = distinct_ids(
        [entry.message for entry in log], f"session {shell_word(session_id, in_prose=True)}"
    )
    where = {message.id: position for position, message in enumerate(messages)}
    covered_by: dict[str, int] = {}
    pairs = result_calls(messages)
    entries: list[dict[str, Any]] = []
    for position, (stored, message) in enumerate(zip(log, messages, strict=True)):
        calls = [
            {
                "id": call.id,
                "name": call.name,
                "arguments": excerpt(arguments_json(call.arguments), EXCERPT_CHARS),
                "result": None,
            }
            for call in message.tool_calls
        ]
        results = []
        for index, result in enumerate(message.tool_results):
            paired = pairs.get((position, index))
            answered = None if paired is None else entries[paired[0]]["tool_calls"][paired[1]]
            if answered is not None:
                answered["result"] = {
                    "position": position,
                    "is_error": result.is_error,
                    "excerpt": excerpt(text(result.content), EXCERPT_CHARS),
                }
            results.append(
                {
                    "call_id": result.call_id,
                    "call_position": None if paired is None else paired[0],
                    "name": None if answered is None else answered["name"],
                    "is_error": result.is_error,
                }
            )
        covers = record_covers(message)
        for covered in covers:
            covered_by[covered] = position
        entries.append(
            {
                "position": position,
                "id": message.id,
                "role": message.role.value,
                "stored_at": moment(stored.stored_at),
                "excerpt": excerpt(_text(message, text), EXCERPT_CHARS),
                "tool_calls": calls,
                "results": results,
                "record": describe_record(message, where),
            }
        )
    for entry in entries:
        entry["covered_by"] = covered_by.get(entry["id"])
    return {"session": session_id, "messages": entries}


def describe_record(message: Message, where: Mapping[str, int]) -> dict[str, Any] | None:
    """A compaction record's ``kind`` (``summary``, ``collapse``, ``exclusion``), the ids
    it ``covers`` and their ``covers_positions`` (by ``where``: id to position); ``None``
    for any other message."""
    if not is_record(message):
        return None
    covers = record_covers(message)
    kind = "summary" if message.is_summary else str(message.metadata[COMPACTION_KIND_KEY])
    return {
        "kind": kind,
        "covers": covers,
        "covers_positions": sorted(where[i] for i in covers if i in where),
    }


def _text(message: Message, text: Callable[[str], str]) -> str:
    """The message's parts, each stored text as ``text`` gives it."""
    if message.is_summary:
        return text(summary_text(message))
    parts = []
    for part in message.content:
        if isinstance(part, TextPart):
            parts.append(text(part.text))
        elif isinstance(part, ImagePart):
            parts.append("[image]")
        elif isinstance(part, ToolResult):
            parts.append(text(part.content))
        elif isinstance(part, ReasoningPart):
            parts.append(reasoning_label(text(part.text), redacted=part.redacted))
    return " ".join(parts)


def reasoning_label(text: str, *, redacted: bool) -> str:
    """A reasoning part as ``show`` and ``view`` print it."""
    return "[redacted reasoning]" if redacted else f"reasoning: {text}"


_NAME = re.compile(r"[\w.-]+")


def tool_name(name: str) -> str:
    """A tool's name as a table shows it: quoted (``quoted``) unless it is only letters,
    digits, ``_``, ``.`` and ``-`` (a model may call a tool by any text)."""
    return name if _NAME.fullmatch(name) else quoted(name)


def arguments_json(arguments: Mapping[str, Any] | str) -> str:
    """Tool-call arguments as JSON text: an object, or for the text a model wrote that is
    not JSON, a string (so that it cannot pass for more of the table's row)."""
    if isinstance(arguments, str):
        return json.dumps(arguments, ensure_ascii=False)
    return call_arguments(arguments)


def positions(numbers: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` as ``#0–#2, #5``."""
    spans: list[list[int]] = []
    for number in sorted(numbers):
        if spans and number == spans[-1][1] + 1:
            spans[-1][1] = number
        else:
            spans.append([number, number])
    return ", ".join(f"#{a}" if a == b else f"#{a}–#{b}" for a, b in spans)


def print_log(output: Output, document: dict[str, Any]) -> None:
    """The log as a table (or plain lines): one row per message, one more per tool call."""
    rows: list[list[str]] = []
    styles: list[dict[str, Any]] = []
    for entry in document["messages"]:
        labels = []
        style: dict[str, Any] = {}
        if entry["covered_by"] is not None:
            labels.append(f"[in #{entry['covered_by']}]")
            style = {"dim": True}
        for result in entry["results"]:
            if result["call_position"] is None:
                call = "an unknown call"
            else:
                call = f"{tool_name(result['name'])} called in #{result['call_position']}"
            labels.append(f"[result of {call}{' (error)' if result['is_error'] else ''}]")
            if result["is_error"] and not style:
                style = {"fg": "red"}
        record = entry["record"]
        if record is not None:
            covered = positions(record["covers_positions"]) or "messages not in this log"
            labels.append(f"[{record['kind']} of {len(record['covers'])} messages: {covered}]")
            style = style or {"fg": "cyan"}
        content = " ".join([*labels, entry["excerpt"]]).strip()
        rows.append(
            [
                f"#{entry['position']}",
                clock(entry["stored_at"]),
                entry["role"],
                entry["id"],
                content,
            ]
        )
        styles.append(style)
        for call in entry["tool_calls"]:
            result = call["result"]
            if result is None:
                answer = "no result"
            else:
                error = " (error)" if result["is_error"] else ""
                answer = f"#{result['position']}{error}: {result['excerpt']}"
            rows.append(
                [
                    "",
                    "",
                    "",
                    "",
                    f"  call {tool_name(call['name'])}({call['arguments']}) -> {answer}",
                ]
            )
            styles.append({"dim": True} if entry["covered_by"] is not None else {"fg": "yellow"})
    output.table(["#", "STORED (UTC)", "ROLE", "ID", "CONTENT"], rows, styles, {3: SHORT_ID})
