"""``SolveRequest``: one solve, every argument typed and checked once, at construction.

Every caller that solves (``balance``, ``sweep``, ``choose``, the Explorer, the command line)
builds a request and hands it to :func:`sapptk.solve`; nothing downstream checks an argument
again. The checks are :mod:`sapptk.checks`' (its limits, its one message shape), so every
caller refuses the same value with the same :class:`~sapptk.errors.ConfigError`, naming the
field, the value and what was expected.

A request is frozen: :meth:`SolveRequest.replace` returns a new, checked one. Pickled (a sweep
ships requests to worker processes) it drops ``stop``: a :class:`threading.Event` belongs to
the process that made it.
"""

from __future__ import annotations

import dataclasses
import math
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from sapptk import checks
from sapptk.config import OFFLOAD, PipelineConfig
from sapptk.errors import ConfigError
from sapptk.levers import check_exclusions
from sapptk.profile import Profile
from sapptk.seq import is_sliced
from sapptk.solver.settings import SearchOptions

if TYPE_CHECKING:
    from sapptk.plan import Plan

__all__ = ["SolveRequest"]


@dataclass(frozen=True)
class SolveRequest:
    """Everything one solve needs, checked once (:mod:`sapptk.checks`).

    Fields
    ------
    profile, config: the model and the pipeline setup (``config`` is checked against ``profile``).
    time_limit: wall-clock seconds for the whole solve, every phase included; a finite number > 0.
    workers: CP-SAT worker threads, 1 to :data:`sapptk.checks.MAX_WORKERS`.
    seed: random seed, 0 to :data:`sapptk.checks.MAX_SEED`.
    deterministic: one sequential CP-SAT worker and searches that count their work instead of
        timing it (the same input gives the same plan unless the limit cuts the search short).
    allow_empty_stages: let virtual stages hold no body layer.
    start: a plan (or its counts array) for the same profile and pipeline, seeding the search.
    stop: a :class:`threading.Event`; once set, the solve returns its best plan within about a
        second. Never pickled.
    memory_margin, oom_risk, memory_error: solve for a safe budget below
        ``config.memory_budget`` (:func:`sapptk.sensitivity.robust_budget`).
    per_micro_batch: also let chosen micro-batches of a virtual stage recompute less.
    choose_splits: with sequence slices, also choose the slice lengths.
    stall_time: seconds without improvement after which the search ends early (or None);
        overrides ``options.stall_time``.
    options: the search's knobs and time shares (:class:`~sapptk.solver.settings.SearchOptions`).

    Derived once: :attr:`offload` (``"offload"`` in ``config.recompute``), :attr:`search_options`
    (``options`` with ``stall_time``), :attr:`safe_config` (``config`` with the safe budget) and
    :attr:`safety` (the note naming it), :attr:`start_counts` (``start`` as a checked counts array).
    """

    profile: Profile
    config: PipelineConfig
    time_limit: float = 30.0
    workers: int = 2
    seed: int = 0
    deterministic: bool = False
    allow_empty_stages: bool = False
    start: Plan | np.ndarray | None = None
    stop: threading.Event | None = None
    memory_margin: float | None = None
    oom_risk: float | None = None
    memory_error: Any = None
    per_micro_batch: bool = False
    choose_splits: bool = False
    stall_time: float | None = None
    options: SearchOptions | None = None
    # derived in __post_init__ (not arguments)
    search_options: SearchOptions = field(init=False, repr=False, compare=False)
    safe_config: PipelineConfig = field(init=False, repr=False, compare=False)
    safety: str | None = field(init=False, repr=False, compare=False)
    start_counts: np.ndarray | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.profile, Profile):
            checks.fail(ConfigError, "profile", self.profile, "a sapptk Profile (sapptk.load_profile(path))")
        if not isinstance(self.config, PipelineConfig):
            checks.fail(ConfigError, "config", self.config, "a sapptk PipelineConfig")
        limit, workers, seed, deterministic = checks.solver_arguments(
            time_limit=self.time_limit, workers=self.workers, seed=self.seed, deterministic=self.deterministic)
        if workers is None:
            checks.fail(ConfigError, "workers", None, f"an integer from 1 to {checks.MAX_WORKERS}")
        flags = {name: checks.flag(getattr(self, name), name)
                 for name in ("allow_empty_stages", "per_micro_batch", "choose_splits")}
        if self.stop is not None and not callable(getattr(self.stop, "is_set", None)):
            checks.fail(ConfigError, "stop", self.stop, "a threading.Event (or None)")
        if self.options is not None and not isinstance(self.options, SearchOptions):
            checks.fail(ConfigError, "options", self.options, "a sapptk.SearchOptions (or None)")
        stall = None if self.stall_time is None else checks.number(self.stall_time, "stall_time", error=ConfigError,
                                                                  above=0.0)
        for name, value in (("time_limit", limit), ("workers", workers), ("seed", seed),
                            ("deterministic", deterministic), ("stall_time", stall), *flags.items()):
            object.__setattr__(self, name, value)
        options = self.options or SearchOptions()
        if stall is not None:
            options = dataclasses.replace(options, stall_time=stall)
        object.__setattr__(self, "search_options", options)
        self._check_levers()
        safe, safety = _safe_budget(self.config, self.memory_margin, self.oom_risk, self.memory_error)
        object.__setattr__(self, "safe_config", safe)
        object.__setattr__(self, "safety", safety)
        safe.check(self.profile, allow_empty_stages=self.allow_empty_stages)
        counts = None if self.start is None else _start_counts(self.profile, safe, self.start)
        if counts is not None:
            counts.setflags(write=False)
        object.__setattr__(self, "start_counts", counts)

    def _check_levers(self) -> None:
        """The levers that cannot go together, refused by name (:func:`sapptk.levers.check_exclusions`)."""
        sliced = is_sliced(self.profile, self.config)
        if self.choose_splits and not sliced:
            raise ConfigError(f"choose_splits = True: splits = {self.config.splits} on profile "
                              f"{self.profile.name!r} (seq_length = {self.profile.seq_length}): expected k > 1 "
                              "sequence slices and a profile with seq_length")
        check_exclusions({"recompute": self.config.recompute, "recompute_name": "config.recompute",
                          "per_micro_batch": self.per_micro_batch, "choose_splits": False,
                          "splits": self.config.splits if sliced else 1,  # slices of a long-context profile only
                          "seq_length": self.profile.seq_length})

    # ------------------------------------------------------------------ derived
    @property
    def offload(self) -> bool:
        """Whether the plan may offload activations (``"offload"`` in ``config.recompute``)."""
        return OFFLOAD in self.config.recompute

    @property
    def sliced(self) -> bool:
        """Whether the setup cuts micro-batches into sequence slices of a long-context profile."""
        return is_sliced(self.profile, self.config)

    def replace(self, **changes: Any) -> SolveRequest:
        """A new request with ``changes`` (field names as keywords), checked like any other."""
        derived = {f.name for f in dataclasses.fields(self) if not f.init}
        unknown = sorted(set(changes) - {f.name for f in dataclasses.fields(self)} | (set(changes) & derived))
        if unknown:
            raise ConfigError(f"SolveRequest.replace: unknown field {unknown[0]!r}: expected one of "
                              f"{', '.join(f.name for f in dataclasses.fields(self) if f.init)}")
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ equality
    def _key(self) -> tuple[Any, ...]:
        """What two equal requests share: every compared field, ``start`` as its checked counts
        (an array compares element-wise, so it cannot be compared or hashed as given)."""
        fields = tuple((f.name, _comparable(getattr(self, f.name))) for f in dataclasses.fields(self)
                       if f.compare and f.name != "start")
        return (*fields, ("start", _comparable(self.start_counts)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SolveRequest):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        key = self._key()
        try:
            return hash(key)
        except TypeError:  # a field of a type without a hash (memory_error as a list, say)
            return hash(repr(key))

    # ------------------------------------------------------------------ pickling
    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["stop"] = None  # an Event belongs to the process that made it
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for name, value in state.items():
            object.__setattr__(self, name, value)


def _comparable(value: Any) -> Any:
    """``value`` in a form ``==`` and ``hash`` take: arrays as (shape, dtype, bytes), lists as tuples."""
    if isinstance(value, np.ndarray):
        return ("array", value.shape, value.dtype.str, value.tobytes())
    if isinstance(value, list | tuple):
        return tuple(_comparable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((repr(k), _comparable(v)) for k, v in value.items()))
    return value


def _safe_budget(config: PipelineConfig, memory_margin: Any, oom_risk: Any,
                 memory_error: Any) -> tuple[PipelineConfig, str | None]:
    """``config`` with the safe budget of :func:`sapptk.sensitivity.robust_budget`, and a note
    naming it (``config`` itself and None when no safety was asked for)."""
    if memory_margin is None and oom_risk is None and memory_error is None:
        return config, None
    from sapptk.sensitivity import robust_budget

    safe = robust_budget(config, memory_margin=memory_margin, oom_risk=oom_risk, memory_error=memory_error)
    if safe is None or not math.isfinite(safe) or safe <= 0:
        raise ConfigError(f"memory_margin / oom_risk: they leave a safe budget of {safe!r} MB of the "
                          f"{config.memory_budget!r} MB budget: expected a budget > 0")
    asked = []
    if memory_margin is not None:
        asked.append(f"memory_margin={memory_margin!r}")
    if oom_risk is not None:
        asked.append(f"oom_risk={oom_risk!r}")
    note = (f"solved for a safe budget of {safe:.6g} MB per device ({', '.join(asked)}) "
            f"under the {config.memory_budget:.6g} MB budget")
    return dataclasses.replace(config, memory_budget=safe), note


def _start_counts(profile: Profile, config: PipelineConfig, start: Any) -> np.ndarray:
    """The counts of a start plan, checked to be for this profile and program."""
    from sapptk.costs import check_counts
    from sapptk.plan import Plan

    if isinstance(start, Plan):
        if start.profile != profile:
            raise ConfigError(f"start: the plan is for profile {start.profile.name!r}, not for {profile.name!r}")
        keys = ("schedule", "stages", "micro_batches", "chunks", "splits")
        mine = {k: getattr(config, k) for k in keys}
        theirs = {k: getattr(start.config, k) for k in keys}
        if mine != theirs:
            diff = ", ".join(f"{k} = {theirs[k]!r} (expected {mine[k]!r})" for k in keys if mine[k] != theirs[k])
            raise ConfigError(f"start: the plan is for another pipeline: {diff}")
        if not start.solved:
            raise ConfigError(f"start: the plan has status {start.status!r} and no layer assignment")
        counts: Any = start.counts
    else:
        counts = start
    try:
        return np.array(check_counts(profile, config, counts), dtype=np.int64, copy=True)
    except ConfigError as exc:
        raise ConfigError(f"start: {exc}") from exc
