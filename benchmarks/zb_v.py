"""ZB-V orders compared: PyTorch's fixed order (``zb-v``) against the list schedule
(``zb-v-greedy``) built at unit costs and at the costs it is run with.

Run: python benchmarks/zb_v.py [--balance]

Prints simulated step times (no timing: these are exact figures of the simulator) for
uniform per-stage costs F, I (input gradient), W, no communication, and with a latency;
then, with ``--balance``, the balanced llama2_70b plan for each order (p = 4, m = 8, 2
chunks, 30 s per solve), where zb-v-greedy is re-ordered at the plan's costs.
"""

from __future__ import annotations

import argparse

from sapptk.schedules import OpCosts, build
from sapptk.simulation import simulate

CASES = [(4, 4), (4, 6), (4, 8), (4, 16), (8, 8), (8, 12), (8, 16), (8, 32)]
COSTS = [(1.0, 1.0, 1.0, 0.0), (1.0, 2.0, 1.0, 0.0), (1.0, 2.0, 0.5, 0.0), (1.0, 1.5, 1.0, 0.2)]


def table() -> None:
    print(f"{'p':>2} {'m':>3}  {'F, I, W, comm':<18} {'zb-v':>7} {'greedy(unit)':>12} {'greedy(costs)':>13} "
          f"{'greedy(unit)/zb-v':>17} {'greedy(costs)/zb-v':>18}")
    for p, m in CASES:
        torch_order = build("zb-v", stages=p, micro_batches=m, chunks=2)
        unit = build("zb-v-greedy", stages=p, micro_batches=m, chunks=2)
        for f, i, w, comm in COSTS:
            fitted = build("zb-v-greedy", stages=p, micro_batches=m, chunks=2,
                           costs=OpCosts.uniform(2 * p, f, i, w, comm))
            t_torch, t_unit, t_fit = (simulate(x, forward=f, backward=i, weight=w, comm=comm).step_time
                                      for x in (torch_order, unit, fitted))
            print(f"{p:>2} {m:>3}  {f:g}, {i:g}, {w:g}, {comm:g}{'':<{18 - len(f'{f:g}, {i:g}, {w:g}, {comm:g}')}} "
                  f"{t_torch:7.1f} {t_unit:12.1f} {t_fit:13.1f} {t_unit / t_torch:17.3f} {t_fit / t_torch:18.3f}")


def balanced() -> None:
    import sapptk

    profile = sapptk.bundled_profile("llama2_70b")
    print("\nllama2_70b, p = 4, m = 8, v = 2, 30 s per balance:")
    for schedule in ("zb-v", "zb-v-greedy"):
        plan = sapptk.balance(profile, sapptk.PipelineConfig(4, 8, 2, schedule), time_limit=30)
        print(f"  {schedule:<12} {plan.status:<9} step {plan.step_time:10.1f} ms  gap {plan.gap or 0:.2%}  "
              f"{plan.source}: {plan.message.split('; ')[-1]}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--balance", action="store_true", help="also balance llama2_70b with each order (~2 min)")
    args = parser.parse_args()
    table()
    if args.balance:
        balanced()
