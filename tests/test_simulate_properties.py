"""Property tests: whatever the per-stage costs, the simulation respects the program."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapptk.errors import ScheduleError
from sapptk.schedules import build, get, names
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
