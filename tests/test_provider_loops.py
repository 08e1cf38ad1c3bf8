"""OpenAIModel and AnthropicModel used from several event loops (each ``run_sync`` call
runs its own, as does each thread's), against a real keep-alive HTTP server on 127.0.0.1:
the SDK's pooled connections belong to the loop that opened them."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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

from .threads import in_threads

COMPLETION = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "m",
    "choices": [
        {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
}
MESSAGE = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-6",
    "content": [{"type": "text", "text": "hi"}],
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {"input_tokens": 3, "output_tokens": 1},
}
MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "max_model_len": 4096}]}


class KeepAliveServer:
    """Chat completions, Messages and ``GET /v1/models`` over HTTP/1.1 keep-alive
    connections (which the SDKs pool), unless ``keep_alive`` is off; ``models_delay``
    slows the models listing."""

    def __init__(self, models_delay: float = 0.0, keep_alive: bool = True) -> None:
        self.models_delay = models_delay
        self.keep_alive = keep_alive
        self.paths: list[str] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.answer(self)

            def do_POST(self) -> None:
                server.answer(self)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        ).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        self.paths.append(handler.path)
        if handler.path == "/v1/models":
            time.sleep(self.models_delay)
        body = json.dumps(
            MODELS
            if handler.path == "/v1/models"
            else MESSAGE
            if handler.path == "/v1/messages"
            else COMPLETION
        ).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(body)))
        if not self.keep_alive:
            handler.send_header("Connection", "close")
        handler.end_headers()
        handler.wfile.write(body)

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()


@pytest.fixture
def server() -> Iterator[KeepAliveServer]:
    served = KeepAliveServer()
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
    server: KeepAliveServer, make: Callable[[str], Model]
) -> None:
    agent = support(make(server.url))
    outputs = [agent().run_sync("hello", timeout=10).output for _ in range(4)]
    assert outputs == ["hi"] * 4


@MODEL_KINDS
def test_a_trio_run_after_run_sync_and_back(
    server: KeepAliveServer, make: Callable[[str], Model]
) -> None:
    agent = support(make(server.url))
    assert agent().run_sync("hello", timeout=10).output == "hi"
    assert anyio.run(run_once, agent, backend="trio") == "hi"
    assert agent().run_sync("hello", timeout=10).output == "hi"


@MODEL_KINDS
def test_run_sync_in_two_threads_at_once(
    server: KeepAliveServer, make: Callable[[str], Model]
) -> None:
    agent = support(make(server.url))
    for _ in range(3):
        outcomes = in_threads(lambda _: agent().run_sync("hello", timeout=10).output, 2)
        assert outcomes == ["hi", "hi"]


def test_threads_wait_for_one_models_listing_and_read_its_window() -> None:
    slow = KeepAliveServer(models_delay=0.3)
    try:
        model = openai_model(slow.url, context_window=None)
        agent = support(model)
        outcomes = in_threads(lambda _: agent().run_sync("hello", timeout=10).output, 3)
        assert outcomes == ["hi"] * 3
        assert (slow.paths.count("/v1/models"), model.context_window) == (1, 4096)
    finally:
        slow.close()


FORKED_DURING_A_READ = """
import os, sys, threading, time
import anyio
from littleghost.models.openai import OpenAIModel

model = OpenAIModel("m", base_url=sys.argv[1], api_key="sk-test")
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


def test_a_process_forked_while_a_thread_reads_the_window_reads_it_too() -> None:
    """A child waited, for good, for the end of a read no thread of its own was making."""
    slow = KeepAliveServer(models_delay=0.5)
    try:
        done = subprocess.run(
            [sys.executable, "-c", FORKED_DURING_A_READ, f"{slow.url}/v1"],
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
    server: KeepAliveServer, provider: str
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


def test_file_descriptors_and_threads_stay_flat_over_many_runs(server: KeepAliveServer) -> None:
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
    server = KeepAliveServer(keep_alive=False)  # a model dropped unclosed leaves no socket
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
