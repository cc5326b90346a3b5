"""Conformance of the line-placed schedules (gpipe, 1f1b, interleaved, interleaved-lm,
seq1f1b) with their closed forms and with hand-worked small cases."""

from __future__ import annotations

import numpy as np
import pytest
from support import reference_program

from sapptk.errors import DeadlockError, ScheduleError
from sapptk.schedules import Op, build, make_program, names, program_from_arrays
from sapptk.schedules.interleaved import micro_batch_groups
from sapptk.simulation import simulate


def grid(min_m=lambda p: 1):
    """(p, m) pairs: p from 2 to 8, m from p to 4p including non-multiples of p."""
    for p in range(2, 9):
        for m in sorted({p, p + 1, 2 * p - 1, 2 * p, 3 * p, 4 * p}):
            if m >= min_m(p):
                yield p, m


def assert_dependencies_hold(sim) -> None:
    """Every op starts after its deps end; units on one device never overlap."""
    g = sim.program.graph
    ev = sim.events
    start = ev["start_ms"].to_numpy()
    end = ev["end_ms"].to_numpy()
    for c in range(2):
        dep = g.op_deps[:, c]
        has = dep >= 0
        assert np.all(start[has] >= end[dep[has]] - 1e-9)
    # units: per device in order, start >= previous end
    us = np.zeros(g.n_units)
    ue = np.zeros(g.n_units)
    us[g.op_unit] = start
    ue[g.op_unit] = end
    for d in range(sim.program.stages):
        a, b = g.unit_ptr[d], g.unit_ptr[d + 1]
        assert np.all(us[a + 1 : b] >= ue[a : b - 1] - 1e-9)


def assert_each_op_once(program) -> None:
    ops = program.ops
    keys = ops[["kind", "micro_batch", "virtual_stage", "slice"]].astype(str).agg("/".join, axis=1)
    assert keys.is_unique
    n = program.micro_batches * program.num_virtual_stages * program.splits
    counts = ops["kind"].value_counts()
    assert counts["F"] == n
    assert counts["B"] + counts["I"] == n
    assert counts["W"] == counts["I"]


# ------------------------------------------------------------------ 1F1B, GPipe
@pytest.mark.slow
@pytest.mark.parametrize("name", ["1f1b", "gpipe"])
@pytest.mark.parametrize(("p", "m"), list(grid()))
def test_line_schedules_closed_forms(name, p, m):
    program = build(name, stages=p, micro_batches=m)
    assert_each_op_once(program)
    f, b = 1.25, 2.5
    sim = simulate(program, forward=f, backward=b)
    assert_dependencies_hold(sim)
    assert sim.step_time == pytest.approx((m + p - 1) * (f + b))
    assert sim.bubble.of_compute == pytest.approx((p - 1) / m)
    assert sim.bubble.of_step == pytest.approx((p - 1) / (m + p - 1))
    peak = program.peak_live()
    if name == "1f1b":
        assert peak.tolist() == [min(p - s, m) for s in range(p)]
    else:
        assert peak.tolist() == [m] * p


def test_worked_value_1f1b():
    sim = simulate(build("1f1b", stages=4, micro_batches=8), forward=1, backward=2)
    assert sim.step_time == 33
    assert sim.bubble.of_compute == pytest.approx(3 / 8)


def test_1f1b_fewer_micro_batches_than_stages():
    program = build("1f1b", stages=4, micro_batches=2)
    assert program.peak_live().tolist() == [2, 2, 2, 1]
    assert simulate(program, forward=1, backward=2).step_time == (2 + 4 - 1) * 3


# ------------------------------------------------------------------ interleaved
@pytest.mark.slow
@pytest.mark.parametrize("v", [1, 2, 3, 4])
@pytest.mark.parametrize(("p", "m"), list(grid(min_m=lambda p: p)))
@pytest.mark.parametrize(("name", "rule"), [("interleaved", "equal"), ("interleaved-rf", "remainder-first"),
                                            ("interleaved-megatron", "megatron")])
def test_interleaved_grid(p, m, v, name, rule):
    program = build(name, stages=p, micro_batches=m, chunks=v)
    assert_each_op_once(program)
    assert program.placement == tuple(vs % p for vs in range(p * v))
    f, b = 0.5, 1.0  # per chunk
    sim = simulate(program, forward=f, backward=b)
    assert_dependencies_hold(sim)
    peak = program.peak_live()
    g = len(micro_batch_groups(p, m, rule)[0])  # the first group sets the warm-up
    if rule == "remainder-first":
        assert g == p + m % p
    lead = 2 if v > 1 else 1  # v = 1 is plain 1F1B
    expected_peak = [min(v * m, (v - 1) * g + lead * (p - s - 1) + 1) for s in range(p)]
    assert peak.tolist() == expected_peak
    if m % p == 0:
        assert sim.step_time == pytest.approx((v * m + p - 1) * (f + b))
        assert sim.bubble.of_compute == pytest.approx((p - 1) / (v * m))
        if v > 1:  # device 0 holds (v − 1)·p + 2(p − 1) + 1 chunk activations
            assert peak[0] == min(v * m, (v - 1) * p + 2 * (p - 1) + 1)


def test_worked_value_interleaved():
    sim = simulate(build("interleaved", stages=4, micro_batches=8, chunks=2), forward=0.5, backward=1)
    assert sim.step_time == pytest.approx(28.5)
    assert sim.bubble.of_compute == pytest.approx(3 / 16)


def test_interleaved_remainder_peak_hand_case():
    # m not a multiple of p: p = 4, m = 6, v = 2 holds 12 chunk activations on stage 0
    program = build("interleaved", stages=4, micro_batches=6, chunks=2)
    assert program.peak_live()[0] == 12
    first_backward = next(i for i, op in enumerate(program.device_ops(0)) if op.kind == "B")
    assert first_backward == 12


def test_interleaved_hand_order_p2_m4_v2():
    program = build("interleaved", stages=2, micro_batches=4, chunks=2)
    assert program.describe() == (
        "device 0: F0@0 F1@0 F0@2 F1@2 F2@0 B0@2 F3@0 B1@2 F2@2 B0@0 F3@2 B1@0 B2@2 B3@2 B2@0 B3@0\n"
        "device 1: F0@1 F1@1 F0@3 B0@3 F1@3 B1@3 F2@1 B0@1 F3@1 B1@1 F2@3 B2@3 F3@3 B3@3 B2@1 B3@1"
    )
    # by hand with F = 1, B = 2 per chunk: (v·m + p − 1)(F + B) = 27
    assert simulate(program, forward=1, backward=2).step_time == 27


def test_interleaved_remainder_step_time_hand_case():
    # p = 2, m = 3, v = 2: one group of 3; warm-up (v − 1)·3 + 2(p − s − 1) = 5 on device 0, 3 on 1
    program = build("interleaved", stages=2, micro_batches=3, chunks=2)
    assert program.describe(0) == "device 0: F0@0 F1@0 F2@0 F0@2 F1@2 F2@2 B0@2 B1@2 B2@2 B0@0 B1@0 B2@0"
    assert program.describe(1) == "device 1: F0@1 F1@1 F2@1 F0@3 B0@3 F1@3 B1@3 F2@3 B2@3 B0@1 B1@1 B2@1"
    # by hand, F = 1 and B = 2 per chunk. Device 0: F0@0 0-1, F1@0 1-2, F2@0 2-3, F0@2 3-4,
    # F1@2 4-5, F2@2 5-6. Device 1: F0@1 1-2, F1@1 2-3, F2@1 3-4, F0@3 4-5, B0@3 5-7, F1@3 7-8,
    # B1@3 8-10, F2@3 10-11, B2@3 11-13. Device 0: B0@2 7-9, B1@2 10-12, B2@2 13-15.
    # Device 1: B0@1 13-15, B1@1 15-17, B2@1 17-19. Device 0: B0@0 15-17, B1@0 17-19, B2@0 19-21.
    sim = simulate(program, forward=1, backward=2)
    ev = sim.events.set_index(["kind", "micro_batch", "virtual_stage"])
    assert ev.loc[("B", 2, 3), "start_ms"] == 11
    assert ev.loc[("B", 0, 1), "start_ms"] == 13
    assert sim.step_time == 21


@pytest.mark.slow
@pytest.mark.parametrize("v", [1, 2, 3])
@pytest.mark.parametrize(("p", "m"), list(grid(min_m=lambda p: p)))
def test_interleaved_less_memory_grid(p, m, v):
    program = build("interleaved-lm", stages=p, micro_batches=m, chunks=v)
    assert_each_op_once(program)
    sim = simulate(program, forward=0.5, backward=1.0)
    assert_dependencies_hold(sim)
    g = p + m % p
    assert program.peak_live().tolist() == [min(v * m, (v - 1) * g + p - s) for s in range(p)]
    if m % p == 0 and v * m > v * p - 1:
        # at the peak the last chunk holds p − s and every other chunk p micro-batches
        for s, pts in enumerate(program.live_points()):
            top = pts[np.argmax(pts.sum(axis=1))]
            assert top.tolist() == [p] * (v - 1) + [p - s]


def test_interleaved_with_one_chunk_is_1f1b():
    a = build("interleaved", stages=4, micro_batches=8, chunks=1)
    b = build("1f1b", stages=4, micro_batches=8)
    assert a.describe() == b.describe()


# ------------------------------------------------------------------ seq1f1b
@pytest.mark.slow
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize(("p", "m"), list(grid()))
def test_seq1f1b_grid(p, m, k):
    program = build("seq1f1b", stages=p, micro_batches=m, splits=k)
    assert_each_op_once(program)
    sim = simulate(program, forward=1.0, backward=2.0)
    assert_dependencies_hold(sim)
    # in slices: stage s keeps p − s + k − 1 in flight (capped by the m·k it has)
    slices = np.round(program.peak_live() * k).astype(int).tolist()
    assert slices == [min(m * k, p - s + k - 1) for s in range(p)]
    # uniform slices behave like 1F1B over m·k micro-batches of 1/k the cost
    assert sim.step_time == pytest.approx((m * k + p - 1) * 3.0 / k)


def test_seq1f1b_hand_order():
    program = build("seq1f1b", stages=2, micro_batches=2, splits=2)
    assert program.describe() == (
        "device 0: F0@0 F0@0/1 F1@0 B0@0/1 F1@0/1 B0@0 B1@0/1 B1@0\n"
        "device 1: F0@1 F0@1/1 B0@1/1 F1@1 B0@1 F1@1/1 B1@1/1 B1@1"
    )


# ------------------------------------------------------------------ comm, costs
def test_comm_latency_hand_case():
    # p = 2, m = 2, F = 1, B = 2, comm 0.5: worked out by hand in the test docstring below
    sim = simulate(build("1f1b", stages=2, micro_batches=2), forward=1, backward=2, comm=0.5)
    ev = sim.events.set_index(["device", "kind", "micro_batch"])
    assert ev.loc[(1, "F", 0), "start_ms"] == 1.5
    assert ev.loc[(1, "F", 1), "start_ms"] == 4.5
    assert ev.loc[(0, "B", 0), "start_ms"] == 5.0
    assert ev.loc[(0, "B", 1), "start_ms"] == 8.0
    assert sim.step_time == 10.0


def test_per_stage_costs_1f1b_bottleneck():
    # the slowest stage sets the steady-state pace: step = sum of others' F+B fill + m·slowest
    f = [1.0, 1.0, 3.0, 1.0]
    b = [2.0, 2.0, 6.0, 2.0]
    sim = simulate(build("1f1b", stages=4, micro_batches=8), forward=f, backward=b)
    assert_dependencies_hold(sim)
    assert sim.step_time >= 8 * 9.0
    busy = sim.summary["busy_ms"].tolist()
    assert busy == [24.0, 24.0, 72.0, 24.0]


def test_cost_validation():
    program = build("1f1b", stages=4, micro_batches=8)
    with pytest.raises(ValueError, match="forward: expected a number or 4 values"):
        simulate(program, forward=[1, 2], backward=2)
    with pytest.raises(ValueError, match="backward: expected finite values >= 0"):
        simulate(program, forward=1, backward=-2)
    with pytest.raises(ValueError, match="comm"):
        simulate(program, forward=1, backward=2, comm=-1)
    with pytest.raises(ValueError, match="overlap"):
        simulate(program, forward=1, backward=2, overlap="min")


# ------------------------------------------------------------------ memory
def test_memory_peak_equals_order_based_bound():
    program = build("interleaved", stages=4, micro_batches=10, chunks=2)
    rng = np.random.default_rng(0)
    act = rng.uniform(10, 100, program.num_virtual_stages)
    params = rng.uniform(100, 200, program.num_virtual_stages)
    sim = simulate(program, forward=rng.uniform(1, 2, 8), backward=rng.uniform(2, 4, 8), activation=act,
                   params=params, constant=7)
    for d, pts in enumerate(program.live_points()):
        stages_d = program.device_stages[d]
        static = params[list(stages_d)].sum() + 7
        assert sim.peak_memory[d] == pytest.approx(static + (pts @ act[list(stages_d)]).max())
    mem = sim.memory
    # steps start and end at the static memory; never below it
    for d, frame in mem.groupby("device"):
        static = params[list(program.device_stages[d])].sum() + 7
        assert frame["memory_mb"].iloc[0] == pytest.approx(static)
        assert frame["memory_mb"].iloc[-1] == pytest.approx(static)
        assert frame["memory_mb"].min() >= static - 1e-9
        assert frame["time_ms"].is_monotonic_increasing


def test_memory_steps_hand_case():
    sim = simulate(build("1f1b", stages=2, micro_batches=2), forward=1, backward=2, activation=10, params=100)
    d0 = sim.memory[sim.memory.device == 0]
    # device 0: F0 0-1, F1 1-2, B0 4-6 (after B0 on device 1, 2-4), B1 7-9 (after B1 5-7)
    assert d0["time_ms"].tolist() == [0, 0, 1, 6, 9]
    assert d0["memory_mb"].tolist() == [100, 110, 120, 110, 100]
    assert sim.peak_memory.tolist() == [120, 110]


def test_summary_columns_and_bubble_consistency():
    sim = simulate(build("1f1b", stages=4, micro_batches=8), forward=1, backward=2)
    assert list(sim.summary.columns) == [
        "device", "busy_ms", "idle_ms", "bubble_of_step", "static_mb", "peak_mb", "peak_live"
    ]
    assert sim.summary["idle_ms"].sum() == pytest.approx(sim.bubble.idle)
    assert str(sim.events["kind"].dtype) == "category"


# ------------------------------------------------------------------ validation
def test_deadlock_is_found_and_named():
    with pytest.raises(DeadlockError) as info:
        make_program(
            "broken", stages=2, micro_batches=1, chunks=1, splits=1, placement=[0, 1],
            device_units=[[Op("B", 0, 0), Op("F", 0, 0)], [Op("F", 0, 1), Op("B", 0, 1)]],
        )
    assert "device 0 is at B0@0" in str(info.value)
    assert Op("B", 0, 0) in info.value.cycle


def test_missing_and_duplicate_ops_are_reported():
    with pytest.raises(ScheduleError, match="no B or I op for micro-batch 1, virtual stage 0"):
        make_program(
            "short", stages=1, micro_batches=2, chunks=1, splits=1, placement=[0],
            device_units=[[Op("F", 0, 0), Op("F", 1, 0), Op("B", 0, 0)]],
        )
    with pytest.raises(ScheduleError, match="appears more than once"):
        make_program(
            "dup", stages=1, micro_batches=1, chunks=1, splits=1, placement=[0],
            device_units=[[Op("F", 0, 0), Op("F", 0, 0), Op("B", 0, 0)]],
        )
    with pytest.raises(ScheduleError, match="placed on another device"):
        make_program(
            "wrong", stages=2, micro_batches=1, chunks=1, splits=1, placement=[0, 1],
            device_units=[[Op("F", 0, 0), Op("F", 0, 1), Op("B", 0, 1), Op("B", 0, 0)], []],
        )


def test_build_argument_errors():
    with pytest.raises(ScheduleError, match="1f1b: chunks = 2: this schedule needs chunks = 1"):
        build("1f1b", stages=4, micro_batches=8, chunks=2)
    with pytest.raises(ScheduleError, match="interleaved: micro_batches = 3 with stages = 4: needs m >= p"):
        build("interleaved", stages=4, micro_batches=3, chunks=2)
    with pytest.raises(ScheduleError, match="unknown schedule 'zb-h9'; available: gpipe"):
        build("zb-h9", stages=4, micro_batches=8)
    with pytest.raises(ScheduleError, match="stages = 0"):
        build("1f1b", stages=0, micro_batches=8)
    with pytest.raises(ScheduleError, match="splits = 2"):
        build("1f1b", stages=2, micro_batches=8, splits=2)


def test_registry_lists_core_schedules():
    for name in ["gpipe", "1f1b", "interleaved", "interleaved-lm", "seq1f1b"]:
        assert name in names()


def test_registering_a_taken_name_is_a_schedule_error():
    from sapptk.schedules.registry import get, register

    before = get("1f1b")
    with pytest.raises(ScheduleError, match="register: schedule '1f1b' is already registered: expected a new name"):
        register(before)
    assert get("1f1b") is before  # the registry is unchanged


def test_an_unknown_grouping_rule_is_a_schedule_error():
    with pytest.raises(ScheduleError, match="grouping rule 'odd': expected one of"):
        micro_batch_groups(4, 8, "odd")


# ------------------------------------------------------------------ arrays and Op lists
VECTORISED = ("gpipe", "1f1b", "seq1f1b", "interleaved", "interleaved-lm")


def array_grid(fast: bool):
    """(name, p, m, v, k) for the array-built schedules; m from p (or 1) up, multiples of p or not."""
    ps = (1, 2, 3, 4) if fast else range(1, 9)
    for name in VECTORISED:
        chunks = (1, 2, 3) if name.startswith("interleaved") else (1,)
        splits = (1, 2, 3) if name == "seq1f1b" else (1,)
        for p in ps:
            low = p if name.startswith("interleaved") else 1
            for m in sorted({low, low + 1, 2 * p - 1 if 2 * p - 1 >= low else low, 2 * p + 1, 3 * p}):
                for v in chunks if fast or p > 1 else (1,):
                    for k in splits:
                        yield name, p, m, v, k


def assert_same_program(a, b) -> None:
    """Op by op, unit by unit, and in every derived array."""
    assert a.units == b.units
    assert (a.name, a.stages, a.micro_batches, a.chunks, a.splits, a.placement) == (
        b.name, b.stages, b.micro_batches, b.chunks, b.splits, b.placement)
    for field in ("unit_ptr", "unit_op_ptr", "kind", "micro_batch", "virtual_stage", "slice"):
        assert np.array_equal(getattr(a.arrays, field), getattr(b.arrays, field)), field
    for field in ("op_deps", "unit_preds", "unit_cross", "level", "level_ptr", "level_units"):
        assert np.array_equal(getattr(a.graph, field), getattr(b.graph, field)), field


@pytest.mark.parametrize(("name", "p", "m", "v", "k"), list(array_grid(fast=True)))
def test_array_built_programs_equal_op_lists(name, p, m, v, k):
    assert_same_program(build(name, stages=p, micro_batches=m, chunks=v, splits=k), reference_program(name, p, m, v, k))


@pytest.mark.slow
def test_array_built_programs_equal_op_lists_wide_grid():
    for name, p, m, v, k in array_grid(fast=False):
        assert_same_program(build(name, stages=p, micro_batches=m, chunks=v, splits=k),
                            reference_program(name, p, m, v, k))


def test_units_are_a_view_built_on_first_use():
    program = build("interleaved", stages=4, micro_batches=8, chunks=2)
    assert "units" not in program.__dict__  # array-built: no Op objects until asked
    assert program.device_ops(1) == [op for unit in program.units[1] for op in unit]
    assert program.num_ops == sum(len(u) for dev in program.units for u in dev) == 4 * 8 * 2 * 2
    assert not program.arrays.kind.flags.writeable  # a program's arrays cannot be changed


def test_program_from_arrays_flat_overlapped_and_letters():
    # 1F1B on 2 devices, device 0 running its steady F1/B0 as one overlapped unit
    program = program_from_arrays(
        "mixed", stages=2, micro_batches=2, chunks=1, splits=1, placement=[0, 1],
        kind=list("FFBBFBFB"), micro_batch=[0, 1, 0, 1, 0, 0, 1, 1],
        virtual_stage=[0, 0, 0, 0, 1, 1, 1, 1], unit=[0, 1, 1, 2, 0, 1, 2, 3], ops_per_device=[4, 4],
    )
    assert program.describe() == "device 0: F0@0 F1@0+B0@0 B1@0\ndevice 1: F0@1 B0@1 F1@1 B1@1"
    same = make_program(
        "mixed", stages=2, micro_batches=2, chunks=1, splits=1, placement=[0, 1],
        device_units=[[Op("F", 0, 0), (Op("F", 1, 0), Op("B", 0, 0)), Op("B", 1, 0)],
                      [Op("F", 0, 1), Op("B", 0, 1), Op("F", 1, 1), Op("B", 1, 1)]],
    )
    assert_same_program(program, same)


def _arrays(name="x", stages=1, micro_batches=1, placement=(0,), **fields):
    base = dict(kind=[["F", "B"]], micro_batch=[[0, 0]], virtual_stage=[[0, 0]])
    base.update(fields)
    return program_from_arrays(name, stages=stages, micro_batches=micro_batches, chunks=1, splits=1,
                               placement=placement, **base)


def test_program_from_arrays_refuses_bad_arrays():
    with pytest.raises(ScheduleError, match="unknown op kind 'X'"):
        _arrays(kind=[["F", "X"]])
    with pytest.raises(ScheduleError, match="unknown op kind code 7"):
        _arrays(kind=[[0, 7]])
    with pytest.raises(ScheduleError, match="micro_batch has shape"):
        _arrays(micro_batch=[[0, 0, 0]])
    with pytest.raises(ScheduleError, match="must hold integers"):
        _arrays(micro_batch=[[0.5, 0]])
    with pytest.raises(ScheduleError, match=r"expected shape \(stages=2"):
        _arrays(stages=2, placement=(0, 1))
    with pytest.raises(ScheduleError, match="ops_per_device"):
        program_from_arrays("x", stages=1, micro_batches=1, chunks=1, splits=1, placement=[0], kind=["F", "B"],
                            micro_batch=[0, 0], virtual_stage=[0, 0], ops_per_device=[3, 1])


# Every check of the compile, reached both ways: Op lists and arrays.
BAD_PROGRAMS = [
    ("micro-batch outside 0..0", [[Op("F", 1, 0), Op("B", 0, 0)]]),
    ("virtual stage outside 0..0", [[Op("F", 0, 0), Op("B", 0, 3)]]),
    ("slice outside 0..0", [[Op("F", 0, 0, 1), Op("B", 0, 0)]]),
    ("appears more than once", [[Op("F", 0, 0), Op("F", 0, 0), Op("B", 0, 0)]]),
    ("has both B and I", [[Op("F", 0, 0), Op("B", 0, 0), Op("I", 0, 0), Op("W", 0, 0)]]),
    ("no F op for micro-batch 0, virtual stage 0", [[Op("B", 0, 0)]]),
    ("no B or I op for micro-batch 0, virtual stage 0", [[Op("F", 0, 0)]]),
    ("an I op needs exactly one W op", [[Op("F", 0, 0), Op("I", 0, 0)]]),
    ("an I op needs exactly one W op", [[Op("F", 0, 0), Op("B", 0, 0), Op("W", 0, 0)]]),
    ("overlapped with an op it depends on", [[(Op("F", 0, 0), Op("B", 0, 0))]]),
    ("device 0 is at B0@0, which needs F0@0", [[Op("B", 0, 0), Op("F", 0, 0)]]),
]


def _as_arrays(device_units):
    ops = [op for dev in device_units for u in dev for op in (u if isinstance(u, tuple) and not isinstance(u, Op)
                                                                 else (u,))]
    units = [i for dev in device_units for i, u in enumerate(dev)
             for _ in (u if isinstance(u, tuple) and not isinstance(u, Op) else (u,))]
    return dict(kind=[op.kind for op in ops], micro_batch=[op.micro_batch for op in ops],
                virtual_stage=[op.virtual_stage for op in ops], slice=[op.slice for op in ops], unit=units,
                ops_per_device=[sum(len(u) if isinstance(u, tuple) and not isinstance(u, Op) else 1 for u in dev)
                                for dev in device_units])


@pytest.mark.parametrize(("needle", "device_units"), BAD_PROGRAMS)
def test_every_compile_error_both_ways(needle, device_units):
    args = dict(stages=1, micro_batches=1, chunks=1, splits=1, placement=[0])
    with pytest.raises(ScheduleError, match=needle):
        make_program("bad", device_units=device_units, **args)
    with pytest.raises(ScheduleError, match=needle):
        program_from_arrays("bad", **args, **_as_arrays(device_units))


def test_deadlock_across_devices_names_the_cycle():
    # device 0 runs F0@0, then B0@0 needs B0@1; device 1 starts with F1@1, which needs F1@0,
    # queued on device 0 behind B0@0: each waits for the other
    device_units = [[Op("F", 0, 0), Op("B", 0, 0), Op("F", 1, 0), Op("B", 1, 0)],
                    [Op("F", 1, 1), Op("F", 0, 1), Op("B", 0, 1), Op("B", 1, 1)]]
    args = dict(stages=2, micro_batches=2, chunks=1, splits=1, placement=[0, 1])
    expected = ("cross: the op order deadlocks (p=2, m=2, v=1, k=1): device 0 is at B0@0, which needs B0@1 "
                "(device 1, not yet run); device 1 is at F1@1, which needs F1@0 (device 0, not yet run)")
    for make in (lambda: make_program("cross", device_units=device_units, **args),
                 lambda: program_from_arrays("cross", **args, **_as_arrays(device_units))):
        with pytest.raises(DeadlockError) as info:
            make()
        assert str(info.value) == expected
        assert info.value.cycle == (Op("B", 0, 0), Op("F", 1, 1))


def test_device_count_and_placement_errors():
    with pytest.raises(ScheduleError, match="1 device op lists for 2 stages"):
        make_program("x", stages=2, micro_batches=1, chunks=1, splits=1, placement=[0, 1],
                     device_units=[[Op("F", 0, 0)]])
    with pytest.raises(ScheduleError, match="placement"):
        make_program("x", stages=1, micro_batches=1, chunks=1, splits=1, placement=[1],
                     device_units=[[Op("F", 0, 0), Op("B", 0, 0)]])
    with pytest.raises(ScheduleError, match="an empty unit"):
        make_program("x", stages=1, micro_batches=1, chunks=1, splits=1, placement=[0],
                     device_units=[[Op("F", 0, 0), (), Op("B", 0, 0)]])


# ------------------------------------------------------------------ docs/conventions.md
def test_conventions_page_worked_examples():
    """Every number worked by hand in docs/conventions.md."""
    def times(sim, device):
        ev = sim.events[sim.events.device == device]
        return [(f"{k}{mb}" + (f"/{s}" if sim.program.splits > 1 else ""), a, b) for k, mb, s, a, b in zip(
            ev.kind.astype(str), ev.micro_batch, ev["slice"], ev.start_ms, ev.end_ms, strict=True)]

    one = build("1f1b", stages=2, micro_batches=2)
    sim = simulate(one, forward=1, backward=2)
    assert times(sim, 0) == [("F0", 0, 1), ("F1", 1, 2), ("B0", 4, 6), ("B1", 7, 9)]
    assert times(sim, 1) == [("F0", 1, 2), ("B0", 2, 4), ("F1", 4, 5), ("B1", 5, 7)]
    assert (sim.step_time, sim.bubble.of_compute, sim.bubble.of_step) == (9, 0.5, 6 / 18)
    sim = simulate(one, forward=1, backward=2, comm=0.5)
    assert times(sim, 1) == [("F0", 1.5, 2.5), ("B0", 2.5, 4.5), ("F1", 4.5, 5.5), ("B1", 5.5, 7.5)]
    assert times(sim, 0)[2:] == [("B0", 5, 7), ("B1", 8, 10)] and sim.step_time == 10
    sim = simulate(one, forward=1, backward=2, activation=10, params=100)
    d0 = sim.memory[sim.memory.device == 0]
    assert list(zip(d0.time_ms, d0.memory_mb, strict=True)) == [(0, 100), (0, 110), (1, 120), (6, 110), (9, 100)]
    assert sim.peak_memory.tolist() == [120, 110]

    assert simulate(build("interleaved", stages=2, micro_batches=4, chunks=2), forward=1, backward=2).step_time == 27

    sim = simulate(build("seq1f1b", stages=2, micro_batches=2, splits=2), forward=1, backward=2, activation=10)
    assert times(sim, 0)[:3] == [("F0/0", 0, 0.5), ("F0/1", 0.5, 1), ("F1/0", 1, 1.5)]
    assert times(sim, 1)[:3] == [("F0/0", 0.5, 1), ("F0/1", 1, 1.5), ("B0/1", 1.5, 2.5)]
    assert times(sim, 0)[3] == ("B0/1", 2.5, 3.5)
    assert sim.step_time == 7.5 and sim.summary.peak_live[0] == 1.5 and sim.peak_memory[0] == 15

    sim = simulate(build("zb-h1", stages=2, micro_batches=2), forward=1, backward=1, weight=1, activation=10,
                   params=100)
    assert times(sim, 0) == [("F0", 0, 1), ("F1", 1, 2), ("I0", 3, 4), ("W0", 4, 5), ("I1", 5, 6), ("W1", 6, 7)]
    assert times(sim, 1) == [("F0", 1, 2), ("I0", 2, 3), ("F1", 3, 4), ("I1", 4, 5), ("W0", 5, 6), ("W1", 6, 7)]
    d1 = sim.memory[sim.memory.device == 1]
    assert list(zip(d1.time_ms, d1.memory_mb, strict=True)) == [
        (0, 100), (1, 110), (3, 105), (3, 115), (5, 110), (6, 105), (7, 100)]
    assert sim.peak_memory.tolist() == [120, 115] and sim.summary.peak_live.tolist() == [2, 1.5]
