"""The MindFormers format: decoding rules cell by cell, accepted spellings, round trips, errors."""

from __future__ import annotations

import copy
import tempfile
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.formats import mindformers
from sapptk.plan import load_plan, load_plans, make_plan
from sapptk.profile import MODES, LayerGroup, ModeCost, Profile, bundled_profile

NONE, SELECT, COMM, BOTH, FULL = range(5)


def make_profile(*bodies: tuple[str, int], modes: tuple[str, ...] = MODES) -> Profile:
    """A small profile: head, the given body groups (name, layers), tail; costs that differ per mode."""
    table = {m: ModeCost(backward=2.0 + i * 0.1, activation=10.0 - i * 2) for i, m in enumerate(MODES) if m in modes}
    groups = [LayerGroup("head", "head", 1, 0.5, 5.0)]
    groups += [LayerGroup(name, "body", n, 1.0, 3.0, table) for name, n in bodies]
    groups.append(LayerGroup("tail", "tail", 1, 0.7, 4.0))
    return Profile("tiny", tuple(groups))


P4V2 = PipelineConfig(stages=4, micro_batches=8, chunks=2, schedule="interleaved")
P4V1 = PipelineConfig(stages=4, micro_batches=8, chunks=1, schedule="1f1b")


def decode(profile: Profile, config: PipelineConfig, data, **kw) -> np.ndarray:
    return mindformers.decode(profile, config.program(), data, **kw)


# ------------------------------------------------------------------ decoding, by hand
@pytest.mark.parametrize(
    ("cell", "expected"),
    [
        ((3, 0, 0, 0), (3, 0, 0, 0, 0)),  # nothing recomputed
        ((3, 3, 3, 3), (0, 0, 0, 0, 3)),  # full counts in both select lists too
        ((3, 1, 3, 1), (0, 2, 0, 0, 1)),  # 1 full, the other two select only
        ((4, 1, 3, 2), (1, 1, 0, 1, 1)),  # both = min(3-1, 2-1) = 1; select-only 3-1-1 = 1
        ((4, 0, 2, 3), (1, 0, 1, 2, 0)),  # both 2, comm-only 1
        ((3, 2, 0, 0), (1, 0, 0, 0, 2)),  # select below full: just full (MindFormers skips select there)
        ((5, 0, 2, 0), (3, 2, 0, 0, 0)),
        ((5, 0, 0, 4), (1, 0, 4, 0, 0)),
        ((0, 0, 0, 0), (0, 0, 0, 0, 0)),
    ],
)
def test_decode_cell_rules(cell, expected):
    assert mindformers.decode_cell(*cell) == expected
    assert sum(expected) == cell[0]


def test_decode_hand_config_with_true_rows_and_cells():
    """p=4, v=2, N=16: two layers per cell before offsets; every cell checked by hand."""
    prof = make_profile(("body", 16))
    data = {
        "offset": [[-1, 0, 0, 1], [0, 1, -1, 0]],  # layers [[1,2,2,3],[2,3,1,2]]
        "recompute": [[True, 0, 1, False], False],
        "select_recompute": [True, [0, 2, 0, 1]],
        "select_comm_recompute": [[0, 1, 2, 3], [2, 1, 0, 2]],
    }
    counts = decode(prof, P4V2, data)
    expected = {  # (chunk, stage): (none, select, comm, both, full)  from (layers, R, S, C)
        (0, 0): (0, 0, 0, 0, 1),  # L1 R1 S1 C0: the one layer full (true = every layer)
        (0, 1): (0, 1, 0, 1, 0),  # L2 R0 S2 C1: both 1, select-only 1
        (0, 2): (0, 0, 0, 1, 1),  # L2 R1 S2 C2: full 1, both 1
        (0, 3): (0, 0, 0, 3, 0),  # L3 R0 S3 C3: both 3
        (1, 0): (0, 0, 2, 0, 0),  # L2 R0 S0 C2: comm-only 2
        (1, 1): (1, 1, 0, 1, 0),  # L3 R0 S2 C1: both 1, select-only 1, none 1
        (1, 2): (1, 0, 0, 0, 0),  # L1 R0 S0 C0: none
        (1, 3): (0, 0, 1, 1, 0),  # L2 R0 S1 C2: both 1, comm-only 1
    }
    for (c, s), modes in expected.items():
        assert tuple(counts[0, :, c * 4 + s]) == modes, (c, s)
    assert counts.sum() == 16


def test_spellings_for_one_chunk_are_equivalent():
    prof = make_profile(("body", 9))  # p=4: 2 per cell, remainder 1
    flat = {"offset": [0, 1, 0, 0], "recompute": [1, 0, 0, 0], "select_recompute": [2, 3, 0, 0]}
    rows = {"offset": [[0, 1, 0, 0]], "recompute": [[1, 0, 0, 0]], "select_recompute": [[2, 3, 0, 0]]}
    a, b = decode(prof, P4V1, flat), decode(prof, P4V1, rows)
    np.testing.assert_array_equal(a, b)
    assert tuple(a[0, :, 0]) == (0, 1, 0, 0, 1)
    assert tuple(a[0, :, 1]) == (0, 3, 0, 0, 0)


def test_missing_null_false_and_scalar_offset_mean_even_and_no_recompute():
    prof = make_profile(("body", 16))
    expected = np.zeros((1, 5, 8), dtype=int)
    expected[0, NONE] = 2
    for data in ({}, None, {"offset": 0}, {"offset": None, "recompute": False, "select_recompute": None},
                 {"select_comm_recompute": [False, False]}):
        np.testing.assert_array_equal(decode(prof, P4V2, data), expected)


def test_true_everywhere_means_every_layer():
    prof = make_profile(("body", 16))
    counts = decode(prof, P4V2, {"select_recompute": True, "select_comm_recompute": True})
    assert (counts[0, BOTH] == 2).all() and counts[0].sum() == 16


def test_cells_are_chunk_then_device():
    """[c][s] is device s's chunk c, i.e. virtual stage c*p + s for interleaved schedules."""
    prof = make_profile(("body", 16))
    counts = decode(prof, P4V2, {"offset": [[0, 0, 0, 0], [2, -2, 0, 0]], "recompute": [[0, 0, 0, 1], [3, 0, 0, 0]]})
    assert counts[0].sum(axis=0).tolist() == [2, 2, 2, 2, 4, 0, 2, 2]
    assert counts[0, FULL].tolist() == [0, 0, 0, 1, 3, 0, 0, 0]


# ------------------------------------------------------------------ multi-group forms
def test_multi_group_per_group_mappings():
    prof = make_profile(("dense", 3), ("moe", 13))
    cfg = PipelineConfig(stages=2, micro_batches=4, chunks=1, schedule="1f1b")
    data = {
        "dense": {"offset": [2, -1], "recompute": [3, 0]},  # base 1, offsets sum to 3 mod 2: [3, 0]
        "moe": {"offset": [-6, 7], "select_recompute": [0, 3]},  # base 6, offsets sum to 13 mod 2: [0, 13]
    }
    counts = decode(prof, cfg, data)
    assert counts[0, FULL].tolist() == [3, 0]
    assert counts[1, NONE].tolist() == [0, 10] and counts[1, SELECT].tolist() == [0, 3]


def test_multi_group_flat_keys_use_mindformers_whole_stack_meaning():
    """Top-level keys for several groups: one stack of N layers; in each cell the first layers
    (model order) are full, then select; the group split follows model order."""
    prof = make_profile(("dense", 2), ("moe", 6))
    cfg = PipelineConfig(stages=2, micro_batches=4, chunks=1, schedule="1f1b")
    counts = decode(prof, cfg, {"recompute": [1, 0], "select_recompute": [4, 2]})
    # cell 0 holds dense0 dense1 moe0 moe1: dense0 full, the other three select
    assert counts[0, FULL].tolist() == [1, 0] and counts[0, SELECT].tolist() == [1, 0]
    assert counts[1, SELECT].tolist() == [2, 2] and counts[1, NONE].tolist() == [0, 2]


def test_multi_group_non_contiguous_groups_rejected(tmp_path):
    prof = make_profile(("dense", 2), ("moe", 6))
    cfg = PipelineConfig(stages=2, micro_batches=4, chunks=1, schedule="1f1b")
    path = tmp_path / "groups.yaml"
    path.write_text(yaml.safe_dump({"bad": {"dense": {"offset": [-1, 1]}, "moe": {"offset": [0, 0]}}}))
    with pytest.raises(ConfigError) as err:
        load_plan(path, "mindformers", profile=prof, config=cfg, name="bad")
    text = str(err.value)
    assert str(path) in text and "config 'bad'" in text and "moe" in text


def test_multi_group_flat_config_detection_and_unknown_group():
    prof = make_profile(("dense", 2), ("moe", 6))
    cfg = PipelineConfig(stages=2, micro_batches=4, chunks=1, schedule="1f1b")
    with pytest.raises(ConfigError, match=r"group 'dense': unknown key 'ofset' in group 'dense': expected offset"):
        decode(prof, cfg, {"dense": {"ofset": [0, 0]}})
    with pytest.raises(ConfigError, match="unknown key 'attn'"):
        decode(prof, cfg, {"dense": {}, "attn": {}})


# --------------------------------------------------------------- MindFormers training YAML
def test_training_yaml_is_read_and_checked():
    prof = make_profile(("body", 16))
    training = {
        "model": {"model_config": {"num_layers": 16, "pp_interleave_num": 2, "offset": [[1, 0, 0, -1], [0, 0, 0, 0]]}},
        "parallel_config": {"pipeline_stage": 4, "micro_batch_num": 8},
        "recompute_config": {"recompute": [[1, 0, 0, 0], [0, 0, 0, 0]], "select_recompute": False,
                             "mp_comm_recompute": True, "recompute_slice_activation": True},
        "runner_config": {"epochs": 2},
    }
    before = copy.deepcopy(training)
    counts = decode(prof, P4V2, training)
    assert counts[0, :, 0].tolist() == [2, 0, 0, 0, 1] and counts[0, :, 3].sum() == 1
    assert training == before
    bad = copy.deepcopy(training)
    bad["model"]["model_config"]["num_layers"] = 80
    with pytest.raises(ConfigError, match=r"model\.model_config\.num_layers = 80: expected 16"):
        decode(prof, P4V2, bad)
    bad = copy.deepcopy(training)
    bad["recompute_config"]["recompute"] = [[5, 0, 0, 0], [0, 0, 0, 0]]
    with pytest.raises(ConfigError, match=r"recompute_config\.recompute\[0\]\[0\] = 5: expected at most 3"):
        decode(prof, P4V2, bad)


# ---------------------------------------------------------------------------- errors
def _error(tmp_path: Path, config: object, *, profile: Profile | None = None, setup=P4V2) -> str:
    """The message of decoding ``{"cfg": config}`` from a file, after checking the location is named."""
    path = tmp_path / "manual.yaml"
    path.write_text(yaml.safe_dump({"cfg": config, "other": {"offset": 0}}))
    with pytest.raises(ConfigError) as err:
        load_plans(path, "mindformers", profile=profile or make_profile(("body", 16)), config=setup)
    text = str(err.value)
    assert str(path) in text and "config 'cfg'" in text, text
    return text


@pytest.mark.parametrize(
    ("config", "parts"),
    [
        ({"offset": [[1, 0, 0, 0], [0, 0, 0, 0]]}, ["offset sums to 1", "17 layers", "expected", "sum to 16 mod"]),
        ({"offset": [[0, -3, 0, 3], [0, 0, 0, 0]]}, ["offset[0][1] = -3", "cell [0][1]", "-1 layers", ">= -2"]),
        ({"offset": [[0, 0, 0, 0]] * 3}, ["offset has 3 rows", "expected 2"]),
        ({"offset": [[0, 0, 0, 0], [0, 0, 0]]}, ["offset[1] has 3 entries", "expected 4"]),
        ({"offset": [0, 0, 0, 0]}, ["flat list of 4 values", "expected 2 rows", "chunks = 1"]),
        ({"offset": [[0, 0, 0, 0], [0, "x", 0, 0]]}, ["offset[1][1] = 'x'", "expected an integer"]),
        ({"offset": [[0, 0, 0, 0], [0, 1.5, 0, 0]]}, ["offset[1][1] = 1.5", "expected an integer"]),
        ({"offset": True}, ["offset = True", "expected an integer"]),
        ({"select_recompute": [[0, 0, 0, 0], [0, 0, 5, 0]]},
         ["select_recompute[1][2] = 5", "expected at most 2", "cell [1][2]"]),
        ({"recompute": [[0, -1, 0, 0], [0, 0, 0, 0]]}, ["recompute[0][1] = -1", "expected a layer count >= 0"]),
        ({"recompute": 2}, ["recompute = 2", "expected true, false"]),
        ({"select_recompute": ["feed_forward\\.mul"]}, ["select_recompute", "operator-name patterns"]),
        ({"select_recompute": {"feed_forward\\.mul": [[1, 1, 1, 1], [1, 1, 1, 1]]}}, ["operator-name patterns"]),
        ({"recompute_layers": [[0] * 4] * 2}, ["unknown key 'recompute_layers'", "expected offset, recompute"]),
    ],
)
def test_errors_name_file_config_key_cell_value_and_expectation(tmp_path, config, parts):
    text = _error(tmp_path, config)
    for part in parts:
        assert part in text, (part, text)


def test_error_mode_the_profile_lacks(tmp_path):
    llama = bundled_profile("llama2_70b")  # none, select, both, full: no comm
    setup = PipelineConfig(stages=16, micro_batches=32, chunks=2, schedule="interleaved")
    rows = [[0] * 16, [0] * 16]
    comm = copy.deepcopy(rows)
    comm[1][5] = 2
    text = _error(tmp_path, {"select_comm_recompute": comm}, profile=llama, setup=setup)
    for part in ("cell [1][5]", "2 comm-only layers", "no 'comm' mode", "none, select, both, full", "LLamaDecodeLayer"):
        assert part in text, (part, text)


def test_error_messages_without_names(tmp_path):
    prof = make_profile(("body", 16))
    with pytest.raises(ConfigError, match=r"^<data>: offset sums to"):
        load_plan({"offset": [[1, 0, 0, 0], [0, 0, 0, 0]]}, "mindformers", profile=prof, config=P4V2)
    with pytest.raises(ConfigError, match=r"no config named 'nope': expected one of a, b"):
        load_plan({"a": {}, "b": {}}, "mindformers", profile=prof, config=P4V2, name="nope")
    with pytest.raises(ConfigError, match=r"key 'offest' = \[0\]: expected one of offset"):
        load_plan({"offest": [0]}, "mindformers", profile=prof, config=P4V2)
    with pytest.raises(ConfigError, match=r"config 'a': config = \[1, 2\]: expected a mapping"):
        mindformers.decode(prof, P4V2.program(), [1, 2], name="a")


def test_file_errors(tmp_path):
    prof = make_profile(("body", 16))
    with pytest.raises(ConfigError, match="missing.yaml: cannot read the file"):
        load_plan(tmp_path / "missing.yaml", "mindformers", profile=prof, config=P4V2)
    broken = tmp_path / "broken.yaml"
    broken.write_text("a:\n  offset: [0, 0\n  recompute: 1\n")
    with pytest.raises(ConfigError, match=r"broken.yaml: invalid YAML at line 3, column \d+"):
        load_plan(broken, "mindformers", profile=prof, config=P4V2)
    empty = tmp_path / "empty.yaml"
    empty.write_text("# nothing\n")
    with pytest.raises(ConfigError, match="empty.yaml: the file is empty"):
        load_plan(empty, "mindformers", profile=prof, config=P4V2)
    deep = tmp_path / "deep.yaml"
    deep.write_text("offset: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ConfigError, match="deep.yaml: unsafe YAML at line 1, column 108: nested more than 100 levels"):
        load_plan(deep, "mindformers", profile=prof, config=P4V2)
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(b"offset: 0\x00\n")
    with pytest.raises(ConfigError, match="nul.yaml: cannot read the file: NUL byte at offset 9"):
        load_plan(nul, "mindformers", profile=prof, config=P4V2)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"offset": [[2**62, -(2**62), 0, 0], [0, 0, 0, 0]]},
         r"offset\[0\]\[0\] = 4611686018427387904: expected an offset between -16 and 16"),
        ({"offset": [[2**64, 0, 0, 0], [0, 0, 0, 0]]}, r"offset\[0\]\[0\] = 18446744073709551616: expected an offset"),
        ({"offset": -(2**63)}, r"offset = -9223372036854775808: expected an offset between -16 and 16"),
        ({"recompute": [[10**30, 0, 0, 0], [0, 0, 0, 0]]},
         r"recompute\[0\]\[0\] = 1000000000000000000000000000000: expected a layer count from 0 to 16"),
    ],
)
def test_huge_integers_are_refused_before_they_can_wrap(config, message):
    """Offsets of ±2**62 once wrapped around int64, passed the sum check and gave 4.6e18 layers per cell."""
    prof = make_profile(("body", 16))
    with pytest.raises(ConfigError, match=message):
        load_plan(config, "mindformers", profile=prof, config=P4V2)


def test_input_is_not_mutated():
    prof = make_profile(("body", 16))
    data = {
        "a": {"offset": [[-1, 1, 0, 0], [0, 0, 0, 0]], "recompute": [[True, 0, 0, 0], False], "select_recompute": True},
        "b": {"select_comm_recompute": [[1, 1, 1, 1], [0, 0, 0, 0]]},
    }
    before = copy.deepcopy(data)
    plans = load_plans(data, "mindformers", profile=prof, config=P4V2)
    assert data == before
    assert list(plans) == ["a", "b"]
    assert plans["a"].source == "mindformers:a"


def test_single_config_and_named_configs(tmp_path):
    prof = make_profile(("body", 16))
    path = tmp_path / "one.yaml"
    path.write_text("recompute: true\n")
    plan = load_plan(path, "mindformers", profile=prof, config=P4V2)
    assert plan.source == "mindformers:one" and plan.status == "given"
    assert (plan.counts[0, FULL] == 2).all()
    # a mapping keyed by the body group's name is one config too
    one = load_plan({"body": {"recompute": True}}, "mindformers", profile=prof, config=P4V2)
    assert one.counts[0, FULL].sum() == 16
    named = load_plans({"x": {"recompute": True}, "y": None}, "mindformers", profile=prof, config=P4V2)
    assert set(named) == {"x", "y"} and named["y"].counts[0, NONE].sum() == 16
    picked = load_plan({"x": {"recompute": True}, "y": None}, "mindformers", profile=prof, config=P4V2, name="x")
    assert picked.source == "mindformers:x"
    # always one Plan: several named configs without a name are an error that lists them
    with pytest.raises(ConfigError, match=r"holds 2 named configs \(x, y\): pass name= to pick one"):
        load_plan({"x": {"recompute": True}, "y": None}, "mindformers", profile=prof, config=P4V2)
    # one unnamed config read as named: one entry, the file's stem
    assert list(load_plans(path, "mindformers", profile=prof, config=P4V2)) == ["one"]
    assert list(load_plans({"recompute": True}, "mindformers", profile=prof, config=P4V2)) == ["config"]


# ------------------------------------------------------------------------ round trips
def test_encode_refuses_select_only_and_comm_only_in_one_cell():
    prof = make_profile(("body", 16))
    counts = np.zeros((1, 5, 8), dtype=int)
    counts[0, NONE] = 2
    counts[0, NONE, 3] = 0
    counts[0, SELECT, 3] = 1
    counts[0, COMM, 3] = 1
    plan = make_plan(prof, P4V2, counts, status="feasible", step_time=1.0)
    with pytest.raises(ConfigError, match=r"cell \[0\]\[3\]: 1 select-only and 1 comm-only"):
        plan.export("mindformers")


@st.composite
def assignments(draw):
    """(profile, config, counts): 1 or 2 contiguous body groups, every mode, representable cells."""
    p = draw(st.integers(1, 4))
    v = draw(st.integers(1, 2)) if p > 1 else 1
    nvs = p * v
    groups = draw(st.integers(1, 2))
    cell_max = 4
    counts = np.zeros((groups, 5, nvs), dtype=int)
    split = draw(st.integers(0, nvs - 1))  # where group 0 ends and group 1 starts (both may share it)
    for g in range(groups):
        for vs in range(nvs):
            if groups == 2 and ((g == 0 and vs > split) or (g == 1 and vs < split)):
                continue
            layers = draw(st.lists(st.integers(0, cell_max), min_size=5, max_size=5))
            if draw(st.booleans()):
                layers[SELECT] = 0
            else:
                layers[COMM] = 0
            counts[g, :, vs] = layers
    for g in range(groups):
        if counts[g].sum() == 0:  # every group needs a layer
            vs = split if groups == 2 else 0
            counts[g, FULL, vs] += 1
    names = ("dense", "moe")[:groups]
    prof = make_profile(*((n, int(counts[g].sum())) for g, n in enumerate(names)))
    if v == 1:
        cfg = PipelineConfig(stages=p, micro_batches=p, chunks=1, schedule="1f1b")
    else:
        cfg = PipelineConfig(stages=p, micro_batches=p, chunks=v, schedule="interleaved")
    return prof, cfg, counts


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(assignments())
def test_round_trip_plan_export_to_mindformers(case):
    prof, cfg, counts = case
    plan = make_plan(prof, cfg, counts, status="feasible", step_time=1.0)
    data = plan.export("mindformers").data
    snapshot = copy.deepcopy(data)
    back = load_plan(data, "mindformers", profile=prof, config=cfg)
    np.testing.assert_array_equal(back.counts, counts)
    assert data == snapshot
    text = plan.export("mindformers").text
    back = load_plan(yaml.safe_load(text), "mindformers", profile=prof, config=cfg)
    np.testing.assert_array_equal(back.counts, counts)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "plan.yaml"
        plan.export("mindformers", path)
        assert path.read_text() == text
        np.testing.assert_array_equal(load_plan(path, "mindformers", profile=prof, config=cfg).counts, counts)


def test_one_chunk_exports_flat_lists_and_one_group_exports_top_level_keys():
    prof = make_profile(("body", 9))
    plan = make_plan(prof, P4V1, np.array([[[2, 2, 1, 2], [0] * 4, [0] * 4, [0] * 4, [0, 0, 2, 0]]]), status="given")
    block = plan.export("mindformers").data["body"]
    assert block == {"offset": [0, 0, 1, 0], "recompute": [0, 0, 2, 0], "select_recompute": [0, 0, 2, 0],
                     "select_comm_recompute": [0, 0, 2, 0]}
    loaded = yaml.safe_load(plan.export("mindformers").text)
    assert loaded == block


def test_numpy_arrays_are_accepted():
    prof = make_profile(("body", 16))
    lists = {"offset": [[-1, 1, 0, 0], [0, 0, 0, 0]], "recompute": [[1, 0, 0, 0], [0, 0, 0, 2]]}
    arrays = {k: np.array(v) for k, v in lists.items()}
    np.testing.assert_array_equal(decode(prof, P4V2, arrays), decode(prof, P4V2, lists))


def test_v_placement_cells_are_chunk_then_device():
    """On a V placement chunk 1 runs the devices backwards: [1][s] is still device s."""
    prof = make_profile(("body", 16))
    setup = PipelineConfig(stages=4, micro_batches=8, chunks=2, schedule="dualpipe-v")
    program = setup.program()
    grid = mindformers.cell_grid(program)
    assert grid.tolist() == [[0, 1, 2, 3], [7, 6, 5, 4]]
    assert all(program.placement[grid[c, s]] == s for c in range(2) for s in range(4))
    counts = decode(prof, setup, {"offset": [[0, 0, 0, 0], [1, 0, 0, -1]], "recompute": [[0, 0, 0, 0], [3, 0, 0, 0]]})
    assert counts[0].sum(axis=0).tolist() == [2, 2, 2, 2, 1, 2, 2, 3]
    assert counts[0, FULL, 7] == 3
    plan = make_plan(prof, setup, counts, status="feasible", step_time=1.0)
    assert plan.export("mindformers").data["body"]["offset"] == [[0, 0, 0, 0], [1, 0, 0, -1]]
