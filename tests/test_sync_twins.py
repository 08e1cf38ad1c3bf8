"""``run_sync()`` against its async twins: each case runs through ``run()`` (under asyncio
and trio), ``stream()`` read whole and ``run_sync()``, each on a fresh agent, and every
path must give the same result or error, the same spans and the same stored log (the
keyword a ``TypeError`` names, and the line a warning points at, are each path's own)."""

from __future__ import annotations

import math
import random
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import anyio
import pytest
from attrs import field, frozen
from pydantic import BaseModel

from littleghost import Agent, Message, RunResult, after_tool, before_model, tool
from littleghost.errors import ProviderError
from littleghost.models.base import Model, ModelRequest
from littleghost.run import RunContext
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import (
    ScriptedModel,
    text_response,
    tool_call_response,
    tool_calls_response,
)
from tests.conftest import Spans

_PER_CALL = frozenset(
    {
        "gen_ai.tool.call.id",
        "gen_ai.conversation.id",  # each path continues a session of its own
        "gen_ai.request.stream",  # stream() streams its model calls
        "gen_ai.response.time_to_first_chunk",
    }
)
"""Span attributes that differ by call or by path, not by behaviour."""


def scripted(*steps: Any) -> ScriptedModel:
    return ScriptedModel(steps)


class Looking(Agent):
    instructions = "Be brief."
    session_store = InMemorySessionStore()

    @tool
    async def look(self, q: str) -> str:
        """Look ``q`` up."""
        if q == "boom":
            raise ValueError("the lookup broke")
        return f"found {q}"

    @tool(timeout=0.05)
    async def stall(self) -> str:
        """Take too long."""
        await anyio.sleep_forever()
        raise AssertionError("not reached")

    @tool
    def count(self, n: int) -> int:
        """Count on from ``n``, in a worker thread."""
        if n < 0:
            raise SystemExit(f"cannot count from {n}")
        return n + 1

    @tool
    async def wait(self) -> str:
        """Wait until stopped."""
        await anyio.sleep_forever()
        raise AssertionError("not reached")


class Undeclared(Agent):
    """Declares no model."""


class Resolving(Looking):
    """Makes its model itself, whatever its model string says."""

    model = "nowhere:model"

    def resolve_model(self) -> Model:
        return ScriptedModel([text_response("made by the class")])


class ResolvingNothing(Looking):
    model = "nowhere:model"

    def resolve_model(self) -> Model:
        return "a model string"  # type: ignore[return-value]


class FailingHook(Looking):
    @before_model
    def refuse(self, request: ModelRequest, *, context: RunContext) -> None:
        if context.turn == 1:
            raise RuntimeError("the hook broke")


class Interrupted(Looking):
    @after_tool
    def interrupt(self, result: Any, *, context: RunContext) -> None:
        raise KeyboardInterrupt


class Delegating(Looking):
    @tool
    def delegate(self, task: str) -> str:
        """Hand ``task`` to a helper, in this sync tool's thread."""
        return Agent(model=scripted(text_response(f"{task} done"))).run_sync(task).output


class Count(BaseModel):
    n: int


@frozen
class Case:
    name: str
    agent: Callable[[], Agent]
    options: Mapping[str, Any] = field(factory=dict)
    stored: str | None = None
    """A session the run continues, holding one exchange already."""


CASES = [
    Case("an answer", lambda: Looking(model=scripted(text_response("hi")))),
    Case(
        "a tool round trip",
        lambda: Looking(
            model=scripted(tool_call_response("look", {"q": "x"}), text_response("ok"))
        ),
    ),
    Case(
        "a failing tool",
        lambda: Looking(
            model=scripted(tool_call_response("look", {"q": "boom"}), text_response("ok"))
        ),
    ),
    Case(
        "a tool past its timeout",
        lambda: Looking(model=scripted(tool_call_response("stall", {}), text_response("ok"))),
    ),
    Case(
        "a sync tool",
        lambda: Looking(model=scripted(tool_call_response("count", {"n": 1}), text_response("2"))),
    ),
    Case(
        "SystemExit in a sync tool",
        lambda: Looking(model=scripted(tool_call_response("count", {"n": -1}), text_response("2"))),
        stored="exited",
    ),
    Case(
        "a sub-agent run_sync() in a sync tool",
        lambda: Delegating(
            model=scripted(tool_call_response("delegate", {"task": "t"}), text_response("ok"))
        ),
    ),
    Case(
        "a typed answer",
        lambda: Looking(model=scripted(text_response('{"n": 3}'))),
        {"output_type": Count},
    ),
    Case(
        "an answer that misfits twice",
        lambda: Looking(model=scripted(text_response("{}"), text_response("{}"))),
        {"output_type": Count},
    ),
    Case("no model declared", Undeclared),
    Case("a model string no provider resolves", lambda: Looking(model="nowhere:model")),
    Case("a class that makes its model", Resolving),
    Case("a class whose resolve_model gives no model", ResolvingNothing),
    Case(
        "mistyped settings",
        lambda: Looking(model=scripted(text_response("hi"))),
        {"settings": {"temperature": "warm"}},
    ),
    Case("no time", lambda: Looking(model=scripted(text_response("hi"))), {"timeout": 0}),
    Case(
        "the run's deadline in a tool",
        lambda: Looking(model=scripted(tool_call_response("wait", {}))),
        {"timeout": 0.05},
        stored="late",
    ),
    Case(
        "a deadline passed",
        lambda: Looking(model=scripted(text_response("hi"))),
        {"deadline": -math.inf},
    ),
    Case(
        "too many turns",
        lambda: Looking(model=scripted(*[tool_call_response("look", {"q": "x"})] * 2), max_turns=2),
    ),
    Case(
        "a provider's error",
        lambda: Looking(model=scripted(ProviderError("refused", status=400)), max_retries=0),
    ),
    Case(
        "a failing hook",
        lambda: FailingHook(
            model=scripted(tool_call_response("look", {"q": "x"}), text_response("ok"))
        ),
        stored="hook",
    ),
    Case(
        "Ctrl-C in a hook",
        lambda: Interrupted(
            model=scripted(tool_call_response("look", {"q": "x"}), text_response("ok"))
        ),
        stored="interrupted",
    ),
    Case(
        "a session and a history it ignores",
        lambda: Looking(model=scripted(text_response("again"))),
        {"history": [Message.user("other"), Message.assistant("history")]},
        stored="continued",
    ),
    Case(
        "a history that is no list of messages",
        lambda: Looking(model=scripted(text_response("hi"))),
        {"history": ["not a message"]},
    ),
]


def _through_run(agent: Agent, options: dict[str, Any], backend: str) -> RunResult[Any]:
    async def run() -> RunResult[Any]:
        return await agent.run("question", **options)

    return anyio.run(run, backend=backend)


def _through_stream(agent: Agent, options: dict[str, Any], backend: str) -> RunResult[Any]:
    async def run() -> RunResult[Any]:
        async with agent.stream("question", **options) as events:
            async for _ in events:
                pass
        return events.result

    return anyio.run(run, backend=backend)


def _through_run_sync(agent: Agent, options: dict[str, Any], backend: str) -> RunResult[Any]:
    return agent.run_sync("question", **options)


PATHS = {
    "run, asyncio": (_through_run, "asyncio"),
    "run, trio": (_through_run, "trio"),
    "stream, asyncio": (_through_stream, "asyncio"),
    "stream, trio": (_through_stream, "trio"),
    "run_sync": (_through_run_sync, "asyncio"),
}


def _messages(messages: Any) -> list[tuple[Any, ...]]:
    return [
        (
            message.role,
            message.text,
            [call.name for call in message.tool_calls],
            [result.content for result in message.tool_results],
        )
        for message in messages
    ]


def _outcome(case: Case, path: str, spans: Spans) -> dict[str, Any]:
    """What ``case`` gives through ``path``: its result or error, spans, stored log and
    the warnings' texts."""
    through, backend = PATHS[path]
    agent = case.agent()
    options = dict(case.options)
    session = None
    if case.stored is not None:
        session = options["session_id"] = f"{case.stored}, {path}"
        anyio.run(agent.session_store.append, session, [Message.user("a"), Message.assistant("b")])
    spans.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            result = through(agent, options, backend)
            ended: tuple[Any, ...] = (
                repr(result.output),
                result.stop_reason,
                result.usage,
                _messages(result.messages),
            )
        except BaseException as error:  # KeyboardInterrupt included
            ended = (
                type(error),
                str(error),
                type(error.__cause__),
                getattr(error, "run_usage", None),
            )
    stored = None if session is None else anyio.run(agent.session_store.load, session)
    names = {span.context.span_id: span.name for span in spans.all() if span.context}
    return {
        "ended": ended,
        "spans": [
            (
                span.name,
                span.parent and names.get(span.parent.span_id, "outside"),
                span.status.status_code,
                span.status.description,
                {k: v for k, v in (span.attributes or {}).items() if k not in _PER_CALL},
            )
            for span in spans.all()
        ],
        "stored": None if stored is None else _messages(stored),
        "warnings": [(warning.category, str(warning.message)) for warning in caught],
        "open spans": spans.still_open,
        "requests": [
            _messages(request.messages)
            for request in getattr(agent.model, "requests", ())  # a ScriptedModel's
        ],
    }


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_every_path_ends_alike(case: Case, spans: Spans) -> None:
    """Each path gives the result, error, spans, stored log and warnings of ``run()``
    under asyncio (``run_sync()`` of a class that declares no model raised before its
    run: no ``invoke_agent`` span said the run failed)."""
    outcomes = {path: _outcome(case, path, spans) for path in PATHS}
    first = outcomes["run, asyncio"]
    assert not first["open spans"]
    for path, outcome in outcomes.items():
        assert outcome == first, path


def _random_case(seed: int) -> Case:
    """A script of parallel calls (of tools that answer, fail, time out, exit the
    process or are not declared) ending in an answer, typed or not, under a turn limit
    it may reach, with or without a stored session."""
    chance = random.Random(seed)
    calls = [
        ("look", {"q": "x"}),
        ("look", {"q": "boom"}),
        ("count", {"n": 2}),
        ("count", {"n": -1}),
        ("stall", {}),
        ("undeclared", {}),
    ]
    steps = [
        tool_calls_response(*chance.choices(calls, k=chance.randint(1, 3)))
        for _ in range(chance.randint(0, 3))
    ]
    typed = chance.random() < 0.3
    steps.append(text_response('{"n": 1}' if typed and chance.random() < 0.7 else "an answer"))
    turns = chance.randint(1, 5)
    return Case(
        f"seed {seed}",
        lambda: Looking(model=scripted(*steps), max_turns=turns),
        {"output_type": Count} if typed else {},
        stored=f"random {seed}" if chance.random() < 0.5 else None,
    )


@pytest.mark.parametrize("seed", range(16))
def test_random_scripts_end_alike(seed: int, spans: Spans) -> None:
    """As ``test_every_path_ends_alike``, for random scripts (the spans of parallel calls
    in any order)."""
    case = _random_case(seed)
    outcomes = {path: _outcome(case, path, spans) for path in PATHS}
    for outcome in outcomes.values():
        outcome["spans"] = sorted(map(repr, outcome["spans"]))
    first = outcomes["run, asyncio"]
    assert not first["open spans"]
    for path, outcome in outcomes.items():
        assert outcome == first, path
