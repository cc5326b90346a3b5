"""Activation offload: the copy-stream simulation (a case by hand, equality with the simulator
without offload, properties), offload in plans and files, the balancer's offload search, bad input."""

from __future__ import annotations

import pickle
import threading
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from support import setups, small_profile

import sapptk
from sapptk.balancer import with_offload
from sapptk.baselines import distinct_recomputes
from sapptk.costs import check_offload
from sapptk.errors import ConfigError, SapptkError
from sapptk.plan import load_plan, make_plan
from sapptk.profile import MODES
from sapptk.simulation import OffloadSimulation
from sapptk.solver.offload_search import offload_search

ALL = (*MODES, "offload")


# ------------------------------------------------------------------ the case worked by hand
def _one_f_one_b(bandwidth: float) -> OffloadSimulation:
    """1F1B, p = 2, m = 2: F 1 ms, B 2 ms, 10 MB per micro-batch, device 0 offloads all 10 MB."""
    program = sapptk.schedules.build("1f1b", stages=2, micro_batches=2)
    return sapptk.simulate(program, forward=1, backward=2, activation=10, offloaded=[10, 0],
                            host_bandwidth=bandwidth)


def test_hand_worked_one_f_one_b_with_late_fetches():
    # device 0 runs F0 F1 B0 B1, device 1 F0 B0 F1 B1. Without offload: D0 F0 [0,1] F1 [1,2];
    # D1 F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; D0 B0 [4,6] B1 [7,9]; step 9.
    # Copies on device 0 take 10 MB / 5 MB/ms = 2 ms. Stream order (issue points):
    #   offload 0 at F0's end (1), fetch 0 at the start of the op before B0 = F1 (1),
    #   offload 1 at F1's end (2), fetch 1 at the start of the op before B1 = B0.
    # offload 0 [1,3]; fetch 0 waits for it: [3,5]; offload 1 [5,7];
    # B0 is ready at 4 (D1's B0) but its fetch ends at 5: B0 [5,7] (1 ms late);
    # fetch 1 is issued at 5, the stream is busy until 7: [7,9]; B1 ready at 7, fetch at 9: [9,11].
    sim = _one_f_one_b(5.0)
    ev = sim.events
    d0 = ev[ev.device == 0]
    assert d0[["start_ms", "end_ms"]].to_numpy().tolist() == [[0, 1], [1, 2], [5, 7], [9, 11]]
    d1 = ev[ev.device == 1]
    assert d1[["start_ms", "end_ms"]].to_numpy().tolist() == [[1, 2], [2, 4], [4, 5], [5, 7]]
    assert sim.step_time == 11.0
    tr = sim.transfers
    assert tr.kind.astype(str).tolist() == ["offload", "fetch", "offload", "fetch"]
    assert tr.micro_batch.tolist() == [0, 0, 1, 1]
    assert tr[["issue_ms", "start_ms", "end_ms"]].to_numpy().tolist() == [[1, 1, 3], [1, 3, 5], [2, 5, 7], [5, 7, 9]]
    assert tr.wait_ms.tolist() == [0, 1, 0, 2]
    assert sim.fetch_wait_ms == 3.0
    assert repr(sim).endswith("host_bandwidth=5 MB/ms, transfers=4, fetch_wait=3 ms)")
    # memory on device 0: F0 allocates 10 at 0, F1 10 at 1; offload 0 frees 10 at 3, fetch 0 takes
    # it back at 3 (stream order); at 7: B0 frees 10, offload 1 frees 10, fetch 1 takes 10; B1 frees at 11
    m0 = sim.memory[sim.memory.device == 0][["time_ms", "memory_mb"]].to_numpy().tolist()
    assert m0 == [[0, 0], [0, 10], [1, 20], [3, 10], [3, 20], [7, 10], [7, 0], [7, 10], [11, 0]]
    m1 = sim.memory[sim.memory.device == 1][["time_ms", "memory_mb"]].to_numpy().tolist()
    assert m1 == [[0, 0], [1, 10], [4, 0], [4, 10], [7, 0]]
    assert sim.peak_memory.tolist() == [20, 10]


def test_hand_worked_fast_link_hides_the_copies():
    # at 10 MB/ms a copy takes 1 ms: offload 0 [1,2], fetch 0 [2,3], offload 1 [3,4], fetch 1 issued
    # at B0's start (4) [4,5]: every backward starts as without offload; step 9
    sim = _one_f_one_b(10.0)
    assert sim.step_time == 9.0
    tr = sim.transfers
    assert tr[["start_ms", "end_ms"]].to_numpy().tolist() == [[1, 2], [2, 3], [3, 4], [4, 5]]
    assert sim.fetch_wait_ms == 0.0
    m0 = sim.memory[sim.memory.device == 0][["time_ms", "memory_mb"]].to_numpy().tolist()
    assert m0 == [[0, 0], [0, 10], [1, 20], [2, 10], [2, 20], [4, 10], [4, 20], [6, 10], [9, 0]]


def test_last_stage_of_one_f_one_b_keeps_its_activations():
    # device 1's backward follows its forward directly: nothing to offload there
    program = sapptk.schedules.build("1f1b", stages=2, micro_batches=2)
    sim = sapptk.simulate(program, forward=1, backward=2, activation=10, offloaded=[0, 10], host_bandwidth=1)
    assert sim.transfers.empty and sim.step_time == 9.0


def test_offload_lowers_the_peak_when_copies_finish_in_time():
    # gpipe p = 2, m = 4: device 0 runs four forwards before any backward; 1 ms copies free each
    # activation before the next forward ends, so at most two are on the device at once
    program = sapptk.schedules.build("gpipe", stages=2, micro_batches=4)
    plain = sapptk.simulate(program, forward=2, backward=4, activation=10)
    sim = sapptk.simulate(program, forward=2, backward=4, activation=10, offloaded=[10, 10], host_bandwidth=10)
    assert plain.peak_memory.tolist() == [40, 40]
    assert sim.peak_memory[0] < plain.peak_memory[0]
    assert sim.step_time >= plain.step_time


# ------------------------------------------------------------------ equal to the simulator
@pytest.mark.parametrize("config", setups(), ids=lambda c: c.schedule)
def test_without_offload_equals_simulate(config, rng):
    program = config.program()
    n = program.num_virtual_stages
    kw = {"forward": rng.uniform(1, 3, n), "backward": rng.uniform(2, 5, n), "weight": rng.uniform(0, 1, n),
          "activation": rng.uniform(1, 9, n), "params": rng.uniform(0, 3, n), "comm": 0.0123, "constant": 1.5}
    plain = sapptk.simulate(program, **kw)
    for bandwidth in (3.0, 0.01):  # a copy stream without offloaded MB changes nothing
        sim = sapptk.simulate(program, **kw, host_bandwidth=bandwidth)
        assert isinstance(sim, OffloadSimulation)
        assert sim.step_time == plain.step_time
        for name in ("events", "memory", "summary"):
            pd.testing.assert_frame_equal(getattr(sim, name), getattr(plain, name), check_exact=True)
        pd.testing.assert_series_equal(sim.peak_memory, plain.peak_memory, check_exact=True)
        assert sim.bubble == plain.bubble and sim.transfers.empty


@pytest.mark.parametrize("config", setups(), ids=lambda c: c.schedule)
def test_offload_properties(config, rng):
    program = config.program()
    n = program.num_virtual_stages
    kw = {"forward": rng.uniform(1, 3, n), "backward": rng.uniform(2, 5, n), "weight": rng.uniform(0, 1, n),
          "activation": rng.uniform(1, 9, n), "params": rng.uniform(0, 3, n), "comm": 0.0123, "constant": 1.5}
    plain = sapptk.simulate(program, **kw)
    off = kw["activation"] * rng.uniform(0, 1, n)
    # an unbounded link: no backward waits, the peak never rises
    fast = sapptk.simulate(program, **kw, offloaded=off, host_bandwidth=1e9)
    assert fast.step_time == pytest.approx(plain.step_time, abs=1e-6)
    assert (fast.peak_memory.to_numpy() <= plain.peak_memory.to_numpy() + 1e-9).all()
    slow = sapptk.simulate(program, **kw, offloaded=off, host_bandwidth=0.5)
    assert slow.step_time >= plain.step_time - 1e-9
    assert (slow.peak_memory.to_numpy() <= plain.peak_memory.to_numpy() + 1e-9).all()
    assert (slow.memory.memory_mb.to_numpy() >= -1e-9).all()
    tr = slow.transfers
    for _, part in tr.groupby("device"):  # one stream per device: FIFO, one transfer at a time
        assert (part.start_ms.to_numpy()[1:] >= part.end_ms.to_numpy()[:-1] - 1e-12).all()
        assert (part.start_ms >= part.issue_ms).all()
    # every backward (or I) starts after its fetch ends
    ev = slow.events
    need = ev[ev.kind.isin(["B", "I"])].set_index(["virtual_stage", "micro_batch", "slice"]).start_ms
    fetch = tr[tr.kind == "fetch"].set_index(["virtual_stage", "micro_batch", "slice"]).end_ms
    assert (need.loc[fetch.index].to_numpy() >= fetch.to_numpy() - 1e-12).all()
    again = sapptk.simulate(program, **kw, offloaded=off, host_bandwidth=0.5)
    assert again.step_time == slow.step_time and (again.peak_memory == slow.peak_memory).all()


# ------------------------------------------------------------------ bad input
def test_config_bandwidth_rules():
    base = {"stages": 2, "micro_batches": 4}
    with pytest.raises(ConfigError, match="host_bandwidth = MB per ms > 0, got None"):
        sapptk.PipelineConfig(**base, recompute=ALL).validate()
    for bad in (0, -5, float("nan"), float("inf"), "fast", True):
        with pytest.raises(ConfigError, match="host_bandwidth"):
            sapptk.PipelineConfig(**base, recompute=ALL, host_bandwidth=bad).validate()
    with pytest.raises(ConfigError, match="unknown mode 'offlaod'"):
        sapptk.PipelineConfig(**base, recompute=("none", "offlaod")).validate()
    cfg = sapptk.PipelineConfig(**base, recompute=ALL, host_bandwidth=25)
    cfg.validate()
    assert cfg.recompute[-1] == "offload"
    assert pickle.loads(pickle.dumps(cfg)) == cfg and hash(cfg) == hash(pickle.loads(pickle.dumps(cfg)))
    # configs without the lever are as before
    plain = sapptk.PipelineConfig(**base)
    assert plain.host_bandwidth is None and plain == sapptk.PipelineConfig(**base)
    assert plain != cfg.replace(recompute=MODES)  # the bandwidth is part of the setup


def test_offload_alone_is_not_a_mode(llama):
    cfg = sapptk.PipelineConfig(stages=2, micro_batches=4, recompute=("offload",), host_bandwidth=25)
    with pytest.raises(ConfigError, match="a lever on top of the modes"):
        cfg.check(llama)


def test_simulate_with_offload_bad_input():
    program = sapptk.schedules.build("1f1b", stages=2, micro_batches=2)
    for bad in (None, 0, -1.0, float("nan")):
        with pytest.raises(SapptkError, match="host_bandwidth"):
            sapptk.simulate(program, forward=1, backward=2, activation=10, offloaded=5, host_bandwidth=bad)
    with pytest.raises(SapptkError, match="offloaded: virtual stage 0 offloads 11 MB of an activation of 10 MB"):
        sapptk.simulate(program, forward=1, backward=2, activation=10, offloaded=11, host_bandwidth=1)
    with pytest.raises(SapptkError, match="offloaded"):
        sapptk.simulate(program, forward=1, backward=2, activation=10, offloaded=[1, 2, 3], host_bandwidth=1)


def _offload_config(**kw) -> sapptk.PipelineConfig:
    args = {"stages": 4, "micro_batches": 8, "chunks": 1, "schedule": "1f1b", "recompute": ALL,
            "host_bandwidth": 10.0}
    args.update(kw)
    return sapptk.PipelineConfig(**args)


def test_offload_array_checked(llama):
    cfg = _offload_config()
    counts = sapptk.even_split(llama, cfg, "none").counts
    good = counts[:, 0, :].copy()
    assert check_offload(llama, cfg, counts, np.zeros_like(good)) is None
    with pytest.raises(ConfigError, match=r"offload: expected shape \(1, 4\)"):
        make_plan(llama, cfg, counts, status="given", offload=good[:, :3])
    too_many = good.copy()
    too_many[0, 2] += 1
    with pytest.raises(ConfigError, match="virtual stage 2: 25 layers offloaded, but only 24 run in mode 'none'"):
        make_plan(llama, cfg, counts, status="given", offload=too_many)
    negative = good.copy()
    negative[0, 1] = -1
    with pytest.raises(ConfigError, match="negative layer count -1"):
        make_plan(llama, cfg, counts, status="given", offload=negative)
    with pytest.raises(ConfigError, match="whole numbers"):
        make_plan(llama, cfg, counts, status="given", offload=good + 0.5)
    full = sapptk.even_split(llama, cfg, "full").counts
    with pytest.raises(ConfigError, match="only 0 run in mode 'none'"):
        make_plan(llama, cfg, full, status="given", offload=good)
    no_link = cfg.replace(recompute=MODES, host_bandwidth=None)
    with pytest.raises(ConfigError, match="host_bandwidth = None"):
        make_plan(llama, no_link, counts, status="given", offload=good)


# ------------------------------------------------------------------ plans
def test_plan_with_offload_frames_files_and_exports(llama, tmp_path):
    cfg = _offload_config(memory_budget=60000)
    even = sapptk.even_split(llama, cfg, "none")
    offload = even.counts[:, 0, :].copy()
    offload[0, 3] = 0
    plan = make_plan(llama, cfg, even.counts, status="given", offload=offload)
    sim = plan.simulate()
    assert isinstance(sim, OffloadSimulation) and sim.step_time == plan.step_time
    assert (sim.peak_memory.to_numpy() <= even.simulation.peak_memory.to_numpy()).all()
    assert plan.offload.flags.writeable is False
    layout = plan.layout
    assert list(layout.columns) == ["group", "chunk", "stage", "device", "virtual_stage", "mode", "layers",
                                    "offloaded"]
    assert layout.offloaded.tolist() == offload[0].tolist()
    assert plan.devices.peak_mb.tolist() == sim.peak_memory.tolist()
    assert "activation offload: 72 layers on 3 virtual stages, host link 10 MB/ms" in plan.summary()
    # the plan file keeps the offload and the bandwidth
    path = tmp_path / "plan.yaml"
    plan.export("sapptk", path)
    back = load_plan(path)
    assert np.array_equal(back.offload, plan.offload) and back.config == cfg
    assert back.step_time == plan.step_time and back.simulate().step_time == plan.step_time
    data = yaml.safe_load(path.read_text())
    assert data["setup"]["host_bandwidth_mb_per_ms"] == 10.0
    assert data["offload"] == [{"group": "LLamaDecodeLayer", "virtual_stage": v, "layers": 24} for v in (0, 1, 2)]
    data["offload"][0]["layers"] = 0
    with pytest.raises(ConfigError, match=r"offload\[0\].layers = 0: expected an integer from 1"):
        load_plan(data)
    # a plan without offload writes no offload key
    assert "offload" not in yaml.safe_load(even.export("sapptk").text)
    # runtimes that cannot run it say so
    with pytest.raises(ConfigError, match="MindFormers' offset and recompute lists cannot express activation"):
        plan.export("mindformers")
    with pytest.raises(ConfigError, match="torchtitan's settings"):
        plan.export("torchtitan")
    with pytest.raises(ConfigError, match="refuses pipeline parallelism"):
        plan.export("megatron")
    with pytest.raises(ConfigError, match="sensitivity"):
        plan.sensitivity(samples=10)


# ------------------------------------------------------------------ the search
def _base_plan(profile, cfg):
    """The fastest even split that fits (a start the search must never make worse)."""
    plans = [p for p in (sapptk.even_split(profile, cfg, m) for m in distinct_recomputes(profile, cfg)) if p.fits]
    return min(plans, key=lambda p: p.step_time)


def test_search_fits_and_prediction_equals_simulation(llama):
    cfg = _offload_config(memory_budget=62000)
    base = _base_plan(llama, cfg)
    plan = with_offload(base, deadline=time.perf_counter() + 60)
    assert plan.fits and plan.step_time < base.step_time
    assert plan.offload is not None and plan.status == "feasible" and plan.bound is None
    sim = plan.simulate()
    assert sim.step_time == plan.step_time
    assert (sim.peak_memory.to_numpy() <= cfg.memory_budget + 1e-6).all()
    assert "activation offload:" in plan.message


def test_search_on_random_problems_never_worse(rng):
    for schedule, chunks in (("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)):
        profile = small_profile(rng, groups=2, layers=(6, 8))
        cfg = sapptk.PipelineConfig(3, 6, chunks, schedule, recompute=ALL, host_bandwidth=float(rng.uniform(1, 20)))
        base = sapptk.even_split(profile, cfg, "strongest")
        budget = float(base.simulation.peak_memory.max()) * 1.02
        cfg = cfg.replace(memory_budget=budget)
        base = sapptk.even_split(profile, cfg, "strongest")
        res = offload_search(profile, cfg, np.asarray(base.counts), deadline=time.perf_counter() + 30)
        assert res.step_time <= base.step_time
        plan = make_plan(profile, cfg, res.counts, status="given", offload=res.offload if res.offload.any() else None)
        assert plan.fits and plan.step_time == res.step_time
        assert (plan.simulation.peak_memory.to_numpy() == res.peaks).all()


def test_search_stops_at_once_when_asked(llama):
    cfg = _offload_config(memory_budget=62000)
    base = _base_plan(llama, cfg)
    stop = threading.Event()
    stop.set()
    res = offload_search(llama, cfg, np.asarray(base.counts), deadline=time.perf_counter() + 60, stop=stop)
    assert res.evaluations == 0 and not res.improved and not res.complete
    assert with_offload(base, deadline=time.perf_counter() + 60, stop=stop) is not base  # a note is added
    assert with_offload(base, deadline=time.perf_counter() + 60, stop=stop).offload is None


@pytest.mark.slow
def test_balance_with_offload(llama):
    cfg = _offload_config(memory_budget=62000)
    plan = sapptk.balance(llama, cfg, time_limit=4)
    plain = sapptk.balance(llama, cfg.replace(recompute=MODES), time_limit=4)
    assert plan.fits and plan.simulate().step_time == plan.step_time
    assert plan.step_time <= plain.step_time
    assert "activation offload:" in plan.message


def test_search_from_a_start_without_budget(llama):
    # the even split without recompute needs about 145 GB on device 0 as it is, 97988 MB with every
    # layer offloaded: at 100000 MB it is a start, at 90000 MB it is skipped
    free = np.asarray(sapptk.even_split(llama, _offload_config(), "none").counts)
    for budget, used in ((100000, True), (90000, False)):
        cfg = _offload_config(memory_budget=budget)
        base = _base_plan(llama, cfg)
        assert not sapptk.even_split(llama, cfg, "none").fits
        res = offload_search(llama, cfg, np.asarray(base.counts), deadline=time.perf_counter() + 60, starts=[free])
        alone = offload_search(llama, cfg, np.asarray(base.counts), deadline=time.perf_counter() + 60)
        assert res.complete and res.step_time <= alone.step_time <= base.step_time
        # a start that fits is searched from (more candidates); one that does not is simulated once, then skipped
        assert (res.evaluations > alone.evaluations + 1) == used
        assert used or res.evaluations == alone.evaluations + 1
        plan = make_plan(llama, cfg, res.counts, status="given", offload=res.offload)
        assert plan.fits and plan.step_time == res.step_time


def test_with_offload_needs_a_bandwidth(llama):
    cfg = sapptk.PipelineConfig(stages=4, micro_batches=8, memory_budget=62000)
    with pytest.raises(ConfigError, match="host_bandwidth = None"):
        with_offload(_base_plan(llama, cfg), deadline=time.perf_counter() + 1)


@pytest.mark.slow
def test_balance_with_offload_keeps_a_safety_margin(llama):
    cfg = _offload_config(memory_budget=100000)
    plan = sapptk.balance(llama, cfg, time_limit=4, memory_margin=0.05)
    assert plan.config.memory_budget == 100000 and plan.offload is not None
    assert (plan.simulate().peak_memory.to_numpy() <= 95000 + 1e-6).all()  # the offload search kept the margin
    assert plan.simulate().step_time == plan.step_time


@pytest.mark.slow
def test_balance_with_offload_stopped(llama):
    stop = threading.Event()
    stop.set()
    plan = sapptk.balance(llama, _offload_config(memory_budget=62000), time_limit=30, stop=stop)
    assert plan.solved and plan.fits and plan.offload is None  # the solve's first plan, no offload search


def test_search_without_a_plan_that_fits(llama):
    # no plan without offload (counts None): only the starts are searched
    cfg = _offload_config(memory_budget=100000)
    free = np.asarray(sapptk.even_split(llama, cfg, "none").counts)
    res = offload_search(llama, cfg, None, deadline=time.perf_counter() + 60, starts=[free])
    assert res.base_step_time == np.inf and res.improved and res.offload.any()
    plan = make_plan(llama, cfg, res.counts, status="given", offload=res.offload)
    assert plan.fits and plan.step_time == res.step_time
    # a start in a mode the config does not allow is skipped, and nothing is found
    full = np.asarray(sapptk.even_split(llama, cfg, "full").counts)
    narrow = cfg.replace(recompute=("none", "select", "offload"))
    res = offload_search(llama, narrow, None, deadline=time.perf_counter() + 60, starts=[full])
    assert res.counts is None and not res.improved and res.evaluations == 0
    # with_offload of a plan with no assignment searches the starts
    nothing = make_plan(llama, cfg, None, status="infeasible", message="proved")
    found = with_offload(nothing, deadline=time.perf_counter() + 60, starts=[free])
    assert found.status == "feasible" and found.fits and "without offload nothing fits" in found.message
    assert with_offload(nothing, deadline=time.perf_counter() + 60) is nothing


@pytest.mark.slow
def test_a_start_plan_with_offload_keeps_its_offload(llama):
    # the plan of a smaller budget, offload included, seeds a larger budget: never slower than it
    small = sapptk.balance(llama, _offload_config(memory_budget=62000), time_limit=4)
    assert small.offload is not None
    bigger = _offload_config(memory_budget=64000)
    res = offload_search(llama, bigger, None, deadline=time.perf_counter() + 60,
                         starts=[(np.asarray(small.counts), np.asarray(small.offload))])
    assert res.step_time <= small.step_time
    plan = sapptk.balance(llama, bigger, time_limit=4, start=small)
    assert plan.fits and plan.step_time <= small.step_time
