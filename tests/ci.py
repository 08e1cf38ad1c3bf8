"""What a test does when something it needs is missing: skip, except under CI."""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def under_ci() -> bool:
    """True when the ``CI`` environment variable is set (and not ``0`` or ``false``)."""
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def missing(reason: str) -> NoReturn:
    """Skip the test for ``reason``; under CI, where nothing may skip, fail it."""
    if under_ci():
        pytest.fail(f"CI must run this test, yet {reason}")
    pytest.skip(reason)
