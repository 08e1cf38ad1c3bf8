"""A long-lived service's requests, one at a time: a fresh agent's runs on a session id
not used before, in one of ``KINDS`` of ways (answered with a tool call, compacted,
streamed, a stream left at its first event, cancelled, timed out, ``run_sync`` from a
thread), then the session deleted. ``tests/test_growth.py`` checks that nothing of one
is kept once it ended; ``benchmarks/growth.py`` measures memory over many."""

from __future__ import annotations

import threading
import weakref
from typing import Any

import anyio

from littleghost import Agent, manage_context, tool
from littleghost.errors import UnknownSessionError
from littleghost.models import ModelRequest, ModelResponse
from littleghost.sessions import SessionStore
from littleghost.testing import ScriptedModel, text_response, tool_call_response

KINDS = ("tool", "managed", "stream", "stream_left", "cancelled", "timeout", "thread")


def answering(request: ModelRequest) -> ModelResponse:
    if request.purpose != "chat":
        return text_response("summary of the earlier talk")
    return text_response("an answer " * 100)


async def stalled(request: ModelRequest) -> ModelResponse:
    await anyio.sleep(3600)
    raise AssertionError("not reached")


def script(kind: str, answered: list[weakref.ref[Any]]) -> list[Any]:
    """The model's steps for a request of ``kind``; each answer's weak reference goes to
    ``answered``."""
    if kind in ("cancelled", "timeout"):
        return [stalled] * 2
    if kind == "tool":
        steps = [tool_call_response("lookup", {"order": "42"}), text_response("done")] * 2
        answered.extend(map(weakref.ref, steps))
        return steps

    def respond(request: ModelRequest) -> ModelResponse:
        response = answering(request)
        answered.append(weakref.ref(response))
        return response

    return [respond] * 6


class Support(Agent):
    instructions = "You help customers."

    @tool
    async def lookup(self, order: str) -> str:
        """Find an order."""
        return f"order {order}: shipped"


@manage_context(preserve_recent_messages=2)
class Managed(Support):
    pass


def in_thread(agent: Agent, question: str, session_id: str) -> None:
    failed: list[BaseException] = []

    def run() -> None:
        try:
            agent.run_sync(question, session_id=session_id)
        except BaseException as error:  # raised in the caller's thread below
            failed.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]


def tenant_agent(tenant: int, kind: str) -> type[Support]:
    """A chat service's agent class for ``tenant`` (made as its first request comes), of
    ``Managed`` for a request of kind ``managed``, else of ``Support``."""
    base = Managed if kind == "managed" else Support
    return type(f"Tenant{tenant}", (base,), {"instructions": f"You help tenant {tenant}."})


async def serve(
    kind: str, store: SessionStore, session_id: str, agent_class: type[Support] | None = None
) -> list[weakref.ref[Any]]:
    """One request: a fresh agent (of ``agent_class``, else ``Managed`` or ``Support``)
    runs on ``session_id``, then the session deleted; weak references to the agent, its
    model and each message the model answered."""
    answered: list[weakref.ref[Any]] = []
    model = ScriptedModel(script(kind, answered), context_window=300)
    if agent_class is None:
        agent_class = Managed if kind == "managed" else Support
    agent = agent_class(model=model, session_store=store)
    questions = ["Where is order 42?", "And order 43?", "And order 44?"]
    for question in questions if kind == "managed" else questions[:2]:
        if kind in ("stream", "stream_left"):
            async with agent.stream(question, session_id=session_id) as events:
                async for _ in events:
                    if kind == "stream_left":
                        break
        elif kind == "cancelled":
            with anyio.move_on_after(0.01):
                await agent.run(question, session_id=session_id)
        elif kind == "timeout":
            try:
                await agent.run(question, session_id=session_id, timeout=0.01)
            except TimeoutError:
                pass
            else:
                raise AssertionError("the run did not time out")
        elif kind == "thread":
            await anyio.to_thread.run_sync(in_thread, agent, question, session_id)
        else:
            await agent.run(question, session_id=session_id)
    try:
        await store.delete(session_id)
    except UnknownSessionError:  # a cancelled or timed-out run stored nothing
        assert kind in ("cancelled", "timeout")
    if kind == "managed":  # the second and third runs' requests are over the window
        assert [request.purpose for request in model.requests].count("context_compaction") == 2
    return [weakref.ref(agent), weakref.ref(model), *answered]
