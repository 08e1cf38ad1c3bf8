"""Features met three at a time around a sub-agent (an agent used as a tool): the cases of
``tests/subagent_triples.py``, every allowed triple of values of three dimensions, each
holding the invariants its docstring lists."""

from __future__ import annotations

import itertools

from tests.conftest import Histograms, Spans
from tests.subagent_triples import DIMENSIONS, allowed, cases, problems, wanted_triples

CASES = cases()


def test_the_cases_hold_every_allowed_triple() -> None:
    held = {tuple((name, case[name]) for name in names) for case in CASES for names in _names()}
    assert wanted_triples() <= held
    assert all(allowed(case) for case in CASES)
    assert {"asyncio", "trio"} == {case["backend"] for case in CASES}


def _names() -> list[tuple[str, ...]]:
    return list(itertools.combinations(sorted(DIMENSIONS), 3))


def test_every_case_keeps_the_invariants(spans: Spans, histograms: Histograms) -> None:
    found = {number: problems(case, spans, histograms) for number, case in enumerate(CASES)}
    broken = {number: found[number] for number in found if found[number]}
    assert not broken, "\n".join(
        f"{number} {CASES[number]}:\n  " + "\n  ".join(lines) for number, lines in broken.items()
    )
