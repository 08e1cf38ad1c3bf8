"""Text helpers shared by tool results, views, transcripts and error messages."""

from __future__ import annotations

import math
import reprlib

__all__ = [
    "CHARS_PER_TOKEN",
    "beyond_ascii",
    "brief",
    "cut_middle",
    "error_text",
    "truncate_middle",
    "weighed_length",
    "well_formed",
]

CHARS_PER_TOKEN = 4
"""The default estimate: four weighed characters (``weighed_length``) per token."""


def beyond_ascii(text: str) -> float:
    """What ``weighed_length`` adds to the length of ``text`` (0 for ASCII)."""
    return 1.5 * (len(text.encode("utf-8", "surrogatepass")) - len(text))


def weighed_length(text: str) -> float:
    """The length of ``text`` with each UTF-8 byte of a character past its first weighing
    1.5 characters more: ASCII counts as its length, a CJK character as 4 (one token at
    four characters per token), a Polish or Cyrillic letter as 2.5."""
    return len(text) if text.isascii() else len(text) + beyond_ascii(text)


_BRIEF = reprlib.Repr()
_BRIEF.maxstring = _BRIEF.maxlong = _BRIEF.maxother = 100


def brief(value: object) -> str:
    """``repr(value)``, abbreviated with ``...`` where it is long or deep: for messages
    that echo a value a model sent, which may be of any size."""
    return _BRIEF.repr(value)


def cut_middle(text: str, keep_chars: int, *, unit: str = "characters") -> str:
    """Keep the first and last ``keep_chars // 2`` characters with a marker between them.

    The marker says how much was cut, in ``unit`` (``characters`` or ``tokens``, the
    latter estimated at four weighed characters per token).
    """
    if len(text) <= keep_chars:
        return text
    keep_chars = max(keep_chars, 0)
    head = keep_chars - keep_chars // 2
    tail = keep_chars // 2
    amount: float = len(text) - head - tail
    if unit == "tokens":
        if not text.isascii():
            amount = weighed_length(text[head : len(text) - tail])
        amount = math.ceil(amount / CHARS_PER_TOKEN)
    marker = f"\n[… {amount} {unit} truncated …]\n"
    cut = text[:head] + marker + (text[len(text) - tail :] if tail else "")
    return cut if len(cut) < len(text) else text


def truncate_middle(text: str, max_tokens: int) -> str:
    """Cut ``text`` in the middle to about ``max_tokens`` tokens of the default estimate
    (four weighed characters each: as many characters as that weight at the text's mean)."""
    keep = max_tokens * CHARS_PER_TOKEN
    if not text.isascii():
        keep = int(keep * len(text) / weighed_length(text))
    return cut_middle(text, keep, unit="tokens")


def well_formed(text: str) -> str:
    """``text`` with each lone surrogate (a byte that was not UTF-8, as ``os.listdir``
    reads a file name) made U+FFFD, and a pair written as two surrogates joined: no
    UTF-8 can carry a lone one, so no provider request, store or exporter could, and a
    stored pair reads back joined."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def error_text(error: BaseException, *, with_type: bool = True) -> str:
    """A user's exception as the model is told it: ``Type: message`` (only the message
    without ``with_type``); the type name alone when the message is empty, or when
    ``str(error)`` fails (a ``__str__`` that raises or returns a non-str), with a note."""
    name = type(error).__name__
    try:
        message = str(error)
    except Exception:
        return f"{name} (its message could not be shown)"
    if not message:
        return name
    return f"{name}: {message}" if with_type else message
