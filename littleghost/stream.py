"""``agent.stream()``: the run loop (:mod:`littleghost.runner`) with an event sink,
consumed as an async iterator.

The run happens in a task of its own; events reach the consumer through an unbuffered
anyio memory stream, so spans open and close in the run's task and never across a
``yield``. Entering the block waits until the run holds its session and has its log (or
has ended), so that a run of the same session started from the block is refused, never
run first.
Leaving the ``async with`` block early cancels that task: the model call in flight is
cancelled, and the log keeps every completed message (a tool call the stop left without
a result gets an appended error result); ``aclose()`` stops it so inside the block.
An event whose hand-over a cancellation inside the run cut before the consumer took it
(a tool's timeout, as its side call's event went out) goes out before the next one; when
the run fails before its deadline, those of what the log holds (a tool batch's results
stored as it ended) go out before its error.
What the run raised that is not an
``Exception`` (``KeyboardInterrupt``, ``SystemExit``, a stray cancellation) is never
dropped: leaving the block raises it; when the block raises its own exception,
``KeyboardInterrupt`` and ``SystemExit`` still win (the block's exception is their cause),
and a stray cancellation is logged.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, Generic

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from attrs import define

from littleghost.cleanup import cancelled_here, log_unraised
from littleghost.errors import DeadlineExceededError, StreamStateError
from littleghost.events import (
    Event,
    EventOf,
    ModelCallFinished,
    RunFinished,
    ToolCallFinished,
    ToolCallStarted,
)
from littleghost.messages import Message
from littleghost.run import OutputT, RunContext, RunResult
from littleghost.runner import RunPlan, run
from littleghost.sessions.locks import Waiter

if TYPE_CHECKING:
    from littleghost.agent import Agent

__all__ = ["RunStream", "StreamStateError"]

LOGGED_EVENTS = (ModelCallFinished, ToolCallStarted, ToolCallFinished)
"""The events a consumer mirrors the log from: those a failed run could not hand over
(a cancellation cut them, or its tool batch stored its results as it ended) go out
before its error, unless the run's deadline has passed; the others it held (a side
call's, say) do not."""


@define
class _Handed:
    """An event on its way to the consumer; ``taken`` once the consumer has it."""

    event: Event
    taken: bool = False


class RunStream(Generic[OutputT]):
    """The events of one run. Use ``async with agent.stream(...) as events``; its
    ``result`` is typed as ``run()``'s (``RunResult[T]`` with ``output_type=T``)."""

    def __init__(self, agent: Agent, plan: RunPlan) -> None:
        self._agent = agent
        self._plan = plan
        self._context: RunContext | None = None
        self._result: RunResult[OutputT] | None = None
        self._error: BaseException | None = None
        self._raised = False
        self._group: TaskGroup | None = None
        self._receive: MemoryObjectReceiveStream[_Handed] | None = None
        self._unsent: list[Event] = []
        """Events a cancellation cut on their way to the consumer, oldest first."""
        self._left: list[Event] = []
        """The ``LOGGED_EVENTS`` a failed run could not hand over, to go out before its
        error."""
        self._entered = False
        self._exited = False
        self._waiter: Waiter | None = None
        self._held: anyio.Event | None = None
        self._host: int | None = None
        """The task that entered the block."""
        self._stop: anyio.CancelScope | None = None
        """Around the run's task, for a block left from another task."""
        self._ended: anyio.Event | None = None

    @property
    def messages(self) -> tuple[Message, ...]:
        """The conversation log so far (the history before the run starts)."""
        if self._context is not None:
            return self._context.messages
        return tuple(self._plan.seed)

    @property
    def result(self) -> RunResult[OutputT]:
        """The run's result, once it has completed."""
        if self._result is None:
            state = "failed" if self._error is not None else "not completed"
            raise StreamStateError(
                f"the run has {state}: events.result is there only after a completed run"
            )
        return self._result

    async def __aenter__(self) -> RunStream[OutputT]:
        if self._entered:
            raise StreamStateError("a stream can be entered once; call agent.stream() again")
        self._entered = True
        self._host = anyio.get_current_task().id
        self._stop, self._ended = anyio.CancelScope(), anyio.Event()  # in the entering loop
        send, self._receive = anyio.create_memory_object_stream[_Handed](0)
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._waiter = Waiter(self._plan.session_id)  # the block waits on the run
        self._held = held = anyio.Event()
        self._group.start_soon(self._drive, send)
        try:
            await held.wait()
        except BaseException as error:
            await self.__aexit__(type(error), error, error.__traceback__)
            raise
        return self

    async def _drive(self, send: MemoryObjectSendStream[_Handed]) -> None:
        def observe(context: RunContext) -> None:
            self._context = context

        assert self._stop is not None and self._ended is not None
        try:
            with self._stop:
                await self._run(send, observe)
        finally:
            self._ended.set()

    async def _run(
        self, send: MemoryObjectSendStream[_Handed], observe: Callable[[RunContext], None]
    ) -> None:
        async def sink(event: Event) -> None:
            await self._hand_over(send, event)

        async with send:
            assert self._waiter is not None and self._held is not None
            try:
                with self._waiter.running():
                    result = await run(
                        self._agent,
                        self._plan,
                        sink=sink,
                        observe=observe,
                        held=self._held.set,
                    )
            except BaseException as error:
                stopped = cancelled_here()
                if stopped and isinstance(error, anyio.get_cancelled_exc_class()):
                    raise  # the consumer left or was cancelled: the task group's to catch
                # Handed to the consumer, not to the task group (which would drop a stray
                # cancellation, and wrap anything else in an exception group).
                self._error = error
                held = [] if self._context is None else self._context._held
                self._left = [e for e in [*self._unsent, *held] if isinstance(e, LOGGED_EVENTS)]
                return
            finally:
                self._held.set()  # ended before it held its session: the block goes on
            self._result = result
            await self._hand_over(send, RunFinished(result))

    async def _hand_over(self, send: MemoryObjectSendStream[_Handed], event: Event) -> None:
        """Hand ``event`` to the consumer, after those a cancellation cut on their way: a
        cancellation inside the run (a tool's timeout, a hook's own scope) may land as
        an event goes out, and the run goes on; the event then goes out before the next
        one, neither lost (its usage counted, say) nor sent twice. Tasks of the run (its
        tool calls) hand theirs over concurrently."""
        try:
            while self._unsent:
                await self._send(send, self._unsent.pop(0))
        except BaseException:
            self._unsent.append(event)  # after them, next time
            raise
        await self._send(send, event)

    async def _send(self, send: MemoryObjectSendStream[_Handed], event: Event) -> None:
        handed = _Handed(event)
        try:
            await send.send(handed)
        except BaseException:
            if not handed.taken:  # else the consumer took it as the cancellation came
                self._unsent.insert(0, event)
            raise

    async def aclose(self) -> None:
        """Stop the run now, as leaving the block early does, and wait until it has
        stopped (its log then answers every call); the loop then ends. Another task's
        call as the block is being left waits so too. Before the block nothing happens,
        so ``contextlib.aclosing()`` around ``agent.stream()`` lets its
        ``StreamStateError`` through; after it, the run has stopped."""
        if not self._entered:
            return
        assert self._stop is not None and self._ended is not None
        self._stop.cancel()
        await self._ended.wait()

    def _past_deadline(self) -> bool:
        """Whether the run's own deadline has passed (or ended it): then only its error
        comes, the consumer's dwell on what the log holds would stretch the deadline."""
        if isinstance(self._error, DeadlineExceededError):
            return True
        return self._context is not None and self._context._past_deadline()

    def __aiter__(self) -> RunStream[OutputT]:
        return self

    async def __anext__(self) -> EventOf[OutputT]:
        if self._receive is None or self._exited:
            raise StreamStateError("iterate inside `async with agent.stream(...) as events`")
        try:
            handed = await self._receive.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            pass
        else:
            handed.taken = True
            return handed.event
        if self._error is not None and self._left and not self._past_deadline():
            return self._left.pop(0)  # what the log holds, before the error
        if self._error is not None:
            self._raised = True
            if isinstance(self._error, StopAsyncIteration):  # it would end the loop quietly
                raise RuntimeError("the run raised StopAsyncIteration") from self._error
            raise self._error  # as run() would raise it, causes kept
        raise StopAsyncIteration

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None:
        assert self._group is not None and self._receive is not None
        self._exited = True
        if anyio.get_current_task().id != self._host:
            # The task group cannot be left from here: the run is stopped and waited for.
            assert self._stop is not None and self._ended is not None
            self._stop.cancel()
            self._receive.close()
            await self._ended.wait()
            left = StreamStateError(
                "the block of agent.stream() was left from another task than the one that "
                "entered it (an async generator around it, left suspended by the task "
                "iterating it and closed later: by the garbage collector, say, when a web "
                "framework's streaming response stopped iterating it); the run was stopped. "
                "Close such a generator in the task that iterates it "
                "(contextlib.aclosing), or enter the block in the task that sends its events"
            )
            self._pass_on_unraised(left)
            raise left
        self._group.cancel_scope.cancel()  # first: a send in flight is cancelled, not broken
        self._receive.close()
        # The consumer's own exception is not handed to the task group, so it propagates
        # as it is, never wrapped in an exception group.
        try:
            await self._group.__aexit__(None, None, None)
        finally:
            assert self._waiter is not None
            self._waiter.end()
        self._pass_on_unraised(error)
        return None

    def _pass_on_unraised(self, error: BaseException | None) -> None:
        """Raise what the run raised that is not an ``Exception`` (``KeyboardInterrupt``,
        ``SystemExit`` or a stray cancellation; its ordinary error is dropped on leaving
        early): never dropped, and the first two win over the block's own exception
        ``error`` (which becomes their cause)."""
        unraised = None if self._raised else self._error
        if unraised is None or isinstance(unraised, Exception):
            return
        if error is None:
            raise unraised
        if isinstance(unraised, (KeyboardInterrupt, SystemExit)):
            raise unraised from error
        log_unraised("the streamed run", unraised, error)
