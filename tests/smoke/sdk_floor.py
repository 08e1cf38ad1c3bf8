"""Smoke check of littleghost on the oldest ``openai`` and ``anthropic`` SDKs its extras admit.

The test suite needs much newer SDKs (its mock transports are written for httpx2), so CI
(``.ci/run``) installs the ``openai`` and ``anthropic`` extras at their lowest versions
(uv's lowest-direct resolution) on the oldest Python supported, and runs this script with
the oldest httpx they take, then the newest. It drives the public API — ``OpenAIModel``,
``AnthropicModel``, an ``Agent`` with a tool, ``run`` and ``stream`` — against a real HTTP
server it starts on 127.0.0.1, under asyncio and trio, with one model for both: a plain
answer, a tool call's round trip (Anthropic's with extended thinking, whose block must go
back with the call), the same streamed with its usage, a context overflow (HTTP 400) that
must be a ``ContextWindowOverflowError``, run and streamed, and a rate limit (HTTP 429,
``Retry-After: 1``) that must be retried, no sooner. Any mismatch fails it (exit 1);
nothing skips.

    python tests/smoke/sdk_floor.py [--at-floor]

``--at-floor`` also fails unless the installed SDKs are the lowest versions that
pyproject.toml's ``openai`` and ``anthropic`` extras admit.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib.metadata import PackageNotFoundError, version
from itertools import pairwise
from pathlib import Path
from typing import Any

import anyio
from attrs import frozen

from littleghost import Agent, tool
from littleghost.errors import ContextWindowOverflowError
from littleghost.events import ModelCallFinished, ModelCallRetried, RunFinished, TextDelta
from littleghost.models.anthropic import AnthropicModel
from littleghost.models.openai import OpenAIModel

ROOT = Path(__file__).resolve().parents[2]
INSTRUCTIONS = "You look up orders."
QUESTION = "Where is order 42?"
ORDER = "shipped on Monday"
ANSWER = f"Order 42 was {ORDER}."
WINDOW = 6144
"""The window the server's ``GET /v1/models`` reports for either model."""
THINKING = {"type": "enabled", "budget_tokens": 1024}
"""The ``thinking`` setting of the Anthropic agent's tool-call runs."""
THOUGHT = {"type": "thinking", "thinking": "Look the order up.", "signature": "sig-1"}
"""The thinking block before an Anthropic tool call, which must go back with the call."""

Answer = tuple[int, dict[str, str], list[bytes]]
"""A status, headers and the body: one piece, or the events of a stream in chunks."""
Responder = Callable[[dict[str, Any], dict[str, str]], Answer]
"""Checks one request (its JSON body and lower-cased headers) and gives its answer."""

failures: list[str] = []
checks = 0


def check(what: str, got: object, want: object) -> None:
    """Record a failure unless ``got == want``."""
    global checks
    checks += 1
    if got != want:
        failures.append(f"{what}: got {got!r}, want {want!r}")


def answer(value: object, status: int = 200, **headers: str) -> Answer:
    return status, headers, [json.dumps(value).encode()]


def events(*pieces: object, done: bool = False) -> Answer:
    """A server-sent-events answer: each piece a ``(name, data)`` pair or data alone."""
    body = []
    for piece in pieces:
        name, data = piece if isinstance(piece, tuple) else (None, piece)
        body.append(f"{f'event: {name}' + chr(10) if name else ''}data: {json.dumps(data)}\n\n")
    if done:
        body.append("data: [DONE]\n\n")
    return 200, {"Content-Type": "text/event-stream"}, [piece.encode() for piece in body]


class Server:
    """A keep-alive HTTP/1.1 server on 127.0.0.1 that answers each POST with the next
    responder of its script (``GET /v1/models`` is answered apart)."""

    def __init__(self) -> None:
        self.script: list[Responder] = []
        self.posts: list[float] = []
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                server.answer(self)

            do_POST = do_GET

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        threading.Thread(
            target=self.http.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self.http.server_address[1]}"

    def expect(self, *responders: Responder) -> None:
        with self.lock:
            self.script, self.posts = list(responders), []

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        raw = handler.rfile.read(int(handler.headers.get("Content-Length") or 0))
        request = f"{handler.command} {handler.path}"
        status, headers, pieces = answer({"error": {"message": "unscripted"}}, 500)
        if request == "GET /v1/models":
            status, headers, pieces = answer({"data": [{"id": "m", "max_model_len": WINDOW}]})
        else:
            with self.lock:
                self.posts.append(time.monotonic())
                responder = self.script.pop(0) if self.script else None
            try:
                if responder is None:
                    failures.append(f"{request}: not expected")
                else:
                    sent = {key.lower(): value for key, value in handler.headers.items()}
                    status, headers, pieces = responder(json.loads(raw or b"{}"), sent)
            except Exception:
                failures.append(f"{request}: checking it raised\n{traceback.format_exc()}")
        handler.send_response(status)
        for key, value in {"Content-Type": "application/json", **headers}.items():
            handler.send_header(key, value)
        if len(pieces) == 1:
            handler.send_header("Content-Length", str(len(pieces[0])))
            handler.end_headers()
            handler.wfile.write(pieces[0])
            return
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        for piece in pieces:
            handler.wfile.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            handler.wfile.flush()
        handler.wfile.write(b"0\r\n\r\n")

    def close(self) -> None:
        self.http.shutdown()
        self.http.server_close()


class Support(Agent):
    """An agent with one tool, declared as the README declares one."""

    instructions = INSTRUCTIONS

    @tool
    async def lookup_order(self, order_id: str) -> str:
        """Find an order by its id.

        Args:
            order_id: The order number the customer gave.
        """
        self.looked_up.append(order_id)
        return ORDER if order_id == "42" else "no such order"

    def __init__(self, **options: Any) -> None:
        self.looked_up: list[str] = []
        super().__init__(**options)


# OpenAI chat completions: what is asked ("plain", "call", "overflow", "rate limit"),
# answered whole or streamed.

OPENAI_ERRORS = {
    "overflow": answer(
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, your "
                "messages resulted in 9000 tokens. Please reduce the length of the messages.",
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        },
        400,
    ),
    "rate limit": answer(
        {
            "error": {
                "message": "Rate limit reached for requests. Please slow down.",
                "type": "requests",
                "code": "rate_limit_exceeded",
            }
        },
        429,
        **{"Retry-After": "1"},
    ),
}


def completion(message: dict[str, Any], reason: str, usage: tuple[int, int]) -> Answer:
    return answer(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 1,
            "model": "m",
            "choices": [{"index": 0, "finish_reason": reason, "message": message}],
            "usage": openai_usage(usage),
        }
    )


def openai_usage(usage: tuple[int, int]) -> dict[str, int]:
    prompt, output = usage
    return {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}


def chunks(*deltas: dict[str, Any], reason: str, usage: tuple[int, int]) -> Answer:
    """A streamed completion: its deltas, the last with ``reason``, then the usage alone."""
    base = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    ends = [None] * (len(deltas) - 1) + [reason]
    pieces: list[object] = [
        {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": end}]}
        for delta, end in zip(deltas, ends, strict=True)
    ]
    pieces.append({**base, "choices": [], "usage": openai_usage(usage)})
    return events(*pieces, done=True)


def openai_asked(what: str, text: str, streamed: bool) -> Responder:
    """Checks a first request (the user's ``text``, the tool offered); answers ``what``."""

    def respond(body: dict[str, Any], headers: dict[str, str]) -> Answer:
        check("openai: key", headers.get("authorization"), "Bearer sk-smoke")
        check("openai: model", body.get("model"), "m")
        check(
            "openai: messages",
            body.get("messages"),
            [{"role": "system", "content": INSTRUCTIONS}, {"role": "user", "content": text}],
        )
        tools = [entry.get("function", {}).get("name") for entry in body.get("tools", [])]
        check("openai: tools", tools, ["lookup_order"])
        check("openai: streamed", body.get("stream"), True if streamed else None)
        if streamed:
            check("openai: stream usage asked", body.get("stream_options"), {"include_usage": True})
        if what in OPENAI_ERRORS:
            return OPENAI_ERRORS[what]
        if what == "plain" and streamed:
            return chunks({"content": "Hel"}, {"content": "lo."}, reason="stop", usage=(11, 2))
        if what == "plain":
            return completion({"role": "assistant", "content": "Hello."}, "stop", (11, 2))
        call = {"id": "call_1", "type": "function"}
        if streamed:
            return chunks(
                {"tool_calls": [{"index": 0, **call, "function": {"name": "lookup_order"}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": '{"order_id": '}}]},
                {"tool_calls": [{"index": 0, "function": {"arguments": '"42"}'}}]},
                reason="tool_calls",
                usage=(20, 7),
            )
        function = {"name": "lookup_order", "arguments": '{"order_id": "42"}'}
        message = {
            "role": "assistant",
            "content": None,
            "tool_calls": [{**call, "function": function}],
        }
        return completion(message, "tool_calls", (20, 7))

    return respond


def openai_answered(streamed: bool) -> Responder:
    """Checks a request that sends the tool call and its result back; answers with text."""

    def respond(body: dict[str, Any], headers: dict[str, str]) -> Answer:
        messages = body.get("messages") or [{}]
        sent = [
            (call.get("id"), call["function"]["name"], json.loads(call["function"]["arguments"]))
            for call in messages[-2].get("tool_calls") or ()
        ]
        check("openai: call sent back", sent, [("call_1", "lookup_order", {"order_id": "42"})])
        result = {"role": "tool", "tool_call_id": "call_1", "content": ORDER}
        check("openai: tool result", messages[-1], result)
        if streamed:
            return chunks(
                {"content": "Order 42 was "}, {"content": f"{ORDER}."}, reason="stop", usage=(40, 9)
            )
        return completion({"role": "assistant", "content": ANSWER}, "stop", (40, 9))

    return respond


# Anthropic Messages: likewise.

ANTHROPIC_ERRORS = {
    "overflow": answer(
        {
            "type": "error",
            "error": {
                "type": "invalid_request_error",
                "message": "prompt is too long: 210000 tokens > 200000 maximum",
            },
        },
        400,
    ),
    "rate limit": answer(
        {
            "type": "error",
            "error": {"type": "rate_limit_error", "message": "Rate limited; please slow down."},
        },
        429,
        **{"retry-after": "1"},
    ),
}
TOOL_USE = {"type": "tool_use", "id": "toolu_1", "name": "lookup_order"}


def message(content: list[dict[str, Any]], reason: str, usage: tuple[int, int]) -> Answer:
    return answer(
        {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-sonnet-4-6",
            "content": content,
            "stop_reason": reason,
            "stop_sequence": None,
            "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
        }
    )


def streamed_message(reason: str, *blocks: tuple[dict[str, Any], list[dict[str, Any]]]) -> Answer:
    """A streamed message of ``blocks`` (each its start and its deltas): 20 tokens in, and
    1 out at its start, 7 at its end."""
    started: dict[str, object] = {
        "id": "msg_2",
        "type": "message",
        "role": "assistant",
        "model": "claude-sonnet-4-6",
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 20, "output_tokens": 1},
    }
    pieces: list[object] = [("message_start", {"type": "message_start", "message": started})]
    for index, (block, deltas) in enumerate(blocks):
        start = {"type": "content_block_start", "index": index, "content_block": block}
        pieces += [("content_block_start", start), ("ping", {"type": "ping"})]
        for delta in deltas:
            pieces.append(
                (
                    "content_block_delta",
                    {"type": "content_block_delta", "index": index, "delta": delta},
                )
            )
        pieces.append(("content_block_stop", {"type": "content_block_stop", "index": index}))
    ended = {"stop_reason": reason, "stop_sequence": None}
    pieces.append(
        ("message_delta", {"type": "message_delta", "delta": ended, "usage": {"output_tokens": 7}})
    )
    pieces.append(("message_stop", {"type": "message_stop"}))
    return events(*pieces)


def text_of(content: object) -> object:
    """A content's text, sent as a string or as text blocks."""
    if isinstance(content, list):
        return "".join(block.get("text", "") for block in content if block.get("type") == "text")
    return content


def anthropic_asked(what: str, text: str, streamed: bool) -> Responder:
    """Checks a first request (the user's ``text``, the tool offered); answers ``what``."""

    def respond(body: dict[str, Any], headers: dict[str, str]) -> Answer:
        key = headers.get("x-api-key") or headers.get("authorization", "").removeprefix("Bearer ")
        check("anthropic: key", key, "sk-ant-smoke")  # newer SDKs send it as a bearer token
        check("anthropic: model", body.get("model"), "claude-sonnet-4-6")
        check("anthropic: max_tokens", body.get("max_tokens"), 4096)
        check("anthropic: system", text_of(body.get("system")), INSTRUCTIONS)
        sent = [(entry.get("role"), text_of(entry.get("content"))) for entry in body["messages"]]
        check("anthropic: messages", sent, [("user", text)])
        check("anthropic: tools", [entry.get("name") for entry in body["tools"]], ["lookup_order"])
        check("anthropic: streamed", body.get("stream"), True if streamed else None)
        check("anthropic: thinking", body.get("thinking"), THINKING if what == "call" else None)
        if what in ANTHROPIC_ERRORS:
            return ANTHROPIC_ERRORS[what]
        if what == "plain" and streamed:
            return streamed_message(
                "end_turn",
                ({"type": "text", "text": ""}, [{"type": "text_delta", "text": "Hello."}]),
            )
        if what == "plain":
            return message([{"type": "text", "text": "Hello."}], "end_turn", (11, 2))
        if streamed:
            return streamed_message(
                "tool_use",
                (
                    {"type": "thinking", "thinking": "", "signature": ""},
                    [
                        {"type": "thinking_delta", "thinking": THOUGHT["thinking"]},
                        {"type": "signature_delta", "signature": THOUGHT["signature"]},
                    ],
                ),
                (
                    {**TOOL_USE, "input": {}},
                    [
                        {"type": "input_json_delta", "partial_json": '{"order_id": '},
                        {"type": "input_json_delta", "partial_json": '"42"}'},
                    ],
                ),
            )
        return message([THOUGHT, {**TOOL_USE, "input": {"order_id": "42"}}], "tool_use", (20, 7))

    return respond


def anthropic_answered(streamed: bool) -> Responder:
    """Checks a request that sends the thinking, the tool call and its result back;
    answers with text."""

    def respond(body: dict[str, Any], headers: dict[str, str]) -> Answer:
        messages = body.get("messages") or [{}]
        check(
            "anthropic: thinking and call sent back",
            messages[-2].get("content"),
            [THOUGHT, {**TOOL_USE, "input": {"order_id": "42"}}],
        )
        results = [
            (block.get("tool_use_id"), text_of(block.get("content")), bool(block.get("is_error")))
            for block in messages[-1].get("content", [])
        ]
        check("anthropic: tool result", results, [("toolu_1", ORDER, False)])
        if streamed:
            return streamed_message(
                "end_turn", ({"type": "text", "text": ""}, [{"type": "text_delta", "text": ANSWER}])
            )
        return message([{"type": "text", "text": ANSWER}], "end_turn", (40, 9))

    return respond


@frozen
class Provider:
    """One provider's model, its tool-call runs' settings, server side and figures."""

    name: str
    make: Callable[[str], OpenAIModel | AnthropicModel]
    call_settings: dict[str, Any]
    asked: Callable[[str, str, bool], Responder]
    answered: Callable[[bool], Responder]
    overflow: tuple[int, int]
    """The prompt size and window its overflow message gives."""
    streamed_calls: list[tuple[int, int]]
    """The usage of the streamed tool call's two model calls."""


PROVIDERS = (
    Provider(
        "openai",
        lambda url: OpenAIModel("m", base_url=f"{url}/v1", api_key="sk-smoke"),
        {},
        openai_asked,
        openai_answered,
        (9000, 8192),
        [(20, 7), (40, 9)],
    ),
    Provider(
        "anthropic",
        lambda url: AnthropicModel("claude-sonnet-4-6", base_url=url, api_key="sk-ant-smoke"),
        {"thinking": THINKING},
        anthropic_asked,
        anthropic_answered,
        (210000, 200000),
        [(20, 7), (20, 7)],
    ),
)


async def scenarios(
    name: str, server: Server, provider: Provider, model: OpenAIModel | AnthropicModel
) -> None:
    """Each scenario in turn on an agent of ``model`` (the event loop's client is closed
    as the loop ends)."""
    agent = Support(model=model)
    asked, answered = provider.asked, provider.answered

    async def plain() -> None:
        server.expect(asked("plain", "Say hello.", False))
        result = await agent.run("Say hello.", timeout=30)
        check(f"{name} plain: output", result.output, "Hello.")
        check(
            f"{name} plain: usage", (result.usage.input_tokens, result.usage.output_tokens), (11, 2)
        )

    async def tool_call() -> None:
        agent.looked_up.clear()
        server.expect(asked("call", QUESTION, False), answered(False))
        result = await agent.run(QUESTION, settings=provider.call_settings, timeout=30)
        check(f"{name} tool: output", result.output, ANSWER)
        check(f"{name} tool: looked up", agent.looked_up, ["42"])
        usage = (result.usage.input_tokens, result.usage.output_tokens)
        check(f"{name} tool: usage", usage, (60, 16))
        roles = [entry.role.value for entry in result.messages]
        check(f"{name} tool: messages", roles, ["user", "assistant", "tool", "assistant"])

    async def streamed() -> None:
        agent.looked_up.clear()
        server.expect(asked("call", QUESTION, True), answered(True))
        text, calls, results = [], [], []
        async with agent.stream(QUESTION, settings=provider.call_settings, timeout=30) as stream:
            async for event in stream:
                if isinstance(event, TextDelta):
                    text.append(event.text)
                elif isinstance(event, ModelCallFinished):
                    calls.append((event.usage.input_tokens, event.usage.output_tokens))
                elif isinstance(event, RunFinished):
                    results.append(event.result)
        check(f"{name} stream: text", "".join(text), ANSWER)
        check(f"{name} stream: looked up", agent.looked_up, ["42"])
        check(f"{name} stream: calls' usage", calls, provider.streamed_calls)
        usages = [(result.usage.input_tokens, result.usage.output_tokens) for result in results]
        total = tuple(sum(usage[side] for usage in provider.streamed_calls) for side in (0, 1))
        check(f"{name} stream: the result's usage", usages, [total])
        check(f"{name} stream: output", [result.output for result in results], [ANSWER])

    async def overflow() -> None:
        for streamed in (False, True):
            label = f"{name} overflow{' (streamed)' if streamed else ''}"
            server.expect(asked("overflow", "Read this book.", streamed))
            try:
                if streamed:
                    async with agent.stream("Read this book.", timeout=30) as stream:
                        async for _ in stream:
                            pass
                else:
                    await agent.run("Read this book.", timeout=30)
            except ContextWindowOverflowError as error:
                sizes = (error.status, error.prompt_tokens, error.context_window)
                check(f"{label}: status and sizes", sizes, (400, *provider.overflow))
            else:
                check(f"{label}: raised", None, ContextWindowOverflowError.__name__)
            check(f"{label}: requests", len(server.posts), 1)

    async def rate_limit() -> None:
        server.expect(asked("rate limit", "Say hello.", True), asked("plain", "Say hello.", True))
        retried, outputs = [], []
        async with agent.stream("Say hello.", timeout=30) as stream:
            async for event in stream:
                if isinstance(event, ModelCallRetried):
                    retried.append(event.error_type)
                elif isinstance(event, RunFinished):
                    outputs.append(event.result.output)
        check(f"{name} rate limit: retried", retried, ["RateLimitError"])
        check(f"{name} rate limit: output", outputs, ["Hello."])
        waits = [later - earlier for earlier, later in pairwise(server.posts)]
        check(
            f"{name} rate limit: retried after Retry-After",
            [wait >= 0.95 for wait in waits],
            [True],
        )

    for label, scenario in [
        ("plain", plain),
        ("tool", tool_call),
        ("stream", streamed),
        ("overflow", overflow),
        ("rate limit", rate_limit),
    ]:
        try:
            await scenario()
        except Exception:
            failures.append(f"{name} {label}: raised\n{traceback.format_exc()}")


def main(argv: list[str]) -> int:
    print("sdk floor:", ", ".join(installed()), flush=True)
    if "--at-floor" in argv:
        declared = (ROOT / "pyproject.toml").read_text()
        for sdk in ("openai", "anthropic"):
            floor = re.search(rf'^{sdk} = \[[^]]*"{sdk}>=([\d.]+)"', declared, re.M)
            check(f"{sdk}: the extra's lower bound", bool(floor), True)
            if floor:
                check(f"{sdk}: installed at the floor", release(version(sdk)), release(floor[1]))
    # the server is on this machine: a proxy the environment names (a CI's) must not get
    # its requests, as httpx sends them there
    for name in [name for name in os.environ if name.lower().endswith("_proxy")]:
        if name.lower() != "no_proxy":
            del os.environ[name]
    server = Server()
    try:
        for provider in PROVIDERS:
            try:
                model = provider.make(server.url)  # one for both event loops, as the README allows
            except Exception:
                failures.append(
                    f"{provider.name}: making the model raised\n{traceback.format_exc()}"
                )
                continue
            for backend in ("asyncio", "trio"):
                name = f"{provider.name}/{backend}"
                try:
                    anyio.run(scenarios, name, server, provider, model, backend=backend)
                except Exception:
                    failures.append(f"{name}: raised\n{traceback.format_exc()}")
            window = model.context_window
            check(f"{provider.name}: window from GET /v1/models", window, WINDOW)
            anyio.run(model.aclose)  # once: closed for good, after every event loop's use
    finally:
        server.close()
    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    print(f"sdk floor: {checks} checks, {len(failures)} failures", flush=True)
    return 1 if failures else 0


def installed() -> Iterator[str]:
    """The versions of the SDKs and the libraries under them, as installed."""
    for name in ("openai", "anthropic", "httpx", "httpx2", "anyio", "trio", "pydantic"):
        try:
            yield f"{name} {version(name)}"
        except PackageNotFoundError:
            pass


def release(text: str) -> tuple[int, ...]:
    """A version's release numbers without trailing zeros (``1.63.0`` as ``(1, 63)``)."""
    numbers = [int(number) for number in re.findall(r"\d+", text.split("+")[0])[:3]]
    while numbers and numbers[-1] == 0:
        numbers.pop()
    return tuple(numbers)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
