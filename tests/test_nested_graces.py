"""Nested runs stopped from outside share the outer run's one cleanup grace, wherever the
run calls the code that starts them (a tool, a hook, instructions, a model), and closing
a nested agent's models keeps to it. Each waits a whole grace (longer than ``LATE``, so
that a second would show): apart from the timed harnesses, so as not to hold them up."""

from __future__ import annotations

import functools
import time

import anyio
import pytest

from littleghost import (
    Agent,
    RunContext,
    ToolCall,
    ToolResult,
    after_model,
    after_tool,
    before_model,
    before_tool,
    tool,
)
from littleghost.models import ModelRequest, ModelResponse, register_provider
from littleghost.testing import ScriptedModel, text_response, tool_call_response

from .stopping import HangingRelease, SlowStore, Waiter, waiting_model
from .timing import LATE

pytestmark = pytest.mark.anyio


NESTED_GRACE = LATE + 1.0
"""Long enough that two graces one after the other would show on a loaded machine."""


class Expert(Waiter):
    cleanup_grace = NESTED_GRACE


def asking(patience: float) -> type[Agent]:
    """An agent whose tool asks an expert with ``patience`` times its grace, whose store
    is slow (so its cleanup takes its whole grace)."""

    class Patient(Expert):
        cleanup_grace = patience * NESTED_GRACE

    class Asking(Agent):
        cleanup_grace = NESTED_GRACE

        @tool
        async def ask(self, question: str) -> str:
            """Ask an expert whose store is slow."""
            expert = Patient(model=waiting_model(), session_store=SlowStore(60.0, fast=2))
            return (await expert.run(question, session_id="inner")).output

    return Asking


async def consult() -> None:
    """Run an expert whose store is slow (so its cleanup takes its whole grace)."""
    expert = Expert(model=waiting_model(), session_store=SlowStore(60.0, fast=2))
    await expert.run("?", session_id="inner")


class Consulting(Agent):
    """Starts a nested run from the place its subclass names, not from a tool."""

    cleanup_grace = NESTED_GRACE

    @tool
    async def wait(self) -> str:
        """Wait for nothing."""
        return "waited"


class ConsultingModel(ScriptedModel):
    """A model that consults an expert (a nested run) before it answers."""

    async def respond(self, request: ModelRequest) -> ModelResponse:
        await consult()
        return await super().respond(request)


class ConsultsInInstructions(Consulting):
    async def instructions(self, context: RunContext) -> str:
        await consult()
        return "Consult."


class ConsultsBeforeModel(Consulting):
    @before_model
    async def consulting(self, request: ModelRequest) -> None:
        await consult()


class ConsultsAfterModel(Consulting):
    @after_model
    async def consulting(self, response: ModelResponse) -> None:
        await consult()


class ConsultsBeforeTool(Consulting):
    @before_tool
    async def consulting(self, call: ToolCall) -> None:
        await consult()


class ConsultsAfterTool(Consulting):
    @after_tool
    async def consulting(self, result: ToolResult) -> None:
        await consult()


class ConsultsInTool(Consulting):
    @tool
    async def wait(self) -> str:
        """Wait for an expert."""
        await consult()
        return "waited"


CONSULTING = {
    "tool": ConsultsInTool,
    "instructions": ConsultsInInstructions,
    "before_model": ConsultsBeforeModel,
    "after_model": ConsultsAfterModel,
    "before_tool": ConsultsBeforeTool,
    "after_tool": ConsultsAfterTool,
    "model": Consulting,
}


def delegating(helper: type[Agent], grace: float) -> type[Agent]:
    """An agent of ``grace`` whose tool ``delegate`` runs a ``helper`` made for the call,
    closed at the end of an ``async with`` block."""

    class Delegating(Agent):
        cleanup_grace = grace

        @tool
        async def delegate(self) -> str:
            """Hand the work to a helper."""
            async with helper() as made:
                return (await made.run("?")).output

    return Delegating


class TestOneGraceForAll:
    @pytest.mark.parametrize("place", list(CONSULTING))
    async def test_nested_runs_from_hooks_instructions_and_models_share_the_outer_grace(
        self, place: str
    ) -> None:
        """Not only from tools: wherever the run calls user code that starts a nested run,
        a ``cancel()`` from outside stops both within one grace (each run's cleanup
        alone would take all of it)."""
        script = [tool_call_response("wait", {}), text_response("x")]
        model = (ConsultingModel if place == "model" else ScriptedModel)(script)
        agent = CONSULTING[place](model=model, session_store=HangingRelease())
        began = time.monotonic()
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(agent.run, "Go.", session_id="outer"))
            await anyio.sleep(0.3)
            group.cancel_scope.cancel()
        assert time.monotonic() - began < 0.3 + NESTED_GRACE + LATE

    @pytest.mark.parametrize("patience", [1, 3])
    @pytest.mark.parametrize("how", ["deadline", "cancel"])
    async def test_nested_runs_cancelled_from_outside_share_the_outer_grace(
        self, how: str, patience: float
    ) -> None:
        """The outer run's grace is shared whatever the nested run's own: an expert with
        three times the grace stops within the outer one too (it took its own, and the
        outer run ended two graces late)."""
        model = ScriptedModel([tool_call_response("ask", {"question": "?"}), text_response("x")])
        agent = asking(patience)(model=model, session_store=SlowStore(60.0, fast=2))
        began = time.monotonic()
        if how == "deadline":
            with anyio.move_on_after(0.3) as scope:
                await agent.run("Go.", session_id="outer")
            assert scope.cancelled_caught
        else:
            async with anyio.create_task_group() as group:
                group.start_soon(functools.partial(agent.run, "Go.", session_id="outer"))
                await anyio.sleep(0.3)
                assert len(model.requests) == 1  # the expert is at work
                group.cancel_scope.cancel()
        assert time.monotonic() - began < 0.3 + NESTED_GRACE + LATE

    async def test_closing_a_nested_agents_models_in_a_tool_keeps_to_the_outer_grace(
        self,
    ) -> None:
        """An agent closed at the end of an ``async with`` block in a tool, as the outer
        run is cancelled: closing its models shares the outer run's grace (it took the
        agent's own from then, and the outer run its whole grace after it)."""

        class SlowToClose(ScriptedModel):
            async def aclose(self) -> None:
                await anyio.sleep(60)

        waiting = tool_call_response("wait", {"seconds": 10}, call_id="c1")
        register_provider("slow-to-close", lambda name: SlowToClose([waiting]))

        class Helper(Waiter):
            model = "slow-to-close:helper"
            cleanup_grace = 3 * NESTED_GRACE

        model = ScriptedModel([tool_call_response("delegate", {}), text_response("x")])
        agent = delegating(Helper, NESTED_GRACE)(model=model, session_store=SlowStore(60.0, fast=2))
        began = time.monotonic()
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(agent.run, "Go.", session_id="outer"))
            await anyio.sleep(0.3)
            group.cancel_scope.cancel()
        assert time.monotonic() - began < 0.3 + NESTED_GRACE + LATE

    async def test_closing_a_nested_agents_models_in_a_tool_that_goes_on_takes_its_own_grace(
        self,
    ) -> None:
        """Nothing is stopping: closing the helper's models takes the helper's grace, not
        the outer run's, and the tool's answer is the helper's."""

        class SlowishToClose(ScriptedModel):
            async def aclose(self) -> None:
                await anyio.sleep(0.3)

        register_provider("slowish-to-close", lambda n: SlowishToClose([text_response("ok")]))

        class Helper(Agent):
            model = "slowish-to-close:helper"
            cleanup_grace = 2.0

        model = ScriptedModel([tool_call_response("delegate", {}), text_response("x")])
        result = await delegating(Helper, 0.1)(model=model).run("Go.")
        (answer,) = [r for m in result.messages for r in m.tool_results]
        assert (answer.content, answer.is_error) == ("ok", False)

    async def test_a_tool_that_swallows_its_nested_runs_cancellation_keeps_one_grace(
        self,
    ) -> None:
        """The outer run cancelled from outside while its tool catches the nested run's
        cancellation and returns: the outer run still ends by the nested run's stop."""

        class Swallowing(Agent):
            cleanup_grace = NESTED_GRACE

            @tool
            async def ask(self) -> str:
                """Ask an expert whose store is slow; say so when it fails."""
                expert = Expert(model=waiting_model(), session_store=SlowStore(60.0, fast=2))
                try:
                    return (await expert.run("?", session_id="inner")).output
                except BaseException:  # a tool that should not, but does
                    return "the expert is unavailable"

        model = ScriptedModel([tool_call_response("ask", {}), text_response("x")])
        agent = Swallowing(model=model, session_store=SlowStore(60.0, fast=2))
        began = time.monotonic()
        async with anyio.create_task_group() as group:
            group.start_soon(functools.partial(agent.run, "Go.", session_id="outer"))
            await anyio.sleep(0.3)
            group.cancel_scope.cancel()
        assert time.monotonic() - began < 0.3 + NESTED_GRACE + LATE
