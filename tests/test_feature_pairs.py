"""Features that each work alone, run together: the covering set of
``tests/feature_pairs.py`` (every pair of values of two dimensions), each combination
through ``run()``, ``stream()`` and ``run_sync()``, holding the invariants its docstring
lists."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from tests.conftest import Spans
from tests.covering import pairs_of, wanted_pairs
from tests.feature_pairs import DENSE, DIMENSIONS, allowed, combinations, problems

COMBINATIONS = combinations()


def test_the_set_holds_every_allowed_pair_in_few_combinations() -> None:
    held = {pair for combo in COMBINATIONS for pair in pairs_of(combo)}
    assert wanted_pairs(DIMENSIONS, allowed) <= held
    assert all(allowed(combo) and combo.keys() == DIMENSIONS.keys() for combo in COMBINATIONS)
    largest = sorted(map(len, DIMENSIONS.values()))[-2:]
    assert len(COMBINATIONS) <= 1.2 * largest[0] * largest[1]  # the least any set can have


def test_every_combination_keeps_the_invariants(tmp_path: Path, spans: Spans) -> None:
    found = {}
    seen: Counter[str] = Counter()
    for number, combo in enumerate(COMBINATIONS):
        directory = tmp_path / str(number)
        directory.mkdir()
        broken = problems(combo, directory, spans, seen)
        if broken:
            found[number] = (combo, broken)
    assert not found, "\n".join(
        f"{number} {combo}:\n  " + "\n  ".join(broken) for number, (combo, broken) in found.items()
    )
    managed = [value for value in DIMENSIONS["context"] if value != "off"]
    assert all(seen[f"compacted: {value}"] for value in managed), seen
    assert all(seen[f"overflow recovered: {value}"] for value in DENSE), seen
    assert seen["summary call"] and seen["previews compared"], seen
    assert seen["side calls"] and seen["sub-agent calls"] and seen["memories shown"], seen
