"""An estimated profile as the prior of a calibration: ``calibrate(..., prior=profile)``.

A few dry runs rarely identify every unknown of the memory model (parameter MB per layer,
activation MB per recompute mode, head, tail, constant). With a prior — typically
:func:`sapptk.estimate_profile` — the fit has three unknowns only:

* ``static``: one scale of every static figure of the prior (body parameters, head, tail),
* ``activation``: one scale of every activation figure (each mode, and the head's and
  tail's kept tensors, counted once: one micro-batch in flight on their devices),
* ``constant``: the per-device constant in MB (fixed at the prior's own
  ``provenance["constant_mb"]``, or 0, when the data cannot separate it),

so one dry run of three or more stages identifies them (with fewer observations the
constant is fixed first, then one common memory scale is fitted). Times: the body's
measured forward time (``time_config``, a trace, or ``times=``) over the prior's gives one
``time`` scale of every forward and backward time; without one, times stay as estimated.
The calibrated profile is the prior with these scales applied, same groups and modes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
import pandas as pd

from sapptk.calibration.memory_model import COLUMN, UNKNOWNS
from sapptk.errors import CalibrationError
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile

__all__ = ["SCALES", "check_prior", "moved_frame", "prior_basis", "prior_constant", "scaled_profile", "time_scale"]

SCALES: tuple[str, ...] = ("static", "activation", "constant")
"""The unknowns of a fit with a prior, in the order of :func:`prior_basis`'s columns."""


def check_prior(prior: object, modes_used: set[str]) -> Profile:
    """The prior as a profile with one body group holding every mode the dry runs use."""
    if not isinstance(prior, Profile):
        raise CalibrationError(f"prior = {prior!r}: expected a Profile (e.g. sapptk.estimate_profile(...))")
    if len(prior.body) != 1:
        raise CalibrationError(
            f"prior {prior.name!r} has {len(prior.body)} body groups ({', '.join(g.name for g in prior.body)}): "
            "expected one (the dry-run memory model has one body group)"
        )
    missing = sorted(modes_used - set(prior.body[0].modes), key=MODES.index)
    if missing:
        raise CalibrationError(
            f"prior {prior.name!r}: the dry runs use recompute mode(s) {', '.join(missing)} that its body group "
            f"{prior.body[0].name!r} lacks: expected a prior with every mode the runs use"
        )
    return prior


def _extra(group: LayerGroup | None) -> tuple[float, float]:
    """(static, activation) MB a head or tail adds to its device."""
    if group is None:
        return 0.0, 0.0
    return group.params, min(c.activation for c in group.modes.values())


def prior_basis(prior: Profile) -> np.ndarray:
    """(len(UNKNOWNS), 3) matrix: the memory model's values as a linear function of
    (static scale, activation scale, constant)."""
    basis = np.zeros((len(UNKNOWNS), len(SCALES)))
    body = prior.body[0]
    basis[COLUMN["param"], 0] = body.params
    for mode, cost in body.modes.items():
        basis[COLUMN[f"activation_{mode}"], 1] = cost.activation
    for name, group in (("head", prior.head), ("tail", prior.tail)):
        static, activation = _extra(group)
        basis[COLUMN[name], 0] = static
        basis[COLUMN[name], 1] = activation
    basis[COLUMN["constant"], 2] = 1.0
    return basis


def prior_constant(prior: Profile) -> float:
    """The constant the prior assumes: ``provenance["constant_mb"]`` when it has one, else 0."""
    value = (prior.provenance or {}).get("constant_mb", 0.0)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0.0


def time_scale(prior: Profile, times: Mapping[str, Mapping[str, float]]) -> float | None:
    """Measured body forward / the prior's, or None when no body time was measured."""
    forward = times.get("body", {}).get("forward")
    if forward is None or prior.body[0].forward <= 0:
        return None
    return float(forward) / prior.body[0].forward


def scaled_profile(prior: Profile, scales: Mapping[str, float], *, constant_mb: float = 0.0,
                   name: str | None = None) -> Profile:
    """The prior with ``scales`` (``static``, ``activation``, ``time``) applied; ``constant_mb``
    added to the head's and the tail's static MB (folded, as calibrated profiles are)."""
    s, a, t = scales["static"], scales["activation"], scales.get("time", 1.0)
    groups = []
    for g in prior.groups:
        extra = constant_mb if g.kind in ("head", "tail") else 0.0
        modes = {m: ModeCost(backward=c.backward * t, activation=c.activation * a) for m, c in g.modes.items()}
        kv = None if g.kv_mb_per_token is None else g.kv_mb_per_token * a  # K/V is activation memory
        # replace, not a new group: the long-context fields (attention_share, kv_mb_per_token) stay
        groups.append(dataclasses.replace(g, forward=g.forward * t, params=g.params * s + extra, modes=modes,
                                          kv_mb_per_token=kv))
    provenance = dict(prior.provenance or {})
    provenance["calibrated"] = {k: float(v) for k, v in scales.items()} | {"constant_mb": float(constant_mb)}
    return dataclasses.replace(prior, name=name or prior.name, groups=tuple(groups), source=None, provenance=provenance)


def moved_frame(prior: Profile, scales: Mapping[str, float], constant_mb: float) -> pd.DataFrame:
    """What the data moved: one row per quantity, ``prior`` and ``calibrated`` values, their
    ``scale`` and ``change_pct``."""
    body = prior.body[0]
    t = scales.get("time", 1.0)
    rows = [("body params_mb", body.params, scales["static"])]
    rows += [(f"body activation_{m}_mb", c.activation, scales["activation"]) for m, c in body.modes.items()]
    for name, group in (("head", prior.head), ("tail", prior.tail)):
        if group is not None:
            rows.append((f"{name} params_mb", group.params, scales["static"]))
    rows.append(("body forward_ms", body.forward, t))
    frame = pd.DataFrame(rows, columns=["quantity", "prior", "scale"])
    frame["calibrated"] = frame["prior"] * frame["scale"]
    base = prior_constant(prior)
    frame.loc[len(frame)] = ["constant_mb", base, np.nan, constant_mb]
    frame["change_pct"] = 100.0 * (frame["calibrated"] - frame["prior"]) / frame["prior"].where(frame["prior"] != 0)
    return frame[["quantity", "prior", "calibrated", "scale", "change_pct"]]
