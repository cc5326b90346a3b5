"""A plan's op order as PyTorch's schedule CSV (``torch.distributed.pipelining``'s
``_dump_csv`` / ``_load_csv``), at plan level.

The codec itself is :mod:`sapptk.schedules.torch_csv` (:meth:`Program.to_csv`,
:func:`sapptk.schedules.from_csv`); here is ``plan.export("torch-csv", path)``. The CSV holds
the order of the ops on every device, not the layers each virtual stage holds, so it cannot be
read back as a plan: :func:`read_plan` says so and names the readers that fit.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NoReturn

from sapptk.errors import ConfigError
from sapptk.formats.base import Export, check_path, make_export, refuse_levers, write_files

if TYPE_CHECKING:
    from sapptk.plan import Plan

__all__ = ["plan_export", "read_plan"]


def plan_export(plan: Plan, path: str | os.PathLike[str] | None = None) -> Export:
    """The op order the plan runs, as PyTorch's schedule CSV (``texts["csv"]``; ``data`` the
    :class:`~sapptk.schedules.Program`), written to ``path`` when given. The order is exact;
    the layer assignment is not part of the CSV. Refused for sequence slices (a CSV action
    names a stage and a micro-batch, no slice)."""
    out = check_path(path, "export('torch-csv')")
    refuse_levers(plan, "torch-csv")  # sequence slices (sapptk.levers)
    program = plan.config.program()
    text = program.to_csv()
    written = {} if out is None else write_files("torch-csv", {"csv": (out, text)})
    step = plan.simulation.step_time if plan.solved else None
    return make_export("torch-csv", text, {"csv": text}, written, step_time_ms=step, expressed_step_time_ms=step,
                       data=program)


def read_plan(source: Any, profile: Any = None, config: Any = None) -> NoReturn:
    """Refused: a schedule CSV holds an op order, not a layer assignment."""
    where = os.fspath(source) if isinstance(source, (str, os.PathLike)) else "<data>"
    raise ConfigError(
        f"{where}: a PyTorch schedule CSV holds the op order of every device, not the layers of each virtual stage: "
        "it cannot be read as a plan. Read the order with sapptk.schedules.from_csv(path) and run it with "
        "PipelineConfig.from_program(program, ...) (then balance or even_split on it), or load a plan file "
        "(format='sapptk')"
    )
