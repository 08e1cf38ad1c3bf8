"""Keeping conversations inside the context window: token estimates, message groups,
triggers, compaction strategies and the view of an append-only log."""

from littleghost.context.budget import PromptBudget
from littleghost.context.compaction import apply_compaction, compact_session, compaction_records
from littleghost.context.groups import GroupKind, MessageGroup, group_messages
from littleghost.context.index import forget_recent_logs
from littleghost.context.strategies import (
    CompactionState,
    CompactionStrategy,
    Pipeline,
    SelectiveToolCallCompaction,
    SlidingWindow,
    Summarization,
    TokenBudget,
    ToolResultCompaction,
    Truncation,
    TurnExcerpts,
)
from littleghost.context.tokens import ByteEstimator, CharacterEstimator, Tokenizer
from littleghost.context.triggers import (
    Metrics,
    Trigger,
    all_of,
    always,
    any_of,
    groups_exceed,
    has_tool_calls,
    messages_exceed,
    never,
    tokens_exceed,
    turns_exceed,
)
from littleghost.context.view import build_view

__all__ = [
    "ByteEstimator",
    "CharacterEstimator",
    "CompactionState",
    "CompactionStrategy",
    "GroupKind",
    "MessageGroup",
    "Metrics",
    "Pipeline",
    "PromptBudget",
    "SelectiveToolCallCompaction",
    "SlidingWindow",
    "Summarization",
    "TokenBudget",
    "Tokenizer",
    "ToolResultCompaction",
    "Trigger",
    "Truncation",
    "TurnExcerpts",
    "all_of",
    "always",
    "any_of",
    "apply_compaction",
    "build_view",
    "compact_session",
    "compaction_records",
    "forget_recent_logs",
    "group_messages",
    "groups_exceed",
    "has_tool_calls",
    "messages_exceed",
    "never",
    "tokens_exceed",
    "turns_exceed",
]
