"""Figures are checked through their renderers and data sources, not pixels."""

from __future__ import annotations

import re
import time

import numpy as np
import pandas as pd
import pytest
from bokeh.models import GlyphRenderer, GridPlot, HoverTool, Range1d, Span
from bokeh.plotting import figure

from sapptk import viz
from sapptk.schedules import Op, build, get, make_program, names
from sapptk.simulation import simulate


def _sim(name="interleaved", p=4, m=8, v=2, k=1, **kw):
    program = build(name, stages=p, micro_batches=m, chunks=v, splits=k)
    nvs = program.num_virtual_stages
    costs = dict(forward=np.linspace(0.5, 1.0, nvs), backward=np.linspace(1.0, 2.0, nvs), activation=10.0,
                 params=100.0)
    costs.update(kw)
    return simulate(program, **costs)


def _overlapped_program(p=4, m=8):
    """1F1B with each steady-state (F, B) pair run as one overlapped unit."""
    devices = []
    for s in range(p):
        fwd = [Op("F", i, s) for i in range(m)]
        bwd = [Op("B", i, s) for i in range(m)]
        w = min(p - s - 1, m)
        order = [*fwd[:w], fwd[w]]
        order += [(fwd[w + i], bwd[i - 1]) for i in range(1, m - w)]
        order += bwd[m - w - 1:]
        devices.append(order)
    return make_program("overlap-test", stages=p, micro_batches=m, chunks=1, splits=1, placement=range(p),
                        device_units=devices)


def _zero_bubble_program(p=4, m=8):
    """1F1B with every backward split into I then W later (zero-bubble style kinds)."""
    devices = []
    for s in range(p):
        w = min(p - s - 1, m)
        order = [Op("F", i, s) for i in range(w)]
        for i in range(m - w):
            order += [Op("F", w + i, s), Op("I", i, s)]
        order += [Op("I", i, s) for i in range(m - w, m)]
        order += [Op("W", i, s) for i in range(m)]
        devices.append(order)
    return make_program("zb-test", stages=p, micro_batches=m, chunks=1, splits=1, placement=range(p),
                        device_units=devices)


def _renderer(layout, name):
    found = layout.select({"type": GlyphRenderer, "name": name})
    found = list(found)
    assert len(found) == 1, f"expected one renderer named {name}, got {len(found)}"
    return found[0]


def _figures(layout):
    """The figures of a layout in reading order."""
    if isinstance(layout, figure):
        return [layout]
    if isinstance(layout, GridPlot):
        return [c[0] for c in sorted(layout.children, key=lambda c: (c[1], c[2]))]
    return [f for child in layout.children for f in _figures(child)]


# ------------------------------------------------------------------ timeline
@pytest.mark.slow
@pytest.mark.parametrize(
    "args",
    [("1f1b", 4, 8, 1, 1), ("gpipe", 3, 5, 1, 1), ("interleaved", 4, 6, 2, 1), ("interleaved-lm", 4, 8, 3, 1),
     ("seq1f1b", 4, 8, 1, 3)],
)
def test_every_op_is_one_box_at_its_start_and_end(args):
    sim = _sim(*args)
    fig = viz.timeline(sim)
    boxes = _renderer(fig, "ops")
    data = boxes.data_source.data
    ev = sim.events
    assert len(data["start_ms"]) == len(ev)
    for col in ("device", "micro_batch", "virtual_stage", "chunk", "slice", "unit", "start_ms", "end_ms"):
        np.testing.assert_array_equal(np.asarray(data[col]), ev[col].to_numpy(), err_msg=col)
    np.testing.assert_array_equal(np.asarray(data["kind"]), ev["kind"].astype(str).to_numpy())
    np.testing.assert_allclose(data["duration_ms"], ev["end_ms"] - ev["start_ms"])
    g = boxes.glyph
    assert (g.left, g.right) == ("start_ms", "end_ms")
    # each box sits inside its device's row
    dev = np.asarray(data["device"])
    assert np.all(np.asarray(data["lower"]) >= dev - 0.4 - 1e-9)
    assert np.all(np.asarray(data["upper"]) <= dev + 0.4 + 1e-9)


@pytest.mark.slow
@pytest.mark.parametrize("name", names())
def test_every_registered_schedule_draws_all_its_ops(name):
    spec = get(name)
    v = 2 if spec.chunks is None else (2 if 2 in spec.chunks else spec.chunks[0])
    k = 2 if spec.splits else 1
    m = max(8, spec.min_micro_batches(4, v))
    program = build(name, stages=4, micro_batches=m, chunks=v, splits=k)
    sim = simulate(program, forward=1.0, backward=1.5, weight=0.5, activation=3.0, params=10.0)
    data = _renderer(viz.timeline(sim, budget=100.0), "ops").data_source.data
    np.testing.assert_array_equal(np.asarray(data["start_ms"]), sim.events["start_ms"].to_numpy())
    np.testing.assert_array_equal(np.asarray(data["end_ms"]), sim.events["end_ms"].to_numpy())
    sizes = sim.events.groupby("unit")["unit"].transform("size").to_numpy()
    assert ((np.asarray(data["category"]) == "overlapped") == (sizes > 1)).all()


def test_memory_steps_equal_simulation_memory():
    sim = _sim("interleaved", 4, 8, 2)
    fig = viz.timeline(sim, budget=250.0)
    steps = []
    for d in range(sim.program.stages):
        r = _renderer(fig, f"memory-{d}")
        assert type(r.glyph).__name__ == "Step" and r.glyph.mode == "after"
        steps.append(pd.DataFrame({k: np.asarray(r.data_source.data[k]) for k in ("device", "time_ms", "memory_mb")}))
    got = pd.concat(steps, ignore_index=True)
    want = sim.memory[["device", "time_ms", "memory_mb"]].reset_index(drop=True)
    pd.testing.assert_frame_equal(got, want, check_dtype=False)


def test_budget_line_only_when_known():
    sim = _sim()
    with_budget = viz.timeline(sim, budget=321.0)
    spans = [s for s in with_budget.select({"type": Span, "name": "budget"})]
    assert [s.location for s in spans] == [321.0]
    assert not list(viz.timeline(sim).select({"type": Span, "name": "budget"}))
    # the budget is inside the memory pane's y range
    mem = next(f for f in _figures(with_budget) if f.yaxis[0].axis_label.startswith("memory"))
    assert mem.y_range.end >= 321.0


def test_gantt_and_memory_share_the_time_axis_and_use_webgl():
    sim = _sim()
    fig = viz.timeline(sim)
    assert isinstance(fig, GridPlot)
    figs = _figures(fig)
    assert len(figs) == 2
    assert figs[0].x_range is figs[1].x_range
    assert isinstance(figs[0].x_range, Range1d)
    assert figs[0].x_range.start == 0 and figs[0].x_range.end >= sim.step_time
    assert all(f.output_backend == "webgl" for f in figs)
    # device 0 on top
    assert figs[0].y_range.start > figs[0].y_range.end


def test_backend_can_be_canvas():
    sim = _sim()
    assert {f.output_backend for f in _figures(viz.timeline(sim, backend="canvas"))} == {"canvas"}
    assert {f.output_backend for f in _figures(viz.compare(sim, sim, backend="canvas", memory=True))} == {"canvas"}
    with pytest.raises(ValueError, match="backend"):
        viz.timeline(sim, backend="gpu")


def test_title_states_schedule_sizes_step_time_and_bubble():
    sim = _sim("interleaved", 4, 8, 2, forward=0.5, backward=1.0)
    fig = viz.timeline(sim)
    title = _figures(fig)[0].title.text
    for part in ("interleaved", "p=4", "v=2", "m=8", "28.5 ms", "18.8%"):
        assert part in title, (part, title)
    assert _figures(viz.timeline(sim, title="mine"))[0].title.text == "mine"


def test_hover_names_every_field():
    fig = viz.timeline(_sim())
    boxes = _renderer(fig, "ops")
    hovers = [h for h in fig.select({"type": HoverTool}) if boxes in (h.renderers or [])]
    assert len(hovers) == 1
    text = " ".join(f"{a} {b}" for a, b in hovers[0].tooltips)
    for field in ("device", "kind", "micro-batch", "virtual stage", "slice", "start", "end", "duration",
                  "@start_ms", "@end_ms", "@duration_ms", "@micro_batch", "@virtual_stage", "@slice"):
        assert field in text


def test_colour_by_kind_and_shade_by_chunk():
    sim = _sim("interleaved", 4, 8, 2)
    data = _renderer(viz.timeline(sim), "ops").data_source.data
    frame = pd.DataFrame({k: np.asarray(data[k]) for k in ("category", "chunk", "color")})
    colors = frame.groupby(["category", "chunk"])["color"].nunique()
    assert (colors == 1).all()  # one colour per (kind, chunk)
    by = frame.drop_duplicates(["category", "chunk"]).set_index(["category", "chunk"])["color"]
    assert by[("forward", 0)] == viz.CATEGORY_COLORS["forward"]
    assert by[("backward", 0)] == viz.CATEGORY_COLORS["backward"]
    assert by[("forward", 1)] != by[("forward", 0)]
    assert by[("forward", 0)] != by[("backward", 0)]


def test_input_and_weight_gradient_kinds():
    sim = simulate(_zero_bubble_program(), forward=1.0, backward=1.0, weight=1.0)
    data = _renderer(viz.timeline(sim), "ops").data_source.data
    cats = set(data["category"])
    assert cats == {"forward", "input-gradient", "weight-gradient"}
    colors = {c: col for c, col in zip(data["category"], data["color"], strict=True)}
    assert colors["input-gradient"] == viz.CATEGORY_COLORS["input-gradient"]
    assert colors["weight-gradient"] == viz.CATEGORY_COLORS["weight-gradient"]


def test_overlapped_pairs_share_the_row_in_strips():
    sim = simulate(_overlapped_program(), forward=1.0, backward=2.0)
    data = _renderer(viz.timeline(sim), "ops").data_source.data
    frame = pd.DataFrame({k: np.asarray(data[k]) for k in ("unit", "category", "kind", "lower", "upper",
                                                           "start_ms", "end_ms")})
    sizes = frame.groupby("unit")["kind"].transform("size")
    assert (frame.loc[sizes > 1, "category"] == "overlapped").all()
    assert (frame.loc[sizes == 1, "category"] != "overlapped").all()
    pairs = frame[sizes > 1].groupby("unit")
    for _, pair in pairs:
        assert pair["start_ms"].nunique() == 1 and pair["end_ms"].nunique() == 1
        assert sorted(pair["kind"]) == ["B", "F"]
        lo, up = np.sort(pair["lower"].to_numpy()), np.sort(pair["upper"].to_numpy())
        assert up[0] <= lo[1] + 1e-12  # the two strips do not overlap
    assert len(pairs) > 0


def test_micro_batch_written_on_wide_boxes_only():
    sim = _sim("1f1b", 4, 8, 1)
    fig = viz.timeline(sim)
    labels = _renderer(fig, "labels").data_source.data
    ops = _renderer(fig, "ops").data_source.data
    assert len(labels["text"]) == len(ops["micro_batch"])  # all boxes are wide at p=4, m=8
    centre = (np.asarray(ops["start_ms"]) + np.asarray(ops["end_ms"])) / 2
    np.testing.assert_allclose(np.sort(labels["x"]), np.sort(centre))
    assert sorted(labels["text"]) == sorted(str(x) for x in ops["micro_batch"])
    # a long program: boxes too narrow at full view, no labels (they appear when zooming in)
    big = _sim("1f1b", 8, 512, 1)
    assert len(_renderer(viz.timeline(big), "labels").data_source.data["text"]) == 0
    # a zoom callback recomputes them
    x_range = _figures(fig)[0].x_range
    assert x_range.js_property_callbacks.get("change:start")


def test_rejects_what_is_not_a_simulation():
    with pytest.raises(TypeError, match="Simulation"):
        viz.timeline(pd.DataFrame())


@pytest.mark.slow
def test_builds_large_programs_fast():
    sim = _sim("interleaved", 16, 1600, 2)  # 102 400 ops
    assert len(sim.events) > 100_000
    t0 = time.perf_counter()
    fig = viz.timeline(sim)
    elapsed = time.perf_counter() - t0
    assert len(_renderer(fig, "ops").data_source.data["start_ms"]) == len(sim.events)
    assert elapsed < 5.0, elapsed  # target under 2 s; generous for slow CI


# ------------------------------------------------------------------- compare
def test_compare_shares_one_time_scale():
    fast = _sim("interleaved", 4, 8, 2)
    slow = _sim("gpipe", 4, 8, 1, forward=1.0, backward=2.0)
    fig = viz.compare(fast, slow, labels=["auto", "manual"], budget=400.0, memory=True)
    figs = _figures(fig)
    assert len(figs) == 4
    assert all(f.x_range is figs[0].x_range for f in figs)
    assert figs[0].x_range.end >= max(fast.step_time, slow.step_time)
    titles = [f.title.text for f in figs if f.title is not None and f.title.text]
    assert titles[0].startswith("auto:") and titles[1].startswith("manual:")
    ends = sorted(s.location for s in fig.select({"type": Span, "name": "step-end"}))
    assert ends == sorted([fast.step_time, slow.step_time])
    # memory panes share the y scale
    mems = [f for f in figs if f.yaxis[0].axis_label and f.yaxis[0].axis_label.startswith("memory")]
    assert len(mems) == 2 and mems[0].y_range.end == mems[1].y_range.end >= 400.0
    ops = [r for r in fig.select({"type": GlyphRenderer, "name": "ops"})]
    assert sorted(len(r.data_source.data["start_ms"]) for r in ops) == sorted([len(fast.events), len(slow.events)])


def test_compare_checks_its_arguments():
    sim = _sim()
    with pytest.raises(ValueError, match="labels"):
        viz.compare(sim, sim, labels=["one"])
    with pytest.raises(ValueError, match="at least one"):
        viz.compare()
    assert len(_figures(viz.compare(sim))) == 1


# ---------------------------------------------------------------- stage_bars
def _stages_frame():
    return pd.DataFrame(
        {
            "device": [0, 1, 2, 3],
            "layers": [20, 20, 20, 20],
            "params_mb": [30000.0, 28000.0, 28000.0, 31000.0],
            "peak_mb": [54000.0, 50000.0, 45000.0, 40000.0],
            "budget_mb": [56000.0] * 4,
            "fits": [True] * 4,
            "forward_ms": [10.0, 10.0, 10.0, 12.0],
            "backward_ms": [20.0, 20.0, 20.0, 24.0],
            "recompute_ms": [5.0, 3.0, 0.0, 0.0],
        }
    )


def test_stage_bars_stack_memory_against_budget_and_time():
    class FakePlan:
        stages = _stages_frame()

    want = _stages_frame()
    for arg in (FakePlan(), want):
        fig = viz.stage_bars(arg)
        assert len(_figures(fig)) == 2
        mem = [r for r in fig.select({"type": GlyphRenderer}) if r.name and r.name.startswith("memory")]
        tim = [r for r in fig.select({"type": GlyphRenderer}) if r.name and r.name.startswith("time")]
        assert len(mem) == 2 and len(tim) == 3  # parameters + activations; forward + backward + recompute
        src = mem[0].data_source.data
        np.testing.assert_allclose(src["params_mb"], want["params_mb"])
        np.testing.assert_allclose(np.asarray(src["params_mb"]) + np.asarray(src["activation_mb"]), want["peak_mb"])
        # backward is drawn without its recompute part, recompute on top: the stack is the total
        total = np.asarray(src["forward_ms"]) + np.asarray(src["plain_backward_ms"]) + np.asarray(src["recompute_ms"])
        np.testing.assert_allclose(total, want["forward_ms"] + want["backward_ms"])
        assert [s.location for s in fig.select({"type": Span, "name": "budget"})] == [56000.0]
    with pytest.raises(ValueError, match="columns"):
        viz.stage_bars(pd.DataFrame({"device": [0]}))


def test_stage_bars_of_a_real_plan_with_constant_memory():
    from sapptk.config import PipelineConfig
    from sapptk.plan import even_split
    from sapptk.profile import bundled_profile

    config = PipelineConfig(4, 8, chunks=2, schedule="interleaved", memory_budget=60000.0, constant_memory=2000.0)
    plan = even_split(bundled_profile("llama2_70b"), config, recompute="select")
    fig = viz.stage_bars(plan)
    mem = [r for r in fig.select({"type": GlyphRenderer}) if r.name and r.name.startswith("memory")]
    assert len(mem) == 3  # parameters, constant, activations
    d = mem[0].data_source.data
    np.testing.assert_allclose(np.asarray(d["params_mb"]) + np.asarray(d["constant_mb"])
                               + np.asarray(d["activation_mb"]), plan.stages["peak_mb"])


# -------------------------------------------------------------------- output
def test_save_html_is_standalone(tmp_path):
    path = viz.save_html(viz.timeline(_sim()), tmp_path / "sub" / "t.html")
    text = path.read_text()
    assert "<script" in text and "Bokeh" in text
    assert not re.search(r"<script[^>]*\bsrc=", text)  # everything inline: works offline
    assert not re.search(r"<link[^>]*\bhref=\"http", text)


def test_export_without_chromium_names_the_extra(monkeypatch, tmp_path):
    monkeypatch.setattr(viz, "find_chromium", lambda: None)
    for export in (viz.export_png, viz.export_svg):
        with pytest.raises(viz.ExportUnavailableError, match=r"sapptk\[export\].*chromium chromium-driver"):
            export(viz.timeline(_sim()), tmp_path / "x.png")
