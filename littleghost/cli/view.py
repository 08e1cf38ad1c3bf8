"""``sessions view``: the messages the model would see next, with their token estimates,
the window, the threshold and the budget's figures."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from attrs import asdict

from littleghost.agent import Agent
from littleghost.capabilities import hook_plan
from littleghost.cli.agents import agent_spec
from littleghost.cli.log import EXCERPT_CHARS, arguments_json, reasoning_label, tool_name
from littleghost.cli.output import SHORT_ID, Output, excerpt, quoted, shell_word, shown
from littleghost.cli.window import Window, run_model
from littleghost.context.budget import EXCERPTS_KEY, MEMORIES_KEY
from littleghost.context.config import ContextManagement, context_config
from littleghost.context.outside import preview_request
from littleghost.context.view import build_view, interrupted_results
from littleghost.errors import PromptBudgetError
from littleghost.messages import Message
from littleghost.models import Model, ModelRequest, OutputSchema, anthropic
from littleghost.models.registry import split_model_string
from littleghost.output import OutputPlan, OutputType, plan_output
from littleghost.runner import instructions_message
from littleghost.sessions import StoredMessage, encode_message
from littleghost.sessions.base import distinct_ids

__all__ = ["print_view", "view_document"]

_SCHEMA_PROVIDERS: dict[str, Callable[[OutputSchema], str | None] | None] = {
    "openai": None,
    "anthropic": anthropic.schema_problem,
    "local": None,
}
"""The built-in providers, each with the check of what schemas its models cannot take
natively (``None``: they take every schema)."""


def _own_before_model_hooks(agent: Agent) -> list[str]:
    """The names of ``agent``'s ``before_model`` hooks besides ``@manage_context``'s
    (hook methods not turned off, and other capabilities')."""
    return [
        entry.method or entry.key[1]
        for entry in hook_plan(type(agent))
        if entry.kind == "before_model"
        and entry.key != ("capability", "manage_context")
        and (entry.method is None or getattr(agent, entry.method) is not None)
    ]


def view_document(
    session_id: str,
    log: Sequence[StoredMessage],
    agent: Agent | None,
    window: Window,
    next_message: str | None,
    model: str | Model | None = None,
) -> dict[str, Any]:
    """What the next run's first model call would send, as the run builds it (before the
    class's own hooks): the instructions, the view of the log (with the results a run
    adds for calls left open, and ``next_message``), clipped and bounded by
    ``@manage_context``; without an agent, a default ``@manage_context`` on the log alone.
    ``model`` is the model a run would use (by default ``run_model(agent)``'s)."""
    declared = run_model(agent) if model is None else model
    logged = distinct_ids(
        [entry.message for entry in log], f"session {shell_word(session_id, in_prose=True)}"
    )
    repairs = interrupted_results(logged)
    pending = [*logged, *repairs]
    if next_message is not None:
        pending.append(Message.user(next_message))
    notes = []
    instructions: Any = getattr(agent, "instructions", None)
    if callable(instructions):
        notes.append("the instructions are a callable, made for each run: not shown")
        instructions = None
    view = build_view(pending)
    messages = (instructions_message(instructions), *view) if instructions else view
    request = ModelRequest(
        messages, () if agent is None else agent.tool_specs, {} if agent is None else agent.settings
    )
    config = ContextManagement() if agent is None else context_config(agent)
    if config is None:
        notes.append("the class has no @manage_context: nothing is clipped, bounded or compacted")
    elif config.budget is not None and config.budget.memory is not None:
        notes.append("the budget's memories are not loaded: a memory provider needs a run")
    if agent is not None and (hooks := _own_before_model_hooks(agent)):
        notes.append(
            f"the class's before_model hooks ({', '.join(hooks)}) change the request in a "
            "run only: what they do is not shown"
        )
    if agent is not None and agent.output is not None:
        plan, assumed = _output_plan(agent, agent.output, declared)
        request = plan.request(request)  # as the run asks for it, before the hooks
        if assumed:
            notes.append(
                "the class's output_type is asked for with the final_result tool, as for a "
                "model that takes no output schema: which one it takes is not known "
                "without making the model"
            )
    limit = Agent.max_tool_result_tokens if agent is None else agent.max_tool_result_tokens
    try:
        preview = preview_request(
            request,
            pending,
            config,
            window.tokens,
            max_tool_result_tokens=limit,
            model=declared if isinstance(declared, Model) else None,
        )
    except PromptBudgetError as error:  # what the view assumed may be why
        if not notes:
            raise
        raise PromptBudgetError(
            f"{error} ({'; '.join(notes)})", limit=error.limit, required=error.required
        ) from error
    stored = {message.id: message for message in pending}
    origins = {message.id: "repair" for message in repairs}
    if next_message is not None:
        origins[pending[-1].id] = "next"
    if instructions:
        origins[messages[0].id] = "instructions"
    shown = []
    for message, tokens in zip(preview.request.messages, preview.message_tokens, strict=True):
        made = message.metadata.get(EXCERPTS_KEY) or message.metadata.get(MEMORIES_KEY)
        origin = "view" if made else origins.get(message.id, "log")
        cut = origin in ("log", "repair", "next") and message != stored.get(message.id)
        shown.append(
            {"origin": origin, "cut": cut, "tokens": tokens, "message": encode_message(message)}
        )
    answer = preview.request.max_tokens or 0
    in_messages = sum(preview.message_tokens)
    hooked = preview.hooked_tokens
    calibration = preview.estimated_tokens - in_messages - preview.schema_tokens - answer - hooked
    threshold = None
    if preview.threshold_tokens is not None and config is not None:
        threshold = {"share": config.compression_threshold, "tokens": preview.threshold_tokens}
    return {
        "session": session_id,
        "agent": None if agent is None else agent_spec(agent),
        "window": asdict(window),
        "messages": shown,
        "message_tokens": in_messages,
        "tools_and_settings_tokens": preview.schema_tokens,
        "answer_tokens": answer,
        "calibration_tokens": calibration,
        "hooks_tokens": hooked,
        "estimated_tokens": preview.estimated_tokens,
        "threshold": threshold,
        "waits_until": preview.waits_until,
        "compaction_due": preview.compaction_due,
        "budget": None if preview.budget is None else asdict(preview.budget),
        "notes": notes,
    }


def _output_plan(
    agent: Agent, output: OutputType, declared: str | Model | None
) -> tuple[OutputPlan, bool]:
    """How the next run asks for ``output`` (as ``plan_output`` decides) of ``declared``,
    the model it would use (``run_model``), without making one of a model string: a
    model string of a built-in provider takes an output schema its provider takes
    natively; for any other string (or none), the final-result tool is assumed
    (``True``)."""
    strategy = agent.output_strategy
    if isinstance(declared, Model):
        plan = plan_output(output, strategy, declared)
        assert plan is not None  # there is an output
        return plan, False
    if strategy != "auto":
        return OutputPlan(output, strategy == "native"), False
    provider = None if declared is None else split_model_string(declared)[0]
    if provider in _SCHEMA_PROVIDERS:
        check = _SCHEMA_PROVIDERS[provider]
        return OutputPlan(output, check is None or check(output.schema) is None), False
    return OutputPlan(output, False), True


def print_view(output: Output, document: dict[str, Any]) -> None:
    """The view as a table (or plain lines), then its figures."""
    window = document["window"]
    who = document["agent"] or "an agent with the default @manage_context"
    session = shell_word(document["session"], in_prose=True)
    output.line(f"session {session}, as {shown(who)} would send it next")
    output.line(f"window: {window['tokens']} tokens ({shown(window['source'])})")
    rows = []
    for entry in document["messages"]:
        message = entry["message"]
        origin = entry["origin"] + (", cut" if entry["cut"] else "")
        text = " ".join(_part_text(part) for part in message["content"])
        rows.append(
            [
                message["role"],
                origin,
                str(entry["tokens"]),
                message["id"],
                excerpt(text, EXCERPT_CHARS),
            ]
        )
    output.table(["ROLE", "FROM", "TOKENS", "ID", "CONTENT"], rows, narrow={3: SHORT_ID})
    calibration = document["calibration_tokens"]
    sign = "-" if calibration < 0 else "+"
    calibrated = f" {sign} {abs(calibration)} (calibration)" if calibration else ""
    if document["hooks_tokens"]:
        calibrated += f" + {document['hooks_tokens']} (the class's own hooks, last calls)"
    output.line(
        f"estimate: {document['message_tokens']} (messages) + "
        f"{document['tools_and_settings_tokens']} (tools and settings) + "
        f"{document['answer_tokens']} (answer){calibrated} = "
        f"{document['estimated_tokens']} tokens"
    )
    output.line(_threshold_line(output, document))
    budget = document["budget"]
    if budget is not None:
        output.line(
            f"budget: limit {budget['limit_tokens']} tokens; kept {budget['messages_kept']} of "
            f"{budget['messages_total']} messages; dropped {budget['turns_dropped']} of "
            f"{budget['turns_total']} turns; {budget['excerpts_included']} excerpts, "
            f"{budget['memories_included']} memories; fixed overhead "
            f"{budget['fixed_overhead_tokens']}, prompt {budget['estimated_prompt_tokens']} tokens"
        )
    for note in document["notes"]:
        output.line(output.style(f"note: {shown(note)}", dim=True))


def _threshold_line(output: Output, document: dict[str, Any]) -> str:
    threshold = document["threshold"]
    if threshold is None:
        return "threshold: none (this configuration never compacts with a model)"
    share, tokens = threshold["share"], threshold["tokens"]
    start = f"threshold: {share} of the window = {tokens} tokens: "
    estimated, waits = document["estimated_tokens"], document["waits_until"]
    if document["compaction_due"]:
        return start + output.style(
            "reached, the next model call tries to compact first", fg="yellow", bold=True
        )
    counted = any(message["origin"] == "next" for message in document["messages"])
    unsaid = "" if counted else ", the next message not counted (--message counts it)"
    if waits is None:
        return start + f"{tokens - estimated} tokens to go{unsaid}"
    waiting = f"no summary until the estimate reaches {waits} tokens"
    if estimated >= tokens:
        return (
            start + f"reached, but the last compaction left the request near or over it: {waiting}"
        )
    return start + (
        f"the last compaction left the request near it: {waiting}, "
        f"{waits - estimated} tokens to go{unsaid}"
    )


def _part_text(part: dict[str, Any]) -> str:
    """A part as the table shows it: its text quoted (``quoted``), what it is bare."""
    kind = part["type"]
    if kind == "text":
        return quoted(excerpt(part["text"], EXCERPT_CHARS))
    if kind == "tool_call":
        return f"call {tool_name(part['name'])}({excerpt(arguments_json(part['arguments']), 80)})"
    if kind == "tool_result":
        return f"result: {quoted(excerpt(part['content'], EXCERPT_CHARS))}"
    if kind == "reasoning":
        if part["redacted"]:
            return reasoning_label("", redacted=True)
        return f"reasoning: {quoted(excerpt(part['text'], EXCERPT_CHARS))}"
    return "[image]"
