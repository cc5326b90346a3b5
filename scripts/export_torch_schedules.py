"""Export PyTorch's pipeline schedule orders as CSV fixtures for sapptk's conformance tests.

Run once, with the optional ``fixtures`` extra installed (``pip install -e ".[fixtures]"``,
which pins the CPU build of torch)::

    python scripts/export_torch_schedules.py [OUT_DIR]

OUT_DIR defaults to ``tests/data/torch_schedules``. For every schedule PyTorch's
``torch.distributed.pipelining`` has (GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble,
ZBVZeroBubble, DualPipeV) over p in {2, 4, 8} and m in {p, p+1, 2p, 2p+2, 3p, 4p} it writes
``<Schedule>_p<p>_v<v>_m<m>.csv`` in PyTorch's compute-only schedule CSV (one row per rank,
actions such as ``0F0``, ``1I3``, ``2W1``, ``(0F3;5B1)OVERLAP_F_B``), and ``MANIFEST.json``
with the torch version and one entry per file. The tests read these files; they never need
torch.

Where the orders come from:

* Multi-stage schedules (all but GPipe and 1F1B): the ``pipeline_order`` PyTorch builds in
  the constructor and executes (its runtime lowers it to ``pipeline_order_with_comms``,
  which adds communication but keeps the compute actions in order: checked here), written
  with PyTorch's own ``_dump_csv(format="compute_only")``.
* GPipe and 1F1B (single-stage schedules): the actions ``_step_microbatches`` runs, recorded
  rank by rank through a stand-in stage (no process group, no tensors). Their
  ``_get_pipeline_order`` is a drawing aid, and in torch 2.13 it is off by one for 1F1B's
  last rank (it starts at F1 and ends at F<m>); the runtime is what trains.

No process group is created: the stand-in stages carry only the attributes the schedule
constructors read.
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import torch
from torch.distributed.pipelining import schedules as S

ROOT = Path(__file__).resolve().parents[1]

STAGE_COUNTS = (2, 4, 8)


def micro_batch_counts(p: int) -> tuple[int, ...]:
    return tuple(sorted({p, p + 1, 2 * p, 2 * p + 2, 3 * p, 4 * p}))


class StandInStage:
    """The attributes a schedule's constructor reads, and recorders for the single-stage runtime."""

    def __init__(self, stage_index: int, num_stages: int, group_size: int, group_rank: int) -> None:
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_size = group_size
        self.group_rank = group_rank
        self.submod = None
        self.is_first = stage_index == 0
        self.is_last = stage_index == num_stages - 1
        self.stage_index_to_group_rank: dict[int, int] | None = None
        self.ran: list[str] = []

    # single-stage runtime: communication is a no-op, compute is recorded
    def get_fwd_recv_ops(self, mb: int) -> list:
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, mb: int, *args, **kwargs) -> None:
        self.ran.append(str(S._Action(self.stage_index, S.FORWARD, mb)))

    def backward_one_chunk(self, mb: int, *args, **kwargs) -> None:
        self.ran.append(str(S._Action(self.stage_index, S.FULL_BACKWARD, mb)))

    def perform_reduce_grad(self, *args, **kwargs) -> None:
        pass


def _recording(cls: type) -> type:
    """A subclass of a single-stage schedule whose step needs no tensors and no loss."""

    class Recording(cls):
        def _check_inputs(self, arg_mbs, kwarg_mbs, target_mbs, losses):
            return [()] * self._n_microbatches, [{}] * self._n_microbatches

        def _initialize_stage(self, *args, **kwargs) -> None:
            pass

        def _maybe_compute_loss(self, *args, **kwargs) -> None:
            pass

        def _maybe_get_loss(self, *args, **kwargs) -> None:
            return None

        def _update_losses(self, *args, **kwargs) -> None:
            pass

    return Recording


def single_stage_rows(cls: type, p: int, m: int) -> list[list[str]]:
    rows = []
    for rank in range(p):
        stage = StandInStage(rank, p, p, rank)
        schedule = _recording(cls)(stage, n_microbatches=m)
        schedule._step_microbatches()
        rows.append(stage.ran)
    return rows


def multi_stage(cls: type, p: int, v: int, m: int, style: str) -> S.PipelineScheduleMulti:
    num_stages = p * v
    # rank 0 holds stages 0 and 2p - 1 on a V, stages 0, p, 2p, ... on a loop
    local = [0, num_stages - 1] if style == "v" else [c * p for c in range(v)]
    stages = [StandInStage(i, num_stages, p, 0) for i in local]
    return cls(stages, n_microbatches=m)


def _compute(actions) -> list[str]:
    out = []
    for a in actions:
        if a is not None and a.is_compute_op:
            out.append(str(a))
    return out


def cases():
    for p in STAGE_COUNTS:
        for m in micro_batch_counts(p):
            yield "GPipe", S.ScheduleGPipe, p, 1, m, None
            yield "1F1B", S.Schedule1F1B, p, 1, m, None
            for v in (2, 3):
                yield "Interleaved1F1B", S.ScheduleInterleaved1F1B, p, v, m, "loop"
            for v in (1, 2):
                yield "InterleavedZeroBubble", S.ScheduleInterleavedZeroBubble, p, v, m, "loop"
            yield "ZBVZeroBubble", S.ScheduleZBVZeroBubble, p, 2, m, "v"
            if m >= 2 * p:  # DualPipeV needs m >= 2p (the number of stages)
                yield "DualPipeV", S.ScheduleDualPipeV, p, 2, m, "v"


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    manifest = {"torch_version": torch.__version__, "files": []}
    for name, cls, p, v, m, style in cases():
        path = out / f"{name}_p{p}_v{v}_m{m}.csv"
        if style is None:
            rows = single_stage_rows(cls, p, m)
            with open(path, "w", newline="") as f:
                csv.writer(f).writerows(rows)
            source = "_step_microbatches"
        else:
            schedule = multi_stage(cls, p, v, m, style)
            for rank in range(p):  # the runtime keeps the compute order of pipeline_order
                assert _compute(schedule.pipeline_order[rank]) == _compute(
                    schedule.pipeline_order_with_comms[rank]
                ), (name, p, v, m, rank)
            schedule._dump_csv(str(path), format="compute_only")
            source = "pipeline_order"
        manifest["files"].append(
            {"file": path.name, "schedule": name, "stages": p, "chunks": v, "micro_batches": m, "source": source}
        )
    (out / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    print(f"torch {torch.__version__}: wrote {len(manifest['files'])} schedules to {out}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "tests" / "data" / "torch_schedules")
