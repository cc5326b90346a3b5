"""PyTorch's schedule CSV both ways: Program.to_csv and sapptk.schedules.from_csv.

Round trips are identity for every registered schedule (splits = 1); PyTorch's own files
(tests/data/torch_schedules, compute-only) and files with communication actions read;
every bad file is a clear error naming the line and column.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sapptk.errors import DeadlockError, ScheduleError
from sapptk.schedules import build, from_csv, from_csv_text, get, names

TORCH = Path(__file__).parent / "data" / "torch_schedules"


def registered_programs():
    for name in names():
        spec = get(name)
        if spec.splits:
            continue
        chunks = [1] if spec.chunks == (1,) else ([2] if spec.chunks == (2,) else [2, 3])
        for p in (2, 3, 4):
            for v in chunks:
                for m in sorted({spec.min_micro_batches(p, v), p + 1, 2 * p + 1, 3 * p}):
                    if m >= spec.min_micro_batches(p, v):
                        yield build(name, stages=p, micro_batches=m, chunks=v)


@pytest.mark.parametrize("program", list(registered_programs()), ids=repr)
def test_round_trip_is_identity(program, tmp_path):
    path = tmp_path / "order.csv"
    text = program.to_csv(path)
    assert path.read_text(encoding="utf-8") == text
    back = from_csv(path)
    assert back.units == program.units
    assert back.placement == program.placement
    assert (back.stages, back.micro_batches, back.chunks, back.splits) == (
        program.stages, program.micro_batches, program.chunks, 1)
    assert back.name == "csv:order"
    assert from_csv(path, name="mine").name == "mine"
    assert back.to_csv() == text


def test_the_spelling_is_pytorchs():
    dual = build("dualpipe-v", stages=2, micro_batches=4, chunks=2)
    first_row = dual.to_csv().splitlines()[0].split(",")
    assert first_row[:4] == ["0F0", "0F1", "0F2", "3F0"]
    assert "(0F3;3B1)OVERLAP_F_B" in first_row
    zb = build("zb-h1", stages=2, micro_batches=2).to_csv().splitlines()
    assert zb[1] == "1F0,1I0,1F1,1I1,1W0,1W1"  # stage 1 runs each W one micro-batch late
    # identical to the file PyTorch itself wrote
    assert build("dualpipe-v", stages=2, micro_batches=4, chunks=2).to_csv() == (
        TORCH / "DualPipeV_p2_v2_m4.csv").read_text(encoding="utf-8").replace("\r\n", "\n")


def test_seq_slices_cannot_be_written():
    with pytest.raises(ScheduleError, match="no sequence slices"):
        build("seq1f1b", stages=2, micro_batches=2, splits=2).to_csv()


def test_empty_cells_and_communication_actions_are_skipped():
    text = (
        "0UNSHARD,0F0,1SEND_F0,,0F1,0RECV_B0,0B0,0B1,0REDUCE_GRAD\n"
        ",1RECV_F0,1F0,1B0,1SEND_B0,1F1,1B1,\n"
        "\n"
    )
    program = from_csv_text(text, source="comms.csv")
    assert program.describe() == "device 0: F0@0 F1@0 B0@0 B1@0\ndevice 1: F0@1 B0@1 F1@1 B1@1"
    assert program.name == "csv:comms"


def bad(text: str, needle: str, error=ScheduleError):
    with pytest.raises(error) as exc:
        from_csv_text(text, source="bad.csv")
    assert needle in str(exc.value), str(exc.value)
    assert "bad.csv" in str(exc.value)
    return exc.value


def test_unknown_action_letter_names_line_and_column():
    bad("0F0,0B0\n1F0,1X0,1B0\n", "line 2, column 2: '1X0' is not a PyTorch schedule action")
    bad("0F0,(0F1;zz)OVERLAP_F_B,0B0\n", "line 1, column 2: 'zz' inside")


def test_stage_out_of_range():
    bad("0F0,0B0,5F0,5B0\n1F0,1B0\n", "line 1, column 3: stage 5 is out of range")


def test_stage_on_two_ranks():
    bad("0F0,1F0,1B0,0B0\n1F1,1B1\n", "line 2, column 1: stage 1 on rank 1")


def test_missing_micro_batch():
    bad("0F0,0F1,0B0\n1F0,1B0,1F1,1B1\n", "micro-batch 1 of stage 0: no backward 0B1")
    bad("0F0,0B0,0F2,0B2\n1F0,1B0,1F2,1B2\n", "micro-batch 1 of stage 0: no forward 0F1")
    bad("0F0,0I0\n1F0,1B0\n", "0I0 without 0W0")


def test_duplicate_op():
    bad("0F0,0B0,0F0\n1F0,1B0\n", "line 1, column 3: 0F0 appears twice (first at line 1, column 1)")
    bad("0F0,0B0,0I0,0W0\n1F0,1B0\n", "0B0 and 0I0 at line 1, column 3")


def test_unequal_stages_per_rank():
    bad("0F0,0B0,2F0,2B0\n1F0,1B0\n", "3 stages on 2 ranks")


def test_deadlock_reports_the_cycle_with_positions():
    # device 0 waits for the backward of stage 1 before its first forward was sent
    err = bad("0B0,0F0\n1F0,1B0\n", "deadlocks; the cycle: 0B0 at line 1, column 1", DeadlockError)
    assert "1F0 at line 2, column 1" in str(err)
    assert err.cycle


def test_bad_files(tmp_path):
    with pytest.raises(ScheduleError, match="cannot read"):
        from_csv(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("\n\n", encoding="utf-8")
    with pytest.raises(ScheduleError, match="no actions"):
        from_csv(tmp_path / "empty.csv")
    (tmp_path / "binary.csv").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ScheduleError, match="cannot read"):
        from_csv(tmp_path / "binary.csv")


# ---------------------------------------------------------------- issue 22: sizes before allocation
@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("0F0,0B0,99999999999999999999F0\n", "stage of '99999999999999999999F0' = 99999999999999999999"),
        ("0F0,0B0,0F99999999999999999999\n", "micro-batch of '0F99999999999999999999'"),
        ("(" * 5000 + "0F0" + ")OVERLAP_F_B" * 5000 + ",0B0\n", "is not a compute action"),
    ],
)
def test_huge_indices_and_nested_cells_are_refused(text, needle):
    with pytest.raises(ScheduleError) as exc:
        from_csv_text(text)
    assert needle in str(exc.value) and len(str(exc.value)) < 500


def test_the_op_limit_is_enforced(monkeypatch):
    from sapptk import checks

    monkeypatch.setattr(checks, "MAX_PROGRAM_OPS", 100)
    with pytest.raises(ScheduleError, match="101 ops: expected at most 100"):
        from_csv_text(",".join(f"0F{i},0B{i}" for i in range(60)) + "\n")
