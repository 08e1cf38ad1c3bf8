"""The Agent class DSL: declarations, inheritance, overrides, decorators, bad declarations."""

from __future__ import annotations

import copy
import dataclasses
import functools
import inspect
import itertools
import math
import pickle
import re
import time
import types
import typing
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import attrs
import pytest
import trio
import typing_extensions
from attrs import field, frozen, validators

from littleghost import (
    Agent,
    ImagePart,
    Message,
    RunContext,
    ToolCall,
    after_tool,
    before_model,
    manage_context,
    tool,
)
from littleghost.agent import AgentOptions
from littleghost.capabilities import Capability, CapabilityHook, add_capability
from littleghost.errors import ConfigurationError, DeadlineExceededError
from littleghost.models import ModelRequest, ModelResponse, register_provider
from littleghost.models.openai import OpenAIModel
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

pytestmark = pytest.mark.anyio


def ping() -> str:
    """Answer pong."""
    return "pong"


def echo(text: str) -> str:
    """Echo the text back."""
    return text


class Parent(Agent):
    model = ScriptedModel([], name="parent model")
    instructions = "parent instructions"
    tools = [ping]
    settings = {"temperature": 0.5}
    max_turns = 7
    max_tool_calls = 9
    max_tool_result_tokens = 11
    max_retries = 1
    capture_content = True

    @tool
    async def lookup(self, key: str) -> str:
        """Look a key up."""
        return f"parent:{key}"


class Child(Parent):
    pass


class Overrider(Parent):
    instructions = "child instructions"
    tools = [echo]
    max_turns = 2

    @tool
    async def lookup(self, key: str) -> str:
        """Look a key up, the child's way."""
        return f"child:{key}"

    @tool
    async def extra(self) -> str:
        """A tool only the child has."""
        return "extra"


async def first_request(agent_class: type[Agent], **overrides: Any) -> ModelRequest:
    """Run one turn of ``agent_class`` and return what the model was sent."""
    model = ScriptedModel([text_response("ok")])
    await agent_class(model=model, **overrides).run("hi")
    return model.requests[0]


KNOBS = (
    "model",
    "instructions",
    "tools",
    "settings",
    "max_turns",
    "max_tool_calls",
    "max_tool_result_tokens",
    "max_retries",
    "capture_content",
)


@pytest.mark.parametrize("knob", KNOBS)
def test_subclass_inherits_every_declaration(knob: str) -> None:
    """A subclass that declares nothing has every value of its parent."""
    assert getattr(Child(), knob) == getattr(Parent(), knob) != getattr(Agent(), knob)


def test_agent_defaults() -> None:
    """The base Agent's limits and knobs have the documented defaults."""
    agent = Agent()
    assert (agent.max_turns, agent.max_tool_calls, agent.max_tool_result_tokens) == (
        100,
        1000,
        10_000,
    )
    assert (agent.max_retries, agent.capture_content, Agent.context_management) == (3, False, None)


def test_subclass_inherits_tools() -> None:
    """Method tools and function tools both pass to a subclass."""
    assert {spec.name for spec in Child().tool_specs} == {"ping", "lookup"}


def test_subclass_declarations_replace_the_parents() -> None:
    """A subclass's own declarations win: tools list, overridden tool, new tool."""
    assert {spec.name for spec in Overrider().tool_specs} == {"echo", "lookup", "extra"}
    assert Overrider.max_turns == 2


def test_declaring_on_a_subclass_leaves_the_parent_alone() -> None:
    """The parent keeps its instructions, limits and tools after a subclass redeclares them."""
    assert (Parent.instructions, Parent.max_turns) == ("parent instructions", 7)
    assert {spec.name for spec in Parent().tool_specs} == {"ping", "lookup"}
    description = {spec.name: spec.description for spec in Parent().tool_specs}["lookup"]
    assert description == "Look a key up."


async def test_subclass_sends_its_own_instructions() -> None:
    """Parent, inheriting child and overriding child send the right instructions."""
    assert (await first_request(Parent)).messages[0].text == "parent instructions"
    assert (await first_request(Child)).messages[0].text == "parent instructions"
    assert (await first_request(Overrider)).messages[0].text == "child instructions"


async def test_request_carries_settings_and_tool_specs() -> None:
    """The class settings and tool specs reach the model request."""
    request = await first_request(Child)
    assert request.settings == {"temperature": 0.5}
    assert {spec.name for spec in request.tools} == {"ping", "lookup"}


def test_constructor_keywords_override_one_instance() -> None:
    """A constructor keyword changes that instance only, not the class or other instances."""
    tuned = Parent(max_turns=3, instructions="tuned")
    assert (tuned.max_turns, tuned.instructions) == (3, "tuned")
    assert (Parent.max_turns, Parent().max_turns, Parent.instructions) == (
        7,
        7,
        "parent instructions",
    )


def test_agent_options_name_every_constructor_keyword() -> None:
    """``AgentOptions``, the constructor's keywords for a type checker, names exactly
    the knobs ``Agent(...)`` takes, each with the type of its declaration."""
    with pytest.raises(TypeError, match=r"it takes (.*)$") as raised:
        Agent(nonsense=1)  # type: ignore[call-arg]
    taken = str(raised.value).split("it takes ")[1].split(", ")
    assert sorted(AgentOptions.__optional_keys__) == taken
    for knob in taken:  # spelled alike (annotations are strings, a TypedDict's ForwardRefs)
        option = AgentOptions.__annotations__[knob]
        assert getattr(option, "__forward_arg__", option) == Agent.__annotations__[knob]


def test_the_constructor_signature_evaluates() -> None:
    """What evaluates ``Agent(...)``'s annotations (``typing.get_type_hints``, a web
    framework's dependency injection) reads them: ``Unpack`` is a runtime name."""
    assert "overrides" in typing.get_type_hints(Parent.__init__)
    assert "overrides" in inspect.signature(Parent, eval_str=True).parameters


@frozen
class Ticket:
    order_id: str


class TypedSupport(Agent[str]):
    instructions = "Help."


class TypedTriage(Agent[Ticket]):
    output_type = Ticket


_Output = typing.TypeVar("_Output")


class TypedBase(Agent[_Output]):
    """A class generic in its output: its subclasses or ``TypedBase[...]`` say which."""


async def test_an_agent_class_parameter_types_the_output_alone() -> None:
    """``Agent[str]`` is a base as ``Agent`` is, its class checked and set up; the
    parameter changes no run (``output_type`` does), and the agent copies, pickles and
    evaluates its annotations as any."""
    assert issubclass(TypedSupport, Agent) and TypedSupport.output_type is None
    assert [klass for klass in TypedTriage.__mro__ if issubclass(klass, Agent)] == [
        TypedTriage,
        Agent,
    ]
    for agent in (TypedSupport(), TypedBase[str](), TypedBase[Ticket](output_type=Ticket)):
        assert isinstance(agent, Agent)
        assert typing.get_type_hints(type(agent))["output_type"] is Any
        for copied in (copy.copy(agent), copy.deepcopy(agent), pickle.loads(pickle.dumps(agent))):
            assert type(copied) is type(agent)
            assert copied.output_type is agent.output_type
            assert copied.hooks.keys() == agent.hooks.keys()
    text = await TypedSupport(model=ScriptedModel([text_response("hi")])).run("Hello")
    assert text.output == "hi"
    answer = text_response('{"order_id": "42"}')
    ticket = await TypedTriage(model=ScriptedModel([answer])).run("Order 42?")
    assert ticket.output == Ticket("42")
    pending = await TypedBase[Ticket](model=ScriptedModel([answer])).run("Order 42?")
    assert pending.output == '{"order_id": "42"}'  # no output_type: the answer's text


def test_an_agent_whose_output_type_is_not_its_class_parameter_fails_as_made() -> None:
    """``Agent[Ticket]`` with no ``output_type`` (its runs answer text), or with one whose
    runs answer no ``Ticket`` (the class's, a subclass's, the constructor's), fails as the
    agent is made, naming both, and so does a subclass of a generic base given ``Ticket``
    for its type variable (through any depth of bases); a subclass of the parameter, a
    promoted number, a parameter that is no class and an ``output_type`` given by
    ``__init__`` pass."""

    class Urgent(Ticket):
        pass

    class Untyped(Agent[Ticket]):
        pass

    class Text(Agent[str]):
        output_type = Ticket

    class Dropped(TypedTriage):
        output_type = None

    class Specialised(TypedBase[Ticket]):  # the base's type variable, given here
        pass

    class Middle(TypedBase[_Output]):
        pass

    class Deeper(Middle[Ticket]):
        pass

    made = {
        "Untyped.output_type is None: its runs answer text": Untyped,
        r"Text is declared Agent\[str\], but Text.output_type is Ticket, not the str": Text,
        r"TypedTriage\(…, output_type=\) is str, not the Ticket": lambda: TypedTriage(
            output_type=str
        ),
        r"Dropped is declared Agent\[Ticket\] \(by its base TypedTriage\), but "
        "Dropped.output_type is None": Dropped,
        r"Specialised is declared Agent\[Ticket\] \(by its base TypedBase\)": Specialised,
        r"Deeper is declared Agent\[Ticket\] \(by its base TypedBase\)": Deeper,
    }
    for message, make in made.items():
        with pytest.raises(ConfigurationError, match=message) as caught:
            make()
        assert "set output_type = " in str(caught.value)

    class Narrower(Agent[Ticket]):
        output_type = Urgent

    class Number(Agent[float]):
        output_type = int

    class Listed(Agent[list[Ticket]]):
        pass

    class Given(Agent[Ticket]):
        def __init__(self) -> None:
            super().__init__(output_type=Ticket)

    class Generic(TypedBase[Ticket]):
        output_type = Ticket

    class Tagged(typing.Generic[_Output]):  # the same type variable, of another class
        pass

    class Mixed(Tagged[str], TypedBase[Ticket]):
        output_type = Ticket

    made_directly = TypedBase[Ticket]()  # the alias is no class: not compared
    for agent in (Narrower(), Number(), Listed(), Given(), Generic(), Mixed(), made_directly):
        assert isinstance(agent, Agent)


def test_an_agent_class_parameter_issubclass_cannot_compare_is_not_compared() -> None:
    """A ``TypedDict`` or a ``Protocol`` (whose classes refuse ``issubclass`` with a
    ``TypeError``) as the parameter makes the agent, with its own class or one that fits
    it as its ``output_type``: it was refused with that ``TypeError``; so does
    ``typing_extensions.Any`` without one (refused on Python 3.10, where it is a class)."""

    class Parcel(typing_extensions.TypedDict):
        weight: int

    class Other(typing_extensions.TypedDict):
        weight: int

    class Ordered(typing.Protocol):
        order_id: str

    @typing.runtime_checkable
    class Identified(typing.Protocol):
        def ident(self) -> str: ...

    @frozen
    class Named:
        order_id: str

        def ident(self) -> str:
            return self.order_id

    made = [
        (typing_extensions.Any, None),  # a class of its own on Python 3.10
        (Parcel, Parcel),
        (Parcel, Other),
        (dict, Parcel),
        (Ordered, Ticket),
        (Identified, Named),
    ]
    for declared, given in made:

        class Typed(Agent[declared]):  # type: ignore[valid-type]
            output_type = given

        assert isinstance(Typed(), Agent)
    # every pairing: made (its own class always), or refused with a ConfigurationError
    outputs = [None, Parcel, Named, Ticket, str, int, float, bool, dict]
    never_refused = [Parcel, Ordered, typing_extensions.Any, object]
    refused = 0
    for declared, given in itertools.product([*outputs[1:], Identified, *never_refused], outputs):

        class Paired(Agent[declared]):  # type: ignore[valid-type]
            output_type = given

        try:
            Paired()
        except ConfigurationError:
            assert declared is not given and declared not in never_refused, (declared, given)
            refused += 1
    assert refused > 40


def test_a_typed_agent_class_is_checked_as_any() -> None:
    """Its declarations are checked when it is defined, a mixin's too."""

    class Declares:
        instruction = "Help."

    with pytest.raises(ConfigurationError, match=r"Declares\.instruction.*instructions"):

        class Support(Declares, Agent[str]):
            pass


def test_constructor_tools_override_function_tools() -> None:
    """tools= given to the constructor replaces the function tools for that instance."""
    assert {spec.name for spec in Parent(tools=[echo]).tool_specs} == {"echo", "lookup"}
    assert {spec.name for spec in Parent().tool_specs} == {"ping", "lookup"}


def test_knobs_an_init_sets_before_agents_own_count_as_keywords() -> None:
    """A knob a subclass's ``__init__`` sets before ``super().__init__()`` is checked then,
    and ``tools`` set so are offered, as the same constructor keywords would be."""

    class Setting(Parent):
        def __init__(self, tools: list[Callable[..., Any]], max_turns: object) -> None:
            self.tools = tools
            self.max_turns = max_turns
            super().__init__()

    assert {spec.name for spec in Setting([echo], 3).tool_specs} == {"echo", "lookup"}
    with pytest.raises(ConfigurationError, match=r"Setting\.max_turns must be an int >= 1"):
        Setting([echo], 0)


async def test_constructor_model_overrides_class_model() -> None:
    """model= given to the constructor is used instead of the class's model."""

    class Declared(Agent):
        model = ScriptedModel([text_response("from the class")])

    result = await Declared(model=ScriptedModel([text_response("from the instance")])).run("hi")
    assert result.output == "from the instance"


async def test_model_string_resolves_through_the_registry() -> None:
    """A "provider:model" string is resolved through a registered provider."""
    built: list[str | None] = []

    def factory(name: str | None) -> ScriptedModel:
        built.append(name)
        return ScriptedModel([text_response("resolved")], name=name or "default")

    register_provider("dsltest", factory)

    class Stringly(Agent):
        model = "dsltest:tiny"

    assert (await Stringly().run("hi")).output == "resolved"
    assert built == ["tiny"]


async def test_no_model_fails_clearly() -> None:
    """Running an agent that declares no model raises ConfigurationError."""
    with pytest.raises(ConfigurationError, match="declares no model"):
        await Agent().run("hi")


@pytest.mark.parametrize("entry", ["run", "stream", "run_sync"])
async def test_bad_arguments_are_named_before_a_missing_model(entry: str) -> None:
    """Every entry point checks its arguments first, so the same call fails the same way."""
    agent = Agent()
    with pytest.raises(TypeError, match="timeout must be seconds >= 0"):
        if entry == "run":
            await agent.run("hi", timeout=-1)
        elif entry == "stream":
            async with agent.stream("hi", timeout=-1):
                pass
        else:
            await anyio.to_thread.run_sync(lambda: agent.run_sync("hi", timeout=-1))


@pytest.mark.parametrize("entry", ["run", "stream", "run_sync"])
async def test_a_wall_clock_deadline_is_refused(entry: str) -> None:
    """A deadline from time.time() is decades away on anyio's clock: it would be no
    deadline at all, so it is refused before the run, naming the clock to use."""
    agent = Agent(model=ScriptedModel([text_response("never")]))
    deadline = time.time() + 1
    with pytest.raises(ConfigurationError, match=r"wall-clock time.*anyio\.current_time"):
        if entry == "run":
            await agent.run("hi", deadline=deadline)
        elif entry == "stream":
            async with agent.stream("hi", deadline=deadline):
                pass
        else:
            await anyio.to_thread.run_sync(lambda: agent.run_sync("hi", deadline=deadline))
    assert (await agent.run("hi", deadline=math.inf)).output == "never"


def test_a_deadline_on_a_clock_counting_from_the_epoch_is_taken() -> None:
    """Only a deadline decades past the run's own clock is a wall-clock time: on a clock
    that counts from the epoch (a custom trio clock, a test's frozen time),
    anyio.current_time() + 30 is a deadline like any other."""

    class EpochClock(trio.abc.Clock):
        def start_clock(self) -> None:
            pass

        def current_time(self) -> float:
            return time.time()

        def deadline_to_sleep_time(self, deadline: float) -> float:
            return deadline - time.time()

    async def main() -> str:
        agent = Agent(model=ScriptedModel([text_response("done")]))
        return str((await agent.run("hi", deadline=anyio.current_time() + 30)).output)

    assert anyio.run(main, backend="trio", backend_options={"clock": EpochClock()}) == "done"


def test_run_sync_takes_a_monotonic_deadline() -> None:
    """run_sync()'s loop is asyncio's: time.monotonic() is its clock, as the wall-clock
    error says, so such a deadline stops the run when it passes."""

    async def stall(request: ModelRequest) -> ModelResponse:
        await anyio.sleep(30)
        raise AssertionError("the deadline did not stop the call")

    agent = Agent(model=ScriptedModel([stall]))
    began = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        agent.run_sync("hi", deadline=time.monotonic() + 0.2)
    assert time.monotonic() - began < 5


async def test_callable_instructions_receive_the_context() -> None:
    """Instructions given as a function receive the RunContext."""
    seen: list[RunContext] = []

    def instructions(context: RunContext) -> str:
        seen.append(context)
        return f"turn {context.turn}"

    class Dynamic(Agent):
        pass

    request = await first_request(Dynamic, instructions=instructions)
    assert request.messages[0].text == "turn 0"
    assert isinstance(seen[0], RunContext)


async def test_callable_instructions_are_asked_again_each_turn() -> None:
    """Each request of a tool loop carries the text its turn's call gave, the same text
    again or a new one."""

    def instructions(context: RunContext) -> str:
        return "Be brief." if context.turn in (0, 1, 3) else f"Be brief on turn {context.turn}."

    class Looking(Agent):
        @tool
        def look(self) -> str:
            """Look."""
            return "seen"

    model = ScriptedModel([tool_call_response("look", {})] * 4 + [text_response("done")])
    await Looking(model=model, instructions=instructions).run("hi")
    sent = [(request.messages[0].text, request.messages[0].id) for request in model.requests]
    assert [text for text, _ in sent] == [
        "Be brief.",
        "Be brief.",
        "Be brief on turn 2.",
        "Be brief.",
        "Be brief on turn 4.",
    ]
    assert len({identifier for _, identifier in sent}) == 3  # by the text


async def test_instructions_method_and_async_callable() -> None:
    """Instructions may be a method of the agent or an async function."""

    class AsMethod(Agent):
        greeting = "method says hi"

        def instructions(self, context: RunContext) -> str:
            return self.greeting

    async def later(context: RunContext) -> str:
        return "async says hi"

    assert (await first_request(AsMethod)).messages[0].text == "method says hi"
    assert (await first_request(AsMethod, instructions=later)).messages[0].text == "async says hi"


async def test_instructions_naming_a_file_that_is_not_utf8_are_sent_well_formed() -> None:
    """Instructions listing a workspace's files, one of them not UTF-8 (``os.listdir``
    reads ``caf\\udce9.txt``), failed every run with a raw ``UnicodeEncodeError`` before
    any model call (the id hashed the text as given); they go with U+FFFD, under the id
    of the text the message holds."""

    class Workspace(Agent):
        def instructions(self, context: RunContext) -> str:
            return "Files: caf\udce9.txt, \ud83d\ude00.txt"

    class Fixed(Agent):
        instructions = "Files: caf\ufffd.txt, \U0001f600.txt"

    [message, _] = (await first_request(Workspace)).messages
    assert message == (await first_request(Fixed)).messages[0]
    assert message.text == Fixed.instructions


class BindingPartial(functools.partial):  # type: ignore[type-arg]
    """A partial as Python 3.14 reads it through an instance: bound, as a method."""

    def __get__(self, instance: object, owner: type | None = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)


PARTIALS = [functools.partial, BindingPartial]
"""Python 3.13's partial, which warns as it is read through an instance, and one as later
versions read it there (bound, the agent first): the second fails on any version."""


@pytest.mark.parametrize("partial", PARTIALS)
async def test_a_partial_in_a_class_body_is_instructions_called_as_it_is(partial: Any) -> None:
    """A ``functools.partial`` declared as instructions gets the context alone, as a
    function does: never a FutureWarning (Python 3.13, where a partial read through an
    instance warns), nor the agent as a first argument (later versions bind it)."""

    def render(template: str, context: RunContext) -> str:
        return f"{template} (turn {context.turn})"

    class Templated(Agent):
        instructions = partial(render, "Be brief")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        request = await first_request(Templated)
    assert request.messages[0].text == "Be brief (turn 0)"
    assert [str(warning.message) for warning in caught] == []


@pytest.mark.parametrize("partial", PARTIALS)
async def test_a_partial_hook_in_a_class_body_is_called_as_it_is(partial: Any) -> None:
    """A ``functools.partial`` declared as a hook gets what the hook gets, without the
    agent, as on Python 3.10 to 3.12: never a FutureWarning (3.13), nor the agent as a
    first argument (later versions bind it); one that cannot take it fails at once."""
    seen: list[tuple[str, int]] = []

    def tag(label: str, request: ModelRequest) -> None:
        seen.append((label, len(request.messages)))

    class Tagged(Agent):
        tagged = before_model(partial(tag, "a"))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        await first_request(Tagged)
    assert seen == [("a", 1)]
    assert [str(warning.message) for warning in caught] == []
    with pytest.raises(ConfigurationError, match="must accept"):

        class Untaggable(Agent):
            tagged = before_model(functools.partial(tag, "a", "b"))


async def test_a_partial_hook_of_a_mixin_is_called_as_it_is() -> None:
    """A hook declared as a partial in a mixin gets what the hook gets, without the
    agent, as one in the agent class's body does (it was bound on Python 3.14)."""
    seen: list[tuple[str, int]] = []

    def tag(request: ModelRequest, *, label: str) -> None:
        seen.append((label, len(request.messages)))

    class Tagging:
        tagged = before_model(BindingPartial(tag, label="a"))

    class Tagged(Tagging, Agent):
        pass

    await first_request(Tagged)
    assert seen == [("a", 1)]


async def test_instructions_returning_a_non_str_fail_clearly() -> None:
    """Instructions that return something other than a str raise ConfigurationError."""

    class Broken(Agent):
        pass

    with pytest.raises(ConfigurationError, match="instructions returned int"):
        await first_request(Broken, instructions=lambda context: 42)


@frozen(kw_only=True)
class Tagging:
    """An immutable config a class decorator stores."""

    label: str = field(validator=validators.instance_of(str))


def tagged(label: str) -> Callable[[type[Agent]], type[Agent]]:
    """A tiny capability: stores its config on the class and adds a before_model hook."""
    config = Tagging(label=label)

    def hook(agent: Any, request: ModelRequest, context: RunContext) -> None:
        agent.order.append(f"tag:{label}")

    def decorate(cls: type[Agent]) -> type[Agent]:
        cls.tagging = config  # type: ignore[attr-defined]
        add_capability(cls, Capability("tagging", [CapabilityHook("before_model", hook)]))
        return cls

    return decorate


class Base(Agent):
    tagging: Tagging | None = None

    def __init__(self, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.order: list[str] = []

    @before_model
    def base_hook(self, request: ModelRequest) -> None:
        self.order.append("base")


@tagged("child")
class Tagged(Base):
    @before_model
    def own_hook(self, request: ModelRequest) -> None:
        self.order.append("own")


class TaggedGrandchild(Tagged):
    pass


async def hook_order(agent_class: type[Base]) -> list[str]:
    """The order in which before_model hooks of ``agent_class`` ran for one call."""
    agent = agent_class(model=ScriptedModel([text_response("ok")]))
    await agent.run("hi")
    return agent.order


def test_decorator_stores_config_on_the_decorated_class_only() -> None:
    """The decorated class has the config; its parent does not; a subclass inherits it."""
    assert Tagged.tagging == Tagging(label="child")
    assert Base.tagging is None
    assert TaggedGrandchild.tagging is Tagged.tagging


def test_decorator_config_is_immutable() -> None:
    """The stored config cannot be changed in place."""
    assert Tagged.tagging is not None
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        Tagged.tagging.label = "changed"  # type: ignore[misc]


async def test_capability_hooks_run_after_parent_and_before_own_hooks() -> None:
    """A capability's hooks run after the parent's hooks and before the class's own."""
    assert await hook_order(Tagged) == ["base", "tag:child", "own"]


async def test_decorating_a_subclass_leaves_the_parent_untouched() -> None:
    """The parent of a decorated class runs only its own hooks."""
    assert await hook_order(Base) == ["base"]


async def test_subclass_of_decorated_class_inherits_the_capability() -> None:
    """A subclass of a decorated class runs the capability in the same place."""
    assert await hook_order(TaggedGrandchild) == ["base", "tag:child", "own"]


async def test_redecorating_a_subclass_moves_the_capability() -> None:
    """Declaring the capability again on a subclass replaces it in the subclass's place."""
    regrown = tagged("grandchild")(type("Regrown", (Tagged,), {}))
    assert await hook_order(regrown) == ["base", "own", "tag:grandchild"]  # type: ignore[arg-type]
    assert Tagged.tagging == Tagging(label="child")


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("max_turns", 0),
        ("max_turns", -1),
        ("max_turns", 2.5),
        ("max_turns", True),
        ("max_tool_calls", 0),
        ("max_tool_result_tokens", "many"),
        ("max_retries", -1),
        ("capture_content", "yes"),
        ("settings", ["temperature"]),
        ("tools", "ping"),
        ("tools", [42]),
        ("instructions", 42),
        ("model", 42),
        ("model", "openai:"),
    ],
)
def test_invalid_declarations_fail_at_class_definition(knob: str, value: object) -> None:
    """An out-of-range or wrongly typed class value raises ConfigurationError naming it."""
    with pytest.raises(ConfigurationError, match=knob):
        type("Bad", (Agent,), {knob: value})


def test_a_lone_function_as_tools_is_told_to_be_a_list() -> None:
    """``tools = weather`` (the list left out) fails at class definition, and so does the
    constructor keyword, saying how to write it."""

    def weather(city: str) -> str:
        """Today's weather in a city."""
        return f"Sunny in {city}."

    told = r"must be a sequence of functions, not function \(a list of one: \[weather\]\)"
    with pytest.raises(ConfigurationError, match=rf"Bad\.tools {told}"):
        type("Bad", (Agent,), {"tools": weather})
    with pytest.raises(ConfigurationError, match=told):
        Agent(model=ScriptedModel([]), tools=weather)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("max_turns", -5),
        ("settings", {"messages": [], "temperature": 0.1}),
        ("settings", {"temperature": "hot"}),
        ("model", "not a model string"),
        ("instructions", 42),
        ("output_strategy", "json"),
        ("context_management", object()),
        ("capabilities", ()),
    ],
)
def test_a_mixins_invalid_declarations_fail_at_class_definition(knob: str, value: object) -> None:
    """A plain mixin's declarations are checked like a class body's, naming the mixin."""
    mixin = type("Mixin", (), {knob: value})
    with pytest.raises(ConfigurationError, match=rf"Mixin\.{knob}|{knob}: "):
        type("Mixed", (mixin, Agent), {})


async def test_a_mixins_declarations_are_taken() -> None:
    """A callable instructions on a mixin is called with the context, as in a class body;
    its knobs reach the class."""

    def greet(context: RunContext) -> str:
        return "Be brief."

    class Style:
        instructions = greet
        settings = {"temperature": 0.2}
        max_turns = 2

    class Styled(Style, Agent):
        pass

    model = ScriptedModel([text_response("ok")])
    await Styled(model=model).run("hi")
    request = model.requests[0]
    assert [m.text for m in request.messages if m.role.value == "system"] == ["Be brief."]
    assert dict(request.settings) == {"temperature": 0.2}
    assert Styled.max_turns == 2


async def test_a_mixins_declarations_keep_their_mro_place_and_live_knobs_change_there() -> None:
    """A mixin's knob is where Python finds it: a class listed before the mixin in a
    subclass's MRO wins; its model and settings, changed later, apply at the next run,
    and its other knobs, changed later, fail the next run as a parent's do."""

    class Guard:
        instructions = "guard"
        settings = {"temperature": 0.2}
        model: Any = "openai:gpt-4o-mini"

    class Guarded(Guard, Agent):
        pass

    class Own(Guard, Agent):
        instructions = "own"

    class Mix(Guarded, Own):  # MRO: Mix, Guarded, Own, Guard, Agent
        pass

    Guard.model = ScriptedModel([text_response("ok")] * 2)
    Guard.settings["temperature"] = 0.9
    await Mix().run("hi")
    request = Guard.model.requests[0]
    assert request.messages[0].text == "own"
    assert dict(request.settings) == {"temperature": 0.9}
    Guard.instructions = "changed"
    with pytest.raises(ConfigurationError, match=r"Guard\.instructions was changed after Guarded"):
        await Guarded().run("hi")


def test_a_mixin_after_agent_in_the_bases_fails_when_agent_hides_its_declaration() -> None:
    """Agent's defaults come first in the MRO of class X(Agent, Mixin): the mixin's knob
    would be ignored, so the class fails naming the fix."""
    mixin = type("Mixin", (), {"max_turns": 5})
    with pytest.raises(
        ConfigurationError,
        match=r"Mixed: Mixin\.max_turns is hidden by the default of Agent.*list Mixin before",
    ):
        type("Mixed", (Agent, mixin), {})


@pytest.mark.parametrize(
    ("knob", "value"),
    [("max_turns", 0), ("max_retries", "3"), ("capture_content", 1), ("model", 3.5)],
)
def test_invalid_constructor_values_fail(knob: str, value: object) -> None:
    """An invalid constructor keyword raises ConfigurationError naming it."""
    with pytest.raises(ConfigurationError, match=knob):
        Agent(**{knob: value})


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("tools", [echo]),
        ("output_type", None),
        ("instructions", "new"),
        ("max_turns", 2),
    ],
)
@pytest.mark.parametrize("entry", ["constructor", "run", "run_sync", "stream"])
async def test_a_knob_changed_after_the_class_was_defined_fails_at_the_next_use(
    knob: str, value: object, entry: str
) -> None:
    """Declarations are read and checked at definition: changing one on the class (or a
    parent) later fails naming it, for new instances and at the next run of existing ones."""
    parent = type("Declared", (Agent,), {"output_type": int, "settings": {"seed": 1}})
    child = type("Inheriting", (parent,), {})
    agent = child(model=ScriptedModel([text_response("1")]))
    setattr(parent, knob, value)
    message = rf"Declared\.{knob} was changed after Inheriting was defined;.* {knob}= to the "
    message += "constructor$"  # no __init_subclass__ of theirs to mention
    with pytest.raises(ConfigurationError, match=message):
        if entry == "constructor":
            child()
        elif entry == "run":
            await agent.run("hi")
        elif entry == "run_sync":
            await anyio.to_thread.run_sync(agent.run_sync, "hi")
        else:
            agent.stream("hi")


async def test_a_model_swapped_on_the_class_is_used_by_the_next_run() -> None:
    """The model is read and checked as each run starts, so changing it on the class (a
    test patching ``Support.model`` with a ``ScriptedModel``, say) is not refused."""
    cls = type("Swapped", (Agent,), {"model": ScriptedModel([text_response("first")])})
    agent = cls()
    assert (await agent.run("hi")).output == "first"
    cls.model = ScriptedModel([text_response("second")] * 2)  # type: ignore[attr-defined]
    assert (await agent.run("hi")).output == "second"
    assert (await cls().run("hi")).output == "second"


@pytest.mark.parametrize("value", [42, ScriptedModel, "no colon here"])
async def test_a_bad_model_swapped_on_the_class_fails_clearly_at_the_next_run(
    value: object,
) -> None:
    cls = type("Swapped", (Agent,), {"model": ScriptedModel([text_response("first")])})
    agent = cls()
    cls.model = value  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match="model"):
        await agent.run("hi")


async def test_settings_changed_on_the_class_are_used_and_checked_at_the_next_run() -> None:
    """Settings are read and checked as each run starts: replaced or changed in place on the
    class, they reach the next request, and a bad value fails naming the class's settings
    before anything is sent."""
    model = ScriptedModel([text_response("ok")] * 3)
    cls = type("Tuned", (Agent,), {"model": model, "settings": {"seed": 1}})
    agent = cls()
    cls.settings = {"seed": 2}  # type: ignore[attr-defined]
    await agent.run("hi")
    cls.settings["temperature"] = 0.5  # type: ignore[index]
    await cls().run("hi")
    assert [dict(r.settings) for r in model.requests] == [
        {"seed": 2},
        {"seed": 2, "temperature": 0.5},
    ]
    cls.settings["temperature"] = float("nan")  # type: ignore[index]
    with pytest.raises(ConfigurationError, match=r"Tuned\.settings\['temperature'\]"):
        await agent.run("hi")
    tuned = cls(settings={"seed": 3})
    tuned.settings["messages"] = []  # type: ignore[index]
    with pytest.raises(ConfigurationError, match=r"Tuned\(…, settings=\): 'messages'"):
        tuned.run_sync("hi")
    assert len(model.requests) == 2


def test_run_settings_are_the_settings_a_run_starts_from_checked_as_it_checks_them() -> None:
    """``run_settings()`` (for work outside a run, such as ``compact_log``) is a copy of
    the settings a run starts from, checked as each run starts: a setting changed in place
    or a knob changed on the class fails naming it."""
    cls = type("Tuned", (Agent,), {"model": ScriptedModel([]), "settings": {"seed": 1}})
    agent = cls(settings={"seed": 2})
    settings = agent.run_settings()
    assert settings == {"seed": 2}
    settings["seed"] = 3
    assert agent.run_settings() == {"seed": 2}
    agent.settings["temperature"] = float("nan")  # type: ignore[index]
    with pytest.raises(ConfigurationError, match=r"Tuned\(…, settings=\)\['temperature'\]"):
        agent.run_settings()
    cls.max_turns = 2  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match="max_turns"):
        agent.run_settings()


async def test_a_response_format_set_on_the_class_later_is_named_as_the_classes() -> None:
    """With an output type, ``response_format`` in the class's settings fails naming the
    class's settings, not the run's."""
    cls = type("Typed", (Agent,), {"model": ScriptedModel([]), "output_type": int})
    agent = cls()
    cls.settings = {"response_format": {"type": "json_object"}}  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match=r"^Typed\.settings: response_format"):
        await agent.run("hi")
    cls.settings = {}  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match=r"^settings: response_format"):
        await agent.run("hi", settings={"response_format": {"type": "json_object"}})
    own = cls(settings={"seed": 1})
    own.settings["response_format"] = {"type": "json_object"}  # type: ignore[index]
    with pytest.raises(ConfigurationError, match=r"^Typed\(…, settings=\): response_format"):
        await own.run("hi")


@pytest.mark.parametrize("entry", ["constructor", "run", "stream"])
async def test_an_instance_overriding_a_knob_changed_on_its_class_is_not_refused(
    entry: str,
) -> None:
    """A constructor keyword replaces the class's value, so the class's later change of
    that knob does not concern the instance; another changed knob still fails."""
    cls = type("Declared", (Agent,), {"instructions": "old", "max_turns": 5})
    agent = cls(model=ScriptedModel([text_response("ok")]), instructions="mine")
    cls.instructions = "changed"  # type: ignore[attr-defined]
    if entry == "constructor":
        assert cls(instructions="other").instructions == "other"
    elif entry == "run":
        assert (await agent.run("hi")).output == "ok"
    else:
        async with agent.stream("hi") as events:
            assert [e async for e in events]
    cls.max_turns = 2  # type: ignore[attr-defined]
    with pytest.raises(ConfigurationError, match=r"Declared\.max_turns was changed"):
        cls(instructions="other")
    with pytest.raises(ConfigurationError, match=r"Declared\.max_turns was changed"):
        await agent.run("hi")


def test_a_knob_an_init_subclass_sets_after_super_fails_naming_the_order() -> None:
    """A base's ``__init_subclass__`` that sets a knob after ``super().__init_subclass__()``
    sets it after the definition's checks: the error says to set it before; set before,
    the knob is checked and used."""

    class Late(Agent):
        def __init_subclass__(cls, **kwargs: Any) -> None:
            super().__init_subclass__(**kwargs)
            cls.instructions = f"You are {cls.__name__}."

    class Early(Agent):
        def __init_subclass__(cls, **kwargs: Any) -> None:
            cls.instructions = f"You are {cls.__name__}."
            super().__init_subclass__(**kwargs)

    class Bot(Late):
        pass

    class Helper(Early):
        pass

    with pytest.raises(
        ConfigurationError, match=r"Bot\.instructions was changed.*before it calls super"
    ):
        Bot()
    assert Helper().instructions == "You are Helper."

    class Unchecked(Agent):
        def __init_subclass__(cls, **kwargs: Any) -> None:
            cls.max_turns = 0
            super().__init_subclass__(**kwargs)

    with pytest.raises(ConfigurationError, match=r"Worse\.max_turns must be an int >= 1"):
        type("Worse", (Unchecked,), {})


def test_a_class_an_init_subclass_left_unset_up_fails_naming_it() -> None:
    """A base's ``__init_subclass__`` that never calls ``super().__init_subclass__()``
    leaves its subclasses unchecked, without their tools and hooks' checks, and with the
    base's session store (its sessions shared): making one fails naming the base."""

    class Registered(Agent):
        registry: typing.ClassVar[list[type[Agent]]] = []

        def __init_subclass__(cls, **kwargs: Any) -> None:
            Registered.registry.append(cls)

    class Billing(Registered):
        @tool
        def refund(self, order: str) -> str:
            """Refund an order."""
            return "refunded"

    class Support(Registered):
        pass

    message = (
        r"Support was not set up as an agent class: Registered\.__init_subclass__ must call "
        r"super\(\)\.__init_subclass__\(\*\*kwargs\)"
    )
    with pytest.raises(ConfigurationError, match=message):
        Support(model=ScriptedModel([text_response("ok")]))
    with pytest.raises(ConfigurationError, match=r"^Billing was not set up"):
        Billing()
    assert Registered.registry == [Billing, Support]


async def test_a_capability_added_later_reaches_existing_instances() -> None:
    """An instance made before add_capability runs the capability's hooks too, as its
    class's capabilities show it."""
    seen: list[str] = []

    def hook(agent: Any, request: ModelRequest, *, context: RunContext) -> None:
        seen.append("late")

    cls = type("Late", (Agent,), {})
    agent = cls(model=ScriptedModel([text_response("ok")] * 2))
    await agent.run("hi")
    add_capability(cls, Capability("late", [CapabilityHook("before_model", hook)]))
    await agent.run("hi")
    assert (seen, [c.name for c in cls.capabilities]) == (["late"], ["late"])


async def test_a_capability_added_during_a_run_takes_effect_from_the_next_run() -> None:
    """A run keeps the hooks it started with, so no call gets an ``after_tool`` without
    its ``before_tool``."""
    seen: list[str] = []

    def before(agent: Any, call: ToolCall, *, context: RunContext) -> None:
        seen.append(f"before {call.id}")

    def after(agent: Any, result: Any, *, context: RunContext) -> None:
        seen.append(f"after {result.call_id}")

    late = Capability(
        "late", [CapabilityHook("before_tool", before), CapabilityHook("after_tool", after)]
    )

    class Adding(Agent):
        @tool
        def add_hooks(self) -> str:
            """Add a capability to this very class."""
            add_capability(type(self), late)
            return "added"

    model = ScriptedModel(
        [
            tool_call_response("add_hooks", {}, call_id="c1"),
            tool_call_response("add_hooks", {}, call_id="c2"),
            text_response("done"),
        ]
        * 2
    )
    agent = Adding(model=model)
    await agent.run("Go.")
    assert seen == []
    await agent.run("Again.")
    assert seen == ["before c1", "after c1", "before c2", "after c2"]


def test_unknown_constructor_keyword_is_a_type_error() -> None:
    """An unknown constructor keyword raises TypeError naming it."""
    with pytest.raises(TypeError, match="max_turn"):
        Agent(max_turn=3)


def test_non_callable_hook_fails_at_class_definition() -> None:
    """@before_model on a non-callable raises ConfigurationError naming the hook kind."""
    with pytest.raises(ConfigurationError, match="before_model"):

        class Bad(Agent):
            hook = before_model(42)  # type: ignore[type-var]


def test_unsupported_tool_annotation_fails_at_class_definition() -> None:
    """A tool parameter with a type JSON cannot describe fails naming the parameter."""
    with pytest.raises(ConfigurationError, match="'when'"):

        class Bad(Agent):
            @tool
            def schedule(self, when: complex) -> str:
                """Schedule something."""
                return ""


def test_duplicate_tool_names_fail_at_class_definition() -> None:
    """Two tools with one name raise ConfigurationError."""
    with pytest.raises(ConfigurationError, match="two tools are named 'ping'"):

        class Bad(Agent):
            tools = [ping]

            @tool
            def ping(self) -> str:
                """Ping again."""
                return ""


AGENT_MEMBERS = (
    "run",
    "run_sync",
    "stream",
    "instructions",
    "output",
    "hooks",
    "tool_specs",
    "resolve_model",
    "__init__",
    "name",
    "max_turns",
    "output_type",
    "context_management",
    "aclose",
    "_hooks",
)


def with_tool_method(attribute: str, **options: Any) -> type[Agent]:
    """An agent class with a ``@tool`` method stored as ``attribute``."""

    async def method(self: Agent, query: str) -> str:
        """Answer a query."""
        return query

    method.__name__ = attribute
    return type("Shadowing", (Agent,), {attribute: tool(**options)(method)})


@pytest.mark.parametrize("member", AGENT_MEMBERS)
def test_a_tool_method_named_like_an_agent_member_fails(member: str) -> None:
    """A @tool method would replace the Agent method, property or knob of its name."""
    with pytest.raises(
        ConfigurationError,
        match=re.escape(
            f"Shadowing.{member}: the @tool method {member!r} would replace Agent.{member}; "
            f"give the method another name and keep the tool's name with @tool(name={member!r})"
        ),
    ):
        with_tool_method(member)


@pytest.mark.parametrize(
    ("member", "value"),
    [
        ("hooks", ["log_request"]),
        ("output", "text"),
        ("output", dict),  # a class, callable: meant for output_type
        ("run_settings", {}),
        ("name", 42),
    ],
)
def test_a_value_in_the_place_of_an_agent_member_fails(member: str, value: object) -> None:
    """A plain attribute named like one of Agent's properties or methods (``hooks``, as
    other frameworks take hooks) would break every run: it fails at class definition,
    saying what ``hooks`` and ``output`` are declared as instead; a method of the same
    name overrides as Python's do."""
    with pytest.raises(
        ConfigurationError, match=re.escape(f"Mixin.{member} would replace Agent.{member}")
    ) as failed:
        type("Mixed", (type("Mixin", (), {member: value}), Agent), {})
    meant = {
        "hooks": "(hooks are methods decorated with @before_model, @after_model, "
        "@after_model_error, @before_tool, @after_tool)",
        "output": "(the answer's type is declared as output_type)",
        "name": "(the agent's name as telemetry reports it is a str: name = 'support')",
    }
    assert str(failed.value).endswith(meant.get(member, "give the attribute another name"))

    class Overriding(Agent):
        name = "support-bot"  # the name telemetry reports

        def run_settings(self) -> dict[str, Any]:
            return {**super().run_settings(), "temperature": 0}

    assert Overriding().run_settings() == {"temperature": 0}
    assert Overriding().name == "support-bot"


class _Declared(Agent):
    name = "support-bot"


class _NamingMixin:
    name = "support-bot"


@dataclasses.dataclass
class _DataclassNamed(Agent):
    name: str = "support-bot"

    def __post_init__(self) -> None:
        Agent.__init__(self)


@pytest.mark.parametrize(
    ("base", "declared"),
    [
        (Agent, None),
        (_Declared, "support-bot"),
        (type("_Inherited", (_Declared,), {}), "support-bot"),
        (type("_Mixed", (_NamingMixin, Agent), {}), "support-bot"),
    ],
    ids=["undeclared", "declared", "inherited", "mixin"],
)
def test_a_name_set_on_an_agent_fails_however_its_class_names_it(
    base: type[Agent], declared: str | None
) -> None:
    """The agent's name is its class's (its name, or a str it or a base declares): set on
    an instance, before or after ``Agent.__init__``, it fails saying what ``name`` is. A
    class that declared one took a customer's name kept in ``self.name`` as the agent's,
    reported in every span and metric; one that declared none gave Python's
    ``AttributeError`` ("property 'name' ... has no setter")."""

    class Named(base):  # type: ignore[valid-type, misc]
        model = ScriptedModel([text_response("ok")])

        def __init__(self, customer: str, *, early: bool) -> None:
            if early:
                self.name = customer
            super().__init__()
            self.name = customer

    told = re.escape("Named.name is the agent's name as telemetry reports it (its class name")
    for early in (True, False):
        with pytest.raises(ConfigurationError, match=told):
            Named("Ada", early=early)
    made = base()
    with pytest.raises(ConfigurationError, match=r"\.name is the agent.s name"):
        made.name = "Ada"
    assert made.name == (declared or base.__name__)


def test_a_dataclass_field_in_the_place_of_the_agent_s_name_fails() -> None:
    """A dataclass agent's ``name`` field set the agent's name per instance (an attrs
    class's was refused, as ``name`` cannot be set on an agent)."""
    with pytest.raises(ConfigurationError, match=r"_DataclassNamed\.name is the agent.s name"):
        _DataclassNamed(name="Ada")


@pytest.mark.parametrize("member", ["output", "tool_specs"])
def test_an_instance_attribute_in_the_place_of_what_the_agent_works_out_fails(
    member: str,
) -> None:
    """``self.output = None`` in an ``__init__`` would replace the compiled output type
    (the declared one silently ignored): it fails, before or after Agent's own."""

    class Kept(Agent):
        output_type = int

        def __init__(self, *, early: bool) -> None:
            if early:
                setattr(self, member, None)
            super().__init__()
            setattr(self, member, None)

    message = re.escape(f"Kept.{member} would replace Agent.{member}")
    for early in (True, False):
        with pytest.raises(ConfigurationError, match=message):
            Kept(early=early)


@pytest.mark.parametrize(
    ("attribute", "value", "knob"),
    [
        ("instruction", "Answer in French.", "instructions"),
        ("tool", [len], "tools"),
        ("modle", "openai:gpt-4o-mini", "model"),
        ("max_turn", 5, "max_turns"),
        ("setting", {"temperature": 0}, "settings"),
        ("output_types", int, "output_type"),
        ("system_prompt", "Answer in French.", "instructions"),  # other libraries' names
        ("system_message", "Answer in French.", "instructions"),
        ("system", "Answer in French.", "instructions"),
    ],
)
def test_a_value_named_almost_like_a_knob_fails(attribute: str, value: Any, knob: str) -> None:
    """A misspelled knob would leave the agent without what it declares, without a word:
    it fails at class definition, naming the knob meant; in a mixin too."""
    hint = f"{attribute} is not a knob of Agent: did you mean {knob}?"
    with pytest.raises(ConfigurationError, match=re.escape(f"Typo.{hint}")):
        type("Typo", (Agent,), {attribute: value})
    with pytest.raises(ConfigurationError, match=re.escape(f"Mixin.{hint}")):
        type("Mixed", (type("Mixin", (), {attribute: value}), Agent), {})


@pytest.mark.parametrize(
    ("attribute", "value"),
    [("temperature", 0), ("max_tokens", 300), ("top_p", 0.9), ("presence_penalty", 0.5)],
)
def test_a_value_named_like_a_model_setting_fails(attribute: str, value: Any) -> None:
    """``temperature = 0`` on the class would be ignored, the model left at its default,
    without a word: it fails at class definition, showing the ``settings`` it means; in a
    mixin too."""
    hint = (
        f"{attribute} is not a knob of Agent: a model setting goes in settings "
        f"(settings = {{{attribute!r}: {value!r}}}"
    )
    with pytest.raises(ConfigurationError, match=re.escape(f"Typo.{hint}")):
        type("Typo", (Agent,), {attribute: value})
    with pytest.raises(ConfigurationError, match=re.escape(f"Mixin.{hint}")):
        type("Mixed", (type("Mixin", (), {attribute: value}), Agent), {})


def test_names_a_class_uses_for_itself_are_not_taken_for_model_settings() -> None:
    """``top_k`` (the documents a retrieval tool returns), ``seed`` (the class's own
    random draws), ``n`` and ``stop`` are settings too, but plain names a class may well
    use for itself: taken as its own, unannotated."""

    class Retrieving(Agent):
        top_k = 5
        seed = 7
        n = 3
        stop = "END"

    assert (Retrieving.top_k, Retrieving.seed, Retrieving().settings) == (5, 7, {})


def test_a_classvar_annotation_says_an_attribute_named_like_a_knob_is_the_class_s_own() -> None:
    """``top_k: ClassVar[int] = 5`` (the documents a tool retrieves), in the class or a
    mixin, is the class's own, as the error for an unannotated one says."""

    class Retrieving:
        top_k: typing.ClassVar[int] = 5

    class Search(Retrieving, Agent):
        seed: typing.ClassVar[int] = 7  # its own random draws
        instruction: typing.ClassVar[str] = "its own"

    assert (Search.top_k, Search.seed, Search().settings) == (5, 7, {})
    evaluated = {"__annotations__": {"temperature": typing.ClassVar[float]}, "temperature": 0}
    assert type("Evaluated", (Agent,), evaluated)().settings == {}  # not a string
    with pytest.raises(ConfigurationError, match=re.escape("or a ClassVar annotation")):
        type("Bare", (Agent,), {"temperature": 0.2})
    with pytest.raises(ConfigurationError, match=re.escape("or a ClassVar annotation")):
        type("Near", (Agent,), {"instruction": "Be brief."})


def test_attributes_of_ones_own_are_taken() -> None:
    """Names unlike a knob, private ones, constants, methods, values the knob would not
    take and ``None`` (an inherited tool removed) are the class's own business."""

    class Own(Agent):
        instructions = "Answer in French."
        greeting = "Bonjour"
        max_length = 80
        _instruction = "kept for later"
        MODEL = "openai:gpt-4o-mini"
        INSTRUCTIONS = "Answer in German."
        models = ["openai:gpt-4o-mini", "openai:gpt-4o"]  # no model string: a list
        temperature = "warm"  # no setting's value
        system = 3  # no instructions
        n = 2  # too plain a name to be taken for the setting
        stop = "."
        _temperature = 0.2

        def setting(self) -> str:
            return "formal"

    class Tooled(Agent):
        @tool
        def tool(self, name: str) -> str:
            """Describe a tool of the workshop."""
            return name

    class Fewer(Tooled):
        tool = None  # type: ignore[assignment]  # the tool removed

    assert (Own.greeting, Own.max_length, Own().setting()) == ("Bonjour", 80, "formal")
    assert (Own.temperature, Own.system, Own.n, Own().settings) == ("warm", 3, 2, {})
    assert Tooled().tool_names == {"tool"} and Fewer().tool_names == frozenset()


def test_a_shadowing_tool_method_keeps_its_own_tool_name_in_the_hint() -> None:
    """With @tool(name=) given, the hint suggests that name; a mixin's tool is caught too."""
    with pytest.raises(ConfigurationError, match=re.escape("@tool(name='query')")):
        with_tool_method("run", name="query")

    class Mixin:
        @tool
        def stream(self) -> str:
            """Stream something."""
            return ""

    with pytest.raises(ConfigurationError, match=r"Mixin\.stream: the @tool method 'stream'"):
        type("Mixed", (Mixin, Agent), {})


async def test_a_tool_can_take_an_agent_members_name_through_tool_name() -> None:
    """@tool(name="run") on another method: the model sees "run", agent.run still runs."""

    class Support(Agent):
        @tool(name="run")
        async def run_query(self, query: str) -> str:
            """Run a query."""
            return f"ran {query}"

    model = ScriptedModel([tool_call_response("run", {"query": "q"}), text_response("done")])
    result = await Support(model=model).run("hi")
    assert result.output == "done"
    assert [part.content for message in result.messages for part in message.tool_results] == [
        "ran q"
    ]


class Searcher(Agent):
    @tool
    async def search(self, query: str) -> str:
        """Search."""
        return f"found {query}"


class NoSearch(Searcher):
    search = None  # type: ignore[assignment]


class SearchAgain(NoSearch):
    @tool
    async def search(self, query: str, limit: int = 3) -> str:  # type: ignore[override]
        """Search, with a limit."""
        return f"found {limit} of {query}"


async def test_none_removes_an_inherited_tool() -> None:
    """``search = None`` in a subclass removes the tool, as ``None`` turns a hook off; the
    parent keeps it and a grandchild may declare it again."""
    model = ScriptedModel([tool_call_response("search", {"query": "q"}), text_response("done")])
    result = await NoSearch(model=model).run("hi")
    assert (model.requests[0].tools, NoSearch().tool_names) == ((), frozenset())
    (content,) = [part.content for message in result.messages for part in message.tool_results]
    assert content.startswith("Unknown tool 'search'")
    assert Searcher().tool_names == SearchAgain().tool_names == {"search"}
    (spec,) = SearchAgain().tool_specs
    assert list(spec.parameters["properties"]) == ["query", "limit"]


def ask(self: Any) -> str:
    """Ask."""
    return "asked"


@pytest.mark.parametrize("wrapper", [property, functools.cached_property])
@pytest.mark.parametrize(
    ("mark", "said"), [(tool, "a tool is a method"), (before_model, "a hook is a method")]
)
def test_a_tool_or_hook_under_a_property_fails(
    wrapper: Callable[..., Any], mark: Callable[..., Any], said: str
) -> None:
    """A property hides the mark of the function under it: the class would have neither
    the tool nor the hook, without a word."""
    function = mark(types.FunctionType(ask.__code__, globals(), "ask"))  # a fresh one to mark
    with pytest.raises(
        ConfigurationError, match=rf"Hidden\.ask: @{wrapper.__name__} hides the @.*{said}"
    ):
        type("Hidden", (Agent,), {"ask": wrapper(function)})


@pytest.mark.parametrize(
    "override",
    [
        lambda: lambda self, query, limit: "",
        lambda: 42,
        lambda: before_model(lambda self, request: None),
    ],
    ids=["plain method", "value", "hook"],
)
def test_overriding_a_tool_with_a_non_tool_fails(override: Callable[[], object]) -> None:
    """A subclass attribute other than a @tool or None over an inherited tool fails."""
    with pytest.raises(
        ConfigurationError,
        match=re.escape(
            "Other.search overrides the tool 'search' but is not a tool: decorate it with "
            "@tool, or set search = None to remove the tool"
        ),
    ):
        type("Other", (Searcher,), {"search": override()})


def test_a_knob_set_on_a_made_agent_is_checked_or_refused() -> None:
    """As a constructor keyword is: a bad value fails naming it; ``tools`` and
    ``output_type``, worked out as the agent is made, cannot change after (a tool added
    so was never offered to the model)."""
    agent = Agent(model=ScriptedModel([]))
    agent.max_turns = 3
    agent.model = "openai:gpt-4o-mini"
    for knob, value, message in [
        ("max_turns", "3", r"Agent\.max_turns must be an int >= 1"),
        ("max_turns", 0, r"Agent\.max_turns must be an int >= 1"),
        ("model", "no colon", r"is not of the form 'provider:model'"),
        ("instructions", lambda: "x", r"Agent\.instructions"),
        ("tools", [], r"Agent\.tools cannot change once the agent is made: pass tools="),
        ("output_type", int, r"Agent\.output_type cannot change once the agent is made"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            setattr(agent, knob, value)
    assert agent.max_turns == 3


def test_a_knob_misspelt_on_a_made_agent_fails_naming_the_knob() -> None:
    """``agent.max_turn = 3`` would be ignored without a word: as in a class body, a new
    plain value named almost like a knob it would do for, by another library's name for
    one, or like a model setting fails; an attribute of the agent's own is kept."""

    class Support(Agent):
        def __init__(self) -> None:
            super().__init__(model=ScriptedModel([]))
            self.database = {"42": "shipped"}
            self.instruction_count = 3

    agent = Support()
    own = "an attribute of your own needs a name less like a knob's or a leading underscore"
    for attribute, value, message in [
        (
            "max_turn",
            3,
            rf"Support\.max_turn is not a knob of Agent: did you mean max_turns\? \({own}\)",
        ),
        ("system_prompt", "Be brief.", r"Support\.system_prompt .*did you mean instructions\?"),
        ("temperature", 0, r"Support\.temperature .*: a model setting goes in settings"),
    ]:
        with pytest.raises(ConfigurationError, match=message):
            setattr(agent, attribute, value)
        assert attribute not in vars(agent)
    agent.max_turn_ = "mine"  # not a value max_turns takes, near as it is
    agent._max_turn = 3
    agent.database = {}
    assert (agent.max_turn_, agent._max_turn, agent.database) == ("mine", 3, {})


async def test_an_init_that_forgets_agents_own_fails_the_run_saying_so() -> None:
    class Forgetful(Agent):
        def __init__(self, database: object) -> None:
            self.database = database  # no super().__init__()

    agent = Forgetful(database=None)
    message = r"Forgetful\.__init__ must call super\(\)\.__init__\(\)"
    with pytest.raises(ConfigurationError, match=message):
        await agent.run("hi")
    with pytest.raises(ConfigurationError, match=message):
        await anyio.to_thread.run_sync(agent.run_sync, "hi")
    with pytest.raises(ConfigurationError, match=message):
        agent.stream("hi")


def test_a_dataclass_or_attrs_agent_that_forgets_agents_own_init_is_told_where() -> None:
    """Their generated ``__init__`` calls no base's: the message names the hook that must,
    not an ``__init__`` the class does not write."""

    @dataclasses.dataclass
    class Plain(Agent):
        database: object = None

    @attrs.define
    class Defined(Agent):
        database: object = None

    for agent, hook in ((Plain(), "__post_init__"), (Defined(), "__attrs_post_init__")):
        agent.model = ScriptedModel([text_response("hi")])
        with pytest.raises(ConfigurationError, match=f"from {hook}; the agent was not set up"):
            agent.run_sync("hi")


def test_a_method_both_tool_and_hook_fails_saying_so() -> None:
    """Nothing is overridden: the message says what is wrong, not that it overrides."""
    with pytest.raises(
        ConfigurationError, match=re.escape("Both.lookup is both a @tool and a @before_model hook")
    ):

        class Both(Agent):
            @before_model
            @tool
            def lookup(self, query: str) -> str:
                """Look it up."""
                return query


def test_a_tool_over_a_hook_fails_saying_so_before_reading_its_parameters() -> None:
    """``@tool`` over a hook read the hook's parameters as the tool's first, and failed
    on them (``request`` needs a type annotation; ``ModelRequest`` cannot be described)."""
    told = r"Both\.{} is already a @{} hook: a method is a @tool or a hook, not both"
    with pytest.raises(ConfigurationError, match=told.format("cap", "before_model")):

        class Both(Agent):
            @tool
            @before_model
            def cap(self, request: ModelRequest) -> None:
                """Cap the request."""

    with pytest.raises(ConfigurationError, match=told.format("note", "after_tool")):

        class Both(Agent):  # type: ignore[no-redef]
            @tool
            @after_tool
            def note(self, result):  # type: ignore[no-untyped-def]
                """Note the result."""
                return result

    def audit(request: ModelRequest) -> None:
        """Audit the request."""

    with pytest.raises(ConfigurationError, match=r"^@tool: 'audit' is already a @before_model"):
        tool(before_model(audit))


def test_overriding_a_hook_with_a_tool_fails() -> None:
    """A @tool method over an inherited hook would be called as that hook: it fails."""

    class Capped(Agent):
        @before_model
        def cap(self, request: ModelRequest) -> None:
            return None

    with pytest.raises(
        ConfigurationError,
        match=re.escape("Tooled.cap overrides a before_model hook but is a tool"),
    ):

        class Tooled(Capped):
            @tool
            def cap(self, limit: int) -> str:  # type: ignore[override]
                """Cap something."""
                return ""


def test_capability_hook_rejects_bad_values() -> None:
    """CapabilityHook needs a known hook kind and a callable."""
    with pytest.raises(ConfigurationError, match="hook kind"):
        CapabilityHook("before_everything", lambda agent, payload: None)
    with pytest.raises(ConfigurationError, match="callable"):
        CapabilityHook("before_model", "not a function")  # type: ignore[arg-type]


async def test_message_input_is_accepted() -> None:
    """run() takes a user Message as well as a str."""
    model = ScriptedModel([text_response("ok")])
    message = Message.user("as a message")
    result = await Agent(model=model).run(message)
    assert result.messages[0] is message


async def test_input_of_another_role_says_what_to_pass() -> None:
    """A message of another role as input is a TypeError that says what input takes and
    where earlier messages go."""
    with pytest.raises(TypeError) as caught:
        await Agent(model=ScriptedModel([])).run(Message.assistant("Hello!"))
    assert str(caught.value) == (
        "input must be a user message (a str, or Message.user(...)), not an assistant "
        "message (earlier messages go in history=)"
    )


@pytest.mark.parametrize(
    "url",
    ["parcel.jpg", "/home/ada/parcel.jpg", "./photos/p.png", "C:\\photos\\p.png", "d:/p.png"],
)
async def test_an_image_given_a_file_s_path_for_its_url_fails_before_anything(url: str) -> None:
    """A file's path given as an image's url went to the provider, which can fetch no such
    URL (and the question was stored with it first); a scripted test passed."""
    model = ScriptedModel([text_response("It looks fine.")] * 4)
    store = InMemorySessionStore()
    agent = Agent(model=model, session_store=store)
    question = Message.user("Is this parcel damaged?", ImagePart(url=url))
    with pytest.raises(ConfigurationError) as caught:
        await agent.run(question, session_id="s")
    assert str(caught.value) == (
        "input: an ImagePart's url has no scheme (https://..., data:...): the image of a "
        "file goes in data=, as ImagePart(data=Path(file).read_bytes())"
    )
    assert url not in str(caught.value)
    assert model.requests == [] and await store.list_sessions() == ()
    for fetched in ("https://example.com/p.jpg", "data:image/png;base64,AA==", "gs://b/p.png"):
        taken = Message.user("Is this parcel damaged?", ImagePart(url=fetched))
        assert (await agent.run(taken)).output == "It looks fine."


@pytest.mark.parametrize(
    "image",
    [b"", "data:image/png;base64,", "DATA:image/png;base64,", "data:image/png"],
    ids=["bytes", "data-url", "upper-case", "no-comma"],
)
async def test_an_empty_image_fails_before_anything(image: bytes | str) -> None:
    """An image without bytes went to the provider, which refuses it (a 400 after a round
    trip), and the question was stored with it first; a scripted test passed."""
    model = ScriptedModel([text_response("It looks fine.")])
    store = InMemorySessionStore()
    part = ImagePart(data=image) if isinstance(image, bytes) else ImagePart(url=image)
    with pytest.raises(ConfigurationError) as caught:
        await Agent(model=model, session_store=store).run(
            Message.user("Is this parcel damaged?", part), session_id="s"
        )
    assert str(caught.value) == (
        "input: an ImagePart holds no image (data=b'', or a data: URL with nothing after "
        "its comma), which providers refuse: give the image's bytes, or leave the part out"
    )
    assert model.requests == [] and await store.list_sessions() == ()


class Rules:
    """Callable instructions, as an object."""

    def __call__(self, context: RunContext) -> str:
        return "Be brief."


@pytest.mark.parametrize(
    ("knob", "value"),
    [
        ("model", ScriptedModel),
        ("model", OpenAIModel),
        ("session_store", InMemorySessionStore),
        ("instructions", Rules),
    ],
)
def test_a_class_where_an_instance_belongs_fails_naming_the_class(knob: str, value: type) -> None:
    """A class passes a protocol's method checks; it is refused, with a hint to call it."""
    name = value.__name__
    message = rf"{knob}=?\)? must be .*, not the class {name} \(did you mean {name}\(\.\.\.\)\?\)"
    with pytest.raises(ConfigurationError, match=message):
        type("Bad", (Agent,), {knob: value})
    with pytest.raises(ConfigurationError, match=message):
        Agent(**{knob: value})


def test_a_class_declaring_session_store_none_is_told_what_the_knob_takes() -> None:
    """``session_store = None`` is a wrong value, not a mixin's knob hidden by ``Agent``'s
    default (the class is not a mixin: reordering its bases cannot help)."""
    message = r"Bad\.session_store must be a session store instance .*, not None"
    with pytest.raises(ConfigurationError, match=message):
        type("Bad", (Agent,), {"session_store": None})


def test_instances_of_those_classes_are_taken() -> None:
    """The instances the hint points to are what the knobs take."""
    agent = Agent(
        model=ScriptedModel([text_response("hi")]),
        session_store=InMemorySessionStore(),
        instructions=Rules(),
    )
    assert agent.run_sync("hello").output == "hi"


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("gpt-4o-mini", r"it names no provider \(did you mean 'openai:gpt-4o-mini'\?\)$"),
        ("o3-mini", r"it names no provider \(did you mean 'openai:o3-mini'\?\)$"),
        (
            "claude-sonnet-4-5",
            r"it names no provider \(did you mean 'anthropic:claude-sonnet-4-5'\?\)$",
        ),
        ("mistral-large", "it names no provider$"),
        ("openai/gpt-4o-mini", r"it names no provider \(did you mean 'openai:gpt-4o-mini'\?\)"),
        (" openai:gpt-4o-mini", "it has spaces"),
        ("openai: gpt-4o-mini", "it has spaces"),
        (":gpt-4o-mini", "a part is empty"),
        ("openai:", "a part is empty"),
    ],
)
def test_a_malformed_model_string_fails_at_class_definition(spec: str, problem: str) -> None:
    with pytest.raises(ConfigurationError, match=rf"'provider:model' .*: {problem}"):
        type("Bad", (Agent,), {"model": spec})


def test_a_well_formed_model_string_is_resolved_when_needed() -> None:
    """An unknown provider may be registered after the class is defined; its prefix, like
    every provider's, is case-insensitive."""

    class Later(Agent):
        model = "Later-Provider:tiny"

    with pytest.raises(ConfigurationError, match="unknown provider 'later-provider'"):
        Later().run_sync("hi")
    register_provider("later-provider", lambda name: ScriptedModel([text_response(str(name))]))
    assert Later().run_sync("hi").output == "tiny"
    assert Agent(model="LATER-PROVIDER").run_sync("hi").output == "None"


@pytest.mark.parametrize(
    ("spec", "meant"),
    [
        ("open-ai:gpt-4o", "openai"),
        ("Antrhopic:claude-sonnet-4-5", "anthropic"),
        ("claude:x", None),
    ],
)
def test_a_misspelled_provider_is_named_with_the_one_meant(spec: str, meant: str | None) -> None:
    """The run that resolves the string says which known provider a near miss meant."""

    class Typo(Agent):
        model = spec

    with pytest.raises(ConfigurationError) as caught:
        Typo().run_sync("hi")
    provider = spec.partition(":")[0].lower()
    hint = f"did you mean {meant!r}? " if meant else ""
    assert str(caught.value).startswith(
        f"model: unknown provider {provider!r} in {spec!r} ({hint}known providers: anthropic, "
    )


@pytest.mark.parametrize("name", ["azure/openai", "my provider", "_fake", "Ünï.cödé"])
def test_a_provider_name_is_any_str_without_a_colon(name: str) -> None:
    """Registered under any such name, in any case, a provider resolves through strings."""
    register_provider(name, lambda model: ScriptedModel([text_response(f"{model}")]))
    assert Agent(model=f"{name.upper()}:tiny").run_sync("hi").output == "tiny"
    assert Agent(model=name).run_sync("hi").output == "None"


@pytest.mark.parametrize("name", ["", "a:b", None])
def test_a_provider_name_that_no_string_can_carry_is_rejected(name: Any) -> None:
    with pytest.raises(
        ConfigurationError, match=r"register_provider: name must be a non-empty str without ':'"
    ):
        register_provider(name, lambda model: ScriptedModel([]))


MEMBERS = {
    "name": "mine",
    "provider": "mine",
    "context_window": None,
    "respond": lambda self, request: text_response("ok"),
}


@pytest.mark.parametrize(
    "has",
    [kept for size in range(1, 4) for kept in itertools.combinations(MEMBERS, size)],
    ids=lambda kept: "+".join(kept),
)
def test_a_model_of_your_own_that_lacks_a_member_is_told_which(has: tuple[str, ...]) -> None:
    """It was ``not Mine``, nothing more, whether declared or given to the constructor."""
    mine = type("Mine", (), {member: MEMBERS[member] for member in has})()
    lacks = ", ".join(member for member in MEMBERS if member not in has)
    told = rf"not Mine \(a Model has name, .*; it has no {lacks}\)$"
    with pytest.raises(ConfigurationError, match=told):
        type("Own", (Agent,), {"model": mine})
    with pytest.raises(ConfigurationError, match=told):
        Agent(model=mine)
    with pytest.raises(ConfigurationError, match=r"not int$"):
        Agent(model=3)  # type: ignore[arg-type]


async def _async_factory(model: str | None) -> ScriptedModel:
    return ScriptedModel([])


class _AsyncFactory:
    async def __call__(self, model: str | None) -> ScriptedModel:
        return ScriptedModel([])


@pytest.mark.parametrize(
    ("factory", "problem"),
    [
        (lambda: ScriptedModel([]), r"its signature \(\) does not \(too many positional"),
        (lambda model, window: ScriptedModel([]), "missing a required argument: 'window'"),
        (_async_factory, "is an async def: it must return the model itself"),
        (_AsyncFactory(), "is an async def: it must return the model itself"),
    ],
)
def test_a_factory_that_cannot_take_the_model_part_is_refused_as_it_is_registered(
    factory: Any, problem: str
) -> None:
    """It failed at the agent's first run, with the call's own ``TypeError`` from inside
    the registry (or, an ``async def``, saying it returned no Model)."""
    with pytest.raises(ConfigurationError, match=problem) as caught:
        register_provider("slip", factory)
    assert str(caught.value).startswith("register_provider: the factory for 'slip' ")
    with pytest.raises(ConfigurationError, match="unknown provider 'slip'"):
        Agent(model="slip:tiny").run_sync("hi")


@functools.cache
def rebuilt_agents() -> dict[str, type[Agent]]:
    """Agent classes that ``attrs.define`` and ``dataclass(slots=True)`` make anew from the
    namespace of the class they decorate, with ``@manage_context`` above and below."""

    class Fields:
        """What each of them declares, but its fields."""

        instructions: str | Callable[..., Any] | None = "Help."

        @tool
        def plan(self) -> str:
            """Say the customer's plan."""
            return f"{self.customer}: gold"  # type: ignore[attr-defined]

        @before_model
        def audit(self, request: ModelRequest) -> None:
            self.audited += 1  # type: ignore[attr-defined]

    @attrs.define
    class Attrs(Fields, Agent[str]):
        customer: str
        audited: int = 0

        def __attrs_post_init__(self) -> None:
            Agent.__init__(self, model=ScriptedModel(plan_steps()))

    @manage_context(compression_threshold=0.5)
    @attrs.define
    class AttrsDecoratedAfter(Attrs):
        pass

    @attrs.define
    @manage_context(compression_threshold=0.5)
    class AttrsDecoratedBefore(Attrs):
        pass

    @dataclasses.dataclass(slots=True)
    @manage_context(compression_threshold=0.5)
    class Slotted(Fields, Agent):
        customer: str
        audited: int = 0

        def __post_init__(self) -> None:
            Agent.__init__(self, model=ScriptedModel(plan_steps()))

    return {
        cls.__name__: cls for cls in (Attrs, AttrsDecoratedAfter, AttrsDecoratedBefore, Slotted)
    }


def plan_steps() -> list[ModelResponse]:
    return [tool_call_response("plan", {}), text_response("done")]


@pytest.mark.parametrize(
    "name", ["Attrs", "AttrsDecoratedAfter", "AttrsDecoratedBefore", "Slotted"]
)
async def test_an_attrs_or_slotted_dataclass_agent_class_is_set_up_as_its_own(name: str) -> None:
    """Such a class is not the one its body defined: it is checked and set up afresh, with
    its tools, hooks, capabilities and session store."""
    agent_class = rebuilt_agents()[name]
    agent = agent_class(customer="ada")  # type: ignore[call-arg]
    session = f"s-{time.monotonic_ns()}"
    result = await agent.run("Which plan?", session_id=session)
    (content,) = [part.content for message in result.messages for part in message.tool_results]
    assert (content, agent.audited) == ("ada: gold", 2)  # type: ignore[attr-defined]
    stored = await agent_class.session_store.load(session)
    assert [m.id for m in stored] == [m.id for m in result.messages]
    decorated = name != "Attrs"
    assert [c.name for c in agent_class.capabilities] == ["manage_context"] * decorated
    assert (agent_class.context_management is not None) is decorated


def test_rebuilt_agent_classes_keep_their_sessions_apart() -> None:
    """Each has a store of its own, a subclass too (the store made for the class a
    rebuilt one replaced is no declaration to inherit)."""
    stores = [cls.session_store for cls in rebuilt_agents().values()]
    assert len({id(store) for store in [*stores, Agent.session_store]}) == len(stores) + 1


@pytest.mark.parametrize("name", ["Attrs", "Slotted"])
@pytest.mark.parametrize("copier", [copy.copy, copy.deepcopy], ids=["copy", "deepcopy"])
async def test_a_copy_of_an_attrs_or_slotted_dataclass_agent_keeps_fields_and_setup(
    name: str, copier: Callable[[Agent], Agent]
) -> None:
    """A copy (or a pickle) of such an agent has its fields, kept in slots, and what the
    agent keeps in its ``__dict__``: attrs' own state methods kept the fields alone, and a
    dataclass's took the agent's, which kept the slots out."""
    agent = rebuilt_agents()[name](customer="ada")  # type: ignore[call-arg]
    copied = copier(agent)
    result = await copied.run("Which plan?")
    (content,) = [part.content for message in result.messages for part in message.tool_results]
    assert (content, copied.audited) == ("ada: gold", 2)  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", ["attrs", "dataclass"])
def test_a_frozen_attrs_class_or_dataclass_agent_is_a_configuration_error(kind: str) -> None:
    """A frozen one cannot be an agent, which sets attributes of its own: the error says
    so, rather than the frozen class's own about the first attribute the agent set."""
    model = ScriptedModel([text_response("hi")])
    if kind == "attrs":

        @attrs.frozen
        class Frozen(Agent):
            customer: str

            def __attrs_post_init__(self) -> None:
                Agent.__init__(self, model=model)

    else:

        @dataclasses.dataclass(frozen=True)
        class Frozen(Agent):  # type: ignore[no-redef]
            customer: str

            def __post_init__(self) -> None:
                Agent.__init__(self, model=model)

    with pytest.raises(ConfigurationError, match=r"^Frozen is a frozen attrs class or datacl"):
        Frozen(customer="ada")
