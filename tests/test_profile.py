"""Layer profiles: shipped numbers, both formats, round trips, and every error message."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import math
import os
import pickle
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import sapptk.files as files_mod
import sapptk.profile as profile_mod
from sapptk.errors import ProfileError
from sapptk.profile import (
    GROUP_KINDS,
    MODES,
    LayerGroup,
    ModeCost,
    ModeTable,
    Profile,
    bundled_profile,
    bundled_profiles,
    load_profile,
)

REPO = Path(__file__).resolve().parent.parent


# --- helpers --------------------------------------------------------------------------------
def sapp(*entries: dict[str, Any], **top: Any) -> dict[str, Any]:
    """A SAPP layer JSON document with the given ``layers_description`` entries."""
    return {"name": "t", **top, "layers_description": list(entries)}


def head(**kw: Any) -> dict[str, Any]:
    return {"name": "emb", "type": "HEAD", "nb_layer": 1, "time": 10, "memory_parameter": 50, **kw}


def tail(**kw: Any) -> dict[str, Any]:
    return {"name": "out", "type": "TAIL", "nb_layer": 1, "time": 20, "memory_parameter": 60, **kw}


def body(**kw: Any) -> dict[str, Any]:
    entry = {
        "name": "layer",
        "type": "BODY",
        "nb_layer": 8,
        "time": 100,
        "memory_parameter": 1000,
        "memory_activation": 500,
        "memory_recompute": 20,
    }
    entry.update(kw)
    return {k: v for k, v in entry.items() if v is not DROP}


DROP: Any = object()


def write_json(tmp_path: Path, data: Any, name: str = "p.json") -> Path:
    path = tmp_path / name
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def raises_with(fn: Any, *fragments: str) -> str:
    """Call ``fn``; it must raise ProfileError whose message contains every fragment."""
    with pytest.raises(ProfileError) as info:
        fn()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def own(*groups: dict[str, Any], **top: Any) -> dict[str, Any]:
    return {"format": "sapptk-profile/1", "name": "o", **top, "groups": list(groups)}


def own_body(**kw: Any) -> dict[str, Any]:
    group = {
        "name": "blk",
        "kind": "body",
        "count": 4,
        "forward": 10,
        "params": 100,
        "modes": {"none": {"backward": 20, "activation": 50}},
    }
    group.update(kw)
    return group


# --- shipped profiles, checked by hand -------------------------------------------------------
def test_bundled_names() -> None:
    assert {"llama2_70b", "demo", "deepseek_v3"} <= set(bundled_profiles())


def test_llama2_70b_numbers() -> None:
    p = bundled_profile("llama2_70b")
    assert p.name == "llama2_70b_prof"
    assert str(p.source).endswith("llama2_70b.json")
    assert [g.kind for g in p.groups] == ["head", "body", "tail"] and (p.head, p.tail) == (p.groups[0], p.groups[2])
    assert (p.head.name, p.head.forward, p.head.params) == ("LlamaEmbedding", 13, 9236)
    assert p.head.modes == {"none": ModeCost(backward=26, activation=0)}
    (b,) = p.body
    assert (b.name, b.count, b.forward, b.params) == ("LLamaDecodeLayer", 96, 100, 1710)
    assert b.available_modes == ("none", "select", "both", "full")
    assert [b.mode(m).backward for m in b.available_modes] == pytest.approx([200, 208, 233, 300])
    assert [b.mode(m).activation for m in b.available_modes] == [994, 739, 403, 32]
    assert b.strongest_mode == "full"
    assert (p.tail.name, p.tail.forward, p.tail.params) == ("LlamaRMSNorm", 113, 5794)
    assert p.tail.mode("none").backward == 226
    assert p.num_body_layers == 96
    raises_with(lambda: b.mode("comm"), "LLamaDecodeLayer", "'comm'", "none, select, both, full")
    raises_with(lambda: b.mode("partial"), "LLamaDecodeLayer", "'partial'", "one of")


def test_demo_numbers() -> None:
    p = bundled_profile("demo")
    (b,) = p.body
    assert b.available_modes == ("none", "select", "comm", "both")
    assert b.forward == 90
    assert [b.mode(m).backward for m in b.available_modes] == pytest.approx(
        [180, 187.2, 202.5, 209.7]
    )
    assert [b.mode(m).activation for m in b.available_modes] == [852, 767, 535, 511]
    assert b.strongest_mode == "both"
    assert p.head.mode("none").backward == 180
    assert p.tail.mode("none").backward == 360
    raises_with(lambda: b.mode("full"), "BODY", "'full'")


def test_deepseek_v3_shape_and_orders_of_magnitude() -> None:
    p = bundled_profile("deepseek_v3")
    assert [(g.kind, g.count) for g in p.groups] == [
        ("head", 1),
        ("body", 3),
        ("body", 58),
        ("tail", 1),
    ]
    assert p.num_body_layers == 61
    for g in p.body:
        assert g.available_modes == MODES
        assert 1000 < g.params < 10000  # a few GB per layer
        assert 500 < g.mode("none").activation < 5000  # about a GB
        acts = [g.mode(m).activation for m in MODES]
        backs = [g.mode(m).backward for m in MODES]
        # stronger modes never keep more, never cost less time
        assert acts[0] >= acts[1] >= acts[3] > acts[4]
        assert acts[0] >= acts[2] >= acts[3]
        assert backs[0] <= backs[1] <= backs[3] < backs[4]
        assert backs[0] <= backs[2] <= backs[3]
        assert backs[4] == pytest.approx(backs[0] + g.forward, abs=0.02)
        assert g.strongest_mode == "full"
    dense, moe = p.body
    assert moe.mode("comm").activation < moe.mode("none").activation
    assert dense.mode("comm") == dense.mode("none")  # no comm operator at TP = 1


@pytest.mark.parametrize("name", ["llama2_70b", "demo", "deepseek_v3"])
def test_round_trip_yaml(name: str, tmp_path: Path) -> None:
    p = bundled_profile(name)
    path = tmp_path / f"{name}.yaml"
    text = p.to_yaml(path)
    assert path.read_text(encoding="utf-8") == text
    assert text.startswith("#")
    back = load_profile(path)
    assert back == p
    assert back.source == str(path)
    assert Profile.from_dict(p.to_dict()) == p
    assert load_profile(write_json(tmp_path, p.to_dict(), f"{name}.json")) == p
    assert yaml.safe_load(text) == p.to_dict()


def test_yaml_round_trip_of_awkward_names(tmp_path: Path) -> None:
    groups = (
        LayerGroup("注意力层", "body", 1, 1, 1, {"none": ModeCost(2, 3)}),
        LayerGroup("nel\x85end", "body", 1, 1, 1, {"none": ModeCost(2, 3)}),
        LayerGroup("yes", "body", 1, 1, 1, {"none": ModeCost(2, 3)}),
        LayerGroup("- [x]: #y", "body", 1, 1, 1, {"none": ModeCost(2, 3)}),
    )
    p = Profile("名前", groups)
    text = p.to_yaml(tmp_path / "u.yaml")
    assert load_profile(tmp_path / "u.yaml") == p
    assert "nel" in text


def test_to_yaml_without_path_writes_nothing(tmp_path: Path) -> None:
    before = set(tmp_path.iterdir())
    assert "format: sapptk-profile/1" in bundled_profile("demo").to_yaml()
    assert set(tmp_path.iterdir()) == before


# --- SAPP format rules -----------------------------------------------------------------------
def test_forward_time_overrides_forward_only() -> None:
    p = Profile.from_dict(sapp(body(forward_time=30)))
    (b,) = p.body
    assert b.forward == 30
    assert b.mode("none").backward == 200  # from time, not forward_time
    assert b.mode("full").backward == 300


def test_forward_time_zero_means_not_given() -> None:
    (b,) = Profile.from_dict(sapp(body(forward_time=0))).body
    assert b.forward == 100


def test_explicit_backward_times() -> None:
    entry = body(
        memory_select_rec=400,
        memory_select_comm=300,
        memory_both_comm_select=200,
        backward_time=150,
        select_rec_time=160,
        select_comm_time=170,
        both_comm_select_time=0,  # 0 means "use the formula"
        recompute_time=260,
    )
    (b,) = Profile.from_dict(sapp(entry)).body
    assert b.available_modes == MODES
    assert {m: b.mode(m).backward for m in MODES} == pytest.approx(
        {"none": 150, "select": 160, "comm": 170, "both": 233, "full": 260}
    )


def test_coefficient_overrides() -> None:
    entry = body(
        memory_select_rec=400,
        memory_select_comm=300,
        memory_both_comm_select=200,
        backward_coef=0.1,
        select_rec_coef=0.2,
        select_comm_coef=0.3,
        both_comm_select_coef=0.4,
        recompute_coef=1.0,
    )
    (b,) = Profile.from_dict(sapp(entry)).body
    assert {m: b.mode(m).backward for m in MODES} == pytest.approx(
        {"none": 220, "select": 240, "comm": 260, "both": 280, "full": 400}
    )


def test_explicit_time_wins_over_coefficient() -> None:
    (b,) = Profile.from_dict(sapp(body(recompute_coef=2.0, recompute_time=333))).body
    assert b.mode("full").backward == 333


def test_default_coefficients() -> None:
    entry = body(memory_select_rec=1, memory_select_comm=1, memory_both_comm_select=1, time=10)
    (b,) = Profile.from_dict(sapp(entry)).body
    assert [b.mode(m).backward for m in MODES] == pytest.approx([20, 20.8, 22.5, 23.3, 30])


def test_mode_available_exactly_when_memory_key_present() -> None:
    (b,) = Profile.from_dict(sapp(body(memory_activation=DROP, memory_select_comm=7))).body
    assert b.available_modes == ("comm", "full")
    (b,) = Profile.from_dict(sapp(body(memory_recompute=DROP, select_rec_time=99))).body
    assert b.available_modes == ("none",)


def test_several_body_groups_keep_their_order() -> None:
    data = sapp(
        head(),
        body(name="dense", nb_layer=3),
        body(name="moe", nb_layer=58, time=200),
        body(name="dense2", nb_layer=2),
        tail(),
    )
    p = Profile.from_dict(data)
    assert [g.name for g in p.body] == ["dense", "moe", "dense2"]
    assert [g.name for g in p.groups] == ["emb", "dense", "moe", "dense2", "out"]
    assert p.num_body_layers == 63
    assert p.body[1].mode("none").backward == 400


def test_head_and_tail_defaults() -> None:
    p = Profile.from_dict(sapp(head(), body(), tail(memory_activation=70)))
    assert p.head.modes == {"none": ModeCost(backward=20, activation=0)}
    assert p.tail.modes == {"none": ModeCost(backward=40, activation=70)}


def test_profile_without_head_or_tail() -> None:
    p = Profile.from_dict(sapp(body()))
    assert p.head is None and p.tail is None and len(p.body) == 1


def test_informational_keys_and_type_case() -> None:
    data = sapp(
        body(type="body", model_name="m", extra_note="ok"),
        pre_defined_layer={"x": 0},
        auto_partition_layer={"y": 8},
    )
    p = Profile.from_dict(data)
    assert p.body[0].kind == "body"


def test_missing_profile_name_defaults_to_file_stem(tmp_path: Path) -> None:
    data = sapp(body())
    del data["name"]
    assert load_profile(write_json(tmp_path, data, "mymodel.json")).name == "mymodel"
    assert Profile.from_dict(data).name == "profile"


def test_integral_float_count_accepted() -> None:
    assert Profile.from_dict(sapp(body(nb_layer=96.0))).body[0].count == 96


# --- our own format ----------------------------------------------------------------------------
def test_own_format_yaml_with_comments(tmp_path: Path) -> None:
    path = tmp_path / "m.yml"
    path.write_text(
        """# a comment
format: sapptk-profile/1
name: m   # trailing comment
units: {time: ms, memory: MB}
groups:
  - {name: E, kind: head, count: 1, forward: 13, params: 9236}
  - name: L
    kind: body
    count: 96
    forward: 100
    params: 1710
    modes:
      select: {backward: 208, activation: 739}   # order in file does not matter
      none:   {backward: 200, activation: 994}
  - {name: T, kind: tail, count: 1, forward: 5, params: 9,
     modes: {none: {backward: 11, activation: 3}}}
""",
        encoding="utf-8",
    )
    p = load_profile(path)
    assert p.head.modes == {"none": ModeCost(26, 0)}
    assert p.body[0].available_modes == ("none", "select")
    assert p.tail.mode("none") == ModeCost(11, 3)


def test_own_format_without_format_key() -> None:
    data = own(own_body())
    del data["format"]
    assert Profile.from_dict(data).body[0].name == "blk"


def test_yaml_anchors_without_nesting_are_fine(tmp_path: Path) -> None:
    path = tmp_path / "a.yaml"
    path.write_text(
        """groups:
  - name: a
    kind: body
    count: 1
    forward: 1
    params: 1
    modes: &m {none: {backward: 2, activation: 3}}
  - {name: b, kind: body, count: 2, forward: 1, params: 1, modes: *m}
""",
        encoding="utf-8",
    )
    p = load_profile(path)
    assert p.groups[0].modes == p.groups[1].modes


def test_sapp_profile_in_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(sapp(body())), encoding="utf-8")
    assert load_profile(path).body[0].mode("full").backward == 300


# --- data types -------------------------------------------------------------------------------
def test_pickle_and_copies_round_trip() -> None:
    for name in ("llama2_70b", "deepseek_v3"):
        p = bundled_profile(name)
        for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
            back = pickle.loads(pickle.dumps(p, protocol=protocol))
            assert back == p and hash(back) == hash(p)
            assert isinstance(back.body[0].modes, ModeTable)
        assert copy.deepcopy(p) == p
        assert copy.copy(p) == p
        group = p.body[0]
        assert pickle.loads(pickle.dumps(group)) == group
        assert pickle.loads(pickle.dumps(group.modes)) == group.modes
        asdict = dataclasses.asdict(group)
        assert asdict["modes"] == group.modes


def test_frozen_and_read_only() -> None:
    g = bundled_profile("demo").body[0]
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.count = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        g.modes["full"] = ModeCost(1, 1)  # type: ignore[index]
    with pytest.raises(AttributeError):
        g.modes._data = {}  # type: ignore[misc]
    assert list(g.modes) == list(g.available_modes)
    assert {g: 1}[g] == 1  # hashable


def test_layer_group_direct_construction() -> None:
    h = LayerGroup("emb", "head", 1, 5, 10)
    assert h.modes == {"none": ModeCost(10, 0)}
    g = LayerGroup("b", "body", 2, 1, 1, {"full": ModeCost(3, 1), "none": ModeCost(2, 9)})
    assert g.available_modes == ("none", "full")  # MODES order, whatever the input order
    assert isinstance(g.forward, float) and isinstance(g.mode("none").backward, float)
    raises_with(lambda: LayerGroup("b", "body", 2, 1, 1), "'b'", "'modes'", "at least one")
    raises_with(
        lambda: LayerGroup("b", "body", 2, 1, 1, {"half": ModeCost(1, 1)}), "'b'", "'half'"
    )
    raises_with(
        lambda: LayerGroup("b", "body", 2, 1, 1, {"none": (1, 1)}), "'b'", "'none'", "ModeCost"
    )
    raises_with(lambda: LayerGroup("b", "middle", 1, 1, 1), "'b'", "'kind'", "'middle'")
    raises_with(lambda: LayerGroup("b", "head", 0, 1, 1), "'b'", "'count'", "= 0", ">= 1")
    raises_with(lambda: LayerGroup("b", "head", 1, -1, 1), "'b'", "'forward'", "-1", ">= 0")
    raises_with(lambda: LayerGroup("", "head", 1, 1, 1), "'name'", "non-empty string")
    raises_with(lambda: ModeCost(math.nan, 1), "'backward'", "nan", "finite")
    raises_with(lambda: ModeCost(1, True), "'activation'", "True", "number")


def test_profile_direct_construction() -> None:
    b = LayerGroup("b", "body", 2, 1, 1, {"none": ModeCost(2, 1)})
    h = LayerGroup("h", "head", 1, 1, 1)
    t = LayerGroup("t", "tail", 1, 1, 1)
    p = Profile("x", [h, b, t])  # type: ignore[arg-type]
    assert p.groups == (h, b, t)
    raises_with(lambda: Profile("x", (b, h)), "'h'", "'kind'", "first")
    raises_with(lambda: Profile("x", (t, b)), "'t'", "'kind'", "last")
    raises_with(lambda: Profile("x", (h, t)), "no body group")
    raises_with(lambda: Profile("x", (b, b)), "'b'", "unique")
    raises_with(lambda: Profile("x", (b, "y")), "groups[1]", "LayerGroup")  # type: ignore[arg-type]
    raises_with(lambda: Profile("x", (b, b), source="f.json"), "f.json: ", "'b'", "unique")
    assert Profile("x", (b,), source="a") == Profile("x", (b,), source="b")


# --- validation: files -------------------------------------------------------------------------
def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    raises_with(lambda: load_profile(path), str(path), "no such file")


def test_directory(tmp_path: Path) -> None:
    path = tmp_path / "dir.json"
    path.mkdir()
    raises_with(lambda: load_profile(path), str(path), "directory")


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads anything")
def test_unreadable_file(tmp_path: Path) -> None:
    path = write_json(tmp_path, sapp(body()))
    path.chmod(0)
    try:
        raises_with(lambda: load_profile(path), str(path), "cannot read")
    finally:
        path.chmod(0o600)


def test_unreadable_file_simulated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_json(tmp_path, sapp(body()))

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(files_mod.os, "open", refuse)
    raises_with(lambda: load_profile(path), str(path), "cannot read", "permission denied")


def test_unknown_extension(tmp_path: Path) -> None:
    path = tmp_path / "p.txt"
    path.write_text("{}", encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "'.txt'", ".json, .yaml or .yml")


def test_invalid_json_names_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text('{\n  "name": "x",\n  "layers_description": [,]\n}\n', encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "invalid JSON", "line 3")


def test_invalid_yaml_names_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("name: x\ngroups:\n  - {name: a, kind: [body\n", encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "invalid YAML", "line 4")


def test_multi_document_yaml(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text("a: 1\n---\nb: 2\n", encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "invalid YAML", "line 2")


def test_duplicate_keys(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text('{"name": "a", "name": "b", "layers_description": []}', encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "'name'", "twice")
    path = tmp_path / "dup.yaml"
    path.write_text("groups: []\nname: a\nname: b\n", encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "'name'", "twice", "line 3")


def test_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin.json"
    path.write_bytes(b'{"name": "caf\xe9"}')
    raises_with(lambda: load_profile(path), str(path), "UTF-8")


def test_empty_yaml(tmp_path: Path) -> None:
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n", encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "empty", "layers_description")


def test_huge_file_refused_before_parsing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "huge.json"
    with path.open("wb") as handle:  # sparse: no real disk use
        handle.truncate(files_mod.MAX_FILE_BYTES + 10)
    reads: list[int] = []
    real_read = os.read
    monkeypatch.setattr(files_mod.os, "read", lambda fd, n: reads.append(n) or real_read(fd, n))
    raises_with(lambda: load_profile(path), str(path), "larger than", "8 MB")
    assert not reads  # refused from its size, before a byte is read


@pytest.mark.slow
def test_deeply_nested_documents(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000, encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path))
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 50_000 + "]" * 50_000, encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "nested too deeply")


BILLION_LAUGHS = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
groups: [*i]
"""


def test_yaml_bomb_fails_fast_without_eating_memory(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BILLION_LAUGHS, encoding="utf-8")
    tracemalloc.start()
    try:
        message = raises_with(lambda: load_profile(path), str(path), "alias", "line 3")
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert peak < 5 * 1024 * 1024  # refused at the first nested alias, nothing expanded
    assert "nested aliases are refused" in message


def test_many_flat_aliases_refused(tmp_path: Path) -> None:
    path = tmp_path / "flat.yaml"
    refs = ", ".join(["*x"] * (files_mod.MAX_YAML_ALIASES + 1))
    path.write_text(f"x: &x [1, 2, 3]\ngroups: [{refs}]\n", encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "more than", "aliases")


def test_recursive_alias_refused(tmp_path: Path) -> None:
    path = tmp_path / "rec.yaml"
    path.write_text("groups: &g [1, *g]\n", encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "refers to itself")


def test_yaml_tags_are_not_executed(tmp_path: Path) -> None:
    path = tmp_path / "tag.yaml"
    path.write_text("groups: !!python/object/apply:os.system ['true']\n", encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), "tag 'tag:yaml.org,2002:python/object/apply:os.system'",
                "not allowed", "line 1")


# --- validation: content (SAPP) ------------------------------------------------------------------
BAD_SAPP_ENTRIES = [
    # (entry overrides, fragments beyond the file name)
    ({"memory_activation": -3}, ["layer 'layer'", "'memory_activation' = -3", "number >= 0"]),
    ({"time": "100"}, ["layer 'layer'", "'time' = '100'", "number >= 0"]),
    ({"time": True}, ["layer 'layer'", "'time' = True", "number"]),
    ({"memory_parameter": None}, ["layer 'layer'", "'memory_parameter' = None"]),
    ({"time": math.nan}, ["layer 'layer'", "'time' = nan", "finite"]),
    ({"memory_recompute": math.inf}, ["'memory_recompute' = inf", "finite"]),
    ({"memory_parameter": -math.inf}, ["'memory_parameter' = -inf", "finite"]),
    ({"nb_layer": 2.5}, ["layer 'layer'", "'nb_layer' = 2.5", "integer >= 1"]),
    ({"nb_layer": 0}, ["'nb_layer' = 0", "integer >= 1"]),
    ({"nb_layer": True}, ["'nb_layer' = True", "integer >= 1"]),
    ({"nb_layer": "8"}, ["'nb_layer' = '8'", "integer >= 1"]),
    ({"type": "MIDDLE"}, ["layer 'layer'", "'type' = 'MIDDLE'", "'HEAD', 'BODY', 'TAIL'"]),
    ({"type": 3}, ["'type' = 3", "'BODY'"]),
    ({"type": DROP}, ["layer 'layer'", "'type' is missing"]),
    ({"nb_layer": DROP}, ["'nb_layer' is missing", "integer"]),
    ({"time": DROP}, ["'time' is missing", "number"]),
    ({"memory_parameter": DROP}, ["'memory_parameter' is missing"]),
    ({"name": DROP}, ["layers_description[1]", "'name' is missing", "non-empty string"]),
    ({"name": ""}, ["layers_description[1]", "'name' = ''", "non-empty string"]),
    ({"name": 5}, ["layers_description[1]", "'name' = 5"]),
    ({"forward_time": -1}, ["'forward_time' = -1"]),
    ({"backward_time": "fast"}, ["'backward_time' = 'fast'"]),
    ({"recompute_time": -5}, ["'recompute_time' = -5"]),
    ({"select_rec_coef": -1}, ["'select_rec_coef' = -1", "number > -1"]),
    ({"recompute_coef": "x"}, ["'recompute_coef' = 'x'"]),
    ({"memory_select_recompute": 3}, ["unknown field 'memory_select_recompute'", "memory_select_rec"]),
    ({"select_recompute_time": 3}, ["unknown field 'select_recompute_time'", "select_rec_time"]),
    (
        {"memory_activation": DROP, "memory_recompute": DROP},
        ["layer 'layer'", "no recompute mode", "memory_activation"],
    ),
]


@pytest.mark.parametrize(("overrides", "fragments"), BAD_SAPP_ENTRIES)
def test_bad_sapp_entry(tmp_path: Path, overrides: dict[str, Any], fragments: list[str]) -> None:
    data = sapp(head(), body(**overrides), tail())
    path = write_json(tmp_path, data)
    raises_with(lambda: load_profile(path), str(path), *fragments)
    raises_with(lambda: Profile.from_dict(data, source="mem"), "mem: ", *fragments)


BAD_SAPP_DOCUMENTS = [
    ([1, 2], ["top level = [1, 2]", "expected a mapping"]),
    ({"name": "x"}, ["missing field 'layers_description'", "'groups'", "'name'"]),
    ({"layers_description": {}}, ["'layers_description' = {}", "non-empty list"]),
    ({"layers_description": []}, ["'layers_description' = []", "non-empty list"]),
    (sapp(body(), 7), ["layers_description[1] = 7", "mapping"]),
    (
        sapp(body(), body()),
        ["layer 'layer'", "'name' = 'layer'", "unique", "layers_description[0] already uses"],
    ),
    (sapp(head(), tail()), ["no body group", "'BODY'"]),
    (sapp(head(), head(name="h2"), body()), ["layer 'h2'", "'type' = 'HEAD'", "at most one head"]),
    (sapp(body(), tail(), tail(name="t2")), ["layer 't2'", "'type' = 'TAIL'", "at most one tail"]),
    (sapp(body(), head()), ["layer 'emb'", "'type' = 'HEAD'", "first", "layers_description[1]"]),
    (sapp(tail(), body()), ["layer 'out'", "'type' = 'TAIL'", "last"]),
    (sapp(body(), name=""), ["top level", "'name' = ''"]),
    ({**sapp(body()), "groups": []}, ["both"]),
]


@pytest.mark.parametrize(("data", "fragments"), BAD_SAPP_DOCUMENTS)
def test_bad_sapp_document(tmp_path: Path, data: Any, fragments: list[str]) -> None:
    path = write_json(tmp_path, data)
    raises_with(lambda: load_profile(path), str(path), *fragments)


# --- validation: content (ours) --------------------------------------------------------------------
BAD_OWN = [
    (own(own_body(kind="middle")), ["group 'blk'", "'kind' = 'middle'", "'head', 'body', 'tail'"]),
    (own(own_body(count=0)), ["group 'blk'", "'count' = 0"]),
    (own(own_body(count=1.5)), ["group 'blk'", "'count' = 1.5"]),
    (own(own_body(forward=-2)), ["group 'blk'", "'forward' = -2", ">= 0"]),
    (own(own_body(params="big")), ["group 'blk'", "'params' = 'big'"]),
    (own(own_body(modes={"half": {"backward": 1, "activation": 1}})), ["group 'blk'", "'half'"]),
    (own(own_body(modes={})), ["group 'blk'", "'modes' = {}", "at least one"]),
    (own(own_body(modes=[1])), ["group 'blk'", "'modes' = [1]"]),
    (own(own_body(modes={"none": 3})), ["group 'blk'", "mode 'none' = 3", "backward"]),
    (
        own(own_body(modes={"none": {"backward": 1}})),
        ["group 'blk'", "mode 'none'", "'activation' is missing"],
    ),
    (
        own(own_body(modes={"full": {"backward": -1, "activation": 2}})),
        ["group 'blk'", "mode 'full'", "'backward' = -1"],
    ),
    (
        own(own_body(modes={"none": {"backward": 1, "activation": 1, "extra": 0}})),
        ["mode 'none'", "unknown field 'extra'"],
    ),
    (own(own_body(colour="red")), ["group 'blk'", "unknown field 'colour'"]),
    (own({k: v for k, v in own_body().items() if k != "modes"}), ["'modes' is missing"]),
    (own({k: v for k, v in own_body().items() if k != "count"}), ["'count' is missing"]),
    (own({k: v for k, v in own_body().items() if k != "forward"}), ["'forward' is missing"]),
    (own({k: v for k, v in own_body().items() if k != "name"}), ["groups[0]", "'name' is missing"]),
    (own(own_body(), format="sapptk-profile/9"), ["'format' = 'sapptk-profile/9'"]),
    (own(own_body(), units={"time": "s", "memory": "MB"}), ["'time' = 's'", "'ms'"]),
    (own(own_body(), units={"energy": "J"}), ["unknown field 'energy'"]),
    (own(own_body(), colour="red"), ["top level", "unknown field 'colour'"]),
    ({"format": "sapptk-profile/1", "name": "x"}, ["'groups' is missing"]),
    (own(own_body(name="a"), own_body(name="a")), ["group 'a'", "unique", "groups[0]"]),
    (
        own(own_body(), {"name": "h", "kind": "head", "count": 1, "forward": 1, "params": 1}),
        ["group 'h'", "'kind' = 'head'", "first"],
    ),
    (own({"name": "h", "kind": "head", "count": 1, "forward": 1, "params": 1}), ["no body group"]),
]


@pytest.mark.parametrize(("data", "fragments"), BAD_OWN)
def test_bad_own_format(tmp_path: Path, data: Any, fragments: list[str]) -> None:
    path = tmp_path / "o.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    raises_with(lambda: load_profile(path), str(path), *fragments)


# --- no mutation -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data",
    [
        sapp(head(), body(forward_time=50, recompute_coef=0.7), body(name="b2"), tail()),
        bundled_profile("deepseek_v3").to_dict(),
        sapp(body(), body()),  # an invalid one too
        own(own_body(kind="middle")),
    ],
)
def test_loading_never_mutates_input(data: dict[str, Any]) -> None:
    before = copy.deepcopy(data)
    with contextlib.suppress(ProfileError):
        Profile.from_dict(data)
    assert data == before


# --- bundled profile lookup ----------------------------------------------------------------------
def test_unknown_bundled_profile() -> None:
    raises_with(lambda: bundled_profile("gpt5"), "'gpt5'", "llama2_70b", "deepseek_v3")
    raises_with(lambda: bundled_profile("../pyproject"), "'../pyproject'")


def test_installed_data_dir_comes_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    installed, source_tree = tmp_path / "_data", tmp_path / "data"
    installed.mkdir()
    source_tree.mkdir()
    (installed / "demo.json").write_text(json.dumps(sapp(body(), name="installed")))
    (source_tree / "demo.json").write_text(json.dumps(sapp(body(), name="tree")))
    (source_tree / "other.yaml").write_text(yaml.safe_dump(own(own_body())))
    (source_tree / "README.md").write_text("not a profile")
    (source_tree / "manual.yaml").write_text("even: {offset: 0, recompute: false}\n")
    (source_tree / "broken.json").write_text("{")
    monkeypatch.setattr(profile_mod, "_data_dirs", lambda: [installed, source_tree])
    assert bundled_profiles() == ["demo", "other"]
    assert bundled_profile("demo").name == "installed"
    assert bundled_profile("other").name == "o"
    raises_with(lambda: bundled_profile("manual"), "'manual'", "demo, other")


# --- properties --------------------------------------------------------------------------------------
finite = st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False)
mode_costs = st.builds(ModeCost, backward=finite, activation=finite)


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    names = draw(st.lists(st.text(min_size=1, max_size=12).filter(str.strip), min_size=1,
                          max_size=5, unique=True))
    groups = []
    for name in names:
        modes = draw(st.dictionaries(st.sampled_from(MODES), mode_costs, min_size=1))
        groups.append(
            LayerGroup(name, "body", draw(st.integers(1, 200)), draw(finite), draw(finite), modes)
        )
    return Profile(draw(st.text(min_size=1, max_size=12).filter(str.strip)), tuple(groups))


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(profiles())
def test_own_format_round_trips(p: Profile) -> None:
    assert Profile.from_dict(p.to_dict()) == p
    assert Profile.from_dict(yaml.safe_load(p.to_yaml())) == p
    assert pickle.loads(pickle.dumps(p)) == p


@settings(max_examples=60, deadline=None)
@given(
    time_=st.floats(min_value=0, max_value=1e4),
    coefs=st.lists(st.floats(min_value=-0.99, max_value=5), min_size=5, max_size=5),
)
def test_sapp_backward_formula(time_: float, coefs: list[float]) -> None:
    keys = ["backward_coef", "select_rec_coef", "select_comm_coef", "both_comm_select_coef",
            "recompute_coef"]
    entry = body(
        time=time_,
        memory_select_rec=1,
        memory_select_comm=1,
        memory_both_comm_select=1,
        **dict(zip(keys, coefs, strict=True)),
    )
    (b,) = Profile.from_dict(sapp(entry)).body
    for mode, coef in zip(MODES, coefs, strict=True):
        assert b.mode(mode).backward == pytest.approx((1 + coef) * 2 * time_, abs=1e-8)
        assert b.forward == time_


def test_modes_are_kept_weakest_first_and_only_known_kinds_are_accepted() -> None:
    given = {m: ModeCost(backward=10 + i, activation=50 - 10 * i) for i, m in reversed(list(enumerate(MODES)))}
    group = LayerGroup("g", "body", 1, 5, 1, given)
    assert list(group.modes) == list(MODES) == list(ModeTable(given))  # in MODES order, whatever the input order
    assert group.strongest_mode == MODES[-1]  # the least activation
    for kind in GROUP_KINDS:
        assert LayerGroup("g", kind, 1, 5, 1, given).kind == kind
    raises_with(lambda: LayerGroup("g", "middle", 1, 5, 1, given), "'kind' = 'middle'", "'head', 'body', 'tail'")
    sapp_types = [g.kind for g in Profile.from_dict(sapp(head(), body(), tail())).groups]
    assert sapp_types == list(GROUP_KINDS)  # HEAD, BODY, TAIL in a SAPP file
