"""No content and no credential in telemetry or logs by default: a canary scan.

Every secret and every piece of content of a run carries ``CANARY``; each case drives one
path (tools failing, provider errors, repairs, hooks, summaries, overflow, streams,
sessions, the bounded view, the real SDKs over a mock transport at DEBUG with a base URL
and key holding credentials), and nothing a span exporter or a log handler receives may
hold it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anthropic
import attrs
import httpx2
import openai
import pydantic
import pytest

from littleghost import Agent, Message, before_tool, manage_context, tool
from littleghost.context.budget import PromptBudget
from littleghost.errors import ContextWindowOverflowError, InvalidRequestError
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel
from littleghost.sessions import SQLiteSessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

if TYPE_CHECKING:
    from conftest import Spans

pytestmark = pytest.mark.anyio

CANARY = "CANARY-7f3a"
BASE_URL = f"https://user-{CANARY}:pw-{CANARY}@proxy.example:8443/v1?key={CANARY}"


class _Everything(logging.Handler):
    """Every record at any level, formatted with its traceback."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.texts.append(self.format(record))


@pytest.fixture
def logged() -> Iterator[list[str]]:
    handler, root = _Everything(), logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler.texts
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


@attrs.frozen
class Order:
    id: int
    note: str


class Support(Agent):
    instructions = f"You help {CANARY}."
    max_retries = 1

    @tool
    def lookup(self, order_id: int, note: str = "") -> str:
        """Look an order up."""
        if note == "fail":
            raise ValueError(f"no order {order_id} for {CANARY}")
        return f"order {order_id}: {CANARY}"


class Guarded(Support):
    @before_tool
    def refuse(self, call: Any) -> None:
        raise RuntimeError(f"refused {call.arguments} {CANARY}")


@manage_context(compression_threshold=0.5, preserve_recent_messages=2, context_window_tokens=600)
class Managed(Support):
    pass


@manage_context(
    budget=PromptBudget(
        prompt_budget_tokens=2_000,
        response_reserve_tokens=200,
        safety_reserve_tokens=100,
        memory=lambda context: [f"memory {CANARY}"],
    ),
    summarize=False,
)
class Bounded(Support):
    pass


HISTORY = [
    message
    for turn in range(12)
    for message in (
        Message.user(f"question {turn} {CANARY} " + "x" * 120),
        Message.assistant(f"answer {turn} {CANARY} " + "y" * 120),
    )
]


def scripted(*steps: Any) -> ScriptedModel:
    return ScriptedModel(list(steps))


async def tools(tmp_path: Path) -> None:
    model = scripted(
        tool_call_response("lookup", {"order_id": 1, "note": CANARY}),
        tool_call_response("lookup", {"order_id": 2, "note": "fail"}),
        tool_call_response("lookup", {"order_id": CANARY}),
        tool_call_response(f"lookup_{CANARY}", {"x": CANARY}),
        text_response(f"done {CANARY}"),
    )
    await Support(model=model).run(f"input {CANARY}", history=HISTORY[:4])


async def provider_400(tmp_path: Path) -> None:
    error = InvalidRequestError(f"bad request quoting {CANARY}", status=400, provider="x")
    await Support(model=scripted(error)).run(f"input {CANARY}")


async def provider_raises(tmp_path: Path) -> None:
    await Support(model=scripted(RuntimeError(f"weird {CANARY}"))).run(f"input {CANARY}")


async def output_repair(tmp_path: Path) -> None:
    model = scripted(text_response(f"not json {CANARY}"), text_response(f"still {CANARY}"))
    await Support(model=model, output_type=Order).run(f"input {CANARY}")


class Note(pydantic.BaseModel):
    text: str

    @pydantic.field_validator("text")
    @classmethod
    def _refuse(cls, value: str) -> str:
        raise ValueError(f"refused {value}")


class Noted(Support):
    @tool
    def add(self, note: Note) -> str:
        """Add a note."""
        return note.text


async def pydantic_misfits(tmp_path: Path) -> None:
    model = scripted(
        tool_call_response("add", {"note": {"text": CANARY}}),
        text_response(json.dumps({"text": CANARY})),
        text_response(json.dumps({"text": f"again {CANARY}"})),
    )
    await Noted(model=model, output_type=Note).run(f"input {CANARY}")


async def hook_raises(tmp_path: Path) -> None:
    model = scripted(tool_call_response("lookup", {"order_id": 1, "note": CANARY}))
    await Guarded(model=model).run(f"input {CANARY}")


async def summary(tmp_path: Path) -> None:
    model = scripted(text_response(f"summary {CANARY}"), text_response(f"answer {CANARY}"))
    await Managed(model=model).run(f"input {CANARY}", history=HISTORY)


async def summary_fails(tmp_path: Path) -> None:
    model = scripted(RuntimeError(f"summary {CANARY}"), text_response(f"answer {CANARY}"))
    await Managed(model=model).run(f"input {CANARY}", history=HISTORY)


async def overflow(tmp_path: Path) -> None:
    model = scripted(
        ContextWindowOverflowError(f"too long {CANARY}", provider="x"),
        text_response(f"summary {CANARY}"),
        text_response(f"answer {CANARY}"),
    )
    await Managed(model=model).run(f"input {CANARY}", history=HISTORY[:6])


async def stream_with_session(tmp_path: Path) -> None:
    store = SQLiteSessionStore(str(tmp_path / "sessions.db"))
    model = scripted(
        tool_call_response("lookup", {"order_id": 1, "note": CANARY}),
        text_response(f"answer {CANARY}"),
    )
    async with (
        store,
        Support(model=model, session_store=store).stream(
            f"input {CANARY}", session_id="s1"
        ) as events,
    ):
        async for _ in events:
            pass


async def bounded_view(tmp_path: Path) -> None:
    model = scripted(text_response(f"answer {CANARY}"))
    await Bounded(model=model).run(f"input {CANARY}", history=HISTORY)


def openai_server(request: httpx2.Request) -> httpx2.Response:
    """Answers a tool call, then echoes the request in a 400, as vLLM's validation does."""
    body = json.loads(request.content)
    if len(body["messages"]) < 3:
        call: dict[str, Any] = {"id": "c1", "type": "function"}
        call["function"] = {"name": "lookup", "arguments": json.dumps({"order_id": 1})}
        message = {"role": "assistant", "content": None, "tool_calls": [call]}
        choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
        return httpx2.Response(200, json={"id": "x", "model": "m", "choices": [choice]})
    error = {"message": f"invalid: {json.dumps(body)}", "type": "invalid_request_error"}
    return httpx2.Response(400, json={"error": error})


async def openai_sdk(tmp_path: Path) -> None:
    client = openai.AsyncOpenAI(
        api_key=CANARY,
        base_url=BASE_URL,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(openai_server)),
    )
    async with client:
        model = OpenAIModel("m", client=client, context_window=8_000)
        await Support(model=model).run(f"input {CANARY}")


def anthropic_server(request: httpx2.Request) -> httpx2.Response:
    """Echoes the request in a 500 (retried once, then raised)."""
    error = {"type": "api_error", "message": f"failed: {request.content.decode()}"}
    return httpx2.Response(500, json={"type": "error", "error": error})


async def anthropic_sdk(tmp_path: Path) -> None:
    client = anthropic.AsyncAnthropic(
        api_key=CANARY,
        base_url=BASE_URL,
        http_client=httpx2.AsyncClient(transport=httpx2.MockTransport(anthropic_server)),
    )
    async with client:
        await Support(model=AnthropicModel("claude-x", client=client)).run(f"input {CANARY}")


CASES: list[Callable[[Path], Awaitable[None]]] = [
    tools,
    provider_400,
    provider_raises,
    output_repair,
    pydantic_misfits,
    hook_raises,
    summary,
    summary_fails,
    overflow,
    stream_with_session,
    bounded_view,
    openai_sdk,
    anthropic_sdk,
]


@pytest.mark.parametrize("case", CASES, ids=[case.__name__ for case in CASES])
async def test_no_canary_reaches_spans_or_logs(
    spans: Spans, logged: list[str], tmp_path: Path, case: Callable[[Path], Awaitable[None]]
) -> None:
    try:
        await case(tmp_path)
    except Exception:  # several paths end the run with an error: what it emitted counts
        pass
    assert spans.all()
    leaks = [text for text in [*spans.every_text(), *logged] if CANARY in text]
    assert not leaks
