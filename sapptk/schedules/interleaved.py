"""Interleaved 1F1B (Megatron's virtual pipeline), its less-memory variant, and the
interleaved zero-bubble schedule (PyTorch's ``ScheduleInterleavedZeroBubble``).

Virtual stage ``c·p + s`` lives on device ``s``. Micro-batches go in groups ("rounds")
through all chunks in turn: a device runs the forwards of a group on chunk 0, then on chunk
1, and so on; backwards take the same groups with the chunks reversed. The warm-up counts
forwards across the first group's chunks, so the first group's size sets the warm-up and
the peak.

How micro-batches are grouped when m is not a multiple of p is the one thing the runtimes
disagree on; :func:`micro_batch_groups` is the single place that decides it, by rule:

``"equal"`` (default; PyTorch)
    ``r = max(1, m // p)`` rounds of equal size, as PyTorch's ``ScheduleInterleaved1F1B``
    (p = 4, m = 10: 5 + 5). Where PyTorch refuses (r does not divide m) the rounds differ by
    one micro-batch, larger rounds first (p = 4, m = 11: 6 + 5); smaller rounds first would
    deadlock.
``"remainder-first"``
    the first group takes p + (m mod p), every later group p (p = 4, m = 10: 6 + 4). With
    equal stage costs never faster than equal rounds, and its peak is higher (p = 4, m = 10,
    v = 2: 13 live chunk activations on device 0 against 12); with unequal stage costs it
    can be faster (tests/test_conformance.py has a case).
``"megatron"``
    Megatron-LM's ``microbatch_group_size_per_vp_stage`` table: groups of g, the remainder a
    last, smaller group that Megatron requires to be 0 or at least p. g is the smallest
    group size Megatron accepts for (p, m): p itself when p divides m (then the rule equals
    the other two), else the least g > p with m mod g = 0 or m mod g >= p (p = 4, m = 11:
    g = 6, groups 6 + 5; p = 4, m = 13: g = 7, groups 7 + 6).
"""

from __future__ import annotations

import numpy as np

from sapptk.errors import ScheduleError
from sapptk.schedules.basic import one_f_one_b, place
from sapptk.schedules.ops import B_CODE, F_CODE, Op
from sapptk.schedules.program import Program, make_program, program_from_arrays

GROUPING_RULES: tuple[str, ...] = ("equal", "remainder-first", "megatron")
"""The micro-batch grouping rules of :func:`micro_batch_groups`."""


def megatron_group_size(stages: int, micro_batches: int) -> int:
    """The smallest ``microbatch_group_size_per_vp_stage`` Megatron-LM accepts for (p, m).

    Megatron needs p <= g <= m and ``m mod g`` either 0 or at least p; g = m always qualifies.
    """
    p, m = stages, micro_batches
    if m <= p:
        return m
    return next(g for g in range(p, m + 1) if m % g == 0 or m % g >= p)


def micro_batch_groups(stages: int, micro_batches: int, rule: str = "equal") -> list[range]:
    """The micro-batch groups of an interleaved schedule, in run order (see the module docstring)."""
    p, m = stages, micro_batches
    if rule == "equal":
        rounds = max(1, m // p)
        size, larger = divmod(m, rounds)
        sizes = [size + 1] * larger + [size] * (rounds - larger)
    elif rule == "remainder-first":
        first = p + m % p if m >= p else m
        sizes = [first] + [p] * ((m - first) // p)
    elif rule == "megatron":
        g = megatron_group_size(p, m)
        sizes = [g] * (m // g) + ([m % g] if m % g else [])
    else:
        raise ScheduleError(f"grouping rule {rule!r}: expected one of {', '.join(GROUPING_RULES)}")
    starts = [0]
    for size in sizes:
        starts.append(starts[-1] + size)
    return [range(a, b) for a, b in zip(starts[:-1], starts[1:], strict=True)]


def _tables(stages: int, chunks: int, micro_batches: int,
            rule: str = "equal") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The forward and backward sequences every device follows: (micro-batch, forward chunk,
    backward chunk), each of length v·m: per group, the group's micro-batches on chunk 0, 1, …
    (forwards) and on chunk v − 1, v − 2, … (backwards)."""
    mb, chunk = [], []
    for group in micro_batch_groups(stages, micro_batches, rule):
        ids = np.arange(group.start, group.stop, dtype=np.int64)
        for c in range(chunks):
            mb.append(ids)
            chunk.append(np.full(len(ids), c, dtype=np.int64))
    mbs, fwd_chunk = np.concatenate(mb), np.concatenate(chunk)
    return mbs, fwd_chunk, chunks - 1 - fwd_chunk


def _build(name: str, stages: int, micro_batches: int, chunks: int, less_memory: bool,
           rule: str = "equal") -> Program:
    p, v = stages, chunks
    first_group = len(micro_batch_groups(stages, micro_batches, rule)[0])
    s = np.arange(p, dtype=np.int64)
    # with one chunk both variants are plain 1F1B (Megatron's non-interleaved path)
    tail = p - s - 1 if less_memory or v == 1 else 2 * (p - s - 1)
    mb, fwd_chunk, bwd_chunk = _tables(p, v, micro_batches, rule)
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
    """Interleaved 1F1B in equal rounds (PyTorch): warm-up (v − 1)·g + 2(p − s − 1), g the first round."""
    return _build("interleaved", stages, micro_batches, chunks, less_memory=False)


def build_interleaved_rf(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """Interleaved 1F1B with the remainder in the first group (g = p + m mod p)."""
    return _build("interleaved-rf", stages, micro_batches, chunks, less_memory=False, rule="remainder-first")


def build_interleaved_megatron(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """Interleaved 1F1B grouped as Megatron-LM's ``microbatch_group_size_per_vp_stage`` table."""
    return _build("interleaved-megatron", stages, micro_batches, chunks, less_memory=False, rule="megatron")


def build_interleaved_lm(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """Less-memory interleaved 1F1B in equal rounds: warm-up (v − 1)·g + p − s − 1, g the first round.

    At the peak device s holds p − s micro-batches on its last chunk and g on the others.
    """
    return _build("interleaved-lm", stages, micro_batches, chunks, less_memory=True)


def build_interleaved_lm_rf(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """Less-memory interleaved 1F1B with the remainder in the first group."""
    return _build("interleaved-lm-rf", stages, micro_batches, chunks, less_memory=True, rule="remainder-first")


def build_interleaved_zb(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """Interleaved zero bubble (PyTorch's ``ScheduleInterleavedZeroBubble``, the paper's ZB-1P on chunks).

    The less-memory warm-up (v − 1)·g + p − s − 1 in equal rounds, then one forward and one
    input-gradient backward ``I`` at a time; the ``W`` of a backward runs s backwards later
    on device s, and the ``W`` still pending close the step. With one chunk this is
    ``zb-h1`` op for op.
    """
    p, m, v = stages, micro_batches, chunks
    first_group = len(micro_batch_groups(p, m)[0])
    devices = []
    mb, fwd_chunk, bwd_chunk = (t.tolist() for t in _tables(p, v, m))
    for s in range(p):
        fwd = [Op("F", i, c * p + s) for i, c in zip(mb, fwd_chunk, strict=True)]
        bwd = [Op("I", i, c * p + s) for i, c in zip(mb, bwd_chunk, strict=True)]
        warmup = min((v - 1) * first_group + p - s - 1, len(fwd))
        order = fwd[:warmup]
        for j, back in enumerate(bwd):  # steady state (a forward first while any is left), then cool-down
            if warmup + j < len(fwd):
                order.append(fwd[warmup + j])
            order.append(back)
            if j >= s:  # W lags its I by s backwards
                order.append(Op("W", *bwd[j - s][1:]))
        order.extend(Op("W", *back[1:]) for back in bwd[max(0, len(bwd) - s):])
        devices.append(order)
    return make_program(
        "interleaved-zb", stages=p, micro_batches=m, chunks=v, splits=1,
        placement=[vs % p for vs in range(p * v)], device_units=devices,
    )
