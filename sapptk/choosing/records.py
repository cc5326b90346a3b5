"""The rows of a choice: a balanced setup's row from its sweep result, the second balance's
merge, the keys that make twins, and the error when every setup is infeasible."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sapptk.choosing.setups import Candidate, dp_sync_ms, program_digest
from sapptk.errors import ConfigError
from sapptk.sweeps.frame import SOLVED
from sapptk.sweeps.solving import PointResult

__all__ = ["all_infeasible", "candidate_of", "device_sync_ms", "record", "record_retry", "sync_floor", "twin_key"]


def twin_key(c: Candidate, digest: str) -> tuple[Any, ...]:
    cfg = c.setup.config
    return (program_digest(cfg), digest, cfg.memory_budget, cfg.constant_memory, cfg.comm, cfg.recompute,
            cfg.splits)


def sync_floor(c: Candidate, bw: float | None) -> float:
    """The least DP synchronisation any plan of the candidate has: its fullest device holds at
    least the average parameter MB (a model-card setup: its slowest device synchronises at
    least the average of the layers' exposed step ms, every layer living on one device, and at
    least ``ceil(N_g / p)`` layers of any group ``g``, or ``ceil(N / p)`` of all, each at least
    the cheapest)."""
    prof, cfg = c.profile, c.setup.config
    if c.layer_sync_ms is not None:
        # p devices hold the body layers whole: the average, and each group's (or all groups')
        # layers spread as evenly as whole layers go (some device holds ceil(N / p) of them)
        p = cfg.stages
        counts = [int(g.count) for g in prof.body]
        total_ms = sum(n * ms for n, ms in zip(counts, c.layer_sync_ms, strict=True))
        whole = max((ms * -(-n // p) for n, ms in zip(counts, c.layer_sync_ms, strict=True)), default=0.0)
        least = min(c.layer_sync_ms, default=0.0) * -(-sum(counts) // p)
        return max(total_ms / p, whole, least)
    total = sum(g.count * g.params for g in prof.body)
    total += sum(g.count * g.params for g in (prof.head, prof.tail) if g is not None)
    return dp_sync_ms(total / cfg.stages, c.setup.dp, bw, c.gradient_share)



def device_sync_ms(c: Candidate, counts: Any, stage_params: Any, bw: float | None) -> float:
    """The DP synchronisation a plan charges: that of its slowest device. A model-card setup
    sums its layers' exposed step ms (``layer_sync_ms`` by body group, ``counts`` of shape
    (groups, modes, virtual stages)); a bare profile all-reduces the fullest device's
    gradients at ``bw`` (:func:`~sapptk.choosing.setups.dp_sync_ms`, ``stage_params`` MB
    per virtual stage)."""
    stages = c.setup.config.program().device_stages
    if c.layer_sync_ms is not None:
        layers = np.asarray(counts, dtype=float).sum(axis=1)  # (groups, virtual stages)
        per_stage = np.asarray(c.layer_sync_ms, dtype=float) @ layers
        return max(float(per_stage[list(st)].sum()) for st in stages)
    params = np.asarray(stage_params, dtype=float)
    return dp_sync_ms(max(float(params[list(st)].sum()) for st in stages), c.setup.dp, bw, c.gradient_share)


def candidate_of(candidates: list[Candidate], chosen: list[int], key: str) -> Candidate:
    for i in chosen:
        if candidates[i].row.get("key") == key:
            return candidates[i]
    raise KeyError(key)  # pragma: no cover - every result answers a task of the batch


def record(c: Candidate, res: PointResult, bw: float | None) -> None:
    """A balanced setup's row from its sweep result."""
    status = str(res.status)
    c.row["solver_status"] = status if status in ("optimal", "feasible", "unknown", "infeasible") else None
    c.row["solve_seconds"] = res.solve_seconds
    counts = None if res.layout is None else res.layout.counts
    if status not in SOLVED or counts is None:
        c.row["reason"] = str(res.error or f"solver status {status}")
        c.row["status"] = "infeasible" if status == "infeasible" else "unsolved"
        if status == "infeasible":
            c.lower_ms = math.inf
        return
    c.counts = counts
    from sapptk.costs import stage_costs

    cfg = c.setup.config
    sc = stage_costs(c.profile, cfg, np.asarray(counts, dtype=np.int64))
    sync = device_sync_ms(c, counts, sc.params, bw)
    pipeline = float(res.step_time_ms)
    c.row.update(status="balanced", pipeline_ms=pipeline, dp_sync_ms=sync, step_time_ms=pipeline + sync,
                 peak_mb_max=res.peak_mb_max, bubble_of_step=res.bubble_of_step,
                 solver_bound_ms=res.bound_ms, solver_gap=res.gap)
    solver_lower = pipeline if status == "optimal" else res.bound_ms
    if solver_lower is not None and math.isfinite(float(solver_lower)):
        c.lower_ms = max(c.lower_ms, float(solver_lower) + c.sync_floor_ms)
    c.row["bound_ms"] = c.lower_ms


def record_retry(c: Candidate, res: PointResult, bw: float | None) -> None:
    """A second, longer balance of a balanced setup: its plan replaces the first when faster;
    its bound raises the setup's either way."""
    first = {k: c.row.get(k) for k in c.row}
    counts, lower = c.counts, c.lower_ms
    record(c, res, bw)
    if c.row.get("status") != "balanced" or c.row["step_time_ms"] >= first["step_time_ms"]:
        raised = max(lower, c.lower_ms)
        c.row.clear()
        c.row.update(first)
        c.counts, c.lower_ms = counts, raised
        c.row["bound_ms"] = raised
    c.row["solve_seconds"] = (first.get("solve_seconds") or 0.0) + (res.solve_seconds or 0.0)


def all_infeasible(candidates: list[Candidate]) -> None:
    """Raise the error for a choice where no setup can fit: the nearest one and what binds."""
    infeasible = [c for c in candidates if c.row.get("status") == "infeasible"]
    if not infeasible:
        reasons = sorted({str(c.row.get("reason")) for c in candidates})
        raise ConfigError(f"choose: no valid setup among {len(candidates)} ({'; '.join(reasons[:3])})")
    nearest = min(infeasible, key=lambda c: c.row.get("excess_mb", math.inf))
    budget = nearest.setup.config.memory_budget
    raise ConfigError(
        f"memory_budget = {budget!r}: no setup fits (all {len(candidates)} infeasible); the nearest is "
        f"{nearest.setup.label}: {nearest.row.get('reason')}"
    )
