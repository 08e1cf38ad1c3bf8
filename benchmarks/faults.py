"""The fault-injection campaign at full size: many short runs with faults at random points,
under asyncio and trio, and the figures the README quotes.

Each run draws its script, its faults (store errors, stalls, failures after a write and a
SQLite database locked by another connection; model errors and stalls; tools that fail,
hang, time out, block a thread, let a cancellation of their own escape or end the process) and its stop (a deadline, a caller's cancel scope, a
cancellation at the k-th await) from a seeded generator; two runs in five use
``@manage_context``, with summary calls and chat calls that overflow, fail or stall;
``tests/faults.py`` says what is checked after each. ``tests/test_faults.py`` runs a smaller campaign in CI.

    python benchmarks/faults.py                 # 5 000 runs per backend
    python benchmarks/faults.py --runs 500 --seed 7
    python benchmarks/faults.py --runs 1000 --concurrency 2   # the tightest timing
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.faults import campaign, figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5_000, help="runs per backend")
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--concurrency", type=int, default=20)
    arguments = parser.parse_args()
    # Thousands of expected warnings (cleanups cut short, late thread results): not shown.
    logging.getLogger("littleghost").setLevel(logging.ERROR)
    violations = 0
    for backend in ("asyncio", "trio"):
        with tempfile.TemporaryDirectory() as directory:
            began = time.monotonic()
            report = anyio.run(
                lambda: campaign(
                    arguments.seed,
                    arguments.runs,
                    directory=Path(directory),
                    concurrency=arguments.concurrency,
                ),
                backend=backend,
            )
            print(figures(report, backend, time.monotonic() - began), flush=True)
            violations += len(report.violations)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
