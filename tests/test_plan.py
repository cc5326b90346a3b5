"""Plan: construction and validation, even split, DataFrame views, fits, summary, YAML."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest
import yaml

from sapptk import baselines
from sapptk.config import PipelineConfig
from sapptk.costs import check_counts, simulate_counts
from sapptk.errors import ConfigError
from sapptk.formats import mindformers
from sapptk.plan import PLAN_STATUSES, even_split, load_plan, load_plans, make_plan
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile, bundled_profile

NONE, SELECT, COMM, BOTH, FULL = range(5)


def tiny(n: int = 16, modes: tuple[str, ...] = MODES) -> Profile:
    table = {m: ModeCost(backward=2.0 + i * 0.1, activation=10.0 - i * 2) for i, m in enumerate(MODES) if m in modes}
    return Profile("tiny", (
        LayerGroup("head", "head", 1, 0.5, 5.0),
        LayerGroup("body", "body", n, 1.0, 3.0, table),
        LayerGroup("tail", "tail", 1, 0.7, 4.0),
    ))


def even_cells(config: PipelineConfig, counts: np.ndarray) -> np.ndarray:
    """Body layers per cell [chunk][device] of an assignment."""
    return counts.sum(axis=(0, 1))[mindformers.cell_grid(config.program())]


P4V2 = PipelineConfig(stages=4, micro_batches=8, chunks=2, schedule="interleaved", memory_budget=500.0)


# ------------------------------------------------------------------------- even split
@pytest.mark.parametrize(
    ("total", "p", "v", "expected"),
    [
        (96, 16, 2, [[3] * 16, [3] * 16]),
        (48, 5, 1, [[9, 10, 10, 10, 9]]),  # MindFormers' documented example: offset [0, 1, 1, 1, 0]
        (10, 4, 2, [[1, 1, 1, 1], [1, 2, 2, 1]]),  # extras on the middle devices of the last chunk
        (13, 4, 2, [[1, 2, 1, 1], [2, 2, 2, 2]]),  # last chunk full, then the chunk before
        (9, 4, 1, [[2, 3, 2, 2]]),  # one extra: the middle device, ties to the lower one
        (3, 4, 1, [[1, 1, 1, 0]]),  # ties go to the lower device
    ],
)
def test_even_split_places_extras_in_the_middle_of_the_last_chunk(total, p, v, expected):
    config = PipelineConfig(stages=p, micro_batches=max(p, 8), chunks=v, schedule="interleaved" if v > 1 else "1f1b")
    counts = baselines.even_counts(tiny(total), config)
    cells = even_cells(config, counts)
    assert cells.tolist() == expected
    assert cells.sum() == total and counts[0, NONE].sum() == total


def test_even_split_totals_placement_and_mode():
    prof = tiny(13)
    plan = even_split(prof, P4V2, "select")
    assert plan.status == "given" and plan.source == "even_split(select)"
    assert plan.counts.sum() == 13
    assert (plan.counts[0, SELECT].sum(), plan.counts[0].sum() - plan.counts[0, SELECT].sum()) == (13, 0)
    # [c][s] cells of the even split, through the MindFormers offsets
    offsets = np.array(plan.export("mindformers").data["body"]["offset"])
    np.testing.assert_array_equal(offsets + 13 // 8, [[1, 2, 1, 1], [2, 2, 2, 2]])
    assert plan.step_time == pytest.approx(simulate_counts(prof, P4V2, plan.counts).step_time)


def test_even_split_recompute_choices():
    demo = bundled_profile("demo")  # none, select, comm, both
    setup = PipelineConfig(stages=4, micro_batches=8, schedule="1f1b")
    assert even_split(demo, setup, "strongest").source == "even_split(strongest)"
    assert even_split(demo, setup, "strongest").counts[0, BOTH].sum() == 96
    with pytest.raises(ConfigError, match=r"group 'BODY' has no 'full' mode: expected one of its modes none, select"):
        even_split(demo, setup, "full")
    with pytest.raises(ConfigError, match=r"recompute = 'everything': expected one of none, select"):
        even_split(demo, setup, "everything")


def test_even_split_several_groups_stay_contiguous():
    ds = bundled_profile("deepseek_v3")  # 3 dense then 58 MoE layers
    setup = PipelineConfig(stages=4, micro_batches=8, chunks=2, schedule="interleaved")
    plan = even_split(ds, setup, "full")
    check_counts(ds, setup, plan.counts)
    per_vs = plan.counts.sum(axis=(0, 1))
    np.testing.assert_array_equal(per_vs.reshape(2, 4), even_cells(setup, baselines.even_counts(tiny(61), setup)))
    assert plan.counts[0].sum() == 3 and plan.counts[1].sum() == 58
    assert set(plan.export("mindformers").data) == {"DenseDecoderLayer", "MoEDecoderLayer"}


# ----------------------------------------------------------------------- make_plan
def test_make_plan_keeps_a_read_only_copy():
    prof = tiny()
    counts = np.zeros((1, 5, 8), dtype=int)
    counts[0, NONE] = 2
    plan = make_plan(prof, P4V2, counts, status="optimal", step_time=12.5, bound=12.0, gap=0.04, solve_seconds=1.5)
    counts[0, NONE, 0] = 99
    assert plan.counts[0, NONE, 0] == 2
    with pytest.raises(ValueError):
        plan.counts[0, 0, 0] = 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.status = "given"
    assert (plan.step_time, plan.bound, plan.gap, plan.solve_seconds) == (12.5, 12.0, 0.04, 1.5)
    assert plan.solved


def test_make_plan_validates():
    prof = tiny()
    good = np.zeros((1, 5, 8), dtype=int)
    good[0, NONE] = 2
    with pytest.raises(ConfigError, match="status = 'solved': expected one of optimal"):
        make_plan(prof, P4V2, good, status="solved")
    with pytest.raises(ConfigError, match="has 16 layers, the assignment places 17"):
        make_plan(prof, P4V2, good + np.eye(1, 40, dtype=int).reshape(1, 5, 8), status="given")
    with pytest.raises(ConfigError, match="expected shape"):
        make_plan(prof, P4V2, good[:, :, :4], status="feasible")
    lacking = tiny(modes=("none", "full"))
    bad = good.copy()
    bad[0, NONE, 0], bad[0, SELECT, 0] = 1, 1
    with pytest.raises(ConfigError, match="does not offer recompute mode 'select'"):
        make_plan(lacking, P4V2, bad, status="given")
    for status in PLAN_STATUSES:  # every status is accepted; exactly the three with an assignment are solved
        plan = make_plan(prof, P4V2, good if status in ("optimal", "feasible", "given") else None, status=status,
                         step_time=1.0)
        assert plan.status == status and plan.solved == (status in ("optimal", "feasible", "given"))


def test_plan_without_assignment():
    plan = make_plan(tiny(), P4V2, None, status="infeasible", message="no assignment fits 500 MB", solve_seconds=0.2)
    assert not plan.solved and not plan.fits
    assert plan.counts.shape == (1, 5, 8) and plan.counts.sum() == 0
    text = plan.summary()
    assert "status infeasible" in text and "no assignment fits 500 MB" in text
    for call in (plan.simulate, lambda: plan.export("mindformers"), lambda: plan.devices):
        with pytest.raises(ConfigError, match="status 'infeasible' and no layer assignment"):
            call()
    assert plan.layout.empty


def test_given_plan_is_simulated_once():
    plan = even_split(tiny(), P4V2, "none")
    assert plan.simulation.step_time == plan.step_time
    assert plan.simulation is plan.simulation
    again = plan.simulate(overlap="max")  # keyword arguments reach the simulator; a fresh run
    assert again is not plan.simulation and again.step_time == plan.step_time


# ----------------------------------------------------------------------------- frames
@pytest.fixture
def mixed() -> object:
    """A given plan with several modes and uneven cells on p=4, v=2."""
    return load_plan({
        "offset": [[-1, 0, 0, 1], [1, 0, 0, -1]],
        "recompute": [[1, 2, 0, 0], [0, 0, 0, 0]],
        "select_recompute": [[1, 2, 2, 3], [0, 0, 0, 0]],
        "select_comm_recompute": [[0, 0, 1, 0], [3, 0, 0, 0]],
    }, "mindformers", profile=tiny(16), config=P4V2)


def test_layout_is_tidy(mixed):
    layout = mixed.layout
    assert list(layout.columns) == ["group", "chunk", "stage", "device", "virtual_stage", "mode", "layers"]
    assert isinstance(layout["group"].dtype, pd.CategoricalDtype)
    assert list(layout["mode"].cat.categories) == list(MODES) and layout["mode"].cat.ordered
    assert (layout["layers"] > 0).all()
    assert layout["layers"].sum() == 16
    assert not layout.duplicated(["group", "virtual_stage", "mode"]).any()
    assert (layout["virtual_stage"] == layout["chunk"] * 4 + layout["stage"]).all()
    assert (layout["device"] == layout["stage"]).all()  # interleaved placement
    assert layout["virtual_stage"].is_monotonic_increasing
    # rows reproduce the counts
    rebuilt = np.zeros_like(mixed.counts)
    for row in layout.itertuples():
        rebuilt[0, MODES.index(row.mode), row.virtual_stage] = row.layers
    np.testing.assert_array_equal(rebuilt, mixed.counts)
    cell = layout[(layout.chunk == 0) & (layout.stage == 2)]
    assert dict(zip(cell["mode"].astype(str), cell["layers"], strict=True)) == {"select": 1, "both": 1}


def test_devices_frame(mixed):
    frame = mixed.devices
    assert list(frame.columns) == [
        "device", "layers", "params_mb", "peak_mb", "budget_mb", "fits", "forward_ms", "backward_ms", "recompute_ms",
    ]
    assert frame["device"].tolist() == [0, 1, 2, 3]
    assert frame["layers"].tolist() == [1 + 3, 2 + 2, 2 + 2, 3 + 1]
    assert frame["fits"].dtype == bool
    np.testing.assert_allclose(frame["peak_mb"], mixed.simulation.peak_memory.to_numpy())
    costs = mixed.costs
    assert frame["forward_ms"].sum() == pytest.approx(costs.forward.sum())
    assert frame["backward_ms"].sum() == pytest.approx((costs.backward + costs.weight).sum())
    assert frame["recompute_ms"].sum() == pytest.approx(costs.recompute_overhead.sum())
    # static memory: body params 3 MB per layer, head (5 MB) on device 0 and tail (4 MB) on device 3
    assert frame["params_mb"].tolist() == pytest.approx([4 * 3 + 5, 12, 12, 12 + 4])
    assert (frame["budget_mb"] == 500).all()
    # the old name (a per-device table under the name of a count) is gone, and says where it went
    with pytest.raises(AttributeError, match=r"renamed Plan.devices.*plan.config.stages"):
        mixed.stages  # noqa: B018
    assert not hasattr(mixed, "stages")


def test_fits_follows_the_budget():
    prof = tiny()
    roomy = even_split(prof, P4V2, "none")
    peak = roomy.simulation.peak_memory.max()
    tight = even_split(prof, P4V2.replace(memory_budget=peak - 1), "none")
    unlimited = even_split(prof, P4V2.replace(memory_budget=None), "none")
    assert roomy.fits and roomy.devices["fits"].all()
    assert not tight.fits and not tight.devices["fits"].all()
    assert unlimited.fits and unlimited.devices["budget_mb"].isna().all()


def test_summary_mentions_what_matters():
    plan = make_plan(tiny(), P4V2, even_split(tiny(), P4V2, "full").counts, status="optimal", step_time=1.0,
                     bound=0.9, gap=0.1, solve_seconds=2.0)
    text = plan.summary()
    for part in ("status optimal", "gap 10.00%", "bound 0.9 ms", "step time 1.0 ms (simulated", "bubble",
                 "of compute", "memory budget 500 MB"):
        assert part in text, part
    assert len([ln for ln in text.splitlines() if ln.strip().split()[0].isdigit()]) == 4  # one row per device


# ------------------------------------------------------------------------------ YAML
def test_to_yaml_writes_a_mindformers_block(tmp_path, mixed):
    path = tmp_path / "plan.yaml"
    text = mixed.export("mindformers", path).text
    assert path.read_text() == text
    assert text.startswith("# sapptk plan for MindFormers")
    data = yaml.safe_load(text)
    assert list(data) == ["offset", "recompute", "select_recompute", "select_comm_recompute"]
    assert data["offset"] == [[-1, 0, 0, 1], [1, 0, 0, -1]]
    back = load_plan(path, "mindformers", profile=mixed.profile, config=mixed.config)
    np.testing.assert_array_equal(back.counts, mixed.counts)


def test_manual_file_for_llama2_70b():
    """The hand-made configs shipped in data/ decode for the setup they were written for."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "data" / "llama2_70b_manual.yaml"
    llama = bundled_profile("llama2_70b")
    setup = PipelineConfig(stages=16, micro_batches=32, chunks=2, schedule="interleaved", memory_budget=56000)
    plans = load_plans(path, "mindformers", profile=llama, config=setup)
    assert list(plans) == ["even_select", "shift_stage0", "full_early"]
    assert all(p.counts.sum() == 96 for p in plans.values())
    assert plans["shift_stage0"].counts[0].sum(axis=0)[[0, 16, 12, 28]].tolist() == [2, 2, 4, 4]
    assert not plans["even_select"].fits and plans["full_early"].fits


def test_layout_on_a_v_placement():
    setup = PipelineConfig(stages=4, micro_batches=8, chunks=2, schedule="dualpipe-v")
    layout = even_split(tiny(16), setup, "none").layout
    second = layout[layout.chunk == 1]
    assert second["stage"].tolist() == [0, 1, 2, 3]  # position along chunk 1's pass
    assert second["device"].tolist() == [3, 2, 1, 0]  # which runs the devices backwards
    assert (layout["virtual_stage"] == layout["chunk"] * 4 + layout["stage"]).all()


def test_export_into_a_missing_folder_is_a_clear_error(tmp_path, mixed):
    from sapptk.errors import FileError

    with pytest.raises(FileError, match=r"plan.yaml: cannot write the mindformers export: the folder .*nope' does not "
                                        "exist"):
        mixed.export("mindformers", tmp_path / "nope" / "plan.yaml")
    with pytest.raises(FileError, match="cannot write the mindformers export: it is a directory"):
        mixed.export("mindformers", tmp_path)


@pytest.mark.parametrize("bad", [3, None, "All", ("none",)])
def test_even_split_refuses_an_unknown_recompute(bad):
    with pytest.raises(ConfigError, match=r"even_split: recompute = .*: expected one of none, select, comm, both, "
                                          r"full, strongest, auto"):
        baselines.even_counts(tiny(), P4V2, bad)


@pytest.mark.parametrize("budget", [None, 150.0, 200.0, 260.0, 400.0, 1.0])
@pytest.mark.parametrize("allowed", [MODES, ("select", "full"), ("comm",)])
def test_even_split_auto_is_the_weakest_allowed_mode_that_fits(budget, allowed):
    config = P4V2.replace(memory_budget=budget, recompute=allowed)
    plans = {m: even_split(tiny(13), config, m) for m in allowed}  # the oracle: every allowed mode simulated
    fitting = [m for m in allowed if plans[m].fits]
    expected = fitting[0] if fitting else allowed[-1]
    auto = even_split(tiny(13), config, "auto")
    assert auto.source == f"even_split({expected})"
    np.testing.assert_array_equal(auto.counts, plans[expected].counts)
    assert baselines.resolve_recompute(tiny(13), config, "auto") == expected


def test_distinct_recomputes_lists_every_distinct_split_once():
    demo = bundled_profile("demo")  # none, select, comm, both; the strongest is "both"
    setup = PipelineConfig(stages=4, micro_batches=8, schedule="1f1b")
    assert baselines.distinct_recomputes(demo, setup) == ["none", "select", "comm", "both"]
    assert baselines.distinct_recomputes(tiny(), P4V2) == [*MODES]  # full is the strongest
    two = Profile("two", (  # the groups' strongest modes differ: "strongest" is a split of its own
        LayerGroup("a", "body", 6, 1.0, 3.0, {"none": ModeCost(2.0, 10.0), "select": ModeCost(2.1, 6.0)}),
        LayerGroup("b", "body", 7, 1.0, 3.0, {"none": ModeCost(2.0, 10.0), "full": ModeCost(3.0, 1.0)}),
    ))
    assert baselines.distinct_recomputes(two, P4V2) == ["none", "strongest"]
    counts = baselines.even_counts(two, P4V2, "strongest")
    assert counts[0, SELECT].sum() == 6 and counts[1, FULL].sum() == 7
