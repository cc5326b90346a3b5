"""Program build, compile and simulation throughput, against the Op-list path in the same run.

Run: python benchmarks/simulate.py [--repeat 3]

For each case it prints, in seconds and as M ops/s (best of ``--repeat`` fresh programs):

* ``build``: the array builder alone (``build(...)`` with the compile left out);
* ``compile``: validation, dependency index, levels (``compile_graph``);
* ``first sim``: the first ``simulate`` of a fresh program, comm on (it also prepares the
  kernel's level sweep and the memory events, cached afterwards);
* ``repeat sim``: a later ``simulate`` of the same program, comm on;
* ``end to end``: build + compile + first simulate, the figure issue 11 asks >= 1 M ops/s of;
* ``Op lists``: the same program written op by op and given to ``make_program`` (Op objects,
  conversion to arrays, compile) and its first simulate, and ``x``: how many times faster the
  array path is end to end (both timed here, in this process, so machine load cancels out).

``OLD`` holds the figures of the same case before the array path (issue 11, measured the same
way on these machines): they cannot be rerun, so they are printed for comparison only.
"""

from __future__ import annotations

import argparse
import time
from unittest import mock

from sapptk.schedules import Program, build, make_program
from sapptk.schedules.graph import compile_graph
from sapptk.simulation import simulate

CASES = [
    ("interleaved", 64, 1024, 2, 1),
    ("interleaved", 16, 32, 2, 1),
    ("interleaved-lm", 32, 256, 4, 1),
    ("1f1b", 16, 32, 1, 1),
    ("seq1f1b", 8, 64, 1, 4),
]
OLD = {  # interleaved p=64 v=2 m=1024, before the array path
    "build + compile s": 2.3,
    "simulate s": 0.2,
    "end to end M ops/s": 0.1,
}
COMM = 0.05


def run(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def measure(name: str, p: int, m: int, v: int, k: int, repeat: int) -> dict[str, float]:
    best: dict[str, float] = {}

    def keep(key: str, seconds: float) -> None:
        best[key] = min(best.get(key, float("inf")), seconds)

    for _ in range(repeat):
        with mock.patch.object(Program, "validate", lambda self: None):  # the arrays alone
            arrays, unchecked = run(lambda: build(name, stages=p, micro_batches=m, chunks=v, splits=k))
        compiled, _ = run(lambda unchecked=unchecked: compile_graph(unchecked))
        built, program = run(lambda: build(name, stages=p, micro_batches=m, chunks=v, splits=k))
        first, _ = run(lambda program=program: simulate(program, forward=1.0, backward=2.0, comm=COMM))
        again, _ = run(lambda program=program: simulate(program, forward=1.0, backward=2.0, comm=COMM))
        keep("build", arrays)
        keep("compile", compiled)
        keep("first sim", first)
        keep("repeat sim", again)
        keep("end to end", built + first)
        # the Op-list path: every op an Op object, then make_program (arrays, compile), then simulate
        units_s, units = run(program.arrays.units)
        made, slow = run(lambda program=program, units=units: make_program(
            name, stages=p, micro_batches=m, chunks=v, splits=k, placement=program.placement, device_units=units))
        slow_first, _ = run(lambda slow=slow: simulate(slow, forward=1.0, backward=2.0, comm=COMM))
        keep("Op lists", units_s + made + slow_first)
    best["ops"] = program.num_ops
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=3, help="fresh programs per case; the best is printed")
    args = parser.parse_args()
    cols = ("build", "compile", "first sim", "repeat sim", "end to end", "Op lists")
    print(f"{'case':<34} {'ops':>8} " + " ".join(f"{c:>12}" for c in cols) + f" {'x':>6}")
    for name, p, m, v, k in CASES:
        res = measure(name, p, m, v, k, args.repeat)
        n = res["ops"]
        label = f"{name} p={p} v={v} m={m}" + (f" k={k}" if k > 1 else "")
        print(f"{label:<34} {n:>8} " + " ".join(f"{res[c]:>11.4f}s" for c in cols)
              + f" {res['Op lists'] / res['end to end']:>5.1f}x")
        print(f"{'  M ops/s':<34} {'':>8} " + " ".join(f"{n / res[c] / 1e6:>12.2f}" for c in cols))
    print("\nbefore the array path (issue 11), interleaved p=64 v=2 m=1024: "
          + ", ".join(f"{key} {value}" for key, value in OLD.items()))


if __name__ == "__main__":
    main()
