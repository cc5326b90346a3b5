"""Megatron-LM: the layout string both ways (Megatron's grammar), the uniform-layout flags,
the recompute flags, what cannot be expressed and what it costs."""

from __future__ import annotations

import re

import numpy as np
import pytest
from support import random_counts, small_profile

from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.formats.megatron import format_layout, parse_layout, recompute_candidates, uniform_args, uniform_layers
from sapptk.plan import even_split, load_plan, make_plan
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile

NONE, SELECT, COMM, BOTH, FULL = range(5)


def megatron_expand(text: str) -> list[list[str]]:
    """Megatron-LM's own reading (PipelineParallelLayerLayout.parse_str_to_list), as published."""
    text = text.replace(",", "")
    for pattern in (r"\(([^)]+)\)\*(\d+)", r"(.)\*(\d+)"):
        text = re.sub(pattern, lambda x: x.group(1) * int(x.group(2)), text)
    return [list(stage) for stage in text.split("|")]


def test_layout_strings_read_as_megatron_reads_them(rng):
    for _ in range(300):
        n = int(rng.integers(1, 12))
        layers = [int(x) for x in rng.choice([0, 1, 2, 2, 3, 7], n)]
        text = format_layout(layers)
        expect = [["E"] * (i == 0) + ["t"] * k + ["L"] * (i == n - 1) for i, k in enumerate(layers)]
        assert megatron_expand(text) == expect, text
        assert [list(s) for s in parse_layout(text)] == expect
    assert format_layout([3] + [2] * 30 + [1]) == "Et*3|(tt|)*30,tL"


def test_megatrons_documented_examples():
    stages = parse_layout("Et*3|(tt|)*29,m|L")
    assert len(stages) == 32 and stages[0] == "Ettt" and stages[1:30] == ["tt"] * 29 and stages[30:] == ["m", "L"]
    assert parse_layout("E|(tt|)*2,(t|)*4,mL") == ["E", "tt", "tt", "t", "t", "t", "t", "mL"]
    assert parse_layout("E||t|L") == ["E", "", "t", "L"]


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("Etx|L", "position 3: character 'x'"),
        ("E(t(t|)*2)*2|L", "position 4: nested '('"),
        ("E*|L", "position 2: '*' must follow a layer"),
        ("(tt|L", "'(' without ')'"),
        ("Ett)|L", "position 4: ')' without '('"),
        ("(tt|)|L", "position 5: ')' must be followed"),
        ("", "expected a layout string"),
    ],
)
def test_bad_layout_strings_name_the_position(text, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        parse_layout(text)


def tiny(n: int = 12) -> Profile:
    body = LayerGroup("layer", "body", n, 1.0, 10.0, {"none": ModeCost(2.0, 8.0), "select": ModeCost(2.1, 5.0),
                                                       "full": ModeCost(3.0, 1.0)})
    return Profile("tiny", (LayerGroup("emb", "head", 1, 0.5, 20.0), body, LayerGroup("out", "tail", 1, 1.0, 20.0)))


@pytest.mark.parametrize(
    ("layout", "needle"),
    [
        ("Et*5|t*5|L", "3 stages: expected a multiple of the 2 pipeline stages"),
        ("Et*5|t*4|tt|L", "11 decoder layers ('t'): expected 12"),
        ("Et*5|t*5|mt|tL", "an MTP layer ('m') before a decoder layer"),
        ("t*5|Et*5|tt|L", "'E' must open virtual stage 0"),
        ("Et*5|t*5|L|tt", "'L' must close the last virtual stage"),
        ("Et*6|t*6L", "2 stages = 1 chunks per rank: the setup has chunks = 2"),
        ("ELt*5|t*5|tt|L", "2 'L' (loss): expected exactly one"),
    ],
)
def test_layouts_that_do_not_fit_the_setup(layout, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_plan(layout, "megatron", profile=tiny(), config=PipelineConfig(2, 4, 2, "interleaved"))


def test_uniform_flags_where_they_fit():
    assert uniform_args(np.array([4, 4, 4, 4]), 4, 1) == ((), "")
    assert uniform_args(np.array([3, 4, 4, 5]), 4, 1)[0] == (
        "--decoder-first-pipeline-num-layers", "3", "--decoder-last-pipeline-num-layers", "5")
    assert uniform_args(np.array([3, 4, 4, 4]), 4, 1)[0] == ("--decoder-first-pipeline-num-layers", "3")
    args, _ = uniform_args(np.array([3, 2, 2, 3, 3, 2, 2, 3]), 4, 2)
    assert args == ("--num-virtual-stages-per-pipeline-rank", "2", "--decoder-first-pipeline-num-layers", "6",
                    "--decoder-last-pipeline-num-layers", "6")
    assert uniform_layers(4, 2, 20, 6, 6).tolist() == [3, 2, 2, 3, 3, 2, 2, 3]
    none, why = uniform_args(np.array([3, 4, 5, 5]), 4, 1)
    assert none is None and "sets only the first and the last rank apart" in why
    none, why = uniform_args(np.array([2, 2, 3, 2]), 2, 2)
    assert none is None and "the same count" in why
    # Megatron's TransformerConfig refuses 0 layers on a rank set apart, and empty middle ranks
    # (found by tests/runtimes/test_parsers_as_oracles.py)
    none, why = uniform_args(np.array([4, 4, 4, 0]), 4, 1)
    assert none is None and "--decoder-last-pipeline-num-layers must be > 0" in why
    none, why = uniform_args(np.array([0, 6]), 2, 1)
    assert none is None and "--decoder-first-pipeline-num-layers must be > 0" in why
    none, why = uniform_args(np.array([6, 0, 0, 6]), 4, 1)
    assert none is None and "needs layers on the middle ranks" in why
    with pytest.raises(ConfigError, match="must share 7 layers evenly"):
        uniform_layers(4, 1, 10, 3, None)


def plan_of(profile, config, per_vs, mode_of):
    counts = np.zeros((1, len(MODES), config.num_virtual_stages), dtype=int)
    for vs, n in enumerate(per_vs):
        for pos in range(n):
            counts[0, mode_of(vs, pos), vs] += 1
    return make_plan(profile, config, counts, status="given")


@pytest.mark.parametrize(
    ("rule", "flags"),
    [
        (lambda vs, pos: NONE, ()),
        (lambda vs, pos: SELECT, ("--recompute-granularity", "selective", "--recompute-modules", "core_attn")),
        (lambda vs, pos: FULL, ("--recompute-granularity", "full", "--recompute-method", "uniform",
                                "--recompute-num-layers", "1")),
        (lambda vs, pos: FULL if pos < 2 else NONE, ("--recompute-granularity", "full", "--recompute-method", "block",
                                                     "--recompute-num-layers", "2")),
    ],
)
def test_expressible_plans_export_exactly_and_read_back(rule, flags):
    cfg = PipelineConfig(2, 4, 2, "interleaved")
    plan = plan_of(tiny(), cfg, [4, 3, 3, 2], rule)
    out = plan.export("megatron").data
    assert out.exact and out.notes == () and out.cost_ms == 0
    assert out.recompute == flags
    assert out.layout == "Et*4|t*3|t*3|ttL"
    assert out.args[:4] == ("--pipeline-model-parallel-size", "2", "--num-layers", "12")
    for source in (out.args, out.command_line(), list(out.uniform or out.args)):
        np.testing.assert_array_equal(load_plan(source, "megatron", profile=tiny(), config=cfg).counts, plan.counts)


def test_what_megatron_cannot_express_is_listed_and_costed():
    """Full recompute on 2 layers of chunk 0 only: Megatron recomputes the same first k layers
    of every chunk; the fastest such setting that fits is run, and its cost reported."""
    cfg = PipelineConfig(2, 4, 2, "interleaved", memory_budget=None)
    plan = plan_of(tiny(), cfg, [3, 3, 3, 3], lambda vs, pos: FULL if vs < 2 and pos < 2 else NONE)
    budget = float(plan.simulation.peak_memory.max())
    plan = make_plan(tiny(), cfg.replace(memory_budget=budget), plan.counts, status="given")
    out = plan.export("megatron").data
    assert not out.exact and "Megatron applies one setting to every chunk" in out.notes[0]
    assert out.expressed_fits
    back = load_plan(out.args, "megatron", profile=tiny(), config=cfg)
    np.testing.assert_array_equal(back.counts, out.expressed_counts)
    assert back.simulation.step_time == pytest.approx(out.expressed_step_time_ms)
    assert out.cost_ms == pytest.approx(out.expressed_step_time_ms - plan.step_time)
    # it is the fastest of Megatron's settings that fit (every setting read back and simulated)
    layers = plan.counts.sum(axis=(0, 1))
    for _, (flags, counts) in recompute_candidates(tiny(), layers).items():
        other = load_plan(["--pipeline-model-parallel-layout", out.layout, *flags], "megatron", profile=tiny(),
                          config=cfg)
        np.testing.assert_array_equal(other.counts, counts)
        if other.simulation.peak_memory.max() <= budget:
            assert out.expressed_step_time_ms <= other.simulation.step_time + 1e-9
    assert "cannot express" in out.text() and f"{out.cost_ms:+.1f} ms" in out.text()


def test_random_plans_round_trip_through_megatron(rng):
    for _ in range(8):
        prof = small_profile(rng)
        p, v = int(rng.integers(2, 4)), int(rng.integers(1, 3))
        cfg = PipelineConfig(p, p + int(rng.integers(0, 3)), v, "interleaved" if v > 1 else "1f1b")
        plan = make_plan(prof, cfg, random_counts(rng, prof, cfg), status="given")
        out = plan.export("megatron").data
        back = load_plan(out.args, "megatron", profile=prof, config=cfg)
        layers = plan.counts.sum(axis=(0, 1))
        np.testing.assert_array_equal(back.counts.sum(axis=(0, 1)), layers)  # the layout is exact
        np.testing.assert_array_equal(back.counts, out.expressed_counts)
        if out.exact:
            np.testing.assert_array_equal(back.counts, plan.counts)
        # the read-back plan is itself expressible: exporting it loses nothing more
        again = back.export("megatron").data
        assert again.exact or again.notes[0].startswith("schedule")


def test_megatron_runs_its_own_grouping_and_says_so():
    cfg = PipelineConfig(4, 13, 2, "interleaved")
    out = even_split(tiny(16), cfg).export("megatron").data
    assert out.schedule == "interleaved-megatron" and out.group_size == 7
    assert "--microbatch-group-size-per-virtual-pipeline-stage" in out.args
    assert any(n.startswith("schedule: the plan was made for 'interleaved'") for n in out.notes)
    even = even_split(tiny(16), cfg.replace(micro_batches=12)).export("megatron").data
    assert even.exact and "--microbatch-group-size-per-virtual-pipeline-stage" not in even.args


def test_v_placements_are_refused():
    with pytest.raises(ConfigError, match="places its chunks in a V"):
        even_split(tiny(16), PipelineConfig(2, 4, 2, "zb-v")).export("megatron")


L = "--pipeline-model-parallel-layout 'Et*3|t*3|t*3|t*3L' "


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (L + "--recompute-granularity full", "--recompute-num-layers = None"),
        (L + "--recompute-granularity full --recompute-method uniform --recompute-num-layers 2", "groups of 2 layers"),
        (L + "--recompute-granularity selective --recompute-modules core_attn mlp", "expected core_attn"),
        (L + "--recompute-granularity fast", "expected full or selective"),
        (L + "--recompute-method block", "without --recompute-granularity"),
        ("--pipeline-model-parallel-size 4", "expected 2 (the setup's stages)"),
        ("--num-layers 10", "expected 12 (the profile's body layers)"),
        ("--num-virtual-stages-per-pipeline-rank 1", "the setup has chunks = 2"),
        (["recompute"], "expected a flag starting with '--'"),
    ],
)
def test_bad_arguments(args, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_plan(args, "megatron", profile=tiny(), config=PipelineConfig(2, 4, 2, "interleaved"))


# ------------------------------------------------- issue 22: sizes and magnitudes before allocation
@pytest.mark.parametrize(
    ("source", "needle"),
    [
        ("E|t*1000000000|L", "expands to: 1,000,000,004 characters: expected at most"),
        ("E|(t|)*100000000,L", "expands to: 200,000,003 characters"),
        ("E|t*" + "9" * 5000 + "|L", "digits"),
        ({"decoder-first-pipeline-num-layers": 10**30}, "--decoder-first-pipeline-num-layers = 1000000"),
        ({"decoder-last-pipeline-num-layers": "9" * 5000}, "--decoder-last-pipeline-num-layers = '999"),
        ({"recompute-granularity": "full", "recompute-method": "block", "recompute-num-layers": float("inf")},
         "--recompute-num-layers = inf"),
    ],
)
def test_huge_layouts_and_flags_are_refused_before_allocation(llama, source, needle):
    from sapptk import PipelineConfig
    from sapptk.plan import load_plan

    with pytest.raises(ConfigError) as exc:
        load_plan(source, "megatron", profile=llama, config=PipelineConfig(4, 8))
    assert needle in str(exc.value)


@pytest.mark.parametrize(("layout", "last_two"), [("Et*3|(tt|)*29,m|L", [0, 0]), ("Et|(tt|)*30mL", [2, 0])])
def test_deepseek_layouts_with_mtp_read_as_tail(deepseek, layout, last_two):
    # Megatron-LM's published DeepSeek-V3 layouts: 'm' (MTP) after the decoder; sapptk's tail holds it
    cfg = PipelineConfig(16, 32, 2, "interleaved")
    plan = load_plan(layout, "megatron", profile=deepseek, config=cfg)
    layers = plan.counts.sum(axis=(0, 1))
    assert layers.sum() == 61 and list(layers[-2:]) == last_two
    assert layers[0] == (3 if layout.startswith("Et*3") else 1)
