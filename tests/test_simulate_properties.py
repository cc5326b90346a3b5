"""Property tests: whatever the per-stage costs, the simulation respects the program."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import reference_run, reference_through

from sapptk.errors import ScheduleError
from sapptk.schedules import Op, build, get, names, timing
from sapptk.schedules.timing import critical_path, longest_path
from sapptk.simulation import simulate


@st.composite
def programs(draw):
    name = draw(st.sampled_from(names()))
    spec = get(name)
    p = draw(st.integers(2, 5))
    v = draw(st.sampled_from(spec.chunks)) if spec.chunks is not None else draw(st.integers(1, 3))
    k = draw(st.integers(1, 3)) if spec.splits else 1
    m = draw(st.integers(spec.min_micro_batches(p, v), spec.min_micro_batches(p, v) + 2 * p))
    try:
        return build(name, stages=p, micro_batches=m, chunks=v, splits=k)
    except ScheduleError as exc:  # pragma: no cover - a builder refusing valid args is a bug
        raise AssertionError(f"{name} refused p={p} m={m} v={v} k={k}: {exc}") from exc


@pytest.mark.slow
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(programs(), st.data())
def test_events_respect_dependencies_and_devices(program, data):
    n = program.num_virtual_stages
    costs = st.lists(st.floats(0.0, 10.0, allow_nan=False), min_size=n, max_size=n)
    forward = np.array(data.draw(costs))
    backward = np.array(data.draw(costs))
    weight = np.array(data.draw(costs))
    activation = np.array(data.draw(costs))
    comm = data.draw(st.floats(0.0, 3.0))
    overlap = data.draw(st.sampled_from(["sum", "max"]))
    sim = simulate(program, forward=forward, backward=backward, weight=weight, activation=activation, comm=comm,
                   overlap=overlap)
    g = program.graph
    ev = sim.events
    start = ev["start_ms"].to_numpy()
    end = ev["end_ms"].to_numpy()
    device = ev["device"].to_numpy()
    tol = 1e-9 * (1 + sim.step_time)
    # every op starts after each op it depends on ends (+ comm across devices)
    for c in range(2):
        dep = g.op_deps[:, c]
        has = dep >= 0
        lag = np.where(device[has] != device[dep[has]], comm, 0.0)
        assert np.all(start[has] >= end[dep[has]] + lag - tol)
    # nothing overlaps on a device except ops of one unit
    units = ev.drop_duplicates("unit").sort_values(["device", "start_ms", "unit"])
    for _, frame in units.groupby("device"):
        s = frame["start_ms"].to_numpy()
        e = frame["end_ms"].to_numpy()
        assert np.all(s[1:] >= e[:-1] - tol)
    assert np.all(end >= start)
    assert sim.step_time == np.max(end, initial=0.0)
    # memory never drops below the static part and ends there
    for _, frame in sim.memory.groupby("device"):
        assert frame["memory_mb"].min() >= frame["memory_mb"].iloc[0] - 1e-6
        assert abs(frame["memory_mb"].iloc[-1] - frame["memory_mb"].iloc[0]) < 1e-6


@settings(max_examples=60, deadline=None)
@given(programs())
def test_busy_time_is_the_sum_of_op_costs(program):
    sim = simulate(program, forward=1.0, backward=2.0, weight=0.5)
    # with overlap="sum" every device is busy for exactly its ops' durations
    n_f = program.ops.groupby("device")["kind"].apply(lambda k: (k == "F").sum()).to_numpy()
    expected = n_f * (1.0 + 2.0 + 0.5) / program.splits  # one backward (B, or I + W) per forward
    assert np.allclose(sim.summary["busy_ms"].to_numpy(), expected)


# ----------------------------------------------------------- against the plain-Python oracle
def oracle_grid(fast: bool):
    """(name, p, m, v, k) over every registered schedule; m at the schedule's minimum and above."""
    for name in names():
        spec = get(name)
        chunk_options = spec.chunks if spec.chunks is not None else ((1, 2) if fast else (1, 2, 3))
        for p in (2, 3) if fast else (2, 3, 4, 5):
            for v in chunk_options:
                low = max(spec.min_micro_batches(p, v), 1)
                for m in (low, low + 1) if fast else (low, low + 1, low + p - 1, 2 * low + 1):
                    for k in ((1, 2) if spec.splits else (1,)):
                        yield name, p, m, v, k


def check_against_oracle(program, rng) -> None:
    n = program.num_virtual_stages
    costs = dict(forward=rng.uniform(0.1, 3, n), backward=rng.uniform(0.1, 3, n), weight=rng.uniform(0, 2, n),
                 activation=rng.uniform(1, 50, n), params=rng.uniform(0, 100, n))
    comm = float(rng.choice([0.0, rng.uniform(0, 1)]))
    constant = float(rng.uniform(0, 10))
    weight_holds = float(rng.choice([0.0, 0.5, rng.uniform()]))
    for overlap in ("sum", "max"):
        sim = simulate(program, **costs, comm=comm, constant=constant, weight_holds=weight_holds, overlap=overlap)
        ref = reference_run(program, **costs, comm=comm, constant=constant, weight_holds=weight_holds,
                            overlap=overlap)
        assert sim.step_time == pytest.approx(ref["step_time"], rel=1e-12, abs=1e-12)
        ev = sim.events
        ops = [Op(k, mb, vs, sl) for k, mb, vs, sl in zip(ev["kind"].astype(str), ev["micro_batch"],
                                                           ev["virtual_stage"], ev["slice"], strict=True)]
        assert np.allclose(ev["end_ms"].to_numpy(), [ref["op_end"][op] for op in ops], rtol=1e-12, atol=1e-12)
        assert np.allclose(sim.peak_memory.to_numpy(), ref["peak_mb"], rtol=1e-12, atol=1e-9)
        assert np.allclose(sim.summary["peak_live"].to_numpy(), ref["peak_live"], atol=1e-12)
        # the memory steps reach exactly the peaks the order-based live points predict
        for d, pts in enumerate(program.live_points(weight_holds)):
            stages = list(program.device_stages[d])
            bound = sim.costs["params"][stages].sum() + constant + (pts @ sim.costs["activation"][stages]).max()
            assert sim.peak_memory[d] == pytest.approx(bound, rel=1e-9)  # live points are rounded to 1e-9


@pytest.mark.parametrize(("name", "p", "m", "v", "k"), list(oracle_grid(fast=True)))
def test_simulation_equals_the_plain_python_oracle(name, p, m, v, k, rng):
    check_against_oracle(build(name, stages=p, micro_batches=m, chunks=v, splits=k), rng)


@pytest.mark.slow
def test_simulation_equals_the_plain_python_oracle_wide_grid(rng):
    for name, p, m, v, k in oracle_grid(fast=False):
        check_against_oracle(build(name, stages=p, micro_batches=m, chunks=v, splits=k), rng)


def test_longest_path_kernel_batched_integer_and_reverse(rng):
    """One kernel, every use: float and integer durations, a batch equals its columns, the
    arg-max path is a real path of that length, and forwards + backwards = through lengths."""
    program = build("dualpipe-v", stages=3, micro_batches=7, chunks=2)  # overlapped units too
    g = program.graph
    ref_preds = reference_run(program, forward=1.0, backward=1.0)["preds"]
    batch = rng.integers(0, 20, (g.n_units, 4))
    ends, cols = longest_path(g, batch, 3, argmax=True)
    assert ends.dtype == np.int64
    for b in range(batch.shape[1]):
        single, _ = longest_path(g, batch[:, b], 3)
        assert np.array_equal(single, ends[:, b])
        floats, _ = longest_path(g, batch[:, b].astype(float), 3.0)
        assert np.array_equal(floats, single.astype(float))
        last = int(ends[:, b].argmax())
        units, crossings = critical_path(g, cols[:, b], last)
        assert batch[units, b].sum() + 3 * crossings == ends[last, b]
        assert all(units[i] in [q for q, _ in ref_preds[units[i + 1]]] for i in range(len(units) - 1))
        after, _ = longest_path(g, batch[:, b], 3, reverse=True)
        through = reference_through(ref_preds, batch[:, b].tolist(), 3)
        assert (single + after - batch[:, b]).tolist() == through


@pytest.mark.parametrize("name", ["interleaved", "dualpipe-v", "zb-v", "seq1f1b"])
def test_grid_and_level_sweep_agree(name, rng, monkeypatch):
    """The forward pass has two walks (the level × device grid, and the level sweep used when
    the grid is too sparse): forced onto the sweep, it gives the same ends and columns."""
    spec = get(name)
    v = 2 if spec.chunks is None else spec.chunks[0]
    program = build(name, stages=3, micro_batches=spec.min_micro_batches(3, v) + 1, chunks=v,
                    splits=2 if spec.splits else 1)
    g = program.graph
    batch = rng.integers(0, 30, (g.n_units, 3))
    on_grid = longest_path(g, batch, 4, argmax=True)
    floats = longest_path(g, batch[:, 0] * 0.5, 0.25)
    monkeypatch.setattr(timing, "_GRID_SLACK", 0)
    on_sweep = longest_path(g, batch, 4, argmax=True)
    assert np.array_equal(on_grid[0], on_sweep[0]) and np.array_equal(on_grid[1], on_sweep[1])
    assert np.array_equal(floats[0], longest_path(g, batch[:, 0] * 0.5, 0.25)[0])
