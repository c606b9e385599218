"""Defects found in session 44, each with the test that failed before its fix."""

import pytest
import torch

from asd.backends import traced


def test_a_recording_refuses_the_cuda_array_interface():
    """cupy and Numba read a CUDA tensor's memory through ``__cuda_array_interface__``, outside
    dispatch like ``.numpy()``: a recorded graph would keep the values read. On the CPU the
    property raises AttributeError, which ``hasattr`` answers False as without the recording."""
    class _OnCuda(torch.Tensor):  # a CPU tensor that says it is on CUDA: no GPU here
        is_cuda = property(lambda self: True)

    cuda_like = torch.Tensor._make_subclass(_OnCuda, torch.ones(3))
    with traced._NoHostReads():
        with pytest.raises(RuntimeError, match=r"outside PyTorch's operations \(__cuda_array_interface__\)"):
            cuda_like.__cuda_array_interface__
        torch.ones(3).add(1.0)  # other calls pass
        # duck typing on a CPU tensor answers as without the mode (the property raises AttributeError
        # there): f may test for CUDA arrays and still be recorded
        assert not hasattr(torch.ones(3), "__cuda_array_interface__")


def test_a_function_testing_for_cuda_arrays_is_still_recorded():
    import asd

    def f(z):
        if hasattr(z, "__cuda_array_interface__"):
            raise AssertionError("a CPU tensor")
        return torch.sin(z) * z[0]

    op = asd.prepare_jacobian(f, torch.rand(6, dtype=torch.float64))
    for _ in range(60):
        x = torch.rand(6, dtype=torch.float64)
        J = op(x)
    torch.testing.assert_close(J.to_dense(), torch.func.jacrev(f)(x))
    tracing = (getattr(op.state, "fused", None) or op.state.products).tracing
    assert tracing.graphs and not tracing.disabled, tracing.error


def test_asd_jax_reprobes_a_pass_by_the_rounding_allowance():
    """asd.jax's probe passed entries whose difference its rounding allowance (the linearity defect)
    excused, without the torch probe's second product on a vector vanishing on their stored
    entries: an entry the pattern misses, hidden below that allowance, passed. (The allowance is
    forced large here; the second product's sparse side is exactly 0, so it shows the entry.)"""
    jax = pytest.importorskip("jax")
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp
    import numpy as np

    import asd.jax as aj
    from asd.errors import CheckError
    from asd.jax.operators import _SparseOperator

    def f(z):
        return jnp.sum(z[:5] ** 2) + 1e-3 * z[1] * z[5]  # (row 5 stores nothing else: the second
        # vector, vanishing on the stored entries of the rows it checks, keeps its fifth component)

    x = jnp.asarray(np.random.default_rng(0).uniform(-2, 2, 8))
    P = aj.hessian_sparsity(f, x).toarray().astype(bool)
    P[1, 5] = P[5, 1] = False
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_SparseOperator, "_linearity_defect", lambda self, x, ref, rows: np.ones(len(rows)))
        with pytest.raises(CheckError):
            aj.prepare_hessian(f, x, check=True, pattern=P)(x)


def test_a_recording_refuses_reading_grad():
    """``.grad`` read inside f: a recorded graph would keep the tensor a later backward replaces."""
    with traced._NoHostReads():
        w = torch.ones(3, requires_grad=True)
        with pytest.raises(RuntimeError, match=r"\.grad"):
            w.grad
