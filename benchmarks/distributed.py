"""asd.distributed: speed-up with 1, 2 and 4 gloo processes on this machine, and bytes per call.

B1 (Brusselator N=128, Jacobian) and B3 (chained Rosenbrock n=1e5, Hessian). For every process
count the processes are spawned afresh (one torch thread each, ``--threads``), prepare the
distributed operator with every ``output=`` mode and time warm calls in lockstep (a call is a
collective: every rank runs the same number of calls, so the adaptive sampling of
:func:`asd.timing.measure` is replaced by a fixed count under the same policy); rank 0's samples
are the figure. The speed-up is the single-process prepared operator's median (timed in this
process under the harness) over the distributed one's. Bytes per call are summed over the ranks
(each rank's ``op.last_call_bytes``: bytes sent plus received, so every byte counts twice).
Rank 0's replicated values are compared with the single-process values bit for bit.

Writes benchmarks/results/distributed.json; ``--quick`` runs tiny sizes into a temporary folder.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402  (puts the checkout's root on sys.path)
from harness import Session, Targets  # noqa: E402

import asd  # noqa: E402
from asd.problems import brusselator, brusselator_input, rosenbrock  # noqa: E402
from asd.timing import Policy, Timing, fmt_seconds, table  # noqa: E402

OUTPUT_MODES = ("replicated", "rows", "root")


def problems(quick: bool) -> list[tuple[str, str, int]]:
    """(case name, kind, size) of the benchmark."""
    N, n = (16, 1000) if quick else (128, 10**5)
    return [(f"B1 N={N}", "jacobian", N), (f"B3 n={n:g}", "hessian", n)]


def make(kind: str, size: int):
    """``(f, x)`` of a case."""
    if kind == "jacobian":
        return brusselator(size), brusselator_input(size)
    return rosenbrock, torch.linspace(-1.2, 1.4, size, dtype=torch.float64)


def _lockstep(call, policy: Policy) -> Timing:
    """Warm samples of a collective call: the same count on every rank, one call per sample."""
    import torch.distributed as dist

    first = 0.0
    for i in range(policy.warmup):
        t0 = time.perf_counter()
        call()
        if i == 0:
            first = time.perf_counter() - t0
    samples = []
    for _ in range(policy.repeat):
        dist.barrier()
        t0 = time.perf_counter()
        call()
        samples.append(time.perf_counter() - t0)
    return Timing(tuple(samples), 1, policy.warmup, first)


def _worker(rank: int, world: int, port: int, cases, policy_json: dict, threads: int, out: str) -> None:
    import torch.distributed as dist

    import asd.distributed

    torch.set_num_threads(threads)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    policy = Policy.from_json(policy_json)
    record = {}
    try:
        for name, kind, size in cases:
            f, x = make(kind, size)
            prepare = asd.distributed.prepare_jacobian if kind == "jacobian" else asd.distributed.prepare_hessian
            for output in OUTPUT_MODES:
                t0 = time.perf_counter()
                op = prepare(f, x, output=output)
                setup = time.perf_counter() - t0
                timing = _lockstep(lambda: op(x), policy)
                total = torch.tensor([op.last_call_bytes], dtype=torch.int64)
                dist.all_reduce(total)
                most = torch.tensor([op.last_call_bytes], dtype=torch.int64)
                dist.all_reduce(most, op=dist.ReduceOp.MAX)
                if rank == 0:
                    record[f"{name}|{output}"] = dict(timing=timing.to_json(), setup=setup, bytes=int(total),
                                                      max_rank_bytes=int(most), colors=op.ncolors,
                                                      coloring=op.coloring.problem, nnz=int(op.pattern.nnz))
                    if output == "replicated":
                        torch.save(op(x).values(), f"{out}.{name.replace(' ', '_')}.pt")
                    else:
                        op(x)
                else:
                    op(x)  # the call is a collective
        if rank == 0:
            with open(out, "w") as fh:
                json.dump(record, fh)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # end without C++ destructors: gloo's threads sometimes abort the teardown of a finished process
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, cases, policy: Policy, threads: int, folder: str) -> dict:
    """Spawn ``world`` processes; rank 0's record (and its replicated values, saved beside it)."""
    import torch.multiprocessing as mp

    out = os.path.join(folder, f"world{world}.json")
    mp.spawn(_worker, args=(world, _free_port(), cases, policy.to_json(), threads, out), nprocs=world, join=True)
    with open(out) as fh:
        return json.load(fh)


def main(argv=None) -> dict:
    p = harness.arguments("distributed", __doc__)
    p.add_argument("--worlds", type=int, nargs="+", default=None,
                   help="process counts (default 1 2 4; 2 under --quick)")
    a = harness.parse(p, argv)
    if a.worlds is None:
        a.worlds = [2] if a.quick else [1, 2, 4]
    torch.set_num_threads(a.threads)
    s = Session.from_args(a)
    cases = problems(a.quick)
    t0 = time.perf_counter()
    single, reference = {}, {}
    for name, kind, size in cases:
        f, x = make(kind, size)
        op = (asd.prepare_jacobian if kind == "jacobian" else asd.prepare_hessian)(f, x)
        single[name] = s.measure(name, "asd prepared (1 process)", lambda: op(x))
        # the bits to match: the distributed operator's flavour (hvp="auto" in one process warms
        # up by double backward)
        ref = op if kind == "jacobian" else asd.prepare_hessian(f, x, hvp="forward_over_reverse")
        reference[name] = ref(x).values()
    first = time.perf_counter() - t0
    rows, identical = [], {}
    with tempfile.TemporaryDirectory(prefix="asd-dist-") as folder:
        for world in a.worlds:
            record = run_world(world, cases, a.policy, a.threads, folder)
            for name, kind, size in cases:
                values = torch.load(os.path.join(folder, f"world{world}.json.{name.replace(' ', '_')}.pt"))
                identical[(name, world)] = bool(torch.equal(values, reference[name]))
                for output in OUTPUT_MODES:
                    r = record[f"{name}|{output}"]
                    timing = s.record(name, f"asd.distributed {world} process(es) {output}",
                                      Timing.from_json(r["timing"]))
                    rows.append(dict(problem=name, world=world, output=output, colors=r["colors"],
                                     coloring=r["coloring"], nnz=r["nnz"], setup=r["setup"], call=timing.median,
                                     single=single[name].median, speedup=single[name].median / timing.median,
                                     bytes=r["bytes"], max_rank_bytes=r["max_rank_bytes"],
                                     identical=identical[(name, world)], timing=timing.to_json()))
    return harness.report(s, "issue 13 item 4", rows, table([cells(r) for r in rows], COLUMNS),
                          targets(rows, identical), first_call=first, out=a.out)


COLUMNS = [("problem", "problem"), ("world", "processes"), ("output", "output"), ("col", "colors"),
           ("single", "1 process (asd)"), ("call", "distributed call"), ("x", "speed-up"),
           ("bytes", "bytes/call (all ranks)"), ("same", "same bits")]


def cells(r: dict) -> dict:
    """The table cells of one row."""
    return dict(problem=r["problem"], world=r["world"], output=r["output"], col=f"{r['colors']} {r['coloring']}",
                single=fmt_seconds(r["single"]), call=fmt_seconds(r["call"]), x=f"{r['speedup']:.2f}x",
                bytes=f"{r['bytes']:,}", same="yes" if r["identical"] else "NO")


def targets(rows: list[dict], identical: dict) -> list[dict]:
    t = Targets()
    for (name, world), same in identical.items():
        if world > 1:
            t.add(f"{name}: {world} gloo processes give the single-process CSR values bit for bit", same, same)
    for r in rows:
        if r["output"] == "replicated" and r["world"] > 1:
            t.add(f"{r['problem']}: {r['world']} processes faster than one", r["speedup"] > 1, f"{r['speedup']:.2f}x")
    return t.items


if __name__ == "__main__":
    main()
