"""Model lifecycle: strings resolved per event loop, prepare() and aclose()."""

from __future__ import annotations

import contextlib
import copy
import functools
import pickle
import random
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.lowlevel
import pytest

from littleghost import Agent, Message, before_model, manage_context, tool
from littleghost.capabilities import Capability, CapabilityHook, add_capability
from littleghost.context import Summarization
from littleghost.context.outside import compact_log
from littleghost.errors import (
    CleanupError,
    ConfigurationError,
    DeadlineExceededError,
    OutputValidationError,
)
from littleghost.models import Model, ModelRequest, ModelResponse, register_provider
from littleghost.owned_models import KEPT_MODELS
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

from .conversations import chat
from .stores import SlowWrites, working_until
from .timing import LATE

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parent.parent


class LoopBound:
    """A model whose client belongs to the event loop it was first used in."""

    provider = "loopbound"
    context_window = None
    made: list[LoopBound] = []

    def __init__(self, name: str | None) -> None:
        self.name = name or "default"
        self.loop: object = None
        self.prepared = 0
        self.closed = False
        LoopBound.made.append(self)

    async def prepare(self) -> None:
        self.prepared += 1

    async def respond(self, request: ModelRequest) -> ModelResponse:
        token = anyio.lowlevel.current_token()
        if self.closed:
            raise RuntimeError("used after aclose")
        if self.loop is None:
            self.loop = token
        elif self.loop != token:
            raise RuntimeError("Event loop is closed")
        return text_response("hello")

    async def aclose(self) -> None:
        self.closed = True


register_provider("loopbound", LoopBound)


class NamelessModel:
    """A model holding ``name = None``."""

    name = None
    provider = "nameless"
    context_window = None

    async def respond(self, request: ModelRequest) -> ModelResponse:
        raise AssertionError("not called")


class Bound(Agent):
    model = "loopbound:m"


def test_run_sync_twice_uses_a_fresh_model_each_time() -> None:
    """Each run_sync has its own event loop; string-made models are closed at its end."""
    LoopBound.made.clear()
    agent = Bound()
    assert agent.run_sync("one").output == "hello"
    assert agent.run_sync("two").output == "hello"
    assert len(LoopBound.made) == 2
    assert all(model.closed and model.prepared == 1 for model in LoopBound.made)


async def test_leaving_async_with_closes_models_made_from_strings() -> None:
    """An Agent is an async context manager that closes the models it created."""
    LoopBound.made.clear()
    async with Bound() as agent:
        await agent.run("hi")
        await agent.run("again")
    assert len(LoopBound.made) == 1
    assert LoopBound.made[0].closed and LoopBound.made[0].prepared == 2


async def test_switching_model_strings_makes_one_model_per_string() -> None:
    """An agent whose model string changes (a tier per request, say) reuses the model
    of each string; none is left behind, and ``aclose()`` closes them all."""
    LoopBound.made.clear()
    async with Bound() as agent:
        for _ in range(5):
            for name in ("loopbound:standard", "loopbound:premium"):
                agent.model = name
                await agent.run("hi")
        assert sorted(model.name for model in LoopBound.made) == ["premium", "standard"]
        assert not any(model.closed for model in LoopBound.made)
    assert all(model.closed for model in LoopBound.made)


class Napping(LoopBound):
    """A model whose answer takes a few turns of the event loop (runs at once overlap)."""

    async def respond(self, request: ModelRequest) -> ModelResponse:
        for _ in range(3):
            await anyio.lowlevel.checkpoint()
        return await super().respond(request)


register_provider("napping", Napping)


def _open_models() -> list[str]:
    return [model.name for model in LoopBound.made if not model.closed]


async def test_an_agent_keeps_the_models_of_its_latest_model_strings_only() -> None:
    """An agent whose model string changes per tenant (``agent.model = ...`` before each
    run) keeps the models of the ``KEPT_MODELS`` strings it used last, each reused while
    kept: it kept every model (each an SDK client and its connections, a ``LocalModel``
    its server) until ``aclose()``. Drawn orders, runs one at a time and at once."""
    rng = random.Random(73)
    tenants = [f"loopbound:tenant-{number}" for number in range(3 * KEPT_MODELS)]
    LoopBound.made.clear()
    async with Bound() as agent:
        used: list[str] = []
        for _ in range(200):
            name = rng.choice(tenants[: rng.choice((KEPT_MODELS, len(tenants)))])
            reused = name in used[-KEPT_MODELS:] and name.partition(":")[2] in _open_models()
            made = len(LoopBound.made)
            agent.model = name
            assert (await agent.run("hi")).output == "hello"
            assert len(LoopBound.made) == made + (not reused)
            used = [*(kept for kept in used if kept != name), name]
            latest = {kept.partition(":")[2] for kept in used[-KEPT_MODELS:]}
            assert sorted(_open_models()) == sorted(latest)

        async def run_as(name: str) -> None:
            agent.model = name
            await agent.run("hi")  # reads the string before its first await

        async with anyio.create_task_group() as group:  # no model used after its close
            for _ in range(100):
                group.start_soon(run_as, rng.choice(tenants).replace("loopbound", "napping"))
        assert len(_open_models()) <= KEPT_MODELS
    assert not _open_models()
    said = f"keeps the models of the {KEPT_MODELS} model strings it used last"
    assert said in " ".join((ROOT / "docs" / "agents.md").read_text().split())


class FailingToClose(Napping):
    """A model whose close fails when its name starts with ``bad`` (a server that would
    not stop), its error's text a secret."""

    async def aclose(self) -> None:
        await super().aclose()
        if self.name.startswith("bad"):
            raise OSError("https://user:secret@host/ would not close")


register_provider("failclose", FailingToClose)


@pytest.mark.parametrize("seed", range(4))
async def test_a_model_given_up_for_other_strings_fails_no_run_as_it_closes(
    seed: int, caplog: pytest.LogCaptureFixture
) -> None:
    """A model given up for the strings used more lately is closed by the run that gave
    it up, or by its own last run, which did not ask for it: a failure to close it is
    logged (its type only), and every run answers (the run of another tenant's string
    failed with ``CleanupError``, "closing the run's model", its answer lost). Drawn
    strings, runs one at a time and at once; then strings of their own give every model
    up, and ``aclose()`` has nothing left to fail."""
    rng = random.Random(seed)
    tenants = [f"failclose:{('bad', 'good')[n % 2]}-{n}" for n in range(2 * KEPT_MODELS)]
    LoopBound.made.clear()
    answers: list[str] = []

    async def run_as(agent: Agent, name: str) -> None:
        agent.model = name
        answers.append((await agent.run("hi")).output)  # reads the string before awaiting

    agent = Bound()
    for _ in range(40):
        await run_as(agent, rng.choice(tenants))
    async with anyio.create_task_group() as group:
        for _ in range(60):
            group.start_soon(run_as, agent, rng.choice(tenants))
    for fresh in range(KEPT_MODELS):
        await run_as(agent, f"failclose:fresh-{fresh}")
    assert answers == ["hello"] * (100 + KEPT_MODELS)
    assert sorted(_open_models()) == [f"fresh-{fresh}" for fresh in range(KEPT_MODELS)]
    await agent.aclose()
    assert not _open_models()
    failed = [record for record in caplog.records if "used less lately failed" in record.message]
    assert failed and all(record.name == "littleghost.cleanup" for record in failed)
    assert "(OSError)" in caplog.text and "secret" not in caplog.text


class Gated(LoopBound):
    """A model whose answer waits for ``gate`` (a run held mid-call), after ``entered``."""

    gate: ClassVar[anyio.Event]
    entered: ClassVar[anyio.Event]

    async def respond(self, request: ModelRequest) -> ModelResponse:
        Gated.entered.set()
        await Gated.gate.wait()
        return await super().respond(request)


register_provider("gated", Gated)


class Delegating(Bound):
    """A class whose ``resolve_model()`` delegates to ``super()``'s; while it runs, other
    tenants' strings, as another thread's runs would, push its model out of those kept."""

    crowd = False

    def resolve_model(self) -> Model:
        model = super().resolve_model()
        if self.crowd:
            own = self.model
            for other in range(KEPT_MODELS):
                self.model = f"napping:other-{other}"
                super().resolve_model()
            self.model = own
        return model


async def test_a_model_handed_out_then_given_up_is_not_closed_under_its_run() -> None:
    """A model ``resolve_model()`` handed out (an override calling ``super()``'s), then
    given up for other strings before its run used it, is not that run's: the run takes
    the model of its string now, and another run's end closes the given-up one. (The
    run's model was closed under it by the other run: "used after aclose".)"""
    LoopBound.made.clear()
    Gated.gate, Gated.entered = anyio.Event(), anyio.Event()
    agent = Delegating(model="gated:tenant")
    answers: list[str] = []

    async def held_run() -> None:
        agent.crowd = True
        answers.append((await agent.run("hi")).output)

    async with agent, anyio.create_task_group() as group:
        group.start_soon(held_run)
        await Gated.entered.wait()
        handed = next(model for model in LoopBound.made if model.name == "tenant")
        agent.crowd, agent.model = False, "napping:next"
        answers.append((await agent.run("hi")).output)  # ends, closing what was given up
        assert handed.closed
        Gated.gate.set()
    assert answers == ["hello", "hello"]
    tenants = [model for model in LoopBound.made if model.name == "tenant"]
    assert len(tenants) == 2 and all(model.closed for model in tenants)


class SlowToMake(LoopBound):
    """A model whose making takes a while (reading a configuration, say)."""

    def __init__(self, name: str | None) -> None:
        time.sleep(0.05)
        super().__init__(name)


register_provider("slowtomake", SlowToMake)


def test_threads_starting_runs_at_once_share_one_model() -> None:
    """The model of a model string is made once per agent, whatever threads ask for it at
    the same moment; ``aclose()`` closes that one."""
    LoopBound.made.clear()
    agent = Agent(model="slowtomake:x")
    start = threading.Barrier(6)
    got: list[Any] = []

    def ask() -> None:
        start.wait()
        got.append(agent.resolve_model())

    threads = [threading.Thread(target=ask) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(LoopBound.made) == 1 and all(model is LoopBound.made[0] for model in got)
    anyio.run(agent.aclose)
    assert LoopBound.made[0].closed


FORKED_WHILE_MAKING = """
import multiprocessing
import os
import threading

from littleghost import Agent
from littleghost.models import register_provider
from littleghost.testing import ScriptedModel, text_response

parent = os.getpid()
making, made = threading.Event(), threading.Event()


def slowly(name):
    if os.getpid() == parent:  # an SDK client taking its time, until the fork is made
        making.set()
        made.wait()
    return ScriptedModel([text_response(f"{name} answers")])


register_provider("slowly", slowly)


def child():
    given = Agent(model=ScriptedModel([text_response("given answers")]))
    print(given.run_sync("hi", timeout=5).output, flush=True)
    print(Agent(model="slowly:made").run_sync("hi", timeout=5).output, flush=True)


maker = threading.Thread(target=Agent(model="slowly:x").resolve_model)
maker.start()
making.wait()
worker = multiprocessing.get_context("fork").Process(target=child)
worker.start()
worker.join(20)
made.set()
maker.join()
print("exit code", worker.exitcode)
if worker.is_alive():
    worker.kill()
"""


@pytest.mark.skipif(sys.platform == "win32", reason="fork() is POSIX")
def test_a_process_forked_while_a_thread_makes_a_model_runs() -> None:
    """A worker forked (a process pool's) while a thread of the parent makes an agent's
    model from a string (the provider's factory under way) runs agents as any process:
    every run there waited, for good, for a lock that thread held, which is not in it."""
    done = subprocess.run(
        [sys.executable, "-c", FORKED_WHILE_MAKING], capture_output=True, text=True, timeout=60
    )
    assert done.stdout.splitlines() == ["given answers", "made answers", "exit code 0"], done.stderr


class Labelled(Bound):
    """An agent with a constructor of its own, and a hook that reads what it set."""

    def __init__(self, label: str, **overrides: Any) -> None:
        super().__init__(**overrides)
        self.label = label
        self.seen: list[str] = []

    @before_model
    def note(self, request: ModelRequest) -> None:
        self.seen.append(self.label)


@pytest.mark.parametrize("how", ["copy", "deepcopy", "pickle"])
async def test_a_copied_agent_runs_its_own_hooks_and_closes_its_own_models(how: str) -> None:
    """A copy's hooks are bound to the copy, not the original, and it makes and closes
    models of its own (the original's stay open); a pickle comes back the same."""
    LoopBound.made.clear()
    original = Labelled("original")
    await original.run("hi")
    copied = {
        "copy": copy.copy,
        "deepcopy": copy.deepcopy,
        "pickle": lambda agent: pickle.loads(pickle.dumps(agent)),
    }[how](original)
    copied.label = "copy"
    async with copied:
        await copied.run("hi")
    assert copied.seen[-1] == "copy"  # (a shallow copy shares the list, as Python's do)
    first, second = LoopBound.made
    assert second.closed and not first.closed
    await original.aclose()


async def test_a_deep_copy_shares_the_model_and_store_given_to_the_constructor() -> None:
    """As a copy shares the class's: a client or a lock cannot be copied, and a copied
    in-memory store would fork its conversations."""
    model, store = LoopBound("mine"), InMemorySessionStore()
    original = Labelled("original", model=model, session_store=store)
    copied = copy.deepcopy(original)
    assert copied.model is model and copied.session_store is store
    await copied.run("hi", session_id="s")
    assert [message.text for message in await store.load("s")] == ["hi", "hello"]
    assert copied.seen == ["original"] and original.seen == []


class Stock:
    """A client behind a tool: it holds a lock, which no copy can hold."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.calls = 0

    def count(self, item: str) -> int:
        """How many of an item are in stock."""
        with self.lock:
            self.calls += 1
            return 3

    def seen(self, request: ModelRequest) -> ModelRequest:
        """Count a model call."""
        with self.lock:
            self.calls += 1
        return request


STOCK = Stock()


class Stocked(Agent):
    tools = [STOCK.count]


@pytest.mark.parametrize("declared", [True, False])
async def test_a_deep_copy_shares_the_clients_behind_its_tools(declared: bool) -> None:
    """A tool that is a client's bound method (declared, or given to the constructor)
    keeps its client in a deep copy: it was copied, and a client with a lock failed."""
    stock = STOCK if declared else Stock()
    model = ScriptedModel([tool_call_response("count", {"item": "apples"}), text_response("3")])
    agent = Stocked(model=model) if declared else Agent(model=model, tools=[stock.count])
    calls = stock.calls
    await copy.deepcopy(agent).run("apples?")
    assert stock.calls == calls + 1


class Watched(Agent):
    @before_model
    def check(self, request: ModelRequest) -> ModelRequest:
        return request

    def __init__(self, stock: Stock, **overrides: Any) -> None:
        self.check = stock.seen  # a hook set before super().__init__()
        super().__init__(**overrides)


async def test_a_deep_copy_shares_the_client_behind_a_hook_set_on_the_instance() -> None:
    """A hook set on the instance that is a client's bound method keeps its client in a
    deep copy, as a tool does: it was copied, and a client with a lock failed."""
    stock = Stock()
    agent = Watched(stock, model=ScriptedModel([text_response("ok")]))
    await copy.deepcopy(agent).run("hi")
    assert stock.calls == 1


def noting(label: str) -> Any:
    """A capability made per label: its hook is a closure, which no pickle can hold."""

    def note(agent: Any, request: ModelRequest, *, context: Any) -> None:
        agent.seen.append(label)

    def decorate(cls: type[Agent]) -> type[Agent]:
        add_capability(cls, Capability("noting", [CapabilityHook("before_model", note)]))
        return cls

    return decorate


@noting("capability")
class Noted(Labelled):
    pass


async def test_an_agent_with_a_capability_of_closures_pickles() -> None:
    """Its hooks come from its class, not the pickle: a capability's closures need not
    be picklable."""
    copied = pickle.loads(pickle.dumps(Noted("original")))
    copied.label = "copy"
    await copied.run("hi")
    assert copied.seen == ["copy", "capability"]  # the parent's hook, then the capability
    await copied.aclose()


async def test_a_given_model_instance_is_not_closed() -> None:
    """A Model passed in is the caller's to close."""
    model = LoopBound("mine")
    async with Agent(model=model) as agent:
        await agent.run("hi")
    assert not model.closed


async def test_a_summarizers_own_model_is_prepared_once_per_run() -> None:
    """Summarization(model=...) gets its prepare() awaited before it is used."""
    summarizer = LoopBound("summarizer")

    class One:
        def count_tokens(self, text: str) -> int:
            return 1

    @manage_context(
        context_window_tokens=100,
        compression_threshold=0.5,
        tokenizer=One(),
        strategy=Summarization(model=summarizer, minimum_preserved=4),
    )
    class Summarized(Agent):
        pass

    def answer(request: ModelRequest) -> ModelResponse:
        return text_response("done")

    from littleghost.testing import ScriptedModel

    history = [m for i in range(40) for m in (Message.user(f"q{i}"), Message.assistant(f"a{i}"))]
    await Summarized(model=ScriptedModel([answer])).run("go", history=history)
    assert summarizer.prepared == 1


def test_a_hook_override_that_is_not_callable_fails_at_class_definition() -> None:
    """Overriding a hook method with a non-callable is caught when the class is defined."""
    from littleghost import before_model

    class Parent(Agent):
        @before_model
        def audit(self, request: Any) -> None:
            return None

    with pytest.raises(ConfigurationError, match="audit"):

        class Child(Parent):
            audit = "off"  # type: ignore[assignment]

    class Disabled(Parent):
        audit = None  # type: ignore[assignment]

    assert Disabled is not None


class HangingClose(LoopBound):
    """A model whose client never finishes closing."""

    provider = "hangingclose"

    async def aclose(self) -> None:
        await anyio.sleep(30)


register_provider("hangingclose", HangingClose)


class SlowToClose(LoopBound):
    """A model whose client takes a while to close (a local server's exit, say)."""

    provider = "slowtoclose"

    async def aclose(self) -> None:
        await anyio.sleep(0.3)
        self.closed = True


register_provider("slowtoclose", SlowToClose)


class Hanging(Agent):
    model = "hangingclose:m"
    cleanup_grace = 0.2


@pytest.mark.virtual_clock
async def test_closing_models_takes_at_most_the_grace() -> None:
    agent = Hanging()
    await agent.run("hi")
    began = anyio.current_time()
    with pytest.raises(CleanupError) as caught:
        await agent.aclose()
    assert anyio.current_time() - began == pytest.approx(0.2)
    assert isinstance(caught.value.__cause__, TimeoutError)


def test_run_sync_ends_within_the_grace_when_its_model_hangs_closing() -> None:
    began = time.monotonic()
    with pytest.raises(CleanupError):
        Hanging().run_sync("hi")
    assert time.monotonic() - began < 0.2 + LATE


class HangingCaller(HangingClose):
    """Calls a tool that never finishes; never finishes closing."""

    provider = "hangingcaller"

    async def respond(self, request: ModelRequest) -> ModelResponse:
        return tool_call_response("wait", {})


register_provider("hangingcaller", HangingCaller)


class StallingStore(InMemorySessionStore):
    """Stores the first two messages at once; every later write hangs."""

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        if len(await self.load(session_id)) >= 2:
            await anyio.sleep(30)
        await super().append(session_id, messages)


class Stalling(Agent):
    model = "hangingcaller:m"
    cleanup_grace = LATE + 1.0  # a second grace shows past LATE

    @tool
    async def wait(self) -> str:
        """Never finish."""
        await anyio.sleep(30)
        return "never"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_run_sync_closes_its_model_within_the_runs_grace(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store write at the stop takes the whole grace: closing the model gets no more."""
    monkeypatch.setattr(anyio, "run", functools.partial(anyio.run, backend=backend))
    agent = Stalling(session_store=StallingStore())
    began = time.monotonic()
    with pytest.raises(DeadlineExceededError):
        agent.run_sync("Wait.", session_id="s", timeout=0.2)
    assert time.monotonic() - began < 0.2 + Stalling.cleanup_grace + LATE


@pytest.mark.virtual_clock  # the times below are exact, and take no real time
class TestNoSecondGrace:
    @pytest.mark.parametrize("how", ["timeout", "fail_after", "stream", "task group"])
    async def test_leaving_async_with_by_a_runs_stop_takes_no_second_grace(self, how: str) -> None:
        """The run's cleanup (a store write at the stop) takes the whole grace: closing
        the agent's model as ``async with agent:`` ends, its stop going on (the run's
        deadline, an enclosing ``fail_after``, a stream's block left by it, runs in a task
        group of the block), gets no more. It took a second grace: a deadline of 0.2 s,
        with a grace of 1 s, ended at 2.2 s."""
        began = anyio.current_time()
        stop = anyio.fail_after(0.2) if how != "timeout" else contextlib.nullcontext()
        with pytest.raises(TimeoutError), stop:  # DeadlineExceededError is a TimeoutError too
            async with Stalling(session_store=StallingStore()) as agent:
                if how == "stream":
                    async with agent.stream("Wait.", session_id="s") as events:
                        async for _ in events:
                            pass
                elif how == "task group":
                    async with anyio.create_task_group() as group:
                        for session_id in ("s", "t"):
                            run = functools.partial(agent.run, "Wait.", session_id=session_id)
                            group.start_soon(run)
                else:
                    timeout = 0.2 if how == "timeout" else None
                    await agent.run("Wait.", session_id="s", timeout=timeout)
        assert anyio.current_time() - began == pytest.approx(0.2 + Stalling.cleanup_grace)


class BadClose(LoopBound):
    """A model whose client fails to close."""

    provider = "badclose"

    async def aclose(self) -> None:
        raise OSError("connection reset while closing")


register_provider("badclose", BadClose)


class Closing(Agent):
    model = "badclose:m"


class TestAFailingClose:
    async def test_is_raised_when_the_block_ends_normally(self) -> None:
        """Leaving async with normally raises CleanupError, the model's error its cause."""
        with pytest.raises(CleanupError) as caught:
            async with Closing() as agent:
                await agent.run("hi")
        assert isinstance(caught.value.__cause__, OSError)

    async def test_never_replaces_the_blocks_cancellation(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The caller's cancel scope still catches its cancellation; the failure is logged."""
        with anyio.CancelScope() as scope:
            async with Closing() as agent:
                await agent.run("hi")
                scope.cancel()
                await anyio.sleep(1)
        assert scope.cancelled_caught
        assert "closing the agent's models failed too (CleanupError from OSError)" in caplog.text

    async def test_never_replaces_the_blocks_own_error(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The block's own exception propagates as it is; the failure is logged."""
        with pytest.raises(ValueError, match="mine") as caught:
            async with Closing() as agent:
                await agent.run("hi")
                raise ValueError("mine")
        assert caught.value.__context__ is None
        assert "while ValueError went on" in caplog.text
        assert "connection reset" not in caplog.text


def test_run_sync_raises_the_runs_error_when_its_model_fails_to_close_too(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The run's own exception is raised; the close failure is logged."""
    with pytest.raises(OutputValidationError):
        Closing(max_turns=1).run_sync("hi", output_type=int)  # "hello" is no int
    assert (
        "closing the run's model failed too (CleanupError from OSError) "
        "while OutputValidationError went on"
    ) in caplog.text
    assert "connection reset" not in caplog.text


class BadCloseCaller(BadClose):
    """Calls a tool that never finishes; fails to close."""

    provider = "badclosecaller"

    async def respond(self, request: ModelRequest) -> ModelResponse:
        return tool_call_response("wait", {})


register_provider("badclosecaller", BadCloseCaller)


class StallingBadClose(Stalling):
    model = "badclosecaller:m"


def test_run_sync_past_its_deadline_has_the_failed_close_as_its_cause() -> None:
    """Closing ``run_sync``'s model is the run's cleanup: when it fails, the failure is
    the ``__cause__`` of the ``DeadlineExceededError``, as for a failed store write (it
    was only logged)."""
    with pytest.raises(DeadlineExceededError) as caught:
        StallingBadClose().run_sync("Wait.", timeout=0.2)
    assert isinstance(caught.value.__cause__, CleanupError)
    assert isinstance(caught.value.__cause__.__cause__, OSError)


class AsksToWait(LoopBound):
    """Has the run call its ``wait`` tool, then answers; fails once closed."""

    provider = "askstowait"

    async def respond(self, request: ModelRequest) -> ModelResponse:
        await super().respond(request)
        if request.messages[-1].role == "tool":
            return text_response("done")
        return tool_call_response("wait", {})


register_provider("askstowait", AsksToWait)


class Gated(Agent):
    """Its runs wait in a tool until the gate opens."""

    model = "askstowait:m"

    def __init__(self, runs: int = 1) -> None:
        super().__init__()
        self.runs = runs
        self.gate = anyio.Event()
        self.all_waiting = anyio.Event()
        self.waiting = 0

    @tool
    async def wait(self) -> str:
        """Wait for the gate."""
        self.waiting += 1
        if self.waiting == self.runs:
            self.all_waiting.set()
        await self.gate.wait()
        return "open"


@contextlib.asynccontextmanager
async def cancelled_in_its_tool(agent: Agent, in_tool: anyio.Event) -> AsyncIterator[None]:
    """Run ``agent`` on session ``s``, cancelled once in its tool (a server stopping a
    request), and enter the block with the run stopping."""
    request = anyio.CancelScope()

    async def serve() -> None:
        with request:
            await agent.run("go", session_id="s")

    async with anyio.create_task_group() as group:
        group.start_soon(serve)
        with anyio.fail_after(5):
            await in_tool.wait()
        request.cancel()
        yield


class Pausing:
    """A model whose ``default_max_tokens``, read in the thread ``serving`` as its run
    starts (once the run has the model, before it uses it), waits until ``go`` is set:
    the moment a thread switch may come there, made to last."""

    provider = "pausing"
    context_window = None
    made: list[Pausing] = []
    reached = threading.Event()
    go = threading.Event()

    def __init__(self, name: str | None) -> None:
        self.closed = False
        Pausing.made.append(self)

    name = "pausing"

    @property
    def default_max_tokens(self) -> None:
        if threading.current_thread().name == "serving" and not Pausing.go.is_set():
            Pausing.reached.set()
            assert Pausing.go.wait(10)

    async def respond(self, request: ModelRequest) -> ModelResponse:
        if self.closed:
            raise RuntimeError("used after aclose")
        return text_response("hello")

    async def aclose(self) -> None:
        self.closed = True


register_provider("pausing", Pausing)


class TestClosingDuringRuns:
    """``aclose()`` while runs of the agent are in flight: they keep their model, closed
    as the last of them ends (it was closed under them, and reopened by their next call;
    a ``LocalModel`` started a server nobody closed)."""

    async def until_waiting(self, agent: Gated) -> None:
        with anyio.fail_after(5):
            await agent.all_waiting.wait()

    async def test_the_model_closes_as_the_last_run_ends(self) -> None:
        LoopBound.made.clear()
        agent = Gated(runs=2)
        outputs: list[str] = []

        async def run() -> None:
            outputs.append((await agent.run("Wait.")).output)

        async with anyio.create_task_group() as group:
            group.start_soon(run)
            group.start_soon(run)
            await self.until_waiting(agent)
            with anyio.fail_after(LATE):
                await agent.aclose()  # returns at once: the runs still use the model
            assert not LoopBound.made[0].closed
            agent.gate.set()
        assert outputs == ["done", "done"]
        assert len(LoopBound.made) == 1 and LoopBound.made[0].closed

    async def test_a_run_started_afterwards_makes_a_new_model(self) -> None:
        LoopBound.made.clear()
        agent = Gated()
        async with anyio.create_task_group() as group:
            group.start_soon(agent.run, "Wait.")
            await self.until_waiting(agent)
            await agent.aclose()
            agent.gate.set()
            assert (await agent.run("Wait.")).output == "done"
        first, second = LoopBound.made
        assert first.closed and not second.closed
        await agent.aclose()
        assert second.closed

    async def test_a_class_that_makes_its_model_itself_runs_with_it(self) -> None:
        """An agent class whose ``resolve_model()`` gives a model of its own, its
        ``model`` a string: its runs use that model, not the string's."""
        mine = ScriptedModel([text_response("mine")])

        class Own(Agent):
            model = "pausing:m"

            def resolve_model(self) -> Any:
                return mine

        assert (await Own().run("Hi.")).output == "mine"
        assert len(mine.requests) == 1

    def test_run_sync_uses_a_model_the_class_makes_itself(self) -> None:
        """``run_sync()`` made the model string's model (or failed, the class declaring
        no model) instead of the one the class's ``resolve_model()`` gives."""
        mine = ScriptedModel([text_response("mine"), text_response("mine again")])

        class Own(Agent):
            def resolve_model(self) -> Any:
                return mine

        class OwnOverString(Agent):
            model = "pausing:m"

            def resolve_model(self) -> Any:
                return mine

        assert Own().run_sync("Hi.").output == "mine"
        assert OwnOverString().run_sync("Hi.").output == "mine again"

    @pytest.mark.parametrize(
        ("returned", "said"),
        [
            ("openai:gpt-4o", "must return a Model, not str (littleghost.models.resolve()"),
            (None, "must return a Model, not None"),
            (ScriptedModel, "must return a Model, not the class ScriptedModel"),
            (object(), "must return a Model, not object"),
            (NamelessModel(), "NamelessModel's name must be a non-empty str, not None"),
            ("coroutine", "returned a coroutine, not a Model"),
        ],
    )
    @pytest.mark.parametrize("entry", ["run", "run_sync", "compact_log"])
    async def test_a_class_whose_resolve_model_gives_no_model_is_told(
        self, returned: object, said: str, entry: str
    ) -> None:
        """What a class's own ``resolve_model()`` returns is checked as a model given as
        ``model =`` is: anything else failed later with an ``AttributeError`` (``'str'
        object has no attribute 'provider'``), or at its first call."""

        async def later() -> None:
            pass

        @manage_context
        class Own(Agent):
            def resolve_model(self) -> Any:
                return later() if returned == "coroutine" else returned

        agent = Own()
        with pytest.raises(ConfigurationError) as caught:
            if entry == "run":
                await agent.run("Hi.")
            elif entry == "run_sync":
                await anyio.to_thread.run_sync(agent.run_sync, "Hi.")
            else:
                await compact_log(agent, chat(6))
        assert str(caught.value).startswith("Own.resolve_model()")
        assert said in str(caught.value)

    @pytest.mark.parametrize("wrap", [lambda f: f, staticmethod, classmethod])
    def test_an_async_resolve_model_fails_at_class_definition(
        self, wrap: Callable[[Any], Any]
    ) -> None:
        """An ``async def resolve_model`` could never give a model (runs call it without
        ``await``): the class fails as it is defined, not at its first run."""

        async def resolve_model(*_: object) -> Model:
            raise AssertionError("never called")

        with pytest.raises(ConfigurationError, match=r"^Later.resolve_model is an async def"):
            type("Later", (Agent,), {"resolve_model": wrap(resolve_model)})

    def test_a_run_in_another_thread_keeps_off_a_model_closed_as_it_started(self) -> None:
        """Threads share an agent, each running it in an event loop of its own: an
        ``aclose()`` in one, coming after a run in another took the model made from the
        agent's model string but before it counted its use, closed that model under the
        run (``used after aclose``; a ``LocalModel``'s server stopped mid-run). The run
        takes the model the string gives then."""
        Pausing.made.clear()
        Pausing.reached.clear()
        Pausing.go.clear()

        class Shared(Agent):
            model = "pausing:m"

        agent = Shared()
        outputs: list[str] = []

        def serve() -> None:
            outputs.append(anyio.run(agent.run, "Hi.").output)

        server = threading.Thread(target=serve, name="serving")
        server.start()
        try:
            assert Pausing.reached.wait(10)
            anyio.run(agent.aclose)
        finally:
            Pausing.go.set()
            server.join(10)
        assert outputs == ["hello"]
        first, second = Pausing.made
        assert first.closed and not second.closed
        anyio.run(agent.aclose)
        assert second.closed

    async def test_leaving_async_with_during_a_run(self) -> None:
        LoopBound.made.clear()
        async with anyio.create_task_group() as group:
            async with Gated() as agent:
                group.start_soon(agent.run, "Wait.")
                await self.until_waiting(agent)
            assert not LoopBound.made[0].closed
            agent.gate.set()
        assert LoopBound.made[0].closed

    @pytest.mark.parametrize("turns", [0, 1, 2, 3])
    async def test_a_stopping_run_is_waited_for_whenever_aclose_comes(self, turns: int) -> None:
        """A run cancelled just before ``aclose()`` (a server shutting down cancels its
        requests, then closes the agent in its lifespan) still has its cleanup to do: the
        write answering its open call. ``aclose()`` returns once that run has ended, its
        grace at most, so an event loop that ends right after cannot cut that write off
        (runs going on are not waited for, above) — whatever the number of scheduler
        turns between the cancellation and ``aclose()``: under asyncio, once the run's
        tool task had ended, its own task waited, shielded, in the tool batch's task
        group, neither stopping nor with a cancellation pending, for a turn or two, and
        was not waited for."""
        in_tool = anyio.Event()
        store = SlowWrites()
        model = ScriptedModel([tool_call_response("work", {}, call_id="w")])
        agent = working_until(in_tool, anyio.Event())(model=model, session_store=store)
        async with cancelled_in_its_tool(agent, in_tool):
            for _ in range(turns):
                await anyio.lowlevel.checkpoint()
            with anyio.fail_after(agent.cleanup_grace + 0.5):
                await agent.aclose()
            stored = await store.load("s")
            assert [message.role.value for message in stored] == ["user", "assistant", "tool"]
            assert stored[-1].tool_results[0].call_id == "w"

    async def test_the_closers_own_cancellation_stops_no_run_it_is_under(self) -> None:
        """``aclose()`` leaving a cancelled ``async with agent:`` in a task started beside
        a run (under the run's task, not in the run) does not take that run, going on,
        for a stopping one: it returned after the whole ``cleanup_grace``."""
        in_tool, release = anyio.Event(), anyio.Event()
        model = ScriptedModel([tool_call_response("work", {}, call_id="w"), text_response("ok")])
        agent = working_until(in_tool, release)(model=model, cleanup_grace=3)
        took: list[float] = []

        async def close_when_cancelled() -> None:
            await in_tool.wait()
            with anyio.CancelScope() as scope:
                scope.cancel()
                started = anyio.current_time()
                try:
                    await agent.aclose()
                finally:
                    took.append(anyio.current_time() - started)
                    release.set()

        async with anyio.create_task_group() as group:
            group.start_soon(close_when_cancelled)
            assert (await agent.run("go")).output == "ok"
        assert took[0] < agent.cleanup_grace / 2

    async def test_a_stopping_runs_cleanup_leaves_the_idle_models_their_close(self) -> None:
        """The models no run uses are closed while the stopping runs are waited for, not
        after: a run whose cleanup took most of the grace left them none, and
        ``aclose()`` raised ``CleanupError`` with their clients still open."""
        LoopBound.made.clear()
        in_tool = anyio.Event()
        agent = working_until(in_tool, anyio.Event())(model="slowtoclose:idle")
        await agent.run("hi")  # the model made from the string: idle from now on
        agent.model = ScriptedModel([tool_call_response("work", {}, call_id="w")])
        # the run's cleanup write (its third message) takes most of the grace
        agent.session_store = store = SlowWrites(seconds=0.8, after=2)
        async with cancelled_in_its_tool(agent, in_tool):
            await agent.aclose()
            assert LoopBound.made[0].closed
            stored = await store.load("s")
            assert [message.role.value for message in stored] == ["user", "assistant", "tool"]

    async def test_a_failed_close_is_the_last_runs_cleanup_error(self) -> None:
        class BadlyClosing(Gated):
            model = "badcloseasking:m"

        agent = BadlyClosing()

        async def close_while_waiting() -> None:
            await self.until_waiting(agent)
            await agent.aclose()  # nothing it can close yet: no error here
            agent.gate.set()

        async with anyio.create_task_group() as group:
            group.start_soon(close_while_waiting)
            with pytest.raises(CleanupError) as caught:
                await agent.run("Wait.")
        assert isinstance(caught.value.__cause__, OSError)


class BadCloseAsking(AsksToWait, BadClose):
    provider = "badcloseasking"


register_provider("badcloseasking", BadCloseAsking)


class CancelsWhileClosing(AsksToWait):
    """Has the run call its ``wait`` tool; closing it cancels the caller's scope (the
    first of ``scopes``: a deadline passing meanwhile) and never finishes."""

    provider = "cancelswhileclosing"
    scopes: list[anyio.CancelScope] = []

    async def aclose(self) -> None:
        self.scopes[0].cancel()
        await anyio.sleep(30)


register_provider("cancelswhileclosing", CancelsWhileClosing)


class GatedCancelling(Gated):
    model = "cancelswhileclosing:m"
    cleanup_grace = 0.2


@pytest.mark.parametrize("how", ["async with", "aclose", "the run's last use"])
async def test_a_cancellation_that_comes_while_closing_goes_on(
    how: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The caller's deadline passes while a model is closed (shielded, up to the grace)
    and the close fails: the cancellation goes on (``move_on_after`` moves on), the
    failure is logged. ``CleanupError`` replaced it: leaving ``async with agent:``, in
    ``aclose()``, and as a run closed a model given up during it, after it answered."""
    agent = GatedCancelling()
    agent.gate.set()
    with anyio.CancelScope() as scope:
        CancelsWhileClosing.scopes[:] = [scope]
        if how == "async with":
            async with agent:
                await agent.run("Wait.")
        elif how == "aclose":
            await agent.run("Wait.")
            await agent.aclose()
        else:
            agent.gate = anyio.Event()
            async with anyio.create_task_group() as group:
                group.start_soon(agent.run, "Wait.")
                with anyio.fail_after(5):
                    await agent.all_waiting.wait()
                await agent.aclose()  # the run still uses it: closed as the run ends
                agent.gate.set()
    assert scope.cancelled_caught
    assert "failed too (CleanupError from TimeoutError) while" in caplog.text


class SlowSummary(LoopBound):
    """Answers once its gate opens; fails once closed."""

    provider = "slowsummary"

    def __init__(self, name: str | None) -> None:
        super().__init__(name)
        self.asked = anyio.Event()
        self.gate = anyio.Event()

    async def respond(self, request: ModelRequest) -> ModelResponse:
        self.asked.set()
        await self.gate.wait()
        return await super().respond(request)


register_provider("slowsummary", SlowSummary)


async def test_compact_log_keeps_its_model_through_aclose() -> None:
    """``compact_log`` holds the model as a run does: closed as it ends."""

    @manage_context(context_window_override=4_000)
    class Compacting(Agent):
        model = "slowsummary:m"

    agent = Compacting()
    model = agent.resolve_model()
    assert isinstance(model, SlowSummary)
    async with anyio.create_task_group() as group:
        group.start_soon(compact_log, agent, chat(12))
        with anyio.fail_after(5):
            await model.asked.wait()
        await agent.aclose()
        assert not model.closed
        model.gate.set()
    assert model.closed
