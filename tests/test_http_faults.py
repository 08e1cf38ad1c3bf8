"""The providers at the HTTP level, as production fails: the real SDK clients against a
server on 127.0.0.1 that answers byte by byte (``tests.raw_http``) — resets before the
headers and in the middle of a stream, streams cut short, late headers and stalled
streams against the run's deadline, error statuses — under asyncio and trio."""

from __future__ import annotations

import email.utils
import json
import random
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import anthropic
import anyio
import httpx2
import openai
import pytest
from opentelemetry.sdk.trace import ReadableSpan

from littleghost import Agent, tool
from littleghost.errors import (
    ConfigurationError,
    ContextWindowOverflowError,
    DeadlineExceededError,
    InvalidRequestError,
    ProtocolError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.events import Event, ModelCallRetried, RunFinished, TextDelta
from littleghost.messages import Message, Role
from littleghost.models import ModelRequest, ModelResponse, Usage
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel
from littleghost.models.overflow import MAX_DETAIL_CHARS
from littleghost.models.streaming import StreamDone
from tests.raw_http import Behaviour, Connection, RawServer, refused_url
from tests.sdk_bodies import (
    SDKClients,
    answered_whole,
    anthropic_events,
    chunk,
    completion_body,
    finish,
    message_body,
    message_start,
    openai_events,
    text_block,
)

from .stores import eventually
from .timing import LATE

if TYPE_CHECKING:
    from tests.conftest import Histograms, Spans

pytestmark = pytest.mark.anyio

PROVIDERS = ("openai", "anthropic")
Models = Callable[..., OpenAIModel | AnthropicModel]


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries go at once: the backoff's full jitter draws its least, 0 s (a wait the
    provider asks for with ``Retry-After`` is still a floor)."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)


@pytest.fixture
async def model_of() -> AsyncIterator[Models]:
    """Makes a provider's model of a server's URL, closed after the test."""
    made: list[OpenAIModel | AnthropicModel] = []

    def make(
        provider: str, url: str, key: str = "sk-test", **options: Any
    ) -> OpenAIModel | AnthropicModel:
        if provider == "openai":
            made.append(OpenAIModel("gpt-4o-mini", base_url=f"{url}/v1", api_key=key, **options))
        else:
            made.append(AnthropicModel("claude-sonnet-5", base_url=url, api_key=key, **options))
        return made[-1]

    yield make
    for model in made:
        await model.aclose()


def answered(provider: str, text: str = "fine") -> Behaviour:
    """A whole answer of ``text``, streamed as two pieces."""
    if provider == "openai":
        events = openai_events(
            chunk({"content": text[:2]}),
            chunk({"content": text[2:]}, finish_reason="stop"),
            chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}),
        )
    else:
        events = anthropic_events(
            message_start({"input_tokens": 9, "output_tokens": 1}),
            *text_block(0, text[:2], text[2:]),
            *finish("end_turn", 2),
        )
    return lambda connection: connection.events(events)


def broken(events: list[bytes]) -> Behaviour:
    """The head of a stream and ``events``, then a reset."""

    def behaviour(connection: Connection) -> None:
        connection.head(200, {"Content-Type": "text/event-stream"})
        for event in events:
            connection.send(event)
        time.sleep(0.05)  # the client reads them before the reset
        connection.reset()

    return behaviour


class Plain(Agent):
    instructions = "Answer briefly."


async def asked(agent: Agent, streaming: bool) -> list[Message]:
    """Ask ``agent`` "hello" (within 20 s), streamed or not: its log."""
    if streaming:
        return (await streamed(agent, timeout=20))[1]
    return list((await agent.run("hello", timeout=20)).messages)


async def streamed(agent: Agent, **options: Any) -> tuple[list[Event], list[Message]]:
    """The events of a streamed run of ``agent``, and its log, whatever the run raised
    (it is raised after)."""
    events: list[Event] = []
    async with agent.stream("hello", **options) as stream:
        try:
            async for event in stream:
                events.append(event)
        except Exception as error:
            if sys.version_info >= (3, 11):  # add_note is new in 3.11
                error.add_note(f"events: {events}")
            raise
    return events, list(stream.messages)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_what_a_broken_stream_reported_before_it_broke_is_billed(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    """A stream that reported usage, then broke, was billed for it: its retry event and
    the run's usage carry what it reported."""
    if provider == "openai":  # usage with each chunk (vLLM's continuous usage), no end
        counts = {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}
        sent = openai_events(chunk({"content": "AB"}, usage=counts), done=False)
        reported = Usage(30, 4)
    else:  # the prompt read and a piece written
        sent = anthropic_events(
            message_start({"input_tokens": 30, "output_tokens": 1}), *text_block(0, "AB")[:2]
        )
        reported = Usage(30, 1)
    server = servers(broken(sent), answered(provider))
    model = model_of(provider, server.url)
    async with Plain(model=model) as agent:
        events, log = await streamed(agent, timeout=20)
    [retried] = [event for event in events if isinstance(event, ModelCallRetried)]
    assert retried.usage == reported
    assert retried.error_type == "ProviderUnavailableError"
    [finished] = [event for event in events if isinstance(event, RunFinished)]
    result = finished.result
    assert result.usage.input_tokens == reported.input_tokens + 9
    assert result.usage.output_tokens == reported.output_tokens + 2
    assert [message.text for message in log] == ["hello", "fine"]


USED = {"prompt_tokens": 30, "completion_tokens": 4, "total_tokens": 34}


def whole_answer(provider: str, *, usage: bool = True, last: bool = False) -> list[bytes]:
    """The events of an answer ``ABC`` up to its finish reason (Anthropic's
    ``message_delta``) and, with ``usage``, its usage (30 in, 4 out); with ``last``, its
    last event too (``[DONE]``, ``message_stop``)."""
    if provider == "openai":
        ending = [chunk(None, usage=USED)] if usage else []
        return openai_events(
            chunk({"content": "AB"}),
            chunk({"content": "C"}, finish_reason="stop"),
            *ending,
            done=last,
        )
    stopped = finish("end_turn", 4)
    return anthropic_events(
        message_start({"input_tokens": 30, "output_tokens": 1}),
        *text_block(0, "AB", "C"),
        *(stopped if last else stopped[:1]),
    )


def stalled(events: list[bytes]) -> Behaviour:
    """The head of a stream and ``events``, then silence."""

    def behaviour(connection: Connection) -> None:
        connection.head(200, {"Content-Type": "text/event-stream"})
        for event in events:
            connection.send(event)
        connection.stall()

    return behaviour


def cut(events: list[bytes]) -> Behaviour:
    """The head of a stream and ``events``, then the connection closed (no reset)."""
    return lambda connection: connection.events(events)


ENDINGS = ("reset", "reset after the last event", "closed", "stalled")
UNENDED = ("reset before its blank line", "reset before its line end", "stalled before its end")
"""Endings right after the finish reason's data line, before what ends its event."""


@pytest.mark.parametrize(
    ("provider", "ending"),
    [(provider, ending) for provider in PROVIDERS for ending in ENDINGS + UNENDED]
    + [("openai", "reset before the usage")],  # Anthropic's come in one event
)
async def test_a_stream_lost_once_its_answer_was_whole_is_kept_not_asked_again(
    servers: Callable[..., RawServer], model_of: Models, provider: str, ending: str
) -> None:
    """An answer whose finish reason (Anthropic: the ``message_delta`` with its stop
    reason and usage) came is whole: a connection reset, closed or gone silent before
    the stream's last event (``[DONE]``, ``message_stop``), or after it, costs no second
    call. The answer is the run's, billed once with what the stream reported; where the
    connection broke before an OpenAI usage chunk, the usage is not known (a retry would
    not tell it either, and would be billed again). So is one broken right after the
    data line of the event that gives the finish reason, before its blank line or its
    line end: the event is whole, as it is when the body ends there."""
    unknown = ending == "reset before the usage" or (ending in UNENDED and provider == "openai")
    sent = whole_answer(provider, usage=not unknown, last=ending.endswith("last event"))
    if ending in UNENDED:
        sent[-1] = sent[-1][: -1 if ending.endswith("blank line") else -2]
    stall = ending.startswith("stalled")
    behaviour = stalled if stall else cut if ending == "closed" else broken
    server = servers(behaviour(sent), answered(provider, "again"))
    model = model_of(provider, server.url, request_timeout=0.5 if stall else 1)
    async with Plain(model=model) as agent:
        events, log = await streamed(agent, timeout=20)
        _, later = await streamed(agent, timeout=20)  # the model serves on
        assert later[-1].text == "again"
    assert not [event for event in events if isinstance(event, ModelCallRetried)]
    [finished] = [event for event in events if isinstance(event, RunFinished)]
    assert finished.result.output == "ABC"
    expected = Usage() if unknown else Usage(30, 4)
    assert finished.result.usage == expected
    assert [message.text for message in log] == ["hello", "ABC"]
    assert len(server.requests) == 2  # this run's one call, and the next run's


class _CutBody(httpx2.AsyncByteStream):
    """A body sent as ``pieces``, then ended by ``ending`` (raised) or closed (``None``)."""

    def __init__(self, pieces: list[bytes], ending: Exception | None) -> None:
        self.pieces = pieces
        self.ending = ending

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for piece in self.pieces:
            yield piece
        if self.ending is not None:
            raise self.ending


async def test_a_stream_broken_anywhere_is_kept_exactly_when_its_finish_reason_came(
    sdk_clients: SDKClients,
) -> None:
    """Streams cut at random bytes, in random pieces, then reset, gone silent or closed:
    the answer is kept exactly when the data of the event with its finish reason came
    whole (its blank line or line end may be missing), else the call failed, retried."""
    picks = random.Random(11)
    request = ModelRequest([Message.user("hi")])
    for _ in range(300):
        provider = picks.choice(PROVIDERS)
        events = whole_answer(provider, last=True)
        finishing = 2 if provider == "openai" else len(events) - 1  # through its finish reason
        body = b"".join(events)
        whole_from = len(b"".join(events[:finishing])) - 2  # its data's last byte in
        near = whole_from + picks.randrange(-2, 3)  # the cuts that tell most: half of them
        cut = picks.choice([picks.randrange(len(body) + 1), near])
        pieces, at = [], 0
        while at < cut:
            pieces.append(body[at : min(cut, at + picks.randrange(1, 40))])
            at += len(pieces[-1])
        ending = picks.choice([httpx2.ReadError("reset"), httpx2.ReadTimeout("silent"), None])
        stream = _CutBody(pieces, ending)
        answer = httpx2.Response(200, stream=stream, headers={"content-type": "text/event-stream"})
        model = (sdk_clients.openai_model if provider == "openai" else sdk_clients.anthropic_model)(
            lambda request, answer=answer: answer
        )
        kept: list[ModelResponse] = []
        try:
            async with aclosing(model.stream(request)) as chunks:
                kept += [chunk.response async for chunk in chunks if isinstance(chunk, StreamDone)]
        except ProviderUnavailableError:
            pass
        assert [response.message.text for response in kept] == (
            ["ABC"] if cut >= whole_from else []
        ), (provider, cut, whole_from, ending)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("ending", ["reset", "closed", "stalled"])
async def test_a_stream_lost_before_its_finish_reason_is_still_asked_again(
    servers: Callable[..., RawServer], model_of: Models, provider: str, ending: str
) -> None:
    """The usage without the finish reason (vLLM's usage on every chunk; Anthropic's
    ``message_start``) is not a whole answer: the call is made again, and what the lost
    one reported is billed."""
    if provider == "openai":
        sent = openai_events(chunk({"content": "AB"}, usage=USED), done=False)
        reported = Usage(30, 4)
    else:
        sent = anthropic_events(
            message_start({"input_tokens": 30, "output_tokens": 1}), *text_block(0, "AB")
        )
        reported = Usage(30, 1)
    behaviour = {"closed": cut, "stalled": stalled}.get(ending, broken)(sent)
    server = servers(behaviour, answered(provider))
    model = model_of(provider, server.url, request_timeout=0.5 if ending == "stalled" else 1)
    async with Plain(model=model) as agent:
        events, log = await streamed(agent, timeout=20)
    [retried] = [event for event in events if isinstance(event, ModelCallRetried)]
    assert retried.usage == reported
    assert [message.text for message in log] == ["hello", "fine"]
    assert len(server.requests) == 2


def looking() -> tuple[type[Plain], list[int]]:
    """An agent whose ``lookup`` tool records each id it is called with, and the record."""
    looked: list[int] = []

    class Looking(Plain):
        @tool
        def lookup(self, id: int) -> str:
            """Look an order up."""
            looked.append(id)
            return f"order {id}"

    return Looking, looked


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("ending", ["reset", "closed"])
async def test_a_stream_lost_while_a_tool_calls_arguments_arrive_runs_no_tool(
    servers: Callable[..., RawServer], model_of: Models, provider: str, ending: str
) -> None:
    """A tool call whose arguments were cut off is no call: no tool runs on half its
    arguments, the call is made again, and the log holds the retry's answer alone."""
    if provider == "openai":
        piece = {"index": 0, "id": "c1", "type": "function"}
        piece["function"] = {"name": "lookup", "arguments": '{"id": 4'}
        sent = openai_events(chunk({"tool_calls": [piece]}), done=False)
    else:
        started = {"type": "tool_use", "id": "c1", "name": "lookup", "input": {}}
        delta = {"type": "input_json_delta", "partial_json": '{"id": 4'}
        sent = anthropic_events(
            message_start({"input_tokens": 30, "output_tokens": 1}),
            {"type": "content_block_start", "index": 0, "content_block": started},
            {"type": "content_block_delta", "index": 0, "delta": delta},
        )
    Looking, looked = looking()
    server = servers({"closed": cut}.get(ending, broken)(sent), answered(provider))
    async with Looking(model=model_of(provider, server.url)) as agent:
        events, log = await streamed(agent, timeout=20)
    assert looked == []
    assert [type(event).__name__ for event in events].count("ModelCallRetried") == 1
    assert [message.text for message in log] == ["hello", "fine"]
    assert len(server.requests) == 2


def tool_call_stream(provider: str) -> tuple[list[bytes], int, int]:
    """A streamed call of ``lookup(id=4)``, its arguments in two pieces, event by event
    (the end marker, ``[DONE]`` or ``message_stop``, last); with the number of events
    after which its arguments are whole (Anthropic: its block stopped) and after which
    its finish reason (Anthropic: the ``message_delta`` with its stop reason) came."""
    if provider == "openai":
        head = {"index": 0, "id": "c1", "type": "function"}
        pieces = [{"index": 0, "function": {"arguments": part}} for part in ('{"id"', ": 4}")]
        events = openai_events(
            chunk({"role": "assistant", "content": None}),
            chunk({"tool_calls": [{**head, "function": {"name": "lookup", "arguments": ""}}]}),
            *(chunk({"tool_calls": [piece]}) for piece in pieces),
            chunk({}, finish_reason="tool_calls"),
            chunk(None, usage=USED),
        )
        return events, 4, 5
    started = {"type": "tool_use", "id": "c1", "name": "lookup", "input": {}}
    deltas = [{"type": "input_json_delta", "partial_json": part} for part in ('{"id"', ": 4}")]
    events = anthropic_events(
        message_start({"input_tokens": 30, "output_tokens": 1}),
        {"type": "content_block_start", "index": 0, "content_block": started},
        *({"type": "content_block_delta", "index": 0, "delta": delta} for delta in deltas),
        {"type": "content_block_stop", "index": 0},
        *finish("tool_use", 4),
    )
    return events, 5, 6


def stream_cuts() -> list[Any]:
    """Each provider's tool-call stream cut after each of its events, and ended there:
    closed, reset, or closed after the end marker a proxy adds to a stream its upstream
    cut (``[DONE]``, ``message_stop``)."""
    return [
        pytest.param(provider, sent, ending, id=f"{provider}-{sent}-{ending}")
        for provider in PROVIDERS
        for sent in range(1, len(tool_call_stream(provider)[0]) + 1)
        for ending in ("closed", "reset", "end marker added")
    ]


@pytest.mark.parametrize(("provider", "sent", "ending"), stream_cuts())
async def test_a_tool_call_stream_cut_anywhere_is_whole_or_asked_again(
    servers: Callable[..., RawServer], model_of: Models, provider: str, sent: int, ending: str
) -> None:
    """Wherever a tool call's stream is cut, and however it ends there, the call is run
    whole or the model is asked again (a retryable cut-off): never run on half its
    arguments, nor answered as a call of bad arguments. The end marker alone, without a
    finish reason, ends the answer only once the call's arguments are whole (Anthropic:
    its block stopped)."""
    events, arguments_whole, finished = tool_call_stream(provider)
    kept = events[:sent]
    marker = events[-1]
    if ending == "end marker added" and kept[-1] != marker:
        kept.append(marker)
    behaviour = broken(kept) if ending == "reset" else cut(kept)
    whole = sent >= finished or (ending == "end marker added" and sent >= arguments_whole)
    Looking, looked = looking()
    server = servers(behaviour, answered(provider))
    async with Looking(model=model_of(provider, server.url)) as agent:
        events_seen, log = await streamed(agent, timeout=20)
    retried = [event for event in events_seen if isinstance(event, ModelCallRetried)]
    assert not [result for m in log for result in m.tool_results if result.is_error]
    assert log[-1].text == "fine"
    if whole:
        assert looked == [4]
        assert retried == []
    else:
        assert looked == []
        assert [event.error_type for event in retried] == ["ProviderUnavailableError"]
        assert [message.text for message in log] == ["hello", "fine"]


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("reason", [None, "tool_use"], ids=["no stop reason", "a stop reason"])
async def test_an_unstreamed_tool_call_cut_off_is_asked_again_unless_its_answer_ended(
    servers: Callable[..., RawServer], model_of: Models, provider: str, reason: str | None
) -> None:
    """An unstreamed answer without its finish reason whose tool call's arguments are not
    a whole JSON object was cut on its way (a gateway that gathered a stream its upstream
    cut): it is asked again. With its finish reason, the arguments are the model's: the
    call is answered to it as invalid."""
    if provider == "openai":
        call = {"id": "c1", "type": "function"}
        call["function"] = {"name": "lookup", "arguments": '{"id"'}
        body: Any = completion_body({"tool_calls": [call]}, reason and "tool_calls")
    else:
        call = {"type": "tool_use", "id": "c1", "name": "lookup", "input": '{"id"'}
        body = message_body([call], reason)
    Looking, looked = looking()
    server = servers(lambda connection: connection.answer(200, body), answered_whole(provider))
    async with Looking(model=model_of(provider, server.url)) as agent:
        result = await agent.run("hello", timeout=20)
    errors = [answer for m in result.messages for answer in m.tool_results if answer.is_error]
    assert (looked, result.output, len(server.requests)) == ([], "fine", 2)
    assert len(errors) == (0 if reason is None else 1)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # as below
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_whose_event_is_malformed_after_it_reported_usage_is_billed(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    """An answer of the wrong shape is a ``ProtocolError`` (not retried); the usage its
    stream reported before the bad event was billed, and the run's usage counts it."""
    if provider == "openai":
        sent = openai_events(chunk({"content": "AB"}, usage=USED), chunk({"content": 7}))
        reported = Usage(30, 4)
    else:  # a delta of a block never started
        bad = {"type": "content_block_delta", "index": 3, "delta": {"type": "text_delta"}}
        sent = anthropic_events(message_start({"input_tokens": 30, "output_tokens": 1}), bad)
        reported = Usage(30, 1)
    server = servers(cut(sent))
    async with Plain(model=model_of(provider, server.url)) as agent:
        with pytest.raises(ProtocolError) as caught:
            await streamed(agent, timeout=20)
    assert caught.value.run_usage == reported
    assert len(server.requests) == 1


def token_counts(histograms: Histograms) -> dict[str, float]:
    """The tokens recorded in gen_ai.client.token.usage since the last read, by type."""
    return {
        dict(point.attributes or {})["gen_ai.token.type"]: point.sum
        for point in histograms.read().get("gen_ai.client.token.usage", [])
    }


def usage_shown(span: ReadableSpan) -> Usage:
    """The usage a span's GenAI attributes show."""
    shown = dict(span.attributes or {})
    return Usage(
        *(
            int(shown.get(f"gen_ai.usage.{name}", 0))
            for name in ("input_tokens", "output_tokens", "cache_read.input_tokens")
        )
    )


def reported_first(provider: str) -> tuple[list[bytes], Usage]:
    """A stream's first events, usage (vLLM's with each chunk; Anthropic's prompt tokens,
    most read from its cache, in ``message_start``) and the text ``AB``, and that usage."""
    if provider == "openai":
        return openai_events(chunk({"content": "AB"}, usage=USED), done=False), Usage(30, 4)
    started = message_start({"input_tokens": 5, "cache_read_input_tokens": 25, "output_tokens": 1})
    return anthropic_events(started, *text_block(0, "AB")[:2]), Usage(30, 1, 25)


@pytest.mark.parametrize(
    ("provider", "streaming"),
    [("openai", True), ("anthropic", True), ("anthropic", False)],
    ids=["openai", "anthropic", "anthropic unstreamed (a long answer's stream)"],
)
async def test_what_a_stream_reported_before_the_deadline_cut_it_is_billed(
    servers: Callable[..., RawServer],
    model_of: Models,
    spans: Spans,
    histograms: Histograms,
    provider: str,
    streaming: bool,
) -> None:
    """A stream the run's deadline cuts after the provider reported usage was billed
    that (a cancellation carries none): the ``DeadlineExceededError``'s ``run_usage``,
    the chat span and the token metric count it, cache reads included."""
    sent, reported = reported_first(provider)
    server = servers(stalled(sent))
    async with Plain(model=model_of(provider, server.url), cleanup_grace=0.5) as agent:
        with pytest.raises(DeadlineExceededError) as caught:
            if streaming:
                await streamed(agent, timeout=0.5)
            else:  # over LONGEST_UNSTREAMED: asked for as a stream
                await agent.run("hello", timeout=0.5, settings={"max_tokens": 10_000})
    assert caught.value.run_usage == reported
    assert usage_shown(spans.one("chat")) == usage_shown(spans.one("invoke_agent")) == reported
    assert token_counts(histograms) == {"input": 30, "output": reported.output_tokens}


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_what_a_stream_reported_before_its_consumer_left_is_billed(
    servers: Callable[..., RawServer],
    model_of: Models,
    spans: Spans,
    histograms: Histograms,
    provider: str,
) -> None:
    """A consumer that leaves ``agent.stream()`` at the first text stops the call; what
    its stream had reported is on the chat and invoke_agent spans and in the token
    metric."""
    sent, reported = reported_first(provider)
    server = servers(stalled(sent))
    async with (
        Plain(model=model_of(provider, server.url)) as agent,
        agent.stream("hello", timeout=20) as events,
    ):
        async for event in events:
            if isinstance(event, TextDelta):
                break
    assert usage_shown(spans.one("chat")) == usage_shown(spans.one("invoke_agent")) == reported
    assert token_counts(histograms) == {"input": 30, "output": reported.output_tokens}


def wrong_shape(provider: str, streaming: bool) -> Behaviour:
    """A whole answer, 30 tokens in and 4 out, of a shape the adapter refuses once it has
    it all: a legacy ``function_call`` (OpenAI), a stop reason that is a number
    (Anthropic)."""
    if provider == "openai":
        legacy = {"function_call": {"name": "lookup", "arguments": "{}"}}
        if streaming:
            return cut(openai_events(chunk(legacy, "function_call"), chunk(None, usage=USED)))
        body: Any = completion_body(legacy, "function_call", USED)
    else:
        if streaming:
            stopped = {"type": "message_delta", "delta": {"stop_reason": 7}}
            return cut(
                anthropic_events(
                    message_start({"input_tokens": 30, "output_tokens": 1}),
                    *text_block(0, "AB"),
                    {**stopped, "usage": {"output_tokens": 4}},
                    {"type": "message_stop"},
                )
            )
        body = message_body(
            [{"type": "text", "text": "AB"}], 7, {"input_tokens": 30, "output_tokens": 4}
        )
    return lambda connection: connection.answer(200, body)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # as below
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_a_whole_answer_of_the_wrong_shape_is_billed(
    servers: Callable[..., RawServer], model_of: Models, provider: str, streaming: bool
) -> None:
    """An answer refused for its shape once it had come whole, streamed or not, was
    billed: its ``ProtocolError`` carries its usage, and the run's usage counts it."""
    server = servers(wrong_shape(provider, streaming))
    async with Plain(model=model_of(provider, server.url)) as agent:
        with pytest.raises(ProtocolError) as caught:
            await asked(agent, streaming)
    assert caught.value.usage == caught.value.run_usage == Usage(30, 4)
    assert len(server.requests) == 1


@pytest.mark.parametrize("usage", [False, True], ids=["nothing", "the usage alone"])
async def test_an_openai_stream_that_ends_with_no_choice_is_no_empty_answer(
    servers: Callable[..., RawServer], model_of: Models, usage: bool
) -> None:
    """A stream that says ``[DONE]`` without any choice answered nothing: as a completion
    without choices, a ``ProtocolError``, not an empty answer that ends the run; the
    usage it reported is billed."""
    sent = openai_events(*([chunk(None, usage=USED)] if usage else []))
    server = servers(cut(sent))
    async with Plain(model=model_of("openai", server.url)) as agent:
        with pytest.raises(ProtocolError, match="has no choices") as caught:
            await streamed(agent, timeout=20)
    assert caught.value.run_usage == (Usage(30, 4) if usage else Usage())
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_stream_broken_before_it_reported_usage_bills_nothing(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    if provider == "openai":
        sent = openai_events(chunk({"content": "AB"}), done=False)
    else:
        sent = anthropic_events({"type": "ping"})
    server = servers(broken(sent), answered(provider))
    async with Plain(model=model_of(provider, server.url)) as agent:
        events, _ = await streamed(agent, timeout=20)
    [retried] = [event for event in events if isinstance(event, ModelCallRetried)]
    assert retried.usage == Usage()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_connection_lost_mid_stream_is_not_told_as_unreachable(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    """A connection that breaks after the answer began says so, and a provider that
    cannot be reached says that: the error tells the two apart, with the HTTP library's
    exception as its cause."""
    if provider == "openai":
        sent = openai_events(chunk({"content": "AB"}), done=False)
    else:
        sent = anthropic_events(message_start(), *text_block(0, "AB")[:2])
    server = servers(broken(sent))
    async with Plain(model=model_of(provider, server.url), max_retries=0) as agent:
        with pytest.raises(ProviderUnavailableError) as lost:
            await streamed(agent, timeout=20)
    assert lost.value.provider == provider
    assert "could not reach" not in str(lost.value)
    assert "connection to the provider was lost" in str(lost.value)
    assert lost.value.code == "connection_lost"
    assert isinstance(lost.value.__cause__, httpx2.TransportError)

    url = refused_url()
    async with Plain(model=model_of(provider, url), max_retries=0) as agent:
        with pytest.raises(ProviderUnavailableError) as refused:
            await agent.run("hello", timeout=20)
    where = url.removeprefix("http://").removesuffix("/v1")  # the host and port alone
    assert str(refused.value) == f"{provider}: the request could not reach the provider at {where}"
    assert refused.value.code == "connection_error"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_body_cut_short_is_a_lost_connection_and_retried(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    def cut(connection: Connection) -> None:
        connection.head(200, {"Content-Type": "application/json", "Content-Length": "300"})
        connection.send(b'{"id": "x",')
        time.sleep(0.05)
        connection.reset()

    server = servers(cut, cut, answered_whole(provider))
    model = model_of(provider, server.url)
    async with Plain(model=model, max_retries=0) as agent:
        with pytest.raises(ProviderUnavailableError, match="connection to the provider was lost"):
            await agent.run("hello", timeout=20)
    async with Plain(model=model, max_retries=1) as agent:
        assert (await agent.run("hello", timeout=20)).output == "fine"
    assert len(server.requests) == 3


KEY = "sk-live-0123456789abcdefXYZ"


# An answer the adapter stops reading (its error event) leaves httpcore's byte-stream
# generator, which httpx does not close, to the garbage collector: trio warns of it.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_a_key_the_server_quotes_back_is_not_in_the_error(
    servers: Callable[..., RawServer],
    model_of: Models,
    provider: str,
    streaming: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A server that quotes the key it was sent in its 401 (or in an error event of a
    stream) does not put it in littleghost's error, whose message a tool's error result
    or a log line may carry on; the error says it was refused, and is not retried."""
    kind = "authentication_error" if provider == "anthropic" else "invalid_request_error"
    quoted = {"error": {"message": f"Incorrect API key provided: {KEY}.", "type": kind}}
    if streaming:  # an error event, as Anthropic sends one, or an error chunk
        named = "error" if provider == "anthropic" else None
        event = {"type": "error", **quoted} if named else quoted
        server = servers(lambda connection: connection.events([sse(event, named)]))
    else:
        server = servers(status(401, quoted))
    caplog.set_level("DEBUG")
    async with Plain(model=model_of(provider, server.url, KEY)) as agent:
        with pytest.raises(ProviderError) as caught:
            await asked(agent, streaming)
    assert "Incorrect API key provided: [redacted]." in str(caught.value)
    assert KEY not in str(caught.value)
    assert KEY not in caplog.text
    assert len(server.requests) == 1
    assert type(caught.value) is InvalidRequestError
    assert caught.value.provider == provider
    assert caught.value.status == (None if streaming else 401)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_key_the_shortening_cuts_is_not_in_the_error(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    """A key quoted where the provider's message is cut to ``MAX_DETAIL_CHARS`` leaves
    none of its start in the error either."""
    kind = "authentication_error" if provider == "anthropic" else "invalid_request_error"
    text = "x" * (MAX_DETAIL_CHARS - 11) + f" {KEY} is not valid"  # cut in the key
    server = servers(status(401, {"error": {"message": text, "type": kind}}))
    async with Plain(model=model_of(provider, server.url, KEY)) as agent:
        with pytest.raises(InvalidRequestError) as caught:
            await agent.run("hello", timeout=20)
    message = str(caught.value)
    assert message.endswith(" [redacted]…")
    assert KEY[:4] not in message


async def test_a_key_a_given_client_fetches_is_not_in_the_error(
    servers: Callable[..., RawServer],
) -> None:
    """A client given with ``client=`` whose key comes from a provider (a function the
    SDK awaits before each request: a rotating token) has the key it sent hidden too."""

    async def key() -> str:
        return KEY

    quoted = {"error": {"message": f"Incorrect API key provided: {KEY}.", "type": "x"}}
    server = servers(status(401, quoted))
    client = openai.AsyncOpenAI(api_key=key, base_url=f"{server.url}/v1")
    async with Plain(model=OpenAIModel("gpt-4o-mini", client=client)) as agent:
        with pytest.raises(InvalidRequestError) as caught:
            await agent.run("hello", timeout=20)
    assert "Incorrect API key provided: [redacted]." in str(caught.value)
    await client.close()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # as above
@pytest.mark.parametrize(
    "kind", ["authentication_error", "permission_error", "not_found_error", "request_too_large"]
)
async def test_an_anthropic_error_event_of_a_refusal_is_not_retried(
    servers: Callable[..., RawServer], model_of: Models, kind: str
) -> None:
    """Anthropic's error types of a refused request, sent in a stream's error event (HTTP
    200), are refused requests as their statuses are: not retried."""
    event = {"type": "error", "error": {"type": kind, "message": "refused"}}
    server = servers(lambda connection: connection.events([sse(event, "error")]))
    async with Plain(model=model_of("anthropic", server.url)) as agent:
        with pytest.raises(InvalidRequestError, match="refused") as caught:
            await streamed(agent, timeout=20)
    assert caught.value.code == kind
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_key_quoted_in_an_error_sent_with_a_200_is_not_in_the_error(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    quoted = {"message": f"Incorrect API key provided: {KEY}.", "type": "invalid_request_error"}
    body = {"type": "error", "error": quoted} if provider == "anthropic" else {"error": quoted}
    server = servers(status(200, body))
    async with Plain(model=model_of(provider, server.url, KEY)) as agent:
        with pytest.raises(InvalidRequestError, match=r"provided: \[redacted\]\.") as caught:
            await agent.run("hello", timeout=20)
    assert KEY not in str(caught.value)


def sse(event: object, kind: str | None) -> bytes:
    """One server-sent event of ``event`` in JSON, named ``kind``."""
    named = f"event: {kind}\n" if kind else ""
    return f"{named}data: {json.dumps(event)}\n\n".encode()


# --- what already held: kept so ----------------------------------------------------------


def status(code: int, body: object, headers: dict[str, str] | None = None) -> Behaviour:
    return lambda connection: connection.answer(code, body, headers)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_a_reset_before_the_headers_is_retried_once_by_littleghost_alone(
    servers: Callable[..., RawServer], model_of: Models, provider: str, streaming: bool
) -> None:
    server = servers(
        Connection.reset, answered(provider) if streaming else answered_whole(provider)
    )
    async with Plain(model=model_of(provider, server.url)) as agent:
        if streaming:
            events, log = await streamed(agent, timeout=20)
            assert [type(event) for event in events[:1]] == [ModelCallRetried]
        else:
            log = list((await agent.run("hello", timeout=20)).messages)
    assert [message.text for message in log] == ["hello", "fine"]
    assert len(server.requests) == 2  # the SDK retried nothing of its own
    assert [request.headers.get("x-stainless-retry-count") for request in server.requests] == [
        "0",
        "0",
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_text_a_broken_stream_sent_is_never_in_the_log(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    if provider == "openai":
        sent = openai_events(chunk({"content": "PARTIAL "}), done=False)
    else:
        sent = anthropic_events(message_start(), *text_block(0, "PARTIAL ")[:2])
    server = servers(broken(sent), answered(provider))
    async with Plain(model=model_of(provider, server.url)) as agent:
        events, log = await streamed(agent, timeout=20)
    texts = [event.text for event in events if isinstance(event, TextDelta)]
    assert texts == ["PARTIAL ", "fi", "ne"]
    assert [type(event).__name__ for event in events].index("ModelCallRetried") == 1
    assert [(message.role, message.text) for message in log] == [
        (Role.USER, "hello"),
        (Role.ASSISTANT, "fine"),
    ]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_retry_after_in_seconds_or_as_a_date_is_waited_for(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    limited = {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}
    server = servers(
        status(429, limited, {"Retry-After": "1"}),
        status(429, limited, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),  # past
        answered_whole(provider),
    )
    async with Plain(model=model_of(provider, server.url)) as agent:
        assert (await agent.run("hello", timeout=20)).output == "fine"
    assert server.times[1] - server.times[0] >= 0.95

    server = servers(status(429, limited, {"Retry-After": "30"}))
    async with Plain(model=model_of(provider, server.url)) as agent:
        with pytest.raises(DeadlineExceededError) as caught:
            await agent.run("hello", timeout=5)
    assert isinstance(caught.value.__cause__, RateLimitError)
    assert caught.value.__cause__.status == 429
    assert len(server.requests) == 1


LIMITED = {"error": {"message": "Rate limit reached", "type": "rate_limit_error"}}
NO_WAITS = ["soon", "-4", "nan", "", "Wed, 99 Foo 2015 07:28:00 GMT"]
"""``Retry-After`` values that are no wait, passed over."""


def repeated(code: int, body: object, lines: list[tuple[str, str]]) -> Behaviour:
    """An error answer of ``body`` whose head has ``lines``, a header name repeated."""

    def behaviour(connection: Connection) -> None:
        sent = json.dumps(body).encode()
        head = [f"HTTP/1.1 {code} Status", "Content-Type: application/json"]
        head += [f"Content-Length: {len(sent)}", *(f"{name}: {value}" for name, value in lines)]
        connection.send(("\r\n".join(head) + "\r\n\r\n").encode() + sent)

    return behaviour


def asked_waits(rng: random.Random) -> tuple[list[tuple[str, str]], float]:
    """A random head of ``Retry-After`` (or ``retry-after-ms``) sent more than once: its
    values on lines of their own, joined with commas on one, or both, no-waits among
    them; and the longest wait it asks for, in seconds (under ``MAX_RETRY_AFTER``)."""
    in_ms = rng.random() < 0.25
    values: list[str] = []
    waits: list[float] = []
    for _ in range(rng.randint(2, 4)):
        seconds = rng.choice([0, rng.randint(1, 250), rng.randint(1, 2500) / 10])
        if in_ms:
            values.append(f"{seconds * 1000:g}")
        elif rng.random() < 0.3:  # an HTTP date, past (a wait of 0) or to come
            seconds = rng.choice([0, rng.randint(20, 250)])
            ahead = seconds if seconds else -rng.randint(1, 10**6)
            values.append(email.utils.formatdate(time.time() + ahead, usegmt=True))
        else:
            values.append(f"{seconds:g}")
        waits.append(seconds)
    values += rng.sample(NO_WAITS, rng.randint(0, 2))
    rng.shuffle(values)
    name = rng.choice(["retry-after-ms"] if in_ms else ["Retry-After", "retry-after"])
    lines: list[tuple[str, str]] = []
    while values:
        taken = rng.randint(1, len(values))
        lines.append((name, ", ".join(values[:taken])))
        values = values[taken:]
    return lines, max(waits)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_a_retry_after_sent_twice_asks_for_its_longest_wait(
    servers: Callable[..., RawServer], model_of: Models, provider: str, streaming: bool
) -> None:
    """``Retry-After`` sent twice (two lines, or a pair a proxy joined with a comma), in
    seconds, HTTP dates or ``retry-after-ms``: the HTTP library joins the lines with a
    comma, and the wait was none (the retry went at once). The longest wait is asked
    for; a value that is no wait is passed over."""
    rng = random.Random(f"{provider} {streaming}")
    heads = [asked_waits(rng) for _ in range(12)]
    server = servers(*(repeated(429, LIMITED, lines) for lines, _ in heads))
    async with Plain(model=model_of(provider, server.url), max_retries=0) as agent:
        for lines, longest in heads:
            with pytest.raises(RateLimitError) as caught:
                await asked(agent, streaming)
            assert caught.value.retry_after == pytest.approx(longest, abs=2), lines
    assert len(server.requests) == len(heads)

    twice = [("Retry-After", "1"), ("Retry-After", "30")]
    server = servers(repeated(429, LIMITED, twice), answered_whole(provider))
    async with Plain(model=model_of(provider, server.url)) as agent:
        with pytest.raises(DeadlineExceededError) as late:
            await agent.run("hello", timeout=3)
    assert isinstance(late.value.__cause__, RateLimitError)
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_a_word_on_retrying_sent_twice_is_read(
    servers: Callable[..., RawServer], model_of: Models, provider: str, streaming: bool
) -> None:
    """``x-should-retry`` sent twice (``true, true`` once joined) was no word: a 409 lock
    timeout marked so failed at once. The same word twice is read; two that differ are
    none. So is OpenAI's ``x-ratelimit-*`` of a limit used up, sent twice: its longest
    reset is the wait."""
    told = [("x-should-retry", "true"), ("X-Should-Retry", "true")]
    answer = answered(provider) if streaming else answered_whole(provider)
    server = servers(repeated(409, LOCKED, told), answer)
    async with Plain(model=model_of(provider, server.url)) as agent:
        log = await asked(agent, streaming)
    assert log[-1].text == "fine"
    assert len(server.requests) == 2

    differing = [("x-should-retry", "true, false")]
    limits = [
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-remaining-requests", "0"),
        ("x-ratelimit-reset-requests", "6m0s, 20s"),
    ]
    server = servers(repeated(409, LOCKED, differing), repeated(429, LIMITED, limits))
    async with Plain(model=model_of(provider, server.url), max_retries=0) as agent:
        caught = []
        for expected in (InvalidRequestError, RateLimitError):
            with pytest.raises(expected) as raised:
                await asked(agent, streaming)
            caught.append(raised.value)
    assert caught[0].should_retry is None
    assert caught[1].retry_after == 360
    assert len(server.requests) == 2


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("where", ["before the headers", "mid-stream"])
async def test_a_silent_server_cannot_hold_a_run_past_its_deadline(
    servers: Callable[..., RawServer], model_of: Models, provider: str, streaming: bool, where: str
) -> None:
    def silent(connection: Connection) -> None:
        if where == "mid-stream" and streaming:
            connection.head(200, {"Content-Type": "text/event-stream"})
            first = chunk({"content": "A"}) if provider == "openai" else message_start()
            connection.send(f"data: {json.dumps(first)}\n\n".encode())
        elif where == "mid-stream":  # a body begun
            connection.head(200, {"Content-Type": "application/json", "Content-Length": "300"})
            connection.send(b'{"id": "x",')
        connection.stall()

    server = servers(silent, answered(provider) if streaming else answered_whole(provider))
    model = model_of(provider, server.url)
    async with Plain(model=model, cleanup_grace=0.5) as agent:
        started = anyio.current_time()
        with pytest.raises(DeadlineExceededError):  # 1 s: a loaded machine's first request
            if streaming:  # (its client made, the window probed) took 0.5 s and more
                await streamed(agent, timeout=1)
            else:
                await agent.run("hello", timeout=1)
        assert anyio.current_time() - started < 1 + 0.5 + LATE  # deadline, grace
        assert len(server.requests) == 1  # it was the silent server that held the run
        # the connection it left is not reused: the next run is answered
        log = await asked(agent, streaming)
        assert log[-1].text == "fine"


# --- the provider's x-should-retry ------------------------------------------------------

LOCKED = {"error": {"message": "The resource is locked: try again", "type": "conflict"}}


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_a_refusal_the_provider_says_to_retry_is_retried(
    servers: Callable[..., RawServer], model_of: Models, provider: str, streaming: bool
) -> None:
    """``x-should-retry: true`` on a 409 (a lock timeout): retried as a transient error
    is, within ``max_retries``; when the retries run out the caller sees what the
    provider answered, a refused request, with the provider's word on it."""
    told = status(409, LOCKED, {"x-should-retry": "true"})
    answer = answered(provider) if streaming else answered_whole(provider)

    async def run(agent: Agent) -> str:
        if streaming:
            _, log = await streamed(agent, timeout=20)
            return log[-1].text
        return str((await agent.run("hello", timeout=20)).output)

    server = servers(told, answer)
    async with Plain(model=model_of(provider, server.url)) as agent:
        assert await run(agent) == "fine"
    assert len(server.requests) == 2

    server = servers(told)
    async with Plain(model=model_of(provider, server.url), max_retries=2) as agent:
        with pytest.raises(InvalidRequestError) as caught:
            await run(agent)
    assert len(server.requests) == 3
    assert caught.value.status == 409
    assert caught.value.should_retry is True
    assert "locked" in str(caught.value)

    server = servers(status(409, LOCKED, {"x-should-retry": "true", "Retry-After": "30"}))
    async with Plain(model=model_of(provider, server.url)) as agent:
        with pytest.raises(DeadlineExceededError) as late:
            await agent.run("hello", timeout=3)
    assert isinstance(late.value.__cause__, InvalidRequestError)
    assert len(server.requests) == 1

    server = servers(status(409, LOCKED))  # without the header: a refusal, not retried
    async with Plain(model=model_of(provider, server.url)) as agent:
        with pytest.raises(InvalidRequestError) as refused:
            await run(agent)
    assert refused.value.should_retry is None
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("code", "kind", "expected"),
    [
        (503, "overloaded_error", ProviderUnavailableError),
        (500, "api_error", ProviderUnavailableError),
        (429, "rate_limit_error", RateLimitError),
    ],
)
async def test_an_error_the_provider_says_not_to_retry_is_not_retried(
    servers: Callable[..., RawServer],
    model_of: Models,
    provider: str,
    streaming: bool,
    code: int,
    kind: str,
    expected: type[ProviderError],
) -> None:
    """``x-should-retry: false`` on a 5xx or a 429: raised at once, as the type it is."""
    body = {"error": {"message": "Not this one", "type": kind}}
    server = servers(status(code, body, {"x-should-retry": "false"}), answered(provider))
    async with Plain(model=model_of(provider, server.url)) as agent:
        with pytest.raises(expected) as caught:
            await asked(agent, streaming)
    assert type(caught.value) is expected
    assert caught.value.status == code
    assert caught.value.should_retry is False
    assert len(server.requests) == 1


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # as above
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    ("told", "kind", "attempts"),
    [("false", "overloaded_error", 2), ("true", "authentication_error", 1)],
)
async def test_a_200s_x_should_retry_does_not_judge_an_error_the_stream_reports_later(
    servers: Callable[..., RawServer],
    model_of: Models,
    provider: str,
    told: str,
    kind: str,
    attempts: int,
) -> None:
    """The header came with the stream's 200, before the answer was generated: it cannot
    speak for an error the stream reports after (the SDKs never judge a stream's error
    events by it either: they come once the request, which their retries cover, is over).
    The event's own type decides, as without the header: an overload is retried, a
    refusal is not."""
    if provider == "openai" and kind == "authentication_error":
        kind = "invalid_request_error"  # OpenAI's type of a refusal
    error = {"error": {"type": kind, "message": "stopped"}}
    if provider == "anthropic":
        sent = [*anthropic_events(message_start()), sse({"type": "error", **error}, "error")]
    else:
        sent = [*openai_events(chunk({"content": "A"}), done=False), sse(error, None)]

    def behaviour(connection: Connection) -> None:
        connection.head(200, {"Content-Type": "text/event-stream", "x-should-retry": told})
        for event in sent:
            connection.send(event)
        time.sleep(0.05)  # the client reads them before the reset
        connection.reset()

    server = servers(behaviour, answered(provider))
    async with Plain(model=model_of(provider, server.url), max_retries=1) as agent:
        if attempts == 1:
            with pytest.raises(InvalidRequestError) as caught:
                await streamed(agent, timeout=20)
            assert caught.value.should_retry is None
        else:
            _, log = await streamed(agent, timeout=20)
            assert log[-1].text == "fine"
    assert len(server.requests) == attempts


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # as above
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize(
    ("streaming", "code", "silent", "attempts"),
    [
        (False, 200, False, 1),
        (False, 200, True, 1),
        (False, 503, False, 1),
        (True, 503, False, 1),
        (True, 200, False, 2),
    ],
    ids=["whole-200", "whole-200-silent", "whole-503", "streamed-503", "streamed-200"],
)
async def test_x_should_retry_false_judges_a_body_lost_after_a_head_that_speaks_for_it(
    servers: Callable[..., RawServer],
    model_of: Models,
    provider: str,
    streaming: bool,
    code: int,
    silent: bool,
    attempts: int,
) -> None:
    """A head marked ``x-should-retry: false`` whose body is then lost (a reset halfway,
    or a server gone ``silent`` past ``request_timeout``):
    a whole answer's head (any status: it is sent once the answer is made) and an error
    status's head are the provider's word on the request, so it is not sent again; the
    error says the connection was lost, the error status and the provider's word. A
    stream's 200 head is sent before the answer is generated: a stream lost after it is
    retried, as without the header."""
    streamed_ok = streaming and code == 200
    kind = "text/event-stream" if streamed_ok else "application/json"
    if streamed_ok:
        first = chunk({"content": "A"}) if provider == "openai" else message_start()
        half = f"data: {json.dumps(first)}\n\n".encode()
    else:
        half = b'{"error": {"message": "Not th'

    def cut(connection: Connection) -> None:
        connection.head(
            code, {"Content-Type": kind, "Content-Length": "4000", "x-should-retry": "false"}
        )
        connection.send(half)
        if silent:
            connection.stall()
        time.sleep(0.05)  # the client reads the head before the reset
        connection.reset()

    answer = answered(provider) if streaming else answered_whole(provider)
    server = servers(cut, answer)
    model = model_of(provider, server.url, request_timeout=0.5 if silent else None)
    async with Plain(model=model, max_retries=1) as agent:
        if attempts == 2:
            _, log = await streamed(agent, timeout=20)
            assert log[-1].text == "fine"
        else:
            with pytest.raises(ProviderUnavailableError) as caught:
                await asked(agent, streaming)
            assert caught.value.code == ("timeout" if silent else "connection_lost")
            assert caught.value.should_retry is False
            assert caught.value.status == (None if code == 200 else code)
    assert len(server.requests) == attempts


def _cut_after_head(provider: str, *, streaming: bool, told: str | None) -> Behaviour:
    """A 200 head (``x-should-retry: told``), half a body, then a reset."""
    headers = {} if told is None else {"x-should-retry": told}
    if streaming:
        first = chunk({"content": "A"}) if provider == "openai" else message_start()
        headers.update({"Content-Type": "text/event-stream", "Content-Length": "4000"})
        half = f"data: {json.dumps(first)}\n\n".encode()
    else:
        headers.update({"Content-Type": "application/json", "Content-Length": "4000"})
        half = b'{"id": "cut'

    def cut(connection: Connection) -> None:
        connection.head(200, headers)
        connection.send(half)
        time.sleep(0.05)  # the client reads the head before the reset
        connection.reset()

    return cut


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # as above
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_x_should_retry_is_read_before_a_client_s_own_hooks_read_the_body(
    servers: Callable[..., RawServer], provider: str
) -> None:
    """A client given whose HTTP client has a response hook of the user's that reads the
    body (to log it): a whole answer's ``x-should-retry: false`` is read first, so the
    body lost in the user's hook is not sent again."""

    async def logged(response: httpx2.Response) -> None:
        await response.aread()

    server = servers(
        _cut_after_head(provider, streaming=False, told="false"), answered_whole(provider)
    )
    http = httpx2.AsyncClient(event_hooks={"response": [logged]})
    model: OpenAIModel | AnthropicModel
    if provider == "openai":
        sdk = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{server.url}/v1", http_client=http)
        model = OpenAIModel("gpt-4o-mini", client=sdk)
    else:
        sdk = anthropic.AsyncAnthropic(api_key="sk-test", base_url=server.url, http_client=http)
        model = AnthropicModel("claude-sonnet-5", client=sdk)
    try:
        async with Plain(model=model, max_retries=1) as agent:
            with pytest.raises(ProviderUnavailableError) as caught:
                await agent.run("hello", timeout=20)
    finally:
        await http.aclose()
    assert caught.value.should_retry is False
    assert len(server.requests) == 1
    assert http.event_hooks["response"][-1] is logged  # the user's hook is kept, last


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # as above
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_redirect_s_x_should_retry_says_nothing_of_the_stream_it_leads_to(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    """A redirect's head (whose request shares its extensions with the redirected one)
    marked ``x-should-retry: false``, then a stream's 200 head and a stream lost after
    it: the stream is retried, as without the redirect."""
    path = "/v1/chat/completions" if provider == "openai" else "/v1/messages"

    def redirect(connection: Connection) -> None:
        headers = {"Location": path, "Content-Length": "0", "x-should-retry": "false"}
        connection.head(307, headers)

    server = servers(
        redirect, _cut_after_head(provider, streaming=True, told=None), answered(provider)
    )
    async with Plain(model=model_of(provider, server.url), max_retries=1) as agent:
        _, log = await streamed(agent, timeout=20)
    assert log[-1].text == "fine"
    assert len(server.requests) == 3


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
async def test_a_redirect_to_a_get_or_to_another_server_fails_at_once_naming_it(
    servers: Callable[..., RawServer], model_of: Models, provider: str, streaming: bool, code: int
) -> None:
    """A gateway that redirects the POST to its sign-in page (or ``http://`` to
    ``https://`` with a 301): followed, the request went again as a GET without its body,
    and the page came back as an error retried in vain. A 307 or 308 to another server
    was sent it, the prompt and the client's headers with it (a key in a header of its
    own: Azure's ``api-key``, a gateway's). Either fails at once, naming the redirect and
    the host it leads to (here a port that refuses), never the credentials, path or
    query of its ``Location``."""
    target = refused_url().replace("http://", "http://user:pw@") + "/login?token=secret"

    def redirect(connection: Connection) -> None:
        connection.head(code, {"Location": target, "Content-Length": "0"})

    server = servers(redirect, answered(provider) if streaming else answered_whole(provider))
    async with Plain(model=model_of(provider, server.url)) as agent:
        with pytest.raises(InvalidRequestError) as caught:
            await asked(agent, streaming)
    assert caught.value.status == code
    assert caught.value.code == "redirected"
    where = target.removeprefix("http://user:pw@").partition("/")[0]
    assert f"(HTTP {code}) to {where}," in str(caught.value)
    assert "pw" not in str(caught.value) and "secret" not in str(caught.value)
    assert len(server.requests) == 1


KEEP_ALIVES = [b"data:\n\n", b"data: \n\n", b"data:  \r\n\r\n", b"event: ping\ndata:\n\n"]
"""Events of a proxy's that carry nothing: ``data:`` alone."""
AFTER_THE_ANSWER = [b"data: keep-alive\n\n", b"data: ping\n\n", b'data: {"type": \n\n']
"""Events of a proxy's, after the answer is whole, that are not JSON."""


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("seed", range(4))
async def test_events_a_proxy_sends_that_carry_nothing_are_passed_over(
    servers: Callable[..., RawServer], model_of: Models, provider: str, seed: int
) -> None:
    """Keep-alives of ``data:`` alone anywhere in a stream, and text that is no JSON once
    the answer is whole: each failed the call as an event that is not JSON (a
    ``ProtocolError``, not retried; the whole answer billed and lost, the run failed)."""
    rng = random.Random(seed)
    if provider == "openai":
        events = openai_events(
            chunk({"content": "fi"}),
            chunk({"content": "ne"}, finish_reason="stop"),
            chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}),
            done=rng.random() < 0.5,
        )
    else:
        events = anthropic_events(
            message_start({"input_tokens": 9, "output_tokens": 1}),
            *text_block(0, "fi", "ne"),
            *finish("end_turn", 2),
        )
    sent: list[bytes] = []
    for event in events:
        sent += [*rng.choices(KEEP_ALIVES, k=rng.randint(0, 2)), event]
    sent += rng.choices(KEEP_ALIVES + AFTER_THE_ANSWER, k=rng.randint(1, 3))
    server = servers(lambda connection: connection.events(sent))
    async with Plain(model=model_of(provider, server.url)) as agent:
        _, log = await streamed(agent, timeout=20)
    assert log[-1].text == "fine"
    assert len(server.requests) == 1


MALFORMED = {
    "openai": [
        b"data: 42\n\n",
        b'data: ["a"]\n\n',
        b"data: null\n\n",
        b'data: {"choices": "none"}\n\n',
        b'data: {"choices": [{"index": "x"}]}\n\n',
        b'data: {"choices": [{"delta": 7}]}\n\n',
        b'data: {"choices": [{"delta": {"tool_calls": [5]}}]}\n\n',
        b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n",  # deeper than json reads
    ],
    "anthropic": [
        b"data: 42\n\n",
        b'event: ping\ndata: ["a"]\n\n',
        b'data: {"no": "type"}\n\n',
        b'data: {"type": 5}\n\n',
        b'event: message_delta\ndata: {"type": "message_delta", "delta": "x"}\n\n',
        b'data: {"type": "content_block_delta", "index": "x", "delta": {}}\n\n',
        b'data: {"type": "content_block_delta", "index": 9, "delta": '
        b'{"type": "text_delta", "text": "X"}}\n\n',
        b'data: {"type": "content_block_start", "index": 0, "content_block": '
        b'{"type": "text", "text": ""}}\n\n',
        b"data: " + b"[" * 100_000 + b"]" * 100_000 + b"\n\n",
    ],
}
"""Events of the wrong shape (JSON, but not the provider's), and one nested deeper than
Python's JSON parser reads."""


# The error event the adapter stops reading at leaves httpcore's byte-stream generator,
# which httpx does not close, to the garbage collector: trio warns of it.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_an_event_of_the_wrong_shape_after_the_whole_answer_is_passed_over(
    servers: Callable[..., RawServer], model_of: Models, provider: str, streaming: bool
) -> None:
    """An event of the wrong shape after the answer's finish reason or last event (after
    Anthropic's ``message_stop``, OpenAI's ``[DONE]``) failed the whole answer, billed,
    as a ``ProtocolError``, not retried: the run failed. It is passed over, as text that
    is no JSON there is; an error event there still fails the call."""
    rng = random.Random(f"{provider} {streaming}")
    shapes = []
    for _ in range(10):
        events = whole_answer(provider, last=rng.random() < 0.7)
        events += rng.sample(MALFORMED[provider], rng.randint(1, 3))
        events += rng.choices(KEEP_ALIVES + AFTER_THE_ANSWER, k=rng.randint(0, 2))
        shapes.append(events)
    server = servers(*(labelled("text/event-stream", events, sized=False) for events in shapes))
    async with Plain(model=model_of(provider, server.url), max_retries=0) as agent:
        for _ in shapes:
            log = await asked(agent, streaming)
            assert log[-1].text == "ABC"
    assert len(server.requests) == len(shapes)

    if provider == "openai":
        erred = b'data: {"error": {"message": "busy", "type": "server_error"}}\n\n'
    else:
        overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
        erred = f"event: error\ndata: {json.dumps(overloaded)}\n\n".encode()
    sent = [*whole_answer(provider, last=True), MALFORMED[provider][0], erred]
    server = servers(labelled("text/event-stream", sent, sized=False))
    async with Plain(model=model_of(provider, server.url), max_retries=0) as agent:
        with pytest.raises(ProviderUnavailableError, match="busy"):
            await asked(agent, streaming)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_answer_not_streamed_that_came_as_events_is_read_as_a_stream(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    """A server or proxy that streams whatever it is asked: its answer to a call not
    streamed, a body of events, failed as a body that is not JSON, asked for three more
    times (each billed), then the call failed. It is read as the stream it is: a whole
    one is the answer, billed once; one cut off is asked for again."""
    if provider == "openai":
        cut = openai_events(chunk({"content": "fi"}), done=False)
    else:
        cut = anthropic_events(message_start({"input_tokens": 9, "output_tokens": 1}))
    server = servers(lambda connection: connection.events(cut), answered(provider))
    async with Plain(model=model_of(provider, server.url)) as agent:
        result = await agent.run("hello", timeout=20)
    assert result.output == "fine"
    assert len(server.requests) == 2
    assert all(request.json.get("stream") is not True for request in server.requests)
    assert result.usage.output_tokens == 2 + (provider == "anthropic")  # the cut one's


def events_of(provider: str, text: str = "fine") -> list[bytes]:
    """The events of a whole answer of ``text``, streamed as two pieces."""
    if provider == "openai":
        return openai_events(
            chunk({"content": text[:2]}),
            chunk({"content": text[2:]}, finish_reason="stop"),
            chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11}),
        )
    return anthropic_events(
        message_start({"input_tokens": 9, "output_tokens": 1}),
        *text_block(0, text[:2], text[2:]),
        *finish("end_turn", 2),
    )


def labelled(kind: str, events: list[bytes], *, sized: bool) -> Behaviour:
    """``events`` as one body labelled ``kind`` (its ``Content-Length`` given when
    ``sized``, else the connection closed after it)."""
    body = b"".join(events)
    length = {"Content-Length": str(len(body))} if sized else {"Connection": "close"}

    def behaviour(connection: Connection) -> None:
        connection.head(200, {"Content-Type": kind, **length})
        connection.send(body)
        if not sized:
            connection.sock.shutdown(socket.SHUT_RDWR)
            connection.sock.close()

    return behaviour


# An error event the adapter stops reading leaves httpcore's byte-stream generator, which
# httpx does not close, to the garbage collector: trio warns of it.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("kind", ["application/json", "application/json; charset=utf-8"])
async def test_events_labelled_json_are_read_as_a_stream(
    servers: Callable[..., RawServer],
    model_of: Models,
    provider: str,
    streaming: bool,
    kind: str,
) -> None:
    """A server or proxy that streams whatever it is asked and labels it JSON: its answer
    to a call not streamed failed as a body that is not JSON (the SDK parses a body so
    labelled first), asked for again (each billed). It is read as the stream it is, as
    events labelled so are: a whole one is the answer, billed once; one cut off is asked
    for again; an error event is classified. A streamed call read it as its stream, and
    still does."""
    if provider == "openai":
        cut = openai_events(chunk({"content": "fi"}), done=False)
    else:
        cut = anthropic_events(message_start({"input_tokens": 9, "output_tokens": 1}))
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    erred = [f"event: error\ndata: {json.dumps(overloaded)}\n\n".encode()]
    server = servers(
        labelled(kind, cut, sized=True),
        labelled(kind, erred, sized=False),
        labelled(kind, events_of(provider), sized=streaming),
    )
    async with Plain(model=model_of(provider, server.url)) as agent:
        if streaming:
            events, log = await streamed(agent, timeout=20)
            retried = [event for event in events if isinstance(event, ModelCallRetried)]
            assert [event.error_type for event in retried] == ["ProviderUnavailableError"] * 2
            assert log[-1].text == "fine"
        else:
            result = await agent.run("hello", timeout=20)
            assert result.output == "fine"
            assert result.usage.output_tokens == 2 + (provider == "anthropic")  # the cut one's
    assert len(server.requests) == 3
    assert all(bool(request.json.get("stream")) is streaming for request in server.requests)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("code", [307, 308])
async def test_a_redirect_that_keeps_the_request_on_its_server_is_followed(
    servers: Callable[..., RawServer], model_of: Models, provider: str, code: int
) -> None:
    path = "/v1/chat/completions" if provider == "openai" else "/v1/messages"

    def redirect(connection: Connection) -> None:
        connection.head(code, {"Location": f"{path}?moved=1", "Content-Length": "0"})

    server = servers(redirect, answered_whole(provider))
    async with Plain(model=model_of(provider, server.url)) as agent:
        assert (await agent.run("hello", timeout=20)).output == "fine"
    assert [request.path.endswith("?moved=1") for request in server.requests] == [False, True]
    assert server.requests[0].body == server.requests[1].body


# --- an attempt's own timeout -----------------------------------------------------------


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streaming", [False, True], ids=["whole", "streamed"])
async def test_request_timeout_ends_an_attempt_on_a_silent_server(
    servers: Callable[..., RawServer], model_of: Models, provider: str, streaming: bool
) -> None:
    """With no deadline, an attempt on a server gone silent (no answer at all, or a
    stream that stops) ends after ``request_timeout`` seconds as a timeout and is
    retried; the next attempt is answered."""

    def silent(connection: Connection) -> None:
        if streaming:  # the stream begins, then nothing more comes
            connection.head(200, {"Content-Type": "text/event-stream"})
            first = chunk({"content": "A"}) if provider == "openai" else message_start()
            connection.send(f"data: {json.dumps(first)}\n\n".encode())
        connection.stall()

    answer = answered(provider) if streaming else answered_whole(provider)
    server = servers(silent, silent, answer)
    model = model_of(provider, server.url, request_timeout=0.3)
    async with Plain(model=model, max_retries=1) as agent:
        started = anyio.current_time()
        with pytest.raises(ProviderUnavailableError) as caught:
            if streaming:
                await streamed(agent)
            else:
                await agent.run("hello")
        took = anyio.current_time() - started
        assert caught.value.code == "timeout"
        assert len(server.requests) == 2
        assert took >= 2 * 0.3
        assert took < 2 * 0.3 + LATE  # the attempts (the retry at once)
        if streaming:
            _, log = await streamed(agent)
            assert log[-1].text == "fine"
        else:
            assert (await agent.run("hello")).output == "fine"


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_wait_for_a_pooled_connection_past_the_pool_timeout_says_so(
    provider: str,
) -> None:
    """A request waiting past its client's pool timeout for a connection (every one in
    use by other runs) fails as a timeout that names the pool: it was never sent."""
    server = RawServer(Connection.stall)
    http = httpx2.AsyncClient(
        limits=httpx2.Limits(max_connections=1), timeout=httpx2.Timeout(30, pool=0.2)
    )
    model: OpenAIModel | AnthropicModel
    if provider == "openai":
        given: Any = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="k", http_client=http)
        model = OpenAIModel("gpt-4o-mini", client=given)
    else:
        given = anthropic.AsyncAnthropic(base_url=server.url, api_key="k", http_client=http)
        model = AnthropicModel("claude-sonnet-4-5", client=given)
    try:
        async with Plain(model=model, max_retries=1) as agent, anyio.create_task_group() as group:
            group.start_soon(agent.run, "holds the only connection")
            assert await eventually(lambda: bool(server.requests))
            with pytest.raises(ProviderUnavailableError) as caught:
                await agent.run("waits for it")
            group.cancel_scope.cancel()
        assert caught.value.code == "timeout"
        assert "waiting for a connection of its HTTP client's pool" in str(caught.value)
        assert "never sent" in str(caught.value)
        assert len(server.requests) == 1
    finally:
        await given.close()
        server.close()


async def test_request_timeout_applies_to_a_client_given() -> None:
    import openai

    server = RawServer(Connection.stall)
    given = openai.AsyncOpenAI(base_url=f"{server.url}/v1", api_key="sk-test")
    try:
        model = OpenAIModel("gpt-4o-mini", client=given, request_timeout=0.3)
        async with Plain(model=model, max_retries=0) as agent:
            with anyio.fail_after(10):
                with pytest.raises(ProviderUnavailableError, match="timed out"):
                    await agent.run("hello")
    finally:
        await given.close()
        server.close()


@pytest.mark.parametrize("wrong", [0, -1, float("inf"), float("nan"), "30", True])
def test_a_request_timeout_that_is_not_seconds_is_refused(wrong: object) -> None:
    for make in (
        lambda: OpenAIModel("gpt-4o-mini", api_key="sk-test", request_timeout=wrong),
        lambda: AnthropicModel("claude-sonnet-5", api_key="sk-test", request_timeout=wrong),
    ):
        with pytest.raises(ConfigurationError, match="request_timeout must be seconds > 0"):
            make()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_an_overflow_is_not_retried_as_is_whatever_the_provider_says(
    servers: Callable[..., RawServer], model_of: Models, provider: str
) -> None:
    """An overflow marked ``x-should-retry: true`` is still an overflow: the same prompt
    is not sent again."""
    body = {"error": {"message": "prompt is too long: 9000 tokens > 4096 maximum"}}
    server = servers(status(400, body, {"x-should-retry": "true"}), answered_whole(provider))
    async with Plain(model=model_of(provider, server.url)) as agent:
        with pytest.raises(ContextWindowOverflowError) as caught:
            await agent.run("hello", timeout=20)
    assert caught.value.should_retry is True
    assert len(server.requests) == 1
