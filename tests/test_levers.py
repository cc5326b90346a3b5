"""The lever registry (sapptk.levers) and its readers: exports, sweep, choose, the command line,
the Explorer. A lever described once is what every reader uses; a made-up lever added to the
registry reaches the readers that derive from it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

import sapptk.levers as levers_module
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.formats.base import refuse_levers
from sapptk.formats.registry import FORMATS
from sapptk.levers import LEVERS, SWEPT, Field, Lever, Refusal, choose_levers, cli_fields, lever
from sapptk.profile import bundled_profile


def test_every_refusal_names_a_format_and_every_lever_its_fields() -> None:
    assert [item.name for item in LEVERS] == ["offload", "slices", "per_micro_batch", "memory_margin", "oom_risk"]
    for item in LEVERS:
        assert item.fields and item.phase and item.bound, item.name
        assert all(r.fmt in FORMATS and r.fmt != "sapptk" for r in item.refusals), item.name
        assert all(c.field in {f.name for f in item.fields} | {item.name} for c in item.controls), item.name
    with pytest.raises(KeyError, match="no lever 'nope'"):
        lever("nope")


def test_sweep_frame_and_cli_come_from_the_registry() -> None:
    from sapptk.explorer.controls import REQUEST_LEVERS
    from sapptk.sweeps import LEVER_COLUMNS, LEVER_FIELDS
    from sapptk.sweeps.frame import BOOL_COLUMNS, FLOAT_INPUTS

    names = [f.name for f in SWEPT]
    assert names == ["per_micro_batch", "memory_margin", "oom_risk", "memory_error"]
    assert list(LEVER_FIELDS) == names and list(LEVER_COLUMNS) == names
    assert BOOL_COLUMNS == ("per_micro_batch",) and set(names[1:]) <= set(FLOAT_INPUTS)
    assert [f.cli for f in cli_fields("sweep")] == ["--per-micro-batch", "--memory-margin", "--oom-risk",
                                                     "--memory-error"]
    assert "--choose-splits" in [f.cli for f in cli_fields("balance")]
    assert [f.cli for f in cli_fields("choose")] == ["--memory-margin", "--oom-risk", "--memory-error"]
    assert list(REQUEST_LEVERS) == names


class _Plan:
    """A stand-in plan with only what the refusals read."""

    def __init__(self, offload: bool = False, splits: int = 1, alternative: bool = False) -> None:
        self.offload = np.array([[1, 0], [2, 0]]) if offload else None
        self.config = PipelineConfig(4, 8, splits=splits, schedule="1f1b" if splits == 1 else "seq1f1b")
        self.alternative = type("A", (), {"mask": np.ones((2, 3), bool)})() if alternative else None


def test_one_refusal_reads_the_registry_and_keeps_the_messages() -> None:
    with pytest.raises(ConfigError, match=r"^Megatron-LM's arguments \(its layer-level --cpu-offloading .* cannot "
                                          r"express activation offload: this plan offloads 3 layers'"):
        refuse_levers(_Plan(offload=True), "megatron")
    with pytest.raises(ConfigError, match=r"^PyTorch's schedule CSV cannot express sequence slices: .* k = 2 "):
        refuse_levers(_Plan(splits=2), "torch-csv")
    with pytest.raises(ConfigError, match=r"^a MindFormers config: this plan recomputes per micro-batch \(6 "):
        refuse_levers(_Plan(alternative=True), "mindformers")
    refuse_levers(_Plan(offload=True, splits=2, alternative=True), "sapptk")  # sapptk's own file keeps them all
    refuse_levers(_Plan(splits=2), "mindformers")  # equal slices: MindFormers runs them


def test_a_new_lever_reaches_the_exports_and_choose(monkeypatch: pytest.MonkeyPatch) -> None:
    made_up = Lever(name="made_up", title="a made-up lever", fields=(Field("made_up", "flag", default=False),),
                    phase="none", bound="none", uses=lambda plan: True,
                    message=lambda plan, what, why: f"{what} cannot run it ({why})",
                    on=lambda values: bool(values.get("made_up")), shown=lambda values: "made_up = True",
                    choose_refusal="no bound holds for it", refusals=(Refusal("torch-csv", "the CSV", "no column"),))
    monkeypatch.setattr(levers_module, "LEVERS", (*LEVERS, made_up))
    monkeypatch.setattr("sapptk.formats.base.LEVERS", (*LEVERS, made_up))
    with pytest.raises(ConfigError, match=r"^the CSV cannot run it \(no column\)$"):
        refuse_levers(_Plan(), "torch-csv")
    with pytest.raises(ConfigError, match="made_up = True: a made-up lever is not offered by choose: no bound"):
        choose_levers({"made_up": True})
    assert choose_levers({"made_up": False}) == {"made_up": False}


def test_which_levers_exclude_which_is_the_registry() -> None:
    from sapptk.levers import check_exclusions

    pairs = {(item.name, other) for item in LEVERS for other in item.excludes}
    assert pairs == {("slices", "per_micro_batch"), ("slices", "offload"), ("per_micro_batch", "offload")}
    with pytest.raises(ConfigError, match=r"^per_micro_batch = True with 'offload' in recompute: expected one"):
        check_exclusions({"per_micro_batch": True, "recompute": ("none", "offload")})
    with pytest.raises(ConfigError, match=r"^'offload' in config.recompute: not modelled with the sequence slices "
                                          r"of a long-context profile \(seq_length = 4096\)"):
        check_exclusions({"splits": 2, "seq_length": 4096, "recompute": ("offload",),
                          "recompute_name": "config.recompute"})
    check_exclusions({"splits": 2, "seq_length": 4096, "recompute": ("none",), "per_micro_batch": False})


def test_choose_checks_the_levers_as_described() -> None:
    from sapptk.choosing.request import ChooseRequest

    demo = bundled_profile("demo")
    base = {"source": demo, "devices": 4, "global_batch": 8, "memory_budget": 60000.0, "stages": [4]}
    for bad, message in [({"memory_margin": -1}, "memory_margin = -1"), ({"oom_risk": 0.7, "memory_error": 0.1},
                         "oom_risk = 0.7"), ({"memory_error": 0.1}, "memory_error: only used with oom_risk"),
                         ({"oom_risk": 0.01}, "oom_risk: give memory_error too"),
                         ({"per_micro_batch": "yes"}, "per_micro_batch = 'yes'"),
                         ({"recompute": ["none", "offload"]}, "activation offload is not offered by choose")]:
        with pytest.raises(ConfigError, match=message):
            ChooseRequest(**base, **bad)
    request = ChooseRequest(**base, memory_margin=1000, oom_risk=0.01, memory_error=0.05)
    assert (request.memory_margin, request.oom_risk, request.memory_error) == (1000.0, 0.01, 0.05)


def test_explorer_levers_from_the_registry() -> None:
    pytest.importorskip("ipywidgets")
    from sapptk.explorer.controls import Controls, Levers

    levers = Levers(memory_margin=0.05, oom_risk=0.01, memory_error=0.02)
    assert levers.text() == "margin 5 % of the budget, OOM risk 0.01 at 2 % error"
    assert Levers() == Levers(per_micro_batch=False) and Levers().text() == ""
    with pytest.raises(TypeError, match="unknown lever"):
        Levers(offload=True)
    controls = Controls(bundled_profile("demo"), PipelineConfig(4, 8), time_limit=5, levers=levers,
                        report=lambda text: None)
    assert controls.levers() == levers and not controls.entries["memory error"].disabled
    assert controls.entries["host bandwidth"].disabled  # no offload: its bandwidth does not apply
    controls.oom_risk.value = 0.0
    assert controls.entries["memory error"].disabled and controls.levers().memory_error is None
    controls.offload.value = True
    assert not controls.entries["host bandwidth"].disabled and "offload" in controls.config().recompute
    assert dataclasses.is_dataclass(lever("oom_risk").controls[0])
