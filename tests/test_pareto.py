"""sapptk.pareto.pareto_front against a brute-force definition, on random rows with ties."""

from __future__ import annotations

import numpy as np
import pytest

from sapptk.errors import SapptkError
from sapptk.pareto import pareto_front


def brute_front(values: np.ndarray, groups: np.ndarray | None = None) -> list[int]:
    """Row i stays unless a row of its group is <= it everywhere and < somewhere, or is an
    identical row that comes earlier."""
    vals = values if values.ndim == 2 else values[:, None]
    g = np.zeros(len(vals)) if groups is None else groups
    keep = []
    for i in range(len(vals)):
        same = g == g[i]
        le = np.all(vals <= vals[i], axis=1) & same
        lt = np.any(vals < vals[i], axis=1)
        dup = le & ~lt & (np.arange(len(vals)) < i)
        if not (le & lt).any() and not dup.any():
            keep.append(i)
    return keep


@pytest.mark.parametrize("d", [1, 2, 3, 4])
@pytest.mark.parametrize("grouped", [False, True])
def test_equals_brute_force_with_ties_and_duplicates(rng, d, grouped):
    for _ in range(12):
        n = int(rng.integers(0, 120))
        values = rng.integers(0, 6, (n, d)).astype(float)  # few levels: many ties and duplicates
        groups = rng.integers(0, 4, n) if grouped else None
        got = pareto_front(values, groups=groups)
        assert got.dtype == np.int64
        assert got.tolist() == brute_front(values, groups)


def test_floats_and_blocks_beyond_one(rng):
    values = rng.normal(size=(600, 3))  # more rows than one comparison block
    values[::7] = values[::7].round(1)
    assert pareto_front(values).tolist() == brute_front(values)


def test_two_columns_hand_case():
    # (1, 5) (2, 3) (2, 3) (3, 3) (4, 1) (0, 9) (5, 5): the duplicate (2, 3) keeps the first
    values = np.array([[1, 5], [2, 3], [2, 3], [3, 3], [4, 1], [0, 9], [5, 5]])
    assert pareto_front(values).tolist() == [0, 1, 4, 5]


def test_groups_are_compared_apart_and_labels_may_be_strings():
    values = np.array([[1, 1], [2, 2], [2, 2], [0, 3]])
    assert pareto_front(values, groups=np.array(["a", "b", "b", "a"])).tolist() == [0, 1, 3]


def test_shapes_and_errors():
    assert pareto_front(np.zeros((0, 2))).tolist() == []
    assert pareto_front(np.array([3.0, 1.0, 1.0, 2.0])).tolist() == [1]  # 1-D: one column
    assert pareto_front(np.zeros((3, 0)), groups=np.array([0, 1, 0])).tolist() == [0, 1]
    with pytest.raises(SapptkError, match="NaN"):
        pareto_front(np.array([[1.0, np.nan]]))
    with pytest.raises(SapptkError, match=r"groups of shape \(2,\): expected shape \(3,\)"):
        pareto_front(np.zeros((3, 2)), groups=np.zeros(2))
    with pytest.raises(SapptkError, match=r"values of shape \(2, 2, 2\): expected shape \(n, d\)"):
        pareto_front(np.zeros((2, 2, 2)))
    with pytest.raises(SapptkError, match="values of dtype object: expected numbers"):
        pareto_front(np.array([[1, None]], dtype=object))
    with pytest.raises(ValueError):  # a SapptkError is a ValueError: callers that catch ValueError still do
        pareto_front(np.array([[np.nan]]))
