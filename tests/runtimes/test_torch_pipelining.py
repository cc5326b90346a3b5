"""sapptk's exported orders run by PyTorch's own pipeline runtime (``runtimes`` extra).

For every schedule PyTorch can run (all of sapptk's but sequence slices) at p = 2 and 4,
m with and without m mod p = 0 and v = 1–3: sapptk writes the order as PyTorch's schedule
CSV, ``_PipelineScheduleRuntime._load_csv`` loads it, and one training step of a small
float64 model on p gloo processes (127.0.0.1) gives the loss and the gradients of the same
step in one process, micro-batch by micro-batch. Where PyTorch has the schedule as a class
at that (p, m, v), the class runs the step too, and its own order equals sapptk's.
"""

from __future__ import annotations

import csv
import io

import pytest

torch = pytest.importorskip("torch", reason="the runtimes extra is not installed: pip install -e '.[runtimes]'")

import pipeline_runs  # noqa: E402  (tests/runtimes, after the skip)
import torch_worker  # noqa: E402

from sapptk.schedules import build  # noqa: E402

pytestmark = pytest.mark.slow

CASES = {p: pipeline_runs.cases(p) for p in pipeline_runs.STAGE_COUNTS}
ALL = [c for p in pipeline_runs.STAGE_COUNTS for c in CASES[p]]
_RESULTS: dict[int, dict] = {}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """Runs the cases of a p on first use (one launch of p processes for all of them)."""

    def get(stages: int) -> dict:
        if stages not in _RESULTS:
            _RESULTS[stages] = pipeline_runs.run_cases(CASES[stages], stages,
                                                       tmp_path_factory.mktemp(f"torch_p{stages}"))
        return _RESULTS[stages]

    return get


def test_the_cases_cover_the_spread():
    covered = {(c.schedule, c.stages, c.micro_batches % c.stages == 0, c.chunks) for c in ALL}
    names = {s for s, *_ in covered} | {s for c in ALL for s in c.same_order}
    assert names == set(pipeline_runs.SCHEDULES)  # each schedule runs, or an equal order runs in its place
    for p in (2, 4):
        assert {(p, True), (p, False)} <= {(q, even) for _, q, even, _ in covered}
    assert {v for *_, v in covered} == {1, 2, 3}
    assert sum(c.torch_class is not None for c in ALL) >= 15


def _same_step(case, run) -> None:
    loss, grads = torch_worker.reference({"layers": list(case.layers), "micro_batches": case.micro_batches,
                                          "seed": case.seed})
    assert run["missing"] == []
    assert sorted(run["grads"]) == sorted(grads)
    for name, expected in grads.items():
        torch.testing.assert_close(run["grads"][name], expected, rtol=1e-12, atol=1e-14, msg=name)
    assert len(run["losses"]) == case.micro_batches
    assert sum(run["losses"]) == pytest.approx(loss, rel=1e-12)


@pytest.mark.parametrize("case", ALL, ids=lambda c: c.id)
def test_exported_csv_trains_like_one_process(case, results):
    _same_step(case, results(case.stages)[case.id]["csv"])


WITH_CLASS = [c for c in ALL if c.torch_class is not None]


@pytest.mark.parametrize("case", WITH_CLASS, ids=lambda c: c.id)
def test_pytorch_class_trains_like_one_process(case, results):
    _same_step(case, results(case.stages)[case.id]["class"])


MULTI = [c for c in WITH_CLASS if c.torch_class not in ("GPipe", "1F1B")]


@pytest.mark.parametrize("case", MULTI, ids=lambda c: c.id)
def test_pytorch_class_order_is_sapptks(case, results):
    """PyTorch's generated order (multi-stage classes: ``pipeline_order``, what the runtime
    executes) equals sapptk's op for op; GPipe's and 1F1B's ``_get_pipeline_order`` is only a
    drawing (off by one for 1F1B), so those are compared by their gradients above."""
    text = build(case.schedule, stages=case.stages, micro_batches=case.micro_batches, chunks=case.chunks).to_csv()
    ours = [[cell for cell in row if cell] for row in csv.reader(io.StringIO(text))]
    theirs = results(case.stages)[case.id]["class"]["orders"]
    assert [theirs[r] for r in range(case.stages)] == ours
