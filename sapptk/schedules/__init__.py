"""Schedules as data: each builder returns a :class:`Program`, the per-device op order."""

from sapptk.schedules.program import (
    KIND_NAMES,
    KINDS,
    Op,
    OpArrays,
    Program,
    ProgramGraph,
    make_program,
    program_from_arrays,
)
from sapptk.schedules.registry import ScheduleSpec, available, build, get, names, register
from sapptk.schedules.torch_csv import from_csv, from_csv_text
from sapptk.schedules.zerobubble import OpCosts

__all__ = [
    "KINDS",
    "KIND_NAMES",
    "Op",
    "OpArrays",
    "Program",
    "ProgramGraph",
    "ScheduleSpec",
    "OpCosts",
    "available",
    "build",
    "from_csv",
    "from_csv_text",
    "get",
    "make_program",
    "names",
    "program_from_arrays",
    "register",
]
