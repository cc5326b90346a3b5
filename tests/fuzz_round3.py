"""Fuzz inputs for the newest surfaces (issue 34), with oracles for silent wrong answers.

Surfaces: ``cards`` (``ModelCard.from_hf``, ``Mla``/``Moe``), ``estimate`` (``estimate_profile``,
``Parallel``, ``hardware``), ``choose`` (tiny choices, time limits <= 1 s), ``request``
(``SolveRequest`` and ``solve``), ``seq`` (sequence-slice setups, their budgets and lengths),
``formats`` (every export of a plan with odd names and targets, read back), ``calibrate``
(``calibrate(prior=...)`` and observation tables). The command lines are in
``benchmarks/fuzz.py`` (``cli``).

Oracles (a result they refute is ``wrong``):

* a choice: its winner no slower than any balanced row of its own frame; ``proven`` only when
  no row's bound is below the winner; a larger memory budget never a slower winner;
* a plan that says it fits has every device's peak within the budget;
* a sliced plan's slice lengths sum to the profile's sequence;
* an export reads back as the same layout, and parses in its target language (TOML, Python,
  YAML); a file written over a device (through a link), FIFO or directory is wrong;
* a solve or choice that overruns its time limit by more than a generous slack;
* a card's parameter count is the sum of its groups; an estimate keeps the card's layers.

Shared by ``benchmarks/fuzz.py --surfaces cards,estimate,...`` (a campaign in a worker
process) and ``tests/test_hardening_round3.py`` (a fixed sample).
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import pickle
import random
import stat
import time
from pathlib import Path
from typing import Any

import numpy as np
from fuzz_surfaces import Wrong, _json, _unjson, expect

SURFACES = ("cards", "estimate", "choose", "request", "seq", "formats", "calibrate")
SHARE = {"cards": 0.2, "estimate": 0.16, "choose": 0.06, "request": 0.14, "seq": 0.12, "formats": 0.22,
         "calibrate": 0.1}
ODD: list[Any] = [0, -1, -1000, 1.5, 2**31, 10**9, 10**400, -(10**30), math.inf, math.nan, None, True, "4", "",
                  "x\ny", 'a"""b', [], [1], {}, {"a": 1}]
SLACK_S = 3.0  # a time limit may be overrun by this much (imports, the last phase winding down) before it is wrong

BASE_CARDS: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
              "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 1000},
    "qwen2_moe": {"model_type": "qwen2_moe", "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
                  "intermediate_size": 256, "vocab_size": 500, "num_experts": 4, "num_experts_per_tok": 2,
                  "moe_intermediate_size": 64, "shared_expert_intermediate_size": 128, "mlp_only_layers": [0]},
    "deepseek_v3": {"model_type": "deepseek_v3", "hidden_size": 128, "num_hidden_layers": 4,
                    "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 500, "q_lora_rank": 32,
                    "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16,
                    "n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                    "n_shared_experts": 1, "first_k_dense_replace": 1},
    "gpt2": {"model_type": "gpt2", "n_embd": 128, "n_layer": 4, "n_head": 4, "vocab_size": 500, "n_positions": 256},
}


def odd(r: random.Random) -> Any:
    return r.choice(ODD)


# ============================================================================ generators
def cards_case(r: random.Random) -> dict[str, Any]:
    kind = r.choice(sorted(BASE_CARDS))
    data = copy.deepcopy(BASE_CARDS[kind])
    for _ in range(r.choice([0, 1, 1, 2])):
        key = r.choice([*data, "num_hidden_layers", "mlp_only_layers", "q_lora_rank", "name"])
        data[key] = r.choice([odd(r), r.choice([10**6, 10**9, 2 * 10**6, 0, 3])])
    if kind == "qwen2_moe" and r.random() < 0.15:
        data["num_hidden_layers"] = r.choice([10**5, 10**6])
        data["mlp_only_layers"] = list(range(0, data["num_hidden_layers"], r.choice([100, 1000])))
    return _json({"data": data, "name": r.choice([None, None, "mine", 5, "", "a\nb"]),
                  "path": r.choice([None, None, None, "x" * 5000, "missing/config.json", "a\x00b"]),
                  "mla": r.random() < 0.1, "moe": r.random() < 0.1, "odd": odd(r)})


def estimate_case(r: random.Random) -> dict[str, Any]:
    parallel: dict[str, Any] = {"seq_length": r.choice([512, 1024, 1024, 4096])}
    for _ in range(r.choice([0, 1, 1, 2])):
        parallel[r.choice(["tp", "cp", "dp", "ep", "micro_batch_size", "seq_length", "sharding", "grad_dtype",
                           "capacity_factor"])] = r.choice([odd(r), 2, 8, "zero2", "fsdp", "fp16"])
    return _json({"card": r.choice(["llama2-7b", "gpt2", "mixtral-8x7b", "qwen3-32b", 5, None, "nope", "dict"]),
                  "parallel": parallel,
                  "hardware": r.choice(["h100", "a100", "nope", 5, {"name": "x"}, "h100+name", "h100+bad"]),
                  "rename": odd(r) if r.random() < 0.3 else "mine"})


def choose_case(r: random.Random) -> dict[str, Any]:
    kw: dict[str, Any] = {"devices": r.choice([2, 4, 4]), "global_batch": r.choice([4, 8]),
                          "memory_budget": r.choice([40_000.0, 100_000.0, 300_000.0, 1e6]),
                          "time_limit": r.choice([0.3, 0.5, 1.0]), "schedules": ["1f1b"], "bound_time": 0.3,
                          "retry": 0.5}
    if r.random() < 0.25:
        kw[r.choice(["max_chunks", "batch", "devices", "global_batch", "time_limit", "memory_budget", "stages",
                     "workers"])] = odd(r)
    return _json({"source": r.choice(["demo", "demo", "llama2_70b"]), "kw": kw, "twice": r.random() < 0.3})


def request_case(r: random.Random) -> dict[str, Any]:
    kw: dict[str, Any] = {"time_limit": r.choice([0.2, 0.5, 1.0]), "workers": r.choice([1, 2]),
                          "seed": r.randint(0, 9)}
    for _ in range(r.choice([0, 1, 1, 2])):
        kw[r.choice(["time_limit", "stall_time", "workers", "seed", "memory_margin", "oom_risk", "deterministic",
                     "per_micro_batch", "start"])] = odd(r)
    return _json({"profile": r.choice(["demo", "llama2_70b"]), "p": r.choice([2, 4]), "m": r.choice([4, 8, 16]),
                  "budget": r.choice([None, 2e4, 6e4, 1e5]), "kw": kw, "start": r.random() < 0.3,
                  "solve": r.random() < 0.5})


def seq_case(r: random.Random) -> dict[str, Any]:
    seq = 4096
    k = r.choice([2, 3, 4])
    lengths: Any = k
    if r.random() < 0.4:
        cuts = sorted(r.sample(range(1, seq), k - 1))
        lengths = [b - a for a, b in zip([0, *cuts], [*cuts, seq], strict=True)]
        if r.random() < 0.3:
            lengths = r.choice([[5], [seq + 1], [0, seq], [seq // 2, seq // 2 + 1], [2.5, seq - 2.5]])
    return _json({"schedule": r.choice(["seq1f1b", "seq-interleaved-lm"]), "splits": lengths,
                  "budget": r.choice([800.0, 1100.0, 1200.0, 1300.0, 2000.0, 5000.0, 40_000.0]),
                  "choose_splits": r.random() < 0.3, "time_limit": r.choice([0.5, 1.0]), "monotone": r.random() < 0.25})


def formats_case(r: random.Random) -> dict[str, Any]:
    return _json({"target": r.choice(["mindformers", "megatron", "torchtitan", "torch-csv", "sapptk"]),
                  "name": r.choice(["demo", 'a"""b', "x\ny: 1", "#", "ü\u2028v", "\\", "a'b"]),
                  "source": r.choice([None, "x\nstatus: optimal\nfoo: [1", "\r\n", "---"]),
                  "group": r.choice([None, "g\n- 1", "body: 1"]),
                  "csv_name": r.choice([None, "a\nb.csv", 'q"q.csv', "s.csv"]),
                  "out": r.choice(["none", "none", "file", "dev_link", "fifo", "dir", "yaml_marker"]),
                  "schedule": r.choice(["1f1b", "interleaved", "zb-h1"])})


def calibrate_case(r: random.Random) -> dict[str, Any]:
    cell = r.choice(["[0, 0]", "[0, 0]", "[" * 3000 + "]" * 3000, "{a: [1, 2]}", "*a", "[1, 10**9]",
                     "[" + "9" * 500 + ", 0]", "&a [1, 0]"])
    return _json({"mode": r.choice(["prior", "prior", "cell"]), "cell": cell, "seq": r.choice([2048, 4096]),
                  "scale": r.choice([1.0, 1.3, 0.7])})


GENERATORS = {"cards": cards_case, "estimate": estimate_case, "choose": choose_case, "request": request_case,
              "seq": seq_case, "formats": formats_case, "calibrate": calibrate_case}


def make_cases(seed: int, size: int, surfaces: tuple[str, ...] = SURFACES) -> list[dict[str, Any]]:
    """About ``size`` cases over ``surfaces`` (shares :data:`SHARE`, renormalised), from ``seed``."""
    r = random.Random(seed)
    total = sum(SHARE[s] for s in surfaces)
    cases = [{"cat": cat, "data": GENERATORS[cat](r)} for cat in surfaces
             for _ in range(max(1, round(size * SHARE[cat] / total)))]
    r.shuffle(cases)
    return cases


def run_case(case: dict[str, Any], folder: Path) -> None:
    """Run one case in ``folder``: return for a correct result, raise :class:`Wrong` when an
    oracle refutes it; a sapptk error (clear) or anything else (raw) goes out as raised."""
    RUNNERS[case["cat"]](_unjson(case["data"]), folder)


# =============================================================================== oracles
def check_plan_fits(plan: Any) -> None:
    if not plan.solved:
        return
    budget = plan.config.memory_budget
    peaks = plan.simulation.peak_memory.to_numpy()
    expect(bool(np.isfinite(peaks).all()), "peaks not finite")
    if plan.fits and budget is not None:
        expect(float(peaks.max()) <= budget * (1 + 1e-9) + 1e-6, f"says it fits: peak {peaks.max():.1f} > {budget}")
    lengths = getattr(plan.config, "slice_lengths", None)
    seq = plan.profile.seq_length
    if lengths is not None and seq is not None:
        expect(sum(lengths) == seq, f"slice lengths {list(lengths)} sum to {sum(lengths)}, not {seq}")


def timed(limit: float, began: float, what: str) -> None:
    spent = time.perf_counter() - began
    expect(spent <= limit + SLACK_S, f"{what}: {spent:.1f} s for a time limit of {limit:g} s")


def check_choice(choice: Any) -> None:
    frame = choice.frame
    best = choice.best
    if not best.solved:
        return
    mine = float(best.step_time)
    balanced = frame[frame["status"] == "balanced"]
    steps = balanced["step_time_ms"].dropna()
    if len(steps):
        expect(float(steps.min()) >= min(mine, float(frame["step_time_ms"].min())) - 1e-6, "ranking out of order")
        winner = float(frame["step_time_ms"].iloc[0])
        expect(winner <= float(steps.min()) + 1e-6, f"winner {winner} slower than a balanced row {steps.min()}")
    if choice.proven:
        bounds = frame["bound_ms"].dropna()
        winner = float(frame["step_time_ms"].iloc[0])
        low = bounds[bounds < winner * (1 - 1e-9) - 1e-6]
        rows = frame.loc[low.index]
        beaten = rows[rows.index != frame.index[0]]
        expect(beaten.empty, f"proven, but row {list(beaten.index)[:3]} has a bound below the winner {winner}")
    check_plan_fits(best)


# =============================================================================== runners
def run_cards(d: dict[str, Any], folder: Path) -> None:
    from sapptk.models import Mla, ModelCard, Moe

    if d["mla"]:
        Mla(q_lora_rank=d["odd"], kv_lora_rank=1, qk_nope_dim=1, qk_rope_dim=1, v_dim=1)
        expect(isinstance(d["odd"], int) and not isinstance(d["odd"], bool) and 0 <= d["odd"] <= 10**9,
               f"Mla(q_lora_rank={d['odd']!r}) accepted")
        return
    if d["moe"]:
        Moe(experts=4, top_k=2, expert_size=8, shared_size=d["odd"])
        expect(isinstance(d["odd"], int) and not isinstance(d["odd"], bool) and 0 <= d["odd"] <= 10**9,
               f"Moe(shared_size={d['odd']!r}) accepted")
        return
    if d["path"] is not None:
        source: Any = folder / d["path"] if d["path"] == "missing/config.json" else d["path"]
    else:
        source = d["data"]
    card = ModelCard.from_hf(source, name=d["name"])
    expect(isinstance(card.name, str) and card.name != "", f"card name {card.name!r}")
    expect(card.parameters() == sum(g.count * g.parameters for g in card.groups), "parameters != groups")
    expect(all(g.parameters > 0 and g.count >= 1 for g in card.groups), "a group without parameters")
    expect(sum(g.count for g in card.groups if g.kind == "body") == card.num_layers, "layers lost")


def run_estimate(d: dict[str, Any], folder: Path) -> None:
    from sapptk.models import Parallel, card, estimate_profile, hardware

    source: Any = d["card"]
    if source == "dict":
        source = card("llama2-7b")
    hw: Any = d["hardware"]
    if hw == "h100+name":
        hw = hardware("h100", name=d["rename"])
    elif hw == "h100+bad":
        hw = hardware("h100", peak_tflops=d["rename"])
    profile = estimate_profile(source, Parallel(**d["parallel"]), hw)
    the_card = card(source) if isinstance(source, str) else source
    expect(profile.num_body_layers == the_card.num_layers,
           f"{profile.num_body_layers} layers for {the_card.num_layers}")
    expect(profile.seq_length == Parallel(**d["parallel"]).seq_length, "seq_length lost")
    for g in profile.groups:
        expect(math.isfinite(g.forward) and g.forward >= 0 and math.isfinite(g.params) and g.params >= 0, g.name)


def run_choose(d: dict[str, Any], folder: Path) -> None:
    import sapptk

    kw = d["kw"]
    began = time.perf_counter()
    choice = sapptk.choose(d["source"], **kw)
    limit = kw["time_limit"] if isinstance(kw.get("time_limit"), float) else 1.0
    rows = max(1, len(choice.frame))
    timed(limit * rows + kw.get("bound_time", 1.0) * 4 * rows, began, "choose")
    check_choice(choice)
    if d["twice"] and choice.best.solved and isinstance(kw.get("memory_budget"), float):
        more = sapptk.choose(d["source"], **{**kw, "memory_budget": kw["memory_budget"] * 2})
        if more.proven and choice.proven:
            expect(float(more.best.step_time) <= float(choice.best.step_time) * (1 + 1e-9) + 1e-6,
                   f"a larger budget gave a slower winner: {more.best.step_time} > {choice.best.step_time}")


def run_request(d: dict[str, Any], folder: Path) -> None:
    import sapptk
    from sapptk import PipelineConfig
    from sapptk.request import SolveRequest

    profile = sapptk.bundled_profile(d["profile"])
    config = PipelineConfig(d["p"], d["m"], memory_budget=d["budget"])
    kw = dict(d["kw"])
    if d["start"]:
        kw["start"] = np.array(sapptk.even_split(profile, config, "strongest").counts)
    elif "start" in kw and isinstance(kw["start"], list):
        kw["start"] = np.array(kw["start"], dtype=object) if kw["start"] else None
    request = SolveRequest(profile, config, **kw)
    again = pickle.loads(pickle.dumps(request))
    expect(again == request and hash(again) == hash(request), "a request unequal to itself after pickling")
    if d["solve"]:
        began = time.perf_counter()
        plan = sapptk.solve(request.replace(time_limit=min(float(request.time_limit), 1.0)))
        timed(min(float(request.time_limit), 1.0), began, "solve")
        check_plan_fits(plan)


_LONG: dict[str, Any] = {}


def _long_profile() -> Any:
    if "p" not in _LONG:
        import sapptk
        from sapptk.models import Parallel

        _LONG["p"] = sapptk.estimate_profile("llama2-7b", Parallel(tp=8, seq_length=4096), "h100")
    return _LONG["p"]


def run_seq(d: dict[str, Any], folder: Path) -> None:
    import sapptk
    from sapptk import PipelineConfig

    profile = _long_profile()
    chunks = 2 if d["schedule"] == "seq-interleaved-lm" else 1

    def solve(budget: float) -> Any:
        config = PipelineConfig(2, 4, chunks=chunks, schedule=d["schedule"], splits=d["splits"],
                                memory_budget=budget)
        began = time.perf_counter()
        plan = sapptk.balance(profile, config, time_limit=d["time_limit"], choose_splits=d["choose_splits"])
        timed(d["time_limit"], began, "balance")
        check_plan_fits(plan)
        return plan

    plan = solve(d["budget"])
    if d["monotone"] and plan.status == "infeasible":
        for lower in (d["budget"] * 0.9, d["budget"] * 0.8):
            other = solve(lower)
            expect(not (other.solved and other.fits),
                   f"infeasible at {d['budget']:g} MB, yet a plan fits at {lower:g} MB")


def _read_back(fmt: str, text: str, plan: Any, folder: Path) -> Any:
    """The export read back from a file, as a user would."""
    import sapptk

    if fmt == "torch-csv":
        return None
    path = folder / {"sapptk": "back.yaml", "mindformers": "back.yaml", "megatron": "back.txt",
                     "torchtitan": "back.toml"}[fmt]
    path.write_text(text, encoding="utf-8")
    if fmt == "sapptk":
        return sapptk.load_plan(path)
    if fmt == "torchtitan":
        return sapptk.load_plan(path, "torchtitan", profile=plan.profile)
    return sapptk.load_plan(path, fmt, profile=plan.profile, config=plan.config)


def run_formats(d: dict[str, Any], folder: Path) -> None:
    import tomllib

    import yaml

    import sapptk
    from sapptk import PipelineConfig
    from sapptk.profile import bundled_profile

    profile = bundled_profile("demo")
    profile = dataclasses.replace(profile, name=d["name"])
    if d["group"] is not None:
        body = profile.body[0]
        groups = tuple(dataclasses.replace(g, name=d["group"]) if g is body else g for g in profile.groups)
        profile = dataclasses.replace(profile, groups=groups)
    chunks = 2 if d["schedule"] == "interleaved" else 1
    plan = sapptk.even_split(profile, PipelineConfig(2, 4, chunks=chunks, schedule=d["schedule"]))
    if d["source"] is not None:
        plan = dataclasses.replace(plan, source=d["source"])
    fmt = d["target"]
    target = {"none": None, "file": folder / "out.txt", "dev_link": folder / "null", "fifo": folder / "fifo",
              "dir": folder / "dir", "yaml_marker": folder / "m.yaml"}[d["out"]]
    if d["out"] == "dev_link":
        target.symlink_to(os.devnull)  # never the device itself: a regression replaces our link
    elif d["out"] == "fifo":
        os.mkfifo(target)
    elif d["out"] == "dir":
        target.mkdir()
    before = None if target is None or not target.exists() else os.stat(target)
    kw: dict[str, Any] = {}
    if fmt == "torchtitan" and d["csv_name"] is not None:
        kw["csv_name"] = str(folder / d["csv_name"])
    try:
        out = plan.export(fmt, None if d["out"] == "yaml_marker" else target, **kw)
    finally:
        if before is not None:
            after = os.stat(target)
            expect((after.st_ino, stat.S_IFMT(after.st_mode)) == (before.st_ino, stat.S_IFMT(before.st_mode)),
                   f"the export replaced a {d['out']}")
    texts = dict(out.texts)
    if fmt == "torchtitan":
        tomllib.loads(texts["toml"])
        compile(texts["python"], "plan.py", "exec")
        out = dataclasses.replace(out, text=texts["toml"]) if "toml" in texts else out
    if fmt in ("mindformers", "sapptk"):
        yaml.safe_load(out.text)
    if d["out"] == "yaml_marker" and fmt == "sapptk":
        target.write_text("---\n" + out.text, encoding="utf-8")
        back = sapptk.load_plan(target)
    else:
        back = _read_back(fmt, out.text, plan, folder)
    if back is not None:
        expect(np.array_equal(back.counts.sum(axis=1), plan.counts.sum(axis=1)),
               f"{fmt}: the export reads back as another layout")


def run_calibrate(d: dict[str, Any], folder: Path) -> None:
    import pandas as pd

    import sapptk
    from sapptk.calibration.observations import observations_from_frame
    from sapptk.calibration.prior import scaled_profile
    from sapptk.models import Parallel

    if d["mode"] == "cell":
        frame = pd.DataFrame([{"run": "dry", "device": dev, "peak_mb": 1000.0, "schedule": "1f1b", "stages": 2,
                               "micro_batches": 4, "chunks": 1, "layers": 8, "offset": d["cell"]} for dev in range(2)])
        observations_from_frame(frame)
        return
    prior = sapptk.estimate_profile("llama2-7b", Parallel(tp=2, seq_length=d["seq"]), "h100")
    out = scaled_profile(prior, {"static": d["scale"], "activation": d["scale"], "time": 1.0})
    expect(out.seq_length == prior.seq_length, f"seq_length {out.seq_length} for {prior.seq_length}")
    for a, b in zip(prior.groups, out.groups, strict=True):
        expect(b.attention_share == a.attention_share, f"{a.name}: attention_share lost")
        expect((a.kv_mb_per_token is None) == (b.kv_mb_per_token is None), f"{a.name}: kv_mb_per_token lost")


RUNNERS = {"cards": run_cards, "estimate": run_estimate, "choose": run_choose, "request": run_request,
           "seq": run_seq, "formats": run_formats, "calibrate": run_calibrate}

__all__ = ["GENERATORS", "RUNNERS", "SURFACES", "Wrong", "make_cases", "run_case"]
