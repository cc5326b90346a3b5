"""Simulated against a real run: sapptk's step time beside PyTorch's pipeline runtime on CPU.

Needs the ``runtimes`` extra (torch). For every schedule PyTorch runs (sapptk's orders of
``SCHEDULES``, exported as schedule CSVs and loaded by ``_PipelineScheduleRuntime``) at p = 2
and m in {4, 8, 16}, two gloo processes on 127.0.0.1 (one thread each) run a compute-bound
float32 model (one 512-wide linear layer + tanh per virtual stage, 128 rows per
micro-batch) for ``--warmup`` steps, ``--steps`` steps without the profiler, then ``--steps``
profiled steps. Each rank records its own ``torch.profiler`` trace with a range around every
stage call (``sapptk:F:<stage>:<mb>``, ...) and every wait for a neighbour (``sapptk:wait``).
The ranks run with ``MALLOC_MMAP_THRESHOLD_`` at 32 MiB and ``MALLOC_TRIM_THRESHOLD_`` at
1 GiB (``--malloc heap``): under glibc's default every weight-gradient buffer above the mmap
threshold is a fresh ``mmap`` that page-faults on first touch, and once that threshold is set
by hand glibc returns the heap's top to the kernel whenever more than 128 KiB are free there,
so every step page-faults afresh what it keeps in flight (GPipe's m activations, the last
stage's ``torch.cat`` of its m outputs): about 0.15 ms per 256 KiB micro-batch, and GPipe
1.6 times 1F1B's step at m = 8 where the time model has them equal. A GPU run's caching
allocator keeps its memory the same way. ``--malloc default`` leaves the environment alone.

On a machine shared with other work, ``--priority N`` (Linux, root) starts each rank in a
session of its own and sets that session's autogroup nice to N (for example −10): with the
kernel's autogroup scheduling, a process's own nice only orders it within its session, so a
plain ``nice`` does nothing against other sessions' load. The ranks then take the cores
before the rest of the machine while they run (about a minute for the whole benchmark).

The measured step is the median over the profiled steps of the slower rank's wall time. The
costs come from that run's own trace (:mod:`sapptk.calibration.runtime_ops`), two ways:

* ``ops only``: the median duration per op kind and virtual stage, nothing else (what a
  profile of the layers alone gives);
* ``fitted``: the mean per op kind and virtual stage, plus the runtime's terms fitted from
  the trace's gaps (:func:`~sapptk.calibration.runtime_ops.fit_runtime`): a per-op
  ``overhead`` in every op's cost, ``comm`` (the lag across devices beyond it) and the step's
  work outside its ops (``step_ms``, added to the simulated step);
* ``replay``: each profiled step simulated with its own op durations and the fitted terms
  (the median over steps): what is left is the time model's own error.

::

    python benchmarks/runtime_fidelity.py [--steps 10] [--out DIR] [--schedules gpipe,1f1b] [--malloc heap]
        [--priority -10]
    python benchmarks/runtime_fidelity.py --analyse DIR   # the tables again from a kept run, no new run
    python benchmarks/runtime_fidelity.py --predict [--fit-on 1f1b:8,zb-h1:8] [--across median] [--analyse DIR]

``--predict`` predicts runs from other runs' costs: fitted on the ``--fit-on`` runs
(pooled: the mean op per kind with a term of its own for the first virtual stage, whose
input needs no gradient; one layer per virtual stage; the mean overhead, comm and step
work), every other schedule and micro-batch count; and leave-one-schedule-out (each
schedule's runs from the costs of all the others). It writes ``predict_cross.csv`` and ``predict_loso.csv``.

It prints one row per run and the mean and worst |simulated − measured| / measured, and writes
``summary.csv`` in the output folder. Timings on a shared machine are noisy: say so (and the
load average, printed) where you record them.
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
MMAP_THRESHOLD = str(32 * 1024 * 1024)  # glibc takes at most HEAP_MAX_SIZE / 2 = 32 MiB on 64-bit
TRIM_THRESHOLD = str(1024 * 1024 * 1024)  # keep the heap's top: no page faults on every step


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

        def timed(name=None):
            dist.barrier()
            start = time.perf_counter()
            if name is None:
                step()
            else:
                with record_function(name):
                    step()
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slower rank's step
            return float(elapsed) * 1e3

        for _ in range(warmup):
            step()
        plain = [timed() for _ in range(steps)]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            wall = [timed(f"ProfilerStep#{i}") for i in range(steps)]
        trace = out / f"{case['id']}_rank{rank}.json"
        prof.export_chrome_trace(str(trace))
        results[case["id"]] = {"wall_ms": wall, "unprofiled_ms": plain, "trace": str(trace)}
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
    from sapptk.trials.ingesting import merge_rank_traces

    return merge_rank_traces([Path(p) for p in paths], out)


def _run(out: Path, cases: list[dict], args: argparse.Namespace) -> None:
    """Run the two workers over ``cases``; their results land in ``out/rank<r>.json``."""
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if args.malloc == "heap":
        env.update(MALLOC_MMAP_THRESHOLD_=MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD_=TRIM_THRESHOLD)
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(out / "cases.json"), str(out), str(r),
                               str(port), str(args.warmup), str(args.steps)], env=env,
                              start_new_session=getattr(args, "priority", None) is not None) for r in range(STAGES)]
    deadline = time.monotonic() + args.timeout
    try:
        if getattr(args, "priority", None) is not None:
            for p in procs:
                _set_autogroup_nice(p.pid, args.priority)
        while any(p.poll() is None for p in procs):
            if any(p.returncode not in (None, 0) for p in procs) or time.monotonic() > deadline:
                raise SystemExit("runtime_fidelity: a worker failed or timed out")
            time.sleep(0.2)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait()


def _set_autogroup_nice(pid: int, nice: int) -> None:
    """The nice of ``pid``'s session autogroup (what orders it against other sessions)."""
    try:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice), encoding="utf-8")
    except OSError as exc:
        raise SystemExit(f"--priority {nice}: cannot set the ranks' autogroup nice ({exc}); it needs Linux with "
                         "autogroup scheduling and root for a negative value; run without --priority") from None


def _median(values: list[float]) -> float:
    import numpy as np

    return float(np.median(values))


def analyse(out: Path) -> list[dict]:
    """One row per run of a kept output folder: measured and simulated steps, the fitted terms."""
    import numpy as np

    from sapptk.calibration.runtime_ops import fit_runtime, op_costs, op_samples, stage_costs, step_costs
    from sapptk.schedules import build
    from sapptk.simulation import simulate

    cases = json.loads((out / "cases.json").read_text(encoding="utf-8"))
    ranks = [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(STAGES)]
    rows = []
    for case in cases:
        key = case["id"]
        if key not in ranks[0]:
            continue
        merged = out / f"{key}_merged.json"
        trace = _merged_trace([str(out / f"{key}_rank{r}.json") for r in range(STAGES)], merged)
        ops = op_samples(trace)
        program = build(case["name"], stages=STAGES, micro_batches=case["m"], chunks=case["v"])
        fit = fit_runtime(program, ops, trace)
        measured = _median(ranks[0][key]["wall_ms"])
        ops_only = simulate(program, **stage_costs(ops, program.num_virtual_stages)).step_time
        fitted = simulate(program, **op_costs(program, ops, overhead=fit.overhead), comm=fit.comm).step_time
        replay = [simulate(program, **step_costs(program, ops, s, overhead=fit.overhead), comm=fit.comm).step_time
                  for s in sorted(int(x) for x in ops["step"].unique())]
        row = {"schedule": case["name"], "m": case["m"], "measured_ms": measured,
               "unprofiled_ms": _median(ranks[0][key].get("unprofiled_ms") or [np.nan]),
               "ops_only_ms": ops_only, "overhead_ms": fit.overhead, "comm_ms": fit.comm, "step_ms": fit.step_ms,
               "fitted_ms": fitted + fit.step_ms, "replay_ms": _median(replay) + fit.step_ms}
        for name in ("ops_only", "fitted", "replay"):
            row[f"{name}_error"] = (row[f"{name}_ms"] - measured) / measured
        for kind in "FBIW":
            row[f"gap_after_{kind}_ms"] = fit.overhead_by_kind.get(kind, np.nan)
        rows.append(row)
    return rows


def _case_fits(out: Path) -> list[dict]:
    """Per run of a kept folder: the case, its measured step, its ops (one layer per virtual
    stage) and its RuntimeFit."""
    from sapptk.calibration.runtime_ops import fit_runtime, op_samples
    from sapptk.schedules import build

    cases = json.loads((out / "cases.json").read_text(encoding="utf-8"))
    ranks = [json.loads((out / f"rank{r}.json").read_text(encoding="utf-8")) for r in range(STAGES)]
    done = []
    for case in cases:
        if case["id"] not in ranks[0]:
            continue
        trace = _merged_trace([str(out / f"{case['id']}_rank{r}.json") for r in range(STAGES)],
                              out / f"{case['id']}_merged.json")
        ops = op_samples(trace)
        program = build(case["name"], stages=STAGES, micro_batches=case["m"], chunks=case["v"])
        done.append({**case, "measured_ms": _median(ranks[0][case["id"]]["wall_ms"]), "program": program,
                     "ops": ops.assign(layers=1), "fit": fit_runtime(program, ops, trace)})
    return done


def predict(out: Path, fit_on: list[tuple[str, int]], across: str = "mean") -> tuple[list[dict], list[dict]]:
    """Cross-run prediction from a kept folder: (rows fitted on the ``fit_on`` runs and predicting
    every other run, rows of leave-one-schedule-out: each schedule's runs predicted from the
    costs of every other schedule's runs). The costs are pooled over the fitted runs
    (:meth:`sapptk.trials.Calibrated.from_fits`: the mean op per kind with its first-stage term, the mean overhead, comm
    and step work; a split backward never fitted is costed as half the whole one)."""
    from sapptk.trials.ingesting import Calibrated

    runs = _case_fits(out)

    def rows_for(train: list[dict], test: list[dict], split: str) -> list[dict]:
        cal = Calibrated.from_fits([r["ops"] for r in train], [r["fit"] for r in train], across=across)
        rows = []
        for r in test:
            value = cal.predict(r["name"], STAGES, r["v"], r["m"], [1] * r["program"].num_virtual_stages)
            rows.append({"split": split, "schedule": r["name"], "m": r["m"], "measured_ms": r["measured_ms"],
                         "predicted_ms": value, "error": (value - r["measured_ms"]) / r["measured_ms"]})
        return rows

    wanted = set(fit_on)
    train = [r for r in runs if (r["name"], r["m"]) in wanted]
    missing = wanted - {(r["name"], r["m"]) for r in train}
    if missing:
        raise SystemExit(f"--fit-on: no kept run of {sorted(missing)} in {out}")
    label = "+".join(f"{n}@m{m}" for n, m in fit_on)
    cross = rows_for(train, [r for r in runs if (r["name"], r["m"]) not in wanted], f"fit on {label}")
    loso = []
    for name in dict.fromkeys(r["name"] for r in runs):
        loso += rows_for([r for r in runs if r["name"] != name], [r for r in runs if r["name"] == name],
                         f"without {name}")
    return cross, loso


def _report_predict(cross: list[dict], loso: list[dict], out: Path) -> None:
    import pandas as pd

    for title, rows, name in (("cross-run", cross, "predict_cross.csv"), ("leave one schedule out", loso,
                                                                          "predict_loso.csv")):
        frame = pd.DataFrame(rows)
        frame.to_csv(out / name, index=False)
        print(f"-- {title}: {frame['split'].iloc[0] if title == 'cross-run' else 'each schedule from the others'}")
        print(f"{'schedule':<16}{'m':>4}{'measured':>10}{'predicted':>11}{'error':>8}   (ms)")
        for r in rows:
            print(f"{r['schedule']:<16}{r['m']:>4}{r['measured_ms']:>10.1f}{r['predicted_ms']:>11.1f}"
                  f"{r['error']:>+8.1%}")
        err = frame["error"].abs()
        print(f"mean |error| {err.mean():.1%}, worst {err.max():.1%} over {len(frame)} runs ({title})")
    print(f"load average now {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def _report(rows: list[dict], out: Path) -> None:
    import pandas as pd

    frame = pd.DataFrame(rows)
    frame.to_csv(out / "summary.csv", index=False)
    print(f"{'schedule':<16}{'m':>4}{'measured':>10}{'unprof.':>9}{'ops only':>10}{'error':>8}{'overhead':>10}"
          f"{'comm':>7}{'step':>7}{'fitted':>9}{'error':>8}{'replay':>9}{'error':>8}   (ms)")
    for r in rows:
        print(f"{r['schedule']:<16}{r['m']:>4}{r['measured_ms']:>10.1f}{r['unprofiled_ms']:>9.1f}"
              f"{r['ops_only_ms']:>10.1f}{r['ops_only_error']:>+8.1%}{r['overhead_ms']:>10.3f}{r['comm_ms']:>7.3f}"
              f"{r['step_ms']:>7.2f}{r['fitted_ms']:>9.1f}{r['fitted_error']:>+8.1%}{r['replay_ms']:>9.1f}"
              f"{r['replay_error']:>+8.1%}")
    for name, label in (("ops_only", "the ops' median durations alone"),
                        ("fitted", "mean op costs + fitted overhead, comm and step work"),
                        ("replay", "each step replayed with its own op durations + the fitted terms")):
        err = frame[f"{name}_error"].abs()
        print(f"mean |error| {err.mean():.1%} (worst {err.max():.1%}): {label}")
    print(f"{len(rows)} runs; summary.csv and the traces in {out}; load average now {os.getloadavg()[0]:.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="keep the traces there")
    parser.add_argument("--timeout", type=float, default=1200.0)
    parser.add_argument("--schedules", default=",".join(name for name, _ in SCHEDULES),
                        help="comma-separated subset of the schedules")
    parser.add_argument("--micro-batches", default=",".join(map(str, MICRO_BATCHES)), help="comma-separated m")
    parser.add_argument("--malloc", choices=("heap", "default"), default="heap",
                        help="heap: MALLOC_MMAP_THRESHOLD_=32 MiB in the ranks; default: glibc's own")
    parser.add_argument("--priority", type=int, default=None, metavar="N",
                        help="run each rank in a session of its own at autogroup nice N (e.g. -10; Linux, root for "
                             "N < 0): on a shared machine the ranks then come before other sessions' work")
    parser.add_argument("--analyse", type=Path, default=None, metavar="DIR",
                        help="print the tables of a kept output folder again, without running")
    parser.add_argument("--predict", action="store_true",
                        help="also predict each run from the costs of other runs (--fit-on; leave-one-schedule-out)")
    parser.add_argument("--fit-on", default="1f1b:8,zb-h1:8",
                        help="the runs --predict fits on, as schedule:m pairs (default 1f1b:8,zb-h1:8)")
    parser.add_argument("--across", choices=("mean", "median"), default="mean",
                        help="--predict pools the fitted runs' terms by their mean (weighted by ops) or median")
    args = parser.parse_args()

    from sapptk.schedules import build

    fit_on = [(p.split(":")[0].strip(), int(p.split(":")[1])) for p in args.fit_on.split(",") if p.strip()]
    if args.analyse is not None:
        _report(analyse(args.analyse), args.analyse)
        if args.predict:
            _report_predict(*predict(args.analyse, fit_on, args.across), args.analyse)
        return
    chunks = dict(SCHEDULES)
    names = [n.strip() for n in args.schedules.split(",") if n.strip()]
    unknown = sorted(set(names) - set(chunks))
    if unknown:
        raise SystemExit(f"--schedules: unknown {unknown}; expected some of {sorted(chunks)}")
    counts = [int(m) for m in args.micro_batches.split(",") if m.strip()]
    out = args.out or Path(tempfile.mkdtemp(prefix="sapptk_fidelity_"))
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for name in names:
        for m in counts:
            program = build(name, stages=STAGES, micro_batches=m, chunks=chunks[name])
            path = out / f"{name}_m{m}.csv"
            program.to_csv(path)
            cases.append({"id": f"{name}_m{m}", "name": name, "m": m, "v": chunks[name], "csv": str(path),
                          "placement": [int(d) for d in program.placement]})
    (out / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    if args.priority is not None and not -20 <= args.priority <= 19:
        raise SystemExit(f"--priority {args.priority}: expected a nice value in -20..19")
    print(f"load average before the run: {' '.join(f'{x:.1f}' for x in os.getloadavg())}; MALLOC_MMAP_THRESHOLD_ "
          f"{MMAP_THRESHOLD if args.malloc == 'heap' else 'unset'}, MALLOC_TRIM_THRESHOLD_ "
          f"{TRIM_THRESHOLD if args.malloc == 'heap' else 'unset'}; ranks at autogroup nice "
          f"{args.priority if args.priority is not None else '(not set)'}", flush=True)
    _run(out, cases, args)
    _report(analyse(out), out)
    if args.predict:
        _report_predict(*predict(out, fit_on, args.across), out)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        a = sys.argv[2:]
        _worker(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), int(a[5]))
    else:
        main()
