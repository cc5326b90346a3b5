"""``SolveRequest``: typed, frozen, checked once at construction with the messages of ``sapptk.checks``."""

from __future__ import annotations

import dataclasses
import pickle
import threading

import numpy as np
import pytest

from sapptk import checks
from sapptk.config import PipelineConfig
from sapptk.errors import ConfigError
from sapptk.request import SolveRequest
from sapptk.solver.settings import SearchOptions


@pytest.fixture()
def setup(demo):
    return demo, PipelineConfig(stages=4, micro_batches=8, memory_budget=40_000)


def test_a_request_keeps_its_fields_converted(setup):
    profile, config = setup
    req = SolveRequest(profile, config, time_limit=5, workers=np.int64(3), seed=7, stall_time=2)
    assert req.time_limit == 5.0 and isinstance(req.time_limit, float)
    assert req.workers == 3 and type(req.workers) is int
    assert req.search_options.stall_time == 2.0
    assert req.safe_config is config and req.safety is None and req.start_counts is None
    assert not req.offload
    with pytest.raises(dataclasses.FrozenInstanceError):
        req.workers = 4  # type: ignore[misc]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("workers", 0, f"workers = 0: expected an integer from 1 to {checks.MAX_WORKERS}"),
    ("workers", checks.MAX_WORKERS + 1, f"workers = {checks.MAX_WORKERS + 1}: expected an integer from 1 to"),
    ("workers", True, "workers = True: expected an integer"),
    ("seed", -1, "seed = -1: expected an integer from 0 to"),
    ("seed", 2**31, "seed = 2147483648: expected an integer from 0 to 2,147,483,647"),
    ("time_limit", 0, "time_limit = 0: expected a finite number > 0"),
    ("time_limit", float("nan"), "time_limit = nan: expected a finite number > 0"),
    ("deterministic", 1, "deterministic = 1: expected True or False"),
    ("per_micro_batch", "yes", "per_micro_batch = 'yes': expected True or False"),
    ("stall_time", -1.0, "stall_time = -1.0: expected a finite number > 0"),
    ("stop", object(), "stop = <object object at"),
    ("options", {"batch": 3}, "options = {'batch': 3}: expected a sapptk.SearchOptions"),
    ("memory_margin", -5, "memory_margin"),
])
def test_every_bad_field_is_named_with_its_value(setup, field, value, message):
    profile, config = setup
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        SolveRequest(profile, config, **{field: value})


def test_bad_profile_config_and_start(setup):
    profile, config = setup
    with pytest.raises(ConfigError, match="profile = 'demo': expected a sapptk Profile"):
        SolveRequest("demo", config)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="config = 3: expected a sapptk PipelineConfig"):
        SolveRequest(profile, 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="start: "):
        SolveRequest(profile, config, start=np.zeros((1, 1, 1)))


def test_replace_is_checked_and_names_unknown_fields(setup):
    profile, config = setup
    req = SolveRequest(profile, config)
    assert req.replace(seed=3).seed == 3 and req.seed == 0
    with pytest.raises(ConfigError, match="workers = 0"):
        req.replace(workers=0)
    with pytest.raises(ConfigError, match="unknown field 'nope'"):
        req.replace(nope=1)
    with pytest.raises(ConfigError, match="unknown field 'safe_config'"):
        req.replace(safe_config=config)


def test_a_pickled_request_drops_its_stop_event(setup):
    profile, config = setup
    stop = threading.Event()
    req = SolveRequest(profile, config, stop=stop, options=SearchOptions(batch=8), memory_margin=0.1)
    back = pickle.loads(pickle.dumps(req))
    assert back.stop is None and req.stop is stop
    assert back.options == req.options and back.safe_config == req.safe_config and back.safety == req.safety
    assert back.replace(seed=1).seed == 1


def test_levers_that_do_not_go_together(setup):
    profile, config = setup
    off = config.replace(recompute=(*config.recompute, "offload"), host_bandwidth=10.0)
    assert SolveRequest(profile, off).offload
    with pytest.raises(ConfigError, match="per_micro_batch = True with 'offload'"):
        SolveRequest(profile, off, per_micro_batch=True)
    with pytest.raises(ConfigError, match="choose_splits = True"):
        SolveRequest(profile, config, choose_splits=True)


@pytest.mark.parametrize("workers", [0, checks.MAX_WORKERS + 1, 100])
def test_every_entry_point_refuses_the_same_workers_with_the_same_message(setup, tmp_path, workers):
    """balance, SolveRequest, sweep and choose: one limit, one message, before anything is solved."""
    from sapptk import balance, choose, sweep

    profile, config = setup
    with pytest.raises(ConfigError) as first:
        SolveRequest(profile, config, workers=workers)
    message = str(first.value)
    assert message == f"workers = {workers}: expected an integer from 1 to {checks.MAX_WORKERS}"
    with pytest.raises(ConfigError) as refused:
        balance(profile, config, workers=workers)
    assert str(refused.value) == message
    with pytest.raises(ConfigError) as refused:
        sweep(profile, {"stages": [4], "micro_batches": [8]}, workers=workers, progress=False)
    assert str(refused.value) == message
    with pytest.raises(ConfigError) as refused:
        choose(profile, devices=4, global_batch=8, memory_budget=None, workers=workers)
    assert str(refused.value) == message
