"""The illustrated guide: every figure's data checked against asd and torch autograd, and the command."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch

import asd
from asd.detection import jacobian_pattern
from asd.problems import rosenbrock
from asd.viz.guide import data as d
from asd.viz.guide import demonstration as demo
from asd.viz.guide import example as ex
from asd.viz.guide.sections import FIGURES


def dense_jf() -> np.ndarray:
    return torch.func.jacfwd(ex.f)(ex.point()).numpy()


def pattern_rows(fn, x) -> list[list[int]]:
    P = jacobian_pattern(fn, x).toarray()
    return [np.flatnonzero(r).tolist() for r in P]


def assert_column_coloring_valid(P: np.ndarray, colors: np.ndarray) -> None:
    """No row holds two nonzeros in columns of the same color."""
    for row in P:
        used = colors[np.flatnonzero(row)]
        assert len(used) == len(set(used.tolist()))


def test_chain_rule_is_the_product_of_the_drawn_jacobians():
    c = d.data_chain_rule()
    np.testing.assert_allclose(c.Jf, c.Jh @ c.Jg, atol=1e-12)
    np.testing.assert_allclose(c.Jf, asd.sparse_jacobian(ex.f, ex.point()).to_dense().numpy(), atol=1e-12)


def test_conv_structure_is_the_detected_pattern():
    c = d.data_conv_structure()
    np.testing.assert_array_equal(c.pattern, c.J != 0)
    out = c.image - c.kernel + 1
    assert c.J.shape == (out * out, c.image * c.image)
    assert c.pattern.sum(axis=1).tolist() == [c.kernel ** 2] * out * out


def test_linear_maps_columns_and_rows_are_the_jacobian():
    J = dense_jf()
    chain = d.data_forward_eval()
    np.testing.assert_allclose(chain.Df_v, J @ chain.v, atol=1e-12)
    for j, (e, col) in enumerate(d.data_forward_columns()):
        assert e[j] == 1 and e.sum() == 1
        np.testing.assert_allclose(col, J[:, j], atol=1e-12)
    for i, (e, row) in enumerate(d.data_reverse_rows()):
        assert e[i] == 1 and e.sum() == 1
        np.testing.assert_allclose(row, J[i], atol=1e-12)


def test_sparse_jacobian_and_pattern():
    s = d.data_sparse_jacobian()
    np.testing.assert_allclose(s.J, dense_jf(), atol=1e-12)
    assert not (s.J != 0)[~s.pattern].any()


def test_column_compression_is_op_compressed_and_j_times_seeds():
    c = d.data_column_compression()
    op = asd.prepare_jacobian(ex.f, ex.point(), mode="forward")
    flat = op.compressed(ex.point()).numpy()
    np.testing.assert_allclose(c.compressed, flat.reshape(op.ncolors, -1).T, atol=0)
    np.testing.assert_allclose(c.compressed, c.J @ c.seeds.T, atol=1e-12)
    np.testing.assert_allclose(c.J, dense_jf(), atol=1e-12)
    assert_column_coloring_valid(c.pattern, c.colors)
    assert c.seeds.shape == (len(set(c.colors.tolist())), c.J.shape[1])


def test_row_compression_is_seeds_times_j():
    c = d.data_row_compression()
    op = asd.prepare_jacobian(ex.f, ex.point(), mode="reverse")
    np.testing.assert_allclose(c.compressed, op.compressed(ex.point()).numpy().reshape(op.ncolors, -1), atol=0)
    np.testing.assert_allclose(c.compressed, c.seeds @ c.J, atol=1e-12)
    assert_column_coloring_valid(c.pattern.T, c.colors)


def test_pattern_forms_and_two_steps():
    forms = d.data_pattern_forms()
    rows = pattern_rows(ex.f, ex.point())
    assert forms.index_sets == rows
    np.testing.assert_array_equal(forms.pattern, forms.J != 0)
    P, coloring = d.data_two_steps()
    np.testing.assert_array_equal(P, forms.pattern)
    assert_column_coloring_valid(P, np.asarray(coloring.colors))


def test_chain_of_jacobians_and_of_index_sets():
    x = ex.point()
    I, Jg, Jf = d.data_naive_chain()
    np.testing.assert_array_equal(I, np.eye(x.numel()))
    np.testing.assert_allclose(Jg, torch.func.jacrev(ex.g)(x).numpy(), atol=1e-12)
    np.testing.assert_allclose(Jf, dense_jf(), atol=1e-12)
    sets_x, sets_y, sets_f = d.data_index_chain()
    assert sets_x == [[j] for j in range(x.numel())]
    assert sets_y == pattern_rows(ex.g, x) and sets_f == pattern_rows(ex.f, x)
    reads = pattern_rows(ex.h, ex.g(x))  # output i of h reads these entries of g(x)
    for i, s in enumerate(sets_f):
        assert s == sorted(set().union(*(sets_y[k] for k in reads[i])))


def test_computational_graph_index_sets():
    nodes = {n.name: n for n in d.data_computational_graph()}
    x = torch.tensor([1.0, 2.0, 3.0, -4.0], dtype=torch.float64)
    assert nodes["f(x)"].index_set == pattern_rows(lambda x: d.graph_example(x).reshape(1), x)[0] == [0, 1, 2]
    assert nodes["sign(x3)"].index_set == []
    for n in nodes.values():
        if n.parents:
            assert set(n.index_set) <= set().union(*(nodes[p].index_set for p in n.parents))


@pytest.mark.parametrize("coloring", ["star", "acyclic"])
def test_hessian_decompression_equals_the_dense_hessian(coloring):
    c = d.data_hessian(coloring)
    x = d.hessian_point()
    H = torch.func.hessian(rosenbrock)(x).numpy()
    np.testing.assert_allclose(c.H, H, rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(c.compressed, H @ c.seeds.T, rtol=1e-12, atol=1e-10)
    op = asd.prepare_hessian(rosenbrock, x, coloring=coloring)
    np.testing.assert_array_equal(c.colors, np.asarray(op.coloring.colors))
    if coloring == "star":
        assert_star_recoverable(c.pattern, c.colors, c.compressed, H)


def assert_star_recoverable(P: np.ndarray, colors: np.ndarray, B: np.ndarray, H: np.ndarray) -> None:
    """Every nonzero H_ij is read directly: B[i, color j] if j's color is alone in row i, else B[j, color i]."""
    def alone(i, j):
        return (colors[np.flatnonzero(P[i])] == colors[j]).sum() == 1

    for i, j in zip(*np.nonzero(P)):
        assert alone(i, j) or alone(j, i)
        read = B[i, colors[j]] if alone(i, j) else B[j, colors[i]]
        np.testing.assert_allclose(read, H[i, j], rtol=1e-12, atol=1e-10)


def test_acyclic_needs_no_more_colors_than_star():
    assert d.data_hessian("acyclic").seeds.shape[0] <= d.data_hessian("star").seeds.shape[0]


def test_break_even():
    rows = [dict(size=s, a=a, dense_forward=f, dense_reverse=r)
            for s, a, f, r in [(1, 5, 1, 2), (2, 1, 3, 0.5), (4, 1, 3, 2), (8, 1, 4, 3)]]
    assert demo.break_even(rows, "a") == 4
    assert demo.break_even(rows[:1], "a") is None
    assert demo.break_even(rows[2:], "a") == 4


def test_guide_command_writes_every_figure(tmp_path):
    out = subprocess.run([sys.executable, "-m", "asd", "guide", "--quick", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=240)
    assert out.returncode == 0, out.stderr
    guide = (tmp_path / "guide.md").read_text()
    names = [f.name for f in FIGURES] + ["18_demonstration"]
    for name in names:
        assert (tmp_path / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({name}.png)" in guide
    data = json.loads((tmp_path / "18_demonstration.json").read_text())
    assert "18_demonstration.json" in guide
    assert [p["name"] for p in data["problems"]] == ["brusselator", "conv_layer", "rosenbrock"]
    for p in data["problems"]:
        assert len(p["rows"]) == 2 and set(p["break_even"]) == {"asd_oneoff", "asd_prepared"}
        for r in p["rows"]:
            assert r["max_error"] < 1e-8
            assert all(r[k] > 0 for k, *_ in demo.SERIES)
