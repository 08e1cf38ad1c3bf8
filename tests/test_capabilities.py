"""The capability protocol: add_capability, hook order, Agent.capabilities, per-run state."""

from __future__ import annotations

import enum
import gc
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from attrs import frozen

from littleghost import Agent, RunContext, before_model, manage_context, tool
from littleghost.capabilities import Capability, CapabilityHook, add_capability
from littleghost.errors import ConfigurationError
from littleghost.models import ModelRequest, ModelResponse
from littleghost.runner import plan_run, run
from littleghost.testing import ScriptedModel, text_response, tool_call_response

if TYPE_CHECKING:
    from conftest import Spans

pytestmark = pytest.mark.anyio


class Calls:
    """A capability's per-run data: how many model calls it saw."""

    def __init__(self) -> None:
        self.count = 0


def counted(label: str) -> Callable[[type[Agent]], type[Agent]]:
    """A small capability: counts the run's model calls in its per-run state."""

    def before(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        calls = context.state_for(counted, Calls)
        calls.count += 1
        agent.order.append(f"{label}:{calls.count}")

    def after(agent: Any, response: ModelResponse, *, context: RunContext) -> None:
        agent.seen.append(context.state_for(counted, Calls).count)

    capability = Capability(
        "counted", [CapabilityHook("before_model", before), CapabilityHook("after_model", after)]
    )

    def decorate(cls: type[Agent]) -> type[Agent]:
        add_capability(cls, capability)
        return cls

    return decorate


def marked(cls: type[Agent]) -> type[Agent]:
    """Another capability, with one hook."""

    def hook(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        agent.order.append("marked")

    add_capability(cls, Capability("marked", [CapabilityHook("before_model", hook)]))
    return cls


class Base(Agent):
    def __init__(self, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.order: list[str] = []
        self.seen: list[int] = []

    @before_model
    def parent(self, request: ModelRequest) -> None:
        self.order.append("parent")

    @tool
    def ping(self) -> str:
        """Answer pong."""
        return "pong"


@counted("child")
class Child(Base):
    @before_model
    def own(self, request: ModelRequest) -> None:
        self.order.append("own")


class Grandchild(Child):
    @before_model
    def later(self, request: ModelRequest) -> None:
        self.order.append("later")


@counted("again")
class Redeclared(Grandchild):
    pass


@marked
@counted("both")
class Both(Base):
    pass


def steps() -> list[ModelResponse]:
    """One run's script: a tool call, then the answer."""
    return [tool_call_response("ping", {}), text_response("done")]


def script() -> ScriptedModel:
    return ScriptedModel(steps())


async def orders(agent_class: type[Base]) -> tuple[list[str], list[int]]:
    agent = agent_class(model=script())
    await agent.run("hi")
    return agent.order, agent.seen


async def test_capability_hooks_run_after_the_parents_and_before_the_class_own() -> None:
    """The decorated class's capability runs between its parents' hooks and its own."""
    order, _ = await orders(Child)
    assert order == ["parent", "child:1", "own", "parent", "child:2", "own"]


async def test_a_subclass_keeps_the_capability_in_its_place() -> None:
    """A subclass's own hooks run after the inherited capability."""
    order, _ = await orders(Grandchild)
    assert order[:4] == ["parent", "child:1", "own", "later"]


async def test_redeclaring_replaces_the_capability_in_the_subclass_place() -> None:
    """Adding the capability again on a subclass moves its hooks there and replaces it."""
    order, _ = await orders(Redeclared)
    assert order[:4] == ["parent", "own", "later", "again:1"]
    parent_order, _ = await orders(Child)
    assert parent_order[:3] == ["parent", "child:1", "own"]


async def test_capabilities_on_one_class_run_in_the_order_they_were_added() -> None:
    """Class decorators apply bottom up, so the innermost one's hooks run first."""
    order, _ = await orders(Both)
    assert order[:3] == ["parent", "both:1", "marked"]


def test_agent_capabilities_shows_what_is_in_effect() -> None:
    """Agent.capabilities is () and each class shows its own and inherited capabilities."""
    assert Agent.capabilities == ()
    assert Base.capabilities == ()
    assert [c.name for c in Child.capabilities] == ["counted"]
    assert Grandchild.capabilities == Child.capabilities
    assert [c.name for c in Redeclared.capabilities] == ["counted"]
    assert Redeclared.capabilities[0] is not Child.capabilities[0]
    assert [c.name for c in Both.capabilities] == ["counted", "marked"]
    assert [h.kind for h in Child.capabilities[0].hooks] == ["before_model", "after_model"]


def test_manage_context_is_a_capability() -> None:
    """manage_context adds a capability named manage_context."""
    managed = manage_context(type("Managed", (Child,), {}))
    assert [c.name for c in managed.capabilities] == ["counted", "manage_context"]


async def test_adding_to_a_parent_reaches_its_existing_subclasses() -> None:
    """A capability added to a class with subclasses is in effect for them too."""
    parent = type("Parent", (Base,), {})
    child = type("Kid", (parent,), {})
    marked(parent)
    assert [c.name for c in child.capabilities] == ["marked"]
    order, _ = await orders(child)
    assert order[:2] == ["parent", "marked"]


async def test_per_run_state_is_shared_by_the_hooks_and_fresh_each_run() -> None:
    """Both hooks of a capability see one object in a run; the next run starts anew."""
    agent = Child(model=ScriptedModel(steps() * 2))
    await agent.run("first")
    await agent.run("second")
    assert agent.seen == [1, 2, 1, 2]


async def test_per_run_state_is_fresh_in_a_stream_too() -> None:
    """stream() runs the same loop: the state starts anew there as well."""
    agent = Child(model=ScriptedModel(steps() * 2))
    await agent.run("first")
    async with agent.stream("second") as events:
        async for _ in events:
            pass
    assert agent.seen == [1, 2, 1, 2]
    assert events.result.output == "done"


@frozen
class Owner:
    name: str


async def test_state_for_is_keyed_by_identity() -> None:
    """Two owners that compare equal still get objects of their own."""
    seen: list[bool] = []

    def check(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        first, second = Owner("same"), Owner("same")
        seen.append(context.state_for(first, list) is context.state_for(second, list))
        seen.append(context.state_for(first, list) is context.state_for(first, list))

    checked = type("Checked", (Agent,), {})
    add_capability(checked, Capability("check", [CapabilityHook("before_model", check)]))
    await checked(model=ScriptedModel([text_response("ok")])).run("hi")
    assert seen == [False, True]


@pytest.mark.parametrize(
    "make", [lambda n: f"calls-{n}", lambda n: n * 1000, lambda n: ("calls", n), lambda n: None]
)
async def test_state_for_refuses_an_owner_compared_by_value(make: Callable[[int], object]) -> None:
    """A name, a number or a tuple made at each call is a new object, so its state would
    be made anew at each ask, without a word: it is a TypeError saying what an owner is,
    and so is None, which every careless owner would share."""
    said: list[str] = []

    def check(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        with pytest.raises(TypeError) as caught:
            context.state_for(make(len(said) + 7), list)
        said.append(str(caught.value))

    checked = type("Checked", (Agent,), {})
    add_capability(checked, Capability("check", [CapabilityHook("before_model", check)]))
    await checked(model=ScriptedModel([text_response("ok")])).run("hi")
    assert len(said) == 1
    assert said[0].startswith("context.state_for(owner, factory): the owner is known by")


class _Owner(str, enum.Enum):
    CACHE = "cache"


class _Slot(enum.IntEnum):
    CACHE = 1


@pytest.mark.parametrize("owner", [_Owner.CACHE, _Slot.CACHE])
async def test_state_for_takes_an_enum_member_of_a_value_type(owner: object) -> None:
    """An enum member is one object for good, though a str or int: an owner, as any
    other object of one's own, not a value made anew."""
    seen: list[bool] = []

    def check(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        seen.append(context.state_for(owner, list) is context.state_for(owner, list))

    checked = type("Checked", (Agent,), {})
    add_capability(checked, Capability("check", [CapabilityHook("before_model", check)]))
    await checked(model=ScriptedModel([text_response("ok")])).run("hi")
    assert seen == [True]


async def test_state_for_is_one_object_for_a_factory_that_asks_for_it_and_needs_one() -> None:
    """A factory that asks for its owner's object (a graph of per-run state) gets the
    object every later ask gets; a factory that cannot be called is a TypeError naming
    it, before anything is stored."""
    seen: list[object] = []
    owner = Owner("graph")

    def check(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        def made() -> list[object]:
            seen.append(context.state_for(owner, list))
            return ["outer"]

        seen.append(context.state_for(owner, made))
        seen.append(context.state_for(owner, list))
        with pytest.raises(TypeError, match=r"factory must be callable .* not dict"):
            context.state_for(Owner("other"), {})  # type: ignore[arg-type]

    checked = type("Checked", (Agent,), {})
    add_capability(checked, Capability("check", [CapabilityHook("before_model", check)]))
    await checked(model=ScriptedModel([text_response("ok")])).run("hi")
    assert len(seen) == 3 and seen[0] is seen[1] is seen[2]


class Counter:
    """A class-based capability: its hook is a bound method, also its per-run state's owner."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def before(self, agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        calls = context.state_for(self.before, Calls)
        calls.count += 1
        self.seen.append(calls.count)


async def test_state_for_knows_a_bound_method_by_its_instance_and_function() -> None:
    """A bound method, a new object at each access, owns one object per run; another
    instance's method owns another."""
    first, second = Counter(), Counter()
    counting = type("Counting", (Base,), {})
    add_capability(
        counting,
        Capability(
            "counter",
            [
                CapabilityHook("before_model", first.before),
                CapabilityHook("before_model", second.before),
            ],
        ),
    )
    agent = counting(model=ScriptedModel(steps() * 2))
    await agent.run("first")
    await agent.run("second")
    assert first.seen == second.seen == [1, 2, 1, 2]


def audited(cls: type[Agent]) -> type[Agent]:
    """A class decorator whose hook refers to the class it decorates."""

    def hook(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        agent.order.append(cls.__name__)

    add_capability(cls, Capability("audited", [CapabilityHook("before_model", hook)]))
    return cls


async def test_a_class_whose_capability_refers_to_it_is_collected() -> None:
    """Classes made at run time, each with a capability hook that refers to it, and their
    session stores are collected once dropped, whether or not they ran. (Once, in a CI run
    under trio on Python 3.10, the class that ran last was still alive after one
    collection; not reproduced since. The loop now gets up to a few turns, and a failure names
    what holds each survivor.)"""
    classes = [audited(type(f"Tenant{i}", (Base,), {})) for i in range(3)]
    for cls in classes[:2]:
        agent = cls(model=script())
        await agent.run("hi", session_id="s")
        assert agent.order[:2] == ["parent", cls.__name__]
    audited(classes[0])  # adding again replaces the capability and the cached plan
    refs = [weakref.ref(cls) for cls in classes]
    stores = [weakref.ref(cls.session_store) for cls in classes]
    del classes, cls, agent
    for _ in range(3):  # up to a few turns of the event loop, for cleanup it runs later
        gc.collect()
        await anyio.sleep(0.01)
        if all(ref() is None for ref in refs + stores):
            break
    alive = [ref() for ref in refs + stores if ref() is not None]
    assert not alive, [(kept, list(map(type, gc.get_referrers(kept)))) for kept in alive]


def test_bad_capabilities_fail() -> None:
    """add_capability takes a subclass of Agent (not Agent, whose capabilities would be
    every agent class's) and a Capability; Capability checks itself."""
    hook = CapabilityHook("before_model", lambda agent, request, context: None)
    with pytest.raises(ConfigurationError, match="Agent subclass"):
        add_capability(object, Capability("x", [hook]))
    with pytest.raises(ConfigurationError, match="not Agent itself: every agent class would"):
        add_capability(Agent, Capability("x", [hook]))
    assert Agent.capabilities == Base.capabilities == ()
    with pytest.raises(ConfigurationError, match="takes a Capability"):
        add_capability(Base, "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="name"):
        Capability("", [hook])
    with pytest.raises(ConfigurationError, match="sequence of hooks"):
        Capability("x", hook)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="CapabilityHook"):
        Capability("x", [lambda agent, request: None])  # type: ignore[list-item]
    with pytest.raises(ConfigurationError, match="capabilities"):
        type("Declares", (Agent,), {"capabilities": (Capability("x", [hook]),)})


async def test_the_runner_entry_runs_an_agent_as_run_does() -> None:
    """runner.run with a plan from plan_run gives what agent.run gives."""
    agent = Child(model=script())
    result = await run(agent, plan_run(agent, "hi"))
    ran = await Child(model=script()).run("hi")
    assert (result.output, result.usage, len(result.messages)) == (
        ran.output,
        ran.usage,
        len(ran.messages),
    )
    names = [hook.name for hook in agent.hooks["before_model"]]
    assert names == ["parent", "counted.<locals>.before", "own"]


def test_what_the_runner_reads_of_an_agent() -> None:
    """resolve_model() and find_tool() are how the runner reaches the model and tools."""
    model = script()
    agent = Child(model=model)
    assert agent.resolve_model() is model
    found = agent.find_tool("ping")
    assert found is not None
    definition, function = found
    assert (definition.name, function()) == ("ping", "pong")
    assert agent.find_tool("nope") is None


def calling(act: Callable[[RunContext], object]) -> type[Agent]:
    """An agent class whose capability does ``act`` with the run context before each call."""

    def before(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        act(context)

    class Acting(Agent):
        pass

    add_capability(Acting, Capability("acting", [CapabilityHook("before_model", before)]))
    return Acting


@pytest.mark.parametrize(
    ("attributes", "error", "said"),
    [
        ("retrieval.documents", TypeError, r"takes a mapping .* not str"),
        ([("retrieval.documents", 3)], TypeError, r"takes a mapping .* not list"),
        ({3: 1}, TypeError, r"an attribute name must be a str, not int"),
        ({"retrieval.scores": {"a": 1}}, TypeError, r"'retrieval.scores' must be .* not dict"),
        ({"retrieval.ids": [1, "a"]}, TypeError, r"'retrieval.ids' must be .* not list"),
        ({"gen_ai.request.model": "gpt-5"}, ConfigurationError, r"'gen_ai.request.model' is"),
        ({"server.address": "x"}, ConfigurationError, r"'server.address' is"),
        ({"error.type": "x"}, ConfigurationError, r"'error.type' is"),
    ],
    ids=["str", "pairs", "name", "dict", "mixed", "gen_ai", "server", "error"],
)
async def test_an_annotation_a_span_cannot_keep_is_refused_naming_it(
    attributes: Any, error: type[Exception], said: str
) -> None:
    """annotate_next_call takes names of the capability's own and values a span keeps
    (a str, bool, int or float, or a list of one kind of them): another value, which the
    SDK would drop with a warning, a name of the conventions' that the call's span (and
    the metrics) hold for its own figures, or no mapping at all fail where they are given."""
    model = ScriptedModel([text_response("never")])
    with pytest.raises(error, match=f"annotate_next_call.*{said}"):
        await calling(lambda context: context.annotate_next_call(attributes))(model=model).run("hi")
    assert model.requests == []


async def test_annotations_a_span_keeps_land_on_the_turns_call(spans: Spans) -> None:
    """Figures of every kind a span keeps, lists of one kind included (with ``None``
    among them, as the SDK keeps them), reach the span; a name given ``None`` (an optional
    figure of a capability) is left off, a figure given before under it too."""
    kept = {"retrieval.hit": True, "retrieval.documents": 3, "retrieval.ids": ["a", "b"]}
    kept |= {"retrieval.score": 0.5, "retrieval.ranks": (1, None), "retrieval.mode": "dense"}
    model = ScriptedModel([text_response("ok")])

    def annotate(context: RunContext) -> None:
        context.annotate_next_call({**kept, "retrieval.best": 0.9})
        context.annotate_next_call({"retrieval.best": None, "retrieval.worst": None})

    await calling(annotate)(model=model).run("hi")
    (call,) = spans.named("chat")
    attributes = call.attributes or {}
    assert {name: attributes[name] for name in kept} == {**kept, "retrieval.ids": ("a", "b")}
    assert "retrieval.best" not in attributes
    assert "retrieval.worst" not in attributes


@pytest.mark.parametrize("usage", [5, None, {"input_tokens": 3}])
async def test_add_usage_takes_a_usage(usage: Any) -> None:
    """A capability that counts its own calls (an embedding's) adds a Usage; anything else
    is a TypeError saying so, not Python's about an operand."""
    model = ScriptedModel([text_response("never")])
    with pytest.raises(TypeError, match=r"context.add_usage\(\) takes a Usage"):
        await calling(lambda context: context.add_usage(usage))(model=model).run("hi")
