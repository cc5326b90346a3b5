"""Sweep throughput: points per minute of a 48-point grid under each executor.

Run: python benchmarks/sweep.py [--profile demo] [--point-time-limit 10]

The grid (demo profile): stages 4 and 8 × micro-batches 8 and 16 × three schedule
shapes (1f1b, interleaved v=2, less-memory interleaved v=2) × four memory budgets = 48
points, every one a real CP-SAT solve followed by a simulation. Each executor runs the
same grid from scratch (no cache):

* ``serial``: one solve at a time, CP-SAT using every core;
* ``processes``: a process pool of one process per core, one CP-SAT worker each
  (pool start-up included);
* ``dask``: a ``distributed.LocalCluster`` with one single-threaded worker process per
  core, one CP-SAT worker per solve (cluster start-up excluded, printed separately).

The serial run is the baseline: ``ratio`` is points/min relative to it. Statuses and
``step_vs_serial`` (mean step time relative to the serial run's, on points both solved)
are printed too: points that hit the time limit get a plan of lower quality with fewer
CP-SAT workers, and a faster executor that finds worse plans shows there.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import pandas as pd

from sapptk.profile import bundled_profile
from sapptk.sweeps import default_workers, sweep
from sapptk.sweeps.executors import available_cores

SHAPES = [("1f1b", 1), ("interleaved", 2), ("interleaved-lm", 2)]


def grid(budgets: list[float]) -> list[dict]:
    return [
        {"stages": p, "micro_batches": m, "schedule": s, "chunks": v, "memory_budget": b}
        for p in (4, 8)
        for m in (8, 16)
        for s, v in SHAPES
        for b in budgets
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="demo")
    parser.add_argument("--point-time-limit", type=float, default=5.0)
    parser.add_argument("--skip", nargs="*", default=[], help="executors to skip")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    profile = bundled_profile(args.profile)
    points = grid([90000.0, 110000.0, 130000.0, 160000.0])
    cores = available_cores()
    print(f"{len(points)} points, profile {profile.name}, time limit per point {args.point_time_limit:g} s, "
          f"{cores} cores (os.cpu_count() = {os.cpu_count()})")

    rows = []
    frames: dict[str, pd.DataFrame] = {}

    def run(name: str, executor, setup_s: float = 0.0) -> pd.DataFrame:
        t = time.perf_counter()
        frame = sweep(profile, points, executor=executor, point_time_limit=args.point_time_limit, progress=False)
        wall = time.perf_counter() - t
        statuses = frame["status"].value_counts()
        rows.append({
            "executor": name,
            "wall_s": round(wall, 1),
            "setup_s": round(setup_s, 1),
            "points_per_min": round(len(frame) / wall * 60, 1),
            "solve_s_sum": round(frame["solve_seconds"].sum(), 1),
            "statuses": ", ".join(f"{n} {s}" for s, n in statuses.items() if n),
        })
        frames[name] = frame
        if rows[1:]:  # plan quality against the serial run, on points both solved
            both = frame["step_time_ms"].notna() & base["step_time_ms"].notna()
            ratio = (frame.loc[both, "step_time_ms"] / base.loc[both, "step_time_ms"]).mean()
            rows[-1]["step_vs_serial"] = f"{ratio:.3f}"
        return frame

    base = run(f"serial ({default_workers(1)} CP-SAT workers)", "serial")
    if "processes" not in args.skip:
        run(f"processes ({cores} × {default_workers(cores)} worker)", "processes")
    if "dask" not in args.skip:
        from distributed import Client, LocalCluster

        t = time.perf_counter()
        with LocalCluster(n_workers=cores, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            setup = time.perf_counter() - t
            run(f"dask LocalCluster ({cores} × 1 thread)", client, setup)
    table = pd.DataFrame(rows)
    table.insert(4, "ratio", (table["points_per_min"] / table["points_per_min"].iloc[0]).round(2))
    print(table.fillna("").to_string(index=False))
    print("solve_s_sum: wall time of the solves themselves, summed over points")
    # points whose status differs from the serial run's (e.g. a time limit hit with fewer workers)
    cols = ["stages", "micro_batches", "schedule", "chunks", "memory_budget_mb", "status", "step_time_ms", "error"]
    for name, frame in list(frames.items())[1:]:
        diff = frame["status"].astype(str) != base["status"].astype(str)
        if diff.any():
            print(f"\n{name}: status differs from serial at {int(diff.sum())} point(s):")
            both = frame.loc[diff, cols].join(base.loc[diff, ["status", "step_time_ms"]], rsuffix="_serial")
            print(both.to_string(max_colwidth=120))


if __name__ == "__main__":
    main()
