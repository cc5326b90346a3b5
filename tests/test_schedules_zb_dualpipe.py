"""DualPipeV, ZB-H1 and ZB-V (the greedy list schedule; PyTorch's ZB-V order is checked op by op in
test_conformance.py): structure, hand-worked orders, and the published formulas.

Units throughout: costs are per virtual stage per micro-batch; "B" in a formula is the
input-gradient time (``backward``), a full backward lasts B + W.
"""

from __future__ import annotations

from collections import Counter
from functools import cache

import numpy as np
import pytest

from sapptk import simulate
from sapptk.errors import ScheduleError
from sapptk.schedules import build, get
from sapptk.schedules.dualpipe import build_dualpipe_v, v_placement
from sapptk.schedules.program import Program
from sapptk.schedules.zerobubble import ZBV_WEIGHT_HOLDS, OpCosts, build_zb_h1, build_zb_v, build_zb_v_greedy

NAMES = ("dualpipe-v", "zb-h1", "zb-v", "zb-v-greedy")
CHUNKS = {"dualpipe-v": 2, "zb-h1": 1, "zb-v": 2, "zb-v-greedy": 2}


def grid(name: str, ps=range(2, 9)) -> list[tuple[int, int]]:
    """(p, m) from the schedule's minimum m to 4p, every m (multiples of p or not)."""
    spec = get(name)
    return [(p, m) for p in ps for m in range(spec.min_micro_batches(p, CHUNKS[name]), 4 * p + 1)]


@cache
def program(name: str, p: int, m: int) -> Program:
    return build(name, stages=p, micro_batches=m, chunks=CHUNKS[name])


@cache
def program_1f1b(p: int, m: int) -> Program:
    return build("1f1b", stages=p, micro_batches=m)


def ops_of(prog: Program, device: int) -> str:
    return prog.describe(device).split(": ", 1)[1]


# ------------------------------------------------------------------ registry
def test_registered_specs() -> None:
    dp, h1, zv, zg = (get(n) for n in NAMES)
    assert (dp.placement, dp.chunks, dp.split_backward, dp.min_micro_batches(4, 2)) == ("v", (2,), True, 8)
    assert (h1.placement, h1.chunks, h1.split_backward, h1.min_micro_batches(4, 1)) == ("line", (1,), True, 1)
    assert (zv.placement, zv.chunks, zv.split_backward, zv.min_micro_batches(4, 2)) == ("v", (2,), True, 4)
    assert (zg.placement, zg.chunks, zg.cost_driven, zg.min_micro_batches(4, 2)) == ("v", (2,), True, 4)
    assert not zv.cost_driven
    prog = build("dualpipe-v", stages=4, micro_batches=8, chunks=2)
    assert prog.placement == (0, 1, 2, 3, 3, 2, 1, 0) == tuple(v_placement(4))
    assert prog.device_stages[0] == (0, 7)  # head and tail on device 0


@pytest.mark.parametrize(
    ("name", "kwargs", "needle"),
    [
        ("dualpipe-v", dict(stages=4, micro_batches=8, chunks=3), "needs chunks = 2"),
        ("dualpipe-v", dict(stages=4, micro_batches=8, chunks=1), "needs chunks = 2"),
        ("dualpipe-v", dict(stages=4, micro_batches=7, chunks=2), "needs m >= 2p (at least 8)"),
        ("dualpipe-v", dict(stages=4, micro_batches=8, chunks=2, splits=2), "no sequence slices"),
        ("zb-v", dict(stages=4, micro_batches=3, chunks=2), "needs m >= p (at least 4)"),
        ("zb-v", dict(stages=4, micro_batches=8, chunks=1), "needs chunks = 2"),
        ("zb-h1", dict(stages=4, micro_batches=8, chunks=2), "needs chunks = 1"),
        ("zb-h1", dict(stages=0, micro_batches=8), "stages = 0"),
    ],
)
def test_invalid_arguments_name_the_constraint(name: str, kwargs: dict, needle: str) -> None:
    with pytest.raises(ScheduleError, match=name) as err:
        build(name, **kwargs)
    assert needle in str(err.value)


def test_builders_refuse_what_they_cannot_build_when_called_directly() -> None:
    with pytest.raises(ScheduleError, match="m >= 2p"):
        build_dualpipe_v(3, 5)
    with pytest.raises(ScheduleError, match="chunks = 2"):
        build_dualpipe_v(3, 6, chunks=3)
    with pytest.raises(ScheduleError, match="chunks = 2"):
        build_zb_v(3, 6, chunks=1)


# ----------------------------------------------------------------- structure
@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_every_op_once_and_events_respect_dependencies(name: str) -> None:
    rng = np.random.default_rng(7)
    for p, m in grid(name):
        prog = program(name, p, m)
        prog.validate()
        ops = prog.ops
        nvs = prog.num_virtual_stages
        assert nvs == CHUNKS[name] * p
        counts = Counter(zip(ops.kind.astype(str), ops.micro_batch, ops.virtual_stage, strict=True))
        for mb in range(m):
            for vs in range(nvs):
                assert counts[("F", mb, vs)] == 1
                full, split = counts[("B", mb, vs)], counts[("I", mb, vs)]
                assert (full, split, counts[("W", mb, vs)]) in {(1, 0, 0), (0, 1, 1)}
        assert max(counts.values()) == 1
        if name != "dualpipe-v":
            assert not (ops.kind == "B").any()  # every backward is split

        # random per-stage costs and a latency: every op starts after its data deps
        f, b, w = rng.uniform(0.5, 2.0, (3, nvs))
        comm = 0.25
        sim = simulate(prog, forward=f, backward=b, weight=w, comm=comm, overlap="max" if p % 2 else "sum")
        g = prog.graph
        start, end = sim.events.start_ms.to_numpy(), sim.events.end_ms.to_numpy()
        dev = g.unit_device[g.op_unit]
        for col in range(2):
            dep = g.op_deps[:, col]
            has = dep >= 0
            lag = np.where(dev[has] != dev[dep[has]], comm, 0.0)
            assert np.all(start[has] >= end[dep[has]] + lag - 1e-9)
        # units of a device run one after another, ops of a unit together
        ustart = np.full(g.n_units, np.nan)
        uend = np.full(g.n_units, np.nan)
        ustart[g.op_unit], uend[g.op_unit] = start, end
        assert np.allclose(start, ustart[g.op_unit]) and np.allclose(end, uend[g.op_unit])
        for d in range(p):
            s, e = ustart[g.unit_ptr[d] : g.unit_ptr[d + 1]], uend[g.unit_ptr[d] : g.unit_ptr[d + 1]]
            assert np.all(s[1:] >= e[:-1] - 1e-9)


@pytest.mark.parametrize("name", NAMES)
def test_weight_gradients_run_fifo_and_micro_batches_in_order(name: str) -> None:
    """W in I order (a FIFO: DualPipeV's WeightGradStore, the greedy's pending queue), per
    virtual stage for PyTorch's ZB-V (its cool-down runs chunk 1's deferred W before chunk 0's)."""
    for p, m in grid(name, ps=(2, 3, 5, 8) if name in ("dualpipe-v", "zb-h1") else (2, 3, 5)):
        prog = program(name, p, m)
        for d in range(p):
            ops = prog.device_ops(d)
            for vs in prog.device_stages[d] if name == "zb-v" else [None]:
                i_order = [(op.micro_batch, op.virtual_stage) for op in ops if op.kind == "I" and vs in (None, op[2])]
                w_order = [(op.micro_batch, op.virtual_stage) for op in ops if op.kind == "W" and vs in (None, op[2])]
                assert w_order == i_order
            for vs in prog.device_stages[d]:
                for kinds in ("F", "BI"):
                    mbs = [op.micro_batch for op in ops if op.kind in kinds and op.virtual_stage == vs]
                    assert mbs == list(range(m))


def test_dualpipe_v_overlapped_pairs() -> None:
    """Steps 4 and 5 overlap F of one phase with a full B of the other; nothing else pairs."""
    for p, m in grid("dualpipe-v"):
        prog = program("dualpipe-v", p, m)
        for r in range(p):
            pairs = [u for u in prog.units[r] if len(u) == 2]
            step4, step5 = m - 2 * p + r + 1, p - r - 1
            assert len(pairs) == 2 * step4 + step5 - (r == p - 1)
            assert all(len(u) <= 2 for u in prog.units[r])
            for fwd, bwd in pairs:
                assert (fwd.kind, bwd.kind) == ("F", "B") and fwd.virtual_stage != bwd.virtual_stage


# ---------------------------------------------------------- hand-worked orders
def test_dualpipe_v_p2_by_hand() -> None:
    # rank 0 holds vs 0 (phase 0) and vs 3 (phase 1); rank 1 holds vs 1 and vs 2. m = 4.
    prog = build_dualpipe_v(2, 4)
    assert ops_of(prog, 0) == (
        "F0@0 F1@0"  # 1 nF0: 2(p-r-1) = 2
        " F2@0 F0@3"  # 2 nF0F1: r+1 = 1
        " I0@3 W0@3 F1@3"  # 3 nB1W1F1: p-r-1 = 1, zero bubble (W pops the I just queued)
        " F3@0+B1@3 F2@3+B0@0"  # 4 nF0B1F1B0: m-2p+r+1 = 1
        " B2@3 F3@3+B1@0"  # 5 nB1F1B0: p-r-1 = 1
        " B3@3 I2@0"  # 6 nB1B0: r+1 = 1; r even: zero bubble from B0 of i = (r+1)//2 = 0
        " W2@0 I3@0"  # 7 nWB0: p-r-1 = 1
        " W3@0"  # 8 nW: r+1 = 1
    )
    assert ops_of(prog, 1) == (
        "F0@1 F0@2 F1@1 F1@2"  # 2 nF0F1: r+1 = 2 (steps 1 and 3 are empty on the last rank)
        " F2@1 B0@2 F2@2+B0@1"  # 4: m-2p+r+1 = 2; the last rank's first F0, B1 not overlapped
        " F3@1+B1@2 F3@2+B1@1"
        " B2@2 B2@1 I3@2 I3@1"  # 6: r+1 = 2; r odd: zero bubble from B1 of i = 1
        " W3@2 W3@1"  # 8: r+1 = 2
    )


def test_dualpipe_v_p4_device0_by_hand() -> None:
    prog = build_dualpipe_v(4, 8)
    assert ops_of(prog, 0) == (
        "F0@0 F1@0 F2@0 F3@0 F4@0 F5@0"  # 1: 2(p-1) = 6
        " F6@0 F0@7"  # 2: 1
        " I0@7 W0@7 F1@7 I1@7 W1@7 F2@7 I2@7 W2@7 F3@7"  # 3: 3
        " F7@0+B3@7 F4@7+B0@0"  # 4: m-2p+1 = 1
        " B4@7 F5@7+B1@0 B5@7 F6@7+B2@0 B6@7 F7@7+B3@0"  # 5: 3
        " B7@7 I4@0"  # 6: 1
        " W4@0 I5@0 W5@0 I6@0 W6@0 I7@0"  # 7: 3
        " W7@0"  # 8: 1
    )


def test_zb_h1_by_hand() -> None:
    prog = build_zb_h1(2, 3)
    # stage 0: 1 warm-up F, then F I W (W lags I by s = 0)
    assert ops_of(prog, 0) == "F0@0 F1@0 I0@0 W0@0 F2@0 I1@0 W1@0 I2@0 W2@0"
    # stage 1: no warm-up, W lags I by s = 1, the last W closes the step
    assert ops_of(prog, 1) == "F0@1 I0@1 F1@1 I1@1 W0@1 F2@1 I2@1 W1@1 W2@1"
    # p = 4, last stage: W starts after 3 backwards, 3 W left for the cool-down
    assert ops_of(build_zb_h1(4, 6), 3) == (
        "F0@3 I0@3 F1@3 I1@3 F2@3 I2@3 F3@3 I3@3 W0@3 F4@3 I4@3 W1@3 F5@3 I5@3 W2@3 W3@3 W4@3 W5@3"
    )


def test_zb_v_greedy_by_hand() -> None:
    """The list schedule traced step by step (unit time, cap 2p = 4 chunk activations).

    t=0 d0 F0@0 | t=1 d0 F1@0, d1 F0@1 | t=2 d0 idle (F0@3 waits for F0@2), d1 F0@2 (chunk 1
    first) | t=3 d0 F0@3, d1 F1@1 | t=4 d0 I0@3, d1 F1@2 | t=5 d0 F1@3, d1 I0@2 | t=6 d0 I1@3,
    d1 I0@1 | t=7 d0 I0@0, d1 I1@2 | t=8 d0 W0@3 (I1@0 waits for I1@1), d1 I1@1 | t=9 d0 I1@0,
    d1 W0@2 | then only W, oldest first. Step 13 = 6m + p - 1.
    """
    prog = build_zb_v_greedy(2, 2)
    assert ops_of(prog, 0) == "F0@0 F1@0 F0@3 I0@3 F1@3 I1@3 I0@0 W0@3 I1@0 W1@3 W0@0 W1@0"
    assert ops_of(prog, 1) == "F0@1 F0@2 F1@1 F1@2 I0@2 I0@1 I1@2 I1@1 W0@2 W0@1 W1@2 W1@1"
    assert simulate(prog, forward=1, backward=1, weight=1).step_time == 13
    # p = 4, m = 4, the tip of the V (vs 3 and vs 4): each chunk-1 F right after its chunk-0
    # F, backwards in V order (vs 4 then vs 3) once they come back, then the W, FIFO.
    assert ops_of(build_zb_v_greedy(4, 4), 3) == (
        "F0@3 F0@4 F1@3 F1@4 F2@3 F2@4 F3@3 F3@4"
        " I0@4 I0@3 I1@4 I1@3 I2@4 I2@3 I3@4 I3@3"
        " W0@4 W0@3 W1@4 W1@3 W2@4 W2@3 W3@4 W3@3"
    )


# ---------------------------------------------------------------- DualPipeV
DP_COSTS = [(1.0, 1.0, 1.0), (2.0, 2.0, 1.0), (1.5, 1.5, 0.5), (3.0, 3.0, 3.0), (2.0, 2.0, 0.0)]


@pytest.mark.slow
@pytest.mark.parametrize("overlap", ["sum", "max"])
def test_dualpipe_v_bubble_matches_deepseek(overlap: str) -> None:
    """Bubble (PP/2 − 1)(F&B + B_full − 3W), PP = 2p: DeepSeek's README table.

    Measured as the largest per-device idle time, ``max(step_time − busy)`` (uniform costs,
    no communication). Exact whenever F = B (input gradient) and W <= B, for any m >= 2p;
    F&B is the overlapped pair's duration: F + B + W with ``overlap="sum"`` (then every
    device idles the same), max(F, B + W) with ``overlap="max"``.
    """
    for p, m in grid("dualpipe-v"):
        if m not in (2 * p, 2 * p + 1, 3 * p + 1, 4 * p):
            continue
        prog = program("dualpipe-v", p, m)
        for f, b, w in DP_COSTS:
            sim = simulate(prog, forward=f, backward=b, weight=w, overlap=overlap)
            fb = f + b + w if overlap == "sum" else max(f, b + w)
            deepseek = (p - 1) * (fb + (b + w) - 3 * w)
            idle = sim.summary.idle_ms.to_numpy()
            assert idle.max() == pytest.approx(deepseek), (p, m, f, b, w)
            assert sim.step_time == pytest.approx(sim.summary.busy_ms.min() + deepseek)
            if overlap == "sum":
                assert np.allclose(idle, deepseek)


def test_dualpipe_v_bubble_reading_of_b_and_limits() -> None:
    """The README's B is the *full* backward: reading it as the input gradient is off.

    And outside F = B the table is an approximation (pinned values, p = 4, m = 8, sum).
    """
    prog = program("dualpipe-v", 4, 8)
    idle = simulate(prog, forward=1, backward=1, weight=1).summary.idle_ms.max()
    assert idle == 3 * (3 + 2 - 3)  # (PP/2 - 1)(F&B + B - 3W) with B the full backward, 2
    assert idle != 3 * (3 + 1 - 3)  # B = input gradient only
    assert simulate(prog, forward=1, backward=2, weight=1).summary.idle_ms.max() == 11  # formula: 3 * (4 + 3 - 3) = 12
    assert simulate(prog, forward=3, backward=2, weight=1).summary.idle_ms.max() == 21  # formula: 3 * (6 + 3 - 3) = 18


def test_dualpipe_v_memory() -> None:
    """Activations PP + 1 = 2p + 1 chunk activations on every device; parameters 2×.

    By hand, device 0: steps 1–2 leave 2(p − 1) + 2 = 2p forwards alive; in step 3 each I, W
    frees one before the next F; the first overlapped pair allocates its F at the unit's
    start and frees its B at the end: 2p + 1. Every rank reaches 2p after step 2, so all
    peak at 2p + 1, whatever part of the activation a W holds (the W of step 3 runs before
    the next F; later ones only free).
    """
    for p, m in grid("dualpipe-v"):
        prog = program("dualpipe-v", p, m)
        for wh in (0.0, 0.5, 1.0):
            assert np.array_equal(prog.peak_live(wh), np.full(p, 2 * p + 1.0))
    prog = program("dualpipe-v", 3, 7)
    sim = simulate(prog, forward=1, backward=1, weight=1, activation=1.0, params=1.0)
    assert np.array_equal(sim.summary.static_mb, np.full(3, 2.0))  # two virtual stages per device
    assert np.array_equal(sim.peak_memory, np.full(3, 2.0 + 7))


# -------------------------------------------------------------------- ZB-H1
ZB_COSTS = [(1.0, 1.0, 1.0), (2.0, 1.0, 1.0), (1.0, 2.0, 0.5), (1.5, 1.0, 1.0), (3.0, 2.0, 0.5), (1.0, 1.0, 0.0)]


@pytest.mark.slow
def test_zb_h1_step_time_matches_paper() -> None:
    """m(F + B + W) + (p − 1)(F + B − W): exact for uniform stages, no comm, m >= p, W <= min(F, B)."""
    for p, m in grid("zb-h1"):
        if m not in (p, p + 1, 2 * p + 1, 3 * p - 1, 4 * p):
            continue
        prog = program("zb-h1", p, m)
        for f, b, w in ZB_COSTS:
            sim = simulate(prog, forward=f, backward=b, weight=w)
            assert sim.step_time == pytest.approx(m * (f + b + w) + (p - 1) * (f + b - w)), (p, m, f, b, w)
        # F = B = W: one third of 1F1B's bubble (p − 1)(F + B + W)
        one_f_one_b = simulate(program_1f1b(p, m), forward=1, backward=1, weight=1).step_time - 3 * m
        assert simulate(prog, forward=1, backward=1, weight=1).step_time - 3 * m == pytest.approx(one_f_one_b / 3)


def test_zb_h1_formula_outside_its_conditions() -> None:
    prog = program("zb-h1", 4, 8)
    # W > F: the deferred W no longer fit the gaps; the formula under-counts
    assert simulate(prog, forward=1, backward=1, weight=2).step_time > 8 * 4 + 3 * (1 + 1 - 2)
    # m < p: fewer W than gaps
    small = program("zb-h1", 4, 2)
    assert simulate(small, forward=1, backward=1, weight=1).step_time > 2 * 3 + 3 * 1


def test_zb_h1_peak_in_flight() -> None:
    """peak_live(wh) on stage s = min(p − s, m) + wh · min(s, max(m − p + s, 0)).

    With wh = 0 (an I frees the whole activation) that is 1F1B's min(p − s, m); every
    W deferred by s micro-batches keeps wh of an activation, so for m >= p stage s holds
    p − s + wh·s: p − s/2 at the default 0.5 and p on every stage at wh = 1.
    """
    for p, m in grid("zb-h1"):
        prog = program("zb-h1", p, m)
        s = np.arange(p)
        assert np.array_equal(prog.peak_live(0.0), program_1f1b(p, m).peak_live())
        for wh in (0.0, 0.5, 1.0):
            expect = np.minimum(p - s, m) + wh * np.minimum(s, np.maximum(m - p + s, 0))
            assert np.allclose(prog.peak_live(wh), expect)


# --------------------------------------------------------------------- ZB-V
@pytest.mark.slow
def test_zb_v_greedy_bubble_is_the_pipeline_fill_only() -> None:
    """F = B = W = c, no comm, m >= p: step = 6mc + (p − 1)c, the least possible.

    Device p − 1 cannot start before the first forward has crossed p − 1 devices and has
    6mc of work, so (p − 1)c is a lower bound on the bubble; the order meets it on the
    whole grid: bubble of compute = (p − 1)/(6m).
    """
    for p, m in grid("zb-v-greedy"):
        prog = program("zb-v-greedy", p, m)
        for c in (1.0, 2.5) if m % 3 == 0 else (1.0,):
            sim = simulate(prog, forward=c, backward=c, weight=c)
            assert sim.step_time == pytest.approx(6 * m * c + (p - 1) * c), (p, m)
        assert sim.bubble.of_compute == pytest.approx((p - 1) / (6 * m))
        last = sim.events[sim.events.device == p - 1]  # no gap on device p − 1
        assert last.end_ms.max() - last.start_ms.min() == pytest.approx(6 * m * c)


def test_zb_v_greedy_memory_at_most_1f1b() -> None:
    """Peak live chunk activations <= 2p (1F1B's p micro-batches of two chunks), = 2p on the busiest device.

    Holds for any weight_holds <= ZBV_WEIGHT_HOLDS (the model the order was built with);
    a W that keeps the whole activation (wh = 1) lets the peak grow past 2p.
    """
    for p, m in grid("zb-v-greedy"):
        prog = program("zb-v-greedy", p, m)
        assert prog.peak_live(ZBV_WEIGHT_HOLDS).max() == 2 * p
        assert prog.peak_live(0.0).max() <= 2 * p
    p, m = 4, 9
    zbv = simulate(program("zb-v-greedy", p, m), forward=1, backward=1, weight=1, activation=1.0)
    onef = simulate(program_1f1b(p, m), forward=3, backward=3, weight=0, activation=2.0)  # a 1F1B stage = two V chunks
    assert zbv.peak_memory.max() <= onef.peak_memory.max() == 2 * p
    assert program("zb-v-greedy", p, m).peak_live(1.0).max() > 2 * p


def test_zb_v_greedy_follows_the_costs() -> None:
    """At the costs it was built for the greedy order is never slower than at unit costs, and
    with F = 1, I = 2, W = 1 it comes within 2 % of PyTorch's fixed ZB-V order (which is
    built for exactly that ratio family and keeps the same 2p peak)."""
    for p, m in ((4, 16), (8, 32), (3, 7)):
        costs = OpCosts.uniform(2 * p, forward=1, backward=2, weight=1)
        unit = build_zb_v_greedy(p, m)
        fitted = build("zb-v-greedy", stages=p, micro_batches=m, chunks=2, costs=costs)
        t_unit, t_fit = (simulate(x, forward=1, backward=2, weight=1).step_time for x in (unit, fitted))
        t_torch = simulate(build_zb_v(p, m), forward=1, backward=2, weight=1).step_time
        assert t_fit < t_unit
        assert t_fit <= 1.02 * t_torch
        assert fitted.peak_live().max() == 2 * p
    assert simulate(build_zb_v(4, 16), forward=1, backward=2, weight=1).step_time == 134
    assert simulate(build_zb_v_greedy(4, 16), forward=1, backward=2, weight=1).step_time == 175


def test_zb_v_greedy_with_comm_and_uneven_stages_is_valid_and_deterministic(rng) -> None:
    p, m = 3, 7
    costs = OpCosts(tuple(rng.uniform(0.5, 2, 2 * p)), tuple(rng.uniform(1, 3, 2 * p)),
                       tuple(rng.uniform(0, 1, 2 * p)), comm=0.25)
    a = build_zb_v_greedy(p, m, costs=costs)
    b = build_zb_v_greedy(p, m, costs=costs)
    assert a.units == b.units
    zero_w = OpCosts(costs.forward, costs.backward, (0.0,) * (2 * p))  # zero-length W ops
    assert build_zb_v_greedy(p, m, costs=zero_w).num_ops == 6 * p * m


@pytest.mark.parametrize(
    "costs",
    [OpCosts((1.0,) * 3, (1.0,) * 4, (1.0,) * 4), OpCosts((1.0,) * 4, (1.0,) * 4, (-1.0,) * 4),
     OpCosts((1.0,) * 4, (1.0,) * 4, (1.0,) * 4, comm=float("nan"))],
)
def test_zb_v_greedy_refuses_bad_costs(costs) -> None:
    with pytest.raises(ScheduleError, match="zb-v-greedy: costs"):
        build_zb_v_greedy(2, 4, costs=costs)
