"""sapptk.trials without torch: the folders plan() writes, ingest() on runs written from a
simulation with known costs (the fit must give them back), every bad input, and rerank."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

import sapptk
from sapptk.errors import ConfigError
from sapptk.profile import LayerGroup, ModeCost, Profile
from sapptk.schedules import build
from sapptk.simulation import simulate
from sapptk.trials import Calibrated, ingest, plan, rerank

PER_LAYER = {"F": 1.5, "B": 3.0}  # ms per layer per micro-batch in the synthetic runs


@pytest.fixture(scope="module")
def choice():
    profile = Profile("tiny", (LayerGroup("block", "body", 8, 1.0, 1.0, {"none": ModeCost(2.0, 1.0)}),))
    return sapptk.choose(profile, devices=4, global_batch=8, memory_budget=None, stages=[4],
                         schedules=["gpipe", "1f1b", "interleaved"], time_limit=2, seed=0, deterministic=True)


def _write_run(folder: Path, name: str = "r1", *, key: str | None = None, status: str = "ok",
               steps: int = 3) -> Path:
    """A run of the trial in ``folder`` as the runner writes it, its traces from sapptk's own
    simulation with ``PER_LAYER`` costs (no gaps, no lag): the fit must give them back."""
    manifest = json.loads((folder / "manifest.json").read_text())
    setup = manifest["setup"]
    key = key or manifest["key"]
    program = build(setup["schedule"], stages=setup["stages"], micro_batches=setup["micro_batches"],
                    chunks=setup["chunks"])
    layers = np.asarray(setup["layers_per_virtual_stage"], dtype=float)
    sim = simulate(program, forward=PER_LAYER["F"] * layers, backward=PER_LAYER["B"] * layers)
    run = folder / "runs" / name
    run.mkdir(parents=True)
    world = setup["stages"] * setup["dp"]
    for rank in range(world):
        events = [{"ph": "X", "name": f"sapptk:trial:{key}", "ts": 0, "dur": 1, "pid": 1, "tid": 1}]
        for step in range(steps):
            t0 = 1000.0 + step * (sim.step_time + 10) * 1e3
            events.append({"ph": "X", "name": f"ProfilerStep#{step}", "ts": t0, "dur": sim.step_time * 1e3,
                           "pid": 1, "tid": 1})
            for e in sim.events[sim.events["device"] == rank].itertuples():
                events.append({"ph": "X", "name": f"sapptk:{e.kind}:{e.virtual_stage}:{e.micro_batch}",
                               "ts": t0 + e.start_ms * 1e3, "dur": (e.end_ms - e.start_ms) * 1e3, "pid": 1, "tid": 1})
        (run / f"trace_rank{rank}.json").write_text(json.dumps({"traceEvents": events}))
        record = {"trial": key, "rank": rank, "status": status, "wall_ms": [sim.step_time] * steps,
                  "unprofiled_ms": [sim.step_time] * steps, "peak_rss_mb": 100.0 + rank}
        if status != "ok":
            record["error"] = "OutOfMemoryError: CUDA out of memory" if status == "oom" else "RuntimeError: boom"
        (run / f"rank{rank}.json").write_text(json.dumps(record))
    (run / "exit_code").write_text("0" if status == "ok" else "1")
    return run


@pytest.fixture
def planned(choice, tmp_path):
    return tmp_path, plan(choice, k=3, out=tmp_path / "trials", steps=3)


def test_plan_writes_one_folder_per_setup(choice, planned):
    _, folders = planned
    assert len(folders) == 3
    ranked = choice.frame[choice.frame["status"].isin(["balanced", "pruned", "unsolved"])].head(3)
    for folder, (_, row) in zip(folders, ranked.iterrows(), strict=True):
        names = {p.name for p in folder.iterdir()}
        assert names == {"manifest.json", "schedule.csv", "launch.sh", "train.py", "profiler.json"}
        manifest = json.loads((folder / "manifest.json").read_text())
        setup = manifest["setup"]
        assert (setup["schedule"], setup["chunks"]) == (str(row["schedule"]), int(row["chunks"]))
        assert sum(setup["layers_per_virtual_stage"]) == 8
        assert manifest["rank"] == int(row["rank"]) and manifest["purpose"]
        program = build(setup["schedule"], stages=4, micro_batches=setup["micro_batches"], chunks=setup["chunks"])
        assert (folder / "schedule.csv").read_text() == program.to_csv()
        launch = (folder / "launch.sh").read_text()
        assert "torch.distributed.run --standalone --nnodes 1 --nproc-per-node 4" in launch
        assert "sapptk:layer:<index>" in (folder / "profiler.json").read_text()
        compile((folder / "train.py").read_text(), str(folder / "train.py"), "exec")


def test_plan_refusals(choice, planned):
    root, _ = planned
    with pytest.raises(ConfigError, match="holds trials already"):
        plan(choice, out=root / "trials")
    for runtime in ("torchtitan", "megatron"):
        with pytest.raises(ConfigError, match="export the|Export the"):
            plan(choice, runtime=runtime, out=root / "other")
    with pytest.raises(ConfigError, match="k = 0"):
        plan(choice, k=0, out=root / "other")
    with pytest.raises(ConfigError, match="choice"):
        plan("not a choice", out=root / "other")
    with pytest.raises(ConfigError, match="unknown keys"):
        plan(choice, out=root / "other", model={"width": 3})
    (root / "a-file").write_text("")
    with pytest.raises(ConfigError, match="is a file"):
        plan(choice, out=root / "a-file")


def test_ingest_gives_the_costs_back_and_keeps_every_run(choice, planned):
    root, folders = planned
    _write_run(folders[0])
    _write_run(folders[1])
    _write_run(folders[1], "r2-oom", status="oom")
    raw = {p: p.read_bytes() for f in folders for p in f.rglob("*") if p.is_file()}
    cal = ingest(root / "trials")
    assert {p: p.read_bytes() for f in folders for p in f.rglob("*") if p.is_file()} == raw  # nothing rewritten
    costs = cal.costs.set_index("kind")
    for kind, value in PER_LAYER.items():
        assert costs.at[kind, "per_layer_ms"] == pytest.approx(value, rel=1e-6)
        assert costs.at[kind, "per_op_ms"] == pytest.approx(0.0, abs=1e-6)
    assert cal.overhead_ms == pytest.approx(0, abs=1e-6) and cal.comm_ms == pytest.approx(0, abs=1e-6)
    runs = cal.runs
    assert list(runs["status"]) == ["ok", "ok", "oom", "no-result"]  # the third trial never ran: kept
    ok = runs[runs["status"] == "ok"]
    assert np.allclose(ok["fitted_error"], 0, atol=1e-6)
    assert "out of memory" in runs["reason"].iloc[2]
    assert (root / "trials" / "ingest" / "runs.csv").exists()


def test_ingest_bad_input(planned, tmp_path):
    root, folders = planned
    with pytest.raises(ConfigError, match="trials.json"):
        ingest(tmp_path / "nowhere")
    with pytest.raises(ConfigError, match="nothing to fit"):
        ingest(root / "trials")  # no run yet
    good = _write_run(folders[0])
    truncated = _write_run(folders[1])
    text = (truncated / "trace_rank2.json").read_text()
    (truncated / "trace_rank2.json").write_text(text[: len(text) // 2])
    _write_run(folders[2], key="0123456789ab")  # results and trace of another trial
    missing = _write_run(folders[0], "r2")
    (missing / "rank3.json").unlink()
    runs = ingest(root / "trials").runs.set_index(["trial", "run"])
    assert runs.loc[(folders[0].name, good.name), "status"] == "ok"
    assert runs.loc[(folders[0].name, "r2"), "status"] == "no-result"
    bad = runs.loc[(folders[1].name, truncated.name)]
    assert bad["status"] == "bad-trace" and "truncated" in bad["reason"] and np.isfinite(bad["measured_ms"])
    assert runs.loc[(folders[2].name, "r1"), "status"] == "foreign"
    manifest = json.loads((folders[2] / "manifest.json").read_text())
    del manifest["setup"]["placement"]
    (folders[2] / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ConfigError, match="lacks setup.placement"):
        ingest(root / "trials")
    (folders[2] / "manifest.json").unlink()
    with pytest.raises(ConfigError, match="manifest"):
        ingest(root / "trials")


def test_rerank_with_the_true_costs(choice, planned):
    root, folders = planned
    for folder in folders:
        _write_run(folder)
    cal = ingest(root / "trials")
    assert isinstance(cal, Calibrated)
    result = rerank(choice, cal)
    frame = result.frame
    assert list(frame["rank"]) == list(range(1, len(frame) + 1))
    assert frame["calibrated_ms"].is_monotonic_increasing
    trialled = frame[frame["trial"] == "ok"]
    assert len(trialled) == 3
    assert np.allclose(trialled["calibrated_ms"], trialled["measured_ms"])
    assert result.tolerance == pytest.approx(0, abs=1e-6)
    assert result.winner_changed == (int(frame["rank_before"].iloc[0]) != 1)
    assert "winner:" in result.summary()
    with pytest.raises(ConfigError, match="calibrated"):
        rerank(choice, "costs")


def test_command_line_plan_and_ingest(tmp_path, capsys):
    from sapptk.cli import main

    out = tmp_path / "cli"
    assert main(["trials", "plan", "demo", "--devices", "4", "--global-batch", "8", "--stages", "4",
                 "--schedules", "gpipe,1f1b", "--setup-time-limit", "1", "-k", "2", "--steps", "2",
                 "--out", str(out)]) == 0
    folders = sorted(p for p in out.iterdir() if p.is_dir())
    assert len(folders) == 2 and (out / "choose.json").exists()
    assert "launch.sh" in capsys.readouterr().out
    for folder in folders:
        _write_run(folder)
    assert main(["trials", "ingest", str(out)]) == 0
    text = capsys.readouterr().out
    assert "2 runs: 2 ok" in text and "winner:" in text
    assert main(["trials", "ingest", str(tmp_path / "none")]) == 2
    assert "trials.json" in capsys.readouterr().err


def _bench():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "benchmarks" / "runtime_fidelity.py"
    spec = importlib.util.spec_from_file_location("runtime_fidelity", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_benchmark_predict_gives_back_runs_that_follow_the_time_model(tmp_path):
    """--predict on a kept folder whose traces are sapptk's own simulations with one cost per op
    kind: fitted on 1F1B and ZB-H1 at m = 8, every other run is predicted exactly."""
    bench = _bench()
    cost = {"forward": 1.0, "backward": 1.5, "weight": 0.75}  # per virtual stage; ZB's I + W = B
    cases, ranks = [], [{}, {}]
    for name, v in (("1f1b", 1), ("zb-h1", 1), ("gpipe", 1), ("interleaved", 2)):
        for m in (4, 8):
            program = build(name, stages=2, micro_batches=m, chunks=v)
            split = name == "zb-h1"  # the one schedule here that splits the backward
            sim = simulate(program, forward=cost["forward"],
                           backward=cost["backward"] if split else cost["backward"] + cost["weight"],
                           weight=cost["weight"] if split else 0.0)
            key = f"{name}_m{m}"
            cases.append({"id": key, "name": name, "m": m, "v": v, "csv": "", "placement": []})
            for rank in range(2):
                events = []
                for step in range(2):
                    t0 = step * (sim.step_time + 5) * 1e3
                    events.append({"ph": "X", "name": f"ProfilerStep#{step}", "ts": t0, "dur": sim.step_time * 1e3,
                                   "pid": 1, "tid": 1})
                    for e in sim.events[sim.events["device"] == rank].itertuples():
                        events.append({"ph": "X", "name": f"sapptk:{e.kind}:{e.virtual_stage}:{e.micro_batch}",
                                       "ts": t0 + e.start_ms * 1e3, "dur": (e.end_ms - e.start_ms) * 1e3,
                                       "pid": 1, "tid": 1})
                (tmp_path / f"{key}_rank{rank}.json").write_text(json.dumps({"traceEvents": events}))
                ranks[rank][key] = {"wall_ms": [sim.step_time] * 2}
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    for rank in range(2):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps(ranks[rank]))
    cross, loso = bench.predict(tmp_path, [("1f1b", 8), ("zb-h1", 8)])
    assert len(cross) == 6 and len(loso) == 8
    assert max(abs(r["error"]) for r in cross) < 1e-9
    interleaved = [r for r in loso if r["schedule"] == "interleaved"]
    assert max(abs(r["error"]) for r in interleaved) < 1e-9  # from the other three schedules' costs
    for across in ("median",):
        cross, loso = bench.predict(tmp_path, [("1f1b", 8), ("zb-h1", 8)], across)
        assert max(abs(r["error"]) for r in cross) < 1e-9


def test_the_first_virtual_stage_has_costs_of_its_own():
    """The first stage's input needs no gradient: its I is nearly free and its B about half.
    Pooled per kind without a term of its own, every stage's I would cost the mean of the two;
    from runs of one schedule the fit must predict another exactly."""
    from sapptk.calibration.runtime_ops import RuntimeFit

    truth = {("F", False): 1.0, ("F", True): 1.0, ("I", False): 1.2, ("I", True): 0.02, ("W", False): 1.1,
             ("W", True): 1.1, ("B", False): 2.3, ("B", True): 1.12}

    def run(schedule: str, v: int) -> tuple:
        program = build(schedule, stages=2, micro_batches=4, chunks=v)
        g = program.graph
        from sapptk.schedules import KINDS

        rows = [(0, 0, KINDS[g.op_kind[i]], int(g.op_virtual_stage[i]), int(g.op_micro_batch[i]), 0.0,
                 truth[(KINDS[g.op_kind[i]], int(g.op_virtual_stage[i]) == 0)]) for i in range(g.n_ops)]
        ops = pd.DataFrame(rows, columns=["device", "step", "kind", "virtual_stage", "micro_batch", "start_ms",
                                          "duration_ms"]).assign(layers=1)
        return ops, RuntimeFit(overhead=0.0, comm=0.0, step_ms=0.0, overhead_by_kind={}, gaps=pd.DataFrame())

    fitted = [run("1f1b", 1), run("zb-h1", 1)]
    cal = Calibrated.from_fits([o for o, _ in fitted], [f for _, f in fitted])
    costs = cal.costs.set_index("kind")
    assert costs.at["I", "per_layer_ms"] == pytest.approx(1.2) and costs.at["I", "first_ms"] == pytest.approx(-1.18)
    assert costs.at["B", "first_ms"] == pytest.approx(1.12 - 2.3) and costs.at["F", "first_ms"] == pytest.approx(0)
    for schedule, v in (("interleaved-zb", 2), ("zb-v", 2), ("gpipe", 1)):
        program = build(schedule, stages=2, micro_batches=8, chunks=v)
        n = program.num_virtual_stages
        split = schedule != "gpipe"
        first = np.arange(n) == 0
        expected = simulate(program, forward=np.full(n, 1.0),
                            backward=np.where(first, truth[("I" if split else "B", True)],
                                              truth[("I" if split else "B", False)]),
                            weight=1.1 if split else 0.0).step_time
        assert cal.predict(schedule, 2, v, 8, [1] * n) == pytest.approx(expected)
