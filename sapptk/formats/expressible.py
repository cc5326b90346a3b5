"""Layer assignments a runtime can express: every layer's mode by a rule, and the closest one.

Megatron-LM and torchtitan set activation recompute by one rule for every model chunk
(all layers in one mode, the first k layers of every chunk, ...), while a sapptk plan may
choose per cell. :func:`counts_from_layers` builds the assignment a rule gives on a
partition; :func:`closest` picks, among the rules a runtime has, the one to run: the fastest
that fits the memory budget, else the one with the least peak (both evaluated with the
simulator's own figures).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sapptk.costs import fits_budget
from sapptk.profile import MODES

__all__ = ["ExpressedCost", "closest", "counts_from_layers", "modes_used"]

_NONE = MODES.index("none")


class ExpressedCost:
    """What an export lost, for export dataclasses with ``notes`` (what the runtime cannot
    express), ``step_time_ms`` (the plan's) and ``expressed_step_time_ms`` (what the runtime
    runs instead)."""

    notes: tuple[str, ...]
    step_time_ms: float | None
    expressed_step_time_ms: float | None

    @property
    def exact(self) -> bool:
        """Whether the runtime runs the plan as made (nothing lost)."""
        return not self.notes

    @property
    def cost_ms(self) -> float | None:
        """Step time lost by forcing the plan into the runtime's settings (ms)."""
        if self.step_time_ms is None or self.expressed_step_time_ms is None:
            return None
        return self.expressed_step_time_ms - self.step_time_ms


def counts_from_layers(profile: Any, layers: Sequence[int], mode_of: Any = None) -> np.ndarray:
    """A counts array (groups, modes, virtual stages) from body layers per virtual stage.

    Body groups fill the layers in model order. ``mode_of(vs, position)`` gives the mode index
    of the ``position``-th layer (0-based, model order) of virtual stage ``vs``; all ``none``
    by default.
    """
    layers = np.asarray(layers, dtype=np.int64)
    body = tuple(profile.body)
    counts = np.zeros((len(body), len(MODES), len(layers)), dtype=np.int64)
    bounds = np.cumsum([0] + [g.count for g in body])
    start = 0
    for vs, n in enumerate(layers):
        for pos in range(int(n)):
            g = int(np.searchsorted(bounds, start + pos, side="right") - 1)
            counts[g, _NONE if mode_of is None else mode_of(vs, pos), vs] += 1
        start += int(n)
    return counts



def modes_used(counts: np.ndarray) -> str:
    """``"80 layers none, 16 layers full"``: the layers in each mode an assignment uses."""
    per_mode = np.asarray(counts).sum(axis=(0, 2))
    return ", ".join(f"{int(n)} layers {MODES[r]}" for r, n in enumerate(per_mode) if n)


def closest(profile: Any, config: Any, candidates: Mapping[str, np.ndarray]) -> tuple[str, bool]:
    """The candidate a runtime should use: the fastest that fits the budget, else the one with
    the least peak. Returns ``(label, fits)``."""
    from sapptk.costs import peak_memory, simulate_counts

    budget = config.memory_budget
    peaks = {lab: float(peak_memory(profile, config, cnt).max()) for lab, cnt in candidates.items()}
    fitting = [lab for lab in candidates if fits_budget(peaks[lab], budget)]
    if not fitting:
        return min(candidates, key=lambda lab: peaks[lab]), False
    steps = {lab: simulate_counts(profile, config, candidates[lab]).step_time for lab in fitting}
    return min(fitting, key=lambda lab: (steps[lab], peaks[lab])), True
