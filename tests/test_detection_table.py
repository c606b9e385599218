"""The detection package's structure and its rule table.

One-way imports (sets -> _core -> table -> rules -> torch_tracer -> jacobian/hessian/verify), a
table that is complete after ``import asd``, op names checked at registration, every op's
second-order class stated once (at its rule), user rules (``override=True``), thread-safe first
use, and the frozen-pattern detection functions.
"""

from __future__ import annotations

import ast
import graphlib
import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import asd
from asd.detection import hessian_pattern, jacobian_pattern, register_rule
from asd.detection.rules.elementwise import broadcast_union
from asd.detection.table import RULES, Rule, aten_ops, lookup, overloads_except
from asd.errors import InputError, UnsupportedOpWarning
from asd.patterns import SparsityPattern

aten = torch.ops.aten
ROOT = pathlib.Path(__file__).resolve().parents[1]
DETECTION = ROOT / "asd" / "detection"

# Import layers: a module may import modules of its own layer or below, never above.
LAYERS = {"asd.detection._set_kernels": 0, "asd.detection.sets": 0, "asd.detection.second_order": 1,
          "asd.detection._core": 1, "asd.detection.table": 2, "asd.detection.ad_gaps": 2,
          "asd.detection.rules": 3, "asd.detection.torch_tracer": 4, "asd.detection.jacobian": 5,
          "asd.detection.hessian": 6, "asd.detection.verify": 6, "asd.detection": 7}


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _layer(module: str) -> int:
    return LAYERS.get(module, LAYERS["asd.detection.rules"] if module.startswith("asd.detection.rules.") else None)


def _imports(path: pathlib.Path):
    """(imported module, whether the import is at module level) for every import in ``path``."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module
            for a in node.names:
                sub = f"{base}.{a.name}"
                is_module = (ROOT / pathlib.Path(*sub.split("."))).with_suffix(".py").exists() or \
                    (ROOT / pathlib.Path(*sub.split(".")) / "__init__.py").exists()
                yield (sub if is_module else base), id(node) in top


def _graph() -> dict[str, set[str]]:
    graph = {}
    for path in DETECTION.rglob("*.py"):
        deps = set()
        for mod, _ in _imports(path):
            if mod.startswith("asd.detection"):
                deps.add(mod)
        graph[_module_name(path)] = deps
    return graph


def test_detection_imports_form_no_cycle():
    graph = _graph()
    order = list(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle
    assert {"asd.detection._core", "asd.detection.table", "asd.detection.torch_tracer"} <= set(order)
    assert "asd.detection.registry" not in graph and "asd.detection.tracer" not in graph


def test_detection_imports_go_one_way():
    """Rules import _core, sets and table only (never the tracer front end); _core no table."""
    for module, deps in _graph().items():
        for dep in deps:
            assert _layer(dep) <= _layer(module), f"{module} imports {dep}, a later layer"
    rules = [m for m in _graph() if m.startswith("asd.detection.rules.")]
    assert len(rules) >= 8
    for module in rules:
        path = ROOT / pathlib.Path(*module.split("."))
        for mod, _ in _imports(path.with_suffix(".py")):
            assert not mod.startswith(("asd.detection.torch_tracer", "asd.detection.jacobian",
                                       "asd.detection.hessian", "asd.detection.verify")), (module, mod)


#: imported on first use, as every Numba kernel module of asd is (``import asd`` loads no Numba)
LAZY = {"asd.detection._set_kernels"}


def test_no_lazy_imports_inside_detection():
    for path in DETECTION.rglob("*.py"):
        for mod, top_level in _imports(path):
            if mod.startswith("asd.") and mod not in LAZY:
                assert top_level, f"{_module_name(path)} imports {mod} inside a function"


def test_the_lazy_kernel_modules_import_no_asd_module():
    """A module imported inside functions stays a leaf: numpy and numba only, so no layer or
    cycle hides behind the deferred import."""
    for module in LAZY:
        path = ROOT / pathlib.Path(*module.split("."))
        mods = [m for m, _ in _imports(path.with_suffix(".py"))]
        assert set(mods) <= {"numpy", "numba", "numba.njit"}, mods


@pytest.mark.parametrize("name", ["sets.py", "second_order.py", "_set_kernels.py"])
def test_set_algebra_is_torch_free(name):
    """The set algebra and the second-order accumulator are shared with the jaxpr interpreter."""
    mods = [m for m, _ in _imports(DETECTION / name)]
    assert not any(m == "torch" or m.startswith("torch.") for m in mods), mods


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_table_is_complete_after_import_asd_and_a_user_rule_survives_the_first_trace():
    """In a fresh process: the table holds every rule right after ``import asd`` (tracing adds none),
    and a rule a user registers before the first trace is the one traces use (the table used to
    fill on the first trace, which then refused the families' own rules for that op)."""
    out = _run("import torch, asd, asd.detection.table as t\n"
               "from asd.detection import register_rule\n"
               "from asd.detection.rules.elementwise import zero\n"
               "before = len(t.RULES)\n"
               "register_rule(torch.ops.aten.sin.default, zero, second_order='zero', override=True)\n"
               "nnz = asd.jacobian_sparsity(lambda x: torch.sin(x) * x.sum(), torch.zeros(3)).nnz\n"
               "asd.hessian_sparsity(lambda x: torch.prod(x), torch.zeros(3))\n"
               "print(before, len(t.RULES), nnz, asd.jacobian_sparsity(torch.sin, torch.zeros(4)).nnz)")
    before, after, nnz, sin_nnz = map(int, out.split())
    assert before == after == len(RULES) > 1000
    assert (nnz, sin_nnz) == (9, 0)


def test_duplicate_registration_raises_and_override_replaces():
    original = lookup(aten.sin.default)
    with pytest.raises(ValueError, match=r"aten\.sin\.default.*override=True"):
        register_rule(aten.sin.default, broadcast_union)
    assert lookup(aten.sin.default) is original

    def everything(call):
        """Every output element depends on every input element of the operand."""
        s = call.sets(call.args[0])
        rows = call.outs[0].numel()
        return [None if s is None else sp.csr_matrix(np.ones((rows, call.n), dtype=bool))]

    try:
        register_rule(aten.sin.default, everything, second_order="nonlinear", override=True)
        assert lookup(aten.sin.default).fn is everything
        assert asd.jacobian_sparsity(torch.sin, torch.zeros(3)).nnz == 9
    finally:
        register_rule(aten.sin.default, original.fn, second_order=original.second_order, pairs=original.pairs,
                      interaction=original.interaction, family=original.family, override=True)
    assert lookup(aten.sin.default) == original
    assert asd.jacobian_sparsity(torch.sin, torch.zeros(3)).nnz == 3


def _hand_built(indptr, indices, shape):
    """A scipy CSR matrix carrying exactly these arrays (scipy's checks bypassed, as by hand)."""
    M = sp.csr_matrix(shape, dtype=bool)
    M.indptr, M.indices = np.asarray(indptr, dtype=np.int32), np.asarray(indices, dtype=np.int32)
    M.data = np.ones(len(M.indices), dtype=bool)
    return M


def test_a_user_rules_sets_are_checked_in_full():
    """What a user's rule returns is checked before the set algebra's kernels (which trust their
    input) see it: a malformed matrix, a wrong shape or a non-sparse value raises an error naming
    the rule; a valid matrix in any format, order, dtype or with duplicates gives the right pattern
    (and the rule's own arrays are not modified)."""
    original = lookup(aten.sin.default)
    returned = {}

    def install(make):
        def rule(call):
            out = make(call.outs[0].numel(), call.n)
            returned["m"] = out
            return [out]
        register_rule(aten.sin.default, rule, second_order="nonlinear", override=True)

    x = torch.zeros(3)
    try:
        for make, err, match in (
                (lambda r, n: _hand_built([0, 1, 2, 3], [0, 1, 7], (r, n)), InputError, "malformed"),
                (lambda r, n: _hand_built([0, 2, 1, 3], [0, 1, 2], (r, n)), InputError, "malformed"),
                (lambda r, n: sp.identity(n + 1, format="csr", dtype=bool), InputError, "shape"),
                (lambda r, n: np.eye(r, n, dtype=bool), InputError, "scipy.sparse")):
            install(make)
            with pytest.raises(err, match=match) as info:
                asd.jacobian_sparsity(torch.sin, x)
            assert "sparsity rule" in str(info.value) and "aten.sin.default" in str(info.value)
        # a rule registered under a family of its own name is checked too; so is what it returns
        register_rule(aten.sin.default, lambda call: [_hand_built([0, 1, 2, 3], [0, 1, 7], (3, 3))],
                      second_order="nonlinear", family="mylib", override=True)
        with pytest.raises(InputError, match="malformed"):
            asd.jacobian_sparsity(torch.sin, x)
        for value in (None, sp.identity(3, format="csr", dtype=bool), [None, None]):
            register_rule(aten.sin.default, lambda call, v=value: v, override=True)
            with pytest.raises(InputError, match="sparsity rule .*per output|set matrices for 1"):
                asd.jacobian_sparsity(torch.sin, x)
        # valid, but unsorted, float, with a duplicate, in COO: the pattern of every row's entries
        coo = lambda r, n: sp.coo_matrix((np.ones(4), ([0, 0, 1, 2], [2, 2, 0, 1])), shape=(r, n))  # noqa: E731
        install(lambda r, n: coo(r, n).tocsr()[:, ::-1][:, ::-1])
        P = asd.jacobian_sparsity(torch.sin, x).toarray()
        np.testing.assert_array_equal(P, coo(3, 3).toarray() != 0)
        unsorted = _hand_built([0, 2, 3, 4], [2, 0, 1, 1], (3, 3))
        install(lambda r, n: unsorted)
        np.testing.assert_array_equal(asd.jacobian_sparsity(torch.sin, x).toarray(),
                                      [[1, 0, 1], [0, 1, 0], [0, 1, 0]])
        assert unsorted.indices.tolist() == [2, 0, 1, 1]  # the rule's own arrays, untouched
    finally:
        register_rule(aten.sin.default, original.fn, second_order=original.second_order, pairs=original.pairs,
                      interaction=original.interaction, family=original.family, override=True)
    assert asd.jacobian_sparsity(torch.sin, torch.zeros(3)).nnz == 3


def test_a_failed_registration_registers_nothing():
    before = dict(RULES)
    assert lookup(aten.lcm_.default) is None
    # the second packet already has a rule: the first must not be registered either
    with pytest.raises(ValueError, match="already registered"):
        register_rule([aten.lcm_, aten.sin], broadcast_union)
    with pytest.raises(ValueError, match="does not have"):
        register_rule(aten.mul.Tensor, broadcast_union, second_order="bilinear", pairs=(("self", "othr"),),
                      override=True)
    with pytest.raises(ValueError, match="listed twice"):
        register_rule([aten.cos, aten.cos.default], broadcast_union, override=True)
    assert RULES == before


def test_bad_registrations_raise():
    with pytest.raises(ValueError, match="second_order must be one of"):
        register_rule(aten.sin.default, broadcast_union, second_order="quadratic", override=True)
    with pytest.raises(ValueError, match="interaction must be one of"):
        register_rule(aten.sin.default, broadcast_union, interaction="pairwise", override=True)
    with pytest.raises(TypeError, match="OpOverload"):
        register_rule("sin", broadcast_union, override=True)
    with pytest.raises(TypeError, match="OpOverload"):
        register_rule([None], broadcast_union, override=True)
    with pytest.raises(TypeError, match="callable"):
        register_rule(aten.sin.default, None, override=True)


def test_unknown_op_names_raise_at_registration():
    with pytest.raises(ValueError, match="no ATen op named symeig"):
        aten_ops("sin", "symeig")
    assert aten_ops("sin", optional=["no_such_op_in_any_torch"]) == [aten.sin]
    assert aten_ops(optional=["sin"]) == [aten.sin]
    with pytest.raises(ValueError, match="no overload max.nothing"):
        overloads_except([aten.max], "max.other", "max.nothing")
    assert aten.max.other not in overloads_except([aten.max], "max.other")


def test_each_second_order_class_is_stated_once():
    """Only table.register_rule writes the table: no module edits a rule after registering it, and
    every family registration states its class."""
    for path in DETECTION.rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
                for t in targets:
                    if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == "RULES":
                        assert path.name == "table.py", f"{path.name} writes RULES"
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in ("refine_second_order", "Rule") or path.name == "table.py", path
                if node.func.id == "register_rule" and path.parent.name == "rules":
                    kws = {k.arg for k in node.keywords}
                    assert "second_order" in kws and "family" in kws, (path.name, node.lineno)
                    assert "override" not in kws, (path.name, node.lineno)
    for op, rule in RULES.items():
        assert isinstance(rule, Rule) and rule.op is op


def test_second_order_classes_at_the_rules():
    assert lookup(aten.mul.Tensor).pairs == (("self", "other"),)
    assert lookup(aten.lerp.Tensor).second_order == "bilinear"
    assert lookup(aten.div.Tensor).pairs == (("self", "other"), ("other", "other"))
    assert lookup(aten.xlogy.Tensor).pairs == (("self", "other"), ("other", "other"))
    assert lookup(aten.nan_to_num.default).second_order == "linear"
    assert (lookup(aten.mm.default).interaction, lookup(aten.mm.default).pairs) == ("contraction", (("self", "mat2"),))
    assert lookup(aten.addmv.default).pairs == (("mat", "vec"),)
    assert lookup(aten._addmm_activation.default).second_order == "nonlinear"
    assert lookup(aten.prod.dim_int).interaction == "multilinear"
    assert lookup(aten.scatter_reduce.two).second_order == "nonlinear"
    assert lookup(aten.scatter.src).second_order == "linear"
    for overload in ("reduce", "value_reduce", "reduce_out", "value_reduce_out"):
        assert lookup(getattr(aten.scatter, overload)).second_order == "nonlinear", overload


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter:UserWarning")
def test_scatter_with_a_multiplying_reduce_into_out_is_nonlinear():
    """scatter.reduce_out multiplies like scatter.reduce: its Hessian has the cross terms of
    x0 * x2 * x3 (it was classified linear, which gave an empty Hessian)."""

    def f(x):
        out = torch.empty(2, dtype=x.dtype)
        torch.scatter(x[:2], 0, torch.tensor([0, 0]), x[2:4], reduce="multiply", out=out)
        return out.sum()

    P = asd.hessian_sparsity(f, torch.ones(4, dtype=torch.float64), strict=True).toarray()
    for i, j in ((0, 2), (0, 3), (2, 3)):
        assert P[i, j] and P[j, i]
    assert not P[1, [0, 2, 3]].any()  # x1 passes through: no cross terms


def test_first_traces_in_eight_threads_agree(tmp_path):
    """8 threads whose first trace in a fresh process runs concurrently get the same pattern,
    with no op missing its rule (the table used to fill on the first trace)."""
    script = tmp_path / "threads.py"
    script.write_text(_THREADS)
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    assert got["warnings"] == [[]] * 8
    expected = asd.hessian_sparsity(_threads_f, torch.zeros(10, dtype=torch.float64))
    want = sorted(zip(*(a.tolist() for a in expected.nonzero())))
    assert all([tuple(e) for e in p] == want for p in got["patterns"])
    # the pattern is sound
    for seed in range(2):
        x = torch.randn(10, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        H = torch.autograd.functional.hessian(_threads_f, x).numpy() != 0
        assert not (H & ~expected.toarray()).any()


def _threads_f(x):
    x = x * 2.0  # an op that is not a view first: it looks up its rule before anything else runs
    A = torch.arange(16.0, dtype=x.dtype).reshape(4, 4).tril()
    return ((100 * (x[1:] - x[:-1] ** 2) ** 2).sum() + torch.prod(x[:3]) + x[4:8] @ (A @ x[4:8])
            + torch.sin(x[8] / x[9]))


_THREADS = '''
import json, sys, threading, warnings
import torch
import asd

sys.setswitchinterval(1e-6)
FUNCTION_SOURCE

x = torch.zeros(10, dtype=torch.float64)
barrier = threading.Barrier(8)
results, warned = [None] * 8, [None] * 8


def work(i):
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        barrier.wait()
        P = asd.hessian_sparsity(_threads_f, x)
    results[i] = sorted(zip(*(a.tolist() for a in P.nonzero())))
    warned[i] = [str(m.message) for m in w]


threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps({"patterns": results, "warnings": warned}))
'''


def _function_source() -> str:
    import inspect

    return inspect.getsource(_threads_f)


_THREADS = _THREADS.replace("FUNCTION_SOURCE", _function_source())


# -- the frozen-pattern detection functions --------------------------------------------------------

def test_jacobian_pattern_is_frozen_with_shapes():
    x = torch.zeros(2, 3, dtype=torch.float64)
    P = jacobian_pattern(lambda z: torch.cumsum(z, 1).T, x)
    assert isinstance(P, SparsityPattern)
    assert (P.shape, P.input_shape, P.output_shape) == ((6, 6), (2, 3), (3, 2))
    assert not P.indices.flags.writeable and not P.indptr.flags.writeable
    dense = torch.autograd.functional.jacobian(lambda z: torch.cumsum(z, 1).T.reshape(-1), torch.randn(2, 3))
    assert np.array_equal(P.toarray(), dense.reshape(6, 6).numpy() != 0)
    A = asd.jacobian_sparsity(lambda z: torch.cumsum(z, 1).T, x)
    assert isinstance(A, sp.csr_array) and A.dtype == bool
    assert np.array_equal(A.toarray(), P.toarray())
    assert A.indices.flags.writeable  # the public result is the caller's


def test_jacobian_pattern_of_pytrees_and_several_inputs():
    x, w = torch.zeros(3, dtype=torch.float64), torch.zeros(2, 2, dtype=torch.float64)
    P = jacobian_pattern(lambda z: {"a": z * 2, "b": z.sum()}, x)
    assert (P.shape, P.input_shape, P.output_shape) == ((4, 3), (3,), (4,))
    Px, Pw = jacobian_pattern(lambda a, b: a[:2] * b.sum(0), (x, w))
    assert (Px.shape, Px.input_shape, Px.output_shape) == ((2, 3), (3,), (2,))
    assert (Pw.shape, Pw.input_shape, Pw.output_shape) == ((2, 4), (2, 2), (2,))
    assert np.array_equal(Pw.toarray(), [[1, 0, 1, 0], [0, 1, 0, 1]])
    Pw1 = jacobian_pattern(lambda a, b: a[:2] * b.sum(0), (x, w), argnums=1)
    assert Pw1.equals(Pw)
    A = asd.jacobian_sparsity(lambda a, b: a[:2] * b.sum(0), (x, w))
    assert isinstance(A, tuple) and np.array_equal(A[1].toarray(), Pw.toarray())


def test_hessian_pattern_is_frozen_and_symmetric():
    x = torch.zeros(2, 2, dtype=torch.float64)
    f = lambda z: (z[0] * z[1]).sum() + (z[:, 0] ** 3).sum()  # noqa: E731
    P = hessian_pattern(f, x)
    assert isinstance(P, SparsityPattern) and P.is_symmetric
    assert (P.shape, P.input_shape, P.output_shape) == ((4, 4), (2, 2), (2, 2))
    H = torch.autograd.functional.hessian(f, torch.randn(2, 2, dtype=torch.float64)).reshape(4, 4)
    assert np.array_equal(P.toarray(), H.numpy() != 0)
    A = asd.hessian_sparsity(f, x)
    assert isinstance(A, sp.csr_array) and np.array_equal(A.toarray(), P.toarray())
    assert hessian_pattern(lambda z: z.sum() * 0 + 1.0, x).nnz == 0


def test_a_user_rule_with_unsorted_repeated_indices_gives_a_canonical_pattern():
    def unsorted(call):
        rows = call.outs[0].numel()
        indptr = np.arange(0, 3 * rows + 1, 3)
        indices = np.tile([2, 0, 2], rows)
        return [sp.csr_matrix((np.ones(3 * rows, dtype=bool), indices, indptr), shape=(rows, call.n))]

    original = lookup(aten.sinh.default)
    try:
        register_rule(aten.sinh.default, unsorted, override=True)
        P = jacobian_pattern(torch.sinh, torch.zeros(3))
    finally:
        register_rule(aten.sinh.default, original.fn, second_order=original.second_order,
                      family=original.family, override=True)
    assert P.equals(SparsityPattern.from_coo([0, 0, 1, 1, 2, 2], [0, 2, 0, 2, 0, 2], (3, 3)))


def test_verify_accepts_a_pattern_object():
    f = lambda z: torch.cumsum(z, 0)  # noqa: E731
    x = torch.randn(4, dtype=torch.float64)
    assert asd.verify(f, x, jacobian_pattern(f, x)).ok
    assert not asd.verify(f, x, SparsityPattern.from_coo([0, 1, 2, 3], [0, 1, 2, 3], (4, 4))).ok


def test_ops_without_a_rule_still_warn(monkeypatch):
    monkeypatch.delitem(RULES, aten.sinh.default)
    with pytest.warns(UnsupportedOpWarning, match="sinh"):
        P = jacobian_pattern(lambda z: torch.sinh(z[:2]), torch.zeros(3))
    assert np.array_equal(P.toarray(), [[1, 1, 0], [1, 1, 0]])
