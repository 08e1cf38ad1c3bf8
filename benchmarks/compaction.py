"""Token-budget truncation of a long, tool-heavy conversation: littleghost against peers.

One conversation — per turn a user question, an assistant tool call, a tool result of
about 1.6 kB and an assistant answer — at 1k, 10k and 100k messages, trimmed to a fixed
budget of 16 000 tokens (the common case: only the newest few hundred messages fit) and
to a quarter of its estimated tokens (characters ÷ 4), by:

- littleghost: ``await apply_compaction(log, TokenBudget(token_budget=...))``;
- lg+trigger: ``Truncation(trigger=tokens_exceed(budget), minimum_preserved=1)``, the
  same view by a strategy that starts at a token trigger;
- lg+collapse: littleghost's ``TokenBudget`` with ``strategies=[ToolResultCompaction()]``
  (older tool results collapsed to one line each before the oldest groups are dropped);
- agent-framework-core: ``await apply_compaction(messages, strategy=TruncationStrategy(...))``;
- langchain-core: ``trim_messages(..., strategy="last", token_counter="approximate")``;
- the floor: one pass over the littleghost messages summing the UTF-8 bytes of their text
  and their tool results.

*Cold* runs get fresh message objects; *warm* runs the same objects again, as on the next
turn. The contenders take turns: each round runs every one of them once, cold then warm,
on the same conversation (in a rotating order), so load on a shared machine hits them
alike; times are the median of the rounds, with the garbage collector paused while
timing. agent-framework runs in the first round only. A peer that needs over 60 s at
one size is reported as such and not run at larger sizes.

Then the first compaction of the same conversation as one long history, by littleghost
alone: ``await compact_log(agent, log)`` for an agent whose ``@manage_context`` works in a
128 000-token and a 1 000 000-token window (its summary by ``ScriptedModel``): what to
cover chosen, the summary request fitted to the window (a transcript of tens of
megabytes at 100k messages), the rest collapsed; median of 3 cold runs.

Set up once with ``benchmarks/setup.sh``, then run ``benchmarks/.env/bin/python
benchmarks/compaction.py`` (``--sizes 1000,10000`` for a quicker run;
``--first-compaction`` for that part alone, which needs no peers).
"""

from __future__ import annotations

import argparse
import gc
import signal
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from littleghost import Agent, Message, ToolCall, manage_context
from littleghost.context import (
    TokenBudget,
    ToolResultCompaction,
    Truncation,
    apply_compaction,
    tokens_exceed,
)
from littleghost.context.outside import compact_log
from littleghost.messages import SUMMARY_COVERS_KEY
from littleghost.testing import ScriptedModel, text_response

LIMIT_SECONDS = 60


class TooSlow(Exception):
    """A run went over ``LIMIT_SECONDS``."""


def _alarm(signum: int, frame: object) -> None:
    raise TooSlow


def turn_texts(turn: int) -> tuple[str, str, dict[str, str], str, str]:
    """The texts of one turn: question, call id, arguments, result, answer."""
    return (
        f"What is the weather in city number {turn}? Please answer briefly.",
        f"call_{turn}",
        {"city": f"city {turn}"},
        (
            f"sunny, {turn % 30}°C, wind 12 km/h from the north-west, humidity {turn % 90}%; " * 22
        ).strip(),
        f"In city {turn} it is sunny and {turn % 30}°C, with a light north-west wind.",
    )


def littleghost_log(size: int) -> list[Message]:
    log: list[Message] = []
    for turn in range(size // 4):
        question, call_id, arguments, result, answer = turn_texts(turn)
        log.append(Message.user(question))
        log.append(Message.assistant(tool_calls=[ToolCall(call_id, "get_weather", arguments)]))
        log.append(Message.tool(call_id, result))
        log.append(Message.assistant(answer))
    return log


def agent_framework_log(size: int) -> list[Any]:
    from agent_framework import Content
    from agent_framework import Message as AFMessage

    log: list[Any] = []
    for turn in range(size // 4):
        question, call_id, arguments, result, answer = turn_texts(turn)
        log.append(AFMessage("user", [Content.from_text(question)]))
        call = Content.from_function_call(call_id, "get_weather", arguments=arguments)
        log.append(AFMessage("assistant", [call]))
        log.append(AFMessage("tool", [Content.from_function_result(call_id, result=result)]))
        log.append(AFMessage("assistant", [Content.from_text(answer)]))
    return log


def langchain_log(size: int) -> list[Any]:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage

    log: list[Any] = []
    for turn in range(size // 4):
        question, call_id, arguments, result, answer = turn_texts(turn)
        log.append(HumanMessage(question))
        call = {"name": "get_weather", "args": arguments, "id": call_id, "type": "tool_call"}
        log.append(AIMessage("", tool_calls=[call]))
        log.append(ToolMessage(result, tool_call_id=call_id))
        log.append(AIMessage(answer))
    return log


FIXED_BUDGET = 16_000


def quarter_budget(size: int) -> int:
    """A quarter of the conversation's tokens at four characters per token."""
    characters = 0
    for turn in range(size // 4):
        question, _, _, result, answer = turn_texts(turn)
        characters += len(question) + len(result) + len(answer) + 4 * 80
    return characters // 16


Run = Callable[[Any, int], Awaitable[object]]


async def run_littleghost(log: Any, budget: int) -> object:
    return await apply_compaction(log, TokenBudget(token_budget=budget))


async def run_triggered(log: Any, budget: int) -> object:
    strategy = Truncation(trigger=tokens_exceed(budget), minimum_preserved=1)
    return await apply_compaction(log, strategy)


async def run_collapsing(log: Any, budget: int) -> object:
    strategy = TokenBudget(token_budget=budget, strategies=[ToolResultCompaction()])
    return await apply_compaction(log, strategy)


async def run_agent_framework(log: Any, budget: int) -> object:
    from agent_framework._compaction import (
        CharacterEstimatorTokenizer,
        TruncationStrategy,
    )
    from agent_framework._compaction import apply_compaction as af_apply_compaction

    tokenizer = CharacterEstimatorTokenizer()
    strategy = TruncationStrategy(max_n=budget, compact_to=budget, tokenizer=tokenizer)
    return await af_apply_compaction(log, strategy=strategy, tokenizer=tokenizer)


async def run_langchain(log: Any, budget: int) -> object:
    from langchain_core.messages import trim_messages

    return trim_messages(
        log,
        max_tokens=budget,
        token_counter="approximate",
        strategy="last",
        start_on="human",
        include_system=True,
    )


async def run_floor(log: Any, budget: int) -> object:
    return sum(
        len(message.text.encode("utf-8"))
        + sum(len(result.content.encode("utf-8")) for result in message.tool_results)
        for message in log
    )


CONTENDERS: dict[str, tuple[Callable[[int], list[Any]], Run]] = {
    "littleghost": (littleghost_log, run_littleghost),
    "lg+trigger": (littleghost_log, run_triggered),
    "lg+collapse": (littleghost_log, run_collapsing),
    "floor": (littleghost_log, run_floor),
    "agent-framework": (agent_framework_log, run_agent_framework),
    "langchain": (langchain_log, run_langchain),
}


async def timed(run: Run, log: Any, budget: int) -> float:
    gc.collect()
    gc.disable()
    signal.alarm(LIMIT_SECONDS)
    try:
        start = time.perf_counter()
        await run(log, budget)
        return time.perf_counter() - start
    finally:
        signal.alarm(0)
        gc.enable()


async def measure(
    names: list[str], size: int, budget: int, rounds: int
) -> dict[str, tuple[float, float] | None]:
    """The median cold and warm seconds of each of ``names`` at ``size`` messages, over
    ``rounds`` rounds that each run every contender once (``None``: over the limit)."""
    cold: dict[str, list[float]] = {name: [] for name in names}
    warm: dict[str, list[float]] = {name: [] for name in names}
    slow: set[str] = set()
    for round_ in range(rounds):
        turn = names[round_ % len(names) :] + names[: round_ % len(names)]
        for name in turn:
            if name in slow or (name == "agent-framework" and round_ > 0):
                continue
            build, run = CONTENDERS[name]
            log = build(size)
            try:
                cold[name].append(await timed(run, log, budget))
                warm[name].append(await timed(run, log, budget))
            except TooSlow:
                slow.add(name)
    return {
        name: None
        if name in slow
        else (statistics.median(cold[name]), statistics.median(warm[name]))
        for name in names
    }


def milliseconds(seconds: float | None) -> str:
    if seconds is None:
        return f"> {LIMIT_SECONDS} s".rjust(10)
    return f"{seconds * 1000:10.1f}"


async def main(sizes: list[int]) -> None:
    signal.signal(signal.SIGALRM, _alarm)
    names = list(CONTENDERS)
    too_slow: set[tuple[str, str]] = set()
    print(
        "milliseconds, median of interleaved rounds; cold = fresh messages, warm = same log again\n"
    )
    header = f"{'messages':>9} {'budget':>8} {'run':>5} " + " ".join(
        f"{name:>16}" for name in names
    )
    print(header + f" {'lg/floor':>9} {'peer/lg':>8}")
    for size, budget_name in ((size, kind) for size in sizes for kind in ("16k", "quarter")):
        budget = FIXED_BUDGET if budget_name == "16k" else quarter_budget(size)
        running = [name for name in names if (name, budget_name) not in too_slow]
        results = await measure(running, size, budget, 7 if size <= 1_000 else 5)
        too_slow.update((name, budget_name) for name, value in results.items() if value is None)
        for column, label in ((0, "cold"), (1, "warm")):
            cells = []
            for name in names:
                value = results.get(name)
                if value is None:
                    cells.append(f"{'> 60 s' if column == 0 else '-':>16}")
                else:
                    cells.append(f"{milliseconds(value[column]):>16}")
            mine = results["littleghost"]
            floor = results["floor"]
            peers = [
                value[column]
                for name, value in results.items()
                if name in ("agent-framework", "langchain") and value is not None
            ]
            ratio = f"{mine[column] / floor[column]:9.2f}" if mine and floor else f"{'':>9}"
            lead = f"{min(peers) / mine[column]:8.1f}" if mine and peers else f"{'':>8}"
            print(f"{size:>9} {budget_name:>8} {label:>5} " + " ".join(cells) + f" {ratio} {lead}")
    print(
        "\nlg/floor: littleghost ÷ floor; peer/lg: the fastest peer ÷ littleghost "
        "(how many times faster littleghost is)."
    )


FIRST_WINDOWS = (128_000, 1_000_000)


async def first_compaction(size: int, window: int) -> tuple[float, int]:
    """The seconds ``compact_log`` takes on a fresh log of ``size`` messages in ``window``,
    and how many messages its summary covers."""
    model = ScriptedModel([text_response("- They asked about the weather in many cities.")])
    agent = manage_context(context_window_override=window)(type("Long", (Agent,), {}))(model=model)
    log = littleghost_log(size)
    gc.collect()
    gc.disable()
    try:
        start = time.perf_counter()
        records = await compact_log(agent, log)
        seconds = time.perf_counter() - start
    finally:
        gc.enable()
    return seconds, sum(len(r.metadata[SUMMARY_COVERS_KEY]) for r in records if r.is_summary)


async def first_compactions(sizes: list[int]) -> None:
    print(
        "\nfirst compaction of the whole log (compact_log), milliseconds, median of 3 cold runs\n"
    )
    print(f"{'messages':>9} {'window':>10} {'ms':>10} {'summarized':>11}")
    for size in sizes:
        for window in FIRST_WINDOWS:
            runs = [await first_compaction(size, window) for _ in range(3)]
            seconds = statistics.median(seconds for seconds, _ in runs)
            print(f"{size:>9} {window:>10} {milliseconds(seconds)} {runs[0][1]:>11}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="1000,10000,100000", help="message counts, comma-separated"
    )
    parser.add_argument(
        "--first-compaction", action="store_true", help="only the first compaction (no peers)"
    )
    arguments = parser.parse_args()
    chosen = [int(size) for size in arguments.sizes.split(",")]
    if not arguments.first_compaction:
        anyio.run(main, chosen)
    anyio.run(first_compactions, chosen)
