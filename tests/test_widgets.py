"""The explorer driven without a kernel: set ``.value``, call ``.click()``, read the widgets."""

from __future__ import annotations

import pytest
from bokeh.models import GlyphRenderer
from jupyter_bokeh.widgets import BokehModel

from sapptk.config import PipelineConfig
from sapptk.plan import even_baseline
from sapptk.profile import bundled_profile
from sapptk.schedules import get, names
from sapptk.widgets import Explorer


@pytest.fixture(scope="module")
def profile():
    return bundled_profile("llama2_70b")


@pytest.fixture
def explorer(profile):
    return Explorer(profile, PipelineConfig(4, 8, memory_budget=56000.0), time_limit=20)


def _status(ex):
    assert ex.status_text.split()[0].rstrip(":") in ex.status.value  # the HTML shows the same line
    return ex.status_text


def test_controls_start_from_the_config(explorer):
    assert list(explorer.schedule.options) == list(names())
    assert (explorer.stages.value, explorer.micro_batches.value, explorer.chunks.value) == (4, 8, 1)
    assert explorer.budget.value == 56000.0
    assert "ready" in _status(explorer)
    assert explorer.plan is None and explorer.timeline.children == ()
    bundle = explorer._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle


def test_modes_the_profile_lacks_are_disabled(explorer, profile):
    offered = {m for g in profile.body for m in g.modes}
    for mode, box in explorer.recompute.items():
        assert box.disabled == (mode not in offered)
        if box.disabled:
            assert not box.value
    assert "comm" not in offered and explorer.recompute["comm"].disabled


@pytest.mark.parametrize("name", names())
def test_options_the_schedule_does_not_allow_are_disabled(explorer, name):
    spec = get(name)
    explorer.stages.value = 4
    explorer.schedule.value = name
    if spec.chunks is not None:
        assert explorer.chunks.value in spec.chunks
        assert explorer.chunks.disabled == (len(spec.chunks) == 1)
    else:
        assert not explorer.chunks.disabled
        explorer.chunks.value = 2
    assert explorer.splits.disabled == (not spec.splits)
    if not spec.splits:
        assert explorer.splits.value == 1
    need = spec.min_micro_batches(explorer.stages.value, explorer.chunks.value)
    assert explorer.micro_batches.min >= need
    explorer.micro_batches.value = 1  # clamped to what the schedule needs
    assert explorer.micro_batches.value >= max(need, explorer.stages.value)
    assert "ready" in _status(explorer) or "invalid" in _status(explorer)


@pytest.mark.slow
def test_solve_shows_status_table_yaml_and_timelines(explorer):
    explorer.solve_button.click()
    status = _status(explorer)
    assert "optimal in" in status or "feasible in" in status, status
    assert " s: step time" in status and "Even split" in status
    plan = explorer.plan
    assert plan is not None and plan.solved
    assert explorer.baseline is not None and explorer.baseline.source.startswith("even_split")
    assert explorer.table.value.count("<tr") == 1 + 4  # header + one row per device
    assert "offset" in explorer.yaml.value and "select_recompute" in explorer.yaml.value
    (model,) = explorer.timeline.children
    assert isinstance(model, BokehModel)
    ops = [r for r in explorer.figure.select({"type": GlyphRenderer, "name": "ops"})]
    n_events = sorted([len(plan.simulation.events), len(explorer.baseline.simulation.events)])
    assert sorted(len(r.data_source.data["start_ms"]) for r in ops) == n_events
    assert isinstance(explorer.bars.children[0], BokehModel)
    assert not explorer.solve_button.disabled


def test_infeasible_says_why(explorer):
    explorer.budget.value = 10000.0
    explorer.solve_button.click()
    status = _status(explorer)
    assert "infeasible" in status and "MB" in status and "Traceback" not in status
    assert explorer.timeline.children == () and explorer.yaml.value == ""


def test_invalid_setups_are_explained_not_solved(explorer):
    for box in explorer.recompute.values():
        box.value = False
    assert "invalid" in _status(explorer) and "recompute" in _status(explorer)
    explorer.solve_button.click()
    assert "invalid" in _status(explorer) and explorer.plan is None
    explorer.recompute["full"].value = True
    assert "ready" in _status(explorer)
    # more virtual stages than layers
    explorer.schedule.value = "interleaved"
    explorer.stages.value = 32
    explorer.chunks.value = 8
    assert "invalid" in _status(explorer)
    explorer.solve_button.click()
    assert explorer.plan is None and "Traceback" not in _status(explorer)


def test_solver_failure_is_a_status_line_not_a_traceback(explorer, monkeypatch):
    import sapptk.balancer as balance_module

    def boom(*args, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(balance_module, "balance", boom)
    explorer.solve_button.click()
    assert "error" in _status(explorer) and "RuntimeError: boom" in _status(explorer)
    assert not explorer.solve_button.disabled


def test_even_baseline_picks_the_weakest_mode_that_fits(profile):
    loose = even_baseline(profile, PipelineConfig(4, 8))
    assert loose.source == "even_split(none)"
    tight = even_baseline(profile, PipelineConfig(4, 8, memory_budget=56000.0))
    assert tight.fits or tight.source == "even_split(full)"
    assert tight.source != "even_split(none)"
