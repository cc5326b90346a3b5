"""sapptk.choose: proven bounds (against exhaustive optima and the balancer), pruning, the
ranked frame, the winner against brute force, bad input at the boundary."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd
import pytest
from support import EXHAUSTIVE, all_assignments, exhaustive_cases, fast_step, peaks_mb, small_profile, two_mode_profile

import sapptk
from sapptk.choosing.bounds import SetupBound, pipeline_bound
from sapptk.choosing.integer_bound import integer_bound
from sapptk.choosing.layout_bound import chain_minmax, fill_drain, layout_bound
from sapptk.choosing.run import STEPS
from sapptk.choosing.setups import dp_sync_ms, enumerate_setups
from sapptk.config import PipelineConfig
from sapptk.costs import TIME_UNIT_MS
from sapptk.errors import ConfigError
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile


def _optimum(profile: Profile, config: PipelineConfig) -> float:
    """The least simulated step time over every assignment that fits (inf when none does)."""
    best = math.inf
    for counts in all_assignments(profile, config, (MODES.index("none"), MODES.index("full"))):
        if config.memory_budget is not None and (peaks_mb(config, profile, counts) > config.memory_budget).any():
            continue
        best = min(best, fast_step(config, profile, counts))
    return best


@pytest.mark.slow
@pytest.mark.parametrize(("schedule", "p", "m", "v", "k"), EXHAUSTIVE)
def test_bounds_never_exceed_the_exhaustive_optimum(schedule: str, p: int, m: int, v: int, k: int) -> None:
    profile = two_mode_profile((4, 3) if v == 1 else (3, 3))
    free = PipelineConfig(p, m, v, schedule, splits=k, recompute=("none", "full"), comm=0.05)
    peaks = [peaks_mb(free, profile, c).max() for c in all_assignments(profile, free, (0, MODES.index("full")))]
    lo, hi = min(peaks), max(peaks)
    for budget in (None, lo * 0.9, lo + 0.25 * (hi - lo), lo + 0.6 * (hi - lo)):
        config = free.replace(memory_budget=budget)
        best = _optimum(profile, config)
        bound = pipeline_bound(profile, config)
        if bound.infeasible:
            assert best == math.inf, (budget, bound)
            continue
        assert bound.bound_ms <= best + 1e-9, (budget, bound.bound_ms, best)
        tight = integer_bound(profile, config, bound, time_limit=0.5)
        if tight.infeasible:
            assert best == math.inf
        else:
            assert bound.bound_ms <= tight.bound_ms <= best + 1e-9, (budget, tight.bound_ms, best)
        if best < math.inf:  # whole layouts below an incumbent: at most the optimum, or the incumbent
            for ub in (10 * best, best, 0.97 * best):
                layouts = layout_bound(profile, config, bound, ub, time_limit=5.0)
                assert layouts is not None and bound.bound_ms <= layouts.bound_ms <= min(best, max(
                    _tick_up(ub, config), bound.bound_ms)) + 1e-9, (budget, ub, layouts, best)


@pytest.mark.slow
def test_bound_below_the_balancers_plans_on_random_setups(rng: np.random.Generator) -> None:
    schedules = ["1f1b", "gpipe", "interleaved", "interleaved-lm", "zb-h1", "zb-v", "dualpipe-v", "interleaved-zb"]
    for trial in range(10):
        profile = small_profile(rng, groups=2, layers=(int(rng.integers(3, 7)), int(rng.integers(3, 8))))
        schedule = schedules[trial % len(schedules)]
        spec = sapptk.schedules.get(schedule)
        v = 1 if spec.chunks == (1,) else 2
        p = int(rng.integers(2, 4))
        m = max(spec.min_micro_batches(p, v), p) + int(rng.integers(0, 4))
        free = PipelineConfig(p, m, v, schedule, comm=float(rng.uniform(0, 0.1)), constant_memory=1.0)
        plan = sapptk.balance(profile, free, time_limit=1)
        budget = float(plan.simulate().peak_memory.max()) * float(rng.uniform(0.55, 1.0))
        config = free.replace(memory_budget=budget)
        plan = sapptk.balance(profile, config, time_limit=1)  # any plan that fits: the bound is below it
        bound = pipeline_bound(profile, config)
        if not plan.solved:
            continue
        assert not bound.infeasible, (trial, schedule, bound)
        tight = integer_bound(profile, config, bound, time_limit=1.0)
        assert bound.bound_ms <= tight.bound_ms <= plan.step_time + 1e-9, (trial, schedule)


@pytest.mark.slow
def test_layout_bound_never_exceeds_the_exhaustive_optimum(rng: np.random.Generator) -> None:
    """Random profiles (two groups, modes none and full), every exhaustive schedule, three
    budgets, three incumbents: about 200 cases, each against the least simulated step time
    of every assignment."""
    cases = gains = 0
    for trial, profile, free, found in exhaustive_cases(rng, 24):
        lo, hi = found[:, 1].min(), found[:, 1].max()
        for budget in (None, lo + float(rng.uniform(0, 1)) * (hi - lo), 0.95 * lo):
            config = free.replace(memory_budget=budget)
            fits = found[:, 1] <= (math.inf if budget is None else budget)
            best = float(found[fits, 0].min()) if fits.any() else math.inf
            start = pipeline_bound(profile, config)
            if start.infeasible:
                assert best == math.inf
                continue
            for ub in (10 * best if best < math.inf else 1e6, best, 0.98 * best):
                if not math.isfinite(ub):
                    continue
                tight = layout_bound(profile, config, start, ub, time_limit=5.0)
                assert tight is not None
                cap = max(_tick_up(ub, config), start.bound_ms)
                assert start.bound_ms <= tight.bound_ms <= min(best, cap) + 1e-9, (
                    trial, free.schedule, budget, ub, tight.bound_ms, best)
                cases += 1
                gains += tight.bound_ms > start.bound_ms + 1e-6
    assert cases >= 150 and gains >= cases // 4


def _tick_up(ub_ms: float, config: PipelineConfig) -> float:
    """``ub_ms`` rounded up to a whole tick of the config's time unit (a layout bound's cap)."""
    tick = TIME_UNIT_MS / config.splits
    return math.ceil(ub_ms / tick - 1e-9) * tick


def _uniform(layers: int, fwd: float = 1.0) -> Profile:
    body = LayerGroup("body", "body", layers, fwd, 1.0, {"none": ModeCost(2 * fwd, 1.0)})
    return Profile("uniform", (body,))


def test_one_f_one_b_bound_is_the_closed_form() -> None:
    # p = 4 stages of 2 layers, m = 8, F = 2 and B = 4 per stage: (m + p - 1)(F + B) = 66 ms
    config = PipelineConfig(4, 8, 1, "1f1b")
    bound = integer_bound(_uniform(8), config, pipeline_bound(_uniform(8), config))
    assert bound.bound_ms == pytest.approx(66.0, abs=1e-6)
    assert sapptk.balance(_uniform(8), config, time_limit=5).step_time == pytest.approx(66.0)


def test_layout_bound_by_hand() -> None:
    # the same 1F1B case: device d's chain (8 micro-batches x 2 layers x 3 ms = 48 ms) plus, before its first
    # forward and after its last backward, one layer's forward and backward (3 ms) on each earlier stage: e_d = 3d.
    # Every plan with a device of 3 layers has a 72 ms chain, so the min-max is 48 + 9 = 57 ms; the layout LP
    # then finds the fill with two layers per stage: the closed form, 66 ms.
    from sapptk.solver.layouts import device_layouts, layer_caps, stage_options
    from sapptk.solver.problem import make_problem
    from sapptk.solver.settings import SearchOptions

    profile, config = _uniform(8), PipelineConfig(4, 8, 1, "1f1b")
    problem = make_problem(profile, config, allow_empty=False, options=SearchOptions())
    ends = fill_drain(problem)
    assert [e for e, _, _ in ends] == [0, 3000, 6000, 9000]  # ticks of 1 us
    caps, _ = layer_caps(problem.coef, problem.paths, None, allow_empty=False)
    layouts = device_layouts(problem.coef, problem.program, stage_options(problem.coef, caps), ub=None, budget=None,
                             allow_empty=False)
    assert chain_minmax(layouts, problem.coef.counts, [e for e, _, _ in ends]) == 57000
    start = pipeline_bound(profile, config)
    assert layout_bound(profile, config, start, 100.0).bound_ms == pytest.approx(66.0, abs=1e-9)
    assert layout_bound(profile, config, start, 60.0).bound_ms == pytest.approx(max(60.0, start.bound_ms))
    # an incumbent less than a tick (1 us) under the optimum, as a step plus a fractional DP-sync share gives:
    # steps are whole ticks, so every plan is proven no faster than it (the bound reaches it, not a tick short)
    weak = SetupBound(48.0)  # below the pipeline bound (66 ms less 7 ns), so the layouts must prove it
    assert layout_bound(profile, config, weak, 66.0 - 4e-4).bound_ms >= 66.0 - 4e-4


def test_infeasible_setup_names_the_device_and_shortfall() -> None:
    # 4 layers of 1 MB parameters and 1 MB activation; device 0 keeps 2 micro-batches in flight, device 1 one:
    # x layers on device 0 need 3x MB, the rest 2(4 - x) MB on device 1; within 3 MB both cannot hold.
    # The least worst excess is at 3x - 3 = 5 - 2x: x = 1.6, 1.8 MB, with device 1 weighing 3/5 of it.
    config = PipelineConfig(2, 4, 1, "1f1b", memory_budget=3.0)
    bound = pipeline_bound(_uniform(4), config)
    assert bound.infeasible and bound.device == 1
    assert bound.excess_mb == pytest.approx(1.8, rel=1e-6)
    assert "device 1 needs at least 1.8 MB" in bound.reason


def test_dp_sync_closed_form() -> None:
    assert dp_sync_ms(1800.0, 4, 10.0, 4 / 18) == pytest.approx(2 * 3 / 4 * 400 / 10)
    assert dp_sync_ms(1800.0, 1, 10.0, 4 / 18) == 0.0
    assert dp_sync_ms(1800.0, 8, None, 4 / 18) == 0.0


def test_enumeration_and_boundary_errors() -> None:
    setups = enumerate_setups(devices=8, global_batch=16, schedules=["1f1b", "interleaved"], memory_budget=None,
                              max_chunks=2)
    shapes = {(s.config.schedule, s.config.stages, s.config.chunks, s.config.micro_batches, s.dp) for s in setups}
    assert ("1f1b", 4, 1, 8, 2) in shapes and ("interleaved", 8, 2, 16, 1) in shapes
    assert all(s.config.stages * s.dp == 8 for s in setups)
    assert not any(s.config.schedule == "1f1b" and s.config.chunks != 1 for s in setups)
    with pytest.raises(ConfigError, match="devices = 6: none of stages"):
        enumerate_setups(devices=6, global_batch=12, stages=[4, 5], memory_budget=None)
    with pytest.raises(ConfigError, match="global_batch = 7"):
        enumerate_setups(devices=4, global_batch=7, stages=[1, 2], memory_budget=None)
    with pytest.raises(ConfigError, match="chunks = \\[\\]: an empty list"):
        enumerate_setups(devices=4, global_batch=8, chunks=[], memory_budget=None)
    with pytest.raises(ConfigError, match="stages = \\[\\]: an empty list"):
        enumerate_setups(devices=4, global_batch=8, stages=[], memory_budget=None)
    with pytest.raises(ConfigError, match="schedules = \\[\\]"):
        enumerate_setups(devices=4, global_batch=8, schedules=[], memory_budget=None)
    with pytest.raises(ConfigError, match="zb-v-greedy"):
        enumerate_setups(devices=4, global_batch=8, schedules=["zb-v-greedy"], memory_budget=None)
    with pytest.raises(ConfigError, match="memory_budget"):
        enumerate_setups(devices=4, global_batch=8, memory_budget=-1)


def test_every_setup_infeasible_names_the_nearest() -> None:
    with pytest.raises(ConfigError, match=r"memory_budget = 3\.0: no setup fits .* nearest is .*device \d+ needs"):
        sapptk.choose(_uniform(4), devices=2, global_batch=4, memory_budget=3.0, schedules=["1f1b"])


def test_profile_refuses_model_card_dimensions() -> None:
    with pytest.raises(ConfigError, match="tp = 2: only a model card"):
        sapptk.choose(_uniform(4), devices=2, global_batch=4, memory_budget=None, tp=2)
    with pytest.raises(ConfigError, match="retry = -1"):
        sapptk.choose(_uniform(4), devices=2, global_batch=4, memory_budget=None, retry=-1)


@pytest.fixture(scope="module")
def small_choice() -> tuple[Profile, sapptk.Choice]:
    profile = small_profile(np.random.default_rng(19), groups=2, layers=(4, 6))
    choice = sapptk.choose(profile, devices=4, global_batch=16, memory_budget=60.0,
                           schedules=["1f1b", "interleaved", "zb-h1"], max_chunks=2, setup_time_limit=5,
                           dp_bandwidth=2.0, deterministic=True, sequence_length=8)
    return profile, choice


@pytest.mark.slow
def test_choice_matches_brute_force(small_choice: tuple[Profile, sapptk.Choice]) -> None:
    profile, choice = small_choice
    frame = choice.frame
    assert set(frame["status"]) <= {"balanced", "pruned", "infeasible", "invalid"}
    brute = {}
    for s in enumerate_setups(devices=4, global_batch=16, schedules=["1f1b", "interleaved", "zb-h1"],
                              memory_budget=60.0, max_chunks=2):
        try:
            plan = sapptk.balance(profile, s.config, time_limit=5, deterministic=True)
        except ConfigError:
            continue
        if plan.solved:
            params = np.asarray(plan.devices["params_mb"], dtype=float)
            brute[s.label] = plan.step_time + dp_sync_ms(params.max(), s.dp, 2.0, 4 / 18)
    winner = frame.iloc[0]
    assert winner["rank"] == 1 and winner["status"] == "balanced"
    assert winner["step_time_ms"] == pytest.approx(min(brute.values()), rel=1e-9)
    # every pruned setup's bound is at or above the winner, and below its own brute-force time
    for row in frame[frame["status"] == "pruned"].itertuples():
        assert row.bound_ms >= winner["step_time_ms"] * (1 - 1e-9)
        label = f"{row.schedule} p{row.stages} v{row.chunks} m{row.micro_batches} dp{row.dp}"
        if label in brute:
            assert row.bound_ms <= brute[label] + 1e-6
    assert choice.best.step_time == pytest.approx(winner["pipeline_ms"])
    assert choice.proven == all(
        r.status != "balanced" or r.rank == 1 or r.bound_ms >= winner["step_time_ms"] * (1 - 1e-9)
        for r in frame.itertuples())
    assert winner["tokens_per_s_per_device"] == pytest.approx(16 * 8 / (winner["step_time_ms"] / 1000) / 4)


def test_choice_frame_conventions(small_choice: tuple[Profile, sapptk.Choice]) -> None:
    _, choice = small_choice
    frame = choice.frame
    assert list(frame["rank"]) == list(range(1, len(frame) + 1))
    assert str(frame["status"].dtype) == "category" and str(frame["schedule"].dtype) == "category"
    balanced = frame[frame["status"] == "balanced"]
    assert (balanced["step_time_ms"].diff().dropna() >= 0).all()
    assert (balanced["bound_ms"] <= balanced["step_time_ms"] + 1e-6).all()
    assert (balanced["step_time_ms"] == balanced["pipeline_ms"] + balanced["dp_sync_ms"]).all()
    assert set(choice.plans) == set(balanced.index)
    front = choice.pareto
    assert not front.empty and (front["step_time_ms"].diff().dropna() > 0).all()
    assert (front["peak_mb_max"].diff().dropna() < 0).all()
    assert "winner" in choice.summary() and sum(choice.counts.values()) == len(frame)
    # the timings book every second of the choice to one step, and the balances to "balance"
    assert tuple(choice.timings) == STEPS and min(choice.timings.values()) >= 0
    assert sum(choice.timings.values()) == pytest.approx(choice.seconds, rel=1e-6)
    t = choice.timings
    assert t["balance"] + t["retry"] >= 0.5 * balanced["solve_seconds"].drop_duplicates().sum() > 0
    assert t["bound"] + t["tighten"] + t["prove"] == pytest.approx(frame["bound_seconds"].sum(), rel=1e-6)


def test_prove_false_spends_nothing_on_proofs(monkeypatch) -> None:
    """Balances that stop with a 5 % gap: prove=True spends longer bounds and second balances on
    them, prove=False none, and both decide every setup the same way."""
    from sapptk.choosing import balancing
    from sapptk.sweeps.solving import solve_point

    limits: list[float] = []

    def gapped(task):  # the balancer's plan, reported with a gap as a time-limited solve would be
        res = solve_point(task)
        limits.append(task.request.time_limit)
        if res.status != "optimal":
            return res
        return dataclasses.replace(res, status="feasible", bound_ms=0.95 * res.step_time_ms, gap=0.05)

    monkeypatch.setattr(balancing, "solve_point", gapped)
    profile = small_profile(np.random.default_rng(19), groups=2, layers=(4, 6))
    kw = dict(devices=4, global_batch=16, memory_budget=60.0, schedules=["1f1b", "interleaved", "zb-h1"],
              max_chunks=2, setup_time_limit=2, dp_bandwidth=2.0, deterministic=True)
    proving = sapptk.choose(profile, **kw)
    assert proving.timings["prove"] + proving.timings["retry"] > 0  # longer bounds or second balances
    limits.clear()
    fast = sapptk.choose(profile, prove=False, **kw)
    assert set(limits) == {2.0} and fast.timings["prove"] == fast.timings["retry"] == 0
    assert set(fast.frame["status"]) <= {"balanced", "pruned", "infeasible", "invalid"}
    first = proving.frame.iloc[0]
    assert (fast.frame.iloc[0][["schedule", "stages", "chunks"]] == first[["schedule", "stages", "chunks"]]).all()
    with pytest.raises(ConfigError, match="prove = 1"):
        sapptk.choose(profile, prove=1, **kw)


def test_tighten_false_balances_what_the_first_bound_leaves(monkeypatch, small_choice) -> None:
    """tighten=False (with prove=False) never calls the tightenings, names the same winner, and
    gives the same frame in processes."""

    from sapptk.choosing import run

    def refuse(*args, **kwargs):
        raise AssertionError("a tightening ran")

    monkeypatch.setattr(run, "layout_bound", refuse)
    monkeypatch.setattr(run, "integer_bound", refuse)
    profile, choice = small_choice
    kw = dict(devices=4, global_batch=16, memory_budget=60.0, schedules=["1f1b", "interleaved", "zb-h1"],
              max_chunks=2, setup_time_limit=5, dp_bandwidth=2.0, deterministic=True, sequence_length=8, prove=False,
              tighten=False)
    fast = sapptk.choose(profile, **kw)
    parallel = sapptk.choose(profile, executor="processes", **kw)  # the throughput levers on two cores
    cols = ["schedule", "stages", "chunks", "status", "step_time_ms", "bound_ms"]
    pd.testing.assert_frame_equal(parallel.frame[cols], fast.frame[cols])
    assert fast.timings["tighten"] == 0
    frame = fast.frame
    dims = ["schedule", "stages", "chunks"]
    assert (frame.iloc[0][dims] == choice.frame.iloc[0][dims]).all()
    assert frame.iloc[0]["step_time_ms"] == pytest.approx(choice.frame.iloc[0]["step_time_ms"], rel=1e-9)
    assert (frame["status"] == "balanced").sum() > (choice.frame["status"] == "balanced").sum()
    assert (frame.loc[frame["status"] == "pruned", "bound_ms"] >= frame.iloc[0]["step_time_ms"] * (1 - 1e-9)).all()


def test_a_round_balances_batch_setups_and_twins_ride_along(monkeypatch) -> None:
    """A setup whose twin (same program and profile) is already balanced takes that result and no
    slot of its round: every round but the last balances ``batch`` setups, each program once (with
    ``tighten=False`` the first round is full too)."""
    from sapptk.choosing import balancing

    rounds: list[list[tuple[str, int, int]]] = []
    opened = balancing.open_executor

    def counting(executor, todo, solve, workers, stack):  # noqa: ANN001, ANN202
        runner, slots = opened(executor, todo, solve, workers, stack)

        def run(tasks, rescue):  # noqa: ANN001, ANN202
            rounds.append([(t.request.config.schedule, t.request.config.stages, t.request.config.chunks)
                           for t in tasks])
            return runner(tasks, rescue)

        return run, slots

    monkeypatch.setattr(balancing, "open_executor", counting)
    profile = small_profile(np.random.default_rng(19), groups=2, layers=(4, 6))
    choice = sapptk.choose(profile, devices=4, global_batch=16, memory_budget=60.0,
                           schedules=["1f1b", "interleaved", "interleaved-rf", "interleaved-megatron", "zb-h1"],
                           max_chunks=2, setup_time_limit=2, deterministic=True, prove=False, tighten=False, batch=2)
    frame = choice.frame
    balanced = frame[frame["status"] == "balanced"]
    assert len(balanced) > sum(len(r) for r in rounds)  # twins were balanced without a solve of their own
    assert [len(r) for r in rounds[:-1]] == [2] * (len(rounds) - 1) and 1 <= len(rounds[-1]) <= 2
    solved = [t for r in rounds for t in r]
    assert len(solved) == len(set(solved))
    twins = balanced[balanced["schedule"].isin(["interleaved", "interleaved-rf", "interleaved-megatron"])
                     & (balanced["chunks"] == 2)]
    assert len(twins) >= 2 and (twins.groupby("stages", observed=True)["step_time_ms"].nunique() == 1).all()


@pytest.mark.slow
def test_processes_and_cache_give_the_same_frame(tmp_path, small_choice) -> None:
    profile, choice = small_choice
    kw = dict(devices=4, global_batch=16, memory_budget=60.0, schedules=["1f1b", "interleaved", "zb-h1"],
              max_chunks=2, setup_time_limit=5, dp_bandwidth=2.0, deterministic=True, sequence_length=8)
    first = sapptk.choose(profile, executor="processes", cache=tmp_path, **kw)
    again = sapptk.choose(profile, cache=tmp_path, **kw)  # every balanced row from the cache
    cols = ["schedule", "stages", "chunks", "status", "step_time_ms"]
    for other in (first, again):
        pd.testing.assert_frame_equal(other.frame[cols], choice.frame[cols])
    assert (again.frame["solve_seconds"].dropna() == first.frame["solve_seconds"].dropna()).all()


def test_model_card_varies_tp_with_its_own_profiles() -> None:
    from sapptk.models import card

    choice = sapptk.choose(card("llama2-7b"), hardware="h100", devices=8, global_batch=16, memory_budget=None,
                           schedules=["1f1b"], tp=[1, 2], stages=[2, 4], setup_time_limit=3, seq_length=2048,
                           deterministic=True)
    frame = choice.frame
    assert {"tp", "cp", "ep", "zero"} <= set(frame.columns)
    assert set(frame["tp"]) == {1, 2} and (frame["stages"] * frame["dp"] * frame["tp"] == 8).all()
    assert (frame["micro_batches"] * frame["dp"] == 16).all()
    assert "tp" in choice.best.profile.name and choice.best.profile.name.startswith("llama2-7b")
    winner = frame.iloc[0]
    assert f"tp{winner['tp']}" in choice.best.profile.name
    assert winner["tokens_per_s_per_device"] == pytest.approx(16 * 2048 / (winner["step_time_ms"] / 1000) / 8)
    per_layer = choice.best.profile.provenance["dp_step_exposed_ms_per_layer"]["layers"]  # the estimate's step
    layers = np.asarray(choice.best.counts).sum(axis=(0, 1)).max()  # 1f1b: a device is a stage
    assert winner["dp_sync_ms"] == pytest.approx(per_layer * layers)
    with pytest.raises(ConfigError, match="hardware = None"):
        sapptk.choose(card("llama2-7b"), devices=8, global_batch=16, memory_budget=None)
    with pytest.raises(ConfigError, match="zero = 'zero9'"):
        sapptk.choose(card("llama2-7b"), hardware="h100", devices=8, global_batch=16, memory_budget=None,
                      zero="zero9")


def test_figures_of_a_choice(small_choice: tuple[Profile, sapptk.Choice]) -> None:
    from sapptk import viz

    _, choice = small_choice
    ranking = viz.choice_ranking(choice)
    data = ranking.renderers[0].data_source.data
    frame = choice.frame
    timed = frame[frame["status"].isin(["balanced", "pruned"])]
    assert len(data["label"]) == len(timed)
    assert list(data["value"]) == list(timed["step_time_ms"].where(timed["status"] == "balanced", timed["bound_ms"]))
    assert data["label"][0].startswith("#1 ")
    pareto = viz.choice_pareto(choice)
    points = pareto.renderers[0].data_source.data
    assert len(points["step_time_ms"]) == int((frame["status"] == "balanced").sum())
    with pytest.raises(sapptk.SapptkError, match="expected a sapptk.Choice"):
        viz.choice_ranking(42)


def test_explorer_choose_tab() -> None:
    from sapptk.widgets import Explorer

    ex = Explorer(_uniform(8), PipelineConfig(2, 4, 1, "1f1b", memory_budget=100.0), time_limit=2)
    titles = [ex.results.get_title(i) for i in range(len(ex.results.children))]
    assert "choose" in titles
    panel = ex.chooser
    panel.devices.value, panel.global_batch.value, panel.time_limit.value = 4, 8, 2
    panel.choose_button.click()
    choice = panel.wait(120)
    assert choice is not None and "winner" in panel.status.value and "<table" in panel.table.value
    assert not panel.use_button.disabled and len(panel.figure.children) == 1
    panel.use_button.click()
    best = choice.best.config
    assert (ex.schedule.value, ex.stages.value, ex.micro_batches.value, ex.chunks.value) == (
        best.schedule, best.stages, best.micro_batches, best.chunks)
    panel.micro_batch_size.value = 5  # no dp x micro-batch size divides 8: the message names the argument
    panel.choose_button.click()
    panel.wait(60)
    assert "global_batch = 8" in panel.status.value


def test_cli_choose(tmp_path, capsys) -> None:
    from sapptk.cli import main

    code = main(["choose", "demo", "--devices", "8", "--global-batch", "32", "--memory", "60000", "--schedule",
                 "1f1b", "zb-h1", "--time-limit", "20", "--no-progress", "--deterministic", "--out", str(tmp_path)])
    captured = capsys.readouterr()
    out = captured.out
    assert code == 0, captured.err
    assert "winner:" in out and "pruned by bounds" in out and "winner proven" in out
    plan = sapptk.load_plan(tmp_path / "sapptk_plan.yaml")
    assert plan.config.stages * (32 // plan.config.micro_batches) == 8
    assert (tmp_path / "choice.csv").read_text().startswith("rank,")
    assert main(["choose", "demo", "--devices", "6", "--global-batch", "32", "--memory", "60000",
                 "--stages", "4", "--no-progress"]) == 2
    assert "devices = 6: none of stages" in capsys.readouterr().err


def test_cli_choose_passes_prove_and_tighten(monkeypatch) -> None:
    import sapptk.choosing
    from sapptk.cli import main

    seen: list[dict] = []

    class Stop(Exception):
        pass

    def fake_choose(profile, **kwargs):
        seen.append(kwargs)
        raise Stop

    monkeypatch.setattr(sapptk.choosing, "choose", fake_choose)
    base = ["choose", "demo", "--devices", "8", "--global-batch", "32", "--memory", "60000", "--no-progress"]
    for extra, prove, tighten in (([], True, True), (["--no-prove"], False, True), (["--no-tighten"], True, False)):
        with pytest.raises(Stop):
            main([*base, *extra])
        assert (seen[-1]["prove"], seen[-1]["tighten"]) == (prove, tighten)


def test_resumed_and_goal_bounds_against_the_exhaustive_optimum(rng: np.random.Generator) -> None:
    """The path LP resumed from an early bound's rows reaches the bound of one long run, and a
    layout bound stopped at a goal reaches the goal or its full value; both stay at or below the
    least simulated step time of every assignment."""
    cases = stopped = 0
    for trial, profile, free, found in exhaustive_cases(rng, 12):
        lo, hi = found[:, 1].min(), found[:, 1].max()
        budget = lo + float(rng.uniform(0.2, 1)) * (hi - lo)
        config = free.replace(memory_budget=budget)
        best = float(found[found[:, 1] <= budget, 0].min())
        early = pipeline_bound(profile, config, max_rounds=1, deterministic=True)
        resumed = pipeline_bound(profile, config, max_rounds=400, deterministic=True, start=early)
        fresh = pipeline_bound(profile, config, max_rounds=400, deterministic=True)
        assert early.bound_ms <= resumed.bound_ms <= best + 1e-9, (trial, early, resumed, best)
        assert resumed.bound_ms == pytest.approx(fresh.bound_ms, rel=1e-6), (trial, resumed, fresh)
        assert pipeline_bound(profile, config, start=resumed, enough_ms=resumed.bound_ms) is resumed
        full = layout_bound(profile, config, early, math.inf, deterministic=True)
        assert full is not None and full.bound_ms <= best + 1e-9
        goal = early.bound_ms + 0.5 * (full.bound_ms - early.bound_ms)
        part = layout_bound(profile, config, early, math.inf, deterministic=True, enough_ms=goal)
        assert part is not None and min(goal, full.bound_ms) - 1e-6 <= part.bound_ms <= best + 1e-9, (
            trial, goal, part.bound_ms, full.bound_ms, best)
        cases += 1
        stopped += part.bound_ms < full.bound_ms - 1e-6
    assert cases == 12 and stopped >= 1  # some stop short of the full search


def test_choose_with_goals_matches_brute_force() -> None:
    """Without ``deterministic`` (bounds tightened only past the next setup in the queue, the
    path LP resumed): the winner is the least step time any setup's plan reaches, and every
    pruned setup's bound is at or below its own best plan."""
    profile = small_profile(np.random.default_rng(7), groups=2, layers=(4, 6))
    grid = dict(devices=4, global_batch=16, schedules=["1f1b", "interleaved", "zb-v"], memory_budget=60.0,
                max_chunks=2)
    choice = sapptk.choose(profile, setup_time_limit=5, seed=1, **grid)
    brute = {}
    for s in enumerate_setups(**grid):
        try:
            plan = sapptk.balance(profile, s.config, time_limit=5, deterministic=True)
        except ConfigError:
            continue
        if plan.solved:
            brute[s.label] = plan.step_time
    frame = choice.frame
    winner = frame.iloc[0]
    assert choice.proven and winner["step_time_ms"] == pytest.approx(min(brute.values()), rel=1e-9)
    for row in frame[frame["status"] == "pruned"].itertuples():
        label = f"{row.schedule} p{row.stages} v{row.chunks} m{row.micro_batches} dp{row.dp}"
        assert winner["step_time_ms"] * (1 - 1e-9) <= row.bound_ms <= brute.get(label, math.inf) + 1e-6


def test_the_first_round_balances_one_setup_when_tightening(monkeypatch) -> None:
    """With tightening on, the first round (no step time known yet) balances one setup, so the
    second best bound can be pruned by the first's step time; later rounds are full."""
    from sapptk.choosing import balancing

    rounds: list[int] = []
    opened = balancing.open_executor

    def counting(executor, todo, solve, workers, stack):  # noqa: ANN001, ANN202
        runner, slots = opened(executor, todo, solve, workers, stack)

        def run(tasks, rescue):  # noqa: ANN001, ANN202
            rounds.append(len(tasks))
            return runner(tasks, rescue)

        return run, slots

    monkeypatch.setattr(balancing, "open_executor", counting)
    profile = small_profile(np.random.default_rng(19), groups=2, layers=(4, 6))
    sapptk.choose(profile, devices=4, global_batch=16, memory_budget=60.0, schedules=["1f1b", "interleaved", "zb-h1"],
                  max_chunks=2, setup_time_limit=2, deterministic=True, prove=False, batch=2)
    assert rounds and rounds[0] == 1
    assert all(n <= 2 for n in rounds)


def test_a_tightening_that_gains_nothing_is_not_repeated(monkeypatch) -> None:
    """A setup whose first layout bound gave up (too many layouts without an incumbent) gets path
    rows; once its layouts can be enumerated below an incumbent, the rows are done. The same
    tightening (same setup, incumbent and goal) never runs twice: before, a setup whose layout
    bound stayed under its goal was tightened again and again (layouts, then branching) and never
    balanced."""
    from sapptk.choosing import run

    real = run.layout_bound
    seen: set[tuple] = set()

    def layouts(profile, config, start, ub_ms, **kw):  # noqa: ANN001, ANN003, ANN202
        if not math.isfinite(ub_ms):
            return None  # as when the layouts are too many to enumerate without an incumbent
        key = (config.schedule, config.stages, config.chunks, config.micro_batches, ub_ms, kw.get("enough_ms"))
        assert key not in seen, f"the same tightening again: {key}"
        seen.add(key)
        return real(profile, config, start, ub_ms, **kw)

    monkeypatch.setattr(run, "layout_bound", layouts)
    profile = small_profile(np.random.default_rng(7), groups=2, layers=(4, 6))
    grid = dict(devices=4, global_batch=16, schedules=["1f1b", "interleaved", "zb-v"], memory_budget=60.0,
                max_chunks=2)
    choice = sapptk.choose(profile, setup_time_limit=2, seed=1, bound_time=0.1, **grid)
    assert choice.proven and seen
