"""Simulator throughput: ops per second for a large and a typical program.

Run: python benchmarks/simulate.py

Prints, for each case, the time to build and compile the program (once per schedule
shape, then cached on the Program) and the time of one simulation, with and without
comm latency, as ops per second. The baseline is a plain-Python longest-path pass over
the same compiled graph in topological order (the obvious implementation), timed in the
same run; the ratio says how much the level-vectorised simulator gains over it.
"""

from __future__ import annotations

import time

import numpy as np

from sapptk.schedules import build
from sapptk.simulation import op_durations, unit_durations


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def python_longest_path(program, duration: np.ndarray, comm: float) -> float:
    """Baseline: one Python loop over units in topological order."""
    g = program.graph
    n = g.n_units
    preds = g.unit_preds.tolist()
    cross = g.unit_cross.tolist()
    dur = duration.tolist()
    end = [0.0] * (n + 1)
    for u in g.topo_order.tolist():
        s = 0.0
        for x, c in zip(preds[u], cross[u], strict=True):
            t = end[x] + (comm if c else 0.0)
            if t > s:
                s = t
        end[u] = s + dur[u]
    return max(end[:n])


def main() -> None:
    cases = [("interleaved", 64, 1024, 2), ("interleaved", 16, 32, 2), ("1f1b", 16, 32, 1)]
    print(f"{'case':<32} {'ops':>8} {'build+compile s':>16} {'comm':>5} {'simulate s':>11} "
          f"{'Mops/s':>7} {'baseline s':>11} {'speed-up':>9}")
    for name, p, m, v in cases:
        t = time.perf_counter()
        program = build(name, stages=p, micro_batches=m, chunks=v)
        build_s = time.perf_counter() - t
        n = program.num_ops
        for comm in (0.0, 0.05):
            sim_s = best_of(lambda comm=comm, program=program: program.simulate(1.0, 2.0, comm=comm))
            dur = unit_durations(program, op_durations(program, 1.0, 2.0))
            base_s = best_of(lambda comm=comm, program=program, dur=dur: python_longest_path(program, dur, comm))
            assert abs(python_longest_path(program, dur, comm) - program.simulate(1.0, 2.0, comm=comm).step_time) < 1e-6
            label = f"{name} p={p} v={v} m={m}"
            print(f"{label:<32} {n:>8} {build_s:>16.3f} {comm:>5} {sim_s:>11.4f} {n / sim_s / 1e6:>7.2f} "
                  f"{base_s:>11.4f} {base_s / sim_s:>8.1f}x")


if __name__ == "__main__":
    main()
