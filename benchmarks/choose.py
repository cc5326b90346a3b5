"""``sapptk.choose`` against a brute-force sweep of the same grid, its throughput, and a model card.

Run: python benchmarks/choose.py [--part winner choose throughput card runaway 405b ds256 ds2048] [--time-limit 10]

``--time-limit`` is each balance's (``choose(setup_time_limit=)``, the sweep's per point).

* ``winner``: llama2_70b, 64 devices, global batch 512, micro-batch 1, 56000 MB, every
  schedule whose order is fixed, chunks 1-4 (stages: every divisor of 64, dp = 64 / p).
  ``choose`` runs, then the brute-force baseline: ``sapptk.sweep`` over every valid setup
  of the same grid at the same time limit per setup. Prints both times, their ratio, both
  winners and whether ``choose`` proved its winner. ``sweep``: the brute-force half alone;
  ``choose``: the ``choose`` half alone (with ``--whole S``: ``time_limit=S`` for the whole call,
  printing by how much the call overran it).
* ``throughput``: sixteen-stage setups of llama2_70b decided (balanced or pruned) per
  minute: ``choose`` on 16 devices (dp = 1) for global batches 32-128 and budgets
  48000-72000 MB, every fixed schedule, chunks 1-4 (``--executor``, ``--retry``,
  ``--bound-time``, ``--no-prove``, ``--no-tighten``: choose's levers; prints the seconds by step).
* ``card``: DeepSeek-V3 from its model card on 256 H800s (tp, ep, stages, dp, chunks,
  schedules), then Megatron-LM's published DeepSeek-V3 layouts simulated on the bundled
  deepseek_v3 profile against the balanced plan at the same shape and budget.
* ``405b``, ``ds256``, ``ds2048``: issue 32's cluster-scale calls from the bundled cards, the
  default settings otherwise (:data:`CLUSTER`): Llama-3.1-405B on 128 H100 (global batch 32 x
  8192 tokens, 80,000 MB), DeepSeek-V3 on 256 H800 (the README's call) and on 2048 H800
  (global batch 15,360 x 4096 tokens). Prints the time against the target, the load, the
  winner, and when it is not proven the gap and the setups keeping the proof open.
* ``runaway``: the seconds ``choose`` takes to refuse each runaway input (devices=10**12,
  2**31 devices with global batch 2**31, max_chunks=10**9, batch=10**9, time_limit=10**400,
  a grid of more than ``sapptk.checks.MAX_SETUPS`` setups), and how long a set ``stop``
  event takes to end a running choice.

Timings are wall-clock on whatever machine runs it; on the shared 2-core machines they are
taken under load (say so where you record them).
"""

from __future__ import annotations

import argparse
import time
import warnings
from typing import Any

import pandas as pd

import sapptk
from sapptk.choosing.setups import enumerate_setups
from sapptk.errors import ConfigError

LAYOUTS = {"Et*3|(tt|)*29,m|L": "Megatron-LM DeepSeek-V3 layout (PP16, VPP2)",
           "Et|(tt|)*30mL": "Megatron-LM DeepSeek-V3 layout (PP16, VPP2, MTP with the loss)"}


WINNER_GRID = dict(devices=64, global_batch=512, memory_budget=56000.0, max_chunks=4)


def brute_force(time_limit: float) -> tuple[pd.Series, float, int]:
    """``sapptk.sweep`` over every valid setup of the winner grid: (best row, seconds, setups)."""
    profile = sapptk.bundled_profile("llama2_70b")
    valid = []
    for s in enumerate_setups(**WINNER_GRID):
        try:
            s.config.check(profile)
        except ConfigError:
            continue
        valid.append(s.config)
    t0 = time.perf_counter()
    frame = sapptk.sweep(profile, valid, point_time_limit=time_limit, progress=False)
    t_sweep = time.perf_counter() - t0
    solved = frame[frame["status"].isin(["optimal", "feasible"])]
    return solved.loc[solved["step_time_ms"].idxmin()], t_sweep, len(valid)


def sweep_only(time_limit: float) -> None:
    best, t_sweep, n = brute_force(time_limit)
    print(f"sweep of the {n} valid setups: {t_sweep:.1f} s; winner {best['schedule']} p{best['stages']} "
          f"v{best['chunks']} {best['step_time_ms']:,.1f} ms")


def choose_only(time_limit: float, whole: float | None = None) -> tuple[Any, float]:
    profile = sapptk.bundled_profile("llama2_70b")
    t0 = time.perf_counter()
    choice = sapptk.choose(profile, setup_time_limit=time_limit, time_limit=whole, **WINNER_GRID)
    t_choose = time.perf_counter() - t0
    print(choice.summary())
    print(choice.top(8).to_string(index=False))
    print(f"choose: {t_choose:.1f} s, proven {choice.proven}, status {choice.status}; seconds by step: "
          + ", ".join(f"{k} {v:.1f}" for k, v in choice.timings.items()))
    if whole is not None:
        print(f"whole-call time_limit {whole:g} s: returned after {t_choose:.2f} s (overrun {t_choose - whole:+.2f} s)")
    return choice, t_choose


def runaway() -> None:
    import threading

    profile = sapptk.bundled_profile("llama2_70b")
    grid = dict(devices=64, global_batch=512, memory_budget=56000.0)
    cases = {"devices=10**12": dict(grid, devices=10**12),
             "devices=global_batch=2**31": dict(grid, devices=2**31, global_batch=2**31),
             "max_chunks=10**9": dict(grid, max_chunks=10**9), "batch=10**9": dict(grid, batch=10**9),
             "time_limit=10**400": dict(grid, time_limit=10**400),
             "max_chunks=1.5": dict(grid, max_chunks=1.5),
             "720720 devices, chunks to 64 (93,360 setups)": dict(grid, devices=720720, global_batch=720720,
                                                                   max_chunks=64)}
    for what, kw in cases.items():
        t0 = time.perf_counter()
        try:
            sapptk.choose(profile, **kw)
            said = "answered"
        except ConfigError as exc:
            said = f"ConfigError: {str(exc)[:110]}"
        print(f"{what}: {1000 * (time.perf_counter() - t0):.1f} ms; {said}")
    for after in (2.0, 8.0, 20.0):
        stop = threading.Event()
        timer = threading.Timer(after, stop.set)
        timer.start()
        t0 = time.perf_counter()
        choice = sapptk.choose(profile, stop=stop, setup_time_limit=10, **grid)
        wall = time.perf_counter() - t0
        print(f"stop set after {after:g} s: returned after {wall:.2f} s (latency {wall - after:.2f} s), "
              f"status {choice.status}, {choice.counts}")


def winner(time_limit: float) -> None:
    choice, t_choose = choose_only(time_limit)
    best, t_sweep, n_valid = brute_force(time_limit)
    w = choice.frame.iloc[0]
    same = (best["schedule"], best["stages"], best["chunks"]) == (w["schedule"], w["stages"], w["chunks"]) or abs(
        best["step_time_ms"] - w["step_time_ms"]) <= 1e-9 * w["step_time_ms"]
    print(f"\nchoose: {t_choose:.1f} s, proven {choice.proven}; sweep of the {n_valid} valid setups: "
          f"{t_sweep:.1f} s; ratio choose / sweep = {t_choose / t_sweep:.3f}")
    print(f"sweep winner: {best['schedule']} p{best['stages']} v{best['chunks']} {best['step_time_ms']:,.1f} ms; "
          f"choose winner: {w['schedule']} p{w['stages']} v{w['chunks']} {w['step_time_ms']:,.1f} ms; "
          f"same: {same}")


def throughput(time_limit: float, minutes: float, **levers: Any) -> None:
    """``levers``: ``executor``, ``retry``, ``bound_time``, ``prove``, ``tighten`` as in :func:`sapptk.choose`."""
    profile = sapptk.bundled_profile("llama2_70b")
    decided = total = 0
    steps: dict[str, float] = {}
    t0 = time.perf_counter()
    for batch in (32, 48, 64, 96, 128):
        for budget in (48000.0, 56000.0, 64000.0, 72000.0):
            if time.perf_counter() - t0 > minutes * 60:
                break
            choice = sapptk.choose(profile, devices=16, global_batch=batch, memory_budget=budget, stages=[16],
                                   setup_time_limit=time_limit, **levers)
            for step, sec in choice.timings.items():
                steps[step] = steps.get(step, 0.0) + sec
            c = choice.counts
            decided += c["balanced"] + c["pruned"] + c["infeasible"]
            total += len(choice.frame)
            elapsed = time.perf_counter() - t0
            w = choice.frame.iloc[0]
            print(f"m {batch:4d} budget {budget:7.0f}: {len(choice.frame)} setups ({c}), {choice.seconds:.1f} s; "
                  f"winner {w['schedule']} v{w['chunks']} {w['step_time_ms']:,.0f} ms; "
                  f"so far {decided} decided in {elapsed:.0f} s = {decided / elapsed * 600:.0f} per 10 min")
    elapsed = time.perf_counter() - t0
    print(f"\n{decided} of {total} sixteen-stage setups decided in {elapsed:.0f} s: "
          f"{decided / elapsed * 600:.0f} per 10 minutes")
    print("seconds by step: " + ", ".join(f"{k} {v:.1f}" for k, v in steps.items()))


CLUSTER = {
    "405b": ("llama3.1-405b", dict(hardware="h100", devices=128, global_batch=32, seq_length=8192,
                                   memory_budget=80000.0), 120.0),
    "ds256": ("deepseek-v3", dict(hardware="h800", devices=256, global_batch=1024, memory_budget=None,
                                  tp=[1, 2], ep=[8, 64]), 120.0),
    "ds2048": ("deepseek-v3", dict(hardware="h800", devices=2048, global_batch=15360, seq_length=4096,
                                   memory_budget=None), 300.0),
}
"""Cluster-scale cases of issue 32: (bundled card, the call, the target seconds)."""


def cluster(case: str, **kw: Any) -> Any:
    """One cluster-scale case from its bundled model card, the default call otherwise (``kw``
    adds choose's levers): the wall time against its target, the winner, and when the winner
    is not proven the gap and the setups keeping the proof open."""
    from sapptk.models import card as model_card

    name, call, target = CLUSTER[case]
    t0 = time.perf_counter()
    choice = sapptk.choose(model_card(name), **call, **kw)
    wall = time.perf_counter() - t0
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(choice.summary())
    print(choice.top(6).to_string(index=False))
    print(f"{case}: {wall:.1f} s (target {target:g} s), proven {choice.proven}, status {choice.status}, "
          f"{len(choice.frame)} setups {choice.counts}; load {load}; seconds by step: "
          + ", ".join(f"{k} {v:.1f}" for k, v in choice.timings.items()))
    if not choice.proven and choice.best is not None:
        open_ = choice.open_setups
        print(f"proof gap {100 * choice.proof_gap:.3f} %, {len(open_)} setups keep it open:")
        print(open_.head(10).to_string(index=False))
    return choice


def card(time_limit: float) -> None:
    from sapptk.models import card as model_card

    t0 = time.perf_counter()
    choice = sapptk.choose(model_card("deepseek-v3"), hardware="h800", devices=256, global_batch=1024,
                           memory_budget=None, tp=[1, 2], ep=[8, 32, 64], stages=[8, 16],
                           schedules=["1f1b", "interleaved", "zb-h1", "dualpipe-v"], chunks=[1, 2],
                           setup_time_limit=time_limit, seq_length=4096)
    print(f"DeepSeek-V3 card on 256 H800: {time.perf_counter() - t0:.1f} s")
    print(choice.summary())
    print(choice.top(8).to_string(index=False))
    hand_vs_plan(time_limit)


def hand_vs_plan(time_limit: float) -> pd.DataFrame:
    """The published layouts on the bundled deepseek_v3 profile (PP16, VPP2, 32 micro-batches,
    mode none) against sapptk's balanced plan at the same shape and no more memory, and against
    choose's winner over schedules, chunks and stages at that budget (16 x dp devices)."""
    profile = sapptk.bundled_profile("deepseek_v3")
    base = sapptk.PipelineConfig(stages=16, micro_batches=32, chunks=2, schedule="interleaved")
    rows = []
    for layout, what in LAYOUTS.items():
        hand = sapptk.load_plan(layout, "megatron", profile=profile, config=base)
        peak = float(hand.simulation.peak_memory.max())
        plan = sapptk.balance(profile, base.replace(memory_budget=peak), time_limit=time_limit)
        choice = sapptk.choose(profile, devices=16, global_batch=32, memory_budget=peak, stages=[8, 16],
                               setup_time_limit=time_limit)
        best = choice.best
        rows += [
            {"layout": layout, "plan": what, "step_ms": hand.step_time, "peak_mb": peak},
            {"layout": layout, "plan": "sapptk balance, same shape and budget", "step_ms": plan.step_time,
             "peak_mb": float(plan.simulation.peak_memory.max())},
            {"layout": layout, "plan": f"sapptk choose: {best.config.schedule} p{best.config.stages} "
             f"v{best.config.chunks}", "step_ms": best.step_time, "peak_mb": float(best.simulation.peak_memory.max())},
        ]
    table = pd.DataFrame(rows)
    hand = table.groupby("layout")["step_ms"].transform("first")
    table["vs_hand"] = table["step_ms"] / hand
    print(table.round({"step_ms": 1, "peak_mb": 0, "vs_hand": 4}).to_string(index=False))
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", nargs="+", default=["winner", "throughput", "card"],
                        choices=["winner", "choose", "sweep", "throughput", "card", "hand", "runaway",
                                 *CLUSTER])
    parser.add_argument("--time-limit", type=float, default=10.0, help="seconds per balanced setup")
    parser.add_argument("--whole", type=float, default=None, help="choose: time_limit of the whole call")
    parser.add_argument("--minutes", type=float, default=10.0, help="cap of the throughput part")
    parser.add_argument("--executor", default="serial", help="throughput: serial or processes")
    parser.add_argument("--retry", type=float, default=2.0, help="throughput: choose's retry")
    parser.add_argument("--bound-time", type=float, default=1.0, help="throughput: choose's bound_time")
    parser.add_argument("--no-prove", action="store_true", help="throughput: choose(prove=False)")
    parser.add_argument("--no-tighten", action="store_true", help="throughput: choose(tighten=False)")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    for part in args.part:
        print(f"== {part} (the default call: setup_time_limit 20 s)" if part in CLUSTER else
              f"== {part} (time limit {args.time_limit:g} s per balanced setup)")
        if part == "winner":
            winner(args.time_limit)
        elif part == "choose":
            choose_only(args.time_limit, args.whole)
        elif part == "runaway":
            runaway()
        elif part == "sweep":
            sweep_only(args.time_limit)
        elif part == "throughput":
            throughput(args.time_limit, args.minutes, executor=args.executor, retry=args.retry,
                       bound_time=args.bound_time, prove=not args.no_prove,
                       tighten=not args.no_tighten)
        elif part == "card":
            card(args.time_limit)
        elif part in CLUSTER:
            cluster(part)
        else:
            hand_vs_plan(args.time_limit)


if __name__ == "__main__":
    main()
