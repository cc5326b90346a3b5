"""Schedules as data: each builder returns a :class:`Program`, the per-device op order."""

from sapptk.schedules.program import KIND_NAMES, KINDS, Op, Program, ProgramGraph, make_program
from sapptk.schedules.registry import ScheduleSpec, available, build, get, names, register

__all__ = [
    "KINDS",
    "KIND_NAMES",
    "Op",
    "Program",
    "ProgramGraph",
    "ScheduleSpec",
    "available",
    "build",
    "get",
    "make_program",
    "names",
    "register",
]
