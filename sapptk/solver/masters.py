"""The two CP-SAT master problems of the balancer.

Both describe the same set of plans and expose the same small interface to the search
(:mod:`sapptk.solver.search`): a ``model``, the step-time variable ``z`` (in ticks), ``variables``
to read a solution from, ``counts_of`` to turn a solution into a layer assignment,
``hint``, ``add_cut`` for a path, and linear expressions of the two tie-break objectives.

* :class:`LayoutMaster` (the default) picks one enumerated layout per device
  (:mod:`sapptk.solver.layouts`); memory is implicit in the layouts.
* :class:`LayerMaster` has the layer counts ``x[g, r, vs]`` as variables and one memory row
  per device and live point; it needs no enumeration, so it is the fallback when there are
  too many layouts (many chunks per device), and it finds a first plan when no even split
  fits the budget. It is exact too, only its LP relaxation is weaker.
"""

from __future__ import annotations

import numpy as np
from ortools.sat.python import cp_model

from sapptk import checks
from sapptk.costs import LayerCoefficients
from sapptk.profile import MODES
from sapptk.schedules.program import Program
from sapptk.solver.layouts import DeviceLayouts, path_lengths
from sapptk.solver.paths import MemoryModel, memory_model, path_key

__all__ = ["LayerMaster", "LayoutMaster", "Master"]

Z_MAX = checks.MAX_SOLVER_INTEGER
"""Upper end of the step-time variable's domain, in ticks (far above any real step)."""


class Master:
    """What the search needs from a master problem (see the module docstring)."""

    model: cp_model.CpModel
    z: cp_model.IntVar
    variables: list[cp_model.IntVar]
    overhead: cp_model.LinearExprT
    deviation: cp_model.LinearExprT

    def __init__(self, coef: LayerCoefficients, program: Program, comm_ticks: int) -> None:
        self.coef = coef
        self.program = program
        self.comm_ticks = comm_ticks
        self.model = cp_model.CpModel()
        self.z = self.model.new_int_var(0, Z_MAX, "step_ticks")
        self.cuts: set[bytes] = set()

    def objective_vars(self) -> None:
        """Integer variables equal to the two tie-break objectives (domains tightened by the search)."""
        self.overhead_var = self.model.new_int_var(0, Z_MAX, "overhead")
        self.model.add(self.overhead_var == self.overhead)
        self.deviation_var = self.model.new_int_var(0, Z_MAX, "deviation")
        self.model.add(self.deviation_var == self.deviation)

    def set_domain(self, var: cp_model.IntVar, lo: int, hi: int) -> None:
        """Replace the domain of a variable created with a plain interval (no new constraint)."""
        dom = self.model.proto.variables[var.index].domain
        dom[0], dom[1] = int(lo), int(hi)

    def counts_of(self, values: list[int]) -> np.ndarray:
        raise NotImplementedError

    def hint(self, counts: np.ndarray | None) -> None:
        raise NotImplementedError

    def path_terms(self, sig: np.ndarray, crossings: int) -> tuple[list[cp_model.IntVar], list[int], int]:
        raise NotImplementedError

    def add_cut(self, sig: np.ndarray, crossings: int) -> bool:
        """Add ``z ≥ length of the path (sig, crossings)`` unless already there; True if added."""
        key = path_key(sig, crossings)
        if key in self.cuts:
            return False
        self.cuts.add(key)
        variables, coefs, const = self.path_terms(sig, crossings)
        self.model.add(self.z >= cp_model.LinearExpr.weighted_sum(variables, coefs) + const)
        return True

    def _contiguity(self, layers_of: list[list[cp_model.LinearExprT]]) -> None:
        """Body groups contiguous and in model order: group g+1 holds layers up to stage vs
        only if group g is complete by then. ``layers_of[g][vs]`` = layers of g on vs."""
        coef, model = self.coef, self.model
        G = len(coef.counts)
        V = len(coef.fixed_forward)
        for g in range(G - 1):
            prev = None
            upto_g: cp_model.LinearExprT = 0
            upto_next: cp_model.LinearExprT = 0
            for vs in range(V - 1):
                upto_g = upto_g + layers_of[g][vs]
                upto_next = upto_next + layers_of[g + 1][vs]
                done = model.new_bool_var(f"done_{g}_{vs}")
                model.add(upto_g == int(coef.counts[g])).only_enforce_if(done)
                model.add(upto_next == 0).only_enforce_if(~done)
                if prev is not None:
                    model.add_implication(prev, done)
                prev = done


class LayoutMaster(Master):
    """One enumerated layout per device: ``y[d, o]`` booleans, exactly one per device.

    ``durations``: also define integer variables for each virtual stage's forward, backward
    and weight time (linked to ``y``) and write path cuts over them (at most 3·V small
    count coefficients) instead of over ``y`` (one large coefficient per layout). The two
    are the same constraints; CP-SAT proves one-chunk schedules much faster with the
    duration form and two-chunk ones faster with the layout form (measured on the
    benchmarks).
    """

    def __init__(
        self,
        coef: LayerCoefficients,
        program: Program,
        comm_ticks: int,
        layouts: list[DeviceLayouts],
        *,
        durations: bool = False,
    ) -> None:
        super().__init__(coef, program, comm_ticks)
        model = self.model
        self.layouts = layouts
        self.y: list[list[cp_model.IntVar]] = []
        for d, lay in enumerate(layouts):
            ys = [model.new_bool_var(f"y_{d}_{o}") for o in range(len(lay))]
            model.add_exactly_one(ys)
            self.y.append(ys)
        self.variables = [v for ys in self.y for v in ys]
        self.offsets = np.cumsum([0] + [len(lay) for lay in layouts])
        G = len(coef.counts)
        V = len(coef.fixed_forward)
        layers_of: list[list[cp_model.LinearExprT]] = [[0] * V for _ in range(G)]
        for d, lay in enumerate(layouts):
            for c, vs in enumerate(lay.stages):
                for g in range(G):
                    col = lay.comp[:, c, g]
                    nz = np.flatnonzero(col)
                    layers_of[g][vs] = cp_model.LinearExpr.weighted_sum([self.y[d][o] for o in nz], col[nz].tolist())
        for g in range(G):
            model.add(sum(layers_of[g]) == int(coef.counts[g]))
        self._contiguity(layers_of)
        self.overhead = self._per_layout(lambda lay: lay.overhead)
        self.deviation = self._per_layout(lambda lay: lay.deviation)
        self.objective_vars()
        self.durations: dict[int, cp_model.IntVar] | None = None
        if durations:
            self.durations = {}
            for d, lay in enumerate(layouts):
                for c, vs in enumerate(lay.stages):
                    for k, values in enumerate((lay.forward[:, c], lay.backward[:, c], lay.weight[:, c])):
                        lo = int(values.min())
                        var = model.new_int_var(lo, int(values.max()), f"dur{k}_{vs}")
                        nz = np.flatnonzero(values - lo)
                        model.add(var == cp_model.LinearExpr.weighted_sum(
                            [self.y[d][o] for o in nz], (values[nz] - lo).tolist()) + lo)
                        self.durations[k * V + vs] = var

    def _per_layout(self, values) -> cp_model.LinearExprT:  # noqa: ANN001 - a small lambda
        coefs = np.concatenate([values(lay) for lay in self.layouts])
        nz = np.flatnonzero(coefs)
        return cp_model.LinearExpr.weighted_sum([self.variables[i] for i in nz], coefs[nz].tolist())

    def path_terms(self, sig: np.ndarray, crossings: int) -> tuple[list[cp_model.IntVar], list[int], int]:
        if self.durations is not None:
            nz = np.flatnonzero(sig)
            return [self.durations[int(i)] for i in nz], sig[nz].tolist(), crossings * self.comm_ticks
        lengths = [row[0] for row in path_lengths(self.layouts, sig[None, :])]
        coefs = np.concatenate(lengths)
        # shift each device's lengths by its minimum: one layout per device is always chosen
        const = crossings * self.comm_ticks
        for d, length in enumerate(lengths):
            lo = int(length.min())
            coefs[self.offsets[d] : self.offsets[d + 1]] -= lo
            const += lo
        nz = np.flatnonzero(coefs)
        return [self.variables[i] for i in nz], coefs[nz].tolist(), const

    def chosen(self, values: list[int]) -> list[int]:
        vals = np.asarray(values)
        return [int(np.flatnonzero(vals[self.offsets[d] : self.offsets[d + 1]])[0]) for d in range(len(self.layouts))]

    def counts_of(self, values: list[int]) -> np.ndarray:
        G, R = self.coef.allowed.shape
        V = len(self.coef.fixed_forward)
        counts = np.zeros((G, R, V), dtype=np.int64)
        for d, o in enumerate(self.chosen(values)):
            lay = self.layouts[d]
            for c, vs in enumerate(lay.stages):
                counts[:, :, vs] = lay.mix[o, c]
        return counts

    def hint(self, counts: np.ndarray | None) -> None:
        self.model.clear_hints()
        if counts is None:
            return
        for d, lay in enumerate(self.layouts):
            o = lay.find(self.coef, counts)
            if o is None:
                continue
            for i, var in enumerate(self.y[d]):
                self.model.add_hint(var, int(i == o))


class LayerMaster(Master):
    """Layer counts ``x[g, r, vs]`` as variables; exact memory rows per device and live point.

    ``budget`` is in memory units × the live-point scale of ``memory`` (default
    :func:`~sapptk.solver.paths.memory_model`).
    """

    def __init__(
        self,
        coef: LayerCoefficients,
        program: Program,
        comm_ticks: int,
        *,
        budget: int | None,
        allow_empty: bool,
        memory: MemoryModel | None = None,
    ) -> None:
        super().__init__(coef, program, comm_ticks)
        model = self.model
        G, R = coef.allowed.shape
        V = len(coef.fixed_forward)
        self.grid: dict[tuple[int, int, int], cp_model.IntVar] = {}
        for g in range(G):
            for r in range(R):
                if coef.allowed[g, r]:
                    for vs in range(V):
                        self.grid[g, r, vs] = model.new_int_var(0, int(coef.counts[g]), f"x_{g}_{MODES[r]}_{vs}")
        self.variables = list(self.grid.values())
        self.index = np.array(list(self.grid), dtype=np.int64).reshape(-1, 3)
        layers_of = [[sum(self.grid[g, r, vs] for r in range(R) if (g, r, vs) in self.grid) for vs in range(V)]
                     for g in range(G)]
        for g in range(G):
            model.add(sum(layers_of[g]) == int(coef.counts[g]))
        self._contiguity(layers_of)
        # a cell holds select-only or comm-only layers, never both (no MindFormers spelling)
        sel, com = MODES.index("select"), MODES.index("comm")
        for g in range(G):
            for vs in range(V):
                if (g, sel, vs) in self.grid and (g, com, vs) in self.grid:
                    uses_select = model.new_bool_var(f"select_not_comm_{g}_{vs}")
                    model.add(self.grid[g, com, vs] == 0).only_enforce_if(uses_select)
                    model.add(self.grid[g, sel, vs] == 0).only_enforce_if(uses_select.Not())
        self.layers = [sum(layers_of[g][vs] for g in range(G)) for vs in range(V)]
        if not allow_empty:
            for vs in range(V):
                if coef.fixed_layers[vs] == 0:
                    model.add(self.layers[vs] >= 1)
        # memory: one row per device and Pareto-maximal live point, scaled to integers
        mem = memory_model(program) if memory is None else memory
        self.peaks: list[tuple[int, cp_model.LinearExprT]] = []
        params = np.broadcast_to(coef.params[:, None], (G, R))
        for d, rows in enumerate(mem.rows):
            stages = program.device_stages[d]
            static = sum(self.stage_expr(params, coef.fixed_params, vs) for vs in stages) + coef.constant
            acts = [self.stage_expr(coef.activation, coef.fixed_activation, vs) for vs in stages]
            self.peaks.append((d, mem.scale * static))
            for row in rows:
                expr = mem.scale * static + sum(int(row[c]) * acts[c] for c in range(len(stages)) if row[c])
                self.peaks.append((d, expr))
        self.scale = mem.scale
        if budget is not None:
            for _, expr in self.peaks:
                model.add(expr <= budget)
        g_, r_, _ = self.index.T
        self.overhead = cp_model.LinearExpr.weighted_sum(self.variables, coef.overhead[g_, r_].tolist())
        total = int(coef.counts.sum())
        devs = []
        for vs in range(V):
            dv = model.new_int_var(0, V * total, f"deviation_{vs}")
            model.add(dv >= V * self.layers[vs] - total)
            model.add(dv >= total - V * self.layers[vs])
            devs.append(dv)
        self.deviation = sum(devs)
        self.objective_vars()

    def stage_expr(self, table: np.ndarray, fixed: np.ndarray, vs: int) -> cp_model.LinearExprT:
        """``Σ_g,r table[g, r] · x[g, r, vs] + fixed[vs]`` as a linear expression."""
        terms = [int(table[g, r]) * var for (g, r, v), var in self.grid.items() if v == vs and table[g, r]]
        return sum(terms) + int(fixed[vs])

    def path_terms(self, sig: np.ndarray, crossings: int) -> tuple[list[cp_model.IntVar], list[int], int]:
        c = self.coef
        V = len(c.fixed_forward)
        a, b, w = sig[:V], sig[V : 2 * V], sig[2 * V :]
        g, r, vs = self.index.T
        coefs = a[vs] * c.forward[g] + b[vs] * c.backward[g, r] + w[vs] * c.weight[g]
        const = int(a @ c.fixed_forward + b @ c.fixed_backward + w @ c.fixed_weight) + crossings * self.comm_ticks
        nz = np.flatnonzero(coefs)
        return [self.variables[i] for i in nz], coefs[nz].tolist(), const

    def counts_of(self, values: list[int]) -> np.ndarray:
        G, R = self.coef.allowed.shape
        counts = np.zeros((G, R, len(self.coef.fixed_forward)), dtype=np.int64)
        g, r, vs = self.index.T
        counts[g, r, vs] = np.asarray(values, dtype=np.int64)
        return counts

    def hint(self, counts: np.ndarray | None) -> None:
        self.model.clear_hints()
        if counts is None:
            return
        g, r, vs = self.index.T
        for var, val in zip(self.variables, counts[g, r, vs].tolist(), strict=True):
            self.model.add_hint(var, val)
