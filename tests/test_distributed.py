"""asd.distributed: color batches split over gloo processes give the single-process bits."""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import asd
import asd.distributed
from asd.distributed import layout
from asd.problems import brusselator, brusselator_input, rosenbrock, total_variation

OUTPUTS = ("replicated", "rows", "root")


def _rendezvous() -> str:
    """A fresh file for the processes to meet through: no TCP port, which another process (a
    parallel test worker) could take between being found free and being bound."""
    return os.path.join(tempfile.mkdtemp(prefix="asd-dist-"), "store")


def _init(rank: int, world: int, store: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def _dense_jacobian(f, x):
    return torch.func.jacrev(lambda z: f(z).reshape(-1))(x).reshape(-1, x.numel())


def _dense_hessian(f, x):
    return torch.func.hessian(f)(x).reshape(x.numel(), x.numel())


def _check(op, single, x, dense, output: str, rank: int) -> None:
    """The distributed result of ``op`` equals ``single``'s bits and the dense float64 derivative."""
    out = op(x)
    values = op.values(x)  # every rank calls: a call is a collective
    full = single(x)
    if output == "root" and rank != 0:
        assert out is None and values is None
        return
    assert torch.equal(values, out.values())
    if output == "rows":
        r0, r1 = op.row_range
        assert out.shape == (r1 - r0, full.shape[1])
        lo, hi = int(full.crow_indices()[r0]), int(full.crow_indices()[r1])
        assert torch.equal(out.crow_indices(), full.crow_indices()[r0:r1 + 1] - lo)
        assert torch.equal(out.col_indices(), full.col_indices()[lo:hi])
        assert torch.equal(out.values(), full.values()[lo:hi])
        torch.testing.assert_close(out.to_dense(), dense[r0:r1], rtol=1e-12, atol=1e-12)
        return
    assert torch.equal(out.crow_indices(), full.crow_indices())
    assert torch.equal(out.col_indices(), full.col_indices())
    assert torch.equal(out.values(), full.values())
    torch.testing.assert_close(out.to_dense(), dense, rtol=1e-12, atol=1e-12)


def _cases():
    """(name, kind, f, x, options) of the small problems."""
    N = 6
    x1 = brusselator_input(N)
    x3 = torch.linspace(-1.2, 1.4, 41, dtype=torch.float64)
    xtv = torch.rand(5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    jac = [("B1", "jacobian", brusselator(N), x1, dict(coloring=c)) for c in ("column", "row", "bidirectional")]
    hess = [(name, "hessian", f, x, dict(coloring=c)) for name, f, x in
            (("B3", rosenbrock, x3), ("TV", total_variation(5), xtv)) for c in ("star", "acyclic")]
    return jac + hess


def _prepare(kind, f, x, options, **more):
    module = asd.distributed if more.get("output") else asd
    make = module.prepare_jacobian if kind == "jacobian" else module.prepare_hessian
    if module is asd and kind == "hessian":
        # the flavour the distributed operator runs: hvp="auto" in one process evaluates the
        # calls before recording by double backward, other bits
        options = dict(options, hvp="forward_over_reverse")
    return make(f, x, **options, **more)


def _agree(rank: int, world: int, store: str) -> None:
    _init(rank, world, store)
    try:
        for name, kind, f, x, options in _cases():
            single = _prepare(kind, f, x, options)
            dense = (_dense_jacobian if kind == "jacobian" else _dense_hessian)(f, x)
            for output in OUTPUTS:
                op = _prepare(kind, f, x, options, output=output)
                assert op.coloring.problem == options["coloring"], name
                _check(op, single, x, dense, output, rank)
                assert op.last_call_bytes > 0  # every rank sends or receives at least its status
            # a batch size below the share evaluates in chunks: still the same bits
            op = _prepare(kind, f, x, options, output="replicated", batch_size=1)
            _check(op, single, x, dense, "replicated", rank)
        _subgroup(rank, world)
        _failures(rank)
    finally:
        dist.destroy_process_group()


def _subgroup(rank: int, world: int) -> None:
    """``group=``: ranks 1.. of the world form a group whose rank 0 (global rank 1) prepares."""
    members = list(range(1, world))
    group = dist.new_group(members)  # a collective of the whole world
    if rank not in members:
        return
    x = torch.linspace(-1.0, 1.0, 30, dtype=torch.float64)
    single = asd.prepare_hessian(rosenbrock, x, coloring="star", hvp="forward_over_reverse")
    for output in OUTPUTS:
        op = asd.distributed.prepare_hessian(rosenbrock, x, coloring="star", output=output, group=group)
        assert (op.rank, op.world_size) == (rank - 1, world - 1)
        _check(op, single, x, _dense_hessian(rosenbrock, x), output, op.rank)


def _failures(rank: int) -> None:
    """Failures on one rank raise on every rank instead of leaving the others waiting."""
    def broken(z):
        raise ValueError("broken function")

    x = torch.ones(4, dtype=torch.float64)
    expected = ValueError if rank == 0 else asd.distributed.PreparationFailed
    with pytest.raises(expected, match="broken function"):
        asd.distributed.prepare_jacobian(broken, x)

    fail_here = {"on": False}
    last = dist.get_world_size() - 1  # the rank that evaluates the one color

    def flaky(z):
        if fail_here["on"] and rank == last:
            raise RuntimeError("this rank cannot evaluate")
        return z ** 2

    for output in OUTPUTS:
        op = asd.distributed.prepare_jacobian(flaky, x, output=output, coloring="column")
        assert op.local_ncolors == (1 if rank == last else 0)
        fail_here["on"] = True
        if rank == last:
            with pytest.raises(RuntimeError, match="this rank cannot"):
                op(x)
        elif output == "root" and rank != 0:
            assert op(x) is None
        else:
            with pytest.raises(asd.AsdError, match=rf"rank\(s\) \[{last}\]"):
                op(x)
        fail_here["on"] = False
        J = op(x)
        r0, r1 = op.row_range if output == "rows" else (0, 4)
        assert J is None if output == "root" and rank != 0 else torch.equal(J.to_dense(), torch.diag(2 * x)[r0:r1])


def _child(rank: int, fn, world: int, store: str, *args) -> None:
    """``fn`` in a spawned process, which then ends without running C++ destructors: gloo's threads
    sometimes abort the interpreter's teardown ("terminate called without an active exception")
    after every collective has finished and the process group is destroyed."""
    fn(rank, world, store, *args)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _spawn(fn, world: int, *args, timeout: float = 240) -> None:
    """Run ``fn(rank, world, store, *args)`` in ``world`` processes; a hang fails instead of blocking."""
    import time

    context = mp.spawn(_child, args=(fn, world, _rendezvous(), *args), nprocs=world, join=False)
    deadline = time.monotonic() + timeout
    while not context.join(timeout=1):  # raises the first child's exception
        if time.monotonic() > deadline:
            for p in context.processes:
                p.terminate()
            pytest.fail(f"{world} processes did not finish within {timeout} s")


# four processes on a 2-core machine take 23 s; two exercise the same exchange (make test-all runs four)
@pytest.mark.parametrize("world", [2, pytest.param(4, marks=pytest.mark.slow)])
def test_gloo_processes_give_the_single_process_bits(world):
    _spawn(_agree, world)


def test_one_process_group():
    """A group of one rank: every output is the full matrix, nothing is communicated."""
    _init(0, 1, _rendezvous())
    try:
        f, x = brusselator(4), brusselator_input(4)
        single = asd.prepare_jacobian(f, x, coloring="bidirectional")
        for output in OUTPUTS:
            op = asd.distributed.prepare_jacobian(f, x, coloring="bidirectional", output=output)
            assert torch.equal(op(x).values(), single(x).values())
            assert op.last_call_bytes == 0 and op.color_range == (0, single.ncolors)
        op = asd.distributed.prepare_jacobian(f, x, coloring="bidirectional", batch_size="auto")
        assert torch.equal(op(x).values(), single(x).values())
        with pytest.raises(asd.InputError, match="output must be one of"):
            asd.distributed.prepare_jacobian(f, x, output="everywhere")
        with pytest.raises(asd.InputError, match="backend="):
            asd.distributed.prepare_jacobian(f, x, backend=None)
        with pytest.raises(TypeError, match="cannot be pickled"):
            import pickle
            pickle.dumps(asd.distributed.prepare_hessian(rosenbrock, torch.ones(5, dtype=torch.float64)))
    finally:
        dist.destroy_process_group()


def test_needs_an_initialized_process_group():
    assert not dist.is_initialized()
    with pytest.raises(asd.InputError, match="init_process_group"):
        asd.distributed.prepare_jacobian(brusselator(4), brusselator_input(4))


def test_import_asd_leaves_asd_distributed_unloaded():
    import subprocess

    code = "import sys, asd; print('asd.distributed' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_layout_owns_every_entry_once():
    """Every CSR value is sent by exactly one rank and read back once (direct plans)."""
    import numpy as np

    f, x = brusselator(5), brusselator_input(5)
    for coloring in ("column", "row", "bidirectional"):
        c = asd.prepare_jacobian(f, x, coloring=coloring).coloring
        lengths = np.concatenate([np.full(k, n) for k, n in
                                  (c.plan.compressed_shape if isinstance(c.plan.compressed_shape[0], tuple)
                                   else (c.plan.compressed_shape,))])
        for world in (1, 2, 3, 5):
            S = layout.shares(lengths, world)
            full = layout.direct_all_gather(c.plan.gather, S, 0)
            assert sorted(full.take.tolist()) == sorted(set(full.take.tolist()))
            assert len(full.take) == c.nnz and not set(full.take.tolist()) & set(full.flags.tolist())
            blocks = [layout.direct_to_rows(c.plan.gather, c.rows(), c.indptr, c.shape[0], S, r) for r in range(world)]
            assert sum(len(b.take) for b in blocks) == c.nnz
            for r, b in enumerate(blocks):  # what q sends to r is what r expects from q
                assert b.recv_splits == tuple(blocks[q].send_splits[r] for q in range(world))


def _large(rank: int, world: int, store: str, out: str) -> None:
    _init(rank, world, store)
    try:
        N = 128
        f, x = brusselator(N), brusselator_input(N)
        J = asd.distributed.prepare_jacobian(f, x)(x)
        n = 10 ** 5
        xh = torch.linspace(-1.2, 1.4, n, dtype=torch.float64)
        H = asd.distributed.prepare_hessian(rosenbrock, xh)(xh)
        if rank == 0:
            torch.save((J.values(), H.values()), out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 4])
def test_large_problems_bit_identical(world, tmp_path):
    """B1 N=128 (Jacobian) and B3 n=10^5 (Hessian): the bits of one process."""
    out = str(tmp_path / "values.pt")
    _spawn(_large, world, out)
    Jv, Hv = torch.load(out)
    N = 128
    f, x = brusselator(N), brusselator_input(N)
    xh = torch.linspace(-1.2, 1.4, 10 ** 5, dtype=torch.float64)
    assert torch.equal(Jv, asd.prepare_jacobian(f, x)(x).values())
    assert torch.equal(Hv, asd.prepare_hessian(rosenbrock, xh, hvp="forward_over_reverse")(xh).values())


_TORCHRUN_SCRIPT = """
import os
import torch, torch.distributed as dist
import asd, asd.distributed
from asd.problems import brusselator, brusselator_input
torch.set_num_threads(1)
dist.init_process_group("gloo")
f, x = brusselator(5), brusselator_input(5)
J = asd.distributed.prepare_jacobian(f, x)(x)
assert torch.equal(J.values(), asd.prepare_jacobian(f, x)(x).values())
os.write(1, f"rank {dist.get_rank()} of {dist.get_world_size()} ok\\n".encode())  # one write: the ranks share the pipe
dist.destroy_process_group()
"""


@pytest.mark.slow  # 15 s of process start-ups; the gloo tests above cover the same evaluation
def test_under_torchrun(tmp_path):
    """The environment torchrun sets up is all asd.distributed needs."""
    import subprocess

    script = tmp_path / "job.py"
    script.write_text(_TORCHRUN_SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(script)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    assert sorted(line for line in out.stdout.splitlines() if line.startswith("rank")) == [
        "rank 0 of 2 ok", "rank 1 of 2 ok"]


def test_known_ad_gaps_are_avoided_or_refused():
    """The products avoid the AD modes rank 0's trace ruled out (asd.detection.ad_gaps); where no
    batched product is right, the operator refuses instead of returning a wrong matrix."""
    import warnings

    _init(0, 1, _rendezvous())
    try:
        x = torch.rand(24, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        idx = torch.tensor([0, 0, 1, 1, 2, 2, 0, 1] * 3)

        def g(z):
            return (torch.zeros(3, dtype=z.dtype).scatter_reduce(0, idx, z, "prod", include_self=False) ** 2).sum()

        H = torch.func.jacrev(torch.func.jacrev(g))(x)  # reverse over reverse: no forward formula
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            op = asd.distributed.prepare_hessian(g, x)
            torch.testing.assert_close(op(x).to_dense(), H)
            with pytest.warns(asd.ADGapWarning, match="scatter_reduce"):
                op = asd.distributed.prepare_hessian(g, x, hvp="forward_over_reverse")
            torch.testing.assert_close(op(x).to_dense(), H)

            def f(z):
                return torch.cdist(z.reshape(2, 4, 3), z.reshape(2, 4, 3)[:, :2] * 0.5 + 1).reshape(-1)

            with pytest.raises(asd.InputError, match="cdist"):
                asd.distributed.prepare_jacobian(f, x)
    finally:
        dist.destroy_process_group()


def test_a_function_writing_into_its_input_in_a_process_group():
    """As in one process: its writes reached the forward-mode seed rows, wrong from the second call."""
    _init(0, 1, _rendezvous())
    try:
        def f(z):
            z.mul_(2.0)
            return z.sin() * z.roll(1)
        x = torch.randn(6, dtype=torch.float64)
        for mode in ("forward", "reverse"):
            op = asd.distributed.prepare_jacobian(f, x, mode=mode)
            for _ in range(4):
                x = torch.randn(6, dtype=torch.float64)
                keep = x.clone()
                J = op(x).to_dense()
                assert torch.equal(x, keep)
                torch.testing.assert_close(J, torch.func.jacrev(lambda z: f(z.clone()))(x))
    finally:
        dist.destroy_process_group()


def _misuse(rank: int, world: int, store: str) -> None:
    """What one process checks is checked in a group too, and one rank's bad call raises on every rank
    instead of leaving the others waiting (each of these returned a wrong matrix or hung)."""
    import numpy as np
    import scipy.sparse as sp

    _init(rank, world, store)
    try:
        x = torch.linspace(0.2, 1.4, 32, dtype=torch.float64)
        roll = lambda z: z * z.roll(1)  # noqa: E731
        for output in ("replicated", "root"):
            op = asd.distributed.prepare_jacobian(roll, x, pattern=sp.eye(32, format="csr").astype(bool), output=output)
            with pytest.raises(asd.CheckError):  # the given pattern misses the rolled neighbour
                op(x)
        with pytest.raises(asd.InputError, match="output='replicated'"):
            asd.distributed.prepare_jacobian(roll, x, pattern=np.eye(32, dtype=bool), output="rows")

        where = lambda z: torch.where(z > 0.5, z * z.roll(1), z)  # noqa: E731
        op = asd.distributed.prepare_jacobian(where, x, local=True)
        torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(where, x))
        with pytest.raises(asd.CheckError):  # at another point the local pattern misses entries
            op(x.flip(0))

        shifted = lambda z, k: z * z.roll(k)  # noqa: E731
        for output in OUTPUTS:
            op = asd.distributed.prepare_jacobian(shifted, x, args=(1,), output=output)
            if output == "rows":
                with pytest.raises(asd.InputError, match="extra arguments"):
                    op(x, 3)
            else:
                with pytest.raises(asd.CheckError):
                    op(x, 3)
            J = op(x, 1)  # the prepared arguments again: unchecked, right
            if J is not None and output != "rows":
                torch.testing.assert_close(J.to_dense(), _dense_jacobian(lambda z: shifted(z, 1), x))

        op = asd.distributed.prepare_jacobian(roll, x)
        # rank 1's shape is wrong: it says so, rank 0 hears of it
        with pytest.raises(asd.InputError if rank == 1 else asd.AsdError, match="shape" if rank == 1 else r"\[1\]"):
            op(x if rank == 0 else torch.ones(33, dtype=torch.float64))
        with pytest.raises(asd.InputError, match="different x"):
            op(x + rank)
        scaled = lambda z, c: c * z * z.roll(1)  # noqa: E731
        by_c = asd.distributed.prepare_jacobian(scaled, x, args=(1.0,))
        with pytest.raises(asd.InputError, match="extra arguments"):  # rank 0's arguments were never checked
            by_c(x) if rank == 0 else by_c(x, 5.0)
        torch.testing.assert_close((by_c(x) if rank == 0 else by_c(x, 1.0)).to_dense(),  # the prepared ones
                                   _dense_jacobian(lambda z: scaled(z, 1.0), x))
        probed = asd.distributed.prepare_jacobian(where, x, local=True, output="root")
        with pytest.raises(asd.AsdError):  # rank 0's bad input under a probed root output: rank 1 hung
            probed(x if rank == 1 else torch.ones(33, dtype=torch.float64))
        # a numpy input on rank 0: refused there with the conversion, heard of on rank 1
        with pytest.raises(asd.InputError if rank == 0 else asd.AsdError, match="numpy" if rank == 0 else r"\[0\]"):
            op(x.numpy() if rank == 0 else x)
        torch.testing.assert_close(op(x).to_dense(), _dense_jacobian(roll, x))  # and it works again

        w = torch.linspace(1.0, 2.0, 63, dtype=torch.float64)
        w[0] = 1e15  # a large entry feeding a chain of small ones: substitution loses their digits
        chain = lambda z: (w * z[:-1] * z[1:]).sum() + (z ** 2).sum()  # noqa: E731
        z0 = torch.linspace(0.1, 0.9, 64, dtype=torch.float64)
        with pytest.warns(asd.PrecisionWarning, match="star"):
            asd.distributed.prepare_hessian(chain, z0, coloring="acyclic")(z0)

        with pytest.raises(asd.InputError, match="same x"):
            asd.distributed.prepare_jacobian(roll, x if rank == 0 else x[:-1])
        with pytest.raises(asd.InputError, match="same x"):
            asd.distributed.prepare_hessian(lambda z: (z ** 3).sum(), x + rank)
    finally:
        dist.destroy_process_group()


def test_misuse_in_a_process_group_raises_on_every_rank():
    _spawn(_misuse, 2, timeout=180)
