"""The ``sapptk`` command through ``main([...])``: output, files, exit codes, error messages."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from sapptk.cli import main
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.plan import load_plan, load_plans
from sapptk.profile import bundled_profile
from sapptk.schedules import names

ROOT = Path(__file__).resolve().parents[1]
MANUAL = ROOT / "data" / "llama2_70b_manual.yaml"
LLAMA_SETUP = ["--stages", "16", "--micro-batches", "32", "--chunks", "2", "--schedule", "interleaved"]
DEMO_SETUP = ["--stages", "4", "--micro-batches", "8", "--schedule", "1f1b"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -------------------------------------------------------------------------- schedules
def test_schedules_lists_the_registry(capsys):
    code, out, err = run(capsys, "schedules")
    assert code == 0 and not err
    for name in names():
        assert name in out
    assert "constraints" in out.splitlines()[0]


def test_help_and_usage_errors(capsys):
    assert run(capsys, "--help")[0] == 0
    code, _, err = run(capsys, "balance", "demo", "--micro-batches", "8")
    assert code == 2 and "--stages" in err
    code, _, err = run(capsys, "frobnicate")
    assert code == 2 and "invalid choice" in err


@pytest.mark.slow
def test_python_dash_m_runs_the_cli():
    done = subprocess.run([sys.executable, "-m", "sapptk", "schedules"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "interleaved" in done.stdout


# --------------------------------------------------------------------------- simulate
def test_simulate_the_shipped_manual_configs(capsys):
    code, out, err = run(capsys, "simulate", "llama2_70b", "--config", str(MANUAL), *LLAMA_SETUP, "--memory", "56000")
    assert code == 0 and not err
    lines = out.splitlines()
    assert "budget 56000 MB" in lines[0]
    header = lines[1].split()
    assert header == ["name", "step_ms", "bubble", "max_peak_mb", "on_device", "fits"]
    rows = {line.split()[0]: line.split() for line in lines[2:5]}
    assert list(rows) == ["even_select", "shift_stage0", "full_early"]
    assert rows["even_select"][-1] == "no" and rows["full_early"][-1] == "yes"
    # the table agrees with the library
    plans = load_plans(MANUAL, "mindformers", profile=bundled_profile("llama2_70b"),
                       config=PipelineConfig(16, 32, chunks=2, schedule="interleaved", memory_budget=56000))
    assert float(rows["full_early"][1]) == pytest.approx(plans["full_early"].step_time, abs=0.05)


def test_simulate_one_named_config_and_a_single_config_file(capsys, tmp_path):
    code, out, _ = run(capsys, "simulate", "llama2_70b", "--config", str(MANUAL), "--name", "full_early", *LLAMA_SETUP)
    assert code == 0 and "full_early" in out and "even_select" not in out
    assert "no budget" in out and out.splitlines()[2].split()[-1] == "yes"
    single = tmp_path / "mine.yaml"
    single.write_text("recompute: true\n")
    code, out, _ = run(capsys, "simulate", "demo", "--config", str(single), *DEMO_SETUP)
    assert code == 2  # demo has no full recompute: a clear error, not a crash
    single.write_text("select_recompute: true\nselect_comm_recompute: true\n")
    code, out, _ = run(capsys, "simulate", "demo", "--config", str(single), *DEMO_SETUP)
    assert code == 0 and out.splitlines()[2].split()[0] == "mine"


def test_simulate_bad_inputs_exit_2_with_the_message(capsys, tmp_path):
    code, out, err = run(capsys, "simulate", "llama2_70b", "--config", str(MANUAL), "--name", "nope", *LLAMA_SETUP)
    assert code == 2 and not out
    assert "no config named 'nope'" in err and "Traceback" not in err
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"mine": {"offset": [[1] + [0] * 15, [0] * 16]}}))
    code, _, err = run(capsys, "simulate", "llama2_70b", "--config", str(bad), *LLAMA_SETUP)
    assert code == 2
    assert str(bad) in err and "config 'mine'" in err and "offset sums to 1" in err
    code, _, err = run(capsys, "simulate", "llama2_70b", "--config", str(tmp_path / "none.yaml"), *LLAMA_SETUP)
    assert code == 2 and "none.yaml: cannot read the file" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["simulate", "nope", "--config", str(MANUAL), *LLAMA_SETUP], "bundled profile 'nope' does not exist"),
        (["simulate", "missing.json", "--config", str(MANUAL), *LLAMA_SETUP], "missing.json"),
        (["balance", "demo", "--stages", "0", "--micro-batches", "8"], "stages = 0"),
        (["balance", "demo", *DEMO_SETUP[:4], "--schedule", "zigzag"], "unknown schedule"),
        (["balance", "demo", *DEMO_SETUP, "--memory", "-5"], "memory_budget = -5"),
    ],
)
def test_bad_input_exits_2_without_traceback(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2, (out, err)
    assert message in err and "Traceback" not in err


# ---------------------------------------------------------------------------- balance
@pytest.mark.slow
def test_balance_solves_compares_and_writes(capsys, tmp_path):
    out_dir = tmp_path / "out"
    # without "comm": the MindFormers lists cannot hold select-only and comm-only layers in one cell
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, "--memory", "100000", "--recompute", "none", "select",
                         "both", "--time-limit", "20", "--out", str(out_dir))
    assert code == 0, err
    assert "status optimal" in out or "status feasible" in out
    for part in ("step time", "bubble", "memory budget 100000 MB", "all devices fit", "ratio = baseline step time"):
        assert part in out, part
    baseline = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith("  even_split")}
    # every distinct even split, weakest mode first (demo offers no full recompute)
    assert list(baseline) == [f"even_split({m})" for m in ("none", "select", "comm", "both")]
    none = baseline["even_split(none)"]
    assert none[4:6] == ["fits", "no"]  # the even split without recompute runs out of memory
    step = float(next(line for line in out.splitlines() if line.startswith("step time")).split()[2])
    assert float(none[-1]) == pytest.approx(float(none[2]) / step, abs=0.01)
    plan_yaml, layout_csv = out_dir / "plan.yaml", out_dir / "layout.csv"
    assert plan_yaml.exists() and layout_csv.exists()
    demo = bundled_profile("demo")
    setup = PipelineConfig(4, 8, schedule="1f1b", memory_budget=100000)
    plan = load_plan(plan_yaml, "mindformers", profile=demo, config=setup)
    assert plan.fits
    layout = pd.read_csv(layout_csv)
    assert list(layout.columns) == ["group", "chunk", "stage", "device", "virtual_stage", "mode", "layers"]
    np.testing.assert_array_equal(plan.layout["layers"].to_numpy(), layout["layers"].to_numpy())
    assert layout["layers"].sum() == 96
    saved = load_plan(out_dir / "sapptk_plan.yaml")  # the sapptk plan file: the same plan
    np.testing.assert_array_equal(saved.counts, plan.counts)
    assert saved.status in ("optimal", "feasible") and saved.step_time == pytest.approx(step, abs=0.05)


def test_balance_infeasible_exits_1(capsys, tmp_path):
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, "--memory", "40000", "--time-limit", "10",
                         "--out", str(tmp_path / "out"))
    assert code == 1, err
    assert "infeasible" in out and "even_split(none)" in out
    assert not (tmp_path / "out" / "plan.yaml").exists()


def test_balance_keeps_a_safety_margin(capsys):
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, "--memory", "120000", "--time-limit", "5",
                         "--memory-margin", "0.1")
    assert code == 0, err
    assert "safe budget of 108000 MB per device (memory_margin=0.1) under the 120000 MB budget" in out


@pytest.mark.parametrize(("args", "needle"), [
    (["--oom-risk", "0.01"], "memory_error"),
    (["--oom-risk", "0.7", "--memory-error", "0.02"], "oom_risk = 0.7"),
    (["--memory-error", "0.02"], "oom_risk"),
    (["--oom-risk", "-1"], "--oom-risk"),
])
def test_balance_refuses_bad_safety_before_solving(capsys, args, needle):
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, "--memory", "120000", "--time-limit", "5", *args)
    assert code == 2 and needle in err and "Traceback" not in err
    assert "profile demo" not in out  # refused before the setup line: nothing was solved


def test_balance_levers_reach_the_balancer(capsys, tmp_path):
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, "--memory", "110000", "--time-limit", "4",
                         "--per-micro-batch")
    assert code == 0, err
    assert "plan balance (per micro-batch)" in out
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, "--memory", "110000", "--time-limit", "4",
                         "--host-bandwidth", "10", "--out", str(tmp_path / "out"))
    assert code == 0, err
    saved = load_plan(tmp_path / "out" / "sapptk_plan.yaml")
    assert saved.config.host_bandwidth == 10 and "offload" in saved.config.recompute  # a link given allows offload
    assert saved.step_time == pytest.approx(saved.simulate().step_time)


@pytest.mark.parametrize(("args", "needle"), [
    (["--host-bandwidth", "0"], "--host-bandwidth"),
    (["--recompute", "offload"], "host_bandwidth"),
])
def test_balance_refuses_bad_levers(capsys, args, needle):
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, "--memory", "110000", "--time-limit", "2", *args)
    assert code == 2 and needle in err and "Traceback" not in err


def test_balance_out_when_the_mindformers_lists_cannot_express_the_plan(capsys, tmp_path, monkeypatch):
    """A cell with select-only and comm-only layers has no MindFormers spelling: layout.csv only."""
    import sapptk.balancer as balance_module
    from sapptk.plan import even_split, make_plan

    def stand_in(request):
        profile, config = request.profile, request.config
        counts = even_split(profile, config, "none").counts.copy()
        counts[0, 0, 1] -= 2  # device 1: one select-only and one comm-only layer
        counts[0, 1, 1] += 1
        counts[0, 2, 1] += 1
        return make_plan(profile, config, counts, status="feasible", step_time=1.0)

    monkeypatch.setattr(balance_module, "solve", stand_in)
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, "--out", str(tmp_path))
    assert code == 0, err
    assert "plan.yaml not written" in out and "cell [0][1]" in out
    assert (tmp_path / "layout.csv").exists() and not (tmp_path / "plan.yaml").exists()
    assert (tmp_path / "sapptk_plan.yaml").exists()


# ------------------------------------------------------------------------ boundaries
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["balance", "demo", *DEMO_SETUP, "--time-limit", "nan"], "time_limit = nan: expected a finite number > 0"),
        (["balance", "demo", *DEMO_SETUP, "--time-limit", "-1"], "time_limit = -1: expected a finite number > 0"),
        (["balance", "demo", *DEMO_SETUP, "--time-limit", "soon"], "time_limit = 'soon': expected a finite number"),
        (["balance", "demo", *DEMO_SETUP, "--workers", "0"], "workers = 0: expected an integer from 1 to 64"),
        (["balance", "demo", *DEMO_SETUP, "--workers", "100"], "workers = 100: expected an integer from 1 to 64"),
        (["balance", "demo", *DEMO_SETUP, "--workers", "99999999999"], "expected an integer from 1 to 64"),
        (["balance", "demo", *DEMO_SETUP, "--seed", "4294967296"], "expected an integer from 0 to 2,147,483,647"),
        (["sweep", "demo", "-p", "4", "-m", "8", "--workers", "100", "--out", "x"], "expected an integer from 1 to 64"),
        (["balance", "demo", "--stages", "1000000000000", "--micro-batches", "8"], "would have"),
        (["sweep", "demo", "-p", "4", "-m", "8", "--memory", "lots", "--out", "x"], "invalid budget (MB, or none)"),
        (["sweep", "demo", "-p", "4", "-m", "8", "--point-time-limit", "0", "--out", "x"],
         "point_time_limit = 0: expected a finite number > 0"),
        (["sweep", "demo", "-p", "4", "-m", "8", "--time-limit", "-1", "--out", "x"],
         "time_limit = -1: expected a finite number > 0"),
        (["simulate", "demo", "--config", str(ROOT / "tests" / "data" / "bad" / "mf_offset_wrap.yaml"), *DEMO_SETUP],
         "between -96 and 96"),
        (["balance", str(ROOT / "tests" / "data" / "bad" / "billion_laughs.yaml"), *DEMO_SETUP], "alias bomb"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(capsys, argv, message):
    code, out, err = run(capsys, *argv)
    assert code == 2 and message in err and "Traceback" not in err, err


@pytest.mark.parametrize(("flag", "keyword", "value"), [("--workers", "workers", 100), ("--workers", "workers", 0),
                                                      ("--seed", "seed", 2**31), ("--time-limit", "time_limit", -1)])
def test_the_cli_and_the_library_refuse_the_same_value_with_the_same_message(capsys, demo, flag, keyword, value):
    from sapptk import balance
    from sapptk.config import PipelineConfig

    with pytest.raises(ConfigError) as refused:
        balance(demo, PipelineConfig(stages=4, micro_batches=8), **{"time_limit": 1, keyword: value})
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, flag, str(value))
    assert code == 2 and str(refused.value) in err, (str(refused.value), err)


def test_balance_out_is_checked_before_solving(capsys, tmp_path, monkeypatch):
    import sapptk.balancer as balance_module

    def must_not_solve(*args, **kwargs):
        raise AssertionError("solved before checking --out")

    monkeypatch.setattr(balance_module, "solve", must_not_solve)
    a_file = tmp_path / "file"
    a_file.write_text("")
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, "--out", str(a_file))
    assert code == 2 and "output folder (--out) is a file" in err and "step time" not in out

    import sapptk.files as files_module

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system")

    monkeypatch.setattr(files_module.tempfile, "mkstemp", read_only)
    code, out, err = run(capsys, "balance", "demo", *DEMO_SETUP, "--out", str(tmp_path / "new"))
    assert code == 2 and "cannot write in the output folder (--out): the file system is read-only" in err


@pytest.mark.slow
def test_names_that_are_not_utf8_are_printed_escaped(tmp_path):
    """A profile file and an --out folder whose names are not UTF-8, on a strict UTF-8 terminal."""
    import os

    profile = tmp_path / os.fsdecode(b"d\xffemo.json")
    profile.write_bytes((ROOT / "data" / "demo.json").read_bytes())
    out = tmp_path / os.fsdecode(b"o\xffut")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run([sys.executable, "-m", "sapptk", "balance", str(profile), *DEMO_SETUP, "--time-limit", "5",
                           "--out", str(out)], capture_output=True, env=env, check=False)
    assert done.returncode in (0, 1), done.stderr.decode(errors="replace")[-800:]
    assert b"Traceback" not in done.stderr and b"o\\udcffut" in done.stdout
    assert (out / "layout.csv").exists()
