"""How much a plan depends on the numbers it was fed: perturbed profiles, critical paths, robust budgets.

Perturbation model
------------------
A profile is a handful of measured *figures*: per body group its forward time, its backward
time in each recompute mode (the input-gradient and weight-gradient parts separately for
split-backward schedules), its activation MB per mode and its parameter MB, and the head's
and tail's figures. A relative error ``σ`` multiplies a figure by a lognormal factor with
mean 1 and standard deviation ``σ``. Two models, reported side by side:

* ``independent``: every figure gets its own factor (each number was measured on its own);
* ``shared``: one factor for every time figure and one for every memory figure of a run
  (a profile measured on a slower or fuller machine than the one that trains).

A layer's figure is the same for every layer of its group (they were measured once), so the
factor of a figure applies to all of its layers on every device. The constant memory per
device and the communication latency are not perturbed.

Every sample is timed exactly as the simulator would time it (the same dependency graph,
one batched longest-path pass for all samples) and its per-device peaks come from the
program's live points, as in the solver.

Robust budgets
--------------
Under the shared model a device's peak is ``constant + factor · (params + live activations)``,
so "the chance that any device exceeds its budget is at most ``risk``" is exactly "the plan
fits the effective budget ``constant + (budget − constant) / q``", with ``q`` the factor's
``1 − risk`` quantile. Under the independent model a device's figures vary less together
(a sum of independently scaled parts is less spread than the same parts scaled together), so
the same budget is conservative there; the tests check both on fresh samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sapptk import checks
from sapptk.config import MAX_BUDGET_MB
from sapptk.costs import MEMORY_UNIT_MB, TIME_UNIT_MS, layer_coefficients
from sapptk.errors import ConfigError
from sapptk.schedules.ops import B_CODE, F_CODE, I_CODE, W_CODE
from sapptk.schedules.timing import critical_path as walk_back
from sapptk.schedules.timing import longest_path
from sapptk.simulation import WEIGHT_HOLDS, op_durations_batch, unit_durations

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.plan import Plan

__all__ = ["PERTURBATIONS", "Sensitivity", "critical_path", "perturbed_costs", "robust_budget", "sensitivity"]

PERTURBATIONS: tuple[str, ...] = ("independent", "shared")
"""The two error models (see the module docstring)."""

QUANTILES: tuple[float, ...] = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)


def _need_assignment(plan: Plan, what: str) -> None:
    """A plan with a layer assignment (:attr:`Plan.solved`), else a ConfigError saying why ``what`` cannot be had."""
    if not plan.solved:
        raise ConfigError(f"plan from {plan.source!r} has status {plan.status!r} and no layer assignment: "
                          f"cannot compute {what}")


def _relative_error(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ConfigError(f"{name} = {value!r}: expected a relative error >= 0 (0.05 means 5 %)")
    if value > 1:
        raise ConfigError(f"{name} = {value!r}: expected a relative error <= 1 (0.05 means 5 %)")
    return float(value)


def _lognormal_sigma(relative_sd: float) -> float:
    """σ of log(factor) for a lognormal factor with mean 1 and standard deviation ``relative_sd``."""
    return math.sqrt(math.log1p(relative_sd**2))


def _factors(rng: np.random.Generator, relative_sd: float, shape: tuple[int, ...]) -> np.ndarray:
    s = _lognormal_sigma(relative_sd)
    return np.exp(s * rng.standard_normal(shape) - s * s / 2)


@dataclass(frozen=True, eq=False)
class PerturbedCosts:
    """Per-sample, per-virtual-stage costs in ms and MB, arrays of shape (samples, virtual stages)."""

    forward: np.ndarray
    backward: np.ndarray
    weight: np.ndarray
    activation: np.ndarray
    params: np.ndarray


def perturbed_costs(
    plan: Plan, *, time_error: float, memory_error: float, samples: int, perturbation: str, seed: int
) -> PerturbedCosts:
    """Per-virtual-stage costs of ``plan`` under ``samples`` perturbed profiles (see the module docstring)."""
    if perturbation not in PERTURBATIONS:
        raise ConfigError(f"perturbation = {perturbation!r}: expected one of {', '.join(PERTURBATIONS)}")
    coef = layer_coefficients(plan.profile, plan.config)
    counts = np.asarray(plan.counts, dtype=np.float64)  # (G, R, V)
    G, R, V = counts.shape
    rng = np.random.default_rng([seed, PERTURBATIONS.index(perturbation)])
    layers = counts.sum(axis=1)  # (G, V)
    fixed = (coef.fixed_layers > 0).astype(np.float64)  # head/tail figures, one per stage holding them

    def draw(error: float, shape: tuple[int, ...], shared: np.ndarray | None) -> np.ndarray:
        if shared is not None:
            return np.broadcast_to(shared.reshape((samples,) + (1,) * (len(shape) - 1)), shape)
        return _factors(rng, error, shape)

    shared_t = _factors(rng, time_error, (samples,)) if perturbation == "shared" else None
    shared_m = _factors(rng, memory_error, (samples,)) if perturbation == "shared" else None
    t = TIME_UNIT_MS
    mb = MEMORY_UNIT_MB
    f_g = draw(time_error, (samples, G), shared_t) * coef.forward * t
    b_gr = draw(time_error, (samples, G, R), shared_t) * coef.backward * t
    w_g = draw(time_error, (samples, G), shared_t) * coef.weight * t
    a_gr = draw(memory_error, (samples, G, R), shared_m) * coef.activation * mb
    p_g = draw(memory_error, (samples, G), shared_m) * coef.params * mb
    fixed_t = draw(time_error, (samples, V), shared_t) * fixed
    fixed_t_b = draw(time_error, (samples, V), shared_t) * fixed
    fixed_t_w = draw(time_error, (samples, V), shared_t) * fixed
    fixed_m_a = draw(memory_error, (samples, V), shared_m) * fixed
    fixed_m_p = draw(memory_error, (samples, V), shared_m) * fixed
    ones = 1.0 - fixed  # stages without head or tail keep factor 1 on their (zero) fixed figures
    return PerturbedCosts(
        forward=f_g @ layers + (fixed_t + ones) * coef.fixed_forward * t,
        backward=np.einsum("sgr,grv->sv", b_gr, counts) + (fixed_t_b + ones) * coef.fixed_backward * t,
        weight=w_g @ layers + (fixed_t_w + ones) * coef.fixed_weight * t,
        activation=np.einsum("sgr,grv->sv", a_gr, counts) + (fixed_m_a + ones) * coef.fixed_activation * mb,
        params=p_g @ layers + (fixed_m_p + ones) * coef.fixed_params * mb,
    )


_BATCH_OPS = 4_000_000  # op durations held at once (ops x samples), about 32 MB


def _comm_ms(config: PipelineConfig) -> float:
    """The setup's p2p latency in ms, rounded to the integer time unit as the simulator gets it."""
    return round(float(config.comm) / TIME_UNIT_MS) * TIME_UNIT_MS


def _step_times(config: PipelineConfig, costs: PerturbedCosts) -> np.ndarray:
    """Step time in ms of every sample: the simulator's longest path, in batches of samples."""
    program = config.program()
    graph = program.graph
    samples = costs.forward.shape[0]
    per_batch = max(1, _BATCH_OPS // max(1, graph.n_ops))
    out = np.empty(samples)
    for lo in range(0, samples, per_batch):
        hi = min(samples, lo + per_batch)
        ops = op_durations_batch(program, costs.forward[lo:hi], costs.backward[lo:hi], costs.weight[lo:hi])
        end, _ = longest_path(graph, unit_durations(program, ops), _comm_ms(config))
        out[lo:hi] = end.max(axis=0)
    return out


def _peaks(config: PipelineConfig, costs: PerturbedCosts) -> np.ndarray:
    """Peak MB per sample and device, shape (samples, devices), from the program's live points."""
    program = config.program()
    constant = round(float(config.constant_memory) / MEMORY_UNIT_MB) * MEMORY_UNIT_MB
    out = np.empty((costs.activation.shape[0], program.stages))
    for d, rows in enumerate(program.live_points(WEIGHT_HOLDS)):
        stages = list(program.device_stages[d])
        static = costs.params[:, stages].sum(axis=1) + constant
        live = (costs.activation[:, stages] @ rows.T).max(axis=1) if len(rows) else 0.0
        out[:, d] = static + live
    return out


@dataclass(frozen=True, eq=False)
class Sensitivity:
    """What perturbed profiles do to a plan.

    ``step_time``: one row per (perturbation, quantile): ``step_time_ms`` and its ratio to the
    unperturbed step time (``ratio``). ``devices``: one row per (perturbation, device):
    ``peak_mb_median``, ``peak_mb_q99``, ``budget_mb`` and ``p_over_budget`` (the share of
    samples whose peak exceeds the budget; 0 without a budget). ``samples``: one row per
    (perturbation, sample, device) with that sample's ``step_time_ms`` and the device's
    ``peak_mb``. ``p_any_over_budget``: per perturbation, the share of samples where some
    device exceeds its budget.
    """

    step_time: pd.DataFrame
    devices: pd.DataFrame
    samples: pd.DataFrame
    p_any_over_budget: pd.Series
    time_error: float
    memory_error: float
    base_step_ms: float


def sensitivity(
    plan: Plan, *, time_error: float = 0.05, memory_error: float = 0.02, samples: int = 1000, seed: int = 0
) -> Sensitivity:
    """Re-time and re-measure ``plan`` under ``samples`` perturbed profiles per error model."""
    _need_assignment(plan, "its sensitivity")
    time_error = _relative_error("time_error", time_error)
    memory_error = _relative_error("memory_error", memory_error)
    if isinstance(samples, bool) or not isinstance(samples, int) or not 1 <= samples <= 1_000_000:
        raise ConfigError(f"samples = {samples!r}: expected an integer from 1 to 1000000")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed = {seed!r}: expected an integer >= 0")
    budget = plan.config.memory_budget
    cat = pd.CategoricalDtype(list(PERTURBATIONS), ordered=True)
    steps_rows, device_rows, sample_frames, any_over = [], [], [], {}
    for kind in PERTURBATIONS:
        costs = perturbed_costs(plan, time_error=time_error, memory_error=memory_error, samples=samples,
                                perturbation=kind, seed=seed)
        steps = _step_times(plan.config, costs)
        peaks = _peaks(plan.config, costs)
        over = peaks > budget if budget is not None else np.zeros_like(peaks, dtype=bool)
        any_over[kind] = float(over.any(axis=1).mean())
        for q, value in zip(QUANTILES, np.quantile(steps, QUANTILES), strict=True):
            steps_rows.append({"perturbation": kind, "quantile": q, "step_time_ms": float(value)})
        for d in range(peaks.shape[1]):
            device_rows.append({
                "perturbation": kind, "device": d,
                "peak_mb_median": float(np.median(peaks[:, d])), "peak_mb_q99": float(np.quantile(peaks[:, d], 0.99)),
                "budget_mb": np.nan if budget is None else float(budget), "p_over_budget": float(over[:, d].mean()),
            })
        n, p = peaks.shape
        sample_frames.append(pd.DataFrame({
            "perturbation": kind, "sample": np.repeat(np.arange(n), p), "device": np.tile(np.arange(p), n),
            "step_time_ms": np.repeat(steps, p), "peak_mb": peaks.ravel(),
        }))
    base = float(plan.step_time if plan.step_time is not None else plan.simulation.step_time)
    step_frame = pd.DataFrame(steps_rows)
    step_frame["ratio"] = step_frame["step_time_ms"] / base
    frames = [step_frame, pd.DataFrame(device_rows), pd.concat(sample_frames, ignore_index=True)]
    for frame in frames:
        frame["perturbation"] = frame["perturbation"].astype(cat)
    return Sensitivity(
        step_time=frames[0], devices=frames[1], samples=frames[2],
        p_any_over_budget=pd.Series(any_over, name="p_any_over_budget"),
        time_error=time_error, memory_error=memory_error, base_step_ms=base,
    )


_KIND_LABELS = ("F", "B", "W")
# op kind -> the cost kinds (into _KIND_LABELS) its duration adds up: a whole B is backward + weight
_KIND_PARTS = {F_CODE: (0,), B_CODE: (1, 2), I_CODE: (1,), W_CODE: (2,)}


def critical_path(plan: Plan) -> pd.DataFrame:
    """The ops on one critical path of the simulated plan, and the step time's derivatives.

    One row per (virtual stage, cost kind) with ops on the path: ``kind`` is ``F`` (forward),
    ``B`` (the backward op carrying recompute: a whole ``B``, or an ``I`` of a split
    backward) or ``W`` (the weight-gradient op of a split backward); ``ops_on_path`` counts
    them (slices count ``1/splits``), and ``dstep_per_ms`` = how many ms the step time grows
    per ms added to that stage's per-micro-batch cost of that kind — exact while this path
    stays critical, i.e. for small changes when the critical path is unique (``unique``
    says whether it is: no op off this path lies on a path as long).
    """
    _need_assignment(plan, "its critical path")
    config = plan.config
    program = config.program()
    graph = program.graph
    coef = layer_coefficients(plan.profile, config)
    tot = coef.per_stage(np.asarray(plan.counts, dtype=np.int64))
    # exact integer ticks, as the solver times plans
    ops = op_durations_batch(program, tot["forward"][None], tot["backward"][None], tot["weight"][None], in_ticks=True)
    dur = unit_durations(program, ops)[:, 0].astype(np.int64)
    comm = coef.comm * program.splits
    end, columns = longest_path(graph, dur, comm, argmax=True)
    last = int(np.argmax(end))
    units, _ = walk_back(graph, columns, last)
    tail, _ = longest_path(graph, dur, comm, reverse=True)
    through = end + tail - dur  # the longest path through each unit
    critical = np.flatnonzero(through == end[last])
    unique = len(critical) == len(units)
    V = program.num_virtual_stages
    sig = np.zeros((3, V), dtype=np.int64)
    op_units = np.isin(graph.op_unit, units)
    for code, parts in _KIND_PARTS.items():
        sel = op_units & (graph.op_kind == code)
        for part in parts:
            np.add.at(sig[part], graph.op_virtual_stage[sel], 1)
    kinds = _KIND_LABELS if coef.split else _KIND_LABELS[:2]  # without split the W part is inside B
    k = program.splits
    chunk_of = np.asarray(program.chunk_of)
    placement = np.asarray(program.placement)
    rows = [
        {"virtual_stage": vs, "chunk": int(chunk_of[vs]), "device": int(placement[vs]), "kind": kind,
         "ops_on_path": int(sig[ki, vs]) / k, "dstep_per_ms": int(sig[ki, vs]) / k}
        for ki, kind in enumerate(kinds) for vs in range(V) if sig[ki, vs]
    ]
    frame = pd.DataFrame(rows, columns=["virtual_stage", "chunk", "device", "kind", "ops_on_path", "dstep_per_ms"])
    frame["kind"] = pd.Categorical(frame["kind"], categories=list(kinds))
    frame = frame.sort_values(["virtual_stage", "kind"], kind="stable").reset_index(drop=True)
    frame["unique"] = bool(unique)
    return frame


def robust_budget(
    config: PipelineConfig,
    *,
    memory_margin: float | None = None,
    oom_risk: float | None = None,
    memory_error: Any = None,
) -> float | None:
    """The budget a plan must fit so that the real budget holds with the stated safety.

    ``memory_margin``: MB kept free on every device (a number >= 1), or a fraction of the
    budget (a number in [0, 1)). ``oom_risk`` with ``memory_error``: the chance that any
    device exceeds ``config.memory_budget`` under the shared error model is at most
    ``oom_risk``; ``memory_error`` is a relative error (0.02 = 2 %) or a calibration's
    residuals (a pandas Series/DataFrame with ``residual_mb`` and ``observed_mb``, or an
    object with ``.residuals``), whose relative root-mean-square error is used. Both may be
    given (the tighter budget wins). ``None`` when the config has no budget.
    """
    from sapptk.config import PipelineConfig

    if not isinstance(config, PipelineConfig):
        checks.fail(ConfigError, "config", config, "a sapptk PipelineConfig")
    budget = config.memory_budget
    if memory_margin is None and oom_risk is None:
        if memory_error is not None:
            raise ConfigError("memory_error: only used with oom_risk; give oom_risk too")
        return budget
    if budget is None:
        raise ConfigError("memory_margin / oom_risk: the config has no memory_budget to keep safe")
    out = float(budget)
    constant = float(config.constant_memory)
    if memory_margin is not None:
        memory_margin = checks.number(memory_margin, "memory_margin", error=ConfigError, low=0.0, high=MAX_BUDGET_MB)
        margin = memory_margin * budget if memory_margin < 1 else float(memory_margin)
        out = min(out, budget - margin)
    if oom_risk is not None:
        if isinstance(oom_risk, bool) or not isinstance(oom_risk, int | float) or not 0 < oom_risk < 0.5:
            raise ConfigError(f"oom_risk = {oom_risk!r}: expected a probability in (0, 0.5)")
        if memory_error is None:
            raise ConfigError("oom_risk: give memory_error too (a relative error such as 0.02, or residuals)")
        sigma = _relative_error("memory_error", _error_of(memory_error))
        s = _lognormal_sigma(sigma)
        # the 1 - oom_risk quantile as minus the oom_risk one: exact for a tiny risk (1 - 1e-300 == 1.0)
        q = math.exp(-s * NormalDist().inv_cdf(oom_risk) - s * s / 2)
        out = min(out, constant + (budget - constant) / q)
    if out <= constant:
        raise ConfigError(
            f"memory_margin / oom_risk: the safe budget {out:.6g} MB leaves nothing above the constant "
            f"{constant:.6g} MB per device"
        )
    return out


def _error_of(memory_error: Any) -> float:
    """A relative error from a number or from calibration residuals (relative RMS)."""
    if isinstance(memory_error, int | float) and not isinstance(memory_error, bool):
        return checks.number(memory_error, "memory_error", error=ConfigError, low=0.0, high=1.0)
    frame = getattr(memory_error, "residuals", memory_error)
    if isinstance(frame, pd.DataFrame) and {"residual_mb", "observed_mb"} <= set(frame.columns):
        rel = frame["residual_mb"].to_numpy(float) / frame["observed_mb"].to_numpy(float)
        if len(rel) == 0 or not np.isfinite(rel).all():
            raise ConfigError("memory_error: residuals must be finite, with observed_mb != 0")
        return float(np.sqrt(np.mean(rel**2)))
    raise ConfigError(
        f"memory_error = {memory_error!r}: expected a relative error (e.g. 0.02), or calibration residuals "
        "(a DataFrame with residual_mb and observed_mb, or a Calibration)"
    )

