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
* :func:`stage_costs` — the medians per virtual stage as ``simulate``'s ``forward``,
  ``backward`` (``B``, or ``I`` of a split backward) and ``weight`` (``W``);
  ``overhead`` ms are added to every op (``F``, ``B`` or ``I``, and ``W``).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pandas as pd

from sapptk.errors import TraceError

__all__ = ["OP_PATTERN", "WAIT_PATTERN", "op_overhead", "op_samples", "stage_costs"]

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


def stage_costs(ops: pd.DataFrame, num_virtual_stages: int, *, overhead: float = 0.0) -> dict[str, np.ndarray]:
    """Median ``forward``, ``backward`` and ``weight`` ms per virtual stage, ``overhead`` added per op."""
    if not np.isfinite(overhead) or overhead < 0:
        raise TraceError(f"overhead = {overhead!r}: expected a number >= 0 (ms per op)")
    med = ops.groupby(["kind", "virtual_stage"], observed=True)["duration_ms"].median()
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
