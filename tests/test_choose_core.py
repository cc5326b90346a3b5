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
