"""The public API's modules, for the tests that check its documentation."""

from __future__ import annotations

PUBLIC_MODULES = [
    "littleghost",
    "littleghost.capabilities",
    "littleghost.context",
    "littleghost.errors",
    "littleghost.events",
    "littleghost.models",
    "littleghost.models.streaming",
    "littleghost.sessions",
    "littleghost.testing",
]
"""The modules whose ``__all__`` is the public API: the pages document each name, and
each name's docstring says what it is."""
