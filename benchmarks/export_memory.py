"""The peak memory of ``littleghost sessions export`` (and, for comparison, ``show
--json``) on one long stored session: export reads the log a page at a time, so its peak
should not grow with the session; ``show`` holds the whole log.

It fills a store with one session of ``--messages`` messages (user and assistant turns
of ``--chars`` characters), then runs each command as its own process, its output to
the null device, and prints the process's peak resident memory (``ru_maxrss``) and its
time. ``--base`` runs the same commands with an earlier checkout's ``littleghost`` on
the path (the store is filled by this one: the format is the same)::

    python benchmarks/export_memory.py                         # 200 000 messages, SQLite
    python benchmarks/export_memory.py --messages 20000        # does the peak grow?
    python benchmarks/export_memory.py --base ../lg-base       # beside an earlier checkout
    python benchmarks/export_memory.py --postgres postgresql://...   # a PostgreSQL database
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from littleghost import Message
from littleghost.sessions import PostgresSessionStore, SQLiteSessionStore

ROOT = Path(__file__).resolve().parent.parent
SESSION = "long"
BATCH = 10_000


async def fill(url: str, messages: int, chars: int) -> None:
    """Store ``messages`` messages of about ``chars`` characters in ``SESSION``."""
    store = (
        SQLiteSessionStore(url.removeprefix("sqlite:///"))
        if url.startswith("sqlite:///")
        else PostgresSessionStore(url)
    )
    text = ("The order shipped on Monday and arrives on Thursday. " * (chars // 52 + 1))[:chars]
    async with store:
        if SESSION in await store.list_sessions():
            await store.delete(SESSION)
        for start in range(0, messages, BATCH):
            batch = [
                Message.user(f"{index} {text}")
                if index % 2 == 0
                else Message.assistant(f"{index} {text}")
                for index in range(start, min(start + BATCH, messages))
            ]
            await store.append(SESSION, batch)


def peak(command: list[str], path: Path) -> tuple[float, float]:
    """The peak resident memory (MiB) and seconds of ``python -m littleghost command``
    with ``path`` first on the import path, its output to the null device."""
    environment = {**os.environ, "PYTHONPATH": str(path)}
    began = time.perf_counter()
    with open(os.devnull, "w") as null:
        process = subprocess.Popen(
            [sys.executable, "-m", "littleghost", *command],
            cwd=path,
            env=environment,
            stdout=null,
            stderr=subprocess.PIPE,
        )
        _, status, usage = os.wait4(process.pid, 0)
        process.returncode = os.waitstatus_to_exitcode(status)
        assert process.stderr is not None
        failure = process.stderr.read().decode()
        process.stderr.close()
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}): {failure}")
    kib = usage.ru_maxrss if sys.platform != "darwin" else usage.ru_maxrss / 1024
    return kib / 1024, time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--chars", type=int, default=200)
    parser.add_argument("--postgres", metavar="CONNINFO", help="a PostgreSQL database instead")
    parser.add_argument("--base", type=Path, help="an earlier checkout to compare with")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        url = options.postgres or f"sqlite:///{Path(directory) / 'sessions.db'}"
        began = time.perf_counter()
        anyio.run(fill, url, options.messages, options.chars)
        print(
            f"{options.messages} messages of {options.chars} characters stored in "
            f"{time.perf_counter() - began:.1f} s"
        )
        checkouts = [("this checkout", ROOT)]
        if options.base is not None:
            checkouts.insert(0, ("--base", options.base.resolve()))
        for command in (["export", SESSION], ["show", SESSION, "--json"]):
            for name, path in checkouts:
                mib, seconds = peak(["sessions", *command, "--store", url], path)
                print(
                    f"sessions {' '.join(command):<16} {name:<14} {mib:7.1f} MiB {seconds:6.1f} s"
                )


if __name__ == "__main__":
    main()
