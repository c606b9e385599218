"""The tracer's shortcuts for the calls a traced function repeats most (``Tracer._pointwise`` for
functional pointwise ops of contiguous operands of one shape, ``Tracer._permuting`` for ``roll`` and
``flip``) give what the general path gives: the same index sets, output metadata and trace facts,
on random programs and on the cases each shortcut must decline."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from asd.detection import jacobian_pattern, register_rule
from asd.detection import torch_tracer as T
from asd.detection.rules import movement as M
from asd.detection.table import RULES
from asd.detection.torch_tracer import TracedTensor, Tracer

aten = torch.ops.aten


class _Counting:
    """Counts the calls each shortcut answered (``None`` is a decline)."""

    def __init__(self, monkeypatch):
        self.answered = {"pointwise": 0, "permuting": 0, "stacking": 0}
        for name, attr in (("pointwise", "_pointwise"), ("permuting", "_permuting"), ("stacking", "_stacking")):
            original = getattr(Tracer, attr)

            def wrapped(tracer, *a, _original=original, _name=name):
                out = _original(tracer, *a)
                self.answered[_name] += out is not None
                return out

            monkeypatch.setattr(Tracer, attr, wrapped)


def _without_shortcuts(monkeypatch):
    monkeypatch.setattr(T, "_pointwise_rule", lambda func: None)
    monkeypatch.setattr(T, "_PERMUTING", frozenset())
    monkeypatch.setattr(T, "_STACK", None)


def _facts(f, x):
    """Everything a trace of ``f`` at ``x`` yields: each output tensor's metadata and sets, and the
    trace's facts."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outs, tracer = T.trace(f, x, local=False)
    res = []
    for o in outs:
        assert isinstance(o, TracedTensor)
        res.append((tuple(o.shape), o.stride(), o.dtype, o.requires_grad, o.is_leaf,
                    o.sets.toarray().tobytes()))
    return res, tracer.info()


# -- random programs ------------------------------------------------------------------------------

_BINARY = (torch.add, torch.sub, torch.mul, torch.div, torch.atan2, torch.maximum)
_UNARY = (torch.exp, torch.sin, torch.neg, torch.tanh, torch.sigmoid, torch.abs, torch.relu)


@st.composite
def _programs(draw):
    steps = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["binary", "scalar", "rscalar", "unary", "roll", "flip", "transpose",
                                     "no_grad", "detach", "broadcast", "inplace", "float32", "self", "stack",
                                     "clone"]))
        i = draw(st.integers(0, 50))
        j = draw(st.integers(0, 50))
        if kind == "binary":
            steps.append((kind, i, j, draw(st.sampled_from(range(len(_BINARY))))))
        elif kind in ("scalar", "rscalar"):
            value = draw(st.sampled_from([0, 1, 2, -3, 0.0, 2.5, True]))
            steps.append((kind, i, value, draw(st.sampled_from(range(4)))))
        elif kind == "unary":
            steps.append((kind, i, draw(st.sampled_from(range(len(_UNARY))))))
        elif kind == "roll":
            steps.append((kind, i, draw(st.integers(-4, 4)), draw(st.sampled_from([0, 1, -1, (0, 1)]))))
        else:
            steps.append((kind, i, j))
    return steps


def _run(steps, x):
    pool = [x.reshape(3, 4), x.reshape(3, 4).t().contiguous()[:3, :3], x[:4].reshape(1, 4)]
    for step in steps:
        kind, i = step[0], step[1] % len(pool)
        a = pool[i]
        if kind == "binary":
            b = pool[step[2] % len(pool)]
            op = _BINARY[step[3]]
            try:
                torch.broadcast_shapes(a.shape, b.shape)
            except RuntimeError:
                b = b.sum()
            out = op(a, b)
        elif kind in ("scalar", "rscalar"):
            k = 2 if step[2] is True and step[3] in (1, 3) else step[3]  # no subtraction of, or division by, a bool
            op = (torch.add, torch.sub, torch.mul, torch.div)[k]
            v = step[2]
            out = op(a, v) if kind == "scalar" else (lambda: v + a, lambda: v - a, lambda: v * a, lambda: v / a)[k]()
        elif kind == "unary":
            out = _UNARY[step[2]](a)
        elif kind == "roll":
            dims = step[3]
            shifts = (step[2], -step[2]) if isinstance(dims, tuple) else step[2]
            if a.dim() < 2:
                dims, shifts = 0, step[2]
            out = torch.roll(a, shifts, dims)
        elif kind == "flip":
            out = torch.flip(a, (0,) if step[2] % 2 else (-1,))
        elif kind == "transpose":
            out = a.t() if a.dim() == 2 else a
        elif kind == "no_grad":
            with torch.no_grad():
                out = a * 2.0
        elif kind == "detach":
            out = a.detach()
        elif kind == "broadcast":
            out = a + a.sum(0, keepdim=True) * pool[step[2] % len(pool)].sum() if a.dim() == 2 else a
        elif kind == "inplace":
            out = a * 1.0
            out.add_(pool[0].sum())
        elif kind == "float32":
            out = a.float() * 2.0
        elif kind == "stack":
            b = pool[step[2] % len(pool)]
            dim = step[2] % 3 - 1
            out = torch.stack([a, b if b.shape == a.shape else a.detach() if step[2] % 2 else a], dim) \
                if dim <= a.dim() else torch.stack([a, a])
        elif kind == "clone":
            out = a.clone() if step[2] % 2 else a.clone(memory_format=torch.contiguous_format)
        else:  # an operand twice
            out = a * a + a
        pool.append(out)
    return pool


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_programs())
def test_random_programs_trace_alike_with_and_without_shortcuts(steps):
    x = torch.randn(12, dtype=torch.float64)
    with pytest.MonkeyPatch.context() as mp:
        fast = _facts(lambda x: _run(steps, x), x)
    with pytest.MonkeyPatch.context() as mp:
        _without_shortcuts(mp)
        slow = _facts(lambda x: _run(steps, x), x)
    assert fast == slow


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=_programs(), seed=st.integers(0, 2**31 - 1))
def test_random_programs_patterns_hold_the_dense_jacobian(steps, seed):
    """Soundness against PyTorch's own derivative at a random point (the shortcuts on)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(12, dtype=torch.float64, generator=g)

    def f(x):
        return torch.cat([t.double().reshape(-1) for t in _run(steps, x)])

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        P = jacobian_pattern(f, x).toarray()
    J = torch.autograd.functional.jacobian(f, x).numpy()
    assert not (np.isfinite(J) & (J != 0) & ~P).any()


# -- what each shortcut answers and declines --------------------------------------------------------

def test_the_brusselator_takes_both_shortcuts(monkeypatch):
    from asd.problems import brusselator, brusselator_input

    count = _Counting(monkeypatch)
    jacobian_pattern(brusselator(8), brusselator_input(8))
    # the input's clone and eight rolls; the two outputs stacked
    assert count.answered == {"pointwise": 23, "permuting": 9, "stacking": 1}


@pytest.mark.parametrize("case", ["local", "int", "complex", "mixed_dtype", "broadcast", "strided", "bool_scalar",
                                  "kwarg", "constant", "empty"])
def test_the_pointwise_shortcut_declines(monkeypatch, case):
    x = torch.randn(6, dtype=torch.float64)
    local = case == "local"
    fs = {
        "local": lambda x: x * x,
        "int": lambda x: (x > 0).long() * 2,
        "complex": lambda x: torch.view_as_complex(x.reshape(3, 2)) * 2.0,
        "mixed_dtype": lambda x: x * x.float(),
        "broadcast": lambda x: x.reshape(2, 3) * x[:3],
        "strided": lambda x: x.reshape(2, 3).t() * 2.0,
        "bool_scalar": lambda x: x * True,
        "kwarg": lambda x: torch.add(x, x, alpha=2.0),
        "constant": lambda x: x * torch.ones(6, dtype=torch.float64),
        "empty": lambda x: x[:0] * 2.0,
    }
    f = fs[case]
    count = _Counting(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fast = _facts(lambda x: [f(x)], x) if not local else None
        if local:
            jacobian_pattern(f, x, local=True)
    assert count.answered["pointwise"] == 0
    if fast is not None:
        _without_shortcuts(monkeypatch)
        assert _facts(lambda x: [f(x)], x) == fast


def test_a_user_rule_replaces_the_shortcut():
    """A rule registered for an op the shortcut serves is what the trace runs."""
    original = RULES[aten.mul.Tensor]

    def everything(call):
        from asd.detection.rules.fallback import conservative
        return conservative(call)

    x = torch.randn(4, dtype=torch.float64)
    assert jacobian_pattern(lambda x: x * x, x).nnz == 4
    try:
        register_rule(aten.mul.Tensor, everything, second_order="bilinear", override=True)
        assert jacobian_pattern(lambda x: x * x, x).nnz == 16
    finally:
        RULES[aten.mul.Tensor] = original
    assert jacobian_pattern(lambda x: x * x, x).nnz == 4


def test_a_tracer_observing_its_rules_takes_the_general_path(monkeypatch):
    """The Hessian tracer (and any tracer whose ``observe`` is replaced) sees every rule's result."""
    from asd.detection import hessian_pattern

    count = _Counting(monkeypatch)
    x = torch.randn(6, dtype=torch.float64)
    H = hessian_pattern(lambda x: (x * torch.roll(x, 1) + x.exp()).sum(), x).toarray()
    assert count.answered == {"pointwise": 0, "permuting": 0, "stacking": 0}
    expected = np.eye(6, dtype=bool) | np.roll(np.eye(6, dtype=bool), 1, 1) | np.roll(np.eye(6, dtype=bool), -1, 1)
    assert (H == expected).all()


def test_no_grad_operands_are_cut_on_the_shortcut(monkeypatch):
    count = _Counting(monkeypatch)
    x = torch.randn(5, dtype=torch.float64)

    def f(x):
        with torch.no_grad():
            c = x * 2.0
        return x + torch.roll(c, 1)

    P = jacobian_pattern(f, x).toarray()
    assert count.answered["pointwise"] >= 1 and count.answered["permuting"] == 2  # the roll, the input's clone
    assert (P == np.eye(5, dtype=bool)).all()


def test_roll_and_flip_rows_on_the_shortcut(monkeypatch):
    count = _Counting(monkeypatch)
    x = torch.randn(3, 4, dtype=torch.float64)
    for f in (lambda x: torch.roll(x, 1, 0), lambda x: torch.roll(x, (1, -2), (0, 1)), lambda x: torch.roll(x, 5),
              lambda x: torch.flip(x, (0, 1)), lambda x: x.roll(-1, 1)):
        P = jacobian_pattern(f, x).toarray()
        J = torch.autograd.functional.jacobian(f, x).reshape(12, 12).numpy() != 0
        assert (P == J).all()
    assert count.answered["permuting"] == 5 + 5  # and each input's clone


def test_roll_rows_are_found_once_per_shape_and_shift(monkeypatch):
    runs = []
    real = T._permutation_rows

    def counting(key, func, rest):
        if func is aten.roll.default:
            runs.append(M.remembered(("permuting", *key)) is None)
        return real(key, func, rest)

    monkeypatch.setattr(T, "_permutation_rows", counting)
    M.clear_memo()
    x = torch.rand(24, dtype=torch.float64)
    f = lambda x: torch.roll(x.reshape(6, 4), 1, 0) + torch.roll(x.reshape(6, 4), -2, 1)  # noqa: E731
    first = jacobian_pattern(f, x).toarray()
    again = jacobian_pattern(f, x).toarray()
    assert runs == [True, True, False, False] and (first == again).all()
    g = lambda x: torch.roll(x.reshape(4, 6), 1, 0)  # noqa: E731  (another shape: other rows)
    J = torch.autograd.functional.jacobian(g, x).reshape(24, 24).numpy() != 0
    assert (jacobian_pattern(g, x).toarray() == J).all() and runs[-1] is True


@pytest.mark.parametrize("f", [lambda x: torch.polygamma(-1, x), lambda x: torch.mvlgamma(x, -1)],
                         ids=["polygamma", "mvlgamma"])
def test_int_parameters_are_checked_as_pytorch_checks_them(monkeypatch, f):
    """An int parameter's range is checked by the op's meta kernel only: the shortcut leaves such
    ops to the general path, which raises as PyTorch does (it answered a diagonal pattern)."""
    count = _Counting(monkeypatch)
    x = torch.rand(2, 3, dtype=torch.float64) + 0.5
    with pytest.raises(RuntimeError):
        f(x)
    with pytest.raises(RuntimeError):
        jacobian_pattern(f, x)
    assert count.answered["pointwise"] == 0


def test_clear_cache_empties_the_rows_memo():
    import asd

    jacobian_pattern(lambda x: x.roll(1) * x.flip(0), torch.randn(5, dtype=torch.float64))
    assert any(key[0] == "permuting" for key in M._MEMO)
    asd.clear_cache()
    assert not M._MEMO and M._MEMO_SIZE[0] == 0 and not T._META_CACHE


def test_the_rows_memo_counts_each_entry_with_its_overhead(monkeypatch):
    """The rows are kept in the movement rule's memo, within its bounds: many tiny entries (a
    2-element tensor rolled by distinct shifts) are bounded by their count too, not only by their
    elements."""
    M.clear_memo()
    monkeypatch.setattr(M, "MEMO_TOTAL_ELEMENTS", 8 * 64)
    x = torch.randn(2, dtype=torch.float64)
    for k in range(200):
        jacobian_pattern(lambda x, k=k: x.roll(k), x)
        assert M._MEMO_SIZE[0] <= 8 * 64 and len(M._MEMO) <= 8 * 64 // 34 + 1
    rows = [r for v in M._MEMO.values() for r in v if r is not None]
    assert rows and not any(r.flags.writeable for r in rows)
