"""sapptk: plan pipeline-parallel training — balance, simulate, explore.

The core (profiles, schedules, simulator, plans) imports only numpy, pandas and yaml;
``balance`` (OR-Tools) and ``sweep`` (pyarrow, executors) load on first use. The figures
(``sapptk.viz``) and the explorer (``sapptk.widgets``) are imported explicitly.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from sapptk import schedules
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError, DeadlockError, ProfileError, SapptkError, ScheduleError
from sapptk.plan import Plan, even_split, from_mindformers, make_plan
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile, bundled_profile, bundled_profiles, load_profile
from sapptk.simulate import Bubble, Simulation, simulate

_LAZY = {"balance": "sapptk.balance", "sweep": "sapptk.sweep"}

__all__ = [
    "MODES",
    "Bubble",
    "ConfigError",
    "DeadlockError",
    "LayerGroup",
    "ModeCost",
    "PipelineConfig",
    "Plan",
    "Profile",
    "ProfileError",
    "SapptkError",
    "ScheduleError",
    "Simulation",
    "balance",
    "bundled_profile",
    "bundled_profiles",
    "even_split",
    "from_mindformers",
    "load_profile",
    "make_plan",
    "schedules",
    "simulate",
    "sweep",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Load ``balance`` and ``sweep`` (heavier dependencies) when first used."""
    if name in _LAZY:
        value = getattr(import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sapptk' has no attribute {name!r}")
