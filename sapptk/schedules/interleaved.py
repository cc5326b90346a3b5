"""Interleaved 1F1B (Megatron's virtual pipeline) and its less-memory variant.

Virtual stage ``c·p + s`` lives on device ``s``. Micro-batches go in groups through all
chunks in turn: a device runs the forwards of a group on chunk 0, then on chunk 1, and so
on; backwards take the same groups with the chunks reversed.

When m is not a multiple of p, the first group takes the remainder (it holds
p + m mod p micro-batches, every later group p). The warm-up counts forwards across the
first group's chunks, so the remainder raises the warm-up and the peak: for p = 4,
m = 6, v = 2 device 0 runs all 12 forwards before its first backward. (Megatron-LM's
newer ``microbatch_group_size_per_vp_stage`` tables put the remainder in a last, smaller
group instead; this module puts it in the first.)
"""

from __future__ import annotations

import numpy as np

from sapptk.schedules.basic import one_f_one_b, place
from sapptk.schedules.ops import B_CODE, F_CODE
from sapptk.schedules.program import Program, program_from_arrays


def micro_batch_groups(stages: int, micro_batches: int) -> list[range]:
    """Groups of micro-batches: the first of p + (m mod p), the rest of p."""
    first = stages + micro_batches % stages if micro_batches >= stages else micro_batches
    groups = [range(0, first)]
    groups += [range(a, a + stages) for a in range(first, micro_batches, stages)]
    return groups


def _tables(stages: int, chunks: int, micro_batches: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The forward and backward sequences every device follows: (micro-batch, forward chunk,
    backward chunk), each of length v·m: per group, the group's micro-batches on chunk 0, 1, …
    (forwards) and on chunk v − 1, v − 2, … (backwards)."""
    mb, chunk = [], []
    for group in micro_batch_groups(stages, micro_batches):
        ids = np.arange(group.start, group.stop, dtype=np.int64)
        for c in range(chunks):
            mb.append(ids)
            chunk.append(np.full(len(ids), c, dtype=np.int64))
    mbs, fwd_chunk = np.concatenate(mb), np.concatenate(chunk)
    return mbs, fwd_chunk, chunks - 1 - fwd_chunk


def _build(name: str, stages: int, micro_batches: int, chunks: int, less_memory: bool) -> Program:
    p, v = stages, chunks
    first_group = len(micro_batch_groups(stages, micro_batches)[0])
    s = np.arange(p, dtype=np.int64)
    # with one chunk both variants are plain 1F1B (Megatron's non-interleaved path)
    tail = p - s - 1 if less_memory or v == 1 else 2 * (p - s - 1)
    mb, fwd_chunk, bwd_chunk = _tables(p, v, micro_batches)
    n = len(mb)
    pos_f, pos_b = one_f_one_b(n, (v - 1) * first_group + tail)
    shape = (p, n)
    mbs = np.broadcast_to(mb, shape)
    return program_from_arrays(
        name, stages=p, micro_batches=micro_batches, chunks=v, splits=1,
        placement=[vs % p for vs in range(p * v)],
        kind=place(pos_f, pos_b, np.full(shape, F_CODE), np.full(shape, B_CODE)),
        micro_batch=place(pos_f, pos_b, mbs, mbs),
        virtual_stage=place(pos_f, pos_b, fwd_chunk * p + s[:, None], bwd_chunk * p + s[:, None]),
    )


def build_interleaved(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """Megatron interleaved 1F1B: warm-up (v − 1)·g + 2(p − s − 1), g the first group."""
    return _build("interleaved", stages, micro_batches, chunks, less_memory=False)


def build_interleaved_lm(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """Less-memory interleaved 1F1B: warm-up (v − 1)·g + p − s − 1, g the first group.

    At the peak device s holds p − s micro-batches on its last chunk and g on the others.
    """
    return _build("interleaved-lm", stages, micro_batches, chunks, less_memory=True)
