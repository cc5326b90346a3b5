"""``solve``: every lever a phase on one clock, the limit one promise, and one Plan per call."""

from __future__ import annotations

import ast
import re
import time
from pathlib import Path

import numpy as np
import pytest

import sapptk
from sapptk import balance
from sapptk.config import PipelineConfig
from sapptk.plan import Plan, even_split
from sapptk.profile import MODES
from sapptk.request import SolveRequest
from sapptk.solver.clock import Clock
from sapptk.solver.settings import SearchOptions

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture()
def count_plans(monkeypatch):
    """The number of Plan objects built since the fixture started (dataclasses.replace included)."""
    built = [0]
    original = Plan.__init__

    def counting(self, *args, **kwargs):
        built[0] += 1
        original(self, *args, **kwargs)

    monkeypatch.setattr(Plan, "__init__", counting)
    return built


def _tight(profile, config):
    """``config`` with a budget halfway between the strongest and the no-recompute even split."""
    full = even_split(profile, config, "strongest").simulation.peak_memory.max()
    none = even_split(profile, config, "none").simulation.peak_memory.max()
    return config.replace(memory_budget=float(full + 0.5 * (none - full)))


CASES = {
    "plain": ({}, {}),
    "offload": ({"recompute": (*MODES, "offload"), "host_bandwidth": 10.0}, {}),
    "per_micro_batch": ({}, {"per_micro_batch": True}),
    "reorder": ({"schedule": "zb-v-greedy", "chunks": 2}, {}),
    "memory_margin": ({}, {"memory_margin": 0.05}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_one_plan_per_balance_call(demo, count_plans, case):
    changes, keywords = CASES[case]
    config = _tight(demo, PipelineConfig(4, 8, 1, "1f1b").replace(**changes))
    count_plans[0] = 0  # the even splits of _tight are not the call's
    plan = balance(demo, config, time_limit=3, **keywords)
    assert count_plans[0] == 1, f"{case}: {count_plans[0]} Plan objects built by one balance call"
    assert plan.solved and plan.fits
    assert plan.step_time == pytest.approx(plan.simulate().step_time, abs=1e-6)
    if case == "offload":
        assert "activation offload" in plan.message
    if case == "memory_margin":
        assert plan.config.memory_budget == config.memory_budget and "safe budget" in plan.message
    if case == "reorder":
        assert plan.config.schedule == "zb-v-greedy"


def test_solve_runs_a_request_as_balance_does(demo):
    config = _tight(demo, PipelineConfig(4, 8, 1, "1f1b"))
    request = SolveRequest(demo, config, time_limit=10, deterministic=True)
    a, b = sapptk.solve(request), balance(demo, config, time_limit=10, deterministic=True)
    assert a.status == b.status == "optimal"
    assert np.array_equal(a.counts, b.counts) and a.step_time == b.step_time
    with pytest.raises(sapptk.ConfigError, match="request = 3: expected a sapptk.SolveRequest"):
        sapptk.solve(3)  # type: ignore[arg-type]


@pytest.mark.slow
@pytest.mark.parametrize("lever", ["offload", "per_micro_batch"])
def test_every_lever_on_keeps_the_limit_and_reports_it(llama, lever):
    """A hard setup with every compatible lever on returns within 1 s of its limit, and its message names
    the limit given (never a phase's share as if it were the limit)."""
    limit = 8.0
    config = PipelineConfig(stages=16, micro_batches=32, chunks=2, schedule="interleaved", memory_budget=56000)
    keywords: dict = {"memory_margin": 0.02, "oom_risk": 0.05, "memory_error": 0.01, "stall_time": 60.0}
    if lever == "offload":
        config = config.replace(recompute=(*MODES, "offload"), host_bandwidth=25.0)
    else:
        keywords["per_micro_batch"] = True
    began = time.perf_counter()
    plan = balance(llama, config, time_limit=limit, **keywords)
    seconds = time.perf_counter() - began
    assert seconds <= limit + 1.0, f"{lever}: {seconds:.2f} s for a {limit:g} s limit"
    assert plan.solved and plan.fits and "safe budget" in plan.message
    said = re.findall(r"time limit of ([\d.]+) s|of the ([\d.]+) s time limit", plan.message)
    assert said, plan.message
    assert {float(a or b) for a, b in said} == {limit}, plan.message


def test_a_phase_clock_keeps_the_call_deadline_and_names_the_call_limit():
    clock = Clock(10.0)
    phase = clock.phase(4.5)
    assert phase.deadline <= clock.deadline and phase.limit == pytest.approx(4.5, abs=0.05)
    assert phase.describe_limit().endswith("of the 10 s time limit") and "(4.5 s)" in phase.describe_limit()
    assert clock.describe_limit() == "the time limit of 10 s"
    assert clock.phase(1000).deadline <= clock.deadline + 1e-9  # never past the call's deadline


def test_lever_shares_are_search_options(demo):
    with pytest.raises(sapptk.ConfigError, match="SearchOptions.offload_base_share = 1.5"):
        SearchOptions(offload_base_share=1.5)
    with pytest.raises(sapptk.ConfigError, match="offload_base_share \\+ offload_free_share"):
        SearchOptions(offload_base_share=0.6, offload_free_share=0.5)
    with pytest.raises(sapptk.ConfigError, match="slice_share \\+ move_share"):
        SearchOptions(slice_share=0.5, move_share=0.5)


def _functions(tree: ast.AST, name: str) -> ast.FunctionDef:
    return next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == name)


def test_balance_is_a_thin_adapter_and_the_solve_has_one_clock():
    tree = ast.parse((ROOT / "sapptk" / "balancer.py").read_text(encoding="utf-8"))
    fn = _functions(tree, "balance")
    assert fn.end_lineno - fn.lineno + 1 < 40, "balance() is over 40 lines"
    assert not any(isinstance(n, ast.Lambda) for n in ast.walk(tree)), "balancer.py calls itself through a lambda"
    for path in [ROOT / "sapptk" / "balancer.py", *sorted((ROOT / "sapptk" / "solver").glob("*.py"))]:
        text = path.read_text(encoding="utf-8")
        assert "time.monotonic" not in text, f"{path.name}: a second time source (the Clock uses perf_counter)"
        for share in ("OFFLOAD_BASE_SHARE", "OFFLOAD_FREE_SHARE", "PER_STAGE_SHARE", "SLICE_SHARE", "MOVE_SHARE"):
            assert share not in text, f"{path.name}: {share} outside SearchOptions"
