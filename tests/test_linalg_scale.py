"""10^6 unknowns: backward of SpMV and CG in memory proportional to the stored entries."""

import json
import subprocess
import sys
import textwrap

import pytest

CODE = textwrap.dedent("""
    import json, resource, warnings
    import scipy.sparse as sp, torch
    import asd.linalg as al
    warnings.filterwarnings("ignore")
    def p2(k):
        T = sp.diags_array([-1.0, 2.0, -1.0], offsets=[-1, 0, 1], shape=(k, k))
        I = sp.eye_array(k)
        M = (sp.kron(T, I) + sp.kron(I, T)).tocsr(); M.sort_indices(); return M
    def tt(M):
        return torch.sparse_csr_tensor(torch.from_numpy(M.indptr.astype("int64")),
            torch.from_numpy(M.indices.astype("int64")), torch.from_numpy(M.data), M.shape)
    Aw = tt(p2(4)).requires_grad_(); xw = torch.ones(16, dtype=torch.float64)
    al.matmul(Aw, xw).sum().backward(); al.solve(Aw, xw, "cg", maxiter=2, warn=False).sum().backward()
    M = p2({k}); A = tt(M).requires_grad_()
    x = torch.randn(M.shape[0], dtype=torch.float64)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if "{kind}" == "spmv":
        y = al.matmul(A, x)
    else:
        y = al.solve(A, x, "cg", maxiter=10, warn=False)
    y.pow(2).sum().backward()
    after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(dict(nnz=M.nnz, grow=(after - before) * 1024, layout=str(A.grad.layout),
                          gnnz=A.grad.values().numel())))
""")


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["spmv", "cg"])
def test_million_unknowns_memory(kind):
    out = subprocess.run([sys.executable, "-c", CODE.format(k=1000, kind=kind)], capture_output=True,
                         text=True, timeout=600, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["layout"] == "torch.sparse_csr" and r["gnnz"] == r["nnz"]
    # the gradient itself is 8 bytes per stored entry; a dense one would be 8 TB
    assert r["grow"] < 80 * r["nnz"], r
