"""Device residency, checked without a GPU: every operator path runs on the ``meta`` device, where
any copy of values to the host fails, and memory-aware batching."""

import pytest
import torch

import asd
import asd.memory
from asd.problems import brusselator, rosenbrock

META = torch.device("meta")


def _meta(n):
    return torch.empty(n, dtype=torch.float64, device=META)


@pytest.mark.parametrize("kw", [dict(mode="forward"), dict(mode="reverse"), dict(coloring="bidirectional"),
                                dict(mode="forward", batch_size=2), dict(mode="reverse", batch_size=3)])
def test_jacobian_on_meta(kw):
    f = brusselator(4)
    op = asd.prepare_jacobian(f, _meta(32), **kw)
    J = op(_meta(32))
    assert J.device.type == "meta" and J.layout == torch.sparse_csr and J.shape == (32, 32)
    assert op.values(_meta(32)).device.type == "meta"
    assert op.compressed(_meta(32)).device.type == "meta"


@pytest.mark.parametrize("coloring", ["star", "acyclic"])
@pytest.mark.parametrize("hvp", ["forward_over_reverse", "reverse_over_forward"])
def test_hessian_on_meta(coloring, hvp):
    op = asd.prepare_hessian(rosenbrock, _meta(12), coloring=coloring, hvp=hvp)
    H = op(_meta(12))
    assert H.device.type == "meta" and H.layout == torch.sparse_csr
    value, grad, H2 = op.value_grad_hessian(_meta(12))
    assert grad.device.type == "meta" and H2.device.type == "meta"


def test_auto_batch_size_follows_free_memory(monkeypatch):
    f = brusselator(8)
    x = torch.rand(128, dtype=torch.float64)
    assert asd.prepare_jacobian(f, x, batch_size="auto").batch_size is None  # plenty of memory
    # one product of this function needs about itemsize * (2 * 128 + 16 * 256) bytes
    monkeypatch.setattr(asd.memory, "free_bytes", lambda device: 3 * 8 * (2 * 128 + 16 * 256) * 2)
    op = asd.prepare_jacobian(f, x, batch_size="auto", mode="forward")
    assert op.batch_size == 3
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    monkeypatch.setattr(asd.memory, "free_bytes", lambda device: 1)
    assert asd.prepare_jacobian(f, x, batch_size="auto").batch_size == 1
