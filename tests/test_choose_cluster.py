"""sapptk.choose at cluster scale: the work bound that queues a setup before its program is
built (never above the exhaustive optimum or the LP's first bound), and what a choice says
when its winner is not proven (the setups keeping the proof open, the gap)."""

from __future__ import annotations

import math

import numpy as np
from support import exhaustive_cases

from sapptk.choosing.bounds import pipeline_bound, work_bound
from sapptk.choosing.result import Choice, typed_choice


def test_work_bound_never_exceeds_the_optimum_or_the_first_lp_bound(rng: np.random.Generator) -> None:
    """Every exhaustive shape (every schedule family, sliced micro-batches included), random
    two-group profiles: the work bound is at most the least simulated step time of every
    assignment, and at most the first LP bound (whose device-chain rows it averages)."""
    positive = 0
    for trial, profile, free, found in exhaustive_cases(rng, 8):
        best = float(found[:, 0].min())
        work = work_bound(profile, free)
        assert 0.0 <= work <= best + 1e-9, (trial, free.schedule, work, best)
        first = pipeline_bound(profile, free, max_rounds=1)
        assert work <= first.bound_ms * (1 + 1e-6), (trial, free.schedule, work, first.bound_ms)
        positive += work > 0
    assert positive >= 7  # seven of the eight shapes have no slices: the bound is not a trivial zero


def _rows() -> list[dict]:
    base = {"stages": 4, "chunks": 1, "micro_batches": 8, "dp": 1, "key": None, "reason": None}
    return [
        {**base, "schedule": "1f1b", "status": "balanced", "step_time_ms": 100.0, "bound_ms": 98.0},
        {**base, "schedule": "zb-h1", "status": "balanced", "step_time_ms": 104.0, "bound_ms": 97.0},
        {**base, "schedule": "gpipe", "status": "pruned", "bound_ms": 100.0},
        {**base, "schedule": "interleaved", "chunks": 2, "status": "pruned", "bound_ms": 120.0},
        {**base, "schedule": "zb-v", "chunks": 2, "status": "infeasible", "bound_ms": math.nan},
        {**base, "schedule": "dualpipe-v", "chunks": 2, "status": "undecided", "bound_ms": 99.5},
    ]


def test_an_unproven_choice_names_the_setups_keeping_it_open() -> None:
    frame = typed_choice(_rows())
    choice = Choice(frame=frame, best=object(), proven=False)
    open_ = choice.open_setups
    assert list(open_["schedule"]) == ["zb-h1", "dualpipe-v"]  # least bound first; infeasible, pruned left out
    assert math.isclose(choice.proof_gap, 0.03)
    assert "2 setup(s) keep the proof open" in choice._not_proven() and "zb-h1" in choice._not_proven()
    proven = Choice(frame=typed_choice(_rows()[:4]), best=object(), proven=False)
    proven.frame.loc[1, "bound_ms"] = 100.0
    assert proven.open_setups.empty and proven.proof_gap == 0.0
