"""Activation offload against recompute: where sending activations to host memory beats recomputing them.

Run: python benchmarks/offload.py [--quick] [--base-seconds S] [--offload-seconds S]

1. Speed of the copy-stream simulation (:func:`sapptk.simulate` with ``host_bandwidth``) against
   the plain run on the same plan, and of its pass (the longest-path kernel on units and
   transfers) against the unit-by-unit Python pass it replaced (``tests/offload_reference.py``),
   as ratios measured in this process (load cancels); also at 4x the micro-batches.
2. llama2_70b, interleaved, 16 stages x 32 micro-batches x 2 chunks, at 56000 MB and a tighter
   48000 MB, with the layers' times scaled (0.5x, 1x, 2x: shorter or longer layers, the same
   activations): the recompute-only plan (``balance`` without "offload"), then the same plan
   improved by the offload search (:func:`sapptk.balancer.with_offload`, also started from the
   plan balanced with no recompute and no budget, as ``balance`` does) for host links of 5,
   10, 25 and 50 MB/ms (PCIe 4.0 x16 is about 25 MB/ms); that plan's step time is the last
   column (what free memory would give). Step times are exact
   simulated figures; only the seconds depend on the machine.
3. One end-to-end ``balance(..., recompute=(..., "offload"))`` call: its wall time against
   its time limit.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

import sapptk
from sapptk.balancer import with_offload
from sapptk.profile import MODES, ModeCost, Profile

BANDWIDTHS = (5.0, 10.0, 25.0, 50.0)
BUDGETS = (56000.0, 48000.0)
SCALES = (0.5, 1.0, 2.0)
SETUP = {"stages": 16, "micro_batches": 32, "chunks": 2, "schedule": "interleaved"}


def scaled(profile: Profile, factor: float) -> Profile:
    """The profile with every layer's forward and backward times times ``factor`` (memory unchanged)."""
    groups = []
    for g in profile.groups:
        modes = {name: ModeCost(mc.backward * factor, mc.activation) for name, mc in g.modes.items()}
        groups.append(dataclasses.replace(g, forward=g.forward * factor, modes=modes))
    return Profile(f"{profile.name} x{factor:g}", tuple(groups))


def speed(profile: Profile) -> None:
    cfg = sapptk.PipelineConfig(**SETUP, memory_budget=56000, recompute=(*MODES, "offload"), host_bandwidth=25)
    plan = sapptk.even_split(profile, cfg, "none")
    off = plan.counts[:, 0, :].copy()
    with_off = sapptk.plan.make_plan(profile, cfg, plan.counts, status="given", offload=off)
    c = plan.costs
    program = cfg.program()
    args = {"forward": c.forward, "backward": c.backward, "weight": c.weight, "activation": c.activation,
            "params": c.params}

    def per_call(fn, n: int = 20) -> float:
        fn()
        t = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t) / n

    base = per_call(lambda: sapptk.simulate(program, **args))
    none = per_call(lambda: sapptk.simulate(program, **args, host_bandwidth=25.0))
    full = per_call(lambda: with_off.simulate())
    print(f"simulation of llama2_70b 16 x 32 x 2 interleaved ({program.num_ops} ops), per call:")
    print(f"  sapptk.simulate                          {base * 1e3:7.2f} ms  1.00")
    print(f"  copy streams, nothing offloaded          {none * 1e3:7.2f} ms  {none / base:.2f}")
    print(f"  plan with every layer offloaded          {full * 1e3:7.2f} ms  {full / base:.2f}"
          f"  ({len(with_off.simulation.transfers)} transfers)")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from offload_reference import reference_stream_times

    from sapptk.schedules import copy_stream
    from sapptk.simulation import op_durations, unit_durations

    print("the copy stream's pass: the longest-path kernel on units and transfers against the plain Python pass "
          "(same times, checked)")
    for m in (32, 128):
        setup = cfg.replace(micro_batches=m)
        prog = setup.program()
        costs = sapptk.even_split(profile, setup, "none").costs
        size = costs.activation  # every layer offloaded
        pairs = copy_stream.pairs(prog)
        stream = copy_stream.stream(pairs, size, 25.0, 1)
        dur = unit_durations(prog, op_durations(prog, costs.forward, costs.backward, costs.weight))
        run = (prog, pairs, stream, dur, costs.comm)
        kernel = per_call(lambda r=run: copy_stream.run(*r), n=10)
        plain = per_call(lambda r=run: reference_stream_times(*r), n=10)
        got = copy_stream.run(prog, pairs, stream, dur, costs.comm)
        want = reference_stream_times(prog, pairs, stream, dur, costs.comm)
        assert np.array_equal(got.end, want[1]) and np.array_equal(got.c_end, want[3])
        print(f"  m = {m:3d} ({prog.num_ops:5d} ops, {len(stream.pair):5d} transfers): kernel {kernel * 1e3:7.2f} ms, "
              f"plain pass {plain * 1e3:7.2f} ms, plain / kernel {plain / kernel:.2f}")


def sweep(profile: Profile, scales: tuple[float, ...], budgets: tuple[float, ...], base_seconds: float,
          offload_seconds: float) -> None:
    print(f"\nllama2_70b 16 x 32 x 2 interleaved: recompute-only plan ({base_seconds:g} s) vs the same plan with "
          f"the offload search (up to {offload_seconds:g} s)")
    print("columns: budget MB; layer length; step ms of the recompute-only plan; host link MB/ms; step ms with "
          "offload; offload / recompute-only; layers offloaded; layers still recomputing; ms backwards waited for "
          "fetches; seconds of the offload search; step ms with no recompute and no budget")
    print(f"{'budget':>7} {'length':>6} {'recompute':>10} {'MB/ms':>6} {'offload':>10} {'ratio':>6} "
          f"{'offloaded':>9} {'recomp.':>7} {'waits ms':>8} {'search s':>8} {'no-rec.':>8}")
    free = {}
    for factor in scales:
        cfg = sapptk.PipelineConfig(**SETUP, recompute=("none",))
        free[factor] = sapptk.balance(scaled(profile, factor), cfg, time_limit=base_seconds)
    for budget in budgets:
        for factor in scales:
            prof = scaled(profile, factor)
            cfg = sapptk.PipelineConfig(**SETUP, memory_budget=budget)
            base = sapptk.balance(prof, cfg, time_limit=base_seconds)
            if not base.solved:
                print(f"{budget:7.0f} {factor:5g}x  {base.status}: {base.message}")
                continue
            for bw in BANDWIDTHS:
                ocfg = cfg.replace(recompute=(*MODES, "offload"), host_bandwidth=bw)
                t = time.perf_counter()
                plan = with_offload(dataclasses.replace(base, config=ocfg), deadline=t + offload_seconds,
                                    starts=[free[factor].counts])
                seconds = time.perf_counter() - t
                recomputed = int(plan.counts[:, 1:, :].sum())
                offloaded = 0 if plan.offload is None else int(plan.offload.sum())
                waits = getattr(plan.simulation, "fetch_wait_ms", 0.0)
                print(f"{budget:7.0f} {factor:5g}x {base.step_time:10.0f} {bw:6g} {plan.step_time:10.0f} "
                      f"{plan.step_time / base.step_time:6.3f} {offloaded:9d} {recomputed:7d} {waits:8.0f} "
                      f"{seconds:8.1f} {free[factor].step_time:8.0f}")


def end_to_end(profile: Profile, limit: float) -> None:
    cfg = sapptk.PipelineConfig(**SETUP, memory_budget=56000, recompute=(*MODES, "offload"), host_bandwidth=25)
    t = time.perf_counter()
    plan = sapptk.balance(profile, cfg, time_limit=limit)
    wall = time.perf_counter() - t
    print(f"\nbalance(..., 'offload', host_bandwidth=25) at 56000 MB, time_limit={limit:g}: wall {wall:.1f} s, "
          f"step {plan.step_time:.0f} ms, fits {plan.fits}, "
          f"{0 if plan.offload is None else int(plan.offload.sum())} layers offloaded")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one budget and the real layer length only")
    parser.add_argument("--base-seconds", type=float, default=8.0, help="time limit of each recompute-only balance")
    parser.add_argument("--offload-seconds", type=float, default=20.0, help="deadline of each offload search")
    args = parser.parse_args()
    profile = sapptk.bundled_profile("llama2_70b")
    speed(profile)
    sweep(profile, (1.0,) if args.quick else SCALES, BUDGETS[:1] if args.quick else BUDGETS, args.base_seconds,
          args.offload_seconds)
    end_to_end(profile, 10.0)


if __name__ == "__main__":
    main()
