"""OpenAIModel and AnthropicModel used from several event loops (each ``run_sync`` call
runs its own, as does each thread's), against a real keep-alive HTTP server on 127.0.0.1:
the SDK's pooled connections belong to the loop that opened them."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import anthropic
import anyio
import openai
import pytest

from littleghost import Agent
from littleghost.errors import ConfigurationError
from littleghost.models import Model
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel

from .sdk_bodies import LocalServer, completion_body, json_answer, message_body
from .threads import in_threads

MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 4096}]}
ROUTES = {
    "/v1/chat/completions": json_answer(completion_body({"content": "hi"}, usage=(3, 1))),
    "/v1/messages": json_answer(
        message_body(
            [{"type": "text", "text": "hi"}], usage={"input_tokens": 3, "output_tokens": 1}
        )
    ),
    "/v1/models": json_answer(MODELS),
}


def keep_alive_server(models_delay: float = 0.0, keep_alive: bool = True) -> LocalServer:
    """Chat completions, Messages and ``GET /v1/models`` over HTTP/1.1 keep-alive
    connections (which the SDKs pool), unless ``keep_alive`` is off; ``models_delay``
    slows the models listing."""
    return LocalServer(ROUTES, {"/v1/models": models_delay}, keep_alive)


@pytest.fixture
def server() -> Iterator[LocalServer]:
    served = keep_alive_server()
    yield served
    served.close()


def openai_model(url: str, context_window: int | None = 4096) -> OpenAIModel:
    """The model; without a ``context_window``, it asks the server's ``GET /v1/models``."""
    return OpenAIModel("m", base_url=f"{url}/v1", api_key="sk-test", context_window=context_window)


def anthropic_model(url: str) -> AnthropicModel:
    return AnthropicModel("claude-sonnet-4-6", base_url=url, api_key="sk-ant-test")


MODEL_KINDS = pytest.mark.parametrize(
    "make", [openai_model, anthropic_model], ids=["openai", "anthropic"]
)


def support(declared: Model) -> type[Agent]:
    """The README's pattern: a model instance declared at class level."""

    class Support(Agent):
        model = declared
        settings = {"max_tokens": 50}

    return Support


async def run_once(agent: type[Agent]) -> str:
    return (await agent().run("hello", timeout=10)).output


@MODEL_KINDS
def test_run_sync_runs_again_and_again_with_one_model_instance(
    server: LocalServer, make: Callable[[str], Model]
) -> None:
    agent = support(make(server.url))
    outputs = [agent().run_sync("hello", timeout=10).output for _ in range(4)]
    assert outputs == ["hi"] * 4


@MODEL_KINDS
def test_a_trio_run_after_run_sync_and_back(
    server: LocalServer, make: Callable[[str], Model]
) -> None:
    agent = support(make(server.url))
    assert agent().run_sync("hello", timeout=10).output == "hi"
    assert anyio.run(run_once, agent, backend="trio") == "hi"
    assert agent().run_sync("hello", timeout=10).output == "hi"


@MODEL_KINDS
def test_run_sync_in_two_threads_at_once(server: LocalServer, make: Callable[[str], Model]) -> None:
    agent = support(make(server.url))
    for _ in range(3):
        outcomes = in_threads(lambda _: agent().run_sync("hello", timeout=10).output, 2)
        assert outcomes == ["hi", "hi"]


def test_threads_wait_for_one_models_listing_and_read_its_window() -> None:
    slow = keep_alive_server(models_delay=0.3)
    try:
        model = openai_model(slow.url, context_window=None)
        agent = support(model)
        outcomes = in_threads(lambda _: agent().run_sync("hello", timeout=10).output, 3)
        assert outcomes == ["hi"] * 3
        assert (slow.count("/v1/models"), model.context_window) == (1, 4096)
    finally:
        slow.close()


FORKED_DURING_A_READ = """
import importlib, os, sys, threading, time
import anyio

module, name, url = sys.argv[1:]
model = getattr(importlib.import_module(module), name)("m", base_url=url, api_key="sk-test")
threading.Thread(target=anyio.run, args=(model.prepare,)).start()
time.sleep(0.2)  # that thread waits for GET /v1/models


async def prepare_within(seconds):
    with anyio.move_on_after(seconds):
        await model.prepare()


if os.fork() == 0:
    anyio.run(prepare_within, 3)
    print(model.context_window, flush=True)
    os._exit(0)
os.wait()
"""


@pytest.mark.parametrize(
    ("module", "name", "path"),
    [
        ("littleghost.models.openai", "OpenAIModel", "/v1"),
        ("littleghost.models.anthropic", "AnthropicModel", ""),  # a server not Anthropic's
    ],
    ids=["openai", "anthropic"],
)
def test_a_process_forked_while_a_thread_reads_the_window_reads_it_too(
    module: str, name: str, path: str
) -> None:
    """A child waited, for good, for the end of a read no thread of its own was making."""
    slow = keep_alive_server(models_delay=0.5)
    try:
        done = subprocess.run(
            [sys.executable, "-c", FORKED_DURING_A_READ, module, name, f"{slow.url}{path}"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    finally:
        slow.close()
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "4096"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_given_client_serves_one_event_loop_and_says_so_in_another(
    server: LocalServer, provider: str
) -> None:
    if provider == "openai":
        client: Any = openai.AsyncOpenAI(api_key="sk-test", base_url=f"{server.url}/v1")
        model: Model = OpenAIModel("m", client=client, context_window=4096)
    else:
        client = anthropic.AsyncAnthropic(api_key="sk-ant-test", base_url=server.url)
        model = AnthropicModel("claude-sonnet-4-6", client=client)
    agent = support(model)

    async def twice_then_close() -> list[str]:
        outputs = [await run_once(agent), await run_once(agent)]
        await model.aclose()  # leaves the given client open
        outputs.append(await run_once(agent))
        await client.close()
        return outputs

    assert anyio.run(twice_then_close) == ["hi", "hi", "hi"]
    with pytest.raises(ConfigurationError, match=r"pass base_url/api_key instead of client="):
        agent().run_sync("hello", timeout=10)


def test_file_descriptors_and_threads_stay_flat_over_many_runs(server: LocalServer) -> None:
    agent = support(openai_model(server.url))
    run = agent().run_sync
    for _ in range(5):
        run("hello", timeout=10)
    gc.collect()
    fds, threads = len(os.listdir("/proc/self/fd")), threading.active_count()
    for index in range(150):
        if index % 3:
            run("hello", timeout=10)
        else:
            anyio.run(run_once, agent, backend="trio")
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) <= fds + 2
    assert threading.active_count() <= threads + 2


@pytest.mark.anyio
async def test_a_long_lived_loop_keeps_no_model_it_no_longer_uses() -> None:
    server = keep_alive_server(keep_alive=False)  # a model dropped unclosed leaves no socket
    try:
        models = [openai_model(server.url) for _ in range(20)]
        for model in models:
            assert await run_once(support(model)) == "hi"
        dropped = [weakref.ref(model) for model in models]
        del models, model
        gc.collect()
        assert [ref() for ref in dropped] == [None] * 20
    finally:
        server.close()


@MODEL_KINDS
@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_a_model_dropped_unclosed_in_a_loop_of_its_own_has_its_client_closed_with_it(
    server: LocalServer, make: Callable[[str], Model], backend: str
) -> None:
    # an agent made per request, in an event loop of its own, left to the collector
    def sockets() -> int:
        fds = [os.path.join("/proc/self/fd", fd) for fd in os.listdir("/proc/self/fd")]
        return sum(1 for fd in fds if os.path.exists(fd) and "socket:" in os.readlink(fd))

    agent = support(make(server.url))

    async def request() -> str:
        return (await agent(model=make(server.url)).run("hello", timeout=10)).output

    assert anyio.run(request, backend=backend) == "hi"
    gc.collect()
    before = sockets()
    gc.disable()  # as between two collections: each client waits for the next one
    try:
        for _ in range(20):
            assert anyio.run(request, backend=backend) == "hi"
        assert sockets() <= before + 1
    finally:
        gc.enable()
