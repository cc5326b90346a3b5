"""Setups from a model card: tensor, context and expert parallelism and the optimizer
sharding vary with the pipeline, each combination with its own estimated profile.

For every ``tp × cp`` dividing the devices and every stage count ``p`` dividing what is
left, ``dp = devices / (tp · cp · p)``; for each ``ep`` (a divisor of the experts and of
``dp · cp · tp``) and each sharding, :func:`sapptk.estimate_profile` gives the profile, and
the pipeline setups (schedules × chunks, ``m = global_batch / (dp · micro_batch_size)``) run
on it, planned with the profile's own constant (``provenance["constant_mb"]``: the card's
context plus the largest transient inside an op) unless ``constant_memory`` is given. The data-
parallel step collectives are the estimate's (:func:`sapptk.models.operators`, phase ``step``):
the gradient reduce-scatter and parameter all-gather of the distributed optimizer (all-reduce
without sharding, none under FSDP, whose per-micro-batch collectives are in the profile's
times) over the DP group's links — inside a node when ``tp · cp · dp`` ranks fit one in
Megatron's rank order — charged only where the last backward and the first forward do not
hide them (``provenance["dp_step_exposed_ms_per_layer"]``), summed over a device's layers.
Routed experts are planned with expert tensor parallel 1 (``Parallel(etp=1)``, what
Megatron-Bridge's MoE recipes and the Megatron-MoE-ModelZoo set; Megatron-LM's bare default
would be ``tp``).
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

    card, hw = request.source, request.hardware_card
    devices, mbs = request.devices, request.micro_batch_size
    seq = request.seq_length or 4096
    tps, cps, eps, zeros = card_dimensions(request)
    candidates: list[Candidate] = []
    invalid: list[dict[str, Any]] = []
    reasons: list[str] = []
    constants: list[float] = []
    made: dict[tuple[int, int, float], tuple[list[Setup], list[dict[str, Any]]]] = {}
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
                for ep in eps:
                    for zero in zeros:
                        columns = {"tp": tp, "cp": cp, "ep": ep, "zero": zero}
                        try:
                            par = Parallel(tp=tp, cp=cp, ep=ep, dp=dp, sharding=zero, micro_batch_size=mbs,
                                           seq_length=seq, etp=1)  # expert TP 1, as Megatron's MoE recipes set
                            profile = estimate_profile(card, par, hw)
                        except ConfigError as exc:
                            reasons.append(str(exc))
                            plain = request.constant_memory or hw.constant_mb
                            setups, rows = _setups(request, budget, p, dp, plain, made)
                            invalid += [{**row, **columns} for row in rows]
                            invalid += [{"schedule": s.config.schedule, "stages": p, "chunks": s.config.chunks,
                                         "micro_batches": s.config.micro_batches, "dp": dp, **columns,
                                         "reason": str(exc)} for s in setups]
                            continue
                        constant = request.constant_memory or float(profile.provenance["constant_mb"])
                        constants.append(constant)
                        setups, rows = _setups(request, budget, p, dp, constant, made)
                        invalid += [{**row, **columns} for row in rows]
                        sync = profile.provenance["dp_step_exposed_ms_per_layer"]
                        layer_sync = tuple(float(sync[g.name]) for g in profile.body)
                        for s in setups:
                            candidates.append(Candidate(setup=Setup(config=s.config, dp=dp), profile=profile,
                                                        columns=columns, layer_sync_ms=layer_sync))
    if not candidates:
        why = "; ".join(dict.fromkeys(reasons)) or "no combination divides the devices and the global batch"
        raise ConfigError(f"devices = {devices}, global_batch = {request.global_batch}: no setup of "
                          f"{card.name!r}: {why[:400]}")
    fixed = f"{request.constant_memory:,.0f} MB" if request.constant_memory else (
        f"{min(constants):,.0f}-{max(constants):,.0f} MB (the estimate's context + largest transient)")
    notes = [f"model card {card.name!r} on {hw.name}: budget {request.memory_budget or hw.memory_mb:,.0f} MB, "
             f"constant {fixed} per device; DP step collectives as the estimate times them (reduce-scatter "
             "and all-gather, or all-reduce, over the DP group's links; only what the backward and forward "
             "do not hide)"]
    return candidates, invalid, notes


def _setups(request: Any, budget: float | None, p: int, dp: int, constant: float,
            made: dict[tuple[int, int, float], tuple[list[Setup], list[dict[str, Any]]]]
            ) -> tuple[list[Setup], list[dict[str, Any]]]:
    """The pipeline setups of ``p`` stages × ``dp`` planned with ``constant`` MB per device and
    the rows of those that cannot be built, once per (p, dp, constant) in ``made``."""
    key = (p, dp, constant)
    if key not in made:
        rows: list[dict[str, Any]] = []
        made[key] = (enumerate_setups(
            devices=p * dp, global_batch=request.global_batch, micro_batch_size=request.micro_batch_size,
            schedules=request.schedules, stages=[p], chunks=request.chunks, memory_budget=budget,
            constant_memory=constant, comm=request.comm, recompute=request.recompute,
            max_chunks=request.max_chunks, invalid=rows), rows)
    return made[key]


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
