"""Run the tests with a timing bound as a loaded CI machine runs them: beside processes
that spin on every core, with three test processes per core. A bound too tight for
such a machine fails here first.

``python -m tests.under_load [--rounds N] [pytest arguments]``: the files that import
``tests/timing.py`` unless files are given; the failures of each round (pytest's whole
output kept in a file it names), then in all."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

TESTS = Path(__file__).parent


def bounded_files() -> list[str]:
    """The test files that bound a time with ``LATE``."""
    return sorted(
        str(path.relative_to(TESTS.parent))
        for path in TESTS.glob("test_*.py")
        if "from .timing import LATE" in path.read_text()
    )


def failures(output: str) -> list[str]:
    """The ids of the tests pytest's ``-rfE`` summary names as failed or in error."""
    return re.findall(r"^(?:FAILED|ERROR) (\S+)", output, re.MULTILINE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    options, pytest_args = parser.parse_known_args()
    cores = os.cpu_count() or 1
    command = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider"]
    command += ["-n", str(3 * cores), *(pytest_args or bounded_files())]
    failed: Counter[str] = Counter()
    for round_number in range(1, options.rounds + 1):
        spinning = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)
        ]
        try:
            ran = subprocess.run(command, capture_output=True, text=True, check=False)
        finally:
            for process in spinning:
                process.kill()
                process.wait()
        this_round = failures(ran.stdout)
        failed.update(this_round)
        summary = ran.stdout.strip().splitlines()[-1:] or ["no output"]
        print(f"round {round_number}: {summary[0]}", *this_round, sep="\n  ", flush=True)
        if this_round:
            with tempfile.NamedTemporaryFile("w", suffix=".log", delete=False) as kept:
                kept.write(ran.stdout + ran.stderr)
            print(f"  (pytest's output: {kept.name})", flush=True)
    print(f"failed in {options.rounds} rounds:", *sorted(failed.items()) or ["none"], sep="\n  ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
