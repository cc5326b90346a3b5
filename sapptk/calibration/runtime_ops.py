"""Op costs and the runtime's own per-op overhead from a pipeline run's trace.

A pipeline runtime spends time between the ops of a device that is neither compute nor
waiting for a neighbour: posting sends and receives, its bookkeeping, the profiler's own
ranges. sapptk's time model has no such term unless it is added to the op costs; this module
measures it from the run's own trace, where each op and each wait is a range:

* :func:`op_samples` — one row per op range whose name matches ``pattern`` (named groups
  ``kind`` in F/B/I/W, ``stage`` the virtual stage, ``micro_batch``): ``device`` (the trace's
  process), ``step``, ``kind``, ``virtual_stage``, ``micro_batch``, ``start_ms``,
  ``duration_ms``; steps are the ranges named by ``step`` on each device.
* :func:`op_overhead` — per device and step, the gaps: step span − ops − waits (ranges named
  by ``wait``), over the device's op count; the median over devices and steps (ms per op),
  and the frame of every (device, step).
* :func:`stage_costs` — the medians (or means) per virtual stage as ``simulate``'s
  ``forward``, ``backward`` (``B``, or ``I`` of a split backward) and ``weight`` (``W``);
  ``overhead`` ms are added to every op (``F``, ``B`` or ``I``, and ``W``).
* :func:`unit_gaps` — with the schedule's own :class:`~sapptk.schedules.Program`, what held
  each unit (a device's op, or its overlapped ops) back in each step: its device (the previous
  unit, or a dependency on the same device) or a neighbour (a dependency on another device),
  and the gap from that moment to the unit's first op; the gaps between the ops of an
  overlapped unit too.
* :func:`fit_runtime` — from those gaps, the terms the simulator takes (a
  :class:`RuntimeFit`): the per-op ``overhead`` (the mean gap after an op when the device held
  the next unit back: it is added to every op's cost), ``comm`` (the mean lag from a
  neighbour's unit end to the unit it releases, less that overhead: ``simulate``'s ``comm``)
  and ``step_ms``, the step's own work outside its ops (splitting the batch, scaling the
  gradients, waiting for the last sends: the median of the longest device step range less
  the span of the ops).
* :func:`fit_messages` — the same gaps split by what the runtime does around an op: a base
  per op, the posting of a send after a unit whose output crosses to another device and the
  posting of a receive before a unit whose input comes from one (gloo on CPU does both on the
  compute thread, about 0.2-0.5 ms each here), by least squares; ``comm`` is then the lag
  beyond the base and the send. A schedule with more crossings per op (interleaved: 0.75 a
  op at p = 2, v = 2; ZB-H1 0.33) pays more per op, which one overhead per op cannot carry
  from one schedule to another.
* :func:`op_costs` — like :func:`stage_costs`, per (virtual stage, micro-batch) from the
  program's own ops: right where a schedule runs some backwards whole and others split.
* :func:`step_costs` — every op's own duration in one step, as (virtual stage,
  micro-batch) arrays: ``simulate`` then replays that step.

The sum along the critical path is what a step costs, so the fit takes means, not medians:
on a shared CPU, a few preempted gaps of several ms carry much of the time.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sapptk.errors import TraceError
from sapptk.schedules import KINDS, Program

__all__ = ["OP_PATTERN", "WAIT_PATTERN", "RuntimeFit", "fit_messages", "fit_runtime", "op_costs", "op_overhead",
           "op_samples", "stage_costs", "step_costs", "unit_gaps", "unit_messages"]

OP_PATTERN = r"sapptk:(?P<kind>[FBIW]):(?P<stage>\d+):(?P<micro_batch>\d+)"
"""The op ranges ``benchmarks/runtime_fidelity.py`` records around PyTorch's stage calls."""
WAIT_PATTERN = r"sapptk:wait"
"""The ranges around the waits for neighbours' sends in the same benchmark."""


def _steps(events: pd.DataFrame, step: str) -> pd.DataFrame:
    spans = events[events["name"].str.fullmatch(step)]
    if spans.empty:
        raise TraceError(f"no step ranges named like {step!r}: expected one per step on every device")
    return spans


def op_samples(trace: Any, pattern: str = OP_PATTERN, *, step: str = r"ProfilerStep#\d+",
               skip_steps: int = 0) -> pd.DataFrame:
    """Every op range of ``trace`` (a :class:`~sapptk.formats.chrome_trace.Trace`), tidy (see
    the module docstring); the first ``skip_steps`` steps of each device are left out."""
    rx = re.compile(pattern)
    if not {"kind", "stage", "micro_batch"} <= set(rx.groupindex):
        raise TraceError(f"pattern {pattern!r}: expected the named groups kind, stage and micro_batch")
    ev = trace.events
    spans = _steps(ev, step)
    rows = []
    for device, own in spans.sort_values("ts").groupby("pid", sort=True):
        windows = list(zip(own["ts"], own["ts"] + own["dur"], strict=True))[skip_steps:]
        ops = ev[(ev["pid"] == device) & ev["name"].str.fullmatch(pattern)]
        for row in ops.itertuples(index=False):
            hit = next((i for i, (a, b) in enumerate(windows) if a <= row.ts <= b), None)
            if hit is None:
                continue
            m = rx.fullmatch(row.name)
            rows.append((device, hit + skip_steps, m.group("kind"), int(m.group("stage")), int(m.group("micro_batch")),
                         row.ts / 1e3, row.dur / 1e3))
    if not rows:
        raise TraceError(f"{trace.source}: no op range named like {pattern!r} inside the recorded steps")
    frame = pd.DataFrame(rows, columns=["device", "step", "kind", "virtual_stage", "micro_batch", "start_ms",
                                        "duration_ms"])
    frame["kind"] = pd.Categorical(frame["kind"], categories=["F", "B", "I", "W"])
    return frame


def op_overhead(trace: Any, ops: pd.DataFrame, *, wait: str = WAIT_PATTERN,
                step: str = r"ProfilerStep#\d+") -> tuple[float, pd.DataFrame]:
    """``(median ms per op, frame)``: per device and step, ``span_ms``, ``ops_ms``, ``wait_ms``,
    ``ops`` and ``overhead_ms`` = (span − ops − waits) / ops."""
    ev = trace.events
    spans = _steps(ev, step)
    rows = []
    for (device, step_index), own in ops.groupby(["device", "step"], observed=True):
        window = spans[spans["pid"] == device].sort_values("ts").iloc[int(step_index)]
        start, end = window["ts"], window["ts"] + window["dur"]
        waits = ev[(ev["pid"] == device) & ev["name"].str.fullmatch(wait) & (ev["ts"] >= start) & (ev["ts"] <= end)]
        span_ms, ops_ms, wait_ms = window["dur"] / 1e3, own["duration_ms"].sum(), waits["dur"].sum() / 1e3
        rows.append((device, step_index, span_ms, ops_ms, wait_ms, len(own), (span_ms - ops_ms - wait_ms) / len(own)))
    frame = pd.DataFrame(rows, columns=["device", "step", "span_ms", "ops_ms", "wait_ms", "ops", "overhead_ms"])
    return float(np.median(frame["overhead_ms"])), frame


def _check_overhead(overhead: float) -> float:
    if isinstance(overhead, bool) or not isinstance(overhead, int | float | np.floating) or not np.isfinite(overhead) \
            or overhead < 0:
        raise TraceError(f"overhead = {overhead!r}: expected a number >= 0 (ms per op)")
    return float(overhead)


def stage_costs(ops: pd.DataFrame, num_virtual_stages: int, *, overhead: float = 0.0,
                statistic: str = "median") -> dict[str, np.ndarray]:
    """``statistic`` ("median" or "mean") of the ``forward``, ``backward`` and ``weight`` ms per
    virtual stage, ``overhead`` added per op."""
    overhead = _check_overhead(overhead)
    if statistic not in ("median", "mean"):
        raise TraceError(f"statistic = {statistic!r}: expected 'median' or 'mean'")
    med = ops.groupby(["kind", "virtual_stage"], observed=True)["duration_ms"].agg(statistic)
    out = {name: np.zeros(num_virtual_stages) for name in ("forward", "backward", "weight")}
    split = "I" in med.index.get_level_values(0)
    for vs in range(num_virtual_stages):
        def get(kind: str, vs: int = vs) -> float:
            if (kind, vs) not in med.index:
                raise TraceError(f"no {kind} op of virtual stage {vs} in the trace")
            return float(med[(kind, vs)])

        out["forward"][vs] = get("F") + overhead
        out["backward"][vs] = get("I" if split else "B") + overhead
        out["weight"][vs] = get("W") + overhead if split else 0.0
    return out


def step_costs(program: Program, ops: pd.DataFrame, step: int, *, overhead: float = 0.0) -> dict[str, np.ndarray]:
    """Each op's own duration in ``step`` (plus ``overhead``) as ``simulate``'s ``forward``,
    ``backward`` and ``weight`` of shape (virtual stages, micro-batches): a ``B`` or an ``I``
    gives ``backward``, a ``W`` gives ``weight``. Every op of ``program`` must be in the step."""
    overhead = _check_overhead(overhead)
    _check_program(program)
    shape = (program.num_virtual_stages, program.micro_batches)
    out = {name: np.zeros(shape) for name in ("forward", "backward", "weight")}
    target = {"F": "forward", "B": "backward", "I": "backward", "W": "weight"}
    own = _step_table(program, ops, step)
    g = program.graph
    for i in range(g.n_ops):
        kind = KINDS[g.op_kind[i]]
        vs, mb = int(g.op_virtual_stage[i]), int(g.op_micro_batch[i])
        out[target[kind]][vs, mb] = own[(kind, vs, mb)][1] + overhead
    return out


def op_costs(program: Program, ops: pd.DataFrame, *, overhead: float = 0.0,
             statistic: str = "mean") -> dict[str, np.ndarray]:
    """``simulate``'s costs of shape (virtual stages, micro-batches) from every step of a run:
    each op of ``program`` costs the ``statistic`` ("mean" or "median") of its kind on its
    virtual stage, plus ``overhead``. Unlike :func:`stage_costs` it keeps a schedule that runs
    some micro-batches' backward whole (``B``) and others split (``I`` then ``W``) exact."""
    _check_program(program)
    overhead = _check_overhead(overhead)
    if statistic not in ("median", "mean"):
        raise TraceError(f"statistic = {statistic!r}: expected 'median' or 'mean'")
    stat = ops.groupby(["kind", "virtual_stage"], observed=True)["duration_ms"].agg(statistic)
    shape = (program.num_virtual_stages, program.micro_batches)
    out = {name: np.zeros(shape) for name in ("forward", "backward", "weight")}
    target = {"F": "forward", "B": "backward", "I": "backward", "W": "weight"}
    g = program.graph
    for i in range(g.n_ops):
        key = (KINDS[g.op_kind[i]], int(g.op_virtual_stage[i]))
        if key not in stat.index:
            raise TraceError(f"no {key[0]} op of virtual stage {key[1]} in the trace, which the {program.name!r} "
                             "program runs")
        out[target[key[0]]][key[1], int(g.op_micro_batch[i])] = float(stat[key]) + overhead
    return out


def _check_program(program: Any) -> None:
    if not isinstance(program, Program):
        raise TraceError(f"program: expected a sapptk.schedules.Program (the schedule the run executed), "
                         f"got {type(program).__name__}")


def _step_table(program: Program, ops: pd.DataFrame, step: int) -> dict[tuple[str, int, int], tuple[float, float]]:
    """(kind, virtual stage, micro-batch) -> (start, duration) ms of every op of ``program`` in ``step``."""
    _check_program(program)
    if program.splits != 1:
        raise TraceError(f"program {program.name!r} has {program.splits} sequence slices: the runtime ops "
                         "carry no slice index (expected splits = 1)")
    own = ops[ops["step"] == step]
    table = {(str(r.kind), int(r.virtual_stage), int(r.micro_batch)): (float(r.start_ms), float(r.duration_ms))
             for r in own.itertuples(index=False)}
    g = program.graph
    for i in range(g.n_ops):
        key = (KINDS[g.op_kind[i]], int(g.op_virtual_stage[i]), int(g.op_micro_batch[i]))
        if key not in table:
            raise TraceError(f"step {step}: no {key[0]} op of virtual stage {key[1]}, micro-batch {key[2]} in the "
                             f"trace, which the {program.name!r} program runs (a trace of another schedule?)")
    return table


def unit_gaps(program: Program, ops: pd.DataFrame, *, comm: float = 0.0) -> pd.DataFrame:
    """What held each unit back, per step: one row per unit and per gap inside an overlapped unit.

    Columns: ``step``, ``device``, ``unit`` (its index in ``program.graph``), ``kind`` (of the
    unit's first op), ``bound`` ("device": its device's previous unit or a dependency on the
    same device was the last to be ready; "neighbour": a dependency on another device was,
    counting ``comm`` ms of lag after its end; "first": the device's first unit, nothing to
    wait for; "inside": a gap between the ops of an overlapped unit), ``after`` (kind of the
    op whose end the gap starts from), ``after_stage`` and ``after_unit`` (that op's virtual
    stage and unit, −1 for "first"),
    ``gap_ms`` (from that end to the unit's first op).
    A unit's end is its last op's: the runtime sends an overlapped unit's outputs after all
    of its ops.
    """
    comm = _check_overhead(comm)
    _check_program(program)
    g = program.graph
    n = g.n_units
    rows = []
    for step in sorted(int(s) for s in ops["step"].unique()):
        table = _step_table(program, ops, step)
        starts, ends, last, last_vs = np.zeros(n), np.zeros(n), [""] * n, [-1] * n
        first = [""] * n
        for u in range(n):
            seq = sorted(table[(KINDS[g.op_kind[i]], int(g.op_virtual_stage[i]), int(g.op_micro_batch[i]))]
                         + (KINDS[g.op_kind[i]], int(g.op_virtual_stage[i]))
                         for i in range(int(g.unit_op_ptr[u]), int(g.unit_op_ptr[u + 1])))
            starts[u], first[u] = seq[0][0], seq[0][2]
            end_op = max(seq, key=lambda x: x[0] + x[1])
            ends[u], last[u], last_vs[u] = end_op[0] + end_op[1], end_op[2], end_op[3]
            for (s0, d0, k0, v0), (s1, *_rest) in zip(seq[:-1], seq[1:], strict=True):
                rows.append((step, int(g.unit_device[u]), u, first[u], "inside", k0, v0, u, s1 - (s0 + d0)))
        for u in range(n):
            device = int(g.unit_device[u])
            here = [int(q) for q, c in zip(g.unit_preds[u], g.unit_cross[u], strict=True) if q < n and not c]
            there = [int(q) for q, c in zip(g.unit_preds[u], g.unit_cross[u], strict=True) if q < n and c]
            if not here and not there:
                rows.append((step, device, u, first[u], "first", "", -1, -1, np.nan))
                continue
            local = max(here, key=lambda q: ends[q]) if here else None
            remote = max(there, key=lambda q: ends[q]) if there else None
            if remote is not None and (local is None or ends[remote] + comm > ends[local]):
                bound, q = "neighbour", remote
            else:
                bound, q = "device", local
            rows.append((step, device, u, first[u], bound, last[q], last_vs[q], q, starts[u] - ends[q]))
    frame = pd.DataFrame(rows, columns=["step", "device", "unit", "kind", "bound", "after", "after_stage", "after_unit",
                                        "gap_ms"])
    for col, cats in (("kind", list(KINDS)), ("after", ["", *KINDS]),
                      ("bound", ["first", "device", "neighbour", "inside"])):
        frame[col] = pd.Categorical(frame[col], categories=cats)
    return frame.sort_values(["step", "device", "unit"], kind="stable").reset_index(drop=True)


@dataclass(frozen=True)
class RuntimeFit:
    """The runtime's own time, fitted from a run's trace (:func:`fit_runtime`).

    ``overhead``: ms added to every op's cost (:func:`stage_costs`' ``overhead``).
    ``comm``: ms of lag across devices beyond it (``simulate``'s ``comm``).
    ``step_ms``: the step's work outside its ops, to add to a simulated step time.
    ``overhead_by_kind``: the mean gap after each kind of op (F, B, I, W), for reading.
    ``gaps``: the :func:`unit_gaps` frame it came from.
    ``base_ms``, ``send_ms``, ``recv_ms``, ``message_comm``: the same gaps split by
    :func:`fit_messages` (0 where not fitted).
    """

    overhead: float
    comm: float
    step_ms: float
    overhead_by_kind: dict[str, float]
    gaps: pd.DataFrame
    base_ms: float = 0.0
    send_ms: float = 0.0
    recv_ms: float = 0.0
    message_comm: float = 0.0


def _fit_gaps(gaps: pd.DataFrame) -> tuple[float, float]:
    own = gaps.loc[gaps["bound"].isin(["device", "inside"]), "gap_ms"]
    if own.empty:
        raise TraceError("no op started right after its own device's previous op: cannot fit the per-op overhead")
    overhead = max(float(own.mean()), 0.0)
    lags = gaps.loc[gaps["bound"] == "neighbour", "gap_ms"]
    return overhead, (max(float(lags.mean()) - overhead, 0.0) if len(lags) else 0.0)


def fit_runtime(program: Program, ops: pd.DataFrame, trace: Any = None, *,
                step: str = r"ProfilerStep#\d+") -> RuntimeFit:
    """The per-op overhead, the lag across devices and the step's outside work of a run.

    ``ops`` come from :func:`op_samples` of ``trace``, the run of ``program``. ``overhead`` is
    the mean of the gaps a device left itself (rows "device" and "inside" of
    :func:`unit_gaps`); ``comm`` the mean of the neighbours' lags less ``overhead``, at least
    0. Which dependency held a unit back depends on ``comm``: the fit starts from 0 and
    repeats until the classification stops changing (at most 20 rounds). ``step_ms`` is the
    median over steps of the longest device's step range less the ops' span (0 without
    ``trace``). On a run that follows the time model exactly (every op followed by the same
    gap, every crossing the same lag) it gives both back exactly.
    """
    comm = 0.0
    gaps = unit_gaps(program, ops, comm=comm)
    for _ in range(20):
        overhead, new_comm = _fit_gaps(gaps)
        regaps = unit_gaps(program, ops, comm=new_comm)
        comm = new_comm
        if regaps["bound"].equals(gaps["bound"]):
            gaps = regaps
            break
        gaps = regaps
    overhead, comm = _fit_gaps(gaps)
    own = gaps[gaps["bound"].isin(["device", "inside"])]
    by_kind = {str(k): float(v) for k, v in own.groupby("after", observed=True)["gap_ms"].mean().items()}
    step_ms = 0.0
    if trace is not None:
        spans = _steps(trace.events, step)
        outside = []
        for index, own_ops in ops.groupby("step"):
            longest = max(float(w.sort_values("ts").iloc[int(index)]["dur"]) for _, w in spans.groupby("pid")) / 1e3
            span = float((own_ops["start_ms"] + own_ops["duration_ms"]).max() - own_ops["start_ms"].min())
            outside.append(longest - span)
        step_ms = max(float(np.median(outside)), 0.0)
    base, send, recv, message_comm = fit_messages(program, gaps)
    return RuntimeFit(overhead=overhead, comm=comm, step_ms=step_ms, overhead_by_kind=by_kind, gaps=gaps,
                      base_ms=base, send_ms=send, recv_ms=recv, message_comm=message_comm)


def unit_messages(program: Program) -> tuple[np.ndarray, np.ndarray]:
    """``(sends, receives)``: per unit of ``program.graph``, whether its output goes to a unit
    on another device, and whether its input comes from one."""
    _check_program(program)
    g = program.graph
    n = g.n_units
    sends, receives = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    for u in range(n):
        for q, cross in zip(g.unit_preds[u], g.unit_cross[u], strict=True):
            if q < n and cross:
                receives[u] = sends[int(q)] = True
    return sends, receives


def fit_messages(program: Program, gaps: pd.DataFrame) -> tuple[float, float, float, float]:
    """``(base, send, recv, comm)`` ms from :func:`unit_gaps` of a run of ``program``.

    Each gap a device left itself (rows "device" and "inside") is ``base`` + ``send`` when
    the unit it follows sends its output to another device + ``recv`` when the unit it
    precedes receives its input from one (an "inside" gap: ``base`` only), by least squares;
    a term that comes out negative is left out and the rest fitted again. ``comm``: the
    mean lag of the "neighbour" rows less ``base`` and ``send``, at least 0. Simulated, a
    unit costs its ops plus ``base`` per op, plus ``send`` and ``recv`` on its last op
    where it sends or receives. A TraceError when no gap was a device's own."""
    sends, receives = unit_messages(program)
    own = gaps[gaps["bound"].isin(["device", "inside"])]
    if own.empty:
        raise TraceError("no op started right after its own device's previous op: cannot fit the per-op overhead")
    inside = (own["bound"] == "inside").to_numpy()
    after = own["after_unit"].to_numpy().clip(min=0)
    columns = [np.ones(len(own)), np.where(inside, 0.0, sends[after]), np.where(inside, 0.0, receives[own["unit"]])]
    y = own["gap_ms"].to_numpy(float)
    keep, coef = [0, 1, 2], np.zeros(3)
    while keep:
        coef[:] = 0.0
        coef[keep] = np.linalg.lstsq(np.column_stack([columns[k] for k in keep]), y, rcond=None)[0]
        negative = [k for k in keep if coef[k] < 0]
        if not negative:
            break
        terms = [k for k in negative if k != 0]  # drop a message term first, the base last
        keep.remove(min(terms, key=lambda k: coef[k]) if terms else 0)
    else:
        coef[:] = 0.0
    base, send, recv = (float(c) for c in coef)
    lags = gaps.loc[gaps["bound"] == "neighbour", "gap_ms"].to_numpy(float)
    comm = max(float(lags.mean()) - base - send, 0.0) if len(lags) else 0.0
    return base, send, recv, comm
