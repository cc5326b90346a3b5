"""The choice ranked again with what the trials measured (:func:`rerank`).

Every setup the choice balanced or pruned is simulated with the costs fitted from the trials
(:meth:`~sapptk.trials.ingesting.Calibrated.predict`): its layers per virtual stage are the
trial's when it was trialled, the choice's plan when it has one, else an even split of the
body layers (the note says so). A trialled setup that ran out of memory or crashed ranks
last: it does not run there. ``next_round`` lists the setups not trialled yet that could
still win: a calibrated step time within the fit's worst error of the best measured step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from sapptk.errors import ConfigError, SapptkError

__all__ = ["Reranked", "rerank"]

_SETUP = ["schedule", "stages", "chunks", "micro_batches", "dp"]


@dataclass
class Reranked:
    """What :func:`rerank` returns.

    ``frame``: one row per setup, best first: ``rank``, ``rank_before``, ``moved``
    (rank_before − rank), the setup, ``trial`` (``ok``, ``oom``, ``crashed``, ... or
    ``not trialled``), ``before_ms`` (the choice's step time, or its bound for a pruned setup),
    ``calibrated_ms``, ``measured_ms``, ``spread_ms`` (step-to-step interquartile range),
    ``layers`` (where the layer split came from: trial, plan or even). ``winner_changed``,
    ``next_round`` (rows of ``frame``), ``tolerance`` (the fit's worst |error| over the trials).
    """

    frame: pd.DataFrame
    winner_changed: bool
    next_round: pd.DataFrame
    tolerance: float
    notes: list[str] = field(default_factory=list)

    @property
    def moved(self) -> pd.DataFrame:
        """The rows whose rank changed."""
        return self.frame[self.frame["moved"] != 0]

    def summary(self) -> str:
        """A few lines: the winner now and before, what moved, what to trial next."""
        w = self.frame.iloc[0]
        lines = [f"winner: {w['schedule']} p {w['stages']} v {w['chunks']} m {w['micro_batches']} dp {w['dp']}: "
                 f"calibrated {w['calibrated_ms']:.1f} ms, measured {w['measured_ms']:.1f} ms"
                 + (" (changed: it was rank " + str(int(w["rank_before"])) + ")" if self.winner_changed
                    else " (unchanged)"),
                 f"{len(self.moved)} of {len(self.frame)} setups moved; fit tolerance {self.tolerance:.1%}"]
        for r in self.next_round.itertuples():
            lines.append(f"next round: {r.schedule} p {r.stages} v {r.chunks} m {r.micro_batches} dp {r.dp} "
                         f"(calibrated {r.calibrated_ms:.1f} ms)")
        if self.next_round.empty:
            lines.append("next round: none: no untrialled setup can beat the best measured one within the tolerance")
        return "\n".join(lines + self.notes)


def _even(layers: int, parts: int) -> list[int]:
    base, extra = divmod(layers, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def rerank(choice: Any, calibrated: Any, *, next_k: int = 3) -> Reranked:
    """Rank the setups of ``choice`` again with ``calibrated`` (:func:`~sapptk.trials.ingest`'s
    answer); see the module docstring."""
    from sapptk.choosing.result import Choice
    from sapptk.trials.ingesting import Calibrated

    if not isinstance(choice, Choice):
        raise ConfigError(f"choice: expected a sapptk.Choice, got {type(choice).__name__}")
    if not isinstance(calibrated, Calibrated):
        raise ConfigError(f"calibrated: expected what sapptk.trials.ingest returned, got {type(calibrated).__name__}")
    if isinstance(next_k, bool) or not isinstance(next_k, int) or next_k < 0:
        raise ConfigError(f"next_k = {next_k!r}: expected an integer >= 0")
    from sapptk.schedules import build

    runs = calibrated.runs
    manifests = {}
    import json

    for trial in runs["trial"].unique():
        manifests[trial] = json.loads((calibrated.folder / trial / "manifest.json").read_text(encoding="utf-8"))
    body = sum(g.count for g in choice.best.profile.groups if g.kind == "body")
    rows, notes = [], []
    evens = 0
    for index, row in choice.frame.iterrows():
        if row["status"] not in ("balanced", "unsolved", "pruned"):
            continue
        setup = {k: (str(row[k]) if k == "schedule" else int(row[k])) for k in _SETUP}
        mine = runs[np.logical_and.reduce([runs[k].astype(str if k == "schedule" else int) == setup[k]
                                           for k in _SETUP])]
        if len(mine):
            layers, source = manifests[mine["trial"].iloc[0]]["setup"]["layers_per_virtual_stage"], "trial"
        elif int(index) in choice.plans:
            counts = np.asarray(choice.plans[int(index)].counts)
            n_body = sum(1 for g in choice.best.profile.groups if g.kind == "body")
            layers, source = [int(x) for x in counts[:n_body].sum(axis=(0, 1))], "plan"
        else:
            n = build(setup["schedule"], stages=setup["stages"], micro_batches=setup["micro_batches"],
                      chunks=setup["chunks"]).num_virtual_stages
            layers, source = _even(body, n), "even"
            evens += 1
        ok = mine[mine["status"] == "ok"]
        failed = mine[mine["status"].isin(["oom", "crashed"])]
        trial = "not trialled" if mine.empty else ("ok" if len(ok) else str(mine["status"].iloc[0]))
        if len(failed) and not len(ok):
            trial = str(failed["status"].iloc[0])
        try:
            value = calibrated.predict(setup["schedule"], setup["stages"], setup["chunks"], setup["micro_batches"],
                                       layers, dp=setup["dp"])
        except SapptkError as exc:
            value = np.nan
            notes.append(f"{setup['schedule']} p {setup['stages']} v {setup['chunks']} dp {setup['dp']}: {exc}")
        before = row["step_time_ms"] if np.isfinite(row["step_time_ms"]) else row["bound_ms"]
        rows.append({"rank_before": int(row["rank"]), **setup, "trial": trial, "before_ms": float(before),
                     "calibrated_ms": value,
                     "measured_ms": float(ok["measured_ms"].median()) if len(ok) else np.nan,
                     "spread_ms": float(ok["spread_ms"].median()) if len(ok) else np.nan, "layers": source})
    if not rows:
        raise ConfigError("choice: no balanced or pruned setup to rank")
    frame = pd.DataFrame(rows)
    failed = frame["trial"].isin(["oom", "crashed"])
    key = np.where(failed, np.inf, frame["calibrated_ms"].fillna(np.inf))
    frame = frame.iloc[np.argsort(key, kind="stable")].reset_index(drop=True)
    frame.insert(0, "rank", np.arange(1, len(frame) + 1))
    frame.insert(2, "moved", frame["rank_before"] - frame["rank"])
    frame["schedule"] = pd.Categorical(frame["schedule"])
    frame["trial"] = pd.Categorical(frame["trial"])
    frame["layers"] = pd.Categorical(frame["layers"], categories=["trial", "plan", "even"])
    errors = calibrated.runs["fitted_error"].abs()
    tolerance = float(errors.max()) if errors.notna().any() else np.nan
    best_measured = frame["measured_ms"].min()
    open_rows = frame[(frame["trial"] == "not trialled") & frame["calibrated_ms"].notna()]
    if np.isfinite(best_measured):
        open_rows = open_rows[open_rows["calibrated_ms"] <= best_measured * (1 + tolerance)]
    if evens:
        notes.append(f"{evens} setups without a plan were costed with an even split of the body layers")
    return Reranked(frame=frame, winner_changed=int(frame["rank_before"].iloc[0]) != 1,
                    next_round=open_rows.head(next_k).reset_index(drop=True), tolerance=tolerance, notes=notes)
