"""Sequence slices with chunks (``seq-interleaved``, ``seq-interleaved-lm``): the closed forms
of docs/schedules.md, the reference tool's activation counts, and bad arguments."""

from __future__ import annotations

import numpy as np
import pytest

from sapptk.errors import ScheduleError
from sapptk.schedules import build
from sapptk.schedules.seq import build_seq_interleaved, build_seq_interleaved_lm, seq_groups, seq_warmup
from sapptk.simulation import simulate

NAMES = ("seq-interleaved", "seq-interleaved-lm")


def cases(small: bool):
    ps = (2, 4) if small else (2, 3, 4, 8)
    for p in ps:
        for v in (1, 2, 3):
            for k in (1, 2, 3, 4):
                for m in sorted({p, p + 1, 2 * p} | ({-(-p // k)} if v == 1 else set())):
                    yield p, v, k, m


def first_group_slices(p: int, m: int, k: int) -> int:
    return len(seq_groups(p, m, k)[0]) * k


def check_closed_forms(name: str, p: int, v: int, k: int, m: int) -> None:
    program = build(name, stages=p, micro_batches=m, chunks=v, splits=k)
    ops = program.ops
    assert len(ops) == 2 * m * k * v * p and not ops.duplicated(["kind", "micro_batch", "virtual_stage", "slice"]).any()
    # step at equal costs, no comm: the pipeline of v·m·k slice units of (F + B)/k, plus the fill
    sim = simulate(program, forward=1.0, backward=2.0)
    assert sim.step_time == pytest.approx((v * m * k + p - 1) * 3.0 / k)
    # warm-up forwards, then one more forward (when one is left) before the first backward
    kinds = [[op.kind for unit in units for op in unit] for units in program.units]
    before_first_backward = [row.index("B") for row in kinds]
    g = first_group_slices(p, m, k)
    s = np.arange(p)
    tail = p - s - 1 if name.endswith("-lm") or v == 1 else 2 * (p - s - 1)
    expected = np.minimum((v - 1) * g + tail + k - 1, v * m * k)
    assert expected.tolist() == seq_warmup(p, m, v, k, less_memory=name.endswith("-lm")).tolist()
    assert before_first_backward == np.minimum(expected + 1, v * m * k).tolist()
    # peak live slices: one more than the warm-up (capped by the slices the device has)
    slices = np.round(program.peak_live() * k).astype(int)
    assert slices.tolist() == np.minimum(expected + 1, v * m * k).tolist()


@pytest.mark.parametrize("name", NAMES)
def test_closed_forms_small_grid(name: str) -> None:
    for p, v, k, m in cases(small=True):
        check_closed_forms(name, p, v, k, m)


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_closed_forms_grid(name: str) -> None:
    for p, v, k, m in cases(small=False):
        check_closed_forms(name, p, v, k, m)


@pytest.mark.parametrize("name", NAMES)
def test_one_chunk_is_seq1f1b(name: str) -> None:
    for p, m, k in ((4, 8, 2), (3, 5, 3), (2, 1, 4)):
        ours = build(name, stages=p, micro_batches=m, chunks=1, splits=k)
        seq = build("seq1f1b", stages=p, micro_batches=m, splits=k)
        assert ours.describe() == seq.describe()


def test_one_slice_is_interleaved() -> None:
    for p, m, v in ((4, 8, 2), (4, 10, 2), (3, 7, 3)):
        assert build("seq-interleaved", stages=p, micro_batches=m, chunks=v, splits=1).describe() == build(
            "interleaved", stages=p, micro_batches=m, chunks=v).describe()
        assert build("seq-interleaved-lm", stages=p, micro_batches=m, chunks=v, splits=1).describe() == build(
            "interleaved-lm", stages=p, micro_batches=m, chunks=v).describe()


def test_hand_order_p2_m2_v2_k2() -> None:
    """Groups of ⌈2/2⌉ = 1 micro-batch (2 slices): device 0 warms up (v − 1)·2 + 2(p − 1) + (k − 1) = 5
    slice forwards, runs a sixth, then alternates; backwards take slice 1 before slice 0, chunk 1 before 0."""
    program = build("seq-interleaved", stages=2, micro_batches=2, chunks=2, splits=2)
    assert program.describe().splitlines()[0] == (
        "device 0: F0@0 F0@0/1 F0@2 F0@2/1 F1@0 F1@0/1 B0@2/1 F1@2 B0@2 F1@2/1 B0@0/1 B0@0 B1@2/1 B1@2 B1@0/1 B1@0"
    )


# The reference tool's activation counts (rows = chunks, entries = stages, in slices), p = 4.
REFERENCE = [
    ("seq1f1b", 1, 2, 8, [[5, 4, 3, 2]]),
    ("seq-interleaved", 2, 2, 8, [[8, 6, 4, 4], [4, 4, 4, 2]]),
    ("seq-interleaved-lm", 2, 2, 8, [[5, 4, 4, 4], [4, 4, 3, 2]]),
    ("seq-interleaved", 2, 4, 32, [[8, 8, 6, 4], [6, 4, 4, 4]]),
    ("seq-interleaved-lm", 2, 4, 32, [[7, 6, 5, 4], [4, 4, 4, 4]]),
]


@pytest.mark.parametrize(("name", "v", "k", "m", "counts"), REFERENCE)
def test_reference_counts_are_live_points_of_the_program(name, v, k, m, counts) -> None:
    """Each reference vector is one of the program's Pareto-maximal live points with the peak
    total; the program can also hold more on an earlier chunk at the same total (docs/schedules.md)."""
    program = build(name, stages=4, micro_batches=m, chunks=v, splits=k)
    for s, rows in enumerate(program.live_points(0.5)):
        slices = np.round(rows * k).astype(int)
        reference = [counts[c][s] for c in range(v)]
        assert reference in slices.tolist()
        assert sum(reference) == slices.sum(axis=1).max()


def test_reference_vector_misses_a_heavier_point() -> None:
    """p = 4, v = 2, k = 4, m = 32: device 0 also holds 10 chunk-0 and 4 chunk-1 slices at one point,
    which the reference's single vector (8, 6) underestimates when chunk 0 keeps more per slice."""
    program = build("seq-interleaved", stages=4, micro_batches=32, chunks=2, splits=4)
    rows = np.round(program.live_points(0.5)[0] * 4).astype(int).tolist()
    assert [10, 4] in rows and [8, 6] in rows


@pytest.mark.parametrize("name", NAMES)
def test_too_few_micro_batches_for_the_chunks(name: str) -> None:
    with pytest.raises(ScheduleError, match=r"needs m >= p when v > 1"):
        build(name, stages=8, micro_batches=2, chunks=2, splits=4)
    with pytest.raises(ScheduleError, match=r"needs m·k >= p"):  # the builder itself, called directly
        build_seq_interleaved(8, 1, 2, 4)
    for p, m, k in ((8, 2, 4), (4, 1, 4), (6, 2, 4)):  # m·k >= p: the order is valid, peaks as the closed form
        program = (build_seq_interleaved if name == NAMES[0] else build_seq_interleaved_lm)(p, m, 2, k)
        program.validate()
        assert simulate(program, forward=1.0, backward=2.0).step_time == pytest.approx((2 * m * k + p - 1) * 3.0 / k)


def test_groups_hold_whole_micro_batches() -> None:
    assert [len(g) for g in seq_groups(4, 8, 2)] == [2, 2, 2, 2]
    assert [len(g) for g in seq_groups(4, 7, 3)] == [3, 2, 2]  # ⌈4/3⌉ = 2 per group, equal rounds
    assert [len(g) for g in seq_groups(4, 5, 8)] == [1] * 5
