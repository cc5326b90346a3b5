"""Profiles from real runs: memory from dry-run peaks, layer times from profiler traces,
dry runs designed to identify every unknown, and plans checked against measurements.

* :func:`calibrate` (module :mod:`sapptk.calibration.fitting`) fits per-layer memory to
  observed stage peaks by least squares, reading live activations from each dry run's
  own schedule :class:`~sapptk.schedules.Program`; the result is a :class:`Calibration`.
* :func:`design` (module :mod:`sapptk.calibration.dry_runs`) proposes the fewest dry runs
  that identify every unknown.
* :func:`layer_times` and friends (module :mod:`sapptk.calibration.traces`) read layer
  times from PyTorch, MindSpore or any Chrome-trace file.
* :func:`validate` (module :mod:`sapptk.calibration.validation`) compares a plan's
  predicted peaks and step time with what was measured.
"""

from sapptk.calibration.calibration_file import read_calibration_yaml, read_observations
from sapptk.calibration.dry_runs import DryRunDesign, design
from sapptk.calibration.fitting import Calibration, calibrate
from sapptk.calibration.observations import DryRuns
from sapptk.calibration.traces import (
    LayerTimes,
    chrome_layer_times,
    layer_times,
    mindspore_layer_times,
    pytorch_layer_times,
)
from sapptk.calibration.validation import validate

__all__ = [
    "Calibration",
    "DryRunDesign",
    "DryRuns",
    "LayerTimes",
    "calibrate",
    "chrome_layer_times",
    "design",
    "layer_times",
    "mindspore_layer_times",
    "pytorch_layer_times",
    "read_calibration_yaml",
    "read_observations",
    "validate",
]
