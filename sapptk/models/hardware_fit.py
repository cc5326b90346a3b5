"""A hardware card fitted to measured runs: :func:`fit_hardware`; a measured run's figures as
sapptk predicts them: :func:`predict_row`.

**Prediction of a row** (:class:`~sapptk.models.measured.MeasuredRow`): the profile from
:func:`~sapptk.models.estimate_profile` (card, the row's layout with FP8 GEMMs when its dtype
is fp8, the hardware card with the row's overrides, the row's framework preset
(:func:`row_framework`), the memory figure the row measured: allocated or reserved); the
published layout as sapptk's even split of the layers over ``pp`` stages and ``vp`` chunks
with every layer in the row's recompute mode (:func:`sapptk.plan.even_split`), simulated op
by op with the profile's constant (the card's context memory plus the largest transient);
plus the once-per-step data-parallel collectives (gradient reduction, the distributed
optimizer's all-gather) as far as the framework does not hide them: the profile's exposed
time per layer times the layers of the device holding the most. The step time gives
tokens/s per GPU; the simulator's peak device the memory.

**Fit**: bounded least squares over the card's few parameters (``hardware.fittable()``:
name -> (low, high), fields of the card) of the relative residuals ``log(predicted / measured)`` of every fit row's
step time and, for rows that measured it, its peak memory, plus a weak pull to the card's sourced
values (``prior_weight``: few rows and many parameters must not drag a parameter to a bound to
absorb what the model misses). Projected Gauss–Newton with a
finite-difference Jacobian, from the card's values and from a coarse grid (the box's middle
past three parameters), the best kept.
Identifiability is judged from the Jacobian at the card's values (a local derivative: a
parameter behind a roofline's other branch there moves nothing). A parameter no row moves
(no memory measured: ``constant_mb``), or one the rows move only
together with another (collinear columns of the Jacobian), is not identified: it stays at the
card's value and :attr:`FitResult.identified` says so, with why.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
import pandas as pd

from sapptk.errors import ConfigError, SapptkError
from sapptk.models.bundled import card as bundled_card
from sapptk.models.bundled import hardware as bundled_hardware
from sapptk.models.frameworks import Framework, framework
from sapptk.models.layout import DTYPE_BYTES, HARDWARE, Hardware
from sapptk.models.measured import MeasuredRow, measured_row

__all__ = ["FitResult", "RowPrediction", "fittable", "fit_hardware", "pipeline_outputs_mb", "predict_row",
           "predict_rows", "row_framework", "unpaired_a2a_ms"]

_SCHEDULES = {"1f1b": "1f1b", "gpipe": "gpipe", "interleaved": "interleaved", "interleaved-1f1b": "interleaved",
              "zb-h1": "zb-h1", "zb-v": "zb-v", "dualpipe-v": "dualpipe-v"}
_REL_STEP = 1e-3  # finite-difference step, share of each parameter's range
_GRID_PARAMETERS = 3  # free parameters up to which a 5-point-per-parameter grid seeds the fit
_IDENTIFIED_TOL = 1e-6  # a Jacobian column below this share of the largest moves nothing
_COLLINEAR_TOL = 0.02  # a new column whose smallest singular value (unit columns) is below this adds no direction


def fittable(hardware: Hardware) -> dict[str, tuple[float, float]]:
    """The card's fittable parameters and their bounds (``hardware.fittable()``), checked: each
    a field :func:`dataclasses.replace` can set, with finite bounds low < high."""
    found = dict(hardware.fittable())
    names = {f.name for f in fields(hardware)}
    out = {}
    for name, bounds in found.items():
        if name not in names:
            raise ConfigError(f"hardware {hardware.name!r}: fittable parameter {name!r} is not a field of the card")
        low, high = (float(b) for b in bounds)
        if not (math.isfinite(low) and math.isfinite(high) and low < high):
            raise ConfigError(f"hardware {hardware.name!r}: fittable parameter {name!r} bounds {bounds!r}: "
                              "expected finite (low, high) with low < high")
        out[name] = (low, high)
    return out


@dataclass(frozen=True)
class RowPrediction:
    """sapptk's figures for one measured row: ``pipeline_ms`` (the simulated even split),
    ``sync_ms`` (DP gradient all-reduce), ``step_ms`` (their sum), ``tokens_per_s_per_gpu``
    and ``peak_mb`` (the simulator's peak device, constant included: an *allocated* figure)."""

    row: str
    pipeline_ms: float
    sync_ms: float
    step_ms: float
    tokens_per_s_per_gpu: float
    peak_mb: float


def _hardware(base: Hardware | str) -> Hardware:
    hw = bundled_hardware(base) if isinstance(base, str) else base
    if not isinstance(hw, Hardware):
        raise ConfigError(f"hardware = {base!r}: expected a Hardware or a bundled hardware name")
    return hw


def row_framework(row: MeasuredRow) -> Framework:
    """The framework preset a row ran under (``megatron`` when it names none), with what the
    row says it turned on: ``compile`` fuses the elementwise ops (``elementwise_factor`` 1, no
    ``eager_elementwise``),
    ``async_tp`` overlaps the tensor-parallel collectives with the GEMMs, ``deepep`` dispatches
    experts' tokens once per remote node (``moe_dedup_dispatch``), ``a2a_overlap`` hides the
    expert all-to-alls of one micro-batch under another's compute (``moe_a2a_overlap``)."""
    fw = framework(row.framework or "megatron")
    changes: dict[str, Any] = {}
    if row.options.get("compile"):
        changes["elementwise_factor"] = 1.0
        changes["eager_elementwise"] = False
    if row.options.get("async_tp"):
        changes["tp_comm_overlap"] = True
    if fw.name == "torchtitan" and row.pp > 1 and row.sharding == "fsdp":
        changes["fsdp_once_per_step"] = True
    if row.options.get("deepep"):
        changes["moe_dedup_dispatch"] = True
    if row.options.get("a2a_overlap"):
        changes["moe_a2a_overlap"] = True
    return replace(fw, **changes) if changes else fw


def predict_row(row: MeasuredRow | Mapping[str, Any], hardware: Hardware | str | None = None) -> RowPrediction:
    """sapptk's step time, throughput and peak memory for ``row`` (see the module docstring) on
    ``hardware`` (default: the bundled card the row names), the row's ``hardware_overrides``
    applied on top. Raises :class:`~sapptk.errors.ConfigError` naming the row for a schedule
    sapptk does not have or a layout it cannot plan."""
    from sapptk.config import PipelineConfig
    from sapptk.models.estimate import estimate_profile
    from sapptk.plan import even_split

    r = measured_row(row)
    hw = r.hardware(None if hardware is None else _hardware(hardware))
    where = f"measured row {r.id!r}"
    schedule = _SCHEDULES.get(r.schedule.lower())
    if schedule is None:
        raise ConfigError(f"{where}: field 'schedule' = {r.schedule!r}: expected one of {', '.join(_SCHEDULES)}")
    if r.pp == 1 and r.vp == 1:
        schedule = "1f1b"
    # torchtitan's memory conventions: PyTorch's cross entropy on the fp32 upcast, compiled where
    # the row says the loss was compiled; under pipeline parallelism FSDP keeps every layer
    # unsharded (reshard_after_forward=False, gradient sync deferred to the last micro-batch)
    titan = r.framework == "torchtitan"
    loss = ("compiled" if r.options.get("compile_loss") else "eager") if titan else None
    try:
        profile = estimate_profile(bundled_card(r.model), r.parallel(), hw, framework=row_framework(r),
                                   memory=r.memory_kind or "allocated", loss=loss,
                                   fsdp_reshard=not (titan and r.pp > 1))
        config = PipelineConfig(stages=r.pp, micro_batches=r.micro_batches, chunks=r.vp, schedule=schedule,
                                constant_memory=profile.provenance["constant_mb"])
        plan = even_split(profile, config, recompute=r.recompute)
    except SapptkError as exc:
        raise ConfigError(f"{where}: field 'layout' (pp {r.pp}, vp {r.vp}, schedule {schedule}): {exc}") from None
    sim = plan.simulation
    unpaired = unpaired_a2a_ms(profile, np.asarray(plan.counts).sum(axis=1), config)
    # the once-per-step data-parallel collectives' exposed time per layer (estimate_profile's operators),
    # times the layers each device holds; the device with the most decides
    per_layer = profile.provenance.get("dp_step_exposed_ms_per_layer", {})
    layers = np.asarray(plan.counts).sum(axis=1)  # (body groups, virtual stages)
    step = np.array([per_layer.get(g.name, 0.0) for g in profile.body])
    sync = max(float(step @ layers[:, list(st)].sum(axis=1)) for st in config.program().device_stages)
    pipeline = float(sim.step_time) + unpaired
    total = pipeline + sync
    peaks = np.asarray(sim.peak_memory, dtype=float).copy()
    if titan and r.pp > 1:
        peaks[_tail_device(config)] += pipeline_outputs_mb(r, hw)
    return RowPrediction(row=r.id, pipeline_ms=pipeline, sync_ms=sync, step_ms=total,
                         tokens_per_s_per_gpu=r.tokens_per_s_per_gpu_at(total), peak_mb=float(peaks.max()))


def unpaired_a2a_ms(profile: Any, counts: np.ndarray, config: Any) -> float:
    """What the 1F1B all-to-all overlap (``moe_a2a_overlap``) cannot hide: a device's warm-up
    forwards and cool-down backwards have no partner micro-batch, so their expert all-to-alls
    run exposed. The profile's layer times assume every chunk paired; this adds, on the device
    where it is largest, its unpaired chunks × their layers × what pairing hid per layer
    (``time_ms − exposed_ms`` of the ``paired_microbatch`` rows, forward and backward). Warm-up
    chunks of device ``d`` in Megatron's interleaved schedule: ``2·(pp − d − 1) + (vp − 1)·pp``
    (1F1B: ``pp − d − 1``; no pipeline: one), at most ``m·vp``; as many cool-down backwards.
    ``counts``: the plan's layers per body group and virtual stage (its modes summed)."""
    table = profile.provenance.get("operators", {})
    cols = table.get("columns", [])
    if "overlapped_with" not in cols:
        return 0.0
    at = {c: i for i, c in enumerate(cols)}
    hidden: dict[str, float] = {}
    for row in table.get("rows", []):
        if row[at["overlapped_with"]] == "paired_microbatch":
            g = row[at["group"]]
            hidden[g] = hidden.get(g, 0.0) + row[at["time_ms"]] - row[at["exposed_ms"]]
    if not hidden:
        return 0.0
    per_layer = np.array([hidden.get(g.name, 0.0) for g in profile.body])
    pp, vp, m = config.stages, config.chunks, config.micro_batches
    worst = 0.0
    for d, stages in enumerate(config.program().device_stages):
        if pp == 1:
            warm = 1
        elif vp == 1:
            warm = pp - d - 1
        else:
            warm = 2 * (pp - d - 1) + (vp - 1) * pp
        warm = min(warm, m * vp)
        layers = counts[:, list(stages)].sum(axis=1) / vp  # per chunk, each body group
        worst = max(worst, warm * float(per_layer @ layers))
    return worst


def _tail_device(config: Any) -> int:
    """The device that runs the last (virtual) stage."""
    last = config.stages * config.chunks - 1
    return next(d for d, stages in enumerate(config.program().device_stages) if last in stages)


def pipeline_outputs_mb(row: MeasuredRow, hardware: Hardware) -> float:
    """MB the last stage of PyTorch's pipeline schedule (``torch.distributed.pipelining``, which
    torchtitan runs) holds to the end of the step: it keeps every micro-batch's output
    (``PipelineStage.output_chunks``, merged into ``step()``'s return value), and torchtitan's
    last stage outputs the logits in the compute dtype (``self.output(h)``; the loss upcasts
    them; vocabulary split over ``tp``): micro-batches × e·N·V/t bytes, × (1 +
    ``allocator_reserve``) for a reserved figure."""
    tokens = row.micro_batch_size * row.seq_length / row.cp
    e = DTYPE_BYTES[row.parallel().compute_dtype]
    scale = 1.0 + hardware.allocator_reserve if row.memory_kind == "reserved" else 1.0
    return scale * row.micro_batches * e * tokens * bundled_card(row.model).vocab_size / row.tp / 1e6


def predict_rows(rows: Sequence[MeasuredRow | Mapping[str, Any]],
                 hardware: Mapping[str, Hardware] | Hardware | None = None) -> pd.DataFrame:
    """One row per measured run: measured and predicted step time (ms), tokens/s per GPU, peak
    memory (MB, with which figure was measured) and the relative errors ``*_err``
    (predicted / measured − 1). ``hardware``: one card for every row, or cards by the rows'
    ``gpu`` name (a row whose GPU is not there uses the bundled card)."""
    out = []
    for raw in rows:
        r = measured_row(raw)
        hw = hardware.get(r.gpu) if isinstance(hardware, Mapping) else hardware
        p = predict_row(r, hw)
        mem = p.peak_mb if r.memory_mb is not None else math.nan
        out.append({
            "row": r.id, "split": r.split, "stack": r.stack, "model": r.model, "gpu": r.gpu, "gpus": r.gpus,
            "framework": r.framework, "measured_step_ms": r.measured_step_ms, "predicted_step_ms": p.step_ms,
            "sync_ms": p.sync_ms, "measured_tokens_per_s_per_gpu": r.tokens_per_s_per_gpu_at(r.measured_step_ms),
            "predicted_tokens_per_s_per_gpu": p.tokens_per_s_per_gpu,
            "step_err": p.step_ms / r.measured_step_ms - 1.0,
            "measured_memory_mb": math.nan if r.memory_mb is None else r.memory_mb,
            "memory_kind": r.memory_kind, "predicted_memory_mb": mem,
            "memory_err": math.nan if r.memory_mb is None else mem / r.memory_mb - 1.0,
        })
    frame = pd.DataFrame(out)
    for col in ("split", "stack", "model", "gpu", "framework", "memory_kind"):
        frame[col] = frame[col].astype("category")
    return frame


@dataclass(frozen=True)
class FitResult:
    """What :func:`fit_hardware` found. ``hardware``: the fitted card (the parameters the rows
    identify set, the others at the given card's value; ``source`` says how it was fitted).
    ``values``: every fittable parameter's value; ``identified``: name -> True, or the reason it
    is not; ``residuals``: one row per fitted figure (row, figure ``step`` or ``memory``,
    measured, predicted before and after, relative error); ``cost``: half the sum of squared
    log residuals after the fit (``cost_before`` at the card's values); ``provenance``: plain data
    for the record."""

    hardware: Hardware
    values: Mapping[str, float]
    identified: Mapping[str, bool | str]
    residuals: pd.DataFrame
    cost: float
    cost_before: float
    provenance: Mapping[str, Any] = field(default_factory=dict)

    @property
    def unidentified(self) -> dict[str, str]:
        """Parameters left at the card's value, with why."""
        return {k: str(v) for k, v in self.identified.items() if v is not True}


def _check_rows(rows: Any, hw: Hardware) -> list[MeasuredRow]:
    """The rows checked: each a measured row marked ``fit``, on the card being fitted (when that
    card is a bundled one: a custom card may be fitted on any rows)."""
    bundled = hw.name.lower() in HARDWARE
    if isinstance(rows, MeasuredRow | Mapping) or not isinstance(rows, Sequence) or isinstance(rows, str):
        raise ConfigError(f"fit_hardware: rows = {rows!r}: expected a list of measured rows")
    if not rows:
        raise ConfigError("fit_hardware: rows = []: expected at least one measured row")
    out = [measured_row(r, index=i) for i, r in enumerate(rows)]
    for i, r in enumerate(out):
        if r.split != "fit":
            raise ConfigError(f"measured row {r.id!r} (row {i}): field 'split' = {r.split!r}: fit_hardware fits on "
                              "'fit' rows only (held-out rows must never set a parameter)")
        if bundled and bundled_hardware(r.gpu).name != hw.name:
            raise ConfigError(f"measured row {r.id!r} (row {i}): field 'gpu' = {r.gpu!r}: expected the card being "
                              f"fitted, {hw.name!r}")
    return out


def _figures(rows: list[MeasuredRow]) -> list[tuple[int, str, float]]:
    figs = []
    for i, r in enumerate(rows):
        figs.append((i, "step", r.measured_step_ms))
        if r.memory_mb is not None:
            figs.append((i, "memory", r.memory_mb))
    return figs


def _predict_all(rows: list[MeasuredRow], hw: Hardware, figs: list[tuple[int, str, float]]) -> np.ndarray:
    preds = [predict_row(r, hw) for r in rows]
    return np.array([preds[i].step_ms if kind == "step" else preds[i].peak_mb for i, kind, _ in figs])


def fit_hardware(hardware: Hardware | str, rows: Sequence[MeasuredRow | Mapping[str, Any]], *,
                 parameters: Sequence[str] | None = None, prior_weight: float = 0.1,
                 max_iterations: int = 30) -> FitResult:
    """Fit ``hardware``'s parameters (``hardware.fittable()``, or ``parameters``, a subset) to the
    measured ``rows`` (every one ``split: fit``; :func:`~sapptk.models.measured.measured_row`
    checks each). See the module docstring for the model and the identifiability rule.
    ``prior_weight`` keeps the card's sourced values unless the rows say otherwise: moving a
    parameter across its whole range costs as much as a ``prior_weight`` log error in one figure
    (0: plain least squares). Raises :class:`~sapptk.errors.ConfigError` naming the row and
    field for a bad row."""
    if isinstance(prior_weight, bool) or not isinstance(prior_weight, int | float) or not (
            math.isfinite(prior_weight) and prior_weight >= 0):
        raise ConfigError(f"fit_hardware: prior_weight = {prior_weight!r}: expected a number >= 0")
    hw = _hardware(hardware)
    bounds = fittable(hw)
    if parameters is not None:
        unknown = [p for p in parameters if p not in bounds]
        if unknown or not parameters:
            raise ConfigError(f"fit_hardware: parameters = {list(parameters)!r}: expected a non-empty subset of "
                              f"{', '.join(bounds)}")
        bounds = {p: bounds[p] for p in parameters}
    checked = _check_rows(rows, hw)
    figs = _figures(checked)
    measured = np.array([v for _, _, v in figs])
    names = list(bounds)
    low = np.array([bounds[n][0] for n in names])
    high = np.array([bounds[n][1] for n in names])
    span = high - low
    x0 = np.clip(np.array([float(getattr(hw, n)) for n in names]), low, high)

    def card_at(x: np.ndarray) -> Hardware:
        return replace(hw, **{n: float(v) for n, v in zip(names, x, strict=True)})

    def residual(x: np.ndarray) -> np.ndarray:
        return np.log(_predict_all(checked, card_at(x), figs) / measured)

    def jacobian(x: np.ndarray, r0: np.ndarray) -> np.ndarray:
        jac = np.zeros((len(r0), len(x)))
        for j in range(len(x)):
            step = _REL_STEP * span[j]
            xj = x.copy()
            xj[j] = x[j] + step if x[j] + step <= high[j] else x[j] - step
            jac[:, j] = (residual(xj) - r0) / (xj[j] - x[j])
        return jac

    r_before = residual(x0)
    jac0 = jacobian(x0, r_before)
    identified = _identifiability(jac0 * span, names, figs, prior_weight)
    free = [j for j, n in enumerate(names) if identified[n] is True]
    x = x0.copy()
    if free:
        def augmented(x: np.ndarray) -> np.ndarray:
            return np.concatenate([residual(x), prior_weight * (x[free] - x0[free]) / span[free]])

        def augmented_jacobian(x: np.ndarray, r: np.ndarray) -> np.ndarray:
            prior = np.zeros((len(free), len(x)))
            prior[range(len(free)), free] = prior_weight / span[free]
            return np.vstack([jacobian(x, r[:len(measured)]), prior])

        x = _gauss_newton(augmented, augmented_jacobian, x0, low, high, free, max_iterations)
    r_after = residual(x)
    values = {n: float(v) for n, v in zip(names, x, strict=True)}
    fitted = card_at(x)
    summary = ", ".join(f"{n} {values[n]:.4g}" for j, n in enumerate(names) if j in free) or "nothing identified"
    fitted = replace(fitted, source=(hw.source + "; " if hw.source else "") +
                     f"fitted by sapptk.fit_hardware on {len(checked)} measured rows: {summary}")
    before = _predict_all(checked, hw, figs)
    after = np.exp(r_after) * measured
    frame = pd.DataFrame({
        "row": [checked[i].id for i, _, _ in figs], "figure": [k for _, k, _ in figs],
        "unit": ["ms" if k == "step" else "MB" for _, k, _ in figs], "measured": measured,
        "predicted_before": before, "predicted": after, "error": after / measured - 1.0,
    })
    frame["figure"] = frame["figure"].astype("category")
    provenance = {
        "fitted_by": "sapptk.fit_hardware", "card": hw.name, "rows": [r.id for r in checked],
        "sources": sorted({str(r.source.get("ref") or r.source.get("repository") or "") for r in checked}),
        "bounds": {n: list(bounds[n]) for n in names}, "values": values, "prior_weight": float(prior_weight),
        "identified": {n: identified[n] for n in names},
        "cost_before": float(0.5 * r_before @ r_before), "cost": float(0.5 * r_after @ r_after),
    }
    return FitResult(hardware=fitted, values=values, identified=identified, residuals=frame,
                     cost=provenance["cost"], cost_before=provenance["cost_before"], provenance=provenance)


def _identifiability(jac: np.ndarray, names: list[str], figs: list[tuple[int, str, float]],
                     prior_weight: float = 0.0) -> dict[str, bool | str]:
    """Which parameters the rows identify: a column (scaled to the parameter's range) that moves
    no residual is not; taking the columns that move the rows most first, one that adds no new
    direction to those already taken (collinear within :data:`_COLLINEAR_TOL`) is not, nor one
    whose new direction moves the figures less than the prior pulls (``prior_weight``: across its
    whole range it changes the fit figures, beyond what the parameters already taken do, by less
    than that log error), nor one past the number of figures."""
    out: dict[str, bool | str] = {}
    norms = np.linalg.norm(jac, axis=0)
    scale = max(float(norms.max()), 1e-300)
    kinds = sorted({k for _, k, _ in figs})
    kept: list[int] = []
    for j in sorted(range(len(names)), key=lambda k: -norms[k]):  # the parameters that move the rows most first
        n = names[j]
        if norms[j] <= _IDENTIFIED_TOL * scale or norms[j] == 0:
            what = ", ".join(kinds) if "memory" in kinds else "step times only: no row measured peak memory"
            out[n] = f"not identified: no figure of these rows ({what}) moves with it; left at the card's value"
            continue
        trial = jac[:, [*kept, j]] / np.linalg.norm(jac[:, [*kept, j]], axis=0)
        sv = np.linalg.svd(trial, compute_uv=False)
        with_ = ", ".join(names[k] for k in kept)
        if len(kept) + 1 > jac.shape[0]:
            out[n] = (f"not identified: the {jac.shape[0]} figures of these rows are taken by {with_}; left at the "
                      "card's value")
            continue
        if sv[-1] <= _COLLINEAR_TOL * sv[0]:
            out[n] = f"not identified: these rows move it only together with {with_}; left at the card's value"
            continue
        basis = np.linalg.qr(jac[:, kept])[0] if kept else np.zeros((jac.shape[0], 0))
        new = float(np.linalg.norm(jac[:, j] - basis @ (basis.T @ jac[:, j])))
        if new < prior_weight:
            beyond = f" beyond {with_}" if kept else ""
            out[n] = (f"not identified: across its whole range it moves these rows' figures{beyond} by {new:.3f} "
                      f"(log), less than the prior's pull {prior_weight:g}; left at the card's value")
            continue
        kept.append(j)
        out[n] = True
    return {n: out[n] for n in names}


def _gauss_newton(residual: Any, jacobian: Any, x0: np.ndarray, low: np.ndarray, high: np.ndarray,
                  free: list[int], iterations: int) -> np.ndarray:
    """Projected Gauss–Newton with step halving on the ``free`` coordinates, started from
    ``x0`` and from a coarse grid's best point (or the box's middle, past :data:`_GRID_PARAMETERS`
    parameters); the lower cost wins."""
    starts = [x0]
    if len(free) <= _GRID_PARAMETERS:  # a coarse grid's best point as a second start (5 points per parameter)
        grid = [np.linspace(low[j], high[j], 5) for j in free]
        best, best_cost = x0, math.inf
        for point in np.array(np.meshgrid(*grid, indexing="ij")).reshape(len(free), -1).T:
            x = x0.copy()
            x[free] = point
            r = residual(x)
            cost = float(r @ r)
            if cost < best_cost:
                best, best_cost = x, cost
        starts.append(best)
    else:  # too many for a grid: the middle of the box as a second start
        mid = x0.copy()
        mid[free] = (low[free] + high[free]) / 2
        starts.append(mid)
    results = []
    for start in starts:
        x = start.copy()
        r = residual(x)
        cost = float(r @ r)
        for _ in range(iterations):
            jac = jacobian(x, r)[:, free]
            step, *_ = np.linalg.lstsq(jac, -r, rcond=None)
            t, moved = 1.0, False
            while t > 1e-4:
                trial = x.copy()
                trial[free] = np.clip(x[free] + t * step, low[free], high[free])
                rt = residual(trial)
                ct = float(rt @ rt)
                if ct < cost - 1e-12:
                    x, r, cost, moved = trial, rt, ct, True
                    break
                t /= 2
            if not moved or np.all(np.abs(t * step) <= 1e-6 * (high[free] - low[free])):
                break
        results.append((cost, x))
    return min(results, key=lambda c: c[0])[1]
