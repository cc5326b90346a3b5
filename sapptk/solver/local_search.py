"""The primal heuristic: an iterated local search over one enumerated layout per device.

A state picks one layout per device (:class:`~sapptk.solver.layouts.DeviceLayouts`), so
every state fits the budget by construction. Three kinds of move:

* **layer moves** shift one body layer from virtual stage ``a`` to ``b`` (groups follow in
  model order); every device whose composition changes takes its layout with the least
  total backward time for the new composition, the others keep theirs;
* **layout switches** give one device another kept layout of the same composition
  (recompute modes traded between its stages);
* **range shifts** move one layer from chunk ``c1`` to chunk ``c2`` on every device of a
  range ``i..j`` at once (each device alone would unbalance its chunk's stages).

Every neighbour that might be faster is timed exactly (batched longest paths,
:meth:`Problem.critical_paths`), in batches whose memory is bounded. *Might be faster*: the
step time is at least the length of any path, so a neighbour whose durations make a known
path (one of the critical paths met so far) as long as the current step cannot beat it and
is never timed; the others are timed in order of that bound, and the critical paths of the
nearest misses of each batch join what is known. The best improving neighbour of a batch is taken (first
improvement by batches, so a round over thousands of moves on a large pipeline does not
wait for all of them). From the local optimum, each *kick* makes a few random moves, climbs
again on a sample of the moves, and is kept when it ends better; after a number of kicks
without improvement the kicks grow, and when the largest stay idle too the search stops
(or at ``until``, or when its budget of evaluations — deterministic mode: counted, never
timed — is spent). It only supplies incumbents: bounds and proofs come from the masters
and the relaxation.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from sapptk.solver.paths import path_key

if TYPE_CHECKING:
    from sapptk.solver.clock import Clock
    from sapptk.solver.incumbent import Incumbent
    from sapptk.solver.layouts import DeviceLayouts
    from sapptk.solver.problem import Problem

__all__ = ["LocalSearch"]

LEARN_PER_BATCH = 2
"""Critical paths learnt from each batch of neighbours that held no improvement."""


class _Compositions:
    """Per device: its layouts' compositions as integer keys, the cheapest layout of each
    composition, and the layouts sharing each composition."""

    def __init__(self, layouts: list[DeviceLayouts], counts: np.ndarray) -> None:
        chunks = max((len(lay.stages) for lay in layouts), default=1)
        base = [int(n) + 1 for n in counts] * chunks  # one digit per (chunk, group) entry
        size = 1
        for b in base:
            size *= b
        self.numeric = size < 2**62  # keys as integers (vectorised lookups), else as bytes
        weights = [1]
        for b in base[:-1]:
            weights.append(weights[-1] * b)
        self.weights = np.array(weights, dtype=np.int64) if self.numeric else None
        self.sorted_keys: list[np.ndarray] = []  # per device: distinct composition keys, sorted
        self.cheapest: list[np.ndarray] = []  # per device: the cheapest layout of each of them
        self.tables: list[dict[bytes, int]] = []  # per device, when keys are bytes
        self.same: list[list[np.ndarray]] = []  # per device, per layout: the layouts of its composition
        for lay in layouts:
            flat = lay.comp.reshape(len(lay), -1)
            if self.numeric:
                keys = flat @ self.weights[: flat.shape[1]]
            else:
                keys = np.unique(flat, axis=0, return_inverse=True)[1].ravel().astype(np.int64)
            order = np.lexsort((np.arange(len(lay)), lay.backward.sum(axis=1), keys))
            first = np.r_[True, keys[order][1:] != keys[order][:-1]] if len(order) else np.zeros(0, bool)
            self.sorted_keys.append(keys[order][first])
            self.cheapest.append(order[first])
            if not self.numeric:
                self.tables.append({flat[o].tobytes(): int(o) for o in order[first]})
            same = [np.zeros(0, np.int64)] * len(lay)
            for grp in np.split(order, np.flatnonzero(first)[1:]):
                for o in grp.tolist():
                    same[o] = grp
            self.same.append(same)

    def lookup(self, d: int, comps: np.ndarray) -> np.ndarray:
        """Cheapest layout of device ``d`` for each composition ``comps`` (n, chunks, G); -1 if none."""
        if not len(comps):
            return np.zeros(0, np.int64)
        flat = comps.reshape(len(comps), -1)
        if self.numeric:
            sk = self.sorted_keys[d]
            if not len(sk):
                return np.full(len(comps), -1, np.int64)
            keys = flat @ self.weights[: flat.shape[1]]
            pos = np.minimum(np.searchsorted(sk, keys), len(sk) - 1)
            return np.where(sk[pos] == keys, self.cheapest[d][pos], -1)
        table = self.tables[d]
        return np.array([table.get(np.ascontiguousarray(row).tobytes(), -1) for row in flat], dtype=np.int64)


class LocalSearch:
    """Iterated local search from the incumbent (see the module docstring)."""

    def __init__(
        self,
        problem: Problem,
        incumbent: Incumbent,
        layouts: list[DeviceLayouts],
        *,
        clock: Clock,
        seed: int,
        deterministic: bool,
    ) -> None:
        self.problem = problem
        self.incumbent = incumbent
        self.layouts = layouts
        self.clock = clock
        self.deterministic = deterministic
        self.options = problem.options
        self.rng = np.random.default_rng(seed)
        coef = problem.coef
        self.V = len(coef.fixed_forward)
        self.D = len(layouts)
        self.G = len(coef.counts)
        self.starts = np.concatenate([[0], np.cumsum(coef.counts)])
        self.floor = np.where((coef.fixed_layers > 0) | problem.allow_empty, 0, 1)
        self.stages = [np.asarray(lay.stages) for lay in layouts]
        self.comps = _Compositions(layouts, coef.counts)
        self.moves = np.array([(a, b) for a in range(self.V) for b in range(self.V) if a != b], dtype=np.int64)
        self.shifts = self._range_shifts()
        self.batch = min(self.options.batch, problem.paths.batch_size(self.options.evaluation_bytes))
        # neighbours built at a time: their layer vectors and compositions within evaluation_bytes / 2
        self.block = max(256, self.options.evaluation_bytes // (16 * self.V * (self.G + 2)))
        # the known paths (rows: signature over [F; BI; W] of every vs; length adds crossings · comm)
        known = [(problem.paths.device_sig[d], 0) for d in range(problem.program.stages)]
        known += list(incumbent.paths.values())
        self.sigs = np.stack([sig for sig, _ in known]).astype(np.int64)
        self.lags = np.array([c for _, c in known], dtype=np.int64) * problem.comm_ticks
        self.seen = {path_key(sig, c) for sig, c in known}
        self.evaluations = 0
        self.budget: int | None = None  # evaluations allowed (deterministic mode)
        self.until = clock.deadline

    # ----------------------------------------------------------- state views
    def counts_of(self, pick: np.ndarray) -> np.ndarray:
        """The layer assignment of a state (one layout index per device)."""
        counts = np.zeros(self.problem.coef.shape, dtype=np.int64)
        for lay, st, o in zip(self.layouts, self.stages, pick.tolist(), strict=True):
            counts[:, :, st] = np.moveaxis(lay.mix[o], 0, -1)
        return counts

    def pick_of(self, counts: np.ndarray) -> np.ndarray | None:
        """A state holding ``counts`` (or one no slower: same compositions, no longer backwards)."""
        pick = [lay.find(self.problem.coef, counts) for lay in self.layouts]
        if any(o is None for o in pick):
            return None
        return np.asarray(pick, dtype=np.int64)

    def layers(self, pick: np.ndarray) -> np.ndarray:
        """Body layers per virtual stage of a state."""
        vec = np.zeros(self.V, dtype=np.int64)
        for lay, st, o in zip(self.layouts, self.stages, pick.tolist(), strict=True):
            vec[st] = lay.comp[o].sum(axis=1)
        return vec

    def costs(self, picks: np.ndarray) -> np.ndarray:
        """Per-vs [F; BI; W] costs of a batch of states (n, D) → (n, 3V)."""
        V = self.V
        out = np.zeros((len(picks), 3 * V), dtype=np.int64)
        for d, (lay, st) in enumerate(zip(self.layouts, self.stages, strict=True)):
            o = picks[:, d]
            out[:, st] = lay.forward[o]
            out[:, V + st] = lay.backward[o]
            out[:, 2 * V + st] = lay.weight[o]
        return out

    # -------------------------------------------------------------- moves
    def compositions(self, vecs: np.ndarray) -> np.ndarray:
        """Layers of each group on each virtual stage, (n, V, G), for layer vectors (n, V)."""
        bounds = np.concatenate([np.zeros((len(vecs), 1), np.int64), np.cumsum(vecs, axis=1)], axis=1)
        lo = np.maximum(bounds[:, :-1, None], self.starts[None, None, :-1])
        hi = np.minimum(bounds[:, 1:, None], self.starts[None, None, 1:])
        return np.clip(hi - lo, 0, None)

    def rebuild(self, pick: np.ndarray, vecs: np.ndarray) -> np.ndarray:
        """States with layer vectors ``vecs`` (n, V): a device whose composition is unchanged
        keeps its layout, the others take their cheapest; rows that cannot be built are dropped."""
        if not len(vecs):
            return np.zeros((0, self.D), np.int64)
        comps = self.compositions(vecs)
        now = self.compositions(self.layers(pick)[None, :])[0]
        picks = np.repeat(pick[None, :], len(vecs), axis=0)
        ok = np.ones(len(vecs), dtype=bool)
        for d, st in enumerate(self.stages):
            mine = comps[:, st, :]
            changed = np.flatnonzero((mine != now[st][None]).any(axis=(1, 2)))
            if not len(changed):
                continue
            found = self.comps.lookup(d, mine[changed])
            picks[changed, d] = found
            ok[changed[found < 0]] = False
        return picks[ok]

    def cheapest_for(self, vec: np.ndarray) -> np.ndarray | None:
        """The state with layer vector ``vec`` and every device on its cheapest layout for it."""
        comps = self.compositions(vec[None, :])
        pick = np.array([self.comps.lookup(d, comps[:, st, :])[0] for d, st in enumerate(self.stages)])
        return None if (pick < 0).any() else pick

    def layer_moves(self, pick: np.ndarray, moves: np.ndarray) -> np.ndarray:
        """States one layer move (a → b) away, for each (a, b) row of ``moves`` that is allowed."""
        vec = self.layers(pick)
        moves = moves[vec[moves[:, 0]] > self.floor[moves[:, 0]]]
        vecs = np.repeat(vec[None, :], len(moves), axis=0)
        rows = np.arange(len(moves))
        vecs[rows, moves[:, 0]] -= 1
        vecs[rows, moves[:, 1]] += 1
        return self.rebuild(pick, vecs)

    def _range_shifts(self) -> np.ndarray:
        """The range shifts, as rows (c1, c2, i, j): one layer from chunk c1 to chunk c2 on every
        device i..j (j > i; a range of one device is a plain layer move) — the coordinated moves
        that single layer moves cannot make one at a time (each alone unbalances its chunk)."""
        chunks = min((len(st) for st in self.stages), default=0)
        rows = [(c1, c2, i, j) for c1 in range(chunks) for c2 in range(chunks) if c1 != c2
                for i in range(self.D) for j in range(i + 1, self.D)]
        return np.array(rows, dtype=np.int64).reshape(-1, 4)

    def range_shifts(self, pick: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """States one range shift (rows of :attr:`shifts`) away, where every stage keeps its floor."""
        c1, c2, i, j = self.shifts[rows].T
        devices = np.arange(self.D)
        inside = (devices[None, :] >= i[:, None]) & (devices[None, :] <= j[:, None])  # (n, D)
        vecs = np.repeat(self.layers(pick)[None, :], len(rows), axis=0)
        for d, st in enumerate(self.stages):
            hit = np.flatnonzero(inside[:, d])
            np.subtract.at(vecs, (hit, st[c1[hit]]), 1)
            np.add.at(vecs, (hit, st[c2[hit]]), 1)
        return self.rebuild(pick, vecs[(vecs >= self.floor[None, :]).all(axis=1)])

    def switches(self, pick: np.ndarray) -> np.ndarray:
        """States with one device on another layout of the same composition."""
        out = []
        for d, o in enumerate(pick.tolist()):
            for other in self.comps.same[d][o].tolist():
                if other != o:
                    alt = pick.copy()
                    alt[d] = other
                    out.append(alt)
        return np.array(out, dtype=np.int64).reshape(-1, self.D)

    # ----------------------------------------------------------- evaluation
    def out_of_work(self) -> bool:
        if self.clock.expired():
            return True
        if self.budget is not None:
            return self.evaluations >= self.budget
        return self.clock.now() >= self.until

    def timed(self, picks: np.ndarray, costs: np.ndarray | None = None) -> np.ndarray:
        """Exact step ticks of states (no paths: :meth:`learn` finds those)."""
        costs = self.costs(picks) if costs is None else costs
        self.evaluations += len(picks)
        return self.problem.step_ticks(costs)

    def learn(self, costs: np.ndarray) -> None:
        """Add the critical paths of these cost vectors to the known paths."""
        _, found = self.problem.critical_paths(costs)
        new = []
        for sig, crossings in found:
            key = path_key(sig, crossings)
            if key not in self.seen:
                self.seen.add(key)
                new.append((sig, crossings))
        if new:
            self.sigs = np.concatenate([self.sigs, np.stack([sig for sig, _ in new])])
            self.lags = np.concatenate([self.lags, np.array([c for _, c in new], np.int64) * self.problem.comm_ticks])

    def path_bound(self, costs: np.ndarray) -> np.ndarray:
        """A lower bound on the step ticks of each cost vector: its longest known path."""
        return (costs @ self.sigs.T + self.lags[None, :]).max(axis=1)

    def best_neighbour(self, current_z: int, candidates: np.ndarray) -> tuple[np.ndarray | None, int]:
        """The best of ``candidates`` in the first batch holding an improvement on ``current_z``;
        candidates whose known-path bound is not below ``current_z`` are never timed."""
        costs = self.costs(candidates)
        bound = self.path_bound(costs)
        order = np.argsort(bound, kind="stable")
        order = order[bound[order] < current_z]
        while len(order) and not self.out_of_work():
            chunk, order = order[: self.batch], order[self.batch :]
            steps = self.timed(candidates[chunk], costs[chunk])
            j = int(np.argmin(steps))
            if steps[j] < current_z:
                return candidates[chunk[j]], int(steps[j])
            if len(order):
                # the critical paths of the nearest misses may rule out much of the rest
                near = chunk[np.argsort(steps, kind="stable")[:LEARN_PER_BATCH]]
                self.learn(costs[near])
                order = order[self.path_bound(costs[order]) < current_z]
        return None, current_z

    def climb(self, pick: np.ndarray, z: int, *, sample: int | None = None) -> tuple[np.ndarray, int]:
        """Hill climb from ``pick``: layer moves (``sample`` random ones per round, or all) and
        layout switches, until no neighbour is faster or the work runs out."""
        while not self.out_of_work():
            if sample is None:
                moves = self.moves[self.rng.permutation(len(self.moves))]
                shifts = np.arange(len(self.shifts))
            else:
                moves = self.moves[self.rng.choice(len(self.moves), min(sample, len(self.moves)), replace=False)]
                shifts = self.rng.choice(len(self.shifts), min(sample, len(self.shifts)), replace=False)
            better = None
            for candidates in self.neighbours(pick, moves, shifts):
                better, better_z = self.best_neighbour(z, candidates)
                if better is not None or self.out_of_work():
                    break
            if better is None:
                break
            pick, z = better, better_z
            self.report(pick, z)
        return pick, z

    def neighbours(self, pick: np.ndarray, moves: np.ndarray, shifts: np.ndarray) -> Iterator[np.ndarray]:
        """The neighbours of ``pick`` (switches, then ``moves``, then ``shifts``), in blocks of
        about :attr:`block` states, so that their layer vectors take bounded memory."""
        block, held, size = self.block, [self.switches(pick)], 0
        size = len(held[0])
        parts = [(self.layer_moves, moves[k : k + block]) for k in range(0, len(moves), block)]
        parts += [(self.range_shifts, shifts[k : k + block]) for k in range(0, len(shifts), block)]
        for build, rows in parts:
            if size >= block:
                yield np.concatenate(held)
                held, size = [], 0
            states = build(pick, rows)
            held.append(states)
            size += len(states)
        if size:
            yield np.concatenate(held)

    def report(self, pick: np.ndarray, z: int) -> None:
        """Hand a state to the incumbent when it beats it (its critical path joins the pool)."""
        if self.incumbent.ticks is None or z < self.incumbent.ticks:
            counts = self.counts_of(pick)
            self.incumbent.evaluate([counts])
            self.incumbent.offer(counts, z)

    def kick(self, pick: np.ndarray, growth: int = 1) -> np.ndarray | None:
        """A few random moves from ``pick`` (``kick_moves`` of them, times ``growth``): layer
        moves, and layout switches where a device has a choice."""
        low, high = self.options.kick_moves
        for _ in range(growth * int(self.rng.integers(low, high + 1))):
            if self.rng.random() < 0.5:
                d = int(self.rng.integers(self.D))
                same = self.comps.same[d][int(pick[d])]
                if len(same) > 1:
                    pick = pick.copy()
                    pick[d] = int(same[self.rng.integers(len(same))])
                    continue
            if not len(self.moves):  # one virtual stage: no layer can move, only layouts switch
                continue
            vec = self.layers(pick)
            a, b = self.moves[int(self.rng.integers(len(self.moves)))]
            if vec[a] > self.floor[a]:
                vec[a] -= 1
                vec[b] += 1
                rebuilt = self.rebuild(pick, vec[None, :])
                if len(rebuilt):
                    pick = rebuilt[0]
        return pick

    # ----------------------------------------------------------------- run
    def run(self, until: float) -> None:
        """Improve the incumbent until ``until`` (a ``perf_counter`` time; deterministic: a
        count of evaluations in proportion to the time limit's share instead)."""
        opts = self.options
        self.until = until
        if self.deterministic:
            self.budget = int(opts.deterministic_evaluations_per_second * self.clock.limit * opts.local_search_share)
        inc = self.incumbent
        if inc.counts is None:
            return
        # 1. start: the incumbent, or its layer vector with every device on its cheapest layout
        candidates = [p for p in (self.pick_of(inc.counts), self.cheapest_for(inc.counts.sum(axis=(0, 1))))
                      if p is not None]
        if not candidates:
            return
        steps = self.timed(np.stack(candidates))
        i = int(np.argmin(steps))
        current, current_z = candidates[i], int(steps[i])
        self.report(current, current_z)
        # 2. climb to a local optimum on every move
        current, current_z = self.climb(current, current_z)
        # 3. kicks: perturb, climb on a sample of the moves, keep what ends better; when a kick
        #    size stays idle for long, the kicks grow (up to max_kick_growth times)
        idle, growth = 0, 1
        idle_limit = max(1, int(opts.idle_kicks_per_stage * self.V))
        while not self.out_of_work():
            if idle >= idle_limit:
                if growth >= opts.max_kick_growth:
                    break
                idle, growth = 0, 2 * growth
            idle += 1
            kicked = self.kick(current, growth)
            if kicked is None or np.array_equal(kicked, current):
                continue
            z = int(self.timed(kicked[None, :])[0])
            pick, z = self.climb(kicked, z, sample=opts.sample_per_stage * self.V)
            if z < current_z:
                current, current_z = self.climb(pick, z)
                idle, growth = 0, 1
