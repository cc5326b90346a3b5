"""The sweep's whole time limit: ``sweep(..., time_limit=T)`` returns within about T + 1 s.

Sixteen hard points of Llama-2 70B (8 and 16 stages, 32 micro-batches, interleaved and zb-v
with 2 chunks, four budgets), each allowed ``point_time_limit=4`` s, far more than T leaves:
the points not started are ``not_started`` rows, a point started near the deadline gets what
is left. The first call of the process pays the solver's import inside the limit. Serial and
a local process pool, T = 5 and 12 s; the wall time, its excess over T, and the statuses are
printed. Figures depend on the machine's load: say so where you record them::

    python benchmarks/sweep_time_limit.py
"""

from __future__ import annotations

import time
import warnings

import sapptk
from sapptk.profile import bundled_profile

GRID = {"stages": [8, 16], "micro_batches": [32], "chunks": [2], "schedule": ["interleaved", "zb-v"],
        "memory_budget": [52000, 56000, 60000, 64000]}


def main() -> None:
    warnings.simplefilter("ignore")
    profile = bundled_profile("llama2_70b")
    print("executor   time_limit_s  wall_s  excess_s  statuses")
    for executor in ("serial", "processes"):
        for whole in (5.0, 12.0):
            t = time.perf_counter()
            frame = sapptk.sweep(profile, GRID, executor=executor, time_limit=whole, point_time_limit=4,
                                 progress=False)
            wall = time.perf_counter() - t
            counts = frame["status"].astype(str).value_counts()
            print(f"{executor:10} {whole:12g} {wall:7.2f} {wall - whole:+9.2f}  "
                  + ", ".join(f"{n} {s}" for s, n in counts.items()))


if __name__ == "__main__":
    main()
