"""Trial folders for the best few setups of a choice (:func:`plan`).

``plan(choice, k=3, out=DIR)`` writes ``DIR/trials.json`` (the index: what was chosen, which
setups are trialled and why) and one folder per trialled setup::

    DIR/01-1f1b-p4-v1-m8/
        manifest.json   what the trial is for, its setup, layers per virtual stage, model, steps
        schedule.csv    the plan's op order as PyTorch's schedule CSV (plan.export("torch-csv"))
        profiler.json   the profiler settings and the ranges the runner records
        train.py        the entry point: sapptk.trials.runner.main(this folder)
        launch.sh       torchrun (python -m torch.distributed.run) with the environment; each run
                        lands in runs/<UTC time>-<pid>/ (rank<r>.json, trace_rank<r>.json, exit_code)

The setups are the top ``k`` of the ranking that have a layer assignment to run: balanced
setups first, then pruned ones (balanced here from the choice's profile, ``time_limit`` s each).
A setup with dp > 1 runs all its replicas (p · dp processes), the gradients all-reduced
across them after each step.

The trial model is a stand-in: ``model["layers"]`` transformer blocks (``hidden``, ``heads``,
``seq``, ``rows`` per micro-batch), or your own layers through ``model["factory"]``
(:mod:`sapptk.trials.runner`). Only ``runtime="torch"`` is written: the op ranges that
:func:`~sapptk.trials.ingesting.ingest` fits are recorded by sapptk's own runner.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from sapptk.errors import ConfigError

__all__ = ["DEFAULT_MODEL", "RUNTIMES", "plan", "trial_key"]

RUNTIMES: tuple[str, ...] = ("torch",)
"""The runtimes :func:`plan` writes trial folders for."""
DEFAULT_MODEL: dict[str, Any] = {"hidden": 128, "heads": 4, "seq": 32, "rows": 4}
"""The stand-in transformer's size (``layers`` is the profile's body layer count)."""
_PROFILE = {"activities": ["CPU", "CUDA when the trial runs on a GPU"], "record_shapes": False,
            "ranges": {"step": "ProfilerStep#<i>", "op": "sapptk:<F|B|I|W>:<virtual stage>:<micro-batch>",
                       "layer": "sapptk:layer:<index> (one per layer forward pass)", "wait": "sapptk:wait",
                       "trial": "sapptk:trial:<key>"},
            "memory": {"cpu": "peak_rss_mb (getrusage ru_maxrss)",
                       "gpu": "peak_allocated_mb, peak_reserved_mb (torch.cuda.max_memory_*)"}}


def trial_key(setup: dict[str, Any]) -> str:
    """A short hash of what a trial runs: the trace of another setup carries another key."""
    text = json.dumps({k: setup[k] for k in ("schedule", "stages", "chunks", "micro_batches", "placement",
                                               "layers_per_virtual_stage")}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def _positive_int(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ConfigError(f"{name} = {value!r}: expected an integer >= {low}")
    return int(value)


def _model(model: Any, layers: int) -> dict[str, Any]:
    spec = {**DEFAULT_MODEL, "layers": layers}
    if model is None:
        return spec
    if not isinstance(model, dict):
        raise ConfigError(f"model = {model!r}: expected a dict of hidden, heads, seq, rows (or factory) or None")
    unknown = sorted(set(model) - {"hidden", "heads", "seq", "rows", "factory"})
    if unknown:
        raise ConfigError(f"model: unknown keys {unknown}; expected some of hidden, heads, seq, rows, factory")
    spec.update(model)
    for key in ("hidden", "heads", "seq", "rows"):
        _positive_int(f"model[{key!r}]", spec[key])
    if spec["hidden"] % spec["heads"]:
        raise ConfigError(f"model: hidden = {spec['hidden']} is not a multiple of heads = {spec['heads']}")
    return spec


def _plan_of(choice: Any, index: int, time_limit: float) -> Any:
    """The row's plan: the choice's own, or balanced now from the choice's profile."""
    if index in choice.plans:
        return choice.plans[index]
    if "tp" in choice.frame:
        raise ConfigError(f"setup of row {index}: a model-card choice keeps no profile for setups it did not "
                          "balance; trial its balanced setups (k <= the balanced count)")
    from sapptk.balancer import balance

    row = choice.frame.loc[index]
    config = dataclasses.replace(choice.best.config, schedule=str(row["schedule"]), stages=int(row["stages"]),
                                 chunks=int(row["chunks"]), micro_batches=int(row["micro_batches"]))
    return balance(choice.best.profile, config, time_limit=time_limit)


def _launch(processes: int, runtime_env: dict[str, str]) -> str:
    env = "\n".join(f'export {k}="${{{k}:-{v}}}"' for k, v in runtime_env.items())
    return f"""#!/usr/bin/env bash
# One run of this trial: {processes} processes (pipeline stages x replicas). On a GPU machine the same
# command runs on {processes} GPUs (NCCL; set SAPPTK_DEVICE=cpu to force gloo on CPU).
# Each run writes runs/<UTC time>-<pid>/ (rank<r>.json, trace_rank<r>.json, exit_code); runs are never overwritten.
set -u
cd "$(dirname "$0")"
{env}
RUN="runs/$(date -u +%Y%m%dT%H%M%SZ)-$$"
mkdir -p "$RUN"
"${{PYTHON:-python}}" -m torch.distributed.run --standalone --nnodes 1 --nproc-per-node {processes} \\
    train.py --results "$RUN"
code=$?
echo "$code" > "$RUN/exit_code"
exit "$code"
"""


_TRAIN = '''"""Trial {key} ({purpose}); written by sapptk.trials.plan.

torchrun --standalone --nproc-per-node {stages} train.py --results runs/<name>
"""

import sys
from pathlib import Path

from sapptk.trials.runner import main

if __name__ == "__main__":
    sys.exit(main(Path(__file__).resolve().parent, sys.argv[1:]))
'''


def plan(choice: Any, k: int = 3, *, runtime: str = "torch", steps: int = 5, warmup: int = 2,
         out: str | os.PathLike[str], model: dict[str, Any] | None = None, device: str = "auto",
         threads: int = 1, timeout_s: float = 300.0, time_limit: float = 5.0) -> list[Path]:
    """Write trial folders for the ``k`` best setups of ``choice`` into ``out`` (module docstring);
    the folders, best first. ``out`` must not hold trials already (ConfigError): nothing kept is
    overwritten."""
    from sapptk.choosing.result import Choice

    if not isinstance(choice, Choice):
        raise ConfigError(f"choice: expected the sapptk.Choice that sapptk.choose returned, "
                          f"got {type(choice).__name__}")
    if runtime not in RUNTIMES:
        raise ConfigError(
            f"runtime = {runtime!r}: trials are written for {', '.join(map(repr, RUNTIMES))} only: ingest fits the op "
            "ranges sapptk's own runner records, which torchtitan's and Megatron-LM's trainers do not. Export the "
            "winner for them with choice.best.export('torchtitan', path) or export('megatron', path)")
    k = _positive_int("k", k)
    steps, warmup = _positive_int("steps", steps, 2), _positive_int("warmup", warmup, 0)
    threads = _positive_int("threads", threads)
    if device not in ("auto", "cpu"):
        raise ConfigError(f"device = {device!r}: expected 'auto' (CUDA when present) or 'cpu'")
    if out is None or not isinstance(out, str | os.PathLike):
        raise ConfigError(f"out = {out!r}: expected the folder to write the trials into")
    root = Path(out)
    if root.exists() and not root.is_dir():
        raise ConfigError(f"out = {os.fspath(out)!r}: is a file; expected a folder to write the trials into")
    if (root / "trials.json").exists():
        raise ConfigError(f"out = {os.fspath(out)!r}: holds trials already (trials.json); give a new folder")
    frame = choice.frame
    rows = frame[frame["status"].isin(["balanced", "unsolved", "pruned"])]
    if rows.empty:
        raise ConfigError("choice: no setup was balanced or pruned: nothing to trial")
    profile = choice.best.profile
    body = sum(g.count for g in profile.groups if g.kind == "body")
    spec = _model(model, body)
    root.mkdir(parents=True, exist_ok=True)
    written, index_rows = [], []
    for index, row in rows.head(k).iterrows():
        p = _plan_of(choice, int(index), time_limit)
        if not p.solved:
            index_rows.append({"rank": int(row["rank"]), "schedule": str(row["schedule"]), "folder": None,
                               "skipped": f"no layer assignment found ({p.status})"})
            continue
        counts = np.asarray(p.counts)
        kinds = [g.kind for g in profile.groups if g.kind == "body"]
        layers = [int(x) for x in counts[: len(kinds)].sum(axis=(0, 1))]
        program = p.config.program()
        setup = {"schedule": str(row["schedule"]), "stages": int(row["stages"]), "chunks": int(row["chunks"]),
                 "micro_batches": int(row["micro_batches"]), "dp": int(row["dp"]),
                 "placement": [int(d) for d in program.placement], "layers_per_virtual_stage": layers}
        key = trial_key(setup)
        name = (f"{len(written) + 1:02d}-{setup['schedule']}-p{setup['stages']}-v{setup['chunks']}"
                f"-m{setup['micro_batches']}")
        folder = root / name
        folder.mkdir()
        purpose = (f"rank {int(row['rank'])} of the choice ({row['status']}): is its predicted pipeline "
                   f"{float(row['pipeline_ms'] if np.isfinite(row['pipeline_ms']) else p.step_time):.3f} ms "
                   "what the runtime measures?")
        p.export("torch-csv", folder / "schedule.csv")
        env = {"OMP_NUM_THREADS": str(threads), "SAPPTK_DEVICE": device}
        manifest = {
            "format": "sapptk-trial/1", "key": key, "purpose": purpose, "rank": int(row["rank"]),
            "choice_row": int(index), "status_in_choice": str(row["status"]), "runtime": runtime,
            "predicted_pipeline_ms": float(p.step_time), "choice_step_time_ms": float(row["step_time_ms"]),
            "dp_sync_ms": float(row["dp_sync_ms"]) if np.isfinite(row["dp_sync_ms"]) else 0.0,
            "setup": setup, "model": spec, "steps": steps, "warmup": warmup, "threads": threads, "device": device,
            "timeout_s": float(timeout_s), "seed": 0, "profile": profile.name,
            "files": {"schedule": "schedule.csv", "launch": "launch.sh", "train": "train.py",
                      "profiler": "profiler.json"},
            "command": f"torchrun --standalone --nnodes 1 --nproc-per-node {setup['stages'] * setup['dp']} "
                       "train.py --results runs/<name>",
            "environment": env, "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if len(profile.groups) > len(kinds):
            manifest["note"] = ("the stand-in model runs the profile's body layers only: its head and tail are not "
                                "part of the trial (give model['factory'] to run your own layers)")
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1), encoding="utf-8")
        (folder / "profiler.json").write_text(json.dumps(_PROFILE, indent=1), encoding="utf-8")
        (folder / "train.py").write_text(_TRAIN.format(key=key, purpose=purpose.replace('"', "'"),
                                                       stages=setup["stages"] * setup["dp"]), encoding="utf-8")
        launch = folder / "launch.sh"
        launch.write_text(_launch(setup["stages"] * setup["dp"], env), encoding="utf-8")
        launch.chmod(0o755)
        written.append(folder)
        index_rows.append({"rank": int(row["rank"]), "schedule": setup["schedule"], "folder": name, "key": key})
    index = {"format": "sapptk-trials/1", "profile": profile.name, "k": k, "runtime": runtime,
             "choice": choice.summary().splitlines(), "trials": index_rows}
    (root / "trials.json").write_text(json.dumps(index, indent=1), encoding="utf-8")
    return written
