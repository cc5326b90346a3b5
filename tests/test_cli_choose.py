"""``sapptk choose --model CARD --gpu NAME``: the question from a model card, its files and its
refusals (the profile form is tested in tests/test_choose.py)."""

from __future__ import annotations

import re

import pandas as pd
import pytest

import sapptk
import sapptk.choosing
from sapptk.cli import main
from sapptk.models import available

# a tiny card on two devices: 2 x 1 x 1 pipeline shapes, one or two schedules; seconds
TINY = ["choose", "--model", "gpt2", "--gpu", "h100", "--devices", "2", "--global-batch", "4", "--tp", "1",
        "--seq-length", "1024", "--schedule", "1f1b", "zb-h1", "--chunks", "1", "--no-progress", "--deterministic"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_choose_from_a_card_writes_the_plan_the_ranking_and_the_page(tmp_path, capsys) -> None:
    code, out, err = run(capsys, *TINY, "--out", str(tmp_path))
    assert code == 0, err
    assert "model card gpt2 on h100, 2 devices, global batch 4" in out and "winner proven" in out
    # the plan files of `balance --out`
    assert {p.name for p in tmp_path.iterdir()} == {"sapptk_plan.yaml", "plan.yaml", "layout.csv", "choice.csv",
                                                   "choice.html"}
    ranking = pd.read_csv(tmp_path / "choice.csv")
    assert len(ranking) == 4  # p in {1, 2} x two schedules, one chunk, tp 1
    assert {"step_time_ms", "bound_ms", "peak_mb_max", "memory_budget_mb", "tp", "zero"} <= set(ranking)
    assert list(ranking["rank"]) == [1, 2, 3, 4] and ranking.loc[0, "status"] == "balanced"
    # the plan written is the winner of the ranking, on the GPU's memory
    winner = ranking.iloc[0]
    plan = sapptk.load_plan(tmp_path / "sapptk_plan.yaml")
    assert (plan.config.schedule, plan.config.stages, plan.config.micro_batches) == (
        winner["schedule"], winner["stages"], winner["micro_batches"])
    assert plan.config.memory_budget == sapptk.models.hardware("h100").memory_mb == winner["memory_budget_mb"]
    assert plan.step_time == pytest.approx(winner["pipeline_ms"], rel=1e-9)
    page = (tmp_path / "choice.html").read_text(encoding="utf-8")
    assert "<html" in page and not re.search(r"<script[^>]*\bsrc=", page)  # standalone: BokehJS inline
    for part in ("setups by step time", "Pareto front", "the winner's timeline", '"name":"timeline"', "winner proven",
                 "bound_ms"):
        assert part in page, part


def test_choose_passes_the_card_the_gpu_and_the_lists(monkeypatch, capsys) -> None:
    seen: list[tuple[object, dict]] = []

    class Stop(Exception):
        pass

    def fake_choose(source, **kwargs):
        seen.append((source, kwargs))
        raise Stop

    monkeypatch.setattr(sapptk.choosing, "choose", fake_choose)
    with pytest.raises(Stop):
        main(["choose", "--model", "llama2-7b", "--gpu", "h800", "--devices", "16", "--global-batch", "64",
              "--tp", "1,2,4", "--cp", "1", "--ep", "1", "--zero", "distributed,zero2", "--seq-length", "2048",
              "--memory", "70000", "--memory-margin", "0.05", "--time-limit", "90", "--setup-time-limit", "5",
              "--no-progress"])
    source, kwargs = seen[-1]
    assert source.name == "llama2-7b"
    assert kwargs["hardware"].name == "h800" and kwargs["memory_budget"] == 70000
    assert (kwargs["tp"], kwargs["cp"], kwargs["ep"], kwargs["zero"]) == ([1, 2, 4], [1], [1], ["distributed", "zero2"])
    assert (kwargs["seq_length"], kwargs["devices"], kwargs["global_batch"]) == (2048, 16, 64)
    assert (kwargs["memory_margin"], kwargs["time_limit"], kwargs["setup_time_limit"]) == (0.05, 90, 5)
    with pytest.raises(Stop):  # no --memory: the GPU's (choose's memory_budget=None); no lists: choose's defaults
        main(["choose", "--model", "llama2-7b", "--gpu", "h100", "--devices", "8", "--global-batch", "8"])
    assert seen[-1][1]["memory_budget"] is None and not {"tp", "cp", "ep", "zero", "seq_length"} & set(seen[-1][1])
    last = seen[-1][1]
    assert (last["memory_margin"], last["time_limit"], last["setup_time_limit"]) == (None, None, 20)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "llama9", "--gpu", "h100"], "'llama9' is not bundled: expected one of " + ", ".join(available())),
        (["--model", "gpt2", "--gpu", "h1000"],
         "'h1000' is not a bundled card: expected one of " + ", ".join(available("hardware"))),
        (["--model", "gpt2"], "expected --gpu NAME, one of " + ", ".join(available("hardware"))),
        (["--model", "gpt2", "--gpu", "h100", "--tp", "two"], "argument --tp: 'two': expected integers >= 1"),
        (["--model", "gpt2", "--gpu", "h100", "--ep", "1,0"], "argument --ep: '1,0': expected integers >= 1"),
        (["--model", "gpt2", "--gpu", "h100", "--seq-length", "-5"],
         "argument --seq-length/--sequence-length: '-5': expected an integer >= 1"),
        (["--model", "gpt2", "--gpu", "h100", "--zero", "zero9"], "zero = 'zero9': expected one of"),
        (["--model", "gpt2", "--gpu", "h100", "--time-limit", "nan"], "argument --time-limit"),
        (["--model", "gpt2", "--gpu", "h100", "--memory-margin", "-1"], "argument --memory-margin"),
        (["demo", "--memory", "60000", "--tp", "2"], "--tp only with --model"),
        (["demo"], "expected --memory MB"),
        (["demo", "--model", "gpt2", "--gpu", "h100"], "got both PROFILE 'demo' and --model 'gpt2'"),
        ([], "expected a PROFILE or --model CARD"),
    ],
)
def test_choose_refuses_bad_input_naming_it(capsys, argv, message) -> None:
    code, out, err = run(capsys, "choose", *argv, "--devices", "2", "--global-batch", "4", "--no-progress")
    assert code == 2 and message in err, err
    assert "Traceback" not in err


@pytest.mark.parametrize("flag", ["--devices", "--global-batch"])
def test_choose_refuses_a_bad_count_naming_the_flag(capsys, flag) -> None:
    argv = {"--devices": "2", "--global-batch": "4"} | {flag: "0"}
    code, _, err = run(capsys, "choose", "--model", "gpt2", "--gpu", "h100", *[x for kv in argv.items() for x in kv])
    assert code == 2 and f"argument {flag}: '0': expected an integer >= 1" in err


def test_choice_page_refuses_what_is_not_a_choice() -> None:
    from sapptk.viz.choice_page import choice_page

    with pytest.raises(sapptk.errors.SapptkError, match="expected a sapptk.Choice"):
        choice_page(pd.DataFrame())
