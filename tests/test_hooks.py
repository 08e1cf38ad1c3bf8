"""Hooks: order, replacement, sync and async, the run context, failures, recovery."""

from __future__ import annotations

import contextlib
import functools
import random
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs
import pytest

from littleghost import (
    Agent,
    Message,
    Role,
    RunContext,
    TextPart,
    ToolCall,
    ToolResult,
    after_model,
    after_model_error,
    after_tool,
    before_model,
    before_tool,
    manage_context,
    tool,
)
from littleghost.capabilities import CapabilityHook
from littleghost.context import PromptBudget
from littleghost.errors import (
    ConfigurationError,
    ContextWindowOverflowError,
    InvalidRequestError,
    ProviderError,
)
from littleghost.events import Event, ModelCallRetried
from littleghost.hooks import HOOK_KINDS
from littleghost.models import ModelRequest, ModelResponse, Usage
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import (
    ScriptedModel,
    text_response,
    tool_call_response,
    tool_calls_response,
)

from .conversations import badly_paired

if TYPE_CHECKING:
    from conftest import Spans

pytestmark = pytest.mark.anyio


class Recorder(Agent):
    """An agent whose hooks note their names in ``self.order``."""

    def __init__(self, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.order: list[str] = []


class Ancestor(Recorder):
    @before_model
    def first(self, request: ModelRequest) -> None:
        self.order.append("ancestor.first")

    @before_model
    def second(self, request: ModelRequest) -> None:
        self.order.append("ancestor.second")


class Descendant(Ancestor):
    @before_model
    def third(self, request: ModelRequest) -> None:
        self.order.append("descendant.third")

    @before_model
    def first(self, request: ModelRequest) -> None:
        self.order.append("descendant.first")


class Undecorated(Ancestor):
    def second(self, request: ModelRequest) -> None:
        self.order.append("undecorated.second")


class Disabled(Ancestor):
    first = None  # type: ignore[assignment]


async def run_order(agent_class: type[Recorder]) -> list[str]:
    """The hooks that ran, in order, for one model call."""
    agent = agent_class(model=ScriptedModel([text_response("ok")]))
    await agent.run("hi")
    return agent.order


async def test_hooks_run_in_definition_order() -> None:
    """A class's hooks run in the order they are defined."""
    assert await run_order(Ancestor) == ["ancestor.first", "ancestor.second"]


async def test_parent_hooks_run_first_and_overrides_keep_their_place() -> None:
    """Parent hooks run first; an overriding method runs in the place of the one it replaces."""
    assert await run_order(Descendant) == [
        "descendant.first",
        "ancestor.second",
        "descendant.third",
    ]


async def test_an_override_without_the_decorator_still_replaces_the_hook() -> None:
    """Hooks are found by name, so an undecorated override replaces the hook in place."""
    assert await run_order(Undecorated) == ["ancestor.first", "undecorated.second"]


async def test_overriding_a_hook_with_none_disables_it() -> None:
    """A subclass that sets a hook's name to None turns that hook off."""
    assert await run_order(Disabled) == ["ancestor.second"]


async def test_parent_hooks_are_unchanged_by_a_subclass() -> None:
    """The parent still runs its own hooks after subclasses override them."""
    assert await run_order(Ancestor) == ["ancestor.first", "ancestor.second"]


class Guard:
    """A plain mixin (not an Agent subclass) with hooks and a tool."""

    order: list[str]

    @before_model
    def guard_model(self, request: ModelRequest) -> None:
        self.order.append("guard.model")

    @before_tool
    def refuse_refunds(self, call: ToolCall) -> None:
        self.order.append(f"guard.{call.name}")
        if call.name == "refund":
            raise PermissionError("refunds need a human")

    @tool
    def ping(self) -> str:
        """Answer pong."""
        return "pong"


class Guarded(Guard, Descendant):
    @tool
    def refund(self, order_id: str) -> str:
        """Refund an order."""
        self.order.append("refunded")
        return "refunded"


async def test_a_mixins_hooks_run_in_their_mro_place() -> None:
    """Hooks of a plain mixin are bound and run after those of the classes after it in
    the MRO, as its tools are offered: its guard holds."""
    model = ScriptedModel([tool_call_response("refund", {"order_id": "42"})])
    agent = Guarded(model=model)
    assert sorted(agent.tool_names) == ["ping", "refund"]
    with pytest.raises(PermissionError, match="refunds need a human"):
        await agent.run("refund 42")
    assert agent.order == [
        "descendant.first",
        "ancestor.second",
        "descendant.third",
        "guard.model",
        "guard.refund",
    ]


def test_a_mixins_hook_signature_is_checked_at_class_definition() -> None:
    class Mixin:
        @after_tool
        def check(self) -> None:
            pass

    with pytest.raises(ConfigurationError, match=r"Mixed\.check, a @after_tool hook"):
        type("Mixed", (Mixin, Agent), {})


class Replacing(Recorder):
    @before_model
    def add_seed(self, request: ModelRequest) -> ModelRequest:
        return attrs.evolve(request, settings={**request.settings, "seed": 7})

    @before_model
    async def add_temperature(self, request: ModelRequest) -> ModelRequest:
        self.order.append(f"saw seed {request.settings.get('seed')}")
        return attrs.evolve(request, settings={**request.settings, "temperature": 0.1})

    @before_model
    def keep(self, request: ModelRequest) -> None:
        self.order.append(f"saw {sorted(request.settings)}")


@pytest.mark.parametrize(
    "decorator", [before_model, after_model, after_model_error, before_tool, after_tool]
)
def test_a_hook_decorator_with_parentheses_says_to_leave_them_out(decorator: Any) -> None:
    """``@tool()`` takes options; a hook decorator takes none, and says so."""
    with pytest.raises(ConfigurationError, match=rf"@{decorator.__name__} takes no arguments"):
        decorator()


class Logger:
    def log(self, request: ModelRequest) -> None:
        """Log a request."""


@pytest.mark.parametrize("target", [Logger().log, print], ids=["bound method", "builtin"])
def test_a_hook_decorator_on_what_it_cannot_mark_says_to_wrap_it(target: Any) -> None:
    """A bound method or a builtin takes no mark: ``ConfigurationError`` naming it, not
    an ``AttributeError`` about littleghost's own attribute."""
    with pytest.raises(ConfigurationError, match=r"@before_model decorates a function .*wrap it"):
        before_model(target)


async def test_a_coroutine_an_async_hook_returns_is_awaited() -> None:
    """An ``await`` left out of a hook's return statement: the request it would give is
    used, as a sync hook's awaitable is."""

    class Forgetful(Agent):
        @before_model
        async def cap(self, request: ModelRequest) -> ModelRequest:
            return self.capped(request)  # type: ignore[return-value]

        async def capped(self, request: ModelRequest) -> ModelRequest:
            return attrs.evolve(request, settings={**request.settings, "max_tokens": 5})

    model = ScriptedModel([text_response("ok")])
    await Forgetful(model=model).run("hi")
    assert model.requests[0].settings["max_tokens"] == 5


def test_a_hook_or_tool_set_on_a_made_agent_is_refused() -> None:
    """Hooks and tools are bound as the agent is made: one set on it afterwards would
    take effect only at some later rebinding, so it fails where it is set; before
    ``super().__init__()`` it is taken."""

    class Audited(Agent):
        @before_model
        def audit(self, request: ModelRequest) -> None:
            raise AssertionError("turned off")

        @tool
        def lookup(self, query: str) -> str:
            """Look something up."""
            return query

    agent = Audited(model=ScriptedModel([text_response("ok")]))
    with pytest.raises(ConfigurationError, match=r"Audited\.audit is a hook, bound as the agent"):
        agent.audit = None  # type: ignore[assignment]
    with pytest.raises(ConfigurationError, match=r"Audited\.lookup is a tool, bound as the agent"):
        agent.lookup = len  # type: ignore[assignment]

    class Quiet(Audited):
        def __init__(self, **overrides: Any) -> None:
            self.audit = None  # type: ignore[assignment]
            super().__init__(**overrides)

    assert Quiet(model=ScriptedModel([text_response("ok")])).run_sync("hi").output == "ok"


@pytest.mark.parametrize("replacement", [None, len, lambda query: "stale"])
def test_a_tool_set_on_the_instance_before_it_is_made_is_refused(replacement: Any) -> None:
    """A ``@tool`` method's name set before ``super().__init__()`` replaced the function
    the tool runs, unchecked, under the method's schema (and ``None`` left the tool
    offered): it fails in the constructor, as it does once the agent is made."""

    class Audited(Agent):
        @tool
        def lookup(self, query: str) -> str:
            """Look something up."""
            return query

    class PerInstance(Audited):
        def __init__(self, **overrides: Any) -> None:
            self.lookup = replacement
            super().__init__(**overrides)

    with pytest.raises(ConfigurationError, match=r"PerInstance\.lookup is a tool, bound as"):
        PerInstance(model=ScriptedModel([text_response("ok")]))


def test_a_hook_set_on_the_instance_is_checked_as_the_agent_is_made() -> None:
    """A hook set before ``super().__init__()`` that cannot take what its kind gets fails
    in the constructor, naming it, as one declared on the class fails at definition."""

    class Audited(Agent):
        @after_model
        def audit(self, response: ModelResponse) -> None:
            return None

    def audit(response: ModelResponse, extra: object) -> None:
        return None

    def audit_in_context(response: ModelResponse, *, context: RunContext) -> None:
        return None

    class PerInstance(Audited):
        def __init__(self, hook: Any, **overrides: Any) -> None:
            self.audit = hook  # type: ignore[method-assign]
            super().__init__(**overrides)

    model = ScriptedModel([text_response("ok")])
    with pytest.raises(
        ConfigurationError,
        match=r"PerInstance\.audit, a @after_model hook set on the instance, must accept "
        r"\(response\)",
    ):
        PerInstance(audit, model=model)
    assert model.requests == []
    assert PerInstance(audit_in_context, model=model).run_sync("hi").output == "ok"


async def test_before_model_replacement_reaches_later_hooks_and_the_call() -> None:
    """A returned request is what later hooks (sync or async) and the model receive."""
    model = ScriptedModel([text_response("ok")])
    agent = Replacing(model=model)
    await agent.run("hi")
    assert agent.order == ["saw seed 7", "saw ['seed', 'temperature']"]
    assert model.requests[0].settings == {"seed": 7, "temperature": 0.1}


class Rewriting(Agent):
    @after_model
    async def shout(self, response: ModelResponse) -> ModelResponse:
        message = attrs.evolve(response.message, content=response.message.text.upper())
        return attrs.evolve(response, message=message)

    @after_model
    def exclaim(self, response: ModelResponse) -> ModelResponse:
        message = attrs.evolve(response.message, content=response.message.text + "!")
        return attrs.evolve(response, message=message)


async def test_after_model_replacement_reaches_the_result_and_the_log() -> None:
    """A replaced response is what the run returns and what the log keeps."""
    result = await Rewriting(model=ScriptedModel([text_response("hello")])).run("hi")
    assert result.output == "HELLO!"
    assert result.messages[-1].text == "HELLO!"


class ToolHooks(Recorder):
    @tool
    async def square(self, n: int) -> int:
        """Square a number."""
        self.order.append(f"square({n})")
        return n * n

    @before_tool
    def double_input(self, call: ToolCall) -> ToolCall:
        assert isinstance(call.arguments, Mapping)
        return attrs.evolve(call, arguments={"n": call.arguments["n"] * 2})

    @after_tool
    async def annotate(self, result: ToolResult) -> ToolResult:
        return attrs.evolve(result, content=f"result={result.content}")


async def test_tool_hooks_replace_the_call_and_the_result() -> None:
    """before_tool changes what the tool receives; after_tool changes what the model sees."""
    model = ScriptedModel(
        [tool_call_response("square", {"n": 3}, call_id="c1"), text_response("done")]
    )
    agent = ToolHooks(model=model)
    await agent.run("square 3")
    assert agent.order == ["square(6)"]
    seen = model.requests[1].messages[-1].tool_results[0]
    assert (seen.call_id, seen.content) == ("c1", "result=36")


class ContextHooks(Recorder):
    @before_model
    def keyword_only(self, request: ModelRequest, *, context: RunContext) -> None:
        context.state["seen"] = context.turn
        self.order.append(type(context).__name__)

    @after_model
    async def positional(self, response: ModelResponse, context: RunContext) -> None:
        self.order.append(f"{len(context.messages)} messages, state {context.state['seen']}")


async def test_a_hook_declaring_context_receives_the_run_context() -> None:
    """Hooks with a ``context`` parameter get the RunContext, keyword-only or not."""
    agent = ContextHooks(model=ScriptedModel([text_response("ok")]))
    await agent.run("hi")
    assert agent.order == ["RunContext", "1 messages, state 0"]


class Failing(Agent):
    @before_model
    def refuse(self, request: ModelRequest) -> None:
        raise PermissionError("not today")


async def test_a_raising_hook_ends_the_run() -> None:
    """An exception from a hook propagates and the model is never called."""
    model = ScriptedModel([text_response("ok")])
    with pytest.raises(PermissionError, match="not today"):
        await Failing(model=model).run("hi")
    assert model.requests == []


class FailingToolHook(Agent):
    @tool
    async def noop(self) -> str:
        """Do nothing."""
        return ""

    @after_tool
    async def refuse(self, result: ToolResult) -> None:
        raise PermissionError("no results")


async def test_a_raising_tool_hook_ends_the_run() -> None:
    """An exception from a tool hook propagates instead of becoming a tool result."""
    model = ScriptedModel([tool_call_response("noop", {}), text_response("never")])
    with pytest.raises(PermissionError, match="no results"):
        await FailingToolHook(model=model).run("hi")
    assert len(model.requests) == 1


class Gate(Agent):
    @tool
    async def wire(self, amount: int) -> str:
        """Wire money."""
        raise AssertionError("a refused answer's call must never run")

    @after_model
    def refuse_wires(self, response: ModelResponse) -> None:
        if response.message.tool_calls or "secret" in response.message.text:
            raise PermissionError("answer refused")


@pytest.mark.parametrize("calls", [True, False], ids=["tool call", "text"])
async def test_a_raising_after_model_hook_is_a_gate_that_keeps_the_answer_out(
    spans: Spans, calls: bool
) -> None:
    """An ``after_model`` hook that raises refuses the answer: the run raises the hook's
    exception, and the answer is neither in the log nor in the session (the next run
    would send the refused content back to the model), so no call stays without a
    result; the billed call is counted all the same, on its ``chat`` span and the run's
    ``invoke_agent`` span. The session goes on from the question, as after a failed
    call."""
    store = InMemorySessionStore()
    refused = (
        tool_call_response("wire", {"amount": 10**6}, input_tokens=40, output_tokens=7)
        if calls
        else text_response("the secret is 42", input_tokens=40, output_tokens=7)
    )
    model = ScriptedModel([refused, text_response("fine", input_tokens=50, output_tokens=2)])
    agent = Gate(model=model, session_store=store)
    with pytest.raises(PermissionError, match="answer refused"):
        await agent.run("pay", session_id="s")
    stored = await store.load("s")
    assert [(m.role, m.text) for m in stored] == [(Role.USER, "pay")]
    [chat] = spans.named("chat")
    [run] = spans.named("invoke_agent")
    for span in (chat, run):
        attributes = span.attributes or {}
        assert attributes["gen_ai.usage.input_tokens"] == 40
        assert attributes["gen_ai.usage.output_tokens"] == 7
    result = await agent.run("hello", session_id="s")
    assert result.output == "fine"
    assert [m.text for m in model.requests[1].messages] == ["pay", "hello"]


class WrongType(Agent):
    @before_model
    def confused(self, request: ModelRequest) -> str:
        return "a string"


class WrongTypeOverride(WrongType):
    def confused(self, request: ModelRequest) -> int:  # type: ignore[override]
        return 3


@pytest.mark.parametrize(
    ("agent_class", "named"),
    [
        (WrongType, r"WrongType\.confused returned str"),
        (WrongTypeOverride, r"WrongTypeOverride\.confused returned int"),
    ],
)
async def test_a_hook_returning_a_wrong_type_fails_clearly(
    agent_class: type[Agent], named: str
) -> None:
    """A hook that returns neither None nor a ModelRequest raises TypeError naming both,
    and the hook by the class that defines it (an override's own class)."""
    with pytest.raises(TypeError, match=rf"hook {named}; .*ModelRequest"):
        await agent_class(model=ScriptedModel([text_response("ok")])).run("hi")


class Recovering(Recorder):
    @after_model_error
    def shorten(self, request: ModelRequest, error: Exception) -> ModelRequest:
        self.order.append(type(error).__name__)
        return attrs.evolve(request, settings={"attempt": len(self.order)})


async def test_after_model_error_replacement_retries_the_call() -> None:
    """A replacement request from after_model_error is sent again and can succeed."""
    model = ScriptedModel([InvalidRequestError("bad", status=400), text_response("fixed")])
    agent = Recovering(model=model)
    result = await agent.run("hi")
    assert result.output == "fixed"
    assert agent.order == ["InvalidRequestError"]
    assert model.requests[1].settings == {"attempt": 1}


async def test_at_most_three_recoveries_then_the_error_propagates() -> None:
    """After three replacement requests a fourth failure propagates."""
    failures = [InvalidRequestError(f"bad {n}", status=400) for n in range(5)]
    model = ScriptedModel([*failures, text_response("never")])
    agent = Recovering(model=model)
    with pytest.raises(InvalidRequestError, match="bad 3"):
        await agent.run("hi")
    assert len(model.requests) == 4
    assert len(agent.order) == 3


class Observing(Recorder):
    @after_model_error
    async def observe(self, request: ModelRequest, error: Exception) -> None:
        self.order.append(str(error))


async def test_after_model_error_returning_none_lets_the_error_propagate() -> None:
    """A hook that returns None sees the error, which then propagates unchanged."""
    error = InvalidRequestError("rejected", status=400)
    model = ScriptedModel([error, text_response("never")])
    agent = Observing(model=model)
    with pytest.raises(ProviderError) as caught:
        await agent.run("hi")
    assert caught.value is error
    assert agent.order == ["rejected"]
    assert len(model.requests) == 1


class RecoveringWithBefore(Recovering):
    @before_model
    def count(self, request: ModelRequest) -> None:
        self.order.append("before")


async def test_before_model_hooks_run_again_on_a_replacement_request() -> None:
    """A replacement request passes through the before_model hooks again."""
    model = ScriptedModel([InvalidRequestError("bad", status=400), text_response("ok")])
    agent = RecoveringWithBefore(model=model)
    await agent.run("hi")
    assert agent.order == ["before", "InvalidRequestError", "before"]


def test_a_function_is_a_hook_of_one_kind() -> None:
    """Marking a hook with a second kind raises ConfigurationError naming both."""
    with pytest.raises(ConfigurationError, match="already a before_model hook"):

        class Bad(Agent):
            @after_model
            @before_model
            def both(self, value: Any) -> None:
                pass


async def test_a_subclass_cannot_remark_its_parents_hook() -> None:
    """Re-marking a parent's hook function as another kind fails; the parent is unchanged."""
    with pytest.raises(ConfigurationError, match="after_model"):

        class Bad(Ancestor):
            moved = after_model(Ancestor.first)

    assert await run_order(Ancestor) == ["ancestor.first", "ancestor.second"]


@pytest.mark.parametrize(
    ("member", "decorator"),
    [
        ("output", after_model),
        ("hooks", before_model),
        ("name", after_model),
        ("run", after_model),
        ("instructions", before_model),
        ("tool_names", after_tool),
        ("model", before_tool),
        ("__init__", after_model_error),
    ],
)
def test_a_hook_method_named_like_an_agent_member_fails(member: str, decorator: Any) -> None:
    """A hook method would replace the Agent method, property or knob of its name."""

    def hook(self: Agent, payload: Any, error: Any = None) -> None:
        pass

    kind = decorator.__name__
    with pytest.raises(
        ConfigurationError,
        match=re.escape(
            f"Shadowing.{member}: the @{kind} hook {member!r} would replace Agent.{member}; "
            "give the method another name"
        ),
    ):
        type("Shadowing", (Agent,), {member: decorator(hook)})

    class Mixin:
        @before_model
        def stream(self, request: ModelRequest) -> None:
            pass

    with pytest.raises(ConfigurationError, match=r"Mixin\.stream: the @before_model hook"):
        type("Mixed", (Mixin, Agent), {})


def cap(self: Agent) -> None:
    """A before_model hook that takes no request."""


def recover(self: Agent, request: ModelRequest) -> None:
    """An after_model_error hook that takes no error."""


def context_first(self: Agent, context: RunContext, request: ModelRequest) -> None:
    """A hook with ``context`` where the request goes."""


def extra_keyword(self: Agent, request: ModelRequest, *, limit: int) -> None:
    """A hook with a required keyword no one passes."""


@pytest.mark.parametrize(
    ("decorator", "function", "expected"),
    [
        (before_model, cap, r"\(self, request\)"),
        (after_model_error, recover, r"\(self, request, error\)"),
        (before_model, context_first, r"\(self, request\) and the keyword context="),
        (before_model, extra_keyword, r"\(self, request\);"),
    ],
)
def test_a_hook_that_cannot_take_its_arguments_fails_at_class_definition(
    decorator: Any, function: Any, expected: str
) -> None:
    """The class names the hook, its kind and the parameters it must accept."""
    kind = decorator.__name__
    name = function.__name__
    with pytest.raises(
        ConfigurationError, match=rf"Bad\.{name}, a @{kind} hook, must accept {expected}"
    ):
        type("Bad", (Agent,), {name: decorator(function)})


def context_as_ctx(self: Agent, request: ModelRequest, ctx: RunContext) -> None:
    """A hook that names its context as a tool may (a tool's is found by annotation)."""


def context_by_annotation(self: Agent, call: ToolCall, run: RunContext) -> None:
    """A hook whose context parameter has another name, annotated."""


@pytest.mark.parametrize(
    ("decorator", "function", "advised"),
    [
        (before_model, context_as_ctx, True),
        (before_tool, context_by_annotation, True),
        (before_model, extra_keyword, False),
    ],
)
def test_a_hook_whose_context_parameter_is_named_otherwise_is_told_its_name(
    decorator: Any, function: Any, advised: bool
) -> None:
    """A hook parameter nothing fills that looks meant for the context (``ctx``, or
    annotated ``RunContext``) gets the name it needs; another is not told so."""
    name = function.__name__
    with pytest.raises(ConfigurationError) as caught:
        type("Bad", (Agent,), {name: decorator(function)})
    advice = "; a hook gets the RunContext only through a parameter named context"
    assert str(caught.value).endswith(advice) is advised


def ctx_optional(self: Agent, request: ModelRequest, ctx: Any = None) -> None:
    """Its ctx keeps its default: nothing fills it."""


def run_optional(self: Agent, call: ToolCall, run: RunContext | None = None) -> None:
    """Annotated as a tool's context parameter may be, optional."""


def ctx_for_the_error(self: Agent, request: ModelRequest, ctx: Any) -> None:
    """Its ctx gets the error."""


def context_by_annotation_first(self: Agent, context_: RunContext) -> None:
    """Gets the request, annotated RunContext."""


@pytest.mark.parametrize(
    ("decorator", "function"),
    [
        (before_model, ctx_optional),
        (before_tool, run_optional),
        (after_model_error, ctx_for_the_error),
        (before_model, context_by_annotation_first),
    ],
)
@pytest.mark.parametrize("where", ["class", "instance"])
def test_a_hook_parameter_meant_for_the_context_under_another_name_fails(
    decorator: Any, function: Any, where: str
) -> None:
    """A hook parameter named ``ctx`` or annotated ``RunContext`` that nothing fills
    would keep its default, and one filled gets what the hook's kind is called with, never
    the context: either fails, saying the parameter's name it needs."""
    name = function.__name__
    advice = "a hook gets the RunContext only through a parameter named context"
    if where == "class":
        with pytest.raises(ConfigurationError, match=rf"Bad\.{name}, .*{advice}"):
            type("Bad", (Agent,), {name: decorator(function)})
        return

    class Holder(Agent):
        @decorator
        def hook(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __init__(self) -> None:
            self.hook = functools.partial(function, self)
            super().__init__(model=ScriptedModel([]))

    with pytest.raises(ConfigurationError, match=rf"Holder\.hook, .*{advice}"):
        Holder()


def test_a_capability_hook_parameter_meant_for_the_context_under_another_name_fails() -> None:
    def noted(agent: Agent, request: ModelRequest, *, context: Any, ctx: Any = None) -> None:
        pass

    with pytest.raises(
        ConfigurationError,
        match=r"noted, the before_model hook of a capability, has a parameter 'ctx' for the "
        r"RunContext, .*: a hook gets the RunContext only through a parameter named context",
    ):
        CapabilityHook("before_model", noted)


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        *((kind, kind) for kind in HOOK_KINDS),
        ("before_modle", "before_model"),
        ("after_tools", "after_tool"),
        ("aftr_model_error", "after_model_error"),
    ],
)
@pytest.mark.parametrize("where", ["class", "mixin"])
def test_a_method_named_like_a_hook_kind_without_its_decorator_fails(
    name: str, meant: str, where: str
) -> None:
    """A method named like a hook kind (or almost) that no decorator marks and that
    overrides no hook would never be called: the class names the decorator it lacks."""

    async def method(self: Agent, payload: Any, *, context: RunContext) -> None:
        pass

    bases = (type("Mixin", (), {name: method}), Agent) if where == "mixin" else (Agent,)
    body = {} if where == "mixin" else {name: method}
    owner = "Mixin" if where == "mixin" else "Bad"
    with pytest.raises(
        ConfigurationError,
        match=rf"{owner}\.{name} is not a hook.*: a hook is a method marked @{meant}",
    ):
        type("Bad", bases, body)


@pytest.mark.parametrize("made", [True, False], ids=["made", "in __init__"])
def test_a_function_named_like_a_hook_kind_set_on_an_agent_fails(made: bool) -> None:
    """``agent.before_model = ...`` (on a made agent, or before ``super().__init__()``) is
    no hook: nothing would call it."""

    def note(request: ModelRequest) -> None:
        pass

    class Noting(Agent):
        def __init__(self) -> None:
            if not made:
                self.before_model = note
            super().__init__(model=ScriptedModel([]))

    with pytest.raises(
        ConfigurationError,
        match=r"Noting\.before_model is not a hook, and littleghost never calls it",
    ):
        Noting().before_model = note


def logged(function: Any) -> Any:
    """A decorator that forgets ``functools.wraps``: its wrapper has none of the marks."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return function(*args, **kwargs)

    return wrapper


@pytest.mark.parametrize("decorator", [before_model, after_tool, after_model_error])
@pytest.mark.parametrize("name", ["audit", "_audit"])
def test_a_hook_whose_decorator_dropped_its_mark_fails(decorator: Any, name: str) -> None:
    """A decorator over a hook that does not keep its mark (no ``functools.wraps``) makes
    a method nothing calls: the class says which hook it wraps and why."""

    def audit(self: Agent, *payload: Any) -> None:
        pass

    with pytest.raises(
        ConfigurationError,
        match=rf"Bad\.{name} wraps a @{decorator.__name__} hook but is none: its decorator "
        r"dropped the mark \(functools\.wraps keeps it\)",
    ):
        type("Bad", (Agent,), {name: logged(decorator(audit))})


def test_a_wrapper_keeping_the_mark_or_overriding_a_hook_is_taken() -> None:
    """``functools.wraps`` keeps the mark; a wrapper overriding a hook keeps the hook."""

    def kept(function: Any) -> Any:
        return functools.wraps(function)(logged(function))

    class Audited(Recorder):
        @kept
        @before_model
        def audit(self, request: ModelRequest) -> None:
            self.order.append("audit")

    class Rewrapped(Audited):
        audit = logged(Audited.audit)

    for agent_class in (Audited, Rewrapped):
        agent = agent_class(model=ScriptedModel([text_response("ok")]))
        assert [hook.name for hook in agent.hooks["before_model"]] == ["audit"]


def test_methods_named_like_a_hook_kind_that_are_hooks_or_helpers_are_taken() -> None:
    """An override of a hook method of that name keeps the hook, undecorated; a helper
    whose name only begins like a kind's, or a private one, is the class's own."""

    class Parent(Agent):
        @before_model
        def before_model(self, request: ModelRequest) -> None:
            pass

    class Child(Parent):
        def before_model(self, request: ModelRequest) -> None:  # still the hook
            pass

        def after_tool_call(self) -> None:
            pass

        def _after_tool(self) -> None:
            pass

    assert [hook.name for hook in Child(model=ScriptedModel([])).hooks["before_model"]] == [
        "before_model"
    ]


def test_an_override_that_cannot_take_the_hooks_arguments_fails() -> None:
    with pytest.raises(ConfigurationError, match=r"Child\.first, a @before_model hook"):

        class Child(Ancestor):
            def first(self) -> None:  # type: ignore[override]
                pass


class Counter:
    """A callable object used as a hook."""

    def __call__(self, request: ModelRequest) -> None:
        pass


async def test_every_valid_hook_signature_is_taken() -> None:
    class Flexible(Agent):
        @before_model
        def keyword_context(self, request: ModelRequest, *, context: RunContext) -> None:
            pass

        @before_model
        def optional_context(self, request: ModelRequest, context: Any = None) -> None:
            pass

        @before_model
        def anything(self, *args: Any, **kwargs: Any) -> None:
            pass

        @after_model_error
        def extra_optional(self, request: ModelRequest, error: Exception, note: str = "") -> None:
            pass

        @before_model
        @staticmethod
        def static(request: ModelRequest) -> None:
            pass

        @before_model
        @classmethod
        def of_the_class(cls, request: ModelRequest) -> None:
            pass

        counted = before_model(Counter())

    agent = Flexible(model=ScriptedModel([text_response("ok")]))
    assert (await agent.run("hi")).output == "ok"


class traced:
    """A class-based method decorator: binds through ``__get__``, like a function."""

    def __init__(self, function: Any) -> None:
        functools.update_wrapper(self, function)
        self.function = function

    def __get__(self, agent: object, owner: type | None = None) -> Any:
        return self if agent is None else functools.partial(self.function, agent)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)


def note(agent: Recorder, label: str, request: ModelRequest) -> None:
    agent.order.append(label)


async def test_hooks_bound_by_a_descriptor_are_taken_and_run() -> None:
    """A class-based decorator, a partialmethod override and an lru_cache wrapper bind to
    the agent as a method does: each is accepted at class definition and runs."""

    class Wrapped(Ancestor):
        @before_model
        @traced
        def decorated(self, request: ModelRequest) -> None:
            self.order.append("decorated")

        first = functools.partialmethod(note, "partialmethod")

        @tool
        def ping(self) -> str:
            """Answer pong."""
            return "pong"

        @after_tool
        @functools.lru_cache  # noqa: B019 - a result is hashable
        def cached(self, result: ToolResult) -> None:
            self.order.append(f"cached {result.content}")

    model = ScriptedModel([tool_call_response("ping", {}), text_response("ok")])
    agent = Wrapped(model=model)
    await agent.run("hi")
    assert agent.order == [
        "partialmethod",
        "ancestor.second",
        "decorated",
        "cached pong",
        "partialmethod",
        "ancestor.second",
        "decorated",
    ]


class Unbound:
    """A callable object without ``__get__``: an agent calls it as it is, without self."""

    def __call__(self) -> None:
        pass


def test_a_callable_object_hook_is_checked_as_it_is_called() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"Bad\.counted, a @before_model hook, must "
        r"accept \(request\); its signature \(\)",
    ):
        type("Bad", (Agent,), {"counted": before_model(Unbound())})


def test_instructions_that_cannot_take_the_run_context_fail_at_definition() -> None:
    with pytest.raises(ConfigurationError, match=r"Bad\.instructions must accept \(context\)"):
        type("Bad", (Agent,), {"instructions": lambda: "Be brief."})
    with pytest.raises(
        ConfigurationError, match=r"Bad\.instructions must accept \(self, context\)"
    ):

        class Bad(Agent):
            def instructions(self) -> str:  # type: ignore[override]
                return "Be brief."

    with pytest.raises(ConfigurationError, match=r"Agent\(…, instructions=\) must accept"):
        Agent(instructions=lambda: "Be brief.")


def test_a_capability_hook_that_cannot_take_its_arguments_fails() -> None:
    with pytest.raises(
        ConfigurationError,
        match=r"the after_model_error hook of a capability, must accept \(agent, request, error\)",
    ):
        CapabilityHook("after_model_error", lambda agent, request, *, context: None)


def test_a_generator_hook_or_instructions_fails_at_class_definition() -> None:
    """A hook or instructions that yield would hand back a generator, never a result."""
    with pytest.raises(ConfigurationError, match=r"Yielding\.note, a @before_tool hook, is a gen"):

        class Yielding(Agent):
            @before_tool
            def note(self, call: ToolCall) -> Any:
                yield call

    with pytest.raises(ConfigurationError, match=r"Streaming\.note, a @after_tool hook, is a gen"):

        class Streaming(Agent):
            @after_tool
            async def note(self, result: ToolResult) -> Any:
                yield result

    with pytest.raises(ConfigurationError, match=r"Told\.instructions is a generator function"):

        class Told(Agent):
            def instructions(self, context: RunContext) -> Any:
                yield "Be brief."

    def parts(context: RunContext) -> Any:
        yield "Be brief."

    with pytest.raises(ConfigurationError, match=r"instructions=\) is a generator function"):
        Agent(instructions=parts)


class Permissioned(Agent):
    """A permission hook: ``refund`` is taken out of the tools offered to the model."""

    def __init__(self, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.refunds: list[str] = []

    @tool
    def lookup(self, order: str) -> str:
        """Look an order up."""
        return f"{order}: shipped"

    @tool
    def refund(self, order: str) -> str:
        """Refund an order."""
        self.refunds.append(order)
        return "refunded"

    @before_model
    def without_refunds(self, request: ModelRequest) -> ModelRequest:
        tools = tuple(spec for spec in request.tools if spec.name != "refund")
        return attrs.evolve(request, tools=tools)


async def test_a_tool_a_hook_took_out_of_the_request_does_not_run() -> None:
    """A call to a tool the request did not offer is answered as an unknown tool, so a hook
    that narrows ``request.tools`` guards what runs."""
    model = ScriptedModel(
        [tool_call_response("refund", {"order": "42"}, call_id="c1"), text_response("ok")]
    )
    agent = Permissioned(model=model)
    result = await agent.run("Refund order 42.")
    assert agent.refunds == []
    (answer,) = [m for m in result.messages if m.tool_results]
    assert answer.tool_results[0].is_error
    assert answer.tool_results[0].content == "Unknown tool 'refund'. Available tools: lookup."
    assert [spec.name for spec in model.requests[0].tools] == ["lookup"]


async def test_a_before_tool_hook_may_route_a_call_to_a_tool_not_offered() -> None:
    """The check is on what the model asked for: a hook's own routing is trusted."""

    class Routing(Permissioned):
        @before_tool
        def escalate(self, call: ToolCall) -> ToolCall:
            return attrs.evolve(call, name="refund") if call.name == "lookup" else call

    model = ScriptedModel(
        [tool_call_response("lookup", {"order": "7"}, call_id="c1"), text_response("ok")]
    )
    agent = Routing(model=model)
    await agent.run("Order 7?")
    assert agent.refunds == ["7"]


async def test_an_after_model_hook_may_route_a_call_to_a_tool_not_offered() -> None:
    """Only the model's own calls are held to what the request offered."""

    class Routing(Permissioned):
        @after_model
        def escalate(self, response: ModelResponse) -> ModelResponse:
            calls = [
                attrs.evolve(call, name="refund") if call.name == "lookup" else call
                for call in response.message.tool_calls
            ]
            if not calls:
                return response
            return attrs.evolve(response, message=attrs.evolve(response.message, content=calls))

    model = ScriptedModel(
        [tool_call_response("lookup", {"order": "9"}, call_id="c1"), text_response("ok")]
    )
    agent = Routing(model=model)
    await agent.run("Order 9?")
    assert agent.refunds == ["9"]


async def test_a_hook_that_only_renames_call_ids_does_not_unhide_a_tool() -> None:
    """The model's call keeps being its own under an id an ``after_model`` hook gave it."""

    class Renaming(Permissioned):
        @after_model
        def unique_ids(self, response: ModelResponse) -> ModelResponse | None:
            calls = [
                attrs.evolve(call, id=f"turn-{call.id}") for call in response.message.tool_calls
            ]
            if not calls:
                return None
            return attrs.evolve(response, message=attrs.evolve(response.message, content=calls))

    model = ScriptedModel(
        [tool_call_response("refund", {"order": "42"}, call_id="c1"), text_response("ok")]
    )
    agent = Renaming(model=model)
    result = await agent.run("Refund order 42.")
    assert agent.refunds == []
    (answer,) = [m for m in result.messages if m.tool_results]
    assert answer.tool_results[0].content == "Unknown tool 'refund'. Available tools: lookup."


async def test_every_retry_keeps_what_the_recovery_hook_added() -> None:
    """Each replacement passes through the before_model hooks without what they added to
    the request it replaces, never without what the after_model_error hook added."""

    class Noted(Agent):
        max_retries = 0

        @before_model
        def retrieve(self, request: ModelRequest) -> ModelRequest:
            return attrs.evolve(request, messages=(*request.messages, Message.user("retrieved")))

        @after_model_error
        def ask_briefly(self, request: ModelRequest, error: Exception) -> ModelRequest | None:
            if not isinstance(error, InvalidRequestError):
                return None
            if any(m.id == "note" for m in request.messages):
                return attrs.evolve(request)
            note = Message.user("please answer briefly", id="note")
            return attrs.evolve(request, messages=(*request.messages, note))

    model = ScriptedModel(
        [InvalidRequestError("bad"), InvalidRequestError("bad"), text_response("ok")]
    )
    await Noted(model=model).run("hi")
    assert [[m.text for m in r.messages] for r in model.requests] == [
        ["hi", "retrieved"],
        ["hi", "please answer briefly", "retrieved"],
        ["hi", "please answer briefly", "retrieved"],
    ]


async def test_what_a_hook_injected_is_not_doubled_when_the_recovery_shortened_it() -> None:
    """A recovery hook that shortens the long messages of a refused request, keeping
    their ids, shortens what a retrieval hook injected too: the retry goes out with the
    retrieval's documents once, as the hook injects them again (they were sent twice,
    shortened and whole)."""

    class Retrieving(Agent):
        max_retries = 0

        @before_model
        def retrieve(self, request: ModelRequest) -> ModelRequest:
            documents = Message.system("Refund policy: " + "refunds within 30 days. " * 40)
            return attrs.evolve(request, messages=(documents, *request.messages))

        @after_model_error
        def shorten(self, request: ModelRequest, error: Exception) -> ModelRequest | None:
            if not isinstance(error, InvalidRequestError):
                return None
            messages = [
                attrs.evolve(m, content=[TextPart(m.text[:40])]) if len(m.text) > 40 else m
                for m in request.messages
            ]
            return attrs.evolve(request, messages=messages)

    model = ScriptedModel([InvalidRequestError("too long"), text_response("ok")])
    await Retrieving(model=model).run("Can I get a refund?")
    first, retried = ([m.text[:14] for m in r.messages] for r in model.requests)
    assert retried == first == ["Refund policy:", "Can I get a re"]


def masked(message: Message) -> Message:
    """A user message rebuilt with its card numbers masked, under a new id (as
    ``Message.user`` makes one); any other as it is."""
    if message.role != "user":
        return message
    return Message.user(re.sub(r"\d{4}", "####", message.text))


class Scrubbed(Agent):
    """Rebuilds every user message (``masked``) and retrieves a note before the question."""

    max_retries = 0

    @before_model
    def scrub(self, request: ModelRequest) -> ModelRequest:
        messages = [masked(m) for m in request.messages]
        return attrs.evolve(request, messages=(*messages[:-1], Message.user("note"), messages[-1]))

    @after_model_error
    def again(self, request: ModelRequest, error: Exception) -> ModelRequest | None:
        return attrs.evolve(request) if isinstance(error, InvalidRequestError) else None


@pytest.mark.parametrize("turns", [0, 2])
async def test_the_question_goes_back_when_the_recovery_changed_a_note_beside_it(
    turns: int,
) -> None:
    """A hook rebuilds the question and adds a note before it; the recovery changes the
    note (keeping its id): the retry goes out with the note and the question rebuilt
    again, as the first call (the question was lost, the changed note standing for it,
    and a second note was added)."""

    class Noting(Scrubbed):
        @after_model_error
        def again(self, request: ModelRequest, error: Exception) -> ModelRequest | None:
            changed = [
                attrs.evolve(m, content=[TextPart("NOTE")]) if m.text == "note" else m
                for m in request.messages
            ]
            return attrs.evolve(request, messages=changed)

    history = [
        message
        for turn in range(turns)
        for message in (Message.user(f"card 1234-{turn}"), Message.assistant(f"ok {turn}"))
    ]
    model = ScriptedModel([InvalidRequestError("bad"), text_response("done")])
    await Noting(model=model).run("is 5678 blocked?", history=history)
    first, retried = ([m.text for m in r.messages] for r in model.requests)
    assert retried == first
    assert first[-2:] == ["note", "is #### blocked?"]


@pytest.mark.parametrize("turns", [0, 2])
async def test_a_retry_keeps_the_messages_a_hook_rewrote_under_a_new_id(turns: int) -> None:
    """The retry passes what the hooks were given through them again: a message they
    rewrote under a new id goes back as it was, not out with what they added (the
    question was lost: the retry had no question, or the previous turn's)."""
    history = [
        message
        for turn in range(turns)
        for message in (Message.user(f"card 1234-{turn}"), Message.assistant(f"ok {turn}"))
    ]
    model = ScriptedModel([InvalidRequestError("bad"), text_response("done")])
    result = await Scrubbed(model=model).run("is 5678 blocked?", history=history)
    assert result.output == "done"
    first, retried = ([m.text for m in r.messages] for r in model.requests)
    assert retried == first
    assert first[-2:] == ["note", "is #### blocked?"]
    assert [m.text for m in result.messages if m.role == "user"][-1] == "is 5678 blocked?"


async def test_a_retry_after_hooks_dropped_older_messages_is_what_the_first_call_was() -> None:
    """One hook drops the older messages, another rebuilds the question and adds a note:
    the retry puts back what they were given, and they do it again (the question was
    lost, and the retry went without it)."""

    class Forgetful(Scrubbed):
        @before_model
        def forget(self, request: ModelRequest) -> ModelRequest:
            return attrs.evolve(request, messages=request.messages[2:])

    model = ScriptedModel([InvalidRequestError("bad"), text_response("done")])
    history = [Message.user("old 1111"), Message.assistant("old answer")]
    await Forgetful(model=model).run("new 2222", history=history)
    first, retried = ([m.text for m in r.messages] for r in model.requests)
    assert first == retried == ["note", "new ####"]


class Rebuilding(Agent):
    """Rebuilds every user message (``masked``)."""

    instructions = "Be brief."
    max_retries = 0

    @before_model
    def scrub(self, request: ModelRequest) -> ModelRequest:
        return attrs.evolve(request, messages=tuple(map(masked, request.messages)))


async def test_a_rebuilt_message_the_recovery_changed_is_retried_as_changed() -> None:
    """A recovery hook that shortens the rebuilt question (keeping its id): the retry
    sends it shortened, not the original rebuilt again."""

    class Shortening(Rebuilding):
        @after_model_error
        def shorten(self, request: ModelRequest, error: Exception) -> ModelRequest | None:
            *earlier, asked = request.messages
            return attrs.evolve(request, messages=(*earlier, attrs.evolve(asked, content=[])))

    model = ScriptedModel([InvalidRequestError("too long"), text_response("done")])
    await Shortening(model=model).run("card 4111 was charged twice: " + "why? " * 50)
    assert [m.text for m in model.requests[1].messages] == ["Be brief.", ""]


async def test_a_rebuilt_message_the_recovery_dropped_stays_out() -> None:
    """A recovery hook that keeps the last three messages: the rebuilt ones it dropped
    do not come back with those it kept."""

    class Trimming(Rebuilding):
        @after_model_error
        def trim(self, request: ModelRequest, error: Exception) -> ModelRequest | None:
            return attrs.evolve(request, messages=(request.messages[0], *request.messages[-3:]))

    history = [
        Message.user("u1 1111"),
        Message.assistant("a1"),
        Message.user("u2 2222"),
        Message.user("u3 3333"),
        Message.assistant("a3"),
    ]
    model = ScriptedModel([InvalidRequestError("too long"), text_response("done")])
    await Trimming(model=model).run("q 4444", history=history)
    assert [m.text for m in model.requests[1].messages] == ["Be brief.", "u3 ####", "a3", "q ####"]


async def test_the_question_is_never_lost_on_a_retry_whatever_the_hooks_do() -> None:
    """A hook that rebuilds the question and moves the instructions after it: the
    messages cannot be matched, and the question still goes back for the hooks."""

    class Moving(Rebuilding):
        @before_model
        def instructions_last(self, request: ModelRequest) -> ModelRequest:
            system, *rest = request.messages
            return attrs.evolve(request, messages=(*rest, system))

        @after_model_error
        def again(self, request: ModelRequest, error: Exception) -> ModelRequest:
            return attrs.evolve(request)

    model = ScriptedModel([InvalidRequestError("bad"), text_response("done")])
    await Moving(model=model).run("is 5678 blocked?")
    first, retried = ([m.text for m in r.messages] for r in model.requests)
    assert first == retried == ["is #### blocked?", "Be brief."]


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"max_token": 300}, "did you mean 'max_tokens'"),
        ({"temperature": float("nan")}, r"\['temperature'\] must be a finite number"),
        ({"messages": []}, "is set by littleghost"),
    ],
    ids=["misspelt", "nan", "reserved"],
)
async def test_settings_a_before_model_hook_makes_are_checked_before_the_call(
    setting: dict[str, Any], said: str
) -> None:
    """A hook's settings are checked as the run's are: a misspelt one, which a server
    would ignore without a word, is refused, naming it, before the model is called."""

    class Capping(Agent):
        @before_model
        def cap(self, request: ModelRequest) -> ModelRequest:
            return attrs.evolve(request, settings={**request.settings, **setting})

    model = ScriptedModel([text_response("never")])
    with pytest.raises(ConfigurationError, match=said):
        await Capping(model=model).run("hi")
    assert model.requests == []


RECOVERIES = ("copy", "change_added", "change_question", "change_answer", "add", "shorten")


def recovered(request: ModelRequest, how: str) -> ModelRequest:
    """``request`` as a recovery hook makes its replacement ``how``: a copy, with what the
    hooks added or the question changed (ids kept), an answer changed, a note of its own
    added once, or every text shortened."""
    messages = list(request.messages)
    asked = max((i for i, m in enumerate(messages) if "QUESTION" in m.text), default=None)

    def changed(message: Message) -> Message:
        return attrs.evolve(message, content=[TextPart(message.text + "*")])

    if how == "change_added":
        messages = [changed(m) if m.text.startswith("ADDED") else m for m in messages]
    elif how == "change_question" and asked is not None:
        messages[asked] = changed(messages[asked])
    elif how == "change_answer":
        messages = [changed(m) if m.role is Role.ASSISTANT and m.text else m for m in messages]
    elif how == "add" and not any(m.id == "recovery-note" for m in messages):
        messages.append(Message.user("RECOVERY note", id="recovery-note"))
    elif how == "shorten":
        messages = [
            attrs.evolve(m, content=[TextPart(m.text[:12])]) if m.text and not m.tool_calls else m
            for m in messages
        ]
    return attrs.evolve(request, messages=messages)


@pytest.mark.parametrize("seed", range(300))
async def test_every_retry_has_the_question_and_what_hooks_add_once(seed: int) -> None:
    """Hooks that add messages (a system one, before or after the question, last),
    rebuild every user message under a new id, or leave older answers out, and a
    recovery hook that copies, changes (ids kept), adds to or shortens the request,
    drawn at random over histories and tool loops, with or without @manage_context
    (summarizing, or a bounded view with excerpts): every request sent holds the
    question, and each message the hooks add, once."""
    rng = random.Random(seed)
    adds = rng.sample(["system", "before", "after", "last"], rng.randint(0, 3))
    rebuild, forget = rng.random() < 0.5, rng.random() < 0.3
    how = rng.choice(RECOVERIES)
    managed = rng.choice([None, "summarizing", "bounded"])

    class Hooked(Agent):
        instructions = "Be brief."
        tools = [lookup]
        max_retries = 0

        @before_model
        def add(self, request: ModelRequest) -> ModelRequest:
            messages = list(request.messages)
            if rebuild:
                messages = [masked(m) if not m.is_summary else m for m in messages]
            if forget:
                old = len(messages) - 6
                messages = [
                    m
                    for i, m in enumerate(messages)
                    if i >= old or m.role is not Role.ASSISTANT or m.tool_calls
                ]
            for where in adds:
                asked = max(i for i, m in enumerate(messages) if "QUESTION" in m.text)
                added = Message.system if where == "system" else Message.user
                at = {"system": 1, "before": asked, "after": asked + 1}.get(where, len(messages))
                messages.insert(at, added(f"ADDED {where}"))
            return attrs.evolve(request, messages=messages)

        @after_model_error
        def mend(self, request: ModelRequest, error: Exception) -> ModelRequest | None:
            return recovered(request, how) if isinstance(error, InvalidRequestError) else None

    if managed == "summarizing":
        Hooked = manage_context(context_window_override=1_500, preserve_recent_messages=2)(Hooked)
    elif managed == "bounded":
        bounded = PromptBudget(
            prompt_budget_tokens=1_200, response_reserve_tokens=100, safety_reserve_tokens=50
        )
        Hooked = manage_context(context_window_override=4_000, budget=bounded)(Hooked)
    words = " and more" * 20 if managed else ""
    history = [
        message
        for turn in range(rng.randint(0, 12 if managed else 3))
        for message in (
            Message.user(f"old {turn}: card 1234{words}"),
            Message.assistant(f"ok {turn}{words}"),
        )
    ]
    steps: list[Any] = [InvalidRequestError("bad")] * rng.choice([0, 1, 2])
    for _ in range(rng.randint(0, 2)):
        steps.append(tool_call_response("lookup", {"order": "7"}))
        steps += [InvalidRequestError("bad")] * rng.choice([0, 1, 2])
    summaries = [text_response("- notes")] * 4
    model = ScriptedModel([*steps, text_response("done"), *summaries])
    with contextlib.suppress(InvalidRequestError):  # four refusals in one call
        await Hooked(model=model).run("QUESTION: is 5678 blocked?", history=history)
    for request in model.requests:
        if request.purpose != "chat":
            continue
        texts = [m.text for m in request.messages]
        assert sum("QUESTION" in text for text in texts) == 1, texts
        for where in adds:
            assert sum(text.startswith(f"ADDED {where}") for text in texts) == 1, texts
        assert sum(text == "RECOVERY note" for text in texts) <= 1, texts


def lookup(order: str) -> str:
    """Look up an order."""
    return f"order {order} shipped"


@pytest.mark.parametrize(
    ("left_out", "said"),
    [(Role.ASSISTANT, "answers no open call"), (Role.TOOL, "without its result")],
    ids=["call", "result"],
)
async def test_a_request_a_hook_left_badly_paired_is_refused_before_the_call(
    left_out: Role, said: str
) -> None:
    """A hook that leaves out a call and keeps its result (or the other way round) makes
    a request every provider refuses: it is the call's error, naming the hooks and the
    message, and the model is not sent it; the log stays whole."""

    class Forgetting(Agent):
        tools = [lookup]

        @before_model
        def forget(self, request: ModelRequest) -> ModelRequest:
            kept = (m for m in request.messages if m.role is not left_out or m.text)
            return attrs.evolve(request, messages=tuple(kept))

    store = InMemorySessionStore()
    model = ScriptedModel([tool_call_response("lookup", {"order": "7"}), text_response("no")])
    agent = Forgetting(model=model, session_store=store)
    with pytest.raises(
        ConfigurationError, match=rf"the turn's request \(as its hooks left it\) message 1 .*{said}"
    ):
        await agent.run("Where is order 7?", session_id="s")
    assert len(model.requests) == 1
    log = await store.load("s")
    assert [m.role for m in log] == [Role.USER, Role.ASSISTANT, Role.TOOL]


@pytest.mark.parametrize("seed", range(30))
async def test_no_request_leaves_a_call_or_result_unpaired_whatever_the_hooks_drop(
    seed: int,
) -> None:
    """Hooks drop messages at random from tool loops (parallel calls too), or a recovery
    hook does: each request the model is sent pairs every result with a call before it
    and every call with its result, or the run fails with the hooks' ConfigurationError
    before sending it; the log stays whole either way. A ``ModelCallRetried`` tells of
    each failed call that went out and was sent again, never of a refused request."""
    rng = random.Random(seed)

    def drop(request: ModelRequest) -> ModelRequest | None:
        if rng.random() < 0.5:
            return None
        kept = [m for m in request.messages if m.role is Role.USER or rng.random() < 0.7]
        return attrs.evolve(request, messages=tuple(kept))

    class Dropping(Agent):
        tools = [lookup]
        max_retries = 0

        @before_model
        def forget(self, request: ModelRequest) -> ModelRequest | None:
            return drop(request)

        @after_model_error
        def mend(self, request: ModelRequest, error: Exception) -> ModelRequest | None:
            return drop(request)

    steps: list[Any] = []
    for _ in range(rng.randint(1, 6)):
        calls = [("lookup", {"order": str(rng.randint(1, 9))}) for _ in range(rng.randint(1, 3))]
        steps.append(tool_calls_response(*calls))
        if rng.random() < 0.3:
            steps.append(InvalidRequestError("refused"))
    steps.append(text_response("done"))
    model = ScriptedModel(steps)
    store = InMemorySessionStore()
    events: list[Event] = []
    failed = True
    try:
        async with Dropping(model=model, session_store=store).stream(
            "Where?", session_id="s"
        ) as stream:
            async for event in stream:
                events.append(event)  # a failing run's before its error too
        failed = False
    except ConfigurationError as error:
        assert "the turn's request (as its hooks left it)" in str(error)
    except InvalidRequestError:
        pass  # a refusal no hook mended
    assert not any(badly_paired(request.messages) for request in model.requests)
    assert not badly_paired(tuple(await store.load("s")))
    sent = steps[: len(model.requests)]
    unanswered = sum(isinstance(step, Exception) for step in sent)
    failing_sent = failed and isinstance(sent[-1], Exception)  # ended on a call sent, no retry
    retried = [event for event in events if isinstance(event, ModelCallRetried)]
    assert [event.error_type for event in retried] == ["InvalidRequestError"] * (
        unanswered - failing_sent
    )


@pytest.mark.parametrize("first", ["refused", "overflow"])
async def test_a_request_refused_before_it_went_out_is_no_retry(first: str) -> None:
    """A request a hook left badly paired, which a recovery hook mends, is never sent:
    no ``ModelCallRetried`` tells of it. After an overflow (a call that went out), the
    retry is told once, as the mended request goes out, with the overflow's figures."""

    class Splitting(Agent):
        tools = [lookup]

        @before_model
        def split(self, request: ModelRequest, context: RunContext) -> ModelRequest | None:
            if context.turn < 2 or context.state.get("mended"):
                return None
            if first == "overflow" and not context.state.get("overflowed"):
                return None
            kept = tuple(m for m in request.messages if m.role is not Role.TOOL)
            return attrs.evolve(request, messages=kept)

        @after_model_error
        def mend(
            self, request: ModelRequest, error: Exception, context: RunContext
        ) -> ModelRequest:
            if isinstance(error, ContextWindowOverflowError):
                context.state["overflowed"] = True
            else:
                context.state["mended"] = True
            return attrs.evolve(request)

    steps: list[Any] = [tool_call_response("lookup", {"order": "7"})]
    if first == "overflow":
        steps.append(ContextWindowOverflowError("too long", usage=Usage(5, 0)))
    model = ScriptedModel([*steps, text_response("shipped")])
    async with Splitting(model=model).stream("Where is order 7?") as stream:
        events = [event async for event in stream]
    retried = [event for event in events if isinstance(event, ModelCallRetried)]
    if first == "overflow":
        assert retried == [ModelCallRetried(1, "context_length_exceeded", Usage(5, 0))]
    else:
        assert retried == []
    assert len(model.requests) == len(steps) + 1
    assert stream.result.output == "shipped"


async def test_settings_a_recovery_hook_fixes_are_sent() -> None:
    """A setting the check refuses is an error of the call the ``after_model_error``
    hooks see, as a provider's refusal is: a hook that drops it retries without it. The
    refused request never went out: no ``ModelCallRetried`` tells of it."""
    seen: list[BaseException] = []

    class Dropping(Agent):
        @before_model
        def cap(self, request: ModelRequest) -> ModelRequest | None:
            if "temprature" in request.settings or seen:
                return None
            return attrs.evolve(request, settings={**request.settings, "temprature": 0})

        @after_model_error
        def drop(self, request: ModelRequest, error: Exception) -> ModelRequest:
            seen.append(error)
            settings = {k: v for k, v in request.settings.items() if k != "temprature"}
            return attrs.evolve(request, settings=settings)

    model = ScriptedModel([text_response("ok")])
    async with Dropping(model=model).stream("hi") as stream:
        events = [event async for event in stream]
    assert stream.result.output == "ok"
    assert not any(isinstance(event, ModelCallRetried) for event in events)
    assert [type(error) for error in seen] == [ConfigurationError]
    assert "temprature" not in model.requests[0].settings


async def test_settings_of_a_side_calls_request_are_checked() -> None:
    class Checking(Agent):
        @before_model
        async def check(self, request: ModelRequest, context: RunContext) -> None:
            asking = ModelRequest([Message.user("safe?")], settings={"top-p": 0.5})
            await context.complete(asking)

    model = ScriptedModel([text_response("never")])
    with pytest.raises(ConfigurationError, match="did you mean 'top_p'"):
        await Checking(model=model).run("hi")
    assert model.requests == []


@after_tool
def scrub_result(result: ToolResult) -> None:
    """Scrub a tool's result."""


@pytest.mark.parametrize("where", ["class", "keyword"])
def test_a_hook_function_in_tools_is_refused(where: str) -> None:
    """A function marked as a hook, given in ``tools``, would be a tool the model calls,
    never run as a hook: it fails, saying what a hook is."""
    said = r"'scrub_result' is a @after_tool hook, not a tool"
    with pytest.raises(ConfigurationError, match=said):
        if where == "class":

            class Scrubbing(Agent):
                tools = [scrub_result]

        else:
            Agent(model=ScriptedModel([]), tools=[scrub_result])
