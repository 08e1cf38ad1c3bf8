"""``aclose()`` of an ``OpenAIModel`` or ``AnthropicModel`` while a call is in flight:
the call it cuts fails with a ``ProviderError`` naming the model, never retried nor sent
again, and the model is closed for good — against a real server on 127.0.0.1
(``tests.raw_http``), under asyncio and trio."""

from __future__ import annotations

import gc
import random
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from littleghost import Agent
from littleghost.errors import ProviderError
from littleghost.events import ModelCallRetried
from littleghost.messages import Message
from littleghost.models import ModelRequest
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel
from tests.raw_http import Behaviour, Connection, RawServer
from tests.sdk_bodies import anthropic_events, chunk, message_start, openai_events, text_block

pytestmark = pytest.mark.anyio

PROVIDERS = ("openai", "anthropic")
CLOSED = "model_closed"
TIMEOUT = 30.0
"""A run's deadline: only a call sent again after the close waits for it."""


@pytest.fixture(autouse=True)
def no_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    """Retries go at once (the backoff's full jitter draws its least, 0 s)."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)


def model_of(provider: str, url: str) -> OpenAIModel | AnthropicModel:
    if provider == "openai":
        return OpenAIModel("gpt-4o-mini", base_url=f"{url}/v1", api_key="sk-test")
    return AnthropicModel("claude-sonnet-5", base_url=url, api_key="sk-test")


def first_piece(provider: str) -> bytes:
    """The first event of an answer, with no end."""
    if provider == "openai":
        return openai_events(chunk({"content": "AB"}), done=False)[0]
    return b"".join(anthropic_events(message_start({"input_tokens": 3}), *text_block(0, "AB")))


def stalled(provider: str, *, head: bool) -> Behaviour:
    """A request answered with nothing (``head``: the head of a stream and its first
    event), then silence until the server stops."""

    def behaviour(connection: Connection) -> None:
        if head:
            connection.head(200, {"Content-Type": "text/event-stream"})
            connection.send(first_piece(provider))
        connection.stall()

    return behaviour


def unavailable(connection: Connection) -> None:
    connection.answer(503, {"error": {"message": "overloaded", "type": "server_error"}})


class Plain(Agent):
    instructions = "Answer briefly."


async def until_seen(server: RawServer, count: int) -> None:
    while len(server.requests) < count:  # noqa: ASYNC110 - the server runs in threads
        await anyio.sleep(0.01)


async def run_of(agent: Agent, streamed: bool) -> tuple[list[Any], list[Message]]:
    """The events and the log of a run (streamed), or of ``run()``; what it raised is
    raised, with the events and log so far on the error."""
    events: list[Any] = []
    if not streamed:
        await agent.run("hello", timeout=TIMEOUT)
        return events, []
    async with agent.stream("hello", timeout=TIMEOUT) as stream:
        try:
            async for event in stream:
                events.append(event)
        except ProviderError as error:
            error.seen = (events, list(stream.messages))  # type: ignore[attr-defined]
            raise
    return events, list(stream.messages)


async def failure_of(
    agent: Agent, streamed: bool, close: Callable[[], Awaitable[None]]
) -> ProviderError:
    """The ``ProviderError`` a run of ``agent`` ends with, ``close`` beside it."""
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(close)
            await run_of(agent, streamed)
    except BaseException as error:  # the task group's group, of the run's error
        while isinstance(getattr(error, "exceptions", None), tuple):
            [error] = error.exceptions  # type: ignore[attr-defined]
        assert isinstance(error, ProviderError), repr(error)
        return error
    raise AssertionError("the run ended")


def check_closed(error: ProviderError, provider: str, model: OpenAIModel | AnthropicModel) -> None:
    assert error.code == CLOSED, error
    assert error.provider == provider
    assert repr(model.name) in str(error)
    assert "aclose()" in str(error)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streamed", [False, True])
async def test_a_call_aclose_cuts_fails_and_is_not_sent_again(
    servers: Callable[..., RawServer], provider: str, streamed: bool
) -> None:
    """The call was retried on a new client: sent twice, billed twice, and the run went
    on as if the model were open."""
    server = servers(stalled(provider, head=streamed))
    model = model_of(provider, server.url)

    async def close() -> None:
        await until_seen(server, 1)
        await model.aclose()

    error = await failure_of(Plain(model=model), streamed, close)
    check_closed(error, provider, model)
    assert "stopped by aclose()" in str(error)
    if streamed:
        events, log = error.seen  # type: ignore[attr-defined]
        assert not [event for event in events if isinstance(event, ModelCallRetried)]
        assert [message.text for message in log] == ["hello"]
    assert len(server.requests) == 1
    with pytest.raises(ProviderError, match=r"was closed by aclose\(\)") as later:
        await model.respond(ModelRequest([Message.user("hi")]))
    check_closed(later.value, provider, model)
    with pytest.raises(ProviderError, match=r"was closed by aclose\(\)"):
        await model.prepare()
    assert len(server.requests) == 1


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_run_in_another_thread_is_not_retried_after_aclose(
    servers: Callable[..., RawServer], provider: str
) -> None:
    """A call in another event loop goes on to its end (its client is that loop's); its
    retry is refused: before, it was sent on, and the run went on with the model closed."""
    closed = threading.Event()

    def unavailable_once_closed(connection: Connection) -> None:
        closed.wait(30)
        unavailable(connection)

    server = servers(unavailable_once_closed, stalled(provider, head=False))
    model = model_of(provider, server.url)
    outcome: list[BaseException] = []

    def run_in_thread() -> None:
        try:
            Plain(model=model).run_sync("hello", timeout=TIMEOUT)
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=run_in_thread)
    thread.start()

    async def close() -> None:
        await until_seen(server, 1)
        await model.aclose()

    try:
        anyio.run(close)
    finally:
        closed.set()
        thread.join(30)
    [error] = outcome
    assert isinstance(error, ProviderError)
    check_closed(error, provider, model)
    assert len(server.requests) == 1


# httpcore2's pool, closed while one of its connections is being made, drops it unclosed
# (see the LocalModel lifecycle harness in test_local_model.py): the HTTP library's.
@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")
@pytest.mark.parametrize("seed", range(24))
async def test_aclose_at_any_instant_ends_the_run_without_sending_it_again(
    servers: Callable[..., RawServer], seed: int
) -> None:
    """A randomized instant of the close: before the first request, while it waits for
    an answer or reads a stream, between a transient failure (a 503) and its retry, or
    during the retry. The server never answers but with a 503, so the run can end only
    by the close: always with the close's ``ProviderError`` naming the model (never the
    deadline of a call sent again, nor of one that went out as the close came while its
    connection was being made: the HTTP library's pool let it go, some 2 closes in 100
    at the start), at most one request each attempt."""
    draw = random.Random(seed)
    provider = draw.choice(PROVIDERS)
    streamed = draw.random() < 0.5
    failed_first = draw.random() < 0.5
    stall = stalled(provider, head=streamed and draw.random() < 0.5)
    server = servers(*((unavailable,) if failed_first else ()), stall)
    model = model_of(provider, server.url)
    seen, turns = draw.randint(0, 1 + failed_first), draw.randint(0, 60)

    async def close() -> None:
        await until_seen(server, seen)
        for _ in range(turns):
            await anyio.lowlevel.checkpoint()
        await model.aclose()

    try:
        error = await failure_of(Plain(model=model), streamed, close)
    finally:  # a socket the HTTP library left (see below) collected here, not in a later test
        gc.collect()
    check_closed(error, provider, model)
    if streamed:
        _, log = error.seen  # type: ignore[attr-defined]
        assert [message.text for message in log] == ["hello"]
    assert len(server.requests) <= 1 + failed_first


@pytest.mark.filterwarnings("ignore:unclosed:ResourceWarning")  # as above: the pool's
@pytest.mark.parametrize("provider", PROVIDERS)
async def test_aclose_at_each_early_instant_cuts_the_request_being_sent(provider: str) -> None:
    """A close at every other one of a run's first 60 turns of the event loop (at a
    turn of 4k + 2, streamed): the run ends with the close's error every time. Closing the client alone
    let a request whose connection was being made go out (the HTTP library's pool closed
    under it), and the run waited for its answer until its deadline (4 closes in 183)."""
    for turns in range(0, 60, 2):
        server = RawServer(stalled(provider, head=False))
        try:
            model = model_of(provider, server.url)

            async def close(
                model: OpenAIModel | AnthropicModel = model, turns: int = turns
            ) -> None:
                for _ in range(turns):
                    await anyio.lowlevel.checkpoint()
                await model.aclose()

            error = await failure_of(Plain(model=model), turns % 4 == 2, close)  # no deadline
            check_closed(error, provider, model)
            assert len(server.requests) <= 1
        finally:
            server.close()
    gc.collect()  # a socket the HTTP library left collected here, not in a later test


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_prompt_count_aclose_cuts_fails_saying_so(
    servers: Callable[..., RawServer], provider: str
) -> None:
    """Before, the HTTP library's ``RuntimeError`` (the client closed) or a transient
    error came out of ``count_prompt_tokens``."""
    server = servers(stalled(provider, head=False))
    model = model_of(provider, server.url)
    failure: list[BaseException] = []

    async def count() -> None:
        try:
            await model.count_prompt_tokens(ModelRequest([Message.user("hi")]))
        except ProviderError as error:
            failure.append(error)

    async with anyio.create_task_group() as group:
        group.start_soon(count)
        await until_seen(server, 1)
        await model.aclose()
    [error] = failure
    assert isinstance(error, ProviderError)
    check_closed(error, provider, model)
    assert "stopped by aclose()" in str(error)


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.parametrize("streamed", [False, True])
def test_a_call_in_another_thread_keeps_its_own_error_after_aclose(
    servers: Callable[..., RawServer], provider: str, streamed: bool
) -> None:
    """A call in another event loop goes on to its end (``aclose()`` leaves that loop's
    client open): the server's reset it then gets is its own error, not "stopped by
    aclose()" (it was, as the model was closed meanwhile)."""
    closed = threading.Event()

    def reset_once_closed(connection: Connection) -> None:
        if streamed:
            connection.head(200, {"Content-Type": "text/event-stream"})
            connection.send(first_piece(provider))
        closed.wait(30)
        connection.reset()

    server = servers(reset_once_closed)
    model = model_of(provider, server.url)
    request = ModelRequest([Message.user("hello")])
    outcome: list[BaseException] = []

    async def call() -> None:
        try:
            if not streamed:
                await model.respond(request)
                return
            async for _ in model.stream(request):
                pass
        except BaseException as error:
            outcome.append(error)

    thread = threading.Thread(target=anyio.run, args=(call,))
    thread.start()

    async def close() -> None:
        await until_seen(server, 1)
        await model.aclose()

    try:
        anyio.run(close)
    finally:
        closed.set()
        thread.join(30)
    [error] = outcome
    assert isinstance(error, ProviderError), repr(error)
    assert error.code != CLOSED and "aclose()" not in str(error), error
    assert len(server.requests) == 1
