"""Interleaved 1F1B (Megatron's virtual pipeline) and its less-memory variant.

Virtual stage ``c·p + s`` lives on device ``s``. Micro-batches go in groups through all
chunks in turn: a device runs the forwards of a group on chunk 0, then on chunk 1, and so
on; backwards take the same groups with the chunks reversed.

When m is not a multiple of p, the first group takes the remainder (it holds
p + m mod p micro-batches, every later group p). The warm-up counts forwards across the
first group's chunks, so the remainder raises the warm-up and the peak: for p = 4,
m = 6, v = 2 device 0 runs all 12 forwards before its first backward. (Megatron-LM's
newer ``microbatch_group_size_per_vp_stage`` tables put the remainder in a last, smaller
group instead; this module models the grouping described in domain.md §4.)
"""

from __future__ import annotations

from sapptk.schedules.basic import _one_f_one_b
from sapptk.schedules.program import Op, Program, make_program


def micro_batch_groups(stages: int, micro_batches: int) -> list[range]:
    """Groups of micro-batches: the first of p + (m mod p), the rest of p."""
    first = stages + micro_batches % stages if micro_batches >= stages else micro_batches
    groups = [range(0, first)]
    groups += [range(a, a + stages) for a in range(first, micro_batches, stages)]
    return groups


def _tables(stage: int, stages: int, chunks: int, micro_batches: int) -> tuple[list[Op], list[Op]]:
    fwd: list[Op] = []
    bwd: list[Op] = []
    for group in micro_batch_groups(stages, micro_batches):
        for c in range(chunks):
            fwd.extend(Op("F", i, c * stages + stage) for i in group)
            rc = chunks - 1 - c
            bwd.extend(Op("B", i, rc * stages + stage) for i in group)
    return fwd, bwd


def _build(name: str, stages: int, micro_batches: int, chunks: int, less_memory: bool) -> Program:
    first_group = len(micro_batch_groups(stages, micro_batches)[0])
    devices = []
    for s in range(stages):
        fwd, bwd = _tables(s, stages, chunks, micro_batches)
        # with one chunk both variants are plain 1F1B (Megatron's non-interleaved path)
        tail = stages - s - 1 if less_memory or chunks == 1 else 2 * (stages - s - 1)
        devices.append(_one_f_one_b(fwd, bwd, (chunks - 1) * first_group + tail))
    placement = [vs % stages for vs in range(stages * chunks)]
    return make_program(
        name, stages=stages, micro_batches=micro_batches, chunks=chunks, splits=1,
        placement=placement, device_units=devices,
    )


def build_interleaved(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """Megatron interleaved 1F1B: warm-up (v − 1)·g + 2(p − s − 1), g the first group."""
    return _build("interleaved", stages, micro_batches, chunks, less_memory=False)


def build_interleaved_lm(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """Less-memory interleaved 1F1B: warm-up (v − 1)·g + p − s − 1, g the first group.

    At the peak device s holds p − s micro-batches on its last chunk and g on the others.
    """
    return _build("interleaved-lm", stages, micro_batches, chunks, less_memory=True)
