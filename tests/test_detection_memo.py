"""The tracer's fast paths: the memo of data-movement and view ops run on ids, the per-op facts, the
schema binding and the flattening of plain calls. Each must give what the plain path gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._pytree import tree_flatten

import asd
from asd.detection import jacobian_pattern
from asd.detection import _core
from asd.detection import torch_tracer as T
from asd.detection.rules import movement as M

aten = torch.ops.aten


def _dense(P):
    return P.toarray()


class _Forgetful(dict):
    def get(self, key, default=None):
        return None


def _reference(f, x):
    """The pattern without the memo (every op run on ids afresh)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(M, "_MEMO", _Forgetful())
        return jacobian_pattern(f, x)


FUNCTIONS = {
    "roll": lambda x: torch.roll(x.reshape(6, 4), 1, 0) + torch.roll(x.reshape(6, 4), -2, 1),
    "roll other shift": lambda x: torch.roll(x.reshape(6, 4), 2, 0) * torch.roll(x.reshape(6, 4), (1, 1), (0, 1)),
    "flip, cat, stack": lambda x: torch.stack([x.flip(0), torch.cat([x[3:], x[:3]])]),
    "cat with a constant": lambda x: torch.cat([x, torch.ones(3, dtype=x.dtype)]) * 2,
    "repeat, tile": lambda x: x.reshape(4, 6).repeat(2, 1).sum(0) + x.reshape(4, 6).tile(1, 2)[0, :6],
    "views": lambda x: x.reshape(4, 6).t().reshape(-1) + x.reshape(2, 12).transpose(0, 1).reshape(-1),
    "unbind, split": lambda x: torch.stack([*x.reshape(3, 8).unbind(0)]).sum(0) * x.split(8)[1],
    "index_select": lambda x: x.index_select(0, torch.tensor([5, 1, 1, 0])),
    "index_select other": lambda x: x.index_select(0, torch.tensor([2, 3, 4, 23])),
    "diag_embed, tril": lambda x: torch.tril(x[:4].diag_embed()).reshape(-1),
    "pad": lambda x: torch.nn.functional.pad(x.reshape(4, 6), (1, 2, 0, 1)).reshape(-1),
    "narrow": lambda x: x.narrow(0, 3, 5) + x.narrow(0, 4, 5),
}


@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_memoized_movement_gives_the_plain_pattern(name):
    f = FUNCTIONS[name]
    x = torch.rand(24, dtype=torch.float64)
    want = _reference(f, x)
    for _ in range(3):  # filling the memo, then reading it
        got = jacobian_pattern(f, x)
        assert np.array_equal(_dense(got), _dense(want))
    ref = (torch.func.jacrev(f)(x).reshape(-1, 24) != 0).numpy()
    assert not (ref & ~_dense(want)).any()


def test_a_repeated_trace_runs_no_op_on_ids_again(monkeypatch):
    calls = []
    real = M._id_call
    monkeypatch.setattr(M, "_id_call", lambda call, *a, **k: calls.append(call.func) or real(call, *a, **k))
    f = FUNCTIONS["repeat, tile"]
    x = torch.rand(24, dtype=torch.float64)
    first = jacobian_pattern(f, x)
    assert calls.count(aten.repeat.default) == 2
    again = jacobian_pattern(f, x)
    assert calls.count(aten.repeat.default) == 2 and np.array_equal(_dense(first), _dense(again))


def test_the_memo_key_holds_what_the_id_run_reads():
    """Two calls of one op that differ only in a shift, a dtype of the shift, the operand's shape or
    whether an operand carries sets have different rows; an index tensor is never memoized."""
    x = torch.rand(24, dtype=torch.float64)
    pats = [jacobian_pattern(f, x) for f in (
        lambda z: torch.roll(z, 1), lambda z: torch.roll(z, 2), lambda z: torch.roll(z.reshape(4, 6), 1, 1),
        lambda z: torch.roll(z.reshape(6, 4), 1, 1))]
    for i, P in enumerate(pats):
        for Q in pats[i + 1:]:
            assert not np.array_equal(_dense(P), _dense(Q))
    c = torch.arange(24, dtype=torch.float64)
    one = jacobian_pattern(lambda z: torch.cat([z, c]), x)
    both = jacobian_pattern(lambda z: torch.cat([z, z]), x)
    assert one.nnz == 24 and both.nnz == 48
    a = jacobian_pattern(lambda z: z.index_select(0, torch.tensor([0, 1])), x)
    b = jacobian_pattern(lambda z: z.index_select(0, torch.tensor([2, 3])), x)
    assert a.indices.tolist() == [0, 1] and b.indices.tolist() == [2, 3]
    assert not any(key[0] is aten.index_select.default for key in M._MEMO)


def test_memoized_rows_are_read_only_and_bounded(monkeypatch):
    # a roll of a transposed view: the general path (a contiguous operand takes the tracer's shortcut)
    x = torch.rand(24, dtype=torch.float64)
    monkeypatch.setattr(T, "_PERMUTING", frozenset())
    jacobian_pattern(lambda z: torch.roll(z, 3), x)
    rows = [r for v in M._MEMO.values() for r in v if r is not None]
    assert rows and not any(r.flags.writeable for r in rows)
    M.clear_memo()
    monkeypatch.setattr(M, "MEMO_MAX_ELEMENTS", 10)
    jacobian_pattern(lambda z: torch.roll(z, 3), x)
    assert not M._MEMO  # 24 rows: more than one entry may hold
    monkeypatch.setattr(M, "MEMO_MAX_ELEMENTS", 100)
    monkeypatch.setattr(M, "MEMO_TOTAL_ELEMENTS", 60)
    for k in range(1, 5):
        jacobian_pattern(lambda z, k=k: torch.roll(z, k), x)
        assert M._MEMO_SIZE[0] <= 60
    asd.clear_cache()
    assert not M._MEMO and M._MEMO_SIZE[0] == 0


def test_brusselator_repeated_detection_is_exact():
    from asd.problems import brusselator, brusselator_input

    f, x = brusselator(8), brusselator_input(8)
    want = _reference(f, x)
    for _ in range(2):
        assert np.array_equal(_dense(jacobian_pattern(f, x)), _dense(want))
    J = torch.func.jacrev(f)(x) != 0
    assert np.array_equal(J.numpy(), _dense(want))


OPS = [aten.add.Tensor, aten.add_.Tensor, aten.roll.default, aten.view.default, aten.unbind.int, aten.detach.default,
       aten._local_scalar_dense.default, aten.to_sparse.default, aten.squeeze_.dim, aten.native_batch_norm.default,
       aten.bernoulli.default, aten.copy_.default, aten.split.Tensor]


@pytest.mark.parametrize("op", OPS, ids=str)
def test_op_facts_are_the_schema_and_tags(op):
    facts = T.op_facts(op)
    assert T.op_facts(op) is facts and facts.func is op
    schema = op._schema
    fresh = not any(r.alias_info is not None for r in schema.returns)
    assert facts.scalar == (op in T._SCALAR_OPS)
    assert facts.detach == (op is aten.detach.default)
    assert facts.to_sparse == op.__name__.lstrip("_").startswith("to_sparse")
    assert facts.decomposable == (not schema.is_mutable and fresh)
    assert facts.mutated == T._mutated_args(op)
    assert facts.stat_update == (op in T._STAT_UPDATES)
    assert facts.aliases == T.alias_of_returns(op)
    assert facts.aliasing == any(a is not None for a, _ in facts.aliases)
    assert facts.memoizable == (fresh and torch.Tag.nondeterministic_seeded not in op.tags)
    assert facts.inplace_view == (torch.Tag.inplace_view in op.tags)
    assert facts.qualname == op.overloadpacket._qualified_op_name


def _bind_reference(func, args, kwargs):
    out = {}
    for i, a in enumerate(func._schema.arguments):
        if i < len(args) and not a.kwarg_only:
            out[a.name] = args[i]
        elif a.name in kwargs:
            out[a.name] = kwargs[a.name]
        elif a.has_default_value():
            out[a.name] = a.default_value
        else:
            out[a.name] = None
    return out


@pytest.mark.parametrize("func, args, kwargs", [
    (aten.add.Tensor, (1, 2), {}), (aten.add.Tensor, (1, 2), {"alpha": 3}), (aten.sum.dim_IntList, (1, [0]), {}),
    (aten.sum.dim_IntList, (1,), {"dim": [0], "keepdim": True}), (aten.roll.default, (1, [1]), {}),
    (aten.std.correction, (1,), {}), (aten.max_pool2d.default, (1, [2, 2]), {}),
])
def test_bind_with_the_schema_read_once_binds_as_the_schema(func, args, kwargs):
    assert _core.bind(func, args, kwargs) == _bind_reference(func, args, kwargs)


def test_bind_hands_out_a_fresh_list_default_each_time():
    """A default list (``roll``'s ``dims=[]``) read once from the schema: a rule that changes the
    list it is handed must not change the next call's default."""
    b = _core.bind(aten.roll.default, (1, [1]), {})
    assert b["dims"] == []
    b["dims"].append(7)
    assert _core.bind(aten.roll.default, (1, [1]), {})["dims"] == []


@pytest.mark.parametrize("args, kwargs", [
    ((torch.ones(2), 2.0), {}), ((torch.ones(2), torch.ones(2), 1), {}), ((), {}), ((torch.ones(1), None, True), {}),
    ((torch.ones(2), [1, 2]), {}), ((torch.ones(2),), {"alpha": 2}), (([torch.ones(1), torch.ones(1)], 0), {}),
])
def test_flattening_a_plain_call_equals_the_generic_flattening(args, kwargs):
    flat, spec = T._flatten_call(args, kwargs)
    gflat, gspec = T._flatten((args, kwargs))
    assert len(flat) == len(gflat) and all(a is b for a, b in zip(flat, gflat))
    assert spec == gspec and hash(spec) == hash(gspec)  # the meta memo's keys are shared
    for rebuilt in (T._unflatten(flat, spec), T._unflatten(gflat, gspec)):
        leaves, structure = tree_flatten(rebuilt)
        assert structure == tree_flatten((args, kwargs))[1]
        assert all(a is b for a, b in zip(leaves, tree_flatten((args, kwargs))[0]))


def test_a_single_tensor_flattens_as_a_leaf():
    t = torch.ones(3)
    leaves, spec = T._flatten(t)
    assert leaves == [t] and spec == T._Spec((T._flat_into(t, []),)) and T._unflatten([t], spec) is t
