"""A tool's docstring read for the model: its description (the text before any section)
and what it says of each parameter, in Google style (``Args:``), NumPy style (a
``Parameters`` heading underlined with dashes) or Sphinx style (``:param name: text``)."""

from __future__ import annotations

import re

__all__ = ["parse_docstring"]

_GOOGLE = frozenset(
    {
        "args:",
        "arguments:",
        "parameters:",
        "keyword args:",
        "keyword arguments:",
        "returns:",
        "return:",
        "raises:",
        "yields:",
        "examples:",
        "example:",
        "note:",
        "notes:",
    }
)
_GOOGLE_ARGS = frozenset(
    {"args:", "arguments:", "parameters:", "keyword args:", "keyword arguments:"}
)
_GOOGLE_ENTRY = re.compile(r"\*{0,2}(\w+)\s*(\([^)]*\))?\s*:\s*(.*)")
_NUMPY_ARGS = frozenset({"parameters", "other parameters", "keyword arguments"})
_NUMPY_ENTRY = re.compile(r"(\*{0,2}\w+(?:\s*,\s*\*{0,2}\w+)*)\s*(?::.*)?")
_SPHINX_FIELD = re.compile(
    r":(param|parameter|arg|argument|key|keyword|type|returns?|rtype|raises?|except|"
    r"exception|yields?|ytype|var|ivar|cvar|meta)\b[^:]*:"
)
_SPHINX_PARAM = re.compile(
    r":(?:param|parameter|arg|argument|key|keyword)\s+(?:[^:]*\s)?\*{0,2}(\w+)\s*:(.*)"
)


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """The description (the text before the first section, in any of the three styles)
    and each parameter's text, by name."""
    lines = doc.splitlines()
    end = next((index for index in range(len(lines)) if _starts_section(lines, index)), None)
    end = len(lines) if end is None else end
    rest = lines[end:]
    args = {**_sphinx_args(rest), **_numpy_args(rest), **_google_args(rest)}
    return "\n".join(lines[:end]).strip(), args


def _starts_section(lines: list[str], index: int) -> bool:
    stripped = lines[index].strip()
    return (
        stripped.lower() in _GOOGLE
        or _is_numpy_heading(lines, index)
        or _SPHINX_FIELD.match(stripped) is not None
    )


def _is_numpy_heading(lines: list[str], index: int) -> bool:
    """True for a heading (a line of words) underlined by a line of dashes."""
    if index + 1 >= len(lines) or not re.fullmatch(r"[A-Za-z][A-Za-z ]*", lines[index].strip()):
        return False
    underline = lines[index + 1].strip()
    return len(underline) >= 3 and set(underline) == {"-"}


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _google_args(lines: list[str]) -> dict[str, str]:
    """The entries of ``Args:`` sections: ``name (type): text``, continued indented; a
    line indented less than the entries ends the section."""
    args: dict[str, str] = {}
    current: str | None = None
    in_args = False
    base_indent = 0
    for line in lines:
        stripped = line.strip()
        if stripped.lower() in _GOOGLE:
            in_args = stripped.lower() in _GOOGLE_ARGS
            current = None
            base_indent = -1
            continue
        if not in_args or not stripped:
            continue
        if base_indent < 0:
            base_indent = _indent(line)
        if _indent(line) < base_indent:  # text after the section, not a parameter's
            in_args, current = False, None
            continue
        match = _GOOGLE_ENTRY.fullmatch(stripped)
        if _indent(line) <= base_indent and match:
            current = match.group(1)
            args[current] = match.group(3).strip()
        elif current is not None:
            args[current] = f"{args[current]} {stripped}".strip()
    return args


def _numpy_args(lines: list[str]) -> dict[str, str]:
    """The entries of ``Parameters`` sections: ``name : type`` (or ``x, y : type``), and
    the text indented below it."""
    args: dict[str, str] = {}
    current: list[str] = []
    in_args = False
    base_indent = -1
    for index, line in enumerate(lines):
        stripped = line.strip()
        if _is_numpy_heading(lines, index):
            in_args = stripped.lower() in _NUMPY_ARGS
            current, base_indent = [], -1
            continue
        if not in_args or not stripped or set(stripped) == {"-"}:
            continue
        if base_indent < 0:
            base_indent = _indent(line)
        match = _NUMPY_ENTRY.fullmatch(stripped)
        if _indent(line) <= base_indent and match:
            current = [name.strip().lstrip("*") for name in match.group(1).split(",")]
            args.update(dict.fromkeys(current, ""))
        else:
            for name in current:
                args[name] = f"{args[name]} {stripped}".strip()
    return args


def _sphinx_args(lines: list[str]) -> dict[str, str]:
    """The ``:param [type] name: text`` fields, continued on lines indented below them."""
    args: dict[str, str] = {}
    current: str | None = None
    for line in lines:
        stripped = line.strip()
        match = _SPHINX_PARAM.match(stripped)
        if match:
            current = match.group(1)
            args[current] = match.group(2).strip()
        elif current is not None and stripped and not _SPHINX_FIELD.match(stripped):
            args[current] = f"{args[current]} {stripped}".strip()
        else:
            current = None
    return args
