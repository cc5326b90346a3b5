"""Long-context profile fields: ``Profile.seq_length``, ``LayerGroup.kv_mb_per_token`` and
``attention_share``, read and written by both formats and checked at the boundary."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sapptk.errors import ProfileError
from sapptk.profile import MAX_SEQ_LENGTH, LayerGroup, ModeCost, Profile, bundled_profile, load_profile


def sapp_doc(**top: Any) -> dict[str, Any]:
    body = {"name": "layer", "type": "BODY", "nb_layer": 8, "time": 100, "memory_parameter": 1000,
            "memory_activation": 500, "kv_mb_per_token": 0.002, "attention_share": 0.25}
    head = {"name": "emb", "type": "HEAD", "nb_layer": 1, "time": 10, "memory_parameter": 50}
    return {"name": "long", **top, "layers_description": [head, body]}


def test_defaults_keep_existing_profiles_unchanged() -> None:
    profile = bundled_profile("demo")
    assert profile.seq_length is None
    assert all(g.kv_mb_per_token is None and g.attention_share == 0.0 for g in profile.groups)
    assert "seq_length" not in profile.to_dict() and "seq_length" not in profile.to_sapp_dict()
    assert all("kv_mb_per_token" not in g and "attention_share" not in g for g in profile.to_dict()["groups"])
    assert "kv_mb_per_token" not in profile.to_sapp_json()


def test_sapp_json_fields_read_and_written_back(tmp_path: Path) -> None:
    path = tmp_path / "long.json"
    path.write_text(json.dumps(sapp_doc(seq_length=32768)), encoding="utf-8")
    profile = load_profile(path)
    assert profile.seq_length == 32768
    layer = profile.body[0]
    assert (layer.kv_mb_per_token, layer.attention_share) == (0.002, 0.25)
    assert profile.head is not None and profile.head.kv_mb_per_token is None
    data = profile.to_sapp_dict()
    assert data["seq_length"] == 32768
    assert data["layers_description"][1]["kv_mb_per_token"] == 0.002
    assert data["layers_description"][1]["attention_share"] == 0.25
    assert Profile.from_dict(data) == profile


def test_yaml_round_trip_keeps_the_fields(tmp_path: Path) -> None:
    profile = Profile.from_dict(sapp_doc(seq_length=131072))
    path = tmp_path / "long.yaml"
    text = profile.to_yaml(path)
    assert "seq_length: 131072" in text and "kv_mb_per_token: 0.002" in text
    again = load_profile(path)
    assert again == profile and again.seq_length == 131072
    assert again.body[0].attention_share == 0.25


@pytest.mark.parametrize(
    ("top", "entry", "fragments"),
    [
        ({"seq_length": 0}, {}, ("seq_length", "= 0", "integer number of tokens >= 1")),
        ({"seq_length": 1.5}, {}, ("seq_length", "1.5")),
        ({"seq_length": True}, {}, ("seq_length", "True")),
        ({"seq_length": MAX_SEQ_LENGTH + 1}, {}, ("seq_length", f"at most {MAX_SEQ_LENGTH}")),
        ({}, {"kv_mb_per_token": -1}, ("layer 'layer'", "kv_mb_per_token", "-1", ">= 0")),
        ({}, {"kv_mb_per_token": "2"}, ("kv_mb_per_token", "'2'")),
        ({}, {"attention_share": 1.5}, ("layer 'layer'", "attention_share", "1.5", "from 0 to 1")),
        ({}, {"attention_share": 10**400}, ("attention_share", "from 0 to 1")),
        ({}, {"attention_share": float("nan")}, ("attention_share", "nan")),
    ],
)
def test_bad_values_name_the_field(top: dict[str, Any], entry: dict[str, Any], fragments: tuple[str, ...]) -> None:
    doc = sapp_doc(**top)
    doc["layers_description"][1].update(entry)
    with pytest.raises(ProfileError) as info:
        Profile.from_dict(doc, source="long.json")
    for fragment in fragments:
        assert fragment in str(info.value)


def test_own_format_checks_the_fields_too() -> None:
    data = Profile.from_dict(sapp_doc()).to_dict()
    data["groups"][1]["attention_share"] = -0.1
    with pytest.raises(ProfileError, match="attention_share"):
        Profile.from_dict(data, source="p.yaml")
    data["groups"][1]["attention_share"] = 0.1
    data["seq_length"] = "long"
    with pytest.raises(ProfileError, match="seq_length"):
        Profile.from_dict(data, source="p.yaml")


def test_direct_construction_validates() -> None:
    modes = {"none": ModeCost(1.0, 1.0)}
    with pytest.raises(ProfileError, match="attention_share"):
        LayerGroup("b", "body", 1, 1.0, 1.0, modes, attention_share=2)
    with pytest.raises(ProfileError, match="kv_mb_per_token"):
        LayerGroup("b", "body", 1, 1.0, 1.0, modes, kv_mb_per_token=float("inf"))
    group = LayerGroup("b", "body", 1, 1.0, 1.0, modes, kv_mb_per_token=1, attention_share=1)
    assert isinstance(group.kv_mb_per_token, float) and group.attention_share == 1.0
    with pytest.raises(ProfileError, match="seq_length"):
        Profile("p", (group,), seq_length=-4)
    assert Profile("p", (group,), seq_length=4096.0).seq_length == 4096
