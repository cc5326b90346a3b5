"""A choice's balances: a batch of setups through the sweep engine's executors, with the cache.

Each setup of a batch is balanced by :func:`sapptk.sweeps.solving.solve_point` (serial,
processes or Dask: the batches do not depend on the executor, so every executor gives the same
frame), starting from the fastest plan so far of the same shape (stages, chunks, body groups),
or from its own plan for a second balance. A twin already balanced lends its result; a
``cache`` folder keeps every balanced row (Parquet), so an interrupted choice resumes. A
balance gets ``setup_time_limit`` seconds (``retry`` times that for a second one), never past
the call's deadline, and the call's stop event; a balance cut short by either is not cached.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any

from sapptk.choosing.records import candidate_of, record, record_retry
from sapptk.errors import SapptkError
from sapptk.request import SolveRequest
from sapptk.sweeps.cache import LAYOUT_COLUMN, Cache
from sapptk.sweeps.executors import default_workers, open_executor
from sapptk.sweeps.frame import input_row
from sapptk.sweeps.grid import CONFIG_FIELDS, point_key, profile_digest
from sapptk.sweeps.solving import Layout, PointResult, SweepTask, no_plan, solve_point

if TYPE_CHECKING:
    from sapptk.choosing.run import ChoiceRun
    from sapptk.choosing.setups import Candidate

__all__ = ["Balancer"]


class Balancer:
    """Runs the batches of one choice (opened on the first batch, closed with ``stack``)."""

    def __init__(self, *, setup_time_limit: float, retry: float, seed: int, deterministic: bool, executor: Any,
                 workers: int | None, batch: int, cache: Any, dp_bandwidth: float | None, stack: ExitStack) -> None:
        self.options = {"time_limit": float(setup_time_limit), "seed": int(seed), "deterministic": bool(deterministic)}
        self.retry, self.executor, self.workers, self.batch = retry, executor, workers, batch
        self.bw, self.stack = dp_bandwidth, stack
        self.runner: Any = None
        self.per_solve = 1
        self.seeds: dict[tuple[int, int, int], tuple[float, list]] = {}  # the fastest plan of each shape
        self.digests: dict[int, str] = {}
        self.store = Cache(cache) if cache is not None else None
        self.cached: dict[str, dict[str, Any]] = {}
        if self.store is not None:
            frame = self.store.read()
            if len(frame):
                for rec in frame[~frame["status"].astype(object).eq("error")].to_dict("records"):
                    self.cached[rec["key"]] = rec
            self.store.open()
            stack.callback(self.store.close)

    def close(self) -> None:
        if self.store is not None:
            self.store.compact()

    def opts(self, c: Candidate) -> dict[str, Any]:
        """The solver options of ``c``'s next balance (the cache key's; a second one longer)."""
        return {**self.options, "time_limit": self.retry * self.options["time_limit"]} if c.retry else self.options

    def balance(self, run: ChoiceRun, chosen: list[int]) -> None:
        """Balance the setups ``chosen`` (indices of ``run.candidates``), record their rows in batch
        order (the same frame whatever the executor) and tell ``run`` after each."""
        candidates = run.candidates
        tasks = []
        for i in chosen:
            c = candidates[i]
            cfg = c.setup.config
            digest = self.digests.setdefault(id(c.profile), profile_digest(c.profile))
            key = point_key(c.profile.name, digest, {f: getattr(cfg, f) for f in CONFIG_FIELDS}, self.opts(c))
            c.row["key"] = key
            shape_key = (cfg.stages, cfg.chunks, len(c.profile.body))
            if c.retry and c.counts is not None:
                start = Layout(c.counts)  # its own plan: the second balance starts where the first ended
            else:
                start = Layout(self.seeds[shape_key][1]) if shape_key in self.seeds else None
            tasks.append((key, c, digest, start))
        results: dict[str, PointResult] = {}
        for key, c, _d, _s in tasks:
            done = c.twin.retry_result if c.retry else c.twin.result
            if done is not None and key not in self.cached:
                results[key] = done
        left = [t for t in tasks if t[0] not in self.cached and t[0] not in results]
        for key, _c, _d, _s in tasks:
            if key in self.cached:
                rec = self.cached[key]
                results[key] = PointResult.from_row(rec, Layout.from_json(rec.get(LAYOUT_COLUMN)))
        if left:
            self._run(run, chosen, left, results)
        for i in chosen:  # in batch order: the same frame whatever the executor
            c = candidates[i]
            res = results.get(c.row["key"], no_plan(c.row["key"], "error", "not run"))
            if res.status != "error":
                if c.retry and c.twin.retry_result is None:
                    c.twin.retry_result = res
                elif not c.retry and c.twin.result is None:
                    c.twin.result = res
            if c.retry:
                record_retry(c, res, self.bw)
            else:
                record(c, res, self.bw)
            step = c.row.get("step_time_ms")
            if step is not None and math.isfinite(step):
                cfg = c.setup.config
                shape_key = (cfg.stages, cfg.chunks, len(c.profile.body))
                better = shape_key not in self.seeds or c.row["pipeline_ms"] < self.seeds[shape_key][0]
                if better and res.layout is not None:
                    self.seeds[shape_key] = (c.row["pipeline_ms"], res.layout.counts)
            run.balanced(i)

    def _run(self, run: ChoiceRun, chosen: list[int], left: list[tuple], results: dict[str, PointResult]) -> None:
        """Solve the setups no twin, cache or earlier result answers (``left``)."""
        candidates, clock = run.candidates, run.clock
        if self.runner is None:
            # sized for a whole batch, though the first may hold fewer setups
            self.runner, slots = open_executor(self.executor, (left * self.batch)[:self.batch], solve_point,
                                               self.workers, self.stack)
            self.per_solve = self.workers or default_workers(min(slots, self.batch))
        todo = []
        cut = False  # a balance given less than its limit (the call's deadline): not cached
        for key, c, digest, start in left:
            opts = dict(self.opts(c))
            if clock.remaining() < opts["time_limit"]:
                opts["time_limit"], cut = max(0.05, clock.remaining()), True
            try:
                request = SolveRequest(c.profile, c.setup.config, workers=self.per_solve, stop=clock.stop, **opts)
            except SapptkError as exc:
                results[key] = no_plan(key, "invalid", str(exc))
                continue
            todo.append(SweepTask(key, c.profile.name, digest, request, start))
        t0 = clock.now()
        it = self.runner(todo, lambda r: None)
        try:
            for res in it:
                results[res.key] = res
                if self.store is not None and res.status != "error" and not cut and not clock.stopped:
                    owner = candidate_of(candidates, chosen, res.key)
                    row = {**input_row(owner.profile.name,
                                       {f: getattr(owner.setup.config, f) for f in CONFIG_FIELDS},
                                       self.options["time_limit"]),
                           **res.columns(), "key": res.key,
                           LAYOUT_COLUMN: None if res.layout is None else res.layout.to_json()}
                    self.store.append(row)
        finally:
            it.close()
            _share_wall(run.spent, clock.now() - t0, [(results.get(key), c.retry) for key, c, _d, _s in left])


def _share_wall(spent: dict[str, float], wall: float, solves: list[tuple[PointResult | None, bool]]) -> None:
    """Book a batch's wall time to ``balance`` and ``retry`` in proportion to the seconds of its
    first and second balances (``(result, is_retry)`` each; in processes they overlap)."""
    seconds = {"balance": 0.0, "retry": 0.0}
    for res, is_retry in solves:
        seconds["retry" if is_retry else "balance"] += (res.solve_seconds or 0.0) if res is not None else 0.0
    total = sum(seconds.values())
    for step, sec in seconds.items():
        spent[step] += wall * (sec / total) if total else (wall if step == "balance" else 0.0)
