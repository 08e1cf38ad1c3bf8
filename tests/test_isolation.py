"""Isolation and early failures: sessions stay with their agent class, threads own their
models, the RunContext reaches only the tool parameter annotated for it, and bad input
fails before anything is stored."""

from __future__ import annotations

import gc
import math
import sys
import threading
import types
import uuid
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from littleghost import Agent, Message, ReasoningPart, RunContext, ToolCall, manage_context, tool
from littleghost.context import TokenBudget, apply_compaction, build_view, forget_recent_logs
from littleghost.context.outside import compact_log, preview_request
from littleghost.errors import ConfigurationError, UnstorableValueError
from littleghost.models import ModelRequest, ModelResponse, register_provider
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response
from tests.conftest import Spans
from tests.stores import KINDS, open_store

pytestmark = pytest.mark.anyio

SELF_HOLDING: list[Any] = []
SELF_HOLDING.append(SELF_HOLDING)


def echo(request: ModelRequest) -> ModelResponse:
    """Answer with every user text the model was shown, joined."""
    seen = [m.text for m in request.messages if m.role.value == "user"]
    return text_response(" | ".join(seen))


class Support(Agent):
    instructions = "Support."


class Billing(Agent):
    instructions = "Billing."


class VIPSupport(Support):
    pass


class TestSessionsStayWithTheirClass:
    async def test_two_classes_never_see_each_others_session(self) -> None:
        session = f"customer-{uuid.uuid4().hex}"
        await Support(model=ScriptedModel([echo])).run("my password is hunter2", session_id=session)
        result = await Billing(model=ScriptedModel([echo])).run("hello", session_id=session)
        assert "hunter2" not in result.output
        assert [m.text for m in result.messages] == ["hello", "hello"]

    async def test_a_subclass_without_a_store_of_its_own_gets_its_own(self) -> None:
        assert VIPSupport.session_store is not Support.session_store
        assert Support.session_store is not Agent.session_store

    async def test_sharing_is_declared(self) -> None:
        shared = InMemorySessionStore()

        class Front(Agent):
            session_store = shared

        class Back(Agent):
            session_store = shared

        class FrontChild(Front):
            pass

        await Front(model=ScriptedModel([echo])).run("first", session_id="x")
        result = await Back(model=ScriptedModel([echo])).run("second", session_id="x")
        assert result.output == "first | second"
        assert FrontChild.session_store is shared

    async def test_a_declared_store_wins_over_the_ones_made_for_classes_before_it(
        self,
    ) -> None:
        """The store made for a class that declared none is no declaration: a class
        combining it with one that declares a store gets the declared one, and one that
        declares another class's store passes it on to its subclasses."""
        durable = InMemorySessionStore()

        class Audited(Agent):
            pass

        class Persistent(Agent):
            session_store = durable

        class App(Audited, Persistent):
            pass

        class Shared(Agent):
            session_store = Support.session_store

        class SharedChild(Shared):
            pass

        await App(model=ScriptedModel([echo])).run("remember 42", session_id="x")
        assert [m.text for m in await durable.load("x")] == ["remember 42", "remember 42"]
        assert App.session_store is durable
        assert SharedChild.session_store is Support.session_store
        assert Audited.session_store not in (durable, Agent.session_store)

    def test_a_store_listed_after_agent_by_a_base_is_refused_as_hidden(self) -> None:
        class Plain(Agent):
            pass

        class StoreMixin:
            session_store = InMemorySessionStore()

        with pytest.raises(ConfigurationError, match=r"StoreMixin\.session_store is hidden"):

            class Both(Plain, StoreMixin):  # MRO: Both, Plain, Agent, StoreMixin
                pass


def test_settings_of_a_class_that_declares_none_cannot_change_every_class() -> None:
    """``Agent``'s empty settings are every such class's: changing them in place is
    refused, not sent by every agent; a class's own settings change through it."""

    class Quiet(Agent):
        pass

    class Tuned(Agent):
        settings = {"temperature": 0.2}

    with pytest.raises(TypeError):
        Quiet.settings["temperature"] = 0.0  # type: ignore[index]
    with pytest.raises(TypeError):
        Quiet(model=ScriptedModel([])).settings["seed"] = 7  # type: ignore[index]
    Tuned.settings["seed"] = 7  # type: ignore[index]
    model = ScriptedModel([text_response("ok")])
    Support(model=model).run_sync("hi")
    assert dict(model.requests[0].settings) == {}
    assert Tuned.settings == {"temperature": 0.2, "seed": 7}


def test_settings_change_in_place_through_the_class_that_declares_them_alone() -> None:
    """Read through a subclass, an instance or an agent class using a mixin, a class's
    settings are read-only: changed there in place, they changed what the class, its
    other subclasses and their instances sent. Changed through the class that declares
    them, they reach them all at the next run."""

    class Tuned(Agent):
        settings = {"temperature": 0.2}

    class Guard:
        settings = {"top_k": 3}

    class Fast(Tuned):
        pass

    class Slow(Tuned):
        pass

    class Guarded(Guard, Agent):
        pass

    class AlsoGuarded(Guard, Agent):
        pass

    for through in (Fast, Tuned(model=ScriptedModel([])), Guarded):
        with pytest.raises(TypeError):
            through.settings["seed"] = 7  # type: ignore[index]
    Tuned.settings["seed"] = 1  # type: ignore[index]
    Guard.settings["seed"] = 2
    sent = []
    for agent_class in (Tuned, Fast, Slow, Guarded, AlsoGuarded):
        model = ScriptedModel([text_response("ok")])
        agent_class(model=model).run_sync("hi")
        sent.append(dict(model.requests[0].settings))
    assert sent == [{"temperature": 0.2, "seed": 1}] * 3 + [{"top_k": 3, "seed": 2}] * 2


def test_settings_taken_from_another_class_are_its_own_copy() -> None:
    """A class declaring another's settings (``settings = Tuned.settings``, the mutable
    ones read through ``Tuned``) declares a copy: changed in place through it, they
    changed ``Tuned``'s, and changed through ``Tuned``, its."""

    class Tuned(Agent):
        settings = {"temperature": 0.2}

    class Same(Agent):
        settings = Tuned.settings

    class Child(Tuned):
        settings = Tuned.settings

    Same.settings["seed"] = 1  # type: ignore[index]
    Child.settings["top_k"] = 3  # type: ignore[index]
    Tuned.settings["top_p"] = 0.5  # type: ignore[index]
    assert (Tuned.settings, Same.settings, Child.settings) == (
        {"temperature": 0.2, "top_p": 0.5},
        {"temperature": 0.2, "seed": 1},
        {"temperature": 0.2, "top_k": 3},
    )


def test_views_built_in_many_threads_at_once_never_trip_over_each_other() -> None:
    """Runs in a thread pool (``run_sync``) build their views at once; the index of the
    logs seen lately they share is kept whole (an unguarded one raised ``KeyError`` a few
    times in 10 000 calls when threads switched at the wrong moment, made frequent here)."""
    errors: list[BaseException] = []

    def build(thread: int) -> None:
        try:
            log = [Message.user(f"hi {thread}")]
            for index in range(700):
                log.append(Message.assistant(f"a{index}") if index % 2 else Message.user("q"))
                preview_request(ModelRequest(tuple(log)), log, None, 4_000)
                if index % 50 == 0:
                    log = [Message.user(f"hi {thread} {index}")]
        except BaseException as error:
            errors.append(error)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=build, args=(thread,)) for thread in range(16)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []


class Closeable:
    """A model that fails if used after it was closed (a client tied to one loop)."""

    provider = "closeable"
    context_window = None
    made: list[Closeable] = []
    lock = threading.Lock()

    def __init__(self, name: str | None) -> None:
        self.name = name or "closeable"
        self.closed = False
        with Closeable.lock:
            Closeable.made.append(self)

    async def respond(self, request: ModelRequest) -> ModelResponse:
        import anyio

        await anyio.sleep(0.05)
        if self.closed:
            raise RuntimeError("used after close")
        return text_response("ok")

    async def aclose(self) -> None:
        self.closed = True


def test_run_sync_from_several_threads_on_one_agent() -> None:
    register_provider("closeable", Closeable)

    class Threaded(Agent):
        model = "closeable:m"

    agent = Threaded()
    Closeable.made.clear()
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda i: agent.run_sync(f"hi {i}").output, range(12)))
    assert results == ["ok"] * 12
    assert len(Closeable.made) == 12  # each call owned its model
    assert all(model.closed for model in Closeable.made)


class TestTheContextParameter:
    async def test_the_parameter_annotated_run_context_receives_it(self) -> None:
        seen: list[Any] = []

        class Tools(Agent):
            @tool
            async def where(self, ctx: RunContext, context: str) -> str:
                """Say where we are.

                Args:
                    context: Some context the model gives.
                """
                seen.append((ctx, context))
                return "here"

        model = ScriptedModel(
            [tool_call_response("where", {"context": "a hint"}), text_response("x")]
        )
        agent = Tools(model=model)
        await agent.run("Go.")
        [(ctx, context)] = seen
        assert isinstance(ctx, RunContext) and ctx.agent is agent
        assert context == "a hint"
        [spec] = model.requests[0].tools
        assert set(spec.parameters["properties"]) == {"context"}


class TestBadInputStoresNothing:
    async def test_a_user_input_holding_tool_parts(self) -> None:
        store = InMemorySessionStore()
        agent = Support(model=ScriptedModel([echo]), session_store=store)
        for part in (ToolCall("c", "t", {}), ReasoningPart("thought", None, "x")):
            bad = Message("user", (part,))
            with pytest.raises(
                ConfigurationError,
                match=r"user.* carries only TextPart, ImagePart parts, not (ToolCall|ReasoningPart)",
            ):
                await agent.run(bad, session_id="s")
        assert await store.list_sessions() == ()

    async def test_an_input_already_in_the_log(self) -> None:
        store = InMemorySessionStore()
        agent = Support(model=ScriptedModel([echo, echo]), session_store=store)
        first = Message.user("first")
        await agent.run(first, session_id="s")
        before = await store.load("s")
        with pytest.raises(ConfigurationError, match="already in the session"):
            await agent.run(first, session_id="s")
        assert await store.load("s") == before
        with pytest.raises(ConfigurationError, match="already in the history"):
            await agent.run(first, history=[first])

    @pytest.mark.parametrize(
        ("settings", "named"),
        [
            ({"messages": []}, "messages"),
            ({"tools": []}, "tools"),
            ({"model": "other"}, "model"),
            ({"stream": True}, "stream"),
            ({"max_tokens": "10"}, "max_tokens"),
            ({"max_tokens": 2.5}, "max_tokens"),
            ({"temperature": math.nan}, "temperature"),
            ({"top_p": 3}, "top_p"),
            ({"repeat_penalty": math.inf}, "repeat_penalty.*NaN or an infinity"),
            ({"logit_bias": {"50256": -math.inf}}, "logit_bias.*NaN or an infinity"),
            ({"mirostat": [1, (2, math.nan)]}, "mirostat.*NaN or an infinity"),
            ({"extra": SELF_HOLDING}, "extra.*nested too deep"),
        ],
    )
    async def test_reserved_or_mistyped_settings(
        self, settings: dict[str, Any], named: str
    ) -> None:
        with pytest.raises(ConfigurationError, match=named):  # at class definition
            type("Declared", (Agent,), {"settings": settings})
        store = InMemorySessionStore()
        agent = Support(model=ScriptedModel([echo]), session_store=store)
        with pytest.raises(ConfigurationError, match=named):
            await agent.run("hi", settings=settings, session_id="s")
        assert await store.list_sessions() == ()

    @pytest.mark.parametrize(
        ("session_id", "error"),
        [("", TypeError), ("x" * 257, UnstorableValueError), ("a\x00b", UnstorableValueError)],
    )
    async def test_empty_or_overlong_session_ids(
        self, session_id: str, error: type[Exception]
    ) -> None:
        store = InMemorySessionStore()
        agent = Support(model=ScriptedModel([echo]), session_store=store)
        with pytest.raises(error):
            await agent.run("hi", session_id=session_id)
        assert await store.list_sessions() == ()


class TestUndeclaredToolNames:
    async def test_an_undeclared_name_never_reaches_telemetry(self, spans: Spans) -> None:
        model = ScriptedModel([tool_call_response("call_me_maybe_4111", {}), text_response("x")])
        await Support(model=model).run("Go.")
        span = spans.one("execute_tool")
        assert span.name == "execute_tool undeclared"
        assert "call_me_maybe_4111" not in str(dict(span.attributes or {}))

    async def test_with_capture_content_it_does(self, spans: Spans) -> None:
        model = ScriptedModel([tool_call_response("call_me_maybe_4111", {}), text_response("x")])
        await Support(model=model, capture_content=True).run("Go.")
        assert spans.one("execute_tool").name == "execute_tool call_me_maybe_4111"


@pytest.mark.parametrize("managed", [False, True])
async def test_a_run_keeps_nothing_of_its_callers_history(managed: bool) -> None:
    """A service passing each request's conversation as ``history=`` keeps none of them
    once the runs, their results and the agent are dropped (the engine kept the last
    few)."""
    import gc
    import weakref

    from littleghost import manage_context

    agent_class: type[Agent] = (
        manage_context(context_window_tokens=100_000)(type("Managed", (Support,), {}))
        if managed
        else Support
    )
    agent = agent_class(model=ScriptedModel([echo] * 20))
    seen: list[weakref.ref[Message]] = []
    for request in range(12):
        history = [
            m for i in range(5) for m in (Message.user(f"{request}.{i}"), Message.assistant("ok"))
        ]
        seen += map(weakref.ref, history)
        result = await agent.run("next", history=history)
        assert result.output.startswith(f"{request}.0")
        del history, result
    del agent  # its ScriptedModel keeps the requests it was sent
    gc.collect()
    assert [ref() for ref in seen if ref() is not None] == []


async def test_compacting_a_stored_session_keeps_nothing_of_it() -> None:
    """``compact_session`` run as a maintenance job over many sessions keeps none of
    their logs once the store is dropped (the engine kept the last few)."""
    import gc

    from littleghost.context import Truncation, compact_session

    store = InMemorySessionStore()
    for session in range(12):
        chat = [(Message.user(f"kept? {session}.{i}"), Message.assistant("a")) for i in range(6)]
        await store.append(str(session), [m for pair in chat for m in pair])
    for session in range(12):
        records = await compact_session(store, str(session), Truncation(minimum_preserved=2))
        assert records
    del store, records, chat
    gc.collect()
    alive = [o for o in gc.get_objects() if isinstance(o, Message) and "kept?" in o.text]
    assert alive == []


def erasable_conversation(secret: str) -> list[Message]:
    """Ten turns of a support chat with ``secret`` in a question, a tool call's arguments,
    its result and an answer (only these messages hold texts with it)."""
    log: list[Message] = []
    for turn in range(10):
        call = ToolCall(f"call_{turn}", "look_up", {"card": f"{secret} {turn}"})
        log += [
            Message.user(f"Turn {turn}: my card is {secret}, is it blocked?"),
            Message.assistant(tool_calls=[call]),
            Message.tool(call.id, f"card {secret}: not blocked " * 20),
            Message.assistant(f"Card {secret} is not blocked."),
        ]
    return log


def holders_of(secret: str) -> list[object]:
    """Every object the garbage collector tracks that holds a text with ``secret`` in it
    (``secret`` alone aside: the test holds it).

    Modules aside: what a module holds is in its ``__dict__``, tracked and searched on its
    own, and traversing a module visits its C state, where ``_asyncio``'s hands back freed
    ``FutureIter`` memory as objects (CPython gh-122695, in 3.12.1 say): releasing them
    again corrupts that free list, and a later collection crashes or loops forever.
    """

    def holds(*holders: object) -> bool:
        return any(
            type(held) is str and secret in held and held != secret
            for held in gc.get_referents(*holders)
        )

    # A slice of objects at a time (one call for their referents, a few times faster over
    # a whole test run's heap), each object of a slice that holds one looked at alone.
    tracked = gc.get_objects()
    found = []
    for start in range(0, len(tracked), 1_000):
        some = [o for o in tracked[start : start + 1_000] if not isinstance(o, types.ModuleType)]
        if holds(*some):
            found += [holder for holder in some if holds(holder)]
    return found


@pytest.mark.parametrize("kind", KINDS)
async def test_a_deleted_session_leaves_no_copy_of_its_text_in_the_process(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """An erasure request: a session an application loaded and gave the context engine
    (``apply_compaction``, ``preview_request``, ``compact_log``), then deleted through its
    store, leaves no object in the process holding its text once the application lets go
    of what it loaded (the engine kept it among its recent logs until then)."""
    secret = uuid.uuid4().hex
    async with open_store(kind, tmp_path, request) as store:
        await store.append("customer-7", erasable_conversation(secret))
        log = await store.load("customer-7")
        loaded = weakref.ref(log[0])
        await apply_compaction(log, TokenBudget(token_budget=300))
        agent = manage_context(context_window_override=2_000)(type("Erasing", (Support,), {}))(
            model=ScriptedModel([text_response("- They asked whether a card is blocked.")])
        )
        config = agent.context_management
        assert config is not None
        preview_request(ModelRequest(build_view(log), (), {}), log, config, 2_000)
        assert await compact_log(agent, log)
        del log, agent, config
        gc.collect()
        assert loaded() is not None  # the engine keeps what it was given lately

        await store.delete("customer-7")
        gc.collect()
        assert loaded() is None
        assert holders_of(secret) == []


async def test_forget_recent_logs_lets_go_of_a_conversation_kept_outside_a_store() -> None:
    """An application that keeps its conversations itself erases one, then calls
    ``forget_recent_logs``: no object in the process holds its text any more."""
    secret = uuid.uuid4().hex
    log = erasable_conversation(secret)
    given = weakref.ref(log[0])
    await apply_compaction(log, TokenBudget(token_budget=300))
    del log
    gc.collect()
    assert given() is not None  # the engine keeps what it was given lately

    forget_recent_logs()
    gc.collect()
    assert given() is None
    assert holders_of(secret) == []
