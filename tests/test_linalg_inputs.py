"""Sparse inputs are validated at the boundary, and the structure cache is checked by content."""

import pytest
import torch

import asd.linalg as al
from asd.errors import InputError
from asd.linalg import _sparse

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]
F64 = torch.float64


def _perm_csr(perm, vals, dtype=torch.int64):
    n = len(perm)
    return torch.sparse_csr_tensor(torch.arange(n + 1, dtype=dtype), torch.tensor(perm, dtype=dtype), vals, (n, n))


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_csr_indices_rewritten_through_numpy_are_seen(index_dtype):
    vals = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=F64)
    A = _perm_csr([0, 1, 2, 3], vals, index_dtype)
    B = _perm_csr([0, 1, 2, 3], vals.flip(0), index_dtype)
    x = torch.tensor([1.0, 10.0, 100.0, 1000.0], dtype=F64)
    torch.testing.assert_close(al.matmul(A, x), vals * x)
    torch.testing.assert_close(al.add(A, B).to_dense(), A.to_dense() + B.to_dense())
    A.col_indices().numpy()[:] = [3, 2, 1, 0]              # does not bump torch's _version
    torch.testing.assert_close(al.matmul(A, x), A.to_dense() @ x)
    torch.testing.assert_close(al.solve(A, x), torch.linalg.solve(A.to_dense(), x))
    torch.testing.assert_close(al.add(A, B).to_dense(), A.to_dense() + B.to_dense())
    A.crow_indices().numpy()[:] = [0, 0, 2, 3, 4]          # row 0 empty, row 1 holds two entries
    A.col_indices().numpy()[:] = [0, 3, 1, 2]
    torch.testing.assert_close(al.matmul(A, x), A.to_dense() @ x)
    torch.testing.assert_close(al.add(A, B).to_dense(), A.to_dense() + B.to_dense())


def test_coo_indices_rewritten_through_numpy_are_seen():
    A = torch.sparse_coo_tensor(torch.tensor([[0, 1, 2], [0, 1, 2]]), torch.tensor([1.0, 2.0, 3.0], dtype=F64),
                                (3, 3)).coalesce()
    x = torch.tensor([1.0, 10.0, 100.0], dtype=F64)
    torch.testing.assert_close(al.matmul(A, x), torch.tensor([1.0, 20.0, 300.0], dtype=F64))
    A._indices().numpy()[:] = [[0, 0, 1], [1, 2, 2]]      # still sorted: a valid coalesced tensor
    torch.testing.assert_close(al.matmul(A, x), A.to_dense() @ x)
    A._indices().numpy()[:] = [[0, 1, 2], [0, 0, 0]]
    torch.testing.assert_close(al.matmul(A, x), A.to_dense() @ x)


def test_clear_cache():
    A = _perm_csr([1, 0], torch.ones(2, dtype=F64))
    al.matmul(A, torch.ones(2, dtype=F64))
    assert len(_sparse._CACHE) > 0
    al.clear_cache()
    assert len(_sparse._CACHE) == 0


def _dup_csr():
    # row 0 stores column 1 twice (torch's constructor does not check)
    return torch.sparse_csr_tensor(torch.tensor([0, 2, 3]), torch.tensor([1, 1, 0]),
                                   torch.tensor([1.0, 2.0, 3.0], dtype=F64), (2, 2))


def test_csr_repeated_column_is_rejected():
    A = _dup_csr()
    B = torch.eye(2, dtype=F64).to_sparse_csr()
    with pytest.raises(InputError, match=r"A has a repeated column index in one row \(row 0, column 1"):
        al.add(A, B)
    with pytest.raises(InputError, match="B has a repeated column"):
        al.add(B, A)
    with pytest.raises(InputError, match="repeated column"):
        al.matmul(A, torch.ones(2, dtype=F64))
    L = torch.sparse_csr_tensor(torch.tensor([0, 1, 3]), torch.tensor([0, 1, 1]),
                                torch.tensor([1.0, 5.0, 2.0], dtype=F64), (2, 2))
    with pytest.raises(InputError, match=r"L has a repeated column index in one row \(row 1, column 1"):
        al.triangular_solve(L, torch.ones(2, dtype=F64))


def test_batched_csr_repeated_column_names_the_item():
    crow = torch.tensor([[0, 1, 2], [0, 2, 2]])
    col = torch.tensor([[0, 1], [1, 1]])
    A = torch.sparse_csr_tensor(crow, col, torch.ones(2, 2, dtype=F64), (2, 2, 2))
    with pytest.raises(InputError, match="row 0, column 1 of batch item 1"):
        al.matmul(A, torch.ones(2, 2, dtype=F64))


def test_coo_flagged_coalesced_with_unsorted_indices_is_rejected():
    idx = torch.tensor([[1, 0], [0, 1]])                    # (1,0) before (0,1): not row-major
    A = torch.sparse_coo_tensor(idx, torch.tensor([2.0, 3.0], dtype=F64), (2, 2), is_coalesced=True)
    with pytest.raises(InputError, match="flagged coalesced but its indices are not sorted"):
        al.matmul(A, torch.tensor([1.0, 10.0], dtype=F64))
    dup = torch.sparse_coo_tensor(torch.tensor([[0, 0], [1, 1]]), torch.tensor([2.0, 3.0], dtype=F64), (2, 2),
                                  is_coalesced=True)
    with pytest.raises(InputError, match="flagged coalesced"):
        al.matmul(dup, torch.ones(2, dtype=F64))
    # not flagged: coalesced (duplicates summed) as torch does
    ok = torch.sparse_coo_tensor(torch.tensor([[0, 0], [1, 1]]), torch.tensor([2.0, 3.0], dtype=F64), (2, 2))
    torch.testing.assert_close(al.matmul(ok, torch.tensor([1.0, 10.0], dtype=F64)),
                               torch.tensor([50.0, 0.0], dtype=F64))


def test_out_of_range_indices_are_rejected():
    A = torch.sparse_csr_tensor(torch.tensor([0, 1, 2]), torch.tensor([0, 5]), torch.ones(2, dtype=F64), (2, 2))
    with pytest.raises(InputError, match=r"col_indices must lie in \[0, 2\)"):
        al.matmul(A, torch.ones(2, dtype=F64))
    B = torch.sparse_csr_tensor(torch.tensor([0, 2, 1]), torch.tensor([0, 1]), torch.ones(2, dtype=F64), (2, 2))
    with pytest.raises(InputError, match="crow_indices must"):
        al.matmul(B, torch.ones(2, dtype=F64))
