"""What the trials measured, and the costs fitted from it (:func:`ingest`).

``ingest(DIR)`` reads every trial folder that ``DIR/trials.json`` lists (a listed folder
without its ``manifest.json`` is a :class:`~sapptk.errors.ConfigError`) and every run in it
(``runs/<name>/``). Each run is one row of :attr:`Calibrated.runs`, whatever became of it:

``ok``
    every rank ran; ``measured_ms`` is the median over the profiled steps of the slower
    rank's wall time, ``spread_ms`` their interquartile range (the step-to-step noise).
``oom`` / ``crashed``
    a rank ran out of memory or failed (``reason``: its error): the setup does not run
    there. Kept as a measurement, never dropped.
``no-result``
    a rank wrote nothing (killed, or torchrun never started it; ``reason`` has the exit code).
``bad-trace``
    the ranks ran (``measured_ms`` kept) but a trace is missing, truncated or unreadable.
``foreign``
    a result or trace names another trial's key: it is a run of another setup. Kept, not fitted.

The fit pools every ``ok`` run with a readable trace
(:mod:`sapptk.calibration.runtime_ops`): per op kind (F, B, I, W), ``duration = per_layer_ms
· layers + per_op_ms + first_ms · [first virtual stage]`` by least squares over every op
(through the origin when that gives a negative term; ``first_ms``: the first stage's input
needs no gradient, so its ``I`` is nearly free and its ``B`` about half), the runtime's
per-op ``overhead_ms``, the lag across devices ``comm_ms`` and the step's work outside its
ops ``step_ms`` (means over the runs of each run's
:func:`~sapptk.calibration.runtime_ops.fit_runtime`, weighted by their ops; ``step_ms`` less the
gradient all-reduce), and ``dp_sync_per_layer_ms``: the all-reduce of runs with dp > 1 (the
``sapptk:dp_sync`` range of replica 0's slowest rank) per layer of the fullest device. Only
replica 0's traces (ranks 0 .. p − 1) are fitted. :meth:`Calibrated.predict` simulates
any setup with them.

Nothing under a trial folder is written: the merged traces and the tables go to
``DIR/ingest/`` (``runs.csv``, ``costs.csv``, ``calibration.json``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sapptk.errors import ConfigError, SapptkError

__all__ = ["RUN_STATUSES", "Calibrated", "ingest", "merge_rank_traces"]

RUN_STATUSES: tuple[str, ...] = ("ok", "oom", "crashed", "no-result", "bad-trace", "foreign")
"""Every value of ``Calibrated.runs["status"]``."""
KIND_ORDER = ("F", "B", "I", "W")


def merge_rank_traces(paths: list[Path], out: Path) -> Any:
    """The ranks' ``torch.profiler`` traces as one :class:`~sapptk.formats.chrome_trace.Trace`
    (rank r is process r, one thread), written to ``out``. A missing or truncated trace is a
    :class:`~sapptk.errors.TraceError`."""
    from sapptk.errors import TraceError
    from sapptk.formats.chrome_trace import read_trace

    events = []
    for rank, path in enumerate(paths):
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TraceError(f"{path}: no trace (rank {rank} wrote none)") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise TraceError(f"{path}: not a whole JSON trace (truncated?): {exc}") from None
        raw = data.get("traceEvents") if isinstance(data, dict) else None
        if not isinstance(raw, list):
            raise TraceError(f"{path}: no traceEvents list: expected a torch.profiler chrome trace")
        events += [{**e, "pid": rank, "tid": 0} for e in raw if isinstance(e, dict) and e.get("ph") == "X"]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    return read_trace(out)


@dataclass
class Calibrated:
    """What :func:`ingest` read and fitted.

    ``runs``: one row per run (module docstring), with ``fitted_ms`` (the setup simulated with
    the pooled fit, plus ``step_ms``) and ``fitted_error`` beside ``measured_ms``.
    ``costs``: per op kind, ``per_layer_ms``, ``per_op_ms``, ``ops`` (samples).
    ``overhead_ms``, ``comm_ms``, ``step_ms``: the runtime's terms; ``send_ms``, ``recv_ms``:
    what posting a send after a unit whose output crosses to another device, and a receive
    before one whose input does, adds on the compute thread
    (:func:`~sapptk.calibration.runtime_ops.fit_messages`: ``overhead_ms`` is then the base
    per op and ``comm_ms`` the lag beyond it). ``notes``: what was assumed.
    """

    runs: pd.DataFrame
    costs: pd.DataFrame
    overhead_ms: float
    comm_ms: float
    step_ms: float
    folder: Path
    dp_sync_per_layer_ms: float = float("nan")
    notes: list[str] = field(default_factory=list)
    send_ms: float = 0.0
    recv_ms: float = 0.0

    @classmethod
    def from_fits(cls, samples: list[pd.DataFrame], fits: list[Any], *, step_outside: list[float] | None = None,
                  dp_sync: list[float] | None = None, folder: Path | None = None,
                  runs: pd.DataFrame | None = None, across: str = "mean") -> Calibrated:
        """The pooled fit of several runs: ``samples`` (one :func:`~sapptk.calibration.runtime_ops.op_samples`
        frame per run with a ``layers`` column: the layers of each op's virtual stage) and their
        :class:`~sapptk.calibration.runtime_ops.RuntimeFit`; the runtime's terms are their means
        weighted by the runs' op counts (``step_outside``: each run's step work to use instead of
        its fit's ``step_ms``; ``dp_sync``: all-reduce ms per layer of runs with dp > 1).
        ``across="median"``: each term (and each kind's op costs, fitted per run) is the median
        over the runs instead: a run taken under a burst of load then moves nothing."""
        if across not in ("mean", "median"):
            raise ConfigError(f"across = {across!r}: expected 'mean' or 'median'")
        if not samples or len(samples) != len(fits):
            raise ConfigError(f"{len(samples)} sample frames and {len(fits)} fits: expected one of each per run, "
                              "at least one")
        pooled = pd.concat(samples, ignore_index=True)
        pooled["kind"] = pooled["kind"].astype(str)
        weights = np.asarray([len(x) for x in samples], dtype=float)
        outside = step_outside if step_outside is not None else [f.step_ms for f in fits]
        if across == "median":
            per_run = pd.concat([_fit_kinds(x.assign(kind=x["kind"].astype(str))) for x in samples])
            costs = per_run.groupby("kind", sort=False).agg(per_layer_ms=("per_layer_ms", "median"),
                                                            per_op_ms=("per_op_ms", "median"),
                                                            first_ms=("first_ms", "median"),
                                                            ops=("ops", "sum")).reset_index()
            costs = costs.set_index("kind").loc[[k for k in KIND_ORDER if k in set(costs["kind"])]].reset_index()
            return cls(runs=runs if runs is not None else pd.DataFrame(), costs=costs, folder=folder or Path("."),
                       overhead_ms=float(np.median([f.base_ms for f in fits])),
                       send_ms=float(np.median([f.send_ms for f in fits])),
                       recv_ms=float(np.median([f.recv_ms for f in fits])),
                       comm_ms=float(np.median([f.message_comm for f in fits])), step_ms=float(np.median(outside)),
                       dp_sync_per_layer_ms=float(np.median(dp_sync)) if dp_sync else np.nan)
        return cls(runs=runs if runs is not None else pd.DataFrame(), costs=_fit_kinds(pooled),
                   folder=folder or Path("."),
                   overhead_ms=float(np.average([f.base_ms for f in fits], weights=weights)),
                   send_ms=float(np.average([f.send_ms for f in fits], weights=weights)),
                   recv_ms=float(np.average([f.recv_ms for f in fits], weights=weights)),
                   comm_ms=float(np.average([f.message_comm for f in fits], weights=weights)),
                   step_ms=float(np.average(outside, weights=weights)),
                   dp_sync_per_layer_ms=float(np.mean(dp_sync)) if dp_sync else np.nan)

    def _op_ms(self, kind: str, layers: int, first: bool = False) -> float:
        """One op's ms (at least 0); ``first``: on the first virtual stage (``first_ms``)."""
        c = self.costs.set_index("kind")
        if kind in c.index:
            extra = float(c.at[kind, "first_ms"]) if first and "first_ms" in c.columns else 0.0
            return max(float(c.at[kind, "per_layer_ms"]) * layers + float(c.at[kind, "per_op_ms"]) + extra, 0.0)
        if kind in ("I", "W") and "B" in c.index:  # no split backward trialled: half each
            return 0.5 * self._op_ms("B", layers, first)
        if kind == "B" and {"I", "W"} <= set(c.index):
            return self._op_ms("I", layers, first) + self._op_ms("W", layers, first)
        raise ConfigError(f"no {kind} op was measured in the trials: cannot cost it")

    def predict(self, schedule: str, stages: int, chunks: int, micro_batches: int,
                layers_per_virtual_stage: list[int], *, dp: int = 1) -> float:
        """The step time (ms) of a setup with the fitted costs: simulated, plus ``step_ms``, plus
        with dp > 1 the gradient all-reduce (``dp_sync_per_layer_ms`` per layer of the fullest
        device; a ConfigError when no trial had dp > 1)."""
        from sapptk.calibration.runtime_ops import unit_messages
        from sapptk.schedules import KINDS, build
        from sapptk.simulation import simulate

        program = build(schedule, stages=stages, micro_batches=micro_batches, chunks=chunks)
        layers = list(layers_per_virtual_stage)
        if len(layers) != program.num_virtual_stages:
            raise ConfigError(f"layers_per_virtual_stage has {len(layers)} entries: expected "
                              f"{program.num_virtual_stages} (p · v)")
        shape = (program.num_virtual_stages, program.micro_batches)
        out = {name: np.zeros(shape) for name in ("forward", "backward", "weight")}
        target = {"F": "forward", "B": "backward", "I": "backward", "W": "weight"}
        g = program.graph
        sends, receives = unit_messages(program)
        for u in range(g.n_units):
            last = int(g.unit_op_ptr[u + 1]) - 1
            for i in range(int(g.unit_op_ptr[u]), last + 1):
                kind, vs = KINDS[g.op_kind[i]], int(g.op_virtual_stage[i])
                messages = self.send_ms * sends[u] + self.recv_ms * receives[u] if i == last else 0.0
                out[target[kind]][vs, int(g.op_micro_batch[i])] = (self._op_ms(kind, layers[vs], vs == 0)
                                                                   + self.overhead_ms + messages)
        step = float(simulate(program, **out, comm=self.comm_ms).step_time) + self.step_ms
        if dp > 1:
            if not np.isfinite(self.dp_sync_per_layer_ms):
                raise ConfigError(f"dp = {dp}: no trial ran with dp > 1, so the gradient all-reduce was not measured")
            step += self.dp_sync_per_layer_ms * _device_layers(
                {"placement": [int(d) for d in program.placement], "layers_per_virtual_stage": layers})
        return step

    def summary(self) -> str:
        """A few lines: the runs by status, the fit, the error of each fitted run."""
        counts = self.runs["status"].value_counts()
        lines = [f"{len(self.runs)} runs: " + ", ".join(f"{int(counts.get(s, 0))} {s}" for s in RUN_STATUSES
                                                         if counts.get(s, 0)),
                 "per layer: " + ", ".join(f"{r.kind} {r.per_layer_ms:.3f} ms (+{r.per_op_ms:.3f} per op"
                                           + (f", {r.first_ms:+.3f} on the first stage)" if r.first_ms else ")")
                                           for r in self.costs.itertuples()),
                 f"runtime: overhead {self.overhead_ms:.3f} ms per op (+{self.send_ms:.3f} per send, "
                 f"+{self.recv_ms:.3f} per receive), comm {self.comm_ms:.3f} ms, "
                 f"step outside ops {self.step_ms:.2f} ms"]
        for r in self.runs.itertuples():
            if np.isfinite(r.fitted_ms) and np.isfinite(r.measured_ms):
                lines.append(f"  {r.trial}: measured {r.measured_ms:.1f} ms (spread {r.spread_ms:.1f}), fitted "
                             f"{r.fitted_ms:.1f} ms ({r.fitted_error:+.1%})")
            else:
                lines.append(f"  {r.trial}: {r.status}{': ' + r.reason if r.reason else ''}")
        return "\n".join(lines + self.notes)


def _load_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no {what}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: {what} is not valid JSON: {exc}") from None


_MANIFEST_SETUP = ("schedule", "stages", "chunks", "micro_batches", "dp", "placement", "layers_per_virtual_stage")


def _said(run: Any) -> str:
    return f"{run.trial}: {run.status}" + (f" ({run.reason})" if run.reason else "")


def _check_manifest(manifest: Any, path: Path) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != "sapptk-trial/1":
        raise ConfigError(f"{path}: not a sapptk trial manifest (expected format 'sapptk-trial/1')")
    missing = [k for k in ("key", "rank", "setup", "predicted_pipeline_ms") if k not in manifest]
    missing += [f"setup.{k}" for k in _MANIFEST_SETUP if k not in (manifest.get("setup") or {})]
    if missing:
        raise ConfigError(f"{path}: the manifest lacks {', '.join(missing)}")


def _read_run(run: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The run's row without the fit: status, measured step, peaks, reason."""
    stages, key = int(manifest["setup"]["stages"]) * int(manifest["setup"]["dp"]), manifest["key"]
    row: dict[str, Any] = {"run": run.name, "status": "ok", "reason": None, "measured_ms": np.nan,
                           "spread_ms": np.nan, "unprofiled_ms": np.nan, "peak_rss_mb": np.nan,
                           "peak_allocated_mb": np.nan, "peak_reserved_mb": np.nan}
    code = (run / "exit_code").read_text(encoding="utf-8").strip() if (run / "exit_code").exists() else "unknown"
    ranks = []
    for r in range(stages):
        path = run / f"rank{r}.json"
        if not path.exists():
            row.update(status="no-result", reason=f"rank {r} wrote no rank{r}.json (exit code {code}: killed, out of "
                                                  "host memory, or never started)")
            return row
        try:
            ranks.append(json.loads(path.read_text(encoding="utf-8")))
        except ValueError as exc:
            row.update(status="no-result", reason=f"{path.name} is not whole JSON: {exc}")
            return row
    for name in ("peak_rss_mb", "peak_allocated_mb", "peak_reserved_mb"):
        values = [float(r[name]) for r in ranks if isinstance(r.get(name), int | float)]
        row[name] = max(values) if values else np.nan
    other = [r.get("trial") for r in ranks if r.get("trial") != key]
    if other:
        row.update(status="foreign", reason=f"results name trial {other[0]!r}, this folder is trial {key!r}")
        return row
    bad = [r for r in ranks if r.get("status") != "ok"]
    if bad:
        status = "oom" if any(r.get("status") == "oom" for r in bad) else "crashed"
        first = next(r for r in bad if r.get("status") == status)
        row.update(status=status, reason=f"rank {first.get('rank')}: {first.get('error', '?')}")
        return row
    wall = np.asarray(ranks[0]["wall_ms"], dtype=float)
    row.update(measured_ms=float(np.median(wall)), spread_ms=float(np.subtract(*np.percentile(wall, [75, 25]))),
               unprofiled_ms=float(np.median(ranks[0].get("unprofiled_ms") or [np.nan])))
    return row


def _check_marker(trace: Any, key: str, source: str) -> str | None:
    names = trace.events["name"]
    markers = sorted(set(names[names.str.startswith("sapptk:trial:")]))
    if not markers:
        return f"{source}: no sapptk:trial:<key> range: not a trace of sapptk's trial runner"
    if markers != [f"sapptk:trial:{key}"]:
        return f"{source}: a trace of trial {markers[0].split(':')[-1]!r}, this folder is trial {key!r}"
    return None


def _device_layers(setup: dict[str, Any]) -> int:
    """The layers of the fullest device."""
    per = np.zeros(max(setup["placement"]) + 1)
    np.add.at(per, np.asarray(setup["placement"]), np.asarray(setup["layers_per_virtual_stage"]))
    return int(per.max())


def _dp_sync_ms(trace: Any) -> float:
    """The gradient all-reduce per step: the mean range per device, the slowest device's (0 without one)."""
    ev = trace.events
    own = ev[ev["name"] == "sapptk:dp_sync"]
    return float(own.groupby("pid")["dur"].mean().max() / 1e3) if len(own) else 0.0


def _fit_kinds(samples: pd.DataFrame) -> pd.DataFrame:
    """Per kind, ``duration = per_layer_ms · layers + per_op_ms + first_ms · [virtual stage 0]``
    by least squares: ``per_op_ms`` only where the layer counts vary (else through the origin,
    as when it comes out negative), ``first_ms`` only where both the first virtual stage and
    others were measured (0 else). The first stage's input is the data, which needs no
    gradient: its input-gradient op (``I``) does next to nothing and its whole backward
    (``B``) is the weights' half only, so pooling it with the other stages would cost every
    stage's backward at the mean of the two."""
    rows = []
    for kind in KIND_ORDER:
        own = samples[samples["kind"] == kind]
        if own.empty:
            continue
        x, y = own["layers"].to_numpy(float), own["duration_ms"].to_numpy(float)
        first = (own["virtual_stage"].to_numpy() == 0).astype(float)
        with_first = 0 < first.sum() < len(first)
        a, b, c = np.nan, np.nan, 0.0
        if len(np.unique(x)) > 1:
            cols = [x, np.ones_like(x)] + ([first] if with_first else [])
            a, b, *rest = np.linalg.lstsq(np.column_stack(cols), y, rcond=None)[0]
            c = rest[0] if rest else 0.0
        if not (np.isfinite(a) and a > 0 and b >= 0):
            b = 0.0
            cols = [x] + ([first] if with_first else [])
            a, *rest = np.linalg.lstsq(np.column_stack(cols), y, rcond=None)[0]
            c = rest[0] if rest else 0.0
            if not (np.isfinite(a) and a > 0):
                a, c = float(y.sum() / x.sum()), 0.0
        rows.append({"kind": kind, "per_layer_ms": float(a), "per_op_ms": float(b), "first_ms": float(c),
                     "ops": len(own)})
    return pd.DataFrame(rows, columns=["kind", "per_layer_ms", "per_op_ms", "first_ms", "ops"])


def ingest(folder: str | os.PathLike[str]) -> Calibrated:
    """Read the trials of ``folder`` (written by :func:`~sapptk.trials.plan` and run), fit the
    costs, write ``folder/ingest/`` (module docstring). A ConfigError names a folder without
    ``trials.json``, a listed trial without its manifest, or trials with no usable run to fit."""
    from sapptk.calibration.runtime_ops import fit_runtime, op_samples
    from sapptk.schedules import build

    if not isinstance(folder, str | os.PathLike):
        raise ConfigError(f"folder = {folder!r}: expected the trials folder sapptk.trials.plan wrote")
    root = Path(folder)
    index = _load_json(root / "trials.json", "trials.json (the index sapptk.trials.plan writes)")
    work = root / "ingest"
    rows, samples, fits, syncs, step_outside = [], [], [], [], []
    for entry in index.get("trials", []):
        if not entry.get("folder"):
            continue
        trial_dir = root / entry["folder"]
        manifest = _load_json(trial_dir / "manifest.json", f"manifest of trial {entry['folder']!r}")
        _check_manifest(manifest, trial_dir / "manifest.json")
        setup = manifest["setup"]
        base = {"trial": entry["folder"], "key": manifest["key"], "rank": manifest["rank"],
                **{k: setup[k] for k in ("schedule", "stages", "chunks", "micro_batches", "dp")},
                "predicted_before_ms": float(manifest["predicted_pipeline_ms"])}
        runs = sorted(p for p in (trial_dir / "runs").glob("*") if p.is_dir()) if (trial_dir / "runs").is_dir() else []
        if not runs:
            rows.append({**base, "run": None, "status": "no-result", "reason": "not run yet (no runs/ folder)"})
            continue
        for run in runs:
            row = {**base, **_read_run(run, manifest)}
            rows.append(row)
            if row["status"] != "ok":
                continue
            try:
                trace = merge_rank_traces([run / f"trace_rank{r}.json" for r in range(setup["stages"])],  # replica 0
                                          work / entry["folder"] / f"{run.name}_merged.json")
                problem = _check_marker(trace, manifest["key"], str(run))
                if problem:
                    row.update(status="foreign" if "a trace of trial" in problem else "bad-trace", reason=problem)
                    continue
                program = build(setup["schedule"], stages=setup["stages"], micro_batches=setup["micro_batches"],
                                chunks=setup["chunks"])
                ops = op_samples(trace)
                fit = fit_runtime(program, ops, trace)
                sync = _dp_sync_ms(trace)
            except SapptkError as exc:
                row.update(status="bad-trace", reason=str(exc))
                continue
            layers = np.asarray(setup["layers_per_virtual_stage"])
            ops = ops.assign(layers=layers[ops["virtual_stage"].to_numpy()], trial=entry["folder"])
            samples.append(ops)
            fits.append((fit, len(ops)))
            if setup["dp"] > 1:
                syncs.append(sync / _device_layers(setup))
            step_outside.append(max(fit.step_ms - sync, 0.0))
    if not rows:
        raise ConfigError(f"{root / 'trials.json'}: lists no trial folder")
    frame = pd.DataFrame(rows)
    if not samples:
        raise ConfigError(f"{root}: no run of any trial is ok with a readable trace: nothing to fit "
                          f"({'; '.join(_said(r) for r in frame.itertuples())})")
    calibrated = Calibrated.from_fits(samples, [f for f, _ in fits], step_outside=step_outside, dp_sync=syncs,
                                      folder=root)
    fitted = []
    for r in frame.itertuples():
        ok = r.status == "ok"
        layers = None
        if ok:
            layers = _load_json(root / r.trial / "manifest.json", "manifest")["setup"]["layers_per_virtual_stage"]
        fitted.append(calibrated.predict(r.schedule, r.stages, r.chunks, r.micro_batches, layers, dp=r.dp)
                      if ok else np.nan)
    frame["fitted_ms"] = fitted
    frame["fitted_error"] = (frame["fitted_ms"] - frame["measured_ms"]) / frame["measured_ms"]
    frame["status"] = pd.Categorical(frame["status"], categories=RUN_STATUSES)
    frame["reason"] = frame["reason"].astype(object).where(frame["reason"].notna(), None)
    calibrated.runs = frame
    work.mkdir(parents=True, exist_ok=True)
    frame.to_csv(work / "runs.csv", index=False)
    calibrated.costs.to_csv(work / "costs.csv", index=False)
    (work / "calibration.json").write_text(json.dumps(
        {"overhead_ms": calibrated.overhead_ms, "send_ms": calibrated.send_ms, "recv_ms": calibrated.recv_ms,
         "comm_ms": calibrated.comm_ms, "step_ms": calibrated.step_ms,
         "dp_sync_per_layer_ms": None if np.isnan(calibrated.dp_sync_per_layer_ms) else calibrated.dp_sync_per_layer_ms,
         "costs": calibrated.costs.to_dict("records")}, indent=1), encoding="utf-8")
    return calibrated
