"""Figures are checked through their renderers and data sources, not pixels."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest
from bokeh.models import BoxAnnotation, ColumnDataSource, GlyphRenderer, GridPlot, HoverTool, Label, Range1d, Span
from bokeh.plotting import figure

from sapptk import viz
from sapptk.config import PipelineConfig
from sapptk.errors import SapptkError
from sapptk.plan import even_split
from sapptk.schedules import Op, build, get, make_program, names
from sapptk.simulation import simulate
from sapptk.viz import look


def _sim(name="interleaved", p=4, m=8, v=2, k=1, **kw):
    program = build(name, stages=p, micro_batches=m, chunks=v, splits=k)
    nvs = program.num_virtual_stages
    costs = dict(forward=np.linspace(0.5, 1.0, nvs), backward=np.linspace(1.0, 2.0, nvs), activation=10.0,
                 params=100.0)
    costs.update(kw)
    return simulate(program, **costs)


@pytest.fixture(scope="module")
def plans(llama):
    """A plan (even split, select recompute) and the even baseline for 4 × 8 × 2 at 60000 MB."""
    config = PipelineConfig(4, 8, chunks=2, schedule="interleaved", memory_budget=60000.0, constant_memory=2000.0)
    return even_split(llama, config, recompute="select"), even_split(llama, config, "auto")


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
    found = list(layout.select({"type": GlyphRenderer, "name": name}))
    assert len(found) == 1, f"expected one renderer named {name}, got {len(found)}"
    return found[0]


def _renderers(layout, name):
    return list(layout.select({"type": GlyphRenderer, "name": name}))


def _figures(layout):
    """The figures of a layout in reading order."""
    if isinstance(layout, figure):
        return [layout]
    if isinstance(layout, GridPlot):
        return [c[0] for c in sorted(layout.children, key=lambda c: (c[1], c[2]))]
    return [f for child in layout.children for f in _figures(child)]


def _fills(renderer):
    """The fill colour of every row of a renderer whose colour is mapped from ``style``."""
    mapper = renderer.glyph.fill_color["transform"]
    return np.asarray(mapper.palette, dtype=object)[np.asarray(renderer.data_source.data["style"])]


def _budget_spans(layout):
    return sorted(s.location for s in layout.select({"type": Span, "name": "budget"}))


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


def test_memory_is_one_renderer_of_levels_and_risers():
    # 1F1B, p = 2, m = 2, forward 1 ms, backward 2 ms: device 0 runs F0 [0, 1], F1 [1, 2],
    # B0 [4, 6], B1 [7, 9]; 100 MB of parameters and 10 MB per micro-batch in flight
    sim = simulate(build("1f1b", stages=2, micro_batches=2), forward=1.0, backward=2.0, activation=10.0,
                   params=100.0)
    memory = _renderer(viz.timeline(sim), "memory")
    assert type(memory.glyph).__name__ == "Segment"
    data = {k: np.asarray(v) for k, v in memory.data_source.data.items()}
    levels = pd.DataFrame({k: data[k][: len(sim.memory)] for k in ("device", "start_ms", "end_ms", "memory_mb")})
    zero = levels[levels["device"] == 0]
    assert zero[["start_ms", "end_ms", "memory_mb"]].values.tolist() == [
        [0, 0, 100], [0, 1, 110], [1, 6, 120], [6, 9, 110], [9, 9, 100]]
    # in general: the levels are the simulation's steps, each until the next change (the last to the end)
    np.testing.assert_array_equal(levels["device"], sim.memory["device"])
    np.testing.assert_array_equal(levels["start_ms"], sim.memory["time_ms"])
    np.testing.assert_array_equal(levels["memory_mb"], sim.memory["memory_mb"])
    risers = {k: v[len(sim.memory):] for k, v in data.items()}
    assert (risers["start_ms"] == risers["end_ms"]).all() and (risers["from_mb"] != risers["memory_mb"]).all()
    changes = sum(int((np.diff(g.to_numpy()) != 0).sum()) for _, g in sim.memory.groupby("device")["memory_mb"])
    assert len(risers["device"]) == changes == 8  # one per change within a device, none across devices


def test_memory_of_a_large_program_matches_the_simulation():
    sim = _sim("interleaved", 4, 8, 2)
    memory = _renderer(viz.timeline(sim, budget=250.0), "memory")
    data = memory.data_source.data
    n = len(sim.memory)
    np.testing.assert_array_equal(np.asarray(data["start_ms"])[:n], sim.memory["time_ms"])
    np.testing.assert_array_equal(np.asarray(data["memory_mb"])[:n], sim.memory["memory_mb"])
    ends = np.asarray(data["end_ms"])[:n]
    assert ends.max() == pytest.approx(sim.step_time)


def test_memory_legend_dims_a_device_on_click():
    sim = _sim("1f1b", 4, 8, 1)
    fig = viz.timeline(sim)
    (legend,) = fig.select({"name": "memory-legend"})
    memory = _renderer(fig, "memory")
    devices = np.asarray(memory.data_source.data["device"])
    assert [item.label["value"] for item in legend.items] == ["0", "1", "2", "3"]
    assert [int(devices[item.index]) for item in legend.items] == [0, 1, 2, 3]
    assert legend.js_event_callbacks["legend_item_click"]  # the browser test clicks it
    # several panes: one legend, whose clicks dim the device in every pane
    both = viz.compare(sim, _sim("gpipe", 4, 8, 1), memory=True)
    (legend,) = both.select({"name": "memory-legend"})
    (callback,) = legend.js_event_callbacks["legend_item_click"]
    assert {id(s) for s in callback.args["sources"]} == {id(r.data_source) for r in _renderers(both, "memory")}


def test_budget_line_comes_from_the_subject_unless_given(plans):
    from sapptk.viz.subjects import budget_of

    plan, _ = plans
    sim = _sim()
    assert budget_of(sim, "auto", "t") is None  # a bare simulation has no budget
    assert budget_of(plan, "auto", "t") == 60000.0  # a plan has its config's
    assert budget_of(plan, 50000, "t") == 50000.0 and budget_of(plan, None, "t") is None
    for bad in (-1, 0, float("nan"), "56000", True):
        with pytest.raises(SapptkError, match=r"t: budget = .*expected MB > 0, None .* or 'auto'"):
            budget_of(sim, bad, "t")
    # what the figures draw
    assert _budget_spans(viz.timeline(plan)) == [60000.0]
    assert _budget_spans(viz.timeline(plan, budget=None)) == []
    with_budget = viz.timeline(sim, budget=321.0)
    assert _budget_spans(with_budget) == [321.0]
    mem = next(f for f in _figures(with_budget) if f.yaxis[0].axis_label.startswith("memory"))
    assert mem.y_range.end >= 321.0  # the budget is inside the memory pane's y range
    with pytest.raises(SapptkError, match="timeline: budget = -1"):
        viz.timeline(sim, budget=-1)


def test_a_plan_means_its_simulation(plans):
    plan, _ = plans
    by_plan = _renderer(viz.timeline(plan), "ops").data_source.data
    by_sim = _renderer(viz.timeline(plan.simulation), "ops").data_source.data
    for col in ("device", "start_ms", "end_ms", "style"):
        np.testing.assert_array_equal(np.asarray(by_plan[col]), np.asarray(by_sim[col]))
    # the plan's simulation carries the budget too (Simulation.memory_budget); a bare one has none
    assert _budget_spans(viz.compare(plan, plan.simulation, memory=True)) == [60000.0, 60000.0]
    bare = simulate(plan.simulation.program, forward=1.0, backward=2.0)
    assert _budget_spans(viz.compare(plan, bare, memory=True)) == [60000.0]
    with pytest.raises(SapptkError, match="Plan or Simulation"):
        viz.timeline(pd.DataFrame())
    with pytest.raises(SapptkError, match=r"subjects\[1\].*Plan or Simulation"):
        viz.compare(plan, "plan")


def test_a_plan_without_an_assignment_says_so(llama):
    from sapptk.errors import ConfigError
    from sapptk.plan import make_plan

    config = PipelineConfig(4, 8, memory_budget=100.0)
    empty = make_plan(llama, config, None, status="infeasible", message="nothing fits")
    for draw in (viz.timeline, viz.stage_bars, viz.compare):
        with pytest.raises(ConfigError, match="status 'infeasible'"):
            draw(empty)


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
    assert figs[0].y_range.start > figs[0].y_range.end  # device 0 on top


def test_each_figure_reads_one_source_and_draws_few_renderers(plans):
    plan, baseline = plans
    small = viz.compare(plan, baseline, memory=True)
    big = viz.compare(_sim("interleaved", 16, 32, 2), _sim("1f1b", 16, 32, 1), memory=True)
    for layout in (small, big):
        figs = _figures(layout)
        assert len(figs) == 3  # both Gantts in one figure, one memory pane each
        for f in figs:
            sources = {id(r.data_source) for r in f.renderers}
            assert len(sources) == 1, f.title
        assert len(figs[0].renderers) == 2  # boxes and their labels
        assert [len(f.renderers) for f in figs[1:]] == [1, 1]  # every device's memory in one renderer
    # numeric columns stay numpy arrays, so they travel as binary
    data = _renderer(big, "ops").data_source.data
    assert all(isinstance(data[c], np.ndarray) and data[c].dtype != object
               for c in ("device", "start_ms", "end_ms", "lower", "upper", "style", "micro_batch"))


def test_backend_can_be_canvas():
    sim = _sim()
    assert {f.output_backend for f in _figures(viz.timeline(sim, backend="canvas"))} == {"canvas"}
    assert {f.output_backend for f in _figures(viz.compare(sim, sim, backend="canvas", memory=True))} == {"canvas"}
    with pytest.raises(SapptkError, match="backend"):
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
                  "@category", "@kind", "@start_ms", "@end_ms", "@duration_ms", "@micro_batch", "@virtual_stage",
                  "@slice"):
        assert field in text
    memory = _renderer(fig, "memory")
    assert any(memory in (h.renderers or []) for h in fig.select({"type": HoverTool}))


def test_colour_by_kind_and_shade_by_chunk():
    sim = _sim("interleaved", 4, 8, 2)
    boxes = _renderer(viz.timeline(sim), "ops")
    data = boxes.data_source.data
    frame = pd.DataFrame({"category": data["category"], "chunk": data["chunk"], "color": _fills(boxes)})
    assert (frame.groupby(["category", "chunk"])["color"].nunique() == 1).all()  # one colour per (kind, chunk)
    by = frame.drop_duplicates(["category", "chunk"]).set_index(["category", "chunk"])["color"]
    assert by[("forward", 0)] == viz.CATEGORY_COLORS["forward"]
    assert by[("backward", 0)] == viz.CATEGORY_COLORS["backward"]
    assert by[("forward", 1)] == look.shades(viz.CATEGORY_COLORS["forward"], 2)[1] != by[("forward", 0)]
    # micro-batch numbers in a colour that reads on the box
    labels = _renderer(viz.timeline(sim), "labels")
    texts = np.asarray(labels.glyph.text_color["transform"].palette)[np.asarray(data["style"])]
    assert set(texts) <= {"#ffffff", "#1a1a1a"}


def test_input_and_weight_gradient_kinds():
    sim = simulate(_zero_bubble_program(), forward=1.0, backward=1.0, weight=1.0)
    boxes = _renderer(viz.timeline(sim), "ops")
    data = boxes.data_source.data
    assert set(data["category"]) == {"forward", "input-gradient", "weight-gradient"}
    colors = dict(zip(data["category"], _fills(boxes), strict=True))
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
    labels = _renderer(fig, "labels")
    ops = _renderer(fig, "ops")
    assert labels.data_source is ops.data_source  # the labels read the boxes' source
    assert labels.glyph.text == "micro_batch"
    shown = labels.view.filter.indices
    assert sorted(shown) == list(range(len(sim.events)))  # all boxes are wide at p=4, m=8
    data = ops.data_source.data
    np.testing.assert_allclose(data["label_x"], (np.asarray(data["start_ms"]) + np.asarray(data["end_ms"])) / 2)
    # a long program: boxes too narrow at full view, no labels (they appear when zooming in)
    big = _sim("1f1b", 8, 512, 1)
    assert len(_renderer(viz.timeline(big), "labels").view.filter.indices) == 0
    # a zoom callback recomputes them
    x_range = _figures(fig)[0].x_range
    assert x_range.js_property_callbacks.get("change:start")


def test_micro_batch_labels_are_all_or_none():
    """Every full-height box is labelled when each can hold the widest number, else none: a
    box that fits "7" but not "12" means no label anywhere (the hover names every op)."""
    from sapptk.viz.timelines import _label_indices

    data = {"micro_batch": np.array([0, 7, 12]), "duration_ms": np.array([10.0, 10.0, 10.0]),
            "lower": np.zeros(3), "upper": np.full(3, 0.8)}
    one_digit, two_digits = 1 * look.LABEL_PX_PER_CHAR + 4, 2 * look.LABEL_PX_PER_CHAR + 4
    assert list(_label_indices(data, two_digits / 10)) == [0, 1, 2]
    assert list(_label_indices(data, (one_digit + two_digits) / 20)) == []  # "7" fits, "12" does not
    strips = {**data, "upper": np.array([0.8, 0.3, 0.8])}  # an overlapped strip is never labelled
    assert list(_label_indices(strips, two_digits / 10)) == [0, 2]
    from sapptk.viz.timelines import _LABELS_JS

    assert "labels.indices = room ? keep : []" in _LABELS_JS  # the browser applies the same rule


@pytest.mark.slow
def test_large_programs_stay_one_numeric_source():
    sim = _sim("interleaved", 16, 1600, 2)  # 102 400 ops
    assert len(sim.events) > 100_000
    fig = viz.timeline(sim)
    boxes = _renderer(fig, "ops")
    assert len(boxes.data_source.data["start_ms"]) == len(sim.events)
    assert len(_figures(fig)[0].renderers) == 2 and len(_renderer(fig, "labels").view.filter.indices) == 0
    strings = [c for c, values in boxes.data_source.data.items() if np.asarray(values).dtype == object]
    assert sorted(strings) == ["category", "kind"]  # colours are mapped from a number, not a string per op


# ------------------------------------------------------------------- compare
def test_compare_puts_every_subject_on_one_time_scale():
    fast = _sim("interleaved", 4, 8, 2)
    slow = _sim("gpipe", 4, 8, 1, forward=1.0, backward=2.0)
    fig = viz.compare(fast, slow, labels=["auto", "manual"], budget=400.0, memory=True)
    figs = _figures(fig)
    assert len(figs) == 3
    assert all(f.x_range is figs[0].x_range for f in figs)
    assert figs[0].x_range.end >= max(fast.step_time, slow.step_time)
    headers = [x.text for x in sorted(fig.select({"type": Label, "name": "header"}), key=lambda x: x.y)]
    assert headers[0].startswith("auto:") and headers[1].startswith("manual:")
    best = min(fast.step_time, slow.step_time)
    for header, sim in zip(headers, (fast, slow), strict=True):
        assert f"({sim.step_time / best:.2f}x the fastest)" in header
    # one group of rows per subject, each under its header, shaded after its step's end
    boxes = _renderer(fig, "ops")
    lower = np.asarray(boxes.data_source.data["lower"])
    assert len(lower) == len(fast.events) + len(slow.events)
    first, second = lower[: len(fast.events)], lower[len(fast.events):]
    assert first.min() > 0.5 and second.min() > first.max() + 1.5  # a header row before each group
    ends = sorted((b.left, b.top, b.bottom) for b in fig.select({"type": BoxAnnotation, "name": "step-end"}))
    assert [e[0] for e in ends] == sorted([fast.step_time, slow.step_time])
    # memory panes share the y scale and carry the budget
    mems = figs[1:]
    assert [f.title.text for f in mems] == ["auto: memory in use", "manual: memory in use"]
    assert mems[0].y_range.end == mems[1].y_range.end >= 400.0
    assert _budget_spans(fig) == [400.0, 400.0]


def test_compare_checks_its_arguments():
    sim = _sim()
    with pytest.raises(SapptkError, match="labels"):
        viz.compare(sim, sim, labels=["one"])
    with pytest.raises(SapptkError, match="at least one"):
        viz.compare()
    assert len(_figures(viz.compare(sim))) == 1


def test_compare_of_plans_draws_each_budget(plans, llama):
    plan, baseline = plans
    tighter = even_split(llama, plan.config.replace(memory_budget=70000.0), recompute="select")
    fig = viz.compare(plan, tighter, memory=True)
    assert _budget_spans(fig) == [60000.0, 70000.0]
    assert _budget_spans(viz.compare(plan, tighter, memory=True, budget=None)) == []


# ---------------------------------------------------------------- stage_bars
def _devices_frame():
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


def _parts(layout, name):
    """{part: (device, bottom, top) arrays} of the one stacked-bar renderer ``name``."""
    data = _renderer(layout, name).data_source.data
    frame = pd.DataFrame({k: np.asarray(data[k]) for k in ("part", "device", "bottom", "top")})
    return {part: rows.drop(columns="part").reset_index(drop=True) for part, rows in frame.groupby("part", sort=False)}


def test_stage_bars_stack_memory_against_budget_and_time():
    want = _devices_frame()
    fig = viz.stage_bars(want)
    assert len(_figures(fig)) == 2
    mem = _parts(fig, "memory")
    assert list(mem) == ["parameters", "activations"]
    np.testing.assert_allclose(mem["parameters"]["top"], want["params_mb"])
    np.testing.assert_allclose(mem["activations"]["bottom"], want["params_mb"])
    np.testing.assert_allclose(mem["activations"]["top"], want["peak_mb"])
    # backward is drawn without its recompute part, recompute on top: the stack is the total
    time = _parts(fig, "time")
    assert list(time) == ["forward", "backward", "recompute"]
    np.testing.assert_allclose(time["backward"]["top"] - time["backward"]["bottom"],
                               want["backward_ms"] - want["recompute_ms"])
    np.testing.assert_allclose(time["recompute"]["top"], want["forward_ms"] + want["backward_ms"])
    assert _budget_spans(fig) == [56000.0]
    for f in _figures(fig):
        assert len({id(r.data_source) for r in f.renderers}) == 1
    with pytest.raises(SapptkError, match="columns"):
        viz.stage_bars(pd.DataFrame({"device": [0]}))
    with pytest.raises(SapptkError, match="Plan, Simulation or per-device DataFrame"):
        viz.stage_bars([1, 2])


def test_stage_bars_budgets_by_device_are_marks():
    frame = _devices_frame().assign(budget_mb=[56000.0, 56000.0, 60000.0, 60000.0])
    fig = viz.stage_bars(frame)
    assert _budget_spans(fig) == []
    marks = _renderer(fig, "budget-marks")
    rows = marks.view.filter.indices
    np.testing.assert_allclose(np.asarray(marks.data_source.data["budget_mb"])[rows], frame["budget_mb"])
    assert _budget_spans(viz.stage_bars(frame, budget=50000)) == [50000.0]
    assert not list(viz.stage_bars(frame, budget=None).select({"name": "budget-marks"}))


def test_stage_bars_of_a_plan_and_of_its_simulation(plans):
    plan, _ = plans
    fig = viz.stage_bars(plan)
    mem = _parts(fig, "memory")
    assert list(mem) == ["parameters", "constant", "activations"]
    np.testing.assert_allclose(mem["constant"]["top"] - mem["constant"]["bottom"], 2000.0)
    np.testing.assert_allclose(mem["activations"]["top"], plan.devices["peak_mb"])
    assert _budget_spans(fig) == [60000.0]
    # the simulation gives the same bars, without the recompute share it cannot know
    by_sim = viz.stage_bars(plan.simulation, budget=60000.0)
    sim_mem = _parts(by_sim, "memory")
    for part in mem:
        pd.testing.assert_frame_equal(sim_mem[part], mem[part])
    frame, constant = viz.device_frame(plan.simulation)
    assert constant == 2000.0 and "recompute_ms" not in frame
    for col in ("params_mb", "peak_mb", "forward_ms", "backward_ms"):
        np.testing.assert_allclose(frame[col], plan.devices[col], err_msg=col)
    time = _parts(by_sim, "time")
    np.testing.assert_allclose(time["recompute"]["top"], plan.devices["forward_ms"] + plan.devices["backward_ms"])


# -------------------------------------------------------------------- output
def test_save_html_is_standalone(tmp_path):
    path = viz.save_html(viz.timeline(_sim()), tmp_path / "sub" / "t.html")
    text = path.read_text()
    assert "<script" in text and "Bokeh" in text
    assert not re.search(r"<script[^>]*\bsrc=", text)  # everything inline: works offline
    assert not re.search(r"<link[^>]*\bhref=\"http", text)
    with pytest.raises(SapptkError, match="is a folder"):
        viz.save_html(viz.timeline(_sim()), tmp_path)


def test_export_without_chromium_names_the_extra(monkeypatch, tmp_path):
    import sapptk.viz.export as export

    monkeypatch.setattr(export, "find_chromium", lambda: None)
    for write in (viz.export_png, viz.export_svg):
        with pytest.raises(viz.ExportUnavailableError, match=r"sapptk\[export\].*chromium chromium-driver"):
            write(viz.timeline(_sim()), tmp_path / "x.png")


def test_sources_are_plain_column_data_sources():
    src = viz.op_source(_sim().events)
    assert isinstance(src, ColumnDataSource) and len(src.data["style"]) == len(_sim().events)
    with pytest.raises(SapptkError, match="kind 'X'"):
        viz.op_source(_sim().events.assign(kind="X"))


# ------------------------------------------------------------------ choice ranking
def _ranking_frame(values, statuses):
    n = len(values)
    return pd.DataFrame({
        "rank": range(1, n + 1), "schedule": ["1f1b"] * n, "stages": [4] * n, "chunks": [1] * n, "dp": [1] * n,
        "status": statuses,
        "step_time_ms": [v if s == "balanced" else np.nan for v, s in zip(values, statuses, strict=True)],
        "bound_ms": [v if s == "pruned" else 0.9 * v for v, s in zip(values, statuses, strict=True)],
        "peak_mb_max": [1.0] * n,
    })


def test_ranking_shows_differences_of_a_few_percent():
    fig = viz.choice_ranking(_ranking_frame([100.0, 101.5, 104.0, 102.0], ["balanced"] * 3 + ["pruned"]))
    assert 90 < fig.x_range.start < 100 < 104 < fig.x_range.end  # not from 0: 1.5 % is visible
    assert "axis starts at" in fig.xaxis[0].axis_label
    bars, text = fig.renderers[0], fig.renderers[1]
    assert set(bars.data_source.data["left"]) == {fig.x_range.start}
    assert list(text.data_source.data["vs_best"]) == ["fastest", "+1.5 %", "+4.0 %", "≥ +2.0 %"]
    spread = viz.choice_ranking(_ranking_frame([10.0, 100.0], ["balanced", "balanced"]))
    assert spread.x_range.start == 0 and spread.xaxis[0].axis_label == "ms per step"


def test_numeric_tick_labels_never_overlap():
    from bokeh.models import Axis, CategoricalAxis, NoOverlap, Plot

    frame = _ranking_frame([100.0, 101.5], ["balanced", "balanced"])
    layouts = [viz.timeline(_sim()), viz.compare(_sim(), _sim("1f1b", v=1), memory=True), viz.choice_ranking(frame)]
    for layout in layouts:
        for plot in layout.select({"type": Plot}):
            for axis in plot.select({"type": Axis}):
                assert isinstance(axis, CategoricalAxis) or isinstance(axis.major_label_policy, NoOverlap), axis
