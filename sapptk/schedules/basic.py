"""GPipe, 1F1B and Seq1F1B: one virtual stage per device, placed in a line."""

from __future__ import annotations

from sapptk.schedules.program import Op, Program, make_program


def _one_f_one_b(forwards: list[Op], backwards: list[Op], warmup: int) -> list[Op]:
    """``warmup`` forwards, then forward/backward pairs, then the remaining backwards."""
    warmup = min(warmup, len(forwards))
    order = forwards[:warmup]
    steady = len(forwards) - warmup
    for i in range(steady):
        order.append(forwards[warmup + i])
        order.append(backwards[i])
    order.extend(backwards[steady:])
    return order


def build_gpipe(stages: int, micro_batches: int, chunks: int = 1, splits: int = 1) -> Program:
    """GPipe: every device runs all forwards, then all backwards, in micro-batch order."""
    devices = []
    for s in range(stages):
        devices.append(
            [Op("F", i, s) for i in range(micro_batches)] + [Op("B", i, s) for i in range(micro_batches)]
        )
    return make_program(
        "gpipe", stages=stages, micro_batches=micro_batches, chunks=1, splits=1,
        placement=range(stages), device_units=devices,
    )


def build_1f1b(stages: int, micro_batches: int, chunks: int = 1, splits: int = 1) -> Program:
    """1F1B (PipeDream-flush): stage s runs p − s − 1 warm-up forwards, then alternates."""
    devices = []
    for s in range(stages):
        fwd = [Op("F", i, s) for i in range(micro_batches)]
        bwd = [Op("B", i, s) for i in range(micro_batches)]
        devices.append(_one_f_one_b(fwd, bwd, stages - s - 1))
    return make_program(
        "1f1b", stages=stages, micro_batches=micro_batches, chunks=1, splits=1,
        placement=range(stages), device_units=devices,
    )


def build_seq1f1b(stages: int, micro_batches: int, chunks: int = 1, splits: int = 1) -> Program:
    """Seq1F1B: each micro-batch flows as ``splits`` sequence slices.

    Forwards run slices in order, backwards in reverse (causal attention); stage s runs
    p − s + k − 2 warm-up slice forwards, so it keeps p − s + k − 1 slices in flight.
    """
    k = splits
    devices = []
    for s in range(stages):
        fwd = [Op("F", i, s, j) for i in range(micro_batches) for j in range(k)]
        bwd = [Op("B", i, s, j) for i in range(micro_batches) for j in reversed(range(k))]
        devices.append(_one_f_one_b(fwd, bwd, stages - s - 1 + k - 1))
    return make_program(
        "seq1f1b", stages=stages, micro_batches=micro_batches, chunks=1, splits=k,
        placement=range(stages), device_units=devices,
    )
