"""asd.distributions.SparseMultivariateNormal against torch's dense MultivariateNormal."""

import pytest
import torch
from torch.distributions import MultivariateNormal

from asd.distributions import SparseMultivariateNormal
from asd.errors import InputError
from asd.linalg._testing import check_sparse_grad

pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]

N = 7


def _factors(seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    strict = torch.tril(torch.randn(N, N, generator=g, dtype=torch.float64)
                        * (torch.rand(N, N, generator=g) < 0.4), -1).to(dtype)
    d = (torch.rand(N, generator=g, dtype=torch.float64) + 0.5).to(dtype)
    return strict, d


def _dense_reference(kind, Ld, D, loc):
    eye = torch.eye(N, dtype=Ld.dtype)
    if kind == "cov_ll":
        return MultivariateNormal(loc, scale_tril=Ld)
    if kind == "prec_ll":
        return MultivariateNormal(loc, precision_matrix=Ld @ Ld.t())
    Lu = Ld + eye
    M = Lu @ torch.diag(D) @ Lu.t()
    return MultivariateNormal(loc, covariance_matrix=M) if kind == "cov_ldl" else \
        MultivariateNormal(loc, precision_matrix=M)


KINDS = ["cov_ll", "prec_ll", "cov_ldl", "prec_ldl"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layout", [torch.sparse_csr, torch.sparse_coo])
def test_log_prob_and_gradients(kind, layout):
    strict, d = _factors()
    ldl = kind.endswith("ldl")
    Ldense = strict if ldl else strict + torch.diag(d)
    L = (Ldense.to_sparse_csr() if layout == torch.sparse_csr else Ldense.to_sparse())
    L = L.detach().requires_grad_()
    D = d.clone().requires_grad_() if ldl else None
    loc = torch.randn(3, N, dtype=torch.float64, requires_grad=True)
    x = torch.randn(5, 3, N, dtype=torch.float64)
    key = "scale_tril" if kind.startswith("cov") else "precision_tril"
    dist = SparseMultivariateNormal(loc, **{key: L}, diagonal=D)
    lp = dist.log_prob(x)
    Ld = Ldense.clone().requires_grad_()
    Dd = d.clone().requires_grad_()
    locd = loc.detach().clone().requires_grad_()
    ref = _dense_reference(kind, Ld, Dd, locd)
    lpd = ref.log_prob(x)
    torch.testing.assert_close(lp, lpd)
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    lp.sum().backward()
    lpd.sum().backward()
    check_sparse_grad(L, Ld.grad)
    torch.testing.assert_close(loc.grad, locd.grad)
    if ldl:
        torch.testing.assert_close(D.grad, Dd.grad)


@pytest.mark.parametrize("kind", KINDS)
def test_rsample_moments_and_gradient_pattern(kind):
    strict, d = _factors(1)
    ldl = kind.endswith("ldl")
    Ldense = strict if ldl else strict + torch.diag(d)
    L = Ldense.to_sparse_csr().detach().requires_grad_()
    key = "scale_tril" if kind.startswith("cov") else "precision_tril"
    loc = torch.zeros(N, dtype=torch.float64)
    dist = SparseMultivariateNormal(loc, **{key: L}, diagonal=d if ldl else None)
    torch.manual_seed(0)
    s = dist.rsample((40000,))
    assert s.shape == (40000, N)
    cov = torch.cov(s.t())
    ref = _dense_reference(kind, Ldense, d, loc).covariance_matrix
    assert (cov - ref).abs().max() < 0.06 * ref.abs().max()
    s[:100].pow(2).sum().backward()
    assert L.grad.layout == torch.sparse_csr
    assert torch.equal(L.grad.col_indices(), L.col_indices())


def test_rsample_gradient_matches_dense():
    strict, d = _factors(2)
    Ldense = strict + torch.diag(d)
    L = Ldense.to_sparse_csr().detach().requires_grad_()
    dist = SparseMultivariateNormal(torch.zeros(N, dtype=torch.float64), precision_tril=L)
    torch.manual_seed(5)
    s = dist.rsample((4,))
    torch.manual_seed(5)
    eps = torch.randn(4, N, dtype=torch.float64)
    Ld = Ldense.clone().requires_grad_()
    sd = torch.linalg.solve_triangular(Ld.t(), eps.t(), upper=True).t()
    torch.testing.assert_close(s, sd)
    W = torch.randn(4, N, dtype=torch.float64)
    (s * W).sum().backward()
    (sd * W).sum().backward()
    check_sparse_grad(L, Ld.grad)


def test_float32():
    strict, d = _factors(3, torch.float32)
    L = (strict + torch.diag(d)).to_sparse_csr()
    dist = SparseMultivariateNormal(torch.zeros(N), scale_tril=L)
    ref = MultivariateNormal(torch.zeros(N), scale_tril=strict + torch.diag(d))
    x = torch.randn(6, N)
    torch.testing.assert_close(dist.log_prob(x), ref.log_prob(x), rtol=1e-4, atol=1e-4)


def test_bad_arguments():
    strict, d = _factors()
    L = (strict + torch.diag(d)).to_sparse_csr()
    loc = torch.zeros(N, dtype=torch.float64)
    with pytest.raises(InputError, match="exactly one"):
        SparseMultivariateNormal(loc)
    with pytest.raises(InputError, match="exactly one"):
        SparseMultivariateNormal(loc, scale_tril=L, precision_tril=L)
    with pytest.raises(InputError, match="diagonal entry"):
        SparseMultivariateNormal(loc, scale_tril=strict.to_sparse_csr())
    with pytest.raises(InputError, match="above the diagonal"):
        SparseMultivariateNormal(loc, scale_tril=(strict + strict.t() + torch.eye(N, dtype=torch.float64)).to_sparse_csr())
    with pytest.raises(InputError, match="event size"):
        SparseMultivariateNormal(torch.zeros(N + 1, dtype=torch.float64), scale_tril=L)
    with pytest.raises(InputError, match="diagonal D must be positive"):
        SparseMultivariateNormal(loc, scale_tril=strict.to_sparse_csr(), diagonal=-d, validate_args=True)
    with pytest.raises(InputError, match="sparse COO or CSR"):
        SparseMultivariateNormal(loc, scale_tril=strict + torch.eye(N, dtype=torch.float64))


@pytest.mark.parametrize("form", ["scale_tril", "precision_tril"])
def test_ldl_forms_ignore_a_stored_unit_diagonal(form):
    """The LDL^T forms ignore stored diagonal entries of L (documented); rsample of the scale form
    and log_prob of the precision form multiplied with them (found by an adversarial review)."""
    n = 4
    Ls = torch.tensor([[0, 0, 0, 0], [0.5, 0, 0, 0], [-1.0, 2.0, 0, 0], [0, 0.3, -0.7, 0]], dtype=torch.float64)
    D = torch.tensor([1.0, 2.0, 0.5, 1.5], dtype=torch.float64)
    loc = torch.tensor([0.1, -0.2, 0.3, 0.0], dtype=torch.float64)
    U = Ls + torch.eye(n, dtype=torch.float64)
    M = U @ torch.diag(D) @ U.T
    ref = MultivariateNormal(loc, **({"covariance_matrix": M} if form == "scale_tril" else {"precision_matrix": M}))
    x = torch.randn(5, n, dtype=torch.float64)
    results = []
    for stored in (Ls, U, Ls + 3 * torch.eye(n, dtype=torch.float64)):  # none, ones, anything on the diagonal
        L = stored.to_sparse_csr().requires_grad_()
        d = SparseMultivariateNormal(loc, diagonal=D, **{form: L})
        torch.testing.assert_close(d.log_prob(x), ref.log_prob(x))
        torch.manual_seed(7)
        s = d.rsample((3,))
        results.append(s)
        (s.sum() + d.log_prob(x).sum()).backward()
        g = L.grad.to_dense()
        assert bool((g.diagonal() == 0).all())  # an ignored entry has no gradient
    torch.testing.assert_close(results[1], results[0])
    torch.testing.assert_close(results[2], results[0])
    if form == "scale_tril":  # the sample map x = loc + U D^(1/2) eps
        torch.manual_seed(7)
        eps = torch.randn(3, n, dtype=torch.float64)
        torch.testing.assert_close(results[0], loc + (U @ (D.sqrt() * eps).T).T)
