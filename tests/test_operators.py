"""The operator model of a layer and the achieved-efficiency hardware card (issue 31 items 1-5)."""

from __future__ import annotations

import dataclasses

import pytest

from sapptk.errors import ConfigError
from sapptk.models import HARDWARE, Hardware, hardware


def test_fittable_names_fields_with_bounds_holding_every_bundled_value() -> None:
    names = {f.name for f in dataclasses.fields(Hardware)}
    for hw in HARDWARE.values():
        bounds = hw.fittable()
        assert bounds and set(bounds) <= names
        for name, (low, high) in bounds.items():
            assert low < high and low <= getattr(hw, name) <= high, (hw.name, name)
            assert getattr(dataclasses.replace(hw, **{name: high}), name) == high


def test_hardware_rejects_a_share_above_one_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="attention_efficiency"):
        hardware("h100", attention_efficiency=1.5)
    with pytest.raises(ConfigError, match="launch_us"):
        hardware("h100", launch_us=-1)
