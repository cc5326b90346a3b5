"""Seeds within a sweep: every point starts from the fastest plan of a smaller budget (same
setup) that it admits, so the step time never rises with the budget."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support import two_mode_profile

from sapptk.config import PipelineConfig
from sapptk.request import SolveRequest
from sapptk.sweeps import Layout, PointResult, SweepTask, solve_point, sweep
from sapptk.sweeps.seeding import Seeds, admits, family, waves

PROFILE = two_mode_profile((4, 6))


def task(budget: float | None, schedule: str = "1f1b", recompute: Any = None, key: str = "",
         **levers: Any) -> SweepTask:
    config = PipelineConfig(2, 4, schedule=schedule, memory_budget=budget,
                            **({} if recompute is None else {"recompute": recompute}))
    request = SolveRequest(PROFILE, config, time_limit=1.0, workers=1, deterministic=True, **levers)
    return SweepTask(key or f"{schedule}-{budget}-{recompute}-{levers}", "two", "p", request)


def found(counts: Any, step: float) -> PointResult:
    return PointResult(key="k", status="feasible", step_time_ms=step, layout=Layout(counts))


def test_a_point_admits_the_plans_of_smaller_budgets_and_fewer_modes_of_its_setup():
    small, large, unlimited = task(100.0), task(200.0), task(None)
    assert admits(large, small) and admits(unlimited, large) and admits(small, small)
    assert not admits(small, large) and not admits(large, unlimited)
    assert not admits(task(200.0, "gpipe"), small)  # another schedule: another family
    assert admits(task(200.0), task(100.0, recompute=["full"]))  # its modes are among all of them
    assert not admits(task(200.0, recompute=["full"]), task(100.0))
    assert family(task(1.0)) == family(task(2.0, recompute=["none", "full"]))
    # the levers are part of the question: another margin or per-micro-batch setting is another family
    assert not admits(task(200.0, memory_margin=0.1), small) and not admits(task(200.0, per_micro_batch=True), small)
    assert admits(task(200.0, memory_margin=0.1), task(100.0, memory_margin=0.1))


def test_waves_put_every_point_after_the_points_it_admits():
    tasks = [task(b, s) for s in ("1f1b", "gpipe") for b in (300.0, None, 100.0, 200.0)]
    order = waves(tasks)
    assert [len(w) for w in order] == [2, 2, 2, 2]
    position = {t.key: i for i, w in enumerate(order) for t in w}
    for later in tasks:
        for earlier in tasks:
            if admits(later, earlier) and later is not earlier:
                assert position[earlier.key] < position[later.key]


def test_seeds_give_the_fastest_admitted_plan():
    seeds = Seeds()
    seeds.keep(task(100.0), found([[1]], 50.0))
    seeds.keep(task(150.0), found([[2]], 40.0))
    seeds.keep(task(300.0), found([[3]], 10.0))  # not admitted by 200
    seeds.keep(task(120.0), PointResult(key="k", status="infeasible"))
    point = seeds.seed(task(200.0))
    assert point.start == Layout([[2]])
    alone = seeds.seed(task(50.0))
    assert alone.start is None


STARTS: dict[float, Any] = {}
PLANS: dict[float, Any] = {}


def recording_solve(t: SweepTask) -> PointResult:
    """solve_point, remembering what each point started from and what it found."""
    budget = t.request.config.memory_budget
    STARTS[budget] = t.start
    result = solve_point(t)
    PLANS[budget] = result.layout
    return result


@pytest.mark.slow
def test_a_sweep_seeds_larger_budgets_with_the_plans_of_smaller_ones():
    prof = two_mode_profile((4, 6))
    budgets = [60.0, 75.0, 90.0, 120.0]
    STARTS.clear()
    PLANS.clear()
    frame = sweep(prof, {"stages": [3], "micro_batches": [6], "chunks": [2], "schedule": ["interleaved"],
                         "memory_budget": budgets[::-1]}, point_time_limit=2, deterministic=True, progress=False,
                  solve=recording_solve)
    assert "layout" not in frame.columns and "start" not in frame.columns
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
    options = {"point_time_limit": 2, "deterministic": True, "progress": False, "solve": recording_solve,
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
    assert prof == PROFILE
    point = task(None).with_start(Layout([[["not", "counts"]]]))
    result = solve_point(point)
    assert result.status in ("optimal", "feasible"), result


@pytest.mark.slow
def test_a_plan_that_offloads_seeds_with_its_offload(demo, tmp_path):
    STARTS.clear()
    PLANS.clear()
    frame = sweep(demo, {"stages": [4], "micro_batches": [8], "schedule": ["1f1b"], "host_bandwidth": [10.0],
                         "recompute": [("none", "select", "comm", "both", "offload")],
                         "memory_budget": [95000.0, 110000.0]},
                  point_time_limit=3, deterministic=True, progress=False, solve=recording_solve, cache=tmp_path / "c")
    steps = frame.sort_values("memory_budget_mb")["step_time_ms"].to_numpy()
    assert (np.diff(steps) <= 1e-9).all(), steps
    seed = STARTS[110000.0]
    assert seed is not None and seed == PLANS[95000.0]  # the counts and the offload of the smaller budget
    assert np.asarray(seed.offload).sum() > 0


def test_a_damaged_offload_seed_is_dropped_not_fatal():
    prof = two_mode_profile((4, 6))
    assert prof == PROFILE
    point = task(None).with_start(Layout([[[1]]], offload="x"))  # type: ignore[arg-type]
    result = solve_point(point)
    assert result.status in ("optimal", "feasible"), result
