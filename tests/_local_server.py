"""Helpers for the tests against the real llama.cpp server: skipping when no server can run
here (failing under CI), and finding server processes this test process left behind."""

from __future__ import annotations

import os
from pathlib import Path

from littleghost.errors import ConfigurationError, ProviderError
from littleghost.models.local import LocalModel
from tests.ci import missing


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
    """A ``LocalModel``; the test is skipped (failed under CI) when the local packages
    are not installed or no llama.cpp server can run on this machine."""
    try:
        return LocalModel(**options)  # type: ignore[arg-type]
    except ConfigurationError as error:
        if "not installed" in str(error) or "no llama.cpp server" in str(error):
            missing(f"the local model cannot run: {error}")
        raise


def skip_if_this_cpu_cannot_run_the_server(error: ProviderError) -> None:
    """Skip (fail under CI) when the chosen server died of SIGILL: its build needs CPU
    instructions this machine lacks. Point ``LITTLEGHOST_LLAMA_SERVER`` at a llama.cpp
    server built for this machine (``.ci/run`` does)."""
    if "SIGILL" in str(error):
        missing(f"the llama.cpp server cannot run on this CPU: {error}")
