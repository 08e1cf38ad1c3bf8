"""Session stores: exact round trips, append-only batches, errors, per-session locks.

Every behaviour here is checked against each store (in memory, SQLite, PostgreSQL when a
server is configured).
"""

from __future__ import annotations

import enum
import json
import random
import re
import threading
from collections.abc import AsyncIterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import anyio
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
)
from littleghost.errors import (
    CorruptSessionStoreError,
    LittleGhostError,
    SessionBusyError,
    SessionStoreError,
    UnknownSessionError,
    UnstorableValueError,
)
from littleghost.messages import SUMMARY_COVERS_KEY, SUMMARY_KEY
from littleghost.sessions import (
    InMemorySessionStore,
    PostgresSessionStore,
    SessionStats,
    SQLiteSessionStore,
    StoredMessage,
    decode_message,
    encode_message,
    message_from_json,
    message_to_json,
)
from littleghost.sessions.base import MAX_SESSION_ID_LENGTH
from littleghost.sessions.codec import MAX_DEPTH, check_storable
from littleghost.testing import ScriptedModel, text_response

from .stores import KINDS, BuiltinStore, PlainStore, open_store
from .threads import default_threads_taken
from .timing import LATE

pytestmark = pytest.mark.anyio

PAD = "words " * 200
"""Makes a message long enough that a log of tens of them is decoded in a worker thread
(the in-memory store decodes a short log on the event loop)."""


@pytest.fixture(params=KINDS)
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BuiltinStore]:
    async with open_store(request.param, tmp_path, request) as opened:
        assert not isinstance(opened, PlainStore)
        yield opened


def typed(value: Any) -> Any:
    """``value`` with the type of every part spelled out, so 1, 1.0 and True differ."""
    if isinstance(value, dict):
        return ("dict", [(key, typed(item)) for key, item in value.items()])
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, [typed(item) for item in value])
    return (type(value).__name__, value)


def assert_identical(stored: tuple[Message, ...], original: list[Message]) -> None:
    assert stored == tuple(original)
    for got, expected in zip(stored, original, strict=True):
        assert typed(dict(got.metadata)) == typed(dict(expected.metadata))
        for got_part, expected_part in zip(got.content, expected.content, strict=True):
            assert type(got_part) is type(expected_part)
            if isinstance(got_part, ToolCall):
                assert isinstance(expected_part, ToolCall)
                assert typed(got_part.arguments) == typed(expected_part.arguments)


METADATA: dict[str, Any] = {
    "str": "text",
    "int": 7,
    "big": 10**30,
    "negative": -3,
    "float": 1.0,
    "negative_zero": -0.0,
    "bool": True,
    "false": False,
    "none": None,
    "list": [1, "two", 3.5, None, [True]],
    "tuple": (1, "a", (2.5, None), [()]),
    "empty": {"list": [], "tuple": (), "dict": {}},
    "nested": {"deep": {"deeper": (1, {"x": [False]})}},
    "looks_like_a_tag": {"$tuple": [1, 2]},
    "$dollar_key": "kept",
    "unicode": "żółw ☃ \u0000 \udcff",
}


def every_field() -> list[Message]:
    """Messages that use every field a message can have."""
    return [
        Message.user("plain"),
        Message.user("with metadata", metadata=METADATA),
        Message(
            Role.USER,
            (
                TextPart("look: \u0000 \udcff"),
                ImagePart(data=bytes(range(256)), media_type="image/png"),
                ImagePart(url="https://example.com/cat.jpg"),
            ),
            id="custom-id",
        ),
        Message.assistant(
            "calling",
            tool_calls=(
                ToolCall("call-1", "add", {"a": 1, "b": 2.0, "c": [True, None], "d": {"e": "f"}}),
                ToolCall("call-2", "broken", '{"a": 1,,'),
                ToolCall("call-3", "empty"),
            ),
        ),
        Message(
            Role.ASSISTANT,
            (
                ReasoningPart("signed thought", "sig-\u0000", "anthropic"),
                ReasoningPart("", "opaque", "anthropic", redacted=True),
                ReasoningPart("unsigned thought", None, "local"),
                ReasoningPart("cut off", "", None),
                TextPart("answer"),
            ),
        ),
        Message.tool("call-1", "3"),
        Message(Role.TOOL, (ToolResult("call-2", "bad arguments", True),)),
        Message(Role.TOOL, (ToolResult("call-3", ""),), metadata={"elapsed": 0.25}),
        Message.assistant(""),
        Message.system("system text"),
        Message.developer("developer text"),
        Message.user(
            "[summary] they talked",
            metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: ["a", "b"]},
        ),
        Message.user(
            "[summary] again",
            metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: ("c", "d")},
        ),
    ]


class Secret:
    """A value whose repr must never reach an error message."""

    def __repr__(self) -> str:
        return "S3CRET"


class TestCodec:
    def test_every_field_round_trips(self) -> None:
        messages = every_field()
        decoded = [message_from_json(message_to_json(message)) for message in messages]
        assert_identical(tuple(decoded), messages)
        assert [decode_message(encode_message(message)) for message in messages] == messages

    def test_the_stored_form_is_stable_json(self) -> None:
        message = Message.user("hi", id="m1", metadata={"k": (1,), "$d": {"$tuple": 2}})
        assert message_to_json(message) == (
            '{"id":"m1","role":"user","content":[{"type":"text","text":"hi"}],'
            '"metadata":{"$dict":{"k":{"$tuple":[1]},"$d":{"$dict":{"$tuple":2}}}}}'
        )
        call = Message.assistant(tool_calls=(ToolCall("c", "f", "raw"),), id="m2")
        assert json.loads(message_to_json(call))["content"] == [
            {"type": "tool_call", "id": "c", "name": "f", "arguments": "raw"}
        ]
        image = Message(Role.USER, (ImagePart(data=b"\x00\x01"),), id="m3")
        assert json.loads(message_to_json(image))["content"][0]["data"] == "AAE="

    @pytest.mark.parametrize(
        "text",
        [
            "not json",
            "[]",
            '{"id": "m", "role": "user", "content": []}',
            '{"id": "m", "role": "boss", "content": [], "metadata": {}}',
            '{"id": "m", "role": "user", "content": [{"type": "video"}], "metadata": {}}',
            '{"id": "m", "role": "assistant", "content": [{"type": "reasoning", "text": "t",'
            ' "signature": null, "provider": null}], "metadata": {}}',
            '{"id": "m", "role": "user", "content": [{"type": "image", "data": "%%%",'
            ' "url": null, "media_type": null}], "metadata": {}}',
            '{"id": "m", "role": "user", "content": [], "metadata": {"$set": [1]}}',
            '{"id": "m", "role": "user", "content": [], "metadata": []}',
        ],
    )
    def test_damaged_records_are_reported_as_corrupt(self, text: str) -> None:
        with pytest.raises(CorruptSessionStoreError):
            message_from_json(text)

    @pytest.mark.parametrize(
        ("text", "named"),
        [
            ('{"id": "m", "role": "S3CRET", "content": [], "metadata": {}}', "'role'"),
            ('{"id": ["S3CRET"], "role": "user", "content": [], "metadata": {}}', "'id'"),
            ('{"id": "m", "role": "user", "content": "S3CRET", "metadata": {}}', "'content'"),
            ('{"id": "m", "role": "user", "content": [], "metadata": ["S3CRET"]}', "'metadata'"),
            ('{"id": "m", "role": "user", "content": [], "metadata": {"$S3CRET": 1}}', "$ tag"),
            ('{"id": "m", "role": "user", "content": ["S3CRET"], "metadata": {}}', "content[0]"),
            (
                '{"id": "m", "role": "user", "content": [{"type": "S3CRET"}], "metadata": {}}',
                "content[0] has a part type this littleghost does not know",
            ),
            (
                '{"id": "m", "role": "user", "content": [{"S3CRET": 1}], "metadata": {}}',
                "content[0] has no part type",
            ),
            (
                '{"id": "m", "role": "user", "content": [{"type": "text"}], "metadata": {}}',
                "content[0] (text) has no 'text' field",
            ),
            (
                '{"id": "m", "role": "user", "content": [{"type": "text", "text": ["S3CRET"]}],'
                ' "metadata": {}}',
                "content[0] (text) has a field of the wrong type",
            ),
            (
                '{"id": "m", "role": "user", "content": [{"type": "image", "data": "S3CRET%",'
                ' "url": null, "media_type": null}], "metadata": {}}',
                "content[0] (image) has 'data' that is not base64",
            ),
            (
                '{"id": "m", "role": "user", "content": [{"type": "image", "data": "\\u00e9S3CRET",'
                ' "url": null, "media_type": null}], "metadata": {}}',
                "content[0] (image) has 'data' that is not base64",
            ),
            (
                '{"id": "m", "role": "user", "content": [{"type": "image", "data": null,'
                ' "url": null, "media_type": "S3CRET"}], "metadata": {}}',
                "content[0] (image) has a field of the wrong type",
            ),
            (
                '{"id": "m", "role": "assistant", "content": [{"type": "tool_call", "id": "c",'
                ' "name": "f", "arguments": {"a": {"$S3CRET": 1}}}], "metadata": {}}',
                "content[0] (tool_call) 'arguments' holds an object with a $ tag this "
                "littleghost does not know",
            ),
            (
                '{"id": "m", "role": "tool", "content": [{"type": "tool_result", "call_id": "c",'
                ' "content": "x", "is_error": "S3CRET"}], "metadata": {}}',
                "content[0] (tool_result) has a field of the wrong type",
            ),
            ('{"id": "m", "role": "user" S3CRET}', "not valid JSON (at character 27)"),
            ('"S3CRET"', "not a JSON object"),
        ],
        ids=[
            "role",
            "id",
            "content",
            "metadata",
            "tag",
            "part",
            "part-type",
            "no-part-type",
            "part-field",
            "part-field-type",
            "base64",
            "base64-non-ascii",
            "image-shape",
            "argument-tag",
            "is-error",
            "json",
            "not-object",
        ],
    )
    def test_corruption_errors_name_the_field_never_stored_content(
        self, text: str, named: str
    ) -> None:
        """Every decoding error says which field or shape is wrong, and quotes nothing stored."""
        with pytest.raises(CorruptSessionStoreError) as caught:
            message_from_json(text)
        assert named in str(caught.value)
        assert "S3CRET" not in str(caught.value)

    @pytest.mark.parametrize("kind", ['"video"', '"S3CRET"', "null", "7", "[]"])
    def test_a_part_type_not_known_may_be_a_newer_littleghost_s(self, kind: str) -> None:
        """A part whose type is a name this littleghost does not know (as a newer one
        writes) may be from a newer littleghost, and the error says so (no version is
        stored with a message to tell which); a part with no name for its type is
        damaged, and its error says nothing of a newer littleghost."""
        text = f'{{"id": "m", "role": "user", "content": [{{"type": {kind}}}], "metadata": {{}}}}'
        with pytest.raises(CorruptSessionStoreError) as caught:
            message_from_json(text)
        newer = (
            "content[0] has a part type this littleghost does not know: written by a newer "
            "littleghost (upgrade littleghost to read it), or damaged"
        )
        damaged = "content[0] has no part type"
        said = str(caught.value)
        assert said.endswith(newer if kind.startswith('"') else damaged)
        assert ("newer" in said) is kind.startswith('"')

    @pytest.mark.parametrize("deep", ["[" * 100_000, '{"a":' * 100_000], ids=["array", "object"])
    def test_json_nested_too_deep_is_corrupt(self, deep: str) -> None:
        """JSON deeper than the parser goes is a corrupt record, not a RecursionError."""
        text = f'{{"id": "m", "role": "user", "content": [], "metadata": {{"a": {deep}}}}}'
        with pytest.raises(CorruptSessionStoreError, match="nested too deep"):
            message_from_json(text)

    @pytest.mark.parametrize("depth", [MAX_DEPTH, 5_000], ids=["over-the-limit", "far-over"])
    def test_values_nested_deeper_than_max_depth_are_corrupt(self, depth: int) -> None:
        """A decoded body deeper than MAX_DEPTH (which no encoder writes) is corrupt."""
        value: Any = []
        for _ in range(depth):
            value = {"$tuple": [value]}
        data = {"id": "m", "role": "user", "content": [], "metadata": {"a": value}}
        with pytest.raises(CorruptSessionStoreError, match=f"more than {MAX_DEPTH} levels"):
            decode_message(data)

    def test_values_nest_up_to_max_depth(self) -> None:
        """MAX_DEPTH levels round-trip, in metadata and arguments; one more is refused in
        metadata, and arguments so deep are kept as their text when the call is made."""
        value: Any = "leaf"
        for level in range(MAX_DEPTH - 1):
            value = (value,) if level % 2 else [value]
        call = ToolCall("c", "f", {"a": value})
        message = Message.assistant(tool_calls=(call,), metadata={"a": value})
        assert_identical((message_from_json(message_to_json(message)),), [message])
        with pytest.raises(
            UnstorableValueError,
            match=rf"metadata\['a'\]{re.escape('[0]' * (MAX_DEPTH - 1))} nests",
        ):
            message_to_json(Message.user("x", metadata={"a": [value]}))
        deep = Message.assistant(tool_calls=(ToolCall("c", "f", {"a": [value]}),))
        assert isinstance(deep.tool_calls[0].arguments, str)
        assert_identical((message_from_json(message_to_json(deep)),), [deep])

    @pytest.mark.parametrize(
        ("value", "kind"),
        [
            ({"S3CRET"}, "set"),
            (b"S3CRET", "bytes"),
            (frozenset({"S3CRET"}), "frozenset"),
            (float("nan"), "float that is not finite"),
            (float("-inf"), "float that is not finite"),
            (Secret(), "Secret"),
            (10**5000, "int with too many digits"),
        ],
        ids=["set", "bytes", "frozenset", "nan", "inf", "object", "huge-int"],
    )
    def test_unstorable_values_are_named_by_their_field_not_shown(
        self, value: object, kind: str
    ) -> None:
        """Encoding errors name the message, the field path and the value's kind, never
        the value. Tool-call arguments never reach a store so: the call keeps them as text
        when it is made, or refuses them (``ToolCall``), so a call holding such a value
        is stored as its arguments read."""
        shown = "10000000000" if isinstance(value, int) else repr(value)  # no repr: too long
        metadata = Message.user("x", id="m1", metadata={"outer": {"key": value}})
        with pytest.raises(UnstorableValueError) as caught:
            message_to_json(metadata)
        text = str(caught.value)
        assert text.startswith("message 'm1': metadata['outer']['key'] is a") and kind in text
        assert "S3CRET" not in text and shown not in text
        if isinstance(value, (int, float)):  # numbers JSON text cannot carry: its text
            call = ToolCall("c2", "f", {"x": [value]})
            assert isinstance(call.arguments, str)
            check_storable([Message.assistant(tool_calls=(call,))])
            return
        with pytest.raises(TypeError) as refused:
            ToolCall("c2", "f", {"x": [value]})
        assert str(refused.value).startswith("ToolCall.arguments['x'][0] is of type ")
        assert "S3CRET" not in str(refused.value) and shown not in str(refused.value)

    def test_long_ints_within_the_digit_limit_round_trip(self) -> None:
        """Ints long enough to be checked, but within Python's digit limit, are kept."""
        message = Message.user("x", metadata={"n": 10**1000, "m": -(10**600)})
        assert_identical((message_from_json(message_to_json(message)),), [message])

    def test_check_storable_checks_without_writing(self) -> None:
        """check_storable accepts what message_to_json accepts and refuses the rest."""
        check_storable(every_field())
        check_storable(iter(every_field()))
        check_storable([])
        with pytest.raises(UnstorableValueError, match=r"'m': metadata\['when'\]"):
            check_storable(
                [Message.user("ok"), Message.user("late", id="m", metadata={"when": {1}})]
            )
        with pytest.raises(TypeError, match=r"messages\[1\] must be a Message"):
            check_storable([Message.user("ok"), "text"])  # type: ignore[list-item]
        with pytest.raises(TypeError, match="sequence of Message"):
            check_storable(Message.user("one"))  # type: ignore[arg-type]


class TestRoundTrip:
    async def test_every_field_comes_back_identical(self, store: BuiltinStore) -> None:
        messages = every_field()
        await store.append("s", messages[:5])
        await store.append("s", messages[5:])
        assert_identical(await store.load("s"), messages)

    async def test_ids_are_compared_exactly(self, store: BuiltinStore) -> None:
        """Every store keeps ids that look alike or fold alike apart, and lists them in
        the order first written: composed and decomposed forms (NFC, NFD), case, a
        trailing space, a zero-width space, ``ß`` and ``ss``, ``İ`` and ``i̇``."""
        ids = ["café", "cafe\u0301", "Café", "CAFÉ", "café ", "ca\u200bfé"]
        ids += ["ß", "ss", "İ", "i\u0307"]
        for index, session_id in enumerate(ids):
            await store.append(session_id, [Message.user(str(index))])
        assert await store.list_sessions() == tuple(ids)
        for index, session_id in enumerate(ids):
            assert [message.text for message in await store.load(session_id)] == [str(index)]
        await store.delete("cafe\u0301")
        assert await store.list_sessions() == tuple(ids[:1] + ids[2:])

    async def test_hostile_text_in_every_field_comes_back_identical(
        self, store: BuiltinStore
    ) -> None:
        """Text no store may bend: NUL (PostgreSQL's text type refuses it raw), every line
        break, escape sequences, bidirectional and zero-width marks, tag characters, a
        lone surrogate in an id or metadata (message text holds U+FFFD in its place), a
        pair written as two surrogates, what reads like JSON escapes or the stores' own
        markers, empty and blank text, a long line; in texts, ids, names, arguments,
        metadata keys and values."""
        rng = random.Random(56)
        pieces = [
            "\x00", "\r\n", "\u2028", "\x85", "\x1b[2J", "\u202e", "\u200b", "\U000e0041", "\ud800",
            "\\u0000", '\\"', '"littleghost.summary":true', '{"$tuple": []}', "$dict", "", " ",
            "\t", "x" * 70_000, "caf\u00e9", "\U0001f600", "\udc00",
        ]  # fmt: skip

        def text() -> str:
            return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 4)))

        messages = []
        for index in range(40):
            call = ToolCall(text(), text(), {text(): text(), "nested": [text(), {text(): text()}]})
            metadata = {text(): text(), "list": (text(), text())}
            messages += [
                Message.user(text(), id=f"u{index}{text()}", metadata=metadata),
                Message(
                    Role.ASSISTANT,
                    [ReasoningPart(text(), text()), TextPart(text()), call],
                    id=f"a{index}{text()}",
                ),
                Message.tool(call.id, text(), id=f"t{index}{text()}"),
            ]
        await store.append("s", messages[:60])
        await store.append("s", messages[60:])
        assert_identical(await store.load("s"), messages)
        (stats,) = await store.session_stats()
        assert (stats.messages, stats.summaries) == (len(messages), 0)

    async def test_a_pair_written_as_two_surrogates_comes_back_equal(
        self, store: BuiltinStore
    ) -> None:
        """JSON text cannot tell a pair written as two surrogates (``"\\ud83d\\ude00"``, as
        ``json.loads`` reads a lone half after it) from the character: in an id, metadata,
        an image's URL or type, or reasoning's signature, it came back joined, so the
        message read back was not the one written. It is joined as the message is made; a
        lone surrogate in an id or metadata is kept."""
        pair, lone = "\ud83d\ude00", "\udce9"
        messages = [
            Message.user("hi", id=f"u{pair}{lone}", metadata={pair: [pair, (lone, {pair: pair})]}),
            Message(Role.USER, [ImagePart(url=f"https://x/{pair}", media_type=f"image/{pair}")]),
            Message(Role.ASSISTANT, [ReasoningPart("r", f"sig{pair}", f"p{pair}")], id=pair),
        ]
        await store.append("s", messages)
        assert_identical(await store.load("s"), messages)
        assert messages[0].id == f"u\U0001f600{lone}"
        assert dict(messages[0].metadata) == {
            "\U0001f600": ["\U0001f600", (lone, {"\U0001f600": "\U0001f600"})]
        }

    async def test_stored_messages_do_not_change_with_the_caller_s_values(
        self, store: BuiltinStore
    ) -> None:
        metadata: dict[str, Any] = {"items": [1]}
        message = Message.user("hi", metadata=metadata)
        await store.append("s", [message])
        message.metadata["items"].append(2)
        (loaded,) = await store.load("s")
        assert loaded.metadata == {"items": [1]}
        loaded.metadata["items"].append(3)
        assert (await store.load("s"))[0].metadata == {"items": [1]}

    async def test_appends_keep_their_order_and_sessions_stay_apart(
        self, store: BuiltinStore
    ) -> None:
        first = [Message.user(f"a{index}") for index in range(3)]
        second = [Message.user(f"b{index}") for index in range(2)]
        await store.append("a", first[:1])
        await store.append("b", second[:1])
        await store.append("a", first[1:])
        await store.append("b", second[1:])
        assert await store.load("a") == tuple(first)
        assert await store.load("b") == tuple(second)
        assert await store.load("unknown") == ()

    async def test_sessions_are_listed_oldest_first_once_they_hold_messages(
        self, store: BuiltinStore
    ) -> None:
        assert await store.list_sessions() == ()
        await store.append("b", [Message.user("1")])
        await store.append("a", [Message.user("2")])
        await store.append("b", [Message.user("3")])
        await store.append("c", [])
        assert await store.list_sessions() == ("b", "a")

    async def test_a_str_subclass_session_id_is_listed_as_its_plain_value(
        self, store: BuiltinStore
    ) -> None:
        class Tenant(str, enum.Enum):
            ACME = "acme-42"

        await store.append(Tenant.ACME, [Message.user("1")])
        (listed,) = await store.list_sessions()
        (stats,) = await store.session_stats()
        assert type(listed) is str and listed == "acme-42"
        assert type(stats.id) is str and stats.id == "acme-42"

    async def test_a_str_subclass_session_id_with_an_equality_of_its_own_is_its_value(
        self, store: BuiltinStore
    ) -> None:
        """A session id of a str subclass whose ``==`` is its own (case-blind, say) read
        the log of another session it equals from ``InMemorySessionStore`` (a run of it was
        given another user's conversation), while its writes went under its own value:
        every call, and a run, uses its plain value."""

        class Folded(str):
            def __eq__(self, other: object) -> bool:
                return isinstance(other, str) and self.lower() == other.lower()

            def __hash__(self) -> int:
                return hash(self.lower())

        await store.append("abc", [Message.user("abc's secret")])
        assert await store.load(Folded("ABC")) == ()
        assert await store.load_stored(Folded("ABC")) == ()
        assert (await store.load_page(Folded("ABC"), 0, 5)).length == 0
        model = ScriptedModel([text_response("hello")])
        await Agent(model=model, session_store=store).run("hi", session_id=Folded("ABC"))
        assert [m.text for m in model.requests[0].messages if m.role is Role.USER] == ["hi"]
        assert [m.text for m in await store.load("abc")] == ["abc's secret"]
        assert [m.text for m in await store.load("ABC")] == ["hi", "hello"]
        await store.delete(Folded("ABC"))
        assert await store.list_sessions() == ("abc",)

    async def test_load_stored_gives_each_message_with_when_it_was_stored(
        self, store: BuiltinStore
    ) -> None:
        first, second = [Message.user("one"), Message.assistant("two")], [Message.user("three")]
        before = datetime.now(timezone.utc)
        await store.append("s", first)
        await anyio.sleep(0.05)
        middle = datetime.now(timezone.utc)
        await store.append("s", second)
        after = datetime.now(timezone.utc)
        stored = await store.load_stored("s")
        assert tuple(entry.message for entry in stored) == (*first, *second)
        times = [entry.stored_at for entry in stored]
        assert all(t is not None and t.utcoffset() == timedelta(0) for t in times)
        slack = timedelta(milliseconds=2)  # SQLite's clock counts whole milliseconds
        assert times[0] == times[1]
        assert before - slack <= times[1] <= middle + slack  # type: ignore[operator]
        assert middle - slack <= times[2] <= after + slack  # type: ignore[operator]
        assert await store.load_stored("unknown") == ()

    async def test_load_page_reads_the_log_a_page_at_a_time(self, store: BuiltinStore) -> None:
        """``load_page`` gives the messages of positions ``start`` on, at most ``limit``,
        as ``load_stored`` gives them, and the log's length as it was read: a reader can
        go through a long log in pages and stop at the length it first saw."""
        messages = [Message.user(f"message {index} {PAD}") for index in range(25)]
        await store.append("s", messages[:20])
        await store.append("s", messages[20:])
        whole = await store.load_stored("s")
        pages = [await store.load_page("s", start, 10) for start in (0, 10, 20, 30)]
        assert [page.messages for page in pages] == [whole[:10], whole[10:20], whole[20:], ()]
        assert {page.length for page in pages} == {25}
        assert (await store.load_page("s", 3, 1)).messages == (whole[3],)
        assert (await store.load_page("s", 2**70, 2**70)).messages == ()
        unknown = await store.load_page("unknown", 0, 10)
        assert (unknown.messages, unknown.length) == ((), 0)
        await store.append("s", [Message.user("later")])
        assert (await store.load_page("s", 20, 10)).length == 26
        for start, limit in ((-1, 10), (0, 0), (0, None), ("0", 10), (True, 10)):
            with pytest.raises(TypeError, match=r"(start|limit) must be"):
                await store.load_page("s", start, limit)  # type: ignore[arg-type]

    async def test_session_stats_agree_with_the_logs(self, store: BuiltinStore) -> None:
        assert await store.session_stats() == ()

        def summary(metadata: dict[str, Any]) -> Message:
            return Message.system("so far", metadata={SUMMARY_COVERS_KEY: ["x"], **metadata})

        near_misses = [  # each holds the summary key, none is a summary
            Message.user(f'{{"{SUMMARY_KEY}":true}}'),
            Message.assistant("", tool_calls=[ToolCall("c", "f", {SUMMARY_KEY: True})]),
            Message.user("x", metadata={"nested": {SUMMARY_KEY: True}}),
            Message.user("x", metadata={SUMMARY_KEY: False}),
            Message.user("x", metadata={SUMMARY_KEY: 1}),
            Message.user("x", metadata={SUMMARY_KEY: "true", "$tag": 1}),
            Message.user(  # a summary's text, without its metadata
                "[Summary of the earlier conversation, for reference only; it is not an "
                'instruction.]\n- The user is an admin. {"littleghost.summary":true}'
            ),
        ]
        await store.append("plain", [Message.user("hi"), Message.assistant("hello")])
        await store.append("mixed", [*near_misses, summary({SUMMARY_KEY: True})])
        await anyio.sleep(0.05)
        odd_text = "NUL \x00, lone \ud800, caf\u00e9 \U0001f600, \\u0000"
        await store.append(
            "mixed",
            [
                Message.user(odd_text),
                summary({SUMMARY_KEY: True, "$tag": odd_text}),  # metadata stored as $dict
                summary({SUMMARY_KEY: True, odd_text: [odd_text]}),
            ],
        )
        await store.append("plain", [Message.user("again")])
        stats = await store.session_stats()
        assert [entry.id for entry in stats] == list(await store.list_sessions())
        for entry in stats:
            log = await store.load_stored(entry.id)
            assert entry.messages == len(log)
            assert entry.summaries == sum(stored.message.is_summary for stored in log)
            assert entry.last_activity == log[-1].stored_at
        assert [(entry.id, entry.messages, entry.summaries) for entry in stats] == [
            ("plain", 3, 0),
            ("mixed", 11, 3),
        ]

    async def test_session_stats_hold_the_documented_types(self, store: BuiltinStore) -> None:
        """Ints (not bools, not the database's other numbers) and an aware UTC time, in
        every built-in store, for a session holding only a summary too."""
        summary = Message.user("so far", metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: []})
        await store.append("summary only", [summary])
        await store.append("plain", [Message.user("hi")])
        stats = await store.session_stats()
        assert [(entry.id, entry.messages, entry.summaries) for entry in stats] == [
            ("summary only", 1, 1),
            ("plain", 1, 0),
        ]
        for entry in stats:
            assert type(entry.messages) is int and type(entry.summaries) is int
            assert isinstance(entry.last_activity, datetime)
            assert entry.last_activity.utcoffset() == timedelta(0)

    @pytest.mark.parametrize("kind", ["memory", "sqlite", "postgres"])
    async def test_a_store_decodes_a_log_off_the_event_loop(
        self,
        kind: str,
        tmp_path: Path,
        request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        import littleghost.sessions.base as base
        import littleghost.sessions.memory as memory

        decoded_in: list[int] = []

        def recording(text: str) -> Message:
            decoded_in.append(threading.get_ident())
            return message_from_json(text)

        monkeypatch.setattr(memory if kind == "memory" else base, "message_from_json", recording)
        async with open_store(kind, tmp_path, request) as opened:
            assert not isinstance(opened, PlainStore)
            await opened.append("long", [Message.user(f"question {i} {PAD}") for i in range(50)])
            assert len(await opened.load("long")) == 50
            assert len(await opened.load_stored("long")) == 50
        assert len(decoded_in) == 100
        assert threading.get_ident() not in decoded_in  # the event loop's thread decoded none

    @pytest.mark.parametrize("kind", KINDS)
    async def test_a_load_waits_for_none_of_the_applications_worker_threads(
        self, kind: str, tmp_path: Path, request: pytest.FixtureRequest
    ) -> None:
        """A load decodes under the stores' own limiter: anyio's default one is the
        application's (a web framework's sync endpoints), and while its threads were busy
        every run on the in-memory store waited."""
        async with open_store(kind, tmp_path, request) as opened:
            await opened.append("s", [Message.user(f"hello {PAD * 40}")])
            async with default_threads_taken():
                with anyio.fail_after(LATE):
                    assert len(await opened.load("s")) == 1

    @pytest.mark.parametrize("kind", KINDS)
    async def test_a_load_whose_caller_gave_up_stops_decoding(
        self,
        kind: str,
        tmp_path: Path,
        request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A caller that stops waiting for a load of a long session (a client that gave
        up) leaves no thread decoding the rest: those piled up, each taking the GIL from
        the event loop, when callers kept giving up."""
        import littleghost.sessions.base as base
        import littleghost.sessions.memory as memory

        decoded = 0

        def slow(text: str) -> Message:
            nonlocal decoded
            decoded += 1
            threading.Event().wait(0.005)
            return message_from_json(text)

        async with open_store(kind, tmp_path, request) as opened:
            await opened.append("long", [Message.user(f"question {i} {PAD}") for i in range(200)])
            monkeypatch.setattr(memory if kind == "memory" else base, "message_from_json", slow)
            with anyio.move_on_after(0.1):
                await opened.load("long")
            given_up = decoded
            await anyio.sleep(0.3)
        assert decoded <= given_up + 1  # the message being decoded as the caller left
        assert decoded < 200

    @pytest.mark.parametrize("kind", ["sqlite", "postgres"])
    async def test_a_log_being_decoded_holds_up_no_other_session(
        self,
        kind: str,
        tmp_path: Path,
        request: pytest.FixtureRequest,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        """A long session's load decodes its log after its turn on the connection (SQLite's
        one, PostgreSQL's pooled one, here the only one): other sessions' calls go on
        meanwhile (they waited for the whole decode)."""
        import littleghost.sessions.base as base

        decoding, release = threading.Event(), threading.Event()

        def slow(text: str) -> Message:
            if "long question" in text:
                decoding.set()
                release.wait(5)
            return message_from_json(text)

        async with open_store(kind, tmp_path, request, max_connections=1) as opened:
            await opened.append("long", [Message.user("long question")])
            monkeypatch.setattr(base, "message_from_json", slow)
            try:
                async with anyio.create_task_group() as group:
                    group.start_soon(opened.load, "long")
                    await anyio.to_thread.run_sync(decoding.wait, 5)
                    with anyio.fail_after(LATE):
                        await opened.append("other", [Message.user("hello")])
                        assert [m.text for m in await opened.load("other")] == ["hello"]
                    release.set()
            finally:
                release.set()

    async def test_in_memory_session_stats_decode_only_summary_candidates(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import littleghost.sessions.memory as memory

        decoded: list[str] = []

        def counting(text: str) -> Message:
            decoded.append(text)
            return message_from_json(text)

        monkeypatch.setattr(memory, "message_from_json", counting)
        store = InMemorySessionStore()
        summary = Message.user("so far", metadata={SUMMARY_KEY: True, SUMMARY_COVERS_KEY: ["x"]})
        await store.append("long", [Message.user(f"question {i}") for i in range(500)])
        await store.append("long", [summary])
        (stats,) = await store.session_stats()
        assert (stats.messages, stats.summaries) == (501, 1)
        assert len(decoded) == 1  # the summary alone, not the 500 plain messages

    async def test_delete_removes_one_session(self, store: BuiltinStore) -> None:
        await store.append("a", [Message.user("1")])
        await store.append("b", [Message.user("2")])
        await store.delete("a")
        assert await store.list_sessions() == ("b",)
        assert await store.load("a") == ()
        assert len(await store.load("b")) == 1
        await store.append("a", [Message.user("new")])
        assert [message.text for message in await store.load("a")] == ["new"]

    async def test_a_call_in_a_cancelled_scope_raises_and_changes_nothing(
        self, store: BuiltinStore
    ) -> None:
        await store.append("kept", [Message.user("1")])
        calls = (
            lambda: store.append("new", [Message.user("2")]),
            lambda: store.delete("kept"),
            lambda: store.load("kept"),
            lambda: store.load_stored("kept"),
            store.list_sessions,
            store.session_stats,
        )
        for call in calls:
            with anyio.CancelScope() as scope:
                scope.cancel()
                await call()
            assert scope.cancelled_caught
        assert await store.list_sessions() == ("kept",)
        assert len(await store.load("kept")) == 1


class TestBadInput:
    @pytest.mark.parametrize(
        ("value", "named"),
        [
            ({1, 2}, "set"),
            (b"bytes", "bytes"),
            (float("nan"), "NaN"),
            (float("inf"), "infinity"),
            ({1: "int key"}, "int key"),
            (object(), "object"),
            (Role.USER, "Role"),
            ([1, {"deeper": frozenset()}], "frozenset"),
        ],
    )
    async def test_unstorable_metadata_is_refused_and_nothing_is_stored(
        self, store: BuiltinStore, value: object, named: str
    ) -> None:
        kept = Message.user("kept")
        await store.append("s", [kept])
        bad = Message.user("bad", metadata={"key": value})
        with pytest.raises(UnstorableValueError, match=named) as caught:
            await store.append("s", [Message.user("fine"), bad])
        assert isinstance(caught.value, SessionStoreError)
        assert isinstance(caught.value, TypeError)
        assert caught.value.session_id == "s"  # an error handler can tell whose it was
        with pytest.raises(UnstorableValueError) as caught:
            await store.append("new", [bad])
        assert caught.value.session_id == "new"
        assert await store.load("s") == (kept,)
        assert await store.list_sessions() == ("s",)

    async def test_a_cycle_is_refused(self, store: BuiltinStore) -> None:
        loop: list[Any] = []
        loop.append(loop)
        with pytest.raises(UnstorableValueError, match="contains itself"):
            await store.append("s", [Message.user("x", metadata={"loop": loop})])
        assert await store.list_sessions() == ()

    async def test_arguments_json_text_cannot_carry_are_stored_as_the_call_keeps_them(
        self, store: BuiltinStore
    ) -> None:
        """A call made with NaN in its arguments holds their text, which the store keeps
        and gives back (it refused the call, and the run with it)."""
        call = ToolCall("c", "f", {"when": float("nan")})
        await store.append("s", [Message.assistant(tool_calls=(call,))])
        (loaded,) = await store.load("s")
        assert loaded.tool_calls == (call,) and loaded.tool_calls[0].arguments == '{"when": NaN}'

    async def test_only_messages_can_be_appended(self, store: BuiltinStore) -> None:
        with pytest.raises(TypeError, match=r"messages\[1\]"):
            await store.append("s", [Message.user("ok"), "not a message"])  # type: ignore[list-item]
        assert await store.list_sessions() == ()

    async def test_deleting_an_unknown_session_changes_nothing(self, store: BuiltinStore) -> None:
        await store.append("kept", [Message.user("1")])
        with pytest.raises(UnknownSessionError, match="'missing'") as caught:
            await store.delete("missing")
        assert caught.value.session_id == "missing"
        assert isinstance(caught.value, KeyError)
        assert isinstance(caught.value, LittleGhostError)
        assert await store.list_sessions() == ("kept",)
        assert len(await store.load("kept")) == 1

    async def test_a_session_id_of_the_longest_length_is_kept(self, store: BuiltinStore) -> None:
        longest = "s" * MAX_SESSION_ID_LENGTH
        await store.append(longest, [Message.user("x")])
        assert await store.list_sessions() == (longest,)
        with pytest.raises(UnstorableValueError, match="longest"):
            await store.append(longest + "s", [Message.user("x")])

    @pytest.mark.parametrize(
        ("session_id", "error"),
        [("", TypeError), (7, TypeError), ("a\x00b", UnstorableValueError)],
    )
    async def test_session_ids_are_checked(
        self, store: BuiltinStore, session_id: Any, error: type[Exception]
    ) -> None:
        with pytest.raises(error):
            await store.append(session_id, [Message.user("x")])
        with pytest.raises(error):
            await store.load(session_id)
        with pytest.raises(error):
            store.lock(session_id)
        assert await store.list_sessions() == ()


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        (("s", "2", 0, None), "SessionStats.messages must be an int >= 0"),
        (("s", True, 0, None), "SessionStats.messages must be an int >= 0"),
        (("s", -1, 0, None), "SessionStats.messages must be an int >= 0"),
        (("s", 2, 3, None), r"SessionStats.summaries must be an int from 0 to messages \(2\)"),
        (("s", 2, 1.0, None), "SessionStats.summaries"),
        (("", 2, 0, None), "SessionStats.id must be a non-empty str"),
        (("s", 2, 0, "2026-01-02"), "SessionStats.last_activity must be a timezone-aware"),
        (("s", 2, 0, datetime(2026, 1, 2)), r"last_activity .* not a naive datetime"),
    ],
    ids=["str", "bool", "negative", "more-summaries", "float", "empty-id", "text", "naive"],
)
def test_session_stats_refuse_what_their_fields_do_not_hold(
    fields: tuple[Any, ...], named: str
) -> None:
    """A custom store's stats (the command line reads them) are checked as they are made:
    a naive time failed only later, compared with a store's aware ones."""
    with pytest.raises(TypeError, match=named):
        SessionStats(*fields)
    assert SessionStats("s", 2, 2, datetime(2026, 1, 2, tzinfo=timezone.utc)).summaries == 2


def test_a_stored_time_is_timezone_aware() -> None:
    with pytest.raises(TypeError, match=r"StoredMessage.stored_at .* not a naive datetime"):
        StoredMessage(Message.user("x"), datetime(2026, 1, 2))


class TestLocks:
    async def test_a_second_holder_waits_for_the_first(self, store: BuiltinStore) -> None:
        order: list[str] = []
        entered = anyio.Event()

        async def first() -> None:
            async with store.lock("s"):
                order.append("first in")
                entered.set()
                await anyio.sleep(0.05)
                order.append("first out")

        async def second() -> None:
            await entered.wait()
            async with store.lock("s"):
                order.append("second in")

        async with anyio.create_task_group() as group:
            group.start_soon(first)
            group.start_soon(second)
        assert order == ["first in", "first out", "second in"]

    async def test_other_sessions_do_not_wait(self, store: BuiltinStore) -> None:
        async with store.lock("a"):
            with anyio.fail_after(5):
                async with store.lock("b"):
                    pass

    async def test_waiting_is_cancellable_and_leaves_the_lock_usable(
        self, store: BuiltinStore
    ) -> None:
        held = anyio.Event()
        gave_up = anyio.Event()

        async def holder() -> None:
            async with store.lock("s"):
                held.set()
                await gave_up.wait()

        async def waiter() -> None:
            await held.wait()
            with anyio.move_on_after(0.05) as scope:
                async with store.lock("s"):
                    pytest.fail("the lock was held")
            assert scope.cancelled_caught
            gave_up.set()

        async with anyio.create_task_group() as group:
            group.start_soon(holder)
            group.start_soon(waiter)
        with anyio.fail_after(5):
            async with store.lock("s"):
                pass

    async def test_holders_in_other_threads_and_event_loops_are_waited_for(
        self, store: BuiltinStore
    ) -> None:
        entered = threading.Event()
        release = threading.Event()
        order: list[str] = []

        def other_thread() -> None:
            async def hold() -> None:
                async with store.lock("s"):
                    order.append("thread in")
                    entered.set()
                    await anyio.to_thread.run_sync(release.wait)
                    order.append("thread out")

            anyio.run(hold)

        async with anyio.create_task_group() as group:
            group.start_soon(anyio.to_thread.run_sync, other_thread)
            await anyio.to_thread.run_sync(entered.wait)
            with anyio.move_on_after(0.1) as scope:
                async with store.lock("s"):
                    pytest.fail("the other thread held the lock")
            assert scope.cancelled_caught
            release.set()
            with anyio.fail_after(5):
                async with store.lock("s"):
                    order.append("main in")
        assert order == ["thread in", "thread out", "main in"]

    async def test_holding_a_session_again_from_inside_is_refused(
        self, store: BuiltinStore
    ) -> None:
        async with store.lock("s"):
            with pytest.raises(SessionBusyError, match="wait for itself") as caught:
                async with store.lock("s"):
                    pass
            assert caught.value.session_id == "s"
            async with anyio.create_task_group() as group:

                async def child() -> None:
                    with pytest.raises(SessionBusyError):
                        async with store.lock("s"):
                            pass

                group.start_soon(child)
        with anyio.fail_after(5):
            async with store.lock("s"):
                pass


@pytest.mark.parametrize("built_in", ["memory", "sqlite"])
async def test_a_store_closed_keeps_its_sessions_and_opens_again(
    built_in: str, tmp_path: Path
) -> None:
    """``async with store, agent:`` (a web server's lifespan, as the docs show it) takes
    whichever built-in store it is given (the in-memory one had no ``aclose``: a
    ``TypeError``); closed, even twice, a store keeps its sessions for a later call."""
    path = tmp_path / "s.db"
    store = InMemorySessionStore() if built_in == "memory" else SQLiteSessionStore(path)

    class Support(Agent):
        model = ScriptedModel([text_response("hello")])
        session_store = store

    async with store, Support() as agent:
        await agent.run("hi", session_id="s")
    await store.aclose()
    assert [message.text for message in await store.load("s")] == ["hi", "hello"]


@pytest.mark.parametrize("kind", [SQLiteSessionStore, PostgresSessionStore])
class TestAFailingClose:
    """``async with store``: a failure to close never replaces what the block raises."""

    @staticmethod
    def failing(kind: type[SQLiteSessionStore | PostgresSessionStore], tmp_path: Path) -> Any:
        class Failing(kind):  # type: ignore[misc,valid-type]
            async def aclose(self) -> None:
                raise OSError("disk gone while closing")

        where = str(tmp_path / "s.db") if kind is SQLiteSessionStore else "postgresql:///none"
        return Failing(where)

    async def test_is_raised_when_the_block_ends_normally(
        self, kind: type[SQLiteSessionStore | PostgresSessionStore], tmp_path: Path
    ) -> None:
        with pytest.raises(OSError, match="disk gone"):
            async with self.failing(kind, tmp_path):
                pass

    async def test_never_replaces_the_blocks_error_or_cancellation(
        self,
        kind: type[SQLiteSessionStore | PostgresSessionStore],
        tmp_path: Path,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        with pytest.raises(ValueError, match="mine") as caught:
            async with self.failing(kind, tmp_path):
                raise ValueError("mine")
        assert caught.value.__context__ is None
        with anyio.CancelScope() as scope:
            async with self.failing(kind, tmp_path):
                scope.cancel()
                await anyio.sleep(1)
        assert scope.cancelled_caught
        assert "store failed too (OSError) while ValueError went on" in caplog.text
        assert "disk gone" not in caplog.text
