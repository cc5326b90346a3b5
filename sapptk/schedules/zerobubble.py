"""Zero-bubble schedules (Qi et al.): ZB-H1 on a line of stages, ZB-V on a V.

All split every backward into ``I`` (input gradient, on the critical path) and ``W``
(weight gradient, free to move), and use the ``W`` ops to fill what would be bubbles.

ZB-H1 ("Zero Bubble Pipeline Parallelism", 2024) is 1F1B with the ``W`` of stage ``s``
running ``s`` micro-batches behind its ``I``: warm-up p − s − 1 forwards, then
``F``, ``I`` and (once ``s`` backwards are done) the oldest pending ``W``; the ``s``
left-over ``W`` close the step, where 1F1B's last stages sit idle. With uniform stages
and no communication the step lasts m(F + B + W) + (p − 1)(F + B − W) (B the
input-gradient time) whenever m ≥ p and W ≤ min(F, B).

ZB-V ("Pipeline Parallelism with Controllable Memory", 2024) places two chunks per
device in a V, like DualPipeV. Two orders are offered:

``zb-v`` — PyTorch's ``ScheduleZBVZeroBubble`` op for op. Rank r runs
    1. 2(p − r) − 1 forwards of chunk 0;
    2. r pairs: a chunk-1 forward, a chunk-0 forward;
    3. p − r triples on chunk 1: forward, input gradient, weight gradient;
    4. the steady state, while forwards are left: a chunk-0 forward (if any), the chunk-0
       ``I`` and ``W``, then a chunk-1 forward with its ``I`` and ``W``;
    5. r pairs of ``I`` (chunk 0, then chunk 1), their ``W`` deferred;
    6. p − r pairs: a chunk-0 ``I``, the oldest deferred chunk-0 ``W``;
    7. the deferred chunk-1 ``W``, then the deferred chunk-0 ``W``, oldest first.
    PyTorch plans max(2p − 1, m) micro-batches and drops the ops of the ones that do not
    exist, so for m < 2p − 1 the order is the full order with those ops removed (what
    PyTorch's runtime executes). It has "zero bubble" when F = I = W.

``zb-v-greedy`` — a list schedule computed at given costs (unit costs when none are
    given, the setting the published ZB-V is built for), like sail-sg's ``v_schedule``
    greedy. A device that is free at time t runs the first ready op of::

        F of chunk 1 > I of chunk 1 > F of chunk 0 > I of chunk 0 > oldest pending W

    where an ``F`` is ready only if its inputs have arrived and the memory stays within
    ``2p`` chunk activations, 1F1B's peak (a chunk-0 ``F`` also keeps one slot free for the
    chunk-1 ``F`` its micro-batch will need, so the device cannot fill up with
    micro-batches it cannot finish). Memory is counted as the simulator does with
    ``weight_holds = ZBV_WEIGHT_HOLDS``. Its op order depends on the costs: the balancer
    re-orders it at the plan's costs (:func:`sapptk.balancer.balance`). At unit costs and
    m ≥ p the result has the least possible step time, 6m·F + (p − 1)·F.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from typing import NamedTuple

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
def build_zb_v(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1) -> Program:
    """ZB-V in PyTorch's order (``ScheduleZBVZeroBubble``); see the module docstring."""
    if chunks != 2 or splits != 1:
        raise ScheduleError(f"zb-v: chunks = {chunks}, splits = {splits}: needs chunks = 2, splits = 1")
    p, m = stages, micro_batches
    planned = max(2 * p - 1, m)  # PyTorch plans at least 2p - 1 micro-batches
    devices = []
    for r in range(p):
        c0, c1 = r, 2 * p - 1 - r  # virtual stages of chunk 0 and chunk 1
        order: list[Op] = []
        nf, ni = {c0: 0, c1: 0}, {c0: 0, c1: 0}

        def run(kind: str, vs: int, counter: dict[int, int], order: list[Op] = order) -> None:
            order.append(Op(kind, counter[vs], vs))
            counter[vs] += 1

        def triple(vs: int, order: list[Op] = order, nf: dict = nf, ni: dict = ni) -> None:
            order.append(Op("F", nf[vs], vs))
            order.append(Op("I", ni[vs], vs))
            order.append(Op("W", ni[vs], vs))
            nf[vs] += 1
            ni[vs] += 1

        for _ in range(2 * (p - r) - 1):  # 1
            run("F", c0, nf)
        for _ in range(r):  # 2
            run("F", c1, nf)
            run("F", c0, nf)
        for _ in range(p - r):  # 3
            triple(c1)
        while nf[c1] < nf[c0] or nf[c0] < planned:  # 4
            if nf[c0] < planned:
                run("F", c0, nf)
            order.append(Op("I", ni[c0], c0))
            order.append(Op("W", ni[c0], c0))
            ni[c0] += 1
            triple(c1)
        w0, w1 = ni[c0], ni[c1]
        for _ in range(r):  # 5
            run("I", c0, ni)
            run("I", c1, ni)
        for _ in range(p - r):  # 6
            run("I", c0, ni)
            order.append(Op("W", w0, c0))
            w0 += 1
        order.extend(Op("W", i, c1) for i in range(w1, ni[c1]))  # 7
        order.extend(Op("W", i, c0) for i in range(w0, ni[c0]))
        devices.append([op for op in order if op.micro_batch < m])
    return make_program(
        "zb-v", stages=p, micro_batches=m, chunks=2, splits=1,
        placement=v_placement(p), device_units=devices,
    )


class OpCosts(NamedTuple):
    """Per-virtual-stage op durations a cost-driven schedule is computed for (ms; any unit works).

    ``forward`` of an ``F``, ``backward`` of an ``I``, ``weight`` of a ``W``, one value per
    virtual stage; ``comm`` the latency added when an op's input comes from another device.
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    weight: tuple[float, ...]
    comm: float = 0.0

    @classmethod
    def uniform(cls, virtual_stages: int, forward: float = 1.0, backward: float = 1.0, weight: float = 1.0,
                comm: float = 0.0) -> OpCosts:
        """The same costs on every virtual stage."""
        n = virtual_stages
        return cls((float(forward),) * n, (float(backward),) * n, (float(weight),) * n, float(comm))


class _VDevice:
    """One device of the ZB-V list schedule: counters, live memory, pending W, free time."""

    def __init__(self, device: int, stages: int) -> None:
        self.stage = (device, 2 * stages - 1 - device)  # virtual stage of chunk 0, chunk 1
        self.next_f = [0, 0]
        self.next_i = [0, 0]
        self.live = 0.0
        self.pending: deque[Op] = deque()
        self.ops: list[Op] = []
        self.free = 0.0


def build_zb_v_greedy(stages: int, micro_batches: int, chunks: int = 2, splits: int = 1, *,
                      costs: OpCosts | None = None) -> Program:
    """ZB-V as a list schedule at ``costs`` (unit costs by default); see the module docstring.

    Time advances from event to event: at time t every device that is free picks its op
    (devices in order; an op placed at t is not seen as ended by others at t); a device with
    nothing ready waits for the next op to end. Deterministic for given costs.
    """
    if chunks != 2 or splits != 1:
        raise ScheduleError(f"zb-v-greedy: chunks = {chunks}, splits = {splits}: needs chunks = 2, splits = 1")
    p, m = stages, micro_batches
    last = 2 * p - 1
    if costs is None:
        costs = OpCosts.uniform(2 * p)
    for label, values in (("forward", costs.forward), ("backward", costs.backward), ("weight", costs.weight)):
        if len(values) != 2 * p or any(not math.isfinite(x) or x < 0 for x in values):
            raise ScheduleError(f"zb-v-greedy: costs.{label}: expected {2 * p} finite values >= 0 (one per virtual "
                                f"stage), got {list(values)}")
    if not math.isfinite(costs.comm) or costs.comm < 0:
        raise ScheduleError(f"zb-v-greedy: costs.comm = {costs.comm!r}: expected a latency >= 0")
    duration = {"F": costs.forward, "I": costs.backward, "W": costs.weight}
    placement = v_placement(p)
    cap = 2 * p  # 1F1B's peak, in chunk activations
    wh = ZBV_WEIGHT_HOLDS
    end: dict[Op, float] = {}  # finish time of every F and I placed so far
    devs = [_VDevice(d, p) for d in range(p)]
    remaining = 6 * p * m
    t = 0.0

    def arrived(op: Op, device: int) -> float | None:
        """When ``op``'s result is usable on ``device`` (None: not placed yet)."""
        done = end.get(op)
        if done is None:
            return None
        return done + (costs.comm if placement[op.virtual_stage] != device else 0.0)

    def ready(op: Op, device: int) -> bool:
        at = arrived(op, device)
        return at is not None and at <= t + 1e-12

    def pick(d: int, dev: _VDevice) -> Op | None:
        for kind, c in (("F", 1), ("I", 1), ("F", 0), ("I", 0)):
            vs = dev.stage[c]
            if kind == "F":
                k = dev.next_f[c]
                room = dev.live + 1 + (1 if c == 0 else 0) <= cap + 1e-9
                if k < m and room and (vs == 0 or ready(Op("F", k, vs - 1), d)):
                    return Op("F", k, vs)
            else:
                k = dev.next_i[c]
                if k < dev.next_f[c] and ready(Op("F", k, vs) if vs == last else Op("I", k, vs + 1), d):
                    return Op("I", k, vs)
        return dev.pending[0] if dev.pending else None

    events: list[float] = []  # times at which something ends or arrives (a min-heap)
    while remaining:
        placed_now = False
        for d, dev in enumerate(devs):  # choices at t see ops ended by t
            if dev.free > t + 1e-12 or len(dev.ops) == 6 * m:
                continue
            op = pick(d, dev)
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
            dev.free = t + duration[op.kind][op.virtual_stage]
            placed_now |= dev.free <= t + 1e-12
            heapq.heappush(events, dev.free)
            if op.kind != "W":
                end[op] = dev.free
                heapq.heappush(events, dev.free + costs.comm)
            remaining -= 1
        if placed_now:  # a zero-length op ended at t: look again at t
            continue
        while events and events[0] <= t + 1e-12:
            heapq.heappop(events)
        if not events:
            if remaining:  # pragma: no cover - the chunk-1 reserve rules this out
                raise ScheduleError(f"zb-v-greedy: list schedule stuck at t = {t} (p={p}, m={m})")
            break
        t = heapq.heappop(events)
    return make_program(
        "zb-v-greedy", stages=p, micro_batches=m, chunks=2, splits=1,
        placement=placement, device_units=[dev.ops for dev in devs],
    )
