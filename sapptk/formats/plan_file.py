"""sapptk's own plan file (``sapptk-plan/1``, YAML): everything a plan is, in one file.

Keys: ``format``; ``source``, ``status``, ``step_time_ms``, ``bound_ms``, ``gap``,
``solve_seconds``, ``message`` (as on :class:`sapptk.plan.Plan`); ``setup`` (``stages``,
``micro_batches``, ``chunks``, ``schedule``, ``splits``, ``memory_budget_mb``,
``constant_memory_mb``, ``comm_ms``, ``recompute``, ``host_bandwidth_mb_per_ms`` (only when
set), and ``program_csv``: the op order in PyTorch's schedule CSV when the setup carries its
own program); ``layout`` (one entry ``{group, virtual_stage, mode, layers}`` per non-empty
cell); ``offload`` (only for a plan with activation offload: one entry ``{group,
virtual_stage, layers}`` per virtual stage offloading mode-``none`` layers); ``alternative``
(only for a plan that recomputes per micro-batch: ``layout``, the second layout in the same
form as ``layout``, and ``micro_batches``, one list per virtual stage of the micro-batches
that run it); ``profile`` (the profile in
``sapptk-profile/1`` form, so the file stands alone). :func:`dumps` writes it, :func:`load`
reads and checks every field; ``plan.export("sapptk", path)`` (:func:`plan_export`) and
``sapptk.load_plan(path)`` (:func:`read_plan`, then :func:`check_evidence`) are the plan-level calls.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import yaml

from sapptk import checks
from sapptk.costs import MAX_UNITS, TIME_UNIT_MS
from sapptk.errors import ConfigError, SapptkError
from sapptk.formats import mindformers
from sapptk.formats.base import Export, check_path, make_export, write_files
from sapptk.profile import MAX_LAYERS, MODES, Profile

if TYPE_CHECKING:
    from sapptk.config import PipelineConfig
    from sapptk.plan import Plan

__all__ = ["FORMAT", "check_evidence", "dumps", "load", "plan_export", "read_plan"]

FORMAT = "sapptk-plan/1"
MAX_MS = MAX_UNITS * TIME_UNIT_MS
"""The largest step time, bound or solve time a plan file may state (the integer units' limit)."""
_SETUP_KEYS = ("stages", "micro_batches", "chunks", "schedule", "splits", "memory_budget_mb", "constant_memory_mb",
               "comm_ms", "recompute", "host_bandwidth_mb_per_ms", "program_csv")
_KEYS = ("format", "source", "status", "step_time_ms", "bound_ms", "gap", "solve_seconds", "message", "setup",
         "layout", "offload", "alternative", "profile")


def to_dict(profile: Profile, config: PipelineConfig, counts: np.ndarray, **meta: Any) -> dict[str, Any]:
    """The plan as plain data; ``meta``: status, step_time, bound, gap, solve_seconds, message, source, and
    optionally ``offload`` and ``alternative`` (a :class:`sapptk.costs.AlternativeLayout`)."""
    c = config
    setup: dict[str, Any] = {
        "stages": c.stages,
        "micro_batches": c.micro_batches,
        "chunks": c.chunks,
        "schedule": c.schedule,
        "splits": c.splits if c.slice_lengths is None else list(c.slice_lengths),
        "memory_budget_mb": None if c.memory_budget is None else float(c.memory_budget),
        "constant_memory_mb": float(c.constant_memory),
        "comm_ms": float(c.comm),
        "recompute": list(c.recompute),
    }
    if c.host_bandwidth is not None:
        setup["host_bandwidth_mb_per_ms"] = float(c.host_bandwidth)
    if c.custom_program is not None:
        setup["program_csv"] = c.custom_program.to_csv()
    names = [g.name for g in profile.body]
    layout = _layout_entries(profile, counts)
    out: dict[str, Any] = {
        "format": FORMAT,
        "source": meta["source"],
        "status": meta["status"],
        "step_time_ms": meta["step_time"],
        "bound_ms": meta["bound"],
        "gap": meta["gap"],
        "solve_seconds": meta["solve_seconds"],
        "message": meta["message"],
        "setup": setup,
        "layout": layout,
    }
    offload = meta.get("offload")
    if offload is not None:
        og, ov = np.nonzero(offload)
        out["offload"] = [{"group": names[g], "virtual_stage": int(v), "layers": int(offload[g, v])}
                          for g, v in sorted(zip(og.tolist(), ov.tolist(), strict=True), key=lambda t: (t[1], t[0]))]
    alternative = meta.get("alternative")
    if alternative is not None:
        out["alternative"] = {
            "layout": _layout_entries(profile, alternative.counts),
            "micro_batches": [[int(mb) for mb in np.flatnonzero(row)] for row in alternative.mask],
        }
    out["profile"] = profile.to_dict()
    return out


def _layout_entries(profile: Profile, counts: np.ndarray) -> list[dict[str, Any]]:
    names = [g.name for g in profile.body]
    g_, r_, v_ = np.nonzero(counts)
    order = np.lexsort((r_, g_, v_))
    return [{"group": names[g_[i]], "virtual_stage": int(v_[i]), "mode": MODES[r_[i]],
             "layers": int(counts[g_[i], r_[i], v_[i]])} for i in order]


def dumps(profile: Profile, config: PipelineConfig, counts: np.ndarray, **meta: Any) -> str:
    """The plan file's text (see :func:`to_dict` for ``meta``)."""
    header = (
        f"# sapptk plan ({FORMAT}): read with sapptk.load_plan, export with `sapptk export`.\n"
        "# layout: layers of each body group in each recompute mode on each virtual stage (model order)\n"
    )
    body = yaml.safe_dump(to_dict(profile, config, counts, **meta), sort_keys=False, default_flow_style=None,
                          width=120, allow_unicode=True)
    return header + body


def load(source: str | os.PathLike[str] | Any) -> dict[str, Any]:
    """A plan file (path or parsed data) as the keyword arguments of :func:`sapptk.plan.make_plan`
    (``profile``, ``config``, ``counts``, ``status``, ``step_time``, ...) plus ``where`` (the
    file name for messages). Raises :class:`ConfigError` naming the file and the field."""
    from sapptk.config import PipelineConfig
    from sapptk.schedules import from_csv_text

    where = "<data>"
    data = source
    if isinstance(source, (str, os.PathLike)):
        where = os.fspath(source)
        data = mindformers.load(where)

    def fail(message: str) -> NoReturn:
        raise ConfigError(f"{where}: {message}")

    if not isinstance(data, dict):
        fail(f"expected a sapptk plan (a mapping with format: {FORMAT}), got {type(data).__name__}")
    if data.get("format") != FORMAT:
        fail(f"format = {data.get('format')!r}: expected {FORMAT!r} (a file written by plan.export('sapptk'))")
    unknown = [k for k in data if k not in _KEYS]
    if unknown:
        fail(f"unknown key {unknown[0]!r}: expected {', '.join(_KEYS)}")
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
        "host_bandwidth": setup.get("host_bandwidth_mb_per_ms"),
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
    counts = _layout(data.get("layout"), profile, config.num_virtual_stages, fail)
    offload = _offload(data.get("offload"), profile, config.num_virtual_stages, fail)
    numbers = {}
    for key, high in (("step_time_ms", MAX_MS), ("bound_ms", MAX_MS), ("gap", 1.0), ("solve_seconds", MAX_MS)):
        value = data.get(key)
        if value is not None:
            value = _checked(fail, checks.number, value, key, low=0.0, high=high)
        numbers[key] = value
    message, plan_source, status = data.get("message") or "", data.get("source") or "plan file", data.get("status")
    if not isinstance(message, str) or not isinstance(plan_source, str):
        fail("message and source: expected text")
    solved = status in ("optimal", "feasible", "given")
    alternative = _alternative(data.get("alternative"), profile, config, fail) if solved else None
    return {
        "where": where, "profile": profile, "config": config, "counts": counts if solved else None,
        "status": status, "step_time": numbers["step_time_ms"], "bound": numbers["bound_ms"], "gap": numbers["gap"],
        "solve_seconds": numbers["solve_seconds"] or 0.0, "message": message, "source": plan_source,
        "offload": offload if solved else None,
        "alternative": alternative,
    }


def _checked(fail: Any, check: Any, value: Any, label: str, **limits: Any) -> Any:
    """``check(value, label, ...)`` of :mod:`sapptk.checks`, its message prefixed by the file's name."""
    try:
        return check(value, label, error=ConfigError, **limits)
    except ConfigError as exc:
        fail(str(exc))


def _alternative(data: Any, profile: Profile, config: PipelineConfig, fail: Any) -> Any:
    """The ``alternative`` block as ``AlternativeLayout`` arguments (counts, mask), or None."""
    from sapptk.costs import AlternativeLayout

    if data is None:
        return None
    if not isinstance(data, dict) or set(data) != {"layout", "micro_batches"}:
        fail(f"alternative = {data!r}: expected a mapping with layout and micro_batches")
    nvs, m = config.num_virtual_stages, config.micro_batches
    counts = _layout(data["layout"], profile, nvs, fail, label="alternative.layout")
    rows = data["micro_batches"]
    if not isinstance(rows, list) or len(rows) != nvs:
        fail(f"alternative.micro_batches: expected {nvs} lists (one per virtual stage) of micro-batches, "
             f"got {rows!r}"[:300])
    mask = np.zeros((nvs, m), dtype=bool)
    for vs, row in enumerate(rows):
        if not isinstance(row, list):
            fail(f"alternative.micro_batches[{vs}] = {row!r}: expected a list of micro-batches 0..{m - 1}")
        for mb in row:
            if not isinstance(mb, int) or isinstance(mb, bool) or not 0 <= mb < m:
                fail(f"alternative.micro_batches[{vs}]: {mb!r}: expected a micro-batch 0..{m - 1}")
            mask[vs, mb] = True
    return AlternativeLayout(counts=counts, mask=mask)


def _layout(layout: Any, profile: Profile, virtual_stages: int, fail: Any, label: str = "layout") -> np.ndarray:
    counts = np.zeros((len(profile.body), len(MODES), virtual_stages), dtype=np.int64)
    groups = {g.name: i for i, g in enumerate(profile.body)}
    layout = layout or []
    name = label
    if not isinstance(layout, list):
        fail(f"{name} = {layout!r}: expected a list of {{group, virtual_stage, mode, layers}}")
    for i, cell in enumerate(layout):
        label = f"{name}[{i}]"
        if not isinstance(cell, dict) or set(cell) != {"group", "virtual_stage", "mode", "layers"}:
            fail(f"{label} = {cell!r}: expected a mapping with group, virtual_stage, mode, layers")
        if cell["group"] not in groups:
            fail(f"{label}.group = {cell['group']!r}: expected a body group of the profile ({', '.join(groups)})")
        if cell["mode"] not in MODES:
            fail(f"{label}.mode = {cell['mode']!r}: expected one of {', '.join(MODES)}")
        vs, n = cell["virtual_stage"], cell["layers"]
        if not isinstance(vs, int) or isinstance(vs, bool) or not 0 <= vs < virtual_stages:
            fail(f"{label}.virtual_stage = {vs!r}: expected 0..{virtual_stages - 1}")
        _checked(fail, checks.integer, n, f"{label}.layers", low=1, high=MAX_LAYERS)
        counts[groups[cell["group"]], MODES.index(cell["mode"]), vs] += n
    return counts


def _offload(entries: Any, profile: Profile, virtual_stages: int, fail: Any) -> np.ndarray | None:
    """The ``offload`` list as an array (body groups, virtual stages), or None when absent."""
    if entries is None:
        return None
    if not isinstance(entries, list):
        fail(f"offload = {entries!r}: expected a list of {{group, virtual_stage, layers}}")
    out = np.zeros((len(profile.body), virtual_stages), dtype=np.int64)
    groups = {g.name: i for i, g in enumerate(profile.body)}
    for i, cell in enumerate(entries):
        label = f"offload[{i}]"
        if not isinstance(cell, dict) or set(cell) != {"group", "virtual_stage", "layers"}:
            fail(f"{label} = {cell!r}: expected a mapping with group, virtual_stage, layers")
        if cell["group"] not in groups:
            fail(f"{label}.group = {cell['group']!r}: expected a body group of the profile ({', '.join(groups)})")
        vs, n = cell["virtual_stage"], cell["layers"]
        if not isinstance(vs, int) or isinstance(vs, bool) or not 0 <= vs < virtual_stages:
            fail(f"{label}.virtual_stage = {vs!r}: expected 0..{virtual_stages - 1}")
        _checked(fail, checks.integer, n, f"{label}.layers", low=1, high=MAX_LAYERS)
        out[groups[cell["group"]], vs] += n
    return out


# --------------------------------------------------------------------- plan level
def plan_export(plan: Plan, path: str | os.PathLike[str] | None = None) -> Export:
    """The plan as a plan file (``texts["yaml"]``; ``data`` its mapping), written to ``path`` when
    given. Every plan can be saved (offload, per-micro-batch, no assignment): nothing is lost."""
    out = check_path(path, "export('sapptk')")
    meta = {"status": plan.status, "step_time": plan.step_time, "bound": plan.bound, "gap": plan.gap,
            "solve_seconds": plan.solve_seconds, "message": plan.message, "source": plan.source,
            "offload": plan.offload, "alternative": plan.alternative}
    text = dumps(plan.profile, plan.config, plan.counts, **meta)
    written = {} if out is None else write_files("sapptk", {"yaml": (out, text)})
    return make_export("sapptk", text, {"yaml": text}, written, step_time_ms=plan.step_time,
                       expressed_step_time_ms=plan.step_time, data=to_dict(plan.profile, plan.config, plan.counts,
                                                                            **meta))


def read_plan(source: Any, profile: Any = None, config: Any = None) -> dict[str, Any]:
    """:func:`load` for :func:`sapptk.load_plan`: the file carries its own profile and setup, so
    ``profile`` and ``config`` must be None (a ConfigError otherwise, rather than ignoring them)."""
    for name, value in (("profile", profile), ("config", config)):
        if value is not None:
            checks.fail(ConfigError, f"load_plan(format='sapptk'): {name}", value,
                        f"None: a sapptk plan file carries its own {name}")
    return load(source)


_AGREE_MS = 1e-6
"""How far a plan file's step time and bound may be from what sapptk recomputes (ms, plus 1e-9 relative)."""


def check_evidence(plan: Plan, where: str) -> None:
    """A plan file is evidence, not truth: its step time must be the simulated one, a solved
    plan (optimal, feasible) must fit its budget, its bound may not exceed its step time and
    its gap must be (step - bound) / step."""
    if not plan.solved:
        return
    step = plan.simulation.step_time
    tolerance = _AGREE_MS + 1e-9 * abs(step)
    if plan.step_time is not None and abs(plan.step_time - step) > tolerance:
        raise ConfigError(f"{where}: step_time_ms = {plan.step_time!r}: the plan simulates to {step:.6f} ms: expected "
                          "the simulated step time (was the file edited?)")
    if plan.status in ("optimal", "feasible") and not plan.fits:
        peak = float(plan.simulation.peak_memory.max())
        raise ConfigError(f"{where}: status = {plan.status!r}, but the plan's peak of {peak:.6g} MB exceeds its "
                          f"memory_budget_mb = {plan.config.memory_budget:.6g}: expected a plan that fits (status "
                          "'given' for a hand-made plan)")
    if plan.bound is not None and plan.bound > step + tolerance:
        raise ConfigError(f"{where}: bound_ms = {plan.bound!r} exceeds the plan's step time {step:.6f} ms: expected a "
                          "lower bound on the optimum, at most the step time")
    if plan.gap is not None and plan.bound is not None and step > 0:
        gap = max(0.0, (step - plan.bound) / step)
        if abs(plan.gap - gap) > 1e-6:
            raise ConfigError(f"{where}: gap = {plan.gap!r}: the step time and bound give {gap:.6g}: expected "
                              "(step - bound) / step")
