"""The op vocabulary of a schedule: kinds, their integer codes, and the :class:`Op` tuple.

``F``  forward of one (micro-batch, virtual stage, slice)
``B``  full backward (input and weight gradients together)
``I``  input-gradient part of a split backward (zero-bubble); its ``W`` must follow
``W``  weight-gradient part of a split backward

Programs store ops as arrays of integer codes (``KINDS[code]`` is the letter); :class:`Op`
is the readable view for builders written op by op, for messages and for tests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

KINDS: tuple[str, ...] = ("F", "B", "I", "W")
KIND_NAMES: dict[str, str] = {
    "F": "forward",
    "B": "backward",
    "I": "input-gradient",
    "W": "weight-gradient",
}
KIND_CODES: dict[str, int] = {k: i for i, k in enumerate(KINDS)}
F_CODE, B_CODE, I_CODE, W_CODE = 0, 1, 2, 3


class Op(NamedTuple):
    """One compute op: its kind, micro-batch, virtual stage and sequence slice."""

    kind: str
    micro_batch: int
    virtual_stage: int
    slice: int = 0

    def __str__(self) -> str:
        tail = f"/{self.slice}" if self.slice else ""
        return f"{self.kind}{self.micro_batch}@{self.virtual_stage}{tail}"


Unit = tuple[Op, ...]
"""Ops a device runs overlapped, as one unit (usually a single op)."""


@dataclass(frozen=True, eq=False)
class OpArrays:
    """The op order of a program as flat arrays: ops device by device, unit by unit, in run order.

    ``unit_ptr`` (p + 1): device ``d`` runs units ``unit_ptr[d]:unit_ptr[d+1]``.
    ``unit_op_ptr`` (units + 1): unit ``u`` holds ops ``unit_op_ptr[u]:unit_op_ptr[u+1]``.
    ``kind`` (int8 codes into :data:`KINDS`), ``micro_batch``, ``virtual_stage``, ``slice``
    (int64): one entry per op. The arrays are made read-only.
    """

    unit_ptr: np.ndarray
    unit_op_ptr: np.ndarray
    kind: np.ndarray
    micro_batch: np.ndarray
    virtual_stage: np.ndarray
    slice: np.ndarray

    def __post_init__(self) -> None:
        for name in ("unit_ptr", "unit_op_ptr", "kind", "micro_batch", "virtual_stage", "slice"):
            arr = np.array(getattr(self, name), dtype=np.int8 if name == "kind" else np.int64)  # a private copy
            arr.flags.writeable = False
            object.__setattr__(self, name, arr)

    @property
    def n_ops(self) -> int:
        return len(self.kind)

    @property
    def n_units(self) -> int:
        return len(self.unit_op_ptr) - 1

    def op(self, i: int) -> Op:
        """Op number ``i`` as an :class:`Op`."""
        return Op(KINDS[self.kind[i]], int(self.micro_batch[i]), int(self.virtual_stage[i]), int(self.slice[i]))

    def unit(self, u: int) -> Unit:
        """Unit number ``u`` as a tuple of :class:`Op`."""
        return tuple(self.op(i) for i in range(self.unit_op_ptr[u], self.unit_op_ptr[u + 1]))

    def units(self) -> tuple[tuple[Unit, ...], ...]:
        """Every device's units as tuples of :class:`Op` (built op by op: for readers, not for speed)."""
        letters = np.array(KINDS)[self.kind].tolist()
        ops = [
            Op(k, mb, vs, sl)
            for k, mb, vs, sl in zip(
                letters, self.micro_batch.tolist(), self.virtual_stage.tolist(), self.slice.tolist(), strict=True
            )
        ]
        bounds = self.unit_op_ptr.tolist()
        units = [tuple(ops[a:b]) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
        dev = self.unit_ptr.tolist()
        return tuple(tuple(units[a:b]) for a, b in zip(dev[:-1], dev[1:], strict=True))
