"""balance() checks every argument at the boundary: a ConfigError naming the argument and its
value, before any solving; nothing from OR-Tools or an assert ever reaches the caller."""

from __future__ import annotations

import math

import numpy as np
import pytest
from support import two_mode_profile

import sapptk
import sapptk.solver.search as search_module
from sapptk.balancer import balance
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.plan import even_split
from sapptk.solver.settings import SearchOptions

PROFILE = two_mode_profile((3, 5))
CONFIG = PipelineConfig(2, 4, 1, "1f1b")


@pytest.fixture
def no_solving(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("the solver should not have started")

    monkeypatch.setattr(search_module, "make_problem", boom)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("time_limit", -1),
        ("time_limit", 0),
        ("time_limit", math.nan),
        ("time_limit", math.inf),
        ("time_limit", "5"),
        ("time_limit", True),
        ("time_limit", None),
        ("workers", -1),
        ("workers", 0),
        ("workers", 65),
        ("workers", 2.5),
        ("workers", "2"),
        ("workers", True),
        ("seed", -1),
        ("seed", 2**31),
        ("seed", 1.5),
        ("seed", "0"),
        ("deterministic", "yes"),
        ("deterministic", 1),
        ("allow_empty_stages", None),
        ("stop", True),
        ("options", {"batch": 3}),
    ],
)
def test_bad_arguments_are_config_errors_naming_them(no_solving, name, value):
    with pytest.raises(ConfigError, match=name) as info:
        balance(PROFILE, CONFIG, **{name: value})
    assert repr(value)[:10] in str(info.value) or type(value).__name__ in str(info.value)


@pytest.mark.parametrize(("profile", "config"), [({"name": "x"}, CONFIG), (PROFILE, {"stages": 2})])
def test_profile_and_config_of_the_wrong_type(no_solving, profile, config):
    with pytest.raises(ConfigError, match="expected a sapptk"):
        balance(profile, config)


def test_search_options_are_checked():
    with pytest.raises(ConfigError, match="local_search_share"):
        SearchOptions(local_search_share=2.0)
    with pytest.raises(ConfigError, match="kick_moves"):
        SearchOptions(kick_moves=(3, 2))
    with pytest.raises(ConfigError, match="batch"):
        SearchOptions(batch=0)
    assert sapptk.SearchOptions is SearchOptions


def test_a_start_plan_for_another_pipeline_or_profile_is_refused(no_solving):
    other_stages = even_split(PROFILE, PipelineConfig(3, 4, 1, "1f1b"))
    with pytest.raises(ConfigError, match=r"start: .*stages = 3 \(expected 2\)"):
        balance(PROFILE, CONFIG, start=other_stages)
    other_profile = even_split(two_mode_profile((4, 4)), CONFIG)
    with pytest.raises(ConfigError, match="start: the plan is for profile"):
        balance(PROFILE, CONFIG, start=other_profile)
    with pytest.raises(ConfigError, match="start: counts: expected shape"):
        balance(PROFILE, CONFIG, start=np.zeros((1, 2, 3)))
    counts = np.array(even_split(PROFILE, CONFIG).counts)
    counts[0, 0, 0] += 1  # one layer too many
    with pytest.raises(ConfigError, match="start: counts: group"):
        balance(PROFILE, CONFIG, start=counts)


def test_a_start_plan_for_another_budget_or_latency_is_accepted():
    plan = even_split(PROFILE, CONFIG.replace(memory_budget=123.0, comm=0.5))
    out = balance(PROFILE, CONFIG, start=plan, time_limit=5, deterministic=True)
    assert out.status == "optimal"
