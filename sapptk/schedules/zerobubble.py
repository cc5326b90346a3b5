"""Zero-bubble schedules (Qi et al.): ZB-H1 on a line of stages, ZB-V on a V.

Both split every backward into ``I`` (input gradient, on the critical path) and ``W``
(weight gradient, free to move), and use the ``W`` ops to fill what would be bubbles.

ZB-H1 ("Zero Bubble Pipeline Parallelism", 2024) is 1F1B with the ``W`` of stage ``s``
running ``s`` micro-batches behind its ``I``: warm-up p − s − 1 forwards, then
``F``, ``I`` and (once ``s`` backwards are done) the oldest pending ``W``; the ``s``
left-over ``W`` close the step, where 1F1B's last stages sit idle. With uniform stages
and no communication the step lasts m(F + B + W) + (p − 1)(F + B − W) (B the
input-gradient time) whenever m ≥ p and W ≤ min(F, B).

ZB-V ("Pipeline Parallelism with Controllable Memory", 2024) places two chunks per
device in a V, like DualPipeV, and keeps every device's live activations within 1F1B's
peak: p micro-batches of a 1/p model slice, i.e. ``2p`` chunk activations. Its op order
is the result of a deterministic list schedule over unit costs (F = B = W = 1, no
communication) — the setting the published ZB-V is built for — so it never depends on
the real costs. At each time step a free device runs the first ready op of::

    F of chunk 1 > I of chunk 1 > F of chunk 0 > I of chunk 0 > oldest pending W

where an ``F`` is ready only if the memory stays within ``2p`` chunk activations
(a chunk-0 ``F`` also keeps one slot free for the chunk-1 ``F`` its micro-batch will
need, so the device cannot fill up with micro-batches it cannot finish). Memory is
counted as the simulator does with ``weight_holds = ZBV_WEIGHT_HOLDS`` (an ``I`` frees
half the activation, its ``W`` the rest). Like sail-sg's ``v_schedule`` greedy, the
V's second leg goes first and the ``W`` are fillers; the memory cap sets the warm-up
depth. For F = B = W and m ≥ p the result has the least possible step time,
6m·F + (p − 1)·F: every device works without a gap once the first forward reaches the
last device.
"""

from __future__ import annotations

from collections import deque

from sapptk.errors import ScheduleError
from sapptk.schedules.dualpipe import v_placement
from sapptk.schedules.program import Op, Program, make_program

ZBV_WEIGHT_HOLDS = 0.5
"""Fraction of an activation a ``W`` still needs after its ``I``, as assumed by the ZB-V
order's memory cap (the simulator's default ``WEIGHT_HOLDS``)."""


# ----------------------------------------------------------------------- ZB-H1
def build_zb_h1(stages: int, micro_batches: int, chunks: int = 1, splits: int = 1) -> Program:
    """ZB-H1: 1F1B with split backwards; stage s runs each ``W`` s micro-batches late."""
    p, m = stages, micro_batches
    devices = []
    for s in range(p):
        warmup = min(p - s - 1, m)
        order = [Op("F", i, s) for i in range(warmup)]  # warm-up, as 1F1B
        pending: deque[Op] = deque()
        for j in range(m):  # steady state, then cool-down (no forwards left)
            if warmup + j < m:
                order.append(Op("F", warmup + j, s))
            order.append(Op("I", j, s))
            pending.append(Op("W", j, s))
            if j >= s:  # W lags its I by s micro-batches
                order.append(pending.popleft())
        order.extend(pending)  # the deferred W fill the cool-down tail
        devices.append(order)
    return make_program(
        "zb-h1", stages=p, micro_batches=m, chunks=1, splits=1,
        placement=range(p), device_units=devices,
    )


# ------------------------------------------------------------------------ ZB-V
class _VDevice:
    """One device of the ZB-V list schedule: counters, live memory, pending W."""

    def __init__(self, device: int, stages: int) -> None:
        self.stage = (device, 2 * stages - 1 - device)  # virtual stage of chunk 0, chunk 1
        self.next_f = [0, 0]
        self.next_i = [0, 0]
        self.live = 0.0
        self.pending: deque[Op] = deque()
        self.ops: list[Op] = []


def build_zb_v(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """ZB-V: V placement, split backwards, memory capped at 1F1B's; see the module docstring."""
    if chunks != 2 or splits != 1:
        raise ScheduleError(f"zb-v: chunks = {chunks}, splits = {splits}: needs chunks = 2, splits = 1")
    p, m = stages, micro_batches
    last = 2 * p - 1
    cap = 2 * p  # 1F1B's peak, in chunk activations
    wh = ZBV_WEIGHT_HOLDS
    end: dict[Op, int] = {}  # finish time of every F and I placed so far
    devs = [_VDevice(d, p) for d in range(p)]
    remaining = 6 * p * m
    t = 0

    def done(op: Op) -> bool:
        return end.get(op, t + 1) <= t

    def pick(dev: _VDevice) -> Op | None:
        for kind, c in (("F", 1), ("I", 1), ("F", 0), ("I", 0)):
            vs = dev.stage[c]
            if kind == "F":
                k = dev.next_f[c]
                room = dev.live + 1 + (1 if c == 0 else 0) <= cap + 1e-9
                if k < m and room and (vs == 0 or done(Op("F", k, vs - 1))):
                    return Op("F", k, vs)
            else:
                k = dev.next_i[c]
                if k < dev.next_f[c] and done(Op("F", k, vs) if vs == last else Op("I", k, vs + 1)):
                    return Op("I", k, vs)
        return dev.pending[0] if dev.pending else None

    while remaining:
        placed = []
        for dev in devs:  # every device is free at t (unit costs); choices see ops ended by t
            op = pick(dev)
            if op is None:
                continue
            c = 0 if op.virtual_stage == dev.stage[0] else 1
            if op.kind == "F":
                dev.next_f[c] += 1
                dev.live += 1
            elif op.kind == "I":
                dev.next_i[c] += 1
                dev.live -= 1 - wh
                dev.pending.append(Op("W", op.micro_batch, op.virtual_stage))
            else:
                dev.pending.popleft()
                dev.live -= wh
            dev.ops.append(op)
            placed.append(op)
        if not placed:  # pragma: no cover - the chunk-1 reserve rules this out
            raise ScheduleError(f"zb-v: list schedule stuck at t = {t} (p={p}, m={m})")
        for op in placed:
            end[op] = t + 1
        remaining -= len(placed)
        t += 1
    return make_program(
        "zb-v", stages=p, micro_batches=m, chunks=2, splits=1,
        placement=v_placement(p), device_units=[dev.ops for dev in devs],
    )
