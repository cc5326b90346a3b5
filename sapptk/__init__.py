"""sapptk: plan pipeline-parallel training — balance, simulate, explore.

``sapptk.balance`` and ``sapptk.sweep`` are the functions (their modules share the names:
reach a module with ``importlib.import_module("sapptk.sweep")``). The figures
(``sapptk.viz``) and the explorer (``sapptk.widgets``) are imported explicitly, so the core
runs headless.
"""

from __future__ import annotations

from sapptk import schedules
from sapptk.balance import balance
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError, DeadlockError, ProfileError, SapptkError, ScheduleError
from sapptk.plan import Plan, even_split, from_mindformers, make_plan
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile, bundled_profile, bundled_profiles, load_profile
from sapptk.simulate import Bubble, Simulation, simulate
from sapptk.sweep import sweep

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

