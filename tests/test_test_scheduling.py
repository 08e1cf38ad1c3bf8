"""The suite's own scheduling (``tests/conftest.py``), run on a small suite of its own:
under ``-n`` the timed or heavy files start first, together in one process; without
workers (``-n 0``, or pytest-xdist disabled) the suite runs as usual."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SUITE = {"test_faults.py": 1, "test_run_faults.py": 1, "test_many.py": 4, "test_more.py": 3}
"""Test files and how many tests each holds: the timed or heavy ones hold the fewest, so
pytest-xdist's own order (most tests first) would start them last."""


PLUGINS = ("-p", "tests.conftest", "-p", "no:cacheprovider")


def run_suite(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Run ``SUITE`` in ``tmp_path`` with this suite's conftest as a plugin."""
    for name, count in SUITE.items():
        tests = "".join(f"def test_{n}() -> None:\n    pass\n\n\n" for n in range(count))
        (tmp_path / name).write_text(tests)
    return subprocess.run(
        [sys.executable, "-m", "pytest", *PLUGINS, "-v", *options],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_timed_or_heavy_files_start_first_in_one_process(tmp_path: Path) -> None:
    result = run_suite(tmp_path, "-n", "2")
    assert result.returncode == 0, result.stdout + result.stderr
    ran: dict[str, list[str]] = {}  # the files each worker ran, in order
    for worker, file in re.findall(r"^\[(gw\d)\].* PASSED (\S+?)::", result.stdout, re.M):
        ran.setdefault(worker, []).append(file)
    assert sum(map(len, ran.values())) == sum(SUITE.values())
    heavy = next(files for files in ran.values() if "test_faults.py" in files)
    assert sorted(heavy[:2]) == ["test_faults.py", "test_run_faults.py"]


@pytest.mark.parametrize("options", [(), ("-n", "0"), ("-p", "no:xdist")])
def test_the_suite_runs_without_workers(tmp_path: Path, options: tuple[str, ...]) -> None:
    result = run_suite(tmp_path, *options)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"{sum(SUITE.values())} passed" in result.stdout
