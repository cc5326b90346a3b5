"""sapptk: plan pipeline-parallel training — balance, simulate, explore.

The public names below are loaded on first use (PEP 562), so ``import sapptk`` is light:
OR-Tools loads with the first ``balance``, pyarrow with the first cached sweep, Bokeh with
``sapptk.viz``. Every module has a name of its own, distinct from the functions exported
here (``sapptk.balance`` is the function, :mod:`sapptk.balancer` its module), so importing
a module never rebinds a public function. Figures (:mod:`sapptk.viz`) and the explorer
(:mod:`sapptk.explorer`) are never imported by the core.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS: dict[str, str] = {
    "SapptkError": "sapptk.errors",
    "ProfileError": "sapptk.errors",
    "ScheduleError": "sapptk.errors",
    "DeadlockError": "sapptk.errors",
    "ConfigError": "sapptk.errors",
    "FileError": "sapptk.errors",
    "SapptkWarning": "sapptk.errors",
    "MODES": "sapptk.profile",
    "LayerGroup": "sapptk.profile",
    "ModeCost": "sapptk.profile",
    "Profile": "sapptk.profile",
    "bundled_profile": "sapptk.profile",
    "bundled_profiles": "sapptk.profile",
    "load_profile": "sapptk.profile",
    "Bubble": "sapptk.simulation",
    "Simulation": "sapptk.simulation",
    "simulate": "sapptk.simulation",
    "OffloadSimulation": "sapptk.simulation",
    "PipelineConfig": "sapptk.config",
    "AlternativeLayout": "sapptk.costs",
    "Plan": "sapptk.plan",
    "even_split": "sapptk.plan",
    "load_plan": "sapptk.plan",
    "load_plans": "sapptk.plan",
    "Export": "sapptk.formats.base",
    "make_plan": "sapptk.plan",
    "balance": "sapptk.balancer",
    "solve": "sapptk.balancer",
    "SolveRequest": "sapptk.request",
    "Calibration": "sapptk.calibration.fitting",
    "calibrate": "sapptk.calibration.fitting",
    "validate": "sapptk.calibration.validation",
    "CalibrationError": "sapptk.errors",
    "TraceError": "sapptk.errors",
    "SearchOptions": "sapptk.solver.settings",
    "sweep": "sapptk.sweeps",
    "choose": "sapptk.choosing",
    "Choice": "sapptk.choosing",
    "ChooseRequest": "sapptk.choosing",
    "estimate_profile": "sapptk.models.estimate",
    "fit_hardware": "sapptk.models.hardware_fit",
    "SliceChoice": "sapptk.solver.slices",
    "choose_slices": "sapptk.solver.slices",
}
_MODULES = ("schedules", "calibration", "models")

__all__ = [
    "AlternativeLayout",
    "Bubble",
    "Calibration",
    "CalibrationError",
    "Choice",
    "ChooseRequest",
    "ConfigError",
    "DeadlockError",
    "Export",
    "FileError",
    "LayerGroup",
    "MODES",
    "ModeCost",
    "OffloadSimulation",
    "PipelineConfig",
    "Plan",
    "Profile",
    "ProfileError",
    "SapptkError",
    "SapptkWarning",
    "ScheduleError",
    "SearchOptions",
    "Simulation",
    "SliceChoice",
    "SolveRequest",
    "TraceError",
    "balance",
    "bundled_profile",
    "calibrate",
    "calibration",
    "bundled_profiles",
    "choose",
    "choose_slices",
    "even_split",
    "estimate_profile",
    "fit_hardware",
    "load_plan",
    "load_plans",
    "load_profile",
    "make_plan",
    "models",
    "schedules",
    "simulate",
    "solve",
    "sweep",
    "validate",
]

if TYPE_CHECKING:  # for type checkers and IDEs; at run time the names load lazily
    from sapptk import calibration, models, schedules
    from sapptk.balancer import balance, solve
    from sapptk.calibration.fitting import Calibration, calibrate
    from sapptk.calibration.validation import validate
    from sapptk.choosing import Choice, ChooseRequest, choose
    from sapptk.config import PipelineConfig
    from sapptk.errors import (
        CalibrationError,
        ConfigError,
        DeadlockError,
        FileError,
        ProfileError,
        SapptkError,
        SapptkWarning,
        ScheduleError,
        TraceError,
    )
    from sapptk.formats.base import Export
    from sapptk.models.estimate import estimate_profile
    from sapptk.models.hardware_fit import fit_hardware
    from sapptk.plan import (
        Plan,
        even_split,
        load_plan,
        load_plans,
        make_plan,
    )
    from sapptk.profile import MODES, LayerGroup, ModeCost, Profile, bundled_profile, bundled_profiles, load_profile
    from sapptk.request import SolveRequest
    from sapptk.simulation import Bubble, OffloadSimulation, Simulation, simulate
    from sapptk.solver.settings import SearchOptions
    from sapptk.solver.slices import SliceChoice, choose_slices
    from sapptk.sweeps import sweep


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
    elif name in _MODULES:
        value = importlib.import_module(f"sapptk.{name}")
    else:
        raise AttributeError(f"module 'sapptk' has no attribute {name!r}")
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
