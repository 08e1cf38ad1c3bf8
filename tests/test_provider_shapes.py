"""Malformed provider answers, field by field, through the real SDKs over a mock HTTP
transport: each either reads as documented or fails with a littleghost error that names
the field and its type (never its content) -- never a bare TypeError, KeyError, ..."""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable, Iterator
from contextlib import aclosing
from typing import TYPE_CHECKING, Any

import httpx2
import pytest

from littleghost import Agent, tool
from littleghost.errors import (
    InvalidRequestError,
    LittleGhostError,
    ProtocolError,
    ProviderError,
    ProviderUnavailableError,
)
from littleghost.messages import ImagePart, Message
from littleghost.models import ModelRequest, ModelResponse, ToolSpec
from littleghost.models import answer_json as answer_json_module
from littleghost.models.anthropic import LONGEST_UNSTREAMED
from littleghost.models.streaming import StreamDone, TextChunk, ToolCallChunk
from littleghost.sessions import InMemorySessionStore

from .sdk_bodies import (
    FakeServer,
    SDKClients,
    anthropic_sse,
    chunk,
    completion,
    completion_body,
    event_stream,
    finish,
    json_answer,
    message_body,
    message_start,
    openai_sse,
    text_block,
    thinking_block,
    tool_use_block,
)

if TYPE_CHECKING:
    from conftest import Spans

pytestmark = pytest.mark.anyio

SECRET = "SECRET-WRONG"
"""The string a field is replaced with: no error may show it."""
WRONG: dict[str, object] = {
    "missing": ...,
    "null": None,
    "int": 7,
    "negative": -3,
    "huge": 10**30,
    "float": 1.5,
    "str": SECRET,
    "empty str": "",
    "bool": True,
    "list": [SECRET],
    "empty list": [],
    "object": {"k": SECRET},
    "empty object": {},
}
ADD = ToolSpec("add", "Add.", {"type": "object", "properties": {"a": {"type": "integer"}}})
REQUEST = ModelRequest([Message.user("hi")], [ADD], {})

ANTHROPIC_MESSAGE = message_body(
    [
        {"type": "thinking", "thinking": "SECRET-THOUGHT", "signature": "SECRET-SIG"},
        {"type": "text", "text": "SECRET-ANSWER"},
        {"type": "tool_use", "id": "toolu_1", "name": "add", "input": {"a": 1}},
    ],
    "tool_use",
    {
        "input_tokens": 25,
        "output_tokens": 6,
        "cache_read_input_tokens": 3,
        "cache_creation_input_tokens": 2,
    },
)
ANTHROPIC_EVENTS: list[Any] = [
    message_start(),
    *thinking_block(0, "SECRET-THOUGHT", signature="SECRET-SIG"),
    *text_block(1, "SECRET-ANSWER"),
    *tool_use_block(2, "toolu_1", "add", '{"a": 1}'),
    *finish("tool_use", 9),
]
OPENAI_COMPLETION = completion_body(
    {
        "content": "SECRET-ANSWER",
        "reasoning_content": "SECRET-THOUGHT",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "add", "arguments": '{"a": 1}'},
            }
        ],
    },
    "tool_calls",
    {
        "prompt_tokens": 12,
        "completion_tokens": 3,
        "total_tokens": 15,
        "prompt_tokens_details": {"cached_tokens": 2},
        "completion_tokens_details": {"reasoning_tokens": 1},
    },
)
OPENAI_CHUNKS: list[Any] = [
    chunk({"role": "assistant", "content": ""}),
    chunk({"reasoning_content": "SECRET-THOUGHT"}),
    chunk({"content": "SECRET-ANSWER"}),
    chunk(
        {
            "tool_calls": [
                {"index": 0, "id": "call_1", "type": "function", "function": {"name": "add"}}
            ]
        }
    ),
    chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": 1}'}}]}),
    chunk({}, "tool_calls"),
    chunk(usage={"prompt_tokens": 12, "completion_tokens": 3, "total_tokens": 15}),
]


def _paths(value: object, at: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into ``value``, itself first."""
    yield at
    items = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for key, inner in items:
        yield from _paths(inner, (*at, key))


def _mutated(value: Any, path: tuple[Any, ...], new: object) -> Any:
    """``value`` with the field at ``path`` replaced by ``new`` (``...``: left out)."""
    if not path:
        return new
    value = copy.deepcopy(value)
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    if new is ...:
        del parent[path[-1]]
    else:
        parent[path[-1]] = new
    return value


def _bodies(base: Any) -> Iterator[tuple[str, Any]]:
    """``base`` with each of its fields missing, null and of every wrong JSON type."""
    for path in _paths(base):
        for name, new in WRONG.items():
            if path or new is not ...:
                yield f"{path} {name}", _mutated(base, path, new)


def _streams(events: list[Any]) -> Iterator[tuple[str, list[Any]]]:
    """``events`` with each event's fields mutated (``_bodies``), and each event left out,
    sent twice, swapped with the next, or the last sent."""
    for index, event in enumerate(events):
        for what, mutated in _bodies(event):
            yield f"event {index}: {what}", [*events[:index], mutated, *events[index + 1 :]]
        yield f"event {index} left out", events[:index] + events[index + 1 :]
        yield f"event {index} twice", events[: index + 1] + events[index:]
        yield (
            f"event {index} swapped",
            [*events[:index], *events[index + 1 : index + 2], event, *events[index + 2 :]],
        )
        yield f"cut after event {index}", events[: index + 1]


Make = Callable[[Callable[[httpx2.Request], httpx2.Response]], Any]


@pytest.fixture
def anthropic_model(sdk_clients: SDKClients) -> Make:
    return sdk_clients.anthropic_model


@pytest.fixture
def openai_model(sdk_clients: SDKClients) -> Make:
    return sdk_clients.openai_model


def _json(body: object) -> Callable[[httpx2.Request], httpx2.Response]:
    return lambda request: httpx2.Response(200, json=body)


def _sse(content: bytes) -> Callable[[httpx2.Request], httpx2.Response]:
    return lambda request: event_stream(content)


async def _outcome(model: Any, streamed: bool) -> object:
    """What one call gives: its response, or the exception it raised."""
    try:
        if not streamed:
            return await model.respond(REQUEST)
        async with aclosing(model.stream(REQUEST)) as events:
            async for event in events:
                if isinstance(event, StreamDone):
                    return event.response
        return AssertionError("the stream ended without a response")
    except Exception as error:
        return error


def _fault(what: str, outcome: object) -> str | None:
    """What is wrong with ``outcome``: an exception other than littleghost's, or an
    error message that shows content."""
    if not isinstance(outcome, BaseException):
        return None
    if not isinstance(outcome, LittleGhostError):
        return f"{what}: {type(outcome).__name__}: {outcome}"
    if "SECRET" in str(outcome):
        return f"{what}: the message shows content: {outcome}"
    return None


@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_every_malformed_answer_reads_or_is_a_littleghost_error(
    adapter: str, anthropic_model: Make, openai_model: Make
) -> None:
    make, body = (
        (anthropic_model, ANTHROPIC_MESSAGE)
        if adapter == "anthropic"
        else (openai_model, OPENAI_COMPLETION)
    )
    faults = []
    for what, mutated in _bodies(body):
        faults.append(_fault(what, await _outcome(make(_json(mutated)), streamed=False)))
    assert [fault for fault in faults if fault] == []
    assert len(faults) > 300


@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_every_malformed_stream_reads_or_is_a_littleghost_error(
    adapter: str, anthropic_model: Make, openai_model: Make
) -> None:
    if adapter == "anthropic":
        make, events, encode = anthropic_model, ANTHROPIC_EVENTS, anthropic_sse
    else:
        make, events, encode = openai_model, OPENAI_CHUNKS, openai_sse
    faults = []
    for what, mutated in _streams(events):
        faults.append(_fault(what, await _outcome(make(_sse(encode(*mutated))), streamed=True)))
    assert [fault for fault in faults if fault] == []
    assert len(faults) > 600


JSON = {"content-type": "application/json"}
UNREADABLE = {
    "not UTF-8": (b'"SECRET-\xff"', ProviderUnavailableError, "invalid_json"),
    "nested too deep": (b"[" * 100_000 + b"]" * 100_000, ProviderError, "nested_too_deep"),
    "integer too long": (b"7" * 5_000, ProviderError, "integer_too_long"),
}
"""Text the JSON parser cannot read in place of the answer's text: the bytes, the error
it is, its ``code``."""


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("unreadable", list(UNREADABLE))
@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_an_answer_the_json_parser_cannot_read_is_a_provider_error(
    adapter: str, unreadable: str, streamed: bool, anthropic_model: Make, openai_model: Make
) -> None:
    """Bytes that are not UTF-8 raised Python's ``UnicodeDecodeError`` out of a run, and
    nesting past the parser's depth its ``RecursionError``, streamed or not; a streamed
    integer too long to read was a ``ProtocolError`` (the event "not JSON"), unstreamed a
    ``ProviderError``. A stream decodes bytes that are not UTF-8 as U+FFFD."""
    raw, kind, code = UNREADABLE[unreadable]
    if adapter == "anthropic":
        make, body = anthropic_model, json.dumps(ANTHROPIC_MESSAGE).encode()
        events = anthropic_sse(
            message_start(), *text_block(0, "SECRET-ANSWER"), *finish("end_turn", 3)
        )
    else:
        make, body = openai_model, json.dumps(OPENAI_COMPLETION).encode()
        events = openai_sse(chunk({"content": "SECRET-ANSWER"}, "stop"))
    sent = (events if streamed else body).replace(b'"SECRET-ANSWER"', raw, 1)
    answer = event_stream(sent) if streamed else httpx2.Response(200, content=sent, headers=JSON)
    outcome = await _outcome(make(lambda request: answer), streamed)
    if streamed and unreadable == "not UTF-8":
        assert outcome.message.text == "SECRET-\ufffd", outcome
        return
    assert type(outcome) is kind and outcome.code == code, outcome
    assert "SECRET" not in str(outcome)


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize(
    ("adapter", "body"),
    [
        ("anthropic", {"type": "error", "error": {"type": "not_found_error", "message": "no"}}),
        ("openai", {"error": {"message": "no such model", "code": 404}}),
    ],
)
async def test_an_error_sent_as_a_json_body_with_a_200_is_classified_streamed_or_not(
    adapter: str, body: dict[str, Any], streamed: bool, anthropic_model: Make, openai_model: Make
) -> None:
    """A gateway's error sent with a 200, as one JSON body: a stream request's was read
    as a stream cut off (``incomplete_stream``), retried, the error lost."""
    make = anthropic_model if adapter == "anthropic" else openai_model
    outcome = await _outcome(make(_json(body)), streamed)
    assert type(outcome) is InvalidRequestError, outcome


def _read_as(response: ModelResponse) -> tuple[object, ...]:
    """What a response says (its message's id is made anew each time)."""
    return (
        response.message.content,
        response.stop_reason,
        response.usage,
        response.response_id,
        response.response_model,
    )


@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_an_answer_sent_whole_to_a_stream_request_reads_as_one_not_streamed(
    adapter: str, anthropic_model: Make, openai_model: Make
) -> None:
    """A server or proxy that ignores ``stream`` sends the whole answer as one JSON body:
    it was read as a stream cut off, asked for three times more (each billed), then the
    call failed. It reads as the same body answered to a call not streamed: the same
    response, or the same error, for the answer and every mutation of its fields (but a
    count sent as ``true``, which the SDK reads as 1 and littleghost, reading the JSON as
    it reads a stream's, as no count); the stream gives its reasoning, text and calls."""
    make, body = (
        (anthropic_model, ANTHROPIC_MESSAGE)
        if adapter == "anthropic"
        else (openai_model, OPENAI_COMPLETION)
    )
    compared = []
    for what, sent in [("the answer", body), *_bodies(body)]:
        whole = await _outcome(make(_json(sent)), streamed=False)
        streamed = await _outcome(make(_json(sent)), streamed=True)
        compared.append(what)
        if isinstance(whole, ModelResponse) and isinstance(streamed, ModelResponse):
            if what.startswith("('usage'") and what.endswith(" bool"):
                assert streamed.message.content == whole.message.content, what
            else:
                assert _read_as(streamed) == _read_as(whole), what
        else:  # an empty body (None) is a stream that ended too soon, and no JSON
            codes = [getattr(error, "code", None) for error in (streamed, whole)]
            assert type(streamed) is type(whole), what
            assert sent is None or codes[0] == codes[1], what
            assert _fault(what, streamed) is None
    assert len(compared) > 300
    server = FakeServer(json_answer(body))
    async with aclosing(make(server).stream(REQUEST)) as events:
        chunks = [event async for event in events]
    assert [type(chunk).__name__ for chunk in chunks] == [
        "ReasoningChunk",
        "TextChunk",
        "ToolCallChunk",
        "StreamDone",
    ]
    assert chunks[1] == TextChunk("SECRET-ANSWER") and len(server.requests) == 1


@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_a_run_streamed_through_a_server_that_does_not_stream_asks_once(
    adapter: str, anthropic_model: Make, openai_model: Make
) -> None:
    """The whole answer a server sends in place of a stream is the run's, told as a
    text delta; the request is not sent again."""
    if adapter == "anthropic":
        make, body = anthropic_model, message_body([{"type": "text", "text": "fine"}])
    else:
        make, body = openai_model, completion_body({"content": "fine"})
    server = FakeServer(json_answer(body))
    async with Agent(model=make(server)).stream("hi") as events:
        received = [type(event).__name__ async for event in events]
    assert events.result.output == "fine" and len(server.requests) == 1
    assert "TextDelta" in received and "ModelCallRetried" not in received


@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_an_answer_sent_whole_after_a_byte_order_mark_reads_as_one_not_streamed(
    adapter: str, anthropic_model: Make, openai_model: Make
) -> None:
    """A whole answer sent to a stream request after a UTF-8 byte order mark (which the
    SDK's JSON reading skips), compact or laid out, reads as it does answered to a call
    not streamed: it was taken for a stream cut off (asked for again, billed)."""
    make, body = (
        (anthropic_model, ANTHROPIC_MESSAGE)
        if adapter == "anthropic"
        else (openai_model, OPENAI_COMPLETION)
    )
    for indent in (None, 2):
        sent = b"\xef\xbb\xbf" + json.dumps(body, indent=indent).encode()

        def answer(request: httpx2.Request, sent: bytes = sent) -> httpx2.Response:
            return httpx2.Response(200, content=sent, headers={"content-type": "application/json"})

        whole = await _outcome(make(answer), streamed=False)
        streamed = await _outcome(make(answer), streamed=True)
        assert isinstance(whole, ModelResponse), whole
        assert isinstance(streamed, ModelResponse), streamed
        assert _read_as(streamed) == _read_as(whole)


@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_an_answer_sent_whole_with_an_error_beside_it_reads_as_one_not_streamed(
    adapter: str, anthropic_model: Make, openai_model: Make
) -> None:
    """A whole answer sent to a stream request with an ``error`` beside its message reads
    as it does answered to a call not streamed, as the answer: it was raised as the error
    (asked for again, each answer billed)."""
    make, body = (
        (anthropic_model, ANTHROPIC_MESSAGE)
        if adapter == "anthropic"
        else (openai_model, OPENAI_COMPLETION)
    )
    for error in ({"message": "busy", "type": "overloaded_error"}, "busy", True):
        sent = {**body, "error": error}
        whole = await _outcome(make(_json(sent)), streamed=False)
        streamed = await _outcome(make(_json(sent)), streamed=True)
        assert isinstance(whole, ModelResponse), whole
        assert isinstance(streamed, ModelResponse), streamed
        assert _read_as(streamed) == _read_as(whole)


async def test_events_labelled_as_json_are_read_as_events(openai_model: Make) -> None:
    """Only a body of JSON is one: a stream a server labels ``application/json`` is read
    as the SDK reads it, as events."""
    body = openai_sse(chunk({"content": "fine"}, "stop"))
    labelled = httpx2.Response(200, content=body, headers=JSON)
    outcome = await _outcome(openai_model(lambda request: labelled), streamed=True)
    assert outcome.message.text == "fine", outcome


@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_arguments_an_sdk_parsed_that_are_no_object_are_kept_as_their_json(
    adapter: str, anthropic_model: Make, openai_model: Make
) -> None:
    """A tool call's input sent as a JSON array (not text): it was kept as its Python
    text (``[1, 'a', True, None]``), and the model told its arguments were not valid
    JSON; they are the JSON they came as, answered as no JSON object."""
    sent: list[object] = [1, "a", True, None]
    if adapter == "anthropic":
        make = anthropic_model
        call = {"type": "tool_use", "id": "toolu_1", "name": "add", "input": sent}
        answers = [
            {**ANTHROPIC_MESSAGE, "content": [call], "stop_reason": "tool_use"},
            {**ANTHROPIC_MESSAGE, "content": [{"type": "text", "text": "done"}]},
        ]
    else:
        make = openai_model
        function = {"name": "add", "arguments": sent}
        answers = [
            completion_body(
                {"tool_calls": [{"id": "c1", "type": "function", "function": function}]},
                "tool_calls",
            ),
            completion_body({"content": "done"}),
        ]

    @tool
    def add(a: int) -> int:
        """Add."""
        return a

    server = FakeServer(*map(json_answer, answers))
    result = await Agent(model=make(server), tools=[add]).run("hi")
    [call_made] = [call for message in result.messages for call in message.tool_calls]
    [answered] = [found for message in result.messages for found in message.tool_results]
    assert call_made.arguments == '[1, "a", true, null]'
    assert answered.content.endswith("the arguments must be a JSON object")


def _anthropic_answer(content: list[Any], stop_reason: str = "end_turn") -> httpx2.Response:
    return httpx2.Response(
        200, json={**ANTHROPIC_MESSAGE, "content": content, "stop_reason": stop_reason}
    )


def _openai_answer(message: dict[str, Any]) -> httpx2.Response:
    choice = {"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}
    return httpx2.Response(200, json={**OPENAI_COMPLETION, "choices": [choice]})


def _failed(spans: Spans) -> dict[str, object]:
    """The ``error.type`` of the run's chat and agent spans, by kind."""
    return {
        span.name.split()[0]: (span.attributes or {}).get("error.type")
        for span in [*spans.named("chat"), *spans.named("invoke_agent")]
    }


@pytest.mark.parametrize(
    ("adapter", "wrong", "named"),
    [
        ("anthropic", {"type": "text", "text": 42}, "content[0].text is a number"),
        (
            "anthropic",
            {"type": "thinking", "thinking": 7, "signature": "s"},
            "content[0].thinking is a number",
        ),
        ("openai", {"content": 42}, "choices[0].message.content is a number"),
        (
            "openai",
            {"content": [{"type": "text", "text": ["SECRET"]}]},
            "content[0].text is an array",
        ),
        ("openai", {"content": None, "refusal": {"SECRET": 1}}, "message.refusal is an object"),
    ],
)
async def test_an_answer_field_of_another_type_fails_the_run_and_keeps_the_log(
    adapter: str,
    wrong: dict[str, Any],
    named: str,
    anthropic_model: Make,
    openai_model: Make,
    spans: Spans,
) -> None:
    """The field's type is named, never its value; the chat and run spans end with the
    error's type; the session's log stays whole: the next run sends the question again."""
    if adapter == "anthropic":
        replies = FakeServer(
            _anthropic_answer([wrong]), _anthropic_answer([{"type": "text", "text": "fine"}])
        )
        model = anthropic_model(replies)
    else:
        replies = FakeServer(_openai_answer(wrong), _openai_answer({"content": "fine"}))
        model = openai_model(replies)
    agent = Agent(model=model, session_store=InMemorySessionStore())
    with pytest.raises(
        ProtocolError, match=rf"^{adapter}: the answer's .*{re.escape(named)}, not "
    ) as raised:
        await agent.run("the question", session_id="s")
    assert "SECRET" not in str(raised.value)
    assert _failed(spans) == {"chat": "ProtocolError", "invoke_agent": "ProtocolError"}
    assert (await agent.run("again", session_id="s")).output == "fine"
    sent = json.dumps(replies.bodies[1]["messages"])
    assert "the question" in sent and "again" in sent


async def test_a_streamed_delta_for_a_block_never_started_is_an_error_not_lost_text(
    anthropic_model: Make,
) -> None:
    """A text delta for a block never started, or for a block of another kind, or a
    block started twice, would lose the answer's text: a ``ProtocolError``."""
    start, stop = ANTHROPIC_EVENTS[0], ANTHROPIC_EVENTS[-2:]
    text_start, text_delta = ANTHROPIC_EVENTS[5], ANTHROPIC_EVENTS[6]
    thinking_start = {**ANTHROPIC_EVENTS[1], "index": 1}
    cases = {
        "was not started": [start, text_delta, *stop],
        "is of another kind": [start, thinking_start, text_delta, *stop],
        "twice": [start, text_start, text_delta, text_start, *stop],
    }
    for problem, events in cases.items():
        model = anthropic_model(_sse(anthropic_sse(*events)))
        outcome = await _outcome(model, streamed=True)
        assert isinstance(outcome, ProtocolError) and problem in str(outcome), (problem, outcome)


async def test_absent_and_null_fields_read_as_empty(
    anthropic_model: Make, openai_model: Make
) -> None:
    """Absent or ``null`` is empty, on both providers: no text, no reasoning, no calls."""
    for content in ([{"type": "text"}], [{"type": "text", "text": None}]):
        response = await _outcome(
            anthropic_model(_json({**ANTHROPIC_MESSAGE, "content": content, "stop_reason": None})),
            streamed=False,
        )
        assert not isinstance(response, BaseException)
        assert response.message.content == ()
    for message in (
        {"content": None},
        {"content": None, "tool_calls": None, "reasoning_content": None},
    ):
        body = {
            **OPENAI_COMPLETION,
            "choices": [{"index": 0, "message": message, "finish_reason": None}],
        }
        response = await _outcome(openai_model(_json(body)), streamed=False)
        assert not isinstance(response, BaseException)
        assert response.message.content == ()


@pytest.mark.parametrize("streamed", [False, True])
async def test_anthropic_tool_calls_without_an_id_are_named_by_their_place(
    streamed: bool, anthropic_model: Make
) -> None:
    """As ``OpenAIModel`` names them: ``call_N``, so each result goes back to its call
    (with ``""`` for both, the API could not tell them apart, and refuses an empty id)."""
    calls = [
        {"type": "tool_use", "name": "add", "input": {"a": 1}},
        {"type": "tool_use", "id": "", "name": "add", "input": {"a": 2}},
    ]
    if streamed:
        events = [ANTHROPIC_EVENTS[0]]
        for index, call in enumerate(calls):
            events.append({"type": "content_block_start", "index": index, "content_block": call})
        events += ANTHROPIC_EVENTS[-2:]
        text = [
            ANTHROPIC_EVENTS[0],
            ANTHROPIC_EVENTS[5],
            ANTHROPIC_EVENTS[-2],
            ANTHROPIC_EVENTS[-1],
        ]
        text[1] = {**text[1], "content_block": {"type": "text", "text": "done"}}
        answers = [event_stream(anthropic_sse(*both)) for both in (events, text)]
    else:
        answers = [
            _anthropic_answer(calls, "tool_use"),
            _anthropic_answer([{"type": "text", "text": "done"}]),
        ]
    replies = FakeServer(*answers)
    added: list[int] = []

    class Adder(Agent):
        @tool
        async def add(self, a: int) -> int:
            """Add one."""
            added.append(a)
            return a + 1

    settings = {"max_tokens": LONGEST_UNSTREAMED + 1} if streamed else {}
    agent = Adder(model=anthropic_model(replies))
    assert (await agent.run("add", settings=settings)).output == "done"
    assert sorted(added) == [1, 2]
    [assistant, results] = replies.bodies[1]["messages"][1:]
    assert [block["id"] for block in assistant["content"]] == ["call_0", "call_1"]
    assert [(block["tool_use_id"], block["content"]) for block in results["content"]] == [
        ("call_0", "2"),
        ("call_1", "3"),
    ]


@pytest.mark.parametrize("count", [-5, 2.5, "12", True, [3], {"n": 3}, 2**63, 10**30])
@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_a_usage_count_not_believable_is_not_reported_and_the_answer_kept(
    adapter: str, count: object, anthropic_model: Make, openai_model: Make, spans: Spans
) -> None:
    """Usage only describes an answer: a count that is not an int from 0 to 2**63 - 1
    (what OpenTelemetry exports) is read as 0, not reported (left off the span); the
    answer and the other counts stand."""
    if adapter == "anthropic":
        usage = {"input_tokens": count, "output_tokens": 6}
        replies = FakeServer(
            json_answer(message_body([{"type": "text", "text": "fine"}], usage=usage))
        )
        model = anthropic_model(replies)
    else:
        usage = {"prompt_tokens": count, "completion_tokens": 6}
        replies = FakeServer(completion({"content": "fine"}, usage=usage))
        model = openai_model(replies)
    result = await Agent(model=model).run("hi")
    assert result.output == "fine"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (0, 6)
    chat = spans.one("chat").attributes or {}
    assert "gen_ai.usage.input_tokens" not in chat
    assert chat["gen_ai.usage.output_tokens"] == 6


@pytest.mark.parametrize(
    "image",
    [ImagePart(data=b""), ImagePart(url="data:image/png;base64,")],
    ids=["bytes", "data-url"],
)
@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_an_empty_image_is_refused_before_anything_is_sent(
    adapter: str, image: ImagePart, anthropic_model: Make, openai_model: Make
) -> None:
    """An image without bytes, in a stored session (which loads it as it is), went to the
    provider, which refuses it: a 400 after a round trip. It is the same error, sent
    nowhere."""
    store = InMemorySessionStore()
    earlier = [Message.user("Look:", image), Message.assistant("Nothing there.")]
    await store.append("s", earlier)
    assert await store.load("s") == tuple(earlier)
    server = FakeServer()
    model = (anthropic_model if adapter == "anthropic" else openai_model)(server)
    with pytest.raises(InvalidRequestError) as caught:
        await Agent(model=model, session_store=store).run("And now?", session_id="s")
    assert str(caught.value) == (
        f"{adapter}: the request holds an ImagePart with no image (data=b'', or a data: URL "
        "with nothing after its comma), which the API refuses; nothing was sent"
    )
    assert server.requests == []


TOO_LONG = b"7" * 1_000_000
"""An int of a million digits, more than Python reads (``sys.set_int_max_str_digits``)."""


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_a_usage_count_too_long_to_read_is_not_reported_and_the_answer_kept(
    adapter: str, streamed: bool, anthropic_model: Make, openai_model: Make, spans: Spans
) -> None:
    """A count of more digits than Python reads is a count not believable too (above): it
    failed the whole answer, streamed or not, as an integer too long to read
    (``integer_too_long``) elsewhere in it does."""
    if adapter == "anthropic":
        usage: dict[str, Any] = {"input_tokens": -1, "output_tokens": 6}
        events = [message_start(usage), *text_block(0, "fine"), *finish("end_turn", 6)]
        body = json.dumps(message_body([{"type": "text", "text": "fine"}], usage=usage))
        sent = anthropic_sse(*events) if streamed else body.encode()
        make = anthropic_model
    else:
        usage = {"prompt_tokens": -1, "completion_tokens": 6, "total_tokens": 6}
        events = [chunk({"content": "fine"}), chunk({}, "stop"), chunk(usage=usage)]
        body = json.dumps(completion_body({"content": "fine"}, "stop", usage))
        sent = openai_sse(*events) if streamed else body.encode()
        make = openai_model
    sent = re.sub(rb'("(?:input|prompt)_tokens": ?)-1', rb"\g<1>" + TOO_LONG, sent)
    answer = event_stream(sent) if streamed else httpx2.Response(200, content=sent, headers=JSON)
    result = await Agent(model=make(FakeServer(answer))).run("hi")
    assert result.output == "fine"
    assert (result.usage.input_tokens, result.usage.output_tokens) == (0, 6)
    chat = spans.one("chat").attributes or {}
    assert "gen_ai.usage.input_tokens" not in chat
    assert chat["gen_ai.usage.output_tokens"] == 6


async def test_an_int_too_long_under_a_tool_s_usage_key_is_no_usage_count(
    anthropic_model: Make,
) -> None:
    """A tool's input holding the key ``usage`` is no usage object: an int too long to
    read there is the error it is anywhere else in an answer (it reached ``ToolCall`` as
    an internal placeholder, a ``TypeError``)."""
    block = {"type": "tool_use", "id": "t1", "name": "note", "input": {"usage": 1}}
    sent = json.dumps(message_body([block], "tool_use")).encode()
    sent = sent.replace(b'"usage": 1}', b'"usage": ' + TOO_LONG + b"}", 1)
    answer = httpx2.Response(200, content=sent, headers=JSON)

    class Noter(Agent):
        max_retries = 0

        @tool
        async def note(self, usage: int) -> str:
            """Note a number."""
            return "noted"

    with pytest.raises(ProviderError) as caught:
        await Noter(model=anthropic_model(FakeServer(answer))).run("hi")
    assert caught.value.code == "integer_too_long"


class RecordingJson:
    """The ``json`` module, recording the keywords each ``loads`` is given, and whether
    what it read held ``TOO_LONG``."""

    def __init__(self) -> None:
        self.options: list[tuple[set[str], bool]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(json, name)

    def loads(self, data: str | bytes, **options: Any) -> Any:
        text = data if isinstance(data, bytes) else data.encode()
        self.options.append((set(options), TOO_LONG in text))
        return json.loads(data, **options)


@pytest.mark.parametrize("adapter", ["anthropic", "openai"])
async def test_only_an_event_holding_an_int_too_long_is_read_int_by_int(
    adapter: str, anthropic_model: Make, openai_model: Make, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every streamed event was read with a callback for each int in it, in case one was
    a usage count too long to read (above): a stream took longer to read (4 MB in
    16-byte pieces: 4.2 s, 3.4 s before). Only an event holding such an int is read again
    so."""
    recording = RecordingJson()
    monkeypatch.setattr(answer_json_module, "json", recording)
    pieces = ["fine "] * 20
    if adapter == "anthropic":
        usage: dict[str, Any] = {"input_tokens": -1, "output_tokens": 6}
        events = [message_start(usage), *text_block(0, *pieces), *finish("end_turn", 6)]
        sent, make = anthropic_sse(*events), anthropic_model
    else:
        usage = {"prompt_tokens": -1, "completion_tokens": 6, "total_tokens": 6}
        events = [*(chunk({"content": p}) for p in pieces), chunk({}, "stop"), chunk(usage=usage)]
        sent, make = openai_sse(*events), openai_model
    sent = re.sub(rb'("(?:input|prompt)_tokens": ?)-1', rb"\g<1>" + TOO_LONG, sent)
    async with Agent(model=make(FakeServer(event_stream(sent)))).stream("hi") as stream:
        async for _ in stream:
            pass
    assert stream.result.output == "fine " * 20
    assert stream.result.usage.input_tokens == 0
    assert len(recording.options) >= len(events)
    read_int_by_int = [held for options, held in recording.options if options]
    assert read_int_by_int  # the event holding it: read again so
    assert all(read_int_by_int)  # no other


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
async def test_anthropic_prompt_parts_summing_past_an_int64_stop_there(
    streamed: bool, anthropic_model: Make
) -> None:
    """The prompt's size is Anthropic's input, cache-read and cache-write counts summed:
    parts each an int64 whose sum is past one stop at 2**63 - 1, as a sum of usages
    does, and never fail the answer (usage only describes it)."""
    most = 2**63 - 1
    counts = random.Random(7)
    for _ in range(20):
        parts = [counts.choice([0, 1, most // 2 + 1, most - 1, most]) for _ in range(3)]
        usage = dict(
            zip(
                ["input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"],
                parts,
                strict=True,
            )
        )
        if streamed:
            events = [message_start(usage), *text_block(0, "fine"), *finish("end_turn", 6)]
            model = anthropic_model(_sse(anthropic_sse(*events)))
        else:
            body = message_body(
                [{"type": "text", "text": "fine"}], usage={**usage, "output_tokens": 6}
            )
            model = anthropic_model(_json(body))
        response = await _outcome(model, streamed)
        assert isinstance(response, ModelResponse), response
        assert response.usage.input_tokens == min(sum(parts), most)
        assert response.usage.cache_read_tokens == parts[1]
        assert response.usage.output_tokens == 6


async def test_openai_calls_streamed_in_any_order_are_listed_as_unstreamed(
    openai_model: Make,
) -> None:
    """Parallel calls whose pieces come interleaved, a later call's first piece before an
    earlier one's, are the calls of the unstreamed answer, in the order of their indexes
    (the order it lists them in)."""
    picks = random.Random(5)
    for _ in range(100):
        count = picks.randrange(2, 5)
        arguments = [json.dumps({"a": picks.randrange(100), "b": "x" * n}) for n in range(count)]
        pieces = []
        for index, text in enumerate(arguments):
            cuts = sorted(picks.sample(range(1, len(text)), 2))
            parts = [text[: cuts[0]], text[cuts[0] : cuts[1]], text[cuts[1] :]]
            started = {"id": f"call_{index}", "type": "function", "function": {"name": "add"}}
            pieces.append(
                [{"index": index, **started}]
                + [{"index": index, "function": {"arguments": part}} for part in parts]
            )
        chunks = []
        while any(pieces):
            waiting = picks.choice([call for call in pieces if call])
            chunks.append(chunk({"tool_calls": [waiting.pop(0)]}))
        streamed = await _outcome(
            openai_model(_sse(openai_sse(*chunks, chunk({}, "tool_calls")))), streamed=True
        )
        listed = [
            {
                "id": f"call_{index}",
                "type": "function",
                "function": {"name": "add", "arguments": text},
            }
            for index, text in enumerate(arguments)
        ]
        whole = completion_body({"tool_calls": listed}, "tool_calls")
        unstreamed = await _outcome(openai_model(_json(whole)), streamed=False)
        assert isinstance(streamed, ModelResponse), streamed
        assert isinstance(unstreamed, ModelResponse), unstreamed
        assert streamed.message.tool_calls == unstreamed.message.tool_calls


async def test_a_streamed_delta_of_another_type_fails_the_run_and_keeps_the_log(
    anthropic_model: Make, spans: Spans
) -> None:
    """A ``text_delta`` whose text is a number, in a run that streams (an output cap over
    ``LONGEST_UNSTREAMED``): a ``ProtocolError`` naming it, as unstreamed."""
    start, text_start, text_delta = ANTHROPIC_EVENTS[0], ANTHROPIC_EVENTS[5], ANTHROPIC_EVENTS[6]
    stop = [{**ANTHROPIC_EVENTS[-2], "delta": {"stop_reason": "end_turn"}}, ANTHROPIC_EVENTS[-1]]
    wrong = {**text_delta, "delta": {"type": "text_delta", "text": 42}}
    fine = {**text_delta, "delta": {"type": "text_delta", "text": "fine"}}
    replies = FakeServer(
        *(event_stream(anthropic_sse(start, text_start, delta, *stop)) for delta in (wrong, fine))
    )
    agent = Agent(model=anthropic_model(replies), session_store=InMemorySessionStore())
    settings = {"max_tokens": LONGEST_UNSTREAMED + 1}
    with pytest.raises(ProtocolError, match=r"content_block_delta\.delta\.text is a number"):
        await agent.run("the question", session_id="s", settings=settings)
    assert _failed(spans) == {"chat": "ProtocolError", "invoke_agent": "ProtocolError"}
    assert (await agent.run("again", session_id="s", settings=settings)).output == "fine"
    assert "the question" in json.dumps(replies.bodies[1]["messages"])


async def test_a_streamed_block_of_a_kind_not_kept_takes_its_deltas(anthropic_model: Make) -> None:
    """A server tool's block (web search) streams its input as ``input_json_delta``, as a
    tool call does: it is left out of the answer, not an error."""
    server_tool = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    events = [
        ANTHROPIC_EVENTS[0],
        {"type": "content_block_start", "index": 0, "content_block": server_tool},
        {**ANTHROPIC_EVENTS[9], "index": 0},
        {"type": "content_block_stop", "index": 0},
        *ANTHROPIC_EVENTS[5:8],
        {**ANTHROPIC_EVENTS[-2], "delta": {"stop_reason": "end_turn"}},
        ANTHROPIC_EVENTS[-1],
    ]
    response = await _outcome(anthropic_model(_sse(anthropic_sse(*events))), streamed=True)
    assert not isinstance(response, BaseException), response
    assert response.message.text == "SECRET-ANSWER"
    assert response.message.tool_calls == ()


async def test_openai_tool_calls_of_another_type_are_left_out_and_one_without_a_function_is_kept(
    openai_model: Make,
) -> None:
    """A call of a kind littleghost never offers (a custom tool's) is left out, as an
    unknown content kind is; a function call without its ``function`` keeps its place,
    named ``""``, so the model is told that no such tool exists."""
    calls = [
        {"id": "call_a", "type": "custom", "custom": {"name": "grammar", "input": "x"}},
        {"id": "call_b", "type": "function"},
        {"id": "call_c", "type": "function", "function": {"name": "add", "arguments": "{}"}},
    ]
    model = openai_model(FakeServer(_openai_answer({"tool_calls": calls})))
    response = await _outcome(model, streamed=False)
    assert not isinstance(response, BaseException), response
    assert [(call.id, call.name) for call in response.message.tool_calls] == [
        ("call_b", ""),
        ("call_c", "add"),
    ]


@pytest.mark.parametrize("finished", [True, False], ids=["finish_reason", "[DONE] alone"])
async def test_streamed_openai_tool_calls_of_another_type_are_left_out_as_unstreamed(
    openai_model: Make, finished: bool
) -> None:
    """Streamed, a custom tool's call (its type in its first piece only) is left out as
    it is unstreamed, and starts no call: it was kept as a call named ``""`` (answered
    as an unknown tool), and its input, no JSON object, made an answer ended by
    ``[DONE]`` alone look cut off."""
    pieces = [
        {"index": 0, "id": "call_a", "type": "custom", "custom": {"name": "grammar"}},
        {"index": 0, "custom": {"input": "x"}},
        {"index": 1, "id": "call_b", "type": "function", "function": {"name": "add"}},
        {"index": 1, "function": {"arguments": "{}"}},
    ]
    events = [chunk({"tool_calls": [piece]}) for piece in pieces]
    if finished:
        events.append(chunk({}, finish_reason="tool_calls"))
    model = openai_model(_sse(openai_sse(*events)))
    async with aclosing(model.stream(REQUEST)) as stream:
        seen = [event async for event in stream]
    assert seen[:-1] == [ToolCallChunk()]
    done = seen[-1]
    assert isinstance(done, StreamDone)
    assert [(call.id, call.name) for call in done.response.message.tool_calls] == [
        ("call_b", "add")
    ]
