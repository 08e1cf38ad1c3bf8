"""A store URL's scheme, for errors that name it and never quote the rest of the URL
(it may hold a password)."""

from __future__ import annotations

import re

_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
"""A URL's scheme, as it begins (``mysql:``, ``sqlite:``); a conninfo's first word ends
with ``=``."""
_POSTGRES = ("postgresql", "postgres")


def url_scheme(text: str, *, slashes: bool = False) -> str | None:
    """The scheme ``text`` begins with, as written (``MySQL`` of ``MySQL://...``), or
    None; with ``slashes``, only one that ``//`` follows."""
    found = _SCHEME.match(text)
    if found is None or (slashes and not text.startswith("//", found.end())):
        return None
    return found.group(1)


def is_postgres(scheme: str) -> bool:
    """Whether ``scheme`` is PostgreSQL's in any case (``postgresql``, ``POSTGRES``)."""
    return scheme.lower() in _POSTGRES


def lowercase_fault(scheme: str) -> str | None:
    """What is wrong with PostgreSQL's scheme written with capitals (libpq reads it only
    in lowercase), or None for another scheme or one in lowercase."""
    if not is_postgres(scheme) or scheme == scheme.lower():
        return None
    return f"libpq takes the scheme in lowercase: {scheme.lower()}://..."
