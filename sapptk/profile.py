"""Layer profiles: what one layer of each group costs, in every recompute mode.

A :class:`Profile` is the model as the balancer sees it: an ordered tuple of
:class:`LayerGroup` (an optional head, one or more bodies, an optional tail). Each group
knows its forward time, its static memory and, per available recompute mode, the
backward time and activation memory of one layer for one micro-batch.

Units are fixed here, once: times in **ms**, memory in **MB** (10**6 bytes).

Two input formats are read, from ``.json``, ``.yaml`` or ``.yml`` files or from plain
dicts:

* the *SAPP layer JSON* users already have (a ``layers_description`` list), with its
  defaulting rules for backward times (see :func:`_sapp_group`);
* our own ``sapptk-profile/1`` (a ``groups`` list), explicit about everything; this is
  what :meth:`Profile.to_yaml` writes.

Validation happens here, at the boundary: every problem raises
:class:`~sapptk.errors.ProfileError` naming the file, the layer group, the field, the
value given and what was expected. Input mappings are never mutated.

(Over 500 lines: the types, the two input formats and the bundled profiles share one set of
validators and one error wording, which is what makes every message name the file, the
group, the field and the value; splitting them would put that wording in two places.)
"""

from __future__ import annotations

import json
import math
import numbers
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, NoReturn

import yaml

from sapptk import checks
from sapptk.checks import show
from sapptk.errors import ProfileError
from sapptk.files import load_document, write_text

__all__ = [
    "DEFAULT_COEFS",
    "FORMAT",
    "GROUP_KINDS",
    "MAX_COEF",
    "MAX_LAYERS",
    "MAX_MB",
    "MAX_MS",
    "MAX_SEQ_LENGTH",
    "MODES",
    "LayerGroup",
    "ModeCost",
    "ModeTable",
    "Profile",
    "bundled_profile",
    "bundled_profiles",
    "load_profile",
    "mode_set",
    "resolve_profile",
]

MODES: tuple[str, ...] = ("none", "select", "comm", "both", "full")
"""Recompute modes, from the weakest memory saving to the strongest."""

GROUP_KINDS: tuple[str, ...] = ("head", "body", "tail")

FORMAT = "sapptk-profile/1"
UNITS: Mapping[str, str] = MappingProxyType({"time": "ms", "memory": "MB"})

DEFAULT_COEFS: Mapping[str, float] = MappingProxyType(
    {"none": 0.0, "select": 0.04, "comm": 0.125, "both": 0.165, "full": 0.5}
)
"""SAPP defaults: backward of mode r is (1 + coef_r) * 2 * time unless given explicitly."""

MAX_MS = checks.MAX_MS
"""Largest time accepted for one layer and one micro-batch, in ms (about 2.8 hours)."""

MAX_MB = checks.MAX_MB
"""Largest memory accepted for one layer, in MB (1 PB)."""

MAX_COEF = checks.MAX_COEF
"""Largest SAPP backward coefficient (``*_coef``) accepted."""

MAX_LAYERS = checks.MAX_LAYERS
"""Most layers accepted in one layer group."""

MAX_SEQ_LENGTH = checks.MAX_SEQ_LENGTH
"""Longest sequence accepted (``Profile.seq_length``), in tokens (16 M)."""

# --- SAPP layer JSON vocabulary ---------------------------------------------------------
_SAPP_MEMORY_KEYS = {
    "none": "memory_activation",
    "select": "memory_select_rec",
    "comm": "memory_select_comm",
    "both": "memory_both_comm_select",
    "full": "memory_recompute",
}
_SAPP_TIME_KEYS = {
    "none": "backward_time",
    "select": "select_rec_time",
    "comm": "select_comm_time",
    "both": "both_comm_select_time",
    "full": "recompute_time",
}
_SAPP_COEF_KEYS = {
    "none": "backward_coef",
    "select": "select_rec_coef",
    "comm": "select_comm_coef",
    "both": "both_comm_select_coef",
    "full": "recompute_coef",
}
_SAPP_TYPES = {"HEAD": "head", "BODY": "body", "TAIL": "tail"}
_SEQ_GROUP_KEYS = ("kv_mb_per_token", "attention_share")
"""Long-context fields of a layer group, spelt the same in both formats."""
_SAPP_KNOWN_KEYS = frozenset(
    {"name", "model_name", "type", "nb_layer", "time", "forward_time", "memory_parameter", *_SEQ_GROUP_KEYS}
    | set(_SAPP_MEMORY_KEYS.values())
    | set(_SAPP_TIME_KEYS.values())
    | set(_SAPP_COEF_KEYS.values())
)

# --- our format's vocabulary -----------------------------------------------------------
_OWN_TOP_KEYS = ("format", "name", "units", "groups", "description", "seq_length", "provenance")
_OWN_GROUP_KEYS = ("name", "kind", "count", "forward", "params", "modes", *_SEQ_GROUP_KEYS)
_OWN_MODE_KEYS = ("backward", "activation")

_MISSING: Any = object()


# --- small validation helpers ------------------------------------------------------------
def _fail(where: str, field_name: str | None, value: Any, expected: str) -> NoReturn:
    """Raise the one error shape: ``<where>: field '<f>' = <value>: expected <what>``."""
    if field_name is None:
        raise ProfileError(f"{where} = {show(value)}: expected {expected}")
    if value is _MISSING:
        raise ProfileError(f"{where}: field {field_name!r} is missing: expected {expected}")
    raise ProfileError(f"{where}: field {field_name!r} = {show(value)}: expected {expected}")


def _number(
    value: Any, where: str, field_name: str, *, above: float | None = None, limit: float = MAX_MB
) -> float:
    """A finite real number >= 0 (or > ``above`` when given) and <= ``limit``, as a float.
    Bools refused; the magnitude is checked before any conversion (a 400-digit integer
    gives this error, not an overflow)."""
    expected = "a number >= 0" if above is None else f"a number > {above:g}"
    if value is _MISSING:
        _fail(where, field_name, value, expected)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(where, field_name, value, expected)
    if isinstance(value, numbers.Integral) and abs(int(value)) > limit:
        _fail(where, field_name, value, f"{expected} and at most {limit:g} (the limit for this field)")
    number = float(value)
    if not math.isfinite(number):
        _fail(where, field_name, value, f"a finite {expected[2:]}")
    if (above is None and number < 0) or (above is not None and number <= above):
        _fail(where, field_name, value, expected)
    if number > limit:
        _fail(where, field_name, value, f"{expected} and at most {limit:g} (the limit for this field)")
    return number


def _count(value: Any, where: str, field_name: str) -> int:
    """An integer from 1 to :data:`MAX_LAYERS`; integral floats such as ``96.0`` are accepted.
    Bools refused."""
    expected = f"an integer >= 1 and at most {MAX_LAYERS}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(where, field_name, value, expected)
    if isinstance(value, numbers.Integral):
        number = int(value)
    else:
        as_float = float(value)
        if not math.isfinite(as_float) or not as_float.is_integer():
            _fail(where, field_name, value, expected)
        number = int(as_float)
    if number < 1 or number > MAX_LAYERS:
        _fail(where, field_name, value, expected)
    return number


def _share(value: Any, where: str, field_name: str) -> float:
    """A fraction: a finite number from 0 to 1. Bools refused."""
    expected = "a number from 0 to 1 (a fraction of the layer's time)"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(where, field_name, value, expected)
    if isinstance(value, numbers.Integral) and int(value) not in (0, 1):
        _fail(where, field_name, value, expected)
    if not 0.0 <= float(value) <= 1.0:
        _fail(where, field_name, value, expected)
    return float(value)


def _seq_length(value: Any, where: str) -> int | None:
    """``None`` or tokens per sample: an integer from 1 to :data:`MAX_SEQ_LENGTH`."""
    if value is None:
        return None
    expected = f"an integer number of tokens >= 1 and at most {MAX_SEQ_LENGTH}"
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        _fail(where, "seq_length", value, expected)
    if not isinstance(value, numbers.Integral):
        as_float = float(value)
        if not math.isfinite(as_float) or not as_float.is_integer():
            _fail(where, "seq_length", value, expected)
    number = int(value)
    if number < 1 or number > MAX_SEQ_LENGTH:
        _fail(where, "seq_length", value, expected)
    return number


def _name(value: Any, where: str, field_name: str = "name") -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value.strip():
        _fail(where, field_name, value, "a non-empty string")
    return value


def _check_layout(
    kinds: Sequence[str],
    names: Sequence[str],
    wheres: Sequence[str],
    shown_kinds: Sequence[Any],
    kind_field: str,
    prefix: str,
    list_name: str,
) -> None:
    """Whole-profile rules: unique names, >= 1 body, at most one head/tail, at the ends.

    Positions are given as ``<list_name>[i]`` (0-based), as the user's file spells them.
    """
    seen: dict[str, int] = {}
    for i, name in enumerate(names):
        if name in seen:
            _fail(
                wheres[i],
                "name",
                name,
                f"a unique name ({list_name}[{seen[name]}] already uses it; this is "
                f"{list_name}[{i}])",
            )
        seen[name] = i
    n = len(kinds)
    if "body" not in kinds:
        body = "'BODY'" if kind_field == "type" else "'body'"
        raise ProfileError(
            f"{prefix}no body group among {n} group(s): expected at least one group with "
            f"{kind_field} {body}"
        )
    for kind, end, position in (("head", "first", 0), ("tail", "last", n - 1)):
        where_kind = [i for i, k in enumerate(kinds) if k == kind]
        if len(where_kind) > 1:
            second = where_kind[1]
            _fail(
                wheres[second],
                kind_field,
                shown_kinds[second],
                f"at most one {kind} group ({list_name}[{where_kind[0]}] is one already)",
            )
        if where_kind and where_kind[0] != position:
            i = where_kind[0]
            _fail(
                wheres[i],
                kind_field,
                shown_kinds[i],
                f"the {kind} to be the {end} group (it is {list_name}[{i}] of {n})",
            )


# --- the data types ----------------------------------------------------------------------
@dataclass(frozen=True)
class ModeCost:
    """Cost of one layer for one micro-batch in one recompute mode.

    ``backward`` (ms) includes the recompute; ``activation`` (MB) is what stays live per
    in-flight micro-batch between its forward and its backward.
    """

    backward: float
    activation: float

    def __post_init__(self) -> None:
        object.__setattr__(self, "backward", _number(self.backward, "ModeCost", "backward", limit=MAX_MS))
        object.__setattr__(
            self, "activation", _number(self.activation, "ModeCost", "activation")
        )


class ModeTable(Mapping[str, ModeCost]):
    """Read-only ``{mode: ModeCost}`` in :data:`MODES` order; hashable and picklable.

    Used instead of :class:`types.MappingProxyType`, which can be neither pickled (sweeps
    send profiles to worker processes) nor deep-copied (``dataclasses.asdict``).
    """

    __slots__ = ("_data",)

    def __init__(self, modes: Mapping[str, ModeCost] | None = None) -> None:
        given = dict(modes or {})
        unknown = [m for m in given if m not in MODES]
        if unknown:
            raise ProfileError(
                f"ModeTable: unknown mode {show(unknown[0])}: expected one of {', '.join(MODES)}"
            )
        for mode, cost in given.items():
            if not isinstance(cost, ModeCost):
                _fail(f"ModeTable: mode {mode!r}", None, cost, "a ModeCost")
        ordered = {m: given[m] for m in MODES if m in given}
        object.__setattr__(self, "_data", MappingProxyType(ordered))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("ModeTable is read-only")

    def __getitem__(self, mode: str) -> ModeCost:
        return self._data[mode]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(tuple(self._data.items()))

    def __reduce__(self) -> tuple[Any, ...]:
        return (ModeTable, (dict(self._data),))

    def __repr__(self) -> str:
        return f"ModeTable({dict(self._data)!r})"


@dataclass(frozen=True)
class LayerGroup:
    """``count`` consecutive identical layers: their costs per layer per micro-batch.

    ``forward`` (ms) is the same in every mode; ``params`` (MB per layer) is static
    memory: weights, gradients and this device's optimizer share. ``modes`` holds the
    available recompute modes only. A head or tail given no modes gets
    ``{"none": ModeCost(backward=2 * forward, activation=0)}``; a body needs at least one.

    Long context (sequence-slice schedules, ``docs/schedules.md``), both optional:
    ``kv_mb_per_token`` is the K/V one layer keeps per token of the sequence, in MB
    (2 · KV heads · head dim · dtype bytes, already divided by TP and CP); ``None`` means not
    given. ``attention_share`` (0..1, default 0) is the part of the layer's forward and
    backward time that is the causal attention term, quadratic in the sequence length; the
    rest is linear in it.
    """

    name: str
    kind: str
    count: int
    forward: float
    params: float
    modes: Mapping[str, ModeCost] = field(default_factory=dict)
    kv_mb_per_token: float | None = None
    attention_share: float = 0.0

    def __post_init__(self) -> None:
        where = f"layer group {self.name!r}"
        _name(self.name, "layer group", "name")
        if self.kind not in GROUP_KINDS:
            _fail(where, "kind", self.kind, f"one of {', '.join(map(repr, GROUP_KINDS))}")
        object.__setattr__(self, "count", _count(self.count, where, "count"))
        object.__setattr__(self, "forward", _number(self.forward, where, "forward", limit=MAX_MS))
        object.__setattr__(self, "params", _number(self.params, where, "params"))
        if self.kv_mb_per_token is not None:
            object.__setattr__(self, "kv_mb_per_token", _number(self.kv_mb_per_token, where, "kv_mb_per_token"))
        object.__setattr__(self, "attention_share", _share(self.attention_share, where, "attention_share"))
        if not isinstance(self.modes, Mapping):
            _fail(where, "modes", self.modes, "a mapping of mode name to ModeCost")
        for mode, cost in self.modes.items():
            if mode not in MODES:
                raise ProfileError(
                    f"{where}: field 'modes': unknown mode {show(mode)}: expected one of "
                    f"{', '.join(MODES)}"
                )
            if not isinstance(cost, ModeCost):
                _fail(f"{where}: mode {mode!r}", None, cost, "a ModeCost")
        table = ModeTable(self.modes)
        if not table:
            if self.kind == "body":
                _fail(where, "modes", dict(self.modes), f"at least one of {', '.join(MODES)}")
            if 2.0 * self.forward > MAX_MS:
                _fail(where, "forward", self.forward, f"at most {MAX_MS / 2:g} ms: a {self.kind} without modes gets "
                      f"a backward of 2 × forward, and backward times are at most {MAX_MS:g} ms")
            table = ModeTable({"none": ModeCost(backward=2.0 * self.forward, activation=0.0)})
        object.__setattr__(self, "modes", table)

    def mode(self, name: str) -> ModeCost:
        """The cost in recompute mode ``name``; a clear error if the group lacks it."""
        if name not in MODES:
            _fail(f"layer group {self.name!r}", "mode", name, f"one of {', '.join(MODES)}")
        if name not in self.modes:
            raise ProfileError(
                f"layer group {self.name!r} has no recompute mode {name!r}: "
                f"expected one of its available modes {', '.join(self.modes)}"
            )
        return self.modes[name]

    @property
    def available_modes(self) -> tuple[str, ...]:
        """Available modes, weakest first (in :data:`MODES` order)."""
        return tuple(self.modes)

    @property
    def strongest_mode(self) -> str:
        """The available mode with the least activation memory.

        Ties go to the smaller backward time, then to the weaker mode.
        """
        return min(
            self.modes,
            key=lambda m: (self.modes[m].activation, self.modes[m].backward, MODES.index(m)),
        )

    def to_dict(self) -> dict[str, Any]:
        """This group in our own format, as plain data (long-context fields only when set)."""
        data = {
            "name": self.name,
            "kind": self.kind,
            "count": self.count,
            "forward": _plain(self.forward),
            "params": _plain(self.params),
            "modes": {
                m: {"backward": _plain(c.backward), "activation": _plain(c.activation)}
                for m, c in self.modes.items()
            },
        }
        data.update(self._seq_fields())
        return data

    def _seq_fields(self) -> dict[str, int | float]:
        """The long-context fields that differ from their defaults, as written in both formats."""
        fields: dict[str, int | float] = {}
        if self.kv_mb_per_token is not None:
            fields["kv_mb_per_token"] = _plain(self.kv_mb_per_token)
        if self.attention_share:
            fields["attention_share"] = _plain(self.attention_share)
        return fields


class _IndentedDumper(yaml.SafeDumper):
    """``SafeDumper`` that indents list items under their key, as people write YAML."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _plain(number: float) -> int | float:
    """Integral floats as ints, so exported YAML reads ``200`` rather than ``200.0``."""
    return int(number) if number.is_integer() else number


@dataclass(frozen=True)
class Profile:
    """A model as layer groups in model order: optional head, bodies, optional tail.

    ``source`` (the file it came from) is only for messages; it takes no part in
    equality, so a profile and its YAML round trip compare equal. ``seq_length`` (optional)
    is the tokens per sample, which sequence-slice schedules cut into slices.
    """

    name: str
    groups: tuple[LayerGroup, ...]
    source: str | None = field(default=None, compare=False)
    seq_length: int | None = None
    provenance: Mapping[str, Any] | None = field(default=None, compare=False, repr=False)
    """Where the figures came from (an estimate's card, layout, hardware, assumptions), as
    plain data; written to and read from ``sapptk-profile/1`` files; no part of equality."""

    def __post_init__(self) -> None:
        prefix = f"{self.source}: " if self.source else ""
        _name(self.name, f"{prefix}profile")
        object.__setattr__(self, "seq_length", _seq_length(self.seq_length, f"{prefix}profile {self.name!r}"))
        if isinstance(self.groups, (str, bytes)) or not isinstance(self.groups, Sequence):
            _fail(f"{prefix}profile {self.name!r}", "groups", self.groups, "a sequence")
        groups = tuple(self.groups)
        for i, group in enumerate(groups):
            if not isinstance(group, LayerGroup):
                _fail(f"{prefix}profile {self.name!r}: groups[{i}]", None, group, "a LayerGroup")
        object.__setattr__(self, "groups", groups)
        if self.provenance is not None and not isinstance(self.provenance, Mapping):
            _fail(f"{prefix}profile {self.name!r}", "provenance", self.provenance, "a mapping or None")
        _check_layout(
            kinds=[g.kind for g in groups],
            names=[g.name for g in groups],
            wheres=[f"{prefix}layer group {g.name!r}" for g in groups],
            shown_kinds=[g.kind for g in groups],
            kind_field="kind",
            prefix=prefix,
            list_name="groups",
        )

    @property
    def head(self) -> LayerGroup | None:
        """The head group (embedding), if any."""
        return self.groups[0] if self.groups[0].kind == "head" else None

    @property
    def tail(self) -> LayerGroup | None:
        """The tail group (final norm, LM head, loss), if any."""
        return self.groups[-1] if self.groups[-1].kind == "tail" else None

    @property
    def body(self) -> tuple[LayerGroup, ...]:
        """The body groups, in model order."""
        return tuple(g for g in self.groups if g.kind == "body")

    @property
    def num_body_layers(self) -> int:
        """Total number of body layers over all body groups."""
        return sum(g.count for g in self.body)

    def to_dict(self) -> dict[str, Any]:
        """The profile in our own format (``sapptk-profile/1``), as plain data."""
        data: dict[str, Any] = {"format": FORMAT, "name": self.name, "units": dict(UNITS)}
        if self.seq_length is not None:
            data["seq_length"] = self.seq_length
        data["groups"] = [g.to_dict() for g in self.groups]
        if self.provenance is not None:
            data["provenance"] = dict(self.provenance)
        return data

    def to_yaml(self, path: str | os.PathLike[str] | None = None) -> str:
        """The profile as ``sapptk-profile/1`` YAML; also written to ``path`` when given."""
        header = (
            f"# sapptk layer profile ({FORMAT}).\n"
            "# forward/backward: ms per layer per micro-batch (backward includes recompute);\n"
            "# params: MB per layer (weights, grads, optimizer share);\n"
            "# activation: MB per layer per in-flight micro-batch.\n"
        )
        if self.seq_length is not None or any(g._seq_fields() for g in self.groups):
            header += (
                "# seq_length: tokens per sample; kv_mb_per_token: K/V MB per layer per token;\n"
                "# attention_share: fraction of a layer's time quadratic in the sequence length.\n"
            )
        data = self.to_dict()
        options = {"Dumper": _IndentedDumper, "sort_keys": False, "default_flow_style": None}
        body = yaml.dump(data, allow_unicode=True, width=100, **options)
        if yaml.safe_load(body) != data:  # PyYAML writes some code points (U+0085) raw
            body = yaml.dump(data, allow_unicode=False, width=100, **options)
        text = header + body
        if path is not None:
            write_text(path, text, what="profile", error=ProfileError)
        return text

    def to_sapp_dict(self) -> dict[str, Any]:
        """The profile as SAPP layer JSON data (``name``, ``layers_description``).

        Backward times are written only where they differ from the SAPP default
        ``(1 + coef) · 2 · time``, so a profile read from SAPP JSON writes back the keys it
        had. Raises :class:`ProfileError` for a zero backward time the default would replace.
        """
        kinds = {"head": "HEAD", "body": "BODY", "tail": "TAIL"}
        entries = []
        for group in self.groups:
            entry: dict[str, Any] = {
                "name": group.name,
                "type": kinds[group.kind],
                "model_name": self.name,
                "time": _plain(group.forward),
                "nb_layer": group.count,
                "memory_parameter": _plain(group.params),
            }
            implicit = group.kind != "body" and set(group.modes) == {"none"} and group.modes["none"].activation == 0
            for mode, cost in group.modes.items():
                default = round((1.0 + DEFAULT_COEFS[mode]) * 2.0 * group.forward, 9)
                if not implicit:
                    entry[_SAPP_MEMORY_KEYS[mode]] = _plain(cost.activation)
                if cost.backward != default:
                    if cost.backward == 0:
                        raise ProfileError(
                            f"layer group {group.name!r} mode {mode!r}: backward = 0 cannot be written as SAPP JSON "
                            f"(0 means the default {default:g} ms there)"
                        )
                    entry[_SAPP_TIME_KEYS[mode]] = _plain(cost.backward)
            entry.update(group._seq_fields())
            entries.append(entry)
        data: dict[str, Any] = {"name": self.name}
        if self.seq_length is not None:
            data["seq_length"] = self.seq_length
        data["layers_description"] = entries
        return data

    def to_sapp_json(self, path: str | os.PathLike[str] | None = None) -> str:
        """The profile as SAPP layer JSON text (:meth:`to_sapp_dict`); also written to ``path`` when given."""
        text = json.dumps(self.to_sapp_dict(), indent=4) + "\n"
        if path is not None:
            write_text(path, text, what="profile", error=ProfileError)
        return text

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "<dict>") -> Profile:
        """Build a profile from parsed data in either format; ``data`` is not modified."""
        return _parse(data, source)


# --- parsing ------------------------------------------------------------------------------
def _default_name(source: str) -> str:
    if source.startswith("<"):
        return "profile"
    return Path(source).stem or "profile"


def _parse(data: Any, source: str) -> Profile:
    """Detect the format of ``data`` and parse it."""
    expected = "a mapping with 'layers_description' (SAPP layer JSON) or 'groups' " + (
        f"({FORMAT})"
    )
    if data is None:
        raise ProfileError(f"{source}: the profile is empty: expected {expected}")
    if not isinstance(data, Mapping):
        _fail(f"{source}: top level", None, data, expected)
    has_sapp = "layers_description" in data
    has_own = "groups" in data or "format" in data
    if has_sapp and has_own:
        raise ProfileError(
            f"{source}: top level has both 'layers_description' and 'groups'/'format': "
            f"expected exactly one format"
        )
    if has_sapp:
        return _parse_sapp(data, source)
    if has_own:
        return _parse_own(data, source)
    keys = ", ".join(map(repr, list(data)[:8])) or "none"
    raise ProfileError(
        f"{source}: top level: missing field 'layers_description' (SAPP layer JSON) or "
        f"'groups' ({FORMAT}); found keys: {keys}"
    )


def _profile_name(data: Mapping[str, Any], source: str) -> str:
    if "name" not in data:
        return _default_name(source)
    return _name(data["name"], f"{source}: top level")


def _entry_where(entry: Any, source: str, base: str, label: str) -> str:
    """``src: layer 'X'`` when the entry has a usable name, else ``src: groups[i]``."""
    if isinstance(entry, Mapping):
        name = entry.get("name", _MISSING)
        if isinstance(name, str) and name.strip():
            return f"{source}: {label} {name!r}"
    return base


def _unknown(where: str, key: Any, known: Sequence[str]) -> NoReturn:
    """Raise for a field name we do not know, listing the ones we do."""
    raise ProfileError(f"{where}: unknown field {show(key)}: expected one of {', '.join(known)}")


def _list_of_entries(data: Mapping[str, Any], key: str, source: str) -> list[Any]:
    value = data[key]
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not value:
        _fail(f"{source}: top level", key, value, "a non-empty list of layer groups")
    return list(value)


def _finish(
    name: str,
    groups: list[LayerGroup],
    source: str,
    list_name: str,
    wheres: list[str],
    shown: list[Any],
    seq_length: int | None = None,
) -> Profile:
    """Check the whole-profile rules with the file's own vocabulary, then build."""
    _check_layout(
        kinds=[g.kind for g in groups],
        names=[g.name for g in groups],
        wheres=wheres,
        shown_kinds=shown,
        kind_field="type" if list_name == "layers_description" else "kind",
        prefix=f"{source}: ",
        list_name=list_name,
    )
    return Profile(name=name, groups=tuple(groups), source=source, seq_length=seq_length)


def _parse_sapp(data: Mapping[str, Any], source: str) -> Profile:
    """The SAPP layer JSON: ``layers_description`` entries; other top-level keys ignored."""
    name = _profile_name(data, source)
    entries = _list_of_entries(data, "layers_description", source)
    groups, wheres, shown = [], [], []
    for i, entry in enumerate(entries):
        base = f"{source}: layers_description[{i}]"
        where = _entry_where(entry, source, base, "layer")
        groups.append(_sapp_group(entry, base, where))
        wheres.append(where)
        shown.append(entry["type"])
    seq_length = _seq_length(data.get("seq_length"), f"{source}: top level")
    return _finish(name, groups, source, "layers_description", wheres, shown, seq_length)


def _suspicious_known(key: str) -> list[str]:
    """The known SAPP fields a misspelt ``key`` was probably meant to be."""
    if key.startswith("memory"):
        return ["memory_parameter", *_SAPP_MEMORY_KEYS.values()]
    if key.endswith("_time"):
        return ["time", "forward_time", *_SAPP_TIME_KEYS.values()]
    return list(_SAPP_COEF_KEYS.values())


def _sapp_group(entry: Any, base: str, where: str) -> LayerGroup:
    """One SAPP ``layers_description`` entry as a :class:`LayerGroup`.

    * forward = ``forward_time`` when present and non-zero, else ``time``;
    * mode r is available exactly when its memory key is present (``memory_activation``,
      ``memory_select_rec``, ``memory_select_comm``, ``memory_both_comm_select``,
      ``memory_recompute``);
    * backward of mode r = its explicit time key when present and non-zero, else
      (1 + coef_r) * 2 * ``time`` (coefs from the ``*_coef`` keys, defaults
      :data:`DEFAULT_COEFS`), rounded to 1e-9 ms to keep exports tidy;
    * a HEAD/TAIL without memory keys gets mode ``none`` with backward 2 * time and no
      activation (the usual case).

    Unknown keys are informational and ignored, except ones that look like a misspelt
    cost field (``memory*``, ``*_time``, ``*_coef``), which are refused.
    """
    if not isinstance(entry, Mapping):
        _fail(base, None, entry, "a mapping of layer fields")
    if "name" not in entry:
        _fail(base, "name", _MISSING, "a non-empty string")
    _name(entry["name"], base)
    for key in entry:
        if not isinstance(key, str):
            _fail(where, None, key, "string field names")
        if key not in _SAPP_KNOWN_KEYS and (
            key.startswith("memory") or key.endswith(("_time", "_coef"))
        ):
            _unknown(where, key, _suspicious_known(key))

    def get(key: str) -> Any:
        if key not in entry:
            return _MISSING
        return entry[key]

    kind_raw = get("type")
    if kind_raw is _MISSING:
        _fail(where, "type", kind_raw, "one of 'HEAD', 'BODY', 'TAIL'")
    if not isinstance(kind_raw, str) or kind_raw.upper() not in _SAPP_TYPES:
        _fail(where, "type", kind_raw, "one of 'HEAD', 'BODY', 'TAIL'")
    kind = _SAPP_TYPES[kind_raw.upper()]
    if get("nb_layer") is _MISSING:
        _fail(where, "nb_layer", _MISSING, "an integer >= 1")
    count = _count(entry["nb_layer"], where, "nb_layer")
    time = _number(get("time"), where, "time", limit=MAX_MS)
    params = _number(get("memory_parameter"), where, "memory_parameter")
    forward = time
    if get("forward_time") is not _MISSING:
        override = _number(entry["forward_time"], where, "forward_time", limit=MAX_MS)
        if override > 0:
            forward = override
    coefs = {
        m: DEFAULT_COEFS[m] if get(k) is _MISSING else _number(entry[k], where, k, above=-1, limit=MAX_COEF)
        for m, k in _SAPP_COEF_KEYS.items()
    }
    explicit = {
        m: 0.0 if get(k) is _MISSING else _number(entry[k], where, k, limit=MAX_MS)
        for m, k in _SAPP_TIME_KEYS.items()
    }
    modes: dict[str, ModeCost] = {}
    for mode, key in _SAPP_MEMORY_KEYS.items():
        if get(key) is _MISSING:
            continue
        activation = _number(entry[key], where, key)
        backward = explicit[mode] or round((1.0 + coefs[mode]) * 2.0 * time, 9)
        if backward > MAX_MS:
            coef_key = _SAPP_COEF_KEYS[mode]
            raise ProfileError(
                f"{where}: mode {mode!r}: backward time (1 + {coef_key} {coefs[mode]:g}) * 2 * time {time:g} = "
                f"{backward:g} ms: expected at most {MAX_MS:g} ms (give {_SAPP_TIME_KEYS[mode]} or a smaller "
                f"{coef_key})"
            )
        modes[mode] = ModeCost(backward=backward, activation=activation)
    if kind == "body" and not modes:
        raise ProfileError(
            f"{where}: no recompute mode: expected at least one of the fields "
            f"{', '.join(_SAPP_MEMORY_KEYS.values())}"
        )
    if not modes:
        _check_default_backward(where, "forward_time" if forward != time else "time", forward, kind)
    return LayerGroup(
        name=entry["name"], kind=kind, count=count, forward=forward, params=params, modes=modes,
        **_seq_group_fields(entry, where),
    )


def _parse_own(data: Mapping[str, Any], source: str) -> Profile:
    """Our ``sapptk-profile/1`` format: strict, every field named explicitly."""
    top = f"{source}: top level"
    for key in data:
        if key not in _OWN_TOP_KEYS:
            _unknown(top, key, _OWN_TOP_KEYS)
    if "format" in data and data["format"] != FORMAT:
        _fail(top, "format", data["format"], repr(FORMAT))
    if "groups" not in data:
        _fail(top, "groups", _MISSING, "a non-empty list of layer groups")
    if "units" in data:
        units = data["units"]
        if not isinstance(units, Mapping):
            _fail(top, "units", units, "{time: ms, memory: MB}")
        for key, value in units.items():
            if key not in UNITS:
                _unknown(f"{top}: units", key, list(UNITS))
            if value != UNITS[key]:
                _fail(f"{top}: units", key, value, f"{UNITS[key]!r} (no unit conversion)")
    if "description" in data and not isinstance(data["description"], str):
        _fail(top, "description", data["description"], "a string")
    name = _profile_name(data, source)
    entries = _list_of_entries(data, "groups", source)
    groups, wheres, shown = [], [], []
    for i, entry in enumerate(entries):
        base = f"{source}: groups[{i}]"
        where = _entry_where(entry, source, base, "group")
        groups.append(_own_group(entry, base, where))
        wheres.append(where)
        shown.append(entry["kind"])
    seq_length = _seq_length(data.get("seq_length"), top)
    profile = _finish(name, groups, source, "groups", wheres, shown, seq_length)
    if "provenance" in data:
        if not isinstance(data["provenance"], Mapping):
            _fail(top, "provenance", data["provenance"], "a mapping")
        object.__setattr__(profile, "provenance", dict(data["provenance"]))
    return profile


def _own_group(entry: Any, base: str, where: str) -> LayerGroup:
    """One ``groups`` entry. ``modes`` may be omitted for a head or tail only."""
    if not isinstance(entry, Mapping):
        _fail(base, None, entry, "a mapping of group fields")
    if "name" not in entry:
        _fail(base, "name", _MISSING, "a non-empty string")
    _name(entry["name"], base)
    for key in entry:
        if key not in _OWN_GROUP_KEYS:
            _unknown(where, key, _OWN_GROUP_KEYS)
    kind = entry.get("kind", _MISSING)
    if kind not in GROUP_KINDS:
        _fail(where, "kind", kind, f"one of {', '.join(map(repr, GROUP_KINDS))}")
    if "count" not in entry:
        _fail(where, "count", _MISSING, "an integer >= 1")
    count = _count(entry["count"], where, "count")
    forward = _number(entry.get("forward", _MISSING), where, "forward", limit=MAX_MS)
    params = _number(entry.get("params", _MISSING), where, "params")
    raw_modes = entry.get("modes", _MISSING)
    modes: dict[str, ModeCost] = {}
    if raw_modes is _MISSING:
        if kind == "body":
            _fail(where, "modes", _MISSING, f"a mapping with at least one of {', '.join(MODES)}")
    else:
        if not isinstance(raw_modes, Mapping) or (kind == "body" and not raw_modes):
            _fail(where, "modes", raw_modes, f"a mapping with at least one of {', '.join(MODES)}")
        for mode, cost in raw_modes.items():
            if mode not in MODES:
                raise ProfileError(
                    f"{where}: field 'modes': unknown mode {show(mode)}: expected one of "
                    f"{', '.join(MODES)}"
                )
            mode_where = f"{where}: mode {mode!r}"
            if not isinstance(cost, Mapping):
                _fail(mode_where, None, cost, "a mapping {backward: ms, activation: MB}")
            for key in cost:
                if key not in _OWN_MODE_KEYS:
                    _unknown(mode_where, key, _OWN_MODE_KEYS)
            modes[mode] = ModeCost(
                backward=_number(cost.get("backward", _MISSING), mode_where, "backward", limit=MAX_MS),
                activation=_number(cost.get("activation", _MISSING), mode_where, "activation"),
            )
    if not modes:
        _check_default_backward(where, "forward", forward, kind)
    return LayerGroup(
        name=entry["name"], kind=kind, count=count, forward=forward, params=params, modes=modes,
        **_seq_group_fields(entry, where),
    )


def _seq_group_fields(entry: Mapping[str, Any], where: str) -> dict[str, Any]:
    """``kv_mb_per_token`` and ``attention_share`` of a group entry (either format), checked here."""
    fields: dict[str, Any] = {}
    if entry.get("kv_mb_per_token") is not None:
        fields["kv_mb_per_token"] = _number(entry["kv_mb_per_token"], where, "kv_mb_per_token")
    if entry.get("attention_share") is not None:
        fields["attention_share"] = _share(entry["attention_share"], where, "attention_share")
    return fields


def _check_default_backward(where: str, field_name: str, forward: float, kind: str) -> None:
    """A head or tail given no modes gets a backward of 2 × forward, which must stay within :data:`MAX_MS`."""
    if 2.0 * forward > MAX_MS:
        _fail(where, field_name, forward, f"at most {MAX_MS / 2:g} ms: a {kind} without recompute modes gets a "
              f"backward of 2 × forward, and backward times are at most {MAX_MS:g} ms")


# --- files --------------------------------------------------------------------------------
_SUFFIXES = (".json", ".yaml", ".yml")


def _read_document(file: Path, source: str) -> Any:
    """Parse a profile file with the guards of :mod:`sapptk.files` (size, encoding, depth, aliases)."""
    return load_document(file, what="profile", error=ProfileError, suffixes=_SUFFIXES)


def load_profile(path: str | os.PathLike[str]) -> Profile:
    """Read a profile file (``.json``, ``.yaml`` or ``.yml``) in either format."""
    source = _path_text(path)
    return _parse(_read_document(Path(source), source), source)


def _path_text(path: Any) -> str:
    try:
        return os.fsdecode(os.fspath(path))
    except TypeError:
        raise ProfileError(f"profile: expected a file path, got {type(path).__name__} {show(path)}") from None


# --- bundled profiles ---------------------------------------------------------------------
def _data_dirs() -> list[Path]:
    """Installed wheel first (``sapptk/_data``), then the source tree (``<repo>/data``)."""
    here = Path(__file__).resolve().parent
    return [here / "_data", here.parent / "data"]


def _looks_like_profile(file: Path) -> bool:
    """Whether ``file`` parses to a profile document.

    ``data/`` also holds other YAML (hand-made MindFormers configs), which are not profiles.
    """
    try:
        data = _read_document(file, str(file))
    except ProfileError:
        return False
    return isinstance(data, Mapping) and (
        "layers_description" in data or "groups" in data or data.get("format") == FORMAT
    )


def _bundled_files() -> dict[str, Path]:
    """Profile name -> file, over the data directories, the first directory winning."""
    found: dict[str, Path] = {}
    for directory in _data_dirs():
        if not directory.is_dir():
            continue
        for file in sorted(directory.iterdir()):
            if file.stem in found or file.suffix.lower() not in _SUFFIXES or not file.is_file():
                continue
            if _looks_like_profile(file):
                found[file.stem] = file
    return found


def bundled_profiles() -> list[str]:
    """Names of the profiles shipped with sapptk, for :func:`bundled_profile`."""
    return sorted(_bundled_files())


def bundled_profile(name: str) -> Profile:
    """A shipped profile by name, e.g. ``"llama2_70b"``, ``"demo"``, ``"deepseek_v3"``."""
    files = _bundled_files()
    if name not in files:
        raise ProfileError(
            f"bundled profile {name!r} does not exist: expected one of "
            f"{', '.join(sorted(files)) or '(none found)'}"
        )
    return load_profile(files[name])


def resolve_profile(source: Profile | str | os.PathLike[str]) -> Profile:
    """A :class:`Profile` from what a user names: a Profile itself, a file path (a
    :class:`os.PathLike`, or a string that names an existing file, has a file suffix or a
    path separator), or else the name of a bundled profile (:func:`bundled_profiles`)."""
    if isinstance(source, Profile):
        return source
    if isinstance(source, os.PathLike):
        return load_profile(source)
    if not isinstance(source, str):
        raise ProfileError(
            f"profile: expected a Profile, a profile file or a bundled name ({', '.join(bundled_profiles())}), "
            f"got {type(source).__name__} {show(source)}"
        )
    if Path(source).suffix or os.sep in source or "/" in source or Path(source).is_file():
        return load_profile(source)
    return bundled_profile(source)


def mode_set(modes: Any) -> Any:
    """Recompute mode names as one canonical tuple: a single name becomes a 1-tuple, any list,
    tuple or set of names is deduplicated and put in :data:`MODES` order (unknown names last,
    in the order given). Anything else is returned unchanged, for the caller to reject."""
    if isinstance(modes, str):
        return (modes,)
    if isinstance(modes, list | tuple | set | frozenset) and all(isinstance(m, str) for m in modes):
        unique = list(dict.fromkeys(sorted(modes) if isinstance(modes, set | frozenset) else modes))
        return tuple(sorted(unique, key=lambda m: MODES.index(m) if m in MODES else len(MODES)))
    return modes
