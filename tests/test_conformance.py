"""sapptk's orders against PyTorch's, op by op.

``tests/data/torch_schedules/`` holds the per-rank orders of every schedule PyTorch's
``torch.distributed.pipelining`` has, exported once by ``scripts/export_torch_schedules.py``
(its ``MANIFEST.json`` records the torch version) for p in {2, 4, 8} and m in
{p, p+1, 2p, 2p+2, 3p, 4p}. Each file is read with :func:`sapptk.schedules.from_csv` and
compared with the sapptk schedule of the same name: every op of every device, in order, and
the placement of the virtual stages. These tests never import torch.

Intended differences, each tested as such below: the ``-rf`` options put the remainder
m mod p in the first micro-batch group, where PyTorch uses equal rounds; ``zb-v-greedy`` is
a list schedule at given costs, not PyTorch's fixed ZB-V order.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sapptk.schedules import build, from_csv
from sapptk.schedules.program import Program
from sapptk.simulation import simulate

DATA = Path(__file__).parent / "data" / "torch_schedules"
MANIFEST = json.loads((DATA / "MANIFEST.json").read_text(encoding="utf-8"))
ENTRIES = MANIFEST["files"]

# PyTorch class -> sapptk schedule (InterleavedZeroBubble with one stage per rank is ZB-H1)
SAPPTK_NAME = {
    "GPipe": "gpipe",
    "1F1B": "1f1b",
    "Interleaved1F1B": "interleaved",
    "InterleavedZeroBubble": "interleaved-zb",
    "ZBVZeroBubble": "zb-v",
    "DualPipeV": "dualpipe-v",
}


def sapptk_name(entry: dict) -> str:
    if entry["schedule"] == "InterleavedZeroBubble" and entry["chunks"] == 1:
        return "zb-h1"
    return SAPPTK_NAME[entry["schedule"]]


def torch_program(entry: dict) -> Program:
    return from_csv(DATA / entry["file"])


def ours(name: str, entry: dict) -> Program:
    return build(name, stages=entry["stages"], micro_batches=entry["micro_batches"], chunks=entry["chunks"])


def same_order(a: Program, b: Program) -> bool:
    return a.units == b.units and a.placement == b.placement


def test_the_fixtures_cover_every_pytorch_schedule_and_size():
    assert MANIFEST["torch_version"].startswith("2.13")
    assert {e["schedule"] for e in ENTRIES} == set(SAPPTK_NAME)
    for p in (2, 4, 8):
        sizes = {p, p + 1, 2 * p, 2 * p + 2, 3 * p, 4 * p}
        for schedule in SAPPTK_NAME:
            got = {e["micro_batches"] for e in ENTRIES if e["schedule"] == schedule and e["stages"] == p}
            want = {m for m in sizes if schedule != "DualPipeV" or m >= 2 * p}  # DualPipeV needs m >= 2p
            assert got == want, (schedule, p)
    assert len(ENTRIES) == 130


@pytest.mark.parametrize("entry", ENTRIES, ids=[e["file"] for e in ENTRIES])
def test_sapptk_order_equals_pytorch(entry):
    theirs = torch_program(entry)
    mine = ours(sapptk_name(entry), entry)
    assert (theirs.stages, theirs.chunks, theirs.micro_batches) == (entry["stages"], entry["chunks"],
                                                                     entry["micro_batches"])
    for device in range(mine.stages):
        assert mine.device_ops(device) == theirs.device_ops(device), f"device {device}"
    assert same_order(mine, theirs)


INTERLEAVED = [e for e in ENTRIES if e["schedule"] == "Interleaved1F1B"]


@pytest.mark.parametrize("entry", INTERLEAVED, ids=[e["file"] for e in INTERLEAVED])
def test_remainder_first_differs_only_where_the_rounds_differ(entry):
    """Intended: ``interleaved-rf`` keeps the first group p + m mod p (PyTorch: equal rounds).

    The groups coincide when p divides m or m < 2p (one round); elsewhere the orders differ,
    and equal rounds are never slower (F = 1, B = 2, with and without communication) and
    never hold more live activations on any device.
    """
    p, m = entry["stages"], entry["micro_batches"]
    theirs, rf = torch_program(entry), ours("interleaved-rf", entry)
    assert same_order(theirs, rf) == (m % p == 0 or m < 2 * p)
    if not same_order(theirs, rf):
        for comm in (0.0, 0.3):
            step_equal = simulate(theirs, forward=1, backward=2, comm=comm).step_time
            assert step_equal <= simulate(rf, forward=1, backward=2, comm=comm).step_time + 1e-9
        assert (theirs.peak_live() <= rf.peak_live()).all()
        assert theirs.peak_live()[0] < rf.peak_live()[0]


def test_remainder_first_can_be_faster_when_stages_differ():
    """Equal rounds win at equal stage costs, not always otherwise: p = 4, m = 10, v = 2 with
    forwards 3, 3, 1, 1, 1, 1, 3, 1 per virtual stage (backward twice the forward)."""
    f = [3.0, 3.0, 1.0, 1.0, 1.0, 1.0, 3.0, 1.0]
    b = [2 * x for x in f]
    equal, rf = (build(n, stages=4, micro_batches=10, chunks=2) for n in ("interleaved", "interleaved-rf"))
    assert simulate(equal, forward=f, backward=b).step_time == 169.0
    assert simulate(rf, forward=f, backward=b).step_time == 163.0


@pytest.mark.parametrize("entry", INTERLEAVED, ids=[e["file"] for e in INTERLEAVED])
def test_megatron_grouping_equals_pytorch_on_the_fixture_sizes(entry):
    """Megatron's smallest valid group size gives PyTorch's rounds for every m of the suite
    (p | m: g = p; m = p + 1: one group; m = 2p + 2: g = p + 1, two equal groups)."""
    assert same_order(torch_program(entry), ours("interleaved-megatron", entry))


def test_megatron_grouping_differs_where_pytorch_refuses():
    """p = 4, m = 13: PyTorch refuses (3 rounds do not divide 13); sapptk's equal rounds are
    5 + 4 + 4, Megatron's smallest valid group size is 7 (4, 5 and 6 leave a last group < p)."""
    from sapptk.schedules.interleaved import micro_batch_groups

    assert [len(g) for g in micro_batch_groups(4, 13)] == [5, 4, 4]
    assert [len(g) for g in micro_batch_groups(4, 13, "megatron")] == [7, 6]
    equal, megatron = (build(n, stages=4, micro_batches=13, chunks=2) for n in ("interleaved", "interleaved-megatron"))
    assert not same_order(equal, megatron)
    # device 0 warms up (v - 1)·g + 2(p - 1) forwards and holds one more: g = 5 -> 12, g = 7 -> 14
    assert equal.peak_live()[0] == 12 < megatron.peak_live()[0] == 14
    assert simulate(equal, forward=1, backward=2).step_time <= simulate(megatron, forward=1, backward=2).step_time


ZBV = [e for e in ENTRIES if e["schedule"] == "ZBVZeroBubble"]


@pytest.mark.parametrize("entry", ZBV, ids=[e["file"] for e in ZBV])
def test_zb_v_greedy_is_a_different_schedule(entry):
    """Intended: ``zb-v-greedy`` is a list schedule (here at unit costs), PyTorch's ZB-V a fixed
    order; both keep 1F1B's peak of 2p chunk activations."""
    theirs, greedy = torch_program(entry), ours("zb-v-greedy", entry)
    assert greedy.placement == theirs.placement
    assert greedy.peak_live().max() == theirs.peak_live().max() == 2 * entry["stages"]
