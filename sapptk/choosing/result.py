"""What :func:`sapptk.choose` returns: the ranked frame, the best plan, the Pareto front.

``Choice.frame`` has one row per setup, ranked (balanced setups by step time first, then
pruned ones by bound, then infeasible and invalid ones), with the sweep frame's conventions
(units in the column names, categorical labels):

``rank``
    1 for the winner; balanced setups in order of step time, then the rest.
``schedule`` (categorical), ``stages``, ``chunks``, ``micro_batches``, ``dp``
    the setup (p, v, m; dp = devices / p).
``status`` (categorical, :data:`CHOICE_STATUSES`)
    ``balanced``: a plan was found; ``pruned``: its proven bound is at or above the winner's
    step time, so it was never balanced; ``infeasible``: no plan fits the memory budget
    (``reason`` says which device and by how much); ``invalid``: the setup does not suit the
    profile or schedule (``reason``); ``unsolved``: balanced, but no plan was found in time;
    ``undecided``: the choice was stopped (or ran out of its time limit) before this setup was
    balanced or proven slower.
``solver_status`` (categorical)
    the balancer's status for balanced setups (``optimal``, ``feasible``, ...).
``step_time_ms``, ``pipeline_ms``, ``dp_sync_ms``
    the step time ranked on: the pipeline's simulated step time plus the DP gradient
    synchronisation (:func:`~sapptk.choosing.setups.dp_sync_ms`).
``bound_ms``
    a proven lower bound on the step time of every plan of the setup (the relaxation's,
    the integer model's, the balancer's; plus the least DP synchronisation any plan has).
``gap``
    ``(step_time_ms − bound_ms) / step_time_ms`` for balanced setups.
``samples_per_s_per_device``, ``tokens_per_s_per_device``
    throughput: global batch (× sequence length for tokens, NaN without it) per step time,
    divided by the devices.
``peak_mb_max``, ``bubble_of_step``
    the simulated plan's fullest device and idle share.
``memory_budget_mb``, ``safe_budget_mb``
    the budget per device, and the safe budget below it every setup was planned for with
    ``memory_margin`` or ``oom_risk`` (NaN without them).
``step_time_ms_no_margin``
    with a margin, the winner's setup balanced again at the full budget (its row only): the
    margin's price is ``step_time_ms`` minus it (a lower estimate: other setups are not
    balanced at the full budget).
``bound_seconds``, ``solve_seconds``
    wall time of the bound and of the balance.
``reason``
    why a setup was pruned, is infeasible or invalid.
``key``
    the setup's cache key (:func:`sapptk.sweeps.grid.point_key`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sapptk.pareto import pareto_front

if TYPE_CHECKING:
    from sapptk.plan import Plan

__all__ = ["CHOICE_COLUMNS", "CHOICE_STATUSES", "TIE", "Choice"]

CHOICE_STATUSES: tuple[str, ...] = ("balanced", "pruned", "infeasible", "invalid", "unsolved", "undecided")
"""Every value of ``Choice.frame["status"]``."""

CHOICE_COLUMNS: tuple[str, ...] = (
    "rank", "schedule", "stages", "chunks", "micro_batches", "dp", "status", "solver_status", "step_time_ms",
    "pipeline_ms", "dp_sync_ms", "bound_ms", "gap", "samples_per_s_per_device", "tokens_per_s_per_device",
    "peak_mb_max", "bubble_of_step", "memory_budget_mb", "safe_budget_mb", "step_time_ms_no_margin", "bound_seconds",
    "solve_seconds", "reason", "key",
)
"""The columns of ``Choice.frame`` in order (model-card choices add their parallel columns
after ``dp``)."""

TIE = 1e-9
"""Relative: a bound within this of the best step time counts as reaching it."""

_INT = ("rank", "stages", "chunks", "micro_batches", "dp")


def typed_choice(rows: list[dict[str, Any]], extra: tuple[str, ...] = ()) -> pd.DataFrame:
    """The ranked, typed frame of a choice's rows."""
    frame = pd.DataFrame(rows)
    columns = list(CHOICE_COLUMNS)
    columns[columns.index("dp") + 1:columns.index("dp") + 1] = list(extra)
    frame = frame.reindex(columns=columns)
    order = {"balanced": 0, "unsolved": 1, "undecided": 2, "pruned": 3, "infeasible": 4, "invalid": 5}
    sort_key = frame["status"].map(order).astype(float) * 1e30 + pd.to_numeric(
        frame["step_time_ms"].where(frame["status"] == "balanced", frame["bound_ms"]), errors="coerce").fillna(1e29)
    frame = frame.iloc[np.argsort(sort_key.to_numpy(), kind="stable")].reset_index(drop=True)
    frame["rank"] = np.arange(1, len(frame) + 1)
    for col in _INT + tuple(c for c in extra if c != "zero"):
        frame[col] = pd.to_numeric(frame[col]).astype("int64")
    for col in ("step_time_ms", "pipeline_ms", "dp_sync_ms", "bound_ms", "gap", "samples_per_s_per_device",
                "tokens_per_s_per_device", "peak_mb_max", "bubble_of_step", "memory_budget_mb", "safe_budget_mb",
                "step_time_ms_no_margin", "bound_seconds", "solve_seconds"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("float64")
    frame["status"] = pd.Categorical(frame["status"], categories=CHOICE_STATUSES)
    frame["schedule"] = pd.Categorical(frame["schedule"], categories=list(dict.fromkeys(frame["schedule"])))
    solver = frame["solver_status"].astype(object)
    frame["solver_status"] = pd.Categorical(solver.where(solver.notna(), None),
                                            categories=["optimal", "feasible", "unknown", "infeasible"])
    if "zero" in frame:
        frame["zero"] = pd.Categorical(frame["zero"].astype(object))
    frame["reason"] = frame["reason"].astype(object).where(frame["reason"].notna(), None)
    return frame


@dataclass
class Choice:
    """The answer of :func:`sapptk.choose`.

    ``frame``: one row per setup, ranked (module docstring). ``best``: the winner's
    :class:`~sapptk.plan.Plan` (None only when the choice was stopped before any setup was
    balanced). ``proven``: every other setup is proven no faster than the
    winner (a bound at or above its step time, or an optimal balance no faster).
    ``plans``: the plans of the balanced setups, by the setup's row index in ``frame``.
    ``profiles``: the profile of each setup row (model-card choices estimate one per setup).
    ``seconds``: wall time of the whole choice. ``notes``: what the choice assumed (for
    instance, no DP synchronisation without a bandwidth). ``timings``: wall seconds by step
    (:data:`sapptk.choosing.run.STEPS`: ``bound``, ``tighten``, ``balance``, ``prove``,
    ``retry``, ``other``), adding up to ``seconds``. ``status``: ``"complete"`` (every setup
    decided), ``"stopped"`` (the ``stop`` event was set; ``undecided`` rows were left) or
    ``"time limit"`` (the whole call's ``time_limit`` ran out; ``undecided`` rows were left).
    """

    frame: pd.DataFrame
    best: Plan | None
    proven: bool
    plans: dict[int, Plan] = field(default_factory=dict)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    status: str = "complete"

    @property
    def counts(self) -> dict[str, int]:
        """How many setups ended in each status."""
        return {s: int((self.frame["status"] == s).sum()) for s in CHOICE_STATUSES}

    @property
    def pareto(self) -> pd.DataFrame:
        """The balanced setups no other beats in both step time and peak memory (by step time)."""
        done = self.frame[(self.frame["status"] == "balanced") & self.frame["peak_mb_max"].notna()]
        if done.empty:
            return done.copy()
        keep = pareto_front(done[["step_time_ms", "peak_mb_max"]].to_numpy(dtype=float))
        return done.iloc[keep].sort_values("step_time_ms").reset_index(drop=True)

    @property
    def open_setups(self) -> pd.DataFrame:
        """The setups keeping the winner's proof open: every row but the winner's that is not
        infeasible or invalid and whose proven ``bound_ms`` is below the winner's step time (or
        has no bound), least bound first. Empty when the winner is proven."""
        if self.best is None or self.frame.empty:
            return self.frame.iloc[:0].copy()
        best = float(self.frame["step_time_ms"].iloc[0])
        rest = self.frame.iloc[1:]
        keep = ~rest["status"].isin(["infeasible", "invalid"]) & ~(rest["bound_ms"] >= best * (1 - TIE))
        cols = [c for c in ("rank", "schedule", "stages", "chunks", "micro_batches", "dp", "tp", "cp", "ep", "zero",
                            "status", "step_time_ms", "bound_ms", "reason") if c in self.frame]
        return rest.loc[keep, cols].sort_values("bound_ms", na_position="first").reset_index(drop=True)

    @property
    def proof_gap(self) -> float:
        """How far the least bound of :attr:`open_setups` stays under the winner's step time, as a
        share of it (0.0 when nothing keeps the proof open; 1.0 when an open setup has no bound;
        NaN without a winner)."""
        if self.best is None or self.frame.empty:
            return float("nan")
        open_ = self.open_setups
        if open_.empty:
            return 0.0
        best = float(self.frame["step_time_ms"].iloc[0])
        least = float(open_["bound_ms"].min(skipna=False))
        return 1.0 if np.isnan(least) else max(0.0, (best - least) / best)

    def top(self, n: int = 10) -> pd.DataFrame:
        """The first ``n`` rows of the ranking, in a few columns."""
        cols = [c for c in ("rank", "schedule", "stages", "chunks", "micro_batches", "dp", "tp", "cp", "ep", "zero",
                            "status", "step_time_ms", "bound_ms", "peak_mb_max", "tokens_per_s_per_device")
                if c in self.frame]
        return self.frame[cols].head(n)

    def summary(self) -> str:
        """A few lines: the winner, how many setups were pruned, whether the winner is proven."""
        c = self.counts
        ended = {"stopped": "stopped before every setup was decided",
                 "time limit": "the time limit ran out before every setup was decided"}.get(self.status)
        if self.best is None:
            return "\n".join([f"no winner: {ended or 'nothing balanced'} ({c['undecided']} undecided, "
                              f"{c['pruned']} pruned, {c['infeasible']} infeasible, {c['invalid']} invalid) "
                              f"in {self.seconds:.1f} s", *self.notes])
        w = self.frame.iloc[0]
        layout = "".join(f" {k} {w[k]}" for k in ("tp", "cp", "ep", "zero") if k in self.frame)
        lines = [
            f"winner: {w['schedule']} stages {w['stages']} chunks {w['chunks']} micro-batches {w['micro_batches']} "
            f"dp {w['dp']}{layout}: step {w['step_time_ms']:,.1f} ms, peak {w['peak_mb_max']:,.0f} MB",
            f"setups: {len(self.frame)} ({c['balanced']} balanced, {c['pruned']} pruned by bounds, "
            f"{c['infeasible']} infeasible, {c['invalid']} invalid, {c['unsolved']} unsolved"
            + (f", {c['undecided']} undecided" if c["undecided"] else "") + f") in {self.seconds:.1f} s",
            "winner proven: every other setup has a bound at or above its step time" if self.proven else
            self._not_proven(),
        ]
        if ended:
            lines.append(f"{ended}: the ranking is partial")
        return "\n".join(lines + self.notes)

    def _not_proven(self) -> str:
        open_ = self.open_setups
        if open_.empty:
            return "winner NOT proven"
        o = open_.iloc[0]
        return (f"winner NOT proven: {len(open_)} setup(s) keep the proof open, the least bound "
                f"{o['schedule']} stages {o['stages']} chunks {o['chunks']} at {o['bound_ms']:,.1f} ms, "
                f"{100 * self.proof_gap:.2f} % under the winner (raise setup_time_limit, bound_time or time_limit)")

    def __repr__(self) -> str:
        return f"Choice({len(self.frame)} setups, best={self.best!r}, proven={self.proven})"
