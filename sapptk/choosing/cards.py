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

from collections.abc import Mapping
from numbers import Real
from typing import Any

from sapptk.choosing.setups import Candidate, Setup, _int_list, _positive_int, enumerate_setups
from sapptk.errors import ConfigError

__all__ = ["card_candidates", "hardware_bandwidth", "is_model_card"]

_DIMENSIONS = ("tp", "cp", "ep", "zero")


def card_candidates(card: Any, hardware: Any, shape: Mapping[str, Any],
                    parallel: Mapping[str, Any]) -> tuple[list[Candidate], list[str]]:
    """The candidates of a model-card choice (see the module docstring) and the notes it adds.

    ``parallel`` restricts ``tp``, ``cp``, ``ep`` (lists of integers) and ``zero`` (sharding
    names from :data:`sapptk.models.SHARDINGS`); ``seq_length=`` sets the tokens per sample.
    Defaults: tp the powers of two up to a node that divide the heads; cp 1; ep 1 for a dense
    model, else the powers of two dividing the experts; sharding ``distributed``.
    """
    from sapptk.models import SHARDINGS, Parallel, estimate_profile
    from sapptk.models import hardware as hardware_card
    from sapptk.models.estimate import check_layout, static_bytes_per_parameter
    from sapptk.models.layout import DTYPE_BYTES

    extra = {k: v for k, v in parallel.items() if k not in (*_DIMENSIONS, "seq_length")}
    if extra:
        name = next(iter(extra))
        raise ConfigError(f"{name} = {extra[name]!r}: unknown option of choose; a model card varies "
                          f"{', '.join(_DIMENSIONS)} (and takes seq_length)")
    if hardware is None:
        raise ConfigError("hardware = None: a model card needs a hardware card (sapptk.models.hardware('h100'), "
                          "or a bundled name)")
    hw = hardware_card(hardware) if isinstance(hardware, str) else hardware
    devices = _positive_int("devices", shape["devices"])
    seq = _positive_int("seq_length", parallel.get("seq_length", 4096))
    mbs = _positive_int("micro_batch_size", shape["micro_batch_size"])
    heads = card.num_heads
    tps = _int_list("tp", parallel.get("tp")) or [t for t in (1, 2, 4, 8, 16) if t <= hw.gpus_per_node
                                                  and heads % t == 0]
    cps = _int_list("cp", parallel.get("cp")) or [1]
    experts = card.moe.experts if card.moe is not None else 1
    eps = _int_list("ep", parallel.get("ep")) or [e for e in (1, 2, 4, 8, 16, 32, 64, 128, 256) if experts % e == 0
                                                  and e <= devices]
    zeros = parallel.get("zero", ["distributed"])
    zeros = [zeros] if isinstance(zeros, str) else list(zeros)
    if not zeros:
        raise ConfigError("zero = []: an empty list allows no setup; give at least one sharding")
    for z in zeros:
        if z not in SHARDINGS:
            raise ConfigError(f"zero = {z!r}: expected one of {', '.join(SHARDINGS)}")
    budget = shape["memory_budget"]
    if budget is None:
        budget = hw.memory_mb
    constant = shape.get("constant_memory") or hw.constant_mb
    candidates: list[Candidate] = []
    reasons: list[str] = []
    for tp in tps:
        for cp in cps:
            if devices % (tp * cp):
                reasons.append(f"tp {tp} x cp {cp} does not divide devices = {devices}")
                continue
            rest = devices // (tp * cp)
            stage_list = [p for p in (shape["stages"] or range(1, rest + 1)) if rest % p == 0]
            for p in stage_list:
                dp = rest // p
                if shape["global_batch"] % (dp * mbs):
                    continue
                for ep in eps:
                    for zero in zeros:
                        try:
                            par = Parallel(tp=tp, cp=cp, ep=ep, dp=dp, sharding=zero, micro_batch_size=mbs,
                                           seq_length=seq)
                            check_layout(card, par)
                        except ConfigError as exc:
                            reasons.append(str(exc))
                            continue
                        profile = estimate_profile(card, par, hw)
                        share = DTYPE_BYTES[par.grad_dtype] / static_bytes_per_parameter(par, dp * cp)
                        share = 0.0 if zero in ("fsdp", "zero2") else share  # the profile times their per-layer RS
                        setups = enumerate_setups(
                            devices=p * dp, global_batch=shape["global_batch"], micro_batch_size=mbs,
                            schedules=shape["schedules"], stages=[p], chunks=shape["chunks"], memory_budget=budget,
                            constant_memory=constant, comm=shape["comm"], recompute=shape["recompute"],
                            max_chunks=shape["max_chunks"])
                        for s in setups:
                            candidates.append(Candidate(setup=Setup(config=s.config, dp=dp), profile=profile,
                                                        columns={"tp": tp, "cp": cp, "ep": ep, "zero": zero},
                                                        gradient_share=share))
    if not candidates:
        why = "; ".join(dict.fromkeys(reasons)) or "no combination divides the devices and the global batch"
        raise ConfigError(f"devices = {devices}, global_batch = {shape['global_batch']}: no setup of "
                          f"{card.name!r}: {why[:400]}")
    notes = [f"model card {card.name!r} on {hw.name}: budget {budget:,.0f} MB, constant {constant:,.0f} MB per "
             f"device; DP gradients over the inter-node link ({hw.inter_node_gbps:g} GB/s)"]
    return candidates, notes


def is_model_card(source: Any) -> bool:
    return type(source).__name__ == "ModelCard" and type(source).__module__.startswith("sapptk.models")


def hardware_bandwidth(hardware: Any) -> float | None:
    """The inter-node link of a hardware card (or bundled name) in MB/ms (= GB/s)."""
    if isinstance(hardware, str):
        from sapptk.models import hardware as hardware_card

        hardware = hardware_card(hardware)
    value = getattr(hardware, "inter_node_gbps", None)
    return float(value) if isinstance(value, Real) and value > 0 else None
