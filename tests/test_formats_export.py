"""One export shape, one reader order: ``plan.export(format, path)`` → ``load_plan(path, format,
profile=..., config=...)`` for every format, the format inferred from the file, and the
:class:`~sapptk.formats.base.Export` record (texts, files written, what is lost and its cost)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import sapptk
from sapptk.config import PipelineConfig
from sapptk.costs import simulate_counts
from sapptk.errors import ConfigError
from sapptk.formats.registry import FORMATS
from sapptk.plan import even_split, load_plan, load_plans, make_plan
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile
from sapptk.schedules import from_csv

NONE, SELECT, FULL = (MODES.index(m) for m in ("none", "select", "full"))
FILES = {"sapptk": "plan.yaml", "mindformers": "mf.yaml", "megatron": "megatron.txt", "torchtitan": "job.toml",
         "torch-csv": "order.csv"}


def tiny(n: int = 12) -> Profile:
    body = LayerGroup("layer", "body", n, 1.0, 10.0, {"none": ModeCost(2.0, 8.0), "select": ModeCost(2.1, 5.0),
                                                       "full": ModeCost(3.0, 1.0)})
    return Profile("tiny", (LayerGroup("emb", "head", 1, 0.5, 20.0), body, LayerGroup("out", "tail", 1, 1.0, 20.0)))


CFG = PipelineConfig(2, 4, 2, "interleaved", memory_budget=1000.0)


def uneven(profile: Profile = None, config: PipelineConfig = CFG):
    """A plan every runtime can lay out (layers 2, 4, 3, 3 per virtual stage) with full recompute on some
    layers of some stages only: exact in sapptk and MindFormers, not in Megatron-LM or torchtitan."""
    profile = profile or tiny()
    counts = np.zeros((1, len(MODES), 4), dtype=np.int64)
    counts[0, NONE] = [2, 1, 3, 3]
    counts[0, FULL] = [0, 3, 0, 0]
    return make_plan(profile, config, counts, status="given", source="hand")


def kwargs(fmt: str, plan) -> dict:
    return {} if fmt == "sapptk" else {"profile": plan.profile, "config": plan.config}


@pytest.mark.parametrize("mode", ["none", "select", "full"])
@pytest.mark.parametrize("fmt", [f for f in FORMATS if f != "torch-csv"])
def test_every_format_round_trips_through_a_file(fmt, mode, tmp_path):
    plan = even_split(tiny(), CFG, mode)
    out = plan.export(fmt, tmp_path / FILES[fmt])
    assert isinstance(out, sapptk.Export) and out.format == fmt and out.exact and out.cost_ms == 0
    assert all(p.is_file() and p.is_absolute() for p in out.written.values())
    assert out.text in out.texts.values()
    for fmt_given in (fmt, None):  # said, or inferred from the file
        back = load_plan(tmp_path / FILES[fmt], fmt_given, **kwargs(fmt, plan))
        np.testing.assert_array_equal(back.counts, plan.counts)
        assert back.config.program().units == plan.config.program().units
        assert back.step_time == pytest.approx(plan.step_time, abs=1e-9)


@pytest.mark.parametrize("fmt", ["sapptk", "mindformers", "megatron", "torchtitan"])
def test_every_format_round_trips_in_memory(fmt):
    """What an export holds without a file: the text or the data reads back as well."""
    import yaml

    plan = even_split(tiny(), CFG, "select")
    out = plan.export(fmt)
    assert out.written == {}
    source = {"sapptk": lambda: yaml.safe_load(out.text), "mindformers": lambda: out.data,
              "megatron": lambda: out.data.args, "torchtitan": lambda: out.text}[fmt]()
    back = load_plan(source, fmt, **kwargs(fmt, plan))
    np.testing.assert_array_equal(back.counts, plan.counts)


def test_what_a_runtime_cannot_express_is_reported_with_its_simulated_cost(tmp_path):
    plan = uneven()
    for fmt in ("sapptk", "mindformers"):
        assert plan.export(fmt).exact
    for fmt in ("megatron", "torchtitan"):
        out = plan.export(fmt, tmp_path / FILES[fmt])
        assert not out.exact and out.notes == out.data.notes and "full" in out.notes[0]
        assert out.step_time_ms == pytest.approx(plan.step_time)
        assert out.cost_ms == pytest.approx(out.expressed_step_time_ms - plan.step_time)
        back = load_plan(tmp_path / FILES[fmt], profile=plan.profile, config=plan.config)
        # the file holds what the runtime runs: the expressed assignment, not the plan's
        np.testing.assert_array_equal(back.counts, out.data.expressed_counts)
    # torchtitan runs the plan's own schedule: the loaded plan's step time is the export's expressed one
    titan = plan.export("torchtitan")
    back = load_plan(titan.text, "torchtitan", profile=plan.profile, config=plan.config)
    assert back.step_time == pytest.approx(titan.expressed_step_time_ms, abs=1e-9)
    megatron = plan.export("megatron")
    runs = plan.config.replace(schedule=megatron.data.schedule)
    assert megatron.expressed_step_time_ms == pytest.approx(
        simulate_counts(plan.profile, runs, megatron.data.expressed_counts).step_time, abs=1e-9)


def test_torchtitan_writes_toml_python_and_csv_side_by_side(tmp_path):
    plan = even_split(tiny(), PipelineConfig(2, 4, 2, "zb-v-greedy"), "full")  # no PyTorch class runs it
    for name in ("job.toml", "job.py", "job"):
        out = plan.export("torchtitan", tmp_path / name)
        assert {r: p.name for r, p in out.written.items()} == {"toml": "job.toml", "python": "job.py",
                                                               "csv": "job_schedule.csv"}
        assert out.texts["csv"] == plan.config.program().to_csv()
        assert f'pipeline_parallel_schedule_csv = "{tmp_path / "job_schedule.csv"}"' in out.texts["toml"]
        assert "'job_schedule.csv')" in out.texts["python"]
    back = load_plan(tmp_path / "job.toml", profile=plan.profile)
    np.testing.assert_array_equal(back.counts, plan.counts)
    assert back.config.program().units == plan.config.program().units
    with pytest.raises(ConfigError, match=r"path = '.*job.yaml': expected a name ending in .toml or .py"):
        plan.export("torchtitan", tmp_path / "job.yaml")


def test_torch_csv_exports_the_order_and_is_not_read_as_a_plan(tmp_path):
    plan = even_split(tiny(), CFG, "none")
    out = plan.export("torch-csv", tmp_path / "order.csv")
    assert out.text == plan.config.program().to_csv() and out.data == plan.config.program()
    assert from_csv(out.written["csv"]).units == plan.config.program().units
    for fmt in ("torch-csv", None):
        with pytest.raises(ConfigError, match="order.csv: a PyTorch schedule CSV holds the op order "
                                              ".*schedules.from_csv"):
            load_plan(tmp_path / "order.csv", fmt, profile=plan.profile, config=plan.config)


def test_megatron_file_skips_comments_and_names_itself_in_errors(tmp_path):
    plan = even_split(tiny(), CFG, "full")
    path = tmp_path / "megatron.txt"
    plan.export("megatron", path)
    assert path.read_text(encoding="utf-8").startswith("# Megatron-LM arguments")
    np.testing.assert_array_equal(load_plan(path, profile=plan.profile, config=plan.config).counts, plan.counts)
    path.write_text("# nothing here\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="megatron.txt: no arguments"):
        load_plan(path, "megatron", profile=plan.profile, config=plan.config)
    path.write_text("--pipeline-model-parallel-size 3\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"megatron.txt: .*--pipeline-model-parallel-size = 3: expected 2"):
        load_plan(path, profile=plan.profile, config=plan.config)


def test_one_argument_order_and_clear_errors(tmp_path):
    plan = even_split(tiny(), CFG, "none")
    with pytest.raises(ConfigError, match="export: format = 'deepspeed': expected one of 'sapptk', 'mindformers', "
                                          "'megatron', 'torchtitan', 'torch-csv'"):
        plan.export("deepspeed")
    with pytest.raises(ConfigError, match="load_plan: format = 'yaml': expected one of 'sapptk'"):
        load_plan(tmp_path / "x.yaml", "yaml")
    with pytest.raises(ConfigError, match=r"export\(format='megatron'\): unknown option 'base_config': this format "
                                          "takes no options"):
        plan.export("megatron", base_config="a:b")
    with pytest.raises(ConfigError, match=r"load_plan\(format='torchtitan'\): unknown option 'name': this format "
                                          "takes only csv"):
        load_plan("x.toml", "torchtitan", profile=plan.profile, name="a")
    with pytest.raises(ConfigError, match="export\\('sapptk'\\): path = 3: expected a file path"):
        plan.export("sapptk", 3)
    saved = plan.export("sapptk", tmp_path / "plan.yaml").written["yaml"]
    with pytest.raises(ConfigError, match="profile = .*expected None: a sapptk plan file carries its own profile"):
        load_plan(saved, profile=plan.profile)
    with pytest.raises(ConfigError, match=r"load_plan\(format='megatron'\): profile = None: expected a sapptk "
                                          "Profile"):
        load_plan("Et*3|t*3|t*3|t*3L", "megatron", config=CFG)
    with pytest.raises(ConfigError, match=r"load_plan\(format='megatron'\): config = None"):
        load_plan("Et*3|t*3|t*3|t*3L", "megatron", profile=plan.profile)
    with pytest.raises(ConfigError, match="a mapping without format: 'sapptk-plan/1': pass format="):
        load_plan({"offset": 0})
    with pytest.raises(ConfigError, match="load_plan: source = 3: expected a file path, or format="):
        load_plan(3)


def test_the_export_is_frozen_and_the_plan_untouched(tmp_path):
    plan = uneven()
    counts = plan.counts.copy()
    out = plan.export("torchtitan", tmp_path / "job.toml")
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.text = ""
    with pytest.raises(TypeError):
        out.texts["toml"] = ""
    with pytest.raises(TypeError):
        out.written["toml"] = tmp_path
    np.testing.assert_array_equal(plan.counts, counts)
    assert "torchtitan" in repr(out) and "note" in repr(out)


def test_load_plans_reads_every_named_config(tmp_path):
    plan = uneven()
    other = even_split(plan.profile, plan.config, "full")
    import yaml

    path = tmp_path / "named.yaml"
    named = {"mine": plan.export("mindformers").data["layer"], "all_full": other.export("mindformers").data["layer"]}
    path.write_text(yaml.safe_dump(named, sort_keys=False), encoding="utf-8")
    plans = load_plans(path, profile=plan.profile, config=plan.config)
    assert list(plans) == ["mine", "all_full"]
    np.testing.assert_array_equal(plans["mine"].counts, plan.counts)
    np.testing.assert_array_equal(plans["all_full"].counts, other.counts)
    with pytest.raises(ConfigError, match="holds 2 named configs .*pass name= to pick one, or read them all with "
                                          "sapptk.load_plans"):
        load_plan(path, profile=plan.profile, config=plan.config)
    assert load_plan(path, profile=plan.profile, config=plan.config, name="all_full").source == "mindformers:all_full"
    single = load_plans(plan.export("sapptk", tmp_path / "p.yaml").written["yaml"])
    assert list(single) == ["hand"]


def test_every_reader_takes_source_profile_config_in_that_order():
    import inspect

    from sapptk.formats import megatron, mindformers, plan_file, torch_csv, torchtitan
    from sapptk.formats.registry import _EXPORTERS, _READERS

    assert set(_READERS) == set(_EXPORTERS) == set(FORMATS)
    for module in (plan_file, mindformers, megatron, torchtitan, torch_csv):
        assert list(inspect.signature(module.read_plan).parameters)[:3] == ["source", "profile", "config"], module
        assert list(inspect.signature(module.plan_export).parameters)[:2] == ["plan", "path"], module
    for codec in (megatron.decode, torchtitan.decode):
        assert list(inspect.signature(codec).parameters)[:3] == ["source", "profile", "config"], codec
