"""Fuzz inputs for the surfaces added since the first hardening round, with their oracles.

Shared by ``tests/test_fuzz.py`` (a fixed sample in the fast loop, more under ``slow``) and
``benchmarks/fuzz.py`` (a fresh campaign in a worker process with a memory cap and a hang
bound). A case is plain JSON-able data ``{"cat": surface, "data": ...}`` made from a
:class:`random.Random`; :func:`run_case` runs it through public entry points only and
returns for a correct result, raises :class:`Wrong` when an oracle refutes the result, and
lets a :class:`~sapptk.errors.SapptkError` (a clear error) or anything else (a raw one) out.

Surfaces: profiler traces (Chrome, torch.profiler, MindSpore readers; events, files and the
user's regexes), calibration files (sizes and magnitudes), ``design``, schedule CSV,
Megatron layouts and flags, torchtitan TOML, plan files (figures that must agree with the
plan), ``to_chrome_trace`` targets, degenerate setups given to ``balance``, safe budgets, and
arguments of the wrong type or magnitude given to each of these entry points.
"""

from __future__ import annotations

import copy
import gzip
import json
import math
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXTREMES: list[Any] = [0, -1, 1, 2**31, 2**53 + 1, 2**63, 2**64, 10**30, 10**400, -(10**30), 1e-300, 5e-324, 1e300,
                       -1e300, math.inf, -math.inf, math.nan, 2.5, -0.0, None, True, False, "", "1", "x", [], [1], {},
                       {"a": 1}, [[[]]], "9" * 60]
SURFACES = ("trace", "calibration_size", "design", "schedule_csv", "megatron", "torchtitan", "plan_file",
            "chrome_export", "degenerate", "safe_budget", "argument_types")
SCHEDULES = ("gpipe", "1f1b", "interleaved", "interleaved-lm", "zb-h1", "zb-v", "dualpipe-v")


class Wrong(Exception):
    """A result the oracle refutes."""


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise Wrong(what)


def weird(r: random.Random) -> Any:
    return r.choice(EXTREMES)


def _json(value: Any) -> Any:
    """``value`` with what JSON cannot carry (huge ints, inf, NaN) kept as tagged strings."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) > 2**63:
        return {"__int__": str(value)}
    if isinstance(value, float) and not math.isfinite(value):
        return {"__float__": repr(value)}
    if isinstance(value, dict):
        return {k: _json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    return value


def _unjson(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"__int__"}:
            return int(value["__int__"])
        if set(value) == {"__float__"}:
            return float(value["__float__"])
        return {k: _unjson(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unjson(v) for v in value]
    return value


def mutate_tree(r: random.Random, data: Any, *, odd: Callable[[random.Random], Any] = weird,
                delete: float = 0.15) -> Any:
    """Nested data with one leaf or branch replaced by a value of ``odd`` (or, with
    probability ``delete`` when it sits in a mapping, removed)."""
    data = copy.deepcopy(data)
    node, parent, key = data, None, None
    while isinstance(node, dict | list) and node and r.random() < 0.8:
        parent, key = node, r.choice(list(node) if isinstance(node, dict) else range(len(node)))
        node = node[key]
    if parent is None:
        return odd(r)
    if isinstance(parent, dict) and r.random() < delete:
        del parent[key]
    else:
        parent[key] = odd(r)
    return data


def mutate_text(r: random.Random, text: str, pieces: list[str]) -> str:
    for _ in range(r.randint(1, 3)):
        at = r.randint(0, len(text))
        piece = r.choice(pieces)
        text = text[:at] + piece + text[at + (len(piece) if r.random() < 0.4 else 0):]
    return text


# ============================================================================ generators
def trace_case(r: random.Random) -> dict[str, Any]:
    events: list[dict[str, Any]] = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "host"}}]
    t = 0.0
    for step in range(r.randint(1, 3)):
        events.append({"ph": "X", "name": f"ProfilerStep#{step}", "cat": "user_annotation", "pid": 1, "tid": 1,
                       "ts": t, "dur": 900.0})
        for mb in range(r.randint(1, 3)):
            for layer in range(r.randint(1, 4)):
                for phase in ("forward", "backward"):
                    dur = round(r.uniform(1, 20), 3)
                    name = f"layer{layer}" + ("_backward" if phase == "backward" else "")
                    args = {"kind": "F" if phase == "forward" else "B", "micro_batch": mb}
                    if r.random() < 0.3:
                        events += [{"ph": "B", "name": name, "cat": "user_annotation", "pid": 1, "tid": 1, "ts": t},
                                   {"ph": "E", "pid": 1, "tid": 1, "ts": t + dur}]
                    else:
                        events.append({"ph": "X", "name": name, "cat": "user_annotation", "pid": 1, "tid": 1,
                                       "ts": t, "dur": dur, "args": args})
                    t += dur + 1
        t = (step + 1) * 1000.0
    for _ in range(r.choice([0, 0, 1, 1, 2, 3])):
        action = r.random()
        if action < 0.5:
            event = r.choice(events)
            event[r.choice(["ts", "dur", "pid", "tid", "args", "name", "ph"])] = weird(r)
        elif action < 0.65:  # an end before its begin, or alone
            ends = [i for i, e in enumerate(events) if e.get("ph") == "E"]
            if ends:
                i = r.choice(ends)
                events.insert(max(0, i - 2), events.pop(i))
        elif action < 0.8:
            events.append({"ph": r.choice(["X", "B", "E", "C", "M", "i"]), "name": "layer0", "pid": 1, "tid": 1,
                           "ts": weird(r), "dur": r.choice([-5, -1e-9, 10**20])})
        else:
            r.choice(events)["args"] = {"micro_batch": weird(r), "kind": weird(r)}
    layers = r.choice([r"layer\d", {"layer0": "head", r"layer[1-9]": "body"}, r"layer(?P<layer>\d)"]) \
        if r.random() < 0.7 else r.choice(["((", "x" * 20_000, 5, {}, {"layer\\d": ""}, "(a+)+$", "nothing"])
    options: dict[str, Any] = {}
    reader = r.choice(["layer_times", "chrome", "chrome", "pytorch", "mindspore"])
    if reader == "chrome" and r.random() < 0.5:
        options["step"] = r.choice([r"ProfilerStep#\d+", "(?<=a)b", "(", 5, None])
    if reader == "chrome" and r.random() < 0.3:
        options["phases"] = r.choice([{"backward": "_backward"}, {"forward": "("}, {"sideways": "x"}, {"weight": 3}])
    if reader in ("chrome", "pytorch") and r.random() < 0.3:
        options["skip_steps"] = r.choice([0, 1, 5, -1, 10**30, True, 1.5])
    if reader == "mindspore":
        options["micro_batches"] = r.choice([1, 2, 0, -1, 10**30, 2.5, True])
        if r.random() < 0.3:
            options["outlier_share"] = r.choice([0.1, 0.0, 1.5, math.nan, "x"])
    form = r.choice(["json", "json", "json", "gz", "bytes"])
    return _json({"events": events, "layers": layers, "reader": reader, "options": options, "form": form,
                  "cut": r.randint(0, 400) if form == "bytes" else 0})


def calibration_case(r: random.Random) -> dict[str, Any]:
    paths = [("pipeline_config", "pipeline_num"), ("pipeline_config", "num_layer"), ("pipeline_config", "offset"),
             ("pipeline_config", "micro_batches"), ("pipeline_config", "chunks"), ("memory_usage", "head_memory"),
             ("memory_usage", "tail_memory"), ("memory_usage", "body_memories")]
    values = [200_000, 10**6, 10**30, 10**400, -3, 0, 1e300, math.nan, "4", [], [10**30] * 3, 2.5, True]
    edits = [(list(r.choice(paths)), r.choice(values)) for _ in range(r.randint(1, 2))] if r.random() < 0.75 else \
        [(["pipeline_config", "micro_batches"], r.choice([4, 8, 12])), (["pipeline_config", "schedule"],
                                                                          r.choice(["1f1b", "gpipe", "zb-h1"]))]
    return _json({"file": r.choice(["init_demo.yaml", "init_demo_pp4_rounds.yaml"]), "edits": edits})


def design_case(r: random.Random) -> dict[str, Any]:
    if r.random() < 0.4:  # a plausible request
        p = r.choice([2, 3, 4, 8])
        return {"stages": p, "layers": p * r.randint(1, 8), "modes": r.sample(["select", "comm", "both", "full"],
                                                                               r.randint(0, 2)),
                "rounds": None, "seed": r.randint(0, 99), "schedule": r.choice(["1f1b", "gpipe"]),
                "micro_batches": r.choice([None, p, 2 * p])}
    kw = {"stages": r.choice([2, 3, 4, 8, 16, 1, 0, -1, 10**6, 2.5, "4", True]),
          "layers": r.choice([8, 16, 32, 64, 3, 10**7, 10**30, -8]),
          "modes": r.choice([(), ("select",), ("full", "select"), ("none",), ("half",), "full", [5]]),
          "rounds": r.choice([None, None, 1, 2, 3, 10**6, 0, -1, True, 2.0]),
          "seed": r.choice([0, 1, 7, -1, 2**64, 2**70, 1.5]),
          "schedule": r.choice(["1f1b", "gpipe", "zb-h1", "interleaved", "nope", 5]),
          "micro_batches": r.choice([None, None, 4, 8, 10**9, 0, -2])}
    return _json(kw)


def csv_case(r: random.Random) -> dict[str, Any]:
    schedule = r.choice(["gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v"])
    p = r.randint(1, 4) if schedule not in ("zb-v", "dualpipe-v") else r.randint(1, 3)
    v = 2 if schedule in ("interleaved", "zb-v", "dualpipe-v") else 1
    m = r.choice([p, 2 * p, 2 * p + 1]) if schedule != "dualpipe-v" else 2 * p
    return {"schedule": schedule, "p": p, "v": v, "m": m,
            "pieces": [r.choice(["99999999999999999999F0", "0F99999999999999999999", "((0F0))OVERLAP_F_B", "0X0",
                                 "-1F0", "0F-1", "(0F0;0B0)OVERLAP_F_B", "1SEND_F0", "", ",", "\n", '"', "0F0",
                                 "(" * 500 + "0F0" + ")" * 500, "9" * 30 + "B1", "0W0", "0I0", "\x00"])
                       for _ in range(r.randint(0, 3))],
            "seed": r.randint(0, 10**6)}


def megatron_case(r: random.Random) -> dict[str, Any]:
    p = r.choice([2, 4])
    v = r.choice([1, 2])
    if r.random() < 0.7:
        return {"p": p, "v": v, "mode": "layout", "pieces": [r.choice(
            ["*1000000000", "*" + "9" * 30, "(", ")", "*0", "x", "((t|)*2)*2", "|", ",", "E", "L", "m", "t*3",
             "(tt|)*100000000", "*", " ", "\u00e9"]) for _ in range(r.randint(0, 2))], "seed": r.randint(0, 10**6)}
    keys = ["pipeline-model-parallel-size", "num-layers", "num-virtual-stages-per-pipeline-rank",
            "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "recompute-granularity",
            "recompute-method", "recompute-num-layers", "recompute-modules"]
    flags = {k: r.choice([weird(r), "full", "block", "uniform", "selective", "1", "2", str(10**30), "9" * 5000])
             for k in r.sample(keys, r.randint(1, 4))}
    return _json({"p": p, "v": v, "mode": "flags", "flags": flags})


def torchtitan_case(r: random.Random) -> dict[str, Any]:
    return {"p": r.choice([2, 4]), "v": r.choice([1, 2]), "seed": r.randint(0, 10**6),
            "numbers": [r.choice(["0", "-1", str(2**63), str(2**70), "9" * 5000, "1e400", "inf", "nan", "2.5", '"x"'])
                        for _ in range(r.randint(0, 2))],
            "pieces": [r.choice(['"layers.' + "9" * 40 + '"', "[[", "]]", "\x00", '"norm"', "=", "\n[parallelism]\n"])
                       for _ in range(r.randint(0, 1))]}


def plan_case(r: random.Random) -> dict[str, Any]:
    edits = []
    for _ in range(r.randint(1, 2)):
        edits.append(r.choice([
            ["status", r.choice(["optimal", "feasible", "given", "infeasible", "unknown", "x", 5])],
            ["scale_step", r.choice([1.0, 0.5, 2.0, 1 + 1e-12])],
            ["step_time_ms", r.choice([-5.0, 10**400, 1e300, math.nan, "fast", 0.0])],
            ["bound", r.choice([0.5, 0.999, 2.0, -1.0])],
            ["gap", r.choice([0.0, 0.1, 1.5, -1.0, math.inf])],
            ["budget", r.choice([None, 1.0, 1e9, 1e13, -5.0, math.nan])],
            ["layers", r.choice([10**30, 0, -1, "x", 2**63, 1])],
            ["tree", r.randint(0, 10**6)],
        ]))
    return _json({"p": r.choice([2, 4]), "schedule": r.choice(["1f1b", "interleaved"]), "edits": edits})


def export_case(r: random.Random) -> dict[str, Any]:
    return {"target": r.choice(["dir", "fifo", "missing_folder", "file", "gz", "existing", "nul", "int", "dev_null"])}


def degenerate_case(r: random.Random) -> dict[str, Any]:
    return {"shape": r.choice(["one_stage", "one_stage", "stages_eq_layers", "budget_at_minimum", "budget_below"]),
            "schedule": r.choice(["1f1b", "gpipe", "interleaved", "zb-h1"]), "m": r.randint(1, 4),
            "per_micro_batch": r.random() < 0.3, "oom_risk": r.choice([None, None, 1e-300, 0.01])}


def safe_budget_case(r: random.Random) -> dict[str, Any]:
    return _json({"budget": r.choice([60000.0, 1e12, 1500.0]), "constant": r.choice([0.0, 1000.0]),
                  "oom_risk": r.choice([None, 0.01, 1e-300, 5e-324, 0.49, 0.5, 0, -1, math.nan, 10**400, "x"]),
                  "memory_error": r.choice([None, 0.02, 0.0, 1.0, 1.5, -0.1, math.inf, 10**400, "x"]),
                  "memory_margin": r.choice([None, None, 0.05, 2000, 0.999, 10**400, -1, math.nan, 1e12])})


ENTRY_POINTS = ("load_plan_megatron", "load_plan_torchtitan", "load_plan", "layer_times", "chrome_layer_times",
                "mindspore_layer_times", "read_trace", "from_csv", "from_csv_text", "design", "calibrate",
                "read_observations", "validate", "to_chrome_trace", "plan_export", "robust_budget", "balance_levers")


def argument_types_case(r: random.Random) -> dict[str, Any]:
    """One entry point, one argument of the wrong type or an extreme value."""
    return _json({"entry": r.choice(ENTRY_POINTS), "slot": r.randint(0, 3), "value": weird(r)})


GENERATORS = {"trace": trace_case, "calibration_size": calibration_case, "design": design_case,
              "schedule_csv": csv_case, "megatron": megatron_case, "torchtitan": torchtitan_case,
              "plan_file": plan_case, "chrome_export": export_case, "degenerate": degenerate_case,
              "safe_budget": safe_budget_case, "argument_types": argument_types_case}
SHARE = {"trace": 0.2, "calibration_size": 0.07, "design": 0.07, "schedule_csv": 0.13, "megatron": 0.11,
         "torchtitan": 0.09, "plan_file": 0.13, "chrome_export": 0.04, "degenerate": 0.03, "safe_budget": 0.05,
         "argument_types": 0.08}


def make_cases(seed: int, size: int) -> list[dict[str, Any]]:
    """About ``size`` cases over :data:`SURFACES` (shares :data:`SHARE`), replaying from ``seed``."""
    r = random.Random(seed)
    cases = [{"cat": cat, "data": GENERATORS[cat](r)} for cat, part in SHARE.items()
             for _ in range(max(1, round(size * part)))]
    r.shuffle(cases)
    return cases


# ================================================================================ runner
def run_case(case: dict[str, Any], folder: Path) -> None:
    """Run one case in ``folder`` (a fresh temporary folder); see the module docstring."""
    from fuzz_runs import RUNNERS  # the runners and their oracles, next to this file

    RUNNERS[case["cat"]](_unjson(case["data"]), folder)


def case_bytes(data: dict[str, Any]) -> bytes:
    """The trace file of a trace case, as written."""
    text = json.dumps({"traceEvents": data["events"]}).encode("utf-8")
    if data["form"] == "gz":
        return gzip.compress(text, mtime=0)
    if data["form"] == "bytes":
        return text[: max(0, len(text) - data["cut"])]
    return text
