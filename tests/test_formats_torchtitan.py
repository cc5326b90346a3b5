"""torchtitan: the [parallelism] / [activation_checkpoint] / [training] TOML both ways, for
every schedule (named, or as a schedule CSV), with what torchtitan cannot express costed."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import numpy as np
import pytest
from support import random_counts, small_profile

from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.formats.torchtitan import fqns, torch_schedule
from sapptk.plan import even_split, load_plan, make_plan
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile
from sapptk.schedules import build, get, names

NONE, SELECT, FULL = (MODES.index(m) for m in ("none", "select", "full"))


def tiny(n: int = 12) -> Profile:
    body = LayerGroup("layer", "body", n, 1.0, 10.0, {"none": ModeCost(2.0, 8.0), "select": ModeCost(2.1, 5.0),
                                                       "full": ModeCost(3.0, 1.0)})
    return Profile("tiny", (LayerGroup("emb", "head", 1, 0.5, 20.0), body, LayerGroup("out", "tail", 1, 1.0, 20.0)))


def uniform(profile, config, mode):
    plan = even_split(profile, config, mode)
    return make_plan(profile, config, plan.counts, status="optimal", step_time=plan.step_time)


@pytest.mark.parametrize("name", [n for n in names() if not get(n).splits])
@pytest.mark.parametrize("mode", ["none", "select", "full"])
def test_round_trip_every_schedule(name, mode, tmp_path):
    spec = get(name)
    v = 1 if spec.chunks == (1,) else 2
    p = 3
    cfg = PipelineConfig(p, max(spec.min_micro_batches(p, v), p) + 1, v, name, memory_budget=1e6, comm=0.01)
    plan = uniform(tiny(), cfg, mode)
    out = plan.export("torchtitan", csv_name=tmp_path / "order.csv").data
    assert out.exact and out.cost_ms == 0
    (tmp_path / "job.toml").write_text(out.toml, encoding="utf-8")
    if out.csv is not None:
        (tmp_path / "order.csv").write_text(out.csv, encoding="utf-8")
    back = load_plan(tmp_path / "job.toml", "torchtitan", profile=tiny(), config=cfg)
    np.testing.assert_array_equal(back.counts, plan.counts)
    assert back.config.program().units == cfg.program().units
    assert back.config.program().placement == cfg.program().placement
    assert (back.config.memory_budget, back.config.comm) == (1e6, 0.01)
    if out.csv is None:
        assert back.config == cfg
    data = tomllib.loads(out.toml)
    assert data["parallelism"]["pipeline_parallel_degree"] == p
    assert data["training"]["local_batch_size"] == cfg.micro_batches


def test_schedule_names_and_csv_fallbacks():
    assert torch_schedule("interleaved", 4, 10, 2) == "Interleaved1F1B"  # rounds 5 + 5
    assert torch_schedule("interleaved", 4, 11, 2) is None  # PyTorch refuses 11 in 2 rounds
    assert torch_schedule("interleaved", 4, 11, 1) == "1F1B"  # Interleaved1F1B at v = 1 warms up more
    assert torch_schedule("zb-h1", 4, 8, 1) == "InterleavedZeroBubble"
    assert torch_schedule("interleaved-rf", 4, 8, 2) is None
    for name, schedule, csv in (("interleaved", "Interleaved1F1B", False), ("zb-v", "ZBVZeroBubble", False),
                                ("zb-v-greedy", "ZBVZeroBubble", True), ("interleaved-lm", "Interleaved1F1B", True),
                                ("dualpipe-v", "DualPipeV", False)):
        out = even_split(tiny(16), PipelineConfig(4, 8, 2, name)).export("torchtitan").data
        assert (out.schedule, out.csv is not None) == (schedule, csv), name
        assert ("pipeline_parallel_schedule_csv" in out.toml) == csv
    with pytest.raises(ConfigError, match="torchtitan settings cannot express sequence slices"):
        even_split(tiny(), PipelineConfig(2, 4, 1, "seq1f1b", splits=2)).export("torchtitan")


def test_fqns_follow_torchtitans_names():
    assert fqns([2, 1, 0, 1]) == [["tok_embeddings", "layers.0", "layers.1"], ["layers.2"], [],
                                  ["layers.3", "norm", "output"]]


def test_mixed_recompute_is_listed_and_costed(rng):
    cfg = PipelineConfig(2, 4, 2, "interleaved")
    counts = even_split(tiny(), cfg, "none").counts.copy()
    counts[0, NONE, 0] -= 2
    counts[0, FULL, 0] += 2
    plan = make_plan(tiny(), cfg, counts, status="given")
    plan = make_plan(tiny(), cfg.replace(memory_budget=float(plan.simulation.peak_memory.max())), counts,
                     status="given")
    out = plan.export("torchtitan").data
    assert not out.exact and "torchtitan applies one mode to every layer" in out.notes[0]
    back = load_plan(out.toml, "torchtitan", profile=tiny(), config=plan.config)
    np.testing.assert_array_equal(back.counts, out.expressed_counts)
    assert back.simulation.step_time == pytest.approx(out.expressed_step_time_ms)
    for mode in ("none", "select", "full"):  # the fastest uniform mode that fits
        other = even_split(tiny(), plan.config, mode)
        if other.fits:
            assert out.expressed_step_time_ms <= other.step_time + 1e-9
    assert "as torchtitan runs it" in out.text()


def test_random_plans_keep_their_partition(rng):
    for _ in range(10):
        prof = small_profile(rng)
        cfg = PipelineConfig(2, 3, 2, "interleaved")
        plan = make_plan(prof, cfg, random_counts(rng, prof, cfg), status="given")
        out = plan.export("torchtitan").data
        back = load_plan(out.toml, "torchtitan", profile=prof, config=cfg)
        np.testing.assert_array_equal(back.counts.sum(axis=(0, 1)), plan.counts.sum(axis=(0, 1)))
        np.testing.assert_array_equal(back.counts, out.expressed_counts)


def test_every_nth_layer_option_counts_over_a_ranks_parts():
    """selective_ac_option = "2": torchtitan counts a rank's layers over its parts in order and
    recomputes every second one fully."""
    toml = """
[parallelism]
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "Interleaved1F1B"
module_fqns_per_model_part = [["tok_embeddings", "layers.0", "layers.1", "layers.2"], ["layers.3", "layers.4"],
                              ["layers.5", "layers.6", "layers.7"], ["layers.8", "layers.9", "layers.10", "layers.11",
                              "norm", "output"]]
[activation_checkpoint]
mode = "selective"
selective_ac_option = "2"
[training]
local_batch_size = 4
"""
    plan = load_plan(toml, "torchtitan", profile=tiny())
    # rank 0 runs parts 0 and 2: layers 1..3 then 4..6 of the rank; rank 1 parts 1 and 3
    assert plan.counts[0, FULL].tolist() == [1, 1, 2, 2]
    assert plan.config.schedule == "interleaved" and plan.config.micro_batches == 4


BASE = """
[parallelism]
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "1F1B"
module_fqns_per_model_part = [["tok_embeddings", "layers.0", "layers.1", "layers.2", "layers.3", "layers.4",
                               "layers.5"], ["layers.6", "layers.7", "layers.8", "layers.9", "layers.10", "layers.11",
                               "norm", "output"]]
[activation_checkpoint]
mode = "full"
[training]
local_batch_size = 4
"""


@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda t: t.replace("[parallelism]", "[parallel]"), "no [parallelism] table"),
        (lambda t: t.replace("= 2\n", "= 0\n", 1), "pipeline_parallel_degree = 0"),
        (lambda t: t.replace('"1F1B"', '"Fancy"'), "pipeline_parallel_schedule = 'Fancy': expected one of"),
        (lambda t: t.replace('"layers.3", ', ""), "expected layers.3"),
        (lambda t: t.replace('"layers.11",', '"layers.11", "layers.12",'), "holds 13 layers: expected 12"),
        (lambda t: t.replace('"norm", ', '"lm_head", '), "'lm_head': expected tok_embeddings"),
        (lambda t: t.replace('["tok_embeddings", "layers.0"', '["layers.0", "tok_embeddings"'),
         "expected the embedding first in part 0"),
        (lambda t: t.replace('mode = "full"', 'mode = "memory_budget"'), "has no sapptk mode"),
        (lambda t: t.replace("local_batch_size = 4", "local_batch_size = 4.5"), "local_batch_size = 4.5"),
        (lambda t: t.replace("[training]", "[training"), "invalid TOML"),
        (lambda t: t.replace("= 2\n", "= 3\n", 1), "2 model parts on pipeline_parallel_degree = 3"),
    ],
)
def test_bad_files_name_the_key(edit, needle, tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(edit(BASE), encoding="utf-8")
    with pytest.raises(ConfigError) as exc:
        load_plan(path, "torchtitan", profile=tiny())
    assert needle in str(exc.value) and str(path) in str(exc.value), str(exc.value)


def test_the_file_and_the_config_must_agree():
    assert load_plan(BASE, "torchtitan", profile=tiny()).counts[0, FULL].sum() == 12
    with pytest.raises(ConfigError, match=re.escape("micro_batches = 4 in the file, 6 in the config")):
        load_plan(BASE, "torchtitan", profile=tiny(), config=PipelineConfig(2, 6, 1, "1f1b"))
    no_batch = BASE.replace("[training]\nlocal_batch_size = 4\n", "")
    with pytest.raises(ConfigError, match="pass a config for the micro-batches"):
        load_plan(no_batch, "torchtitan", profile=tiny())
    back = load_plan(no_batch, "torchtitan", profile=tiny(), config=PipelineConfig(2, 6, 1, "1f1b"))
    assert back.config.micro_batches == 6


def test_a_schedule_csv_next_to_the_file(tmp_path):
    program = build("zb-v-greedy", stages=2, micro_batches=4, chunks=2)
    cfg = PipelineConfig.from_program(program)
    out = even_split(tiny(), cfg, "full").export("torchtitan", csv_name=tmp_path / "mine.csv").data
    assert out.csv_name == str(tmp_path / "mine.csv")
    (tmp_path / "job.toml").write_text(out.toml, encoding="utf-8")
    with pytest.raises(ConfigError, match="mine.csv: cannot read"):
        load_plan(tmp_path / "job.toml", "torchtitan", profile=tiny())
    (tmp_path / "mine.csv").write_text(out.csv, encoding="utf-8")
    back = load_plan(tmp_path / "job.toml", "torchtitan", profile=tiny())
    assert back.config.program().units == program.units and back.config.schedule == "csv:mine"


def test_save_names_the_csv_so_any_launch_directory_works(tmp_path, monkeypatch):
    cfg = PipelineConfig(2, 5, 2, "interleaved-rf")
    monkeypatch.chdir(tmp_path)
    out = even_split(tiny(), cfg, "full").export("torchtitan").data
    assert out.csv_name == str(tmp_path / "schedule.csv")  # a relative name resolves now, not at launch
    assert tomllib.loads(out.toml)["parallelism"]["pipeline_parallel_schedule_csv"] == str(tmp_path / "schedule.csv")
    (tmp_path / "export").mkdir()
    export = even_split(tiny(), cfg, "full").export("torchtitan", Path("export") / "job.toml")  # relative to the cwd
    paths = export.written
    assert sorted(p.name for p in paths.values()) == ["job.py", "job.toml", "job_schedule.csv"]
    assert set(export.texts) == {"toml", "python", "csv"} and export.text == export.texts["toml"]
    data = tomllib.loads(paths["toml"].read_text(encoding="utf-8"))
    assert data["parallelism"]["pipeline_parallel_schedule_csv"] == str(tmp_path / "export" / "job_schedule.csv")
    assert paths["csv"].read_text(encoding="utf-8") == out.csv
    monkeypatch.chdir(tmp_path / "export")  # the reader too finds it from elsewhere
    back = load_plan(paths["toml"], "torchtitan", profile=tiny(), config=cfg)
    assert back.config.program().units == cfg.program().units
    python = paths["python"].read_text(encoding="utf-8")
    compile(python, "job.py", "exec")
    assert "os.path.join(os.path.dirname(os.path.abspath(__file__)), 'job_schedule.csv')" in python


@pytest.mark.parametrize(("mode", "ac"), [("none", "None"), ("select", "SelectiveAC.Config()"),
                                          ("full", "FullAC.Config()")])
def test_python_config_for_torchtitan_0_3(mode, ac):
    plan = uniform(tiny(), PipelineConfig(2, 4, 2, "interleaved"), mode)
    out = plan.export("torchtitan", base_config="pkg.configs:mine").data
    assert "torchtitan >= 0.3" in out.python and "torchtitan <= 0.2.2" in out.toml
    compile(out.python, "plan.py", "exec")  # valid Python (tests/runtimes runs it with torchtitan 0.3.0)
    assert f"config.activation_checkpoint = {ac}\n" in out.python
    assert "BASE_CONFIG = 'pkg.configs:mine'" in out.python and "NUM_LAYERS = 12" in out.python
    assert "'norm', 'lm_head']" in out.python and "'output'" not in out.python  # 0.3 renamed the output layer
    assert "pipeline_parallel_schedule = 'Interleaved1F1B'" in out.python
    assert "pipeline_parallel_schedule_csv = \"\"" in out.python
    with pytest.raises(ConfigError, match="expected 'module:function'"):
        uniform(tiny(), PipelineConfig(2, 4, 2, "interleaved"), mode).export("torchtitan", base_config="no_function")


# ------------------------------------------------- issue 22: magnitudes bounded before conversion
@pytest.mark.parametrize(
    ("edit", "needle"),
    [
        (lambda t: t.replace("pipeline_parallel_degree = 2", f"pipeline_parallel_degree = {2**70}"),
         "pipeline_parallel_degree = 1180591620717411303424: expected an integer from 1 to 1,000,000"),
        (lambda t: t.replace('"layers.0"', '"layers.' + "9" * 5000 + '"', 1), "expected layers.0"),
        (lambda t: t + '\n[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "' + "9" * 5000 + '"\n',
         "selective_ac_option = '999"),
    ],
)
def test_huge_numbers_are_clear_errors(edit, needle):
    profile = Profile("p", (LayerGroup("body", "body", 4, 1.0, 1.0, {"none": ModeCost(2.0, 1.0)}),))
    text = ('[parallelism]\npipeline_parallel_degree = 2\npipeline_parallel_schedule = "1F1B"\n'
            'module_fqns_per_model_part = [["layers.0", "layers.1"], ["layers.2", "layers.3"]]\n'
            "[training]\nlocal_batch_size = 4\n")
    with pytest.raises(ConfigError) as exc:
        load_plan(edit(text), "torchtitan", profile=profile)
    assert needle in str(exc.value) and len(str(exc.value)) < 400
