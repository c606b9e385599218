"""Preallocated results for solver loops: ``op.values(x, out=buffer)`` and ``op(x, out=csr)`` write
into the caller's buffer (and return it), equal the fresh results and dense AD, and leave the
buffer as it was when the call raises."""

import numpy as np
import pytest
import torch

import asd
from asd.errors import CheckError, InputError
from asd.problems import brusselator, brusselator_input, rosenbrock

X = torch.linspace(0.3, 1.7, 12, dtype=torch.float64)


def _chain(x):
    return torch.cat([x[1:] * torch.sin(x[:-1]), x[:3] ** 2])


def _operators():
    yield "jacobian-reverse", asd.prepare_jacobian(_chain, X, mode="reverse"), lambda z: torch.func.jacrev(_chain)(z)
    yield "jacobian-forward", asd.prepare_jacobian(_chain, X, mode="forward"), lambda z: torch.func.jacfwd(_chain)(z)
    for coloring in ("star", "acyclic"):
        yield (f"hessian-{coloring}", asd.prepare_hessian(rosenbrock, X, coloring=coloring),
               lambda z: torch.func.hessian(rosenbrock)(z))


@pytest.mark.parametrize("name,op,dense", list(_operators()), ids=[o[0] for o in _operators()])
def test_values_into_a_buffer_across_a_solver_loop(name, op, dense):
    buf = torch.full((op.pattern.nnz,), float("nan"), dtype=torch.float64)
    ptr = buf.data_ptr()
    z = X.clone()
    for step in range(60):  # past the warm-up calls and the recorded graph's first replays
        z = z * 0.99 + 0.01 * torch.cos(z * step)
        got = op.values(z, out=buf)
        assert got is buf and buf.data_ptr() == ptr
        if step % 20 == 0 or step == 59:
            torch.testing.assert_close(buf, op.values(z), rtol=0, atol=0)
            ref = dense(z)
            torch.testing.assert_close(op.decompressor.csr(buf.clone()).to_dense(), ref.reshape(op.pattern.shape))


def test_csr_result_reused():
    f, x = brusselator(6), brusselator_input(6)
    op = asd.prepare_jacobian(f, x)
    J = op(x)
    vals = J.values()
    for k in range(3):
        z = x + 0.1 * (k + 1)
        got = op(z, out=J)
        assert got is J and J.values().data_ptr() == vals.data_ptr()
        torch.testing.assert_close(J.to_dense(), torch.func.jacrev(f)(z).reshape(J.shape))


def test_csr_with_equal_structure_from_elsewhere_is_accepted():
    op = asd.prepare_jacobian(_chain, X)
    J = op(X)
    copy = torch.sparse_csr_tensor(J.crow_indices().clone(), J.col_indices().clone(), torch.zeros_like(J.values()),
                                   J.shape)
    op(X + 1, out=copy)
    torch.testing.assert_close(copy.to_dense(), torch.func.jacrev(_chain)(X + 1))


def test_extra_arguments_with_out():
    def f(x, t, scale=1.0):
        return scale * torch.sin(t * x[1:]) * x[:-1]

    op = asd.prepare_jacobian(f, X, args=(2.0,))
    buf = torch.empty(op.pattern.nnz, dtype=torch.float64)
    op.values(X, 3.0, out=buf, scale=0.5)
    ref = torch.func.jacrev(lambda z: f(z, 3.0, scale=0.5))(X)
    torch.testing.assert_close(op.decompressor.csr(buf).to_dense(), ref)


@pytest.mark.parametrize("bad,match", [
    (lambda n: torch.empty(n + 1, dtype=torch.float64), "shape"),
    (lambda n: torch.empty(n, dtype=torch.float32), "dtype"),
    (lambda n: torch.empty(n, 1, dtype=torch.float64), "shape"),
    (lambda n: np.empty(n), "torch.Tensor"),
    (lambda n: torch.empty(n, dtype=torch.float64, requires_grad=True), "requires grad"),
])
def test_bad_value_buffers_are_refused_by_name(bad, match):
    op = asd.prepare_jacobian(_chain, X)
    with pytest.raises(InputError, match=match) as info:
        op.values(X, out=bad(op.pattern.nnz))
    assert "out" in str(info.value)


def test_bad_csr_buffers_are_refused_by_name():
    op = asd.prepare_jacobian(_chain, X)
    other = asd.prepare_jacobian(lambda x: torch.cat([x[1:] * x[:-1], x[:3]]), X, pattern=np.ones((14, 12), bool))
    for bad, match in [(torch.zeros(14, 12, dtype=torch.float64), "sparse_csr"),
                       (op(X).to(torch.float32), "dtype"),
                       (other(X), "structure")]:
        with pytest.raises(InputError, match=match):
            op(X, out=bad)


def test_a_failed_call_leaves_the_buffer_as_it_was():
    f = lambda x: x[1:] * x[:-1]  # noqa: E731
    op = asd.prepare_jacobian(f, X, pattern=np.eye(11, 12, dtype=bool), check=True)  # entries missing
    buf = torch.full((op.pattern.nnz,), 7.0, dtype=torch.float64)
    with pytest.raises(CheckError):
        op.values(X, out=buf)
    assert bool((buf == 7.0).all())

    good = asd.prepare_jacobian(f, X)
    buf = torch.full((good.pattern.nnz,), 7.0, dtype=torch.float64)
    xg = X.clone().requires_grad_(True)
    with pytest.raises(InputError, match="gradients"):
        good.values(xg, out=buf)
    assert bool((buf == 7.0).all())
    with torch.no_grad():
        good.values(xg, out=buf)
    torch.testing.assert_close(good.decompressor.csr(buf).to_dense(), torch.func.jacrev(f)(X))
