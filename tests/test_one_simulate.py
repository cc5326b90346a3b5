"""One simulator: ``sapptk.simulate`` runs what a plan may carry (offload, recompute per micro-batch,
sequence slices), and a plan's simulation is that run on its own costs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from offload_reference import reference_stream_times
from support import setups

import sapptk
from sapptk.costs import (
    AlternativeLayout,
    micro_batch_costs,
    offloaded_mb,
    slice_costs,
    stage_costs,
)
from sapptk.errors import SapptkError
from sapptk.plan import make_plan
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile
from sapptk.schedules import copy_stream
from sapptk.simulation import OffloadSimulation, Simulation, op_durations, unit_durations

FRAMES = ("events", "memory", "summary")


def _same_run(a: Simulation, b: Simulation) -> None:
    assert type(a) is type(b) and a.step_time == b.step_time
    for name in FRAMES:
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    pd.testing.assert_series_equal(a.peak_memory, b.peak_memory, check_exact=True)
    if isinstance(a, OffloadSimulation):
        pd.testing.assert_frame_equal(a.transfers, b.transfers, check_exact=True)


# ------------------------------------------------------------------ the copy stream's kernel
@pytest.mark.parametrize("config", setups(), ids=lambda c: c.schedule)
@pytest.mark.parametrize("bandwidth", [0.3, 4.0, 1e9])
def test_copy_stream_on_the_kernel_equals_the_plain_pass(config, bandwidth, rng):
    """The longest path over units and transfers equals the unit-by-unit pass it replaced, exactly."""
    program = config.program()
    n = program.num_virtual_stages
    f, b, w = rng.uniform(1, 3, n), rng.uniform(2, 5, n), rng.uniform(0, 1, n)
    act = rng.uniform(1, 9, n)
    off = act * rng.uniform(0, 1, n) * (rng.uniform(size=n) < 0.8)
    comm = float(rng.choice([0.0, 0.0123]))
    pairs = copy_stream.pairs(program)
    stream = copy_stream.stream(pairs, off, bandwidth, program.splits)
    dur = unit_durations(program, op_durations(program, f, b, w))
    run = copy_stream.run(program, pairs, stream, dur, comm)
    expected = reference_stream_times(program, pairs, stream, dur, comm)
    for got, want, name in zip((run.start, run.end, run.c_start, run.c_end, run.wait), expected,
                               ("start", "end", "c_start", "c_end", "wait"), strict=True):
        np.testing.assert_array_equal(got, want, err_msg=name)
    sim = sapptk.simulate(program, forward=f, backward=b, weight=w, activation=act, offloaded=off,
                          host_bandwidth=bandwidth, comm=comm)
    assert sim.step_time == float(expected[1].max())
    assert sim.fetch_wait_ms == pytest.approx(float(expected[4].sum()))


# ------------------------------------------------------------------ a plan's run is sapptk.simulate's
def _offload_plan(llama):
    cfg = sapptk.PipelineConfig(stages=4, micro_batches=8, schedule="1f1b", recompute=(*MODES, "offload"),
                                host_bandwidth=10.0, memory_budget=60000)
    even = sapptk.even_split(llama, cfg, "none")
    offload = even.counts[:, 0, :].copy()
    offload[0, 3] = 0
    return make_plan(llama, cfg, even.counts, status="given", offload=offload)


def test_a_plan_with_offload_is_simulate_with_its_offloaded_mb(llama):
    plan = _offload_plan(llama)
    cfg = plan.config
    sim = plan.simulation
    assert isinstance(sim, OffloadSimulation) and sim.step_time == plan.step_time and not sim.transfers.empty
    direct = sapptk.simulate(cfg.program(), **stage_costs(llama, cfg, plan.counts).simulate_args(),
                             offloaded=offloaded_mb(llama, cfg, plan.offload), host_bandwidth=cfg.host_bandwidth,
                             memory_budget=cfg.memory_budget)
    _same_run(sim, direct)
    # and its times are the plain pass's
    program = cfg.program()
    costs = stage_costs(llama, cfg, plan.counts)
    pairs = copy_stream.pairs(program)
    stream = copy_stream.stream(pairs, offloaded_mb(llama, cfg, plan.offload), cfg.host_bandwidth, 1)
    dur = unit_durations(program, op_durations(program, costs.forward, costs.backward, costs.weight))
    start, end, *_ = reference_stream_times(program, pairs, stream, dur, costs.comm)
    np.testing.assert_array_equal(sim.events.sort_values("unit").drop_duplicates("unit").end_ms.to_numpy(), end)
    # options re-simulate the same layout; the cached run is the default one
    other = plan.simulate(weight_holds=0.2, overlap="max")
    assert isinstance(other, OffloadSimulation) and plan.simulation is sim
    assert other.costs["weight_holds"] == 0.2


def test_a_plan_with_an_alternative_layout_is_simulate_with_per_micro_batch_costs(demo):
    config = sapptk.PipelineConfig(stages=4, micro_batches=8, schedule="1f1b", memory_budget=1e6)
    base = sapptk.even_split(demo, config, "none")
    weak = sapptk.even_split(demo, config, "both").counts
    mask = np.zeros((config.num_virtual_stages, config.micro_batches), dtype=bool)
    mask[1, 2:5] = mask[3, ::2] = True
    plan = make_plan(demo, config, base.counts, status="given", alternative=AlternativeLayout(weak, mask))
    costs = micro_batch_costs(demo, config, base.counts, plan.alternative)
    assert np.ndim(costs.backward) == 2
    direct = sapptk.simulate(config.program(), **costs.simulate_args(), memory_budget=1e6)
    _same_run(plan.simulation, direct)
    assert plan.step_time == direct.step_time
    # micro-batch by micro-batch it is the per-stage run of the layout that micro-batch runs
    assert base.step_time <= plan.step_time <= sapptk.even_split(demo, config, "both").step_time


def test_a_sliced_plan_is_simulate_with_per_slice_costs():
    modes = {"none": ModeCost(2.0, 10.0), "full": ModeCost(3.0, 1.0)}
    body = LayerGroup("layer", "body", 16, 1.0, 100.0, modes, kv_mb_per_token=0.001, attention_share=0.5)
    profile = Profile("long", (LayerGroup("emb", "head", 1, 0.1, 50.0), body, LayerGroup("out", "tail", 1, 0.2, 60.0)),
                      seq_length=4096)
    config = sapptk.PipelineConfig(4, 8, 2, "seq-interleaved", splits=[1536, 1024, 896, 640], memory_budget=1e6)
    plan = sapptk.even_split(profile, config)
    costs = slice_costs(profile, config, plan.counts)
    assert np.ndim(costs.forward) == 3
    direct = sapptk.simulate(config.program(), **costs.simulate_args(), memory_budget=1e6)
    _same_run(plan.simulation, direct)
    assert plan.simulation.memory["kv_mb"].max() > 0


# ------------------------------------------------------------------ what the copy stream refuses
def test_the_copy_stream_takes_per_stage_costs_and_a_bandwidth():
    program = sapptk.schedules.build("1f1b", stages=2, micro_batches=2)
    with pytest.raises(SapptkError, match=r"host_bandwidth = None: expected the host link's MB per ms > 0 "
                                          r"\(activations are offloaded\)"):
        sapptk.simulate(program, forward=1, backward=2, activation=10, offloaded=5)
    per_mb = np.array([[2.0, 3.0], [2.0, 2.0]])
    with pytest.raises(SapptkError, match="backward: the copy stream of activation offload"):
        sapptk.simulate(program, forward=1, backward=per_mb, activation=10, offloaded=5, host_bandwidth=1)
    with pytest.raises(SapptkError, match="kv: the copy stream"):
        sapptk.simulate(program, forward=1, backward=2, activation=10, kv=1.0, host_bandwidth=1)
    plain = sapptk.simulate(program, forward=1, backward=2, activation=10, offloaded=0)
    assert type(plain) is Simulation  # nothing offloaded, no link: the plain run

