"""Helpers for the tests against the real llama.cpp server: skipping when the local
packages are absent, and finding server processes this test process left behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from littleghost.errors import ConfigurationError, ProviderError
from littleghost.models.local import LocalModel


def running_servers() -> list[int]:
    """Pids of llama.cpp server processes, children of this process, still running."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, parent = stat.rsplit(")", 1)[1].split()[:2]
        if int(parent) == os.getpid() and state != "Z" and b"llama-server" in command:
            found.append(int(entry.name))
    return found


def local_model_or_skip(**options: object) -> LocalModel:
    """A ``LocalModel``; the test is skipped when the local packages are not installed."""
    try:
        return LocalModel(**options)  # type: ignore[arg-type]
    except ConfigurationError as error:
        if "not installed" in str(error):
            if os.environ.get("CI", "").lower() not in ("", "0", "false"):
                pytest.fail(f".ci/run installs the local model, yet: {error}")
            pytest.skip(f"the local model is not installed: {error}")
        raise


def skip_if_this_cpu_cannot_run_the_server(error: ProviderError) -> None:
    """Skip when the prebuilt server dies of SIGILL: its build needs CPU instructions
    (AVX-512) this machine lacks, so no test of ours can run it here. Point
    ``LITTLEGHOST_LLAMA_SERVER`` at a llama.cpp server built for this machine instead."""
    if "SIGILL" in str(error):
        pytest.skip(f"the installed llama.cpp server cannot run on this CPU: {error}")
