"""A :class:`Plan`: a layer assignment with its provenance, its DataFrame views and its
MindFormers export/import.

A plan holds ``counts``, an int array ``(body groups, len(MODES), virtual stages)``: how
many layers of each body group run in each recompute mode on each virtual stage (the head
sits on virtual stage 0, the tail on the last one). Plans come from the balancer
(:func:`sapptk.balancer.balance`, through :func:`make_plan`), from a naive baseline
(:func:`even_split`) or from a hand-made MindFormers config (:func:`from_mindformers`).
The MindFormers format itself lives in :mod:`sapptk.formats.mindformers`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import pandas as pd
import yaml

from sapptk.costs import StageCosts, check_counts, simulate_counts, stage_costs
from sapptk.errors import ConfigError, SapptkError
from sapptk.formats import megatron, mindformers, torchtitan
from sapptk.profile import MODES
from sapptk.sensitivity import Sensitivity, critical_path, sensitivity

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile
    from sapptk.simulation import Simulation

__all__ = ["PLAN_STATUSES", "Plan", "even_baseline", "even_layers", "even_split", "even_splits", "from_megatron",
           "from_mindformers", "from_mindformers_named", "from_torchtitan", "load_plan", "make_plan"]

PLAN_STATUSES: tuple[str, ...] = ("optimal", "feasible", "infeasible", "unknown", "given")
"""``optimal``/``feasible``: solver results; ``infeasible``/``unknown``: no assignment
(proved impossible / none found in time); ``given``: fixed by the user or a baseline."""

_SOLVED = ("optimal", "feasible", "given")
PLAN_FORMAT = "sapptk-plan/1"
_FIT_TOLERANCE_MB = 1e-6


@dataclass(frozen=True, eq=False)
class Plan:
    """A layer assignment for one profile and pipeline setup.

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
    """

    profile: Profile
    config: PipelineConfig
    counts: np.ndarray
    status: str
    step_time: float | None
    bound: float | None
    gap: float | None
    solve_seconds: float
    message: str
    source: str

    # ------------------------------------------------------------------ basics
    @property
    def solved(self) -> bool:
        """Whether the plan holds an assignment (status optimal, feasible or given)."""
        return self.status in _SOLVED

    def _need_solution(self, what: str) -> None:
        if not self.solved:
            raise ConfigError(f"plan from {self.source!r} has status {self.status!r} and no layer assignment: "
                              f"cannot compute {what}")

    def __repr__(self) -> str:
        c = self.config
        step = "None" if self.step_time is None else f"{self.step_time:.6g} ms"
        return (
            f"Plan({self.source!r}, status={self.status!r}, step_time={step}, profile={self.profile.name!r}, "
            f"schedule={c.schedule!r}, p={c.stages}, v={c.chunks}, m={c.micro_batches})"
        )

    # ------------------------------------------------------------------- costs
    @cached_property
    def costs(self) -> StageCosts:
        """Per-virtual-stage costs of the assignment (:func:`sapptk.costs.stage_costs`)."""
        self._need_solution("costs")
        return stage_costs(self.profile, self.config, self.counts)

    def simulate(self, **kw: Any) -> Simulation:
        """Simulate the plan on its program (:func:`sapptk.costs.simulate_counts`); ``kw`` go to the simulator."""
        self._need_solution("a simulation")
        return simulate_counts(self.profile, self.config, self.counts, **kw)

    @cached_property
    def simulation(self) -> Simulation:
        """The simulation with default options, computed once."""
        return self.simulate()

    @property
    def fits(self) -> bool:
        """Whether every device's simulated peak memory is within the budget (always, without a budget)."""
        if not self.solved:
            return False
        budget = self.config.memory_budget
        if budget is None:
            return True
        return bool((self.simulation.peak_memory.to_numpy() <= budget + _FIT_TOLERANCE_MB).all())

    # ------------------------------------------------------------ robustness
    def sensitivity(
        self, time_error: float = 0.05, memory_error: float = 0.02, samples: int = 1000, seed: int = 0
    ) -> Sensitivity:
        """The plan under ``samples`` perturbed profiles, per error model (independent and shared):
        step-time quantiles and each device's chance of exceeding the budget
        (:func:`sapptk.sensitivity.sensitivity`)."""
        return sensitivity(self, time_error=time_error, memory_error=memory_error, samples=samples, seed=seed)

    def critical(self) -> pd.DataFrame:
        """The (virtual stage, op kind) pairs on the critical path and how many ms the step time
        grows per ms of each (:func:`sapptk.sensitivity.critical_path`)."""
        return critical_path(self)

    # ------------------------------------------------------------------ frames
    @cached_property
    def layout(self) -> pd.DataFrame:
        """Tidy layout: one row per (group, chunk, stage, mode) holding layers, in model order.

        Columns: ``group`` (categorical, body groups in model order), ``chunk``, ``stage``
        (position of the virtual stage in its chunk's pass, ``virtual_stage − chunk·p``),
        ``device`` (where it runs; equal to ``stage`` except on V-shaped placements),
        ``virtual_stage``, ``mode`` (ordered categorical, :data:`MODES` order), ``layers``.
        """
        program = self.config.program()
        p = self.config.stages
        chunk_of = np.asarray(program.chunk_of, dtype=np.int64)
        placement = np.asarray(program.placement, dtype=np.int64)
        g, r, vs = np.nonzero(self.counts)
        order = np.lexsort((r, g, vs))
        g, r, vs = g[order], r[order], vs[order]
        names = [grp.name for grp in self.profile.body]
        return pd.DataFrame(
            {
                "group": pd.Categorical.from_codes(g, dtype=pd.CategoricalDtype(names, ordered=True)),
                "chunk": chunk_of[vs],
                "stage": vs - chunk_of[vs] * p,
                "device": placement[vs],
                "virtual_stage": vs.astype(np.int64),
                "mode": pd.Categorical.from_codes(r, dtype=pd.CategoricalDtype(list(MODES), ordered=True)),
                "layers": self.counts[g, r, vs].astype(np.int64),
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
        work, recompute included), ``recompute_ms`` (backward time above no recompute).
        """
        self._need_solution("per-device figures")
        costs = self.costs
        placement = np.asarray(self.config.program().placement)
        p = self.config.stages

        def per_device(values: np.ndarray) -> np.ndarray:
            return np.bincount(placement, weights=np.asarray(values, dtype=float), minlength=p)

        peak = self.simulation.peak_memory.to_numpy(dtype=float)
        budget = self.config.memory_budget
        budget_mb = np.full(p, np.nan if budget is None else float(budget))
        fits = np.ones(p, dtype=bool) if budget is None else peak <= float(budget) + _FIT_TOLERANCE_MB
        return pd.DataFrame(
            {
                "device": np.arange(p),
                "layers": per_device(self.counts.sum(axis=(0, 1))).astype(np.int64),
                "params_mb": per_device(costs.params),
                "peak_mb": peak,
                "budget_mb": budget_mb,
                "fits": fits,
                "forward_ms": per_device(costs.forward),
                "backward_ms": per_device(costs.backward + costs.weight),
                "recompute_ms": per_device(costs.recompute_overhead),
            }
        )

    # ------------------------------------------------------------- MindFormers
    def to_mindformers(self) -> dict[str, dict[str, list]]:
        """``{group name: {offset, recompute, select_recompute, select_comm_recompute}}``.

        Always keyed by body group, even for one group (``plan.to_mindformers()[name]`` is
        then exactly the block MindFormers reads). Lists are ``[chunk][device]``; flat
        lists when ``chunks = 1``. See :mod:`sapptk.formats.mindformers` for the meaning.
        """
        self._need_solution("a MindFormers config")
        return mindformers.encode(self.profile, self.config.program(), self.counts)

    def to_yaml(self, path: str | os.PathLike[str] | None = None) -> str:
        """The MindFormers config as YAML (also written to ``path`` when given).

        One body group: the four keys at the top level, ready to paste into MindFormers.
        Several: one mapping per group. A comment header records the setup and status;
        :func:`from_mindformers` reads the text back to the same counts.
        """
        data = self.to_mindformers()
        body = self.profile.body
        c = self.config
        header = [
            f"# sapptk plan for MindFormers: profile {self.profile.name!r}, schedule {c.schedule!r}",
            f"# pipeline_stage (p) = {c.stages}, pp_interleave_num (v) = {c.chunks}, micro_batch_num = "
            f"{c.micro_batches}",
            f"# status {self.status}, step time {_ms(self.step_time)}, source {self.source}",
            "# lists are [chunk][stage]; offset = layers in the cell - floor(N / (p*v));",
            "# select_recompute / select_comm_recompute count layers with select / comm, both or full",
        ]
        if len(body) == 1:
            payload: dict[str, Any] = data[body[0].name]
            header.append(f"# body group {body[0].name!r}: N = {body[0].count}")
        else:
            payload = data
            header.append("# one mapping per body group, offsets relative to floor(N_g / (p*v)): "
                          + ", ".join(f"{g.name} N = {g.count}" for g in body))
        text = "\n".join(header) + "\n" + yaml.safe_dump(payload, sort_keys=False, default_flow_style=None, width=1000)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

    # ------------------------------------------------------------ other runtimes
    def _line_layers(self, runtime: str) -> np.ndarray:
        """Body layers per virtual stage, for runtimes that place virtual stage c·p + s on rank s."""
        program = self.config.program()
        p = self.config.stages
        if any(d != vs % p for vs, d in enumerate(program.placement)):
            raise ConfigError(
                f"schedule {self.config.schedule!r} places its chunks in a V (device of each virtual stage: "
                f"{list(program.placement)}): {runtime} runs virtual stage c·p + s on rank s"
            )
        return self.counts.sum(axis=(0, 1))

    def to_megatron(self) -> megatron.MegatronExport:
        """The plan as Megatron-LM arguments (:mod:`sapptk.formats.megatron`).

        The layout is exact. Recompute is what Megatron can express: the plan's own setting
        when it is one of Megatron's, else the fastest expressible setting that fits the
        budget (the one with the least peak when none fits), simulated on the schedule
        Megatron runs (1F1B, or interleaved in Megatron's micro-batch groups); the export
        reports both step times and lists what was lost. Raises :class:`ConfigError` for V
        placements (Megatron has none).
        """
        from sapptk.costs import peak_memory
        from sapptk.schedules.interleaved import megatron_group_size

        self._need_solution("Megatron-LM arguments")
        c = self.config
        layers = self._line_layers("Megatron-LM")
        p, v, m = c.stages, c.chunks, c.micro_batches
        schedule = "1f1b" if v == 1 else "interleaved-megatron"
        group = megatron_group_size(p, m) if v > 1 else p
        runs = c.replace(schedule=schedule, custom_program=None)
        candidates = megatron.recompute_candidates(self.profile, layers)
        exact = next((label for label, (_, cnt) in candidates.items() if np.array_equal(cnt, self.counts)), None)
        notes: list[str] = []
        if exact is not None:
            label = exact
        else:
            budget = c.memory_budget
            peaks = {lab: float(peak_memory(self.profile, runs, cnt).max()) for lab, (_, cnt) in candidates.items()}
            fitting = [lab for lab in candidates if budget is None or peaks[lab] <= budget + _FIT_TOLERANCE_MB]
            if fitting:
                steps = {lab: simulate_counts(self.profile, runs, candidates[lab][1]).step_time for lab in fitting}
                label = min(fitting, key=lambda lab: (steps[lab], peaks[lab]))
            else:
                label = min(candidates, key=lambda lab: peaks[lab])
            notes.append(f"recompute: the plan uses {_modes_used(self.counts)}; Megatron applies one setting to every "
                         f"chunk, so it runs {label!r} ({' '.join(candidates[label][0]) or 'no recompute flags'})"
                         + ("" if fitting else ", the least memory it can, still over the budget"))
        if runs.program().units != c.program().units:
            notes.append(f"schedule: the plan was made for {c.schedule!r}; Megatron runs {schedule!r}"
                         + (f" (micro-batch groups of {group})" if v > 1 else ""))
        flags, counts = candidates[label]
        expressed = make_plan(self.profile, runs, counts, status="given", source="megatron")
        head = ("--pipeline-model-parallel-size", str(p), "--num-layers", str(int(layers.sum())))
        grouping = ("--microbatch-group-size-per-virtual-pipeline-stage", str(group)) if v > 1 and group != p else ()
        layout = megatron.format_layout(layers)
        uniform, reason = megatron.uniform_args(layers, p, v)
        return megatron.MegatronExport(
            layout=layout,
            args=(*head, "--pipeline-model-parallel-layout", layout, *grouping, *flags),
            recompute=flags,
            uniform=None if uniform is None else (*head, *uniform, *grouping, *flags),
            uniform_reason=reason,
            schedule=schedule,
            group_size=group,
            notes=tuple(notes),
            step_time_ms=self.simulation.step_time,
            peak_mb=float(self.simulation.peak_memory.max()),
            expressed_step_time_ms=expressed.simulation.step_time,
            expressed_peak_mb=float(expressed.simulation.peak_memory.max()),
            expressed_fits=expressed.fits,
            expressed_counts=expressed.counts,
        )

    def to_torchtitan(self, csv_name: str = "schedule.csv") -> torchtitan.TorchtitanExport:
        """The plan as torchtitan settings (:mod:`sapptk.formats.torchtitan`).

        The partition is exact; the schedule is named when a PyTorch class runs the same
        order, else exported as a schedule CSV (``csv_name``). Activation checkpointing is
        one mode for every layer: the plan's own when it is uniform, else the fastest
        uniform mode that fits the budget (the least memory when none fits); the export
        reports both step times and what was lost.
        """
        from sapptk.costs import peak_memory

        self._need_solution("torchtitan settings")
        c = self.config
        program = c.program()
        layers = self.counts.sum(axis=(0, 1))
        named = None if c.custom_program is not None else torchtitan.torch_schedule(
            c.schedule, c.stages, c.micro_batches, c.chunks)
        csv = None
        if named is None:
            csv = program.to_csv()  # ScheduleError for sequence slices
            v_shape = any(d != vs % c.stages for vs, d in enumerate(program.placement))
            named = "ZBVZeroBubble" if v_shape else ("Interleaved1F1B" if c.chunks > 1 else "1F1B")
        candidates = {
            mode: megatron.counts_from_layers(self.profile, layers, _every_layer(MODES.index(mode)))
            for mode in torchtitan.AC_SETTINGS if all(mode in g.modes for g in self.profile.body)
        }
        exact = next((m for m, cnt in candidates.items() if np.array_equal(cnt, self.counts)), None)
        notes: list[str] = []
        if exact is not None:
            mode = exact
        else:
            budget = c.memory_budget
            peaks = {m: float(peak_memory(self.profile, c, cnt).max()) for m, cnt in candidates.items()}
            fitting = [m for m in candidates if budget is None or peaks[m] <= budget + _FIT_TOLERANCE_MB]
            if fitting:
                mode = min(fitting, key=lambda m: simulate_counts(self.profile, c, candidates[m]).step_time)
            else:
                mode = min(candidates, key=lambda m: peaks[m])
            notes.append(f"activation checkpointing: the plan uses {_modes_used(self.counts)}; torchtitan applies one "
                         f"mode to every layer, so it runs {mode!r}"
                         + ("" if fitting else ", the least memory it can, still over the budget"))
        expressed = make_plan(self.profile, c, candidates[mode], status="given", source="torchtitan")
        comments = [f"sapptk plan for torchtitan: profile {self.profile.name!r}, schedule {c.schedule!r}, "
                    f"p = {c.stages}, v = {c.chunks}, m = {c.micro_batches}; status {self.status}"]
        if csv is not None:
            comments.append(f"no PyTorch class runs {c.schedule!r}: save the schedule CSV as {csv_name}")
        toml = torchtitan.render(degree=c.stages, schedule=named, parts=torchtitan.fqns(layers),
                                 ac=torchtitan.AC_SETTINGS[mode], micro_batches=c.micro_batches,
                                 schedule_csv=None if csv is None else csv_name, comments=comments)
        return torchtitan.TorchtitanExport(
            toml=toml, csv=csv, csv_name=None if csv is None else csv_name, schedule=named,
            ac=dict(torchtitan.AC_SETTINGS[mode]), notes=tuple(notes),
            step_time_ms=self.simulation.step_time, peak_mb=float(self.simulation.peak_memory.max()),
            expressed_step_time_ms=expressed.simulation.step_time,
            expressed_peak_mb=float(expressed.simulation.peak_memory.max()), expressed_fits=expressed.fits,
            expressed_counts=expressed.counts,
        )

    # ---------------------------------------------------------------- plan file
    def to_plan_dict(self) -> dict[str, Any]:
        """The plan as plain data (``sapptk-plan/1``): everything :func:`load_plan` needs."""
        c = self.config
        setup: dict[str, Any] = {
            "stages": c.stages,
            "micro_batches": c.micro_batches,
            "chunks": c.chunks,
            "schedule": c.schedule,
            "splits": c.splits,
            "memory_budget_mb": None if c.memory_budget is None else float(c.memory_budget),
            "constant_memory_mb": float(c.constant_memory),
            "comm_ms": float(c.comm),
            "recompute": list(c.recompute),
        }
        if c.custom_program is not None:
            setup["program_csv"] = c.custom_program.to_csv()
        names = [g.name for g in self.profile.body]
        layout = [
            {"group": names[g], "virtual_stage": int(vs), "mode": MODES[r], "layers": int(self.counts[g, r, vs])}
            for vs in range(self.counts.shape[2]) for g in range(self.counts.shape[0]) for r in range(len(MODES))
            if self.counts[g, r, vs]
        ]
        return {
            "format": PLAN_FORMAT,
            "source": self.source,
            "status": self.status,
            "step_time_ms": self.step_time,
            "bound_ms": self.bound,
            "gap": self.gap,
            "solve_seconds": self.solve_seconds,
            "message": self.message,
            "setup": setup,
            "layout": layout,
            "profile": self.profile.to_dict(),
        }

    def save(self, path: str | os.PathLike[str] | None = None) -> str:
        """The plan as a sapptk plan file (YAML; :func:`load_plan` reads it back to an equal
        plan): the setup, the layout, the status and figures, and the profile, so the file
        stands alone. Returns the text; writes it to ``path`` when given."""
        header = (
            f"# sapptk plan ({PLAN_FORMAT}): read with sapptk.load_plan, export with `sapptk export`.\n"
            "# layout: layers of each body group in each recompute mode on each virtual stage (model order)\n"
        )
        text = header + yaml.safe_dump(self.to_plan_dict(), sort_keys=False, default_flow_style=None, width=120,
                                       allow_unicode=True)
        if path is not None:
            Path(path).write_text(text, encoding="utf-8")
        return text

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


def _every_layer(mode: int) -> Any:
    return lambda vs, pos: mode


def _modes_used(counts: np.ndarray) -> str:
    per_mode = counts.sum(axis=(0, 2))
    return ", ".join(f"{int(n)} layers {MODES[r]}" for r, n in enumerate(per_mode) if n)


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
) -> Plan:
    """Build a :class:`Plan`, validating ``counts`` (a read-only copy is kept).

    With status ``infeasible`` or ``unknown``, ``counts`` may be ``None`` (stored as zeros).
    A ``given`` plan without ``step_time`` is simulated for it.
    """
    if status not in PLAN_STATUSES:
        raise ConfigError(f"status = {status!r}: expected one of {', '.join(PLAN_STATUSES)}")
    shape = (len(profile.body), len(MODES), config.num_virtual_stages)
    if status in _SOLVED:
        if counts is None:
            raise ConfigError(f"status = {status!r}: expected a layer assignment (counts), got None")
        arr = np.array(check_counts(profile, config, counts), dtype=np.int64, copy=True)
    elif counts is None:
        arr = np.zeros(shape, dtype=np.int64)
    else:
        arr = np.array(counts, dtype=np.int64, copy=True)
        if arr.shape != shape:
            raise ConfigError(f"counts: expected shape {shape} (groups, modes, virtual stages), got {arr.shape}")
    arr.setflags(write=False)
    sim = None
    if status == "given" and step_time is None:
        sim = simulate_counts(profile, config, arr)
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
    )
    if sim is not None:
        plan.__dict__["simulation"] = sim  # seed the cached property
    return plan


def even_layers(total: int, stages: int, chunks: int) -> np.ndarray:
    """Layers per cell ``[chunk][device]`` of the naive even split, shape (chunks, stages).

    Every cell gets ⌊N/(p·v)⌋; the ``N mod (p·v)`` extra layers go one each to the devices
    nearest the middle of the pipeline (ties to the lower device), on the last chunk first,
    then the one before. For one chunk this is MindFormers' documented example (48 layers
    on 5 stages: ``offset: [0, 1, 1, 1, 0]``). The ends are avoided because they carry the
    head and the tail, and the last chunk because it keeps the fewest micro-batches live.
    """
    cells = np.full((chunks, stages), total // (stages * chunks), dtype=np.int64)
    extra = total % (stages * chunks)
    centre = (stages - 1) / 2
    devices = sorted(range(stages), key=lambda s: (abs(s - centre), s))
    for c in reversed(range(chunks)):
        take = min(extra, stages)
        cells[c, devices[:take]] += 1
        extra -= take
    return cells


def even_split(profile: Profile, config: PipelineConfig, recompute: str = "none") -> Plan:
    """The naive baseline: layers spread evenly (see :func:`even_layers`), every layer in one mode.

    ``recompute`` is a mode name, or ``"strongest"`` for each group's
    :attr:`~sapptk.profile.LayerGroup.strongest_mode`. Body groups follow each other in
    model order over the virtual stages. The step time is simulated; status ``"given"``.
    """
    body = tuple(profile.body)
    if recompute != "strongest" and recompute not in MODES:
        raise ConfigError(f"even_split: recompute = {recompute!r}: expected one of {', '.join(MODES)} or 'strongest'")
    modes = []
    for group in body:
        mode = group.strongest_mode if recompute == "strongest" else recompute
        if mode not in group.modes:
            raise ConfigError(
                f"even_split: recompute = {recompute!r}: profile {profile.name!r} group {group.name!r} has no "
                f"{mode!r} mode: expected one of its modes {', '.join(group.modes)}"
            )
        modes.append(MODES.index(mode))
    program = config.program()
    grid = mindformers.cell_grid(program)
    cells = even_layers(profile.num_body_layers, config.stages, config.chunks)
    per_vs = np.zeros(program.num_virtual_stages, dtype=np.int64)
    per_vs[grid] = cells
    bounds = np.concatenate([[0], np.cumsum(per_vs)])  # layer range of each virtual stage, model order
    counts = np.zeros((len(body), len(MODES), program.num_virtual_stages), dtype=np.int64)
    start = 0
    for g, group in enumerate(body):
        lo, hi = start, start + group.count
        counts[g, modes[g]] = np.clip(np.minimum(bounds[1:], hi) - np.maximum(bounds[:-1], lo), 0, None)
        start = hi
    return make_plan(profile, config, counts, status="given", source=f"even_split({recompute})")


def even_splits(profile: Profile, config: PipelineConfig) -> list[Plan]:
    """Every distinct even split: one per recompute mode that every body group offers (in
    :data:`MODES` order, weakest first), then each group's strongest mode if that differs."""
    plans: list[Plan] = []
    for mode in (*MODES, "strongest"):
        if mode != "strongest" and not all(mode in g.modes for g in profile.body):
            continue
        plan = even_split(profile, config, mode)
        if not any(np.array_equal(plan.counts, other.counts) for other in plans):
            plans.append(plan)
    return plans


def even_baseline(profile: Profile, config: PipelineConfig) -> Plan:
    """The even split a person would try first: the weakest recompute mode allowed by
    ``config.recompute`` (and offered by every body group) that fits the budget, else the
    strongest such mode (each group's strongest mode when no allowed mode is common)."""
    allowed = [m for m in MODES if m in config.recompute] or list(MODES)
    usable = [m for m in allowed if all(m in g.modes for g in profile.body)] or ["strongest"]
    plan = even_split(profile, config, usable[0])
    for mode in usable:
        plan = even_split(profile, config, mode)
        if plan.fits:
            return plan
    return plan


def _mindformers_configs(data: Any, profile: Profile) -> tuple[str | None, bool, dict[Any, Any]]:
    file: str | None = None
    if isinstance(data, (str, os.PathLike)):
        file = os.fspath(data)
        data = mindformers.load(file)
    named, configs = mindformers.split_configs(profile, data, file)
    return file, named, configs


def _mindformers_plan(profile: Profile, config: PipelineConfig, key: Any, cfg: Any, file: str | None) -> Plan:
    label = str(key) if key is not None else (Path(file).stem if file else "config")
    counts = mindformers.decode(profile, config.program(), cfg, file=file, name=None if key is None else str(key))
    try:
        check_counts(profile, config, counts)
    except ConfigError as exc:
        where = file or "<data>"
        where += f", config {str(key)!r}" if key is not None else ""
        raise ConfigError(f"{where}: {exc}") from None
    return make_plan(profile, config, counts, status="given", source=f"mindformers:{label}")


def from_mindformers(profile: Profile, config: PipelineConfig, data: Any, *, name: str | None = None) -> Plan:
    """One plan from a MindFormers config (see :mod:`sapptk.formats.mindformers` for every accepted spelling).

    ``data`` is a parsed mapping or a path to a YAML/JSON file. A file holding one config
    gives its plan; a file of named configs needs ``name`` to pick one (a
    :class:`~sapptk.errors.ConfigError` lists the names otherwise; :func:`from_mindformers_named`
    reads them all). The plan is simulated (status ``"given"``, source
    ``"mindformers:<name>"``, the file's stem for an unnamed config). ``data`` is not modified.
    """
    file, named, configs = _mindformers_configs(data, profile)
    where = file or "<data>"
    if name is not None:
        if not named:
            raise ConfigError(f"{where}: holds one unnamed config, not named configs: cannot select {name!r}")
        if name not in configs:
            raise ConfigError(f"{where}: no config named {name!r}: expected one of {', '.join(map(str, configs))}")
        return _mindformers_plan(profile, config, name, configs[name], file)
    if named:
        raise ConfigError(
            f"{where}: holds {len(configs)} named configs ({', '.join(map(str, configs))}): pass name= to pick "
            "one, or read them all with from_mindformers_named"
        )
    return _mindformers_plan(profile, config, None, configs[None], file)


def from_mindformers_named(profile: Profile, config: PipelineConfig, data: Any) -> dict[str, Plan]:
    """Every config of a MindFormers file or mapping as ``{name: Plan}``, in file order.

    A file of named configs gives one entry per name; a single unnamed config gives one
    entry named after the file's stem (``"config"`` for parsed data). See :func:`from_mindformers`.
    """
    file, _, configs = _mindformers_configs(data, profile)
    plans = {}
    for key, cfg in configs.items():
        plan = _mindformers_plan(profile, config, key, cfg, file)
        plans[plan.source.removeprefix("mindformers:")] = plan
    return plans


# --------------------------------------------------------------------------- plan files
_SETUP_KEYS = ("stages", "micro_batches", "chunks", "schedule", "splits", "memory_budget_mb", "constant_memory_mb",
               "comm_ms", "recompute", "program_csv")
_PLAN_KEYS = ("format", "source", "status", "step_time_ms", "bound_ms", "gap", "solve_seconds", "message", "setup",
              "layout", "profile")


def load_plan(source: str | os.PathLike[str] | Any) -> Plan:
    """A plan from a sapptk plan file (:meth:`Plan.save`) or its parsed data.

    Every field is checked; a :class:`~sapptk.errors.ConfigError` names the file, the field
    and what was expected. A plan carrying its own program (a schedule CSV, a re-ordered
    cost-driven schedule) gets it back from the embedded CSV.
    """
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile
    from sapptk.schedules import from_csv_text

    where = "<data>"
    data = source
    if isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        data = mindformers.load(where)

    def fail(message: str) -> NoReturn:
        raise ConfigError(f"{where}: {message}")

    if not isinstance(data, dict):
        fail(f"expected a sapptk plan (a mapping with format: {PLAN_FORMAT}), got {type(data).__name__}")
    if data.get("format") != PLAN_FORMAT:
        fail(f"format = {data.get('format')!r}: expected {PLAN_FORMAT!r} (a file written by Plan.save)")
    unknown = [k for k in data if k not in _PLAN_KEYS]
    if unknown:
        fail(f"unknown key {unknown[0]!r}: expected {', '.join(_PLAN_KEYS)}")
    setup = data.get("setup")
    if not isinstance(setup, dict):
        fail(f"setup = {setup!r}: expected a mapping with {', '.join(_SETUP_KEYS[:5])}, ...")
    unknown = [k for k in setup if k not in _SETUP_KEYS]
    if unknown:
        fail(f"setup: unknown key {unknown[0]!r}: expected {', '.join(_SETUP_KEYS)}")
    try:
        profile = Profile.from_dict(data.get("profile"), source=f"{where}, profile")
    except SapptkError as exc:
        fail(str(exc))
    fields = {
        "memory_budget": setup.get("memory_budget_mb"),
        "constant_memory": setup.get("constant_memory_mb", 0),
        "comm": setup.get("comm_ms", 0),
        "recompute": tuple(setup.get("recompute") or MODES),
    }
    try:
        if setup.get("program_csv") is not None:
            program = from_csv_text(str(setup["program_csv"]), source=f"{where}, setup.program_csv",
                                    name=str(setup.get("schedule")))
            config = PipelineConfig.from_program(program, **fields)
            for key in ("stages", "micro_batches", "chunks", "splits"):
                if key in setup and setup[key] != getattr(config, key):
                    fail(f"setup.{key} = {setup[key]!r}: the embedded program has {getattr(config, key)}")
        else:
            config = PipelineConfig(stages=setup.get("stages"), micro_batches=setup.get("micro_batches"),
                                    chunks=setup.get("chunks", 1), schedule=setup.get("schedule"),
                                    splits=setup.get("splits", 1), **fields)
        config.validate()
    except SapptkError as exc:
        fail(f"setup: {exc}")
    counts = np.zeros((len(profile.body), len(MODES), config.num_virtual_stages), dtype=np.int64)
    groups = {g.name: i for i, g in enumerate(profile.body)}
    layout = data.get("layout") or []
    if not isinstance(layout, list):
        fail(f"layout = {layout!r}: expected a list of {{group, virtual_stage, mode, layers}}")
    for i, cell in enumerate(layout):
        label = f"layout[{i}]"
        if not isinstance(cell, dict) or set(cell) != {"group", "virtual_stage", "mode", "layers"}:
            fail(f"{label} = {cell!r}: expected a mapping with group, virtual_stage, mode, layers")
        if cell["group"] not in groups:
            fail(f"{label}.group = {cell['group']!r}: expected a body group of the profile ({', '.join(groups)})")
        if cell["mode"] not in MODES:
            fail(f"{label}.mode = {cell['mode']!r}: expected one of {', '.join(MODES)}")
        vs, n = cell["virtual_stage"], cell["layers"]
        if not isinstance(vs, int) or isinstance(vs, bool) or not 0 <= vs < config.num_virtual_stages:
            fail(f"{label}.virtual_stage = {vs!r}: expected 0..{config.num_virtual_stages - 1}")
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            fail(f"{label}.layers = {n!r}: expected a layer count >= 1")
        counts[groups[cell["group"]], MODES.index(cell["mode"]), vs] += n
    status = data.get("status")
    numbers = {}
    for key in ("step_time_ms", "bound_ms", "gap", "solve_seconds"):
        value = data.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                  or not math.isfinite(value)):
            fail(f"{key} = {value!r}: expected a number or null")
        numbers[key] = value
    message, plan_source = data.get("message") or "", data.get("source") or "plan file"
    if not isinstance(message, str) or not isinstance(plan_source, str):
        fail("message and source: expected text")
    try:
        return make_plan(profile, config, counts if status in _SOLVED else None, status=status,
                         step_time=numbers["step_time_ms"], bound=numbers["bound_ms"], gap=numbers["gap"],
                         solve_seconds=numbers["solve_seconds"] or 0.0, message=message, source=plan_source)
    except SapptkError as exc:
        fail(str(exc))


# --------------------------------------------------------------------- Megatron-LM
def from_megatron(profile: Profile, config: PipelineConfig, source: Any) -> Plan:
    """A plan from Megatron-LM arguments (:mod:`sapptk.formats.megatron`).

    ``source``: a layout string (``"Et*3|(tt|)*29,tL"``), a command line or list of
    arguments, or a mapping of flags. The partition comes from
    ``--pipeline-model-parallel-layout``, or else from the uniform-layout flags; recompute
    from the recompute flags (none without them). ``config`` gives the setup (stages and
    chunks must agree with the arguments). The plan is simulated (status ``"given"``).
    """
    if isinstance(source, str) and not source.lstrip().startswith("--"):
        flags: dict[str, Any] = {"pipeline-model-parallel-layout": source}
    else:
        flags = megatron.parse_args(source)
    p, v = config.stages, config.chunks
    body = profile.num_body_layers
    for name, want in (("pipeline-model-parallel-size", p), ("num-layers", body)):
        if flags.get(name) is not None and str(flags[name]) != str(want):
            what = "the setup's stages" if name.startswith("pipeline") else "the profile's body layers"
            raise ConfigError(f"--{name} = {flags[name]}: expected {want} ({what})")
    text = flags.get("pipeline-model-parallel-layout")
    try:
        if text is not None:
            stages = megatron.parse_layout(str(text))
            layers = megatron.layers_of_layout(stages, stages=p, body_layers=body, head=profile.head is not None,
                                               tail=profile.tail is not None, text=str(text))
            if len(layers) != p * v:
                raise ConfigError(f"layout {text!r}: {len(layers)} stages = {len(layers) // p} chunks per rank: the "
                                  f"setup has chunks = {v}")
        else:
            vv = int(flags.get("num-virtual-stages-per-pipeline-rank") or 1)
            if vv != v:
                raise ConfigError(f"--num-virtual-stages-per-pipeline-rank = {vv}: the setup has chunks = {v}")
            first, last = (flags.get(f"decoder-{k}-pipeline-num-layers") for k in ("first", "last"))
            layers = megatron.uniform_layers(p, v, body, None if first is None else int(first),
                                             None if last is None else int(last))
        counts = megatron.recompute_counts(profile, layers, flags)
    except ValueError as exc:
        if isinstance(exc, ConfigError):
            raise ConfigError(f"Megatron arguments: {exc}") from None
        raise ConfigError(f"Megatron arguments: {exc}") from None
    try:
        return make_plan(profile, config, counts, status="given", source="megatron")
    except ConfigError as exc:
        raise ConfigError(f"Megatron arguments: {exc}") from None


# ------------------------------------------------------------------------ torchtitan
def from_torchtitan(profile: Profile, source: Any, config: PipelineConfig | None = None, *,
                    csv: str | os.PathLike[str] | None = None) -> Plan:
    """A plan from torchtitan settings (:mod:`sapptk.formats.torchtitan`).

    ``source``: a TOML file, or its text. Stages, chunks and the schedule come from the
    file, and the micro-batches from ``[training] local_batch_size`` when present; ``config``
    gives the other fields (budget, comm, recompute, ...) and, when the file has no batch
    size, the micro-batches; where both say something they must agree. A
    ``pipeline_parallel_schedule_csv`` is read from ``csv`` when given, else relative to the
    TOML file. The plan is simulated (status ``"given"``).
    """
    from sapptk.config import PipelineConfig
    from sapptk.schedules import from_csv

    where, text, base = "<toml>", source, None
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source and "=" not in source):
        where = os.fspath(source)
        base = Path(where).parent
        try:
            text = Path(where).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{where}: cannot read the file: {exc}") from None
    if not isinstance(text, str):
        raise ConfigError(f"source = {source!r}: expected a TOML file path or TOML text")
    tt = torchtitan.read(text, where)
    p = tt.degree
    if len(tt.parts) % p:
        raise ConfigError(f"{where}: {len(tt.parts)} model parts on pipeline_parallel_degree = {p} ranks: expected a "
                          "multiple (one part per virtual stage)")
    v = len(tt.parts) // p
    layers = torchtitan.layers_of_parts(tt.parts, body_layers=profile.num_body_layers, source=where)
    m = tt.micro_batches if tt.micro_batches is not None else (None if config is None else config.micro_batches)
    if m is None:
        raise ConfigError(f"{where}: no [training] local_batch_size: pass a config for the micro-batches")
    fields: dict[str, Any] = {}
    if config is not None:
        for name, value in (("stages", p), ("chunks", v), ("micro_batches", m)):
            if getattr(config, name) != value:
                raise ConfigError(f"{where}: {name} = {value} in the file, {getattr(config, name)} in the config")
        fields = {f: getattr(config, f) for f in ("memory_budget", "constant_memory", "comm", "recompute")}
    if tt.schedule_csv is not None:
        csv_path = Path(csv) if csv is not None else (base / tt.schedule_csv if base else Path(tt.schedule_csv))
        program = from_csv(csv_path)
        setup = PipelineConfig.from_program(program, **fields)
        if (setup.stages, setup.chunks, setup.micro_batches) != (p, v, m):
            raise ConfigError(f"{where}: the schedule CSV {csv_path} runs p = {setup.stages}, v = {setup.chunks}, "
                              f"m = {setup.micro_batches}: the file says p = {p}, v = {v}, m = {m}")
    else:
        schedule = torchtitan.sapptk_schedule(tt.schedule, v, where)
        setup = PipelineConfig(stages=p, micro_batches=m, chunks=v, schedule=schedule, **fields)
    try:
        setup.validate()
        counts = torchtitan.ac_counts(profile, layers, tt.ac, placement=setup.program().placement, source=where)
        return make_plan(profile, setup, counts, status="given", source="torchtitan")
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc}") from None
