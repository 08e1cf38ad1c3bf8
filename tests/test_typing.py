"""Users' code type-checks as written: littleghost's public typing under ``mypy --strict``,
and under pyright, which editors run (VS Code's Pylance)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


Mypy = Callable[[str], str]


@pytest.fixture(scope="module")
def mypy(tmp_path_factory: pytest.TempPathFactory) -> Mypy:
    """What ``mypy --strict`` reports on some code, against this checkout of littleghost.
    Its cache is this module's own, made empty: the first check reads littleghost and
    its dependencies, the others only the code given (a tenth of the time)."""
    cache = tmp_path_factory.mktemp("mypy-cache")

    def check(code: str) -> str:
        command = ["mypy", "--strict", "--cache-dir", str(cache), "-c", textwrap.dedent(code)]
        done = subprocess.run(
            [sys.executable, "-m", *command],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=300,
        )
        return done.stdout

    return check


def pyright(code: str, folder: Path) -> list[str]:
    """The errors pyright reports on ``code`` (its default mode), against this checkout."""
    (folder / "snippet.py").write_text(textwrap.dedent(code))
    (folder / "pyrightconfig.json").write_text(json.dumps({"extraPaths": [str(ROOT)]}))
    done = subprocess.run(  # --outputjson: no look-up of pyright's latest version either
        [sys.executable, "-m", "pyright", "--outputjson", "--pythonpath", sys.executable],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    report = json.loads(done.stdout)
    return [item["message"] for item in report["generalDiagnostics"] if item["severity"] == "error"]


def test_a_tool_keeps_its_signature(mypy: Mypy) -> None:
    report = mypy(
        """
        from littleghost import Agent, tool

        class Support(Agent):
            @tool
            async def lookup_order(self, order_id: str) -> str:
                return "shipped"

            @tool(name="cancel", timeout=5)
            def cancel_order(self, order_id: str) -> bool:
                return True

        async def main(agent: Support) -> None:
            found: str = await agent.lookup_order("42")
            done: bool = agent.cancel_order("42")
            await agent.lookup_order(42)
        """
    )
    assert 'Argument 1 to "lookup_order" of "Support" has incompatible type "int"' in report
    assert "Found 1 error" in report


def test_async_with_gives_the_agent_of_its_class(mypy: Mypy) -> None:
    report = mypy(
        """
        from littleghost import Agent

        class Support(Agent):
            model = "openai:gpt-4o-mini"

            def greeting(self) -> str:
                return "hi"

        async def main() -> None:
            async with Support() as agent:
                reveal_type(agent)
                agent.greeting()
        """
    )
    assert 'Revealed type is "__main__.Support"' in report
    assert "Success: no issues found" in report


def test_a_run_output_type_types_the_output(mypy: Mypy) -> None:
    report = mypy(
        """
        import attrs

        from littleghost import Agent

        @attrs.frozen
        class Ticket:
            order_id: str

        class Triage(Agent):
            model = "openai:gpt-4o-mini"

        async def main() -> None:
            ticket: Ticket = (await Triage().run("Order 42?", output_type=Ticket)).output
            tickets = Triage().run_sync("Order 42?", output_type=list[Ticket]).output
            first: Ticket = tickets[0]
            text: str = Triage().run_sync("Order 42?").output  # the class's output_type: Any
            wrong: str = (await Triage().run("Order 42?", output_type=Ticket)).output
        """
    )
    assert 'expression has type "Ticket", variable has type "str"' in report
    assert "Found 1 error" in report


def test_a_stream_output_type_types_its_result(mypy: Mypy) -> None:
    report = mypy(
        """
        import attrs

        from littleghost import Agent

        @attrs.frozen
        class Ticket:
            order_id: str

        class Triage(Agent):
            model = "openai:gpt-4o-mini"

        async def main() -> None:
            async with Triage().stream("Order 42?", output_type=Ticket) as events:
                async for event in events:
                    pass
                ticket: Ticket = events.result.output
                wrong: str = events.result.output
            async with Triage().stream("Order 42?") as free:
                text: str = free.result.output  # the class's output_type: Any
        """
    )
    assert 'expression has type "Ticket", variable has type "str"' in report
    assert "Found 1 error" in report


def test_a_pydantic_output_type_types_the_output(mypy: Mypy) -> None:
    report = mypy(
        """
        from pydantic import BaseModel, Field

        from littleghost import Agent, RunResult, tool

        class Ticket(BaseModel):
            order_id: str = Field(description="the order's number")
            urgent: bool = False

        class Triage(Agent):
            model = "openai:gpt-4o-mini"

            @tool
            def escalate(self, ticket: Ticket) -> Ticket:
                \"\"\"Escalate a ticket.\"\"\"
                return ticket.model_copy(update={"urgent": True})

        async def main() -> None:
            result: RunResult[Ticket] = await Triage().run("Order 42?", output_type=Ticket)
            order: str = result.output.order_id
            escalated: Ticket = Triage().escalate(Ticket(order_id="42"))
            wrong: int = result.output
        """
    )
    assert 'expression has type "Ticket", variable has type "int"' in report
    assert "Found 1 error" in report


def test_constructor_keywords_are_the_knobs(mypy: Mypy) -> None:
    report = mypy(
        """
        from typing import Any

        from littleghost import Agent
        from littleghost.testing import ScriptedModel, text_response

        class Support(Agent):
            model = "openai:gpt-4o-mini"

        class Staffed(Support):
            def __init__(self, desk: str, **options: Any) -> None:
                self.desk = desk
                super().__init__(**options)

        Support(model=ScriptedModel([text_response("hi")]), max_turns=5, settings={})
        Staffed("billing", max_turns=5)
        Support(max_turn=5)
        Support(max_turns="5")
        """
    )
    assert 'Unexpected keyword argument "max_turn" for "Support"' in report
    assert 'Argument "max_turns" to "Support" has incompatible type "str"' in report
    assert "Found 2 errors" in report


def test_knobs_declare_as_documented(mypy: Mypy) -> None:
    report = mypy(
        """
        from littleghost import Agent, RunContext

        class Support(Agent):
            model = "openai:gpt-4o-mini"

            def instructions(self, context: RunContext) -> str:
                return f"Turn {context.turn}."

        class Staffed(Support):
            def __init__(self) -> None:
                self.tools = []  # before super().__init__(): a constructor keyword
                super().__init__()

        agent = Support()
        agent.max_turns = 5
        agent.settings = {"temperature": 0.2}
        """
    )
    assert "Success: no issues found" in report


def test_manage_context_keeps_the_class_it_decorates(mypy: Mypy) -> None:
    report = mypy(
        """
        from littleghost import Agent, manage_context

        class Support(Agent):
            model = "openai:gpt-4o-mini"

        class NotAnAgent:
            pass

        reveal_type(manage_context(Support))
        reveal_type(manage_context(compression_threshold=0.75)(Support))
        manage_context(NotAnAgent)
        """
    )
    assert (
        report.count(
            'Revealed type is "def (**overrides: **TypedDict(littleghost.agent.AgentOptions'
        )
        == 2
    )
    assert report.count('-> __main__.Support"') == 2
    assert 'error: Value of type variable "C" of "manage_context" cannot be' in report
    assert "Found 1 error" in report


def test_manage_context_keywords_are_typed(tmp_path: Path, mypy: Mypy) -> None:
    code = """
        from littleghost import Agent, manage_context
        from littleghost.context import PromptBudget

        @manage_context(compression_threshold=0.75, budget=PromptBudget(prompt_budget_tokens=8_000))
        class Support(Agent):
            model = "openai:gpt-4o-mini"

        manage_context(compresion_threshold=0.75)
        manage_context(preserve_recent_messages="12")
        """
    report = mypy(code)
    errors = [line for line in report.splitlines() if ": error: " in line]
    assert [line.split(":")[1] for line in errors] == ["9", "10"]  # the two calls (mypy's
    assert all('"manage_context"' in line for line in errors)  # wording varies by version)
    errors = pyright(code, tmp_path)
    assert len(errors) == 2
    assert errors[0].startswith('No overloads for "manage_context" match')
    assert 'parameter "preserve_recent_messages" of type "int"' in errors[1]


def test_a_class_declares_its_name(tmp_path: Path, mypy: Mypy) -> None:
    code = """
        from littleghost import Agent

        class Support(Agent):
            model = "openai:gpt-4o-mini"
            name = "support-bot"  # the name telemetry reports

        agent = Support()
        name: str = agent.name
        agent.name = "other"
        """
    errors = pyright(code, tmp_path)  # the declaration is not one: only the assignment
    assert [error.splitlines()[0] for error in errors] == [
        'Cannot assign to attribute "name" for class "Support"'
    ]
    assert 'Cannot assign to class variable "name" via instance' in mypy(code)


def test_knobs_annotated_as_agent_declares_them(mypy: Mypy) -> None:
    """What the README says of mypy and knobs set without an annotation."""
    plain = mypy(
        """
        from littleghost import Agent

        class Guard:
            settings = {"temperature": 0}

        class Support(Guard, Agent):
            model = "openai:gpt-4o-mini"
        """
    )
    assert 'Definition of "settings" in base class "Guard" is incompatible' in plain
    annotated = mypy(
        """
        from collections.abc import Callable, Mapping
        from typing import Any

        from littleghost import Agent, RunContext
        from littleghost.models.base import Model
        from littleghost.testing import ScriptedModel, text_response

        class Guard:
            settings: Mapping[str, Any] = {"temperature": 0}

        class Support(Guard, Agent):
            model: str | Model | None = "openai:gpt-4o-mini"
            instructions: str | Callable[..., Any] | None = "Be brief."

        def brief(context: RunContext) -> str:
            return "Be brief."

        class Dynamic(Support):
            instructions = brief

        Support.model = ScriptedModel([text_response("hi")])
        """
    )
    assert "Success: no issues found" in annotated


def test_context_management_is_turned_off_as_documented(tmp_path: Path, mypy: Mypy) -> None:
    """docs/context.md: set it to None on an agent, in its __init__ too, or to a
    configuration of the agent's own."""
    code = """
        from typing import Any

        import attrs

        from littleghost import Agent, manage_context

        @manage_context(compression_threshold=0.75)
        class Support(Agent):
            model = "openai:gpt-4o-mini"

        class Unmanaged(Support):
            def __init__(self, **options: Any) -> None:
                self.context_management = None
                super().__init__(**options)

        agent = Support()
        agent.context_management = None
        agent.context_management = attrs.evolve(
            Support.context_management, compression_threshold=0.5
        )
        threshold: float = Support.context_management.compression_threshold
        """
    assert "Success: no issues found" in mypy(code)
    assert pyright(code, tmp_path) == []


def test_a_stream_output_type_types_its_run_finished_event(tmp_path: Path, mypy: Mypy) -> None:
    code = """
        import attrs

        from littleghost import Agent
        from littleghost.events import EventOf, RunFinished, TextDelta

        @attrs.frozen
        class Ticket:
            order_id: str

        class Triage(Agent):
            model = "openai:gpt-4o-mini"

        def shown(event: EventOf[Ticket]) -> str:
            match event:
                case TextDelta(text=text):
                    return text
                case RunFinished(result=result):
                    return result.output.order_id
                case _:
                    return ""

        async def main() -> str:
            async with Triage().stream("Order 42?", output_type=Ticket) as events:
                async for event in events:
                    shown(event)
                    if isinstance(event, RunFinished):
                        return event.result.output.order_id
            return ""

        async def wrong() -> None:
            async with Triage().stream("Order 42?", output_type=Ticket) as events:
                async for event in events:
                    if isinstance(event, RunFinished):
                        number: int = event.result.output
        """
    report = mypy(code)
    assert 'expression has type "Ticket", variable has type "int"' in report
    assert "Found 1 error" in report
    errors = pyright(code, tmp_path)
    assert len(errors) == 1
    assert '"Ticket" is not assignable to declared type "int"' in errors[0]


def test_an_agent_class_parameter_types_its_output(tmp_path: Path, mypy: Mypy) -> None:
    """``class Support(Agent[str])``: runs without ``output_type=`` give a ``str`` output,
    through ``run``, ``run_sync``, ``stream`` and its ``RunFinished`` event."""
    code = """
        # pyright: strict
        import attrs

        from littleghost import Agent
        from littleghost.events import RunFinished

        @attrs.frozen
        class Ticket:
            order_id: str

        class Support(Agent[str]):
            model = "openai:gpt-4o-mini"

        class Triage(Agent[Ticket]):
            model = "openai:gpt-4o-mini"
            output_type = Ticket

        def answer(question: str) -> str:
            return Support().run_sync(question).output

        async def answer_async(question: str) -> str:
            return (await Support().run(question)).output

        async def triage(question: str) -> str:
            async with Triage().stream(question) as events:
                async for event in events:
                    if isinstance(event, RunFinished):
                        return event.result.output.order_id
                return events.result.output.order_id

        def wrong(question: str) -> int:
            return Triage().run_sync(question).output
        """
    report = mypy(code)
    assert 'Incompatible return value type (got "Ticket", expected "int")' in report
    assert "Found 1 error" in report
    errors = pyright(code, tmp_path)
    assert len(errors) == 1
    assert '"Ticket" is not assignable to "int"' in errors[0]


def test_a_bare_agent_class_gives_any_output_without_errors(tmp_path: Path, mypy: Mypy) -> None:
    """A bare ``Agent`` is ``Agent[Any]``: no checker asks for its type parameter, even in
    strict modes, and its output takes any type, as before."""
    code = """
        # pyright: strict
        from littleghost import Agent

        class Support(Agent):
            model = "openai:gpt-4o-mini"

        def named(agent: Agent) -> str:
            return agent.name

        async def main(agent: Agent) -> None:
            text: str = Support().run_sync("Hello").output
            number: int = (await agent.run("Hello")).output
            async with Support().stream("Hello") as events:
                answer: bytes = events.result.output
            print(text, number, answer)
        """
    assert "Success: no issues found" in mypy(code)
    assert pyright(code, tmp_path) == []


def test_a_run_output_type_overrides_the_class_parameter(tmp_path: Path, mypy: Mypy) -> None:
    code = """
        import attrs

        from littleghost import Agent

        @attrs.frozen
        class Ticket:
            order_id: str

        class Support(Agent[str]):
            model = "openai:gpt-4o-mini"

        async def main() -> None:
            ticket: Ticket = Support().run_sync("Order 42?", output_type=Ticket).output
            tickets = (await Support().run("Order 42?", output_type=list[Ticket])).output
            first: Ticket = tickets[0]
            async with Support().stream("Order 42?", output_type=Ticket) as events:
                streamed: Ticket = events.result.output
            anything: int = Support().run_sync("Order 42?", output_type=int | None).output
            text: str = Support().run_sync("Order 42?", output_type=Ticket).output
        """
    report = mypy(code)
    assert 'expression has type "Ticket", variable has type "str"' in report
    assert "Found 1 error" in report
    errors = pyright(code, tmp_path)
    assert len(errors) == 1
    assert '"Ticket" is not assignable to declared type "str"' in errors[0]
