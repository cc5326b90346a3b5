"""DualPipeV: DeepSeek's DualPipe folded into a V on p devices (two chunks per device).

Placement ("v"): virtual stage ``s`` (chunk 0, phase 0) and virtual stage ``2p − 1 − s``
(chunk 1, phase 1) both live on device ``s``, so device 0 holds the model's first and last
virtual stages. A micro-batch runs devices 0 → p−1 on phase 0, then p−1 → 0 on phase 1;
its backward runs the same path in reverse.

The per-device order follows ``DualPipeV.step`` of DeepSeek's DualPipe repository
(``dualpipe/dualpipev.py``) phase by phase; rank ``r`` runs eight steps::

    1  nF0       2(p − r − 1)   forwards of phase 0
    2  nF0F1     r + 1          a phase-0 then a phase-1 forward
    3  nB1W1F1   p − r − 1      zero-bubble phase-1 backward (I), a W, a phase-1 forward
    4  nF0B1F1B0 m − 2p + r + 1 overlapped pairs F0&B1, F1&B0 (the last rank runs its
                                first F0 and B1 one after the other, not overlapped)
    5  nB1F1B0   p − r − 1      a phase-1 backward, then the pair F1&B0
    6  nB1B0     r + 1          phase-1 and phase-0 backwards; the second half split (I)
    7  nWB0      p − r − 1      a W, then a zero-bubble phase-0 backward (I)
    8  nW        r + 1          the remaining Ws

Every phase's forwards and backwards take micro-batches in order (the source's per-phase
chunk counters). An overlapped pair (``_forward_backward_chunk``) is one unit of two ops,
its backward a full ``B``. A backward run with zero bubble enabled becomes an ``I`` whose
``W`` is queued; each "W" step pops the oldest queued one (``WeightGradStore``: FIFO).

Every device peaks at 2p + 1 live chunk activations (DeepSeek's "PP + 1", PP = 2p): 2p
after step 2, plus the forward of the first overlapped pair. With uniform costs and no
communication the largest per-device idle time equals DeepSeek's bubble
(p − 1)(F&B + B_full − 3W) exactly when the forward and input-gradient times are equal
and W does not exceed them (tests/test_schedules_zb_dualpipe.py).
"""

from __future__ import annotations

from collections import deque

from sapptk.errors import ScheduleError
from sapptk.schedules.program import Op, Program, Unit, make_program


def v_placement(stages: int) -> list[int]:
    """Device of each of the 2p virtual stages of a V: 0, 1, …, p−1, p−1, …, 1, 0."""
    return list(range(stages)) + list(reversed(range(stages)))


class _Rank:
    """One device's op list under construction, with DualPipeV's per-phase counters."""

    def __init__(self, rank: int, stages: int) -> None:
        self.stage = (rank, 2 * stages - 1 - rank)  # virtual stage of phase 0 and phase 1
        self.next_f = [0, 0]
        self.next_b = [0, 0]
        self.weights: deque[Op] = deque()  # WeightGradStore's queue of pending W
        self.units: list[Unit] = []

    def _f(self, phase: int) -> Op:
        op = Op("F", self.next_f[phase], self.stage[phase])
        self.next_f[phase] += 1
        return op

    def _b(self, phase: int, zero_bubble: bool) -> Op:
        mb, vs = self.next_b[phase], self.stage[phase]
        self.next_b[phase] += 1
        if zero_bubble:
            self.weights.append(Op("W", mb, vs))
            return Op("I", mb, vs)
        return Op("B", mb, vs)

    def forward(self, phase: int) -> None:
        self.units.append((self._f(phase),))

    def backward(self, phase: int, zero_bubble: bool = False) -> None:
        self.units.append((self._b(phase, zero_bubble),))

    def weight(self) -> None:
        self.units.append((self.weights.popleft(),))

    def forward_backward(self, phase0: int, phase1: int) -> None:
        """Forward of ``phase0`` overlapped with a full backward of ``phase1``: one unit."""
        self.units.append((self._f(phase0), self._b(phase1, zero_bubble=False)))


def _rank_units(rank: int, stages: int, micro_batches: int) -> list[Unit]:
    """DualPipeV's eight steps for one rank (see the module docstring)."""
    p, r, m = stages, rank, micro_batches
    dev = _Rank(r, p)
    last_rank = r == p - 1

    # step 1: nF0
    for _ in range(2 * (p - r - 1)):
        dev.forward(0)
    # step 2: nF0F1
    for _ in range(r + 1):
        dev.forward(0)
        dev.forward(1)
    # step 3: nB1W1F1, zero bubble
    for _ in range(p - r - 1):
        dev.backward(1, zero_bubble=True)
        dev.weight()
        dev.forward(1)
    # step 4 (main): nF0B1F1B0
    for i in range(m - 2 * p + r + 1):
        if i == 0 and last_rank:
            dev.forward(0)  # not overlapped, to shrink the bubble (as in the source)
            dev.backward(1)
        else:
            dev.forward_backward(0, 1)
        dev.forward_backward(1, 0)
    # step 5: nB1F1B0
    for _ in range(p - r - 1):
        dev.backward(1)
        dev.forward_backward(1, 0)
    # step 6: nB1B0, the second half with zero bubble
    half = (r + 1) // 2
    zero_bubble = False
    for i in range(r + 1):
        if i == half and r % 2 == 1:
            zero_bubble = True
        dev.backward(1, zero_bubble)
        if i == half and r % 2 == 0:
            zero_bubble = True
        dev.backward(0, zero_bubble)
    # step 7: nWB0, zero bubble
    for _ in range(p - r - 1):
        dev.weight()
        dev.backward(0, zero_bubble=True)
    # step 8: nW
    for _ in range(r + 1):
        dev.weight()
    if dev.weights or dev.next_f != [m, m] or dev.next_b != [m, m]:  # pragma: no cover - construction invariant
        raise ScheduleError(f"dualpipe-v: rank {r} left ops unscheduled (p={p}, m={m})")
    return dev.units


def build_dualpipe_v(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """DualPipeV (DeepSeek): V placement, overlapped F&B pairs, zero-bubble tails; m ≥ 2p."""
    if chunks != 2 or splits != 1:
        raise ScheduleError(f"dualpipe-v: chunks = {chunks}, splits = {splits}: needs chunks = 2, splits = 1")
    if micro_batches < 2 * stages:
        raise ScheduleError(
            f"dualpipe-v: micro_batches = {micro_batches} with stages = {stages}: needs m >= 2p"
            f" (at least {2 * stages})"
        )
    devices = [_rank_units(r, stages, micro_batches) for r in range(stages)]
    return make_program(
        "dualpipe-v", stages=stages, micro_batches=micro_batches, chunks=2, splits=1,
        placement=v_placement(stages), device_units=devices,
    )
