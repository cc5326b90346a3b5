"""Seeds within a sweep: every point starts from the fastest plan of a smaller budget (same
setup) that it admits, so the step time never rises with the budget."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import two_mode_profile

from sapptk.sweeps import solve_point, sweep
from sapptk.sweeps.seeding import Seeds, admits, family, waves
from sapptk.sweeps.solving import COUNTS_KEY


def task(budget: float | None, schedule: str = "1f1b", recompute: Any = None, key: str = "") -> dict[str, Any]:
    config = {"stages": 2, "micro_batches": 4, "chunks": 1, "schedule": schedule, "memory_budget": budget}
    if recompute is not None:
        config["recompute"] = recompute
    return {"key": key or f"{schedule}-{budget}-{recompute}", "profile_digest": "p", "time_limit": 1.0, "seed": 0,
            "deterministic": True, "config": config}


def test_a_point_admits_the_plans_of_smaller_budgets_and_fewer_modes_of_its_setup():
    small, large, unlimited = task(100.0), task(200.0), task(None)
    assert admits(large, small) and admits(unlimited, large) and admits(small, small)
    assert not admits(small, large) and not admits(large, unlimited)
    assert not admits(task(200.0, "gpipe"), small)  # another schedule: another family
    assert admits(task(200.0), task(100.0, recompute=["full"]))  # its modes are among all of them
    assert not admits(task(200.0, recompute=["full"]), task(100.0))
    assert family(task(1.0)) == family(task(2.0, recompute=["none", "full"]))


def test_waves_put_every_point_after_the_points_it_admits():
    tasks = [task(b, s) for s in ("1f1b", "gpipe") for b in (300.0, None, 100.0, 200.0)]
    order = waves(tasks)
    assert [len(w) for w in order] == [2, 2, 2, 2]
    position = {t["key"]: i for i, w in enumerate(order) for t in w}
    for later in tasks:
        for earlier in tasks:
            if admits(later, earlier) and later is not earlier:
                assert position[earlier["key"]] < position[later["key"]]


def test_seeds_give_the_fastest_admitted_plan():
    seeds = Seeds()
    seeds.keep(task(100.0), {COUNTS_KEY: [[1]], "step_time_ms": 50.0})
    seeds.keep(task(150.0), {COUNTS_KEY: [[2]], "step_time_ms": 40.0})
    seeds.keep(task(300.0), {COUNTS_KEY: [[3]], "step_time_ms": 10.0})  # not admitted by 200
    seeds.keep(task(120.0), {"status": "infeasible", "step_time_ms": float("nan")})
    point = task(200.0)
    seeds.seed(point)
    assert point["start"] == [[2]]
    alone = task(50.0)
    seeds.seed(alone)
    assert "start" not in alone


STARTS: dict[float, Any] = {}
PLANS: dict[float, Any] = {}


def recording_solve(t: dict[str, Any]) -> dict[str, Any]:
    """solve_point, remembering what each point started from and what it found."""
    budget = t["config"]["memory_budget"]
    STARTS[budget] = t.get("start")
    result = solve_point(t)
    PLANS[budget] = result.get(COUNTS_KEY)
    return result


@pytest.mark.slow
def test_a_sweep_seeds_larger_budgets_with_the_plans_of_smaller_ones():
    prof = two_mode_profile((4, 6))
    budgets = [60.0, 75.0, 90.0, 120.0]
    STARTS.clear()
    PLANS.clear()
    frame = sweep(prof, {"stages": [3], "micro_batches": [6], "chunks": [2], "schedule": ["interleaved"],
                         "memory_budget": budgets[::-1]}, time_limit=2, deterministic=True, progress=False,
                  solve=recording_solve)
    assert COUNTS_KEY not in frame.columns and "start" not in frame.columns
    solved = frame[frame["status"].isin(["optimal", "feasible"])].sort_values("memory_budget_mb")
    assert len(solved) >= 2
    steps = solved["step_time_ms"].to_numpy()
    assert (np.diff(steps) <= 1e-9).all(), steps  # never slower with more memory
    first = solved["memory_budget_mb"].iloc[0]
    assert STARTS[first] is None  # nothing smaller was solved before it
    for budget in solved["memory_budget_mb"].iloc[1:]:
        earlier = [b for b in budgets if b < budget and PLANS.get(b) is not None]
        assert STARTS[budget] is not None  # seeded by a smaller budget's plan
        assert any(STARTS[budget] == PLANS[b] for b in earlier)


@pytest.mark.slow
def test_a_resumed_sweep_is_seeded_by_the_plans_in_its_cache(tmp_path):
    prof = two_mode_profile((4, 6))
    grid = {"stages": [3], "micro_batches": [6], "chunks": [2], "schedule": ["interleaved"]}
    options = {"time_limit": 2, "deterministic": True, "progress": False, "solve": recording_solve,
               "cache": tmp_path / "cache"}
    STARTS.clear()
    PLANS.clear()
    first = sweep(prof, {**grid, "memory_budget": [75.0]}, **options)
    assert first["status"].iloc[0] in ("optimal", "feasible")
    cached_plan = PLANS[75.0]
    STARTS.clear()
    sweep(prof, {**grid, "memory_budget": [75.0, 120.0]}, **options)
    assert 75.0 not in STARTS  # read from the cache, not solved again
    assert STARTS[120.0] == cached_plan  # ... and its plan seeds the larger budget


def test_a_seed_that_does_not_suit_the_point_is_dropped_not_fatal():
    prof = two_mode_profile((4, 6))
    point = task(None)
    point.update(profile=prof.to_dict(), profile_name="two", workers=1, start=[[["not", "counts"]]])
    result = solve_point(point)
    assert result["status"] in ("optimal", "feasible"), result


@pytest.mark.slow
def test_a_plan_that_offloads_seeds_with_its_offload(demo, tmp_path):
    STARTS.clear()
    PLANS.clear()
    frame = sweep(demo, {"stages": [4], "micro_batches": [8], "schedule": ["1f1b"], "host_bandwidth": [10.0],
                         "recompute": [("none", "select", "comm", "both", "offload")],
                         "memory_budget": [95000.0, 110000.0]},
                  time_limit=3, deterministic=True, progress=False, solve=recording_solve, cache=tmp_path / "c")
    steps = frame.sort_values("memory_budget_mb")["step_time_ms"].to_numpy()
    assert (np.diff(steps) <= 1e-9).all(), steps
    seed = STARTS[110000.0]
    assert isinstance(seed, dict) and seed == PLANS[95000.0]  # the counts and the offload of the smaller budget
    assert np.asarray(seed["offload"]).sum() > 0


def test_a_damaged_offload_seed_is_dropped_not_fatal():
    prof = two_mode_profile((4, 6))
    point = task(None)
    point.update(profile=prof.to_dict(), profile_name="two", workers=1, start={"counts": [[[1]]], "offload": "x"})
    result = solve_point(point)
    assert result["status"] in ("optimal", "feasible"), result
