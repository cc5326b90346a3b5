"""Fuzzing the boundary: every input gives a clear sapptk error or a correct result, nothing
else, and within a time bound.

"Clear" means a :class:`~sapptk.errors.SapptkError` (never a raw numpy, OverflowError,
RecursionError or KeyError from inside). "Correct" is checked by an oracle per entry point:
a profile keeps its layer counts and bounded figures and simulates to finite, consistent
times and memory; a plan read from MindFormers lists places every layer once and round-trips
through its own export; a program has the number of ops its setup implies. A call that does
not return within :data:`HANG_SECONDS` fails as a hang (a generous bound: a hang check, not a
timing assert).

``tests/data/bad/`` holds hand-made bad files; ``expected.json`` there says which error each
must give. ``benchmarks/fuzz.py`` runs a fresh, larger campaign and counts the outcomes.
"""

from __future__ import annotations

import copy
import json
import math
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sapptk.errors as errors
from sapptk.config import PipelineConfig, program_ops
from sapptk.errors import SapptkError
from sapptk.formats import mindformers
from sapptk.plan import Plan, even_split, load_plan
from sapptk.profile import (
    MAX_LAYERS,
    MAX_MB,
    MAX_MS,
    MODES,
    LayerGroup,
    ModeCost,
    Profile,
    bundled_profile,
    load_profile,
)
from sapptk.schedules import get, names
from sapptk.simulation import simulate

HANG_SECONDS = 60.0
BAD = Path(__file__).parent / "data" / "bad"
LLAMA = bundled_profile("llama2_70b")
DEMO = bundled_profile("demo")
FUZZ = settings(max_examples=40, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def outcome(fn: Any) -> tuple[str, Any]:
    """``("ok", value)`` or ``("clear", error)``; any other exception fails the test as a raw
    traceback, and a call still running after :data:`HANG_SECONDS` fails it as a hang."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except SapptkError as exc:
            box["clear"] = exc
        except BaseException as exc:  # noqa: BLE001 - reported below, with its type
            box["raw"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(HANG_SECONDS)
    if thread.is_alive():
        pytest.fail(f"hang: still running after {HANG_SECONDS:g} s")
    if "raw" in box:
        raise AssertionError(f"raw {type(box['raw']).__name__}, not a sapptk error: {box['raw']}") from box["raw"]
    if "clear" in box:
        message = str(box["clear"])
        assert message and "Traceback" not in message
        return "clear", box["clear"]
    return "ok", box["value"]


# ------------------------------------------------------------------------------ values
EXTREME_INTS = [0, -1, 1, 2**31, 2**53 + 1, 2**62, 2**63, 2**64, -(2**63) - 1, 10**30, 10**400]
EXTREME_FLOATS = [0.0, -0.0, 1e-300, 5e-324, 1e300, -1e300, math.inf, -math.inf, math.nan, 2.5, 1e8]
junk = st.one_of(
    st.none(), st.booleans(), st.text(max_size=4), st.sampled_from(["", "1", "nan", "\x00", "\udcff"]),
    st.lists(st.integers(-3, 3), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2),
)
extreme = st.one_of(st.sampled_from(EXTREME_INTS), st.sampled_from(EXTREME_FLOATS), st.integers(), st.floats())


@st.composite
def field(draw: st.DrawFn, plausible: st.SearchStrategy[Any], odds: int = 12) -> Any:
    """A plausible value, except one time in ``odds`` an extreme one or one of the wrong type."""
    if draw(st.integers(0, odds - 1)) == 0:
        return draw(st.one_of(extreme, junk))
    return draw(plausible)


# ---------------------------------------------------------------------------- profiles
def check_profile(profile: Profile, counts: dict[str, int] | None = None) -> None:
    """What a parsed profile promises: bounded, finite figures, at least one body group."""
    assert profile.body
    for group in profile.groups:
        assert 1 <= group.count <= MAX_LAYERS
        assert 0 <= group.forward <= MAX_MS and 0 <= group.params <= MAX_MB
        assert group.modes
        for cost in group.modes.values():
            assert 0 <= cost.backward <= MAX_MS and 0 <= cost.activation <= MAX_MB
        if counts is not None:
            assert counts[group.name] == group.count


def check_simulation(plan: Plan) -> None:
    """A simulated plan: every layer placed once; finite, non-negative, consistent figures."""
    placed = plan.counts.sum(axis=(1, 2))
    assert placed.tolist() == [g.count for g in plan.profile.body]
    assert (plan.counts >= 0).all()
    sim = plan.simulation
    assert math.isfinite(sim.step_time) and sim.step_time >= 0
    summary = sim.summary
    assert (summary["busy_ms"] <= sim.step_time * (1 + 1e-9) + 1e-6).all()  # no device is busier than the step
    peaks = sim.peak_memory.to_numpy()
    assert np.isfinite(peaks).all() and (peaks >= summary["static_mb"].to_numpy() - 1e-6).all()


SAPP_TIME_KEYS = ["backward_time", "select_rec_time", "select_comm_time", "both_comm_select_time", "recompute_time"]
SAPP_MEMORY_KEYS = ["memory_activation", "memory_select_rec", "memory_select_comm", "memory_both_comm_select",
                    "memory_recompute"]
SAPP_COEF_KEYS = ["backward_coef", "select_rec_coef", "select_comm_coef", "both_comm_select_coef", "recompute_coef"]


@st.composite
def sapp_entries(draw: st.DrawFn, kind: str, name: str) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "name": draw(field(st.just(name))),
        "type": draw(field(st.sampled_from([kind, kind.lower()]))),
        "nb_layer": draw(field(st.integers(1, 12))),
        "time": draw(field(st.floats(0, 500))),
        "memory_parameter": draw(field(st.floats(0, 5000))),
    }
    if kind == "BODY" or draw(st.booleans()):
        for key in draw(st.lists(st.sampled_from(SAPP_MEMORY_KEYS), min_size=1, max_size=5, unique=True)):
            entry[key] = draw(field(st.floats(0, 2000)))
    for key in draw(st.lists(st.sampled_from(SAPP_TIME_KEYS + SAPP_COEF_KEYS + ["forward_time"]), max_size=3,
                             unique=True)):
        entry[key] = draw(field(st.floats(0, 3)))
    if draw(st.integers(0, 9)) == 0:  # a misspelt field now and then
        entry[draw(st.sampled_from(["memory_activaton", "recompute_tim", "x_coef", "comment"]))] = 1
    return entry


@st.composite
def sapp_profiles(draw: st.DrawFn) -> dict[str, Any]:
    entries = []
    if draw(st.booleans()):
        entries.append(draw(sapp_entries("HEAD", "emb")))
    entries += [draw(sapp_entries("BODY", f"body{i}")) for i in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):
        entries.append(draw(sapp_entries("TAIL", "out")))
    if draw(st.integers(0, 9)) == 0:
        entries = draw(st.permutations(entries))
    return {"name": draw(field(st.just("fuzzed"))), "layers_description": entries}


def simulate_even(profile: Profile) -> Plan:
    config = PipelineConfig(2, 4, memory_budget=1e6)
    config.check(profile)
    plan = even_split(profile, config, "auto")
    check_simulation(plan)
    return plan


@FUZZ
@given(sapp_profiles())
def test_profile_dicts_give_a_clear_error_or_a_sound_profile(data: dict[str, Any]) -> None:
    before = copy.deepcopy(data)
    kind, profile = outcome(lambda: Profile.from_dict(data, source="<fuzz>"))
    assert json.dumps(data, default=repr) == json.dumps(before, default=repr)  # never mutated
    if kind == "ok":
        check_profile(profile)
        outcome(lambda: simulate_even(profile))


SEED_TEXTS = {
    ".json": (Path(__file__).parents[1] / "data" / "demo.json").read_bytes(),
    ".yaml": (Path(__file__).parents[1] / "data" / "deepseek_v3.yaml").read_bytes(),
}
SPLICES = [b"\x00", b"\xff\xfe", b"\xe9", b"[" * 120, b"&a [1]", b"*a", b"!!python/object:x", b"\x07", b"1e999",
           b"9" * 30, b'"\\ud800"', b"{", b"}", b"- ", b": ", b"\n---\n", b"\t", b"NaN", b"-1"]


@st.composite
def mutated_files(draw: st.DrawFn) -> tuple[str, bytes]:
    suffix = draw(st.sampled_from(sorted(SEED_TEXTS)))
    data = bytearray(SEED_TEXTS[suffix])
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["insert", "delete", "replace", "truncate"]))
        piece = draw(st.one_of(st.sampled_from(SPLICES), st.binary(min_size=1, max_size=6)))
        if action == "insert":
            data[at:at] = piece
        elif action == "delete":
            del data[at : at + draw(st.integers(1, 20))]
        elif action == "replace":
            data[at : at + len(piece)] = piece
        else:
            del data[at:]
    return suffix, bytes(data)


@FUZZ
@given(mutated_files())
def test_mutated_profile_files_give_a_clear_error_or_a_sound_profile(case: tuple[str, bytes]) -> None:
    suffix, data = case
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"fuzzed{suffix}"
        path.write_bytes(data)
        kind, profile = outcome(lambda: load_profile(path))
        if kind == "clear":
            assert str(path) in str(profile)  # the message names the file
        else:
            check_profile(profile)
            outcome(lambda: simulate_even(profile))


@pytest.mark.parametrize("name", sorted(json.loads((BAD / "expected.json").read_text())["files"]))
def test_bad_corpus_gives_its_error(name: str) -> None:
    spec = json.loads((BAD / "expected.json").read_text())["files"][name]
    path = BAD / name
    if spec["reader"] == "profile":
        kind, error = outcome(lambda: load_profile(path))
    else:
        kind, error = outcome(lambda: load_plan(path, "mindformers", profile=LLAMA, config=PipelineConfig(4, 8)))
    assert kind == "clear", f"{name} was accepted"
    assert type(error) is getattr(errors, spec["error"])
    message = str(error)
    for fragment in [str(path), *spec["message"]]:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# --------------------------------------------------------------------------- MindFormers
def cells(rows: int, cols: int, values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    row = st.lists(values, min_size=max(0, cols - 1), max_size=cols + 1)
    return st.one_of(st.lists(row, min_size=max(1, rows - 1), max_size=rows + 1), row, values)


@st.composite
def mindformers_configs(draw: st.DrawFn, rows: int, cols: int) -> dict[str, Any]:
    small = st.integers(-3, 6)
    values = st.one_of(small, small, small, st.booleans(), st.sampled_from(EXTREME_INTS), junk, st.floats())
    config: dict[str, Any] = {}
    for key in draw(st.lists(st.sampled_from([*mindformers.KEYS, "offest", "pipeline_stage"]), max_size=4,
                             unique=True)):
        config[key] = draw(st.one_of(cells(rows, cols, values), values))
    if draw(st.integers(0, 7)) == 0:
        return {"named": config, "other": draw(st.one_of(st.none(), junk))}
    return config


MF_SETUPS = [
    (LLAMA, PipelineConfig(4, 8)),
    (DEMO, PipelineConfig(2, 4, chunks=2, schedule="interleaved")),
]


@FUZZ
@given(st.integers(0, len(MF_SETUPS) - 1), st.data())
def test_mindformers_configs_give_a_clear_error_or_a_plan_that_round_trips(which: int, data: st.DataObject) -> None:
    profile, config = MF_SETUPS[which]
    raw = data.draw(mindformers_configs(config.chunks, config.stages))
    before = copy.deepcopy(raw)
    kind, plans = outcome(lambda: load_plan(raw, "mindformers", profile=profile, config=config))
    assert repr(raw) == repr(before)
    if kind == "clear":
        return
    for plan in plans.values() if isinstance(plans, dict) else [plans]:
        check_simulation(plan)
        kind, exported = outcome(lambda plan=plan: plan.export("mindformers").data)
        if kind == "ok":  # (a cell with select-only and comm-only layers has no export: a clear error)
            back = load_plan(exported, "mindformers", profile=profile, config=config)
            assert np.array_equal(back.counts, plan.counts)


# ------------------------------------------------------------------------ pipeline configs
@st.composite
def pipeline_fields(draw: st.DrawFn) -> dict[str, Any]:
    schedule = draw(st.sampled_from(names()))
    spec = get(schedule)
    stages = draw(st.integers(1, 6))
    chunks = draw(st.sampled_from(spec.chunks) if spec.chunks else st.integers(1, 3))
    return {
        "stages": draw(field(st.just(stages))),
        "micro_batches": draw(field(st.integers(max(stages, spec.min_micro_batches(stages, chunks)), 4 * stages + 8))),
        "chunks": draw(field(st.just(chunks))),
        "schedule": draw(field(st.just(schedule))),
        "splits": draw(field(st.integers(1, 3) if spec.splits else st.just(1))),
        "memory_budget": draw(st.one_of(st.none(), field(st.floats(1, 1e6)))),
        "constant_memory": draw(field(st.floats(0, 1e4))),
        "comm": draw(field(st.floats(0, 5))),
        "recompute": draw(st.one_of(st.lists(st.sampled_from(MODES), min_size=1, unique=True).map(tuple),
                                    st.sampled_from(MODES), junk)),
    }


def build_and_check(config: PipelineConfig) -> None:
    config.validate()
    ops = program_ops(config.schedule, config.stages, config.micro_batches, config.chunks, config.splits)
    if ops > 20_000:  # valid but big: building it is the benchmark's job, not the fast loop's
        return
    program = config.program()
    forwards = config.stages * config.chunks * config.micro_batches * config.splits
    kinds = program.ops["kind"].value_counts()
    assert kinds["F"] == forwards and kinds["B"] + kinds["I"] == forwards  # one of each per slice and stage
    assert kinds["W"] == kinds["I"] and len(program.ops) <= ops
    config.check(LLAMA)
    check_simulation(even_split(LLAMA, config, "auto"))


@FUZZ
@given(pipeline_fields())
def test_pipeline_configs_give_a_clear_error_or_a_program_of_the_right_size(fields: dict[str, Any]) -> None:
    outcome(lambda: build_and_check(PipelineConfig(**fields)))


# --------------------------------------------------------------------------- simulate
@st.composite
def simulate_arguments(draw: st.DrawFn) -> dict[str, Any]:
    program = PipelineConfig(2, 4, chunks=2, schedule="interleaved").program()
    costs = st.one_of(st.floats(0, 10), st.lists(st.floats(0, 10), min_size=3, max_size=5), extreme, junk)
    return {
        "program": draw(st.one_of(st.just(program), st.just(program), junk)),
        "forward": draw(costs), "backward": draw(costs), "weight": draw(costs),
        "activation": draw(costs), "params": draw(costs), "comm": draw(field(st.floats(0, 1))),
        "constant": draw(field(st.floats(0, 10))), "weight_holds": draw(field(st.floats(0, 1))),
    }


@FUZZ
@given(simulate_arguments())
def test_simulate_arguments_give_a_clear_error_or_finite_figures(kw: dict[str, Any]) -> None:
    program = kw.pop("program")
    kind, sim = outcome(lambda: simulate(program, **kw))
    if kind == "ok":
        assert math.isfinite(sim.step_time) and sim.step_time >= 0
        assert np.isfinite(sim.peak_memory.to_numpy()).all() and (sim.peak_memory.to_numpy() >= 0).all()


# ---------------------------------------------------------------------- hand-built groups
@FUZZ
@given(field(st.integers(1, 8)), field(st.floats(0, 100)), field(st.floats(0, 100)), field(st.floats(0, 100)))
def test_layer_groups_built_in_python(count: Any, forward: Any, backward: Any, activation: Any) -> None:
    def build() -> Profile:
        group = LayerGroup("g", "body", count, forward, 1.0, {"none": ModeCost(backward, activation)})
        return Profile("p", (group,))

    kind, profile = outcome(build)
    if kind == "ok":
        check_profile(profile)
        outcome(lambda: simulate_even(profile))


# ------------------------------------------------ the surfaces added since (issue 22)
# Profiler traces, calibration sizes, design, schedule CSV, Megatron and torchtitan import, plan
# files, to_chrome_trace targets, degenerate setups and safe budgets: generators and oracles in
# tests/fuzz_surfaces.py and tests/fuzz_runs.py (benchmarks/fuzz.py --surfaces new runs them too).
def _run_surface_cases(seed: int, size: int, skip: tuple[str, ...] = ()) -> dict[str, int]:
    from fuzz_surfaces import make_cases, run_case

    seen: dict[str, int] = {}
    for case in make_cases(seed, size):
        if case["cat"] in skip:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            try:  # a refuted result (fuzz_surfaces.Wrong) fails as a raw exception, naming the oracle
                outcome(lambda case=case, tmp=tmp: run_case(case, Path(tmp)))
            except AssertionError as exc:
                raise AssertionError(f"{exc} for {case}") from exc
        seen[case["cat"]] = seen.get(case["cat"], 0) + 1
    return seen


def test_new_surfaces_a_fixed_sample():
    """About 60 inputs over every new surface (seed 22): clear errors or results the oracles accept.
    (Degenerate setups balance for seconds: test_degenerate_shapes.py has them in the fast loop.)"""
    from fuzz_surfaces import SURFACES

    assert set(_run_surface_cases(22, 60, skip=("degenerate",))) == set(SURFACES) - {"degenerate"}


@pytest.mark.slow
def test_new_surfaces_four_hundred_inputs():
    """More of them, degenerate setups included (the 1,000-input campaign is benchmarks/fuzz.py --surfaces new)."""
    assert sum(_run_surface_cases(2022, 400).values()) >= 400
