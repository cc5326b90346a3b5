"""sapptk.choose at cluster scale: the work bound that queues a setup before its program is
built (never above the exhaustive optimum or the LP's first bound), and what a choice says
when its winner is not proven (the setups keeping the proof open, the gap)."""

from __future__ import annotations

import math

import numpy as np
from support import all_assignments, exhaustive_cases, small_profile

from sapptk.choosing.bounds import pipeline_bound, work_bound
from sapptk.choosing.records import device_sync_ms, sync_floor
from sapptk.choosing.result import Choice, typed_choice
from sapptk.choosing.setups import Candidate, Setup
from sapptk.config import PipelineConfig
from sapptk.profile import MODES


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


def test_least_dp_sync_of_a_card_setup_is_at_most_every_plans(rng: np.random.Generator) -> None:
    """The floor counts whole layers per device (ceil(N_g / p) of a group): at most the DP sync
    of every assignment, and above the average where whole layers cannot spread evenly."""
    above_average = 0
    for schedule, p, v, layers in (("1f1b", 3, 1, (2, 5)), ("zb-v", 2, 2, (3, 4)), ("interleaved", 2, 2, (1, 6))):
        profile = small_profile(rng, groups=2, layers=layers)
        config = PipelineConfig(p, 4, v, schedule)
        sync = tuple(float(x) for x in rng.uniform(1.0, 5.0, size=2))
        c = Candidate(setup=Setup(config=config, dp=4), profile=profile, layer_sync_ms=sync)
        floor = sync_floor(c, None)
        least = min(device_sync_ms(c, counts, None, None)
                    for counts in all_assignments(profile, config, (0, MODES.index("full"))))
        assert floor <= least + 1e-9, (schedule, floor, least)
        average = sum(n * s for n, s in zip(layers, sync, strict=True)) / p
        above_average += floor > average + 1e-9
    assert above_average >= 2


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
