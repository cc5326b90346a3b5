"""Time and memory of a :class:`~sapptk.schedules.Program`, op by op.

Conventions (the balancer uses the same ones, through the same Program; ``docs/conventions.md``
works small cases by hand):

* **Costs** are given per virtual stage and per micro-batch, in ms: ``forward`` for an
  ``F``; ``backward`` for the input-gradient work and ``weight`` for the weight-gradient
  work. Each is one number, one number per virtual stage, or one per (virtual stage,
  micro-batch) — a virtual stage whose micro-batches recompute differently. A full
  backward ``B`` lasts ``backward + weight``; a split one runs ``I`` for ``backward`` and
  ``W`` for ``weight``. A sequence slice lasts ``1/splits`` of its op, unless the costs are
  given per (virtual stage, micro-batch, slice): then each slice op lasts its own cost.
* **Time.** A unit starts when the previous unit of its device has ended and every op
  it depends on has ended, plus ``comm`` ms when that op ran on another device. An
  overlapped unit lasts ``overlap(op durations)``: by default their sum (overlap hides
  communication, not compute).
* **Memory**, in MB. A device always holds ``params`` of its virtual stages plus
  ``constant``. An ``F`` allocates its virtual stage's ``activation`` (of its micro-batch,
  ``1/splits`` per slice) when its unit *starts*; a ``B`` frees it when its unit *ends*;
  an ``I`` frees ``1 - weight_holds`` of it and its ``W`` the remaining ``weight_holds``.
  Within a unit, allocations come before frees. ``kv`` (MB, like ``activation``) is the K/V
  of sequence slices: allocated when an ``F`` of slice j starts, freed when the backward of
  slice 0 of its micro-batch on its virtual stage ends (:func:`sapptk.schedules.memory.kv_events`).

* **Activation offload** (``offloaded``, ``host_bandwidth``): a copy stream per device moves
  activations to host memory and back (:mod:`sapptk.schedules.copy_stream` states the model).

Times come from the longest-path kernel (:mod:`sapptk.schedules.timing`; with copy streams on
the graph of units and transfers), memory from the program's events
(:mod:`sapptk.schedules.memory`): no recursion, linear in the ops. :func:`simulate` is the one
simulator: per-micro-batch, per-slice and offload runs are forms of its arguments.
(Over 500 lines: its validation, its two passes and the frames they share are one contract.)
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sapptk.checks import show
from sapptk.errors import SapptkError
from sapptk.schedules import copy_stream
from sapptk.schedules.memory import kv_events, memory_steps, memory_steps_kv
from sapptk.schedules.program import Program, kind_dtype
from sapptk.schedules.timing import longest_path, unit_starts

__all__ = [
    "WEIGHT_HOLDS",
    "Bubble",
    "OffloadSimulation",
    "Simulation",
    "op_durations",
    "op_durations_batch",
    "per_op_costs",
    "per_slice_costs",
    "per_stage",
    "simulate",
    "unit_durations",
    "unit_times",
]

WEIGHT_HOLDS = 0.5
"""Default fraction of a micro-batch's activation that a split backward's ``W`` still
needs after its ``I`` (layer inputs and output gradients for the weight gradient)."""

Costs = float | Sequence[float] | np.ndarray


@dataclass(frozen=True)
class Bubble:
    """Idle time of a step, two ways (both over all devices together).

    ``of_compute``: idle / busy, the textbook ratio, e.g. (p − 1)/m for 1F1B.
    ``of_step``: idle / (p · step time), e.g. (p − 1)/(m + p − 1) for 1F1B.
    ``idle``: total idle device-time in ms.
    """

    of_compute: float
    of_step: float
    idle: float


@dataclass(frozen=True, eq=False)
class Simulation:
    """The result of running a program: times in ms, memory in MB.

    ``events``: one row per op: ``device``, ``kind`` (categorical F/B/I/W), ``micro_batch``,
    ``virtual_stage``, ``chunk``, ``slice``, ``unit`` (ops sharing it ran overlapped),
    ``start_ms``, ``end_ms``.
    ``memory``: memory in use as steps: ``device``, ``time_ms``, ``memory_mb`` (the value
    from this time on), ``kv_mb`` (the part of it that is K/V of sequence slices); the first
    row of each device is the static memory at time 0.
    ``peak_memory``: Series of peak MB per device. ``summary``: one row per device with
    ``busy_ms``, ``idle_ms``, ``bubble_of_step``, ``static_mb``, ``peak_mb``,
    ``peak_live`` (micro-batch activations at the peak, summed over chunks).
    ``costs``: the validated inputs. ``memory_budget``: MB per device the run is measured
    against (None: no budget), for figures to draw.
    """

    program: Program
    step_time: float
    events: pd.DataFrame
    memory: pd.DataFrame
    peak_memory: pd.Series
    bubble: Bubble
    summary: pd.DataFrame
    costs: dict = field(repr=False, default_factory=dict)
    memory_budget: float | None = None

    def to_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write the run as a Chrome trace (Perfetto, ``chrome://tracing``): every op as an event
        (device = process; kind, micro-batch, virtual stage in its args) and a memory counter
        per device; gzipped when ``path`` ends in ``.gz``. See :mod:`sapptk.formats.chrome_trace`."""
        from sapptk.formats.chrome_trace import simulation_events, write_trace

        events = simulation_events(self.events, self.memory, name=self.program.name)
        return write_trace(path, events, metadata={"step_time_ms": self.step_time, "schedule": self.program.name})

    def __repr__(self) -> str:
        pr = self.program
        budget = "" if self.memory_budget is None else f", budget={self.memory_budget:.6g} MB"
        return (
            f"Simulation({pr.name!r}, p={pr.stages}, v={pr.chunks}, m={pr.micro_batches}, "
            f"step_time={self.step_time:.6g} ms, bubble_of_compute={self.bubble.of_compute:.4g}, "
            f"peak={self.peak_memory.max():.6g} MB{budget})"
        )


@dataclass(frozen=True, eq=False)
class OffloadSimulation(Simulation):
    """A :class:`Simulation` with a copy stream per device (:func:`simulate` given ``host_bandwidth``).

    Extra fields: ``transfers``, one row per transfer: ``device``, ``kind`` (categorical
    offload / fetch), ``micro_batch``, ``virtual_stage``, ``slice``, ``issue_ms``,
    ``start_ms``, ``end_ms``, ``size_mb``, ``wait_ms`` (for a fetch: how long its backward
    waited for it beyond its other inputs; 0 for an offload); ``host_bandwidth`` (MB per ms);
    ``offloaded_mb`` (per virtual stage, MB per micro-batch sent to the host).
    """

    transfers: pd.DataFrame = field(default_factory=pd.DataFrame, repr=False)
    host_bandwidth: float | None = None
    offloaded_mb: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def __repr__(self) -> str:
        base = super().__repr__()
        bw = "None" if self.host_bandwidth is None else f"{self.host_bandwidth:g} MB/ms"
        return (f"Offload{base[:-1]}, host_bandwidth={bw}, transfers={len(self.transfers)}, "
                f"fetch_wait={self.fetch_wait_ms:.6g} ms)")

    @property
    def fetch_wait_ms(self) -> float:
        """Total ms backwards waited for late fetches (summed over devices)."""
        if self.transfers.empty:
            return 0.0
        return float(self.transfers["wait_ms"].sum())


# ---------------------------------------------------------------- validation
def _number(name: str, value: Any, *, upper: float | None = None, what: str = "a number >= 0") -> float:
    """A finite real number >= 0 (and <= ``upper``), else a :class:`SapptkError` naming it."""
    if isinstance(value, bool | np.bool_) or not isinstance(value, Real | np.integer | np.floating):
        raise SapptkError(f"{name}: expected {what}, got {type(value).__name__} {show(value)}")
    x = float(value)
    if not math.isfinite(x) or x < 0 or (upper is not None and x > upper):
        raise SapptkError(f"{name}: expected {what}, got {show(value)}")
    return x


def per_stage(name: str, value: Costs, n: int) -> np.ndarray:
    """A cost given as a scalar or one value per virtual stage, as a float array of n.

    Raises :class:`SapptkError` for anything but finite numbers >= 0 (bools and strings
    included) and for a length other than ``n``.
    """
    if isinstance(value, bool | np.bool_ | str | bytes):
        raise SapptkError(f"{name}: expected a number or {n} numbers >= 0 (one per virtual stage), "
                          f"got {type(value).__name__} {show(value)}")
    if isinstance(value, list | tuple) and any(isinstance(x, bool | np.bool_) for x in value):
        raise SapptkError(f"{name}: expected numbers, got a bool in {show(value)}")
    try:
        raw = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - ragged lists and odd objects: one clear message
        raise SapptkError(f"{name}: expected a number or {n} numbers, got {show(value)} ({exc})") from None
    if raw.dtype.kind not in "iuf":
        raise SapptkError(f"{name}: expected a number or {n} numbers >= 0 (one per virtual stage), "
                          f"got {show(value)} (dtype {raw.dtype})")
    arr = raw.astype(float)
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.shape != (n,):
        raise SapptkError(f"{name}: expected a number or {n} values (one per virtual stage), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise SapptkError(f"{name}: expected finite values >= 0, got {show(arr.tolist())}")
    return arr


def per_op_costs(name: str, value: Costs, n: int, micro_batches: int) -> np.ndarray:
    """A cost given as a scalar, one value per virtual stage, or one per (virtual stage, micro-batch).

    Returns a float array of shape ``(n,)``, or ``(n, micro_batches)`` when the values differ
    between micro-batches of some virtual stage (a 2-D cost equal along every row collapses to
    its first column, so it behaves exactly as the per-stage form). Raises :class:`SapptkError`
    like :func:`per_stage`, and for a 2-D shape other than ``(n, micro_batches)``.
    """
    raw = value
    if not isinstance(value, np.ndarray) and isinstance(value, list | tuple) and value and all(
        isinstance(row, list | tuple | np.ndarray) for row in value
    ):
        if any(isinstance(x, bool | np.bool_) for row in value for x in np.ravel(np.asarray(row, dtype=object))):
            raise SapptkError(f"{name}: expected numbers, got a bool in {show(value)}")
        try:
            raw = np.asarray(value)
        except Exception as exc:  # noqa: BLE001 - ragged lists: one clear message
            raise SapptkError(f"{name}: expected {n} rows of {micro_batches} numbers, got {show(value)} "
                              f"({exc})") from None
    if not (isinstance(raw, np.ndarray) and raw.ndim == 2):
        return per_stage(name, value, n)
    if raw.dtype.kind not in "iuf":
        raise SapptkError(f"{name}: expected numbers >= 0, got {show(value)} (dtype {raw.dtype})")
    arr = raw.astype(float)
    if arr.shape != (n, micro_batches):
        raise SapptkError(f"{name}: expected a number or {n} values (one per virtual stage) or shape "
                          f"({n}, {micro_batches}) (virtual stages, micro-batches), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise SapptkError(f"{name}: expected finite values >= 0, got {show(arr.tolist())}")
    if micro_batches == 0 or (arr == arr[:, :1]).all():
        return arr[:, 0].copy() if micro_batches else np.zeros(n)
    return arr


def per_slice_costs(name: str, value: Costs, n: int, micro_batches: int, splits: int) -> np.ndarray:
    """As :func:`per_op_costs`, or an array of shape ``(n, micro_batches, splits)``: the cost of
    each slice op itself (not divided by the slices). Raises :class:`SapptkError` naming ``name``."""
    raw = value
    if not isinstance(value, np.ndarray) and isinstance(value, list | tuple):
        try:
            raw = np.asarray(value)
        except Exception:  # noqa: BLE001 - ragged: per_op_costs words the error
            raw = value
    if not (isinstance(raw, np.ndarray) and raw.ndim == 3):
        return per_op_costs(name, value, n, micro_batches)
    if raw.dtype.kind not in "iuf":
        raise SapptkError(f"{name}: expected numbers >= 0, got {show(value)} (dtype {raw.dtype})")
    arr = raw.astype(float)
    if arr.shape != (n, micro_batches, splits):
        raise SapptkError(f"{name}: expected shape ({n}, {micro_batches}, {splits}) (virtual stages, micro-batches, "
                          f"slices), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise SapptkError(f"{name}: expected finite values >= 0, got {show(arr.tolist())}")
    return arr


def _as_slices(cost: np.ndarray, micro_batches: int, splits: int) -> np.ndarray:
    """A cost per virtual stage or per (stage, micro-batch) as the cost of each slice op: 1/splits of it."""
    if cost.ndim == 3:
        return cost
    per_mb = cost[:, None] if cost.ndim == 1 else cost
    return np.broadcast_to(per_mb[:, :, None] / splits, (len(cost), micro_batches, splits))


def _check_program(program: Any) -> Program:
    if isinstance(program, Program):
        return program
    hint = (" (a Plan simulates itself: plan.simulation, or plan.simulate(...) with other options)"
            if type(program).__name__ == "Plan" else "")
    raise SapptkError(
        "simulate: program: expected a Program (sapptk.schedules.build(...) or PipelineConfig.program()), "
        f"got {type(program).__name__} {show(program)}{hint}"
    )


_HUGE = 1e300  # ms or MB: far beyond any real step, far below float overflow

_OVERLAPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": lambda d, ptr: np.add.reduceat(d, ptr[:-1]),
    "max": lambda d, ptr: np.maximum.reduceat(d, ptr[:-1]),
}


# ---------------------------------------------------------------- the pieces
def _kind_table(forward: np.ndarray, backward: np.ndarray, weight: np.ndarray) -> np.ndarray:
    """What an op of each kind costs, rows in KINDS order: F, B (= backward + weight), I, W."""
    return np.stack([forward, backward + weight, backward, weight])


def op_durations(program: Program, forward: Costs, backward: Costs, weight: Costs = 0.0) -> np.ndarray:
    """Duration in ms of every op of the program, in op order.

    Costs per virtual stage, or per (virtual stage, micro-batch) (see :func:`per_op_costs`).
    """
    g = program.graph
    nvs, m = program.num_virtual_stages, program.micro_batches
    k = program.splits
    f = per_slice_costs("forward", forward, nvs, m, k)
    b = per_slice_costs("backward", backward, nvs, m, k)
    w = per_slice_costs("weight", weight, nvs, m, k)
    if 3 in (f.ndim, b.ndim, w.ndim):  # per slice: each slice op lasts its own cost
        f, b, w = (_as_slices(x, m, k) for x in (f, b, w))
        return _kind_table(f, b, w)[g.op_kind, g.op_virtual_stage, g.op_micro_batch, g.op_slice]
    if f.ndim == b.ndim == w.ndim == 1:
        table = _kind_table(f, b, w) / program.splits
        return table[g.op_kind, g.op_virtual_stage]
    f, b, w = (x if x.ndim == 2 else np.repeat(x[:, None], m, axis=1) for x in (f, b, w))
    table = _kind_table(f, b, w) / program.splits  # (4, stages, micro-batches)
    return table[g.op_kind, g.op_virtual_stage, g.op_micro_batch]


def op_durations_batch(
    program: Program, forward: np.ndarray, backward: np.ndarray, weight: np.ndarray, *, in_ticks: bool = False
) -> np.ndarray:
    """Durations of every op for a batch of per-stage costs, shape (ops, batch).

    ``forward``, ``backward`` and ``weight`` have shape (batch, virtual stages), finite and
    >= 0. With ``in_ticks`` a slice op lasts its stage's cost (the unit being 1/splits of the
    cost's unit), which keeps integer costs exact; otherwise 1/splits of it.
    """
    g = program.graph
    shape = (len(np.asarray(forward)), program.num_virtual_stages)
    arrays = []
    for name, value in (("forward", forward), ("backward", backward), ("weight", weight)):
        arr = np.asarray(value)
        if arr.shape != shape or arr.dtype.kind not in "iuf" or not np.isfinite(arr).all() or (arr < 0).any():
            raise SapptkError(f"{name}: expected finite values >= 0 of shape {shape} (batch, virtual stages)")
        arrays.append(arr)
    table = _kind_table(*arrays)  # (4, batch, stages)
    if not in_ticks:
        table = table / program.splits
    return table[g.op_kind, :, g.op_virtual_stage]


def unit_durations(program: Program, op_duration: np.ndarray, overlap: str = "sum") -> np.ndarray:
    """Duration of every unit: ``overlap`` ("sum" or "max") of its ops' durations."""
    fn = _OVERLAPS.get(overlap) if isinstance(overlap, str) else None
    if fn is None:
        raise SapptkError(f"overlap: expected one of {sorted(_OVERLAPS)}, got {show(overlap)}")
    g = program.graph
    if g.n_units == g.n_ops:  # one op per unit
        return np.asarray(op_duration, dtype=float).copy()
    return fn(op_duration, g.unit_op_ptr)


def unit_times(program: Program, duration: np.ndarray, comm: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (ms) of every unit, given unit durations (:func:`~sapptk.schedules.timing.longest_path`)."""
    g = program.graph
    end, _ = longest_path(g, np.asarray(duration, dtype=float), float(comm))
    return unit_starts(g, end, float(comm)), end


# ---------------------------------------------------------------- simulate
def simulate(
    program: Program,
    *,
    forward: Costs,
    backward: Costs,
    weight: Costs = 0.0,
    activation: Costs = 1.0,
    params: Costs = 0.0,
    comm: float = 0.0,
    constant: float = 0.0,
    weight_holds: float = WEIGHT_HOLDS,
    overlap: str = "sum",
    memory_budget: float | None = None,
    kv: Costs = 0.0,
    offloaded: Costs = 0.0,
    host_bandwidth: float | None = None,
) -> Simulation:
    """Run ``program`` with the given costs; see the module docstring. The one simulator: what a
    plan may carry (recompute per micro-batch, sequence slices, activation offload) is a form of
    its arguments, and it picks the pass.

    Every argument after the program is keyword-only.

    Parameters
    ----------
    program: the schedule instance (:func:`sapptk.schedules.build`, ``config.program()``).
    forward, backward, weight: ms per micro-batch for each virtual stage (or one number), or
        an array of shape (virtual stages, micro-batches): the cost of each micro-batch
        (a plan that recomputes per micro-batch).
    activation: MB an in-flight micro-batch keeps on each virtual stage; like the times, also
        per (virtual stage, micro-batch): each ``F`` then allocates its own micro-batch's amount.
    params: static MB of each virtual stage (weights, gradients, optimizer share).
    comm: point-to-point latency in ms between devices.
    constant: MB every device holds besides parameters and activations.
    weight_holds: fraction of the activation a ``W`` still needs after its ``I``.
    overlap: how long an overlapped unit lasts: "sum" or "max" of its ops.
    memory_budget: MB per device, kept on the result for figures (None: no budget).
    kv: MB of K/V a micro-batch's slices keep on each virtual stage (sequence slices: from the
        ``F`` of each slice to the end of the backward of slice 0); ``sim.memory["kv_mb"]``.
    offloaded: MB per micro-batch each virtual stage sends to host memory (at most its
        ``activation``; activation offload, :mod:`sapptk.schedules.copy_stream`).
    host_bandwidth: MB per ms of the host link. Given (needed when anything is offloaded), the
        run has a copy stream per device and returns an :class:`OffloadSimulation` (with
        nothing offloaded its times, memory and frames equal the run without it).

    ``forward``, ``backward``, ``weight``, ``activation`` and ``kv`` may also be arrays of shape
    (virtual stages, micro-batches, slices): the cost of each slice op itself (unequal slices,
    causal attention; :mod:`sapptk.seq` builds them from a profile). The copy stream takes one
    cost per virtual stage and no ``kv``.

    Raises :class:`~sapptk.errors.SapptkError` naming the argument for a bad value (not a
    program, strings, bools, negative or non-finite numbers, arrays of the wrong length).
    """
    program = _check_program(program)
    comm = _number("comm", comm, what="a latency >= 0 ms")
    constant = _number("constant", constant, what="memory >= 0 MB")
    weight_holds = _number("weight_holds", weight_holds, upper=1.0, what="a fraction in [0, 1]")
    if memory_budget is not None:
        memory_budget = _number("memory_budget", memory_budget, what="MB > 0 per device, or None")
        if memory_budget <= 0:
            raise SapptkError(f"memory_budget: expected MB > 0 per device, or None, got {memory_budget!r}")
    if not isinstance(overlap, str) or overlap not in _OVERLAPS:
        raise SapptkError(f"overlap: expected one of {sorted(_OVERLAPS)}, got {show(overlap)}")
    nvs, m = program.num_virtual_stages, program.micro_batches
    k = program.splits
    f = per_slice_costs("forward", forward, nvs, m, k)
    b = per_slice_costs("backward", backward, nvs, m, k)
    w = per_slice_costs("weight", weight, nvs, m, k)
    act = per_slice_costs("activation", activation, nvs, m, k)
    kv_cost = per_slice_costs("kv", kv, nvs, m, k)
    par = per_stage("params", params, nvs)
    off = per_stage("offloaded", offloaded, nvs)
    stream_bw = _copy_stream_inputs(f, b, w, act, kv_cost, off, host_bandwidth)

    g = program.graph
    # no path is longer than every unit at its longest plus a latency before each: refuse
    # costs whose step could overflow before running anything
    longest_op = max(float(f.max(initial=0.0)), float(b.max(initial=0.0)) + float(w.max(initial=0.0)))
    worst = (longest_op + comm) * g.n_units
    if not worst < _HUGE:
        raise SapptkError(
            f"forward/backward/weight/comm: too large: the step time could overflow ({g.n_units} units of up to "
            f"{longest_op:.3g} ms); give ms per micro-batch"
        )
    worst_mb = (float(act.max()) + float(kv_cost.max())) * g.n_ops + float(par.sum()) + constant
    if not worst_mb < _HUGE:
        raise SapptkError("activation/kv/params/constant: too large: the memory could overflow; give MB")
    dur = unit_durations(program, op_durations(program, f, b, w), overlap)
    p = program.stages
    placement = np.asarray(program.placement, dtype=np.int64)
    chunk = np.asarray(program.chunk_of, dtype=np.int64)
    static = np.bincount(placement, weights=par, minlength=p) + constant
    if stream_bw is not None:  # a copy stream per device
        pairs = copy_stream.pairs(program)
        stream = copy_stream.stream(pairs, off, stream_bw, k)
        run = copy_stream.run(program, pairs, stream, dur, comm)
        start, end = run.start, run.end
        act_by_chunk = np.zeros((p, program.memory_events.width))
        act_by_chunk[placement, chunk] = act
        off_by_chunk = np.zeros_like(act_by_chunk)
        off_by_chunk[placement, chunk] = off / k
        dev_col, time_col, mem_col = copy_stream.memory(program, pairs, stream, run, act_by_chunk, off_by_chunk,
                                                        static, weight_holds)
        kv_col = np.zeros(len(dev_col))
    else:
        start, end = unit_times(program, dur, comm)
        dev_col, time_col, mem_col, kv_col = _memory(program, act, kv_cost, start, end, static, weight_holds)
    step_time = float(end.max(initial=0.0))

    # the frames own fresh arrays (copied where they are the graph's), so copy=False is safe
    memory = pd.DataFrame({"device": dev_col, "time_ms": time_col, "memory_mb": mem_col, "kv_mb": kv_col},
                          copy=False)
    first_rows = np.searchsorted(dev_col, np.arange(p), side="left")
    peak_mb = np.maximum.reduceat(mem_col, first_rows)
    peak = pd.Series(peak_mb.copy(), index=pd.RangeIndex(p, name="device"), name="peak_mb")

    busy = np.bincount(g.unit_device, weights=dur, minlength=p)
    idle = step_time - busy
    total_busy = float(busy.sum())
    total_idle = float(idle.sum())
    bubble = Bubble(
        of_compute=total_idle / total_busy if total_busy > 0 else 0.0,
        of_step=total_idle / (step_time * p) if step_time > 0 else 0.0,
        idle=total_idle,
    )
    summary = pd.DataFrame(
        {
            "device": np.arange(p),
            "busy_ms": busy,
            "idle_ms": idle,
            "bubble_of_step": idle / step_time if step_time > 0 else np.zeros(p),
            "static_mb": static,
            "peak_mb": peak_mb,
            "peak_live": program.peak_live(weight_holds),
        },
        copy=False,
    )
    ou = g.op_unit
    events = pd.DataFrame(
        {
            "device": g.unit_device[ou],
            "kind": pd.Categorical.from_codes(g.op_kind.copy(), dtype=kind_dtype()),
            "micro_batch": g.op_micro_batch.copy(),
            "virtual_stage": g.op_virtual_stage.copy(),
            "chunk": chunk[g.op_virtual_stage],
            "slice": g.op_slice.copy(),
            "unit": ou.copy(),
            "start_ms": start[ou],
            "end_ms": end[ou],
        },
        copy=False,
    )
    costs = {
        "forward": f,
        "backward": b,
        "weight": w,
        "activation": act,
        "kv": kv_cost,
        "params": par,
        "comm": comm,
        "constant": constant,
        "weight_holds": weight_holds,
        "overlap": overlap,
    }
    if stream_bw is None:
        return Simulation(program, step_time, events, memory, peak, bubble, summary, costs, memory_budget)
    return OffloadSimulation(program, step_time, events, memory, peak, bubble, summary, costs, memory_budget,
                             transfers=_transfers(program, pairs, stream, run, stream_bw),
                             host_bandwidth=stream_bw, offloaded_mb=off)


def _memory(program: Program, act: np.ndarray, kv_cost: np.ndarray, start: np.ndarray, end: np.ndarray,
            static: np.ndarray, weight_holds: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Memory steps ``(device, time, memory, K/V)`` of a run without a copy stream."""
    g = program.graph
    p = program.stages
    m, k = program.micro_batches, program.splits
    placement = np.asarray(program.placement, dtype=np.int64)
    chunk = np.asarray(program.chunk_of, dtype=np.int64)
    events_m = program.memory_events
    if act.ndim == 1:
        act_by_chunk = np.zeros((p, events_m.width))
        act_by_chunk[placement, chunk] = act
    elif act.ndim == 2:  # a column per (chunk, amount) on each device: live counts stay exact integers
        events_m, act_by_chunk = events_m.by_amount(act[g.op_virtual_stage, g.op_micro_batch][events_m.op], p)
    else:  # per slice: the amounts are each slice's own, so the counts are not divided by the slices
        amount = act[g.op_virtual_stage, g.op_micro_batch, g.op_slice][events_m.op]
        events_m, act_by_chunk = events_m.by_amount(amount, p)
        events_m = dataclasses.replace(events_m, splits=1)
    if kv_cost.any():
        kv_op = _as_slices(kv_cost, m, k)[g.op_virtual_stage, g.op_micro_batch, g.op_slice]
        return memory_steps_kv(events_m, kv_events(g), kv_op, start, end, act_by_chunk, static, weight_holds)
    dev_col, time_col, mem_col = memory_steps(events_m, start, end, act_by_chunk, static, weight_holds)
    return dev_col, time_col, mem_col, np.zeros(len(dev_col))


def _copy_stream_inputs(f: np.ndarray, b: np.ndarray, w: np.ndarray, act: np.ndarray, kv_cost: np.ndarray,
                        off: np.ndarray, host_bandwidth: Any) -> float | None:
    """The link's MB per ms when the run has copy streams (``host_bandwidth`` given or anything
    offloaded), else None; a :class:`SapptkError` naming the argument for what the copy stream cannot run."""
    if host_bandwidth is None and not off.any():
        return None
    if host_bandwidth is None or isinstance(host_bandwidth, bool | np.bool_) \
            or not isinstance(host_bandwidth, Real | np.integer | np.floating) \
            or not math.isfinite(float(host_bandwidth)) or host_bandwidth <= 0:
        raise SapptkError(f"host_bandwidth = {show(host_bandwidth)}: expected the host link's MB per ms > 0"
                          + (" (activations are offloaded)" if off.any() else ""))
    shaped = [name for name, x in (("forward", f), ("backward", b), ("weight", w), ("activation", act))
              if x.ndim != 1]
    if shaped or kv_cost.any():
        what = ", ".join(shaped) or "kv"
        raise SapptkError(f"{what}: the copy stream of activation offload (host_bandwidth) is modelled with one cost "
                          "per virtual stage and no K/V: expected per-stage costs (no per-micro-batch or per-slice "
                          "arrays, kv = 0)")
    if (off > act).any():
        vs = int(np.flatnonzero(off > act)[0])
        raise SapptkError(f"offloaded: virtual stage {vs} offloads {off[vs]:g} MB of an activation of "
                          f"{act[vs]:g} MB: expected at most the activation")
    return float(host_bandwidth)


def _transfers(program: Program, pairs: copy_stream.Pairs, stream: copy_stream.Stream, run: copy_stream.StreamRun,
               host_bandwidth: float) -> pd.DataFrame:
    """The transfers frame of :class:`OffloadSimulation`."""
    g = program.graph
    f_op = pairs.f_op[stream.pair]
    issue = np.where(stream.fetch, run.start[stream.issue_unit], run.end[stream.issue_unit])
    return pd.DataFrame({
        "device": stream.device.astype(np.int64),
        "kind": pd.Categorical.from_codes(stream.fetch.astype(np.int8),
                                          dtype=pd.CategoricalDtype(list(copy_stream.TRANSFER_KINDS))),
        "micro_batch": g.op_micro_batch[f_op],
        "virtual_stage": g.op_virtual_stage[f_op],
        "slice": g.op_slice[f_op],
        "issue_ms": issue,
        "start_ms": run.c_start,
        "end_ms": run.c_end,
        "size_mb": stream.duration * host_bandwidth,
        "wait_ms": run.wait,
    })
