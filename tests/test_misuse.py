"""A clear error for every misuse: each raises an asd error or a TypeError/ValueError whose message
names the argument (and the fix), before any work is done."""

import pickle

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import asd
from asd.errors import AsdError

X = torch.rand(6, dtype=torch.float64)


def f(x):
    return x[1:] * x[:-1]


def g(x):
    return (x[1:] * x[:-1]).sum()


def raises(match, exc=(AsdError, TypeError, ValueError)):
    return pytest.raises(exc, match=match)


@pytest.mark.parametrize("pattern, match", [
    (np.ones(6, dtype=bool), "pattern must be a 2-D matrix"),
    (torch.ones(6), "2-D matrix, got a 1-D torch tensor"),
    ("diag", "got a str"),
    (np.ones((5, 7), dtype=bool), "columns"),
    (np.ones((4, 6), dtype=bool), "rows"),
    ([["a"]], "pattern"),
])
def test_bad_pattern(pattern, match):
    with raises(match):
        asd.prepare_jacobian(f, X, pattern=pattern)


def test_out_of_range_pattern_indices():
    with raises("column indices"):
        asd.SparsityPattern.from_csr([0, 1, 2], [0, 9], (2, 3))
    with raises("column indices"):
        asd.SparsityPattern.from_csr([0, 1, 2], [0, -1], (2, 3))
    with raises("indptr"):
        asd.SparsityPattern.from_csr([0, 2, 1], [0, 1], (2, 3))


@pytest.mark.parametrize("value", [1.5, "2", 0, -1, True])
def test_bad_batch_size(value):
    with raises("batch_size"):
        asd.prepare_jacobian(f, X, batch_size=value)


@pytest.mark.parametrize("name", ["compile", "local", "strict"])
@pytest.mark.parametrize("value", ["no", 0, None])
def test_non_bool_flags(name, value):
    with raises(name, TypeError):
        asd.prepare_jacobian(f, X, **{name: value})
    with raises(name, TypeError):
        asd.prepare_hessian(g, X, **{name: value})


def test_non_bool_cache():
    with raises("cache", TypeError):
        asd.sparse_jacobian(f, X, cache="no")


@pytest.mark.parametrize("kw, match", [
    (dict(mode="fwd"), "mode"), (dict(coloring="star"), "coloring"), (dict(order="rnd"), "order"),
    (dict(check="always"), "check"),
])
def test_bad_choices(kw, match):
    with raises(match):
        asd.prepare_jacobian(f, X, **kw)


def test_bad_hessian_choices():
    with raises("hvp"):
        asd.prepare_hessian(g, X, hvp="forward")
    with raises("coloring"):
        asd.prepare_hessian(g, X, coloring="column")


@pytest.mark.parametrize("seed", [-1, 1.5, "0"])
def test_bad_seed(seed):
    with raises("seed"):
        asd.color(sp.eye(4, format="csr"), "column", "random", seed=seed)


def test_not_callable():
    with raises("f must be a callable", TypeError):
        asd.prepare_jacobian(np.zeros(3), X)


def test_to_scipy_of_numpy_and_batched():
    with raises("numpy array", TypeError):
        asd.to_scipy(np.eye(3))
    batched = torch.stack([torch.eye(3)] * 2).to_sparse_csr()
    with raises("2-D"):
        asd.to_scipy(batched)


def test_half_precision_acyclic_hessian_runs():
    x = torch.rand(12, dtype=torch.float32)
    h = lambda z: (z[1:] * z[:-1] ** 2).sum()  # noqa: E731
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        try:
            op = asd.prepare_hessian(h, x.to(dtype), coloring="acyclic")
            H = op(x.to(dtype))
        except AsdError as exc:  # a clear refusal is acceptable, a numba crash is not
            assert "dtype" in str(exc) or "precision" in str(exc)
            continue
        ref = torch.func.hessian(h)(x.double())
        torch.testing.assert_close(H.to_dense().double(), ref, rtol=5e-2, atol=5e-2)


def test_operators_refuse_pickling_with_a_way_out(tmp_path):
    op = asd.prepare_jacobian(f, X)
    with raises("cannot be pickled", TypeError):
        pickle.dumps(op)
    op.pattern.save(tmp_path / "p.npz")
    asd.coloring.save(op.coloring, tmp_path / "c.npz")
    again = asd.prepare_jacobian(f, X, pattern=asd.SparsityPattern.load(tmp_path / "p.npz"))
    torch.testing.assert_close(again(X).to_dense(), op(X).to_dense())
    c = asd.coloring.load(tmp_path / "c.npz")
    assert type(c) is type(op.coloring) and np.array_equal(c.colors, op.coloring.colors)


def test_load_refuses_other_files(tmp_path):
    np.savez(tmp_path / "x.npz", a=np.arange(3))
    with raises("not an asd"):
        asd.SparsityPattern.load(tmp_path / "x.npz")
    with raises("not an asd"):
        asd.coloring.load(tmp_path / "x.npz")


# -- dense patterns: no hang, dense AD through the same pipeline, a warning ---------------------

@pytest.mark.timeout(60)  # the guard against a hang (a quadratic greedy pass took minutes)
def test_dense_pattern_falls_back_to_one_color_each_without_hanging():
    n = 3000
    P = sp.csr_array(np.ones((n // 2, n), dtype=bool))  # 1500 dense rows: every column coloring needs n
    col = asd.color(P, "column")
    assert col.ncolors == n and col.order == "dense"
    row = asd.color(P, "row")
    assert row.ncolors == n // 2 and row.order == "dense"
    asd.coloring.check(P, col)
    H = sp.csr_array(np.ones((400, 400), dtype=bool))
    for problem in ("star", "acyclic"):
        r = asd.color(H, problem)
        assert r.ncolors == 400 and r.order == "dense"
        asd.coloring.check(H, r)


def test_dense_adjacency_model_jacobian():
    torch.manual_seed(0)
    A = (torch.rand(60, 60) < 0.05).double()
    lin = torch.nn.Linear(4, 4).double()
    X = torch.rand(60, 4, dtype=torch.float64)
    f = lambda X: torch.relu(A @ lin(X))  # noqa: E731
    with pytest.warns(RuntimeWarning, match="compression barely pays"):
        op = asd.prepare_jacobian(f, X)
    ref = torch.autograd.functional.jacobian(f, X).reshape(240, 240)
    torch.testing.assert_close(op(X).to_dense(), ref)
    # the size: A 400 x 400 with 1% nonzeros, X 400 x 8 (it took 76 s to color); the
    # coloring is skipped, the warning says dense AD runs, and the result is exact
    A = (torch.rand(400, 400, generator=torch.Generator().manual_seed(1)) < 0.01).double()
    lin = torch.nn.Linear(8, 8).double()
    X = torch.rand(400, 8, dtype=torch.float64)
    gcn = lambda X: torch.relu(A @ lin(X))  # noqa: E731
    with pytest.warns(RuntimeWarning, match="skipped and asd evaluates dense AD.*local=True"):
        op = asd.prepare_jacobian(gcn, X)
    assert op.ncolors == 3200 and op.coloring.order == "dense"
    torch.testing.assert_close(op(X).to_dense(), torch.func.jacrev(gcn)(X).reshape(3200, 3200))


@pytest.mark.parametrize("argnums", ["a", 1.5, (0, "b"), [0.0]])
def test_bad_argnums(argnums):
    two = lambda a, b: a * b  # noqa: E731
    with raises("argnums", TypeError):
        asd.jacobian_sparsity(two, (X, X), argnums=argnums)
    with raises("argnums", TypeError):
        asd.hessian_sparsity(lambda a, b: (a * b).sum(), (X, X), argnums=argnums)


def _spd_csr(n=5):
    return (torch.eye(n, dtype=torch.float64) * 2).to_sparse_csr()


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
@pytest.mark.parametrize("method", ["direct", "cg", "gmres"])
def test_linalg_solve_refuses_a_non_finite_right_hand_side(bad, method):
    b = torch.ones(5, dtype=torch.float64)
    b[2] = bad
    with raises("right-hand side|b contains"):
        asd.linalg.solve(_spd_csr(), b, method=method)


@pytest.mark.parametrize("solver, kw, match", [
    (asd.linalg.CG, dict(maxiter=0), "maxiter"), (asd.linalg.GMRES, dict(maxiter=-3), "maxiter"),
    (asd.linalg.GMRES, dict(restart=0), "restart"), (asd.linalg.GMRES, dict(restart=2.5), "restart"),
    (asd.linalg.MINRES, dict(maxiter=1.5), "maxiter"),
])
def test_iterative_solver_counts(solver, kw, match):
    with raises(match):
        solver(**kw)


def test_verify_on_a_meta_tensor_names_the_device():
    with pytest.raises(asd.InputError, match="meta device"):
        asd.verify(torch.sin, torch.ones(3, device="meta"))


@pytest.mark.parametrize("value", ["max-autotune", "reduce_overhead", 1])
def test_compile_takes_true_false_or_reduce_overhead(value):
    with raises("compile must be True, False or 'reduce-overhead'", TypeError):
        asd.prepare_jacobian(f, X, compile=value)
    with raises("compile", TypeError):
        asd.prepare_hessian(g, X, compile=value)


def test_to_cupy_refuses_what_it_cannot_convert():
    J = asd.sparse_jacobian(f, X)
    with raises("to_cupy converts a CUDA tensor.*to_scipy"):
        asd.to_cupy(J)
    with raises("2-D sparse CSR or COO"):
        asd.to_cupy(J.to_dense())
    with raises("2-D sparse CSR or COO"):  # a hybrid COO: vectors as values
        asd.to_cupy(torch.sparse_coo_tensor(torch.tensor([[0, 1]]), torch.ones(2, 3), (4, 3)))
    with raises("to_cupy converts a torch sparse tensor", TypeError):
        asd.to_cupy(np.zeros((2, 2)))


@pytest.mark.parametrize("name, value, prepared", [("compile", 1, True), ("compile", 1.0, True), ("local", 0, False),
                                                   ("strict", 1, True), ("batch_size", True, 1), ("check", 1, True),
                                                   ("check", 0, False), ("trace", 1, True), ("trace", 0, False)])
def test_options_are_checked_before_they_key_the_cache(name, value, prepared):
    """``1 == True``: an unchecked option would find the operator prepared with ``True``."""
    asd.sparse_jacobian(f, X, **{name: prepared})  # now in the cache
    with raises(name):
        asd.sparse_jacobian(f, X, **{name: value})
