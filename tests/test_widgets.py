"""The Explorer, driven without a kernel: set ``.value``, ``.click()``, then ``wait()``.

The search (``sapptk.balancer.solve``, which the Explorer calls with its request) is replaced by
a stand-in (``FakeSolve``) wherever the test is about the
Explorer rather than the solver: it returns a given plan at once, or blocks until it is
told to go on (or stopped), so every step happens in an order the test decides.
"""

from __future__ import annotations

import _thread
import threading

import pytest
from bokeh.models import GlyphRenderer
from jupyter_bokeh.widgets import BokehModel

import sapptk.balancer as balancer
from sapptk.config import PipelineConfig
from sapptk.explorer import Explorer
from sapptk.plan import even_split, make_plan
from sapptk.schedules import get, names

SETUP = PipelineConfig(4, 8, memory_budget=56000.0)


@pytest.fixture
def explorer(llama):
    return Explorer(llama, SETUP, time_limit=20)


def _status(ex):
    assert ex.status_text.split()[0].rstrip(":") in ex.status.value  # the HTML shows the same line
    return ex.status_text


class FakeSolve:
    """Stands in for ``solve(request)``: records the request, returns ``even_split(..., "full")``
    as an optimal plan, after ``go`` is set when ``hold`` (or as soon as ``stop`` is set: then as
    a stopped search would)."""

    def __init__(self, *, hold: bool = False) -> None:
        self.started = threading.Event()
        self.go = threading.Event()
        self.hold = hold
        self.calls: list[dict] = []

    def __call__(self, request):
        profile, config, stop = request.profile, request.config, request.stop
        self.calls.append({"config": config, "time_limit": request.time_limit, "stop": stop, "request": request})
        self.started.set()
        if self.hold:
            while not self.go.wait(0.01):
                if stop is not None and stop.is_set():
                    plan = even_split(profile, config, "full")
                    return make_plan(profile, config, plan.counts, status="feasible", step_time=plan.step_time,
                                     bound=0.9 * plan.step_time, gap=0.1, message="stopped by the caller")
        plan = even_split(profile, config, "full")
        return make_plan(profile, config, plan.counts, status="optimal", step_time=plan.step_time,
                         bound=plan.step_time, gap=0.0, solve_seconds=0.01)


@pytest.fixture
def fake(monkeypatch):
    stand_in = FakeSolve()
    monkeypatch.setattr(balancer, "solve", stand_in)
    return stand_in


@pytest.fixture
def held(monkeypatch):
    stand_in = FakeSolve(hold=True)
    monkeypatch.setattr(balancer, "solve", stand_in)
    yield stand_in
    stand_in.go.set()  # never leave a thread waiting


# ------------------------------------------------------------------ controls
def test_controls_start_from_the_config(explorer):
    assert list(explorer.schedule.options) == list(names())
    assert (explorer.stages.value, explorer.micro_batches.value, explorer.chunks.value) == (4, 8, 1)
    assert explorer.budget.value == 56000.0
    assert "ready" in _status(explorer)
    assert explorer.plan is None and explorer.timeline.children == () and not explorer.stale
    assert explorer.cancel_button.disabled and not explorer.solve_button.disabled
    bundle = explorer._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert [explorer.results.get_title(i) for i in range(4)] == ["timeline", "per device", "MindFormers YAML",
                                                                  "memory & time"]


def test_modes_the_profile_lacks_are_disabled(explorer, llama):
    offered = {m for g in llama.body for m in g.modes}
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


def test_invalid_setups_are_explained_not_solved(explorer, fake):
    for box in explorer.recompute.values():
        box.value = False
    assert "invalid" in _status(explorer) and "recompute" in _status(explorer)
    explorer.solve_button.click()
    assert explorer.wait() is None and "invalid" in _status(explorer) and not fake.calls
    explorer.recompute["full"].value = True
    assert "ready" in _status(explorer)
    # more virtual stages than layers
    explorer.schedule.value = "interleaved"
    explorer.stages.value = 32
    explorer.chunks.value = 8
    assert "invalid" in _status(explorer)
    assert explorer.solve() is None and explorer.plan is None and "Traceback" not in _status(explorer)


# --------------------------------------------------------------------- solve
def test_solve_runs_in_the_background_and_draws_before_it_says_so(explorer, held):
    seen = []  # (status, figures in the timeline tab, Solve disabled) at every status change
    explorer.status.observe(lambda _c: seen.append((explorer.status_text, len(explorer.timeline.children),
                                                    explorer.solve_button.disabled)), names="value")
    explorer.solve_button.click()  # returns at once: the search runs on a thread
    assert held.started.wait(10)
    assert explorer.busy and explorer.status_text.startswith("solving…")
    assert explorer.solve_button.disabled and not explorer.cancel_button.disabled
    assert held.calls[0]["stop"] is not None  # the search can be stopped
    explorer.solve_button.click()  # a second click while solving does nothing
    assert len(held.calls) == 1
    held.go.set()
    plan = explorer.wait()
    assert plan is explorer.plan and plan.status == "optimal" and not explorer.busy
    kinds = [s.split()[0].rstrip(":") for s, _, _ in seen]
    assert kinds == ["solving…", "drawing…", "optimal"]
    for status, figures, disabled in seen[:-1]:
        assert figures == 0 and disabled, status  # nothing says "optimal" before the figures are in
    status, figures, disabled = seen[-1]
    assert figures == 1 and " s: step time" in status and "Even split" in status
    assert not explorer.solve_button.disabled and explorer.cancel_button.disabled
    assert explorer.draw_seconds is not None and explorer.draw_seconds > 0


@pytest.mark.slow
def test_solve_shows_the_plan_in_every_tab(explorer, fake, llama):
    plan = explorer.solve()
    assert plan is not None and plan.solved and explorer.baseline.source.startswith("even_split")
    assert explorer.table.value.count("<tr") == 1 + 4  # header + one row per device
    assert "offset" in explorer.yaml.value and "select_recompute" in explorer.yaml.value
    (model,) = explorer.timeline.children
    assert isinstance(model, BokehModel)
    ops = list(explorer.figure.select({"type": GlyphRenderer, "name": "ops"}))
    assert len(ops) == 1  # the plan and the even split in one Gantt
    assert len(ops[0].data_source.data["start_ms"]) == len(plan.simulation.events) + len(
        explorer.baseline.simulation.events)
    assert explorer.bars.children == ()  # drawn when its tab is opened
    explorer.results.selected_index = 3
    assert isinstance(explorer.bars.children[0], BokehModel)
    explorer.results.selected_index = 0
    assert isinstance(explorer.bars.children[0], BokehModel)  # drawn once
    assert fake.calls[0]["config"] == SETUP.replace(recompute=tuple(explorer.config().recompute))


def test_the_export_tab_shows_every_format_when_opened(explorer, fake):
    plan = explorer.solve()
    assert explorer.export_text.value == ""  # filled when its tab is opened
    explorer.results.selected_index = 4
    assert explorer.export_text.value == plan.export("sapptk").text  # the first format is the plan file
    explorer.export_format.value = "Megatron-LM"
    assert explorer.export_text.value.startswith("# Megatron-LM arguments")
    explorer.export_format.value = "PyTorch schedule CSV"
    assert explorer.export_text.value == plan.config.program().to_csv()


def test_export_texts_say_why_a_format_cannot_hold_a_plan(llama):
    from sapptk.explorer import EXPORT_FORMATS, export_texts

    texts = export_texts(even_split(llama, PipelineConfig(2, 4, 2, "zb-v"), "none"))
    assert list(texts) == list(EXPORT_FORMATS)
    assert texts["Megatron-LM"].startswith("# no Megatron-LM export:") and "in a V" in texts["Megatron-LM"]
    assert "ZBVZeroBubble" in texts["torchtitan"]


def test_the_open_tab_is_drawn_before_the_status_says_so(explorer, fake):
    explorer.results.selected_index = 3
    drawn = []
    explorer.status.observe(lambda _c: drawn.append((explorer.status_text, len(explorer.bars.children))),
                            names="value")
    explorer.solve()
    assert drawn[-1][0].startswith("optimal") and drawn[-1][1] == 1
    assert explorer.timeline.children  # the timeline is never put off


def test_cancel_stops_the_search_and_shows_its_best_plan(explorer, held):
    assert explorer.start()
    assert held.started.wait(10)
    explorer.cancel_button.click()
    assert explorer.cancel_button.disabled
    plan = explorer.wait(timeout=30)
    assert not explorer.busy and plan is not None and plan.status == "feasible"
    assert "stopped by Cancel" in _status(explorer) and explorer.timeline.children
    assert not explorer.solve_button.disabled


@pytest.mark.slow
def test_an_interrupt_while_waiting_restores_the_controls(explorer, held):
    def interrupt_when_started():
        held.started.wait(10)
        _thread.interrupt_main()  # what a kernel interrupt does to the cell waiting in solve()

    threading.Thread(target=interrupt_when_started, daemon=True).start()
    with pytest.raises(KeyboardInterrupt):
        explorer.solve()
    assert not explorer.busy and not explorer.solve_button.disabled and explorer.cancel_button.disabled
    assert _status(explorer).startswith("cancelled") and "solving" not in explorer.status.value
    assert held.calls[0]["stop"].is_set()  # the search was told to stop
    # whatever the abandoned search still returns is dropped; a new solve works
    held.hold = False
    held.go.set()
    assert explorer.solve() is not None and _status(explorer).startswith("optimal")


@pytest.mark.slow
def test_changed_or_invalid_settings_mark_the_tabs_stale(explorer, fake):
    explorer.solve()
    assert not explorer.stale and explorer.stale_note.value == ""
    explorer.micro_batches.value = 16
    assert explorer.stale and "m=8" in explorer.stale_note.value and "press Solve" in explorer.stale_note.value
    explorer.micro_batches.value = 8  # back to the plan's settings
    assert not explorer.stale and explorer.stale_note.value == ""
    for box in explorer.recompute.values():  # an invalid state
        box.value = False
    assert "invalid" in _status(explorer) and explorer.stale and explorer.stale_note.value
    explorer.recompute["full"].value = True
    explorer.budget.value = 10000.0
    assert explorer.stale  # other levers than the plan shown
    explorer.solve()  # a new plan for these settings: fresh again
    assert not explorer.stale and explorer.plan.config.memory_budget == 10000.0


@pytest.mark.slow
def test_no_plan_clears_the_tabs(explorer, fake, monkeypatch, llama):
    explorer.solve()
    assert explorer.timeline.children

    def nothing_fits(request):
        return make_plan(request.profile, request.config, None, status="infeasible",
                         message="infeasible: nothing fits 10000 MB")

    monkeypatch.setattr(balancer, "solve", nothing_fits)
    explorer.budget.value = 10000.0
    explorer.solve()
    status = _status(explorer)
    assert status.startswith("infeasible") and "nothing fits 10000 MB" in status
    assert explorer.timeline.children == () and explorer.yaml.value == "" and explorer.bars.children == ()
    assert not explorer.stale and explorer.figure is None


def test_solver_failure_is_a_status_line_not_a_traceback(explorer, monkeypatch):
    def boom(request):
        raise RuntimeError("boom")

    monkeypatch.setattr(balancer, "solve", boom)
    explorer.solve_button.click()
    explorer.wait()
    assert "error" in _status(explorer) and "RuntimeError: boom" in _status(explorer)
    assert not explorer.solve_button.disabled and explorer.cancel_button.disabled


def test_an_interrupt_in_the_search_thread_is_a_status_line(explorer, monkeypatch):
    def interrupted(request):  # a SIGINT that reached the search's thread (CP-SAT's own handler, say)
        raise KeyboardInterrupt

    monkeypatch.setattr(balancer, "solve", interrupted)
    explorer.solve_button.click()
    explorer.wait()
    assert _status(explorer).startswith("cancelled") and "interrupted (KeyboardInterrupt)" in _status(explorer)
    assert not explorer.solve_button.disabled and explorer.cancel_button.disabled and not explorer.busy


def test_a_feasible_plan_without_a_bound_says_so(llama):
    from sapptk.explorer.tabs import result_text

    config = PipelineConfig(4, 8, memory_budget=56000.0)
    split = even_split(llama, config, "full")
    plan = make_plan(llama, config, split.counts, status="feasible", step_time=split.step_time, bound=None, gap=None)
    text = result_text(plan, None, 1.0, stopped=None)
    assert "n/a" not in text and "gap" not in text and "no proven bound" in text and "time limit" in text
    bounded = make_plan(llama, config, split.counts, status="feasible", step_time=split.step_time,
                        bound=0.991 * split.step_time, gap=0.009)
    assert "gap 0.9%" in result_text(bounded, None, 1.0, stopped=None)


@pytest.mark.slow
def test_a_real_solve_infeasible_then_optimal(explorer):
    explorer.budget.value = 10000.0
    explorer.solve_button.click()
    explorer.wait()
    status = _status(explorer)
    assert "infeasible" in status and "MB" in status and "Traceback" not in status
    assert explorer.timeline.children == () and explorer.yaml.value == ""
    explorer.budget.value = 56000.0
    plan = explorer.solve()
    assert plan is not None and plan.solved and plan.fits
    assert ("optimal in" in _status(explorer) or "feasible in" in _status(explorer)) and explorer.timeline.children


def test_the_even_split_auto_picks_the_weakest_mode_that_fits(llama):
    loose = even_split(llama, PipelineConfig(4, 8), "auto")
    assert loose.source == "even_split(none)"
    tight = even_split(llama, PipelineConfig(4, 8, memory_budget=56000.0), "auto")
    assert tight.fits or tight.source == "even_split(full)"
    assert tight.source != "even_split(none)"


# ------------------------------------------------- interrupt, stale result, typed values
class FakeKernel:
    """What the hook uses of an ipykernel: the SIGINT handler it restores after a message."""

    def __init__(self) -> None:
        import signal

        self.saved_sigint_handler = signal.SIG_IGN  # an idle kernel ignores SIGINT


@pytest.fixture
def kernel(monkeypatch):
    import sapptk.explorer.inputs as inputs

    fake_kernel = FakeKernel()
    monkeypatch.setattr(inputs, "_kernel", lambda: fake_kernel)
    yield fake_kernel
    inputs.HOOK.uninstall()


def test_kernel_interrupt_stops_a_solve_started_with_the_button(explorer, held, kernel):
    import signal

    explorer.solve_button.click()
    assert held.started.wait(10)
    assert "Kernel → Interrupt stops it" in _status(explorer)
    handler = kernel.saved_sigint_handler  # what the kernel installs once the click's message is handled
    assert callable(handler)
    handler(signal.SIGINT, None)  # Kernel -> Interrupt while the kernel is idle
    assert "Kernel → Interrupt" in _status(explorer) and held.calls[0]["stop"].is_set()
    plan = explorer.wait(timeout=30)
    assert plan is not None and plan.status == "feasible"
    assert "stopped by Kernel → Interrupt" in _status(explorer) and not explorer.solve_button.disabled
    handler(signal.SIGINT, None)  # no solve running: ignored, as the kernel would
    assert "stopped by Kernel → Interrupt" in _status(explorer)


def test_without_a_kernel_the_status_says_cancel_is_the_way(explorer, held):
    explorer.solve_button.click()
    assert held.started.wait(10)
    assert "Cancel stops it" in _status(explorer) and "Interrupt" not in _status(explorer)
    explorer.cancel()
    assert explorer.wait(timeout=30) is not None


def test_solve_is_disabled_while_the_setup_is_invalid(explorer):
    for box in explorer.recompute.values():
        box.value = False
    assert explorer.solve_button.disabled and "recompute" in explorer.solve_button.tooltip
    explorer.recompute["full"].value = True
    assert not explorer.solve_button.disabled


def test_greyed_modes_say_why(explorer):
    assert explorer.recompute["comm"].disabled
    assert "comm" in explorer.recompute["comm"].tooltip and "comm" in explorer.recompute_note.value


def test_a_change_keeps_the_last_result_marked_stale(explorer, fake):
    explorer.solve()
    result = _status(explorer)
    assert result.startswith("optimal")
    explorer.micro_batches.value = 16
    assert _status(explorer).startswith(result) and "[stale" in _status(explorer)
    explorer.micro_batches.value = 8  # back to the plan's settings: fresh again
    assert _status(explorer) == result


# ------------------------------------------------------------------ levers
def test_every_lever_starts_off_and_reaches_the_request(explorer, fake):
    assert not explorer.offload.value and not explorer.per_micro_batch.value
    assert explorer.memory_margin.value == 0 and explorer.oom_risk.value == 0
    assert explorer.entries["host bandwidth"].disabled and explorer.entries["memory error"].disabled
    explorer.solve()
    request = fake.calls[-1]["request"]
    assert not request.offload and not request.per_micro_batch
    assert (request.memory_margin, request.oom_risk, request.memory_error) == (None, None, None)

    explorer.offload.value = True
    assert not explorer.entries["host bandwidth"].disabled
    explorer.entries["host bandwidth"].value = "12.5"
    explorer.entries["memory margin"].value = "0.05"
    explorer.entries["OOM risk"].value = "0.01"
    assert not explorer.entries["memory error"].disabled
    explorer.entries["memory error"].value = "0.03"
    assert explorer.stale  # other levers than the plan shown
    explorer.solve()
    request = fake.calls[-1]["request"]
    assert request.offload and request.config.host_bandwidth == 12.5 and "offload" in request.config.recompute
    assert (request.memory_margin, request.oom_risk, request.memory_error) == (0.05, 0.01, 0.03)
    assert request.time_limit == 20 and request.workers == 2 and request.stop is not None
    assert request.safe_config.memory_budget < 56000 * 0.95 + 1e-9  # the margin, then the risk, tightened it
    assert not explorer.stale

    explorer.offload.value = False
    explorer.per_micro_batch.value = True
    explorer.entries["OOM risk"].value = "0"
    assert explorer.entries["memory error"].disabled
    explorer.solve()
    request = fake.calls[-1]["request"]
    assert request.per_micro_batch and not request.offload and request.config.host_bandwidth is None
    assert (request.memory_margin, request.oom_risk, request.memory_error) == (0.05, None, None)


def test_levers_that_cannot_be_solved_are_explained_not_solved(explorer, fake):
    explorer.offload.value = True
    explorer.per_micro_batch.value = True  # one or the other
    assert explorer.solve_button.disabled and "per_micro_batch = True" in _status(explorer)
    assert explorer.solve() is None and not fake.calls
    explorer.per_micro_batch.value = False
    assert "ready" in _status(explorer)
    explorer.budget.value = 0.0  # no budget: nothing to keep a margin under
    explorer.entries["memory margin"].value = "1000"
    assert "invalid" in _status(explorer) and "memory_margin" in _status(explorer)
    explorer.entries["memory margin"].value = "0"
    assert "ready" in _status(explorer)


def test_an_explorer_starts_with_the_levers_it_is_given(llama):
    config = SETUP.replace(recompute=("none", "full", "offload"), host_bandwidth=10.0)
    ex = Explorer(llama, config, per_micro_batch=False, memory_margin=2000.0, oom_risk=0.05, memory_error=0.1)
    assert ex.offload.value and ex.host_bandwidth.value == 10.0
    assert ex.recompute["none"].value and ex.recompute["full"].value and not ex.recompute["select"].value
    assert (ex.memory_margin.value, ex.oom_risk.value, ex.memory_error.value) == (2000.0, 0.05, 0.1)
    assert ex.config() == config and ex.levers().keywords() == {
        "per_micro_batch": False, "memory_margin": 2000.0, "oom_risk": 0.05, "memory_error": 0.1}


@pytest.mark.slow
def test_a_real_solve_with_a_memory_margin_and_per_micro_batch(explorer):
    explorer.entries["memory margin"].value = "4000"
    explorer.per_micro_batch.value = True
    explorer.time_limit.value = 10
    plan = explorer.solve()
    assert plan is not None and plan.solved, _status(explorer)
    assert "safe budget of 52000 MB" in plan.message
    assert float(plan.simulation.peak_memory.max()) <= 52000 + 1e-6
    assert plan.config.memory_budget == 56000.0  # the plan keeps the real budget


@pytest.mark.parametrize(("name", "typed", "value", "said"), [
    ("stages", "0", 1, "0 is below 1: set to 1"),
    ("stages", "-3", 1, "-3 is below 1: set to 1"),
    ("stages", "abc", 4, "'abc' is not a number: kept 4"),
    ("stages", "1000", 64, "1,000 is above 64: set to 64"),
    ("stages", "2.5", 2, "2.5 is not a whole number: set to 2"),
    ("memory budget", "-500", 0.0, "-500 is below 0: set to 0"),
    ("memory budget", "48,000", 48000.0, None),
])
def test_typed_values_are_corrected_and_said(explorer, name, typed, value, said):
    control = {"stages": explorer.stages, "memory budget": explorer.budget}[name]
    explorer.entries[name].value = typed
    assert control.value == value
    assert explorer.entries[name].value == str(value if name == "stages" else f"{value:g}")
    if said is None:
        assert explorer.input_note.value == ""
    else:
        import html

        assert f"{name}: {said}" in html.unescape(explorer.input_note.value)


def test_the_boxes_follow_the_sliders(explorer):
    explorer.stages.value = 8
    assert explorer.entries["stages"].value == "8"
    explorer.budget.value = 40000.0
    assert explorer.entries["memory budget"].value == "40000"


@pytest.mark.slow
def test_kernel_interrupt_in_a_real_kernel():
    """In a real ipykernel, idle after the click: Kernel -> Interrupt (SIGINT) stops the solve."""
    import time

    manager_mod = pytest.importorskip("jupyter_client.manager")
    km, kc = manager_mod.start_new_kernel(kernel_name="python3", startup_timeout=120)
    try:
        def run(code):
            out = []
            reply = kc.execute_interactive(code, timeout=60, output_hook=lambda m: out.append(
                m["content"].get("text", "") if m["msg_type"] == "stream" else ""))
            assert reply["content"]["status"] == "ok", reply["content"]
            return "".join(out)

        run("""
import threading
import sapptk.balancer as balancer
from sapptk.config import PipelineConfig
from sapptk.plan import even_split, make_plan
from sapptk.profile import bundled_profile
from sapptk.explorer import Explorer

def held(request):  # a search that runs until stopped
    request.stop.wait(60)
    profile, config = request.profile, request.config
    plan = even_split(profile, config, "full")
    return make_plan(profile, config, plan.counts, status="feasible", step_time=plan.step_time,
                     bound=0.9 * plan.step_time, gap=0.1, message="stopped")

balancer.solve = held
explorer = Explorer(bundled_profile("llama2_70b"), PipelineConfig(4, 8, memory_budget=56000.0))
explorer.solve_button.click()
print(explorer.status_text)
""")
        time.sleep(1.0)  # the kernel is idle now, the solve runs on its thread
        km.interrupt_kernel()
        status = ""
        for _ in range(100):
            status = run("print(explorer.status_text)")
            if not status.startswith(("solving", "cancelling", "drawing")):
                break
            time.sleep(0.2)
        assert "stopped by Kernel → Interrupt" in status, status
        # the kernel is fine afterwards, and a cell still gets its KeyboardInterrupt
        assert run("print(1 + 1)").strip() == "2"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


# ------------------------------------------------------------------ the choose tab
def _tiny_explorer(mixed: bool = False):
    """An Explorer on a uniform profile (a choice decided at once), or ``mixed``: a random
    one of two groups, where several setups are balanced one after the other."""
    from sapptk.profile import LayerGroup, ModeCost, Profile

    if mixed:
        import numpy as np
        from support import small_profile

        profile, budget, batch = small_profile(np.random.default_rng(19), groups=2, layers=(4, 6)), 60.0, 16
    else:
        profile, budget, batch = Profile("uniform", (LayerGroup("body", "body", 8, 1.0, 1.0,
                                                                {"none": ModeCost(2.0, 1.0)}),)), 100.0, 8
    ex = Explorer(profile, PipelineConfig(2, 4, 1, "1f1b", memory_budget=budget), time_limit=2)
    ex.chooser.devices.value, ex.chooser.global_batch.value, ex.chooser.time_limit.value = 4, batch, 2
    return ex


class HeldChoose:
    """``sapptk.choose`` as it is, except that once a setup is balanced it holds (a long setup)
    until its stop event is set; ``raises``: raise that instead of choosing."""

    def __init__(self, raises: BaseException | None = None, balanced: int = 1) -> None:
        import sapptk.choosing

        self.real = sapptk.choosing.choose
        self.first = threading.Event()
        self.raises = raises
        self.balanced = balanced  # hold once this many setups are balanced (0: once one is decided)

    def __call__(self, profile, **kw):
        if self.raises is not None:
            raise self.raises
        stop, report = kw["stop"], kw["on_progress"]

        def progress(counts):
            report(counts)
            if counts["balanced"] >= self.balanced and not self.first.is_set():
                self.first.set()
                stop.wait(60)

        return self.real(profile, **{**kw, "on_progress": progress})


@pytest.fixture
def held_choose(monkeypatch):
    import sapptk.choosing

    stand_in = HeldChoose()
    monkeypatch.setattr(sapptk.choosing, "choose", stand_in)
    return stand_in


def test_choose_cancel_keeps_the_partial_ranking(held_choose):
    ex = _tiny_explorer(mixed=True)
    panel = ex.chooser
    panel.choose_button.click()
    assert held_choose.first.wait(60)
    assert "1 balanced" in panel.progress.value and "decided" in panel.progress.value
    assert panel.choose_button.disabled and not panel.cancel_button.disabled
    assert panel.status_text.startswith("choosing") and "Cancel stops it" in panel.status_text
    panel.cancel_button.click()
    choice = panel.wait(60)
    assert not panel.busy and choice is not None and choice.status == "stopped"
    counts = choice.counts
    assert counts["undecided"] >= 1 and counts["undecided"] < len(choice.frame)
    assert panel.status_text.startswith("stopped by Cancel:") and "partial" in panel.status_text
    assert "<table" in panel.table.value and "undecided" in panel.table.value
    assert not panel.choose_button.disabled and panel.cancel_button.disabled
    assert choice.best is not None and not panel.use_button.disabled and len(panel.figure.children) == 1


def test_choose_kernel_interrupt_stops_it(held_choose, kernel):
    import signal

    held_choose.balanced = 0
    panel = _tiny_explorer().chooser
    panel.choose_button.click()
    assert "Kernel → Interrupt stops it" in panel.status_text
    assert held_choose.first.wait(60)
    kernel.saved_sigint_handler(signal.SIGINT, None)  # Kernel -> Interrupt while the kernel is idle
    choice = panel.wait(60)
    assert choice.status == "stopped" and panel.status_text.startswith("stopped by Kernel → Interrupt:")
    assert not panel.choose_button.disabled


def test_choose_interrupted_or_failing_in_its_thread_is_a_status_line(monkeypatch):
    import sapptk.choosing

    panel = _tiny_explorer().chooser
    for exc, said in ((KeyboardInterrupt(), "interrupted: the choice was interrupted (KeyboardInterrupt)"),
                      (RuntimeError("boom"), "error: RuntimeError: boom")):
        monkeypatch.setattr(sapptk.choosing, "choose", HeldChoose(raises=exc))
        panel.choose_button.click()
        panel.wait(30)
        assert panel.status_text.startswith(said), panel.status_text
        assert not panel.choose_button.disabled and panel.cancel_button.disabled and not panel.busy


def test_choice_table_and_progress_text():
    from sapptk.explorer.choose_tab import choice_table, progress_text

    panel = _tiny_explorer().chooser
    panel.choose_button.click()
    choice = panel.wait(120)
    assert choice.status == "complete" and "tokens_per_s_per_device" in choice.top(10)
    table = choice_table(choice)
    assert "tokens_per_s_per_device" not in table  # no sequence length: no value in any row
    assert all(table[c].notna().any() for c in table)
    times = table["step_time_ms"].dropna()
    assert (times == times.round(1)).all()
    assert "decided" in panel.progress.value and f"of {len(choice.frame)} setups" in panel.progress.value
    assert progress_text({"decided": 5, "balanced": 2, "pruned": 2, "total": 24}, 12.34) == (
        "decided 5 of 24 setups (2 balanced, 2 pruned, 1 infeasible or invalid) · 12.3 s")
    assert progress_text({}, 0.5).startswith("bounding")
