"""sapptk's own plan file (plan.export("sapptk") / load_plan): round trips lose nothing, for every
schedule, for random plans, for plans carrying their own program; bad files fail clearly."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from support import random_counts, setups, small_profile

from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.plan import load_plan, make_plan
from sapptk.schedules import build


def assert_same_plan(a, b):
    assert np.array_equal(a.counts, b.counts)
    assert a.profile == b.profile
    assert (a.status, a.step_time, a.bound, a.gap, a.solve_seconds, a.message, a.source) == (
        b.status, b.step_time, b.bound, b.gap, b.solve_seconds, b.message, b.source)
    if a.config.custom_program is None:
        assert a.config == b.config
    else:
        assert a.config.replace(custom_program=None) == b.config.replace(custom_program=None)
        assert a.config.program().units == b.config.program().units
        assert a.config.program().placement == b.config.program().placement


@pytest.mark.parametrize("config", setups(), ids=lambda c: c.schedule)
def test_round_trip_every_schedule_random_plans(config, rng, tmp_path):
    for trial in range(3):
        prof = small_profile(rng)
        cfg = config.replace(memory_budget=[None, 1e6, 123.5][trial])
        counts = random_counts(rng, prof, cfg)
        step = make_plan(prof, cfg, counts, status="given").step_time  # a file's figures must be the plan's own
        plan = make_plan(prof, cfg, counts, status=["optimal", "feasible", "given"][trial],
                         step_time=None if trial == 2 else step, bound=None if trial else 0.75 * step,
                         gap=None if trial else 0.25, solve_seconds=1.5 * trial, message=f"trial {trial}: ok",
                         source="balance")
        path = tmp_path / f"plan{trial}.yaml"
        text = plan.export("sapptk", path).text
        assert path.read_text(encoding="utf-8") == text
        back = load_plan(path)
        assert_same_plan(plan, back)
        assert back.export("sapptk").text == text  # and again: the text is stable
        assert back.simulate().step_time == pytest.approx(plan.simulate().step_time)


def test_round_trip_of_a_plan_carrying_its_program(rng):
    prof = small_profile(rng)
    program = build("zb-h1", stages=3, micro_batches=5)
    cfg = PipelineConfig.from_program(program, comm=0.25)
    plan = make_plan(prof, cfg, random_counts(rng, prof, cfg), status="given")
    back = load_plan(yaml.safe_load(plan.export("sapptk").text))
    assert_same_plan(plan, back)
    assert back.config.schedule == "zb-h1" and back.config.custom_program is not None


def test_plans_without_an_assignment_round_trip(rng):
    prof = small_profile(rng)
    cfg = PipelineConfig(2, 3, 1, "1f1b", memory_budget=1.0)
    plan = make_plan(prof, cfg, None, status="infeasible", message="infeasible: device 0 needs 99 MB")
    back = load_plan(yaml.safe_load(plan.export("sapptk").text))
    assert_same_plan(plan, back)
    assert back.counts.sum() == 0


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda d: d.update(format="sapptk-plan/9"), "format = 'sapptk-plan/9': expected 'sapptk-plan/1'"),
        (lambda d: d.update(extra=1), "unknown key 'extra'"),
        (lambda d: d["setup"].update(stages=0), "setup: stages = 0: expected an integer >= 1"),
        (lambda d: d["setup"].update(schedule="nope"), "setup: schedule = 'nope': unknown schedule"),
        (lambda d: d["layout"][0].update(group="ghost"), "layout[0].group = 'ghost'"),
        (lambda d: d["layout"][0].update(mode="half"), "layout[0].mode = 'half'"),
        (lambda d: d["layout"][0].update(virtual_stage=99), "layout[0].virtual_stage = 99: expected 0..3"),
        (lambda d: d["layout"][0].update(layers=-2), "layout[0].layers = -2"),
        (lambda d: d["layout"].pop(), "group 'g1' has 5 layers, the assignment places 2"),
        (lambda d: d.update(step_time_ms="fast"), "step_time_ms = 'fast'"),
        (lambda d: d["setup"].update(program_csv="0F0,0X0\n"), "setup.program_csv, line 1, column 2"),
        (lambda d: d.update(profile={"name": "x"}), "profile"),
        # issue 22: a plan file is evidence, not truth
        (lambda d: d.update(step_time_ms=-5.0), "step_time_ms = -5.0: expected a finite number from 0"),
        (lambda d: d.update(step_time_ms=10**400), "step_time_ms = 1000000"),
        (lambda d: d["layout"][0].update(layers=10**30), "layout[0].layers = 1000000000000000000000000000000"),
        (lambda d: d.update(step_time_ms=d["step_time_ms"] / 2), "the plan simulates to"),
        (lambda d: d.update(status="optimal", bound_ms=d["step_time_ms"] * 2), "bound_ms"),
        (lambda d: d.update(status="optimal", bound_ms=d["step_time_ms"] / 2, gap=0.9), "gap = 0.9"),
        (lambda d: d.update(gap=1.5), "gap = 1.5: expected a finite number from 0"),
        (lambda d: (d.update(status="optimal"), d["setup"].update(memory_budget_mb=1.0)),
         "status = 'optimal', but the plan's peak"),
    ],
)
def test_bad_plan_files_name_the_field(edit, needle, tmp_path):
    prof = small_profile(np.random.default_rng(3), layers=(3, 5))
    cfg = PipelineConfig(2, 4, 2, "interleaved")
    counts = np.zeros((2, 5, 4), dtype=int)
    counts[0, 0, :2] = [1, 2]
    counts[1, 0, 2:] = [2, 3]
    data = yaml.safe_load(make_plan(prof, cfg, counts, status="given").export("sapptk").text)
    edit(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(ConfigError) as exc:
        load_plan(path)
    assert str(exc.value).startswith(str(path)) and needle in str(exc.value), str(exc.value)


def test_not_a_plan_file(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="x.yaml: cannot tell its format .*pass format="):
        load_plan(path)
    with pytest.raises(ConfigError, match="expected a sapptk plan"):
        load_plan(path, "sapptk")
    with pytest.raises(ConfigError, match="cannot read"):
        load_plan(tmp_path / "missing.yaml")
