"""Sensitivity benchmark: 1,000 perturbed profiles of the README plan, batched, against a
plain loop of ``simulate`` calls on the same perturbed costs (the baseline, run on a
subset and scaled per sample).

Run: ``.venv/bin/python benchmarks/sensitivity.py [--samples N] [--loop N]``

Prints the seconds of ``plan.sensitivity`` (both error models: 2 × N re-timings), the
seconds per sample of the plain loop, their ratio, and the largest difference between the
batched and the looped step times (they must agree).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from sapptk.config import PipelineConfig
from sapptk.plan import even_split
from sapptk.profile import bundled_profile
from sapptk.sensitivity import perturbed_costs
from sapptk.simulation import simulate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=1000)
    parser.add_argument("--loop", type=int, default=50, help="samples timed by the plain loop")
    args = parser.parse_args()
    profile = bundled_profile("llama2_70b")
    config = PipelineConfig(16, 32, 2, "interleaved", memory_budget=56000)
    plan = even_split(profile, config, "auto")
    plan.simulation  # noqa: B018 - build and compile the program outside the timings
    t0 = time.perf_counter()
    res = plan.sensitivity(samples=args.samples)
    batched = time.perf_counter() - t0
    costs = perturbed_costs(plan, time_error=0.05, memory_error=0.02, samples=args.samples,
                            perturbation="independent", seed=0)
    t0 = time.perf_counter()
    looped = []
    for s in range(args.loop):
        sim = simulate(config.program(), forward=costs.forward[s], backward=costs.backward[s],
                       weight=costs.weight[s], activation=costs.activation[s], params=costs.params[s],
                       comm=plan.costs.comm, constant=plan.costs.constant)
        looped.append(sim.step_time)
    per_sample = (time.perf_counter() - t0) / args.loop
    got = res.samples[(res.samples.perturbation == "independent") & (res.samples.device == 0)]
    diff = float(np.max(np.abs(got.step_time_ms.to_numpy()[: args.loop] - np.asarray(looped))))
    n = 2 * args.samples
    print(f"plan: {plan.source}, {config.schedule} p={config.stages} v={config.chunks} m={config.micro_batches}")
    print(f"batched sensitivity: {n} re-timings in {batched:.2f} s ({batched / n * 1e3:.2f} ms each)")
    print(f"plain simulate loop: {per_sample * 1e3:.2f} ms each -> {n} would take {per_sample * n:.1f} s")
    print(f"speed-up: {per_sample * n / batched:.1f}x; largest step-time difference {diff:.3g} ms")


if __name__ == "__main__":
    main()
