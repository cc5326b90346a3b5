"""Sweeps: grids, keys, the frame, the cache (resume after an interrupt), executors, plots, CLI.

The machinery is tested with small stand-in solve functions (fast, countable); the
executor equivalence, invalid and infeasible rows, and the resume test also run the real
balancer on small problems (demo profile, 4 stages, 8 micro-batches).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from support import descendants, process_gone, wait_until

import sapptk.sweeps.executors as executors_module
import sapptk.sweeps.solving as solving_module
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError, SapptkError
from sapptk.profile import MODES, bundled_profile
from sapptk.request import SolveRequest
from sapptk.sweeps import (
    COLUMNS,
    CONFIG_FIELDS,
    INPUT_COLUMNS,
    LEVER_COLUMNS,
    STATUSES,
    best,
    default_workers,
    expand_grid,
    point_key,
    read_cache,
    solve_point,
    sweep,
)
from sapptk.sweeps.solving import Layout, PointResult, SweepTask

DEMO = bundled_profile("demo")
SMALL = {"stages": [4], "micro_batches": [8]}


# ------------------------------------------------------------------ stand-in solvers
CALLS: list[dict[str, Any]] = []


def fake_solve(task: SweepTask) -> dict[str, Any]:
    """A solver stand-in: a closed-form 'plan' of the task's (checked) request."""
    CALLS.append(task.request.config)
    config = task.request.config
    if config.memory_budget is not None and config.memory_budget < 10_000:
        return {"status": "infeasible", "error": "budget below the parameters"}
    step = 3.0 * (config.micro_batches + config.stages - 1) / config.chunks
    peaks = [1000.0 + 10 * d + config.chunks for d in range(config.stages)]
    return {
        "status": "optimal", "step_time_ms": step, "bound_ms": step, "gap": 0.0,
        "bubble_of_compute": (config.stages - 1) / config.micro_batches, "bubble_of_step": 0.1,
        "peak_mb": peaks, "peak_mb_max": max(peaks), "recompute_ms": 0.0,
    }


class Interrupt(KeyboardInterrupt):
    pass


STOP_AFTER = [math.inf]


def interrupting_solve(task: SweepTask) -> dict[str, Any]:
    """``fake_solve`` that raises KeyboardInterrupt once STOP_AFTER points are done."""
    if len(CALLS) >= STOP_AFTER[0]:
        raise Interrupt
    return fake_solve(task)


def slow_solve(task: SweepTask) -> dict[str, Any]:
    """0.3 s, except the point (8 stages, 16 micro-batches, 40000 MB): a minute (it writes its
    pid when it starts and a marker if it ever ends, in the folder named by the profile name)."""
    import time

    marks = Path(task.profile_name)
    config = task.request.config
    if (config.stages, config.micro_batches, config.memory_budget) == (8, 16, 40000):
        (marks / f"long-{os.getpid()}").touch()
        time.sleep(60)
        (marks / "long-done").touch()
    time.sleep(0.3)
    return fake_solve(task)


def failing_solve(task: SweepTask) -> dict[str, Any]:
    if task.request.config.stages == 8:
        raise RuntimeError("boom")
    return fake_solve(task)


def dying_solve(task: SweepTask) -> dict[str, Any]:
    """Kills its process (like a native abort in the solver) every time."""
    os._exit(3)


def dying_once_solve(task: SweepTask) -> dict[str, Any]:
    """Kills its process the first time (the marker file is named by the profile name)."""
    mark = Path(task.profile_name)
    if not mark.exists():
        mark.touch()
        os._exit(3)
    return fake_solve(task)


def counting_solve(task: SweepTask) -> PointResult:
    """The real solver, counted (serial runs only)."""
    CALLS.append(task.request.config)
    return solve_point(task)


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS.clear()
    STOP_AFTER[0] = math.inf


def _outputs(frame: pd.DataFrame) -> pd.DataFrame:
    """Everything but the wall time."""
    return frame.drop(columns=["solve_seconds"])


# --------------------------------------------------------------------------- grids
def test_grid_is_the_product_last_field_fastest() -> None:
    points = expand_grid({"stages": [4, 8], "micro_batches": [8, 16], "schedule": "1f1b"})
    assert [(p["stages"], p["micro_batches"]) for p in points] == [(4, 8), (4, 16), (8, 8), (8, 16)]
    assert all(p["schedule"] == "1f1b" and p["chunks"] == 1 and p["recompute"] == MODES for p in points)
    assert len(expand_grid({"stages": range(2, 6), "micro_batches": (8, 16)})) == 8


def test_grid_recompute_list_is_an_axis_tuple_is_one_set() -> None:
    axis = expand_grid({**SMALL, "recompute": ["none", ("none", "full")]})
    assert [p["recompute"] for p in axis] == ["none", ("none", "full")]
    one = expand_grid({**SMALL, "recompute": ("none", "full")})
    assert [p["recompute"] for p in one] == [("none", "full")]


def test_grid_of_explicit_points() -> None:
    points = expand_grid([PipelineConfig(4, 8, schedule="gpipe"), {"stages": 2, "micro_batches": 4}])
    assert points[0]["schedule"] == "gpipe" and points[1]["stages"] == 2 and points[1]["schedule"] == "1f1b"


@pytest.mark.parametrize(
    ("grid", "match"),
    [
        ({"stages": [4], "micro_batches": [8], "stage": [1]}, "unknown field 'stage'"),
        ({"micro_batches": [8]}, "'stages' is required"),
        ([{"stages": 4}], r"grid\[0\]: field 'micro_batches' is required"),
        ("1f1b", "expected a mapping"),
    ],
)
def test_grid_errors_name_the_problem(grid: Any, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        expand_grid(grid)


def test_keys_ignore_spelling_but_not_content() -> None:
    base = expand_grid({**SMALL, "memory_budget": 40000, "recompute": ("full", "none")})[0]
    same = {**base, "memory_budget": 40000.0, "recompute": ("none", "full")}
    opts = {"time_limit": 5.0, "seed": 0, "deterministic": True}
    key = point_key("demo", "abc", base, opts)
    assert point_key("demo", "abc", same, opts) == key
    assert point_key("demo", "abd", base, opts) != key  # profile content
    assert point_key("demo", "abc", {**base, "chunks": 2}, opts) != key
    assert point_key("demo", "abc", base, {**opts, "time_limit": 6.0}) != key


def test_default_workers_do_not_oversubscribe() -> None:
    assert default_workers(1, cores=2) == 2
    assert default_workers(2, cores=2) == 1
    assert default_workers(4, cores=2) == 1
    assert default_workers(3, cores=16) == 5
    assert default_workers(1, cores=64) == 8  # capped


# --------------------------------------------------------------------------- frame
GRID = {
    "stages": [4, 8],
    "micro_batches": [8, 16],
    "chunks": [1, 2],
    "schedule": ["1f1b", "interleaved"],
    "memory_budget": [5000, 40000, None],
}


def test_frame_one_typed_row_per_point_in_grid_order() -> None:
    df = sweep(DEMO, GRID, solve=fake_solve, progress=False)
    assert list(df.columns) == list(COLUMNS)
    assert len(df) == 2 * 2 * 2 * 2 * 3
    for col in ("profile", "schedule", "status", "recompute"):
        assert isinstance(df[col].dtype, pd.CategoricalDtype), col
    # every status is a category, even absent ones (frames of different sweeps concatenate), best first
    assert set(df["status"].astype(str)) < set(df["status"].cat.categories) == set(STATUSES)
    assert df.sort_values("status", kind="stable")["status"].astype(str).unique().tolist() == [
        "optimal", "infeasible", "invalid"]
    assert list(df["schedule"].cat.categories) == ["1f1b", "interleaved"]
    assert df["stages"].dtype == "int64" and df["memory_budget_mb"].dtype == "float64"
    assert df["memory_budget_mb"].isna().sum() == 16  # unlimited
    assert df["recompute"].iloc[0] == ",".join(MODES)
    # invalid combinations and infeasible budgets are rows with a reason
    invalid = df[df["status"] == "invalid"]
    assert len(invalid) == 12 and (invalid["schedule"] == "1f1b").all() and (invalid["chunks"] == 2).all()
    assert invalid["error"].str.contains("chunks = 2").all()
    assert (df.loc[df["status"] == "infeasible", "memory_budget_mb"] == 5000).all()
    ok = df[df["status"] == "optimal"]
    assert ok["error"].isna().all() and ok["peak_mb"].map(len).eq(ok["stages"]).all()
    assert (ok["peak_mb_max"] == ok["peak_mb"].map(max)).all()
    # grid order: the last field varies fastest
    assert df["memory_budget_mb"].iloc[:3].fillna(-1).tolist() == [5000, 40000, -1]


def test_several_profiles_and_duplicate_points() -> None:
    llama = bundled_profile("llama2_70b")
    grid = [{"stages": 4, "micro_batches": 8, "memory_budget": b} for b in (40000, 40000.0)]
    df = sweep({"a": DEMO, "b": llama}, grid, solve=fake_solve, progress=False)
    assert df["profile"].tolist() == ["a", "a", "b", "b"]
    assert list(df["profile"].cat.categories) == ["a", "b"]
    assert len(CALLS) == 2  # one solve per distinct point


def test_solver_failures_become_error_rows() -> None:
    df = sweep(DEMO, {"stages": [4, 8], "micro_batches": [8]}, solve=failing_solve, progress=False)
    assert df["status"].tolist() == ["optimal", "error"]
    assert "RuntimeError: boom" in df["error"].iloc[1]


@pytest.mark.slow
def test_dead_worker_processes_are_retried_then_give_error_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    grid = {"stages": [4, 8], "micro_batches": [8]}
    mark = str(tmp_path / "died")
    df = sweep({mark: DEMO}, grid, solve=dying_once_solve, executor="processes", progress=False)
    assert df["status"].tolist() == ["optimal", "optimal"] and Path(mark).exists()
    monkeypatch.setattr(executors_module, "MAX_ATTEMPTS", 2)
    df = sweep(DEMO, grid, solve=dying_solve, executor="processes", progress=False)
    assert (df["status"] == "error").all() and df["error"].str.contains("worker process died 2 times").all()


def pid_solve(task: SweepTask) -> dict[str, Any]:
    """``fake_solve`` that names its process in ``error``."""
    return {**fake_solve(task), "error": str(os.getpid())}


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
def test_processes_runner_keeps_its_workers_until_the_stack_closes() -> None:
    """A choice's rounds (a sweep's waves) reuse the pool's workers; closing the stack ends them."""
    from contextlib import ExitStack

    tasks = [SweepTask(f"k{i}", "demo", "d", SolveRequest(DEMO, PipelineConfig(stages=4, micro_batches=8 + i)))
             for i in range(2)]
    with ExitStack() as stack:
        runner, slots = executors_module.open_executor("processes", tasks, pid_solve, None, stack)
        first = {int(r.error) for r in runner(tasks, lambda r: None)}
        second = {int(r.error) for r in runner(tasks, lambda r: None)}
        assert len(first) <= slots and second <= first  # no new process for the second call
    assert all(wait_until(lambda pid=pid: process_gone(pid), 30) for pid in first)


NOTEBOOK_CELL = """
def notebook_solve(task):
    profile = task.request.profile
    return {"status": "optimal", "step_time_ms": float(task.request.config.stages), "error": profile.name}
"""


def test_notebook_defined_functions_and_profiles_work_in_processes() -> None:
    namespace: dict[str, Any] = {"__name__": "__main__"}  # what a notebook cell defines
    exec(NOTEBOOK_CELL, namespace)
    solve = namespace["notebook_solve"]
    assert solve.__module__ == "__main__"
    mine = type(DEMO).from_dict({**DEMO.to_dict(), "name": "made-here"})
    df = sweep(mine, {"stages": [4, 8], "micro_batches": [8]}, solve=solve, executor="processes", progress=False)
    assert df["status"].astype(str).tolist() == ["optimal", "optimal"], df["error"].tolist()
    assert df["step_time_ms"].tolist() == [4.0, 8.0] and (df["error"] == "made-here").all()


def test_best_per_budget() -> None:
    df = sweep(DEMO, GRID, solve=fake_solve, progress=False)
    top = best(df)  # 5000 MB has no plan; unlimited (NaN) comes last
    assert top["memory_budget_mb"].fillna(-1).tolist() == [40000.0, -1]
    assert top["step_time_ms"].tolist() == [16.5, 16.5]  # 4 stages, 8 micro-batches, 2 chunks
    assert (top[["stages", "chunks"]].to_numpy() == [4, 2]).all()
    per_schedule = best(df, by=["schedule", "stages"])
    assert len(per_schedule) == 4 and per_schedule["status"].eq("optimal").all()


def test_bad_arguments_raise_before_solving() -> None:
    from sapptk.request import SolveRequest

    with pytest.raises(ConfigError, match="executor"):
        sweep(DEMO, SMALL, solve=fake_solve, executor="threads", progress=False)
    with pytest.raises(ConfigError, match="^time_limit = 0: "):
        sweep(DEMO, SMALL, solve=fake_solve, time_limit=0, progress=False)
    with pytest.raises(ConfigError, match="^point_time_limit = -1: "):
        sweep(DEMO, SMALL, solve=fake_solve, point_time_limit=-1, progress=False)
    for bad in ({"workers": 100}, {"workers": 0}, {"seed": -1}, {"deterministic": "yes"}):  # as every solve says
        with pytest.raises(ConfigError) as swept:
            sweep(DEMO, SMALL, solve=fake_solve, progress=False, **bad)
        with pytest.raises(ConfigError) as solved:
            SolveRequest(DEMO, PipelineConfig(4, 8), **bad)
        assert str(swept.value) == str(solved.value)
    assert not CALLS


# -------------------------------------------------------------------------- levers
REQUESTS: list[Any] = []


def request_solve(task: SweepTask) -> dict[str, Any]:
    """``fake_solve`` that keeps each task's request."""
    REQUESTS.append(task.request)
    return fake_solve(task)


def sleepy_solve(task: SweepTask) -> dict[str, Any]:
    """``request_solve`` taking 0.3 s a point; feasible (not proven) at 4 stages."""
    import time

    time.sleep(0.3)
    row = request_solve(task)
    return {**row, "status": "feasible"} if task.request.config.stages == 4 else row


def test_time_limit_is_the_whole_sweep_and_keeps_every_finished_row(tmp_path: Path) -> None:
    REQUESTS.clear()
    grid = {"stages": [2, 8, 4], "micro_batches": [8], "chunks": [1], "memory_budget": [20000, 30000, 40000]}
    df = sweep(DEMO, grid, solve=sleepy_solve, time_limit=0.9, point_time_limit=0.5, cache=tmp_path, progress=False)
    assert len(df) == 9 and set(df["status"].astype(str)) <= {"optimal", "feasible", "not_started"}
    solved = int(df["status"].isin(["optimal", "feasible"]).sum())
    assert solved == len(REQUESTS) and 1 <= solved <= 4  # never started past the deadline; none lost
    assert df.loc[df["status"] == "not_started", "error"].str.contains("time_limit of 0.9 s").all()
    assert (df["point_time_limit_s"] == 0.5).all()
    limits = [r.time_limit for r in REQUESTS]
    assert all(t <= 0.5 for t in limits)  # a point started near the deadline gets only what is left
    cut = sum(t < 0.5 and r.config.stages == 4 for t, r in zip(limits, REQUESTS, strict=True))  # proven: cached
    REQUESTS.clear()
    again = sweep(DEMO, grid, solve=request_solve, point_time_limit=0.5, cache=tmp_path, progress=False)
    assert again["status"].eq("optimal").all()  # no whole limit: every point
    assert len(REQUESTS) == 9 - solved + cut  # the points not started, or cut short unproven, were not cached


def test_levers_are_grid_axes_and_frame_columns() -> None:
    REQUESTS.clear()
    grid = {**SMALL, "memory_budget": [60000], "per_micro_batch": [False, True], "memory_margin": [None, 0.1, 2000],
            "oom_risk": [0.01], "memory_error": [0.05]}
    assert len(expand_grid(grid)) == 6
    df = sweep(DEMO, grid, solve=request_solve, progress=False)
    assert list(df.columns) == list(COLUMNS) and df["status"].eq("optimal").all(), df["error"].tolist()
    assert df["per_micro_batch"].dtype == bool and df["per_micro_batch"].tolist() == [False] * 3 + [True] * 3
    assert df["memory_margin"].fillna(-1).tolist() == [-1, 0.1, 2000] * 2
    assert (df["oom_risk"] == 0.01).all() and (df["memory_error"] == 0.05).all()
    assert df["key"].nunique() == 6  # each lever setting is its own question
    got = {(r.per_micro_batch, r.memory_margin, r.oom_risk, r.memory_error) for r in REQUESTS}
    assert got == {(p, m, 0.01, 0.05) for p in (False, True) for m in (None, 0.1, 2000)}
    margin = next(r for r in REQUESTS if r.memory_margin == 2000)
    assert margin.safe_config.memory_budget <= 58000 and margin.config.memory_budget == 60000


def test_offload_is_swept_through_the_recompute_sets_and_the_host_bandwidth() -> None:
    REQUESTS.clear()
    modes = ("none", "select", "comm", "both")
    df = sweep(DEMO, {**SMALL, "recompute": [modes, (*modes, "offload")], "host_bandwidth": [10.0, 25.0]},
               solve=request_solve, progress=False)
    assert df["recompute"].astype(str).tolist() == ["none,select,comm,both"] * 2 + ["none,select,comm,both,offload"] * 2
    assert df["host_bandwidth_mb_per_ms"].tolist() == [10.0, 25.0, 10.0, 25.0]
    assert [r.offload for r in REQUESTS] == [False, False, True, True]
    assert [r.config.host_bandwidth for r in REQUESTS] == [10.0, 25.0, 10.0, 25.0]


def test_levers_off_keep_the_keys_of_sweeps_before_levers() -> None:
    point = expand_grid(SMALL)[0]
    options = {"time_limit": 5.0, "seed": 0, "deterministic": False}
    before = {f: v for f, v in point.items() if f in CONFIG_FIELDS}
    assert point_key("demo", "abc", point, options) == point_key("demo", "abc", before, options)
    assert point_key("demo", "abc", {**point, "memory_margin": 0.1}, options) != point_key("demo", "abc", point,
                                                                                         options)
    assert point_key("demo", "abc", {**point, "memory_margin": 1000}, options) == point_key(
        "demo", "abc", {**point, "memory_margin": 1000.0}, options)


def test_lever_combinations_the_request_refuses_are_invalid_rows_without_a_solve() -> None:
    modes = ("none", "select", "comm", "both", "offload")
    grid = [
        {**{k: v[0] for k, v in SMALL.items()}, "per_micro_batch": True, "recompute": modes, "host_bandwidth": 10.0},
        {**{k: v[0] for k, v in SMALL.items()}, "oom_risk": 0.01, "memory_budget": 60000},  # no memory_error
        {**{k: v[0] for k, v in SMALL.items()}, "memory_margin": 0.1},  # no budget to keep a margin under
        {**{k: v[0] for k, v in SMALL.items()}, "per_micro_batch": "yes"},
        {**{k: v[0] for k, v in SMALL.items()}, "oom_risk": 0.01, "memory_budget": 60000, "memory_error": "big"},
    ]
    df = sweep(DEMO, grid, solve=fake_solve, progress=False)
    assert df["status"].astype(str).tolist() == ["invalid"] * 5 and not CALLS
    errors = df["error"].tolist()
    assert "per_micro_batch = True with 'offload'" in errors[0]
    assert "memory_error" in errors[1] and "memory_budget" in errors[2]
    assert "per_micro_batch = 'yes'" in errors[3] and "memory_error = 'big'" in errors[4]


def test_a_cache_written_before_levers_is_read_with_the_levers_off(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    first = sweep(DEMO, GRID, solve=fake_solve, cache=cache, progress=False)
    (part,) = cache.glob("part-*.parquet")
    old = pd.read_parquet(part).drop(columns=list(LEVER_COLUMNS))  # as sweeps wrote them before
    part.unlink()
    _write_part(cache / "part-0-old.parquet", old)
    CALLS.clear()
    df = sweep(DEMO, GRID, solve=fake_solve, cache=cache, progress=False)
    assert not CALLS
    pd.testing.assert_frame_equal(_outputs(df), _outputs(first))
    assert len(read_cache(cache)) == 48 and len(list(cache.glob("part-*.parquet"))) == 1


def test_a_cache_with_the_old_host_bandwidth_column_resumes(tmp_path: Path) -> None:
    """Parts and journals written when the columns were ``host_bandwidth`` (no unit) and
    ``time_limit_s`` (before the whole sweep's limit) are read under ``host_bandwidth_mb_per_ms``
    and ``point_time_limit_s``: nothing is recomputed (the keys did not change)."""
    cache = tmp_path / "c"
    first = sweep(DEMO, GRID, solve=fake_solve, cache=cache, progress=False)
    (part,) = cache.glob("part-*.parquet")
    old = pd.read_parquet(part).rename(columns={"host_bandwidth_mb_per_ms": "host_bandwidth",
                                                "point_time_limit_s": "time_limit_s"})
    part.unlink()
    _write_part(cache / "part-0-old.parquet", old.iloc[:40])
    journal = cache / "_journal-1-old.jsonl"
    def plain(v: Any) -> Any:
        return [float(x) for x in v] if isinstance(v, np.ndarray | list) else None if pd.isna(v) else v

    rows = old.iloc[40:].astype(object).to_dict("records")
    journal.write_text("".join(json.dumps({k: plain(v) for k, v in r.items()}) + "\n" for r in rows))
    CALLS.clear()
    df = sweep(DEMO, GRID, solve=fake_solve, cache=cache, progress=False)
    assert not CALLS
    assert "host_bandwidth" not in df.columns and df["host_bandwidth_mb_per_ms"].isna().all()
    assert "time_limit_s" not in df.columns and (read_cache(cache)["point_time_limit_s"] == 30).all()
    pd.testing.assert_frame_equal(_outputs(df), _outputs(first))


@pytest.mark.slow
def test_real_sweep_of_the_levers_matches_balance() -> None:
    from sapptk.balancer import balance

    grid = {**SMALL, "memory_budget": [90000], "memory_margin": [None, 3000], "per_micro_batch": [False, True]}
    df = sweep(DEMO, grid, **REAL_OPTIONS)
    assert df["status"].isin(["optimal", "feasible"]).all(), df["error"].tolist()
    safe = df[df["memory_margin"] == 3000]
    assert (safe["peak_mb_max"] <= 87000 + 1e-6).all()
    row = df[(df["memory_margin"] == 3000) & df["per_micro_batch"]].iloc[0]
    plan = balance(DEMO, PipelineConfig(4, 8, memory_budget=90000), time_limit=REAL_LIMIT, workers=1,
                   deterministic=True, memory_margin=3000, per_micro_batch=True)
    assert row["step_time_ms"] == pytest.approx(plan.step_time)
    assert str(row["status"]) == plan.status


def odd_solve(task: SweepTask) -> Any:
    """Answers that are not results: an unknown column, an unknown status, not a mapping."""
    return {4: {"status": "optimal", "step_ms": 1.0}, 5: {"status": "done"}, 6: ["optimal"]}[task.request.config.stages]


def test_a_solve_function_answers_a_point_result_or_result_columns() -> None:
    result = PointResult.of("k", {"status": "optimal", "step_time_ms": np.float64(2.5), "peak_mb": np.array([1, 2])})
    assert result == PointResult(key="k", status="optimal", step_time_ms=2.5, peak_mb=(1.0, 2.0))
    assert isinstance(result.step_time_ms, float) and result.columns()["peak_mb"] == [1.0, 2.0]
    df = sweep(DEMO, {"stages": [4, 5, 6], "micro_batches": [8]}, solve=odd_solve, progress=False)
    assert df["status"].astype(str).tolist() == ["error"] * 3
    assert "unknown column 'step_ms'" in df["error"].iloc[0] and "status 'done'" in df["error"].iloc[1]
    assert "returned list" in df["error"].iloc[2]


def test_layouts_keep_their_cached_json_forms() -> None:
    assert Layout.from_json("[[[1, 2]]]") == Layout([[[1, 2]]])  # counts only, as caches have always held
    both = Layout([[[1, 2]]], offload=[[[0]]])
    assert Layout.from_json(both.to_json()) == both and Layout.from_json(Layout([[[3]]]).to_json()) == Layout([[[3]]])
    for damaged in (None, float("nan"), "{not json", "3", '{"offload": [1]}'):
        assert Layout.from_json(damaged) is None


# --------------------------------------------------------------------------- cache
def test_cache_resumes_after_an_interrupt(tmp_path: Path) -> None:
    cache = tmp_path / "sweep.parquet"
    STOP_AFTER[0] = 10
    with pytest.raises(KeyboardInterrupt):
        sweep(DEMO, GRID, solve=interrupting_solve, cache=cache, progress=False)
    # every finished point was written: the 10 solved, and the 12 invalid ones (1f1b with 2 chunks, refused up front)
    assert len(read_cache(cache)) == 10 + 12
    CALLS.clear()
    STOP_AFTER[0] = math.inf
    df = sweep(DEMO, GRID, solve=interrupting_solve, cache=cache, progress=False)
    assert len(CALLS) == 48 - 12 - 10
    CALLS.clear()
    again = sweep(DEMO, GRID, solve=fake_solve, cache=cache, progress=False)
    assert not CALLS
    pd.testing.assert_frame_equal(_outputs(df), _outputs(again))
    fresh = sweep(DEMO, GRID, solve=fake_solve, progress=False)
    pd.testing.assert_frame_equal(_outputs(df), _outputs(fresh))
    assert len(list(cache.glob("part-*.parquet"))) == 1  # compacted after a complete sweep


@pytest.mark.slow
@pytest.mark.skipif(executors_module.available_cores() < 2, reason="needs two worker processes")
def test_interrupted_process_sweep_keeps_finished_rows_and_stops_its_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import tqdm.auto

    class InterruptingBar(tqdm.auto.tqdm):
        """Ctrl-C arrives while the third result is being counted."""

        counted = 0

        def update(self, n: int = 1) -> bool | None:
            InterruptingBar.counted += 1
            if InterruptingBar.counted >= 3:
                raise KeyboardInterrupt
            return super().update(n)

    monkeypatch.setattr(tqdm.auto, "tqdm", InterruptingBar)
    marks = tmp_path / "marks"
    marks.mkdir()
    profiles = {str(marks): DEMO}
    # the minute-long point comes first: one worker is inside it when Ctrl-C arrives
    grid = {"stages": [8, 4], "micro_batches": [16, 8], "chunks": [1], "memory_budget": [40000, 50000]}
    with pytest.raises(KeyboardInterrupt):
        sweep(profiles, grid, solve=slow_solve, executor="processes", cache=tmp_path / "c", progress=False)
    (long_pid,) = [int(m.name.removeprefix("long-")) for m in marks.glob("long-*") if m.name != "long-done"]
    assert wait_until(lambda: process_gone(long_pid)), "the worker running the long point outlived the interrupt"
    assert not (marks / "long-done").exists()  # stopped, not awaited
    kept = len(read_cache(tmp_path / "c"))
    assert 3 <= kept < 8
    monkeypatch.undo()
    df = sweep(profiles, grid, solve=fake_solve, cache=tmp_path / "c", progress=False)
    assert len(CALLS) == 8 - kept and df["status"].eq("optimal").all()


def test_cache_grows_with_the_grid_and_keeps_dtypes(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    half = {**GRID, "memory_budget": [5000, 40000]}
    sweep(DEMO, half, solve=fake_solve, cache=cache, progress=False)
    assert len(CALLS) == 32 - 8  # invalid points (1f1b with 2 chunks) are refused before any solve
    CALLS.clear()
    df = sweep(DEMO, GRID, solve=fake_solve, cache=cache, progress=False)
    assert len(CALLS) == 16 - 4  # only the new budget
    CALLS.clear()
    sweep(DEMO, GRID, solve=fake_solve, cache=cache, point_time_limit=5, progress=False)
    assert len(CALLS) == 48 - 12  # another time limit per point is another point
    raw = pd.read_parquet(cache)
    assert len(raw) == 96 and isinstance(raw["status"].dtype, pd.CategoricalDtype)
    stored = read_cache(cache)
    assert list(stored.columns) == list(COLUMNS)
    same = stored.set_index("key").loc[df["key"]].reset_index()[list(COLUMNS)]
    pd.testing.assert_frame_equal(_outputs(same), _outputs(df), check_categorical=False)


def test_error_rows_are_not_cached(tmp_path: Path) -> None:
    grid = {"stages": [4, 8], "micro_batches": [8]}
    sweep(DEMO, grid, solve=failing_solve, cache=tmp_path, progress=False)
    CALLS.clear()
    df = sweep(DEMO, grid, solve=fake_solve, cache=tmp_path, progress=False)
    assert len(CALLS) == 1 and df["status"].tolist() == ["optimal", "optimal"]


def test_badly_typed_points_are_invalid_rows_and_not_cached(tmp_path: Path) -> None:
    grid = [{"stages": "8", "micro_batches": 8}, {"stages": 4, "micro_batches": 8, "memory_budget": "lots"},
            {"stages": 4, "micro_batches": 8, "schedule": None}, {"stages": 4, "micro_batches": 8}]
    df = sweep(DEMO, grid, solve=fake_solve, cache=tmp_path, progress=False)
    assert df["status"].astype(str).tolist() == ["invalid", "invalid", "invalid", "optimal"]
    assert "stages = '8'" in df["error"].iloc[0] and "memory_budget = 'lots'" in df["error"].iloc[1]
    assert len(read_cache(tmp_path)) == 1


def test_cache_must_be_a_directory(tmp_path: Path) -> None:
    file = tmp_path / "x.parquet"
    file.write_text("")
    with pytest.raises(SapptkError, match="directory"):
        sweep(DEMO, SMALL, solve=fake_solve, cache=file, progress=False)


# ----------------------------------------------------------------------------- CLI
def test_cli_sweep_writes_rows_and_prints_the_best_per_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sapptk.cli import main

    monkeypatch.setattr(solving_module, "solve_point", fake_solve)
    out = tmp_path / "results.parquet"
    argv = ["sweep", "demo", "--stages", "4", "8", "--micro-batches", "8", "16", "--chunks", "1", "2",
            "--schedule", "1f1b", "interleaved", "--memory", "5000", "40000", "none", "--out", str(out),
            "--point-time-limit", "5", "--no-progress"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "48 points" in text and "12 invalid" in text and "best setup per memory budget" in text
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("budget_mb"))
    assert [line.split()[0] for line in lines[head + 1 :]] == ["40000", "none"]
    assert "interleaved" in lines[head + 1] and "16.5" in lines[head + 1]
    assert len(pd.read_parquet(out)) == 48
    CALLS.clear()
    assert main(argv) == 0  # a rerun reads the rows back
    assert not CALLS
    tiny = ["sweep", "demo", "-p", "4", "-m", "8", "--memory", "100", "--out", str(tmp_path / "t"), "--no-progress"]
    assert main(tiny) == 1  # no plan anywhere
    assert "no plan for any point" in capsys.readouterr().out
    assert main(["sweep", "demo", "--stages", "4", "--micro-batches", "8", "--out", str(out),
                 "--executor", "threads"]) == 2
    levers = ["sweep", "demo", "-p", "4", "-m", "8", "--memory", "60000", "--per-micro-batch", "off", "on",
              "--memory-margin", "none", "0.05", "--oom-risk", "0.01", "--memory-error", "0.02",
              "--out", str(tmp_path / "levers"), "--no-progress"]
    REQUESTS.clear()
    monkeypatch.setattr(solving_module, "solve_point", request_solve)
    assert main(levers) == 0
    text = capsys.readouterr().out
    assert "4 points" in text and "per_micro_batch" in text and "memory_margin" in text
    assert {(r.per_micro_batch, r.memory_margin, r.oom_risk, r.memory_error) for r in REQUESTS} == {
        (p, m, 0.01, 0.02) for p in (False, True) for m in (None, 0.05)}
    offload = ["sweep", "demo", "-p", "4", "-m", "8", "--recompute", "none", "select", "offload",
               "--host-bandwidth", "10", "25", "--out", str(tmp_path / "offload"), "--no-progress"]
    REQUESTS.clear()
    assert main(offload) == 0
    assert [(r.offload, r.config.host_bandwidth) for r in REQUESTS] == [(True, 10.0), (True, 25.0)]


# ---------------------------------------------------------------------------- plots
def test_plots_draw_the_solved_points_with_hover() -> None:
    from bokeh.models import HoverTool

    from sapptk.viz import heatmap, pareto, pareto_front, step_time_by_budget

    df = sweep(DEMO, GRID, solve=fake_solve, progress=False)
    solved = df[df["status"] == "optimal"]

    fig = step_time_by_budget(df)
    lines = [r for r in fig.renderers if type(r.glyph).__name__ == "Line"]
    assert len(lines) == 2  # one per schedule
    for line in lines:
        data = line.data_source.data
        assert list(data["memory_budget_mb"]) == [40000.0]  # 5000 has no plan, unlimited left out
    inter = next(r for r in lines if r.data_source.data["schedule"][0] == "interleaved")
    assert inter.data_source.data["step_time_ms"][0] == solved.loc[
        (solved["schedule"] == "interleaved") & (solved["memory_budget_mb"] == 40000), "step_time_ms"].min()
    assert fig.select_one(HoverTool).renderers

    fig = heatmap(df, "chunks", "schedule")
    assert list(fig.x_range.factors) == ["1", "2"] and list(fig.y_range.factors) == ["interleaved", "1f1b"]
    cells = [r for r in fig.renderers if type(r.glyph).__name__ == "Rect"]
    filled = cells[0].data_source.data
    assert sorted(zip(filled["_x"], filled["_y"], strict=True)) == [("1", "1f1b"), ("1", "interleaved"),
                                                                      ("2", "interleaved")]
    assert list(cells[1].data_source.data["cell_text"]) == ["invalid"]  # 1f1b with 2 chunks
    assert len(fig.select_one(HoverTool).renderers) == 2

    front = pareto_front(df)
    assert len(front) >= 1 and front["step_time_ms"].is_monotonic_decreasing
    for _, row in solved.iterrows():  # every point is matched or beaten by a point of the front
        assert ((front["peak_mb_max"] <= row["peak_mb_max"]) & (front["step_time_ms"] <= row["step_time_ms"])).any()
    fig = pareto(df)
    dots = [r for r in fig.renderers if type(r.glyph).__name__ == "Scatter"]
    assert sum(len(r.data_source.data["step_time_ms"]) for r in dots[:-1]) == len(solved)
    assert any(type(r.glyph).__name__ == "Step" for r in fig.renderers)


# ------------------------------------------------------------ the real balancer
# Small problems that CP-SAT settles within a second even with one worker: optimal step
# times are unique, so every executor must agree on status and step time.
REAL = {"stages": [4], "micro_batches": [8], "schedule": ["1f1b", "interleaved", "zb-h1"], "chunks": [1, 2],
        "memory_budget": [60000, 90000]}
REAL_LIMIT = 20
# deterministic CP-SAT with the same workers everywhere: the executors must give equal frames
REAL_OPTIONS: dict[str, Any] = {"point_time_limit": REAL_LIMIT, "deterministic": True, "workers": 1, "progress": False}


def _agree(frame: pd.DataFrame, reference: pd.DataFrame) -> None:
    """Equal frames but for the wall times; status and step time above all."""
    cols = [*INPUT_COLUMNS, "status", "step_time_ms", "key"]
    pd.testing.assert_frame_equal(frame[cols], reference[cols])
    pd.testing.assert_frame_equal(frame.drop(columns="solve_seconds"), reference.drop(columns="solve_seconds"))


@pytest.fixture(scope="module")
def serial_frame() -> pd.DataFrame:
    return sweep(DEMO, REAL, **REAL_OPTIONS)


@pytest.mark.slow
def test_real_sweep_rows(serial_frame: pd.DataFrame) -> None:
    df = serial_frame
    assert len(df) == 12 and list(df.columns) == list(COLUMNS)
    by = df.set_index(["schedule", "chunks", "memory_budget_mb"])["status"].astype(str)
    assert by[("1f1b", 2, 90000.0)] == "invalid" and by[("zb-h1", 2, 60000.0)] == "invalid"
    assert by[("interleaved", 2, 90000.0)] == "optimal" and by[("1f1b", 1, 90000.0)] == "optimal"
    assert by[("zb-h1", 1, 90000.0)] == "infeasible"
    assert (df.loc[df["memory_budget_mb"] == 60000, "status"].isin(["infeasible", "invalid"])).all()
    no_plan = df[df["status"].isin(["infeasible", "invalid"])]
    assert no_plan["error"].str.len().gt(10).all() and no_plan["step_time_ms"].isna().all()
    ok = df[df["status"] == "optimal"]
    assert (ok["peak_mb_max"] <= ok["memory_budget_mb"] + 1e-6).all()
    assert ok["peak_mb"].map(len).eq(4).all() and (ok["gap"] == 0).all()
    assert ((ok["bound_ms"] - ok["step_time_ms"]).abs() < 1e-6).all()
    assert ok["bubble_of_compute"].between(0, 1).all() and ok["recompute_ms"].ge(0).all()
    # the row is the plan: balance() directly, same options, gives the same figures
    from sapptk.balancer import balance

    plan = balance(DEMO, PipelineConfig(4, 8, chunks=2, schedule="interleaved", memory_budget=90000),
                   time_limit=REAL_LIMIT, workers=1, deterministic=True)
    sim = plan.simulate()
    row = ok[(ok["schedule"] == "interleaved") & (ok["chunks"] == 2)].iloc[0]
    assert row["step_time_ms"] == pytest.approx(plan.step_time) == pytest.approx(sim.step_time)
    assert row["peak_mb"] == pytest.approx(sim.peak_memory.tolist())
    assert row["bubble_of_compute"] == pytest.approx(sim.bubble.of_compute)
    assert row["recompute_ms"] == pytest.approx(plan.devices["recompute_ms"].sum() * 8)


def test_invalid_combinations_are_rows_not_exceptions() -> None:
    grid = [
        {"stages": 4, "micro_batches": 8, "schedule": "dualpipe-v", "chunks": 3},
        {"stages": 4, "micro_batches": 2},  # fewer micro-batches than stages
        {"stages": 4, "micro_batches": 8, "schedule": "no-such-schedule"},
        {"stages": 4, "micro_batches": 8, "recompute": ("select",), "memory_budget": 1e6},
        {"stages": 4, "micro_batches": 8, "memory_budget": 1000},
    ]
    df = sweep(DEMO, grid, point_time_limit=REAL_LIMIT, progress=False)
    assert df["status"].astype(str).tolist() == ["invalid", "invalid", "invalid", "optimal", "infeasible"]
    assert "chunks = 3" in df["error"].iloc[0] and "no-such-schedule" in df["error"].iloc[2]
    assert df["recompute"].astype(str).iloc[3] == "select"


@pytest.mark.slow
def test_processes_give_the_serial_frame(serial_frame: pd.DataFrame) -> None:
    df = sweep(DEMO, REAL, executor="processes", **REAL_OPTIONS)
    _agree(df, serial_frame)


@pytest.mark.slow
def test_dask_local_cluster_gives_the_serial_frame(serial_frame: pd.DataFrame) -> None:
    distributed = pytest.importorskip("distributed")
    with (
        distributed.LocalCluster(n_workers=2, processes=True, threads_per_worker=1, dashboard_address=None) as cluster,
        distributed.Client(cluster) as client,
    ):
        df = sweep(DEMO, REAL, executor=client, **REAL_OPTIONS)
    _agree(df, serial_frame)


@pytest.mark.slow
def test_real_cached_sweep_resumes_without_redoing_points(tmp_path: Path, serial_frame: pd.DataFrame) -> None:
    first = {**REAL, "memory_budget": [90000]}
    sweep(DEMO, first, solve=counting_solve, cache=tmp_path, **REAL_OPTIONS)
    assert len(CALLS) == 6 - 2  # 1f1b and zb-h1 with 2 chunks are refused before any solve
    CALLS.clear()
    df = sweep(DEMO, REAL, solve=counting_solve, cache=tmp_path, **REAL_OPTIONS)
    assert len(CALLS) == 6 - 2 and all(c.memory_budget == 60000 for c in CALLS)
    _agree(df, serial_frame)


# ------------------------------------------------------------------ rows that survive
def on_disk_solve(task: SweepTask) -> dict[str, Any]:
    """``fake_solve`` that first checks the cache (named by the profile name) holds one row per
    point finished before it."""
    rows = int(read_cache(task.profile_name)["status"].ne("invalid").sum())  # invalid points never reach a solve
    assert rows == len(CALLS), f"{len(CALLS)} points finished, {rows} rows on disk"
    return fake_solve(task)


def test_every_finished_row_is_on_disk_before_the_next_point_starts(tmp_path: Path) -> None:
    cache = tmp_path / "c"
    cache.mkdir()
    grid = {**GRID, "memory_budget": [40000]}
    df = sweep({str(cache): DEMO}, grid, solve=on_disk_solve, cache=cache, progress=False)
    assert len(CALLS) == 12 and not df["status"].eq("error").any(), df["error"].dropna().tolist()[:1]
    assert len(read_cache(cache)) == 16
    assert [p.name for p in cache.iterdir() if p.name.startswith("_journal")] == []  # the journal went with the sweep


def _write_part(path: Path, frame: pd.DataFrame) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)


def test_damaged_and_foreign_parts_are_skipped_with_a_warning(tmp_path: Path) -> None:
    from sapptk.errors import SapptkWarning

    cache = tmp_path / "c"
    first = sweep(DEMO, GRID, solve=fake_solve, cache=cache, progress=False)
    (good,) = cache.glob("part-*.parquet")
    # split the one good part in two, then damage one half: 24 good rows remain
    rows = pd.read_parquet(good)
    _write_part(cache / "part-1-a.parquet", rows.iloc[:24])
    (cache / "part-2-b.parquet").write_bytes(pd.DataFrame(rows.iloc[24:]).to_parquet()[:300])  # cut short
    good.unlink()
    _write_part(cache / "part-3-foreign.parquet", pd.DataFrame({"x": [1, 2]}))  # someone else's table
    (cache / "part-4-text.parquet").write_text("not parquet at all")
    (cache / "notes.txt").write_text("a file of the user's")  # ignored: not a part
    (cache / "part-5-dir.parquet").mkdir()  # ignored: not a file
    CALLS.clear()
    with pytest.warns(SapptkWarning) as caught:
        df = sweep(DEMO, GRID, solve=fake_solve, cache=cache, progress=False)
    said = " ".join(str(w.message) for w in caught)
    for name in ("part-2-b.parquet", "part-3-foreign.parquet", "part-4-text.parquet"):
        assert name in said, name
    assert "notes.txt" not in said and "part-1-a" not in said and "part-5-dir" not in said
    assert len(CALLS) == 24  # only the rows of the damaged half are recomputed
    pd.testing.assert_frame_equal(_outputs(df), _outputs(first))
    CALLS.clear()
    with pytest.warns(SapptkWarning):  # the damaged files stay (they are the user's to delete) ...
        again = sweep(DEMO, GRID, solve=fake_solve, cache=cache, progress=False)
    assert not CALLS  # ... and every row is cached now
    pd.testing.assert_frame_equal(_outputs(again), _outputs(first))
    assert (cache / "notes.txt").read_text() == "a file of the user's"


def test_read_cache_of_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    from sapptk.errors import FileError

    with pytest.raises(FileError, match="no such sweep cache folder"):
        read_cache(tmp_path / "nope")
    assert not (tmp_path / "nope").exists()


@pytest.fixture
def read_only_folder(tmp_path: Path):
    """A folder nobody can write in, for real: chmod, or (as root, who ignores modes) the
    immutable attribute; skipped where neither holds."""
    import shutil
    import subprocess

    folder = tmp_path / "ro"
    folder.mkdir()
    sweep(DEMO, SMALL, solve=fake_solve, cache=folder, progress=False)  # one cached row
    CALLS.clear()
    if os.geteuid() != 0:
        folder.chmod(0o555)
        undo = ["chmod", "755", str(folder)]
    elif shutil.which("chattr") and subprocess.run(["chattr", "+i", str(folder)], capture_output=True).returncode == 0:
        undo = ["chattr", "-i", str(folder)]
    else:
        pytest.skip("cannot make a read-only folder here")
    try:
        probe = folder / "probe"
        try:
            probe.touch()
        except OSError:
            pass
        else:
            pytest.skip("the folder is still writable")
        yield folder
    finally:
        subprocess.run(undo, check=False)


def test_a_read_only_cache_fails_before_any_solving_but_still_serves_its_rows(read_only_folder: Path) -> None:
    from sapptk.errors import FileError

    with pytest.raises(FileError, match="cannot write in the sweep cache folder"):
        sweep(DEMO, {**SMALL, "stages": [4, 2]}, solve=fake_solve, cache=read_only_folder, progress=False)
    assert not CALLS
    df = sweep(DEMO, SMALL, solve=fake_solve, cache=read_only_folder, progress=False)  # nothing to compute
    assert not CALLS and df["status"].tolist() == ["optimal"]


def test_a_read_only_cache_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sapptk.files as files_module
    from sapptk.errors import FileError

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files_module.tempfile, "mkstemp", refuse)
    with pytest.raises(FileError, match="cannot write in the sweep cache folder: permission denied"):
        sweep(DEMO, SMALL, solve=fake_solve, cache=tmp_path, progress=False)
    assert not CALLS


def test_a_full_disk_loses_no_row(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills after 5 rows and frees after 20: every row is returned, and every row is
    on disk in the end; when it never frees, a warning counts the rows left uncached."""
    import sapptk.sweeps.cache as cache_module
    from sapptk.errors import SapptkWarning

    real_write = os.write
    writes = [0]

    def filling_write(fd: int, data: bytes) -> int:
        writes[0] += 1
        if 5 < writes[0] <= 20:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(cache_module.os, "write", filling_write)
    with pytest.warns(SapptkWarning, match="No space left on device"):
        df = sweep(DEMO, GRID, solve=fake_solve, cache=tmp_path / "a", progress=False)
    assert len(df) == 48 and df["status"].ne("error").all()
    assert len(read_cache(tmp_path / "a")) == 48

    monkeypatch.setattr(cache_module.os, "write", lambda fd, data: (_ for _ in ()).throw(OSError(28, "No space")))
    monkeypatch.setattr(cache_module.Cache, "_write_rows", lambda self, rows: None)  # parts cannot be written either
    CALLS.clear()
    with pytest.warns(SapptkWarning) as caught:
        df = sweep(DEMO, GRID, solve=fake_solve, cache=tmp_path / "b", progress=False)
    assert any("48 finished row(s) could not be written" in str(w.message) for w in caught)
    assert len(df) == 48 and len(CALLS) == 36 and df["status"].ne("error").all()


KILLED_SWEEP = """
import sys, time
from pathlib import Path
from sapptk.profile import bundled_profile
from sapptk.sweeps import sweep

def solve(task):
    marks = Path(task.profile_name)
    (marks / f"started-{task.request.config.micro_batches}").touch()
    time.sleep(0.6)
    return {"status": "optimal", "step_time_ms": float(task.request.config.micro_batches)}

if __name__ == "__main__":
    marks, cache, executor = sys.argv[1:]
    sweep({marks: bundled_profile("demo")}, {"stages": [4], "micro_batches": list(range(8, 20))}, solve=solve,
          executor=executor, cache=cache, progress=False)
"""


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("executor", ["serial", "processes"])
def test_sigkill_loses_no_finished_row_and_leaves_no_process(tmp_path: Path, executor: str) -> None:
    import signal
    import subprocess
    import sys

    script, marks, cache = tmp_path / "killed.py", tmp_path / "marks", tmp_path / "cache"
    script.write_text(KILLED_SWEEP)
    marks.mkdir()
    proc = subprocess.Popen([sys.executable, str(script), str(marks), str(cache), executor],
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_until(lambda: len(list(marks.glob("started-*"))) >= 4, 120), "the sweep did not get going"
        family = descendants(proc.pid)
        started = len(list(marks.glob("started-*")))
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    left = [pid for pid in family if not wait_until(lambda pid=pid: process_gone(pid), 60)]
    assert not left, f"processes outlived the killed sweep: {left}"
    rows = read_cache(cache)
    if executor == "serial":  # a point starts only after the row before it is on disk
        assert len(rows) >= started - 1
    assert len(rows) >= 1 and rows["status"].eq("optimal").all()
    CALLS.clear()
    df = sweep({str(marks): DEMO}, {"stages": [4], "micro_batches": list(range(8, 20))}, solve=fake_solve,
               cache=cache, progress=False)
    assert len(CALLS) == 12 - len(rows) and len(df) == 12
    assert not list(cache.glob("_journal-*")) and len(list(cache.glob("part-*"))) == 1  # the journal was merged


UNGUARDED_SCRIPT = """
from sapptk.profile import bundled_profile
from sapptk.sweeps import sweep

def solve(task):
    return {"status": "optimal", "step_time_ms": 1.0}

frame = sweep(bundled_profile("demo"), {"stages": [4], "micro_batches": [8, 9]}, solve=solve, executor="processes",
              progress=False)
print(frame["error"].iloc[0])
"""


@pytest.mark.slow
def test_a_script_without_a_main_guard_is_named_as_the_cause(tmp_path: Path) -> None:
    import multiprocessing
    import subprocess
    import sys

    if not {"forkserver", "spawn"} & set(multiprocessing.get_all_start_methods()):
        pytest.skip("workers are forked here: no guard needed")
    script = tmp_path / "no_guard.py"
    script.write_text(UNGUARDED_SCRIPT)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    message = done.stdout.strip().splitlines()[-1]
    assert "no_guard.py has no `if __name__ == \"__main__\":` guard" in message
    assert "solver" not in message


@pytest.mark.slow
def test_an_unreachable_dask_scheduler_fails_at_once(tmp_path: Path) -> None:
    import socket

    pytest.importorskip("distributed")
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(SapptkError, match=rf"no Dask scheduler answered at tcp://127.0.0.1:{port} within 5 s"):
        sweep(DEMO, SMALL, solve=fake_solve, executor=f"dask://127.0.0.1:{port}", cache=tmp_path, progress=False)
    assert not CALLS
    with pytest.raises(ConfigError, match="HOST:PORT"):
        sweep(DEMO, SMALL, solve=fake_solve, executor="dask://nowhere", progress=False)


def test_the_progress_bar_of_a_resumed_sweep_counts_the_cached_points(tmp_path: Path, monkeypatch) -> None:
    import tqdm.auto

    postfixes: list[dict[str, int]] = []

    class Bar(tqdm.auto.tqdm):
        def set_postfix(self, ordered_dict=None, refresh=True, **kwargs):
            postfixes.append(dict(ordered_dict or {}))
            return super().set_postfix(ordered_dict, refresh=refresh, **kwargs)

    monkeypatch.setattr(tqdm.auto, "tqdm", Bar)
    cache = tmp_path / "sweep.parquet"
    sweep(DEMO, SMALL, solve=fake_solve, cache=cache, progress=False)
    postfixes.clear()
    df = sweep(DEMO, {**SMALL, "micro_batches": [8, 16]}, solve=fake_solve, cache=cache, progress=False)
    assert sum(postfixes[0].values()) == 1  # the cached point, before any new one
    assert sum(postfixes[-1].values()) == len(df) == 2  # every point on the bar, by status
    assert postfixes[-1] == df["status"].astype(str).value_counts().to_dict()
