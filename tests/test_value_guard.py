"""The guard of traced graphs (asd.cache.ValueGuard): its cheap revalidation answers what a full
value fingerprint answers, after any change of what the function reads."""

import types

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import asd
from asd.cache import ValueGuard, value_fingerprint

SCALE = 2.0
TABLE = [1, 2]


def _make():
    """A function reading closure cells (a number, a nested function, a tensor), globals (a float
    and a list) and defaults, and the mutations a program can make to each."""
    state = {}
    w = torch.ones(3, dtype=torch.float64)
    k = 3

    def inner(z):
        return z * k

    def f(x, c=1.5):
        return inner(x) * w * SCALE * c

    def rebind_k_equal():
        nonlocal k
        k = int("3")  # an equal value, maybe another object

    def rebind_k():
        nonlocal k
        k = k + 1

    def rebind_w():
        nonlocal w
        w = torch.ones(3, dtype=torch.float64)

    def resize_w():
        w.resize_(w.numel() + 1)

    def write_w():
        w.mul_(2.0)  # float values are not part of the summary; the version counter is not read

    def new_inner():
        nonlocal inner

        def inner(z):  # noqa: F811
            return z - k

    def defaults():
        f.__defaults__ = (2.5,)

    def code():
        f.__code__ = (lambda x, c=1.5: inner(x) * w * SCALE * c * 1.0).__code__

    def global_scale():
        global SCALE
        SCALE = SCALE + 1.0

    def global_table():
        TABLE.append(3)

    def read_table():
        f.__code__ = (lambda x, c=1.5: inner(x) * w * SCALE * c * len(TABLE)).__code__

    def add_global():
        f.__globals__["inner_extra"] = 1.0

    mutations = [rebind_k_equal, rebind_k, rebind_w, resize_w, write_w, new_inner, defaults, code, global_scale,
                 global_table, read_table, add_global]
    state["f"] = f
    return f, mutations


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 11), max_size=8), st.booleans())
def test_the_guard_answers_what_a_full_fingerprint_answers(steps, extra_args):
    global SCALE
    saved_scale, saved_table = SCALE, list(TABLE)
    try:
        f, mutations = _make()
        args = (torch.zeros(2, dtype=torch.int64),) if extra_args else ()
        guard = ValueGuard()
        assert guard((f, args)) == value_fingerprint((f, args))
        for i in steps:
            mutations[i]()
            got = guard((f, args))
            assert got == value_fingerprint((f, args)), mutations[i].__name__
            assert guard((f, args)) == got  # asked again, unchanged
    finally:
        SCALE = saved_scale
        TABLE[:] = saved_table
        globals().pop("inner_extra", None)


def test_each_change_of_what_f_reads_is_seen_after_revalidated_calls():
    global SCALE
    saved_scale, saved_table = SCALE, list(TABLE)
    try:
        for i in range(12):
            f, mutations = _make()
            guard = ValueGuard()
            before = guard((f, ()))
            assert guard((f, ())) == before  # revalidated
            mutations[i]()
            seen = guard((f, ())) != before
            assert seen == (mutations[i].__name__ not in ("rebind_k_equal", "write_w", "add_global", "global_table")), \
                mutations[i].__name__
    finally:
        SCALE = saved_scale
        TABLE[:] = saved_table
        globals().pop("inner_extra", None)


def test_new_objects_in_the_arguments_are_summarized_again():
    f = lambda x: x * 2.0  # noqa: E731
    guard = ValueGuard()
    a = (torch.zeros(2),)
    first = guard((f, a))
    b = (torch.zeros(3),)
    assert guard((f, b)) == value_fingerprint((f, b)) != first


def test_mutable_objects_are_summarized_on_every_call():
    cfg = {"n": 2}
    f = lambda x: x * cfg["n"]  # noqa: E731
    guard = ValueGuard()
    first = guard((f, ()))
    cfg["n"] = 3.5
    assert guard((f, ())) == value_fingerprint((f, ())) != first
    arr = np.arange(4)
    g = lambda x: x[arr]  # noqa: E731
    first = guard((g, ()))
    arr[0] = 3
    assert guard((g, ())) == value_fingerprint((g, ())) != first


def test_a_prepared_operator_sees_a_rebound_closure_value_after_many_calls():
    """End to end: the revalidated guard still re-records the traced graph when a scalar that the
    graph baked in is rebound (the B1-like closure: numbers and a nested function)."""
    scale = 2.0

    def lap(w):
        return torch.roll(w, 1) - 2 * w + torch.roll(w, -1)

    def f(x):
        return x * x * scale + lap(x)

    x = torch.rand(40, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    for _ in range(60):
        op(x)
    for value in (3.0, -1.0):
        scale = value
        for _ in range(3):
            torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    assert isinstance(f, types.FunctionType)
