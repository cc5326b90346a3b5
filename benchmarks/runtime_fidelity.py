"""Simulated against a real run: sapptk's step time beside PyTorch's pipeline runtime on CPU.

Needs the ``runtimes`` extra (torch). For every schedule PyTorch runs (sapptk's orders of
``SCHEDULES``, exported as schedule CSVs and loaded by ``_PipelineScheduleRuntime``) at p = 2
and m in {4, 8, 16}, two gloo processes on 127.0.0.1 (one thread each) run a compute-bound
float32 model (one 512-wide linear layer + tanh per virtual stage, 128 rows per
micro-batch) for ``--warmup`` steps, then ``--steps`` profiled steps. Each rank records its own
``torch.profiler`` trace with a range around every stage call (``sapptk:F:<stage>:<mb>``, ...)
and every wait for a neighbour (``sapptk:wait``). The measured step is the median over the
profiled steps of the slower rank's wall time. The costs come from that run's own trace
(:mod:`sapptk.calibration.runtime_ops`): medians per op kind and virtual stage, and the
runtime's per-op overhead fitted from the gaps between ops that are not waits. sapptk
simulates the same program with those costs (``comm=0``: p2p on one machine is negligible),
without and with the overhead::

    python benchmarks/runtime_fidelity.py [--steps 10] [--out DIR]

It prints one row per run and the mean and worst |simulated − measured| / measured. Timings
on a shared machine are noisy: say so where you record them.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved-zb", 2), ("zb-h1", 1), ("zb-v", 2),
             ("dualpipe-v", 2))
MICRO_BATCHES = (4, 8, 16)
STAGES = 2
WIDTH, ROWS = 512, 128


# ------------------------------------------------------------------------------ worker
def _worker(cases_path: str, out_dir: str, rank: int, port: int, warmup: int, steps: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as S
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    dist.init_process_group("gloo", rank=rank, world_size=STAGES)
    wait = S._wait_batch_p2p

    def timed_wait(*args, **kwargs):
        with record_function("sapptk:wait"):
            return wait(*args, **kwargs)

    S._wait_batch_p2p = timed_wait  # the runtime's waits for neighbours, as ranges
    out = Path(out_dir)
    results = {}
    for case in json.loads(Path(cases_path).read_text(encoding="utf-8")):
        torch.manual_seed(0)
        n = len(case["placement"])
        mine = [vs for vs in range(n) if case["placement"][vs] == rank]
        stages = []
        for vs in mine:
            stage = PipelineStage(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh()), vs, n, torch.device("cpu"))
            for method, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", None),
                                 ("backward_weight_one_chunk", "W")):
                inner = getattr(stage, method)

                def wrapped(mb, *args, _inner=inner, _kind=kind, _vs=vs, **kwargs):
                    k = _kind or ("B" if kwargs.get("full_backward", True) else "I")
                    with record_function(f"sapptk:{k}:{_vs}:{mb}"):
                        return _inner(mb, *args, **kwargs)

                setattr(stage, method, wrapped)
            stages.append(stage)
        schedule = S._PipelineScheduleRuntime(stages, n_microbatches=case["m"],
                                              loss_fn=lambda y, t: ((y - t) ** 2).sum())
        schedule._load_csv(case["csv"])
        x = torch.randn(case["m"] * ROWS, WIDTH)
        y = torch.randn(case["m"] * ROWS, WIDTH)

        def step(schedule=schedule, mine=mine, n=n, x=x, y=y):
            kwargs = {"target": y, "losses": []} if n - 1 in mine else {}
            if 0 in mine:
                schedule.step(x, **kwargs)
            else:
                schedule.step(**kwargs)

        for _ in range(warmup):
            step()
        wall = []
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for i in range(steps):
                dist.barrier()
                start = time.perf_counter()
                with record_function(f"ProfilerStep#{i}"):
                    step()
                elapsed = torch.tensor([time.perf_counter() - start])
                dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slower rank's step
                wall.append(float(elapsed) * 1e3)
        trace = out / f"{case['id']}_rank{rank}.json"
        prof.export_chrome_trace(str(trace))
        results[case["id"]] = {"wall_ms": wall, "trace": str(trace)}
        dist.barrier()
    (out / f"rank{rank}.json").write_text(json.dumps(results), encoding="utf-8")
    dist.destroy_process_group()


# ------------------------------------------------------------------------------ driver
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _merged_trace(paths: list[str], out: Path):
    """The ranks' traces as one (each rank its own pid), read by sapptk's trace reader."""
    from sapptk.formats.chrome_trace import read_trace

    events = []
    for rank, path in enumerate(paths):
        for e in json.loads(Path(path).read_text(encoding="utf-8"))["traceEvents"]:
            if e.get("ph") == "X":
                events.append({**e, "pid": rank, "tid": 0})
    out.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    return read_trace(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep the traces there")
    parser.add_argument("--timeout", type=float, default=1200.0)
    args = parser.parse_args()

    from sapptk.calibration.runtime_ops import op_overhead, op_samples, stage_costs
    from sapptk.schedules import build
    from sapptk.simulation import simulate

    out = args.out or Path(tempfile.mkdtemp(prefix="sapptk_fidelity_"))
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, v in SCHEDULES:
        for m in MICRO_BATCHES:
            program = build(name, stages=STAGES, micro_batches=m, chunks=v)
            path = out / f"{name}_m{m}.csv"
            program.to_csv(path)
            cases.append({"id": f"{name}_m{m}", "name": name, "m": m, "v": v, "csv": str(path),
                          "placement": [int(d) for d in program.placement]})
    (out / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(out / "cases.json"), str(out), str(r),
                               str(port), str(args.warmup), str(args.steps)], env=env) for r in range(STAGES)]
    deadline = time.monotonic() + args.timeout
    try:
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                raise SystemExit("runtime_fidelity: a worker failed or timed out")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()
    ranks = [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(STAGES)]
    print(f"{'schedule':<16}{'m':>4}{'measured ms':>13}{'simulated':>11}{'error':>8}{'overhead ms/op':>16}"
          f"{'with overhead':>15}{'error':>8}")
    errors, errors_overhead = [], []
    for case in cases:
        key = case["id"]
        wall = sorted(ranks[0][key]["wall_ms"])
        measured = wall[len(wall) // 2]
        trace = _merged_trace([ranks[r][key]["trace"] for r in range(STAGES)], out / f"{key}_merged.json")
        ops = op_samples(trace)
        overhead, _ = op_overhead(trace, ops)
        program = build(case["name"], stages=STAGES, micro_batches=case["m"], chunks=case["v"])
        sims = []
        for extra in (0.0, max(overhead, 0.0)):
            costs = stage_costs(ops, program.num_virtual_stages, overhead=extra)
            sims.append(simulate(program, **costs).step_time)
        e0, e1 = (sims[0] - measured) / measured, (sims[1] - measured) / measured
        errors.append(abs(e0))
        errors_overhead.append(abs(e1))
        print(f"{case['name']:<16}{case['m']:>4}{measured:>13.1f}{sims[0]:>11.1f}{e0:>+8.1%}{overhead:>16.3f}"
              f"{sims[1]:>15.1f}{e1:>+8.1%}")
    print(f"mean |error|: {sum(errors) / len(errors):.1%} (worst {max(errors):.1%}) with the ops' own durations; "
          f"{sum(errors_overhead) / len(errors_overhead):.1%} (worst {max(errors_overhead):.1%}) with the fitted "
          f"per-op overhead; {len(cases)} runs, {args.steps} steps each; traces in {out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        _worker(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]))
    else:
        main()
