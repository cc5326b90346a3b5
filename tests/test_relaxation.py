"""The LP relaxation's bound: never above the exhaustive optimum, exact when there is no choice,
its paths real, and its dynamic program equal to brute force."""

from __future__ import annotations

import dataclasses
import itertools
import time

import numpy as np
import pytest
from support import EXHAUSTIVE, all_assignments, fast_step, peaks_mb, two_mode_profile

from sapptk.config import PipelineConfig
from sapptk.costs import TIME_UNIT_MS, layer_coefficients
from sapptk.profile import MODES
from sapptk.schedules import names
from sapptk.solver.layouts import device_layouts, stage_options
from sapptk.solver.masters import LayoutMaster
from sapptk.solver.paths import path_model, stage_cost_vector
from sapptk.solver.problem import make_problem
from sapptk.solver.relaxation import lagrangian_bound, relax
from sapptk.solver.settings import SearchOptions


def setup(schedule: str, p: int, m: int, v: int, k: int, quantile: float = 0.3):
    """The exhaustive-test problem: config with a binding budget, every fitting assignment and its step."""
    prof = two_mode_profile((3, 5))
    base = PipelineConfig(p, m, v, schedule, splits=k, comm=0.01)
    candidates = list(all_assignments(prof, base, (MODES.index("none"), MODES.index("full"))))
    peaks = np.array([peaks_mb(base, prof, c).max() for c in candidates])
    budget = float(np.quantile(peaks, quantile))
    cfg = base.replace(memory_budget=budget)
    fitting = [c for c, pk in zip(candidates, peaks, strict=True) if pk <= budget + 1e-9]
    return prof, cfg, fitting


class Built:
    """The problem and the layout master the search would build (no incumbent bound)."""

    def __init__(self, prof, cfg) -> None:
        self.problem = make_problem(prof, cfg, allow_empty=False, options=SearchOptions())
        self.coef, self.paths, self.program = self.problem.coef, self.problem.paths, self.problem.program
        self.comm_ticks = self.problem.comm_ticks
        layouts = device_layouts(self.coef, self.program, stage_options(self.coef, self.coef.counts), ub=None,
                                 budget=self.problem.budget, allow_empty=False)
        self.master = LayoutMaster(self.coef, self.program, self.comm_ticks, layouts)


def search_for(prof, cfg) -> Built:
    return Built(prof, cfg)


def seeds(s: Built) -> list[tuple[np.ndarray, int]]:
    return [(s.paths.device_sig[d], 0) for d in range(s.program.stages)]


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "p", "m", "v", "k"), EXHAUSTIVE, ids=[e[0] for e in EXHAUSTIVE])
def test_bound_never_exceeds_the_exhaustive_optimum(schedule, p, m, v, k):
    if schedule not in names():
        pytest.skip(f"{schedule} is not registered")
    prof, cfg, fitting = setup(schedule, p, m, v, k)
    s = search_for(prof, cfg)
    best = min(fast_step(cfg, prof, c) for c in fitting)  # ms
    best_ticks = round(best / TIME_UNIT_MS * s.program.splits)
    res = relax(s.coef, s.paths, s.master.layouts, s.comm_ticks, seeds(s), until=time.perf_counter() + 30)
    assert res.converged
    assert 0 < res.bound <= best_ticks
    # every path it generated is a real path: at the optimum's durations none is longer than the step
    opt = min(fitting, key=lambda c: fast_step(cfg, prof, c))
    cost = stage_cost_vector(s.coef, opt)
    for sig, cross in res.cuts:
        assert int(sig @ cost) + cross * s.comm_ticks <= best_ticks


@pytest.mark.slow
def test_bound_from_a_relaxation_cut_short_is_still_a_bound():
    """Out of time after the first LP: the bound comes from that LP's duals, and is still valid."""
    prof, cfg, fitting = setup("interleaved", 2, 3, 2, 1)
    s = search_for(prof, cfg)
    best_ticks = round(min(fast_step(cfg, prof, c) for c in fitting) / TIME_UNIT_MS)
    full = relax(s.coef, s.paths, s.master.layouts, s.comm_ticks, seeds(s), until=time.perf_counter() + 30)
    short = relax(s.coef, s.paths, s.master.layouts, s.comm_ticks, seeds(s), until=time.perf_counter())
    assert short.iterations == 1 and not short.cuts
    assert 0 < short.bound <= full.bound <= best_ticks


def only(layouts, pick: list[int]):
    """The layouts reduced to one per device (index ``pick[d]``)."""
    out = []
    for lay, o in zip(layouts, pick, strict=True):
        sel = np.array([o])
        out.append(dataclasses.replace(
            lay, comp=lay.comp[sel], mix=lay.mix[sel], forward=lay.forward[sel], backward=lay.backward[sel],
            weight=lay.weight[sel], overhead=lay.overhead[sel], deviation=lay.deviation[sel], chain=lay.chain[sel],
        ))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "dualpipe-v", "zb-v"])
def test_bound_is_exact_without_a_choice(schedule):
    """One layout per device: the relaxation is the plan itself, and its bound its exact step time."""
    spec = EXHAUSTIVE[[e[0] for e in EXHAUSTIVE].index(schedule)]
    prof, cfg, fitting = setup(*spec)
    s = search_for(prof, cfg)
    rng = np.random.default_rng(3)
    checked = 0
    for counts in [fitting[int(i)] for i in rng.choice(len(fitting), size=min(4, len(fitting)), replace=False)]:
        pick = [lay.find(s.coef, counts) for lay in s.master.layouts]
        if any(o is None for o in pick):
            continue  # dominated on some device: its Pareto layout is another plan
        layouts = only(s.master.layouts, pick)
        step = int(s.paths.steps(stage_cost_vector(s.coef, s.master.counts_of(
            [int(i == o) for lay, o in zip(s.master.layouts, pick, strict=True) for i in range(len(lay))]))[None, :],
            s.coef.comm)[0])
        res = relax(s.coef, s.paths, layouts, s.comm_ticks, seeds(s), until=time.perf_counter() + 30)
        assert res.converged
        assert res.bound == step
        checked += 1
    assert checked

@pytest.mark.slow
def test_lagrangian_bound_equals_brute_force():
    """The dynamic program over devices is the minimum over every integer plan of the weighted paths."""
    prof = two_mode_profile((2, 3))
    cfg = PipelineConfig(2, 3, 2, "interleaved", comm=0.01)
    coef = layer_coefficients(prof, cfg)
    program = cfg.program()
    layouts = device_layouts(coef, program, stage_options(coef, coef.counts), ub=None, budget=None, allow_empty=False)
    paths = path_model(program)
    rng = np.random.default_rng(11)
    sigs = np.stack([paths.device_sig[0], paths.device_sig[1], paths.unit_sig.sum(axis=0) // 3])
    crossings = np.array([0, 0, 2])
    comm_ticks = int(coef.comm * program.splits)
    for _ in range(5):
        w = rng.uniform(0, 1, size=len(sigs))
        got = lagrangian_bound(layouts, coef.counts, sigs, crossings, comm_ticks, w)
        want = np.inf
        for pick in itertools.product(*(range(len(lay)) for lay in layouts)):
            tot = sum(lay.comp[o].sum(axis=0) for lay, o in zip(layouts, pick, strict=True))
            if not np.array_equal(tot, coef.counts):
                continue
            value = 0.0
            for sig, cross, wi in zip(sigs, crossings, w / w.sum(), strict=True):
                V = len(sig) // 3
                length = cross * comm_ticks
                for lay, o in zip(layouts, pick, strict=True):
                    st = np.asarray(lay.stages)
                    length += lay.forward[o] @ sig[st] + lay.backward[o] @ sig[V + st] + lay.weight[o] @ sig[2 * V + st]
                value += wi * length
            want = min(want, value)
        assert got == pytest.approx(want, rel=1e-12)
