"""The Explorer started from a bundled model card (sapptk.widgets.explorer_from_card)."""

from __future__ import annotations

import pytest

from sapptk.models import Parallel, estimate_profile
from sapptk.widgets import Explorer, explorer_from_card


def test_explorer_starts_from_a_card():
    ex = explorer_from_card("llama3.1-8b", Parallel(tp=2, seq_length=8192), "a100", time_limit=3)
    assert isinstance(ex, Explorer)
    assert ex.profile == estimate_profile("llama3.1-8b", Parallel(tp=2, seq_length=8192), "a100")
    assert ex.budget.value == 80000.0  # the A100 80GB card's memory
    assert ex.config().constant_memory == ex.profile.provenance["constant_mb"]  # context + largest transient
    assert ex.config().stages == 4 and ex.config().micro_batches == 8
    assert all(not box.disabled for box in ex.recompute.values())  # an estimate has every mode


@pytest.mark.slow
def test_explorer_from_a_card_solves():
    ex = explorer_from_card("llama2-7b", Parallel(seq_length=4096), "h100", time_limit=3)
    ex.solve_button.click()
    plan = ex.wait(60)
    assert plan is not None and plan.solved
    assert plan.profile.provenance["card"]["name"] == "llama2-7b"
