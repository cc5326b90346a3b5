"""Where each setup of a choice stands: a named state, and what its twins share.

A setup moves through :class:`SetupState` in order (a state is never left for an earlier
one); :mod:`sapptk.choosing.run` has one step function per state. Setups with the same
program, profile and limits are *twins* (interleaved and interleaved-rf when p divides m,
...): they share one :class:`Twin` record, so a bound tightened or a balance run for one
holds for all of them.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from sapptk.choosing.bounds import SetupBound
from sapptk.sweeps.solving import PointResult

__all__ = ["SetupState", "Twin"]


class SetupState(enum.IntEnum):
    """How far a setup has gone (ordered: later states compare greater).

    ``ENUMERATED``: a row, not yet bounded. ``BOUNDED``: its first bound (the LP over device
    work, one round). ``TIGHTENED``: whole layouts, or LP path rows. ``INTEGER``: tightened as
    far as before a balance (the integer model, or whole layouts, which make it needless).
    ``BALANCED``: a plan, perhaps with a gap. ``PROVING``: a longer layout bound below the best
    step time was computed. ``RETRIED``: balanced a second time from its own plan. ``DECIDED``:
    out of the queue (balanced and proven or kept with its gap, pruned, infeasible, invalid).
    """

    ENUMERATED = 0
    BOUNDED = 1
    TIGHTENED = 2
    INTEGER = 3
    BALANCED = 4
    PROVING = 5
    RETRIED = 6
    DECIDED = 7


@dataclass
class Twin:
    """What the twins of one program, profile and limits share.

    ``bound`` and ``level``: the best bound so far and how far it was tightened (``BOUNDED``,
    ``TIGHTENED`` or ``INTEGER``). ``layouts``: whether whole layouts could be enumerated, and
    ``layout_ub`` the incumbent (pipeline ms) the layout bound was computed below. ``short``:
    the last tightening stopped at a goal below the best step time. ``rows_done``: its path LP
    converged or ran out of time (no more rows to add). ``memo``: :func:`layout_bound`'s problem
    and paths. ``result`` and ``retry_result``: the first and second balance. ``long_bound``
    and ``long_ub``: the longer layout bound of a balanced setup and the incumbent below which
    it was computed.
    """

    bound: SetupBound
    level: SetupState = SetupState.BOUNDED
    layouts: bool = False
    layout_ub: float = math.inf
    short: bool = False
    rows_done: bool = True
    memo: dict[str, Any] = field(default_factory=dict)
    result: PointResult | None = None
    retry_result: PointResult | None = None
    long_bound: SetupBound | None = None
    long_ub: float = math.inf

    def set_bound(self, bound: SetupBound, level: SetupState | None = None) -> None:
        """A tighter bound (and, with ``level``, how far it was tightened)."""
        self.bound = bound
        if level is not None:
            self.level = level
