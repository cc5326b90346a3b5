"""``sapptk export`` and ``sapptk simulate --schedule-csv``."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest
import yaml

from sapptk.cli import main
from sapptk.config import PipelineConfig
from sapptk.plan import even_split, load_plan
from sapptk.profile import bundled_profile
from sapptk.schedules import from_csv

CUSTOM = Path(__file__).parent / "data" / "schedules" / "w_last_p3_v2_m6.csv"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def saved(tmp_path, demo):
    cfg = PipelineConfig(4, 8, 2, "interleaved", memory_budget=60000)
    plan = even_split(demo, cfg, "both")
    path = tmp_path / "plan.yaml"
    plan.export("sapptk", path)
    return plan, path


def test_export_to_every_format_prints_what_reads_back(capsys, saved, tmp_path):
    plan, path = saved
    code, out, err = run(capsys, "export", str(path), "--to", "megatron")
    assert code == 0, err
    args = next(line for line in out.splitlines() if line.startswith("--pipeline-model-parallel-size"))
    back = load_plan(args, "megatron", profile=plan.profile, config=plan.config)
    np.testing.assert_array_equal(back.counts.sum(axis=(0, 1)), plan.counts.sum(axis=(0, 1)))
    assert "Megatron applies one setting" in out  # demo's 'both' mode has no Megatron spelling

    code, out, err = run(capsys, "export", str(path), "--to", "torchtitan")
    assert code == 0, err
    assert tomllib.loads(out)["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"

    code, out, err = run(capsys, "export", str(path), "--to", "mindformers")
    assert code == 0, err
    back = load_plan(yaml.safe_load(out), "mindformers", profile=plan.profile, config=plan.config)
    np.testing.assert_array_equal(back.counts, plan.counts)

    code, out, err = run(capsys, "export", str(path), "--to", "torch-csv")
    assert code == 0, err
    assert out == plan.config.program().to_csv()


def test_export_to_files_writes_the_schedule_csv_next_to_the_toml(capsys, tmp_path, demo):
    cfg = PipelineConfig(2, 4, 2, "zb-v-greedy")
    plan = even_split(demo, cfg, "none")
    plan.export("sapptk", tmp_path / "plan.yaml")
    code, out, err = run(capsys, "export", str(tmp_path / "plan.yaml"), "--to", "torchtitan",
                         "--out", str(tmp_path / "job.toml"))
    assert code == 0, err
    assert (tmp_path / "job_schedule.csv").exists() and "job_schedule.csv" in out
    assert (tmp_path / "job.py").exists() and "job.py" in out  # the torchtitan >= 0.3 config, side by side
    back = load_plan(tmp_path / "job.toml", "torchtitan", profile=demo, config=cfg)
    np.testing.assert_array_equal(back.counts, plan.counts)
    assert back.config.program().units == cfg.program().units
    # the TOML names the CSV by its absolute path (torchtitan looks it up from the launch directory)
    assert f'pipeline_parallel_schedule_csv = "{tmp_path / "job_schedule.csv"}"' in (tmp_path / "job.toml").read_text()
    code, out, err = run(capsys, "export", str(tmp_path / "plan.yaml"), "--to", "torchtitan-py",
                         "--out", str(tmp_path / "titan.py"))
    assert code == 0, err
    python = (tmp_path / "titan.py").read_text(encoding="utf-8")
    assert "def sapptk_plan():" in python and "'titan_schedule.csv')" in python
    assert (tmp_path / "titan_schedule.csv").read_text(encoding="utf-8") == cfg.program().to_csv()


def test_export_errors(capsys, tmp_path, saved, demo):
    code, _, err = run(capsys, "export", str(tmp_path / "none.yaml"), "--to", "megatron")
    assert code == 2 and "cannot read" in err
    code, _, err = run(capsys, "export", str(saved[1]), "--to", "deepspeed")
    assert code == 2 and "invalid choice" in err
    v = tmp_path / "v.yaml"
    even_split(demo, PipelineConfig(2, 4, 2, "zb-v")).export("sapptk", v)
    code, _, err = run(capsys, "export", str(v), "--to", "megatron")
    assert code == 2 and "places its chunks in a V" in err


def test_simulate_a_schedule_csv(capsys, tmp_path):
    code, out, err = run(capsys, "simulate", "demo", "--schedule-csv", str(CUSTOM), "--memory", "200000")
    assert code == 0, err
    assert "csv:w_last_p3_v2_m6 p=3 v=2 m=6" in out and "even_split(none)" in out
    demo = bundled_profile("demo")
    cfg = PipelineConfig.from_program(from_csv(CUSTOM), memory_budget=200000)
    row = next(line.split() for line in out.splitlines() if line.startswith("even_split(none)"))
    assert float(row[1]) == pytest.approx(even_split(demo, cfg, "none").step_time, abs=0.05)
    # with MindFormers configs on the same schedule
    cfg_file = tmp_path / "mf.yaml"
    cfg_file.write_text(yaml.safe_dump({"a": {"select_recompute": True}, "b": {"offset": [[1, 0, -1], [0, 0, 0]]}}))
    code, out, err = run(capsys, "simulate", "demo", "--schedule-csv", str(CUSTOM), "--config", str(cfg_file))
    assert code == 0, err
    assert [line.split()[0] for line in out.splitlines()[2:4]] == ["a", "b"]


def test_simulate_errors(capsys):
    code, _, err = run(capsys, "simulate", "demo", "--schedule-csv", str(CUSTOM), "--stages", "4")
    assert code == 2 and "--stages = 4" in err and "runs stages = 3" in err
    code, _, err = run(capsys, "simulate", "demo", "-p", "3", "-m", "4")
    assert code == 2 and "nothing to simulate" in err
    code, _, err = run(capsys, "simulate", "demo", "--config", "x.yaml")
    assert code == 2 and "--stages and --micro-batches are required" in err


def test_schedule_options_are_selectable_from_the_command_line(capsys, tmp_path):
    config = tmp_path / "none.yaml"
    config.write_text("select_recompute: false\n", encoding="utf-8")
    for name in ("interleaved-rf", "interleaved-megatron", "interleaved-lm-rf", "zb-v-greedy"):
        code, out, err = run(capsys, "simulate", "demo", "-p", "4", "-m", "10", "-v", "2", "--schedule", name,
                             "--config", str(config))
        assert code == 0, err
        assert f"{name} p=4 v=2 m=10" in out
    code, out, err = run(capsys, "schedules")
    assert "interleaved-rf" in out and "zb-v-greedy" in out


@pytest.mark.slow
def test_a_sweep_compares_the_grouping_options(demo):
    """The grouping options are schedules like any other: a sweep's schedule field takes them."""
    from sapptk.sweeps import sweep

    frame = sweep(demo, {"schedule": ["interleaved", "interleaved-rf"], "stages": [4], "micro_batches": [10],
                         "chunks": [2], "memory_budget": [None]},
                  point_time_limit=10, progress=False, deterministic=True)
    assert list(frame["schedule"].astype(str)) == ["interleaved", "interleaved-rf"]
    assert frame["error"].isna().all() if "error" in frame else True
    assert (frame["status"].astype(str).isin(["optimal", "feasible"])).all()
