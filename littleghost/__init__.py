"""littleghost: declare LLM agents as classes; keep long conversations inside the window."""

from littleghost._version import __version__
from littleghost.agent import Agent
from littleghost.context.management import manage_context
from littleghost.hooks import after_model, after_model_error, after_tool, before_model, before_tool
from littleghost.messages import (
    ImagePart,
    Message,
    ReasoningPart,
    Role,
    TextPart,
    ToolCall,
    ToolResult,
)
from littleghost.models.base import Usage
from littleghost.run import RunContext, RunResult
from littleghost.tools import tool

__all__ = [
    "Agent",
    "ImagePart",
    "Message",
    "ReasoningPart",
    "Role",
    "RunContext",
    "RunResult",
    "TextPart",
    "ToolCall",
    "ToolResult",
    "Usage",
    "__version__",
    "after_model",
    "after_model_error",
    "after_tool",
    "before_model",
    "before_tool",
    "manage_context",
    "tool",
]
