"""What every plan export shares: the :class:`Export` record, the checks on the plan and its
inputs, and the writing of an export's files.

Each format module (:mod:`~sapptk.formats.plan_file`, :mod:`~sapptk.formats.mindformers`,
:mod:`~sapptk.formats.megatron`, :mod:`~sapptk.formats.torchtitan`,
:mod:`~sapptk.formats.torch_csv`) has ``plan_export(plan, path=None, **options) -> Export``
and ``read_plan(source, profile, config, **options)``, the keyword arguments of
:func:`sapptk.plan.make_plan` plus ``where``; :mod:`sapptk.formats.registry` dispatches by
format name. A plan is taken by its public attributes only (this layer sits below
:mod:`sapptk.plan`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from sapptk import checks
from sapptk.errors import ConfigError
from sapptk.files import write_text
from sapptk.formats.expressible import ExpressedCost
from sapptk.levers import LEVERS, lever

if TYPE_CHECKING:
    from sapptk.plan import Plan

__all__ = ["Export", "check_inputs", "check_path", "make_export", "need_solution", "one_line", "refuse_lever",
           "refuse_levers", "write_files"]


@dataclass(frozen=True)
class Export(ExpressedCost):
    """A plan written in one format (:meth:`sapptk.plan.Plan.export`).

    Attributes
    ----------
    format: the format's name (:data:`sapptk.formats.registry.FORMATS`).
    text: the main text: what to print or paste (for torchtitan the TOML with what is lost as
        comments).
    texts: every file of the export by its role, read-only: ``"yaml"`` (sapptk, MindFormers),
        ``"text"`` (Megatron-LM), ``"toml"``, ``"python"`` and, when the schedule needs one,
        ``"csv"`` (torchtitan), ``"csv"`` (PyTorch's schedule CSV).
    written: the files written (absolute paths), by the same roles; empty without a ``path``.
    notes: what the runtime cannot express (empty: it runs the plan as made).
    step_time_ms: the plan's simulated step time; ``expressed_step_time_ms`` the step time of
        what the runtime runs instead (equal when nothing is lost); :attr:`cost_ms` the
        difference, :attr:`exact` whether nothing is lost.
    data: the format's own structured form: the plan file's mapping, the MindFormers lists
        (``{group: {offset, recompute, ...}}``), a
        :class:`~sapptk.formats.megatron.MegatronExport` (``args``, ``uniform``, ...), a
        :class:`~sapptk.formats.torchtitan.TorchtitanExport` (``toml``, ``python``,
        ``csv``, ``settings``, ...) or the :class:`~sapptk.schedules.Program` (torch-csv).
    """

    format: str
    text: str
    texts: Mapping[str, str]
    written: Mapping[str, Path]
    notes: tuple[str, ...]
    step_time_ms: float | None
    expressed_step_time_ms: float | None
    data: Any = field(default=None, repr=False)

    def __repr__(self) -> str:
        lost = "exact" if self.exact else f"{len(self.notes)} note(s), cost {self.cost_ms}"
        return f"Export({self.format!r}, files {sorted(self.texts)}, written {len(self.written)}, {lost})"


def make_export(fmt: str, text: str, texts: Mapping[str, str], written: Mapping[str, Path], *,
                notes: tuple[str, ...] = (), step_time_ms: float | None = None,
                expressed_step_time_ms: float | None = None, data: Any = None) -> Export:
    """An :class:`Export` with read-only mappings."""
    return Export(format=fmt, text=text, texts=MappingProxyType(dict(texts)),
                  written=MappingProxyType(dict(written)), notes=tuple(notes), step_time_ms=step_time_ms,
                  expressed_step_time_ms=expressed_step_time_ms, data=data)


def write_files(fmt: str, files: Mapping[str, tuple[str | os.PathLike[str], str]]) -> dict[str, Path]:
    """Write ``{role: (path, text)}`` atomically (:func:`sapptk.files.write_text`: a
    :class:`~sapptk.errors.FileError` names a missing folder, a directory, a full disk); the paths
    written, resolved (absolute: they stay valid when the working directory changes)."""
    return {role: write_text(path, text, what=f"{fmt} export").resolve() for role, (path, text) in files.items()}


def check_path(path: Any, what: str) -> Path | None:
    """``path`` as a Path (None stays None); a ConfigError for anything else."""
    if path is None:
        return None
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        checks.fail(ConfigError, f"{what}: path", path, "a file path (str or os.PathLike) or None")
    return Path(path)


def need_solution(plan: Plan, what: str) -> None:
    """Refuse ``what`` for a plan without an assignment (status infeasible or unknown)."""
    if not plan.solved:
        raise ConfigError(f"plan from {plan.source!r} has status {plan.status!r} and no layer assignment: "
                          f"cannot compute {what}")


def refuse_levers(plan: Plan, fmt: str) -> None:
    """Refuse export ``fmt`` for a plan using a lever the format cannot express: the first such
    lever of :data:`sapptk.levers.LEVERS` whose description lists ``fmt`` among its refusals,
    with the lever's own message (what the plan uses, what the target runs instead, what to do)."""
    for item in LEVERS:
        refusal = item.refusal(fmt)
        if refusal is not None and item.uses(plan):
            raise ConfigError(item.message(plan, refusal.what, refusal.why))


def refuse_lever(plan: Plan, name: str, what: str, why: str = "") -> None:
    """Refuse ``what`` (an analysis, not an export) for a plan using lever ``name``, with the lever's message."""
    item = lever(name)
    if item.uses(plan):
        raise ConfigError(item.message(plan, what, why))


def check_inputs(profile: Any, config: Any, where: str, *, optional_config: bool = False) -> None:
    """A sapptk Profile and a PipelineConfig (or None when ``optional_config``); else a ConfigError naming it."""
    from sapptk.config import PipelineConfig
    from sapptk.profile import Profile

    if not isinstance(profile, Profile):
        checks.fail(ConfigError, f"{where}: profile", profile, "a sapptk Profile (sapptk.load_profile)")
    if not (isinstance(config, PipelineConfig) or (optional_config and config is None)):
        checks.fail(ConfigError, f"{where}: config", config, "a sapptk PipelineConfig")


def one_line(text: Any) -> str:
    """``text`` on one line, fit for a ``#`` comment or a docstring: line breaks and other
    control characters escaped as Python writes them, and a ``\"\"\"`` no longer a quote."""
    flat = "".join(repr(ch)[1:-1] if (not ch.isprintable() and ch != " ") else ch for ch in str(text))
    return flat.replace('"""', '\\"\\"\\"')
