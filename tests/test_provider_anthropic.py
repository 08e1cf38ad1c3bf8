"""AnthropicModel: request and response translation, streaming and error mapping, through
the real ``anthropic`` SDK over a mock HTTP transport that answers as the API does."""

from __future__ import annotations

import json
import logging
import math
import sys
import warnings
from collections.abc import Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypedDict

import annotated_types as at
import anthropic
import anyio
import attrs
import httpx2
import pytest

from littleghost import (
    Agent,
    ImagePart,
    Message,
    ReasoningPart,
    TextPart,
    ToolCall,
    manage_context,
    tool,
)
from littleghost.context import Truncation
from littleghost.errors import (
    ConfigurationError,
    ContextWindowOverflowError,
    InvalidRequestError,
    OutputLimitError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.events import ModelCallRetried
from littleghost.models import ModelRequest, OutputSchema, StopReason, ToolSpec, Usage, resolve
from littleghost.models.anthropic import (
    DEFAULT_MAX_TOKENS,
    EMPTY_ERROR_TEXT,
    LONGEST_UNSTREAMED,
    MAX_OPTIONAL_PROPERTIES,
    MAX_UNIONS,
    OPENING_TURN,
    AnthropicModel,
    from_model_string,
    schema_problem,
)
from littleghost.models.streaming import ReasoningChunk, StreamDone, TextChunk, ToolCallChunk
from littleghost.sessions import InMemorySessionStore
from littleghost.tool_types import json_schema

from .conversations import PerMessage
from .sdk_bodies import (
    Answer,
    EndlessBody,
    FakeServer,
    SDKClients,
    anthropic_error,
    anthropic_sse,
    event_stream,
    failed_stream,
    finish,
    json_answer,
    message,
    message_start,
    text_block,
    thinking_block,
    tool_use_block,
)

if TYPE_CHECKING:
    from conftest import Spans

pytestmark = pytest.mark.anyio

START = message_start({"input_tokens": 40, "cache_read_input_tokens": 60, "output_tokens": 1})


@pytest.fixture
def make_model(sdk_clients: SDKClients) -> Callable[..., AnthropicModel]:
    return sdk_clients.anthropic_model


ADD = ToolSpec(
    "add",
    "Add two numbers.",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8


async def test_request_translation(make_model: Callable[..., AnthropicModel]) -> None:
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    request = ModelRequest(
        [
            Message.system("You are terse."),
            Message.developer("Answer in English."),
            Message.user("hello"),
            Message.user("and another thing"),
            Message("user", [TextPart("what is this?"), ImagePart(data=PNG)]),
            Message.assistant(
                "Adding.",
                [ToolCall("toolu_1", "add", {"a": 1, "b": 2}), ToolCall("toolu_2", "add", "{oops")],
            ),
            Message.tool("toolu_1", "3"),
            Message.tool("toolu_2", "Invalid arguments", is_error=True),
            Message.user("thanks"),
            Message.assistant(""),
            Message("user", [ImagePart(url="https://example.com/cat.png")]),
            Message.assistant("A cat."),
            Message("user", [ImagePart(url="data:image/gif;base64,R0lGODlh")]),
        ],
        [ADD],
        {"stop": "END", "tool_choice": "required", "parallel_tool_calls": False},
    )
    response = await make_model(server).respond(request)
    assert response.message.text == "ok"
    [body] = server.bodies
    assert body["model"] == "claude-sonnet-5"
    assert body["system"] == "You are terse.\n\nAnswer in English."
    assert body["max_tokens"] == DEFAULT_MAX_TOKENS
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "hello"},
                {"type": "text", "text": "and another thing"},
                {"type": "text", "text": "what is this?"},
                {
                    "type": "image",
                    "source": {
                        "type": "base64",
                        "media_type": "image/png",
                        "data": "iVBORw0KGgoAAAAAAAAAAA==",
                    },
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Adding."},
                {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1, "b": 2}},
                {"type": "tool_use", "id": "toolu_2", "name": "add", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "content": "3",
                    "is_error": False,
                },
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "content": "Invalid arguments",
                    "is_error": True,
                },
                {"type": "text", "text": "thanks"},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.png"}},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "A cat."}]},
        {  # a data: URL goes as its data: the API fetches only http(s) URLs
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/gif", "data": "R0lGODlh"},
                }
            ],
        },
    ]
    assert body["tools"] == [
        {"name": "add", "description": "Add two numbers.", "input_schema": ADD.parameters}
    ]
    assert body["stop_sequences"] == ["END"]
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert "stop" not in body and "parallel_tool_calls" not in body


async def test_settings_follow_what_the_sdk_takes(
    make_model: Callable[..., AnthropicModel],
) -> None:
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    request = ModelRequest(
        [Message.user("hi")],
        settings={
            "max_tokens": 300,
            "user": "customer-42",
            "tool_choice": {"type": "function", "function": {"name": "add"}},
            "service_tier": "auto",
            "cache_control": {"type": "ephemeral"},  # automatic prompt caching
        },
    )
    await make_model(server).respond(request)
    [body] = server.bodies
    assert body["cache_control"] == {"type": "ephemeral"}
    assert body["max_tokens"] == 300
    assert body["metadata"] == {"user_id": "customer-42"}
    assert body["service_tier"] == "auto"  # a setting the SDK takes goes as it is
    assert "tool_choice" not in body  # no tools in this request
    assert "system" not in body


async def test_tool_choice_none_takes_no_parallel_flag(
    make_model: Callable[..., AnthropicModel],
) -> None:
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    settings = {"tool_choice": "none", "parallel_tool_calls": False}
    await make_model(server).respond(ModelRequest([Message.user("hi")], [ADD], settings))
    assert server.bodies[0]["tool_choice"] == {"type": "none"}  # ToolChoiceNoneParam: type only


@pytest.mark.parametrize("streaming", [False, True], ids=["respond", "stream"])
async def test_a_setting_the_sdk_does_not_take_fails_before_sending(
    make_model: Callable[..., AnthropicModel], streaming: bool
) -> None:
    """An unknown setting is a ConfigurationError naming it and what is accepted; nothing
    is sent, and the setting's value is not in the message."""
    server = FakeServer()
    model = make_model(server)
    request = ModelRequest(
        [Message.user("hi")], settings={"max_tokens": 10, "seed": 123456789, "top_q": 1}
    )
    with pytest.raises(ConfigurationError) as caught:
        if streaming:
            async with aclosing(model.stream(request)) as events:
                async for _ in events:
                    pass
        else:
            await model.respond(request)
    text = str(caught.value)
    assert "'seed'" in text  # the first unknown one, in sorted order
    assert "123456789" not in text
    for accepted in ("max_tokens", "stop", "user", "tool_choice", "parallel_tool_calls"):
        assert accepted in text
    assert "metadata" in text and "stop_sequences" in text  # what the SDK takes
    assert "extra_headers" not in text and "messages" not in text  # littleghost's own
    assert server.requests == []


async def test_extra_body_s_keys_go_into_the_body_as_they_are(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """An ``extra_body`` setting's keys travel beside the others (one the SDK does not
    name among them); one littleghost sets itself is refused before anything is sent."""
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    settings = {"extra_body": {"top_a": 0.5}, "max_tokens": 9}
    await make_model(server).respond(ModelRequest([Message.user("hello")], settings=settings))
    [body] = server.bodies
    assert (body["top_a"], body["max_tokens"]) == (0.5, 9)
    request = ModelRequest([Message.user("hello")], settings={"extra_body": {"system": "x"}})
    with pytest.raises(ConfigurationError, match="'system' is set by littleghost"):
        await make_model(server).respond(request)
    assert len(server.bodies) == 1


async def test_a_setting_the_sdk_does_not_take_fails_an_agent_run(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """Through an agent the unknown setting fails the run before any request is sent."""
    server = FakeServer()

    class Seeded(Agent):
        settings = {"seed": 7}

    with pytest.raises(ConfigurationError, match="'seed'"):
        await Seeded(model=make_model(server)).run("hi")
    assert server.requests == []


async def test_the_prompt_is_counted_by_the_count_tokens_endpoint(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """count_prompt_tokens sends what reaches the prompt (system, messages, tools, tool
    choice) to /v1/messages/count_tokens, never the answer's settings, and reads its
    figure; an error there is mapped as a call's is."""
    server = FakeServer(
        httpx2.Response(200, json={"input_tokens": 1234}),
        anthropic_error(529, "overloaded_error", "Overloaded"),
    )
    request = ModelRequest(
        [Message.system("You are terse."), Message.user("hello")],
        [ADD],
        {"max_tokens": 50, "stop": "END", "tool_choice": "required"},
    )
    model = make_model(server)
    assert await model.count_prompt_tokens(request) == 1234
    [sent] = server.requests
    assert sent.url.path == "/v1/messages/count_tokens"
    body = server.bodies[0]
    assert body["system"] == "You are terse."
    assert body["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hello"}]}]
    assert [tool["name"] for tool in body["tools"]] == ["add"]
    assert body["tool_choice"] == {"type": "any"}
    assert "max_tokens" not in body and "stop_sequences" not in body
    with pytest.raises(ProviderUnavailableError):
        await model.count_prompt_tokens(request)


async def test_a_server_without_the_count_endpoint_is_asked_once(
    make_model: Callable[..., AnthropicModel], caplog: pytest.LogCaptureFixture
) -> None:
    """A server without /v1/messages/count_tokens (a gateway, a cloud's own endpoint) is
    asked once; a client error fails only that count, and three in a row end the asking
    with a warning, as ``OpenAIModel``'s do."""
    absent = FakeServer(anthropic_error(404, "not_found_error", "Not Found"))
    model = make_model(absent)
    request = ModelRequest([Message.user("hello")])
    assert await model.count_prompt_tokens(request) is None
    assert await model.count_prompt_tokens(request) is None
    assert len(absent.requests) == 1
    refusal = anthropic_error(400, "invalid_request_error", "Unable to download the image")
    counted = httpx2.Response(200, json={"input_tokens": 7})
    server = FakeServer(refusal, refusal, counted, refusal, refusal, refusal)
    model = make_model(server)
    for expected in ("refused", "refused", 7, "refused", "refused", "refused", None):
        if expected == "refused":
            with pytest.raises(InvalidRequestError):
                await model.count_prompt_tokens(request)
        else:
            assert await model.count_prompt_tokens(request) == expected
    assert len(server.requests) == 6
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "turned down 3 prompt counts" in warning.getMessage()
    assert "hello" not in caplog.text


async def test_response_translation(make_model: Callable[..., AnthropicModel]) -> None:
    server = FakeServer(
        message(
            [
                {"type": "text", "text": "Adding both."},
                {"type": "tool_use", "id": "toolu_a", "name": "add", "input": {"a": 1, "b": 2}},
                {"type": "tool_use", "id": "toolu_b", "name": "add", "input": {"a": 3, "b": 4}},
            ],
            stop_reason="tool_use",
            usage={
                "input_tokens": 100,
                "cache_creation_input_tokens": 20,
                "cache_read_input_tokens": 300,
                "output_tokens": 40,
            },
        )
    )
    response = await make_model(server).respond(ModelRequest([Message.user("add")], [ADD]))
    assert response.message.text == "Adding both."
    assert response.message.tool_calls == (
        ToolCall("toolu_a", "add", {"a": 1, "b": 2}),
        ToolCall("toolu_b", "add", {"a": 3, "b": 4}),
    )
    assert response.stop_reason is StopReason.TOOL_USE
    assert response.usage == Usage(420, 40, cache_read_tokens=300, cache_write_tokens=20)


async def test_parsed_input_holding_infinity_is_kept_as_its_text(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """An input whose body held Infinity (which the SDK's parser reads) becomes the
    arguments' JSON text, answered as invalid, never a non-finite float in the log."""
    body = json.loads(
        message(
            [{"type": "tool_use", "id": "toolu_a", "name": "add", "input": {"a": 1, "b": 2}}],
            stop_reason="tool_use",
        ).content
    )
    body["content"][0]["input"]["a"] = float("inf")
    server = FakeServer(
        httpx2.Response(
            200, content=json.dumps(body).encode(), headers={"content-type": "application/json"}
        )
    )
    response = await make_model(server).respond(ModelRequest([Message.user("add")], [ADD]))
    assert response.message.tool_calls == (ToolCall("toolu_a", "add", '{"a": Infinity, "b": 2}'),)


@pytest.mark.parametrize(
    ("block", "part"),
    [
        (
            {"type": "tool_use", "id": "toolu_a", "name": "add", "input": '{"a": "SECRET'},
            ToolCall("toolu_a", "add", '{"a": "SECRET'),
        ),
        ({"type": "text", "text": "SECRET", "citations": "SECRET"}, None),
    ],
    ids=["arguments-as-text", "odd-citations"],
)
async def test_blocks_of_unexpected_types_are_read_without_a_warning_that_quotes_them(
    make_model: Callable[..., AnthropicModel], block: dict[str, Any], part: ToolCall | None
) -> None:
    """A gateway's block with a field the SDK does not type so (arguments as their text,
    say) is read as it is; no serializer warning carries its content to the logs (pytest
    turns any warning into an error here)."""
    stop = "end_turn" if part is None else "tool_use"
    server = FakeServer(message([block], stop_reason=stop))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        response = await make_model(server).respond(ModelRequest([Message.user("add")], [ADD]))
    assert [str(w.message) for w in caught] == []
    if part is None:
        assert response.message.text == "SECRET"
    else:
        assert response.message.tool_calls == (part,)


async def test_usage_reports_cache_and_thinking_tokens_apart(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """The prompt's size counts cache reads and writes; each is also reported on its own,
    and thinking tokens as the reasoning part of the output."""
    usage = {
        "input_tokens": 12,
        "cache_creation_input_tokens": 30,
        "cache_read_input_tokens": 500,
        "output_tokens": 90,
        "output_tokens_details": {"thinking_tokens": 70},
    }
    server = FakeServer(message([{"type": "text", "text": "ok"}], usage=usage))
    response = await make_model(server).respond(ModelRequest([Message.user("hi")]))
    assert response.usage == Usage(
        542, 90, cache_read_tokens=500, cache_write_tokens=30, reasoning_tokens=70
    )


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("end_turn", StopReason.END_TURN),
        ("max_tokens", StopReason.MAX_TOKENS),
        ("stop_sequence", StopReason.STOP_SEQUENCE),
        ("refusal", StopReason.CONTENT_FILTER),
        ("pause_turn", StopReason.END_TURN),
    ],
)
async def test_stop_reasons(
    make_model: Callable[..., AnthropicModel], reason: str, expected: StopReason
) -> None:
    server = FakeServer(message([{"type": "text", "text": "x"}], stop_reason=reason))
    response = await make_model(server).respond(ModelRequest([Message.user("hi")]))
    assert response.stop_reason is expected


async def test_text_a_block_starts_with_is_streamed(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """Anthropic starts a text (or thinking) block empty; a compatible server may start
    it with text: the chunks still add up to the answer and its reasoning."""
    start = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": "Hello "},
    }
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "world"},
    }
    thinking = {
        "type": "content_block_start",
        "index": 1,
        "content_block": {"type": "thinking", "thinking": "Hmm, ", "signature": "sig"},
    }
    more = {
        "type": "content_block_delta",
        "index": 1,
        "delta": {"type": "thinking_delta", "thinking": "let me see."},
    }
    events_sent = anthropic_sse(START, start, delta, thinking, more, *finish("end_turn", 2))
    server = FakeServer(event_stream(events_sent))
    events = [e async for e in make_model(server).stream(ModelRequest([Message.user("hi")]))]
    assert events[:-1] == [
        TextChunk("Hello "),
        TextChunk("world"),
        ReasoningChunk("Hmm, "),
        ReasoningChunk("let me see."),
    ]
    done = events[-1]
    assert isinstance(done, StreamDone) and done.response.message.text == "Hello world"
    assert done.response.message.reasoning[0].text == "Hmm, let me see."


async def test_an_answer_stopped_by_the_full_window_is_an_overflow(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """``model_context_window_exceeded``: the prompt left the answer no room, as the
    overflow error of older models says (so ``@manage_context`` compacts and retries),
    not the answer's own ``max_tokens``; streamed or not. The error carries the answer's
    usage, which is billed, and its prompt's size (overflow recovery compacts for it)."""
    stopped = "model_context_window_exceeded"
    usage = {"input_tokens": 40, "cache_read_input_tokens": 60, "output_tokens": 1}
    server = FakeServer(
        message([{"type": "text", "text": "x"}], stop_reason=stopped, usage=usage),
        event_stream(anthropic_sse(START, *text_block(0, "x"), *finish(stopped, 1))),
    )
    model = make_model(server)
    request = ModelRequest([Message.user("hi")])
    with pytest.raises(ContextWindowOverflowError) as unstreamed:
        await model.respond(request)
    with pytest.raises(ContextWindowOverflowError) as streamed:
        async for _ in model.stream(request):
            pass
    assert unstreamed.value.code == streamed.value.code == stopped
    assert unstreamed.value.usage == streamed.value.usage == Usage(100, 1, cache_read_tokens=60)
    assert unstreamed.value.prompt_tokens == streamed.value.prompt_tokens == 100


@pytest.mark.parametrize(
    ("cached", "output", "overflow"),
    [(500, 10, True), (400, 10, False), (470, 40, False)],
    ids=["cut by the full window", "cut by the server's own limit", "at its cap"],
)
async def test_an_answer_a_llama_cpp_server_cut_at_the_full_window_is_an_overflow(
    make_model: Callable[..., AnthropicModel], cached: int, output: int, overflow: bool
) -> None:
    """A llama.cpp server's Messages API says ``max_tokens`` at the answer's cap, and also
    where the prompt and the answer filled the context window; that one, short of the
    cap, is an overflow with the prompt's size and the window, as
    ``model_context_window_exceeded`` is; streamed or not, and billed."""
    usage = {"input_tokens": 2, "cache_read_input_tokens": cached, "output_tokens": output}
    server = FakeServer(
        message([{"type": "text", "text": "x"}], stop_reason="max_tokens", usage=usage),
        event_stream(
            anthropic_sse(message_start(usage), *text_block(0, "x"), *finish("max_tokens", output))
        ),
    )
    model = make_model(server, context_window=512)
    request = ModelRequest([Message.user("hi")], settings={"max_tokens": 40})
    if not overflow:
        assert (await model.respond(request)).stop_reason is StopReason.MAX_TOKENS
        *_, done = [event async for event in model.stream(request)]
        assert isinstance(done, StreamDone) and done.response.stop_reason is StopReason.MAX_TOKENS
        return
    with pytest.raises(ContextWindowOverflowError) as unstreamed:
        await model.respond(request)
    with pytest.raises(ContextWindowOverflowError) as streamed:
        async for _ in model.stream(request):
            pass
    for caught in (unstreamed, streamed):
        assert (caught.value.prompt_tokens, caught.value.context_window) == (502, 512)
        assert caught.value.usage == Usage(502, 10, cache_read_tokens=500)


async def test_an_answer_cut_at_the_window_the_server_reports_is_an_overflow(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """The window a llama.cpp server reports (``GET /v1/models``, no ``context_window=``)
    tells an answer the full window cut from one at its cap, as a window given does: an
    overflow, streamed or not (it was a ``max_tokens`` answer, a run's ``OutputLimitError``
    asking for a higher cap, and no compaction)."""
    usage = {"input_tokens": 2, "cache_read_input_tokens": 500, "output_tokens": 10}
    served = {"object": "list", "data": [{"id": "m", "meta": {"n_ctx": 512}}]}
    server = FakeServer(
        json_answer(served),
        message([{"type": "text", "text": "x"}], stop_reason="max_tokens", usage=usage),
        event_stream(
            anthropic_sse(message_start(usage), *text_block(0, "x"), *finish("max_tokens", 10))
        ),
    )
    model = make_model(server, base_url="http://127.0.0.1:8080", name="m")
    await model.prepare()
    assert model.context_window == 512
    request = ModelRequest([Message.user("hi")], settings={"max_tokens": 40})
    with pytest.raises(ContextWindowOverflowError) as unstreamed:
        await model.respond(request)
    with pytest.raises(ContextWindowOverflowError) as streamed:
        async for _ in model.stream(request):
            pass
    for caught in (unstreamed, streamed):
        assert (caught.value.prompt_tokens, caught.value.context_window) == (502, 512)


@pytest.mark.parametrize(
    ("answer", "kind", "attributes"),
    [
        (
            anthropic_error(
                400, "invalid_request_error", "prompt is too long: 208310 tokens > 200000 maximum"
            ),
            ContextWindowOverflowError,
            {"status": 400, "prompt_tokens": 208310, "context_window": 200000},
        ),
        (
            anthropic_error(
                400,
                "invalid_request_error",
                "input length and `max_tokens` exceed context limit: 197434 + 8192 > 200000, "
                "decrease input length or `max_tokens` and try again",
            ),
            ContextWindowOverflowError,
            {"prompt_tokens": 197434, "context_window": 200000},
        ),
        (
            anthropic_error(
                429,
                "rate_limit_error",
                "This request would exceed the rate limit for your organization of 40,000 input "
                "tokens per minute.",
                {"retry-after": "17", "anthropic-ratelimit-input-tokens-remaining": "0"},
            ),
            RateLimitError,
            {"status": 429, "retry_after": 17.0, "code": "rate_limit_error"},
        ),
        (
            anthropic_error(529, "overloaded_error", "Overloaded"),
            ProviderUnavailableError,
            {"status": 529},
        ),
        (
            anthropic_error(500, "api_error", "Internal server error"),
            ProviderUnavailableError,
            {"status": 500},
        ),
        (
            anthropic_error(401, "authentication_error", "invalid x-api-key"),
            InvalidRequestError,
            {"status": 401, "code": "authentication_error"},
        ),
        (
            anthropic_error(
                413, "request_too_large", "Request exceeds the maximum allowed number of bytes."
            ),
            InvalidRequestError,
            {"status": 413},
        ),
        (
            httpx2.ConnectError("connection refused"),
            ProviderUnavailableError,
            {"code": "connection_error"},
        ),
        (httpx2.ReadTimeout("timed out"), ProviderUnavailableError, {"code": "timeout"}),
    ],
)
async def test_errors_are_mapped_and_not_retried_by_the_sdk(
    make_model: Callable[..., AnthropicModel],
    answer: Answer,
    kind: type[ProviderError],
    attributes: dict[str, object],
) -> None:
    server = FakeServer(answer, message([{"type": "text", "text": "should not be reached"}]))
    with pytest.raises(ProviderError) as caught:
        await make_model(server).respond(ModelRequest([Message.user("secret prompt text")]))
    assert type(caught.value) is kind
    assert not isinstance(caught.value, anthropic.AnthropicError)
    assert caught.value.provider == "anthropic"
    for name, value in attributes.items():
        assert getattr(caught.value, name) == value, name
    assert "secret prompt text" not in str(caught.value)
    assert len(server.requests) == 1


async def test_a_body_that_is_not_json_is_transient(
    make_model: Callable[..., AnthropicModel],
) -> None:
    garbled = httpx2.Response(
        200, content=b'{"id": "msg_01", "type": "mess', headers={"content-type": "application/json"}
    )
    with pytest.raises(ProviderUnavailableError):
        await make_model(FakeServer(garbled)).respond(ModelRequest([Message.user("hi")]))
    server = FakeServer(garbled, message([{"type": "text", "text": "fine"}]))
    assert (await Agent(model=make_model(server)).run("hi")).output == "fine"
    assert len(server.requests) == 2


async def test_a_body_holding_an_integer_longer_than_python_reads_is_an_error_naming_it(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """A tool input with a number of more digits than ``sys.set_int_max_str_digits``
    allows: the SDK's parser raised Python's ``ValueError``, which ended the run as it
    was; it is a provider error that names the limit, not retried (the answer is whole)."""

    def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    limit = sys.get_int_max_str_digits()
    answer = json.loads(
        message(
            [{"type": "tool_use", "id": "toolu_a", "name": "add", "input": {"a": 7, "b": 2}}],
            stop_reason="tool_use",
        ).content
    )
    body = json.dumps(answer).replace('"a": 7', '"a": ' + "7" * (limit + 1))
    server = FakeServer(
        httpx2.Response(200, content=body.encode(), headers={"content-type": "application/json"}),
        message([{"type": "text", "text": "should not be reached"}]),
    )
    agent = Agent(model=make_model(server), tools=[add])
    with pytest.raises(ProviderError) as caught:
        await agent.run("add")
    assert type(caught.value) is ProviderError and caught.value.code == "integer_too_long"
    assert str(caught.value) == (
        f"anthropic: the answer holds an integer of more than {limit} digits, more than this "
        "process reads (sys.set_int_max_str_digits)"
    )
    assert len(server.requests) == 1


async def test_arguments_json_cannot_carry_go_back_as_an_empty_input(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """A history's call holding NaN or an int too long to write (no store checked it): its
    input goes as ``{}``, as unparsable arguments do; the SDK's encoder raised Python's
    ``ValueError`` over it."""
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    long = 10 ** sys.get_int_max_str_digits()
    calls = [ToolCall("toolu_1", "add", {"a": math.nan}), ToolCall("toolu_2", "add", {"a": long})]
    request = ModelRequest(
        [
            Message.user("add"),
            Message.assistant(tool_calls=calls),
            Message.tool("toolu_1", "no"),
            Message.tool("toolu_2", "no"),
        ],
        [ADD],
    )
    await make_model(server).respond(request)
    [body] = server.bodies
    assert [block["input"] for block in body["messages"][1]["content"]] == [{}, {}]


async def test_an_html_page_sent_with_a_200_is_transient(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """A proxy's error page with a 200: the SDK hands back its text, which raised an
    AttributeError; it is a body that is not JSON, and the run retries."""
    page = httpx2.Response(
        200, text="<html>Bad gateway</html>", headers={"content-type": "text/html"}
    )
    with pytest.raises(ProviderUnavailableError, match="not valid JSON"):
        await make_model(FakeServer(page)).respond(ModelRequest([Message.user("hi")]))
    server = FakeServer(page, message([{"type": "text", "text": "fine"}]))
    assert (await Agent(model=make_model(server)).run("hi")).output == "fine"


async def test_an_error_sent_with_a_200_is_classified(
    make_model: Callable[..., AnthropicModel],
) -> None:
    server = FakeServer(anthropic_error(200, "overloaded_error", "Overloaded"))
    with pytest.raises(ProviderUnavailableError, match="Overloaded"):
        await make_model(server).respond(ModelRequest([Message.user("hi")]))


async def test_cancellation_propagates_untouched(make_model: Callable[..., AnthropicModel]) -> None:
    async def never(request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    with anyio.move_on_after(0.2) as scope:
        await make_model(FakeServer(never)).respond(ModelRequest([Message.user("hi")]))
    assert scope.cancelled_caught


async def test_stream_yields_text_tool_calls_and_usage(
    make_model: Callable[..., AnthropicModel],
) -> None:
    server = FakeServer(
        event_stream(
            anthropic_sse(
                START,
                {"type": "ping"},
                *text_block(0, "Let me ", "add."),
                *tool_use_block(1, "toolu_1", "add", '{"a": 1', ', "b": 2}'),
                *finish("tool_use", 17),
            )
        )
    )
    events = [
        e async for e in make_model(server).stream(ModelRequest([Message.user("add")], [ADD]))
    ]
    assert events[:-1] == [TextChunk("Let me "), TextChunk("add."), ToolCallChunk()]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.text == "Let me add."
    assert done.response.message.tool_calls == (ToolCall("toolu_1", "add", {"a": 1, "b": 2}),)
    assert done.response.stop_reason is StopReason.TOOL_USE
    assert done.response.usage == Usage(100, 17, cache_read_tokens=60)
    [body] = server.bodies
    assert body["stream"] is True


@pytest.mark.parametrize("max_tokens", [LONGEST_UNSTREAMED + 1, 64_000])
async def test_an_answer_longer_than_an_unstreamed_call_takes_is_streamed(
    make_model: Callable[..., AnthropicModel], max_tokens: int
) -> None:
    """The SDK refuses an unstreamed call that may take over ten minutes (``ValueError``,
    nothing sent): a run asking for a long answer gets it through a stream."""
    server = FakeServer(
        event_stream(
            anthropic_sse(START, *text_block(0, "A long ", "essay."), *finish("end_turn", 9))
        )
    )

    class Writer(Agent):
        settings = {"max_tokens": max_tokens}

    result = await Writer(model=make_model(server)).run("Write at length.")
    assert result.output == "A long essay."
    assert result.usage.output_tokens == 9
    [body] = server.bodies
    assert (body["stream"], body["max_tokens"]) == (True, max_tokens)


async def test_a_request_without_tools_carries_earlier_calls_as_text(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """The API takes no ``tool_use`` or ``tool_result`` block in a request without tools
    (a session that ran a typed turn, or a tool the class no longer has): they travel as
    text, with what the model needs of them."""
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    history = [
        Message.user("where is order 42?"),
        Message.assistant(tool_calls=[ToolCall("toolu_1", "lookup", {"order": 42})]),
        Message.tool("toolu_1", "shipped"),
        Message.assistant("It shipped."),
    ]
    await Agent(model=make_model(server)).run("thanks", history=history)
    [body] = server.bodies
    assert "tools" not in body
    blocks = [block for turn in body["messages"] for block in turn["content"]]
    assert {block["type"] for block in blocks} == {"text"}
    texts = [block["text"] for block in blocks]
    assert '[called lookup({"order": 42}), call toolu_1]' in texts
    assert "[tool result for call toolu_1: shipped]" in texts


async def test_an_error_result_without_content_is_sent_with_some(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """The API refuses a ``tool_result`` with ``is_error`` and empty content (an
    ``after_tool`` hook's, say): it goes with a short text; an empty result that is no
    error goes as it is."""
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    history = [
        Message.user("look both up"),
        Message.assistant(
            tool_calls=[ToolCall("toolu_1", "lookup", {}), ToolCall("toolu_2", "lookup", {})]
        ),
        Message.tool("toolu_1", " \n", is_error=True),
        Message.tool("toolu_2", ""),
    ]
    lookup = ToolSpec("lookup", "Find an order.", {"type": "object", "properties": {}})
    await make_model(server).respond(ModelRequest(history, (lookup,)))
    [body] = server.bodies
    assert body["messages"][-1]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_1",
            "content": EMPTY_ERROR_TEXT,
            "is_error": True,
        },
        {"type": "tool_result", "tool_use_id": "toolu_2", "content": "", "is_error": False},
    ]


async def test_tool_call_ids_go_out_unique_and_of_the_characters_the_api_takes(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """The API refuses a request whose ``tool_use`` ids repeat (``tool_use ids must be
    unique``) or hold other characters than ``[A-Za-z0-9_-]``, as a log of another
    provider's may: a server that sends no ids (``call_0`` in every answer), parallel
    calls sharing one, Kimi's ``functions.lookup:0``. Each goes out under an id of its
    own, its results under the same (a result answers the nearest earlier unanswered
    call with its id, parallel ones in call order, as the log pairs them); the log keeps
    its ids, and what a request's earlier messages go out as does not change as the
    conversation grows (a prompt cache's prefix stays the same)."""
    server = FakeServer(*(message([{"type": "text", "text": "ok"}]) for _ in range(2)))
    history = [
        Message.user("look 1 up"),
        Message.assistant(tool_calls=[ToolCall("call_0", "lookup", {"order": 1})]),
        Message.tool("call_0", "A"),
        Message.assistant(
            tool_calls=[
                ToolCall("call_0", "lookup", {"order": 2}),
                ToolCall("call_0", "lookup", {"order": 3}),
            ]
        ),
        Message.tool("call_0", "B"),
        Message.tool("call_0", "C"),
        Message.assistant(tool_calls=[ToolCall("functions.lookup:0", "lookup", {"order": 4})]),
        Message.tool("functions.lookup:0", "D"),
        Message.assistant(tool_calls=[ToolCall("call_0_2", "lookup", {"order": 5})]),
        Message.tool("call_0_2", "E"),
    ]
    lookup = ToolSpec("lookup", "Find an order.", {"type": "object", "properties": {}})
    model = make_model(server)
    await model.respond(ModelRequest(history[:3], (lookup,)))
    await model.respond(ModelRequest(history, (lookup,)))
    first, body = server.bodies
    blocks = [block for turn in body["messages"] for block in turn["content"]]
    calls = [(block["id"], block["input"]["order"]) for block in blocks if "id" in block]
    results = [
        (block["tool_use_id"], block["content"]) for block in blocks if "tool_use_id" in block
    ]
    assert calls == [
        ("call_0", 1),
        ("call_0_2", 2),
        ("call_0_3", 3),
        ("functions_lookup_0", 4),
        ("call_0_2_2", 5),
    ]
    assert results == [
        ("call_0", "A"),
        ("call_0_2", "B"),
        ("call_0_3", "C"),
        ("functions_lookup_0", "D"),
        ("call_0_2_2", "E"),
    ]
    assert body["messages"][: len(first["messages"])] == first["messages"]
    assert [call.id for message in history for call in message.tool_calls] == [
        "call_0",
        "call_0",
        "call_0",
        "functions.lookup:0",
        "call_0_2",
    ]


async def test_whitespace_only_text_is_never_sent(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """The API takes no text block of whitespace only: an answer of blank lines is kept
    in the log but not sent back; a question of nothing but whitespace is refused before
    anything is sent."""
    server = FakeServer(
        message([{"type": "text", "text": "\n\n"}]), message([{"type": "text", "text": "ok"}])
    )
    agent = Agent(model=make_model(server), session_store=InMemorySessionStore())
    assert (await agent.run("hi", session_id="s")).output == "\n\n"
    await agent.run("again", session_id="s")
    second = server.bodies[1]["messages"]
    assert second == [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi"}, {"type": "text", "text": "again"}],
        }
    ]
    with pytest.raises(ConfigurationError, match="its text is empty or whitespace only"):
        await agent.run(" \n", session_id="s")
    assert len(server.requests) == 2


async def test_an_answer_of_thinking_alone_is_not_sent_back(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """The API takes no assistant message that ends with a thinking block: an answer cut
    at max_tokens while thinking (kept in the session) is left out of the next run's
    request, as is one whose only text is blank."""
    server = FakeServer(
        message([THINKING], stop_reason="max_tokens"),
        message([{**THINKING, "signature": "sig-2"}, {"type": "text", "text": "\n"}]),
        message([{"type": "text", "text": "ok"}]),
    )
    agent = Agent(model=make_model(server), session_store=InMemorySessionStore())
    with pytest.raises(OutputLimitError):
        await agent.run("think hard", session_id="s")
    await agent.run("again", session_id="s")
    assert (await agent.run("once more", session_id="s")).output == "ok"
    assert server.bodies[2]["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "think hard"},
                {"type": "text", "text": "again"},
                {"type": "text", "text": "once more"},
            ],
        }
    ]


@pytest.mark.parametrize("compacted", [False, True], ids=["a greeting", "a truncated history"])
async def test_a_conversation_that_starts_with_the_assistant_is_sent_after_a_user_turn(
    make_model: Callable[..., AnthropicModel], compacted: bool
) -> None:
    """The API takes only a user turn first (it refused the request): a history that
    opens with a greeting, or that a compaction cut after a question, is sent after a
    short user turn of its own."""
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    history = [Message.assistant("Hello! How can I help?")]
    cls = Agent
    if compacted:
        history = [
            m for i in range(40) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))
        ]
        cls = manage_context(
            context_window_override=100,
            compression_threshold=0.5,
            tokenizer=PerMessage(),
            strategy=Truncation(minimum_preserved=3),
        )(type("Truncating", (Agent,), {"settings": {"max_tokens": 10}}))
    await cls(model=make_model(server)).run("Where is order 42?", history=history)
    first, second, *rest = server.bodies[0]["messages"]
    assert first == {"role": "user", "content": [{"type": "text", "text": OPENING_TURN}]}
    assert second["role"] == "assistant"
    assert rest[-1]["content"][-1]["text"] == "Where is order 42?"


async def test_stream_errors_are_mapped(make_model: Callable[..., AnthropicModel]) -> None:
    before = FakeServer(
        anthropic_error(
            400, "invalid_request_error", "prompt is too long: 300000 tokens > 200000 maximum"
        )
    )
    with pytest.raises(ContextWindowOverflowError):
        async for _ in make_model(before).stream(ModelRequest([Message.user("hi")])):
            pass
    midway = FakeServer(
        event_stream(
            anthropic_sse(START, *text_block(0, "par")[:2])
            + b'event: error\ndata: {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}\n\n'
        )
    )
    seen: list[object] = []
    with pytest.raises(ProviderUnavailableError):
        async for event in make_model(midway).stream(ModelRequest([Message.user("hi")])):
            seen.append(event)
    assert seen == [TextChunk("par")]


@pytest.mark.parametrize(
    ("event", "kind", "words"),
    [
        pytest.param(
            b"event: error\ndata: upstream timed out\n\n",
            ProviderUnavailableError,
            "upstream timed out",
            id="an error event that is not JSON",
        ),
        pytest.param(
            b'event: error\ndata: {"message": "upstream rate limit exceeded", "code": 429}\n\n',
            RateLimitError,
            "upstream rate limit exceeded",
            id="an error event without a type",
        ),
        pytest.param(
            b'error: {"code": 400, "message": "request (5000 tokens) exceeds the available '
            b'context size (4096 tokens)", "type": "exceed_context_size_error", '
            b'"n_prompt_tokens": 5000, "n_ctx": 4096}\n\n',
            ContextWindowOverflowError,
            "exceeds the available context size",
            id="llama.cpp: an error: line",
        ),
    ],
)
async def test_an_error_event_of_a_compatible_server_is_classified(
    make_model: Callable[..., AnthropicModel],
    event: bytes,
    kind: type[ProviderError],
    words: str,
) -> None:
    """An error event whose data is not JSON, or JSON without ``"type": "error"`` (an
    Anthropic-compatible server's, an ``error:`` line), was a ``ProtocolError`` ("not
    JSON", "type is missing"), not retried, the server's error lost; it is classified as
    by ``OpenAIModel``."""
    body = anthropic_sse(START, *text_block(0, "par")[:2]) + event
    server = FakeServer(event_stream(body), event_stream(body))
    error = await failed_stream(make_model(server))
    assert type(error) is kind
    assert words in str(error)
    retried = issubclass(kind, (ProviderUnavailableError, RateLimitError))
    assert len(server.requests) == (2 if retried else 1)


CUT = anthropic_sse(START, *text_block(0, "The answer is ", "forty"))
STOP = {"type": "message_stop"}


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(event_stream(CUT), id="no message_stop"),
        pytest.param(  # the usage alone (a stop reason makes the answer whole)
            event_stream(
                anthropic_sse(
                    START,
                    *text_block(0, "forty"),
                    {"type": "message_delta", "delta": {}, "usage": {"output_tokens": 2}},
                )
            ),
            id="message_delta without a stop reason nor message_stop",
        ),
        pytest.param(
            event_stream(CUT + b'event: message_delta\ndata: {"type": "mess'), id="partial event"
        ),
        pytest.param(
            event_stream(CUT + b'event: message_delta\ndata: {"type":\n'),
            id="cut between its data lines",
        ),
        pytest.param(
            event_stream(
                anthropic_sse(START, *tool_use_block(0, "c1", "lookup", '{"id"')[:2], STOP)
            ),
            id="message_stop after half a call's input",
        ),
        pytest.param(
            event_stream(anthropic_sse(START, *text_block(0, "forty")[:2], STOP)),
            id="message_stop with a block never stopped",
        ),
        pytest.param(
            event_stream(anthropic_sse(START, *thinking_block(0, "Hm", signature="s"), STOP)),
            id="message_stop after thinking alone",
        ),
    ],
)
async def test_a_stream_that_ends_before_its_end_is_transient(
    make_model: Callable[..., AnthropicModel], answer: httpx2.Response
) -> None:
    model = make_model(FakeServer(answer))
    with pytest.raises(ProviderUnavailableError) as caught:
        async for _ in model.stream(ModelRequest([Message.user("hi")])):
            pass
    assert caught.value.code == "incomplete_stream"


DONE = b"data: [DONE]\n\n"


@pytest.mark.parametrize(
    "body",
    [
        anthropic_sse(START, *text_block(0, "forty"), *finish("end_turn", 2)) + DONE,
        anthropic_sse(START, *text_block(0, "forty"), *finish("end_turn", 2)[:1]) + DONE,
        anthropic_sse(START, *text_block(0, "forty")) + DONE,
    ],
    ids=["after message_stop", "in place of message_stop", "in place of both last events"],
)
async def test_a_gateway_s_done_ends_a_stream_as_message_stop(
    make_model: Callable[..., AnthropicModel], body: bytes
) -> None:
    """An Anthropic-compatible gateway that ends its streams as OpenAI's end, with
    ``data: [DONE]``: the answer, whole and billed, failed as an event that is not JSON
    (a ``ProtocolError``, the run failed). It is read as ``message_stop``."""
    server = FakeServer(event_stream(body))
    events = [e async for e in make_model(server).stream(ModelRequest([Message.user("hi")]))]
    assert isinstance(events[-1], StreamDone)
    assert events[-1].response.message.text == "forty"
    assert events[-1].response.stop_reason is StopReason.END_TURN
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    "body",
    [
        anthropic_sse(START, *text_block(0, "forty")[:2]) + DONE,
        anthropic_sse(START, *tool_use_block(0, "c1", "lookup", '{"id"')) + DONE,
    ],
    ids=["a block never stopped", "half a call's input"],
)
async def test_a_gateway_s_done_does_not_end_a_stream_cut_off(
    make_model: Callable[..., AnthropicModel], body: bytes
) -> None:
    model = make_model(FakeServer(event_stream(body)))
    with pytest.raises(ProviderUnavailableError) as caught:
        async for _ in model.stream(ModelRequest([Message.user("hi")])):
            pass
    assert caught.value.code == "incomplete_stream"


async def test_a_cut_off_stream_is_retried_and_only_the_retry_is_kept(
    make_model: Callable[..., AnthropicModel],
) -> None:
    whole = anthropic_sse(START, *text_block(0, "The answer is 42."), *finish("end_turn", 5))
    server = FakeServer(event_stream(CUT), event_stream(whole))
    async with Agent(model=make_model(server)).stream("hi") as events:
        received = [event async for event in events]
    # billed for what message_start reported: 40 tokens read, 60 from the cache
    assert ModelCallRetried(1, "ProviderUnavailableError", Usage(100, 1, 60)) in received
    assert events.result.output == "The answer is 42."
    assert [message.text for message in events.messages if message.role == "assistant"] == [
        "The answer is 42."
    ]


async def test_closing_a_stream_early_closes_the_response(
    make_model: Callable[..., AnthropicModel],
) -> None:
    body = EndlessBody(anthropic_sse(START, *text_block(0, "first")[:2]))
    stream = make_model(FakeServer(event_stream(body))).stream(ModelRequest([Message.user("hi")]))
    assert await stream.__anext__() == TextChunk("first")
    assert not body.closed
    await stream.aclose()
    assert body.closed


async def test_an_agent_runs_a_tool_round_trip_through_the_sdk(
    make_model: Callable[..., AnthropicModel],
) -> None:
    class Adder(Agent):
        instructions = "Add numbers."

        @tool
        async def add(self, a: int, b: int) -> int:
            """Add two numbers."""
            return a + b

    server = FakeServer(
        message(
            [{"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}}],
            stop_reason="tool_use",
            usage={"input_tokens": 50, "output_tokens": 10},
        ),
        message([{"type": "text", "text": "5"}], usage={"input_tokens": 70, "output_tokens": 1}),
    )
    result = await Adder(model=make_model(server)).run("2+3?")
    assert result.output == "5"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (120, 11)
    second = server.bodies[1]
    assert second["system"] == "Add numbers."
    assert second["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "5", "is_error": False}
        ],
    }


@pytest.mark.parametrize("opt_in", [None, "info", "debug"])
async def test_request_bodies_reach_debug_logs_only_with_the_sdks_opt_in(
    make_model: Callable[..., AnthropicModel],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    opt_in: str | None,
) -> None:
    """The SDK logs each request's options at DEBUG: without ANTHROPIC_LOG=debug nothing
    of the prompt, the tool arguments or the results is in them, only method and URL."""
    if opt_in is None:
        monkeypatch.delenv("ANTHROPIC_LOG", raising=False)
    else:
        monkeypatch.setenv("ANTHROPIC_LOG", opt_in)
    caplog.set_level(logging.DEBUG)

    class Adder(Agent):
        instructions = "Add numbers for SECRET-INSTRUCTIONS."

        @tool
        async def add(self, a: int, b: int) -> str:
            """Add two numbers."""
            return f"SECRET-RESULT {a + b}"

    server = FakeServer(
        message(
            [{"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 2, "b": 3}}],
            stop_reason="tool_use",
        ),
        message([{"type": "text", "text": "5"}]),
    )
    await Adder(model=make_model(server)).run("SECRET-QUESTION 2+3?")
    options = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Request")]
    assert len(options) == 2
    logged = "\n".join(r.getMessage() for r in caplog.records)
    secrets = ("SECRET-INSTRUCTIONS", "SECRET-QUESTION", "SECRET-RESULT", "'a': 2")
    if opt_in == "debug":
        assert all(secret in logged for secret in secrets)
    else:
        assert not any(secret in logged for secret in secrets)
        assert all("/v1/messages" in text and "ANTHROPIC_LOG=debug" in text for text in options)


async def test_the_compaction_estimate_anchors_on_the_prompt_with_its_cached_tokens(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """A prompt mostly read from the cache is as large as its whole count: the next turn's
    estimate starts from input plus cache tokens, and compacts when they reach the
    threshold, though the uncached input alone is tiny."""

    @manage_context(
        context_window_override=1_000, compression_threshold=0.5, preserve_recent_messages=2
    )
    class Cached(Agent):
        settings = {"max_tokens": 100}  # the default 4 096 would not fit the window

        @tool
        def ping(self) -> str:
            """Ping."""
            return "pong"

    cached = {"input_tokens": 10, "cache_read_input_tokens": 590, "output_tokens": 5}
    server = FakeServer(
        message(
            [{"type": "tool_use", "id": "toolu_1", "name": "ping", "input": {}}],
            stop_reason="tool_use",
            usage=cached,
        ),
        message([{"type": "text", "text": "- the user said hello"}]),
        message([{"type": "text", "text": "done"}]),
    )
    history = [
        Message.user("hello"),
        Message.assistant("hi"),
        Message.user("more"),
        Message.assistant("ok"),
    ]
    result = await Cached(model=make_model(server)).run("ping it", history=history)
    assert result.output == "done"
    assert [body["messages"][-1]["role"] for body in server.bodies] == ["user", "user", "user"]
    summary = server.bodies[1]
    assert "tools" not in summary and "Transcript:" in json.dumps(summary["messages"])
    assert any(message.is_summary for message in result.messages)
    assert result.usage.cache_read_tokens == 590


@attrs.frozen
class Verdict:
    label: Literal["spam", "ham"]
    score: float


async def test_an_output_type_is_asked_with_an_output_format(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """A typed run sends its schema as output_config's JSON-schema format (beside an
    output_config setting); the JSON answer comes back as the typed value."""

    class Classifier(Agent):
        output_type = Verdict
        settings = {"output_config": {"effort": "low"}}

    server = FakeServer(message([{"type": "text", "text": '{"label": "ham", "score": 0.5}'}]))
    result = await Classifier(model=make_model(server)).run("classify: hello")
    assert result.output == Verdict("ham", 0.5)
    [body] = server.bodies
    assert body["output_config"] == {
        "effort": "low",
        "format": {
            "type": "json_schema",
            "schema": {
                "type": "object",
                "properties": {
                    "label": {"enum": ["spam", "ham"]},
                    "score": {"type": "number"},
                },
                "required": ["label", "score"],
                "additionalProperties": False,
            },
        },
    }
    assert "tools" not in body and "tool_choice" not in body


@attrs.frozen
class Rating:
    stars: Annotated[int, at.Ge(1), at.Le(5)]
    why: Annotated[str, at.MaxLen(40)]
    tone: str = "neutral"


async def test_an_output_format_leaves_out_the_bounds_the_answer_is_checked_against(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """Structured outputs refuse bounds (``minimum``, ``maxLength``): the format is sent
    without them (and without a field's default), and an answer out of them gets the
    repair turn."""

    class Rater(Agent):
        output_type = Rating

    server = FakeServer(
        message([{"type": "text", "text": '{"stars": 9, "why": "great"}'}]),
        message([{"type": "text", "text": '{"stars": 5, "why": "great"}'}]),
    )
    result = await Rater(model=make_model(server)).run("rate it")
    assert result.output == Rating(5, "great")
    properties = server.bodies[0]["output_config"]["format"]["schema"]["properties"]
    assert properties == {
        "stars": {"type": "integer"},
        "why": {"type": "string"},
        "tone": {"type": "string"},
    }
    assert "stars: expected a number <= 5, got 9" in json.dumps(server.bodies[1]["messages"])


async def test_the_tool_strategy_forces_the_final_result_tool(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """With the final-result tool, the request carries it and tool_choice "any"."""

    class Classifier(Agent):
        output_type = Verdict
        output_strategy = "tool"

    server = FakeServer(
        message(
            [
                {
                    "type": "tool_use",
                    "id": "toolu_1",
                    "name": "final_result",
                    "input": {"label": "spam", "score": 1},
                }
            ],
            stop_reason="tool_use",
        )
    )
    result = await Classifier(model=make_model(server)).run("classify: WIN $$$")
    assert result.output == Verdict("spam", 1.0)
    [body] = server.bodies
    assert [tool["name"] for tool in body["tools"]] == ["final_result"]
    assert body["tool_choice"] == {"type": "any"}
    assert "output_config" not in body


async def test_an_open_schema_takes_the_final_result_tool(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """Structured outputs want closed objects: with ``auto``, an open ``dict[str, int]``
    goes through the final-result tool; with ``native`` it fails before any request,
    naming why."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "final_result"}
    server = FakeServer(message([{**call, "input": {"result": {"a": 2}}}], stop_reason="tool_use"))
    model = make_model(server)
    result = await Agent(model=model).run("count", output_type=dict[str, int])
    assert result.output == {"a": 2}
    [body] = server.bodies
    assert "output_config" not in body
    assert [tool["name"] for tool in body["tools"]] == ["final_result"]
    assert body["tool_choice"] == {"type": "any"}
    native = Agent(model=model, output_strategy="native")
    with pytest.raises(ConfigurationError, match=r"typed values, not an open object \(dict"):
        await native.run("count", output_type=dict[str, Any])
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("name", "native"),
    [
        ("claude-3-5-haiku-20241022", False),
        ("claude-3-7-sonnet-latest", False),
        ("claude-sonnet-4-20250514", False),
        ("claude-opus-4-0", False),
        ("claude-opus-4-1-20250805", True),
        ("claude-sonnet-4-5", True),
        ("claude-haiku-4-5-20251001", True),
    ],
)
async def test_a_model_without_structured_outputs_takes_the_final_result_tool(
    make_model: Callable[..., AnthropicModel], name: str, native: bool
) -> None:
    """Structured outputs came with Claude Opus 4.1 and Sonnet 4.5: an older model refuses
    output_config.format, so ``auto`` asks it through the final-result tool and
    ``native`` fails before any request."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "final_result"}
    server = FakeServer(
        message([{"type": "text", "text": '{"label": "ham", "score": 0.5}'}])
        if native
        else message([{**call, "input": {"label": "ham", "score": 0.5}}], stop_reason="tool_use")
    )
    model = make_model(server, name=name)
    result = await Agent(model=model).run("classify: hello", output_type=Verdict)
    assert result.output == Verdict("ham", 0.5)
    assert ("output_config" in server.bodies[0]) is native
    if not native:
        with pytest.raises(ConfigurationError, match="not available on this model"):
            await Agent(model=model, output_strategy="native").run("go", output_type=Verdict)
        assert len(server.requests) == 1


def _optional_fields(count: int) -> Any:
    """A record with ``count`` optional fields."""
    return TypedDict("Optional", {f"f{i}": int for i in range(count)}, total=False)


def _nested_optional_fields(count: int) -> Any:
    """A record with ``count`` optional fields, some of them in records in a list."""
    inner = _optional_fields(count - 12)
    fields = {"rows": list[inner], **{f"f{i}": int for i in range(11)}}
    return TypedDict("Nested", fields, total=False)


def _union_fields(count: int) -> Any:
    """A record with ``count`` required fields of a union type."""
    return TypedDict("Unions", {f"f{i}": int | str for i in range(count)})


_LIMITS = [
    (_optional_fields, MAX_OPTIONAL_PROPERTIES, "optional properties", {}),
    (_nested_optional_fields, MAX_OPTIONAL_PROPERTIES, "optional properties", {"rows": [{}]}),
    (_union_fields, MAX_UNIONS, "union-typed values", {f"f{i}": i for i in range(MAX_UNIONS)}),
]


@pytest.mark.parametrize(
    ("make_type", "limit", "what", "answer"), _LIMITS, ids=["optional", "nested", "unions"]
)
async def test_a_schema_over_a_complexity_limit_takes_the_final_result_tool(
    make_model: Callable[..., AnthropicModel],
    make_type: Callable[[int], Any],
    limit: int,
    what: str,
    answer: dict[str, Any],
) -> None:
    """Structured outputs take up to 24 optional properties and 16 unions in a schema:
    one at the limit is asked natively; one over it goes through the final-result tool
    with ``auto`` and fails before any request with ``native``, naming the limit."""
    server = FakeServer(message([{"type": "text", "text": json.dumps(answer)}]))
    model = make_model(server)
    result = await Agent(model=model).run("fill", output_type=make_type(limit))
    assert result.output == answer
    assert server.bodies[0]["output_config"]["format"]["type"] == "json_schema"
    assert "tools" not in server.bodies[0]

    over = make_type(limit + 1)
    answer = {**answer, f"f{limit}": limit} if what == "union-typed values" else answer
    call = {"type": "tool_use", "id": "toolu_1", "name": "final_result", "input": answer}
    server.answers.append(message([call], stop_reason="tool_use"))
    result = await Agent(model=model).run("fill", output_type=over)
    assert result.output == answer
    assert "output_config" not in server.bodies[1]
    assert [tool["name"] for tool in server.bodies[1]["tools"]] == ["final_result"]
    native = Agent(model=model, output_strategy="native")
    expected = rf"take at most {limit} {what}.*, and this schema has {limit + 1}"
    with pytest.raises(ConfigurationError, match=expected):
        await native.run("fill", output_type=over)
    assert len(server.requests) == 2


def test_the_limits_count_inside_unions() -> None:
    """Optional properties and unions are counted in every branch of a union too."""
    branch = json_schema(_optional_fields(13), "branch")
    root = {
        "type": "object",
        "properties": {"a": {"anyOf": [branch, branch]}},
        "required": ["a"],
        "additionalProperties": False,
    }
    problem = schema_problem(OutputSchema("wide", root))
    assert problem is not None and "optional properties" in problem and "has 26" in problem


THINKING = {"type": "thinking", "thinking": "The user wants order 42.", "signature": "sig-1"}
REDACTED = {"type": "redacted_thinking", "data": "enc-1"}


@pytest.mark.parametrize(
    ("thinking", "choice"),
    [
        ({"type": "enabled", "budget_tokens": 1024}, {"type": "auto"}),
        ({"type": "disabled"}, {"type": "any"}),
    ],
    ids=["thinking", "no-thinking"],
)
async def test_with_thinking_the_final_result_tool_is_not_forced(
    make_model: Callable[..., AnthropicModel], thinking: dict[str, Any], choice: dict[str, Any]
) -> None:
    """The API forces no tool with extended thinking: the final-result tool is offered
    with tool_choice "auto" then (the instructions ask for it), "any" otherwise."""

    class Thinker(Agent):
        output_type = Verdict
        output_strategy = "tool"
        settings = {"thinking": thinking, "max_tokens": 2048}

    final = {"type": "tool_use", "id": "toolu_1", "name": "final_result"}
    server = FakeServer(
        message(
            [{**THINKING, "signature": "sig-t"}, {**final, "input": {"label": "ham", "score": 0}}],
            stop_reason="tool_use",
        )
    )
    result = await Thinker(model=make_model(server)).run("classify: hi")
    assert result.output == Verdict("ham", 0.0)
    [body] = server.bodies
    assert body["thinking"] == thinking
    assert [tool["name"] for tool in body["tools"]] == ["final_result"]
    assert body["tool_choice"] == choice


async def test_thinking_blocks_round_trip_through_a_tool_loop_and_a_compaction(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """Signed and redacted thinking blocks enter the log in order with the text and the
    tool call they came with, and go back verbatim in the tool loop, even after a
    compaction: their group is kept whole. Reasoning of summarized turns stays out of
    the summary's transcript."""

    @manage_context(
        context_window_override=1_000, compression_threshold=0.5, preserve_recent_messages=2
    )
    class Thinker(Agent):
        settings = {"max_tokens": 100}  # the default 4 096 would not fit the window

        @tool
        def lookup(self, order_id: str) -> str:
            """Find an order."""
            return "shipped"

    call = {"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {"order_id": "42"}}
    server = FakeServer(
        message(
            [THINKING, REDACTED, {"type": "text", "text": "Looking."}, call],
            stop_reason="tool_use",
            usage={"input_tokens": 600, "output_tokens": 30},
        ),
        message([{"type": "text", "text": "- the user asked about orders"}]),
        message([{"type": "text", "text": "It shipped."}]),
    )
    history = [
        Message.user("hello"),
        Message(
            "assistant",
            [ReasoningPart("old private musing", "sig-0", "anthropic"), TextPart("hi")],
        ),
        Message.user("any news?"),
        Message.assistant("none yet"),
    ]
    result = await Thinker(model=make_model(server)).run("where is order 42?", history=history)
    assert result.output == "It shipped."
    answer = result.messages[len(history) + 1]
    assert answer.content == (
        ReasoningPart("The user wants order 42.", "sig-1", "anthropic"),
        ReasoningPart("", "enc-1", "anthropic", redacted=True),
        TextPart("Looking."),
        ToolCall("toolu_1", "lookup", {"order_id": "42"}),
    )
    first, summary, compacted = server.bodies
    assert first["messages"][1]["content"][0] == {
        "type": "thinking",
        "thinking": "old private musing",
        "signature": "sig-0",
    }
    assert "tools" not in summary
    assert "old private musing" not in json.dumps(summary) and "sig-0" not in json.dumps(summary)
    assert "old private musing" not in json.dumps(compacted)
    assert any(m.is_summary for m in result.messages)
    assistant = [turn for turn in compacted["messages"] if turn["role"] == "assistant"]
    assert assistant[-1]["content"] == [
        THINKING,
        REDACTED,
        {"type": "text", "text": "Looking."},
        {**call, "input": {"order_id": "42"}},
    ]


async def test_reasoning_that_cannot_go_back_is_dropped_before_the_request(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """A thinking block that lost its signature, and reasoning from another provider, are
    left out of the request; the message's other parts still go."""
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    history = [
        Message.user("hi"),
        Message(
            "assistant",
            [
                ReasoningPart("cut off", "", "anthropic"),
                ReasoningPart("elsewhere", None, "openai"),
                ReasoningPart("kept", "sig-2", "anthropic"),
                TextPart("hello"),
            ],
        ),
        Message("assistant", [ReasoningPart("only this", "", "anthropic")]),
        Message.user("again"),
    ]
    await make_model(server).respond(ModelRequest(history))
    [body] = server.bodies
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "kept", "signature": "sig-2"},
                {"type": "text", "text": "hello"},
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "again"}]},
    ]


async def test_a_merged_assistant_turn_starts_with_its_thinking(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """A collapse line (assistant text) before an answer with thinking is merged into its
    turn after that thinking: the API refuses a turn holding thinking that does not start
    with it, which failed overflow recovery mid tool loop with thinking on."""
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    call = ToolCall("toolu_2", "lookup", {"order_id": "2"})
    history = [
        Message.user("check orders 1 and 2"),
        Message.assistant("[Tool results: lookup: order 1 shipped]"),
        Message("assistant", [ReasoningPart("step 2", "sig-2", "anthropic"), call]),
        Message.tool("toolu_2", "order 2 shipped"),
    ]
    lookup = ToolSpec("lookup", "Find an order.", {"type": "object", "properties": {}})
    await make_model(server).respond(ModelRequest(history, (lookup,)))
    assert [block["type"] for block in server.bodies[0]["messages"][1]["content"]] == [
        "thinking",
        "text",
        "tool_use",
    ]


async def test_a_stream_yields_thinking_and_keeps_its_signature(
    make_model: Callable[..., AnthropicModel],
) -> None:
    """Thinking deltas stream as reasoning chunks; the signature delta completes the
    block, and a block the stream left unsigned keeps an empty signature."""

    server = FakeServer(
        event_stream(
            anthropic_sse(
                START,
                *thinking_block(0, "Let me ", "think.", signature="sig-9"),
                *text_block(1, "Done."),
                *thinking_block(2, "More", signature=None),
                *finish("end_turn", 12),
            )
        )
    )
    events = [e async for e in make_model(server).stream(ModelRequest([Message.user("hm")]))]
    assert events[:-1] == [
        ReasoningChunk("Let me "),
        ReasoningChunk("think."),
        TextChunk("Done."),
        ReasoningChunk("More"),
    ]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.content == (
        ReasoningPart("Let me think.", "sig-9", "anthropic"),
        TextPart("Done."),
        ReasoningPart("More", "", "anthropic"),
    )


def test_model_strings_need_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigurationError, match="ANTHROPIC_API_KEY"):
        resolve("anthropic:claude-sonnet-5")
    with pytest.raises(ConfigurationError, match="needs a model name"):
        from_model_string(None)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    model = resolve("anthropic:claude-sonnet-5")
    assert isinstance(model, AnthropicModel)
    assert (model.name, model.provider, model.context_window) == (
        "claude-sonnet-5",
        "anthropic",
        1_000_000,
    )


def test_a_base_url_without_an_http_scheme_fails_when_made(monkeypatch: pytest.MonkeyPatch) -> None:
    message = r"base_url \(or ANTHROPIC_BASE_URL\) must be an http:// or https:// URL"
    with pytest.raises(ConfigurationError, match=message):
        AnthropicModel("claude-x", base_url="localhost:8080", api_key="sk-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "localhost:8080")
    with pytest.raises(ConfigurationError, match=message):
        AnthropicModel("claude-x", api_key="sk-test")


@pytest.mark.parametrize("key", ["sk-ant-SECRET\n", "sk-ant-SECRET\t", " sk-ant-SECRET"])
def test_an_api_key_no_header_can_carry_fails_when_made(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    message = r"api_key \(or ANTHROPIC_API_KEY\) must be printable ASCII"
    with pytest.raises(ConfigurationError, match=message) as caught:
        AnthropicModel("claude-x", api_key=key)
    assert "SECRET" not in str(caught.value)
    monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    with pytest.raises(ConfigurationError, match=message):
        AnthropicModel("claude-x")


def test_a_missing_sdk_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "anthropic", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'littleghost\[anthropic\]'"):
        AnthropicModel("claude-sonnet-5", api_key="sk-ant-test")


def test_bad_arguments_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="model"):
        AnthropicModel("", api_key="k")
    with pytest.raises(ConfigurationError, match="context_window"):
        AnthropicModel("m", api_key="k", context_window=-1)


class TestChatSpanMetadata:
    """Chat spans carry the response's id and model and the server's address and port."""

    async def test_a_message(self, make_model: Callable[..., AnthropicModel], spans: Spans) -> None:
        """From a message: gen_ai.response.id and .model; server.address and .port of the
        API; the stop sequences the settings carry; no gen_ai.request.stream."""
        model = make_model(FakeServer(message([{"type": "text", "text": "ok"}])))
        await Agent(model=model, settings={"stop": ["END"]}).run("hi")
        chat = dict(spans.one("chat ").attributes or {})
        assert chat["gen_ai.response.id"] == "msg_01"
        assert chat["gen_ai.response.model"] == "claude-sonnet-5"
        assert (chat["server.address"], chat["server.port"]) == ("api.anthropic.com", 443)
        assert chat["gen_ai.request.stop_sequences"] == ("END",)
        assert "gen_ai.request.stream" not in chat

    async def test_the_default_output_cap(
        self, make_model: Callable[..., AnthropicModel], spans: Spans
    ) -> None:
        """The max_tokens sent when the settings give none is on the run's span as on the
        chat span's: both say what was asked."""
        model = make_model(FakeServer(message([{"type": "text", "text": "ok"}])))
        await Agent(model=model).run("hi")
        for name in ("chat ", "invoke_agent "):
            attributes = dict(spans.one(name).attributes or {})
            assert attributes["gen_ai.request.max_tokens"] == DEFAULT_MAX_TOKENS

    async def test_a_stream(self, make_model: Callable[..., AnthropicModel], spans: Spans) -> None:
        """From a stream: the id and model of message_start, gen_ai.request.stream = true,
        and a proxy's host and port without its credentials."""
        body = anthropic_sse(START, *text_block(0, "o", "k"), *finish("end_turn", 2))
        url = "http://user:S3CR3T@127.0.0.1:4000/anthropic?token=S3CR3T"
        model = make_model(FakeServer(event_stream(body)), base_url=url, context_window=200_000)
        async with Agent(model=model).stream("hi") as events:
            async for _ in events:
                pass
        assert events.result.output == "ok"
        chat = dict(spans.one("chat ").attributes or {})
        assert chat["gen_ai.request.stream"] is True
        assert chat["gen_ai.response.id"] == "msg_01"
        assert chat["gen_ai.response.model"] == "claude-sonnet-5"
        assert (chat["server.address"], chat["server.port"]) == ("127.0.0.1", 4000)
        assert not any("S3CR3T" in str(value) for value in chat.values())

    async def test_a_stream_without_an_id(self, make_model: Callable[..., AnthropicModel]) -> None:
        """A message_start without id or model leaves them None."""
        start = {**START, "message": {**START["message"], "id": None}}
        del start["message"]["model"]
        body = anthropic_sse(start, *text_block(0, "ok"), *finish("end_turn", 2))
        events = [
            e
            async for e in make_model(FakeServer(event_stream(body))).stream(
                ModelRequest([Message.user("hi")])
            )
        ]
        done = events[-1]
        assert isinstance(done, StreamDone)
        assert (done.response.response_id, done.response.response_model) == (None, None)


@pytest.mark.parametrize("settings", [{}, {"max_tokens": 100}], ids=["default", "explicit"])
async def test_manage_context_counts_the_answer_cap_the_model_sends_by_default(
    make_model: Callable[..., AnthropicModel], settings: dict[str, int]
) -> None:
    """A request that sets no ``max_tokens`` goes out with ``DEFAULT_MAX_TOKENS``, which
    the API counts against the window beside the prompt: ``@manage_context`` counts it
    too, so a prompt that fits only without it is compacted before it is sent."""
    server = FakeServer(message([{"type": "text", "text": "ok"}]))
    history = [m for i in range(40) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
    cls = manage_context(
        context_window_override=2 * DEFAULT_MAX_TOKENS,
        compression_threshold=0.5,
        tokenizer=PerMessage(),
        strategy=Truncation(minimum_preserved=3),
    )(type("Capped", (Agent,), {"settings": settings}))
    await cls(model=make_model(server)).run("Where is order 42?", history=history)
    (body,) = server.bodies
    assert body["max_tokens"] == settings.get("max_tokens", DEFAULT_MAX_TOKENS)
    compacted = len(body["messages"]) < len(history)
    assert compacted is (not settings)
