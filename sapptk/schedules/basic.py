"""GPipe, 1F1B and Seq1F1B: one virtual stage per device, placed in a line.

Built as arrays (one row per device): each device has a sequence of forwards and one of
backwards, and :func:`one_f_one_b` says where each lands in the device's order.
"""

from __future__ import annotations

import numpy as np

from sapptk.schedules.ops import B_CODE, F_CODE
from sapptk.schedules.program import Program, program_from_arrays


def one_f_one_b(n: int, warmup: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions of forwards and backwards in a 1F1B order, one row per device.

    Each device runs ``warmup[d]`` forwards (at most ``n``), then forward/backward pairs,
    then the remaining backwards. Returns ``(pos_f, pos_b)``, each of shape ``(devices, n)``:
    where the device's j-th forward and j-th backward go among its ``2n`` ops.
    """
    w = np.minimum(np.asarray(warmup, dtype=np.int64), n)[:, None]
    j = np.arange(n, dtype=np.int64)[None, :]
    pos_f = np.where(j < w, j, 2 * j - w)  # after the warm-up, every other slot
    pos_b = np.where(j < n - w, w + 2 * j + 1, n + j)  # between the steady forwards, then the tail
    return pos_f, pos_b


def place(pos_f: np.ndarray, pos_b: np.ndarray, forward: np.ndarray, backward: np.ndarray) -> np.ndarray:
    """One field of every op in run order: ``forward[d, j]`` at ``pos_f[d, j]``, ``backward`` likewise."""
    rows = np.arange(len(pos_f))[:, None]
    out = np.empty((len(pos_f), 2 * pos_f.shape[1]), dtype=np.int64)
    out[rows, pos_f] = forward
    out[rows, pos_b] = backward
    return out


def _line(name: str, stages: int, micro_batches: int, splits: int, warmup: np.ndarray) -> Program:
    """A one-chunk line schedule: micro-batches in order, slices forwards in order and backwards reversed."""
    p, m, k = stages, micro_batches, splits
    n = m * k
    pos_f, pos_b = one_f_one_b(n, warmup)
    mb = np.repeat(np.arange(m, dtype=np.int64), k)
    sl_f = np.tile(np.arange(k, dtype=np.int64), m)
    sl_b = np.tile(np.arange(k - 1, -1, -1, dtype=np.int64), m)
    shape = (p, n)
    stage = np.broadcast_to(np.arange(p, dtype=np.int64)[:, None], shape)
    return program_from_arrays(
        name, stages=p, micro_batches=m, chunks=1, splits=k, placement=range(p),
        kind=place(pos_f, pos_b, np.full(shape, F_CODE), np.full(shape, B_CODE)),
        micro_batch=place(pos_f, pos_b, np.broadcast_to(mb, shape), np.broadcast_to(mb, shape)),
        virtual_stage=place(pos_f, pos_b, stage, stage),
        slice=place(pos_f, pos_b, np.broadcast_to(sl_f, shape), np.broadcast_to(sl_b, shape)),
    )


def build_gpipe(stages: int, micro_batches: int, chunks: int = 1, splits: int = 1) -> Program:
    """GPipe: every device runs all forwards, then all backwards, in micro-batch order."""
    return _line("gpipe", stages, micro_batches, 1, np.full(stages, micro_batches))


def build_1f1b(stages: int, micro_batches: int, chunks: int = 1, splits: int = 1) -> Program:
    """1F1B (PipeDream-flush): stage s runs p − s − 1 warm-up forwards, then alternates."""
    return _line("1f1b", stages, micro_batches, 1, stages - 1 - np.arange(stages))


def build_seq1f1b(stages: int, micro_batches: int, chunks: int = 1, splits: int = 1) -> Program:
    """Seq1F1B: each micro-batch flows as ``splits`` sequence slices.

    Forwards run slices in order, backwards in reverse (causal attention); stage s runs
    p − s + k − 2 warm-up slice forwards, so it keeps p − s + k − 1 slices in flight.
    """
    return _line("seq1f1b", stages, micro_batches, splits, stages - 1 - np.arange(stages) + splits - 1)
