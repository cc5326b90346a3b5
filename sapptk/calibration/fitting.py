"""Per-layer memory from observed dry-run peaks: :func:`calibrate` and its :class:`Calibration`.

The model (units MB). A device ``d`` of a dry run holds the virtual stages its schedule's
:class:`~sapptk.schedules.Program` places on it; with ``n_d`` body layers on them, the head
(virtual stage 0) and the tail (the last virtual stage) where they live, its peak is

    peak_d = constant + param·n_d + head·[head on d] + tail·[tail on d]
             + max over live points L of  Σ_c L[c] · Σ_r cells[r, c, d] · activation_r

where ``L[c]`` is how many micro-batches of chunk ``c`` are in flight at one of the
device's allocation points (:meth:`~sapptk.schedules.Program.live_points`, the rows the
balancer and the simulator use), and ``cells[r, c, d]`` the layers in recompute mode ``r``
on that chunk. The reference model (1F1B, m ≥ p: ``p − s`` in flight) is the special case
of a single live point per device.

The fit. With one live point per device (every one-chunk schedule) the model is linear
and :func:`calibrate` returns the least-squares solution over all observations. With
several chunks the highest live point depends on the unknowns, so the fit iterates: pick
each observation's highest live point under the current values, solve the least squares,
repeat until the points no longer change, from several starting points, keeping the
smallest sum of squares. What is guaranteed: every predicted peak is the model's peak at
the fitted values (each observation is read at its highest live point, and the simulator
confirms the predicted peaks when the fitted figures are non-negative), and no other
choice of the unknowns has a smaller sum of squares for those live points; the
fit is a local minimum of the exact (max) model when no observation has two highest points.

Identifiability: the rank of the design matrix (columns scaled to unit length) and the
unknowns in its null space are reported. The constant is fitted when the data identify
it; otherwise (option ``constant="auto"``) it is left out, so head and tail absorb it, as
the reference does. Any other unidentified unknown is an error that names them and the
observation (an unobserved device, or a new dry run) that would identify them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sapptk import checks
from sapptk.calibration.calibration_file import read_observations
from sapptk.calibration.identifiability import suggest
from sapptk.calibration.memory_model import (
    ACTIVATION_COLUMNS,
    COLUMN,
    UNKNOWNS,
    device_rows,
    rank_and_null,
    run_costs,
    unidentified,
)
from sapptk.calibration.observations import DryRuns
from sapptk.calibration.prior import check_prior, moved_frame, prior_basis, prior_constant, scaled_profile, time_scale
from sapptk.config import PipelineConfig
from sapptk.errors import CalibrationError
from sapptk.plan import Plan, load_plan
from sapptk.profile import DEFAULT_COEFS, MAX_MS, MODES, LayerGroup, ModeCost, Profile
from sapptk.simulation import WEIGHT_HOLDS, simulate

if TYPE_CHECKING:
    from sapptk.calibration.traces import LayerTimes

__all__ = ["Calibration", "calibrate"]

_STARTS = 8  # random starting points of the fixed-point iteration (multi-point observations only)
_MAX_ROUNDS = checks.MAX_FIT_ROUNDS


@dataclass(frozen=True, eq=False)
class _Observation:
    run: int
    device: int
    peak: float
    rows: np.ndarray  # (live points, len(UNKNOWNS)): the design row at each live point


def _solve(rows: np.ndarray, y: np.ndarray) -> np.ndarray:
    scale = np.linalg.norm(rows, axis=0)
    scale[scale == 0] = 1.0
    x, *_ = np.linalg.lstsq(rows / scale, y, rcond=None)
    return x / scale


def _fixed_point(
    obs: list[_Observation], cols: list[int], y: np.ndarray, start: list[int]
) -> tuple[list[int], np.ndarray, float] | None:
    """Iterate (highest live points → least squares) from ``start``; None when it cycles."""
    sel = list(start)
    seen: set[tuple[int, ...]] = set()
    for _ in range(_MAX_ROUNDS):
        rows = np.array([o.rows[i, cols] for o, i in zip(obs, sel, strict=True)])
        x = _solve(rows, y)
        new = []
        for o, cur in zip(obs, sel, strict=True):
            values = o.rows[:, cols] @ x
            top = values.max()
            tol = 1e-9 * max(1.0, abs(top))
            new.append(cur if values[cur] >= top - tol else int(values.argmax()))
        if new == sel:
            sse = float(((rows @ x - y) ** 2).sum())
            return sel, x, sse
        key = tuple(new)
        if key in seen:
            return None
        seen.add(key)
        sel = new
    return None


def _fit(obs: list[_Observation], cols: list[int], y: np.ndarray) -> tuple[list[int], np.ndarray]:
    """The best self-consistent least-squares fit over several starting points."""
    act = [c for c in cols if c in ACTIVATION_COLUMNS]
    starts = [[int(o.rows[:, act].sum(axis=1).argmax()) if act else 0 for o in obs]]
    if any(len(o.rows) > 1 for o in obs):
        rng = np.random.default_rng(0)
        starts += [[int(rng.integers(len(o.rows))) for o in obs] for _ in range(_STARTS)]
    best: tuple[list[int], np.ndarray, float] | None = None
    for start in starts:
        found = _fixed_point(obs, cols, y, start)
        if found is not None and (best is None or found[2] < best[2] - 1e-9 * max(1.0, best[2])):
            best = found
    if best is None:
        raise CalibrationError(
            "calibrate: the choice of each device's highest live point does not settle (it cycles) from any "
            "starting point: the observations contradict the memory model"
        )
    return best[0], best[1]


# --------------------------------------------------------------------------- results
@dataclass(frozen=True, eq=False)
class Calibration:
    """The fitted memory model of a set of dry runs.

    ``coefficients``: Series in MB indexed by unknown (``param``, ``activation_<mode>`` for
    the modes the data contain, ``head``, ``tail``, and ``constant`` when fitted; ``head``
    and ``tail`` are the extras beyond their devices' body layers and the constant).
    ``residuals``: one row per observation: ``run``, ``device``, ``observed_mb``,
    ``predicted_mb``, ``residual_mb`` (observed − predicted). ``design``: the final design
    matrix, one row per observation, one column per unknown. ``rank``: its rank;
    ``unknowns``: its columns; ``unidentified``: unknowns the data cannot determine (only
    ``constant`` can be, and it is then left out). ``condition``: condition number of the
    design with unit-length columns. ``times``: forward/backward times in ms per group
    (``head``, ``body``, ``tail``) for the profile. ``verified``: the simulator's peaks at
    the fitted values equal ``predicted_mb`` (False when negative figures prevent the check).
    """

    coefficients: pd.Series
    residuals: pd.DataFrame
    design: pd.DataFrame
    rank: int
    unknowns: tuple[str, ...]
    unidentified: tuple[str, ...]
    condition: float
    times: Mapping[str, Mapping[str, float]]
    dry_runs: DryRuns = field(repr=False)
    verified: bool = False
    notes: tuple[str, ...] = ()
    prior: Profile | None = field(default=None, repr=False)
    scales: pd.Series | None = None  # with a prior: static, activation, time (docs/estimation.md)

    @property
    def moved(self) -> pd.DataFrame:
        """With a prior: what the dry runs moved (:func:`~sapptk.calibration.prior.moved_frame`)."""
        if self.prior is None or self.scales is None:
            raise CalibrationError("moved: this calibration had no prior (calibrate(..., prior=profile))")
        return moved_frame(self.prior, self.scales, self.constant_mb)

    @property
    def constant_mb(self) -> float:
        """The fitted constant per device (0 when the data could not identify it)."""
        return float(self.coefficients.get("constant", 0.0))

    @property
    def sum_of_squares(self) -> float:
        return float((self.residuals["residual_mb"] ** 2).sum())

    @property
    def rms_mb(self) -> float:
        return float(np.sqrt((self.residuals["residual_mb"] ** 2).mean()))

    def __repr__(self) -> str:
        values = ", ".join(f"{k}={v:.6g}" for k, v in self.coefficients.items())
        return f"Calibration({values}; rank {self.rank}/{len(self.unknowns)}, rms residual {self.rms_mb:.4g} MB)"

    # ------------------------------------------------------------------ the profile
    @property
    def profile(self) -> Profile:
        """The calibrated profile as the reference writes it (constant folded into head and tail)."""
        return self.to_profile()

    def to_profile(self, *, fold_constant: bool = True, integers: bool = False, name: str | None = None) -> Profile:
        """The calibrated :class:`~sapptk.profile.Profile` (groups ``HEAD``, ``BODY``, ``TAIL``).

        ``fold_constant`` (default, as the reference tool): the head's and the tail's
        parameter MB include the fitted constant, so a profile without a constant predicts
        the devices holding them exactly; otherwise use ``fold_constant=False`` with
        ``PipelineConfig(constant_memory=calibration.constant_mb)``. ``integers``: every MB
        figure truncated toward zero with ``int()``, as the reference writes its JSON.
        Backward times: the measured backward (else 2 × forward) plus the SAPP recompute
        coefficient × 2 × forward of each mode. Raises :class:`CalibrationError` when a figure
        is negative (the dry runs contradict the model) or no forward times are known.
        """
        if self.prior is not None and self.scales is not None:  # the prior, scaled
            return scaled_profile(self.prior, self.scales, constant_mb=self.constant_mb if fold_constant else 0.0,
                                  name=name)
        missing = [g for g in ("head", "body", "tail") if "forward" not in self.times.get(g, {})]
        if missing:
            raise CalibrationError(
                f"{self.dry_runs.source}: no forward time for {', '.join(missing)}: give a time_config, a trace, or "
                "times={'head': ms, 'body': ms, 'tail': ms}"
            )
        c = self.coefficients
        fold = self.constant_mb if fold_constant else 0.0
        values = {"head": float(c["head"]) + fold, "tail": float(c["tail"]) + fold, "param": float(c["param"])}
        for mode in MODES:
            if f"activation_{mode}" in c:
                values[f"activation_{mode}"] = float(c[f"activation_{mode}"])
        negative = {k: v for k, v in values.items() if v < 0}
        if negative:
            shown = ", ".join(f"{k} = {v:.6g} MB" for k, v in negative.items())
            raise CalibrationError(
                f"{self.dry_runs.source}: the fit gives {shown}: a profile needs figures >= 0 (the observed peaks "
                "contradict the memory model: check each run's offsets, recompute lists, schedule and micro-batches)"
            )
        if integers:
            values = {k: float(int(round(v, 6))) for k, v in values.items()}

        def costs(group: str) -> tuple[float, float]:
            t = self.times[group]
            return float(t["forward"]), float(t.get("backward", 2.0 * t["forward"]))

        fwd, bwd = costs("body")
        modes = {}
        for mode in MODES:
            key = f"activation_{mode}"
            if key in values:
                backward = round(bwd + DEFAULT_COEFS[mode] * 2.0 * fwd, 9)
                modes[mode] = ModeCost(backward=backward, activation=values[key])
        layers = max(run.layers for run in self.dry_runs.runs)
        head_f, head_b = costs("head")
        tail_f, tail_b = costs("tail")
        groups = (
            LayerGroup("HEAD", "head", 1, head_f, values["head"], {"none": ModeCost(head_b, 0.0)}),
            LayerGroup("BODY", "body", layers, fwd, values["param"], modes),
            LayerGroup("TAIL", "tail", 1, tail_f, values["tail"], {"none": ModeCost(tail_b, 0.0)}),
        )
        return Profile(name or self.dry_runs.name, groups)

    def to_sapp_json(self, path: str | os.PathLike[str] | None = None, **options: Any) -> str:
        """The profile (:meth:`to_profile` with ``options``) as SAPP layer JSON; written to ``path`` when given."""
        return self.to_profile(**options).to_sapp_json(path)

    # ------------------------------------------------------------------ the dry runs
    def _run_index(self, run: Any) -> int:
        labels = [r.label for r in self.dry_runs.runs]
        if run not in labels:
            raise CalibrationError(f"run = {run!r}: expected one of the dry runs {labels}")
        return labels.index(run)

    def observed(self, run: Any) -> pd.DataFrame:
        """The peaks observed in one dry run: ``device``, ``peak_mb`` (for :func:`~sapptk.calibration.validate`)."""
        i = self._run_index(run)
        obs = self.dry_runs.observations
        mine = obs[obs["run"] == i].sort_values("device")
        return pd.DataFrame({"device": mine["device"].to_numpy(), "peak_mb": mine["peak_mb"].to_numpy()})

    def dry_run_plan(self, run: Any, *, fold_constant: bool = True) -> Plan:
        """One dry run's own configuration as a :class:`~sapptk.plan.Plan` of the calibrated profile,
        to simulate it and compare with what it reported. Without ``fold_constant`` the setup
        carries the fitted constant as ``constant_memory`` (which must then be >= 0)."""
        dry = self.dry_runs.runs[self._run_index(run)]
        constant = 0.0 if fold_constant else self.constant_mb
        config = PipelineConfig(dry.stages, dry.micro_batches, dry.chunks, dry.schedule, dry.splits,
                                constant_memory=constant)
        return load_plan({k: v for k, v in dry.lists.items() if v is not None}, "mindformers",
                         profile=self.to_profile(fold_constant=fold_constant), config=config)

    # ------------------------------------------------------------------ reports
    def stages(self) -> pd.DataFrame:
        """The residuals with the share of the observed peak: adds ``residual_pct``."""
        frame = self.residuals.copy()
        frame["residual_pct"] = 100.0 * frame["residual_mb"] / frame["observed_mb"].where(frame["observed_mb"] != 0)
        return frame

    def summary(self) -> str:
        """A text report: fitted values, residual per observation, identifiability."""
        lines = [f"calibration of {self.dry_runs.source}: {len(self.residuals)} observations, "
                 f"{len(self.dry_runs.runs)} dry run(s)"]
        lines.append("fitted values (MB):")
        for key, value in self.coefficients.items():
            lines.append(f"  {key:<20} {value:14.4f}")
        lines.append(f"rank {self.rank} of {len(self.unknowns)} unknowns; condition number {self.condition:.4g}")
        if self.unidentified:
            lines.append(f"not identified: {', '.join(self.unidentified)}")
        lines.append("residual per observation (observed - predicted):")
        lines.append(f"  {'run':>6} {'device':>6} {'observed_mb':>12} {'predicted_mb':>13} {'residual_mb':>12}")
        for row in self.residuals.itertuples(index=False):
            lines.append(f"  {row.run!s:>6} {row.device:>6} {row.observed_mb:12,.2f} {row.predicted_mb:13,.2f} "
                         f"{row.residual_mb:12.4g}")
        lines.append(f"sum of squares {self.sum_of_squares:.6g} MB^2, rms {self.rms_mb:.4g} MB")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


# --------------------------------------------------------------------- the function
def _times(dry: DryRuns, times: Any, trace: LayerTimes | None) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {g: {"forward": t} for g, t in dry.times.items()}
    if trace is not None:
        for group, phases in trace.medians().items():
            if group in ("head", "body", "tail"):
                out[group] = {k: v for k, v in phases.items() if k in ("forward", "backward")}
    if times is not None:
        if not isinstance(times, Mapping):
            raise CalibrationError(
                f"times = {times!r}: expected a mapping such as {{'head': 90, 'body': 90, 'tail': 180}}"
            )
        for group, value in times.items():
            if group not in ("head", "body", "tail"):
                raise CalibrationError(f"times: unknown group {group!r}: expected head, body or tail")
            entry = dict(value) if isinstance(value, Mapping) else {"forward": value}
            for key, ms in entry.items():
                if key not in ("forward", "backward"):
                    raise CalibrationError(f"times[{group!r}]: {key} = {ms!r}: expected forward/backward ms >= 0")
                entry[key] = checks.number(ms, f"times[{group!r}]: {key}", error=CalibrationError, low=0.0,
                                           high=MAX_MS)
            out[group] = entry
    return out


def calibrate(
    source: str | os.PathLike[str] | pd.DataFrame | DryRuns,
    *,
    constant: bool | str = "auto",
    times: Mapping[str, Any] | None = None,
    trace: LayerTimes | None = None,
    weight_holds: float = WEIGHT_HOLDS,
    prior: Profile | None = None,
) -> Calibration:
    """Fit per-layer memory to observed dry-run peaks (see the module docstring).

    Parameters
    ----------
    source: a calibration YAML (the reference format), a CSV or DataFrame of observations
        (one row per run and device, :mod:`sapptk.calibration.observations`), or :class:`DryRuns`.
    constant: fit a constant per device: ``"auto"`` when the data identify it, ``True``
        always (an error if they cannot), ``False`` never (head and tail absorb it).
    times: forward (and optionally backward) ms per group, ``{"body": 90}`` or
        ``{"body": {"forward": 90, "backward": 185}}``; overrides the trace and ``time_config``.
    trace: layer times read from a profiler trace (:func:`sapptk.calibration.layer_times`).
    weight_holds: fraction of a split backward's activation its ``W`` still holds.
    prior: an estimated profile (one body group): fit only a static scale, an activation
        scale and the constant (:mod:`sapptk.calibration.prior`), so even one dry run
        corrects the estimate; ``Calibration.moved`` says what moved, ``.profile`` is the
        prior scaled.

    Raises :class:`~sapptk.errors.CalibrationError` for bad input and for data that cannot
    identify the unknowns (naming them and an observation that would).
    """
    if constant not in ("auto", True, False):
        raise CalibrationError(f"constant = {constant!r}: expected 'auto', True or False")
    from sapptk.calibration.traces import LayerTimes

    weight_holds = checks.number(weight_holds, "weight_holds", error=CalibrationError, low=0.0, high=1.0)
    if trace is not None and not isinstance(trace, LayerTimes):
        checks.fail(CalibrationError, "trace", trace, "layer times read from a trace (sapptk.calibration.layer_times)")
    dry = source if isinstance(source, DryRuns) else read_observations(source)
    obs = [
        _Observation(int(r.run), int(r.device), float(r.peak_mb), device_rows(dry.runs[int(r.run)], int(r.device),
                                                                              weight_holds))
        for r in dry.observations.itertuples(index=False)
    ]
    y = np.array([o.peak for o in obs])
    if prior is not None:
        return _calibrate_prior(dry, obs, y, prior, constant, _times(dry, times, trace), weight_holds)
    everything = np.vstack([o.rows for o in obs])
    cols = [
        COLUMN[n] for n in UNKNOWNS
        if n in ("param", "head", "tail") or (n == "constant" and constant is not False)
        or (n.startswith("activation_") and np.any(everything[:, COLUMN[n]] != 0))
    ]
    names = [UNKNOWNS[c] for c in cols]
    notes: list[str] = []
    sel, x = _fit(obs, cols, y) if len(obs) >= 1 else ([], np.zeros(len(cols)))
    matrix = np.array([o.rows[i, cols] for o, i in zip(obs, sel, strict=True)])
    missing = unidentified(matrix, names)
    dropped: list[str] = []
    if "constant" in missing and constant == "auto":
        cols = [c for c in cols if UNKNOWNS[c] != "constant"]
        names.remove("constant")
        dropped.append("constant")
        notes.append("the dry runs cannot separate the constant from the other unknowns: it is left out, so "
                      "head and tail absorb it (as the reference tool does)")
        sel, x = _fit(obs, cols, y)
        matrix = np.array([o.rows[i, cols] for o, i in zip(obs, sel, strict=True)])
        missing = unidentified(matrix, names)
    if missing:
        rank = rank_and_null(matrix)[0]
        hint = suggest(dry, {(o.run, o.device) for o in obs}, cols, matrix, weight_holds)
        raise CalibrationError(
            f"{dry.source}: the observations cannot identify {', '.join(missing)} (rank {rank} of {len(names)} "
            f"unknowns from {len(obs)} observations): {hint}"
        )
    rank, _, cond = rank_and_null(matrix)
    predicted = matrix @ x
    residuals = _residuals(dry, obs, y, predicted)
    coefficients = pd.Series(
        {n: float(v) for n, v in sorted(zip(names, x, strict=True), key=lambda t: UNKNOWNS.index(t[0]))},
        name="mb", dtype=float,
    )
    coefficients.index.name = "unknown"
    design = pd.DataFrame(matrix, columns=names)
    design.insert(0, "device", residuals["device"].to_numpy())
    design.insert(0, "run", residuals["run"])
    full = {n: float(coefficients.get(n, 0.0)) for n in UNKNOWNS}
    verified = _verify(dry, obs, full, predicted, weight_holds)
    if not verified:
        notes.append("negative fitted figures: the simulator check of the predicted peaks was skipped")
    return Calibration(coefficients=coefficients, residuals=residuals, design=design, rank=rank, unknowns=tuple(names),
                       unidentified=tuple(dropped), condition=cond, times=_times(dry, times, trace), dry_runs=dry,
                       verified=verified, notes=tuple(notes))


def _residuals(dry: DryRuns, obs: list[_Observation], y: np.ndarray, predicted: np.ndarray) -> pd.DataFrame:
    labels = [dry.runs[o.run].label for o in obs]
    return pd.DataFrame({"run": pd.Categorical(labels, categories=list(dict.fromkeys(labels))),
                         "device": np.array([o.device for o in obs], dtype=np.int64), "observed_mb": y,
                         "predicted_mb": predicted, "residual_mb": y - predicted})


_PRIOR_UNKNOWNS = ("static", "activation", "constant", "memory")


def _calibrate_prior(dry: DryRuns, obs: list[_Observation], y: np.ndarray, prior: Any, constant: bool | str,
                     times: dict[str, dict[str, float]], weight_holds: float) -> Calibration:
    """Three unknowns (static and activation scales, constant), fewer when the data are short."""
    everything = np.vstack([o.rows for o in obs])
    used = {m for m in MODES if np.any(everything[:, COLUMN[f"activation_{m}"]] != 0)}
    basis = prior_basis(check_prior(prior, used))
    # columns: static scale, activation scale, constant, and (3) one common memory scale
    reduced = [_Observation(o.run, o.device, o.peak, np.column_stack([r := o.rows @ basis, r[:, 0] + r[:, 1]]))
               for o in obs]
    base, notes = prior_constant(prior), []
    fits = [([0, 1, 2], y)] if constant is not False else []
    fits += [([0, 1], y - base), ([3], y - base)]
    for cols, target in fits:
        sel, x = _fit(reduced, cols, target)
        matrix = np.array([o.rows[i, cols] for o, i in zip(reduced, sel, strict=True)])
        if rank_and_null(matrix)[0] == len(cols):
            break
        notes.append(f"the dry runs cannot identify {' and '.join(_PRIOR_UNKNOWNS[c] for c in cols)} together")
    else:
        raise CalibrationError(f"{dry.source}: no observation constrains the prior's memory scale")
    values = dict(zip(cols, x, strict=True))
    static, activation = values.get(0, values.get(3)), values.get(1, values.get(3))
    fitted_constant = values.get(2, base)
    if 2 not in values:
        notes.append(f"constant fixed at the prior's {base:g} MB")
    time = time_scale(prior, times)
    if time is None:
        notes.append("no measured body forward time: times stay as estimated")
    scales = pd.Series({"static": static, "activation": activation, "time": 1.0 if time is None else time},
                       name="scale", dtype=float)
    full = basis @ np.array([static, activation, fitted_constant])
    names = ["param", *(f"activation_{m}" for m in MODES if m in prior.body[0].modes), "head", "tail", "constant"]
    coefficients = pd.Series({n: float(full[COLUMN[n]]) for n in names}, name="mb", dtype=float)
    coefficients.index.name = "unknown"
    predicted = matrix @ x + (y - target)
    residuals = _residuals(dry, obs, y, predicted)
    unknowns = tuple(_PRIOR_UNKNOWNS[c] for c in cols)
    design = pd.DataFrame(matrix, columns=list(unknowns))
    rank, _, cond = rank_and_null(matrix)
    verified = _verify(dry, obs, {n: float(full[COLUMN[n]]) for n in UNKNOWNS}, predicted, weight_holds)
    return Calibration(coefficients=coefficients, residuals=residuals, design=design, rank=rank, unknowns=unknowns,
                       unidentified=() if 2 in values else ("constant",), condition=cond, times=times, dry_runs=dry,
                       verified=verified, notes=tuple(notes), prior=prior, scales=scales)


def _verify(dry: DryRuns, obs: list[_Observation], values: Mapping[str, float], predicted: np.ndarray,
            weight_holds: float) -> bool:
    """The simulator's peaks at the fitted values equal the predictions (False: not checkable)."""
    runs = sorted({o.run for o in obs})
    costs = {r: run_costs(dry.runs[r], values) for r in runs}
    if any((par < 0).any() or (act < 0).any() for par, act in costs.values()):
        return False
    for r in runs:
        par, act = costs[r]
        # the constant is added outside: a fitted constant may be negative, which simulate refuses
        sim = simulate(dry.runs[r].program, forward=1.0, backward=1.0, activation=act, params=par,
                       weight_holds=weight_holds)
        for o, pred in zip(obs, predicted, strict=True):
            if o.run == r:
                peak = float(sim.peak_memory.iloc[o.device]) + values["constant"]
                if abs(peak - pred) > 1e-6 * max(1.0, abs(pred)):
                    raise AssertionError(f"calibrate: run {r} device {o.device}: simulator peak {peak} != model {pred}")
    return True
