"""A fresh fuzz campaign against sapptk's boundary: profiles (dicts and files), MindFormers
configs, pipeline configs, calibration files, ``simulate`` and ``balance`` arguments, sweep
caches and arguments, and the command line.

Every input must give a clear sapptk error (a ``SapptkError``, or exit code 2 with a
message and no traceback from the CLI) or a correct result (checked by an oracle per
entry point); anything else is counted:

``ok``     a result, and the oracle agrees;
``clear``  a clear error;
``raw``    a raw exception from inside (or a crashed worker, or a CLI traceback);
``hang``   no answer within ``--timeout`` seconds;
``wrong``  a result the oracle refutes (e.g. negative peaks, a lost sweep row, a CLI that
           solved before refusing its output folder).

Inputs run one at a time in a worker process (its address space capped by ``--memory-gb``,
so a memory bomb is a ``MemoryError``, not a swapping machine); a worker that hangs or dies
is replaced. The campaign is random but replays from ``--seed`` (printed). Only public entry
points are used, so the same script measures an older checkout too::

    python benchmarks/fuzz.py --inputs 400 --seed 7
    PYTHONPATH=/path/to/old/checkout python benchmarks/fuzz.py --inputs 400 --seed 7
    python benchmarks/fuzz.py --surfaces new --inputs 1000 --seed 22
    python benchmarks/fuzz.py --surfaces cards,estimate,choose,request,seq,formats,calibrate,cli --inputs 1000

``--surfaces new`` fuzzes the surfaces added since the first round (profiler traces,
calibration sizes, ``design``, schedule CSV, Megatron and torchtitan import, plan files,
``to_chrome_trace`` targets, degenerate setups, safe budgets, and the commands that wrap them),
with the generators and oracles of ``tests/fuzz_surfaces.py`` and ``tests/fuzz_runs.py``;
``all`` runs both campaigns. A comma list of ``cards``, ``estimate``, ``choose``, ``request``,
``seq``, ``formats``, ``calibrate`` and ``cli`` fuzzes the newest surfaces (issue 34), with the
generators and oracles of ``tests/fuzz_round3.py`` (its docstring lists the oracles).

Figures depend on the machine's load only through ``hang`` (a generous bound).

(Over 500 lines: one script holds the first round's generators, oracles, the worker and the
parent, so that it measures an older checkout with nothing else; the newer surfaces'
generators and oracles live next to the tests that share them.)
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import copy
import json
import math
import os
import random
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUTCOMES = ("ok", "clear", "raw", "hang", "wrong")
sys.path.insert(0, str(ROOT / "tests"))  # the new surfaces' generators and oracles live with the tests

EXTREME_INTS = [0, -1, 1, 2**31, 2**53 + 1, 2**62, 2**63, 2**64, -(2**63) - 1, 10**30, 10**400]
EXTREME_FLOATS = [-0.0, 1e-300, 5e-324, 1e300, -1e300, math.inf, -math.inf, math.nan, 2.5, 1e8]
JUNK: list[Any] = [None, True, False, "", "1", "nan", "x\x00y", "\udcff", [], [1], {}, {"a": 1}, [[[]]]]
MODES = ["none", "select", "comm", "both", "full"]
SCHEDULES = ["gpipe", "1f1b", "interleaved", "interleaved-lm", "dualpipe-v", "seq1f1b", "zb-h1", "zb-v"]


# =============================================================================== inputs
def weird(r: random.Random) -> Any:
    return r.choice(EXTREME_INTS + EXTREME_FLOATS + JUNK)


def maybe(r: random.Random, value: Any, rate: float = 0.12) -> Any:
    return weird(r) if r.random() < rate else value


def _sapp_entry(r: random.Random, kind: str, name: str, count: int | None = None) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": name, "type": kind, "nb_layer": count or r.randint(1, 12),
                             "time": round(r.uniform(1, 300), 3), "memory_parameter": round(r.uniform(1, 5000), 1)}
    if kind == "BODY" or r.random() < 0.2:
        for key in r.sample(["memory_activation", "memory_select_rec", "memory_select_comm",
                             "memory_both_comm_select", "memory_recompute"], r.randint(1, 5)):
            entry[key] = round(r.uniform(0, 2000), 1)
    if r.random() < 0.3:
        entry[r.choice(["backward_time", "recompute_time", "recompute_coef", "select_rec_coef", "forward_time"])] = (
            round(r.uniform(0, 3), 3))
    return entry


def profile_dict(r: random.Random) -> dict[str, Any]:
    """A plausible SAPP profile, then 0-3 corruptions."""
    groups = r.choice([1, 1, 2, 3, 20, 60]) if r.random() < 0.9 else r.randint(100, 400)
    entries = [_sapp_entry(r, "HEAD", "emb")] if r.random() < 0.8 else []
    entries += [_sapp_entry(r, "BODY", f"b{i}", 1 if groups >= 20 else None) for i in range(groups)]
    if r.random() < 0.8:
        entries.append(_sapp_entry(r, "TAIL", "out"))
    data: dict[str, Any] = {"name": "fuzz", "layers_description": entries}
    for _ in range(r.choice([0, 1, 1, 2, 3])):
        entry = r.choice(entries) if entries else data
        action = r.random()
        if action < 0.55 and entry:
            entry[r.choice(list(entry))] = weird(r)
        elif action < 0.7 and entry:
            del entry[r.choice(list(entry))]
        elif action < 0.8:
            entry["nb_layer"] = r.choice([10**4, 10**6, 10**7, 2**62])
        elif action < 0.9:
            entries.insert(r.randint(0, len(entries)), copy.deepcopy(r.choice(entries)) if entries else {})
        else:
            data[r.choice(["layers_description", "name", "groups", "format"])] = weird(r)
    return data


def _dump(r: random.Random, data: Any) -> tuple[str, bytes]:
    import yaml

    if r.random() < 0.5:
        return ".json", json.dumps(data, indent=1).encode("utf-8", "surrogatepass")
    try:
        return ".yaml", yaml.safe_dump(data, allow_unicode=True).encode("utf-8", "surrogatepass")
    except yaml.YAMLError:
        return ".json", json.dumps(data).encode("utf-8", "surrogatepass")


SPLICES = [b"\x00", b"\xff\xfe", b"\xe9", b"[" * 3000, b"{" * 120, b"&a [1]", b"*a", b"!!python/object:os.x", b"\x07",
           b"1e999", b"9" * 5000, b'"\\ud800"', b"{", b"}", b"- ", b": ", b"\n---\n", b"\t", b"NaN", b"-1",
           b"!!binary aGk=", b"<<: *a"]


def mutate(r: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(r.randint(1, 4)):
        at = r.randint(0, len(out))
        piece = r.choice(SPLICES) if r.random() < 0.7 else bytes(r.getrandbits(8) for _ in range(r.randint(1, 6)))
        action = r.random()
        if action < 0.4:
            out[at:at] = piece
        elif action < 0.7:
            out[at : at + len(piece)] = piece
        elif action < 0.9:
            del out[at : at + r.randint(1, 30)]
        else:
            del out[at:]
    return bytes(out)


SPECIAL_FILES = ["fifo", "dev_zero", "directory", "missing", "sparse_huge", "deep_json", "deep_yaml", "bomb",
                 "symlink_loop", "nul_in_path", "non_utf8_name", "utf16", "latin1", "many_nodes", "int_path",
                 "huge_flat_list"]


def mindformers_dict(r: random.Random, rows: int, cols: int) -> dict[str, Any]:
    def cell() -> Any:
        return r.choice([0, 0, 1, -1, 2, 3]) if r.random() < 0.85 else weird(r)

    def grid() -> Any:
        shape_rows = rows + (r.choice([-1, 1]) if r.random() < 0.1 else 0)
        shape_cols = cols + (r.choice([-1, 1]) if r.random() < 0.1 else 0)
        table = [[cell() for _ in range(max(0, shape_cols))] for _ in range(max(0, shape_rows))]
        return table[0] if rows == 1 and r.random() < 0.5 and table else table

    config: dict[str, Any] = {}
    for key in r.sample(["offset", "recompute", "select_recompute", "select_comm_recompute"], r.randint(0, 4)):
        config[key] = grid() if r.random() < 0.8 else r.choice([True, False, None, 0, weird(r)])
    if r.random() < 0.1:
        config[r.choice(["offest", "pipeline_stage", 3])] = weird(r)
    if r.random() < 0.15:
        config = {"model": {"model_config": {"offset": config.get("offset"), "num_layers": maybe(r, 96, 0.3)}},
                  "recompute_config": {k: v for k, v in config.items() if k != "offset"}}
    if r.random() < 0.1:
        config = {"named": config, "other": maybe(r, {}, 0.5)}
    return config


def pipeline_fields(r: random.Random) -> dict[str, Any]:
    schedule = r.choice(SCHEDULES)
    stages = r.randint(1, 6)
    chunks = 2 if schedule in ("dualpipe-v", "zb-v") else (r.choice([1, 2, 3]) if "interleaved" in schedule else 1)
    low = 2 * stages if schedule == "dualpipe-v" else stages
    return {
        "stages": maybe(r, stages), "micro_batches": maybe(r, r.randint(low, 3 * low + 4)), "chunks": maybe(r, chunks),
        "schedule": maybe(r, schedule), "splits": maybe(r, r.choice([1, 2]) if schedule == "seq1f1b" else 1),
        "memory_budget": maybe(r, r.choice([None, 1e5, 5e4])), "constant_memory": maybe(r, r.choice([0, 100.0])),
        "comm": maybe(r, r.choice([0, 0.5])), "recompute": maybe(r, tuple(r.sample(MODES, r.randint(1, 5)))),
    }


def simulate_args(r: random.Random) -> dict[str, Any]:
    def cost() -> Any:
        return r.choice([1.0, 2.5, [1.0, 2.0, 3.0, 4.0], 0]) if r.random() < 0.7 else weird(r)

    return {"program": "ok" if r.random() < 0.85 else weird(r), "forward": cost(), "backward": cost(),
            "weight": cost(), "activation": cost(), "params": cost(), "comm": maybe(r, 0.1, 0.3),
            "constant": maybe(r, 1.0, 0.3), "weight_holds": maybe(r, 0.5, 0.3)}


def mutate_tree(r: random.Random, data: Any) -> Any:
    """Nested data with one leaf (or branch) replaced by a weird value, or removed."""
    import fuzz_surfaces

    return fuzz_surfaces.mutate_tree(r, data, odd=weird, delete=0.2)


def calibration_case(r: random.Random) -> dict[str, Any]:
    import yaml

    text = (ROOT / "data" / "calibration" / r.choice(["init_demo.yaml", "init_demo_pp4_rounds.yaml"])).read_bytes()
    if r.random() < 0.5:
        return {"bytes": base64.b64encode(mutate(r, text)).decode()}
    data = yaml.safe_load(text)
    for _ in range(r.randint(1, 2)):
        data = mutate_tree(r, data)
    try:
        dumped = yaml.safe_dump(data, allow_unicode=True).encode("utf-8", "surrogatepass")
    except yaml.YAMLError:
        dumped = json.dumps(data).encode("utf-8", "surrogatepass")
    return {"bytes": base64.b64encode(dumped).decode()}


CACHE_DAMAGE = ["truncated_part", "foreign_parquet", "text_part", "directory_part", "garbage_journal", "foreign_file",
                "empty_part", "cache_is_file", "missing_columns", "bad_key_types", "nested_missing"]


def make_campaign(seed: int, size: int, surfaces: str = "first") -> list[dict[str, Any]]:
    """``size`` inputs (at least), by category, replaying from ``seed``: the first round's
    surfaces, the ``new`` ones (``tests/fuzz_surfaces.py`` and the commands that wrap them) or ``all``."""
    if surfaces not in ("first", "new", "all"):  # a list of the newest surfaces (tests/fuzz_round3.py) and "cli"
        import fuzz_round3

        names = tuple(n for n in surfaces.split(",") if n in fuzz_round3.SURFACES)
        r = random.Random(seed)
        cli = "cli" in surfaces.split(",")
        cases = fuzz_round3.make_cases(seed, round(size * (0.92 if cli else 1.0)), names) if names else []
        if cli:
            cases += [{"cat": "cli_r3", "data": cli_round3_argv(r)} for _ in range(max(1, round(size * 0.08)))]
        r.shuffle(cases)
        for i, case in enumerate(cases):
            case["id"] = i
        return cases
    if surfaces != "first":
        import fuzz_surfaces

        r = random.Random(seed)
        cases = fuzz_surfaces.make_cases(seed, round(size * 0.95))
        cases += [{"cat": "cli_new", "data": cli_new_argv(r)} for _ in range(max(1, round(size * 0.05)))]
        if surfaces == "all":
            cases += make_campaign(seed, size)
        r.shuffle(cases)
        for i, case in enumerate(cases):
            case["id"] = i
        return cases
    r = random.Random(seed)
    share = {"profile_dict": 0.15, "profile_file": 0.15, "special_file": 0.05, "mindformers": 0.13,
             "mindformers_file": 0.05, "pipeline": 0.12, "calibration": 0.05, "simulate": 0.06, "cache": 0.07,
             "cli": 0.1, "balance": 0.03, "sweep": 0.04}
    cases: list[dict[str, Any]] = []
    for cat, part in share.items():
        for _ in range(max(1, round(size * part))):
            if cat == "profile_dict":
                data: Any = profile_dict(r)
            elif cat == "profile_file":
                suffix, text = _dump(r, profile_dict(r))
                text = mutate(r, text) if r.random() < 0.75 else text
                data = {"suffix": suffix, "bytes": base64.b64encode(text).decode()}
            elif cat == "special_file":
                data = r.choice(SPECIAL_FILES)
            elif cat == "mindformers":
                which = r.randint(0, 1)
                data = {"setup": which, "config": mindformers_dict(r, *((1, 4) if which == 0 else (2, 2)))}
            elif cat == "mindformers_file":
                suffix, text = _dump(r, mindformers_dict(r, 1, 4))
                data = {"suffix": suffix, "bytes": base64.b64encode(mutate(r, text) if r.random() < 0.6
                                                                    else text).decode()}
            elif cat == "pipeline":
                data = pipeline_fields(r)
            elif cat == "calibration":
                data = calibration_case(r)
            elif cat == "simulate":
                data = simulate_args(r)
            elif cat == "cache":
                data = r.choice(CACHE_DAMAGE)
            elif cat == "cli":
                data = cli_argv(r)
            elif cat == "balance":
                data = {"time_limit": r.choice([-1, 0, math.nan, math.inf, "5", 2, 2, 2**40]),
                        "workers": r.choice([-1, 0, 1, 2, 2**40, 2.5]), "seed": r.choice([0, -1, 2**31, 2**40, 1.5]),
                        "budget": r.choice([None, 1e5, -5])}
            else:
                data = {"executor": r.choice(["serial", "threads", "dask://127.0.0.1:9", "dask://nowhere", 42]),
                        "time_limit": r.choice([5, -1, math.nan, math.inf]),
                        "grid": r.choice(["small", "huge", "bad_field", "string"]),
                        "workers": r.choice([None, 0, -1, 1])}
            cases.append({"cat": cat, "data": data})
    r.shuffle(cases)
    for i, case in enumerate(cases):
        case["id"] = i
    return cases


def cli_argv(r: random.Random) -> list[str]:
    setup = ["-p", "4", "-m", "8"]
    choices: list[list[str]] = [
        ["balance", "demo", *setup, "--time-limit", r.choice(["nan", "-1", "0", "inf", "1e400", "2"])],
        ["balance", "demo", *setup, "--time-limit", "2", "--out", "{existing_file}"],
        ["balance", "demo", *setup, "--time-limit", "2", "--out", "/proc/sapptk-fuzz/out"],
        ["balance", "demo", *setup, "--time-limit", "2", "--workers", r.choice(["-1", "0", "99999999999"])],
        ["balance", "demo", *setup, "--time-limit", "2", "--seed", r.choice(["-1", "4294967296", "99999999999999"])],
        ["balance", "demo", "-p", r.choice(["0", "-3", "1000000000000", "99999"]), "-m", "8", "--time-limit", "2"],
        ["balance", "demo", *setup, "--memory", r.choice(["nan", "-5", "1e400", "0", "1e300"]), "--time-limit", "2"],
        ["balance", "{non_utf8_profile}", *setup, "--time-limit", "2", "--out", "{non_utf8_dir}"],
        ["simulate", "{non_utf8_profile}", "--config", "{manual}", *setup],
        ["simulate", "llama2_70b", "--config", "{bad_mf}", *setup],
        ["simulate", "{bad_profile}", "--config", "{manual}", *setup],
        ["balance", "{bad_profile}", *setup, "--time-limit", "2"],
        ["sweep", "demo", *setup, "--out", "{existing_file}", "--no-progress", "--time-limit", "2"],
        ["sweep", "demo", *setup, "--out", "{fresh_dir}", "--executor", r.choice(["dask://127.0.0.1:9", "threads"]),
         "--no-progress", "--time-limit", "2"],
        ["sweep", "demo", *setup, "--out", "{fresh_dir}", "--memory", r.choice(["lots", "-1", "nan"]), "--no-progress"],
        ["simulate", "demo", "--config", "{fifo}", *setup],
        ["balance", "{dev_zero_json}", *setup],
        ["balance", "demo", "-p", "4", "-m", r.choice(["8", "x", "1e3", ""]), "--chunks", r.choice(["0", "2", "-1"])],
    ]
    return r.choice(choices)


def cli_new_argv(r: random.Random) -> list[str]:
    """Command lines of the new surfaces: design, calibrate with a trace, export of plan files."""
    choices: list[list[str]] = [
        ["design", "-p", r.choice(["4", "0", "1000000", "-3", "x"]), "--layers", r.choice(["16", "1" + "0" * 30]),
         *(["--rounds", r.choice(["1000000", "0", "2"])] if r.random() < 0.5 else []),
         *(["--seed", r.choice(["-1", "0", "99999999999999999999999"])] if r.random() < 0.5 else [])],
        ["calibrate", "{calibration}", "--trace", "{bad_trace}", "--layer", r.choice(["body=layer", "body=((", "x"])],
        ["calibrate", "{calibration}", "--trace", "{good_trace}", "--layer", "body=layer\\d",
         "--skip-steps", r.choice(["0", "-1", "99999999999999999999"])],
        ["export", r.choice(["{plan}", "{bad_plan}"]), "--to", r.choice(["megatron", "torchtitan", "mindformers",
                                                                         "torch-csv"]),
         *(["--out", r.choice(["{fifo}", "{fresh_dir}", "{out_file}", "/proc/sapptk-fuzz/x"])] if r.random() < 0.6
           else [])],
        ["balance", "demo", "-p", "1", "-m", r.choice(["1", "2"]), "--time-limit", "2"],
    ]
    return r.choice(choices)


def cli_round3_argv(r: random.Random) -> list[str]:
    """Command lines of the newest surfaces: estimate, choose, export, balance's limits."""
    odd = ["0", "-1", "1e400", "nan", "x", "1" + "0" * 400, "2.5", ""]
    choices: list[list[str]] = [
        ["estimate", "--model", r.choice(["llama2-7b", "gpt2", "nope", "{long_path}", "{fifo}"]),
         *(["--tp", r.choice(odd + ["2"])] if r.random() < 0.4 else []),
         *(["--seq-length", r.choice(odd + ["4096"])] if r.random() < 0.4 else []),
         *(["--out", r.choice(["{fifo}", "{fresh_dir}", "{dev_link}", "{out_yaml}"])] if r.random() < 0.5 else [])],
        ["choose", "demo", "--devices", r.choice(["4", "0", "x", "2147483648"]),
         "--global-batch", r.choice(["8", "-1"]),
         "--memory", r.choice(["100000", "nan", "-5"]), "--time-limit", r.choice(["0.5", "1e400", "0", "nan"]),
         "--schedule", "1f1b"],
        ["export", "{plan}", "--to", r.choice(["megatron", "torchtitan", "mindformers", "torch-csv"]),
         "--out", r.choice(["{fifo}", "{fresh_dir}", "{dev_link}", "{out_file}"])],
        ["balance", "demo", "-p", "2", "-m", "4", "--time-limit", r.choice(["1e400", "0.5", "-0", "inf"]),
         *(["--out", r.choice(["{dev_link}", "{fifo}"])] if r.random() < 0.5 else [])],
    ]
    return r.choice(choices)


def _new_cli_files(folder: Path) -> dict[str, str]:
    """Files the new surfaces' command lines name (a plan, a damaged plan, traces)."""
    import yaml

    from sapptk import PipelineConfig
    from sapptk.plan import even_split
    from sapptk.profile import bundled_profile

    plan = folder / "plan.yaml"
    if not plan.exists():
        text = even_split(bundled_profile("demo"), PipelineConfig(2, 4)).export("sapptk").text
        plan.write_text(text)
        data = yaml.safe_load(text)
        data["status"], data["step_time_ms"] = "optimal", data["step_time_ms"] / 2
        (folder / "bad_plan.yaml").write_text(yaml.safe_dump(data))
        good = [{"ph": "X", "name": f"layer{i % 3}", "pid": 1, "tid": 1, "ts": 10 * i, "dur": 5} for i in range(9)]
        (folder / "good_trace.json").write_text(json.dumps({"traceEvents": good}))
        bad = good + [{"ph": "X", "name": "layer0", "pid": 1, "tid": 1, "ts": 99, "dur": -5}]
        (folder / "bad_trace.json").write_text(json.dumps({"traceEvents": bad}))
    return {"{plan}": str(plan), "{bad_plan}": str(folder / "bad_plan.yaml"),
            "{good_trace}": str(folder / "good_trace.json"), "{bad_trace}": str(folder / "bad_trace.json"),
            "{calibration}": str(ROOT / "data" / "calibration" / "init_demo.yaml"),
            "{out_file}": str(folder / "out.txt")}


# =============================================================================== oracles
class Wrong(Exception):
    """A result that the oracle refutes."""


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise Wrong(what)


def check_plan(plan: Any) -> None:
    import numpy as np

    expect((plan.counts >= 0).all(), "negative layer counts")
    expect(plan.counts.sum(axis=(1, 2)).tolist() == [g.count for g in plan.profile.body], "layers lost or doubled")
    sim = plan.simulation
    expect(math.isfinite(sim.step_time) and sim.step_time >= 0, f"step time {sim.step_time}")
    expect(abs(sim.step_time - plan.step_time) <= 1e-6 * max(1.0, sim.step_time), "prediction != simulation")
    peaks = sim.peak_memory.to_numpy()
    expect(bool(np.isfinite(peaks).all() and (peaks >= 0).all()), f"peaks {peaks[:4]}")
    expect(bool((sim.summary["busy_ms"] <= sim.step_time * (1 + 1e-9) + 1e-6).all()), "a device busier than the step")


def check_profile(profile: Any) -> None:
    expect(bool(profile.body), "no body")
    for g in profile.groups:
        expect(g.count >= 1 and math.isfinite(g.forward) and g.forward >= 0, f"group {g.name}")
        for c in g.modes.values():
            expect(math.isfinite(c.backward) and c.backward >= 0 and math.isfinite(c.activation) and c.activation >= 0,
                   "mode cost")


def simulate_even(profile: Any) -> None:
    from sapptk.config import PipelineConfig
    from sapptk.plan import even_split

    config = PipelineConfig(2, 4, memory_budget=1e6)
    config.check(profile)
    check_plan(even_split(profile, config, "auto"))


# ================================================================================ worker
def bench_solve(task: dict[str, Any]) -> dict[str, Any]:
    """A solve stand-in for cache cases: a closed form of the point."""
    c = task["config"]
    return {"status": "optimal", "step_time_ms": float(c["stages"] * 10 + c["micro_batches"]), "bound_ms": 1.0,
            "gap": 0.0, "peak_mb": [1.0] * int(c["stages"]), "peak_mb_max": 1.0}


def special_file(kind: str, folder: Path) -> Path:
    path = folder / "profile.json"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        return Path("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    elif kind == "missing":
        pass
    elif kind == "sparse_huge":
        with path.open("wb") as handle:
            handle.truncate(200 * 1024 * 1024)
    elif kind == "deep_json":
        path.write_text("[" * 200_000 + "]" * 200_000)
    elif kind == "deep_yaml":
        path = folder / "profile.yaml"
        path.write_text("groups: " + "[" * 50_000 + "]" * 50_000)
    elif kind == "bomb":
        path = folder / "profile.yaml"
        lines = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
        lines += [f"{c}: &{c} [{', '.join([f'*{p}'] * 9)}]" for p, c in zip("abcdefgh", "bcdefghi", strict=True)]
        path.write_text("\n".join(lines) + "\ngroups: [*i]\n")
    elif kind == "symlink_loop":
        path.symlink_to(path)
    elif kind == "nul_in_path":
        return Path(str(path) + "\x00x")
    elif kind == "non_utf8_name":
        name = os.fsdecode(b"prof\xffile.json")
        path = folder / name
        path.write_bytes((ROOT / "data" / "demo.json").read_bytes())
    elif kind == "utf16":
        path.write_bytes((ROOT / "data" / "demo.json").read_text().encode("utf-16"))
    elif kind == "latin1":
        path.write_bytes((ROOT / "data" / "demo.json").read_text().replace("demo", "d\xe9mo").encode("latin-1"))
    elif kind == "many_nodes":
        path = folder / "profile.yaml"
        path.write_text("groups: [" + ", ".join(["1"] * 1_000_000) + "]\n")
    elif kind == "huge_flat_list":
        path.write_text('{"layers_description": [' + ", ".join(["1"] * 2_000_000) + "]}")
    elif kind == "int_path":
        return 42  # type: ignore[return-value]
    return path


def damaged_cache(kind: str, folder: Path) -> tuple[Path, int]:
    """A cache with rows for 6 points, then damaged; returns (cache, good rows that must survive)."""
    import pandas as pd

    from sapptk.profile import bundled_profile
    from sapptk.sweeps import sweep

    cache = folder / "cache"
    grid = {"stages": [2, 4, 8], "micro_batches": [8, 16]}
    sweep(bundled_profile("demo"), grid, solve=bench_solve, cache=cache, progress=False)
    parts = sorted(cache.glob("part-*.parquet"))
    good = 6
    if kind == "truncated_part":
        parts[0].write_bytes(parts[0].read_bytes()[:200])
        good = 0
    elif kind == "foreign_parquet":
        pd.DataFrame({"x": [1, 2, 3]}).to_parquet(cache / "part-9-foreign.parquet")
    elif kind == "text_part":
        (cache / "part-9-text.parquet").write_text("hello")
    elif kind == "directory_part":
        (cache / "part-9-dir.parquet").mkdir()
    elif kind == "garbage_journal":
        (cache / "_journal-1-x.jsonl").write_bytes(b'\n{"key": 3}\n\x00\xff garbage\n{"status": "optimal"}')
    elif kind == "foreign_file":
        (cache / "notes.txt").write_text("mine")
    elif kind == "empty_part":
        (cache / "part-9-empty.parquet").write_bytes(b"")
    elif kind == "cache_is_file":
        file = folder / "file"
        file.write_text("x")
        return file, -1
    elif kind == "missing_columns":
        frame = pd.read_parquet(parts[0]).drop(columns=["status"])
        frame.to_parquet(cache / "part-9-nostatus.parquet")
    elif kind == "bad_key_types":
        frame = pd.read_parquet(parts[0])
        frame["key"] = range(len(frame))
        frame.to_parquet(cache / "part-9-intkeys.parquet")
    elif kind == "nested_missing":
        return folder / "a" / "b" / "c", 0
    return cache, good


def run_case(case: dict[str, Any]) -> None:  # noqa: C901 - one branch per category, on purpose
    """Run one input; return normally for ok, raise for everything else."""
    import numpy as np

    from sapptk.config import PipelineConfig
    from sapptk.plan import load_plan
    from sapptk.profile import Profile, bundled_profile, load_profile

    cat, data = case["cat"], case["data"]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        import fuzz_round3

        if cat in fuzz_round3.SURFACES:
            try:
                fuzz_round3.run_case(case, folder)
            except fuzz_round3.Wrong as exc:
                raise Wrong(str(exc)) from None
            return
        if not cat.startswith("cli") and cat in _new_surfaces():
            import fuzz_surfaces

            try:
                fuzz_surfaces.run_case(case, folder)
            except fuzz_surfaces.Wrong as exc:
                raise Wrong(str(exc)) from None
            return
        if cat == "profile_dict":
            profile = Profile.from_dict(data)
            check_profile(profile)
            simulate_even(profile)
        elif cat in ("profile_file", "special_file"):
            if cat == "profile_file":
                path = folder / f"profile{data['suffix']}"
                path.write_bytes(base64.b64decode(data["bytes"]))
            else:
                path = special_file(data, folder)
            profile = load_profile(path)
            check_profile(profile)
            simulate_even(profile)
        elif cat in ("mindformers", "mindformers_file"):
            llama, demo = bundled_profile("llama2_70b"), bundled_profile("demo")
            setups = [(llama, PipelineConfig(4, 8)), (demo, PipelineConfig(2, 4, chunks=2, schedule="interleaved"))]
            if cat == "mindformers":
                profile, config = setups[data["setup"]]
                source: Any = data["config"]
            else:
                profile, config = setups[0]
                source = folder / f"config{data['suffix']}"
                source.write_bytes(base64.b64decode(data["bytes"]))
            plans = load_plan(source, "mindformers", profile=profile, config=config)
            for plan in plans.values() if isinstance(plans, dict) else [plans]:
                check_plan(plan)
        elif cat == "pipeline":
            config = PipelineConfig(**data)
            config.validate()
            program = config.program()
            expect(int((program.ops["kind"] == "F").sum()) == config.stages * config.chunks * config.micro_batches
                   * config.splits, "wrong number of forwards")
            config.check(bundled_profile("llama2_70b"))
            from sapptk.plan import even_split

            check_plan(even_split(bundled_profile("llama2_70b"), config, "auto"))
        elif cat == "calibration":
            from sapptk.calibration import calibrate

            path = folder / "calibration.yaml"
            path.write_bytes(base64.b64decode(data["bytes"]))
            result = calibrate(path)
            check_profile(result.profile)
        elif cat == "simulate":
            from sapptk.simulation import simulate

            program = PipelineConfig(2, 4, chunks=2, schedule="interleaved").program() if data["program"] == "ok" \
                else data["program"]
            kw = {k: v for k, v in data.items() if k != "program"}
            sim = simulate(program, **kw)
            peaks = sim.peak_memory.to_numpy()
            expect(math.isfinite(sim.step_time) and sim.step_time >= 0, f"step time {sim.step_time}")
            expect(bool(np.isfinite(peaks).all() and (peaks >= 0).all()), f"peaks {peaks.tolist()}")
        elif cat == "cache":
            from sapptk.sweeps import sweep

            cache, good = damaged_cache(data, folder)
            grid = {"stages": [2, 4, 8], "micro_batches": [8, 16, 32]}
            calls: list[Any] = []

            def counted(task: dict[str, Any]) -> dict[str, Any]:
                calls.append(task)
                return bench_solve(task)

            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                frame = sweep(bundled_profile("demo"), grid, solve=counted, cache=cache, progress=False)
            expect(len(frame) == 9 and frame["status"].astype(str).eq("optimal").all(), "rows lost")
            expect(good < 0 or len(calls) <= 9 - good, f"{len(calls)} points recomputed, {good} were cached")
        elif cat.startswith("cli"):
            raise RuntimeError("CLI cases run in the parent")
        elif cat == "balance":
            from sapptk.balancer import balance

            config = PipelineConfig(4, 8, memory_budget=data["budget"])
            start = time.monotonic()
            plan = balance(bundled_profile("demo"), config, time_limit=data["time_limit"], workers=data["workers"],
                           seed=data["seed"])
            spent = time.monotonic() - start
            limit = data["time_limit"]
            expect(isinstance(limit, int | float) and not isinstance(limit, bool) and 0 < limit < math.inf,
                   f"time_limit = {limit!r} accepted")
            expect(spent <= limit + 5, f"time limit {limit} s, took {spent:.0f} s")
            if plan.status in ("optimal", "feasible"):
                check_plan(plan)
        elif cat == "sweep":
            from sapptk.sweeps import sweep

            grids = {"small": {"stages": [4], "micro_batches": [8]},
                     "huge": {"stages": list(range(1, 10**4)), "micro_batches": list(range(1, 10**4))},
                     "bad_field": {"stages": [4], "micro_batches": [8], "stage": [1]}, "string": "1f1b"}
            frame = sweep(bundled_profile("demo"), grids[data["grid"]], executor=data["executor"],
                          time_limit=data["time_limit"], workers=data["workers"], solve=bench_solve,
                          cache=folder / "c", progress=False)
            expect(len(frame) >= 1, "no rows")
            limit = data["time_limit"]
            expect(isinstance(limit, int | float) and 0 < limit < math.inf, f"time_limit = {limit!r} accepted")


def _new_surfaces() -> tuple[str, ...]:
    import fuzz_surfaces

    return fuzz_surfaces.SURFACES


def worker() -> None:
    """Read cases (JSON lines) on stdin; write one outcome line per case on stdout."""
    import warnings

    warnings.simplefilter("ignore")
    from sapptk.errors import SapptkError

    out = sys.stdout
    sys.stdout = sys.stderr  # anything the library prints stays out of the protocol
    for line in sys.stdin:
        case = json.loads(line)
        try:
            run_case(case)
            result = {"outcome": "ok"}
        except SapptkError as exc:
            result = {"outcome": "clear", "detail": str(exc)[:200]}
        except Wrong as exc:
            result = {"outcome": "wrong", "detail": str(exc)[:300]}
        except BaseException as exc:  # noqa: BLE001 - that is what we count
            where = traceback.extract_tb(exc.__traceback__)[-1]
            result = {"outcome": "raw", "detail": f"{type(exc).__name__}: {str(exc)[:160]} "
                                                  f"(at {Path(where.filename).name}:{where.lineno})"}
        result["id"] = case["id"]
        out.write(json.dumps(result) + "\n")
        out.flush()


# ================================================================================ parent
class Worker:
    def __init__(self, memory_gb: float) -> None:
        def limit() -> None:
            os.setsid()
            import resource

            cap = int(memory_gb * 2**30)
            resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

        self.proc = subprocess.Popen([sys.executable, __file__, "--worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, preexec_fn=limit, text=True,
                                     bufsize=1)

    def run(self, case: dict[str, Any], timeout: float) -> dict[str, Any]:
        assert self.proc.stdin and self.proc.stdout
        try:
            self.proc.stdin.write(json.dumps(case) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return {"outcome": "raw", "detail": "worker died before the case"}
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            return {"outcome": "hang", "detail": f"no answer within {timeout:g} s"}
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            return {"outcome": "raw", "detail": f"the worker process died (exit code {code})"}
        return json.loads(line)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait()


def run_cli(argv: list[str], timeout: float, folder: Path) -> dict[str, Any]:
    """One command line in a fresh process: exit 2 with a message and no traceback is clear."""
    existing = folder / "existing_file"
    existing.write_text("x")
    bad = ROOT / "tests" / "data" / "bad"
    odd = folder / os.fsdecode(b"d\xffemo.json")
    odd.write_bytes((ROOT / "data" / "demo.json").read_bytes())
    fifo = folder / "fifo.yaml"
    if not fifo.exists():
        os.mkfifo(fifo)
    values = {"{existing_file}": str(existing), "{non_utf8_profile}": str(odd),
              "{non_utf8_dir}": str(folder / os.fsdecode(b"o\xffut")),
              "{manual}": str(ROOT / "data" / "llama2_70b_manual.yaml"),
              "{bad_mf}": str(bad / "mf_offset_wrap.yaml"), "{bad_profile}": str(bad / "deep.yaml"),
              "{fresh_dir}": str(folder / "fresh"), "{fifo}": str(fifo), "{dev_zero_json}": "/dev/zero"}
    if any(a in ("{plan}", "{bad_plan}", "{good_trace}", "{bad_trace}", "{calibration}", "{out_file}") for a in argv):
        values.update(_new_cli_files(folder))
    link = folder / "null_link"
    if "{dev_link}" in argv and not link.is_symlink():
        link.symlink_to(os.devnull)  # never the device itself: a command that replaces it replaces our link
    values.update({"{dev_link}": str(link), "{long_path}": "x" * 5000, "{out_yaml}": str(folder / "p.yaml")})
    before = os.lstat(link) if link.is_symlink() else None
    args = [values.get(a, a) for a in argv]
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}  # a strict UTF-8 terminal: unencodable names must not crash
    proc = subprocess.Popen([sys.executable, "-m", "sapptk", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env, start_new_session=True)
    try:
        out_bytes, err_bytes = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # the command and anything it started
        proc.communicate()
        return {"outcome": "hang", "detail": f"{' '.join(argv)}: no exit within {timeout:g} s"}
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out_bytes, err_bytes)
    if before is not None and (not link.is_symlink() or os.lstat(link).st_ino != before.st_ino):
        return {"outcome": "wrong", "detail": f"{' '.join(argv)}: wrote over a link to a device"}
    err = done.stderr.decode("utf-8", "replace")
    out = done.stdout.decode("utf-8", "replace")
    if "Traceback" in err or done.returncode not in (0, 1, 2):
        last = err.strip().splitlines()[-1] if err.strip() else f"exit {done.returncode}"
        return {"outcome": "raw", "detail": f"{' '.join(argv)}: {last[:160]}"}
    if done.returncode == 2:
        if "--out" in argv and "step time" in out:
            return {"outcome": "wrong", "detail": f"{' '.join(argv)}: solved before refusing the output folder"}
        return {"outcome": "clear", "detail": err.strip().splitlines()[-1][:160] if err.strip() else ""}
    return {"outcome": "ok"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=400, help="how many inputs (at least 300 for the target)")
    parser.add_argument("--seed", type=int, default=None, help="campaign seed (default: from the clock, printed)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before an input counts as a hang")
    parser.add_argument("--memory-gb", type=float, default=8.0, help="address-space cap of the worker process")
    parser.add_argument("--report", type=Path, default=None, help="write every outcome to this JSON file")
    parser.add_argument("--surfaces", default="first",
                        help="the first round's surfaces (default), 'new' (the ones added since), 'all' (both), or a "
                             "comma list of the newest: cards,estimate,choose,request,seq,formats,calibrate,cli")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker()
        return
    seed = args.seed if args.seed is not None else int(time.time()) % 100_000
    cases = make_campaign(seed, args.inputs, args.surfaces)
    print(f"fuzz campaign: seed {seed}, {len(cases)} inputs, hang after {args.timeout:g} s, worker capped at "
          f"{args.memory_gb:g} GB; sapptk from {_where_sapptk()}", flush=True)
    results: list[dict[str, Any]] = []
    work: Worker | None = None
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n, case in enumerate(cases, 1):
                if case["cat"].startswith("cli"):
                    result = run_cli(case["data"], args.timeout, Path(tmp))
                else:
                    work = work or Worker(args.memory_gb)
                    result = work.run(case, args.timeout)
                    if result["outcome"] == "hang" or work.proc.poll() is not None:
                        work.kill()  # stuck or dead: a fresh worker for the next input
                        work = None
                results.append({**case, **result})
                if n % 50 == 0:
                    print(f"  {n}/{len(cases)} inputs, {time.monotonic() - started:.0f} s", flush=True)
    finally:
        if work is not None:
            work.kill()
    report(results)
    if args.report is not None:
        args.report.write_text(json.dumps(results, indent=1, default=repr))


def _where_sapptk() -> str:
    code = "import sapptk, os; print(os.path.dirname(os.path.dirname(sapptk.__file__)))"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()


def report(results: list[dict[str, Any]]) -> None:
    total = Counter(r["outcome"] for r in results)
    print(f"\ntried {len(results)} / clear {total['clear']} / raw {total['raw']} / hang {total['hang']}"
          f"   (ok {total['ok']}, wrong {total['wrong']})")
    print(f"\n{'category':<18}" + "".join(f"{o:>7}" for o in OUTCOMES))
    for cat in sorted({r["cat"] for r in results}):
        counts = Counter(r["outcome"] for r in results if r["cat"] == cat)
        print(f"{cat:<18}" + "".join(f"{counts[o]:>7}" for o in OUTCOMES))
    bad = [r for r in results if r["outcome"] in ("raw", "hang", "wrong")]
    if bad:
        print("\nnot clear (category, outcome, detail):")
        seen: set[tuple[str, str, str]] = set()
        for r in bad:
            key = (r["cat"], r["outcome"], r.get("detail", "")[:70])
            if key in seen:
                continue
            seen.add(key)
            print(f"  {r['cat']:<16} {r['outcome']:<6} {r.get('detail', '')}")


if __name__ == "__main__":
    main()
