"""Per-virtual-stage costs of a layer assignment: the one place where the profile meets the program.

A layer assignment (``counts``) is an integer array of shape
``(n_body_groups, len(MODES), n_virtual_stages)``: ``counts[g, r, vs]`` layers of body group
``g`` use recompute mode ``MODES[r]`` on virtual stage ``vs``. The head (if any) lives on
virtual stage 0, the tail (if any) on the last virtual stage (for V-shaped placements that
is device 0 again, which the program's placement takes care of).

Integer units
-------------
The solver needs integers, and the solver and the simulator must agree exactly. So every
per-layer figure of the profile is rounded ONCE, here, to an integer number of
:data:`TIME_UNIT_MS` (1 µs) or :data:`MEMORY_UNIT_MB` (0.001 MB), and both the solver and
:func:`stage_costs` / :func:`simulate_counts` use the rounded figures. The solver's step
time therefore equals the simulated one exactly, and the rounded model differs from the raw
profile by at most 0.5 µs per layer-op and 0.0005 MB per layer and in-flight micro-batch:
for a 16-stage, 96-layer model that is below 0.1 ms on a step of tens of seconds, far below
any difference between two plans that matters. Profiles given in whole ms / MB (the usual
case) are represented exactly.

Split backward
--------------
The profile gives one backward time per mode. Schedules with a split backward (their
programs have ``I`` and ``W`` ops) need the weight-gradient part separately: we take
``W = WEIGHT_SHARE`` × the layer's backward without recompute (the cheapest backward the
group offers) and give the input-gradient op ``I`` the rest, including any recompute. For
schedules without split the weight cost is 0 and ``B`` carries the whole backward, so a
layer's backward total is the same either way.

Sequence slices (long context, :mod:`sapptk.seq`): on a sliced setup :func:`slice_costs`
splits each stage's totals over the slices (causal attention, slice lengths) and adds the K/V
term; :func:`simulate_counts` and :func:`peak_memory` use it.

Activation offload: :func:`check_offload` checks a plan's offload array against its layout and
:func:`offloaded_mb` turns it into the MB each virtual stage sends to the host.
(Over 500 lines: the per-stage, per-micro-batch, per-slice and offload forms of one
assignment's costs share the rounded figures and belong together.)
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk import checks
from sapptk.errors import ConfigError
from sapptk.profile import MODES
from sapptk.schedules.memory import device_peaks
from sapptk.seq import is_sliced, kv_per_token, per_slice, slice_lengths, slice_live_points, time_attention
from sapptk.simulation import WEIGHT_HOLDS, Simulation, simulate

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import LayerGroup, Profile

__all__ = [
    "FIT_TOLERANCE_MB",
    "MAX_UNITS",
    "AlternativeLayout",
    "MEMORY_UNIT_MB",
    "TIME_UNIT_MS",
    "WEIGHT_SHARE",
    "LayerCoefficients",
    "StageCosts",
    "check_alternative",
    "check_counts",
    "check_offload",
    "fits_budget",
    "layer_coefficients",
    "memory_units",
    "micro_batch_costs",
    "offloaded_mb",
    "peak_memory",
    "simulate_counts",
    "slice_costs",
    "stage_costs",
    "time_units",
    "within_budget",
]

FIT_TOLERANCE_MB = 1e-6
"""A peak this many MB over the budget still fits (rounding in sums of MB). The one tolerance of
"fits the budget": :func:`within_budget` and :func:`fits_budget` apply it, everywhere."""


def within_budget(peaks: Any, budget: float | None) -> np.ndarray:
    """Per peak (MB; a number or an array): whether it fits ``budget`` MB (None: no budget, all fit),
    up to :data:`FIT_TOLERANCE_MB`. A bool array of the peaks' shape."""
    arr = np.asarray(peaks, dtype=float)
    if budget is None:
        return np.ones(arr.shape, dtype=bool)
    return arr <= float(budget) + FIT_TOLERANCE_MB


def fits_budget(peaks: Any, budget: float | None) -> bool:
    """Whether every peak (MB) fits ``budget`` MB (:func:`within_budget`); True without a budget."""
    return bool(within_budget(peaks, budget).all())

TIME_UNIT_MS = 1e-3
"""The integer time unit, in ms (1 µs)."""

_NONE = MODES.index("none")

MEMORY_UNIT_MB = 1e-3
"""The integer memory unit, in MB (0.001 MB)."""

WEIGHT_SHARE = 0.5
"""Share of a layer's no-recompute backward that is weight-gradient work (``W`` ops)."""

MAX_UNITS = checks.MAX_UNITS
"""Bound on any total in integer units (a step time in µs, a device's memory in 0.001 MB):
below it int64 sums cannot overflow and float64 holds every value exactly, so the solver's
prediction and the simulation stay equal. :func:`layer_coefficients` refuses a profile and
setup whose worst case could reach it (a step time of about 285 years, 9 EB of memory)."""


def time_units(ms: float) -> int:
    """ms → integer time units, rounded to nearest (halves up)."""
    return int(np.floor(float(ms) / TIME_UNIT_MS + 0.5))


def memory_units(mb: float) -> int:
    """MB → integer memory units, rounded to nearest (halves up)."""
    return int(np.floor(float(mb) / MEMORY_UNIT_MB + 0.5))


@dataclass(frozen=True, eq=False)
class LayerCoefficients:
    """Integer per-layer costs (time units per micro-batch, memory units) of a profile on a setup.

    Body arrays are indexed ``[g]`` or ``[g, r]`` (``r`` into :data:`MODES`); entries of
    unavailable modes are 0 and ``available[g, r]`` is False. ``fixed_*`` arrays, indexed
    by virtual stage, hold the head's and tail's costs where they live.

    ``backward[g, r]`` is the duration of the backward op that carries the recompute: the
    ``I`` op of a split backward, or the whole ``B``; ``weight[g]`` is the ``W`` part (0
    without split). A ``B`` op lasts ``backward + weight`` either way.
    ``overhead[g, r]`` is the backward time above the group's no-recompute backward.
    """

    group_names: tuple[str, ...]
    counts: np.ndarray  # (G,) layers per body group
    available: np.ndarray  # (G, R) bool: the profile offers this mode
    allowed: np.ndarray  # (G, R) bool: available and listed in config.recompute
    forward: np.ndarray  # (G,)
    backward: np.ndarray  # (G, R)
    weight: np.ndarray  # (G,)
    overhead: np.ndarray  # (G, R)
    activation: np.ndarray  # (G, R)
    params: np.ndarray  # (G,)
    fixed_forward: np.ndarray  # (nvs,)
    fixed_backward: np.ndarray
    fixed_weight: np.ndarray
    fixed_activation: np.ndarray
    fixed_params: np.ndarray
    fixed_layers: np.ndarray  # (nvs,) head/tail layers on each virtual stage (0, 1 or 2)
    comm: int  # p2p latency, time units
    constant: int  # constant memory per device, memory units
    split: bool

    @property
    def shape(self) -> tuple[int, int, int]:
        """Shape of a ``counts`` array for this setup."""
        return (len(self.counts), len(MODES), len(self.fixed_forward))

    def per_stage(self, counts: np.ndarray) -> dict[str, np.ndarray]:
        """Integer per-virtual-stage totals of an assignment (same formulas the solver uses)."""
        c = np.asarray(counts, dtype=np.int64)
        return {
            "forward": np.einsum("grv,g->v", c, self.forward) + self.fixed_forward,
            "backward": np.einsum("grv,gr->v", c, self.backward) + self.fixed_backward,
            "weight": np.einsum("grv,g->v", c, self.weight) + self.fixed_weight,
            "overhead": np.einsum("grv,gr->v", c, self.overhead),
            "activation": np.einsum("grv,gr->v", c, self.activation) + self.fixed_activation,
            "params": np.einsum("grv,g->v", c, self.params) + self.fixed_params,
        }


def _base_backward(group: LayerGroup) -> float:
    """The group's backward time without recompute: mode "none", else its cheapest mode."""
    if "none" in group.modes:
        return float(group.modes["none"].backward)
    return min(float(mc.backward) for mc in group.modes.values())


def layer_coefficients(profile: Profile, config: PipelineConfig) -> LayerCoefficients:
    """Integer per-layer costs of ``profile`` for ``config``: what the solver and the simulator share."""
    body = tuple(profile.body)
    G, R = len(body), len(MODES)
    split = bool(config.split_backward)
    nvs = config.num_virtual_stages
    available = np.zeros((G, R), dtype=bool)
    forward = np.zeros(G, dtype=np.int64)
    backward = np.zeros((G, R), dtype=np.int64)
    weight = np.zeros(G, dtype=np.int64)
    overhead = np.zeros((G, R), dtype=np.int64)
    activation = np.zeros((G, R), dtype=np.int64)
    params = np.zeros(G, dtype=np.int64)
    for g, group in enumerate(body):
        forward[g] = time_units(group.forward)
        params[g] = memory_units(group.params)
        base = time_units(_base_backward(group))
        w = time_units(WEIGHT_SHARE * base * TIME_UNIT_MS) if split else 0
        weight[g] = w
        for r, mode in enumerate(MODES):
            mc = group.modes.get(mode) if isinstance(group.modes, Mapping) else None
            if mc is None:
                continue
            available[g, r] = True
            total = time_units(mc.backward)
            backward[g, r] = total - w
            overhead[g, r] = total - base
            activation[g, r] = memory_units(mc.activation)
    if (backward < 0).any() or (overhead < 0).any():
        g, r = np.argwhere((backward < 0) | (overhead < 0))[0]
        raise ConfigError(
            f"profile {profile.name!r}: group {body[g].name!r} mode {MODES[r]!r} has a backward shorter "
            "than the group's no-recompute backward"
        )
    allowed = available & np.isin(np.array(MODES), config.recompute)[None, :]

    fixed = {k: np.zeros(nvs, dtype=np.int64) for k in ("f", "b", "w", "a", "p", "n")}
    for group, vs in ((profile.head, 0), (profile.tail, nvs - 1)):
        if group is None:
            continue
        mc = group.modes.get("none") if "none" in group.modes else next(iter(group.modes.values()))
        n = int(group.count)
        total = time_units(mc.backward)
        w = time_units(WEIGHT_SHARE * total * TIME_UNIT_MS) if split else 0
        fixed["f"][vs] += n * time_units(group.forward)
        fixed["b"][vs] += n * (total - w)
        fixed["w"][vs] += n * w
        fixed["a"][vs] += n * memory_units(mc.activation)
        fixed["p"][vs] += n * memory_units(group.params)
        fixed["n"][vs] += n
    _check_magnitudes(profile, config, forward, backward, weight, activation, params, fixed)
    return LayerCoefficients(
        group_names=tuple(g.name for g in body),
        counts=np.array([int(g.count) for g in body], dtype=np.int64),
        available=available,
        allowed=allowed,
        forward=forward,
        backward=backward,
        weight=weight,
        overhead=overhead,
        activation=activation,
        params=params,
        fixed_forward=fixed["f"],
        fixed_backward=fixed["b"],
        fixed_weight=fixed["w"],
        fixed_activation=fixed["a"],
        fixed_params=fixed["p"],
        fixed_layers=fixed["n"],
        comm=time_units(config.comm),
        constant=memory_units(config.constant_memory),
        split=split,
    )


def _check_magnitudes(
    profile: Profile,
    config: PipelineConfig,
    forward: np.ndarray,
    backward: np.ndarray,
    weight: np.ndarray,
    activation: np.ndarray,
    params: np.ndarray,
    fixed: Mapping[str, np.ndarray],
) -> None:
    """Refuse a profile and setup whose step time or memory could reach :data:`MAX_UNITS`.

    Bounds in exact Python integers: every op of every micro-batch back to back plus a
    latency per unit (the longest path is never longer), and every parameter plus every
    layer's activation held for every micro-batch slice at once (no device holds more).
    """
    from sapptk.config import program_ops

    counts = [int(g.count) for g in profile.body]
    per_micro_batch = sum(
        n * (int(forward[g]) + int(backward[g].max(initial=0)) + int(weight[g])) for g, n in enumerate(counts)
    )
    per_micro_batch += int(fixed["f"].sum()) + int(fixed["b"].sum()) + int(fixed["w"].sum())
    if config.custom_program is not None:  # a carried program: its own ops
        units = config.custom_program.num_ops
    else:
        units = program_ops(config.schedule, config.stages, config.micro_batches, config.chunks, config.splits)
    step = config.micro_batches * per_micro_batch + units * time_units(config.comm)
    if step >= MAX_UNITS:
        raise ConfigError(
            f"profile {profile.name!r} on {config.schedule} p={config.stages} v={config.chunks} "
            f"m={config.micro_batches}: the step time could reach {step * TIME_UNIT_MS:.3g} ms ({config.micro_batches} "
            f"micro-batches × {per_micro_batch * TIME_UNIT_MS:.3g} ms of layer work each, plus latencies): expected "
            f"at most {MAX_UNITS * TIME_UNIT_MS:.3g} ms, where times stay exact (sapptk.costs.MAX_UNITS); check the "
            "profile's times and the latency"
        )
    slices = config.micro_batches * config.splits
    live = sum(n * int(activation[g].max(initial=0)) for g, n in enumerate(counts)) + int(fixed["a"].sum())
    static = sum(n * int(params[g]) for g, n in enumerate(counts)) + int(fixed["p"].sum())
    memory = static + slices * live + memory_units(config.constant_memory) * config.stages
    if memory >= MAX_UNITS:
        raise ConfigError(
            f"profile {profile.name!r} on {config.schedule} p={config.stages} m={config.micro_batches}: memory could "
            f"reach {memory * MEMORY_UNIT_MB:.3g} MB (parameters {static * MEMORY_UNIT_MB:.3g} MB, activations "
            f"{live * MEMORY_UNIT_MB:.3g} MB per micro-batch): expected at most {MAX_UNITS * MEMORY_UNIT_MB:.3g} MB, "
            "where memory stays exact (sapptk.costs.MAX_UNITS); check the profile's memory figures"
        )


@dataclass(frozen=True, eq=False)
class AlternativeLayout:
    """A second layout for chosen micro-batches: recompute per micro-batch.

    ``counts``: an assignment like a plan's own (groups, modes, virtual stages) with the same
    layers of every body group on every virtual stage, in other recompute modes;
    ``mask[vs, mb]`` (bool, virtual stages × micro-batches): micro-batch ``mb`` of virtual
    stage ``vs`` runs this layout (its backward and its activation), the others the plan's
    ``counts``. Both arrays are read-only; build one with :func:`check_alternative`.
    """

    counts: np.ndarray
    mask: np.ndarray

    def micro_batches(self) -> np.ndarray:
        """Micro-batches on the alternative layout, per virtual stage (int array)."""
        return self.mask.sum(axis=1).astype(np.int64)


def check_alternative(
    profile: Profile, config: PipelineConfig, counts: Any, alternative: Any, mask: Any = None
) -> AlternativeLayout:
    """Validate a second layout against the plan's ``counts``; return it read-only, or raise :class:`ConfigError`.

    ``alternative`` is an :class:`AlternativeLayout` or an assignment array (then ``mask`` is
    required). The alternative must hold, on every virtual stage, the same layers of every
    body group as ``counts`` (only the recompute modes differ); ``mask`` must be a boolean
    array of shape (virtual stages, micro-batches) (0/1 integers are accepted).
    """
    if isinstance(alternative, AlternativeLayout):
        if mask is not None:
            raise ConfigError("alternative: an AlternativeLayout carries its own mask: pass mask=None")
        alt_counts, mask = alternative.counts, alternative.mask
    else:
        alt_counts = alternative
    base = check_counts(profile, config, counts)
    try:
        alt = check_counts(profile, config, alt_counts)
    except ConfigError as exc:
        raise ConfigError(f"alternative.{exc}") from None
    per_group, alt_group = base.sum(axis=1), alt.sum(axis=1)
    if not np.array_equal(per_group, alt_group):
        g, vs = (int(i) for i in np.argwhere(per_group != alt_group)[0])
        raise ConfigError(
            f"alternative.counts: group {profile.body[g].name!r} has {int(alt_group[g, vs])} layers on virtual "
            f"stage {vs}, the plan {int(per_group[g, vs])}: expected the same layers per group and virtual stage "
            "(only the recompute modes may differ)"
        )
    shape = (config.num_virtual_stages, config.micro_batches)
    if mask is None:
        raise ConfigError(f"alternative.mask: expected a boolean array of shape {shape} (virtual stages, "
                          "micro-batches), got None")
    try:
        arr = np.asarray(mask)
    except Exception as exc:  # noqa: BLE001 - ragged lists: one clear message
        raise ConfigError(f"alternative.mask: expected a boolean array of shape {shape}, got {exc}") from None
    if arr.shape != shape:
        raise ConfigError(f"alternative.mask: expected shape {shape} (virtual stages, micro-batches), got {arr.shape}")
    if arr.dtype != bool:
        if arr.dtype.kind not in "iu" or not np.isin(arr, (0, 1)).all():
            raise ConfigError(f"alternative.mask: expected booleans (or 0/1), got dtype {arr.dtype}")
        arr = arr.astype(bool)
    arr = np.array(arr, dtype=bool, copy=True)
    alt = np.array(alt, dtype=np.int64, copy=True)
    arr.setflags(write=False)
    alt.setflags(write=False)
    return AlternativeLayout(counts=alt, mask=arr)


@dataclass(frozen=True, eq=False)
class StageCosts:
    """Per-virtual-stage costs of an assignment, in ms per micro-batch and MB.

    ``forward``, ``backward`` (the op carrying recompute: ``I`` or the whole ``B``),
    ``weight`` (``W``; 0 without split backward), ``activation`` (MB per in-flight
    micro-batch), ``params`` (static MB), ``recompute_overhead`` (ms of backward above the
    no-recompute backward). ``comm`` (ms) and ``constant`` (MB) are the rounded setup values.
    With an :class:`AlternativeLayout` (:func:`micro_batch_costs`), ``backward``,
    ``activation`` and ``recompute_overhead`` have shape (virtual stages, micro-batches);
    the others stay per virtual stage (the layers, hence forward, weight and parameters, are
    the same for every micro-batch). On a sliced setup (:func:`slice_costs`) the times,
    ``activation`` and ``kv`` (K/V MB) are per (virtual stage, micro-batch, slice).
    """

    forward: np.ndarray
    backward: np.ndarray
    weight: np.ndarray
    activation: np.ndarray
    params: np.ndarray
    recompute_overhead: np.ndarray
    comm: float
    constant: float
    kv: np.ndarray | float = 0.0

    def simulate_args(self) -> dict[str, Any]:
        """These costs as :func:`sapptk.simulate`'s keyword arguments (``forward`` to ``kv``, ``comm``,
        ``constant``)."""
        return {"forward": self.forward, "backward": self.backward, "weight": self.weight,
                "activation": self.activation, "params": self.params, "kv": self.kv, "comm": self.comm,
                "constant": self.constant}


_STAGE_COST_ARGS = frozenset({"forward", "backward", "weight", "activation", "params", "kv", "offloaded",
                              "host_bandwidth"})


def _whole_layers(arr: np.ndarray, name: str) -> np.ndarray:
    """``arr`` as int64 layer counts; a :class:`~sapptk.errors.ConfigError` naming ``name`` unless
    every entry is a whole number (integers, or finite floats without a fraction)."""
    if arr.dtype.kind not in "iu" and (
        arr.dtype.kind != "f" or not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr))
    ):
        raise ConfigError(f"{name}: expected whole numbers of layers")
    return arr.astype(np.int64)


def check_counts(profile: Profile, config: PipelineConfig, counts: Any) -> np.ndarray:
    """Validate an assignment; return it as an int64 array or raise :class:`ConfigError`.

    Shape ``(body groups, len(MODES), virtual stages)``, non-negative integers, each group's
    layers summing to its count, only modes the profile offers for the group, and groups
    contiguous and in model order across the virtual stages.
    """
    body = tuple(profile.body)
    shape = (len(body), len(MODES), config.num_virtual_stages)
    arr = np.asarray(counts)
    if arr.shape != shape:
        raise ConfigError(f"counts: expected shape {shape} (groups, modes, virtual stages), got {arr.shape}")
    arr = _whole_layers(arr, "counts")
    if (arr < 0).any():
        g, r, vs = (int(i) for i in np.argwhere(arr < 0)[0])
        raise ConfigError(f"counts: negative layer count for group {g}, mode {MODES[r]!r}, virtual stage {vs}")
    for g, group in enumerate(body):
        total = int(arr[g].sum())
        if total != group.count:
            raise ConfigError(f"counts: group {group.name!r} has {group.count} layers, the assignment places {total}")
        for r, mode in enumerate(MODES):
            if mode not in group.modes and arr[g, r].any():
                raise ConfigError(f"counts: group {group.name!r} does not offer recompute mode {mode!r}")
    per_group = arr.sum(axis=1)  # (G, nvs)
    order = per_group.cumsum(axis=1)
    for g in range(len(body) - 1):
        # group g+1 may only start on a virtual stage where group g is complete
        started = order[g + 1] > 0
        if (started & (order[g] < body[g].count)).any():
            vs = int(np.flatnonzero(started & (order[g] < body[g].count))[0])
            raise ConfigError(
                f"counts: group {body[g + 1].name!r} starts on virtual stage {vs} before group {body[g].name!r} ends"
            )
    return arr


def stage_costs(profile: Profile, config: PipelineConfig, counts: Any) -> StageCosts:
    """Per-virtual-stage costs of ``counts`` (validated), in ms and MB, from the rounded figures."""
    arr = check_counts(profile, config, counts)
    coef = layer_coefficients(profile, config)
    tot = coef.per_stage(arr)
    return StageCosts(
        forward=tot["forward"] * TIME_UNIT_MS,
        backward=tot["backward"] * TIME_UNIT_MS,
        weight=tot["weight"] * TIME_UNIT_MS,
        activation=tot["activation"] * MEMORY_UNIT_MB,
        params=tot["params"] * MEMORY_UNIT_MB,
        recompute_overhead=tot["overhead"] * TIME_UNIT_MS,
        comm=coef.comm * TIME_UNIT_MS,
        constant=coef.constant * MEMORY_UNIT_MB,
    )


def micro_batch_costs(
    profile: Profile, config: PipelineConfig, counts: Any, alternative: AlternativeLayout
) -> StageCosts:
    """Costs of ``counts`` with ``alternative`` on its micro-batches: backward, activation and
    recompute overhead of shape (virtual stages, micro-batches), the rest per virtual stage.
    Same rounded figures as :func:`stage_costs` (which it equals micro-batch by micro-batch)."""
    alt = check_alternative(profile, config, counts, alternative)
    coef = layer_coefficients(profile, config)
    base = coef.per_stage(check_counts(profile, config, counts))
    other = coef.per_stage(alt.counts)

    def per_cell(key: str) -> np.ndarray:
        return np.where(alt.mask, other[key][:, None], base[key][:, None])

    return StageCosts(
        forward=base["forward"] * TIME_UNIT_MS,
        backward=per_cell("backward") * TIME_UNIT_MS,
        weight=base["weight"] * TIME_UNIT_MS,
        activation=per_cell("activation") * MEMORY_UNIT_MB,
        params=base["params"] * MEMORY_UNIT_MB,
        recompute_overhead=per_cell("overhead") * TIME_UNIT_MS,
        comm=coef.comm * TIME_UNIT_MS,
        constant=coef.constant * MEMORY_UNIT_MB,
    )


def simulate_counts(
    profile: Profile,
    config: PipelineConfig,
    counts: Any,
    alternative: AlternativeLayout | None = None,
    *,
    offload: Any = None,
    **options: Any,
) -> Simulation:
    """The simulation of an assignment on the config's program (what :meth:`sapptk.plan.Plan.simulate` runs).

    The costs are the layout's (:func:`stage_costs`; per micro-batch with ``alternative``,
    :func:`micro_batch_costs`; per slice on a sliced setup, :func:`slice_costs`), with the
    config's budget, and with ``offload`` (:func:`check_offload`) the offloaded MB and the
    config's host bandwidth. ``options`` set :func:`sapptk.simulate`'s other arguments
    (``weight_holds``, ``overlap``, ``memory_budget``, ``comm``, ``constant``); the costs
    themselves come from the layout.
    """
    own = sorted(set(options) & _STAGE_COST_ARGS)
    if own:
        raise ConfigError(
            f"simulate: {', '.join(own)}: these come from the plan's layout; to try other per-stage costs "
            "call sapptk.simulate(config.program(), forward=..., backward=..., ...)"
        )
    if is_sliced(profile, config):
        if alternative is not None or offload is not None:
            lever = ("alternative: recompute per micro-batch" if alternative is not None
                     else "offload: activation offload")
            raise ConfigError(f"{lever} is not modelled with sequence slices of a long-context profile "
                              "(seq_length); vary the recompute per stage")
        costs = slice_costs(profile, config, counts)
    elif alternative is not None:
        if offload is not None:
            raise ConfigError("alternative: recompute per micro-batch cannot be combined with activation offload")
        costs = micro_batch_costs(profile, config, counts, alternative)
    else:
        costs = stage_costs(profile, config, counts)
    args = {**costs.simulate_args(), "memory_budget": config.memory_budget}
    off = check_offload(profile, config, counts, offload)
    if off is not None:
        args.update(offloaded=offloaded_mb(profile, config, off), host_bandwidth=config.host_bandwidth)
    args.update(options)
    return simulate(config.program(), **args)


def check_offload(profile: Profile, config: PipelineConfig, counts: Any, offload: Any) -> np.ndarray | None:
    """Validate an offload array against a layer assignment; return it as int64 (None when all zero or None).

    ``offload[g, vs]`` layers of body group ``g`` on virtual stage ``vs`` offload their
    activations to host memory: whole numbers, at least 0 and at most the group's
    mode-``"none"`` layers there (``counts[g, "none", vs]``); an offloaded layer computes like
    ``"none"``. Nonzero offload needs ``config.host_bandwidth``. Raises
    :class:`~sapptk.errors.ConfigError` naming the entry.
    """
    if offload is None:
        return None
    arr_counts = check_counts(profile, config, counts)
    shape = (len(profile.body), config.num_virtual_stages)
    try:
        raw = np.asarray(offload)
    except Exception:  # noqa: BLE001 - ragged lists: one clear message
        raise ConfigError(f"offload: expected an integer array of shape {shape} (groups, virtual stages)") from None
    if raw.shape != shape:
        raise ConfigError(f"offload: expected shape {shape} (body groups, virtual stages), got {raw.shape}")
    arr = _whole_layers(raw, "offload")
    if (arr < 0).any():
        g, vs = (int(i) for i in np.argwhere(arr < 0)[0])
        raise ConfigError(f"offload: negative layer count {arr[g, vs]} for group {profile.body[g].name!r}, "
                          f"virtual stage {vs}")
    resident = arr_counts[:, _NONE, :]
    if (arr > resident).any():
        g, vs = (int(i) for i in np.argwhere(arr > resident)[0])
        raise ConfigError(
            f"offload: group {profile.body[g].name!r}, virtual stage {vs}: {arr[g, vs]} layers offloaded, but only "
            f"{resident[g, vs]} run in mode 'none' there: expected at most that many (an offloaded layer is a "
            "mode-'none' layer whose activation goes to the host)"
        )
    if not arr.any():
        return None
    if config.host_bandwidth is None:
        raise ConfigError("offload: the plan offloads activations but host_bandwidth = None: expected the host "
                          "link's bandwidth in MB per ms (PipelineConfig(host_bandwidth=...))")
    arr.setflags(write=False)
    return arr


def offloaded_mb(profile: Profile, config: PipelineConfig, offload: np.ndarray | None) -> np.ndarray:
    """MB per micro-batch each virtual stage sends to the host (the rounded mode-``"none"`` figures)."""
    nvs = config.num_virtual_stages
    if offload is None:
        return np.zeros(nvs)
    coef = layer_coefficients(profile, config)
    units = np.einsum("gv,g->v", np.asarray(offload, dtype=np.int64), coef.activation[:, _NONE])
    return units * MEMORY_UNIT_MB


def slice_costs(profile: Profile, config: PipelineConfig, counts: Any, lengths: Any = None) -> StageCosts:
    """Costs of ``counts`` on a sliced setup per (virtual stage, micro-batch, slice) (:mod:`sapptk.seq`):
    each stage's rounded totals split by the slices' linear and causal shares, activation by
    length, K/V = kv_mb_per_token × slice tokens. ``lengths`` (tokens, summing to the profile's
    ``seq_length``) replace the config's slice lengths."""
    config.check(profile, allow_empty_stages=True)
    costs = stage_costs(profile, config, counts)
    arr = check_counts(profile, config, counts)
    coef = layer_coefficients(profile, config)
    if lengths is None:
        lengths = slice_lengths(profile, config)
    else:
        config.replace(splits=list(lengths), slice_lengths=None).check(profile, allow_empty_stages=True)
    att = time_attention(profile, coef, arr)
    m, ms = config.micro_batches, TIME_UNIT_MS
    tokens = np.asarray(lengths, dtype=np.float64)
    kv = kv_per_token(profile, arr)[:, None] * tokens[None, :]
    return StageCosts(
        forward=per_slice(costs.forward, att["forward"] * ms, lengths, m),
        backward=per_slice(costs.backward, att["backward"] * ms, lengths, m),
        weight=per_slice(costs.weight, att["weight"] * ms, lengths, m),
        activation=per_slice(costs.activation, np.zeros(len(costs.activation)), lengths, m),
        params=costs.params,
        recompute_overhead=costs.recompute_overhead,
        comm=costs.comm,
        constant=costs.constant,
        kv=np.broadcast_to(kv[:, None, :], (len(kv), m, len(tokens))),
    )


def peak_memory(profile: Profile, config: PipelineConfig, counts: Any) -> np.ndarray:
    """Peak MB of every device, from the program's live points (equal to the simulator's peak);
    on a sliced setup from its slice live points with K/V (:func:`sapptk.seq.slice_live_points`)."""
    if is_sliced(profile, config):  # the slice live points with K/V (equal to the simulator's peak)
        costs, program = slice_costs(profile, config, counts), config.program()
        out = []
        for d, rows in enumerate(slice_live_points(program)):
            st = list(program.device_stages[d])
            amounts = np.concatenate([costs.activation[st, 0, :].ravel(), costs.kv[st, 0, :].ravel()])
            out.append(costs.params[st].sum() + costs.constant + max(0.0, float((rows @ amounts).max(initial=0.0))))
        return np.asarray(out)
    arr = check_counts(profile, config, counts)
    coef = layer_coefficients(profile, config)
    program = config.program()
    tot = coef.per_stage(arr)
    static = np.array([tot["params"][list(st)].sum() for st in program.device_stages]) + coef.constant
    peaks = device_peaks(program.live_points(WEIGHT_HOLDS), program.device_stages, tot["activation"], static)
    return peaks.astype(float) * MEMORY_UNIT_MB
