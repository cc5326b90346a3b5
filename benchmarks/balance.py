"""Balancer benchmark: solve time, certainty and plan quality on the bundled profiles.

Run: ``.venv/bin/python benchmarks/balance.py [--time-limit S] [--workers N]``

For each setup it prints the solver status, wall seconds, gap, the predicted and the
simulated step time (they must agree), and the ratio of the step time to the best even-split
baseline that fits the budget (every layer in one recompute mode, simulated).

Setups: llama2_70b at 56000 MB, 16 stages, 32 micro-batches — 1f1b, interleaved (2 chunks),
interleaved-lm (2 chunks); deepseek_v3 (3 dense + 58 MoE layers, estimated figures) on
16 stages, 32 micro-batches, 1f1b and dualpipe-v, at 64000 MB per device (an 80 GB H800
with room for the framework, buffers and fragmentation).
"""

from __future__ import annotations

import argparse
import time

from sapptk.balancer import solve
from sapptk.config import PipelineConfig
from sapptk.costs import simulate_counts
from sapptk.plan import even_splits
from sapptk.profile import bundled_profile

SETUPS = [
    ("llama2_70b", PipelineConfig(16, 32, 1, "1f1b", memory_budget=56000)),
    ("llama2_70b", PipelineConfig(16, 32, 2, "interleaved", memory_budget=56000)),
    ("llama2_70b", PipelineConfig(16, 32, 2, "interleaved-lm", memory_budget=56000)),
    ("deepseek_v3", PipelineConfig(16, 32, 1, "1f1b", memory_budget=64000)),
    ("deepseek_v3", PipelineConfig(16, 32, 2, "dualpipe-v", memory_budget=64000)),
]


def best_even(profile, config) -> tuple[str, float] | None:
    """The fastest even split (one mode for every layer) that fits the budget."""
    fitting = [plan for plan in even_splits(profile, config) if plan.fits]
    if not fitting:
        return None
    fastest = min(fitting, key=lambda plan: plan.step_time)
    return fastest.source.removeprefix("even_split(").rstrip(")"), fastest.step_time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=60.0)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    header = (f"{'profile':<12} {'schedule':<15} {'v':>2} {'budget':>7} {'status':<9} {'sec':>6} {'gap %':>6} "
              f"{'pred ms':>10} {'sim ms':>10} {'even (mode)':>20} {'ratio':>6} iters cuts layouts")
    print(header)
    print("-" * len(header))
    for name, cfg in SETUPS:
        profile = bundled_profile(name)
        t0 = time.perf_counter()
        res = solve(profile, cfg, time_limit=args.time_limit, workers=args.workers)
        wall = time.perf_counter() - t0
        even = best_even(profile, cfg)
        even_text = "none fits" if even is None else f"{even[1]:.0f} ({even[0]})"
        if res.counts is not None:
            sim = simulate_counts(profile, cfg, res.counts).step_time
            ratio = f"{res.step_time / even[1]:.3f}" if even else "-"
            pred, simt, gap = f"{res.step_time:.0f}", f"{sim:.0f}", f"{100 * (res.gap or 0):.2f}"
        else:
            pred = simt = gap = ratio = "-"
        print(f"{name:<12} {cfg.schedule:<15} {cfg.chunks:>2} {cfg.memory_budget:>7.0f} {res.status:<9} "
              f"{wall:>6.1f} {gap:>6} {pred:>10} {simt:>10} {even_text:>20} {ratio:>6} "
              f"{res.iterations:>5} {res.cuts:>4} {res.layouts:>7}", flush=True)
        if res.notes:
            print(f"{'':<12} note: {'; '.join(res.notes)}")


if __name__ == "__main__":
    main()
