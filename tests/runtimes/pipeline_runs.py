"""Cases for the PyTorch runtime suite and the launcher of their gloo processes.

A case is one sapptk schedule at (p, m, v) with a small uneven partition: sapptk builds
the order and writes it as PyTorch's schedule CSV; ``torch_worker.py`` runs it on p
processes (gloo, 127.0.0.1 only). :func:`run_cases` starts the p processes once for all
cases of that p, waits at most ``timeout`` seconds, stops every process it started when one
fails or time runs out, and returns the results merged over the ranks.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from sapptk.errors import ScheduleError
from sapptk.formats.torchtitan import torch_schedule
from sapptk.schedules import build, registry

WORKER = Path(__file__).with_name("torch_worker.py")

STAGE_COUNTS = (2, 4)
MICRO_BATCHES = {2: (4, 5), 4: (6, 8)}  # with and without m mod p = 0
CHUNK_COUNTS = (1, 2, 3)
SCHEDULES = tuple(n for n in registry.names() if not registry.get(n).splits)  # PyTorch has no sequence slices


@dataclass(frozen=True)
class Case:
    """One schedule at (p, m, v) with ``layers`` body layers per virtual stage."""

    schedule: str
    stages: int
    micro_batches: int
    chunks: int
    layers: tuple[int, ...]
    placement: tuple[int, ...]
    torch_class: str | None
    seed: int
    same_order: tuple[str, ...] = ()  # other schedules with this very order at (p, m, v), run once here

    @property
    def id(self) -> str:
        return f"{self.schedule}-p{self.stages}-m{self.micro_batches}-v{self.chunks}"


def cases(stages: int) -> list[Case]:
    """Every schedule PyTorch can run (all of sapptk's but sequence slices) at this p, each
    distinct order once."""
    out: list[Case] = []
    seen: dict[str, int] = {}  # order -> case: an order equal to one already listed runs once
    for name in SCHEDULES:
        for m in MICRO_BATCHES[stages]:
            for v in CHUNK_COUNTS:
                if stages > 2 and v == 1 and registry.get(name).chunks is None:
                    continue  # the interleaved family at v = 1 is 1F1B-like: covered at p = 2
                try:
                    program = build(name, stages=stages, micro_batches=m, chunks=v)
                except ScheduleError:  # the schedule's own constraints (chunks, m >= p, m >= 2p)
                    continue
                text = program.to_csv()
                if text in seen:
                    first = out[seen[text]]
                    out[seen[text]] = dataclasses.replace(first, same_order=(*first.same_order, name),
                                                          torch_class=first.torch_class or torch_schedule(
                                                              name, stages, m, v))
                    continue
                seen[text] = len(out)
                seed = len(out) + 1000 * stages
                rng = random.Random(seed)
                layers = tuple(rng.randint(1, 3) for _ in range(program.num_virtual_stages))
                out.append(Case(name, stages, m, v, layers, tuple(int(d) for d in program.placement),
                                torch_schedule(name, stages, m, v), seed))
    return out


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        proc.wait()


def run_cases(run: list[Case], stages: int, workdir: Path, *, timeout: float = 600.0) -> dict[str, dict]:
    """Run ``run`` on ``stages`` gloo processes; per case id, the merged results.

    Each result: ``csv`` (and ``class`` when the case names a PyTorch class) with ``grads``
    (global parameter name -> tensor, from every rank), ``losses`` (the last stage's, per
    micro-batch), ``missing`` (parameters without a gradient), ``orders`` (rank -> compute
    order of the PyTorch class, or None).
    """
    import torch

    workdir.mkdir(parents=True, exist_ok=True)
    specs = []
    for case in run:
        csv_path = workdir / f"{case.id}.csv"
        build(case.schedule, stages=case.stages, micro_batches=case.micro_batches, chunks=case.chunks).to_csv(csv_path)
        specs.append({"id": case.id, "csv": str(csv_path), "layers": list(case.layers),
                      "placement": list(case.placement), "micro_batches": case.micro_batches,
                      "torch_class": case.torch_class, "seed": case.seed})
    cases_path = workdir / "cases.json"
    cases_path.write_text(json.dumps(specs), encoding="utf-8")
    port = _free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
    procs = []
    for r in range(stages):
        with open(workdir / f"rank{r}.log", "wb") as log:  # the child keeps its own handle
            procs.append(subprocess.Popen([sys.executable, str(WORKER), str(cases_path), str(workdir), str(r),
                                           str(stages), str(port)], env=env, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + timeout
    try:
        while any(p.poll() is None for p in procs):
            failed = [r for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed or time.monotonic() > deadline:
                break
            time.sleep(0.05)
    finally:
        _stop(procs)
    errors = []
    for r, proc in enumerate(procs):
        error = workdir / f"rank{r}.error"
        if error.exists():
            errors.append(f"rank {r}: {error.read_text(encoding='utf-8')}")
        elif proc.returncode != 0:
            output = (workdir / f"rank{r}.log").read_text(encoding="utf-8", errors="replace")
            errors.append(f"rank {r}: exit status {proc.returncode}; output:\n{output[-2000:]}")
    if errors:
        raise RuntimeError(f"the {stages} gloo processes failed (timeout {timeout:.0f} s):\n" + "\n".join(errors))
    per_rank = [torch.load(workdir / f"rank{r}.pt") for r in range(stages)]
    merged: dict[str, dict] = {}
    for spec in specs:
        out: dict[str, dict] = {}
        for kind in ("csv", "class"):
            if kind not in per_rank[0][spec["id"]]:
                continue
            parts = [per_rank[r][spec["id"]][kind] for r in range(stages)]
            out[kind] = {
                "grads": {k: v for part in parts for k, v in part["grads"].items()},
                "missing": [k for part in parts for k in part["missing"]],
                "losses": [x for part in parts for x in part["losses"]],
                "orders": {r: part["order"] for r, part in enumerate(parts)},
            }
        merged[spec["id"]] = out
    return merged
