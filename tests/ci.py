"""What a test does when something it needs is missing: skip, except under CI."""

from __future__ import annotations

import os
import shutil
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


def mount_namespace(what: str) -> list[str]:
    """The command prefix that runs a child in a mount namespace of its own (a user
    namespace's too, for a user other than root), where it mounts ``what`` (``"a
    read-only file system"``); ``missing`` without ``unshare``."""
    if shutil.which("unshare") is None:
        missing(f"{what} is mounted with unshare, which is missing")
    prefix = ["unshare", "--mount", "--propagation", "private"]
    if os.geteuid() != 0:
        prefix[1:1] = ["--user", "--map-root-user"]
    return prefix
