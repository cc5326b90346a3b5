"""Time and memory of a :class:`~sapptk.schedules.Program`, op by op.

Conventions (the balancer uses the same ones, through the same Program):

* **Costs** are given per virtual stage and per micro-batch, in ms: ``forward`` for an
  ``F``; ``backward`` for the input-gradient work and ``weight`` for the weight-gradient
  work. A full backward ``B`` lasts ``backward + weight``; a split one runs ``I`` for
  ``backward`` and ``W`` for ``weight``. A sequence slice lasts ``1/splits`` of its op.
* **Time.** A unit starts when the previous unit of its device has ended and every op
  it depends on has ended, plus ``comm`` ms when that op ran on another device. An
  overlapped unit lasts ``overlap(op durations)``: by default their sum (overlap hides
  communication, not compute).
* **Memory**, in MB. A device always holds ``params`` of its virtual stages plus
  ``constant``. An ``F`` allocates its virtual stage's ``activation`` (per micro-batch,
  ``1/splits`` per slice) when its unit *starts*; a ``B`` frees it when its unit *ends*;
  an ``I`` frees ``1 - weight_holds`` of it and its ``W`` the remaining ``weight_holds``.
  Within a unit, allocations come before frees.

The run is iterative over the program's dependency levels (vectorised with numpy), no
recursion, linear in the number of ops.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from sapptk.errors import SapptkError
from sapptk.schedules.program import B_CODE, F_CODE, I_CODE, KINDS, W_CODE, Program

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
    from this time on); the first row of each device is the static memory at time 0.
    ``peak_memory``: Series of peak MB per device. ``summary``: one row per device with
    ``busy_ms``, ``idle_ms``, ``bubble_of_step``, ``static_mb``, ``peak_mb``,
    ``peak_live`` (micro-batch activations at the peak, summed over chunks).
    """

    program: Program
    step_time: float
    events: pd.DataFrame
    memory: pd.DataFrame
    peak_memory: pd.Series
    bubble: Bubble
    summary: pd.DataFrame
    costs: dict = field(repr=False, default_factory=dict)

    def to_chrome_trace(self, path: str | os.PathLike[str]) -> Path:
        """Write the run as a Chrome trace (Perfetto, ``chrome://tracing``): every op as an event
        (device = process; kind, micro-batch, virtual stage in its args) and a memory counter
        per device; gzipped when ``path`` ends in ``.gz``. See :mod:`sapptk.formats.chrome_trace`."""
        from sapptk.formats.chrome_trace import simulation_events, write_trace

        events = simulation_events(self.events, self.memory, name=self.program.name)
        return write_trace(path, events, metadata={"step_time_ms": self.step_time, "schedule": self.program.name})

    def __repr__(self) -> str:
        pr = self.program
        return (
            f"Simulation({pr.name!r}, p={pr.stages}, v={pr.chunks}, m={pr.micro_batches}, "
            f"step_time={self.step_time:.6g} ms, bubble_of_compute={self.bubble.of_compute:.4g}, "
            f"peak={self.peak_memory.max():.6g} MB)"
        )


def per_stage(name: str, value: Costs, n: int) -> np.ndarray:
    """A cost given as a scalar or one value per virtual stage, as a float array of n."""
    arr = np.asarray(value, dtype=float)
    if arr.ndim == 0:
        arr = np.full(n, float(arr))
    if arr.shape != (n,):
        raise SapptkError(f"{name}: expected a number or {n} values (one per virtual stage), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)) or (arr < 0).any():
        raise SapptkError(f"{name}: expected finite values >= 0, got {arr.tolist()}")
    return arr


_OVERLAPS: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "sum": lambda d, ptr: np.add.reduceat(d, ptr[:-1]),
    "max": lambda d, ptr: np.maximum.reduceat(d, ptr[:-1]),
}


def op_durations(
    program: Program, forward: Costs, backward: Costs, weight: Costs = 0.0
) -> np.ndarray:
    """Duration in ms of every op of the program, in op order."""
    g = program.graph
    nvs = program.num_virtual_stages
    f = per_stage("forward", forward, nvs)
    b = per_stage("backward", backward, nvs)
    w = per_stage("weight", weight, nvs)
    table = np.stack([f, b + w, b, w]) / program.splits  # rows in KINDS order
    return table[g.op_kind, g.op_virtual_stage]


def unit_durations(program: Program, op_duration: np.ndarray, overlap: str = "sum") -> np.ndarray:
    """Duration of every unit: ``overlap`` ("sum" or "max") of its ops' durations."""
    try:
        fn = _OVERLAPS[overlap]
    except KeyError:
        raise SapptkError(f"overlap: expected one of {sorted(_OVERLAPS)}, got {overlap!r}") from None
    return fn(op_duration, program.graph.unit_op_ptr)


def unit_times(program: Program, duration: np.ndarray, comm: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """Start and end (ms) of every unit, given unit durations; level by level."""
    g = program.graph
    n = g.n_units
    end = np.zeros(n + 1)  # index n: "no predecessor", ends at 0
    start = np.zeros(n)
    lag = g.unit_cross * float(comm)
    preds, lp, lu = g.unit_preds, g.level_ptr, g.level_units
    for lvl in range(len(lp) - 1):
        idx = lu[lp[lvl] : lp[lvl + 1]]
        s = (end[preds[idx]] + lag[idx]).max(axis=1)
        start[idx] = s
        end[idx] = s + duration[idx]
    return start, end[:n]


def simulate(
    program: Program,
    forward: Costs,
    backward: Costs,
    weight: Costs = 0.0,
    activation: Costs = 1.0,
    params: Costs = 0.0,
    comm: float = 0.0,
    *,
    constant: float = 0.0,
    weight_holds: float = WEIGHT_HOLDS,
    overlap: str = "sum",
) -> Simulation:
    """Run ``program`` with the given per-virtual-stage costs; see the module docstring.

    Parameters
    ----------
    forward, backward, weight: ms per micro-batch for each virtual stage (or one number).
    activation: MB an in-flight micro-batch keeps on each virtual stage.
    params: static MB of each virtual stage (weights, gradients, optimizer share).
    comm: point-to-point latency in ms between devices.
    constant: MB every device holds besides parameters and activations.
    weight_holds: fraction of the activation a ``W`` still needs after its ``I``.
    overlap: how long an overlapped unit lasts: "sum" or "max" of its ops.
    """
    if not (np.isfinite(comm) and comm >= 0):
        raise SapptkError(f"comm: expected a latency >= 0 ms, got {comm!r}")
    if not 0.0 <= weight_holds <= 1.0:
        raise SapptkError(f"weight_holds: expected a fraction in [0, 1], got {weight_holds!r}")
    g = program.graph
    nvs = program.num_virtual_stages
    f = per_stage("forward", forward, nvs)
    b = per_stage("backward", backward, nvs)
    w = per_stage("weight", weight, nvs)
    op_dur = op_durations(program, f, b, w)
    dur = unit_durations(program, op_dur, overlap)
    start, end = unit_times(program, dur, comm)
    step_time = float(end.max(initial=0.0))

    act = per_stage("activation", activation, nvs)
    par = per_stage("params", params, nvs)
    static = np.bincount(np.asarray(program.placement), weights=par, minlength=program.stages) + constant
    memory = _memory_steps(program, start, end, act, static, weight_holds)
    peak = memory.groupby("device", observed=True)["memory_mb"].max().reindex(range(program.stages))
    peak.name = "peak_mb"

    busy = np.bincount(g.unit_device, weights=dur, minlength=program.stages)
    idle = step_time - busy
    total_busy = float(busy.sum())
    total_idle = float(idle.sum())
    bubble = Bubble(
        of_compute=total_idle / total_busy if total_busy > 0 else 0.0,
        of_step=total_idle / (step_time * program.stages) if step_time > 0 else 0.0,
        idle=total_idle,
    )
    peak_live = program.peak_live(weight_holds)
    summary = pd.DataFrame(
        {
            "device": np.arange(program.stages),
            "busy_ms": busy,
            "idle_ms": idle,
            "bubble_of_step": idle / step_time if step_time > 0 else np.zeros(program.stages),
            "static_mb": static,
            "peak_mb": peak.to_numpy(),
            "peak_live": peak_live,
        }
    )
    ou = g.op_unit
    events = pd.DataFrame(
        {
            "device": g.unit_device[ou],
            "kind": pd.Categorical.from_codes(g.op_kind, categories=list(KINDS)),
            "micro_batch": g.op_micro_batch,
            "virtual_stage": g.op_virtual_stage,
            "chunk": np.asarray(program.chunk_of, dtype=np.int64)[g.op_virtual_stage],
            "slice": g.op_slice,
            "unit": ou,
            "start_ms": start[ou],
            "end_ms": end[ou],
        }
    )
    costs = {
        "forward": f,
        "backward": b,
        "weight": w,
        "activation": act,
        "params": par,
        "comm": float(comm),
        "constant": float(constant),
        "weight_holds": float(weight_holds),
        "overlap": overlap,
    }
    return Simulation(program, step_time, events, memory, peak, bubble, summary, costs)


def _memory_steps(
    program: Program,
    start: np.ndarray,
    end: np.ndarray,
    act: np.ndarray,
    static: np.ndarray,
    weight_holds: float,
) -> pd.DataFrame:
    """Memory in use per device as steps, from allocation/free events in op order."""
    g = program.graph
    k = program.splits
    kind = g.op_kind
    a = act[g.op_virtual_stage] / k
    delta = np.zeros(len(kind))
    delta[kind == F_CODE] = a[kind == F_CODE]
    delta[kind == B_CODE] = -a[kind == B_CODE]
    delta[kind == I_CODE] = -(1.0 - weight_holds) * a[kind == I_CODE]
    delta[kind == W_CODE] = -weight_holds * a[kind == W_CODE]
    alloc = kind == F_CODE
    u = g.op_unit
    # order key: units run in sequence on a device, so 2*unit (+1 for frees) is chronological
    ev_key = 2 * u + (~alloc)
    ev_time = np.where(alloc, start[u], end[u])
    order = np.argsort(ev_key, kind="stable")
    ev_dev = g.unit_device[u][order]
    ev_delta = delta[order]
    ev_time = ev_time[order]
    cum = np.cumsum(ev_delta)
    # restart the running sum at each device
    first = np.flatnonzero(np.r_[True, ev_dev[1:] != ev_dev[:-1]])
    base = np.zeros(len(cum))
    offsets = cum[first] - ev_delta[first]
    seg = np.cumsum(np.r_[True, ev_dev[1:] != ev_dev[:-1]]) - 1
    base = offsets[seg]
    live = cum - base
    live[np.abs(live) < 1e-9] = 0.0
    devices = np.arange(program.stages)
    frame = pd.DataFrame(
        {
            "device": np.concatenate([devices, ev_dev]),
            "time_ms": np.concatenate([np.zeros(program.stages), ev_time]),
            "memory_mb": np.concatenate([static, static[ev_dev] + live]),
            "_seq": np.concatenate([np.full(program.stages, -1), np.arange(len(ev_dev))]),
        }
    )
    frame = frame.sort_values(["device", "_seq"], kind="stable").drop(columns="_seq")
    return frame.reset_index(drop=True)
