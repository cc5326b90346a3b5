"""``ChooseRequest``: one choice, every argument typed and checked once, at construction.

:func:`sapptk.choose` takes a request, or builds one from its keywords (the keyword call
``choose(source, devices=..., global_batch=..., memory_budget=..., ...)`` is an adapter).
Every limit is :mod:`sapptk.checks`' (its constants, its one message shape): a bad value is a
:class:`~sapptk.errors.ConfigError` naming the argument, the value and the limit, raised before
anything is allocated or enumerated, and the number of setups is estimated
(:func:`estimate_setups`) and refused above
:data:`~sapptk.checks.MAX_SETUPS` before any is built.

Time: ``time_limit`` is the whole call (None: until every setup is decided), as in
:func:`sapptk.balance`; ``setup_time_limit`` is one balance of one setup; ``bound_time`` one
bound tightening. ``stop`` ends the call within about a second.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from numbers import Integral
from typing import Any

from sapptk import checks
from sapptk.choosing.cards import card_dimensions, is_model_card
from sapptk.choosing.setups import (
    DEFAULT_GRADIENT_SHARE,
    check_schedules,
    chunk_options,
    default_schedules,
    divisors,
    is_card,
)
from sapptk.errors import ConfigError
from sapptk.levers import LEVERS, choose_levers
from sapptk.sweeps.executors import check_executor

__all__ = ["ChooseRequest", "estimate_setups"]

_LISTS = ("stages", "chunks", "tp", "cp", "ep")


@dataclass(frozen=True)
class ChooseRequest:
    """Everything one choice needs, checked once (module docstring).

    Fields (see :func:`sapptk.choose` for what each means)
    ------
    source: a :class:`~sapptk.profile.Profile`, a bundled profile name or file, or a model card.
    devices: 1 … :data:`~sapptk.checks.MAX_DEVICES`. global_batch, micro_batch_size: 1 …
        :data:`~sapptk.checks.MAX_GLOBAL_BATCH`. memory_budget: MB per device (None: unlimited;
        a model card's hardware budget).
    hardware: a model card's hardware: a bundled name, a ``Hardware`` or a mapping of its fields.
    schedules, stages, chunks, max_chunks (1 … :data:`~sapptk.checks.MAX_CHOOSE_CHUNKS`), recompute,
        constant_memory, comm: the pipeline dimensions and costs.
    tp, cp, ep, zero, seq_length: a model card's parallel dimensions and tokens per sample.
    dp_bandwidth, gradient_share, sequence_length: the DP synchronisation and the throughput.
    memory_margin, oom_risk, memory_error: plan for a safe budget below ``memory_budget``
        (:func:`sapptk.sensitivity.robust_budget`); every bound and balance uses it.
    time_limit: seconds for the whole call (None: no limit); setup_time_limit: seconds per
        balance; bound_time: seconds per bound tightening; retry: the second balance's limit as
        a multiple of ``setup_time_limit`` (0 … :data:`~sapptk.checks.MAX_RETRY`).
    prove, tighten, batch (1 … :data:`~sapptk.checks.MAX_CHOOSE_BATCH`), executor, workers, cache,
        progress, seed, deterministic: as in :func:`sapptk.choose`.
    stop: a :class:`threading.Event` (never pickled). on_progress: a function of one dict.

    Derived once: ``profile`` (a profile source resolved) or ``card`` and ``hardware_card`` (a
    model card and its hardware), and ``estimated_setups``.
    """

    source: Any
    devices: int
    global_batch: int
    memory_budget: float | None
    micro_batch_size: int = 1
    hardware: Any = None
    schedules: tuple[str, ...] | None = None
    stages: tuple[int, ...] | None = None
    chunks: tuple[int, ...] | None = None
    max_chunks: int = 4
    recompute: tuple[str, ...] | None = None
    constant_memory: float = 0
    comm: float = 0
    tp: tuple[int, ...] | None = None
    cp: tuple[int, ...] | None = None
    ep: tuple[int, ...] | None = None
    zero: tuple[str, ...] | None = None
    seq_length: int | None = None
    dp_bandwidth: float | None = None
    gradient_share: float = DEFAULT_GRADIENT_SHARE
    sequence_length: int | None = None
    memory_margin: float | None = None
    oom_risk: float | None = None
    memory_error: Any = None
    per_micro_batch: bool = False
    time_limit: float | None = None
    setup_time_limit: float = 20.0
    bound_time: float = 1.0
    retry: float = 2.0
    prove: bool = True
    tighten: bool = True
    batch: int = 2
    executor: Any = "serial"
    workers: int | None = None
    cache: Any = None
    progress: bool = False
    seed: int = 0
    deterministic: bool = False
    stop: threading.Event | None = None
    on_progress: Callable[[dict[str, Any]], None] | None = None
    # derived in __post_init__
    profile: Any = field(init=False, repr=False, compare=False)
    card: Any = field(init=False, repr=False, compare=False)
    hardware_card: Any = field(init=False, repr=False, compare=False)
    estimated_setups: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        E = ConfigError
        if not is_model_card(self.source):
            for name in ("tp", "cp", "ep", "zero", "seq_length"):
                if getattr(self, name) is not None:
                    raise ConfigError(f"{name} = {checks.show(getattr(self, name))}: only a model card varies tp, "
                                      "cp, ep or zero (or takes seq_length); a profile fixes them (choose(card, "
                                      "hardware=...) to vary them)")
            if self.hardware is not None:
                raise ConfigError("hardware: only a model card takes a hardware card; a profile already holds the "
                                  "costs")
        set_(self, "devices", checks.integer(self.devices, "devices", error=E, low=1, high=checks.MAX_DEVICES))
        for name in ("global_batch", "micro_batch_size"):
            set_(self, name, checks.integer(getattr(self, name), name, error=E, low=1, high=checks.MAX_GLOBAL_BATCH))
        if self.memory_budget is not None:
            set_(self, "memory_budget", checks.number(self.memory_budget, "memory_budget", error=E, above=0.0,
                                                      high=checks.MAX_BUDGET_MB))
        for name in ("constant_memory", "comm"):
            high = checks.MAX_BUDGET_MB if name == "constant_memory" else checks.MAX_COMM_MS
            set_(self, name, checks.number(getattr(self, name), name, error=E, low=0.0, high=high))
        set_(self, "max_chunks", checks.integer(self.max_chunks, "max_chunks", error=E, low=1,
                                                high=checks.MAX_CHOOSE_CHUNKS))
        set_(self, "schedules", None if self.schedules is None else tuple(check_schedules(self.schedules)))
        for name in _LISTS:
            high = checks.MAX_CHOOSE_CHUNKS if name == "chunks" else checks.MAX_DEVICES
            set_(self, name, _int_tuple(name, getattr(self, name), high))
        if self.recompute is not None:
            modes = [self.recompute] if isinstance(self.recompute, str) else self.recompute
            if not isinstance(modes, Sequence | set | frozenset) or not all(isinstance(m, str) for m in modes):
                checks.fail(E, "recompute", self.recompute, "a list of recompute mode names (or None)")
            set_(self, "recompute", tuple(modes))
        if self.zero is not None:
            zero = [self.zero] if isinstance(self.zero, str) else self.zero
            if not isinstance(zero, Sequence | set | frozenset) or not zero:
                checks.fail(E, "zero", self.zero, "a non-empty list of sharding names (or None)")
            set_(self, "zero", tuple(zero))
        for name in ("seq_length", "sequence_length"):
            if getattr(self, name) is not None:
                set_(self, name, checks.integer(getattr(self, name), name, error=E, low=1,
                                                high=checks.MAX_SEQ_LENGTH))
        if self.dp_bandwidth is not None:
            set_(self, "dp_bandwidth", checks.number(self.dp_bandwidth, "dp_bandwidth", error=E, above=0.0,
                                                     high=checks.MAX_BANDWIDTH))
        set_(self, "gradient_share", checks.number(self.gradient_share, "gradient_share", error=E, above=0.0,
                                                   high=checks.MAX_GRADIENT_SHARE))
        self._check_time()
        set_(self, "batch", checks.integer(self.batch, "batch", error=E, low=1, high=checks.MAX_CHOOSE_BATCH))
        for name in ("prove", "tighten", "progress"):
            set_(self, name, checks.flag(getattr(self, name), name, error=E))
        if self.stop is not None and not callable(getattr(self.stop, "is_set", None)):
            checks.fail(E, "stop", self.stop, "a threading.Event (or None)")
        if self.on_progress is not None and not callable(self.on_progress):
            checks.fail(E, "on_progress", self.on_progress, "a function of one dict (or None)")
        check_executor(self.executor)
        self._check_levers()
        self._check_source()
        estimate = estimate_setups(self)
        set_(self, "estimated_setups", estimate)
        if estimate > checks.MAX_SETUPS:
            raise ConfigError(f"choose: devices = {self.devices}, global_batch = {self.global_batch}: about "
                              f"{estimate:,} setups: expected at most {checks.MAX_SETUPS:,} (sapptk.checks.MAX_SETUPS; "
                              "restrict schedules, stages, chunks, max_chunks, tp, cp, ep or zero)")

    def _check_time(self) -> None:
        E = ConfigError
        if self.time_limit is not None:
            object.__setattr__(self, "time_limit", checks.time_limit(self.time_limit, "time_limit", error=E))
        limit = checks.time_limit(self.setup_time_limit, "setup_time_limit", error=E)
        _, workers, seed, deterministic = checks.solver_arguments(
            time_limit=limit, workers=self.workers, seed=self.seed, deterministic=self.deterministic)
        object.__setattr__(self, "setup_time_limit", limit)
        for name, value in (("workers", workers), ("seed", seed), ("deterministic", deterministic)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "bound_time", checks.time_limit(self.bound_time, "bound_time", error=E))
        object.__setattr__(self, "retry", checks.number(self.retry, "retry", error=E, low=0.0, high=checks.MAX_RETRY))

    def _check_levers(self) -> None:
        """The levers, as :mod:`sapptk.levers` describes them: one ``choose`` cannot bound is
        refused with the reason; the others are checked against their limits."""
        values = {f.name: getattr(self, f.name) for item in LEVERS for f in item.fields if hasattr(self, f.name)}
        for name, value in choose_levers(values).items():
            object.__setattr__(self, name, value)

    def _check_source(self) -> None:
        set_ = object.__setattr__
        card = is_model_card(self.source)
        set_(self, "card", self.source if card else None)
        set_(self, "hardware_card", None)
        set_(self, "profile", None)
        if card:
            if self.hardware is None:
                raise ConfigError("hardware = None: a model card needs a hardware card (a bundled name such as "
                                  "'h100', a sapptk.models.Hardware, or a mapping of its fields)")
            if not (isinstance(self.hardware, str | Mapping) or type(self.hardware).__name__ == "Hardware"):
                checks.fail(ConfigError, "hardware", self.hardware,
                            "a bundled hardware name, a sapptk.models.Hardware or a mapping of its fields")
            from sapptk.models import hardware as hardware_card

            set_(self, "hardware_card", hardware_card(self.hardware))
            return
        from sapptk.profile import resolve_profile

        set_(self, "profile", resolve_profile(self.source))

    def replace(self, **changes: Any) -> ChooseRequest:
        """A new request with ``changes`` (field names as keywords), checked like any other."""
        names = {f.name for f in dataclasses.fields(self) if f.init}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ConfigError(f"ChooseRequest.replace: unknown field {unknown[0]!r}: expected one of "
                              f"{', '.join(sorted(names))}")
        return dataclasses.replace(self, **changes)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["stop"] = None  # an Event belongs to the process that made it
        state["on_progress"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


def _int_tuple(name: str, values: Any, high: int) -> tuple[int, ...] | None:
    """A list of integers 1 … ``high`` as a sorted tuple without repeats (None stays None)."""
    if values is None:
        return None
    if isinstance(values, Integral) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, str) or not isinstance(values, Sequence | set | frozenset | range):
        checks.fail(ConfigError, name, values, "a list of integers >= 1, or None for every value")
    if len(values) > checks.MAX_SETUPS:
        checks.fail(ConfigError, name, values, f"at most {checks.MAX_SETUPS:,} values (sapptk.checks.MAX_SETUPS)")
    out = tuple(sorted({checks.integer(v, f"{name}[{i}]", error=ConfigError, low=1, high=high)
                        for i, v in enumerate(values)}))
    if not out:
        raise ConfigError(f"{name} = {checks.show(values)}: an empty list allows no setup; give at least one value "
                          "(or None for every value)")
    return out


def estimate_setups(request: Any) -> int:
    """How many setups (frame rows) a checked :class:`~sapptk.choosing.request.ChooseRequest`
    would range over, counted from divisors (nothing is built): a model card's dimensions
    multiply the pipeline setups of each ``tp · cp``."""
    sched = list(request.schedules) if request.schedules is not None else list(default_schedules())
    per_shape = sum(len(chunk_options(n, request.chunks, request.max_chunks)) for n in sched)

    def shapes(devices: int) -> int:
        stage_list = divisors(devices) if request.stages is None else [p for p in request.stages if devices % p == 0]
        return sum(1 for p in stage_list if request.global_batch % (devices // p * request.micro_batch_size) == 0)

    if not is_card(request.source):
        return shapes(request.devices) * per_shape
    tps, cps, eps, zeros = card_dimensions(request)
    total = 0
    for tp in tps:
        for cp in cps:
            if request.devices % (tp * cp) == 0:
                total += shapes(request.devices // (tp * cp)) * len(eps) * len(zeros) * per_shape
    return total
