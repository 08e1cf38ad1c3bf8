"""No content and no credential in telemetry or logs unless the agent opts in: a canary scan.

Every secret and every piece of content of a run carries ``CANARY``: input, instructions,
history and its metadata, tool arguments and results, what tools, hooks, models and
stores raise, summaries, structured output, provider error bodies that echo the request,
API keys and base URLs with credentials. Each case drives one path (tools failing,
provider errors, repairs, every kind of hook raising, summaries, overflow, streams,
sessions, the bounded view, compactions outside runs, the real SDKs over a mock transport
at DEBUG), once with ``capture_content`` off and once on. With it off, nothing a span
exporter, a metric exporter, a log handler (every record at every level, as a JSON
formatter ships it), the warnings filter or standard output and error receive may hold
it; with it on, spans may (and do, where a request reached a model), the rest never. A
campaign of the fault-injection harness, its content and faults carrying
``tests.faults.SECRET``, is scanned the same way; so are drawn runs, which with
``capture_content`` on must also hold on their spans all that capturing promises.
"""

from __future__ import annotations

import json
import logging
import random
import time
import warnings
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import httpx2
import openai
import pydantic
import pytest

from littleghost import (
    Agent,
    Message,
    after_model,
    after_model_error,
    after_tool,
    before_model,
    before_tool,
    manage_context,
    tool,
)
from littleghost.context import Summarization, apply_compaction, compact_session
from littleghost.context.budget import PromptBudget
from littleghost.context.outside import compact_log
from littleghost.errors import (
    ContextWindowOverflowError,
    InvalidRequestError,
    OutputValidationError,
    ProviderUnavailableError,
    RateLimitError,
    SessionStoreError,
)
from littleghost.models import ModelRequest, ModelResponse
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel
from littleghost.sessions import InMemorySessionStore, SQLiteSessionStore
from littleghost.testing import (
    ScriptedModel,
    streamed,
    text_response,
    tool_call_response,
    tool_calls_response,
)
from tests.faults import SECRET, campaign
from tests.sdk_bodies import (
    anthropic_client,
    chunk,
    completion,
    error_answer,
    event_stream,
    openai_client,
    openai_sse,
)

if TYPE_CHECKING:
    from conftest import Histograms, Spans

pytestmark = pytest.mark.anyio

CANARY = "CANARY-7f3a"
BASE_URL = f"https://user-{CANARY}:pw-{CANARY}@proxy.example:8443/v1?key={CANARY}"


_PLAIN_RECORD = {*vars(logging.makeLogRecord({})), "message", "asctime"}
"""The attributes every log record has; the others are what it was given (``extra``,
littleghost's ``littleghost`` names)."""


class _Everything(logging.Handler):
    """Every record at any level, as a JSON formatter would ship it: the message with its
    traceback and stack, its arguments, and every attribute it was given."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        given = {name: value for name, value in vars(record).items() if name not in _PLAIN_RECORD}
        self.texts.append(f"{self.format(record)} args={record.args!r} given={given!r}")


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


class Warned:
    """The warnings issued so far, each time (recorded, not raised as the suite's
    ``filterwarnings = error`` would)."""

    def __init__(self, caught: list[warnings.WarningMessage]) -> None:
        self.caught = caught

    def texts(self) -> list[str]:
        return [str(warning.message) for warning in self.caught]


@pytest.fixture
def warned() -> Iterator[Warned]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield Warned(caught)


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

    @tool
    async def both(self, note: str) -> str:
        """Fail twice at once (an exception group)."""

        async def fail() -> None:
            raise ValueError(f"failed {note}")

        async with anyio.create_task_group() as group:
            group.start_soon(fail)
            group.start_soon(fail)
        return note

    @tool(timeout=0.05)
    async def hang(self, note: str) -> str:
        """Never answer in time."""
        await anyio.sleep(60)
        return note

    @tool(timeout=0.05)
    def block(self, note: str) -> str:
        """Block a worker thread past the timeout, then fail."""
        time.sleep(0.2)
        raise ValueError(f"late {note}")


class Guarded(Support):
    @before_tool
    def refuse(self, call: Any) -> None:
        raise RuntimeError(f"refused {call.arguments} {CANARY}")


class BeforeModelRaises(Support):
    @before_model
    def refuse(self, request: Any) -> None:
        raise RuntimeError(f"refused {request.messages[-1].text}")


class AfterModelRaises(Support):
    @after_model
    def refuse(self, response: Any) -> None:
        raise RuntimeError(f"refused {response.message.text}")


class AfterToolRaises(Support):
    @after_tool
    def refuse(self, result: Any) -> None:
        raise RuntimeError(f"refused {result.content}")


class AfterModelErrorRaises(Support):
    @after_model_error
    def refuse(self, request: Any, error: Exception) -> None:
        raise RuntimeError(f"refused {error}")


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
        Message.user(f"question {turn} {CANARY} " + "x" * 120, metadata={"note": CANARY}),
        Message.assistant(f"answer {turn} {CANARY} " + "y" * 120, metadata={"note": CANARY}),
    )
]


def scripted(*steps: Any) -> ScriptedModel:
    return ScriptedModel(list(steps))


async def tools(tmp_path: Path, capture: bool) -> None:
    model = scripted(
        tool_call_response("lookup", {"order_id": 1, "note": CANARY}),
        tool_call_response("lookup", {"order_id": 2, "note": "fail"}),
        tool_call_response("both", {"note": CANARY}),
        tool_call_response("lookup", {"order_id": CANARY}),
        tool_call_response(f"lookup_{CANARY}", {"x": CANARY}),
        tool_call_response("hang", {"note": CANARY}),
        text_response(f"done {CANARY}"),
    )
    agent = Support(model=model, capture_content=capture)
    await agent.run(f"input {CANARY}", history=HISTORY[:4])


async def late_thread(tmp_path: Path, capture: bool) -> None:
    """A sync tool the run stopped waiting for fails later: its failure is logged."""
    model = scripted(tool_call_response("block", {"note": CANARY}), text_response(CANARY))
    await Support(model=model, capture_content=capture).run(f"input {CANARY}")
    await anyio.sleep(0.3)


async def provider_400(tmp_path: Path, capture: bool) -> None:
    error = InvalidRequestError(f"bad request quoting {CANARY}", status=400, provider="x")
    await Support(model=scripted(error), capture_content=capture).run(f"input {CANARY}")


async def provider_raises(tmp_path: Path, capture: bool) -> None:
    model = scripted(RuntimeError(f"weird {CANARY}"))
    await Support(model=model, capture_content=capture).run(f"input {CANARY}")


async def rate_limited(tmp_path: Path, capture: bool) -> None:
    error = RateLimitError(f"slow down {CANARY}", provider="x", retry_after=0.01)
    model = scripted(error, text_response(f"answer {CANARY}"))
    await Support(model=model, capture_content=capture).run(f"input {CANARY}")


async def output_repair(tmp_path: Path, capture: bool) -> None:
    """A typed answer as text, then through the final-result tool, misfitting each time."""
    model = scripted(text_response(f"not json {CANARY}"), text_response(f"still {CANARY}"))
    with pytest.raises(OutputValidationError):
        await Support(model=model, output_type=Order, capture_content=capture).run(CANARY)
    model = scripted(
        tool_call_response("final_result", {"id": CANARY, "note": CANARY}),
        tool_call_response("final_result", {"id": 1, "note": {"text": CANARY}}),
    )
    agent = Support(model=model, output_type=Order, output_strategy="tool", capture_content=capture)
    with pytest.raises(OutputValidationError):
        await agent.run(f"input {CANARY}")


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


async def pydantic_misfits(tmp_path: Path, capture: bool) -> None:
    model = scripted(
        tool_call_response("add", {"note": {"text": CANARY}}),
        text_response(json.dumps({"text": CANARY})),
        text_response(json.dumps({"text": f"again {CANARY}"})),
    )
    await Noted(model=model, output_type=Note, capture_content=capture).run(f"input {CANARY}")


class Weight(pydantic.BaseModel):
    grams: int


class Weighing(Support):
    @tool
    def weigh(self) -> Weight:
        """Weigh the parcel: a result built past validation, its field of the wrong type."""
        return Weight.model_construct(grams=f"about {CANARY}")


async def pydantic_result(tmp_path: Path, capture: bool) -> None:
    """pydantic warns of a field of an unexpected type as it dumps it, quoting it."""
    model = scripted(tool_call_response("weigh", {}), text_response(f"answer {CANARY}"))
    await Weighing(model=model, capture_content=capture).run(f"input {CANARY}")


async def hook_raises(tmp_path: Path, capture: bool) -> None:
    model = scripted(tool_call_response("lookup", {"order_id": 1, "note": CANARY}))
    await Guarded(model=model, capture_content=capture).run(f"input {CANARY}")


HOOKED = [BeforeModelRaises, AfterModelRaises, AfterToolRaises, AfterModelErrorRaises]


async def hooks_raise(tmp_path: Path, capture: bool) -> None:
    """Each kind of hook raises, quoting what it was given."""
    for kind in HOOKED:
        model = scripted(
            InvalidRequestError(f"bad {CANARY}", status=400, provider="x")
            if kind is AfterModelErrorRaises
            else tool_call_response("lookup", {"order_id": 1, "note": CANARY}),
            text_response(f"answer {CANARY}"),
        )
        with pytest.raises(RuntimeError, match="refused"):
            await kind(model=model, capture_content=capture).run(f"input {CANARY}")


async def summary(tmp_path: Path, capture: bool) -> None:
    model = scripted(text_response(f"summary {CANARY}"), text_response(f"answer {CANARY}"))
    await Managed(model=model, capture_content=capture).run(f"input {CANARY}", history=HISTORY)


async def summary_fails(tmp_path: Path, capture: bool) -> None:
    model = scripted(RuntimeError(f"summary {CANARY}"), text_response(f"answer {CANARY}"))
    await Managed(model=model, capture_content=capture).run(f"input {CANARY}", history=HISTORY)


async def overflow(tmp_path: Path, capture: bool) -> None:
    model = scripted(
        ContextWindowOverflowError(f"too long {CANARY}", provider="x"),
        text_response(f"summary {CANARY}"),
        text_response(f"answer {CANARY}"),
    )
    agent = Managed(model=model, capture_content=capture)
    await agent.run(f"input {CANARY}", history=HISTORY[:6])


async def outside_runs(tmp_path: Path, capture: bool) -> None:
    """Compactions outside runs: an agent's (content only with its capture_content),
    a stored session's and an ad hoc one, failing with the text of the model's error."""
    model = scripted(text_response(f"summary {CANARY}"))
    await compact_log(Managed(model=model, capture_content=capture), HISTORY)
    store = InMemorySessionStore()
    await store.append("s1", HISTORY)
    strategy = Summarization(model=scripted(text_response(f"summary {CANARY}")))
    await compact_session(store, "s1", strategy)
    failing = Summarization(model=scripted(RuntimeError(f"summary {CANARY}")))
    with pytest.raises(RuntimeError, match="summary"):
        await apply_compaction(HISTORY, failing)


class FailingStore(InMemorySessionStore):
    """A store whose appends fail, quoting what they were given."""

    async def append(self, session_id: str, messages: Any) -> None:
        if any(message.role.value == "assistant" for message in messages):
            raise SessionStoreError(f"cannot store {list(messages)!r}")
        await super().append(session_id, messages)


async def store_fails(tmp_path: Path, capture: bool) -> None:
    model = scripted(tool_call_response("lookup", {"order_id": 1, "note": CANARY}))
    agent = Support(model=model, session_store=FailingStore(), capture_content=capture)
    await agent.run(f"input {CANARY}", session_id="s1")


async def stream_with_session(tmp_path: Path, capture: bool) -> None:
    store = SQLiteSessionStore(str(tmp_path / "sessions.db"))
    model = scripted(
        tool_call_response("lookup", {"order_id": 1, "note": CANARY}),
        text_response(f"answer {CANARY}"),
    )
    async with (
        store,
        Support(model=model, session_store=store, capture_content=capture).stream(
            f"input {CANARY}", session_id="s1"
        ) as events,
    ):
        async for _ in events:
            pass


async def bounded_view(tmp_path: Path, capture: bool) -> None:
    model = scripted(text_response(f"answer {CANARY}"))
    await Bounded(model=model, capture_content=capture).run(f"input {CANARY}", history=HISTORY)


def openai_server(request: httpx2.Request) -> httpx2.Response:
    """Answers a tool call, then echoes the request in a 400, as vLLM's validation does."""
    body = json.loads(request.content)
    if len(body["messages"]) < 3:
        call: dict[str, Any] = {"id": "c1", "type": "function"}
        call["function"] = {"name": "lookup", "arguments": json.dumps({"order_id": 1})}
        return completion({"tool_calls": [call]}, "tool_calls")
    error = {"message": f"invalid: {json.dumps(body)}", "type": "invalid_request_error"}
    return error_answer(400, {"error": error})


async def openai_sdk(tmp_path: Path, capture: bool) -> None:
    async with openai_client(openai_server, CANARY, BASE_URL) as client:
        model = OpenAIModel("m", client=client, context_window=8_000)
        await Support(model=model, capture_content=capture).run(f"input {CANARY}")


def openai_misfit(request: httpx2.Request) -> httpx2.Response:
    """Answers structured output that does not fit, quoting the request in it."""
    return completion({"content": json.dumps({"id": request.content.decode(), "note": 1})})


async def openai_structured(tmp_path: Path, capture: bool) -> None:
    async with openai_client(openai_misfit, CANARY, BASE_URL) as client:
        agent = Support(model=OpenAIModel("gpt-4o", client=client), capture_content=capture)
        await agent.run(f"input {CANARY}", output_type=Order)


def openai_stream_error(request: httpx2.Request) -> httpx2.Response:
    """Streams some text, then an error event that echoes the request."""
    error = {"error": {"message": f"failed: {request.content.decode()}", "type": "server_error"}}
    return event_stream(openai_sse(chunk({"content": f"part {CANARY}"}), error, done=False))


async def openai_stream(tmp_path: Path, capture: bool) -> None:
    async with openai_client(openai_stream_error, CANARY, BASE_URL) as client:
        model = OpenAIModel("m", client=client, context_window=8_000)
        agent = Support(model=model, capture_content=capture)
        async with agent.stream(f"input {CANARY}") as events:
            async for _ in events:
                pass


def anthropic_server(request: httpx2.Request) -> httpx2.Response:
    """Echoes the request in a 500 (retried once, then raised)."""
    error = {"type": "api_error", "message": f"failed: {request.content.decode()}"}
    return error_answer(500, {"type": "error", "error": error})


async def anthropic_sdk(tmp_path: Path, capture: bool) -> None:
    async with anthropic_client(anthropic_server, CANARY, BASE_URL) as client:
        model = AnthropicModel("claude-x", client=client)
        await Support(model=model, capture_content=capture).run(f"input {CANARY}")


def anthropic_overflowing(request: httpx2.Request) -> httpx2.Response:
    """Every message overflows; every prompt count fails echoing the request."""
    if request.url.path.endswith("count_tokens"):
        message = f"bad: {request.content.decode()}"
    else:
        message = f"prompt is too long: 300000 tokens > 200000 maximum {CANARY}"
    error = {"type": "invalid_request_error", "message": message}
    return error_answer(400, {"type": "error", "error": error})


async def anthropic_overflow(tmp_path: Path, capture: bool) -> None:
    async with anthropic_client(anthropic_overflowing, CANARY, BASE_URL) as client:
        agent = Managed(model=AnthropicModel("claude-x", client=client), capture_content=capture)
        # a max_tokens under the 600-token window (the model's default 4 096 is not)
        await agent.run(f"input {CANARY}", history=HISTORY[:4], settings={"max_tokens": 100})


CASES: list[Callable[[Path, bool], Awaitable[None]]] = [
    tools,
    late_thread,
    provider_400,
    provider_raises,
    rate_limited,
    output_repair,
    pydantic_misfits,
    pydantic_result,
    hook_raises,
    hooks_raise,
    summary,
    summary_fails,
    overflow,
    outside_runs,
    store_fails,
    stream_with_session,
    bounded_view,
    openai_sdk,
    openai_structured,
    openai_stream,
    anthropic_sdk,
    anthropic_overflow,
]


@pytest.mark.parametrize("capture", [False, True], ids=["default", "capture_content"])
@pytest.mark.parametrize("case", CASES, ids=[case.__name__ for case in CASES])
async def test_no_canary_reaches_telemetry_or_logs_unless_captured(
    spans: Spans,
    histograms: Histograms,
    logged: list[str],
    warned: Warned,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
    case: Callable[[Path, bool], Awaitable[None]],
    capture: bool,
) -> None:
    """With capture_content off, no span, metric, log record or warning holds content or
    a credential; with it on, spans hold content (a model was asked), the rest never."""
    try:
        await case(tmp_path, capture)
    except Exception:  # several paths end the run with an error: what it emitted counts
        pass
    span_texts, metric_texts = spans.every_text(), histograms.every_text()
    assert spans.all()
    assert metric_texts  # every case calls a model
    if capture:
        assert [text for text in span_texts if CANARY in text]
        span_texts = []
    printed = capfd.readouterr()  # what Python prints of an exception nobody handled
    texts = [*span_texts, *metric_texts, *logged, *warned.texts(), printed.out, printed.err]
    assert not [text for text in texts if CANARY in text]


CAMPAIGN_SEED = 20261205
CAMPAIGN_RUNS = 300


async def test_no_secret_of_a_faulty_campaign_reaches_telemetry_or_logs(
    spans: Spans,
    histograms: Histograms,
    logged: list[str],
    warned: Warned,
    capfd: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """The fault-injection harness's runs (failing, stalling and cancelled models, tools,
    hooks and stores; compactions, streams, sub-agents, cleanup under a stop), their
    content and faults carrying SECRET: no span, metric, log record or warning holds it."""
    report = await campaign(CAMPAIGN_SEED, CAMPAIGN_RUNS, directory=tmp_path)
    assert report.violations == []
    assert {"store error", "model unavailable", "summary error", "tool fail"} <= set(report.faults)
    loggers = {text.split(" ", 1)[0] for text in logged}
    assert {"littleghost.cleanup", "littleghost.context", "littleghost.tools"} <= loggers
    async with SQLiteSessionStore(tmp_path / "faults.db", read_only=True) as store:
        stored = [m.text for s in await store.list_sessions() for m in await store.load(s)]
    assert [text for text in stored if SECRET in text]  # the conversations carried it
    printed = capfd.readouterr()
    recorded = {span.name.split(" ", 1)[0] for span in spans.all()}
    assert {"invoke_agent", "chat", "execute_tool"} <= recorded  # there was telemetry to scan
    metrics = histograms.every_text()  # read once: a read takes the points
    assert metrics
    texts = [*spans.every_text(), *metrics, *logged, *warned.texts(), *printed]
    assert not [text for text in texts if SECRET in text]


def test_a_client_that_fails_to_close_as_its_event_loop_ends_is_logged_by_type(
    logged: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SDK client littleghost made for a run_sync() event loop is closed as the loop
    ends; a failure to close is logged at DEBUG by its type, never its text (which may
    name the base URL with its credentials)."""

    async def close(self: openai.AsyncOpenAI) -> None:
        raise RuntimeError(f"could not close the pool of {BASE_URL}")

    monkeypatch.setattr(openai.AsyncOpenAI, "close", close)
    model = OpenAIModel("m", base_url="http://127.0.0.1:1/v1", api_key=CANARY, context_window=800)
    with pytest.raises(ProviderUnavailableError):  # nothing listens there
        Support(model=model, max_retries=0).run_sync(f"input {CANARY}")
    closing = [text for text in logged if "as its event loop ended failed" in text]
    assert closing and "RuntimeError" in closing[0]
    assert not [text for text in logged if CANARY in text]


class Drawn(Agent):
    """Tools of every kind the drawn runs call; what each returns or raises is its
    argument's marker with another prefix (``res-``, ``err-``)."""

    instructions = f"You help with instr-{CANARY}."
    max_retries = 1
    rewrites = False

    @tool
    def echo(self, note: str) -> str:
        """Answer."""
        return note.replace("arg-", "res-")

    @tool
    async def aecho(self, note: str) -> str:
        """Answer, asynchronously."""
        return note.replace("arg-", "res-")

    @tool
    def fail(self, note: str) -> str:
        """Fail."""
        raise ValueError(note.replace("arg-", "err-"))

    @tool
    async def afail(self, note: str) -> str:
        """Fail, asynchronously."""
        raise LookupError(note.replace("arg-", "err-"))

    @tool
    def count(self, times: int) -> str:
        """Take a number (a drawn call gives it text: invalid arguments)."""
        return str(times)

    @tool
    async def delegate(self, note: str) -> str:
        """Ask a sub-agent, capturing as this agent does, whose tool fails."""
        inner = note.replace("arg-", "inner-")
        model = scripted(tool_call_response("fail", {"note": inner}), text_response(inner))
        await Drawn(model=model, capture_content=self.capture_content).run(f"question-{inner}")
        return note.replace("arg-", "res-")

    @after_model
    def redact_answer(self, response: Any) -> Any:
        if not self.rewrites:
            return response
        message = Message.assistant("redacted", tool_calls=response.message.tool_calls)
        return attrs.evolve(response, message=message)

    @after_tool
    def redact_result(self, result: Any) -> Any:
        return attrs.evolve(result, content="redacted") if self.rewrites else result


class Rewriting(Drawn):
    rewrites = True


@manage_context(compression_threshold=0.5, preserve_recent_messages=2, context_window_tokens=900)
class Compacting(Drawn):
    pass


class Summarizing(ScriptedModel):
    """A script for the run's turns; a summary for each summary call, whenever it comes."""

    async def respond(self, request: ModelRequest) -> ModelResponse:
        if request.purpose == "chat":
            return await super().respond(request)
        return text_response(f"- summary-{CANARY} of the conversation so far")


CALLS = ("echo", "aecho", "fail", "afail", "count", "delegate", "undeclared")


def drawn_turns(rng: random.Random, run: int) -> tuple[list[Any], list[str]]:
    """A script of tool turns and an answer, each text a marker of its own, and the
    markers of the calls' arguments."""
    steps: list[Any] = []
    markers = []
    for turn in range(rng.randint(0, 3)):
        if rng.random() < 0.2:  # a failed attempt, retried
            steps.append(RateLimitError(f"slow down {CANARY}", provider="x", retry_after=0))
        calls: list[tuple[str, dict[str, Any]]] = []
        for position in range(rng.randint(1, 3)):
            name, marker = rng.choice(CALLS), f"arg-{CANARY}-{run}-{turn}-{position}"
            markers.append(marker)
            if name == "count":
                calls.append((name, {"times": marker}))
            elif name == "undeclared":
                calls.append((f"tool-{marker}", {"note": marker}))
            else:
                calls.append((name, {"note": marker}))
        steps.append(tool_calls_response(*calls, text=f"calling {CANARY}-{run}-{turn}"))
    answer = f"answer-{CANARY}-{run}"
    steps.append(streamed(answer) if rng.random() < 0.5 else text_response(answer))
    return steps, markers


def capture_problems(spans: Spans, question: str, markers: Sequence[str]) -> list[str]:
    """What the spans of a run with ``capture_content`` lack of what it promises: each
    request's messages and tools and each answer (as the model gave it) on its ``chat``
    span, a summary call's request and summary on its own; each call's arguments and result (as the tool gave it) and what a failing tool
    raised on its ``execute_tool`` span."""
    problems = []
    chats, executions = spans.named("chat"), spans.named("execute_tool")
    for chat in chats:  # the run's and its sub-agents'
        got = dict(chat.attributes or {})
        sent = str(got.get("gen_ai.input.messages"))
        if got.get("littleghost.purpose") == "context_compaction":
            if CANARY not in sent:  # the history, or the turns since a first summary
                problems.append(f"{chat.name}: no summary request")
            if f"summary-{CANARY}" not in str(got.get("gen_ai.output.messages")):
                problems.append(f"{chat.name}: no summary")
            continue
        if "question-" not in sent or f"instr-{CANARY}" not in sent:
            problems.append(f"{chat.name}: no request messages")
        if "echo" not in str(got.get("gen_ai.tool.definitions")):
            problems.append(f"{chat.name}: no tool definitions")
        answered = str(got.get("gen_ai.output.messages"))
        if got.get("error.type") is None and (CANARY not in answered or "redacted" in answered):
            problems.append(f"{chat.name}: the answer is not as the model gave it")
    if not any(question in str(chat.attributes) for chat in chats):
        problems.append("no chat span holds the run's question")
    for marker in markers:
        ran = [
            span
            for span in executions
            if marker in str((span.attributes or {}).get("gen_ai.tool.call.arguments"))
        ]
        if len(ran) != 1:
            problems.append(f"{marker}: {len(ran)} execute_tool spans hold its arguments")
            continue
        got = dict(ran[0].attributes or {})
        result = str(got.get("gen_ai.tool.call.result"))
        if "redacted" in result or not (
            marker.replace("arg-", "res-") in result
            or marker.replace("arg-", "err-") in result
            or got.get("error.type") in ("invalid_arguments", "unknown_tool")
        ):
            problems.append(f"{ran[0].name}: the result is not as the tool gave it: {result}")
        raised = [event for event in ran[0].events if event.name == "exception"]
        if (ran[0].name in ("execute_tool fail", "execute_tool afail")) != bool(raised) or (
            raised and marker.replace("arg-", "err-") not in str(raised[0].attributes)
        ):
            problems.append(f"{ran[0].name}: {len(raised)} exception events")
    return problems


DRAWN_SEED = 20261207
DRAWN_RUNS = 40


@pytest.mark.virtual_clock  # the retries' waits take no real time
async def test_drawn_runs_record_content_only_when_captured(
    spans: Spans,
    histograms: Histograms,
    logged: list[str],
    warned: Warned,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Drawn runs (tools that answer, fail, sync and async, misfitting arguments, calls
    of undeclared tools, sub-agents, failed model calls retried, answers whole and
    streamed, through ``run()`` and ``stream()``, in a session or not, compactions,
    hooks that rewrite answers and results): with ``capture_content`` off, no span,
    metric, log record, warning or printed text holds a marker; with it on, the spans
    hold all that capturing promises, the rest still none."""
    rng, store = random.Random(DRAWN_SEED), InMemorySessionStore()
    for run in range(DRAWN_RUNS):
        steps, markers = drawn_turns(rng, run)
        capture = rng.random() < 0.5
        kind = rng.choice([Drawn, Rewriting, Compacting])
        model = Summarizing(steps)
        agent = kind(model=model, capture_content=capture, session_store=store)
        question = f"question-{CANARY}-{run}"
        session: dict[str, Any] = {"session_id": f"s{run}"} if rng.random() < 0.5 else {}
        if kind is Compacting:  # over the threshold: summarized at once
            session["history"] = [
                make(f"history-{CANARY}-{run}-{turn} " + "x" * 200)
                for turn in range(6)
                for make in (Message.user, Message.assistant)
            ]
        spans.clear()
        if rng.random() < 0.5:
            await agent.run(question, **session)
        else:
            async with agent.stream(question, **session) as events:
                async for _ in events:
                    pass
        span_texts = spans.every_text()
        if capture:
            assert capture_problems(spans, question, markers) == [], (run, steps)
            span_texts = []
        printed = capfd.readouterr()
        texts = [*span_texts, *histograms.every_text(), *logged, *warned.texts(), *printed]
        assert not [text for text in texts if CANARY in text], (run, capture)
