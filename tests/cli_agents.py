"""Agent classes the command-line tests name with ``--agent tests.cli_agents:Class``, and
a conversation to store with them."""

from __future__ import annotations

import os
import sys

import anyio
import attrs

from littleghost import Agent, Role, before_model, manage_context, tool
from littleghost.capabilities import Capability, CapabilityHook, add_capability
from littleghost.context import PromptBudget, Truncation
from littleghost.errors import ConfigurationError
from littleghost.models import ModelRequest, ModelResponse, register_provider
from littleghost.sessions.base import SessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

ORDERS = {"42": "shipped on Monday, arriving Thursday", "7": "waiting for payment"}
QUESTIONS = [
    "Where is order 42?",
    "Can you tell me more about the delivery?",
    "And what about order 7?",
    "Which carrier is it?",
    "Can I change the address?",
    "Thanks, what else should I know?",
]
SUMMARY = "- order 42: shipped on Monday, arriving Thursday\n- order 7: waiting for payment"


@manage_context(context_window_tokens=2_000, compression_threshold=0.5, preserve_recent_messages=4)
class Support(Agent):
    instructions = "You help customers of ACME with their orders."
    settings = {"max_tokens": 100}
    max_tool_result_tokens = 40

    @tool
    async def lookup_order(self, order_id: str) -> str:
        """Find an order by its id.

        Args:
            order_id: The order number the customer gave.
        """
        return f"order {order_id}: {ORDERS.get(order_id, 'no such order')}. " + "Tracking. " * 30


@manage_context(
    context_window_tokens=4_000,
    budget=PromptBudget(
        prompt_budget_tokens=500, response_reserve_tokens=100, safety_reserve_tokens=50
    ),
    summarize=False,
)
class Bounded(Support):
    """``Support`` whose every request is bounded to a small budget, never summarized."""


class Unmanaged(Agent):
    """No ``@manage_context``: nothing to compact with."""

    instructions = "You help."


def respond(request: ModelRequest) -> ModelResponse:
    """Summaries for summary calls; a lookup for a question naming an order; else a long
    answer."""
    if request.purpose == "context_compaction":
        return text_response(SUMMARY)
    last = request.messages[-1]
    if last.role is Role.USER and "order" in last.text and request.tools:
        order = "42" if "42" in last.text else "7"
        return tool_call_response("lookup_order", {"order_id": order})
    return text_response("Here is what I know. " + "The details are as follows. " * 25)


def scripted() -> ScriptedModel:
    """A model that answers as ``respond`` says, as often as asked."""
    return ScriptedModel([respond] * 200)


async def store_conversation(
    store: SessionStore, session_id: str = "customer-42", agent: type[Agent] = Support
) -> ScriptedModel:
    """Run ``agent`` through ``QUESTIONS`` in ``session_id`` of ``store`` (the log gets two
    tool calls and, for ``Support``, a summary); the model it ran with."""
    model = scripted()
    runner = agent(model=model, session_store=store)
    for question in QUESTIONS:
        await runner.run(question, session_id=session_id)
    return model


class Staffed(Support):
    """``Support`` with a model of its own, for ``sessions compact`` without ``--dry-run``."""

    model = scripted()


class Remote(Support):
    """``Support`` with a provider's model, made as it is needed (``OPENAI_BASE_URL``), and
    no retries."""

    model = "openai:gpt-4o-mini"
    max_retries = 0


class BoundedStaffed(Bounded):
    """``Bounded`` with a model of its own: ``sessions compact`` must not call it."""

    model = scripted()


PICKED = ScriptedModel([respond] * 200, name="picked", context_window=1_500)
"""The model ``Picking`` runs with."""


class Picking(Support):
    """``Support`` whose class picks its model itself: its ``model`` string (another
    window, a provider taking schemas natively) is not what its runs use."""

    model = "anthropic:claude-sonnet-4-5"

    def resolve_model(self) -> ScriptedModel:
        return PICKED


class TypedPicking(Picking):
    """``Picking`` with a typed result."""

    output_type = dict[str, int]


class Typed(Support):
    """Support with a typed result."""

    output_type = int


class TypedTool(Support):
    """``Support`` with a typed result asked for with the final-result tool."""

    output_type = int
    output_strategy = "tool"


class TypedBounded(Bounded):
    """``Bounded`` with a typed result and no model: which way it is asked is assumed."""

    output_type = int


class Hooked(Support):
    """``Support`` with a hook of its own that shapes every request."""

    @before_model
    def shorten(self, request: ModelRequest) -> ModelRequest:
        return attrs.evolve(request, messages=request.messages[-2:])


class Unhooked(Hooked):
    """``Hooked`` with its hook turned off."""

    shorten = None  # type: ignore[assignment]


class Garish(Support):
    """``Support`` whose model's name and capability's name (its own code's) hold
    terminal escapes: ``view`` prints them."""

    model = ScriptedModel([], name="m\x1b[31mred", context_window=4_000)


def _passing(agent: Agent, request: ModelRequest, *, context: object) -> ModelRequest:
    return request


add_capability(
    Garish, Capability("\x1b]0;pwned\x07wipe", (CapabilityHook("before_model", _passing),))
)


class NeedsConfiguration(Support):
    """Fails as it is made: a setting it reads is missing."""

    def __init__(self) -> None:
        raise KeyError("SUPPORT_DB_URL")


class BadlyConfigured(Support):
    """Fails as it is made, with a message of several lines."""

    def __init__(self) -> None:
        raise ValueError("settings are invalid:\n  database: missing\n  api key: missing")


class ExitsWhenMade(Support):
    """Ends the process as it is made, successfully (a script's ``sys.exit()``)."""

    def __init__(self) -> None:
        sys.exit(0)


def interrupt(request: ModelRequest) -> ModelResponse:
    """Ctrl-C, as the model answers."""
    raise KeyboardInterrupt


def exit_now(request: ModelRequest) -> ModelResponse:
    """``sys.exit()``, as the model answers (a script's own model or hook)."""
    sys.exit(0)


class ExitsAsItSummarizes(Support):
    """``Support`` whose model ends the process, successfully, as it summarizes."""

    model = ScriptedModel([exit_now] * 10)


class Interrupted(Support):
    """``Support`` whose model is stopped with Ctrl-C as it summarizes."""

    model = ScriptedModel([interrupt] * 10)


class InterruptedClosing(ScriptedModel):
    """A model stopped with Ctrl-C as it closes (a local server's stop, say)."""

    async def aclose(self) -> None:
        raise KeyboardInterrupt


register_provider("interruptedclosing", lambda name: InterruptedClosing([respond] * 10))


class InterruptedWhileClosing(Support):
    """``Support`` whose model, made from its model string, is stopped with Ctrl-C as the
    command closes it, its summary written."""

    model = "interruptedclosing:m"


class FailingToClose(ScriptedModel):
    """A model whose close fails (a local server that would not stop, say)."""

    async def aclose(self) -> None:
        raise OSError("the server would not stop")


register_provider("failingtoclose", lambda name: FailingToClose([respond] * 10))


class FailedWhileClosing(Support):
    """``Support`` whose model, made from its model string, fails to close once the
    command has its summary."""

    model = "failingtoclose:m"


def keyless(name: str) -> ScriptedModel:
    """A provider's model made without its key (``OPENAI_API_KEY`` unset, say)."""
    raise ConfigurationError("no API key for keyless: set KEYLESS_API_KEY")


register_provider("keyless", keyless)


class Keyless(Support):
    """``Support`` whose model string cannot be made here."""

    model = "keyless:m"


@manage_context(
    context_window_tokens=4_000,
    preserve_recent_messages=4,
    budget=PromptBudget(
        prompt_budget_tokens=1_000, response_reserve_tokens=100, safety_reserve_tokens=50
    ),
)
class KeylessBounded(Support):
    """``Keyless`` with a bounded view, whose sizes a calibration kept for its model may
    change."""

    model = "keyless:m"


MARKS = "LITTLEGHOST_TEST_MARKS"
"""The directory ``Stoppable`` marks what it did in (``summarizing``, ``closed``)."""


async def summarize_until_stopped(request: ModelRequest) -> ModelResponse:
    """A summary call that takes until the command is stopped."""
    await anyio.Path(os.environ[MARKS], "summarizing").touch()
    await anyio.sleep_forever()
    raise AssertionError("not reached")


class Stoppable(ScriptedModel):
    """A model that says it was closed (a local model's server stopped, say)."""

    async def aclose(self) -> None:
        await anyio.Path(os.environ[MARKS], "closed").touch()


register_provider("stoppable", lambda name: Stoppable([summarize_until_stopped]))


class StoppedWhileSummarizing(Support):
    """``Support`` whose model, made from its model string, summarizes until stopped."""

    model = "stoppable:m"


class Unstartable(ScriptedModel):
    """A model that cannot start here (as a local model without its server binary)."""

    async def prepare(self) -> None:
        raise ConfigurationError("no server on this machine")


@manage_context(
    context_window_tokens=2_000,
    preserve_recent_messages=4,
    strategy=Truncation(minimum_preserved=4),
)
class Truncating(Support):
    """``Support`` compacted without a model, whose model cannot start."""

    model = Unstartable([])
