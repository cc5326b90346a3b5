"""Profiles from real runs: memory from dry-run peaks, layer times from profiler traces,
dry runs designed to identify every unknown, and plans checked against measurements.

* :func:`calibrate` (module :mod:`sapptk.calibration.fitting`) fits per-layer memory to
  observed stage peaks by least squares, reading live activations from each dry run's
  own schedule :class:`~sapptk.schedules.Program`; the result is a :class:`Calibration`.
* :func:`design` (module :mod:`sapptk.calibration.dry_runs`) proposes the fewest dry runs
  that identify every unknown.
"""

from sapptk.calibration.dry_runs import DryRunDesign, design
from sapptk.calibration.fitting import Calibration, calibrate
from sapptk.calibration.observations import DryRuns, read_calibration_yaml, read_observations

__all__ = [
    "Calibration",
    "DryRunDesign",
    "DryRuns",
    "calibrate",
    "design",
    "read_calibration_yaml",
    "read_observations",
]
