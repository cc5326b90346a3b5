"""A :class:`Plan`: a layer assignment with its provenance and its DataFrame views.

A plan holds ``counts``, an int array ``(body groups, len(MODES), virtual stages)``: how
many layers of each body group run in each recompute mode on each virtual stage (the head
sits on virtual stage 0, the tail on the last one). Plans come from the balancer
(:func:`sapptk.balancer.balance`, through :func:`make_plan`), from a naive baseline
(:func:`even_split`, the plan of :func:`sapptk.baselines.even_counts`) or from a file
(:func:`load_plan`: a sapptk plan file, MindFormers lists, Megatron-LM arguments, torchtitan
settings). A plan's simulation is :attr:`Plan.simulation` (computed once) or
:meth:`Plan.simulate` with other options, both :func:`sapptk.simulate` on the plan's own costs.
Exporters and readers live in :mod:`sapptk.formats`, one module per format; here are only the
two entry points, :meth:`Plan.export` and :func:`load_plan`. (Over 500 lines: the Plan class,
its frames and those entry points are one public surface.)
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from sapptk import baselines
from sapptk.assignment import SOLVED_STATUSES, Assignment
from sapptk.costs import (
    AlternativeLayout,
    StageCosts,
    check_alternative,
    check_counts,
    check_offload,
    counts_array,
    fits_budget,
    micro_batch_costs,
    simulate_counts,
    stage_costs,
    whole_layers,
    within_budget,
)
from sapptk.errors import ConfigError, SapptkError
from sapptk.formats import plan_file, registry
from sapptk.formats.base import refuse_lever
from sapptk.profile import MODES
from sapptk.sensitivity import Sensitivity, critical_path, sensitivity
from sapptk.seq import is_sliced

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.formats.base import Export
    from sapptk.profile import Profile
    from sapptk.simulation import Simulation

__all__ = ["PLAN_STATUSES", "Plan", "even_split", "load_plan", "load_plans", "make_plan"]

PLAN_STATUSES: tuple[str, ...] = ("optimal", "feasible", "infeasible", "unknown", "given")
"""``optimal``/``feasible``: solver results; ``infeasible``/``unknown``: no assignment
(proved impossible / none found in time); ``given``: fixed by the user or a baseline."""

_SOLVED = SOLVED_STATUSES


@dataclass(frozen=True, eq=False)
class Plan(Assignment):
    """A layer assignment for one profile and pipeline setup: an
    :class:`~sapptk.assignment.Assignment` (the fields the solver's phases hand on) with its
    profile and solve time, and its frames, simulation and exports. Made by :func:`make_plan`.

    Attributes
    ----------
    profile, config: what the plan is for.
    counts: read-only int array (body groups, len(MODES), virtual stages); all zeros when
        the status is ``infeasible`` or ``unknown``.
    status: one of :data:`PLAN_STATUSES`.
    step_time: ms per step: the solver's prediction, or the simulated time of a given plan.
    bound: the solver's best lower bound on the step time (ms), if any.
    gap: relative gap ``(step_time − bound) / step_time``, if known.
    solve_seconds: wall time spent solving.
    message: free text from whoever made the plan (solver notes, warnings).
    source: ``"balance"``, ``"even_split(none)"``, ``"mindformers:<name>"``, ...
    offload: read-only int array (body groups, virtual stages): how many of the mode-``"none"``
        layers there send their activations to host memory (``docs/offload.md``), or None.
    alternative: recompute per micro-batch (:class:`~sapptk.costs.AlternativeLayout`): a second
        layout with the same layers and other recompute modes, and the (virtual stage,
        micro-batch) cells that run it; None (the default): every micro-batch runs ``counts``.
    """

    profile: Profile = field(kw_only=True)
    solve_seconds: float = 0.0

    # ------------------------------------------------------------------ basics
    def _need_solution(self, what: str) -> None:
        if not self.solved:
            raise ConfigError(f"plan from {self.source!r} has status {self.status!r} and no layer assignment: "
                              f"cannot compute {what}")

    def __repr__(self) -> str:
        c = self.config
        step = "None" if self.step_time is None else f"{self.step_time:.6g} ms"
        per_mb = ", per micro-batch" if self.alternative is not None else ""
        return (
            f"Plan({self.source!r}, status={self.status!r}, step_time={step}, profile={self.profile.name!r}, "
            f"schedule={c.schedule!r}, p={c.stages}, v={c.chunks}, m={c.micro_batches}{per_mb})"
        )

    def _per_stage_only(self, what: str) -> None:
        """Refuse ``what`` for a plan that recomputes per micro-batch (it would silently drop the choice)."""
        refuse_lever(self, "per_micro_batch", what)

    def _not_sliced(self, what: str) -> None:
        """Refuse an analysis that re-times per-stage costs for a plan with causal slice costs and K/V."""
        if is_sliced(self.profile, self.config):
            raise ConfigError(f"{what}: not modelled for the sequence slices of a long-context profile (seq_length = "
                              f"{self.profile.seq_length}): it re-times per-stage costs with equal, linear slices; "
                              "simulate the plan (plan.simulation) for its causal slice costs and K/V")

    def per_stage_plan(self) -> Plan:
        """The plan without its per-micro-batch choice: every micro-batch runs ``counts`` (simulated
        anew; it may be slower than this plan, or exceed the budget where the choice made room)."""
        self._need_solution("a per-stage plan")
        if self.alternative is None:
            return self
        return make_plan(self.profile, self.config, self.counts, status="given", message=self.message,
                         source=f"{self.source} (per-stage part)")

    # ------------------------------------------------------------------- costs
    @cached_property
    def costs(self) -> StageCosts:
        """Per-virtual-stage costs of the assignment (:func:`sapptk.costs.stage_costs`)."""
        self._need_solution("costs")
        if self.alternative is not None:
            return micro_batch_costs(self.profile, self.config, self.counts, self.alternative)
        return stage_costs(self.profile, self.config, self.counts)

    def simulate(self, **options: Any) -> Simulation:
        """The plan simulated anew with other options for :func:`sapptk.simulate` (``weight_holds``,
        ``overlap``, ``memory_budget``, ``comm``, ``constant``); :attr:`simulation` is the run with
        the defaults, computed once. The costs are the plan's own: its layout's, per micro-batch
        with an alternative layout, per slice on a sliced setup, with a copy stream per device when
        it offloads (:func:`sapptk.costs.simulate_counts`)."""
        self._need_solution("a simulation")
        return simulate_counts(self.profile, self.config, self.counts, self.alternative, offload=self.offload,
                               **options)

    def _no_offload(self, what: str) -> None:
        refuse_lever(self, "offload", what)

    @cached_property
    def simulation(self) -> Simulation:
        """The simulation with default options, computed once (an
        :class:`~sapptk.simulation.OffloadSimulation` for a plan that offloads)."""
        return self.simulate()

    @property
    def fits(self) -> bool:
        """Whether every device's simulated peak memory is within the budget (always, without a budget)."""
        if not self.solved:
            return False
        return fits_budget(self.simulation.peak_memory.to_numpy(), self.config.memory_budget)

    # ------------------------------------------------------------ robustness
    def sensitivity(
        self, time_error: float = 0.05, memory_error: float = 0.02, samples: int = 1000, seed: int = 0
    ) -> Sensitivity:
        """The plan under ``samples`` perturbed profiles, per error model (independent and shared):
        step-time quantiles and each device's chance of exceeding the budget
        (:func:`sapptk.sensitivity.sensitivity`). Not for plans that recompute per micro-batch."""
        self._no_offload("sensitivity (it re-times the plan without a copy stream)")
        self._per_stage_only("sensitivity")
        self._not_sliced("sensitivity")
        return sensitivity(self, time_error=time_error, memory_error=memory_error, samples=samples, seed=seed)

    def critical(self) -> pd.DataFrame:
        """The (virtual stage, op kind) pairs on the critical path and how many ms the step time
        grows per ms of each (:func:`sapptk.sensitivity.critical_path`). Not for plans that recompute
        per micro-batch."""
        self._no_offload("critical (the critical path without a copy stream)")
        self._per_stage_only("critical")
        self._not_sliced("critical")
        return critical_path(self)

    # ------------------------------------------------------------------ frames
    @cached_property
    def layout(self) -> pd.DataFrame:
        """Tidy layout: one row per (group, chunk, stage, mode) holding layers, in model order.

        Columns: ``group`` (categorical, body groups in model order), ``chunk``, ``stage``
        (position of the virtual stage in its chunk's pass, ``virtual_stage − chunk·p``),
        ``device`` (where it runs; equal to ``stage`` except on V-shaped placements),
        ``virtual_stage``, ``mode`` (ordered categorical, :data:`MODES` order), ``layers``;
        for a plan with offload also ``offloaded`` (layers of the row whose activations go to
        host memory: only mode ``"none"`` rows have any). A plan that recomputes per
        micro-batch has two more: ``variant`` (categorical ``base``/``alternative``: which
        layout the row belongs to) and ``micro_batches`` (how many micro-batches of the virtual
        stage run it); layouts run by no micro-batch are left out.
        """
        program = self.config.program()
        p = self.config.stages
        chunk_of = np.asarray(program.chunk_of, dtype=np.int64)
        placement = np.asarray(program.placement, dtype=np.int64)
        names = [grp.name for grp in self.profile.body]

        def rows(counts: np.ndarray) -> pd.DataFrame:
            g, r, vs = np.nonzero(counts)
            order = np.lexsort((r, g, vs))
            g, r, vs = g[order], r[order], vs[order]
            frame = pd.DataFrame(
                {
                    "group": pd.Categorical.from_codes(g, dtype=pd.CategoricalDtype(names, ordered=True)),
                    "chunk": chunk_of[vs],
                    "stage": vs - chunk_of[vs] * p,
                    "device": placement[vs],
                    "virtual_stage": vs.astype(np.int64),
                    "mode": pd.Categorical.from_codes(r, dtype=pd.CategoricalDtype(list(MODES), ordered=True)),
                    "layers": counts[g, r, vs].astype(np.int64),
                }
            )
            if self.offload is not None:
                frame["offloaded"] = np.where(r == MODES.index("none"), self.offload[g, vs], 0).astype(np.int64)
            return frame

        if self.alternative is None:
            return rows(self.counts)
        on_alt = self.alternative.micro_batches()
        parts = []
        for variant, counts, runs in (("base", self.counts, self.config.micro_batches - on_alt),
                                      ("alternative", self.alternative.counts, on_alt)):
            frame = rows(counts)
            frame["variant"] = variant
            frame["micro_batches"] = runs[frame["virtual_stage"].to_numpy()]
            parts.append(frame[frame["micro_batches"] > 0])
        out = pd.concat(parts, ignore_index=True)
        out["variant"] = pd.Categorical(out["variant"], categories=["base", "alternative"])
        return out.sort_values(["virtual_stage", "variant", "group", "mode"], kind="stable",
                               ignore_index=True)

    @cached_property
    def micro_batch_layout(self) -> pd.DataFrame:
        """One row per (virtual stage, micro-batch): which layout it runs and what that costs.

        Columns: ``virtual_stage``, ``chunk``, ``stage``, ``device``, ``micro_batch``,
        ``variant`` (categorical ``base``/``alternative``), ``backward_ms`` (input- and
        weight-gradient work, recompute included), ``recompute_ms`` (backward above no
        recompute), ``activation_mb`` (kept from the forward to the backward). Every row is
        ``base`` for a plan without an alternative layout.
        """
        self._need_solution("a per-micro-batch layout")
        program = self.config.program()
        nvs, m, p = self.config.num_virtual_stages, self.config.micro_batches, self.config.stages
        chunk_of = np.asarray(program.chunk_of, dtype=np.int64)
        vs = np.repeat(np.arange(nvs, dtype=np.int64), m)
        mask = np.zeros((nvs, m), dtype=bool) if self.alternative is None else self.alternative.mask
        costs = self.costs

        def cells(values: np.ndarray) -> np.ndarray:
            arr = np.asarray(values, dtype=float)
            return (arr if arr.ndim == 2 else np.repeat(arr[:, None], m, axis=1)).ravel()

        return pd.DataFrame(
            {
                "virtual_stage": vs,
                "chunk": chunk_of[vs],
                "stage": vs - chunk_of[vs] * p,
                "device": np.asarray(program.placement, dtype=np.int64)[vs],
                "micro_batch": np.tile(np.arange(m, dtype=np.int64), nvs),
                "variant": pd.Categorical.from_codes(mask.ravel().astype(np.int8),
                                                     categories=["base", "alternative"]),
                "backward_ms": cells(costs.backward) + cells(costs.weight),
                "recompute_ms": cells(costs.recompute_overhead),
                "activation_mb": cells(costs.activation),
            }
        )

    @property
    def stages(self) -> pd.DataFrame:
        """Renamed :attr:`devices` (``config.stages`` is the stage count); raises AttributeError."""
        raise AttributeError("Plan.stages was renamed Plan.devices (one row per device); "
                             "the number of stages is plan.config.stages")

    @cached_property
    def devices(self) -> pd.DataFrame:
        """One row per device, times per micro-batch summed over the device's chunks.

        Columns: ``device``, ``layers`` (body layers), ``params_mb`` (static memory incl.
        head/tail), ``peak_mb`` (simulated, incl. the constant), ``budget_mb`` (NaN without
        a budget), ``fits``, ``forward_ms``, ``backward_ms`` (input- and weight-gradient
        work, recompute included), ``recompute_ms`` (backward time above no recompute). For a
        plan that recomputes per micro-batch the last two are means over the micro-batches.
        """
        self._need_solution("per-device figures")
        costs = self.costs
        placement = np.asarray(self.config.program().placement)
        p = self.config.stages

        def per_device(values: np.ndarray) -> np.ndarray:
            arr = np.asarray(values, dtype=float)
            if arr.ndim == 2:  # per (virtual stage, micro-batch): the mean micro-batch
                arr = arr.mean(axis=1)
            return np.bincount(placement, weights=arr, minlength=p)

        peak = self.simulation.peak_memory.to_numpy(dtype=float)
        budget = self.config.memory_budget
        budget_mb = np.full(p, np.nan if budget is None else float(budget))
        fits = within_budget(peak, budget)
        return pd.DataFrame(
            {
                "device": np.arange(p),
                "layers": per_device(self.counts.sum(axis=(0, 1))).astype(np.int64),
                "params_mb": per_device(costs.params),
                "peak_mb": peak,
                "budget_mb": budget_mb,
                "fits": fits,
                "forward_ms": per_device(costs.forward),
                "backward_ms": per_device(np.asarray(costs.backward)
                                          + np.reshape(costs.weight, (-1,) + (1,) * (np.ndim(costs.backward) - 1))),
                "recompute_ms": per_device(costs.recompute_overhead),
            }
        )

    # ----------------------------------------------------------------- exports
    def export(self, format: str, path: str | os.PathLike[str] | None = None, **options: Any) -> Export:
        """The plan in ``format`` (one of :data:`~sapptk.formats.registry.FORMATS`: ``"sapptk"``,
        ``"mindformers"``, ``"megatron"``, ``"torchtitan"``, ``"torch-csv"``), written to ``path``
        when given; :func:`load_plan` reads every format but torch-csv back.

        Returns an :class:`~sapptk.formats.base.Export`: ``text`` (what to print or paste),
        ``texts`` (every file by role), ``written`` (the paths written), ``notes`` (what the
        runtime cannot express), ``step_time_ms`` and ``expressed_step_time_ms`` (``cost_ms``,
        ``exact``), ``data`` (the format's own structured form). ``options``: torchtitan takes
        ``base_config`` and ``csv_name``. A format that cannot run the plan (offload, recompute
        per micro-batch, slices, V placements, ...) raises a ConfigError that says why.
        """
        return registry.export(self, format, path, **options)

    # ----------------------------------------------------------------- summary
    def summary(self) -> str:
        """A short human-readable account: status, step time, gap, bubble, peak vs budget per device."""
        c = self.config
        lines = [
            f"plan {self.source} for {self.profile.name}: {c.schedule}, p={c.stages}, v={c.chunks}, "
            f"m={c.micro_batches}" + (f", k={c.splits}" if c.splits != 1 else "")
        ]
        status = f"status {self.status}"
        if self.gap is not None:
            status += f", gap {self.gap:.2%}"
        if self.bound is not None:
            status += f", bound {_ms(self.bound)}"
        if self.solve_seconds:
            status += f", solved in {self.solve_seconds:.1f} s"
        lines.append(status)
        if self.message:
            lines.append(self.message)
        if not self.solved:
            return "\n".join(lines)
        sim = self.simulation
        step = f"step time {_ms(self.step_time)}"
        if self.step_time is None or not math.isclose(self.step_time, sim.step_time, rel_tol=1e-9, abs_tol=1e-6):
            step += f" (simulated {_ms(sim.step_time)})"
        lines.append(f"{step}, bubble {sim.bubble.of_compute:.1%} of compute")
        if self.offload is not None:
            waited = getattr(sim, "fetch_wait_ms", 0.0)
            lines.append(f"activation offload: {int(self.offload.sum())} layers on "
                         f"{int((self.offload.sum(axis=0) > 0).sum())} virtual stages, host link "
                         f"{c.host_bandwidth:g} MB/ms, backwards waited {waited:.1f} ms for fetches")
        if self.alternative is not None:
            on_alt = self.alternative.micro_batches()
            stages = int((on_alt > 0).sum())
            lines.append(f"recompute per micro-batch: {int(on_alt.sum())} of {on_alt.size * c.micro_batches} "
                         f"(virtual stage, micro-batch) cells on {stages} virtual stage(s) run the alternative layout")
        frame = self.devices
        budget = c.memory_budget
        if budget is None:
            top = int(frame.peak_mb.idxmax())
            lines.append(f"no memory budget; max peak {frame.peak_mb.max():.0f} MB on device {top}")
        else:
            over = int((~frame.fits).sum())
            verdict = "all devices fit" if over == 0 else f"{over} device(s) over budget"
            lines.append(f"memory budget {budget:.0f} MB: {verdict}")
        lines.append("device  layers  peak_mb  of budget")
        for row in frame.itertuples(index=False):
            share = "" if budget is None else f"{row.peak_mb / budget:9.1%}" + ("" if row.fits else "  OVER")
            lines.append(f"{row.device:6d}  {row.layers:6d}  {row.peak_mb:7.0f}  {share}".rstrip())
        return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} ms"


# --------------------------------------------------------------------------- builders
def make_plan(
    profile: Profile,
    config: PipelineConfig,
    counts: Any,
    *,
    status: str,
    step_time: float | None = None,
    bound: float | None = None,
    gap: float | None = None,
    solve_seconds: float = 0.0,
    message: str = "",
    source: str = "balance",
    offload: Any = None,
    alternative: AlternativeLayout | None = None,
) -> Plan:
    """Build a :class:`Plan`, validating ``counts`` (a read-only copy is kept).

    With status ``infeasible`` or ``unknown``, ``counts`` may be ``None`` (stored as zeros).
    A ``given`` plan without ``step_time`` is simulated for it. ``offload`` (body groups,
    virtual stages) is checked by :func:`sapptk.costs.check_offload`; all zeros is stored as None.
    ``alternative`` (recompute per micro-batch) is validated against ``counts``
    (:func:`sapptk.costs.check_alternative`); only a plan with an assignment and without
    offload may carry one.
    """
    if status not in PLAN_STATUSES:
        raise ConfigError(f"status = {status!r}: expected one of {', '.join(PLAN_STATUSES)}")
    if callable(getattr(config, "check_slices", None)) and hasattr(profile, "seq_length"):
        config.check_slices(profile)  # slice lengths that are not the profile's sequence: splits=[5] on 4,096 tokens
    shape = (len(profile.body), len(MODES), config.num_virtual_stages)
    if status in _SOLVED:
        if counts is None:
            raise ConfigError(f"status = {status!r}: expected a layer assignment (counts), got None")
        arr = np.array(check_counts(profile, config, counts), dtype=np.int64, copy=True)
    elif counts is None:
        arr = np.zeros(shape, dtype=np.int64)
    else:
        arr = counts_array(counts)
        if arr.shape != shape:
            raise ConfigError(f"counts: expected shape {shape} (groups, modes, virtual stages), got {arr.shape}")
        arr = np.array(whole_layers(arr, "counts"), dtype=np.int64, copy=True)
    arr.setflags(write=False)
    off = None
    if offload is not None:
        if is_sliced(profile, config):
            raise ConfigError(f"offload: not modelled with the sequence slices of a long-context profile (seq_length "
                              f"= {profile.seq_length}): expected no offload")
        if status not in _SOLVED:
            raise ConfigError(f"offload: a plan with status {status!r} has no layer assignment to offload")
        off = check_offload(profile, config, arr, offload)
    alt = None
    if alternative is not None:
        if status not in _SOLVED:
            raise ConfigError(f"alternative: a plan with status {status!r} has no layer assignment to vary")
        if off is not None:
            raise ConfigError("alternative: recompute per micro-batch cannot be combined with activation offload "
                              "(offload: a plan offloads or varies its recompute per micro-batch, not both)")
        alt = check_alternative(profile, config, arr, alternative)
    sim = None
    if status == "given" and step_time is None:
        sim = simulate_counts(profile, config, arr, alt, offload=off)
        step_time = sim.step_time
    plan = Plan(
        profile=profile,
        config=config,
        counts=arr,
        status=status,
        step_time=None if step_time is None else float(step_time),
        bound=None if bound is None else float(bound),
        gap=None if gap is None else float(gap),
        solve_seconds=float(solve_seconds),
        message=message,
        source=source,
        offload=off,
        alternative=alt,
    )
    if sim is not None:
        plan.__dict__["simulation"] = sim  # seed the cached property
    return plan


def even_split(profile: Profile, config: PipelineConfig, recompute: str = "none") -> Plan:
    """The naive baseline as a plan: layers spread evenly, every layer in one mode
    (:func:`sapptk.baselines.even_counts`, whose module docstring states the rule).

    ``recompute`` is a mode name, ``"strongest"`` for each group's
    :attr:`~sapptk.profile.LayerGroup.strongest_mode`, or ``"auto"``: the weakest mode allowed by
    ``config.recompute`` that fits the budget, else the strongest such mode. The step time is
    simulated; status ``"given"``, source ``"even_split(<mode>)"`` (the mode ``"auto"`` picked).
    """
    mode = baselines.resolve_recompute(profile, config, recompute)
    counts = baselines.even_counts(profile, config, mode)
    return make_plan(profile, config, counts, status="given", source=f"even_split({mode})")


# --------------------------------------------------------------------------- loading
def load_plan(source: Any, format: str | None = None, *, profile: Profile | None = None,
              config: PipelineConfig | None = None, **options: Any) -> Plan:
    """A plan from a file (or data) in any format :meth:`Plan.export` writes, the format inferred
    from the file when ``format`` is None (:func:`sapptk.formats.registry.infer_format`).

    The same call for every format: ``load_plan(source, format, profile=..., config=...)``.
    ``"sapptk"``: the plan file carries its profile and setup (``profile`` and ``config`` stay
    None); its figures are checked against the simulation. ``"mindformers"``: a YAML/JSON file or
    a mapping, ``name=`` picks one of several named configs (:func:`load_plans` reads them all).
    ``"megatron"``: a file of arguments, a command line, a list, a mapping of flags or a layout
    string; ``config`` gives the setup. ``"torchtitan"``: a TOML file or its text; stages,
    chunks, schedule and micro-batches come from the file, ``config`` (optional) the rest,
    ``csv=`` the schedule CSV's path. ``"torch-csv"`` holds no layer assignment and is refused.
    Plans read from a runtime's format are simulated (status ``"given"``). Every problem is a
    :class:`~sapptk.errors.ConfigError` naming the file, the field and what was expected.
    """
    fmt, d = registry.read(source, format, profile, config, **options)
    return _built(fmt, d)


def load_plans(source: Any, format: str | None = None, *, profile: Profile | None = None,
               config: PipelineConfig | None = None) -> dict[str, Plan]:
    """Every plan of a file as ``{name: Plan}`` in file order: one per named MindFormers config
    (an unnamed one is named after the file's stem, ``"config"`` for data); one for the other
    formats, named by its source. Arguments as for :func:`load_plan`."""
    fmt, found = registry.read_all(source, format, profile, config)
    plans = [_built(fmt, d) for d in found]
    return {plan.source.removeprefix("mindformers:"): plan for plan in plans}


def _built(fmt: str, d: dict[str, Any]) -> Plan:
    where = d.pop("where")
    try:
        plan = make_plan(**d)
    except SapptkError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if fmt == "sapptk":
        plan_file.check_evidence(plan, where)
    return plan
