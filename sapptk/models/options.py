"""Command-line options for an estimate (``--model``, ``--tp``, ``--gpu``, ...), shared by
``sapptk estimate`` and ``sapptk balance --model``: the options, the
:class:`~sapptk.models.Parallel` and :class:`~sapptk.models.Hardware` they name, the profile
they give and its per-group table."""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from sapptk.errors import ConfigError
from sapptk.models.bundled import available, card, hardware
from sapptk.models.cards import ModelCard
from sapptk.models.estimate import MEMORY_FIGURES, estimate_profile
from sapptk.models.frameworks import FRAMEWORKS
from sapptk.models.layout import DTYPE_BYTES, SHARDINGS, Hardware, Parallel
from sapptk.profile import MODES, Profile

__all__ = ["add_model_args", "model_card", "model_hardware", "model_parallel", "model_profile", "profile_table"]


def add_model_args(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """``--model`` and the layout and hardware options."""
    group = parser.add_argument_group("model card, layout and hardware (docs/estimation.md)")
    group.add_argument("--model", required=required, metavar="CARD",
                       help=f"a bundled card ({', '.join(available())}) or a Hugging Face config.json")
    group.add_argument("--tp", type=int, default=1, help="tensor parallel size (1)")
    group.add_argument("--cp", type=int, default=1, help="context parallel size (1)")
    group.add_argument("--ep", type=int, default=1, help="expert parallel size (1)")
    group.add_argument("--etp", type=int, default=None,
                       help="expert tensor parallel size (the framework's convention: megatron tp, else 1)")
    group.add_argument("--dp", type=int, default=1, help="data parallel size (1)")
    group.add_argument("--sharding", choices=SHARDINGS, default="distributed",
                       help="optimizer sharding over data parallelism (distributed = ZeRO-1)")
    group.add_argument("--seq-length", type=int, default=4096, help="tokens per sample (4096)")
    group.add_argument("--micro-batch-size", type=int, default=1, help="samples per micro-batch (1)")
    group.add_argument("--no-sequence-parallel", action="store_true", help="tensor parallelism without SP")
    group.add_argument("--no-flash-attention", action="store_true", help="keep the attention score matrix")
    group.add_argument("--grad-dtype", choices=tuple(DTYPE_BYTES), default="fp32", help="gradient dtype (fp32)")
    group.add_argument("--capacity-factor", type=float, default=None, help="MoE expert capacity (dropless)")
    group.add_argument("--gpu", "--hardware", dest="gpu", default="h100", metavar="NAME",
                       help=f"hardware card ({', '.join(available('hardware'))}; default h100)")
    group.add_argument("--efficiency", type=float, default=None,
                       help="a large GEMM's share of the peak (the card's matmul_efficiency)")
    group.add_argument("--framework", choices=tuple(FRAMEWORKS), default="megatron",
                       help="which overlaps and fusions the framework does (megatron)")
    group.add_argument("--fp8", action="store_true", help="linear layers' GEMMs in FP8")
    group.add_argument("--moment-dtype", choices=("fp32", "bf16"), default="fp32", help="Adam moments' dtype (fp32)")
    group.add_argument("--memory-figure", choices=MEMORY_FIGURES, default="allocated",
                       help="memory as the allocator's allocated or reserved bytes (allocated)")


def model_card(text: str) -> ModelCard:
    """A bundled card by name, or a card read from a ``config.json`` path (or its folder)."""
    path = Path(text)
    if path.suffix == ".json" or path.is_dir() or path.is_file():
        return ModelCard.from_hf(path)
    return card(text)


def model_parallel(args: argparse.Namespace) -> Parallel:
    """The layout the options name."""
    return Parallel(tp=args.tp, cp=args.cp, ep=args.ep, dp=args.dp, sharding=args.sharding,
                    seq_length=args.seq_length, micro_batch_size=args.micro_batch_size,
                    sequence_parallel=not args.no_sequence_parallel, flash_attention=not args.no_flash_attention,
                    grad_dtype=args.grad_dtype, capacity_factor=args.capacity_factor,
                    fp8=bool(getattr(args, "fp8", False)), moment_dtype=getattr(args, "moment_dtype", "fp32"),
                    etp=getattr(args, "etp", None))


def model_hardware(args: argparse.Namespace) -> Hardware:
    """The hardware card the options name, with ``--efficiency`` applied."""
    if args.efficiency is None:
        return hardware(args.gpu)
    return hardware(args.gpu, matmul_efficiency=args.efficiency)


def model_profile(args: argparse.Namespace) -> Profile:
    """The estimated profile of the options."""
    if not isinstance(args.model, str) or not args.model:
        raise ConfigError("--model: expected a bundled card name or a config.json path")
    return estimate_profile(model_card(args.model), model_parallel(args), model_hardware(args),
                            framework=getattr(args, "framework", "megatron"),
                            memory=getattr(args, "memory_figure", "allocated"))


def profile_table(profile: Profile) -> pd.DataFrame:
    """One row per group: count, forward ms, params MB, and per mode backward ms and
    activation MB (empty where the group lacks the mode)."""
    present = [m for m in MODES if any(m in g.modes for g in profile.groups)]
    columns = ["group", "kind", "count", "forward_ms", "params_mb", *(f"{m}_mb" for m in present),
               *(f"{m}_backward_ms" for m in present)]
    rows = []
    for group in profile.groups:
        row: dict[str, object] = {"group": group.name, "kind": group.kind, "count": group.count,
                                  "forward_ms": round(group.forward, 3), "params_mb": round(group.params, 1)}
        for mode in present:
            cost = group.modes.get(mode)
            row[f"{mode}_mb"] = "" if cost is None else round(cost.activation, 1)
            row[f"{mode}_backward_ms"] = "" if cost is None else round(cost.backward, 3)
        rows.append(row)
    return pd.DataFrame(rows, columns=columns)
