"""Tools whose ``RunContext`` annotation exists only for type checkers.

``RunContext`` is imported under ``TYPE_CHECKING`` here, so at run time the annotation is
text that cannot be resolved: littleghost reads ``RunContext`` and ``x.RunContext`` as the
run's context all the same.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import littleghost.run
    from littleghost import RunContext


def by_name(query: str, ctx: RunContext) -> str:
    """Answer, knowing the run."""
    return f"{query} on turn {ctx.turn}"


def by_dotted_name(run: littleghost.run.RunContext, query: str) -> str:
    """Answer, knowing the run."""
    return f"{query} on turn {run.turn}"


def with_unknown_type(query: str, extra: Unknown) -> str:  # type: ignore[name-defined]  # noqa: F821
    """Takes a type that is nowhere defined."""
    return query


@dataclasses.dataclass
class Unresolved:
    """A record whose field's type is nowhere defined."""

    extra: Unknown  # type: ignore[name-defined]  # noqa: F821


def with_unresolved_record(query: str, record: Unresolved) -> str:
    """Takes a record whose field's type is nowhere defined."""
    return query


def maybe_in_a_run(query: str, ctx: RunContext | None = None) -> str:
    """Answer, in a run or not."""
    return query
