"""sapptk.choose as a unit: the stop event and progress, the typed request and its limits,
the whole-call time limit, invalid rows with reasons, the memory levers."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from support import small_profile

import sapptk


def _grid() -> dict:
    return {"devices": 4, "global_batch": 16, "memory_budget": 60.0, "schedules": ["1f1b", "interleaved", "zb-h1"],
            "max_chunks": 2, "dp_bandwidth": 2.0, "deterministic": True}


def _profile() -> sapptk.Profile:
    return small_profile(np.random.default_rng(19), groups=2, layers=(4, 6))


def test_stop_after_the_first_balance_keeps_the_partial_ranking() -> None:
    stop = threading.Event()
    seen: list[dict] = []

    def progress(counts: dict) -> None:
        seen.append(counts)
        if counts["balanced"] >= 1:
            stop.set()

    choice = sapptk.choose(_profile(), stop=stop, on_progress=progress, **_grid())
    assert choice.status == "stopped"
    counts = choice.counts
    assert counts["balanced"] >= 1 and counts["undecided"] >= 1
    assert choice.best is not None and choice.frame.iloc[0]["status"] == "balanced"
    assert "partial" in choice.summary()
    assert all(s["total"] == len(choice.frame) and s["elapsed_s"] >= 0 for s in seen)
    assert [s["decided"] for s in seen] == sorted(s["decided"] for s in seen)
    undecided = choice.frame[choice.frame["status"] == "undecided"]
    assert undecided["reason"].str.startswith("stopped before").all()


def test_a_stop_set_before_the_call_returns_at_once() -> None:
    stop = threading.Event()
    stop.set()
    t0 = time.perf_counter()
    choice = sapptk.choose(_profile(), stop=stop, **_grid())
    assert time.perf_counter() - t0 < 1.0
    assert choice.status == "stopped" and choice.best is None and not choice.proven
    assert (choice.frame["status"] == "undecided").all()
    assert choice.summary().startswith("no winner: stopped")


def test_stop_and_progress_are_checked() -> None:
    with pytest.raises(sapptk.ConfigError, match="stop = 5"):
        sapptk.choose(_profile(), stop=5, **_grid())
    with pytest.raises(sapptk.ConfigError, match="on_progress = 'x'"):
        sapptk.choose(_profile(), on_progress="x", **_grid())


RUNAWAY = [
    ({"devices": 10**12}, "devices = 1000000000000: expected an integer from 1 to 1,048,576"),
    ({"devices": 2**31, "global_batch": 2**31}, "devices = 2147483648"),
    ({"max_chunks": 10**9}, "max_chunks = 1000000000: expected an integer from 1 to 64"),
    ({"max_chunks": 1.5}, "max_chunks = 1.5"),
    ({"max_chunks": "4"}, "max_chunks = '4'"),
    ({"max_chunks": None}, "max_chunks = None"),
    ({"batch": 10**9}, "batch = 1000000000: expected an integer from 1 to 1,024"),
    ({"time_limit": 10**400}, "time_limit = 1000"),
    ({"setup_time_limit": "x"}, "setup_time_limit = 'x'"),
    ({"bound_time": float("inf")}, "bound_time = inf"),
    ({"retry": 10**400}, "retry = 1000"),
    ({"stages": [10**12]}, r"stages\[0\] = 1000000000000"),
    ({"global_batch": 10**400}, "global_batch = 1000"),
    ({"memory_margin": 10**400}, "memory_margin = 1000"),
    ({"oom_risk": 0.01}, "oom_risk: give memory_error too"),
    ({"recompute": ["none", "offload"]}, "activation offload is not offered by choose"),
    ({"per_micro_batch": True}, "per_micro_batch = True: recompute per micro-batch is not offered by choose"),
    ({"hardware": {"name": "x"}}, "hardware: only a model card"),
    ({"foo": 1}, "foo = 1: unknown argument of choose"),
]


@pytest.mark.parametrize(("change", "message"), RUNAWAY)
def test_runaway_inputs_are_refused_at_once(change: dict, message: str) -> None:
    kw = {**_grid(), **change}
    t0 = time.perf_counter()
    with pytest.raises(sapptk.ConfigError, match=message):
        sapptk.choose(_profile(), **kw)
    assert time.perf_counter() - t0 < 0.1


def test_the_number_of_setups_is_refused_before_enumeration(monkeypatch) -> None:
    from sapptk.choosing import setups

    monkeypatch.setattr(setups, "PipelineConfig", None)  # nothing may be built before the refusal
    with pytest.raises(sapptk.ConfigError, match=r"devices = 720720, global_batch = 720720: about [\d,]+ setups: "
                                                 "expected at most 20,000 .sapptk.checks.MAX_SETUPS"):
        sapptk.choose(_profile(), devices=720720, global_batch=720720, memory_budget=None, max_chunks=64)
    with pytest.raises(sapptk.ConfigError, match="stages = range.*: expected at most 20,000 values"):
        sapptk.choose(_profile(), devices=2**20, global_batch=2**20, memory_budget=None, stages=range(1, 2**20 + 1))


def test_divisors_by_factorising() -> None:
    from sapptk.choosing.setups import divisors

    for n in (1, 2, 12, 97, 720720, 2**20, 3 * 5 * 7 * 11 * 13):
        assert divisors(n) == [d for d in range(1, n + 1) if n % d == 0] if n < 10**5 else len(divisors(n)) > 1
    assert divisors(2**20) == [2**k for k in range(21)]


def test_request_is_frozen_and_choose_takes_it() -> None:
    request = sapptk.ChooseRequest(_profile(), **_grid(), setup_time_limit=5)
    assert request.stages is None and request.schedules == ("1f1b", "interleaved", "zb-h1")
    with pytest.raises(AttributeError):
        request.devices = 8  # type: ignore[misc]
    assert request.replace(batch=4).batch == 4 and request.batch == 2
    with pytest.raises(sapptk.ConfigError, match="unknown field 'bogus'"):
        request.replace(bogus=1)
    with pytest.raises(sapptk.ConfigError, match="batch: choose\\(request\\) takes no other argument"):
        sapptk.choose(request, batch=3)
    with pytest.raises(sapptk.ConfigError, match="devices: required"):
        sapptk.choose(_profile(), global_batch=16, memory_budget=None)
    by_request = sapptk.choose(request)
    by_keywords = sapptk.choose(_profile(), **_grid(), setup_time_limit=5)
    columns = ["schedule", "stages", "chunks", "status", "step_time_ms"]
    assert by_request.frame[columns].equals(by_keywords.frame[columns])


def test_a_memory_margin_plans_every_setup_below_it() -> None:
    """With a margin of 6 MB on 60 MB, no balanced plan is above 54 MB, and the choice is the one
    made at a 54 MB budget (the bounds at the safe budget hold); the price is reported."""
    margin = sapptk.choose(_profile(), **{**_grid(), "memory_margin": 6.0})
    at_safe = sapptk.choose(_profile(), **{**_grid(), "memory_budget": 54.0})
    balanced = margin.frame[margin.frame["status"] == "balanced"]
    assert (balanced["peak_mb_max"] <= 54.0 + 1e-6).all() and (margin.frame["safe_budget_mb"] == 54.0).all()
    assert (margin.frame["memory_budget_mb"] == 60.0).all() and margin.proven
    assert margin.frame.iloc[0]["step_time_ms"] == pytest.approx(at_safe.frame.iloc[0]["step_time_ms"])
    no_margin = margin.frame.iloc[0]["step_time_ms_no_margin"]
    assert no_margin <= margin.frame.iloc[0]["step_time_ms"] + 1e-9
    assert any("memory margin's price" in n for n in margin.notes)
    assert any("safe budget of 54 MB" in n for n in margin.notes)
    risky = sapptk.ChooseRequest(_profile(), **_grid(), oom_risk=0.01, memory_error=0.05)
    from sapptk.choosing.engine import _budgets

    budget, safe, _ = _budgets(risky)
    assert budget == 60.0 and safe < 60.0


def test_a_whole_call_time_limit_holds() -> None:
    profile = sapptk.bundled_profile("llama2_70b")
    t0 = time.perf_counter()
    choice = sapptk.choose(profile, devices=16, global_batch=64, memory_budget=56000, time_limit=2.0)
    assert time.perf_counter() - t0 < 2.0 + 2.0
    assert choice.status == "time limit" and not choice.proven
    assert (choice.frame["status"] == "undecided").any()
    assert "time limit ran out" in choice.summary()


def test_a_layout_the_card_cannot_take_is_an_invalid_row() -> None:
    from sapptk.models import card

    choice = sapptk.choose(card("llama2-7b"), hardware="h100", devices=8, global_batch=16, memory_budget=None,
                           schedules=["1f1b"], tp=[1, 3], stages=[2], setup_time_limit=3, deterministic=True)
    frame = choice.frame
    bad = frame[frame["tp"] == 3]
    assert len(bad) == 0  # tp 3 does not divide 8 devices: not a layout
    choice = sapptk.choose(card("llama2-7b"), hardware={**card_hardware(), "name": "mine"}, devices=12,
                           global_batch=12, memory_budget=None, schedules=["1f1b"], tp=[1, 3], stages=[2],
                           setup_time_limit=3, deterministic=True)
    frame = choice.frame
    bad = frame[frame["tp"] == 3]
    assert len(bad) and (bad["status"] == "invalid").all() and bad["reason"].str.contains("tp").all()
    assert (frame[frame["tp"] == 1]["status"] != "invalid").any()


def card_hardware() -> dict:
    import dataclasses

    from sapptk.models import hardware

    return dataclasses.asdict(hardware("h100"))


@pytest.mark.parametrize(("change", "message"), [
    ({"time_limit": "x"}, "time_limit = 'x'"), ({"max_evaluations": "x"}, "max_evaluations = 'x'"),
    ({"time_limit": 10**400}, "time_limit = 1000"), ({"profile": None}, "profile = None: expected a sapptk Profile"),
    ({"config": 5}, "config = 5: expected a sapptk PipelineConfig"),
])
def test_choose_slices_checks_its_arguments(change: dict, message: str) -> None:
    from sapptk.solver.slices import choose_slices

    kw = {"profile": _profile(), "config": sapptk.PipelineConfig(2, 4), "counts": None, **change}
    with pytest.raises(sapptk.ConfigError, match=message):
        choose_slices(kw.pop("profile"), kw.pop("config"), kw.pop("counts"), **kw)
