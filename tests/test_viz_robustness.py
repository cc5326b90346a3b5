"""Figures of a plan's sensitivity and critical path: what they draw, from which numbers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from bokeh.models import GlyphRenderer, Span

from sapptk import viz
from sapptk.config import PipelineConfig
from sapptk.errors import SapptkError
from sapptk.plan import even_split


@pytest.fixture(scope="module")
def plan(llama):
    return even_split(llama, PipelineConfig(4, 8, 2, "interleaved", memory_budget=60000), "full")


def _renderers(layout):
    figs = getattr(layout, "children", [layout])
    return [r for f in figs for r in f.renderers if isinstance(r, GlyphRenderer)]


def test_sensitivity_plot_draws_both_models_and_the_budget(plan):
    result = plan.sensitivity(samples=200, seed=4)
    layout = viz.sensitivity_plot(result)
    left, right = layout.children
    hist = [r for r in left.renderers if isinstance(r, GlyphRenderer)]
    assert len(hist) == 2  # one histogram per error model
    for r in hist:
        assert np.sum(r.data_source.data["share"]) == pytest.approx(1.0)
    bars = [r for r in right.renderers if isinstance(r, GlyphRenderer)]
    assert [len(b.data_source.data["top"]) for b in bars] == [4, 4]
    q99 = result.devices[result.devices.perturbation == "shared"].peak_mb_q99.to_numpy()
    np.testing.assert_allclose(bars[1].data_source.data["top"], q99)
    spans = [s.location for s in right.center if isinstance(s, Span)]
    assert spans == [60000.0]
    base = [s.location for s in left.center if isinstance(s, Span)]
    assert base == [pytest.approx(plan.simulation.step_time)]
    with pytest.raises(SapptkError, match="plan.sensitivity"):
        viz.sensitivity_plot(pd.DataFrame())


def test_critical_plot_stacks_the_derivatives(plan):
    frame = plan.critical()
    fig = viz.critical_plot(plan)
    bars = _renderers(fig)
    assert len(bars) == frame.kind.nunique()
    data = bars[0].data_source.data
    wide = frame.pivot_table(index="virtual_stage", columns="kind", values="dstep_per_ms", aggfunc="sum",
                             fill_value=0.0, observed=False)
    for kind in wide.columns:
        np.testing.assert_allclose(data[kind], wide[kind].to_numpy())
    with pytest.raises(SapptkError, match="plan.critical"):
        viz.critical_plot(pd.DataFrame({"x": [1]}))
