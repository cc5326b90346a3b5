"""The time-limit promise with every lever: ``balance(..., time_limit=T)`` returns within T + 1 s.

Each lever of ``balance`` at 64 stages × 256 micro-batches × 4 chunks (interleaved, 256
layers of Llama-2 70B, 131,072 ops): the plain solve, recompute per micro-batch, activation
offload at the usual and at a tight budget, a safe budget from ``oom_risk``, a memory margin
with recompute per micro-batch, and the deterministic search. Each case runs in this process
one after the other; the wall time of the whole call is printed with its excess over the limit.
Figures depend on the machine's load: say so where you record them::

    python benchmarks/time_limits.py            # every lever, time_limit=5
    python benchmarks/time_limits.py --limit 10 --only per_micro_batch,offload_tight
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from balance import llama_layers  # noqa: E402 - the benchmarks folder's own helper

import sapptk  # noqa: E402
from sapptk.profile import MODES  # noqa: E402

SETUP = {"stages": 64, "micro_batches": 256, "chunks": 4, "schedule": "interleaved"}
OFFLOAD = {"recompute": (*MODES, "offload"), "host_bandwidth": 25.0}

# name: (config fields, balance keywords)
LEVERS: dict[str, tuple[dict, dict]] = {
    "plain": ({"memory_budget": 56000}, {}),
    "per_micro_batch": ({"memory_budget": 56000}, {"per_micro_batch": True}),
    "offload": ({"memory_budget": 56000, **OFFLOAD}, {}),
    "offload_tight": ({"memory_budget": 30000, **OFFLOAD}, {}),
    "oom_risk": ({"memory_budget": 56000}, {"oom_risk": 0.01, "memory_error": 0.02}),
    "margin_per_micro_batch": ({"memory_budget": 56000}, {"memory_margin": 2000, "per_micro_batch": True}),
    "deterministic": ({"memory_budget": 56000}, {"deterministic": True}),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--limit", type=float, default=5.0, help="time_limit in seconds")
    parser.add_argument("--only", default=",".join(LEVERS), help="comma-separated levers")
    args = parser.parse_args()
    profile = llama_layers(256)
    print(f"time-limit promise at 64 x 256 x 4 interleaved (llama, 256 layers), time_limit={args.limit:g} s")
    print(f"{'lever':<24} {'wall s':>7} {'excess s':>8}  status     step ms")
    worst = 0.0
    for name in args.only.split(","):
        fields, keywords = LEVERS[name]
        config = sapptk.PipelineConfig(**SETUP, **fields)
        began = time.perf_counter()
        plan = sapptk.balance(profile, config, time_limit=args.limit, **keywords)
        wall = time.perf_counter() - began
        worst = max(worst, wall - args.limit)
        step = "-" if plan.step_time is None else f"{plan.step_time:,.0f}"
        print(f"{name:<24} {wall:7.2f} {wall - args.limit:+8.2f}  {plan.status:<10} {step}", flush=True)
    print(f"largest excess over the limit: {worst:+.2f} s (promise: at most +1 s)")


if __name__ == "__main__":
    main()
