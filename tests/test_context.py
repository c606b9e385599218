"""Detection and evaluation in one autograd context, and PyTorch's AD gaps avoided (issue 10, items 2-3).

Each test here returned a wrong derivative without a word before: an empty pattern for the
force-field idiom, answers that changed with ``mode`` under ``torch.no_grad()``, and PyTorch's
wrong formulas passed through (``scatter_reduce(reduce="prod")`` in forward mode, ``cdist``
under batched VJPs, reverse-over-forward Hessians of ``layer_norm``).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import asd
from asd.detection import jacobian_pattern
from asd.detection.ad_gaps import GAPS, unsafe_modes


def _dense_jacobian(f, x):
    return torch.autograd.functional.jacobian(f, x)


def _dense_hessian(f, x):
    """Reverse-over-reverse: needs no forward-mode formula (those are what is being avoided)."""
    return torch.func.jacrev(torch.func.jacrev(f))(x)


def _quiet(make):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # density notes on tiny problems
        return make()


def forces(pos: torch.Tensor) -> torch.Tensor:
    """The molecular-dynamics idiom: forces as minus the gradient of an energy, by autograd."""
    if not pos.requires_grad:
        pos = pos.detach().requires_grad_()
    energy = (pos[1:] - pos[:-1]).pow(2).sum() + pos.pow(4).sum()
    return -torch.autograd.grad(energy, pos, create_graph=True)[0]


def scaled_by_a_constant_sum(x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        s = x.sum()
    return x * s


@pytest.fixture
def x():
    return torch.rand(8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_force_field_pattern_is_the_tridiagonal_hessian(x):
    P, info = jacobian_pattern(forces, x, return_info=True)
    assert info.calls_autograd
    expected = (_dense_jacobian(forces, x) != 0)
    assert torch.equal(torch.as_tensor(P.to_scipy().toarray()), expected)


@pytest.mark.parametrize("mode", ["auto", "forward", "reverse"])
def test_force_field_jacobian_in_every_mode(x, mode):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        op = asd.prepare_jacobian(forces, x, mode=mode)
        J = op(x).to_dense()
    torch.testing.assert_close(J, _dense_jacobian(forces, x))
    assert op.mode == "reverse"
    gap_warnings = [w for w in caught if issubclass(w.category, asd.ADGapWarning)]
    assert bool(gap_warnings) == (mode == "forward")  # only the explicit choice is replaced aloud


@pytest.mark.parametrize("mode", ["auto", "forward", "reverse"])
def test_no_grad_regions_cut_dependencies_in_every_mode(x, mode):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", asd.ADGapWarning)
        J = _quiet(lambda: asd.prepare_jacobian(scaled_by_a_constant_sum, x, mode=mode))(x).to_dense()
    torch.testing.assert_close(J, _dense_jacobian(scaled_by_a_constant_sum, x))  # reverse mode: s is a constant
    P, info = jacobian_pattern(scaled_by_a_constant_sum, x, return_info=True)
    assert info.no_grad_cut and P.nnz == x.numel()  # diagonal, like reverse mode


def test_no_grad_inside_a_hessian(x):
    f = lambda z: (scaled_by_a_constant_sum(z) ** 2).sum()  # noqa: E731
    op = _quiet(lambda: asd.prepare_hessian(f, x))
    assert "forward" not in op.strategy.replace("forward_over", "")  # no JVP anywhere
    torch.testing.assert_close(op(x).to_dense(), _dense_hessian(f, x))


def test_outer_no_grad_does_not_change_the_pattern(x):
    f = lambda z: z[1:] * z[:-1]  # noqa: E731
    with torch.no_grad():
        P = asd.jacobian_sparsity(f, x)
    assert P.nnz == 2 * (x.numel() - 1)


IDX = torch.tensor([0, 1, 2, 0, 1, 2, 0, 3])


def scatter_prod(z):
    return torch.ones(4, dtype=z.dtype).scatter_reduce(0, IDX, z, reduce="prod")


def test_scatter_reduce_prod_avoids_forward_mode(x):
    op = _quiet(lambda: asd.prepare_jacobian(scatter_prod, x))
    assert op.mode == "reverse"
    torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(scatter_prod, x))
    with pytest.warns(asd.ADGapWarning, match="scatter_reduce"):
        op = _quiet(lambda: asd.prepare_jacobian(scatter_prod, x, mode="forward"))
    torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(scatter_prod, x))


@pytest.mark.parametrize("hvp", ["auto", "forward_over_reverse", "reverse_over_forward"])
def test_scatter_reduce_prod_hessian(x, hvp):
    f = lambda z: scatter_prod(z).sum()  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", asd.ADGapWarning)
        op = _quiet(lambda: asd.prepare_hessian(f, x, hvp=hvp))
    torch.testing.assert_close(op(x).to_dense(), _dense_hessian(f, x))
    assert op.hvp in ("reverse_over_reverse", "double_backward")  # what runs, not what was asked


def test_scatter_reduce_sum_keeps_forward_mode(x):
    f = lambda z: torch.zeros(4, dtype=z.dtype).scatter_reduce(0, IDX, z, reduce="sum") * z[:4]  # noqa: E731
    _, info = jacobian_pattern(f, x, return_info=True)
    assert not info.gaps and unsafe_modes(info) == {}


def cdist_rows(z):
    return torch.cdist(z.reshape(4, 2), z.reshape(4, 2)[1:3]).reshape(-1)


@pytest.mark.parametrize("mode", ["auto", "reverse"])
def test_cdist_avoids_batched_vjps(x, mode):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", asd.ADGapWarning)
        op = _quiet(lambda: asd.prepare_jacobian(cdist_rows, x, mode=mode))
    assert op.strategy == "autograd loop"
    torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(cdist_rows, x))


def layer_norm_energy(z):
    return (F.layer_norm(z.reshape(2, 4), (4,)) ** 3).sum()


def test_layer_norm_reverse_over_forward_is_replaced(x):
    with pytest.warns(asd.ADGapWarning, match="native_layer_norm"):
        op = asd.prepare_hessian(layer_norm_energy, x, hvp="reverse_over_forward")
    assert "grad(jvp)" not in op.strategy and op.ad_gap
    torch.testing.assert_close(op(x).to_dense(), _dense_hessian(layer_norm_energy, x))


def test_a_user_backend_is_kept_with_a_warning(x):
    from asd.backends import ForwardJVP

    with pytest.warns(asd.ADGapWarning, match="given backend"):
        op = _quiet(lambda: asd.prepare_jacobian(scatter_prod, x, coloring="column", backend=ForwardJVP()))
    assert op.strategy == "vmap(jvp)"


def test_every_table_entry_names_an_op_of_this_torch():
    torch.nn.functional.linear  # noqa: B018 - the torch_nn namespace registers with torch.nn
    for name, gaps in GAPS.items():
        namespace, op = name.split("::")
        if namespace == "aten":
            assert hasattr(torch.ops.aten, op), name
        assert gaps and all(gap.modes and gap.reason for gap in gaps)


# The gaps themselves, in PyTorch: when one of these starts failing, PyTorch fixed the formula and
# the table entry can go.

def test_pytorch_forward_mode_of_scatter_reduce_prod_is_still_wrong(x):
    assert not torch.allclose(torch.func.jacfwd(scatter_prod)(x), torch.func.jacrev(scatter_prod)(x))


def test_pytorch_batched_cdist_backward_is_still_wrong(x):
    assert not torch.allclose(torch.func.jacrev(cdist_rows)(x), _dense_jacobian(cdist_rows, x))


def test_pytorch_reverse_over_forward_layer_norm_is_still_wrong(x):
    def hvp_rof(v):
        return torch.func.grad(lambda z: torch.func.jvp(layer_norm_energy, (z,), (v,))[1])(x)

    H = _dense_hessian(layer_norm_energy, x)
    rof = torch.stack([hvp_rof(e) for e in torch.eye(x.numel())])
    assert not torch.allclose(rof, H)


def test_linear_cross_entropy_chunked_is_in_the_table():
    """Found by the OpInfo sweep (tests/test_ad_gaps.py): the chunked op's JVP is wrong."""
    import sys

    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from test_ad_gaps import sweep

    found = sweep({"nn.functional.linear_cross_entropy.chunked"}, max_samples=2)
    assert found and all(f.listed for f in found)


# The probe (check=True) must not refuse a right answer: its own product avoids the modes the trace
# ruled out, skips products PyTorch makes NaN, and treats differences at rounding level as zero.

def test_probe_avoids_the_modes_the_trace_ruled_out(x):
    op = _quiet(lambda: asd.prepare_jacobian(scatter_prod, x, mode="reverse", check=True))
    torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(scatter_prod, x))
    assert op.last_check.ok and "Jacobian-vector" not in op.last_check.product
    op = _quiet(lambda: asd.prepare_hessian(layer_norm_energy, x, check=True))
    torch.testing.assert_close(op(x).to_dense(), _dense_hessian(layer_norm_energy, x))
    assert op.last_check.ok and "reverse-over-forward" not in op.last_check.product


def test_probe_of_a_zero_derivative_is_not_a_false_alarm(x):
    unit = lambda z: torch.view_as_real(torch.exp(1j * z)).pow(2).sum(-1)  # |exp(iz)|^2 = 1  # noqa: E731
    op = _quiet(lambda: asd.prepare_jacobian(unit, x, mode="reverse", check=True))
    assert op(x).to_dense().abs().max() < 1e-12 and op.last_check.ok


ENERGIES = {
    "exp": lambda p: torch.exp(p).sum(),  # backward reads the saved output
    "tanh_pairs": lambda p: torch.tanh(p.reshape(4, 2)).prod(1).sum(),  # tanh_backward: a decomposition
    "sigmoid": lambda p: torch.sigmoid(p).pow(3).sum(),
    "layer_norm": lambda p: (F.layer_norm(p.reshape(2, 4), (4,)) ** 3).sum(),
    "slices": lambda p: (p[1:] ** 3 * p[:-1]).sum(),
    "unfold": lambda p: p.unfold(0, 2, 1).prod(-1).sum(),
    "softplus": lambda p: F.softplus(p).sum(),
}


@pytest.mark.parametrize("name", sorted(ENERGIES))
def test_force_fields_through_every_backward(x, name):
    """Forces by autograd inside f: backward ops traced through saved outputs and decompositions."""
    energy = ENERGIES[name]

    def forces_of(p):
        if not p.requires_grad:
            p = p.detach().requires_grad_()
        return -torch.autograd.grad(energy(p), p, create_graph=True)[0]

    dense = _dense_jacobian(forces_of, x)
    op = _quiet(lambda: asd.prepare_jacobian(forces_of, x))
    torch.testing.assert_close(op(x).to_dense(), dense)
    pattern = torch.as_tensor(op.pattern.to_scipy().toarray())
    assert not ((dense.abs() > 1e-12) & ~pattern).any()


def test_decomposed_forward_op_keeps_its_dependencies(x):
    """``_weight_norm`` is traced through PyTorch's decomposition: its intermediates are untracked
    below autograd, not detached."""
    z = torch.rand(15, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def f(v):
        v = v.reshape(5, 3)
        return torch._weight_norm(v, v[:, :1].abs() + 1, 0)

    op = _quiet(lambda: asd.prepare_jacobian(f, z))
    torch.testing.assert_close(op(z).to_dense(), _dense_jacobian(f, z).reshape(15, 15))


def test_detach_is_a_constant_where_it_is_used(x):
    assert asd.jacobian_sparsity(lambda z: z.detach() * z, x).nnz == x.numel()
    assert asd.jacobian_sparsity(lambda z: z.detach() + 0 * z, x).nnz == x.numel()  # 0 * z keeps z's set
    assert asd.jacobian_sparsity(lambda z: z.detach().roll(1) * 1.0, x).nnz == 0


@pytest.mark.parametrize("dtype,scale", [(torch.float64, 1e-13), (torch.float32, 1e-5)])
def test_probe_catches_a_wrong_pattern_of_a_small_scale_function(dtype, scale):
    """The probe's rounding allowance follows the function's scale, not an absolute number."""
    import numpy as np

    f = lambda z: scale * (z * z.roll(1))  # noqa: E731 - two nonzeros per row
    z = torch.rand(6, dtype=dtype, generator=torch.Generator().manual_seed(0)) + 0.5
    op = asd.prepare_jacobian(f, z, pattern=np.eye(6, dtype=bool))  # a wrong user pattern: checked
    with pytest.raises(asd.CheckError):
        op(z)


def _writes_through_a_detached_alias(z):
    w = z.detach()
    w.zero_()  # changes z's values, not its autograd history
    return z * 2


def _clamped_without_grad(z):
    with torch.no_grad():
        z.clamp_(0, 0.5)
    return z * 3


def _buffer_filled_without_grad(z):
    buf = torch.zeros(z.numel(), dtype=z.dtype)
    with torch.no_grad():
        buf.copy_(z)  # a constant for reverse mode
    return buf * z


def _renormed_embedding(z):
    return F.embedding(torch.tensor([[0, 2], [1, 3]]), z.reshape(4, 2), max_norm=0.5).reshape(-1)


@pytest.mark.parametrize("f", [_writes_through_a_detached_alias, _clamped_without_grad, _buffer_filled_without_grad,
                               _renormed_embedding], ids=lambda f: f.__name__.strip("_"))
def test_untracked_writes_keep_the_dependencies_reverse_mode_sees(x, f):
    dense = _dense_jacobian(f, x.clone())
    P = torch.as_tensor(asd.jacobian_sparsity(f, x.clone()).toarray())
    assert not ((dense != 0) & ~P).any()
    J = _quiet(lambda: asd.prepare_jacobian(f, x.clone()))(x.clone()).to_dense()
    torch.testing.assert_close(J, dense)


@pytest.mark.parametrize("name", ["eigh_upper", "embedding_padding"])
def test_modes_that_disagree_follow_reverse_mode(name):
    """Where PyTorch's forward and reverse modes disagree by convention (eigh's symmetrized backward,
    embedding's padding row without gradient), asd returns what reverse-mode autograd returns."""
    if name == "eigh_upper":
        f = lambda z: torch.linalg.eigh(z.reshape(4, 4) + 4 * torch.eye(4, dtype=z.dtype), UPLO="U")[0]  # noqa: E731
        x = torch.rand(16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    else:
        f = lambda z: F.embedding(torch.tensor([0, 2, 3, 3]), z.reshape(4, 2), padding_idx=3).reshape(-1)  # noqa: E731
        x = torch.rand(8, dtype=torch.float64)
    op = _quiet(lambda: asd.prepare_jacobian(f, x))
    assert op.mode == "reverse" or op.strategy == "autograd loop"
    torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(f, x).reshape(-1, x.numel()))


class _ShiftInPlace(torch.autograd.Function):
    """Its forward runs with recording off and writes into a buffer in place."""

    @staticmethod
    def forward(ctx, z):
        buf = torch.zeros_like(z)
        buf[1:] = z[:-1]
        buf.mul_(2)
        return buf

    @staticmethod
    def backward(ctx, g):
        out = torch.zeros_like(g)
        out[:-1] = 2 * g[1:]
        return out


def test_in_place_writes_inside_an_autograd_function_keep_their_dependencies(x):
    f = lambda z: _ShiftInPlace.apply(z) * z  # noqa: E731
    dense = _dense_jacobian(f, x)
    P = torch.as_tensor(asd.jacobian_sparsity(f, x).toarray())
    assert not ((dense != 0) & ~P).any()
    torch.testing.assert_close(_quiet(lambda: asd.prepare_jacobian(f, x, mode="reverse"))(x).to_dense(), dense)
