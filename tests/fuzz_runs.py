"""The runners and oracles of the cases of :mod:`fuzz_surfaces`: one function per surface,
``(data, folder) -> None``. Each calls public entry points only and raises
:class:`fuzz_surfaces.Wrong` when the result is refuted; sapptk errors pass through."""

from __future__ import annotations

import contextlib
import math
import os
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from fuzz_surfaces import ROOT, case_bytes, expect, mutate_text, mutate_tree

_TOLERANCE_MS = 1e-6


def _profiles() -> tuple[Any, Any]:
    from sapptk.profile import bundled_profile

    return bundled_profile("llama2_70b"), bundled_profile("demo")


def check_plan(plan: Any) -> None:
    """Layers placed once, the stated step time the simulated one, finite figures, a solved plan fits."""
    expect(bool((np.asarray(plan.counts) >= 0).all()), "negative layer counts")
    placed = np.asarray(plan.counts).sum(axis=(1, 2)).tolist()
    expect(placed == [g.count for g in plan.profile.body], f"layers placed {placed}")
    sim = plan.simulate()
    expect(math.isfinite(sim.step_time) and sim.step_time >= 0, f"step time {sim.step_time}")
    expect(abs(sim.step_time - plan.step_time) <= _TOLERANCE_MS + 1e-9 * sim.step_time,
           f"stated step {plan.step_time} != simulated {sim.step_time}")
    peaks = sim.peak_memory.to_numpy()
    expect(bool(np.isfinite(peaks).all() and (peaks >= 0).all()), f"peaks {peaks[:4]}")
    if plan.status in ("optimal", "feasible"):
        expect(plan.fits, f"status {plan.status} but over the budget")
    if plan.bound is not None:
        expect(plan.bound <= sim.step_time + _TOLERANCE_MS, f"bound {plan.bound} above the step {sim.step_time}")


def run_trace(d: dict[str, Any], folder: Path) -> None:
    from sapptk.calibration import chrome_layer_times, layer_times, mindspore_layer_times, pytorch_layer_times

    path = folder / ("trace.json.gz" if d["form"] == "gz" else "trace.json")
    path.write_bytes(case_bytes(d))
    reader = {"layer_times": layer_times, "chrome": chrome_layer_times, "pytorch": pytorch_layer_times,
              "mindspore": mindspore_layer_times}[d["reader"]]
    times = reader(path, d["layers"], **d["options"])
    durations = times.samples["duration_ms"].to_numpy(dtype=float)
    expect(len(durations) > 0, "no samples")
    expect(bool(np.isfinite(durations).all() and (durations >= 0).all()), f"durations {durations[:4]}")
    for group, phases in times.medians().items():
        expect(all(math.isfinite(v) and v >= 0 for v in phases.values()), f"medians of {group}: {phases}")


def run_calibration(d: dict[str, Any], folder: Path) -> None:
    from sapptk.calibration import calibrate

    data = yaml.safe_load((ROOT / "data" / "calibration" / d["file"]).read_text(encoding="utf-8"))
    for keys, value in d["edits"]:
        node = data
        for key in keys[:-1]:
            node = node.setdefault(key, {})
        node[keys[-1]] = value
    path = folder / "calibration.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    result = calibrate(path)
    for g in result.profile.groups:
        expect(g.count >= 1 and math.isfinite(g.forward) and g.params >= 0 and math.isfinite(g.params), g.name)
        for cost in g.modes.values():
            expect(math.isfinite(cost.activation) and cost.activation >= 0, f"{g.name} activation")


def run_design(d: dict[str, Any], folder: Path) -> None:
    from sapptk.calibration import design

    stages, layers = d.pop("stages"), d.pop("layers")
    modes = d.pop("modes")
    result = design(stages, layers, tuple(modes) if isinstance(modes, list) else modes, **d)
    expect(len(result.rounds) >= 1, "no dry run")
    if d.get("rounds") is not None:
        expect(len(result.rounds) == d["rounds"], f"{len(result.rounds)} rounds for rounds = {d['rounds']}")
    for run in result.rounds:
        expect(all(len(values) == stages for values in run.values()), "a list without one value per stage")
    expect(math.isfinite(result.condition) and result.condition >= 1 - 1e-9, f"condition {result.condition}")


def run_csv(d: dict[str, Any], folder: Path) -> None:
    from sapptk.schedules import build, from_csv_text

    program = build(d["schedule"], stages=d["p"], micro_batches=d["m"], chunks=d["v"])
    text = program.to_csv()
    if d["pieces"]:
        text = mutate_text(random.Random(d["seed"]), text, d["pieces"])
    read = from_csv_text(text)
    forwards = int((read.ops["kind"] == "F").sum())
    expect(forwards == read.stages * read.chunks * read.micro_batches, f"{forwards} forwards")
    expect(from_csv_text(read.to_csv()).units == read.units, "the CSV does not round-trip")


def _megatron_config(d: dict[str, Any]) -> Any:
    from sapptk.config import PipelineConfig

    p, v = d["p"], d["v"]
    return PipelineConfig(p, 2 * p, chunks=v, schedule="interleaved" if v > 1 else "1f1b")


def run_megatron(d: dict[str, Any], folder: Path) -> None:
    from sapptk.formats.megatron import format_layout
    from sapptk.plan import load_plan

    llama, _ = _profiles()
    config = _megatron_config(d)
    if d["mode"] == "layout":
        r = random.Random(d["seed"])
        parts = config.stages * config.chunks
        cuts = sorted(r.sample(range(1, llama.num_body_layers), parts - 1))
        layers = [b - a for a, b in zip([0, *cuts], [*cuts, llama.num_body_layers], strict=True)]
        source: Any = mutate_text(r, format_layout(layers), d["pieces"]) if d["pieces"] else format_layout(layers)
    else:
        source = d["flags"]
    check_plan(load_plan(source, "megatron", profile=llama, config=config))


def run_torchtitan(d: dict[str, Any], folder: Path) -> None:
    from sapptk.plan import even_split, load_plan

    llama, _ = _profiles()
    text = even_split(llama, _megatron_config(d)).export("torchtitan").text
    r = random.Random(d["seed"])
    for number in d["numbers"]:
        spots = [m.span(1) for m in re.finditer(r"= (\d+)", text)]
        if spots:
            a, b = r.choice(spots)
            text = text[:a] + number + text[b:]
    if d["pieces"]:
        text = mutate_text(r, text, d["pieces"])
    check_plan(load_plan(text, "torchtitan", profile=llama))


def run_plan_file(d: dict[str, Any], folder: Path) -> None:
    from sapptk.config import PipelineConfig
    from sapptk.plan import even_split, load_plan

    llama, _ = _profiles()
    p = d["p"]
    config = PipelineConfig(p, 2 * p, chunks=2 if d["schedule"] == "interleaved" else 1, schedule=d["schedule"])
    data = yaml.safe_load(even_split(llama, config).export("sapptk").text)
    for what, value in d["edits"]:
        if not isinstance(data, dict) or not isinstance(data.get("setup"), dict) or not data.get("layout"):
            break  # an earlier edit replaced what the next one edits
        step = data.get("step_time_ms")
        numeric = isinstance(step, float) and math.isfinite(step)
        if what == "status":
            data["status"] = value
        elif what == "scale_step" and numeric:
            data["step_time_ms"] = step * value
        elif what == "step_time_ms":
            data["step_time_ms"] = value
        elif what == "bound" and numeric:
            data["bound_ms"] = step * value
        elif what == "gap":
            data["gap"] = value
        elif what == "budget":
            data["setup"]["memory_budget_mb"] = value
        elif what == "layers":
            data["layout"][0]["layers"] = value
        elif what == "tree":
            data = mutate_tree(random.Random(value), data)
    path = folder / "plan.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    plan = load_plan(path)
    if plan.solved:
        check_plan(plan)
        if plan.gap is not None and plan.bound is not None and plan.step_time > 0:
            gap = max(0.0, (plan.step_time - plan.bound) / plan.step_time)
            expect(abs(plan.gap - gap) <= 1e-6, f"gap {plan.gap}, step and bound give {gap}")


def run_export(d: dict[str, Any], folder: Path) -> None:
    from sapptk.config import PipelineConfig
    from sapptk.formats.chrome_trace import read_trace
    from sapptk.plan import even_split

    _, demo = _profiles()
    sim = even_split(demo, PipelineConfig(2, 4)).simulation
    kind = d["target"]
    target: Any = {"dir": folder, "missing_folder": folder / "no" / "t.json", "file": folder / "t.json",
                   "gz": folder / "t.json.gz", "existing": folder / "old.json", "nul": str(folder / "a\x00b.json"),
                   "int": 42, "dev_null": "/dev/null", "fifo": folder / "fifo.json"}[kind]
    if kind == "fifo":
        os.mkfifo(target)
    if kind == "existing":
        target.write_text("old")
    out = sim.to_chrome_trace(target)
    events = read_trace(out).events
    expect(len(events) == len(sim.events), f"{len(events)} events for {len(sim.events)} ops")


def _four_layers() -> Any:
    from sapptk.profile import LayerGroup, ModeCost, Profile

    modes = {"none": ModeCost(backward=2.0, activation=40.0), "full": ModeCost(backward=3.0, activation=5.0)}
    return Profile("four", (LayerGroup("head", "head", 1, 0.5, 10.0), LayerGroup("body", "body", 4, 1.0, 20.0, modes),
                            LayerGroup("tail", "tail", 1, 0.5, 10.0)))


def run_degenerate(d: dict[str, Any], folder: Path) -> None:
    from sapptk import balance
    from sapptk.config import PipelineConfig
    from sapptk.plan import even_split

    _, demo = _profiles()
    chunks = 2 if d["schedule"] == "interleaved" else 1
    safety = {} if d["oom_risk"] is None else {"oom_risk": d["oom_risk"], "memory_error": 0.02}
    shape = d["shape"]
    if shape == "one_stage":
        profile, config = demo, PipelineConfig(1, d["m"], chunks=chunks, schedule=d["schedule"], memory_budget=1e9)
    else:
        profile = _four_layers()
        p = 4 // chunks
        config = PipelineConfig(p, max(p, d["m"]), chunks=chunks, schedule=d["schedule"])
        if shape != "stages_eq_layers":
            least = float(even_split(profile, config, "full").simulation.peak_memory.max())
            config = config.replace(memory_budget=least - (0.01 if shape == "budget_below" else 0.0))
        elif safety:
            config = config.replace(memory_budget=1e9)
    plan = balance(profile, config, time_limit=2, per_micro_batch=d["per_micro_batch"], **safety)
    if plan.solved:
        check_plan(plan)
    # the least peak of any plan is full recompute on one layer per device only with one chunk: an
    # interleaved plan may leave the head's virtual stage without body layers
    if not safety and (chunks == 1 or shape == "one_stage"):
        if shape == "budget_below":
            expect(plan.status == "infeasible", f"status {plan.status} below the least memory any plan needs")
        else:
            expect(plan.solved and plan.fits, f"status {plan.status}: {plan.message[:120]}")


def run_safe_budget(d: dict[str, Any], folder: Path) -> None:
    from sapptk.config import PipelineConfig
    from sapptk.sensitivity import robust_budget

    config = PipelineConfig(4, 8, memory_budget=d["budget"], constant_memory=d["constant"])
    out = robust_budget(config, oom_risk=d["oom_risk"], memory_error=d["memory_error"],
                        memory_margin=d["memory_margin"])
    expect(math.isfinite(out) and d["constant"] < out <= d["budget"], f"safe budget {out}")


def run_argument_types(d: dict[str, Any], folder: Path) -> None:
    """An entry point with one argument replaced: a clear error or a result, never a raw one."""
    from sapptk import balance, calibration
    from sapptk.config import PipelineConfig
    from sapptk.formats.chrome_trace import read_trace
    from sapptk.plan import even_split, load_plan
    from sapptk.schedules import from_csv, from_csv_text
    from sapptk.sensitivity import robust_budget

    llama, demo = _profiles()
    config = PipelineConfig(4, 8, memory_budget=1e6)
    plan = even_split(llama, config)
    trace = folder / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "name": "layer0", "pid": 1, "tid": 1, "ts": 0, "dur": 5}]}')
    csv = folder / "s.csv"
    csv.write_text(config.program().to_csv())
    calib = ROOT / "data" / "calibration" / "init_demo.yaml"
    calls: dict[str, tuple[Any, list[Any], dict[str, Any]]] = {
        "load_plan_megatron": (load_plan, ["E|(t*20|)*4,L", "megatron"], {"profile": llama, "config": config}),
        "load_plan_torchtitan": (load_plan, [plan.export("torchtitan").text, "torchtitan"], {"profile": llama}),
        "load_plan": (load_plan, [plan.export("sapptk").text], {}),
        "layer_times": (calibration.layer_times, [trace, r"layer\d"], {}),
        "chrome_layer_times": (calibration.chrome_layer_times, [trace, r"layer\d"], {"skip_steps": 0}),
        "mindspore_layer_times": (calibration.mindspore_layer_times, [trace, r"layer\d"], {"micro_batches": 2}),
        "read_trace": (read_trace, [trace], {}),
        "from_csv": (from_csv, [csv], {}),
        "from_csv_text": (from_csv_text, [config.program().to_csv()], {}),
        "design": (calibration.design, [4, 8, ("select",)], {"rounds": 2}),
        "calibrate": (calibration.calibrate, [calib], {"constant": "auto"}),
        "read_observations": (calibration.read_observations, [calib], {}),
        "validate": (calibration.validate, [plan, {"device": [0], "peak_mb": [1.0]}], {}),
        "to_chrome_trace": (plan.simulation.to_chrome_trace, [folder / "out.json"], {}),
        "plan_export": (plan.export, ["sapptk", folder / "plan.yaml"], {}),
        "robust_budget": (robust_budget, [config], {"oom_risk": 0.01, "memory_error": 0.02}),
        "balance_levers": (balance, [demo, PipelineConfig(2, 4, memory_budget=1e6)],
                           {"time_limit": 1, "per_micro_batch": False, "memory_margin": 0.05}),
    }
    fn, args, kwargs = calls[d["entry"]]
    slot = d["slot"]
    if slot < len(args) and d["entry"] not in ("balance_levers",):
        args[slot] = d["value"]
    elif kwargs:
        kwargs[sorted(kwargs)[slot % len(kwargs)]] = d["value"]
    else:
        args[slot % len(args)] = d["value"]
    with contextlib.chdir(folder):  # a replaced path argument ("x", 1) writes into the case's folder, never the cwd
        fn(*args, **kwargs)


RUNNERS = {"trace": run_trace, "calibration_size": run_calibration, "design": run_design, "schedule_csv": run_csv,
           "megatron": run_megatron, "torchtitan": run_torchtitan, "plan_file": run_plan_file,
           "chrome_export": run_export, "degenerate": run_degenerate, "safe_budget": run_safe_budget,
           "argument_types": run_argument_types}
