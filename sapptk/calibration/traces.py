"""Layer times from profiler traces (Chrome trace format): PyTorch, MindSpore, anything else.

Every reader returns :class:`LayerTimes`: one sample per (layer, phase, step, micro-batch)
in ms, and medians with their spread per layer group. Layers are named by the user:
``layers`` is a regex (matching layers form the group ``body``) or a mapping
``{name or regex: group}`` (groups ``head``, ``body``, ``tail`` feed
:func:`~sapptk.calibration.calibrate`; others are reported too). A layer *instance* is the
regex's named group ``layer`` when it has one, else the last ``/``-separated part of the
event name; a trace where nothing matches raises :class:`~sapptk.errors.TraceError`.

* :func:`pytorch_layer_times` — ``torch.profiler`` traces (``export_chrome_trace``). Layer
  spans are ``record_function`` ranges or module events (``user_annotation`` /
  ``python_function``); steps are the ``ProfilerStep#N`` ranges (the first ``skip_steps``
  are skipped); the n-th span of a layer in a step is micro-batch n. Forward time = the
  span. Backward time: autograd's ``evaluate_function`` nodes are matched to the forward
  ops inside the layer's span by their sequence number, and the backward of one layer and
  micro-batch lasts from its first node's start to its last node's end. When the trace has
  shapes (``record_shapes=True``) the backward is split: ``weight`` = the matrix products
  in linear layers' backward nodes (``AddmmBackward0``, ``MmBackward0``) that produce the
  weight's gradient (their output has the weight's shape), ``input`` = the rest.
* :func:`mindspore_layer_times` — MindSpore ``trace_view.json``, as the reference tool reads
  it: layer cells in the ``Scope Layer`` process, inside ``Default`` (forward) or
  ``Gradients`` (backward) scopes; steps start at each occurrence of the first op whose
  name contains ``MatMul-op``; the first two steps are skipped; a layer instance's time in a
  step is summed over its cells and divided by the micro-batches; a value above 10 % of
  its step is dropped as an outlier.
* :func:`chrome_layer_times` — any Chrome trace: every complete event whose name matches is a
  layer pass; its phase comes from ``args.kind`` (F/B/I/W, as sapptk's own traces write it),
  else from ``phases`` ({phase: regex}), else ``backward`` when the name says so.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sapptk import checks
from sapptk.errors import TraceError
from sapptk.formats.chrome_trace import Trace, read_trace

__all__ = ["PHASES", "LayerTimes", "chrome_layer_times", "layer_times", "mindspore_layer_times", "pytorch_layer_times"]

PHASES: tuple[str, ...] = ("forward", "backward", "input", "weight")
_BACKWARD_NODE = "autograd::engine::evaluate_function: "
_LINEAR_BACKWARD = ("AddmmBackward0", "MmBackward0")


@dataclass(frozen=True, eq=False)
class LayerTimes:
    """Layer times read from a trace.

    ``samples``: one row per (group, layer, phase, step, micro_batch) with ``duration_ms``
    (per micro-batch; MindSpore's are step averages, micro_batch missing).
    """

    source: str
    format: str
    samples: pd.DataFrame

    def summary(self) -> pd.DataFrame:
        """Per group and phase: ``median_ms``, ``q25_ms``, ``q75_ms`` (the spread), ``samples``."""
        g = self.samples.groupby(["group", "phase"], observed=True)["duration_ms"]
        out = pd.DataFrame({
            "median_ms": g.median(),
            "q25_ms": g.quantile(0.25),
            "q75_ms": g.quantile(0.75),
            "samples": g.size(),
        }).reset_index()
        return out

    def medians(self) -> dict[str, dict[str, float]]:
        """``{group: {phase: median ms}}``."""
        out: dict[str, dict[str, float]] = {}
        for row in self.summary().itertuples(index=False):
            out.setdefault(str(row.group), {})[str(row.phase)] = float(row.median_ms)
        return out

    def __repr__(self) -> str:
        parts = [f"{g}: " + ", ".join(f"{p} {v:.4g} ms" for p, v in phases.items())
                 for g, phases in self.medians().items()]
        return f"LayerTimes({self.format}, {'; '.join(parts)})"


# ------------------------------------------------------------------------ matching
def _patterns(layers: Any, source: str) -> list[tuple[str, re.Pattern[str], str]]:
    """``(text, compiled, group)`` per entry of a regex or a {name or regex: group} mapping."""
    if isinstance(layers, str):
        layers = {layers: "body"}
    if not isinstance(layers, Mapping) or not layers:
        raise TraceError(f"{source}: layers = {layers!r}: expected a regex or a mapping {{name or regex: group}}")
    out = []
    for text, group in layers.items():
        if not isinstance(text, str) or not isinstance(group, str) or not group:
            raise TraceError(f"{source}: layers entry {text!r}: {group!r}: expected a name or regex and a group name")
        out.append((text, checks.regex(text, f"{source}: layers entry", error=TraceError), group))
    return out


def _match(name: str, patterns: list[tuple[str, re.Pattern[str], str]]) -> tuple[str, str] | None:
    """(group, instance) of an event name, or None."""
    for text, rx, group in patterns:
        m = rx.fullmatch(name) if name == text else rx.search(name)
        if m is None:
            continue
        if "layer" in rx.groupindex and m.group("layer") is not None:
            return group, m.group("layer")
        return group, name.rsplit("/", 1)[-1]
    return None


def _no_match(trace: Trace, patterns, where: str) -> TraceError:
    names = list(dict.fromkeys(trace.events["name"].tolist()))[:8]
    wanted = ", ".join(repr(t) for t, _, _ in patterns)
    return TraceError(f"{trace.source}: no {where} matches the layer names {wanted}: expected at least one; "
                      f"the trace's first event names are {names}")


def _frame(rows: list[tuple], source: str, fmt: str) -> LayerTimes:
    frame = pd.DataFrame(rows, columns=["group", "layer", "phase", "step", "micro_batch", "duration_ms"])
    frame["group"] = pd.Categorical(frame["group"], categories=list(dict.fromkeys(frame["group"])))
    frame["phase"] = pd.Categorical(frame["phase"], categories=list(PHASES))
    frame["step"] = frame["step"].astype(np.int64)
    frame["micro_batch"] = frame["micro_batch"].astype("Int64")
    return LayerTimes(source, fmt, frame)


def _steps(trace: Trace, pattern: str | None) -> list[tuple[float, float]]:
    """Step windows (start, end) in µs from spans whose name matches ``pattern``; one window if none."""
    ev = trace.events
    if pattern is not None:
        rx = checks.regex(pattern, f"{trace.source}: step", error=TraceError)  # Python's regex, not pandas' engine
        spans = ev[[rx.fullmatch(name) is not None for name in ev["name"]]].sort_values("ts")
        if len(spans):
            return list(zip(spans["ts"].to_numpy(), (spans["ts"] + spans["dur"]).to_numpy(), strict=True))
    return [(-np.inf, np.inf)]


def _step_of(ts: float, windows: list[tuple[float, float]]) -> int | None:
    for i, window in enumerate(windows):
        if window is not None and window[0] <= ts <= window[1]:
            return i
    return None


def _skip(windows: list, skip: int, source: str) -> list:
    """The windows with the first ``skip`` replaced by None (step numbers stay those of the trace)."""
    if isinstance(skip, bool) or not isinstance(skip, int) or skip < 0:
        raise TraceError(f"{source}: skip_steps = {skip!r}: expected an integer >= 0")
    if len(windows) <= skip:
        raise TraceError(f"{source}: the trace has {len(windows)} step(s) and skip_steps = {skip}: expected more "
                         "steps than those skipped")
    return [None] * skip + list(windows[skip:])


# ------------------------------------------------------------------------ PyTorch
def _read(path: str | os.PathLike[str] | Trace) -> Trace:
    return path if isinstance(path, Trace) else read_trace(path)


def pytorch_layer_times(path: str | os.PathLike[str] | Trace, layers: Any, *, skip_steps: int = 1) -> LayerTimes:
    """Layer times from a ``torch.profiler`` Chrome trace (see the module docstring)."""
    trace = _read(path)
    patterns = _patterns(layers, trace.source)
    ev = trace.events
    windows = _skip(_steps(trace, r"ProfilerStep#\d+"), skip_steps, trace.source)
    marks = ev[ev["cat"].isin(["user_annotation", "python_function", "gpu_user_annotation"])
               & ~ev["name"].str.startswith("ProfilerStep#")]
    spans = []
    for row in marks.itertuples(index=False):
        hit = _match(row.name, patterns)
        if hit is None:
            continue
        step = _step_of(row.ts, windows)
        if step is not None:
            spans.append((hit[0], hit[1], step, row.pid, row.tid, row.ts, row.ts + row.dur))
    if not spans and marks.empty:
        raise TraceError(f"{trace.source}: the trace has no record_function ranges and no module events, only "
                         "operators: expected one range per layer pass. Wrap each layer's forward in "
                         "torch.profiler.record_function('<layer name>'), or profile with with_stack=True, whose "
                         "'nn.Module: Block_<i>' events match layers=r'nn\\.Module: Block_(?P<layer>\\d+)'")
    if not spans:
        ranges = list(dict.fromkeys(marks["name"].tolist()))[:8]
        raise TraceError(f"{_no_match(trace, patterns, 'record_function or module range in the recorded steps')}; "
                         f"its ranges are {ranges}")
    spans.sort(key=lambda s: s[5])
    counter: dict[tuple, int] = {}
    rows = []
    seq_owner: dict[int, int] = {}  # sequence number -> span index
    weight_shape: dict[int, tuple] = {}
    ops = ev[ev["cat"] == "cpu_op"]
    seqs = np.array([_seq(a) for a in ops["args"]], dtype=float)
    ops = ops.assign(seq=seqs)
    fwd_ops = ops[np.isfinite(seqs) & ~ops["name"].str.startswith(_BACKWARD_NODE)]
    for i, (group, layer, step, pid, tid, start, end) in enumerate(spans):
        key = (group, layer, step)
        mb = counter.get(key, 0)
        counter[key] = mb + 1
        spans[i] = (*spans[i], mb)
        rows.append((group, layer, "forward", step, mb, (end - start) / 1e3))
        inside = fwd_ops[(fwd_ops["pid"] == pid) & (fwd_ops["tid"] == tid) & (fwd_ops["ts"] >= start)
                         & (fwd_ops["ts"] <= end)]
        for op in inside.itertuples(index=False):
            seq = int(op.seq)
            seq_owner[seq] = i
            dims = _dims(op.args)
            if op.name in ("aten::addmm", "aten::mm") and dims is not None and len(dims) >= 2:
                mat1, mat2 = (dims[0], dims[1]) if op.name == "aten::mm" else (dims[1], dims[2])
                if len(mat1) == 2 and len(mat2) == 2:
                    weight_shape[seq] = (tuple(mat1), tuple(mat2))
    nodes = ops[ops["name"].str.startswith(_BACKWARD_NODE) & np.isfinite(ops["seq"])]
    parts: dict[int, list] = {}
    for node in nodes.itertuples(index=False):
        owner = seq_owner.get(int(node.seq))
        if owner is not None:
            parts.setdefault(owner, []).append(node)
    mm = ops[ops["name"] == "aten::mm"]
    split = bool(weight_shape)
    for owner, found in parts.items():
        group, layer, step, pid, tid, *_rest, mb = spans[owner]
        start = min(n.ts for n in found)
        end = max(n.ts + n.dur for n in found)
        total = (end - start) / 1e3
        rows.append((group, layer, "backward", step, mb, total))
        if not split:
            continue
        weight = 0.0
        for n in found:
            kind = n.name[len(_BACKWARD_NODE):]
            shape = weight_shape.get(int(n.seq))
            if kind not in _LINEAR_BACKWARD or shape is None:
                continue
            children = mm[(mm["pid"] == n.pid) & (mm["tid"] == n.tid) & (mm["ts"] >= n.ts)
                          & (mm["ts"] + mm["dur"] <= n.ts + n.dur)]
            mat1, mat2 = shape
            grads = {mat2, mat2[::-1]}  # autograd may produce the weight's gradient transposed
            products = [(c.ts, c.dur, _mm_out(c.args)) for c in children.itertuples(index=False)]
            products = [c for c in products if c[2] in grads]
            clear = [c for c in products if c[2] != mat1]
            if clear:
                weight += sum(c[1] for c in clear) / 1e3
            elif products:  # square: the input's gradient has the weight's shape too; autograd computes it first
                weight += max(products, key=lambda c: c[0])[1] / 1e3
        rows.append((group, layer, "weight", step, mb, weight))
        rows.append((group, layer, "input", step, mb, total - weight))
    return _frame(rows, trace.source, "pytorch")


def _seq(args: Any) -> float:
    if isinstance(args, Mapping):
        value = args.get("Sequence number")
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return np.nan


def _dims(args: Any) -> list[tuple] | None:
    """``Input Dims`` as tuples of integer sizes (None when absent or not shapes: ignored)."""
    dims = args.get("Input Dims") if isinstance(args, Mapping) else None
    if not isinstance(dims, list):
        return None
    shapes = []
    for d in dims:
        if not isinstance(d, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in d):
            return None
        shapes.append(tuple(d))
    return shapes


def _mm_out(args: Any) -> tuple | None:
    dims = _dims(args)
    if dims is not None and len(dims) == 2 and all(len(d) == 2 for d in dims):
        return (dims[0][0], dims[1][1])
    return None


# ----------------------------------------------------------------------- MindSpore
def mindspore_layer_times(path: str | os.PathLike[str] | Trace, layers: Any, *, micro_batches: int,
                          skip_steps: int = 2, outlier_share: float = 0.1) -> LayerTimes:
    """Layer times from a MindSpore ``trace_view.json`` (see the module docstring)."""
    trace = _read(path)
    patterns = _patterns(layers, trace.source)
    micro_batches = checks.integer(micro_batches, f"{trace.source}: micro_batches", error=TraceError, low=1,
                                   high=checks.MAX_INDEX)
    outlier_share = checks.number(outlier_share, f"{trace.source}: outlier_share", error=TraceError, above=0.0,
                                  high=1.0)
    ev = trace.events
    scope = [pid for pid, name in trace.process_names.items() if name == "Scope Layer"]
    scope += ev.loc[ev["name"] == "Scope Layer", "pid"].tolist()
    if not scope:
        raise TraceError(f"{trace.source}: no 'Scope Layer' process: expected a MindSpore trace_view.json")
    pid = scope[0]
    matmul = ev[ev["name"].str.contains("MatMul-op", regex=False)]
    if matmul.empty:
        raise TraceError(f"{trace.source}: no op named like 'MatMul-op': expected one to mark the steps")
    starts = np.sort(ev.loc[ev["name"] == matmul.iloc[0]["name"], "ts"].to_numpy())
    windows = _skip(list(zip(starts[:-1], starts[1:], strict=True)), skip_steps, trace.source)
    cells = ev[ev["pid"] == pid]
    scopes = {}
    for phase, scope_name in (("forward", "Default"), ("backward", "Gradients")):
        spans = cells[cells["name"] == scope_name]
        scopes[phase] = (spans["ts"].to_numpy(), (spans["ts"] + spans["dur"]).to_numpy())
    totals: dict[tuple, float] = {}
    for row in cells.itertuples(index=False):
        if row.name in ("Default", "Gradients"):
            continue
        hit = _match(row.name, patterns)
        if hit is None:
            continue
        step = _step_of(row.ts, windows)
        if step is None:
            continue
        end = row.ts + row.dur
        for phase, (starts, ends) in scopes.items():
            if ((starts <= row.ts) & (ends >= end)).any():
                key = (hit[0], hit[1], phase, step)
                totals[key] = totals.get(key, 0.0) + row.dur
                break
    if not totals:
        raise _no_match(trace, patterns, "cell in a Default or Gradients scope of the Scope Layer process")
    rows = []
    for (group, layer, phase, step), us in totals.items():
        length = windows[step][1] - windows[step][0]
        if us / micro_batches > outlier_share * length:
            continue
        rows.append((group, layer, phase, step, pd.NA, us / 1e3 / micro_batches))
    if not rows:
        raise TraceError(f"{trace.source}: every matching layer takes more than {outlier_share:.0%} of its step: "
                         "expected per-layer cells (check the layer names)")
    return _frame(rows, trace.source, "mindspore")


# ------------------------------------------------------------------------- generic
_KIND_PHASE = {"F": "forward", "B": "backward", "I": "input", "W": "weight"}


def chrome_layer_times(path: str | os.PathLike[str] | Trace, layers: Any, *,
                       phases: Mapping[str, str] | None = None, step: str | None = None,
                       skip_steps: int = 0) -> LayerTimes:
    """Layer times from any Chrome trace with a user mapping (see the module docstring).

    ``phases``: ``{phase: regex}`` over event names, phases among forward, backward, input,
    weight. ``step``: regex of the spans that mark steps (default: one step).
    """
    trace = _read(path)
    patterns = _patterns(layers, trace.source)
    rules = []
    if phases is not None and not isinstance(phases, Mapping):
        checks.fail(TraceError, f"{trace.source}: phases", phases, "a mapping {phase: regex} (or None)")
    for phase, text in (phases or {}).items():
        if phase not in PHASES:
            raise TraceError(f"{trace.source}: phases: unknown phase {phase!r}: expected one of {', '.join(PHASES)}")
        rules.append((phase, checks.regex(text, f"{trace.source}: phases[{phase!r}]", error=TraceError)))
    windows = _skip(_steps(trace, step), skip_steps, trace.source)
    counter: dict[tuple, int] = {}
    rows = []
    for row in trace.events.sort_values("ts", kind="stable").itertuples(index=False):
        hit = _match(row.name, patterns)
        if hit is None:
            continue
        s = _step_of(row.ts, windows)
        if s is None:
            continue
        args = row.args if isinstance(row.args, Mapping) else {}
        kind = args.get("kind")
        phase = _KIND_PHASE.get(kind) if isinstance(kind, str) else None
        if phase is None:
            phase = next((p for p, rx in rules if rx.search(row.name)), None)
        if phase is None:
            phase = "backward" if re.search(r"(?i)backward|\bbwd\b|\bgrad", row.name) else "forward"
        key = (hit[0], hit[1], phase, s)
        mb = args.get("micro_batch")
        if mb is not None and not isinstance(mb, bool) and isinstance(mb, int):
            mb = checks.integer(mb, f"{trace.source}: event {row.name!r}, args.micro_batch", error=TraceError,
                                low=0, high=checks.MAX_INDEX)
        else:
            mb = counter.get(key, 0)
            counter[key] = mb + 1
        rows.append((hit[0], hit[1], phase, s, mb, row.dur / 1e3))
    if not rows:
        raise _no_match(trace, patterns, "event")
    return _frame(rows, trace.source, "chrome")


def layer_times(path: str | os.PathLike[str] | Trace, layers: Any, **options: Any) -> LayerTimes:
    """Layer times from a trace of any kind: MindSpore when it has a ``Scope Layer`` process,
    PyTorch when it has ``ProfilerStep#`` ranges or autograd ops, else the generic reader."""
    trace = _read(path)
    reader = {"mindspore": mindspore_layer_times, "pytorch": pytorch_layer_times, "chrome": chrome_layer_times}
    return reader[_kind(trace)](trace, layers, **options)


def _kind(trace: Trace) -> str:
    names = trace.events["name"]
    if "Scope Layer" in trace.process_names.values() or (names == "Scope Layer").any():
        return "mindspore"
    if names.str.startswith("ProfilerStep#").any() or names.str.startswith(_BACKWARD_NODE).any():
        return "pytorch"
    return "chrome"
