"""asd on a CUDA GPU: B1 (Brusselator Jacobian) and B3 (chained Rosenbrock Hessian), against the
same operators on the machine's CPU and against asdex's jitted call on the same GPU.

Every figure is a warm median (asd.timing, one policy), each GPU call timed to its completion
(``torch.cuda.synchronize``). Variants on the GPU: the eager prepared call, ``compile=True`` and
``compile="reduce-overhead"`` (the compiled products replayed as a CUDA graph). The CPU figures
use the machine's default number of threads. Every variant's values are compared with the eager
GPU operator's, and the eager GPU operator's with the CPU's (tests/test_gpu.py checks both against
dense AD). Writes benchmarks/results/gpu.json (``--out`` elsewhere).

Run on a machine with a GPU: ``python benchmarks/gpu.py`` (asdex runs in ``$ASD_JAX_PYTHON``, or
this interpreter when it has JAX).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from harness import settle  # noqa: E402  (puts the checkout's root on sys.path)

import asd  # noqa: E402
from asd.problems import brusselator, brusselator_input  # noqa: E402
from asd.timing import Policy, fmt_seconds, measure, once  # noqa: E402

POLICY = Policy(warmup=3, repeat=15, min_time=0.01, budget=3.0)
#: where the "GPU" figures are taken (a dry run of this script on a machine without one: cpu)
DEVICE = os.environ.get("ASD_BENCH_GPU_DEVICE", "cuda")


def rosenbrock(x):
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


def _sync(fn):
    def call():
        out = fn()
        if DEVICE == "cuda":
            torch.cuda.synchronize()
        return out

    return call


def _err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.values().double().cpu() - b.values().double().cpu()).abs().max() /
                 b.values().double().abs().max().cpu().clamp_min(1e-300))


def _asdex(problem: str, size: int, timeout: float) -> dict:
    python = os.environ.get("ASD_JAX_PYTHON") or sys.executable
    env = dict(os.environ, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    cmd = [python, os.path.join(HERE, "_asdex_runner.py"), problem, str(size), json.dumps(POLICY.to_json()), "call"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return dict(error=f"timed out after {timeout} s")
    if p.returncode != 0:
        return dict(error=(p.stderr.strip().splitlines() or ["failed"])[-1][:300])
    return json.loads(p.stdout.strip().splitlines()[-1])


def _step(name: str, what: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {what}", file=sys.stderr, flush=True)


def case(name: str, prepare, f, x_cpu: torch.Tensor, *, cpu_compile: bool, peer: tuple | None,
         timeout: float) -> dict:
    row: dict = dict(problem=name, n=x_cpu.numel())
    _step(name, "prepare on the GPU")
    x = x_cpu.to(DEVICE)
    t, J = once(lambda: _sync(lambda: prepare(f, x))())
    row["prepare_gpu"] = t
    row["nnz"], row["colors"] = int(J.pattern.nnz), J.ncolors
    ops = {"eager": J}
    for label, compile in (("compiled", True), ("cuda_graph", "reduce-overhead")):
        _step(name, f"prepare and first call, {label}")
        try:
            t, op = once(lambda: prepare(f, x, compile=compile))
            t1, _ = once(_sync(lambda: op(x)))
            row[f"{label}_prepare_and_first_call"] = t + t1
            ops[label] = op
        except Exception as exc:  # noqa: BLE001 - reported, not fatal
            row[f"{label}_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    ref = J(x)
    # each variant is compared at a point other than the one it was captured or compiled at
    x2 = x * 0.75 + 0.1
    ref2 = J(x2)
    times = {}
    for label, op in ops.items():
        _step(name, f"time {label}")
        row[f"{label}_first_calls"] = settle(_sync(lambda: op(x)))  # the steady state is measured next
        times[f"gpu_{label}"] = measure(_sync(lambda: op(x)), POLICY).median
        if label != "eager":
            row[f"{label}_rel_err"] = max(_err(op(x2), ref2), _err(op(x), ref))
            tr = (getattr(op.state, "fused", None) or getattr(op.state, "products", None))
            tracing = getattr(tr, "tracing", None)
            if tracing is not None:
                row[f"{label}_graph"] = type(next(iter(tracing.graphs.values()), None)).__name__
                row[f"{label}_cuda_graph_error"] = tracing.cuda_graph_error
                row[f"{label}_tracing_error"] = tracing.error
    _step(name, "one-off on the GPU")
    times["gpu_oneoff"] = measure(_sync(lambda: (asd.sparse_jacobian if "B1" in name else asd.sparse_hessian)(
        f, x, cache=False)), Policy(warmup=1, repeat=5, min_time=0.0, budget=3.0)).median
    _step(name, "the CPU")
    Jc = prepare(f, x_cpu)
    row["cpu_vs_gpu_rel_err"] = _err(Jc(x_cpu), ref)
    row["cpu_first_calls"] = settle(lambda: Jc(x_cpu))
    times["cpu_eager"] = measure(lambda: Jc(x_cpu), POLICY).median
    if peer is not None:
        _step(name, "asdex")
        res = _asdex(*peer, timeout=timeout)
        row["asdex"] = res
        if "call" in res:
            times["asdex_gpu_jit"] = res["call"]["jit"]["median"]
    if cpu_compile:
        _step(name, "compiled on the CPU")
        try:
            t, opc = once(lambda: prepare(f, x_cpu, compile=True))
            t1, _ = once(lambda: opc(x_cpu))
            row["cpu_compiled_prepare_and_first_call"] = t + t1
            times["cpu_compiled"] = measure(lambda: opc(x_cpu), POLICY).median
        except Exception as exc:  # noqa: BLE001
            row["cpu_compiled_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    row["times"] = times
    gpu_best = min(v for k, v in times.items() if k.startswith("gpu_") and k != "gpu_oneoff")
    cpu_best = min(v for k, v in times.items() if k.startswith("cpu_"))
    row["gpu_best"] = gpu_best
    row["speedup_vs_cpu"] = cpu_best / gpu_best
    if "asdex_gpu_jit" in times:
        row["speedup_vs_asdex_jit"] = times["asdex_gpu_jit"] / gpu_best
    return row


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(HERE, "results", "gpu.json"))
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 256], help="Brusselator N")
    p.add_argument("--hessian-sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="Rosenbrock n")
    p.add_argument("--no-cpu-compile", action="store_true")
    p.add_argument("--no-peers", action="store_true")
    p.add_argument("--peer-timeout", type=float, default=120)
    a = p.parse_args(argv)
    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise SystemExit("benchmarks/gpu.py needs a CUDA device")
    t0 = time.perf_counter()
    # load the Numba kernels and CUDA's context outside every row
    asd.sparse_jacobian(brusselator(8), brusselator_input(8).to(DEVICE), cache=False)
    warm = time.perf_counter() - t0
    rows = []

    def save():
        record = dict(benchmark="gpu", date=time.strftime("%Y-%m-%d %H:%M:%S"), torch=torch.__version__,
                      device=torch.cuda.get_device_name() if DEVICE == "cuda" else DEVICE,
                      cpu_threads=torch.get_num_threads(), policy=POLICY.to_json(), warm_up_seconds=warm, rows=rows)
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as fh:
            json.dump(record, fh, indent=1, default=str)
        return record

    for N in a.sizes:
        rows.append(case(f"B1 N={N}", asd.prepare_jacobian, brusselator(N), brusselator_input(N),
                         cpu_compile=not a.no_cpu_compile,
                         peer=None if a.no_peers else ("brusselator", N), timeout=a.peer_timeout))
        save()
    for n in a.hessian_sizes:
        x = torch.rand(n, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        rows.append(case(f"B3 n={n}", asd.prepare_hessian, rosenbrock, x, cpu_compile=not a.no_cpu_compile and n <= 100_000,
                         peer=None if a.no_peers else ("rosenbrock", n), timeout=a.peer_timeout))
        save()
    record = save()
    print(f"\n{'problem':<14}{'gpu eager':>11}{'gpu comp':>11}{'gpu graph':>11}{'cpu eager':>11}{'cpu comp':>11}"
          f"{'asdex gpu':>11}{'x cpu':>8}{'x asdex':>8}")
    for r in rows:
        t = r["times"]
        cell = lambda k: fmt_seconds(t.get(k)) if t.get(k) is not None else "-"  # noqa: E731
        print(f"{r['problem']:<14}{cell('gpu_eager'):>11}{cell('gpu_compiled'):>11}{cell('gpu_cuda_graph'):>11}"
              f"{cell('cpu_eager'):>11}{cell('cpu_compiled'):>11}{cell('asdex_gpu_jit'):>11}"
              f"{r['speedup_vs_cpu']:>8.1f}{r.get('speedup_vs_asdex_jit', float('nan')):>8.2f}")
    return record


if __name__ == "__main__":
    main()
