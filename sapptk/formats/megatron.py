"""Megatron-LM's pipeline layout and recompute flags, both ways (codecs on counts).

Layout
------
``--pipeline-model-parallel-layout`` lists the layers of every virtual stage in virtual
stage order (virtual stage ``c·p + s`` is model chunk c on rank s), stages separated by
``|``: ``E`` the embedding (sapptk's head), ``t`` a decoder layer (any body layer), ``L`` the
loss (sapptk's tail), ``m`` a multi-token-prediction (MTP) layer: sapptk counts it in the
tail (the bundled ``deepseek_v3`` profile's tail is the MTP module and the LM head), so ``m``
is read as a marker, after the last decoder layer, and its cost stays on the last virtual
stage with ``L`` (a layout such as ``Et*3|(tt|)*29,m|L`` then has an empty stage where
Megatron runs the MTP layer). Megatron's grammar: commas are
cosmetic; ``X*n`` repeats the character X n times; ``(…)*n`` repeats the bracketed text n
times (no nesting); empty stages are allowed (``E||t|L``). ``Et*3|(tt|)*2,t|tL`` is
E t t t | t t | t t | t | t L (the comma only separates the group from what follows).
A layout is refused before it is expanded when it would expand to more than
:data:`MAX_LAYOUT_CHARS` characters (``t*1000000000``); integer flags are bounded before they
enter an array. (Over 500 lines: the grammar, its size guard, the argument reader and the
exporter share one set of rules.)
:func:`format_layout` writes the shortest form of that kind; :func:`parse_layout` reads any
and names the position of a bad character.

Uniform flags
-------------
Without a layout Megatron splits the decoder layers evenly: every rank the same count, every
chunk of a rank the same count; ``--decoder-first-pipeline-num-layers`` and
``--decoder-last-pipeline-num-layers`` set the first and the last rank apart (the others
split the rest evenly), and with chunks ``--num-virtual-stages-per-pipeline-rank v`` is
needed. :func:`uniform_args` says whether a layout can be spelled so.

Recompute
---------
Megatron applies one recompute setting to every model chunk of every rank:

* ``--recompute-granularity full --recompute-method block --recompute-num-layers k``: the
  first k decoder layers of every chunk recompute fully (a chunk with fewer recomputes all);
  ``--recompute-method uniform --recompute-num-layers 1`` recomputes every layer;
* ``--recompute-granularity selective --recompute-modules core_attn``: every layer
  recomputes its attention core (sapptk's ``select``); selective and full do not mix;
* nothing: no recompute.

So Megatron cannot express, per stage: a different number of fully recomputed layers on
different chunks, select on some layers only, select next to full, sapptk's ``comm`` and
``both`` modes (MindSpore's communication-operator recompute), or the uniform method with
groups of more than one layer (its memory lies between sapptk's modes). A plan using any of
these is exported with the closest setting Megatron has (:func:`recompute_candidates`;
``plan.export("megatron")`` picks the fastest that fits and reports the cost).

Plan level: :func:`plan_export` (``plan.export("megatron", path)``) and :func:`read_plan`
(``sapptk.load_plan(source, "megatron", profile=..., config=...)``; a file written by the
export is read back: its ``#`` comment lines are skipped).

(About 500 lines: the layout grammar, the uniform flags and the recompute flags are the
three parts of one set of arguments, written and read back together.)
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk import checks
from sapptk.costs import fits_budget
from sapptk.errors import ConfigError
from sapptk.files import read_text
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
from sapptk.profile import MAX_LAYERS, MODES

if TYPE_CHECKING:
    from sapptk.plan import Plan

__all__ = [
    "MegatronExport",
    "decode",
    "export",
    "format_layout",
    "parse_args",
    "parse_layout",
    "plan_export",
    "read_plan",
    "recompute_args",
    "recompute_candidates",
    "recompute_counts",
    "uniform_args",
    "uniform_layers",
]

_NONE, _SELECT, _FULL = (MODES.index(m) for m in ("none", "select", "full"))
_ALLOWED = set("EtLm|,()*0123456789 ")


@dataclass(frozen=True)
class MegatronExport(ExpressedCost):
    """A plan spelled as Megatron-LM arguments.

    ``args``: the arguments to pass (layout form); ``uniform``: the same partition with the
    uniform-layout flags, or None (``uniform_reason`` says why not); ``recompute``: the
    recompute flags (part of ``args``); ``schedule``: what Megatron runs (``1f1b``, or
    ``interleaved-megatron`` with ``group_size`` micro-batches per group); ``notes``: what
    the plan holds that Megatron cannot express; ``step_time_ms`` and ``peak_mb`` of the plan
    as made, ``expressed_*`` of what Megatron runs (the closest expressible recompute on
    Megatron's schedule), ``expressed_counts`` its layer assignment.
    """

    layout: str
    args: tuple[str, ...]
    recompute: tuple[str, ...]
    uniform: tuple[str, ...] | None
    uniform_reason: str
    schedule: str
    group_size: int
    notes: tuple[str, ...]
    step_time_ms: float | None = None
    peak_mb: float | None = None
    expressed_step_time_ms: float | None = None
    expressed_peak_mb: float | None = None
    expressed_fits: bool | None = None
    expressed_counts: np.ndarray | None = field(default=None, repr=False)

    def command_line(self) -> str:
        """The arguments as one shell-quoted line."""
        return " ".join(shlex.quote(a) for a in self.args)

    def text(self) -> str:
        """A human-readable account: the arguments, the uniform alternative, what is lost."""
        lines = ["# Megatron-LM arguments (sapptk export)", self.command_line()]
        if self.uniform is not None:
            lines += ["# the same partition with uniform-layout flags instead of the layout:",
                      " ".join(shlex.quote(a) for a in self.uniform)]
        else:
            lines.append(f"# no uniform-layout flags: {one_line(self.uniform_reason)}")
        lines.append(f"# Megatron runs {self.schedule}"
                     + (f" in groups of {self.group_size} micro-batches" if self.schedule != "1f1b" else ""))
        if self.notes:
            lines.append("# what Megatron cannot express, and what it runs instead:")
            lines += [f"#   {one_line(n)}" for n in self.notes]
        if self.cost_ms is not None:
            lines.append(
                f"# step time: plan {self.step_time_ms:.1f} ms, as Megatron runs it {self.expressed_step_time_ms:.1f} "
                f"ms ({self.cost_ms:+.1f} ms); peak {self.peak_mb:.0f} -> {self.expressed_peak_mb:.0f} MB"
                + ("" if self.expressed_fits else " (over the budget)")
            )
        return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- layout
def format_layout(layers: Sequence[int], *, head: bool = True, tail: bool = True) -> str:
    """The layout string of ``layers`` decoder layers per virtual stage (in virtual stage order).

    ``E`` opens the first stage and ``L`` closes the last (Megatron needs both, whether or
    not the profile models a head and a tail). Runs of equal stages are written ``(…|)*n``.
    """
    stages = []
    for i, n in enumerate(layers):
        n = int(n)
        if n < 0:
            raise ConfigError(f"virtual stage {i}: {n} layers: expected >= 0")
        body = "" if n == 0 else ("t" if n == 1 else ("tt" if n == 2 else f"t*{n}"))
        stages.append(("E" if head and i == 0 else "") + body + ("L" if tail and i == len(layers) - 1 else ""))
    out: list[str] = []
    i = 0
    while i < len(stages):
        j = i
        while j + 1 < len(stages) and stages[j + 1] == stages[i]:
            j += 1
        run = j - i + 1
        last = j == len(stages) - 1
        if run >= 3 and stages[i] and not last:
            out.append(f"({stages[i]}|)*{run},")
        elif run >= 3 and stages[i]:  # a run that ends the layout: no trailing separator
            out.append(f"({stages[i]}|)*{run - 1}," + stages[i])
        else:
            out.append("|".join(stages[i : j + 1]) + ("" if last else "|"))
        i = j + 1
    return "".join(out)


def _check_grammar(text: str) -> None:
    for i, ch in enumerate(text):
        if ch not in _ALLOWED:
            raise ConfigError(
                f"layout {text!r}, position {i + 1}: character {ch!r}: expected E, t, L, m, '|', ',', "
                "'(' ... ')*n' or '*n'"
            )
    depth = 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
            if depth > 1:
                raise ConfigError(f"layout {text!r}, position {i + 1}: nested '(': Megatron's grammar has no nesting")
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"layout {text!r}, position {i + 1}: ')' without '('")
            if not re.match(r"\)\*\d+", text[i:]):
                raise ConfigError(f"layout {text!r}, position {i + 1}: ')' must be followed by '*' and a count")
        elif ch == "*" and (i == 0 or text[i - 1] in "|,(*" or not re.match(r"\*\d+", text[i:])):
            raise ConfigError(f"layout {text!r}, position {i + 1}: '*' must follow a layer or ')' and precede a count")
    if depth:
        raise ConfigError(f"layout {text!r}: '(' without ')'")


MAX_LAYOUT_CHARS = checks.MAX_LAYOUT_CHARS
"""Characters a layout string may expand to (a layer and a '|' per stage, at most
``sapptk.profile.MAX_LAYERS`` layers): ``t*1000000000`` is refused before it is expanded."""


def _expand(flat: str, text: str) -> str:
    """Megatron's expansion of a grammar-checked layout: ``(…)*n`` first, then ``x*n``; each
    step's length computed (and refused above :data:`MAX_LAYOUT_CHARS`) before it is built."""

    def count(digits: str) -> int:  # bounded before conversion: a 5,000-digit count is refused, not parsed
        if len(digits) > 10:
            raise ConfigError(f"layout {checks.show(text)}: repeat count {digits[:20]}... ({len(digits)} digits): "
                              f"expected at most {MAX_LAYOUT_CHARS:,}")
        return int(digits)

    for pattern, width in ((r"\(([^)]+)\)\*(\d+)", lambda mt: len(mt.group(1))), (r"(.)\*(\d+)", lambda mt: 1)):
        matches = list(re.finditer(pattern, flat))
        length = len(flat) + sum(width(mt) * count(mt.group(2)) - len(mt.group(0)) for mt in matches)
        checks.size(length, f"layout {checks.show(text)}: expands to", error=ConfigError, limit=MAX_LAYOUT_CHARS,
                    what="characters", constant="sapptk.formats.megatron.MAX_LAYOUT_CHARS")
        flat = re.sub(pattern, lambda mt: mt.group(1) * int(mt.group(2)), flat)
    return flat


def parse_layout(text: str) -> list[str]:
    """The layer characters of every stage of a layout string, in Megatron's grammar."""
    if not isinstance(text, str) or not text.strip():
        raise ConfigError(f"layout = {text!r}: expected a layout string such as 'Et*3|(tt|)*29,m|L'")
    text = text.strip().replace(" ", "")
    _check_grammar(text)
    flat = _expand(text.replace(",", ""), text)  # Megatron's expansion: (…)*n first, then x*n
    if set(flat) - set("EtLm|"):
        raise ConfigError(f"layout {text!r}: expands to {flat[:60]!r}, which is not only E, t, L, m and '|'")
    return flat.split("|")


def uniform_layers(stages: int, chunks: int, total: int, first: int | None = None,
                   last: int | None = None) -> np.ndarray:
    """Decoder layers per virtual stage of Megatron's uniform split (virtual stage order).

    Raises :class:`ConfigError` where Megatron refuses the numbers.
    """
    p, v = stages, chunks
    rest, ranks = total, p
    if first is not None:
        rest, ranks = rest - first, ranks - 1
    if last is not None:
        rest, ranks = rest - last, ranks - 1
    if rest < 0 or (ranks > 0 and rest % ranks):
        raise ConfigError(f"{total} decoder layers, first {first}, last {last}: the other {max(ranks, 0)} rank(s) "
                          f"must share {rest} layers evenly")
    per_rank = np.full(p, rest // ranks if ranks > 0 else 0, dtype=np.int64)
    if first is not None:
        per_rank[0] = first
    if last is not None:
        per_rank[-1] = last
    if (per_rank % v).any():
        s = int(np.flatnonzero(per_rank % v)[0])
        raise ConfigError(f"rank {s} holds {int(per_rank[s])} layers: not divisible by {v} chunks")
    return np.tile(per_rank // v, v)


def uniform_args(layers: np.ndarray, stages: int, chunks: int) -> tuple[tuple[str, ...] | None, str]:
    """The uniform-layout flags for ``layers`` per virtual stage, or ``(None, why not)``."""
    p, v = stages, chunks
    grid = np.asarray(layers, dtype=np.int64).reshape(v, p)  # [chunk][rank]
    if (grid != grid[0]).any():
        c, s = (int(x) for x in np.argwhere(grid != grid[0])[0])
        return None, (f"rank {s} holds {int(grid[0, s])} layers on chunk 0 and {int(grid[c, s])} on chunk {c}: "
                      "Megatron's uniform split gives every chunk of a rank the same count")
    per_rank = grid.sum(axis=0)
    total = int(per_rank.sum())
    middle = per_rank[1:-1] if p > 2 else per_rank[:0]
    if len(middle) and (middle != middle[0]).any():
        s = 1 + int(np.flatnonzero(middle != middle[0])[0])
        return None, (f"ranks 1..{p - 2} hold {', '.join(map(str, middle))} layers: Megatron's uniform split sets "
                      "only the first and the last rank apart")
    args: list[str] = []
    if v > 1:
        args += ["--num-virtual-stages-per-pipeline-rank", str(v)]
    even = total // p if total % p == 0 else None
    if p == 1 or (even is not None and (per_rank == even).all()):
        return tuple(args), ""
    mid = int(middle[0]) if len(middle) else None
    first, last = mid is None or per_rank[0] != mid, mid is None or per_rank[-1] != mid
    # Megatron's TransformerConfig refuses 0 for either flag, and middle ranks without layers
    for flag, on, rank in ((first, "first", 0), (last, "last", p - 1)):
        if flag and per_rank[rank] == 0:
            return None, (f"rank {rank} holds no layers: Megatron's --decoder-{on}-pipeline-num-layers must be > 0")
    if mid == 0:
        return None, f"ranks 1..{p - 2} hold no layers: Megatron's uniform split needs layers on the middle ranks"
    if first:
        args += ["--decoder-first-pipeline-num-layers", str(int(per_rank[0]))]
    if last:
        args += ["--decoder-last-pipeline-num-layers", str(int(per_rank[-1]))]
    return tuple(args), ""


# ------------------------------------------------------------------------- recompute
def recompute_args(kind: str, k: int = 0) -> tuple[str, ...]:
    """Megatron's flags for ``"none"``, ``"select"``, ``"full"`` (every layer) or ``"block"`` (first k)."""
    if kind == "none":
        return ()
    if kind == "select":
        return ("--recompute-granularity", "selective", "--recompute-modules", "core_attn")
    if kind == "full":
        return ("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1")
    return ("--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", str(k))


def recompute_candidates(profile: Any, layers: Sequence[int]) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """Every recompute setting Megatron can express on this partition that the profile can
    run: ``{label: (flags, counts)}`` — none, select (every layer), full on the first k
    layers of every chunk for each useful k, full on every layer."""
    layers = np.asarray(layers, dtype=np.int64)
    body = tuple(profile.body)
    top = int(layers.max(initial=0))
    out: dict[str, tuple[tuple[str, ...], np.ndarray]] = {}

    def offered(modes: set[int]) -> bool:
        return all(MODES[r] in g.modes for g in body for r in modes)

    if offered({_NONE}):
        out["none"] = ((), counts_from_layers(profile, layers))
    if offered({_SELECT}):
        out["select"] = (recompute_args("select"), counts_from_layers(profile, layers, lambda vs, pos: _SELECT))
    if offered({_FULL}) and top:
        if offered({_NONE}):
            for k in range(1, top):
                first_k = counts_from_layers(profile, layers, lambda vs, pos, k=k: _FULL if pos < k else _NONE)
                out[f"block {k}"] = (recompute_args("block", k), first_k)
        out["full"] = (recompute_args("full"), counts_from_layers(profile, layers, lambda vs, pos: _FULL))
    return out


def parse_args(args: str | Sequence[str] | Mapping[str, Any]) -> dict[str, Any]:
    """Megatron arguments (a command line, a list of arguments, or a mapping of flag names
    with or without ``--``) as ``{flag name: value}``; values of ``--recompute-modules`` are a
    list, the others text. Unknown flags are kept (and ignored by the readers)."""
    if isinstance(args, Mapping):
        out = {}
        for key, value in args.items():
            name = str(key).lstrip("-").replace("_", "-")
            out[name] = value
        return out
    tokens = shlex.split(args) if isinstance(args, str) else [str(a) for a in args]
    out: dict[str, Any] = {}
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            raise ConfigError(f"Megatron arguments: {token!r} (argument {i + 1}): expected a flag starting with '--'")
        name, eq, value = token[2:].partition("=")
        values = [value] if eq else []
        i += 1
        while i < len(tokens) and not tokens[i].startswith("--"):
            values.append(tokens[i])
            i += 1
        if name == "recompute-modules":
            out[name] = values
        elif len(values) == 1:
            out[name] = values[0]
        elif not values:
            out[name] = True
        else:
            raise ConfigError(f"Megatron arguments: --{name} {' '.join(values)}: expected one value")
    return out


def recompute_counts(profile: Any, layers: Sequence[int], flags: Mapping[str, Any]) -> np.ndarray:
    """The counts Megatron's recompute flags give on this partition (see the module docstring)."""
    granularity = flags.get("recompute-granularity")
    method = flags.get("recompute-method")
    number = flags.get("recompute-num-layers")
    modules = flags.get("recompute-modules")
    if granularity in (None, "none"):
        for name in ("recompute-method", "recompute-num-layers", "recompute-modules"):
            if flags.get(name) is not None:
                raise ConfigError(f"--{name} = {flags[name]!r} without --recompute-granularity: expected "
                                  "--recompute-granularity full or selective")
        return counts_from_layers(profile, layers)
    if granularity == "selective":
        mods = ["core_attn"] if modules is None else [str(m) for m in (modules if isinstance(modules, list)
                                                                        else str(modules).split())]
        if mods != ["core_attn"]:
            raise ConfigError(f"--recompute-modules {' '.join(mods)}: sapptk's profiles measure 'select' as the "
                              "attention core only: expected core_attn")
        if number is not None:
            raise ConfigError("--recompute-num-layers with selective granularity: Megatron needs it unset")
        return counts_from_layers(profile, layers, lambda vs, pos: _SELECT)
    if granularity != "full":
        raise ConfigError(f"--recompute-granularity = {granularity!r}: expected full or selective")
    if number is None or isinstance(number, bool):
        raise ConfigError(f"--recompute-num-layers = {number!r}: expected a layer count (full granularity needs "
                          "it)")
    k = _flag_int(flags, "recompute-num-layers", None)
    if k < 1:
        raise ConfigError(f"--recompute-num-layers = {k}: expected >= 1")
    if method == "uniform":
        if k != 1:
            raise ConfigError(f"--recompute-method uniform --recompute-num-layers {k}: groups of {k} layers keep one "
                              "input per group, between sapptk's modes; only 1 (every layer full) can be read")
        return counts_from_layers(profile, layers, lambda vs, pos: _FULL)
    if method != "block":
        raise ConfigError(f"--recompute-method = {method!r}: expected uniform or block")
    return counts_from_layers(profile, layers, lambda vs, pos: _FULL if pos < k else _NONE)


def layers_of_layout(stages_text: list[str], *, stages: int, body_layers: int, text: str) -> np.ndarray:
    """Decoder layers per virtual stage of a parsed layout, checked against the setup and profile."""
    n = len(stages_text)
    if n % stages:
        raise ConfigError(f"layout {text!r}: {n} stages: expected a multiple of the {stages} pipeline stages "
                          "(one entry per virtual stage)")
    flat = "".join(stages_text)
    if "m" in flat and "t" in flat[flat.index("m"):]:
        raise ConfigError(f"layout {text!r}: an MTP layer ('m') before a decoder layer ('t'): expected the MTP "
                          "layers after the last decoder layer (sapptk counts them in the tail)")
    for ch, what in (("E", "embedding"), ("L", "loss")):
        if flat.count(ch) != 1:
            raise ConfigError(f"layout {text!r}: {flat.count(ch)} '{ch}' ({what}): expected exactly one")
    if not stages_text[0].startswith("E"):
        raise ConfigError(f"layout {text!r}: 'E' must open virtual stage 0 (sapptk puts the head there)")
    if not stages_text[-1].endswith("L"):
        raise ConfigError(f"layout {text!r}: 'L' must close the last virtual stage (sapptk puts the tail there)")
    layers = np.array([s.count("t") for s in stages_text], dtype=np.int64)
    if int(layers.sum()) != body_layers:
        raise ConfigError(f"layout {text!r}: {int(layers.sum())} decoder layers ('t'): expected {body_layers}, the "
                          "profile's body layers")
    return layers


# --------------------------------------------------------------------- plan level
def line_layers(config: Any, counts: np.ndarray, runtime: str) -> np.ndarray:
    """Body layers per virtual stage, for runtimes that place virtual stage c·p + s on rank s."""
    program = config.program()
    p = config.stages
    if any(d != vs % p for vs, d in enumerate(program.placement)):
        raise ConfigError(
            f"schedule {config.schedule!r} places its chunks in a V (device of each virtual stage: "
            f"{list(program.placement)}): {runtime} runs virtual stage c·p + s on rank s"
        )
    return np.asarray(counts).sum(axis=(0, 1))


def export(profile: Any, config: Any, counts: np.ndarray, simulation: Any) -> MegatronExport:
    """A plan (``counts`` on ``config``, its ``simulation``) as Megatron-LM arguments.

    The layout is exact. Recompute is the plan's own when Megatron can express it, else the
    fastest expressible setting that fits the budget (the least peak when none fits),
    evaluated on the schedule Megatron runs (1F1B, or interleaved in Megatron's
    micro-batch groups); the export reports both step times and lists what was lost.
    Raises :class:`ConfigError` for V placements (Megatron has none).
    """
    from sapptk.costs import simulate_counts
    from sapptk.schedules.interleaved import megatron_group_size

    c = config
    layers = line_layers(c, counts, "Megatron-LM")
    p, v, m = c.stages, c.chunks, c.micro_batches
    schedule = "1f1b" if v == 1 else "interleaved-megatron"
    group = megatron_group_size(p, m) if v > 1 else p
    runs = c.replace(schedule=schedule, custom_program=None)
    candidates = recompute_candidates(profile, layers)
    exact = next((label for label, (_, cnt) in candidates.items() if np.array_equal(cnt, counts)), None)
    notes: list[str] = []
    if exact is not None:
        label = exact
    else:
        label, fits = closest(profile, runs, {lab: cnt for lab, (_, cnt) in candidates.items()})
        notes.append(f"recompute: the plan uses {modes_used(counts)}; Megatron applies one setting to every chunk, "
                     f"so it runs {label!r} ({' '.join(candidates[label][0]) or 'no recompute flags'})"
                     + ("" if fits else ", the least memory it can, still over the budget"))
    if runs.program().units != c.program().units:
        notes.append(f"schedule: the plan was made for {c.schedule!r}; Megatron runs {schedule!r}"
                     + (f" (micro-batch groups of {group})" if v > 1 else ""))
    flags, chosen = candidates[label]
    expressed = simulate_counts(profile, runs, chosen)
    budget = c.memory_budget
    head = ("--pipeline-model-parallel-size", str(p), "--num-layers", str(int(layers.sum())))
    grouping = ("--microbatch-group-size-per-virtual-pipeline-stage", str(group)) if v > 1 and group != p else ()
    layout = format_layout(layers)
    uniform, reason = uniform_args(layers, p, v)
    peak = float(expressed.peak_memory.max())
    return MegatronExport(
        layout=layout,
        args=(*head, "--pipeline-model-parallel-layout", layout, *grouping, *flags),
        recompute=flags,
        uniform=None if uniform is None else (*head, *uniform, *grouping, *flags),
        uniform_reason=reason,
        schedule=schedule,
        group_size=group,
        notes=tuple(notes),
        step_time_ms=simulation.step_time,
        peak_mb=float(simulation.peak_memory.max()),
        expressed_step_time_ms=expressed.step_time,
        expressed_peak_mb=peak,
        expressed_fits=fits_budget(peak, budget),
        expressed_counts=chosen,
    )


def _flag_int(flags: Mapping[str, Any], name: str, default: int | None) -> int | None:
    """An integer flag (text or a number) from 0 to ``MAX_LAYERS``, checked before it enters an array."""
    value = flags.get(name)
    if value is None:
        return default
    return checks.integer(value, f"--{name}", error=ConfigError, low=0, high=MAX_LAYERS, text=True)


def decode(source: Any, profile: Any, config: Any) -> np.ndarray:
    """The counts Megatron-LM arguments describe on ``config`` (stages and chunks must agree).

    ``source``: a layout string, a command line, a list of arguments or a mapping of flags.
    The partition comes from ``--pipeline-model-parallel-layout``, else from the
    uniform-layout flags; recompute from the recompute flags (none without them).
    """
    if not isinstance(source, str | Mapping | list | tuple):
        checks.fail(ConfigError, "Megatron arguments", source, "a layout string, a command line, a list of arguments "
                    "or a mapping of flags")
    try:
        if isinstance(source, str) and not source.lstrip().startswith("--"):
            flags: dict[str, Any] = {"pipeline-model-parallel-layout": source}
        else:
            flags = parse_args(source)
        p, v = config.stages, config.chunks
        body = profile.num_body_layers
        for name, want in (("pipeline-model-parallel-size", p), ("num-layers", body)):
            if flags.get(name) is not None and str(flags[name]) != str(want):
                what = "the setup's stages" if name.startswith("pipeline") else "the profile's body layers"
                raise ConfigError(f"--{name} = {flags[name]}: expected {want} ({what})")
        text = flags.get("pipeline-model-parallel-layout")
        if text is not None:
            stages = parse_layout(str(text))
            layers = layers_of_layout(stages, stages=p, body_layers=body, text=str(text))
            if len(layers) != p * v:
                raise ConfigError(f"layout {text!r}: {len(layers)} stages = {len(layers) // p} chunks per rank: the "
                                  f"setup has chunks = {v}")
        else:
            vv = _flag_int(flags, "num-virtual-stages-per-pipeline-rank", 1)
            if vv != v:
                raise ConfigError(f"--num-virtual-stages-per-pipeline-rank = {vv}: the setup has chunks = {v}")
            first, last = (_flag_int(flags, f"decoder-{k}-pipeline-num-layers", None) for k in ("first", "last"))
            layers = uniform_layers(p, v, body, first, last)
        return recompute_counts(profile, layers, flags)
    except ValueError as exc:  # ConfigError is a ValueError too
        raise ConfigError(f"Megatron arguments: {exc}") from None


# --------------------------------------------------------------------- plan level
def plan_export(plan: Plan, path: str | os.PathLike[str] | None = None) -> Export:
    """The plan as Megatron-LM arguments (:func:`export`): ``text`` (``texts["text"]``) is the
    command line with the uniform alternative and what is lost as ``#`` comments; ``data`` the
    :class:`MegatronExport` (``args``, ``layout``, ``uniform``, ``recompute``, ...). Written to
    ``path`` when given. Refused (ConfigError, saying why): no assignment, activation offload,
    sequence slices, recompute per micro-batch, V placements."""
    out = check_path(path, "export('megatron')")
    need_solution(plan, "Megatron-LM arguments")
    refuse_levers(plan, "megatron")  # offload, sequence slices, recompute per micro-batch (sapptk.levers)
    data = export(plan.profile, plan.config, plan.counts, plan.simulation)
    text = data.text()
    written = {} if out is None else write_files("megatron", {"text": (out, text)})
    return make_export("megatron", text, {"text": text}, written, notes=data.notes, step_time_ms=data.step_time_ms,
                       expressed_step_time_ms=data.expressed_step_time_ms, data=data)


_LAYOUT_TEXT = re.compile(r"[EtLm|,()*0-9 ]+")


def read_plan(source: Any, profile: Any, config: Any) -> dict[str, Any]:
    """The :func:`sapptk.plan.make_plan` arguments (plus ``where``) of Megatron-LM arguments.

    ``source``: a file (an ``os.PathLike``, or a str that is neither a command line nor a
    layout) holding a command line (``#`` comment lines skipped, as :func:`plan_export`
    writes it), or what :func:`decode` takes: a layout string, a command line, a list of
    arguments, a mapping of flags. ``config`` gives the setup (stages and chunks must agree).
    """
    check_inputs(profile, config, "load_plan(format='megatron')")
    where = "Megatron arguments"
    is_text = isinstance(source, str) and (source.lstrip().startswith("--") or _LAYOUT_TEXT.fullmatch(source.strip()))
    if isinstance(source, os.PathLike) or (isinstance(source, str) and not is_text):
        where = os.fspath(source)
        text = read_text(where, what="Megatron arguments file", error=ConfigError)
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        if not lines:
            raise ConfigError(f"{where}: no arguments (only comments or blank lines): expected a Megatron-LM command "
                              "line or a layout string")
        source = " ".join(lines)
        try:
            counts = decode(source, profile, config)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    else:
        counts = decode(source, profile, config)
    return {"where": where, "profile": profile, "config": config, "counts": counts, "status": "given",
            "source": "megatron"}
