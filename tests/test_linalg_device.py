"""Device residency of asd.linalg and SparseMultivariateNormal, checked without a GPU on ``meta``.

On ``meta`` tensors have shapes but no values, so a call that completes there with every host
transfer disabled (``no_host``) has no host round trip in its path.  The steps that need one
(direct factorizations, the symbolic phase of sparse @ sparse) announce it with
:class:`~asd.errors.HostFallbackWarning`; products and sums whose result *structure* depends on
index values are errors on meta.  The CUDA tests at the end run only where a GPU is present.
"""

import copy
import math
import warnings

import pytest
import torch

import asd.linalg as la
from asd.distributions import SparseMultivariateNormal
from asd.errors import ConvergenceWarning, HostFallbackWarning, InputError
from asd.linalg import _device, _sparse
from asd.linalg._testing import random_sparse

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]

M = "meta"
F64 = torch.float64


def _raise(name):
    def f(self, *args, **kwargs):
        raise AssertionError(f"host round trip: Tensor.{name} called")
    return f


@pytest.fixture
def no_host(monkeypatch):
    """Every way of reading a tensor's values back to Python raises."""
    for name in ("cpu", "numpy", "item", "tolist", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, _raise(name))
    to = torch.Tensor.to

    def to_checked(self, *args, **kwargs):
        targets = list(args) + [kwargs.get("device")]
        if any(str(t) == "cpu" or (isinstance(t, torch.device) and t.type == "cpu")
               for t in targets if t is not None):
            raise AssertionError("host round trip: Tensor.to('cpu') called")
        return to(self, *args, **kwargs)

    monkeypatch.setattr(torch.Tensor, "to", to_checked)


@pytest.fixture
def fresh_warnings(monkeypatch):
    """Forget which host fallbacks were already announced (they warn once per process)."""
    monkeypatch.setattr(_device, "_WARNED", set())


def meta_sparse(n, m, nnz, *, layout=torch.sparse_csr, batch=None, grad=True):
    """A sparse tensor on meta (structure without index values)."""
    shape = (n, m) if batch is None else (batch, n, m)
    if layout == torch.sparse_csr:
        lead = () if batch is None else (batch,)
        A = torch.sparse_csr_tensor(torch.empty(lead + (n + 1,), dtype=torch.int64, device=M),
                                    torch.empty(lead + (nnz,), dtype=torch.int64, device=M),
                                    torch.empty(lead + (nnz,), dtype=F64, device=M), shape)
    else:
        total = nnz * (batch or 1)
        A = torch.sparse_coo_tensor(torch.empty(len(shape), total, dtype=torch.int64, device=M),
                                    torch.empty(total, dtype=F64, device=M), shape,
                                    is_coalesced=True)
    return A.requires_grad_(grad)


def dense(*shape, grad=True):
    return torch.empty(shape, dtype=F64, device=M, requires_grad=grad)


def assert_meta(t, shape, layout=torch.strided):
    assert t.device.type == "meta"
    assert tuple(t.shape) == tuple(shape)
    assert t.layout == layout
    assert t.dtype == F64


def assert_sparse_grad(A, nnz):
    """A's gradient is on meta in A's layout with A's number of stored entries."""
    assert_meta(A.grad, A.shape, A.layout)
    vals = A.grad.values() if A.layout == torch.sparse_csr else A.grad._values()
    assert vals.numel() == nnz


# ---- products -------------------------------------------------------------------------------
@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_sparse_times_dense_on_meta(no_host, layout):
    A = meta_sparse(5, 4, 7, layout=layout)
    X = dense(4, 3)
    Y = la.matmul(A, X)
    assert_meta(Y, (5, 3))
    Y.sum().backward()
    assert_sparse_grad(A, 7)
    assert_meta(X.grad, (4, 3))
    assert_meta(la.matmul(A.detach(), dense(4, grad=False)), (5,))


def test_dense_times_sparse_on_meta(no_host):
    A = meta_sparse(5, 4, 7)
    X = dense(3, 5)
    Y = la.matmul(X, A)
    assert_meta(Y, (3, 4))
    Y.sum().backward()
    assert_sparse_grad(A, 7)
    assert_meta(X.grad, (3, 5))
    assert_meta(la.matmul(dense(5, grad=False), A.detach()), (4,))


@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_batched_product_on_meta(no_host, layout):
    A = meta_sparse(4, 3, 5, layout=layout, batch=2)
    X = dense(2, 3, 6)
    Y = la.matmul(A, X)
    assert_meta(Y, (2, 4, 6))
    Y.sum().backward()
    assert_sparse_grad(A, 10)
    assert_meta(X.grad, (2, 3, 6))


def test_sampled_matmul_on_meta(no_host):
    S = meta_sparse(5, 4, 7, grad=False)
    U, V = dense(5, 2), dense(2, 4)
    R = la.sampled_matmul(U, V, S)
    assert_meta(R, (5, 4), torch.sparse_csr)
    assert R.values().numel() == 7
    R.values().sum().backward()
    assert_meta(U.grad, (5, 2))
    assert_meta(V.grad, (2, 4))


def test_with_values_on_meta(no_host):
    """The sparse gradient reaching with_values' values is matched to the pattern (shape only)."""
    A = meta_sparse(5, 5, 8, grad=False)
    v = dense(8)
    B = la.with_values(A, v)
    la.matmul(B, dense(5, 2, grad=False)).sum().backward()
    assert_meta(v.grad, (8,))


@pytest.mark.parametrize("op", [lambda A, B: la.matmul(A, B), lambda A, B: la.add(A, B)],
                         ids=["matmul", "add"])
def test_structure_from_index_values_is_an_error_on_meta(op):
    A, B = meta_sparse(4, 4, 6), meta_sparse(4, 4, 5)
    with pytest.raises(InputError, match="on meta: the .* pattern's size depends on the index"):
        op(A, B)


def test_uncoalesced_coo_on_meta_is_an_error():
    A = torch.sparse_coo_tensor(torch.empty(2, 5, dtype=torch.int64, device=M),
                                torch.empty(5, dtype=F64, device=M), (4, 4))
    with pytest.raises(InputError, match="uncoalesced COO tensor on meta.*is_coalesced=True"):
        la.matmul(A, dense(4))


def test_meta_patterns_are_not_cached(no_host):
    """Meta index tensors all report address 0, so a cache keyed on addresses would match any
    two of one shape and nnz, and could not compare their contents to tell them apart."""
    la.clear_cache()
    A, B = meta_sparse(4, 4, 6), meta_sparse(4, 4, 6)
    assert la.matmul(A, dense(4)).shape == (4,)
    la.matmul(B, dense(4)).sum().backward()
    assert_sparse_grad(B, 6)
    assert not _sparse._CACHE


def test_no_host_fixture_catches_read_backs(no_host):
    """The fixture the tests above rely on does refuse every read-back (here on CPU tensors)."""
    t = torch.ones(3, dtype=F64)
    for read in (lambda: t.sum().item(), lambda: float(t.sum()), lambda: bool(t.all()),
                 lambda: t.tolist(), lambda: t.numpy(), lambda: t.to("meta").to("cpu"),
                 lambda: la.solve(torch.eye(3, dtype=F64).to_sparse_csr(), t, la.LU())):
        with pytest.raises(AssertionError, match="host round trip"):
            read()


# ---- triangular solves ----------------------------------------------------------------------
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("unit", [False, True])
def test_triangular_solve_on_meta(no_host, upper, transpose, unit):
    L = meta_sparse(6, 6, 10)
    b = dense(6, 2)
    x = la.triangular_solve(L, b, upper=upper, unit_diagonal=unit, transpose=transpose)
    assert_meta(x, (6, 2))
    x.sum().backward()
    assert_sparse_grad(L, 10)
    assert_meta(b.grad, (6, 2))


def test_batched_triangular_solve_on_meta(no_host):
    L = meta_sparse(4, 4, 6, layout=torch.sparse_coo, batch=3)
    x = la.triangular_solve(L, dense(3, 4))
    assert_meta(x, (3, 4))
    x.sum().backward()
    assert_sparse_grad(L, 18)


# ---- general solves -------------------------------------------------------------------------
SOLVERS = [la.CG(), la.BiCGStab(), la.MINRES(), la.GMRES(restart=4), la.LSMR(maxiter=50)]
METHODS = ["cg", "bicgstab", "minres", "gmres", "lsmr"]


@pytest.mark.parametrize("solver", SOLVERS, ids=lambda s: s.name)
def test_krylov_solve_on_meta(no_host, solver):
    A = meta_sparse(6, 6, 14)
    b = dense(6, 2)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)     # meta knows nothing to warn about
        x, info = la.solve(A, b, solver, return_info=True)
        assert_meta(x, (6, 2))
        x.sum().backward()
    assert_sparse_grad(A, 14)
    assert_meta(b.grad, (6, 2))
    assert not info.converged and math.isnan(info.residual)
    assert info.iterations == min(solver.check_every, solver.maxiter or 60)


@pytest.mark.parametrize("method", METHODS)
def test_krylov_method_strings_on_meta(no_host, method):
    A = meta_sparse(5, 5, 9, layout=torch.sparse_coo)
    b = dense(5)
    x = la.solve(A, b, method, maxiter=1000)
    assert_meta(x, (5,))
    x.sum().backward()
    assert_sparse_grad(A, 9)


def test_meta_krylov_runs_one_block():
    """The documented meta rule: one block of check_every iterations, however large maxiter."""
    A = meta_sparse(50, 50, 100)
    _, info = la.solve(A, dense(50, grad=False), la.CG(maxiter=10**7, check_every=7),
                       return_info=True)
    assert info.iterations == 7


def test_lsmr_rectangular_on_meta(no_host):
    A = meta_sparse(7, 4, 12)
    b = dense(7)
    x = la.solve(A, b, la.LSMR())
    assert_meta(x, (4,))
    x.sum().backward()
    assert_sparse_grad(A, 12)


@pytest.mark.parametrize("solver", [la.LU(), la.Cholesky(), la.CupyLU(), "direct", "lu",
                                    "cholesky"], ids=str)
def test_direct_solve_on_meta_is_shape_only(no_host, fresh_warnings, solver):
    A = meta_sparse(6, 6, 14)
    b = dense(6, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostFallbackWarning)    # meta copies nothing to the host
        x, info = la.solve(A, b, solver, return_info=True)
        assert_meta(x, (6, 3))
        x.sum().backward()
    assert_sparse_grad(A, 14)
    assert_meta(b.grad, (6, 3))
    assert not info.converged


def test_prepared_state_on_meta(no_host):
    A = meta_sparse(5, 5, 9)
    state = la.CG().init(A)
    x, info = la.CG().compute(state, dense(5, grad=False))
    assert_meta(x, (5,))
    xt, _ = la.CG().compute(la.CG().transpose(state), dense(5, grad=False))
    assert_meta(xt, (5,))


# ---- host fallbacks -------------------------------------------------------------------------
def test_host_fallback_warns_once_per_kind(fresh_warnings):
    with pytest.warns(HostFallbackWarning, match="step A has no kernel on cuda"):
        _device.warn_host_fallback("step A", torch.device("cuda"), "detail")
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostFallbackWarning)
        _device.warn_host_fallback("step A", torch.device("cuda"), "detail")
    with pytest.warns(HostFallbackWarning, match="step B"):
        _device.warn_host_fallback("step B", torch.device("xpu"), "detail")


@pytest.mark.parametrize("solver", [la.LU(), la.Cholesky()], ids=lambda s: s.name)
def test_direct_factorization_off_cpu_warns(fresh_warnings, solver):
    """A CPU pattern labelled with another device takes the off-CPU branch without a GPU."""
    _, D = random_sparse(5, 5, seed=4, diag=6.0)
    D = D + D.t()
    P, vals = _sparse.values_of(D.to_sparse_csr())
    P = copy.copy(P)                          # the cached pattern itself stays on the CPU
    P.device = torch.device("cuda")
    with pytest.warns(HostFallbackWarning, match=r"direct sparse solve \(SuperLU\) has no kernel "
                                                 r"on cuda"):
        state = solver._prepare(P, vals)
    b = torch.randn(5, 1, dtype=F64)
    x, _ = solver._run(state, b, None)
    torch.testing.assert_close(x, torch.linalg.solve(D, b))


def test_cupy_lu_takes_cuda_tensors_only():
    A = torch.eye(3, dtype=F64).to_sparse_csr()
    with pytest.raises(InputError, match="CupyLU solves CUDA tensors, A is on cpu; use "
                                         r"asd.linalg.LU\(\)"):
        la.solve(A, torch.ones(3, dtype=F64), la.CupyLU())


# ---- SparseMultivariateNormal -----------------------------------------------------------------
@pytest.mark.parametrize("precision", [False, True])
@pytest.mark.parametrize("ldl", [False, True])
def test_sparse_mvn_on_meta(no_host, precision, ldl):
    """COO factor: rsample, log_prob and entropy all feed L's gradient.  torch cannot add two
    sparse CSR tensors on meta, and its meta sum of two COO tensors stores no entries, so only
    the accumulated gradient's layout and shape are checked; a CSR factor on one gradient path
    is tested below."""
    n = 6
    L = meta_sparse(n, n, 11, layout=torch.sparse_coo)
    loc = dense(3, n)
    D = dense(n) if ldl else None
    kw = {"precision_tril" if precision else "scale_tril": L}
    dist = SparseMultivariateNormal(loc, diagonal=D, **kw)
    x = dist.rsample((4,))
    assert_meta(x, (4, 3, n))
    lp = dist.log_prob(x)
    assert_meta(lp, (4, 3))
    assert_meta(dist.sample((2,)), (2, 3, n))
    assert_meta(dist.entropy(), (3,))
    (lp.sum() + dist.entropy().sum()).backward()
    assert_meta(L.grad, (n, n), torch.sparse_coo)
    assert_meta(loc.grad, (3, n))
    if ldl:
        assert_meta(D.grad, (n,))


@pytest.mark.parametrize("precision", [False, True])
def test_sparse_mvn_csr_log_prob_on_meta(no_host, precision):
    """log_prob reads the factor's values once, so its gradient is one CSR tensor (no sum)."""
    L = meta_sparse(6, 6, 11)
    kw = {"precision_tril" if precision else "scale_tril": L}
    dist = SparseMultivariateNormal(dense(6), **kw)
    lp = dist.log_prob(dense(5, 6, grad=False))
    assert_meta(lp, (5,))
    lp.sum().backward()
    assert_sparse_grad(L, 11)


def test_sparse_mvn_log_det_unchanged_on_cpu():
    """The boolean-index-free log-determinant equals the plain one (and its gradient)."""
    S, Dn = random_sparse(5, 5, seed=8, tri="lower", diag=2.0)
    dist = SparseMultivariateNormal(torch.zeros(5, dtype=F64), scale_tril=S)
    h = dist.entropy()
    Dd = Dn.clone().requires_grad_()
    ref = torch.distributions.MultivariateNormal(torch.zeros(5, dtype=F64), scale_tril=Dd).entropy()
    torch.testing.assert_close(h, ref)
    h.backward()
    ref.backward()
    torch.testing.assert_close(S.grad.to_dense(), Dd.grad * (Dn != 0))


def test_sparse_mvn_log_prob_checks_dtype():
    """log_prob reads the factor's values itself; a wider value is still an error, not a
    kernel mixing dtypes."""
    L, _ = random_sparse(4, 4, seed=12, tri="lower", diag=2.0, dtype=torch.float32)
    dist = SparseMultivariateNormal(torch.zeros(4), scale_tril=L.detach().float())
    with pytest.raises(InputError, match="dtype mismatch"):
        dist.log_prob(torch.zeros(4, dtype=F64))


# ---- CUDA (cuSPARSE triangular solves, host-fallback direct solves) ---------------------------
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("upper", [False, True])
@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("unit", [False, True])
@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_cuda_triangular_solve_matches_cpu(upper, transpose, unit, layout):
    L, _ = random_sparse(7, 7, seed=5, tri="upper" if upper else "lower", diag=3.0, layout=layout)
    b = torch.randn(7, 2, dtype=F64, requires_grad=True)
    Lc = L.detach().to("cuda").requires_grad_()
    bc = b.detach().to("cuda").requires_grad_()
    x = la.triangular_solve(L, b, upper=upper, unit_diagonal=unit, transpose=transpose)
    with warnings.catch_warnings():
        warnings.simplefilter("error", HostFallbackWarning)      # cuSPARSE: no host step
        xc = la.triangular_solve(Lc, bc, upper=upper, unit_diagonal=unit, transpose=transpose)
    torch.testing.assert_close(xc.cpu(), x.detach())
    x.pow(2).sum().backward()
    xc.pow(2).sum().backward()
    torch.testing.assert_close(Lc.grad.cpu().to_dense(), L.grad.to_dense())
    torch.testing.assert_close(bc.grad.cpu(), b.grad)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("solver", [la.LU(), la.Cholesky(), la.CG(rtol=1e-12),
                                    la.GMRES(rtol=1e-12)], ids=lambda s: s.name)
def test_cuda_solve_matches_cpu(fresh_warnings, solver):
    _, D = random_sparse(8, 8, seed=6, density=0.3)
    D = D + D.t() + 10 * torch.eye(8, dtype=F64)
    A = D.to_sparse_csr().requires_grad_()
    Ac = D.to_sparse_csr().to("cuda").requires_grad_()
    b = torch.randn(8, dtype=F64)
    x = la.solve(A, b, solver)
    host = isinstance(solver, (la.LU, la.Cholesky))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        xc = la.solve(Ac, b.to("cuda"), solver)
    assert any(issubclass(w.category, HostFallbackWarning) for w in seen) == host
    assert xc.device.type == "cuda"
    torch.testing.assert_close(xc.cpu(), x.detach())
    x.sum().backward()
    xc.sum().backward()
    torch.testing.assert_close(Ac.grad.cpu().to_dense(), A.grad.to_dense())


@pytest.mark.gpu
@needs_cuda
def test_cuda_products_and_sums_match_cpu(fresh_warnings):
    A, DA = random_sparse(6, 5, seed=7)
    B, DB = random_sparse(5, 4, seed=8)
    C, DC = random_sparse(6, 5, seed=9)
    Ac, Bc, Cc = (T.detach().to("cuda") for T in (A, B, C))
    with pytest.warns(HostFallbackWarning, match="symbolic phase of sparse @ sparse"):
        P = la.matmul(Ac, Bc)
    torch.testing.assert_close(P.cpu().to_dense(), DA @ DB)
    torch.testing.assert_close(la.add(Ac, Cc, 2.0, 3.0).cpu().to_dense(), 2 * DA + 3 * DC)
    X = torch.randn(5, 3, dtype=F64, device="cuda")
    torch.testing.assert_close(la.matmul(Ac, X).cpu(), DA @ X.cpu())


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", [False, True])
def test_cuda_sparse_mvn_matches_cpu(precision):
    _, D = random_sparse(6, 6, seed=10, tri="lower")
    D.diagonal().copy_(1.0 + torch.rand(6, dtype=F64, generator=torch.Generator().manual_seed(10)))  # a valid factor
    L = D.to_sparse_csr()
    kw = "precision_tril" if precision else "scale_tril"
    d = SparseMultivariateNormal(torch.zeros(6, dtype=F64), **{kw: L.detach()})
    dc = SparseMultivariateNormal(torch.zeros(6, dtype=F64, device="cuda"),
                                  **{kw: L.detach().to("cuda")})
    x = torch.randn(4, 6, dtype=F64)
    torch.testing.assert_close(dc.log_prob(x.to("cuda")).cpu(), d.log_prob(x))
    assert dc.rsample((3,)).device.type == "cuda"


@pytest.mark.gpu
@needs_cuda
def test_cuda_cupy_lu_matches_cpu(fresh_warnings):
    pytest.importorskip("cupy", reason="CupyLU needs CuPy (pip install asd[cuda])")
    _, D = random_sparse(8, 8, seed=11, density=0.3, diag=5.0)
    A = D.to_sparse_csr().requires_grad_()
    Ac = D.to_sparse_csr().to("cuda").requires_grad_()
    b = torch.randn(8, 2, dtype=F64)
    x = la.solve(A, b, la.LU())
    with pytest.warns(HostFallbackWarning, match="factorization of CupyLU"):
        xc = la.solve(Ac, b.to("cuda"), la.CupyLU())
    assert xc.device.type == "cuda"
    torch.testing.assert_close(xc.cpu(), x.detach())
    x.sum().backward()
    xc.sum().backward()
    torch.testing.assert_close(Ac.grad.cpu().to_dense(), A.grad.to_dense())

