"""The guard of traced graphs (asd.cache.ValueGuard): its cheap revalidation answers what a full
value fingerprint answers after any change of what the function reads, and the value fingerprint
sees every value a traced graph bakes in (or says it is incomplete, and tracing is not used)."""

import random
import types

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import asd
from asd.cache import ValueGuard, fingerprint, value_fingerprint

SCALE = 2.0
DEEP = 3.0  # read only inside a comprehension of f
TABLE = [1, 2]


def _make():
    """A function reading closure cells (a number, a nested function, a tensor, a namespace), globals
    (directly and from a comprehension), defaults, keyword defaults and a function attribute, and
    the mutations a program can make to each."""
    w = torch.ones(3, dtype=torch.float64)
    k = 3
    holder = types.SimpleNamespace(s=2.0)
    knob = holder

    def inner(z):
        return z * k * inner.gain

    inner.gain = 1.0

    def f(x, c=1.5, *, d=1.0):
        return inner(x) * w * SCALE * c * d * knob.s * sum(DEEP for _ in range(1))

    def rebind_k_equal():
        nonlocal k
        k = int("3")  # an equal value, maybe another object

    def rebind_k():
        nonlocal k
        try:
            k = k + 1
        except NameError:  # emptied before
            k = 4

    def empty_k():
        nonlocal k
        try:
            del k
        except NameError:
            pass

    def fill_k():
        nonlocal k
        k = 3

    def rebind_w():
        nonlocal w
        w = torch.ones(3, dtype=torch.float64)

    def resize_w():
        w.resize_(w.numel() + 1)

    def write_w():
        w.mul_(2.0)  # float values are not part of the summary (a recording refuses reading them as numbers)

    def new_inner():
        nonlocal inner

        def inner(z):  # noqa: F811
            return z - k

    def gain():
        inner.gain = getattr(inner, "gain", 1.0) + 1.0

    def defaults():
        f.__defaults__ = (2.5,)

    def kwdefaults():
        f.__kwdefaults__["d"] = f.__kwdefaults__["d"] + 1.0

    def code():
        f.__code__ = (lambda x, c=1.5, *, d=1.0: inner(x) * w * SCALE * c * d * knob.s * 1.0).__code__

    def global_scale():
        global SCALE
        SCALE = SCALE + 1.0

    def global_deep():
        global DEEP
        DEEP = DEEP + 1.0

    def attribute():
        holder.s = holder.s + 1.0

    def to_random():
        nonlocal knob
        knob = random  # a module with hidden state: incomplete

    def to_holder():
        nonlocal knob
        knob = holder

    def global_table():
        TABLE.append(3)

    def read_table():
        f.__code__ = (lambda x, c=1.5, *, d=1.0: inner(x) * w * SCALE * c * d * knob.s * len(TABLE)).__code__

    def add_global():
        f.__globals__["inner_extra"] = 1.0

    mutations = [rebind_k_equal, rebind_k, empty_k, fill_k, rebind_w, resize_w, write_w, new_inner, gain, defaults,
                 kwdefaults, code, global_scale, global_deep, attribute, to_random, to_holder, global_table,
                 read_table, add_global]
    return f, mutations


NMUTATIONS = len(_make()[1])
# change nothing f's summary reads (fill_k and to_holder restore what empty_k and to_random change)
UNSEEN = ("rebind_k_equal", "write_w", "add_global", "global_table", "fill_k", "to_holder")


@pytest.fixture(autouse=True)
def _globals_restored():
    global SCALE, DEEP
    saved = SCALE, DEEP, list(TABLE)
    yield
    SCALE, DEEP = saved[:2]
    TABLE[:] = saved[2]
    globals().pop("inner_extra", None)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, NMUTATIONS - 1), max_size=8), st.booleans())
def test_the_guard_answers_what_a_full_fingerprint_answers(steps, extra_args):
    f, mutations = _make()
    args = (torch.zeros(2, dtype=torch.int64),) if extra_args else ()
    guard = ValueGuard()
    assert guard((f, args)) == value_fingerprint((f, args))
    for i in steps:
        mutations[i]()
        got = guard((f, args))
        assert got == value_fingerprint((f, args)), mutations[i].__name__
        assert guard((f, args)) == got  # asked again, unchanged


@pytest.mark.parametrize("i", range(NMUTATIONS))
def test_each_change_of_what_f_reads_is_seen_after_revalidated_calls(i):
    f, mutations = _make()
    guard = ValueGuard()
    before = guard((f, ()))
    assert before[1] and guard((f, ())) == before  # complete, and revalidated
    mutations[i]()
    assert (guard((f, ())) != before) == (mutations[i].__name__ not in UNSEEN), mutations[i].__name__


def test_replacing_f_or_its_arguments_is_seen():
    f = lambda x: x * 2.0  # noqa: E731
    g = lambda x: x * 3.0  # noqa: E731
    guard = ValueGuard()
    a = (torch.zeros(2),)
    first = guard((f, a))
    assert guard((g, a)) == value_fingerprint((g, a)) != first
    b = (torch.zeros(3),)
    assert guard((f, b)) == value_fingerprint((f, b)) != first


def test_a_global_defined_after_the_first_call_is_seen():
    code = "def f(x):\n    return x * sum(LATE for _ in range(1)) if 'LATE' in globals() else x\n"
    namespace = {}
    exec(code, namespace)  # a function of another globals dict
    f = namespace["f"]
    guard = ValueGuard()
    first = guard((f, ()))
    namespace["LATE"] = 2.0
    assert guard((f, ())) == value_fingerprint((f, ())) != first


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


def test_equal_values_of_another_type_or_sign_differ():
    """1 == 1.0 == True and 0.0 == -0.0, but a graph that baked one in computes something else
    with the other (integer arithmetic, the sign of an infinity)."""
    for a, b in [(1, 1.0), (1, True), (0.0, -0.0), (2.0, np.float64(2.0))]:
        assert value_fingerprint((a,)) != value_fingerprint((b,)), (a, b)


BIG = list(range(300))  # past the 256 items a summary reads


def test_hidden_state_makes_the_summary_incomplete():
    cfg = {"s": 2.0}
    get = cfg.get
    for f in (lambda x: x * get("s"), lambda x: x * random.random(), lambda x: x * BIG[299]):
        assert not value_fingerprint((f, ()))[1]
    assert value_fingerprint((lambda x: x * 2.0, ()))[1]


def test_hashing_an_index_tensor_leaves_it_resizable():
    """The summary hashes a small integer tensor by content: through a copy, numpy() on the
    caller's own storage makes it non-resizable for good (and a later resize_ corrupts memory)."""
    idx = torch.arange(4)
    fingerprint(lambda x: x[idx])
    value_fingerprint((lambda x: x[idx],))
    idx.resize_(1000)
    idx.fill_(1)
    assert int(idx.sum()) == 1000


def _tracing(op):
    state = op.state
    return (getattr(state, "fused", None) or state.products).tracing


def _traced(f):
    """``(op, x, tracing)``: an operator of ``f`` whose products run as a recorded graph."""
    x = torch.rand(12, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    for _ in range(60):
        op(x)
    tracing = _tracing(op)
    assert tracing.graphs and not tracing.disabled
    return op, x, tracing


class Gain:
    s = 2.0


def _comprehension_global(x):
    return torch.stack([x[i] * x[i] * SCALE for i in range(x.numel())])


@pytest.mark.parametrize("case", ["closure", "comprehension"])
def test_a_traced_operator_sees_a_changed_value_after_many_calls(case):
    """End to end: after 60 calls the products run as a recorded graph with the scalar baked in;
    changing the scalar (rebinding a closure cell, a global read only inside a comprehension:
    unseen before, a wrong Jacobian) records the graph again."""
    global SCALE
    scale = 2.0

    def lap(w):
        return torch.roll(w, 1) - 2 * w + torch.roll(w, -1)

    def closure(x):
        return x * x * scale + lap(x)

    f = {"closure": closure, "comprehension": _comprehension_global}[case]
    op, x, tracing = _traced(f)
    if case == "closure":
        scale = 3.0
    else:
        SCALE = 3.0
    for _ in range(3):
        torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    assert tracing.misses == 1


class Net(torch.nn.Module):
    def forward(self, z):
        return torch.sin(z) * SCALE


class Config:
    s = 2.0


CONFIG = Config()
BOX = types.SimpleNamespace(w=torch.tensor(2.0, dtype=torch.float64), v=torch.tensor([2.0], dtype=torch.float64),
                            big=torch.full((40,), 2.0, dtype=torch.float64))
TAGGED = torch.ones(12, dtype=torch.float64)
TAGGED.scale = 2.0


class Settings(dict):
    pass


SETTINGS = Settings()
SETTINGS.scale = 2.0


def _hidden_cases():
    """(f, change): values a recorded graph would keep that no name list of f shows (each gave a
    wrong Jacobian before: the summary stayed equal and complete)."""
    net = Net()

    def set_scale(v):
        global SCALE
        SCALE = v

    def set_default_dtype(_):
        torch.set_default_dtype(torch.float64)

    return {
        "class attribute": (lambda z: z * z * Gain.s, lambda: setattr(Gain, "s", 3.0)),
        "instance's class attribute": (lambda z: z * z * CONFIG.s, lambda: setattr(Config, "s", 3.0)),
        "module forward reads a global": (lambda z: net(z) * z, lambda: set_scale(3.0)),
        "module as f": (net, lambda: set_scale(3.0)),
        "globals()": (lambda z: z * z * globals()["SCALE"], lambda: set_scale(3.0)),
        "import inside f": (_imports_inside, lambda: set_scale(3.0)),
        "item()": (lambda z: z * z * BOX.w.item(), lambda: BOX.w.fill_(3.0)),
        "tolist()": (lambda z: z * z * BOX.v.tolist()[0], lambda: BOX.v.fill_(3.0)),
        "tolist() of a large tensor": (lambda z: z * z * BOX.big.tolist()[3], lambda: BOX.big.fill_(3.0)),
        "np.asarray": (lambda z: z * z * float(np.asarray(BOX.big)[5]), lambda: BOX.big.fill_(3.0)),
        "write through .data": (lambda z: z * z * BOX.v.tolist()[0], lambda: BOX.v.data.fill_(3.0)),
        "tensor attribute": (lambda z: z * TAGGED * TAGGED.scale, lambda: setattr(TAGGED, "scale", 3.0)),
        "dict subclass attribute": (lambda z: z * z * SETTINGS.scale, lambda: setattr(SETTINGS, "scale", 3.0)),
        "default dtype": (lambda z: z * torch.tensor(0.1), lambda: set_default_dtype(None)),
    }


def _imports_inside(z):
    from test_value_guard import SCALE as s

    return z * z * s


@pytest.mark.parametrize("case", list(_hidden_cases()))
def test_values_no_name_shows_are_not_kept_by_a_recorded_graph(case):
    global SCALE
    f, change = _hidden_cases()[case]
    x = torch.rand(12, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    try:
        for _ in range(60):
            op(x)
        change()
        torch.testing.assert_close(op(x).to_dense(), torch.autograd.functional.jacobian(f, x))
    finally:
        SCALE = 2.0
        Gain.s = Config.s = 2.0
        BOX.w.fill_(2.0)
        BOX.v.fill_(2.0)
        BOX.big.fill_(2.0)
        TAGGED.scale = SETTINGS.scale = 2.0
        torch.set_default_dtype(torch.float32)


def test_a_bound_builtin_keeps_the_operator_off_traced_graphs():
    cfg = {"s": 2.0}
    get = cfg.get

    def f(x):
        return x * x * get("s")

    x = torch.rand(8, dtype=torch.float64)
    op = asd.prepare_jacobian(f, x)
    for _ in range(60):
        op(x)
    cfg["s"] = 5.0
    torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    assert not _tracing(op).graphs


def test_a_training_loop_keeps_its_traced_graph():
    """Parameters updated in place (an optimizer step) are read by reference: the recorded graph
    stays in use and follows them (a small bias's version counter once dropped it after two steps)."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(12, 8), torch.nn.Tanh(), torch.nn.Linear(8, 12)).double()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    f = lambda z: net(z)  # noqa: E731
    op, x, tracing = _traced(f)
    for _ in range(4):
        opt.zero_grad()
        net(torch.rand(12, dtype=torch.float64)).pow(2).sum().backward()
        opt.step()
        with torch.no_grad():
            torch.testing.assert_close(op(x).to_dense(), torch.func.jacrev(f)(x))
    assert tracing.graphs and not tracing.disabled and tracing.misses == 0
