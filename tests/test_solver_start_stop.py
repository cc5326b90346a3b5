"""``start`` seeds the search (never a slower answer than the start when it fits), and
``stop`` ends the search with the best plan so far."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from support import all_assignments, fast_step, peaks_mb, two_mode_profile

from sapptk.balancer import balance
from sapptk.baselines import distinct_recomputes
from sapptk.config import PipelineConfig
from sapptk.plan import even_split, make_plan
from sapptk.profile import MODES, bundled_profile


def stopped_event() -> threading.Event:
    event = threading.Event()
    event.set()
    return event


def exhaustive(prof, cfg):
    """(step ms, counts) of every assignment that fits, fastest first."""
    out = []
    for c in all_assignments(prof, cfg, (MODES.index("none"), MODES.index("full"))):
        if peaks_mb(cfg, prof, c).max() <= cfg.memory_budget + 1e-9:
            out.append((fast_step(cfg, prof, c), c))
    return sorted(out, key=lambda t: t[0])


@pytest.mark.slow
def test_a_start_plan_is_used_even_when_the_search_is_stopped_at_once():
    """Stopped before it starts, the search still returns the best of its seeds: the start
    plan (better than every even split here) proves it was used."""
    prof = two_mode_profile((3, 5))
    cfg = PipelineConfig(3, 4, 1, "1f1b", comm=0.01)
    peaks = sorted(peaks_mb(cfg, prof, c).max()
                   for c in all_assignments(prof, cfg, (MODES.index("none"), MODES.index("full"))))
    cfg = cfg.replace(memory_budget=float(np.quantile(peaks, 0.5)))
    best_step, best_counts = exhaustive(prof, cfg)[0]
    evens = [p.step_time for p in [even_split(prof, cfg, m) for m in distinct_recomputes(prof, cfg)] if p.fits]
    assert not evens or min(evens) > best_step + 1e-6  # else the test could not tell

    start = make_plan(prof, cfg, best_counts, status="given")
    plan = balance(prof, cfg, start=start, stop=stopped_event())
    assert plan.status in ("feasible", "optimal")
    assert plan.status == "optimal" or plan.message.startswith("stopped")
    assert plan.step_time == pytest.approx(best_step, abs=1e-6)
    assert plan.fits
    # without the start, the stopped search has only the even splits
    alone = balance(prof, cfg, stop=stopped_event())
    assert alone.step_time is None or alone.step_time > best_step + 1e-6


@pytest.mark.slow
def test_a_larger_budget_is_never_slower_than_its_start(rng):
    """Each budget of a rising series seeded with the last plan: the step never rises."""
    prof = two_mode_profile((4, 4))
    cfg = PipelineConfig(3, 6, 2, "interleaved", comm=0.01)
    candidates = [c for c in all_assignments(prof, cfg, (MODES.index("none"), MODES.index("full")))]
    idx = rng.choice(len(candidates), size=min(60, len(candidates)), replace=False)
    peaks = sorted(peaks_mb(cfg, prof, candidates[i]).max() for i in idx)
    budgets = [float(np.quantile(peaks, q)) for q in (0.2, 0.5, 0.9)]
    previous = None
    for budget in budgets:
        plan = balance(prof, cfg.replace(memory_budget=budget), start=previous, time_limit=0.5, seed=1)
        if previous is not None and previous.solved:
            assert plan.solved and plan.step_time <= previous.step_time + 1e-9
        if plan.solved:
            assert plan.step_time == pytest.approx(plan.simulate().step_time, abs=1e-6)
            previous = plan


def test_a_start_plan_that_does_not_fit_is_ignored_with_a_note():
    prof = two_mode_profile((3, 5))
    cfg = PipelineConfig(3, 4, 1, "1f1b")
    loose = even_split(prof, cfg, "none")  # all "none"
    tight = cfg.replace(memory_budget=float(loose.simulation.peak_memory.max()) - 1.0)
    plan = balance(prof, tight, start=loose, time_limit=5, deterministic=True)
    assert "start plan does not fit" in plan.message
    assert plan.fits


@pytest.mark.slow
def test_stop_from_another_thread_returns_the_best_plan_so_far():
    """The README case with a long limit, stopped after a moment: a real plan comes back,
    and the message says the search was stopped (not that the limit was reached)."""
    prof = bundled_profile("llama2_70b")
    cfg = PipelineConfig(16, 32, 2, "interleaved", memory_budget=56000)
    stop = threading.Event()
    timer = threading.Timer(1.5, stop.set)
    timer.start()
    try:
        plan = balance(prof, cfg, time_limit=120, stop=stop)
    finally:
        timer.cancel()
    assert plan.status == "feasible", plan.message
    assert plan.message.startswith("stopped")
    assert plan.fits and plan.step_time == pytest.approx(plan.simulate().step_time, abs=1e-6)
    assert plan.bound is not None and plan.bound <= plan.step_time


@pytest.mark.slow
def test_a_one_second_limit_returns_a_plan_when_an_even_split_fits():
    prof = bundled_profile("llama2_70b")
    cfg = PipelineConfig(16, 32, 2, "interleaved", memory_budget=56000)
    assert any(p.fits for p in [even_split(prof, cfg, m) for m in distinct_recomputes(prof, cfg)])
    plan = balance(prof, cfg, time_limit=1)
    assert plan.status in ("feasible", "optimal"), plan.message
    assert plan.fits


# ------------------------------------------------------------------ stall_time
def test_the_clock_stalls_only_after_a_plan_and_a_quiet_spell():
    import time

    from sapptk.solver.clock import Clock

    clock = Clock(60.0, stall=0.05)
    time.sleep(0.06)
    assert not clock.stalled and not clock.expired()  # no plan yet: no stall
    clock.progress()
    assert not clock.stalled and clock.remaining() > 50
    time.sleep(0.06)
    assert clock.stalled and clock.expired() and clock.remaining() == 0.0
    clock.progress()  # an improvement starts the count again
    assert not clock.stalled
    assert not Clock(60.0).stalled


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "3", True])
def test_stall_time_refuses_what_is_not_seconds(bad):
    from sapptk.errors import ConfigError
    from sapptk.solver.settings import SearchOptions

    prof = two_mode_profile((3, 5))
    with pytest.raises(ConfigError, match="stall_time"):
        balance(prof, PipelineConfig(3, 4, 1, "1f1b"), time_limit=1, stall_time=bad)
    with pytest.raises(ConfigError, match="SearchOptions.stall_time"):
        SearchOptions(stall_time=bad)


@pytest.mark.slow
def test_stall_time_ends_a_search_that_no_longer_improves(llama):
    """The notebooks' two-chunk case: without it the search spends its whole limit on a plan
    it found in seconds; with it the call returns the same kind of plan well before."""
    import time

    config = PipelineConfig(stages=16, micro_batches=32, chunks=2, schedule="interleaved", memory_budget=56000)
    began = time.perf_counter()
    plan = balance(llama, config, time_limit=60, stall_time=2)
    seconds = time.perf_counter() - began
    assert plan.solved and plan.fits
    assert seconds < 40, seconds  # 6 s unloaded; far below the 60 s limit
    if plan.status == "feasible":
        assert "no better plan for 2 s (stall_time)" in plan.message
