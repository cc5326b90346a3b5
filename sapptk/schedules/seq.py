"""Sequence slices with chunks: ``seq-interleaved`` and ``seq-interleaved-lm``.

Each micro-batch flows as k sequence slices (Seq1F1B, Sun et al. 2024) through v chunks per
device (virtual stage ``c·p + s`` on device ``s``, as the interleaved schedules). A slice is
the unit the pipeline moves: forwards run a micro-batch's slices in order (slice j attends
to slices 0..j), backwards in reverse order.

The units go in groups, as in interleaved 1F1B: a device runs the forwards of a group on
chunk 0, then chunk 1, …; backwards take the same groups with the chunks reversed. A group
holds whole micro-batches (a micro-batch's backward slices must run in reverse order, which
a group boundary inside a micro-batch would deadlock) and at least p slices (fewer would
leave device 0 waiting when the group comes back on the next chunk): g = ⌈p / k⌉
micro-batches, grouped by :func:`~sapptk.schedules.interleaved.micro_batch_groups` with g
in place of p (equal rounds, larger first, when g does not divide m).

Warm-up on device s, in slice forwards, with G the slices of the first group:

* ``seq-interleaved``: (v − 1)·G + 2(p − s − 1) + (k − 1) (with one chunk: p − s − 1 + k − 1,
  ``seq1f1b``);
* ``seq-interleaved-lm`` (less memory): (v − 1)·G + (p − s − 1) + (k − 1).

The k − 1 are the slices of the first micro-batch that must pass the last stage before its
first backward can start. ``docs/schedules.md`` gives the closed forms the tests check.
"""

from __future__ import annotations

import numpy as np

from sapptk.errors import ScheduleError
from sapptk.schedules.basic import one_f_one_b, place
from sapptk.schedules.interleaved import micro_batch_groups
from sapptk.schedules.ops import B_CODE, F_CODE
from sapptk.schedules.program import Program, program_from_arrays

__all__ = ["build_seq_interleaved", "build_seq_interleaved_lm", "seq_groups", "seq_warmup"]


def seq_groups(stages: int, micro_batches: int, splits: int) -> list[range]:
    """The micro-batch groups of a sequence-slice interleaved schedule: ⌈p / k⌉ micro-batches
    each (at least p slices), equal rounds when that does not divide m."""
    per_group = -(-stages // splits)
    return micro_batch_groups(per_group, micro_batches, "equal")


def seq_warmup(stages: int, micro_batches: int, chunks: int, splits: int, *, less_memory: bool) -> np.ndarray:
    """Warm-up slice forwards of every device (before its first backward), capped at v·m·k."""
    p, v, k = stages, chunks, splits
    first = len(seq_groups(p, micro_batches, k)[0]) * k
    s = np.arange(p, dtype=np.int64)
    tail = p - s - 1 if less_memory or v == 1 else 2 * (p - s - 1)
    return np.minimum((v - 1) * first + tail + k - 1, v * micro_batches * k)


def _tables(stages: int, micro_batches: int, chunks: int, splits: int) -> tuple[np.ndarray, ...]:
    """The forward and backward streams every device follows, each of length v·m·k:
    (micro-batch, chunk, slice) of the forwards, then of the backwards."""
    k = splits
    f_mb, f_chunk, f_slice, b_chunk, b_slice = [], [], [], [], []
    for group in seq_groups(stages, micro_batches, k):
        mbs = np.repeat(np.arange(group.start, group.stop, dtype=np.int64), k)
        ups = np.tile(np.arange(k, dtype=np.int64), len(group))
        for c in range(chunks):
            f_mb.append(mbs)
            f_chunk.append(np.full(len(mbs), c, dtype=np.int64))
            b_chunk.append(np.full(len(mbs), chunks - 1 - c, dtype=np.int64))
            f_slice.append(ups)
            b_slice.append(k - 1 - ups)
    mb = np.concatenate(f_mb)
    return mb, np.concatenate(f_chunk), np.concatenate(f_slice), np.concatenate(b_chunk), np.concatenate(b_slice)


def _build(name: str, stages: int, micro_batches: int, chunks: int, splits: int, less_memory: bool) -> Program:
    p, m, v, k = stages, micro_batches, chunks, splits
    if m * k < p and v > 1:
        raise ScheduleError(
            f"{name}: micro_batches = {m}, splits = {k} with stages = {p}: needs m·k >= p (at least "
            f"{-(-p // k)} micro-batches), or a round of slices would return to device 0 before it is free"
        )
    mb, f_chunk, f_slice, b_chunk, b_slice = _tables(p, m, v, k)
    pos_f, pos_b = one_f_one_b(len(mb), seq_warmup(p, m, v, k, less_memory=less_memory))
    shape = (p, len(mb))
    s = np.arange(p, dtype=np.int64)[:, None]
    mbs = np.broadcast_to(mb, shape)
    return program_from_arrays(
        name, stages=p, micro_batches=m, chunks=v, splits=k,
        placement=[vs % p for vs in range(p * v)],
        kind=place(pos_f, pos_b, np.full(shape, F_CODE), np.full(shape, B_CODE)),
        micro_batch=place(pos_f, pos_b, mbs, mbs),
        virtual_stage=place(pos_f, pos_b, f_chunk * p + s, b_chunk * p + s),
        slice=place(pos_f, pos_b, np.broadcast_to(f_slice, shape), np.broadcast_to(b_slice, shape)),
    )


def build_seq_interleaved(stages: int, micro_batches: int, chunks: int = 2, splits: int = 2) -> Program:
    """Sequence slices on interleaved chunks: warm-up (v − 1)·G + 2(p − s − 1) + k − 1 slice forwards."""
    return _build("seq-interleaved", stages, micro_batches, chunks, splits, less_memory=False)


def build_seq_interleaved_lm(stages: int, micro_batches: int, chunks: int = 2, splits: int = 2) -> Program:
    """Sequence slices on less-memory interleaved chunks: warm-up (v − 1)·G + (p − s − 1) + k − 1."""
    return _build("seq-interleaved-lm", stages, micro_batches, chunks, splits, less_memory=True)
