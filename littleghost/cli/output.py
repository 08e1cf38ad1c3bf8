"""How the commands write: tables and colours on a terminal, plain tab-separated lines
when piped, JSON for scripts, and progress bars on standard error when it is a terminal."""

from __future__ import annotations

import codecs
import functools
import json
import os
import re
import shutil
import sys
import unicodedata
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import click
from attrs import frozen

from littleghost.text import error_text

__all__ = [
    "SHORT_ID",
    "Output",
    "clock",
    "echo",
    "escape_unwritable",
    "excerpt",
    "moment",
    "one_line",
    "quoted",
    "shell_word",
    "shown",
]

_ELLIPSIS = "…"
SHORT_ID = 13
"""How much of a message id a terminal's table shows (JSON and piped text show all)."""


_INVISIBLE = (
    "\u00ad\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200d\u2060-\u2064"
    "\u206a-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
"""The format characters (Unicode category Cf) besides the bidirectional marks: they
show nothing (zero-width spaces and joiners, soft hyphens, tag characters that can spell
hidden text), so a table shows them as escapes."""
_CONTROL = re.compile(
    r"[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff"
    + _INVISIBLE
    + "]"
)
_JSON_ESCAPED = re.compile(
    r"[\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]"
)
"""What JSON may hold raw but a terminal must not get (what ``json.dumps`` does not
escape of ``_CONTROL``): DEL and C1 controls, bidirectional marks, line and paragraph
separators, and lone surrogates (no UTF-8 can write them)."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(text: str) -> str:
    """``text`` safe to print as one line: control characters (escape sequences, bells,
    backspaces, line and paragraph breaks, tabs), bidirectional marks, other characters
    that show nothing (zero-width, tag characters: ``_INVISIBLE``) and lone surrogates
    written as escapes (``\\x1b``, ``\\n``, ``\\u202e``, ``\\U000e0041``, ``\\udce9``).
    Stored content and ids are untrusted; ``--json`` is exact."""
    return _CONTROL.sub(_escape, text)


def _escape(match: re.Match[str], *, bytes_below: int = 0x100) -> str:
    """The escape of the character ``match`` found: ``\\x`` below ``bytes_below``."""
    char = match.group()
    code = ord(char)
    if code < bytes_below:
        return _NAMED.get(char) or f"\\x{code:02x}"
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


_BEYOND_ASCII = re.compile(r"[\x00-\x1f\x7f-\U0010ffff]")
"""What an id not in NFC form has as escapes: it could look like another, composed id."""
_BARE_WORD = re.compile(r"[\w@%+=:,./-]+", re.ASCII)
"""What a shell reads as one word unquoted, with no expansion (as ``shlex.quote``)."""


def shell_word(text: str, *, in_prose: bool = False) -> str:
    """``text`` (a session id) as one shell word that reads back exact and is safe to
    print: bare when it is only ASCII letters, digits and ``_@%+=:,./-`` and starts with
    no ``-`` (unless ``in_prose``: a sentence quotes it all the same); else in single
    quotes (``'a b'``, ``''``, ``'it'\\''s'``); and when it holds what ``shown`` escapes,
    or is not in Unicode's NFC form (``cafe\\u0301``, which would look like ``café``), or
    holds what standard output's encoding lacks (``日本`` on a Latin-1 terminal), in ANSI-C
    quotes with those escapes, all beyond ASCII in the last two cases (``$'a\\nb'``,
    ``$'cafe\\u0301'``: bash, zsh, ksh, and POSIX sh since 2024)."""
    if not in_prose and _BARE_WORD.fullmatch(text) and not text.startswith("-"):
        return text
    plain = unicodedata.is_normalized("NFC", text) and _writable(text)
    if plain and _CONTROL.search(text) is None:
        return "'" + text.replace("'", "'\\''") + "'"
    body = text.replace("\\", "\\\\").replace("'", "\\'")
    escaped = _CONTROL if plain else _BEYOND_ASCII
    # in $'...' a \x is a byte, not a character: \u from U+0080 on
    return "$'" + escaped.sub(functools.partial(_escape, bytes_below=0x80), body) + "'"


def _writable(text: str) -> bool:
    """Whether standard output's encoding has every character of ``text`` (click writes
    UTF-8 where it is ASCII: a C locale's)."""
    encoding = getattr(sys.stdout, "encoding", None)
    if text.isascii() or encoding is None or codecs.lookup(encoding).name == "ascii":
        return True
    try:
        text.encode(encoding)
    except UnicodeEncodeError:
        return False
    return True


def quoted(text: str) -> str:
    """Stored text as a table shows it: in double quotes, a ``"`` or ``\\`` in it escaped
    with a backslash, so that no text can pass for what littleghost writes around it (a
    record's label, a call's result) and the escapes ``shown`` writes read back exact."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def one_line(error: BaseException, *, named: bool = False) -> str:
    """``error`` for a one-line message: the first line of ``error_text``, after its
    type's name when ``named`` (the user's own code failed: ``KeyError: 'DB_URL'`` says
    more than ``'DB_URL'``)."""
    lines = error_text(error, with_type=named).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def echo(text: str, *, color: bool = False) -> None:
    """Write ``text`` and a line break to standard output, the break on its own: Python's
    buffered writer takes only the first part of a long text when the disk fills up, and
    says nothing (a ``--json`` document is cut short, exit 0); the break written next
    then fails with the disk's error."""
    click.echo(text, nl=False, color=color)
    click.echo()


def escape_unwritable(stream: object) -> None:
    """Have ``stream`` write a character its encoding lacks (a Latin-1 terminal's, a
    cp1252 redirect's) as a backslash escape instead of failing on it."""
    reconfigure = getattr(stream, "reconfigure", None)
    if callable(reconfigure):
        reconfigure(errors="backslashreplace")


def excerpt(text: str, limit: int) -> str:
    """``text`` on one line (whitespace runs become one space), cut to ``limit``
    characters with an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: max(limit - 1, 0)] + _ELLIPSIS


@functools.cache
def _char_columns(char: str) -> int:
    if unicodedata.category(char) in ("Mn", "Me", "Cf"):  # combining marks, joiners
        return 0
    return 2 if unicodedata.east_asian_width(char) in ("W", "F") else 1


def columns(text: str) -> int:
    """How many terminal columns ``text`` takes: wide characters (Chinese, Japanese,
    Korean, emoji) two, combining marks and joiners none."""
    return len(text) if text.isascii() else sum(map(_char_columns, text))


def fitted(text: str, limit: int) -> str:
    """``excerpt`` by terminal columns: ``text`` on one line, cut to ``limit`` columns
    with an ellipsis."""
    if text.isascii():
        return excerpt(text, limit)
    line = " ".join(text.split())
    if columns(line) <= limit:
        return line
    kept, room = [], limit - columns(_ELLIPSIS)
    for char in line:
        room -= _char_columns(char)
        if room < 0:
            break
        kept.append(char)
    return "".join(kept) + _ELLIPSIS


def moment(value: datetime | None) -> str | None:
    """A stored time for JSON (ISO 8601, UTC), or ``None``."""
    return None if value is None else value.isoformat()


def clock(stored_at: str | None) -> str:
    """A time from ``moment`` for a table: ``YYYY-MM-DD HH:MM:SS``; ``-`` when unknown."""
    return "-" if stored_at is None else stored_at[:19].replace("T", " ")


@frozen
class Output:
    """Where a command writes and how.

    Attributes:
        terminal: Standard output is a terminal: aligned tables with a styled header.
        colour: Colours and styles are used (on a terminal, unless ``NO_COLOR`` is set).
        progress: Standard error is a terminal: long steps show a progress bar there.
    """

    terminal: bool
    colour: bool
    progress: bool

    @classmethod
    def detect(cls) -> Output:
        """The output of this process, from its standard streams and ``NO_COLOR`` (a
        closed stream, ``None``, is no terminal; click writes nothing to it)."""
        terminal = sys.stdout is not None and sys.stdout.isatty()
        colour = terminal and not os.environ.get("NO_COLOR")
        return cls(terminal, colour, sys.stderr is not None and sys.stderr.isatty())

    def style(self, text: str, **styles: Any) -> str:
        """``text`` with click ``styles`` (``fg=``, ``bold=``, ...) when colours are on."""
        return click.style(text, **styles) if self.colour and styles else text

    def line(self, text: str = "") -> None:
        """Write one line to standard output."""
        echo(text, color=self.colour)

    def json(self, document: object) -> None:
        """Write ``document`` as indented JSON, which reads back as it is: control
        characters, bidirectional marks and lone surrogates as ``\\u`` escapes, and any
        character but ASCII too when standard output's encoding is not a UTF."""
        encoding = getattr(sys.stdout, "encoding", None)
        ascii_only = encoding is not None and not codecs.lookup(encoding).name.startswith("utf")
        text = json.dumps(document, indent=2, ensure_ascii=ascii_only)
        echo(_JSON_ESCAPED.sub(lambda match: f"\\u{ord(match.group()):04x}", text))

    def table(
        self,
        headers: Sequence[str],
        rows: Sequence[Sequence[str]],
        styles: Sequence[dict[str, Any]] | None = None,
        narrow: Mapping[int, int] | None = None,
        *,
        cut_last: bool = True,
    ) -> None:
        """Rows under their headers: on a terminal, aligned columns (the last one cut to
        the terminal's width unless not ``cut_last``, the ``narrow`` ones by index to
        their given width; a wide character takes two columns), each row in its
        ``styles`` entry (click styles); otherwise one tab-separated line per row,
        headers first, nothing cut. Cells are ``shown``: one line each, no control
        characters."""
        rows = [[shown(cell) for cell in row] for row in rows]
        if not self.terminal:
            for row in (headers, *rows):
                self.line("\t".join(row))
            return
        if narrow:
            rows = [
                [fitted(cell, narrow[i]) if i in narrow else cell for i, cell in enumerate(row)]
                for row in rows
            ]
        widths = [max(columns(row[i]) for row in (headers, *rows)) for i in range(len(headers) - 1)]
        room = shutil.get_terminal_size().columns - sum(widths) - 2 * len(widths)

        def joined(row: Sequence[str]) -> str:
            cells = "  ".join(
                cell + " " * (width - columns(cell))
                for cell, width in zip(row, widths, strict=False)
            )
            last = fitted(row[-1], max(room, 20)) if cut_last else row[-1]
            return f"{cells}  {last}".rstrip()

        self.line(self.style(joined(headers), bold=True, underline=True))
        for index, row in enumerate(rows):
            self.line(self.style(joined(row), **(styles[index] if styles else {})))

    @contextmanager
    def progress_bar(self, length: int, label: str) -> Iterator[Callable[[int, str], None]]:
        """A progress bar of ``length`` steps on standard error when it is a terminal
        (nothing otherwise); yields ``advance(steps, doing)``."""
        with click.progressbar(
            length=length,
            label=label,
            file=sys.stderr,
            hidden=not self.progress,
            show_eta=False,
            item_show_func=lambda doing: doing,
            update_min_steps=max(1, length // 100),
        ) as bar:

            def advance(steps: int, doing: str) -> None:
                bar.update(steps, doing)

            yield advance
