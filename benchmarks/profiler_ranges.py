"""The profiler's own cost: a layer's time without the profiler, under it, and with a range per layer.

Needs torch (the ``runtimes`` or ``fixtures`` extra). A stack of ``--layers`` MLP layers
(``--width`` → 4·width → width, GELU, ``--rows`` rows, float32, one thread) runs forward and
backward in three configurations, interleaved round by round so that a shared machine's load
falls on all three alike:

* ``plain``: no profiler;
* ``profiler``: inside ``torch.profiler.profile(activities=[CPU])``, no ranges of ours;
* ``ranges``: the same, plus a ``record_function`` range around each layer's forward (what
  sapptk's trace reader asks for, ``docs/calibration.md``).

and, to see a range's own cost without a layer's noise around it, ``--empty`` empty
``record_function`` ranges in a row under the profiler (CPU µs per range, median of rounds).

It prints the median ms per layer (forward + backward) of each and the ratios ranges/profiler
(the ranges' own cost) and profiler/plain (the profiler's)::

    python benchmarks/profiler_ranges.py [--rounds 30] [--width 512] [--rows 32] [--layers 8]

Times are the process's CPU time (``time.process_time``), so that other processes' load on
a shared machine does not enter them (their cache and memory traffic still does); the ratios
are medians over rounds of ratios within a round. Say the machine's load when you record them.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--iterations", type=int, default=3, help="steps per configuration and round")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--empty", type=int, default=2000, help="empty ranges per round")
    args = parser.parse_args()

    import torch
    from torch import nn
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    torch.manual_seed(0)
    w = args.width
    layers = nn.ModuleList(nn.Sequential(nn.Linear(w, 4 * w), nn.GELU(), nn.Linear(4 * w, w))
                           for _ in range(args.layers))
    x = torch.randn(args.rows, w)

    def step(ranges: bool) -> None:
        h = x
        for i, layer in enumerate(layers):
            with record_function(f"layer_{i}") if ranges else contextlib.nullcontext():
                h = layer(h)
        h.sum().backward()

    def timed(ranges: bool, profiled: bool) -> float:
        with profile(activities=[ProfilerActivity.CPU]) if profiled else contextlib.nullcontext():
            start = time.process_time()
            for _ in range(args.iterations):
                step(ranges)
            elapsed = time.process_time() - start
        return elapsed * 1e3 / (args.iterations * args.layers)

    configs = {"plain": (False, False), "profiler": (False, True), "ranges": (True, True)}
    for ranges, profiled in configs.values():  # warm-up: allocator, profiler start-up
        timed(ranges, profiled)
    samples: dict[str, list[float]] = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, (ranges, profiled) in configs.items():
            samples[name].append(timed(ranges, profiled))
    empty = []
    for _ in range(args.rounds):
        with profile(activities=[ProfilerActivity.CPU]):
            start = time.process_time()
            for _ in range(args.empty):
                with record_function("empty"):
                    pass
            empty.append((time.process_time() - start) * 1e6 / args.empty)
    med = {name: statistics.median(v) for name, v in samples.items()}
    ratio_ranges = statistics.median(r / p for r, p in zip(samples["ranges"], samples["profiler"], strict=True))
    ratio_profiler = statistics.median(p / q for p, q in zip(samples["profiler"], samples["plain"], strict=True))
    print(f"torch {torch.__version__}, 1 thread, {args.layers} layers {w} -> {4 * w} -> {w}, {args.rows} rows, "
          f"{args.rounds} rounds of {args.iterations} steps; load average {os.getloadavg()[0]:.1f}")
    for name in configs:
        print(f"{name:<9} {med[name]:8.3f} ms of CPU per layer (forward + backward)")
    per_range = statistics.median(r - p for r, p in zip(samples["ranges"], samples["profiler"], strict=True)) * 1e3
    print(f"ranges / profiler: {ratio_ranges:.4f} (the ranges' own cost: {ratio_ranges - 1:+.2%} per layer, "
          f"{per_range:.1f} µs per range)")
    print(f"profiler / plain:  {ratio_profiler:.4f} (the profiler's own cost: {ratio_profiler - 1:+.2%})")
    one = statistics.median(empty)
    print(f"an empty range under the profiler: {one:.1f} µs of CPU ({one / 4000:.2%} of a 4 ms layer)")


if __name__ == "__main__":
    main()
