"""Measured training runs as rows to fit a hardware card on or to judge estimates against:
:class:`MeasuredRow`, :func:`measured_row`, :func:`load_measured_rows`.

A row is one run: the model card, the parallel layout (``tp pp cp ep dp vp`` and the
optimizer ``sharding``), the schedule, micro-batch size, global batch, sequence length,
recompute mode, dtype, GPU type and count, and what was measured — the step time
(``step_time_ms``) or the throughput (``tokens_per_s_per_gpu``), and optionally the peak
memory with its unit (GiB, GB, MiB, MB) and which figure it is (``allocated`` or
``reserved``). Each row names its ``source`` and its ``split`` (``fit``: may set a card's
parameters; ``predict``: held out). Everything is checked when the row is made; a bad
row raises :class:`~sapptk.errors.ConfigError` naming the row and the field.

The published rows bundled with sapptk are in ``data/published/runs.yaml``.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from sapptk.errors import ConfigError
from sapptk.models.bundled import card as bundled_card
from sapptk.models.bundled import hardware as bundled_hardware
from sapptk.models.estimate import check_layout
from sapptk.models.frameworks import FRAMEWORKS
from sapptk.models.layout import SHARDINGS, Hardware, Parallel
from sapptk.models.ops import check_fp8

__all__ = ["MEMORY_KINDS", "MEMORY_UNITS", "RECOMPUTES", "SPLITS", "MeasuredRow", "load_measured_rows",
           "measured_row"]

MEMORY_UNITS: Mapping[str, float] = MappingProxyType({"GiB": 1073.741824, "GB": 1000.0, "MiB": 1.048576, "MB": 1.0})
"""MB (10⁶ bytes) per unit of a measured memory figure."""
MEMORY_KINDS: tuple[str, ...] = ("allocated", "reserved")
"""Which figure a framework reported: the caching allocator's allocated or reserved peak."""
SPLITS: tuple[str, ...] = ("fit", "predict")
RECOMPUTES: tuple[str, ...] = ("none", "select", "full")
DTYPES: tuple[str, ...] = ("bf16", "fp16", "fp8")
_LAYOUT_KEYS = ("tp", "pp", "cp", "ep", "dp", "vp")
_REQUIRED = ("id", "split", "source", "model", "gpu", "gpus", "layout", "schedule", "micro_batch_size",
             "global_batch", "seq_length", "recompute", "dtype", "measured")


@dataclass(frozen=True)
class MeasuredRow:
    """One measured run, checked (see the module docstring). Memory is in MB (10⁶ bytes)
    whatever unit the row gave; ``memory_kind`` says which figure it is."""

    id: str
    split: str
    stack: str
    source: Mapping[str, Any]
    model: str
    gpu: str
    gpus: int
    tp: int
    pp: int
    cp: int
    ep: int
    dp: int
    vp: int
    sharding: str
    schedule: str
    micro_batch_size: int
    global_batch: int
    seq_length: int
    recompute: str
    dtype: str
    framework: str = ""
    etp: int | None = None  # expert tensor parallel where the source states it (None: the framework's default)
    step_time_ms: float | None = None
    tokens_per_s_per_gpu: float | None = None
    memory_mb: float | None = None
    memory_kind: str | None = None
    hardware_overrides: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)  # compile, async_tp, deepep, a2a_overlap: switches
    notes: str = ""

    @property
    def micro_batches(self) -> int:
        """Micro-batches per step of each pipeline: ``global_batch / (dp · micro_batch_size)``."""
        return self.global_batch // (self.dp * self.micro_batch_size)

    @property
    def measured_step_ms(self) -> float:
        """The measured step time, ms (from the throughput when that is what was measured)."""
        if self.step_time_ms is not None:
            return self.step_time_ms
        assert self.tokens_per_s_per_gpu is not None
        return self.global_batch * self.seq_length / (self.tokens_per_s_per_gpu * self.gpus) * 1e3

    def tokens_per_s_per_gpu_at(self, step_ms: float) -> float:
        """Throughput per GPU of this run at a step time of ``step_ms``."""
        return self.global_batch * self.seq_length / (step_ms / 1e3) / self.gpus

    def parallel(self) -> Parallel:
        """The layout of one pipeline stage's devices (:class:`~sapptk.models.Parallel`)."""
        return Parallel(tp=self.tp, cp=self.cp, ep=self.ep, dp=self.dp, sharding=self.sharding, etp=self.etp,
                        micro_batch_size=self.micro_batch_size, seq_length=self.seq_length,
                        sequence_parallel=self.tp > 1, fp8=self.dtype == "fp8",
                        compute_dtype="fp16" if self.dtype == "fp16" else "bf16")

    def hardware(self, base: Hardware | None = None) -> Hardware:
        """``base`` (default: the bundled card named by ``gpu``) with the row's overrides."""
        from dataclasses import replace

        hw = bundled_hardware(self.gpu) if base is None else base
        return replace(hw, **dict(self.hardware_overrides)) if self.hardware_overrides else hw


def _where(row: Any, index: int | None) -> str:
    ident = row.get("id") if isinstance(row, Mapping) else None
    at = f" (row {index})" if index is not None else ""
    return f"measured row {ident!r}{at}" if ident is not None else f"measured row{at or ''}"


def _number(value: Any, where: str, name: str, *, integer: bool = False) -> Any:
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok and integer:
        ok = float(value).is_integer()
    if not ok or not math.isfinite(float(value)) or float(value) <= 0:
        what = "an integer >= 1" if integer else "a finite number > 0"
        raise ConfigError(f"{where}: field {name!r} = {value!r}: expected {what}")
    return int(value) if integer else float(value)


def _choice(value: Any, where: str, name: str, choices: Sequence[str]) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: field {name!r} = {value!r}: expected one of {', '.join(choices)}")
    return str(value)


_OPTIONS = ("compile", "async_tp", "compile_loss", "deepep", "a2a_overlap")
"""A row's switches of the run (true or false)."""


def _switch(value: Any, where: str, name: str) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: field {name!r} = {value!r}: expected true or false")
    return value


def _mapping(value: Any, where: str, name: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: field {name!r} = {value!r}: expected a mapping")
    return value


def measured_row(row: Mapping[str, Any] | MeasuredRow, *, index: int | None = None,
                 sources: Mapping[str, Any] | None = None) -> MeasuredRow:
    """A :class:`MeasuredRow` from a mapping of the row fields (``data/published/runs.yaml``'s
    form), checked: a missing field, a negative, zero or NaN figure, an unknown memory unit or a
    figure above the device's memory in the stated unit (GiB taken for GB, ...), a layout whose
    sizes do not multiply to the GPU count or that the model card cannot take — each a
    :class:`~sapptk.errors.ConfigError` naming the row and the field. ``sources``: the file's
    bibliography; the row's ``source.ref`` must name one of them."""
    if isinstance(row, MeasuredRow):
        return row
    where = _where(row, index)
    if not isinstance(row, Mapping):
        raise ConfigError(f"{where}: {row!r}: expected a mapping of the row's fields")
    for name in _REQUIRED:
        if name not in row or row[name] is None:
            raise ConfigError(f"{where}: field {name!r} is missing: a measured row needs {', '.join(_REQUIRED)}")
    ident = row["id"]
    if not isinstance(ident, str) or not ident.strip():
        raise ConfigError(f"{where}: field 'id' = {ident!r}: expected a non-empty string")
    split = _choice(row["split"], where, "split", SPLITS)
    source = _mapping(row["source"], where, "source")
    if not source:
        raise ConfigError(f"{where}: field 'source' is empty: expected where the figures come from")
    if sources is not None:
        ref = source.get("ref")
        if ref not in sources:
            raise ConfigError(f"{where}: field 'source.ref' = {ref!r}: expected one of the file's sources "
                              f"({', '.join(map(str, sources))})")
        source = {**dict(_mapping(sources[ref], where, f"sources[{ref!r}]")), **dict(source)}
    try:
        card = bundled_card(row["model"])
    except Exception as exc:  # a card name the bundle does not hold
        raise ConfigError(f"{where}: field 'model' = {row['model']!r}: {exc}") from None
    try:
        hw = bundled_hardware(row["gpu"])
    except Exception as exc:
        raise ConfigError(f"{where}: field 'gpu' = {row['gpu']!r}: {exc}") from None
    overrides = dict(_mapping(row.get("hardware_overrides") or {}, where, "hardware_overrides"))
    if overrides:
        from dataclasses import replace

        try:
            hw = replace(hw, **overrides)
        except (TypeError, ConfigError) as exc:
            raise ConfigError(f"{where}: field 'hardware_overrides' = {overrides!r}: {exc}") from None
    layout = _mapping(row["layout"], where, "layout")
    sizes = {}
    for key in _LAYOUT_KEYS:
        sizes[key] = _number(layout.get(key, 1), where, f"layout.{key}", integer=True)
    sharding = _choice(layout.get("sharding", "distributed"), where, "layout.sharding", SHARDINGS)
    etp = None if layout.get("etp") is None else _number(layout["etp"], where, "layout.etp", integer=True)
    gpus = _number(row["gpus"], where, "gpus", integer=True)
    product = sizes["tp"] * sizes["pp"] * sizes["cp"] * sizes["dp"]
    if product != gpus:
        raise ConfigError(f"{where}: field 'layout' = tp {sizes['tp']} × pp {sizes['pp']} × cp {sizes['cp']} × dp "
                          f"{sizes['dp']} = {product}: expected the {gpus} GPUs of field 'gpus'")
    mbs = _number(row["micro_batch_size"], where, "micro_batch_size", integer=True)
    batch = _number(row["global_batch"], where, "global_batch", integer=True)
    if batch % (sizes["dp"] * mbs):
        raise ConfigError(f"{where}: field 'global_batch' = {batch}: expected a multiple of dp × micro_batch_size "
                          f"= {sizes['dp'] * mbs}")
    seq = _number(row["seq_length"], where, "seq_length", integer=True)
    schedule = row["schedule"]
    if not isinstance(schedule, str) or not schedule:
        raise ConfigError(f"{where}: field 'schedule' = {schedule!r}: expected a schedule name "
                          "(1f1b, interleaved, ...)")
    layers = sum(g.count for g in card.groups if g.kind == "body")
    if sizes["pp"] * sizes["vp"] > layers + 2:  # the embedding and the loss may hold a virtual stage each
        raise ConfigError(f"{where}: field 'layout' = pp {sizes['pp']} × vp {sizes['vp']}: expected at most the "
                          f"{layers} layers of {card.name!r} plus two (embedding and loss stages)")
    fw = row.get("framework") or ""
    if fw:
        _choice(fw, where, "framework", tuple(FRAMEWORKS))
    recompute = _choice(row["recompute"], where, "recompute", RECOMPUTES)
    dtype = _choice(row["dtype"], where, "dtype", DTYPES)
    measured = _mapping(row["measured"], where, "measured")
    step = measured.get("step_time_ms")
    tokens = measured.get("tokens_per_s_per_gpu")
    if (step is None) == (tokens is None):
        raise ConfigError(f"{where}: field 'measured' = {dict(measured)!r}: expected exactly one of step_time_ms "
                          "and tokens_per_s_per_gpu")
    step = None if step is None else _number(step, where, "measured.step_time_ms")
    tokens = None if tokens is None else _number(tokens, where, "measured.tokens_per_s_per_gpu")
    memory_mb = kind = None
    if measured.get("peak_memory") is not None:
        memory = _mapping(measured["peak_memory"], where, "measured.peak_memory")
        for key in ("value", "unit", "kind"):
            if memory.get(key) is None:
                raise ConfigError(f"{where}: field 'measured.peak_memory.{key}' is missing: a peak memory needs "
                                  "value, unit (GiB, GB, MiB, MB) and kind (allocated or reserved)")
        value = _number(memory["value"], where, "measured.peak_memory.value")
        unit = _choice(memory["unit"], where, "measured.peak_memory.unit", tuple(MEMORY_UNITS))
        kind = _choice(memory["kind"], where, "measured.peak_memory.kind", MEMORY_KINDS)
        memory_mb = value * MEMORY_UNITS[unit]
        if memory_mb > hw.memory_mb * 1.0001:
            other = {"GiB": "GB", "GB": "GiB", "MiB": "MB", "MB": "MiB"}[unit]
            raise ConfigError(
                f"{where}: field 'measured.peak_memory' = {value:g} {unit} = {memory_mb:,.0f} MB: more than the "
                f"{hw.name} card's {hw.hbm_gb:g} GB; expected at most {hw.memory_mb / MEMORY_UNITS[unit]:.6g} {unit} "
                f"(is the unit {other}? 1 GiB = 1.0737 GB)")
    row_obj = MeasuredRow(
        id=ident, split=split, stack=str(row.get("stack") or ident), source=MappingProxyType(dict(source)),
        model=card.name, gpu=str(row["gpu"]), gpus=gpus, sharding=sharding, schedule=schedule,
        micro_batch_size=mbs, global_batch=batch, seq_length=seq, recompute=recompute, dtype=dtype,
        framework=fw, etp=etp, step_time_ms=step, tokens_per_s_per_gpu=tokens,
        memory_mb=memory_mb, memory_kind=kind, hardware_overrides=MappingProxyType(overrides),
        options=MappingProxyType({k: _switch(row[k], where, k) for k in _OPTIONS if k in row}),
        notes=" ".join(str(row.get(k) or "") for k in ("assumed", "notes")).strip(), **sizes,
    )
    try:
        check_layout(card, row_obj.parallel())
    except ConfigError as exc:
        raise ConfigError(f"{where}: field 'layout': {exc}") from None
    try:
        check_fp8(row_obj.parallel(), hw)
    except ConfigError as exc:
        raise ConfigError(f"{where}: field 'dtype' = 'fp8': {exc}") from None
    return row_obj


def load_measured_rows(path: str | os.PathLike[str]) -> list[MeasuredRow]:
    """Every row of a measured-runs file (``data/published/runs.yaml``'s form: ``sources``,
    a bibliography by key, and ``rows``), checked by :func:`measured_row`; ids unique."""
    from sapptk.files import load_document

    data = load_document(path, what="measured runs file", error=ConfigError)
    if not isinstance(data, Mapping) or not isinstance(data.get("rows"), list):
        raise ConfigError(f"measured runs file {os.fspath(path)!r}: expected a mapping with a list 'rows'")
    sources = data.get("sources") or {}
    if not isinstance(sources, Mapping):
        raise ConfigError(f"measured runs file {os.fspath(path)!r}: field 'sources': expected a mapping")
    rows = [measured_row(r, index=i, sources=sources) for i, r in enumerate(data["rows"])]
    seen: set[str] = set()
    for i, r in enumerate(rows):
        if r.id in seen:
            raise ConfigError(f"measured row {r.id!r} (row {i}): field 'id': expected a unique id, given twice")
        seen.add(r.id)
    return rows
