"""Tool-call arguments JSON cannot carry follow one rule, decided where a ``ToolCall`` is
made, whatever made it: a history, an ``after_model`` or ``before_tool`` hook, a custom
model, a session store's load. A number JSON text cannot carry (NaN, an infinity, an int
too long to write) or nesting past ``MAX_DEPTH`` makes the arguments their text: the
log and the store keep it whole, OpenAI and Anthropic are sent ``{}``, estimates and
spans read the text, and the run answers such a call it runs with an error. What JSON
has no form for (a key that is not a str, a datetime, a set, bytes, an object, an enum
member) is a ``TypeError`` naming where, so a run ends before anything of it is stored.
Through the real SDKs over mock transports."""

from __future__ import annotations

import datetime
import enum
import json
import math
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import attrs
import pytest

from littleghost import Agent, Message, ToolCall, after_model, before_tool, manage_context, tool
from littleghost.context.tokens import estimate_messages
from littleghost.models import Model, ModelRequest, ModelResponse
from littleghost.sessions import InMemorySessionStore
from littleghost.sessions.codec import check_storable
from littleghost.text import json_text

from .sdk_bodies import FakeServer, SDKClients, completion, json_answer, message_body

if TYPE_CHECKING:
    from conftest import Spans

pytestmark = pytest.mark.anyio

LONG = 7 * 10 ** sys.get_int_max_str_digits() + 1


def _nested(lists: int, innermost: list[Any]) -> list[Any]:
    """``lists`` lists, each in the next, ``innermost`` the deepest (made without
    recursion: deeper than Python's recursion goes too)."""
    value = innermost
    for _ in range(lists - 1):
        value = [value]
    return value


KEPT_AS_TEXT = {
    "nan": {"n": math.nan},
    "infinity": {"n": math.inf},
    "-infinity": {"n": [1, -math.inf]},
    "long-int": {"n": {"total": LONG}},
    "too-deep": {"n": _nested(101, [])},  # one level more than MAX_DEPTH under the object
    "past-python": {"n": _nested(100_000, [])},
}
TEXTS = {"past-python": json_text({"n": _nested(100, ["…"])})}
"""The text of arguments nested deeper than Python writes: their first levels, one more
than MAX_DEPTH (each container deeper written "…")."""


class Color(str, enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Ratio(float):
    pass


class Point(NamedTuple):
    x: int
    y: int


class Plain(enum.Enum):
    ONE = 1


AS_JSON_TYPES = {
    "str-enum": ({"n": Color.RED}, {"n": "red"}),
    "int-enum": ({"n": [Level.HIGH]}, {"n": [3]}),
    "float-subclass": ({"n": {"r": Ratio(0.5)}}, {"n": {"r": 0.5}}),
    "named-tuple": ({"n": Point(1, 2)}, {"n": (1, 2)}),
    "str-enum-key": ({"n": {Color.RED: 1}}, {"n": {"red": 1}}),
}
"""Values of subclasses of JSON types, and what a call keeps of them: those types, as
``json.dumps`` writes them."""

REFUSED = {
    "int-key": ({1: "one"}, "ToolCall.arguments has a key of type int"),
    "long-int-key": ({"n": {LONG: 1}}, "ToolCall.arguments['n'] has a key of type int"),
    "tuple-key": ({(1, 2): "pair"}, "ToolCall.arguments has a key of type tuple"),
    "datetime": (
        {"n": datetime.datetime(2025, 5, 1)},
        "ToolCall.arguments['n'] is of type datetime",
    ),
    "set": ({"n": [{1, 2}]}, "ToolCall.arguments['n'][0] is of type set"),
    "bytes": ({"n": b"\x00"}, "ToolCall.arguments['n'] is of type bytes"),
    "object": ({"n": object()}, "ToolCall.arguments['n'] is of type object"),
    "enum-member": ({"n": Plain.ONE}, "ToolCall.arguments['n'] is of type Plain"),
}


class Counter(Agent):
    instructions = "Count."

    @tool
    def count(self, n: Any = None) -> str:
        """Count n (any value: the schema refuses nothing)."""
        return "counted"


@manage_context(context_window_tokens=100_000)
class Managed(Counter):
    pass


USAGE = {"input_tokens": 9, "output_tokens": 3}
"""Anthropic's usage of every answer (OpenAI's: 9 and 3 too)."""


class Server(FakeServer):
    """One provider's mock HTTP server, and its model talking to it through the real SDK:
    plays its answers, records the requests."""

    def __init__(self, provider: str, clients: SDKClients) -> None:
        super().__init__()
        self.provider = provider
        self.model: Model = (
            clients.openai_model(self) if provider == "openai" else clients.anthropic_model(self)
        )

    def calls(self, *calls: tuple[str, dict[str, Any]]) -> Server:
        if self.provider == "openai":
            made = [
                {
                    "id": i,
                    "type": "function",
                    "function": {"name": "count", "arguments": json.dumps(a)},
                }
                for i, a in calls
            ]
            self.answers.append(completion({"tool_calls": made}, "tool_calls", (9, 3)))
        else:
            blocks = [{"type": "tool_use", "id": i, "name": "count", "input": a} for i, a in calls]
            self.answers.append(json_answer(message_body(blocks, "tool_use", USAGE)))
        return self

    def text(self, text: str) -> Server:
        if self.provider == "openai":
            self.answers.append(completion({"content": text}, "stop", (9, 3)))
        else:
            content = [{"type": "text", "text": text}]
            self.answers.append(json_answer(message_body(content, "end_turn", USAGE)))
        return self

    def sent(self, body: int) -> dict[str, Any]:
        """The arguments each call of request ``body`` was sent with, by call id."""
        sent: dict[str, Any] = {}
        for message in self.bodies[body]["messages"]:
            if self.provider == "openai":
                for call in message.get("tool_calls") or []:
                    sent[call["id"]] = json.loads(call["function"]["arguments"])
            elif isinstance(message["content"], list):
                for block in message["content"]:
                    if block["type"] == "tool_use":
                        sent[block["id"]] = block["input"]
        return sent


@pytest.fixture(params=["openai", "anthropic"])
def server(request: pytest.FixtureRequest, sdk_clients: SDKClients) -> Server:
    return Server(request.param, sdk_clients)


def _changed(response: ModelResponse, arguments: dict[Any, Any]) -> ModelResponse:
    """``response`` with each call's arguments replaced, in a ``ToolCall`` made anew."""
    content = [
        ToolCall(part.id, part.name, arguments) if isinstance(part, ToolCall) else part
        for part in response.message.content
    ]
    return attrs.evolve(response, message=attrs.evolve(response.message, content=content))


class Changing:
    """A custom model: the provider's answers with their calls' arguments replaced."""

    def __init__(self, inner: Model, arguments: dict[Any, Any]) -> None:
        self.inner, self.arguments = inner, arguments
        self.name, self.provider, self.context_window = inner.name, inner.provider, None

    async def respond(self, request: ModelRequest) -> ModelResponse:
        return _changed(await self.inner.respond(request), self.arguments)


PATHS = ["history", "after_model", "before_tool", "custom_model", "store_load"]


def _agent(
    path: str, arguments: dict[Any, Any], model: Model, store: InMemorySessionStore
) -> Agent:
    """The agent of ``path``: one of its hooks or its model makes the call."""
    if path == "custom_model":
        model = Changing(model, arguments)
    if path == "after_model":

        class Changed(Managed):
            @after_model
            def change(self, response: ModelResponse) -> ModelResponse:
                return _changed(response, arguments)

        return Changed(model=model, session_store=store, capture_content=True)
    if path == "before_tool":

        class Routed(Managed):
            @before_tool
            def change(self, call: ToolCall) -> ToolCall:
                return attrs.evolve(call, arguments=arguments)

        return Routed(model=model, session_store=store, capture_content=True)
    return Managed(model=model, session_store=store, capture_content=True)


async def _run(
    path: str, arguments: dict[Any, Any], server: Server
) -> tuple[InMemorySessionStore, Any]:
    """Run an agent on session ``s`` with a tool call holding ``arguments``, made by
    ``path``, talking to ``server``: the store, and the run's result or the ``TypeError``
    it ended with. A history (given, or stored) holds the call answered; otherwise the model
    calls ``count`` once, then answers "done"."""
    store = InMemorySessionStore()
    agent = _agent(path, arguments, server.model, store)
    try:
        if path not in ("history", "store_load"):
            server.calls(("c1", {"n": 1})).text("done")
            return store, await agent.run("count", session_id="s")
        server.text("again")
        log = [
            Message.user("count"),
            Message.assistant(tool_calls=[ToolCall("c1", "count", arguments)]),
            Message.tool("c1", "counted"),
            Message.assistant("counted"),
        ]
        if path == "store_load":
            await store.append("s", log)
        history = log if path == "history" else None
        return store, await agent.run("again", history=history, session_id="s")
    except TypeError as error:
        return store, error


def _sent_in_spans(spans: Spans) -> list[Any]:
    """The arguments of the calls the last chat span's input messages show."""
    shown = json.loads(spans.named("chat")[-1].attributes["gen_ai.input.messages"])
    return [
        part["arguments"]
        for message in shown
        for part in message["parts"]
        if part["type"] == "tool_call"
    ]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("kind", list(KEPT_AS_TEXT))
async def test_arguments_json_text_cannot_carry_are_their_text_on_every_path(
    path: str, kind: str, server: Server, spans: Spans
) -> None:
    """Whatever makes the call, its arguments are their text everywhere, the log whole."""
    arguments = KEPT_AS_TEXT[kind]
    text = TEXTS[kind] if kind in TEXTS else json_text(arguments)
    store, result = await _run(path, arguments, server)
    assert not isinstance(result, BaseException), result
    log = result.messages
    assert await store.load("s") == log  # the log whole, stored as the run holds it
    (asking,) = [message for message in log if message.tool_calls]
    (call,) = asking.tool_calls
    (answer,) = [part for message in log for part in message.tool_results]
    if path == "before_tool":  # the hook's call ran; the log holds the model's
        assert call.arguments == {"n": 1} and server.sent(1) == {"c1": {"n": 1}}
    else:
        assert call.arguments == text
        assert server.sent(len(server.bodies) - 1) == {"c1": {}}  # OpenAI's and Anthropic's
        assert _sent_in_spans(spans) == [text]
        assert estimate_messages([asking]) >= len(text) / 4
    if path in ("history", "store_load"):  # its own result, not answered again
        assert (answer.content, result.output) == ("counted", "again")
        assert spans.named("execute_tool") == []
        return
    assert answer.is_error and result.output == "done"
    assert answer.content.startswith("Invalid arguments for tool 'count': the arguments are ")
    assert spans.one("execute_tool").attributes["gen_ai.tool.call.arguments"] == text


@pytest.mark.parametrize("path", PATHS[:-1])  # a store gives back JSON: it has a form
@pytest.mark.parametrize("kind", list(REFUSED))
async def test_arguments_json_has_no_form_for_are_refused_on_every_path(
    path: str, kind: str, server: Server
) -> None:
    """Whatever makes the call, it is refused as it is made, naming where; the stored log
    is whole."""
    arguments, where = REFUSED[kind]
    store, result = await _run(path, arguments, server)
    assert isinstance(result, TypeError) and str(result).startswith(f"{where}; arguments hold ")
    stored = await store.load("s")
    asked = {call.id for message in stored for call in message.tool_calls}
    answered = {part.call_id for message in stored for part in message.tool_results}
    assert asked == answered  # the log whole: every stored call has its result
    if path == "history":  # refused as the history is made: nothing sent or stored
        assert (server.bodies, stored) == ([], ())
        return
    assert len(server.bodies) == 1 and stored[0].text == "count"
    if path == "before_tool":  # the model's call is logged, answered as stopped
        assert [call.arguments for message in stored for call in message.tool_calls] == [{"n": 1}]
    else:  # the model's answer is refused before it is stored
        assert len(stored) == 1


@pytest.mark.parametrize("path", PATHS[:-1])  # a store gives back JSON types
@pytest.mark.parametrize("kind", list(AS_JSON_TYPES))
async def test_subclasses_of_json_types_are_those_types_on_every_path(
    path: str, kind: str, server: Server
) -> None:
    """Whatever makes the call, a str or int enum member, a float subclass or a named
    tuple is kept as the JSON type it subclasses: stored, sent and run as that value."""
    arguments, kept = AS_JSON_TYPES[kind]
    store, result = await _run(path, arguments, server)
    assert not isinstance(result, BaseException), result
    log = result.messages
    assert await store.load("s") == log
    (asking,) = [message for message in log if message.tool_calls]
    (call,) = asking.tool_calls
    if path == "before_tool":  # the hook's call ran, as the tool's; the log holds the model's
        assert call.arguments == {"n": 1}
        assert [part.content for message in log for part in message.tool_results] == ["counted"]
        return
    assert call.arguments == kept
    assert json.dumps(dict(call.arguments)) == json.dumps(kept)
    assert _types(call.arguments) == _types(kept)
    assert server.sent(len(server.bodies) - 1) == {"c1": json.loads(json.dumps(kept))}


def _types(value: Any) -> Any:
    """The exact types in ``value``, as a value of the same shape."""
    if isinstance(value, Mapping):
        return {(type(key), key): _types(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return (type(value), [_types(item) for item in value])
    return type(value)


def test_a_mapping_in_the_arguments_is_kept_as_a_dict_and_one_holding_itself_is_refused() -> None:
    """Another call's read-only arguments nested in a call's are a JSON object: kept as a
    dict, which a store keeps (it refused the read-only mapping); arguments that contain
    themselves are a ``TypeError`` (they stopped only at a store)."""
    inner = ToolCall("a", "f", {"q": 1})
    call = ToolCall("b", "f", {"inner": inner.arguments})
    assert type(call.arguments["inner"]) is dict and call.arguments["inner"] == {"q": 1}
    check_storable([Message.assistant(tool_calls=[call])])
    looped: dict[str, Any] = {}
    looped["self"] = [looped]
    with pytest.raises(TypeError, match=r"^ToolCall\.arguments contains itself; arguments"):
        ToolCall("c", "f", looped)
    looped["text"] = "\ud800"  # rebuilt (its lone surrogate replaced) before it is written
    with pytest.raises(TypeError, match=r"^ToolCall\.arguments contains itself; arguments"):
        ToolCall("c", "f", looped)
