"""Which extra observation would identify what a set of dry runs cannot: :func:`suggest`."""

from __future__ import annotations

import numpy as np

from sapptk.calibration.memory_model import ACTIVATION_COLUMNS, device_rows, rank_and_null
from sapptk.calibration.observations import DryRun, DryRuns
from sapptk.profile import MODES

__all__ = ["suggest"]


def suggest(dry: DryRuns, seen: set[tuple[int, int]], cols: list[int], matrix: np.ndarray, weight_holds: float) -> str:
    """Which extra observation would identify the unknowns: an unobserved device, else a new dry run."""
    target = len(cols)
    rank = rank_and_null(matrix)[0]
    picks: list[str] = []
    current = matrix
    for r, run in enumerate(dry.runs):
        for d in range(run.stages):
            if (r, d) in seen:
                continue
            trial = np.vstack([current, _top_row(device_rows(run, d, weight_holds)[:, cols], cols)])
            new_rank = rank_and_null(trial)[0]
            if new_rank > rank:
                picks.append(f"device {d} of run {run.label!r}")
                current, rank = trial, new_rank
                if rank == target:
                    return "observing the peak of " + " and ".join(picks) + " would identify them"
    for run in dry.runs:
        for variant, text in _variants(run):
            rows = [_top_row(device_rows(variant, d, weight_holds)[:, cols], cols) for d in range(variant.stages)]
            if rank_and_null(np.vstack([current, *rows]))[0] == target:
                lead = ("observing " + " and ".join(picks) + ", and ") if picks else ""
                return (f"{lead}a dry run like run {run.label!r} with {text}, every device observed, would identify "
                        "them (or let sapptk.calibration.design propose the dry runs)")
    return ("add dry runs that vary the layers per stage and each recompute mode independently "
            "(sapptk.calibration.design proposes them)")


def _top_row(rows: np.ndarray, cols: list[int]) -> np.ndarray:
    """The row with the most activation (the highest live point when all activations are equal)."""
    act = [i for i, c in enumerate(cols) if c in ACTIVATION_COLUMNS]
    return rows[int(rows[:, act].sum(axis=1).argmax())] if act else rows[0]


def _variants(run: DryRun):
    """Runs one layer away from ``run``: one layer moved between neighbouring stages, or one layer's mode changed."""
    v, p = run.chunks, run.stages
    none = MODES.index("none")
    for c in range(v):
        for s in range(p):
            for r in range(len(MODES)):
                if r == none or not run.cells[none, c, s]:
                    continue
                cells = run.cells.copy()
                cells[none, c, s] -= 1
                cells[r, c, s] += 1
                where = f"stage {s}" + (f", chunk {c}" if v > 1 else "")
                yield _replace_cells(run, cells), f"one more {MODES[r]!r} layer on {where}"
            if s + 1 < p and run.cells[:, c, s].sum() > 1:
                cells = run.cells.copy()
                cells[none if cells[none, c, s] else int(np.flatnonzero(cells[:, c, s])[0]), c, s] -= 1
                cells[none, c, s + 1] += 1
                yield _replace_cells(run, cells), f"one layer moved from stage {s} to stage {s + 1}"


def _replace_cells(run: DryRun, cells: np.ndarray) -> DryRun:
    return DryRun(run.label, run.schedule, run.stages, run.micro_batches, run.chunks, run.splits, run.layers, cells,
                  run.lists)
