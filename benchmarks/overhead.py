"""The framework's own cost per run and per turn, the model left out (``ScriptedModel``,
answering at once and reporting token counts, as a provider does).

Scenarios: one run without tools; tool loops of 50, 200 and 800 calls (one call per turn,
small arguments and results; an async tool, and a sync one, which runs in a worker
thread), plain, streamed, with ``@manage_context`` (a window so large that nothing is
compacted) and with a ``PromptBudget`` view; 200 runs of one question and answer on one
session (its log grows to 400 messages; in memory and in SQLite), plain, managed, bounded
and with a tool call in each run. Per-turn figures divide a run by its model calls; per-run
ones are the mean of the 200, with the median of the first and last 20 beside it (how the
stored log's length tells). Each figure is the median of ``--rounds``; ``--base DIR`` runs
the same scenarios on another checkout (a git worktree of an earlier commit) in turns with
this one, in fresh processes, side by side. ``--profile NAME`` prints where one scenario's
time goes (cProfile, by cumulative and by own time; a worker thread's work, such as a
session's decoding, shows as the event loop's wait)::

    python benchmarks/overhead.py                                 # this checkout
    python benchmarks/overhead.py --base ../lg-base --rounds 5    # side by side
    python benchmarks/overhead.py --only loop50,mem200 --profile managed_loop800
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from attrs import frozen


@frozen
class Scenario:
    about: str
    turns: int = 0  # a tool loop of this many calls; 0: 200 runs on one session
    managed: str | None = None  # "plain" (@manage_context) or "budget" (a PromptBudget)
    store: str | None = None  # "memory" or "sqlite", for the session runs
    stream: bool = False
    sync_tool: bool = False
    session_tools: bool = False  # each session run makes a tool call before its answer


SCENARIOS = {
    "single": Scenario("one run, one model call, no tools (µs per run)"),
    "loop50": Scenario("a 50-call tool loop and its answer (µs per turn)", 50),
    "loop200": Scenario("a 200-call tool loop (µs per turn)", 200),
    "loop800": Scenario("an 800-call tool loop (µs per turn)", 800),
    "loop50_sync": Scenario("loop50, a sync tool (µs per turn)", 50, sync_tool=True),
    "stream50": Scenario("loop50 through agent.stream (µs per turn)", 50, stream=True),
    "managed_loop50": Scenario("loop50, @manage_context (µs per turn)", 50, "plain"),
    "managed_loop200": Scenario("loop200, @manage_context (µs per turn)", 200, "plain"),
    "managed_loop800": Scenario("loop800, @manage_context (µs per turn)", 800, "plain"),
    "budget_loop50": Scenario("loop50, a PromptBudget (µs per turn)", 50, "budget"),
    "budget_loop200": Scenario("loop200, a PromptBudget (µs per turn)", 200, "budget"),
    "budget_loop800": Scenario("loop800, a PromptBudget (µs per turn)", 800, "budget"),
    "mem200": Scenario("200 runs on one in-memory session (µs per run)", store="memory"),
    "sqlite200": Scenario("200 runs on one SQLite session (µs per run)", store="sqlite"),
    "managed_mem200": Scenario("mem200, @manage_context (µs per run)", 0, "plain", "memory"),
    "managed_sqlite200": Scenario("sqlite200, @manage_context (µs per run)", 0, "plain", "sqlite"),
    "budget_mem200": Scenario("mem200, a PromptBudget (µs per run)", 0, "budget", "memory"),
    "budget_sqlite200": Scenario("sqlite200, a PromptBudget (µs per run)", 0, "budget", "sqlite"),
    "tools_mem200": Scenario(
        "mem200, a tool call in each run (µs per run)", store="memory", session_tools=True
    ),
    "tools_sqlite200": Scenario(
        "sqlite200, a tool call in each run (µs per run)", store="sqlite", session_tools=True
    ),
}
DEFAULT = (
    "single,loop50,loop200,loop800,loop50_sync,stream50,managed_loop200,budget_loop200,"
    "mem200,sqlite200,managed_mem200,budget_mem200,tools_mem200,tools_sqlite200"
)
WINDOW = 10_000_000
FIELDS = [f"field_{n}" for n in range(10)]
NOTE = "The customer asked whether this item ships before the end of the month. " * 3


def _agent_class(managed: str | None, store: Any) -> Any:
    from littleghost import Agent, manage_context

    async def lookup(item: int, fields: list[str], note: str = "") -> str:
        """Look an item up.

        Args:
            item: The item number.
            fields: The fields to show.
            note: Why it is looked up.
        """
        return f"item {item}: in stock, " + ", ".join(f"{f}=ok" for f in fields)

    def lookup_sync(item: int, fields: list[str], note: str = "") -> str:
        """Look an item up (a sync tool: it runs in a worker thread).

        Args:
            item: The item number.
            fields: The fields to show.
            note: Why it is looked up.
        """
        return f"item {item}: in stock, " + ", ".join(f"{f}=ok" for f in fields)

    class Bench(Agent):
        instructions = "You answer questions about the stock."
        tools = [lookup, lookup_sync]
        if store is not None:
            session_store = store

    if managed == "plain":
        return manage_context(context_window_tokens=WINDOW)(Bench)
    if managed == "budget":
        from littleghost.context import PromptBudget

        budget = PromptBudget(prompt_budget_tokens=WINDOW // 2)
        return manage_context(context_window_tokens=WINDOW, budget=budget)(Bench)
    return Bench


def _usage(request: Any) -> dict[str, int]:
    """Token counts as a provider reports them."""
    return {"input_tokens": 150 + 60 * len(request.messages), "output_tokens": 30}


def _call(n: int, tool: str = "lookup") -> Any:
    from littleghost.testing import tool_call_response

    arguments = {"item": n, "fields": FIELDS, "note": NOTE}
    return lambda request: tool_call_response(tool, arguments, **_usage(request))


def _answer(text: str) -> Any:
    from littleghost.testing import text_response

    return lambda request: text_response(text, **_usage(request))


async def _measure(name: str) -> dict[str, float]:
    """Run scenario ``name`` once; its figures (µs)."""
    from littleghost.sessions import InMemorySessionStore, SQLiteSessionStore
    from littleghost.testing import ScriptedModel

    scenario = SCENARIOS[name]
    if not scenario.turns and scenario.store is None:
        agent = _agent_class(None, None)()
        runs, spent = 300, 0.0
        for _ in range(runs):
            agent.model = ScriptedModel([_answer("Yes.")])
            start = time.perf_counter()
            await agent.run("Is item 1 in stock?")
            spent += time.perf_counter() - start
        return {"unit": spent / runs * 1e6}
    if scenario.turns:
        turns = scenario.turns
        tool = "lookup_sync" if scenario.sync_tool else "lookup"
        agent = _agent_class(scenario.managed, None)(max_turns=turns + 1)
        runs, spent = max(1, 1000 // turns), 0.0
        for _ in range(runs):
            steps = [*(_call(n, tool) for n in range(turns)), _answer("All in stock.")]
            agent.model = ScriptedModel(steps, context_window=WINDOW)
            start = time.perf_counter()
            if scenario.stream:
                async with agent.stream("Check the items.") as events:
                    async for _ in events:
                        pass
                result = events.result
            else:
                result = await agent.run("Check the items.")
            spent += time.perf_counter() - start
            assert len(result.messages) == 2 * turns + 2, len(result.messages)
        return {"unit": spent / runs / (turns + 1) * 1e6}
    with tempfile.TemporaryDirectory() as tmp:
        if scenario.store == "sqlite":
            store: Any = SQLiteSessionStore(os.path.join(tmp, "sessions.db"))
        else:
            store = InMemorySessionStore()
        agent = _agent_class(scenario.managed, store)()
        runs = 200
        steps: list[Any] = []
        for n in range(runs):
            steps += [_call(n)] if scenario.session_tools else []
            steps.append(_answer(f"Answer {n}."))
        agent.model = ScriptedModel(steps, context_window=WINDOW)
        times = []
        for n in range(runs):
            start = time.perf_counter()
            result = await agent.run(f"Question {n}?", session_id="s")
            times.append(time.perf_counter() - start)
        assert len(result.messages) == (4 if scenario.session_tools else 2) * runs
        if scenario.store == "sqlite":
            await store.aclose()
    return {
        "unit": sum(times) / runs * 1e6,
        "first20": statistics.median(times[:20]) * 1e6,
        "last20": statistics.median(times[-20:]) * 1e6,
    }


def _profile(name: str, top: int) -> None:
    import anyio

    anyio.run(_measure, name)  # warm: imports, schemas
    profile = cProfile.Profile()
    profile.enable()
    anyio.run(_measure, name)
    profile.disable()
    for key in ("cumulative", "tottime"):
        print(f"--- {name}: top {top} by {key}")
        pstats.Stats(profile).sort_stats(key).print_stats(top)


def _run(checkout: Path, name: str) -> dict[str, Any]:
    """Scenario ``name`` in a fresh process on ``checkout``."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--worker", name],
        env={**os.environ, "PYTHONPATH": str(checkout)},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        return {"error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return dict(json.loads(done.stdout))


def _median(rounds: list[dict[str, Any]], key: str) -> float | None:
    values = [figures[key] for figures in rounds if key in figures]
    return statistics.median(values) if values else None


def _shown(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--base", type=Path, help="another checkout, side by side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default=DEFAULT, help=f"of: {', '.join(SCENARIOS)}")
    parser.add_argument("--profile", choices=SCENARIOS)
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument("--worker", choices=SCENARIOS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        import anyio

        print(json.dumps(anyio.run(_measure, args.worker)))
        return
    if args.profile:
        _profile(args.profile, args.top)
        return
    here = Path(__file__).resolve().parent.parent
    checkouts = {"HEAD": here} | ({"base": args.base.resolve()} if args.base else {})
    names = [name for name in args.only.split(",") if name]
    figures: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):  # in turns, so load on a shared machine hits both alike
        for name in names:
            for label, checkout in checkouts.items():
                figures.setdefault((name, label), []).append(_run(checkout, name))
    header = "".join(f"{label:>9}" for label in checkouts)
    print(f"{'scenario':<18}{header}{'  ratio' if args.base else ''}   first20/last20 (µs)")
    for name in names:
        units = [_median(figures[name, label], "unit") for label in checkouts]
        line = f"{name:<18}" + "".join(f"{_shown(unit):>9}" for unit in units)
        if args.base:
            line += f"  {units[0] / units[1]:5.2f}" if all(units) else "      -"
        for label in checkouts:
            first, last = (_median(figures[name, label], key) for key in ("first20", "last20"))
            if first is not None:
                line += f"   {label} {_shown(first)}/{_shown(last)}"
        errors = [f["error"] for label in checkouts for f in figures[name, label] if "error" in f]
        print(line + (f"  ({errors[0]})" if errors else ""))
    print()
    for name in names:
        print(f"{name}: {SCENARIOS[name].about}")


if __name__ == "__main__":
    main()
