"""One rank of a PyTorch pipeline run over gloo on 127.0.0.1 (run by ``pipeline_runs.py``).

``python torch_worker.py CASES_JSON OUT_DIR RANK WORLD PORT`` joins a gloo process group of
``WORLD`` processes at 127.0.0.1:``PORT``, then for every case of ``CASES_JSON`` (in order,
each rank the same list) builds the small float64 model of the case, keeps the virtual
stages the case places on this rank, loads the case's schedule CSV with PyTorch's
``_PipelineScheduleRuntime._load_csv`` and runs one step. When the case names a PyTorch
schedule class, the same step is run again with that class's own order, and its compute
order on this rank is recorded. Gradients (by global parameter name), the losses of the
last stage and the orders go to ``OUT_DIR/rank<RANK>.pt``. Any exception is written to
``OUT_DIR/rank<RANK>.error`` and ends the process with status 1 (the caller then stops
the other ranks). Nothing else is printed.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining import schedules as S

WIDTH = 6
ROWS_PER_MICRO_BATCH = 2


def build_layers(case: dict) -> list[nn.Module]:
    """The whole model as a list of modules in model order: head, body layers, tail.

    Seeded by the case, so every rank and the single-process reference build the same
    weights. The head sits in virtual stage 0 and the tail in the last one.
    """
    torch.manual_seed(case["seed"])
    layers: list[nn.Module] = [nn.Linear(WIDTH, WIDTH, dtype=torch.float64)]  # head
    for _ in range(sum(case["layers"])):
        layers.append(nn.Sequential(nn.Linear(WIDTH, WIDTH, dtype=torch.float64), nn.Tanh()))
    layers.append(nn.Linear(WIDTH, 1, dtype=torch.float64))  # tail
    return layers


def stage_slices(case: dict) -> list[range]:
    """Indices into :func:`build_layers` held by each virtual stage."""
    counts = list(case["layers"])
    out, start = [], 0
    for vs, n in enumerate(counts):
        lo = start + (0 if vs == 0 else 1)  # the head is module 0
        hi = start + 1 + n + (1 if vs == len(counts) - 1 else 0)
        out.append(range(lo, hi))
        start += n
    return out


def batch(case: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of the step: m micro-batches of ROWS_PER_MICRO_BATCH rows."""
    g = torch.Generator().manual_seed(case["seed"] + 1)
    rows = case["micro_batches"] * ROWS_PER_MICRO_BATCH
    x = torch.randn(rows, WIDTH, generator=g, dtype=torch.float64)
    y = torch.randn(rows, 1, generator=g, dtype=torch.float64)
    return x, y


def loss_fn(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Sum of squares: gradients of the micro-batches add up to the whole batch's."""
    return ((output - target) ** 2).sum()


def reference(case: dict) -> tuple[float, dict[str, torch.Tensor]]:
    """One process, no pipeline: the step's loss and gradients (micro-batch by micro-batch)."""
    layers = build_layers(case)
    model = nn.Sequential(*layers)
    x, y = batch(case)
    total = torch.zeros((), dtype=torch.float64)
    for xm, ym in zip(x.chunk(case["micro_batches"]), y.chunk(case["micro_batches"]), strict=True):
        loss = loss_fn(model(xm), ym)
        loss.backward()
        total += loss.detach()
    return float(total), {f"{i}.{n}": p.grad.clone() for i, layer in enumerate(layers)
                          for n, p in layer.named_parameters()}


def _compute_order(actions) -> list[str]:
    return [str(a) for a in actions if a is not None and a.is_compute_op]


def run_case(case: dict, rank: int, world: int, schedule_class: str | None) -> dict:
    """One step of ``case`` on this rank, with the CSV (``schedule_class`` None) or a class."""
    layers = build_layers(case)
    slices = stage_slices(case)
    num_stages = len(slices)
    mine = [vs for vs in range(num_stages) if case["placement"][vs] == rank]
    stages = [PipelineStage(nn.Sequential(*(layers[i] for i in slices[vs])), vs, num_stages, torch.device("cpu"))
              for vs in mine]
    m = case["micro_batches"]
    if schedule_class is None:
        schedule = S._PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
        schedule._load_csv(case["csv"])
        order = None
    else:
        cls = S.get_schedule_class(schedule_class)
        multi = issubclass(cls, S.PipelineScheduleMulti)
        schedule = cls(stages if multi else stages[0], n_microbatches=m, loss_fn=loss_fn, scale_grads=False)
        order = _compute_order(schedule.pipeline_order[rank]) if multi else None
    x, y = batch(case)
    losses: list[torch.Tensor] = []
    kwargs = {}
    if num_stages - 1 in mine:
        kwargs = {"target": y, "losses": losses}
    if 0 in mine:
        schedule.step(x, **kwargs)
    else:
        schedule.step(**kwargs)
    grads = {f"{i}.{n}": p.grad.clone() for vs in mine for i in slices[vs]
             for n, p in layers[i].named_parameters() if p.grad is not None}
    missing = [f"{i}.{n}" for vs in mine for i in slices[vs] for n, p in layers[i].named_parameters()
               if p.grad is None]
    return {"grads": grads, "missing": missing, "losses": [float(v) for v in losses], "order": order}


def main(cases_path: str, out_dir: str, rank: int, world: int, port: int) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    out = Path(out_dir)
    current = "(joining the process group)"
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=60))
        cases = json.loads(Path(cases_path).read_text(encoding="utf-8"))
        results = {}
        for case in cases:
            current = case["id"]
            result = {"csv": run_case(case, rank, world, None)}
            dist.barrier()
            if case.get("torch_class"):
                result["class"] = run_case(case, rank, world, case["torch_class"])
                dist.barrier()
            results[case["id"]] = result
        torch.save(results, out / f"rank{rank}.pt")
        dist.destroy_process_group()
    except BaseException:
        (out / f"rank{rank}.error").write_text(f"case {current}:\n{traceback.format_exc()}", encoding="utf-8")
        sys.exit(1)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
