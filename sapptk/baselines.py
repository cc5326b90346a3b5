"""The naive baselines: layers spread evenly over the virtual stages, every layer in one recompute mode.

One function, :func:`even_counts`, returns the layer assignment (``counts``, no
:class:`~sapptk.plan.Plan`): the solver starts from it and :func:`sapptk.even_split` (the one
public even split) wraps it in a plan. It sits below the solver and the plan, so neither has to
reach up for it.

The split: every (chunk, device) cell gets ⌊N/(p·v)⌋ body layers; the ``N mod (p·v)`` extra
layers go one each to the devices nearest the middle of the pipeline (ties to the lower
device), on the last chunk first, then the one before. For one chunk this is MindFormers'
documented example (48 layers on 5 stages: ``offset: [0, 1, 1, 1, 0]``). The ends are avoided
because they carry the head and the tail, and the last chunk because it keeps the fewest
micro-batches live. Body groups follow each other in model order over the virtual stages.

``recompute`` chooses the mode: a mode name; ``"strongest"`` for each group's
:attr:`~sapptk.profile.LayerGroup.strongest_mode`; or ``"auto"``, the split a person would try
first: the weakest mode allowed by ``config.recompute`` (and offered by every body group) whose
peaks fit the budget, else the strongest such mode (:func:`resolve_recompute` says which).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sapptk.costs import fits_budget, peak_memory
from sapptk.errors import ConfigError
from sapptk.formats.mindformers import cell_grid
from sapptk.profile import MODES

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile

__all__ = ["RECOMPUTE_CHOICES", "distinct_recomputes", "even_counts", "resolve_recompute"]

RECOMPUTE_CHOICES: tuple[str, ...] = (*MODES, "strongest", "auto")
"""What :func:`even_counts`'s (and :func:`sapptk.even_split`'s) ``recompute`` accepts."""


def _cells(total: int, stages: int, chunks: int) -> np.ndarray:
    """Body layers per cell ``[chunk][device]``, shape (chunks, stages) (the module docstring's rule)."""
    cells = np.full((chunks, stages), total // (stages * chunks), dtype=np.int64)
    extra = total % (stages * chunks)
    centre = (stages - 1) / 2
    devices = sorted(range(stages), key=lambda s: (abs(s - centre), s))
    for c in reversed(range(chunks)):
        take = min(extra, stages)
        cells[c, devices[:take]] += 1
        extra -= take
    return cells


def _common_modes(profile: Profile) -> list[str]:
    return [m for m in MODES if all(m in g.modes for g in profile.body)]


def resolve_recompute(profile: Profile, config: PipelineConfig, recompute: str = "none") -> str:
    """``recompute`` checked against the profile, ``"auto"`` replaced by the mode it picks (a mode
    name or ``"strongest"``). Raises :class:`~sapptk.errors.ConfigError` naming the value."""
    if not isinstance(recompute, str) or recompute not in RECOMPUTE_CHOICES:
        raise ConfigError(f"even_split: recompute = {recompute!r}: expected one of {', '.join(RECOMPUTE_CHOICES)}")
    if recompute == "strongest":
        return recompute
    if recompute != "auto":
        for group in profile.body:
            if recompute not in group.modes:
                raise ConfigError(
                    f"even_split: recompute = {recompute!r}: profile {profile.name!r} group {group.name!r} has no "
                    f"{recompute!r} mode: expected one of its modes {', '.join(group.modes)}"
                )
        return recompute
    allowed = [m for m in MODES if m in config.recompute] or list(MODES)
    usable = [m for m in allowed if m in _common_modes(profile)] or ["strongest"]
    budget = config.memory_budget
    if budget is None:
        return usable[0]
    for mode in usable:
        if fits_budget(peak_memory(profile, config, even_counts(profile, config, mode)), budget):
            return mode
    return usable[-1]


def even_counts(profile: Profile, config: PipelineConfig, recompute: str = "none") -> np.ndarray:
    """The even split's layer assignment, an int array (body groups, len(MODES), virtual stages).

    ``recompute``: one of :data:`RECOMPUTE_CHOICES` (see the module docstring). Not simulated;
    valid for :func:`sapptk.costs.check_counts`. Raises :class:`~sapptk.errors.ConfigError` for a
    mode some body group does not offer, or a schedule that does not hold one virtual stage of
    each chunk per device.
    """
    mode = resolve_recompute(profile, config, recompute)
    body = tuple(profile.body)
    modes = [MODES.index(g.strongest_mode if mode == "strongest" else mode) for g in body]
    program = config.program()
    grid = cell_grid(program)
    per_vs = np.zeros(program.num_virtual_stages, dtype=np.int64)
    per_vs[grid] = _cells(profile.num_body_layers, config.stages, config.chunks)
    bounds = np.concatenate([[0], np.cumsum(per_vs)])  # layer range of each virtual stage, model order
    counts = np.zeros((len(body), len(MODES), program.num_virtual_stages), dtype=np.int64)
    start = 0
    for g, group in enumerate(body):
        lo, hi = start, start + group.count
        counts[g, modes[g]] = np.clip(np.minimum(bounds[1:], hi) - np.maximum(bounds[:-1], lo), 0, None)
        start = hi
    return counts


def distinct_recomputes(profile: Profile, config: PipelineConfig) -> list[str]:
    """The ``recompute`` values that give every distinct even split: each mode every body group
    offers (in :data:`~sapptk.profile.MODES` order, weakest first), then ``"strongest"`` when it
    differs from all of them."""
    out: list[str] = []
    seen: list[np.ndarray] = []
    for mode in [*_common_modes(profile), "strongest"]:
        counts = even_counts(profile, config, mode)
        if not any(np.array_equal(counts, other) for other in seen):
            out.append(mode)
            seen.append(counts)
    return out
