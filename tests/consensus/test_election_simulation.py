"""The deterministic election simulation over many seeds (see election_simulation.py).

A failure names its seed and how to reproduce it:
``python -m tests.election_simulation --seed N --members M -v``.
"""

from __future__ import annotations

import pytest

from support.election_simulation import SimulationFailure, run_seed


def _run_range(first: int, count: int, members: int) -> None:
    failures = []
    for seed in range(first, first + count):
        try:
            run_seed(seed, members)
        except SimulationFailure as failure:
            failures.append(str(failure))
    assert not failures, f"{len(failures)} of {count} seeds failed:\n" + "\n".join(failures[:5])


@pytest.mark.parametrize("first", range(0, 1000, 100))
def test_three_members(first: int) -> None:
    _run_range(first, 100, 3)


@pytest.mark.parametrize("first", range(0, 500, 100))
def test_five_members(first: int) -> None:
    _run_range(first, 100, 5)


def test_a_seed_is_reproducible() -> None:
    assert run_seed(42, 3) == run_seed(42, 3)


@pytest.mark.slow
@pytest.mark.parametrize("members", [3, 5])
@pytest.mark.parametrize("first", range(100_000, 105_000, 500))
def test_soak(first: int, members: int, request: pytest.FixtureRequest) -> None:
    """10,000 seeds in all; only when slow runs are selected (``-m slow``, make soak)."""
    if "slow" not in (request.config.getoption("markexpr") or "") or "not slow" in request.config.getoption("markexpr"):
        pytest.skip("soak run: select with -m slow")
    _run_range(first, 500, members)
