"""Messages, parts, model values and the scripted model: construction and bad input."""

from __future__ import annotations

import copy
import itertools
import pickle
import re
from typing import Any

import anyio
import attrs
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
    Usage,
    tool,
)
from littleghost.errors import ConfigurationError, ProtocolError, RateLimitError
from littleghost.messages import SUMMARY_COVERS_KEY, SUMMARY_KEY
from littleghost.models import Model, ModelRequest, ModelResponse, StopReason, ToolSpec
from littleghost.models.streaming import StreamDone, TextChunk
from littleghost.sessions import message_from_json, message_to_json
from littleghost.testing import (
    ScriptedModel,
    Streamed,
    streamed,
    text_response,
    tool_call_response,
    tool_calls_response,
)

pytestmark = pytest.mark.anyio


def test_role_is_a_str_enum() -> None:
    """Role values are the strings of the design, and compare equal to them."""
    assert [role.value for role in Role] == ["system", "developer", "user", "assistant", "tool"]
    assert Role.USER == "user"


def test_instructions_are_the_trusted_roles() -> None:
    """System and developer messages are trusted (kept as they are), no other role; read-only."""
    assert [role for role in Role if role.is_trusted] == [Role.SYSTEM, Role.DEVELOPER]
    assert [Message(role, "x").is_trusted for role in Role] == [True, True, False, False, False]
    with pytest.raises(AttributeError):
        Role.USER.is_trusted = True  # type: ignore[misc]


def test_constructors_set_role_and_text() -> None:
    """system/developer/user/assistant build a message of their role holding the text."""
    built = [
        Message.system("s"),
        Message.developer("d"),
        Message.user("u"),
        Message.assistant("a"),
    ]
    assert [(m.role, m.text) for m in built] == [
        (Role.SYSTEM, "s"),
        (Role.DEVELOPER, "d"),
        (Role.USER, "u"),
        (Role.ASSISTANT, "a"),
    ]


def test_a_user_message_takes_images_after_its_text() -> None:
    """``Message.user`` holds its text, then the images given, in order, as a question
    about a picture is asked."""
    photo, scan = ImagePart(url="https://example.com/p.jpg"), ImagePart(data=b"\x89PNG")
    question = Message.user("Is this parcel damaged?", photo, scan)
    assert question.content == (TextPart("Is this parcel damaged?"), photo, scan)
    assert question.text == "Is this parcel damaged?"


def test_assistant_with_tool_calls_exposes_them() -> None:
    """An assistant message lists its tool calls in order."""
    calls = [ToolCall("c1", "a", {"x": 1}), ToolCall("c2", "b", {})]
    message = Message.assistant("thinking", tool_calls=calls)
    assert message.tool_calls == tuple(calls)
    assert message.text == "thinking"


def test_assistant_without_text_has_no_text_part() -> None:
    """An assistant message of tool calls alone holds no empty text part."""
    message = Message.assistant(tool_calls=[ToolCall("c1", "a")])
    assert not any(isinstance(part, TextPart) for part in message.content)


def test_tool_message_carries_its_result() -> None:
    """Message.tool builds a tool message with one ToolResult."""
    message = Message.tool("c1", "done", is_error=True)
    assert message.role is Role.TOOL
    assert message.tool_results == (ToolResult("c1", "done", True),)


def test_text_joins_text_parts_only() -> None:
    """.text joins the text parts and skips images and calls."""
    message = Message(Role.USER, [TextPart("a"), ImagePart(url="https://x/y.png"), TextPart("b")])
    assert message.text == "ab"


def test_lists_are_stored_as_tuples() -> None:
    """Lists given to constructors are stored as tuples."""
    message = Message(Role.USER, [TextPart("a")])
    assert isinstance(message.content, tuple)
    assert isinstance(ModelRequest([message], []).messages, tuple)
    assert isinstance(ModelRequest([message], []).tools, tuple)


def test_a_str_content_becomes_one_text_part() -> None:
    """A str passed as content becomes one TextPart."""
    assert Message(Role.USER, "hello").content == (TextPart("hello"),)


def test_text_is_well_formed_as_utf8_can_carry_it() -> None:
    """A lone surrogate (a file name's byte that is not UTF-8, as ``os.listdir`` reads
    it) in a prompt, an instruction or a tool's result becomes U+FFFD: no provider
    request could carry it, and every later run of a session holding it failed. A pair
    written as two surrogates is joined, so a message reads back from JSON equal."""
    name = "caf\udce9.txt \ud83d\ude00"
    fixed = "caf\ufffd.txt \U0001f600"
    assert Message.user(name).text == fixed
    assert Message.system(name).text == fixed
    assert TextPart(name) == TextPart(fixed)
    assert ToolResult("c1", name).content == fixed
    assert TextPart("plain") == TextPart("plain") and TextPart("東京").text == "東京"


def test_calls_and_reasoning_are_well_formed_too() -> None:
    """A model's JSON holding half an emoji (``"\\ud83d"``) reads as a lone surrogate: in
    a call's arguments (keys and nested values too), its id or name, or reasoning, it is
    U+FFFD as in text; arguments without one are kept as given."""
    half, fixed = "smile \ud83d", "smile \ufffd"
    call = ToolCall(half, half, {half: [half, {"n": (1, half)}], "k": 2})
    assert call == ToolCall(fixed, fixed, {fixed: [fixed, {"n": (1, fixed)}], "k": 2})
    assert ToolCall("c", "f", '{"a": "' + half).arguments == '{"a": "' + fixed
    assert ReasoningPart(half).text == fixed and ToolResult(half, "r").call_id == fixed
    nested = {"items": ["東京", {"x": 1}]}
    assert ToolCall("c", "f", nested).arguments["items"] is nested["items"]


def test_a_message_reads_back_from_json_equal_whatever_its_surrogates() -> None:
    """A pair written as two surrogates in an id, metadata (keys too), an image's URL or
    type, or reasoning's signature is joined as the message is made, as JSON text reads it
    back; a lone one is kept in an id and metadata (which no provider is sent), and is
    U+FFFD elsewhere, as in text."""
    pair, lone, joined = "\ud83d\ude00", "\udce9", "\U0001f600"
    message = Message.user("hi", id=pair + lone, metadata={pair: (pair, [lone])})
    assert message.id == joined + lone
    assert dict(message.metadata) == {joined: (joined, [lone])}
    image = ImagePart(url=pair + lone, media_type=pair)
    assert (image.url, image.media_type) == (joined + "\ufffd", joined)
    reasoning = ReasoningPart("r", pair, lone)
    assert (reasoning.signature, reasoning.provider) == (joined, "\ufffd")
    for read in (message, Message(Role.USER, [image]), Message(Role.ASSISTANT, [reasoning])):
        assert message_from_json(message_to_json(read)) == read
    plain = {"items": [1, "東京"]}
    assert Message.user("hi", metadata=plain).metadata["items"] is plain["items"]


def test_ids_are_generated_and_unique() -> None:
    """Each message gets its own id unless one is given."""
    assert Message.user("a").id != Message.user("a").id
    assert Message.user("a", id="fixed").id == "fixed"


def test_messages_are_frozen_and_evolve() -> None:
    """A message cannot be changed in place; attrs.evolve makes a new one."""
    message = Message.user("a")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        message.role = Role.SYSTEM  # type: ignore[misc]
    changed = attrs.evolve(message, content=(TextPart("b"),))
    assert (message.text, changed.text, changed.id) == ("a", "b", message.id)


def test_summary_marker() -> None:
    """A message carrying the summary metadata is a summary; others are not."""
    summary = Message.user("sum", metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: ("m1",)})
    assert summary.is_summary
    assert not Message.user("plain").is_summary


def test_metadata_is_a_read_only_copy() -> None:
    """Changing the dict given, or the stored mapping, never changes a message (a logged
    message cannot become a summary); values nested in it are kept as given."""
    nested = {"tags": ["a"]}
    given: dict[str, Any] = {"source": "crm", "extra": nested}
    message = Message.user("hello", metadata=given)
    given[SUMMARY_KEY] = True
    assert not message.is_summary
    with pytest.raises(TypeError):
        message.metadata[SUMMARY_KEY] = True  # type: ignore[index]
    assert not message.is_summary
    assert message.metadata == {"source": "crm", "extra": {"tags": ["a"]}}
    assert message.metadata["extra"] is nested
    assert "metadata={'source': 'crm', 'extra': {'tags': ['a']}}" in repr(message)


def test_tool_call_arguments_are_a_read_only_copy() -> None:
    """ToolCall.arguments is a read-only copy that still equals a plain dict."""
    given: dict[str, Any] = {"a": 1}
    call = ToolCall("c1", "add", given)
    given["a"] = 2
    assert call.arguments == {"a": 1}
    assert {"a": 1} == call.arguments  # noqa: SIM300 - the dict on the left side too
    with pytest.raises(TypeError):
        call.arguments["a"] = 3  # type: ignore[index]
    assert call == ToolCall("c1", "add", {"a": 1})
    assert repr(call) == "ToolCall(id='c1', name='add', arguments={'a': 1})"


def test_evolve_builds_new_metadata_and_arguments() -> None:
    """attrs.evolve with a merged mapping makes a new read-only copy; the original keeps its own."""
    message = Message.user("a", metadata={"k": 1})
    changed = attrs.evolve(message, metadata={**message.metadata, SUMMARY_KEY: True})
    assert changed.is_summary and not message.is_summary
    call = ToolCall("c1", "f", {"x": 1})
    assert attrs.evolve(call, arguments={**call.arguments, "y": 2}).arguments == {"x": 1, "y": 2}  # type: ignore[dict-item]


def test_messages_and_tool_calls_compare_by_value_but_are_not_hashable() -> None:
    """Equal values compare equal; hash() raises TypeError naming the class (key by id)."""
    call = ToolCall("c1", "f", {"x": 1})
    message = Message.assistant(tool_calls=[call], id="m1", metadata={"k": 1})
    assert message == Message.assistant(tool_calls=[call], id="m1", metadata={"k": 1})
    with pytest.raises(TypeError, match="unhashable type: 'Message'"):
        hash(message)
    with pytest.raises(TypeError, match="unhashable type: 'ToolCall'"):
        hash(call)
    assert {message.id: message}["m1"] is message


def test_messages_pickle_and_copy() -> None:
    """Messages with metadata and tool calls survive pickle, copy and deepcopy, still read-only."""
    message = Message.assistant(
        "x",
        [ToolCall("c1", "f", {"x": [1]}), ToolCall("c2", "g", "{raw")],
        metadata={"k": {"n": 1}},
    )
    for twin in (
        pickle.loads(pickle.dumps(message)),
        copy.copy(message),
        copy.deepcopy(message),
    ):
        assert twin == message
        with pytest.raises(TypeError):
            twin.metadata["k"] = 2  # type: ignore[index]
        with pytest.raises(TypeError):
            twin.tool_calls[0].arguments["x"] = 2  # type: ignore[index]
    assert copy.deepcopy(message).metadata["k"] is not message.metadata["k"]


def test_wrong_value_messages_name_the_field_but_not_the_content() -> None:
    """A value type's TypeError names the field and the type given, never echoes text."""
    with pytest.raises(TypeError) as wrong_text:
        TextPart(b"secret text")  # type: ignore[arg-type]
    assert str(wrong_text.value) == "TextPart.text must be a str, not bytes"
    with pytest.raises(TypeError) as wrong_count:
        Usage(-1, 0)
    assert str(wrong_count.value) == "Usage.input_tokens must be an int from 0 to 2**63-1, not -1"


@pytest.mark.parametrize("text", [None, 0, False, b"", []])
@pytest.mark.parametrize("make", [Message.user, Message.assistant, Message.system])
def test_a_message_s_text_that_is_not_a_str_is_refused_even_when_falsy(
    make: Any, text: Any
) -> None:
    """An assistant message given None (a redacting hook's "no change") is refused as a
    user message is, not made an empty answer that the log would keep in its place."""
    with pytest.raises(TypeError, match=r"TextPart\.text must be a str"):
        make(text)
    with pytest.raises(TypeError, match=r"TextPart\.text must be a str"):
        text_response(text)
    assert Message.assistant("").content == ()


def test_reasoning_is_a_part_of_its_own() -> None:
    """Reasoning keeps its place among a message's parts, out of its text; a block goes
    back only to the provider that wrote it, and never when it lost its signature."""
    thought = ReasoningPart("hmm", "sig", "anthropic")
    message = Message(Role.ASSISTANT, [thought, TextPart("yes"), ToolCall("c", "t")])
    assert message.reasoning == (thought,) and message.text == "yes"
    assert message.content[0] is thought
    assert thought.sendable_to("anthropic") and not thought.sendable_to("openai")
    assert ReasoningPart("hmm", None, "local").sendable_to("local")
    assert not ReasoningPart("hmm", "", "anthropic").sendable_to("anthropic")


def test_tool_call_keeps_raw_string_arguments() -> None:
    """ToolCall keeps a str of arguments as it came (not valid JSON)."""
    assert ToolCall("c1", "t", "{not json").arguments == "{not json"


def test_image_part_needs_data_or_url() -> None:
    """An ImagePart needs exactly one of data and url."""
    with pytest.raises(TypeError, match="data= or url="):
        ImagePart()
    with pytest.raises(TypeError, match="data= or url="):
        ImagePart(data=b"x", url="https://x")


@pytest.mark.parametrize(
    ("build", "names"),
    [
        (lambda: Message("wizard", ()), "Message.role"),
        (lambda: Message(Role.USER, 42), "Message.content"),
        (lambda: Message(Role.USER, [42]), "Message.content"),
        (lambda: Message(Role.USER, (), id=7), "Message.id"),
        (lambda: Message(Role.USER, (), metadata=[1]), "Message.metadata"),
        (lambda: Message.user(3), "TextPart.text"),
        (lambda: Message.user("q", "second text"), "Message.user takes ImagePart .* not str"),
        (lambda: Message.user("q", ToolCall("c", "t")), "ImagePart values .*, not ToolCall"),
        (lambda: TextPart(b"x"), "TextPart.text"),
        (lambda: ImagePart(data="not bytes"), "ImagePart.data"),
        (lambda: ImagePart(url=5), "ImagePart.url"),
        (lambda: ToolCall(1, "t"), "ToolCall.id"),
        (lambda: ToolCall("c", None), "ToolCall.name"),
        (lambda: ToolCall("c", "t", 5), "ToolCall.arguments"),
        (lambda: ToolResult("c", 5), "ToolResult.content"),
        (lambda: ToolResult("c", "x", "yes"), "ToolResult.is_error"),
        (lambda: Message.tool("c", "x", is_error="no"), "ToolResult.is_error"),
        (lambda: ReasoningPart(None), "ReasoningPart.text"),
        (lambda: ReasoningPart("t", b"sig"), "ReasoningPart.signature"),
        (lambda: ReasoningPart("t", provider=1), "ReasoningPart.provider"),
        (lambda: ReasoningPart("t", redacted=1), "ReasoningPart.redacted"),
    ],
)
def test_message_values_reject_wrong_types(build: Any, names: str) -> None:
    """Wrong types to message and part constructors raise TypeError naming the field."""
    with pytest.raises(TypeError, match=names):
        build()


@pytest.mark.parametrize("role", [*Role])
def test_a_role_in_another_case_is_named_and_other_text_is_not(role: Role) -> None:
    """``Message("User", ...)`` said only ``not str``: a role in another case, or with
    spaces, is shown, saying roles are lower case; other text stays unshown (content)."""
    for written in (role.value.upper(), role.value.title(), f" {role.value}\n"):
        told = f"not {written!r} (a role is written in lower case, without spaces)"
        with pytest.raises(TypeError, match=re.escape(told) + "$"):
            Message(written, "hi")  # type: ignore[arg-type]
    secret = f"{role.value} s3cret"
    with pytest.raises(TypeError, match=r"tool, not str$"):
        Message(secret, "hi")  # type: ignore[arg-type]


def test_usage_adds_up() -> None:
    """Usage values add (and subtract) field by field, the cache and reasoning parts too."""
    total = Usage(1, 2) + Usage(10, 20)
    assert (total.input_tokens, total.output_tokens, total.total_tokens) == (11, 22, 33)
    cached = Usage(100, 40, cache_read_tokens=60, cache_write_tokens=30, reasoning_tokens=25)
    assert cached + Usage(10, 5, 4, 3, 2) == Usage(110, 45, 64, 33, 27)
    assert (cached + Usage(10, 5, 4, 3, 2)) - cached == Usage(10, 5, 4, 3, 2)


def test_usage_parts_cannot_exceed_their_totals() -> None:
    """Cache tokens are part of the input and reasoning tokens part of the output."""
    Usage(10, 5, cache_read_tokens=6, cache_write_tokens=4, reasoning_tokens=5)
    with pytest.raises(TypeError, match=r"cache_read_tokens \+ cache_write_tokens \(6 \+ 5\)"):
        Usage(10, 5, cache_read_tokens=6, cache_write_tokens=5)
    with pytest.raises(TypeError, match=r"reasoning_tokens \(6\) are part of output_tokens \(5\)"):
        Usage(10, 5, reasoning_tokens=6)


@pytest.mark.parametrize(
    ("build", "names"),
    [
        (lambda: Usage(-1, 0), "Usage.input_tokens"),
        (lambda: Usage(0, "3"), "Usage.output_tokens"),
        (lambda: Usage(0, 0, cache_read_tokens=-1), "Usage.cache_read_tokens"),
        (lambda: Usage(0, 0, cache_write_tokens=1.5), "Usage.cache_write_tokens"),
        (lambda: Usage(0, 0, reasoning_tokens=True), "Usage.reasoning_tokens"),
        (lambda: ModelRequest("hello"), "ModelRequest.messages"),
        (lambda: ModelRequest(["hello"]), "ModelRequest.messages"),
        (lambda: ModelRequest([], tools=5), "ModelRequest.tools"),
        (lambda: ModelRequest([], tools=[{"name": "x"}]), "ModelRequest.tools"),
        (lambda: ModelRequest([], settings=[("a", 1)]), "settings"),
        (lambda: ModelRequest([], settings={1: 2}), "settings"),
        (lambda: ModelRequest([], purpose=5), "ModelRequest.purpose"),
        (lambda: ModelResponse("hi"), "ModelResponse.message"),
        (lambda: ModelResponse(Message.user("hi")), "ModelResponse.message"),
        (
            lambda: ModelResponse(Message(Role.ASSISTANT, (ToolResult("c1", "r"),))),
            "ModelResponse.message: a message of role 'assistant' carries only",
        ),
        (lambda: ModelResponse(Message.assistant("hi"), "tired"), "ModelResponse.stop_reason"),
        (lambda: ModelResponse(Message.assistant("hi"), usage=(1, 2)), "ModelResponse.usage"),
        (lambda: ToolSpec(""), "ToolSpec.name"),
        (lambda: ToolSpec("t", 5), "ToolSpec.description"),
        (lambda: ToolSpec("t", "d", "{}"), "ToolSpec.parameters"),
    ],
)
def test_model_values_reject_wrong_types(build: Any, names: str) -> None:
    """Wrong types to model value constructors raise TypeError naming the field."""
    with pytest.raises(TypeError, match=names):
        build()


@pytest.mark.parametrize(
    "build",
    [
        lambda: ModelRequest("card 4111-1111"),
        lambda: ModelRequest([], tools="card 4111-1111"),
        lambda: ModelRequest([], tools=[{"card": "4111-1111"}]),
        lambda: Streamed("card 4111-1111", text_response("x")),
        lambda: ModelResponse("card 4111-1111"),  # type: ignore[arg-type]
        lambda: ModelRequest([], settings={1: "card 4111-1111"}),  # type: ignore[dict-item]
        lambda: Message("card 4111-1111"),  # type: ignore[arg-type]
    ],
)
def test_a_wrong_value_is_named_by_its_type_not_its_content(build: Any) -> None:
    """What a request, a response, a message or a step was given may be message content
    (text passed where the role goes, say): errors show types."""
    with pytest.raises(TypeError) as caught:
        build()
    assert "4111" not in str(caught.value)


def test_model_values_take_fields_positionally() -> None:
    """Requests and responses take their fields positionally in the documented order."""
    spec = ToolSpec("t", "does t", {"type": "object", "properties": {}})
    request = ModelRequest([Message.user("a")], [spec], {"max_tokens": 5}, "chat")
    response = ModelResponse(Message.assistant("b"), StopReason.MAX_TOKENS, Usage(3, 4))
    assert (request.tools, request.max_tokens, request.purpose) == ((spec,), 5, "chat")
    assert (response.stop_reason, response.usage) == (StopReason.MAX_TOKENS, Usage(3, 4))


def test_scripted_model_is_a_model() -> None:
    """ScriptedModel satisfies the Model protocol with its name and window."""
    model = ScriptedModel([], context_window=1000, name="fake")
    assert isinstance(model, Model)
    assert (model.name, model.provider, model.context_window) == ("fake", "scripted", 1000)


async def test_scripted_model_plays_steps_in_order() -> None:
    """Responses are returned, exceptions raised, callables (sync and async) called."""

    def sync_step(request: ModelRequest) -> ModelResponse:
        return text_response(f"sync saw {len(request.messages)}")

    async def async_step(request: ModelRequest) -> ModelResponse:
        return text_response("async")

    model = ScriptedModel([text_response("one"), ValueError("two"), sync_step, async_step])
    request = ModelRequest([Message.user("hi")])
    assert (await model.respond(request)).message.text == "one"
    with pytest.raises(ValueError, match="two"):
        await model.respond(request)
    assert (await model.respond(request)).message.text == "sync saw 1"
    assert (await model.respond(request)).message.text == "async"
    assert model.requests == [request] * 4


async def test_scripted_model_counts_as_its_count_says() -> None:
    """count_prompt_tokens plays count_prompt_tokens= (sync or async); None without it."""

    async def later(request: ModelRequest) -> int:
        return 7 * len(request.messages)

    request = ModelRequest([Message.user("hi"), Message.user("there")])
    assert (
        await ScriptedModel([], count_prompt_tokens=lambda r: 5).count_prompt_tokens(request) == 5
    )
    assert await ScriptedModel([], count_prompt_tokens=later).count_prompt_tokens(request) == 14
    assert await ScriptedModel([]).count_prompt_tokens(request) is None


async def test_scripted_model_raises_protocol_error_when_out_of_steps() -> None:
    """A call past the end of the script raises ProtocolError."""
    model = ScriptedModel([text_response("only")])
    await model.respond(ModelRequest([]))
    with pytest.raises(ProtocolError, match="ran out of steps"):
        await model.respond(ModelRequest([]))


@pytest.mark.parametrize(
    ("answer", "told"),
    [
        ("text", "str, not a ModelResponse (wrap an answer's text in text_response(...))"),
        (None, "NoneType, not a ModelResponse (it returned nothing: return the response)"),
        (
            RateLimitError("slow down"),
            "RateLimitError, not a ModelResponse (raise the exception instead, or make it "
            "the step itself)",
        ),
        (
            Message.assistant("hi"),
            "Message, not a ModelResponse (wrap the message in ModelResponse(...))",
        ),
        (
            streamed("a", "b"),
            "Streamed, not a ModelResponse (a callable answers whole: make the streamed(...) "
            "step itself the step)",
        ),
        ([text_response("x")], "list, not a ModelResponse"),
        (
            ToolCall("c1", "lookup", {}),
            "ToolCall, not a ModelResponse (wrap the call in tool_calls_response(...))",
        ),
    ],
)
@pytest.mark.parametrize("streaming", [False, True])
async def test_scripted_model_says_which_step_returned_junk(
    answer: object, told: str, streaming: bool
) -> None:
    """A callable step that returns something other than a response raises ProtocolError
    naming the model, the step's place in the script and, where it can tell, the fix."""
    model = ScriptedModel([text_response("first"), lambda request: answer], name="support")
    await model.respond(ModelRequest([]))
    with pytest.raises(ProtocolError) as caught:
        if streaming:
            async for _ in model.stream(ModelRequest([])):
                pass
        else:
            await model.respond(ModelRequest([]))
    assert str(caught.value) == f"ScriptedModel 'support': step 1, a callable, returned {told}"


async def test_scripted_model_streams_the_step_it_answers_with_when_shared() -> None:
    """Two calls at once on one model: each streams the chunks of the step it answers
    with, never another call's."""
    model = ScriptedModel([streamed("AAA ", "aaa"), streamed("BBB ", "bbb")])
    joined: dict[str, tuple[str, str]] = {}

    async def call(name: str) -> None:
        chunks, done = [], None
        async for event in model.stream(ModelRequest([Message.user(name)])):
            if isinstance(event, TextChunk):
                chunks.append(event.text)
            elif isinstance(event, StreamDone):
                done = event.response.message.text
        assert done is not None
        joined[name] = ("".join(chunks), done)

    async with anyio.create_task_group() as group:
        group.start_soon(call, "x")
        group.start_soon(call, "y")
    assert all(text == done for text, done in joined.values())
    assert sorted(done for _, done in joined.values()) == ["AAA aaa", "BBB bbb"]


@pytest.mark.virtual_clock
async def test_a_streamed_step_answered_whole_takes_its_streams_time() -> None:
    """``respond()`` gives a ``streamed()`` step's answer after the delays its stream
    takes, so a run that does not stream meets a deadline the same step would; its
    exception, last, is raised there too."""
    model = ScriptedModel([streamed("a ", "b ", "c", delay=5), streamed("a ", "b ", "c", delay=5)])
    started = anyio.current_time()
    assert (await model.respond(ModelRequest([]))).message.text == "a b c"
    assert anyio.current_time() - started == pytest.approx(15)
    with anyio.move_on_after(7) as scope:
        await model.respond(ModelRequest([]))
    assert scope.cancelled_caught
    cut = ScriptedModel([streamed("a", ValueError("cut"))])
    with pytest.raises(ValueError, match="cut"):
        await cut.respond(ModelRequest([]))


def test_a_scripted_model_refuses_an_endless_iterator_of_steps() -> None:
    """``itertools.repeat(step)`` fails at once, naming the limit, instead of filling
    memory forever."""
    with pytest.raises(TypeError, match="steps must be a finite sequence of at most 100000"):
        ScriptedModel(itertools.repeat(text_response("same")))
    assert ScriptedModel(text_response(str(n)) for n in range(3)).remaining == 3


@pytest.mark.parametrize(
    ("chunks", "response", "error"),
    [
        (
            (1, 2),
            text_response("12"),
            r"Streamed.chunks must hold str, Usage or exception values, not int",
        ),
        (
            None,
            text_response("x"),
            r"Streamed.chunks must be a sequence of str, Usage or exception, not NoneType",
        ),
        (
            "hello",
            text_response("hello"),
            r"Streamed.chunks must be a sequence of str, Usage or exception, not str",
        ),
        (
            {"a": 1},
            text_response("a"),
            r"Streamed.chunks must be a sequence of str, Usage or exception, not dict",
        ),
        (("a",), "a", r"Streamed.response must be a ModelResponse, not str"),
        (
            ("a", ValueError("cut"), "b"),
            text_response("ab"),
            r"Streamed.chunks: an exception must be the last chunk \(the stream ends with it\)",
        ),
        ((ValueError,), text_response(""), r"or exception values, not type"),
    ],
)
def test_a_streamed_steps_chunks_and_response_are_checked_when_made(
    chunks: Any, response: Any, error: str
) -> None:
    """A wrong value fails when the step is made, not mid-stream (or as an int delta)."""
    with pytest.raises(TypeError, match=error):
        Streamed(chunks, response)


def test_a_streamed_step_takes_its_chunks_as_a_list() -> None:
    assert Streamed(["a", "b"], text_response("ab")).chunks == ("a", "b")


@pytest.mark.parametrize("delay", [-1, float("nan"), "0.1", True])
def test_a_streamed_steps_delay_is_checked_when_made(delay: Any) -> None:
    with pytest.raises(ConfigurationError, match=r"streamed\(delay=\) must be a number >= 0"):
        streamed("a", delay=delay)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"steps": "abc"}, "steps"),
        ({"steps": 3}, "steps"),
        (
            {"steps": [42]},
            r"step 0 must be a ModelResponse, a streamed\(\.\.\.\) step, an exception or a "
            "callable, not int$",
        ),
        ({"steps": ["Hi!"]}, r"step 0 .* not str \(wrap an answer's text in text_response"),
        (
            {"steps": [Message.assistant("Hi!")]},
            r"step 0 .* not Message \(wrap the message in ModelResponse\(\.\.\.\)\)$",
        ),
        (
            {"steps": [ToolCall("c1", "lookup", {})]},
            r"step 0 .* not ToolCall \(wrap the call in tool_calls_response\(\.\.\.\)\)$",
        ),
        ({"steps": [text_response("x"), ValueError]}, "step 1 is the exception class ValueError"),
        ({"steps": [text_response]}, r"step 0 is the function text_response itself: call it"),
        ({"steps": [tool_call_response]}, r"step 0 is the function tool_call_response itself"),
        ({"steps": [Streamed]}, r"step 0 is the class Streamed itself: make the step with "),
        (
            {"steps": text_response("x")},
            r"not ModelResponse \(put a single step in a list: \[step\]\)$",
        ),
        ({"steps": lambda request: None}, r"not function \(put a single step in a list"),
        ({"steps": [lambda: text_response("x")]}, r"step 0 .*cannot take the request.* \(\)"),
        ({"steps": [lambda request, extra: None]}, r"step 0 .*missing a required argument"),
        ({"steps": [], "context_window": "big"}, "context_window"),
        ({"steps": [], "context_window": True}, "context_window"),
        ({"steps": [], "name": 5}, "name"),
        ({"steps": [], "count_prompt_tokens": 12}, "count_prompt_tokens"),
    ],
)
def test_scripted_model_rejects_wrong_types(kwargs: dict[str, Any], names: str) -> None:
    """Wrong types to ScriptedModel raise TypeError naming the argument."""
    with pytest.raises(TypeError, match=names):
        ScriptedModel(**kwargs)


@pytest.mark.parametrize(
    ("build", "names"),
    [
        (lambda: text_response(5), "TextPart.text"),
        (lambda: text_response("x", input_tokens=-1), "Usage.input_tokens"),
        (lambda: text_response("x", stop_reason="tired"), "stop_reason"),
        (lambda: tool_call_response(5, {}), "ToolCall.name"),
        (lambda: tool_call_response("t", 5), "ToolCall.arguments"),
    ],
)
def test_helpers_reject_wrong_types(build: Any, names: str) -> None:
    """Wrong types to text_response and tool_call_response raise TypeError naming the field."""
    with pytest.raises(TypeError, match=names):
        build()


def test_text_response_builds_a_final_answer() -> None:
    """text_response builds an assistant message with usage and stop reason."""
    response = text_response("hi", input_tokens=3, output_tokens=4)
    assert (response.message.text, response.stop_reason, response.usage) == (
        "hi",
        StopReason.END_TURN,
        Usage(3, 4),
    )


def test_tool_call_response_builds_one_call() -> None:
    """tool_call_response builds one call with the given id and a tool_use stop."""
    response = tool_call_response("lookup", {"id": "42"}, call_id="c9")
    assert response.message.tool_calls == (ToolCall("c9", "lookup", {"id": "42"}),)
    assert response.stop_reason is StopReason.TOOL_USE


def test_tool_call_response_generates_distinct_ids() -> None:
    """Without call_id, each tool_call_response gets its own id."""
    first = tool_call_response("t", {}).message.tool_calls[0].id
    second = tool_call_response("t", {}).message.tool_calls[0].id
    assert first != second


async def test_tool_calls_response_makes_parallel_calls_a_run_answers() -> None:
    """tool_calls_response builds one answer of several calls (pairs get their own ids, a
    ToolCall keeps its id) after optional text; a run answers each call."""
    seen: list[str] = []

    class Lookup(Agent):
        @tool
        def lookup(self, order_id: str) -> str:
            """Find an order."""
            seen.append(order_id)
            return f"order {order_id}"

    response = tool_calls_response(
        ("lookup", {"order_id": "1"}),
        ToolCall("mine", "lookup", '{"order_id": "2"}'),
        text="Looking both up.",
        input_tokens=5,
        output_tokens=3,
    )
    calls = response.message.tool_calls
    assert [call.name for call in calls] == ["lookup", "lookup"]
    assert calls[1].id == "mine" and calls[0].id.startswith("call_")
    assert (response.message.text, response.stop_reason, response.usage) == (
        "Looking both up.",
        StopReason.TOOL_USE,
        Usage(5, 3),
    )
    model = ScriptedModel([response, text_response("both found")])
    result = await Lookup(model=model).run("orders 1 and 2")
    assert sorted(seen) == ["1", "2"]
    answered = [part.call_id for m in result.messages for part in m.tool_results]
    assert answered == [calls[0].id, "mine"]


@pytest.mark.parametrize(
    ("calls", "text", "error", "match"),
    [
        ((), "", ValueError, "give at least one call"),
        (("lookup",), "", TypeError, r"call 0 must be a ToolCall or a \(name, arguments\) pair"),
        ((("lookup", {}), ("a", "b", "c")), "", TypeError, r"call 1 .*not tuple"),
        ((("lookup", {}),), None, TypeError, "text must be a str, not NoneType"),
        (([("a", {}), ("b", {})],), "", TypeError, r"not list \(give each call as an argument"),
        (((("a", {}), ("b", {})),), "", TypeError, r"not tuple \(give each call as an argument"),
        ((["a", {}], ("b", {})), "", TypeError, r"not list$"),
    ],
)
def test_tool_calls_response_names_a_bad_call(
    calls: tuple[Any, ...], text: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        tool_calls_response(*calls, text=text)
