"""Stage contents and device layouts: the polynomial enumeration equals brute force, the caps
hold, and the local search's known-path filter is a true lower bound."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from support import random_counts, small_profile

from sapptk.config import PipelineConfig
from sapptk.costs import layer_coefficients
from sapptk.profile import MODES
from sapptk.solver.clock import Clock
from sapptk.solver.incumbent import Incumbent
from sapptk.solver.layouts import TooManyLayouts, device_layouts, stage_options
from sapptk.solver.local_search import LocalSearch
from sapptk.solver.paths import path_model, stage_cost_vector
from sapptk.solver.problem import make_problem
from sapptk.solver.settings import SearchOptions


def brute_force_contents(coef, n_max):
    """Every stage content (layers per group and mode) whose groups are consecutive, the ones
    between the first and the last whole, and its Pareto front in (backward, activation)."""
    G, R = coef.allowed.shape
    fronts = {}
    for lo in range(G):
        for hi in range(lo, G):
            ranges = []
            for g in range(lo, hi + 1):
                whole = lo < g < hi
                ranges.append([int(coef.counts[g])] if whole else range(1, int(n_max[g]) + 1))
            for ns in itertools.product(*ranges):
                if any(n > n_max[g] for g, n in zip(range(lo, hi + 1), ns, strict=True)):
                    continue
                comp = [0] * G
                comp[lo : hi + 1] = ns
                points = set()
                per_group = []
                for g, n in zip(range(lo, hi + 1), ns, strict=True):
                    modes = np.flatnonzero(coef.allowed[g])
                    per_group.append([m for m in itertools.combinations_with_replacement(modes.tolist(), n)])
                for choice in itertools.product(*per_group):
                    if any(MODES.index("select") in c and MODES.index("comm") in c for c in choice):
                        continue
                    b = sum(int(coef.backward[g, r]) for g, c in zip(range(lo, hi + 1), choice, strict=True)
                            for r in c)
                    a = sum(int(coef.activation[g, r]) for g, c in zip(range(lo, hi + 1), choice, strict=True)
                            for r in c)
                    points.add((b, a))
                front = {(b, a) for b, a in points if not any(b2 <= b and a2 <= a and (b2, a2) != (b, a)
                                                             for b2, a2 in points)}
                fronts[tuple(comp)] = front
    return fronts


@pytest.mark.parametrize("layers", [(1, 1, 1, 1), (2, 3, 1), (3, 2)])
def test_stage_contents_equal_brute_force(layers, rng):
    prof = small_profile(rng, groups=len(layers), layers=layers)
    cfg = PipelineConfig(2, 4, 1, "1f1b")
    coef = layer_coefficients(prof, cfg)
    n_max = np.minimum(coef.counts, 3)
    options = stage_options(coef, n_max)
    got: dict[tuple, set] = {}
    for comp, b, a in zip(options.comp.tolist(), options.backward.tolist(), options.activation.tolist(),
                          strict=True):
        if any(comp):
            got.setdefault(tuple(comp), set()).add((b, a))
    want = brute_force_contents(coef, n_max)
    assert got == want
    # each content's mix adds up to its composition and its costs
    mix = options.mix
    assert np.array_equal(mix.sum(axis=2), options.comp)
    assert np.array_equal(np.einsum("kgr,gr->k", mix, coef.backward), options.backward)
    pairs = set(zip(options.comp_id.tolist(), map(tuple, options.comp.tolist()), strict=True))
    assert len(pairs) == len(set(options.comp_id.tolist()))  # one composition per id


def test_per_layer_stage_contents_are_polynomial():
    """40 groups of one layer: contents are (first layer, how many) pairs, not 2^40."""
    from support import two_mode_profile

    prof = two_mode_profile((1,) * 40)
    coef = layer_coefficients(prof, PipelineConfig(4, 8, 2, "interleaved"))
    options = stage_options(coef, coef.counts, work_cap=int(6 * (coef.forward.max() + coef.backward.max())))
    compositions = {tuple(c) for c in options.comp.tolist()}
    most = max(sum(c) for c in compositions)
    assert 3 <= most <= 12
    assert len(compositions) <= 40 * most + 1  # (first layer, how many), and the empty content


def test_enumeration_caps_raise_instead_of_allocating(rng):
    prof = small_profile(rng, groups=2, layers=(6, 6))
    cfg = PipelineConfig(2, 4, 2, "interleaved")
    coef = layer_coefficients(prof, cfg)
    with pytest.raises(TooManyLayouts):
        stage_options(coef, coef.counts, max_bytes=10)
    options = stage_options(coef, coef.counts)
    program = cfg.program()
    with pytest.raises(TooManyLayouts):
        device_layouts(coef, program, options, ub=None, budget=None, allow_empty=False, max_partial=5)
    with pytest.raises(TooManyLayouts):
        device_layouts(coef, program, options, ub=None, budget=None, allow_empty=False, max_bytes=10)
    with pytest.raises(TooManyLayouts):
        device_layouts(coef, program, options, ub=None, budget=None, allow_empty=False, deadline=0.0)


def test_known_path_bound_never_exceeds_the_step(rng):
    """The local search skips a neighbour only when a known path proves it no faster."""
    prof = small_profile(rng, groups=2, layers=(3, 4))
    cfg = PipelineConfig(2, 4, 2, "interleaved", comm=0.02)
    problem = make_problem(prof, cfg, allow_empty=False, options=SearchOptions())
    clock = Clock(30.0)
    incumbent = Incumbent(problem, clock)
    counts = [random_counts(rng, prof, cfg) for _ in range(6)]
    incumbent.evaluate(counts)  # their critical paths become known
    options = stage_options(problem.coef, problem.coef.counts)
    layouts = device_layouts(problem.coef, problem.program, options, ub=None, budget=None, allow_empty=False)
    search = LocalSearch(problem, incumbent, layouts, clock=clock, seed=0, deterministic=True)
    picks = np.stack([np.array([rng.integers(len(lay)) for lay in layouts]) for _ in range(40)])
    costs = search.costs(picks)
    assert (search.path_bound(costs) <= problem.step_ticks(costs)).all()
    # and the costs of a state are those of its counts
    paths = path_model(problem.program)
    for pick, cost in zip(picks[:5], costs[:5], strict=True):
        assert np.array_equal(cost, stage_cost_vector(problem.coef, search.counts_of(pick)))
    assert paths is problem.paths


def test_the_layout_pareto_filters_against_their_definitions(rng):
    from sapptk.solver.layouts import _pareto_2d, _pareto_groups

    for _ in range(20):
        n = int(rng.integers(1, 40))
        b, a = rng.integers(0, 6, n), rng.integers(0, 6, n)
        keep = _pareto_2d(b, a).tolist()
        want = [i for i in range(n)
                if not any((b[j] <= b[i] and a[j] <= a[i] and (b[j], a[j]) != (b[i], a[i]))
                           or ((b[j], a[j]) == (b[i], a[i]) and j < i) for j in range(n))]
        assert sorted(keep) == want
        assert keep == sorted(keep, key=lambda i: (b[i], a[i], i))  # lowest backward first
        key, back = rng.integers(0, 3, n), rng.integers(0, 4, (n, 3))
        want = [i for i in range(n)
                if not any(key[j] == key[i] and ((back[j] <= back[i]).all() and (back[j] < back[i]).any()
                                                 or ((back[j] == back[i]).all() and j < i)) for j in range(n))]
        assert _pareto_groups(key, back).tolist() == want


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["1f1b", "interleaved", "zb-v", "dualpipe-v"])
def test_device_layouts_equal_the_full_product(schedule, rng):
    """Each device's layouts: every combination of stage contents that fits the budget and the
    chain bound, Pareto-reduced per composition — computed here by brute force."""
    from support import peaks_mb

    from sapptk.pareto import pareto_front

    prof = small_profile(rng, groups=2, layers=(3, 4))
    chunks = 1 if schedule == "1f1b" else 2
    cfg = PipelineConfig(2, 4, chunks, schedule, comm=0.01)
    samples = [peaks_mb(cfg, prof, random_counts(rng, prof, cfg)).max() for _ in range(6)]
    cfg = cfg.replace(memory_budget=float(np.median(samples)))
    problem = make_problem(prof, cfg, allow_empty=False, options=SearchOptions())
    coef, program, mem = problem.coef, problem.program, problem.memory
    options = stage_options(coef, coef.counts)
    steps = problem.step_ticks(problem.cost_vectors([random_counts(rng, prof, cfg) for _ in range(4)]))
    ub = int(np.median(steps))
    got = device_layouts(coef, program, options, ub=ub, budget=problem.budget, allow_empty=False)
    paths = problem.paths
    V = len(coef.fixed_forward)
    for d, stages in enumerate(program.device_stages):
        sig = paths.device_sig[d]
        rows = []
        for combo in itertools.product(range(len(options)), repeat=len(stages)):
            if any(coef.fixed_layers[vs] == 0 and options.comp[o].sum() == 0 for o, vs in zip(combo, stages,
                                                                                              strict=True)):
                continue
            f = [int(options.forward[o] + coef.fixed_forward[vs]) for o, vs in zip(combo, stages, strict=True)]
            b = [int(options.backward[o] + coef.fixed_backward[vs]) for o, vs in zip(combo, stages, strict=True)]
            w = [int(options.weight[o] + coef.fixed_weight[vs]) for o, vs in zip(combo, stages, strict=True)]
            chain = sum(int(sig[vs]) * f[c] + int(sig[V + vs]) * b[c] + int(sig[2 * V + vs]) * w[c]
                        for c, vs in enumerate(stages))
            if chain > ub:
                continue
            act = np.array([int(options.activation[o] + coef.fixed_activation[vs]) for o, vs in zip(combo, stages,
                                                                                                     strict=True)])
            static = coef.constant + sum(int(options.params[o] + coef.fixed_params[vs])
                                         for o, vs in zip(combo, stages, strict=True))
            peak = mem.scale * static + max((int(r @ act) for r in mem.rows[d]), default=0)
            if peak <= problem.budget:
                comp = tuple(options.comp_id[o] for o in combo)
                rows.append((comp, tuple(b), tuple(options.mix[o].tobytes() for o in combo)))
        if not rows:
            assert len(got[d]) == 0
            continue
        keys = np.unique([r[0] for r in rows], axis=0, return_inverse=True)[1].ravel()
        keep = pareto_front(np.array([r[1] for r in rows]), groups=keys)
        want = sorted({(r[1], r[2]) for r in (rows[i] for i in keep)})
        lay = got[d]
        have = sorted({(tuple(int(x) for x in lay.backward[k]), tuple(m.tobytes() for m in lay.mix[k]))
                       for k in range(len(lay))})
        assert have == want
