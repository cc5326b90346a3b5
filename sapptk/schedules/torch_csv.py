"""PyTorch's schedule CSV (``torch.distributed.pipelining``), both ways.

The format of ``_dump_csv`` / ``_load_csv``: one row per rank (device), one cell per
action in run order. A compute action is ``<stage><kind><micro-batch>``: ``0F0`` (forward),
``1B3`` (full backward), ``2I1`` (input-gradient backward), ``2W1`` (weight-gradient
backward), where ``stage`` is the global (virtual) stage index. Ops run overlapped (DualPipeV's
forward/backward pairs) are one cell ``(0F3;5B1)OVERLAP_F_B``. An empty cell is an idle slot
PyTorch draws for alignment; it carries no time. Rows written with communication
(``format="compute_comms"``) also hold ``SEND_F``, ``RECV_F``, ``SEND_B``, ``RECV_B``,
``UNSHARD``, ``RESHARD`` and ``REDUCE_GRAD`` actions (``1SEND_F0``, ``0UNSHARD``): sapptk models
communication as the ``comm`` latency, so these are read and skipped.

Writing is :meth:`Program.to_csv <sapptk.schedules.program.Program.to_csv>`. Reading
(:func:`from_csv`) infers everything from the file: the devices are the rows; the
virtual stages ``0..n-1`` are the stage indices used (each on exactly one row, every row
holding ``n / rows`` of them); the micro-batches ``0..m-1`` are the indices used. Each
(stage, micro-batch) needs one ``F`` and either one ``B`` or one ``I`` and one ``W``.
Every problem is a :class:`~sapptk.errors.ScheduleError` naming the file, the line and the
column (1-based) of the cell; an order that deadlocks is a
:class:`~sapptk.errors.DeadlockError` listing the ops of the cycle with their positions.
"""

from __future__ import annotations

import csv
import io
import os
import re
from pathlib import Path

from sapptk import checks
from sapptk.errors import DeadlockError, ScheduleError
from sapptk.files import read_text
from sapptk.schedules.program import Op, Program, make_program

__all__ = ["from_csv", "from_csv_text"]

_COMPUTE = re.compile(r"(\d+)([FBIW])(\d+)")
_OTHER = re.compile(r"(\d+)(UNSHARD|RESHARD|REDUCE_GRAD|SEND_F|RECV_F|SEND_B|RECV_B)(\d*)")
_OVERLAP = re.compile(r"\((.*)\)OVERLAP_F_B")
_MAX_BYTES = checks.MAX_SCHEDULE_CSV_BYTES

Position = tuple[int, int]  # (line, column), 1-based


# -------------------------------------------------------------------------------- read
def _parse_action(text: str, where: str) -> list[Op] | None:
    """The ops of one cell (None for an empty cell or a communication action)."""
    text = text.strip()
    if not text:
        return None
    overlap = _OVERLAP.fullmatch(text)
    if overlap:
        parts = [x.strip() for x in overlap.group(1).split(";") if x.strip()]
        ops = []
        for part in parts:
            match = _COMPUTE.fullmatch(part)
            if not match:
                raise ScheduleError(
                    f"{where}: {checks.show(part)} inside {checks.show(text)} is not a compute action: expected "
                    "<stage><F|B|I|W><micro-batch> such as 0F3 or 5B1"
                )
            ops.append(_op(match, where))
        if not ops:
            raise ScheduleError(f"{where}: {checks.show(text)} overlaps no action: expected (0F3;5B1)OVERLAP_F_B")
        return ops
    match = _COMPUTE.fullmatch(text)
    if match:
        return [_op(match, where)]
    if _OTHER.fullmatch(text):
        return None
    raise ScheduleError(
        f"{where}: {checks.show(text)} is not a PyTorch schedule action: expected <stage><F|B|I|W><micro-batch> "
        "(0F0, 1B3, 2I1, 2W1), (0F3;5B1)OVERLAP_F_B, a communication action (1SEND_F0, 0UNSHARD, ...) or an "
        "empty cell"
    )


def _op(match: re.Match[str], where: str) -> Op:
    """The op of a compute action; its stage and micro-batch bounded before they are converted
    (a 20-digit stage would otherwise ask for that many stages)."""
    stage, kind, micro_batch = match.group(1), match.group(2), match.group(3)
    for label, digits in (("stage", stage), ("micro-batch", micro_batch)):
        if len(digits) > len(str(checks.MAX_INDEX)) or int(digits) > checks.MAX_INDEX:
            checks.fail(ScheduleError, f"{where}: {label} of {match.group(0)[:40]!r}", int(digits[:40]),
                        f"at most {checks.MAX_INDEX:,} (sapptk.checks.MAX_INDEX)")
    return Op(kind, int(micro_batch), int(stage))


def _rows(text: str, source: str) -> list[list[tuple[Position, list[Op]]]]:
    """Per row, the compute cells with their (line, column)."""
    reader = csv.reader(io.StringIO(text))
    rows = []
    total = 0
    try:
        for row in reader:
            line = reader.line_num
            cells = []
            for col, cell in enumerate(row, start=1):
                ops = _parse_action(cell, f"{source}, line {line}, column {col}")
                if ops is not None:
                    cells.append(((line, col), ops))
                    total += len(ops)
                    checks.size(total, f"{source}, up to line {line}, column {col}", error=ScheduleError,
                                limit=checks.MAX_PROGRAM_OPS, what="ops", constant="sapptk.checks.MAX_PROGRAM_OPS")
            rows.append((line, cells))
    except csv.Error as exc:
        raise ScheduleError(f"{source}, line {reader.line_num}: not valid CSV: {exc}") from None
    # trailing blank lines are not ranks
    while rows and not rows[-1][1]:
        rows.pop()
    if not rows:
        raise ScheduleError(f"{source}: no actions: expected one row of actions per rank")
    return [cells for _, cells in rows]


def _at(pos: Position) -> str:
    return f"line {pos[0]}, column {pos[1]}"


def from_csv_text(text: str, *, source: str = "<csv>", name: str | None = None) -> Program:
    """A :class:`Program` from the text of a PyTorch schedule CSV (see the module docstring).

    ``source`` names the text in messages; ``name`` is the program's name (default
    ``"csv:<source stem>"``).
    """
    if not isinstance(text, str):
        checks.fail(ScheduleError, f"{source}: the schedule CSV", text, "text")
    rows = _rows(text, source)
    p = len(rows)
    position: dict[Op, Position] = {}
    rank_of: dict[int, tuple[int, Position]] = {}
    for rank, cells in enumerate(rows):
        for pos, ops in cells:
            for op in ops:
                if op in position:
                    raise ScheduleError(
                        f"{source}, {_at(pos)}: {_name(op)} appears twice (first at {_at(position[op])}): "
                        "expected every op once"
                    )
                position[op] = pos
                seen = rank_of.setdefault(op.virtual_stage, (rank, pos))
                if seen[0] != rank:
                    raise ScheduleError(
                        f"{source}, {_at(pos)}: stage {op.virtual_stage} on rank {rank} (line {pos[0]}), but "
                        f"{_at(seen[1])} runs it on rank {seen[0]}: expected each stage on one rank"
                    )
    stages_used = sorted(rank_of)
    n = stages_used[-1] + 1
    missing = [s for s in range(n) if s not in rank_of]
    if missing:
        top = stages_used[-1]
        raise ScheduleError(
            f"{source}, {_at(rank_of[top][1])}: stage {top} is out of range: stages 0..{top} would need "
            f"stage {missing[0]} too, which no action uses ({len(missing)} stage(s) missing)"
        )
    per_rank = [sum(1 for _, (r, _) in rank_of.items() if r == rank) for rank in range(p)]
    if n % p or any(c != n // p for c in per_rank):
        rank = next((r for r, c in enumerate(per_rank) if c != max(n // p, 1)), 0)
        raise ScheduleError(
            f"{source}: {n} stages on {p} ranks, rank {rank} (line {rows[rank][0][0][0] if rows[rank] else '?'}) "
            f"holds {per_rank[rank]}: expected every rank to hold the same number of stages"
        )
    m = max(op.micro_batch for op in position) + 1
    _check_complete(position, rank_of, rows, n, m, source)
    placement = [rank_of[s][0] for s in range(n)]
    units = [[tuple(ops) for _, ops in cells] for cells in rows]
    label = name if name is not None else f"csv:{Path(source).stem}"
    try:
        return make_program(label, stages=p, micro_batches=m, chunks=n // p, splits=1,
                            placement=placement, device_units=units)
    except DeadlockError as exc:
        cycle = ", ".join(f"{_name(op)} at {_at(position[op])}" for op in exc.cycle if op in position)
        raise DeadlockError(f"{source}: the order deadlocks; the cycle: {cycle} ({exc})", cycle=exc.cycle) from None
    except ScheduleError as exc:
        raise ScheduleError(f"{source}: {exc}") from None


def _name(op: Op) -> str:
    return f"{op.virtual_stage}{op.kind}{op.micro_batch}"


def _check_complete(
    position: dict[Op, Position],
    rank_of: dict[int, tuple[int, Position]],
    rows: list,
    n: int,
    m: int,
    source: str,
) -> None:
    """Every (stage, micro-batch) has one F and one B, or one I and one W."""
    for s in range(n):
        rank = rank_of[s][0]
        line = rows[rank][0][0][0]
        for mb in range(m):
            has = {kind: Op(kind, mb, s) in position for kind in "FBIW"}
            problem = None
            if not has["F"]:
                problem = f"no forward {s}F{mb}"
            elif has["B"] and (has["I"] or has["W"]):
                other = Op("I" if has["I"] else "W", mb, s)
                problem = f"{s}B{mb} and {_name(other)} at {_at(position[other])}: a backward is B, or I and W"
            elif not has["B"] and not has["I"]:
                problem = f"no backward {s}B{mb} (or {s}I{mb} and {s}W{mb})"
            elif has["I"] != has["W"]:
                problem = f"{s}I{mb} without {s}W{mb}" if has["I"] else f"{s}W{mb} without {s}I{mb}"
            if problem:
                raise ScheduleError(
                    f"{source}, line {line} (rank {rank}): micro-batch {mb} of stage {s}: {problem}; micro-batches "
                    f"0..{m - 1} are used, so each needs a forward and a backward on every stage"
                )


def from_csv(path: str | os.PathLike[str], *, name: str | None = None) -> Program:
    """Read a PyTorch schedule CSV file as a validated :class:`Program` (see the module docstring).

    The program's name is ``"csv:<file stem>"`` unless ``name`` is given.
    """
    if not isinstance(path, str | os.PathLike):
        checks.fail(ScheduleError, "schedule CSV path", path, "a file path")
    source = os.fspath(path)
    file = Path(source)
    text = read_text(source, what="schedule CSV", error=ScheduleError, max_bytes=_MAX_BYTES)  # sapptk.files guards
    return from_csv_text(text, source=source, name=name if name is not None else f"csv:{file.stem}")

