"""A chat-completions request as OpenAI's input-token count request (``POST
/v1/responses/input_tokens``, which takes the Responses API's shapes)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["count_request"]

_PASSED = ("model", "tools", "tool_choice", "parallel_tool_calls")
"""Parameters that reach the prompt, under the same name in both APIs."""


def count_request(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The count request for a chat-completions body (``extra_body``'s keys beside the
    others): the messages as input items, the tools, tool choice, answer format, verbosity
    and reasoning effort (what reaches the prompt)."""
    body: dict[str, Any] = {key: settings[key] for key in _PASSED if settings.get(key) is not None}
    body["input"] = [item for entry in settings["messages"] for item in _items(entry)]
    if "tools" in body:
        body["tools"] = [_tool(tool) for tool in body["tools"]]
    if isinstance(choice := body.get("tool_choice"), Mapping):
        choice = _flat(choice)
        if isinstance(choice.get("tools"), list):
            choice["tools"] = [_flat(tool) for tool in choice["tools"]]
        body["tool_choice"] = choice
    text: dict[str, Any] = {}
    if isinstance(answer := settings.get("response_format"), Mapping):
        text["format"] = _flat(answer)
    if settings.get("verbosity") is not None:
        text["verbosity"] = settings["verbosity"]
    if text:
        body["text"] = text
    if settings.get("reasoning_effort") is not None:
        body["reasoning"] = {"effort": settings["reasoning_effort"]}
    return body


def _flat(value: Mapping[str, Any]) -> dict[str, Any]:
    """A chat-completions object whose details are nested under its type (``{"type":
    "function", "function": {...}}``) as the Responses API has it, with the details beside
    the type."""
    key = value.get("type")
    inner = value.get(key) if isinstance(key, str) else None
    if not isinstance(inner, Mapping):
        return dict(value)
    return {**{k: v for k, v in value.items() if k != key}, **inner}


def _items(entry: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The input items for one chat message (an empty one too: its role's tokens count)."""
    role = entry["role"]
    if role == "tool":
        yield {
            "type": "function_call_output",
            "call_id": entry["tool_call_id"],
            "output": entry["content"],
        }
        return
    content = entry.get("content")
    if isinstance(content, list):
        yield {"role": role, "content": [_part(part) for part in content]}
    elif content is not None:
        yield {"role": role, "content": content}
    for call in entry.get("tool_calls") or ():
        function = call["function"]
        yield {
            "type": "function_call",
            "call_id": call["id"],
            "name": function["name"],
            "arguments": function["arguments"],
        }


def _part(part: Mapping[str, Any]) -> dict[str, Any]:
    """A user message's content part: text, or an image by URL or data URL."""
    if part.get("type") == "image_url":
        return {"type": "input_image", "image_url": part["image_url"]["url"], "detail": "auto"}
    return {"type": "input_text", "text": part.get("text", "")}


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    """A tool, its details beside its type; a function tool is not strict, as in chat
    completions (the Responses API's default is strict)."""
    flat = _flat(tool)
    return {"strict": False, **flat} if flat.get("type") == "function" else flat
