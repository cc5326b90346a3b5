"""The entry point a trial folder runs (``train.py`` calls :func:`main`): one setup, for real.

Started by ``torchrun`` (p · dp processes; ``RANK``, ``WORLD_SIZE`` and the
rendezvous come from it). It reads the folder's ``manifest.json``, builds the trial model
(``model``: ``layers`` transformer blocks of width ``hidden``, ``heads`` heads, ``seq``
tokens, ``rows`` samples per micro-batch), places ``layers_per_virtual_stage`` blocks on each
virtual stage of the rank, and runs the folder's schedule CSV with PyTorch's pipeline runtime
(``_PipelineScheduleRuntime._load_csv``): gloo on CPU, NCCL on a GPU (``device: auto``
picks CUDA when present). ``warmup`` steps, ``steps`` timed steps, ``steps`` profiled steps.

Each rank writes into ``--results DIR`` (never over an existing file):

* ``rank<r>.json``: ``status`` (``ok``, ``oom`` or ``crashed`` with ``error``), ``trial``
  (the manifest's key), ``wall_ms`` (each profiled step: the slower rank's wall time),
  ``unprofiled_ms``, ``peak_rss_mb`` (the process's resident peak), ``peak_allocated_mb`` and
  ``peak_reserved_mb`` on a GPU;
* ``trace_rank<r>.json``: the ``torch.profiler`` trace, with ``ProfilerStep#<i>`` ranges, one
  ``sapptk:<F|B|I|W>:<virtual stage>:<micro-batch>`` range per stage call, one
  ``sapptk:layer:<index>`` range per layer's forward pass, ``sapptk:wait`` around each wait
  for a neighbour, ``sapptk:dp_sync`` (the gradient all-reduce across replicas when dp > 1),
  ``sapptk:optimizer`` (SGD) and one ``sapptk:trial:<key>`` range naming the trial.

A setup with dp > 1 runs p · dp processes: replica d is ranks d·p .. d·p + p − 1, each
pipeline on its own process group, the gradients all-reduced across replicas after each step.

Needs torch (the ``runtimes`` extra); nothing here runs at import.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

__all__ = ["main"]


def _write_new(path: Path, text: str) -> None:
    with open(path, "x", encoding="utf-8") as handle:  # "x": a kept result is never overwritten
        handle.write(text)


def _model(spec: dict[str, Any], first: int, count: int, record_function: Any) -> Any:
    """Layers ``first .. first + count - 1`` as one module: the built-in blocks, or what the
    spec's ``factory`` (``"package.module:function"``, called as ``function(spec, first, count)``)
    returns for your own model."""
    from torch import nn

    if spec.get("factory"):
        import importlib

        module_name, _, function = str(spec["factory"]).partition(":")
        return getattr(importlib.import_module(module_name), function)(spec, first, count)

    class Block(nn.Module):
        def __init__(self, index: int) -> None:
            super().__init__()
            self.index = index
            self.inner = nn.TransformerEncoderLayer(spec["hidden"], spec["heads"], 2 * spec["hidden"], dropout=0.0,
                                                    batch_first=True)

        def forward(self, x: Any) -> Any:
            with record_function(f"sapptk:layer:{self.index}"):
                return self.inner(x)

    return nn.Sequential(*[Block(first + i) for i in range(count)])


def _run(folder: Path, run: Path, manifest: dict[str, Any], rank: int, world: int) -> dict[str, Any]:
    import torch
    import torch.distributed as dist
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining import schedules as S
    from torch.profiler import ProfilerActivity, profile, record_function

    setup, spec = manifest["setup"], manifest["model"]
    p, dp = int(setup["stages"]), int(setup["dp"])
    if world != p * dp:
        raise RuntimeError(f"WORLD_SIZE = {world}: this trial runs {p} pipeline stages x dp {dp} = {p * dp} "
                           f"processes (torchrun --nproc-per-node {p * dp})")
    replica, stage_rank = divmod(rank, p)
    torch.set_num_threads(int(manifest.get("threads", 1)))
    wanted = os.environ.get("SAPPTK_DEVICE") or manifest.get("device", "auto")
    cuda = wanted != "cpu" and torch.cuda.is_available()
    if cuda:
        local = int(os.environ.get("LOCAL_RANK", rank))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            timeout=timedelta(seconds=float(manifest.get("timeout_s", 300))))
    pp_group = dp_group = None
    if dp > 1:  # every rank creates every group, in the same order
        pp_groups = [dist.new_group(list(range(d * p, d * p + p))) for d in range(dp)]
        dp_groups = [dist.new_group(list(range(s, p * dp, p))) for s in range(p)]
        pp_group, dp_group = pp_groups[replica], dp_groups[stage_rank]
    wait = S._wait_batch_p2p

    def timed_wait(*args: Any, **kwargs: Any) -> Any:
        with record_function("sapptk:wait"):
            return wait(*args, **kwargs)

    S._wait_batch_p2p = timed_wait
    placement, layers = setup["placement"], setup["layers_per_virtual_stage"]
    n = len(placement)
    torch.manual_seed(int(manifest.get("seed", 0)))
    stages = []
    for vs in range(n):
        module = _model(spec, sum(layers[:vs]), layers[vs], record_function)  # every rank draws the same weights
        if placement[vs] != stage_rank:
            continue
        stage = PipelineStage(module.to(device), vs, n, device, group=pp_group)
        for method, kind in (("forward_one_chunk", "F"), ("backward_one_chunk", None),
                             ("backward_weight_one_chunk", "W")):
            inner = getattr(stage, method)

            def wrapped(mb: int, *args: Any, _inner: Any = inner, _kind: Any = kind, _vs: int = vs,
                        **kwargs: Any) -> Any:
                k = _kind or ("B" if kwargs.get("full_backward", True) else "I")
                with record_function(f"sapptk:{k}:{_vs}:{mb}"):
                    return _inner(mb, *args, **kwargs)

            setattr(stage, method, wrapped)
        stages.append(stage)
    m = setup["micro_batches"]
    schedule = S._PipelineScheduleRuntime(stages, n_microbatches=m, loss_fn=lambda y, t: ((y - t) ** 2).mean())
    schedule._load_csv(str(folder / manifest["files"]["schedule"]))
    shape = (m * spec["rows"], spec["seq"], spec["hidden"])
    x, y = torch.randn(shape, device=device), torch.randn(shape, device=device)
    mine = [vs for vs in range(n) if placement[vs] == stage_rank]
    params = [q for stage in stages for q in stage.submod.parameters()]
    optimizer = torch.optim.SGD(params, lr=1e-4)

    def step() -> None:
        kwargs = {"target": y, "losses": []} if n - 1 in mine else {}
        if 0 in mine:
            schedule.step(x, **kwargs)
        else:
            schedule.step(**kwargs)
        if dp_group is not None:
            with record_function("sapptk:dp_sync"):
                for q in params:
                    if q.grad is not None:
                        dist.all_reduce(q.grad, group=dp_group)
        with record_function("sapptk:optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
        if cuda:
            torch.cuda.synchronize()

    def timed(name: str | None = None) -> float:
        dist.barrier()
        start = time.perf_counter()
        if name is None:
            step()
        else:
            with record_function(name):
                step()
        elapsed = torch.tensor([time.perf_counter() - start], device=device)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        return float(elapsed.item()) * 1e3

    for _ in range(int(manifest["warmup"])):
        step()
    plain = [timed() for _ in range(int(manifest["steps"]))]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        with record_function(f"sapptk:trial:{manifest['key']}"):
            pass
        wall = [timed(f"ProfilerStep#{i}") for i in range(int(manifest["steps"]))]
    trace = run / f"trace_rank{rank}.json"
    if trace.exists():
        raise RuntimeError(f"{trace} exists: a run folder is written once")
    prof.export_chrome_trace(str(trace))
    out = {"wall_ms": wall, "unprofiled_ms": plain, "device": str(device), "torch": torch.__version__}
    if cuda:
        out["peak_allocated_mb"] = torch.cuda.max_memory_allocated(device) / 2**20
        out["peak_reserved_mb"] = torch.cuda.max_memory_reserved(device) / 2**20
    dist.barrier()
    dist.destroy_process_group()
    return out


def main(folder: Path, argv: list[str] | None = None) -> int:
    """Run the trial of ``folder`` on this rank; 0 when it ran, 1 when it crashed or ran out of memory
    (``rank<r>.json`` says which)."""
    parser = argparse.ArgumentParser(description="run one sapptk trial on this rank (start it with torchrun)")
    parser.add_argument("--results", type=Path, required=True, help="the run folder (created; never overwritten)")
    args = parser.parse_args(argv)
    folder = Path(folder)
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        print(f"sapptk trial: {folder / 'manifest.json'}: cannot read the trial's manifest: {exc}", file=sys.stderr)
        return 2
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    run = args.results if args.results.is_absolute() else folder / args.results
    run.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"trial": manifest["key"], "rank": rank, "world_size": world}
    code = 0
    try:
        record.update(_run(folder, run, manifest, rank, world))
        record["status"] = "ok"
    except Exception as exc:  # kept as a measurement: this setup did not run here
        oom = type(exc).__name__ == "OutOfMemoryError" or "out of memory" in str(exc).lower()
        record.update(status="oom" if oom else "crashed", error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc()[-4000:])
        code = 1
    record["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    _write_new(run / f"rank{rank}.json", json.dumps(record, indent=1))
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main(Path(sys.argv[1]), sys.argv[2:]))
