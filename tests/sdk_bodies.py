"""What the OpenAI and Anthropic APIs answer, for the tests that drive the real SDKs: whole
bodies, streamed events and their server-sent-events encoding, HTTP responses, a mock
server that plays them, the SDK clients bound to it, and a real HTTP server on 127.0.0.1.
Each builder gives the API's full shape; a test names only what it is about."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

import anthropic
import anyio
import httpx2
import openai
import pytest

from littleghost import Agent
from littleghost.errors import ProviderError
from littleghost.models import Model
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel

if TYPE_CHECKING:
    from tests.raw_http import Behaviour

OPENAI_URL = "https://api.openai.com/v1"
SSE_HEADERS = {"content-type": "text/event-stream"}


async def failed_stream(model: Model) -> ProviderError:
    """The provider error a streamed run of ``model`` ends with (after one retry, if its
    error is retried)."""
    with pytest.raises(ProviderError) as caught:
        async with Agent(model=model, max_retries=1).stream("hi") as events:
            async for _ in events:
                pass
    return caught.value


# --- HTTP responses ---------------------------------------------------------------------


def json_answer(body: object) -> httpx2.Response:
    """A 200 whose body is ``body`` in JSON."""
    return httpx2.Response(200, json=body)


def error_answer(
    status: int, body: object, headers: dict[str, str] | None = None
) -> httpx2.Response:
    """An answer of ``status`` (an error's, mostly) whose body is ``body`` in JSON."""
    return httpx2.Response(status, json=body, headers=headers)


def event_stream(content: bytes | AsyncIterator[bytes] | httpx2.AsyncByteStream) -> httpx2.Response:
    """A 200 whose body is server-sent events (a body stream of its own is closed as
    httpx closes a connection's)."""
    if isinstance(content, httpx2.AsyncByteStream):
        return httpx2.Response(200, stream=content, headers=SSE_HEADERS)
    return httpx2.Response(200, content=content, headers=SSE_HEADERS)


class EndlessBody(httpx2.AsyncByteStream):
    """A response body that sends one piece, then waits; it records being closed."""

    def __init__(self, first: bytes) -> None:
        self.first = first
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.first
        await anyio.sleep_forever()

    async def aclose(self) -> None:
        self.closed = True


# --- OpenAI chat completions ------------------------------------------------------------


def completion_body(
    message: dict[str, Any],
    finish_reason: str | None = "stop",
    usage: tuple[int, int] | dict[str, Any] = (12, 3),
    **extra: Any,
) -> dict[str, Any]:
    """A chat completion of one choice: ``message`` over an assistant's empty one;
    ``usage`` the prompt's and the answer's tokens, or the whole object; ``extra``
    top-level fields (over ``id``, ``model``, ...)."""
    if isinstance(usage, tuple):
        prompt, answer = usage
        usage = {"prompt_tokens": prompt, "completion_tokens": answer, "total_tokens": sum(usage)}
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": None, **message},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage,
        **extra,
    }


def completion(
    message: dict[str, Any],
    finish_reason: str | None = "stop",
    usage: tuple[int, int] | dict[str, Any] = (12, 3),
    **extra: Any,
) -> httpx2.Response:
    """``completion_body`` answered."""
    return json_answer(completion_body(message, finish_reason, usage, **extra))


def chunk(
    delta: dict[str, Any] | None = None, finish_reason: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A streamed chat-completion chunk: one choice with ``delta``, or none (a usage
    chunk: ``usage=...`` in ``extra``)."""
    choices = (
        [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish_reason}]
    )
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "gpt-4o-mini",
        "choices": choices,
        **extra,
    }


def openai_events(*events: object, done: bool = True) -> list[bytes]:
    """Each event as its ``data:`` line, then ``data: [DONE]`` unless not ``done``."""
    pieces = [f"data: {json.dumps(event)}\n\n".encode() for event in events]
    return pieces + ([b"data: [DONE]\n\n"] if done else [])


def openai_sse(*events: object, done: bool = True) -> bytes:
    """``openai_events`` as one body."""
    return b"".join(openai_events(*events, done=done))


# --- Anthropic messages -----------------------------------------------------------------


def message_body(
    content: list[Any],
    stop_reason: str | None = "end_turn",
    usage: dict[str, Any] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A Messages API answer; ``extra`` top-level fields over the others."""
    return {
        "id": "msg_01",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-5",
        "content": content,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": usage or {"input_tokens": 25, "output_tokens": 6},
        **extra,
    }


def answered_whole(provider: str) -> Behaviour:
    """A raw server's behaviour (``tests.raw_http``): a whole answer, not streamed."""
    if provider == "openai":
        body: Any = completion_body({"content": "fine"})
    else:
        body = message_body([{"type": "text", "text": "fine"}])
    return lambda connection: connection.answer(200, body)


def message(
    content: list[Any],
    stop_reason: str | None = "end_turn",
    usage: dict[str, Any] | None = None,
) -> httpx2.Response:
    """``message_body`` answered."""
    return json_answer(message_body(content, stop_reason, usage))


def anthropic_error(
    status: int, kind: str, text: str, headers: dict[str, str] | None = None
) -> httpx2.Response:
    body = {"type": "error", "error": {"type": kind, "message": text}, "request_id": "req_011"}
    return error_answer(status, body, headers)


def message_start(usage: dict[str, Any] | None = None) -> dict[str, Any]:
    """A stream's first event: its message, empty."""
    return {
        "type": "message_start",
        "message": message_body([], None, usage or {"input_tokens": 40, "output_tokens": 1}),
    }


def block(index: int, started: dict[str, Any], *deltas: dict[str, Any]) -> list[dict[str, Any]]:
    """A streamed content block: its start, its deltas, its stop."""
    return [
        {"type": "content_block_start", "index": index, "content_block": started},
        *({"type": "content_block_delta", "index": index, "delta": delta} for delta in deltas),
        {"type": "content_block_stop", "index": index},
    ]


def text_block(index: int, *pieces: str) -> list[dict[str, Any]]:
    """A text block streamed as ``pieces``."""
    deltas = ({"type": "text_delta", "text": piece} for piece in pieces)
    return block(index, {"type": "text", "text": ""}, *deltas)


def thinking_block(index: int, *pieces: str, signature: str | None) -> list[dict[str, Any]]:
    """A thinking block streamed as ``pieces``, then its signature (none: unsigned)."""
    deltas: list[dict[str, Any]] = [{"type": "thinking_delta", "thinking": p} for p in pieces]
    if signature is not None:
        deltas.append({"type": "signature_delta", "signature": signature})
    return block(index, {"type": "thinking", "thinking": "", "signature": ""}, *deltas)


def tool_use_block(index: int, call_id: str, name: str, *partial_json: str) -> list[dict[str, Any]]:
    """A tool call streamed: its input as the pieces of ``partial_json``."""
    started = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
    deltas = ({"type": "input_json_delta", "partial_json": piece} for piece in partial_json)
    return block(index, started, *deltas)


def finish(stop_reason: str, output_tokens: int) -> list[dict[str, Any]]:
    """A stream's last events: its stop reason and usage, then its stop."""
    return [
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens},
        },
        {"type": "message_stop"},
    ]


def anthropic_events(*events: object) -> list[bytes]:
    """Each event as its ``event:`` line (when it has a string ``type``) and ``data:`` line."""
    return [
        (
            f"event: {event['type']}\n"
            if isinstance(event, dict) and isinstance(event.get("type"), str)
            else ""
        ).encode()
        + f"data: {json.dumps(event)}\n\n".encode()
        for event in events
    ]


def anthropic_sse(*events: object) -> bytes:
    """``anthropic_events`` as one body."""
    return b"".join(anthropic_events(*events))


# --- a mock server and the SDKs' clients ------------------------------------------------

Answer = httpx2.Response | BaseException | Callable[[httpx2.Request], Any]
"""A response; an exception to raise (a transport's failure); or a function of the
request giving a response, or an awaitable of one."""


class FakeServer:
    """Plays one answer per HTTP request and records the requests."""

    def __init__(self, *answers: Answer) -> None:
        self.answers = list(answers)
        self.requests: list[httpx2.Request] = []

    async def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        if callable(answer):
            answer = answer(request)
            if not isinstance(answer, httpx2.Response):
                answer = await answer
        return answer

    @property
    def bodies(self) -> list[dict[str, Any]]:
        return [json.loads(request.content) for request in self.requests]


Handler = Callable[[httpx2.Request], Any]
"""What answers a mock transport's requests: a ``FakeServer``, or any function of the
request giving a response (or an awaitable of one)."""


def openai_client(
    handler: Handler, api_key: str = "sk-test", base_url: str = OPENAI_URL
) -> openai.AsyncOpenAI:
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    return openai.AsyncOpenAI(api_key=api_key, base_url=base_url, http_client=http)


def anthropic_client(
    handler: Handler, api_key: str = "sk-ant-test", base_url: str | None = None
) -> anthropic.AsyncAnthropic:
    http = httpx2.AsyncClient(transport=httpx2.MockTransport(handler))
    return anthropic.AsyncAnthropic(api_key=api_key, base_url=base_url, http_client=http)


class SDKClients:
    """Models on the SDKs' clients over a mock transport; ``aclose`` closes every client
    made (the ``sdk_clients`` fixture does, after the test)."""

    def __init__(self) -> None:
        self.made: list[openai.AsyncOpenAI | anthropic.AsyncAnthropic] = []

    def openai_model(
        self,
        handler: Handler,
        base_url: str = OPENAI_URL,
        name: str = "gpt-4o-mini",
        **options: Any,
    ) -> OpenAIModel:
        client = openai_client(handler, base_url=base_url)
        self.made.append(client)
        return OpenAIModel(name, client=client, **options)

    def anthropic_model(
        self,
        handler: Handler,
        base_url: str | None = None,
        name: str = "claude-sonnet-5",
        **options: Any,
    ) -> AnthropicModel:
        client = anthropic_client(handler, base_url=base_url)
        self.made.append(client)
        return AnthropicModel(name, client=client, **options)

    async def aclose(self) -> None:
        for client in self.made:
            await client.close()


# --- a real server on 127.0.0.1 ---------------------------------------------------------


NOT_FOUND = error_answer(404, {"error": {"message": "Not found", "type": "not_found_error"}})


class LocalServer:
    """A real HTTP server on 127.0.0.1 that answers each path from ``routes`` (a 404
    else), after the pause ``delays`` gives the path; over HTTP/1.1 keep-alive
    connections (which the SDKs pool) unless ``keep_alive`` is off. It records each
    request's method and path."""

    def __init__(
        self,
        routes: Mapping[str, httpx2.Response],
        delays: Mapping[str, float] | None = None,
        keep_alive: bool = True,
    ) -> None:
        self.routes = dict(routes)
        self.delays = dict(delays or {})
        self.keep_alive = keep_alive
        self.requests: list[tuple[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.answer(self)

            do_POST = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._http.daemon_threads = True
        self._thread = threading.Thread(
            target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._http.server_address[1]}"

    @property
    def openai_url(self) -> str:
        """The OpenAI SDK's base URL for this server."""
        return f"{self.url}/v1"

    def count(self, path: str) -> int:
        return sum(1 for _, seen in self.requests if seen == path)

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        self.requests.append((handler.command, handler.path))
        time.sleep(self.delays.get(handler.path, 0.0))
        answer = self.routes.get(handler.path, NOT_FOUND)
        try:
            handler.send_response(answer.status_code)
            handler.send_header("Content-Type", answer.headers["content-type"])
            handler.send_header("Content-Length", str(len(answer.content)))
            if not self.keep_alive:
                handler.send_header("Connection", "close")
            handler.end_headers()
            handler.wfile.write(answer.content)
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (its deadline)
            handler.close_connection = True

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join()
