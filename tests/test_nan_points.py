"""A point where the derivative is NaN or infinite (sqrt of a negative entry): the values carry it
as dense AD does, and the cross-mode check judges the finite lines where both sides are non-finite
in the same lines (a cache hit at such a point raised a CheckError before)."""

from __future__ import annotations

import warnings

import pytest
import torch

import asd


def f(x):
    return x * x.sqrt()


X = torch.tensor([1.0, -1.0, 4.0, 2.0], dtype=torch.float64)


def test_a_cached_call_at_a_nan_point_returns_what_dense_ad_does():
    asd.clear_cache()
    # dense AD's products put 0 * NaN = NaN in row and column 1 beyond the diagonal too, where the
    # derivative is structurally zero: the stored entries (the diagonal) are compared
    want = torch.func.jacfwd(f)(X).diagonal()
    with warnings.catch_warnings():
        warnings.simplefilter("error", asd.StalePatternWarning)
        for _ in range(3):  # a miss, then hits validated by the probe
            J = asd.sparse_jacobian(f, X)
            assert J.col_indices().tolist() == [0, 1, 2, 3]
            torch.testing.assert_close(J.values(), want, equal_nan=True)
    op = asd.prepare_jacobian(f, X)
    assert op.check(X).ok


@pytest.mark.parametrize("mode", ["forward", "reverse"])
def test_non_finite_lines_that_differ_still_fail_the_check(mode):
    # the pattern given misses (1, 0), whose derivative is NaN at x[0] < 0: the values have a NaN in
    # line 0 only, the matrix-free products in lines 0 and 1
    def g(x):
        return x.sqrt() + x.sqrt().roll(1)

    x = torch.tensor([-1.0, 2.0, 3.0, 4.0], dtype=torch.float64)
    diagonal = asd.SparsityPattern.from_coo([0, 1, 2, 3], [0, 1, 2, 3], (4, 4))
    op = asd.prepare_jacobian(g, x, pattern=diagonal, mode=mode, check=False)
    assert not op.check(x).ok
