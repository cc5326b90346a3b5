"""The search's shared state: the best plan found so far, and every critical path seen.

Every phase hands the plans it finds to :meth:`Incumbent.evaluate` (exact step ticks, and
the critical path of each, which joins the pool and, when a master is attached, becomes a
cut ``z ≥ length of the path`` in it) and :meth:`Incumbent.offer` (kept when faster).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sapptk.solver.paths import path_key

if TYPE_CHECKING:
    from sapptk.solver.clock import Clock
    from sapptk.solver.masters import Master
    from sapptk.solver.problem import Problem

__all__ = ["Incumbent"]


class Incumbent:
    """Best assignment (``counts``, ``ticks``), the pool of paths (``paths``: key → (signature,
    crossings)) and when each improvement came (``trace``: (seconds, ticks))."""

    def __init__(self, problem: Problem, clock: Clock) -> None:
        self.problem = problem
        self.clock = clock
        self.counts: np.ndarray | None = None
        self.ticks: int | None = None
        self.paths: dict[bytes, tuple[np.ndarray, int]] = {}
        self.master: Master | None = None
        self.trace: list[tuple[float, int]] = []

    def evaluate(self, counts_list: list[np.ndarray], cap: int | None = None) -> list[int]:
        """Exact step ticks of each assignment. Every critical path joins the pool and, when it
        is longer than ``cap`` (or always, without a cap), the attached master as a cut."""
        if not counts_list:
            return []
        steps, found = self.problem.critical_paths(self.problem.cost_vectors(counts_list))
        for step, (sig, crossings) in zip(steps.tolist(), found, strict=True):
            self.paths.setdefault(path_key(sig, crossings), (sig, crossings))
            if self.master is not None and (cap is None or step > cap):
                self.master.add_cut(sig, crossings)
        return [int(s) for s in steps.tolist()]

    def offer(self, counts: np.ndarray, ticks: int) -> bool:
        """Keep ``counts`` if it is faster than the incumbent; True if kept."""
        if self.ticks is None or ticks < self.ticks:
            self.counts, self.ticks = counts, int(ticks)
            self.trace.append((self.clock.elapsed(), self.ticks))
            self.clock.progress()
            return True
        return False

    def attach(self, master: Master) -> None:
        """Make ``master`` the one that receives cuts, with every device chain and every path seen."""
        self.master = master
        paths = self.problem.paths
        for d in range(self.problem.program.stages):
            master.add_cut(paths.device_sig[d], 0)
        for sig, crossings in self.paths.values():
            master.add_cut(sig, crossings)
