"""The fault-injection campaign at full size: many short runs with faults at random points,
under asyncio and trio, and the figures the README's Benchmarks quote.

Each run draws its script, its faults (store errors, stalls, failures after a write and a
SQLite database locked by another connection; model errors and stalls; tools that fail,
hang, time out, block a thread, let a cancellation of their own escape or end the process) and its stop (a deadline, a caller's cancel scope, a
cancellation at the k-th await) from a seeded generator; two runs in five use
``@manage_context``, with summary calls and chat calls that overflow, fail or stall;
``tests/faults.py`` says what is checked after each. Half the runs draw extras besides:
sub-agents run from tools (with faults, deadlines, a longer grace of their own, a
``cancel()`` from their tool or a racing sibling), hooks that append to the log, rebuild
or add to the request, rewrite answers and results, give calls one id or raise, tools
that append to the log or make side calls under a timeout, an ``output_type`` (answers
that fit or not, natively or through ``final_result``), a small ``max_turns``, stream
consumers that read slowly or raise in their loop, and runs of the same session racing it
(faulty ones, a fault-free one, or ``compact_session``). Half draw further extras: a
store ``load`` that fails or stalls, hooks of every kind that stall or raise, retried
model errors, a ``prepare()`` that stalls, ``deadline=``, a consumer calling
``events.aclose()``, a model made from a model string whose close stalls or fails, the
agent closed while the run goes on (``aclose()`` beside it, ``async with agent:``), and a
store ``lock`` whose release fails.
A fifth as many runs again go through ``run_sync()`` in worker threads
(``threaded_campaign``). With ``--postgres``, every third
run uses a PostgreSQL store, whose session lock's connection the server may end
mid-run. ``tests/test_faults.py`` runs a smaller campaign in CI.

    python benchmarks/faults.py                 # 5 000 runs per backend
    python benchmarks/faults.py --runs 500 --seed 7
    python benchmarks/faults.py --runs 1000 --concurrency 2   # the tightest timing
    python benchmarks/faults.py --postgres postgresql://localhost/faults
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

from tests.faults import campaign, figures, threaded_campaign


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5_000, help="runs per backend")
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument(
        "--postgres", metavar="CONNINFO", help="every third run on this PostgreSQL database"
    )
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
                    postgres=arguments.postgres,
                ),
                backend=backend,
            )
            print(figures(report, backend, time.monotonic() - began), flush=True)
            violations += len(report.violations)
        began = time.monotonic()
        threaded = anyio.run(
            lambda: threaded_campaign(arguments.seed, max(1, arguments.runs // 5)),
            backend=backend,
        )
        print(figures(threaded, f"{backend}, run_sync()", time.monotonic() - began), flush=True)
        violations += len(threaded.violations)
    return 1 if violations else 0


if __name__ == "__main__":
    sys.exit(main())
