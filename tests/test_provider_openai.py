"""OpenAIModel: request and response translation, streaming and error mapping, through the
real ``openai`` SDK over a mock HTTP transport that answers as the servers do."""

from __future__ import annotations

import json
import logging
import math
import random
import sys
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Annotated, Any, Literal

import annotated_types as at
import anyio
import attrs
import httpx2
import openai
import pytest

from littleghost import (
    Agent,
    ImagePart,
    Message,
    ReasoningPart,
    Role,
    TextPart,
    ToolCall,
    ToolResult,
    manage_context,
    tool,
)
from littleghost.context.tokens import estimate_messages
from littleghost.errors import (
    ConfigurationError,
    ContextWindowOverflowError,
    InvalidRequestError,
    ProtocolError,
    ProviderError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.events import ModelCallRetried
from littleghost.models import ModelRequest, OutputSchema, StopReason, ToolSpec, Usage, resolve
from littleghost.models.openai import OpenAIModel, from_model_string
from littleghost.models.overflow import MAX_DETAIL_CHARS
from littleghost.models.streaming import ReasoningChunk, StreamDone, TextChunk, ToolCallChunk
from littleghost.sessions import InMemorySessionStore

from .sdk_bodies import (
    Answer,
    EndlessBody,
    FakeServer,
    SDKClients,
    chunk,
    completion,
    error_answer,
    event_stream,
    failed_stream,
    openai_sse,
)

if TYPE_CHECKING:
    from conftest import Spans

pytestmark = pytest.mark.anyio


@pytest.fixture
def make_model(sdk_clients: SDKClients) -> Callable[..., OpenAIModel]:
    return sdk_clients.openai_model


PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 8
ADD = ToolSpec(
    "add",
    "Add two numbers.",
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
)


async def test_a_llama_cpp_server_counts_the_prompt(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """count_prompt_tokens asks a compatible server for the chat request through its
    template (/apply-template: messages, tools and what the template reads, such as
    chat_template_kwargs), then for its tokens (/tokenize). A server that turns the
    endpoints down is asked once; a transient failure raises; OpenAI's own API is never
    asked."""
    server = FakeServer(
        httpx2.Response(200, json={"prompt": "<|user|>hello<|end|>"}),
        httpx2.Response(200, json={"tokens": [1, 2, 3, 4, 5]}),
    )
    settings = {"max_tokens": 50, "chat_template_kwargs": {"enable_thinking": False}}
    request = ModelRequest([Message.user("hello")], [ADD], settings)
    model = make_model(server, base_url="http://127.0.0.1:8080/v1")
    assert await model.count_prompt_tokens(request) == 5
    applied, tokenized = server.requests
    assert (applied.url.path, tokenized.url.path) == ("/apply-template", "/tokenize")
    template, tokens = server.bodies
    assert template["messages"] == [{"role": "user", "content": "hello"}]
    assert [tool["function"]["name"] for tool in template["tools"]] == ["add"]
    assert template["chat_template_kwargs"] == {"enable_thinking": False}
    assert tokens == {"content": "<|user|>hello<|end|>", "add_special": True, "parse_special": True}
    for absent in (
        error_answer(404, {"error": {"message": "File Not Found", "code": 404}}),
        error_answer(405, {"error": {"message": "Method Not Allowed"}}),
        httpx2.Response(200, json={"object": "error"}),
    ):
        other = FakeServer(absent, absent, absent)
        refused = make_model(other, base_url="http://127.0.0.1:8000/v1")
        assert await refused.count_prompt_tokens(request) is None
        assert await refused.count_prompt_tokens(request) is None
        paths = [asked.url.path for asked in other.requests]
        assert paths == ["/apply-template", "/tokenize", "/v1/responses/input_tokens"]  # once
    busy = make_model(
        FakeServer(error_answer(503, {"error": {"message": "loading"}})), base_url="http://h:1/v1"
    )
    with pytest.raises(ProviderUnavailableError):
        await busy.count_prompt_tokens(request)


async def test_a_count_turned_down_is_an_error_and_three_in_a_row_turn_that_way_off(
    make_model: Callable[..., OpenAIModel], caplog: pytest.LogCaptureFixture
) -> None:
    """A client error judges the one request counted (an image the server cannot fetch, a
    shape it refuses): the count raises, and the next request is counted again; only
    ``COUNT_REFUSALS`` in a row turn that way of counting off (with a warning), and a
    count in between starts the tally again."""
    refusal = error_answer(400, {"error": {"message": "image download failed"}})
    counted = httpx2.Response(200, json={"input_tokens": 9})
    server = FakeServer(refusal, refusal, counted, refusal, refusal, refusal)
    model = make_model(server)
    request = ModelRequest([Message.user("hello")])
    for expected in ("refused", "refused", 9, "refused", "refused", "refused", None, None):
        if expected == "refused":
            with pytest.raises(InvalidRequestError):
                await model.count_prompt_tokens(request)
        else:
            assert await model.count_prompt_tokens(request) == expected
    assert len(server.requests) == 6  # not asked after the third refusal in a row
    (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "turned down 3 prompt counts through /v1/responses/input_tokens in a row (HTTP 400)" in (
        warning.getMessage()
    )
    assert "hello" not in caplog.text


async def test_a_vllm_server_counts_the_prompt(make_model: Callable[..., OpenAIModel]) -> None:
    """A server without llama.cpp's /apply-template is asked vLLM's way: /tokenize with the
    chat request's messages, tools and chat_template_kwargs (the template's own inputs),
    read as its "count"; from then on only that way."""
    server = FakeServer(
        error_answer(404, {"detail": "Not Found"}),
        httpx2.Response(200, json={"count": 42, "max_model_len": 4096, "tokens": [1] * 42}),
        httpx2.Response(200, json={"count": 43, "max_model_len": 4096, "tokens": [1] * 43}),
    )
    settings = {"max_tokens": 50, "top_k": 5, "chat_template_kwargs": {"enable_thinking": False}}
    request = ModelRequest([Message.user("hello")], [ADD], settings)
    model = make_model(server, base_url="http://10.0.0.5:8000/v1")
    assert await model.count_prompt_tokens(request) == 42
    assert await model.count_prompt_tokens(request) == 43
    paths = [asked.url.path for asked in server.requests]
    assert paths == ["/apply-template", "/tokenize", "/tokenize"]
    counted = server.bodies[1]
    assert counted == {
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hello"}],
        "tools": counted["tools"],
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert [tool["function"]["name"] for tool in counted["tools"]] == ["add"]


async def test_openai_counts_the_prompt_of_the_same_request(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """On OpenAI's own API, count_prompt_tokens asks the input-token count endpoint for
    what the chat request puts in the prompt, in the Responses API's shapes: the messages
    as input items (text, images, tool calls and results), the tools (not strict, as in
    chat), the tool choice, the answer's schema and the reasoning effort; nothing else."""
    server = FakeServer(
        httpx2.Response(200, json={"object": "response.input_tokens", "input_tokens": 97})
    )
    messages = [
        Message.developer("Be brief."),
        Message("user", [TextPart("What is this?"), ImagePart(url="https://x.test/a.png")]),
        Message.assistant("Adding.", [ToolCall("c1", "add", {"a": 2, "b": 3})]),
        Message.tool("c1", "5"),
    ]
    settings = {
        "max_tokens": 50,
        "temperature": 0.2,
        "reasoning_effort": "low",
        "tool_choice": {"type": "function", "function": {"name": "add"}},
    }
    request = ModelRequest(messages, [ADD], settings)
    assert await make_model(server).count_prompt_tokens(request) == 97
    (asked,) = server.requests
    assert asked.url.path == "/v1/responses/input_tokens"
    assert server.bodies[0] == {
        "model": "gpt-4o-mini",
        "input": [
            {"role": "developer", "content": "Be brief."},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is this?"},
                    {"type": "input_image", "image_url": "https://x.test/a.png", "detail": "auto"},
                ],
            },
            {"role": "assistant", "content": "Adding."},
            {
                "type": "function_call",
                "call_id": "c1",
                "name": "add",
                "arguments": '{"a": 2, "b": 3}',
            },
            {"type": "function_call_output", "call_id": "c1", "output": "5"},
        ],
        "tools": [
            {
                "type": "function",
                "strict": False,
                "name": "add",
                "description": "Add two numbers.",
                "parameters": dict(ADD.parameters),
            }
        ],
        "tool_choice": {"type": "function", "name": "add"},
        "reasoning": {"effort": "low"},
    }
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    answered = FakeServer(httpx2.Response(200, json={"input_tokens": 12}))
    structured = ModelRequest([Message.user("n?")], output_schema=OutputSchema("Number", schema))
    assert await make_model(answered).count_prompt_tokens(structured) == 12
    chat = FakeServer(completion({"content": '{"n": 1}'}))
    await make_model(chat).respond(structured)
    sent = chat.bodies[0]["response_format"]
    (form,) = [body["text"]["format"] for body in answered.bodies]
    assert form == {"type": "json_schema", **sent["json_schema"]}
    assert (form["name"], form["schema"]["properties"]) == ("Number", schema["properties"])
    absent = FakeServer(
        error_answer(404, {"error": {"message": "Invalid URL (POST /v1/responses/input_tokens)"}})
    )
    unknown = make_model(absent)
    assert await unknown.count_prompt_tokens(request) is None
    assert await unknown.count_prompt_tokens(request) is None
    assert len(absent.requests) == 1  # asked once
    limited = make_model(FakeServer(error_answer(429, {"error": {"message": "slow down"}})))
    with pytest.raises(RateLimitError):
        await limited.count_prompt_tokens(request)


@pytest.mark.parametrize("host", ["eu.api.openai.com", "us.api.openai.com", "API.OpenAI.com"])
async def test_openai_s_regional_hosts_are_openai_s_own_api(
    make_model: Callable[..., OpenAIModel], host: str
) -> None:
    """A data-residency host of OpenAI's API is OpenAI's API: counted through the
    input-token count endpoint alone (never asked for llama.cpp's or vLLM's endpoints),
    with the developer role and max_completion_tokens, and its window taken from the
    table, not asked for."""
    server = FakeServer(
        httpx2.Response(200, json={"input_tokens": 7}), completion({"content": "hi"})
    )
    model = make_model(server, base_url=f"https://{host}/v1")
    messages = [Message.developer("Be brief."), Message.user("hello")]
    request = ModelRequest(messages, settings={"max_tokens": 5})
    assert await model.count_prompt_tokens(request) == 7
    await model.respond(request)
    paths = [asked.url.path for asked in server.requests]
    assert paths == ["/v1/responses/input_tokens", "/v1/chat/completions"]
    sent = server.bodies[1]
    assert (sent["messages"][0]["role"], sent["max_completion_tokens"]) == ("developer", 5)
    assert model.context_window == 128_000


async def test_a_proxy_in_front_of_openai_counts_through_the_input_token_endpoint(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """A server at another host that has neither llama.cpp's nor vLLM's endpoints but
    answers OpenAI's input-token count (a gateway in front of OpenAI's API) is counted
    that way, and from then on asked only that way."""
    server = FakeServer(
        error_answer(404, {"error": {"message": "not found"}}),
        error_answer(404, {"error": {"message": "not found"}}),
        httpx2.Response(200, json={"input_tokens": 21}),
        httpx2.Response(200, json={"input_tokens": 22}),
    )
    model = make_model(server, base_url="https://gateway.example.test/openai/v1")
    request = ModelRequest([Message.user("hello")])
    assert await model.count_prompt_tokens(request) == 21
    assert await model.count_prompt_tokens(request) == 22
    assert [asked.url.path for asked in server.requests] == [
        "/openai/apply-template",
        "/openai/tokenize",
        "/openai/v1/responses/input_tokens",
        "/openai/v1/responses/input_tokens",
    ]
    assert server.bodies[2] == {
        "model": "gpt-4o-mini",
        "input": [{"role": "user", "content": "hello"}],
    }


@pytest.mark.parametrize(
    ("settings", "messages", "expected"),
    [
        pytest.param(
            {
                "tool_choice": {
                    "type": "allowed_tools",
                    "allowed_tools": {
                        "mode": "auto",
                        "tools": [{"type": "function", "function": {"name": "add"}}],
                    },
                }
            },
            [Message.user("x")],
            {
                "tool_choice": {
                    "type": "allowed_tools",
                    "mode": "auto",
                    "tools": [{"type": "function", "name": "add"}],
                }
            },
            id="allowed tools",
        ),
        pytest.param(
            {"tool_choice": {"type": "custom", "custom": {"name": "grammar"}}},
            [Message.user("x")],
            {"tool_choice": {"type": "custom", "name": "grammar"}},
            id="a custom tool",
        ),
        pytest.param(
            {"verbosity": "low", "reasoning_effort": "minimal"},
            [Message.user("x")],
            {"text": {"verbosity": "low"}, "reasoning": {"effort": "minimal"}},
            id="verbosity",
        ),
        pytest.param(
            {},
            [Message.user(""), Message.assistant(""), Message.user("x")],
            {
                "input": [
                    {"role": "user", "content": ""},
                    {"role": "assistant", "content": ""},
                    {"role": "user", "content": "x"},
                ]
            },
            id="empty messages count too",
        ),
    ],
)
async def test_the_count_request_has_the_responses_api_shapes(
    make_model: Callable[..., OpenAIModel],
    settings: dict[str, Any],
    messages: list[Message],
    expected: dict[str, Any],
) -> None:
    """What chat completions nest under an object's type (a tool choice, the tools it
    allows) the count endpoint takes beside it; verbosity goes with the answer's format,
    and an empty message still counts (its role's tokens)."""
    server = FakeServer(httpx2.Response(200, json={"input_tokens": 5}))
    request = ModelRequest(messages, [ADD], settings)
    assert await make_model(server).count_prompt_tokens(request) == 5
    body = server.bodies[0]
    assert {key: body[key] for key in expected} == expected


async def test_an_overflow_on_openai_is_recovered_by_its_count(
    make_model: Callable[..., OpenAIModel], spans: Spans
) -> None:
    """Through OpenAI's own API: a turn that overflows is counted alone, summarized, the
    compacted request counted, and retried once, with the count on the retried span."""
    overflow = {
        "error": {
            "message": "This model's maximum context length is 1000 tokens. However, your "
            "messages resulted in 1400 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    server = FakeServer(
        error_answer(400, overflow),
        httpx2.Response(200, json={"input_tokens": 300}),  # the current turn alone
        completion({"content": "- the user asked about the hills"}, usage=(700, 9)),
        httpx2.Response(200, json={"input_tokens": 420}),  # the compacted request
        completion({"content": "ok"}, usage=(420, 1)),
    )

    @manage_context(compression_threshold=1.0)
    class Counted(Agent):
        max_retries = 0
        instructions = "Be brief."

    history = [
        message
        for _ in range(8)
        for message in (
            Message.user("Tell me about the weather in the hills. " * 4),
            Message.assistant("The hills are cloudy and the valleys are warm. " * 4),
        )
    ]
    model = make_model(server, context_window=1_000)
    result = await Counted(model=model).run("And tomorrow?", history=history)
    assert result.output == "ok"
    paths = [asked.url.path for asked in server.requests]
    assert paths == [
        "/v1/chat/completions",
        "/v1/responses/input_tokens",
        "/v1/chat/completions",
        "/v1/responses/input_tokens",
        "/v1/chat/completions",
    ]
    retried = spans.named("chat")[-1].attributes or {}
    assert retried["littleghost.compaction.counted_prompt_tokens"] == 420


async def test_request_translation_for_openai(make_model: Callable[..., OpenAIModel]) -> None:
    server = FakeServer(completion({"content": "ok"}))
    model = make_model(server)
    request = ModelRequest(
        [
            Message.system("You are terse."),
            Message.developer("Answer in English."),
            Message.user("hello"),
            Message("user", [TextPart("what is this?"), ImagePart(data=PNG)]),
            Message.assistant(
                "Let me add.",
                [ToolCall("call_1", "add", {"a": 1, "b": 2}), ToolCall("call_2", "add", "{oops")],
            ),
            Message.tool("call_1", "3"),
            Message.tool("call_2", "Invalid arguments", is_error=True),
            Message("user", [ImagePart(url="https://example.com/cat.png")]),
        ],
        [ADD],
        {"max_tokens": 50, "temperature": 0, "top_k": 40, "parallel_tool_calls": True},
    )
    response = await model.respond(request)
    assert response.message.text == "ok"
    [body] = server.bodies
    assert body["model"] == "gpt-4o-mini"
    assert body["messages"] == [
        {"role": "system", "content": "You are terse."},
        {"role": "developer", "content": "Answer in English."},
        {"role": "user", "content": "hello"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,iVBORw0KGgoAAAAAAAAAAA=="},
                },
            ],
        },
        {
            "role": "assistant",
            "content": "Let me add.",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                },
                {
                    "id": "call_2",
                    "type": "function",
                    "function": {"name": "add", "arguments": "{}"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "3"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Invalid arguments"},
        {
            "role": "user",
            "content": [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}],
        },
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "add",
                "description": "Add two numbers.",
                "parameters": ADD.parameters,
            },
        }
    ]
    assert body["max_completion_tokens"] == 50
    assert "max_tokens" not in body
    assert (body["temperature"], body["top_k"], body["parallel_tool_calls"]) == (0, 40, True)


async def test_extra_body_s_keys_go_into_the_body_as_they_are(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """An ``extra_body`` setting's keys travel beside the others, as the server reads them
    (a setting littleghost does not know among them); one littleghost sets itself is a
    ConfigurationError before anything is sent."""
    server = FakeServer(completion({"content": "ok"}))
    model = make_model(server, base_url="http://10.0.0.5:8000/v1")
    settings = {"extra_body": {"top_a": 0.5, "temprature": 1}, "min_p": 0.1, "max_tokens": 9}
    await model.respond(ModelRequest([Message.user("hello")], settings=settings))
    [body] = server.bodies
    sent = {key: body[key] for key in ("top_a", "temprature", "min_p", "max_tokens")}
    assert sent == {"top_a": 0.5, "temprature": 1, "min_p": 0.1, "max_tokens": 9}
    assert "extra_body" not in body
    request = ModelRequest([Message.user("hello")], settings={"extra_body": {"stream": False}})
    with pytest.raises(ConfigurationError, match="'stream' is set by littleghost"):
        await model.respond(request)
    assert len(server.bodies) == 1


async def test_arguments_json_cannot_carry_go_back_as_empty_arguments(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """A history's call holding NaN or an int too long to write (no store checked it): its
    arguments go as ``{}``, as unparsable ones do (llama.cpp and vLLM refuse a request
    over them); ``NaN`` went as its text, and such an int raised Python's ``ValueError``."""
    server = FakeServer(completion({"content": "ok"}))
    long = 10 ** sys.get_int_max_str_digits()
    calls = [ToolCall("call_1", "add", {"a": math.nan}), ToolCall("call_2", "add", {"a": long})]
    request = ModelRequest(
        [
            Message.user("add"),
            Message.assistant(tool_calls=calls),
            Message.tool("call_1", "no"),
            Message.tool("call_2", "no"),
        ],
        [ADD],
    )
    await make_model(server).respond(request)
    [body] = server.bodies
    sent = [call["function"]["arguments"] for call in body["messages"][1]["tool_calls"]]
    assert sent == ["{}", "{}"]


async def test_repeated_call_ids_go_out_as_ids_of_their_own(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """OpenAI refuses a request whose tool-call ids repeat (``Duplicate value for
    'tool_call_id'``), as a log may: a server that sends no ids makes ``call_0`` in every
    answer, parallel calls may share one. Each call goes out under an id of its own, its
    results under the same, paired as the log pairs them; the log keeps its ids, and
    the ids a request's earlier messages go out under stay as the conversation grows."""
    server = FakeServer(*(completion({"content": "ok"}) for _ in range(2)))
    history = [
        Message.user("add"),
        Message.assistant(tool_calls=[ToolCall("call_0", "add", {"a": 1, "b": 1})]),
        Message.tool("call_0", "2"),
        Message.assistant(
            tool_calls=[
                ToolCall("call_0", "add", {"a": 2, "b": 2}),
                ToolCall("call_0", "add", {"a": 3, "b": 3}),
            ]
        ),
        Message.tool("call_0", "4"),
        Message.tool("call_0", "6"),
    ]
    model = make_model(server)
    await model.respond(ModelRequest(history[:3], [ADD]))
    await model.respond(ModelRequest(history, [ADD]))
    first, body = server.bodies
    calls = [
        (call["id"], json.loads(call["function"]["arguments"])["a"])
        for entry in body["messages"]
        for call in entry.get("tool_calls") or ()
    ]
    assert calls == [("call_0", 1), ("call_0_2", 2), ("call_0_3", 3)]
    results = [
        (entry["tool_call_id"], entry["content"])
        for entry in body["messages"]
        if entry["role"] == "tool"
    ]
    assert results == [("call_0", "2"), ("call_0_2", "4"), ("call_0_3", "6")]
    assert body["messages"][: len(first["messages"])] == first["messages"]
    assert {call.id for message in history for call in message.tool_calls} == {"call_0"}


async def test_an_empty_answer_goes_back_with_empty_content(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """The SDK's assistant param: content is required unless there are tool calls."""
    server = FakeServer(completion({"content": "ok"}))
    history = [
        Message.user("hi"),
        Message("assistant", []),
        Message.user("add"),
        Message("assistant", [ToolCall("call_1", "add", {"a": 1, "b": 2})]),
        Message("tool", [ToolResult("call_1", "3")]),
    ]
    await make_model(server).respond(ModelRequest(history, [ADD]))
    sent = server.bodies[0]["messages"]
    assert sent[1] == {"role": "assistant", "content": ""}
    assert sent[3]["content"] is None and sent[3]["tool_calls"]


async def test_other_servers_get_system_role_and_max_tokens(
    make_model: Callable[..., OpenAIModel],
) -> None:
    server = FakeServer(completion({"content": "ok"}))
    model = make_model(server, base_url="http://127.0.0.1:8080/v1")
    request = ModelRequest(
        [Message.developer("Be brief."), Message.user("hi")],
        settings={"max_tokens": 7, "seed": 42, "tool_choice": "auto", "parallel_tool_calls": False},
    )
    await model.respond(request)
    [body] = server.bodies
    assert str(server.requests[0].url) == "http://127.0.0.1:8080/v1/chat/completions"
    assert body["messages"][0] == {"role": "system", "content": "Be brief."}
    assert (body["max_tokens"], body["seed"]) == (7, 42)
    assert "tool_choice" not in body and "parallel_tool_calls" not in body


async def test_response_translation(make_model: Callable[..., OpenAIModel]) -> None:
    server = FakeServer(
        completion(
            {
                "content": "I'll add both.",
                "tool_calls": [
                    {
                        "id": "call_a",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                    },
                    {
                        "id": "call_b",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 3,'},
                    },
                ],
            },
            finish_reason="tool_calls",
            usage=(120, 30),
        )
    )
    response = await make_model(server).respond(ModelRequest([Message.user("add")], [ADD]))
    assert response.message.text == "I'll add both."
    assert response.message.tool_calls == (
        ToolCall("call_a", "add", {"a": 1, "b": 2}),
        ToolCall("call_b", "add", '{"a": 3,'),
    )
    assert response.stop_reason is StopReason.TOOL_USE
    assert (response.usage.input_tokens, response.usage.output_tokens) == (120, 30)


def reported(
    prompt: int, completion: int, total: int, prompt_details: dict[str, int], reasoning: int = 0
) -> dict[str, Any]:
    """A Chat Completions ``usage`` object."""
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": total,
        "prompt_tokens_details": prompt_details,
        "completion_tokens_details": {"reasoning_tokens": reasoning},
    }


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        (
            reported(900, 120, 1020, {"cached_tokens": 768}, 100),
            Usage(900, 120, cache_read_tokens=768, reasoning_tokens=100),
        ),
        (
            reported(663, 50, 837, {"cached_tokens": 654}, 124),
            Usage(663, 174, cache_read_tokens=654, reasoning_tokens=124),
        ),
        (
            reported(2006, 30, 2036, {"cached_tokens": 1500, "cache_write_tokens": 400}),
            Usage(2006, 30, cache_read_tokens=1500, cache_write_tokens=400),
        ),
    ],
    ids=["reasoning-in-completion", "reasoning-apart", "cache-writes"],
)
async def test_usage_reports_cached_and_reasoning_tokens_apart(
    make_model: Callable[..., OpenAIModel], usage: dict[str, Any], expected: Usage
) -> None:
    """Prompt tokens include the cached ones (read, and written:
    ``cache_write_tokens``, which OpenAI's newer models bill and OpenRouter reports for
    Anthropic's) and completion tokens the reasoning ones; each part is reported, answered
    whole or streamed. xAI (Grok) counts reasoning tokens apart from completion tokens, as
    its total shows: output tokens are both."""
    answer = completion({"content": "ok"})
    body = json.loads(answer.content)
    body["usage"] = usage
    server = FakeServer(
        httpx2.Response(200, json=body),
        event_stream(
            openai_sse(chunk({"content": "ok"}, finish_reason="stop"), chunk(None, usage=usage))
        ),
    )
    model = make_model(server)
    assert (await model.respond(ModelRequest([Message.user("hi")]))).usage == expected
    events = [event async for event in model.stream(ModelRequest([Message.user("hi")]))]
    assert isinstance(events[-1], StreamDone) and events[-1].response.usage == expected


async def test_a_breakdown_over_its_total_is_cut_to_it(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """A server that reports more cached tokens than prompt tokens does not fail the call."""
    answer = completion({"content": "ok"})
    body = json.loads(answer.content)
    body["usage"] = {
        "prompt_tokens": 10,
        "completion_tokens": 2,
        "prompt_tokens_details": {"cached_tokens": 50},
        "completion_tokens_details": {"reasoning_tokens": 9},
    }
    server = FakeServer(httpx2.Response(200, json=body))
    response = await make_model(server).respond(ModelRequest([Message.user("hi")]))
    assert response.usage == Usage(10, 2, cache_read_tokens=10, reasoning_tokens=2)


async def test_arguments_nested_too_deep_are_kept_raw(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Arguments deeper than the JSON parser goes stay the raw text (answered as invalid)."""
    deep = "[" * 100_000
    call = {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": deep}}
    server = FakeServer(completion({"tool_calls": [call]}, finish_reason="tool_calls"))
    response = await make_model(server).respond(ModelRequest([Message.user("add")], [ADD]))
    assert response.message.tool_calls == (ToolCall("call_a", "add", deep),)


async def test_arguments_holding_nan_are_kept_raw(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """NaN is not JSON: such arguments stay the raw text (answered as invalid, storable)."""
    raw = '{"a": NaN, "b": 1e400}'
    call = {"id": "call_a", "type": "function", "function": {"name": "add", "arguments": raw}}
    server = FakeServer(completion({"tool_calls": [call]}, finish_reason="tool_calls"))
    response = await make_model(server).respond(ModelRequest([Message.user("add")], [ADD]))
    assert response.message.tool_calls == (ToolCall("call_a", "add", raw),)


@pytest.mark.parametrize(
    ("finish_reason", "stop_reason"),
    [
        ("stop", StopReason.END_TURN),
        ("length", StopReason.MAX_TOKENS),
        ("content_filter", StopReason.CONTENT_FILTER),
        (None, StopReason.END_TURN),
    ],
)
async def test_stop_reasons(
    make_model: Callable[..., OpenAIModel], finish_reason: str | None, stop_reason: StopReason
) -> None:
    server = FakeServer(completion({"content": "x"}, finish_reason=finish_reason))
    response = await make_model(server).respond(ModelRequest([Message.user("hi")]))
    assert response.stop_reason is stop_reason


async def test_a_setting_littleghost_owns_is_rejected(
    make_model: Callable[..., OpenAIModel],
) -> None:
    model = make_model(FakeServer())
    with pytest.raises(ConfigurationError, match="'stream'"):
        await model.respond(ModelRequest([Message.user("hi")], settings={"stream": True}))


OVERFLOW_BODY = {
    "error": {
        "message": "This model's maximum context length is 128000 tokens. However, your messages "
        "resulted in 130521 tokens. Please reduce the length of the messages.",
        "type": "invalid_request_error",
        "param": "messages",
        "code": "context_length_exceeded",
    }
}


@pytest.mark.parametrize(
    ("answer", "kind", "attributes"),
    [
        (
            error_answer(400, OVERFLOW_BODY),
            ContextWindowOverflowError,
            {
                "status": 400,
                "code": "context_length_exceeded",
                "prompt_tokens": 130521,
                "context_window": 128000,
            },
        ),
        (
            error_answer(
                400,
                {
                    "error": {
                        "code": 400,
                        "type": "exceed_context_size_error",
                        "message": "request (530 tokens) exceeds the available context size (512 tokens), try increasing it",
                        "n_prompt_tokens": 530,
                        "n_ctx": 512,
                    }
                },
            ),
            ContextWindowOverflowError,
            {"prompt_tokens": 530, "context_window": 512},
        ),
        pytest.param(
            error_answer(
                422,
                {
                    "error": "Input validation error: `inputs` tokens + `max_new_tokens` must be "
                    "<= 4096. Given: 4000 `inputs` tokens and 200 `max_new_tokens`",
                    "error_type": "validation",
                },
            ),
            ContextWindowOverflowError,
            {"status": 422, "prompt_tokens": 4000, "context_window": 4096},
            id="TGI: prompt and output over the total limit",
        ),
        pytest.param(
            error_answer(
                422,
                {
                    "error": "Input validation error: `inputs` must have less than 4095 tokens. "
                    "Given: 5000",
                    "error_type": "validation",
                },
            ),
            ContextWindowOverflowError,
            {"status": 422, "prompt_tokens": 5000, "context_window": 4095},
            id="TGI: prompt over the input limit",
        ),
        pytest.param(
            error_answer(
                400,
                {
                    "error": {
                        "message": "You passed 9000 input tokens and requested 512 output tokens. "
                        "However, the model's context length is only 8192 tokens, resulting in a "
                        "maximum input length of 7680 tokens. Please reduce the length of the "
                        "input prompt.",
                        "type": "BadRequestError",
                        "param": "input_tokens",
                        "code": 400,
                    }
                },
            ),
            ContextWindowOverflowError,
            {"status": 400, "prompt_tokens": 9000, "context_window": 8192},
            id="vLLM: renderer's input-length check",
        ),
        pytest.param(
            error_answer(
                400,
                {
                    "error": {
                        "message": "This model's maximum context length is 8192 tokens. However, "
                        "you requested 64 output tokens and your prompt contains at least 8129 "
                        "input tokens, for a total of at least 8193 tokens. Please reduce the "
                        "length of the input prompt or the number of requested output tokens.",
                        "type": "BadRequestError",
                        "param": "input_tokens",
                        "code": 400,
                    }
                },
            ),
            ContextWindowOverflowError,
            {"status": 400, "prompt_tokens": 8129, "context_window": 8192},
            id="vLLM: prompt plus output tokens",
        ),
        (
            error_answer(
                429,
                {
                    "error": {
                        "message": "Rate limit reached for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 200000, Used 199000, Requested 1500. Please try again in 450ms.",
                        "type": "tokens",
                        "param": None,
                        "code": "rate_limit_exceeded",
                    }
                },
                {"retry-after-ms": "450", "retry-after": "1"},
            ),
            RateLimitError,
            {"status": 429, "retry_after": 0.45},
        ),
        (
            error_answer(
                429,
                {
                    "error": {
                        "message": "Rate limit reached for requests",
                        "type": "requests",
                        "param": None,
                        "code": "rate_limit_exceeded",
                    }
                },
                {
                    "x-ratelimit-reset-requests": "1.2s",
                    "x-ratelimit-remaining-requests": "0",
                    "x-ratelimit-reset-tokens": "6m0s",
                    "x-ratelimit-remaining-tokens": "180000",
                },
            ),
            RateLimitError,
            {"status": 429, "retry_after": 1.2},
        ),
        (
            error_answer(
                429,
                {
                    "error": {
                        "message": "Request too large for gpt-4o-mini in organization org-x on tokens per min (TPM): Limit 200000, Requested 250000. The input or output tokens must be reduced in order to run successfully.",
                        "type": "tokens",
                        "param": None,
                        "code": "rate_limit_exceeded",
                    }
                },
                {"retry-after": "1"},
            ),
            InvalidRequestError,
            {"status": 429},
        ),
        (
            error_answer(
                500,
                {
                    "error": {
                        "message": "The server had an error while processing your request.",
                        "type": "server_error",
                    }
                },
            ),
            ProviderUnavailableError,
            {"status": 500},
        ),
        (
            error_answer(
                503,
                {
                    "error": {
                        "message": "The engine is currently overloaded.",
                        "type": "server_error",
                    }
                },
                {"retry-after": "2"},
            ),
            ProviderUnavailableError,
            {"status": 503, "retry_after": 2.0},
        ),
        (
            error_answer(
                401,
                {
                    "error": {
                        "message": "Incorrect API key provided: sk-test.",
                        "type": "invalid_request_error",
                        "code": "invalid_api_key",
                    }
                },
            ),
            InvalidRequestError,
            {"status": 401, "code": "invalid_api_key"},
        ),
        (httpx2.ConnectError("connection refused"), ProviderUnavailableError, {"status": None}),
        (httpx2.ReadTimeout("timed out"), ProviderUnavailableError, {"code": "timeout"}),
    ],
)
async def test_errors_are_mapped_and_not_retried_by_the_sdk(
    make_model: Callable[..., OpenAIModel],
    answer: Answer,
    kind: type[ProviderError],
    attributes: dict[str, object],
) -> None:
    server = FakeServer(answer, completion({"content": "should not be reached"}))
    model = make_model(server)
    with pytest.raises(ProviderError) as caught:
        await model.respond(ModelRequest([Message.user("secret prompt text")]))
    assert type(caught.value) is kind
    assert not isinstance(caught.value, openai.OpenAIError)
    assert caught.value.provider == "openai"
    for name, value in attributes.items():
        assert getattr(caught.value, name) == value, name
    assert "secret prompt text" not in str(caught.value)
    assert len(server.requests) == 1


async def test_an_image_the_servers_model_cannot_take_is_not_retried(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """llama.cpp answers an image its model cannot take (no mmproj) with a 500: an
    invalid request, not an outage retried three times."""
    refusal = (
        "image input is not supported - hint: if this is unexpected, you may need to "
        "provide the mmproj"
    )
    body = {"error": {"code": 500, "message": refusal, "type": "server_error"}}
    server = FakeServer(error_answer(500, body), completion({"content": "not reached"}))
    model = make_model(server, base_url="http://127.0.0.1:8080/v1", context_window=4_096)
    question = Message.user("What is this?", ImagePart(data=PNG))
    with pytest.raises(InvalidRequestError, match="the model takes no image input") as caught:
        await Agent(model=model).run(question)
    assert caught.value.status == 500
    assert len(server.requests) == 1


async def test_a_body_that_is_not_json_is_transient(
    make_model: Callable[..., OpenAIModel],
) -> None:
    garbled = httpx2.Response(
        200,
        content=b'{"id": "x", "choices": [{"index": 0,',
        headers={"content-type": "application/json"},
    )
    with pytest.raises(ProviderUnavailableError):
        await make_model(FakeServer(garbled)).respond(ModelRequest([Message.user("hi")]))
    server = FakeServer(garbled, completion({"content": "fine"}))
    assert (await Agent(model=make_model(server)).run("hi")).output == "fine"
    assert len(server.requests) == 2


async def test_an_error_sent_with_a_200_is_classified(
    make_model: Callable[..., OpenAIModel],
) -> None:
    body = {"error": {"message": "upstream provider error", "type": "server_error"}}
    server = FakeServer(httpx2.Response(200, json=body), completion({"content": "fine"}))
    with pytest.raises(ProviderUnavailableError, match="upstream provider error"):
        await make_model(server).respond(ModelRequest([Message.user("hi")]))
    invalid = {"error": {"message": "bad model", "type": "invalid_request_error"}}
    with pytest.raises(InvalidRequestError, match="bad model"):
        await make_model(FakeServer(httpx2.Response(200, json=invalid))).respond(
            ModelRequest([Message.user("hi")])
        )


async def test_an_error_keeps_the_servers_message_short_and_the_sdk_error_as_its_cause(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """As ProviderError's docstring says: what the server said (here it quotes the
    prompt) is in the message, cut to 300 characters; the whole body is in the cause."""
    echoed = "Input should be a valid string: " + "the prompt " * 100
    server = FakeServer(
        error_answer(400, {"error": {"message": echoed, "type": "BadRequestError"}})
    )
    with pytest.raises(InvalidRequestError) as caught:
        await make_model(server).respond(ModelRequest([Message.user("the prompt")]))
    assert "the prompt" in str(caught.value)
    assert len(str(caught.value)) < MAX_DETAIL_CHARS + 100
    assert isinstance(caught.value.__cause__, openai.BadRequestError)
    assert echoed in str(caught.value.__cause__)


async def test_cancellation_propagates_untouched(make_model: Callable[..., OpenAIModel]) -> None:
    async def never(request: httpx2.Request) -> httpx2.Response:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    model = make_model(FakeServer(never))
    with anyio.move_on_after(0.2) as scope:
        await model.respond(ModelRequest([Message.user("hi")]))
    assert scope.cancelled_caught


async def test_stream_yields_text_then_the_whole_response(
    make_model: Callable[..., OpenAIModel],
) -> None:
    server = FakeServer(
        event_stream(
            openai_sse(
                chunk({"role": "assistant", "content": ""}),
                chunk({"content": "Hel"}),
                chunk({"content": "lo, "}),
                chunk({"content": "world"}, finish_reason="stop"),
                chunk(None, usage={"prompt_tokens": 9, "completion_tokens": 4, "total_tokens": 13}),
            )
        )
    )
    model = make_model(server)
    events = [event async for event in model.stream(ModelRequest([Message.user("hi")]))]
    assert events[:-1] == [TextChunk("Hel"), TextChunk("lo, "), TextChunk("world")]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.text == "Hello, world"
    assert done.response.stop_reason is StopReason.END_TURN
    assert (done.response.usage.input_tokens, done.response.usage.output_tokens) == (9, 4)
    [body] = server.bodies
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


def stopped(streamed: bool, reason: str, prompt: int, output: int) -> httpx2.Response:
    """An answer ("Once upon") that ended with the finish ``reason``, streamed or not, and
    reported its usage."""
    if not streamed:
        return completion({"content": "Once upon"}, finish_reason=reason, usage=(prompt, output))
    usage = {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}
    return event_stream(
        openai_sse(
            chunk({"content": "Once upon"}),
            chunk({}, finish_reason=reason),
            chunk(None, usage=usage),
        )
    )


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_answer_stopped_by_the_full_window_is_an_overflow(
    make_model: Callable[..., OpenAIModel], streamed: bool
) -> None:
    """Mistral's ``model_length``: the answer was cut where the window was full, as
    Anthropic's ``model_context_window_exceeded`` says; never a complete answer. The error
    carries the answer's usage, which is billed, and its prompt's size (overflow recovery
    compacts for it: without, it halved the request)."""
    answer = stopped(streamed, "model_length", 31_990, 10)
    model = make_model(FakeServer(answer), base_url="https://api.mistral.ai/v1")
    request = ModelRequest([Message.user("Tell me a story.")])
    with pytest.raises(ContextWindowOverflowError) as caught:
        if streamed:
            [event async for event in model.stream(request)]
        else:
            await model.respond(request)
    assert caught.value.code == "model_length"
    assert caught.value.usage == Usage(31_990, 10)
    assert caught.value.prompt_tokens == 31_990


@pytest.mark.parametrize("streamed", [False, True])
@pytest.mark.parametrize(
    ("prompt", "output", "overflow"),
    [(502, 10, True), (400, 10, False), (472, 40, False)],
    ids=["cut by the full window", "cut by the server's own limit", "at its cap"],
)
async def test_an_answer_a_llama_cpp_server_cut_at_the_full_window_is_an_overflow(
    make_model: Callable[..., OpenAIModel], streamed: bool, prompt: int, output: int, overflow: bool
) -> None:
    """A llama.cpp server ends an answer with ``length`` at its cap, and also where its
    prompt and it filled the context window (it takes a prompt that leaves the answer
    less room than its cap): that one, short of its cap, is an overflow with the prompt's
    size and the window (so a summary call, or a chat call, is compacted for and sent
    again, not retried as is or failed at its cap), and billed."""
    answer = stopped(streamed, "length", prompt, output)
    model = make_model(FakeServer(answer), base_url="http://127.0.0.1:8080/v1", context_window=512)
    request = ModelRequest([Message.user("Tell me a story.")], settings={"max_tokens": 40})
    if not overflow:
        if streamed:
            *_, done = [event async for event in model.stream(request)]
            assert isinstance(done, StreamDone)
            response = done.response
        else:
            response = await model.respond(request)
        assert response.stop_reason is StopReason.MAX_TOKENS
        return
    with pytest.raises(ContextWindowOverflowError) as caught:
        if streamed:
            [event async for event in model.stream(request)]
        else:
            await model.respond(request)
    assert (caught.value.prompt_tokens, caught.value.context_window) == (502, 512)
    assert caught.value.usage == Usage(502, 10)


async def test_a_refusal_is_the_answer_and_stops_for_the_content_filter_streamed_or_not(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """As Anthropic's ``refusal`` stop reason is, so ``RunResult.stop_reason`` tells a
    refusal apart from an answer on either provider."""
    refusal = "I'm sorry, I cannot help with that."
    streamed = openai_sse(
        chunk({"role": "assistant", "content": None, "refusal": ""}),
        chunk({"refusal": refusal[:10]}),
        chunk({"refusal": refusal[10:]}, finish_reason="stop"),
    )
    server = FakeServer(completion({"refusal": refusal}), event_stream(streamed))
    model = make_model(server)
    whole = await model.respond(ModelRequest([Message.user("hi")]))
    events = [e async for e in model.stream(ModelRequest([Message.user("hi")]))]
    assert events[:-1] == [TextChunk(refusal[:10]), TextChunk(refusal[10:])]
    assert isinstance(events[-1], StreamDone)
    assert events[-1].response.message.content == whole.message.content == (TextPart(refusal),)
    assert events[-1].response.stop_reason is whole.stop_reason is StopReason.CONTENT_FILTER


async def test_an_answer_spoken_as_audio_is_its_transcript_streamed_or_not(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """With ``modalities`` holding ``"audio"`` the API sends no ``content``: the answer's
    text is its audio's transcript, kept and sent back as the assistant's text."""
    audio = {"id": "audio_1", "data": "UklGRg==", "expires_at": 9, "transcript": "Hello there"}
    streamed = openai_sse(
        chunk({"role": "assistant", "audio": {"id": "audio_1", "transcript": "Hello "}}),
        chunk({"audio": {"data": "UklGRg==", "transcript": "there"}}, finish_reason="stop"),
        chunk({"audio": {"expires_at": 9}}),
    )
    server = FakeServer(
        completion({"audio": audio}), event_stream(streamed), completion({"content": "ok"})
    )
    model = make_model(server)
    settings = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}
    request = ModelRequest([Message.user("hi")], settings=settings)
    whole = await model.respond(request)
    events = [e async for e in model.stream(request)]
    assert events[:-1] == [TextChunk("Hello "), TextChunk("there")]
    assert isinstance(events[-1], StreamDone)
    assert events[-1].response.message.text == whole.message.text == "Hello there"
    await model.respond(ModelRequest([Message.user("hi"), whole.message, Message.user("and?")]))
    assert server.bodies[2]["messages"][1] == {"role": "assistant", "content": "Hello there"}


async def test_stream_accumulates_parallel_tool_calls(
    make_model: Callable[..., OpenAIModel],
) -> None:
    def call(index: int, **fields: Any) -> dict[str, Any]:
        return {"tool_calls": [{"index": index, **fields}]}

    server = FakeServer(
        event_stream(
            openai_sse(
                chunk(
                    call(0, id="call_a", type="function", function={"name": "add", "arguments": ""})
                ),
                chunk(call(0, function={"arguments": '{"a": 1, '})),
                chunk(
                    call(
                        1,
                        id="call_b",
                        type="function",
                        function={"name": "add", "arguments": '{"a"'},
                    )
                ),
                chunk(call(0, function={"arguments": '"b": 2}'})),
                chunk(call(1, function={"arguments": ': 5, "b": 6}'}), finish_reason="tool_calls"),
                chunk(
                    None, usage={"prompt_tokens": 30, "completion_tokens": 20, "total_tokens": 50}
                ),
            )
        )
    )
    events = [
        e async for e in make_model(server).stream(ModelRequest([Message.user("add")], [ADD]))
    ]
    assert events[:-1] == [ToolCallChunk(), ToolCallChunk()]  # as each call starts
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.tool_calls == (
        ToolCall("call_a", "add", {"a": 1, "b": 2}),
        ToolCall("call_b", "add", {"a": 5, "b": 6}),
    )
    assert done.response.stop_reason is StopReason.TOOL_USE


@pytest.mark.parametrize("index", [None, 0], ids=["no index", "one index"])
async def test_streamed_tool_calls_are_told_apart_by_their_id(
    make_model: Callable[..., OpenAIModel], index: int | None
) -> None:
    """Gemini sends no index; Ollama gives every parallel call index 0, each with its own
    id (they were merged into one call named ``addadd``): two calls either way, and a
    chunk without an id, or the id sent again, is of the call being written."""

    def call(**fields: Any) -> dict[str, Any]:
        placed = {} if index is None else {"index": index}
        return {"tool_calls": [{**placed, "type": "function", **fields}]}

    server = FakeServer(
        event_stream(
            openai_sse(
                chunk(call(id="call_a", function={"name": "add", "arguments": '{"a": 1, '})),
                chunk(call(function={"arguments": '"b": 2}'})),
                chunk(call(id="call_b", function={"name": "add", "arguments": '{"a": 5, "b": 6}'})),
                chunk(call(id="call_b", function={"arguments": ""}), finish_reason="tool_calls"),
            )
        )
    )
    events = [
        e async for e in make_model(server).stream(ModelRequest([Message.user("add")], [ADD]))
    ]
    assert isinstance(events[-1], StreamDone)
    assert events[-1].response.message.tool_calls == (
        ToolCall("call_a", "add", {"a": 1, "b": 2}),
        ToolCall("call_b", "add", {"a": 5, "b": 6}),
    )


@pytest.mark.parametrize("seed", range(8))
async def test_calls_neither_placed_nor_named_are_told_apart_by_their_names(
    make_model: Callable[..., OpenAIModel], seed: int
) -> None:
    """A server that sends each call without an index or id (whole in one piece, or its
    arguments in pieces, its name with the first or with each): a call named after
    another once that one's arguments are whole starts the next call (they were merged
    into one call named ``addmul``, its arguments no JSON, and neither ran)."""
    rng = random.Random(seed)
    names = ["add", "mul", "sub"]
    wanted: list[ToolCall] = []
    chunks: list[dict[str, Any]] = []
    for place in range(rng.randint(2, 4)):
        name = names[place % len(names)]  # each unlike the call before it
        arguments = {"a": rng.randint(0, 99), "b": rng.randint(0, 99)}
        wanted.append(ToolCall(f"call_{place}", name, arguments))
        text = json.dumps(arguments)
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, 3)))
        pieces = [
            text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True)
        ]
        every = rng.random() < 0.5  # the name sent again with each piece (MiniMax's)
        for number, piece in enumerate(pieces):
            function = {"arguments": piece}
            if number == 0 or every:
                function["name"] = name
            chunks.append(chunk({"tool_calls": [{"type": "function", "function": function}]}))
    chunks.append(chunk({}, finish_reason="tool_calls"))
    server = FakeServer(event_stream(openai_sse(*chunks)))
    events = [
        e async for e in make_model(server).stream(ModelRequest([Message.user("add")], [ADD]))
    ]
    assert isinstance(events[-1], StreamDone)
    assert events[-1].response.message.tool_calls == tuple(wanted)
    assert sum(isinstance(event, ToolCallChunk) for event in events) == len(wanted)


async def test_a_name_sent_again_with_each_piece_of_a_call_is_its_name_once(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Some servers (MiniMax on NVIDIA NIM) send a call's whole name, id and type with
    every piece of its arguments: the call was named ``addaddadd``, an unknown tool. A
    name written in pieces (Gemini's) is still joined."""

    def call(index: int, name: str, arguments: str) -> dict[str, Any]:
        function = {"name": name, "arguments": arguments}
        return {
            "tool_calls": [
                {"index": index, "id": f"call_{index}", "type": "function", "function": function}
            ]
        }

    server = FakeServer(
        event_stream(
            openai_sse(
                chunk(call(0, "add", "")),
                chunk(call(0, "add", '{"a": 1, ')),
                chunk(call(0, "add", '"b": 2}')),
                chunk(call(1, "ad", '{"a": 5, ')),
                chunk(call(1, "d", '"b": 6}'), finish_reason="tool_calls"),
            )
        )
    )
    events = [
        e async for e in make_model(server).stream(ModelRequest([Message.user("add")], [ADD]))
    ]
    assert isinstance(events[-1], StreamDone)
    assert events[-1].response.message.tool_calls == (
        ToolCall("call_0", "add", {"a": 1, "b": 2}),
        ToolCall("call_1", "add", {"a": 5, "b": 6}),
    )


@pytest.mark.parametrize("finished", [True, False], ids=["finish_reason", "[DONE] alone"])
@pytest.mark.parametrize("resent", ["whole", "so far"])
async def test_arguments_sent_again_with_each_piece_of_a_call_are_the_last_piece(
    make_model: Callable[..., OpenAIModel], resent: str, finished: bool
) -> None:
    """A server that sends a call's whole arguments again with each piece (as MiniMax on
    NVIDIA NIM sends its name), or its arguments so far, had them joined into text that
    is no JSON (the model was told "not valid JSON", or an answer ended by ``[DONE]``
    alone was taken for one cut off). When the joined pieces are no JSON object, each
    piece repeats the one before and goes on, and the last is a JSON object, the last is
    the arguments: a stream written in pieces whose join is an object is never read so,
    and one whose join is none was no arguments anyway."""
    pieces = (
        ['{"a": 1, "b": 2}'] * 3
        if resent == "whole"
        else ['{"a": 1', '{"a": 1, "b"', '{"a": 1, "b": 2}']
    )
    events = [
        chunk(
            {
                "tool_calls": [
                    {
                        "index": 0,
                        "id": "call_0",
                        "type": "function",
                        "function": {"name": "add", "arguments": piece},
                    }
                ]
            }
        )
        for piece in ["", *pieces]
    ]
    if finished:
        events.append(chunk({}, finish_reason="tool_calls"))
    server = FakeServer(event_stream(openai_sse(*events)))
    stream = make_model(server).stream(ModelRequest([Message.user("add")], [ADD]))
    done = [event async for event in stream][-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.tool_calls == (ToolCall("call_0", "add", {"a": 1, "b": 2}),)


async def test_arguments_that_repeat_and_end_in_no_object_are_kept_as_sent(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Pieces that each repeat the one before but end in no JSON object are joined, as
    any arguments that are no JSON are kept as their text (the model is told so)."""

    def call(arguments: str) -> dict[str, Any]:
        function = {"name": "add", "arguments": arguments}
        return {"tool_calls": [{"index": 0, "id": "call_0", "function": function}]}

    server = FakeServer(
        event_stream(
            openai_sse(
                chunk(call('{"a": 1')),
                chunk(call('{"a": 1, "b"'), finish_reason="tool_calls"),
            )
        )
    )
    stream = make_model(server).stream(ModelRequest([Message.user("add")], [ADD]))
    done = [event async for event in stream][-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.tool_calls == (ToolCall("call_0", "add", '{"a": 1{"a": 1, "b"'),)


async def test_a_server_that_rejects_stream_options_is_streamed_without_them(
    make_model: Callable[..., OpenAIModel],
) -> None:
    rejected = error_answer(
        400,
        {
            "error": {
                "message": "Unrecognized request argument supplied: stream_options",
                "type": "invalid_request_error",
                "param": None,
                "code": None,
            }
        },
    )
    text = openai_sse(chunk({"content": "hi"}, finish_reason="stop"))
    server = FakeServer(rejected, event_stream(text), event_stream(text))
    model = make_model(server, base_url="http://127.0.0.1:11434/v1")
    for _ in range(2):
        events = [e async for e in model.stream(ModelRequest([Message.user("hi")]))]
        assert events[0] == TextChunk("hi")
        assert isinstance(events[-1], StreamDone)
        assert events[-1].response.usage.total_tokens == 0
    assert [("stream_options" in body) for body in server.bodies] == [True, False, False]


async def test_an_error_that_quotes_stream_options_leaves_them_on(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """A validation error that quotes the request names stream_options too: the request
    without them fails alike, so the next stream still asks for usage (they were off
    for good, and every later answer reported no usage)."""
    quoting = error_answer(
        400,
        {
            "error": {
                "message": "1 validation error: temperature must be <= 2; input: "
                "{'stream_options': {'include_usage': True}, 'temperature': 5}",
                "type": "BadRequestError",
            }
        },
    )
    text = openai_sse(chunk({"content": "hi"}, finish_reason="stop"))
    server = FakeServer(quoting, quoting, event_stream(text))
    model = make_model(server, base_url="http://127.0.0.1:8000/v1")
    with pytest.raises(InvalidRequestError, match="temperature"):
        async for _ in model.stream(ModelRequest([Message.user("hi")])):
            pass
    async for _ in model.stream(ModelRequest([Message.user("hi")])):
        pass
    assert [("stream_options" in body) for body in server.bodies] == [True, False, True]


async def test_stream_errors_are_mapped(make_model: Callable[..., OpenAIModel]) -> None:
    overflow = FakeServer(error_answer(400, OVERFLOW_BODY))
    with pytest.raises(ContextWindowOverflowError):
        async for _ in make_model(overflow).stream(ModelRequest([Message.user("hi")])):
            pass
    midway = FakeServer(
        event_stream(
            openai_sse(chunk({"content": "par"}), done=False)
            + b'data: {"error": {"message": "The server had an error while processing your request.", "type": "server_error"}}\n\n'
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
            b'data: {"error": "Input validation error: `temperature` must be strictly positive",'
            b' "error_type": "validation"}\n\n',
            InvalidRequestError,
            "Input validation error",
            id="TGI: the error is a string",
        ),
        pytest.param(
            b'data: {"error": "Input validation error: `inputs` must have less than 4095 tokens.'
            b' Given: 5000", "error_type": "validation"}\n\n',
            ContextWindowOverflowError,
            "Given: 5000",
            id="TGI: a prompt over the input limit",
        ),
        pytest.param(
            b'data: {"error": {"message": "Input validation error: `inputs` tokens + '
            b"`max_new_tokens` must be <= 4096. Given: 4000 `inputs` tokens and 200 "
            b'`max_new_tokens`", "http_status_code": 422}}\n\n',
            ContextWindowOverflowError,
            "must be <= 4096",
            id="TGI: an OpenAI-style error event over the total limit",
        ),
        pytest.param(
            b'data: {"error": {"object": "error", "message": "Invalid grammar", '
            b'"type": "BadRequestError", "param": null, "code": 400}}\n\n',
            InvalidRequestError,
            "Invalid grammar",
            id="vLLM: a numeric code",
        ),
        pytest.param(
            b'event: error\ndata: {"message": "upstream rate limit exceeded", "code": 429}\n\n',
            RateLimitError,
            "upstream rate limit exceeded",
            id="an error event without an error key",
        ),
        pytest.param(
            b'error: {"code": 400, "message": "request (5000 tokens) exceeds the available '
            b'context size (4096 tokens), try increasing it", "type": '
            b'"exceed_context_size_error", "n_prompt_tokens": 5000, "n_ctx": 4096}\n\n'
            b"data: [DONE]\n\n",
            ContextWindowOverflowError,
            "exceeds the available context size",
            id="llama.cpp: an error: line (it was dropped, and the answer ended empty)",
        ),
        pytest.param(
            b"event: error\ndata: upstream timed out\n\n",
            ProviderUnavailableError,
            "upstream timed out",
            id="an error event that is not JSON",
        ),
    ],
)
async def test_errors_sent_in_a_stream_are_classified_as_when_not_streamed(
    make_model: Callable[..., OpenAIModel], event: bytes, kind: type[ProviderError], words: str
) -> None:
    body = openai_sse(chunk({"content": "par"}), done=False) + event
    server = FakeServer(event_stream(body), event_stream(body))
    error = await failed_stream(make_model(server))
    assert type(error) is kind
    assert words in str(error)
    retried = issubclass(kind, (ProviderUnavailableError, RateLimitError))
    assert len(server.requests) == (2 if retried else 1)


async def test_a_connection_lost_mid_stream_is_transient(
    make_model: Callable[..., OpenAIModel],
) -> None:
    async def body() -> AsyncIterator[bytes]:
        yield openai_sse(chunk({"content": "par"}), done=False)
        raise httpx2.ReadError("connection reset by peer")

    server = FakeServer(event_stream(body()))
    with pytest.raises(ProviderUnavailableError):
        async for _ in make_model(server).stream(ModelRequest([Message.user("hi")])):
            pass


CUT = openai_sse(chunk({"content": "The answer is "}), chunk({"content": "forty"}), done=False)
HALF_CALL = {
    "index": 0,
    "id": "c1",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"id"'},
}


@pytest.mark.parametrize(
    "answer",
    [
        pytest.param(event_stream(CUT), id="no finish_reason, no [DONE]"),
        pytest.param(event_stream(CUT + b'data: {"id": "chatcmpl-1", "cho'), id="partial event"),
        pytest.param(
            event_stream(CUT + b'data: {"id": "chatcmpl-1",\n'), id="cut between its data lines"
        ),
        pytest.param(
            event_stream(openai_sse(chunk({"tool_calls": [HALF_CALL]}))),
            id="[DONE] after half a call's arguments",
        ),
        pytest.param(
            event_stream(openai_sse(chunk({"reasoning_content": "Let me see"}))),
            id="[DONE] after reasoning alone",
        ),
    ],
)
async def test_a_stream_that_ends_before_its_end_is_transient(
    make_model: Callable[..., OpenAIModel], answer: httpx2.Response
) -> None:
    model = make_model(FakeServer(answer))
    with pytest.raises(ProviderUnavailableError) as caught:
        async for _ in model.stream(ModelRequest([Message.user("hi")])):
            pass
    assert caught.value.code == "incomplete_stream"


@pytest.mark.parametrize(
    ("delta", "expected"),
    [
        ({"content": "forty"}, "forty"),
        (
            {"tool_calls": [{**HALF_CALL, "function": {"name": "f", "arguments": '{"n": 1}'}}]},
            {"n": 1},
        ),
        (
            {"tool_calls": [{**HALF_CALL, "function": {"name": "f", "arguments": '{"n": NaN}'}}]},
            '{"n": NaN}',
        ),
    ],
    ids=["text", "a call", "a call whose arguments are whole but not strict JSON"],
)
async def test_done_without_a_finish_reason_ends_an_answer_that_came_whole(
    make_model: Callable[..., OpenAIModel], delta: dict[str, Any], expected: object
) -> None:
    """``[DONE]`` without any finish reason ends an answer whose every tool call's
    arguments are a whole JSON object, strict or not (``NaN`` is answered to the model as
    invalid, as with a finish reason)."""
    model = make_model(FakeServer(event_stream(openai_sse(chunk(delta)))))
    [*_, done] = [c async for c in model.stream(ModelRequest([Message.user("hi")]))]
    assert isinstance(done, StreamDone)
    answer = done.response.message
    assert (answer.tool_calls[0].arguments if answer.tool_calls else answer.text) == expected


async def test_a_whole_last_event_without_its_blank_line_ends_the_answer(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Only a partial line is cut off: a last event whose line is whole still says the
    answer ended (here by its finish_reason)."""
    body = CUT + f"data: {json.dumps(chunk({}, 'stop'))}\n".encode()
    model = make_model(FakeServer(event_stream(body)))
    chunks = [c async for c in model.stream(ModelRequest([Message.user("hi")]))]
    assert "".join(getattr(c, "text", "") or "" for c in chunks) == "The answer is forty"


@pytest.mark.parametrize(
    "tail", [b"data: [DONE]", f"data: {json.dumps(chunk({}, 'stop'))}".encode()]
)
async def test_a_whole_last_line_without_its_line_ending_ends_the_answer(
    make_model: Callable[..., OpenAIModel], tail: bytes
) -> None:
    """A body whose last line is whole but lacks its line ending (``[DONE]``, or an
    event of JSON) is not cut off."""
    body = CUT + f"data: {json.dumps(chunk({}, 'stop'))}\n\n".encode() + tail
    model = make_model(FakeServer(event_stream(body)))
    chunks = [c async for c in model.stream(ModelRequest([Message.user("hi")]))]
    assert "".join(getattr(c, "text", "") or "" for c in chunks) == "The answer is forty"


@pytest.mark.parametrize("mark", [b"", "\ufeff".encode()], ids=["", "byte order mark"])
@pytest.mark.parametrize("end", [b"\n", b"\r\n", b"\r"], ids=["LF", "CRLF", "CR"])
async def test_the_lines_of_a_stream_may_end_with_cr_lf_or_both(
    make_model: Callable[..., OpenAIModel], end: bytes, mark: bytes
) -> None:
    """Server-sent events end a line with CRLF, LF or CR alone (as the SDKs read them):
    a stream whose lines ended with CR alone was cut off, no line of it ended. Sent a
    byte at a time, a CRLF comes in two pieces, one line end all the same: an event of
    two data lines is one event. A byte order mark before the first line is not part of
    it (as the format says): its first field was unknown, the event lost."""
    first, rest = json.dumps(chunk({"content": "The answer"})).split(", ", 1)
    body = f"data: {first},\ndata: {rest}\n\n".encode() + openai_sse(
        chunk({"content": " is 42."}, "stop")
    )
    body = mark + body.replace(b"\n", end)

    async def bytewise() -> AsyncIterator[bytes]:
        for place in range(len(body)):
            yield body[place : place + 1]

    model = make_model(FakeServer(event_stream(bytewise())))
    chunks = [c async for c in model.stream(ModelRequest([Message.user("hi")]))]
    assert chunks[:-1] == [TextChunk("The answer"), TextChunk(" is 42.")]
    assert isinstance(chunks[-1], StreamDone)
    assert chunks[-1].response.message.text == "The answer is 42."


async def test_a_cut_off_stream_is_retried_and_only_the_retry_is_kept(
    make_model: Callable[..., OpenAIModel],
) -> None:
    whole = openai_sse(chunk({"content": "The answer is 42."}, finish_reason="stop"))
    server = FakeServer(event_stream(CUT), event_stream(whole))
    async with Agent(model=make_model(server)).stream("hi") as events:
        received = [event async for event in events]
    assert ModelCallRetried(1, "ProviderUnavailableError") in received
    assert events.result.output == "The answer is 42."
    assert [message.text for message in events.messages if message.role == "assistant"] == [
        "The answer is 42."
    ]


async def test_closing_a_stream_early_closes_the_response(
    make_model: Callable[..., OpenAIModel],
) -> None:
    body = EndlessBody(openai_sse(chunk({"content": "first"}), done=False))
    model = make_model(FakeServer(event_stream(body)))
    stream = model.stream(ModelRequest([Message.user("hi")]))
    assert await stream.__anext__() == TextChunk("first")
    assert not body.closed
    await stream.aclose()
    assert body.closed


async def test_an_agent_runs_a_tool_round_trip_through_the_sdk(
    make_model: Callable[..., OpenAIModel],
) -> None:
    class Adder(Agent):
        instructions = "Add numbers."

        @tool
        async def add(self, a: int, b: int) -> int:
            """Add two numbers."""
            return a + b

    server = FakeServer(
        completion(
            {
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
                    }
                ]
            },
            finish_reason="tool_calls",
            usage=(50, 10),
        ),
        completion({"content": "5"}, usage=(70, 1)),
    )
    result = await Adder(model=make_model(server)).run("2+3?")
    assert result.output == "5"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (120, 11)
    second = server.bodies[1]["messages"]
    assert second[-2]["tool_calls"][0]["function"] == {
        "name": "add",
        "arguments": '{"a": 2, "b": 3}',
    }
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "5"}


async def test_closing_the_model_leaves_a_given_client_open(
    make_model: Callable[..., OpenAIModel],
) -> None:
    server = FakeServer(completion({"content": "a"}), completion({"content": "b"}))
    model = make_model(server)
    await model.respond(ModelRequest([Message.user("hi")]))
    await model.aclose()
    response = await model.respond(ModelRequest([Message.user("hi")]))
    assert response.message.text == "b"


ADD_CALL = {
    "id": "call_1",
    "type": "function",
    "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'},
}
"""A call of ``Adder``'s tool as a server sends it."""


async def test_reasoning_content_is_captured_and_sent_back_in_the_tool_loop(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """A server's reasoning_content becomes a reasoning part before the answer; it goes
    back on the assistant messages of the current turn's tool loop only, and reasoning of
    another provider never does."""
    server = FakeServer(
        completion(
            {"reasoning_content": "Two plus three.", "tool_calls": [ADD_CALL]},
            finish_reason="tool_calls",
        ),
        completion({"content": "5"}),
    )
    history = [
        Message.user("hi"),
        Message("assistant", [ReasoningPart("earlier turn", None, "openai"), TextPart("hello")]),
    ]
    result = await Adder(model=make_model(server)).run("2+3?", history=history)
    assert result.messages[3].content == (
        ReasoningPart("Two plus three.", None, "openai"),
        ToolCall("call_1", "add", {"a": 2, "b": 3}),
    )
    second = server.bodies[1]["messages"]
    assert "reasoning_content" not in second[1]
    assert second[3]["reasoning_content"] == "Two plus three."
    foreign = Message("assistant", [ReasoningPart("from claude", "sig", "anthropic")])
    server.answers.append(completion({"content": "ok"}))
    await make_model(server).respond(ModelRequest([Message.user("go"), foreign]))
    assert "reasoning_content" not in server.bodies[2]["messages"][1]


async def test_reasoning_of_a_tool_call_answer_goes_back_in_later_turns(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """DeepSeek's and Kimi's thinking modes refuse a request whose assistant message with
    tool calls lacks its reasoning_content, in any later turn: a session's next question
    sends it back; an earlier answer without calls still goes without."""
    server = FakeServer(
        completion(
            {"reasoning_content": "Two plus three.", "tool_calls": [ADD_CALL]},
            finish_reason="tool_calls",
        ),
        completion({"content": "5", "reasoning_content": "It is 5."}),
        completion({"content": "10"}),
    )
    agent = Adder(
        model=make_model(server, base_url="https://api.deepseek.com/v1", context_window=128_000)
    )
    first = await agent.run("2+3?")
    await agent.run("and doubled?", history=first.messages)
    sent = server.bodies[2]["messages"]
    assert [m.get("reasoning_content") for m in sent if m["role"] == "assistant"] == [
        "Two plus three.",
        None,
    ]


async def test_the_estimate_counts_reasoning_exactly_where_it_goes_back(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """For random conversations (answers with and without calls, after a question or
    tool results), an answer's reasoning adds to the estimate exactly when the request
    carries it: counted where it stays behind, a reasoning model's conversation was
    compacted far under its window."""
    rng = random.Random(20261207)
    for _ in range(40):
        messages: list[Message] = [Message.user("q")]
        for index in range(rng.randrange(1, 6)):
            thought = ReasoningPart(f"thought {index} " * rng.randrange(1, 9), None, "openai")
            if rng.random() < 0.5:
                call = ToolCall(f"c{index}", "add", {"a": index})
                messages += [Message("assistant", [thought, call]), Message.tool(call.id, "1")]
            else:
                messages += [Message("assistant", [thought, TextPart("a")]), Message.user("q")]
        server = FakeServer(completion({"content": "ok"}))
        await make_model(server, base_url="http://127.0.0.1:8080/v1", context_window=9_999).respond(
            ModelRequest(messages, [ADD])
        )
        sent = [m for m in server.bodies[0]["messages"] if m["role"] == "assistant"]
        answers = [m for m in messages if m.role is Role.ASSISTANT]
        for answer, entry in zip(answers, sent, strict=True):
            bare = Message("assistant", [p for p in answer.content if p not in answer.reasoning])
            counted = estimate_messages([answer]) > estimate_messages([bare])
            assert counted == ("reasoning_content" in entry), (answer, entry)


async def test_deepseek_is_sent_empty_reasoning_on_calls_that_have_none(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """DeepSeek's thinking mode refuses a request whose answer with tool calls lacks
    reasoning_content: one it answered with no reasoning, and one another provider
    wrote (a session resumed on DeepSeek), go with ``""``, never the other's thinking
    or signature; an answer without calls goes without."""
    server = FakeServer(
        completion({"tool_calls": [ADD_CALL]}, finish_reason="tool_calls"),
        completion({"content": "5"}),
    )
    history = [
        Message.user("1+1?"),
        Message(
            "assistant",
            [ReasoningPart("claude thinks", "sig-1", "anthropic"), ToolCall("c0", "add", {})],
        ),
        Message.tool("c0", "2"),
        Message.assistant("2"),
    ]
    agent = Adder(
        model=make_model(server, base_url="https://api.deepseek.com/v1", context_window=128_000)
    )
    await agent.run("2+3?", history=history)
    sent = server.bodies[1]["messages"]
    assert [m.get("reasoning_content") for m in sent if m["role"] == "assistant"] == [
        "",
        None,
        "",
    ]
    assert "claude thinks" not in json.dumps(sent) and "sig-1" not in json.dumps(sent)


async def test_half_an_emoji_in_arguments_or_reasoning_goes_back_as_utf8_can_carry_it(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """A model's JSON may hold half an emoji (``\\ud83d``, written alone or cut by a token
    limit), read as a lone surrogate: in a call's arguments or its reasoning it failed the
    next model call with ``UnicodeEncodeError`` (and, stored, every later run of the
    session). The log holds U+FFFD in its place, and the tool gets it."""

    class Echo(Agent):
        @tool
        def echo(self, text: str) -> str:
            """Echo the text."""
            return f"echoed {text}"

    arguments = '{"text": "smile \\ud83d"}'  # JSON text: read, the escape is a surrogate
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "echo", "arguments": arguments},
    }
    answer = json.loads(completion({"tool_calls": [call]}, "tool_calls").content)
    answer["choices"][0]["message"]["reasoning_content"] = "smile \ud83d"
    body = json.dumps(answer).encode()  # ASCII: the surrogate as its escape
    server = FakeServer(
        httpx2.Response(200, content=body, headers={"content-type": "application/json"}),
        completion({"content": "done"}),
    )
    result = await Echo(model=make_model(server)).run("smile")
    assert result.messages[1].content == (
        ReasoningPart("smile \ufffd", None, "openai"),
        ToolCall("call_1", "echo", {"text": "smile \ufffd"}),
    )
    assert result.messages[2].tool_results[0].content == "echoed smile \ufffd"
    sent = server.bodies[1]["messages"][1]
    assert sent["reasoning_content"] == "smile \ufffd"
    assert sent["tool_calls"][0]["function"]["arguments"] == '{"text": "smile \ufffd"}'


@pytest.mark.parametrize(
    "base_url", ["https://api.groq.com/openai/v1", "https://api.cerebras.ai/v1"]
)
async def test_reasoning_goes_back_as_reasoning_to_servers_that_send_it_so(
    make_model: Callable[..., OpenAIModel], base_url: str
) -> None:
    """Groq and Cerebras send reasoning as ``reasoning`` and refuse an assistant message
    with ``reasoning_content``: a tool loop's next call sends it back as ``reasoning``."""
    server = FakeServer(
        completion(
            {"reasoning": "Two plus three.", "tool_calls": [ADD_CALL]},
            finish_reason="tool_calls",
        ),
        completion({"content": "5"}),
    )
    agent = Adder(model=make_model(server, base_url=base_url, context_window=128_000))
    assert (await agent.run("2+3?")).output == "5"
    (answer,) = [m for m in server.bodies[1]["messages"] if m["role"] == "assistant"]
    assert answer["reasoning"] == "Two plus three."
    assert "reasoning_content" not in answer


GEMINI = "https://generativelanguage.googleapis.com/v1beta/openai/"


def signed_call(call_id: str, a: int, signature: str | None) -> dict[str, Any]:
    """A tool call as Gemini's OpenAI-compatible endpoint sends it: with its thought
    signature in ``extra_content`` (on the first of parallel calls only)."""
    call: dict[str, Any] = {
        "id": call_id,
        "type": "function",
        "function": {"name": "add", "arguments": json.dumps({"a": a, "b": 1})},
    }
    if signature:
        call["extra_content"] = {"google": {"thought_signature": signature}}
    return call


class Adder(Agent):
    @tool
    def add(self, a: int, b: int) -> int:
        """Add two numbers."""
        return a + b


async def test_a_call_whose_arguments_are_not_json_goes_back_with_an_empty_object(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """llama.cpp (for a template that takes object arguments: Qwen, GLM, ...) and vLLM
    parse the arguments of the calls a request holds, and refuse the request when they are
    not JSON: a malformed call, or one cut at max_tokens, would fail every later call."""

    def as_llama_cpp(request: httpx2.Request) -> httpx2.Response:
        for message in json.loads(request.content)["messages"]:
            for call in message.get("tool_calls", ()):
                try:
                    json.loads(call["function"]["arguments"])
                except ValueError:
                    message = "Failed to parse tool call arguments as JSON"
                    return error_answer(500, {"error": {"code": 500, "message": message}})
        return completion({"content": "5"})

    malformed = {"id": "call_1", "type": "function", "function": {"name": "add"}}
    malformed["function"]["arguments"] = '{"a": 2, b: 3}'
    server = FakeServer(
        completion({"tool_calls": [malformed]}, finish_reason="tool_calls"), as_llama_cpp
    )
    result = await Adder(model=make_model(server), max_retries=0).run("2+3?")
    assert result.output == "5"
    assert result.messages[1].tool_calls[0].arguments == '{"a": 2, b: 3}'  # as written
    assert result.messages[2].tool_results[0].is_error
    sent = server.bodies[1]["messages"][-2]["tool_calls"][0]["function"]
    assert sent == {"name": "add", "arguments": "{}"}


async def test_gemini_thought_signatures_go_back_with_their_tool_calls(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Gemini refuses a request whose tool calls lost the thought signatures it sent with
    them: each is kept before its call and goes back on it, in later turns too."""
    server = FakeServer(
        completion(
            {"tool_calls": [signed_call("c1", 1, "sig-A"), signed_call("c2", 2, None)]},
            finish_reason="tool_calls",
        ),
        completion({"tool_calls": [signed_call("c3", 3, "sig-B")]}, finish_reason="tool_calls"),
        completion({"content": "done"}),
        completion({"content": "again"}),
    )
    agent = Adder(model=make_model(server, base_url=GEMINI, context_window=1_000_000))
    result = await agent.run("add")
    assert result.messages[1].content == (
        ReasoningPart("", "sig-A", "google"),
        ToolCall("c1", "add", {"a": 1, "b": 1}),
        ToolCall("c2", "add", {"a": 2, "b": 1}),
    )
    sent = server.bodies[2]["messages"]
    assert [call.get("extra_content") for call in sent[1]["tool_calls"]] == [
        {"google": {"thought_signature": "sig-A"}},
        None,
    ]
    assert sent[4]["tool_calls"][0]["extra_content"] == {"google": {"thought_signature": "sig-B"}}
    assert "reasoning_content" not in sent[1]
    await agent.run("more", history=result.messages)
    later = server.bodies[3]["messages"]
    assert later[1]["tool_calls"][0]["extra_content"] == {"google": {"thought_signature": "sig-A"}}


async def test_streamed_gemini_thought_signatures_are_kept(
    make_model: Callable[..., OpenAIModel],
) -> None:
    first = signed_call("c1", 1, "sig-A")
    server = FakeServer(
        event_stream(
            openai_sse(
                chunk({"tool_calls": [{"index": 0, **first}]}),
                chunk({"tool_calls": [signed_call("c2", 2, None)]}, finish_reason="tool_calls"),
            )
        )
    )
    model = make_model(server, base_url=GEMINI, context_window=1_000_000)
    events = [e async for e in model.stream(ModelRequest([Message.user("add")], [ADD]))]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.content == (
        ReasoningPart("", "sig-A", "google"),
        ToolCall("c1", "add", {"a": 1, "b": 1}),
        ToolCall("c2", "add", {"a": 2, "b": 1}),
    )


OPENROUTER = "https://openrouter.ai/api/v1"
GEMINI_DETAILS = [
    {"type": "reasoning.text", "text": "Add them.", "format": "google-gemini-v1", "index": 0},
    {"type": "reasoning.encrypted", "data": "sig-A", "id": "c1", "format": "google-gemini-v1"},
]
"""The ``reasoning_details`` OpenRouter sends with a Gemini 3 tool call: its thought
signature, which it wants back (else "Gemini models require OpenRouter reasoning details
to be preserved in each request")."""


async def test_openrouter_reasoning_details_go_back_with_their_answer(
    make_model: Callable[..., OpenAIModel],
) -> None:
    call = signed_call("c1", 1, None)
    server = FakeServer(
        completion(
            {"reasoning": "Add them.", "reasoning_details": GEMINI_DETAILS, "tool_calls": [call]},
            finish_reason="stop",  # as OpenRouter ends Gemini 3's tool calls
        ),
        completion({"content": "done"}),
        completion({"content": "again"}),
    )
    agent = Adder(model=make_model(server, base_url=OPENROUTER, context_window=1_000_000))
    result = await agent.run("add")
    assert result.messages[1].content == (
        ReasoningPart("Add them.", None, "openai"),
        ReasoningPart("", json.dumps(GEMINI_DETAILS), "openrouter"),
        ToolCall("c1", "add", {"a": 1, "b": 1}),
    )
    assert server.bodies[1]["messages"][1]["reasoning_details"] == GEMINI_DETAILS
    await agent.run("more", history=result.messages)
    assert server.bodies[2]["messages"][1]["reasoning_details"] == GEMINI_DETAILS


async def test_streamed_openrouter_reasoning_details_are_joined_by_block(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Claude's thinking through OpenRouter comes as pieces of one ``reasoning.text``
    block, its signature last; a block of another index starts another item."""

    def piece(index: int, **fields: Any) -> dict[str, Any]:
        detail = {"type": "reasoning.text", "format": "anthropic-claude-v1", "index": index}
        return {"reasoning_details": [{**detail, **fields}]}

    server = FakeServer(
        event_stream(
            openai_sse(
                chunk({"reasoning": "Add ", **piece(0, text="Add ")}),
                chunk({"reasoning": "them.", **piece(0, text="them.")}),
                chunk(piece(0, text="", signature="sig-0")),
                chunk(piece(1, text="Then", signature="sig-1")),
                chunk({"tool_calls": [{"index": 0, **signed_call("c1", 1, None)}]}),
                chunk({}, finish_reason="tool_calls"),
            )
        )
    )
    model = make_model(server, base_url=OPENROUTER, context_window=1_000_000)
    events = [e async for e in model.stream(ModelRequest([Message.user("add")], [ADD]))]
    done = events[-1]
    assert isinstance(done, StreamDone)
    [kept] = [part for part in done.response.message.reasoning if part.provider == "openrouter"]
    assert kept.signature is not None
    assert json.loads(kept.signature) == [
        {"type": "reasoning.text", "format": "anthropic-claude-v1", "index": 0}
        | {"text": "Add them.", "signature": "sig-0"},
        {"type": "reasoning.text", "format": "anthropic-claude-v1", "index": 1}
        | {"text": "Then", "signature": "sig-1"},
    ]


async def test_streamed_openrouter_items_without_an_index_stay_apart(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Two items of one type without an index (Gemini's signatures, by call id) are two
    items, streamed as answered whole (the second was merged into the first, its
    signature lost)."""
    details = [
        GEMINI_DETAILS[1],
        {"type": "reasoning.encrypted", "data": "sig-B", "id": "c2", "format": "google-gemini-v1"},
    ]
    calls = [signed_call("c1", 1, None), signed_call("c2", 2, None)]
    streamed = openai_sse(
        chunk({"reasoning_details": details[:1]}),
        chunk({"tool_calls": [{"index": 0, **calls[0]}]}),
        chunk({"reasoning_details": details[1:]}),
        chunk({"tool_calls": [{"index": 1, **calls[1]}]}),
        chunk({}, finish_reason="tool_calls"),
    )
    server = FakeServer(
        completion({"reasoning_details": details, "tool_calls": calls}, "tool_calls"),
        event_stream(streamed),
    )
    model = make_model(server, base_url=OPENROUTER, context_window=1_000_000)
    request = ModelRequest([Message.user("add")], [ADD])
    whole = (await model.respond(request)).message
    done = [event async for event in model.stream(request)][-1]
    assert isinstance(done, StreamDone)
    kept = ReasoningPart("", json.dumps(details), "openrouter")
    assert kept in whole.reasoning
    assert kept in done.response.message.reasoning


@pytest.mark.parametrize(
    "kept",
    [
        ReasoningPart("", "sig-A", "google"),
        ReasoningPart("", json.dumps(GEMINI_DETAILS), "openrouter"),
    ],
    ids=["thought-signature", "reasoning-details"],
)
async def test_signed_reasoning_of_other_servers_never_goes_to_openai_s_own_api(
    make_model: Callable[..., OpenAIModel], kept: ReasoningPart
) -> None:
    """A history written through Gemini or OpenRouter, sent to OpenAI's API: neither the
    call's ``extra_content`` nor the message's ``reasoning_details``."""
    server = FakeServer(completion({"content": "ok"}))
    history = [
        Message.user("add"),
        Message("assistant", [kept, ToolCall("c1", "add", {"a": 1, "b": 1})]),
        Message.tool("c1", "2"),
    ]
    await make_model(server).respond(ModelRequest(history, [ADD]))
    sent = server.bodies[0]["messages"][1]
    assert "reasoning_details" not in sent
    assert "extra_content" not in sent["tool_calls"][0]


async def test_streamed_reasoning_arrives_as_reasoning_chunks(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Streamed reasoning_content deltas are reasoning chunks, apart from the text."""
    server = FakeServer(
        event_stream(
            openai_sse(
                chunk({"role": "assistant", "reasoning_content": "Hmm, "}),
                chunk({"reasoning_content": "greet."}),
                chunk({"content": "Hello"}, finish_reason="stop"),
            )
        )
    )
    model = make_model(server)
    events = [event async for event in model.stream(ModelRequest([Message.user("hi")]))]
    assert events[:-1] == [ReasoningChunk("Hmm, "), ReasoningChunk("greet."), TextChunk("Hello")]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.content == (
        ReasoningPart("Hmm, greet.", None, "openai"),
        TextPart("Hello"),
    )
    assert done.response.message.text == "Hello"


MISTRAL_CONTENT = [
    {"type": "thinking", "thinking": [{"type": "text", "text": "The capital. "}]},
    {"type": "text", "text": "Paris."},
]
"""An answer's content as Mistral's reasoning models send it: a list of chunks."""


async def test_content_sent_as_a_list_of_chunks_is_read_as_text_and_reasoning(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Mistral's reasoning models send ``content`` as chunks, whole or streamed: text
    chunks are the answer, thinking chunks its reasoning."""
    server = FakeServer(
        completion({"content": MISTRAL_CONTENT}),
        event_stream(
            openai_sse(
                chunk({"role": "assistant", "content": MISTRAL_CONTENT[:1]}),
                chunk({"content": [{"type": "text", "text": "Par"}]}),
                chunk({"content": "is."}, finish_reason="stop"),
            )
        ),
    )
    model = make_model(server)
    request = ModelRequest([Message.user("Capital of France?")])
    answered = await model.respond(request)
    events = [event async for event in model.stream(request)]
    assert events[:-1] == [ReasoningChunk("The capital. "), TextChunk("Par"), TextChunk("is.")]
    done = events[-1]
    assert isinstance(done, StreamDone)
    expected = (ReasoningPart("The capital. ", None, "openai"), TextPart("Paris."))
    assert answered.message.content == expected == done.response.message.content


async def test_a_legacy_function_call_is_a_protocol_error(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """A ``function_call`` (the API's form before tool calls) cannot be answered: an
    error saying so, streamed or not, not an empty answer that says it stopped to use a
    tool."""
    legacy = {"name": "add", "arguments": '{"a": 2}'}
    server = FakeServer(
        completion({"function_call": legacy}, finish_reason="function_call"),
        event_stream(openai_sse(chunk({"function_call": legacy}, "function_call"))),
    )
    model = make_model(server)
    request = ModelRequest([Message.user("add")])
    with pytest.raises(ProtocolError, match="legacy function_call"):
        await model.respond(request)
    with pytest.raises(ProtocolError, match="legacy function_call"):
        async for _ in model.stream(request):
            pass


async def test_a_legacy_function_call_beside_tool_calls_is_left_alike(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """With tool calls beside it, a ``function_call`` is left, streamed or not: the tool
    calls are the answer."""
    legacy = {"name": "add", "arguments": '{"a": 2}'}
    call = {
        "index": 0,
        "id": "c1",
        "type": "function",
        "function": {"name": "add", "arguments": '{"a": 1}'},
    }
    server = FakeServer(
        completion({"function_call": legacy, "tool_calls": [call]}, finish_reason="tool_calls"),
        event_stream(
            openai_sse(chunk({"function_call": legacy, "tool_calls": [call]}, "tool_calls"))
        ),
    )
    model = make_model(server)
    request = ModelRequest([Message.user("add")])
    answered = await model.respond(request)
    events = [event async for event in model.stream(request)]
    done = events[-1]
    assert isinstance(done, StreamDone)
    expected = (ToolCall("c1", "add", {"a": 1}),)
    assert answered.message.tool_calls == expected == done.response.message.tool_calls


async def test_streamed_arguments_sent_whole_as_an_object_are_read(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Some servers send a call's arguments as an object rather than JSON text, streamed
    or not: both read them alike."""
    call = {"index": 0, "id": "c1", "type": "function"}
    function = {"name": "add", "arguments": {"a": 2, "b": 3}}
    server = FakeServer(
        event_stream(
            openai_sse(chunk({"tool_calls": [{**call, "function": function}]}, "tool_calls"))
        )
    )
    events = [
        event async for event in make_model(server).stream(ModelRequest([Message.user("add")]))
    ]
    done = events[-1]
    assert isinstance(done, StreamDone)
    assert done.response.message.tool_calls == (ToolCall("c1", "add", {"a": 2, "b": 3}),)


@attrs.frozen
class Verdict:
    label: Literal["spam", "ham"]
    score: float


@attrs.frozen
class Rating:
    stars: Annotated[int, at.Ge(1), at.Le(5)]
    why: Annotated[str, at.MaxLen(40)]
    tone: str = "neutral"


async def test_a_strict_json_schema_leaves_out_the_bounds_the_answer_is_checked_against(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """Strict mode refuses bounds (``maxLength``) and defaults: the strict schema is sent
    without them, and an answer out of the bounds gets the repair turn."""

    class Rater(Agent):
        output_type = Rating

    server = FakeServer(
        completion({"content": '{"stars": 9, "why": "great"}'}),
        completion({"content": '{"stars": 5, "why": "great"}'}),
    )
    result = await Rater(model=make_model(server)).run("rate it")
    assert result.output == Rating(5, "great")
    sent = server.bodies[0]["response_format"]["json_schema"]
    assert sent["strict"] is True
    assert sent["schema"]["properties"] == {
        "stars": {"type": "integer"},
        "why": {"type": "string"},
        "tone": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    }
    assert "stars: expected a number <= 5, got 9" in json.dumps(server.bodies[1]["messages"])


async def test_an_output_type_is_asked_with_a_strict_json_schema(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """A typed run sends its schema as a strict json_schema response_format, and the JSON
    answer comes back as the typed value; a schema strict decoding cannot take is sent
    with strict off."""

    class Classifier(Agent):
        output_type = Verdict

    server = FakeServer(
        completion({"content": '{"label": "ham", "score": 0.25}'}),
        completion({"content": '{"result": {"a": 1}}'}),
    )
    model = make_model(server)
    result = await Classifier(model=model).run("classify: hello")
    assert result.output == Verdict("ham", 0.25)
    assert server.bodies[0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "Verdict",
            "schema": {
                "type": "object",
                "properties": {
                    "label": {"type": "string", "enum": ["spam", "ham"]},
                    "score": {"type": "number"},
                },
                "required": ["label", "score"],
                "additionalProperties": False,
            },
            "strict": True,
        },
    }
    assert "tools" not in server.bodies[0]
    counts = await Classifier(model=model).run("count", output_type=dict[str, int])
    assert counts.output == {"a": 1}
    assert server.bodies[1]["response_format"]["json_schema"]["strict"] is False


@pytest.mark.parametrize(
    ("name", "base_url", "native"),
    [
        ("gpt-3.5-turbo", "https://api.openai.com/v1", False),
        ("gpt-4", "https://api.openai.com/v1", False),
        ("gpt-4-turbo-2024-04-09", "https://api.openai.com/v1", False),
        ("gpt-4o-2024-05-13", "https://api.openai.com/v1", False),
        ("ft:gpt-3.5-turbo-0125:org::abc", "https://api.openai.com/v1", False),
        ("gpt-4o", "https://api.openai.com/v1", True),
        ("gpt-4.1-mini", "https://api.openai.com/v1", True),
        ("o1", "https://api.openai.com/v1", True),
        ("gpt-3.5-turbo", "http://127.0.0.1:8080/v1", True),
    ],
)
async def test_a_model_without_structured_outputs_takes_the_final_result_tool(
    make_model: Callable[..., OpenAIModel], name: str, base_url: str, native: bool
) -> None:
    """OpenAI refuses a json_schema response format on a model without structured
    outputs: ``auto`` asks such a model through the final-result tool and ``native`` fails
    before any request. Another server may serve any model under such a name."""
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "final_result", "arguments": '{"label": "ham", "score": 0.5}'},
    }
    server = FakeServer(
        completion({"content": '{"label": "ham", "score": 0.5}'})
        if native
        else completion({"tool_calls": [call]}, finish_reason="tool_calls")
    )
    model = make_model(server, base_url, name, context_window=128_000)  # no probe
    result = await Agent(model=model).run("classify: hello", output_type=Verdict)
    assert result.output == Verdict("ham", 0.5)
    assert ("response_format" in server.bodies[0]) is native
    if not native:
        with pytest.raises(ConfigurationError, match="not available on this model"):
            await Agent(model=model, output_strategy="native").run("go", output_type=Verdict)
        assert len(server.requests) == 1


@attrs.frozen
class Ticket:
    title: str
    priority: Literal["low", "high"] = "low"
    assignee: str | None = None


async def test_optional_fields_are_sent_strict_as_nullable_and_null_means_the_default(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """A type with defaults still gets a strict schema: every property required, the
    optional ones nullable; null for a field whose type takes no null is its default."""
    server = FakeServer(
        completion({"content": '{"title": "Fix", "priority": null, "assignee": null}'})
    )
    result = await Agent(model=make_model(server)).run("file it", output_type=Ticket)
    assert result.output == Ticket("Fix", "low", None)
    json_schema = server.bodies[0]["response_format"]["json_schema"]
    assert json_schema["strict"] is True
    assert json_schema["schema"] == {
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "priority": {"anyOf": [{"type": "string", "enum": ["low", "high"]}, {"type": "null"}]},
            "assignee": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        },
        "required": ["title", "priority", "assignee"],
        "additionalProperties": False,
    }


async def test_the_tool_strategy_sends_a_required_final_result_tool(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """With the final-result tool, the request carries it and tool_choice "required"."""

    class Classifier(Agent):
        output_type = Verdict
        output_strategy = "tool"

    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "final_result", "arguments": '{"label": "spam", "score": 1}'},
    }
    server = FakeServer(completion({"tool_calls": [call]}, finish_reason="tool_calls"))
    result = await Classifier(model=make_model(server)).run("classify: WIN $$$")
    assert result.output == Verdict("spam", 1.0)
    [body] = server.bodies
    assert [tool["function"]["name"] for tool in body["tools"]] == ["final_result"]
    assert body["tool_choice"] == "required"
    assert "response_format" not in body


@pytest.mark.parametrize("opt_in", [None, "debug"])
async def test_request_bodies_reach_debug_logs_only_with_the_sdks_opt_in(
    make_model: Callable[..., OpenAIModel],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    opt_in: str | None,
) -> None:
    """openai 1.x logs each request's options at DEBUG on ``openai._base_client`` (the
    server below logs them so, as such an SDK would): without OPENAI_LOG=debug only the
    method and URL remain."""
    if opt_in is None:
        monkeypatch.delenv("OPENAI_LOG", raising=False)
    else:
        monkeypatch.setenv("OPENAI_LOG", opt_in)
    caplog.set_level(logging.DEBUG)

    def answer(request: httpx2.Request) -> httpx2.Response:
        options = {"method": "post", "url": "/chat/completions"}
        options["json_data"] = json.loads(request.content)
        logging.getLogger("openai._base_client").debug("Request options: %s", options)
        return completion({"content": "hello"})

    server = FakeServer(answer)
    await Agent(model=make_model(server), instructions="SECRET-INSTRUCTIONS").run("SECRET-Q")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "/chat/completions" in logged
    assert ("SECRET-INSTRUCTIONS" in logged and "SECRET-Q" in logged) == (opt_in == "debug")


async def test_a_base_urls_credentials_stay_out_of_the_http_logs(
    make_model: Callable[..., OpenAIModel], caplog: pytest.LogCaptureFixture
) -> None:
    """The HTTP client logs each request's URL at INFO: a proxy's user and password, or
    a key in the query, are taken out of it."""
    caplog.set_level(logging.DEBUG)
    server = FakeServer(completion({"content": "hello"}))
    base_url = "https://proxyuser:SECRET-PW@proxy.example:8443/v1?key=SECRET-KEY"
    await Agent(model=make_model(server, base_url, context_window=8_000)).run("hi")
    assert str(server.requests[0].url).startswith("https://proxyuser:SECRET-PW@proxy.example")
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "POST https://proxy.example:8443/v1/" in logged
    assert "SECRET" not in logged and "proxyuser" not in logged


async def test_a_base_urls_credentials_stay_out_of_a_logged_status_errors_traceback(
    make_model: Callable[..., OpenAIModel], caplog: pytest.LogCaptureFixture
) -> None:
    """openai 1.x and 2.x log each error answer at DEBUG on ``openai._base_client`` with
    the ``HTTPStatusError`` as ``exc_info`` (the server below logs it so, as such an SDK
    would): its message names the whole URL, which the traceback must not show."""
    caplog.set_level(logging.DEBUG)

    def answer(request: httpx2.Request) -> httpx2.Response:
        response = httpx2.Response(500, request=request, json={"error": {"message": "down"}})
        try:
            response.raise_for_status()
        except httpx2.HTTPStatusError:
            logging.getLogger("openai._base_client").debug(
                "Encountered httpx.HTTPStatusError", exc_info=True
            )
        return response

    server = FakeServer(answer)
    base_url = "https://proxyuser:SECRET-PW@proxy.example:8443/v1?key=SECRET-KEY"
    agent = Agent(model=make_model(server, base_url, context_window=8_000), max_retries=0)
    with pytest.raises(ProviderUnavailableError):
        await agent.run("hi")
    assert "HTTPStatusError: Server error '500 Internal Server Error'" in caplog.text
    assert "https://proxy.example:8443/v1" in caplog.text
    assert "SECRET" not in caplog.text and "proxyuser" not in caplog.text


@pytest.mark.parametrize(
    "url",
    [
        "localhost:9999/api",
        "ftp://host/v1",
        "http:///v1",
        "http://127.0.0.1:99999/v1",
        "http://127.0.0.1:0/v1",
        "http://host:port/v1",
    ],
)
def test_a_base_url_without_an_http_scheme_and_host_fails_when_made(
    monkeypatch: pytest.MonkeyPatch, url: str
) -> None:
    """Not a transient error retried at each call: the URL is named wrong, once, without
    showing it (it may hold a key)."""
    message = r"base_url \(or OPENAI_BASE_URL\) must be an http:// or https:// URL with a host"
    with pytest.raises(ConfigurationError, match=message) as caught:
        OpenAIModel("m", base_url=url, api_key="sk-test")
    assert url not in str(caught.value)
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    with pytest.raises(ConfigurationError, match=message):
        OpenAIModel("m", api_key="sk-test")


@pytest.mark.parametrize("key", ["sk-SECRET\n", "sk-SECRET\r", "sk-SECRET ", "sk-SECRET\u2019"])
def test_an_api_key_no_header_can_carry_fails_when_made(
    monkeypatch: pytest.MonkeyPatch, key: str
) -> None:
    """A key read from a file with its line break failed every call as if the server could
    not be reached, and the HTTP library's error, logged at DEBUG, quoted the key: it is
    named wrong once, without showing it."""
    message = r"api_key \(or OPENAI_API_KEY\) must be printable ASCII"
    with pytest.raises(ConfigurationError, match=message) as caught:
        OpenAIModel("m", base_url="http://127.0.0.1:8080/v1", api_key=key)
    assert "SECRET" not in str(caught.value)
    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(ConfigurationError, match=message):
        OpenAIModel("m")


def test_model_strings_need_a_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        resolve("openai:gpt-4o-mini")
    with pytest.raises(ConfigurationError, match="needs a model name"):
        from_model_string(None)


def test_model_strings_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-from-env")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    model = resolve("openai:gpt-4o-mini")
    assert isinstance(model, OpenAIModel)
    assert (model.name, model.provider, model.context_window) == (
        "gpt-4o-mini",
        "openai",
        128_000,
    )
    monkeypatch.delenv("OPENAI_API_KEY")
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8000/v1")
    assert resolve("openai:qwen").name == "qwen"  # a custom server needs no key


def test_a_missing_sdk_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(ConfigurationError, match=r"pip install 'littleghost\[openai\]'"):
        OpenAIModel("gpt-4o-mini", api_key="sk-test")


async def test_an_agent_reports_a_missing_key_when_it_first_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)

    class Support(Agent):
        model = "openai:gpt-4o-mini"

    agent = Support()
    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY"):
        await agent.run("hi")


def test_bad_arguments_are_configuration_errors() -> None:
    with pytest.raises(ConfigurationError, match="model"):
        OpenAIModel("", api_key="k")
    with pytest.raises(ConfigurationError, match="context_window"):
        OpenAIModel("m", api_key="k", context_window=0)


OPENROUTER = "https://openrouter.ai/api/v1"
"""A server other than OpenAI's: its models are given a window, so no ``GET /models``."""


def failed_completion(
    choice_error: dict[str, Any] | None = None, reason: str = "error"
) -> httpx2.Response:
    """A completion OpenRouter ends with ``finish_reason: "error"`` (an upstream failure),
    or another server with its own ``reason`` for one."""
    body = {
        "id": "gen-1",
        "object": "chat.completion",
        "created": 1,
        "model": "openai/gpt-4o-mini",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "The answer is"},
                "finish_reason": reason,
                "native_finish_reason": reason,
                **({} if choice_error is None else {"error": choice_error}),
            }
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15},
    }
    return httpx2.Response(200, json=body)


async def test_an_html_page_sent_with_a_200_is_transient(
    make_model: Callable[..., OpenAIModel],
) -> None:
    """A proxy's error page with a 200 is a body that is not JSON (it was a ProtocolError,
    never retried): the run retries."""
    page = httpx2.Response(
        200, text="<html>Bad gateway</html>", headers={"content-type": "text/html"}
    )
    server = FakeServer(page, completion({"content": "ok"}))
    assert (await Agent(model=make_model(server)).run("hi")).output == "ok"


async def test_a_choice_without_a_message_is_a_protocol_error(
    make_model: Callable[..., OpenAIModel],
) -> None:
    body = {"id": "c", "object": "chat.completion", "created": 1, "model": "m"}
    answer = httpx2.Response(200, json={**body, "choices": [{"index": 0, "finish_reason": "stop"}]})
    with pytest.raises(ProtocolError, match="has no message"):
        await make_model(FakeServer(answer)).respond(ModelRequest([Message.user("hi")]))


class TestFinishReasonError:
    """OpenRouter ends an answer its upstream provider failed with finish_reason "error"."""

    async def test_a_completion_ending_in_error_is_retried_not_stored(
        self, make_model: Callable[..., OpenAIModel]
    ) -> None:
        """Without an error object it is a transient ProviderUnavailableError: the run
        retries, and the failed answer never reaches the log."""
        server = FakeServer(failed_completion(), completion({"content": "The answer is 42."}))
        result = await Agent(
            model=make_model(server, base_url=OPENROUTER, context_window=8192)
        ).run("hi")
        assert result.output == "The answer is 42."
        assistant = [m.text for m in result.messages if m.role == "assistant"]
        assert assistant == ["The answer is 42."]
        assert [request.url.path for request in server.requests] == ["/api/v1/chat/completions"] * 2

    @pytest.mark.parametrize("reason", ["abort", "insufficient_system_resource"])
    async def test_other_servers_failures_to_finish_are_retried_too(
        self, make_model: Callable[..., OpenAIModel], reason: str
    ) -> None:
        """vLLM's ``abort`` and DeepSeek's ``insufficient_system_resource``, streamed or
        not: the cut answer was taken as complete; the run retries."""
        failed = openai_sse(chunk({"content": "The answer is "}), chunk({}, finish_reason=reason))
        whole = openai_sse(chunk({"content": "The answer is 42."}, finish_reason="stop"))
        server = FakeServer(event_stream(failed), event_stream(whole))
        async with Agent(model=make_model(server)).stream("hi") as events:
            async for _ in events:
                pass
        assert events.result.output == "The answer is 42."
        server = FakeServer(
            failed_completion(reason=reason), completion({"content": "The answer is 42."})
        )
        assert (await Agent(model=make_model(server)).run("hi")).output == "The answer is 42."

    async def test_without_retries_the_error_is_raised(
        self, make_model: Callable[..., OpenAIModel]
    ) -> None:
        """The error names the finish reason and carries a code of its own."""
        model = make_model(
            FakeServer(failed_completion()), base_url=OPENROUTER, context_window=8192
        )
        with pytest.raises(ProviderUnavailableError, match="finish_reason 'error'") as caught:
            await model.respond(ModelRequest([Message.user("hi")]))
        assert (caught.value.code, caught.value.provider) == ("finish_reason_error", "openai")

    async def test_an_error_object_on_the_choice_is_classified(
        self, make_model: Callable[..., OpenAIModel]
    ) -> None:
        """An error the choice carries decides the class, as any error body does."""
        sent = {"code": 400, "message": "This endpoint's maximum context length is 8192 tokens."}
        model = make_model(
            FakeServer(failed_completion(sent)), base_url=OPENROUTER, context_window=8192
        )
        with pytest.raises(ContextWindowOverflowError) as caught:
            await model.respond(ModelRequest([Message.user("hi")]))
        assert caught.value.context_window == 8192

    async def test_a_stream_ending_in_error_is_retried_and_only_the_retry_is_kept(
        self, make_model: Callable[..., OpenAIModel]
    ) -> None:
        """A streamed choice that ends with finish_reason "error" (and no error object)
        fails the attempt as transient; the retry's answer is the one kept."""
        failed = openai_sse(chunk({"content": "The answer is "}), chunk({}, finish_reason="error"))
        whole = openai_sse(chunk({"content": "The answer is 42."}, finish_reason="stop"))
        server = FakeServer(event_stream(failed), event_stream(whole))
        async with Agent(model=make_model(server, base_url=OPENROUTER, context_window=8192)).stream(
            "hi"
        ) as events:
            received = [event async for event in events]
        assert ModelCallRetried(1, "ProviderUnavailableError") in received
        assert events.result.output == "The answer is 42."
        assistant = [m.text for m in events.messages if m.role == "assistant"]
        assert assistant == ["The answer is 42."]

    async def test_a_streamed_choice_error_is_classified(
        self, make_model: Callable[..., OpenAIModel]
    ) -> None:
        """A choice-level error object in a stream is classified like a top-level one."""
        failed = openai_sse(
            chunk({"content": "par"}),
            {
                **chunk({}, finish_reason="error"),
                "choices": [
                    {
                        "index": 0,
                        "delta": {},
                        "finish_reason": "error",
                        "error": {"code": 429, "message": "Provider rate limit reached"},
                    }
                ],
            },
        )
        model = make_model(
            FakeServer(event_stream(failed)), base_url=OPENROUTER, context_window=8192
        )
        with pytest.raises(RateLimitError):
            async for _ in model.stream(ModelRequest([Message.user("hi")])):
                pass


class TestChatSpanMetadata:
    """Chat spans carry the response's id and model and the server's address and port."""

    async def test_a_completion(self, make_model: Callable[..., OpenAIModel], spans: Spans) -> None:
        """From a completion: gen_ai.response.id and .model, server.address and .port from
        the base URL without its credentials, path or query; no gen_ai.request.stream."""
        answer = completion({"content": "ok"}, id="chatcmpl-abc", model="gpt-4o-mini-2024-07-18")
        url = "https://user:S3CR3T@gateway.example.com:8443/v1?api-key=S3CR3T"
        model = make_model(FakeServer(answer), base_url=url, context_window=128_000)
        await Agent(model=model).run("hi")
        chat = dict(spans.one("chat ").attributes or {})
        assert chat["gen_ai.response.id"] == "chatcmpl-abc"
        assert chat["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"
        assert (chat["server.address"], chat["server.port"]) == ("gateway.example.com", 8443)
        assert "gen_ai.request.stream" not in chat
        assert not any("S3CR3T" in str(value) for value in chat.values())

    async def test_a_stream(self, make_model: Callable[..., OpenAIModel], spans: Spans) -> None:
        """From a stream: the chunks' id and model, gen_ai.request.stream = true, and the
        scheme's port when the URL names none."""
        body = openai_sse(
            chunk({"content": "o"}, id="chatcmpl-xyz", model="gpt-4o-mini-2024-07-18"),
            chunk({"content": "k"}, finish_reason="stop", id="chatcmpl-xyz"),
        )
        model = make_model(FakeServer(event_stream(body)))
        async with Agent(model=model).stream("hi") as events:
            async for _ in events:
                pass
        assert events.result.output == "ok"
        chat = dict(spans.one("chat ").attributes or {})
        assert chat["gen_ai.request.stream"] is True
        assert chat["gen_ai.response.id"] == "chatcmpl-xyz"
        assert chat["gen_ai.response.model"] == "gpt-4o-mini-2024-07-18"
        assert (chat["server.address"], chat["server.port"]) == ("api.openai.com", 443)

    async def test_a_server_that_reports_no_id_or_model(
        self, make_model: Callable[..., OpenAIModel], spans: Spans
    ) -> None:
        """An id or model that is missing or not a string is left out, not a failure."""
        answer = completion({"content": "ok"}, id=None, model=7)
        model = make_model(FakeServer(answer), base_url="http://127.0.0.1:8080/v1")
        response = await model.respond(ModelRequest([Message.user("hi")]))
        assert (response.response_id, response.response_model) == (None, None)
        assert (model.server_address, model.server_port) == ("127.0.0.1", 8080)

    async def test_the_log_keeps_only_the_message(
        self, make_model: Callable[..., OpenAIModel]
    ) -> None:
        """The response's id and model stay out of the stored conversation."""
        store = InMemorySessionStore()
        answer = completion({"content": "ok"}, id="chatcmpl-abc")
        agent = Agent(model=make_model(FakeServer(answer)), session_store=store)
        result = await agent.run("hi", session_id="s")
        [stored] = [m for m in await store.load("s") if m.role == "assistant"]
        assert stored == result.messages[-1]
        assert (stored.text, dict(stored.metadata)) == ("ok", {})
        assert "chatcmpl-abc" not in repr(await store.load("s"))
