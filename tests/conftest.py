"""Shared fixtures and the rules every test run follows.

* Random tests replay: the ``rng`` fixture is seeded from the test's id (a CRC, the same in
  every process) and a failing test's report prints that seed; hypothesis runs
  derandomised (the same examples on every run and machine), and prints the blob that
  reproduces a failure.
* ``@pytest.mark.slow`` marks tests that take seconds; the fast loop is
  ``pytest -m "not slow" tests``.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import settings
from support import seed_of

from sapptk.profile import Profile, bundled_profile

settings.register_profile("sapptk", derandomize=True, print_blob=True, deadline=None)
settings.load_profile("sapptk")


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from the test's id; the seed is printed when the test fails."""
    seed = seed_of(request.node.nodeid)
    request.node.user_properties.append(("seed", seed))
    return np.random.default_rng(seed)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):  # noqa: ARG001
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        seeds = [value for key, value in item.user_properties if key == "seed"]
        if seeds:
            report.sections.append(("seed", f"rng fixture seed: np.random.default_rng({seeds[0]})"))


@pytest.fixture(scope="session")
def llama() -> Profile:
    """The shipped Llama-2 70B profile (SAPP JSON: 80 body layers; none, select, both, full)."""
    return bundled_profile("llama2_70b")


@pytest.fixture(scope="session")
def demo() -> Profile:
    """The shipped demo profile (SAPP JSON; none, select, comm, both)."""
    return bundled_profile("demo")


@pytest.fixture(scope="session")
def deepseek() -> Profile:
    """The shipped DeepSeek-V3 estimate (sapptk YAML: 3 dense then 58 MoE layers)."""
    return bundled_profile("deepseek_v3")
