"""What a torchtitan release builds from sapptk's export (run by ``test_torchtitan.py``).

``python torchtitan_probe.py OUT_JSON CONFIG...`` loads each config with the torchtitan found
on the path — a TOML job file through ``ConfigManager().parse_args(["--job.config_file", CONFIG])``
(torchtitan <= 0.2.2), or a Python config module ``CONFIG`` (a .py file) through
``ConfigManager().parse_args(["--module", <its name>, "--config", "sapptk_plan"])`` (>= 0.3)
— and then, for every pipeline rank, runs torchtitan's own module split on a small decoder
(``tok_embeddings``, ``layers.<i>``, ``norm``, the output layer) and its own schedule
builder. It writes to ``OUT_JSON``, per config (or the error it raised): the version, the
activation-checkpointing setting, per rank the stages built (stage index and the parameter
names each keeps, the output layer called ``output``) and the schedule (class,
micro-batches, and the compute order PyTorch runs for a multi-stage schedule). It runs in
the current directory, whatever that is: the
caller chooses it to check that the schedule CSV is found from any launch directory.
"""

from __future__ import annotations

import importlib.metadata
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torchtitan
from torch import nn
from torch.distributed.pipelining import schedules as S

VERSION = importlib.metadata.version("torchtitan")


class Decoder(nn.Module):
    """The module names torchtitan's decoders use; ``output_name`` is ``lm_head`` from 0.3 on."""

    def __init__(self, layers: int, output_name: str) -> None:
        super().__init__()
        self.tok_embeddings = nn.Embedding(8, 4)
        self.layers = nn.ModuleDict({str(i): nn.Linear(4, 4) for i in range(layers)})
        self.norm = nn.LayerNorm(4)
        setattr(self, output_name, nn.Linear(4, 8))


class FakeMesh:
    """The pipeline mesh of one rank as torchtitan's split reads it (the group is a one-process one)."""

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.degree = rank, size

    def get_local_rank(self) -> int:
        return self.rank

    def size(self) -> int:
        return self.degree

    def get_group(self, *args) -> dist.ProcessGroup:
        return dist.group.WORLD


class StandInStage:
    """The attributes a schedule's constructor reads, for rank ``rank`` of ``size``."""

    def __init__(self, stage_index: int, num_stages: int, size: int, rank: int) -> None:
        self.stage_index, self.num_stages = stage_index, num_stages
        self.group_size, self.group_rank = size, rank
        self.submod = None
        self.is_first, self.is_last = stage_index == 0, stage_index == num_stages - 1
        self.stage_index_to_group_rank: dict[int, int] | None = None


def _load(config: Path):
    from torchtitan.config import ConfigManager

    if config.suffix == ".py":
        sys.path.insert(0, str(config.parent))
        return ConfigManager().parse_args(["--module", config.stem, "--config", "sapptk_plan"])
    return ConfigManager().parse_args(["--job.config_file", str(config)])


def _ac(job) -> dict:
    ac = job.activation_checkpoint
    if ac is None:
        return {"class": "None"}
    if hasattr(ac, "mode"):  # <= 0.2.2: a table with a mode
        return {"mode": ac.mode, "selective_ac_option": ac.selective_ac_option}
    return {"class": type(ac).__qualname__}


def _split(job, rank: int, output_name: str, layers: int) -> list:
    par = job.parallelism
    return split_parts(par.pipeline_parallel_schedule, par.pipeline_parallel_degree, par.module_fqns_per_model_part,
                       rank, output_name, layers)


def split_parts(schedule: str, degree: int, parts: list[list[str]], rank: int, output_name: str, layers: int) -> list:
    """torchtitan's own module split of a decoder for one rank: ``[[stage index, parameter names], ...]``."""
    model = Decoder(layers, output_name)
    args = (model, FakeMesh(rank, degree), schedule, torch.device("cpu"), parts)
    try:
        from torchtitan.distributed.pipeline_parallel import pipeline_module_split as split
    except ImportError:  # 0.3 keeps it private
        from torchtitan.distributed.pipeline_parallel import _pipeline_module_split as split
    stages, _ = split(*args)
    return [[s.stage_index, sorted(n.replace(output_name, "output") for n, _ in s.submod.named_parameters())]
            for s in stages]


def _schedule(job, rank: int, stage_indices: list[int]) -> dict:
    par = job.parallelism
    num_stages = len(par.module_fqns_per_model_part)
    stages = [StandInStage(i, num_stages, par.pipeline_parallel_degree, rank) for i in stage_indices]
    try:
        from torchtitan.distributed.pipeline_parallel import build_pipeline_schedule

        schedule = build_pipeline_schedule(job, stages, loss_fn=None)
    except ImportError:  # 0.3
        from torchtitan.distributed.pipeline_parallel import _build_pipeline_schedule

        schedule = _build_pipeline_schedule(parallelism=par, local_batch_size=job.training.local_batch_size,
                                            stages=stages, loss_fn=None)
    order = None
    if isinstance(schedule, S.PipelineScheduleMulti):
        order = [str(a) for a in schedule.pipeline_order[rank] if a is not None and a.is_compute_op]
    return {"class": type(schedule).__name__, "micro_batches": schedule._n_microbatches, "order": order}


def probe(config: Path) -> dict:
    """What torchtitan builds from one exported config."""
    job = _load(config)
    par = job.parallelism
    output_name = "lm_head" if any("lm_head" in part for part in par.module_fqns_per_model_part) else "output"
    layers = sum(name.startswith("layers.") for part in par.module_fqns_per_model_part for name in part)
    ranks = []
    for rank in range(par.pipeline_parallel_degree):
        built = _split(job, rank, output_name, layers)
        ranks.append({"stages": built, "schedule": _schedule(job, rank, [i for i, _ in built])})
    return {"version": VERSION, "path": torchtitan.__file__, "schedule": par.pipeline_parallel_schedule,
            "csv": par.pipeline_parallel_schedule_csv or None,
            "micro_batch_size": par.pipeline_parallel_microbatch_size,
            "local_batch_size": job.training.local_batch_size, "ac": _ac(job), "ranks": ranks}


def main(out: Path, configs: list[Path]) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)  # no network at all
    results = {}
    for config in configs:
        try:
            results[str(config)] = probe(config)
        except (Exception, SystemExit) as exc:  # reported per config (tyro exits on a bad config); tests show it
            results[str(config)] = {"error": f"{type(exc).__name__}: {exc}"}
    out.write_text(json.dumps(results), encoding="utf-8")
    dist.destroy_process_group()


def main_split(source: Path, out: Path) -> None:
    """``--split IN_JSON OUT_JSON``: the module split alone for many plans (a list of
    ``{"schedule", "degree", "parts"}``), every rank: per plan, per rank, the stages built."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    results = []
    for item in json.loads(source.read_text(encoding="utf-8")):
        parts = item["parts"]
        output_name = "lm_head" if any("lm_head" in part for part in parts) else "output"
        layers = sum(name.startswith("layers.") for part in parts for name in part)
        results.append([split_parts(item["schedule"], item["degree"], parts, rank, output_name, layers)
                        for rank in range(item["degree"])])
    out.write_text(json.dumps({"version": VERSION, "plans": results}), encoding="utf-8")
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "--split":
        main_split(Path(sys.argv[2]).resolve(), Path(sys.argv[3]).resolve())
    else:
        main(Path(sys.argv[1]).resolve(), [Path(a).resolve() for a in sys.argv[2:]])
