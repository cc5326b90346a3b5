"""The copy stream's times by a plain pass, unit by unit in topological order: the oracle of
:func:`sapptk.schedules.copy_stream.run` (which runs the longest-path kernel on the graph of
units and transfers). This is the simulator's offload pass before that kernel took it over;
``benchmarks/offload.py`` times the two against each other."""

from __future__ import annotations

import numpy as np

from sapptk.schedules.copy_stream import Pairs, Stream
from sapptk.schedules.program import Program


def reference_stream_times(program: Program, pairs: Pairs, stream: Stream, dur: np.ndarray, comm: float,
                           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Unit starts and ends, transfer starts and ends, and each fetch's wait (one Python pass)."""
    g = program.graph
    n = len(dur)
    preds_list = [[(q, c) for q, c in zip(row, cross, strict=True) if q < n]
                  for row, cross in zip(g.unit_preds.tolist(), g.unit_cross.tolist(), strict=True)]
    d_list = np.asarray(dur, dtype=float).tolist()
    start = [0.0] * n
    end = [0.0] * n
    k = len(stream.pair)
    c_start = [0.0] * k
    c_end = [0.0] * k
    wait = [0.0] * k
    issue = stream.issue_unit.tolist()
    is_fetch = stream.fetch.tolist()
    c_dur = stream.duration.tolist()
    dev_of = stream.device.tolist()
    waits: dict[int, list[int]] = {}
    for i in np.flatnonzero(stream.fetch).tolist():
        waits.setdefault(int(pairs.b_unit[stream.pair[i]]), []).append(i)
    n_devices = program.stages
    ptr = np.searchsorted(stream.device, np.arange(n_devices)).tolist()  # next transfer of each device
    done = [0.0] * n_devices  # when each device's stream is free

    def advance(upto: int) -> None:
        d = dev_of[upto]
        i = ptr[d]
        free = done[d]
        while i <= upto:
            u = issue[i]
            at = start[u] if is_fetch[i] else end[u]
            s = at if at > free else free
            c_start[i] = s
            free = s + c_dur[i]
            c_end[i] = free
            i += 1
        ptr[d] = i
        done[d] = free

    for u in g.topo_order.tolist():
        s = 0.0
        for q, cross in preds_list[u]:
            t = end[q] + comm if cross and comm else end[q]
            if t > s:
                s = t
        for i in waits.get(u, ()):
            if ptr[dev_of[i]] <= i:
                advance(i)
            if c_end[i] > s:
                wait[i] = c_end[i] - s
                s = c_end[i]
        start[u] = s
        end[u] = s + d_list[u]
    for d in range(n_devices):
        last = int(np.searchsorted(stream.device, d, side="right")) - 1
        if last >= ptr[d]:
            advance(last)
    return tuple(np.asarray(x) for x in (start, end, c_start, c_end, wait))  # type: ignore[return-value]
