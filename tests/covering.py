"""Covering sets for combination tests: every pair of values of two dimensions in at
least one combination, with far fewer combinations than the full product."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

Pair = tuple[tuple[str, Any], tuple[str, Any]]
Allowed = Callable[[Mapping[str, Any]], bool]
"""Whether a partial combination (some dimensions' values) can be part of a run."""


def pairs_of(combo: Mapping[str, Any]) -> Iterator[Pair]:
    """The pairs of values of two dimensions ``combo`` holds, dimensions in name order."""
    for a, b in itertools.combinations(sorted(combo), 2):
        yield (a, combo[a]), (b, combo[b])


def _pair(a: str, va: Any, b: str, vb: Any) -> Pair:
    """The pair of ``a``'s value ``va`` and ``b``'s ``vb``, dimensions in name order."""
    return ((a, va), (b, vb)) if a < b else ((b, vb), (a, va))


def wanted_pairs(dimensions: Mapping[str, Sequence[Any]], allowed: Allowed) -> set[Pair]:
    """Every pair of values of two ``dimensions`` that ``allowed`` admits."""
    return {
        pair
        for a, b in itertools.combinations(sorted(dimensions), 2)
        for va in dimensions[a]
        for vb in dimensions[b]
        if allowed({a: va, b: vb})
        for pair in pairs_of({a: va, b: vb})
    }


def covering(
    dimensions: Mapping[str, Sequence[Any]], allowed: Allowed, seed: int, *, tries: int = 30
) -> list[dict[str, Any]]:
    """Combinations of ``dimensions`` (each ``allowed``) holding every pair of
    ``wanted_pairs``, drawn greedily as AETG does: each starts from a pair not yet held and
    takes, one dimension at a time in a random order, the allowed value that holds most new
    pairs; the best of ``tries`` candidates is kept. Seeded: the same set every time."""
    rng = random.Random(seed)
    names = sorted(dimensions)
    wanted = wanted_pairs(dimensions, allowed)
    chosen: list[dict[str, Any]] = []
    while wanted:
        start = sorted(wanted, key=repr)[rng.randrange(len(wanted))]
        best: tuple[int, dict[str, Any]] | None = None
        for _ in range(tries):
            combo = dict(start)
            rest = [name for name in names if name not in combo]
            rng.shuffle(rest)
            for name in rest:
                scored = [
                    (
                        sum(_pair(name, value, other, combo[other]) in wanted for other in combo),
                        rng.random(),
                        value,
                    )
                    for value in dimensions[name]
                    if allowed({**combo, name: value})
                ]
                combo[name] = max(scored, key=lambda score: score[:2])[2]
            gain = sum(pair in wanted for pair in pairs_of(combo))
            if best is None or gain > best[0]:
                best = (gain, combo)
        assert best is not None
        chosen.append(best[1])
        wanted -= set(pairs_of(best[1]))
    return chosen
