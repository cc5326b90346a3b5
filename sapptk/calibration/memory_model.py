"""The memory model of a dry run's device as rows of a linear system (see :mod:`sapptk.calibration.fitting`).

One row per live point of the device (:meth:`~sapptk.schedules.Program.live_points`), one
column per unknown of :data:`UNKNOWNS`; the device's peak is the largest row · values.
Also the rank and null space of a design matrix, for identifiability.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from sapptk.calibration.observations import DryRun
from sapptk.profile import MODES

__all__ = ["ACTIVATION_COLUMNS", "COLUMN", "UNKNOWNS", "device_rows", "rank_and_null", "run_costs", "unidentified"]

UNKNOWNS: tuple[str, ...] = (
    "param", *(f"activation_{m}" for m in MODES), "head", "tail", "constant",
)
"""Every unknown a calibration can have, in the order of :attr:`Calibration.coefficients`."""

COLUMN = {name: i for i, name in enumerate(UNKNOWNS)}
ACTIVATION_COLUMNS = [COLUMN[f"activation_{m}"] for m in MODES]


def device_rows(run: DryRun, device: int, weight_holds: float) -> np.ndarray:
    """Design rows of one device of one run, one per live point (see the module docstring)."""
    program = run.program
    cells = run.device_cells(device).astype(float)  # (modes, v)
    points = program.live_points(weight_holds)[device]
    if len(points) == 0:
        points = np.zeros((1, cells.shape[1]))
    base = np.zeros(len(UNKNOWNS))
    base[COLUMN["constant"]] = 1.0
    base[COLUMN["param"]] = cells.sum()
    base[COLUMN["head"]] = float(program.placement[0] == device)
    base[COLUMN["tail"]] = float(program.placement[-1] == device)
    rows = np.repeat(base[None, :], len(points), axis=0)
    rows[:, ACTIVATION_COLUMNS] = points @ cells.T
    return rows


def _scaled(matrix: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(matrix, axis=0)
    norms[norms == 0] = 1.0
    return matrix / norms


def rank_and_null(matrix: np.ndarray) -> tuple[int, np.ndarray, float]:
    """Rank of the column-scaled matrix, a basis of its null space (columns), and its condition number."""
    scaled = _scaled(matrix)
    _, sv, vt = np.linalg.svd(scaled, full_matrices=True)
    tol = max(scaled.shape) * np.finfo(float).eps * (sv[0] if len(sv) else 0.0) * 16
    rank = int((sv > tol).sum())
    null = vt[rank:].T
    cond = float(sv[0] / sv[rank - 1]) if rank and rank == matrix.shape[1] else math.inf
    return rank, null, cond


def unidentified(matrix: np.ndarray, names: list[str]) -> list[str]:
    rank, null, _ = rank_and_null(matrix)
    if rank == len(names):
        return []
    weight = np.linalg.norm(null, axis=1)
    return [n for n, w in zip(names, weight, strict=True) if w > 1e-8]




def run_costs(run: DryRun, values: Mapping[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """Per-virtual-stage params and activation (MB) of a run at the fitted values."""
    program = run.program
    nvs = program.num_virtual_stages
    act = np.zeros(nvs)
    par = np.zeros(nvs)
    a = np.array([values[f"activation_{m}"] for m in MODES])
    for d, stages in enumerate(program.device_stages):
        for c, vs in enumerate(stages):
            cell = run.cells[:, c, d]
            act[vs] = float(cell @ a)
            par[vs] = values["param"] * float(cell.sum())
    par[0] += values["head"]
    par[-1] += values["tail"]
    return par, act
