"""The setups a choice ranges over, and the data-parallel gradient synchronisation.

A setup is a pipeline shape on ``devices`` devices: a schedule, ``stages`` p dividing the
devices (``dp = devices / p`` copies of the pipeline), ``chunks`` v the schedule accepts,
and ``micro_batches m = global_batch / (dp · micro_batch_size)``. Every argument is checked
here, at the boundary, with a :class:`~sapptk.errors.ConfigError` naming it.

DP synchronisation: after the pipeline's step, each device all-reduces its gradients with
the devices holding the same layers in the other pipelines (a ring: ``2 (dp − 1) / dp`` of
its gradient bytes cross its link), not overlapped with the step. A device's gradient MB
are ``gradient_share`` of its parameter MB (the profile's static memory per layer; the
default 4/18: fp32 gradients of mixed-precision Adam's 2 + 4 + 12 bytes per parameter).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any

import numpy as np

from sapptk.choosing.bounds import SetupBound
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.profile import Profile
from sapptk.schedules import get, names

__all__ = ["DEFAULT_GRADIENT_SHARE", "Setup", "default_schedules", "divisors", "dp_sync_ms", "enumerate_setups",
           "program_digest", "Candidate"]

DEFAULT_GRADIENT_SHARE = 4 / 18
"""Share of a device's parameter MB that data parallelism all-reduces (fp32 gradients of
mixed-precision Adam: 4 of 2 + 4 + 12 bytes per parameter)."""


@dataclass(frozen=True)
class Setup:
    """One candidate: its pipeline config and its data-parallel degree."""

    config: PipelineConfig
    dp: int

    @property
    def label(self) -> str:
        c = self.config
        return f"{c.schedule} p{c.stages} v{c.chunks} m{c.micro_batches} dp{self.dp}"


def default_schedules() -> tuple[str, ...]:
    """Every registered schedule whose op order does not depend on costs (a bound needs the
    order up front) and which differs from 1F1B without sequence slices (not ``seq1f1b``)."""
    return tuple(n for n in names() if not get(n).cost_driven and not get(n).splits)


def divisors(n: int) -> list[int]:
    """Every divisor of ``n >= 1``, ascending, from its prime factors (trial division up to √n:
    about a thousand steps for :data:`~sapptk.checks.MAX_DEVICES`, never a scan of every integer)."""
    factors: dict[int, int] = {}
    rest, d = int(n), 2
    while d * d <= rest:
        while rest % d == 0:
            factors[d] = factors.get(d, 0) + 1
            rest //= d
        d += 1 if d == 2 else 2
    if rest > 1:
        factors[rest] = factors.get(rest, 0) + 1
    out = [1]
    for prime, k in factors.items():
        out = [x * prime**e for x in out for e in range(k + 1)]
    return sorted(out)


def chunk_options(schedule: str, chunks: Sequence[int] | None, max_chunks: int) -> list[int]:
    """The chunk counts a choice tries for ``schedule``: ``chunks`` (those the schedule accepts)
    or every count it accepts up to ``max_chunks``."""
    spec = get(schedule)
    allowed = list(range(1, max_chunks + 1)) if spec.chunks is None else list(spec.chunks)
    if chunks is None:
        return allowed
    return [v for v in chunks if spec.chunks is None or v in allowed]


def is_card(source: Any) -> bool:
    """Whether ``source`` is a model card (``sapptk.models``), not a profile."""
    return type(source).__name__ == "ModelCard" and type(source).__module__.startswith("sapptk.models")


def _positive_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ConfigError(f"{name} = {value!r}: expected an integer >= 1")
    return int(value)


def _int_list(name: str, values: Any) -> list[int] | None:
    if values is None:
        return None
    if isinstance(values, Integral) and not isinstance(values, bool):
        values = [values]
    if isinstance(values, str) or not isinstance(values, Sequence | set | frozenset | range):
        raise ConfigError(f"{name} = {values!r}: expected a list of integers >= 1, or None for every value")
    out = [_positive_int(f"{name}[{i}]", v) for i, v in enumerate(values)]
    if not out:
        raise ConfigError(f"{name} = {values!r}: an empty list allows no setup; give at least one value "
                          "(or None for every value)")
    return sorted(set(out))


def check_schedules(schedules: Any) -> list[str]:
    """The schedule names, checked: registered and not cost-driven."""
    if schedules is None:
        return list(default_schedules())
    if isinstance(schedules, str):
        schedules = [schedules]
    if not isinstance(schedules, Sequence | set | frozenset):
        raise ConfigError(f"schedules = {schedules!r}: expected a list of schedule names, or None for every one")
    out = []
    for i, name in enumerate(schedules):
        if not isinstance(name, str) or name not in names():
            raise ConfigError(f"schedules[{i}] = {name!r}: unknown schedule; available: {', '.join(names())}")
        if get(name).cost_driven:
            raise ConfigError(f"schedules[{i}] = {name!r}: its op order depends on the costs, so no bound can be "
                              "proven before balancing; choose among the other schedules")
        if name not in out:
            out.append(name)
    if not out:
        raise ConfigError(f"schedules = {schedules!r}: an empty list allows no setup; give at least one schedule "
                          "(or None for every one)")
    return out


def enumerate_setups(
    *,
    devices: Any,
    global_batch: Any,
    micro_batch_size: Any = 1,
    schedules: Any = None,
    stages: Any = None,
    chunks: Any = None,
    memory_budget: Any,
    constant_memory: float = 0,
    comm: float = 0,
    recompute: Any = None,
    max_chunks: int = 4,
    invalid: list[dict[str, Any]] | None = None,
) -> list[Setup]:
    """Every setup the arguments allow, in a fixed order (schedule, stages, chunks).

    ``stages`` (default: every divisor of ``devices``) must divide ``devices``; ``chunks``
    defaults to what each schedule accepts up to ``max_chunks``. A combination the schedule
    does not accept (a chunk count it has no order for), or a stage count whose ``dp ·
    micro_batch_size`` does not divide ``global_batch``, is not a setup. Raises
    :class:`ConfigError` when no stage count divides the devices, or when ``global_batch`` is
    divisible by ``dp · micro_batch_size`` for none of them. With ``invalid`` (a list), a setup
    whose config cannot be built (a program too large, ...) goes there as a row with its
    ``reason`` instead of raising.
    """
    n_dev = _positive_int("devices", devices)
    batch = _positive_int("global_batch", global_batch)
    mbs = _positive_int("micro_batch_size", micro_batch_size)
    if memory_budget is not None and (isinstance(memory_budget, bool) or not isinstance(memory_budget, Real)
                                      or not memory_budget > 0):
        raise ConfigError(f"memory_budget = {memory_budget!r}: expected MB > 0 per device, or None for unlimited")
    sched = check_schedules(schedules)
    stage_list = _int_list("stages", stages)
    chunk_list = _int_list("chunks", chunks)
    if stage_list is None:
        stage_list = divisors(n_dev)
    else:
        good = [p for p in stage_list if n_dev % p == 0]
        if not good:
            raise ConfigError(f"devices = {n_dev}: none of stages = {stage_list} divides it (stages p must divide the "
                              f"devices, dp = devices / p); divisors: {divisors(n_dev)[:50]}")
        stage_list = good
    shapes = [(p, n_dev // p) for p in stage_list if batch % (n_dev // p * mbs) == 0]
    if not shapes:
        raise ConfigError(
            f"global_batch = {batch}: not divisible by dp · micro_batch_size for any setup (dp = devices / stages "
            f"= {sorted({n_dev // p for p in stage_list})}, micro_batch_size = {mbs}); expected a multiple of one of "
            f"{sorted({n_dev // p * mbs for p in stage_list})}"
        )
    extra: dict[str, Any] = {}
    if recompute is not None:
        extra["recompute"] = recompute
    out = []
    for name in sched:
        for p, dp in shapes:
            m = batch // (dp * mbs)
            for v in chunk_options(name, chunk_list, max_chunks):
                try:
                    config = PipelineConfig(stages=p, micro_batches=m, chunks=v, schedule=name,
                                            memory_budget=None if memory_budget is None else float(memory_budget),
                                            constant_memory=constant_memory, comm=comm, **extra)
                except ConfigError as exc:
                    if invalid is None:
                        raise
                    invalid.append({"schedule": name, "stages": p, "chunks": v, "micro_batches": m, "dp": dp,
                                    "reason": str(exc)})
                    continue
                out.append(Setup(config=config, dp=dp))
    if not out and not invalid:
        raise ConfigError(f"chunks = {chunk_list}: no schedule of {sched} accepts these chunk counts")
    return out


def dp_sync_ms(params_mb: float, dp: int, dp_bandwidth: float | None, gradient_share: float) -> float:
    """Ring all-reduce time (ms) of ``gradient_share · params_mb`` MB over ``dp`` devices at
    ``dp_bandwidth`` MB/ms; 0 without a bandwidth or for dp = 1."""
    if dp_bandwidth is None or dp <= 1:
        return 0.0
    return 2.0 * (dp - 1) / dp * gradient_share * float(params_mb) / float(dp_bandwidth)


def program_digest(config: PipelineConfig) -> str:
    """A content hash of a setup's program (op order and placement): two schedules with the
    same order (interleaved and interleaved-rf when p divides m, ...) are one setup to bound
    and to balance."""
    import hashlib

    program = config.program()
    arrays = program.arrays
    h = hashlib.sha256()
    for name in ("unit_ptr", "unit_op_ptr", "kind", "micro_batch", "virtual_stage", "slice"):
        h.update(np.ascontiguousarray(getattr(arrays, name)).tobytes())
        h.update(b"|")
    h.update(repr(tuple(program.placement)).encode())
    return h.hexdigest()[:32]


@dataclass
class Candidate:
    """One setup to decide: its config and dp, the profile it runs, extra frame columns (the
    parallel layout of a model-card choice), and its gradient MB per parameter MB; a
    model-card setup's ``layer_sync_ms`` (the estimate's exposed data-parallel step
    collectives per layer, one figure per body group of the profile) replaces the
    bandwidth model of :func:`dp_sync_ms`."""

    setup: Setup
    profile: Profile
    columns: dict[str, Any] = field(default_factory=dict)
    gradient_share: float = DEFAULT_GRADIENT_SHARE
    layer_sync_ms: tuple[float, ...] | None = None  # model card: exposed DP step ms per layer of each body group
    bound: SetupBound | None = None
    lower_ms: float = 0.0  # proven bound on step_time_ms (pipeline + sync)
    sync_floor_ms: float = 0.0
    row: dict[str, Any] = field(default_factory=dict)
    counts: Any = None
    state: Any = None  # its SetupState (sapptk.choosing.state)
    balanced: bool = False  # balanced once (then it may be bounded longer and balanced again)
    retry: bool = False  # its next balance is the longer second one
    layouts: bool = False  # its layout bound could enumerate the layouts
    twin: Any = None  # its Twin (sapptk.choosing.state): setups with the same program, profile and limits
