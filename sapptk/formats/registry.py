"""The plan formats by name: one export call and one reader call for all of them.

:func:`export` is ``plan.export(format, path=None, **options)``; :func:`read` is what
:func:`sapptk.load_plan` builds a plan from, every reader taking ``(source, profile, config)``
in that order. :func:`infer_format` tells a file's format when the caller does not say it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sapptk import checks
from sapptk.errors import ConfigError
from sapptk.files import read_text
from sapptk.formats import megatron, mindformers, plan_file, torch_csv, torchtitan
from sapptk.formats.base import Export

if TYPE_CHECKING:
    from sapptk.plan import Plan

__all__ = ["EXPORT_OPTIONS", "FORMATS", "READ_OPTIONS", "check_format", "export", "infer_format", "read", "read_all"]

FORMATS: tuple[str, ...] = ("sapptk", "mindformers", "megatron", "torchtitan", "torch-csv")
"""Every format a plan exports to: sapptk's plan file, MindFormers' lists, Megatron-LM's
arguments, torchtitan's settings (TOML, Python config, schedule CSV), PyTorch's schedule CSV."""

_EXPORTERS: dict[str, Callable[..., Export]] = {
    "sapptk": plan_file.plan_export,
    "mindformers": mindformers.plan_export,
    "megatron": megatron.plan_export,
    "torchtitan": torchtitan.plan_export,
    "torch-csv": torch_csv.plan_export,
}
_READERS: dict[str, Callable[..., Any]] = {
    "sapptk": plan_file.read_plan,
    "mindformers": mindformers.read_plan,
    "megatron": megatron.read_plan,
    "torchtitan": torchtitan.read_plan,
    "torch-csv": torch_csv.read_plan,
}
EXPORT_OPTIONS: Mapping[str, tuple[str, ...]] = {"torchtitan": ("base_config", "csv_name")}
"""The keyword options each format's export takes (the others take none)."""
READ_OPTIONS: Mapping[str, tuple[str, ...]] = {"mindformers": ("name",), "torchtitan": ("csv",)}
"""The keyword options each format's reader takes (the others take none)."""


def check_format(fmt: Any, where: str = "format") -> str:
    """``fmt`` if it names a format, else a ConfigError listing them."""
    if not isinstance(fmt, str) or fmt not in FORMATS:
        checks.fail(ConfigError, where, fmt, f"one of {', '.join(map(repr, FORMATS))}")
    return fmt


def _check_options(fmt: str, options: Mapping[str, Any], known: Mapping[str, tuple[str, ...]], call: str) -> None:
    allowed = known.get(fmt, ())
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        takes = f"only {', '.join(allowed)}" if allowed else "no options"
        raise ConfigError(f"{call}(format={fmt!r}): unknown option {unknown[0]!r}: this format takes {takes}")


def export(plan: Plan, fmt: str, path: str | os.PathLike[str] | None = None, **options: Any) -> Export:
    """``plan`` in format ``fmt``, written to ``path`` when given (see :class:`~sapptk.formats.base.Export`)."""
    check_format(fmt, "export: format")
    _check_options(fmt, options, EXPORT_OPTIONS, "export")
    return _EXPORTERS[fmt](plan, path, **options)


def read(source: Any, fmt: str | None, profile: Any, config: Any, **options: Any) -> tuple[str, dict[str, Any]]:
    """``(format, make_plan arguments plus "where")`` of one plan; the format inferred when None."""
    fmt = infer_format(source) if fmt is None else check_format(fmt, "load_plan: format")
    _check_options(fmt, options, READ_OPTIONS, "load_plan")
    return fmt, _READERS[fmt](source, profile, config, **options)


def read_all(source: Any, fmt: str | None, profile: Any, config: Any) -> tuple[str, list[dict[str, Any]]]:
    """Every plan of ``source``: each named MindFormers config; the one plan of other formats."""
    fmt = infer_format(source) if fmt is None else check_format(fmt, "load_plans: format")
    if fmt == "mindformers":
        return fmt, mindformers.read_plans(source, profile, config)
    return fmt, [_READERS[fmt](source, profile, config)]


def infer_format(source: Any) -> str:
    """The format of a file (by its name, then its content) or of parsed data.

    ``.toml``: torchtitan; ``.csv``: PyTorch's schedule CSV; otherwise the text: a command line
    (``--...`` after any ``#`` comments) is Megatron-LM's, a YAML/JSON mapping with a
    ``format`` key (or ``setup`` and ``layout``) a plan file, any other mapping MindFormers. Parsed data: a
    mapping with that ``format`` key is a plan file; anything else needs ``format=``.
    """
    if isinstance(source, Mapping):
        if source.get("format") == plan_file.FORMAT:
            return "sapptk"
        raise ConfigError(f"load_plan: source is a mapping without format: {plan_file.FORMAT!r}: pass format= "
                          f"({', '.join(map(repr, FORMATS))}) to say what it holds")
    is_text = isinstance(source, str) and ("\n" in source or source.lstrip().startswith("--"))
    if not isinstance(source, (str, os.PathLike)) or is_text:
        checks.fail(ConfigError, "load_plan: source", source, "a file path, or format= to say what the data holds")
    where = os.fspath(source)
    suffix = Path(where).suffix.lower()
    if suffix == ".toml":
        return "torchtitan"
    if suffix == ".csv":
        return "torch-csv"
    text = read_text(where, what="plan file", error=ConfigError)
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if lines and lines[0].startswith("--") and not lines[0].startswith("---"):  # "---" starts a YAML document
        return "megatron"
    data = mindformers.load(where)
    if isinstance(data, Mapping) and ("format" in data or {"setup", "layout"} <= set(data)):
        return "sapptk"  # a plan file, maybe a broken one: its reader names the bad field
    if isinstance(data, Mapping):
        return "mindformers"
    raise ConfigError(f"{where}: cannot tell its format (not a sapptk plan file, a MindFormers config, a Megatron-LM "
                      f"command line or a torchtitan .toml): pass format= ({', '.join(map(repr, FORMATS))})")
