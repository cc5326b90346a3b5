"""The sweep's process pool against the libraries that could replace it.

Run: python benchmarks/executors.py [--points 24] [--kill-solve 30]

Three ways to run a sweep's points in local processes, all through the same driver
(:func:`sapptk.sweep` accepts any :class:`concurrent.futures.Executor`), with stand-in
solves so that only the executor differs:

* ``processes``: sapptk's own (``sapptk.sweeps.executors``): the standard library's
  ``ProcessPoolExecutor`` on a fork server, plus a lifeline pipe, a kill switch and retries;
* ``stdlib``: a plain ``concurrent.futures.ProcessPoolExecutor`` (forkserver) handed to
  ``sweep``;
* ``loky``: ``loky.get_reusable_executor`` (joblib's process engine), if installed.

Measured, each in its own sweeping process:

1. **overhead**: wall time of a sweep of ``--points`` points whose solve sleeps 0.2 s, cold
   (the first sweep of the process: the pool starts) and warm (a second sweep), as a ratio
   to the serial sweep's time (``points × 0.2 s``);
2. **kill -9**: a sweep whose solves sleep ``--kill-solve`` s is killed with SIGKILL once
   its workers run; the seconds until every worker process has ended (capped at
   ``--kill-solve + 15``; "alive" means a worker outlived the cap);
3. **a crash**: one point's solve kills its worker process (``os._exit``) the first time it
   runs; how many of the sweep's rows come back as errors.

Timings are taken on whatever load the machine has: read the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the /proc walk the tests use
from support import descendants  # noqa: E402

BACKENDS = ("processes", "stdlib", "loky")

CHILD = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    from sapptk.profile import bundled_profile
    from sapptk.sweeps import sweep

    def executor_of(name):
        if name == "processes":
            return "processes"
        if name == "stdlib":
            import multiprocessing
            from concurrent.futures import ProcessPoolExecutor
            return ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("forkserver"))
        import loky
        return loky.get_reusable_executor(max_workers=2)

    def sleeping(task):
        marks = Path(task.profile_name)
        (marks / f"started-{task.request.config.micro_batches}-{os.getpid()}").touch()
        time.sleep(float(os.environ["SOLVE_SECONDS"]))
        return {"status": "optimal", "step_time_ms": 1.0}

    def crashing(task):
        marks = Path(task.profile_name)
        if task.request.config.micro_batches == 9 and not (marks / "crashed").exists():
            (marks / "crashed").touch()
            os._exit(3)
        time.sleep(0.2)
        return {"status": "optimal", "step_time_ms": 1.0}

    if __name__ == "__main__":
        backend, mode, marks, points = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
        grid = {"stages": [4], "micro_batches": list(range(8, 8 + points))}
        profiles = {marks: bundled_profile("demo")}
        solve = crashing if mode == "crash" else sleeping
        executor = executor_of(backend)
        times = []
        for _ in range(2 if mode == "overhead" else 1):
            t0 = time.perf_counter()
            frame = sweep(profiles, grid, solve=solve, executor=executor, workers=1, progress=False)
            times.append(time.perf_counter() - t0)
        errors = int(frame["status"].astype(str).eq("error").sum())
        print(" ".join(f"{t:.3f}" for t in times), errors, flush=True)
''')


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _run(script: Path, backend: str, mode: str, points: int, seconds: float) -> list[str]:
    with tempfile.TemporaryDirectory() as marks:
        env = {**os.environ, "SOLVE_SECONDS": str(seconds)}
        out = subprocess.run([sys.executable, str(script), backend, mode, marks, str(points)], env=env,
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            return ["failed: " + out.stderr.strip().splitlines()[-1]]
        return out.stdout.split()


def _kill(script: Path, backend: str, seconds: float) -> str:
    with tempfile.TemporaryDirectory() as marks:
        env = {**os.environ, "SOLVE_SECONDS": str(seconds)}
        proc = subprocess.Popen([sys.executable, str(script), backend, "kill", marks, "4"], env=env,
                                stderr=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        end = time.monotonic() + 120
        while len(list(Path(marks).glob("started-*"))) < 2 and time.monotonic() < end:
            time.sleep(0.05)
        workers = {int(m.name.rsplit("-", 1)[1]) for m in Path(marks).glob("started-*")}
        family = descendants(proc.pid) | workers
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        t0 = time.monotonic()
        cap = seconds + 15
        while any(_alive(p) for p in family) and time.monotonic() - t0 < cap:
            time.sleep(0.05)
        left = [p for p in family if _alive(p)]
        for p in left:  # the benchmark cleans up after the backends that do not
            os.kill(p, signal.SIGKILL)
        return f"alive after {cap:.0f} s ({len(left)} processes)" if left else f"{time.monotonic() - t0:.2f} s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, default=24)
    parser.add_argument("--kill-solve", type=float, default=30.0)
    parser.add_argument("--skip", nargs="*", default=[])
    args = parser.parse_args()
    try:
        import loky  # noqa: F401
    except ImportError:
        args.skip.append("loky")
    backends = [b for b in BACKENDS if b not in args.skip]
    serial = args.points * 0.2
    print(f"{os.cpu_count()} cores; {args.points} points of 0.2 s: serial {serial:.1f} s")
    print(f"{'backend':10} {'cold/serial':>12} {'warm/serial':>12} {'crash: error rows':>18}  kill -9: workers gone in")
    with tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "child.py"
        script.write_text(CHILD)
        for backend in backends:
            over = _run(script, backend, "overhead", args.points, 0.2)
            crash = _run(script, backend, "crash", args.points, 0.2)
            gone = _kill(script, backend, args.kill_solve)
            if len(over) < 3:
                print(f"{backend:10} {' '.join(over)}")
                continue
            cold, warm = float(over[0]) / serial, float(over[1]) / serial
            errors = crash[-1] if len(crash) >= 2 else " ".join(crash)
            print(f"{backend:10} {cold:12.2f} {warm:12.2f} {errors:>18}  {gone}", flush=True)


if __name__ == "__main__":
    main()
