"""A fresh process: the first prepare and call of an operator need neither torch.func (whose first
use imports torch._dynamo) nor sympy; the first call runs plain autograd in the operator's AD mode,
the second torch.func, and both are right."""

import json
import subprocess
import sys
import textwrap

import pytest

_SCRIPT = textwrap.dedent("""
    import json, sys, warnings
    import torch
    import asd
    from asd.problems import brusselator, brusselator_input, rosenbrock

    warnings.filterwarnings("error", category=RuntimeWarning)  # no fallback, no dense warning
    case = sys.argv[1]
    if case.startswith("hessian"):
        if case == "hessian":  # few colors: double backward until the products are recorded
            f, x = rosenbrock, torch.rand(30, dtype=torch.float64)
        else:  # a dense 12 x 12 block, more colors: double backward for the first call only
            f, x = lambda v: v[:12].sum() ** 2 + (v ** 4).sum(), torch.rand(30, dtype=torch.float64)
        opts = dict(coloring="acyclic") if case == "hessian_many_colors" else {}
        op = asd.prepare_hessian(f, x, **opts)
        ref = lambda z: torch.func.hessian(f)(z)
    else:
        f, x = brusselator(6), brusselator_input(6)
        op = asd.prepare_jacobian(f, x, mode=case)
        ref = lambda z: torch.func.jacrev(f)(z)
    first = op(x).to_dense()
    cold = {m: m in sys.modules for m in ("torch._dynamo", "sympy")}
    x2 = x + 0.1
    second = op(x2).to_dense()
    out = dict(cold=cold, warm_dynamo="torch._dynamo" in sys.modules,
               err1=float((first - ref(x)).abs().max()), err2=float((second - ref(x2)).abs().max()),
               strategy=op.strategy, ncolors=op.ncolors)
    print(json.dumps(out))
""")


# a fresh process each (10-15 s): the default suite keeps reverse mode and the many-color Hessian
@pytest.mark.parametrize("case", ["reverse", pytest.param("forward", marks=pytest.mark.slow),
                                  pytest.param("hessian", marks=pytest.mark.slow), "hessian_many_colors"])
def test_first_call_in_a_fresh_process_needs_neither_torch_func_nor_sympy(case, tmp_path):
    """Forward mode is the exception: PyTorch's forward AD runs Python reference kernels whose
    first call imports torch._dynamo, so its first call is just right."""
    script = tmp_path / "cold.py"
    script.write_text(_SCRIPT)
    run = subprocess.run([sys.executable, str(script), case], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    if case != "forward":
        assert out["cold"] == {"torch._dynamo": False, "sympy": False}
    assert out["err1"] < 1e-10 and out["err2"] < 1e-10
    if case != "hessian":  # few-color Hessians keep double backward until recorded
        assert out["warm_dynamo"]  # the second call ran torch.func
    if case == "hessian_many_colors":
        assert out["ncolors"] > 8


def test_a_custom_function_without_vmap_rule_in_a_fresh_process(tmp_path):
    """The first call (plain autograd) succeeds; the second (torch.func) cannot evaluate it and
    falls back to the autograd loop with a warning, and stays right."""
    script = tmp_path / "custom.py"
    script.write_text(textwrap.dedent("""
        import json, warnings
        import torch
        import asd

        class Cube(torch.autograd.Function):
            @staticmethod
            def forward(ctx, x):
                ctx.save_for_backward(x)
                return x ** 3

            @staticmethod
            def backward(ctx, g):
                (x,) = ctx.saved_tensors
                return 3 * x ** 2 * g

        f = lambda x: Cube.apply(x[1:]) + x[:-1]
        x = torch.rand(7, dtype=torch.float64)
        ref = torch.autograd.functional.jacobian(f, x)
        op = asd.prepare_jacobian(f, x)
        with warnings.catch_warnings(record=True) as w1:
            warnings.simplefilter("always")
            J1 = op(x).to_dense()
        with warnings.catch_warnings(record=True) as w2:
            warnings.simplefilter("always")
            J2 = op(x).to_dense()
        print(json.dumps(dict(e1=float((J1 - ref).abs().max()), e2=float((J2 - ref).abs().max()),
                              w1=[str(w.message) for w in w1 if "asd" in str(w.message)],
                              w2=[str(w.message) for w in w2 if "asd" in str(w.message)], strategy=op.strategy)))
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["e1"] < 1e-12 and out["e2"] < 1e-12
    assert not out["w1"] and any("cannot evaluate" in m for m in out["w2"])
    assert out["strategy"] == "autograd loop"


def test_one_off_calls_import_torch_func_once_the_loop_has_cost_as_much(tmp_path):
    """Ski rental: each one-off in a process where torch.func is cold evaluates with the autograd
    loop until the loop's evaluations have taken COLD_LOOP_SECONDS; the next one imports
    torch._dynamo and runs torch.func's batched products. Every result is right on both sides."""
    script = tmp_path / "rent.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import torch
        import asd
        import asd.operators as O
        from asd.problems import brusselator, brusselator_input

        f = brusselator(6)
        asd.sparse_jacobian(f, brusselator_input(6, seed=400), cache=False)  # the process's own first-call costs
        O.COLD_LOOP_SECONDS = O._ColdLoopTime.seconds + 0.05
        xs, Js, cold = [], [], []
        for k in range(400):
            x = brusselator_input(6, seed=k)
            xs.append(x)
            Js.append(asd.sparse_jacobian(f, x, cache=False).to_dense())
            cold.append("torch._dynamo" not in sys.modules)
            if not cold[-1]:
                break
        spent = O._ColdLoopTime.seconds - (O.COLD_LOOP_SECONDS - 0.05)
        err = max(float((J - torch.func.jacrev(f)(x)).abs().max()) for J, x in zip(Js, xs))
        print(json.dumps(dict(cold=cold, spent=spent, err=err)))
    """))
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    cold = out["cold"]
    assert cold[0] and not cold[-1] and cold.index(False) == len(cold) - 1 >= 1
    assert 0.05 <= out["spent"] < 5  # the loop stopped once it had cost the limit (one call's time past it)
    assert out["err"] < 1e-12
