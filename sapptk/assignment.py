"""An :class:`Assignment`: a layer assignment of one pipeline setup and what is known of it.

The one record both layers share: the solver's phases hand an ``Assignment`` from one to the
next (``sapptk.solver.pipeline`` calls it ``Found``; the solver never builds a Plan), and a
:class:`~sapptk.plan.Plan` *is* an ``Assignment`` with its profile, its solve time and its
DataFrame views added. A field of both is declared here once.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import numpy as np

    from sapptk.config import PipelineConfig
    from sapptk.costs import AlternativeLayout

__all__ = ["SOLVED_STATUSES", "Assignment"]

SOLVED_STATUSES: tuple[str, ...] = ("optimal", "feasible", "given")
"""The statuses of an assignment that holds layers (the others: ``infeasible``, ``unknown``)."""

_Self = TypeVar("_Self", bound="Assignment")


@dataclass(frozen=True, eq=False)
class Assignment:
    """A layer assignment of ``config`` and what is known of it.

    ``counts``: int array (body groups, len(MODES), virtual stages), None when nothing was found
    (a Plan stores zeros). ``status``: ``optimal``, ``feasible``, ``given``, ``infeasible`` or
    ``unknown``. ``step_time``, ``bound``: ms; ``gap``: ``(step_time − bound) / step_time``.
    ``message``: notes of whoever made it; ``source``: ``"balance"``, ``"even_split(none)"``, ...
    ``offload``: (body groups, virtual stages) mode-``none`` layers whose activations go to host
    memory, or None. ``alternative``: recompute per micro-batch, or None.
    """

    config: PipelineConfig
    status: str
    counts: np.ndarray | None
    step_time: float | None
    bound: float | None = None
    gap: float | None = None
    message: str = ""
    source: str = "balance"
    offload: np.ndarray | None = None
    alternative: AlternativeLayout | None = None

    @property
    def solved(self) -> bool:
        """Whether it holds an assignment (status optimal, feasible or given)."""
        return self.status in SOLVED_STATUSES and self.counts is not None

    def noted(self: _Self, note: str) -> _Self:
        """This assignment with ``note`` added to its message."""
        return dataclasses.replace(self, message=f"{self.message}; {note}" if self.message else note)
