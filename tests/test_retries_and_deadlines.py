"""Deadlines, cancellation and the retry policy for transient provider errors."""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import anyio
import attrs
import pytest

from littleghost import (
    Agent,
    Message,
    RunContext,
    ToolCall,
    after_model,
    after_model_error,
    before_model,
    before_tool,
    manage_context,
    tool,
)
from littleghost.capabilities import Capability, CapabilityHook, add_capability
from littleghost.errors import (
    ContextWindowOverflowError,
    DeadlineExceededError,
    InvalidRequestError,
    ProviderUnavailableError,
    RateLimitError,
)
from littleghost.events import ModelCallRetried, ToolCallFinished
from littleghost.models import ModelRequest, ModelResponse
from littleghost.retry import call_with_retries
from littleghost.sessions import InMemorySessionStore
from littleghost.testing import ScriptedModel, Step, text_response, tool_call_response

from .timing import LATE

pytestmark = pytest.mark.anyio


async def hang(request: ModelRequest) -> ModelResponse:
    """A model step that never answers."""
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


def timed(times: list[float], step: Step) -> Callable[[ModelRequest], ModelResponse]:
    """A step that notes the time it was called, then plays ``step``."""

    def play(request: ModelRequest) -> ModelResponse:
        times.append(anyio.current_time())
        if isinstance(step, BaseException):
            raise step
        assert isinstance(step, ModelResponse)
        return step

    return play


class Slow(Agent):
    def __init__(self, **overrides: object) -> None:
        super().__init__(**overrides)
        self.release = threading.Event()

    @tool
    async def wait_async(self) -> str:
        """Waits for ever."""
        await anyio.sleep_forever()
        return "never"

    @tool
    def wait_sync(self) -> str:
        """Blocks a thread until released."""
        self.release.wait(30)
        return "released"


@pytest.mark.virtual_clock
async def test_deadline_during_a_model_call() -> None:
    """A timeout passing during a model call raises DeadlineExceededError promptly."""
    model = ScriptedModel([hang])
    start = anyio.current_time()
    with pytest.raises(DeadlineExceededError):
        await Slow(model=model).run("hi", timeout=0.2)
    assert anyio.current_time() - start == pytest.approx(0.2)


@pytest.mark.virtual_clock
async def test_absolute_deadline_during_a_model_call() -> None:
    """deadline= (anyio clock time) bounds the run like timeout=."""
    start = anyio.current_time()
    with pytest.raises(DeadlineExceededError):
        await Slow(model=ScriptedModel([hang])).run("hi", deadline=start + 0.2)
    assert anyio.current_time() - start == pytest.approx(0.2)


@pytest.mark.virtual_clock
async def test_the_earlier_of_timeout_and_deadline_wins() -> None:
    """Given both, the run ends at the earlier of timeout and deadline."""
    start = anyio.current_time()
    with pytest.raises(DeadlineExceededError):
        await Slow(model=ScriptedModel([hang])).run("hi", timeout=30, deadline=start + 0.2)
    assert anyio.current_time() - start == pytest.approx(0.2)


async def test_deadline_error_is_a_timeout_error() -> None:
    """Callers may catch the deadline as TimeoutError."""
    with pytest.raises(TimeoutError):
        await Slow(model=ScriptedModel([hang])).run("hi", timeout=0.05)


async def test_a_deadline_already_passed_fails_before_answering() -> None:
    """A zero timeout raises DeadlineExceededError even against an instant model."""
    with pytest.raises(DeadlineExceededError):
        await Slow(model=ScriptedModel([text_response("too fast")])).run("hi", timeout=0)


class Phases(Agent):
    """An agent any phase of whose run can be made to hang."""

    def __init__(self, hangs: str, **overrides: object) -> None:
        super().__init__(**overrides)
        self.hangs = hangs

    async def _hang(self, phase: str) -> None:
        if self.hangs == phase:
            await anyio.sleep_forever()

    @before_model
    async def before(self, request: ModelRequest) -> None:
        await self._hang("before_model")

    @after_model
    async def after(self, response: ModelResponse) -> None:
        await self._hang("after_model")

    @after_model_error
    async def mend(self, request: ModelRequest, error: Exception) -> None:
        await self._hang("after_model_error")

    @before_tool
    async def before_call(self, call: ToolCall) -> None:
        await self._hang("before_tool")

    @tool
    async def look_up(self) -> str:
        """Look something up."""
        await self._hang("tool")
        return "found"


class HangingStore(InMemorySessionStore):
    """A store whose appends after the first (the question's) never end."""

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        if await self.load(session_id):
            await anyio.sleep_forever()
        await super().append(session_id, messages)


class HangingPrepare(ScriptedModel):
    async def prepare(self) -> None:
        await anyio.sleep_forever()


@pytest.mark.virtual_clock
@pytest.mark.parametrize(
    ("hangs", "called", "says"),
    [
        ("model", "look_up", "waiting for the model's answer in turn 2"),
        ("before_model", "", "running the before_model hook 'before' in turn 1"),
        ("after_model", "", "running the after_model hook 'after' in turn 1"),
        ("after_model_error", "", "running the after_model_error hook 'mend' in turn 1"),
        ("tool", "look_up", "running tool 'look_up' in turn 1"),
        ("before_tool", "look_up", "running tool 'look_up' in turn 1"),
        ("before_tool", "made-up-by-the-model", "running an undeclared tool in turn 1"),
        ("store", "", "storing messages in the session in turn 1"),
        ("prepare", "", "preparing the model (a local model starts its server) in turn 1"),
    ],
)
async def test_a_deadline_error_says_what_the_run_was_doing(
    hangs: str, called: str, says: str
) -> None:
    """What a run was doing when its deadline came is in its error (a hook by name; a
    tool by name when the agent declares it; a name the model made up is its text, not
    told)."""
    steps: list[Step] = [tool_call_response(called, {})] if called else []
    if hangs == "after_model_error":
        steps.append(InvalidRequestError("refused"))
    steps.append(hang if hangs == "model" else text_response("done"))
    model = (HangingPrepare if hangs == "prepare" else ScriptedModel)(steps)
    store = HangingStore() if hangs == "store" else InMemorySessionStore()
    agent = Phases(hangs, model=model, session_store=store, cleanup_grace=0.1)
    with pytest.raises(DeadlineExceededError) as caught:
        await agent.run("hi", session_id="s", timeout=5)
    assert (
        str(caught.value) == f"Phases did not finish before its deadline, {says} (of 100 at most)"
    )


class HangingOnceStopped(InMemorySessionStore):
    """A store whose appends never end once the run's tool has begun: the stopped run's
    cleanup cannot store its answer to the open call."""

    def __init__(self, began: anyio.Event) -> None:
        super().__init__()
        self.began = began

    async def append(self, session_id: str, messages: Sequence[Message]) -> None:
        if self.began.is_set():
            await anyio.sleep_forever()
        await super().append(session_id, messages)


@pytest.mark.virtual_clock
@pytest.mark.parametrize("streamed", [False, True], ids=["run", "stream"])
async def test_a_deadline_error_says_what_the_run_did_then_not_its_cleanup(
    streamed: bool,
) -> None:
    """A tool running at the deadline is named, not the cleanup's write after it that a
    store could not do within the grace (that write's failure is the cause)."""
    began = anyio.Event()

    class Hanging(Phases):
        @tool
        async def hang(self) -> str:
            """Hang."""
            began.set()
            await anyio.sleep_forever()
            return "never"

    model = ScriptedModel([tool_call_response("hang", {}), text_response("done")])
    store = HangingOnceStopped(began)
    agent = Hanging("", model=model, session_store=store, cleanup_grace=0.1)
    with pytest.raises(DeadlineExceededError) as caught:
        if streamed:
            async with agent.stream("hi", session_id="s", timeout=5) as events:
                async for _ in events:
                    pass
        else:
            await agent.run("hi", session_id="s", timeout=5)
    assert str(caught.value) == (
        "Hanging did not finish before its deadline, running tool 'hang' in turn 1 (of 100 at most)"
    )
    assert "cleanup grace" in str(caught.value.__cause__)


@pytest.mark.virtual_clock
@pytest.mark.parametrize("how", ["swallows", "shields"])
async def test_a_tool_that_held_the_run_past_its_deadline_is_named(how: str) -> None:
    """A tool that swallows its cancellation, or shields its work, returns past the
    deadline: the error names it as what the run was doing then, not the ``after_tool``
    hooks the agent does not have (nothing else was running when the deadline passed)."""

    class Stubborn(Agent):
        @tool
        async def work(self) -> str:
            """Work."""
            if how == "shields":
                with anyio.CancelScope(shield=True):
                    await anyio.sleep(10)
                return "done"
            try:
                await anyio.sleep(10)
            except anyio.get_cancelled_exc_class():
                return "ignored the stop"
            return "done"

    model = ScriptedModel([tool_call_response("work", {}), text_response("done")])
    with pytest.raises(DeadlineExceededError) as caught:
        await Stubborn(model=model).run("hi", timeout=5)
    assert str(caught.value) == (
        "Stubborn did not finish before its deadline, running tool 'work' in turn 1 (of 100 at most)"
    )


@manage_context(context_window_override=100_000)
class ManagedPhases(Phases):
    pass


async def retrieve(agent: Phases, request: ModelRequest, *, context: RunContext) -> None:
    """A retrieval capability's hook, which may hang."""
    await agent._hang("retrieval")


@pytest.mark.virtual_clock
@pytest.mark.parametrize("managed", [False, True], ids=["plain", "managed"])
@pytest.mark.parametrize(
    ("hangs", "says"),
    [
        ("retrieval", "hook 'retrieve' of capability 'retrieval'"),
        ("before_model", "hook 'before'"),
    ],
)
async def test_a_deadline_error_names_the_hook_that_hung_and_its_capability(
    managed: bool, hangs: str, says: str
) -> None:
    """A capability's hook that hangs (a retrieval's) is named with its capability, and
    under @manage_context the class's own hook that hangs is named, not compaction."""

    class Retrieving(ManagedPhases if managed else Phases):
        pass

    add_capability(Retrieving, Capability("retrieval", [CapabilityHook("before_model", retrieve)]))
    agent = Retrieving(hangs, model=ScriptedModel([text_response("done")]))
    with pytest.raises(DeadlineExceededError) as caught:
        await agent.run("hi", timeout=5)
    assert str(caught.value) == (
        f"Retrieving did not finish before its deadline, running the before_model {says} in "
        "turn 1 (of 100 at most)"
    )


@pytest.mark.parametrize("tool_name", ["wait_async", "wait_sync"])
async def test_deadline_during_a_tool(tool_name: str) -> None:
    """A timeout passing while a tool (async, or sync in a thread) runs is prompt."""
    agent = Slow(model=ScriptedModel([tool_call_response(tool_name, {}), text_response("x")]))
    start = anyio.current_time()
    try:
        with pytest.raises(DeadlineExceededError):
            await agent.run("hi", timeout=0.2)
        assert anyio.current_time() - start < 0.2 + LATE
    finally:
        agent.release.set()
        await anyio.sleep(0.05)


@pytest.mark.virtual_clock
async def test_a_retry_wait_past_the_deadline_fails_at_once() -> None:
    """When retry_after would pass the deadline, DeadlineExceededError comes at once."""
    error = RateLimitError("slow down", status=429, retry_after=30)
    model = ScriptedModel([error, text_response("never")])
    start = anyio.current_time()
    with pytest.raises(DeadlineExceededError) as caught:
        await Slow(model=model).run("hi", timeout=10)
    assert anyio.current_time() - start == 0  # at once
    assert caught.value.__cause__ is error
    assert len(model.requests) == 1
    assert str(caught.value) == (  # what a one-line log of it needs to tell the cause
        "the run's deadline leaves no time to retry after RateLimitError (a wait of 30 s, "
        "with 10 s left): slow down"
    )


@pytest.mark.virtual_clock
async def test_a_retry_after_longer_than_any_wait_taken_is_raised_at_once() -> None:
    """A provider that asks for more than 300 s would refuse a retry made sooner: with a
    deadline further off, or none, its error is raised at once, saying why it was not
    retried (an operator wonders why ``max_retries`` did not)."""
    error = RateLimitError("slow down", status=429, retry_after=3_600)
    for timeout in (None, 7_200):
        model = ScriptedModel([error, text_response("never")])
        start = anyio.current_time()
        with pytest.raises(RateLimitError) as caught:
            await Slow(model=model).run("hi", timeout=timeout)
        assert anyio.current_time() - start == 0  # at once
        assert caught.value is error and len(model.requests) == 1
        assert str(error) == (
            "slow down (not retried: it asks for a wait of 3600 s, longer than the 300 s "
            "littleghost waits)"
        )


@pytest.mark.virtual_clock
async def test_a_retry_after_too_long_on_a_later_attempt_says_why_it_ended_the_call() -> None:
    unavailable = ProviderUnavailableError("down", retry_after=0.01)
    limited = RateLimitError("slow down", status=429, retry_after=400.5)
    model = ScriptedModel([unavailable, limited, text_response("never")])
    with pytest.raises(RateLimitError) as caught:
        await Slow(model=model).run("hi")
    assert len(model.requests) == 2
    assert str(caught.value) == (
        "slow down (on attempt 2, not retried: it asks for a wait of 400.5 s, longer than "
        "the 300 s littleghost waits)"
    )


async def test_without_retries_an_error_asking_a_long_wait_is_as_it_is() -> None:
    """With ``max_retries=0`` nothing is retried: the wait is no reason to tell."""
    error = RateLimitError("slow down", status=429, retry_after=3_600)
    with pytest.raises(RateLimitError):
        await Slow(model=ScriptedModel([error]), max_retries=0).run("hi")
    assert str(error) == "slow down"


class Looking(Agent):
    @tool
    async def look(self) -> str:
        """Look."""
        return "seen"


@pytest.mark.virtual_clock
@pytest.mark.parametrize("seed", range(8))
async def test_a_retry_wait_a_slow_consumer_pushed_past_the_deadline_is_not_taken(
    seed: int,
) -> None:
    """The retry's event waits for the stream's consumer, still busy with the event
    before: a wait that no longer fits once it is told fails at once, with the provider
    error as the cause, not at the deadline without it; one that fits is taken."""
    hold = random.Random(seed).uniform(0, 9)  # the consumer's time on a tool's result
    error = RateLimitError("slow down", status=429, retry_after=3)
    model = ScriptedModel([tool_call_response("look", {}), error, text_response("ok")])
    start = anyio.current_time()
    seen: list[type] = []
    caught: DeadlineExceededError | None = None
    try:
        async with Looking(model=model).stream("hi", timeout=10) as events:
            async for event in events:
                seen.append(type(event))
                if isinstance(event, ToolCallFinished):
                    await anyio.sleep(hold)
    except DeadlineExceededError as stopped:
        caught = stopped
    assert ModelCallRetried in seen
    if hold + 3 < 10:
        assert caught is None and events.result.output == "ok"
        assert anyio.current_time() - start == pytest.approx(hold + 3)
    else:
        assert caught is not None and caught.__cause__ is error
        assert anyio.current_time() - start == pytest.approx(hold)  # at once, once told
        assert len(model.requests) == 2


class Digesting(Agent):
    @tool
    async def digest(self, context: RunContext) -> str:
        """Digest the question with the model."""
        answer = await context.complete(ModelRequest([Message.user("digest this")]))
        return answer.message.text


@pytest.mark.virtual_clock
async def test_a_side_calls_retry_past_the_deadline_from_a_tool_ends_the_run() -> None:
    """The run's deadline, not the tool's failure: the run raises at once, as for the
    same side call from a hook, and the tool's call is answered in the log."""
    error = RateLimitError("slow down", status=429, retry_after=30)
    model = ScriptedModel([tool_call_response("digest", {}), error, text_response("never")])
    store = InMemorySessionStore()
    start = anyio.current_time()
    with pytest.raises(DeadlineExceededError) as caught:
        await Digesting(model=model, session_store=store).run("hi", session_id="s", timeout=10)
    assert anyio.current_time() - start == 0  # at once
    assert caught.value.__cause__ is error and caught.value.deadline is not None
    assert [request.purpose for request in model.requests] == ["chat", "chat"]
    (answered,) = [m.tool_results[0] for m in await store.load("s") if m.tool_results]
    assert answered.is_error


class TimedDigesting(Agent):
    @tool(timeout=0.3)
    async def digest(self, context: RunContext) -> str:
        """Digest the question with the model, within 0.3 s."""
        answer = await context.complete(ModelRequest([Message.user("digest this")]))
        return answer.message.text


@pytest.mark.virtual_clock
async def test_a_retry_wait_a_tools_timeout_cuts_first_stops_only_the_tool() -> None:
    """Past the run's deadline or not, a side call's retry wait that the tool's timeout
    ends sooner fails the tool at its timeout; the run goes on."""
    for retry_after in (5, 30):  # within the run's 10 s, and past them
        error = RateLimitError("slow down", status=429, retry_after=retry_after)
        model = ScriptedModel([tool_call_response("digest", {}), error, text_response("done")])
        start = anyio.current_time()
        result = await TimedDigesting(model=model).run("hi", timeout=10)
        assert result.output == "done"
        assert anyio.current_time() - start == pytest.approx(0.3)
        (answered,) = [m.tool_results[0] for m in result.messages if m.tool_results]
        assert answered.is_error and "did not finish within 0.3 s" in answered.content


class Delegating(Agent):
    sub_model: ScriptedModel

    @tool
    async def ask(self) -> str:
        """Ask a sub-agent."""
        return (await Slow(model=self.sub_model).run("?")).output

    @tool(timeout=0.3)
    async def ask_briefly(self) -> str:
        """Ask a sub-agent, within 0.3 s."""
        return (await Slow(model=self.sub_model).run("?")).output


@pytest.mark.virtual_clock
@pytest.mark.parametrize("tool_name", ["ask", "ask_briefly"])
async def test_a_sub_agents_retry_wait_past_the_deadline_of_the_run_it_serves(
    tool_name: str,
) -> None:
    """A wait that would pass the outer run's deadline is not taken: the outer run ends at
    once, as for its own call, with the provider error as the cause; a tool's timeout
    that ends the wait sooner stops only the tool."""
    error = RateLimitError("slow down", status=429, retry_after=30)
    agent = Delegating(
        model=ScriptedModel([tool_call_response(tool_name, {}), text_response("ok")])
    )
    agent.sub_model = ScriptedModel([error, text_response("late")])
    start = anyio.current_time()
    if tool_name == "ask":
        with pytest.raises(DeadlineExceededError) as caught:
            await agent.run("hi", timeout=10)
        assert anyio.current_time() - start == 0  # at once
        assert caught.value.__cause__ is error
    else:
        assert (await agent.run("hi", timeout=10)).output == "ok"
        assert anyio.current_time() - start == pytest.approx(0.3)


class Relaying(Agent):
    sub_model: ScriptedModel

    @tool
    async def relay(self) -> str:
        """Ask an agent that asks a sub-agent."""
        relay = Delegating(
            model=ScriptedModel([tool_call_response("ask", {}), text_response("ok")])
        )
        relay.sub_model = self.sub_model
        return (await relay.run("?")).output


@pytest.mark.virtual_clock
async def test_a_retry_wait_past_the_deadline_of_a_run_two_levels_up() -> None:
    """A run between the two (with no deadline of its own) does not take the error of the
    outer run's deadline for its tool's failure (its model was called again, and the
    outer run went on): the outer run ends at once, the provider error as the cause."""
    error = RateLimitError("slow down", status=429, retry_after=30)
    agent = Relaying(model=ScriptedModel([tool_call_response("relay", {}), text_response("ok")]))
    agent.sub_model = ScriptedModel([error, text_response("late")])
    start = anyio.current_time()
    with pytest.raises(DeadlineExceededError) as caught:
        await agent.run("hi", timeout=10)
    assert anyio.current_time() - start == 0  # at once
    assert caught.value.__cause__ is error


class InOwnLoop(Agent):
    sub_model: ScriptedModel

    @tool
    def ask(self) -> str:
        """Ask a sub-agent in an event loop of its own (trio's clock is offset at random)."""
        sub = Slow(model=self.sub_model)

        async def ask() -> str:
            return (await sub.run("?")).output

        return anyio.run(ask, backend="trio")


async def test_a_run_a_sync_tool_starts_in_a_loop_of_its_own_keeps_its_own_clock() -> None:
    """It found the tool's run in the context its thread was given and took that run's
    deadline, on the other loop's clock, for its own: long past, it refused to retry,
    and the tool's run ended at once with a deadline error 30 s early."""
    agent = InOwnLoop(model=ScriptedModel([tool_call_response("ask", {}), text_response("ok")]))
    agent.sub_model = ScriptedModel(
        [RateLimitError("slow down", status=429, retry_after=0.01), text_response("found")]
    )
    result = await agent.run("hi", timeout=30)
    assert result.output == "ok"
    assert [r.content for m in result.messages for r in m.tool_results] == ["found"]


@pytest.mark.virtual_clock
async def test_a_retry_wait_a_hooks_own_scope_cuts_first_ends_only_that_scope() -> None:
    """A hook that bounds its side call with a scope of its own goes on when the scope
    ends the retry's wait, also when the wait would pass the run's deadline."""

    class Guarded(Agent):
        @before_model
        async def check(self, request: ModelRequest, context: RunContext) -> None:
            with anyio.move_on_after(0.3):  # optional: skipped when it takes longer
                await context.complete(ModelRequest([Message.user("allowed?")]))

    for retry_after in (5, 30):
        error = RateLimitError("slow down", status=429, retry_after=retry_after)
        model = ScriptedModel([error, text_response("done")])
        start = anyio.current_time()
        result = await Guarded(model=model).run("hi", timeout=10)
        assert result.output == "done"
        assert anyio.current_time() - start == pytest.approx(0.3)


@pytest.mark.virtual_clock
async def test_a_callers_earlier_scope_does_not_delay_the_deadline_error() -> None:
    """A caller's scope that ends before the run's deadline does not delay the
    ``DeadlineExceededError`` of a wait past that deadline."""
    error = RateLimitError("slow down", status=429, retry_after=30)
    model = ScriptedModel([error, text_response("never")])
    start = anyio.current_time()
    with anyio.move_on_after(5), pytest.raises(DeadlineExceededError) as caught:
        await Slow(model=model).run("hi", timeout=10)
    assert anyio.current_time() - start == 0  # at once
    assert caught.value.__cause__ is error


class ConnectionClosed(Exception):
    """What some database and HTTP clients raise when a cancellation reaches them."""


async def closed_when_cancelled(grouped: bool = False) -> None:
    """Wait long; a cancellation becomes the client's own error (``grouped``: in a task
    group of the client's own, which raises it in an exception group)."""
    if grouped:
        async with anyio.create_task_group() as group:
            group.start_soon(closed_when_cancelled)
        return
    try:
        await anyio.sleep(30)
    except anyio.get_cancelled_exc_class():
        raise ConnectionClosed("connection closed") from None


class ClosingStore(InMemorySessionStore):
    """A store whose client turns a cancellation into its own error, where ``at`` says."""

    def __init__(self, at: str, grouped: bool = False) -> None:
        super().__init__()
        self.at = at
        self.grouped = grouped

    async def load(self, session_id: str) -> tuple[Message, ...]:
        if self.at == "load":
            await closed_when_cancelled(self.grouped)
        return await super().load(session_id)

    @contextlib.asynccontextmanager
    async def lock(self, session_id: str) -> AsyncIterator[None]:
        if self.at == "lock":
            await closed_when_cancelled(self.grouped)
        yield


def closing_model(grouped: bool) -> Callable[[ModelRequest], Awaitable[ModelResponse]]:
    async def respond(request: ModelRequest) -> ModelResponse:
        await closed_when_cancelled(grouped)
        raise AssertionError("not reached")

    return respond


@pytest.mark.virtual_clock
@pytest.mark.parametrize("grouped", [False, True], ids=["plain", "task group"])
@pytest.mark.parametrize("at", ["model", "load", "lock"])
async def test_a_cancellation_turned_into_a_client_error_at_the_deadline_is_the_deadline(
    at: str, grouped: bool
) -> None:
    """A client that turns the cancellation at the run's deadline into its own error
    ("connection closed", as some database and HTTP clients do; in a task group of its
    own too, which raises it in an exception group) does not hide that the run is past
    its deadline: ``DeadlineExceededError``, that error its cause (the error was raised as
    it was, though appends already gave the deadline error)."""
    model = ScriptedModel([closing_model(grouped) if at == "model" else text_response("hi")])
    agent = Slow(model=model, session_store=ClosingStore(at, grouped))
    with anyio.fail_after(5), pytest.raises(DeadlineExceededError) as caught:
        await agent.run("hi", session_id="s", timeout=0.2)
    cause = caught.value.__cause__
    if grouped:
        (cause,) = getattr(cause, "exceptions", ())  # the client's exception group
    assert isinstance(cause, ConnectionClosed)


@pytest.mark.virtual_clock
@pytest.mark.parametrize("grouped", [False, True], ids=["plain", "task group"])
@pytest.mark.parametrize("at", ["model", "load", "lock"])
async def test_a_callers_cancellation_turned_into_a_client_error_is_the_cancellation(
    at: str, grouped: bool
) -> None:
    """Such an error never replaces the caller's cancellation either: the caller's scope
    catches it (the error escaped the scope, or an exception group did)."""
    model = ScriptedModel([closing_model(grouped) if at == "model" else text_response("hi")])
    agent = Slow(model=model, session_store=ClosingStore(at, grouped))
    with anyio.fail_after(5), anyio.move_on_after(0.2) as scope:
        await agent.run("hi", session_id="s")
    assert scope.cancelled_caught


def recovering() -> tuple[type[Agent], list[BaseException]]:
    """An agent class whose ``after_model_error`` hook retries every error, and the errors
    its hook was given."""
    seen: list[BaseException] = []

    class Recovering(Agent):
        @after_model_error
        def retry(self, request: ModelRequest, error: Exception) -> ModelRequest:
            seen.append(error)
            return attrs.evolve(request)  # another try

    return Recovering, seen


@pytest.mark.virtual_clock
@pytest.mark.parametrize("grouped", [False, True], ids=["plain", "task group"])
@pytest.mark.parametrize("stop", ["caller", "deadline"])
async def test_a_cancellation_turned_into_a_client_error_is_no_error_for_the_hooks(
    stop: str, grouped: bool
) -> None:
    """``after_model_error`` hooks recover from a model's errors: the error a client made
    of the run's stop is none (the run stops; a hook that retried would retry it)."""
    Recovering, seen = recovering()

    model = ScriptedModel([closing_model(grouped), text_response("hi")])
    timeout = 0.2 if stop == "deadline" else None
    with (
        anyio.fail_after(5),
        anyio.move_on_after(0.2 if stop == "caller" else 5),
        contextlib.suppress(DeadlineExceededError),
    ):
        await Recovering(model=model).run("hi", timeout=timeout)
    assert seen == []
    assert len(model.requests) == 1


async def test_a_client_error_not_caused_by_the_deadline_goes_through() -> None:
    """An error of a store's own, raised before the deadline, is raised as it is."""

    class Broken(InMemorySessionStore):
        async def load(self, session_id: str) -> tuple[Message, ...]:
            raise ConnectionClosed("refused")

    with pytest.raises(ConnectionClosed):
        await Slow(model=ScriptedModel([]), session_store=Broken()).run(
            "hi", session_id="s", timeout=5
        )


class DigestingTwice(Agent):
    @tool
    async def digest(self, context: RunContext) -> str:
        """Digest the question twice at once with the model."""

        async def digest_once() -> None:
            await context.complete(ModelRequest([Message.user("digest this")]))

        async with anyio.create_task_group() as group:
            group.start_soon(digest_once)
            group.start_soon(digest_once)
        return "digested"


@pytest.mark.virtual_clock
async def test_a_side_calls_retry_past_the_deadline_from_a_task_group_ends_the_run() -> None:
    """Out of the exception group of the tool's own task group too."""
    error = RateLimitError("slow down", status=429, retry_after=30)

    def answer(request: ModelRequest) -> ModelResponse:
        if request.messages[-1].text == "digest this":
            raise error
        return text_response("never")

    model = ScriptedModel([tool_call_response("digest", {}), answer, answer, answer])
    start = anyio.current_time()
    with pytest.raises(DeadlineExceededError) as caught:
        await DigestingTwice(model=model).run("hi", timeout=10)
    assert anyio.current_time() - start == 0  # at once
    assert caught.value.__cause__ is error and caught.value.deadline is not None


async def _digest_twice(context: RunContext) -> None:
    """Two side calls at once, in a task group of the caller's own."""

    async def digest_once() -> None:
        await context.complete(ModelRequest([Message.user("digest this")]))

    async with anyio.create_task_group() as group:
        group.start_soon(digest_once)
        group.start_soon(digest_once)


class DigestingHooks(Agent):
    """Digests the question in a hook of the kind ``digest_in`` names (or in its
    ``instructions``), in a task group of the hook's own."""

    digest_in = "before_model"

    async def instructions(self, context: RunContext) -> str:
        if self.digest_in == "instructions":
            await _digest_twice(context)
        return "Answer."

    @before_model
    async def digest_request(self, request: ModelRequest, context: RunContext) -> None:
        if self.digest_in == "before_model":
            await _digest_twice(context)

    @before_tool
    async def digest_call(self, call: ToolCall, context: RunContext) -> None:
        if self.digest_in == "before_tool":
            await _digest_twice(context)

    @tool
    def look(self) -> str:
        """Look."""
        return "seen"


@pytest.mark.virtual_clock
@pytest.mark.parametrize("where", ["before_model", "before_tool", "instructions"])
async def test_a_side_calls_retry_past_the_deadline_from_a_hooks_task_group_ends_the_run(
    where: str,
) -> None:
    """The run's own ``DeadlineExceededError`` comes out of a hook's (or callable
    instructions') own task group as itself, not in an exception group."""
    error = RateLimitError("slow down", status=429, retry_after=30)

    def answer(request: ModelRequest) -> ModelResponse:
        if request.messages[-1].text == "digest this":
            raise error
        return tool_call_response("look", {})

    model = ScriptedModel([answer] * 4)
    start = anyio.current_time()
    agent = DigestingHooks(model=model)
    agent.digest_in = where
    with pytest.raises(DeadlineExceededError) as caught:
        await agent.run("hi", timeout=10)
    assert anyio.current_time() - start == 0  # at once
    assert caught.value.__cause__ is error and caught.value.deadline is not None
    assert caught.value.run_usage is not None


async def test_an_outer_cancel_scope_cancels_the_run_natively() -> None:
    """Cancelling the caller's scope propagates native cancellation; nothing is retried."""
    model = ScriptedModel([hang, text_response("never")])
    with anyio.CancelScope() as scope:
        async with anyio.create_task_group() as group:
            group.start_soon(Slow(model=model).run, "hi")
            await anyio.sleep(0.1)
            scope.cancel()
    assert scope.cancelled_caught
    assert len(model.requests) == 1


@pytest.mark.virtual_clock
async def test_an_outer_timeout_is_native_cancellation_not_a_deadline_error() -> None:
    """A caller's move_on_after ends the run by cancellation, even during a retry wait."""
    model = ScriptedModel([RateLimitError("slow down", retry_after=5), text_response("never")])
    with anyio.move_on_after(0.2) as scope:
        await Slow(model=model).run("hi")
    assert scope.cancelled_caught
    assert len(model.requests) == 1


@pytest.mark.virtual_clock
async def test_rate_limit_is_retried_once_after_retry_after(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 429 with retry_after=0.3 then success: one retry, 0.3 s later (no backoff)."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    times: list[float] = []
    model = ScriptedModel(
        [
            timed(times, RateLimitError("slow down", status=429, retry_after=0.3)),
            timed(times, text_response("ok")),
        ]
    )
    result = await Slow(model=model).run("hi")
    assert result.output == "ok"
    assert len(model.requests) == 2
    assert times[1] - times[0] == pytest.approx(0.3)


@pytest.mark.virtual_clock
async def test_provider_unavailable_is_retried() -> None:
    """A 5xx-style ProviderUnavailableError is retried and the run succeeds."""
    model = ScriptedModel([ProviderUnavailableError("down", status=503), text_response("ok")])
    assert (await Slow(model=model).run("hi")).output == "ok"
    assert len(model.requests) == 2


@pytest.mark.parametrize(
    "error",
    [
        InvalidRequestError("bad request", status=400),
        ContextWindowOverflowError("too long", status=400),
        ValueError("a bug"),
    ],
    ids=lambda error: type(error).__name__,
)
async def test_other_errors_are_not_retried(error: Exception) -> None:
    """A 400, an overflow or any other error propagates after a single attempt."""
    model = ScriptedModel([error, text_response("never")])
    with pytest.raises(type(error)) as caught:
        await Slow(model=model).run("hi")
    assert caught.value is error
    assert len(model.requests) == 1


@pytest.mark.virtual_clock
async def test_max_retries_is_respected() -> None:
    """With max_retries=1 a second transient error propagates after two attempts."""
    model = ScriptedModel(
        [
            ProviderUnavailableError("down"),
            ProviderUnavailableError("still down"),
            text_response("x"),
        ]
    )
    with pytest.raises(ProviderUnavailableError) as caught:
        await Slow(model=model, max_retries=1).run("hi")
    assert len(model.requests) == 2
    assert str(caught.value) == "still down (given up after 2 attempts)"


async def test_an_error_ending_a_retried_call_says_it_was_not_retried_itself() -> None:
    """An error not retried after a transient one says on which attempt it came, once
    however often the same exception is raised again."""
    refused = InvalidRequestError("bad request", status=400)
    for _ in range(2):
        model = ScriptedModel([RateLimitError("slow down", retry_after=0.01), refused])
        with pytest.raises(InvalidRequestError) as caught:
            await Slow(model=model).run("hi")
        assert str(caught.value) == "bad request (on attempt 2, not retried)"


async def test_max_retries_zero_never_retries() -> None:
    """With max_retries=0 the first transient error propagates, as it is."""
    model = ScriptedModel([RateLimitError("slow down", retry_after=0.01), text_response("x")])
    with pytest.raises(RateLimitError) as caught:
        await Slow(model=model, max_retries=0).run("hi")
    assert len(model.requests) == 1
    assert str(caught.value) == "slow down"


async def test_a_retry_is_told_its_attempt_number_and_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``on_retry`` gets the number of the attempt that failed and its error, before each
    retry's wait; the answer of the attempt that succeeds is returned."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)  # no backoff: quick
    errors = [ProviderUnavailableError(f"down {n}", retry_after=0.01) for n in (1, 2, 3)]
    plays = iter([*errors, "up"])
    told: list[tuple[int, BaseException]] = []

    async def call() -> str:
        play = next(plays)
        if isinstance(play, Exception):
            raise play
        return play

    async def on_retry(number: int, error: BaseException) -> None:
        told.append((number, error))

    assert await call_with_retries(call, max_retries=3, on_retry=on_retry) == "up"
    assert told == [(1, errors[0]), (2, errors[1]), (3, errors[2])]


@pytest.mark.virtual_clock
async def test_a_retried_call_is_cancelled_natively_and_not_retried_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A cancellation during the retry after a transient error propagates; no third call."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)  # the retry after 0.01 s
    model = ScriptedModel(
        [ProviderUnavailableError("down", retry_after=0.01), hang, text_response("never")]
    )
    with anyio.move_on_after(0.3) as scope:
        await Slow(model=model).run("hi")
    assert scope.cancelled_caught
    assert len(model.requests) == 2


async def test_an_error_not_retried_after_a_retry_is_raised_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A transient error, then one that is never retried: the latter, after two calls."""
    monkeypatch.setattr(random, "uniform", lambda low, high: low)
    error = InvalidRequestError("bad request", status=400)
    model = ScriptedModel(
        [RateLimitError("slow down", retry_after=0.01), error, text_response("never")]
    )
    with pytest.raises(InvalidRequestError) as caught:
        await Slow(model=model).run("hi", timeout=5)
    assert caught.value is error and caught.value.__context__ is None  # not chained on
    assert len(model.requests) == 2


class _Asking(Agent):
    """A nested agent whose model is rate limited past any deadline."""


class Ensemble:
    """A custom model that asks two nested agents at once, in a task group of its own."""

    provider = "ensemble"
    name = "ensemble"
    context_window = None

    async def respond(self, request: ModelRequest) -> ModelResponse:
        limited = RateLimitError("slow down", status=429, retry_after=30)

        async def ask() -> None:
            await _Asking(model=ScriptedModel([limited])).run("which?")

        async with anyio.create_task_group() as group:
            group.start_soon(ask)
            group.start_soon(ask)
        return text_response("never")


@pytest.mark.virtual_clock
async def test_the_runs_deadline_out_of_a_models_task_group_is_no_error_for_the_hooks() -> None:
    """``after_model_error`` hooks recover from a model's errors: the run's own deadline,
    raised by nested runs in the model's own task group, is none (the run stops)."""
    Recovering, seen = recovering()

    start = anyio.current_time()
    with pytest.raises(DeadlineExceededError):
        await Recovering(model=Ensemble()).run("hi", timeout=10)
    assert anyio.current_time() - start == 0  # at once
    assert seen == []


@pytest.mark.parametrize("seed", range(4))
async def test_a_nested_runs_context_deadline_is_the_earliest_that_stops_it(seed: int) -> None:
    """Runs nested from tools, 1 to 3 deep, each with or without a deadline of its own:
    each run's ``context.deadline`` is the earliest deadline of it and the runs it was
    started in (any of them stops it), ``None`` only when none has one; its
    ``DeadlineExceededError`` still names its own."""
    rng = random.Random(seed)
    seen: list[tuple[float | None, float | None]] = []

    class Nested(Agent):
        @tool
        async def deeper(self, context: RunContext, level: int, timeouts: list[float]) -> str:
            """Run the next level (a timeout of 0: none)."""
            effective = anyio.current_effective_deadline()
            seen.append((context.deadline, None if effective == float("inf") else effective))
            if level + 1 < len(timeouts):
                await ask(level + 1, timeouts)
            return "ok"

    async def ask(level: int, timeouts: list[float]) -> None:
        call = tool_call_response("deeper", {"level": level, "timeouts": timeouts})
        model = ScriptedModel([call, text_response("done")])
        await Nested(model=model).run("go", timeout=timeouts[level] or None)

    for _ in range(8):
        await ask(0, [rng.choice([0, 30.0, 60.0, 90.0]) for _ in range(rng.randint(2, 4))])
    assert len(seen) > 8 and any(deadline is None for deadline, _ in seen)
    for deadline, effective in seen:
        assert deadline == effective


async def test_a_nested_runs_deadline_error_names_its_own_deadline() -> None:
    """A run nested in a run of an earlier deadline, stopped by its own shorter one,
    raises a ``DeadlineExceededError`` whose ``deadline`` is its own."""
    deadlines: list[float | None] = []

    class Inner(Agent):
        pass

    class Outer(Agent):
        @tool
        async def ask(self, context: RunContext) -> str:
            """Ask the inner agent."""
            hang = ScriptedModel([lambda request: anyio.sleep_forever()])
            try:
                await Inner(model=hang).run("go", timeout=0.05)
            except DeadlineExceededError as error:
                deadlines.extend((error.deadline, context.deadline))
            return "stopped"

    steps = [tool_call_response("ask", {}), text_response("done")]
    await Outer(model=ScriptedModel(steps)).run("go", timeout=60)
    own, outer = deadlines
    assert own is not None and outer is not None and own < outer - 50


async def test_a_run_a_tool_leaves_to_start_after_it_has_none_of_its_deadline() -> None:
    """A run started in a task a tool left behind (a task group outside its run), once
    that run has ended, is not stopped by its deadline: its ``context.deadline`` is its
    own (``None`` without one)."""
    seen: list[float | None] = []

    async with anyio.create_task_group() as group:

        class FollowUp(Agent):
            @tool
            async def schedule(self, context: RunContext, last: bool) -> str:
                """Schedule the next run."""
                seen.append(context.deadline)
                if not last:
                    group.start_soon(start, True)
                return "scheduled"

        async def start(last: bool) -> None:
            await anyio.sleep(0.001)  # once the run that started it has ended
            steps = [tool_call_response("schedule", {"last": last}), text_response("ok")]
            await FollowUp(model=ScriptedModel(steps)).run("next", timeout=None if last else 60)

        group.start_soon(start, False)
    assert seen[0] is not None and seen[1] is None


async def _stall(request: ModelRequest) -> ModelResponse:
    await anyio.sleep(60)
    return text_response("never")


class AskingElsewhere:
    """A custom model that asks a nested agent under a deadline of its own, once."""

    provider = "delegating"
    name = "delegating"
    context_window = None

    def __init__(self) -> None:
        self.asked = False

    async def respond(self, request: ModelRequest) -> ModelResponse:
        if not self.asked:
            self.asked = True
            await _Asking(model=ScriptedModel([_stall])).run("which?", timeout=1)
        return text_response("asked elsewhere")


@pytest.mark.virtual_clock
async def test_a_nested_runs_own_deadline_out_of_a_model_is_an_error_for_the_hooks() -> None:
    """A nested run's ``DeadlineExceededError`` out of a custom model, its own deadline
    not the run's, is the model's error, which ``after_model_error`` hooks may recover
    from, as they may when the model's task group holds it."""
    Recovering, seen = recovering()
    result = await Recovering(model=AskingElsewhere()).run("hi", timeout=10)
    assert result.output == "asked elsewhere"
    [error] = seen
    assert isinstance(error, DeadlineExceededError)
    assert str(error).startswith("_Asking did not finish before its deadline")
