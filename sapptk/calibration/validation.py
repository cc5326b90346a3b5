"""A plan checked against what was measured: :func:`validate`.

The prediction is the plan's simulation (peak MB per device, step time); the observation
is what a dry run or a profiled run reported. Errors are predicted − observed: positive
when sapptk over-predicts.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from sapptk.errors import CalibrationError
from sapptk.plan import Plan
from sapptk.simulation import Simulation

__all__ = ["VALIDATION_COLUMNS", "validate"]

VALIDATION_COLUMNS: tuple[str, ...] = (
    "device", "predicted_mb", "observed_mb", "error_mb", "error_pct",
    "predicted_step_ms", "observed_step_ms", "step_error_ms", "step_error_pct",
)


def _observed(observed: Any, devices: int) -> pd.DataFrame:
    if isinstance(observed, Mapping):
        observed = pd.DataFrame({"device": list(observed), "peak_mb": list(observed.values())})
    if isinstance(observed, pd.Series):
        observed = pd.DataFrame({"device": observed.index, "peak_mb": observed.to_numpy()})
    if not isinstance(observed, pd.DataFrame):
        raise CalibrationError(f"validate: observed = {type(observed).__name__}: expected a DataFrame with 'device' "
                               "and 'peak_mb' and/or 'step_time_ms', or a mapping device -> peak MB")
    if "device" not in observed.columns or not ({"peak_mb", "step_time_ms"} & set(observed.columns)):
        raise CalibrationError(f"validate: observed has columns {list(observed.columns)}: expected 'device' and at "
                               "least one of 'peak_mb', 'step_time_ms'")
    out = pd.DataFrame({"device": observed["device"].to_numpy()})
    for i, d in enumerate(out["device"]):
        if isinstance(d, bool) or not isinstance(d, numbers.Integral) or not 0 <= int(d) < devices:
            raise CalibrationError(f"validate: observed row {i}: device = {d!r}: expected a device from 0 to "
                                   f"{devices - 1}")
    if out["device"].duplicated().any():
        d = out.loc[out["device"].duplicated(), "device"].iloc[0]
        raise CalibrationError(f"validate: device {d} is observed twice: expected one row per device")
    for col in ("peak_mb", "step_time_ms"):
        values = observed[col].to_numpy(dtype=float) if col in observed.columns else np.full(len(out), np.nan)
        bad = ~np.isnan(values) & ~np.isfinite(values)
        if bad.any() or (values[~np.isnan(values)] < 0).any():
            raise CalibrationError(f"validate: observed {col}: expected finite values >= 0")
        out[col] = values
    out["device"] = out["device"].astype(np.int64)
    return out


def validate(plan_or_simulation: Plan | Simulation, observed: Any) -> pd.DataFrame:
    """Predicted against observed peak memory and step time, one row per observed device.

    Parameters
    ----------
    plan_or_simulation: a :class:`~sapptk.plan.Plan` (its simulation is used) or a
        :class:`~sapptk.simulation.Simulation`.
    observed: a DataFrame with ``device`` and ``peak_mb`` and/or ``step_time_ms`` (a device's
        measured step time), or a mapping ``{device: peak MB}``.

    Returns columns :data:`VALIDATION_COLUMNS`: errors are predicted − observed, in MB / ms
    and in % of the observed value (NaN where nothing was observed).
    """
    if isinstance(plan_or_simulation, Plan):
        sim = plan_or_simulation.simulation
    elif isinstance(plan_or_simulation, Simulation):
        sim = plan_or_simulation
    else:
        raise CalibrationError(f"validate: got {type(plan_or_simulation).__name__}: expected a Plan or a Simulation")
    obs = _observed(observed, sim.program.stages)
    predicted = sim.peak_memory.to_numpy()[obs["device"].to_numpy()]
    frame = pd.DataFrame({"device": obs["device"], "predicted_mb": predicted, "observed_mb": obs["peak_mb"]})
    frame["error_mb"] = frame["predicted_mb"] - frame["observed_mb"]
    frame["error_pct"] = 100.0 * frame["error_mb"] / frame["observed_mb"].where(frame["observed_mb"] != 0)
    frame["predicted_step_ms"] = float(sim.step_time)
    frame["observed_step_ms"] = obs["step_time_ms"]
    frame["step_error_ms"] = frame["predicted_step_ms"] - frame["observed_step_ms"]
    frame["step_error_pct"] = 100.0 * frame["step_error_ms"] / frame["observed_step_ms"].where(
        frame["observed_step_ms"] != 0)
    return frame.sort_values("device", kind="stable").reset_index(drop=True)[list(VALIDATION_COLUMNS)]
