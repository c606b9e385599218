"""The seed-004 applications in examples/ train and their loss goes down (short runs)."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
pytestmark = [pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
              pytest.mark.filterwarnings("ignore:Sparse invariant checks")]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("name,kwargs", [
    ("linalg_jacobi_weights", dict(steps=40)),
    ("linalg_heavy_ball", dict(steps=40)),
    ("linalg_pcg_preconditioner", dict(steps=30)),
    ("linalg_gcn", dict(epochs=30, learn_edges=True)),
])
def test_example_loss_decreases(name, kwargs, capsys):
    losses = _load(name).main(**kwargs)
    assert losses[-1] < losses[0]
