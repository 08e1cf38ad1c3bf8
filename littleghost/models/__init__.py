"""The model protocol, its values, and model strings."""

from littleghost.models.base import (
    Model,
    ModelRequest,
    ModelResponse,
    OutputSchema,
    StopReason,
    ToolSpec,
    Usage,
    report_usage,
)
from littleghost.models.registry import register_provider, resolve

__all__ = [
    "Model",
    "ModelRequest",
    "ModelResponse",
    "OutputSchema",
    "StopReason",
    "ToolSpec",
    "Usage",
    "register_provider",
    "report_usage",
    "resolve",
]
