"""Every token a provider reported is counted once, and none invented: randomized runs
of real local servers (both providers, ``run()`` and ``stream()``) that answer with
usage, break streams after reporting some, fail, call tools, or are cut by a deadline,
a cancellation or a consumer that leaves; and of a model of its own through summary
calls, overflow recovery, repair turns, side calls, sub-agents and hooks that replace
answers. What was reported, summed, is the run's usage (or its error's ``run_usage``),
its events', its spans' and the token metric's."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import attrs
import pytest
from pydantic import BaseModel

from littleghost import Agent, after_model, manage_context, tool
from littleghost.errors import (
    ContextWindowOverflowError,
    DeadlineExceededError,
    LittleGhostError,
    ProviderUnavailableError,
)
from littleghost.events import ModelCallFinished, ModelCallRetried, RunFinished, TextDelta
from littleghost.messages import Message
from littleghost.models import ModelRequest, ModelResponse, Usage, report_usage
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel
from littleghost.run import RunContext
from littleghost.testing import tool_call_response
from tests.raw_http import Connection, RawServer
from tests.sdk_bodies import (
    anthropic_events,
    chunk,
    completion_body,
    message_body,
    message_start,
    openai_events,
    text_block,
    tool_use_block,
)

if TYPE_CHECKING:
    from tests.conftest import Histograms, Spans

pytestmark = pytest.mark.anyio


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(random, "uniform", lambda low, high: low)


def drawn_usage(rng: random.Random, provider: str) -> tuple[dict[str, Any], Usage]:
    """A provider's usage object, with cache and reasoning counts at times, and what it
    bills as a ``Usage``."""
    cache_read = rng.choice([0, 0, rng.randint(1, 50)])
    reasoning = rng.choice([0, 0, rng.randint(1, 20)])
    output = reasoning + rng.randint(1, 30)
    if provider == "openai":
        prompt = cache_read + rng.randint(1, 200)
        counts: dict[str, Any] = {
            "prompt_tokens": prompt,
            "completion_tokens": output,
            "total_tokens": prompt + output,
        }
        if cache_read:
            counts["prompt_tokens_details"] = {"cached_tokens": cache_read}
        if reasoning:
            counts["completion_tokens_details"] = {"reasoning_tokens": reasoning}
        return counts, Usage(prompt, output, cache_read, 0, reasoning)
    cache_write = rng.choice([0, 0, rng.randint(1, 50)])
    fresh = rng.randint(1, 200)
    counts = {"input_tokens": fresh, "output_tokens": output}
    if cache_read:
        counts["cache_read_input_tokens"] = cache_read
    if cache_write:
        counts["cache_creation_input_tokens"] = cache_write
    return counts, Usage(fresh + cache_read + cache_write, output, cache_read, cache_write)


class Step:
    """One answer a server gives, and what it billed: ``text`` or ``tool`` (a call of
    ``look``) with its usage (OpenAI's in a last chunk alone, or so far with each chunk
    as vLLM sends it; Anthropic's output in ``message_delta`` alone, or all repeated
    there, as its newer streams do); ``silent``, an OpenAI answer without usage (an
    Anthropic one has it); ``error``, a 500; ``cut``, ``error event`` and ``stall``, a
    stream that reported usage and sent some text, then broke, sent an error event or
    fell silent (an answer not streamed: nothing, then a reset or silence)."""

    def __init__(self, rng: random.Random, provider: str, kind: str, server: list[RawServer]):
        self.provider = provider
        self.kind = kind
        self.server = server
        self.counts, self.billed = drawn_usage(rng, provider)
        self.in_last_chunk_only = rng.random() < 0.5

    def __call__(self, connection: Connection) -> None:
        streaming = bool(self.server[0].requests[-1].json.get("stream"))
        if self.kind == "error":
            self.billed = Usage()
            connection.answer(500, {"error": {"message": "busy", "type": "server_error"}})
            return
        if self.kind in ("cut", "stall", "error event"):
            self.cut(connection, streaming)
            return
        if self.kind == "silent" and self.provider == "openai":
            self.billed = Usage()
        if streaming:
            connection.events(self.events())
        else:
            connection.answer(200, self.body())

    def cut(self, connection: Connection, streaming: bool) -> None:
        """A stream that reported usage (vLLM's with each chunk; Anthropic's prompt in
        ``message_start``) and sent ``AB``, then ends as the step's kind says."""
        if not streaming:
            self.billed = Usage()
            if self.kind == "stall":
                connection.stall()
            else:
                connection.reset()
            return
        if self.provider == "openai":
            partial = dict(self.counts)
            sent = openai_events(chunk({"content": "AB"}, usage=partial), done=False)
        else:
            started = {k: v for k, v in self.counts.items() if k != "output_tokens"}
            sent = anthropic_events(message_start({**started, "output_tokens": 1}))
            sent += anthropic_events(*text_block(0, "AB")[:2])
            self.billed = Usage(
                self.billed.input_tokens,
                1,
                self.billed.cache_read_tokens,
                self.billed.cache_write_tokens,
            )
        connection.head(200, {"Content-Type": "text/event-stream"})
        for event in sent:
            connection.send(event)
        if self.kind == "stall":
            connection.stall()
            return
        if self.kind == "error event":
            overloaded = {"type": "overloaded_error", "message": "Overloaded"}
            if self.provider == "openai":
                connection.send(
                    b'data: {"error": {"message": "Overloaded", "type": "server_error"}}\n\n'
                )
            else:
                connection.send(*anthropic_events({"type": "error", "error": overloaded}))
            connection.sock.close()
            return
        time.sleep(0.05)
        connection.reset()

    def events(self) -> list[bytes]:
        """The whole answer streamed."""
        calls = self.kind == "tool"
        if self.provider == "openai":
            if calls:
                call = {"index": 0, "id": f"c{id(self)}", "type": "function"}
                call["function"] = {"name": "look", "arguments": "{}"}
                pieces = [chunk({"tool_calls": [call]}), chunk({}, finish_reason="tool_calls")]
            else:
                pieces = [chunk({"content": "fi"}), chunk({"content": "ne"}, finish_reason="stop")]
            if self.kind != "silent":
                if not self.in_last_chunk_only:  # vLLM's usage with each chunk, so far
                    so_far = {**self.counts, "completion_tokens": 1, "total_tokens": 0}
                    so_far.pop("completion_tokens_details", None)
                    pieces = [{**piece, "usage": so_far} for piece in pieces]
                pieces.append(chunk(None, usage=self.counts))
            return openai_events(*pieces)
        started = {k: v for k, v in self.counts.items() if k != "output_tokens"}
        ending = {"output_tokens": self.counts["output_tokens"]}
        if not self.in_last_chunk_only:
            ending = dict(self.counts)  # the API's newer streams repeat them all
        blocks = (
            tool_use_block(0, f"c{id(self)}", "look", "{}") if calls else text_block(0, "fi", "ne")
        )
        delta = {"stop_reason": "tool_use" if calls else "end_turn", "stop_sequence": None}
        return anthropic_events(
            message_start({**started, "output_tokens": 1}),
            *blocks,
            {"type": "message_delta", "delta": delta, "usage": ending},
            {"type": "message_stop"},
        )

    def body(self) -> Any:
        """The whole answer not streamed."""
        calls = self.kind == "tool"
        if self.provider == "openai":
            if calls:
                call = {"id": f"c{id(self)}", "type": "function"}
                call["function"] = {"name": "look", "arguments": "{}"}
                return completion_body({"tool_calls": [call]}, "tool_calls", self.counts)
            body = completion_body({"content": "fine"}, "stop", self.counts)
            if self.kind == "silent":
                del body["usage"]
            return body
        if calls:
            content = [{"type": "tool_use", "id": f"c{id(self)}", "name": "look", "input": {}}]
            return message_body(content, "tool_use", self.counts)
        return message_body([{"type": "text", "text": "fine"}], "end_turn", self.counts)


FAILURES = ["cut", "error", "error event"]


class Looking(Agent):
    instructions = "Answer briefly."

    @tool
    async def look(self) -> str:
        """Look around."""
        return "a room"


def token_counts(histograms: Histograms) -> dict[str, float]:
    """The tokens in gen_ai.client.token.usage, by type, over all other attributes."""
    counts: dict[str, float] = {}
    for point in histograms.read().get("gen_ai.client.token.usage", []):
        kind = dict(point.attributes or {})["gen_ai.token.type"]
        counts[kind] = counts.get(kind, 0) + point.sum
    return counts


NAMES = {
    "input_tokens": "gen_ai.usage.input_tokens",
    "output_tokens": "gen_ai.usage.output_tokens",
    "cache_read_tokens": "gen_ai.usage.cache_read.input_tokens",
    "cache_write_tokens": "gen_ai.usage.cache_write.input_tokens",
    "reasoning_tokens": "gen_ai.usage.reasoning.output_tokens",
}


def shown(span: Any) -> Usage:
    """The usage a span's GenAI attributes show."""
    attributes = dict(span.attributes or {})
    return Usage(**{field: int(attributes.get(name, 0)) for field, name in NAMES.items()})


def drawn_steps(
    rng: random.Random, provider: str, holder: list[RawServer], *, most: int = 3
) -> list[Step]:
    """Up to ``most`` tool calls, each after failed attempts at times."""
    steps: list[Step] = []
    for _ in range(rng.randint(0, most)):
        for _ in range(rng.randint(0, 2)):
            steps.append(Step(rng, provider, rng.choice(FAILURES), holder))
        steps.append(Step(rng, provider, "tool", holder))
    return steps


def served_model(provider: str, server: RawServer) -> Any:
    """``provider``'s model of ``server``."""
    if provider == "openai":
        return OpenAIModel("gpt-4o-mini", base_url=f"{server.url}/v1", api_key="k")
    return AnthropicModel("claude-sonnet-5", base_url=server.url, api_key="k")


# An answer the adapter stops reading (its error event) leaves httpcore's byte-stream
# generator, which httpx does not close, to the garbage collector: trio warns of it.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("seed", range(30))
async def test_every_reported_token_is_counted_once(
    servers: Callable[..., RawServer], spans: Spans, histograms: Histograms, seed: int
) -> None:
    """Tool calls, retried after failures (some billed), and a last answer with usage or
    none: the result, the invoke_agent span, the chat spans, the token metric and (in a
    stream) the call events each add up to what the servers reported, cache and reasoning
    tokens included."""
    rng = random.Random(seed)
    provider = rng.choice(["openai", "anthropic"])
    streaming = rng.random() < 0.5
    holder: list[RawServer] = []
    steps = drawn_steps(rng, provider, holder, most=4)
    for _ in range(rng.randint(0, 2)):
        steps.append(Step(rng, provider, rng.choice(FAILURES), holder))
    steps.append(Step(rng, provider, rng.choice(["text", "silent"]), holder))
    server = servers(*steps)
    holder.append(server)
    model = served_model(provider, server)
    events = []
    async with Looking(model=model, max_retries=3) as agent:
        if streaming:
            async with agent.stream("hello", timeout=30) as stream:
                events = [event async for event in stream]
            [finished] = [e for e in events if isinstance(e, RunFinished)]
            result = finished.result
        else:
            result = await agent.run("hello", timeout=30)
    await model.aclose()
    assert len(server.requests) == len(steps)
    billed = sum((step.billed for step in steps), Usage())
    note = f"{provider} {'stream' if streaming else 'run'} {[s.kind for s in steps]}"
    assert result.usage == billed, note
    assert shown(spans.one("invoke_agent")) == billed, note
    assert sum((shown(span) for span in spans.named("chat")), Usage()) == billed, note
    expected = {"input": billed.input_tokens, "output": billed.output_tokens}
    assert token_counts(histograms) == {k: v for k, v in expected.items() if v}, note
    if streaming:
        told = [e.usage for e in events if isinstance(e, (ModelCallFinished, ModelCallRetried))]
        assert sum(told, Usage()) == billed, note


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # as above
@pytest.mark.parametrize("seed", range(20))
async def test_a_run_stopped_mid_stream_counts_what_was_reported(
    servers: Callable[..., RawServer], spans: Spans, histograms: Histograms, seed: int
) -> None:
    """A run whose last call stalls after its stream reported usage, stopped by its
    deadline (``run()``, ``stream()``), a consumer that leaves or calls ``aclose()``, or
    the caller's cancellation of the stream: the error's ``run_usage``, the spans and the
    token metric count every call before it and what the stalled one reported."""
    rng = random.Random(seed)
    provider = rng.choice(["openai", "anthropic"])
    how = rng.choice(["deadline", "deadline streamed", "left", "closed", "cancelled"])
    holder: list[RawServer] = []
    steps = drawn_steps(rng, provider, holder)
    steps.append(Step(rng, provider, "stall", holder))
    server = servers(*steps)
    holder.append(server)
    model = served_model(provider, server)
    used: Usage | None = None
    told: list[Usage] = []
    settings = {"max_tokens": 10_000}  # AnthropicModel asks for so long an answer as a stream
    async with Looking(model=model, max_retries=3, cleanup_grace=0.5) as agent:
        if how == "deadline":
            with pytest.raises(DeadlineExceededError) as caught:
                await agent.run("hello", timeout=1, settings=settings)
            used = caught.value.run_usage
        elif how == "deadline streamed":
            with pytest.raises(DeadlineExceededError) as caught:
                async with agent.stream("hello", timeout=1) as stream:
                    async for event in stream:
                        if isinstance(event, (ModelCallFinished, ModelCallRetried)):
                            told.append(event.usage)
            used = caught.value.run_usage
        elif how in ("left", "closed"):
            async with agent.stream("hello", timeout=30) as stream:
                async for event in stream:
                    if isinstance(event, (ModelCallFinished, ModelCallRetried)):
                        told.append(event.usage)
                    if isinstance(event, TextDelta) and len(server.requests) == len(steps):
                        if how == "closed":
                            await stream.aclose()
                        break
        else:
            with anyio.CancelScope() as scope:
                async with agent.stream("hello", timeout=30) as stream:
                    async for event in stream:
                        if isinstance(event, TextDelta) and len(server.requests) == len(steps):
                            scope.cancel()
                            await anyio.lowlevel.checkpoint()
    await model.aclose()
    assert len(server.requests) == len(steps)
    billed = sum((step.billed for step in steps), Usage())
    note = f"{provider} {how} {[s.kind for s in steps]}"
    if used is not None:
        assert used == billed, note
    assert shown(spans.one("invoke_agent")) == billed, note
    assert sum((shown(span) for span in spans.named("chat")), Usage()) == billed, note
    expected = {"input": billed.input_tokens, "output": billed.output_tokens}
    assert token_counts(histograms) == {k: v for k, v in expected.items() if v}, note


def drawn_count(rng: random.Random) -> Usage:
    """A usage with cache and reasoning counts at times."""
    cache_read, cache_write = rng.choice([0, rng.randint(1, 9)]), rng.choice([0, 3])
    reasoning = rng.choice([0, rng.randint(1, 5)])
    return Usage(
        cache_read + cache_write + rng.randint(1, 300),
        reasoning + rng.randint(1, 40),
        cache_read,
        cache_write,
        reasoning,
    )


class Billing:
    """A model of its own that answers by a plan (tool calls, side calls, a sub-agent's
    run, failures billed or not, an overflow, an answer of the wrong shape), summaries
    to any summary call, each with a drawn usage, and keeps what it billed."""

    provider = "scripted"

    def __init__(self, rng: random.Random, plan: list[str], window: int | None, name: str):
        self.rng, self.plan, self.context_window, self.name = rng, plan, window, name
        self.billed: list[Usage] = []

    def output_schema_problem(self, schema: object) -> None:
        return None

    async def count_prompt_tokens(self, request: ModelRequest) -> None:
        return None

    async def respond(self, request: ModelRequest) -> ModelResponse:
        await anyio.lowlevel.checkpoint()
        used = drawn_count(self.rng)
        self.billed.append(used)
        if request.purpose != "chat":
            roll = self.rng.random()
            if roll < 0.3:  # billed, by the error or by what was reported before
                report_usage(used)
                raise ProviderUnavailableError("busy", usage=None if roll < 0.15 else used)
            return ModelResponse(Message.assistant("the summary"), usage=used)
        step = self.plan.pop(0) if self.plan else "text"
        if step == "unavailable":
            if self.rng.random() < 0.3:
                self.billed[-1] = Usage()
                raise ProviderUnavailableError("busy")
            report_usage(used)
            raise ProviderUnavailableError("busy", usage=self.rng.choice([None, used]))
        if step == "overflow":
            raise ContextWindowOverflowError(
                "too long", usage=used, prompt_tokens=5000, context_window=4000
            )
        if step in ("look", "side", "delegate"):
            return attrs.evolve(tool_call_response(step, {}), usage=used)
        if step == "unfit":
            return ModelResponse(Message.assistant('{"n": "x"}'), usage=used)
        text = "fine" if request.output_schema is None else '{"n": 3}'
        return ModelResponse(Message.assistant(text), usage=used)


class Figure(BaseModel):
    n: int


class Helper(Agent):
    instructions = "Help."


SUB_MODELS: list[Billing] = []
SUB_RESULTS: list[Usage] = []


class Mixed(Agent):
    instructions = "Answer briefly."

    @tool
    async def look(self) -> str:
        """Look around."""
        return "a room " * 50

    @tool
    async def side(self, context: RunContext) -> str:
        """Ask the model aside."""
        answer = await context.complete(ModelRequest((Message.user("aside"),)))
        return answer.message.text

    @tool
    async def delegate(self) -> str:
        """Ask a helper agent."""
        model = Billing(random.Random(len(SUB_MODELS)), ["look"], None, "helper")
        SUB_MODELS.append(model)
        result = await Helper(model=model, tools=[]).run("go")
        SUB_RESULTS.append(result.usage)
        return str(result.output)


@manage_context(preserve_recent_messages=2)
class MixedManaged(Mixed):
    pass


class MixedReplaced(Mixed):
    @after_model
    async def replaced(self, response: ModelResponse) -> ModelResponse:
        return attrs.evolve(response, usage=Usage(7, 7))


@manage_context(preserve_recent_messages=2)
class MixedManagedReplaced(MixedReplaced):
    pass


CLASSES = {
    (False, False): Mixed,
    (True, False): MixedManaged,
    (False, True): MixedReplaced,
    (True, True): MixedManagedReplaced,
}


@pytest.mark.parametrize("seed", range(40))
async def test_every_call_of_a_run_of_many_features_is_counted_once(
    spans: Spans, histograms: Histograms, seed: int
) -> None:
    """Summary calls (retried ones too), overflow recovery, a repair turn, retries, side
    calls and an ``after_model`` hook that replaces the answer's usage: the run counts
    what the model billed; a sub-agent's calls are its own, and the spans and the token
    metric (by model) count each call once."""
    SUB_MODELS.clear()
    SUB_RESULTS.clear()
    rng = random.Random(seed)
    managed, replaced, typed = rng.random() < 0.5, rng.random() < 0.3, rng.random() < 0.4
    steps = ["look", "side", "delegate", "unavailable", "overflow" if managed else "look"]
    plan = [rng.choice(steps) for _ in range(rng.randint(0, 4))]
    plan += ["unfit"] if typed and rng.random() < 0.5 else []
    model = Billing(rng, plan, 4000 if managed else None, "main")
    pairs = [(Message.user("word " * 300), Message.assistant("ok " * 300))]
    history = [message for _ in range(rng.randint(0, 6)) for message in pairs[0]]
    history = [attrs.evolve(message, id=f"m{i}") for i, message in enumerate(history)]
    typing: dict[str, Any] = {"output_type": Figure} if typed else {}
    agent = CLASSES[managed, replaced](model=model, max_retries=5, **typing)
    told: list[Usage] = []
    used: Usage | None
    try:
        if rng.random() < 0.5:
            async with agent.stream("hello", history=history) as events:
                async for event in events:
                    told += [event.usage] if hasattr(event, "usage") else []
                    if isinstance(event, RunFinished):
                        used = event.result.usage
        else:
            used = (await agent.run("hello", history=history)).usage
    except LittleGhostError as error:
        used, told = error.run_usage, []
    billed = sum(model.billed, Usage())
    helped = sum((count for sub in SUB_MODELS for count in sub.billed), Usage())
    assert used == billed
    if told:
        assert sum(told, Usage()) == billed
    assert sum(SUB_RESULTS, Usage()) == helped
    runs = {
        dict(span.attributes or {})["gen_ai.agent.name"]: span
        for span in spans.named("invoke_agent")
    }
    assert shown(runs[agent.name]) == billed
    assert sum((shown(span) for span in spans.named("chat")), Usage()) == billed + helped
    by_model: dict[str, float] = {}
    for point in histograms.read().get("gen_ai.client.token.usage", []):
        name = str(dict(point.attributes or {})["gen_ai.request.model"])
        by_model[name] = by_model.get(name, 0) + point.sum
    assert by_model.get("main", 0) == billed.total_tokens
    assert by_model.get("helper", 0) == helped.total_tokens
