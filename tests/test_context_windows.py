"""Known context windows: the documented table, the window an OpenAI- or
Anthropic-compatible server reports from ``GET /v1/models``, and how ``manage_context``
picks the window it works against (override, advertised, fallback with one warning per
model)."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any
from uuid import uuid4

import anyio
import anyio.lowlevel
import httpx2
import pytest

import littleghost.models.anthropic as anthropic_provider
import littleghost.models.openai as openai_provider
import littleghost.models.served_window as served_window
from littleghost import Agent, manage_context
from littleghost.context.budget import PromptBudget
from littleghost.context.config import ContextManagement, context_window
from littleghost.errors import ConfigurationError, DeadlineExceededError, ProviderError
from littleghost.messages import Message
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel
from littleghost.models.windows import WINDOWS_CHECKED, known_context_window
from littleghost.testing import ScriptedModel, text_response

from .sdk_bodies import (
    NOT_FOUND,
    LocalServer,
    anthropic_client,
    completion_body,
    error_answer,
    json_answer,
    message_body,
    openai_client,
)
from .timing import LATE

pytestmark = pytest.mark.anyio


COMPLETION = json_answer(completion_body({"content": "They talked about order 42."}, usage=(10, 5)))
ANSWER = json_answer(message_body([{"type": "text", "text": "They talked about order 42."}]))
"""The same answer from an Anthropic-compatible ``/v1/messages``."""


def llama_cpp(n_ctx: int) -> httpx2.Response:
    """``GET /v1/models`` as llama.cpp's server answers it: one model, named by its file."""
    return json_answer(
        {
            "object": "list",
            "data": [
                {
                    "id": "/models/SmolLM2-135M-Instruct.Q4_1.gguf",
                    "object": "model",
                    "owned_by": "llamacpp",
                    "meta": {"n_ctx": n_ctx, "n_ctx_train": 8192, "n_vocab": 49152},
                }
            ],
        }
    )


VLLM = json_answer(
    {
        "object": "list",
        "data": [{"id": "m", "object": "model", "owned_by": "vllm", "max_model_len": 4096}],
    }
)
OPENROUTER = json_answer(
    {
        "data": [
            {"id": "other/model", "context_length": 1_000_000},
            {"id": "m", "context_length": 32_768, "top_provider": {"context_length": 16_384}},
        ]
    }
)
GROQ = json_answer({"object": "list", "data": [{"id": "m", "context_window": 131_072}]})


@pytest.fixture
def serve() -> Iterator[Callable[..., LocalServer]]:
    """Starts real servers on 127.0.0.1 that answer each of ``routes`` after ``delay``
    and close each connection after its answer; stops them after the test."""
    servers: list[LocalServer] = []

    def start(routes: Mapping[str, httpx2.Response], delay: float = 0.0) -> LocalServer:
        server = LocalServer(routes, dict.fromkeys(routes, delay), keep_alive=False)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.close()


@pytest.fixture
def silent_url() -> Iterator[str]:
    """The URL of a server that accepts connections and never answers."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"


def refused_url() -> str:
    """The URL of a port nothing listens on."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


@pytest.fixture(autouse=True)
def no_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("ANTHROPIC_BASE_URL", raising=False)


@pytest.fixture
async def models() -> AsyncIterator[Callable[..., OpenAIModel]]:
    """Makes ``OpenAIModel`` values and closes them after the test."""
    made: list[OpenAIModel] = []

    def make(name: str, base_url: str | None = None, **options: Any) -> OpenAIModel:
        model = OpenAIModel(name, base_url=base_url, api_key="x", **options)
        made.append(model)
        return model

    yield make
    for model in made:
        await model.aclose()


@pytest.fixture
async def claudes() -> AsyncIterator[Callable[..., AnthropicModel]]:
    """Makes ``AnthropicModel`` values of a server's root URL and closes them after the test."""
    made: list[AnthropicModel] = []

    def make(name: str, base_url: str | None = None, **options: Any) -> AnthropicModel:
        model = AnthropicModel(name, base_url=base_url, api_key="x", **options)
        made.append(model)
        return model

    yield make
    for model in made:
        await model.aclose()


# --- the documented table -------------------------------------------------------------


@pytest.mark.parametrize(
    ("provider", "model", "window"),
    [
        ("openai", "gpt-4o-mini", 128_000),
        ("openai", "gpt-4o", 128_000),
        ("openai", "gpt-4o-2024-08-06", 128_000),
        ("openai", "chatgpt-4o-latest", 128_000),
        ("openai", "gpt-4.1-mini-2025-04-14", 1_047_576),
        ("openai", "gpt-4-turbo-2024-04-09", 128_000),
        ("openai", "gpt-4-0125-preview", 128_000),
        ("openai", "gpt-4-1106-preview", 128_000),
        ("openai", "gpt-4-1106-vision-preview", 128_000),
        ("openai", "gpt-4-vision-preview", 128_000),
        ("openai", "gpt-4-32k-0613", 32_768),
        ("openai", "gpt-4-0613", 8_192),
        ("openai", "gpt-3.5-turbo-0125", 16_385),
        ("openai", "gpt-5", 400_000),
        ("openai", "gpt-5-mini-2025-08-07", 400_000),
        ("openai", "gpt-5-chat-latest", 128_000),
        ("openai", "gpt-5.1-chat-latest", 128_000),
        ("openai", "gpt-5.4", 1_050_000),
        ("openai", "gpt-5.4-mini", 400_000),
        ("openai", "o1-2024-12-17", 200_000),
        ("openai", "o1-mini-2024-09-12", 128_000),
        ("openai", "o1-preview", 128_000),
        ("openai", "o3-mini", 200_000),
        ("openai", "o4-mini-2025-04-16", 200_000),
        ("openai", "GPT-4o-Mini", 128_000),
        ("openai", "ft:gpt-4o-mini-2024-07-18:acme::abc123", 128_000),
        ("openai", "ft:gpt-3.5-turbo:acme:support:xyz", 16_385),
        ("anthropic", "claude-sonnet-4-5", 200_000),
        ("anthropic", "claude-sonnet-4-5-20250929", 200_000),
        ("anthropic", "claude-3-5-sonnet-20241022", 200_000),
        ("anthropic", "claude-3-7-sonnet-latest", 200_000),
        ("anthropic", "claude-3-haiku-20240307", 200_000),
        ("anthropic", "claude-haiku-4-5-20251001", 200_000),
        ("anthropic", "claude-opus-4-1-20250805", 200_000),
        ("anthropic", "claude-opus-4-6", 1_000_000),
        ("anthropic", "claude-sonnet-4-6", 1_000_000),
        ("anthropic", "claude-sonnet-5", 1_000_000),
        ("anthropic", "claude-opus-5-5", 1_000_000),
        ("anthropic", "claude-2.0", 100_000),
        ("anthropic", "claude-instant-1.2", 100_000),
    ],
)
def test_documented_windows_by_longest_prefix(provider: str, model: str, window: int) -> None:
    assert known_context_window(provider, model) == window


@pytest.mark.parametrize(
    ("provider", "model"),
    [
        ("openai", "qwen2.5-7b-instruct"),
        ("openai", "claude-sonnet-4-5"),  # another provider's model
        ("anthropic", "gpt-4o"),
        ("local", "gpt-4o"),
        ("openai", "ft:davinci-002:acme::x"),
    ],
)
def test_unknown_models_have_no_window(provider: str, model: str) -> None:
    assert known_context_window(provider, model) is None


def test_the_table_says_when_it_was_checked() -> None:
    assert WINDOWS_CHECKED == "2026-12-01"


def test_models_advertise_their_documented_window() -> None:
    assert OpenAIModel("gpt-4o-mini", api_key="k").context_window == 128_000
    assert AnthropicModel("claude-sonnet-4-5", api_key="k").context_window == 200_000
    assert OpenAIModel("my-finetune", api_key="k").context_window is None
    assert AnthropicModel("claude-next", api_key="k").context_window is None


def test_an_explicit_window_wins() -> None:
    assert OpenAIModel("gpt-4o-mini", api_key="k", context_window=9_000).context_window == 9_000
    assert AnthropicModel(
        "claude-sonnet-4-5", api_key="k", context_window=1_000_000
    ).context_window == (1_000_000)


async def test_openais_own_api_is_not_asked() -> None:
    requests: list[httpx2.Request] = []

    def record(request: httpx2.Request) -> httpx2.Response:
        requests.append(request)
        return httpx2.Response(500)

    client = openai_client(record)
    try:
        model = OpenAIModel("gpt-4o-mini", client=client)
        await model.prepare()
        assert (requests, model.context_window) == ([], 128_000)
    finally:
        await client.close()


# --- the window a server reports -------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "window"),
    [(llama_cpp(512), 512), (VLLM, 4_096), (OPENROUTER, 32_768), (GROQ, 131_072)],
    ids=["llama.cpp", "vllm", "openrouter", "groq"],
)
async def test_a_server_reports_its_window(
    serve: Callable[..., LocalServer],
    models: Callable[..., OpenAIModel],
    answer: httpx2.Response,
    window: int,
) -> None:
    server = serve({"/v1/models": answer})
    model = models("m", server.openai_url)
    assert model.context_window is None
    await model.prepare()
    assert model.context_window == window
    await model.prepare()
    assert server.requests == [("GET", "/v1/models")]  # read once


async def test_the_servers_window_wins_over_the_table_and_the_explicit_one_over_both(
    serve: Callable[..., LocalServer], models: Callable[..., OpenAIModel]
) -> None:
    server = serve({"/v1/models": llama_cpp(2_048)})
    served = models("gpt-4o-mini", server.openai_url)
    assert served.context_window == 128_000
    await served.prepare()
    assert served.context_window == 2_048
    explicit = models("gpt-4o-mini", server.openai_url, context_window=1_000)
    await explicit.prepare()
    assert explicit.context_window == 1_000
    assert server.count("/v1/models") == 1  # the explicit window needs no request


async def test_a_list_without_the_model_gives_no_window(
    serve: Callable[..., LocalServer], models: Callable[..., OpenAIModel]
) -> None:
    answer = json_answer({"data": [{"id": "a", "max_model_len": 10}, {"id": "b"}]})
    model = models("m", serve({"/v1/models": answer}).openai_url)
    await model.prepare()
    assert model.context_window is None


@pytest.mark.parametrize(
    "answer",
    [
        NOT_FOUND,
        httpx2.Response(200, content=b"{not json", headers={"content-type": "application/json"}),
        httpx2.Response(200, content=b"<html>models</html>", headers={"content-type": "text/html"}),
        error_answer(403, {"error": "forbidden"}),
        error_answer(501, {"error": "not implemented"}),
        json_answer({"data": [{"id": "m", "meta": {"n_ctx": "big"}, "max_model_len": -1}]}),
        json_answer({"data": [{"id": "m", "meta": {"n_ctx": 2**63}, "max_model_len": 10**30}]}),
    ],
    ids=["404", "garbage", "html", "403", "501", "bad-figures", "past-2**63-1"],
)
async def test_a_failed_models_request_falls_back_to_the_table(
    serve: Callable[..., LocalServer],
    models: Callable[..., OpenAIModel],
    caplog: pytest.LogCaptureFixture,
    answer: httpx2.Response,
) -> None:
    caplog.set_level(logging.DEBUG, logger="littleghost.models.openai")
    server = serve({"/v1/models": answer})
    unknown, known = models("m", server.openai_url), models("gpt-4o-mini", server.openai_url)
    for model in (unknown, known, unknown, known):
        await model.prepare()
    assert (unknown.context_window, known.context_window) == (None, 128_000)
    assert server.count("/v1/models") == 2  # once per model
    logged = [r for r in caplog.records if r.name == "littleghost.models.openai"]
    assert len(logged) == 2
    assert all(record.levelno == logging.DEBUG for record in logged)


LOADING = error_answer(
    503, {"error": {"message": "Loading model", "type": "unavailable_error", "code": 503}}
)
"""What a llama.cpp server answers while it loads its model (``GET /v1/models`` too)."""


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "failure", [LOADING, error_answer(429, {"error": "slow down"})], ids=["503", "429"]
)
async def test_a_server_that_cannot_answer_yet_is_asked_for_its_window_again(
    serve: Callable[..., LocalServer],
    models: Callable[..., OpenAIModel],
    claudes: Callable[..., AnthropicModel],
    provider: str,
    failure: httpx2.Response,
) -> None:
    """A run started while the server loads its model goes on without its window, and the
    next run reads it (it stayed unknown for the model's life: every run compacted for
    the default window and overflowed); once read, it is not asked again."""
    server = serve({"/v1/models": failure, "/v1/chat/completions": COMPLETION})
    server.routes["/v1/messages"] = ANSWER
    model = models("m", server.openai_url) if provider == "openai" else claudes("m", server.url)
    await Helpdesk(model=model).run("Where is order 42?")
    assert model.context_window is None
    server.routes["/v1/models"] = llama_cpp(512)
    for _ in range(2):
        result = await Helpdesk(model=model).run("Where is order 42?")
        assert result.output == "They talked about order 42."
        assert model.context_window == 512
    assert server.count("/v1/models") == 2


@pytest.mark.parametrize("limit", [0.0, served_window.UNREADY_LIMIT])
async def test_a_server_that_never_gets_ready_is_asked_for_a_while_only(
    serve: Callable[..., LocalServer],
    models: Callable[..., OpenAIModel],
    monkeypatch: pytest.MonkeyPatch,
    limit: float,
) -> None:
    """A server whose ``GET /models`` always fails with a 5xx (a gateway without the
    route) is asked before each run only until ``UNREADY_LIMIT`` seconds have passed
    since its first failure; then the window stays unknown, and it is asked no more."""
    monkeypatch.setattr(served_window, "UNREADY_LIMIT", limit)
    server = serve({"/v1/models": LOADING, "/v1/chat/completions": COMPLETION})
    model = models("m", server.openai_url)
    for _ in range(3):
        result = await Helpdesk(model=model).run("Where is order 42?")
        assert result.output == "They talked about order 42."
    assert model.context_window is None
    assert server.count("/v1/models") == (1 if limit == 0 else 3)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_window_read_that_aclose_cut_leaves_the_model_closed(
    serve: Callable[..., LocalServer],
    models: Callable[..., OpenAIModel],
    claudes: Callable[..., AnthropicModel],
    provider: str,
) -> None:
    """``aclose()`` in the event loop of a ``prepare()``, at any point of it: the next
    ``prepare()`` raises a ``ProviderError`` saying so and asks nothing (the model is
    closed for good)."""
    server = serve({"/v1/models": llama_cpp(512)})
    for steps in range(12):
        model = models("m", server.openai_url) if provider == "openai" else claudes("m", server.url)

        async def close(model: OpenAIModel | AnthropicModel = model, steps: int = steps) -> None:
            for _ in range(steps):
                await anyio.lowlevel.checkpoint()
            await model.aclose()

        async with anyio.create_task_group() as group:
            group.start_soon(close)
            await model.prepare()
        asked = server.count("/v1/models")
        with pytest.raises(ProviderError, match=r"was closed by aclose\(\)"):
            await model.prepare()
        assert server.count("/v1/models") == asked, steps


async def test_a_refused_connection_is_no_error(models: Callable[..., OpenAIModel]) -> None:
    model = models("gpt-4o-mini", refused_url())
    await model.prepare()
    assert model.context_window == 128_000


async def test_a_silent_server_is_given_up_on_in_bounded_time(
    silent_url: str,
    models: Callable[..., OpenAIModel],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="littleghost.models.openai")
    monkeypatch.setattr(openai_provider, "MODELS_TIMEOUT", 0.3)
    model = models("m", silent_url)
    started = time.monotonic()
    with anyio.fail_after(5):
        await model.prepare()
    assert time.monotonic() - started < 0.3 + LATE
    assert model.context_window is None
    assert any("no answer within" in record.getMessage() for record in caplog.records)


async def test_cancelling_prepare_propagates(
    silent_url: str, models: Callable[..., OpenAIModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(openai_provider, "MODELS_TIMEOUT", 30.0)
    model = models("m", silent_url)
    started = time.monotonic()
    with anyio.move_on_after(0.2) as scope:
        await model.prepare()
    assert scope.cancelled_caught
    assert time.monotonic() - started < 0.2 + LATE


async def test_the_probe_never_outlives_the_runs_deadline(
    silent_url: str, models: Callable[..., OpenAIModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    class Helper(Agent):
        instructions = "Help."

    monkeypatch.setattr(openai_provider, "MODELS_TIMEOUT", 30.0)
    started = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        await Helper(model=models("m", silent_url)).run("hi", timeout=0.3)
    assert time.monotonic() - started < 0.3 + LATE


async def test_concurrent_prepares_read_once(
    serve: Callable[..., LocalServer], models: Callable[..., OpenAIModel]
) -> None:
    server = serve({"/v1/models": VLLM}, delay=0.2)
    model = models("m", server.openai_url)
    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(model.prepare)
    assert (server.count("/v1/models"), model.context_window) == (1, 4_096)


# --- the window an Anthropic-compatible server reports --------------------------------


class Helpdesk(Agent):
    instructions = "Help with orders."


async def test_an_anthropic_compatible_server_reports_its_window(
    serve: Callable[..., LocalServer], claudes: Callable[..., AnthropicModel]
) -> None:
    server = serve({"/v1/models": llama_cpp(512)})
    model = claudes("m", server.url)
    assert model.context_window is None
    await model.prepare()
    assert model.context_window == 512
    await model.prepare()
    assert server.requests == [("GET", "/v1/models")]  # read once


async def test_for_anthropic_too_the_server_wins_over_the_table_and_the_constructor_over_both(
    serve: Callable[..., LocalServer], claudes: Callable[..., AnthropicModel]
) -> None:
    server = serve({"/v1/models": llama_cpp(2_048)})
    served = claudes("claude-sonnet-4-5", server.url)
    assert served.context_window == 200_000
    await served.prepare()
    assert served.context_window == 2_048
    explicit = claudes("claude-sonnet-4-5", server.url, context_window=1_000)
    await explicit.prepare()
    assert explicit.context_window == 1_000
    assert server.count("/v1/models") == 1  # the explicit window needs no request


@pytest.mark.parametrize(
    "base_url", [None, "https://api.anthropic.com", "https://API.anthropic.com/v1/"]
)
async def test_anthropics_own_api_is_not_asked(base_url: str | None) -> None:
    requests: list[tuple[str, str]] = []

    def record(request: httpx2.Request) -> httpx2.Response:
        requests.append((request.method, request.url.path))
        return ANSWER if request.url.path.endswith("/messages") else httpx2.Response(500)

    client = anthropic_client(record, base_url=base_url)
    try:
        model = AnthropicModel("claude-sonnet-4-5", client=client)
        await model.prepare()
        assert model.context_window == 200_000
        result = await Helpdesk(model=model).run("Where is order 42?")
        assert result.output == "They talked about order 42."
        assert [method for method, _ in requests] == ["POST"]
    finally:
        await client.close()


@pytest.mark.parametrize(
    "answer",
    [
        NOT_FOUND,
        httpx2.Response(200, content=b"{not json", headers={"content-type": "application/json"}),
        error_answer(403, {"error": "forbidden"}),
        json_answer({"data": [{"id": "other", "meta": {"n_ctx": 512}}, {"id": "else"}]}),
        json_answer({"data": [{"id": "m", "meta": {"n_ctx": "big"}, "max_model_len": -1}]}),
        json_answer({"data": [{"id": "m", "meta": {"n_ctx": 2**63}, "max_model_len": 10**30}]}),
    ],
    ids=["404", "garbage", "403", "not-listed", "no-window", "past-2**63-1"],
)
async def test_a_models_list_anthropic_cannot_read_leaves_the_window_unknown(
    serve: Callable[..., LocalServer],
    claudes: Callable[..., AnthropicModel],
    caplog: pytest.LogCaptureFixture,
    answer: httpx2.Response,
) -> None:
    caplog.set_level(logging.DEBUG, logger="littleghost.models.anthropic")
    server = serve({"/v1/models": answer, "/v1/messages": ANSWER})
    unknown, known = claudes("m", server.url), claudes("claude-sonnet-4-5", server.url)
    for model in (unknown, known, unknown):
        result = await Helpdesk(model=model).run("Where is order 42?")
        assert result.output == "They talked about order 42."
    assert (unknown.context_window, known.context_window) == (None, 200_000)
    assert (server.count("/v1/models"), server.count("/v1/messages")) == (2, 3)
    logged = [r for r in caplog.records if r.name == "littleghost.models.anthropic"]
    assert len(logged) == 2  # once per model
    assert all(record.levelno == logging.DEBUG for record in logged)


async def test_a_stalled_models_list_is_given_up_on_and_the_run_goes_on(
    claudes: Callable[..., AnthropicModel],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="littleghost.models.anthropic")
    monkeypatch.setattr(anthropic_provider, "MODELS_TIMEOUT", 0.3)
    routes = {"/v1/models": llama_cpp(512), "/v1/messages": ANSWER}
    server = LocalServer(routes, {"/v1/models": 30.0}, keep_alive=False)
    try:
        model = claudes("m", server.url)
        started = time.monotonic()
        with anyio.fail_after(10):
            result = await Helpdesk(model=model).run("Where is order 42?")
        assert time.monotonic() - started < 0.3 + LATE
    finally:
        server.close()
    assert result.output == "They talked about order 42."
    assert model.context_window is None
    assert any("no answer within" in record.getMessage() for record in caplog.records)


async def test_a_refused_models_request_is_no_error_for_anthropic(
    claudes: Callable[..., AnthropicModel],
) -> None:
    model = claudes("claude-sonnet-4-5", refused_url().removesuffix("/v1"))
    await model.prepare()
    assert model.context_window == 200_000


async def test_concurrent_anthropic_prepares_read_once(
    serve: Callable[..., LocalServer], claudes: Callable[..., AnthropicModel]
) -> None:
    server = serve({"/v1/models": VLLM}, delay=0.2)
    model = claudes("m", server.url)
    async with anyio.create_task_group() as group:
        for _ in range(3):
            group.start_soon(model.prepare)
    assert (server.count("/v1/models"), model.context_window) == (1, 4_096)


# --- manage_context and the window -----------------------------------------------------


def long_history(pairs: int = 12) -> list[Message]:
    """About 1 300 estimated tokens of conversation."""
    filler = "The customer asked about delivery times, invoices and returns. " * 3
    messages: list[Message] = []
    for index in range(pairs):
        messages.append(Message.user(f"Question {index}: {filler}"))
        messages.append(Message.assistant(f"Answer {index}: {filler}"))
    return messages


@pytest.mark.parametrize(
    ("served", "override", "compacts"),
    [
        (llama_cpp(2_000), None, True),
        (NOT_FOUND, None, False),
        (llama_cpp(1_000_000), 2_000, True),
        (llama_cpp(2_000), 1_000_000, False),
    ],
    ids=["served-window", "fallback", "override-smaller", "override-larger"],
)
async def test_an_agent_compacts_at_the_window_that_applies(
    serve: Callable[..., LocalServer],
    models: Callable[..., OpenAIModel],
    served: httpx2.Response,
    override: int | None,
    compacts: bool,
) -> None:
    @manage_context(
        context_window_tokens=200_000,
        context_window_override=override,
        compression_threshold=0.5,
        preserve_recent_messages=2,
    )
    class Support(Agent):
        instructions = "Help with orders."

    server = serve({"/v1/models": served, "/v1/chat/completions": COMPLETION})
    result = await Support(model=models("m", server.openai_url)).run(
        "Where is order 42?", history=long_history()
    )
    assert result.output == "They talked about order 42."
    assert server.count("/v1/models") == 1
    assert server.count("/v1/chat/completions") == (2 if compacts else 1)
    assert any(message.is_summary for message in result.messages) is compacts


@pytest.mark.parametrize(
    ("served", "compacts"),
    [(llama_cpp(2_000), True), (NOT_FOUND, False)],
    ids=["served-window", "fallback"],
)
async def test_an_agent_on_an_anthropic_compatible_server_compacts_at_its_window(
    serve: Callable[..., LocalServer],
    claudes: Callable[..., AnthropicModel],
    served: httpx2.Response,
    compacts: bool,
) -> None:
    @manage_context(
        context_window_tokens=200_000, compression_threshold=0.5, preserve_recent_messages=2
    )
    class Support(Agent):
        instructions = "Help with orders."
        settings = {"max_tokens": 64}  # the default cap, 4096, would not fit in the window

    server = serve({"/v1/models": served, "/v1/messages": ANSWER})
    result = await Support(model=claudes("m", server.url)).run(
        "Where is order 42?", history=long_history()
    )
    assert result.output == "They talked about order 42."
    assert server.count("/v1/models") == 1
    assert server.count("/v1/messages") == (2 if compacts else 1)
    assert any(message.is_summary for message in result.messages) is compacts


def test_the_override_wins_over_the_advertised_window() -> None:
    config = ContextManagement(context_window_override=4_000, context_window_tokens=50_000)
    assert context_window(ScriptedModel([], context_window=8_000), config) == 4_000
    assert context_window(ScriptedModel([], name=f"w-{uuid4().hex}"), config) == 4_000
    advertised = ContextManagement(context_window_tokens=50_000)
    assert context_window(ScriptedModel([], context_window=8_000), advertised) == 8_000


async def test_the_fallback_is_logged_once_per_model(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="littleghost.context")
    first, second, windowed = (f"no-window-{uuid4().hex}" for _ in range(3))

    @manage_context(context_window_tokens=50_000)
    class Helper(Agent):
        instructions = "Help."

    for name, window in ((first, None), (first, None), (second, None), (windowed, 8_000)):
        model = ScriptedModel(
            [text_response("ok"), text_response("ok")], name=name, context_window=window
        )
        agent = Helper(model=model)
        await agent.run("my secret question")
        await agent.run("my secret question")
    warned = [
        record.getMessage()
        for record in caplog.records
        if record.name == "littleghost.context" and record.levelno == logging.WARNING
    ]
    assert [first in text for text in warned] == [True, False]
    assert second in warned[1]
    assert not any(windowed in text for text in warned)
    for text in warned:
        assert "'scripted'" in text and "50000" in text
        assert "context_window=" in text and "context_window_override=" in text
        assert "secret" not in text


@pytest.mark.parametrize("value", [0, -5, 1.5, True, "big"])
def test_bad_overrides_fail_at_class_definition(value: object) -> None:
    with pytest.raises(ConfigurationError, match="context_window_override"):

        @manage_context(context_window_override=value)
        class Broken(Agent):
            pass


def test_a_budget_is_checked_against_the_override() -> None:
    budget = PromptBudget(response_reserve_tokens=4_096, safety_reserve_tokens=2_048)
    with pytest.raises(ConfigurationError, match="5000-token context window"):
        manage_context(context_window_override=5_000, budget=budget)
    manage_context(context_window_tokens=5_000, context_window_override=50_000, budget=budget)
