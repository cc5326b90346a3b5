"""Long-context costs of sequence slices: causal shares, K/V memory, slice lengths, and the
exactness of the simulator against a plain-Python walk (prediction = simulation)."""

from __future__ import annotations

import numpy as np
import pytest

from sapptk import baselines
from sapptk.config import PipelineConfig
from sapptk.costs import peak_memory, simulate_counts, slice_costs
from sapptk.errors import ConfigError
from sapptk.plan import even_split
from sapptk.profile import LayerGroup, ModeCost, Profile
from sapptk.schedules import build
from sapptk.seq import equal_lengths, slice_shares
from sapptk.simulation import simulate
from sapptk.solver.slices import choose_slices, equal_cost_lengths


def long_profile(*, layers: int = 8, seq: int = 4096, share: float = 0.5, kv: float | None = 0.001,
                 head: bool = True) -> Profile:
    modes = {"none": ModeCost(2.0, 10.0), "full": ModeCost(3.0, 1.0)}
    body = LayerGroup("layer", "body", layers, 1.0, 100.0, modes, kv_mb_per_token=kv, attention_share=share)
    ends = (LayerGroup("emb", "head", 1, 0.1, 50.0), body, LayerGroup("out", "tail", 1, 0.2, 60.0))
    return Profile("long", ends if head else (body,), seq_length=seq)


# ------------------------------------------------------------------ shares
def test_causal_shares_hand_cases() -> None:
    linear, causal = slice_shares([1, 1])
    assert linear.tolist() == [0.5, 0.5] and causal.tolist() == [0.25, 0.75]
    for k in (2, 3, 4, 8):  # equal slices: (2j + 1)/k²
        _, causal = slice_shares([5] * k)
        assert causal == pytest.approx([(2 * j + 1) / k**2 for j in range(k)])
    rng = np.random.default_rng(7)
    for _ in range(20):
        linear, causal = slice_shares(rng.integers(1, 1000, rng.integers(1, 9)))
        assert linear.sum() == pytest.approx(1.0) and causal.sum() == pytest.approx(1.0)
        assert np.all(np.diff(causal / linear) > 0) or len(linear) == 1  # a later token attends to more


def test_equal_lengths_and_equal_cost_cut() -> None:
    assert equal_lengths(10, 4).tolist() == [3, 3, 2, 2]
    # all attention, k = 2: the boundary x solves x² = 1/2
    assert equal_cost_lengths(10_000, 2, 1.0).tolist() == [7071, 2929]
    assert equal_cost_lengths(8192, 4, 0.0, quantum=64).tolist() == [2048] * 4
    lengths = equal_cost_lengths(32768, 8, 0.4, quantum=128)
    assert lengths.sum() == 32768 and (lengths % 128 == 0).all() and np.all(np.diff(lengths) <= 0)
    linear, causal = slice_shares(equal_cost_lengths(1 << 20, 4, 0.4))
    assert 0.6 * linear + 0.4 * causal == pytest.approx([0.25] * 4, rel=1e-4)


# ------------------------------------------------------------------ simulator walk
def walk(program, f, b, act, kv) -> tuple[float, list[float]]:
    """Plain Python: units in device order, each starting when its device and its inputs are done;
    memory by order (allocations of a unit, record, then its frees). f, b, act, kv: [vs][mb][slice]."""
    k, nvs = program.splits, program.num_virtual_stages
    end: dict = {}
    pos = [0] * program.stages
    clock = [0.0] * program.stages
    units = program.units
    while any(pos[d] < len(units[d]) for d in range(program.stages)):
        moved = False
        for d in range(program.stages):
            if pos[d] >= len(units[d]):
                continue
            (op,) = units[d][pos[d]]
            kind, m, v, j = op
            if kind == "F":
                deps = [("F", m, v - 1, j)] * (v > 0) + [("F", m, v, j - 1)] * (j > 0)
            else:
                deps = [("B", m, v + 1, j) if v < nvs - 1 else ("F", m, v, j)] + [("B", m, v, j + 1)] * (j < k - 1)
            if not all(dep in end for dep in deps):
                continue
            start = max([clock[d]] + [end[dep] for dep in deps])
            end[(kind, m, v, j)] = clock[d] = start + (f if kind == "F" else b)[v][m][j]
            pos[d] += 1
            moved = True
        assert moved, "deadlock"
    peaks = []
    for d in range(program.stages):
        live, peak = 0.0, 0.0
        for (op,) in units[d]:
            kind, m, v, j = op
            if kind == "F":
                live += act[v][m][j] + kv[v][m][j]
                peak = max(peak, live)
            else:
                live -= act[v][m][j]
                if j == 0:
                    live -= sum(kv[v][m])
        peaks.append(peak)
    return max(end.values()), peaks


@pytest.mark.parametrize(("name", "v"), [("seq1f1b", 1), ("seq-interleaved", 2), ("seq-interleaved-lm", 2)])
def test_unequal_slice_costs_and_kv_match_a_plain_walk(name: str, v: int) -> None:
    rng = np.random.default_rng(11)
    for p, m, k in ((2, 2, 2), (3, 4, 3), (4, 4, 2)):
        program = build(name, stages=p, micro_batches=m, chunks=v, splits=k)
        shape = (p * v, m, k)
        f, b, act, kv = (rng.uniform(0.1, 3.0, shape) for _ in range(4))
        sim = simulate(program, forward=f, backward=b, activation=act, kv=kv)
        step, peaks = walk(program, f, b, act, kv)
        assert sim.step_time == pytest.approx(step, rel=1e-12)
        assert sim.peak_memory.to_numpy() == pytest.approx(peaks, rel=1e-12)
        assert sim.memory.groupby("device")["kv_mb"].last().abs().max() < 1e-9  # all K/V freed


def test_kv_hand_case_seq1f1b() -> None:
    """p = 2, m = 2, k = 2, F = 1, B = 2, activation 10 and K/V 4 per micro-batch (5 and 2 a slice).
    Device 0 peaks at 3.5 ms when F1/1 starts: slices F0/0, F1/0, F1/1 alive (15 MB) and the K/V
    of both micro-batches (8 MB): 23 MB; device 1 at 16 MB (two slices and both micro-batches' K/V
    less one: 10 + 6)."""
    program = build("seq1f1b", stages=2, micro_batches=2, splits=2)
    sim = simulate(program, forward=1, backward=2, activation=10, kv=4)
    assert sim.peak_memory.tolist() == [23.0, 16.0]
    d0 = sim.memory[sim.memory.device == 0]
    assert d0.loc[d0.memory_mb.idxmax(), ["time_ms", "kv_mb"]].tolist() == [3.5, 8.0]
    assert sim.step_time == 7.5  # K/V changes memory, not time


# ------------------------------------------------------------------ profile → slice costs
def test_sliced_plan_costs_by_hand() -> None:
    """One body layer per stage (forward 1, backward 2, share 0.5), k = 2 equal slices: slice 0
    forward = 0.5·0.5 + 0.5·0.25 = 0.375 ms, slice 1 = 0.25 + 0.375 = 0.625 ms; K/V 0.001 MB/token
    × 2048 tokens = 2.048 MB a slice; activation 5 MB a slice."""
    profile = long_profile(layers=2, head=False)
    config = PipelineConfig(2, 2, 1, "seq1f1b", splits=2)
    costs = slice_costs(profile, config, baselines.even_counts(profile, config))
    assert costs.forward[0, 0].tolist() == pytest.approx([0.375, 0.625])
    assert costs.backward[1, 1].tolist() == pytest.approx([0.75, 1.25])
    assert costs.activation[0, 0].tolist() == pytest.approx([5.0, 5.0])
    assert costs.kv[0, 0].tolist() == pytest.approx([2.048, 2.048])
    sim = simulate_counts(profile, config, baselines.even_counts(profile, config))
    step, peaks = walk(config.program(), costs.forward, costs.backward, costs.activation, costs.kv)
    assert sim.step_time == pytest.approx(step) and (sim.peak_memory.to_numpy() - 100) == pytest.approx(peaks)


@pytest.mark.parametrize(("name", "v"), [("seq1f1b", 1), ("seq-interleaved", 2), ("seq-interleaved-lm", 2)])
def test_plan_prediction_equals_simulation(name: str, v: int) -> None:
    profile = long_profile(layers=16)
    config = PipelineConfig(4, 8, v, name, splits=[1536, 1024, 896, 640], memory_budget=1e6)
    plan = even_split(profile, config)
    sim = plan.simulate()
    assert plan.step_time == sim.step_time
    assert peak_memory(profile, config, plan.counts) == pytest.approx(sim.peak_memory.to_numpy())
    assert sim.memory["kv_mb"].max() > 0
    linear = PipelineConfig(4, 8, v, name, splits=4)  # equal, linear, no K/V: the classic closed form
    flat = Profile("flat", (LayerGroup("layer", "body", 16, 1.0, 0.0, {"none": ModeCost(2.0, 1.0)},
                                       kv_mb_per_token=0.0),), seq_length=4096)
    per_chunk = 3.0 * 16 / (4 * v)  # F + B of the 16 / (4v) layers of a chunk
    assert even_split(flat, linear).step_time == pytest.approx((v * 8 * 4 + 3) * per_chunk / 4)


def test_without_seq_length_slices_stay_equal_linear() -> None:
    profile = long_profile(layers=16, head=False)
    legacy = Profile("legacy", profile.groups)  # same groups, no seq_length
    config = PipelineConfig(4, 8, 2, "seq-interleaved", splits=4)
    sim = simulate_counts(legacy, config, baselines.even_counts(legacy, config))
    assert sim.memory["kv_mb"].max() == 0
    assert sim.step_time == pytest.approx((2 * 8 * 4 + 3) * (2 * 1.0 + 2 * 2.0) / 4)  # 2 layers of F 1, B 2 per chunk


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize(
    ("profile", "splits", "fragments"),
    [
        (long_profile(), [2000, 2000], ("splits = [2000, 2000]", "sum to 4000", "seq_length = 4096")),
        (long_profile(), [4096, 0], ("splits[1] = 0", "integer >= 1")),
        (long_profile(seq=3), 4, ("splits = 4", "more slices than", "seq_length = 3")),
        (long_profile(kv=None), 2, ("body group 'layer'", "kv_mb_per_token", "estimator")),
        (Profile("x", long_profile().groups), [2048, 2048], ("seq_length", "profile 'x' has none")),
    ],
)
def test_bad_slices_name_the_argument(profile: Profile, splits, fragments) -> None:
    with pytest.raises(ConfigError) as info:
        PipelineConfig(2, 2, 1, "seq1f1b", splits=splits).check(profile)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_attention_share_on_the_head_is_refused() -> None:
    profile = long_profile()
    head = LayerGroup("emb", "head", 1, 0.1, 50.0, attention_share=0.2)
    bad = Profile("bad", (head, *profile.groups[1:]), seq_length=4096)
    with pytest.raises(ConfigError, match="head group 'emb' has attention_share"):
        PipelineConfig(2, 2, 1, "seq1f1b", splits=2).check(bad)


# ------------------------------------------------------------------ chosen boundaries
def test_chosen_slices_never_worse_and_exact() -> None:
    profile = long_profile(layers=16, seq=32768, share=0.4)
    config = PipelineConfig(4, 4, 1, "seq1f1b", splits=4)
    counts = baselines.even_counts(profile, config)
    choice = choose_slices(profile, config, counts, time_limit=5)
    assert sum(choice.lengths) == 32768 and choice.fits
    assert choice.step_time <= choice.equal_step_time and choice.bubble_gain > 0.1
    chosen = simulate_counts(profile, config.replace(splits=list(choice.lengths)), counts)
    assert chosen.step_time == pytest.approx(choice.step_time, rel=1e-12)
    equal = simulate_counts(profile, config, counts)
    assert equal.step_time == pytest.approx(choice.equal_step_time, rel=1e-12)
    assert equal.bubble.idle == pytest.approx(choice.equal_idle) and chosen.bubble.idle == pytest.approx(choice.idle)


def test_choose_slices_bad_input() -> None:
    profile = long_profile()
    config = PipelineConfig(2, 2, 1, "seq1f1b", splits=2)
    counts = baselines.even_counts(profile, config)
    with pytest.raises(ConfigError, match="quantum = 0"):
        choose_slices(profile, config, counts, quantum=0)
    with pytest.raises(ConfigError, match="expected k > 1 slices"):
        choose_slices(profile, config.replace(splits=1, schedule="1f1b"), counts)


# ------------------------------------------------------------------ balance
@pytest.mark.parametrize(("name", "v"), [("seq1f1b", 1), ("seq-interleaved", 2), ("seq-interleaved-lm", 2)])
def test_balance_sliced_setup(name: str, v: int) -> None:
    from sapptk.balancer import balance

    profile = long_profile(layers=16, seq=16384, share=0.4, kv=0.002)
    free = balance(profile, PipelineConfig(4, 8, v, name, splits=4), time_limit=5)
    budget = float(free.simulation.peak_memory.max()) * 0.97  # binding: the free plan does not fit
    plan = balance(profile, PipelineConfig(4, 8, v, name, splits=4, memory_budget=budget), time_limit=5,
                   choose_splits=True)
    assert plan.status == "feasible" and plan.bound is None and plan.fits, plan.message
    sim = plan.simulate()
    assert plan.step_time == sim.step_time and (sim.peak_memory <= budget + 1e-6).all()
    assert peak_memory(profile, plan.config, plan.counts) == pytest.approx(sim.peak_memory.to_numpy())
    assert sum(plan.config.slice_lengths) == 16384 and "less bubble than equal lengths" in plan.message
    equal = simulate_counts(profile, plan.config.replace(splits=4, slice_lengths=None), plan.counts)
    assert plan.step_time <= equal.step_time


def test_balance_sliced_refusals() -> None:
    from sapptk.balancer import balance

    profile = long_profile()
    with pytest.raises(ConfigError, match="choose_splits = True: splits = 1"):
        balance(profile, PipelineConfig(2, 2, 1, "1f1b"), choose_splits=True)
    with pytest.raises(ConfigError, match="per_micro_batch = True: not modelled"):
        balance(profile, PipelineConfig(2, 2, 1, "seq1f1b", splits=2), per_micro_batch=True)
    with pytest.raises(ConfigError, match="kv_mb_per_token"):
        balance(long_profile(kv=None), PipelineConfig(2, 2, 1, "seq1f1b", splits=2))


# ------------------------------------------------------------------ exports
def test_exports_of_a_sliced_plan() -> None:
    profile = long_profile(layers=16)
    plan = even_split(profile, PipelineConfig(4, 8, 2, "seq-interleaved", splits=4))
    text = plan.export("mindformers").text
    assert "parallel_config: {seq_split_num: 4}" in text and "pp_interleave_num (v) = 2" in text
    for fmt, target in (("megatron", "Megatron-LM arguments"), ("torchtitan", "torchtitan settings"),
                        ("torch-csv", "PyTorch's schedule CSV")):
        with pytest.raises(ConfigError, match=f"{target} cannot express sequence slices: this plan runs "
                                              "'seq-interleaved' with k = 4 slices"):
            plan.export(fmt)
    unequal = even_split(profile, PipelineConfig(4, 8, 2, "seq-interleaved", splits=[1536, 1024, 896, 640]))
    with pytest.raises(ConfigError, match=r"cannot express unequal slice lengths \[1536, 1024, 896, 640\]"):
        unequal.export("mindformers")
    for fmt in ("megatron", "torchtitan", "torch-csv"):  # never sends the user to the format that just refused it
        with pytest.raises(ConfigError, match=r"keep it as a sapptk plan .*MindFormers runs equal slices only") as info:
            unequal.export(fmt)
        assert "export it to MindFormers" not in str(info.value)


def test_plan_file_keeps_the_slice_lengths(tmp_path) -> None:
    from sapptk.plan import load_plan

    config = PipelineConfig(4, 8, 2, "seq-interleaved", splits=[1536, 1024, 896, 640])
    plan = even_split(long_profile(layers=16), config)
    again = load_plan(plan.export("sapptk", tmp_path / "plan.yaml") and tmp_path / "plan.yaml")
    assert again.config.slice_lengths == (1536, 1024, 896, 640) and again.profile.seq_length == 4096
    assert again.simulate().step_time == plan.step_time


def test_timeline_draws_the_kv() -> None:
    from sapptk import viz

    plan = even_split(long_profile(layers=16), PipelineConfig(4, 8, 2, "seq-interleaved", splits=4))
    fig = viz.timeline(plan)
    kv = [r for r in fig.select({"name": "kv"})]
    assert len(kv) == 1
    assert max(kv[0].data_source.data["memory_mb"]) == pytest.approx(plan.simulation.memory.kv_mb.max())
    # visible: on a pane of its own whose scale it fills (not flat under the memory axis), one scale in a compare
    from bokeh.models import Plot

    pane = next(f for f in fig.select({"type": Plot}) if kv[0] in f.renderers)
    assert pane.y_range.start == 0 and pane.y_range.end <= 1.1 * plan.simulation.memory.kv_mb.max()
    assert "K/V" in pane.title.text and "K/V" in pane.yaxis[0].axis_label
    sliced = even_split(long_profile(layers=16), PipelineConfig(4, 8, 2, "seq-interleaved", splits=[1536, 1024,
                                                                                                    896, 640]))
    both = viz.compare(plan, sliced, labels=["equal", "chosen"], memory=True)
    panes = [f for f in both.select({"type": Plot}) if any(r.name == "kv" for r in f.renderers)]
    assert sorted(p.title.text for p in panes) == ["chosen: K/V held", "equal: K/V held"]
    assert panes[0].y_range.end == panes[1].y_range.end
    flat = even_split(Profile("flat", long_profile(layers=16).groups), PipelineConfig(4, 8, 2, "seq-interleaved",
                                                                                       splits=4))
    assert not list(viz.timeline(flat).select({"name": "kv"}))


def test_sweep_takes_the_new_schedules() -> None:
    from sapptk.balancer import balance
    from sapptk.sweeps import sweep

    profile = long_profile(layers=8)
    grid = {"stages": [2], "micro_batches": [4], "chunks": [2], "splits": [2],
            "schedule": ["seq-interleaved", "seq-interleaved-lm"]}
    frame = sweep(profile, grid, point_time_limit=2, progress=False, deterministic=True)
    assert frame["schedule"].astype(str).tolist() == grid["schedule"]
    assert frame["status"].astype(str).eq("feasible").all()
    for _, row in frame.iterrows():
        plan = balance(profile, PipelineConfig(2, 4, 2, row["schedule"], splits=2), time_limit=2, deterministic=True)
        assert row["step_time_ms"] == plan.step_time == plan.simulate().step_time


def test_cli_slice_lengths_and_choose_splits(tmp_path, capsys) -> None:
    from sapptk.cli import main

    path = tmp_path / "long.yaml"
    long_profile(layers=8, head=False, seq=8192).to_yaml(path)
    base = [str(path), "-p", "2", "-m", "4", "--time-limit", "3"]
    assert main(["balance", *base, "-v", "2", "--schedule", "seq-interleaved", "-k", "4", "--choose-splits"]) == 0
    assert "less bubble than equal lengths [2048, 2048, 2048, 2048]" in capsys.readouterr().out
    assert main(["balance", *base, "--schedule", "seq1f1b", "-k", "4096,2048,2048"]) == 0
    assert "seq1f1b, p=2, v=1, m=4, k=3" in capsys.readouterr().out
    assert main(["balance", *base, "--schedule", "seq1f1b", "-k", "4096,2000"]) != 0
    assert "sum to 6096 tokens: expected the profile's seq_length = 8192" in capsys.readouterr().err
    assert main(["balance", *base, "--schedule", "seq1f1b", "-k", "4096,x"]) != 0
    assert "comma-separated slice lengths" in capsys.readouterr().err


def test_analyses_that_retime_per_stage_costs_refuse_sliced_plans() -> None:
    plan = even_split(long_profile(layers=16), PipelineConfig(4, 8, 2, "seq-interleaved", splits=4))
    for call, what in ((plan.sensitivity, "sensitivity"), (plan.critical, "critical")):
        with pytest.raises(ConfigError, match=f"{what}: not modelled for the sequence slices"):
            call()
    from sapptk.plan import make_plan

    with pytest.raises(ConfigError, match="offload: not modelled with the sequence slices"):
        make_plan(plan.profile, plan.config, plan.counts, status="given", offload=np.zeros((1, 8), dtype=int))


def test_layer_moves_only_improve_and_stay_valid() -> None:
    import time

    from sapptk.solver.slices import move_layers

    base = long_profile(layers=16, seq=32768, share=0.6)
    heavy_tail = LayerGroup("out", "tail", 1, 3.0, 60.0)  # the last stage is the bottleneck of an even split
    profile = Profile("tail", (*base.groups[:2], heavy_tail), seq_length=32768)
    config = PipelineConfig(4, 4, 1, "seq1f1b", splits=4)
    start = baselines.even_counts(profile, config)
    moved, kept, timed = move_layers(profile, config, start, deadline=time.perf_counter() + 5)
    before = simulate_counts(profile, config, start).step_time
    after = simulate_counts(profile, config, moved).step_time
    assert kept >= 1 and timed >= kept and after < before
    assert (moved != start).any()
    assert moved.sum(axis=(1, 2)).tolist() == [16] and (moved.sum(axis=(0, 1)) >= 1).all()


def test_random_sliced_setups_match_the_walk() -> None:
    """Random long-context profiles, slice lengths and setups: the simulated step and peaks of a plan
    equal the plain-Python walk over its per-slice costs (prediction = simulation, K/V included)."""
    rng = np.random.default_rng(2026)
    names = [("seq1f1b", 1), ("seq-interleaved", 2), ("seq-interleaved-lm", 2), ("seq-interleaved", 3)]
    for _ in range(40):
        name, v = names[rng.integers(len(names))]
        p, k = int(rng.integers(2, 5)), int(rng.integers(2, 6))
        m = int(rng.integers(p, 2 * p + 2))
        seq = int(rng.integers(64, 4096))
        cuts = np.sort(rng.choice(np.arange(1, seq), k - 1, replace=False))
        lengths = np.diff(np.r_[0, cuts, seq]).tolist()
        profile = long_profile(layers=int(rng.integers(p * v, 4 * p * v)), seq=seq, share=float(rng.uniform(0, 1)),
                               kv=float(rng.uniform(0, 0.01)), head=bool(rng.integers(2)))
        config = PipelineConfig(p, m, v, name, splits=lengths)
        counts = baselines.even_counts(profile, config)
        costs = slice_costs(profile, config, counts)
        sim = simulate_counts(profile, config, counts)
        step, peaks = walk(config.program(), costs.forward, costs.backward, costs.activation, costs.kv)
        static = sim.summary["static_mb"].to_numpy()
        assert sim.step_time == pytest.approx(step, rel=1e-12)
        assert sim.peak_memory.to_numpy() - static == pytest.approx(peaks, rel=1e-9, abs=1e-9)


def test_slice_live_points_give_the_simulated_peaks() -> None:
    """The balancer-side peaks of a sliced plan (integer live rows over (chunk, slice) activation and
    K/V columns) equal the simulator's, over random lengths, shares and schedules."""
    from sapptk.seq import slice_live_points

    rng = np.random.default_rng(5)
    for name, v in [("seq1f1b", 1), ("seq-interleaved", 2), ("seq-interleaved-lm", 2), ("seq-interleaved-lm", 3)]:
        for _ in range(4):
            p, k = int(rng.integers(2, 5)), int(rng.integers(2, 5))
            seq = int(rng.integers(64, 2048))
            cuts = np.sort(rng.choice(np.arange(1, seq), k - 1, replace=False))
            config = PipelineConfig(p, int(rng.integers(p, 2 * p + 2)), v, name,
                                    splits=np.diff(np.r_[0, cuts, seq]).tolist())
            profile = long_profile(layers=3 * p * v, seq=seq, share=float(rng.uniform(0, 1)),
                                   kv=float(rng.uniform(0, 0.05)))
            counts = baselines.even_counts(profile, config)
            rows = slice_live_points(config.program())
            assert all(r.dtype == np.int64 and r.shape[1] == 2 * k * len(st)
                       for r, st in zip(rows, config.program().device_stages, strict=True))
            assert peak_memory(profile, config, counts) == pytest.approx(
                simulate_counts(profile, config, counts).peak_memory.to_numpy(), rel=1e-12)


def test_deterministic_sliced_balance_repeats() -> None:
    from sapptk.balancer import balance

    profile = long_profile(layers=16, seq=16384, share=0.5)
    config = PipelineConfig(4, 8, 2, "seq-interleaved", splits=4)
    first, second = (balance(profile, config, time_limit=2, choose_splits=True, deterministic=True) for _ in range(2))
    assert first.config.slice_lengths == second.config.slice_lengths and first.step_time == second.step_time
    assert np.array_equal(first.counts, second.counts)
