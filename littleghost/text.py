"""Text helpers shared by tool results, views, transcripts and error messages."""

from __future__ import annotations

import json
import math
import re
import reprlib
import unicodedata
import uuid
from collections.abc import Callable, Mapping
from typing import Any

from littleghost._validators import MAX_DEPTH, nests_deeper, safe_repr, too_long_to_write

__all__ = [
    "CHARS_PER_TOKEN",
    "RUN_TOGETHER",
    "beyond_ascii",
    "brief",
    "cut_middle",
    "error_text",
    "joined_pairs",
    "json_object",
    "json_text",
    "json_type",
    "json_type_name",
    "truncate_middle",
    "weighed_length",
    "well_formed",
    "well_formed_value",
]

CHARS_PER_TOKEN = 4
"""The default estimate: four weighed characters (``weighed_length``) per token."""

RUN_TOGETHER = (
    "\u0e00-\u0eff"  # Thai, Lao
    "\u1000-\u109f"  # Myanmar
    "\u1780-\u17ff"  # Khmer
    "\u3040-\u30ff"  # Hiragana, Katakana
    "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"  # CJK ideographs
    "\uac00-\ud7af"  # Hangul syllables (particles join the word before them)
    "\uff66-\uff9f"  # halfwidth Katakana
)
"""The letters of scripts that write words (or particles) without a space between them,
as the ranges of a regular-expression character class."""


def beyond_ascii(text: str) -> float:
    """What ``weighed_length`` adds to the length of ``text`` (0 for ASCII)."""
    return 1.5 * (len(text.encode("utf-8", "surrogatepass")) - len(text))


def weighed_length(text: str) -> float:
    """The length of ``text`` with each UTF-8 byte of a character past its first weighing
    1.5 characters more: ASCII counts as its length, a CJK character as 4 (one token at
    four characters per token), a Polish or Cyrillic letter as 2.5."""
    return len(text) if text.isascii() else len(text) + beyond_ascii(text)


class _Brief(reprlib.Repr):
    def repr_int(self, x: int, level: int) -> str:
        return safe_repr(x) if too_long_to_write(x) else super().repr_int(x, level)


_BRIEF = _Brief()
_BRIEF.maxstring = _BRIEF.maxlong = _BRIEF.maxother = 100


def brief(value: object) -> str:
    """``repr(value)``, abbreviated with ``...`` where it is long or deep: for messages
    that echo a value a model sent, which may be of any size (an int Python will not
    write as ``safe_repr`` names it)."""
    return _BRIEF.repr(value)


def json_text(
    value: object, *, ensure_ascii: bool = False, separators: tuple[str, str] | None = None
) -> str:
    """``json.dumps(value, default=str)``, with each int Python will not write in decimal
    (``too_long_to_write``) written whole in hexadecimal (``0x…``): like ``NaN``, which
    ``json.dumps`` writes too, no JSON reader takes it, and nothing of it is lost.

    Raises:
        ValueError: ``value`` contains itself, or a ``str()`` that ``default`` calls fails.
        RecursionError: ``value`` is nested deeper than the encoder goes.
    """
    options: dict[str, Any] = {
        "ensure_ascii": ensure_ascii,
        "separators": separators,
        "default": str,
    }
    try:
        return json.dumps(value, **options)
    except ValueError:  # an int too long to write (as a value or a key), or a cycle
        if nests_deeper(value):
            raise
    tag = f"\x00{uuid.uuid4().hex}:"
    longs: list[int] = []

    def tagged(item: object) -> object:
        if isinstance(item, int) and not isinstance(item, bool) and too_long_to_write(item):
            longs.append(item)
            return f"{tag}{len(longs) - 1}"
        if isinstance(item, Mapping):
            return {tagged(key): tagged(entry) for key, entry in item.items()}
        if isinstance(item, (list, tuple)):
            return [tagged(entry) for entry in item]
        return item

    text = json.dumps(tagged(value), **options)
    written = re.escape(json.dumps(tag, ensure_ascii=ensure_ascii)[:-1]) + r'(\d+)"'
    return re.sub(written, lambda found: hex(longs[int(found[1])]), text)


def cut_middle(text: str, keep_chars: int, *, unit: str = "characters") -> str:
    """Keep the first and last ``keep_chars // 2`` characters with a marker between them.

    The marker says how much was cut, in ``unit`` (``characters`` or ``tokens``, the
    latter estimated at four weighed characters per token).
    """
    if len(text) <= keep_chars:
        return text
    keep_chars = max(keep_chars, 0)
    return _cut(text, keep_chars - keep_chars // 2, keep_chars // 2, unit)


def cut_line(text: str, keep_chars: int) -> str:
    """``text`` as one line, its whitespace runs (line breaks of every kind) one space, cut
    in the middle to ``keep_chars`` with the marker inline."""
    return " ".join(cut_middle(" ".join(text.split()), keep_chars).split())


_EXTENDING = re.compile(
    "[\u200c\u200d\ufe00-\ufe0f\U0001f3fb-\U0001f3ff\U000e0020-\U000e007f"
    "\u1160-\u11ff\ud7b0-\ud7ff]"
)
"""What extends the character before it though Unicode calls it no mark: joiners,
variation selectors, skin tones, the tag characters of a subdivision's flag, the vowel
and final jamo of a decomposed Korean syllable (NFD: 한 is ᄒ, ᅡ, ᆫ)."""
_FLAG_HALVES = "".join(map(chr, range(0x1F1E6, 0x1F200)))
"""The regional indicators, two of which make a flag (🇯 and 🇵: 🇯🇵)."""
_FLAG_HALF = re.compile(f"[{_FLAG_HALVES}]")
_LONGEST_CHARACTER = 32
"""The most code points a cut moves to keep what reads as one character whole: a longer
run (a letter under a thousand accents) reads as no character, and is cut where it falls
(in at most this many steps, whatever the run's length)."""


def _splits(text: str, at: int) -> bool:
    """Whether a cut before ``text[at]`` splits what reads as one character: a letter
    from its accents or vowel signs, an Indic consonant from the virama before it, an
    emoji from its joiner, skin tone or variation, a flag from its second half, a
    decomposed Korean syllable from its vowel or final jamo."""
    if at <= 0 or at >= len(text):
        return False
    char, before = text[at], text[at - 1]
    if unicodedata.category(char).startswith("M") or _EXTENDING.match(char):
        return True
    if before == "\u200d":
        return True
    if unicodedata.combining(before) == 9:  # a virama: the letter after it is joined
        return unicodedata.category(char).startswith("L")
    if not (_FLAG_HALF.match(char) and _FLAG_HALF.match(before)):
        return False
    head = text[:at]
    return (len(head) - len(head.rstrip(_FLAG_HALVES))) % 2 == 1  # the run's halves before


def _boundary(text: str, at: int, step: int) -> int:
    """The nearest place from ``at`` on, by ``step`` (-1, 1), where a cut splits nothing
    (``_splits``) within ``_LONGEST_CHARACTER`` code points, else ``at``."""
    for place in range(at, at + step * _LONGEST_CHARACTER, step):
        if not _splits(text, place):
            return place
    return at


def _cut(text: str, head: int, tail: int, unit: str) -> str:
    """``text`` with its first ``head`` and last ``tail`` characters (fewer where the cut
    would split what reads as one character: ``_boundary``) around a marker."""
    head = _boundary(text, head, -1)
    tail = len(text) - _boundary(text, len(text) - tail, 1)
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
    (four weighed characters each): at each end, as many characters as weigh half of it
    (a Chinese head and an English tail keep as many tokens each, not characters)."""
    keep = max_tokens * CHARS_PER_TOKEN
    if text.isascii():
        return cut_middle(text, keep, unit="tokens")
    if weighed_length(text) <= keep:
        return text
    head, tail = _weighing(text, keep - keep // 2), _weighing(text, keep // 2, from_end=True)
    return _cut(text, head, tail, "tokens")


def _weighing(text: str, weight: int, *, from_end: bool = False) -> int:
    """How many characters at the start (the end) of ``text`` weigh at most ``weight``."""
    low, high = 0, min(len(text), weight)  # each character weighs at least 1
    while low < high:
        middle = (low + high + 1) // 2
        part = text[len(text) - middle :] if from_end else text[:middle]
        if weighed_length(part) <= weight:
            low = middle
        else:
            high = middle - 1
    return low


def well_formed(text: str) -> str:
    """``text`` with each lone surrogate (a byte that was not UTF-8, as ``os.listdir``
    reads a file name) made U+FFFD, and a pair written as two surrogates joined: no
    UTF-8 can carry a lone one, so no provider request, store or exporter could, and a
    stored pair reads back joined."""
    return _surrogates(text, lone="replace")


def joined_pairs(text: str) -> str:
    """``text`` with each pair written as two surrogates joined, each lone surrogate kept:
    as JSON text reads it back (a message's id or metadata, which no provider is sent,
    keeps a file name's byte that is not UTF-8 exactly, and reads back from a store
    equal)."""
    return _surrogates(text, lone="surrogatepass")


def _surrogates(text: str, *, lone: str) -> str:
    """``text`` with its pairs of surrogates joined and its lone ones decoded by the
    ``lone`` error handler (``text`` itself when UTF-8 carries it)."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", lone)
    return text


def well_formed_value(value: object, fix: Callable[[str], str] = well_formed) -> object:
    """``value`` with each str in it (keys too, in mappings, lists and tuples
    ``MAX_DEPTH`` deep) as ``fix`` (``well_formed``, or ``joined_pairs``) makes it:
    tool-call arguments a model wrote as JSON, where ``"\\ud83d"`` (half an emoji) reads as
    a lone surrogate. ``value`` itself when no str changes; a changed mapping becomes a
    dict."""
    if isinstance(value, (Mapping, list, tuple)):
        try:  # JSON-like values (what a model sends) in C, five times as fast as a walk
            json.dumps(value, ensure_ascii=False, default=_as_dict).encode("utf-8")
        except (TypeError, ValueError, RecursionError):  # a surrogate, or no JSON
            pass
        else:
            return value
    return _well_formed(value, MAX_DEPTH, fix)


def _as_dict(value: object) -> dict[Any, Any]:
    """A mapping JSON does not take as it is (another ``ToolCall``'s read-only arguments)
    as a dict, for ``well_formed_value``'s check."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON-like")


def _well_formed(value: object, levels: int, fix: Callable[[str], str]) -> object:
    if isinstance(value, str):
        return fix(value)
    if levels == 0 or not isinstance(value, (Mapping, list, tuple)):
        return value
    changed = False
    if isinstance(value, Mapping):
        pairs = []
        for key, item in value.items():
            pair = (_well_formed(key, 0, fix), _well_formed(item, levels - 1, fix))
            changed = changed or pair[0] is not key or pair[1] is not item
            pairs.append(pair)
        return dict(pairs) if changed else value
    items = []
    for item in value:
        fixed = _well_formed(item, levels - 1, fix)
        changed = changed or fixed is not item
        items.append(fixed)
    if not changed:
        return value
    return tuple(items) if isinstance(value, tuple) else items


_ALLOWED = "str, int, float, bool, None, lists, tuples and mappings with str keys (or subclasses)"
_SHORT_INT_BITS = 2000
"""Ints of at most this many bits are written under any digit limit Python allows (640
digits at least): only longer ones are checked (``too_long_to_write``)."""
_REBUILD = 1
"""A str in it is not well formed, or a mapping in it is not a dict: a copy is made."""
_TEXT = 2
"""It holds a number JSON text cannot carry, or nests too deep: its text is kept."""


class _NotJson(Exception):
    """A value JSON has no form for; ``path`` is where, built as the scan unwinds."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.path: list[str] = []


def json_object(
    value: Mapping[str, Any], name: str = "ToolCall.arguments"
) -> Mapping[str, Any] | str:
    """Tool-call arguments as a conversation log holds them, by one rule that every
    provider request, store, estimate and span then follows: ``value`` itself when it is
    JSON that JSON text carries; a copy when a str in it is not well formed (as
    ``well_formed`` makes it), a mapping in it is not a dict or a value or key in it is of
    a subclass of a JSON type (made that type); its text (``json_text``:
    ``NaN``, ``Infinity``, an int too long to write in hexadecimal, whole) when it holds a
    number JSON text cannot carry or nests more than ``MAX_DEPTH`` levels deep (past what
    Python writes, its first levels: ``_first_levels``), which no JSON reader here takes,
    so the call is answered with an error, as a provider's unreadable arguments are. One
    walk, in Python: cheaper than encoding ``value``.

    Raises:
        TypeError: ``value`` holds what JSON has no form for: a key that is not a str, a
            value of another type (a datetime, a set, bytes, an ``Enum`` member that is
            not a str or int), or itself; the message names where (``name`` and the path
            to it). A subclass of a JSON type is kept as that type, as ``json.dumps``
            writes it (a str or int enum member as its value, a named tuple as a tuple).
    """
    try:
        flags = _scan_mapping(value, MAX_DEPTH)
    except _NotJson as problem:
        where = name + "".join(reversed(problem.path))
        raise TypeError(f"{where} {problem.problem}; arguments hold only {_ALLOWED}") from None
    try:
        try:
            if flags & _REBUILD:
                value = _rebuilt(value)  # type: ignore[assignment]
            if flags & _TEXT:
                return well_formed(json_text(dict(value)))
        except RecursionError:  # nests past what Python writes: its first levels are
            return well_formed(json_text(_first_levels(value, MAX_DEPTH + 1, ())))
    except ValueError:  # contains itself
        raise TypeError(f"{name} contains itself; arguments hold only {_ALLOWED}") from None
    return value


def _first_levels(value: object, levels: int, within: tuple[int, ...]) -> object:
    """``value`` down to ``levels`` containers deep, each container deeper written
    ``"…"`` (still too deep for a reader that takes ``MAX_DEPTH`` levels).

    Raises:
        ValueError: ``value`` contains itself within those levels.
    """
    if not isinstance(value, (Mapping, list, tuple)):
        return value
    if id(value) in within:
        raise ValueError("a value contains itself")
    if levels == 0:
        return "…"
    inside = (*within, id(value))
    if isinstance(value, Mapping):
        return {key: _first_levels(item, levels - 1, inside) for key, item in value.items()}
    return [_first_levels(item, levels - 1, inside) for item in value]


def _scan_mapping(value: Mapping[str, Any], levels: int) -> int:
    """The flags of a mapping's keys and values (``_NotJson`` for what is not JSON)."""
    if levels == 0:
        return _TEXT
    flags = 0
    for key, item in value.items():
        if type(key) is not str:
            if not isinstance(key, str):
                raise _NotJson(f"has a key of type {type(key).__name__}")
            flags |= _REBUILD
        if not key.isascii() and well_formed(key) is not key:
            flags |= _REBUILD
        kind = type(item)
        if kind is str:
            if not item.isascii() and well_formed(item) is not item:
                flags |= _REBUILD
        elif kind is bool or item is None:
            pass
        else:
            try:
                flags |= _scan(item, levels - 1)
            except _NotJson as problem:
                problem.path.append(f"[{brief(key)}]")
                raise
    return flags


def _scan(value: Any, levels: int) -> int:
    """The flags of one value (``_NotJson`` for what is not JSON); a subclass of a JSON
    type (a str or int enum member, a named tuple) is rebuilt as that type."""
    kind = type(value)
    if kind is str:
        return 0 if value.isascii() or well_formed(value) is value else _REBUILD
    if kind is int:
        long = value.bit_length() > _SHORT_INT_BITS and too_long_to_write(value)
        return _TEXT if long else 0
    if kind is float:
        return 0 if math.isfinite(value) else _TEXT
    if kind is bool or value is None:
        return 0
    if kind is list or kind is tuple:
        if levels == 0:
            return _TEXT
        flags = 0
        for position, item in enumerate(value):
            try:
                flags |= _scan(item, levels - 1)
            except _NotJson as problem:
                problem.path.append(f"[{position}]")
                raise
        return flags
    if isinstance(value, Mapping):
        return _scan_mapping(value, levels) | (0 if kind is dict else _REBUILD)
    base = next((base for base in _JSON_BASES if isinstance(value, base)), None)
    if base is None:
        raise _NotJson(f"is of type {kind.__name__}")
    return _REBUILD | _scan(_as_base(value, base), levels)


_JSON_BASES = (str, int, float, list, tuple)
"""The JSON types whose subclasses arguments take, as these types (as ``json.dumps``
writes them)."""


def _as_base(value: Any, base: type) -> Any:
    """A value of a subclass of ``base`` as a ``base``, by ``base``'s own conversion (not
    one the subclass overrides)."""
    if base is str:
        return str.__str__(value)
    if base is int:
        return int.__int__(value)
    if base is float:
        return float.__float__(value)
    return base(value)


def _rebuilt(value: object) -> object:
    """``value`` (JSON, as ``_scan`` found it) with its strs well formed, its mappings
    dicts and its subclasses of JSON types those types."""
    if isinstance(value, str):
        return well_formed(str.__str__(value))
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, Mapping):
        return {well_formed(str.__str__(key)): _rebuilt(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rebuilt(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_rebuilt(item) for item in value)
    return value


def json_type(value: object) -> str | None:
    """The JSON Schema type of ``value`` (``"null"``, ``"boolean"``, ``"integer"``,
    ``"number"``, ``"string"``, ``"array"``, ``"object"``); ``None`` for a value of none (a
    tuple, a mapping other than a dict, a datetime, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else None


_TYPE_NAMES = {
    "null": "null",
    "boolean": "a boolean",
    "integer": "a number",
    "number": "a number",
    "string": "a string",
    "array": "an array",
    "object": "an object",
}


def json_type_name(value: object) -> str:
    """The JSON type of ``value`` as an error names it (``"a string"``, ``"an array"``; an
    int or a float is ``"a number"``), else its Python type's name: never the value, which
    may be content."""
    kind = json_type(value)
    return type(value).__name__ if kind is None else _TYPE_NAMES[kind]


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
