"""Degenerate but valid shapes balance: one stage, one micro-batch, as many stages as layers,
and a budget exactly at the smallest peak any plan can have (issue 22)."""

from __future__ import annotations

import numpy as np
import pytest

from sapptk import PipelineConfig, balance, baselines
from sapptk.plan import make_plan
from sapptk.profile import LayerGroup, ModeCost, Profile

LIMIT = 3.0


def _four_layers() -> Profile:
    modes = {"none": ModeCost(backward=2.0, activation=40.0), "full": ModeCost(backward=3.0, activation=5.0)}
    return Profile("four", (LayerGroup("head", "head", 1, 0.5, 10.0),
                            LayerGroup("body", "body", 4, 1.0, 20.0, modes),
                            LayerGroup("tail", "tail", 1, 0.5, 10.0)))


@pytest.mark.parametrize(("schedule", "chunks", "micro_batches"),
                         [("1f1b", 1, 1), ("1f1b", 1, 4), ("gpipe", 1, 1), ("interleaved", 2, 1), ("zb-h1", 1, 2),
                          ("seq1f1b", 1, 1)])
def test_one_stage_balances(demo, schedule, chunks, micro_batches):
    """One device: every layer on it (the local search has no layer move to make: it used to
    raise ``ValueError: high <= 0``)."""
    config = PipelineConfig(stages=1, micro_batches=micro_batches, chunks=chunks, schedule=schedule)
    plan = balance(demo, config, time_limit=LIMIT)
    assert plan.status == "optimal"
    assert plan.counts.sum() == demo.body[0].count
    assert plan.step_time == pytest.approx(plan.simulate().step_time)


def test_one_stage_per_micro_batch_and_budget(demo):
    config = PipelineConfig(stages=1, micro_batches=2, memory_budget=1e9)
    plan = balance(demo, config, time_limit=LIMIT, per_micro_batch=True)
    assert plan.solved and plan.fits


def test_one_stage_command_line(capsys):
    from sapptk.cli import main

    assert main(["balance", "demo", "-p", "1", "-m", "1", "--time-limit", "3"]) == 0
    assert "step time" in capsys.readouterr().out


def test_stages_equal_layers():
    profile = _four_layers()
    plan = balance(profile, PipelineConfig(stages=4, micro_batches=4), time_limit=LIMIT)
    assert plan.status == "optimal"
    assert plan.counts.sum(axis=(0, 1)).tolist() == [1, 1, 1, 1]


def test_budget_exactly_at_the_minimum():
    """Four layers on four 1F1B stages: the least peak of any plan is full recompute on one layer
    per stage (a stage taking a second layer gains more than the one it leaves loses); at exactly
    that peak the plan fits, a hundredth of a MB below nothing does (proven infeasible)."""
    profile = _four_layers()
    config = PipelineConfig(stages=4, micro_batches=4)
    full = make_plan(profile, config, baselines.even_counts(profile, config, "full"), status="given")
    minimum = float(full.simulation.peak_memory.max())
    plan = balance(profile, config.replace(memory_budget=minimum), time_limit=LIMIT)
    assert plan.status == "optimal" and plan.fits
    assert np.array_equal(plan.counts, full.counts)
    below = balance(profile, config.replace(memory_budget=minimum - 0.01), time_limit=LIMIT)
    assert below.status == "infeasible"
