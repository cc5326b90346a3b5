"""Recompute per micro-batch against per-stage recompute, at the same solve time.

Run: ``.venv/bin/python benchmarks/micro_batch_recompute.py [--time-limit S] [--budget-deepseek MB]``

For each case: ``balance(..., time_limit=S)`` (per-stage) and ``balance(..., time_limit=S,
per_micro_batch=True)`` (three quarters of S for the per-stage search, the rest for the micro-batch
search), both in this process one after the other. Prints both simulated step times, the
gain of the per-micro-batch plan over the per-stage plan of the same call (its own
starting point, which it never loses to) and over the separate per-stage call, the wall
times and how many (virtual stage, micro-batch) cells recompute less. Both plans are
checked to fit (simulated).
"""

from __future__ import annotations

import argparse
import re
import time

from sapptk.balancer import balance
from sapptk.config import PipelineConfig
from sapptk.profile import bundled_profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=20.0)
    parser.add_argument("--budget-deepseek", type=float, default=36000.0)
    args = parser.parse_args()
    cases = [
        ("llama2_70b", PipelineConfig(16, 32, 2, "interleaved", memory_budget=56000)),
        ("deepseek_v3", PipelineConfig(16, 32, 1, "1f1b", memory_budget=args.budget_deepseek)),
    ]
    print(f"time limit {args.time_limit:g} s per call, 2 CP-SAT workers")
    print("case | per-stage ms | per-micro-batch ms | gain vs same call's per-stage plan | gain vs per-stage call "
          "| cells moved | wall s (per-stage, per-mb)")
    for name, config in cases:
        profile = bundled_profile(name)
        t0 = time.perf_counter()
        stage = balance(profile, config, time_limit=args.time_limit)
        t1 = time.perf_counter()
        micro = balance(profile, config, time_limit=args.time_limit, per_micro_batch=True)
        t2 = time.perf_counter()
        assert stage.fits and micro.fits
        own = re.search(r"step ([\d.e+]+) -> ([\d.e+]+) ms", micro.message)
        own_gain = "0.00 % (no move helped)"
        if own:
            before = float(own.group(1))
            own_gain = f"{(before - micro.step_time) / before:.2%} (from {before:,.0f})"
        moved = 0 if micro.alternative is None else int(micro.alternative.mask.sum())
        cells = config.num_virtual_stages * config.micro_batches
        label = f"{name} {config.schedule} {config.stages} × {config.micro_batches} × {config.chunks}, " \
                f"{config.memory_budget:.0f} MB"
        print(f"{label} | {stage.step_time:,.0f} | {micro.step_time:,.0f} | {own_gain} | "
              f"{(stage.step_time - micro.step_time) / stage.step_time:.2%} | {moved} of {cells} | "
              f"{t1 - t0:.1f}, {t2 - t1:.1f}")


if __name__ == "__main__":
    main()
