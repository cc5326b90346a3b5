"""``sapptk trials plan|ingest``: the trials from the command line.

``sapptk trials plan PROFILE --devices N --global-batch B --out DIR [-k 3] ...`` chooses (as
``sapptk.choose``) and writes the trial folders of the ``k`` best setups, and the choice's
arguments in ``DIR/choose.json``. Run each folder's ``launch.sh``. ``sapptk trials ingest DIR``
reads the runs, prints what was measured and fitted, and, when ``DIR/choose.json`` is there,
chooses again (same arguments, same seed) and prints the re-ranking.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["add_trials"]


def _names(text: str | None) -> list[str] | None:
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def _ints(text: str | None) -> list[int] | None:
    return None if text is None else [int(t) for t in _names(text) or []]


def _choose(arguments: dict[str, Any]) -> Any:
    from sapptk.choosing import choose

    return choose(arguments["profile"], devices=arguments["devices"], global_batch=arguments["global_batch"],
                  memory_budget=arguments["memory_budget"], schedules=arguments["schedules"],
                  stages=arguments["stages"], time_limit=arguments["time_limit"],
                  setup_time_limit=arguments["setup_time_limit"], seed=0, deterministic=True)


def _plan(args: argparse.Namespace) -> int:
    from sapptk.trials.planning import plan

    arguments = {"profile": args.profile, "devices": args.devices, "global_batch": args.global_batch,
                 "memory_budget": args.memory_budget, "schedules": _names(args.schedules),
                 "stages": _ints(args.stages), "time_limit": args.time_limit,
                 "setup_time_limit": args.setup_time_limit}
    choice = _choose(arguments)
    folders = plan(choice, k=args.k, steps=args.steps, warmup=args.warmup, out=args.out, device=args.device)
    (Path(args.out) / "choose.json").write_text(json.dumps(arguments, indent=1), encoding="utf-8")
    print(choice.summary())
    for folder in folders:
        print(f"trial: {folder}  (run: bash {folder / 'launch.sh'})")
    return 0


def _ingest(args: argparse.Namespace) -> int:
    from sapptk.trials.ingesting import ingest
    from sapptk.trials.ranking import rerank

    calibrated = ingest(args.folder)
    print(calibrated.summary())
    saved = Path(args.folder) / "choose.json"
    if saved.exists():
        print(rerank(_choose(json.loads(saved.read_text(encoding="utf-8"))), calibrated).summary())
    return 0


def add_trials(commands: Any) -> None:
    """Register ``sapptk trials`` on the command line's subparsers."""
    parser = commands.add_parser("trials", help="trial the best setups of a choice on a real runtime, then re-rank",
                                 description=__doc__.split("\n\n")[1])
    sub = parser.add_subparsers(dest="trials_command", required=True, metavar="STEP")
    p = sub.add_parser("plan", help="choose, then write one trial folder per top setup")
    p.add_argument("profile", help="a profile file or bundled profile name")
    p.add_argument("--devices", type=int, required=True)
    p.add_argument("--global-batch", type=int, required=True)
    p.add_argument("--memory-budget", type=float, default=None, help="MB per device (default: unlimited)")
    p.add_argument("--schedules", default=None, help="comma-separated schedules (default: all)")
    p.add_argument("--stages", default=None, help="comma-separated stage counts (default: every divisor)")
    p.add_argument("--time-limit", type=float, default=None, help="seconds for the whole choice (default: none)")
    p.add_argument("--setup-time-limit", type=float, default=10.0, help="seconds per balanced setup")
    p.add_argument("-k", type=int, default=3, help="setups to trial (default 3)")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--device", choices=("auto", "cpu"), default="auto")
    p.add_argument("--out", required=True, help="a new folder for the trials")
    p.set_defaults(func=_plan)
    i = sub.add_parser("ingest", help="read the trials' runs, fit the costs, re-rank")
    i.add_argument("folder", help="the folder `sapptk trials plan` wrote")
    i.set_defaults(func=_ingest)
