"""The ``sapptk`` command: a thin layer over the library.

Commands: ``balance`` (solve a plan, compare with the even splits, optionally write the
plan file, the MindFormers YAML and the layout CSV), ``simulate`` (evaluate hand-made
MindFormers configs, or a schedule CSV of your own), ``export`` (a saved plan for
Megatron-LM, torchtitan, MindFormers or as PyTorch's schedule CSV), ``sweep`` (a grid of
setups to one Parquet table, resumable), ``choose`` (the setup to run, ranked and
pruned by proven bounds: from a profile, or from a model card and a GPU with ``--model``/``--gpu``;
``--out`` writes the winner's plan files, the ranking CSV and one HTML page), ``schedules``
(list the schedules), ``estimate`` (a profile from a model card, a layout and a hardware
card; ``balance --model`` solves on one).

Exit codes: 0 success, 1 no plan found (infeasible, or none within the time limit),
2 bad input (the message goes to stderr, without a traceback). Output folders are checked
for writing before any solving starts; paths and names that are not valid UTF-8 are
printed with backslash escapes rather than failing.

Adding a command: write ``_add_<name>(commands)`` that adds a subparser and sets
``func=<handler>`` (a function ``(args) -> int``), and call it in :func:`build_parser`.
:func:`add_pipeline_args` and :func:`sapptk.profile.resolve_profile` are there to share.

(Over 500 lines: nine commands, each an ``_add_<name>`` parser and a handler of a few
lines; they share the argument types and the pipeline arguments at the top.)
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from sapptk import checks
from sapptk.errors import ConfigError, FileError, SapptkError
from sapptk.files import writable_dir, write_text
from sapptk.levers import SWEPT, cli_fields
from sapptk.profile import MODES, Profile, resolve_profile

__all__ = ["add_pipeline_args", "build_parser", "main", "pipeline_config"]


# ------------------------------------------------------------------- argument types
def _float_type(name: str, *, zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite float > 0 (>= 0 with ``zero``); ``name`` is what argparse's
    message calls it."""

    def parse(text: str) -> float:
        value = float(text)
        above = value >= 0 if zero else value > 0  # False for NaN
        if not above or value == float("inf"):
            raise ValueError(text)
        return value

    parse.__name__ = name
    return parse


def _seconds(name: str) -> Callable[[str], float]:
    """``--time-limit`` and its kin: the library's check and message (``sapptk.checks.time_limit``)."""

    def parse(text: str) -> float:
        value: int | float | str = text
        for kind in (int, float):  # as the library would be given it, so the message is the library's
            try:
                value = kind(text)
                break
            except ValueError:
                continue
        try:
            return checks.time_limit(value, name)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = name
    return parse


_positive_seconds = _seconds("time_limit")
_point_seconds = _seconds("point_time_limit")
_finite_nonnegative = _float_type("number (finite, >= 0)", zero=True)
_positive_bandwidth = _float_type("bandwidth (MB per ms > 0)", zero=False)


def _checked(check: Callable[..., int], what: str) -> Callable[[str], int]:
    """An argparse type from a :mod:`sapptk.checks` function: the library's limit and its message."""

    def parse(text: str) -> int:
        try:
            return check(text, what, text=True)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parse.__name__ = what
    return parse


_workers = _checked(checks.workers, "workers")  # the same limit and message as balance(workers=...)
_seed = _checked(checks.seed, "seed")


def _optional(parse: Callable[[str], float]) -> Callable[[str], float | None]:
    """``parse``, or None for 'none' (a lever left off in a sweep's list)."""

    def parse_optional(text: str) -> float | None:
        return None if text.lower() == "none" else parse(text)

    parse_optional.__name__ = getattr(parse, "__name__", "value")
    return parse_optional


def _add_lever_args(group: Any, command: str) -> None:
    """The lever flags of ``sapptk COMMAND``, from :mod:`sapptk.levers` (a sweep takes lists: every
    value is a grid axis)."""
    for f in cli_fields(command):
        if f.kind == "flag" and command == "sweep":
            group.add_argument(f.cli, nargs="+", choices=("off", "on"), default=["off"],
                               help=f"{f.help}: off, on, or 'off on' to sweep both (off)")
        elif f.kind == "flag":
            group.add_argument(f.cli, action="store_true", help=f.help)
        elif command == "sweep":
            group.add_argument(f.cli, type=_optional(_finite_nonnegative), nargs="+", default=[None],
                               metavar=f.metavar, help=f"{f.help} ('none', the default)")
        else:
            group.add_argument(f.cli, type=_finite_nonnegative, default=None, metavar=f.metavar, help=f.help)


def _lever_values(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The lever flags of ``sapptk COMMAND`` as keywords (for a sweep: grid axes)."""
    values: dict[str, Any] = {}
    for f in cli_fields(command):
        value = getattr(args, f.name)
        values[f.name] = [v == "on" for v in value] if command == "sweep" and f.kind == "flag" else value
    return values


def _budget(text: str) -> float | None:
    return None if text.lower() in ("none", "inf") else float(text)


_budget.__name__ = "budget (MB, or none)"

def _splits(text: str) -> int | list[int]:
    """``k`` or comma-separated slice lengths in tokens (checked against the profile by the config)."""
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected k or comma-separated slice lengths (tokens)") from None
    return values[0] if len(values) == 1 and "," not in text else values


# ------------------------------------------------------------------------ shared helpers
def add_pipeline_args(parser: argparse.ArgumentParser, *, sizes_required: bool = True) -> None:
    """The pipeline setup options shared by the commands (one value each)."""
    group = parser.add_argument_group("pipeline")
    group.add_argument("--stages", "-p", type=int, required=sizes_required, help="pipeline stages (devices), p")
    group.add_argument("--micro-batches", "-m", type=int, required=sizes_required, help="micro-batches per step, m")
    group.add_argument("--chunks", "-v", type=int, default=1, help="model chunks per device, v (default 1)")
    group.add_argument("--schedule", default="1f1b", help="schedule name, see `sapptk schedules` (default 1f1b)")
    group.add_argument("--splits", "-k", type=_splits, default=1, metavar="K|L0,L1,...",
                       help="sequence slices per micro-batch, or their lengths in tokens (seq schedules)")
    group.add_argument("--memory", type=float, default=None, metavar="MB", help="memory budget per device, MB")
    group.add_argument("--constant", type=float, default=0.0, metavar="MB",
                       help="constant memory per device besides parameters and activations, MB")
    group.add_argument("--comm", type=float, default=0.0, metavar="MS", help="point-to-point latency, ms")


def pipeline_config(args: argparse.Namespace, profile: Profile | None = None):  # -> PipelineConfig
    """The :class:`~sapptk.config.PipelineConfig` of parsed :func:`add_pipeline_args` options."""
    from sapptk.config import OFFLOAD, PipelineConfig

    recompute = tuple(getattr(args, "recompute", None) or MODES)
    host_bandwidth = getattr(args, "host_bandwidth", None)
    if host_bandwidth is not None and OFFLOAD not in recompute:
        recompute = (*recompute, OFFLOAD)  # a host link given means offload is allowed
    config = PipelineConfig(
        stages=args.stages,
        micro_batches=args.micro_batches,
        chunks=args.chunks,
        schedule=args.schedule,
        splits=args.splits,
        memory_budget=args.memory,
        constant_memory=args.constant,
        comm=args.comm,
        recompute=recompute,
        host_bandwidth=host_bandwidth,
    )
    if profile is not None:
        config.check(profile)
    else:
        config.validate()
    return config


def _setup_line(profile: Profile, config) -> str:
    budget = "no budget" if config.memory_budget is None else f"budget {config.memory_budget:g} MB"
    k = f" k={config.splits}" if config.splits != 1 else ""
    return (
        f"profile {profile.name} ({profile.num_body_layers} body layers), {config.schedule} "
        f"p={config.stages} v={config.chunks} m={config.micro_batches}{k}, {budget}"
    )


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _table(frame: pd.DataFrame, left: Sequence[str] = ("name",)) -> str:
    """A plain-text table, with the text columns in ``left`` aligned left."""
    formatters = {}
    for col in left:
        if col in frame:
            width = max([len(col), *(len(str(x)) for x in frame[col])])
            formatters[col] = lambda x, w=width: f"{x!s:<{w}}"
    text = frame.to_string(index=False, formatters=formatters)
    lines = text.splitlines()
    # left-align the headers of the left columns too
    for col in left:
        if col in frame:
            width = max([len(col), *(len(str(x)) for x in frame[col])])
            lines[0] = lines[0].replace(f"{col:>{width}}", f"{col:<{width}}", 1)
    return "\n".join(line.rstrip() for line in lines)


# ------------------------------------------------------------------------------ balance
def _add_balance(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "balance",
        help="solve the layer and recompute assignment with the shortest step time",
        description="Balance layers and recompute over the pipeline with CP-SAT; compare with the even splits.",
    )
    parser.add_argument("profile", metavar="PROFILE", nargs="?", default=None,
                        help="profile file, or a bundled name (llama2_70b, demo, ...); or give --model instead")
    add_pipeline_args(parser)
    _add_model_args(parser)
    parser.add_argument("--recompute", nargs="+", choices=(*MODES, "offload"), default=None, metavar="MODE",
                        help=f"modes the solver may use (default all: {' '.join(MODES)}; 'offload' allows "
                        "activation offload, with --host-bandwidth)")
    parser.add_argument("--time-limit", type=_positive_seconds, default=30.0, metavar="S",
                        help="solver time limit, s (30)")
    parser.add_argument("--workers", type=_workers, default=2, help="solver worker threads (2)")
    parser.add_argument("--seed", type=_seed, default=0, help="solver random seed (0)")
    levers = parser.add_argument_group("levers (docs/levers.md)")
    levers.add_argument("--host-bandwidth", type=_positive_bandwidth, default=None, metavar="MB_PER_MS",
                        help="host link per device, MB/ms (25 is about PCIe 4.0 x16); allows activation offload")
    _add_lever_args(levers, "balance")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write sapptk_plan.yaml (the plan; `sapptk export` reads it), plan.yaml (MindFormers) "
                        "and layout.csv there")
    parser.set_defaults(func=_balance)


def _balance(args: argparse.Namespace) -> int:
    from sapptk.baselines import distinct_recomputes
    from sapptk.plan import even_split

    profile = _balance_profile(args)
    config = pipeline_config(args, profile)
    if args.out is not None:  # before solving: a bad folder must not cost a solve
        writable_dir(args.out, what="output folder (--out)")
    from sapptk.request import SolveRequest

    # checked before the setup line is printed; OR-Tools loads only with the solve
    request = SolveRequest(profile, config, time_limit=args.time_limit, workers=args.workers, seed=args.seed,
                           **_lever_values(args, "balance"))
    print(_setup_line(profile, config))
    from sapptk.balancer import solve

    plan = solve(request)
    print(plan.summary())
    print()
    print("compared with the even splits (ratio = baseline step time / plan step time; > 1: the plan is faster):")
    for base in (even_split(profile, config, mode) for mode in distinct_recomputes(profile, config)):
        ratio = f"{base.step_time / plan.step_time:.2f}" if plan.solved and plan.step_time else "n/a"
        print(f"  {base.source:<22} step {base.step_time:10.1f} ms  fits {_yes(base.fits):<3}  ratio {ratio}")
    if not plan.solved:
        print(f"\nno plan: status {plan.status}")
        return 1
    if args.out is not None:
        written = _write_plan(plan, args.out)
        print(f"\nwrote {', '.join(str(p) for p in written)} ({written[0]}: the plan; sapptk export reads it)")
    return 0


def _write_plan(plan: Any, out: Path) -> list[Path]:
    """The plan files of ``balance --out`` and ``choose --out``: the plan file (``sapptk_plan.yaml``,
    first), the MindFormers lists (``plan.yaml``, unless the plan holds a cell they cannot express:
    then a line says why) and the layout (``layout.csv``). The files written."""
    saved = out / "sapptk_plan.yaml"
    plan.export("sapptk", saved)
    written = [saved]
    try:
        plan.export("mindformers", out / "plan.yaml")
    except ConfigError as exc:  # a cell the MindFormers lists cannot express
        print(f"plan.yaml not written (the MindFormers lists): {exc}")
    else:
        written.append(out / "plan.yaml")
    layout = out / "layout.csv"
    write_text(layout, plan.layout.to_csv(index=False), what="layout")
    return [*written, layout]


def _add_model_args(parser: argparse.ArgumentParser) -> None:
    from sapptk.models.options import add_model_args

    add_model_args(parser, required=False)
    parser.set_defaults(constant=None)  # with --model: the hardware card's constant, else 0


def _balance_profile(args: argparse.Namespace) -> Profile:
    """The PROFILE argument, or the estimate of ``--model`` (whose hardware card gives the
    budget and the constant when ``--memory`` / ``--constant`` are not given)."""
    if args.model is None:
        if args.profile is None:
            raise ConfigError("balance: expected a PROFILE or --model (a model card, see `sapptk estimate`)")
        args.constant = 0.0 if args.constant is None else args.constant
        return resolve_profile(args.profile)
    if args.profile is not None:
        raise ConfigError(f"balance: got both PROFILE {args.profile!r} and --model {args.model!r}: expected one")
    from sapptk.models.options import model_hardware, model_profile

    profile = model_profile(args)
    if args.memory is None:
        args.memory = model_hardware(args).memory_mb
    if args.constant is None:
        args.constant = float(profile.provenance["constant_mb"])
    return profile


# ----------------------------------------------------------------------------- estimate
def _add_estimate(commands: argparse._SubParsersAction) -> None:
    from sapptk.models.options import add_model_args

    parser = commands.add_parser(
        "estimate",
        help="estimate a profile from a model card, a parallel layout and a hardware card",
        description="Estimate a layer profile before any run (docs/estimation.md): print the per-group table, "
        "optionally write the profile (.yaml or .json, sapptk-profile/1 with its provenance).",
    )
    add_model_args(parser, required=True)
    parser.add_argument("--out", type=Path, default=None, metavar="FILE", help="write the profile (.yaml, .json)")
    parser.set_defaults(func=_estimate)


def _estimate(args: argparse.Namespace) -> int:
    import json

    from sapptk.models.options import model_hardware, model_profile, profile_table

    if args.out is not None and args.out.suffix.lower() not in (".yaml", ".yml", ".json"):
        raise ConfigError(f"--out {args.out}: expected a .yaml, .yml or .json file name")
    if args.out is not None:
        writable_dir(args.out.parent if str(args.out.parent) else Path("."), what="output folder (--out)")
    profile = model_profile(args)
    device = model_hardware(args)
    card = profile.provenance["card"]
    print(f"{profile.name}: {card['parameters']:,} parameters; {device.name} {device.peak_tflops:g} TFLOPS "
          f"x {device.matmul_efficiency:g}, {device.memory_mb:g} MB, constant {profile.provenance['constant_mb']:,.0f} "
          f"MB ({device.constant_mb:g} assumed + the largest transient; {profile.provenance['memory_figure']})")
    print(_table(profile_table(profile), left=("group", "kind")))
    if args.out is not None:
        if args.out.suffix.lower() == ".json":
            write_text(args.out, json.dumps(profile.to_dict(), indent=1) + "\n", what="profile")
        else:
            profile.to_yaml(args.out)
        print(f"\nwrote {args.out}")
    return 0


# ----------------------------------------------------------------------------- simulate
def _add_simulate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "simulate",
        help="evaluate hand-made MindFormers configs, or a schedule of your own",
        description="Simulate each config of a MindFormers YAML (one config or named configs); with "
        "--schedule-csv, run a schedule of your own (PyTorch's schedule CSV): the setup's sizes come from it, and "
        "without --config the even splits are simulated on it.",
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile file, or a bundled name (llama2_70b, demo, ...)")
    parser.add_argument("--config", type=Path, default=None, metavar="YAML", help="MindFormers config file")
    parser.add_argument("--name", default=None, help="evaluate only the config with this name")
    parser.add_argument("--schedule-csv", type=Path, default=None, metavar="CSV",
                        help="run this op order (PyTorch's schedule CSV, e.g. from Program.to_csv)")
    add_pipeline_args(parser, sizes_required=False)
    parser.set_defaults(func=_simulate)


def _csv_config(args: argparse.Namespace, profile: Profile):  # -> PipelineConfig
    """The setup running ``--schedule-csv``; sizes given on the command line must agree with it."""
    from sapptk.config import PipelineConfig
    from sapptk.schedules import from_csv

    program = from_csv(args.schedule_csv)
    given = {"stages": args.stages, "micro_batches": args.micro_batches}
    for name, value in given.items():
        if value is not None and value != getattr(program, name):
            raise ConfigError(f"--{name.replace('_', '-')} = {value}: {args.schedule_csv} runs {name} = "
                              f"{getattr(program, name)}")
    if args.chunks not in (1, program.chunks):
        raise ConfigError(f"--chunks = {args.chunks}: {args.schedule_csv} runs chunks = {program.chunks}")
    config = PipelineConfig.from_program(program, memory_budget=args.memory, constant_memory=args.constant,
                                         comm=args.comm, recompute=tuple(MODES))
    config.check(profile)
    return config


def _simulate(args: argparse.Namespace) -> int:
    from sapptk.baselines import distinct_recomputes
    from sapptk.plan import even_split, load_plan, load_plans

    profile = resolve_profile(args.profile)
    if args.schedule_csv is not None:
        config = _csv_config(args, profile)
    elif args.stages is None or args.micro_batches is None:
        raise ConfigError("--stages and --micro-batches are required (unless --schedule-csv gives them)")
    else:
        config = pipeline_config(args, profile)
    if args.config is None and args.schedule_csv is None:
        raise ConfigError("nothing to simulate: give --config (MindFormers configs) and/or --schedule-csv")
    if args.config is None:
        plans = {f"even_split({mode})": even_split(profile, config, mode)
                 for mode in distinct_recomputes(profile, config)}
    elif args.name is not None:
        plan = load_plan(args.config, "mindformers", profile=profile, config=config, name=args.name)
        plans = {plan.source.removeprefix("mindformers:"): plan}
    else:
        plans = load_plans(args.config, "mindformers", profile=profile, config=config)
    rows = []
    for name, plan in plans.items():
        sim = plan.simulation
        peak = sim.peak_memory
        rows.append(
            {
                "name": name,
                "step_ms": round(sim.step_time, 1),
                "bubble": f"{sim.bubble.of_compute:.1%}",
                "max_peak_mb": round(float(peak.max()), 1),
                "on_device": int(peak.idxmax()),
                "fits": _yes(plan.fits),
            }
        )
    print(_setup_line(profile, config))
    print(_table(pd.DataFrame(rows)))
    print("bubble: idle time over busy time, all devices")
    return 0


# ------------------------------------------------------------------------------- export
EXPORT_FORMATS = ("megatron", "torchtitan", "torchtitan-py", "mindformers", "torch-csv")


def _add_export(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "export",
        help="write a saved plan for another runtime",
        description="Read a sapptk plan file (sapptk balance --out writes sapptk_plan.yaml; plan.export('sapptk')) "
        "and write it as Megatron-LM arguments, torchtitan settings (a TOML fragment for torchtitan <= 0.2.2 and a "
        "config module for >= 0.3, both written with --out; torchtitan-py prints the module), MindFormers lists, or "
        "the op order as PyTorch's schedule CSV: plan.export(format, path) in the library. What a runtime cannot "
        "express is listed, with the step time it costs.",
    )
    parser.add_argument("plan", metavar="PLAN", type=Path, help="sapptk plan file (YAML)")
    parser.add_argument("--to", required=True, choices=EXPORT_FORMATS, help="target format")
    parser.add_argument("--out", type=Path, default=None, metavar="FILE",
                        help="write there instead of printing (torchtitan, torchtitan-py: FILE's stem names the "
                        "TOML, the Python config and, when needed, the schedule CSV, written side by side)")
    parser.set_defaults(func=_export)


def _export(args: argparse.Namespace) -> int:
    from sapptk import checks
    from sapptk.plan import load_plan

    if args.out is not None:  # a folder or a FIFO (which would block) is refused before the plan is read
        checks.output_file(args.out, "--out", error=FileError)
    plan = load_plan(args.plan, "sapptk")
    fmt = "torchtitan" if args.to == "torchtitan-py" else args.to
    # torchtitan: FILE's stem names the TOML, the Python config and the schedule CSV side by side; the TOML
    # names the CSV by its absolute path (torchtitan looks it up from the launch directory), the module by its
    # place next to itself
    export = plan.export(fmt, args.out)
    if args.out is not None:
        print("wrote " + ", ".join(str(p) for p in export.written.values()))
        return 0
    text = export.texts["python"] if args.to == "torchtitan-py" else export.text
    if fmt == "torchtitan" and "csv" in export.texts:
        text += f"\n# ---- {Path(export.data.csv_name).name} ----\n{export.texts['csv']}"
    print(text, end="")
    return 0


# ---------------------------------------------------------------------------- schedules
def _add_schedules(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser("schedules", help="list the available schedules")
    parser.set_defaults(func=_schedules)


def _schedules(args: argparse.Namespace) -> int:
    from sapptk.schedules import available

    table = available()
    print(_table(table[["name", "description", "constraints"]], left=("name", "description", "constraints")))
    return 0


# -------------------------------------------------------------------------------- sweep
def _add_sweep(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "sweep",
        help="balance every combination of the given setups; one row each in a Parquet dataset",
        description="Balance and simulate the product of the given values; print the best setup per memory "
        "budget. Rows go to --out as they finish; rerunning skips the points already there.",
    )
    parser.add_argument("profile", metavar="PROFILE", help="profile file, or a bundled name (llama2_70b, demo, ...)")
    group = parser.add_argument_group("grid (the product of these lists is swept)")
    group.add_argument("--stages", "-p", type=int, nargs="+", required=True, help="pipeline stages, p")
    group.add_argument("--micro-batches", "-m", type=int, nargs="+", required=True, help="micro-batches, m")
    group.add_argument("--chunks", "-v", type=int, nargs="+", default=[1], help="chunks per device, v (1)")
    group.add_argument("--schedule", nargs="+", default=["1f1b"], help="schedule names (1f1b)")
    group.add_argument("--splits", "-k", type=int, nargs="+", default=[1], help="sequence slices (1)")
    group.add_argument("--memory", nargs="+", default=[None], metavar="MB", type=_budget,
                       help="memory budgets per device, MB ('none': unlimited; default none)")
    group.add_argument("--constant", type=float, nargs="+", default=[0.0], metavar="MB", help="constant MB")
    group.add_argument("--comm", type=float, nargs="+", default=[0.0], metavar="MS", help="latency, ms")
    group.add_argument("--recompute", nargs="+", choices=(*MODES, "offload"), default=list(MODES), metavar="MODE",
                       help=f"modes the solver may use, one set for every point (default all: {' '.join(MODES)}; "
                       "'offload' allows activation offload, with --host-bandwidth)")
    group.add_argument("--host-bandwidth", type=_positive_bandwidth, nargs="+", default=[None], metavar="MB_PER_MS",
                       help="host links per device, MB/ms (default none)")
    _add_lever_args(group, "sweep")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR",
                        help="Parquet dataset directory (also the cache: finished points are skipped)")
    parser.add_argument("--executor", default="serial",
                        help="serial (default), processes, dask (a local cluster) or dask://HOST:PORT")
    parser.add_argument("--time-limit", type=_positive_seconds, default=None, metavar="S",
                        help="seconds for the whole sweep (default: no limit); points not started by then are "
                        "rows with status not_started")
    parser.add_argument("--point-time-limit", type=_point_seconds, default=30.0, metavar="S",
                        help="solver limit per point, s (30)")
    parser.add_argument("--workers", type=_workers, default=None,
                        help="solver threads per point (default: cores/parallel)")
    parser.add_argument("--seed", type=_seed, default=0, help="solver random seed (0)")
    parser.add_argument("--deterministic", action="store_true", help="deterministic solver runs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(func=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    from sapptk.sweeps import best, sweep

    profile = resolve_profile(args.profile)
    grid = {
        "stages": args.stages, "micro_batches": args.micro_batches, "chunks": args.chunks,
        "schedule": args.schedule, "splits": args.splits, "memory_budget": args.memory,
        "constant_memory": args.constant, "comm": args.comm, "recompute": tuple(args.recompute),
        "host_bandwidth": args.host_bandwidth, **_lever_values(args, "sweep"),
    }
    frame = sweep(profile, grid, executor=args.executor, time_limit=args.time_limit,
                  point_time_limit=args.point_time_limit, workers=args.workers,
                  cache=args.out, progress=not args.no_progress, seed=args.seed, deterministic=args.deterministic)
    counts = frame["status"].value_counts()
    print(f"profile {profile.name}: {len(frame)} points, "
          + ", ".join(f"{n} {s}" for s, n in counts.items() if n) + f"; rows in {args.out}")
    top = best(frame, by="memory_budget_mb")
    if top.empty:
        print("no plan for any point")
        return 1
    swept = [c for c in ("host_bandwidth_mb_per_ms", *(f.frame_column for f in SWEPT))
             if frame[c].nunique(dropna=False) > 1]  # the levers that differ between points
    cols = ["memory_budget_mb", "schedule", "stages", "micro_batches", "chunks", "splits", *swept, "step_time_ms",
            "bubble_of_compute", "peak_mb_max", "status", "gap"]
    table = top[cols].rename(columns={"memory_budget_mb": "budget_mb", "bubble_of_compute": "bubble"})
    table["budget_mb"] = table["budget_mb"].map(lambda b: "none" if pd.isna(b) else f"{b:g}")
    table = table.round({"step_time_ms": 1, "bubble": 3, "peak_mb_max": 0, "gap": 4})
    print("best setup per memory budget (least step time; bubble: idle / busy):")
    print(table.to_string(index=False))
    return 0


# ------------------------------------------------------------------------------- choose
def _positive_int(flag: str) -> Callable[[str], int]:
    """An argparse type: an integer >= 1 (argparse's message names ``flag``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = 0
        if value < 1:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= 1")
        return value

    parse.__name__ = flag
    return parse


def _int_list(text: str) -> list[int]:
    """``--tp 1,2,4,8``: positive integers."""
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected integers >= 1, comma-separated (e.g. 1,2,4,8)")
    return values


def _names(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _add_choose(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "choose",
        help="choose the setup to run (schedule, stages, chunks, micro-batches; tp, cp, ep, zero from a card)",
        description="Rank every setup of DEVICES devices for a global batch: proven bounds prune the setups that "
        "cannot win, the rest are balanced best-bound-first. From a model card and a GPU (--model, --gpu) tensor, "
        "context and expert parallelism and the optimizer sharding vary too; from a PROFILE only the pipeline. "
        "Prints the top setups, how many were pruned and whether the winner is proven; --out writes the winner's "
        "plan files, the ranking (choice.csv) and one page (choice.html).",
    )
    parser.add_argument("profile", metavar="PROFILE", nargs="?", default=None,
                        help="profile file, or a bundled name (llama2_70b, demo, ...); or give --model instead")
    from sapptk.models import SHARDINGS, available

    card = parser.add_argument_group("model card and GPU (docs/choose.md)")
    card.add_argument("--model", default=None, metavar="CARD|config.json",
                      help=f"a bundled card ({', '.join(available())}) or a Hugging Face config.json")
    card.add_argument("--gpu", "--hardware", dest="gpu", default=None, metavar="NAME",
                      help=f"hardware card, with --model ({', '.join(available('hardware'))})")
    for flag, what in (("--tp", "tensor"), ("--cp", "context"), ("--ep", "expert")):
        card.add_argument(flag, type=_int_list, default=None, metavar="N[,N...]",
                          help=f"{what} parallel sizes to consider, with --model (default: choose's)")
    card.add_argument("--zero", type=_names, default=None, metavar="NAME[,NAME...]",
                      help=f"optimizer shardings to consider, with --model ({', '.join(SHARDINGS)}; "
                      "default distributed)")
    parser.add_argument("--devices", type=_positive_int("devices"), required=True,
                        help="devices in all (tp x cp x stages x dp)")
    parser.add_argument("--global-batch", type=_positive_int("global-batch"), required=True,
                        help="samples per step over all dp copies")
    parser.add_argument("--seq-length", "--sequence-length", dest="seq_length", type=_positive_int("seq-length"),
                        default=None, metavar="S", help="tokens per sample (a card's profiles: 4096; tokens/s)")
    parser.add_argument("--micro-batch-size", type=_positive_int("micro-batch-size"), default=1,
                        help="samples per micro-batch (1)")
    parser.add_argument("--memory", type=_budget, default=None, metavar="MB",
                        help="budget per device, MB ('none'); with --model the GPU's memory by default")
    parser.add_argument("--schedule", nargs="+", default=None, help="schedules to consider (default: every fixed one)")
    parser.add_argument("--stages", "-p", type=int, nargs="+", default=None, help="stage counts (default: divisors)")
    parser.add_argument("--chunks", "-v", type=int, nargs="+", default=None, help="chunks per device (default 1-4)")
    parser.add_argument("--recompute", nargs="+", choices=MODES, default=None, metavar="MODE",
                        help=f"modes the solver may use (default all: {' '.join(MODES)})")
    parser.add_argument("--dp-bandwidth", type=_positive_bandwidth, default=None, metavar="MB_PER_MS",
                        help="link per device for the DP gradient all-reduce, MB/ms (default: the GPU's inter-node "
                        "link with --model, else not counted)")
    _add_lever_args(parser.add_argument_group("levers (docs/levers.md; every plan of the choice keeps them)"),
                    "choose")
    parser.add_argument("--time-limit", type=_positive_seconds, default=None, metavar="S",
                        help="seconds for the whole choice (default: until every setup is decided); setups not "
                        "decided by then are 'undecided' rows")
    parser.add_argument("--setup-time-limit", type=_seconds("setup_time_limit"), default=20.0, metavar="S",
                        help="solver limit per balanced setup, s (20)")
    parser.add_argument("--executor", default="serial",
                        help="serial (default), processes, dask (a local cluster) or dask://HOST:PORT")
    parser.add_argument("--cache", type=Path, default=None, metavar="DIR", help="Parquet cache: a rerun resumes")
    parser.add_argument("--top", type=_positive_int("top"), default=10, help="rows of the ranking to print (10)")
    parser.add_argument("--no-prove", action="store_true",
                        help="no longer bounds or second balances on balanced setups that kept a gap (throughput)")
    parser.add_argument("--no-tighten", action="store_true",
                        help="balance every setup the first bound does not prune, without tightening it first")
    parser.add_argument("--deterministic", action="store_true", help="deterministic bounds and solver runs")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="write the winner's plan there (sapptk_plan.yaml, plan.yaml, layout.csv, as balance "
                        "--out), the ranking (choice.csv) and the page (choice.html: ranking, Pareto front, the "
                        "winner's timeline)")
    parser.set_defaults(func=_choose)


def _choose_source(args: argparse.Namespace) -> tuple[Any, dict[str, Any], str]:
    """What ``choose`` is asked about: the profile or model card, its keyword arguments, and a line
    naming it. Bad combinations are refused here, before anything is estimated or solved."""
    card_flags = [f"--{name}" for name in ("gpu", "tp", "cp", "ep", "zero") if getattr(args, name) is not None]
    if args.model is None:
        if args.profile is None:
            raise ConfigError("choose: expected a PROFILE or --model CARD (a bundled card or a config.json) "
                              "with --gpu NAME")
        if card_flags:
            raise ConfigError(f"choose: {', '.join(card_flags)} only with --model (a model card); "
                              f"PROFILE {args.profile!r} fixes the layout")
        if args.memory is None:
            raise ConfigError("choose PROFILE: expected --memory MB (the budget per device, or 'none')")
        profile = resolve_profile(args.profile)
        return profile, {"sequence_length": args.seq_length}, f"profile {profile.name}"
    if args.profile is not None:
        raise ConfigError(f"choose: got both PROFILE {args.profile!r} and --model {args.model!r}: expected one")
    from sapptk.models import available
    from sapptk.models import hardware as hardware_card
    from sapptk.models.options import model_card

    if args.gpu is None:
        raise ConfigError(f"choose --model: expected --gpu NAME, one of {', '.join(available('hardware'))}")
    card = model_card(args.model)
    gpu = hardware_card(args.gpu)
    extra: dict[str, Any] = {"hardware": gpu}
    for name in ("tp", "cp", "ep", "zero"):
        values = getattr(args, name)
        if values is not None:
            extra[name] = values
    if args.seq_length is not None:
        extra["seq_length"] = args.seq_length
    return card, extra, f"model card {card.name} on {gpu.name}"


def _choose(args: argparse.Namespace) -> int:
    from sapptk.choosing import choose

    source, extra, what = _choose_source(args)
    if args.out is not None:
        writable_dir(args.out, what="output folder (--out)")
    choice = choose(source, devices=args.devices, global_batch=args.global_batch,
                    micro_batch_size=args.micro_batch_size, memory_budget=args.memory, schedules=args.schedule,
                    stages=args.stages, chunks=args.chunks, recompute=args.recompute, dp_bandwidth=args.dp_bandwidth,
                    time_limit=args.time_limit, **_lever_values(args, "choose"),
                    setup_time_limit=args.setup_time_limit, executor=args.executor, cache=args.cache,
                    progress=not args.no_progress, deterministic=args.deterministic, prove=not args.no_prove,
                    tighten=not args.no_tighten, **extra)
    table = choice.top(args.top).round({"step_time_ms": 1, "bound_ms": 1, "peak_mb_max": 0,
                                        "tokens_per_s_per_device": 1})
    print(f"{what}, {args.devices} devices, global batch {args.global_batch}:")
    print(table.to_string(index=False))
    print(choice.summary())
    if args.out is not None:
        written = _write_plan(choice.best, args.out)
        ranking = args.out / "choice.csv"
        write_text(ranking, choice.frame.to_csv(index=False), what="ranking")
        from sapptk.viz.choice_page import save_choice_page

        title = f"sapptk choose: {what}, {args.devices} devices, global batch {args.global_batch}"
        page = save_choice_page(choice, args.out / "choice.html", title=title)
        print(f"wrote the winner's plan ({', '.join(str(p) for p in written)}; sapptk export reads "
              f"{written[0]}), the ranking {ranking} and the page {page}")
    return 0


# ---------------------------------------------------------------------------- calibrate
def _layer_mapping(items: Sequence[str]) -> dict[str, str]:
    """``GROUP=REGEX`` options as ``{regex: group}``."""
    out = {}
    for item in items:
        group, sep, pattern = item.partition("=")
        if not sep or not group or not pattern:
            raise ConfigError(f"--layer {item!r}: expected GROUP=REGEX, e.g. body='layers\\.\\d+'")
        out[pattern] = group
    return out


def _trace_file(path: Path) -> Path:
    if not path.is_dir():
        return path
    files = sorted(p for p in path.iterdir() if p.name.endswith((".json", ".json.gz")))
    views = [p for p in files if p.name.startswith("trace_view")]
    if views:
        return views[0]
    if len(files) != 1:
        raise ConfigError(f"--trace {path}: holds {len(files)} trace files ({', '.join(p.name for p in files[:5])}): "
                          "expected one .json or .json.gz (or a trace_view.json); name the file instead")
    return files[0]


def _add_calibrate(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "calibrate",
        help="per-layer memory from dry-run peaks (and layer times from a trace): a profile",
        description="Fit parameter and activation MB per layer to the peaks dry runs reported (the reference "
        "calibration YAML, or a CSV with one row per run and device), by least squares with the live "
        "activations of each run's schedule; print the fit, the residual per stage and what the data cannot "
        "identify; optionally read layer times from a profiler trace and write the profile.",
    )
    parser.add_argument("source", metavar="CALIB", help="calibration YAML, or a CSV of observations")
    parser.add_argument("--trace", type=Path, metavar="PATH",
                        help="a profiler trace (torch.profiler JSON, MindSpore trace_view.json, any Chrome trace), "
                        "or a directory holding one")
    parser.add_argument("--layer", action="append", default=[], metavar="GROUP=REGEX",
                        help="layer names in the trace: GROUP is head, body or tail (repeat the option)")
    parser.add_argument("--micro-batches", type=int, default=None, help="micro-batches per step (MindSpore traces)")
    parser.add_argument("--skip-steps", type=int, default=None, help="trace steps to skip (default: the reader's)")
    parser.add_argument("--constant", choices=("auto", "yes", "no"), default="auto",
                        help="fit a constant per device: when identifiable (auto), always, never")
    parser.add_argument("--out", type=Path, metavar="FILE",
                        help="write the profile: .json (SAPP layer JSON) or .yaml (sapptk YAML)")
    parser.add_argument("--integers", action="store_true",
                        help="truncate MB figures to integers, as the reference tool writes them")
    parser.add_argument("--name", default=None, help="profile name (default: the file name)")
    parser.set_defaults(func=_calibrate)


def _calibrate(args: argparse.Namespace) -> int:
    from sapptk.calibration import calibrate, layer_times

    trace = None
    if args.trace is not None:
        if not args.layer:
            raise ConfigError("--trace needs --layer GROUP=REGEX (e.g. --layer body='layers\\.\\d+')")
        options = {}
        if args.micro_batches is not None:
            options["micro_batches"] = args.micro_batches
        if args.skip_steps is not None:
            options["skip_steps"] = args.skip_steps
        try:
            trace = layer_times(_trace_file(args.trace), _layer_mapping(args.layer), **options)
        except TypeError as exc:  # an option the trace's reader does not take, or one it needs
            raise ConfigError(f"--trace {args.trace}: {exc}") from None
    if args.out is not None and args.out.suffix.lower() not in (".json", ".yaml", ".yml"):
        raise ConfigError(f"--out {args.out}: expected a .json (SAPP layer JSON) or .yaml file")
    constant = {"auto": "auto", "yes": True, "no": False}[args.constant]
    cal = calibrate(args.source, constant=constant, trace=trace)
    print(cal.summary())
    if trace is not None:
        print(f"layer times from {trace.source} ({trace.format}):")
        print(trace.summary().round(4).to_string(index=False))
    if args.out is not None:
        profile = cal.to_profile(integers=args.integers, name=args.name)
        if args.out.suffix.lower() == ".json":
            profile.to_sapp_json(args.out)
        else:
            profile.to_yaml(args.out)
        print(f"profile written to {args.out}")
    return 0


def _add_design(commands: argparse._SubParsersAction) -> None:
    parser = commands.add_parser(
        "design",
        help="the fewest dry runs whose stage peaks identify every memory unknown",
        description="Propose dry-run configurations (MindFormers offset and recompute lists, one per run) whose "
        "peak memories identify parameter, activation per recompute mode, head, tail and constant memory.",
    )
    parser.add_argument("--stages", "-p", type=int, required=True, help="pipeline stages, p (>= 2)")
    parser.add_argument("--layers", type=int, required=True, help="body layers of the model, N")
    parser.add_argument("--modes", nargs="*", default=[], choices=[m for m in MODES if m != "none"], metavar="MODE",
                        help="recompute modes to calibrate besides none: select comm both full")
    parser.add_argument("--rounds", type=int, default=None, help="exactly this many dry runs (default: the fewest)")
    parser.add_argument("--seed", type=int, default=0, help="random seed of the search (0)")
    parser.set_defaults(func=_design)


def _design(args: argparse.Namespace) -> int:
    from sapptk.calibration import design

    d = design(args.stages, args.layers, args.modes, rounds=args.rounds, seed=args.seed)
    print(f"{len(d.rounds)} dry run(s) of p={d.stages}, N={d.layers} ({d.schedule}, m={d.micro_batches}) identify "
          f"{len(d.unknowns)} unknowns: {', '.join(d.unknowns)}")
    if d.folded:
        print(f"not identifiable by any design with p={d.stages}: {', '.join(d.folded)} (head and tail absorb it)")
    print(f"condition number {d.condition:.4g} (columns scaled to unit length; 1 is ideal)")
    print("record every stage's peak memory of each run:")
    print(d.to_yaml().rstrip())
    return 0


# --------------------------------------------------------------------------------- main
def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every command."""
    parser = argparse.ArgumentParser(
        prog="sapptk",
        description="Plan pipeline-parallel training: balance layers and recompute, simulate schedules.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_balance(commands)
    _add_simulate(commands)
    _add_export(commands)
    _add_schedules(commands)
    _add_sweep(commands)
    _add_choose(commands)
    _add_calibrate(commands)
    _add_design(commands)
    _add_estimate(commands)
    from sapptk.trials.cli import add_trials  # `sapptk trials plan|ingest` (sapptk/trials/cli.py)

    add_trials(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 no plan, 2 bad input)."""
    _escape_unencodable_output()
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse: --help (0) or a usage error (2), already printed
        return exc.code if isinstance(exc.code, int) else 2
    try:
        return args.func(args)
    except SapptkError as exc:
        print(f"sapptk {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"sapptk {args.command}: error: {exc}", file=sys.stderr)
        return 2


def _escape_unencodable_output() -> None:
    """Print what the terminal cannot encode (a file name with bytes that are not UTF-8,
    which Python holds as lone surrogates) as backslash escapes instead of failing."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
