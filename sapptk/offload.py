"""Activation offload: layers' activations sent to host memory after their forward and fetched
back before their backward, over one copy stream per device.

A plan may mark, per body group and virtual stage, how many of its mode-``"none"`` layers
offload their activations (``offload``, an int array ``(body groups, virtual stages)``; see
:func:`check_offload`). An offloaded layer computes like ``"none"`` (same forward and
backward time); only where its activation lives changes. The model (``docs/offload.md``
works a case by hand):

* **One copy stream per device**, separate from compute, running its transfers one at a
  time in the order they are issued (FIFO). A transfer of ``x`` MB lasts
  ``x / host_bandwidth`` ms (``host_bandwidth`` in MB per ms).
* **Offload** of (virtual stage, micro-batch, slice): issued when its ``F``'s unit ends.
* **Fetch**: issued when the unit *before* its backward (``B``, or ``I`` with a split
  backward) on that device starts: :data:`FETCH_POLICY`, one op of look-ahead. The backward's
  unit cannot start before the fetch ends (a late fetch delays it).
* A micro-batch whose backward is the very next unit after its forward is not offloaded
  (its fetch would be issued before its offload): nothing runs in between that could use
  the room. In 1F1B that is every micro-batch of the last stage.
* **Memory**: the ``F`` allocates the whole activation at its start, as without offload;
  the offloaded part is freed when the offload ends, allocated again when the fetch starts;
  the backward frees as without offload. At one instant, a transfer's free comes after the
  device's op events and its allocation before them (stream order kept).

The copy stream's order depends on the op order alone (an offload is placed at its ``F``'s
unit end, a fetch at its look-ahead unit's start), so units and transfers form one DAG; the
step time is its longest path, run here by one Python pass in topological order. With no
offload the pass, the times, the memory and every frame equal :func:`sapptk.simulate`'s.
(Over 500 lines: the checks of a plan's offload, the pass, the merged memory steps and the
frames are one contract, kept equal to the simulator's, and read best together.)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sapptk.config import OFFLOAD
from sapptk.costs import MEMORY_UNIT_MB, check_counts, layer_coefficients, stage_costs
from sapptk.errors import ConfigError, SapptkError
from sapptk.profile import MODES
from sapptk.schedules.memory import memory_steps
from sapptk.schedules.ops import B_CODE, F_CODE, I_CODE
from sapptk.schedules.program import Program, kind_dtype
from sapptk.simulation import WEIGHT_HOLDS, Bubble, Simulation, op_durations, per_stage, unit_durations

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile

__all__ = [
    "FETCH_POLICY",
    "OFFLOAD",
    "TRANSFER_KINDS",
    "OffloadSimulation",
    "check_offload",
    "offload_step",
    "offloaded_mb",
    "simulate_offload",
    "simulate_plan_offload",
]

FETCH_POLICY = "one-op look-ahead"
"""When a fetch is issued: when the unit before its backward starts on its device."""

TRANSFER_KINDS: tuple[str, ...] = ("offload", "fetch")

_NONE = MODES.index("none")


@dataclass(frozen=True, eq=False)
class OffloadSimulation(Simulation):
    """A :class:`~sapptk.simulation.Simulation` with a copy stream per device.

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


# ------------------------------------------------------------------ validation
def check_offload(profile: Profile, config: PipelineConfig, counts: Any, offload: Any) -> np.ndarray | None:
    """Validate an offload array against a layer assignment; return it as int64 (None when all zero or None).

    ``offload[g, vs]`` layers of body group ``g`` on virtual stage ``vs`` offload their
    activations: whole numbers, at least 0 and at most the group's mode-``"none"`` layers
    there (``counts[g, "none", vs]``). Nonzero offload needs ``config.host_bandwidth``.
    Raises :class:`~sapptk.errors.ConfigError` naming the entry.
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
    if raw.dtype.kind not in "iu" and (
        raw.dtype.kind != "f" or not np.all(np.isfinite(raw)) or np.any(raw != np.round(raw))
    ):
        raise ConfigError("offload: expected whole numbers of layers")
    arr = raw.astype(np.int64)
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


# ------------------------------------------------------------------ structure
@dataclass(frozen=True, eq=False)
class _Pairs:
    """Every activation a program keeps: its ``F`` and the op that needs it back (``B`` or ``I``)."""

    f_op: np.ndarray
    b_op: np.ndarray
    f_unit: np.ndarray
    b_unit: np.ndarray
    device: np.ndarray
    virtual_stage: np.ndarray
    roundtrip: np.ndarray  # something runs between the F's unit and the backward's unit
    preds: list  # per unit: [(pred unit, crosses devices), ...]
    topo: list


@lru_cache(maxsize=16)
def _pairs(program: Program) -> _Pairs:
    g = program.graph
    kind = g.op_kind
    f_ops = np.flatnonzero(kind == F_CODE)
    b_ops = np.flatnonzero((kind == B_CODE) | (kind == I_CODE))
    keys = (g.op_slice, g.op_micro_batch, g.op_virtual_stage)
    f_ops = f_ops[np.lexsort(tuple(k[f_ops] for k in keys))]
    b_ops = b_ops[np.lexsort(tuple(k[b_ops] for k in keys))]
    f_unit = g.op_unit[f_ops]
    b_unit = g.op_unit[b_ops]
    n = g.n_units
    preds_arr, cross_arr = g.unit_preds, g.unit_cross
    # per unit its predecessors as plain lists (the pass below is Python): one tolist, not one per unit
    preds = [[(q, c) for q, c in zip(row, cross, strict=True) if q < n]
             for row, cross in zip(preds_arr.tolist(), cross_arr.tolist(), strict=True)]
    return _Pairs(
        f_op=f_ops,
        b_op=b_ops,
        f_unit=f_unit,
        b_unit=b_unit,
        device=g.unit_device[f_unit],
        virtual_stage=g.op_virtual_stage[f_ops],
        roundtrip=b_unit - 1 > f_unit,
        preds=preds,
        topo=g.topo_order.tolist(),
    )


@dataclass(frozen=True, eq=False)
class _Stream:
    """The transfers of one run, in stream order (device by device, FIFO within a device)."""

    pair: np.ndarray  # index into _Pairs
    fetch: np.ndarray  # bool: a fetch (else an offload)
    issue_unit: np.ndarray  # the unit whose end (offload) or start (fetch) issues it
    device: np.ndarray
    duration: np.ndarray


def _stream(pairs: _Pairs, size: np.ndarray, bandwidth: float, splits: int) -> _Stream:
    """The copy streams for ``size[vs]`` MB per micro-batch offloaded from each virtual stage."""
    chosen = np.flatnonzero(pairs.roundtrip & (size[pairs.virtual_stage] > 0))
    k = len(chosen)
    pair = np.concatenate([chosen, chosen])
    fetch = np.r_[np.zeros(k, dtype=bool), np.ones(k, dtype=bool)]
    issue_unit = np.concatenate([pairs.f_unit[chosen], pairs.b_unit[chosen] - 1])
    key = 2 * issue_unit + ~fetch  # an offload at its unit's end, a fetch at its unit's start
    op = np.concatenate([pairs.f_op[chosen], pairs.b_op[chosen]])
    order = np.lexsort((op, key))  # units are numbered device by device: devices stay apart
    pair, fetch, issue_unit = pair[order], fetch[order], issue_unit[order]
    duration = size[pairs.virtual_stage[pair]] / splits / bandwidth
    return _Stream(pair, fetch, issue_unit, pairs.device[pair], duration)


# ------------------------------------------------------------------ the pass
def _times(
    pairs: _Pairs, stream: _Stream, dur: np.ndarray, comm: float, n_devices: int
) -> tuple[list[float], list[float], list[float], list[float], list[float]]:
    """Unit starts and ends, transfer starts and ends, and each fetch's wait (one topological pass)."""
    n = len(dur)
    d_list = dur.tolist()
    start = [0.0] * n
    end = [0.0] * n
    k = len(stream.pair)
    c_start = [0.0] * k
    c_end = [0.0] * k
    wait = [0.0] * k
    issue = stream.issue_unit.tolist()
    is_fetch = stream.fetch.tolist()
    c_dur = stream.duration.tolist()
    dev_of = stream.device.tolist()
    waits: dict[int, list[int]] = {}
    for i in np.flatnonzero(stream.fetch).tolist():
        waits.setdefault(int(pairs.b_unit[stream.pair[i]]), []).append(i)
    ptr = np.searchsorted(stream.device, np.arange(n_devices)).tolist()  # next transfer of each device
    done = [0.0] * n_devices  # when each device's stream is free

    def advance(upto: int) -> None:
        d = dev_of[upto]
        i = ptr[d]
        free = done[d]
        while i <= upto:
            u = issue[i]
            at = start[u] if is_fetch[i] else end[u]
            s = at if at > free else free
            c_start[i] = s
            free = s + c_dur[i]
            c_end[i] = free
            i += 1
        ptr[d] = i
        done[d] = free

    preds = pairs.preds
    for u in pairs.topo:
        s = 0.0
        for q, cross in preds[u]:
            t = end[q] + comm if cross and comm else end[q]
            if t > s:
                s = t
        if u in waits:
            for i in waits[u]:
                if ptr[dev_of[i]] <= i:
                    advance(i)
                if c_end[i] > s:
                    wait[i] = c_end[i] - s
                    s = c_end[i]
        start[u] = s
        end[u] = s + d_list[u]
    if k:
        for d in range(n_devices):
            last = int(np.searchsorted(stream.device, d, side="right")) - 1
            if last >= ptr[d]:
                advance(last)
    return start, end, c_start, c_end, wait


def _memory(
    program: Program,
    pairs: _Pairs,
    stream: _Stream,
    start: np.ndarray,
    end: np.ndarray,
    c_start: np.ndarray,
    c_end: np.ndarray,
    act_by_chunk: np.ndarray,
    off_by_chunk: np.ndarray,
    static: np.ndarray,
    weight_holds: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Memory steps ``(device, time, memory)``: the program's events, with the transfers merged in."""
    dev, times, mem = memory_steps(program.memory_events, start, end, act_by_chunk, static, weight_holds)
    k = len(stream.pair)
    if k == 0:
        return dev, times, mem
    # transfer events: an offload's end sends one activation out (+1), a fetch's start brings it back (-1)
    t_time = np.where(stream.fetch, c_start, c_end)
    t_dev = stream.device
    t_step = np.where(stream.fetch, -1, 1)
    chunk = np.asarray(program.chunk_of, dtype=np.int64)[pairs.virtual_stage[stream.pair]]
    # at one instant a free (+1) comes after the device's ops, an allocation before them, stream order kept
    t_class = np.where(stream.fetch, 0, 2)
    same = np.r_[False, (t_dev[1:] == t_dev[:-1]) & (t_time[1:] == t_time[:-1])]
    for i in np.flatnonzero(same):  # a run of equal instants keeps the stream order
        t_class[i] = max(t_class[i], t_class[i - 1])
    m = len(dev)
    first = np.r_[True, dev[1:] != dev[:-1]]  # each device's static row
    o_class = np.where(first, -1, 1)
    all_dev = np.concatenate([dev, t_dev])
    all_time = np.concatenate([times, t_time])
    all_class = np.concatenate([o_class, t_class])
    seq = np.concatenate([np.arange(m), np.arange(k)])
    order = np.lexsort((seq, all_class, all_time, all_dev))
    is_op = order < m
    # the op memory in force at each row: the latest op row at or before it
    op_idx = np.where(is_op, order, -1)
    op_idx = np.maximum.accumulate(op_idx)
    base = mem[op_idx]
    width = act_by_chunk.shape[1]
    steps = np.zeros((width, len(order)), dtype=np.int64)
    t_rows = np.flatnonzero(~is_op)
    tr = order[t_rows] - m
    steps[chunk[tr], t_rows] = t_step[tr]
    out = np.cumsum(steps, axis=1)  # every device ends with nothing out, so no restart is needed
    rows_dev = all_dev[order]
    shift = np.einsum("cr,rc->r", out, off_by_chunk[rows_dev]) if width else 0.0
    return rows_dev, all_time[order], base - shift


# ------------------------------------------------------------------ public entry points
def _inputs(program: Program, forward: Any, backward: Any, weight: Any, activation: Any, params: Any,
            offloaded: Any, host_bandwidth: Any, comm: Any, constant: Any, weight_holds: Any) -> dict[str, Any]:
    if not isinstance(program, Program):
        raise SapptkError(f"simulate_offload: program: expected a Program, got {type(program).__name__}")
    nvs = program.num_virtual_stages
    out = {name: per_stage(name, value, nvs) for name, value in (
        ("forward", forward), ("backward", backward), ("weight", weight), ("activation", activation),
        ("params", params), ("offloaded", offloaded))}
    if (out["offloaded"] > out["activation"]).any():
        vs = int(np.flatnonzero(out["offloaded"] > out["activation"])[0])
        raise SapptkError(f"offloaded: virtual stage {vs} offloads {out['offloaded'][vs]:g} MB of an activation of "
                          f"{out['activation'][vs]:g} MB: expected at most the activation")
    for name, value in (("comm", comm), ("constant", constant), ("weight_holds", weight_holds)):
        if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating) \
                or not math.isfinite(float(value)) or value < 0:
            raise SapptkError(f"{name}: expected a finite number >= 0, got {value!r}")
        out[name] = float(value)
    if out["weight_holds"] > 1:
        raise SapptkError(f"weight_holds: expected a fraction in [0, 1], got {weight_holds!r}")
    if out["offloaded"].any():
        if host_bandwidth is None or isinstance(host_bandwidth, bool) \
                or not isinstance(host_bandwidth, int | float | np.integer | np.floating) \
                or not math.isfinite(float(host_bandwidth)) or host_bandwidth <= 0:
            raise SapptkError(f"host_bandwidth = {host_bandwidth!r}: expected the host link's MB per ms > 0 "
                              "(activations are offloaded)")
        out["host_bandwidth"] = float(host_bandwidth)
    else:
        out["host_bandwidth"] = None if host_bandwidth is None else float(host_bandwidth)
    return out


def _run(program: Program, x: dict[str, Any], overlap: str) -> dict[str, Any]:
    pairs = _pairs(program)
    g = program.graph
    p = program.stages
    dur = unit_durations(program, op_durations(program, x["forward"], x["backward"], x["weight"]), overlap)
    size = x["offloaded"]
    bw = x["host_bandwidth"] or 1.0
    stream = _stream(pairs, size, bw, program.splits)
    start, end, c_start, c_end, wait = _times(pairs, stream, dur, x["comm"], p)
    start_a, end_a = np.asarray(start), np.asarray(end)
    c_start_a, c_end_a = np.asarray(c_start), np.asarray(c_end)
    placement = np.asarray(program.placement, dtype=np.int64)
    chunk = np.asarray(program.chunk_of, dtype=np.int64)
    static = np.bincount(placement, weights=x["params"], minlength=p) + x["constant"]
    width = program.memory_events.width
    act_by_chunk = np.zeros((p, width))
    act_by_chunk[placement, chunk] = x["activation"]
    off_by_chunk = np.zeros((p, width))
    off_by_chunk[placement, chunk] = size / program.splits
    dev, times, mem = _memory(program, pairs, stream, start_a, end_a, c_start_a, c_end_a, act_by_chunk,
                              off_by_chunk, static, x["weight_holds"])
    first_rows = np.flatnonzero(np.r_[True, dev[1:] != dev[:-1]])
    peak = np.maximum.reduceat(mem, first_rows)
    return {"pairs": pairs, "stream": stream, "dur": dur, "start": start_a, "end": end_a, "c_start": c_start_a,
            "c_end": c_end_a, "wait": np.asarray(wait), "dev": dev, "times": times, "mem": mem, "peak": peak,
            "static": static, "step": float(end_a.max(initial=0.0)), "graph": g}


def offload_step(
    program: Program,
    *,
    forward: Any,
    backward: Any,
    weight: Any = 0.0,
    activation: Any = 1.0,
    params: Any = 0.0,
    offloaded: Any = 0.0,
    host_bandwidth: float | None = None,
    comm: float = 0.0,
    constant: float = 0.0,
    weight_holds: float = WEIGHT_HOLDS,
    overlap: str = "sum",
) -> tuple[float, np.ndarray]:
    """``(step time ms, peak MB per device)`` of :func:`simulate_offload` without building its frames."""
    x = _inputs(program, forward, backward, weight, activation, params, offloaded, host_bandwidth, comm, constant,
                weight_holds)
    r = _run(program, x, overlap)
    return r["step"], r["peak"]


def simulate_offload(
    program: Program,
    *,
    forward: Any,
    backward: Any,
    weight: Any = 0.0,
    activation: Any = 1.0,
    params: Any = 0.0,
    offloaded: Any = 0.0,
    host_bandwidth: float | None = None,
    comm: float = 0.0,
    constant: float = 0.0,
    weight_holds: float = WEIGHT_HOLDS,
    overlap: str = "sum",
    memory_budget: float | None = None,
) -> OffloadSimulation:
    """Run ``program`` with a copy stream per device; arguments as :func:`sapptk.simulate`, plus:

    offloaded: MB per micro-batch each virtual stage sends to the host (at most its
        ``activation``; 0 = nothing, the default).
    host_bandwidth: MB per ms of the host link; needed when anything is offloaded.

    With nothing offloaded the result equals :func:`sapptk.simulate`'s (times, memory, frames).
    Raises :class:`~sapptk.errors.SapptkError` naming the argument for a bad value.
    """
    x = _inputs(program, forward, backward, weight, activation, params, offloaded, host_bandwidth, comm, constant,
                weight_holds)
    if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, int | float)
                                      or not 0 < memory_budget < math.inf):
        raise SapptkError(f"memory_budget: expected MB > 0 per device, or None, got {memory_budget!r}")
    r = _run(program, x, overlap)
    g = r["graph"]
    p = program.stages
    step_time, dur = r["step"], r["dur"]
    peak_mb = r["peak"]
    peak = pd.Series(peak_mb.copy(), index=pd.RangeIndex(p, name="device"), name="peak_mb")
    memory = pd.DataFrame({"device": r["dev"], "time_ms": r["times"], "memory_mb": r["mem"],
                           "kv_mb": np.zeros(len(r["mem"]))})  # K/V is simulated without offload only
    busy = np.bincount(g.unit_device, weights=dur, minlength=p)
    idle = step_time - busy
    total_busy, total_idle = float(busy.sum()), float(idle.sum())
    bubble = Bubble(
        of_compute=total_idle / total_busy if total_busy > 0 else 0.0,
        of_step=total_idle / (step_time * p) if step_time > 0 else 0.0,
        idle=total_idle,
    )
    summary = pd.DataFrame({
        "device": np.arange(p),
        "busy_ms": busy,
        "idle_ms": idle,
        "bubble_of_step": idle / step_time if step_time > 0 else np.zeros(p),
        "static_mb": r["static"],
        "peak_mb": peak_mb,
        "peak_live": program.peak_live(x["weight_holds"]),
    })
    chunk = np.asarray(program.chunk_of, dtype=np.int64)
    ou = g.op_unit
    events = pd.DataFrame({
        "device": g.unit_device[ou],
        "kind": pd.Categorical.from_codes(g.op_kind.copy(), dtype=kind_dtype()),
        "micro_batch": g.op_micro_batch.copy(),
        "virtual_stage": g.op_virtual_stage.copy(),
        "chunk": chunk[g.op_virtual_stage],
        "slice": g.op_slice.copy(),
        "unit": ou.copy(),
        "start_ms": r["start"][ou],
        "end_ms": r["end"][ou],
    })
    pairs, stream = r["pairs"], r["stream"]
    f_op = pairs.f_op[stream.pair]
    issue = np.where(stream.fetch, r["start"][stream.issue_unit], r["end"][stream.issue_unit])
    transfers = pd.DataFrame({
        "device": stream.device.astype(np.int64),
        "kind": pd.Categorical.from_codes(stream.fetch.astype(np.int8),
                                          dtype=pd.CategoricalDtype(list(TRANSFER_KINDS))),
        "micro_batch": g.op_micro_batch[f_op],
        "virtual_stage": g.op_virtual_stage[f_op],
        "slice": g.op_slice[f_op],
        "issue_ms": issue,
        "start_ms": r["c_start"],
        "end_ms": r["c_end"],
        "size_mb": stream.duration * (x["host_bandwidth"] or 0.0),
        "wait_ms": r["wait"],
    })
    costs = {k: x[k] for k in ("forward", "backward", "weight", "activation", "params", "comm", "constant",
                               "weight_holds")}
    costs["overlap"] = overlap
    return OffloadSimulation(program, step_time, events, memory, peak, bubble, summary, costs, memory_budget,
                             transfers=transfers, host_bandwidth=x["host_bandwidth"], offloaded_mb=x["offloaded"])


def simulate_plan_offload(profile: Profile, config: PipelineConfig, counts: Any, offload: Any,
                          **kw: Any) -> OffloadSimulation:
    """Simulate an assignment with offload on the config's program (costs from :func:`sapptk.costs.stage_costs`,
    the host bandwidth and budget from the config); ``kw``: ``weight_holds``, ``overlap``, ``memory_budget``."""
    off = check_offload(profile, config, counts, offload)
    c = stage_costs(profile, config, counts)
    args: dict[str, Any] = {"comm": c.comm, "constant": c.constant, "memory_budget": config.memory_budget}
    args.update(kw)
    return simulate_offload(config.program(), forward=c.forward, backward=c.backward, weight=c.weight,
                            activation=c.activation, params=c.params, offloaded=offloaded_mb(profile, config, off),
                            host_bandwidth=config.host_bandwidth, **args)
