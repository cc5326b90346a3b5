"""Designing dry runs: :func:`design` proposes the fewest that identify every memory unknown.

A dry run of p stages reports p peaks, so R runs give R·p equations; with K unknowns
(``param``, ``activation_none`` and one activation per recompute mode asked for, ``head``,
``tail``, and ``constant`` when p ≥ 3) at least ⌈K / p⌉ runs are needed. :func:`design`
starts there: for that many rounds it draws random valid MindFormers configs (offsets
summing to N mod p, every stage at least one layer, recompute counts within each stage's
layers, no cell holding both select-only and comm-only layers, which MindFormers cannot
spell) and keeps the full-rank one with the smallest condition number of the design matrix
(columns scaled to unit length); only if none of its draws reaches full rank does it add a
round. The live counts come from the schedule's :class:`~sapptk.schedules.Program` (1F1B
with m = p by default: p − s micro-batches in flight on stage s).

With p = 2 every equation holds the head or the tail, so the constant cannot be told apart
from them (it is left out; head and tail absorb it, as in :func:`~sapptk.calibration.calibrate`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import pandas as pd
import yaml

from sapptk import checks
from sapptk.config import build_program, program_ops
from sapptk.errors import CalibrationError, SapptkError
from sapptk.profile import MAX_LAYERS, MODES
from sapptk.schedules import names as schedule_names

__all__ = ["RECOMPUTE_MODES", "DryRunDesign", "design"]

RECOMPUTE_MODES: tuple[str, ...] = tuple(m for m in MODES if m != "none")
MAX_DESIGN_PEAKS = checks.MAX_DESIGN_PEAKS
"""Rounds × stages of one design (the rows of its identifiability matrix, drawn 24 times)."""
_DRAWS = 24  # candidate designs drawn per number of rounds
_EXTRA_ROUNDS = 3  # rounds tried beyond the lower bound before giving up


@dataclass(frozen=True, eq=False)
class DryRunDesign:
    """Dry runs that identify every unknown.

    ``rounds``: per dry run the MindFormers lists ``offset``, ``recompute``,
    ``select_recompute``, ``select_comm_recompute`` (p values each). ``unknowns``: what
    the runs identify; ``folded``: unknowns no design can separate (the constant when p = 2).
    ``condition``: condition number of the design matrix with unit-length columns (1 is
    perfect). ``matrix``: that matrix, one row per (round, device).
    """

    stages: int
    layers: int
    modes: tuple[str, ...]
    schedule: str
    micro_batches: int
    seed: int
    rounds: tuple[dict[str, list[int]], ...]
    unknowns: tuple[str, ...]
    folded: tuple[str, ...]
    condition: float
    matrix: pd.DataFrame

    def __repr__(self) -> str:
        return (f"DryRunDesign(p={self.stages}, N={self.layers}, modes={self.modes}, {len(self.rounds)} run(s), "
                f"{len(self.unknowns)} unknowns, condition {self.condition:.4g})")

    def frame(self) -> pd.DataFrame:
        """The runs as the tidy observation table :func:`~sapptk.calibration.calibrate` reads,
        one row per (run, device); fill ``peak_mb`` with what each device reports."""
        rows = []
        for r, lists in enumerate(self.rounds):
            for d in range(self.stages):
                rows.append({"run": r, "device": d, "peak_mb": math.nan, "schedule": self.schedule,
                             "stages": self.stages, "micro_batches": self.micro_batches, "chunks": 1,
                             "layers": self.layers, **{k: list(v) for k, v in lists.items()}})
        return pd.DataFrame(rows)

    def to_yaml(self) -> str:
        """The runs' MindFormers lists as YAML, one entry per run."""
        data = {f"run_{r}": {k: list(v) for k, v in lists.items()} for r, lists in enumerate(self.rounds)}
        return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=200)


@lru_cache(maxsize=64)
def _live(schedule: str, stages: int, micro_batches: int) -> np.ndarray:
    """Micro-batches in flight at each device's peak, from the schedule's program (one chunk)."""
    try:
        program = build_program(schedule, stages, micro_batches, 1, 1)
    except SapptkError as exc:
        raise CalibrationError(f"design: {exc}") from None
    points = program.live_points()
    if any(len(pts) != 1 or pts.shape[1] != 1 for pts in points):
        raise CalibrationError(f"design: schedule = {schedule!r}: expected a one-chunk schedule with one peak point "
                               "per device (1f1b, gpipe, zb-h1)")
    live = np.array([float(pts[0, 0]) for pts in points])
    live.flags.writeable = False
    return live


def _unknowns(p: int, modes: tuple[str, ...]) -> tuple[list[str], list[str]]:
    names = ["param", "activation_none", *(f"activation_{m}" for m in modes), "head", "tail"]
    if p >= 3:
        return [*names, "constant"], []
    return names, ["constant"]


def _draw_round(rng: np.random.Generator, p: int, layers: int, modes: tuple[str, ...]) -> np.ndarray:
    """One random valid round: layers per (mode, stage), shape (len(MODES), p).

    Every stage holds at least one layer (the rest spread with random weights); in each
    stage the modes, in random order, take a random share of the layers left; a stage never
    holds both select-only and comm-only layers."""
    weights = rng.uniform(0.3, 1.7, p)
    per = 1 + rng.multinomial(layers - p, weights / weights.sum())
    cells = np.zeros((len(MODES), p), dtype=np.int64)
    if modes:
        index = np.array([MODES.index(m) for m in modes])
        single_mode = np.array([m in ("select", "comm") for m in modes])
        order = rng.permuted(np.tile(np.arange(len(modes)), (p, 1)), axis=1)
        share = rng.random((p, len(modes)))
        left = per.copy()
        single = np.zeros(p, dtype=bool)
        stages = np.arange(p)
        for j in range(len(modes)):
            which = order[:, j]
            k = np.floor(share[:, j] * (left + 1)).astype(np.int64)
            blocked = single_mode[which] & single
            k[blocked] = 0
            single |= single_mode[which] & (k > 0)
            cells[index[which], stages] = k
            left -= k
        cells[MODES.index("none")] = left
    else:
        cells[MODES.index("none")] = per
    return cells


def _rows(cells: np.ndarray, live: np.ndarray, names: Sequence[str]) -> np.ndarray:
    """Design rows of one round (one per device)."""
    p = cells.shape[1]
    cols = []
    for name in names:
        if name == "constant":
            cols.append(np.ones(p))
        elif name == "param":
            cols.append(cells.sum(axis=0).astype(float))
        elif name == "head":
            cols.append((np.arange(p) == 0).astype(float))
        elif name == "tail":
            cols.append((np.arange(p) == p - 1).astype(float))
        else:
            cols.append(live * cells[MODES.index(name.removeprefix("activation_"))])
    return np.stack(cols, axis=1)


def _quality(matrix: np.ndarray) -> float:
    """Condition number of the column-scaled matrix; inf when it is rank-deficient."""
    norms = np.linalg.norm(matrix, axis=0)
    if (norms == 0).any():
        return math.inf
    sv = np.linalg.svd(matrix / norms, compute_uv=False)
    if sv[-1] <= sv[0] * max(matrix.shape) * np.finfo(float).eps * 16:
        return math.inf
    return float(sv[0] / sv[-1])


def _lists(cells: np.ndarray, base: int) -> dict[str, list[int]]:
    full, both = cells[MODES.index("full")], cells[MODES.index("both")]
    return {
        "offset": [int(x) for x in cells.sum(axis=0) - base],
        "recompute": [int(x) for x in full],
        "select_recompute": [int(x) for x in cells[MODES.index("select")] + both + full],
        "select_comm_recompute": [int(x) for x in cells[MODES.index("comm")] + both + full],
    }


def design(
    stages: int,
    layers: int,
    modes: Sequence[str] | str = (),
    *,
    rounds: int | None = None,
    seed: int = 0,
    schedule: str = "1f1b",
    micro_batches: int | None = None,
) -> DryRunDesign:
    """The fewest dry runs (MindFormers configs) whose stage peaks identify every memory unknown.

    Parameters
    ----------
    stages: pipeline stages p (>= 2). layers: body layers N (>= p).
    modes: recompute modes to calibrate besides ``none`` (``select``, ``comm``, ``both``, ``full``).
    rounds: exactly this many dry runs (default: the fewest, ⌈K / p⌉ or more).
    seed: the random draws; the same arguments and seed give the same design.
    schedule, micro_batches: the dry runs' one-chunk schedule (default 1F1B with m = p).

    Raises :class:`~sapptk.errors.CalibrationError` for bad arguments or when no draw
    identifies every unknown (e.g. ``rounds`` too small).
    """
    stages = checks.integer(stages, "design: stages", error=CalibrationError, low=2, high=checks.MAX_STAGES)
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < stages:
        raise CalibrationError(f"design: layers = {checks.show(layers)}: expected an integer >= stages = {stages} "
                               "(every stage holds at least one layer)")
    checks.integer(layers, "design: layers", error=CalibrationError, low=stages, high=MAX_LAYERS)
    if micro_batches is not None:
        checks.integer(micro_batches, "design: micro_batches", error=CalibrationError, low=1, high=checks.MAX_INDEX)
    if isinstance(schedule, str) and schedule in schedule_names():
        ops = program_ops(schedule, stages, stages if micro_batches is None else micro_batches, 1, 1)
        checks.size(ops, f"design: the {schedule} program of {stages} stages", error=CalibrationError,
                    limit=checks.MAX_PROGRAM_OPS, what="ops", constant="sapptk.checks.MAX_PROGRAM_OPS")
    if not isinstance(modes, str | list | tuple | set | frozenset):
        checks.fail(CalibrationError, "design: modes", modes, f"recompute modes among {', '.join(RECOMPUTE_MODES)}")
    given = (modes,) if isinstance(modes, str) else tuple(modes)
    unknown = [m for m in given if m not in MODES]
    if unknown or not all(isinstance(m, str) for m in given):
        raise CalibrationError(
            f"design: modes = {given!r}: expected recompute modes among {', '.join(RECOMPUTE_MODES)}"
        )
    chosen = tuple(m for m in RECOMPUTE_MODES if m in given)
    seed = checks.integer(seed, "design: seed", error=CalibrationError, low=0, high=checks.MAX_NUMPY_SEED)
    m = stages if micro_batches is None else micro_batches
    live = _live(schedule, stages, m)
    names, folded = _unknowns(stages, chosen)
    k = len(names)
    bound = math.ceil(k / stages)
    if rounds is not None:
        rounds = checks.integer(rounds, "design: rounds", error=CalibrationError, low=1,
                                high=min(checks.MAX_DESIGN_ROUNDS, max(1, MAX_DESIGN_PEAKS // stages)))
        if rounds < bound:
            raise CalibrationError(f"design: rounds = {rounds}: {rounds} run(s) of {stages} stages give "
                                   f"{rounds * stages} peaks for {k} unknowns: expected rounds >= {bound}")
        tries = [rounds]
    else:
        tries = list(range(bound, bound + _EXTRA_ROUNDS + 1))
    rng = np.random.default_rng(seed)
    base = layers // stages
    for count in tries:
        best: tuple[float, list[np.ndarray]] | None = None
        for _ in range(_DRAWS):
            cells = [_draw_round(rng, stages, layers, chosen) for _ in range(count)]
            matrix = np.vstack([_rows(c, live, names) for c in cells])
            q = _quality(matrix)
            if math.isfinite(q) and (best is None or q < best[0]):
                best = (q, cells)
        if best is not None:
            q, cells = best
            index = pd.MultiIndex.from_product([range(count), range(stages)], names=["run", "device"])
            matrix = pd.DataFrame(np.vstack([_rows(c, live, names) for c in cells]), index=index, columns=names)
            return DryRunDesign(stages, layers, chosen, schedule, m, seed, tuple(_lists(c, base) for c in cells),
                                tuple(names), tuple(folded), q, matrix)
    raise CalibrationError(
        f"design: no draw of {tries[-1]} run(s) identifies all {k} unknowns ({', '.join(names)}) with p = {stages}, "
        f"N = {layers}: try more layers per stage or more rounds"
    )
