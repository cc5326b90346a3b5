"""Setups from a model card: tensor, context and expert parallelism and the optimizer
sharding vary with the pipeline, each combination with its own estimated profile.

For every ``tp × cp`` dividing the devices and every stage count ``p`` dividing what is
left, ``dp = devices / (tp · cp · p)``; for each ``ep`` (a divisor of the experts and of
``dp · cp · tp``) and each sharding, :func:`sapptk.estimate_profile` gives the profile, and
the pipeline setups (schedules × chunks, ``m = global_batch / (dp · micro_batch_size)``) run
on it. The DP all-reduce moves the gradients (``grad_dtype`` bytes of the static bytes per
parameter) over the hardware's inter-node link; FSDP's weight gathers are not modelled.
"""

from __future__ import annotations

from numbers import Real
from typing import Any

from sapptk.choosing.setups import Candidate, Setup, divisors, enumerate_setups, is_card
from sapptk.errors import ConfigError

__all__ = ["card_candidates", "card_dimensions", "hardware_bandwidth", "is_model_card"]


def card_dimensions(request: Any) -> tuple[list[int], list[int], list[int], list[str]]:
    """The ``tp``, ``cp``, ``ep`` and ``zero`` values a model-card choice tries (a checked
    :class:`~sapptk.choosing.request.ChooseRequest`). Defaults: tp the powers of two up to a node
    that divide the heads; cp 1; ep 1 for a dense model, else the powers of two dividing the
    experts (up to the devices); sharding ``distributed``."""
    from sapptk.models import SHARDINGS

    card, hw = request.source, request.hardware_card
    tps = list(request.tp) if request.tp is not None else [t for t in (1, 2, 4, 8, 16) if t <= hw.gpus_per_node
                                                            and card.num_heads % t == 0]
    cps = list(request.cp) if request.cp is not None else [1]
    experts = card.moe.experts if card.moe is not None else 1
    eps = list(request.ep) if request.ep is not None else [e for e in divisors(experts) if e & (e - 1) == 0
                                                           and e <= min(request.devices, 256)]
    zeros = list(request.zero) if request.zero is not None else ["distributed"]
    for z in zeros:
        if z not in SHARDINGS:
            raise ConfigError(f"zero = {z!r}: expected one of {', '.join(SHARDINGS)}")
    return tps, cps, eps, zeros


def card_candidates(request: Any, budget: float | None) -> tuple[list[Candidate], list[dict[str, Any]], list[str]]:
    """The candidates of a model-card choice (see the module docstring), the rows of the setups
    left out for a reason (status ``invalid``: a layout the card cannot take, ep not dividing
    dp · cp · tp, a program too large) and the notes it adds. ``budget``: MB per device every
    setup is bounded and balanced at (the safe budget with a memory margin)."""
    from sapptk.models import Parallel, estimate_profile
    from sapptk.models.estimate import check_layout, static_bytes_per_parameter
    from sapptk.models.layout import DTYPE_BYTES

    card, hw = request.source, request.hardware_card
    devices, mbs = request.devices, request.micro_batch_size
    seq = request.seq_length or 4096
    tps, cps, eps, zeros = card_dimensions(request)
    constant = request.constant_memory or hw.constant_mb
    candidates: list[Candidate] = []
    invalid: list[dict[str, Any]] = []
    reasons: list[str] = []
    for tp in tps:
        for cp in cps:
            if devices % (tp * cp):
                reasons.append(f"tp {tp} x cp {cp} does not divide devices = {devices}")
                continue
            rest = devices // (tp * cp)
            stage_list = [p for p in (request.stages or divisors(rest)) if rest % p == 0]
            for p in stage_list:
                dp = rest // p
                if request.global_batch % (dp * mbs):
                    continue
                made: list[dict[str, Any]] = []
                setups = enumerate_setups(
                    devices=p * dp, global_batch=request.global_batch, micro_batch_size=mbs,
                    schedules=request.schedules, stages=[p], chunks=request.chunks, memory_budget=budget,
                    constant_memory=constant, comm=request.comm, recompute=request.recompute,
                    max_chunks=request.max_chunks, invalid=made)
                for ep in eps:
                    for zero in zeros:
                        columns = {"tp": tp, "cp": cp, "ep": ep, "zero": zero}
                        invalid += [{**row, **columns} for row in made]
                        try:
                            par = Parallel(tp=tp, cp=cp, ep=ep, dp=dp, sharding=zero, micro_batch_size=mbs,
                                           seq_length=seq)
                            check_layout(card, par)
                        except ConfigError as exc:
                            reasons.append(str(exc))
                            invalid += [{"schedule": s.config.schedule, "stages": p, "chunks": s.config.chunks,
                                         "micro_batches": s.config.micro_batches, "dp": dp, **columns,
                                         "reason": str(exc)} for s in setups]
                            continue
                        profile = estimate_profile(card, par, hw)
                        share = DTYPE_BYTES[par.grad_dtype] / static_bytes_per_parameter(par, dp * cp)
                        share = 0.0 if zero in ("fsdp", "zero2") else share  # the profile times their per-layer RS
                        for s in setups:
                            candidates.append(Candidate(setup=Setup(config=s.config, dp=dp), profile=profile,
                                                        columns=columns, gradient_share=share))
    if not candidates:
        why = "; ".join(dict.fromkeys(reasons)) or "no combination divides the devices and the global batch"
        raise ConfigError(f"devices = {devices}, global_batch = {request.global_batch}: no setup of "
                          f"{card.name!r}: {why[:400]}")
    notes = [f"model card {card.name!r} on {hw.name}: budget {request.memory_budget or hw.memory_mb:,.0f} MB, "
             f"constant {constant:,.0f} MB per device; DP gradients over the inter-node link "
             f"({hw.inter_node_gbps:g} GB/s)"]
    return candidates, invalid, notes


def is_model_card(source: Any) -> bool:
    """Whether ``source`` is a model card (``sapptk.models``), not a profile."""
    return is_card(source)


def hardware_bandwidth(hardware: Any) -> float | None:
    """The inter-node link of a hardware card (or bundled name) in MB/ms (= GB/s)."""
    if isinstance(hardware, str):
        from sapptk.models import hardware as hardware_card

        hardware = hardware_card(hardware)
    value = getattr(hardware, "inter_node_gbps", None)
    return float(value) if isinstance(value, Real) and value > 0 else None
