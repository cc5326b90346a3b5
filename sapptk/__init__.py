"""sapptk: plan pipeline-parallel training — balance, simulate, explore."""

from sapptk.errors import ConfigError, DeadlockError, ProfileError, SapptkError, ScheduleError
from sapptk.simulate import Bubble, Simulation, simulate

__all__ = [
    "Bubble",
    "ConfigError",
    "DeadlockError",
    "ProfileError",
    "SapptkError",
    "ScheduleError",
    "Simulation",
    "simulate",
]
__version__ = "0.1.0"
