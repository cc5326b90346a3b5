"""torchtitan's pipeline settings (its TOML job config), both ways (codecs on counts).

A plan becomes three small TOML tables to paste into a torchtitan job file:

``[parallelism]``
    ``pipeline_parallel_degree`` (p), ``pipeline_parallel_schedule`` (the PyTorch schedule
    class name: ``GPipe``, ``1F1B``, ``Interleaved1F1B``, ``InterleavedZeroBubble``,
    ``ZBVZeroBubble``, ``DualPipeV``), ``pipeline_parallel_microbatch_size`` (1) and
    ``module_fqns_per_model_part``: one list of module names per virtual stage in model
    order (``tok_embeddings``, ``layers.<i>``, ``norm``, ``output`` for torchtitan's
    decoders). torchtitan places the parts on ranks by the schedule: part ``c·p + s`` on rank
    s, or in a V for ``ZBVZeroBubble`` and ``DualPipeV``. A sapptk schedule that no PyTorch
    class runs (``interleaved-rf``, ``zb-v-greedy``, a carried program, ``interleaved`` with
    m that PyTorch refuses, ...) is exported as its PyTorch schedule CSV, named by
    ``pipeline_parallel_schedule_csv``; ``pipeline_parallel_schedule`` then names a class with
    the same placement.
``[activation_checkpoint]``
    ``mode``: ``none``, ``full`` (every layer) or ``selective`` with
    ``selective_ac_option = "op"`` (per-operator, sapptk's ``select``); torchtitan applies
    one mode to every layer. ``selective_ac_option = "<n>"`` (full recompute of every n-th
    layer of a rank, counted over its model parts in order) is read, not written.
``[training]``
    ``local_batch_size = m``: with micro-batches of size 1 that gives m micro-batches
    (scale both by your micro-batch size).

The TOML serves torchtitan up to 0.2.2. torchtitan 0.3 reads no TOML job files: its configs
are Python functions (``--module <module> --config <function>``) and activation checkpointing
is a config class. :func:`render_python` writes that form (:attr:`TorchtitanExport.python`): a
module whose ``sapptk_plan()`` starts from a config of the user's (``BASE_CONFIG``), sets the
same pipeline fields, the module lists (the output layer is ``lm_head`` there) and
``FullAC.Config()`` / ``SelectiveAC.Config()`` / ``None``.

A schedule CSV is named by an absolute path in the TOML (torchtitan checks it with
``os.path.isfile`` against the launch directory) and by its place next to the module in the
Python form. ``plan.export("torchtitan", "run/job.toml")`` (:func:`plan_export`) writes the
three files side by side: ``run/job.toml``, ``run/job.py`` and, when the schedule needs one,
``run/job_schedule.csv``; ``sapptk.load_plan`` (:func:`read_plan`) reads the TOML back.

Reading (:func:`read`) uses ``tomllib`` and checks every key it uses; other keys of a full
job file are ignored.

(Over 500 lines: the three tables, the 0.3 Python form, the reader and the plan-level writer
are one format; they share the module lists and the schedule names.)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk import checks
from sapptk.costs import fits_budget
from sapptk.errors import ConfigError
from sapptk.files import load_toml_text, read_text
from sapptk.formats.base import (
    Export,
    check_inputs,
    check_path,
    make_export,
    need_solution,
    one_line,
    refuse_levers,
    write_files,
)
from sapptk.formats.expressible import ExpressedCost, closest, counts_from_layers, modes_used
from sapptk.profile import MODES

if TYPE_CHECKING:
    from sapptk.plan import Plan

__all__ = ["AC_SETTINGS", "PYTHON_AC", "TORCH_SCHEDULES", "TorchtitanConfig", "TorchtitanExport", "ac_counts", "decode",
           "export", "fqns", "plan_export", "read", "read_plan", "render", "render_python", "sapptk_schedule",
           "torch_schedule"]

_NONE, _SELECT, _FULL = (MODES.index(m) for m in ("none", "select", "full"))

TORCH_SCHEDULES: dict[str, str] = {
    "gpipe": "GPipe",
    "1f1b": "1F1B",
    "interleaved": "Interleaved1F1B",
    "interleaved-zb": "InterleavedZeroBubble",
    "zb-h1": "InterleavedZeroBubble",
    "zb-v": "ZBVZeroBubble",
    "dualpipe-v": "DualPipeV",
}
"""sapptk schedule -> the PyTorch schedule class torchtitan names (same order, op for op)."""

AC_SETTINGS: dict[str, dict[str, str]] = {
    "none": {"mode": "none"},
    "select": {"mode": "selective", "selective_ac_option": "op"},
    "full": {"mode": "full"},
}
"""The activation-checkpoint settings sapptk writes, by the mode they give every layer."""

HEAD_MODULES = ("tok_embeddings",)
TAIL_MODULES = ("norm", "output")
TAIL_MODULES_0_3 = ("norm", "lm_head")  # torchtitan 0.3 renamed the output layer
TOML_VERSIONS = "torchtitan <= 0.2.2 (TOML job files)"
PYTHON_VERSIONS = "torchtitan >= 0.3 (Python configs, --module/--config)"
PYTHON_AC: dict[str, str] = {"none": "None", "select": "SelectiveAC.Config()", "full": "FullAC.Config()"}
"""torchtitan 0.3's activation-checkpointing config, by the mode it gives every layer."""
DEFAULT_BASE_CONFIG = "torchtitan.models.llama3.config_registry:llama3_8b"
_LAYER = re.compile(r"layers\.(\d+)")


@dataclass(frozen=True)
class TorchtitanConfig:
    """What a torchtitan job file says about the pipeline (see the module docstring)."""

    degree: int
    schedule: str
    schedule_csv: str | None
    parts: tuple[tuple[str, ...], ...]
    ac: dict[str, str]
    micro_batches: int | None


@dataclass(frozen=True)
class TorchtitanExport(ExpressedCost):
    """A plan as torchtitan settings: ``toml`` to paste into the job file (torchtitan <= 0.2.2;
    ``python`` the config module for >= 0.3; :func:`plan_export` writes both); ``csv`` the schedule
    CSV to save as ``csv_name`` (an absolute path) when the schedule needs one (else None); ``notes``
    what torchtitan cannot express; step times and peaks as in
    :class:`~sapptk.formats.megatron.MegatronExport`."""

    toml: str
    csv: str | None
    csv_name: str | None
    schedule: str
    ac: dict[str, str]
    notes: tuple[str, ...]
    python: str = ""
    settings: dict[str, Any] = field(default_factory=dict, repr=False)
    step_time_ms: float | None = None
    peak_mb: float | None = None
    expressed_step_time_ms: float | None = None
    expressed_peak_mb: float | None = None
    expressed_fits: bool | None = None
    expressed_counts: np.ndarray | None = field(default=None, repr=False)

    def text(self) -> str:
        """The TOML, then what is lost (as comments)."""
        extra = [f"# {n}" for n in self.notes]
        if self.cost_ms is not None and self.notes:
            extra.append(f"# step time: plan {self.step_time_ms:.1f} ms, as torchtitan runs it "
                         f"{self.expressed_step_time_ms:.1f} ms ({self.cost_ms:+.1f} ms); peak {self.peak_mb:.0f} -> "
                         f"{self.expressed_peak_mb:.0f} MB" + ("" if self.expressed_fits else " (over the budget)"))
        return self.toml + ("\n" + "\n".join(extra) + "\n" if extra else "")


def torch_schedule(schedule: str, stages: int, micro_batches: int, chunks: int) -> str | None:
    """The PyTorch class that runs sapptk's ``schedule`` op for op at (p, m, v), or None."""
    name = TORCH_SCHEDULES.get(schedule)
    if name is None:
        return None
    if schedule == "interleaved" and chunks == 1:
        # PyTorch's Interleaved1F1B warms up 2(p - s - 1) + 1 forwards at v = 1 (more memory);
        # sapptk's interleaved at v = 1 is 1F1B's order (checked by the runtime suite)
        return "1F1B"
    if name in ("Interleaved1F1B", "InterleavedZeroBubble"):
        rounds = max(1, micro_batches // stages)
        if micro_batches % rounds:  # PyTorch refuses rounds that do not divide m
            return None
    if schedule == "zb-h1" and chunks != 1:
        return None
    return name


def sapptk_schedule(name: str, chunks: int, source: str = "<toml>") -> str:
    """The sapptk schedule of a PyTorch schedule class name (case as torchtitan accepts it)."""
    by_lower = {v.lower(): k for k, v in TORCH_SCHEDULES.items() if k not in ("zb-h1",)}
    key = name.lower()
    if key == "interleavedzerobubble" and chunks == 1:
        return "zb-h1"
    if key not in by_lower:
        raise _fail(source, f"parallelism.pipeline_parallel_schedule = {name!r}: expected one of "
                            f"{', '.join(sorted(set(TORCH_SCHEDULES.values())))} (or a schedule CSV)")
    return by_lower[key]


def fqns(layers: Sequence[int], *, head: bool = True, tail: bool = True,
         tail_modules: Sequence[str] = TAIL_MODULES) -> list[list[str]]:
    """``module_fqns_per_model_part`` for body layers per virtual stage (model order);
    ``tail_modules`` :data:`TAIL_MODULES_0_3` for torchtitan 0.3."""
    parts: list[list[str]] = []
    start = 0
    for vs, n in enumerate(layers):
        part = list(HEAD_MODULES) if head and vs == 0 else []
        part += [f"layers.{i}" for i in range(start, start + int(n))]
        if tail and vs == len(layers) - 1:
            part += list(tail_modules)
        parts.append(part)
        start += int(n)
    return parts


def _toml_str(text: str) -> str:
    """A TOML basic string: backslash, quote and every control character escaped (a newline in a
    file name would otherwise end the string and the line)."""
    body = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(f"\\u{ord(ch):04x}" if ord(ch) < 0x20 or ord(ch) == 0x7F else ch for ch in body) + '"'


def render(*, degree: int, schedule: str, parts: Sequence[Sequence[str]], ac: Mapping[str, str], micro_batches: int,
           schedule_csv: str | None = None, comments: Sequence[str] = ()) -> str:
    """The TOML fragment ([parallelism], [activation_checkpoint], [training])."""
    lines = [f"# {one_line(c)}" for c in comments]
    lines += ["[parallelism]", f"pipeline_parallel_degree = {int(degree)}",
              f"pipeline_parallel_schedule = {_toml_str(schedule)}"]
    if schedule_csv is not None:
        lines.append(f"pipeline_parallel_schedule_csv = {_toml_str(schedule_csv)}")
    lines.append("pipeline_parallel_microbatch_size = 1")
    lines.append("module_fqns_per_model_part = [")
    for part in parts:
        lines.append("    [" + ", ".join(_toml_str(x) for x in part) + "],")
    lines.append("]")
    lines += ["", "[activation_checkpoint]"] + [f"{k} = {_toml_str(v)}" for k, v in ac.items()]
    lines += ["", "[training]", f"local_batch_size = {int(micro_batches)}  # m micro-batches of size 1"]
    return "\n".join(lines) + "\n"


def render_python(*, degree: int, schedule: str, parts: Sequence[Sequence[str]], ac: str, micro_batches: int,
                  base_config: str = DEFAULT_BASE_CONFIG, schedule_csv: str | None = None,
                  comments: Sequence[str] = ()) -> str:
    """A torchtitan >= 0.3 config module: ``sapptk_plan()`` returns ``base_config`` (``module:function``)
    with the pipeline fields, the module lists and the activation checkpointing (``ac`` a key of
    :data:`PYTHON_AC`) of the plan. ``schedule_csv``: a file name next to the module."""
    if not isinstance(base_config, str) or base_config.count(":") != 1 or not all(base_config.split(":")):
        raise ConfigError(f"base_config = {base_config!r}: expected 'module:function', e.g. {DEFAULT_BASE_CONFIG!r}")
    layers = sum(1 for part in parts for name in part if _LAYER.fullmatch(name))
    doc = [one_line(c).replace("\\", "\\\\") for c in comments] + [
        f"For {PYTHON_VERSIONS}; the TOML export serves torchtitan <= 0.2.2.",
        "Run with the folder of this file on PYTHONPATH:",
        "    torchrun ... -m torchtitan.train --module <this module's name> --config sapptk_plan",
        "sapptk_plan() starts from BASE_CONFIG (edit it: your model's config function) and sets the pipeline.",
    ]
    lines = ['"""' + doc[0], *doc[1:], '"""', "", "import importlib", "import os", "",
             "from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC  # noqa: F401", "",
             f"BASE_CONFIG = {base_config!r}", f"NUM_LAYERS = {layers}"]
    csv_line = '""'
    if schedule_csv is not None:
        lines.append(f"SCHEDULE_CSV = os.path.join(os.path.dirname(os.path.abspath(__file__)), {schedule_csv!r})")
        csv_line = "SCHEDULE_CSV"
    lines += ["", "", "def sapptk_plan():",
              '    module, function = BASE_CONFIG.split(":")',
              "    config = getattr(importlib.import_module(module), function)()",
              '    layers = getattr(getattr(config.model_spec, "model", None), "layers", None)',
              "    if layers is not None and len(layers) != NUM_LAYERS:",
              '        raise ValueError(f"{BASE_CONFIG} builds {len(layers)} layers: "',
              '                         f"the sapptk plan places {NUM_LAYERS}")',
              "    parallelism = config.parallelism",
              f"    parallelism.pipeline_parallel_degree = {int(degree)}",
              f"    parallelism.pipeline_parallel_schedule = {schedule!r}",
              f"    parallelism.pipeline_parallel_schedule_csv = {csv_line}",
              "    parallelism.pipeline_parallel_microbatch_size = 1",
              "    parallelism.module_fqns_per_model_part = ["]
    lines += [f"        {list(part)!r}," for part in parts]
    lines += ["    ]", f"    config.activation_checkpoint = {PYTHON_AC[ac]}",
              f"    config.training.local_batch_size = {int(micro_batches)}  # m micro-batches of size 1",
              "    config.training.disable_cuda_graphs = True  # torchtitan 0.3 refuses CUDA graphs with pipelines",
              "    return config"]
    return "\n".join(lines) + "\n"


def _fail(source: str, message: str) -> ConfigError:
    return ConfigError(f"{source}: {message}")


def read(text: str, source: str = "<toml>") -> TorchtitanConfig:
    """Parse a torchtitan job file (or fragment) and check the pipeline keys."""
    data = load_toml_text(text, source=source, error=ConfigError)  # nesting and Unicode guards of sapptk.files
    par = data.get("parallelism")
    if not isinstance(par, dict):
        raise _fail(source, "no [parallelism] table: expected pipeline_parallel_degree, pipeline_parallel_schedule, "
                            "module_fqns_per_model_part")
    degree = checks.integer(par.get("pipeline_parallel_degree"), f"{source}: parallelism.pipeline_parallel_degree",
                            error=ConfigError, low=1, high=checks.MAX_INDEX)
    schedule = par.get("pipeline_parallel_schedule", "1F1B")
    if not isinstance(schedule, str):
        raise _fail(source, f"parallelism.pipeline_parallel_schedule = {schedule!r}: expected a schedule name")
    csv = par.get("pipeline_parallel_schedule_csv") or None
    if csv is not None and not isinstance(csv, str):
        raise _fail(source, f"parallelism.pipeline_parallel_schedule_csv = {csv!r}: expected a path")
    parts = par.get("module_fqns_per_model_part")
    if not isinstance(parts, list) or not parts or not all(
        isinstance(p, list) and all(isinstance(x, str) for x in p) for p in parts
    ):
        raise _fail(source, f"parallelism.module_fqns_per_model_part = {str(parts)[:60]}: expected a list of lists of "
                            "module names, one list per model part (virtual stage)")
    size = par.get("pipeline_parallel_microbatch_size", 1)
    training = data.get("training") if isinstance(data.get("training"), dict) else {}
    batch = training.get("local_batch_size")
    micro_batches = None
    if batch is not None:
        if not isinstance(size, int) or size < 1 or not isinstance(batch, int) or batch % size:
            raise _fail(source, f"training.local_batch_size = {batch!r} with pipeline_parallel_microbatch_size = "
                                f"{size!r}: expected a batch divisible by the micro-batch size")
        micro_batches = batch // size
    ac_table = data.get("activation_checkpoint", {"mode": "none"})
    if not isinstance(ac_table, dict):
        raise _fail(source, f"activation_checkpoint = {ac_table!r}: expected a table")
    ac = {k: str(v) for k, v in ac_table.items() if k in ("mode", "selective_ac_option")}
    ac.setdefault("mode", "selective")  # torchtitan's default
    return TorchtitanConfig(degree, schedule, csv, tuple(tuple(p) for p in parts), ac, micro_batches)


def layers_of_parts(parts: Sequence[Sequence[str]], *, body_layers: int, source: str) -> np.ndarray:
    """Body layers per virtual stage; layers numbered 0..N-1 in order, head first, tail last."""
    layers = np.zeros(len(parts), dtype=np.int64)
    expect = 0
    for i, part in enumerate(parts):
        for name in part:
            label = f"module_fqns_per_model_part[{i}]: {checks.show(name)}"
            match = _LAYER.fullmatch(name)
            if match:
                if len(match.group(1)) > len(str(checks.MAX_INDEX)) or int(match.group(1)) != expect:
                    raise _fail(source, f"{label}: expected layers.{expect} (layers in order, each once)")
                expect += 1
                layers[i] += 1
            elif name in HEAD_MODULES:
                if i != 0 or layers[i]:
                    raise _fail(source, f"{label}: expected the embedding first in part 0 (sapptk puts the head there)")
            elif name in TAIL_MODULES:
                if i != len(parts) - 1:
                    raise _fail(source, f"{label}: expected in the last part (sapptk puts the tail there)")
            else:
                raise _fail(source, f"{label}: expected tok_embeddings, layers.<i>, norm or output")
    if expect != body_layers:
        raise _fail(source, f"module_fqns_per_model_part holds {expect} layers: expected {body_layers}, the profile's "
                            "body layers")
    return layers


def ac_counts(profile: Any, layers: Sequence[int], ac: Mapping[str, str], *, placement: Sequence[int],
              source: str = "<toml>") -> np.ndarray:
    """The counts torchtitan's activation checkpointing gives on this partition."""
    mode = ac.get("mode")
    option = ac.get("selective_ac_option", "2")
    if mode == "none":
        return counts_from_layers(profile, layers)
    if mode == "full":
        return counts_from_layers(profile, layers, lambda vs, pos: _FULL)
    if mode != "selective":
        raise _fail(source, f"activation_checkpoint.mode = {mode!r}: expected none, full or selective "
                            "(memory_budget depends on the compiler and has no sapptk mode)")
    if option == "op":
        return counts_from_layers(profile, layers, lambda vs, pos: _SELECT)
    text = option.strip() if isinstance(option, str) else None
    if isinstance(option, int) and not isinstance(option, bool):
        every = option
    elif text is not None and text.lstrip("+-").isascii() and text.lstrip("+-").isdigit() and len(text) <= 4000:
        every = int(text)  # 4,000 digits: within Python's limit on converting text
    else:  # a float (2.5 is not "every 2nd layer"), a bool, 5,000 digits
        raise _fail(source, f"activation_checkpoint.selective_ac_option = {checks.show(option)}: expected 'op' or "
                            "an integer")
    if every < 0:
        raise _fail(source, f"activation_checkpoint.selective_ac_option = {checks.show(every)}: expected >= 0")
    every = min(every, checks.MAX_LAYERS + 1)  # the same answer (no layer reaches it), and no int64 overflow
    # torchtitan counts the layers of a rank over its model parts in order, 1-based
    before = np.zeros(len(layers), dtype=np.int64)
    seen: dict[int, int] = {}
    for vs, d in enumerate(placement):
        before[vs] = seen.get(d, 0)
        seen[d] = before[vs] + int(layers[vs])

    def mode_of(vs: int, pos: int) -> int:
        return _FULL if every == 0 or (before[vs] + pos + 1) % every == 0 else _NONE

    return counts_from_layers(profile, layers, mode_of)


# --------------------------------------------------------------------- plan level
def _every_layer(mode: int) -> Any:
    return lambda vs, pos: mode


def export(profile: Any, config: Any, counts: np.ndarray, simulation: Any, *, status: str = "given",
           csv_name: str | os.PathLike[str] = "schedule.csv",
           base_config: str = DEFAULT_BASE_CONFIG) -> TorchtitanExport:
    """A plan (``counts`` on ``config``, its ``simulation``) as torchtitan settings.

    The partition is exact; the schedule is named when a PyTorch class runs the same order,
    else exported as a schedule CSV (``csv_name``; the TOML names it by its absolute path,
    resolved against the current directory when relative). Activation checkpointing is one
    mode for every layer: the plan's own when it is uniform, else the fastest uniform mode
    that fits the budget (the least memory when none fits); the export reports both step
    times. ``python`` is the same plan for torchtitan >= 0.3, changing ``base_config``.
    """
    from sapptk.costs import simulate_counts

    c = config
    program = c.program()
    layers = np.asarray(counts).sum(axis=(0, 1))
    named = None if c.custom_program is not None else torch_schedule(c.schedule, c.stages, c.micro_batches, c.chunks)
    csv = None
    if named is None:
        csv = program.to_csv()  # ScheduleError for sequence slices
        v_shape = any(d != vs % c.stages for vs, d in enumerate(program.placement))
        named = "ZBVZeroBubble" if v_shape else ("Interleaved1F1B" if c.chunks > 1 else "1F1B")
    candidates = {
        mode: counts_from_layers(profile, layers, _every_layer(MODES.index(mode)))
        for mode in AC_SETTINGS if all(mode in g.modes for g in profile.body)
    }
    exact = next((m for m, cnt in candidates.items() if np.array_equal(cnt, counts)), None)
    notes: list[str] = []
    if exact is not None:
        mode = exact
    else:
        mode, fits = closest(profile, c, candidates)
        notes.append(f"activation checkpointing: the plan uses {modes_used(counts)}; torchtitan applies one mode to "
                     f"every layer, so it runs {mode!r}" + ("" if fits else ", the least memory it can, still over "
                                                                            "the budget"))
    expressed = simulate_counts(profile, c, candidates[mode])
    head = (f"sapptk plan for torchtitan: profile {profile.name!r}, schedule {c.schedule!r}, p = {c.stages}, "
            f"v = {c.chunks}, m = {c.micro_batches}; status {status}")
    csv_path = None if csv is None else str(Path(csv_name).resolve())
    comments = [head, f"for {TOML_VERSIONS}; torchtitan >= 0.3 reads the Python form (TorchtitanExport.python)"]
    if csv is not None:
        comments.append(f"no PyTorch class runs {c.schedule!r}: its order is the schedule CSV named below (written "
                        "by plan.export('torchtitan', path) or sapptk export; an absolute path, so any launch "
                        "directory works)")
    settings = {
        "toml": {"degree": c.stages, "schedule": named, "parts": fqns(layers), "ac": AC_SETTINGS[mode],
                 "micro_batches": c.micro_batches, "comments": comments},
        "python": {"degree": c.stages, "schedule": named, "parts": fqns(layers, tail_modules=TAIL_MODULES_0_3),
                   "ac": mode, "micro_batches": c.micro_batches, "base_config": base_config,
                   "comments": [head] + ([] if csv is None else [f"no PyTorch class runs {c.schedule!r}: the schedule "
                                                                  "CSV sits next to this module"])},
    }
    toml = render(**settings["toml"], schedule_csv=csv_path)
    python = render_python(**settings["python"], schedule_csv=None if csv is None else Path(csv_name).name)
    peak = float(expressed.peak_memory.max())
    return TorchtitanExport(
        toml=toml, csv=csv, csv_name=csv_path, schedule=named, ac=dict(AC_SETTINGS[mode]), python=python,
        settings=settings,
        notes=tuple(notes), step_time_ms=simulation.step_time, peak_mb=float(simulation.peak_memory.max()),
        expressed_step_time_ms=expressed.step_time, expressed_peak_mb=peak,
        expressed_fits=fits_budget(peak, c.memory_budget),
        expressed_counts=candidates[mode],
    )


def decode(source: Any, profile: Any, config: Any = None, *,
           csv: str | os.PathLike[str] | None = None) -> tuple[Any, np.ndarray, str]:
    """``(setup, counts, where)`` from torchtitan settings: a TOML file or its text.

    Stages, chunks and the schedule come from the file, the micro-batches from ``[training]
    local_batch_size`` when present; ``config`` gives the other fields (budget, comm,
    recompute, ...) and, without a batch size in the file, the micro-batches; where both say
    something they must agree. A ``pipeline_parallel_schedule_csv`` is read from ``csv`` when
    given, else relative to the TOML file.
    """
    from sapptk.config import PipelineConfig
    from sapptk.schedules import from_csv

    where, text, base = "<toml>", source, None
    if isinstance(source, os.PathLike) or (isinstance(source, str) and "\n" not in source and "=" not in source):
        where = os.fspath(source)
        base = Path(where).parent
        text = read_text(where, what="torchtitan file", error=ConfigError)
    if not isinstance(text, str):
        raise ConfigError(f"source = {source!r}: expected a TOML file path or TOML text")
    tt = read(text, where)
    p = tt.degree
    if len(tt.parts) % p:
        raise _fail(where, f"{len(tt.parts)} model parts on pipeline_parallel_degree = {p} ranks: expected a multiple "
                           "(one part per virtual stage)")
    v = len(tt.parts) // p
    layers = layers_of_parts(tt.parts, body_layers=profile.num_body_layers, source=where)
    m = tt.micro_batches if tt.micro_batches is not None else (None if config is None else config.micro_batches)
    if m is None:
        raise _fail(where, "no [training] local_batch_size: pass a config for the micro-batches")
    fields: dict[str, Any] = {}
    if config is not None:
        for name, value in (("stages", p), ("chunks", v), ("micro_batches", m)):
            if getattr(config, name) != value:
                raise _fail(where, f"{name} = {value} in the file, {getattr(config, name)} in the config")
        fields = {f: getattr(config, f) for f in ("memory_budget", "constant_memory", "comm", "recompute")}
    try:
        if tt.schedule_csv is not None:
            csv_path = Path(csv) if csv is not None else (base / tt.schedule_csv if base else Path(tt.schedule_csv))
            setup = PipelineConfig.from_program(from_csv(csv_path), **fields)
            if (setup.stages, setup.chunks, setup.micro_batches) != (p, v, m):
                raise _fail(where, f"the schedule CSV {csv_path} runs p = {setup.stages}, v = {setup.chunks}, m = "
                                   f"{setup.micro_batches}: the file says p = {p}, v = {v}, m = {m}")
        else:
            setup = PipelineConfig(stages=p, micro_batches=m, chunks=v,
                                   schedule=sapptk_schedule(tt.schedule, v, where), **fields)
        setup.validate()
        counts = ac_counts(profile, layers, tt.ac, placement=setup.program().placement, source=where)
    except ValueError as exc:
        message = str(exc)
        raise ConfigError(message if message.startswith(where) else f"{where}: {message}") from None
    return setup, counts, where


# --------------------------------------------------------------------- plan level
_SUFFIXES = (".toml", ".py", "")


def plan_export(plan: Plan, path: str | os.PathLike[str] | None = None, *, base_config: str = DEFAULT_BASE_CONFIG,
                csv_name: str | os.PathLike[str] | None = None) -> Export:
    """The plan as torchtitan settings (:func:`export`): ``texts`` holds ``"toml"`` (torchtitan
    <= 0.2.2, what is lost as comments; also ``text``), ``"python"`` (the config module for >= 0.3,
    starting from ``base_config``) and, when no PyTorch class runs the schedule, ``"csv"``;
    ``data`` the :class:`TorchtitanExport`.

    ``path`` names the files' stem (``job``, ``job.toml`` or ``job.py``): ``job.toml``, ``job.py``
    and ``job_schedule.csv`` are written side by side (the module is imported by its stem, so
    make it a Python identifier). ``csv_name`` overrides the CSV's path; without a ``path`` it
    defaults to ``schedule.csv``, resolved against the current directory (the TOML names the
    CSV by its absolute path). Refused (ConfigError, saying why): no assignment, activation
    offload, sequence slices, recompute per micro-batch.
    """
    out = check_path(path, "export('torchtitan')")
    if out is not None and out.suffix.lower() not in _SUFFIXES:
        raise ConfigError(f"export('torchtitan'): path = {os.fspath(out)!r}: expected a name ending in .toml or .py "
                          "(or none): the TOML and the Python config are written side by side with that stem")
    need_solution(plan, "torchtitan settings")
    refuse_levers(plan, "torchtitan")  # offload, sequence slices, recompute per micro-batch (sapptk.levers)
    files: dict[str, Path] = {}
    if out is not None:
        stem = out.with_suffix("") if out.suffix.lower() in (".toml", ".py") else out
        files = {"toml": stem.with_name(stem.name + ".toml"), "python": stem.with_name(stem.name + ".py"),
                 "csv": stem.with_name(stem.name + "_schedule.csv")}
    csv_path = Path(csv_name) if csv_name is not None else files.get("csv", Path("schedule.csv"))
    data = export(plan.profile, plan.config, plan.counts, plan.simulation, status=plan.status,
                  csv_name=csv_path.resolve(), base_config=base_config)
    texts = {"toml": data.text(), "python": data.python}
    if data.csv is not None:
        texts["csv"] = data.csv
        files["csv"] = csv_path
    written = {} if out is None else write_files("torchtitan", {r: (files[r], t) for r, t in texts.items()})
    return make_export("torchtitan", texts["toml"], texts, written, notes=data.notes, step_time_ms=data.step_time_ms,
                       expressed_step_time_ms=data.expressed_step_time_ms, data=data)


def read_plan(source: Any, profile: Any, config: Any = None, *,
              csv: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The :func:`sapptk.plan.make_plan` arguments (plus ``where``) of torchtitan settings: a
    TOML file or its text (:func:`decode`). Stages, chunks, schedule and micro-batches come from
    the file; ``config`` gives the other fields and must agree where both speak."""
    check_inputs(profile, config, "load_plan(format='torchtitan')", optional_config=True)
    setup, counts, where = decode(source, profile, config, csv=csv)
    return {"where": where, "profile": profile, "config": setup, "counts": counts, "status": "given",
            "source": "torchtitan"}
