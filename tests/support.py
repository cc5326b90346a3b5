"""Helpers shared by the test modules: small random profiles and assignments, exhaustive
enumeration, and stable seeds. (Fixtures live in ``conftest.py``.)"""

from __future__ import annotations

import itertools
import zlib

import numpy as np

from sapptk.config import PipelineConfig
from sapptk.costs import MEMORY_UNIT_MB, layer_coefficients, stage_costs
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile
from sapptk.schedules import Op, Program, get, make_program, names
from sapptk.schedules.interleaved import micro_batch_groups
from sapptk.simulation import op_durations, unit_durations, unit_times
from sapptk.solver.paths import memory_model


def seed_of(*parts: object) -> int:
    """A seed that is the same in every process (``hash()`` of a string is not: Python
    randomises it per process)."""
    return zlib.crc32(repr(parts).encode())


def small_profile(rng: np.random.Generator, groups: int = 2, layers: tuple[int, ...] = (3, 5)) -> Profile:
    """A random profile: head, ``groups`` body groups with several modes, tail; odd figures on purpose."""
    body = []
    for g in range(groups):
        fwd = float(rng.uniform(0.5, 3.0))
        modes = {"none": ModeCost(2 * fwd, float(rng.uniform(5, 9)))}
        for name, extra, shrink in (("select", 0.1, 0.7), ("both", 0.3, 0.4), ("full", 1.0, 0.05)):
            if rng.random() < 0.8:
                modes[name] = ModeCost(2 * fwd + extra * fwd, modes["none"].activation * shrink)
        body.append(LayerGroup(f"g{g}", "body", layers[g], fwd, float(rng.uniform(1, 4)), modes))
    head = LayerGroup("head", "head", 1, float(rng.uniform(0.1, 1.0)), float(rng.uniform(1, 5)))
    tail = LayerGroup("tail", "tail", 1, float(rng.uniform(0.5, 2.0)), float(rng.uniform(1, 5)),
                      {"none": ModeCost(3.0, float(rng.uniform(0, 4)))})
    return Profile("random", (head, *body, tail))


def setups() -> list[PipelineConfig]:
    """One small setup per registered schedule (chunks and micro-batches as each one needs)."""
    out = []
    for name in names():
        spec = get(name)
        chunks = 2 if spec.chunks is None or 2 in spec.chunks else spec.chunks[0]
        p = 3
        m = max(spec.min_micro_batches(p, chunks), p) + 1
        splits = 2 if spec.splits else 1
        out.append(PipelineConfig(p, m, chunks, name, splits=splits, comm=0.0123, constant_memory=1.5))
    return out


def random_counts(rng: np.random.Generator, profile: Profile, config: PipelineConfig) -> np.ndarray:
    """A random valid assignment: groups contiguous in model order, modes the profile offers."""
    body = profile.body
    nvs = config.num_virtual_stages
    total = sum(g.count for g in body)
    cuts = np.sort(rng.integers(0, total + 1, nvs - 1))
    per_vs = np.diff(np.concatenate([[0], cuts, [total]]))
    bounds = np.concatenate([[0], np.cumsum(per_vs)])
    counts = np.zeros((len(body), len(MODES), nvs), dtype=np.int64)
    start = 0
    for g, group in enumerate(body):
        layers = np.clip(np.minimum(bounds[1:], start + group.count) - np.maximum(bounds[:-1], start), 0, None)
        avail = [MODES.index(m) for m in group.modes]
        for vs, n in enumerate(layers):
            for _ in range(n):
                counts[g, rng.choice(avail), vs] += 1
        start += group.count
    return counts


def config_for(name: str, rng: np.random.Generator, **kw) -> PipelineConfig:
    spec = get(name)
    chunks = 2 if spec.chunks is None or 2 in spec.chunks else spec.chunks[0]
    p = int(rng.integers(2, 4))
    m = max(spec.min_micro_batches(p, chunks), p) + int(rng.integers(0, 3))
    splits = 2 if spec.splits else 1
    return PipelineConfig(p, m, chunks, name, splits=splits, **kw)


def fast_step(config: PipelineConfig, profile: Profile, counts: np.ndarray) -> float:
    """The simulator's own timing functions, without building its DataFrames (for enumeration)."""
    sc = stage_costs(profile, config, counts)
    program = config.program()
    dur = unit_durations(program, op_durations(program, sc.forward, sc.backward, sc.weight))
    _, end = unit_times(program, dur, sc.comm)
    return float(end.max())


def peaks_mb(config: PipelineConfig, profile: Profile, counts: np.ndarray) -> np.ndarray:
    program = config.program()
    mem = memory_model(program)
    return mem.peaks(layer_coefficients(profile, config), program, counts) / mem.scale * MEMORY_UNIT_MB


def all_assignments(profile: Profile, config: PipelineConfig, modes: tuple[int, int]):
    """Every assignment with each vs holding ≥ 1 body layer (except head/tail stages), two modes."""
    coef = layer_coefficients(profile, config)
    body = profile.body
    total = sum(g.count for g in body)
    nvs = config.num_virtual_stages
    need = np.where(coef.fixed_layers > 0, 0, 1)
    for per_vs in itertools.product(*(range(need[vs], total + 1) for vs in range(nvs))):
        if sum(per_vs) != total:
            continue
        bounds = np.concatenate([[0], np.cumsum(per_vs)])
        cells = []  # (g, vs, n)
        start = 0
        for g, group in enumerate(body):
            layers = np.clip(np.minimum(bounds[1:], start + group.count) - np.maximum(bounds[:-1], start), 0, None)
            cells += [(g, vs, int(n)) for vs, n in enumerate(layers) if n]
            start += group.count
        for strong in itertools.product(*(range(n + 1) for _, _, n in cells)):
            counts = np.zeros((len(body), len(MODES), nvs), dtype=np.int64)
            for (g, vs, n), s in zip(cells, strong, strict=True):
                counts[g, modes[0], vs] = n - s
                counts[g, modes[1], vs] = s
            yield counts


def two_mode_profile(layers: tuple[int, ...]) -> Profile:
    rng = np.random.default_rng(sum(layers))
    body = []
    for g, n in enumerate(layers):
        fwd = float(rng.uniform(1, 2))
        act = float(rng.uniform(4, 8))
        body.append(LayerGroup(f"g{g}", "body", n, fwd, float(rng.uniform(1, 3)),
                               {"none": ModeCost(2 * fwd, act), "full": ModeCost(3 * fwd, 0.1 * act)}))
    head = LayerGroup("head", "head", 1, 0.3, 2.0)
    tail = LayerGroup("tail", "tail", 1, 1.1, 3.0)
    return Profile("two-mode", (head, *body, tail))


EXHAUSTIVE = [
    ("1f1b", 3, 4, 1, 1),
    ("gpipe", 3, 3, 1, 1),
    ("interleaved", 2, 3, 2, 1),
    ("interleaved-lm", 2, 4, 2, 1),
    ("seq1f1b", 2, 3, 1, 2),
    ("zb-h1", 3, 4, 1, 1),
    ("zb-v", 2, 3, 2, 1),
    ("dualpipe-v", 2, 4, 2, 1),
]


# ------------------------------------------------------------------ oracles
# The line-placed schedules written op by op (as they were before the array builders): the
# array-built programs must equal these op by op.
def exhaustive_cases(rng: np.random.Generator, trials: int):
    """Small random cases with every assignment simulated: ``(trial, profile, free config,
    found)``, ``found`` one row (step ms, peak MB of the fullest device) per assignment of two
    groups in modes none and full over an :data:`EXHAUSTIVE` shape, without a budget."""
    for trial in range(trials):
        schedule, p, m, v, k = EXHAUSTIVE[trial % len(EXHAUSTIVE)]
        profile = small_profile(rng, groups=2, layers=(int(rng.integers(2, 4)), int(rng.integers(2, 4))))
        if not all("full" in g.modes for g in profile.body):
            profile = two_mode_profile((3, 3) if v > 1 else (4, 3))
        free = PipelineConfig(p, m, v, schedule, splits=k, recompute=("none", "full"),
                              comm=float(rng.choice([0.0, 0.05])))
        found = np.array([(fast_step(free, profile, c), peaks_mb(free, profile, c).max())
                          for c in all_assignments(profile, free, (0, MODES.index("full")))])
        yield trial, profile, free, found


def _reference_one_f_one_b(forwards: list, backwards: list, warmup: int) -> list:
    warmup = min(warmup, len(forwards))
    order = forwards[:warmup]
    steady = len(forwards) - warmup
    for i in range(steady):
        order.append(forwards[warmup + i])
        order.append(backwards[i])
    order.extend(backwards[steady:])
    return order


def reference_program(name: str, stages: int, micro_batches: int, chunks: int = 1, splits: int = 1) -> Program:
    """gpipe, 1f1b, seq1f1b, interleaved or interleaved-lm built from :class:`Op` lists."""
    p, m, k = stages, micro_batches, splits
    devices = []
    if name == "gpipe":
        for s in range(p):
            devices.append([Op("F", i, s) for i in range(m)] + [Op("B", i, s) for i in range(m)])
        return make_program(name, stages=p, micro_batches=m, chunks=1, splits=1, placement=range(p),
                            device_units=devices)
    if name in ("1f1b", "seq1f1b"):
        for s in range(p):
            fwd = [Op("F", i, s, j) for i in range(m) for j in range(k)]
            bwd = [Op("B", i, s, j) for i in range(m) for j in reversed(range(k))]
            devices.append(_reference_one_f_one_b(fwd, bwd, p - s - 1 + k - 1))
        return make_program(name, stages=p, micro_batches=m, chunks=1, splits=k, placement=range(p),
                            device_units=devices)
    assert name in ("interleaved", "interleaved-lm"), name
    v = chunks
    groups = micro_batch_groups(p, m)
    first_group = len(groups[0])
    for s in range(p):
        fwd, bwd = [], []
        for group in groups:
            for c in range(v):
                fwd.extend(Op("F", i, c * p + s) for i in group)
                bwd.extend(Op("B", i, (v - 1 - c) * p + s) for i in group)
        tail = p - s - 1 if name == "interleaved-lm" or v == 1 else 2 * (p - s - 1)
        devices.append(_reference_one_f_one_b(fwd, bwd, (v - 1) * first_group + tail))
    return make_program(name, stages=p, micro_batches=m, chunks=v, splits=1,
                        placement=[vs % p for vs in range(p * v)], device_units=devices)


def _op_deps(op: Op, nvs: int, k: int, present: set) -> list[Op]:
    """What an op waits for, from its kind alone (the rules of the schedules' docs)."""
    kind, m, v, j = op
    if kind == "F":
        return ([Op("F", m, v - 1, j)] if v > 0 else []) + ([Op("F", m, v, j - 1)] if j > 0 else [])
    if kind == "W":
        return [Op("I", m, v, j)]

    def backward(vs: int, sl: int) -> Op:
        full = Op("B", m, vs, sl)
        return full if full in present else Op("I", m, vs, sl)

    first = backward(v + 1, j) if v < nvs - 1 else Op("F", m, v, j)
    return [first] + ([backward(v, j + 1)] if j < k - 1 else [])


def reference_run(program: Program, *, forward, backward, weight=0.0, comm: float = 0.0, overlap: str = "sum",
                  activation=1.0, params=0.0, constant: float = 0.0, weight_holds: float = 0.5) -> dict:
    """The simulator's conventions in plain Python, op by op over ``program.units``.

    Devices take turns running every unit whose ops' dependencies have ended; a unit starts
    at the end of its device's previous unit or of each dependency (+ ``comm`` across
    devices), whichever is latest. Memory is walked unit by unit: allocations of a unit,
    then its frees. Returns ``unit_start``/``unit_end`` (lists in unit-number order, units
    numbered device by device), ``op_end`` (Op -> end), ``step_time``, ``peak_mb`` and
    ``peak_live`` per device, and ``preds`` (unit -> list of (unit, crosses devices)).
    """
    nvs, k, p = program.num_virtual_stages, program.splits, program.stages

    def per_stage(x):
        return [float(x)] * nvs if np.ndim(x) == 0 else [float(y) for y in x]

    f, b, w, act, par = (per_stage(x) for x in (forward, backward, weight, activation, params))
    length = {"F": f, "B": [x + y for x, y in zip(b, w, strict=True)], "I": b, "W": w}
    units = [u for dev in program.units for u in dev]
    device_of_unit = [d for d, dev in enumerate(program.units) for _ in dev]
    unit_of = {op: i for i, u in enumerate(units) for op in u}
    present = set(unit_of)
    preds = []
    first = 0
    for d, dev in enumerate(program.units):
        for i in range(len(dev)):
            u = first + i
            row = [(u - 1, False)] if i else []
            for op in units[u]:
                for dep in _op_deps(op, nvs, k, present):
                    row.append((unit_of[dep], device_of_unit[unit_of[dep]] != d))
            preds.append(row)
        first += len(dev)
    n = len(units)
    start, end = [None] * n, [None] * n
    ptr = [sum(len(dev) for dev in program.units[:d]) for d in range(p)]
    stop = [ptr[d] + len(program.units[d]) for d in range(p)]
    ran = 0
    while ran < n:
        moved = False
        for d in range(p):
            while ptr[d] < stop[d] and all(end[q] is not None for q, _ in preds[ptr[d]]):
                u = ptr[d]
                s = max([end[q] + (comm if c else 0.0) for q, c in preds[u]], default=0.0)
                durations = [length[op.kind][op.virtual_stage] / k for op in units[u]]
                start[u], end[u] = s, s + (sum(durations) if overlap == "sum" else max(durations))
                ptr[d] += 1
                ran += 1
                moved = True
        if not moved:
            raise AssertionError("reference_run: the program deadlocks")
    peak_mb, peak_live = [], []
    for d, dev in enumerate(program.units):
        static = sum(par[vs] for vs in program.device_stages[d]) + constant
        mem = live = top_mem = top_live = 0.0
        for unit in dev:
            for op in unit:
                if op.kind == "F":
                    mem += act[op.virtual_stage] / k
                    live += 1 / k
            top_mem, top_live = max(top_mem, mem), max(top_live, live)
            for op in unit:
                share = {"F": 0.0, "B": 1.0, "I": 1 - weight_holds, "W": weight_holds}[op.kind]
                mem -= share * act[op.virtual_stage] / k
                live -= share / k
        peak_mb.append(static + top_mem)
        peak_live.append(top_live)
    return {
        "unit_start": start,
        "unit_end": end,
        "op_end": {op: end[unit_of[op]] for op in present},
        "step_time": max(end, default=0.0),
        "peak_mb": peak_mb,
        "peak_live": peak_live,
        "preds": preds,
    }


def reference_through(preds: list, duration: list, comm) -> list:
    """Longest path through each unit (plain Python): longest path ending at it plus the
    longest continuation after it, over the unit edges ``preds`` (unit -> [(unit, crosses)])."""
    n = len(preds)
    succs = [[] for _ in range(n)]
    indeg = [len(row) for row in preds]
    for u, row in enumerate(preds):
        for q, c in row:
            succs[q].append((u, c))
    order = [u for u in range(n) if not indeg[u]]
    for u in order:  # Kahn: order grows while it is read
        for s, _ in succs[u]:
            indeg[s] -= 1
            if not indeg[s]:
                order.append(s)
    end = [0] * n
    for u in order:
        end[u] = max([end[q] + (comm if c else 0) for q, c in preds[u]], default=0) + duration[u]
    tail = [0] * n
    for u in reversed(order):
        tail[u] = max([(comm if c else 0) + duration[s] + tail[s] for s, c in succs[u]], default=0)
    return [end[u] + tail[u] for u in range(n)]


# --------------------------------------------------------------------- processes (POSIX)
def wait_until(condition, seconds: float = 60.0) -> bool:
    """Poll ``condition()`` until it holds or ``seconds`` pass: a hang bound, not a timing assert."""
    import time

    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.1)
    return bool(condition())


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie waiting for its parent counts as ended)."""
    import os
    from pathlib import Path

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (children, their children, ...), read from /proc (Linux)."""
    from pathlib import Path

    parent_of: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent_of[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parent_of.items() if parent in frontier} - found
        found |= frontier
    return found
